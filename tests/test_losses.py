"""Losses against NumPy formulas, their invariances, and label look-ups on sharded batches."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxrobust as jr

rng = np.random.default_rng(0)
Z = rng.normal(size=(16, 10)).astype(np.float32) * 3
Y = rng.integers(0, 10, 16).astype(np.int32)
T = ((Y + rng.integers(1, 10, 16)) % 10).astype(np.int32)
ROWS = np.arange(16)


def _np_reference():
  z = Z.astype(np.float64)
  zy, zt = z[ROWS, Y], z[ROWS, T]
  lse = np.log(np.exp(z).sum(1))
  other = np.where(np.arange(10)[None] == Y[:, None], -np.inf, z).max(1)
  other_t = np.where(np.arange(10)[None] == T[:, None], -np.inf, z).max(1)
  s = -np.sort(-z, axis=1)
  return {
      "cross_entropy": lse - zy,
      "margin": other - zy,
      "dlr": -(zy - other) / (s[:, 0] - s[:, 2] + 1e-12),
      "targeted_cross_entropy": zt - lse,
      "targeted_margin": zt - other_t,
      "targeted_dlr": -(zy - zt) / (s[:, 0] - 0.5 * (s[:, 2] + s[:, 3]) + 1e-12),
  }


@pytest.mark.parametrize("name", sorted(_np_reference()))
def test_losses_match_numpy(name):
  fn = getattr(jr.losses, name)
  args = (Z, Y, T) if name.startswith("targeted") else (Z, Y)
  out = fn(*map(jnp.asarray, args))
  assert out.shape == (16,)
  np.testing.assert_allclose(np.asarray(out), _np_reference()[name], rtol=2e-5, atol=2e-5)


def test_dlr_is_invariant_to_shift_and_positive_scale():
  z, y, t = jnp.asarray(Z), jnp.asarray(Y), jnp.asarray(T)
  for fn, args in ((jr.losses.dlr, (y,)), (jr.losses.targeted_dlr, (y, t))):
    base = fn(z, *args)
    np.testing.assert_allclose(np.asarray(fn(z * 7.0 + 3.0, *args)), np.asarray(base),
                               rtol=1e-4, atol=1e-5)


def _tied_logits(classes: int, rows: int = 24, seed: int = 0) -> np.ndarray:
  """``[rows, classes]`` float32 logits full of ties: small integers, equal rows, ``+-inf``,
  ``-0.0`` beside ``+0.0``, and a few rows of distinct values."""
  rng = np.random.default_rng(seed)
  z = rng.integers(-2, 3, size=(rows, classes)).astype(np.float32)
  z[:3] = rng.normal(size=(3, classes)) * 3
  z[3] = 1.5  # all tied
  z[4] = -np.inf
  z[4, -1] = 2.0  # one finite logit, the rest -inf
  z[5] = 0.0
  z[5, ::2] = -0.0  # total order: -0.0 < +0.0
  z[6, :2] = np.inf
  z[7, 1] = -np.inf
  z[8, : min(4, classes)] = 7.0  # the top 4 tied
  return z


def _labels_and_targets(classes: int, rows: int = 24, seed: int = 1):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, classes, rows).astype(np.int32)
  return y, ((y + rng.integers(1, classes, rows)) % classes).astype(np.int32)


def _numpy_dlrs(z: np.ndarray, y: np.ndarray, t: np.ndarray) -> dict[str, np.ndarray]:
  """DLR and targeted DLR in float32 NumPy, the top logits by a full sort."""
  rows, columns = np.arange(len(z)), np.arange(z.shape[1])
  top = -np.sort(-z, axis=1)  # decreasing, equal values counted apart
  zy, zt = z[rows, y], z[rows, t]
  other = np.where(columns[None] == y[:, None], -np.inf, z).max(1).astype(np.float32)
  tiny, half = np.float32(1e-12), np.float32(0.5)
  with np.errstate(invalid="ignore", divide="ignore"):
    out = {"dlr": (other - zy) / (top[:, 0] - top[:, 2] + tiny)}
    if z.shape[1] >= 4:
      out["targeted_dlr"] = -(zy - zt) / (top[:, 0] - half * (top[:, 2] + top[:, 3]) + tiny)
  return out


def _top_k_dlr(z, y):
  """The former formulation (``lax.top_k``), kept as the reference for values and gradients."""
  top = jax.lax.top_k(z, 3)[0]
  return jr.losses.margin(z, y) / (top[:, 0] - top[:, 2] + 1e-12)


def _top_k_targeted_dlr(z, y, t):
  top = jax.lax.top_k(z, 4)[0]
  gap = jr.losses.label_logit(z, y) - jr.losses.label_logit(z, t)
  return -gap / (top[:, 0] - 0.5 * (top[:, 2] + top[:, 3]) + 1e-12)


@functools.lru_cache
def _dlr_values_and_grads(classes: int):
  """One compiled program per class count: both DLRs, new and former, values and gradients."""
  pairs = {"dlr": (jr.losses.dlr, _top_k_dlr, 1)}
  if classes >= 4:
    pairs["targeted_dlr"] = (jr.losses.targeted_dlr, _top_k_targeted_dlr, 2)

  def run(z, y, t):
    out = {}
    for name, (new, former, extra) in pairs.items():
      for tag, fn in (("new", new), ("former", former)):
        loss = lambda z, fn=fn, extra=extra: fn(z, *(y, t)[:extra])
        out[name, tag] = (loss(z), jax.grad(lambda z, loss=loss: jnp.sum(loss(z)))(z))
    return out

  return jax.jit(run, compiler_options={"xla_backend_optimization_level": 0})


def _bits(a) -> np.ndarray:
  """float32 bits, so that equality is bitwise (every NaN payload and the sign of zero)."""
  return np.asarray(a, np.float32).view(np.int32)


@pytest.mark.parametrize("classes", [3, 4, 10, 100])
def test_dlr_top_logits_without_sort_match_sorting_references(classes):
  """The masked-argmax top logits give DLR and targeted DLR bit for bit as the former
  ``lax.top_k`` formulation, values and gradients, on logits full of ties, and the values of an
  independent NumPy sort."""
  z = _tied_logits(classes)
  y, t = _labels_and_targets(classes)
  got = _dlr_values_and_grads(classes)(jnp.asarray(z), jnp.asarray(y), jnp.asarray(t))
  expected = _numpy_dlrs(z, y, t)
  assert sorted({name for name, _ in got}) == sorted(expected)
  for name, reference in expected.items():
    (value, grad), (former_value, former_grad) = got[name, "new"], got[name, "former"]
    np.testing.assert_array_equal(_bits(value), _bits(former_value), err_msg=name)
    np.testing.assert_array_equal(_bits(grad), _bits(former_grad), err_msg=name)
    np.testing.assert_array_equal(np.asarray(value), reference, err_msg=name)
    assert np.isfinite(np.asarray(value)[:4]).all() and np.isfinite(np.asarray(grad)[:3]).all()


def test_dlr_orders_nan_logits_as_top_k_does():
  """``lax.top_k`` orders by IEEE total order (a negative NaN below ``-inf``, a positive one
  above ``+inf``); the masked maxima keep that order, so the same rows come out NaN."""
  z = _tied_logits(10)
  z[9, 3] = np.nan
  z[10, 5] = -np.nan
  z[11, 0] = np.array(0xFFC00000, np.uint32).view(np.float32)  # x86's default NaN: negative
  z[12, 2] = np.array(0xFFFFFFFF, np.uint32).view(np.float32)  # the pattern keyed as its neighbour
  y, t = _labels_and_targets(10)
  got = _dlr_values_and_grads(10)(jnp.asarray(z), jnp.asarray(y), jnp.asarray(t))
  for name in ("dlr", "targeted_dlr"):
    (value, grad), (former_value, former_grad) = got[name, "new"], got[name, "former"]
    np.testing.assert_array_equal(_bits(value), _bits(former_value), err_msg=name)
    np.testing.assert_array_equal(_bits(grad), _bits(former_grad), err_msg=name)


def test_dlr_value_and_gradient_need_no_sort_gather_or_scatter():
  """APGD-T evaluates the targeted DLR and its gradient every step: the top logits come from
  masked maxima and one-hot look-ups, not from ``top_k``'s sort and its gradient's scatter."""
  z, y, t = jnp.asarray(Z), jnp.asarray(Y), jnp.asarray(T)
  for loss in (lambda z: jr.losses.dlr(z, y), lambda z: jr.losses.targeted_dlr(z, y, t)):
    program = str(jax.make_jaxpr(jax.value_and_grad(lambda z: jnp.sum(loss(z))))(z))
    assert not re.findall(r"\b(top_k|sort|gather|scatter[-\w]*)\b", program)


def test_dlr_class_count_errors():
  with pytest.raises(ValueError, match="dlr needs at least 3 classes, the model has 2"):
    jr.losses.dlr(jnp.zeros((2, 2)), jnp.zeros(2, jnp.int32))
  with pytest.raises(ValueError, match="targeted_dlr needs at least 4 classes, the model has 3"):
    jr.losses.targeted_dlr(jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32), jnp.ones(2, jnp.int32))
  with pytest.raises(ValueError, match=r"dlr: logits must be \[B, C\], got shape \(5,\)"):
    jr.losses.dlr(jnp.zeros(5), jnp.zeros(1, jnp.int32))


def test_margin_sign_is_misclassification():
  m = np.asarray(jr.losses.margin(jnp.asarray(Z), jnp.asarray(Y)))
  np.testing.assert_array_equal(m > 0, np.argmax(Z, 1) != Y)
  tm = np.asarray(jr.losses.targeted_margin(jnp.asarray(Z), jnp.asarray(Y), jnp.asarray(T)))
  np.testing.assert_array_equal(tm > 0, np.argmax(Z, 1) == T)


def test_resolve_names_and_functions():
  assert jr.losses.resolve("ce", False) is jr.losses.cross_entropy
  assert jr.losses.resolve("dlr", True) is jr.losses.targeted_dlr
  custom = lambda logits, labels: logits[:, 0]
  assert jr.losses.resolve(custom, False) is custom
  with pytest.raises(ValueError, match="Unknown loss"):
    jr.losses.resolve("xent", False)


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_label_lookups_work_on_batch_sharded_arrays(axis_type):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  mesh = jax.make_mesh((8,), ("batch",), axis_types=(axis_type,))
  names = ["cross_entropy", "margin", "dlr"]
  tnames = ["targeted_cross_entropy", "targeted_margin", "targeted_dlr"]

  def all_losses(z, y, t):
    # With the DLRs' gradients: the gradient of jnp.sort fails on batch-sharded logits under an
    # Explicit mesh; the top logits' one-hot look-ups must not.
    dlr_grads = [jax.grad(lambda z: jnp.sum(jr.losses.dlr(z, y)))(z),
                 jax.grad(lambda z: jnp.sum(jr.losses.targeted_dlr(z, y, t)))(z)]
    return ([getattr(jr.losses, n)(z, y) for n in names]
            + [getattr(jr.losses, n)(z, y, t) for n in tnames] + dlr_grads)

  expected = all_losses(jnp.asarray(Z), jnp.asarray(Y), jnp.asarray(T))
  with jax.set_mesh(mesh):
    put = lambda a: jax.device_put(jnp.asarray(a), NamedSharding(mesh, P("batch")))
    got = jax.jit(all_losses)(put(Z), put(Y), put(T))
    assert all(len(g.sharding.device_set) == 8 for g in got)
  for g, e in zip(got, expected):
    np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-6)


def test_numpy_int64_labels_need_no_conversion():
  """NumPy's default int64 labels, given eagerly, used to make JAX warn (an error under this
  suite's filterwarnings) that it truncates an int64 ``arange``; labels are converted first."""
  import warnings

  import jaxrobust as jr

  x = np.array([[0.2, 0.5, 0.3], [0.6, 0.3, 0.1]], np.float32)
  y = np.array([1, 0])  # int64
  assert y.dtype == np.int64
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    logits = jnp.asarray(x)
    np.testing.assert_allclose(jr.losses.margin(logits, y), [-0.2, -0.3], rtol=1e-6)  # z_j - z_y


@pytest.mark.parametrize("name", ["cross_entropy", "margin", "dlr", "probability_margin"])
def test_bad_labels_are_refused_not_read_as_a_zero_logit(name):
  """A label outside ``[0, C)`` matches no column of the one-hot look-up: ``z_y`` would read 0
  and the loss a wrong number. Concrete labels are range-checked; shapes and dtypes always are,
  also while tracing."""
  loss = getattr(jr.losses, name)
  z = jnp.asarray(Z[:2])
  with pytest.raises(ValueError, match=r"labels must lie in \[0, 10\).*got min 0, max 10"):
    loss(z, jnp.array([0, 10]))
  with pytest.raises(ValueError, match="got min -1, max 3"):
    loss(z, np.array([-1, 3]))
  with pytest.raises(ValueError, match="1-D int array"):
    loss(z, jnp.array([0.0, 1.0]))
  with pytest.raises(ValueError, match="Batch sizes differ: logits have 2 rows, labels has 3"):
    jax.jit(loss)(z, jnp.array([0, 1, 2]))
  # Traced labels cannot be range-checked; in-range ones give the eager answer.
  np.testing.assert_allclose(jax.jit(loss)(z, jnp.asarray(Y[:2])), loss(z, Y[:2]), rtol=1e-6)


def test_targeted_losses_check_their_target():
  z = jnp.asarray(Z[:2])
  with pytest.raises(ValueError, match=r"must lie in \[0, 10\)"):
    jr.losses.targeted_margin(z, jnp.asarray(Y[:2]), jnp.array([3, 12]))
  with pytest.raises(ValueError, match="Batch sizes differ"):
    jr.losses.targeted_cross_entropy(z, jnp.asarray(Y[:2]), jnp.array([3]))
