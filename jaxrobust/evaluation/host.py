"""The host side of :func:`jaxrobust.evaluate`: the run's plan, the data stream cut into padded
batches with global indices, device placement, hashing, the progress bar and timing.

Nothing here traces or compiles: it validates on the host (so a bad value fails before minutes of
compilation, with a message about the user's data) and moves NumPy batches to the devices.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrobust._batch import single_key
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack
from jaxrobust._validation import check_batch, check_bounds, check_positive_int

Array = jax.Array


class Plan(NamedTuple):
  """A validated run configuration."""

  attacks: dict[str, Attack]
  min_norm: tuple[str, ...]  # names of the minimum-norm attacks
  epsilons: np.ndarray  # [K] float32
  batch_size: int  # global
  local_batch: int  # per process
  key: Any  # one typed PRNG key
  key_data: np.ndarray
  lower: float
  upper: float
  mesh: Any
  axis: str | None  # the mesh axis the batch is sharded over
  use_shard_map: bool
  num_processes: int
  process_index: int
  options: RunOptions  # how every attack runs (early exit, compaction, eps schedule, unrolling)


def _as_attacks(attacks: Attack | Mapping[str, Attack]) -> dict[str, Attack]:
  if isinstance(attacks, Attack):
    attacks = {attacks.name: attacks}
  if not isinstance(attacks, Mapping):
    raise TypeError("attacks must be a jr.Attack or a non-empty mapping name -> jr.Attack, got "
                    f"{type(attacks).__name__}.")
  if not attacks:
    raise ValueError("attacks must be a jr.Attack or a non-empty mapping name -> jr.Attack, got "
                     f"{type(attacks).__name__}.")
  out = {}
  for name, attack in attacks.items():
    if not isinstance(attack, Attack):
      raise TypeError(f"attacks[{name!r}] must be a jr.Attack, got {type(attack).__name__}.")
    if attack.targeted:
      raise ValueError(f"attacks[{name!r}] ({attack.name}) is targeted; jr.evaluate measures "
                       "untargeted robustness and has no targets. Use an untargeted attack (a "
                       "suite such as auto_attack picks its own targets).")
    out[str(name)] = attack
  if len({a.samples > 0 for a in out.values()}) > 1:
    raise ValueError("Either every attack or none must be for a randomized model (samples > 0): "
                     "they share one logits_fn.")
  norms = sorted({a.norm for a in out.values()})
  if len(norms) > 1:
    raise ValueError(f"All attacks must share one norm (they share one eps grid), got {norms}. "
                     "Call jr.evaluate once per norm.")
  return out


def plan_run(attacks: Any, epsilons: Any, key: Any, batch_size: Any, mesh: Any, batch_axis: Any,
             use_shard_map: bool, lower: Any, upper: Any, options: RunOptions) -> Plan:
  """Checks the configuration of :func:`jaxrobust.evaluate` and returns its :class:`Plan`."""
  attacks = _as_attacks(attacks)
  epsilons = np.asarray(epsilons, np.float32)
  if epsilons.ndim != 1 or epsilons.shape[0] == 0:
    raise ValueError(f"epsilons must be a non-empty 1-D array [K], got shape {epsilons.shape}.")
  batch_size = check_positive_int("batch_size", batch_size)  # a NumPy int too, as a Python int
  for attack in attacks.values():
    options.check_curve(attack)
  check_bounds(lower, upper)
  key = single_key(key, "per-example keys derive from it and the global example index")
  num_processes, process_index = jax.process_count(), jax.process_index()
  if batch_size % num_processes:
    raise ValueError(f"batch_size {batch_size} must be a multiple of the process count "
                     f"{num_processes}.")
  axis = None
  if mesh is not None:
    axis = batch_axis if batch_axis is not None else mesh.axis_names[0]
    if axis not in mesh.axis_names:
      raise ValueError(f"batch_axis {axis!r} is not an axis of the mesh {mesh.axis_names}.")
    if batch_size % mesh.shape[axis]:
      raise ValueError(f"batch_size {batch_size} must be a multiple of the mesh axis {axis!r} of "
                       f"size {mesh.shape[axis]}.")
    # Compaction moves rows within the batch: run it per device, where it stays local (under jit,
    # Explicit axes cannot close over the mesh-placed parameters inside the compaction's own
    # shard_map, and Auto axes would move rows between devices).
    use_shard_map = use_shard_map or options.moves_rows
  elif use_shard_map:
    raise ValueError("use_shard_map=True needs a mesh=.")
  elif num_processes > 1:
    raise ValueError("A multi-process run needs a mesh= over the devices of all processes.")
  return Plan(attacks=attacks, min_norm=tuple(n for n, a in attacks.items() if a.minimum_norm),
              epsilons=epsilons, batch_size=batch_size, local_batch=batch_size // num_processes,
              key=key, key_data=np.asarray(jax.random.key_data(key)), lower=float(lower),
              upper=float(upper), mesh=mesh, axis=axis, use_shard_map=use_shard_map,
              num_processes=num_processes, process_index=process_index, options=options)


def put(plan: Plan, a: np.ndarray, batched: bool) -> Any:
  """``a`` on the devices: sharded over the batch axis (``batched``) or replicated; on a
  multi-process run assembled from every process's local rows."""
  if plan.mesh is None:
    return a
  sharding = NamedSharding(plan.mesh, P(plan.axis) if batched else P())
  if plan.num_processes > 1:
    shape = ((plan.batch_size,) + a.shape[1:]) if batched else a.shape
    return jax.make_array_from_process_local_data(sharding, a, shape)
  return jax.device_put(a, sharding)


class HostBatch(NamedTuple):
  """One batch, checked and padded to the local batch size."""

  x: np.ndarray  # [b_local, ...]
  y: np.ndarray  # [b_local] int32
  mask: np.ndarray  # [b_local] bool, False on padding
  index: np.ndarray  # [b_local] uint32 global indices
  size: int  # valid rows


def read_batch(batch: Any, plan: Plan, x_spec: tuple | None) -> tuple[np.ndarray, np.ndarray,
                                                                     np.ndarray | None]:
  """``(x, y, index or None)`` of one data element, checked for shape and dtype (``x_spec``:
  the example shape and dtype of the first batch, which every batch must share)."""
  if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
    raise ValueError(f"Each batch must be a tuple (x, y) or (x, y, index), got "
                     f"{describe(batch)}.")
  x, y = np.asarray(batch[0]), np.asarray(batch[1])
  index = None if len(batch) == 2 else np.asarray(batch[2])
  if x.dtype == np.float64:
    x = x.astype(np.float32)
  check_batch(x, y)
  b = x.shape[0]
  if b > plan.local_batch:
    raise ValueError(f"A batch of {b} examples is larger than batch_size"
                     + (f" / process count = {plan.local_batch}." if plan.num_processes > 1
                        else f" = {plan.batch_size}."))
  if index is not None and (index.shape != (b,) or not np.issubdtype(index.dtype, np.integer)
                            or (b and (index.min() < 0 or index.max() >= 2**32))):
    raise ValueError(f"index must be int [{b}] in [0, 2**32), got {index.dtype} {index.shape}.")
  if x_spec is not None and (x.shape[1:], x.dtype) != x_spec:
    raise ValueError(f"Every batch must have examples of shape {x_spec[0]} and dtype "
                     f"{x_spec[1]}; got {x.shape[1:]} {x.dtype}.")
  return x, y, index


def pad_batch(x: np.ndarray, y: np.ndarray, index: np.ndarray, local_batch: int) -> HostBatch:
  """Pads to ``local_batch`` rows with copies of the first example, masked out (so the compiled
  step never sees a new shape)."""
  b = x.shape[0]
  pad = local_batch - b
  y = y.astype(np.int32)
  if pad:
    x = np.concatenate([x, np.repeat(x[:1], pad, axis=0)])
    y = np.concatenate([y, np.repeat(y[:1], pad)])
    if index.shape[0] < local_batch:
      index = np.concatenate([index, np.repeat(index[:1], pad)])
  return HostBatch(x, y, np.arange(local_batch) < b, index.astype(np.uint32), b)


def default_index(plan: Plan, position: int, seen: int) -> np.ndarray:
  """Global indices of a batch given without them: the running example count of this process,
  or on a multi-process run the layout ``b * batch_size + p * local_batch + i``."""
  offset = (position * plan.batch_size + plan.process_index * plan.local_batch
            if plan.num_processes > 1 else seen)
  return offset + np.arange(plan.local_batch, dtype=np.int64)


class Indices:
  """The global example indices of the batches read so far (this process's), so that no example
  is counted twice: given indices are kept in a set, batches numbered by default (unique among
  themselves, :func:`default_index`) as ranges of indices."""

  def __init__(self, plan: Plan):
    self.plan, self.batches, self.examples = plan, 0, 0
    self.given: set[int] = set()
    self.starts: list[int] = []  # the default-numbered ranges [start, stop), in increasing order
    self.stops: list[int] = []

  def add(self, index: np.ndarray | None, size: int) -> None:
    """Records the next batch's ``size`` examples (``index``: as given; ``None``: numbered by
    default); a ``ValueError`` names an index given twice, in this batch or an earlier one."""
    if index is None:
      start = int(default_index(self.plan, self.batches, self.examples)[0])
      stop = start + size
      values, counts = np.arange(start, stop, dtype=np.int64), np.ones(size, np.int64)
      given = (self.given.intersection(range(start, stop)) if size < len(self.given)
               else {v for v in self.given if start <= v < stop})
      refuse_repeats(values, counts + np.isin(values, list(given)), size, "so far")
      if self.stops and self.stops[-1] == start:
        self.stops[-1] = stop
      else:
        self.starts.append(start)
        self.stops.append(stop)
    else:
      values, counts = np.unique(index.astype(np.int64), return_counts=True)
      # In a default-numbered range: the last range starting at or below the value holds it
      # (slot -1, no such range, reads the appended 0: never).
      slot = np.searchsorted(np.asarray(self.starts, np.int64), values, side="right") - 1
      ranged = (slot >= 0) & (values < np.asarray(self.stops + [0], np.int64)[slot])
      seen = np.fromiter((v in self.given for v in values.tolist()), bool, len(values))
      refuse_repeats(values, counts + (ranged | seen), size, "so far")
      self.given.update(values.tolist())
    self.batches, self.examples = self.batches + 1, self.examples + size


def refuse_repeats(values: np.ndarray, times: np.ndarray, size: int, where: str) -> None:
  """A ``ValueError`` when a global index of ``values`` is given more than once (``times``:
  how often each one is given ``where``; ``size``: the examples of the batch or array)."""
  repeated = times > 1
  if not repeated.any():
    return
  first = int(np.argmax(repeated))
  raise ValueError(
      f"index gives {int(np.sum(times[repeated] - 1))} of its {size} examples a global index given "
      f"before: e.g. {int(values[first])}, given {int(times[first])} times {where}. An index "
      "identifies one example (its randomness, its row of the report), so a repeated one counts "
      "an example twice: give every example its own index (e.g. np.arange(N) over the whole data "
      "set), or leave index out to number the examples in order.")


class _TextBar:
  """A minimal progress line on stderr, for when ``tqdm`` is not installed."""

  def __init__(self, total: int | None, desc: str):
    self.total, self.desc, self.n, self.postfix, self._last = total, desc, 0, "", 0.0

  def update(self, n: int) -> None:
    self.n += n
    now = time.monotonic()
    if now - self._last >= 1.0 or (self.total is not None and self.n >= self.total):
      self._last = now
      self._show()

  def set_postfix(self, refresh: bool = False, **values: str) -> None:
    self.postfix = " ".join(f"{k}={v}" for k, v in values.items())
    if refresh:
      self._show()

  def _show(self) -> None:
    of = f"/{self.total}" if self.total is not None else ""
    print(f"\r{self.desc}: {self.n}{of} ex {self.postfix}", end="", file=sys.stderr, flush=True)

  def close(self) -> None:
    print(file=sys.stderr, flush=True)


def progress_bar(total: int | None, enabled: bool) -> Any:
  """A ``tqdm`` bar (examples/s, running accuracies) when installed, else a plain text line;
  ``None`` when disabled."""
  if not enabled:
    return None
  try:
    from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel  (optional extra)
  except ImportError:
    return _TextBar(total, "jr.evaluate")
  return tqdm(total=total, unit="ex", desc="jr.evaluate", dynamic_ncols=True)


def timing(start: float, end: float, after_first: float | None, compile_s: float, step_s: float,
           evaluated: int, first_n: int) -> dict[str, float]:
  """Wall-clock statistics; the steady state runs from the end of the first (compiling) step."""
  running = max(end - after_first, 1e-12) if after_first is not None else 1e-12
  steady = evaluated > first_n
  return {"wall_s": end - start, "compile_and_first_step_s": compile_s, "step_s": step_s,
          "outside_step_fraction": max(running - step_s, 0.0) / running if steady else math.nan,
          "examples_evaluated": evaluated,
          "examples_per_s": (evaluated - first_n) / running if steady else math.nan}


def _is_array(a: Any) -> bool:
  return hasattr(a, "shape") and hasattr(a, "dtype")


def _type_name(value: Any) -> str:
  """``value``'s type as a user knows it: ``numpy.ndarray``, ``jax.Array``, ``list``, ..."""
  if isinstance(value, jax.Array):
    return "jax.Array"
  kind = type(value)
  if kind.__module__ == "builtins":
    return kind.__qualname__
  return f"{kind.__module__.split('.')[0]}.{kind.__qualname__}"


def describe(value: Any) -> str:
  """What a message says ``value`` is: its type (with ``a``/``an``) and, for an array its shape,
  for a mapping its keys, for a list or tuple its elements' types.

  Examples:
    >>> describe(np.zeros((10, 32, 32, 3)))
    'a numpy.ndarray of shape (10, 32, 32, 3)'
    >>> describe({"x": 1, "y": 2})
    "a dict with keys 'x', 'y'"
    >>> describe([np.zeros(3), np.zeros(3)])
    'a list of 2 elements (numpy.ndarray, numpy.ndarray)'
    >>> describe(5)
    'an int'
  """
  name = _type_name(value)
  if _is_array(value):
    text = f"{name} of shape {tuple(value.shape)}"
  elif isinstance(value, Mapping):
    keys = [repr(k) for k in list(value)[:6]]
    text = f"{name} with keys {', '.join(keys)}" + (", ..." if len(value) > 6 else "")
    text = text if value else f"empty {name}"
  elif isinstance(value, (list, tuple)):
    kinds = ", ".join(_type_name(v) for v in value[:4]) + (", ..." if len(value) > 4 else "")
    text = f"{name} of {len(value)} elements ({kinds})"
  else:
    text = name
  return ("an " if text[0] in "aeiou" else "a ") + text


DATA_FORMS = ("data must be a tuple of arrays (x, y) or (x, y, index), or an iterable of such "
              "batches")


def _refuse_misshapen_data(data: Any) -> None:
  """Raises, with what to pass instead, for ``data`` that is not a tuple of arrays and that as an
  iterable of batches could only fail at its first batch: an array (its rows would be the
  batches), a mapping (its keys would be) or a list or tuple starting with an array (each array
  would be one batch)."""
  if _is_array(data) and getattr(data, "dtype", None) != object:
    hint = "pass (x, y), the inputs x [N, ...] with their labels y [N]"
  elif isinstance(data, Mapping) and not all(isinstance(k, tuple) for k in data):
    hint = ("pass (data['x'], data['y'])" if "x" in data and "y" in data else
            "pass (x, y), the inputs x [N, ...] with their labels y [N]")
  elif isinstance(data, (list, tuple)) and data and _is_array(data[0]):
    if len(data) in (2, 3) and all(map(_is_array, data)):  # a list: a tuple is taken above
      hint = (f"pass a tuple ({'x, y' if len(data) == 2 else 'x, y, index'}) instead: a list is "
              "read as an iterable of batches")
    elif len(data) in (2, 3):
      hint = "make every element an array, e.g. (x, np.asarray(y))"
    else:
      hint = "pass (x, y) or (x, y, index)"
  else:
    return
  raise ValueError(f"{DATA_FORMS}; got {describe(data)}: {hint}.")


def batches(data: Any, local_batch: int) -> tuple[Iterator[tuple], int | None]:
  """An iterator of ``(x, y)`` or ``(x, y, index)`` host batches, and the example count if known."""
  if isinstance(data, tuple) and len(data) in (2, 3) and all(map(_is_array, data)):
    n = len(data[0])
    for name, a in zip(("y", "index"), data[1:]):
      if len(a) != n:
        raise ValueError(f"Batch sizes differ: x has {n} examples, {name} has {len(a)}.")
    if len(data) == 3 and np.ndim(data[2]) == 1 and np.issubdtype(data[2].dtype, np.integer):
      values, counts = np.unique(np.asarray(data[2], np.int64), return_counts=True)
      refuse_repeats(values, counts, n, "in index")  # before any batch is compiled or evaluated

    # Arrays sharded over several devices are read back once (this driver places every batch
    # itself; slicing a sharded array would need its sharding spelled out).
    arrays = tuple(np.asarray(a) if isinstance(a, jax.Array) and a.is_fully_addressable
                   and len(a.sharding.device_set) > 1 else a for a in data)

    def sliced():
      for start in range(0, n, local_batch):
        yield tuple(a[start:start + local_batch] for a in arrays)

    return sliced(), n
  _refuse_misshapen_data(data)
  if not isinstance(data, Iterable):
    raise TypeError(f"{DATA_FORMS}; got {describe(data)}: pass (x, y).")
  return iter(data), None


def to_host(a: Array) -> np.ndarray:
  """A global array as a NumPy array on every process (replicated sums need no communication)."""
  if not isinstance(a, jax.Array) or a.is_fully_addressable:
    return np.asarray(a)
  if a.sharding.is_fully_replicated:
    return np.asarray(a.addressable_data(0))
  return np.asarray(multihost_utils.process_allgather(a, tiled=True))


def hash_batch(hasher: Any, x: np.ndarray, y: np.ndarray, index: np.ndarray | None) -> None:
  hasher.update(f"{x.shape}|{x.dtype}|{y.dtype}|{index is not None}".encode())
  hasher.update(np.ascontiguousarray(x).tobytes())
  hasher.update(np.ascontiguousarray(y).tobytes())
  if index is not None:
    hasher.update(np.ascontiguousarray(index).tobytes())
