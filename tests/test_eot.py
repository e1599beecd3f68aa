"""EOT: exact gradient averaging over draws, majority verdicts, and clear errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust.engine import randomized
from tests.models import linear_logits, linear_points, random_linear

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

W = jnp.array([[1.0, -1.0], [-1.0, 1.0]])


def coin_model(p_wrong: float, w=W):
  """Two classes; each draw independently flips the clean decision with probability p_wrong.

  ``x = [a, 1 - a]`` with ``a > 0.5`` is class 0 on a draw that does not flip. The weights ``w``
  (``W``) may be passed in traced.
  """

  def logits_fn(x, keys):
    flip = jax.vmap(lambda k: jax.random.bernoulli(k, p_wrong))(keys)
    z = x.reshape(x.shape[0], -1) @ w
    return jnp.where(flip[:, None], -z, z)

  return logits_fn


def test_loss_and_gradient_are_the_mean_over_draws():
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(6, 3)), jnp.float32)

  def noisy(w, x, keys):
    noise = jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(keys)
    return jnp.tanh(x + 0.3 * noise) @ w

  x = jnp.asarray(rng.uniform(size=(5, 6)), jnp.float32)
  y = jnp.asarray([0, 1, 2, 0, 1], jnp.int32)
  keys = jax.random.split(jax.random.key(1), 5)
  draws = randomized.draw_keys(keys, 4)
  # Jitted (one compilation each, not one per operation): the library's average, and the
  # independent reference, one draw at a time, per example, averaged by hand.

  @jax.jit
  def average(w, x, y, draws):
    f = randomized.ExpectedLogits(functools.partial(noisy, w), draws)
    return (*f.loss_and_grad(jr.losses.cross_entropy, x, y, None), f(x))

  loss, grad, logits, called = average(w, x, y, draws)

  @jax.jit
  def reference(w, x, y, draws):
    per_draw = [jax.vmap(jax.grad(lambda xi, yi, ki: jr.losses.cross_entropy(
        noisy(w, xi[None], ki[None]), yi[None])[0]))(x, y, draws[s]) for s in range(4)]
    logits = [noisy(w, x, draws[s]) for s in range(4)]
    losses = [jr.losses.cross_entropy(z, y) for z in logits]
    return jnp.stack(per_draw), jnp.stack(logits), jnp.stack(losses)

  per_draw, draw_logits, draw_losses = (np.asarray(a) for a in reference(w, x, y, draws))
  np.testing.assert_allclose(np.asarray(grad), np.mean(per_draw, 0), rtol=1e-5, atol=1e-6)
  ref_logits = np.mean(draw_logits, 0)
  np.testing.assert_allclose(np.asarray(logits), ref_logits, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(called), ref_logits, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(loss), np.mean(draw_losses, 0), rtol=1e-5)


def test_verdicts_are_majorities_not_single_draws():
  """A point wrong on 20% of draws is robust; one wrong on 80% is broken, for every point."""
  x = jnp.tile(jnp.array([[0.9, 0.1]]), (32, 1))
  y = jnp.zeros(32, jnp.int32)
  attack = jr.attacks.eot(jr.attacks.fgsm("linf"), samples=21)
  # One compilation for both models: the flip probability is an argument.
  jitted = jax.jit(lambda p_wrong, w, x, y, eps, key: jr.run(attack, coin_model(p_wrong, w), x,
                                                             y, jr.Budget(eps), key))
  run = lambda p_wrong: jitted(p_wrong, W, x, y, jnp.float32(0.0), jax.random.key(0))
  mostly_right, mostly_wrong = run(0.2), run(0.8)
  # P(Binomial(21, 0.2) >= 11) < 1e-3 per point; the keys are fixed, so this is deterministic.
  assert not bool(jnp.any(mostly_right.success))
  assert bool(jnp.all(mostly_wrong.success))
  # One draw's clean gradient says nothing of the expectation: the clean pass's checks are not
  # reported (a report's checklist says "n/a"), never "passed" unchecked; the returned points'
  # checks are.
  flags = mostly_right.info["flags"]
  assert not {"zero_gradients", "probability_outputs", "non_finite_gradients",
              "non_finite_logits"} & set(flags)
  assert {"non_finite_adversarials", "non_finite_adversarial_logits"} <= set(flags)
  # A single draw would have judged about a fifth of the robust points broken.
  one_draw = jr.predict(coin_model(0.2)(x, jax.random.split(jax.random.key(5), 32)))
  assert int(jnp.sum(one_draw != 0)) > 0


def test_eot_pgd_on_noisy_linear_model():
  model = random_linear(0, 8, 2)
  x, y, dist = linear_points(model, 1, 32, (8,), "linf")
  wb = model.weights()

  def noisy(wb, x, keys):
    noise = jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(keys)
    return linear_logits(wb, x + 0.002 * noise)

  attack = jr.attacks.eot(jr.attacks.pgd("linf", steps=10), samples=8)
  jitted = jax.jit(lambda wb, x, y, eps, key: jr.run(attack, functools.partial(noisy, wb), x, y,
                                                     jr.Budget(eps), key))
  run = lambda eps: jitted(wb, jnp.asarray(x), jnp.asarray(y), eps, jax.random.key(2))
  far = dist > 0.05  # noise of 0.002 cannot decide these points' fate
  below, above = run(jnp.asarray(0.8 * dist, jnp.float32)), run(jnp.asarray(1.2 * dist,
                                                                           jnp.float32))
  assert not bool(jnp.any(below.success[far]))
  assert bool(jnp.all(above.success[far]))


def test_ensemble_of_eot_members_and_same_key_same_result():
  x = jnp.tile(jnp.array([[0.6, 0.4]]), (8, 1))
  y = jnp.zeros(8, jnp.int32)
  attack = jr.attacks.ensemble(jr.attacks.eot(jr.attacks.fgsm("linf"), 5),
                               jr.attacks.eot(jr.attacks.pgd("linf", steps=4), 5))
  assert attack.samples == 5
  jitted = jax.jit(lambda p_wrong, w, x, y, eps, key: jr.run(attack, coin_model(p_wrong, w), x,
                                                             y, jr.Budget(eps), key))
  run = lambda key: jitted(0.1, W, x, y, jnp.float32(0.15), key)
  a, b = run(jax.random.key(3)), run(jax.random.key(3))
  np.testing.assert_array_equal(np.asarray(a.x_adv), np.asarray(b.x_adv))
  assert bool(jnp.all(a.success))  # Linf distance 0.1 < 0.15 on every draw that does not flip


def test_bad_eot_usage():
  with pytest.raises(TypeError):
    jr.attacks.eot("pgd", 4)
  with pytest.raises(ValueError, match="samples"):
    jr.attacks.eot(jr.attacks.pgd(), 0)
  with pytest.raises(ValueError, match="nest"):
    jr.attacks.eot(jr.attacks.eot(jr.attacks.pgd(), 2), 2)
  with pytest.raises(ValueError, match="each member"):
    jr.attacks.eot(jr.attacks.ensemble(jr.attacks.pgd()), 2)


def test_eps_zero_keeps_the_clean_verdict_of_a_randomized_model():
  """A point returned unchanged is judged by its clean vote, not by a second independent vote on
  the same input (which flipped 24% of the points of this very noisy model before): at eps 0
  the robust accuracy is exactly the clean accuracy, and no later eps inherits spurious breaks."""
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(10, 4)), jnp.float32)
  x = rng.uniform(0.3, 0.7, size=(200, 10)).astype(np.float32)
  y = np.asarray(jr.predict(x @ np.asarray(w)))
  attack = jr.attacks.eot(jr.attacks.pgd(steps=3), samples=8)
  curve = jax.jit(lambda w, x, y, eps, key: jr.robustness_curve(
      attack, jr.certify.gaussian_noise(lambda v: v @ w, 1.0), x, y, eps, key))(
          w, x, y, jnp.array([0.0, 0.05]), jax.random.key(0))
  assert float(curve.robust_accuracy[0]) == float(curve.clean_accuracy)
  assert 0.0 < float(curve.robust_accuracy[1]) <= float(curve.robust_accuracy[0])
