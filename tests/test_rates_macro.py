"""Tests for the macro average's intervals of jaxrobust.metrics.Rate: Hoeffding's interval for the
weighted sum of trials in closed form (device and host), and in a simulation of many behaviours
with few prompts each both it and the Bonferroni one cover at least at their nominal rate, the
Hoeffding one being the narrower."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrobust import metrics


def test_hoeffding_macro_interval_in_closed_form_on_device_and_host():
  hits, total = np.array([1, 3, 0, 0]), np.array([2, 4, 5, 0])  # the last group has no trials
  rate = metrics.Rate(jnp.asarray(hits, jnp.int32), jnp.asarray(total, jnp.int32))
  mean = (1 / 2 + 3 / 4 + 0) / 3
  half = np.sqrt(np.log(2 / 0.1) * (1 / 2 + 1 / 4 + 1 / 5) / 9 / 2)
  for r in (rate, rate.to_host()):
    out = r.compute(0.9, average="macro", macro_interval="hoeffding")
    assert float(out["rate"]) == pytest.approx(mean, rel=1e-6)
    assert float(out["lower"]) == pytest.approx(mean - half, abs=1e-6)
    assert float(out["upper"]) == pytest.approx(mean + half, abs=1e-6)
    assert int(out["groups"]) == 3
  traced = jax.jit(lambda r, c: r.compute(c, average="macro", macro_interval="hoeffding"))(
      rate, jnp.float32(0.9))
  assert float(traced["upper"]) == pytest.approx(mean + half, abs=1e-6)
  empty = metrics.Rate.empty(3).compute(average="macro", macro_interval="hoeffding")
  assert np.isnan(float(empty["rate"])) and (float(empty["lower"]), float(empty["upper"])) == (0, 1)
  # Bonferroni stays the default, unchanged.
  default = rate.compute(0.9, average="macro")
  bonferroni = rate.compute(0.9, average="macro", macro_interval="bonferroni")
  assert float(default["lower"]) == float(bonferroni["lower"])
  with pytest.raises(ValueError, match="macro_interval must be one of"):
    rate.compute(average="macro", macro_interval="fay")
  # JudgedRate passes it on.
  judged = metrics.JudgedRate.from_verdicts(jnp.array([1, 0, 1, 1]), groups=jnp.array([0, 0, 1, 1]),
                                            num_groups=2)
  out = judged.compute(0.9, average="macro", macro_interval="hoeffding")
  half = np.sqrt(np.log(20) * (1 / 2 + 1 / 2) / 4 / 2)
  assert float(out["upper"]) == pytest.approx(min(1.0, 0.75 + half), abs=1e-6)
  assert float(out["lower"]) == pytest.approx(0.75 - half, abs=1e-6)


@pytest.mark.run_bound
def test_macro_intervals_cover_and_hoeffding_is_narrower_with_many_behaviours():
  """1000 data sets of 40 behaviours with 1 to 8 prompts each and rates from Beta(0.5, 0.5)."""
  reps, groups, confidence = 1000, 40, 0.9
  rng = np.random.default_rng(5)
  trials = rng.integers(1, 9, groups).astype(np.int32)
  p = rng.beta(0.5, 0.5, groups)
  hits = jax.random.binomial(jax.random.key(6), jnp.asarray(trials, jnp.float32),
                             jnp.asarray(p, jnp.float32), (reps, groups)).astype(jnp.int32)

  def both(h):
    rate = metrics.Rate(h, jnp.asarray(trials))
    b = rate.compute(confidence, average="macro")
    hf = rate.compute(confidence, average="macro", macro_interval="hoeffding")
    return b["lower"], b["upper"], hf["lower"], hf["upper"]

  blo, bhi, hlo, hhi = (np.asarray(v) for v in jax.jit(jax.vmap(both))(hits))
  target = p.mean()
  floor = confidence - 3 * np.sqrt(confidence * (1 - confidence) / reps)
  coverage = {"bonferroni": np.mean((blo <= target) & (target <= bhi)),
              "hoeffding": np.mean((hlo <= target) & (target <= hhi))}
  widths = {"bonferroni": np.mean(bhi - blo), "hoeffding": np.mean(hhi - hlo)}
  print("coverage at", confidence, coverage, "mean widths", widths)
  assert min(coverage.values()) >= floor, coverage
  assert widths["hoeffding"] < 0.6 * widths["bonferroni"], widths
