"""FAB: exact hyperplane-box projections, closed-form linear ground truth, eps as an upper bound,
chunked class gradients, FAB-T, validation and sharding."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linprog, minimize

import jaxrobust as jr
from jaxrobust.attacks._fab_projections import project_hyperplane_box
from jaxrobust.attacks._fab import fab
from tests.models import (
  assert_explicit_sharding_matches_one_device,
  assert_unfrozen_rows_close,
  frozen_scan,
  linear_logits,
  linear_points,
  mlp_logits,
  mlp_params,
  random_linear,
)

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

ORD = {"linf": np.inf, "l2": 2, "l1": 1}
SHAPE = (4, 4)
CLASSES = 10
BATCH = 32
STEPS = 20


# --- projections onto {<w, d> = r} ∩ box, against float64 references -----------------------------


def _reference_projection(t, w, r, norm):
  """Optimal ||d||_p for <w, d> = r, 0 <= t + d <= 1 in float64, or None when infeasible."""
  dim = len(t)
  lo, hi = -t, 1.0 - t
  if norm == "linf":  # min s  s.t.  -s <= d_i <= s
    cost = np.r_[np.zeros(dim), 1.0]
    a_ub = np.block([[np.eye(dim), -np.ones((dim, 1))], [-np.eye(dim), -np.ones((dim, 1))]])
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(2 * dim), A_eq=np.r_[w, 0.0][None], b_eq=[r],
                  bounds=list(zip(lo, hi)) + [(0, None)], method="highs")
    return None if res.status == 2 else res.fun
  if norm == "l1":  # d = p - n, min sum(p + n)
    res = linprog(np.ones(2 * dim), A_eq=np.r_[w, -w][None], b_eq=[r],
                  bounds=[(0, h) for h in hi] + [(0, -low) for low in lo], method="highs")
    return None if res.status == 2 else res.fun
  # L2: d(lam) = clip(lam * w, lo, hi) (KKT), <w, d(lam)> is monotone in lam: bisection.
  g = lambda lam: w @ np.clip(lam * w, lo, hi)
  reach = g(np.sign(r) * 1e30) if r != 0 else 0.0
  if abs(reach) < abs(r):
    return None
  a, b = (0.0, 1.0) if r >= 0 else (-1.0, 0.0)
  while (r >= 0 and g(b) < r) or (r < 0 and g(a) > r):
    a, b = (a, 2 * b) if r >= 0 else (2 * a, b)
  for _ in range(200):
    mid = (a + b) / 2
    a, b = (mid, b) if g(mid) < r else (a, mid)
  return float(np.linalg.norm(np.clip((a + b) / 2 * w, lo, hi)))


@pytest.mark.parametrize("norm, dtype", [("linf", "float32"), ("l2", "float32"),
                                         ("l1", "float32"), ("linf", "float64"),
                                         ("l1", "float64")])
def test_projection_matches_float64_reference(norm, dtype):
  """The exact projection (bisection on float bit patterns: 31 halvings in float32, 63 in
  float64) against linear programming and a float64 bisection."""
  rng = np.random.default_rng({"linf": 0, "l2": 1, "l1": 2}[norm])
  n, dim = 90, 12
  t = rng.uniform(0, 1, (n, dim))
  t[:15] = rng.integers(0, 2, (15, dim))  # box corners: no room on half of the faces
  w = rng.normal(size=(n, dim))
  w[rng.uniform(size=(n, dim)) < 0.15] = 0.0
  w[15:20, :3] = w[15:20, 3:4]  # ties in |w| (the L1 pivot is shared)
  r = rng.normal(size=n) * rng.choice([0.1, 1.0, 3.0, 10.0], size=n)  # the large ones infeasible
  r[20:23] = 0.0
  project = jax.jit(functools.partial(project_hyperplane_box, lower=0.0, upper=1.0, norm=norm))
  with jax.enable_x64(dtype == "float64"):
    d = project(*(jnp.asarray(a, dtype) for a in (t, w, r)))
    assert d.dtype == dtype
    d = np.asarray(d, np.float64)
  tol = 1.0 if dtype == "float32" else 1e-3  # float64: tighter, but LP solutions carry ~1e-9
  infeasible = 0
  for i in range(n):
    assert np.all(t[i] + d[i] >= -1e-6) and np.all(t[i] + d[i] <= 1 + 1e-6), i
    best = _reference_projection(t[i], w[i], r[i], norm)
    if best is None:  # the box corner that moves furthest towards the hyperplane
      infeasible += 1
      direction = np.sign(w[i] * r[i])
      corner = np.where(direction > 0, 1 - t[i], np.where(direction < 0, -t[i], 0.0))
      np.testing.assert_allclose(d[i], corner, atol=1e-6)
      continue
    np.testing.assert_allclose(w[i] @ d[i], r[i], rtol=1e-4 * tol, atol=1e-5 * tol)
    np.testing.assert_allclose(np.linalg.norm(d[i], ORD[norm]), best, rtol=1e-4 * tol,
                               atol=1e-6 * tol)
  assert 5 <= infeasible <= n - 30  # both kinds of problem were exercised
  np.testing.assert_array_equal(d[20:23], 0.0)


# --- linear models: the closed-form minimal distance ---------------------------------------------


@functools.cache
def _linear_run(norm: str, mode: str, class_chunk: int | None = None, restarts: int = 1):
  """One jitted run per configuration, with per-example eps (compiled once): ``run(x, y, eps,
  target=None)``, the weights and the key passed to the jitted function as arguments."""
  model = random_linear(0, int(np.prod(SHAPE)), CLASSES)
  if mode == "fab-t":
    attack = fab(norm, targeted=True, n_target_classes=CLASSES - 1, steps=STEPS)
  elif mode == "targeted":
    attack = fab(norm, targeted=True, n_target_classes=None, steps=STEPS)
  else:
    attack = fab(norm, steps=STEPS, class_chunk=class_chunk, restarts=restarts)

  @jax.jit
  def jitted(wb, x, y, eps, key, target):
    return jr.run(attack, functools.partial(linear_logits, wb), x, y, jr.Budget(eps), key, target)

  wb = model.weights()
  run = lambda x, y, eps, target=None: jitted(wb, x, y, eps, jax.random.key(0), target)
  return model, attack, run


@pytest.mark.parametrize("mode", ["untargeted", "fab-t"])
@pytest.mark.parametrize("norm", ["linf", "l2", "l1"])
def test_linear_model_lands_on_the_minimal_distance(norm, mode):
  model, attack, run = _linear_run(norm, mode)
  assert attack.minimum_norm and not attack.targeted
  x, y, dist = linear_points(model, 1, BATCH, SHAPE, norm)
  x, y = jnp.asarray(x), jnp.asarray(y)
  result = run(x, y, jnp.full((BATCH,), jnp.inf, jnp.float32))
  size = np.asarray(result.norm, np.float64)
  assert np.asarray(result.success).all()
  assert np.all(size >= 0.999 * dist), (size / dist).min()
  assert np.median(size / dist) <= 1.01, np.median(size / dist)
  x_adv = np.asarray(result.x_adv)
  assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
  np.testing.assert_allclose(size, np.linalg.norm((x_adv - np.asarray(x)).reshape(BATCH, -1),
                                                  ORD[norm], axis=1), rtol=1e-5)

  # eps is an upper bound: nothing within 0.9 d* is adversarial, and jr.run reports norm = inf.
  below = run(x, y, jnp.asarray(0.9 * dist, jnp.float32))
  assert not np.asarray(below.success).any()
  assert np.all(np.isinf(np.asarray(below.norm)))
  np.testing.assert_array_equal(np.asarray(below.x_adv), np.asarray(x))
  # ... and a budget equal to the norm found keeps every point (no strict "< eps" test). In L2
  # and L1 a point on the sphere comes back 2**-19 of eps inside it (engine/scoring.inside_ball:
  # a norm's rounding depends on the order of summation), in Linf exactly where it was.
  exact = run(x, y, result.norm)
  assert np.asarray(exact.success).all()
  assert np.all(np.asarray(exact.norm) <= np.asarray(result.norm))
  np.testing.assert_allclose(np.asarray(exact.x_adv), x_adv, rtol=0,
                             atol=0 if norm == "linf" else 2e-6)


def _targeted_distance(model, x, target):
  """Exact L2 distance to the region where ``target`` wins, inside the box (float64 SLSQP)."""
  flat = x.reshape(len(x), -1).astype(np.float64)
  z = flat @ model.w + model.b
  out = []
  for i, t in enumerate(target):
    others = [j for j in range(model.w.shape[1]) if j != t]
    a = np.stack([model.w[:, t] - model.w[:, j] for j in others])
    c = z[i, others] - z[i, t]
    constraint = {"type": "ineq", "fun": lambda d, a=a, c=c: a @ d - c, "jac": lambda d, a=a: a}
    res = minimize(lambda d: d @ d, np.zeros(flat.shape[1]), jac=lambda d: 2 * d,
                   constraints=[constraint], bounds=[(-v, 1 - v) for v in flat[i]],
                   method="SLSQP", options={"ftol": 1e-14, "maxiter": 500})
    assert res.success
    out.append(np.sqrt(res.fun))
  return np.array(out)


def test_targeted_reaches_the_target_at_its_distance():
  """Targeted FAB (success: argmax == target) against the exact distance to the target's cell.

  The target's region is a polytope (z_t >= z_j for every j), but each step linearises only the
  boundary with the strongest rival, so a few points can alternate between two rivals' planes
  without reaching the cell in the budget; where it succeeds it lands on the exact distance.
  """
  norm = "l2"
  model, attack, run = _linear_run(norm, "targeted")
  assert attack.targeted and attack.minimum_norm
  x, y, _ = linear_points(model, 2, BATCH, SHAPE, norm)
  rng = np.random.default_rng(3)
  target = ((y + rng.integers(1, CLASSES, size=BATCH)) % CLASSES).astype(np.int32)
  dist = _targeted_distance(model, x, target)
  result = run(jnp.asarray(x), jnp.asarray(y), jnp.full((BATCH,), jnp.inf, jnp.float32),
               jnp.asarray(target))
  success = np.asarray(result.success)
  assert success.mean() >= 0.75, success.mean()
  np.testing.assert_array_equal(np.asarray(jr.predict(result.logits))[success], target[success])
  size = np.asarray(result.norm, np.float64)[success]
  assert np.all(size >= 0.999 * dist[success]), (size / dist[success]).min()
  assert np.median(size / dist[success]) <= 1.01


# --- class chunking and sharding -----------------------------------------------------------------


@pytest.fixture(scope="module")
def linf_batch():
  model, _, _ = _linear_run("linf", "untargeted")
  x, y, _ = linear_points(model, 4, 16, SHAPE, "linf")
  return jnp.asarray(x), jnp.asarray(y), jnp.full((16,), jnp.inf, jnp.float32)


def test_class_chunk_does_not_change_the_result(linf_batch):
  results = [_linear_run("linf", "untargeted", chunk)[2](*linf_batch) for chunk in (1, 3, None)]
  assert np.asarray(results[-1].success).all()
  for other in results[:-1]:  # the same classes chosen; values equal up to float32 rounding
    np.testing.assert_array_equal(np.asarray(other.success), np.asarray(results[-1].success))
    np.testing.assert_allclose(np.asarray(other.x_adv), np.asarray(results[-1].x_adv), atol=1e-6)
    np.testing.assert_allclose(np.asarray(other.norm), np.asarray(results[-1].norm), rtol=1e-5)


def test_restarts_never_increase_the_norm(linf_batch):
  """Restart 0 is the single run (it starts at x); random restarts can only add candidates."""
  one = _linear_run("linf", "untargeted", 3)[2](*linf_batch)
  two = _linear_run("linf", "untargeted", 3, 2)[2](*linf_batch)
  assert np.all(np.asarray(two.norm) <= np.asarray(one.norm))
  assert np.asarray(two.success).sum() >= np.asarray(one.success).sum()


def test_explicit_sharding_matches_one_device(linf_batch):
  _, _, run = _linear_run("linf", "untargeted", 3, 2)  # chunked class loop, random restarts
  assert_explicit_sharding_matches_one_device(run, sharded_args=linf_batch)


# --- bad inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    {"norm": "l0"}, {"steps": 0}, {"restarts": 0}, {"alpha_max": 0.0}, {"alpha_max": 1.5},
    {"eta": 0.5}, {"beta": 0.0}, {"beta": 1.5}, {"class_chunk": 0}, {"targeted": 1},
    {"targeted": True, "n_target_classes": 0}, {"eta": float("nan")},
])
def test_bad_options_raise(kwargs):
  with pytest.raises(ValueError):
    fab(**kwargs)


def test_too_many_target_classes_raise():
  params = mlp_params(0, 4, 4, 3)
  x, y = jnp.full((2, 4), 0.5, jnp.float32), jnp.zeros((2,), jnp.int32)
  # Under jit the errors are raised while tracing, before anything compiles.
  run = lambda attack, target=None: jax.jit(lambda params, x, y, eps, key, target: jr.run(
      attack, functools.partial(mlp_logits, params), x, y, jr.Budget(eps), key, target))(
          params, x, y, jnp.float32(0.1), jax.random.key(0), target)
  with pytest.raises(ValueError, match="n_target_classes"):
    run(fab("linf", targeted=True, n_target_classes=3))
  with pytest.raises(ValueError, match="target"):  # FAB-T takes no target=
    run(fab("linf", targeted=True, n_target_classes=2), jnp.ones((2,), jnp.int32))
  with pytest.raises(ValueError, match="target"):  # a targeted FAB needs one
    run(fab("linf", targeted=True, n_target_classes=None))


# --- done: the rows early exit may freeze --------------------------------------------------------


def test_done_only_inside_a_finite_ball_and_freezing_keeps_the_verdicts():
  """FAB-T at a finite eps is done once it holds an adversarial point inside the ball (what
  ``finalize`` returns); at ``eps = inf`` (the minimum-norm search) never, since the point keeps
  shrinking. Freezing done rows gives the same verdicts and leaves the other rows alone (to
  float rounding, see ``tests.models.FROZEN_ATOL``)."""
  norm = "l2"
  model = random_linear(0, int(np.prod(SHAPE)), CLASSES)
  x, y, dist = linear_points(model, 5, BATCH, SHAPE, norm)
  group = np.arange(BATCH) % 4
  eps = np.select([group == 0, group == 1, group == 2], [np.inf, 1.05, 0.9], 3.0) * dist
  budget = jr.Budget(jnp.asarray(eps, jnp.float32))
  attack = fab(norm, targeted=True, n_target_classes=CLASSES - 1, steps=4)
  keys = jax.random.split(jax.random.key(0), BATCH)
  (first, x_first), (done, x_dense), (done_frozen, x_frozen) = frozen_scan(
      attack, linear_logits, jnp.asarray(x), jnp.asarray(y), budget, keys, params=model.weights())
  first, done, done_frozen = (np.asarray(v) for v in (first, done, done_frozen))
  changed = lambda v: np.any(np.asarray(v) != x, axis=(1, 2))
  adversarial = lambda v: (np.argmax(np.asarray(model.logits_fn(v)), axis=1) != y) & changed(v)
  finite = np.isfinite(eps)
  np.testing.assert_array_equal(first, adversarial(x_first) & finite)
  np.testing.assert_array_equal(done, adversarial(x_dense) & finite)
  np.testing.assert_array_equal(done_frozen, done)
  np.testing.assert_array_equal(adversarial(x_frozen), adversarial(x_dense))
  assert_unfrozen_rows_close(x_frozen, x_dense, done)
  assert adversarial(x_dense)[group == 0].all() and not done[group == 0].any()
  assert done[group == 1].all() and not done[group == 2].any() and done[group == 3].all()
  assert first[group == 3].any() and not first[group == 1].all()


def test_random_restart_start_is_drawn_only_on_a_segments_first_step():
  """With restarts, the random start (a ``[B, D]`` draw) is built inside a ``cond`` that runs on a
  segment's first step only, not drawn on every step and then discarded."""
  model = random_linear(0, int(np.prod(SHAPE)), CLASSES)
  attack = fab("linf", steps=3, restarts=2)
  x, y = jnp.full((4,) + SHAPE, 0.5), jnp.zeros(4, jnp.int32)
  budget, keys = jr.Budget(0.1), jax.random.split(jax.random.key(0), 4)
  state = attack.init(model.logits_fn, x, y, budget, keys, None)
  jaxpr = jax.make_jaxpr(lambda s: attack.step(model.logits_fn, s, x, y, budget, None))(state)
  names = [e.primitive.name for e in jaxpr.jaxpr.eqns]
  assert not [n for n in names if n.startswith("random_")] and names.count("cond") == 1, names


@pytest.mark.parametrize("norm", ["linf", "l2", "l1"])
def test_projection_sorts_nothing(norm):
  """XLA:CPU sorts with a comparator call per comparison: sorting the coordinates cost FAB-T most
  of its step on a small MLP (about 13 of 16 ms per step at batch 360, D = 64). The projection
  now bisects on float bit patterns: no sort, no top_k, anywhere in its program."""
  t, w, r = jnp.full((3, 5), 0.5), jnp.ones((3, 5)), jnp.ones(3)
  text = str(jax.make_jaxpr(lambda t, w, r: project_hyperplane_box(t, w, r, 0.0, 1.0, norm))(
      t, w, r))
  assert "sort" not in text and "top_k" not in text


def test_early_exit_stops_attacking_points_broken_inside_the_ball():
  """FAB-T at three times the exact distance: the first step lands past the (linear) boundary,
  so with early exit (``jr.run``'s default) 9 targets x 20 steps cost a few model rows per point
  instead of two per step; at ``eps = inf`` (the minimum-norm search) nothing stops early."""
  norm = "linf"
  model = random_linear(0, int(np.prod(SHAPE)), CLASSES)
  counted, counter = jr.metrics.count_evaluations(lambda v, wb: linear_logits(wb, v))
  x, y, dist = linear_points(model, 6, BATCH, SHAPE, norm)
  attack = fab(norm, targeted=True, n_target_classes=CLASSES - 1, steps=STEPS)
  run = jax.jit(lambda wb, x, y, eps, key, early_exit: jr.run(
      attack, lambda v: counted(v, wb), x, y, jr.Budget(eps), key, early_exit=early_exit),
      static_argnums=5)
  rows = {}
  for name, eps, early_exit in (("early", 3 * dist, True), ("dense", 3 * dist, False),
                                ("min-norm", np.full(BATCH, np.inf), True)):
    counter.reset()
    result = run(model.weights(), jnp.asarray(x), jnp.asarray(y), jnp.asarray(eps, jnp.float32),
                 jax.random.key(0), early_exit)
    jax.effects_barrier()
    assert np.asarray(result.success).all()
    rows[name] = counter.total
  full = 2 * attack.num_steps * BATCH  # a gradient and a forward pass per step and point
  assert rows["early"] <= 8 * BATCH and rows["dense"] >= full and rows["min-norm"] >= full, rows
