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

Every accuracy carries its exact two-sided Clopper--Pearson interval at ``confidence`` (95% by
default; :func:`jaxrobust.metrics.binomial_interval`): the examples are treated as a sample from
the data distribution, so the interval says how far the accuracy on that distribution may be
from the one measured on these :math:`N` examples. It says nothing about the attack's strength:
an empirical robust accuracy is an upper bound on the true one whatever :math:`N`.

A report also keeps its *provenance* (the attacks' full configurations, the eps units and box, the
key, the library, JAX and Python versions, the devices; see :func:`provenance`) and, next to the
empirical curves (upper bounds), *certified* curves (lower bounds; :meth:`Report.with_certified`),
so one report can bracket the true robust accuracy from both sides.

The static gradient-masking diagnosis of the evaluated model (:func:`jaxrobust.diagnose`, run by
:func:`jaxrobust.evaluate` unless ``diagnose=False``) is part of the provenance: like the attacks'
configurations it describes what was evaluated rather than what was measured, and its locations
are source paths of one machine. :attr:`Report.diagnosis` reads it, :attr:`Report.reliable` and
``str(report)`` take it into account.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from jaxrobust import checklist as checklist_lib, metrics
from jaxrobust._findings import Diagnosis
from jaxrobust._types import Attack, Curve
from jaxrobust.metrics.checks import FRACTION_FLAGS, decide_flags  # noqa: F401 - re-exported

WORST_CASE = "worst_case"
"""The name of the per-example worst case over all attacks in :meth:`Report.curve`."""


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
    robust_interval: ``[K, 2]`` float64, the exact two-sided binomial interval of each robust
      accuracy at the report's ``confidence`` (lower, upper).
    auc: area under the curve from ``(0, clean accuracy)``, divided by the largest eps.
    flags: reliability flags of the attack over the whole data set, e.g. zero gradients (see
      :func:`~jaxrobust.metrics.checks.decide_flags`).
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
  robust_interval: np.ndarray = dataclasses.field(
      default_factory=lambda: np.zeros((0, 2), np.float64))

  def to_dict(self) -> dict[str, Any]:
    return {"name": self.name, "description": self.description, "norm": self.norm,
            "minimum_norm": self.minimum_norm,
            "robust_count": [int(c) for c in self.robust_count],
            "robust_accuracy": [float(a) for a in self.robust_accuracy],
            "robust_accuracy_interval": [[float(lo), float(hi)]
                                         for lo, hi in self.robust_interval],
            "auc": self.auc, "flags": {k: bool(v) for k, v in sorted(self.flags.items())},
            "counts": {k: np.asarray(v).tolist() for k, v in sorted(self.counts.items())}}


def _integers(name: str, values: Any, shape: tuple[int, ...]) -> np.ndarray:
  """``values`` as int64 of ``shape``; floats, bools and other shapes refused (5.7 is no count)."""
  array = np.asarray(values)
  if array.dtype.kind not in "iu" or array.shape != shape:
    raise ValueError(f"{name} must be integer counts of shape {list(shape)}, got "
                     f"{array.dtype} {list(array.shape)}.")
  return array.astype(np.int64)


def _check_counts(epsilons: np.ndarray, n: Any, clean_correct: Any,
                  robust: Mapping[str, Any], worst_case: Any,
                  info: Mapping[str, Any], certified: Mapping[str, Any]) -> None:
  """The counts a report is built from are counts some evaluation gives: integers with
  ``0 <= robust <= clean_correct <= n`` at every eps, robust counts non-increasing in eps (a
  point broken at an eps is broken at every larger one), the worst case at most every attack's,
  at least one attack, certified counts as :func:`_check_certified` requires, and a description
  for every attack (a ``ValueError`` naming what is wrong). ``certified`` holds
  :func:`_certified_entry`'s tuples."""
  if epsilons.ndim != 1:
    raise ValueError(f"epsilons must be [K], got shape {list(epsilons.shape)}.")
  if not robust:
    raise ValueError("robust is empty: a report needs at least one attack (robust: attack name "
                     "-> [K] robust counts, with its description in info); the worst case is "
                     "the per-example worst case over the attacks.")
  shape = epsilons.shape
  n = int(_integers("n", n, ()))
  correct = int(_integers("clean_correct", clean_correct, ()))
  if not 0 <= correct <= n:
    raise ValueError(f"clean_correct must lie in [0, n] = [0, {n}], got {correct}.")
  order = np.argsort(epsilons, kind="stable")
  curves = {name: _integers(f"robust[{name!r}]", c, shape) for name, c in robust.items()}
  worst = _integers("worst_case", worst_case, shape)
  for name, c in [*curves.items(), ("worst_case", worst)]:
    if np.any(c < 0) or np.any(c > correct):
      raise ValueError(f"{name}'s robust counts must lie in [0, clean_correct] = [0, {correct}], "
                       f"got {c.tolist()}.")
    if np.any(np.diff(c[order]) > 0):
      raise ValueError(f"{name}'s robust counts grow with eps ({c[order].tolist()} at eps "
                       f"{epsilons[order].tolist()}): a point broken at an eps is broken at "
                       "every larger one.")
    if name != "worst_case" and np.any(worst > c):
      raise ValueError(f"worst_case {worst.tolist()} exceeds {name}'s robust counts "
                       f"{c.tolist()}: a point robust under every attack is robust under each.")
  missing = sorted(set(curves) - set(info))
  if missing:
    raise ValueError(f"info has no (description, norm, minimum_norm) for {missing}.")
  for name, (_, _, c, allow_above_empirical) in certified.items():
    _check_certified(name, c, epsilons, n, worst, allow_above_empirical)


ABOVE_EMPIRICAL = "above_empirical"
"""The flag of a certified curve kept above the empirical worst case at some eps (allowed with
``allow_above_empirical``, e.g. for Monte-Carlo certificates such as randomized smoothing)."""


def _check_certified(name: str, counts: Any, epsilons: np.ndarray, n: int, worst: np.ndarray,
                     allow_above_empirical: bool) -> np.ndarray:
  """The rule of a certified curve, the one that :meth:`Report.from_counts` (so also
  :meth:`Report.from_dict` and :meth:`Report.load`) and :meth:`Report.with_certified` apply:
  ``[K]`` integer counts in ``[0, n]``, and at most the empirical worst case (so at most
  ``clean_correct``) at every eps unless ``allow_above_empirical``. Returns the counts as int64.

  Raises:
    ValueError: naming the curve, the counts and the bound they break.
  """
  counts = _integers(f"certified[{name!r}]", counts, epsilons.shape)
  if np.any(counts < 0) or np.any(counts > n):
    raise ValueError(f"certified[{name!r}] counts {counts.tolist()} must lie in [0, n] = "
                     f"[0, {n}].")
  above = counts > worst
  if np.any(above) and not allow_above_empirical:
    where = ", ".join(f"{e:g}" for e in epsilons[above])
    raise ValueError(
        f"certified[{name!r}] counts {counts.tolist()} exceed the empirical worst case "
        f"{worst.tolist()} at eps {where}: a lower bound above an upper bound "
        "means the curves do not describe the same examples, eps grid and norm (for Monte-Carlo "
        "certificates such as smoothing, pass allow_above_empirical=True to "
        "Report.with_certified).")
  return counts


def _certified_entry(name: str, entry: Any) -> tuple[str, str, Any, bool]:
  """``(description, norm, counts, allow_above_empirical)`` from a ``certified`` entry of
  :meth:`Report.from_counts`: ``(description, norm, counts)``, with an optional fourth entry
  ``allow_above_empirical`` (default ``False``)."""
  if not isinstance(entry, (tuple, list)) or len(entry) not in (3, 4):
    raise ValueError(f"certified[{name!r}] must be (description, norm, [K] counts) or "
                     f"(description, norm, [K] counts, allow_above_empirical), got {entry!r}.")
  description, norm, counts, *allow = entry
  return description, norm, counts, bool(allow and allow[0])


def provenance(attacks: Mapping[str, Attack], *, epsilons: Any, lower: float, upper: float,
               key_data: Any = None, key_impl: Any = None,
               **extra: Any) -> dict[str, Any]:
  """What a report's numbers mean: the threat model, the attacks' full configurations, the key
  and the software that produced them.

  Keys: ``jaxrobust_version``, ``jax_version``, ``jaxlib_version``, ``numpy_version``,
  ``python_version``, ``backend``, ``device_kind``, ``threat_model`` (``norm``, ``epsilons``,
  ``eps_units``, ``box``), ``attacks`` (name -> ``description``, ``norm``, ``minimum_norm``,
  ``targeted``, ``num_steps``, ``config``: the factory call of :attr:`jaxrobust.Attack.config`,
  or ``None`` for a hand-built attack), ``key`` (``impl``, ``data``), and every keyword of
  ``extra`` (e.g. ``batch_size``, ``devices``, ``command``; :func:`jaxrobust.evaluate` adds
  ``evaluate``, its run options, and ``diagnosis``, the model's static gradient-masking
  diagnosis as :meth:`jaxrobust.diagnosis.Diagnosis.to_record` writes it).

  Examples:
    >>> import jaxrobust as jr
    >>> p = provenance({"pgd": jr.attacks.pgd("l2", steps=5)}, epsilons=[0.5, 1.0], lower=0.0,
    ...                upper=1.0)
    >>> p["threat_model"]["norm"], p["threat_model"]["box"], p["attacks"]["pgd"]["config"]["steps"]
    ('l2', [0.0, 1.0], 5)
  """
  import jaxlib  # noqa: PLC0415 - only for its version

  norms = sorted({a.norm for a in attacks.values()})
  devices = jax.devices()
  return {
      "jaxrobust_version": _version(), "jax_version": jax.__version__,
      "jaxlib_version": getattr(jaxlib, "__version__", "unknown"),
      "numpy_version": np.__version__, "python_version": platform.python_version(),
      "backend": jax.default_backend(), "device_kind": devices[0].device_kind,
      "threat_model": {
          "norm": "+".join(norms),
          "epsilons": [float(e) for e in np.asarray(epsilons, np.float32).ravel()],
          "eps_units": (f"the {'/'.join(norms)} norm of x_adv - x, in the units of x "
                        f"(inputs in [{float(lower)}, {float(upper)}])"),
          "box": [float(lower), float(upper)]},
      "attacks": {name: {"description": a.name, "norm": a.norm,
                         "minimum_norm": bool(a.minimum_norm), "targeted": bool(a.targeted),
                         "num_steps": int(a.num_steps), "samples": int(a.samples),
                         "config": None if a.config is None else json.loads(a.config)}
                  for name, a in attacks.items()},
      "key": None if key_data is None else {
          "impl": str(key_impl), "data": np.asarray(key_data).astype(np.uint32).ravel().tolist()},
      **extra}


def _version() -> str:
  from jaxrobust import __version__  # noqa: PLC0415 - the package imports this module

  return str(__version__)


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
    confidence: the level of every interval (default 0.95).
    clean_interval: ``(lower, upper)``, the exact binomial interval of ``clean_accuracy``.
    certified: name -> :class:`AttackSummary` of a *certified* curve (a lower bound on the robust
      accuracy at each eps: the examples proven robust; see :meth:`with_certified`), empty when
      there is none.
    provenance: what the numbers mean (see :func:`provenance`): threat model, the attacks' full
      configurations, key, versions, devices, and the model's static diagnosis
      (:attr:`diagnosis`). Not part of equality.

  Two reports compare equal when every field but ``timing`` and ``provenance`` is bitwise equal:
  so two reports of the same numbers compare equal even when their diagnoses differ (one run
  with ``diagnose=False``, another model that computes the same, the model's source moved);
  compare ``a.diagnosis == b.diagnosis`` for that. A report keeps one diagnosis, of the model it
  evaluated: :meth:`with_certified` and :meth:`save`/:meth:`load` keep it, and combining the
  provenance of two reports (``dataclasses.replace(a, provenance=...)``) keeps whichever
  ``"diagnosis"`` the new provenance holds; there is no other merging of reports.

  Examples:
    >>> import numpy as np
    >>> r = Report.from_counts(epsilons=np.array([0.1, 0.2], np.float32), n=4, clean_correct=3,
    ...                        robust={"pgd": np.array([2, 1])}, worst_case=np.array([2, 1]),
    ...                        info={"pgd": ("pgd-linf", "linf", False)}, flags={"pgd": {}})
    >>> r.clean_accuracy, r.attacks["pgd"].robust_accuracy.tolist(), r.worst_case.auc
    (0.75, [0.5, 0.25], 0.5)
    >>> [round(b, 4) for b in r.clean_interval]  # 3 of 4: a wide interval
    [0.1941, 0.9937]
  """

  epsilons: np.ndarray
  num_examples: int
  clean_correct: int
  clean_accuracy: float
  attacks: Mapping[str, AttackSummary]
  worst_case: AttackSummary
  per_example: Mapping[str, np.ndarray] | None = None
  timing: Mapping[str, float] = dataclasses.field(default_factory=dict)
  confidence: float = 0.95
  clean_interval: tuple[float, float] = (0.0, 1.0)
  certified: Mapping[str, AttackSummary] = dataclasses.field(default_factory=dict)
  provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @classmethod
  def from_counts(cls, *, epsilons: np.ndarray, n: int, clean_correct: int,
                  robust: Mapping[str, np.ndarray], worst_case: np.ndarray,
                  info: Mapping[str, tuple[str, str, bool]],
                  flags: Mapping[str, Mapping[str, bool]],
                  counts: Mapping[str, Mapping[str, Any]] | None = None,
                  per_example: Mapping[str, np.ndarray] | None = None,
                  timing: Mapping[str, float] | None = None, confidence: float = 0.95,
                  certified: Mapping[str, tuple[str, str, np.ndarray]] | None = None,
                  provenance: Mapping[str, Any] | None = None) -> Report:
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
        over the data set; flags of :data:`~jaxrobust.metrics.checks.FRACTION_FLAGS` are decided from them.
      per_example: optional per-example arrays (see the class attributes).
      timing: optional wall-clock statistics.
      confidence: the level of the binomial intervals, in ``(0, 1)``.
      certified: optional name -> ``(description, norm, [K] certified counts)``, each count at
        most the worst case's at its eps; a fourth entry ``True``
        (``allow_above_empirical``, see :meth:`with_certified`) keeps a curve above it, with the
        flag :data:`ABOVE_EMPIRICAL` on its summary.
      provenance: optional description of the run (see :func:`provenance`).

    Returns:
      A :class:`Report`.

    Raises:
      ValueError: counts that no evaluation gives (:func:`_check_counts`): no attack (an empty
        ``robust``), counts outside ``[0, clean_correct]`` or growing with eps, certified counts
        above the worst case (unless allowed) or outside ``[0, n]``; a ``confidence`` outside
        ``(0, 1)``.
    """
    epsilons = np.asarray(epsilons, np.float32)
    counts = counts or {}
    certified = {name: _certified_entry(name, entry) for name, entry in (certified or {}).items()}
    if not 0.0 < float(confidence) < 1.0:
      raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
    _check_counts(epsilons, n, clean_correct, robust, worst_case, info, certified)
    curves = {name: np.asarray(c, np.int64) for name, c in robust.items()}
    every = [np.array([clean_correct], np.int64), *curves.values(),
             np.asarray(worst_case, np.int64),
             *(np.asarray(c[2], np.int64) for c in certified.values())]
    bounds = metrics.binomial_interval_table(np.concatenate(every), int(n), confidence)
    starts = np.cumsum([0] + [len(c) for c in every])
    interval_of = lambda i: bounds[starts[i]:starts[i + 1]]

    def curve(robust_count):  # the reducer every curve of the library is computed from
      return metrics.CurveCounts(np.int64(n), np.int64(clean_correct),
                                 np.asarray(robust_count, np.int64)).compute(epsilons)

    def summary(name, robust_count, description, norm, minimum_norm, attack_flags,
                attack_counts, interval, computed=None):
      computed = curve(robust_count) if computed is None else computed
      attack_counts = {str(k): np.asarray(v, np.int64) for k, v in attack_counts.items()}
      return AttackSummary(name=name, description=description, norm=norm,
                           minimum_norm=bool(minimum_norm),
                           robust_count=np.asarray(robust_count, np.int64),
                           robust_accuracy=computed["robust_accuracy"],
                           auc=float(computed["auc"]),
                           flags=decide_flags(attack_flags, attack_counts, int(n)),
                           counts=attack_counts, robust_interval=interval)

    attacks = {name: summary(name, curves[name], *info[name], flags.get(name, {}),
                             counts.get(name, {}), interval_of(1 + a))
               for a, name in enumerate(curves)}
    norms = sorted({s.norm for s in attacks.values()})
    any_flags = {f"{name}/{k}": v for name, s in attacks.items() for k, v in s.flags.items()}
    any_counts = {f"{name}/{k}": v for name, s in attacks.items() for k, v in s.counts.items()}
    worst_curve = curve(worst_case)
    worst = summary(WORST_CASE, worst_case, " + ".join(s.description for s in attacks.values()),
                    "+".join(norms), all(s.minimum_norm for s in attacks.values()), any_flags,
                    any_counts, interval_of(1 + len(curves)), worst_curve)
    above = lambda c: {ABOVE_EMPIRICAL: True} if np.any(np.asarray(c) > worst_case) else {}
    proven = {name: summary(name, c, description, norm, False, above(c), {},
                            interval_of(2 + len(curves) + i))
              for i, (name, (description, norm, c, _)) in enumerate(certified.items())}
    clean = worst_curve["clean_accuracy"]
    return cls(epsilons=epsilons, num_examples=int(n), clean_correct=int(clean_correct),
               clean_accuracy=float(clean), attacks=attacks, worst_case=worst,
               per_example=None if per_example is None else dict(per_example),
               timing=dict(timing or {}), confidence=float(confidence),
               clean_interval=tuple(float(b) for b in interval_of(0)[0]), certified=proven,
               provenance=dict(provenance or {}))

  def with_certified(self, name: str, certified: Curve | Any, *, description: str = "",
                     norm: str | None = None, allow_above_empirical: bool = False) -> Report:
    r"""This report with a certified curve added under ``name`` (a new report; this one is kept).

    A certified curve counts the examples *proven* robust at each eps of :attr:`epsilons` (e.g.
    by randomized smoothing or bound propagation), so it is a lower bound on the true robust
    accuracy, as the empirical curves are upper bounds:
    :math:`\mathrm{certified}(\epsilon) \le \mathrm{true}(\epsilon) \le
    \mathrm{worst\ case}(\epsilon)`. A certified count above the empirical worst case means one
    of the two is wrong (for instance different data, or a norm mismatch): it raises.

    Args:
      name: the curve's name (e.g. ``"smoothing sigma=0.25"``); not an attack's name.
      certified: a :class:`jaxrobust.Curve` over the same eps grid whose ``robust`` holds the
        per-example certified flags ``[K, N]`` of the same ``N`` examples, or ``[K]`` integer
        counts of certified examples.
      description: how the curve was obtained (the certifier's configuration).
      norm: the norm of the certified radii (default, and the only one accepted: the report's).
      allow_above_empirical: accept certified counts above the empirical worst case. For
        randomized smoothing both sides are Monte-Carlo estimates of the smoothed classifier (the
        certificate holds with probability ``1 - alpha`` per example, the attack's verdict is a
        majority of noise draws), so a few examples can land on either side by sampling alone.
        Such a curve carries the flag :data:`ABOVE_EMPIRICAL` (``"FLAGS: above_empirical"`` in
        ``str(report)``), which :meth:`save` and :meth:`load` keep.

    Returns:
      A :class:`Report`.

    Raises:
      ValueError: a name already used, a ``norm`` other than the report's, a curve over another
        eps grid or other examples, counts
        that are not ``[K]`` integers, outside ``[0, N]``, or above the empirical worst case
        (which is at most ``clean_correct``) without ``allow_above_empirical``: the rule of
        :meth:`from_counts`, applied by one function to both.

    Examples:
      >>> import numpy as np
      >>> r = Report.from_counts(epsilons=np.array([0.1, 0.2], np.float32), n=4,
      ...                        clean_correct=3, robust={"pgd": np.array([2, 1])},
      ...                        worst_case=np.array([2, 1]),
      ...                        info={"pgd": ("pgd-linf", "linf", False)}, flags={"pgd": {}})
      >>> r.with_certified("ibp", np.array([1, 0])).certified["ibp"].robust_accuracy.tolist()
      [0.25, 0.0]
    """
    if name in self.certified:
      raise ValueError(f"The report already has a certified curve {name!r}.")
    if norm is not None and norm != self.worst_case.norm:
      raise ValueError(f"The certified curve is for the {norm} norm and the report's attacks for "
                       f"the {self.worst_case.norm} norm: a bracket compares one threat model. "
                       "Certify in the attacks' norm, or evaluate attacks in the certificate's.")
    if isinstance(certified, Curve):
      if not np.array_equal(np.asarray(certified.epsilons, np.float32), self.epsilons):
        raise ValueError(f"The certified curve's eps grid {np.asarray(certified.epsilons)} is "
                         f"not the report's {self.epsilons}.")
      flags = np.asarray(certified.robust, bool)
      if flags.ndim != 2 or flags.shape[1] != self.num_examples:
        raise ValueError(f"The certified curve's robust flags have shape {flags.shape}; expected "
                         f"[{len(self.epsilons)}, {self.num_examples}] (the report's examples).")
      counts = flags.sum(axis=1, dtype=np.int64)
    else:
      counts = np.asarray(certified)
      if counts.shape != self.epsilons.shape or counts.dtype.kind not in "iu":
        raise ValueError(f"Certified counts must be {len(self.epsilons)} integers (one per eps), "
                         f"got shape {counts.shape} and dtype {counts.dtype}.")
    counts = _check_certified(name, counts, self.epsilons, self.num_examples,
                              self.worst_case.robust_count, allow_above_empirical)
    existing = self._certified_entries()
    existing[name] = (description, norm or self.worst_case.norm, counts,
                      bool(allow_above_empirical))
    return self._rebuild(certified=existing)

  def _certified_entries(self) -> dict[str, tuple[str, str, np.ndarray, bool]]:
    """The certified curves as :meth:`from_counts` takes them (a curve kept above the worst case
    keeps its allowance)."""
    return {k: (s.description, s.norm, s.robust_count, bool(s.flags.get(ABOVE_EMPIRICAL, False)))
            for k, s in self.certified.items()}

  def _rebuild(self, **changes: Any) -> Report:
    attacks = self.attacks
    arguments = dict(
        epsilons=self.epsilons, n=self.num_examples, clean_correct=self.clean_correct,
        robust={n: s.robust_count for n, s in attacks.items()},
        worst_case=self.worst_case.robust_count,
        info={n: (s.description, s.norm, s.minimum_norm) for n, s in attacks.items()},
        flags={n: s.flags for n, s in attacks.items()},
        counts={n: s.counts for n, s in attacks.items()}, per_example=self.per_example,
        timing=self.timing, confidence=self.confidence,
        certified=self._certified_entries(), provenance=self.provenance)
    arguments.update(changes)
    return Report.from_counts(**arguments)

  @property
  def flags(self) -> dict[str, dict[str, bool]]:
    """Attack name -> reliability flags over the whole data set (see :func:`~jaxrobust.metrics.checks.decide_flags`)."""
    return {name: dict(s.flags) for name, s in self.attacks.items()}

  @property
  def diagnosis(self) -> Diagnosis | None:
    """The static gradient-masking diagnosis of the evaluated model
    (:class:`jaxrobust.diagnosis.Diagnosis`, empty when nothing was found), kept in
    :attr:`provenance` under ``"diagnosis"``; ``None`` when there is none (``diagnose=False``,
    a report built from counts, or saved before jaxrobust kept one)."""
    record = self.provenance.get("diagnosis")
    return None if record is None else Diagnosis.from_record(record)

  @property
  def checklist(self) -> tuple[checklist_lib.Item, ...]:
    """The evaluation checklist (:mod:`jaxrobust.checklist`): each reliability check with its
    status (``"pass"``, ``"warn"``, ``"n/a"``) and evidence, from the flags, counts, diagnosis
    and per-example arrays; the first section of ``str(report)``."""
    return checklist_lib.collect(self)

  @property
  def reliable(self) -> bool:
    """``False`` when any attack raised any reliability flag, or when the static diagnosis
    (:attr:`diagnosis`) found an operation of severity ``"error"`` on the path from ``x`` to the
    logits (gradients blocked: gradient attacks may overestimate robustness). Findings of
    severity ``"warning"`` do not change it, nor does a missing diagnosis."""
    flagged = any(v for fl in self.flags.values() for v in fl.values())
    diagnosis = self.diagnosis
    return not flagged and not (diagnosis is not None and diagnosis.errors)

  def curve(self, name: str = WORST_CASE) -> Curve:
    """The :class:`jaxrobust.Curve` of one attack, of the worst case or of a certified curve.

    ``Curve.robust`` holds the per-example flags ``[K, N]`` when the run kept them, else an
    empty ``[K, 0]`` array (always for certified curves).

    Args:
      name: an attack name, ``"worst_case"`` or a certified curve's name.

    Returns:
      A :class:`jaxrobust.Curve` of NumPy arrays.
    """
    if name == WORST_CASE:
      summary = self.worst_case
    elif name in self.attacks:
      summary = self.attacks[name]
    elif name in self.certified:
      summary = self.certified[name]
    else:
      raise ValueError(f"Unknown attack {name!r}; the report has {sorted(self.attacks)}, "
                       f"{WORST_CASE!r} and certified {sorted(self.certified)}.")
    robust = np.zeros((len(self.epsilons), 0), bool)
    if self.per_example is not None and name not in self.certified:
      if name == WORST_CASE:
        robust = self.per_example["worst_case"]
      else:
        robust = self.per_example["robust"][list(self.attacks).index(name)]
    return Curve(epsilons=self.epsilons, clean_accuracy=np.float32(self.clean_accuracy),
                 robust_accuracy=summary.robust_accuracy, robust=robust,
                 auc=np.float32(summary.auc))

  def plot(self, path: os.PathLike | str | None = None, **options: Any) -> Any:
    """Draws the report with matplotlib (extra ``plot``); see :func:`jaxrobust.plotting.plot_report`.

    Args:
      path: where to write the figure (PNG, SVG or PDF by its suffix); ``None`` only returns it.
      **options: passed to :func:`jaxrobust.plotting.plot_report`.

    Returns:
      The ``matplotlib.figure.Figure``.
    """
    from jaxrobust import plotting  # noqa: PLC0415 - matplotlib is an optional extra

    return plotting.plot_report(self, path, **options)

  def to_dict(self, *, include_provenance: bool = True) -> dict[str, Any]:
    """Everything but the per-example arrays and the timing, as JSON-ready Python values."""
    out = {"epsilons": [float(e) for e in self.epsilons], "num_examples": self.num_examples,
           "clean_correct": self.clean_correct, "clean_accuracy": self.clean_accuracy,
           "clean_accuracy_interval": list(self.clean_interval), "confidence": self.confidence,
           "attacks": {name: s.to_dict() for name, s in self.attacks.items()},
           "worst_case": self.worst_case.to_dict(),
           "certified": {name: s.to_dict() for name, s in self.certified.items()},
           "per_example": None if self.per_example is None else sorted(self.per_example)}
    if include_provenance:
      out["provenance"] = dict(self.provenance)
    return out

  def to_json(self, *, include_timing: bool = False, include_provenance: bool = True,
              indent: int | None = 2) -> str:
    """The report as JSON (floats printed exactly, so equal reports give equal text).

    Args:
      include_timing: add the wall-clock statistics (which differ from run to run).
      include_provenance: add :attr:`provenance`.
      indent: passed to :func:`json.dumps`.

    Returns:
      A JSON string.
    """
    out = self.to_dict(include_provenance=include_provenance)
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
    """Reads a report written by :meth:`save` (the inverse of :meth:`save`): ``directory`` is the
    folder :meth:`save` wrote, or its ``report.json``.

    Raises:
      FileNotFoundError: no ``report.json`` there.
    """
    directory = pathlib.Path(directory)
    if directory.name == "report.json" and directory.is_file():
      directory = directory.parent
    if not (directory / "report.json").is_file():
      raise FileNotFoundError(f"no report.json in {directory}: give the folder Report.save (or "
                              "jaxrobust evaluate --out) wrote")
    d = json.loads((directory / "report.json").read_text())
    per_example = None
    if d["per_example"] is not None:
      with np.load(directory / "per_example.npz") as f:
        per_example = {k: f[k] for k in f.files}
    return cls.from_dict(d, per_example=per_example)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any],
                per_example: Mapping[str, np.ndarray] | None = None) -> Report:
    """The report :meth:`to_dict` (or :meth:`to_json`, parsed) describes: the inverse of
    :meth:`to_dict`, with ``per_example``'s arrays (which :meth:`to_dict` only names) and the
    ``"timing"`` of :meth:`to_json` if present. A certified curve above the worst case loads
    with the flag :data:`ABOVE_EMPIRICAL` (as :meth:`with_certified` allowed it, or as a report
    written before the flag was saved holds it); the other rules of :meth:`from_counts` apply.

    Examples:
      >>> import numpy as np
      >>> r = Report.from_counts(epsilons=np.array([0.5], np.float32), n=4, clean_correct=3,
      ...                        robust={"pgd": np.array([2])}, worst_case=np.array([2]),
      ...                        info={"pgd": ("pgd-linf", "linf", False)}, flags={"pgd": {}})
      >>> Report.from_dict(r.to_dict()) == r
      True
    """
    info = {n: (s["description"], s["norm"], s["minimum_norm"]) for n, s in d["attacks"].items()}
    # A stored certified curve above the worst case loads with the flag ABOVE_EMPIRICAL: one that
    # with_certified allowed (flag saved), or from a report written before the flag existed.
    certified = {n: (s["description"], s["norm"], np.asarray(s["robust_count"], np.int64), True)
                 for n, s in d.get("certified", {}).items()}
    return cls.from_counts(
        epsilons=np.asarray(d["epsilons"], np.float32), n=d["num_examples"],
        clean_correct=d["clean_correct"],
        robust={n: np.asarray(s["robust_count"], np.int64) for n, s in d["attacks"].items()},
        worst_case=np.asarray(d["worst_case"]["robust_count"], np.int64), info=info,
        flags={n: s["flags"] for n, s in d["attacks"].items()},
        counts={n: s.get("counts", {}) for n, s in d["attacks"].items()}, per_example=per_example,
        timing=d.get("timing"), confidence=d.get("confidence", 0.95), certified=certified,
        provenance=d.get("provenance"))

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Report):
      return NotImplemented
    if (self.to_json(include_provenance=False)
        != other.to_json(include_provenance=False)):
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
    percent = round(100 * self.confidence)
    lines = [f"jr.Report: {self.num_examples} examples, clean accuracy {self.clean_accuracy:.4f} "
             f"({percent}% CI {self.clean_interval[0]:.4f}-{self.clean_interval[1]:.4f})",
             checklist_lib.section(self.checklist),
             "eps:        " + " ".join(f"{e:8.4g}" for e in self.epsilons)]
    for s in [*self.attacks.values(), self.worst_case, *self.certified.values()]:
      flagged = [k for k, v in s.flags.items() if v]
      label = s.name if s.name not in self.certified else f"cert:{s.name}"
      lines.append(f"{label[:11]:<11} " + " ".join(f"{a:8.4f}" for a in s.robust_accuracy)
                   + f"   AUC {s.auc:.4f}" + (f"   FLAGS: {', '.join(flagged)}" if flagged
                                               else ""))
    if self.diagnosis is not None:  # "Gradient masking (static): ..." (Diagnosis.section)
      lines.append(self.diagnosis.section())
    return "\n".join(lines)
