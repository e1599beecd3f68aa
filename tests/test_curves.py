"""Robustness curves: shape of the curve, closed-form truth, eps batching and sharding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxrobust as jr
from tests.models import Linear, linear_points, mlp, random_linear

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

DIM = 16
N = 64
EPSILONS = np.array([0.0, 0.02, 0.04, 0.08, 0.16], np.float32)


@pytest.fixture(scope="module")
def linear_problem():
  """A two-class linear model through the centre of the box and points whose Linf distance is
  at least 5% away from every eps of the grid, so PGD's answer is exact."""
  model = random_linear(2, DIM, 2)
  model = Linear(model.w, -0.5 * model.w.sum(0))
  x, y, d = linear_points(model, 11, 8 * N, (DIM,), "linf")
  far = np.all(np.abs(d[:, None] / np.maximum(EPSILONS[None, 1:], 1e-9) - 1) > 0.05, axis=1)
  x, y, d = x[far][:N], y[far][:N], d[far][:N]
  assert len(x) == N
  y = y.copy()
  y[:5] = 1 - y[:5]  # five misclassified points: not robust at any eps
  return model, jnp.asarray(x), jnp.asarray(y), d


@pytest.fixture(scope="module")
def curve_fn(linear_problem):
  model, *_ = linear_problem
  attack = jr.attacks.pgd("linf", steps=20, random_start=False)
  traces = []

  def fn(x, y, eps, key, eps_batch_size=None):
    traces.append(eps_batch_size)
    return jr.robustness_curve(attack, model.logits_fn, x, y, eps, key,
                               eps_batch_size=eps_batch_size)

  return jax.jit(fn, static_argnames="eps_batch_size"), traces


def test_curve_equals_closed_form_truth(linear_problem, curve_fn):
  _, x, y, d = linear_problem
  fn, _ = curve_fn
  curve = fn(x, y, jnp.asarray(EPSILONS), jax.random.key(0))
  correct = np.ones(N, bool)
  correct[:5] = False
  truth = correct[None, :] & (d[None, :] > EPSILONS[:, None])
  np.testing.assert_array_equal(np.asarray(curve.robust), truth)
  np.testing.assert_allclose(np.asarray(curve.robust_accuracy), truth.mean(1), rtol=1e-6)
  np.testing.assert_allclose(float(curve.clean_accuracy), correct.mean(), rtol=1e-6)
  assert float(curve.robust_accuracy[0]) == pytest.approx(float(curve.clean_accuracy))


def test_no_retrace_for_new_eps_values(linear_problem, curve_fn):
  _, x, y, _ = linear_problem
  fn, traces = curve_fn
  fn(x, y, jnp.asarray(EPSILONS), jax.random.key(0))
  before = len(traces)
  fn(x, y, jnp.asarray(EPSILONS * 0.5), jax.random.key(1))
  fn(x, y, jnp.asarray(EPSILONS[::-1].copy()), jax.random.key(2))
  assert len(traces) == before


@pytest.mark.parametrize("eps_batch_size", [0, 2])
def test_eps_batching_gives_the_same_curve(linear_problem, curve_fn, eps_batch_size):
  _, x, y, _ = linear_problem
  fn, _ = curve_fn
  eps = jnp.asarray(EPSILONS)
  sequential = fn(x, y, eps, jax.random.key(0))
  batched = fn(x, y, eps, jax.random.key(0), eps_batch_size=eps_batch_size)
  np.testing.assert_array_equal(np.asarray(sequential.robust), np.asarray(batched.robust))


def test_unsorted_duplicated_eps_match_the_sorted_grid(linear_problem, curve_fn):
  _, x, y, _ = linear_problem
  fn, _ = curve_fn
  order = np.array([3, 0, 4, 1, 2])
  shuffled = fn(x, y, jnp.asarray(EPSILONS[order]), jax.random.key(0))
  sorted_ = fn(x, y, jnp.asarray(EPSILONS), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(shuffled.robust), np.asarray(sorted_.robust)[order])
  assert float(shuffled.auc) == pytest.approx(float(sorted_.auc), rel=1e-6)


@pytest.fixture(scope="module")
def nonlinear_curve():
  """A random-start PGD curve on a nonlinear model with random labels (many misclassified)."""
  logits_fn = mlp(3, DIM, 32, 4)
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.uniform(0, 1, (N, DIM)), jnp.float32)
  y = jnp.asarray(np.argmax(np.asarray(logits_fn(x)), 1), jnp.int32)
  y = y.at[:8].set((y[:8] + 1) % 4)
  eps = jnp.asarray([0.0, 0.01, 0.03, 0.1, 0.05, 0.2], jnp.float32)
  attack = jr.attacks.pgd("linf", steps=5)
  fn = jax.jit(lambda x, y, eps, key: jr.robustness_curve(attack, logits_fn, x, y, eps, key))
  return fn, logits_fn, x, y, eps


def test_curve_is_monotone_and_starts_at_clean_accuracy(nonlinear_curve):
  fn, logits_fn, x, y, eps = nonlinear_curve
  curve = fn(x, y, eps, jax.random.key(0))
  order = np.argsort(np.asarray(eps))
  acc = np.asarray(curve.robust_accuracy)[order]
  robust = np.asarray(curve.robust)[order]
  assert np.all(np.diff(acc) <= 0)
  assert np.all(robust[1:] <= robust[:-1]), "a point robust at a larger eps but not a smaller one"
  clean = np.mean(np.asarray(jr.predict(logits_fn(x))) == np.asarray(y))
  assert float(curve.clean_accuracy) == pytest.approx(clean)
  assert acc[0] == pytest.approx(clean)
  assert acc[-1] < acc[0], "the attack broke nothing"
  expected_auc = jr.metrics.curve_auc(eps, curve.robust_accuracy, curve.clean_accuracy)
  assert float(curve.auc) == pytest.approx(float(expected_auc))


def _mesh(axis_type):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets jax_num_cpu_devices=8)")
  return jax.make_mesh((8,), ("batch",), axis_types=(axis_type,))


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_sharded_curve_equals_one_device(nonlinear_curve, axis_type):
  fn, _, x, y, eps = nonlinear_curve
  single = fn(x, y, eps, jax.random.key(0))
  mesh = _mesh(axis_type)
  with jax.set_mesh(mesh):
    sharding = NamedSharding(mesh, P("batch"))
    xs, ys = jax.device_put(x, sharding), jax.device_put(y, sharding)
    sharded = fn(xs, ys, eps, jax.random.key(0))
    assert len(sharded.robust.sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(sharded.robust), np.asarray(single.robust))
  np.testing.assert_allclose(np.asarray(sharded.robust_accuracy),
                             np.asarray(single.robust_accuracy), rtol=1e-6)


def test_curve_from_norms_equals_brute_force():
  rng = np.random.default_rng(0)
  norms = rng.exponential(0.1, 200).astype(np.float32)
  norms[:10] = np.inf
  norms[10:20] = 0.0
  correct = rng.uniform(size=200) < 0.8
  eps = np.array([0.0, 0.05, 0.1, 0.3, 0.2], np.float32)
  curve = jr.curve_from_norms(jnp.asarray(norms), jnp.asarray(correct), jnp.asarray(eps))
  for k, e in enumerate(eps):
    robust = [bool(c and n > e) for c, n in zip(correct, norms)]
    np.testing.assert_array_equal(np.asarray(curve.robust[k]), robust)
    assert float(curve.robust_accuracy[k]) == pytest.approx(np.mean(robust))
  with pytest.raises(ValueError, match=r"norms \(3,\), correct \(4,\)"):
    jr.curve_from_norms(jnp.asarray(norms[:3]), jnp.asarray(correct[:4]), jnp.asarray(eps))
