r"""``jr.evaluate``: a streaming, sharded, resumable robustness evaluation over a whole data set.

The data arrive as host batches; each is padded to ``batch_size`` (copies of a valid example,
masked out) and fed to ONE compiled step, built and ``jax.jit``-ed once per call, that runs every
attack on the batch and returns integer sums. For example :math:`i` (global index :math:`g_i`),
attack :math:`a` and budget :math:`\epsilon_k` the step computes

.. math::
   r_{a,k,i} = [\hat y(x_i) = y_i]\;\prod_{j:\ \epsilon_j \le \epsilon_k}
               \big(1 - s_a(x_i, \epsilon_j;\ \mathrm{fold\_in}(\mathrm{fold\_in}(key, g_i), j))\big)

(for a minimum-norm attack :math:`r_{a,k,i} = [\hat y(x_i) = y_i]\,[\epsilon^*_a(x_i) >
\epsilon_k]`) and the masked sums :math:`N = \sum_i m_i`, :math:`\sum_i m_i [\hat y(x_i) = y_i]`,
:math:`\sum_i m_i r_{a,k,i}` and :math:`\sum_i m_i \prod_a r_{a,k,i}` (the per-example worst case
over attacks). The host adds them up in int64 (:class:`jaxrobust.Report`). Because every
example's randomness derives from its global index and the sums are exact integers, the report
does not depend on batch size, padding, batch order, device count or an interruption. Reliability
flags are decided the same way, from integer counts summed over the whole data set.

The report describes the model as it is when the call starts: compiled steps are reused across
calls only where they compute what a fresh one would (the model's parameters are arguments, or
the arrays compiled in as constants are the very same ones; see :func:`evaluate`).

Scaling: with ``mesh=`` the batch is sharded over the mesh's first (or ``batch_axis``) axis with
:class:`jax.sharding.NamedSharding`; the attack loop is purely per-example, so XLA compiles it
with no cross-device movement of attack data (only integer scalars, the reliability counts of
each eps, and the final integer sums are all-reduced). Multi-host
runs call :func:`jax.distributed.initialize` first; each process then passes its own shard of
the data and the batches are assembled with :func:`jax.make_array_from_process_local_data`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import re
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrobust import _checkpoint, metrics
from jaxrobust._types import Attack, Budget
from jaxrobust._validation import (
  check_batch,
  check_bounds,
  check_eps,
  check_labels,
  check_logits,
  check_x_in_box,
  logits_shape,
)
from jaxrobust._batch import fold_in
from jaxrobust.engine.curve_kernel import worst_case_over_smaller_eps as _worst_case_over_smaller_eps
from jaxrobust.report import Report
from jaxrobust.engine.attack_loop import run_attack
from jaxrobust.engine.scoring import clean_diagnosis


def run_unchecked(*args, **kwargs):
  return run_attack(*args, **kwargs)[0]

Array = jax.Array

_CHECKPOINT_VERSION = 2  # 2: model fingerprint, reliability counts


class Totals(NamedTuple):
  """The streaming reducer of one batch (or of a whole run): integer sums over valid examples."""

  n: Array  # [] int32, valid (unpadded) examples
  clean_correct: Array  # [] int32
  robust: Array  # [A, K] int32, robust under attack a at eps k
  worst_case: Array  # [K] int32, robust under every attack at eps k


class PerExample(NamedTuple):
  """Per-example outputs of the step, batch axis first (so one ``P(batch)`` spec shards all)."""

  mask: Array  # [B] bool, False on padding
  index: Array  # [B] uint32 global index
  correct: Array  # [B] bool
  robust: Array  # [B, A, K] bool
  worst_case: Array  # [B, K] bool
  eps_star: Array  # [B, M] float32, minimal norms of the M minimum-norm attacks


def _result_checks(result: Any) -> tuple[dict[str, Array], dict[str, Array]]:
  """``(flags, counts)`` of ``AttackResult.info``: each flag OR-ed over its array (``[]`` bool),
  each count as an int32 array (an integer sum over the batch)."""
  info = getattr(result, "info", None)
  if not isinstance(info, Mapping):
    return {}, {}
  flags, counts = info.get("flags"), info.get("counts")
  flags = ({str(k): jnp.any(jnp.asarray(v).astype(bool)) for k, v in sorted(flags.items())}
           if isinstance(flags, Mapping) else {})
  counts = ({str(k): jnp.asarray(v).astype(jnp.int32) for k, v in sorted(counts.items())}
            if isinstance(counts, Mapping) else {})
  return flags, counts


def build_step(logits_fn: Callable[[Array], Array], attacks: Mapping[str, Attack], *,
               key_impl: Any = None, keep_per_example: bool = False,
               eps_batch_size: int | None = None, unroll: int | bool = 1,
               chunk_size: int | None = None,
               axis_name: str | None = None) -> Callable[..., tuple]:
  r"""The per-batch evaluation step (not jitted): every attack on one padded batch.

  ``step(x, y, mask, index, epsilons, key_data, lower, upper) -> (Totals, flags, counts,
  PerExample)``
  with ``x [B, ...]``, ``y [B]`` int32, ``mask [B]`` bool, ``index [B]`` uint32 global indices,
  ``epsilons [K]`` float32, ``key_data`` the raw data of one PRNG key, and scalar bounds. Example
  ``i`` draws its randomness from ``fold_in(key, index[i])`` (and, for a fixed-budget attack,
  ``fold_in(., k)`` at the ``k``-th eps, as :func:`jaxrobust.robustness_curve` does), so every
  attack sees the same keys whatever else is evaluated with it. ``flags`` is a tuple (one dict
  per attack) of the attack's reliability flags (``AttackResult.info["flags"]``, OR-ed over the
  batch and the eps grid) and ``counts`` a tuple of dicts of the integer counts behind them
  (``info["counts"]``: ``[K, ...]`` for a fixed-budget attack, one per eps; ``[...]`` for a
  minimum-norm attack), summed over the unpadded examples. A flag that compares a count with a
  fraction of the data (AutoAttack's ``square_beats_white_box``) is only meaningful over the whole
  data set: :class:`jaxrobust.Report` decides it again from the summed counts. With
  ``axis_name`` (inside :func:`jax.shard_map`) the sums, counts and flags are reduced over that
  axis with :func:`jaxrobust.metrics.psum`.

  Args:
    logits_fn: the model.
    attacks: name -> untargeted :class:`jaxrobust.Attack`.
    key_impl: the PRNG implementation of the key (``jax.random.key_impl``).
    keep_per_example: return a :class:`PerExample`; otherwise ``None``.
    eps_batch_size: as in :func:`jaxrobust.robustness_curve`.
    unroll: as in :func:`jaxrobust.run`.
    chunk_size: as in :func:`jaxrobust.run` (compacts the points an attack still has to attack).
    axis_name: the mapped batch axis to reduce over, or ``None`` under plain ``jit``.

  Returns:
    The step function.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import jaxrobust as jr
    >>> from jaxrobust.evaluate import build_step
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> step = jax.jit(build_step(logits_fn, {"pgd": jr.attacks.pgd(steps=5)}))
    >>> x, y = jnp.array([[0.6, 0.4], [0.9, 0.1]]), jnp.array([0, 0])  # Linf distances 0.1, 0.4
    >>> totals, flags, counts, _ = step(
    ...     x, y, jnp.array([True, True]), jnp.arange(2, dtype=jnp.uint32), jnp.array([0.05, 0.2]),
    ...     jax.random.key_data(jax.random.key(0)), 0.0, 1.0)
    >>> int(totals.clean_correct), totals.robust.tolist(), totals.worst_case.tolist()
    (2, [[2, 1]], [2, 1])
  """
  inner = _build_step(lambda _: logits_fn, attacks, key_impl=key_impl,
                      keep_per_example=keep_per_example, eps_batch_size=eps_batch_size,
                      unroll=unroll, chunk_size=chunk_size, axis_name=axis_name)
  return functools.partial(inner, ())


def _build_step(rebuild: Callable[[Any], Callable[[Array], Array]],
                attacks: Mapping[str, Attack], *, key_impl: Any, keep_per_example: bool,
                eps_batch_size: int | None, unroll: int | bool, chunk_size: int | None,
                axis_name: str | None) -> Callable[..., tuple]:
  """:func:`build_step` whose step takes the model's arrays first: ``step(model_arrays, x, ...)``
  with ``logits_fn = rebuild(model_arrays)``."""
  items = tuple(attacks.values())

  def step(model_arrays, x, y, mask, index, epsilons, key_data, lower, upper):
    logits_fn = rebuild(model_arrays)
    key = jax.random.wrap_key_data(key_data, impl=key_impl)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
    y = y.astype(jnp.int32)
    mask = mask.astype(bool)  # padding is never attacked (and costs nothing with chunk_size)
    epsilons = epsilons.astype(jnp.float32)
    # As jr.robustness_curve: the clean verdict (for a randomized model, attack.samples > 0, a
    # majority vote) and the non-finite gradient check, on x as given (bfloat16 stays bfloat16).
    correct, bad_gradient = clean_diagnosis(max(a.samples for a in items), logits_fn, x, y, keys)
    bad_gradient = bad_gradient & mask  # padded copies must not add to the counts
    num_eps = epsilons.shape[0]
    # Per-example budgets built from a slice of x carry x's batch sharding, like the keys (an
    # Explicit mesh axis types every array; a vmap over keys and eps needs both sharded alike).
    zeros = jnp.zeros_like(x.reshape(x.shape[0], -1)[:, 0], dtype=jnp.float32)  # [B]
    robust, eps_star, flags, counts = [], [], [], []
    for attack in items:
      if attack.minimum_norm:
        result = run_unchecked(attack, logits_fn, x, y, Budget(zeros + jnp.inf, lower, upper), keys,
                               unroll=unroll, clean_correct=correct, bad_gradient=bad_gradient,
                               active=mask, chunk_size=chunk_size)
        size = result.norm.astype(jnp.float32)
        robust.append(correct[None, :] & (size[None, :] > epsilons[:, None]))
        eps_star.append(size)
        attack_flags, attack_counts = _result_checks(result)
        flags.append(attack_flags)
        counts.append(attack_counts)
        continue

      def broken_at(index_and_eps, attack=attack):
        k, eps = index_and_eps
        result = run_unchecked(attack, logits_fn, x, y, Budget(zeros + eps, lower, upper),
                               fold_in(keys, k), unroll=unroll, clean_correct=correct,
                               bad_gradient=bad_gradient, active=mask, chunk_size=chunk_size)
        return (result.success, *_result_checks(result))

      indexed = (jnp.arange(num_eps, dtype=jnp.uint32), epsilons)
      if eps_batch_size == 0:
        broken, attack_flags, attack_counts = jax.vmap(broken_at)(indexed)
      else:
        broken, attack_flags, attack_counts = jax.lax.map(broken_at, indexed,
                                                          batch_size=eps_batch_size or None)
      robust.append(correct[None, :] & ~_worst_case_over_smaller_eps(broken, epsilons))
      flags.append({k: jnp.any(v) for k, v in attack_flags.items()})
      counts.append(attack_counts)  # [K, ...] each: one per eps

    robust = jnp.stack(robust)  # [A, K, B]
    worst = jnp.all(robust, axis=0)  # [K, B]
    totals = Totals(n=jnp.sum(mask, dtype=jnp.int32),
                    clean_correct=jnp.sum(correct & mask, dtype=jnp.int32),
                    robust=jnp.sum(robust & mask[None, None, :], axis=-1, dtype=jnp.int32),
                    worst_case=jnp.sum(worst & mask[None, :], axis=-1, dtype=jnp.int32))
    flags, counts = tuple(flags), tuple(counts)
    if axis_name is not None:
      totals = metrics.psum(totals, axis_name)
      flags = jax.tree.map(lambda f: jax.lax.psum(f.astype(jnp.int32), axis_name) > 0, flags)
      counts = jax.tree.map(lambda c: jax.lax.psum(c, axis_name), counts)
    if not keep_per_example:
      return totals, flags, counts, None
    stars = jnp.stack(eps_star, axis=1) if eps_star else zeros[:, None][:, :0]
    return totals, flags, counts, PerExample(
        mask=mask, index=index, correct=correct, robust=jnp.moveaxis(robust, -1, 0),
        worst_case=jnp.moveaxis(worst, -1, 0), eps_star=stars)

  return step


class _Model(NamedTuple):
  """A model taken apart: the arrays passed to the compiled step as arguments, a function
  rebuilding ``logits_fn`` from them, and what identifies the model apart from those arrays."""

  arrays: Any  # a pytree of arrays (empty for an opaque callable)
  rebuild: Callable[[Any], Callable[..., Array]]
  identity: Any


def _split_model(logits_fn: Callable[..., Array]) -> _Model:
  """Takes ``logits_fn`` apart into the arrays it reads and the rest, as far as they can be seen.

  * ``functools.partial(model.apply, params)`` (and ``jax.tree_util.Partial``): the array leaves
    of its arguments;
  * a ``flax.nnx.Module``: its whole state (``nnx.split``; rebuilt with ``nnx.merge``);
  * any other callable is used as it is: what it reads is captured when it is traced (see
    :func:`_trace_model`).

  Arguments keep their sharding, are not copied into the program as constants, and new values of
  the same shapes reuse the compiled step.
  """
  nnx = sys.modules.get("flax.nnx")  # an nnx.Module exists only if flax.nnx was imported
  if nnx is not None and isinstance(logits_fn, nnx.Module):
    graphdef, state = nnx.split(logits_fn)
    return _Model(state, lambda state: nnx.merge(graphdef, state), ("nnx", graphdef))
  if not isinstance(logits_fn, functools.partial):
    return _Model([], lambda _: logits_fn, logits_fn)
  leaves, treedef = jax.tree.flatten((logits_fn.args, logits_fn.keywords))
  is_array = tuple(isinstance(v, (jax.Array, np.ndarray)) for v in leaves)
  arrays = [v for v, a in zip(leaves, is_array) if a]
  statics = tuple(v for v, a in zip(leaves, is_array) if not a)
  func = logits_fn.func

  def rebuild(model_arrays):
    it_arrays, it_statics = iter(model_arrays), iter(statics)
    args, keywords = jax.tree.unflatten(
        treedef, [next(it_arrays) if a else next(it_statics) for a in is_array])
    return functools.partial(func, *args, **keywords)

  return _Model(arrays, rebuild, ("partial", func, treedef, is_array, statics))


class _Trace(NamedTuple):
  """What tracing the model's forward pass at the step's batch shape shows of it."""

  program: str  # SHA-256 of the forward jaxpr's text (its structure and Python constants)
  constants: tuple  # every array the traced forward captured rather than took as an argument


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _jaxpr_constants(jaxpr: Any) -> list:
  """The constants of a closed jaxpr and of every closed jaxpr nested in its equations (an inner
  ``jax.jit`` keeps the arrays its function closes over as constants of its own)."""
  found = list(getattr(jaxpr, "consts", ()))
  inner = getattr(jaxpr, "jaxpr", jaxpr)
  todo = [v for eqn in getattr(inner, "eqns", ()) for v in eqn.params.values()]
  while todo:
    value = todo.pop()
    if isinstance(value, (tuple, list)):
      todo.extend(value)
    elif hasattr(value, "eqns") or (hasattr(value, "jaxpr") and hasattr(value, "consts")):
      found.extend(_jaxpr_constants(value))
  return found


def _trace_model(model: _Model, x: jax.ShapeDtypeStruct,
                 keys: jax.ShapeDtypeStruct | None) -> _Trace:
  """Traces ``logits_fn(x)`` (``logits_fn(x, keys)`` for a randomized model) once, at call time.

  A callable that closes over arrays (a closure, a global, an object's attribute, a function of
  a ``partial`` that does) has them compiled into the step as constants, with the values they
  have when the step is traced. The trace lists them, so that a compiled step is reused only
  while they are the very same (immutable) arrays, and the jaxpr's text catches changed Python
  constants and architectures.
  """
  def forward(arrays, *inputs):
    return model.rebuild(arrays)(*inputs)

  closed = jax.make_jaxpr(forward)(model.arrays, x, *(() if keys is None else (keys,)))
  text = _ADDRESS.sub("", str(closed.jaxpr))  # function reprs may carry memory addresses
  return _Trace(program=hashlib.sha256(text.encode()).hexdigest(),
                constants=tuple(_jaxpr_constants(closed)))


def _constant_key(value: Any) -> Any:
  """A key under which a captured constant can be recognised again: a ``jax.Array`` is immutable,
  so the object itself (its ``id``, while the cache keeps it alive) identifies its value; a NumPy
  array can be changed in place, so its bytes are hashed."""
  if isinstance(value, jax.Array):
    return ("array", id(value))
  digest = hashlib.sha256()
  _hash_array(digest, value)
  return ("value", digest.hexdigest())


def _hash_array(digest: Any, value: Any) -> None:
  """Adds an array's shape, dtype and values to ``digest`` (the shards this process holds, with
  their positions, for an array spread over several processes)."""
  if isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
    value = jax.random.key_data(value)
  if not hasattr(value, "shape") or not hasattr(value, "dtype"):
    digest.update(f"{type(value).__qualname__}|{value!r}|".encode())
    return
  digest.update(f"{tuple(value.shape)}|{value.dtype}|".encode())
  if isinstance(value, jax.Array) and not value.is_fully_addressable:
    for shard in sorted(value.addressable_shards, key=lambda s: str(s.index)):
      digest.update(str(shard.index).encode())
      digest.update(np.ascontiguousarray(np.asarray(shard.data)).tobytes())
    return
  digest.update(np.ascontiguousarray(np.asarray(value)).tobytes())


def _model_fingerprint(model: _Model, trace: _Trace) -> dict[str, str]:
  """What identifies the model in a checkpoint: the traced program and the values of every array
  it reads, arguments (the parameters of a ``partial`` or an ``nnx.Module``) and captured
  constants (those of a closure) alike."""
  digest = hashlib.sha256()
  for value in [*jax.tree.leaves(model.arrays), *trace.constants]:
    _hash_array(digest, value)
  return {"program": trace.program, "arrays": digest.hexdigest()}


# ------------------------------------------------------------------------------------------------
# Host side: configuration, fingerprint, data.


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


_PRIMITIVE = (bool, int, float, str, bytes, type(None))


def _config_of(fn: Any, depth: int = 0) -> Any:
  """The static configuration captured by an attack's closures, as JSON-ready values."""
  if isinstance(fn, _PRIMITIVE):
    return fn if not isinstance(fn, (float, bytes)) else repr(fn)
  if isinstance(fn, (tuple, list)) and depth < 4:
    return [_config_of(v, depth + 1) for v in fn]
  if isinstance(fn, types.FunctionType) and depth < 4:
    cells = [c.cell_contents for c in (fn.__closure__ or ()) if _has_contents(c)]
    return [fn.__qualname__, [_config_of(c, depth + 1) for c in cells]]
  return type(fn).__qualname__


def _has_contents(cell: Any) -> bool:
  try:
    cell.cell_contents  # noqa: B018
  except ValueError:
    return False
  return True


def _fingerprint(attacks: Mapping[str, Attack], epsilons: np.ndarray, key_data: np.ndarray,
                 key_impl: Any, batch_size: int, lower: float, upper: float,
                 keep_per_example: bool, eps_batch_size: int | None, unroll: Any,
                 process: tuple[int, int]) -> dict[str, Any]:
  """What must match for a checkpoint to be resumed: everything that changes the result."""
  described = []
  for name, a in attacks.items():
    config = [_config_of(f) for f in (a.init, a.step, a.finalize, a.drive, a.samples)]
    digest = hashlib.sha256(repr(config).encode()).hexdigest()[:16]
    described.append([name, a.name, a.norm, a.num_steps, a.minimum_norm, a.samples, digest])
  return {"attacks": described, "epsilons": [repr(float(e)) for e in epsilons],
          "key": [str(key_impl), key_data.astype(np.uint32).ravel().tolist()],
          "batch_size": batch_size, "box": [repr(float(lower)), repr(float(upper))],
          "keep_per_example": keep_per_example, "eps_batch_size": eps_batch_size,
          "unroll": unroll, "process": list(process)}


def _is_array(a: Any) -> bool:
  return hasattr(a, "shape") and hasattr(a, "dtype")


def _batches(data: Any, local_batch: int) -> tuple[Iterator[tuple], int | None]:
  """An iterator of ``(x, y)`` or ``(x, y, index)`` host batches, and the example count if known."""
  if isinstance(data, tuple) and len(data) in (2, 3) and all(map(_is_array, data)):
    n = len(data[0])
    for name, a in zip(("y", "index"), data[1:]):
      if len(a) != n:
        raise ValueError(f"Batch sizes differ: x has {n} examples, {name} has {len(a)}.")

    def sliced():
      for start in range(0, n, local_batch):
        yield tuple(a[start:start + local_batch] for a in data)

    return sliced(), n
  if not isinstance(data, Iterable):
    raise TypeError("data must be a tuple of arrays (x, y) or an iterable of (x, y) batches, got "
                    f"{type(data).__name__}.")
  return iter(data), None


def _to_host(a: Array) -> np.ndarray:
  """A global array as a NumPy array on every process (replicated sums need no communication)."""
  if not isinstance(a, jax.Array) or a.is_fully_addressable:
    return np.asarray(a)
  if a.sharding.is_fully_replicated:
    return np.asarray(a.addressable_data(0))
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return np.asarray(multihost_utils.process_allgather(a, tiled=True))


class _Run:
  """The host-side reducer: int64 sums, OR-ed flags, summed reliability counts, per-example
  arrays, position, data hash."""

  def __init__(self, num_attacks: int, num_eps: int, names: tuple[str, ...],
               min_norm: tuple[str, ...], keep: bool):
    self.names = names
    self.min_norm = min_norm
    self.keep = keep
    self.position = 0  # batches done
    self.seen = 0  # examples seen by this process (for default global indices)
    self.n = 0
    self.clean_correct = 0
    self.robust = np.zeros((num_attacks, num_eps), np.int64)
    self.worst = np.zeros((num_eps,), np.int64)
    self.flags: dict[str, dict[str, bool]] = {n: {} for n in names}
    self.counts: dict[str, dict[str, np.ndarray]] = {n: {} for n in names}
    self.per_example: dict[str, np.ndarray] = {}
    if keep:
      self.per_example = {
          "index": np.zeros((0,), np.int64), "correct": np.zeros((0,), bool),
          "robust": np.zeros((0, num_attacks, num_eps), bool),
          "worst_case": np.zeros((0, num_eps), bool),
          "eps_star": np.zeros((0, len(min_norm)), np.float32)}

  def add(self, totals: Totals, flags: tuple, counts: tuple, per: PerExample | None) -> None:
    self.n += int(totals.n)
    self.clean_correct += int(totals.clean_correct)
    self.robust += np.asarray(totals.robust, np.int64)
    self.worst += np.asarray(totals.worst_case, np.int64)
    for name, attack_flags in zip(self.names, flags):
      for k, v in attack_flags.items():
        self.flags[name][k] = bool(self.flags[name].get(k, False) or bool(v))
    for name, attack_counts in zip(self.names, counts):
      for k, v in attack_counts.items():
        v = np.asarray(v, np.int64)
        self.counts[name][k] = self.counts[name][k] + v if k in self.counts[name] else v
    if self.keep and per is not None:
      keep = np.asarray(per.mask, bool)
      fields = {"index": np.asarray(per.index).astype(np.int64), "correct": per.correct,
                "robust": per.robust, "worst_case": per.worst_case, "eps_star": per.eps_star}
      for k, v in fields.items():
        self.per_example[k] = np.concatenate([self.per_example[k], np.asarray(v)[keep]])

  def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    header = {"position": self.position, "seen": self.seen, "n": self.n,
              "clean_correct": self.clean_correct,
              "flags": {n: dict(f) for n, f in self.flags.items()},
              "counts": {n: {k: v.tolist() for k, v in c.items()}
                         for n, c in self.counts.items()}}
    arrays = {"robust": self.robust.copy(), "worst": self.worst.copy()}
    arrays.update({f"per_example.{k}": v for k, v in self.per_example.items()})
    return header, arrays

  def restore(self, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    self.position, self.seen = int(header["position"]), int(header["seen"])
    self.n, self.clean_correct = int(header["n"]), int(header["clean_correct"])
    self.flags = {n: dict(header["flags"].get(n, {})) for n in self.names}
    self.counts = {n: {k: np.asarray(v, np.int64) for k, v in header["counts"].get(n, {}).items()}
                   for n in self.names}
    self.robust = arrays["robust"].astype(np.int64)
    self.worst = arrays["worst"].astype(np.int64)
    if self.keep:
      self.per_example = {k[len("per_example."):]: v for k, v in arrays.items()
                          if k.startswith("per_example.")}

  def report_per_example(self) -> dict[str, np.ndarray] | None:
    if not self.keep:
      return None
    pe = self.per_example
    out = {"index": pe["index"], "correct": pe["correct"],
           "robust": np.transpose(pe["robust"], (1, 2, 0)),
           "worst_case": np.transpose(pe["worst_case"], (1, 0))}
    for j, name in enumerate(self.min_norm):
      out[f"eps_star/{name}"] = pe["eps_star"][:, j]
    return out


def _agree_on_position(state: _Run, position: int, digest: str | None,
                       previous: Mapping[str, Any] | None, arrays: Mapping[str, np.ndarray],
                       path: str) -> tuple[int, str | None]:
  """Multi-process resume: every process restarts from the smallest position any reached.

  Processes write their checkpoints independently, so a kill can leave one process a batch ahead
  (no process can get further: the next batch's sums need every process). The one ahead rolls back
  to the state it kept one batch back.
  """
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

  positions = np.asarray(multihost_utils.process_allgather(np.asarray([position], np.int64)))
  target, top = int(positions.min()), int(positions.max())
  if top - target > 1:
    raise ValueError(f"The processes' checkpoints are {top - target} batches apart (positions "
                     f"{positions.ravel().tolist()}); at most one is possible. Delete them all.")
  if position == target:
    return position, digest
  if previous is None:
    raise ValueError(f"Checkpoint {path} is one batch ahead of another process's and keeps no "
                     "earlier state. Delete the checkpoints of all processes.")
  state.restore(previous["state"], {k[len("previous."):]: v for k, v in arrays.items()
                                    if k.startswith("previous.")})
  return state.position, previous["data_sha256"]


def _check_same_model(path: str, stored: Mapping[str, str] | None,
                      current: Mapping[str, str]) -> None:
  """Refuses to resume a checkpoint written for another model (other weights or program)."""
  if stored is None or dict(stored) == dict(current):
    return
  what = []
  if stored.get("arrays") != current.get("arrays"):
    what.append("its weights (the arrays the model reads, as arguments or captured constants) "
                "differ")
  if stored.get("program") != current.get("program"):
    what.append("its traced program differs (another architecture, a changed Python constant "
                "in the model, or another JAX version)")
  raise ValueError(f"Checkpoint {path} was written for a different model: {'; '.join(what)}. "
                   "Resuming would mix two models' results. Delete it or pass another "
                   "checkpoint path.")


def _hash_batch(hasher: Any, x: np.ndarray, y: np.ndarray, index: np.ndarray | None) -> None:
  hasher.update(f"{x.shape}|{x.dtype}|{y.dtype}|{index is not None}".encode())
  hasher.update(np.ascontiguousarray(x).tobytes())
  hasher.update(np.ascontiguousarray(y).tobytes())
  if index is not None:
    hasher.update(np.ascontiguousarray(index).tobytes())


# ------------------------------------------------------------------------------------------------
# The driver.

_STEP_CACHE: dict[Any, tuple[Callable[..., Any], tuple]] = {}
_STEP_CACHE_SIZE = 8


def _jitted_step(model: _Model, trace: _Trace, attacks, key_impl, keep_per_example,
                 eps_batch_size, unroll, chunk_size, mesh, axis, use_shard_map):
  """The ``jax.jit``-ed step, reused only where it computes what a fresh one would.

  A compiled step depends on its arguments (data, eps, key and the model's arrays in
  ``model.arrays``) and on what was baked in when it was traced: the program (``trace.program``)
  and the arrays the model captured (``trace.constants``). It is reused only when the model's
  identity, program and captured arrays are the same (a ``jax.Array`` cannot change in place), so
  a model whose weights were replaced (a rebound global, a new attribute value, a new ``partial``
  over a closure) gets a new step, while new parameters passed as arguments reuse it. Cached
  steps of the same model with other captured arrays are dropped (they can only be stale).
  """
  base = (model.identity, trace.program, tuple(attacks.items()), str(key_impl), keep_per_example,
          eps_batch_size, unroll, chunk_size, mesh, axis, use_shard_map)
  cache_key = (base, tuple(_constant_key(c) for c in trace.constants))
  try:
    cached = _STEP_CACHE.get(cache_key)
  except TypeError:  # something unhashable: build without caching
    cache_key, cached = None, None
  if cached is not None:
    return cached[0]
  step_fn = _build_step(model.rebuild, attacks, key_impl=key_impl,
                        keep_per_example=keep_per_example, eps_batch_size=eps_batch_size,
                        unroll=unroll, chunk_size=chunk_size,
                        axis_name=axis if use_shard_map else None)
  if use_shard_map:  # data parallel: the model's arrays are replicated on every device
    batch_spec = P(axis)
    step_fn = jax.shard_map(
        step_fn, mesh=mesh, in_specs=(P(),) + (batch_spec,) * 4 + (P(),) * 4,
        out_specs=(P(), P(), P(), batch_spec if keep_per_example else None), check_vma=False)
  step_fn = jax.jit(step_fn)
  if cache_key is not None:
    for stale in [k for k in _STEP_CACHE if k[0] == base]:
      del _STEP_CACHE[stale]
    while len(_STEP_CACHE) >= _STEP_CACHE_SIZE:
      _STEP_CACHE.pop(next(iter(_STEP_CACHE)))
    # The captured arrays stay referenced with the step: their ids in the key stay theirs.
    _STEP_CACHE[cache_key] = (step_fn, trace.constants)
  return step_fn


def evaluate(logits_fn: Callable[[Array], Array], data: Any, *,
             attacks: Attack | Mapping[str, Attack], epsilons: Any, key: Array,
             batch_size: int, mesh: jax.sharding.Mesh | None = None,
             checkpoint: os.PathLike | str | None = None, progress: bool = True,
             lower: float = 0.0, upper: float = 1.0, batch_axis: str | None = None,
             use_shard_map: bool = False, keep_per_example: bool = False,
             eps_batch_size: int | None = None, unroll: int | bool = 1,
             chunk_size: int | None = None, allow_large_eps: bool = False) -> Report:
  r"""Evaluates ``logits_fn`` against ``attacks`` over a whole data set, batch by batch.

  For each batch and attack this computes the robustness curve of
  :func:`jaxrobust.robustness_curve` (the per-example worst case over the eps grid; a
  minimum-norm attack runs once and gives :math:`\epsilon^*`), the per-example worst case over
  the attacks, and exact integer sums of both; the report is their ratio to the number of
  examples (see :mod:`jaxrobust.report`). Example ``i`` of the data stream (global index
  :math:`g_i`) draws its randomness from ``fold_in(key, g_i)``, so the report does not depend on
  ``batch_size``, the device count or an interruption.

  One step function is built and ``jax.jit``-ed once per call and reused for every batch: eps,
  keys and data are arguments, never constants, and the last short batch is padded with copies
  of a valid example and masked, so nothing retraces. Inputs are validated on the host (dtype,
  shape, box, labels) before they are sent to the devices.

  **The model, as it is at call time.** Every call evaluates the model as it is when the call
  starts, whatever changed since an earlier call (a training loop evaluating each epoch). The
  forward pass is traced once per call (cheap; the step is not) to see what the model reads:

  * ``functools.partial(model.apply, params)`` (or ``jax.tree_util.Partial``) and
    ``flax.nnx.Module`` (its state, through ``nnx.split``/``nnx.merge``): the arrays become
    arguments of the compiled step, so they keep the sharding they already have (replicated or
    model-sharded), are not copied into the program as constants, and new parameters of the same
    shapes reuse the compiled step (no recompilation across epochs);
  * any other callable (a closure, a function reading a global, an object with array
    attributes): the arrays it reads are compiled into the step as constants. The compiled step
    is reused only while they are the very same arrays (a ``jax.Array`` cannot change in place)
    and the traced program is the same (a changed Python constant or architecture changes it);
    after a weight change the step is compiled again. Pass a ``partial`` or an ``nnx.Module`` to
    avoid that recompilation.

  Not seen by the trace, so not allowed to change between calls that reuse a step: state read
  only inside custom derivative rules (``jax.custom_vjp`` backward functions) or host callbacks,
  and Python branches taken only at batch shapes other than ``batch_size`` (e.g. chunks).

  **Sharding.** With ``mesh``, each batch is placed with ``NamedSharding(mesh, P(batch_axis))``
  (default: the mesh's first axis; ``batch_size`` must be a multiple of its size); eps and key are
  replicated. Explicit and Auto axis types both work. The attack loops need no communication;
  the sums are global. ``use_shard_map=True`` runs the same step per device under
  :func:`jax.shard_map` and reduces with :func:`jaxrobust.metrics.psum` instead (the model is
  then replicated on every device); the report is the same.

  **Multi-host.** Call ``jax.distributed.initialize()`` first, build a mesh over
  ``jax.devices()`` (all processes), and give each process its own shard of the data, in batches
  of ``batch_size // jax.process_count()``; every process must see the same number of batches.
  Global batch ``b`` is the concatenation of the processes' ``b``-th local batches in process
  order, so a local row ``i`` of process ``p`` gets the global index
  ``b * batch_size + p * (batch_size // P) + i`` (pass explicit indices as a third batch element
  ``(x, y, index)`` for any other layout). Each process writes its own checkpoint,
  ``<checkpoint>.process<p>of<P>``; every process gets the whole report.

  **Checkpoints.** With ``checkpoint``, the reducer state, the position and a running SHA-256 of
  the data seen are written atomically after every batch (a uniquely named temporary file,
  ``fsync``, :func:`os.replace`; concurrent writers never share a temporary file). If the file
  exists, the run resumes: it reads (and hashes, but does not evaluate) the batches already done,
  then continues; the final report equals an uninterrupted run's bitwise. A checkpoint written
  for other attacks, eps, key, batch size, box or data is refused with a ``ValueError``, and so is
  one written for another model: the checkpoint holds the SHA-256 of the model's traced forward
  program and of the values of every array it reads (the parameters of a ``partial`` or an
  ``nnx.Module``, the arrays a closure captures), so other weights or another architecture are
  refused (so is the same model after a JAX upgrade that changes its traced program). Delete the
  file to start over. In a multi-process run each process keeps its state one batch back too, and
  a resumed run restarts every process from the smallest position reached.

  **Reliability flags.** Each attack's ``AttackResult.info`` flags (e.g. non-finite gradients,
  AutoAttack's checks) are OR-ed over batches and eps, and the counts behind them summed over the
  data set (``Report.attacks[name].counts``, one per eps); a flag defined by a fraction of the
  data (AutoAttack's ``square_beats_white_box``) is decided from the global count and ``N`` (see
  :func:`jaxrobust.report.decide_flags`), so the report is the same for any batch size.

  Args:
    logits_fn: ``x [B, ...] -> logits [B, C]``, treating examples independently.
    data: ``(x, y)`` (or ``(x, y, index)``) arrays, split into batches here; or any iterable of
      such NumPy batches of at most ``batch_size`` examples (per process), e.g. a generator over
      a data set that does not fit in memory. ``index`` holds int global example indices.
    attacks: one untargeted :class:`jaxrobust.Attack`, or a mapping name -> attack (one norm).
    epsilons: ``[K]`` budgets (eps is data: a new grid never recompiles an attack).
    key: a PRNG key (``jax.random.key`` or raw ``uint32[2]``).
    batch_size: the global batch size (all processes together).
    mesh: an optional :class:`jax.sharding.Mesh` to shard batches over.
    checkpoint: optional path of a checkpoint file to write after every batch and resume from.
    progress: show a ``tqdm`` bar with examples/s and the running clean and worst-case robust
      accuracy (at the largest eps); process 0 only.
    lower, upper: the box.
    batch_axis: the mesh axis to shard the batch over (default: the first).
    use_shard_map: run the step per device under ``jax.shard_map`` (requires ``mesh``).
    keep_per_example: keep per-example arrays in the report (``Report.per_example``).
    eps_batch_size: how fixed-budget attacks loop over eps (see :func:`robustness_curve`).
    unroll: attack-loop unrolling (see :func:`jaxrobust.run`).
    chunk_size: compact the points an attack still has to attack (see :func:`jaxrobust.run`);
      with a ``mesh`` this selects the ``shard_map`` path, so the compaction stays per device.
    allow_large_eps: accept budgets that cover the whole box.

  Returns:
    A :class:`jaxrobust.Report`.

  Raises:
    ValueError: bad configuration or data, or a checkpoint that does not match this run.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import jaxrobust as jr
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x = np.array([[0.6, 0.4], [0.9, 0.1], [0.3, 0.7]], np.float32)  # Linf 0.1, 0.4, 0.2
    >>> y = np.array([0, 0, 1])
    >>> report = jr.evaluate(logits_fn, (x, y), attacks={"pgd": jr.attacks.pgd(steps=5)},
    ...                      epsilons=[0.05, 0.15, 0.3], key=jax.random.key(0), batch_size=2,
    ...                      progress=False)
    >>> report.clean_accuracy, report.attacks["pgd"].robust_accuracy.tolist()
    (1.0, [1.0, 0.6666666865348816, 0.3333333432674408])

  References:
    Carlini et al., "On Evaluating Adversarial Robustness", arXiv:1902.06705, 2019 (per-example
    worst case over attacks).
  """
  start_time = time.perf_counter()
  attacks = _as_attacks(attacks)
  names = tuple(attacks)
  min_norm = tuple(n for n in names if attacks[n].minimum_norm)
  epsilons = np.asarray(epsilons, np.float32)
  if epsilons.ndim != 1 or epsilons.shape[0] == 0:
    raise ValueError(f"epsilons must be a non-empty 1-D array [K], got shape {epsilons.shape}.")
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
    raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
  if eps_batch_size is not None and (not isinstance(eps_batch_size, int) or eps_batch_size < 0):
    raise ValueError(f"eps_batch_size must be None, 0 or a positive int, got {eps_batch_size!r}.")
  check_bounds(lower, upper)
  lower, upper = float(lower), float(upper)

  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.dtype != jnp.uint32 or key.ndim != 1:
      raise ValueError(f"key must be one jax.random.key (or raw uint32[2]), got dtype {key.dtype},"
                       f" shape {key.shape}.")
    key = jax.random.wrap_key_data(key)
  if key.shape != ():
    raise ValueError(f"key must be a single PRNG key, got shape {key.shape}; per-example keys "
                     "derive from it and the global example index.")
  key_impl = jax.random.key_impl(key)
  key_data = np.asarray(jax.random.key_data(key))

  num_processes, process_index = jax.process_count(), jax.process_index()
  if batch_size % num_processes:
    raise ValueError(f"batch_size {batch_size} must be a multiple of the process count "
                     f"{num_processes}.")
  local_batch = batch_size // num_processes
  axis = None
  if mesh is not None:
    axis = batch_axis if batch_axis is not None else mesh.axis_names[0]
    if axis not in mesh.axis_names:
      raise ValueError(f"batch_axis {axis!r} is not an axis of the mesh {mesh.axis_names}.")
    if batch_size % mesh.shape[axis]:
      raise ValueError(f"batch_size {batch_size} must be a multiple of the mesh axis {axis!r} of "
                       f"size {mesh.shape[axis]}.")
    if chunk_size is not None and not use_shard_map:
      # Compaction moves rows within the batch: run it per device, where it stays local (under
      # jit, Explicit axes cannot close over the mesh-placed parameters inside the compaction's
      # own shard_map, and Auto axes would move rows between devices).
      use_shard_map = True
  elif use_shard_map:
    raise ValueError("use_shard_map=True needs a mesh=.")
  elif num_processes > 1:
    raise ValueError("A multi-process run needs a mesh= over the devices of all processes.")

  fingerprint = _fingerprint(attacks, epsilons, key_data, key_impl, batch_size, lower, upper,
                             keep_per_example, eps_batch_size, unroll,
                             (process_index, num_processes))
  state = _Run(len(names), len(epsilons), names, min_norm, keep_per_example)
  ckpt_path = None
  resume_at, resume_hash, previous, stored_model = 0, None, None, None
  if checkpoint is not None:
    ckpt_path = os.fspath(checkpoint)
    if num_processes > 1:
      ckpt_path = f"{ckpt_path}.process{process_index}of{num_processes}"
    loaded = _checkpoint.load(ckpt_path)
    if loaded is not None:
      header, arrays = loaded
      if header.get("version") != _CHECKPOINT_VERSION:
        raise ValueError(f"Checkpoint {ckpt_path} has version {header.get('version')}, expected "
                         f"{_CHECKPOINT_VERSION}. Delete it to start over.")
      stored = header["fingerprint"]
      differ = sorted(k for k in set(stored) | set(fingerprint)
                      if stored.get(k) != fingerprint.get(k))
      if differ:
        raise ValueError(
            f"Checkpoint {ckpt_path} was written by a different evaluation: {', '.join(differ)} "
            f"differ(s) (checkpoint: {', '.join(f'{k}={stored.get(k)}' for k in differ)}; this "
            f"run: {', '.join(f'{k}={fingerprint.get(k)}' for k in differ)}). Delete it or pass "
            "another checkpoint path.")
      state.restore(header["state"], arrays)
      resume_at, resume_hash = state.position, header["data_sha256"]
      previous, stored_model = header.get("previous"), header["model"]
    if num_processes > 1:
      resume_at, resume_hash = _agree_on_position(state, resume_at, resume_hash, previous,
                                                  arrays if loaded else {}, ckpt_path)
    last_saved = (*state.state(), resume_hash)

  model = _split_model(logits_fn)  # the arrays as they are now, at call time
  step_fn, model_fingerprint = None, None

  def put(a: np.ndarray, batched: bool) -> Any:
    if mesh is None:
      return a
    sharding = NamedSharding(mesh, P(axis) if batched else P())
    if num_processes > 1:
      shape = ((batch_size,) + a.shape[1:]) if batched else a.shape
      return jax.make_array_from_process_local_data(sharding, a, shape)
    return jax.device_put(a, sharding)

  constants = None
  num_classes = None
  x_spec = None
  hasher = hashlib.sha256()
  batches, total = _batches(data, local_batch)
  bar = None
  if progress and process_index == 0:
    from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
    bar = tqdm(total=None if total is None else total * num_processes, unit="ex",
               desc="jr.evaluate", dynamic_ncols=True)
  compile_s, step_s, evaluated, first_n = 0.0, 0.0, 0, 0
  after_first = None
  first_step = True
  position = 0
  with contextlib.ExitStack() as stack:
    if mesh is not None:
      stack.enter_context(jax.set_mesh(mesh))
    if bar is not None:
      stack.callback(bar.close)
    for batch in batches:
      if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
        raise ValueError("Each batch must be a tuple (x, y) or (x, y, index), got "
                         f"{type(batch).__name__}" + (f" of length {len(batch)}."
                                                      if hasattr(batch, "__len__") else "."))
      x, y = np.asarray(batch[0]), np.asarray(batch[1])
      index = None if len(batch) == 2 else np.asarray(batch[2])
      del batch
      if x.dtype == np.float64:
        x = x.astype(np.float32)
      check_batch(x, y)
      b = x.shape[0]
      if b > local_batch:
        raise ValueError(f"A batch of {b} examples is larger than batch_size"
                         + (f" / process count = {local_batch}." if num_processes > 1
                            else f" = {batch_size}."))
      if index is not None and (index.shape != (b,) or not np.issubdtype(index.dtype, np.integer)
                                or (b and (index.min() < 0 or index.max() >= 2**32))):
        raise ValueError(f"index must be int [{b}] in [0, 2**32), got {index.dtype} "
                         f"{index.shape}.")
      if x_spec is None:
        x_spec = (x.shape[1:], x.dtype)
      elif (x.shape[1:], x.dtype) != x_spec:
        raise ValueError(f"Every batch must have examples of shape {x_spec[0]} and dtype "
                         f"{x_spec[1]}; got {x.shape[1:]} {x.dtype}.")
      if ckpt_path is not None:  # the data fingerprint is only needed to resume
        _hash_batch(hasher, x, y, index)
      if step_fn is None:  # the first batch: the model as it is now, at the step's shapes
        spec = jax.ShapeDtypeStruct((local_batch,) + x.shape[1:], x.dtype)
        samples = next(iter(attacks.values())).samples
        num_classes = check_logits(logits_shape(logits_fn, spec, samples), local_batch)
        batch_sharding = None if mesh is None else NamedSharding(mesh, P(axis))
        trace = _trace_model(
            model, jax.ShapeDtypeStruct((batch_size,) + x.shape[1:], x.dtype,
                                        sharding=batch_sharding),
            jax.ShapeDtypeStruct((batch_size,), key.dtype, sharding=batch_sharding)
            if samples else None)
        if ckpt_path is not None:
          model_fingerprint = _model_fingerprint(model, trace)
          _check_same_model(ckpt_path, stored_model, model_fingerprint)
        step_fn = _jitted_step(model, trace, attacks, key_impl, keep_per_example, eps_batch_size,
                               unroll, chunk_size, mesh, axis, use_shard_map)
        del trace
      if index is None:
        offset = (position * batch_size + process_index * local_batch if num_processes > 1
                  else state.seen if position >= resume_at else None)
      position += 1
      if position <= resume_at:  # done before the interruption: only advance and hash
        if position == resume_at and hasher.hexdigest() != resume_hash:
          raise ValueError(f"Checkpoint {ckpt_path} was written for different data: the first "
                           f"{resume_at} batches hash differently. Delete it or pass the same "
                           "data in the same order.")
        if bar is not None:
          bar.update(b * num_processes)
        continue

      if constants is None:
        for attack in attacks.values():
          check_eps(epsilons, None, attack.norm, lower=lower, upper=upper,
                    input_size=int(np.prod(x.shape[1:])), minimum_norm=attack.minimum_norm,
                    allow_large_eps=allow_large_eps, name="epsilons")
        constants = (put(epsilons, False), put(key_data, False),
                     put(np.float32(lower), False), put(np.float32(upper), False))
      check_x_in_box(x, lower, upper)
      check_labels("y", y, num_classes)
      y = y.astype(np.int32)
      if index is None:
        index = offset + np.arange(local_batch, dtype=np.int64)
      pad = local_batch - b
      mask = np.arange(local_batch) < b
      if pad:
        x = np.concatenate([x, np.repeat(x[:1], pad, axis=0)])
        y = np.concatenate([y, np.repeat(y[:1], pad)])
        if index.shape[0] < local_batch:
          index = np.concatenate([index, np.repeat(index[:1], pad)])
      index = index.astype(np.uint32)

      t0 = time.perf_counter()
      out = step_fn(model.arrays, put(x, True), put(y, True), put(mask, True), put(index, True),
                    *constants)
      del x, y, mask, index
      totals, flags, counts, per = jax.tree.map(_to_host, out)
      dt = time.perf_counter() - t0
      if first_step:
        compile_s, first_step, first_n = dt, False, int(totals.n)
        after_first = time.perf_counter()
      else:
        step_s += dt
      del out
      state.add(totals, flags, counts, per)
      state.position = position
      state.seen += b
      evaluated += int(totals.n)
      if ckpt_path is not None:
        s_header, s_arrays = state.state()
        header = {"version": _CHECKPOINT_VERSION, "fingerprint": fingerprint,
                  "model": model_fingerprint, "state": s_header,
                  "data_sha256": hasher.hexdigest(), "previous": None}
        arrays = dict(s_arrays)
        if num_processes > 1:  # the state one batch back, in case another process lags behind
          header["previous"] = {"state": last_saved[0], "data_sha256": last_saved[2]}
          arrays.update({f"previous.{k}": v for k, v in last_saved[1].items()})
          last_saved = (s_header, s_arrays, header["data_sha256"])
        _checkpoint.save(ckpt_path, header, arrays)
      if bar is not None:
        bar.update(int(totals.n))
        if state.n:
          bar.set_postfix(clean=f"{state.clean_correct / state.n:.4f}",
                          robust=f"{state.worst[np.argmax(epsilons)] / state.n:.4f}",
                          refresh=False)
  if position == 0:
    raise ValueError("data is empty: no batch to evaluate.")
  if position < resume_at:
    raise ValueError(f"Checkpoint {ckpt_path} records {resume_at} batches done but the data has "
                     f"only {position}. Pass the same data, or delete the checkpoint.")

  end = time.perf_counter()
  wall = end - start_time
  # Steady state: from the end of the first (compiling) step to the end of the run.
  running = max(end - after_first, 1e-12) if after_first is not None else 1e-12
  timing = {"wall_s": wall, "compile_and_first_step_s": compile_s, "step_s": step_s,
            "outside_step_fraction": (max(running - step_s, 0.0) / running
                                      if evaluated > first_n else math.nan),
            "examples_evaluated": evaluated,
            "examples_per_s": (evaluated - first_n) / running if evaluated > first_n
                              else math.nan}
  return Report.from_counts(
      epsilons=epsilons, n=state.n, clean_correct=state.clean_correct,
      robust={name: state.robust[a] for a, name in enumerate(names)},
      worst_case=state.worst,
      info={n: (a.name, a.norm, a.minimum_norm) for n, a in attacks.items()},
      flags=state.flags, counts=state.counts, per_example=state.report_per_example(),
      timing=timing)
