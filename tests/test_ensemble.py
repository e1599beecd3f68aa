"""Ensembles: per-example worst case, first success returned, compute skipping equal to dense."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from tests.models import mlp_logits, mlp_params

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

SHAPE = (4, 4, 1)
CLASSES = 5
BATCH = 24
EPS = 0.08


@pytest.fixture(scope="module")
def problem():
  """The MLP's weights (for :func:`tests.models.mlp_logits`, passed to every jitted function as
  an argument) and the data."""
  params = mlp_params(3, int(np.prod(SHAPE)), 16, CLASSES)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.uniform(0, 1, size=(BATCH,) + SHAPE), jnp.float32)
  y = jnp.argmax(mlp_logits(params, x), axis=1).astype(jnp.int32)
  y = y.at[:3].set((y[:3] + 1) % CLASSES)  # three clean-misclassified points
  return params, x, y


# A deliberately weak first member (one quarter-eps step from a random start), so that later
# members have points left to break.
MEMBERS = (jr.attacks.pgd("linf", steps=1, step_size=0.25),
           jr.attacks.pgd("linf", steps=4, loss="margin"),
           jr.attacks.pgd("linf", steps=6, restarts=2))


@pytest.fixture(scope="module")
def results(problem):
  params, x, y = problem

  @jax.jit
  def run_all(params, x, y, eps, key):
    logits_fn = functools.partial(mlp_logits, params)
    alone = [jr.run(m, logits_fn, x, y, jr.Budget(eps), key) for m in MEMBERS]
    together = jr.run(jr.attacks.ensemble(*MEMBERS), logits_fn, x, y, jr.Budget(eps), key)
    chunked = [jr.run(jr.attacks.ensemble(*MEMBERS), logits_fn, x, y, jr.Budget(eps), key,
                      chunk_size=c) for c in (1, 5, BATCH)]
    return alone, together, chunked

  return run_all(params, x, y, jnp.float32(EPS), jax.random.key(7))


def test_ensemble_breaks_every_point_any_member_breaks(results):
  alone, together, _ = results
  for member in alone:
    assert bool(jnp.all(together.success | ~member.success))
  union = jnp.any(jnp.stack([m.success for m in alone]), axis=0)
  np.testing.assert_array_equal(np.asarray(together.success), np.asarray(union))
  # Not vacuous here: the weak first member misses points the union breaks.
  assert int(jnp.sum(union & ~alone[0].success)) > 0


def test_breakdown_is_cumulative_and_ends_at_the_result(problem, results):
  _, _, y = problem
  alone, together, _ = results
  robust_after = np.asarray(together.info["robust_after"])
  assert robust_after.shape == (len(MEMBERS), BATCH)
  assert np.all(robust_after[1:] <= robust_after[:-1])  # never regains robustness
  np.testing.assert_array_equal(robust_after[-1], ~np.asarray(together.success))
  broken_so_far = np.zeros(BATCH, bool)
  for m, member in enumerate(alone):
    broken_so_far |= np.asarray(member.success)
    np.testing.assert_array_equal(robust_after[m], ~broken_so_far)


def test_returned_point_is_the_first_success(problem, results):
  _, x, _ = problem
  alone, together, _ = results
  claimed = np.zeros(BATCH, bool)
  clean_wrong = np.arange(BATCH) < 3
  for member in alone:
    first = np.asarray(member.success) & ~claimed & ~clean_wrong
    np.testing.assert_allclose(np.asarray(together.x_adv)[first], np.asarray(member.x_adv)[first],
                               atol=0)
    claimed |= first
  robust = ~np.asarray(together.success)
  np.testing.assert_array_equal(np.asarray(together.x_adv)[robust], np.asarray(x)[robust])
  np.testing.assert_array_equal(np.asarray(together.x_adv)[clean_wrong],
                                np.asarray(x)[clean_wrong])


def test_compaction_equals_dense(results):
  _, together, chunked = results
  for result in chunked:
    np.testing.assert_array_equal(np.asarray(result.success), np.asarray(together.success))
    np.testing.assert_array_equal(np.asarray(result.info["robust_after"]),
                                  np.asarray(together.info["robust_after"]))
    np.testing.assert_allclose(np.asarray(result.x_adv), np.asarray(together.x_adv), atol=1e-6)


def test_broken_points_cost_nothing(problem):
  """Counts the rows the model evaluates at run time: skipped points never reach it."""
  params, x, y = problem
  rows = []

  def counted(params, inputs):
    jax.debug.callback(lambda n: rows.append(int(n)), jnp.asarray(inputs.shape[0]))
    return mlp_logits(params, inputs)

  attack = jr.attacks.ensemble(jr.attacks.pgd("linf", steps=8), jr.attacks.pgd("linf", steps=8))
  everyone_wrong = (y + 1) % CLASSES
  run = jax.jit(lambda params, x, y, eps, key, c, early: jr.run(
      attack, functools.partial(counted, params), x, y, jr.Budget(eps), key, chunk_size=c,
      early_exit=early), static_argnums=(5, 6))
  counts = {}
  for c, early in ((4, False), (None, True), (4, True), (None, False)):
    rows.clear()
    jax.block_until_ready(run(params, x, everyone_wrong, jnp.float32(EPS), jax.random.key(0), c,
                              early))
    counts[c, early] = sum(rows)
  # Dense: two members x (8 steps + finalize) on the whole batch.
  assert counts[None, False] >= 2 * 9 * BATCH
  # Chunked without early exit: no point needs attacking, so only forward passes remain: the
  # clean one, one scoring pass per member and the final scoring pass.
  assert counts[4, False] == (1 + 2 + 1) * BATCH
  # Early exit (any chunking): the members re-score only the rows they attacked (none).
  assert counts[None, True] == counts[4, True] == (1 + 1) * BATCH


SKIPPING_ATTACK = jr.attacks.ensemble(jr.attacks.fgsm("linf"), jr.attacks.pgd("linf", steps=4))
SKIPPING_CHUNK = 2  # 24 rows: 12 chunks on one device; on 8 devices 3 rows, 2 chunks each


def _skipping_curve(params, x, y, e, key, chunk_size=SKIPPING_CHUNK):
  return jr.robustness_curve(SKIPPING_ATTACK, functools.partial(mlp_logits, params), x, y, e, key,
                             chunk_size=chunk_size)


@pytest.fixture(scope="module")
def skipping_curves(problem):
  """The dense curve and the one with skipping (in chunks of 2 rows), one program; the second
  is also the one-device reference of the 8-device test (one compilation fewer)."""
  params, x, y = problem
  eps = jnp.array([0.1, 0.02, 0.05, 0.05, 0.0, 0.2])  # unsorted, duplicated, zero
  curves = jax.jit(lambda params, x, y, e, key: (_skipping_curve(params, x, y, e, key, None),
                                                  _skipping_curve(params, x, y, e, key)))
  return eps, curves(params, x, y, eps, jax.random.key(3))


def test_curve_with_skipping_equals_dense_curve(skipping_curves):
  _, (dense, skipped) = skipping_curves
  np.testing.assert_array_equal(np.asarray(skipped.robust), np.asarray(dense.robust))
  assert float(dense.robust_accuracy[4]) == float(dense.clean_accuracy)
  assert 0 < float(dense.robust_accuracy[-1]) < float(dense.robust_accuracy[1])


def test_skipping_curve_sharded_over_8_devices(problem, skipping_curves):
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as P

  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets jax_num_cpu_devices=8)")
  params, x, y = problem
  eps, (_, single) = skipping_curves
  run = jax.jit(_skipping_curve)
  for axis_type in (AxisType.Explicit, AxisType.Auto):
    mesh = jax.make_mesh((8,), ("batch",), axis_types=(axis_type,))
    with jax.set_mesh(mesh):
      put = lambda a: jax.device_put(a, NamedSharding(mesh, P("batch")))
      sharded = run(params, put(x), put(y), eps, jax.random.key(3))
    np.testing.assert_array_equal(np.asarray(sharded.robust), np.asarray(single.robust))


def test_targeted_members(problem):
  params, x, y = problem
  target = (y + 2) % CLASSES
  members = (jr.attacks.fgsm("linf", targeted=True), jr.attacks.pgd("linf", steps=5,
                                                                   targeted=True))
  # One compilation for the ensemble and its members alone.
  together, *alone = jax.jit(lambda params, x, y, target, eps, key: [
      jr.run(attack, functools.partial(mlp_logits, params), x, y, jr.Budget(eps), key, target)
      for attack in (jr.attacks.ensemble(*members), *members)])(
          params, x, y, target, jnp.float32(0.15), jax.random.key(1))
  hit = jnp.argmax(together.logits, axis=1) == target
  # Targeted success means the target was reached, also on the three clean-misclassified points
  # (returned unchanged): jr.run's contract, which used to count them as successes.
  np.testing.assert_array_equal(np.asarray(together.success), np.asarray(hit))
  clean_wrong = jnp.arange(BATCH) < 3
  np.testing.assert_array_equal(np.asarray(together.x_adv[clean_wrong]),
                                np.asarray(x[clean_wrong]))
  for member in alone:
    assert bool(jnp.all(together.success | ~member.success))


@pytest.mark.parametrize("members, error", [
    ((), ValueError),
    ((jr.attacks.pgd("linf"), jr.attacks.pgd("l2")), ValueError),
    ((jr.attacks.pgd("linf"), jr.attacks.pgd("linf", targeted=True)), ValueError),
    ((jr.attacks.pgd("linf"), "pgd"), TypeError),
    ((jr.attacks.pgd("linf"), jr.attacks.eot(jr.attacks.pgd("linf"), 2)), ValueError),
])
def test_bad_members(members, error):
  with pytest.raises(error):
    jr.attacks.ensemble(*members)


def test_bad_chunk_sizes(problem):
  params, x, y = problem
  logits_fn = functools.partial(mlp_logits, params)
  attack = jr.attacks.pgd("linf", steps=2)
  for bad in (0, -1, 2.5, True):
    with pytest.raises(ValueError, match="chunk_size"):
      jr.run(attack, logits_fn, x, y, jr.Budget(0.1), jax.random.key(0), chunk_size=bad)
  with pytest.raises(ValueError, match="eps_batch_size=None"):
    jr.robustness_curve(attack, logits_fn, x, y, jnp.array([0.1]), jax.random.key(0),
                        eps_batch_size=0, chunk_size=4)


def test_a_suite_built_by_hand_runs_like_the_ensemble_with_its_checks(problem, results):
  """``jr.Suite``: members chosen from the class count, checks reported as flags and counts. The
  same members as the ensemble give the same breakdown; the check counts the rows the last
  member alone broke, which the breakdown determines."""
  params, x, y = problem
  _, together, _ = results
  seen = {}

  def members(num_classes):
    seen["classes"] = num_classes
    return MEMBERS

  def checks(logits_fn, x, y, budget, keys, target, todo, robust_after, members, active):
    last_only = jnp.sum(robust_after[-2] & ~robust_after[-1], dtype=jnp.int32)
    return {"last_member_needed": jr.metrics.checks.count_check(last_only, "last_member_rows"),
            "many_rows": jr.metrics.checks.fraction_check(
                jnp.sum(todo, dtype=jnp.int32), "attacked_rows", 0.5, jnp.sum(active))}

  base = jr.attacks.ensemble(*MEMBERS)
  suite = base._replace(suite=jr.Suite(members, checks), name="by-hand")
  result = jax.jit(lambda params, x, y, eps, key: jr.run(
      suite, functools.partial(mlp_logits, params), x, y, jr.Budget(eps), key))(
          params, x, y, jnp.float32(EPS), jax.random.key(7))
  assert seen["classes"] == CLASSES
  robust_after = np.asarray(result.info["robust_after"])
  np.testing.assert_array_equal(robust_after, np.asarray(together.info["robust_after"]))
  expected = int(np.sum(robust_after[-2] & ~robust_after[-1]))
  counts, flags = result.info["counts"], result.info["flags"]
  assert int(counts["last_member_rows"]) == expected
  assert bool(flags["last_member_needed"]) == (expected > 0)
  attacked = BATCH - 3  # every clean-correct row is attacked
  assert int(counts["attacked_rows"]) == attacked and bool(flags["many_rows"])
