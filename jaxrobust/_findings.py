"""The records of :func:`jaxrobust.diagnose`: the finding kinds (:data:`KINDS`), a
:class:`Finding` and a :class:`Diagnosis` (the tuple of findings, rendered as a table).

The analysis that produces them, and the table of kinds, is :mod:`jaxrobust.diagnosis`, which
re-exports every public name here.

Examples:
  >>> d = Diagnosis([Finding("rounding", ERROR, "round", "/src/model.py:12", "round of x",
  ...                        KINDS["rounding"].remedy)])
  >>> d[0].line, len(d.errors), len(d.warnings)
  (12, 1, 0)
"""

from __future__ import annotations

import os
from typing import Iterable, NamedTuple

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
    count = lambda n, what: f"{n} {what}{'s' if n != 1 else ''}"  # noqa: E731
    head = (f"{count(len(self), 'gradient-masking operation')} on the path from x to the logits "
            f"({count(len(self.errors), 'error')}, {count(len(self.warnings), 'warning')}):")
    lines = [head]
    for f in self:
      place = f"{os.path.basename(f.file)}:{f.line}" if f.line is not None else f.location
      lines.append(f"  {f.severity:<8} {f.kind:<17} {f.primitive:<16} {place}  {f.message}")
      lines.append(f"  {'':<8} remedy: {f.remedy}")
    return "\n".join(lines)

  def __str__(self) -> str:
    return self.summary()

  def __repr__(self) -> str:
    return f"Diagnosis({tuple(self)!r})"
