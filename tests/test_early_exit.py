"""Early exit and cross-eps skipping (jaxrobust.engine.early_exit): the same verdicts as the dense
computation, for a fraction of the model evaluations.

* The attacks of the conformance registry: the curve with early exit and skipping (in chunks of
  4 rows, so that the rows left are re-compacted across several chunks; on 8 devices also the
  default, which moves no rows there) has exactly the flags (and per-member breakdown) of the
  dense curve, on one device and on an Explicit 8-device mesh. The suite runs ``QUICK``, a
  configuration or two of every attack family that exits early (the whole registry passed when
  this was written); ``JAXROBUST_EARLY_EXIT=all`` runs the whole registry (minimum-norm and EOT
  attacks included: they take the same path minus the early exit).
* Counting rows through the model (``jr.metrics.count_evaluations``): on a linear model where
  every point breaks at the first update, a 100-step attack costs about two gradient rows per
  point instead of 101; a curve over eight eps costs about what its first eps costs.
* A broken row's result depends only on the row: the same under any chunk size or batch order.
* The machinery: the row partition equals a stable argsort; segments that run the whole batch
  and segments in chunks, in one run, give the dense verdicts.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxrobust as jr
from jaxrobust._options import RunOptions
from tests.models import linear_logits, linear_points, mlp_logits, mlp_params, random_linear
from tests.test_attack_conformance import REGISTRY

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

SHAPE = (4, 4, 1)
CLASSES = 5
BATCH = 24
SCALES = np.array([0.25, 0.5, 1.0, 1.5], np.float32)  # times the registry's eps for the norm
EPS = {"linf": 0.1, "l2": 0.5, "l1": 2.0}
QUICK = ("fgsm-linf-targeted", "pgd-linf-restarts-margin", "apgd-t-linf", "fab-t-linf",
         "square-l2", "auto_attack-linf")
SELECTED = sorted(REGISTRY) if os.environ.get("JAXROBUST_EARLY_EXIT") == "all" else QUICK


@functools.lru_cache(maxsize=None)
def _problem():
  """The MLP's weights (for :func:`tests.models.mlp_logits`) and the data."""
  params = mlp_params(0, int(np.prod(SHAPE)), 16, CLASSES)
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.uniform(0, 1, size=(BATCH,) + SHAPE), jnp.float32)
  y = jnp.asarray(rng.integers(0, CLASSES, size=BATCH), jnp.int32)
  target = (y + 1 + jnp.asarray(rng.integers(0, CLASSES - 1, size=BATCH), jnp.int32)) % CLASSES
  return params, x, y, target


@functools.lru_cache(maxsize=None)
def _curves(name: str):
  """The attack and ``curves(x, y, target, which=("dense", "chunked"))``: one jitted program
  ``(params, x, y, target, eps, key) -> curves`` per ``which``, the weights, eps and key passed
  as its arguments. ``"dense"``: no early exit; ``"chunked"``: early exit in chunks of 4 rows;
  ``"default"``: early exit with the default chunking. Cached: the tests of one attack share
  its compiled programs."""
  attack = REGISTRY[name]()
  params, *_ = _problem()
  eps = jnp.asarray(SCALES * EPS[attack.norm])
  options = {"dense": {"early_exit": False}, "chunked": {"chunk_size": 4}, "default": {}}

  @functools.partial(jax.jit, static_argnums=6)
  def jitted(params, x, y, target, eps, key, which):
    logits_fn = functools.partial(mlp_logits, params)
    model = (lambda x, keys: logits_fn(x)) if attack.samples else logits_fn
    curve = functools.partial(jr.robustness_curve, attack, model, x, y, eps, key,
                              target=target if attack.targeted else None)
    return tuple(curve(**options[w]) for w in which)

  return attack, lambda x, y, target, which=("dense", "chunked"): jitted(
      params, x, y, target, eps, jax.random.key(7), which)


def _same(a: jr.Curve, b: jr.Curve, what: str) -> None:
  np.testing.assert_array_equal(np.asarray(a.robust), np.asarray(b.robust), err_msg=what)
  if "robust_after" in (a.info or {}):
    np.testing.assert_array_equal(np.asarray(a.info["robust_after"]),
                                  np.asarray(b.info["robust_after"]), err_msg=what)


def test_quick_selection_is_in_the_registry():
  assert set(QUICK) <= set(REGISTRY)


@pytest.mark.parametrize("name", SELECTED)
def test_curve_flags_equal_the_dense_computation(name):
  _, x, y, target = _problem()
  _, curves = _curves(name)
  dense, chunked = curves(x, y, target)
  # Not vacuous: on this grid some points are broken and some survive.
  robust = np.asarray(dense.robust)
  assert robust.any() and not robust.all(), robust.sum(1)
  _same(dense, chunked, f"{name}: early exit, chunks of 4")


@pytest.mark.parametrize("name", ["apgd-t-linf"])
def test_curve_flags_on_eight_devices_equal_one(name):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets jax_num_cpu_devices=8)")
  _, x, y, target = _problem()
  _, curves = _curves(name)
  dense = curves(x, y, target)[0]  # the one-device program of the test above
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
  with jax.set_mesh(mesh):
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("data")))
    default, chunked = curves(put(x), put(y), put(target), ("default", "chunked"))
  _same(dense, default, f"{name}: 8 devices, early exit (no rows move)")
  _same(dense, chunked, f"{name}: 8 devices, early exit in chunks of 4 per device")


# ------------------------------------------------------------------------------------------------
# The work falls as it should.

def _linear_problem(batch: int, eps_scale: float):
  """A 3-class linear model's weights ``(w, b)`` (float32, for
  :func:`tests.models.linear_logits`) on flat inputs, its points, and eps: ``eps_scale`` times
  the largest Linf distance of a point (``eps_scale > 1``: every point breaks at the first
  update), or times the smallest (``eps_scale < 1``: no point can break)."""
  model = random_linear(0, 8, 3)
  rng = np.random.default_rng(1)
  x = rng.uniform(0.45, 0.55, size=(batch, 8)).astype(np.float32)
  y = np.argmax(np.asarray(model.logits_fn(jnp.asarray(x))), axis=1).astype(np.int32)
  distance = model.min_distance(x, y, "linf")
  eps = float(eps_scale * (distance.max() if eps_scale > 1 else distance.min()))
  return model.weights(), jnp.asarray(x), jnp.asarray(y), eps


def _counted_linear():
  """``(model, counter)``: ``model(wb)`` is the linear model's logits function (built inside a
  jitted function from traced weights) counting its rows into ``counter``."""
  counted, counter = jr.metrics.count_evaluations(lambda x, wb: linear_logits(wb, x))
  return (lambda wb: lambda x: counted(x, wb)), counter


@pytest.mark.parametrize("attack, dense_gradient_rows", [
    (jr.attacks.pgd("linf", steps=100), 101),
    (jr.attacks.apgd("linf", steps=100), 101),
])
def test_a_point_broken_at_the_first_update_costs_about_one_step(attack, dense_gradient_rows):
  batch = 64
  wb, x, y, eps = _linear_problem(batch, 20.0)
  model, counter = _counted_linear()
  run = jax.jit(lambda wb, x, y, eps, key, early: jr.run(attack, model(wb), x, y, jr.Budget(eps),
                                                         key, early_exit=early),
                static_argnums=5)
  rows = {}
  for early in (False, True):
    counter.reset()
    result = run(wb, x, y, jnp.float32(eps), jax.random.key(0), early)
    jax.effects_barrier()
    assert bool(jnp.all(result.success))
    rows[early] = (counter.gradient, counter.forward)
  # Dense: the clean check plus one gradient per step for every point.
  assert rows[False][0] >= dense_gradient_rows * batch
  # Early exit: the clean check, the step that moves the point and the one that finds it broken
  # (one chunk of 64 rows: it leaves after its second step).
  assert rows[True][0] <= 3 * batch, rows
  assert rows[True][1] <= rows[False][1]


def test_a_curve_costs_what_its_first_eps_costs_when_every_point_breaks_there():
  batch = 64
  wb, x, y, eps = _linear_problem(batch, 20.0)
  model, counter = _counted_linear()
  attack = jr.attacks.pgd("linf", steps=50)
  curve = jax.jit(lambda wb, x, y, eps, key: jr.robustness_curve(attack, model(wb), x, y, eps,
                                                                 key))
  rows = []
  for grid in (jnp.array([eps]), eps * jnp.linspace(1.0, 2.0, 8)):
    counter.reset()
    result = curve(wb, x, y, grid, jax.random.key(0))
    jax.effects_barrier()
    assert float(result.robust_accuracy[-1]) == 0.0
    rows.append(counter.total)
  # The seven larger eps attack nobody: no model evaluation beyond the first eps's.
  assert rows[1] == rows[0], rows


def test_a_robust_point_runs_every_step():
  """Early exit must not cut the search short for points it has not broken."""
  batch = 64
  wb, x, y, eps = _linear_problem(batch, 0.5)  # below every point's distance
  model, counter = _counted_linear()
  attack = jr.attacks.pgd("linf", steps=30)
  result = jax.jit(lambda wb, x, y, eps, key: jr.run(attack, model(wb), x, y, jr.Budget(eps),
                                                     key))(wb, x, y, jnp.float32(eps),
                                                           jax.random.key(0))
  jax.effects_barrier()
  assert not bool(jnp.any(result.success))
  assert counter.gradient == (1 + 30) * batch


def test_a_batch_of_a_few_chunks_is_compacted_only_for_a_costly_model(monkeypatch):
  """With the backend's chunks (64 rows on a CPU) 150 rows are three chunks of 50. A cheap
  model's run freezes the broken rows and moves none: its rows through the model are those of
  one chunk of the whole batch (``chunk_size=150``). A model whose batch costs at least
  ``COMPACTION_MIN_FLOPS`` (here the threshold is lowered to 0) is compacted: its rows are those
  of explicit chunks of 50, fewer. The verdicts and the points are the same in every run."""
  from jaxrobust.engine import early_exit

  if jax.default_backend() != "cpu":
    pytest.skip("the backend's chunk is 64 rows on a CPU")
  batch = 150
  model = random_linear(0, 8, 3)
  x, y, distance = linear_points(model, 2, batch, (8,), "linf", low=0.45, high=0.55)
  # Half the points out of reach, the others at 1-3x their distance: they break at different
  # steps, so that whole chunks finish before the run ends.
  scale = np.where(np.arange(batch) % 2 == 0, 0.9, np.linspace(1.0, 3.0, batch))
  eps = jnp.asarray(scale * distance, jnp.float32)
  counted, counter = _counted_linear()
  attack = jr.attacks.pgd("linf", steps=40)
  args = (model.weights(), jnp.asarray(x), jnp.asarray(y), eps, jax.random.key(0))

  def rows_and_result(chunk_size):
    # A new function each time: traced under the threshold in force.
    run = jax.jit(lambda wb, x, y, eps, key: jr.run(attack, counted(wb), x, y, jr.Budget(eps),
                                                    key, chunk_size=chunk_size))
    counter.reset()
    result = jax.block_until_ready(run(*args))
    jax.effects_barrier()
    return counter.gradient, result

  cheap, frozen_only, chunked = (rows_and_result(c) for c in (None, batch, 50))
  monkeypatch.setattr(early_exit, "COMPACTION_MIN_FLOPS", 0)
  costly = rows_and_result(None)
  counts = {"cheap": cheap[0], "frozen_only": frozen_only[0], "costly": costly[0],
            "chunked": chunked[0]}
  assert cheap[0] == frozen_only[0] and costly[0] == chunked[0], counts
  assert costly[0] < 0.8 * cheap[0], (costly[0], cheap[0])
  success = np.asarray(cheap[1].success)
  assert 0 < success.sum() < batch // 2 + 1
  for _, other in (frozen_only, chunked, costly):
    np.testing.assert_array_equal(np.asarray(other.success), success)
    np.testing.assert_allclose(np.asarray(other.x_adv), np.asarray(cheap[1].x_adv), atol=1e-6)


# ------------------------------------------------------------------------------------------------
# A row's result is its own.

@pytest.mark.parametrize("name", ["apgd-t-linf"])
def test_result_of_a_row_does_not_depend_on_chunks_or_batch_order(name):
  attack = REGISTRY[name]()
  params, x, y, target = _problem()
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(5), i))(jnp.arange(BATCH))
  eps = jnp.full((BATCH,), EPS[attack.norm], jnp.float32)
  perm = np.random.default_rng(0).permutation(BATCH)

  @jax.jit
  def runs(params, x, y, eps, keys):
    logits_fn = functools.partial(mlp_logits, params)
    run = functools.partial(jr.run, attack, logits_fn, x, y, jr.Budget(eps), keys)
    permuted = jr.run(attack, logits_fn, x[perm], y[perm], jr.Budget(eps[perm]), keys[perm],
                      chunk_size=4)
    return run(), run(chunk_size=4), run(chunk_size=8), permuted

  whole, by_4, by_8, permuted = runs(params, x, y, eps, keys)
  assert 0 < int(whole.success.sum()) < BATCH
  for other in (by_4, by_8):
    np.testing.assert_allclose(np.asarray(other.x_adv), np.asarray(whole.x_adv), atol=1e-6)
    np.testing.assert_array_equal(np.asarray(other.success), np.asarray(whole.success))
  np.testing.assert_allclose(np.asarray(permuted.x_adv), np.asarray(whole.x_adv)[perm], atol=1e-6)


def test_the_default_curve_does_not_unroll_the_attack():
  """One model evaluation per loop body, not one per step: compile time stays bounded."""
  wb, x, y, eps = _linear_problem(8, 2.0)
  attack = jr.attacks.pgd("linf", steps=40)
  jaxpr = jax.make_jaxpr(lambda wb, x, y, eps, key: jr.robustness_curve(
      attack, functools.partial(linear_logits, wb), x, y, eps, key))(wb, x, y, jnp.array([eps]),
                                                               jax.random.key(0))
  text = str(jaxpr)
  assert "while" in text
  assert text.count("dot_general") < 20, text.count("dot_general")


def test_early_exit_false_is_differentiable():
  """Adversarial training differentiates through the dense scan; early exit's loop cannot be."""
  _, x, y, eps = _linear_problem(8, 2.0)
  w = jnp.ones((8, 3))
  attack = jr.attacks.pgd("linf", steps=3)

  def loss(w, x, y, eps, key, early):
    f = lambda x: x @ w
    x_adv = jr.run(attack, f, x, y, jr.Budget(eps), key, early_exit=early).x_adv
    return jnp.sum(f(x_adv))

  grad = jax.jit(jax.grad(loss), static_argnums=5)(w, x, y, jnp.float32(eps), jax.random.key(0),
                                                   False)
  assert jnp.all(jnp.isfinite(grad))


def test_rows_left_over_by_full_chunks_run_in_small_chunks():
  """``compaction.chunk_loop``: each active row's output is its own, wherever it ran, and the
  rows evaluated are the full chunks plus at most ``most_small`` small ones."""
  from jaxrobust.engine import compaction

  batch, chunk, small = 100, 16, 2
  counted, counter = jr.metrics.count_evaluations(lambda v: v * 10.0)
  x = jnp.arange(batch, dtype=jnp.float32)[:, None] * jnp.ones((1, 3), jnp.float32)

  @jax.jit
  def loop(active, x):
    fn = lambda out, v: (counted(v), None, jnp.ones((), jnp.int32))
    return compaction.chunk_loop(fn, active, chunk, (x,), jnp.full_like(x, -1.0), small=small)[0]

  rng = np.random.default_rng(0)
  for n in (0, 1, 5, 16, 23, 31, 100):
    active = np.zeros(batch, bool)
    active[rng.permutation(batch)[:n]] = True
    counter.reset()
    out = np.asarray(loop(jnp.asarray(active), x))
    jax.effects_barrier()
    np.testing.assert_array_equal(out[active], 10.0 * np.asarray(x)[active])
    smalls = -(-(n % chunk) // small)
    expected = chunk * (n // chunk) + small * smalls if smalls <= 4 else chunk * -(-n // chunk)
    assert counter.forward == expected, (n, counter.forward, expected)


def test_active_first_is_the_stable_argsort_and_its_inverse():
  """``compaction.active_first``: the permutation of a stable ``argsort(~active)`` (active rows
  first, each group in index order) and its inverse, for every mask size and density."""
  from jaxrobust.engine import compaction

  partition = jax.jit(compaction.active_first)
  rng = np.random.default_rng(1)
  for batch in (1, 2, 7, 64, 540):
    for density in (0.0, 0.1, 0.5, 0.9, 1.0):
      active = rng.random(batch) < density
      order, position = map(np.asarray, partition(jnp.asarray(active)))
      np.testing.assert_array_equal(order, np.argsort(~active, kind="stable"))
      np.testing.assert_array_equal(order[position], np.arange(batch))
      assert order.dtype == position.dtype == np.int32


def test_whole_batch_segments_and_chunked_ones_give_the_dense_run():
  """With the backend's chunks (64 rows on CPU), a batch of six chunks whose first segment breaks
  nothing runs it (and ``init``) as one whole batch, and the segments after the broken rows are
  done in chunks: the verdicts equal the dense run's, and a row never broken ends exactly where
  the dense run leaves it."""
  chunk = RunOptions().chunk_rows(384)
  assert chunk == 64 and jax.default_backend() == "cpu"
  batch, never = 6 * chunk, 5 * chunk
  model = random_linear(5, int(np.prod(SHAPE)), CLASSES)
  rng = np.random.default_rng(6)
  x = jnp.asarray(rng.uniform(0.3, 0.7, size=(batch,) + SHAPE), jnp.float32)
  y = jnp.argmax(model.logits_fn(x), axis=-1).astype(jnp.int32)
  # Five chunks' rows in a ball of half their distance to the boundary (they move, never break),
  # one chunk's in so large a ball that they break in a step or two.
  half = 0.5 * model.min_distance(np.asarray(x), np.asarray(y), "linf")
  eps = jnp.asarray(np.where(np.arange(batch) < never, half, 0.5), jnp.float32)
  attack = jr.attacks.pgd("linf", steps=16)

  @functools.partial(jax.jit, static_argnums=4)
  def run(weights, x, y, eps, early_exit):
    return jr.run(attack, functools.partial(linear_logits, weights), x, y, jr.Budget(eps),
                  jax.random.key(2), early_exit=early_exit)

  dense, exits = (run(model.weights(), x, y, eps, e) for e in (False, True))
  success = np.asarray(dense.success)
  assert not success[:never].any() and success[never:].all()
  np.testing.assert_array_equal(np.asarray(exits.success), success)
  np.testing.assert_allclose(np.asarray(exits.x_adv)[:never], np.asarray(dense.x_adv)[:never],
                             rtol=0, atol=1e-6)


def test_a_grid_starting_at_zero_costs_nothing_there():
  """A ball of radius 0 holds only x: a curve over [0, e1, e2] runs the model on exactly the
  rows of the curve over [e1, e2] (beyond the clean pass), with the flags of the dense curve."""
  batch = 32
  wb, x, y, eps = _linear_problem(batch, 1.0)
  model, counter = _counted_linear()
  attack = jr.attacks.pgd("linf", steps=10)
  curve = jax.jit(lambda wb, x, y, eps, key, early: jr.robustness_curve(
      attack, model(wb), x, y, eps, key, early_exit=early), static_argnums=5)
  rows, results = [], []
  for grid in (jnp.array([eps, 2 * eps]), jnp.array([0.0, eps, 2 * eps])):
    counter.reset()
    results.append(curve(wb, x, y, grid, jax.random.key(0), True))
    jax.effects_barrier()
    rows.append(counter.total)
  assert rows[0] == rows[1], rows
  dense = curve(wb, x, y, jnp.array([0.0, eps, 2 * eps]), jax.random.key(0), False)
  np.testing.assert_array_equal(np.asarray(results[1].robust), np.asarray(dense.robust))
  np.testing.assert_array_equal(np.asarray(results[1].robust)[1:], np.asarray(results[0].robust))
  assert int(np.asarray(results[1].robust)[-1].sum()) < batch  # the largest eps does break points


def test_remainder_chunks_give_the_dense_verdicts_with_fewer_rows():
  """A batch of four chunks and more re-compacts its last rows into chunks of an eighth
  (``early_exit.remainder_rows``): the success flags of the dense run, for fewer rows."""
  batch = 64
  wb, x, y, eps = _linear_problem(batch, 1.01)
  eps = 0.7 * eps / 1.01  # below the largest distance: most points break, not all
  model, counter = _counted_linear()
  attack = jr.attacks.pgd("linf", steps=20)
  run = jax.jit(lambda wb, x, y, eps, key, early: jr.run(
      attack, model(wb), x, y, jr.Budget(eps), key, early_exit=early, chunk_size=16).success,
      static_argnums=5)
  rows, flags = [], []
  for early in (False, True):
    counter.reset()
    flags.append(np.asarray(run(wb, x, y, jnp.float32(eps), jax.random.key(0), early)))
    jax.effects_barrier()
    rows.append(counter.gradient)
  np.testing.assert_array_equal(flags[1], flags[0])
  assert 0 < int(flags[0].sum()) < batch
  assert rows[1] < rows[0], rows


class _ScheduleState(NamedTuple):
  """A toy attack's state with a shared table whose length happens to be the batch's."""

  x_adv: jax.Array  # [B, 1], per row
  schedule: jax.Array  # [steps] step sizes, shared by every row (steps == B below)
  t: jax.Array  # [] the step counter
  shared_fields = ("schedule",)


def _schedule_attack(steps: int, state_type=_ScheduleState) -> jr.Attack:
  """Moves each point down by ``schedule[t]`` at step ``t``; done once it is misclassified."""
  init = lambda f, x, y, budget, keys, target=None: state_type(
      x, 0.1 * jnp.arange(1, steps + 1, dtype=x.dtype), jnp.zeros((), jnp.int32))
  step = lambda f, s, x, y, budget, target=None: s._replace(
      x_adv=s.x_adv - s.schedule[s.t], t=s.t + 1)
  finalize = lambda f, s, x, y, budget, target=None: s.x_adv
  return jr.Attack(init, step, finalize, num_steps=steps, norm="linf",
                   done=lambda s: s.x_adv[:, 0] < 0)


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_a_declared_shared_leaf_is_neither_frozen_nor_compacted(chunk_size):
  """A row frozen at its first success keeps ``x - cumsum(schedule)[t_i]`` (closed form), which
  needs the whole shared table in every chunk: treated as per-row (moved with the rows), a chunk
  of two rows would read ``schedule[t]`` out of its own two entries."""
  batch = 8
  start = np.array([0.05, 3.5, 0.25, 1.2, 0.65, 2.0, 0.95, 2.6], np.float32)
  x = jnp.asarray(start)[:, None]
  logits_fn = lambda v: jnp.concatenate([v, -v], axis=1)
  # Jitted (one compilation, not one per operation: a third of the eager run's CPU time).
  run = jax.jit(lambda x, y, budget, key: jr.run(_schedule_attack(batch), logits_fn, x, y,
                                                 budget, key, chunk_size=chunk_size))
  result = run(x, jnp.zeros(batch, jnp.int32),
               jr.Budget(*(jnp.float32(v) for v in (10.0, -10.0, 10.0))), jax.random.key(0))
  travelled = np.cumsum(0.1 * np.arange(1, batch + 1, dtype=np.float32))
  first = np.argmax(start[:, None] - travelled[None, :] < 0, axis=1)
  assert np.all(start - travelled[-1] < 0)  # every row breaks within the steps
  np.testing.assert_allclose(np.asarray(result.x_adv)[:, 0], start - travelled[first], atol=1e-6)
  assert np.asarray(result.success).all()


def test_an_undeclared_leaf_not_led_by_the_batch_is_refused():
  class Undeclared(NamedTuple):
    x_adv: jax.Array
    schedule: jax.Array  # [steps] with steps != B and not declared shared
    t: jax.Array

  x = jnp.linspace(0.1, 0.8, 8)[:, None]
  # Under jit the error is raised while tracing, before anything compiles or runs.
  run = jax.jit(lambda x, y, budget, key: jr.run(
      _schedule_attack(5, Undeclared), lambda v: jnp.concatenate([v, -v], axis=1), x, y, budget,
      key, chunk_size=2))
  with pytest.raises(ValueError, match=r"\.schedule of shape \(5,\).*shared_fields"):
    run(x, jnp.zeros(8, jnp.int32), jr.Budget(*(jnp.float32(v) for v in (10.0, -10.0, 10.0))),
        jax.random.key(0))


def test_map_rows_runs_the_whole_batch_when_crowded_with_the_same_outputs():
  """``compaction.map_rows(..., whole_when_crowded=True)``: where chunks would skip fewer than a
  chunk's rows, one call on the whole batch; elsewhere the chunks. Per-row outputs (zeros on
  inactive rows) and shared leaves are those of the chunked run either way."""
  from jaxrobust.engine import compaction

  batch, chunk = 32, 8
  counted, counter = jr.metrics.count_evaluations(lambda v: v * 10.0 + 1.0)
  x = jnp.arange(batch, dtype=jnp.float32)[:, None] * jnp.ones((1, 3), jnp.float32)

  @functools.partial(jax.jit, static_argnums=2)
  def mapped(active, x, whole):
    fn = lambda state, v: (counted(v), jnp.int32(7))
    return compaction.map_rows(fn, active, chunk, (x,), whole_when_crowded=whole)

  rng = np.random.default_rng(2)
  for n in (0, 3, 24, 25, 32):  # crowded from 25 active rows on (more than 32 - 8)
    active = np.zeros(batch, bool)
    active[rng.permutation(batch)[:n]] = True
    rows = {}
    for whole in (False, True):
      counter.reset()
      out, shared = mapped(jnp.asarray(active), x, whole)
      jax.effects_barrier()
      np.testing.assert_array_equal(np.asarray(out), np.where(active[:, None],
                                                              10.0 * np.asarray(x) + 1.0, 0.0))
      assert int(shared) == (7 if n else 0)
      rows[whole] = counter.forward
    assert rows[False] == chunk * -(-n // chunk)
    assert rows[True] == (batch if n > batch - chunk else rows[False]), (n, rows)
