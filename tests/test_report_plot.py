"""``jr.Report`` intervals, provenance and certified curves; ``Report.plot`` and ``jr.plotting``.

The plots are checked through the data they draw (line and band coordinates read back from the
matplotlib artists), not only through the file's existence.
"""

from __future__ import annotations

import json
import math

import jax
import matplotlib.image
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from scipy import stats

import jaxrobust as jr

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

EPS = np.array([0.3, 0.1, 0.2], np.float32)  # unsorted on purpose: plots sort by eps
N = 50


def clopper_pearson(k, n, confidence=0.95):
  k = np.asarray(k)
  alpha = 1 - confidence
  lo = np.where(k == 0, 0.0, stats.beta.ppf(alpha / 2, np.maximum(k, 1), n - k + 1))
  hi = np.where(k == n, 1.0, stats.beta.ppf(1 - alpha / 2, k + 1, np.maximum(n - k, 1)))
  return np.stack([lo, hi], -1)


def make_report(*, per_example=False, min_norm=False):
  rng = np.random.default_rng(0)
  correct = np.arange(N) >= 5  # 45 clean-correct
  eps_star = np.where(rng.uniform(size=N) < 0.9, rng.uniform(0.0, 0.4, size=N), np.inf)
  robust_fmn = correct[None, :] & (eps_star[None, :] > EPS[:, None])
  robust_pgd = robust_fmn & (rng.uniform(size=(len(EPS), N)) < 0.9)
  robust_pgd = np.stack([robust_pgd[k] & np.all(  # monotone in eps: robust at larger => smaller
      robust_pgd[EPS <= EPS[k]], axis=0) for k in range(len(EPS))])
  worst = robust_pgd & robust_fmn
  per = None
  if per_example:
    per = {"index": np.arange(N), "correct": correct,
           "robust": np.stack([robust_pgd, robust_fmn]), "worst_case": worst,
           "eps_star/fmn": eps_star.astype(np.float32)}
  return jr.Report.from_counts(
      epsilons=EPS, n=N, clean_correct=int(correct.sum()),
      robust={"pgd": robust_pgd.sum(1), "fmn": robust_fmn.sum(1)}, worst_case=worst.sum(1),
      info={"pgd": ("pgd-linf", "linf", False), "fmn": ("fmn-linf", "linf", min_norm)},
      flags={"pgd": {}, "fmn": {}}, per_example=per,
      provenance={"threat_model": {"norm": "linf", "box": [0.0, 1.0]}})


def test_every_accuracy_has_its_exact_interval():
  r = make_report()
  np.testing.assert_allclose(r.clean_interval, clopper_pearson(45, N), atol=2e-6)
  for s in [*r.attacks.values(), r.worst_case]:
    np.testing.assert_allclose(s.robust_interval, clopper_pearson(s.robust_count, N), atol=2e-6)
    assert np.all(s.robust_interval[:, 0] <= s.robust_accuracy)
    assert np.all(s.robust_accuracy <= s.robust_interval[:, 1])
  narrow = jr.Report.from_counts(epsilons=EPS, n=N, clean_correct=45, robust={"a": np.array(
      [10, 30, 20])}, worst_case=np.array([10, 30, 20]), info={"a": ("a", "linf", False)},
      flags={}, confidence=0.5)  # EPS = [0.3, 0.1, 0.2]: non-increasing in eps
  np.testing.assert_allclose(narrow.worst_case.robust_interval,
                             clopper_pearson([10, 30, 20], N, 0.5), atol=2e-6)
  with pytest.raises(ValueError, match="confidence"):
    jr.Report.from_counts(epsilons=EPS, n=N, clean_correct=45, robust={}, worst_case=np.zeros(3),
                          info={}, flags={}, confidence=1.0)


def _binomial_tail(k: int, n: int, p: float, upward: bool) -> float:
  """P[X >= k] (``upward``) or P[X <= k] for X ~ Bin(n, p), by the exact sum in float64."""
  terms = range(k, n + 1) if upward else range(0, k + 1)
  return math.fsum(math.comb(n, j) * p**j * (1.0 - p) ** (n - j) for j in terms)


def test_binomial_interval_table_solves_the_clopper_pearson_equations():
  """Each bound of the host table solves its defining equation, P_L[X >= k] = P_U[X <= k] =
  alpha / 2 (exact binomial sums, not SciPy), with L = 0 at k = 0 and U = 1 at k = n."""
  rng = np.random.default_rng(1)
  n = rng.integers(0, 60, size=40)
  k = rng.integers(0, n + 1)
  table = jr.metrics.binomial_interval_table(k, n, 0.9)
  assert table.shape == (40, 2) and table.dtype == np.float64
  for (lower, upper), ki, ni in zip(table, k.tolist(), n.tolist()):
    if ki == 0:
      assert lower == 0.0
    else:
      assert _binomial_tail(ki, ni, lower, upward=True) == pytest.approx(0.05, rel=1e-9)
    if ki == ni:
      assert upper == 1.0
    else:
      assert _binomial_tail(ki, ni, upper, upward=False) == pytest.approx(0.05, rel=1e-9)
  assert jr.metrics.binomial_interval_table(np.zeros((2, 3), int), 4).shape == (2, 3, 2)


def test_binomial_interval_table_agrees_with_the_float32_path_at_any_size():
  """The host table (float64, SciPy) and ``binomial_interval`` (float32, its own incomplete beta
  function) agree to float32 accuracy, also for host counts past int32; the table bounds the
  first of those against SciPy's beta quantiles (``stats.beta.ppf``) to float64 accuracy."""
  rng = np.random.default_rng(2)
  n = rng.integers(1, 10_000, size=40)
  k = rng.integers(0, n + 1)
  lower, upper = jr.metrics.binomial_interval(k, n, 0.9)
  np.testing.assert_allclose(jr.metrics.binomial_interval_table(k, n, 0.9),
                             np.stack([lower, upper], -1), rtol=3e-6, atol=1e-7)
  k, n = np.array([3_000_000_000, 7]), np.array([4_000_000_000, 3_000_000_000])
  table = jr.metrics.binomial_interval_table(k, n, 0.95)
  np.testing.assert_allclose(table, clopper_pearson(k, n), rtol=1e-7)
  lower, upper = jr.metrics.binomial_interval(k, n, 0.95)
  np.testing.assert_allclose(table, np.stack([lower, upper], -1), rtol=1e-6)


def test_binomial_interval_table_refuses_bad_counts_and_levels():
  with pytest.raises(TypeError, match="integer counts"):
    jr.metrics.binomial_interval_table(np.array([1.0]), 4)
  with pytest.raises(ValueError, match="successes must be <= trials"):
    jr.metrics.binomial_interval_table(5, 4)
  with pytest.raises(ValueError, match=">= 0"):
    jr.metrics.binomial_interval_table(-1, 4)
  for confidence in (0.0, 1.0, float("nan")):
    with pytest.raises(ValueError, match="confidence"):
      jr.metrics.binomial_interval_table(1, 4, confidence)
  with pytest.raises(TypeError, match="confidence"):
    jr.metrics.binomial_interval_table(1, 4, 1)


def test_from_counts_refuses_counts_no_evaluation_gives():
  """Robust above clean, counts growing with eps, a worst case above an attack's, float counts
  (5.7 was truncated to 5), a missing description: each a ValueError naming it."""
  base = dict(epsilons=np.array([0.2, 0.1], np.float32), n=10, clean_correct=8,
              robust={"a": np.array([3, 5])}, worst_case=np.array([3, 5]),
              info={"a": ("a", "linf", False)}, flags={})
  jr.Report.from_counts(**base)  # valid: eps unsorted, counts non-increasing in eps
  for change, match in [
      ({"robust": {"a": np.array([3, 9])}, "worst_case": np.array([3, 5])},
       r"must lie in \[0, clean_correct\] = \[0, 8\]"),
      ({"robust": {"a": np.array([5, 3])}, "worst_case": np.array([3, 3])}, "grow with eps"),
      ({"worst_case": np.array([4, 5])}, "worst_case .* exceeds 'a'|worst_case .* exceeds a"),
      ({"robust": {"a": np.array([3.0, 5.7])}}, "integer counts"),
      ({"clean_correct": 11}, r"clean_correct must lie in \[0, n\]"),
      ({"info": {}}, r"info has no .* for \['a'\]"),
      ({"certified": {"c": ("c", "linf", np.array([3, 12]))}}, r"certified\['c'\]"),
  ]:
    with pytest.raises(ValueError, match=match):
      jr.Report.from_counts(**{**base, **change})


def test_with_certified_save_load_and_refusals(tmp_path):
  r = make_report()
  certified = np.minimum(r.worst_case.robust_count, [3, 30, 12])
  c = r.with_certified("ibp", certified, description="IBP, eps bisection")
  assert "ibp" not in r.certified  # r is unchanged
  assert c == r.with_certified("ibp", certified, description="IBP, eps bisection")
  assert c != r.with_certified("ibp", certified)  # the description is part of the result
  s = c.certified["ibp"]
  np.testing.assert_array_equal(s.robust_count, certified)
  np.testing.assert_allclose(s.robust_accuracy, certified / N)
  np.testing.assert_allclose(s.robust_interval, clopper_pearson(certified, N), atol=2e-6)
  again = jr.Report.load(c.save(tmp_path))
  assert again == c and again.certified["ibp"].description == "IBP, eps bisection"
  assert again.provenance == c.provenance and again != r
  curve = c.curve("ibp")
  np.testing.assert_array_equal(curve.robust_accuracy, s.robust_accuracy)
  flags = np.zeros((len(EPS), N), bool)
  flags[0, :2] = True
  from_curve = r.with_certified("flags", jr.Curve(EPS, np.float32(0.9), flags.mean(1), flags,
                                                   np.float32(0)))
  assert from_curve.certified["flags"].robust_count.tolist() == [2, 0, 0]
  with pytest.raises(ValueError, match="exceed the empirical worst case"):
    r.with_certified("too good", r.worst_case.robust_count + np.array([0, 1, 0]))
  noisy = r.with_certified("smoothing", r.worst_case.robust_count + np.array([0, 1, 0]),
                           allow_above_empirical=True)  # Monte-Carlo on both sides
  assert noisy.certified["smoothing"].robust_count.tolist()[1] == r.worst_case.robust_count[1] + 1
  with pytest.raises(ValueError, match="must lie in"):
    r.with_certified("negative", np.array([-1, 0, 0]), allow_above_empirical=True)
  with pytest.raises(ValueError, match="already has"):
    c.with_certified("ibp", certified)
  with pytest.raises(ValueError, match="robust flags have shape"):
    r.with_certified("x", jr.Curve(EPS, np.float32(0.9), flags.mean(1), flags[:, :3],
                                   np.float32(0)))
  with pytest.raises(ValueError, match="eps grid"):
    r.with_certified("x", jr.Curve(EPS + 1, np.float32(0.9), flags.mean(1), flags,
                                   np.float32(0)))
  with pytest.raises(ValueError, match="certified curve is for the l2 norm and the report's"):
    r.with_certified("smoothing", certified, norm="l2")  # a Linf report
  assert jr.Report.load(tmp_path / "report.json") == c  # the file names its folder
  with pytest.raises(FileNotFoundError, match="no report.json in"):
    jr.Report.load(tmp_path / "nowhere")


def _line(ax, gid):
  lines = [line for line in ax.lines if line.get_gid() == gid]
  assert len(lines) == 1, [line.get_gid() for line in ax.lines]
  return lines[0]


def _band(ax, gid):
  bands = [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_gid() == gid]
  assert len(bands) == 1, [c.get_gid() for c in ax.collections]
  return bands[0].get_paths()[0].vertices


def test_the_diagnosis_in_provenance_rules_reliable_only_by_its_errors():
  """Report.diagnosis reads provenance["diagnosis"]: none for a report without one, errors make
  the report unreliable, warnings do not; str(report) ends with its section; equality ignores it
  (it is provenance) and from_dict/to_dict keep it."""
  plain = make_report()
  assert plain.diagnosis is None and plain.reliable and "Gradient masking" not in str(plain)
  comparison = jr.diagnosis.Finding("comparison", "warning", "gt", "/m.py:3", "gt of x", "check")
  rounding = jr.diagnosis.Finding("rounding", "error", "round", "/m.py:2", "round of x", "BPDA")
  warned, masked = (plain._rebuild(provenance=dict(
      plain.provenance, diagnosis=jr.diagnosis.Diagnosis(findings).to_record()))
      for findings in ([comparison], [rounding, comparison]))
  assert warned.reliable and warned.diagnosis == (comparison,)
  assert not masked.reliable and masked.diagnosis == (rounding, comparison) and masked == plain
  assert str(masked).splitlines()[-3:] == [
      "Gradient masking (static): 1 error, 1 warning",
      "  error    rounding          round            m.py:2  BPDA",
      "  warning  comparison        gt               m.py:3  check"]
  again = jr.Report.from_dict(json.loads(masked.to_json()))
  assert again.diagnosis == masked.diagnosis and not again.reliable
  assert "diagnosis" not in masked.to_dict(include_provenance=False)


@pytest.mark.parametrize("certified", [False, True])
def test_plot_draws_the_report(tmp_path, certified):
  r = make_report(per_example=True, min_norm=True)
  if certified:
    r = r.with_certified("ibp", np.minimum(r.worst_case.robust_count, [3, 30, 12]))
  path = tmp_path / "curves.png"
  figure = r.plot(path)
  order = np.argsort(EPS)
  ax = figure.axes[0]
  # The worst case starts at (0, clean accuracy) and follows the sorted grid, with its band.
  worst = _line(ax, "worst case")
  np.testing.assert_allclose(worst.get_xdata(), np.r_[0.0, EPS[order]], rtol=1e-6)
  np.testing.assert_allclose(worst.get_ydata(),
                             np.r_[r.clean_accuracy, r.worst_case.robust_accuracy[order]])
  band = _band(ax, "band:worst case")
  want = np.r_[[r.clean_interval], r.worst_case.robust_interval[order]]
  for x, (lo, hi) in zip(np.r_[0.0, EPS[order]], want):  # both edges are vertices of the band
    at = band[np.isclose(band[:, 0], x, rtol=1e-6)]
    assert np.isclose(at[:, 1], lo, atol=1e-9).any() and np.isclose(at[:, 1], hi, atol=1e-9).any()
  for name in ("pgd", "fmn"):  # the per-attack breakdown
    np.testing.assert_allclose(_line(ax, name).get_ydata()[1:],
                               r.attacks[name].robust_accuracy[order])
  gids = {c.get_gid() for c in ax.collections}
  if certified:
    cert = _line(ax, "certified: ibp")
    np.testing.assert_allclose(cert.get_xdata(), EPS[order], rtol=1e-6)
    np.testing.assert_allclose(cert.get_ydata(), r.certified["ibp"].robust_accuracy[order])
    assert cert.get_linestyle() == ":" and "bracket" in gids
    bracket = _band(ax, "bracket")
    assert bracket[:, 1].min() == pytest.approx(r.certified["ibp"].robust_accuracy.min())
  else:
    assert "bracket" not in gids and not any("certified" in str(l.get_gid()) for l in ax.lines)
  assert "eps" in ax.get_xlabel() and "L∞" in ax.get_xlabel() and "[0, 1]" in ax.get_xlabel()
  assert ax.get_ylabel() == "accuracy" and ax.get_legend() is not None
  # The eps* histogram of the minimum-norm attack: clean-correct points, found ones only.
  assert len(figure.axes) == 2
  heights = sum(p.get_height() for p in figure.axes[1].patches)
  eps_star = r.per_example["eps_star/fmn"][r.per_example["correct"]]
  assert heights == np.isfinite(eps_star).sum()
  pixels = matplotlib.image.imread(path)
  assert pixels.shape[:2] == (576, 1536) and pixels[..., :3].std() > 0.05


def test_plot_without_per_example_has_one_panel_and_plot_curves_bands():
  r = make_report()
  assert len(r.plot().axes) == 1
  flags = np.zeros((2, 40), bool)
  flags[0, :30], flags[1, :10] = True, True
  curve = jr.Curve(np.array([0.1, 0.2], np.float32), np.float32(0.9), flags.mean(1), flags,
                   np.float32(0.5))
  ax = jr.plotting.plot_curves({"pgd": curve}, xlabel="eps (Linf)").axes[0]
  np.testing.assert_allclose(_line(ax, "pgd").get_ydata(), [0.9, 0.75, 0.25])
  band = _band(ax, "band:pgd")
  assert np.isclose(band[:, 1], clopper_pearson(10, 40)[0]).any()


def test_plot_reports_overlays_worst_cases():
  a, b = make_report(), make_report().with_certified("ibp", np.array([1, 1, 1]))
  ax = jr.plotting.plot_reports({"a": a, "b": b}).axes[0]
  np.testing.assert_allclose(_line(ax, "a").get_ydata()[1:],
                             a.worst_case.robust_accuracy[np.argsort(EPS)])
  assert _line(ax, "b certified: ibp").get_ydata().tolist() == pytest.approx([0.02] * 3)


def test_every_factory_records_its_full_configuration():
  configs = {
      "pgd": jr.attacks.pgd("l2", steps=7), "fgsm": jr.attacks.fgsm(),
      "apgd": jr.attacks.apgd("l1", targeted=True), "square": jr.attacks.square(queries=50),
      "fab": jr.attacks.fab(), "fmn": jr.attacks.fmn("l2"), "deepfool": jr.attacks.deepfool(),
      "carlini_wagner_l2": jr.attacks.carlini_wagner_l2(steps=3),
      "ddn": jr.attacks.ddn(steps=3),
      "brendel_bethge": jr.attacks.brendel_bethge("linf", steps=4),
      "min_norm_search": jr.attacks.min_norm_search(jr.attacks.pgd("l2", steps=5), rtol=0.05),
      "auto_attack": jr.attacks.auto_attack("l2", version="plus"),
      "eot": jr.attacks.eot(jr.attacks.pgd(), samples=4),
      "ensemble": jr.attacks.ensemble(jr.attacks.pgd(), jr.attacks.fgsm(), name="two"),
  }
  assert set(configs) == set(jr.attacks.__all__)
  for factory, attack in configs.items():
    config = json.loads(attack.config)
    assert config["factory"] == factory
  assert json.loads(configs["pgd"].config)["steps"] == 7
  bb = json.loads(configs["brendel_bethge"].config)
  assert bb["norm"] == "linf" and bb["steps"] == 4
  assert json.loads(configs["apgd"].config) == {
      "factory": "apgd", "norm": "l1", "loss": None, "targeted": True, "n_target_classes": 9,
      "steps": 100, "restarts": 1, "rho": 0.75, "momentum": 0.75, "targets": "logits",
      "malt_candidates": 100, "large_eps": False}
  assert json.loads(configs["eot"].config)["attack"]["factory"] == "pgd"
  search = json.loads(configs["min_norm_search"].config)
  assert (search["attack"]["factory"], search["attack"]["steps"], search["rtol"]) == ("pgd", 5, 0.05)
  assert [m["factory"] for m in json.loads(configs["ensemble"].config)["attacks"]] == [
      "pgd", "fgsm"]
  attack = configs["pgd"]
  assert isinstance(hash(attack), int)  # still hashable (the evaluate step cache keys on it)
  provenance = jr.report.provenance({"p": attack}, epsilons=[0.5], lower=-1.0, upper=1.0,
                                    key_data=jax.random.key_data(jax.random.key(3)),
                                    key_impl="threefry2x32")
  assert provenance["attacks"]["p"]["config"]["steps"] == 7
  assert provenance["threat_model"]["box"] == [-1.0, 1.0]
  assert provenance["key"]["data"] == [0, 3]


def test_the_checklist_passes_warns_or_says_why_not_with_its_evidence():
  """Each line of Report.checklist from hand-built evidence: AutoAttack's flags with their
  counts, a minimum-norm attack's misses, the static diagnosis, and the per-example agreement of
  fixed-budget and minimum-norm attacks (a count computed here from the arrays)."""
  status = lambda r: {i.check: i.status for i in r.checklist}
  evidence = lambda r: {i.check: i.evidence for i in r.checklist}
  plain = make_report(per_example=True, min_norm=True)
  assert str(plain).splitlines()[1] == "Checklist:"
  assert status(plain)["fixed budget vs minimum norm"] == "pass"  # pgd breaks all fmn breaks
  assert status(plain)["static gradient masking"] == "n/a"  # a report built from counts
  assert status(plain)["zero gradients"] == "n/a"  # no auto_attack
  # pgd breaks nothing: every example fmn broke within an eps is missed by the fixed budget.
  per = dict(plain.per_example)
  per["robust"] = per["robust"].copy()
  per["robust"][0] = per["correct"][None, :]
  weak = plain._rebuild(per_example=per)
  within = per["correct"][None, :] & (per["eps_star/fmn"][None, :] <= EPS[:, None])
  k = int(np.argmax(within.sum(1)))
  assert status(weak)["fixed budget vs minimum norm"] == "warn"
  assert evidence(weak)["fixed budget vs minimum norm"].startswith(
      f"{int(within[k].sum())} example(s) at eps {float(EPS[k]):g}")
  aa = {"non_finite_gradients": False, "non_finite_adversarials": False,
        "zero_gradients": True, "randomized": False, "probability_outputs": False,
        "square_beats_white_box": True}
  counts = {"zero_gradient_points": np.array([4, 4, 4]), "square_only_points": np.array([0, 2, 1]),
            "non_finite_gradient_points": np.zeros(3, np.int64)}
  r = jr.Report.from_counts(
      epsilons=EPS, n=N, clean_correct=45, robust={"aa": np.array([0, 30, 20]),
                                                   "fmn": np.array([3, 31, 22])},
      worst_case=np.array([0, 30, 20]), info={"aa": ("aa", "linf", False),
                                               "fmn": ("fmn", "linf", True)},
      flags={"aa": aa, "fmn": {"minimum_norm_not_found": True}},
      counts={"aa": counts, "fmn": {"minimum_norm_not_found": np.array(3)}})
  assert status(r)["zero gradients"] == "warn" and "aa: 4 points" in evidence(r)["zero gradients"]
  # 2 > 0.002 * 50: the Square flag, decided again from the global count, stands.
  assert status(r)["black box below white box"] == "warn"
  assert "aa: 2 points" in evidence(r)["black box below white box"]
  assert status(r)["deterministic model"] == status(r)["finite gradients"] == "pass"
  assert status(r)["unbounded eps reaches 0%"] == "warn" and "fmn missed 3" in evidence(r)[
      "unbounded eps reaches 0%"]
  found = jr.Report.from_counts(  # no minimum-norm attack; the worst case is 0 at the largest eps, 0.3
      epsilons=EPS, n=N, clean_correct=45, robust={"aa": np.array([0, 30, 20])},
      worst_case=np.array([0, 30, 20]), info={"aa": ("aa", "linf", False)}, flags={"aa": aa},
      counts={"aa": counts})
  assert status(found)["unbounded eps reaches 0%"] == "pass"
  rounding = jr.diagnosis.Finding("rounding", "error", "round", "/m.py:2", "round of x", "BPDA")
  masked = r._rebuild(provenance={"diagnosis": jr.diagnosis.Diagnosis([rounding]).to_record()})
  assert status(masked)["static gradient masking"] == "warn"
  assert "rounding at m.py:2" in evidence(masked)["static gradient masking"]
