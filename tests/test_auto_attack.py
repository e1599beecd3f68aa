"""AutoAttack suites: reliability flags on masked models, errors.

Closed-form ground truth (never a success below the exact minimal distance d*, at least 99 of 100
points at 1.02 d*, with the defaults, in every norm; the per-member breakdown ``robust_after``
consistent with the verdicts) is :mod:`tests.test_ground_truth`'s, which runs AutoAttack beside
every other fixed-budget attack. The clean pass's flags (zero gradients, probability outputs),
which every attack's result carries from the same engine code, are held at every front door by
:mod:`tests.test_honest_scores` on saturated and softmax models; here AutoAttack's own flags
(randomized, Square beating the white-box members, too few classes) and masked models.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import jaxrobust as jr
from jaxrobust.engine import scoring
from tests.models import Linear

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

SHAPE = (4, 4, 1)  # an NHWC image, so Square applies
DIM = 16
CLASSES = 10


def _flags(model, w, x, y, eps, norm="linf"):
  """AutoAttack's flags for ``model(w, x)``, the weights and the data passed as arguments."""
  attack = jr.attacks.auto_attack(norm, steps=10, queries=300)
  result = jax.jit(lambda w, x, y, eps, key: jr.run(attack, functools.partial(model, w), x, y,
                                                    jr.Budget(eps), key, chunk_size=16))(
      w, x, y, jnp.float32(eps), jax.random.key(1))
  return {k: bool(v) for k, v in result.info["flags"].items()}, result


def _linear(w, v):
  return v.reshape(v.shape[0], -1) @ w


@pytest.fixture(scope="module")
def masked_problem():
  rng = np.random.default_rng(3)
  w = jnp.asarray(rng.normal(size=(DIM, CLASSES)), jnp.float32)
  x = jnp.asarray(rng.uniform(0.3, 0.7, size=(32,) + SHAPE), jnp.float32)
  y = jnp.argmax(_linear(w, x), axis=1).astype(jnp.int32)
  return w, x, y


def test_no_flags_on_a_plain_model(masked_problem):
  w, x, y = masked_problem
  flags, _ = _flags(_linear, w, x, y, 0.1)
  assert not any(flags.values()), flags


@pytest.mark.parametrize("kind, norm", [("rounded", "linf"), ("stop_gradient", "linf"),
                                        ("stop_gradient", "l1")])
def test_gradient_masking_is_flagged_and_square_exposes_it(masked_problem, kind, norm):
  """On NHWC images and on flat features ``[B, D]`` (where Square, and so AutoAttack, used to
  raise "square needs images"); in L1 too, whose standard version now ends with Square L1 as
  the reference's does."""
  w, x, y = masked_problem
  if kind == "rounded":
    x = x.reshape(x.shape[0], -1)  # tabular features: Square's windows are runs of features
    masked = lambda w, v: _linear(w, jnp.round(v * 8) / 8)
  else:
    masked = lambda w, v: _linear(w, jax.lax.stop_gradient(v))
  y = jnp.argmax(masked(w, x), axis=1).astype(jnp.int32)
  flags, result = _flags(masked, w, x, y, {"linf": 0.1, "l1": 1.0}[norm], norm)
  assert flags["zero_gradients"]
  assert flags["square_beats_white_box"]
  after = np.asarray(result.info["robust_after"]).mean(axis=1)
  assert after[3] < after[2]  # Square lowered robust accuracy below the white-box members'
  assert result.info["counts"]["square_only_points"] > 0


def test_float64_sequences_under_x64(masked_problem):
  """float64 inputs of shape [B, T, C] (AutoAttack used to fail on both: a float32 loss in
  APGD's float64 carry, and Square refusing non-images). The model is float64 too, so the
  closed-form distance is exact for it: nothing below 0.97 d*, everything at 1.5 d*."""
  w, x, _ = masked_problem
  model = Linear(np.asarray(w, np.float64), np.zeros(CLASSES))
  flat = np.asarray(x, np.float64).reshape(len(x), -1)
  y = np.argmax(flat @ model.w, axis=1).astype(np.int32)
  d = model.min_distance(flat, y, "l2")
  scale = np.where(np.arange(len(x)) % 2 == 0, 0.97, 1.5)
  with jax.enable_x64(True):
    attack = jr.attacks.auto_attack("l2", n_target_classes=3, steps=10, queries=100)
    result = jax.jit(lambda w, x, y, eps, key: jr.run(
        attack, functools.partial(_linear, w), x, y, jr.Budget(eps), key, chunk_size=16))(
        jnp.asarray(model.w), jnp.asarray(flat.reshape(len(x), 8, 2)), jnp.asarray(y),
        jnp.asarray(scale * d), jax.random.key(0))
    assert result.x_adv.dtype == jnp.float64 and result.x_adv.shape == (len(x), 8, 2)
    x_adv, success = np.asarray(result.x_adv).reshape(len(x), -1), np.asarray(result.success)
  assert np.all(np.linalg.norm(x_adv - flat, axis=1) <= scale * d * (1 + 1e-12))
  np.testing.assert_array_equal(success, np.argmax(x_adv @ model.w, axis=1) != y)
  assert not success[scale < 1].any() and success[scale > 1].all()


def _clean_info(logits_fn, x, y, active=None):
  """The clean pass's flags and counts (``engine.scoring.clean_checks``), which every attack's
  result carries, AutoAttack's included."""
  keys = jax.random.split(jax.random.key(0), x.shape[0])
  correct, findings = scoring.clean_diagnosis(0, logits_fn, x, y, keys)
  flags, counts = scoring.clean_checks(correct, findings, active)
  return {"flags": flags, "counts": counts}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_probability_outputs_flagged_in_every_float_dtype(dtype):
  """Softmax outputs rounded to bfloat16 or float16 sum to 1 only within their precision (the
  flag used to require 1e-5 and missed them); logits of that dtype are not flagged."""
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.uniform(0, 1, size=(64, 8)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(8, 100)) * 3, jnp.float32)
  y = jnp.zeros(64, jnp.int32)
  verdicts = []
  for outputs in (lambda v: jax.nn.softmax(v @ w).astype(dtype),  # rounded after a softmax
                  lambda v: jax.nn.softmax((v @ w).astype(dtype)),  # computed in dtype
                  lambda v: (v @ w).astype(dtype)):  # logits
    info = jax.jit(lambda x: _clean_info(outputs, x, y))(x)
    verdicts.append(bool(info["flags"]["probability_outputs"]))
  assert verdicts == [True, True, False]


def test_non_finite_logits_count_real_rows_only():
  """A padded batch (padding marked by ``active``) whose padding rows have NaN logits: only the
  real rows count. A real row with NaN logits counts although it is not clean-correct (so never
  attacked): counting attacked rows would never count anything."""
  rng = np.random.default_rng(6)
  w = jnp.asarray(rng.normal(size=(8, 10)), jnp.float32)
  x = jnp.asarray(rng.uniform(0.2, 0.8, size=(8, 8)), jnp.float32)
  x = x.at[jnp.array([2, 6, 7]), 0].set(0.95)  # real row 2 and padding rows 6, 7: NaN logits
  logits_fn = lambda v: jnp.where(v[:, :1] > 0.9, jnp.nan, v @ w)
  y = jnp.argmax(x @ w, axis=1).astype(jnp.int32)
  active = jnp.arange(8) < 6

  @jax.jit
  def counts(x, active):
    info = _clean_info(logits_fn, x, y, active)
    return info["counts"]["non_finite_logits"], info["flags"]["non_finite_logits"]

  count, flag = counts(x, active)
  assert int(count) == 1 and bool(flag)
  count, flag = counts(x, jnp.ones(8, bool))  # no padding: every row is real
  assert int(count) == 3 and bool(flag)
  count, flag = counts(x.at[2, 0].set(0.5), active)  # only the padding is non-finite
  assert int(count) == 0 and not bool(flag)


def test_noisy_outputs_flagged(masked_problem):
  w, x, y = masked_problem
  rng = np.random.default_rng(0)

  def noisy(w, v):
    shape = jax.ShapeDtypeStruct((v.shape[0], CLASSES), jnp.float32)
    noise = io_callback(lambda: rng.normal(size=shape.shape).astype(np.float32), shape)
    return _linear(w, v) + 0.01 * noise

  flags, _ = _flags(noisy, w, x, y, 0.05)
  assert flags["randomized"]


def test_too_few_classes_for_targets_runs_with_fewer(masked_problem):
  w, x, _ = masked_problem
  w = w[:, :5]
  y = jnp.argmax(_linear(w, x), axis=1).astype(jnp.int32)
  flags, result = _flags(_linear, w, x, y, 0.1)
  assert flags["too_few_classes_for_targets"]
  assert result.success.shape == (32,)


def test_rand_version_on_randomized_model(masked_problem):
  w, x, y = masked_problem

  def noisy(w, v, keys):
    noise = jax.vmap(lambda k: jax.random.normal(k, v.shape[1:]))(keys)
    return _linear(w, v + 0.01 * noise)

  attack = jr.attacks.auto_attack("linf", "rand", steps=5, samples=4)
  key = jax.random.key(0)
  result = jax.jit(lambda w, x, y, key: jr.run(attack, functools.partial(noisy, w), x, y,
                                               jr.Budget(0.1), key))(w, x, y, key)
  pgd = jax.jit(lambda w, x, y, key: jr.run(jr.attacks.pgd(steps=10), functools.partial(_linear, w),
                                            x, y, jr.Budget(0.1), key))(w, x, y, key)
  # Noise of 0.01 barely changes the model: the suite is about as strong as PGD on the mean model.
  assert float(jnp.mean(result.success)) >= float(jnp.mean(pgd.success)) - 0.1
  assert result.info["robust_after"].shape == (2, 32)


@pytest.mark.parametrize("kwargs, match", [
    ({"version": "quick"}, "version"),  # "fast" is a version since issue #16
    ({"norm": "l3"}, "norm"),
    ({"n_target_classes": 0}, "n_target_classes"),
    ({"steps": 0}, "steps"),
    ({"queries": 0}, "queries"),
])
def test_bad_options(kwargs, match):
  with pytest.raises(ValueError, match=match):
    jr.attacks.auto_attack(**kwargs)


def test_too_few_classes_for_dlr(masked_problem):
  w, x, _ = masked_problem
  three = lambda v: v.reshape(v.shape[0], -1) @ w[:, :3]
  y = jnp.argmax(three(x), axis=1).astype(jnp.int32)
  with pytest.raises(ValueError, match="targeted DLR"):
    jr.run(jr.attacks.auto_attack("linf"), three, x, y, jr.Budget(0.1), jax.random.key(0))
