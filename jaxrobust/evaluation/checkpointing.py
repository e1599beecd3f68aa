"""Checkpoints of :func:`jaxrobust.evaluate`: what identifies a run, the host state, resuming.

The host state (:class:`EvalState`) is the position in the data stream, the merged
:class:`~jaxrobust.evaluation.device_step.EvalSums` (int64 on the host) and, if kept, the
per-example arrays. After every batch it is written atomically (:mod:`jaxrobust._checkpoint`)
together with a running SHA-256 of the data seen, the run's configuration (:func:`fingerprint`)
and the model's fingerprint (its traced program and the values of every array it reads). A
resumed run re-reads and hashes the batches already done, refuses other data, another
configuration or another model, and ends with a report bitwise equal to an uninterrupted run's.
In a multi-process run each process writes its own file and keeps its state one batch back too:
:meth:`Checkpoint.agree` restarts every process from the smallest position any reached.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import types
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxrobust import _checkpoint
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack
from jaxrobust.evaluation.device_step import EvalSums, _Trace, hash_array
from jaxrobust.metrics import CurveCounts
from jaxrobust.model import Model

VERSION = 5  # 2: model fingerprint, reliability counts; 3: the state is EvalSums; 4: attacks
# identified by their recorded config (attack_digest); 5: the clean pass's checks for every attack
# (zero_gradient_points, non_finite_logits: once per grid, where AutoAttack counted them per eps)


_PRIMITIVE = (bool, int, float, str, bytes, type(None))


_MAX_DEPTH = 8


def _config_of(fn: Any, depth: int = 0) -> Any:
  """The static configuration captured by a hand-built attack's closures, as JSON-ready values
  (attacks built by a factory are identified by their recorded ``config``)."""
  if isinstance(fn, _PRIMITIVE):
    return fn if not isinstance(fn, (float, bytes)) else repr(fn)
  if depth >= _MAX_DEPTH:
    return type(fn).__qualname__
  if isinstance(fn, (tuple, list)):  # NamedTuple configurations included
    return [_config_of(v, depth + 1) for v in fn]
  if isinstance(fn, dict):
    return [[str(k), _config_of(v, depth + 1)] for k, v in sorted(fn.items(), key=str)]
  if isinstance(fn, functools.partial):  # factories bind module-level pieces to their config
    return ["partial", _config_of(fn.func, depth + 1), _config_of(fn.args, depth + 1),
            _config_of(fn.keywords, depth + 1)]
  if isinstance(fn, types.FunctionType):
    cells = [c.cell_contents for c in (fn.__closure__ or ()) if _has_contents(c)]
    return [fn.__qualname__, [_config_of(c, depth + 1) for c in cells]]
  return type(fn).__qualname__


def _has_contents(cell: Any) -> bool:
  try:
    cell.cell_contents  # noqa: B018
  except ValueError:
    return False
  return True


def fingerprint(attacks: Mapping[str, Attack], epsilons: np.ndarray, key_data: np.ndarray,
                 key_impl: Any, batch_size: int, lower: float, upper: float,
                 keep_per_example: bool, options: RunOptions, process: tuple[int, int],
                 certifiers: Mapping[str, Any] | None = None,
                 max_propagations: int | None = None) -> dict[str, Any]:
  """What must match for a checkpoint to be resumed: everything that changes the result.

  Of the run's options it holds ``eps_batch_size`` and ``unroll`` (as it always has: the same
  keys and values, so earlier checkpoints still resume), not ``chunk_size`` and ``early_exit``,
  which change the work and not the verdicts. A cap on propagations (``max_propagations``)
  changes the verdicts: it is recorded when given (and absent without one, as before).
  """
  described = [[name, a.name, a.norm, a.num_steps, a.minimum_norm, a.samples, attack_digest(a)]
               for name, a in attacks.items()]
  return {"attacks": described, "epsilons": [repr(float(e)) for e in epsilons],
          "key": [str(key_impl), key_data.astype(np.uint32).ravel().tolist()],
          "batch_size": batch_size, "box": [repr(float(lower)), repr(float(upper))],
          "keep_per_example": keep_per_example, "eps_batch_size": options.eps_batch_size,
          "unroll": options.unroll, "process": list(process),
          **({"certifiers": [[name, c.name, c.norm, c.config] for name, c in certifiers.items()]}
             if certifiers else {}),
          **({} if max_propagations is None else {"max_propagations": int(max_propagations)})}


def attack_digest(attack: Attack) -> str:
  """The attack's configuration in a checkpoint: a digest of :attr:`jaxrobust.Attack.config`, the
  recorded factory call (every default filled in, members nested) that reports show as the
  attack's provenance, so one record identifies an attack everywhere. A hand-built attack
  (``config=None``) is identified by the static configuration its functions capture instead.

  Examples:
    >>> import jaxrobust as jr
    >>> attack_digest(jr.attacks.pgd(steps=3)) == attack_digest(jr.attacks.pgd(steps=3))
    True
    >>> attack_digest(jr.attacks.pgd(steps=3)) == attack_digest(jr.attacks.pgd(steps=4))
    False
  """
  if attack.config is not None:
    described = attack.config
  else:
    described = repr([_config_of(f) for f in (attack.init, attack.step, attack.finalize,
                                                attack.drive, attack.samples, attack.suite)])
  return hashlib.sha256(described.encode()).hexdigest()[:16]


def model_fingerprint(model: Model, trace: _Trace) -> dict[str, str]:
  """What identifies the model in a checkpoint: the traced program and the values of every array
  it reads, arguments (the parameters of a ``partial`` or an ``nnx.Module``, a PyTorch module's
  buffers) and captured constants (those of a closure) alike."""
  digest = hashlib.sha256()
  for value in [*jax.tree.leaves(model.arguments), *trace.constants]:
    hash_array(digest, value)
  return {"program": trace.program, "arrays": digest.hexdigest()}


def _sums_to_json(sums: EvalSums) -> dict[str, Any]:
  curve = lambda c: [int(c.n), int(c.correct), np.asarray(c.robust).tolist()]
  return {"curves": [curve(c) for c in sums.curves], "worst_case": curve(sums.worst_case),
          "raised": [{k: int(v) for k, v in r.items()} for r in sums.raised],
          "counts": [{k: np.asarray(v).tolist() for k, v in c.items()} for c in sums.counts],
          "certified": [curve(c) for c in sums.certified]}


def _sums_from_json(d: Mapping[str, Any]) -> EvalSums:
  curve = lambda c: CurveCounts(np.int64(c[0]), np.int64(c[1]), np.asarray(c[2], np.int64))
  return EvalSums(curves=tuple(curve(c) for c in d["curves"]), worst_case=curve(d["worst_case"]),
                  raised=tuple({k: np.int64(v) for k, v in r.items()} for r in d["raised"]),
                  counts=tuple({k: np.asarray(v, np.int64) for k, v in c.items()}
                               for c in d["counts"]),
                  certified=tuple(curve(c) for c in d.get("certified", [])))


@dataclasses.dataclass
class EvalState:
  """The host-side state of a run: position, merged sums (int64), per-example arrays."""

  names: tuple[str, ...]
  min_norm: tuple[str, ...]  # the minimum-norm attacks, whose eps* are kept per example
  keep: bool
  position: int = 0  # batches done
  seen: int = 0  # examples seen by this process (for default global indices)
  sums: EvalSums | None = None
  per_example: dict[str, list] = dataclasses.field(default_factory=dict)

  def add(self, sums: EvalSums, per: Any) -> None:
    """Merges one batch's host sums and, if kept, its valid rows' per-example arrays."""
    sums = sums.to_host()
    self.sums = sums if self.sums is None else self.sums.merge(sums)
    if self.keep and per is not None:
      valid = np.asarray(per.mask, bool)
      fields = {"index": np.asarray(per.index).astype(np.int64), "correct": per.correct,
                "robust": per.robust, "worst_case": per.worst_case, "eps_star": per.eps_star}
      for k, v in fields.items():
        self.per_example.setdefault(k, []).append(np.asarray(v)[valid])

  def to_checkpoint(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    header = {"position": self.position, "seen": self.seen,
              "n": 0 if self.sums is None else int(self.sums.worst_case.n),  # for a reader
              "sums": None if self.sums is None else _sums_to_json(self.sums)}
    arrays = {f"per_example.{k}": np.concatenate(v) for k, v in self.per_example.items()}
    return header, arrays

  def restore(self, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    self.position, self.seen = int(header["position"]), int(header["seen"])
    self.sums = None if header["sums"] is None else _sums_from_json(header["sums"])
    self.per_example = {k[len("per_example."):]: [v] for k, v in arrays.items()
                        if k.startswith("per_example.")} if self.keep else {}

  def report_per_example(self) -> dict[str, np.ndarray] | None:
    """The per-example arrays in :class:`jaxrobust.Report`'s layout (``None`` if not kept)."""
    if not self.keep:
      return None
    pe = {k: np.concatenate(v) for k, v in self.per_example.items()}
    out = {"index": pe["index"], "correct": pe["correct"].astype(bool),
           "robust": np.transpose(pe["robust"], (1, 2, 0)).astype(bool),
           "worst_case": np.transpose(pe["worst_case"], (1, 0)).astype(bool)}
    for j, name in enumerate(self.min_norm):
      out[f"eps_star/{name}"] = pe["eps_star"][:, j].astype(np.float32)
    return out


class Checkpoint:
  """One process's checkpoint file: loads and validates it, restores the state, saves."""

  def __init__(self, path: os.PathLike | str, run_fingerprint: dict[str, Any], state: EvalState):
    num_processes, process_index = jax.process_count(), jax.process_index()
    self.path = os.fspath(path)
    if num_processes > 1:
      self.path = f"{self.path}.process{process_index}of{num_processes}"
    self.fingerprint, self.model = run_fingerprint, None
    self.resume_at, self.resume_hash, self.stored_model, previous = 0, None, None, None
    self._arrays: dict[str, np.ndarray] = {}
    # Its folder now, not at the first save: a mistyped folder must not cost the first batch.
    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
    loaded = _checkpoint.load(self.path)
    if loaded is not None:
      header, self._arrays = loaded
      self._check_header(header)
      state.restore(header["state"], self._arrays)
      self.resume_at, self.resume_hash = state.position, header["data_sha256"]
      previous, self.stored_model = header.get("previous"), header["model"]
    if num_processes > 1:
      self.resume_at, self.resume_hash = _agree_on_position(
          state, self.resume_at, self.resume_hash, previous, self._arrays, self.path)
    self._last = (*state.to_checkpoint(), self.resume_hash)

  def _check_header(self, header: Mapping[str, Any]) -> None:
    if header.get("version") != VERSION:
      raise ValueError(f"Checkpoint {self.path} has version {header.get('version')}, expected "
                       f"{VERSION}. Delete it to start over.")
    stored, current = header["fingerprint"], self.fingerprint
    differ = sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))
    if differ:
      raise ValueError(
          f"Checkpoint {self.path} was written by a different evaluation: {', '.join(differ)} "
          f"differ(s) (checkpoint: {', '.join(f'{k}={stored.get(k)}' for k in differ)}; this "
          f"run: {', '.join(f'{k}={current.get(k)}' for k in differ)}). Delete it or pass "
          "another checkpoint path.")

  def check_model(self, model: dict[str, str], sharded_program: str | None = None) -> None:
    """Records the model's fingerprint; refuses to resume a file written for another model.
    ``sharded_program``: the digest of the model traced on this run's mesh, which earlier
    versions recorded instead of the unsharded one; a file holding it is the same model."""
    self.model = model
    stored = self.stored_model
    if stored is not None and sharded_program is not None and (
        stored.get("program") == sharded_program):
      stored = {**stored, "program": model["program"]}
    _check_same_model(self.path, stored, model)

  def check_data(self, position: int, data_sha256: str) -> None:
    """At the resume position, the data seen must hash as it did when the file was written."""
    if position == self.resume_at and data_sha256 != self.resume_hash:
      raise ValueError(f"Checkpoint {self.path} was written for different data: the first "
                       f"{self.resume_at} batches hash differently. Delete it or pass the same "
                       "data in the same order.")

  def save(self, state: EvalState, data_sha256: str) -> None:
    """Writes the state after a batch (atomically; see :mod:`jaxrobust._checkpoint`)."""
    s_header, s_arrays = state.to_checkpoint()
    header = {"version": VERSION, "fingerprint": self.fingerprint, "model": self.model,
              "state": s_header, "data_sha256": data_sha256, "previous": None}
    arrays = dict(s_arrays)
    if jax.process_count() > 1:  # the state one batch back, in case another process lags behind
      header["previous"] = {"state": self._last[0], "data_sha256": self._last[2]}
      arrays.update({f"previous.{k}": v for k, v in self._last[1].items()})
      self._last = (s_header, s_arrays, data_sha256)
    _checkpoint.save(self.path, header, arrays)


def _agree_on_position(state: EvalState, position: int, digest: str | None,
                       previous: Mapping[str, Any] | None, arrays: Mapping[str, np.ndarray],
                       path: str) -> tuple[int, str | None]:
  """Multi-process resume: every process restarts from the smallest position any reached.

  Processes write their checkpoints independently, so a kill can leave one process a batch ahead
  (no process can get further: the next batch's sums need every process). The one ahead rolls back
  to the state it kept one batch back.
  """
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
                "in the model, another JAX version)")
  raise ValueError(f"Checkpoint {path} was written for a different model: {'; '.join(what)}. "
                   "Resuming would mix two models' results. Delete it or pass another "
                   "checkpoint path.")
