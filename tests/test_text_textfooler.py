"""jr.text TextFooler-class attack: an exact reference run on an additive model (importance order,
greedy choices, swaps, queries), fewest swaps where importance order is gain order, queries by
hand, constraints never violated, traced budgets, batch order, devices, vmap, bad inputs."""

from __future__ import annotations

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrobust import text
from jaxrobust.text._textfooler import _leave_one_out, similarity_window

pytestmark = pytest.mark.compile_bound

VOCAB, LENGTH, SUBS, BATCH = 24, 6, 3, 48
UNK, PAD = 0, VOCAB - 1  # both weigh nothing in the additive model
STOP = np.isin(np.arange(VOCAB), [1, 2])
WINDOW, MIN_COS, MIN_SIM = 3, -0.5, 0.5
KEY = jax.random.key(0)
RNG = np.random.default_rng(0)
WEIGHTS = np.asarray(RNG.normal(size=(VOCAB, 2)) * 0.6, np.float32)
WEIGHTS[[UNK, PAD]] = 0.0
BIAS = np.asarray([0.3, -0.3], np.float32)
VECTORS = np.asarray(RNG.normal(size=(VOCAB, 4)), np.float32)
TAGS = RNG.integers(0, 2, size=VOCAB).astype(np.int32)
COMPATIBLE = np.eye(2, dtype=bool)
COMPATIBLE[0, 1] = True  # tag 0 may become tag 1, not the reverse
MEANING = np.asarray(RNG.uniform(size=VOCAB), np.float32)


def one_hot(tokens):
  return jax.nn.one_hot(tokens, VOCAB, dtype=jnp.float32)  # no gather: shards like tokens


def logits_fn(tokens):
  """``z_c = sum_i W[t_i, c] + b_c``: every word moves the margin independently."""
  return jnp.sum(one_hot(tokens) @ jnp.asarray(WEIGHTS), axis=1) + jnp.asarray(BIAS)[None]


def sentence_similarity(reference, rows, window):
  """``1 - |sum of MEANING over the window, substituted minus current|``."""
  meaning = jnp.asarray(MEANING)
  ref = jnp.sum(jnp.where(window, one_hot(reference) @ meaning, 0.0), axis=-1)
  new = jnp.sum(jnp.where(window[:, None], one_hot(rows) @ meaning, 0.0), axis=-1)
  return 1.0 - jnp.abs(new - ref[:, None])


def no_multiple_of_five(original, current, position, substitute):
  return substitute % 5 != 0


@functools.lru_cache(maxsize=None)
def data(seed: int = 1):
  """Tokens without repeats (padded rows among them), candidates with padding and the token
  itself, an editable mask, labels with three clean-misclassified rows, per-example budgets."""
  rng = np.random.default_rng(seed)
  tokens = np.stack([rng.permutation(np.arange(1, PAD))[:LENGTH] for _ in range(BATCH)])
  words = rng.integers(2, LENGTH + 1, size=BATCH)
  tokens[np.arange(LENGTH)[None, :] >= words[:, None]] = PAD
  tokens = tokens.astype(np.int32)
  candidates = rng.integers(1, PAD, size=(VOCAB, SUBS)).astype(np.int32)
  candidates[rng.random((VOCAB, SUBS)) < 0.2] = -1
  candidates[[UNK, PAD]] = -1
  candidates[5, 0] = 5  # a token listed as its own substitute is not a move
  editable = rng.random((BATCH, LENGTH)) < 0.9
  y = np.asarray(logits_fn(jnp.asarray(tokens))).argmax(1).astype(np.int32)
  y[[4, 11, 30]] = 1 - y[[4, 11, 30]]
  max_swaps = rng.integers(0, LENGTH + 1, size=BATCH).astype(np.int32)
  max_queries = np.where(rng.random(BATCH) < 0.5, rng.integers(1, 25, size=BATCH),
                         10_000).astype(np.int32)
  return tokens, candidates, editable, y, max_swaps, max_queries


# ------------------------------------------------------------------------------------------------
# The reference: the documented algorithm, one example at a time, in float64 NumPy.


def sigmoid(m):
  return 1.0 / (1.0 + math.exp(-m))


def margin(seq, label):
  z = WEIGHTS.astype(np.float64)[seq].sum(0) + BIAS
  return float(z[label] - z[1 - label])


def textattack_window(i, n, size):
  """TextAttack's ``text_window_around_index`` as the set of positions it covers."""
  half = (size - 1) / 2
  if i - half < 0:
    first, last = 0, min(size - 1, n - 1)
  elif i + half >= n:
    first, last = max(0, n - size), n - 1
  else:
    first, last = i - math.ceil(half), i + math.floor(half)
  return set(range(first, last + 1))


def reference_rules(original, new, words):
  """``(allowed, similarity, closest)`` of the constrained configuration for one substitute."""
  cos = VECTORS[original] @ VECTORS[new] / (np.linalg.norm(VECTORS[original])
                                            * np.linalg.norm(VECTORS[new]))
  similarity = 1.0 if words < WINDOW else 1.0 - abs(float(MEANING[new]) - float(MEANING[original]))
  ok = cos >= MIN_COS and COMPATIBLE[TAGS[original], TAGS[new]] and new % 5 != 0 \
      and similarity >= MIN_SIM
  closest = min(abs(cos - MIN_COS), abs(similarity - MIN_SIM) if words >= WINDOW else 1.0)
  return ok, similarity, closest


def reference(tokens, y, candidates, editable, max_swaps, max_queries, *, importance, flip_bonus,
              constrained):
  """Per example: ``(tokens_adv, success, swaps, queries, closest)``, ``closest`` the smallest
  gap of a decision (rows with a gap near float32 rounding are not judged)."""
  out = []
  for seq, label, edit, swap_budget, query_budget in zip(tokens, y, editable, max_swaps,
                                                         max_queries):
    m0 = margin(seq, label)
    if m0 <= 0:
      out.append((seq.copy(), True, 0, 1, 1.0))
      continue
    words = int(np.sum(seq != PAD))
    eligible = edit & (seq != PAD) & ~STOP[seq]
    importance_of = []
    for i in range(LENGTH):
      removed = seq.copy()
      if importance == "unk":
        removed[i] = UNK
      else:
        removed = np.concatenate([np.delete(seq, i), [PAD]])
      drop = sigmoid(m0) - sigmoid(margin(removed, label))
      importance_of.append(drop * (2 if flip_bonus and margin(removed, label) < 0 else 1))
    subs = []
    for i in range(LENGTH):
      listed = [c for k, c in enumerate(candidates[seq[i]])
                if c >= 0 and c != seq[i] and c not in candidates[seq[i]][:k]]
      subs.append(listed)
    visit = sorted((i for i in range(LENGTH) if eligible[i] and subs[i]),
                   key=lambda i: (-importance_of[i], i))
    ranked = sorted(importance_of[i] for i in visit)
    closest = min([b - a for a, b in zip(ranked, ranked[1:])] + [1.0])
    queries = 1 + int(eligible.sum())
    if swap_budget == 0:  # no swap allowed: nothing is ranked, only the clean text queried
      out.append((seq.copy(), False, 0, 1, closest))
      continue
    current, m_current, swaps, success = seq.copy(), m0, 0, False
    if queries >= query_budget:
      out.append((current, False, 0, min(queries, int(query_budget)), closest))
      continue
    for i in (visit if swap_budget > 0 else []):
      scored = []
      for c in subs[i]:
        ok, similarity, gap = True, 1.0, 1.0
        if constrained:
          ok, similarity, gap = reference_rules(seq[i], c, words)
        closest = min(closest, gap)
        if ok:
          trial = current.copy()
          trial[i] = c
          scored.append((c, margin(trial, label), similarity))
      scored = scored[:query_budget - queries]
      queries += len(scored)
      flips = [s for s in scored if s[1] < 0]
      probabilities = sorted(sigmoid(s[1]) for s in scored) + [sigmoid(m_current)]
      closest = min([closest] + [abs(a - b) for a in probabilities for b in probabilities
                                 if a != b])
      if flips:
        best = max(flips, key=lambda s: (s[2], -s[1]))  # max() keeps the first of equals
        current[i], success, swaps = best[0], True, swaps + 1
        break
      if scored:
        best = min(scored, key=lambda s: s[1])
        if best[1] < m_current:
          current[i], m_current, swaps = best[0], best[1], swaps + 1
      if queries >= query_budget or swaps >= swap_budget:
        break
    out.append((current, success, swaps, queries, closest))
  return out


# ------------------------------------------------------------------------------------------------
# The attack, compiled once per configuration (budgets and data are arguments; traces counted).

CONFIGS = {
    "unk+bonus, every constraint": (text.textfooler(
        importance="unk", unk_id=UNK, pad_id=PAD, flip_bonus=True, min_cos_sim=MIN_COS,
        min_similarity=MIN_SIM, window_size=WINDOW), True),
    "delete, no constraint": (text.textfooler(importance="delete", pad_id=PAD,
                                              flip_bonus=False), False),
}


@functools.lru_cache(maxsize=None)
def compiled(name: str):
  attack, constrained = CONFIGS[name]
  traces = []

  def counted(tokens):
    traces.append(1)
    return logits_fn(tokens)

  rules = dict(stop_words=jnp.asarray(STOP))
  if constrained:
    rules.update(word_vectors=jnp.asarray(VECTORS), pos=jnp.asarray(TAGS),
                 pos_compatible=jnp.asarray(COMPATIBLE), sentence_similarity=sentence_similarity,
                 constraints=(no_multiple_of_five,))

  def fn(tokens, y, key, candidates, editable, max_swaps, max_queries):
    return text.run_textfooler(attack, counted, tokens, y, key, candidates=candidates,
                               editable=editable, max_swaps=max_swaps, max_queries=max_queries,
                               **rules)

  return jax.jit(fn), traces


def attack(name, *, max_swaps=None, max_queries=None, order=None, key=KEY, candidates=None):
  tokens, table, editable, y, swaps, queries = data()
  rows = np.arange(BATCH) if order is None else order
  budget = lambda value, default: np.broadcast_to(default if value is None else value,
                                                  (BATCH,))[rows]
  return compiled(name)[0](jnp.asarray(tokens[rows]), jnp.asarray(y[rows]), key,
                           jnp.asarray(table if candidates is None else candidates),
                           jnp.asarray(editable[rows]),
                           jnp.asarray(budget(max_swaps, swaps)),
                           jnp.asarray(budget(max_queries, queries)))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_equals_the_reference_on_an_additive_model(name):
  tokens, candidates, editable, y, max_swaps, max_queries = data()
  attack_config, constrained = CONFIGS[name]
  result = attack(name)
  expected = reference(tokens, y, candidates, editable, max_swaps, max_queries,
                       importance=attack_config.importance, flip_bonus=attack_config.flip_bonus,
                       constrained=constrained)
  judged = np.array([e[4] > 1e-4 for e in expected])
  assert judged.mean() > 0.9
  for field, index in (("tokens_adv", 0), ("success", 1), ("swaps", 2), ("queries", 3)):
    want = np.array([e[index] for e in expected])
    np.testing.assert_array_equal(np.asarray(getattr(result, field))[judged], want[judged],
                                  err_msg=field)
  success, swaps = np.asarray(result.success), np.asarray(result.swaps)
  skipped = np.asarray(result.skipped)
  assert skipped.tolist() == [i in (4, 11, 30) for i in range(BATCH)]
  attacked = ~skipped
  assert np.sum(success & attacked) >= 5 and np.sum(~success & attacked) >= 5
  assert np.any(swaps > 1) and np.any(np.asarray(result.queries) == max_queries)
  np.testing.assert_array_equal(np.asarray(result.words), np.sum(tokens != PAD, axis=1))
  np.testing.assert_allclose(np.asarray(result.perturbed_fraction),
                             swaps / np.sum(tokens != PAD, axis=1), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(result.logits),
                             np.asarray(logits_fn(result.tokens_adv)), rtol=1e-5, atol=1e-5)


def test_fewest_swaps_when_importance_order_is_gain_order():
  """Every word's substitutes include the one strongest counter-word: each position's best
  substitute is that word, gains are ordered as importances, so greedy is optimal."""
  tokens, candidates, editable, y, _, _ = data()
  strongest = np.argmin(WEIGHTS[1:PAD, 1] - WEIGHTS[1:PAD, 0]) + 1  # pulls hardest to class 0
  strongest_other = np.argmax(WEIGHTS[1:PAD, 1] - WEIGHTS[1:PAD, 0]) + 1
  table = candidates.copy()
  table[1:PAD, 0] = -1  # the slot of the counter-word, by label below
  result = {}
  for label, counter in ((1, strongest), (0, strongest_other)):
    table[1:PAD, 0] = counter
    result[label] = attack("delete, no constraint", max_swaps=LENGTH, max_queries=10_000,
                           candidates=table)
  share = (WEIGHTS[:, 1] - WEIGHTS[:, 0])  # a token's share of z_1 - z_0
  checked = 0
  for b in range(BATCH):
    if b in (4, 11, 30):
      continue
    label, counter = (1, strongest) if y[b] == 1 else (0, strongest_other)
    sign = 1 if label == 1 else -1
    m = sign * (share[tokens[b]].sum() + BIAS[1] - BIAS[0])
    eligible = editable[b] & (tokens[b] != PAD) & ~STOP[tokens[b]] & (tokens[b] != counter)
    gains = np.sort(sign * (share[tokens[b]] - share[counter])[eligible])[::-1]
    partial = m - np.cumsum(gains)
    fewest = int(np.argmax(partial < 0)) + 1 if np.any(partial < 0) else None
    found = result[label]
    if fewest is None:
      assert not bool(found.success[b])
    else:
      assert bool(found.success[b]) and int(found.swaps[b]) == fewest, b
      checked += fewest > 1
  assert checked >= 3


def test_queries_counted_by_hand_and_the_query_budget_truncates():
  weight = jnp.array([0.0, 2.0, 1.0, -3.0, -0.5, 0.3])
  model = lambda t: jnp.stack([jnp.zeros(t.shape[0]), weight[t].sum(1)], axis=1)
  candidates = jnp.array([[-1, -1], [4, 5], [4, 3], [-1, -1], [-1, -1], [-1, -1]])
  run = jax.jit(lambda budget: text.run_textfooler(
      text.textfooler(unk_id=0), model, jnp.array([[1, 2, 1, 5]]), jnp.array([1]), KEY,
      candidates=candidates, max_queries=budget))
  # margin 5.3; importance: the 1s (weight 2) first, position 0 then 2, then 2, then 5 (no
  # substitutes, ranked but never visited). Clean 1 + ranking 4 = 5. Position 0: 4 -> 2.8, 5 ->
  # 3.6: keep 4 (2 queries). Position 2: 4 -> 0.3, 5 -> 1.1: keep 4 (2). Position 1: 4 -> -1.2,
  # 3 -> -3.7: both flip, no similarity: the lowest p_y, 3 (2). 11 queries, 3 swaps.
  result = run(1000)
  assert result.tokens_adv.tolist() == [[4, 3, 4, 5]] and result.queries.tolist() == [11]
  assert result.swaps.tolist() == [3] and result.success.tolist() == [True]
  # Budget 10: position 1 queries only its first substitute (4: a flip); 5: the ranking alone.
  assert run(10).tokens_adv.tolist() == [[4, 4, 4, 5]] and run(10).queries.tolist() == [10]
  five = run(5)
  assert five.tokens_adv.tolist() == [[1, 2, 1, 5]] and five.queries.tolist() == [5]
  assert not bool(five.success[0])


def test_saturated_probabilities_are_still_compared():
  """p_y rounds to 1.0 in float32 for every text here (margins 60, 25, 22); the log-odds still
  tell the substitutes apart, so the search keeps 3 (margin 22), then flips with 3 again."""
  weight = jnp.array([0.0, 30.0, -5.0, -8.0])
  model = lambda t: jnp.stack([jnp.zeros(t.shape[0]), weight[t].sum(1)], axis=1)
  candidates = jnp.array([[-1, -1], [2, 3], [-1, -1], [-1, -1]])
  result = jax.jit(lambda tokens: text.run_textfooler(
      text.textfooler(unk_id=0), model, tokens, jnp.array([1]), KEY, candidates=candidates))(
          jnp.array([[1, 1]]))
  assert result.tokens_adv.tolist() == [[3, 3]] and result.success.tolist() == [True]
  assert result.queries.tolist() == [1 + 2 + 2 + 2]


def test_constraints_are_never_violated():
  tokens, _, _, y, _, _ = data()
  constrained = attack("unk+bonus, every constraint", max_swaps=LENGTH, max_queries=10_000)
  free = attack("delete, no constraint", max_swaps=LENGTH, max_queries=10_000)
  words = np.sum(tokens != PAD, axis=1)

  def violations(result):
    adv = np.asarray(result.tokens_adv)
    rows, cols = np.nonzero(adv != tokens)
    return sum(not reference_rules(tokens[r, c], adv[r, c], words[r])[0] or STOP[tokens[r, c]]
               for r, c in zip(rows, cols)), len(rows)

  bad, changed = violations(constrained)
  assert bad == 0 and changed >= 10
  assert violations(free)[0] >= 5  # without the constraints these substitutes are used
  assert np.asarray(constrained.success).sum() < np.asarray(free.success).sum()


def test_budgets_are_traced_respected_and_give_the_swap_curve():
  tokens, _, _, y, _, _ = data()
  _, traces = compiled("delete, no constraint")
  full = attack("delete, no constraint", max_swaps=LENGTH, max_queries=10_000)
  before = len(traces)
  clean = np.asarray(logits_fn(jnp.asarray(tokens))).argmax(1) == y
  curve = text.swap_curve(full, jnp.asarray(y), jnp.arange(LENGTH + 1, dtype=jnp.int32))
  for k in range(LENGTH + 1):
    alone = attack("delete, no constraint", max_swaps=k, max_queries=10_000)
    assert np.all(np.asarray(alone.swaps) <= k)
    np.testing.assert_array_equal(np.asarray(curve.robust[k]),
                                  clean & ~np.asarray(alone.success))
  for q in (1, 4, 9):
    limited = attack("delete, no constraint", max_swaps=LENGTH, max_queries=q)
    assert np.all(np.asarray(limited.queries) <= q)
  assert len(traces) == before  # new budgets are new data, not a new program


def test_batch_order_and_key_do_not_matter():
  first = attack("unk+bonus, every constraint")
  order = np.random.default_rng(3).permutation(BATCH)
  permuted = attack("unk+bonus, every constraint", order=order)
  other_key = attack("unk+bonus, every constraint", key=jax.random.key(9))
  for name in text.TextFoolerResult._fields:
    a = np.asarray(getattr(first, name))
    np.testing.assert_array_equal(np.asarray(getattr(permuted, name)), a[order])
    np.testing.assert_array_equal(np.asarray(getattr(other_key, name)), a)


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_eight_devices_batch_sharded_identical(axis_type):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets jax_num_cpu_devices=8)")
  tokens, candidates, editable, y, max_swaps, max_queries = data()
  single = attack("delete, no constraint")
  mesh = jax.make_mesh((8,), ("batch",), axis_types=(axis_type,))
  put = lambda a: jax.device_put(jnp.asarray(a), NamedSharding(mesh, P("batch")))
  with jax.set_mesh(mesh):
    sharded = compiled("delete, no constraint")[0](
        put(tokens), put(y), KEY, jnp.asarray(candidates), put(editable), put(max_swaps),
        put(max_queries))
    assert len(sharded.tokens_adv.sharding.device_set) == 8
  for name in text.TextFoolerResult._fields:
    np.testing.assert_array_equal(np.asarray(getattr(sharded, name)),
                                  np.asarray(getattr(single, name)))


def test_vmap_over_batches_equals_separate_runs():
  tokens, candidates, editable, y, max_swaps, max_queries = data()
  attack_config = CONFIGS["delete, no constraint"][0]
  run = lambda t, labels, e, s, q: text.run_textfooler(
      attack_config, logits_fn, t, labels, KEY, candidates=jnp.asarray(candidates), editable=e,
      stop_words=jnp.asarray(STOP), max_swaps=s, max_queries=q)
  halves = [np.split(np.asarray(a), 2) for a in (tokens, y, editable, max_swaps, max_queries)]
  stacked = jax.jit(jax.vmap(run))(*(jnp.asarray(np.stack(h)) for h in halves))
  single = attack("delete, no constraint")
  for name in text.TextFoolerResult._fields:
    np.testing.assert_array_equal(np.asarray(getattr(stacked, name)).reshape(
        np.asarray(getattr(single, name)).shape), np.asarray(getattr(single, name)))


def test_removed_word_rows():
  tokens = jnp.array([[1, 2, 3, 9]])
  deleted = _leave_one_out(text.textfooler(importance="delete", pad_id=9), tokens)
  assert deleted.tolist() == [[[2, 3, 9, 9], [1, 3, 9, 9], [1, 2, 9, 9], [1, 2, 3, 9]]]
  unknown = _leave_one_out(text.textfooler(unk_id=0), tokens)
  assert unknown.tolist() == [[[0, 2, 3, 9], [1, 0, 3, 9], [1, 2, 0, 9], [1, 2, 3, 0]]]
  for attack, rows in ((text.textfooler(importance="delete", pad_id=9), deleted),
                       (text.textfooler(unk_id=0), unknown)):  # the clean text first, then them
    assert _leave_one_out(attack, tokens, with_clean=True).tolist() == [tokens.tolist()[0:1]
                                                                        + rows.tolist()[0]]


def test_similarity_window_is_textattacks():
  cases = [(n, i) for n in range(1, 9) for i in range(n)]
  words, positions = (jnp.asarray(np.array(column)) for column in zip(*cases))
  for size in range(1, 10):
    window = np.asarray(similarity_window(positions, words, size, 9))
    for (n, i), row in zip(cases, window):
      assert set(np.flatnonzero(row)) == textattack_window(i, n, size), (n, size, i)


def test_textattack_summary_by_hand():
  result = text.TextFoolerResult(
      tokens_adv=None, success=jnp.array([True, True, False, True]),
      swaps=jnp.array([0, 1, 2, 3], jnp.int32), logits=None,
      queries=jnp.array([1, 10, 20, 30], jnp.int32), max_swaps=None,
      skipped=jnp.array([True, False, False, False]), words=jnp.array([4, 4, 5, 6], jnp.int32),
      perturbed_fraction=None)
  summary = jax.jit(text.textattack_summary)(result)
  assert (int(summary.successful), int(summary.failed), int(summary.skipped)) == (2, 1, 1)
  assert float(summary.attack_success_rate) == pytest.approx(2 / 3)
  assert float(summary.original_accuracy) == 0.75 and float(summary.accuracy_under_attack) == 0.25
  assert float(summary.average_perturbed_word_percent) == pytest.approx((25.0 + 50.0) / 2)
  assert float(summary.average_queries) == 20.0 and float(summary.average_words) == 4.75
  with pytest.raises(ValueError, match="give words"):
    text.textattack_summary(text.Result(None, result.success, result.swaps, None, result.queries))


def test_the_padding_id_is_never_swapped_in():
  """A candidate equal to ``pad_id`` would delete its word (padding is no word) and count as a
  success: it is skipped. Words 1-3 push towards class 0; only padding (0) or word 4 can replace
  them, and word 4 pushes towards class 0 too, so nothing breaks the text."""
  weight = jnp.zeros((5, 2)).at[1:5, 0].set(1.0)
  logits_fn = lambda t: jnp.sum(jax.nn.one_hot(t, 5) @ weight, axis=1) + jnp.array([[0.0, 2.5]])
  tokens, y = jnp.array([[1, 2, 3, 0]]), jnp.array([0])
  candidates = jnp.array([[-1, -1], [0, 4], [0, 4], [0, 4], [-1, -1]])
  for importance in ("unk", "delete"):
    attack = text.textfooler(importance=importance, unk_id=4, pad_id=0)
    result = text.run_textfooler(attack, logits_fn, tokens, y, KEY, candidates=candidates)
    assert 0 not in result.tokens_adv[0, :3].tolist() and not bool(result.success[0])


def test_config_is_static_recorded_and_validated():
  attack_config = text.textfooler(importance="delete", pad_id=0, flip_bonus=False)
  assert hash(attack_config) == hash(text.textfooler(importance="delete", pad_id=0,
                                                     flip_bonus=False))
  assert json.loads(attack_config.config) == {
      "factory": "textfooler", "importance": "delete", "unk_id": None, "pad_id": 0,
      "flip_bonus": False, "min_cos_sim": 0.5, "min_similarity": 0.840845057, "window_size": 15}
  for kwargs, message in ((dict(), "give its id, unk_id"),
                          (dict(importance="delete"), "give pad_id"),
                          (dict(importance="drop", unk_id=0), "importance must be one of"),
                          (dict(unk_id=-1), "unk_id must be an int >= 0"),
                          (dict(unk_id=0, min_cos_sim=1.5), "min_cos_sim"),
                          (dict(unk_id=0, window_size=0), "window_size must be an int >= 1"),
                          (dict(unk_id=0, flip_bonus=1), "flip_bonus must be a bool")):
    with pytest.raises(ValueError, match=message):
      text.textfooler(**kwargs)


def _call(**changes):
  args = dict(attack=text.textfooler(unk_id=0, pad_id=4), logits_fn=lambda t: one_hot(t).sum(1)[
      :, :2], tokens=jnp.array([[0, 1, 2], [3, 4, 4]]), y=jnp.array([0, 1]), key=KEY,
              candidates=jnp.array([[1], [2], [-1], [4], [0]]))
  args.update(changes)
  a = args.pop
  return text.run_textfooler(a("attack"), a("logits_fn"), a("tokens"), a("y"), a("key"), **args)


@pytest.mark.parametrize("changes, error, message", [
    (dict(tokens=jnp.array([[0, 1, 5], [0, 0, 0]])), ValueError,
     r"tokens .*\[0, 5\) \(rows of candidates, one per token id\).*max 5"),
    (dict(tokens=jnp.zeros((2, 3))), TypeError, "tokens must be an int array"),
    (dict(candidates=jnp.array([[1], [2], [-2], [4], [0]])), ValueError, r"candidates.*min -2"),
    (dict(logits_fn=lambda t: one_hot(t).sum(1)[:, :2] * jnp.ones((2, 1))), ValueError,
     r"logits_fn runs on the 2 rows of tokens but fails on 8 rows: TextFooler scores"),
    (dict(candidates=jnp.zeros((5, 1))), TypeError, "candidates must be an int array"),
    (dict(attack=text.textfooler(unk_id=7)), ValueError, "unk_id=7 is not a token id"),
    (dict(max_swaps=-1), ValueError, "max_swaps must be >= 0"),
    (dict(max_queries=0), ValueError, "max_queries must be >= 1"),
    (dict(max_queries=jnp.array([1, 2, 3])), ValueError, r"max_queries .*\[B\] = \[2\]"),
    (dict(max_swaps=1.0), TypeError, "max_swaps must be an int"),
    (dict(editable=jnp.zeros((2, 3), bool)), ValueError, "editable has no True entry"),
    (dict(y=jnp.array([0, 2])), ValueError, r"y must lie in \[0, 2\)"),
    (dict(y=jnp.array([0, 1, 1])), ValueError, "Batch sizes differ"),
    (dict(logits_fn=lambda t: t.sum(1)), ValueError, r"logits of shape \[B, C\]"),
    (dict(stop_words=jnp.zeros(4, bool)), ValueError, r"stop_words must have one entry"),
    (dict(stop_words=jnp.zeros(5, jnp.int32)), TypeError, "stop_words must be a bool"),
    (dict(word_vectors=jnp.zeros((5, 2), jnp.int32)), TypeError, "word_vectors must be a float"),
    (dict(pos=jnp.zeros(5, jnp.float32)), TypeError, "pos must be an int"),
    (dict(pos_compatible=jnp.ones((2, 2), bool)), ValueError, "pos_compatible needs the tags"),
    (dict(pos=jnp.array([0, 1, 2, 0, 0]), pos_compatible=jnp.ones((2, 2), bool)), ValueError,
     r"pos must hold tags in \[0, 2\).*max 2"),
    (dict(sentence_similarity=lambda r, rows, w: rows.sum(-1)), ValueError,
     "sentence_similarity must return float scores"),
    (dict(constraints=(lambda o, c, p, s: s,)), ValueError, "a constraint must return a bool"),
    (dict(constraints=lambda o, c, p, s: s > 0), TypeError, "constraints must be a tuple"),
    (dict(attack=text.word_swap()), TypeError, "textfooler"),
    (dict(attack=text.TextFooler(importance="delete")), ValueError, "needs pad_id"),
    (dict(key=jnp.zeros(3)), ValueError, "key must be"),
])
def test_bad_inputs_raise_naming_the_problem(changes, error, message):
  with pytest.raises(error, match=message):
    _call(**changes)
