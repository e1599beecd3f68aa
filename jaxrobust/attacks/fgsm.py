"""The fast gradient sign method (Linf) and the fast gradient method (L2, L1)."""

from __future__ import annotations

from typing import Callable

import jax

from jaxrobust import losses as losses_lib
from jaxrobust._types import Attack
from jaxrobust._validation import check_norm
from jaxrobust.attacks._gradient_attack import gradient_attack


def fgsm(norm: str = "linf", *, loss: str | Callable[..., jax.Array] = "ce",
         targeted: bool = False, l1_sparsity: float = 0.05) -> Attack:
  r"""One full-budget step along the steepest-ascent direction of the norm.

  .. math:: x_{adv} = \Pi_{[l, u]}\big(x + \epsilon\, d_p(\nabla_x L(x, y))\big)

  with :math:`d_\infty = \operatorname{sign}(g)` (FGSM), :math:`d_2 = g / \|g\|_2` (FGM) and, for
  L1, the sparse step of :func:`~jaxrobust.attacks.pgd` spread over the top ``l1_sparsity`` of
  coordinates. The clean point and the stepped point are both scored and the better returned.

  Args:
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    loss: ``"ce"``, ``"margin"``, ``"dlr"`` or a function (see :mod:`jaxrobust.losses`).
    targeted: step towards ``target`` instead of away from ``y``.
    l1_sparsity: fraction of coordinates the L1 step moves.

  Returns:
    A :class:`jaxrobust.Attack`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])
    >>> result = jr.run(jr.attacks.fgsm(), logits_fn, x, y, jr.Budget(0.15), jax.random.key(0))
    >>> [round(float(v), 4) for v in result.x_adv[0]], bool(result.success[0])
    ([0.45, 0.55], True)

  References:
    Goodfellow, Shlens & Szegedy, "Explaining and Harnessing Adversarial Examples", ICLR 2015.
  """
  check_norm(norm)
  if not 0 < l1_sparsity <= 1:
    raise ValueError(f"l1_sparsity must be in (0, 1], got {l1_sparsity!r}.")
  losses_lib.resolve(loss, targeted)
  return gradient_attack(
      norm=norm, loss=loss, steps=1, step_size=1.0, random_start=False, restarts=1,
      targeted=targeted, l1_sparsity=l1_sparsity,
      name=f"fgsm-{norm}" + ("-targeted" if targeted else ""))
