"""Tests for jaxrobust.projections: norms, exact ball projections, the box, and ball sampling.

The JAX float32 results are checked against independent float64 NumPy references: the L1
projection reference finds the threshold by bisection (not by sorting), one example at a time.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from jaxrobust import projections as P

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

NORMS = ("linf", "l2", "l1")

# Jitted entry points shared by the property tests: each (shape, eps shape, norm) compiles once
# for the whole file, which keeps it fast. The eager path is covered by the explicit tests.
project = jax.jit(P.project, static_argnames="norm")
norm = jax.jit(P.norm, static_argnames="norm")
project_box = jax.jit(P.project_box)
sample_ball = jax.jit(P.sample_ball, static_argnames=("shape", "norm", "dtype"))

# ---------------------------------------------------------------------------------------------
# float64 NumPy references


def ref_norm(v, name):
  """Per-example norm of a [B, ...] array, in float64."""
  v = np.asarray(v, np.float64).reshape(len(v), -1)
  if name == "linf":
    return np.abs(v).max(axis=1)
  if name == "l2":
    return np.sqrt((v**2).sum(axis=1))
  return np.abs(v).sum(axis=1)


def ref_l1_one(v, eps):
  """Projection of one flat float64 vector onto the L1 ball, by bisection on the threshold."""
  a = np.abs(v)
  if a.sum() <= eps:
    return v.copy()
  lo, hi = 0.0, float(a.max())  # g(lo) > eps >= g(hi), g(theta) = sum(max(a - theta, 0))
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if np.maximum(a - mid, 0.0).sum() > eps:
      lo = mid
    else:
      hi = mid
    if hi - lo <= 1e-15 * max(1.0, hi):
      break
  theta = 0.5 * (lo + hi)
  return np.sign(v) * np.maximum(a - theta, 0.0)


def ref_l2_one(v, eps):
  n = np.sqrt((v * v).sum())
  return v.copy() if n <= eps else v * (eps / n)


def ref_linf_one(v, eps):
  return np.minimum(np.maximum(v, -eps), eps)


REF_ONE = {"linf": ref_linf_one, "l2": ref_l2_one, "l1": ref_l1_one}


def ref_project(v, eps, name):
  """float64 projection of [B, ...] with scalar or [B] eps, one example at a time."""
  v64 = np.asarray(v, np.float64)
  eps64 = np.broadcast_to(np.asarray(eps, np.float64), (len(v64),))
  out = np.empty_like(v64)
  for i in range(len(v64)):
    out[i] = REF_ONE[name](v64[i].ravel(), float(eps64[i])).reshape(v64.shape[1:])
  return out


def eps_vector(eps, b):
  return np.broadcast_to(np.asarray(eps, np.float64), (b,))


def assert_inside(out, eps, name):
  n = ref_norm(out, name)
  bound = eps_vector(eps, len(n)) * (1 + 1e-6) + 1e-7
  assert np.all(n <= bound), (n, bound)


# ---------------------------------------------------------------------------------------------
# strategies

# A few shapes only (each new shape compiles): one example with D = 1, four with D = 12, and
# a trailing shape [2, 3].
SHAPES = [(1, 1), (4, 12), (2, 2, 3)]
TIE_VALUES = [-2.0, -1.0, -0.5, 0.0, 0.0, 0.5, 1.0, 2.0]
FINITE = {"allow_nan": False, "allow_infinity": False, "allow_subnormal": False, "width": 32}


@st.composite
def deltas(draw, shape=None):
  """float32 [B, ...] arrays, either continuous values or values with many ties and zeros."""
  if shape is None:
    shape = draw(st.sampled_from(SHAPES))
  if draw(st.booleans()):
    elements = st.floats(-4.0, 4.0, **FINITE)
  else:
    elements = st.sampled_from(TIE_VALUES)
  return draw(hnp.arrays(np.float32, shape, elements=elements))


@st.composite
def radii(draw, v, name):
  """eps for the batch v: a float32 scalar or a float32 [B] vector.

  Mixes absolute radii, radii relative to the example's norm (so both inside and outside
  points occur) and exact zeros.
  """
  b = len(v)
  n = ref_norm(v, name)
  kind = draw(st.sampled_from(["scalar", "vector", "relative", "zero"]))
  if kind == "scalar":
    return np.float32(draw(st.floats(0.0, 6.0, **FINITE)))
  if kind == "zero":
    return draw(st.sampled_from([np.float32(0.0), np.zeros((b,), np.float32)]))
  if kind == "vector":
    return draw(hnp.arrays(np.float32, (b,), elements=st.floats(0.0, 6.0, **FINITE)))
  factors = draw(hnp.arrays(np.float64, (b,), elements=st.floats(0.0, 1.5)))
  return (factors * n).astype(np.float32)


def tol(v, eps):
  """Absolute tolerance for float32 against float64: 1e-5 relative to the data's scale."""
  return 1e-5 * (1.0 + float(np.abs(v).max(initial=0.0)) + float(np.max(eps)))


# ---------------------------------------------------------------------------------------------
# check_norm and norm


def test_norms_constant():
  assert P.NORMS == NORMS


@pytest.mark.parametrize("bad", ["l3", "L2", "Linf", "", "inf", None, 2])
def test_unknown_norm_raises(bad):
  with pytest.raises(ValueError, match="'linf', 'l2', 'l1'"):
    P.check_norm(bad)
  v = np.ones((2, 3), np.float32)
  with pytest.raises(ValueError, match="Unknown norm"):
    P.norm(v, bad)
  with pytest.raises(ValueError, match="Unknown norm"):
    P.project(v, 1.0, bad)
  with pytest.raises(ValueError, match="Unknown norm"):
    P.sample_ball(jax.random.key(0), (2, 3), 1.0, bad)


def test_unknown_norm_raises_inside_jit():
  with pytest.raises(ValueError, match="Unknown norm"):
    jax.jit(lambda d: P.project(d, 1.0, "l4"))(np.ones((2, 3), np.float32))


@pytest.mark.parametrize("name", NORMS)
def test_check_norm_returns_name(name):
  assert P.check_norm(name) == name


@pytest.mark.parametrize("name", NORMS)
@given(data=st.data())
def test_norm_matches_numpy(name, data):
  v = data.draw(deltas())
  out = norm(v, name)
  assert out.shape == (len(v),)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, ref_norm(v, name), rtol=1e-6, atol=1e-6)


def test_norm_explicit_values():
  v = np.zeros((4, 12), np.float32)
  v[0, :2] = [3.0, -4.0]
  v[2, :2] = [-1.0, 1.0]
  v[3, :] = 0.5
  np.testing.assert_array_equal(norm(v, "linf"), [4.0, 0.0, 1.0, 0.5])
  l2 = np.sqrt(np.array([25.0, 0.0, 2.0, 3.0])).astype(np.float32)
  np.testing.assert_array_equal(norm(v, "l2"), l2)
  np.testing.assert_array_equal(norm(v, "l1"), [7.0, 0.0, 2.0, 6.0])
  # Eager, on a trailing shape.
  np.testing.assert_array_equal(P.norm(v.reshape(4, 3, 4), "l1"), [7.0, 0.0, 2.0, 6.0])


def test_l2_norm_gradient_at_zero_is_finite():
  g = jax.jit(jax.grad(lambda d: P.norm(d, "l2").sum()))(np.zeros((2, 2, 3), np.float32))
  np.testing.assert_array_equal(g, np.zeros((2, 2, 3)))


# ---------------------------------------------------------------------------------------------
# dual_norm


@pytest.mark.parametrize("name", NORMS)
def test_dual_norm_is_the_support_function_of_the_unit_ball(name):
  """``dual_norm(w) = max_{||d||_p <= 1} <w, d>`` over the last axis: NumPy's norm of the dual
  order, attained by the steepest direction of the attack norm (Hölder's inequality is tight)."""
  rng = np.random.default_rng(0)
  w = rng.normal(size=(3, 4, 7)).astype(np.float32)  # [K, B, D]: a stack of flattened gradients
  w[0, 0] = 0.0
  out = np.asarray(P.dual_norm(w, name))
  assert out.shape == (3, 4) and out.dtype == np.float32
  order = {"linf": 1, "l2": 2, "l1": np.inf}[name]
  np.testing.assert_allclose(out, np.linalg.norm(w.astype(np.float64), ord=order, axis=-1),
                             rtol=1e-6)
  flat = w.reshape(-1, 7).astype(np.float64)
  if name == "linf":
    steepest = np.sign(flat)
  elif name == "l2":
    steepest = flat / np.maximum(np.linalg.norm(flat, axis=1, keepdims=True), 1e-300)
  else:
    steepest = np.sign(flat) * (np.abs(flat) == np.abs(flat).max(axis=1, keepdims=True))
    steepest /= np.maximum(np.abs(steepest).sum(axis=1, keepdims=True), 1)
  assert np.all(ref_norm(steepest, name) <= 1 + 1e-12)
  np.testing.assert_allclose(np.sum(flat * steepest, axis=1), out.reshape(-1), rtol=1e-6)
  # Any other point of the unit ball does no better.
  others = rng.normal(size=(64, 7))
  others /= ref_norm(others, name)[:, None]
  assert np.all(others @ flat.T <= out.reshape(-1)[None, :] * (1 + 1e-6) + 1e-12)


def test_dual_norm_l2_gradient_at_zero_is_finite_and_unknown_norm_raises():
  g = jax.jit(jax.grad(lambda w: P.dual_norm(w, "l2").sum()))(np.zeros((2, 3), np.float32))
  np.testing.assert_array_equal(g, np.zeros((2, 3)))
  with pytest.raises(ValueError, match="Unknown norm"):
    P.dual_norm(np.ones((2, 3), np.float32), "l0")


# ---------------------------------------------------------------------------------------------
# project: against the references


@pytest.mark.parametrize("name", NORMS)
@given(data=st.data())
def test_project_matches_reference(name, data):
  v = data.draw(deltas())
  eps = data.draw(radii(v, name))
  out = project(v, eps, name)
  assert out.shape == v.shape and out.dtype == jnp.float32
  expected = ref_project(v, eps, name)
  np.testing.assert_allclose(out, expected, rtol=0, atol=tol(v, eps))
  assert_inside(np.asarray(out), eps, name)
  assert np.all(np.isfinite(out))


@pytest.mark.parametrize("name", NORMS)
@given(data=st.data())
def test_project_inside_is_bitwise_identity(name, data):
  v = data.draw(deltas())
  factor = data.draw(st.floats(1.001, 3.0))
  eps = (ref_norm(v, name) * factor).astype(np.float32)
  if data.draw(st.booleans()):
    eps = eps.max()
  out = np.asarray(project(v, eps, name))
  np.testing.assert_array_equal(out.view(np.uint32), v.view(np.uint32))


# The explicit tests reuse the shapes of SHAPES and float32 eps (scalar or [B]), so that the
# jitted `project` is already compiled for them.


@pytest.mark.parametrize("name", NORMS)
def test_project_on_boundary_is_identity(name):
  v = np.random.default_rng(4).standard_normal((4, 12)).astype(np.float32)
  v[1] = 0.0
  out = project(v, np.asarray(norm(v, name)), name)
  np.testing.assert_array_equal(out, v)


ROWS = np.array([[0.3, -1.7, 2.2, 0.0, 1.0, -1.0], [0.0] * 6], np.float32).reshape(2, 2, 3)


@pytest.mark.parametrize("name", NORMS)
def test_project_infinite_eps_is_identity(name):
  np.testing.assert_array_equal(project(ROWS, np.float32(np.inf), name), ROWS)
  np.testing.assert_array_equal(P.project(ROWS, float("inf"), name), ROWS)  # eager, Python float


@pytest.mark.parametrize("name", NORMS)
def test_project_zero_eps_and_zero_vector(name):
  out = project(ROWS, np.float32(0.0), name)
  np.testing.assert_array_equal(out, np.zeros(ROWS.shape))
  out = project(np.zeros_like(ROWS), np.array([0.0, 1.0], np.float32), name)
  np.testing.assert_array_equal(out, np.zeros(ROWS.shape))
  out = project(ROWS, np.array([0.0, 0.5], np.float32), name)
  np.testing.assert_array_equal(out[0], np.zeros(ROWS.shape[1:]))
  np.testing.assert_array_equal(out[1], np.zeros(ROWS.shape[1:]))


@pytest.mark.parametrize("name", NORMS)
def test_project_gradients_are_finite(name):
  """The unused branches never produce inf or NaN, even in gradients (eps = 0, inf; v = 0)."""
  grad = jax.jit(jax.grad(lambda d, e: P.project(d, e, name).sum()))
  np.testing.assert_array_equal(grad(ROWS, np.float32(np.inf)), np.ones(ROWS.shape))
  for eps in (0.0, 1.0, np.inf):
    assert np.all(np.isfinite(grad(np.zeros_like(ROWS), np.float32(eps))))
    assert np.all(np.isfinite(grad(ROWS, np.float32(eps))))


def padded(rows):
  """[4, 12] float32 with the given rows (zero padding does not change any projection)."""
  out = np.zeros((4, 12), np.float32)
  for i, r in enumerate(rows):
    out[i, : len(r)] = r
  return out


def test_project_l1_known_values():
  v = padded([[3.0, 1.0, -2.0], [1.0, 1.0, 1.0], [2.0, -2.0, 0.0], [4.0, 1.0]])
  out = project(v, np.array([2.0, 1.5, 1.0, 2.0], np.float32), "l1")
  # The last row is [1.6, 0.4] for a rescaling.
  expected = padded([[1.5, 0.0, -0.5], [0.5, 0.5, 0.5], [0.5, -0.5, 0.0], [2.0, 0.0]])
  np.testing.assert_allclose(out, expected, rtol=0, atol=1e-7)


def test_project_l1_ties_at_threshold():
  v = padded([[1.0, 1.0, 1.0, 1.0], [2.0, 1.0, 1.0, -1.0], [1.0, -1.0, 1.0, -1.0], [0.5] * 12])
  out = np.asarray(project(v, np.array([1e-9, 1.0, 2.0, 3.0], np.float32), "l1"))
  np.testing.assert_allclose(out[0], padded([[2.5e-10] * 4])[0], rtol=1e-5, atol=0)
  np.testing.assert_allclose(out[1:], padded([[1.0], [0.5, -0.5, 0.5, -0.5], [0.25] * 12])[:3],
                             rtol=0, atol=1e-7)


def test_project_l1_tiny_eps_on_large_vector():
  """Cancellation in (cumsum - eps): the result still has norm eps to float32 precision."""
  rng = np.random.default_rng(0)
  v = (rng.standard_normal((8, 500)) * 100.0).astype(np.float32)
  v[:, :3] = 250.0  # ties at the top
  eps = np.array([1e-6, 1e-4, 1e-2, 1.0, 10.0, 100.0, 1e3, 1e4], np.float32)
  out = np.asarray(project(v, eps, "l1"))
  np.testing.assert_allclose(ref_norm(out, "l1"), eps, rtol=1e-6)
  expected = ref_project(v, eps, "l1")
  np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6 * 250.0)
  assert_inside(out, eps, "l1")


@pytest.mark.parametrize("name", NORMS)
def test_project_preserves_dtype(name):
  v = ROWS.astype(jnp.bfloat16)
  out = project(v, np.array([1.0, 10.0], np.float32), name)
  assert out.dtype == jnp.bfloat16
  assert np.all(ref_norm(np.asarray(out).astype(np.float32), name) <= np.array([1.0, 10.0]) * 1.02)


@pytest.mark.parametrize("name", NORMS)
def test_bad_eps_shape_raises(name):
  with pytest.raises(ValueError, match="eps"):
    P.project(ROWS, np.ones((2, 1), np.float32), name)
  with pytest.raises(ValueError, match="3 entries"):
    P.project(ROWS, np.ones((3,), np.float32), name)
  with pytest.raises(ValueError, match="3 entries"):
    P.sample_ball(jax.random.key(0), (2, 5), np.ones((3,), np.float32), name)


@pytest.mark.parametrize("name", NORMS)
def test_negative_or_nan_eps_raises_when_concrete(name):
  """A negative radius is an empty ball: each norm's formula would return a different wrong
  point. Concrete radii are refused; ``inf`` and 0 are legitimate."""
  x = np.full(ROWS.shape, 0.5, np.float32)
  with pytest.raises(ValueError, match="eps must be >= 0.*min -0.1"):
    P.project(ROWS, np.array([1.0, -0.1], np.float32), name)
  with pytest.raises(ValueError, match="NaN: 1 entries"):
    P.project(ROWS, float("nan"), name)
  with pytest.raises(ValueError, match="eps must be >= 0"):
    P.sample_ball(jax.random.key(0), (2, 5), -1.0, name)
  with pytest.raises(ValueError, match="eps must be >= 0"):
    P.project_l1_box(ROWS, x, -1.0, 0.0, 1.0)
  np.testing.assert_array_equal(P.project(ROWS, np.array([0.0, np.inf], np.float32), name)[1],
                                ROWS[1])
  # Traced radii are not checked here (the attacks' front doors check eps): no error.
  jax.jit(lambda d, e: P.project(d, e, name))(ROWS, jnp.float32(-1.0))


# ---------------------------------------------------------------------------------------------
# project: properties


@pytest.mark.parametrize("name", NORMS)
@given(data=st.data())
def test_project_is_idempotent(name, data):
  v = data.draw(deltas())
  eps = data.draw(radii(v, name))
  once = project(v, eps, name)
  twice = project(once, eps, name)
  np.testing.assert_allclose(twice, once, rtol=0, atol=1e-6 * (1.0 + float(np.max(eps))))


@pytest.mark.parametrize("name", NORMS)
@given(data=st.data())
def test_project_is_non_expansive(name, data):
  a = data.draw(deltas())
  b = data.draw(deltas(shape=a.shape))
  eps = data.draw(radii(a, name))
  pa = np.asarray(project(a, eps, name), np.float64)
  pb = np.asarray(project(b, eps, name), np.float64)
  lhs = ref_norm(pa - pb, "l2")
  rhs = ref_norm(a.astype(np.float64) - b, "l2")
  assert np.all(lhs <= rhs + tol(np.concatenate([a, b]), eps)), (lhs, rhs)


@pytest.mark.parametrize("name", NORMS)
def test_project_jit_does_not_retrace_when_eps_changes(name):
  v = np.random.default_rng(1).standard_normal((4, 2, 3)).astype(np.float32)
  traces = []
  chex.clear_trace_counter()

  @jax.jit
  @chex.assert_max_traces(n=2)
  def f(d, e):
    traces.append(e.shape)
    return P.project(d, e, name)

  for e in (0.1, 0.5, 2.0, 0.0):
    out = f(v, np.float32(e))
    np.testing.assert_allclose(out, ref_project(v, e, name), rtol=0, atol=1e-5)
  for e in ([0.1, 0.2, 0.3, 0.4], [1.0, 0.0, 5.0, 0.5]):
    e = np.asarray(e, np.float32)
    out = f(v, e)
    np.testing.assert_allclose(out, ref_project(v, e, name), rtol=0, atol=1e-5)
  assert traces == [(), (4,)]  # one trace per eps shape, none per eps value


@pytest.mark.parametrize("name", NORMS)
def test_project_vmap_over_eps(name):
  v = np.random.default_rng(2).standard_normal((4, 12)).astype(np.float32)
  grid = np.array([0.0, 0.25, 1.0, 4.0], np.float32)
  over_eps = jax.jit(jax.vmap(lambda e: P.project(v, e, name)))
  out = np.asarray(over_eps(grid))
  assert out.shape == (4, 4, 12)
  for k in range(len(grid)):  # equal up to the order of float32 reductions
    np.testing.assert_allclose(out[k], project(v, grid[k], name), rtol=1e-6, atol=1e-7)
  # A grid of per-example eps vectors, and vmap over examples with per-example eps.
  eps = np.array([0.3, 1.0, 0.0, 2.0], np.float32)
  out = np.asarray(over_eps(np.stack([eps, 2 * eps])))
  np.testing.assert_allclose(out[1], project(v, 2 * eps, name), rtol=1e-6, atol=1e-7)
  per_ex = jax.jit(jax.vmap(lambda d, e: P.project(d[None], e, name)[0]))(v, eps)
  np.testing.assert_allclose(per_ex, project(v, eps, name), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", NORMS)
def test_project_inside_scan(name):
  v = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)

  def body(d, e):
    d = P.project(d * 2.0, e, name)
    return d, P.norm(d, name)

  run = jax.jit(lambda d, es: jax.lax.scan(body, d, es))
  final, norms = run(v, np.array([3.0, 2.0, 1.0, 0.5], np.float32))
  assert final.shape == v.shape
  np.testing.assert_allclose(norms[-1], [0.5, 0.5], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# project_box


@given(data=st.data())
def test_project_box_unit_interval(data):
  shape = data.draw(st.sampled_from(SHAPES))
  x = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(0.0, 1.0, **FINITE)))
  d = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(-2.0, 2.0, **FINITE)))
  out = np.asarray(project_box(d, x, np.float32(0.0), np.float32(1.0)))
  assert out.dtype == np.float32
  y = x + out  # float32, as an attack would form x_adv
  assert np.all((y >= 0.0) & (y <= 1.0))
  np.testing.assert_array_equal(out, np.clip(x + d, np.float32(0), np.float32(1)) - x)
  inside = (x + d >= 0.0) & (x + d <= 1.0)
  np.testing.assert_allclose(out[inside], d[inside], rtol=0, atol=2.0**-23)


@given(data=st.data())
def test_project_box_general_bounds(data):
  lo = data.draw(st.floats(-3.0, 2.0, **FINITE))
  hi = float(np.float32(lo + data.draw(st.floats(0.0, 4.0, **FINITE))))
  shape = data.draw(st.sampled_from(SHAPES))
  x = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(lo, hi, **FINITE)))
  d = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(-8.0, 8.0, **FINITE)))
  out = np.asarray(project_box(d, x, np.float32(lo), np.float32(hi)))
  y = x + out
  ulp = 4 * np.spacing(np.float32(max(abs(lo), abs(hi), 1.0)))
  assert np.all((y >= np.float32(lo) - ulp) & (y <= np.float32(hi) + ulp))


def test_project_box_identity_when_inside_exact():
  # Dyadic values, so that (x + d) - x == d exactly.
  x = np.array([0.25, 0.5, 0.75, 0.0, 1.0, 0.5, 1.0, 0.0, 0.125, 0.5, 0.5, 0.5], np.float32)
  d = np.array([0.125, -0.5, 0.25, 0.0, -0.0625, 0.5, 0.0, 1.0, -0.125, 0.5, 0.5, -0.5], np.float32)
  x, d = x.reshape(2, 2, 3), d.reshape(2, 2, 3)
  np.testing.assert_array_equal(project_box(d, x, np.float32(0.0), np.float32(1.0)), d)
  np.testing.assert_array_equal(P.project_box(d, x, 0.0, 1.0), d)  # eager, Python floats


def test_project_box_rejects_non_scalar_bounds():
  with pytest.raises(ValueError, match="scalars"):
    P.project_box(ROWS, ROWS, np.zeros((3,), np.float32), 1.0)


# ---------------------------------------------------------------------------------------------
# sample_ball


# The tests below share one shape so that sample_ball compiles as few times as possible.
BALL_SHAPE = (16, 4, 50)  # D = 200


@pytest.mark.parametrize("name", NORMS)
def test_sample_ball_inside_with_per_example_eps(name):
  eps = np.geomspace(1e-3, 10.0, 16).astype(np.float32)
  eps[0] = 0.0
  s = np.asarray(sample_ball(jax.random.key(0), BALL_SHAPE, eps, name))
  assert s.shape == BALL_SHAPE and s.dtype == jnp.float32
  assert np.all(np.isfinite(s))
  assert_inside(np.asarray(s), np.asarray(eps), name)
  np.testing.assert_array_equal(s[0], np.zeros(BALL_SHAPE[1:]))
  # In D = 200 dimensions nearly all the volume is near the surface, so each example's norm is
  # close to its own eps (and not to another example's).
  ratio = ref_norm(s[1:], name) / np.asarray(eps[1:], np.float64)
  assert np.all(ratio > 0.9), ratio


@pytest.mark.parametrize("name", NORMS)
def test_sample_ball_keys_and_scalar_eps(name):
  a = sample_ball(jax.random.key(7), BALL_SHAPE, 0.5, name)
  b = sample_ball(jax.random.key(7), BALL_SHAPE, 0.5, name)
  c = sample_ball(jax.random.key(8), BALL_SHAPE, 0.5, name)
  np.testing.assert_array_equal(a, b)
  assert np.mean(np.asarray(a) == np.asarray(c)) < 0.01
  assert_inside(np.asarray(a), 0.5, name)
  assert_inside(np.asarray(c), 0.5, name)
  raw = jax.random.PRNGKey(7)  # a raw uint32 [2] key gives the same draws as its typed form
  r = sample_ball(raw, BALL_SHAPE, 0.5, name)
  typed = jax.random.wrap_key_data(raw)
  np.testing.assert_array_equal(r, sample_ball(typed, BALL_SHAPE, 0.5, name))


@pytest.mark.parametrize("name", NORMS)
def test_sample_ball_dtype(name):
  h = sample_ball(jax.random.key(0), BALL_SHAPE, 0.5, name, dtype=jnp.bfloat16)
  assert h.dtype == jnp.bfloat16 and h.shape == BALL_SHAPE
  assert np.all(ref_norm(np.asarray(h).astype(np.float32), name) <= 0.5 * 1.02)


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("dim", [2, 3])
def test_sample_ball_radial_distribution(name, dim):
  """P(||s|| <= r eps) = r^D for a uniform ball; a sphere, a cube or radius eps*u all fail."""
  n = 40_000
  eps = 2.0
  s = np.asarray(sample_ball(jax.random.key(dim), (n, dim), eps, name), np.float64)
  radius = ref_norm(s, name) / eps
  for r in (0.25, 0.5, 0.75, 0.9):
    assert abs(np.mean(radius <= r) - r**dim) < 0.015, (r, np.mean(radius <= r))
  np.testing.assert_allclose(s.mean(axis=0), np.zeros(dim), atol=0.03 * eps)
  np.testing.assert_allclose(np.mean(s > 0, axis=0), np.full(dim, 0.5), atol=0.015)


def test_sample_ball_angular_distribution_2d():
  """Directions are uniform: Gaussian-in-L1 or cube-normalised directions would fail."""
  n = 40_000
  s = np.asarray(sample_ball(jax.random.key(11), (n, 2), 1.0, "l2"), np.float64)
  near_axis = np.abs(s[:, 1]) < np.tan(np.pi / 8) * np.abs(s[:, 0])  # 1/4 of all angles
  assert abs(near_axis.mean() - 0.25) < 0.015
  s = np.asarray(sample_ball(jax.random.key(12), (n, 2), 1.0, "l1"), np.float64)
  share = np.abs(s[:, 0]) / np.abs(s).sum(axis=1)  # uniform on [0, 1] along each face
  for q in (0.1, 0.25, 0.5):
    assert abs(np.mean(share <= q) - q) < 0.015


def test_sample_ball_rejects_empty_shape():
  with pytest.raises(ValueError, match="batch"):
    P.sample_ball(jax.random.key(0), (), 1.0, "l2")


# ---------------------------------------------------------------------------------------------
# project_l1_box: the exact projection onto {||w||_1 <= eps} ∩ {lower <= x + w <= upper}

project_l1_box = jax.jit(P.project_l1_box)


def ref_l1_box_one(v, x, eps, lower, upper):
  """float64 projection of one flat vector, by bisection on the multiplier of the L1 constraint.

  Independent of the library's sort-based walk: for a multiplier lam the KKT point is
  clip(sign(v) max(|v| - lam, 0), lower - x, upper - x), whose L1 norm is non-increasing in lam.
  """
  lo, hi = lower - x, upper - x
  w = lambda lam: np.clip(np.sign(v) * np.maximum(np.abs(v) - lam, 0.0), lo, hi)
  if np.abs(w(0.0)).sum() <= eps:
    return w(0.0)
  a, b = 0.0, float(np.abs(v).max())
  for _ in range(200):
    mid = 0.5 * (a + b)
    if np.abs(w(mid)).sum() > eps:
      a = mid
    else:
      b = mid
    if b - a <= 1e-12 * max(1.0, b):
      break
  return w(0.5 * (a + b))


def ref_project_l1_box(v, x, eps, lower=0.0, upper=1.0):
  v64, x64 = np.asarray(v, np.float64), np.asarray(x, np.float64)
  eps64 = np.broadcast_to(np.asarray(eps, np.float64), (len(v64),))
  out = np.empty_like(v64)
  for i in range(len(v64)):
    out[i] = ref_l1_box_one(v64[i].ravel(), x64[i].ravel(), float(eps64[i]), lower,
                            upper).reshape(v64.shape[1:])
  return out


@st.composite
def box_points(draw, shape):
  """x in [0, 1]: continuous values, or many points exactly on the faces and at the centre."""
  if draw(st.booleans()):
    elements = st.floats(0.0, 1.0, **FINITE)
  else:
    elements = st.sampled_from([0.0, 0.0, 1.0, 1.0, 0.5, 0.25])
  return draw(hnp.arrays(np.float32, shape, elements=elements))


@st.composite
def l1_box_radii(draw, v, x):
  """eps relative to the L1 norm of the box projection (inside and outside), zero, or huge."""
  b = len(v)
  room = ref_norm(np.clip(v.astype(np.float64), -x, 1.0 - x), "l1")
  kind = draw(st.sampled_from(["relative", "relative", "zero", "scalar", "huge"]))
  if kind == "zero":
    return draw(st.sampled_from([np.float32(0.0), np.zeros((b,), np.float32)]))
  if kind == "scalar":
    return np.float32(draw(st.floats(0.0, 6.0, **FINITE)))
  if kind == "huge":  # larger than the box allows: the answer is the box projection
    return np.full((b,), 1e3, np.float32)
  factors = draw(hnp.arrays(np.float64, (b,), elements=st.floats(0.0, 1.5)))
  return (factors * room).astype(np.float32)


@given(data=st.data())
def test_project_l1_box_matches_reference(data):
  v = data.draw(deltas())
  x = data.draw(box_points(v.shape))
  eps = data.draw(l1_box_radii(v, x))
  out = np.asarray(project_l1_box(v, x, eps, 0.0, 1.0))
  assert out.shape == v.shape and out.dtype == np.float32
  np.testing.assert_allclose(out, ref_project_l1_box(v, x, eps), rtol=0, atol=tol(v, eps))
  assert_inside(out, eps, "l1")
  assert np.all(x + out >= 0.0) and np.all(x + out <= 1.0)
  # Idempotent: projecting the projection changes nothing (up to rounding).
  again = np.asarray(project_l1_box(out, x, eps, 0.0, 1.0))
  np.testing.assert_allclose(again, out, rtol=0, atol=1e-6 * (1.0 + float(np.max(eps))))


@given(data=st.data())
def test_project_l1_box_equals_project_when_box_is_inactive(data):
  """With x at the centre of a box wider than any coordinate of v, only the ball binds."""
  v = data.draw(deltas())
  eps = data.draw(radii(v, "l1"))
  x = np.zeros_like(v)
  out = np.asarray(project_l1_box(v, x, eps, -5.0, 5.0))
  np.testing.assert_allclose(out, project(v, eps, "l1"), rtol=0, atol=tol(v, eps))


def test_project_l1_box_is_not_project_then_clip():
  """The box cuts 0.9 of the first coordinate; the exact projection spends it on the others."""
  v = np.array([[1.0, 0.5, 0.25, 0.0]], np.float32)
  x = np.array([[0.9, 0.5, 0.5, 0.5]], np.float32)
  out = np.asarray(project_l1_box(v, x, 0.6, 0.0, 1.0))
  # lam solves 0.1 + (0.5 - lam) + max(0.25 - lam, 0) = 0.6: lam = 0.125.
  np.testing.assert_allclose(out, [[0.1, 0.375, 0.125, 0.0]], atol=1e-7)
  clipped = np.clip(np.asarray(project(v, 0.6, "l1")), -x, 1.0 - x)
  assert np.abs(clipped).sum() < 0.45  # project-then-clip wastes budget and is far off
  assert np.abs(clipped - out).max() > 0.1


def test_project_l1_box_large_vector_small_eps():
  """||clip(v)||_1 >> eps (a random start): the cancellation is corrected to float32 precision."""
  rng = np.random.default_rng(0)
  v = (rng.standard_normal((6, 3072)) * 10.0).astype(np.float32)
  x = rng.uniform(0, 1, size=(6, 3072)).astype(np.float32)
  x[:, :500] = 1.0  # on the upper face
  eps = np.array([1e-4, 1e-2, 1.0, 12.0, 100.0, 1e3], np.float32)
  out = np.asarray(project_l1_box(v, x, eps, 0.0, 1.0))
  expected = ref_project_l1_box(v, x, eps)
  np.testing.assert_allclose(ref_norm(out, "l1"), ref_norm(expected, "l1"), rtol=1e-5)
  np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)
  assert np.all(out[:, :500] <= 0.0)


def test_project_l1_box_per_example_eps_bounds_and_zero():
  v = np.array([[2.0, -3.0, 0.5], [1.0, 1.0, 1.0]], np.float32).reshape(2, 3, 1)
  x = np.full((2, 3, 1), 0.5, np.float32)
  out = np.asarray(project_l1_box(v, x, np.array([0.0, 0.75], np.float32), -1.0, 1.0))
  np.testing.assert_array_equal(out[0], np.zeros((3, 1)))
  np.testing.assert_allclose(out[1].ravel(), [0.25, 0.25, 0.25], atol=1e-7)
  with pytest.raises(ValueError, match="scalars"):
    P.project_l1_box(v, x, 1.0, np.zeros(2), 1.0)
  with pytest.raises(ValueError, match="3 entries"):
    P.project_l1_box(v, x, np.ones(3, np.float32), 0.0, 1.0)
