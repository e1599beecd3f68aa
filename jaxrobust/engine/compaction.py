r"""Compute skipping with static shapes: run a per-example function only on the active points.

XLA needs static shapes, so "skip the points that are already broken" cannot shrink the batch.
Instead the active points are moved to the front (a stable sort of the batch by ``~active``), cut
into ``ceil(B / c)`` chunks of ``c`` rows, and a ``lax.while_loop`` runs the function on the first
:math:`\lceil n_\text{active} / c\rceil` chunks only; the outputs are put back in the original
order. With few active points the cost falls to a few chunks; with none, to nothing.

The result equals running the function on the whole batch and keeping the active rows, provided
the function treats rows independently (every attack here does, and per-example keys travel with
their rows). Inactive rows of the output are zeros; callers select with ``active``.

The loop's trip count depends on the data, so JAX cannot differentiate it in reverse mode:
``jax.grad`` through a compacted computation raises (unless no differentiable value flows
through the loop); forward mode (``jax.jvp``) works. Drivers document this for ``chunk_size``.

The sort and the gathers move rows across the batch. When the batch axis is sharded over a mesh
axis that the array's type shows (an Explicit mesh axis), the compaction runs per device under
``jax.shard_map`` over that axis: each device compacts and attacks its own rows, ``chunk_size`` rows
at a time, and nothing crosses devices. Under Auto axes the sharding is not visible while tracing;
XLA then partitions the sort itself (correct, but it moves rows between devices), so sharded
drivers should call this inside their own ``shard_map``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

Array = jax.Array


def batch_axis(active: Array):
  """``(mesh, axis)`` when ``active``'s type shards its batch axis over a mesh axis, else None."""
  sharding = getattr(jax.typeof(active), "sharding", None)
  spec = getattr(sharding, "spec", None)
  if not spec or spec[0] is None:
    return None
  return sharding.mesh, spec[0]


def compacted(fn: Callable[..., Any], active: Array, chunk_size: int, *rows: Any) -> Any:
  """``fn`` applied to the active rows of ``rows`` (pytrees of ``[B, ...]`` arrays), in chunks.

  Args:
    fn: ``(*chunk_rows) -> pytree of [c, ...]`` arrays; must treat rows independently.
    active: ``[B]`` bool.
    chunk_size: rows per chunk ``c`` (static).
    *rows: pytrees whose leaves have leading axis ``B`` (``None`` leaves are passed through).

  Returns:
    The pytree of ``fn``'s outputs with leading axis ``B``, zeros on inactive rows.

  Examples:
    >>> import jax.numpy as jnp
    >>> out = compacted(lambda v: v * 10, jnp.array([True, False, True]), 1, jnp.arange(3.0))
    >>> out.tolist()
    [0.0, 0.0, 20.0]
  """
  sharded = batch_axis(active)
  if sharded is not None:
    mesh, axis = sharded
    spec = P(axis)
    local = lambda active, *rows: _compacted(fn, active, chunk_size, *rows)
    # Rows built by broadcasting (e.g. a scalar eps) are replicated: slice them like the batch.
    # A NamedSharding on the array's own mesh, so no jax.set_mesh context is needed.
    rows = jax.tree.map(lambda a: jax.reshard(a, jax.sharding.NamedSharding(mesh, spec)),
                        rows)
    in_specs = (spec,) + jax.tree.map(lambda _: spec, rows)
    try:
      return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=spec,
                           check_vma=False)(active, *rows)
    except NotImplementedError as e:
      raise ValueError(
          "chunk_size with a batch sharded over an Explicit mesh axis compacts per device under "
          "shard_map, which cannot close over traced arrays placed on the mesh (e.g. model "
          "parameters passed to your jit). Run the attack inside your own jax.shard_map "
          "(jr.evaluate does this when given chunk_size), or close over concrete parameters."
      ) from e
  return _compacted(fn, active, chunk_size, *rows)


def _compacted(fn: Callable[..., Any], active: Array, chunk_size: int, *rows: Any) -> Any:
  batch = active.shape[0]
  chunks = -(-batch // chunk_size)
  padded = chunks * chunk_size
  order = jnp.argsort(~active, stable=True).astype(jnp.int32)  # active rows first, in order
  order = jnp.concatenate([order, jnp.broadcast_to(order[-1:], (padded - batch,))])
  needed = -(-jnp.sum(active, dtype=jnp.int32) // chunk_size)

  def take(leaf):
    return jnp.take(leaf, order, axis=0).reshape((chunks, chunk_size) + leaf.shape[1:])

  gathered = jax.tree.map(take, rows)
  chunk_rows = jax.tree.map(lambda a: a[0], gathered)
  out_shapes = jax.eval_shape(lambda r: fn(*r), chunk_rows)
  outputs = jax.tree.map(lambda s: jnp.zeros((chunks,) + s.shape, s.dtype), out_shapes)

  def body(carry):
    i, outputs = carry
    chunk = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), gathered)
    result = fn(*chunk)
    outputs = jax.tree.map(lambda o, r: jax.lax.dynamic_update_index_in_dim(o, r, i, 0),
                           outputs, result)
    return i + 1, outputs

  _, outputs = jax.lax.while_loop(lambda c: c[0] < needed, body, (jnp.zeros((), jnp.int32),
                                                                   outputs))

  def scatter(out):
    flat = out.reshape((padded,) + out.shape[2:])[:batch]
    flat = jnp.zeros_like(flat).at[order[:batch]].set(flat)
    keep = active.reshape((batch,) + (1,) * (flat.ndim - 1))
    return jnp.where(keep, flat, jnp.zeros_like(flat))

  return jax.tree.map(scatter, outputs)
