"""The fast gradient sign method (Linf) and the fast gradient method (L2, L1)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrobust import losses as losses_lib
from jaxrobust._types import Attack
from jaxrobust._validation import check_norm
from jaxrobust.attacks._gradient_attack import check_l1_sparsity, gradient_attack


def fgsm(norm: str = "linf", *, loss: str | Callable[..., jax.Array] = "ce",
         targeted: bool = False, l1_sparsity: float | None = None) -> Attack:
  r"""One full-budget step along the steepest-ascent direction of the norm.

  .. math:: x_{adv} = \Pi_{[l, u]}\big(x + \epsilon\, d_p(\nabla_x L(x, y))\big)

  with :math:`d_\infty = \operatorname{sign}(g)` (FGSM). For L2 and L1 the step is the exact
  maximiser of the linearised loss over the ball intersected with the box,

  .. math:: \delta = \operatorname*{argmax}_{\|\delta\|_p \le \epsilon,\;
            l \le x + \delta \le u} \langle g, \delta \rangle ,

  for L2 :math:`\delta_i = \operatorname{sign}(g_i) \min(\tau |g_i|, h_i)` with the room
  :math:`h_i` of coordinate :math:`i` in the box and :math:`\tau` as large as the ball allows
  (:math:`\epsilon\, g / \|g\|_2` where no coordinate meets a face: FGM), and for L1 found
  greedily: the coordinates in decreasing :math:`|g_i|` each take their whole room in the box in
  the direction of :math:`\operatorname{sign}(g_i)` until eps is spent (a single coordinate when
  the box leaves it room for eps). On a linear model every step is the optimal perturbation
  within the box, so they succeed just above the minimal distance, also where the box binds
  (FGM's step clipped to the box afterwards found 0 of 64 such points at 1.02 times the minimal
  distance). The clean point and the stepped point are both scored and the better returned.

  Args:
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    loss: ``"ce"``, ``"margin"``, ``"dlr"`` or a function (see :mod:`jaxrobust.losses`).
    targeted: step towards ``target`` instead of away from ``y``.
    l1_sparsity: L1 only. ``None`` (default): the exact step above. A fraction in ``(0, 1]``:
      Tramèr & Boneh's step instead, eps spread evenly over that fraction of the coordinates with
      the largest :math:`|g_i|`, then projected onto the L1 ball and the box.

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
    >>> l1 = jr.run(jr.attacks.fgsm("l1"), logits_fn, x, y, jr.Budget(0.25), jax.random.key(0))
    >>> [round(float(v), 4) for v in l1.x_adv[0]]  # all of eps on one coordinate
    [0.35, 0.4]

  References:
    Goodfellow, Shlens & Szegedy, "Explaining and Harnessing Adversarial Examples", ICLR 2015.
    Jaggi, "Revisiting Frank-Wolfe: projection-free sparse convex optimization", ICML 2013 (the
    linear maximisation oracle of an L1 ball).
  """
  check_norm(norm)
  l1_sparsity = check_l1_sparsity(l1_sparsity, norm)
  losses_lib.resolve(loss, targeted)
  return gradient_attack(
      norm=norm, loss=loss, steps=1, step_size=lambda index: jnp.ones((), jnp.float32),
      random_start=False, restarts=1,
      targeted=targeted, l1_sparsity=l1_sparsity,
      name=f"fgsm-{norm}" + ("-targeted" if targeted else ""))
