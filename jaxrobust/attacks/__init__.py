"""Attack factories. Each returns a :class:`jaxrobust.Attack` of pure ``init``/``step`` functions."""

from jaxrobust.attacks._apgd import apgd
from jaxrobust.attacks._auto_attack import auto_attack
from jaxrobust.attacks._carlini_wagner import carlini_wagner_l2
from jaxrobust.attacks._deepfool import deepfool
from jaxrobust.attacks._ensemble import ensemble
from jaxrobust.attacks._eot import eot
from jaxrobust.attacks._fab import fab
from jaxrobust.attacks._fgsm import fgsm
from jaxrobust.attacks._fmn import fmn
from jaxrobust.attacks._pgd import pgd
from jaxrobust.attacks._square import square

__all__ = ["apgd", "auto_attack", "carlini_wagner_l2", "deepfool", "ensemble", "eot", "fab", "fgsm", "fmn", "pgd", "square"]
