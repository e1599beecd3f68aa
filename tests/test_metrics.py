"""Tests for jaxrobust.metrics: NumPy float64 references, hand-counted cases, Counts algebra."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxrobust import metrics
from jaxrobust.metrics import formulas

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

NORMS = ("linf", "l2", "l1")
INT_FIELDS = ("n", "clean_correct", "robust", "success", "success_clean_correct", "flipped",
              "nonfinite")
FLOAT_FIELDS = ("rel_perturbation_sum", "success_perturbation_sum")
NUM_CLASSES = 4
FEATURES = (2, 3)


# ------------------------------------------------------------------------------------------------
# Independent NumPy float64 references.


def np_ratio(num, den):
  return float(num) / float(den) if den > 0 else math.nan


def np_hits(pred, label):
  return (pred == label) & (pred != -1)


def np_norm(v, norm):
  v = np.asarray(v, np.float64).reshape(len(v), math.prod(v.shape[1:]))
  if norm == "linf":
    return np.abs(v).max(axis=1, initial=0.0)
  if norm == "l2":
    return np.sqrt((v * v).sum(axis=1))
  return np.abs(v).sum(axis=1)


def np_rel(x, x_adv, norm):
  size, scale = np_norm(x_adv - x, norm), np_norm(x, norm)
  out = np.zeros(len(x))
  for i in range(len(x)):
    out[i] = 0.0 if size[i] == 0 else (math.inf if scale[i] == 0 else size[i] / scale[i])
  return out


def np_success(pa, y, target):
  return ~np_hits(pa, y) if target is None else np_hits(pa, target)


def ref_metrics(pc, pa, y, m, x=None, x_adv=None, norm=None, target=None):
  clean = np_hits(pc, y) & m
  robust = clean & np_hits(pa, y)
  unchanged = (pa == pc) & (pc == y) & (pc != -1) & m
  succ = np_success(pa, y, target) & m
  flipped = (pa != pc) & m
  out = {
    "accuracy": np_ratio(clean.sum(), m.sum()),
    "robust_accuracy": np_ratio(robust.sum(), m.sum()),
    "conditional_robust_accuracy": np_ratio(robust.sum(), clean.sum()),
    "adversarial_accuracy": np_ratio(unchanged.sum(), clean.sum()),
    "attack_success_rate": np_ratio(succ.sum(), m.sum()),
    "attack_success_rate_clean_correct": np_ratio((succ & clean).sum(), clean.sum()),
  }
  if x is not None:
    rel = np_rel(x, x_adv, norm)
    size = np_norm(x_adv - x, norm)
    out["empirical_robustness"] = np_ratio(rel[flipped].sum(), flipped.sum())
    out["mean_perturbation"] = np_ratio(size[succ].sum(), succ.sum())
  return out


def ref_counts(pc, pa, y, m, x, x_adv, norm, target):
  clean = np_hits(pc, y) & m
  succ = np_success(pa, y, target) & m
  flipped = (pa != pc) & m
  return {
    "n": int(m.sum()),
    "clean_correct": int(clean.sum()),
    "robust": int((clean & np_hits(pa, y)).sum()),
    "success": int(succ.sum()),
    "success_clean_correct": int((succ & clean).sum()),
    "flipped": int(flipped.sum()),
    "nonfinite": int((((pc == -1) | (pa == -1)) & m).sum()),
    "rel_perturbation_sum": float(np_rel(x, x_adv, norm)[flipped].sum()),
    "success_perturbation_sum": float(np_norm(x_adv - x, norm)[succ].sum()),
  }


# ------------------------------------------------------------------------------------------------
# Random data.


def make_data(seed, b, mask_kind):
  """Predictions with -1 and unchanged/flipped mixes, labels, targets, inputs, mask."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, NUM_CLASSES, b).astype(np.int32)
  pc = np.where(rng.random(b) < 0.6, y, rng.integers(-1, NUM_CLASSES, b)).astype(np.int32)
  pa = np.where(rng.random(b) < 0.5, pc, rng.integers(-1, NUM_CLASSES, b)).astype(np.int32)
  target = rng.integers(0, NUM_CLASSES, b).astype(np.int32)
  x = rng.normal(size=(b, *FEATURES)).astype(np.float32)
  delta = (rng.normal(size=(b, *FEATURES)) * 0.1).astype(np.float32)
  delta[rng.random(b) < 0.2] = 0.0  # some zero perturbations
  x_adv = x + delta
  if mask_kind == "none":
    m = None
  elif mask_kind == "random":
    m = rng.random(b) < 0.7
  else:
    m = np.zeros(b, bool)
  return dict(pc=pc, pa=pa, y=y, target=target, x=x, x_adv=x_adv, m=m)


def np_mask(d):
  return np.ones(len(d["y"]), bool) if d["m"] is None else d["m"]


data_args = dict(
  seed=st.integers(0, 2**31 - 1),
  b=st.sampled_from([0, 4, 13]),
  mask_kind=st.sampled_from(["none", "random", "all_false"]),
)


def close(actual, expected, rtol=1e-5, atol=1e-6):
  np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol,
                             equal_nan=True)


def as_jax(d):
  return {k: None if v is None else jnp.asarray(v) for k, v in d.items()}


# One jitted program per batch shape keeps the (compile-bound) property tests fast; the hand-counted
# tests below exercise the eager path.


@jax.jit
def all_metrics(d, success):
  """Every metric, for every norm and with and without a target; success [B] is untargeted."""
  pc, pa, y, mask = d["pc"], d["pa"], d["y"], d["m"]
  out = {
    "accuracy": metrics.accuracy(pc, y, mask),
    "robust_accuracy": metrics.robust_accuracy(pc, pa, y, mask),
    "conditional_robust_accuracy": metrics.conditional_robust_accuracy(pc, pa, y, mask),
    "adversarial_accuracy": metrics.adversarial_accuracy(pc, pa, y, mask),
  }
  for name, t in (("untargeted", None), ("targeted", d["target"])):
    out[f"attack_success_rate/{name}"] = metrics.attack_success_rate(pc, pa, y, t, mask=mask)
    out[f"attack_success_rate_clean_correct/{name}"] = metrics.attack_success_rate(
      pc, pa, y, target=t, over="clean_correct", mask=mask)
  for norm in NORMS:
    out[f"empirical_robustness/{norm}"] = metrics.empirical_robustness(
      d["x"], d["x_adv"], pc, pa, norm, mask)
    out[f"mean_perturbation/{norm}"] = metrics.mean_perturbation(
      d["x"], d["x_adv"], success, norm, mask)
  return out


def ref_all_metrics(d):
  m = np_mask(d)
  out = {}
  for norm in NORMS:
    for name, t in (("untargeted", None), ("targeted", d["target"])):
      ref = ref_metrics(d["pc"], d["pa"], d["y"], m, d["x"], d["x_adv"], norm, t)
      for k in ("attack_success_rate", "attack_success_rate_clean_correct"):
        out[f"{k}/{name}"] = ref[k]
      if t is None:
        out[f"empirical_robustness/{norm}"] = ref["empirical_robustness"]
        out[f"mean_perturbation/{norm}"] = ref["mean_perturbation"]
        for k in ("accuracy", "robust_accuracy", "conditional_robust_accuracy",
                  "adversarial_accuracy"):
          out[k] = ref[k]
  return out


# ------------------------------------------------------------------------------------------------
# Metrics against NumPy.


@given(**data_args)
def test_metrics_match_numpy(seed, b, mask_kind):
  d = make_data(seed, b, mask_kind)
  ref = ref_all_metrics(d)
  out = all_metrics(as_jax(d), jnp.asarray(np_success(d["pa"], d["y"], None)))
  assert set(out) == set(ref)
  for k, v in out.items():
    assert v.dtype == jnp.float32 and v.shape == (), k
    close(v, ref[k])
  if mask_kind == "all_false" or b == 0:
    assert all(math.isnan(v) for v in ref.values())


@jax.jit
def metrics_of_constant_batch(pred, x, mask):
  return [
    metrics.accuracy(pred, pred, mask),
    metrics.robust_accuracy(pred, pred, pred, mask),
    metrics.conditional_robust_accuracy(pred, pred, pred, mask),
    metrics.adversarial_accuracy(pred, pred, pred, mask),
    metrics.attack_success_rate(pred, pred, pred, mask=mask),
    metrics.attack_success_rate(pred, pred, pred, target=pred, over="clean_correct", mask=mask),
    metrics.empirical_robustness(x, x + 1, pred, pred + 1, "l2", mask),
    metrics.mean_perturbation(x, x + 1, pred == pred, "l2", mask),
    metrics.certified_accuracy(x[:, 0], pred, pred, 0.5, mask),
  ]


@pytest.mark.parametrize("b", [0, 3])
def test_all_false_mask_is_nan(b):
  pred = jnp.zeros((b,), jnp.int32)
  x = jnp.ones((b, 2))
  values = metrics_of_constant_batch(pred, x, jnp.zeros((b,), bool))
  for v in values:
    assert v.dtype == jnp.float32 and v.shape == ()
    assert bool(jnp.isnan(v))
  if b:  # unmasked: all correct, never broken, targeted always hit, flipped by ||1|| / ||1||
    close(metrics_of_constant_batch(pred, x, jnp.ones((b,), bool)),
          [1, 1, 1, 1, 0, 1, 1, math.sqrt(2), 1])
  assert all(bool(jnp.isnan(v)) for v in metrics.Counts.empty().compute().values())


# ------------------------------------------------------------------------------------------------
# Hand-counted cases.

# idx:          0  1  2   3  4
PC = jnp.array([0, 1, 2, -1, 4])
PA = jnp.array([0, 2, 2, 3, -1])
Y = jnp.array([0, 1, 1, 3, 4])
TARGET = jnp.array([1, 2, 2, 0, 4])
# clean correct: 0, 1, 4; adv correct: 0, 3; robust: 0; untargeted success (pa != y): 1, 2, 4;
# targeted success (pa == target): 1, 2; flipped (pa != pc): 1, 3, 4; no prediction: 3, 4.
X = jnp.array([[3.0, 4.0], [0.0, 2.0], [1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
DELTA = jnp.array([[0.0, 0.0], [0.0, 1.0], [1.0, 1.0], [3.0, 4.0], [1.0, 0.0]])


def test_hand_counted_metrics():
  assert float(metrics.accuracy(PC, Y)) == pytest.approx(3 / 5)
  assert float(metrics.robust_accuracy(PC, PA, Y)) == pytest.approx(1 / 5)
  assert float(metrics.conditional_robust_accuracy(PC, PA, Y)) == pytest.approx(1 / 3)
  assert float(metrics.adversarial_accuracy(PC, PA, Y)) == pytest.approx(1 / 3)
  assert float(metrics.attack_success_rate(PC, PA, Y)) == pytest.approx(3 / 5)
  assert float(metrics.attack_success_rate(PC, PA, Y, over="clean_correct")) == pytest.approx(2 / 3)
  assert float(metrics.attack_success_rate(PC, PA, Y, target=TARGET)) == pytest.approx(2 / 5)
  assert float(metrics.attack_success_rate(PC, PA, Y, target=TARGET, over="clean_correct")) == (
    pytest.approx(1 / 3))


def test_hand_counted_with_mask():
  mask = jnp.array([True, True, True, True, False])  # drop example 4
  assert float(metrics.accuracy(PC, Y, mask)) == pytest.approx(2 / 4)
  assert float(metrics.robust_accuracy(PC, PA, Y, mask)) == pytest.approx(1 / 4)
  assert float(metrics.conditional_robust_accuracy(PC, PA, Y, mask)) == pytest.approx(1 / 2)
  assert float(metrics.adversarial_accuracy(PC, PA, Y, mask)) == pytest.approx(1 / 2)
  assert float(metrics.attack_success_rate(PC, PA, Y, mask=mask)) == pytest.approx(2 / 4)
  assert float(metrics.attack_success_rate(PC, PA, Y, over="clean_correct", mask=mask)) == (
    pytest.approx(1 / 2))


@pytest.mark.parametrize("norm,er,mp",
                         [("l2", 2.0, 7 / 3), ("linf", 5 / 3, 2.0), ("l1", 8 / 3, 3.0)])
def test_hand_counted_perturbations(norm, er, mp):
  # ||delta||_2 = [0, 1, sqrt2, 5, 1], ||x||_2 = [5, 2, 1, 1, 2]; flipped 1, 3, 4:
  # l2 (0.5 + 5 + 0.5) / 3 = 2, linf (0.5 + 4 + 0.5) / 3, l1 (0.5 + 7 + 0.5) / 3.
  assert float(metrics.empirical_robustness(X, X + DELTA, PC, PA, norm)) == pytest.approx(er)
  success = jnp.array([False, True, False, True, True])
  assert float(metrics.mean_perturbation(X, X + DELTA, success, norm)) == pytest.approx(mp)
  c = metrics.Counts.from_batch(PC, PA, Y, x=X, x_adv=X + DELTA, norm=norm)
  assert int(c.flipped) == 3 and int(c.nonfinite) == 2 and int(c.success) == 3
  assert float(c.compute()["empirical_robustness"]) == pytest.approx(er)


def test_empirical_robustness_zero_norm_inputs():
  x = jnp.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
  x_adv = jnp.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [1.0, 0.5], [1.0, 0.0]])
  pc = jnp.array([0, 0, 0, 0, 0])
  # Flipped with x = 0 and delta = 0 -> 0; not flipped with x = 0 -> ignored; flipped 0.5 -> 0.5.
  pa = jnp.array([1, 0, 0, 1, 0])
  assert float(metrics.empirical_robustness(x, x_adv, pc, pa, "l2")) == pytest.approx(0.25)
  # Flipped with x = 0 and delta != 0 -> inf, never NaN.
  pa = jnp.array([1, 0, 1, 1, 0])
  for norm in NORMS:
    assert float(metrics.empirical_robustness(x, x_adv, pc, pa, norm)) == math.inf
  # ... unless masked out.
  mask = jnp.array([True, True, False, True, True])
  assert float(metrics.empirical_robustness(x, x_adv, pc, pa, "l2", mask)) == pytest.approx(0.25)
  c = metrics.Counts.from_batch(pc, pa, pc, x=x, x_adv=x_adv, norm="l1")
  assert float(c.rel_perturbation_sum) == math.inf and int(c.flipped) == 3


def test_masked_padding_with_nan_inputs_is_ignored():
  nan, inf = math.nan, math.inf
  x = jnp.array([[1.0, 0.0], [nan, inf], [0.0, 0.0], [inf, 1.0], [nan, nan]])
  x_adv = jnp.array([[1.0, 1.0], [nan, 0.0], [1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
  pc, pa, y = jnp.array([0, 0, 0, 0, 0]), jnp.array([1, 1, 1, 1, 1]), jnp.array([0, 0, 0, 0, 0])
  mask = jnp.array([True, False, False, False, False])
  assert float(metrics.empirical_robustness(x, x_adv, pc, pa, "l2", mask)) == 1.0
  assert float(metrics.mean_perturbation(x, x_adv, pa == pa, "l1", mask)) == 1.0
  c = metrics.Counts.from_batch(pc, pa, y, x=x, x_adv=x_adv, norm="linf", mask=mask)
  assert float(c.rel_perturbation_sum) == 1.0 and float(c.success_perturbation_sum) == 1.0


def test_argument_errors():
  with pytest.raises(ValueError, match="'all'.*'clean_correct'"):
    metrics.attack_success_rate(PC, PA, Y, over="robust")
  for bad in ("l3", "Linf", "inf"):
    with pytest.raises(ValueError, match="'linf'.*'l2'.*'l1'"):
      metrics.empirical_robustness(X, X, PC, PA, bad)
    with pytest.raises(ValueError, match="'linf'.*'l2'.*'l1'"):
      metrics.mean_perturbation(X, X, PC == Y, bad)
  with pytest.raises(ValueError, match="together"):
    metrics.Counts.from_batch(PC, PA, Y, x=X, norm="l2")
  with pytest.raises(ValueError, match="norm"):
    metrics.Counts.from_batch(PC, PA, Y, x=X, x_adv=X)
  with pytest.raises(ValueError, match="shape"):
    metrics.accuracy(PC, Y[:3])


# ------------------------------------------------------------------------------------------------
# certified_accuracy and curve_auc.


def test_certified_accuracy():
  radius = jnp.array([0.5, 1.0, 0.0, 2.0, 0.3])
  # correct: 0 (r 0.5), 1 (r 1.0), 4 (r 0.3); 3 abstains with radius 2 -> wrong.
  r = jnp.array([0.0, 0.5, 1.0, 3.0, 0.3])
  out = metrics.certified_accuracy(radius, PC, Y, r)
  assert out.shape == (5,) and out.dtype == jnp.float32
  close(out, [3 / 5, 2 / 5, 1 / 5, 0.0, 3 / 5])
  scalar = metrics.certified_accuracy(radius, PC, Y, 0.5)
  assert scalar.shape == ()
  close(scalar, 2 / 5)
  mask = jnp.array([True, False, True, True, True])
  close(metrics.certified_accuracy(radius, PC, Y, r, mask), [2 / 4, 1 / 4, 0.0, 0.0, 2 / 4])


@given(seed=st.integers(0, 2**31 - 1), b=st.sampled_from([1, 16]))
def test_certified_accuracy_matches_numpy(seed, b):
  rng = np.random.default_rng(seed)
  radius = rng.exponential(size=b).astype(np.float32)
  y = rng.integers(0, 3, b).astype(np.int32)
  pred = rng.integers(-1, 3, b).astype(np.int32)
  m = rng.random(b) < 0.8
  r = np.array([0.0, 0.25, 0.5, 1.0, 2.0], np.float32)
  ok = np_hits(pred, y) & m
  ref = [np_ratio((ok & (radius >= ri)).sum(), m.sum()) for ri in r]
  close(jax.jit(metrics.certified_accuracy)(radius, pred, y, r, m), ref)


AUC = jax.jit(metrics.curve_auc)


def test_curve_auc_constant_curve():
  eps = jnp.array([0.1, 0.5, 0.2, 1.0, 0.0, 0.5])
  for c in (0.0, 0.37, 1.0):
    close(AUC(eps, jnp.full((6,), c), c), c)


def test_curve_auc_piecewise_linear():
  # (0, 1), (1, 0.8), (2, 0.4), (4, 0): 0.9 + 0.6 + 0.4 = 1.9 over 4.
  eps = jnp.array([1.0, 2.0, 4.0])
  acc = jnp.array([0.8, 0.4, 0.0])
  close(AUC(eps, acc, 1.0), 1.9 / 4)
  for perm in ([2, 0, 1], [1, 2, 0]):
    close(AUC(eps[jnp.array(perm)], acc[jnp.array(perm)], 1.0), 1.9 / 4)


@given(seed=st.integers(0, 2**31 - 1), k=st.sampled_from([1, 2, 6]))
def test_curve_auc_matches_numpy_and_is_order_free(seed, k):
  rng = np.random.default_rng(seed)
  eps = rng.uniform(0.0, 1.0, k).astype(np.float32)
  acc = rng.uniform(0.0, 1.0, k).astype(np.float32)
  clean = np.float32(rng.uniform())
  order = np.argsort(eps)
  e = np.concatenate([[0.0], eps[order]]).astype(np.float64)
  a = np.concatenate([[clean], acc[order]]).astype(np.float64)
  ref = float(np.sum(np.diff(e) * (a[1:] + a[:-1]) / 2) / e[-1])
  close(AUC(eps, acc, clean), ref)
  perm = rng.permutation(k)
  close(AUC(eps[perm], acc[perm], clean), ref)


def test_curve_auc_degenerate():
  close(AUC(jnp.zeros((2,)), jnp.array([0.3, 0.4]), 0.9), 0.9)
  close(AUC(jnp.zeros((0,)), jnp.zeros((0,)), 0.9), 0.9)


def test_curve_auc_leaves_unbounded_eps_out_and_refuses_nan_or_negative():
  """A minimum-norm grid may end at eps = inf ("no bound"): the area covers the finite eps (it
  was inf / inf = NaN, and NumPy's warning about it crashed jr.evaluate under -W error)."""
  eps, acc = jnp.array([1.0, jnp.inf, 2.0, 4.0]), jnp.array([0.8, 0.0, 0.4, 0.0])
  close(AUC(eps, acc, 1.0), 1.9 / 4)
  host = formulas.trapezoid_auc(np.asarray(eps), np.asarray(acc), np.float32(1.0))  # NumPy
  assert isinstance(host, np.floating | np.ndarray)
  close(host, 1.9 / 4)
  close(AUC(jnp.array([jnp.inf]), jnp.array([0.0]), 0.7), 0.7)  # no finite eps: clean
  for bad in ([0.1, float("nan")], [0.1, -0.2]):
    with pytest.raises(ValueError, match="epsilons must be >= 0"):
      metrics.curve_auc(jnp.array(bad), jnp.array([0.5, 0.5]), 1.0)  # concrete: checked


# ------------------------------------------------------------------------------------------------
# Counts.


COUNTS_KEYS = [(norm, targeted) for norm in NORMS for targeted in (False, True)]


@jax.jit
def all_counts(d):
  """Counts.from_batch for every norm, untargeted and targeted, as a list in COUNTS_KEYS order."""
  return [metrics.Counts.from_batch(d["pc"], d["pa"], d["y"], x=d["x"], x_adv=d["x_adv"],
                                    norm=norm, target=d["target"] if targeted else None,
                                    mask=d["m"])
          for norm, targeted in COUNTS_KEYS]


@jax.jit
def merge_all(a, b):
  return [x.merge(y) for x, y in zip(a, b)]


@jax.jit
def compute_all(counts):
  return [c.compute() for c in counts]


def assert_counts_equal(a, b, rtol=1e-5):
  for f in INT_FIELDS:
    assert getattr(a, f).dtype == jnp.int32
    assert int(getattr(a, f)) == int(getattr(b, f)), f
  for f in FLOAT_FIELDS:
    assert getattr(a, f).dtype == jnp.float32
    close(getattr(a, f), float(getattr(b, f)), rtol=rtol, atol=1e-5)


def assert_counts_match_ref(c, ref):
  for f in INT_FIELDS:
    assert int(getattr(c, f)) == ref[f], f
  for f in FLOAT_FIELDS:
    close(getattr(c, f), ref[f], atol=1e-5)


@given(**data_args)
def test_counts_match_numpy_and_functions(seed, b, mask_kind):
  d = make_data(seed, b, mask_kind)
  m = np_mask(d)
  direct = all_metrics(as_jax(d), jnp.asarray(np_success(d["pa"], d["y"], None)))
  counts = all_counts(as_jax(d))
  for (norm, targeted), c, out in zip(COUNTS_KEYS, counts, compute_all(counts)):
    target = d["target"] if targeted else None
    assert_counts_match_ref(c, ref_counts(d["pc"], d["pa"], d["y"], m, d["x"], d["x_adv"], norm,
                                          target))
    assert set(out) == {"accuracy", "robust_accuracy", "conditional_robust_accuracy",
                        "adversarial_accuracy", "attack_success_rate",
                        "attack_success_rate_clean_correct", "empirical_robustness",
                        "mean_perturbation"}
    name = "targeted" if targeted else "untargeted"
    for k, v in out.items():
      assert v.dtype == jnp.float32 and v.shape == ()
      if k.startswith("attack_success_rate"):
        close(v, float(direct[f"{k}/{name}"]))
      elif k == "empirical_robustness":
        close(v, float(direct[f"{k}/{norm}"]))
      elif k == "mean_perturbation":
        if not targeted:  # direct[...] is the mean over untargeted successes
          close(v, float(direct[f"{k}/{norm}"]))
      else:
        close(v, float(direct[k]))


def test_counts_without_inputs_have_zero_perturbation_sums():
  c = metrics.Counts.from_batch(PC, PA, Y)
  assert float(c.rel_perturbation_sum) == 0.0 and float(c.success_perturbation_sum) == 0.0
  assert int(c.n) == 5 and int(c.clean_correct) == 3 and int(c.robust) == 1


PAD = 4  # every padded batch has this size (as a whole batch of 4: one compilation)


def pad_batch(d, lo, hi, rng):
  """Rows lo:hi of d, padded to PAD rows of junk (NaN inputs, random predictions) with mask off."""
  k = hi - lo
  out = {}
  for name in ("pc", "pa", "y", "target"):
    junk = rng.integers(-1, NUM_CLASSES, PAD - k).astype(np.int32)
    if name in ("y", "target"):
      junk = np.abs(junk)
    out[name] = np.concatenate([d[name][lo:hi], junk])
  for name in ("x", "x_adv"):
    junk = np.full((PAD - k, *FEATURES), np.nan, np.float32)
    out[name] = np.concatenate([d[name][lo:hi], junk])
  m = np_mask(d)[lo:hi]
  out["m"] = np.concatenate([m, np.zeros(PAD - k, bool)])
  return out


@given(seed=st.integers(0, 2**31 - 1), b=st.sampled_from([0, 4, 13]),
       mask_kind=st.sampled_from(["none", "random", "all_false"]),
       cuts=st.lists(st.integers(0, 13), max_size=5), padded=st.booleans())
def test_counts_merge_of_any_split_equals_whole(seed, b, mask_kind, cuts, padded):
  d = make_data(seed, b, mask_kind)
  whole = all_counts(as_jax(d))
  # Sorted cut points (repeats give empty batches; there is always a last, empty one), each
  # batch at most PAD rows.
  bounds = sorted({0, b} | {min(c, b) for c in cuts} | set(range(0, b, PAD))) + [b]
  rng = np.random.default_rng(seed + 1)
  totals = [metrics.Counts.empty()] * len(COUNTS_KEYS)
  for lo, hi in zip(bounds[:-1], bounds[1:]):
    if padded:
      part = pad_batch(d, lo, hi, rng)
    else:
      part = {k: np_mask(d)[lo:hi] if k == "m" else v[lo:hi] for k, v in d.items()}
    batches = all_counts(as_jax(part))
    totals = merge_all(totals, batches) if lo % 2 else merge_all(batches, totals)
  for total, c in zip(totals, whole):
    assert_counts_equal(total, c)
  for got, want in zip(compute_all(totals), compute_all(whole)):
    for k, v in got.items():
      close(v, float(want[k]), rtol=1e-5)


@given(seed=st.integers(0, 2**31 - 1))
def test_merge_associative_commutative_identity(seed):
  a, b, c = (all_counts(as_jax(make_data(seed + i, 4, "random")))[i] for i in range(3))
  assert_counts_equal(a.merge(b), b.merge(a), rtol=0)  # float addition commutes exactly
  assert_counts_equal(a.merge(b).merge(c), a.merge(b.merge(c)))
  assert_counts_equal(a.merge(metrics.Counts.empty()), a, rtol=0)


def test_update_equals_merge_of_from_batch():
  c0 = metrics.Counts.from_batch(PC, PA, Y)
  kwargs = dict(x=X, x_adv=X + DELTA, norm="l1", target=TARGET, mask=PC >= 0)
  assert_counts_equal(c0.update(PC, PA, Y, **kwargs),
                      c0.merge(metrics.Counts.from_batch(PC, PA, Y, **kwargs)), rtol=0)


def test_counts_dtypes_are_strong_and_merge_never_retraces():
  chex.clear_trace_counter()

  @jax.jit
  @chex.assert_max_traces(n=1)
  def merge(a, b):
    return a.merge(b)

  empty = metrics.Counts.empty()
  batch = metrics.Counts.from_batch(PC, PA, Y, x=X, x_adv=X + DELTA, norm="l2")
  for c in (empty, batch, merge(empty, empty)):
    for v in c:
      assert v.shape == () and not v.weak_type
    assert [v.dtype for v in c] == [jnp.int32] * 7 + [jnp.float32] * 2
  total = merge(merge(empty, empty), empty)
  total = merge(total, batch)
  total = merge(total, metrics.Counts.from_batch(PC[:2], PA[:2], Y[:2]))
  assert int(total.n) == 7


def test_counts_accumulate_in_scan_under_jit():
  d = make_data(1, 24, "random")
  stacked = {k: jnp.asarray(v.reshape(4, 6, *v.shape[1:])) for k, v in d.items()}

  @jax.jit
  def run(s):
    def step(c, batch):
      return c.update(batch["pc"], batch["pa"], batch["y"], x=batch["x"], x_adv=batch["x_adv"],
                      norm="linf", mask=batch["m"]), None
    return jax.lax.scan(step, metrics.Counts.empty(), s)[0]

  assert_counts_equal(run(stacked), all_counts(as_jax(d))[COUNTS_KEYS.index(("linf", False))])


def test_metrics_under_jit_and_vmap():
  d = make_data(3, 8, "random")
  pc, pa, y = (jnp.asarray(d[k].reshape(2, 4)) for k in ("pc", "pa", "y"))
  m = jnp.asarray(d["m"].reshape(2, 4))
  f = jax.jit(jax.vmap(lambda a, b, c, mm: metrics.attack_success_rate(
    a, b, c, over="clean_correct", mask=mm)))
  out = f(pc, pa, y, m)
  for i in range(2):
    ref = ref_metrics(d["pc"][4 * i:4 * i + 4], d["pa"][4 * i:4 * i + 4],
                      d["y"][4 * i:4 * i + 4], d["m"][4 * i:4 * i + 4])
    close(out[i], ref["attack_success_rate_clean_correct"])


def test_psum_under_shard_map():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  mesh = jax.make_mesh((8,), ("batch",))
  d = make_data(7, 64, "random")
  d["pc"][:3] = -1
  sharding = jax.NamedSharding(mesh, jax.P("batch"))
  args = [jax.device_put(d[k], sharding) for k in ("pc", "pa", "y", "x", "x_adv", "target", "m")]

  def shard(pc, pa, y, x, x_adv, target, m):
    c = metrics.Counts.from_batch(pc, pa, y, x=x, x_adv=x_adv, norm="l2", target=target, mask=m)
    return metrics.psum(c, "batch")

  f = jax.jit(jax.shard_map(shard, mesh=mesh, in_specs=(jax.P("batch"),) * 7,
                            out_specs=jax.P()))
  total = f(*args)
  whole = all_counts(as_jax(d))[COUNTS_KEYS.index(("l2", True))]
  assert int(total.nonfinite) >= 3
  assert_counts_equal(total, whole)
  assert_counts_match_ref(total, ref_counts(d["pc"], d["pa"], d["y"], d["m"], d["x"], d["x_adv"],
                                            "l2", d["target"]))
