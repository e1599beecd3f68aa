"""Pieces every attack shares: predictions, success, per-example keys and budgets, best-point
bookkeeping and one-pass per-example input gradients."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


def predict(logits: Array) -> Array:
  """``argmax`` of each row, or ``-1`` where any logit is NaN/Inf (never equal to a label).

  ``jnp.argmax`` of a NaN row is 0, which would silently score a broken model as correct on
  class 0; ``-1`` makes non-finite outputs count as wrong.

  Examples:
    >>> import jax.numpy as jnp
    >>> predict(jnp.array([[0.0, 1.0], [jnp.nan, 1.0]]))
    Array([ 1, -1], dtype=int32)
  """
  finite = jnp.all(jnp.isfinite(logits), axis=-1)
  return jnp.where(finite, jnp.argmax(logits, axis=-1).astype(jnp.int32), -1)


def is_correct(logits: Array, y: Array) -> Array:
  """``[B]`` bool: the prediction is ``y``. Never true for non-finite logits, even where ``y``
  holds the invalid label ``-1`` (labels are only shape-checked inside ``jit``)."""
  pred = predict(logits)
  return (pred == y.astype(jnp.int32)) & (pred >= 0)


def is_success(logits: Array, y: Array, target: Array | None) -> Array:
  """Untargeted: the prediction is not ``y``; targeted: the prediction is ``target``.

  Non-finite logits count as a success of an untargeted attack (the model is not correct there)
  and as a failure of a targeted one (it does not predict the target).
  """
  if target is None:
    return ~is_correct(logits, y)
  return is_correct(logits, target)


def work_dtype(x: Array) -> jnp.dtype:
  """Perturbation arithmetic runs in float32 at least, even for bfloat16 inputs (float64 stays).

  Decided by bit width, not by type promotion, which strict promotion refuses for bfloat16.
  """
  dtype = jnp.dtype(x.dtype)
  return dtype if jnp.finfo(dtype).bits >= 32 else jnp.dtype(jnp.float32)


def per_example(value: Array, batch: int, dtype: jnp.dtype) -> Array:
  """A scalar or ``[B]`` value as a ``[B]`` array of ``dtype``."""
  return jnp.broadcast_to(jnp.asarray(value, dtype), (batch,))


def unpack_budget(x: Array, budget) -> tuple[Array, Array, Array, Array]:
  """``x`` in the work dtype, ``eps`` as ``[B]`` and the box bounds as scalars of that dtype."""
  dtype = work_dtype(x)
  eps, lower, upper = budget
  return (x.astype(dtype), per_example(eps, x.shape[0], dtype), jnp.asarray(lower, dtype),
          jnp.asarray(upper, dtype))


def expand(v: Array, ndim: int) -> Array:
  """``[B]`` -> ``[B, 1, ..., 1]`` with ``ndim`` axes, to broadcast against ``[B, ...]``."""
  return v.reshape(v.shape + (1,) * (ndim - 1))


def as_keys(key: Array, batch: int) -> Array:
  """One typed PRNG key per example, ``[B]``.

  A single key (typed ``[]`` or raw ``uint32[2]``) becomes ``fold_in(key, i)`` for example ``i``;
  ``[B]`` typed keys or ``uint32[B, 2]`` raw keys are used as given, so a caller can make an
  example's randomness independent of its position in the batch.
  """
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.dtype != jnp.uint32 or key.ndim not in (1, 2) or key.shape[-1] != 2:
      raise ValueError(f"key must be a jax.random.key (or raw uint32[2]) or one per example; "
                       f"got dtype {key.dtype}, shape {key.shape}.")
    key = jax.random.wrap_key_data(key)
  if key.ndim == 0:
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch, dtype=jnp.uint32))
  if key.shape != (batch,):
    raise ValueError(f"Per-example keys must have shape [B] = [{batch}], got {key.shape}.")
  return key


def like_batch(a: Array, x: Array) -> Array:
  """``a`` (``[B, ...]``) resharded like ``x``'s batch axis when ``x``'s type shows one.

  Under an Explicit mesh axis, per-example arrays built without reference to ``x`` (keys from
  ``fold_in`` of an index, eps broadcast from a scalar) are replicated; ``vmap``-ing them together
  with batch-sharded ones fails, so they are sliced like ``x`` (a local operation). Under Auto axes
  or without a mesh this returns ``a`` unchanged.
  """
  sharding = getattr(jax.typeof(x), "sharding", None)
  spec = getattr(sharding, "spec", None)
  if not spec or spec[0] is None:
    return a
  # The mesh comes from x's own type (an abstract mesh under jit), so this works with and without
  # ``jax.set_mesh``: arrays carry their mesh.
  return jax.reshard(a, jax.sharding.NamedSharding(sharding.mesh,
                                                   jax.sharding.PartitionSpec(spec[0])))


def fold_in(keys: Array, data: Array | int) -> Array:
  """``fold_in`` applied to each per-example key."""
  return jax.vmap(lambda k: jax.random.fold_in(k, data))(keys)


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


def finite_or_zero(a: Array) -> Array:
  """``a`` with NaN and +-Inf entries replaced by 0."""
  return jnp.where(jnp.isfinite(a), a, jnp.zeros_like(a))


def rows_finite(a: Array) -> Array:
  """``[B]`` bool: every entry of the example is finite."""
  return jnp.all(jnp.isfinite(a.reshape(a.shape[0], -1)), axis=1)


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
