r"""The evaluation checklist: the reliability evidence of a :class:`jaxrobust.Report`, one line each.

An empirical robust accuracy is an upper bound on the truth, and only as good as the attacks
behind it: gradient masking, non-finite values or a randomized model make gradient attacks fail
where the model is not robust (Athalye et al. 2018; Carlini et al. 2019). The checks a
reviewer asks for are scattered over a report (every attack's flags and counts, the static
diagnosis of the model, the per-example minimal norms); :func:`collect` gathers them into
:class:`Item`\ s, each ``"pass"``, ``"warn"`` or ``"n/a"`` (the report holds no evidence either
way) with its evidence:

============================  ==================================================================
check                         passes when
============================  ==================================================================
static gradient masking       the model's jaxpr holds no gradient-blocking operation on the path
                              from ``x`` to the logits (:func:`jaxrobust.diagnose`)
finite gradients              no clean-correct example has a non-finite input gradient
finite clean logits           no example has a NaN/Inf clean logit
finite adversarial points     every attacked example came back as a finite point
finite adversarial logits     every returned point has finite logits
zero gradients                no clean-correct point has an exactly zero input gradient
deterministic model           AutoAttack's two clean passes agree
logits, not probabilities     the outputs are not rows of probabilities (flat gradients)
black box below white box     AutoAttack's Square broke at most 0.2% of the examples every
                              gradient attack missed
unbounded eps reaches 0%      every minimum-norm attack found an adversarial point for every
                              clean-correct example (or the worst case reaches 0 on the grid)
fixed budget vs minimum norm  no example that a minimum-norm attack broke within an eps of the
                              grid survives every fixed-budget attack there (per-example arrays)
============================  ==================================================================

The clean pass's checks (gradients, clean logits, probabilities) come with every attack on a
deterministic model (:func:`jaxrobust.engine.scoring.clean_checks`; a randomized model's are
``n/a``: one draw's gradient says nothing of the expectation its attacks ascend), the returned
points' with every attack; items that need AutoAttack's own checks are ``n/a`` without an
``auto_attack`` attack; the last needs ``keep_per_example=True``. Robust accuracy non-increasing
in eps holds by construction in a report (a point broken at an eps counts as broken at every
larger one) and across iterations is not recorded: neither is a line here.

Examples:
  >>> import numpy as np
  >>> from jaxrobust.report import Report
  >>> r = Report.from_counts(epsilons=np.array([0.1, 0.2], np.float32), n=4, clean_correct=3,
  ...                        robust={"fmn": np.array([2, 0])}, worst_case=np.array([2, 0]),
  ...                        info={"fmn": ("fmn-linf", "linf", True)},
  ...                        flags={"fmn": {"non_finite_gradients": False,
  ...                                       "minimum_norm_not_found": False}},
  ...                        counts={"fmn": {"minimum_norm_not_found": np.array(0),
  ...                                        "non_finite_gradient_points": np.array(0)}})
  >>> [(i.check, i.status) for i in collect(r) if i.status != "n/a"]
  [('finite gradients', 'pass'), ('unbounded eps reaches 0%', 'pass')]

References:
  Athalye, Carlini & Wagner, "Obfuscated Gradients Give a False Sense of Security", ICML 2018.
  Carlini et al., "On Evaluating Adversarial Robustness", arXiv:1902.06705, 2019 (the checklist).
  Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse
  parameter-free attacks", ICML 2020 (AutoAttack's checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

PASS, WARN, NOT_AVAILABLE = "pass", "warn", "n/a"
SECTION = "Checklist"
# The clean pass's checks are skipped for a randomized model (scoring.clean_diagnosis): "n/a".
DETERMINISTIC = "every jr.run on a deterministic model"


class Item(NamedTuple):
  """One line of the checklist: ``status`` is ``"pass"``, ``"warn"`` or ``"n/a"``."""

  check: str
  status: str
  evidence: str


def _total(counts: Mapping[str, Any], name: str) -> int:
  """A count summed over the data set; per-eps counts (``[K]``) by their largest entry (the
  eps where most examples were affected)."""
  return int(np.max(np.asarray(counts[name]))) if name in counts else 0


def _flagged(report: Any, flag: str, count: str | None, what: str, check: str,
             ok: str, source: str = "auto_attack") -> Item:
  """An item from one flag raised by some attacks (``n/a`` when no attack reports it; ``source``
  names the attacks that do)."""
  having = {name: s for name, s in report.attacks.items()
            if flag in s.flags and (count is None or count in s.counts or s.flags[flag])}
  if not having:  # (a flag without its count: the check did not run, e.g. no Square member)
    return Item(check, NOT_AVAILABLE, f"no attack here reports {flag} ({source} does)")
  raised = [name for name, s in having.items() if s.flags[flag]]
  if not raised:
    return Item(check, PASS, ok)
  detail = ", ".join(f"{name}: {_total(having[name].counts, count)} {what}" if count else name
                     for name in raised)
  return Item(check, WARN, f"raised by {detail}")


def _static(report: Any) -> Item:
  diagnosis = report.diagnosis
  check = "static gradient masking"
  if diagnosis is None:
    return Item(check, NOT_AVAILABLE, "no diagnosis (jr.evaluate(..., diagnose=True) makes one)")
  if diagnosis.errors:
    places = ", ".join(f"{f.kind} at {f.place}" for f in diagnosis.errors)
    return Item(check, WARN, f"{len(diagnosis.errors)} blocking operation(s): {places}")
  return Item(check, PASS, f"none blocking ({len(diagnosis.warnings)} warning(s))")


def _unbounded(report: Any) -> Item:
  check = "unbounded eps reaches 0%"
  searches = {name: s for name, s in report.attacks.items() if s.minimum_norm}
  missed = {name: _total(s.counts, "minimum_norm_not_found") for name, s in searches.items()
            if "minimum_norm_not_found" in s.flags}
  if missed:
    if any(missed.values()):
      detail = ", ".join(f"{name} missed {m}" for name, m in missed.items() if m)
      return Item(check, WARN, f"clean-correct examples without any adversarial point: {detail}")
    return Item(check, PASS, f"{', '.join(missed)} found a point for every clean-correct "
                             "example")
  largest = int(np.argmax(report.epsilons)) if len(report.epsilons) else None
  if largest is not None and report.worst_case.robust_count[largest] == 0:
    return Item(check, PASS, f"the worst case is 0 at eps {float(report.epsilons[largest]):g}")
  return Item(check, NOT_AVAILABLE, "no minimum-norm attack, and the grid's largest eps leaves "
                                    "examples robust")


def _agreement(report: Any) -> Item:
  """Examples a minimum-norm attack broke within eps_k that every fixed-budget attack missed at
  eps_k: the fixed-budget attacks are weak there (or the minimum-norm point is wrong)."""
  check = "fixed budget vs minimum norm"
  names = list(report.attacks)
  fixed = [i for i, n in enumerate(names) if not report.attacks[n].minimum_norm]
  searches = [n for n in names if report.attacks[n].minimum_norm]
  per_example = report.per_example
  if per_example is None or not fixed or not searches:
    return Item(check, NOT_AVAILABLE, "needs both kinds of attack and keep_per_example=True")
  eps = np.asarray(report.epsilons, np.float64)
  survived = np.all(np.asarray(per_example["robust"])[fixed], axis=0)  # [K, N]
  broken_within = np.any([np.asarray(per_example[f"eps_star/{n}"], np.float64)[None, :]
                          <= eps[:, None] for n in searches], axis=0)  # [K, N]
  missed = (survived & broken_within & np.asarray(per_example["correct"])[None, :]).sum(axis=1)
  if missed.max() == 0:
    return Item(check, PASS, "every example a minimum-norm attack broke within an eps was broken "
                             "there by a fixed-budget attack")
  k = int(np.argmax(missed))
  return Item(check, WARN, f"{int(missed[k])} example(s) at eps {eps[k]:g} broken by a "
                           "minimum-norm attack survive every fixed-budget attack")


def collect(report: Any) -> tuple[Item, ...]:
  """The checklist of ``report`` (a :class:`jaxrobust.Report`, :attr:`~jaxrobust.Report.checklist`),
  in the order of the module's table."""
  return (
      _static(report),
      _flagged(report, "non_finite_gradients", "non_finite_gradient_points", "points",
               "finite gradients", "no clean-correct example with a non-finite gradient",
               DETERMINISTIC),
      _flagged(report, "non_finite_logits", "non_finite_logits", "examples",
               "finite clean logits", "no example with a NaN/Inf clean logit", DETERMINISTIC),
      _flagged(report, "non_finite_adversarials", "non_finite_adversarials", "points",
               "finite adversarial points", "every attacked example came back finite",
               "every jr.run"),
      _flagged(report, "non_finite_adversarial_logits", "non_finite_adversarial_logits",
               "points", "finite adversarial logits", "every returned point has finite logits",
               "every jr.run"),
      _flagged(report, "zero_gradients", "zero_gradient_points", "points", "zero gradients",
               "no clean-correct point with an exactly zero gradient", DETERMINISTIC),
      _flagged(report, "randomized", None, "", "deterministic model",
               "two clean passes agree"),
      _flagged(report, "probability_outputs", None, "", "logits, not probabilities",
               "the outputs are not probability rows", DETERMINISTIC),
      _flagged(report, "square_beats_white_box", "square_only_points", "points",
               "black box below white box", "Square broke at most 0.2% beyond the gradient "
                                            "attacks", "auto_attack standard or plus"),
      _unbounded(report),
      _agreement(report),
  )


def section(items: tuple[Item, ...]) -> str:
  """The checklist as the first section of a report's text: one line per item."""
  width = max(len(i.check) for i in items)
  return "\n".join([f"{SECTION}:"] + [f"  {i.status:<4} {i.check:<{width}}  {i.evidence}"
                                      for i in items])
