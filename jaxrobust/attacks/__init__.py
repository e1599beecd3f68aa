"""Attack factories. Each returns a :class:`jaxrobust.Attack` of pure ``init``/``step`` functions."""

from jaxrobust.attacks.apgd import apgd
from jaxrobust.attacks.auto_attack import auto_attack
from jaxrobust.attacks.carlini_wagner import carlini_wagner_l2
from jaxrobust.attacks.deepfool import deepfool
from jaxrobust.attacks.ensemble import ensemble
from jaxrobust.attacks.eot import eot
from jaxrobust.attacks.fab import fab
from jaxrobust.attacks.fgsm import fgsm
from jaxrobust.attacks.fmn import fmn
from jaxrobust.attacks.pgd import pgd
from jaxrobust.attacks.square import square

__all__ = ["apgd", "auto_attack", "carlini_wagner_l2", "deepfool", "ensemble", "eot", "fab", "fgsm", "fmn", "pgd", "square"]
