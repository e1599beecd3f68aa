"""Attack factories. Each returns a :class:`jaxrobust.Attack` of pure ``init``/``step`` functions.

Every factory is wrapped by :func:`jaxrobust.attacks._config.recorded`, so the attacks it returns
record their full configuration in ``Attack.config``.
"""

from jaxrobust.attacks import (_apgd, _auto_attack, _carlini_wagner, _deepfool, _ensemble, _eot,
                               _fab, _fgsm, _fmn, _pgd, _square)
from jaxrobust.attacks._config import recorded

apgd = recorded(_apgd.apgd)
auto_attack = recorded(_auto_attack.auto_attack)
carlini_wagner_l2 = recorded(_carlini_wagner.carlini_wagner_l2)
deepfool = recorded(_deepfool.deepfool)
ensemble = recorded(_ensemble.ensemble)
eot = recorded(_eot.eot)
fab = recorded(_fab.fab)
fgsm = recorded(_fgsm.fgsm)
fmn = recorded(_fmn.fmn)
pgd = recorded(_pgd.pgd)
square = recorded(_square.square)

__all__ = ["apgd", "auto_attack", "carlini_wagner_l2", "deepfool", "ensemble", "eot", "fab", "fgsm",
           "fmn", "pgd", "square"]
