r"""Projected steepest ascent with random restarts: the engine behind FGSM/FGM and PGD.

One iteration, for each example independently:

.. math::
   x_{t+1} = \Pi_{\text{box}}\big(x + \Pi_{\epsilon}(x_t + \alpha_t\,\epsilon\, d_p(\nabla_x L(x_t))
             - x)\big)

with :math:`d_p` the unit steepest-ascent direction of :mod:`jaxrobust.attacks._ascent`,
:math:`\Pi_\epsilon` the exact projection onto the eps-ball and :math:`\alpha_t` the step size as
a fraction of eps at step :math:`t` of the run (a schedule: a function of the static step count
and the traced step index). Under L1 the step is the exact box-aware one,
:math:`x_t + \alpha_t \epsilon\, d` replaced by :math:`x_t + \delta_t` with :math:`\delta_t` the
maximiser of :math:`\langle \nabla L, \delta \rangle` over L1 mass :math:`\alpha_t \epsilon` in
the box (:func:`~jaxrobust.attacks._ascent.l1_box_step`; or, with an explicit ``l1_sparsity``,
Tramèr & Boneh's top-fraction step), and both projections are one exact projection onto the L1
ball intersected with the box (:func:`jaxrobust.projections.project_l1_box`).

``restarts`` runs are laid end to end in one fixed-length scan of ``restarts * (steps + 1) - 1``
iterations: after a run's ``steps`` updates, one more iteration scores its final iterate and
jumps to a fresh random start drawn from the example's own key (the last run's final iterate is
scored by ``finalize``); the step-size schedule starts again with every run. Every iterate of
every run is scored (success first, then loss) and the best one is returned, never just the last.
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
  """The first iterate of a restart: ``x`` plus a random point of the ball, clipped to the box.

  Linf: uniform in the ball (the cube), as every PGD implementation draws it. L2 and L1: a
  uniformly random direction (a uniform draw from the ball, normalised) at a radius uniform in
  ``[0, eps]``. A volume-uniform draw would lie within a fraction ``1/D`` of the sphere, nearly
  orthogonal to any gradient: the farthest place to turn from with small constant steps (with
  ``step_size=2.5/steps`` it cost 1-2 points of robust accuracy on the digits models against
  torchattacks' radius-uniform start, ``benchmarks/RESULTS.md``).
  """
  if not random_start:
    return x
  shape = (1,) + x.shape[1:]

  def draw(key, e):
    if norm == "linf":
      return projections.sample_ball(key, shape, e, norm)[0]
    direction_key, radius_key = jax.random.split(key)
    v = projections.sample_ball(direction_key, shape, 1.0, norm)[0]
    size = projections.norm(v[None], norm)[0]
    radius = jax.random.uniform(radius_key, (), v.dtype) * e.astype(v.dtype)
    return v * (radius / jnp.where(size > 0, size, 1.0))

  noise = jax.vmap(draw)(fold_in(keys, restart), eps).astype(x.dtype)
  return jnp.clip(x + noise, lower, upper)


def _project(x: Array, x_new: Array, eps: Array, lower: Array, upper: Array, norm: str) -> Array:
  """``x_new`` moved into the eps-ball around ``x`` and then into the box."""
  delta = projections.project(x_new - x, eps, norm)
  return jnp.clip(x + delta, lower, upper)


def gradient_attack(*, norm: str, loss: str | Callable[..., Array], steps: int,
                    step_size: Callable[[Array], Array], random_start: bool, restarts: int,
                    targeted: bool, l1_sparsity: float | None, name: str) -> Attack:
  """Builds the :class:`~jaxrobust.Attack` for projected steepest ascent (see module docstring).

  ``step_size`` maps the step index within a run (an int32 scalar, traced) to the step as a
  fraction of eps. ``l1_sparsity=None`` takes the exact box-aware L1 step. Arguments are validated
  by the public factories (:func:`~jaxrobust.attacks.pgd`, :func:`~jaxrobust.attacks.fgsm`).
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
    length = jnp.asarray(step_size(state.t % period), eps.dtype) * eps  # [B], input units
    if norm == "l1":
      if l1_sparsity is None:
        stepped = state.x_adv + _ascent.l1_box_step(grad, state.x_adv, lower, upper, length)
      else:
        d = _ascent.direction(grad, norm, state.x_adv, lower, upper, l1_sparsity)
        stepped = state.x_adv + expand(length, x.ndim) * d
      delta = projections.project_l1_box(stepped - x, x, eps, lower, upper).astype(x.dtype)
      # The exact projection already respects the box; the clip only absorbs the rounding of
      # x + (upper - x).
      moved = jnp.clip(x + delta, lower, upper)
    else:
      d = _ascent.direction(grad, norm, state.x_adv, lower, upper, 1.0)
      moved = _project(x, state.x_adv + expand(length, x.ndim) * d, eps, lower, upper, norm)
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
