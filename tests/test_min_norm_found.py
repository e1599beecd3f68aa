"""Minimum-norm attacks without a budget find a point wherever one exists, or say they did not.

At ``eps = inf`` a minimum-norm attack that returns no adversarial point for a clean-correct input
reads as "robust at every eps". So, with every attack's defaults:

* on the first 100 digits test images (``benchmarks/reference/digits_examples.npz``) of the four
  digits models of ``benchmarks/bench_min_norm_found.py`` (the frozen SmallCNN and MLP weights of
  ``benchmarks/reference``, plain and PGD-trained), at least 99% of the clean-correct points get
  an adversarial point (C&W found 95, 72, 98 and 65 of 99, 98, 99 and 97 while its rounds
  restarted from the clean point, see :mod:`jaxrobust.attacks._carlini_wagner`); every attack on
  the MLPs, C&W, DDN and FMN-L2/L1 on the CNNs;
* where an attack finds none at ``eps = inf``, ``info["counts"]["minimum_norm_not_found"]``
  counts those clean-correct points and ``info["flags"]["minimum_norm_not_found"]`` is raised, in
  :func:`jaxrobust.run` and in :func:`jaxrobust.robustness_curve`; at a finite eps nothing inside
  the ball is a verdict, not a failure, and is not counted.

Weights, inputs, labels and keys are jit arguments: one compilation per attack and architecture.
"""

from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust.demo.model import SmallCNN

REFERENCE_DIR = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "reference"
N = 100
A = jr.attacks
pytestmark = pytest.mark.compile_bound  # see tests/conftest.py


@functools.cache
def _examples() -> tuple[jax.Array, jax.Array]:
  with np.load(REFERENCE_DIR / "digits_examples.npz") as data:
    x = data["x_levels"][:N].astype(np.float32) / np.float32(16.0)
    return jnp.asarray(x), jnp.asarray(data["y"][:N].astype(np.int32))


def _weights(name: str) -> dict:
  params: dict = {}
  with np.load(REFERENCE_DIR / f"{name}.npz") as data:
    for key in data.files:
      layer, leaf = key.split("/")
      params.setdefault(layer, {})[leaf] = jnp.asarray(data[key])
  return {"params": params}


def _mlp(variables: dict, x: jax.Array) -> jax.Array:
  """``benchmarks/bench_peers.DigitsMLP``: flatten, Dense(128), relu, Dense(64), relu, Dense(10)."""
  p = variables["params"]
  h = x.reshape(x.shape[0], -1)
  for layer in ("dense1", "dense2"):
    h = jax.nn.relu(h @ p[layer]["kernel"] + p[layer]["bias"][None, :])
  return h @ p["dense3"]["kernel"] + p["dense3"]["bias"][None, :]


MODELS = {"cnn": (SmallCNN().apply, ("digits_plain", "digits_adversarial")),
          "mlp": (_mlp, ("digits_mlp_plain", "digits_mlp_adversarial"))}

DEFAULTS = {
    "carlini-wagner-l2": A.carlini_wagner_l2,
    "ddn-l2": A.ddn,
    "fmn-linf": functools.partial(A.fmn, "linf"),
    "fmn-l2": functools.partial(A.fmn, "l2"),
    "fmn-l1": functools.partial(A.fmn, "l1"),
    "deepfool-l2": functools.partial(A.deepfool, "l2"),
    "deepfool-linf": functools.partial(A.deepfool, "linf"),
    "fab-linf": functools.partial(A.fab, "linf"),
    "fab-l2": functools.partial(A.fab, "l2"),
    "fab-l1": functools.partial(A.fab, "l1"),
}


def _assert_count_matches(result, correct: np.ndarray) -> int:
  """The count and the flag equal the clean-correct points with ``success`` False; returns it."""
  missed = int(np.sum(correct & ~np.asarray(result.success)))
  assert int(result.info["counts"]["minimum_norm_not_found"]) == missed
  assert bool(result.info["flags"]["minimum_norm_not_found"]) == (missed > 0)
  return missed


# Every attack on the MLPs; on the CNNs C&W (which missed up to a third), DDN and FMN-L2/L1
# (reported to miss a point). The other CNN runs (all at 100% today) cost 23 s of CPU more: they are left
# to benchmarks/bench_min_norm_found.py, which runs every pair.
CASES = ([(name, "mlp") for name in sorted(DEFAULTS)]
         + [(name, "cnn") for name in ("carlini-wagner-l2", "ddn-l2", "fmn-l2", "fmn-l1")])


# Carlini-Wagner's 9 x 100 steps on the CNN run long unoptimised: 8.1 s at this module's XLA
# level 0, 5.4 s at the defaults (CPU, measured alone); every other case is cheaper at level 0.
RUN_BOUND = {("carlini-wagner-l2", "cnn")}


@pytest.mark.parametrize("name, arch", [
    pytest.param(*case, marks=[pytest.mark.run_bound] if case in RUN_BOUND else [])
    for case in CASES])
def test_defaults_find_nearly_every_clean_correct_digit_at_eps_inf(name, arch):
  apply_fn, weights = MODELS[arch]
  attack = DEFAULTS[name]()
  run = jax.jit(lambda params, x, y, key: jr.run(attack, functools.partial(apply_fn, params), x,
                                                 y, jr.Budget(jnp.inf), key))
  x, y = _examples()
  for weight in weights:
    params = _weights(weight)
    correct = np.asarray(jnp.argmax(apply_fn(params, x), axis=1) == y)
    assert correct.sum() >= 95, (weight, correct.sum())  # the right weights and examples
    result = run(params, x, y, jax.random.key(0))
    missed = _assert_count_matches(result, correct)
    assert missed <= 0.01 * correct.sum(), (weight, missed, int(correct.sum()))
    found = correct & np.asarray(result.success)
    assert np.all(np.isfinite(np.asarray(result.norm)[found]))


def _unbreakable(x: jax.Array) -> jax.Array:
  """Two classes, ``z = (1, mean(x) / 2)``: class 0 wins everywhere in ``[0, 1]`` (by at least
  1/2), but the margin's gradient is never zero, so every attack pushes towards the corner
  ``x = 1`` and finds nothing."""
  m = jnp.mean(x.reshape(x.shape[0], -1), axis=1, keepdims=True)
  return jnp.concatenate([jnp.ones_like(m), m / 2], axis=1)


UNBREAKABLE = {"carlini-wagner-l2": A.carlini_wagner_l2, "ddn-l2": A.ddn,
               "fmn-l1": functools.partial(A.fmn, "l1"),
               "deepfool-linf": functools.partial(A.deepfool, "linf"),
               "fab-l2": functools.partial(A.fab, "l2")}


@pytest.mark.parametrize("name", sorted(UNBREAKABLE))
def test_a_point_that_cannot_be_broken_is_counted_at_eps_inf_only(name):
  attack = UNBREAKABLE[name]()
  run = jax.jit(lambda x, y, eps, key: jr.run(attack, _unbreakable, x, y, jr.Budget(eps), key))
  x = jax.random.uniform(jax.random.key(1), (6, 8))
  y = jnp.array([0, 0, 1, 0, 1, 0], jnp.int32)  # rows 2 and 4 are misclassified already
  correct = np.asarray(y) == 0
  result = run(x, y, jnp.float32(jnp.inf), jax.random.key(0))
  assert not np.asarray(result.success)[correct].any()
  assert np.all(np.isinf(np.asarray(result.norm)[correct]))
  assert _assert_count_matches(result, correct) == 4
  # At a finite eps "nothing inside the ball" is the verdict: nothing is counted.
  bounded = run(x, y, jnp.float32(0.5), jax.random.key(0))
  assert not np.asarray(bounded.success)[correct].any()
  assert int(bounded.info["counts"]["minimum_norm_not_found"]) == 0
  assert not bool(bounded.info["flags"]["minimum_norm_not_found"])


def test_curves_and_reports_carry_the_count():
  """A minimum-norm curve runs the attack once at eps = inf: its count comes with the curve,
  and ``jr.evaluate`` sums it over batches (padding excluded) and raises the report's flag."""
  attack = A.deepfool("linf", steps=5)
  x = jax.random.uniform(jax.random.key(1), (6, 8))
  y = jnp.array([0, 0, 1, 0, 1, 0], jnp.int32)
  curve = jax.jit(lambda x, y, eps, key: jr.robustness_curve(attack, _unbreakable, x, y, eps,
                                                             key))(
      x, y, jnp.array([0.1, 0.5]), jax.random.key(0))
  assert int(curve.info["counts"]["minimum_norm_not_found"]) == 4
  assert bool(curve.info["flags"]["minimum_norm_not_found"])
  report = jr.evaluate(_unbreakable, (np.asarray(x), np.asarray(y)), attacks={"df": attack},
                       epsilons=[0.1, 0.5], key=jax.random.key(0), batch_size=4, progress=False)
  assert int(report.attacks["df"].counts["minimum_norm_not_found"]) == 4
  assert report.flags["df"]["minimum_norm_not_found"] and not report.reliable
