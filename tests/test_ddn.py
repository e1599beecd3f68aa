r"""DDN against the exact minimal L2 distance on linear models (``tests/ground_truth.py``).

On a linear model the points of :func:`tests.ground_truth.linear_problem` have a known minimal
L2 distance :math:`d^*` inside the box, untargeted and targeted towards the nearest class, so
DDN must never report less and, with its defaults, should come close:

* binary models: the cross-entropy's direction is the optimal one, and DDN lands within a few
  tenths of a percent of :math:`d^*` (its radius moves by factors :math:`1 \pm \gamma`, so the
  best adversarial radius approaches :math:`d^*` from above in steps of about
  :math:`\gamma^2 = 0.25\%`);
* ten classes: DDN maximises the cross-entropy on a sphere, and near the centre of the box, where
  the softmax spreads over many classes, that maximiser is not the nearest adversarial point:
  DDN ends above :math:`d^*` (median 1.17 times :math:`d^*` untargeted, 1.14 targeted; Foolbox
  3.3.4's ``DDNAttack`` on the same problem ends on the same norms). With the logits scaled by
  1000 the softmax concentrates on the runner-up and DDN reaches :math:`d^*` (median 1.001
  times it). At that scale the float32 cross-entropy has no gradient left (or only its other
  classes' entries), while this implementation's loss, whose gradient has the cross-entropy's
  direction, keeps it: Foolbox's DDN ends at a median 1.012 times :math:`d^*` untargeted and
  1.079 targeted (binary: 1.010 and 1.052, against 1.0007 here).

Each configuration compiles once (weights, budgets and scale are arguments).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust.attacks._ddn import ddn
from tests.ground_truth import linear_problem
from tests.ground_truth_box import box_problem
from tests.models import Linear

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

N = 32


@functools.lru_cache(maxsize=None)
def _problem(classes: int, shape: tuple[int, ...]):
  """Points spread over most of the box, so that :math:`d^*` (0.02 to 0.5) is not far below
  DDN's first radius, 1 (the radius shrinks by 5% a step, so a tiny :math:`d^*` would take most
  of the 100 steps to reach); the optimal step, grown by 2%, stays inside the box."""
  return linear_problem(shape=shape, classes=classes, norm="l2", n=N, seed=0, low=0.05,
                        high=0.95)


@functools.lru_cache(maxsize=None)
def _jitted(targeted: bool = False, levels=None):
  """One compiled ``jr.run`` per configuration (and input shape), with the default steps."""
  attack = jr.attacks.ddn(targeted=targeted, levels=levels)

  @jax.jit
  def run(w, b, x, y, eps, target):
    return jr.run(attack, Linear(w, b).logits_fn, x, y, jr.Budget(eps), jax.random.key(0),
                  target if targeted else None)

  return run


def _run(p, scale=1.0, eps=np.inf, targeted=False, levels=None):
  eps = jnp.broadcast_to(jnp.asarray(eps, jnp.float32), (N,))
  return _jitted(targeted, levels)(p.model.w * scale, p.model.b * scale, jnp.asarray(p.x),
                                   jnp.asarray(p.y), eps, jnp.asarray(p.target))


def _ratios(p, result, scale=1.0, targeted=False):
  """Checks box, norms, verdicts and the exact lower bound; returns norm / d* of every point."""
  x_adv = np.asarray(result.x_adv)
  assert x_adv.shape == p.x.shape and x_adv.min() >= 0.0 and x_adv.max() <= 1.0
  success, size = np.asarray(result.success), np.asarray(result.norm, np.float64)
  assert success.all(), np.flatnonzero(~success)
  delta = (x_adv.astype(np.float64) - p.x.astype(np.float64)).reshape(N, -1)
  np.testing.assert_allclose(size, np.linalg.norm(delta, axis=1), rtol=1e-5)
  logits = np.asarray(Linear(p.model.w * scale, p.model.b * scale).logits_fn(result.x_adv))
  pred = np.argmax(logits, axis=1)
  np.testing.assert_array_equal(pred == p.target if targeted else pred != p.y, True)
  ratio = size / p.distance
  assert ratio.min() >= 1 - 1e-4, ratio.min()
  return ratio


def test_binary_flat_reaches_the_exact_distance_at_any_logit_scale():
  p = _problem(2, (16,))
  ratio = _ratios(p, _run(p))
  assert np.median(ratio) <= 1.005 and ratio.max() <= 1.03, (np.median(ratio), ratio.max())
  # Two classes: the direction does not depend on the logits' scale, nor does the path (to
  # rounding), although the float32 cross-entropy has no gradient left at this scale.
  scaled = _run(p, scale=1000.0)
  _ratios(p, scaled, scale=1000.0)
  np.testing.assert_allclose(np.asarray(scaled.norm), np.asarray(_run(p).norm), rtol=1e-3)
  model = Linear(p.model.w * 1000.0, p.model.b * 1000.0)
  x, y = jnp.asarray(p.x), jnp.asarray(p.y)
  ce_grad = jax.grad(lambda v: jnp.sum(jr.losses.cross_entropy(model.logits_fn(v), y)))(x)
  assert np.mean(np.all(np.asarray(ce_grad) == 0, axis=1)) >= 0.9


def test_binary_where_the_box_binds():
  """Points with half their coordinates on a face of the box, where the box raises :math:`d^*` by
  5% or more (:mod:`tests.ground_truth_box`, exact in the box): DDN, which projects every iterate
  onto the box, still lands within the binary bar. Same model and batch shape as the flat binary
  problem, so the same compilation."""
  box = box_problem(norm="l2", n=N, seed=0, dim=16)
  flat = _problem(2, (16,))
  assert np.array_equal(box.model.w, flat.model.w) and np.array_equal(box.model.b, flat.model.b)
  p = flat._replace(x=box.x, y=box.y, target=1 - box.y, distance=box.distance,
                    distances=np.full((N, 2), np.inf))  # per-class box-free distances: unused
  ratio = _ratios(p, _run(p))
  assert np.median(ratio) <= 1.005 and ratio.max() <= 1.03, (np.median(ratio), ratio.max())


def test_ten_classes_image_shape():
  p = _problem(10, (4, 4, 1))
  ratio = _ratios(p, _run(p))
  assert np.median(ratio) <= 1.25 and ratio.max() <= 2.0, (np.median(ratio), ratio.max())
  ratio = _ratios(p, _run(p, scale=1000.0), scale=1000.0)
  assert np.median(ratio) <= 1.01 and np.quantile(ratio, 0.75) <= 1.05, np.sort(ratio)


def test_targeted_towards_the_nearest_class():
  """Towards the nearest class ``t`` the exact targeted distance is :math:`d^*` too; success
  means ``argmax == t``."""
  p = _problem(10, (4, 4, 1))
  ratio = _ratios(p, _run(p, targeted=True), targeted=True)
  assert np.median(ratio) <= 1.25, np.sort(ratio)
  ratio = _ratios(p, _run(p, scale=1000.0, targeted=True), scale=1000.0, targeted=True)
  assert np.median(ratio) <= 1.01 and ratio.max() <= 1.1, np.sort(ratio)


def test_eps_is_an_upper_bound_on_the_norm():
  """Below :math:`d^*` nothing succeeds and ``x`` comes back bitwise; with a per-example eps the
  verdict is the unbounded run's (``norm <= eps``) and every point found lies in its ball."""
  p = _problem(2, (16,))
  below = _run(p, eps=0.98 * p.distance)
  assert not np.asarray(below.success).any()
  np.testing.assert_array_equal(np.asarray(below.x_adv), p.x)
  np.testing.assert_array_equal(np.asarray(below.norm), np.inf)
  unbounded = np.asarray(_run(p).norm)
  eps = np.where(np.arange(N) % 2 == 0, 0.98, 1.05) * p.distance
  mixed = _run(p, eps=eps)
  success = np.asarray(mixed.success)
  np.testing.assert_array_equal(success, unbounded <= eps.astype(np.float32))
  assert success[1::2].mean() >= 0.9
  np.testing.assert_array_equal(np.asarray(mixed.x_adv)[~success], p.x[~success])
  size = np.asarray(jr.projections.norm(mixed.x_adv - jnp.asarray(p.x), "l2"))
  assert np.all(size <= eps.astype(np.float32))


def test_levels_put_every_point_on_the_grid():
  """``levels=256``: points on the grid ``k / 255`` of the box, still adversarial and never
  closer than :math:`d^*`, a little farther than without rounding."""
  p = _problem(2, (16,))
  x = np.round(p.x * 255) / np.float32(255)
  moved = p._replace(x=x.astype(np.float32), distance=p.model.min_distance(x, p.y, "l2"))
  assert np.all(moved.distance > 0)  # still correctly classified
  result = _run(moved, levels=256)
  ticks = np.asarray(result.x_adv, np.float64) * 255
  np.testing.assert_allclose(ticks, np.round(ticks), atol=1e-3)
  ratio = _ratios(moved, result)
  assert np.median(ratio) <= 1.05, np.sort(ratio)


def test_a_flat_model_is_left_along_a_random_direction():
  """The model is flat around every input (``relu(x - 0.6)`` with inputs below 0.5), so its
  gradient is 0: DDN moves along a Gaussian direction from the example's key until the model
  responds, and then breaks every point. The same key gives the same points."""
  rng = np.random.default_rng(0)
  w = jnp.asarray([[0.0, 1.0]] * 16, jnp.float32)  # class 1 rises with every coordinate above 0.6
  logits_fn = lambda v: jax.nn.relu(v.reshape(v.shape[0], -1) - 0.6) @ w + jnp.array([[0.5, 0.0]])
  x = jnp.asarray(rng.uniform(0.0, 0.5, size=(8, 16)), jnp.float32)
  y = jnp.zeros(8, jnp.int32)
  assert not np.asarray(jax.grad(lambda v: jnp.sum(logits_fn(v)))(x)).any()
  run = jax.jit(lambda x, key: jr.run(ddn(steps=30), logits_fn, x, y, jr.Budget(jnp.inf), key))
  first = run(x, jax.random.key(1))
  assert np.asarray(first.success).all()
  np.testing.assert_array_equal(np.asarray(run(x, jax.random.key(1)).x_adv),
                                np.asarray(first.x_adv))


def test_the_attack_and_its_configuration():
  attack = jr.attacks.ddn(steps=7, targeted=True)
  assert attack.minimum_norm and attack.targeted and attack.norm == "l2"
  assert attack.num_steps == 7 and attack.name == "ddn-l2-7-targeted"
  assert '"factory": "ddn"' in attack.config and '"gamma": 0.05' in attack.config


@pytest.mark.parametrize("kwargs, match", [
    (dict(steps=0), "steps must be an int >= 1"),
    (dict(init_epsilon=0.0), "init_epsilon"),
    (dict(gamma=1.0), "gamma"),
    (dict(gamma=float("nan")), "gamma"),
    (dict(alpha_init=-1.0), "alpha_init"),
    (dict(alpha_final=2.0), "alpha_final"),
    (dict(levels=1), "levels"),
    (dict(levels=2.5), "levels"),
    (dict(targeted=1), "targeted"),
])
def test_invalid_options_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    ddn(**kwargs)
