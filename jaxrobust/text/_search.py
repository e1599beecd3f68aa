"""The search pieces the text attacks share: look-ups that keep the batch sharding, the
substitutes a position may take, the rows of one batched scoring pass, and tie-tolerant choices.

:func:`jaxrobust.text.run` (gradient-guided word swap) and :func:`jaxrobust.text.run_textfooler`
(black-box importance-ranked substitution) both draw substitutes from the ORIGINAL token's row
of a ``candidates [V, K]`` table (:func:`substitutes`), build the texts they score as
:func:`candidate_rows` (one position of the current text changed per row) and pick among scored
rows with :func:`first_near_best`, under one tie tolerance (:data:`TIE_TOLERANCE`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

Array = jax.Array


def lookup(table: Array, ids: Array) -> Array:
  """``table[ids]`` (rows of an embedding or substitute table), laid out like ``ids``.

  Under an Explicit mesh axis a gather of a replicated table at batch-sharded ids has no
  unambiguous output sharding, so it is given: the ids' own, with the table's trailing axes
  unsharded (each device looks up its own rows). Elsewhere this is plain indexing.

  Examples:
    >>> import jax.numpy as jnp
    >>> lookup(jnp.array([[0.0, 1.0], [2.0, 3.0]]), jnp.array([[1, 0]])).tolist()
    [[[2.0, 3.0], [0.0, 1.0]]]
  """
  sharding = getattr(jax.typeof(ids), "sharding", None)
  spec = getattr(sharding, "spec", None)
  if not spec or all(axis is None for axis in spec):
    return table[ids]
  out = PartitionSpec(*spec, *(None,) * (table.ndim - 1))
  return table.at[ids].get(out_sharding=NamedSharding(sharding.mesh, out))


def substitutes(tokens: Array, candidates: Array, editable: Array) -> tuple[Array, Array]:
  """The values each position may take and which of them are usable.

  Returns ``(values, valid)``, both ``[B, L, 1 + K]``: slot 0 is the original token (restoring
  it is a move), slots ``1..K`` the substitutes of the ORIGINAL token,
  ``candidates[tokens[b, i]]``. A slot is valid at an editable position when it is the original
  token or a substitute that is not padding (``-1``), not the original token itself and not a
  repeat of an earlier slot (so no move is re-scored twice).

  Examples:
    >>> import jax.numpy as jnp
    >>> candidates = jnp.array([[1, 1], [-1, -1], [0, 2]])
    >>> values, valid = substitutes(jnp.array([[0, 1]]), candidates, jnp.array([[True, True]]))
    >>> values.tolist(), valid.tolist()
    ([[[0, 1, 1], [1, -1, -1]]], [[[True, True, False], [True, False, False]]])
  """
  listed = lookup(candidates.astype(jnp.int32), tokens)  # [B, L, K]
  original = tokens[..., None]
  k = listed.shape[-1]
  earlier = jnp.tril(jnp.ones((1, 1, k, k), bool), -1)  # [.., a, b]: slot b comes before slot a
  repeated = jnp.any((listed[..., :, None] == listed[..., None, :]) & earlier, axis=-1)
  usable = (listed >= 0) & (listed != original) & ~repeated
  values = jnp.concatenate([original, listed], axis=-1)
  valid = jnp.concatenate([jnp.ones_like(original, bool), usable], axis=-1)
  return values, valid & editable[..., None]


def candidate_rows(current: Array, position: Array, new_token: Array) -> Array:
  """``[B, W, L]``: row ``w`` of example ``b`` is ``current[b]`` with position
  ``position[b, w]`` set to ``new_token[b, w]`` (one batched scoring pass of ``W`` texts per
  example; a comparison with ``arange(L)``, no scatter, so the batch sharding carries over).

  Examples:
    >>> import jax.numpy as jnp
    >>> candidate_rows(jnp.array([[5, 6, 7]]), jnp.array([[0, 2]]), jnp.array([[1, 2]])).tolist()
    [[[1, 6, 7], [5, 6, 2]]]
  """
  length = current.shape[1]
  at = jnp.arange(length, dtype=position.dtype)[None, None, :] == position[..., None]
  return jnp.where(at, new_token[..., None], current[:, None, :])


# Exact losses closer than this (relative to max(1, |loss|)) count as equal: the same sum is
# rounded differently in different batch layouts (per-device batch sizes, fusions), and a
# decision between near-equal moves must not depend on how the batch was laid out.
TIE_TOLERANCE = 1e-5


def tolerance(loss: Array) -> Array:
  """The tie tolerance at ``loss``: :data:`TIE_TOLERANCE` times ``max(1, |loss|)``."""
  return TIE_TOLERANCE * jnp.maximum(1.0, jnp.abs(jnp.nan_to_num(loss, posinf=0.0, neginf=0.0)))


def first_near_best(row_loss: Array, mask: Array) -> Array:
  """``[B]`` the first index (best first-order rank) whose loss is within the tie tolerance of
  the largest loss among ``mask``; 0 where ``mask`` is empty."""
  best = jnp.max(jnp.where(mask, row_loss, -jnp.inf), axis=1, keepdims=True)
  return jnp.argmax(mask & (row_loss >= best - tolerance(best)), axis=1)
