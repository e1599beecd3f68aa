"""Attack factories. Each returns a :class:`jaxrobust.Attack` of pure ``init``/``step`` functions.

Every factory is wrapped by :func:`jaxrobust.attacks._config.recorded`, so the attacks it returns
record their full configuration in ``Attack.config``.
"""

from jaxrobust.attacks import (_apgd, _auto_attack, _brendel_bethge, _carlini_wagner, _ddn,
                               _deepfool, _ensemble, _eot, _fab, _fgsm, _fmn, _min_norm_search,
                               _pgd, _square)
from jaxrobust.attacks._config import recorded as _recorded

apgd = _recorded(_apgd.apgd)
auto_attack = _recorded(_auto_attack.auto_attack)
brendel_bethge = _recorded(_brendel_bethge.brendel_bethge)
carlini_wagner_l2 = _recorded(_carlini_wagner.carlini_wagner_l2)
ddn = _recorded(_ddn.ddn)
deepfool = _recorded(_deepfool.deepfool)
ensemble = _recorded(_ensemble.ensemble)
eot = _recorded(_eot.eot)
fab = _recorded(_fab.fab)
fgsm = _recorded(_fgsm.fgsm)
fmn = _recorded(_fmn.fmn)
min_norm_search = _recorded(_min_norm_search.min_norm_search)
pgd = _recorded(_pgd.pgd)
square = _recorded(_square.square)

__all__ = ["apgd", "auto_attack", "brendel_bethge", "carlini_wagner_l2", "ddn", "deepfool",
           "ensemble", "eot", "fab", "fgsm", "fmn", "min_norm_search", "pgd", "square"]
