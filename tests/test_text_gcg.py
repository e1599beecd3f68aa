"""GCG (jaxrobust.text.run_gcg) against closed-form causal LMs.

The test LM reads its tables from the embedding table, so every model below shares one compiled
program per attack configuration: token ``v`` embeds as ``[M[v], N[v]]`` and the logits at
position ``t`` are ``M[x_t] + N[x_{t-1}]`` (``N = 0``: a bigram LM). All arithmetic is exact
(a one-hot row lookup plus one addition), so NLLs and greedy decodes recomputed in NumPy are
independent references, and batch order, chunking and sharding must give bitwise equal results.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrobust.text import GCGResult, gcg, run_gcg
from jaxrobust.text._gcg import _score_candidates, _score_in_chunks, check_gcg_inputs, prepare
from jaxrobust.text._gcg_distinct import distinct_rows

V, B, T = 32, 8, 2
PROMPT_LENGTH = 3
COMPILE_FAST = {"xla_backend_optimization_level": 0}


def shift_lm(embeds):
  """``[N, L, 2V] -> [N, L, V]``: ``M[x_t] + N[x_{t-1}]`` (causal: position t sees t and t-1)."""
  now, previous = embeds[..., :V], embeds[..., V:]
  previous = jnp.pad(previous[:, :-1], ((0, 0), (1, 0), (0, 0)))
  return now + previous


def table(m, n):
  return jnp.asarray(np.concatenate([m, n], axis=1), jnp.float32)


def planted_bigram():
  """Example ``i`` has target ``[i, 31]``; only token ``8 + i`` is followed by ``i`` (the
  trigger), every token ``0..7`` by 31, every other token by 20."""
  m = np.zeros((V, V))
  m[:, :8] = -2.0
  m[np.arange(8, 16), np.arange(8)] = 6.0
  m[np.arange(8), 31] = 6.0
  rest = np.r_[16:V]
  m[rest, 20] = 4.0
  target = np.stack([np.arange(B), np.full(B, 31)], axis=1)
  return m, np.zeros((V, V)), target


def random_model(seed=0):
  rng = np.random.default_rng(seed)
  m, n = rng.normal(0.0, 3.0, (V, V)), rng.normal(0.0, 3.0, (V, V))
  return m, n, rng.integers(0, V, (B, T))


PROMPT = np.random.default_rng(1).integers(16, V, (B, PROMPT_LENGTH))


def np_logits(m, n, sequence):
  out = m[sequence].copy()
  out[1:] += n[sequence[:-1]]
  return out


def np_nll(m, n, prefix, target):
  """Mean NLL of ``target`` after ``prefix`` under the NumPy model (float64)."""
  logits = np_logits(m, n, np.concatenate([prefix, target]))[len(prefix) - 1:-1]
  top = logits.max(1, keepdims=True)
  log_p = logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))
  return -np.mean(log_p[np.arange(len(target)), target])


def np_greedy(m, n, prefix, steps):
  """Real autoregressive greedy decoding (no teacher forcing) of ``steps`` tokens."""
  sequence = list(prefix)
  for _ in range(steps):
    sequence.append(int(np.argmax(np_logits(m, n, np.array(sequence))[-1])))
  return np.array(sequence[len(prefix):])


@functools.lru_cache(maxsize=None)
def jitted(attack):
  return jax.jit(functools.partial(run_gcg, attack, shift_lm), compiler_options=COMPILE_FAST)


def attack_with(embedding, target, key, *, attack, allowed=None, prompt=PROMPT, **kwargs):
  allowed = np.ones(V, bool) if allowed is None else allowed
  return jitted(attack)(embedding, jnp.asarray(prompt), jnp.asarray(target), key,
                        allowed=jnp.asarray(allowed), **kwargs)


# One configuration per behaviour, shared by the tests (each costs one compilation).
SHORT = gcg(suffix_length=1, steps=1, search_width=2, topk=1)  # the gradient alone must find it
LONG = gcg(suffix_length=4, steps=8, search_width=8, topk=4)


def check_against_numpy(m, n, target, result, prompt=PROMPT):
  """The reported loss is the NumPy NLL of the returned suffix, and success is real greedy
  decoding reproducing the target."""
  suffix = np.asarray(result.suffix)
  for i in range(len(target)):
    prefix = np.concatenate([prompt[i], suffix[i]])
    np.testing.assert_allclose(float(result.loss[i]), np_nll(m, n, prefix, target[i]),
                               rtol=1e-5, atol=1e-6)
    decoded = np_greedy(m, n, prefix, len(target[i]))
    assert bool(result.success[i]) == bool(np.array_equal(decoded, target[i])), i


def test_one_gradient_step_finds_the_planted_trigger():
  m, n, target = planted_bigram()
  result = attack_with(table(m, n), target, jax.random.key(0), attack=SHORT)
  assert isinstance(result, GCGResult)
  np.testing.assert_array_equal(np.asarray(result.suffix), 8 + np.arange(B)[:, None])
  assert np.asarray(result.success).all()
  check_against_numpy(m, n, target, result)


def test_longer_suffix_finds_the_trigger_in_the_last_position():
  m, n, target = planted_bigram()
  result = attack_with(table(m, n), target, jax.random.key(0), attack=LONG)
  np.testing.assert_array_equal(np.asarray(result.suffix)[:, -1], 8 + np.arange(B))
  assert np.asarray(result.success).all()
  check_against_numpy(m, n, target, result)


def test_allowed_mask_is_respected_and_a_banned_trigger_means_failure():
  m, n, target = planted_bigram()
  # Three tokens allowed, fewer than topk = 4: only the triggers of examples 4 and 5 remain.
  allowed = np.zeros(V, bool)
  allowed[[12, 13, 20]] = True
  result = attack_with(table(m, n), target, jax.random.key(0), attack=LONG, allowed=allowed)
  assert np.isin(np.asarray(result.suffix), [12, 13, 20]).all()
  np.testing.assert_array_equal(np.asarray(result.success), np.isin(np.arange(B), [4, 5]))
  check_against_numpy(m, n, target, result)


def test_a_visited_success_is_never_dropped_for_a_lower_loss():
  # Example 0 wants [0, 31]: only token 16 makes 0 the argmax (p = 0.3: success); token 17 gives
  # 0 more probability, 0.45, but 0.55 to token 1 (lower loss, no success). Example 2 wants
  # [2, 31], with tokens 10 and 21 in the same roles and 22 a failure of higher loss.
  m, n, target = planted_bigram()
  m[8] = m[18]  # token 8 no longer leads to 0
  for success, lower, worse, first in ((16, 17, None, 0), (10, 21, 22, 2)):
    m[success] = 0.0
    m[success, first] = np.log(0.3 * 31 / 0.7)
    m[lower] = -20.0
    m[lower, first], m[lower, first + 1] = 0.0, np.log(0.55 / 0.45)
    prefix = lambda token: np.r_[PROMPT[first], token]
    assert np_nll(m, n, prefix(lower), target[first]) < np_nll(m, n, prefix(success),
                                                                target[first])
    assert not np.array_equal(np_greedy(m, n, prefix(lower), T), target[first])
  m[22] = 0.0
  m[22, 2], m[22, 5] = 3.5, 4.0
  target[1, 0] = 0
  # The gradient's top 2 (one step, 8 candidates: both visited): at 16 and at 18 they are 17 and
  # 16, so example 1 (from 18) meets the success and the lower loss in one step; at 10 they are
  # 21 and 22, so example 2 (from 10) only meets failures, one of them of lower loss.
  start = np.full((B, 1), 16, np.int32)
  start[1], start[2] = 18, 10
  wide = gcg(suffix_length=1, steps=1, search_width=8, topk=2)
  result = attack_with(table(m, n), target, jax.random.key(0), attack=wide,
                       init_suffix=jnp.asarray(start))
  np.testing.assert_array_equal(np.asarray(result.suffix)[:3, 0], [16, 16, 10])
  assert np.asarray(result.success)[:3].all()
  check_against_numpy(m, n, target, result)


def test_early_stop_keeps_the_first_success():
  early = gcg(suffix_length=4, steps=8, search_width=8, topk=4, early_stop=True)
  # Planted: every example succeeds, after which the remaining steps are skipped.
  m, n, target = planted_bigram()
  stopped = attack_with(table(m, n), target, jax.random.key(0), attack=early)
  np.testing.assert_array_equal(np.asarray(stopped.suffix)[:, -1], 8 + np.arange(B))
  check_against_numpy(m, n, target, stopped)
  # Random model: the same trajectory until a success, which then stops improving its loss.
  m, n, target = random_model(3)
  full = attack_with(table(m, n), target, jax.random.key(0), attack=LONG)
  stopped = attack_with(table(m, n), target, jax.random.key(0), attack=early)
  np.testing.assert_array_equal(np.asarray(stopped.success), np.asarray(full.success))
  gap = np.asarray(stopped.loss) - np.asarray(full.loss)
  assert (gap >= -1e-6).all() and (gap > 1e-3).any()
  unsolved = ~np.asarray(full.success)
  np.testing.assert_array_equal(np.asarray(stopped.suffix)[unsolved],
                                np.asarray(full.suffix)[unsolved])
  check_against_numpy(m, n, target, stopped)


def test_random_model_matches_numpy_and_improves_on_its_start():
  m, n, target = random_model()
  start = np.full((B, 4), 5, np.int32)
  result = attack_with(table(m, n), target, jax.random.key(3), attack=LONG,
                       init_suffix=jnp.asarray(start))
  check_against_numpy(m, n, target, result)
  start_loss = np.array([np_nll(m, n, np.concatenate([PROMPT[i], start[i]]), target[i])
                         for i in range(B)])
  loss = np.asarray(result.loss)
  assert (loss <= start_loss + 1e-6).all() and (loss < start_loss - 0.1).mean() >= 0.5


def test_same_key_same_result_and_batch_order_does_not_matter():
  m, n, target = random_model(1)
  keys = jax.random.split(jax.random.key(7), B)
  result = attack_with(table(m, n), target, keys, attack=LONG)
  again = attack_with(table(m, n), target, keys, attack=LONG)
  perm = np.random.default_rng(0).permutation(B)
  permuted = attack_with(table(m, n), target[perm], keys[perm], attack=LONG, prompt=PROMPT[perm])
  for a, b in zip(result, again):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for a, b in zip(result, permuted):
    np.testing.assert_array_equal(np.asarray(a)[perm], np.asarray(b))


def test_more_steps_never_return_a_worse_suffix():
  m, n, target = random_model(2)
  key = jax.random.key(5)
  longer = gcg(suffix_length=4, steps=16, search_width=8, topk=4)
  short = attack_with(table(m, n), target, key, attack=LONG)
  long = attack_with(table(m, n), target, key, attack=longer)
  short_success, long_success = np.asarray(short.success), np.asarray(long.success)
  assert (long_success >= short_success).all()
  same = long_success == short_success
  assert (np.asarray(long.loss)[same] <= np.asarray(short.loss)[same] + 1e-6).all()


def test_chunked_candidates_equal_unchunked():
  m, n, target = random_model(3)
  chunked = gcg(suffix_length=4, steps=8, search_width=8, topk=4, chunk_size=3)  # 3 + 3 + 2
  whole = attack_with(table(m, n), target, jax.random.key(1), attack=LONG)
  parts = attack_with(table(m, n), target, jax.random.key(1), attack=chunked)
  for a, b in zip(whole, parts):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# Far more draws than distinct candidates: 2 * 3 = 6 single-token changes (n_replace=1) and
# comb(3, 2) * 2**2 = 12 double ones, for 16 draws. Scored in chunks whose shape the reference
# (every draw scored, dedupe=False) shares: 6 rows as 2 chunks of 3 against 16 as 6 of 3, 12 as
# 3 of 4 against 16 as 4 of 4. XLA may round a loss differently in a pass of another row count
# (1 ulp seen for 16 rows against 6 at once), not in passes of one shape.
DEDUPED = gcg(suffix_length=2, steps=6, search_width=16, topk=3, chunk_size=3)
PAIRS = gcg(suffix_length=3, steps=6, search_width=16, topk=2, n_replace=2, chunk_size=4)
ROWS_SEEN = []  # rows per model call, recorded when traced


def counting_lm(embeds):
  ROWS_SEEN.append(embeds.shape[0])
  return shift_lm(embeds)


def test_distinct_rows_finds_each_candidate_once_in_order_of_first_draw():
  rows = np.random.default_rng(0).integers(0, 3, (4, 40, 2)).astype(np.int32)  # <= 9 distinct
  find = jax.jit(jax.vmap(lambda r: distinct_rows(r, 12)), compiler_options=COMPILE_FAST)
  unique, inverse = find(jnp.asarray(rows))
  unique, inverse = np.asarray(unique), np.asarray(inverse)
  for r, u, i in zip(rows, unique, inverse):
    order = list(dict.fromkeys(map(tuple, r.tolist())))  # distinct rows, first draw first
    assert [tuple(x) for x in u[:len(order)].tolist()] == order
    np.testing.assert_array_equal(u[i], r)
    np.testing.assert_array_equal(u[len(order):], np.broadcast_to(r[0], (12 - len(order), 2)))
    assert i.max() == len(order) - 1


def test_dedupe_is_bitwise_the_search_that_scores_every_draw():
  # n_replace=2 here; n_replace=1 below and in tests/test_text_gcg_cache.py (segments).
  m, n, target = random_model(5)
  keys = jax.random.split(jax.random.key(4), B)
  attack, every = PAIRS, PAIRS._replace(dedupe=False)
  assert (attack.scored_rows, every.scored_rows) == (12, 16)
  deduped = attack_with(table(m, n), target, keys, attack=attack)
  reference = attack_with(table(m, n), target, keys, attack=every)
  for a, b in zip(deduped, reference):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  check_against_numpy(m, n, target, deduped)


def test_every_draw_gets_the_loss_of_its_distinct_candidate():
  """One step's scores, on draws with many repeats (copies of the current suffix included): the
  deduplicated path against scoring every draw, bitwise in passes of one shape; and the row
  counts the model is traced with."""
  m, n, target = random_model(6)
  rng = np.random.default_rng(2)
  # As n_replace=1 draws: one of 2 positions set to one of 3 tokens, often the current one.
  current = rng.integers(0, 3, (B, 1, 2))
  at = rng.integers(0, 2, (B, DEDUPED.search_width, 1)) == np.arange(2)
  draws = np.where(at, rng.integers(0, 3, (B, DEDUPED.search_width, 1)), current)
  draws = draws.astype(np.int32)
  assert all(len(set(map(tuple, d.tolist()))) <= DEDUPED.scored_rows < len(d) for d in draws)
  ROWS_SEEN.clear()

  @functools.partial(jax.jit, compiler_options=COMPILE_FAST)
  def scores(embedding, prompt, target, draws):
    problem = prepare(DEDUPED, counting_lm, embedding, prompt, target, jax.random.key(0),
                      allowed=None, init_suffix=None, after_suffix=None, target_mask=None,
                      context_length=None, prefix_fn=None)[0]
    return (_score_candidates(problem, DEDUPED, draws),  # 2 chunks of 3 distinct rows
            _score_in_chunks(problem, draws, 3),  # every draw: 6 chunks of 3
            _score_candidates(problem, DEDUPED._replace(chunk_size=None), draws),  # 6 at once
            _score_in_chunks(problem, draws, None))  # every draw at once: 16

  out = scores(table(m, n), jnp.asarray(PROMPT), jnp.asarray(target), jnp.asarray(draws))
  (loss, success), (every_loss, every_success), (whole_loss, _), (all_loss, _) = out
  np.testing.assert_array_equal(np.asarray(loss), np.asarray(every_loss))
  np.testing.assert_array_equal(np.asarray(success), np.asarray(every_success))
  # Passes of other row counts (6 or 16 rows against chunks of 3) may round in the last bit
  # (gcg's documented dedupe caveat), so those agree to float32 rounding, not bitwise.
  np.testing.assert_allclose(np.asarray(whole_loss), np.asarray(loss), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(all_loss), np.asarray(loss), rtol=1e-6)
  assert sorted(set(ROWS_SEEN)) == [B, B * 3, B * 6, B * 16]  # B: the input check's trace

  # topk=8: 2 * 8 = 16 possible candidates, as many as draws, so no static saving; in chunks of
  # 3 the chunks past every example's distinct rows (at most 6 here) are skipped at run time.
  wide = DEDUPED._replace(topk=8)
  assert wide.scored_rows == wide.search_width == 16
  passes = []

  def lm_counting_passes(embeds):
    jax.debug.callback(lambda: passes.append(1))
    return shift_lm(embeds)

  @functools.partial(jax.jit, compiler_options=COMPILE_FAST)
  def skipping(embedding, prompt, target, draws):
    problem = prepare(wide, lm_counting_passes, embedding, prompt, target, jax.random.key(0),
                      allowed=None, init_suffix=None, after_suffix=None, target_mask=None,
                      context_length=None, prefix_fn=None)[0]
    return _score_candidates(problem, wide, draws)

  wide_loss, wide_success = skipping(table(m, n), jnp.asarray(PROMPT), jnp.asarray(target),
                                     jnp.asarray(draws))
  np.testing.assert_array_equal(np.asarray(wide_loss), np.asarray(every_loss))
  np.testing.assert_array_equal(np.asarray(wide_success), np.asarray(every_success))
  most = max(len(set(map(tuple, d.tolist()))) for d in draws)
  assert len(passes) == -(-most // 3) < 6  # chunks of 3 up to the last distinct row, of 6


def test_batch_sharded_on_eight_devices_equals_one_device():
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as P
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets jax_num_cpu_devices=8)")
  m, n, target = random_model(4)
  keys = jax.random.split(jax.random.key(2), B)
  single = attack_with(table(m, n), target, keys, attack=LONG)
  mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Explicit,))
  with jax.set_mesh(mesh):
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("batch")))
    sharded = attack_with(table(m, n), put(jnp.asarray(target)), put(keys), attack=LONG,
                          prompt=put(jnp.asarray(PROMPT)))
    assert len(sharded.suffix.sharding.device_set) == 8
  for a, b in zip(single, sharded):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_after_suffix_and_target_mask_align_with_numpy():
  # With a bigram LM the token right before the target decides, here the last after_suffix token.
  m, n, target = planted_bigram()
  odd = np.arange(B) % 2 == 1
  after = np.where(odd[:, None], np.stack([np.full(B, 16), 8 + np.arange(B)], 1),
                   np.stack([8 + np.arange(B), np.full(B, 16)], 1))  # odd rows end on the trigger
  target[odd, 1] = 5  # never follows a target token, but masked out on the odd rows
  mask = np.ones((B, T), bool)
  mask[odd, 1] = False
  result = attack_with(table(m, n), target, jax.random.key(0), attack=SHORT,
                       after_suffix=jnp.asarray(after), target_mask=jnp.asarray(mask))
  prefix = np.concatenate([PROMPT, np.asarray(result.suffix), after], axis=1)
  for i in range(B):
    np.testing.assert_allclose(float(result.loss[i]), np_nll(m, n, prefix[i], target[i][mask[i]]),
                               rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(result.success), odd)


def test_masked_target_positions_never_reach_the_loss_or_the_verdict():
  from jaxrobust.text._gcg import _target_scores
  logits = jnp.array([[[0.0, 2.0, 0.0], [jnp.nan, 0.0, 0.0]]] * 2)  # [2, T=2, 3]
  weights = jnp.array([[1.0, 0.0], [1.0, 1.0]])  # row 0 masks the NaN position, row 1 does not
  loss, success = jax.jit(_target_scores)(logits, jnp.array([[1, 0]] * 2), weights)
  np.testing.assert_allclose(float(loss[0]), np.log(2.0 + np.exp(2.0)) - 2.0, rtol=1e-6)
  assert np.isnan(float(loss[1])) and np.asarray(success).tolist() == [True, False]


def test_bad_inputs_raise_clear_errors():
  m, n, target = planted_bigram()
  embedding = table(m, n)
  prompt = jnp.asarray(PROMPT)
  target = jnp.asarray(target)
  good = dict(embedding=embedding, prompt=prompt, target=target)

  def check(match, attack=LONG, lm=shift_lm, **changes):
    args = {**good, **changes}
    with pytest.raises(ValueError, match=match):
      run_gcg(attack, lm, args.pop("embedding"), args.pop("prompt"), args.pop("target"),
              jax.random.key(0), **args)

  check(r"prompt token ids must lie in \[0, 32\).*min -1", prompt=prompt.at[0, 0].set(-1))
  check(r"prompt token ids must lie in \[0, 32\).*max 32", prompt=prompt.at[0, 0].set(V))
  check(r"target token ids must lie in \[0, 32\)", target=target.at[1, 1].set(40))
  check(r"after_suffix token ids", after_suffix=jnp.full((B, 1), V))
  check(r"target has 7 rows but prompt has 8", target=target[:7])
  check(r"target is empty", target=target[:, :0])
  check(r"allowed must be a bool array \[V\] = \[32\]", allowed=jnp.ones(V - 1, bool))
  check(r"allowed must be a bool array", allowed=jnp.ones(V, jnp.int32))
  check(r"allowed is all False", allowed=jnp.zeros(V, bool))
  check(r"init_suffix uses disallowed token ids \[3\]",
        allowed=jnp.arange(V) != 3, init_suffix=3)
  check(r"init_suffix must be None, a token id, or int ids of shape \[S\]",
        init_suffix=jnp.zeros(5, jnp.int32))
  check(r"3 \+ 4 \+ 0 \+ 2 = 9 tokens exceeds the model's context_length 8", context_length=8)
  check(r"topk \(64\) must be at most the vocabulary size V = 32",
        attack=gcg(suffix_length=4, topk=64))
  check(r"target_mask has a row with no target token",
        target_mask=jnp.zeros((B, T), bool).at[1:].set(True))
  check(r"lm_logits_fn must map embeddings .* it returned \(8, 9\)", lm=lambda e: e.sum(-1))
  check(r"attack must come from jr.text.gcg", attack=dict(steps=1))
  with pytest.raises(ValueError, match=r"steps must be an int >= 1, got 0"):
    gcg(steps=0)
  with pytest.raises(ValueError, match=r"n_replace \(5\) must be at most suffix_length \(4\)"):
    gcg(suffix_length=4, n_replace=5)
  with pytest.raises(ValueError, match=r"search_width must be an int >= 1"):
    gcg(search_width=0)
  # The host-side check accepts the good inputs and returns them normalised.
  checked = check_gcg_inputs(LONG, shift_lm, embedding, prompt, target)
  assert checked[3].shape == (V,) and checked[4].shape == (B, 0) and checked[5].shape == (B, T)
