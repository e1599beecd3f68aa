"""Losses against NumPy formulas, their invariances, and label look-ups on sharded batches."""

from __future__ import annotations

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
    return ([getattr(jr.losses, n)(z, y) for n in names]
            + [getattr(jr.losses, n)(z, y, t) for n in tnames])

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
