"""AutoAttack suites: closed-form ground truth, reliability flags on masked models, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import jaxrobust as jr
from tests.models import linear_points, random_linear

SHAPE = (4, 4, 1)  # an NHWC image, so Square applies
DIM = 16
CLASSES = 10


@pytest.fixture(scope="module")
def linear():
  return random_linear(11, DIM, CLASSES)


@pytest.mark.slow
@pytest.mark.parametrize("norm", ["linf", "l2", "l1"])
def test_closed_form_ground_truth(linear, norm):
  """Never below the minimal distance d*; at least 99% success at 1.05 d* (AutoAttack defaults).

  The closed-form d* ignores the box, so the points are chosen with d* < 0.25 while every
  coordinate lies in [0.3, 0.7]: the minimal perturbation then fits in the box, and d* is the true
  minimal distance in every norm (in L1 it moves a single coordinate by d*).
  """
  x, y, dist = linear_points(linear, 5, 4000, SHAPE, norm)
  near = np.flatnonzero(dist < 0.25)[:64]
  assert len(near) == 64
  x, y, dist = x[near], y[near], dist[near]
  attack = jr.attacks.auto_attack(norm)
  run = jax.jit(lambda scale: jr.run(attack, linear.logits_fn, jnp.asarray(x), jnp.asarray(y),
                                     jr.Budget(scale * jnp.asarray(dist, jnp.float32)),
                                     jax.random.key(0), chunk_size=16))
  below, above = run(0.97), run(1.05)
  assert not bool(jnp.any(below.success))
  assert float(jnp.mean(above.success)) >= 0.99
  # Every member after the first runs on the points still robust: the breakdown is cumulative.
  after = np.asarray(below.info["robust_after"])
  assert after.shape == (4 if norm != "l1" else 3, 64) and after.all()


def _flags(logits_fn, x, y, eps, **kwargs):
  attack = jr.attacks.auto_attack("linf", steps=kwargs.pop("steps", 10),
                                  queries=kwargs.pop("queries", 300), **kwargs)
  result = jax.jit(lambda: jr.run(attack, logits_fn, x, y, jr.Budget(eps), jax.random.key(1),
                                  chunk_size=16))()
  return {k: bool(v) for k, v in result.info["flags"].items()}, result


@pytest.fixture(scope="module")
def masked_problem():
  rng = np.random.default_rng(3)
  w = jnp.asarray(rng.normal(size=(DIM, CLASSES)), jnp.float32)
  x = jnp.asarray(rng.uniform(0.3, 0.7, size=(32,) + SHAPE), jnp.float32)
  plain = lambda v: v.reshape(v.shape[0], -1) @ w
  y = jnp.argmax(plain(x), axis=1).astype(jnp.int32)
  return w, x, y, plain


def test_no_flags_on_a_plain_model(masked_problem):
  _, x, y, plain = masked_problem
  flags, _ = _flags(plain, x, y, 0.1)
  assert not any(flags.values()), flags


@pytest.mark.parametrize("kind", ["rounded", "stop_gradient"])
def test_gradient_masking_is_flagged_and_square_exposes_it(masked_problem, kind):
  w, x, y, _ = masked_problem
  if kind == "rounded":
    masked = lambda v: (jnp.round(v * 8) / 8).reshape(v.shape[0], -1) @ w
  else:
    masked = lambda v: jax.lax.stop_gradient(v).reshape(v.shape[0], -1) @ w
  y = jnp.argmax(masked(x), axis=1).astype(jnp.int32)
  flags, result = _flags(masked, x, y, 0.1)
  assert flags["zero_gradients"]
  assert flags["square_beats_white_box"]
  after = np.asarray(result.info["robust_after"]).mean(axis=1)
  assert after[3] < after[2]  # Square lowered robust accuracy below the white-box members'
  assert result.info["counts"]["square_only_points"] > 0


def test_saturated_logits_zero_gradients(masked_problem):
  w, x, y, _ = masked_problem
  flags, _ = _flags(lambda v: 1e4 * (v.reshape(v.shape[0], -1) @ w), x, y, 0.01)
  assert flags["zero_gradients"]


def test_probability_outputs_flagged(masked_problem):
  w, x, y, _ = masked_problem
  flags, _ = _flags(lambda v: jax.nn.softmax(v.reshape(v.shape[0], -1) @ w), x, y, 0.05)
  assert flags["probability_outputs"]


def test_noisy_outputs_flagged(masked_problem):
  w, x, y, plain = masked_problem
  rng = np.random.default_rng(0)

  def noisy(v):
    shape = jax.ShapeDtypeStruct((v.shape[0], CLASSES), jnp.float32)
    noise = io_callback(lambda: rng.normal(size=shape.shape).astype(np.float32), shape)
    return plain(v) + 0.01 * noise

  flags, _ = _flags(noisy, x, y, 0.05)
  assert flags["randomized"]


def test_too_few_classes_for_targets_runs_with_fewer(masked_problem):
  w, x, _, _ = masked_problem
  small = lambda v: v.reshape(v.shape[0], -1) @ w[:, :5]
  y = jnp.argmax(small(x), axis=1).astype(jnp.int32)
  flags, result = _flags(small, x, y, 0.1)
  assert flags["too_few_classes_for_targets"]
  assert result.success.shape == (32,)


def test_rand_version_on_randomized_model(masked_problem):
  w, x, y, plain = masked_problem

  def noisy(v, keys):
    noise = jax.vmap(lambda k: jax.random.normal(k, v.shape[1:]))(keys)
    return plain(v + 0.01 * noise)

  attack = jr.attacks.auto_attack("linf", "rand", steps=5, samples=4)
  result = jax.jit(lambda: jr.run(attack, noisy, x, y, jr.Budget(0.1), jax.random.key(0)))()
  pgd = jax.jit(lambda: jr.run(jr.attacks.pgd(steps=10), plain, x, y, jr.Budget(0.1),
                               jax.random.key(0)))()
  # Noise of 0.01 barely changes the model: the suite is about as strong as PGD on the mean model.
  assert float(jnp.mean(result.success)) >= float(jnp.mean(pgd.success)) - 0.1
  assert result.info["robust_after"].shape == (2, 32)


@pytest.mark.parametrize("kwargs, match", [
    ({"version": "fast"}, "version"),
    ({"norm": "l3"}, "norm"),
    ({"n_target_classes": 0}, "n_target_classes"),
    ({"steps": 0}, "steps"),
    ({"queries": 0}, "queries"),
])
def test_bad_options(kwargs, match):
  with pytest.raises(ValueError, match=match):
    jr.attacks.auto_attack(**kwargs)


def test_too_few_classes_for_dlr(masked_problem):
  w, x, _, _ = masked_problem
  three = lambda v: v.reshape(v.shape[0], -1) @ w[:, :3]
  y = jnp.argmax(three(x), axis=1).astype(jnp.int32)
  with pytest.raises(ValueError, match="targeted DLR"):
    jr.run(jr.attacks.auto_attack("linf"), three, x, y, jr.Budget(0.1), jax.random.key(0))
