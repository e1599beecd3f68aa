r"""Compute skipping with static shapes: run a per-example function only on the active points.

XLA needs static shapes, so "skip the points that are already broken" cannot shrink the batch.
Instead the active points are moved to the front (a stable partition, :func:`active_first`), and
a ``lax.while_loop`` runs the function on consecutive chunks of ``c`` rows covering them,
:math:`\lceil n_\text{active} / c\rceil` chunks; the outputs are put back in the original order.
With few active points the cost falls to a few chunks; with none, to nothing. Optionally the
last :math:`n_\text{active} \bmod c` rows run in smaller chunks of ``s`` rows (a second traced copy
of the function), so that a chunk holding one active row costs ``s`` rows instead of ``c``:
about :math:`n_\text{active} + s` rows in all (:func:`chunk_loop`).

The result equals running the function on the whole batch and keeping the active rows, provided
the function treats rows independently (every attack here does, and per-example keys travel with
their rows). Inactive rows of the output are zeros; callers select with ``active``.

The loop's trip count depends on the data, so JAX cannot differentiate it in reverse mode:
``jax.grad`` through a compacted computation raises (unless no differentiable value flows
through the loop); forward mode (``jax.jvp``) works. Drivers document this for ``chunk_size``.

The permutation and the gathers move rows across the batch. When the batch axis is sharded over a
mesh axis that the array's type shows (an Explicit mesh axis), the compaction runs per device under
``jax.shard_map`` over that axis (:func:`per_device`): each device compacts and attacks its own
rows, ``chunk_size`` rows at a time, and nothing crosses devices. Under Auto axes the sharding is
not visible while tracing; XLA then partitions the permutation and the gathers itself (correct, but
it moves rows between devices), so sharded drivers should call this inside their own
``shard_map``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxrobust._batch import expand

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
  return per_device(lambda active, *rows: _compacted(fn, active, chunk_size, *rows), active,
                    *rows)


def per_device(local: Callable[..., Any], active: Array, *rows: Any) -> Any:
  """``local(active, *rows)``, run per device under ``jax.shard_map`` when ``active``'s batch axis
  is sharded over an Explicit mesh axis (so that rows moved by ``local`` never cross devices),
  else called directly. ``local`` must return per-row outputs (leading axis the batch)."""
  sharded = batch_axis(active)
  if sharded is None:
    return local(active, *rows)
  mesh, axis = sharded
  spec = P(axis)
  # Rows built by broadcasting (e.g. a scalar eps) are replicated: slice them like the batch.
  # A NamedSharding on the array's own mesh, so no jax.set_mesh context is needed.
  rows = jax.tree.map(lambda a: jax.reshard(a, jax.sharding.NamedSharding(mesh, spec)), rows)
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


def active_first(active: Array) -> tuple[Array, Array]:
  r"""The stable partition of the rows with the active ones first: ``(order, position)``, both
  ``[B]`` int32 and inverse permutations of each other (``order[position[i]] = i``).

  ``order`` lists the active rows in increasing index, then the inactive ones; ``position[i]`` is
  where row :math:`i` goes. With :math:`c_i = \sum_{j \le i} a_j` active rows up to row
  :math:`i` and :math:`n = c_{B-1}`,

  .. math:: \text{position}_i = \begin{cases} c_i - 1 & a_i \\ n + i - c_i & \text{else,}
     \end{cases}

  one prefix sum and one scatter: the same permutation as a stable ``argsort(~active)`` and its
  inverse (a second ``argsort``), which every segment of early exit paid, at a twentieth of their
  cost on XLA:CPU (540 rows: 4.5 µs against 83 µs; ``benchmarks/bench_partition.py``).

  Examples:
    >>> import jax.numpy as jnp
    >>> order, position = active_first(jnp.array([False, True, False, True]))
    >>> order.tolist(), position.tolist()
    ([1, 3, 0, 2], [2, 0, 3, 1])
  """
  batch = active.shape[0]
  index = jax.lax.broadcasted_iota(jnp.int32, active.shape, 0)
  before = jnp.cumsum(active.astype(jnp.int32))  # c_i
  position = jnp.where(active, before - 1, before[-1] + index - before)
  order = jnp.zeros((batch,), jnp.int32).at[position].set(index, unique_indices=True,
                                                          indices_are_sorted=False)
  return order, position


def chunk_loop(fn: Callable[..., tuple[Any, Any, Array]], active: Array, chunk: int,
               rows: Any, outputs: Any, shared: Any = None, *,
               small: int | None = None, most_small: int = 4) -> tuple[Any, Any]:
  r"""The loop under every compaction: ``fn`` on chunks of rows that cover the active ones.

  The active rows are moved to the front of the batch (:func:`active_first`: they keep their order),
  and of :math:`n` active rows the first :math:`\lfloor n / c\rfloor c` run in chunks of ``chunk``
  rows :math:`c`; the other :math:`r = n \bmod c` run in chunks of ``small`` rows :math:`s` when
  given and :math:`\lceil r / s\rceil \le` ``most_small`` (``fn`` is traced a second time, for
  that shape), else in one more chunk of :math:`c`. A chunk may hold inactive rows after the
  active ones; chunks holding none do not run.

  Args:
    fn: ``(output_rows, *row_chunks) -> (output_rows, shared, rank)`` on one chunk: its
      per-row outputs given their current value, a candidate for the shared outputs and an int32
      scalar ranking that candidate.
    active: ``[B]`` bool.
    chunk: :math:`c` (static).
    rows: a tuple of pytrees of ``[B, ...]`` inputs (``None`` leaves are passed through).
    outputs: a pytree of ``[B, ...]`` initial per-row outputs (kept by rows that do not run).
    shared: initial shared outputs; replaced by a chunk's candidate when its rank is larger than
      every earlier chunk's (and than 0).
    small: :math:`s < c` (static), or ``None``.
    most_small: the most chunks of :math:`s` rows for the remainder (static).

  Returns:
    ``(outputs, shared)``: ``outputs`` with the rows of every chunk that ran updated, in the
    batch's order.

  Examples:
    >>> import jax.numpy as jnp
    >>> times_ten = lambda out, v: (v * 10, None, jnp.int32(1))
    >>> out, _ = chunk_loop(times_ten, jnp.array([True, False, True]), 2, (jnp.arange(3.0),),
    ...                     jnp.full(3, -1.0))
    >>> out.tolist()  # rows 0 and 2 ran as one chunk; row 1 kept its initial output
    [0.0, -1.0, 20.0]
  """
  batch = active.shape[0]
  small = chunk if small is None or small >= chunk else small
  order, position = active_first(active)
  # A chunk starting at an active row ends at most ``chunk - 1`` rows past the batch: pad so that
  # no dynamic slice is clamped (padding rows repeat a row; their outputs are dropped).
  padded = batch + chunk - 1
  order = jnp.concatenate([order, jnp.broadcast_to(order[-1:], (padded - batch,))])
  take = lambda leaf: jnp.take(leaf, order, axis=0)
  rows, outputs = jax.tree.map(take, rows), jax.tree.map(take, outputs)
  count = jnp.sum(active, dtype=jnp.int32)
  full, rest = -(-count // chunk), jnp.zeros((), jnp.int32)
  if small < chunk:
    smalls = -(-(count % chunk) // small)
    # Small chunks only where they save rows at little loop overhead (a model costs less per
    # row in larger chunks): for a remainder that fits in ``most_small`` of them.
    use_small = smalls <= most_small
    full, rest = jnp.where(use_small, count // chunk, full), jnp.where(use_small, smalls, rest)

  def loop(size, trips, carry):
    def body(carry):
      i, start, outputs, shared, best = carry
      piece = lambda a: jax.lax.dynamic_slice_in_dim(a, start, size)
      out, candidate, rank = fn(jax.tree.map(piece, outputs), *jax.tree.map(piece, rows))
      outputs = jax.tree.map(lambda a, o: jax.lax.dynamic_update_slice_in_dim(a, o, start, 0),
                             outputs, out)
      better = rank > best
      shared = jax.tree.map(lambda new, old: jnp.where(better, new, old), candidate, shared)
      return i + 1, start + size, outputs, shared, jnp.maximum(rank, best)

    carry = (jnp.zeros((), jnp.int32),) + carry
    return jax.lax.while_loop(lambda c: c[0] < trips, body, carry)[1:]

  carry = (jnp.zeros((), jnp.int32), outputs, shared, jnp.zeros((), jnp.int32))
  carry = loop(chunk, full, carry)
  if small < chunk:
    carry = loop(small, rest, carry)
  _, outputs, shared, _ = carry
  return jax.tree.map(lambda leaf: jnp.take(leaf[:batch], position, axis=0), outputs), shared


def shared_marks(tree: Any) -> Any:
  """A tree of ``tree``'s structure whose leaves say whether that leaf is declared shared: a leaf
  under a field that its NamedTuple names in its ``shared_fields`` class attribute (see
  :class:`Layout`).

  Examples:
    >>> from typing import NamedTuple
    >>> import jax.numpy as jnp
    >>> class State(NamedTuple):
    ...   x: jnp.ndarray
    ...   table: jnp.ndarray
    ...   shared_fields = ("table",)
    >>> shared_marks((State(jnp.zeros(3), jnp.zeros(3)), jnp.zeros(3)))
    (State(x=False, table=True), False)
  """
  declares = lambda node: hasattr(type(node), "_fields") and hasattr(type(node), "shared_fields")

  def mark(node):
    if not declares(node):
      return False
    shared = type(node).shared_fields
    return type(node)(*(jax.tree.map(lambda _: True, value) if name in shared
                        else shared_marks(value) for name, value in zip(node._fields, node)))

  return jax.tree.map(mark, tree, is_leaf=declares)


def crowded(active: Array, chunk: int) -> Array:
  """``[]`` bool: chunks of ``chunk`` rows would skip fewer than ``chunk`` of the ``[B]`` rows
  (more than ``B - chunk`` are ``active``), so one call on the whole batch evaluates no more rows
  than the chunks and runs one loop instead of several. Where early exit and :func:`map_rows`
  take the whole batch (``whole_when_crowded``).

  Examples:
    >>> import jax.numpy as jnp
    >>> bool(crowded(jnp.array([True] * 7 + [False]), 2)), bool(crowded(jnp.arange(8) < 6, 2))
    (True, False)
  """
  return jnp.sum(active, dtype=jnp.int32) > active.shape[0] - chunk


def map_rows(fn: Callable[..., Any], active: Array, chunk: int, rows: tuple,
             state: Any = None, *, whole_when_crowded: bool = False) -> Any:
  """``fn(state, *rows)`` computed only for the ``active`` rows, ``chunk`` rows at a time.

  ``fn`` treats rows independently; the per-row leaves of ``state`` and of the output
  (:class:`Layout`: all but scalars and declared ``shared_fields``) move with their rows (inactive
  rows of the output are zeros), the other leaves are shared (the same for every chunk; in the
  output, those of the first chunk that ran, zeros if none ran). With ``whole_when_crowded``,
  where the chunks would skip fewer than ``chunk`` rows, ``fn`` runs once on the whole batch
  instead (the same per-row outputs; the shared leaves are then the whole batch's, which for
  ``fn`` treating rows independently are those of any chunk).

  Examples:
    >>> import jax.numpy as jnp
    >>> out = map_rows(lambda state, v: (v * 10, jnp.float32(1)),
    ...                jnp.array([True, False, True]), 2, (jnp.arange(3.0),))
    >>> out[0].tolist(), float(out[1])
    ([0.0, 0.0, 20.0], 1.0)
  """
  batch = active.shape[0]
  state_layout = Layout(state, batch)
  state_rows, state_shared = state_layout.split(state)
  shapes = jax.eval_shape(fn, state, *rows)
  out_layout = Layout(shapes, batch)
  zeros = lambda shapes: [jnp.zeros(s.shape, s.dtype) for s in shapes]

  def one_chunk(_, state_rows, *rows):
    out = fn(state_layout.join(state_rows, state_shared), *rows)
    return (*out_layout.split(out), jnp.ones((), jnp.int32))

  def chunked():
    return chunk_loop(one_chunk, active, chunk, (state_rows,) + tuple(rows),
                      *map(zeros, out_layout.split(shapes)))

  if whole_when_crowded:
    whole = lambda: out_layout.split(fn(state, *rows))
    outputs, shared = jax.lax.cond(crowded(active, chunk), whole, chunked)
  else:
    outputs, shared = chunked()
  outputs = [jnp.where(expand(active, o.ndim), o, jnp.zeros((), o.dtype)) for o in outputs]
  return out_layout.join(outputs, shared)


class Layout:
  """Which leaves of a pytree are per-row and which are shared, as the tree declares them; splits
  trees of the same structure (e.g. a chunk's) into the two lists of leaves and joins them.

  Nothing is guessed from shapes: a leaf is shared when it is a scalar (rank 0: a step counter,
  an optimiser's count) or lies under a field that its NamedTuple declares in a
  ``shared_fields`` class attribute (a per-batch table that is not per row, whatever its leading
  dimension); every other leaf is per-row and must lead with the batch, else a ``ValueError``
  names it.

  Examples:
    >>> import jax.numpy as jnp
    >>> Layout((jnp.zeros((4, 2)), jnp.int32(0)), 4).is_row
    [True, False]
    >>> Layout((jnp.zeros((3, 2)),), 4).is_row  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: leaf [0] of shape (3, 2) is neither scalar nor per-row (leading axis 4) ...
  """

  def __init__(self, tree: Any, batch: int):
    paths, self.treedef = jax.tree_util.tree_flatten_with_path(tree)
    marks = self.treedef.flatten_up_to(shared_marks(tree))
    self.is_row = []
    for (path, leaf), shared in zip(paths, marks):
      rank = getattr(leaf, "ndim", 0)
      if rank and not shared and leaf.shape[0] != batch:
        raise ValueError(
            f"leaf {jax.tree_util.keystr(path)} of shape {tuple(leaf.shape)} is neither scalar "
            f"nor per-row (leading axis {batch}) in a state that the engine moves row by row; "
            "a leaf shared by all rows goes in a field named in its NamedTuple's "
            "shared_fields (see jaxrobust.Attack).")
      self.is_row.append(bool(rank) and not shared)

  def split(self, tree: Any) -> tuple[list, list]:
    leaves = self.treedef.flatten_up_to(tree)
    return ([leaf for leaf, r in zip(leaves, self.is_row) if r],
            [leaf for leaf, r in zip(leaves, self.is_row) if not r])

  def join(self, row_leaves: list, shared_leaves: list) -> Any:
    row_leaves, shared_leaves = iter(row_leaves), iter(shared_leaves)
    return self.treedef.unflatten(
        [next(row_leaves) if r else next(shared_leaves) for r in self.is_row])


def _compacted(fn: Callable[..., Any], active: Array, chunk_size: int, *rows: Any) -> Any:
  return map_rows(lambda _, *rows: fn(*rows), active, chunk_size, rows)
