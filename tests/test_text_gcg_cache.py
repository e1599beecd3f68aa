"""GCG with the prompt's key/value cache (``run_gcg(prefix_fn=...)``) and in resumable segments
(``gcg_segment``, ``save_gcg_state``, ``load_gcg_state``).

Ground truth for the cache: the same attack on the same one-layer attention LM (the text demo's
``TinyCausalLM`` at random weights, large enough that candidate losses never tie to float
rounding) run on whole sequences. The cached model computes the same numbers in another order,
so losses agree to float32 tolerance and the suffixes exactly. Segments repeat one run's program
path step by step, so their states are compared bitwise.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrobust.demo.text_models import TinyCausalLM
from jaxrobust.text import (GCGState, gcg, gcg_segment, load_gcg_state, run_gcg,
                            save_gcg_state)

V, B, P, A, T, CONTEXT = 24, 8, 6, 2, 3, 16
COMPILE_FAST = {"xla_backend_optimization_level": 0}
# 24 draws, at most 3 * 6 = 18 distinct (dedupe, the default): 18 rows per step, in chunks of at
# most 7, that is three of 6.
ATTACK = gcg(suffix_length=3, steps=4, search_width=24, topk=6, chunk_size=7)
RNG = np.random.default_rng(0)
PROMPT, TARGET, AFTER = (RNG.integers(0, V, (B, n)).astype(np.int32) for n in (P, T, A))


def language_model():
  lm = TinyCausalLM(V, context_length=CONTEXT, dim=16, heads=2, layers=1, rngs=nnx.Rngs(1))
  graphdef, state = nnx.split(lm)
  # Wider logits than the initialisation's: candidates' losses then differ by far more than
  # float32 rounding (no near ties for the two paths to break differently).
  state = jax.tree.map(lambda a: 1.0 * a, state)
  return graphdef, state


GRAPHDEF, WEIGHTS = language_model()
CALLS = []  # one entry per execution of prefix_fn (a host callback: counts runs, not traces)
SEEN_LENGTHS = []  # the sequence lengths lm_logits_fn was traced with


def uncached_lm(weights, embeds):
  return nnx.merge(GRAPHDEF, weights).logits_from_embeddings(embeds)


def cached_lm(weights, embeds, cache):
  SEEN_LENGTHS.append(embeds.shape[1])
  return nnx.merge(GRAPHDEF, weights).logits_after_prefix(embeds, cache)


def prefix_fn(weights, prompt_embeds):
  jax.debug.callback(lambda: CALLS.append(1))
  return nnx.merge(GRAPHDEF, weights).prefix_cache(prompt_embeds)


@functools.partial(jax.jit, static_argnames=("cached", "attack"),
                   compiler_options=COMPILE_FAST)
def attack_fn(weights, prompt, target, after, key, *, cached, attack=ATTACK):
  table = weights["embed"]["embedding"][...]
  if not cached:
    return run_gcg(attack, functools.partial(uncached_lm, weights), table, prompt, target, key,
                   after_suffix=after, context_length=CONTEXT)
  return run_gcg(attack, functools.partial(cached_lm, weights), table, prompt, target, key,
                 after_suffix=after, context_length=CONTEXT,
                 prefix_fn=functools.partial(prefix_fn, weights))


def inputs(rows=slice(None)):
  keys = jax.random.split(jax.random.key(3), B)[rows]
  return (WEIGHTS, jnp.asarray(PROMPT[rows]), jnp.asarray(TARGET[rows]), jnp.asarray(AFTER[rows]),
          keys)


@pytest.fixture(scope="module")
def cached_result():
  return attack_fn(*inputs(), cached=True)


def assert_same(a, b, *, exact_loss=False):
  np.testing.assert_array_equal(np.asarray(a.suffix), np.asarray(b.suffix))
  np.testing.assert_array_equal(np.asarray(a.success), np.asarray(b.success))
  if exact_loss:
    np.testing.assert_array_equal(np.asarray(a.loss), np.asarray(b.loss))
  else:
    np.testing.assert_allclose(np.asarray(a.loss), np.asarray(b.loss), rtol=2e-5, atol=1e-6)


def test_cached_run_equals_the_whole_sequence_run_and_computes_the_prefix_once(cached_result):
  CALLS.clear()
  cached = jax.block_until_ready(attack_fn(*inputs(), cached=True))
  assert len(CALLS) == 1  # 4 steps x (1 gradient + 3 chunks) passes, one prefix computation
  assert ATTACK.scored_rows == 18
  assert set(SEEN_LENGTHS) == {ATTACK.suffix_length + A + T}  # the prompt is never re-run
  whole = attack_fn(*inputs(), cached=False)
  assert_same(cached, whole)
  assert_same(cached, cached_result, exact_loss=True)
  # The search moved: most suffixes beat a start of their own loss by a margin no rounding makes.
  start = attack_fn(*inputs(), cached=True, attack=gcg(suffix_length=3, steps=1, search_width=1,
                                                       topk=6))
  assert (np.asarray(cached.loss) < np.asarray(start.loss) - 0.05).mean() >= 0.5


def test_cached_results_do_not_depend_on_batch_order(cached_result):
  perm = np.random.default_rng(1).permutation(B)
  weights, prompt, target, after, keys = inputs()
  permuted = attack_fn(weights, prompt[perm], target[perm], after[perm], keys[perm], cached=True)
  for mine, theirs in zip(cached_result, permuted):
    np.testing.assert_allclose(np.asarray(mine)[perm], np.asarray(theirs), rtol=1e-6)


def test_cached_batch_sharded_on_eight_devices_equals_one_device(cached_result):
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as PS
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets jax_num_cpu_devices=8)")
  mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Explicit,))
  with jax.set_mesh(mesh):
    put = lambda a: jax.device_put(a, NamedSharding(mesh, PS("batch")))
    weights, *batch = inputs()
    sharded = attack_fn(weights, *(put(a) for a in batch), cached=True)
    assert len(sharded.suffix.sharding.device_set) == 8
  assert_same(cached_result, sharded)


# 18 rows (at most 3 * 6 distinct of 24 draws) in 3 chunks of 6; dedupe=False scores all 24 in
# 4 chunks of the same shape (XLA may round a pass of another row count differently).
SEGMENTED = gcg(suffix_length=3, steps=6, search_width=24, topk=6, chunk_size=6, early_stop=True)


@functools.partial(jax.jit, static_argnames=("steps", "attack"), compiler_options=COMPILE_FAST)
def segment_fn(weights, prompt, target, after, keys, state, *, steps, attack=SEGMENTED):
  return gcg_segment(attack, functools.partial(cached_lm, weights),
                     weights["embed"]["embedding"][...], prompt, target, keys, steps=steps,
                     state=state, after_suffix=after, context_length=CONTEXT,
                     prefix_fn=functools.partial(prefix_fn, weights))


def test_segments_equal_one_run_and_resume_from_a_file(tmp_path):
  whole = segment_fn(*inputs(), None, steps=6)
  assert int(whole.step) == 6
  path = tmp_path / "gcg_state.npz"
  assert load_gcg_state(path, SEGMENTED) is None
  state = None
  for segment in range(3):
    state = segment_fn(*inputs(), state, steps=2)
    save_gcg_state(path, state, SEGMENTED)
    if segment == 0:  # interrupted after the first segment: the rest resumes from the file
      state = None
      state = load_gcg_state(path, SEGMENTED)
      assert isinstance(state, GCGState) and int(state.step) == 2
      after_first = state
  for mine, theirs in zip(whole, state):
    np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))
  np.testing.assert_array_equal(np.asarray(load_gcg_state(path, SEGMENTED).best), whole.best)
  # The same search as run_gcg's (which re-scores the best suffix at the end).
  full = attack_fn(*inputs(), cached=True, attack=SEGMENTED)
  assert_same(whole.result(), full)
  # Steps 3 to 6 again, scoring every draw (dedupe=False: 24 rows a step, not 18): the same
  # search bitwise (the same candidate losses, which best_loss records, moves and best
  # suffixes). A file saved with either setting resumes with the other.
  every = gcg(suffix_length=3, steps=6, search_width=24, topk=6, chunk_size=6, early_stop=True,
              dedupe=False)
  assert every.scored_rows == 24
  reference = after_first
  for _ in range(2):
    reference = segment_fn(*inputs(), reference, steps=2, attack=every)
  for mine, theirs in zip(whole, reference):
    np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))
  np.testing.assert_array_equal(np.asarray(load_gcg_state(path, every).best), whole.best)
  # A traced state past the budget (the concrete check cannot run inside jit): steps beyond the
  # attack's 6 change nothing and are not counted.
  past = segment_fn(*inputs(), whole, steps=2)
  assert int(past.step) == 6
  for mine, theirs in zip(whole, past):
    np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))


def test_inconsistent_cache_and_state_raise_clear_errors(tmp_path):
  weights, prompt, target, after, keys = inputs()
  table = weights["embed"]["embedding"][...]
  lm = functools.partial(cached_lm, weights)
  prefix = functools.partial(prefix_fn, weights)
  attack = gcg(suffix_length=3, steps=2, search_width=4, topk=4)

  def check(match, call=run_gcg, lm=lm, prefix_fn=prefix, **options):
    with pytest.raises(ValueError, match=match):
      call(attack, lm, table, prompt, target, keys, prefix_fn=prefix_fn, **options)

  check(r"prefix_fn must return a cache whose every array has one row per prompt \(leading axis "
        r"B = 8\).*\[\(1, 6, 2, 8\)",
        prefix_fn=lambda e: jax.tree.map(lambda a: a[:1], prefix(e)))
  check(r"prefix_fn must return a cache .* shapes \[\(\)\]", prefix_fn=lambda e: jnp.zeros(()))
  check(r"prefix_fn returned None", prefix_fn=lambda e: None)
  check(r"lm_logits_fn\(embeds, cache\) must map .* for \[1, 6, 16\] it returned \(6, 24\)",
        lm=lambda e, c: lm(e, c)[0])
  check(r"6 \+ 3 \+ 0 \+ 3 = 12 tokens exceeds the model's context_length 11", context_length=11)
  check(r"at most 2 remain, not 3", call=functools.partial(gcg_segment, steps=3))
  suffix = jnp.zeros((B, 3), jnp.int32)
  state = GCGState(suffix, suffix, jnp.zeros(B), jnp.zeros(B, bool), jnp.ones((), jnp.int32))
  check(r"at most 1 remain, not 2", call=functools.partial(gcg_segment, steps=2, state=state))
  check(r"state.best has shape \(8, 2\), expected \(8, 3\)",
        call=functools.partial(gcg_segment, steps=1, state=state._replace(best=state.best[:, :2])))
  check(r"state must be None or a jr.text.GCGState",
        call=functools.partial(gcg_segment, steps=1, state=tuple(state)))
  path = tmp_path / "state.npz"
  save_gcg_state(path, state, attack)
  with pytest.raises(ValueError, match=r"another attack configuration"):
    load_gcg_state(path, gcg(suffix_length=3, steps=3, search_width=4, topk=4))
  with pytest.raises(ValueError, match=r"takes a jr.text.GCGState"):
    save_gcg_state(path, tuple(state), attack)
