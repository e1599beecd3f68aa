"""Canonical convolutions (jaxrobust.engine.canonical_conv): XLA:CPU canonicalises convolutions
only in a program's entry computation, so the engine must hand it attack loops whose
convolutions, the input gradients' included, are NHWC/HWIO/NHWC already (else 3-7x slower per
step, benchmarks/bench_loop_conv.py). These tests only trace (no compile) or run tiny programs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrobust as jr
from jaxrobust import _jaxpr_walk
from jaxrobust._options import RunOptions

from jaxrobust.engine.canonical_conv import canonical_convolutions, noncanonical_convolutions

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

KERNEL = jax.random.normal(jax.random.key(0), (3, 3, 1, 4))
DENSE = jax.random.normal(jax.random.key(1), (4 * 4 * 4, 10))


def conv_model(x):
  h = jax.nn.relu(lax.conv_general_dilated(x, KERNEL, (2, 2), "SAME",
                                           dimension_numbers=("NHWC", "HWIO", "NHWC")))
  return h.reshape(h.shape[0], -1) @ DENSE


def noncanonical_in_loops(fn, *args) -> int:
  """Non-canonical convolutions inside loop bodies (XLA canonicalises the entry computation's)."""

  def count(jaxpr, in_loop: bool) -> int:
    total = 0
    for eqn in jaxpr.eqns:
      if eqn.primitive is lax.conv_general_dilated_p and in_loop:
        total += noncanonical_convolutions(
            lambda *a: lax.conv_general_dilated_p.bind(*a, **eqn.params),
            *(jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars))
      loop = eqn.primitive.name in ("while", "scan")
      total += sum(count(_jaxpr_walk.open_jaxpr(sub)[0], in_loop or loop)
                   for sub in _jaxpr_walk.sub_jaxprs(eqn.params))
    return total

  return count(jax.make_jaxpr(fn)(*args).jaxpr, False)


X = jax.random.uniform(jax.random.key(2), (4, 8, 8, 1))
Y = jnp.arange(4, dtype=jnp.int32)


@pytest.mark.parametrize("attack", [jr.attacks.pgd("linf", steps=2),
                                    jr.attacks.ensemble(jr.attacks.fgsm(),
                                                        jr.attacks.apgd(steps=2))],
                         ids=["pgd", "ensemble"])
@pytest.mark.parametrize("early_exit", [False, True])
def test_attack_loops_hold_only_canonical_convolutions(attack, early_exit):
  run = lambda x: jr.run(attack, conv_model, x, Y, jr.Budget(0.1), jax.random.key(0),
                         early_exit=early_exit)
  curve = lambda x: jr.robustness_curve(attack, conv_model, x, Y, jnp.array([0.05, 0.1]),
                                        jax.random.key(0), early_exit=early_exit)
  # Not vacuous: the same attack without the rewrite holds the gradients' 01oi convolutions.
  raw = lambda x: jr.engine.attack_loop.run_attack(
      attack, conv_model, x, Y, jr.Budget(0.1), jax.random.key(0),
      options=RunOptions(early_exit=early_exit, canonical=False))
  assert noncanonical_in_loops(raw, X) > 0
  if jax.default_backend() == "cpu":
    assert noncanonical_in_loops(run, X) == 0
    assert noncanonical_in_loops(curve, X) == 0


@pytest.mark.parametrize("dimension_numbers, kernel_shape, groups", [
    (("NHWC", "HWIO", "NHWC"), (3, 3, 2, 4), 1),
    (("NCHW", "OIHW", "NCHW"), (4, 2, 3, 3), 1),
    (("NHWC", "HWIO", "NHWC"), (3, 3, 1, 4), 2),  # grouped
])
def test_rewrite_keeps_values_and_gradients(dimension_numbers, kernel_shape, groups):
  rng = np.random.default_rng(0)
  kernel = jnp.asarray(rng.normal(size=kernel_shape), jnp.float32)
  shape = (2, 8, 8, 2) if dimension_numbers[0] == "NHWC" else (2, 2, 8, 8)
  x = jnp.asarray(rng.normal(size=shape), jnp.float32)

  def loss(x, kernel):
    out = lax.conv_general_dilated(x, kernel, (2, 1), "SAME", rhs_dilation=(1, 2),
                                   dimension_numbers=dimension_numbers,
                                   feature_group_count=groups)
    return jnp.sum(jnp.tanh(out) ** 2)

  grad = jax.grad(loss, argnums=(0, 1))
  expected = jax.jit(grad)(x, kernel)
  rewritten = jax.jit(canonical_convolutions(grad))(x, kernel)
  assert noncanonical_convolutions(canonical_convolutions(grad), x, kernel) == 0
  for a, b in zip(expected, rewritten):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=1e-5)


def test_rewritten_attack_gives_the_same_verdicts():
  attack = jr.attacks.pgd("linf", steps=5)
  run = jax.jit(lambda x, canonical: jr.engine.attack_loop.run_attack(
      attack, conv_model, x, Y, jr.Budget(0.05), jax.random.key(0),
      options=RunOptions(early_exit=False, canonical=canonical))[0], static_argnums=1)
  plain, rewritten = run(X, False), run(X, True)
  np.testing.assert_array_equal(np.asarray(plain.success), np.asarray(rewritten.success))
  np.testing.assert_allclose(np.asarray(plain.x_adv), np.asarray(rewritten.x_adv), atol=1e-6)
