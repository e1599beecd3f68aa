"""Attacks on linear models, where the minimal adversarial distance is known in closed form.

For logits ``z = x @ w + b`` the smallest perturbation that makes class ``j`` beat ``y`` has size
``(z_y - z_j) / ||w_y - w_j||_q`` in the Lp norm (q the dual norm); the box only makes it larger.
So no fixed-budget attack may succeed below it: checked here on ten classes, untargeted (the
nearest class is any of nine). Success just above it on two classes, where the steepest-ascent
step is exactly optimal, is checked for every attack, norm and input shape at 1.02 d* by
tests/test_ground_truth.py. The rest: targeted semantics, the best iterate, restarts,
misclassified points, non-finite logits.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from tests.models import Linear, linear_points, random_linear

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

DIM = 16
N = 48


@functools.lru_cache(maxsize=None)
def _jitted(attack_name: str, norm: str):
  attack = {
      "fgsm": lambda: jr.attacks.fgsm(norm),
      "pgd": lambda: jr.attacks.pgd(norm, steps=20, loss="ce"),
  }[attack_name]()

  @jax.jit
  def run(w, b, x, y, eps, key):
    model = Linear(w, b)
    return jr.run(attack, model.logits_fn, x, y, jr.Budget(eps), key)

  return run


@pytest.mark.parametrize("norm", ["linf", "l2", "l1"])
@pytest.mark.parametrize("attack_name", ["fgsm", "pgd"])
def test_no_success_below_the_minimal_distance(attack_name, norm):
  model = random_linear(0, DIM, 10)
  x, y, d = linear_points(model, 1, N, (DIM,), norm)
  assert np.all(d > 0)
  run = _jitted(attack_name, norm)
  result = run(model.w, model.b, jnp.asarray(x), jnp.asarray(y), jnp.asarray(0.97 * d, jnp.float32),
               jax.random.key(0))
  assert not np.asarray(result.success).any()


def test_targeted_success_means_argmax_equals_target():
  model = random_linear(4, DIM, 10)
  model = Linear(model.w, -0.5 * model.w.sum(0))
  x, y, _ = linear_points(model, 5, N, (DIM,), "linf")
  target = ((y + 3) % 10).astype(np.int32)
  attack = jr.attacks.pgd("linf", steps=20, targeted=True, loss="margin")
  result = jr.run(attack, model.logits_fn, jnp.asarray(x), jnp.asarray(y), jr.Budget(0.25),
                  jax.random.key(0), target=jnp.asarray(target))
  pred = np.asarray(jr.predict(result.logits))
  np.testing.assert_array_equal(np.asarray(result.success), pred == target)
  assert np.asarray(result.success).mean() > 0.5


def test_best_point_is_returned_not_the_last_iterate():
  """The loss keeps rising to the right but class 1 wins only in a narrow band on the way."""

  def logits_fn(x):
    u = x[:, 0]
    return jnp.stack([jnp.zeros_like(u), 1 - 400 * (u - 0.55) ** 2, u - 100.0], axis=1)

  loss = lambda logits, labels: logits[:, 2]
  attack = jr.attacks.pgd("linf", steps=6, step_size=0.25, random_start=False, loss=loss)
  x, y = jnp.array([[0.5]]), jnp.array([0])
  result = jr.run(attack, logits_fn, x, y, jr.Budget(0.2), jax.random.key(0))
  assert bool(result.success[0])
  np.testing.assert_allclose(np.asarray(result.x_adv), [[0.55]], atol=1e-6)


def test_more_restarts_never_lose_a_success():
  model = random_linear(6, DIM, 10)
  x, y, d = linear_points(model, 7, N, (DIM,), "l2")
  eps = jnp.asarray(1.1 * d, jnp.float32)
  one = jr.run(jr.attacks.pgd("l2", steps=3, restarts=1), model.logits_fn, jnp.asarray(x),
               jnp.asarray(y), jr.Budget(eps), jax.random.key(1))
  three = jr.run(jr.attacks.pgd("l2", steps=3, restarts=3), model.logits_fn, jnp.asarray(x),
                 jnp.asarray(y), jr.Budget(eps), jax.random.key(1))
  s1, s3 = np.asarray(one.success), np.asarray(three.success)
  assert np.all(s3 >= s1)


def test_already_misclassified_points_are_returned_unchanged():
  model = random_linear(8, DIM, 10)
  x, y, _ = linear_points(model, 9, N, (DIM,), "linf")
  wrong = (y + 1) % 10
  result = jr.run(jr.attacks.pgd("linf", steps=5), model.logits_fn, jnp.asarray(x),
                  jnp.asarray(wrong.astype(np.int32)), jr.Budget(0.1), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(result.x_adv), x)
  assert np.asarray(result.success).all()
  np.testing.assert_array_equal(np.asarray(result.norm), 0.0)


def test_non_finite_logits_are_never_correct():
  def logits_fn(x):
    z = jnp.stack([x[:, 0], -x[:, 0]], axis=1)
    return jnp.where(x[:, 1:2] > 0.5, jnp.nan, z)

  x = jnp.array([[0.9, 0.9], [0.9, 0.1]])
  y = jnp.array([0, 0])
  result = jr.run(jr.attacks.fgsm(), logits_fn, x, y, jr.Budget(0.01), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(result.success), [True, False])
