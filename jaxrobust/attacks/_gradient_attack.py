r"""Projected steepest ascent with random restarts: the engine behind FGSM/FGM and PGD.

One iteration, for each example independently:

.. math::
   x_{t+1} = \Pi_{\text{box}}\big(x + \Pi_{\epsilon}(x_t + \alpha\,\epsilon\, d_p(\nabla_x L(x_t)) - x)\big)

with :math:`d_p` the steepest-ascent direction of :mod:`jaxrobust.attacks._ascent`,
:math:`\Pi_\epsilon` the exact projection onto the eps-ball and :math:`\alpha` the step size as a
fraction of eps. ``restarts`` runs are laid end to end in one fixed-length scan of
``restarts * (steps + 1) - 1`` iterations: after a run's ``steps`` updates, one more iteration
scores its final iterate and jumps to a fresh random start drawn from the example's own key (the
last run's final iterate is scored by ``finalize``). Every iterate of every run is scored
(success first, then loss) and the best one is returned, never just the last.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrobust import losses as losses_lib
from jaxrobust import projections
from jaxrobust._types import Attack, Budget
from jaxrobust.attacks import _ascent
from jaxrobust.attacks._common import (Best, expand, fold_in, is_success, loss_grad_logits,
                                       unpack_budget)

Array = jax.Array


class GradientAttackState(NamedTuple):
  """The ``lax.scan`` carry of a projected-gradient attack."""

  x_adv: Array  # [B, ...] float32: the current iterate, inside box and ball.
  best: Best  # best point seen so far, per example.
  keys: Array  # [B] typed PRNG keys, one per example.
  t: Array  # [] int32: iterations done.


def _start(x: Array, keys: Array, eps: Array, lower: Array, upper: Array, norm: str,
           restart: Array | int, random_start: bool) -> Array:
  """The first iterate of a restart: ``x`` plus a uniform draw from the ball, clipped to the box."""
  if not random_start:
    return x
  draw = jax.vmap(lambda k, e: projections.sample_ball(k, (1,) + x.shape[1:], e, norm)[0])
  noise = draw(fold_in(keys, restart), eps).astype(x.dtype)
  return jnp.clip(x + noise, lower, upper)


def _project(x: Array, x_new: Array, eps: Array, lower: Array, upper: Array, norm: str) -> Array:
  """``x_new`` moved into the eps-ball around ``x`` and then into the box."""
  delta = projections.project(x_new - x, eps, norm)
  return jnp.clip(x + delta, lower, upper)


def gradient_attack(*, norm: str, loss: str | Callable[..., Array], steps: int, step_size: float,
                    random_start: bool, restarts: int, targeted: bool, l1_sparsity: float,
                    name: str) -> Attack:
  """Builds the :class:`~jaxrobust.Attack` for projected steepest ascent (see module docstring).

  Arguments are validated by the public factories (:func:`~jaxrobust.attacks.pgd`,
  :func:`~jaxrobust.attacks.fgsm`).
  """
  loss_fn = losses_lib.resolve(loss, targeted)
  period = steps + 1  # a run's updates plus the iteration that scores its end and restarts
  total_steps = restarts * period - 1

  def init(logits_fn, x, y, budget: Budget, keys, target=None):
    del logits_fn, y, target
    x, eps, lower, upper = unpack_budget(x, budget)
    x0 = _start(x, keys, eps, lower, upper, norm, 0, random_start)
    return GradientAttackState(x0, Best.empty(x0), keys, jnp.zeros((), jnp.int32))

  def step(logits_fn, state: GradientAttackState, x, y, budget: Budget, target=None):
    x, eps, lower, upper = unpack_budget(x, budget)
    loss_value, grad, logits = loss_grad_logits(logits_fn, loss_fn, state.x_adv, y, target)
    best = state.best.update(state.x_adv, loss_value, is_success(logits, y, target))
    d = _ascent.direction(grad, norm, state.x_adv, lower, upper, l1_sparsity)
    moved = _project(x, state.x_adv + expand(step_size * eps, x.ndim) * d, eps, lower, upper, norm)
    if restarts > 1:
      fresh = _start(x, state.keys, eps, lower, upper, norm, (state.t + 1) // period,
                     random_start)
      moved = jnp.where(state.t % period == steps, fresh, moved)
    return GradientAttackState(moved, best, state.keys, state.t + 1)

  def finalize(logits_fn, state: GradientAttackState, x, y, budget: Budget, target=None):
    del x, budget
    logits = logits_fn(state.x_adv)
    last_loss = loss_fn(logits, y) if target is None else loss_fn(logits, y, target)
    best = state.best.update(state.x_adv, last_loss.astype(jnp.float32),
                             is_success(logits, y, target))
    return best.x

  return Attack(init=init, step=step, finalize=finalize, num_steps=total_steps, norm=norm,
                targeted=targeted, minimum_norm=False, name=name)
