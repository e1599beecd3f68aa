r"""The inner maximisations of robust training, on **every** point of the batch.

Two ways to find the adversarial point a loss trains on:

* :func:`attack_every_point` runs a :class:`jaxrobust.Attack` through the engine's one attack loop
  (:func:`jaxrobust.engine.attack_loop.run_attack`) with every row marked for attack.
  :func:`jaxrobust.run` instead leaves clean-misclassified points unperturbed, which is right for
  evaluation (the point already counts as broken) and wrong for training: early in training most
  points are misclassified and the loss would silently fall back to clean training on them.
* :func:`gaussian_start_ascent` is the inner loop of the TRADES and MART reference code: start at
  :math:`x + 0.001\,\mathcal N(0, I)` and take ``steps`` steps of ascent on a per-example
  objective, returning the last iterate (not the best one).

Both return a ``stop_gradient`` point inside the box and the ball, finite, of ``x``'s dtype.

On CPU, for a model holding a convolution, both loops are traced with every convolution in XLA:CPU's
canonical form (:func:`jaxrobust.engine.canonical_conv.on_cpu_canonical`): the same
points, several times faster per step, since XLA:CPU canonicalises the input gradient's
convolution only outside loops (``benchmarks/RESULTS.md``, "Canonical convolutions in
``jr.training``'s inner attacks"). The loss's value and parameter gradient do not change: they
are computed outside the rewrite, at the ``stop_gradient`` point it returns.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrobust import projections
from jaxrobust._batch import (as_keys, expand, finite_or_zero, fold_in, like_batch, rows_finite,
                              rows_like, work_dtype)
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack, Budget
from jaxrobust._validation import check_inputs
from jaxrobust.engine.attack_loop import run_attack
from jaxrobust.engine.canonical_conv import on_cpu_canonical
from jaxrobust.engine.scoring import round_toward
from jaxrobust.training._options import LARGE_EPS_HINT

Array = jax.Array

START_SCALE = 0.001
"""Standard deviation of the Gaussian start of TRADES' and MART's inner loops (both references)."""

_L2_ZERO_GRADIENT_DRAWS = 0x72AD
"""Tag folded into the per-example keys for the random direction that replaces a zero gradient in
the L2 inner loop (step ``t`` folds in ``t`` on top)."""


def check_attack(attack: Attack, *, training: bool = True) -> Attack:
  """Refuses attacks that do not define a worst point inside the budget for training (for
  evaluation, ``training=False``, minimum-norm attacks are fine).

  Raises:
    TypeError: ``attack`` is not a :class:`jaxrobust.Attack`.
    ValueError: a minimum-norm attack (training only), a targeted attack or an attack on a
      randomized model.
  """
  if not isinstance(attack, Attack):
    raise TypeError(f"attack must be a jr.Attack from a jr.attacks factory, got "
                    f"{type(attack).__name__}.")
  if attack.minimum_norm and training:
    raise ValueError(
        f"{attack.name} is a minimum-norm attack: it searches for the smallest adversarial "
        "perturbation, not for the worst point of the budget, so it gives no training signal on "
        "points it cannot break. Train with a fixed-budget attack (jr.attacks.pgd, apgd, fgsm).")
  if attack.targeted:
    raise ValueError(
        f"{attack.name} is targeted: robust training and robust accuracy are about the true "
        "label, and these functions take no target=. Build the attack with targeted=False.")
  if attack.samples:
    raise ValueError(
        f"{attack.name} attacks a randomized model logits_fn(x, keys) (jr.attacks.eot); "
        "jr.training takes a deterministic logits_fn(x). Attack the deterministic model, or "
        "draw the randomness inside it from a key you pass in.")
  return attack


def inner_options(unroll: int | bool) -> RunOptions:
  """The run options of a loss's inner attack: every step on every row in one dense
  ``lax.scan`` (``early_exit=False``, no compaction), which returns the highest-loss point seen,
  unrolled by ``unroll``; canonical convolutions on CPU (see the module docstring)."""
  return RunOptions(early_exit=False, unroll=unroll)


def attack_every_point(attack: Attack, logits_fn: Callable[[Array], Array], x: Array, y: Array,
                       budget: Budget, key: Array, *, options: RunOptions) -> Array:
  """The attack's best point for **every** row, misclassified ones included (``stop_gradient``).

  The engine's attack loop is told that every row is clean-correct, which is how a driver says
  "attack this row"; the returned point is scored as usual (finite, in the box and the ball,
  rounded towards ``x`` in ``x``'s dtype). ``options``: :func:`inner_options` for a loss.
  """
  check_attack(attack)
  check_inputs(logits_fn, x, y, budget, norm=attack.norm, name=attack.name,
               large_eps_hint=LARGE_EPS_HINT)
  every_row = rows_like(x, True, bool)  # carries x's batch sharding
  result, _ = run_attack(attack, logits_fn, x, y, budget, key, options=options,
                         clean_correct=every_row)
  return jax.lax.stop_gradient(result.x_adv)


def _linf_step(grad: Array, x_adv: Array, x: Array, length: Array, lower: Array,
               upper: Array, eps: Array, keys: Array, t: Array) -> Array:
  """TRADES/MART Linf step: ``x' + length * sign(g)``, into the ball, then into the box."""
  del keys, t
  moved = x_adv + length * jnp.sign(grad)
  return jnp.clip(jnp.clip(moved, x - eps, x + eps), lower, upper)


def _l2_step(grad: Array, x_adv: Array, x: Array, length: Array, lower: Array, upper: Array,
             eps: Array, keys: Array, t: Array) -> Array:
  """TRADES L2 step: ``delta + length * g / ||g||`` (a Gaussian draw where ``g = 0``), the
  point clipped to the box, then ``delta`` scaled back into the ball."""
  flat = grad.reshape(grad.shape[0], -1)
  size = expand(jnp.sqrt(jnp.sum(flat * flat, axis=1)), grad.ndim)
  draws = fold_in(fold_in(keys, _L2_ZERO_GRADIENT_DRAWS), t)
  noise = jax.vmap(lambda k: jax.random.normal(k, grad.shape[1:], grad.dtype))(draws)
  direction = jnp.where(size > 0, grad / jnp.where(size > 0, size, 1.0), noise)
  delta = jnp.clip(x_adv + length * direction, lower, upper) - x
  # eps of shape [B, 1, ...]: projections.project takes a per-example [B] radius.
  return x + projections.project(delta, eps.reshape(eps.shape[0]), "l2")


def gaussian_start_ascent(objective: Callable[[Array], Array], x: Array, budget: Budget,
                          key: Array, *, steps: int, step_size: Array | float, norm: str,
                          unroll: int | bool = 1) -> Array:
  r"""``steps`` ascent steps on ``objective`` from :math:`x + 0.001\,\mathcal N(0, I)`; the last
  iterate, ``stop_gradient``.

  ``objective(x_adv) -> [B]`` must treat examples independently (one backward pass of its sum
  gives every example's gradient). Example ``i`` starts at
  ``x_i + 0.001 * jax.random.normal(k_i, x.shape[1:])`` with ``k_i`` its key (the ``i``-th of
  ``[B]`` keys, or ``fold_in(key, i)`` of one key), clipped to the box and the ball; each step moves
  ``step_size * eps`` (step_size is a fraction of eps, as everywhere in jaxrobust):

  * ``"linf"``: :math:`x' \leftarrow \Pi_{box}(\Pi_{\epsilon}(x' + \alpha\epsilon\,
    \mathrm{sign}(\nabla)))` (the reference's ``min(max(x', x - eps), x + eps)`` then
    ``clamp(0, 1)``);
  * ``"l2"``: the TRADES reference's L2 variant: :math:`\delta \leftarrow \delta + \alpha\epsilon
    \nabla / \|\nabla\|_2` (a standard Gaussian draw where the gradient is 0), the point clipped
    to the box, then :math:`\delta` scaled back onto the ball if it left it.

  Non-finite gradient entries count as 0 (as in every jaxrobust attack), so the point is finite.
  On CPU, when ``objective`` holds a convolution, the loop is traced with canonical convolutions
  (:func:`jaxrobust.engine.canonical_conv.on_cpu_canonical`): the same point, faster steps.
  """
  ascend = lambda: _gaussian_start_ascent(objective, x, budget, key, steps=steps,
                                          step_size=step_size, norm=norm, unroll=unroll)
  return on_cpu_canonical(ascend, objective, x)


def _gaussian_start_ascent(objective: Callable[[Array], Array], x: Array, budget: Budget,
                           key: Array, *, steps: int, step_size: Array | float, norm: str,
                           unroll: int | bool) -> Array:
  dtype = work_dtype(x)
  xw = x.astype(dtype)
  batch = x.shape[0]
  keys = like_batch(as_keys(key, batch), xw)
  eps = expand(like_batch(jnp.broadcast_to(jnp.asarray(budget.eps, dtype), (batch,)), xw),
               x.ndim)
  lower, upper = (jnp.asarray(b, dtype) for b in (budget.lower, budget.upper))
  length = jnp.asarray(step_size, dtype) * eps
  noise = jax.vmap(lambda k: jax.random.normal(k, x.shape[1:], dtype))(keys)
  # Into the ball, then the box: clipping to a box that holds x never leaves the ball.
  start = jnp.clip(xw + projections.project(START_SCALE * noise, eps.reshape(batch), norm),
                   lower, upper)
  move = _linf_step if norm == "linf" else _l2_step
  gradient = jax.grad(lambda v: jnp.sum(objective(v).astype(jnp.float32)))

  def body(x_adv, t):
    grad = finite_or_zero(gradient(x_adv).astype(dtype))
    return move(grad, x_adv, xw, length, lower, upper, eps, keys, t), None

  x_adv, _ = jax.lax.scan(body, start.astype(dtype), jnp.arange(steps, dtype=jnp.uint32),
                          unroll=unroll)
  x_adv = jnp.where(expand(rows_finite(x_adv), x.ndim), jnp.clip(x_adv, lower, upper), xw)
  return jax.lax.stop_gradient(round_toward(x_adv, x))
