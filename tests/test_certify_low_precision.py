"""Bounds of models that compute in bfloat16 or float16 (``model_of(f).compute_in(dtype)``): the
bounds hold for the model's own low-precision values, not only for the real-number computation.

Each result of such a model is rounded to its type (8 significant bits in bfloat16: about 0.4%
of a logit), and XLA may also skip a rounding (excess precision). The bounds widen each rounding
equation's interval to hold both (IBP) and charge the rounding error ``u |z|`` in the backward
passes (CROWN). Checked here: a linear model's certified radius, whose worst case is a known box
corner, never flips there (the bounds that ignored the rounding certified radii at which the
model flipped); IBP, CROWN and margin bounds of a ReLU MLP and a small convolutional network hold
the model's logits at sampled points, vertices, per-logit extremes and PGD points, evaluated
compiled (XLA skips some roundings) and op by op (every rounding done); a float32 model has no
rounding equation, so its bounds are what they were.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrobust as jr
from jaxrobust import certify
from jaxrobust.certify import _primitives as prim
from jaxrobust.certify._jaxpr import trace
from jaxrobust.model import model_of
from tests.models import box_points

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": "0"})
LOW = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _normal(seed, shape, scale=1.0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * scale, jnp.float32)


def _uniform(seed, shape, low=0.0, high=1.0):
  return jnp.asarray(np.random.default_rng(seed).uniform(low, high, size=shape), jnp.float32)


def _affine(w, x):
  return x @ w


def _low(apply, params, dtype):
  """The model ``apply(params, x)`` computing in ``dtype``."""
  return model_of(functools.partial(apply, params)).compute_in(dtype)


@functools.lru_cache(maxsize=None)
def _certify(method):
  return _jit(lambda model, x, y: certify.certify_bounds(model, x, y, jr.Budget(0.2),
                                                         method=method))


@functools.lru_cache(maxsize=None)
def _predict():
  return jax.jit(lambda model, x: jnp.argmax(model(x), axis=-1))  # XLA's defaults


@pytest.mark.parametrize("method", ["ibp", "crown"])
@pytest.mark.parametrize("name", sorted(LOW))
def test_a_low_precision_linear_model_never_flips_at_its_certified_radius(name, method):
  """``z = x W`` in bfloat16 (float16), two classes: the margin is smallest over the box at the
  corner ``x - r sign(w_y - w_j)``, so a sound radius ``r`` keeps the label there. The bounds
  that computed in float32 without the model's roundings certified radii at which about half of
  these points flipped."""
  dtype = LOW[name]
  w = _normal(0, (64, 2))
  x = _uniform(1, (128, 64), 0.3, 0.7)
  model = _low(_affine, w, dtype)
  y = _predict()(model, x)
  radius = np.asarray(_certify(method)(model, x, y).radius)
  assert (radius > 0).sum() >= 100  # not vacuous: most points certified
  # Not needlessly loose: close to the exact radius of the same weights in float64.
  w64 = np.asarray(w.astype(dtype), np.float64)
  x64, labels = np.asarray(x, np.float64), np.asarray(y)
  gap = (w64[:, 1] - w64[:, 0]) * np.where(labels == 1, 1.0, -1.0)[:, None]  # [B, D]: w_y - w_j
  exact = np.einsum("bd,bd->b", x64, gap) / np.abs(gap).sum(axis=1)
  assert np.median(radius / exact) > 0.9, np.median(radius / exact)
  corner = np.clip(np.asarray(x) - radius[:, None] * np.sign(gap), 0.0, 1.0).astype(np.float32)
  corner = jnp.asarray(corner)
  for predicted in (_predict()(model, corner), jnp.argmax(model(corner), axis=-1)):  # op by op
    flipped = (np.asarray(predicted) != labels) & (radius > 0)
    assert not flipped.any(), f"{int(flipped.sum())} points flip inside their certified box"


def _mlp(params, x):
  for weight, bias in params[:-1]:
    x = jax.nn.relu(x @ weight + bias)
  weight, bias = params[-1]
  return x @ weight + bias


def _cnn(params, x):
  """NHWC: convolution, ReLU, 2x2 average pooling, dense."""
  kernel, bias, dense = params
  h = lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                               dimension_numbers=("NHWC", "HWIO", "NHWC"))
  h = jax.nn.relu(h + bias)
  h = lax.reduce_window(h, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0
  return h.reshape(h.shape[0], -1) @ dense


MLP_SIZES = (8, 16, 16, 3)
MLP_PARAMS = [(_normal(10 + i, (a, b), 1 / np.sqrt(a)), _normal(20 + i, (1, b), 0.3))
              for i, (a, b) in enumerate(zip(MLP_SIZES[:-1], MLP_SIZES[1:]))]
CNN_PARAMS = (_normal(30, (3, 3, 1, 4), 0.5), _normal(31, (1, 1, 1, 4), 0.2),
              _normal(32, (3 * 3 * 4, 3)))
NETWORKS = {"mlp": (_mlp, MLP_PARAMS, (2, 8)), "cnn": (_cnn, CNN_PARAMS, (2, 6, 6, 1))}


def _extremes(model, lower, upper, steps=30):
  """``[2C, *shape]``: points of the box pushed (signed gradient) to each logit's maximum, then
  minimum, for every example at once."""
  classes = jax.eval_shape(model, lower).shape[-1]
  directions = jnp.concatenate([jnp.eye(classes), -jnp.eye(classes)])

  def extreme(direction):
    objective = lambda x: jnp.sum(model(x) * direction[None])

    def step(x, scale):
      x = x + scale * (upper - lower) * jnp.sign(jax.grad(objective)(x))
      return jnp.clip(x, lower, upper), None

    x, _ = lax.scan(step, (lower + upper) / 2, jnp.linspace(0.5, 0.01, steps))
    return x

  return jax.vmap(extreme)(directions)


def _attacked(model, x, y, eps, lower, upper, key):
  """``[1 + C, *shape]``: PGD points (untargeted, then targeted at each class), in the box."""
  classes = jax.eval_shape(model, x).shape[-1]
  keys = jax.random.split(key, x.shape[0])
  untargeted = jr.run(jr.attacks.pgd("linf", steps=20), model, x, y, jr.Budget(eps), keys,
                      early_exit=False).x_adv
  targeted = [jr.run(jr.attacks.pgd("linf", steps=20, targeted=True), model, x, y,
                     jr.Budget(eps), keys, jnp.full_like(y, c), early_exit=False).x_adv
              for c in range(classes)]
  return jnp.clip(jnp.stack([untargeted, *targeted]), lower[None], upper[None])


@functools.lru_cache(maxsize=None)
def _bounds_and_points(name, dtype_name):
  """``(params, x, eps, key) -> (points, IBP, CROWN, margin bounds by method)`` for a network,
  one compile per network and dtype; the parameters are arguments."""
  apply = NETWORKS[name][0]

  def run(params, x, eps, key):
    model = _low(apply, params, LOW[dtype_name])
    lower, upper = jnp.clip(x - eps, 0.0, 1.0), jnp.clip(x + eps, 0.0, 1.0)
    y = jnp.argmax(model(x), axis=-1)
    points = jnp.concatenate([
        box_points(lower, upper, 0), _extremes(model, lower, upper),
        _attacked(model, x, y, eps, lower, upper, key)])
    margins = {method: certify.margin_bounds(model, y, lower, upper, method=method)
               for method in ("ibp", "crown-ibp", "crown")}
    return (points, y, certify.interval_bounds(model, lower, upper),
            certify.linear_bounds(model, lower, upper), margins)

  return _jit(run)


def _assert_inside(values, lo, hi, what):
  values, lo, hi = np.asarray(values, np.float64), np.asarray(lo), np.asarray(hi)
  tol = 1e-5 * (1.0 + np.abs(values))  # the float32 arithmetic of the bounds themselves
  below, above = values < lo[None] - tol, values > hi[None] + tol
  assert not (below.any() or above.any()), (
      f"{what}: {int(below.sum() + above.sum())} values outside, by up to "
      f"{float(max(np.max(lo[None] - values), np.max(values - hi[None])))}")


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_bounds_of_a_bfloat16_network_hold_its_own_logits(name):
  """IBP, CROWN and the margin bounds of the bfloat16 network contain its logits (margins) at
  uniform points, vertices, per-logit extremes and PGD points of a small box (stable ReLUs
  mostly, so CROWN is nearly exact and its extremes are reached), computed by XLA (which skips
  some roundings) and op by op (every rounding done)."""
  apply, params, shape = NETWORKS[name]
  x = _uniform(40, shape, 0.2, 0.8)
  eps = jnp.asarray(0.01, jnp.float32)
  points, y, ibp, crown, margins = _bounds_and_points(name, "bfloat16")(
      params, x, eps, jax.random.key(0))
  model = _low(apply, params, jnp.bfloat16)
  flat = points.reshape((-1,) + shape[1:])
  compiled = jax.jit(lambda m, p: m(p))(model, flat)
  for how, logits in (("compiled", compiled), ("op by op", model(flat))):
    logits = np.asarray(logits).reshape(points.shape[:2] + (-1,))
    _assert_inside(logits, *ibp, f"IBP, {how}")
    _assert_inside(logits, *crown, f"CROWN, {how}")
    labels = np.asarray(y)
    true = np.take_along_axis(logits, labels[None, :, None], axis=2)
    others = np.arange(logits.shape[-1])[None, :] != labels[:, None]
    for method, bound in margins.items():
      bound = np.asarray(bound)
      gap = (true - logits)[:, others] - bound[others][None]
      assert np.all(gap >= -1e-5 * (1 + np.abs(true).max())), (method, how, float(gap.min()))
    # Not vacuous: CROWN's interval is at most three times the range of the logits reached
    # (bfloat16 logits of size 3 move by 0.01 when rounded: the charge is real).
    reached = logits.max(axis=0) - logits.min(axis=0)
    assert np.all(np.asarray(crown[1] - crown[0]) < 3 * reached + 0.05), how
  assert np.all(np.asarray(crown[0]) >= np.asarray(ibp[0]))
  assert np.all(np.asarray(crown[1]) <= np.asarray(ibp[1]))


def _rounding(apply, params, shape, dtype):
  """The primitives of the rounding equations of ``apply`` computing in ``dtype``."""
  model = _low(apply, params, dtype) if dtype is not None else functools.partial(apply, params)
  graph = trace(model, jnp.zeros(shape, jnp.float32))
  return {eqn.primitive.name for eqn in graph.equations
          if prim.rounding_dtype(eqn, graph.avals[eqn.outputs[0]].dtype, jnp.float32)}


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_only_low_precision_results_round(name):
  """A float32 network bounded in float32 has no rounding equation (its bounds take exactly the
  path they took before rounding was modelled); the same network in bfloat16 rounds its affine
  results, its conversion of the input and its pooling, never its ReLUs (``max`` is exact)."""
  apply, params, shape = NETWORKS[name]
  assert _rounding(apply, params, shape, None) == set()
  assert _rounding(apply, params, shape, jnp.float32) == set()
  rounds = _rounding(apply, params, shape, jnp.bfloat16)
  assert {"convert_element_type", "dot_general", "add"} <= rounds
  assert "max" not in rounds
  if name == "cnn":
    assert {"conv_general_dilated", "reduce_window_sum", "div"} <= rounds


def test_an_interval_holds_the_rounded_and_the_unrounded_result():
  """For every rounding equation the interval holds ``t`` and ``fl(t)``: here ``a + b`` of two
  bfloat16 numbers that XLA may leave unrounded (excess precision) or round, either way."""
  a = jnp.asarray([[1.0, 1.0, -3.0]], jnp.bfloat16)
  fn = lambda x: (x + a).astype(jnp.float32)  # noqa: E731
  x = jnp.asarray([[2 ** -9, 3 * 2 ** -9, 2 ** -3]], jnp.bfloat16)
  lo, hi = certify.interval_bounds(fn, x, x)
  exact = np.asarray(x, np.float32) + np.asarray(a, np.float32)
  rounded = np.asarray(fn(x))
  assert np.all(np.asarray(lo) <= np.minimum(exact, rounded))
  assert np.all(np.asarray(hi) >= np.maximum(exact, rounded))
  assert np.any(exact != rounded)  # the case is not trivial: the addition does round
  np.testing.assert_array_equal(lo, np.minimum(exact, rounded))  # and it is the tightest
  np.testing.assert_array_equal(hi, np.maximum(exact, rounded))
