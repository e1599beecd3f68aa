r"""Early exit: once a point is broken it stops costing model evaluations.

An attack that declares ``done`` (:class:`jaxrobust.Attack`: ``state -> [B]`` bool, "the state
already holds an adversarial point that ``finalize`` returns") runs its ``num_steps`` steps as
follows, instead of one fixed-length ``lax.scan`` over the whole batch:

* **freezing** -- a step leaves the rows that were done before it unchanged (every per-row state
  leaf keeps its value; scalars such as step counters, and declared ``shared_fields``, advance),
  so a row's trajectory is its own up to its first success and then stops. It does not depend on the
  batch, on the chunking below, or on when the loop ends;
* **segments with re-compaction** -- the steps run in segments of :math:`R` steps. Before each
  segment the rows still to attack are moved to the front of the batch (a stable partition
  by ``done``), cut into chunks of :math:`c` rows (:meth:`jaxrobust._options.RunOptions.chunk_rows`:
  ``chunk_size`` or a backend default, balanced over the batch), and only the chunks holding such
  rows run the segment's :math:`R` steps; the results go back to their rows. With :math:`a_s`
  rows left at segment :math:`s`, the model sees about :math:`R \sum_s \lceil a_s / c \rceil c`
  rows instead of :math:`R\,S\,B`, and the loop ends as soon as no row is left. Rows are
  moved only where that pays (:func:`compacts`): with the backend's chunks, a batch of two or
  three of them is compacted only for a model that costs at least :data:`COMPACTION_MIN_FLOPS`
  per evaluation of the batch; elsewhere the broken rows are frozen in place. With the
  backend's chunks (``chunk_size=None``) in a batch of at least four of them, a segment that
  would skip fewer than :math:`c` rows (nothing broken yet: a robust model, the first steps) runs
  the whole batch as one instead, in one loop rather than one per chunk (a third traced shape of
  the step); so do ``init``, ``finalize`` and the scoring of the attacked rows
  (:func:`whole_when_crowded`). Where nothing breaks, early exit's worst case, the digits models'
  PGD-20 curves on 540 points went from 1.11-1.34x the dense run's time to 0.97-1.07x with the
  segments, and the MLP's from 1.09x to 1.03-1.05x with the rest
  (``benchmarks/bench_early_exit.py --regime full``).

Exactness. A row that is never done runs exactly the steps of the dense run, so its final point
is the same; a row that is done holds a successful point in both runs. Hence the success flags,
robust accuracy and curves equal the dense computation's (up to the float rounding of a model
evaluated on a chunk instead of the whole batch, which the conformance tests check does not
flip verdicts on their problems). What changes is the returned point of a broken row: the first
success (and the one iterate after it that ``finalize`` may score) instead of the success of
largest loss among all steps. ``early_exit=False`` (:class:`jaxrobust._options.RunOptions`) keeps
the old behaviour for users who want the strongest adversarial example rather than the verdict.

The segment loop's trip count depends on the data, so this cannot be differentiated in reverse
mode (adversarial training uses the dense scan, :mod:`jaxrobust.training`). Under an Explicit
mesh axis that shards the batch, rows are not moved between devices: the segments run on the
whole batch (freezing still applies and the loop still ends when every row is done); inside a
``shard_map`` (as :func:`jaxrobust.evaluate` runs) each device compacts its own rows.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxrobust import _cost as cost
from jaxrobust._batch import expand
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack, Budget
from jaxrobust.engine import compaction, propagations

Array = jax.Array

SEGMENTS = 8
"""About how many segments a run is cut into (each re-compacts the rows left)."""


def remainder_rows(chunk: int) -> int:
  """Rows per chunk for the last rows of a segment that do not fill a chunk: ``chunk // 8``
  (chunks under 16 rows have no smaller ones, and :func:`run_until_done` uses them only for a
  batch of at least four chunks: elsewhere they would save less than they cost to compile).

  A chunk costs all its rows whatever number of them is still to attack, so with chunks of
  :math:`c` rows the few survivors of a long attack (AutoAttack's Square: 5000 queries on the
  points no gradient attack broke) would cost up to :math:`c` rows each. Running the
  :math:`a \bmod c` rows left over by full chunks in chunks of :math:`c/8` bounds the waste by
  :math:`c/8 - 1` rows per segment, at the price of tracing the attack's step for a second shape.
  Measured on AutoAttack standard, digits MLP: see ``benchmarks/RESULTS.md``.

  Examples:
    >>> remainder_rows(64), remainder_rows(512), remainder_rows(16), remainder_rows(8)
    (8, 64, 2, 8)
  """
  return chunk // 8 if chunk >= 16 else chunk


def segment_steps(num_steps: int) -> int:
  """Steps per segment: about ``num_steps / SEGMENTS``, at least 1."""
  return max(1, -(-num_steps // SEGMENTS))


def freeze(keep: Array, old: Any, new: Any) -> Any:
  """``new`` with the rows of ``keep`` (``[B]`` bool) taken from ``old`` in every per-row leaf
  (:class:`~jaxrobust.engine.compaction.Layout`: scalars and declared ``shared_fields`` advance).

  Examples:
    >>> import jax.numpy as jnp
    >>> freeze(jnp.array([True, False]), (jnp.zeros(2), jnp.int32(0)),
    ...        (jnp.ones(2), jnp.int32(1)))[0].tolist()
    [0.0, 1.0]
  """
  layout = compaction.Layout(old, keep.shape[0])
  old_rows, _ = layout.split(old)
  new_rows, new_shared = layout.split(new)
  kept = [jnp.where(expand(keep, o.ndim), o, n) for o, n in zip(old_rows, new_rows)]
  return layout.join(kept, new_shared)


def run_until_done(attack: Attack, logits_fn: Callable[..., Array], x: Array, y: Array,
                   eps: Array, keys: Array, target: Array | None, frozen: Array,
                   limit: Array | None = None, *, lower, upper, options: RunOptions,
                   meter: bool = False) -> Any:
  """``x_adv`` of ``attack`` on rows ``[B]``, with early exit (see the module).

  Args:
    attack: an attack with ``done``.
    logits_fn, x, y, eps, keys, target: the rows (``eps`` ``[B]``).
    frozen: ``[B]`` rows not to attack at all (their ``x_adv`` is whatever ``finalize`` makes of
      the initial state; callers replace it).
    limit: with ``meter``, ``[B]`` int32 the most steps per row (for an attack with a
      :class:`~jaxrobust._types.Meter`, the propagations its steps may spend), or ``None``.
    lower, upper: the box.
    options: the run's options: ``unroll`` steps per iteration of the inner loop (an int; the
      done check runs between them), chunks of :meth:`~jaxrobust._options.RunOptions.chunk_rows`
      rows of ``x`` (inside a ``shard_map``, of this device's rows).
    meter: count the steps each row runs (:mod:`jaxrobust.engine.propagations`).

  Returns:
    ``x_adv`` ``[B, ...]`` of ``x``'s dtype; with ``meter``, ``(x_adv, tally)``: the steps each
    row ran (``[B]`` int32) or what they spent
    (:func:`jaxrobust.engine.propagations.tally`).
  """
  chunk = options.chunk_rows(x.shape[0], exits=True)
  block = max(1, int(options.unroll))
  length = block * -(-segment_steps(attack.num_steps) // block)
  total = attack.num_steps
  # Rows are never moved across the devices of an Explicit mesh axis (see the module).
  compact = compacts(options, frozen, chunk, functools.partial(model_flops, attack, logits_fn, x))
  # Smaller chunks for the rows left over cost a second traced shape of the step: worth it only
  # where the run dominates, a batch of at least four chunks (see remainder_rows).
  small = remainder_rows(chunk) if many_chunks(x.shape[0], chunk) else chunk
  whole = whole_when_crowded(options, x.shape[0], chunk)
  rows = (x, y, eps, keys, target, frozen, limit)
  kernel = propagations.metered_kernel(attack, freeze) if meter else attack

  def init(state, x, y, eps, keys, target, frozen, limit):
    state = attack.init(logits_fn, x, y, Budget(eps, lower, upper), keys, target)
    return propagations.start(state, x, limit, attack) if meter else state

  def finalize(state, x, y, eps, keys, target, frozen, limit):
    inner = state.state if meter else state
    x_adv = attack.finalize(logits_fn, inner, x, y, Budget(eps, lower, upper),
                            target).astype(x.dtype)
    return (x_adv, propagations.tally(attack, state)) if meter else x_adv

  left = lambda state: jnp.any(~(frozen | kernel.done(state)))

  def segment(state, count):
    # One traced program for every segment, the last (shorter) one included: ``count`` is data.
    run = functools.partial(_steps_until_done, kernel, logits_fn, lower, upper, count, block)
    if not compact:
      return run(state, *rows)[0]
    done = frozen | kernel.done(state)
    compacted = lambda state: _compacted_segment(run, state, rows, done, chunk, small)
    if not whole:
      return compacted(state)
    # Where compaction would skip less than a chunk's rows (nothing broken yet, as on a robust
    # model), the whole batch runs as one: the same rows, one loop instead of one per chunk.
    return jax.lax.cond(compaction.crowded(~done, chunk), lambda state: run(state, *rows)[0],
                        compacted, state)

  def run_all():
    # init and finalize may evaluate the model: on the rows to attack only (on the whole batch at
    # once where chunks would skip less than a chunk's rows, as the segments do).
    state = (compaction.map_rows(init, ~frozen, chunk, rows, whole_when_crowded=whole) if compact
             else init(None, *rows))
    cond = lambda carry: (carry[0] < total) & left(carry[1])
    body = lambda carry: (carry[0] + length,
                          segment(carry[1], jnp.minimum(length, total - carry[0])))
    _, state = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), state))
    return (compaction.map_rows(finalize, ~frozen, chunk, rows, state, whole_when_crowded=whole)
            if compact else finalize(state, *rows))

  if compact:
    return run_all()
  # Without compaction, still no model evaluation at all when there is nothing to attack.
  nothing = lambda: ((jnp.zeros_like(x), propagations.no_tally(attack, frozen)) if meter
                     else jnp.zeros_like(x))
  return jax.lax.cond(jnp.any(~frozen), run_all, nothing)


def model_flops(attack: Attack, logits_fn: Callable[..., Array], x: Array) -> float:
  """What one evaluation of the model on the batch ``x`` costs, in floating-point operations
  (:func:`jaxrobust._cost.model_flops`). A randomized model (``attack.samples``: the attacks on
  one, EOT's, do not exit early today) and a model that cannot be traced alone are not priced:
  counted as costly, so compacted as before."""
  if attack.samples:
    return math.inf
  try:
    return cost.model_flops(logits_fn, x)
  except Exception:  # noqa: BLE001 - the run itself reports what is wrong with the model
    return math.inf


def whole_when_crowded(options: RunOptions, batch: int, chunk: int) -> bool:
  """Whether the batch runs as one where chunks would skip fewer than ``chunk`` rows (the
  segments, ``init`` and ``finalize``, the scoring of the attacked rows): with the backend's chunks
  only (an explicit ``chunk_size`` is a promise of rows per model call), in a batch of at least
  four of them (see :func:`remainder_rows`).

  Examples:
    >>> whole_when_crowded(RunOptions(), 540, 60), whole_when_crowded(RunOptions(), 100, 50)
    (True, False)
    >>> whole_when_crowded(RunOptions(chunk_size=60), 540, 60)
    False
  """
  return options.chunk_size is None and many_chunks(batch, chunk)


def many_chunks(batch: int, chunk: int) -> bool:
  """Whether a batch holds at least four chunks: where the run dominates enough to be worth a
  second traced shape (:func:`remainder_rows`) or a whole-batch branch
  (:func:`whole_when_crowded`)."""
  return batch >= 4 * chunk


def compactable(rows: Array, chunk: int) -> bool:
  """Whether rows may be moved within the batch here: the batch is not sharded over an Explicit
  mesh axis (see the module) and holds more than one chunk."""
  return compaction.batch_axis(rows) is None and chunk < rows.shape[0]


COMPACTION_MIN_FLOPS = 10**9
"""Floating-point operations of one model evaluation of the whole batch from which a batch of two
or three of the backend's chunks is compacted (:func:`compacts`)."""


def compacts(options: RunOptions, rows: Array, chunk: int, flops: Callable[[], float]) -> bool:
  r"""Whether this run moves its rows (compaction, :func:`compactable` here) where that pays.

  With an explicit ``chunk_size`` always: it is a promise of at most that many rows per model
  call. With the backend's chunks (``chunk_size=None``), in a batch of at least four chunks, or
  of two or three when one model evaluation of the whole batch costs at least
  :data:`COMPACTION_MIN_FLOPS` (``flops()``, :func:`jaxrobust._cost.model_flops`, called only
  then). Elsewhere broken rows are frozen and the loop still ends once none is left, but no row
  moves: the verdicts and every row's result are the same (see the module), the machinery of the
  chunk loops is not compiled at all, and the model evaluates the frozen rows too.

  Why: the chunk loops roughly double the program that XLA compiles, and in a batch of a few
  chunks of a cheap model they save nothing. Measured on a 2-core CPU, PGD-10 at 128 rows, two
  chunks of 64 (``benchmarks/bench_compaction.py``; ``benchmarks/RESULTS.md``, "Compaction where
  it pays"): on the digits CNN (0.03 GFLOP per batch) and MLP the program compiled in 1.1-1.4 s
  without compaction against 1.9-2.6 s with it, and ran in 1-28 ms either way; on a random
  WRN-10-2 (11.4 GFLOP) where 126 of the 128 points broke, it ran in 1.18 s with compaction
  against 1.98 s without (the two survivors kept the whole batch running), on a WRN-10-1
  (3.2 GFLOP) in 0.67-0.78 s against 0.77-0.85 s.

  Examples:
    >>> import jax.numpy as jnp
    >>> rows, cheap, costly = jnp.ones(150, bool), lambda: 35 * 10**6, lambda: 11 * 10**9
    >>> compacts(RunOptions(), rows, 50, cheap), compacts(RunOptions(), rows, 50, costly)
    (False, True)
    >>> explicit = RunOptions(chunk_size=50)  # a promise of rows per model call
    >>> compacts(explicit, rows, 50, cheap), compacts(RunOptions(), rows, 30, cheap)  # 5 chunks
    (True, True)
  """
  if not compactable(rows, chunk):
    return False
  if options.chunk_size is not None or many_chunks(rows.shape[0], chunk):
    return True
  return flops() >= COMPACTION_MIN_FLOPS


def _steps_until_done(attack: Attack, logits_fn, lower, upper, count: Array, block: int, state,
                      x, y, eps, keys, target, frozen, limit=None) -> tuple[Any, Array]:
  """``(state, steps run)``: up to ``count`` (traced) steps, ``block`` per loop iteration, each
  freezing the rows done before it, leaving the loop once every row is done."""
  del keys, limit  # the attack's keys (and a metered state's limit) are in its state
  budget = Budget(eps, lower, upper)
  finished = lambda state: frozen | attack.done(state)

  def step(state):
    new = attack.step(logits_fn, state, x, y, budget, target)
    return freeze(finished(state), state, new)

  def body(carry):
    t, state = carry
    if block == 1:
      return t + 1, step(state)
    for j in range(block):  # static: unrolled inside the loop body; no step beyond count
      state = jax.lax.cond(t + j < count, step, lambda state: state, state)
    return t + block, state

  cond = lambda carry: (carry[0] < count) & jnp.any(~finished(carry[1]))
  t, state = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), state))
  return state, jnp.minimum(t, count)


def _compacted_segment(run: Callable[..., Any], state: Any, rows: tuple, done: Array,
                       chunk: int, small: int | None) -> Any:
  """``run(state, *rows)`` on the rows not ``done`` (:func:`compaction.chunk_loop`); done rows
  keep their state. Per-row state leaves move with their rows. The other leaves never depend on
  the rows, only on how many steps ran: they are taken from the chunk that ran the most steps,
  which is the step at which the last row of the whole batch finished (or the segment's end),
  whatever the chunking or the order of the rows, so every row's result is independent of both."""
  layout = compaction.Layout(state, done.shape[0])
  state_rows, shared = layout.split(state)

  def one_chunk(state_rows, *rows):
    out, steps = run(layout.join(state_rows, shared), *rows)
    return (*layout.split(out), steps)

  state_rows, shared = compaction.chunk_loop(one_chunk, ~done, chunk, rows, state_rows, shared,
                                             small=small)
  return layout.join(state_rows, shared)
