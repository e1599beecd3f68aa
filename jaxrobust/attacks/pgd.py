"""Projected gradient descent (Madry et al.) under the Linf, L2 and L1 norms."""

from __future__ import annotations

from typing import Callable

import jax

from jaxrobust import losses as losses_lib
from jaxrobust._types import Attack
from jaxrobust._validation import check_norm, check_positive_int, check_step_size
from jaxrobust.attacks._gradient_attack import gradient_attack


def pgd(norm: str = "linf", *, steps: int = 10, step_size: float | None = None,
        random_start: bool = True, restarts: int = 1,
        loss: str | Callable[..., jax.Array] = "ce", targeted: bool = False,
        l1_sparsity: float = 0.05) -> Attack:
  r"""Projected gradient ascent on the loss within the eps-ball, with random restarts.

  Each iteration moves ``step_size * eps`` along the steepest-ascent direction of the norm
  (``sign(g)`` for Linf, ``g / ||g||_2`` for L2, a sparse top-``l1_sparsity`` step for L1) and
  projects exactly back onto the ball, then the box:

  .. math::
     x_{t+1} = \Pi_{[l, u]}\Big(x + \Pi_{\|\cdot\|_p \le \epsilon}
               \big(x_t + \alpha \epsilon\, d_p(\nabla L(x_t)) - x\big)\Big)

  Because ``step_size`` is a fraction of eps, one attack serves every eps (eps is data, never a
  constant of the compiled program). Every iterate of every restart is scored and the best one
  returned (success first, then loss), so a point visited once as adversarial is never lost.

  Args:
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    steps: gradient steps per restart (>= 1).
    step_size: step as a fraction of eps; default ``2.5 / steps`` (Madry et al.'s rule of thumb,
      enough to cross the ball from a random start).
    random_start: start each restart from a uniform draw in the ball (the first restart too).
    restarts: independent runs; the best point per example over all of them is returned.
    loss: ``"ce"``, ``"margin"``, ``"dlr"`` or a function (see :mod:`jaxrobust.losses`).
    targeted: drive the prediction to ``target`` (pass ``target=`` to :func:`jaxrobust.run`).
    l1_sparsity: fraction of coordinates one L1 step moves (L1 only).

  Returns:
    A :class:`jaxrobust.Attack` for :func:`jaxrobust.run` or :func:`jaxrobust.robustness_curve`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> w = jnp.array([[1.0, -1.0], [-1.0, 1.0]])  # two classes, logits z = x @ w
    >>> logits_fn = lambda x: x @ w
    >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])  # margin 0.4, L-inf distance 0.1
    >>> attack = jr.attacks.pgd("linf", steps=10)
    >>> run = jax.jit(lambda eps: jr.run(attack, logits_fn, x, y, jr.Budget(eps), jax.random.key(0)))
    >>> bool(run(0.09).success[0]), bool(run(0.11).success[0])
    (False, True)

  References:
    Madry, Makelov, Schmidt, Tsipras & Vladu, "Towards Deep Learning Models Resistant to
    Adversarial Attacks", ICLR 2018.
    Tramèr & Boneh, "Adversarial Training and Robustness for Multiple Perturbations",
    NeurIPS 2019 (the sparse L1 step).
  """
  check_norm(norm)
  steps = check_positive_int("steps", steps)
  restarts = check_positive_int("restarts", restarts)
  step_size = check_step_size(2.5 / steps if step_size is None else step_size)
  if not 0 < l1_sparsity <= 1:
    raise ValueError(f"l1_sparsity must be in (0, 1], got {l1_sparsity!r}.")
  losses_lib.resolve(loss, targeted)
  return gradient_attack(
      norm=norm, loss=loss, steps=steps, step_size=step_size, random_start=random_start,
      restarts=restarts, targeted=targeted, l1_sparsity=l1_sparsity,
      name=f"pgd-{norm}-{steps}x{restarts}-{loss if isinstance(loss, str) else 'custom'}"
      + ("-targeted" if targeted else ""))
