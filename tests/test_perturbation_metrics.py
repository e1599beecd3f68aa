"""Metrics of minimal adversarial norms: quantiles, the mergeable histogram, curve consistency."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr

rng = np.random.default_rng(0)
NORMS = rng.exponential(0.1, 97).astype(np.float32)
NORMS[:9] = np.inf
NORMS[9:14] = 0.0
CORRECT = rng.uniform(size=97) < 0.85
NORMS[~CORRECT] = 0.0  # what jr.run reports for clean-misclassified points
EDGES = np.array([0.0, 0.02, 0.05, 0.1, 0.2, 0.4], np.float32)


def _np_quantile(values, q):
  finite_stand_in = np.where(np.isinf(values), np.finfo(np.float32).max, values).astype(np.float64)
  out = np.quantile(finite_stand_in, q)
  return np.where(out >= np.finfo(np.float32).max / 2, np.inf, out)


@pytest.mark.parametrize("use_mask", [False, True])
def test_quantiles_match_numpy(use_mask):
  q = np.array([0.0, 0.1, 0.5, 0.9, 0.95, 1.0], np.float32)
  mask = rng.uniform(size=97) < 0.6 if use_mask else np.ones(97, bool)
  got = jr.metrics.perturbation_quantiles(jnp.asarray(NORMS), jnp.asarray(q),
                                          jnp.asarray(mask) if use_mask else None)
  np.testing.assert_allclose(np.asarray(got), _np_quantile(NORMS[mask], q), rtol=1e-6)
  assert float(jr.metrics.median_perturbation(jnp.asarray(NORMS))) == pytest.approx(
      float(np.median(np.where(np.isinf(NORMS), 1e30, NORMS))))


def test_quantiles_of_nothing_are_nan():
  got = jr.metrics.perturbation_quantiles(jnp.asarray(NORMS), 0.5, jnp.zeros(97, bool))
  assert np.isnan(float(got))


def test_histogram_matches_brute_force_and_curve_from_norms():
  h = jr.metrics.NormHistogram.from_batch(jnp.asarray(NORMS), jnp.asarray(CORRECT),
                                          jnp.asarray(EDGES))
  out = h.compute(jnp.asarray(EDGES))
  curve = jr.curve_from_norms(jnp.asarray(NORMS), jnp.asarray(CORRECT), jnp.asarray(EDGES))
  np.testing.assert_allclose(np.asarray(out["robust_accuracy"]),
                             np.asarray(curve.robust_accuracy), rtol=1e-6)
  assert float(out["auc"]) == pytest.approx(float(curve.auc), rel=1e-6)
  assert float(out["clean_accuracy"]) == pytest.approx(CORRECT.mean())
  good = NORMS[CORRECT]
  bins = np.concatenate([[-np.inf], EDGES, [np.inf]])
  expected = [np.sum((good > lo) & (good <= hi)) for lo, hi in zip(bins[:-1], bins[1:])]
  np.testing.assert_array_equal(np.asarray(out["histogram"]), expected)
  assert int(np.asarray(out["histogram"]).sum()) == CORRECT.sum()


def test_histogram_merge_of_batches_equals_the_whole_and_psum():
  edges = jnp.asarray(EDGES)
  whole = jr.metrics.NormHistogram.from_batch(jnp.asarray(NORMS), jnp.asarray(CORRECT), edges)
  merged = jr.metrics.NormHistogram.empty(len(EDGES))
  cuts = [0, 10, 11, 11, 50, 97]
  for a, b in zip(cuts[:-1], cuts[1:]):
    pad = 16 - (b - a) % 16
    norms = np.concatenate([NORMS[a:b], np.full(pad, np.nan, np.float32)])
    correct = np.concatenate([CORRECT[a:b], np.ones(pad, bool)])
    mask = np.arange(len(norms)) < (b - a)
    merged = merged.merge(jr.metrics.NormHistogram.from_batch(
        jnp.asarray(norms), jnp.asarray(correct), edges, jnp.asarray(mask)))
  jax.tree.map(np.testing.assert_array_equal, merged, whole)

  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  mesh = jax.make_mesh((8,), ("batch",))
  n = 96
  per_shard = jax.shard_map(
      lambda nr, c: jr.metrics.psum(jr.metrics.NormHistogram.from_batch(nr, c, edges), "batch"),
      mesh=mesh, in_specs=(jax.P("batch"), jax.P("batch")), out_specs=jax.P())
  put = lambda a: jax.device_put(jnp.asarray(a), jax.NamedSharding(mesh, jax.P("batch")))
  total = per_shard(put(NORMS[:n]), put(CORRECT[:n]))
  expected = jr.metrics.NormHistogram.from_batch(jnp.asarray(NORMS[:n]), jnp.asarray(CORRECT[:n]),
                                                 edges)
  jax.tree.map(np.testing.assert_array_equal, total, expected)


def test_curve_consistency_counts_each_kind_of_disagreement():
  eps = jnp.asarray(EDGES)
  curve = jr.curve_from_norms(jnp.asarray(NORMS), jnp.asarray(CORRECT), eps)
  same = jr.curve_consistency(jnp.asarray(NORMS), jnp.asarray(CORRECT), curve)
  assert not np.asarray(same.norm_attack_weaker).any()
  assert not np.asarray(same.budget_attack_weaker).any()
  # A minimum-norm attack that overestimates every distance by 2x.
  worse = jr.curve_consistency(jnp.asarray(2 * NORMS), jnp.asarray(CORRECT), curve)
  expected = [np.sum(CORRECT & (NORMS <= e) & (2 * NORMS > e)) for e in EDGES]
  np.testing.assert_array_equal(np.asarray(worse.norm_attack_weaker), expected)
  assert not np.asarray(worse.budget_attack_weaker).any()
  # A minimum-norm attack that finds perturbations half as large as the fixed-budget attack did.
  better = jr.curve_consistency(jnp.asarray(NORMS / 2), jnp.asarray(CORRECT), curve)
  expected = [np.sum(CORRECT & (NORMS / 2 <= e) & (NORMS > e)) for e in EDGES]
  np.testing.assert_array_equal(np.asarray(better.budget_attack_weaker), expected)
