"""Bad inputs to the certifiers and to the training helpers are refused with a ValueError that
says what was wrong (the observed values or shapes) and how to fix it, instead of an unsound
certificate, a silent NaN, a raw JAX error or advice to pass an option the function does not
take: a model whose output for an example depends on the other examples of the batch (batch
statistics), a certificate whose radius and prediction differ in length, a smoothing ``sigma``
that is a bool or a string, an ``n`` too small for ``alpha`` at build time, a NaN or infinite
box, a ``robust_counts`` mask of the wrong shape, a budget in 0-255 units given to TRADES or MART.
Good inputs (Python, NumPy and JAX numbers, jitted calls with traced arguments) still give the
numbers they gave before. Value checks run on concrete inputs only (inside ``jax.jit`` the values
are tracers); shape checks always run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust import certify, training
from jaxrobust.certify._linear import check_rows_independent
from jaxrobust.training import _eval

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

W = jnp.array([[1.0, -1.0], [-1.0, 1.0]])
BIAS = jnp.array([0.1, 0.0])
X = jnp.array([[0.6, 0.4], [0.45, 0.55], [0.3, 0.7]])
Y = jnp.array([0, 0, 1])
KEY = jax.random.key(0)
NAN, INF = float("nan"), float("inf")


def affine(w, b):
  """A per-example model: each row's logits depend on that row only."""
  return lambda v: v @ w + b[None]


def centred(w, b):
  """Batch centring, ``(v - mean over the batch) @ w + b``: affine, but it mixes examples."""
  return lambda v: (v - v.mean(0, keepdims=True)) @ w + b[None]


def mlp(w, b):
  return lambda v: jnp.maximum(v @ w + b[None], 0.0) @ w


# ------------------------------------------------------------------------------------------------
# Bound certificates of a model that mixes the examples of a batch.

MIXES = r"output for an example depends on the other examples of the batch"
FIX = r"BatchNorm in training mode.*unsound\. Put the model in eval mode"


def test_certify_bounds_refuses_a_model_that_mixes_examples():
  # The audit's case: radius 0.45 for example 0, which a point at Linf distance 0.4 flips.
  x, y = jnp.array([[0.6, 0.4], [0.3, 0.7]]), jnp.array([0, 1])
  with pytest.raises(ValueError, match=rf"logits_fn's {MIXES}: logits_fn\(x\[:1\]\)\[0, \d\] = "
                                       rf"\S+ but logits_fn\(x\)\[0, \d\] = \S+ .*{FIX}"):
    certify.certify_bounds(centred(W, BIAS), x, y, jr.Budget(0.45))
  # A batch of 1 is compared with itself duplicated: a batch sum shows there.
  summed = lambda v: (v + v.sum(0, keepdims=True)) @ W
  with pytest.raises(ValueError, match=rf"{MIXES}: logits_fn\(x\)\[0, \d\] = \S+ but "
                                       r"logits_fn\(concatenate\(\[x, x\]\)\)\[0, \d\]"):
    certify.certify_bounds(summed, x[:1], y[:1], jr.Budget(0.1))


@pytest.mark.parametrize("method", ["ibp", "crown-ibp", "crown"])
def test_margin_and_linear_bounds_refuse_it_on_the_box_centre(method):
  lower, upper = X - 0.05, X + 0.05
  centre = r" \(checked at the box centre c = \(lower \+ upper\) / 2\): "
  with pytest.raises(ValueError, match=rf"^logits_fn's {MIXES}{centre}logits_fn\(c\[:1\]\)"
                                       rf"\[0, \d\] = \S+ but logits_fn\(c\)\[0, \d\].*{FIX}"):
    certify.margin_bounds(centred(W, BIAS), Y, lower, upper, method=method)
  with pytest.raises(ValueError, match=rf"^fn's {MIXES}{centre}fn\(c\[:1\]\).*{FIX}"):
    certify.linear_bounds(centred(W, BIAS), lower, upper)
  # interval_bounds bounds the batch as a whole, which is sound for such a model: no check.
  lo, hi = certify.interval_bounds(centred(W, BIAS), lower, upper)
  assert bool(jnp.all(lo <= centred(W, BIAS)(X))) and bool(jnp.all(centred(W, BIAS)(X) <= hi))


def test_batchnorm_in_training_mode_is_refused_and_eval_mode_certified():
  nn = pytest.importorskip("flax.linen")

  class Net(nn.Module):
    train: bool

    @nn.compact
    def __call__(self, v):
      v = nn.BatchNorm(use_running_average=not self.train)(nn.Dense(4)(v))
      return nn.Dense(2)(nn.relu(v))

  x = jax.random.uniform(jax.random.key(1), (6, 3))
  y = jnp.array([0, 1, 0, 1, 0, 1])
  variables = Net(True).init(jax.random.key(0), x)
  # The classic slip: batch statistics, their update dropped.
  train = lambda v: Net(True).apply(variables, v, mutable=["batch_stats"])[0]
  with pytest.raises(ValueError, match=rf"{MIXES}.*{FIX}"):
    certify.certify_bounds(train, x, y, jr.Budget(0.1))
  certificate = certify.certify_bounds(lambda v: Net(False).apply(variables, v), x, y,
                                       jr.Budget(0.1))
  assert certificate.radius.shape == (6,)


def test_per_example_models_are_certified_as_before():
  certificate = certify.certify_bounds(affine(W, BIAS), X, Y, jr.Budget(0.5))
  assert certificate.prediction.tolist() == [0, 1, 1]
  np.testing.assert_allclose(certificate.radius, [0.125, 0.0, 0.175], atol=2e-4)
  for method in ("ibp", "crown-ibp", "crown"):
    again = certify.certify_bounds(mlp(W, BIAS), X, Y, jr.Budget(0.5), method=method)
    np.testing.assert_array_equal(again.radius, certificate.radius)
  one = certify.certify_bounds(mlp(W, BIAS), X[:1], Y[:1], jr.Budget(0.5))  # duplicated: same
  np.testing.assert_array_equal(one.radius, certificate.radius[:1])
  lower, upper = X - 0.05, X + 0.05
  np.testing.assert_allclose(certify.margin_bounds(mlp(W, BIAS), Y, lower, upper, method="crown"),
                             [[INF, 0.4], [INF, -0.4], [0.6, INF]], atol=1e-6)
  lo, hi = certify.linear_bounds(mlp(W, BIAS), lower, upper)
  np.testing.assert_allclose(lo, [[0.2, -0.4], [-0.2, -0.1], [-0.5, 0.3]], atol=1e-6)
  np.testing.assert_allclose(hi, [[0.4, -0.2], [0.1, 0.2], [-0.3, 0.5]], atol=1e-6)


def test_the_check_tolerates_float_noise_and_equal_non_finite_outputs():
  x = jnp.array([[0.5, 2.0], [0.0, 1.0], [3.0, 4.0]])
  check_rows_independent(lambda v: jnp.log(v - 0.5) @ W, x[1:])  # NaN in the first row, twice
  check_rows_independent(lambda v: jnp.log(v) @ W, x[1:])  # -inf and inf, twice
  check_rows_independent(lambda v: v @ W + 1e-6 * v.mean(), x)  # far below 1e-3 * (1 + 1.5)
  with pytest.raises(ValueError, match=rf"{MIXES}.*2 of 2 outputs of the first example differ by "
                                       r"more than 0\.001 \* \(1 \+ their largest magnitude\)"):
    check_rows_independent(lambda v: v @ W + 0.1 * v.mean(), x)


def test_the_check_does_not_run_on_traced_inputs():
  # Inside jax.jit the values are tracers: the check is skipped (documented), and a per-example
  # model gives the eager radii.
  x, y = jnp.array([[0.6, 0.4], [0.3, 0.7]]), jnp.array([0, 1])
  run = jax.jit(lambda w, b, x, y: certify.certify_bounds(centred(w, b), x, y, jr.Budget(0.45)))
  assert run(W, BIAS, x, y).radius.shape == (2,)
  run = jax.jit(lambda w, b, x, y: certify.certify_bounds(affine(w, b), x, y, jr.Budget(0.5)))
  np.testing.assert_array_equal(run(W, BIAS, X, Y).radius,
                                certify.certify_bounds(affine(W, BIAS), X, Y,
                                                       jr.Budget(0.5)).radius)
  margins = jax.jit(lambda w, b, y, lo, hi: certify.margin_bounds(centred(w, b), y, lo, hi))
  assert margins(W, BIAS, Y, X - 0.05, X + 0.05).shape == (3, 2)
  # Under jax.grad the weights are tracers: the model's output cannot be read, nothing refused.
  def worst_margin(w):
    margins = certify.margin_bounds(centred(w, BIAS), Y, X - 0.05, X + 0.05)
    return jnp.sum(jnp.where(jnp.isinf(margins), 0.0, margins))

  assert jax.grad(worst_margin)(W).shape == (2, 2)


# ------------------------------------------------------------------------------------------------
# certified_curve.


@pytest.mark.parametrize("prediction, radius, shown", [
    (jnp.array([0, 1, 1, 0]), jnp.array([0.5]), r"prediction \(4,\) and radius \(1,\)"),
    (jnp.array([0, 1, 1, 0]), jnp.full((4, 1), 0.5), r"prediction \(4,\) and radius \(4, 1\)"),
    (jnp.array([0, 1, 1, 0]), jnp.float32(0.5), r"prediction \(4,\) and radius \(\)"),
    (jnp.zeros((4, 1), int), jnp.zeros((4, 1)), r"prediction \(4, 1\) and radius \(4, 1\)"),
])
def test_certified_curve_refuses_a_radius_of_another_shape(prediction, radius, shown):
  with pytest.raises(ValueError, match=rf"one prediction and one radius per example, both \[B\]; "
                                       rf"got {shown}\. Pass the Certificate"):
    certify.certified_curve(jr.Certificate(prediction, radius), jnp.array([0, 1, 1, 0]),
                            jnp.array([0.1, 0.3]))


def test_certified_curve_of_a_good_certificate_eager_and_jitted():
  c = jr.Certificate(jnp.array([0, 1, -1, 2]), jnp.array([0.5, 0.2, 0.0, 0.9]))
  y, radii = jnp.array([0, 1, 1, 0]), jnp.array([0.1, 0.3])
  for curve in (certify.certified_curve(c, y, radii), jax.jit(certify.certified_curve)(c, y, radii)):
    assert float(curve.clean_accuracy) == 0.5
    assert curve.robust_accuracy.tolist() == [0.5, 0.25]


# ------------------------------------------------------------------------------------------------
# Randomized smoothing's options.

REAL = r"sigma must be a real number \(an int or a float, or a 0-d float array\), not a"


@pytest.mark.parametrize("sigma, match", [
    (True, rf"{REAL} bool: got True\."),
    (np.bool_(True), rf"{REAL} bool: got np\.True_\.|{REAL} bool_: got"),
    ("0.5", rf"{REAL} str: got '0\.5'\."),
    ([0.25, 0.5], r"sigma must be one number \(a scalar\) for the whole batch, got an array of "
                  r"shape \(2,\)\."),
    (jnp.array([0.25, 0.5]), r"sigma must be one number \(a scalar\).*shape \(2,\)\."),
    (jnp.array(True), r"sigma must be a real number, got an array of dtype bool\."),
    (0.0, r"sigma must be a finite number > 0, got 0\.0\."),
    (jnp.float32(NAN), r"sigma must be a finite number > 0, got nan\."),
])
def test_smoothing_refuses_a_sigma_that_is_not_a_positive_real_number(sigma, match):
  f = affine(W, BIAS)
  for call in (lambda: certify.smoothing(f, X, KEY, sigma=sigma, n=100),
               lambda: certify.smoothed_predict(f, X, KEY, sigma=sigma, n=100),
               lambda: certify.smoothing_certifier(sigma=sigma, n=1000),
               lambda: certify.gaussian_noise(f, sigma)):
    with pytest.raises(ValueError, match=match):
      call()


def test_smoothing_certifier_refuses_an_n_too_small_for_alpha_at_build_time():
  with pytest.raises(ValueError, match=r"n = 5 draws cannot certify anything at alpha = 0\.001: "
                                       r".*Use n > log2\(1/alpha\) = 9\.97"):
    certify.smoothing_certifier(sigma=0.25, n=5)
  with pytest.raises(ValueError, match=r"alpha must be a real number .* not a str"):
    certify.smoothing_certifier(sigma=0.25, alpha="0.001")
  with pytest.raises(ValueError, match=r"n = 10 draws cannot predict anything at alpha = 0\.001"):
    certify.smoothed_predict(affine(W, BIAS), X, KEY, sigma=0.5, n=10)
  assert certify.smoothing_certifier(sigma=0.25, n=10).name == \
      "smoothing-l2-sigma0.25-n10-alpha0.001"  # n > 9.97 certifies


def test_smoothing_of_good_sigmas_gives_the_same_certificate():
  f = affine(W, jnp.zeros(2))
  eager = certify.smoothing(f, X, KEY, sigma=0.5, n=200)
  assert eager.prediction.tolist() == [0, -1, 1]
  np.testing.assert_allclose(eager.radius, [0.043152, 0.0, 0.18655], rtol=1e-4)
  for sigma in (np.float32(0.5), jnp.float32(0.5), np.float64(0.5)):
    jax.tree.map(np.testing.assert_array_equal,
                 certify.smoothing(f, X, KEY, sigma=sigma, n=200), eager)
  traced = jax.jit(lambda w, x, key, s, a: certify.smoothing(affine(w, jnp.zeros(2)), x, key,
                                                             sigma=s, n=200, alpha=a))
  jax.tree.map(np.testing.assert_allclose, traced(W, X, KEY, 0.5, 0.001), eager)
  for bad in (-0.5, 0.0, NAN):  # traced, so unchecked: abstain with NaN radii, never negative
    refused = traced(W, X, KEY, bad, 0.001)
    assert refused.prediction.tolist() == [-1, -1, -1] and bool(jnp.all(jnp.isnan(refused.radius)))
  integer = certify.smoothing(f, X, KEY, sigma=1, n=200)  # an int is a real number
  assert integer.prediction.tolist() == [-1, -1, 1]
  certifier = certify.smoothing_certifier(sigma=np.float32(0.25), n=1000)
  assert certifier.name == "smoothing-l2-sigma0.25-n1000-alpha0.001"
  assert '"sigma": 0.25' in certifier.config


# ------------------------------------------------------------------------------------------------
# The boxes of interval_bounds, linear_bounds and margin_bounds.

BOUNDS = {  # weights as arguments, for jit
    "interval_bounds": lambda w, b, lo, hi: certify.interval_bounds(mlp(w, b), lo, hi),
    "linear_bounds": lambda w, b, lo, hi: certify.linear_bounds(mlp(w, b), lo, hi),
    "margin_bounds": lambda w, b, lo, hi: certify.margin_bounds(mlp(w, b), Y[:1], lo, hi),
}


@pytest.mark.parametrize("name", sorted(BOUNDS))
@pytest.mark.parametrize("lower, upper, match", [
    ([[0.1, NAN]], [[0.2, 0.3]], r"lower must be finite \(no NaN or inf\), got 1 of 2 entries that "
                                 r"are not: lower\[0, 1\] = nan\. .*give finite bounds"),
    ([[0.1, 0.2]], [[INF, 0.3]], r"upper must be finite .* upper\[0, 0\] = inf\."),
    ([[-INF, -INF]], [[INF, INF]], r"lower must be finite .* got 2 of 2 entries .* = -inf\."),
    ([[0.1, 0.5]], [[0.2, 0.3]], r"lower must be <= upper everywhere, got 1 of 2 entries that "
                                 r"are not: lower\[0, 1\] = 0\.5 with upper\[0, 1\] = 0\.3\. "
                                 r"Pass the box as \(lower, upper\)"),
])
def test_bounds_refuse_a_non_finite_or_inverted_box(name, lower, upper, match):
  with pytest.raises(ValueError, match=match):
    BOUNDS[name](W, BIAS, jnp.array(lower), jnp.array(upper))


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_bounds_of_a_good_box_eager_and_of_a_traced_box(name):
  lower, upper = X[:1] - 0.05, X[:1] + 0.05
  eager = BOUNDS[name](W, BIAS, lower, upper)
  jax.tree.map(lambda a: np.testing.assert_array_equal(np.isnan(a), False), eager)
  jitted = jax.jit(BOUNDS[name])
  jax.tree.map(np.testing.assert_allclose, jitted(W, BIAS, lower, upper), eager)
  # Traced: not read (no ConcretizationTypeError); a NaN box gives what the arithmetic gives.
  nan_box = jitted(W, BIAS, lower.at[0, 1].set(NAN), upper)
  assert any(bool(jnp.isnan(a).any()) for a in jax.tree.leaves(nan_box))


# ------------------------------------------------------------------------------------------------
# robust_counts' mask.


@pytest.mark.parametrize("mask, shape", [
    ([True, True, False, True], r"\(4,\)"), ([False], r"\(1,\)"),
    (jnp.ones((3, 1), bool), r"\(3, 1\)"), (jnp.bool_(True), r"\(\)"),
])
def test_robust_counts_refuses_a_mask_of_another_shape_before_attacking(mask, shape, monkeypatch):
  def attacked(*args, **kwargs):
    raise AssertionError("the attack ran before the mask was checked")

  monkeypatch.setattr(_eval, "run_attack", attacked)
  match = rf"mask must have shape \(3,\), got {shape}\."  # x has 3 examples
  with pytest.raises(ValueError, match=match):
    training.robust_counts(affine(W, BIAS), X, Y, jr.Budget(0.05), KEY, mask=mask)
  with pytest.raises(ValueError, match=match):  # a shape: checked while tracing too
    jax.jit(lambda w, b, x, y, key, m: training.robust_counts(
        affine(w, b), x, y, jr.Budget(0.05), key, mask=m))(W, BIAS, X, Y, KEY, jnp.asarray(mask))


def test_robust_counts_of_a_good_mask_counts_as_before():
  expected = {"accuracy": 0.5, "robust_accuracy": 0.5, "conditional_robust_accuracy": 1.0}
  for mask in (jnp.array([True, True, False]), [1, 1, 0], np.array([True, True, False])):
    counts = training.robust_counts(affine(W, BIAS), X, Y, jr.Budget(0.05), KEY, mask=mask,
                                    attack=jr.attacks.pgd(steps=2))
    assert {k: float(counts.compute()[k]) for k in expected} == expected
    assert (int(counts.n), int(counts.clean_correct), int(counts.robust)) == (2, 1, 1)
  step = jax.jit(lambda w, b, x, y, key, m: training.robust_counts(
      affine(w, b), x, y, jr.Budget(0.05), key, mask=m, attack=jr.attacks.pgd(steps=2)))
  assert float(step(W, BIAS, X, Y, KEY, jnp.array([True, True, False])).compute()["accuracy"]) \
      == 0.5


# ------------------------------------------------------------------------------------------------
# The training losses' budget units.


@pytest.mark.parametrize("loss", [
    lambda b: training.trades_loss(affine(W, BIAS), X, Y, b, KEY, steps=1),
    lambda b: training.mart_loss(affine(W, BIAS), X, Y, b, KEY),
    lambda b: training.mart_loss(affine(W, BIAS), X, Y, b, KEY, attack=jr.attacks.pgd(steps=1)),
], ids=["trades_loss", "mart_loss", "mart_loss attack="])
def test_trades_and_mart_refuse_0_255_budgets_without_pointing_to_allow_large_eps(loss):
  with pytest.raises(ValueError, match=r"eps = 8 covers the whole box .*use e\.g\. 8/255, not 8\. "
                                       r"The training losses take no allow_large_eps") as caught:
    loss(jr.Budget(8.0))
  assert "Pass allow_large_eps=True" not in str(caught.value)


def test_trades_and_mart_of_a_good_budget_give_the_same_losses():
  trades, _ = training.trades_loss(affine(W, jnp.zeros(2)), X, Y, jr.Budget(0.1), KEY, steps=2)
  mart, _ = training.mart_loss(affine(W, jnp.zeros(2)), X, Y, jr.Budget(0.1), KEY)
  assert float(trades) == pytest.approx(0.5837329, rel=1e-5)
  assert float(mart) == pytest.approx(1.5437398, rel=1e-5)
