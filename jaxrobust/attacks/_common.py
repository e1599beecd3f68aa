"""Pieces the attacks share: budgets in the work dtype, losses and one-pass per-example input
gradients, best-point bookkeeping (:class:`Best`, :class:`MinNormBest`, scoring the last iterate)
and restarts laid end to end in one scan (:class:`Runs`). Batch-level helpers (predictions,
verdicts, keys, ``[B]`` arrays) live in :mod:`jaxrobust._batch`; import them from there."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrobust import projections
from jaxrobust._batch import expand, finite_or_zero, is_success, per_example, rows_like, work_dtype

Array = jax.Array


def unpack_budget(x: Array, budget) -> tuple[Array, Array, Array, Array]:
  """``x`` in the work dtype, ``eps`` as ``[B]`` and the box bounds as scalars of that dtype."""
  dtype = work_dtype(x)
  eps, lower, upper = budget
  return (x.astype(dtype), per_example(eps, x.shape[0], dtype), jnp.asarray(lower, dtype),
          jnp.asarray(upper, dtype))


def l1_box_point(delta: Array, x: Array, eps: Array, lower: Array, upper: Array) -> Array:
  """``x + project_l1_box(delta)`` in ``x``'s dtype: the point of the L1 ball of radius ``eps``
  around ``x`` and the box nearest to ``x + delta`` (:func:`jaxrobust.projections.project_l1_box`),
  clipped to the box only against the rounding of ``x + (upper - x)``."""
  moved = projections.project_l1_box(delta, x, eps, lower, upper).astype(x.dtype)
  return jnp.clip(x + moved, lower, upper)


def apply_loss(loss_fn: Callable[..., Array], logits: Array, y: Array,
               target: Array | None) -> Array:
  """``loss_fn(logits, y)``, or ``loss_fn(logits, y, target)`` for a targeted loss: ``[B]``."""
  return loss_fn(logits, y) if target is None else loss_fn(logits, y, target)


def loss_grad_logits(logits_fn: Callable[[Array], Array], loss_fn: Callable[..., Array],
                     x: Array, y: Array, target: Array | None) -> tuple[Array, Array, Array]:
  """Per-example loss ``[B]``, its input gradient ``[B, ...]`` and the logits, in one pass.

  Valid because the model treats examples independently: the gradient of the summed loss with
  respect to example ``i`` is the gradient of example ``i``'s own loss. For a randomized model
  wrapped by :func:`jaxrobust.attacks.eot` the loss and gradient are averaged over its draws.

  Non-finite gradient entries (a model with ``sqrt`` or ``log`` of zero inside, or logits so large
  that the loss overflows) are replaced by 0, so no NaN ever reaches an iterate: the attack then
  works with the finite part of the gradient. :func:`jaxrobust.run` reports such models with the
  ``non_finite_gradients`` reliability flag.
  """
  if hasattr(logits_fn, "loss_and_grad"):
    per_ex, grad, logits = logits_fn.loss_and_grad(loss_fn, x, y, target)
    return per_ex, finite_or_zero(grad), logits

  def total(inputs):
    logits = logits_fn(inputs)
    per_ex = apply_loss(loss_fn, logits, y, target)
    return jnp.sum(per_ex.astype(jnp.float32)), (per_ex.astype(jnp.float32), logits)

  (_, (per_ex, logits)), grad = jax.value_and_grad(total, has_aux=True)(x)
  return per_ex, finite_or_zero(grad.astype(x.dtype)), logits


class Best(NamedTuple):
  """The best point seen so far for each example: success first, then the larger loss."""

  x: Array  # [B, ...] float32
  loss: Array  # [B] float32
  success: Array  # [B] bool

  @classmethod
  def empty(cls, x: Array) -> "Best":
    # [B] fields from rows_like, so that they carry x's batch sharding (an Explicit mesh axis
    # types every array; select needs both branches sharded alike).
    return cls(x, rows_like(x, -jnp.inf, jnp.float32), rows_like(x, False, bool))

  def update(self, x: Array, loss: Array, success: Array) -> "Best":
    """Keeps ``x`` where it succeeds and the best did not, or ties on success with a larger loss.

    A NaN loss never replaces the best point.
    """
    better = (success & ~self.success) | ((success == self.success) & (loss > self.loss))
    return Best(jnp.where(expand(better, x.ndim), x, self.x),
                jnp.where(better, loss, self.loss), self.success | success)


class MinNormBest(NamedTuple):
  """The smallest successful point seen so far for each example (``norm = inf``: none yet)."""

  x: Array  # [B, ...] work dtype (float32 at least)
  norm: Array  # [B] same dtype

  @classmethod
  def empty(cls, x: Array) -> "MinNormBest":
    # [B] fields from rows_like, so that they carry x's batch sharding (see Best.empty).
    return cls(x, rows_like(x, jnp.inf, x.dtype))

  def update(self, x: Array, size: Array, success: Array) -> "MinNormBest":
    """Keeps ``x`` where it succeeds with a smaller norm than the best so far."""
    better = success & (size < self.norm)
    return MinNormBest(jnp.where(expand(better, x.ndim), x, self.x),
                       jnp.where(better, size, self.norm))

  def within(self, limit: Array) -> Array:
    """``[B]`` bool: the smallest point lies inside a finite ``limit`` (the budget's eps).

    A minimum-norm attack's ``done``: ``finalize`` returns that point or a smaller one, and no
    later step takes it away (:meth:`update` only shrinks it), so the verdict at this eps is
    final. At ``limit = inf`` (the unbounded search) no row is ever done.
    """
    return jnp.isfinite(limit) & (self.norm <= limit)


def annealed(start: float, end: float, k: Array, steps: int, dtype) -> Array:
  r"""Cosine annealing from ``start`` (step 0) to ``end`` (step ``steps``):
  :math:`e + (s - e)\,(1 + \cos(\pi k / K)) / 2` (FMN's and DDN's step sizes)."""
  cosine = (1 + jnp.cos(jnp.pi * k.astype(dtype) / steps)) / 2
  return end + (start - end) * cosine


def score_last_iterate(best: Best | MinNormBest, logits_fn: Callable[[Array], Array],
                       x_last: Array, y: Array, target: Array | None,
                       value: Callable[[Array], Array]) -> Best | MinNormBest:
  """``best`` updated with the last iterate of the scan, which no step has evaluated.

  Attacks whose step scores the iterate it receives (one forward pass shared with the gradient)
  leave the final iterate unscored; ``finalize`` calls this, one more forward pass, so that the
  best point returned is the best of every iterate. ``value(logits)`` is what ``best`` ranks by:
  the loss for :class:`Best`, the perturbation's norm for :class:`MinNormBest`. Success is
  :func:`~jaxrobust._batch.is_success` towards ``target`` (``None``: untargeted).
  """
  logits = logits_fn(x_last)
  return best.update(x_last, value(logits), is_success(logits, y, target))


def smallest_inside(best: MinNormBest, logits_fn: Callable[[Array], Array], x_last: Array,
                    x: Array, y: Array, target: Array | None, eps: Array, norm: str) -> Array:
  r"""A minimum-norm attack's ``finalize``: the smallest successful point of every iterate, the
  last one (unscored by the steps) included, where it lies inside the ball, else ``x``.

  :math:`x^\star_i = \arg\min \{\|x' - x_i\|_p : x' \text{ an iterate}, x' \text{ adversarial}\}`,
  returned where :math:`\|x^\star_i - x_i\|_p \le \epsilon_i` (at :math:`\epsilon = \infty`:
  wherever one was found). ``x`` and ``eps`` are the work-dtype ``x`` and ``[B]`` eps of
  :func:`unpack_budget`; ``norm`` is ``"linf"``, ``"l2"`` or ``"l1"``.
  """
  best = score_last_iterate(best, logits_fn, x_last, y, target,
                            lambda _: projections.norm(x_last - x, norm))
  inside = jnp.isfinite(best.norm) & (best.norm <= eps)  # a success, inside the ball
  return jnp.where(expand(inside, x.ndim), best.x, x)


class Runs(NamedTuple):
  r"""``count`` runs of ``steps`` updates each, laid end to end in one fixed-length scan.

  Run ``r`` occupies the ``period = steps + 1`` scan iterations
  :math:`t \in [r \cdot \text{period}, (r + 1) \cdot \text{period})`; iteration ``t`` is
  update ``index(t) = t mod period`` of run ``run(t) = t // period``. Each iteration evaluates
  (and scores) the iterate it receives, so the last iteration of a run (``index == steps``)
  scores the run's final iterate and hands the scan the next run's start instead of an update
  (:meth:`next_start`); the last run's final iterate is left to ``finalize``
  (:func:`score_last_iterate`), hence ``num_steps = count * period - 1``. PGD, APGD and Square
  restart this way, each drawing run ``r``'s start from the example's key folded with ``r``
  (Square: with the iteration), so run ``r`` is the same in every configuration that has it.

  Examples:
    >>> runs = Runs(steps=2, count=3)
    >>> runs.num_steps, [(runs.run(t), runs.index(t)) for t in range(2, 5)]
    (8, [(0, 2), (1, 0), (1, 1)])
    >>> [runs.at_end(t) for t in range(runs.num_steps)]
    [False, False, True, False, False, True, False, False]
  """

  steps: int
  count: int

  @property
  def period(self) -> int:
    """Scan iterations per run: its ``steps`` updates and the one that scores its end."""
    return self.steps + 1

  @property
  def num_steps(self) -> int:
    return self.count * self.period - 1

  def index(self, t: Array) -> Array:
    """The update of its run that iteration ``t`` makes (``steps``: the run's end)."""
    return t % self.period

  def run(self, t: Array) -> Array:
    return t // self.period

  def at_end(self, t: Array) -> Array:
    """``[]`` bool: iteration ``t`` scores a run's final iterate and starts the next run."""
    return self.index(t) == self.steps

  def next_start(self, t: Array, moved: Array, fresh: Callable[[Array], Array]) -> Array:
    """``moved`` (the update), or at a run's end ``fresh(r + 1)``, the next run's first point.

    With a single run nothing is drawn (the scan ends before the run's end); with several, the
    fresh start is drawn only at a run's end (a ``lax.cond``: drawing and building a start every
    step and discarding it was most of APGD-T's non-model work per step).
    """
    if self.count == 1:
      return moved
    return jax.lax.cond(self.at_end(t), lambda: fresh(self.run(t) + 1).astype(moved.dtype),
                        lambda: moved)
