"""The layout of ``jaxrobust.metrics`` (issue #25): modules share only public names, reducers
compute through one code path whose array namespace comes from the data (no ``np if host else
jnp``), and that one path gives NumPy int64-exact results for host sums and traces under ``jit``
for device sums."""

from __future__ import annotations

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import metrics
from jaxrobust.metrics import conventions

PACKAGE = pathlib.Path(metrics.__file__).parent
MODULES = sorted(PACKAGE.glob("*.py"))


def _trees():
  return {path.name: ast.parse(path.read_text()) for path in MODULES}


def test_metrics_modules_import_no_private_names():
  private = [f"{name}: from {node.module} import {alias.name}"
             for name, tree in _trees().items() for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxrobust")
             for alias in node.names if alias.name.startswith("_")]
  assert not private, "\n".join(private)


def _names(node) -> set[str]:
  return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def test_no_numpy_or_jax_branch_in_metrics():
  """``np if host else jnp`` (or the reverse) is the branch the namespace replaces."""
  found = [f"{name}:{node.lineno}" for name, tree in _trees().items() for node in ast.walk(tree)
           if isinstance(node, ast.IfExp)
           and {"np", "jnp"} <= _names(node.body) | _names(node.orelse)]
  assert not found, "NumPy/JAX branches: " + ", ".join(found)


def test_one_psum():
  """``jax.lax.psum`` is called in one place, ``metrics.psum``; ``Reducer.psum`` calls it."""
  calls = {path.name: path.read_text().count("lax.psum(") for path in MODULES}
  assert {name: n for name, n in calls.items() if n} == {"reducers.py": 1}
  rows = jnp.array([[True, False], [True, True]])
  per_row = jax.vmap(lambda f: metrics.Rate.from_flags(f).psum("rows"), axis_name="rows")(rows)
  assert per_row.hits.tolist() == [3, 3] and per_row.total.tolist() == [4, 4]


def test_array_namespace_follows_the_data():
  assert conventions.array_namespace(np.int64(2), np.zeros(3)) is np
  assert conventions.array_namespace(jnp.zeros(3)) is jnp
  assert conventions.array_namespace(np.zeros(3), jnp.zeros(3)) is jnp
  assert conventions.array_namespace(3) is jnp
  seen = []
  jax.jit(lambda v: seen.append(conventions.array_namespace(v)) or v)(jnp.zeros(2))
  assert seen == [jnp]


def test_counts_compute_on_host_in_int64_and_on_device_alike():
  """Host ``Counts`` (int64 past 2**31) compute in NumPy; small counts equal the device's bits."""
  big = metrics.Counts.empty().to_host()._replace(n=np.int64(4_000_000_000),
                                                 clean_correct=np.int64(3_000_000_000))
  assert big.compute()["accuracy"] == np.float32(0.75)
  assert isinstance(big.compute()["accuracy"], np.float32)
  y = jnp.array([0, 1, 2, 3, 1])
  device = metrics.Counts.from_batch(jnp.array([0, 1, 2, 0, -1]), jnp.array([0, 2, 2, 3, 1]), y,
                                     x=jnp.ones((5, 2)), x_adv=jnp.ones((5, 2)) * 1.1, norm="l2")
  on_device, on_host = device.compute(), device.to_host().compute()
  jitted = jax.jit(lambda c: c.compute())(device)
  for key, value in on_device.items():
    assert isinstance(value, jax.Array) and isinstance(on_host[key], np.generic), key
    np.testing.assert_array_equal(on_host[key], value, err_msg=key)
    np.testing.assert_array_equal(jitted[key], value, err_msg=key)


def test_a_ratio_in_jax_is_the_correctly_rounded_quotient_compiled_or_not():
  """Every accuracy ``k / n`` JAX computes, eagerly, compiled with ``n`` an argument, or compiled
  with ``n`` a batch size XLA knows, is the correctly rounded quotient, which the host computes
  too (XLA:CPU multiplied by the rounded reciprocal instead: one ulp off for 15 of the 49
  ``k / 48``)."""
  for n in (3, 7, 48, 100, 540):
    counts = np.arange(n + 1)
    exact = (counts / n).astype(np.float32)  # the float64 quotient rounded to float32 (the
    # host's float32 division, the first way below, gives the same for these n)
    size = lambda: conventions.count_true(jnp.ones(n, bool))  # a constant of the program
    k = jnp.asarray(counts, jnp.int32)
    ways = {"host": conventions.ratio(counts, np.int64(n)),
            "eager": conventions.ratio(k, jnp.int32(n)),
            "jit, n an argument": jax.jit(conventions.ratio)(k, jnp.int32(n)),
            "jit, n known": jax.jit(lambda k: conventions.ratio(k, size()))(k),
            "vmap": jax.vmap(conventions.ratio, in_axes=(0, None))(k, jnp.int32(n))}
    for way, value in ways.items():
      np.testing.assert_array_equal(value, exact, err_msg=f"n = {n}, {way}")
