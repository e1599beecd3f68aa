r"""``jr.Report``: what :func:`jaxrobust.evaluate` hands back, built from exact integer counts.

A report is computed on the host from integer sums over every evaluated example, so it does not
depend on how the examples were batched, padded, ordered or spread over devices. Over ``N``
examples and the eps grid :math:`\epsilon_1, \dots, \epsilon_K`:

.. math::
   \mathrm{clean} = \frac{1}{N} \sum_i [\hat y(x_i) = y_i], \qquad
   \mathrm{RA}_a(\epsilon_k) = \frac{1}{N} \sum_i r_{a,k,i}, \qquad
   \mathrm{RA}_{\text{worst}}(\epsilon_k) = \frac{1}{N} \sum_i \prod_a r_{a,k,i},

where :math:`r_{a,k,i} = 1` when example :math:`i` is clean-correct and attack :math:`a` broke
it at no budget :math:`\epsilon_j \le \epsilon_k`. The worst case is taken per example (a point
is robust at eps only if it survives every attack), never as the minimum of the per-attack
accuracies (Carlini et al., 2019). AUCs follow :func:`jaxrobust.metrics.curve_auc`.

Reliability flags come with the integer counts behind them (``AttackResult.info["counts"]``),
summed over the data set. A flag that compares a count with a fraction of the data is decided
here, once, from the global count and :math:`N` (AutoAttack's ``square_beats_white_box``:
:math:`\#\{\text{points only Square broke}\} > 0.002\,N` at some eps), so it does not depend on
the batch size; a flag that means "the count is positive" is the OR over batches, which is the
same thing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxrobust import metrics
from jaxrobust._types import Curve
from jaxrobust.attacks._auto_attack import SQUARE_THRESHOLD

WORST_CASE = "worst_case"
"""The name of the per-example worst case over all attacks in :meth:`Report.curve`."""

FRACTION_FLAGS: Mapping[str, tuple[str, float]] = {
    "square_beats_white_box": ("square_only_points", SQUARE_THRESHOLD)}
"""Flags decided from a count and the number of examples: ``flag -> (count, fraction)``, raised
when the count (summed over the data set) exceeds ``fraction * N`` at some eps."""


def decide_flags(flags: Mapping[str, bool], counts: Mapping[str, Any],
                 n: int) -> dict[str, bool]:
  r"""An attack's flags over the whole data set, from its OR-ed flags and global counts.

  A flag of :data:`FRACTION_FLAGS` whose count is present is decided again from the count:
  :math:`\max_k \mathrm{count}_k > \mathrm{fraction} \cdot N` (each batch judged alone would use
  its own size instead of :math:`N`); every other flag is kept as given.

  Args:
    flags: flag name -> bool (OR over batches).
    counts: count name -> int array (``[K]`` per eps, or a scalar), summed over the data set.
    n: the number of examples.

  Returns:
    flag name -> bool.

  Examples:
    >>> import numpy as np
    >>> flags = {"square_beats_white_box": True, "zero_gradients": False}
    >>> decide_flags(flags, {"square_only_points": np.array([1, 1])}, n=600)  # 1 > 1.2: no
    {'square_beats_white_box': False, 'zero_gradients': False}
    >>> decide_flags(flags, {"square_only_points": np.array([0, 2])}, n=600)  # 2 > 1.2 at eps 2
    {'square_beats_white_box': True, 'zero_gradients': False}
  """
  out = {str(k): bool(v) for k, v in flags.items()}
  for flag, (count, fraction) in FRACTION_FLAGS.items():
    if count in counts:
      out[flag] = bool(np.any(np.asarray(counts[count], np.float64) > fraction * n))
  return out


@dataclasses.dataclass(frozen=True, eq=False)
class AttackSummary:
  """One attack's (or the worst case's) robustness curve over the whole data set.

  Attributes:
    name: the key of the attack in the ``attacks`` mapping (``"worst_case"`` for the worst case).
    description: the attack's own ``Attack.name`` (its configuration).
    norm: the attack's norm.
    minimum_norm: whether the curve comes from per-example minimal norms :math:`\\epsilon^*`.
    robust_count: ``[K]`` int64, examples robust at each eps.
    robust_accuracy: ``[K]`` float32, ``robust_count / N``; non-increasing along sorted eps.
    auc: area under the curve from ``(0, clean accuracy)``, divided by the largest eps.
    flags: reliability flags of the attack over the whole data set, e.g. zero gradients (see
      :func:`decide_flags`).
    counts: the integer counts behind the flags (``AttackResult.info["counts"]``), summed over
      the data set: ``[K]`` int64 (one per eps) for a fixed-budget attack, ``[]`` for a
      minimum-norm one; e.g. ``non_finite_gradient_points``.
  """

  name: str
  description: str
  norm: str
  minimum_norm: bool
  robust_count: np.ndarray
  robust_accuracy: np.ndarray
  auc: float
  flags: Mapping[str, bool]
  counts: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

  def to_dict(self) -> dict[str, Any]:
    return {"name": self.name, "description": self.description, "norm": self.norm,
            "minimum_norm": self.minimum_norm,
            "robust_count": [int(c) for c in self.robust_count],
            "robust_accuracy": [float(a) for a in self.robust_accuracy],
            "auc": self.auc, "flags": {k: bool(v) for k, v in sorted(self.flags.items())},
            "counts": {k: np.asarray(v).tolist() for k, v in sorted(self.counts.items())}}


@dataclasses.dataclass(frozen=True, eq=False)
class Report:
  r"""The result of :func:`jaxrobust.evaluate`: curves, clean accuracy, AUCs, flags, examples.

  Attributes:
    epsilons: ``[K]`` float32 budgets, as given.
    num_examples: ``N``, the number of evaluated (unpadded) examples.
    clean_correct: examples classified correctly on the clean input.
    clean_accuracy: ``clean_correct / N``.
    attacks: attack name -> :class:`AttackSummary` (the per-attack breakdown).
    worst_case: the per-example worst case over all attacks, as an :class:`AttackSummary`.
    per_example: ``None``, or (with ``keep_per_example=True``) a dict of NumPy arrays in data
      order: ``index [N]`` (global example index, the one the per-example keys derive from),
      ``correct [N]``, ``robust [A, K, N]`` (attacks in the order of ``attacks``),
      ``worst_case [K, N]`` and ``eps_star/<name> [N]`` for each minimum-norm attack.
    timing: wall-clock statistics of the run (not part of equality or of :meth:`to_json`).

  Two reports compare equal when every field but ``timing`` is bitwise equal.

  Examples:
    >>> import numpy as np
    >>> r = Report.from_counts(epsilons=np.array([0.1, 0.2], np.float32), n=4, clean_correct=3,
    ...                        robust={"pgd": np.array([2, 1])}, worst_case=np.array([2, 1]),
    ...                        info={"pgd": ("pgd-linf", "linf", False)}, flags={"pgd": {}})
    >>> r.clean_accuracy, r.attacks["pgd"].robust_accuracy.tolist(), r.worst_case.auc
    (0.75, [0.5, 0.25], 0.5)
  """

  epsilons: np.ndarray
  num_examples: int
  clean_correct: int
  clean_accuracy: float
  attacks: Mapping[str, AttackSummary]
  worst_case: AttackSummary
  per_example: Mapping[str, np.ndarray] | None = None
  timing: Mapping[str, float] = dataclasses.field(default_factory=dict)

  @classmethod
  def from_counts(cls, *, epsilons: np.ndarray, n: int, clean_correct: int,
                  robust: Mapping[str, np.ndarray], worst_case: np.ndarray,
                  info: Mapping[str, tuple[str, str, bool]],
                  flags: Mapping[str, Mapping[str, bool]],
                  counts: Mapping[str, Mapping[str, Any]] | None = None,
                  per_example: Mapping[str, np.ndarray] | None = None,
                  timing: Mapping[str, float] | None = None) -> Report:
    """Builds a report from integer counts.

    Args:
      epsilons: ``[K]`` budgets.
      n: number of examples.
      clean_correct: clean-correct examples.
      robust: attack name -> ``[K]`` robust counts.
      worst_case: ``[K]`` counts of examples robust under every attack.
      info: attack name -> ``(description, norm, minimum_norm)``.
      flags: attack name -> reliability flags (OR over batches).
      counts: optional attack name -> count name -> int array, the counts behind the flags summed
        over the data set; flags of :data:`FRACTION_FLAGS` are decided from them.
      per_example: optional per-example arrays (see the class attributes).
      timing: optional wall-clock statistics.

    Returns:
      A :class:`Report`.
    """
    epsilons = np.asarray(epsilons, np.float32)
    counts = counts or {}

    def curve(robust_count):  # the reducer every curve of the library is computed from
      return metrics.CurveCounts(np.int64(n), np.int64(clean_correct),
                                 np.asarray(robust_count, np.int64)).compute(epsilons)

    def summary(name, robust_count, description, norm, minimum_norm, attack_flags,
                attack_counts, computed=None):
      computed = curve(robust_count) if computed is None else computed
      attack_counts = {str(k): np.asarray(v, np.int64) for k, v in attack_counts.items()}
      return AttackSummary(name=name, description=description, norm=norm,
                           minimum_norm=bool(minimum_norm),
                           robust_count=np.asarray(robust_count, np.int64),
                           robust_accuracy=computed["robust_accuracy"],
                           auc=float(computed["auc"]),
                           flags=decide_flags(attack_flags, attack_counts, int(n)),
                           counts=attack_counts)

    attacks = {name: summary(name, robust[name], *info[name], flags.get(name, {}),
                             counts.get(name, {}))
               for name in robust}
    norms = sorted({s.norm for s in attacks.values()})
    any_flags = {f"{name}/{k}": v for name, s in attacks.items() for k, v in s.flags.items()}
    any_counts = {f"{name}/{k}": v for name, s in attacks.items() for k, v in s.counts.items()}
    worst_curve = curve(worst_case)
    worst = summary(WORST_CASE, worst_case, " + ".join(s.description for s in attacks.values()),
                    "+".join(norms), all(s.minimum_norm for s in attacks.values()), any_flags,
                    any_counts, worst_curve)
    clean = worst_curve["clean_accuracy"]
    return cls(epsilons=epsilons, num_examples=int(n), clean_correct=int(clean_correct),
               clean_accuracy=float(clean), attacks=attacks, worst_case=worst,
               per_example=None if per_example is None else dict(per_example),
               timing=dict(timing or {}))

  @property
  def flags(self) -> dict[str, dict[str, bool]]:
    """Attack name -> reliability flags over the whole data set (see :func:`decide_flags`)."""
    return {name: dict(s.flags) for name, s in self.attacks.items()}

  @property
  def reliable(self) -> bool:
    """``False`` when any attack raised any reliability flag."""
    return not any(v for fl in self.flags.values() for v in fl.values())

  def curve(self, name: str = WORST_CASE) -> Curve:
    """The :class:`jaxrobust.Curve` of one attack (or of the worst case).

    ``Curve.robust`` holds the per-example flags ``[K, N]`` when the run kept them, else an
    empty ``[K, 0]`` array.

    Args:
      name: an attack name, or ``"worst_case"``.

    Returns:
      A :class:`jaxrobust.Curve` of NumPy arrays.
    """
    if name == WORST_CASE:
      summary = self.worst_case
    elif name in self.attacks:
      summary = self.attacks[name]
    else:
      raise ValueError(f"Unknown attack {name!r}; the report has {sorted(self.attacks)} and "
                       f"{WORST_CASE!r}.")
    robust = np.zeros((len(self.epsilons), 0), bool)
    if self.per_example is not None:
      if name == WORST_CASE:
        robust = self.per_example["worst_case"]
      else:
        robust = self.per_example["robust"][list(self.attacks).index(name)]
    return Curve(epsilons=self.epsilons, clean_accuracy=np.float32(self.clean_accuracy),
                 robust_accuracy=summary.robust_accuracy, robust=robust,
                 auc=np.float32(summary.auc))

  def to_dict(self) -> dict[str, Any]:
    """Everything but the per-example arrays and the timing, as JSON-ready Python values."""
    return {"epsilons": [float(e) for e in self.epsilons], "num_examples": self.num_examples,
            "clean_correct": self.clean_correct, "clean_accuracy": self.clean_accuracy,
            "attacks": {name: s.to_dict() for name, s in self.attacks.items()},
            "worst_case": self.worst_case.to_dict(),
            "per_example": None if self.per_example is None else sorted(self.per_example)}

  def to_json(self, *, include_timing: bool = False, indent: int | None = 2) -> str:
    """The report as JSON (floats printed exactly, so equal reports give equal text).

    Args:
      include_timing: add the wall-clock statistics (which differ from run to run).
      indent: passed to :func:`json.dumps`.

    Returns:
      A JSON string.
    """
    out = self.to_dict()
    if include_timing:
      out["timing"] = dict(self.timing)
    return json.dumps(out, indent=indent, allow_nan=True)

  def save(self, directory: os.PathLike | str) -> pathlib.Path:
    """Writes ``report.json`` (with timing) and, if kept, ``per_example.npz`` into ``directory``.

    Returns:
      The directory as a :class:`pathlib.Path`.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(self.to_json(include_timing=True))
    if self.per_example is not None:
      np.savez(directory / "per_example.npz", **self.per_example)
    return directory

  @classmethod
  def load(cls, directory: os.PathLike | str) -> Report:
    """Reads a report written by :meth:`save` (the inverse of :meth:`save`)."""
    directory = pathlib.Path(directory)
    d = json.loads((directory / "report.json").read_text())
    per_example = None
    if d["per_example"] is not None:
      with np.load(directory / "per_example.npz") as f:
        per_example = {k: f[k] for k in f.files}
    info = {n: (s["description"], s["norm"], s["minimum_norm"]) for n, s in d["attacks"].items()}
    return cls.from_counts(
        epsilons=np.asarray(d["epsilons"], np.float32), n=d["num_examples"],
        clean_correct=d["clean_correct"],
        robust={n: np.asarray(s["robust_count"], np.int64) for n, s in d["attacks"].items()},
        worst_case=np.asarray(d["worst_case"]["robust_count"], np.int64), info=info,
        flags={n: s["flags"] for n, s in d["attacks"].items()},
        counts={n: s.get("counts", {}) for n, s in d["attacks"].items()}, per_example=per_example,
        timing=d.get("timing"))

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Report):
      return NotImplemented
    if self.to_json() != other.to_json():
      return False
    if (self.per_example is None) != (other.per_example is None):
      return False
    if self.per_example is None:
      return True
    return all(a.dtype == other.per_example[k].dtype and np.array_equal(
        a, other.per_example[k], equal_nan=a.dtype.kind == "f")
               for k, a in self.per_example.items())

  __hash__ = None  # mutable NumPy fields: not hashable

  def __str__(self) -> str:
    lines = [f"jr.Report: {self.num_examples} examples, clean accuracy {self.clean_accuracy:.4f}",
             "eps:        " + " ".join(f"{e:8.4g}" for e in self.epsilons)]
    for s in [*self.attacks.values(), self.worst_case]:
      flagged = [k for k, v in s.flags.items() if v]
      lines.append(f"{s.name[:11]:<11} " + " ".join(f"{a:8.4f}" for a in s.robust_accuracy)
                   + f"   AUC {s.auc:.4f}" + (f"   FLAGS: {', '.join(flagged)}" if flagged
                                               else ""))
    return "\n".join(lines)
