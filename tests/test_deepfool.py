"""DeepFool against closed-form answers.

On a linear model the linearisation is exact, so DeepFool's first step lands on the nearest
boundary of the candidate classes: with every class a candidate, the returned norm is
``(1 + overshoot) (1 + 1e-4)`` times the exact minimal distance
``min_j (z_y - z_j) / ||w_y - w_j||_q`` (``1e-4`` is the relative crossing term). No adversarial
point is closer than that distance, so every returned norm must be at least it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust.attacks._deepfool import deepfool
from tests.models import (Linear, adversarial_inside, assert_explicit_sharding_matches_one_device,
                          frozen_scan, linear_points, min_norm_early_exit_runs, random_linear)

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

DIM = 16
N = 48
OVERSHOOT = 0.02


@functools.lru_cache(maxsize=None)
def _jitted(norm: str, steps: int, candidates: int = 10):
  """One compiled ``jr.run`` per configuration, shared by every test of the module."""
  attack = deepfool(norm, steps=steps, overshoot=OVERSHOOT, candidates=candidates)

  @jax.jit
  def jitted(w, b, x, y, eps):
    return jr.run(attack, Linear(w, b).logits_fn, x, y, jr.Budget(eps), jax.random.key(0))

  def run(model: Linear, x, y, eps=np.inf):
    """Always a per-example eps, so that every call of a configuration reuses one compilation."""
    eps = jnp.broadcast_to(jnp.asarray(eps, jnp.float32), (len(x),))
    return jitted(model.w, model.b, jnp.asarray(x), jnp.asarray(y), eps)

  return run


def _fits_in_box(model: Linear, x, y, d, norm, scale=1.05):
  """Two-class points whose optimal perturbation of size ``scale * d`` stays inside [0, 1]."""
  dw = model.w[:, 1 - y].T - model.w[:, y].T  # ascent direction of z_other - z_y, [N, D]
  if norm == "linf":
    step = np.sign(dw) * (scale * d)[:, None]
  else:
    step = dw / np.linalg.norm(dw, axis=1, keepdims=True) * (scale * d)[:, None]
  moved = x.reshape(len(x), -1).astype(np.float64) + step
  return np.all((moved >= 0) & (moved <= 1), axis=1)


def _margin(model: Linear, x, y):
  """``z_y - max_{j != y} z_j`` in float64."""
  z = x.reshape(len(x), -1).astype(np.float64) @ model.w + model.b
  other = np.where(np.arange(z.shape[1])[None, :] == y[:, None], -np.inf, z)
  return z[np.arange(len(x)), y] - other.max(axis=1)


@functools.lru_cache(maxsize=None)
def _binary(norm: str):
  """A two-class model whose boundary passes through the box centre, and points inside the box
  whose optimum stays in it, with a logit margin >= 0.2 (far from float32 rounding)."""
  model = random_linear(2, DIM, 2)
  model = Linear(model.w, -0.5 * model.w.sum(0))
  x, y, d = linear_points(model, 3, 4 * N, (DIM,), norm)
  keep = _fits_in_box(model, x, y, d, norm) & (_margin(model, x, y) >= 0.2)
  assert keep.sum() >= N, keep.sum()
  return model, x[keep][:N], y[keep][:N], d[keep][:N]


@pytest.mark.parametrize("steps", [1, 50])
@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_binary_linear_lands_at_overshoot_times_the_exact_distance(norm, steps):
  model, x, y, d = _binary(norm)
  result = _jitted(norm, steps)(model, x, y)
  assert np.asarray(result.success).all(), np.flatnonzero(~np.asarray(result.success))
  size = np.asarray(result.norm, np.float64)
  np.testing.assert_allclose(size / d, 1 + OVERSHOOT, rtol=1e-3)
  assert np.all(size >= d * (1 - 1e-6))
  np.testing.assert_allclose(np.asarray(jr.projections.norm(result.x_adv - x, norm)), size,
                             rtol=1e-6)


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_multiclass_linear_is_exact_up_to_overshoot(norm):
  model = random_linear(0, DIM, 10)
  x, y, d = linear_points(model, 1, N, (DIM,), norm)
  assert np.all(d > 0)
  result = _jitted(norm, 50)(model, x, y)
  assert np.asarray(result.success).all()
  ratio = np.asarray(result.norm, np.float64) / d
  assert ratio.min() >= 1 - 1e-5, ratio.min()
  assert np.median(ratio) <= 1.05, np.median(ratio)


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_result_does_not_depend_on_the_scale_of_the_logits(norm):
  """Multiplying the logits by 1e-6 or 1e6 moves no decision boundary, so the answer must not
  move either. (An absolute crossing term of 1e-4 logits sent every point about 100 times its
  exact distance past the boundary at scale 1e-6.)"""
  model, x, y, d = _binary(norm)
  run = _jitted(norm, 50)
  sizes = []
  for scale in (1.0, 1e-6, 1e6):
    result = run(Linear(model.w * scale, model.b * scale), x, y)
    assert np.asarray(result.success).all(), scale
    sizes.append(np.asarray(result.norm, np.float64))
  np.testing.assert_allclose(sizes[0] / d, (1 + OVERSHOOT) * (1 + 1e-4), rtol=1e-3)
  np.testing.assert_allclose(sizes[1], sizes[0], rtol=1e-4)
  np.testing.assert_allclose(sizes[2], sizes[0], rtol=1e-4)


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_already_misclassified_points_get_zero_perturbation(norm):
  """Mislabelled (so clean-misclassified) points stay put; the others in the batch still move."""
  model = random_linear(0, DIM, 10)
  x, y, d = linear_points(model, 1, N, (DIM,), norm)
  wrong = np.arange(N) % 2 == 0
  labels = np.where(wrong, (y + 1) % 10, y).astype(np.int32)
  result = _jitted(norm, 50)(model, x, labels)
  np.testing.assert_array_equal(np.asarray(result.x_adv)[wrong], x[wrong])
  assert np.asarray(result.success).all()
  size = np.asarray(result.norm, np.float64)
  np.testing.assert_array_equal(size[wrong], 0.0)
  assert np.all(size[~wrong] >= d[~wrong] * (1 - 1e-5))


@pytest.mark.parametrize("norm", ["l2", "linf"])
def test_eps_is_an_upper_bound(norm):
  """Below the exact distance nothing succeeds and x_adv stays in the ball; above the DeepFool
  norm every point succeeds within eps. Per-example eps mixes both in one batch."""
  model, x, y, d = _binary(norm)
  run = _jitted(norm, 50)
  below = run(model, x, y, 0.9 * d)
  assert not np.asarray(below.success).any()
  np.testing.assert_array_equal(np.asarray(below.norm), np.inf)
  x_adv = np.asarray(below.x_adv)
  assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
  size = np.asarray(jr.projections.norm(below.x_adv - x, norm))
  assert np.all(size <= 0.9 * d * (1 + 1e-5) + 1e-7)

  eps = np.where(np.arange(len(x)) % 2 == 0, 0.9 * d, 1.05 * d)
  mixed = run(model, x, y, eps)
  np.testing.assert_array_equal(np.asarray(mixed.success), np.arange(len(x)) % 2 == 1)
  size = np.asarray(jr.projections.norm(mixed.x_adv - x, norm))
  assert np.all(size <= eps * (1 + 1e-5) + 1e-7)


def test_overshoot_scales_the_accumulated_perturbation():
  """A concave 1-D boundary takes three Newton-like steps; the iterate is x + 1.02 * sum(steps).

  Reference in float64: ``r += (1 + 1e-4) |f(u)| / f'(u) + 1e-4 |r|`` at
  ``u = x + (1 + overshoot) r`` until ``f(u) > 0`` (the crossing is relative, in input units);
  the attack must return exactly that iterate (and stop moving there).
  """
  f = lambda u: 1 - np.exp(-3 * (u - 0.5))
  df = lambda u: 3 * np.exp(-3 * (u - 0.5))

  def logits_fn(x):
    u = x[:, 0]
    return jnp.stack([jnp.zeros_like(u), 1 - jnp.exp(-3 * (u - 0.5))], axis=1)

  starts = np.array([0.2, 0.1, 0.35])
  expected, counts = [], []
  for u0 in starts:
    r, u, count = 0.0, u0, 0
    while f(u) <= 0:
      r += (1 + 1e-4) * abs(f(u)) / df(u) + 1e-4 * abs(r)
      u, count = u0 + (1 + OVERSHOOT) * r, count + 1
    expected.append(u)
    counts.append(count)
  assert max(counts) >= 3, counts
  x, y = jnp.asarray(starts[:, None], jnp.float32), jnp.zeros(3, jnp.int32)
  attack = deepfool("l2", steps=10, overshoot=OVERSHOOT)
  result = jax.jit(lambda x, y: jr.run(attack, logits_fn, x, y, jr.Budget(jnp.inf),
                                       jax.random.key(0)))(x, y)
  assert np.asarray(result.success).all()
  np.testing.assert_allclose(np.asarray(result.x_adv)[:, 0], expected, atol=2e-6)


def test_robustness_curve_matches_the_closed_form():
  """One run gives the curve; a point can differ from the truth only when a grid eps lies
  between its exact distance and DeepFool's (1 + overshoot) times it."""
  norm = "l2"
  model, x, y, d = _binary(norm)
  epsilons = np.quantile(d, np.linspace(0.0, 1.0, 9)).astype(np.float32) * 1.01
  epsilons[0] = 0.0
  curve_fn = jax.jit(lambda x, y, eps: jr.robustness_curve(
      deepfool(norm, overshoot=OVERSHOOT), model.logits_fn, x, y, eps, jax.random.key(0)))
  curve = curve_fn(jnp.asarray(x), jnp.asarray(y), jnp.asarray(epsilons))
  truth = d[None, :] > epsilons[:, None]  # [K, B]; every point is clean-correct
  within = (epsilons[:, None] >= d[None, :]) & (epsilons[:, None] < 1.03 * d[None, :])
  robust = np.asarray(curve.robust)
  np.testing.assert_array_equal(robust[~within], truth[~within])
  assert float(curve.clean_accuracy) == 1.0
  exact = truth.mean(axis=1)
  slack = within.mean(axis=1)
  acc = np.asarray(curve.robust_accuracy)
  assert np.all((acc >= exact - 1e-6) & (acc <= exact + slack + 1e-6))


def test_fewer_candidates_under_vmap_over_eps():
  """``candidates=2`` on ten classes, vmapped over two budgets: unbounded, every point is broken
  at or above its exact distance; below the exact distance, none is."""
  model = random_linear(0, DIM, 10)
  x, y, d = linear_points(model, 1, N, (DIM,), "l2")
  attack = deepfool("l2", steps=50, candidates=2)
  run = jax.jit(jax.vmap(lambda eps: jr.run(attack, model.logits_fn, jnp.asarray(x),
                                            jnp.asarray(y), jr.Budget(eps), jax.random.key(0))))
  result = run(jnp.asarray(np.stack([np.full(N, np.inf), 0.9 * d]), jnp.float32))
  np.testing.assert_array_equal(np.asarray(result.success), [[True] * N, [False] * N])
  assert np.all(np.asarray(result.norm[0], np.float64) >= d * (1 - 1e-5))


def test_batch_sharded_run_equals_one_device():
  model, x, y, _ = _binary("linf")
  run = _jitted("linf", 50)
  assert_explicit_sharding_matches_one_device(run, model, sharded_args=(x, y))


@pytest.mark.parametrize("kwargs, match", [
    (dict(norm="l1"), "'l2' or 'linf'"),
    (dict(norm="L2"), "'l2' or 'linf'"),
    (dict(steps=0), "steps"),
    (dict(steps=2.0), "steps"),
    (dict(overshoot=-0.1), "overshoot"),
    (dict(overshoot=float("nan")), "overshoot"),
    (dict(candidates=0), "candidates"),
])
def test_invalid_options_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    deepfool(**kwargs)


def test_attack_is_minimum_norm_and_caps_candidates():
  attack = deepfool("linf", steps=7)
  assert attack.minimum_norm and not attack.targeted
  assert attack.num_steps == 7 and attack.norm == "linf"
  model = random_linear(0, DIM, 3)  # candidates=10 is capped at C - 1 = 2
  x = jnp.full((4, DIM), 0.5, jnp.float32)
  state = jax.eval_shape(lambda: attack.init(model.logits_fn, x, jnp.zeros(4, jnp.int32),
                                             jr.Budget(jnp.inf), None))
  assert state.classes.shape == (4, 2)


# --- done: the rows early exit may freeze --------------------------------------------------------


def test_done_exactly_when_finalize_returns_an_adversarial_point_inside_the_ball():
  """Four groups of per-example eps: ``inf``, below the exact distance, just above DeepFool's
  norm, far above. After one step no row is done (it scored x itself); after the steps every
  iterate is adversarial (the first move is exact here), so every row is done at every eps,
  ``inf`` included (its iterate no longer moves), while ``finalize`` returns an adversarial point
  inside the ball only where eps allows it; freezing done rows changes no returned point, since
  DeepFool stops moving at its first success anyway."""
  norm = "l2"
  model, x, y, d = _binary(norm)
  group = np.arange(N) % 4
  eps = np.select([group == 0, group == 1, group == 2], [np.inf, 0.9, 1.05], 3.0) * d
  budget = jr.Budget(jnp.asarray(eps, jnp.float32))
  attack = deepfool(norm, steps=4, overshoot=OVERSHOOT)
  (first, x_first), (done, x_dense), (done_frozen, x_frozen) = frozen_scan(
      attack, model.logits_fn, jnp.asarray(x), jnp.asarray(y), budget, None)
  first, done, done_frozen = (np.asarray(v) for v in (first, done, done_frozen))
  inside = functools.partial(adversarial_inside, model, x, y, eps, norm)
  # The first step scores x itself (its move is scored by the next step or by finalize).
  assert not first.any() and inside(x_first)[group >= 2].all()
  assert done.all()
  np.testing.assert_array_equal(inside(x_dense), group != 1)
  np.testing.assert_array_equal(done_frozen, done)
  # DeepFool stops moving at its first success anyway: the same points (up to the rounding of
  # x + (1 + overshoot) r, which XLA may fuse differently in the two loops).
  np.testing.assert_allclose(np.asarray(x_frozen), np.asarray(x_dense), rtol=0, atol=1e-6)


def test_early_exit_at_a_finite_eps_stops_after_the_first_success_and_inf_runs_every_step():
  """Early exit against the dense run, counting the gradient rows through the model.

  Three per-example budgets, each run with and without early exit in chunks of 8 rows (so that
  the rows left are re-compacted): three times the exact distance, where every point is broken
  by the first move (scored by the second step), so the 50-step attack costs three gradient rows
  per point (``jr.run``'s clean check and two steps) instead of 51, with the same points;
  ``inf`` (the minimum-norm search), where a row is done once its iterate is adversarial (it no
  longer moves: ``done_unbounded``), so it costs the same three rows, with the dense run's norms;
  and a mix of ``inf``, 0.9, 1.5 and 3 times the distance, where the rows at ``inf`` keep their
  norms. The verdicts are always those of ``early_exit=False``."""
  norm = "l2"
  model, x, y, d = _binary(norm)
  attack = deepfool(norm, steps=50, overshoot=OVERSHOOT)
  results, rows = min_norm_early_exit_runs(attack, model.logits_fn, x, y, d)
  assert rows["far", True] <= 3 * N and rows["inf", True] <= 3 * N, rows
  # DeepFool stops moving at its first success anyway: the same points.
  np.testing.assert_allclose(np.asarray(results["far", True].x_adv),
                             np.asarray(results["far", False].x_adv), rtol=0, atol=1e-6)
