"""The array conventions every metric module shares (see :mod:`jaxrobust.metrics.formulas`).

Predictions are ``[B]`` integers where ``-1`` means "no prediction"; labels and targets are cast
to the predictions' dtype; a ``mask [B]`` excludes padded rows from every sum; counts are int32
sums of flags; a ratio is float32 and NaN over nothing.

One formula serves device sums and host sums. Reducers hold JAX arrays on the device (traced
under ``jit``) and NumPy arrays after ``to_host()`` (int64 counts, exact past :math:`2^{31}`);
:func:`array_namespace` reads which from the data, so ``merge`` and ``compute`` are written once
and host counts never pass through int32.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

NO_PREDICTION = -1


def array_namespace(*values):
  """The array module to compute ``values`` with: the namespace they all declare
  (``__array_namespace__``: ``numpy`` for NumPy arrays and scalars, ``jax.numpy`` for JAX arrays
  and tracers), or ``jax.numpy`` when they are mixed or include Python numbers (JAX takes NumPy
  operands; NumPy cannot take traced ones).

  Examples:
    >>> import numpy as np, jax.numpy as jnp
    >>> [array_namespace(*v).__name__ for v in ((np.int64(3), np.ones(2)), (np.int64(3), 2),
    ...                                           (jnp.ones(2), np.ones(2)))]
    ['numpy', 'jax.numpy', 'jax.numpy']
  """
  spaces = {getattr(v, "__array_namespace__", lambda: None)() for v in values}
  if len(spaces) == 1 and None not in spaces:
    return spaces.pop()
  return jnp


def float_for_counts(counts):
  """The float dtype as wide as the integer ``counts``: float64 for int64 sums (host counts past
  :math:`2^{24}`, whose ratios float32 would round), float32 for int32 (device sums), in the
  namespace of ``counts``."""
  xp = array_namespace(counts)
  return xp.float64 if xp.asarray(counts).dtype.itemsize > 4 else xp.float32


def as_predictions(pred: ArrayLike, name: str) -> Array:
  """``pred`` as a ``[B]`` integer JAX array; raises (naming the argument) otherwise."""
  pred = jnp.asarray(pred)
  if pred.ndim != 1:
    raise ValueError(f"{name} must have shape [B], got {pred.shape}.")
  if not jnp.issubdtype(pred.dtype, jnp.integer):
    raise ValueError(f"{name} must be an integer array, got dtype {pred.dtype}.")
  return pred


def int_like(a: ArrayLike, ref: Array, name: str) -> Array:
  """``a`` as an integer array with the shape and dtype of ``ref``."""
  a = jnp.asarray(a)
  if a.shape != ref.shape:
    raise ValueError(f"{name} must have shape {ref.shape}, got {a.shape}.")
  if not jnp.issubdtype(a.dtype, jnp.integer):
    raise ValueError(f"{name} must be an integer array, got dtype {a.dtype}.")
  return a.astype(ref.dtype)


def row_mask(mask: Optional[ArrayLike], batch: int) -> Array:
  """``mask`` as a ``[batch]`` bool array, all ``True`` for ``None``. A bool or integer mask
  (0/1) is taken; a float one is refused, since reading weights such as 0.5 as ``True`` would
  count every such row in full."""
  if mask is None:
    return jnp.ones((batch,), dtype=bool)
  mask = jnp.asarray(mask)
  if mask.shape != (batch,):
    raise ValueError(f"mask must have shape ({batch},), got {mask.shape}.")
  if not (mask.dtype == jnp.bool_ or jnp.issubdtype(mask.dtype, jnp.integer)):
    raise TypeError(f"mask must be a bool [B] array (True: the row counts), got {mask.dtype}; "
                    "these metrics count rows, they do not weight them.")
  return mask.astype(bool)


def matches(pred: Array, label: Array) -> Array:
  """``pred == label``, where the "no prediction" value -1 never matches."""
  return (pred == label) & (pred != NO_PREDICTION)


def count_true(flags: Array) -> Array:
  """The number of ``True`` flags, an int32 scalar."""
  return jnp.sum(flags, dtype=jnp.int32)


def masked_sum(flags: Array, values: Array) -> Array:
  """``sum(values[flags])`` in float32; unselected values (even NaN) never leak in."""
  return jnp.sum(jnp.where(flags, values, 0.0), dtype=jnp.float32)


def ratio(num: ArrayLike, den: ArrayLike, dtype=np.float32) -> Array:
  """``num / den`` in ``dtype`` (float32 unless asked), NaN where ``den == 0``, in the namespace
  of the operands: a JAX array for device sums, NumPy (a scalar for scalars) for host sums.

  The quotient is the correctly rounded one in JAX too, equal to the host's, compiled or not:
  the divisor, broadcast to one per quotient, passes an optimisation barrier, so that XLA cannot
  turn the division by one count (a batch size) into a multiplication by its rounded reciprocal.
  XLA:CPU does that for a vector divided by a scalar (jax 0.10.0 and 0.10.1, eagerly and under
  ``jit``), one float32 ulp off for 15 of the 49 accuracies ``k / 48``; and where the count was
  known while compiling, jax 0.10.0's compiled and eager quotients differed.

  Examples:
    >>> import numpy as np
    >>> ratio(np.int64(3_000_000_000), np.int64(4_000_000_000)), ratio(np.int64(1), np.int64(0))
    (np.float32(0.75), np.float32(nan))
  """
  xp = array_namespace(num, den)
  num = xp.asarray(num).astype(dtype)
  den = xp.asarray(den).astype(dtype)
  ok = den > 0
  safe = xp.where(ok, den, 1.0)
  if xp is jnp:
    # One divisor per quotient, which XLA cannot see through (see above). Selected by a
    # condition on num, so that under vmap it is batched wherever num is.
    safe = jax.lax.optimization_barrier(jnp.where(num == num, safe, safe))
  return xp.where(ok, num / safe, xp.nan)[()]
