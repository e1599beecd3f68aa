"""Tests for jaxrobust.text's judges: synthetic judges (rules on token ids) whose verdicts are known,
as a JAX classifier (jit, vmap over samples, traced threshold) and as a host function called in
batches (failures of every kind unscored, never failures), feeding JudgedRate."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrobust import metrics, text

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py
S_, F_, U_ = metrics.SUCCESS, metrics.FAILURE, metrics.UNSCORED


def responses(seed: int = 0, batch: int = 12, samples: int = 3, length: int = 5) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 10, (batch, samples, length)).astype(np.int32)


def rule_scores(tokens):
  """Count of token 3 minus 1.5; NaN when the response starts with token 9."""
  count = jnp.sum(tokens == 3, axis=-1).astype(jnp.float32) - 1.5
  return jnp.where(tokens[..., 0] == 9, jnp.nan, count)


def expected(tokens: np.ndarray, threshold: float = 0.0, abstain: float = 0.0) -> np.ndarray:
  score = np.sum(tokens == 3, axis=-1) - 1.5
  unscored = (tokens[..., 0] == 9) | (np.abs(score - threshold) < abstain)
  return np.where(unscored, U_, np.where(score > threshold, S_, F_))


def test_classifier_judge_gives_the_rule_verdicts_under_jit_and_vmap():
  tokens = responses()
  traces = []

  def judge(t, threshold, abstain):
    traces.append(1)
    return text.classifier_judge(rule_scores, t, threshold=threshold, abstain=abstain)

  fn = jax.jit(judge)
  for threshold, abstain in ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0)):
    got = np.asarray(fn(tokens, threshold, abstain))
    np.testing.assert_array_equal(got, expected(tokens, threshold, abstain))
  assert len(traces) == 1  # threshold and abstain are data
  # [B, k, L] in one call == vmap over the k samples == the [N, L] rows.
  over_samples = jax.vmap(lambda t: text.classifier_judge(rule_scores, t), in_axes=1,
                          out_axes=1)(tokens)
  rows = text.classifier_judge(rule_scores, tokens.reshape(-1, 5)).reshape(12, 3)
  np.testing.assert_array_equal(over_samples, expected(tokens))
  np.testing.assert_array_equal(rows, expected(tokens))
  # Parameters pass as arguments: a linear judge with weights w.
  w = jnp.arange(10, dtype=jnp.float32) - 4.5
  linear = text.classifier_judge(lambda t, w: jnp.sum(w[t], axis=-1), tokens[:, 0], w)
  np.testing.assert_array_equal(linear, np.where(np.sum(np.asarray(w)[tokens[:, 0]], -1) > 0,
                                                 S_, F_))


def test_classifier_judge_refuses_bad_input():
  with pytest.raises(ValueError, match="one score per response"):
    text.classifier_judge(lambda t: jnp.zeros((t.shape[0], 2)), responses())
  with pytest.raises(ValueError, match="integer token ids"):
    text.classifier_judge(rule_scores, jnp.zeros((2, 3)))
  with pytest.raises(ValueError, match="integer token ids"):
    text.classifier_judge(rule_scores, jnp.zeros((3,), jnp.int32))


def test_host_judge_calls_in_batches_and_never_turns_a_failure_of_the_judge_into_a_failure():
  """A host judge over decoded strings: "3" present -> True, "9" present -> None (cannot tell),
  "7" present -> an unparseable string; a batch holding a "0 0" pair raises."""
  tokens = responses(1, batch=7, samples=2, length=4)
  calls = []

  def judge(items):
    calls.append(len(items))
    if any("0 0" in item for item in items):
      raise RuntimeError("judge service unavailable")
    return [None if "9" in s else "maybe" if "7" in s else ("3" in s) for s in items]

  decode = lambda row: " ".join(str(int(v)) for v in row)  # noqa: E731
  flat = tokens.reshape(-1, 4)
  strings = [decode(row) for row in flat]
  want = np.array([U_ if "9" in s else U_ if "7" in s else S_ if "3" in s else F_
                   for s in strings])
  assert any("0 0" in s for s in strings[4:8])  # the second batch raises
  for start in range(0, 14, 4):  # batches of 4: a raising batch is unscored as a whole
    if any("0 0" in s for s in strings[start:start + 4]):
      want[start:start + 4] = U_
  with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    got = jax.jit(lambda t: text.host_judge(judge, t, batch_size=4, decode=decode))(tokens)
    got = np.asarray(got)
  assert calls == [4, 4, 4, 2]
  np.testing.assert_array_equal(got, want.reshape(7, 2))
  assert np.any(got == U_) and np.any(got == S_) and np.any(got == F_)
  rate = metrics.JudgedRate.from_verdicts(got).compute(unscored="failure")
  assert int(rate["unscored"]) == int(np.sum(want == U_))
  assert int(rate["failures"]) == int(np.sum(want == F_))  # the unscored are not among them


def test_host_judge_with_a_wrong_number_of_answers_and_under_vmap():
  tokens = jnp.asarray(responses(2, batch=5, samples=1, length=3)[:, 0])
  with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    short = text.host_judge(lambda items: [True], tokens, batch_size=2)
  np.testing.assert_array_equal(short, [U_, U_, U_, U_, S_])  # the last batch has one item
  rule = lambda items: [int(3 in row) for row in items]  # noqa: E731
  stacked = jnp.stack([tokens, tokens[::-1]])
  mapped = jax.vmap(lambda t: text.host_judge(rule, t, batch_size=3))(stacked)
  direct = np.array([[int(3 in row) for row in np.asarray(t)] for t in stacked])
  np.testing.assert_array_equal(mapped, direct)
  with pytest.raises(ValueError, match="batch_size"):
    text.host_judge(rule, tokens, batch_size=0)


def test_synthetic_judges_give_closed_form_rates():
  """Responses j = 0..5 of prompt i hold token (i + j) mod 6 at every position: token 3 or 4
  succeeds, 5 is unscored (NaN), the rest fail: 2 successes, 1 unscored, 3 failures per prompt
  for the JAX judge and the host judge alike."""
  i, j = np.meshgrid(np.arange(20), np.arange(6), indexing="ij")
  tokens = np.broadcast_to(((i + j) % 6)[..., None], (20, 6, 4)).astype(np.int32)
  score = lambda t: jnp.where(t[:, 0] == 5, jnp.nan, jnp.where((t[:, 0] == 3) | (t[:, 0] == 4),
                                                               1.0, -1.0))  # noqa: E731
  host = lambda items: [None if r[0] == 5 else bool(r[0] in (3, 4)) for r in items]  # noqa: E731
  for verdicts in (text.classifier_judge(score, tokens),
                   text.host_judge(host, tokens, batch_size=16)):
    out = metrics.JudgedRate.from_verdicts(verdicts).compute(k=1)
    assert (int(out["successes"]), int(out["unscored"]), int(out["failures"])) == (40, 20, 60)
    assert float(out["rate"]) == pytest.approx(0.4)
    assert float(out["hit_at_k"]) == pytest.approx(0.4)
    assert float(out["hit_any"]) == 1.0
