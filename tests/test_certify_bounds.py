"""Bound propagation (jr.certify.interval_bounds / linear_bounds / margin_bounds) against ground
truth: sampled points, random vertices and PGD extremes of each output stay inside the bounds;
affine functions are bounded exactly (closed forms); CROWN is never looser than IBP; IBP equals an
independent float64 numpy implementation."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen, nnx
from jax import lax

from jaxrobust import certify
from jaxrobust.certify._jaxpr import trace
from tests.models import box_points

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

BF16 = jnp.bfloat16
# The bound programs are tiny to run and slow to optimise: compiling without XLA's backend
# optimisations halves the file's time (the module is compile_bound too: tests/conftest.py).
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": "0"})


def _normal(seed, shape, scale=1.0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * scale, jnp.float32)


def _box(seed, shape, radius=0.3):
  """A random box ``[x - r, x + r]`` with per-element radii in ``[0, radius]``."""
  centre = _normal(seed, shape)
  spread = jnp.asarray(np.random.default_rng(seed + 1).uniform(0, radius, size=shape), jnp.float32)
  return centre - spread, centre + spread


def _assert_inside(values, lo, hi):
  values, lo, hi = np.asarray(values, np.float64), np.asarray(lo), np.asarray(hi)
  tol = 1e-5 * (1.0 + np.abs(values))
  assert np.all(values >= lo[None] - tol), float(np.max(lo[None] - values))
  assert np.all(values <= hi[None] + tol), float(np.max(values - hi[None]))


@functools.lru_cache(maxsize=None)
def _jitted(fn):
  """``(points, lower, upper) -> (fn at points, IBP bounds, CROWN bounds)``, one compile per
  function (run eagerly, CROWN would compile every small op of its backward passes apart)."""

  def evaluate(points, lower, upper):
    return (jax.vmap(fn)(points), certify.interval_bounds(fn, lower, upper),
            certify.linear_bounds(fn, lower, upper))

  return _jit(evaluate)


def _assert_sound(fn, lower, upper, seed=0):
  """Both methods contain ``fn`` at sampled points and CROWN's interval lies inside IBP's."""
  values, ibp, crown = _jitted(fn)(box_points(lower, upper, seed), lower, upper)
  for lo, hi in (ibp, crown):
    assert lo.shape == hi.shape == values.shape[1:] and lo.dtype == jnp.float32
    _assert_inside(values, lo, hi)
  assert np.all(np.asarray(crown[0]) >= np.asarray(ibp[0]))
  assert np.all(np.asarray(crown[1]) <= np.asarray(ibp[1]))
  return ibp, crown


def _pgd_extremes(fn, lower, upper, steps=40):
  """``[2K, *out]``: outputs at points PGD-maximising (then minimising) each of the K outputs."""
  size = int(np.prod(jax.eval_shape(fn, lower).shape))
  directions = jnp.concatenate([jnp.eye(size), -jnp.eye(size)])

  def extreme(direction):
    objective = lambda x: jnp.sum(fn(x).reshape(-1) * direction)

    def step(x, scale):
      x = x + scale * (upper - lower) * jnp.sign(jax.grad(objective)(x))
      return jnp.clip(x, lower, upper), None

    scales = jnp.linspace(0.5, 0.01, steps)
    x, _ = lax.scan(step, (lower + upper) / 2, scales)
    return fn(x)

  return _jit(jax.vmap(extreme))(directions)


def _mlp_params(seed, sizes):
  return [(_normal(seed + i, (a, b), 1 / np.sqrt(a)), _normal(seed + 50 + i, (1, b), 0.1))
          for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]


def _mlp(params, x):
  for weight, bias in params[:-1]:
    x = jax.nn.relu(x @ weight + bias)
  weight, bias = params[-1]
  return x @ weight + bias


MLP = functools.partial(_mlp, _mlp_params(0, (3, 8, 8, 4)))
CNN_KERNEL = _normal(7, (3, 3, 2, 4), 0.4)
CNN_DENSE = _normal(8, (2 * 2 * 4, 3), 0.3)


def _cnn(x):
  """NHWC: strided conv, ReLU, average pooling, flatten, dense."""
  h = lax.conv_general_dilated(x, CNN_KERNEL, (2, 2), "SAME",
                               dimension_numbers=("NHWC", "HWIO", "NHWC"))
  h = jax.nn.relu(h + 0.05)
  h = lax.reduce_window(h, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "VALID") / 4.0
  return h.reshape(h.shape[0], -1) @ CNN_DENSE


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_mlp_and_cnn_bounds_contain_samples_vertices_and_pgd_extremes(name):
  fn, shape = {"mlp": (MLP, (2, 3)), "cnn": (_cnn, (2, 5, 5, 2))}[name]
  lower, upper = _box(1, shape, radius=0.4)
  ibp, crown = _assert_sound(fn, lower, upper)
  extremes = _pgd_extremes(fn, lower, upper)
  _assert_inside(extremes, *ibp)
  _assert_inside(extremes, *crown)
  if name == "mlp":  # every vertex of a 3-dimensional box, for both examples at once
    corners = np.array(np.meshgrid(*[[0.0, 1.0]] * 3, indexing="ij")).reshape(3, -1).T
    points = lower[None] + jnp.asarray(corners, jnp.float32)[:, None, :] * (upper - lower)[None]
    _assert_inside(jax.vmap(fn)(points), *crown)


def test_crown_is_never_looser_than_ibp_and_strictly_tighter_on_a_deep_mlp():
  fn = functools.partial(_mlp, _mlp_params(3, (4, 16, 16, 16, 3)))
  lower, upper = _box(2, (3, 4), radius=0.5)
  ibp, crown = _assert_sound(fn, lower, upper)
  ibp_width = np.asarray(ibp[1] - ibp[0])
  crown_width = np.asarray(crown[1] - crown[0])
  assert np.all(crown_width <= ibp_width)
  assert np.mean(crown_width / ibp_width) < 0.8, np.mean(crown_width / ibp_width)


def test_ibp_of_one_affine_layer_is_exact_and_attained_at_a_vertex():
  weight, bias = _normal(4, (5, 3)), _normal(5, (1, 3))
  fn = lambda x: x @ weight + bias
  lower, upper = _box(6, (2, 5))
  lo, hi = certify.interval_bounds(fn, lower, upper)
  # Output k is smallest at the vertex taking lower where weight[:, k] > 0, else upper.
  positive = np.asarray(weight > 0)[None]  # [1, 5, 3]
  argmin = np.where(positive, np.asarray(lower)[..., None], np.asarray(upper)[..., None])
  argmax = np.where(positive, np.asarray(upper)[..., None], np.asarray(lower)[..., None])
  w64, b64 = np.asarray(weight, np.float64), np.asarray(bias, np.float64)
  np.testing.assert_allclose(lo, np.einsum("bdk,dk->bk", argmin, w64) + b64, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(hi, np.einsum("bdk,dk->bk", argmax, w64) + b64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["ibp", "crown-ibp", "crown"])
def test_margin_bounds_of_a_linear_model_are_exact(method):
  """For z = Wx + b on [x - eps, x + eps]: min z_y - z_j = m_j(x) - eps ||w_y - w_j||_1."""
  model = nnx.Linear(6, 4, rngs=nnx.Rngs(0))
  x = _normal(9, (5, 6))
  eps = jnp.array([0.0, 0.01, 0.1, 0.5, 2.0], jnp.float32)  # per example, one compile
  y = jnp.array([0, 1, 2, 3, 1])
  bounds = certify.margin_bounds(model, y, x - eps[:, None], x + eps[:, None], method=method)
  kernel = np.asarray(model.kernel[...], np.float64)  # [6, 4]: w_j = kernel[:, j]
  logits = np.asarray(x, np.float64) @ kernel + np.asarray(model.bias[...], np.float64)
  yy = np.asarray(y)
  margins = logits[np.arange(5), yy][:, None] - logits
  dual = np.abs(kernel[:, yy].T[:, :, None] - kernel[None]).sum(axis=1)  # [5, 4]
  expected = margins - np.asarray(eps, np.float64)[:, None] * dual
  expected[np.arange(5), yy] = np.inf
  np.testing.assert_allclose(bounds, expected, rtol=1e-5, atol=1e-5)


def test_relu_on_a_box_of_one_sign_is_exact():
  lower = jnp.array([[0.5, 1.0, -3.0, -2.0]])
  upper = jnp.array([[1.0, 2.0, -1.0, -0.5]])
  for lo, hi in _jitted(jax.nn.relu)(lower[None], lower, upper)[1:]:
    np.testing.assert_array_equal(lo, [[0.5, 1.0, 0.0, 0.0]])
    np.testing.assert_array_equal(hi, [[1.0, 2.0, 0.0, 0.0]])


def test_ibp_equals_a_float64_numpy_implementation():
  params = _mlp_params(11, (5, 7, 3))
  lower, upper = _box(12, (4, 5), radius=0.6)
  (w1, b1), (w2, b2) = [(np.asarray(w, np.float64), np.asarray(b, np.float64)) for w, b in params]
  centre = (np.asarray(lower, np.float64) + np.asarray(upper, np.float64)) / 2
  radius = (np.asarray(upper, np.float64) - np.asarray(lower, np.float64)) / 2
  h_lo = np.maximum(centre @ w1 + b1 - radius @ np.abs(w1), 0)
  h_hi = np.maximum(centre @ w1 + b1 + radius @ np.abs(w1), 0)
  centre, radius = (h_lo + h_hi) / 2, (h_hi - h_lo) / 2
  expected = (centre @ w2 + b2 - radius @ np.abs(w2), centre @ w2 + b2 + radius @ np.abs(w2))
  got = certify.interval_bounds(functools.partial(_mlp, params), lower, upper)
  np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-5)


def _numpy_crown_one_hidden_layer(params, lower, upper):
  """Float64 CROWN-Ada of ``W2 relu(W1 x + b1) + b2`` (pre-activation bounds are exact for the
  first affine layer), intersected with IBP as the library documents."""
  (w1, b1), (w2, b2) = [(np.asarray(w, np.float64), np.asarray(b, np.float64)) for w, b in params]
  lower, upper = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
  centre, radius = (lower + upper) / 2, (upper - lower) / 2
  z_lo = centre @ w1 + b1 - radius @ np.abs(w1)
  z_hi = centre @ w1 + b1 + radius @ np.abs(w1)
  active, inactive = z_lo >= 0, z_hi <= 0
  unstable = ~(active | inactive)
  chord = np.where(unstable, z_hi / np.where(unstable, z_hi - z_lo, 1.0), active * 1.0)
  up_offset = np.where(unstable, -chord * z_lo, 0.0)
  low_slope = np.where(unstable, (z_hi > -z_lo) * 1.0, active * 1.0)

  def lower_bound(coeff):  # coeff [h, c] on the hidden units -> lower bounds [B, c]
    positive = coeff[None] >= 0  # [1, h, c]
    slope = np.where(positive, coeff[None] * low_slope[..., None], coeff[None] * chord[..., None])
    offset = np.where(positive, 0.0, coeff[None] * up_offset[..., None]).sum(axis=1)
    on_x = np.einsum("dh,bhc->bdc", w1, slope)
    box = np.where(on_x >= 0, on_x * lower[..., None], on_x * upper[..., None]).sum(axis=1)
    return box + offset + np.einsum("oh,bhc->bc", b1, slope)

  h_lo, h_hi = np.maximum(z_lo, 0), np.maximum(z_hi, 0)
  ibp_lo = (h_lo + h_hi) / 2 @ w2 + b2 - (h_hi - h_lo) / 2 @ np.abs(w2)
  ibp_hi = (h_lo + h_hi) / 2 @ w2 + b2 + (h_hi - h_lo) / 2 @ np.abs(w2)
  return (np.maximum(lower_bound(w2) + b2, ibp_lo), np.minimum(-lower_bound(-w2) + b2, ibp_hi))


def test_crown_equals_a_float64_numpy_implementation():
  params = _mlp_params(13, (4, 9, 3))
  lower, upper = _box(14, (3, 4), radius=0.8)
  _, ibp, got = _jitted(functools.partial(_mlp, params))(lower[None], lower, upper)
  expected = _numpy_crown_one_hidden_layer(params, lower, upper)
  np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-5)
  assert np.any(np.asarray(got[1] - got[0]) < np.asarray(ibp[1] - ibp[0]) - 1e-3)


W63, W36, W66 = _normal(20, (6, 3)), _normal(21, (3, 6)), _normal(22, (6, 6), 0.5)
SIGNED = _normal(23, (1, 6))
NONZERO = jnp.where(SIGNED >= 0, 1.0, -1.0) * (jnp.abs(_normal(24, (1, 6))) + 0.5)
K_NHWC = _normal(25, (3, 3, 2, 6), 0.3)
K_GROUPED = _normal(26, (6, 1, 2, 2), 0.3)  # OIHW, two groups of 1 input channel
K_1D = _normal(27, (3, 1, 2))  # WIO
VEC, IMG = (2, 6), (2, 4, 4, 2)

PRIMITIVE_CASES = {
    # name: (primitive that must appear in the graph, input shape, fn)
    "dot_general": ("dot_general", VEC, lambda x: x @ W63),
    "dot_general_rhs": ("dot_general", VEC, lambda x: jnp.einsum("kd,bd->bk", W36, x)),
    "conv_nhwc_strided": ("conv_general_dilated", IMG, lambda x: lax.conv_general_dilated(
        x, K_NHWC, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))),
    "conv_nchw_grouped_dilated": ("conv_general_dilated", IMG,
                                  lambda x: lax.conv_general_dilated(
        jnp.transpose(x, (0, 3, 1, 2)), K_GROUPED, (1, 2), ((1, 0), (2, 1)), rhs_dilation=(2, 1),
        feature_group_count=2, dimension_numbers=("NCHW", "OIHW", "NCHW"))),
    "conv_1d_lhs_dilated": ("conv_general_dilated", VEC, lambda x: lax.conv_general_dilated(
        x[..., None], K_1D, (1,), ((1, 0),), lhs_dilation=(2,),
        dimension_numbers=("NWC", "WIO", "NWC"))),
    "add_sub_neg_rev": ("sub", VEC, lambda x: -(x - 2.0 * x[:, ::-1]) + x + 1.5),
    "mul_div_constants": ("div", VEC, lambda x: x * SIGNED / NONZERO),
    "relu": ("max", VEC, lambda x: jax.nn.relu(x @ W66 - 0.1) @ W63),
    "max_min_constants": ("min", VEC,
                          lambda x: jnp.clip(x @ W66, -0.2, 0.3) + jnp.maximum(x, SIGNED)),
    "reshape_transpose": ("transpose", IMG,
                          lambda x: jnp.transpose(x.reshape(-1, 16, 2), (0, 2, 1))[:, :, :6] @ W63),
    "broadcast_squeeze_expand": ("squeeze", VEC, lambda x: jnp.squeeze(
        jnp.broadcast_to(jnp.expand_dims(x, 1), (x.shape[0], 3, 6))[:, 1:2], 1) * SIGNED),
    "slice_dynamic_slice": ("dynamic_slice", VEC,
                            lambda x: lax.dynamic_slice(x, (0, 2), (x.shape[0], 3)) - x[:, 1:4]),
    "gather": ("gather", VEC, lambda x: x[:, jnp.array([0, 5, 2, 2])] @ W36[:, :4].T),
    "concatenate_pad": ("pad", VEC, lambda x: jnp.pad(
        jnp.concatenate([x, -x, jnp.ones((x.shape[0], 1))], 1), ((0, 0), (1, 2)),
        constant_values=0.5)),
    "reduce_sum_max": ("reduce_max", IMG, lambda x: jnp.concatenate(
        [jnp.sum(x, axis=(1, 2)), jnp.max(x, axis=(1, 3)), jnp.mean(x, axis=(1, 2, 3))[:, None]],
        axis=1)),
    "avg_pool": ("reduce_window_sum", IMG,
                 lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1),
                                             "VALID") / 4.0),
    "max_pool": ("reduce_window_max", IMG,
                 lambda x: linen.max_pool(x @ K_NHWC[0, 0], (3, 3), (2, 2), "SAME")),
    "tanh_logistic_exp": ("logistic", VEC,
                          lambda x: jnp.tanh(x @ W66) + jax.nn.sigmoid(x) - jnp.exp(x)),
    "log_sqrt_rsqrt": ("log", VEC, lambda x: jnp.log(jax.nn.sigmoid(x)) + jnp.sqrt(
        jax.nn.sigmoid(x)) - lax.rsqrt(jax.nn.sigmoid(x) + 0.1)),
    "powers": ("integer_pow", VEC, lambda x: x ** 2 - x ** 3 + jnp.square(x @ W66)),
    "convert_element_type": ("convert_element_type", VEC,
                             lambda x: x.astype(BF16).astype(jnp.float32) @ W63),
}


@pytest.mark.parametrize("name", sorted(PRIMITIVE_CASES))
def test_each_primitive_case_uses_its_primitive(name):
  primitive, shape, fn = PRIMITIVE_CASES[name]
  assert primitive in {eqn.primitive.name for eqn in trace(fn, jnp.zeros(shape)).equations}


def _all_cases(shape):
  """The cases of one input shape as one function (one compile), outputs side by side."""
  names = sorted(name for name, case in PRIMITIVE_CASES.items() if case[1] == shape)

  def combined(x):
    outputs = [PRIMITIVE_CASES[name][2](x) for name in names]
    return jnp.concatenate([out.reshape(x.shape[0], -1) for out in outputs], axis=1)

  sizes = [int(np.prod(jax.eval_shape(PRIMITIVE_CASES[name][2], jnp.zeros(shape)).shape[1:]))
           for name in names]
  owner = np.repeat(np.array(names), sizes)  # the case of each output column
  return combined, owner


@pytest.mark.parametrize("shape", [VEC, IMG], ids=["vectors", "images"])
def test_each_primitive_is_bounded_soundly(shape):
  combined, owner = _all_cases(shape)
  lower, upper = _box(30, shape, radius=0.5)
  values, ibp, crown = _jitted(combined)(box_points(lower, upper, 0), lower, upper)
  values = np.asarray(values, np.float64)
  tol = 1e-5 * (1.0 + np.abs(values))
  for method, (lo, hi) in (("ibp", ibp), ("crown", crown)):
    outside = np.any((values < np.asarray(lo)[None] - tol) | (values > np.asarray(hi)[None] + tol),
                     axis=(0, 1))
    assert not outside.any(), f"{method} unsound for {sorted(set(owner[outside]))}"
  looser = np.any((np.asarray(crown[0]) < np.asarray(ibp[0]))
                  | (np.asarray(crown[1]) > np.asarray(ibp[1])), axis=0)
  assert not looser.any(), f"crown looser than ibp for {sorted(set(owner[looser]))}"


@pytest.mark.parametrize("fn, primitive", [
    (jnp.sort, "sort"), (lambda x: jnp.cumsum(x, axis=1), "cumsum"), (jnp.sin, "sin"),
    (lambda x: x * x, "mul"), (lambda x: jnp.argmax(x, axis=1).astype(jnp.float32), "argmax")])
def test_an_unsupported_primitive_raises_naming_it(fn, primitive):
  lower, upper = _box(31, VEC)
  for bounds in (certify.interval_bounds, certify.linear_bounds):
    with pytest.raises(NotImplementedError, match=f"'{primitive}'"):
      bounds(fn, lower, upper)


def test_an_unused_unsupported_branch_is_ignored():
  lower, upper = _box(32, VEC)

  def fn(x):
    jnp.sort(x)  # computed and discarded: never bounded
    return jax.nn.relu(x)

  lo, hi = certify.interval_bounds(fn, lower, upper)
  np.testing.assert_array_equal(hi, jnp.maximum(upper, 0.0))


def test_jit_equals_eager_and_a_new_box_does_not_retrace():
  traces = []
  params = _mlp_params(5, (3, 4, 2))

  def fn(x):
    traces.append(x.shape)
    return _mlp(params, x)

  y = jnp.array([0, 1])
  functions = {
      "ibp": lambda l, u: certify.interval_bounds(fn, l, u),
      "crown": lambda l, u: certify.linear_bounds(fn, l, u),
      "margin": lambda l, u: certify.margin_bounds(fn, y, l, u, method="crown")}
  first, second = _box(40, (2, 3)), _box(41, (2, 3))
  for name, function in functions.items():
    jitted = jax.jit(function)
    np.testing.assert_allclose(jitted(*first), function(*first), rtol=1e-6, atol=1e-6,
                               err_msg=name)
    count = len(traces)
    again = jitted(*second)
    assert len(traces) == count, name  # a new box of the same shape reuses the compiled program
    # The reused program computes the new box's bounds (checked against a freshly compiled one;
    # an eager run would cost seconds of op-by-op compiles).
    np.testing.assert_allclose(again, jax.jit(function)(*second), rtol=1e-6, atol=1e-6,
                               err_msg=name)


def test_vmap_over_boxes_matches_one_box_at_a_time():
  lower, upper = _box(42, (3, 2, 3))
  points = box_points(lower[0], upper[0], 0)  # the MLP test compiled this shape already
  singles = [_jitted(MLP)(points, lower[i], upper[i])[1:] for i in range(3)]
  for index, method in enumerate((certify.interval_bounds, certify.linear_bounds)):
    batched = _jit(jax.vmap(lambda l, u: method(MLP, l, u)))(lower, upper)
    for i in range(3):
      np.testing.assert_allclose(batched[0][i], singles[i][index][0], rtol=1e-6, atol=1e-6)
      np.testing.assert_allclose(batched[1][i], singles[i][index][1], rtol=1e-6, atol=1e-6)


class _NnxCNN(nnx.Module):
  def __init__(self, rngs):
    self.conv = nnx.Conv(2, 3, (3, 3), strides=(2, 2), rngs=rngs)
    self.norm = nnx.BatchNorm(3, use_running_average=True, rngs=rngs)
    self.dense = nnx.Linear(3 * 3 * 3, 4, rngs=rngs)

  def __call__(self, x):
    h = jax.nn.relu(self.norm(self.conv(x)))
    return self.dense(h.reshape(h.shape[0], -1))


class _LinenCNN(linen.Module):
  @linen.compact
  def __call__(self, x):
    h = jax.nn.relu(linen.Conv(3, (2, 2), padding="VALID")(x))
    return linen.Dense(4)(h.reshape(h.shape[0], -1))


def test_flax_nnx_and_linen_models_are_bounded_soundly():
  lower, upper = _box(43, (2, 5, 5, 2), radius=0.2)
  model = _NnxCNN(nnx.Rngs(0))
  model.norm.mean[...] = _normal(44, (3,), 0.3)  # eval-mode statistics that are not the identity
  model.norm.var[...] = jnp.abs(_normal(45, (3,))) + 0.5
  _assert_sound(model, lower, upper)
  variables = _LinenCNN().init(jax.random.key(0), lower)
  _assert_sound(functools.partial(_LinenCNN().apply, variables), lower, upper)


def test_bfloat16_boxes_are_bounded_in_float32():
  """A bfloat16 box of a float32 model is bounded in float32 exactly as its float32 copy; a
  bfloat16 model gets float32 bounds too, its float32 twin's (same weights) widened by its own
  roundings (tests/test_certify_low_precision.py checks them against its values): IBP's contain
  the twin's, and both are only a little wider."""
  lower, upper = _box(46, (2, 3))
  lower16, upper16 = lower.astype(BF16), upper.astype(BF16)
  lower32, upper32 = lower16.astype(jnp.float32), upper16.astype(jnp.float32)
  params16 = [(w.astype(BF16), b.astype(BF16)) for w, b in _mlp_params(5, (3, 4, 2))]
  params32 = [(w.astype(jnp.float32), b.astype(jnp.float32)) for w, b in params16]
  model32 = functools.partial(_mlp, params32)
  for method in (certify.interval_bounds, certify.linear_bounds):
    bounds = _jit(method, static_argnums=0)
    want = bounds(model32, lower32, upper32)
    same = bounds(lambda x: model32(x.astype(jnp.float32)), lower16, upper16)
    np.testing.assert_allclose(same, want, rtol=1e-6, atol=1e-6)
    got = bounds(functools.partial(_mlp, params16), lower16, upper16)
    assert got[0].dtype == got[1].dtype == jnp.float32
    scale = 1.0 + np.abs(np.asarray(want))
    assert np.all(np.abs(np.asarray(got) - np.asarray(want)) <= 0.05 * scale)
    if method is certify.interval_bounds:
      assert np.all(np.asarray(got[0]) <= np.asarray(want[0]) + 1e-6 * scale[0])
      assert np.all(np.asarray(got[1]) >= np.asarray(want[1]) - 1e-6 * scale[1])


W_SPLIT, W_PARTS = _normal(60, (3, 6), 0.7), _normal(61, (21, 4), 0.4)


def _with_stack_split_tile(weights, x):
  """``jnp.stack``, ``jnp.split`` (even and uneven), ``jnp.tile`` and ``jnp.unstack``: the
  ``stack``, ``split``, ``tile`` and ``unstack`` primitives in recent JAX releases."""
  w, w_out = weights
  h = x @ w
  a, b = jnp.split(h, 2, axis=1)
  p, q, r = jnp.split(h, [1, 4], axis=1)
  s = jnp.stack([jax.nn.relu(a), b, -q], axis=1)  # [B, 3, 3]
  t = jnp.tile(jax.nn.relu(s - 0.1), (1, 2, 1))  # [B, 6, 3]
  u = jnp.stack(jnp.unstack(t, axis=2)[::-1], axis=2)
  return jnp.concatenate([u.reshape(x.shape[0], -1), jax.nn.relu(p), r], axis=1) @ w_out


def _with_concatenate_slices(weights, x):
  """The same function from slices, ``concatenate`` and ``broadcast_in_dim``."""
  w, w_out = weights
  h = x @ w
  a, b = h[:, :3], h[:, 3:]
  p, q, r = h[:, :1], h[:, 1:4], h[:, 4:]
  s = jnp.concatenate([jax.nn.relu(a)[:, None], b[:, None], -q[:, None]], axis=1)
  t = jnp.broadcast_to(jax.nn.relu(s - 0.1)[:, None], (x.shape[0], 2, 3, 3)).reshape(-1, 6, 3)
  u = jnp.concatenate([t[:, :, 2:], t[:, :, 1:2], t[:, :, :1]], axis=2)
  return jnp.concatenate([u.reshape(x.shape[0], -1), jax.nn.relu(p), r], axis=1) @ w_out


@functools.lru_cache(maxsize=None)
def _bounds_with_weights(apply):
  def evaluate(weights, points, lower, upper):
    fn = functools.partial(apply, weights)
    return (jax.vmap(fn)(points), certify.interval_bounds(fn, lower, upper),
            certify.linear_bounds(fn, lower, upper))

  return _jit(evaluate)


def test_stack_split_tile_and_unstack_are_bounded_as_their_concatenate_and_slice_forms():
  """Both forms get the same IBP and CROWN bounds (the same arithmetic; CROWN may sum a tiled
  node's coefficients in another order), which contain the function at sampled points; the
  multiple-output ``split``/``unstack`` reach the rules as one ``slice`` per output."""
  weights = (W_SPLIT, W_PARTS)
  names = {eqn.primitive.name for eqn in trace(functools.partial(_with_stack_split_tile, weights),
                                               jnp.zeros((2, 3))).equations}
  assert not names & {"split", "unstack"}
  if hasattr(lax, "stack_p"):  # JAX releases that have these primitives
    assert {"stack", "tile", "slice"} <= names
  lower, upper = _box(62, (2, 3), radius=0.5)
  points = box_points(lower, upper, 63)
  values, ibp, crown = _bounds_with_weights(_with_stack_split_tile)(weights, points, lower, upper)
  _, ibp_ref, crown_ref = _bounds_with_weights(_with_concatenate_slices)(weights, points, lower,
                                                                         upper)
  np.testing.assert_allclose(ibp, ibp_ref, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(crown, crown_ref, rtol=1e-5, atol=1e-5)
  for lo, hi in (ibp, crown):
    _assert_inside(values, lo, hi)
  assert np.any(np.asarray(crown[1] - crown[0]) < np.asarray(ibp[1] - ibp[0]) - 1e-3)


def test_margin_bounds_are_sound_and_merging_the_margin_is_tighter():
  lower, upper = _box(47, (4, 3), radius=0.3)
  y = jnp.array([0, 1, 2, 3])
  margins_of = _jit(certify.margin_bounds, static_argnums=0, static_argnames="method")
  ibp = margins_of(MLP, y, lower, upper, method="ibp")
  crown_ibp = margins_of(MLP, y, lower, upper, method="crown-ibp")
  crown = margins_of(MLP, y, lower, upper, method="crown")
  logits = jax.vmap(MLP)(box_points(lower, upper, 48))  # [N, B, C]
  margins = jnp.take_along_axis(logits, y[None, :, None], axis=2) - logits
  others = np.asarray(jnp.arange(4)[None, :] != y[:, None])
  for bound in (ibp, crown_ibp, crown):
    assert np.all(np.isinf(np.asarray(bound)[~others]))
    assert np.all(np.asarray(margins)[:, others] >= np.asarray(bound)[others][None] - 1e-5)
  # CROWN-IBP and CROWN are never looser than IBP, and the relaxation through the ReLUs pays.
  assert np.all(np.asarray(crown)[others] >= np.asarray(ibp)[others])
  assert np.all(np.asarray(crown_ibp)[others] >= np.asarray(ibp)[others])
  assert np.any(np.asarray(crown_ibp)[others] > np.asarray(ibp)[others] + 1e-3)
  lo, hi = certify.interval_bounds(MLP, lower, upper)
  naive = jnp.take_along_axis(lo, y[:, None], axis=1) - hi
  assert np.all(np.asarray(ibp)[others] >= np.asarray(naive)[others] - 1e-6)


def test_examples_per_pass_bounds_the_same_numbers_a_few_examples_at_a_time():
  """The memory knob changes how many examples one pass holds (lax.map instead of vmap), not the
  bounds: equal to float rounding (two programs), including a last pass of fewer examples."""
  lower, upper = _box(51, (5, 3), radius=0.3)
  y = jnp.array([0, 1, 2, 3, 0])
  for method in ("ibp", "crown-ibp", "crown"):
    bounds = [_jit(certify.margin_bounds, static_argnums=0,
                   static_argnames=("method", "examples_per_pass"))(
        MLP, y, lower, upper, method=method, examples_per_pass=k) for k in (None, 1, 2)]
    for other in bounds[1:]:
      np.testing.assert_allclose(other, bounds[0], rtol=1e-6, atol=1e-6)
  linear = [_jit(certify.linear_bounds, static_argnums=0, static_argnames="examples_per_pass")(
      MLP, lower, upper, examples_per_pass=k) for k in (None, 2)]
  np.testing.assert_allclose(linear[1], linear[0], rtol=1e-6, atol=1e-6)


def test_bad_inputs_get_clear_errors():
  lower, upper = _box(49, (2, 3))
  for bad in (0, -1, 1.5, True):
    with pytest.raises(ValueError, match="examples_per_pass"):
      certify.margin_bounds(MLP, jnp.array([0, 1]), lower, upper, examples_per_pass=bad)
  with pytest.raises(ValueError, match="examples_per_pass"):
    certify.linear_bounds(MLP, lower, upper, examples_per_pass=0)
  with pytest.raises(ValueError, match="method"):
    certify.margin_bounds(MLP, jnp.array([0, 1]), lower, upper, method="zonotope")
  with pytest.raises(ValueError, match=r"\[0, 4\)"):
    certify.margin_bounds(MLP, jnp.array([0, 4]), lower, upper)
  with pytest.raises(ValueError, match="same shape"):
    certify.interval_bounds(MLP, lower, upper[:1])
  with pytest.raises(ValueError, match="one example at a time"):
    certify.linear_bounds(lambda x: jnp.sum(x, axis=0), lower, upper)
  with pytest.raises(ValueError, match="lower must be <= upper everywhere"):
    certify.interval_bounds(MLP, upper, lower)
  with pytest.raises(TypeError, match="floating-point"):
    certify.interval_bounds(MLP, jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3), jnp.int32))
