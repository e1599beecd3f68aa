r"""The Brendel-Bethge attack against exact minimal distances, its start, and its arguments.

* On ten-class linear models (``tests/ground_truth.py``: :math:`d^*` exact, the optimal step
  inside the box), started from a deliberately weak point (FGM at the eps of a coarse search), BB walks the boundary to
  within 0.1% of :math:`d^*` on the median point and never reports a norm below it; success is
  re-checked by the model (``argmax``), untargeted and targeted, flat and image-shaped inputs,
  in L2, Linf and L1; it never returns a point larger than its start.
* On linear models where the box binds (points near the faces of ``[0, 1]``, so the box-free
  optimum leaves the box), the exact box-constrained distance is
  :func:`tests.ground_truth_box.box_distance` (float64, checked against SciPy's linear and
  quadratic programmes in ``tests/test_ground_truth.py``), and BB lands within 0.5% of it on every
  point.
* On a small MLP the result is never worse than the start (the same FMN run alone), better on
  most points, and a permuted batch gives the permuted result.
* Without a start (an inner attack that finds 1 point of 16), BB walks from ``x`` itself and
  ends at the exact minimum on 15 of 16 linear points; on a model that nothing in the box breaks
  it returns ``x`` with norm ``inf``, counted as not found at ``eps = inf`` only.
* A finite eps is an upper bound; bad arguments raise clear errors.

Weights, inputs, eps and targets are jit arguments: one compilation per norm and mode.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from tests.ground_truth import linear_problem
from tests.ground_truth_box import box_distance
from tests.models import Linear, mlp

A = jr.attacks
CLASSES = 10
STEPS = 200
LAYOUT = {("l2", False): (4, 4, 4), ("linf", False): (64,), ("l2", True): (8, 8),
          ("l1", False): (8, 8, 1)}
ORD = {"l2": 2, "linf": np.inf, "l1": 1}


def _weak_start(norm: str, targeted: bool) -> jr.Attack:
  """FGM's points at the eps of a coarse search (6 runs, eps doubling from the default start):
  up to twice the minimal norm (FMN and DDN are exact on a linear model within a few steps)."""
  return A.min_norm_search(A.fgsm(norm, targeted=targeted), search_steps=6)


@functools.lru_cache(maxsize=None)
def _jitted(norm: str, targeted: bool):
  """``run(w, b, x, y, eps, target)``: BB from a weak start on ``flatten(x) @ w + b``."""
  attack = A.brendel_bethge(norm, steps=STEPS, init_attack=_weak_start(norm, targeted),
                            targeted=targeted)

  @jax.jit
  def run(w, b, x, y, eps, target):
    return jr.run(attack, Linear(w, b).logits_fn, x, y, jr.Budget(eps), jax.random.key(0),
                  target if targeted else None)

  return run


def _check(result, x, y, model_w, model_b, norm, target=None):
  """Box, reported norms and success as the model sees them; returns the norms (float64)."""
  x_adv = np.asarray(result.x_adv, np.float64)
  assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
  delta = (x_adv - np.asarray(x, np.float64)).reshape(len(x), -1)
  size = np.linalg.norm(delta, ord=ORD[norm], axis=1)
  success = np.asarray(result.success)
  np.testing.assert_allclose(np.asarray(result.norm)[success], size[success], rtol=1e-5)
  # The model's own verdict (BB's points lie on the boundary, where only the float32 model that
  # the attack saw decides; a float64 product would judge some of them otherwise).
  pred = np.argmax(np.asarray(Linear(model_w, model_b).logits_fn(result.x_adv)), axis=1)
  np.testing.assert_array_equal(success, pred == target if target is not None else pred != y)
  return np.where(success, size, np.inf)


# XLA level 0 (``compile_bound``, tests/conftest.py) per test, where measured cheaper (CPU s of
# the test, defaults -> level 0): L1 8.0 -> 6.2; L2 5.5 -> 5.5 and Linf 6.0 -> 7.5 (200 BB steps
# run long unoptimised) stay at XLA's defaults. test_exact_minimum_where_the_box_binds reuses
# these compilations (the jit cache ignores the level): its L1 case runs 0.7 s longer.
_LEVEL_0 = {("l1", False)}


@pytest.mark.parametrize("norm, targeted", [
    pytest.param(*case, marks=[pytest.mark.compile_bound] if case in _LEVEL_0 else [])
    for case in sorted(LAYOUT)])
def test_walks_from_a_weak_start_to_the_exact_minimum(norm, targeted):
  p = linear_problem(shape=LAYOUT[norm, targeted], classes=CLASSES, norm=norm, n=24, seed=3)
  w, b = jnp.asarray(p.model.w, jnp.float32), jnp.asarray(p.model.b, jnp.float32)
  start = jax.jit(lambda w, b, x, y, t: jr.run(_weak_start(norm, targeted),
                                               Linear(w, b).logits_fn, x, y, jr.Budget(jnp.inf),
                                               jax.random.key(0), t if targeted else None))(
      w, b, p.x, p.y, p.target)
  result = _jitted(norm, targeted)(w, b, p.x, p.y, jnp.float32(jnp.inf), p.target)
  size = _check(result, p.x, p.y, p.model.w, p.model.b, norm, p.target if targeted else None)
  assert np.all(np.isfinite(size))
  ratio = size / p.distance
  assert ratio.min() >= 1 - 1e-4, ratio.min()
  assert np.median(ratio) <= 1.001, np.median(ratio)
  # Never worse than the start (its points are scored), which it improves on almost everywhere.
  assert np.all(size <= np.asarray(start.norm) * (1 + 1e-6))
  weak = np.median(np.asarray(start.norm) / p.distance)
  assert weak >= 1.01, weak  # the start alone is far from the minimum: BB did the walking
  # A finite eps is an upper bound: a point is returned exactly where its norm fits.
  eps = np.float32(np.median(size))
  bounded = _jitted(norm, targeted)(w, b, p.x, p.y, eps, p.target)
  fits = size <= eps * (1 - 1e-3)
  assert np.all(np.asarray(bounded.success)[fits])
  assert not np.any(np.asarray(bounded.success)[size > eps * (1 + 1e-3)])


@pytest.mark.parametrize("norm", ["l2", "linf", "l1"])
def test_exact_minimum_where_the_box_binds(norm):
  """Class 1 against class 0 (``z_1 - z_0 = v . x + c``; the other eight classes sit at -1000),
  at points whose coordinates mostly lie near the face that ``v`` pushes them to, so that the
  box-free optimum leaves the box: the exact box-constrained distance is the answer."""
  rng = np.random.default_rng(5)
  dim = 64
  v = np.float32(rng.normal(size=dim)).astype(np.float64)
  near = rng.uniform(size=(256, dim)) < 0.5
  x = np.where(near, np.where(v > 0, 0.97, 0.03), rng.uniform(0.2, 0.8, (256, dim)))
  x = x.astype(np.float32).astype(np.float64)
  reach = np.sum(np.maximum(v * -x, v * (1 - x)), axis=1)  # the most v . delta in the box
  c = np.float32(-np.median(x @ v + 0.4 * reach))
  gap = -(x @ v + c)  # z_0 - z_1 at x: what v . delta must reach
  exact = box_distance(np.broadcast_to(v, x.shape), x, gap, norm, 0.0, 1.0)
  box_free = gap / np.linalg.norm(v, ord={"l2": 2, "linf": 1, "l1": np.inf}[norm])
  # Reachable inside the box, and the box binds: the box-free optimum is 5% shorter or more.
  keep = np.flatnonzero((gap > 0.05) & (gap < 0.8 * reach) & (exact > 1.05 * box_free))[:24]
  assert len(keep) == 24, len(keep)
  x, exact = x[keep], exact[keep]
  w = np.zeros((dim, CLASSES))
  w[:, 1] = v
  b = np.full(CLASSES, -1000.0)
  b[0], b[1] = 0.0, c
  shape = LAYOUT[norm, False]
  xs = x.astype(np.float32).reshape((-1,) + shape)
  y = np.zeros(len(x), np.int32)
  result = _jitted(norm, False)(jnp.asarray(w, jnp.float32), jnp.asarray(b, jnp.float32), xs, y,
                                jnp.float32(jnp.inf), y)
  size = _check(result, xs, y, w, b, norm)
  ratio = size / exact
  assert ratio.min() >= 1 - 1e-4, ratio.min()
  assert ratio.max() <= 1.005, ratio.max()


@pytest.mark.compile_bound  # XLA level 0: 9.3 -> 5.2 s CPU (two programs, compile-bound)
def test_never_worse_than_its_start_and_independent_of_the_batch_order():
  """On a small MLP, BB from the weak start (deterministic: the same run as alone) returns at
  most its norm on every point, less on most; a permuted batch permutes the result."""
  logits_fn = mlp(0, 64, 32, CLASSES)
  x = jax.random.uniform(jax.random.key(1), (16, 8, 8, 1))
  y = jnp.argmax(logits_fn(x), axis=1)
  start = _weak_start("l2", False)
  attack = A.brendel_bethge("l2", steps=STEPS, init_attack=start)
  keys = jax.random.split(jax.random.key(2), len(y))
  run = jax.jit(lambda attack_index, x, y, keys: jr.run(
      (start, attack)[attack_index], logits_fn, x, y, jr.Budget(jnp.inf), keys),
      static_argnums=0)
  alone, refined = run(0, x, y, keys), run(1, x, y, keys)
  assert np.all(np.asarray(refined.success) >= np.asarray(alone.success))
  before, after = np.asarray(alone.norm), np.asarray(refined.norm)
  assert np.all(after <= before * (1 + 1e-6)), (after / before).max()
  assert np.mean(after < 0.99 * before) >= 0.5, after / before
  perm = np.random.default_rng(0).permutation(len(y))
  permuted = run(1, x[perm], y[perm], keys[perm])
  np.testing.assert_allclose(np.asarray(permuted.norm), after[perm], rtol=1e-4)
  np.testing.assert_array_equal(np.asarray(permuted.success), np.asarray(refined.success)[perm])


def test_bad_arguments_are_refused_clearly():
  with pytest.raises(ValueError, match="norms"):
    A.brendel_bethge("l0")
  with pytest.raises(ValueError, match="minimum-norm"):
    A.brendel_bethge("l2", init_attack=A.pgd("l2"))
  with pytest.raises(ValueError, match="targeted"):
    A.brendel_bethge("l2", init_attack=A.fmn("l2"), targeted=True)
  with pytest.raises(ValueError, match="suite"):
    A.brendel_bethge("l2", init_attack=A.ensemble(A.fmn("l2"), A.ddn()))
  with pytest.raises(TypeError, match="jr.Attack"):
    A.brendel_bethge("l2", init_attack=[A.fmn("l2"), "ddn"])
  with pytest.raises(ValueError, match="non-empty"):
    A.brendel_bethge("l2", init_attack=())
  for option, value in (("lr", 0.0), ("lr_decay", 1.5), ("momentum", 1.0), ("overshoot", 0.9),
                        ("steps", 0), ("binary_search_steps", -1), ("lr_num_decay", 0)):
    with pytest.raises(ValueError, match=option):
      A.brendel_bethge("l2", **{option: value})


def test_defaults_and_recorded_configuration():
  import json

  attack = A.brendel_bethge("linf")
  assert attack.minimum_norm and attack.norm == "linf" and attack.num_steps == 1000
  config = json.loads(attack.config)
  assert config["factory"] == "brendel_bethge" and config["init_attack"] is None
  assert (config["lr"], config["momentum"], config["overshoot"]) == (1e-3, 0.8, 1.1)
  for norm in ("l2", "linf", "l1"):
    for targeted in (False, True):
      attacks = jr.attacks._brendel_bethge.default_init_attack(norm, targeted)
      starts = [a.name for a in attacks]
      # The search's rtol: its default (0.001) in Linf, 0.01 in L2 and L1 (START_RTOL).
      assert attacks[-1].init.args[0].rtol == (0.001 if norm == "linf" else 0.01)  # its _Config
      kinds = ["ddn"] * (norm == "l2") + ["fmn", "fab", "min"]
      assert [name.split("-")[0] for name in starts] == kinds, starts
      assert all(("-targeted" in name) == targeted for name in starts), starts
      assert f"apgd-ce-{norm}" in starts[-1], starts
      assert A.brendel_bethge(norm, targeted=targeted).targeted == targeted  # the starts agree
  given = json.loads(A.brendel_bethge("l2", init_attack=(A.ddn(steps=5),)).config)
  assert given["init_attack"][0]["factory"] == "ddn"


def _unbreakable(x: jax.Array) -> jax.Array:
  """Two classes, ``z = (1, mean(x) / 2)``: class 0 wins everywhere in ``[0, 1]``, with a margin
  whose gradient is never zero (``tests/test_min_norm_found.py``)."""
  m = jnp.mean(x.reshape(x.shape[0], -1), axis=1, keepdims=True)
  return jnp.concatenate([jnp.ones_like(m), m / 2], axis=1)


@pytest.mark.compile_bound  # XLA level 0: 7.4 -> 4.3 s CPU (two programs, compile-bound)
def test_without_a_start_it_walks_from_x_and_counts_what_it_cannot_break():
  """A start that finds nothing (FGM capped at eps 0.01): on the linear problem BB walks from
  ``x`` to the boundary and down it; on a model no point of the box breaks it returns ``x``,
  norm ``inf``, counted at ``eps = inf`` only."""
  nothing = A.min_norm_search(A.fgsm("l2"), search_steps=2, max_eps=0.01)
  attack = A.brendel_bethge("l2", steps=STEPS, init_attack=nothing)
  p = linear_problem(shape=(64,), classes=CLASSES, norm="l2", n=16, seed=4)
  result = jax.jit(lambda w, b, x, y: jr.run(attack, Linear(w, b).logits_fn, x, y,
                                             jr.Budget(jnp.inf), jax.random.key(0)))(
      p.model.w, p.model.b, p.x, p.y)
  size = _check(result, p.x, p.y, p.model.w, p.model.b, "l2")
  ratio = size / p.distance
  assert np.mean(np.isfinite(ratio)) >= 0.9 and ratio.min() >= 1 - 1e-4
  assert np.median(ratio) <= 1.05, np.median(ratio)

  x = jax.random.uniform(jax.random.key(1), (6, 8))
  y = jnp.array([0, 0, 1, 0, 1, 0], jnp.int32)  # rows 2 and 4 are misclassified already
  run = jax.jit(lambda x, y, eps: jr.run(attack, _unbreakable, x, y, jr.Budget(eps),
                                         jax.random.key(0)))
  correct = np.asarray(y) == 0
  result = run(x, y, jnp.float32(jnp.inf))
  assert not np.asarray(result.success)[correct].any()
  assert np.all(np.isinf(np.asarray(result.norm)[correct]))
  assert int(result.info["counts"]["minimum_norm_not_found"]) == 4
  bounded = run(x, y, jnp.float32(0.5))
  assert int(bounded.info["counts"]["minimum_norm_not_found"]) == 0
  np.testing.assert_array_equal(np.asarray(bounded.x_adv)[correct], np.asarray(x)[correct])
