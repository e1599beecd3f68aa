"""One conformance suite for every attack in the registry (in the spirit of optax's alias tests)."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from tests.models import mlp_logits, mlp_params

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

SHAPE = (4, 4, 1)
CLASSES = 5
BATCH = 12

# name -> (factory call, targeted). Every attack the library ships must be listed here.
REGISTRY = {
    "fgsm-linf": lambda: jr.attacks.fgsm("linf"),
    "fgm-l2": lambda: jr.attacks.fgsm("l2"),
    "fgm-l1": lambda: jr.attacks.fgsm("l1"),
    "pgd-linf": lambda: jr.attacks.pgd("linf", steps=4),
    "pgd-l2": lambda: jr.attacks.pgd("l2", steps=4),
    "pgd-l1": lambda: jr.attacks.pgd("l1", steps=4),
    "pgd-linf-restarts-margin": lambda: jr.attacks.pgd("linf", steps=3, restarts=2, loss="margin"),
    "pgd-l2-dlr-targeted": lambda: jr.attacks.pgd("l2", steps=3, loss="dlr", targeted=True),
    "fgsm-linf-targeted": lambda: jr.attacks.fgsm("linf", targeted=True),
    "deepfool-l2": lambda: jr.attacks.deepfool("l2", steps=5),
    "deepfool-linf": lambda: jr.attacks.deepfool("linf", steps=5, candidates=3),
    "carlini_wagner_l2": lambda: jr.attacks.carlini_wagner_l2(
        steps=10, binary_search_steps=3, initial_const=1.0, learning_rate=0.1),
    "carlini_wagner_l2-targeted-confidence": lambda: jr.attacks.carlini_wagner_l2(
        steps=10, binary_search_steps=3, initial_const=1.0, learning_rate=0.1, confidence=0.1,
        targeted=True),
    "ddn": lambda: jr.attacks.ddn(steps=10, init_epsilon=0.25),
    "ddn-targeted": lambda: jr.attacks.ddn(steps=10, init_epsilon=0.25, targeted=True),
    "brendel_bethge-l2": lambda: jr.attacks.brendel_bethge(
        "l2", steps=10, init_attack=jr.attacks.fmn("l2", steps=5)),
    "brendel_bethge-l1": lambda: jr.attacks.brendel_bethge(
        "l1", steps=10, init_attack=jr.attacks.fmn("l1", steps=5)),
    "brendel_bethge-linf-targeted": lambda: jr.attacks.brendel_bethge(
        "linf", steps=10, init_attack=jr.attacks.fmn("linf", steps=5, targeted=True),
        targeted=True),
    "fmn-linf": lambda: jr.attacks.fmn("linf", steps=10),
    "fmn-l2": lambda: jr.attacks.fmn("l2", steps=10),
    "fmn-l1": lambda: jr.attacks.fmn("l1", steps=10),
    "fmn-l2-targeted": lambda: jr.attacks.fmn("l2", steps=10, targeted=True),
    "apgd-linf-ce": lambda: jr.attacks.apgd("linf", steps=5),
    "apgd-l2-dlr": lambda: jr.attacks.apgd("l2", loss="dlr", steps=5, restarts=2),
    "apgd-l1-ce": lambda: jr.attacks.apgd("l1", steps=5),
    "apgd-l1-ce-large-eps": lambda: jr.attacks.apgd("l1", steps=5, restarts=2, large_eps=True),
    "apgd-t-linf": lambda: jr.attacks.apgd("linf", targeted=True, n_target_classes=3, steps=4),
    "apgd-linf-targeted": lambda: jr.attacks.apgd("linf", targeted=True, n_target_classes=None,
                                                  steps=5),
    "ensemble-linf": lambda: jr.attacks.ensemble(jr.attacks.fgsm("linf"),
                                                 jr.attacks.pgd("linf", steps=3)),
    "ensemble-l2-targeted": lambda: jr.attacks.ensemble(
        jr.attacks.fgsm("l2", targeted=True), jr.attacks.pgd("l2", steps=3, targeted=True)),
    "fab-linf": lambda: jr.attacks.fab("linf", steps=10, restarts=2),
    "fab-l2": lambda: jr.attacks.fab("l2", steps=10),
    "fab-l1": lambda: jr.attacks.fab("l1", steps=10, class_chunk=2),
    "fab-t-linf": lambda: jr.attacks.fab("linf", targeted=True, n_target_classes=3, steps=10),
    "fab-l2-targeted": lambda: jr.attacks.fab("l2", targeted=True, n_target_classes=None,
                                              steps=10),
    "square-linf": lambda: jr.attacks.square("linf", queries=30),
    "square-l2": lambda: jr.attacks.square("l2", queries=30, restarts=2),
    "square-linf-targeted": lambda: jr.attacks.square("linf", queries=30, targeted=True),
    "square-l1": lambda: jr.attacks.square("l1", queries=30, restarts=2),
    "auto_attack-linf": lambda: jr.attacks.auto_attack("linf", n_target_classes=3, steps=4,
                                                       queries=20),
    "auto_attack-l2-plus": lambda: jr.attacks.auto_attack("l2", "plus", n_target_classes=2,
                                                          steps=3, queries=10),
    # eot attacks a randomized logits_fn(x, keys); here one that ignores its keys.
    "eot-pgd-linf": lambda: jr.attacks.eot(jr.attacks.pgd("linf", steps=3), samples=3),
    "min_norm_search-pgd-l2-targeted": lambda: jr.attacks.min_norm_search(
        jr.attacks.pgd("l2", steps=3, loss="margin", targeted=True), search_steps=4),
}

EPS = {"linf": 0.1, "l2": 0.5, "l1": 2.0}


@functools.lru_cache(maxsize=None)
def _params():
  return mlp_params(0, int(np.prod(SHAPE)), 16, CLASSES)


@pytest.fixture(scope="module")
def problem():
  logits_fn = functools.partial(mlp_logits, _params())  # for eager checks of the results
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.uniform(0, 1, size=(BATCH,) + SHAPE), jnp.float32)
  x = x.at[0].set(0.0).at[1].set(1.0)  # corners of the box
  y = jnp.asarray(rng.integers(0, CLASSES, size=BATCH), jnp.int32)
  target = (y + 1 + jnp.asarray(rng.integers(0, CLASSES - 1, size=BATCH), jnp.int32)) % CLASSES
  return logits_fn, x, y, target


@pytest.fixture(scope="module", params=sorted(REGISTRY))
def compiled(request, problem):
  """The attack, and one jitted run per attack with a trace counter (compiled once per module)."""
  attack = REGISTRY[request.param]()
  traces = []

  @jax.jit
  def jitted(params, x, y, eps, keys, target):
    traces.append(None)
    logits_fn = functools.partial(mlp_logits, params)
    return jr.run(attack, _model(attack, logits_fn), x, y, jr.Budget(eps), keys,
                  target if attack.targeted else None)

  def run(x, y, eps, key, target):
    """Always per-example eps and keys, so every call reuses one compilation; the weights are
    an argument of the program, not constants compiled into it."""
    eps = jnp.broadcast_to(jnp.asarray(eps, jnp.float32), (x.shape[0],))
    if key.ndim == 0:
      key = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(x.shape[0]))
    return jitted(_params(), x, y, eps, key, target)

  return attack, run, traces


def _target(attack, target):
  return target if attack.targeted else None


def _model(attack, logits_fn):
  """The model as the attack calls it: ``logits_fn(x, keys)`` for attacks on randomized models."""
  return (lambda x, keys: logits_fn(x)) if attack.samples else logits_fn


def test_carry_type_is_stable(compiled, problem):
  attack, _, _ = compiled
  logits_fn, x, y, target = problem
  budget = jr.Budget(jnp.float32(0.1))
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(BATCH))
  model = _model(attack, logits_fn)
  state0 = jax.eval_shape(lambda: attack.init(model, x, y, budget, keys,
                                              _target(attack, target)))
  state1 = jax.eval_shape(lambda s: attack.step(model, s, x, y, budget,
                                                _target(attack, target)), state0)
  chex.assert_trees_all_equal_shapes_and_dtypes(state0, state1)
  assert jax.tree.structure(state0) == jax.tree.structure(state1)


def test_no_retrace_across_eps_and_keys(compiled, problem):
  attack, run, traces = compiled
  _, x, y, target = problem
  eps = EPS[attack.norm]
  for i, e in enumerate((eps, eps / 2, 0.0)):
    run(x, y, jnp.float32(e), jax.random.key(i), target)
  assert len(traces) == 1


def test_inside_box_and_ball_and_success_is_honest(compiled, problem):
  attack, run, _ = compiled
  logits_fn, x, y, target = problem
  eps = EPS[attack.norm]
  result = run(x, y, jnp.float32(eps), jax.random.key(0), target)
  x_adv = np.asarray(result.x_adv)
  assert x_adv.shape == x.shape and x_adv.dtype == np.float32
  assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
  size = np.asarray(jr.projections.norm(result.x_adv - x, attack.norm))
  assert np.all(size <= eps * (1 + 1e-5) + 1e-6), size.max()
  # A minimum-norm attack reports norm = inf where it found no adversarial point.
  expected = np.where(np.asarray(result.success), size, np.inf) if attack.minimum_norm else size
  np.testing.assert_allclose(np.asarray(result.norm), expected, rtol=1e-6)
  pred = np.asarray(jr.predict(logits_fn(result.x_adv)))
  clean_wrong = np.asarray(jr.predict(logits_fn(x))) != np.asarray(y)
  # Targeted success means the target was reached, on every point (a clean-misclassified point
  # is returned unchanged and succeeds only if its clean prediction already is the target).
  hit = pred == np.asarray(target) if attack.targeted else (pred != np.asarray(y)) | clean_wrong
  np.testing.assert_array_equal(np.asarray(result.success), hit)
  np.testing.assert_array_equal(x_adv[clean_wrong], np.asarray(x)[clean_wrong])
  assert np.asarray(result.success).any(), "the attack never succeeds on this model"
  assert np.asarray(result.success)[~clean_wrong].any(), "no correctly classified point broken"


def test_eps_zero_returns_x_bitwise(compiled, problem):
  attack, run, _ = compiled
  logits_fn, x, y, target = problem
  result = run(x, y, jnp.float32(0.0), jax.random.key(3), target)
  np.testing.assert_array_equal(np.asarray(result.x_adv), np.asarray(x))
  clean_pred = np.asarray(jr.predict(logits_fn(x)))
  expected = clean_pred == np.asarray(target) if attack.targeted else clean_pred != np.asarray(y)
  np.testing.assert_array_equal(np.asarray(result.success), expected)


def test_same_key_same_result(compiled, problem):
  attack, run, _ = compiled
  _, x, y, target = problem
  a = run(x, y, jnp.float32(EPS[attack.norm]), jax.random.key(7), target)
  b = run(x, y, jnp.float32(EPS[attack.norm]), jax.random.key(7), target)
  chex.assert_trees_all_equal(a, b)


def test_permuting_the_batch_permutes_the_result(compiled, problem):
  attack, run, _ = compiled
  _, x, y, target = problem
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(5), i))(jnp.arange(BATCH))
  perm = np.random.default_rng(2).permutation(BATCH)
  eps = jnp.float32(EPS[attack.norm])
  a = run(x, y, eps, keys, target)
  b = run(x[perm], y[perm], eps, keys[perm], target[perm])
  np.testing.assert_allclose(np.asarray(a.x_adv)[perm], np.asarray(b.x_adv), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(a.success)[perm], np.asarray(b.success))


def test_input_buffers_unchanged(compiled, problem):
  attack, run, _ = compiled
  _, x, y, target = problem
  x_before, y_before = np.array(x), np.array(y)
  run(x, y, jnp.float32(EPS[attack.norm]), jax.random.key(0), target)
  np.testing.assert_array_equal(np.asarray(x), x_before)
  np.testing.assert_array_equal(np.asarray(y), y_before)


def test_per_example_eps(compiled, problem):
  """A [B] eps acts per example: zero-eps examples stay put, the others stay in their balls."""
  attack, run, _ = compiled
  _, x, y, target = problem
  eps = jnp.where(jnp.arange(BATCH) % 2 == 0, 0.0, EPS[attack.norm]).astype(jnp.float32)
  result = run(x, y, eps, jax.random.key(0), target)
  np.testing.assert_array_equal(np.asarray(result.x_adv)[::2], np.asarray(x)[::2])
  size = np.asarray(jr.projections.norm(result.x_adv - x, attack.norm))
  assert np.all(size <= np.asarray(eps) * (1 + 1e-5) + 1e-6)


def test_registry_lists_every_attack():
  shipped = set(jr.attacks.__all__)
  listed = {name.split("-")[0].replace("fgm", "fgsm") for name in REGISTRY}
  assert shipped <= listed, f"attacks missing from the conformance registry: {shipped - listed}"
