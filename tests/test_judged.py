"""Tests for jaxrobust.metrics.judged: hit@k against an enumeration of every k-subset, hit-any and
the per-sample rates against NumPy hand counts, unscored verdicts never counted as failures unless
asked, the reducer's algebra (merge of halves, psum under shard_map, host int64), closed-form
rates from synthetic judges, and the coverage of the intervals over prompts in a simulation."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special

from jaxrobust import metrics

S_, F_, U_ = metrics.SUCCESS, metrics.FAILURE, metrics.UNSCORED
RULES = ("exclude", "failure", "success")
pytestmark = pytest.mark.compile_bound  # see tests/conftest.py


def random_verdicts(seed: int, batch: int = 40, samples: int = 5) -> np.ndarray:
  rng = np.random.default_rng(seed)
  p = rng.uniform(size=(batch, 1))  # prompts differ in how often they succeed
  u = rng.uniform(size=(batch, samples))
  return np.where(u < 0.15, U_, np.where(rng.uniform(size=(batch, samples)) < p, S_, F_)
                  ).astype(np.int32)


def enumerated_hit_at_k(verdicts: np.ndarray, k: int, rule: str) -> tuple[float, int]:
  """The mean over prompts of the fraction of k-subsets of the prompt's samples (its scored ones
  under "exclude") holding a success; prompts with fewer than k samples left out."""
  values = []
  for row in verdicts:
    if rule == "exclude":
      row = row[row != U_]
    hit = (row == S_) | ((row == U_) & (rule == "success"))
    if len(row) < k:
      continue
    subsets = list(itertools.combinations(range(len(row)), k))
    values.append(np.mean([hit[list(c)].any() for c in subsets]))
  return float(np.mean(values)), len(values)


@pytest.mark.parametrize("rule", RULES)
def test_hit_at_k_equals_the_enumeration_of_every_subset(rule):
  verdicts = random_verdicts(0)
  r = metrics.JudgedRate.from_verdicts(verdicts)
  for k in range(1, 6):
    out = r.compute(unscored=rule, k=k)
    want, prompts = enumerated_hit_at_k(verdicts, k, rule)
    assert int(out["hit_at_k_prompts"]) == prompts
    assert float(out["hit_at_k"]) == pytest.approx(want, abs=1e-6), (rule, k)
    assert 0.0 <= float(out["hit_at_k_lower"]) <= want <= float(out["hit_at_k_upper"]) <= 1.0
  # k = S under "failure" is hit-any; the estimate rises with k.
  full = r.compute(unscored="failure", k=5)
  assert float(full["hit_at_k"]) == pytest.approx(float(full["hit_any"]), abs=1e-6)
  rising = [float(r.compute(unscored=rule, k=k)["hit_at_k"]) for k in (1, 2, 3)]
  if rule != "exclude":  # "exclude" averages over fewer prompts as k grows
    assert rising == sorted(rising)


@pytest.mark.parametrize("rule", RULES)
def test_counts_rates_and_hit_any_are_the_hand_counts(rule):
  verdicts = random_verdicts(1)
  mask = np.arange(40) % 7 != 3
  r = metrics.JudgedRate.from_verdicts(verdicts, mask)
  kept = verdicts[mask]
  s, f, u = (int(np.sum(kept == code)) for code in (S_, F_, U_))
  assert (int(r.successes), int(r.failures), int(r.unscored)) == (s, f, u)
  out = r.compute(unscored=rule)
  hits, total = {"exclude": (s, s + f), "failure": (s, s + f + u),
                 "success": (s + u, s + f + u)}[rule]
  assert (int(out["hits"]), int(out["total"])) == (hits, total)
  assert float(out["rate"]) == pytest.approx(hits / total, rel=1e-6)
  assert float(out["rate_as_failure"]) <= float(out["rate"]) <= float(out["rate_as_success"])
  success = (kept == S_) | ((kept == U_) & (rule == "success"))
  counted = np.ones(len(kept), bool) if rule != "exclude" else (kept != U_).any(axis=1)
  any_hits = int(np.sum(success.any(axis=1) & counted))
  assert (int(out["prompts"]), float(out["hit_any"])) == (
      int(counted.sum()), pytest.approx(any_hits / counted.sum(), rel=1e-6))
  # Prompt table: its moments are the per-sample counts.
  c, v = np.meshgrid(np.arange(6), np.arange(6), indexing="ij")
  table = np.asarray(r.prompts)
  assert int(np.sum(table * c)) == s and int(np.sum(table * v)) == u
  assert int(table.sum()) == int(mask.sum())


def test_hit_any_matches_attack_success_rate_generative():
  verdicts = random_verdicts(2)
  valid = verdicts != U_
  r = metrics.JudgedRate.from_verdicts(verdicts)
  for rule, invalid in (("failure", "failure"), ("exclude", "drop")):
    old = metrics.attack_success_rate_generative(verdicts == S_, valid=valid, invalid=invalid)
    out = r.compute(unscored=rule)
    assert int(out["prompts"]) == int(old.total)
    assert float(out["hit_any"]) == pytest.approx(float(old.compute()["rate"]), abs=1e-7)
    assert float(out["hit_any_lower"]) == pytest.approx(float(old.compute()["lower"]), abs=1e-7)


def test_unscored_never_becomes_a_failure_unless_asked():
  everything_unscored = metrics.JudgedRate.from_verdicts(jnp.full((4, 3), U_))
  out = everything_unscored.compute(k=1)
  assert int(out["failures"]) == 0 and int(out["unscored"]) == 12
  assert int(out["total"]) == 0 and np.isnan(float(out["rate"]))
  assert (float(out["lower"]), float(out["upper"])) == (0.0, 1.0)
  assert int(out["prompts"]) == 0 and int(out["hit_at_k_prompts"]) == 0
  assert (float(out["rate_as_failure"]), float(out["rate_as_success"])) == (0.0, 1.0)
  assert float(everything_unscored.compute(unscored="failure")["rate"]) == 0.0
  # Inside jit an unknown code (here 7 and -2) is unscored, never a failure.
  odd = jnp.array([[7, S_], [F_, -2]])
  jitted = jax.jit(metrics.JudgedRate.from_verdicts)(odd)
  assert (int(jitted.successes), int(jitted.failures), int(jitted.unscored)) == (1, 1, 2)


def test_bad_input_is_refused():
  with pytest.raises(ValueError, match="only SUCCESS"):
    metrics.JudgedRate.from_verdicts(jnp.array([0, 2]))
  with pytest.raises(ValueError, match="integer array of the codes"):
    metrics.JudgedRate.from_verdicts(jnp.array([True, False]))
  with pytest.raises(ValueError, match="integer array of the codes"):
    metrics.JudgedRate.from_verdicts(jnp.zeros((2, 2, 2), jnp.int32))
  r = metrics.JudgedRate.from_verdicts(jnp.zeros((2, 3), jnp.int32))
  for k in (0, 4, 2.0, True):
    with pytest.raises(ValueError, match=r"k must be an int in \[1, S\] = \[1, 3\]"):
      r.compute(k=k)
  with pytest.raises(ValueError, match="unscored must be one of"):
    r.compute(unscored="drop")
  with pytest.raises(ValueError, match="group ids must lie"):
    metrics.JudgedRate.from_verdicts(jnp.array([0, 1]), groups=jnp.array([0, 2]), num_groups=2)
  with pytest.raises(ValueError, match="same samples per prompt"):
    r.merge(metrics.JudgedRate.empty(2))
  with pytest.raises(ValueError, match="grouped"):
    metrics.JudgedRate.empty(3, 2).update(jnp.zeros((2, 3), jnp.int32))


def test_merge_of_halves_psum_and_host_equal_the_whole():
  verdicts = random_verdicts(3, batch=64, samples=4)
  groups = np.arange(64) % 3
  mask = np.arange(64) % 5 != 0
  whole = metrics.JudgedRate.from_verdicts(verdicts, mask, groups=groups, num_groups=3)
  halves = metrics.JudgedRate.from_verdicts(verdicts[:30], mask[:30], groups=groups[:30],
                                            num_groups=3).update(verdicts[30:], mask[30:],
                                                                 groups=groups[30:])
  jax.tree.map(np.testing.assert_array_equal, halves, whole)
  host = whole.to_host().merge(metrics.JudgedRate.empty(4, 3).to_host())
  assert host.prompts.dtype == np.int64
  for average in (None, "micro", "macro"):
    device_out, host_out = (w.compute(k=2, average=average) for w in (whole, host))
    for name in ("rate", "lower", "hit_any", "hit_at_k", "hit_at_k_upper", "rate_as_success"):
      np.testing.assert_allclose(np.asarray(host_out[name], np.float64),
                                 np.asarray(device_out[name], np.float64), atol=1e-6)
  assert int(whole.compute(average="macro")["prompts"]) == int(mask.sum())
  micro = whole.compute(k=2, average="micro")
  pooled = metrics.JudgedRate.from_verdicts(verdicts, mask).compute(k=2)
  for name in ("rate", "upper", "hit_any", "hit_at_k", "hit_at_k_lower"):
    assert float(micro[name]) == pytest.approx(float(pooled[name]), abs=1e-6)
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  mesh = jax.make_mesh((8,), ("batch",))

  def shard(v, m, g):
    total = metrics.JudgedRate.from_verdicts(v, m, groups=g, num_groups=3).psum("batch")
    return total, total.compute(0.9, k=3, average="macro")["hit_at_k"]

  fn = jax.jit(jax.shard_map(shard, mesh=mesh, in_specs=(jax.P("batch"),) * 3,
                             out_specs=jax.P()))
  sharding = jax.NamedSharding(mesh, jax.P("batch"))
  sharded, macro = fn(*(jax.device_put(v, sharding) for v in (verdicts, mask, groups)))
  jax.tree.map(np.testing.assert_array_equal, sharded, whole)
  assert float(macro) == pytest.approx(float(whole.compute(k=3, average="macro")["hit_at_k"]),
                                       abs=1e-6)


def test_synthetic_rule_judge_gives_the_closed_form_rates():
  """A judge that scores sample j of prompt i by (i + j) mod 6: 0, 1 -> success, 2 -> unscored,
  else failure; every prompt has 2 successes, 1 unscored and 3 failures among its 6 samples."""
  i, j = np.meshgrid(np.arange(60), np.arange(6), indexing="ij")
  phase = (i + j) % 6
  verdicts = np.where(phase < 2, S_, np.where(phase == 2, U_, F_)).astype(np.int32)
  out = metrics.JudgedRate.from_verdicts(verdicts).compute(k=2)
  assert float(out["rate"]) == pytest.approx(2 / 5)
  assert float(out["rate_as_failure"]) == pytest.approx(2 / 6)
  assert float(out["rate_as_success"]) == pytest.approx(3 / 6)
  # hit@2 of n = 5 scored samples with 2 successes: 1 - C(3, 2) / C(5, 2) = 0.7, every prompt.
  assert float(out["hit_at_k"]) == pytest.approx(0.7, abs=1e-6)
  failure = metrics.JudgedRate.from_verdicts(verdicts).compute(k=2, unscored="failure")
  assert float(failure["hit_at_k"]) == pytest.approx(1 - special.comb(4, 2) / special.comb(6, 2))


def _simulated_rates(key, prompts, samples, a, b):
  """One data set: prompt success probabilities p ~ Beta(a, b), ``samples`` Bernoulli(p) draws
  per prompt, 10% of the verdicts unscored at random."""
  kp, ks, ku = jax.random.split(key, 3)
  p = jax.random.beta(kp, a, b, (prompts, 1))
  success = jax.random.uniform(ks, (prompts, samples)) < p
  verdicts = jnp.where(jax.random.uniform(ku, (prompts, samples)) < 0.1, U_,
                       success.astype(jnp.int32))
  return metrics.JudgedRate.from_verdicts(verdicts)


@pytest.mark.run_bound  # the bootstrap's binomial draws run 10 times slower unoptimised
def test_intervals_over_prompts_cover_at_their_nominal_rate():
  """400 data sets of 80 prompts, 4 samples each: hit@2 (bootstrap) and hit-any (Clopper-Pearson
  over prompts) cover the population values E[1 - (1 - p)^k] in closed form (Hoeffding's
  interval, valid for every distribution, is checked in tests/test_scores.py)."""
  reps, a, b, confidence = 400, 0.6, 1.4, 0.9
  keys = jax.random.split(jax.random.key(11), reps)

  def one(key):
    out = _simulated_rates(key, 80, 4, a, b).compute(
        confidence, k=2, interval="bootstrap", key=jax.random.fold_in(key, 1), resamples=300)
    return [out[n] for n in ("hit_at_k_lower", "hit_at_k_upper", "hit_any_lower",
                             "hit_any_upper")]

  # XLA's backend at level 1: 4.8 s CPU to compile and run this program, against 9 s at the
  # defaults (compile-bound) and 10 s at level 0 (the binomial draws run slowly).
  run = jax.jit(jax.vmap(one), compiler_options={"xla_backend_optimization_level": 1})
  lo2, hi2, lo_any, hi_any = (np.asarray(v) for v in run(keys))
  # E[(1 - p)^k] = B(a, b + k) / B(a, b); "exclude" with unscored at random keeps this target.
  hit2 = 1 - special.beta(a, b + 2) / special.beta(a, b)
  # hit-any over the scored samples: the number scored is m ~ Bin(4, 0.9), so the target is
  # E[1 - (1 - p)^m] over the prompts with m >= 1.
  pm = special.comb(4, np.arange(5)) * 0.9 ** np.arange(5) * 0.1 ** (4 - np.arange(5))
  hit_any = sum(pm[m] * (1 - special.beta(a, b + m) / special.beta(a, b))
                for m in range(1, 5)) / pm[1:].sum()
  floor = confidence - 3 * np.sqrt(confidence * (1 - confidence) / reps)
  coverage = {"bootstrap hit@2": np.mean((lo2 <= hit2) & (hit2 <= hi2)),
              "clopper_pearson hit_any": np.mean((lo_any <= hit_any) & (hit_any <= hi_any))}
  print("coverage at", confidence, coverage, "floor", floor)
  assert min(coverage.values()) >= floor, coverage
