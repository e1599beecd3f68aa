"""The guards ``tests/conftest.py`` puts on every test: a program that closes over large arrays
fails, one that takes them as arguments does not; strict dtype and rank promotion; 8 devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import CAPTURED_CONSTANTS_LIMIT_BYTES

pytestmark = pytest.mark.skipif("jax_captured_constants_warn_bytes" not in jax.config.values,
                                reason="this jax release cannot count captured constants")


def _weights() -> jax.Array:
  side = int(np.sqrt(CAPTURED_CONSTANTS_LIMIT_BYTES / 4)) + 8  # float32: just over the limit
  return jnp.asarray(np.random.default_rng(0).normal(size=(side, side)), jnp.float32)


def test_weights_closed_over_fail_and_weights_as_arguments_do_not():
  w = _weights()
  x = jnp.ones((2, w.shape[0]), jnp.float32)
  with pytest.warns(UserWarning, match="constants were captured"):
    jax.jit(lambda x: x @ w).lower(x)
  jax.jit(lambda w, x: x @ w).lower(w, x)  # the suite's filter would turn a warning into an error


def test_strict_promotion_and_eight_devices():
  with pytest.raises(jax.dtypes.TypePromotionError):
    jnp.ones(2, jnp.float32) + jnp.ones(2, jnp.int32)
  with pytest.raises(ValueError):
    jnp.ones((2, 3)) + jnp.ones(3)
  assert jax.device_count() == 8
