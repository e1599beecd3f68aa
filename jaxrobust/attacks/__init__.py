"""Attack factories. Each returns a :class:`jaxrobust.Attack` of pure ``init``/``step`` functions."""

from jaxrobust.attacks.fgsm import fgsm
from jaxrobust.attacks.pgd import pgd

__all__ = ["fgsm", "pgd"]
