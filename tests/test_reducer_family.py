"""Every reducer of the family (``jr.metrics.Reducer`` and its subclasses) keeps its sums apart:
``merge`` refuses fields of different shapes on the device, on the host (``to_host``, int64) and
while ``jit`` traces, a grouped ``Rate`` is updated per group, and host reducers compute in NumPy
int64 (counts past ``2**31``)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust import metrics
from jaxrobust.evaluation.device_step import EvalSums

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py


def _eval_sums(num_eps: int) -> EvalSums:
  """The sums of ``jr.evaluate`` with one attack over a grid of ``num_eps`` budgets."""
  curve = metrics.CurveCounts.from_flags(jnp.ones((num_eps, 3), bool), jnp.array([1, 1, 0], bool))
  return EvalSums(curves=(curve,), worst_case=curve,
                  raised=({"non_finite_gradients": jnp.int32(0)},),
                  counts=({"non_finite_gradient_points": jnp.int32(0),
                           "non_finite_adversarials": jnp.zeros((num_eps,), jnp.int32)},))


def _stacked_counts() -> metrics.Counts:
  """Two batches' counts side by side (``[2]`` fields), as ``vmap`` over batches gives them."""
  pred = jnp.array([[0, 1], [1, 1]])
  return jax.vmap(lambda p: metrics.Counts.from_batch(p, p, jnp.array([0, 1])))(pred)


# name -> (reducer, another of its kind whose sums have other shapes, the first field that
# differs, its shape in the first, in the second). Today's jnp.add / np.add broadcast every pair.
MISMATCHED = {
    "Counts": (_stacked_counts, metrics.Counts.empty, ".n", (2,), ()),
    "CurveCounts": (lambda: metrics.CurveCounts.empty(1),
                    lambda: metrics.CurveCounts.from_flags(jnp.ones((3, 2), bool),
                                                           jnp.ones((2,), bool)),
                    ".robust", (1,), (3,)),
    "NormHistogram": (lambda: metrics.NormHistogram.from_batch(
        jnp.array([0.5, jnp.inf]), jnp.array([True, True]), jnp.array([0.0, 0.1, 0.2, 1.0])),
                      lambda: metrics.NormHistogram.empty(1), ".robust", (4,), (1,)),
    "Rate": (lambda: metrics.Rate.from_flags(jnp.array([True, False, True]),
                                             groups=jnp.array([0, 1, 1]), num_groups=2),
             lambda: metrics.Rate.from_flags(jnp.array([True, True])), ".hits", (2,), ()),
    "JudgedRate": (lambda: metrics.JudgedRate.from_verdicts(jnp.array([[1, 0, -1]])),
                   lambda: metrics.JudgedRate.empty(2), ".prompts", (4, 4), (3, 3)),
    "ScoreHistogram": (lambda: metrics.ScoreHistogram.from_scores(jnp.array([0.5, jnp.nan]),
                                                                  groups=jnp.array([0, 1]),
                                                                  num_groups=2),
                       lambda: metrics.ScoreHistogram.empty(), ".counts", (2, 9), (9,)),
    "EvalSums": (lambda: _eval_sums(1), lambda: _eval_sums(3), ".curves[0].robust", (1,), (3,)),
}


def _subclasses(cls) -> set[type]:
  return {c for sub in cls.__subclasses__() for c in {sub} | _subclasses(sub)}


def test_every_reducer_of_the_package_has_a_mismatch_case():
  """A new reducer must join MISMATCHED (its merge inherits the check; the case proves it)."""
  import jaxrobust.evaluation  # noqa: F401 - EvalSums lives in a front door
  in_package = {c.__name__ for c in _subclasses(metrics.Reducer)
                if c.__module__.startswith("jaxrobust")}
  assert in_package == set(MISMATCHED)


def _message(field: str, first: tuple, second: tuple) -> str:
  return (f"{re.escape(field)} has shape {re.escape(str(first))} in this one and "
          f"{re.escape(str(second))} in the other")


@pytest.mark.parametrize("name", sorted(MISMATCHED))
def test_merge_refuses_fields_of_other_shapes_on_device_host_and_under_jit(name):
  make_a, make_b, field, shape_a, shape_b = MISMATCHED[name]
  a, b = make_a(), make_b()
  pairs = {"device": (a, b), "host int64": (a.to_host(), b.to_host()),
           "host with device": (a.to_host(), b)}
  for where, (left, right) in pairs.items():
    with pytest.raises(ValueError, match=_message(field, shape_a, shape_b)):
      left.merge(right)
      pytest.fail(f"{name} merged on {where}")
    with pytest.raises(ValueError, match=_message(field, shape_b, shape_a)):
      right.merge(left)
  # Shapes are static: the check runs while tracing, before anything is broadcast.
  with pytest.raises(ValueError, match=_message(field, shape_a, shape_b)):
    jax.jit(lambda u, v: u.merge(v))(a, b)
  # Same shapes still merge, as before (exact integer sums).
  assert jax.tree.structure(a.merge(a)) == jax.tree.structure(a)
  host = a.to_host().merge(a.to_host())
  assert all(np.asarray(v).dtype in (np.int64, np.float64) for v in jax.tree.leaves(host))


def test_merge_of_eval_sums_of_other_attacks_names_the_structure():
  one = _eval_sums(2)
  two = one._replace(curves=one.curves * 2, raised=one.raised * 2, counts=one.counts * 2)
  with pytest.raises(ValueError, match="different structure"):
    one.merge(two)


def test_grouped_rate_update_counts_per_group_and_needs_the_groups():
  """The issue's example: a [2] rate updated with a batch of two rows."""
  r = metrics.Rate.from_flags(jnp.array([True, False, True]), groups=jnp.array([0, 1, 1]),
                              num_groups=2)
  assert (r.hits.tolist(), r.total.tolist()) == ([1, 1], [1, 2])
  flags = jnp.array([True, True])
  # Row 0 is in group 0 (hit), row 1 in group 1 (hit): hits [1+1, 1+1] of [1+1, 2+1].
  updated = r.update(flags, groups=jnp.array([0, 1]))
  assert (updated.hits.tolist(), updated.total.tolist()) == ([2, 2], [2, 3])
  masked = r.update(flags, jnp.array([True, False]), groups=jnp.array([1, 1]), num_groups=2)
  assert (masked.hits.tolist(), masked.total.tolist()) == ([1, 2], [1, 3])
  # The same under jit, and the update equals the merge of the batch's own grouped rate.
  jitted = jax.jit(lambda r, f, g: r.update(f, groups=g))(r, flags, jnp.array([0, 1]))
  jax.tree.map(np.testing.assert_array_equal, jitted, updated)
  batch = metrics.Rate.from_flags(flags, groups=jnp.array([0, 1]), num_groups=2)
  jax.tree.map(np.testing.assert_array_equal, r.merge(batch), updated)
  # Without groups the batch's totals would land in every group ([3, 3] of [3, 4]): refused.
  with pytest.raises(ValueError, match=r"grouped \(\[G\] = \[2\].*groups=ids"):
    r.update(flags)
  with pytest.raises(ValueError, match=r"grouped"):
    r.to_host().update(flags)
  with pytest.raises(ValueError, match="num_groups=3 differs"):
    r.update(flags, groups=jnp.array([0, 1]), num_groups=3)
  with pytest.raises(ValueError, match=r"group ids must lie in \[0, 2\)"):
    r.update(flags, groups=jnp.array([0, 2]))


def test_ungrouped_rate_update_refuses_groups():
  r = metrics.Rate.from_flags(jnp.array([True, False]))
  assert int(r.update(jnp.array([True])).hits) == 2
  with pytest.raises(ValueError, match=r"ungrouped \(\[\] sums\) and cannot take groups"):
    r.update(jnp.array([True, True]), groups=jnp.array([0, 1]), num_groups=2)
  with pytest.raises(ValueError, match="cannot take groups"):
    r.update(jnp.array([True]), num_groups=2)


def test_norm_histogram_computes_host_counts_past_int32_in_int64():
  """Host histograms stay int64 (warnings are errors here, so an int64 -> int32 cast fails too)."""
  edges = np.array([0.1, 0.2], np.float32)
  h = metrics.NormHistogram(np.int64(5_000_000_000), np.int64(4_000_000_000),
                            np.array([3_000_000_000, 1_000_000_000], np.int64))
  out = h.compute(edges)
  assert out["histogram"].dtype == np.int64
  assert out["histogram"].tolist() == [1_000_000_000, 2_000_000_000, 1_000_000_000]
  assert out["robust_accuracy"].tolist() == [0.6000000238418579, 0.20000000298023224]
  assert float(out["clean_accuracy"]) == pytest.approx(0.8)
  # The device histogram of the same (small) counts is int32 and equal.
  small = metrics.NormHistogram(jnp.int32(5), jnp.int32(4), jnp.array([3, 1], jnp.int32))
  assert small.compute(edges)["histogram"].dtype == jnp.int32
  assert small.to_host().compute(edges)["histogram"].tolist() == [1, 2, 1]
  np.testing.assert_array_equal(small.compute(edges)["histogram"],
                                small.to_host().compute(edges)["histogram"])


@pytest.mark.parametrize("seed", range(4))
def test_host_and_device_curves_agree(seed):
  """The host AUC (NumPy) is curve_auc's formula: equal to the device value to float32 rounding,
  for any order of the grid, ties included."""
  rng = np.random.default_rng(seed)
  k = int(rng.integers(1, 12))
  eps = rng.uniform(0.0, 1.0, k).astype(np.float32)
  eps[rng.integers(0, k)] = eps[0]  # a tie
  n = int(rng.integers(1, 10_000))
  correct = int(rng.integers(0, n + 1))
  robust = rng.integers(0, correct + 1, k)
  device = metrics.CurveCounts(jnp.int32(n), jnp.int32(correct), jnp.asarray(robust, jnp.int32))
  on_device, on_host = device.compute(jnp.asarray(eps)), device.to_host().compute(eps)
  assert isinstance(on_host["auc"], np.ndarray) and on_host["auc"].dtype == np.float32
  # XLA may divide by a broadcast count as a multiplication by its reciprocal: a float32 ulp.
  for key in ("clean_accuracy", "robust_accuracy", "auc"):
    np.testing.assert_allclose(on_host[key], on_device[key], rtol=3e-7, atol=1e-7)
  np.testing.assert_allclose(on_host["auc"], jr.metrics.curve_auc(eps, on_host["robust_accuracy"],
                                                                  on_host["clean_accuracy"]),
                             rtol=2e-7, atol=1e-7)
  with pytest.raises(ValueError, match=r"must both have shape \[K\]"):
    device.to_host().compute(eps[:-1] if k > 1 else np.zeros(2, np.float32))


def test_binomial_interval_table_takes_host_counts_past_int32():
  """Host counts are int64: the table (float64) agrees with binomial_interval's host path
  (float32) to float32 accuracy, with no NaN from counts cut to int32."""
  k = np.array([3_000_000_000, 7, 0], np.int64)
  n = np.array([4_000_000_000, 3_000_000_000, 5_000_000_000], np.int64)
  table = metrics.binomial_interval_table(k, n, 0.95)
  lower, upper = metrics.binomial_interval(k, n, 0.95)
  np.testing.assert_allclose(table, np.stack([lower, upper], -1), rtol=1e-6)
  assert np.all(np.isfinite(table)) and table[0, 0] < 0.75 < table[0, 1]
  assert table[2, 0] == 0.0 and 0.0 < table[2, 1] < 1e-9


def test_host_intervals_are_float64_and_compile_nothing(caplog):
  """Reports, plots and host reducers compute their intervals on the host in float64 (SciPy),
  with no XLA compilation (the float32 JAX path compiled about fifty programs per process and
  table size), equal to the device path to its float32 accuracy, in every average."""
  rng = np.random.default_rng(3)
  flags = jnp.asarray(rng.uniform(size=999) < 0.3)
  groups = jnp.asarray(rng.integers(0, 37, size=999))
  device = metrics.Rate.from_flags(flags, groups=groups, num_groups=37)
  host = device.to_host()
  with jax.log_compiles(), caplog.at_level("DEBUG"):
    table = metrics.binomial_interval_table(np.arange(1001) % 7, 1000 + np.arange(1001) % 5,
                                            0.99)
    results = {average: host.compute(0.9, average=average) for average in (None, "micro",
                                                                           "macro")}
  compiled = [r.getMessage() for r in caplog.records if "ompil" in r.getMessage()]
  assert not compiled, compiled[:3]
  assert table.dtype == np.float64 and table.shape == (1001, 2)
  for average, got in results.items():
    want = device.compute(0.9, average=average)
    for key in ("lower", "upper"):
      assert np.asarray(got[key]).dtype == np.float64, (average, key)
      np.testing.assert_allclose(got[key], want[key], rtol=3e-6, atol=1e-7)


def test_grouped_rate_computes_per_group_on_the_host_as_on_the_device():
  """A grouped host rate (int64 sums) gives every group's rate and interval, as on the device
  (it raised: a [G] count compared with 0 in an ``if``)."""
  rate = metrics.Rate.from_flags(jnp.array([True, False, True, True]),
                                 groups=jnp.array([0, 1, 1, 2]), num_groups=4)
  host, device = rate.to_host().compute(), rate.compute()
  np.testing.assert_array_equal(host["rate"][:3], [1.0, 0.5, 1.0])
  assert np.isnan(host["rate"][3]) and host["rate"].dtype == np.float64
  for key in ("lower", "upper"):
    np.testing.assert_allclose(host[key], device[key], rtol=1e-6)
  assert isinstance(metrics.Rate.from_flags(jnp.array([True])).to_host().compute()["rate"],
                    np.float64)
