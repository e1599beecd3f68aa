"""Batch-level helpers shared by every layer: predictions and verdicts, the work dtype,
per-example keys and ``[B]`` arrays that follow ``x``'s batch sharding, finiteness checks.

Everything here treats the leading axis as the batch axis ``B`` and is traceable under ``jit``,
``vmap``, ``lax.scan`` and ``shard_map``.
"""

from __future__ import annotations

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


def expand(v: Array, ndim: int) -> Array:
  """``[B]`` -> ``[B, 1, ..., 1]`` with ``ndim`` axes, to broadcast against ``[B, ...]``."""
  return v.reshape(v.shape + (1,) * (ndim - 1))


def as_keys(key: Array, batch: int) -> Array:
  """One typed PRNG key per example, ``[B]``.

  A single key (typed ``[]`` or raw ``uint32[2]``) becomes ``fold_in(key, i)`` for example ``i``;
  ``[B]`` typed keys or ``uint32[B, 2]`` raw keys are used as given, so a caller can make an
  example's randomness independent of its position in the batch.
  """
  key = check_keys(key, batch)
  if key.ndim == 0:
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch, dtype=jnp.uint32))
  return key


def check_keys(key: Array, batch: int) -> Array:
  """Validates ``key`` as :func:`as_keys` takes it (one typed or raw key, or one per example)
  and returns it typed, ``[]`` or ``[B]``, without deriving per-example keys (for a
  deterministic attack that only validates its key: no ``fold_in`` to trace)."""
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.dtype != jnp.uint32 or key.ndim not in (1, 2) or key.shape[-1] != 2:
      raise ValueError(f"key must be a jax.random.key (or raw uint32[2]) or one per example; "
                       f"got dtype {key.dtype}, shape {key.shape}.")
    key = jax.random.wrap_key_data(key)
  if key.ndim != 0 and key.shape != (batch,):
    raise ValueError(f"Per-example keys must have shape [B] = [{batch}], got {key.shape}.")
  return key


def single_key(key: Array, per_example: str) -> Array:
  """``key`` (a typed ``[]`` PRNG key or raw ``uint32[2]``) typed; a ``ValueError`` for anything
  else, ``per_example`` saying why several keys are not taken.

  Examples:
    >>> import jax
    >>> single_key(jax.random.key(0), "").shape
    ()
  """
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.dtype != jnp.uint32 or key.ndim != 1:
      raise ValueError(f"key must be one jax.random.key (or raw uint32[2]), got dtype {key.dtype},"
                       f" shape {key.shape}.")
    key = jax.random.wrap_key_data(key)
  if key.shape != ():
    raise ValueError(f"key must be a single PRNG key, got shape {key.shape}; {per_example}.")
  return key


def like_batch(a: Array, x: Array) -> Array:
  """``a`` (``[B, ...]``) typed like ``x``'s batch: resharded like its batch axis when ``x``'s type
  shows one, and varying over the manual axes ``x`` varies over.

  Under an Explicit mesh axis, per-example arrays built without reference to ``x`` (keys from
  ``fold_in`` of an index, eps broadcast from a scalar) are replicated; ``vmap``-ing them together
  with batch-sharded ones fails, so they are sliced like ``x`` (a local operation). Inside a
  ``jax.shard_map`` they are invariant across its axes while ``x`` varies, and a loop whose carry
  mixes them with ``x`` would change their type: they are cast to varying (``jax.lax.pcast``, no
  communication). Under Auto axes, outside ``shard_map`` or without a mesh this returns ``a``
  unchanged.
  """
  varying = _varying_axes(x) - _varying_axes(a)
  if varying:
    a = jax.lax.pcast(a, tuple(sorted(varying)), to="varying")
  sharding = getattr(jax.typeof(x), "sharding", None)
  spec = getattr(sharding, "spec", None)
  if not spec or spec[0] is None:
    return a
  # The mesh comes from x's own type (an abstract mesh under jit), so this works with and without
  # ``jax.set_mesh``: arrays carry their mesh.
  return jax.reshard(a, jax.sharding.NamedSharding(sharding.mesh,
                                                   jax.sharding.PartitionSpec(spec[0])))


def _varying_axes(a: Array) -> frozenset:
  """The ``shard_map`` axes over which ``a`` varies (empty outside ``shard_map``)."""
  return getattr(getattr(jax.typeof(a), "manual_axis_type", None), "varying", frozenset())


def fold_in(keys: Array, data: Array | int) -> Array:
  """``fold_in`` applied to each per-example key."""
  return jax.vmap(lambda k: jax.random.fold_in(k, data))(keys)


def rows_like(x: Array, fill, dtype) -> Array:
  """A ``[B]`` array of ``fill`` built from a slice of ``x``, so it carries ``x``'s batch sharding
  (an Explicit mesh axis types every array, and ``where``/``vmap`` need operands sharded alike).

  Examples:
    >>> import jax.numpy as jnp
    >>> rows_like(jnp.zeros((3, 2, 2)), jnp.inf, jnp.float32).tolist()
    [inf, inf, inf]
  """
  return jnp.full_like(x.reshape(x.shape[0], -1)[:, 0], fill, dtype=dtype)


def one_hot_mask(labels: Array, num_classes: int) -> Array:
  """``[..., C]`` bool: ``mask[..., c] = labels[...] == c``, by comparison (no gather, so it
  shards like ``labels``).

  Examples:
    >>> import jax.numpy as jnp
    >>> one_hot_mask(jnp.array([2, 0]), 3).tolist()
    [[False, False, True], [True, False, False]]
  """
  classes = jnp.arange(num_classes, dtype=jnp.int32).reshape((1,) * labels.ndim + (num_classes,))
  return labels.astype(jnp.int32)[..., None] == classes


def finite_or_zero(a: Array) -> Array:
  """``a`` with NaN and +-Inf entries replaced by 0."""
  return jnp.where(jnp.isfinite(a), a, jnp.zeros_like(a))


def rows_finite(a: Array) -> Array:
  """``[B]`` bool: every entry of the example is finite."""
  return jnp.all(jnp.isfinite(a.reshape(a.shape[0], -1)), axis=1)
