"""FMN on linear models, where the minimal adversarial distance is known in closed form.

For logits ``z = x @ w + b`` the smallest perturbation in norm ``p`` that makes class ``j`` beat
``y`` has size ``(z_y - z_j) / ||w_j - w_y||_q`` (``q`` the dual exponent), and the smallest over
``j`` is the exact minimal distance ``d`` whenever the optimal perturbation stays inside the box.
No adversarial point is closer, so every returned norm must be at least ``d``; FMN's shrinking
radius should bring it close. Every jitted function is compiled once per module (budgets are
per-example ``[B]`` data).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust.attacks._fmn import fmn
from tests.models import (DUAL, FROZEN_ATOL, Linear, adversarial_inside,
                          assert_explicit_sharding_matches_one_device,
                          assert_unfrozen_rows_close, frozen_scan, linear_points,
                          min_norm_early_exit_runs, random_linear)

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

DIM = 16
N = 48
STEPS = 100
NORMS = ("linf", "l2", "l1")


def _optimal_steps(model: Linear, x, y, norm: str):
  """Per point, the exact minimal distance ``d`` and the optimal perturbation reaching it."""
  flat = x.reshape(len(x), -1).astype(np.float64)
  z = flat @ model.w + model.b
  rows = np.arange(len(x))
  dw = model.w.T[None, :, :] - model.w.T[y][:, None, :]  # [N, C, D]: w_j - w_y
  size = np.linalg.norm(dw, ord=DUAL[norm], axis=2)
  gap = z[rows, y][:, None] - z
  dist = np.where(np.arange(z.shape[1])[None, :] == y[:, None], np.inf,
                  gap / np.where(size > 0, size, 1e-300))
  j = np.argmin(dist, axis=1)
  d, v = dist[rows, j], dw[rows, j]  # v: the ascent direction of z_j - z_y
  if norm == "linf":
    unit = np.sign(v)
  elif norm == "l2":
    unit = v / np.linalg.norm(v, axis=1, keepdims=True)
  else:  # all the mass on the largest |v_i|
    top = np.argmax(np.abs(v), axis=1)
    unit = np.zeros_like(v)
    unit[rows, top] = np.sign(v[rows, top])
  return d, unit * d[:, None]


@functools.lru_cache(maxsize=None)
def _problem(classes: int, norm: str, seed: int = 0):
  """A linear model with its boundaries through the centre of the box, and ``N`` points whose
  optimal perturbation (grown by 5%) stays inside [0, 1]."""
  model = random_linear(seed, DIM, classes)
  model = Linear(model.w, -0.5 * model.w.sum(0))
  x, y, d = linear_points(model, seed + 1, 8 * N, (DIM,), norm)
  d_check, step = _optimal_steps(model, x, y, norm)
  np.testing.assert_allclose(d_check, d, rtol=1e-12)
  moved = x.astype(np.float64) + 1.05 * step
  keep = np.all((moved >= 0) & (moved <= 1), axis=1) & (d > 1e-3)
  assert keep.sum() >= N, keep.sum()
  return model, x[keep][:N], y[keep][:N], d[keep][:N]


@functools.lru_cache(maxsize=None)
def _jitted(norm: str, targeted: bool = False):
  """One compiled ``jr.run`` per configuration (and model shape), shared by every test."""
  attack = fmn(norm, steps=STEPS, targeted=targeted)

  @jax.jit
  def jitted(w, b, x, y, eps, target):
    return jr.run(attack, Linear(w, b).logits_fn, x, y, jr.Budget(eps), jax.random.key(0),
                  target)

  def run(model: Linear, x, y, eps=np.inf, target=None):
    """Always a per-example eps, so that every call of a configuration reuses one compilation."""
    eps = jnp.broadcast_to(jnp.asarray(eps, jnp.float32), (len(x),))
    target = None if target is None else jnp.asarray(target)
    return jitted(model.w, model.b, jnp.asarray(x), jnp.asarray(y), eps, target)

  return run


@pytest.mark.parametrize("classes", [2, 10])
@pytest.mark.parametrize("norm", NORMS)
def test_norm_is_never_below_the_exact_distance_and_nearly_reaches_it(norm, classes):
  model, x, y, d = _problem(classes, norm)
  result = _jitted(norm)(model, x, y)
  success, size = np.asarray(result.success), np.asarray(result.norm, np.float64)
  x_adv = np.asarray(result.x_adv)
  assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
  np.testing.assert_allclose(size[success],
                             np.asarray(jr.projections.norm(result.x_adv - x, norm))[success],
                             rtol=1e-6)
  assert np.all(np.isinf(size[~success]))
  assert success.mean() >= 0.95, success.mean()
  ratio = size[success] / d[success]
  assert ratio.min() >= 1 - 1e-4, ratio.min()
  assert np.median(ratio) <= 1.05, np.median(ratio)


def test_already_misclassified_points_are_returned_unchanged():
  model, x, y, _ = _problem(10, "l2")
  wrong = np.arange(N) % 2 == 0
  labels = np.where(wrong, (y + 1) % 10, y).astype(np.int32)
  result = _jitted("l2")(model, x, labels)
  np.testing.assert_array_equal(np.asarray(result.x_adv)[wrong], x[wrong])
  np.testing.assert_array_equal(np.asarray(result.norm)[wrong], 0.0)
  assert np.asarray(result.success).mean() >= 0.95


@pytest.mark.parametrize("norm", NORMS)
def test_eps_is_an_upper_bound_on_the_norm(norm):
  """Below the exact distance nothing succeeds and ``x`` comes back; eps only filters the point
  returned, so within eps the verdict is the unbounded one's. With early exit the point is the
  first adversarial iterate inside the ball, no smaller than the unbounded one
  (``early_exit=False`` returns the unbounded one: see the early exit test below)."""
  model, x, y, d = _problem(2, norm)
  run = _jitted(norm)
  below = run(model, x, y, 0.9 * d)
  assert not np.asarray(below.success).any()
  np.testing.assert_array_equal(np.asarray(below.norm), np.inf)
  np.testing.assert_array_equal(np.asarray(below.x_adv), x)  # inside the ball and the box

  unbounded = run(model, x, y)
  low = np.arange(N) % 2 == 0
  eps = np.where(low, 0.9 * d, 1.01 * d).astype(np.float32)
  mixed = run(model, x, y, eps)
  success, x_adv = np.asarray(mixed.success), np.asarray(mixed.x_adv)
  assert not success[low].any()
  assert success[~low].mean() >= 0.9, success[~low].mean()
  np.testing.assert_array_equal(success, np.asarray(unbounded.norm) <= eps)
  np.testing.assert_array_equal(x_adv[~success], x[~success])
  size = np.asarray(jr.projections.norm(mixed.x_adv - x, norm))
  assert np.all(size <= eps)
  assert np.all(size[success] >= np.asarray(unbounded.norm)[success] * (1 - 1e-6))


@pytest.mark.parametrize("norm", NORMS)
def test_targeted_success_means_the_target_wins(norm):
  """Success is ``argmax == target``; the norm is at least the distance to every half-space
  ``z_t >= z_k`` the target must win (each is a lower bound on the exact targeted distance)."""
  model, x, y, _ = _problem(10, norm)
  target = ((y + 3) % 10).astype(np.int32)
  result = _jitted(norm, targeted=True)(model, x, y, target=target)
  logits = np.asarray(result.logits)
  success, size = np.asarray(result.success), np.asarray(result.norm, np.float64)
  np.testing.assert_array_equal(success, np.argmax(logits, axis=1) == target)
  assert success.mean() >= 0.9, success.mean()
  assert np.all(np.isinf(size[~success]))
  rows = np.arange(N)
  z = x.astype(np.float64) @ model.w + model.b
  gaps = z - z[rows, target][:, None]
  scale = np.linalg.norm(model.w.T[None, :, :] - model.w.T[target][:, None, :], ord=DUAL[norm],
                         axis=2)
  bound = np.max(np.where(scale > 0, gaps / np.where(scale > 0, scale, 1.0), -np.inf), axis=1)
  assert np.all(size[success] >= bound[success] * (1 - 1e-4))


def test_robustness_curve_is_the_curve_of_one_run():
  """A minimum-norm attack runs once for the whole curve: the curve equals the one implied by
  the norms of ``jr.run`` with the same key (clean-misclassified points included)."""
  norm = "l1"
  model, x, y, d = _problem(10, norm)
  labels = np.where(np.arange(N) % 5 == 0, (y + 1) % 10, y).astype(np.int32)
  epsilons = np.quantile(d, np.linspace(0.0, 1.0, 7)).astype(np.float32) * 1.02
  epsilons[0] = 0.0
  curve_fn = jax.jit(lambda x, y, eps: jr.robustness_curve(
      fmn(norm, steps=STEPS), model.logits_fn, x, y, eps, jax.random.key(0)))
  curve = curve_fn(jnp.asarray(x), jnp.asarray(labels), jnp.asarray(epsilons))
  result = _jitted(norm)(model, x, labels)
  correct = jr.predict(model.logits_fn(jnp.asarray(x))) == jnp.asarray(labels)
  expected = jr.curve_from_norms(result.norm, correct, jnp.asarray(epsilons))
  for field in ("epsilons", "clean_accuracy", "robust_accuracy", "robust", "auc"):
    np.testing.assert_array_equal(np.asarray(getattr(curve, field)),
                                  np.asarray(getattr(expected, field)), err_msg=field)
  clean = 1 - np.mean(np.arange(N) % 5 == 0)
  assert float(curve.clean_accuracy) == pytest.approx(clean)
  acc = np.asarray(curve.robust_accuracy)
  assert acc[0] == pytest.approx(clean) and acc[-1] <= 0.05


@pytest.mark.parametrize("norm", NORMS)
def test_first_radius_is_the_linearised_distance(norm):
  """From ``delta = 0`` on a linear model the first-order estimate is exact: ``eps_1 = d`` for
  the binary model, and the first iterate lies on the ball of that radius."""
  model, x, y, d = _problem(2, norm)
  attack = fmn(norm, steps=STEPS)
  x, y = jnp.asarray(x), jnp.asarray(y)
  budget = jr.Budget(jnp.inf)

  @jax.jit
  def one_step(x, y):
    state = attack.init(model.logits_fn, x, y, budget, None)
    return attack.step(model.logits_fn, state, x, y, budget)

  state = one_step(x, y)
  np.testing.assert_allclose(np.asarray(state.eps), d, rtol=1e-5)
  size = np.asarray(jr.projections.norm(state.x_adv - x, norm))
  np.testing.assert_allclose(size, d, rtol=1e-5, atol=1e-7)  # rounding of (x + delta) - x
  assert not np.asarray(state.found).any() and int(state.k) == 1


def _box_constrained_l2_distance(v, gap, x):
  """``min ||d||_2`` with ``<v, d> = gap`` and ``0 <= x + d <= 1`` in float64 (KKT:
  ``|d_i| = min(lam |v_i|, room_i)``, bisection on ``lam``)."""
  room = np.where(v > 0, 1 - x, x)
  reach = lambda lam: np.sum(np.abs(v) * np.minimum(lam * np.abs(v), room))
  assert reach(1e30) > gap
  low, high = 0.0, 1.0
  while reach(high) < gap:
    high *= 2
  for _ in range(200):
    mid = (low + high) / 2
    low, high = (mid, high) if reach(mid) < gap else (low, mid)
  return np.linalg.norm(np.minimum(high * np.abs(v), room))


def test_inputs_on_the_faces_of_the_box_do_not_stall_the_radius():
  """Half the coordinates of every point sit on the face of the box that the gradient pushes
  against, so the clip removes part of every step. The radius estimate, blind to the box, used
  to settle where the clipped mass equals the estimated remaining distance: 33% of these points
  were broken. The exact box-constrained distance is the ground truth."""
  rng = np.random.default_rng(0)
  w = rng.normal(size=(DIM, 2))
  v = w[:, 1] - w[:, 0]
  model = Linear(w, np.zeros(2))
  x = rng.uniform(0.3, 0.7, (N, DIM))
  on_face = rng.uniform(size=(N, DIM)) < 0.5
  x = np.where(on_face, np.where(v > 0, 1.0, 0.0)[None], x).astype(np.float32)
  z = x.astype(np.float64) @ w
  y = np.argmax(z, axis=1).astype(np.int32)
  sign = np.where(y == 0, 1.0, -1.0)  # v, the direction that raises the other class
  d = np.array([_box_constrained_l2_distance(sign[i] * v, abs(z[i, 0] - z[i, 1]),
                                             x[i].astype(np.float64)) for i in range(N)])
  result = _jitted("l2")(model, x, y)
  success, size = np.asarray(result.success), np.asarray(result.norm, np.float64)
  assert success.mean() >= 0.95, success.mean()
  ratio = size[success] / d[success]
  assert ratio.min() >= 1 - 1e-4, ratio.min()
  assert np.median(ratio) <= 1.01, np.median(ratio)


def test_batch_sharded_run_equals_one_device():
  model, x, y, _ = _problem(10, "linf")
  run = _jitted("linf")
  assert_explicit_sharding_matches_one_device(run, model, sharded_args=(x, y))


def test_attack_is_minimum_norm_with_a_stable_carry():
  attack = fmn("l1", steps=7, targeted=True)
  assert attack.minimum_norm and attack.targeted
  assert attack.num_steps == 7 and attack.norm == "l1" and attack.name == "fmn-l1-7-targeted"
  model = random_linear(0, DIM, 3)
  x, y = jnp.full((4, DIM), 0.5, jnp.float32), jnp.zeros(4, jnp.int32)
  target, budget = jnp.ones(4, jnp.int32), jr.Budget(jnp.inf)
  state0 = jax.eval_shape(lambda: attack.init(model.logits_fn, x, y, budget, None, target))
  state1 = jax.eval_shape(lambda s: attack.step(model.logits_fn, s, x, y, budget, target), state0)
  assert jax.tree.structure(state0) == jax.tree.structure(state1)
  assert jax.tree.map(lambda a: (a.shape, a.dtype), state0) == \
      jax.tree.map(lambda a: (a.shape, a.dtype), state1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(norm="l0"), "'linf', 'l2' or 'l1'"),
    (dict(norm="L2"), "'linf', 'l2' or 'l1'"),
    (dict(steps=0), "steps must be an int >= 1"),
    (dict(steps=2.0), "steps must be an int >= 1"),
    (dict(alpha_init=0.0), "alpha_init"),
    (dict(alpha_init=float("inf")), "alpha_init"),
    (dict(alpha_final=0.0), "alpha_final"),
    (dict(alpha_final=2.0), "alpha_final"),
    (dict(gamma_init=1.0), "gamma_init"),
    (dict(gamma_init=float("nan")), "gamma_init"),
    (dict(gamma_final=-0.01), "gamma_final"),
    (dict(gamma_final=0.1), "gamma_final"),
    (dict(targeted=1), "targeted"),
])
def test_invalid_options_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    fmn(**kwargs)


# --- done: the rows early exit may freeze --------------------------------------------------------


def test_done_exactly_when_finalize_returns_an_adversarial_point_inside_the_ball():
  """Four groups of per-example eps: ``inf``, below the exact distance, 1.5 and 3 times it. A row
  is done exactly when ``finalize`` returns an adversarial point inside its ball (at ``inf``:
  never, the point keeps shrinking); freezing done rows changes no verdict (their point is the
  first inside the ball instead of the smallest) and leaves the other rows alone (to
  float rounding, see ``tests.models.FROZEN_ATOL``)."""
  norm = "l2"
  model, x, y, d = _problem(10, norm)
  group = np.arange(N) % 4
  eps = np.select([group == 0, group == 1, group == 2], [np.inf, 0.9, 1.5], 3.0) * d
  budget = jr.Budget(jnp.asarray(eps, jnp.float32))
  attack = fmn(norm, steps=12)
  (first, x_first), (done, x_dense), (done_frozen, x_frozen) = frozen_scan(
      attack, model.logits_fn, jnp.asarray(x), jnp.asarray(y), budget, None)
  first, done, done_frozen = (np.asarray(v) for v in (first, done, done_frozen))
  inside = functools.partial(adversarial_inside, model, x, y, eps, norm)
  # The first step scores x itself (its move is scored by the next step or by finalize).
  assert not first.any()
  np.testing.assert_array_equal(done, inside(x_dense) & np.isfinite(eps))
  np.testing.assert_array_equal(done, group >= 2)
  assert inside(x_dense)[group == 0].all()
  np.testing.assert_array_equal(done_frozen, done)
  np.testing.assert_array_equal(inside(x_frozen), inside(x_dense))
  assert_unfrozen_rows_close(x_frozen, x_dense, done)
  sizes = [np.asarray(jr.projections.norm(v - x, norm)) for v in (x_frozen, x_dense)]
  assert np.all(sizes[0][done] >= sizes[1][done] - FROZEN_ATOL)
  assert np.any(sizes[0][done] > sizes[1][done])


def test_early_exit_at_a_finite_eps_stops_after_the_first_success_and_inf_runs_every_step():
  """Early exit against the dense run, counting the gradient rows through the model.

  Three per-example budgets, each run with and without early exit in chunks of 8 rows (so that
  the rows left are re-compacted): three times the exact distance, where every point is broken
  within a few steps, so the 100-step attack costs a few gradient rows per point instead of 101
  (and ``early_exit=False`` still returns the unbounded result); ``inf`` (the minimum-norm
  search), where no row is ever done, every step runs and the norms are unchanged; and a mix of
  ``inf``, 0.9, 1.5 and 3 times the distance, where the rows at ``inf`` keep their norms while
  the others stop. The verdicts are always those of ``early_exit=False``."""
  norm = "l2"
  model, x, y, d = _problem(10, norm)
  attack = fmn(norm, steps=STEPS)
  results, rows = min_norm_early_exit_runs(attack, model.logits_fn, x, y, d)
  assert rows["far", True] <= 8 * N, rows
  np.testing.assert_allclose(np.asarray(results["far", False].x_adv),
                             np.asarray(results["inf", False].x_adv), rtol=0, atol=1e-6)
