"""Pieces every attack shares: budgets in the work dtype, best-point bookkeeping and one-pass
per-example input gradients (batch-level helpers come from :mod:`jaxrobust._batch`)."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrobust._batch import (as_keys, expand, finite_or_zero, fold_in, is_correct, is_success,
                              like_batch, one_hot_mask, per_example, predict, rows_finite,
                              rows_like, work_dtype)

Array = jax.Array

__all__ = ["Best", "MinNormBest", "as_keys", "expand", "finite_or_zero", "fold_in", "is_correct",
           "is_success", "like_batch", "loss_grad_logits", "one_hot_mask", "per_example",
           "predict", "rows_finite", "rows_like", "unpack_budget", "work_dtype"]


def unpack_budget(x: Array, budget) -> tuple[Array, Array, Array, Array]:
  """``x`` in the work dtype, ``eps`` as ``[B]`` and the box bounds as scalars of that dtype."""
  dtype = work_dtype(x)
  eps, lower, upper = budget
  return (x.astype(dtype), per_example(eps, x.shape[0], dtype), jnp.asarray(lower, dtype),
          jnp.asarray(upper, dtype))


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
    per_ex = loss_fn(logits, y) if target is None else loss_fn(logits, y, target)
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
    # Built from a slice of x so that the [B] fields carry x's batch sharding (an Explicit mesh
    # axis types every array; select needs both branches sharded alike).
    first = x.reshape(x.shape[0], -1)[:, 0]
    return cls(x, jnp.full_like(first, -jnp.inf, dtype=jnp.float32),
               jnp.zeros_like(first, dtype=bool))

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
    # [B] fields from a slice of x, so that they carry x's batch sharding (see Best.empty).
    first = x.reshape(x.shape[0], -1)[:, 0]
    return cls(x, jnp.full_like(first, jnp.inf))

  def update(self, x: Array, size: Array, success: Array) -> "MinNormBest":
    """Keeps ``x`` where it succeeds with a smaller norm than the best so far."""
    better = success & (size < self.norm)
    return MinNormBest(jnp.where(expand(better, x.ndim), x, self.x),
                       jnp.where(better, size, self.norm))
