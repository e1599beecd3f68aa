"""Test configuration: 8 CPU devices and strict promotion, set before any JAX operation."""

import os

os.environ.setdefault("XLA_FLAGS", "")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("jaxrobust", max_examples=60, deadline=None, derandomize=True)
settings.load_profile("jaxrobust")


@pytest.fixture(scope="session")
def devices():
  return jax.devices()
