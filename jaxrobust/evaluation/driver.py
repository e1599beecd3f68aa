"""The public loop of :func:`jaxrobust.evaluate` (see :mod:`jaxrobust.evaluation`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrobust._findings import Diagnosis, warn_if_masked
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack
from jaxrobust._validation import (BATCH_SIZE_FIX, check_bool, check_eps, check_labels,
                                   check_logits, check_x_in_box, logits_shape,
                                   refuse_fixed_batch, traces_at)
from jaxrobust.evaluation import host
from jaxrobust.evaluation.checkpointing import (Checkpoint, EvalState, fingerprint,
                                               model_fingerprint)
from jaxrobust.diagnosis import diagnose_traced
from jaxrobust.engine.propagations import check_cap
from jaxrobust.evaluation.device_step import _jitted_step, _trace_model
from jaxrobust.model import EVALUATE_REMEDY, model_of, warn_if_captured
from jaxrobust.report import Report, provenance

Array = jax.Array


def evaluate(logits_fn: Callable[[Array], Array], data: Any, *,
             attacks: Attack | Mapping[str, Attack], epsilons: Any, key: Array,
             batch_size: int, mesh: jax.sharding.Mesh | None = None,
             checkpoint: os.PathLike | str | None = None, progress: bool = True,
             lower: float = 0.0, upper: float = 1.0, batch_axis: str | None = None,
             use_shard_map: bool = False, keep_per_example: bool = False,
             eps_batch_size: int | None = None, unroll: int | bool = 1,
             chunk_size: int | None = None, allow_large_eps: bool = False,
             certifiers: Mapping[str, Any] | None = None, early_exit: bool = True,
             diagnose: bool = True, max_propagations: int | None = None) -> Report:
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

  The model is the one at call time, sharding, multi-host runs, checkpoints, reliability flags
  and the static gradient-masking diagnosis work as described in :mod:`jaxrobust.evaluation`.

  Args:
    logits_fn: ``x [B, ...] -> logits [B, C]``, treating examples independently.
    data: ``(x, y)`` (or ``(x, y, index)``) arrays, split into batches here; or any iterable of
      such NumPy batches of at most ``batch_size`` examples (per process), e.g. a generator over
      a data set that does not fit in memory. ``index``: int global indices, each used once.
    attacks: one untargeted :class:`jaxrobust.Attack`, or a mapping name -> attack (one norm).
    epsilons: ``[K]`` budgets (eps is data: a new grid never recompiles an attack).
    key: a PRNG key (``jax.random.key`` or raw ``uint32[2]``).
    batch_size: the global batch size (all processes together): an int, a NumPy one too.
    mesh: an optional :class:`jax.sharding.Mesh` to shard batches over; on a CPU, one over a device
      per core (``jax_num_cpu_devices``) puts every core to work (README, "A note on CPU speed").
    checkpoint: optional path of a checkpoint file to write after every batch and resume from
      (its folder is created if missing).
    progress: a progress bar (``tqdm`` if installed, else a text line): examples/s, the running
      clean and worst-case robust accuracy (largest eps), "compiling" first; process 0 only.
    lower, upper: the box.
    batch_axis: the mesh axis to shard the batch over (default: the first).
    use_shard_map: run the step per device under ``jax.shard_map`` (requires ``mesh``).
    keep_per_example: keep per-example arrays in the report (``Report.per_example``).
    eps_batch_size: how fixed-budget attacks loop over eps.
    unroll: attack-loop unrolling.
    chunk_size: rows per chunk of the compaction behind early exit and cross-eps skipping; with
      a ``mesh`` it selects the ``shard_map`` path, so the compaction stays per device.
    early_exit: stop attacking a point once broken and skip across eps (the report is the same,
      the model evaluations fewer); with a ``mesh`` it selects the ``shard_map`` path. These
      four options are explained in :class:`jaxrobust._options.RunOptions`; the report's
      provenance records them.
    allow_large_eps: accept budgets that cover the whole box.
    certifiers: optional name -> :class:`jaxrobust.certify.Certifier` (e.g.
      ``{"ibp": jr.certify.bounds_certifier()}``), run on every batch beside the attacks; their
      certified curves (lower bounds) are ``Report.certified``. A certifier's norm must be the
      attacks'. Certifier ``c`` draws its randomness from ``fold_in(fold_in(key, g_i), 2**30 + c)``.
      With a ``mesh`` they select the ``shard_map`` path (each device certifies its own rows).
    diagnose: keep :func:`jaxrobust.diagnose` of the model (of its trace, not run) in the
      report, ``Report.diagnosis``: errors warn and make it unreliable. ``False`` skips it.
    max_propagations: ``None`` (no cap) or an int: :func:`jaxrobust.robustness_curve`'s cap on
      every attack's forward plus backward propagations per example and per eps (per example
      for a minimum-norm attack's one run), as :func:`jaxrobust.run` applies it. It is data: a
      new value reuses the compiled step. The report's provenance and the checkpoint record it.

  Returns:
    A :class:`jaxrobust.Report`, every accuracy with its exact binomial interval, and its
    provenance (attacks' full configurations, threat model, key, versions, devices).

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
  _check_arguments(max_propagations, progress, diagnose, keep_per_example, allow_large_eps)
  options = RunOptions(early_exit=early_exit, chunk_size=chunk_size, unroll=unroll,
                       eps_batch_size=eps_batch_size)
  plan = host.plan_run(attacks, epsilons, key, batch_size, mesh, batch_axis, use_shard_map, lower,
                       upper, options)
  certifiers = _check_certifiers(certifiers, plan.attacks)
  if certifiers and plan.mesh is not None:  # bounds trace the model per example: keep it local
    plan = plan._replace(use_shard_map=True)
  state = EvalState(tuple(plan.attacks), plan.min_norm, keep_per_example)
  ckpt = None if checkpoint is None else Checkpoint(checkpoint, fingerprint(
      plan.attacks, plan.epsilons, plan.key_data, jax.random.key_impl(plan.key), plan.batch_size,
      plan.lower, plan.upper, keep_per_example, plan.options,
      (plan.process_index, plan.num_processes), certifiers, max_propagations), state)
  resume_at = 0 if ckpt is None else ckpt.resume_at
  model = model_of(logits_fn)  # the parameters as they are now, at call time
  stream, total = host.batches(data, plan.local_batch)
  bar = host.progress_bar(None if total is None else total * plan.num_processes,
                          progress and plan.process_index == 0)
  hasher, step_fn, x_spec, num_classes, constants, diagnosis = hashlib.sha256(), *[None] * 5
  clock = {"compile": 0.0, "step": 0.0, "evaluated": 0, "first_n": 0, "after_first": None}
  position, indices = 0, host.Indices(plan)
  with contextlib.ExitStack() as stack:
    if mesh is not None:
      stack.enter_context(jax.set_mesh(mesh))
    if bar is not None:
      stack.callback(bar.close)
    for batch in stream:
      x, y, index = _read_batch(batch, plan, x_spec, position + 1, indices)
      del batch
      x_spec = (x.shape[1:], x.dtype)
      if ckpt is not None:  # the data fingerprint is only needed to resume
        host.hash_batch(hasher, x, y, index)
      if step_fn is None:  # first batch: budgets checked, then the model compiled as it is now
        _show_compiling(bar)
        constants = _constants(plan, x, allow_large_eps, max_propagations)
        step_fn, num_classes, diagnosis = _compile(model, logits_fn, plan, x, keep_per_example,
                                                   ckpt, certifiers, diagnose)
      position += 1
      if position <= resume_at:  # done before the interruption: only advance and hash
        ckpt.check_data(position, hasher.hexdigest())
        if bar is not None:
          bar.update(x.shape[0] * plan.num_processes)
        continue
      _check_batch(x, y, plan, num_classes, position)
      if index is None:
        index = host.default_index(plan, position - 1, state.seen)
      padded = host.pad_batch(x, y, index, plan.local_batch)
      del x, y, index
      n = _evaluate_batch(step_fn, model, plan, padded, constants, state, clock)
      state.position, state.seen = position, state.seen + padded.size
      if ckpt is not None:
        ckpt.save(state, hasher.hexdigest())
      _show(bar, n, state, plan)
  _check_batches_seen(position, resume_at, ckpt)
  timing = host.timing(start_time, time.perf_counter(), clock["after_first"], clock["compile"],
                       clock["step"], clock["evaluated"], clock["first_n"])
  run = _run_provenance(plan, keep_per_example, use_shard_map, mesh, max_propagations)
  return _report(plan, state, timing, run, certifiers, diagnosis)


@contextlib.contextmanager
def _in_batch(number: int):
  """A ``ValueError`` or ``TypeError`` about one batch's data names the batch (counting from 1,
  in the data's order; the same type, the original chained); the batches before it stay in the
  checkpoint."""
  try:
    yield
  except (TypeError, ValueError) as error:
    kind = TypeError if isinstance(error, TypeError) else ValueError
    raise kind(f"batch {number} of the data (counting from 1): {error}") from error


def _read_batch(batch: Any, plan: host.Plan, x_spec: Any, number: int,
                indices: host.Indices) -> tuple:
  """:func:`host.read_batch`, its global indices recorded in ``indices`` (an index given twice is
  refused), its errors naming batch ``number``."""
  with _in_batch(number):
    x, y, index = host.read_batch(batch, plan, x_spec)
    indices.add(index, x.shape[0])
    return x, y, index


def _check_batch(x: np.ndarray, y: np.ndarray, plan: host.Plan, num_classes: int,
                 number: int) -> None:
  """The values of batch ``number``: inside the box, labels in range (errors name the batch)."""
  with _in_batch(number):
    check_x_in_box(x, plan.lower, plan.upper)
    check_labels("y", y, num_classes)


def _check_batches_seen(position: int, resume_at: int, ckpt: Checkpoint | None) -> None:
  """The data held at least one batch, and at least the batches the checkpoint records."""
  if position == 0:
    raise ValueError("data is empty: no batch to evaluate.")
  if position < resume_at:
    raise ValueError(f"Checkpoint {ckpt.path} records {resume_at} batches done but the data has "
                     f"only {position}. Pass the same data, or delete the checkpoint.")


def _run_provenance(plan, keep_per_example: bool, use_shard_map: Any, mesh: Any,
                    max_propagations: int | None) -> dict[str, Any]:
  """How the run was configured, as the report's provenance records it."""
  return {"batch_size": plan.batch_size, "keep_per_example": keep_per_example,
          **plan.options.provenance(), "use_shard_map": use_shard_map,
          "devices": 1 if mesh is None else int(mesh.size), "processes": plan.num_processes,
          **({} if max_propagations is None else {"max_propagations": int(max_propagations)})}


def _check_certifiers(certifiers: Mapping[str, Any] | None,
                      attacks: Mapping[str, Attack]) -> dict[str, Any]:
  """The certifiers as a dict, each with the attacks' norm."""
  if certifiers is None:
    return {}
  if not isinstance(certifiers, Mapping):
    raise ValueError("certifiers must be a mapping name -> jr.certify.Certifier, e.g. "
                     "{'ibp': jr.certify.bounds_certifier()}.")
  norms = {a.norm for a in attacks.values()}
  if certifiers and any(a.samples for a in attacks.values()):
    raise ValueError("certifiers need the deterministic model logits_fn(x), but these attacks "
                     "attack a randomized logits_fn(x, keys) (eot): certify the base model "
                     "separately (e.g. jr.certify.smoothing) and add the curve with "
                     "Report.with_certified(..., allow_above_empirical=True).")
  for name, certifier in certifiers.items():
    if not all(hasattr(certifier, f) for f in ("certify", "norm", "name")):
      raise ValueError(f"certifiers[{name!r}] is not a jr.certify.Certifier (build one with "
                       "jr.certify.bounds_certifier or jr.certify.smoothing_certifier).")
    if {certifier.norm} != norms:
      raise ValueError(f"certifiers[{name!r}] certifies {certifier.norm} radii but the attacks "
                       f"use {sorted(norms)}: a certified curve brackets an empirical one only "
                       "in the same norm.")
  return dict(certifiers)


def _compile(model, logits_fn, plan: host.Plan, x: np.ndarray, keep_per_example: bool,
             ckpt: Checkpoint | None, certifiers: Mapping[str, Any],
             diagnose: bool) -> tuple[Callable[..., Any], int, Diagnosis | None]:
  """The compiled step for the model as it is now (traced at the step's batch shape), the
  number of classes and the model's diagnosis (``None`` without ``diagnose``); records and checks
  the model's fingerprint in the checkpoint."""
  spec = jax.ShapeDtypeStruct((plan.local_batch,) + x.shape[1:], x.dtype)
  samples = next(iter(plan.attacks.values())).samples
  num_classes = check_logits(_first_trace(logits_fn, spec, samples, plan, len(x)),
                             plan.local_batch)
  sharding = None if plan.mesh is None else NamedSharding(plan.mesh, P(plan.axis))
  trace = _trace_model(
      model, jax.ShapeDtypeStruct((plan.batch_size,) + x.shape[1:], x.dtype, sharding=sharding),
      jax.ShapeDtypeStruct((plan.batch_size,), plan.key.dtype, sharding=sharding)
      if samples else None)
  # A model that reads arrays it does not show (a closure, a global) has them compiled into the
  # step; a partial or an NNX module passes them as arguments (jaxrobust.model).
  warn_if_captured(trace.constants, where="jr.evaluate", stacklevel=4,
                   remedy=EVALUATE_REMEDY)
  diagnosis = _diagnose(trace.jaxpr, 2 if samples else 1) if diagnose else None
  if ckpt is not None:
    # The model as a no-mesh run traces it, so a checkpoint resumes on any mesh or none (a
    # sharded trace's text carries the mesh); earlier versions recorded the sharded one.
    unsharded = trace if sharding is None else _trace_model(
        model, jax.ShapeDtypeStruct((plan.batch_size,) + x.shape[1:], x.dtype),
        jax.ShapeDtypeStruct((plan.batch_size,), plan.key.dtype) if samples else None)
    ckpt.check_model(model_fingerprint(model, unsharded), sharded_program=trace.program)
  return _jitted_step(model, trace, plan.attacks, jax.random.key_impl(plan.key), keep_per_example,
                      plan.options, plan.mesh, plan.axis, plan.use_shard_map,
                      certifiers), num_classes, diagnosis


def _first_trace(logits_fn, spec: jax.ShapeDtypeStruct, samples: int, plan: host.Plan,
                 rows: int) -> tuple:
  """The shape of the logits at the step's batch (``spec``). A model that fails there but works
  at another batch size (the first batch's ``rows``, or 1) is refused with a ``ValueError``
  saying so (the original chained); another failure keeps its type and gets a note naming the
  batch it was traced at."""
  try:
    return logits_shape(logits_fn, spec, samples)
  except Exception as error:
    batch = spec.shape[0]
    where = (f"a batch of {batch} examples (batch_size={plan.batch_size}"
             + (f" over {plan.num_processes} processes)" if plan.num_processes > 1 else ")"))
    others = [b for b in dict.fromkeys((rows, 1)) if b != batch]
    works = traces_at(logits_fn, spec, samples, others)
    if works is not None:
      raise ValueError(f"logits_fn fails on {where} but works on a batch of {works}: "
                       f"{BATCH_SIZE_FIX} The error at {batch}: {error}") from error
    error.add_note(f"jaxrobust: jr.evaluate traced logits_fn on x of shape {tuple(spec.shape)} "
                   f"({spec.dtype}), {where}; it failed at every batch size tried. If it was "
                   f"written for one batch size: {BATCH_SIZE_FIX}")
    raise


def _diagnose(forward: Any, num_inputs: int) -> Diagnosis | None:
  """The static gradient-masking diagnosis of the model as evaluated, from its traced forward
  program (``num_inputs``: 1 for ``logits_fn(x)``, 2 for a randomized ``logits_fn(x, keys)``);
  warns the caller of :func:`jaxrobust.evaluate` when it has errors. A failure of the diagnosis
  itself is a warning and no diagnosis, never a failed evaluation."""
  try:
    diagnosis = diagnose_traced(forward, num_inputs)
  except Exception as error:  # noqa: BLE001 (an analysis beside the run must not stop it)
    warnings.warn(f"jr.evaluate: the static gradient-masking diagnosis failed ({error!r:.200}); "
                  "the report has none. Pass diagnose=False to skip it.", RuntimeWarning,
                  stacklevel=4)
    return None
  warn_if_masked(diagnosis, where="jr.evaluate", stacklevel=4)
  return diagnosis


def _check_arguments(max_propagations: Any, progress: Any, diagnose: Any, keep_per_example: Any,
                     allow_large_eps: Any) -> None:
  """A ``ValueError`` for a cap other than ``None`` or a non-negative int, and for switches that
  are not bools (a string such as ``"no"`` is truthy: it is refused, not guessed at)."""
  for name, value in (("progress", progress), ("diagnose", diagnose),
                      ("keep_per_example", keep_per_example), ("allow_large_eps", allow_large_eps)):
    check_bool(name, value)
  check_cap(max_propagations)
  if max_propagations is not None and np.ndim(max_propagations) != 0:
    raise ValueError("jr.evaluate's max_propagations is one int for every example, got shape "
                     f"{np.shape(max_propagations)}.")


def _constants(plan: host.Plan, x: np.ndarray, allow_large_eps: bool,
               max_propagations: int | None = None) -> tuple:
  """The eps grid (checked against each attack's norm and the input size), key, box and cap
  (``None``: none), placed once on the devices."""
  for attack in plan.attacks.values():
    check_eps(plan.epsilons, None, attack.norm, lower=plan.lower, upper=plan.upper,
              input_size=int(np.prod(x.shape[1:])), minimum_norm=attack.minimum_norm,
              allow_large_eps=allow_large_eps, name="epsilons")
  placed = tuple(host.put(plan, a, False) for a in (
      plan.epsilons, plan.key_data, np.float32(plan.lower), np.float32(plan.upper)))
  cap = None if max_propagations is None else host.put(plan, np.int32(max_propagations), False)
  return placed + (cap,)


def _evaluate_batch(step_fn, model, plan: host.Plan, batch: host.HostBatch, constants: tuple,
                    state: EvalState, clock: dict) -> int:
  """Runs the compiled step on one padded batch, merges its sums into ``state`` and returns the
  number of examples it evaluated (over all processes)."""
  t0 = time.perf_counter()
  try:
    out = step_fn(model.arguments, *(host.put(plan, a, True) for a in batch[:4]), *constants)
  except Exception as error:
    if clock["after_first"] is None:  # tracing the step: the model at other batch sizes
      _refuse_fixed_batch(model, plan, batch.x, error)
    raise
  sums, per = jax.tree.map(host.to_host, out)
  dt = time.perf_counter() - t0
  n = int(sums.worst_case.n)
  if clock["after_first"] is None:
    clock.update(compile=dt, first_n=n, after_first=time.perf_counter())
  else:
    clock["step"] += dt
  clock["evaluated"] += n
  state.add(sums, per)
  return n


def _refuse_fixed_batch(model, plan: host.Plan, x: np.ndarray, error: Exception) -> None:
  """After the step failed to compile: a ``ValueError`` (``error`` chained) if the model, which
  traced at the step's batch size, fails at another one; otherwise nothing (``error`` stands)."""
  samples = next(iter(plan.attacks.values())).samples
  spec = jax.ShapeDtypeStruct((plan.local_batch,) + x.shape[1:], x.dtype)
  refuse_fixed_batch(model, spec, samples, error, f"a batch of {plan.local_batch} examples "
                     f"(batch_size={plan.batch_size})")


def _show_compiling(bar) -> None:
  """Says on the bar that the first batch compiles the program (seconds to minutes at 0)."""
  if bar is not None:
    bar.set_postfix(status="compiling the evaluation program", refresh=True)


def _show(bar, n: int, state: EvalState, plan: host.Plan) -> None:
  """Advances the progress bar by ``n`` examples, with the running clean and worst-case robust
  accuracy (at the largest eps)."""
  if bar is None:
    return
  worst = state.sums.worst_case
  if worst.n:
    bar.set_postfix(clean=f"{worst.correct / worst.n:.4f}",
                    robust=f"{worst.robust[np.argmax(plan.epsilons)] / worst.n:.4f}",
                    refresh=False)
  bar.update(n)


def _report(plan: host.Plan, state: EvalState, timing: Mapping[str, float],
            run: Mapping[str, Any], certifiers: Mapping[str, Any],
            diagnosis: Diagnosis | None) -> Report:
  sums = state.sums
  names = tuple(plan.attacks)
  certifier_configs = {name: {"description": c.name, "norm": c.norm,
                              "config": None if c.config is None else json.loads(c.config)}
                       for name, c in certifiers.items()}
  described = provenance(plan.attacks, epsilons=plan.epsilons, lower=plan.lower,
                         upper=plan.upper, key_data=plan.key_data,
                         key_impl=jax.random.key_impl(plan.key), evaluate=dict(run),
                         **({"certifiers": certifier_configs} if certifiers else {}),
                         **({} if diagnosis is None else {"diagnosis": diagnosis.to_record()}))
  return Report.from_counts(
      epsilons=plan.epsilons, n=int(sums.worst_case.n), clean_correct=int(sums.worst_case.correct),
      robust={name: sums.curves[a].robust for a, name in enumerate(names)},
      worst_case=sums.worst_case.robust,
      info={n: (a.name, a.norm, a.minimum_norm) for n, a in plan.attacks.items()},
      flags=dict(zip(names, sums.flags())), counts=dict(zip(names, sums.counts)),
      per_example=state.report_per_example(), timing=timing, provenance=described,
      # A certifier's curve above the attacks' is kept and flagged (report.ABOVE_EMPIRICAL), not
      # refused after the run: smoothing certifies the smoothed classifier, not the attacked one.
      certified={name: (c.name, c.norm, sums.certified[i].robust, True)
                 for i, (name, c) in enumerate(certifiers.items())})
