"""The records of :func:`jaxrobust.diagnose`: the finding kinds (:data:`KINDS`), a
:class:`Finding`, a :class:`Diagnosis` (the tuple of findings, rendered as a table or as a
report's section, written to and read from JSON), and the warning :func:`jaxrobust.evaluate` gives
when a diagnosis has errors.

The analysis that produces them, and the table of kinds, is :mod:`jaxrobust.diagnosis`, which
re-exports every public name here; :mod:`jaxrobust.report` reads the records without it.

Examples:
  >>> d = Diagnosis([Finding("rounding", ERROR, "round", "/src/model.py:12", "round of x",
  ...                        KINDS["rounding"].remedy)])
  >>> Diagnosis.from_record(d.to_record()) == d, d[0].place, len(d.errors)
  (True, 'model.py:12', 1)
  >>> print(Diagnosis().section())
  Gradient masking (static): none found
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any, Iterable, NamedTuple

ERROR, WARNING = "error", "warning"

_SQUARE = "a gradient-free attack (jr.attacks.square)"


class Kind(NamedTuple):
  """What a finding's kind means: its ``severity`` and the ``remedy`` every such finding gets."""

  severity: str
  remedy: str


KINDS: dict[str, Kind] = {
    "stop_gradient": Kind(ERROR, "Remove it from the model that is attacked, or attack through "
                                 "it with BPDA (the identity in the backward pass); confirm "
                                 f"with {_SQUARE}."),
    "rounding": Kind(ERROR, "BPDA: differentiate a smooth stand-in in the backward pass (the "
                            "identity for round/floor/ceil, e.g. a straight-through "
                            f"custom_vjp used only by the attack); confirm with {_SQUARE}."),
    "index": Kind(ERROR, "BPDA with a soft selection (softmax weights instead of the argmax or "
                         f"argsort indices), or {_SQUARE}."),
    "integer_cast": Kind(ERROR, "BPDA (straight-through: the identity in the backward pass), or "
                                f"{_SQUARE}."),
    "loop": Kind(ERROR, "Attack a fixed number of iterations (lax.fori_loop with static bounds, "
                        f"lax.scan), BPDA through the loop, or {_SQUARE}."),
    "comparison": Kind(WARNING, "Harmless where the pieces meet (a ReLU written with jnp.where); "
                                "where they jump (thresholds, detectors, input gating), check "
                                f"with {_SQUARE} and more restarts."),
    "rank_mask": Kind(WARNING, f"Use {_SQUARE} and many restarts; a gradient attack needs BPDA "
                               "through a smooth relaxation of the mask (Tramer et al. 2020)."),
    "custom_derivative": Kind(WARNING, "Check the rule against the function "
                                       "(jax.test_util.check_grads, finite differences); if it "
                                       "differs on purpose, attack the function without it "
                                       f"(BPDA) and confirm with {_SQUARE}."),
    "random": Kind(WARNING, "EOT: average gradients over draws (jr.attacks.eot on a randomized "
                            "logits_fn(x, keys)) and judge by majority vote; a fixed key "
                            "evaluates another, deterministic model."),
}
"""Every finding kind with its severity and remedy (the table in :mod:`jaxrobust.diagnosis`)."""


class Finding(NamedTuple):
  """One operation on the path from ``x`` to the logits that blocks or falsifies gradients.

  Attributes:
    kind: a key of :data:`KINDS` (``"stop_gradient"``, ``"rounding"``, ``"index"``,
      ``"integer_cast"``, ``"loop"``, ``"comparison"``, ``"rank_mask"``,
      ``"custom_derivative"``, ``"random"``).
    severity: ``"error"`` (no gradient through it) or ``"warning"`` (a gradient that may mislead).
    primitive: the JAX primitive's name (``"round"``, ``"argmax"``, ``"custom_vjp_call"``...).
    location: ``"file:line"`` of the user's code that created it, ``"unknown"`` if JAX kept no
      frames.
    message: what it is and why it matters.
    remedy: what to do (the kind's :data:`KINDS` remedy).
  """

  kind: str
  severity: str
  primitive: str
  location: str
  message: str
  remedy: str

  @property
  def file(self) -> str:
    """The file of :attr:`location` (``"unknown"`` when there is none)."""
    return self.location.rpartition(":")[0] or self.location

  @property
  def line(self) -> int | None:
    """The line of :attr:`location`, ``None`` when unknown."""
    tail = self.location.rpartition(":")[2]
    return int(tail) if tail.isdigit() else None

  @property
  def place(self) -> str:
    """``"file.py:line"`` (the file's base name), or :attr:`location` when the line is unknown."""
    return f"{os.path.basename(self.file)}:{self.line}" if self.line is not None else self.location


class Diagnosis(tuple):
  """The findings of :func:`jaxrobust.diagnose`, a tuple of :class:`Finding` in program order: empty
  (``len(d) == 0``, falsy) for a model with nothing on the path from ``x`` to the logits.

  ``str(d)`` (:meth:`summary`) is a table, one finding per line with its remedy below.
  """

  def __new__(cls, findings: Iterable[Finding] = ()) -> Diagnosis:
    return super().__new__(cls, tuple(findings))

  @property
  def findings(self) -> tuple[Finding, ...]:
    """The findings as a plain tuple."""
    return tuple(self)

  @property
  def errors(self) -> tuple[Finding, ...]:
    """The findings of severity ``"error"``: gradients are blocked there."""
    return tuple(f for f in self if f.severity == ERROR)

  @property
  def warnings(self) -> tuple[Finding, ...]:
    """The findings of severity ``"warning"``: gradients may mislead there."""
    return tuple(f for f in self if f.severity == WARNING)

  def summary(self) -> str:
    """A readable table: severity, kind, primitive, location and message, the remedy below."""
    if not self:
      return "No gradient-masking operation on the path from x to the logits."
    head = (f"{_count(len(self), 'gradient-masking operation')} on the path from x to the "
            f"logits ({_count(len(self.errors), 'error')}, "
            f"{_count(len(self.warnings), 'warning')}):")
    lines = [head]
    for f in self:
      lines.append(f"  {f.severity:<8} {f.kind:<17} {f.primitive:<16} {f.place}  {f.message}")
      lines.append(f"  {'':<8} remedy: {f.remedy}")
    return "\n".join(lines)

  def section(self) -> str:
    """The ``Gradient masking (static)`` section of a report's text (:class:`jaxrobust.Report`,
    ``jaxrobust evaluate``): ``none found``, or a count and one line per finding (severity,
    kind, primitive, place, remedy)."""
    if not self:
      return f"{SECTION}: none found"
    lines = [f"{SECTION}: {_count(len(self.errors), 'error')}, "
             f"{_count(len(self.warnings), 'warning')}"]
    lines += [f"  {f.severity:<8} {f.kind:<17} {f.primitive:<16} {f.place}  {f.remedy}"
              for f in self]
    return "\n".join(lines)

  def to_record(self) -> dict[str, Any]:
    """JSON-ready: ``{"findings": [{"kind": ..., "severity": ..., "primitive": ...,
    "location": ..., "message": ..., "remedy": ...}, ...]}`` (:meth:`from_record` reads it)."""
    return {"findings": [dict(f._asdict()) for f in self]}

  @classmethod
  def from_record(cls, record: Mapping[str, Any]) -> Diagnosis:
    """The diagnosis :meth:`to_record` wrote."""
    return cls(Finding(**{field: str(f[field]) for field in Finding._fields})
               for f in record["findings"])

  def __str__(self) -> str:
    return self.summary()

  def __repr__(self) -> str:
    return f"Diagnosis({tuple(self)!r})"


SECTION = "Gradient masking (static)"
"""The title of a diagnosis's section in a report's text (:meth:`Diagnosis.section`)."""


def _count(n: int, what: str) -> str:
  return f"{n} {what}{'s' if n != 1 else ''}"


class GradientMaskingWarning(UserWarning):
  """:func:`jaxrobust.evaluate`'s model has operations of severity ``"error"`` on the path from
  ``x`` to the logits (see :func:`warn_if_masked`)."""


def warn_if_masked(diagnosis: Diagnosis, *, where: str, stacklevel: int = 2) -> None:
  """Warns (:class:`GradientMaskingWarning`, once per call) when ``diagnosis`` has findings of
  severity ``"error"``, naming each with its place and the remedy of each kind; nothing
  otherwise."""
  errors = diagnosis.errors
  if not errors:
    return
  remedies = dict.fromkeys(f"{f.kind}: {f.remedy}" for f in errors)
  warnings.warn(
      f"{where}: {_count(len(errors), 'gradient-blocking operation')} on the path from x to the "
      f"logits ({', '.join(f'{f.kind} ({f.primitive}) at {f.place}' for f in errors)}): "
      "gradient attacks cannot see through them, so the robust accuracy may be overestimated "
      f"and Report.reliable is False. Remedy: {' '.join(remedies)} Report.diagnosis lists every "
      "finding; diagnose=False skips the diagnosis.", GradientMaskingWarning,
      stacklevel=stacklevel + 1)
