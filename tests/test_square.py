"""The Square attack: schedule, patterns, budget, linear ground truth and gradient masking.

Square only queries logits, so on a linear model it can never succeed below the closed-form
minimal distance ``d*`` and, with enough queries, must succeed well above it; on a model whose
input gradient is zero it must find what PGD cannot.
"""

from __future__ import annotations

import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust.attacks.square import eta, p_schedule, square, window_sizes
from tests.models import (
  Linear,
  assert_explicit_sharding_matches_one_device,
  random_linear,
)

square_lib = importlib.import_module("jaxrobust.attacks.square")  # the module, not the factory

# One image shape per norm, odd-sized, two channels; non-square for Linf. [B, H, W] images (one
# channel) are checked by the targeted test.
SHAPES = {"linf": (7, 5, 2), "l2": (7, 7, 2)}
TARGETED_SHAPE = (7, 5)
QUERIES = {"linf": 300, "l2": 500}
N = 32


@functools.cache
def _jitted(norm: str, queries: int, restarts: int = 2, targeted: bool = False):
  """A jitted run on a linear model given as data (so every test reuses one compilation)."""
  attack = square(norm, queries=queries, restarts=restarts, targeted=targeted)

  @jax.jit
  def run(w, b, x, y, eps, keys, target=None):
    return jr.run(attack, Linear(w, b).logits_fn, x, y, jr.Budget(eps), keys, target)

  return run


def _keys(n: int, seed: int = 0) -> jax.Array:
  return jax.vmap(lambda i: jax.random.fold_in(jax.random.key(seed), i))(jnp.arange(n))


def _problem(norm: str, seed: int = 0, classes: int = 10, shape: tuple[int, ...] | None = None):
  """A linear model on images of ``SHAPES[norm]``, points far from the box, and ``d*``."""
  shape = SHAPES[norm] if shape is None else shape
  model = random_linear(seed, int(np.prod(shape)), classes)
  rng = np.random.default_rng(seed + 1)
  x = rng.uniform(0.3, 0.7, size=(N,) + shape).astype(np.float32)
  y = np.argmax(np.asarray(model.logits_fn(jnp.asarray(x))), axis=1).astype(np.int32)
  return model, x, y, model.min_distance(x, y, norm)


def test_p_schedule_follows_the_reference_thresholds():
  # 20 queries: iteration k is rescaled to int(500 k); p halves past 10, 50, 200, 500, 1000,
  # 2000, 4000, 6000 and 8000.
  halvings = [0, 3, 4, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7, 8, 8, 8, 8, 9, 9, 9]
  np.testing.assert_array_equal(p_schedule(20, 0.8), 0.8 / 2.0 ** np.asarray(halvings))
  # 5000 queries (AutoAttack): k is rescaled to 2 k, so p halves after k = 5, 25, 100, 250, 500,
  # 1000, 2000, 3000 and 4000.
  p = p_schedule(5000, 0.8)
  ends = [5, 25, 100, 250, 500, 1000, 2000, 3000, 4000, 4999]
  for n, (lo, hi) in enumerate(zip([0] + [e + 1 for e in ends[:-1]], ends)):
    np.testing.assert_array_equal(p[lo:hi + 1], 0.8 / 2 ** n)
  # 10000 queries: no rescaling, the thresholds apply to k itself.
  p = p_schedule(10000, 0.5)
  assert p[10] == 0.5 and p[11] == 0.25 and p[8000] == 0.5 / 256 and p[8001] == 0.5 / 512


def test_window_sides():
  # 28 x 28 (MNIST): sqrt(p * 784) for p = 0.8, 0.4, 0.2, 0.1, 0.05, ..., 0.8 / 512.
  at = [0, 6, 26, 101, 251, 501, 1001, 2001, 3001, 4001]
  assert window_sizes("linf", 5000, 0.8, 28, 28)[at].tolist() == [25, 18, 13, 9, 6, 4, 3, 2, 2, 1]
  assert window_sizes("l2", 5000, 0.8, 28, 28)[at].tolist() == [25, 19, 13, 9, 7, 5, 3, 3, 3, 3]
  # Capped by the shorter side, and kept odd by L2 unless the cap is even.
  assert window_sizes("linf", 10, 0.8, 7, 5)[0] == 5
  assert window_sizes("l2", 10, 0.8, 4, 9)[0] == 4


def test_eta_pattern():
  # eta(3): top row [1, 5, 1] / sqrt(27), bottom rows -[[1, 1, 1], [1, 5, 1]] / sqrt(30), both
  # halves of norm 1 / sqrt(2).
  expected = np.array([[1, 5, 1], [-1, -1, -1], [-1, -5, -1]]) / np.sqrt([[54], [60], [60]])
  np.testing.assert_allclose(eta(3), expected, rtol=1e-12)
  for s in (1, 2, 4, 7, 12):
    e = eta(s)
    assert e.shape == (s, s)
    np.testing.assert_allclose(np.sum(e ** 2), 1.0, rtol=1e-12)
    assert np.all(e[: s // 2] > 0) and np.all(e[s // 2:] < 0)
    if s > 1:
      np.testing.assert_allclose(np.sum(e[: s // 2] ** 2), 0.5, rtol=1e-12)


def test_eta_evaluated_in_place_matches_the_pattern():
  """The per-pixel closed form the L2 update uses equals ``eta(s)`` (or its transpose) placed."""
  height, width, batch = 13, 11, 8
  rng = np.random.default_rng(0)
  place = jax.jit(square_lib._eta_window, static_argnums=(5, 6, 7))  # one compilation for all s
  for s in (1, 2, 3, 6, 11):
    _, constants = square_lib._schedule_tables("l2", 1, 1.0, s, s)  # one iteration, side s
    h, w = rng.integers(0, height - s + 1, batch), rng.integers(0, width - s + 1, batch)
    flip = np.arange(batch) % 2 == 1
    placed = place(
        jnp.int32(s), jnp.asarray(constants[0]), jnp.asarray(h, jnp.int32),
        jnp.asarray(w, jnp.int32), jnp.asarray(flip), height, width, jnp.float32)
    expected = np.zeros((batch, height, width, 1))
    for b in range(batch):
      expected[b, h[b]:h[b] + s, w[b]:w[b] + s, 0] = eta(s).T if flip[b] else eta(s)
    np.testing.assert_allclose(np.asarray(placed), expected, atol=1e-6)


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_outputs_inside_box_and_ball_with_per_example_eps(norm):
  model, x, y, _ = _problem(norm, seed=3)
  rng = np.random.default_rng(4)
  x = np.where(rng.uniform(size=x.shape) < 0.5, 0.0, 1.0).astype(np.float32)  # box corners
  x[::3] = rng.uniform(0, 1, size=x[::3].shape)
  y = np.argmax(np.asarray(model.logits_fn(jnp.asarray(x))), axis=1).astype(np.int32)
  scale = {"linf": 0.2, "l2": 2.0}[norm]
  eps = (scale * rng.uniform(0.2, 1.0, size=N)).astype(np.float32)
  eps[::4] = 0.0
  result = _jitted(norm, QUERIES[norm])(model.w, model.b, jnp.asarray(x), jnp.asarray(y),
                                        jnp.asarray(eps), _keys(N))
  x_adv = np.asarray(result.x_adv)
  assert x_adv.dtype == np.float32 and x_adv.min() >= 0.0 and x_adv.max() <= 1.0
  size = np.asarray(jr.projections.norm(result.x_adv - x, norm))
  if norm == "linf":
    assert np.all(np.abs(x_adv - x).max(axis=(1, 2, 3)) <= eps + 6e-8)  # rounding of x + delta
  else:
    assert np.all(size <= eps * (1 + 1e-6))
  np.testing.assert_array_equal(x_adv[::4], x[::4])  # eps = 0: x, bitwise
  assert np.asarray(result.success)[eps > 0].any()
  pred = np.argmax(np.asarray(model.logits_fn(result.x_adv)), axis=1)
  np.testing.assert_array_equal(np.asarray(result.success), pred != y)


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_linear_model_ground_truth(norm):
  """Never below ``d*``; nearly always at ``2 d*``, where half of the optimal alignment suffices."""
  model, x, y, d = _problem(norm)
  assert np.all(d > 0)
  run = functools.partial(_jitted(norm, QUERIES[norm]), model.w, model.b, jnp.asarray(x),
                          jnp.asarray(y))
  below = run(jnp.asarray(0.97 * d, jnp.float32), _keys(N))
  assert not np.asarray(below.success).any()
  above = run(jnp.asarray(2.0 * d, jnp.float32), _keys(N))
  assert np.asarray(above.success).mean() >= 0.9, np.asarray(above.success).mean()


def test_same_key_same_result_and_batch_order_invariance():
  model, x, y, d = _problem("linf", seed=5)
  run = functools.partial(_jitted("linf", QUERIES["linf"]), model.w, model.b)
  eps = jnp.asarray(np.where(np.arange(N) % 2 == 0, 0.97, 1.5) * d, jnp.float32)
  keys = _keys(N, seed=7)
  a = run(jnp.asarray(x), jnp.asarray(y), eps, keys)
  b = run(jnp.asarray(x), jnp.asarray(y), eps, keys)
  np.testing.assert_array_equal(np.asarray(a.x_adv), np.asarray(b.x_adv))
  np.testing.assert_array_equal(np.asarray(a.success), np.asarray(b.success))
  perm = np.random.default_rng(8).permutation(N)
  c = run(jnp.asarray(x[perm]), jnp.asarray(y[perm]), eps[perm], keys[perm])
  np.testing.assert_allclose(np.asarray(c.x_adv), np.asarray(a.x_adv)[perm], atol=1e-6)
  np.testing.assert_array_equal(np.asarray(c.success), np.asarray(a.success)[perm])
  assert 0 < np.asarray(a.success).mean() < 1  # a check that can tell the orders apart


def test_gradient_masking_is_exposed():
  """Rounded inputs give PGD a zero gradient; Square only needs the logits."""
  shape = (6, 6, 1)
  model = random_linear(11, int(np.prod(shape)), 10)

  def logits_fn(x):
    return model.logits_fn(jnp.round(x * 8) / 8)

  rng = np.random.default_rng(12)
  x = jnp.asarray(rng.uniform(0.3, 0.7, size=(64,) + shape), jnp.float32)
  y = jnp.argmax(logits_fn(x), axis=1).astype(jnp.int32)
  budget, key = jr.Budget(0.1), jax.random.key(0)
  grad = jax.grad(lambda v: jnp.sum(logits_fn(v)[:, 0]))(x)
  assert not np.any(np.asarray(grad))  # the gradient is masked
  by_pgd = jax.jit(lambda: jr.run(jr.attacks.pgd("linf", steps=20), logits_fn, x, y, budget,
                                  key))()
  by_square = jax.jit(lambda: jr.run(square("linf", queries=300), logits_fn, x, y, budget,
                                     key))()
  robust_pgd = 1 - np.asarray(by_pgd.success).mean()
  robust_square = 1 - np.asarray(by_square.success).mean()
  assert robust_square <= robust_pgd - 0.5, (robust_pgd, robust_square)  # about 0.95 vs 0.0


def _targeted_problem():
  model, x, y, d = _problem("l2", seed=13, shape=TARGETED_SHAPE)
  target = ((y + 1 + np.arange(N) % 9) % 10).astype(np.int32)
  return model, x, y, jnp.asarray(4 * d, jnp.float32), target


def test_targeted_success_means_argmax_equals_target_on_three_axis_images():
  model, x, y, eps, target = _targeted_problem()
  result = _jitted("l2", 100, targeted=True)(model.w, model.b, jnp.asarray(x), jnp.asarray(y),
                                              eps, _keys(N), jnp.asarray(target))
  assert result.x_adv.shape == x.shape == (N,) + TARGETED_SHAPE
  pred = np.argmax(np.asarray(result.logits), axis=1)
  np.testing.assert_array_equal(np.asarray(result.success), pred == target)
  assert np.asarray(result.success).mean() > 0.5


def test_bad_inputs_raise():
  for kwargs in ({"norm": "l1"}, {"norm": "l3"}, {"queries": 0}, {"restarts": 0},
                 {"p_init": 0.0}, {"p_init": 1.5}, {"loss": "hinge"}, {"targeted": 1}):
    with pytest.raises(ValueError):
      square(**kwargs)
  attack = square("linf", queries=3)
  logits_fn = lambda x: x.reshape(x.shape[0], -1)[:, :3]
  for shape in ((4, 9), (4, 2, 3, 3, 1)):
    x, y = jnp.full(shape, 0.5), jnp.zeros(4, jnp.int32)
    with pytest.raises(ValueError, match="images"):
      jax.eval_shape(lambda x, y: jr.run(attack, logits_fn, x, y, jr.Budget(0.1),
                                         jax.random.key(0)), x, y)
  x, y = jnp.full((4, 3, 3, 1), 0.5), jnp.zeros(4, jnp.int32)
  with pytest.raises(ValueError, match="target"):
    jr.run(square("linf", queries=3, targeted=True), logits_fn, x, y, jr.Budget(0.1),
           jax.random.key(0))


def test_attack_metadata_and_stable_carry():
  attack = square("l2", queries=7, restarts=3, targeted=True)
  assert attack.num_steps == 3 * 8 - 1 and not attack.minimum_norm and attack.targeted
  assert attack.name == "square-l2-7x3-ce-targeted"
  assert square().name == "square-linf-5000x1-margin" and square().num_steps == 5000
  model = random_linear(0, 48, 3)
  x, y = jnp.full((4, 4, 4, 3), 0.5), jnp.zeros(4, jnp.int32)
  target, budget = jnp.ones(4, jnp.int32), jr.Budget(0.5)
  state0 = jax.eval_shape(lambda: attack.init(model.logits_fn, x, y, budget, _keys(4), target))
  state1 = jax.eval_shape(lambda s: attack.step(model.logits_fn, s, x, y, budget, target), state0)
  assert jax.tree.structure(state0) == jax.tree.structure(state1)
  assert jax.tree.map(lambda a: (a.shape, a.dtype), state0) == \
      jax.tree.map(lambda a: (a.shape, a.dtype), state1)


def test_batch_sharded_run_equals_one_device():
  """Linf untargeted and L2 targeted, each sharing its one-device compilation with a test above."""
  model, x, y, d = _problem("linf", seed=16)
  assert_explicit_sharding_matches_one_device(
      _jitted("linf", QUERIES["linf"]), model.w, model.b,
      sharded_args=(x, y, jnp.asarray(1.2 * d, jnp.float32), _keys(N)))
  model, x, y, eps, target = _targeted_problem()
  assert_explicit_sharding_matches_one_device(
      _jitted("l2", 100, targeted=True), model.w, model.b,
      sharded_args=(x, y, eps, _keys(N), target))


def test_unrescaled_schedule_as_in_autoattack():
  """AutoAttack runs Square with ``resc_schedule=False``: thresholds on the raw iteration."""
  from jaxrobust.attacks.square import p_schedule

  p = p_schedule(5000, 0.8, rescale=False) / 0.8
  halvings = {0: 1, 10: 1, 11: 2, 50: 2, 51: 4, 201: 8, 501: 16, 1001: 32, 2001: 64,
              4000: 64, 4001: 128, 4999: 128}
  for k, divisor in halvings.items():
    assert p[k] == 1 / divisor, (k, p[k])
  # The rescaled schedule (the default) halves twice as early at 5000 queries.
  assert p_schedule(5000, 0.8)[6] == 0.4 and p[6] == 1.0
