"""Certificates: randomized smoothing against closed forms and SciPy, bound-propagation radii
against exact linear distances and attacks, certified curves, and the bracket with empirical ones.

Smoothing of a linear binary classifier has a closed form (Cohen et al., 2019): the smoothed
classifier is the linear one, the top class has probability ``p_A = Φ(d / σ)`` with ``d`` the L2
distance to the boundary, and the count of CERTIFY's estimation draws is ``Bin(n, p_A)``. So the
certified radius must lie between ``R(k_lo)`` and ``R(k_hi)``, the radii of the 1e-7 and 1 - 1e-7
quantiles of that binomial, ``R(k) = σ Φ⁻¹(CP_lower(k, n, α))``, computed here with SciPy.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from scipy import stats

import jaxrobust as jr
from jaxrobust.certify import _smoothing
from tests.ground_truth import linear_problem
from tests.models import Linear

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

SIGMA = 0.25
N_DRAWS = 100_000  # Cohen et al.'s default, for the closed-form test
SMALL_N = 3_000  # the invariance tests: any n shows them, and draws cost CPU
ALPHA = 0.001
W = np.array([[0.8, -0.8], [-0.6, 0.6], [0.0, 0.0]], np.float32)  # class 0 iff 0.8 x0 > 0.6 x1


def affine(w, v):
  return v @ w


linear = functools.partial(affine, jnp.asarray(W))  # eager uses; jitted tests pass W as an argument


def cp_lower(k, n, alpha):
  k = np.asarray(k)
  return np.where(k == 0, 0.0, stats.beta.ppf(alpha, np.maximum(k, 1), n - k + 1))


def radius_of_count(k, n, sigma, alpha):
  p = cp_lower(k, n, alpha)
  return np.where(p > 0.5, sigma * stats.norm.ppf(np.maximum(p, 0.5)), 0.0)


@pytest.fixture(scope="module")
def points():
  """Inputs at L2 distances 0.01 ... 1.5 from the boundary of ``linear`` (both sides)."""
  rng = np.random.default_rng(0)
  normal = np.array([1.6, -1.2, 0.0]) / 2.0  # w_0 - w_1 = (1.6, -1.2, 0), norm 2
  distance = np.concatenate([np.linspace(0.01, 1.5, 24), np.linspace(0.01, 1.5, 24)])
  side = np.repeat([1.0, -1.0], 24)
  base = rng.uniform(0.3, 0.7, size=(48, 3))
  base -= np.outer(base @ normal, normal)  # onto the boundary (through the origin)
  x = (base + (side * distance)[:, None] * normal[None, :]).astype(np.float32)
  y = np.where(side > 0, 0, 1).astype(np.int32)
  keys = jax.random.split(jax.random.key(7), len(x))
  return x, y, distance, keys


@functools.lru_cache(maxsize=None)
def certify_fn(batch_size, n=N_DRAWS):
  """CERTIFY of ``affine(w, .)`` as ``(x, keys, sigma) -> certificate``; ``W``, the data, the keys
  and sigma are the jitted program's arguments."""
  run = jax.jit(lambda w, x, keys, sigma: jr.certify.smoothing(
      functools.partial(affine, w), x, keys, sigma=sigma, n=n, alpha=ALPHA,
      batch_size=batch_size))
  return lambda x, keys, sigma: run(W, x, keys, jnp.float32(sigma))


@pytest.fixture(scope="module")
def small_certificate(points):
  x, _, _, keys = points
  return certify_fn(1_000, SMALL_N)(x, keys, SIGMA)


@pytest.fixture(scope="module")
def certificate(points):
  x, _, _, keys = points
  return certify_fn(2_000)(x, keys, SIGMA)


def test_smoothing_matches_the_closed_form_of_a_linear_classifier(points, certificate):
  _, y, distance, _ = points
  radius = np.asarray(certificate.radius)
  prediction = np.asarray(certificate.prediction)
  p_a = stats.norm.cdf(distance / SIGMA)
  k_lo = stats.binom.ppf(1e-7, N_DRAWS, p_a)
  k_hi = stats.binom.ppf(1 - 1e-7, N_DRAWS, p_a)
  lo = radius_of_count(k_lo, N_DRAWS, SIGMA, ALPHA) - 1e-4
  hi = radius_of_count(k_hi, N_DRAWS, SIGMA, ALPHA) + 1e-4
  # Near the boundary the n0 = 100 selection draws may pick the other class: then it abstains.
  may_select_wrong = stats.binom.cdf(50, 100, p_a) > 1e-7
  lo = np.where(may_select_wrong, 0.0, lo)
  assert np.all((lo <= radius) & (radius <= hi)), np.c_[distance, lo, radius, hi]
  assert np.all(radius <= distance)  # sound: never beyond the true distance
  mid = (distance >= 0.2) & (distance <= 0.8)  # p_A in [0.79, 0.9993]: within a few percent
  assert np.all(radius[mid] >= 0.95 * distance[mid]), np.c_[distance, radius][mid]
  certified = prediction >= 0
  assert np.all(prediction[certified] == y[certified])
  assert np.all(radius[~certified] == 0) and np.all(radius[certified] > 0)
  # Near the boundary p_A is close to 1/2: abstain; far away every point is certified.
  assert not certified[distance < 0.005].any() and certified[distance > 0.1].all()


def test_certify_from_counts_and_the_binomial_test_match_scipy():
  k = np.array([0, 1, 500, 501, 520, 900, 999, 1000])
  c = jax.jit(_smoothing.certify_from_counts, static_argnums=2)(
      jnp.full(8, 3), jnp.asarray(k), 1000, 0.5, 0.01)
  want = radius_of_count(k, 1000, 0.5, 0.01)
  np.testing.assert_allclose(c.radius, want, rtol=2e-4, atol=1e-6)
  np.testing.assert_array_equal(c.prediction, np.where(want > 0, 3, -1))
  # PREDICT's test decides exactly as SciPy's two-sided binomial test, also right at the level
  # (every m from 1 to 60, every split, and splits of 10^3 and 10^5 trials around the critical one).
  n_a, n_b = [], []
  for m in range(1, 61):
    n_a += list(range((m + 1) // 2, m + 1))
    n_b += [m - a for a in range((m + 1) // 2, m + 1)]
  for m, critical in ((1000, 553), (100_000, 50_521)):
    n_a += list(range(critical - 3, critical + 4))
    n_b += [m - a for a in range(critical - 3, critical + 4)]
  n_a, n_b = np.array(n_a), np.array(n_b)
  got = jax.jit(_smoothing.significant)(jnp.asarray(n_a), jnp.asarray(n_b), 0.001)
  want = [a > b and stats.binomtest(int(a), int(a + b), 0.5).pvalue <= 0.001
          for a, b in zip(n_a, n_b)]
  np.testing.assert_array_equal(got, want)


def test_smoothing_is_independent_of_batch_order_and_chunk_size(points, small_certificate):
  x, _, _, keys = points
  certificate = small_certificate
  order = np.random.default_rng(1).permutation(len(x))
  shuffled = certify_fn(1_000, SMALL_N)(x[order], keys[order], SIGMA)
  np.testing.assert_array_equal(shuffled.prediction, np.asarray(certificate.prediction)[order])
  np.testing.assert_array_equal(shuffled.radius, np.asarray(certificate.radius)[order])
  chunked = certify_fn(777, SMALL_N)(x, keys, SIGMA)  # 4 chunks, the last one masked
  np.testing.assert_array_equal(chunked.radius, certificate.radius)


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
def test_smoothing_sharded_equals_one_device_without_collectives(points, small_certificate,
                                                                 axis_type):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  x, _, _, keys = points
  mesh = jax.make_mesh((8,), ("batch",), axis_types=(axis_type,))
  sharding = NamedSharding(mesh, P("batch"))
  xs, ks = jax.device_put(x, sharding), jax.device_put(keys, sharding)
  sampling = jax.jit(lambda w, x, keys, sigma: _smoothing.class_counts(
      functools.partial(affine, w), x, keys, sigma, 500, 128))
  sigma = jnp.float32(SIGMA)
  with jax.set_mesh(mesh):
    sharded = certify_fn(1_000, SMALL_N)(xs, ks, SIGMA)
    hlo = sampling.lower(W, xs, ks, sigma).compile().as_text()
    counts = sampling(W, xs, ks, sigma)
  np.testing.assert_array_equal(sharded.radius, small_certificate.radius)
  np.testing.assert_array_equal(sharded.prediction, small_certificate.prediction)
  np.testing.assert_array_equal(counts, sampling(W, x, keys, sigma))
  assert counts.sharding.spec[0] == "batch" or axis_type == AxisType.Auto
  # The sampling loop is per example: no device talks to another while drawing.
  for collective in ("all-reduce", "all-gather", "all-to-all", "collective-permute"):
    assert collective not in hlo, collective


def test_smoothed_predict_and_bad_options(points):
  x, y, distance, keys = points
  predict = jax.jit(lambda w, x, keys, sigma: jr.certify.smoothed_predict(
      functools.partial(affine, w), x, keys, sigma=sigma, n=2_000))(W, x, keys, jnp.float32(SIGMA))
  predict = np.asarray(predict)
  assert np.all(predict[distance > 0.3] == y[distance > 0.3])  # p_A > 0.88: never abstains
  assert np.all((predict == y) | (predict == -1))  # never the wrong class here
  assert np.all(predict[distance < 0.005] == -1)
  nan_model = lambda v: jnp.full((v.shape[0], 2), jnp.nan)
  dead = jax.jit(lambda x, keys, sigma: jr.certify.smoothing(  # one program, not op by op
      nan_model, x, keys, sigma=sigma, n0=10, n=50))(x[:2], keys[:2], jnp.float32(SIGMA))
  assert dead.prediction.tolist() == [-1, -1] and dead.radius.tolist() == [0.0, 0.0]
  for bad, match in [({"sigma": 0.0}, "sigma"), ({"sigma": 0.1, "alpha": 1.0}, "alpha"),
                     ({"sigma": 0.1, "n0": 0}, "n0"),
                     # 0.001^(1/9) = 0.464 <= 1/2: nothing can be certified (n = 10 can).
                     ({"sigma": 0.1, "n": 9}, r"n = 9 draws cannot certify anything at alpha = "
                      r"0.001.*alpha\^\(1/n\) = 0.464 <= 1/2.*n > log2\(1/alpha\) = 9.97"),
                     ({"sigma": 0.1, "n": 3, "alpha": 0.125}, r"n = 3 draws cannot")]:
    with pytest.raises(ValueError, match=match):
      jr.certify.smoothing(linear, x[:2], keys[:2], **bad)
  # PREDICT: 2 * 2^-10 = 0.00195 > 0.001 always abstains; n = 11 (p = 0.00098) can predict.
  with pytest.raises(ValueError, match=r"n = 10 draws cannot predict anything at alpha = 0.001"
                     r".*2 \* 2\^-n = 0.00195 > alpha.*n >= log2\(2/alpha\) = 10.97"):
    jr.certify.smoothed_predict(linear, x[:2], keys[:2], sigma=0.1, n=10)
  one_class = lambda v: jnp.concatenate([jnp.ones_like(v[:, :1]), jnp.zeros_like(v[:, :1])], 1)
  sure = jax.jit(lambda x, keys: jr.certify.smoothed_predict(one_class, x, keys, sigma=0.1,
                                                             n=11))(x[:2], keys[:2])
  assert sure.tolist() == [0, 0]
  for sigma in (0.0, -0.5):  # the deterministic model (or worse): eot refuses it, so must this
    with pytest.raises(ValueError, match="sigma"):
      jr.certify.gaussian_noise(linear, sigma)
  # Inputs the noise cannot smooth, or logits with nothing to choose: refused, never certified
  # (an int32 x truncated the noise to integers and certified radius 0.375 where the float input
  # gives 0.34; NaN inputs abstained silently; one class "certified" class 0).
  for certify in (functools.partial(jr.certify.smoothing, n0=10, n=50),
                  functools.partial(jr.certify.smoothed_predict, n=50)):
    with pytest.raises(TypeError, match="float array"):
      certify(linear, jnp.array([[1, 0], [0, 1]]), keys[:2], sigma=0.25)
    with pytest.raises(ValueError, match="NaN/Inf"):
      certify(linear, jnp.asarray(x[:2]).at[0, 0].set(jnp.nan), keys[:2], sigma=0.25)
    with pytest.raises(ValueError, match="non-empty batch"):
      certify(linear, x[:0], keys[:0], sigma=0.25)
    with pytest.raises(ValueError, match="1 class"):
      certify(lambda v: v[:, :1], x[:2], keys[:2], sigma=0.25)


@pytest.fixture(scope="module")
def linear_problem_linf():
  return linear_problem(shape=(12,), classes=4, norm="linf", n=24, seed=5)


def test_bound_radius_is_the_exact_linf_distance_on_linear_models(linear_problem_linf):
  p = linear_problem_linf
  x, y = jnp.asarray(p.x), jnp.asarray(p.y)
  budget = jr.Budget(0.5, p.lower, p.upper)
  methods = ("ibp", "crown-ibp", "crown")
  *bounds, in_l2 = jax.jit(lambda w, b, x, y, budget: [  # the three methods and L2: one program
      jr.certify.certify_bounds(Linear(w, b).logits_fn, x, y, budget, method=method)
      for method in methods] + [jr.certify.certify_bounds(Linear(w, b).logits_fn, x, y, budget,
                                                          norm="l2")])(
      p.model.w, p.model.b, x, y, jax.tree.map(jnp.float32, budget))
  for method, c in zip(methods, bounds):
    np.testing.assert_array_equal(c.prediction, p.y)
    radius = np.asarray(c.radius, np.float64)
    assert np.all(radius <= p.distance * (1 + 1e-5)), method  # sound
    np.testing.assert_allclose(radius, p.distance, rtol=2e-4, atol=1e-4 * 0.5)  # and exact
  # L2: the ball is enclosed in its Linf box: sound, and exactly the Linf distance here.
  l2 = p.model.min_distance(p.x, p.y, "l2")
  assert np.all(np.asarray(in_l2.radius) <= l2 * (1 + 1e-5))
  np.testing.assert_allclose(in_l2.radius, p.distance, rtol=2e-4, atol=1e-4)


def tiny_mlp_params(seed):
  """The weights ``(w1, w2)`` of :func:`tiny_mlp`."""
  rng = np.random.default_rng(seed)
  w1 = jnp.asarray(rng.normal(size=(10, 16)) / 3, jnp.float32)
  w2 = jnp.asarray(rng.normal(size=(16, 3)) / 4, jnp.float32)
  return w1, w2


def tiny_mlp(params, v):
  w1, w2 = params
  return jax.nn.relu(v @ w1) @ w2


def test_bound_radius_is_never_beaten_by_an_attack_and_crown_is_tighter():
  params = tiny_mlp_params(0)
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.uniform(0.3, 0.7, size=(32, 10)), jnp.float32)
  y = jr.predict(tiny_mlp(params, x))
  y = y.at[:3].set((y[:3] + 1) % 3)  # three misclassified points
  run = jax.jit(lambda params, x, y, eps: [
      jr.certify.certify_bounds(functools.partial(tiny_mlp, params), x, y, jr.Budget(eps),
                                method=method)
      for method in ("ibp", "crown-ibp", "crown")])
  ibp, crown_ibp, crown = run(params, x, y, jnp.float32(0.3))
  assert np.all(np.asarray(ibp.radius)[:3] == 0) and np.all(np.asarray(crown.radius)[:3] == 0)
  assert np.all(crown.radius >= ibp.radius - 1e-4 * 0.3)
  # CROWN-IBP's margin bounds are at least IBP's at every eps, so its bisection never ends lower.
  assert np.all(crown_ibp.radius >= ibp.radius - 1e-4 * 0.3)
  assert np.sum(crown_ibp.radius > ibp.radius + 1e-3) >= 5
  assert np.sum(crown.radius > ibp.radius + 1e-3) >= 5  # strictly tighter on several points
  # No attack finds an adversarial point inside a certified radius (PGD at exactly that radius).
  attack = jr.attacks.pgd("linf", steps=50, restarts=2)
  certified = np.asarray(crown.radius) > 0
  result = jax.jit(lambda params, x, y, eps, key: jr.run(
      attack, functools.partial(tiny_mlp, params), x, y, jr.Budget(eps), key))(
          params, x[certified], y[certified], crown.radius[certified], jax.random.key(0))
  assert not np.asarray(result.success).any()
  # ... while FMN's minimal adversarial norms are never below the certified radius.
  # eps = inf stays a constant: a minimum-norm run with a traced inf compiles to a slower program.
  fmn = jax.jit(lambda params, x, y, key: jr.run(
      jr.attacks.fmn("linf", steps=50), functools.partial(tiny_mlp, params), x, y,
      jr.Budget(jnp.inf), key))(params, x[3:], y[3:], jax.random.key(0))
  found = np.isfinite(np.asarray(fmn.norm))
  assert np.all(np.asarray(fmn.norm)[found] >= np.asarray(crown.radius)[3:][found] - 1e-6)


def test_certified_curve_and_the_bracket_in_a_report(linear_problem_linf):
  c = jr.Certificate(jnp.array([0, 1, -1, 2, 1]), jnp.array([0.5, 0.2, 0.0, 0.9, 0.3]))
  y = jnp.array([0, 1, 1, 0, 1])
  curve = jr.certify.certified_curve(c, y, jnp.array([0.1, 0.3, 0.6]))
  want = (np.array([1, 1, 0, 0, 1], bool)[None, :]
          & (np.array([0.5, 0.2, 0.0, 0.9, 0.3])[None, :] >= np.array([0.1, 0.3, 0.6])[:, None]))
  np.testing.assert_array_equal(curve.robust, want)
  assert float(curve.clean_accuracy) == pytest.approx(0.6)
  np.testing.assert_allclose(curve.robust_accuracy, want.mean(1))
  # The bracket: on a multi-class linear model, bound certificates <= PGD's robust counts.
  p = linear_problem_linf
  epsilons = np.array([0.5, 1.0, 1.5], np.float32) * np.median(p.distance).astype(np.float32)
  report = jr.evaluate(p.model.logits_fn, (p.x, p.y), attacks={"apgd": jr.attacks.apgd(steps=20)},
                       epsilons=epsilons, key=jax.random.key(0), batch_size=24, progress=False,
                       lower=p.lower, upper=p.upper)
  cert = jax.jit(lambda w, b, x, y, budget: jr.certify.certify_bounds(  # one program
      Linear(w, b).logits_fn, x, y, budget))(
      p.model.w, p.model.b, jnp.asarray(p.x), jnp.asarray(p.y),
      jax.tree.map(jnp.float32, jr.Budget(2 * float(epsilons[-1]), p.lower, p.upper)))
  bracketed = report.with_certified("ibp", jr.certify.certified_curve(
      cert, jnp.asarray(p.y), epsilons))
  certified = bracketed.certified["ibp"].robust_count
  truth = np.sum(p.distance[None, :] > epsilons[:, None], axis=1)
  assert np.all(certified <= truth) and np.all(truth <= report.worst_case.robust_count)
  np.testing.assert_array_equal(certified, truth)  # exact on a linear model


def test_certify_bounds_and_certified_curve_refuse_bad_input():
  """What would certify silently (radius 0 for an infinite or NaN top, -1 labels counting
  abstentions as correct) or in the wrong units is refused with the reason."""
  w = jnp.array([[1.0, -1.0], [-1.0, 1.0]])
  f = lambda v: v @ w
  x, y = jnp.array([[0.6, 0.4], [0.3, 0.7]]), jnp.array([0, 1])
  exact = jr.certify.certify_bounds(f, x, y, jr.Budget(0.5))
  np.testing.assert_allclose(exact.radius, [0.1, 0.2], rtol=1e-3)
  for budget, kwargs, match in [
      (jr.Budget(jnp.inf), {}, "eps = inf"), (jr.Budget(jnp.nan), {}, "NaN"),
      (jr.Budget(-0.1), {}, ">= 0"), (jr.Budget(0.5), {"max_eps": jnp.inf}, "eps = inf"),
      (jr.Budget(8.0), {}, "0-255 units"), (jr.Budget(0.5, jnp.nan, 1.0), {}, "finite"),
      (jr.Budget(0.5, 0.5, 1.0), {}, "box")]:
    with pytest.raises(ValueError, match=match):
      jr.certify.certify_bounds(f, x, y, budget, **kwargs)
  with pytest.raises(ValueError, match=r"must lie in \[0, 2\)"):
    jr.certify.certify_bounds(f, x, jnp.array([0, 2]), jr.Budget(0.5))
  with pytest.raises(TypeError, match="float array"):
    jr.certify.certify_bounds(f, jnp.array([[1, 0]]), y[:1], jr.Budget(0.5))
  wide = jr.certify.certify_bounds(f, x, y, jr.Budget(1.0), allow_large_eps=True)
  np.testing.assert_allclose(wide.radius, [0.1, 0.2], rtol=1e-3)
  c = jr.Certificate(jnp.array([0, 1, -1]), jnp.array([0.5, 0.2, 0.0]))
  with pytest.raises(ValueError, match="abstention"):
    jr.certify.certified_curve(c, jnp.array([0, 1, -1]), jnp.array([0.0]))
  with pytest.raises(ValueError, match="Batch sizes differ"):
    jr.certify.certified_curve(c, jnp.array([0, 1]), jnp.array([0.0]))
  with pytest.raises(ValueError, match="1-D int array"):
    jr.certify.certified_curve(c, jnp.array([0.0, 1.0, 1.0]), jnp.array([0.0]))
  with pytest.raises(ValueError, match=r"radii must be a 1-D array \[K\]"):
    jr.certify.certified_curve(c, jnp.array([0, 1, 1]), 0.1)


def test_the_smoothed_classifier_is_attacked_through_gaussian_noise_and_eot(points, certificate):
  """SmoothAdv's empirical side: EOT-PGD on the noisy model breaks the smoothed linear classifier
  0.5 beyond its boundary and not 0.3 before it, where the certificate (below d) also holds."""
  x, y, distance, keys = points
  far = distance >= 0.5
  noisy = jr.certify.gaussian_noise(linear, SIGMA)
  attack = jr.attacks.eot(jr.attacks.pgd("l2", steps=20), samples=32)
  run = jax.jit(lambda w, x, y, eps, keys: jr.run(
      attack, jr.certify.gaussian_noise(functools.partial(affine, w), SIGMA), x, y,
      jr.Budget(eps, -5.0, 5.0), keys))
  beyond = run(W, x[far], y[far], jnp.asarray(distance[far] + 0.5, jnp.float32), keys[far])
  short = run(W, x[far], y[far], jnp.asarray(distance[far] - 0.3, jnp.float32), keys[far])
  assert np.asarray(beyond.success).all() and not np.asarray(short.success).any()
  radius = np.asarray(certificate.radius)[far]
  assert np.all(radius <= distance[far])  # certified <= true: the bracket of the smoothed model
  with pytest.raises(TypeError, match="randomized model"):
    jr.certify.certify_bounds(noisy, jnp.asarray(x), jnp.asarray(y), jr.Budget(0.1))
