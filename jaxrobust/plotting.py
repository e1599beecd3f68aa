r"""Plots of robustness reports and curves (matplotlib, the optional extra ``plot``).

A robustness curve is drawn from the clean accuracy at :math:`\epsilon = 0` through the robust
accuracy at every eps of the grid, with its exact two-sided binomial confidence band
(Clopper--Pearson, :func:`jaxrobust.metrics.binomial_interval`):

* the per-example worst case over the attacks, solid, with its band;
* each attack alone (the per-attack breakdown), dashed, when there is more than one;
* each certified curve (a lower bound on the true robust accuracy), dotted, and the region between
  the best certified curve and the empirical worst case shaded: the true robust accuracy of the
  model on these examples lies inside it;
* in a second panel, the histogram of the per-example minimal adversarial norms
  :math:`\epsilon^*` of each minimum-norm attack (clean-correct examples; those for which no
  adversarial point was found are counted in the legend), when the report kept them
  (``keep_per_example=True``).

The arrays drawn are those of :func:`series` (and :func:`eps_star_histograms`), so what a plot
shows can be checked without looking at it. Figures are built with ``matplotlib.figure.Figure``,
not ``pyplot``: nothing depends on, or changes, a global backend or figure state.

Examples:
  >>> import numpy as np
  >>> import jaxrobust as jr
  >>> report = jr.Report.from_counts(
  ...     epsilons=np.array([0.1, 0.2], np.float32), n=100, clean_correct=90,
  ...     robust={"pgd": np.array([60, 30])}, worst_case=np.array([60, 30]),
  ...     info={"pgd": ("pgd-linf", "linf", False)}, flags={"pgd": {}})
  >>> s = series(report)["worst case"]
  >>> s.eps.round(3).tolist(), s.accuracy.round(3).tolist()  # from (0, clean accuracy)
  ([0.0, 0.1, 0.2], [0.9, 0.6, 0.3])
  >>> figure = report.plot()  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from jaxrobust import metrics
from jaxrobust._types import Curve

WORST_CASE_LABEL = "worst case"


class Series(NamedTuple):
  """One drawn curve: ``eps [P]`` (sorted, starting at 0 for empirical curves), ``accuracy [P]``,
  its confidence band ``lower [P]``/``upper [P]`` and ``kind`` (``"worst_case"``, ``"attack"``
  or ``"certified"``)."""

  eps: np.ndarray
  accuracy: np.ndarray
  lower: np.ndarray
  upper: np.ndarray
  kind: str


def _empirical(epsilons, clean, clean_interval, accuracy, interval, kind) -> Series:
  """Sorted by eps, with the clean point at eps 0 prepended (unless the grid has 0 already,
  where the robust accuracy is the clean accuracy)."""
  order = np.argsort(epsilons, kind="stable")
  eps = np.asarray(epsilons, np.float64)[order]
  accuracy = np.asarray(accuracy, np.float64)[order]
  interval = np.asarray(interval, np.float64)[order]
  if eps.size == 0 or eps[0] > 0:
    eps = np.concatenate([[0.0], eps])
    accuracy = np.concatenate([[clean], accuracy])
    interval = np.concatenate([[clean_interval], interval])
  return Series(eps, accuracy, interval[:, 0], interval[:, 1], kind)


def series(report: Any) -> dict[str, Series]:
  """The curves :func:`plot_report` draws, by legend label.

  Args:
    report: a :class:`jaxrobust.Report`.

  Returns:
    ``"worst case"`` first, then one entry per attack (only when there are several), then one per
    certified curve (labelled ``"certified: <name>"``; drawn over the eps grid only, since a
    certifier's accuracy at radius 0 is not the classifier's).
  """
  clean, clean_interval = report.clean_accuracy, report.clean_interval
  out = {WORST_CASE_LABEL: _empirical(report.epsilons, clean, clean_interval,
                                      report.worst_case.robust_accuracy,
                                      report.worst_case.robust_interval, "worst_case")}
  if len(report.attacks) > 1:
    for name, summary in report.attacks.items():
      out[name] = _empirical(report.epsilons, clean, clean_interval, summary.robust_accuracy,
                             summary.robust_interval, "attack")
  order = np.argsort(report.epsilons, kind="stable")
  for name, summary in report.certified.items():
    interval = np.asarray(summary.robust_interval, np.float64)[order]
    out[f"certified: {name}"] = Series(
        np.asarray(report.epsilons, np.float64)[order],
        np.asarray(summary.robust_accuracy, np.float64)[order], interval[:, 0], interval[:, 1],
        "certified")
  return out


def eps_star_histograms(report: Any) -> dict[str, tuple[np.ndarray, int]]:
  """Minimum-norm attack name -> (finite :math:`\\epsilon^*` of the clean-correct examples,
  number of clean-correct examples with no adversarial point found), from ``per_example``
  (empty when the report did not keep it)."""
  per = report.per_example
  if per is None:
    return {}
  correct = np.asarray(per["correct"], bool)
  out = {}
  for name, summary in report.attacks.items():
    key = f"eps_star/{name}"
    if summary.minimum_norm and key in per:
      norms = np.asarray(per[key], np.float64)[correct]
      out[name] = (norms[np.isfinite(norms)], int(np.sum(~np.isfinite(norms))))
  return out


def _eps_label(report: Any) -> str:
  threat = report.provenance.get("threat_model", {}) if report.provenance else {}
  norm = threat.get("norm", report.worst_case.norm)
  box = threat.get("box")
  where = f", inputs in [{box[0]:g}, {box[1]:g}]" if box else ""
  return f"eps ({norm.replace('linf', 'L∞').replace('l2', 'L2').replace('l1', 'L1')} radius{where})"


def _figure(panels: int):
  try:
    from matplotlib.figure import Figure  # noqa: PLC0415 - optional extra
  except ImportError as error:
    raise ImportError("Plotting needs matplotlib: pip install 'jaxrobust[plot]'.") from error
  figure = Figure(figsize=(6.4 * panels, 4.8), layout="constrained")
  return figure, [figure.add_subplot(1, panels, i + 1) for i in range(panels)]


def _draw(ax, label: str, s: Series, color, *, band: bool = True, style: str = "-",
          width: float = 2.0) -> None:
  marker = "o" if len(s.eps) < 20 else None
  ax.plot(s.eps, s.accuracy, style, color=color, lw=width, marker=marker, ms=4, label=label,
          gid=label)
  if band:
    ax.fill_between(s.eps, s.lower, s.upper, color=color, alpha=0.18, lw=0, gid=f"band:{label}")


def _save(figure, path: os.PathLike | str | None):
  if path is not None:
    figure.savefig(os.fspath(path), dpi=120)
  return figure


def plot_report(report: Any, path: os.PathLike | str | None = None, *,
                title: str | None = None, per_attack: bool = True) -> Any:
  """Draws a :class:`jaxrobust.Report`: curves with bands, breakdown, certified bracket, ε*.

  Args:
    report: the report.
    path: where to write the figure (the format from the suffix); ``None`` only returns it.
    title: the figure's title (default: the number of examples and the confidence level).
    per_attack: draw each attack's curve when there are several.

  Returns:
    The ``matplotlib.figure.Figure``; its first axes hold the curves (each line's label and
    ``gid`` is its key in :func:`series`; each band's ``gid`` is ``"band:<label>"``).
  """
  drawn = series(report)
  histograms = eps_star_histograms(report)
  figure, axes = _figure(2 if histograms else 1)
  ax = axes[0]
  colors = iter(f"C{i}" for i in range(1, 100))
  certified = []
  for label, s in drawn.items():
    if s.kind == "worst_case":
      name = WORST_CASE_LABEL if len(report.attacks) > 1 else next(iter(report.attacks))
      _draw(ax, label, s, "C0")
      ax.lines[-1].set_label(f"{name} (worst case)" if name != WORST_CASE_LABEL else label)
    elif s.kind == "attack" and per_attack:
      _draw(ax, label, s, next(colors), band=False, style="--", width=1.2)
    elif s.kind == "certified":
      _draw(ax, label, s, next(colors), band=False, style=":", width=2.0)
      certified.append(s)
  if certified:  # the bracket: best certified (lower) to worst-case empirical (upper)
    worst = drawn[WORST_CASE_LABEL]
    best = np.max([c.accuracy for c in certified], axis=0)
    upper = np.interp(certified[0].eps, worst.eps, worst.accuracy)
    ax.fill_between(certified[0].eps, best, upper, color="0.5", alpha=0.25, hatch="//", lw=0,
                    label="true robust accuracy lies here", gid="bracket")
  percent = round(100 * report.confidence)
  ax.set_xlabel(_eps_label(report))
  ax.set_ylabel("accuracy")
  ax.set_ylim(-0.02, 1.02)
  ax.set_xlim(left=0.0)
  ax.grid(alpha=0.3)
  ax.legend(loc="best", fontsize="small", title=f"bands: {percent}% exact binomial CI",
            title_fontsize="small")
  ax.set_title(title or f"Robust accuracy on {report.num_examples} examples "
               f"(clean {report.clean_accuracy:.3f})")
  if histograms:
    hist_ax = axes[1]
    for i, (name, (norms, not_found)) in enumerate(histograms.items()):
      hist_ax.hist(norms, bins=30, alpha=0.6, color=f"C{i}",
                   label=f"{name}: {len(norms)} found, {not_found} not found", gid=f"eps*:{name}")
    hist_ax.set_xlabel(f"minimal adversarial ε* ({_eps_label(report)[5:-1]})")
    hist_ax.set_ylabel("clean-correct examples")
    hist_ax.set_title("Minimal adversarial perturbations")
    hist_ax.legend(fontsize="small")
  return _save(figure, path)


def plot_curves(curves: Mapping[str, Curve], path: os.PathLike | str | None = None, *,
                confidence: float = 0.95, xlabel: str = "eps", title: str | None = None) -> Any:
  """Draws :class:`jaxrobust.Curve` objects on one axes, each from ``(0, clean accuracy)``.

  A curve that kept its per-example flags (``robust [K, B]`` with ``B > 0``) gets its binomial
  band over its ``B`` examples (the clean accuracy's count is ``round(clean_accuracy * B)``).

  Args:
    curves: label -> curve.
    path: where to write the figure; ``None`` only returns it.
    confidence: the bands' level.
    xlabel: the eps axis label (say the norm and the units).
    title: the figure's title.

  Returns:
    The ``matplotlib.figure.Figure`` (lines labelled and ``gid``-ed by their keys).
  """
  figure, (ax,) = _figure(1)
  for i, (label, curve) in enumerate(curves.items()):
    robust = np.asarray(curve.robust)
    accuracy = np.asarray(curve.robust_accuracy, np.float64)
    clean = float(curve.clean_accuracy)
    n = robust.shape[-1] if robust.ndim == 2 else 0
    if n:
      counts = robust.sum(axis=1)
      interval = metrics.binomial_interval_table(np.concatenate([[round(clean * n)], counts]),
                                                n, confidence)
    else:
      interval = np.stack([np.concatenate([[clean], accuracy])] * 2, -1)
    s = _empirical(np.asarray(curve.epsilons), clean, interval[0], accuracy, interval[1:],
                   "attack")
    _draw(ax, label, s, f"C{i}", band=bool(n))
  ax.set_xlabel(xlabel)
  ax.set_ylabel("accuracy")
  ax.set_ylim(-0.02, 1.02)
  ax.set_xlim(left=0.0)
  ax.grid(alpha=0.3)
  ax.legend(loc="best", fontsize="small")
  if title:
    ax.set_title(title)
  return _save(figure, path)


def plot_reports(reports: Mapping[str, Any], path: os.PathLike | str | None = None, *,
                 title: str | None = None) -> Any:
  """Overlays the worst-case curves (with bands) and certified curves of several reports, e.g.
  two models or two runs (``jaxrobust compare``).

  Args:
    reports: label -> :class:`jaxrobust.Report`.
    path: where to write the figure; ``None`` only returns it.
    title: the figure's title.

  Returns:
    The ``matplotlib.figure.Figure`` (worst-case lines labelled and ``gid``-ed by the report's
    label, certified ones by ``"<label> certified: <name>"``).
  """
  figure, (ax,) = _figure(1)
  labels = set()
  for i, (label, report) in enumerate(reports.items()):
    for key, s in series(report).items():
      if s.kind == "worst_case":
        _draw(ax, label, s, f"C{i}")
      elif s.kind == "certified":
        _draw(ax, f"{label} {key}", s, f"C{i}", band=False, style=":")
    labels.add(_eps_label(report))
  ax.set_xlabel(" / ".join(sorted(labels)))
  ax.set_ylabel("accuracy (worst case over attacks)")
  ax.set_ylim(-0.02, 1.02)
  ax.set_xlim(left=0.0)
  ax.grid(alpha=0.3)
  ax.legend(loc="best", fontsize="small")
  ax.set_title(title or "Robust accuracy (bands: exact binomial CI)")
  return _save(figure, path)
