r"""The device side of :func:`jaxrobust.evaluate`: the per-batch step, the model taken apart,
and the cache of compiled steps.

For example :math:`i` (global index :math:`g_i`, key :math:`\mathrm{fold\_in}(key, g_i)`) the step
runs every attack through the curve kernel (:func:`jaxrobust.engine.curve_kernel.robust_flags`)
and returns an :class:`EvalSums`: one :class:`jaxrobust.metrics.CurveCounts` per attack, one for
the per-example worst case over attacks, and the attacks' reliability checks, all integer sums
over the unpadded rows (``mask``). Nothing but those sums (and, on request, per-example flags)
leaves the device.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxrobust._batch import fold_in, rows_like
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack
from jaxrobust.engine.curve_kernel import CurveFlags, robust_flags
from jaxrobust.engine.scoring import clean_diagnosis
from jaxrobust.metrics import CurveCounts, Reducer
from jaxrobust.model import Model, captured_constants

Array = jax.Array

CERTIFIER_STREAM = 1 << 30
"""Certifier ``c`` draws from ``fold_in(key_i, CERTIFIER_STREAM + c)``: never an attack's stream
(attacks fold in the eps index, far below it)."""


class _EvalSumsFields(NamedTuple):
  curves: tuple  # one jr.metrics.CurveCounts per attack, in the order of the attacks mapping
  worst_case: Any  # jr.metrics.CurveCounts of the per-example worst case over attacks
  raised: tuple  # per attack: flag name -> [] int32, 1 where raised (summed: batches raising it)
  counts: tuple  # per attack: count name -> int32 sums ([K] per eps, [] once, [K, M] members)
  certified: tuple = ()  # one jr.metrics.CurveCounts per certifier (correct = certified class)


class EvalSums(_EvalSumsFields, Reducer):
  """Everything :func:`jaxrobust.evaluate` accumulates: a reducer (``merge`` / ``psum`` /
  ``to_host``) whose fields are integer sums over examples, so any batching gives the same total.

  A flag is raised over the data set when its ``raised`` sum is positive; ``counts`` include the
  per-member breakdown of ensembles and suites as ``robust_after`` ``[K, M]`` (examples robust
  after members ``1..m`` at eps_k).
  """

  __slots__ = ()

  def flags(self) -> tuple[dict[str, bool], ...]:
    """Per attack: flag name -> raised on some batch."""
    return tuple({k: bool(np.asarray(v) > 0) for k, v in r.items()} for r in self.raised)


class PerExample(NamedTuple):
  """Per-example outputs of the step, batch axis first (so one ``P(batch)`` spec shards all)."""

  mask: Array  # [B] bool, False on padding
  index: Array  # [B] uint32 global index
  correct: Array  # [B] bool
  robust: Array  # [B, A, K] bool
  worst_case: Array  # [B, K] bool
  eps_star: Array  # [B, M] float32, minimal norms of the M minimum-norm attacks


def _attack_sums(flags: CurveFlags, correct: Array, mask: Array) -> tuple:
  """One attack's curve counts, raised flags and summed counts on the valid rows."""
  counts = {k: jnp.asarray(v).astype(jnp.int32) for k, v in flags.info["counts"].items()}
  if "robust_after" in flags.info:  # [K, M, B] -> [K, M] examples robust after members 1..m
    counts["robust_after"] = jnp.sum(flags.info["robust_after"] & mask[None, None, :], axis=-1,
                                     dtype=jnp.int32)
  raised = {k: jnp.asarray(v).astype(jnp.int32) for k, v in flags.info["flags"].items()}
  return CurveCounts.from_flags(flags.robust, correct, mask), raised, counts


def build_step(logits_fn: Callable[[Array], Array], attacks: Mapping[str, Attack], *,
               key_impl: Any = None, keep_per_example: bool = False,
               eps_batch_size: int | None = None, unroll: int | bool = 1,
               chunk_size: int | None = None, axis_name: str | None = None,
               certifiers: Mapping[str, Any] | None = None,
               early_exit: bool = False) -> Callable[..., tuple]:
  r"""The per-batch evaluation step (not jitted): every attack (and certifier) on one padded batch.

  ``step(x, y, mask, index, epsilons, key_data, lower, upper, max_propagations=None) ->
  (EvalSums, PerExample | None)`` with ``x [B, ...]``, ``y [B]`` int32, ``mask [B]`` bool,
  ``index [B]`` uint32 global indices, ``epsilons [K]`` float32, ``key_data`` the raw data of one
  PRNG key, scalar bounds, and an optional int ``[]`` cap on each run's forward plus backward
  propagations per example (:func:`jaxrobust.robustness_curve`'s, data). Example
  ``i`` draws its randomness from ``fold_in(key, index[i])`` (and, for a fixed-budget attack,
  ``fold_in(., k)`` at the ``k``-th eps, as :func:`jaxrobust.robustness_curve` does), so every
  attack sees the same keys whatever else is evaluated with it. The attacks run with the options
  ``eps_batch_size``, ``unroll``, ``chunk_size`` and ``early_exit``, explained once in
  :class:`jaxrobust._options.RunOptions` (early exit is off by default here). With
  ``axis_name`` (inside :func:`jax.shard_map`) the sums are reduced over that axis.

  Args:
    logits_fn: the model.
    attacks: name -> untargeted :class:`jaxrobust.Attack`.
    key_impl: the PRNG implementation of the key (``jax.random.key_impl``).
    keep_per_example: return a :class:`PerExample`; otherwise ``None``.
    eps_batch_size, unroll, chunk_size: see :class:`~jaxrobust._options.RunOptions`.
    axis_name: the mapped batch axis to reduce over, or ``None`` under plain ``jit``.
    certifiers: optional name -> :class:`jaxrobust.certify.Certifier`; certifier ``c`` draws from
      ``fold_in(key_i, CERTIFIER_STREAM + c)`` and its counts are ``EvalSums.certified[c]``.
    early_exit: see :class:`~jaxrobust._options.RunOptions`.

  Returns:
    The step function.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import jaxrobust as jr
    >>> from jaxrobust.evaluation import build_step
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> step = jax.jit(build_step(logits_fn, {"pgd": jr.attacks.pgd(steps=5)}))
    >>> x, y = jnp.array([[0.6, 0.4], [0.9, 0.1]]), jnp.array([0, 0])  # Linf distances 0.1, 0.4
    >>> sums, _ = step(
    ...     x, y, jnp.array([True, True]), jnp.arange(2, dtype=jnp.uint32), jnp.array([0.05, 0.2]),
    ...     jax.random.key_data(jax.random.key(0)), 0.0, 1.0)
    >>> int(sums.worst_case.correct), sums.curves[0].robust.tolist(), sums.worst_case.robust.tolist()
    (2, [2, 1], [2, 1])
  """
  options = RunOptions(early_exit=early_exit, chunk_size=chunk_size, unroll=unroll,
                       eps_batch_size=eps_batch_size)
  inner = _build_step(lambda _: logits_fn, attacks, key_impl=key_impl,
                      keep_per_example=keep_per_example, options=options, axis_name=axis_name,
                      certifiers=certifiers)
  return functools.partial(inner, ())


def _build_step(rebuild: Callable[[Any], Callable[[Array], Array]],
                attacks: Mapping[str, Attack], *, key_impl: Any, keep_per_example: bool,
                options: RunOptions, axis_name: str | None,
                certifiers: Mapping[str, Any] | None = None) -> Callable[..., tuple]:
  """:func:`build_step` whose step takes the model's arrays first: ``step(model_arrays, x, ...)``
  with ``logits_fn = rebuild(model_arrays)``."""
  items = tuple(attacks.values())
  certify = tuple((certifiers or {}).values())

  def step(model_arrays, x, y, mask, index, epsilons, key_data, lower, upper,
           max_propagations=None):
    logits_fn = rebuild(model_arrays)
    key = jax.random.wrap_key_data(key_data, impl=key_impl)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(index)
    y, mask, epsilons = y.astype(jnp.int32), mask.astype(bool), epsilons.astype(jnp.float32)
    # The clean verdict (for a randomized model, a majority vote) and the clean pass's checks
    # (scoring.clean_checks), once for every attack, on x as given (bfloat16 stays bfloat16). Padding is never
    # attacked (it costs nothing with chunk_size) and never counted.
    correct, findings = clean_diagnosis(max(a.samples for a in items), logits_fn, x, y, keys)
    results = [robust_flags(attack, logits_fn, x, y, epsilons, keys, lower=lower, upper=upper,
                            correct=correct, findings=findings, active=mask,
                            options=options, max_propagations=max_propagations)
               for attack in items]
    robust = jnp.stack([r.robust for r in results])  # [A, K, B]
    worst = jnp.all(robust, axis=0)  # [K, B]: robust under every attack
    curves, raised, counts = zip(*(_attack_sums(r, correct, mask) for r in results))
    certified = []
    for c, certifier in enumerate(certify):
      certified_correct, proven = certifier.certify(
          logits_fn, x, y, fold_in(keys, CERTIFIER_STREAM + c), epsilons, lower, upper)
      certified.append(CurveCounts.from_flags(proven, certified_correct, mask))
    sums = EvalSums(curves=curves, worst_case=CurveCounts.from_flags(worst, correct, mask),
                    raised=raised, counts=counts, certified=tuple(certified))
    if axis_name is not None:
      sums = sums.psum(axis_name)
    if not keep_per_example:
      return sums, None
    stars = [r.eps_star for r in results if r.eps_star is not None]
    stars = jnp.stack(stars, axis=1) if stars else rows_like(x, 0.0, jnp.float32)[:, None][:, :0]
    return sums, PerExample(mask=mask, index=index, correct=correct,
                            robust=jnp.moveaxis(robust, -1, 0), worst_case=jnp.moveaxis(worst, -1, 0),
                            eps_star=stars)

  return step


class _Trace(NamedTuple):
  """What tracing the model's forward pass at the step's batch shape shows of it."""

  program: str  # SHA-256 of the forward jaxpr's text (its structure and Python constants)
  constants: tuple  # every array the traced forward captured rather than took as an argument
  jaxpr: Any = None  # the closed forward jaxpr (params' leaves, x, keys): for jaxrobust.diagnosis


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _trace_model(model: Model, x: jax.ShapeDtypeStruct,
                 keys: jax.ShapeDtypeStruct | None) -> _Trace:
  """Traces ``logits_fn(x)`` (``logits_fn(x, keys)`` for a randomized model) once, at call time.

  A callable that closes over arrays (a closure, a global, an object's attribute, a function of
  a ``partial`` that does) has them compiled into the step as constants, with the values they
  have when the step is traced. The trace lists them, so that a compiled step is reused only
  while they are the very same (immutable) arrays, and the jaxpr's text catches changed Python
  constants and architectures.
  """
  def forward(arguments, *inputs):
    return model.with_arguments(arguments)(*inputs)  # the Model: its compute dtype's casts too

  closed = jax.make_jaxpr(forward)(model.arguments, x, *(() if keys is None else (keys,)))
  text = _ADDRESS.sub("", str(closed.jaxpr))  # function reprs may carry memory addresses
  return _Trace(program=hashlib.sha256(text.encode()).hexdigest(),
                constants=tuple(captured_constants(closed)), jaxpr=closed)


def hash_array(digest: Any, value: Any) -> None:
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


def _constant_key(value: Any) -> Any:
  """A key under which a captured constant can be recognised again: a ``jax.Array`` is immutable,
  so the object itself (its ``id``, while the cache keeps it alive) identifies its value; a NumPy
  array can be changed in place, so its bytes are hashed."""
  if isinstance(value, jax.Array):
    return ("array", id(value))
  digest = hashlib.sha256()
  hash_array(digest, value)
  return ("value", digest.hexdigest())


_STEP_CACHE: dict[Any, tuple[Callable[..., Any], tuple]] = {}
_STEP_CACHE_SIZE = 8


def _jitted_step(model: Model, trace: _Trace, attacks, key_impl, keep_per_example,
                 options: RunOptions, mesh, axis, use_shard_map, certifiers=None):
  """The ``jax.jit``-ed step, reused only where it computes what a fresh one would.

  A compiled step depends on its arguments (data, eps, key and the model's arrays in
  ``model.arguments``) and on what was baked in when it was traced: the program (``trace.program``)
  and the arrays the model captured (``trace.constants``). It is reused only when the model's
  identity, program and captured arrays are the same (a ``jax.Array`` cannot change in place), so
  a model whose weights were replaced (a rebound global, a new attribute value, a new ``partial``
  over a closure) gets a new step, while new parameters passed as arguments reuse it. Cached
  steps of the same model with other captured arrays are dropped (they can only be stale).
  """
  base = (model.identity, trace.program, tuple(attacks.items()), str(key_impl), keep_per_example,
          options, mesh, axis, use_shard_map, tuple((certifiers or {}).items()))
  cache_key = (base, tuple(_constant_key(c) for c in trace.constants))
  try:
    cached = _STEP_CACHE.get(cache_key)
  except TypeError:  # something unhashable: build without caching
    cache_key, cached = None, None
  if cached is not None:
    return cached[0]
  step_fn = _build_step(lambda arguments: model.with_arguments(arguments), attacks,
                        key_impl=key_impl, keep_per_example=keep_per_example, options=options,
                        axis_name=axis if use_shard_map else None, certifiers=certifiers)
  if use_shard_map:  # data parallel: the model's arrays are replicated on every device
    batch_spec = P(axis)
    step_fn = jax.shard_map(
        step_fn, mesh=mesh, in_specs=(P(),) + (batch_spec,) * 4 + (P(),) * 5,
        out_specs=(P(), batch_spec if keep_per_example else None), check_vma=False)
  step_fn = jax.jit(step_fn)
  if cache_key is not None:
    for stale in [k for k in _STEP_CACHE if k[0] == base]:
      del _STEP_CACHE[stale]
    while len(_STEP_CACHE) >= _STEP_CACHE_SIZE:
      _STEP_CACHE.pop(next(iter(_STEP_CACHE)))
    # The captured arrays stay referenced with the step: their ids in the key stay theirs.
    _STEP_CACHE[cache_key] = (step_fn, trace.constants)
  return step_fn
