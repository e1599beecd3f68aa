r"""``jr.attacks.min_norm_search``: fixed-budget attacks as minimum-norm ones, against ground truth.

On a linear model the exact minimal adversarial distance :math:`d^*` of each point is known in
closed form (:mod:`tests.ground_truth`; the points are chosen so that the box does not change it
and every radius in :math:`(d^*, 1.05\,d^*]` holds an adversarial point inside the box). The
search keeps :math:`\ell < d^* \le h` and stops at :math:`h \le (1 + r)\,\ell`, so with an inner
attack that succeeds whenever its ball holds an adversarial point its answer lies in
:math:`[d^*, (1 + r)\,d^*]`. PGD and APGD are that complete on two-class linear models only up to
their convergence: near :math:`d^*` a run of 10-30 steps can miss (the fixed-budget ground truth,
``tests/test_ground_truth.py``, holds them to :math:`1.02\,d^*`), and such a miss raises
:math:`\ell` just above :math:`d^*`. Hence the bar: every answer in
:math:`[(1 - 10^{-5})\,d^*, (1 + r)\,1.01\,d^*]` (:math:`10^{-5}`: float32 rounding of the
returned point against the float64 distance; 1%: the inner attack's reach), the median within
:math:`(1 + r)\,d^*`. Measured: every answer of every case below is within :math:`1.0099\,d^*`.

Each case attacks one batch of ``3 n`` rows, the same ``n`` points (16; 24 for the case that
also runs densely) three times with per-example eps: ``inf`` (the search), :math:`0.95\,d^*`
(nothing to find: success False, norm ``inf``) and :math:`1.05\,d^*` (an adversarial point
inside the ball). PGD (10 steps) and APGD (20; 30 for L1) each run in every norm, on flat
``[B, D]`` inputs for one family and NHWC ``[B, H, W, C]`` for the other in each norm. Model
weights, data, eps and keys are arguments of one compiled program per case.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from tests.ground_truth import linear_problem

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

N = 16  # points per problem; the batch holds each three times (3 N = 48 rows)
EXIT_CASE = ("pgd", "linf")  # also run densely: 24 points (72 rows, more than a chunk of 64)
RTOL = 0.01
SEARCH_STEPS = 20
SCALE = 1.05  # the problems guarantee an adversarial point at every radius in (d*, SCALE d*]
REACH = 1.01  # how far above d* the inner attacks may miss (see the module docstring)
ROUNDING = 1e-5
SHAPES = {"flat": (64,), "nhwc": (4, 4, 4)}
# (family, norm) -> layout: each family and each norm meets both layouts.
CASES = {("pgd", "linf"): "flat", ("pgd", "l2"): "nhwc", ("pgd", "l1"): "flat",
         ("apgd", "linf"): "nhwc", ("apgd", "l2"): "flat", ("apgd", "l1"): "nhwc"}
IDS = [f"{family}-{norm}-{layout}" for (family, norm), layout in CASES.items()]


def _inner(family: str, norm: str) -> jr.Attack:
  # APGD-L1 at 20 steps missed one point at 1.09 d* (one run of about 450), hence 30 steps.
  if family == "pgd":
    return jr.attacks.pgd(norm, steps=10)
  return jr.attacks.apgd(norm, steps=30 if norm == "l1" else 20)


def _attack(family: str, norm: str) -> jr.Attack:
  return jr.attacks.min_norm_search(_inner(family, norm), search_steps=SEARCH_STEPS, rtol=RTOL)


@functools.lru_cache(maxsize=None)
def _problem(norm: str, n: int):
  """Two-class linear points (flat) with their exact distances; every layout reshapes them."""
  return linear_problem(shape=(64,), classes=2, norm=norm, n=n, seed=0, scale=SCALE)


def _model(w, b):
  return lambda v: v.reshape(v.shape[0], -1) @ w + b[None, :]


@functools.lru_cache(maxsize=None)
def _compiled(family: str, norm: str, **options):
  attack = _attack(family, norm)

  @jax.jit
  def run(w, b, x, y, eps, keys):
    return jr.run(attack, _model(w, b), x, y, jr.Budget(eps), keys, **options)

  return run


def _batch(family: str, norm: str):
  """``(w, b, x, y, eps, keys)`` for the three copies of the points, and ``d*`` per row."""
  n = _points(family, norm)
  p = _problem(norm, n)
  x = np.concatenate([p.x] * 3).reshape((3 * n,) + SHAPES[CASES[family, norm]])
  y = np.concatenate([p.y] * 3)
  d = np.concatenate([p.distance] * 3)
  eps = np.concatenate([np.full(n, np.inf), 0.95 * p.distance, SCALE * p.distance])
  keys = jax.random.split(jax.random.key(0), 3 * n)
  args = (jnp.asarray(p.model.w, jnp.float32), jnp.asarray(p.model.b, jnp.float32),
          jnp.asarray(x), jnp.asarray(y), jnp.asarray(eps, jnp.float32), keys)
  return args, d


def _points(family: str, norm: str) -> int:
  return 24 if (family, norm) == EXIT_CASE else N


@functools.lru_cache(maxsize=None)
def _result(family: str, norm: str):
  args, d = _batch(family, norm)
  return jax.tree.map(np.asarray, _compiled(family, norm)(*args)), args, d


@pytest.mark.parametrize("family, norm", list(CASES), ids=IDS)
def test_eps_star_is_the_exact_minimum_within_the_tolerance(family, norm):
  result, (_, _, x, _, eps, _), d = _result(family, norm)
  x, eps, n = np.asarray(x), np.asarray(eps), _points(family, norm)
  search, below, above = (slice(i * n, (i + 1) * n) for i in range(3))
  size = np.asarray(result.norm, np.float64)
  assert result.x_adv.min() >= 0.0 and result.x_adv.max() <= 1.0
  delta = (result.x_adv.astype(np.float64) - x.astype(np.float64)).reshape(3 * n, -1)
  recomputed = np.linalg.norm(delta, ord={"linf": np.inf, "l2": 2, "l1": 1}[norm], axis=1)

  # eps = inf: every point found, never below d*, within the search's tolerance above it.
  assert result.success[search].all()
  assert int(result.info["counts"]["minimum_norm_not_found"]) == 0
  np.testing.assert_allclose(size[search], recomputed[search], rtol=ROUNDING)
  ratio = size[search] / d[search]
  assert ratio.min() >= 1 - ROUNDING, ratio.min()
  assert ratio.max() <= (1 + RTOL) * REACH, ratio.max()
  assert np.median(ratio) <= 1 + RTOL, np.median(ratio)

  # eps = 0.95 d*: nothing to find, x returned with norm inf.
  assert not result.success[below].any()
  assert np.isinf(size[below]).all()
  np.testing.assert_array_equal(result.x_adv[below], x[below])

  # eps = 1.05 d*: found, inside the ball.
  assert result.success[above].all()
  assert (recomputed[above] <= eps[above] * (1 + ROUNDING)).all()
  assert (size[above] >= d[above] * (1 - ROUNDING)).all()


@pytest.mark.parametrize("family, norm", [("pgd", "l2"), ("apgd", "linf")])
def test_the_answer_does_not_depend_on_the_order_of_the_batch(family, norm):
  result, args, _ = _result(family, norm)
  perm = np.random.default_rng(1).permutation(3 * _points(family, norm))
  w, b, *rows = args
  permuted = _compiled(family, norm)(w, b, *(r[perm] for r in rows))
  np.testing.assert_array_equal(np.asarray(permuted.success), result.success[perm])
  np.testing.assert_allclose(np.asarray(permuted.norm), result.norm[perm], rtol=ROUNDING)


def test_early_exit_and_chunking_do_not_change_the_answer():
  """The default run against the dense one (``early_exit=False``: one plain scan of the search
  steps, as a minimum-norm curve runs it), on 72 rows: by default the engine exits early at the
  finite eps and moves the search's state in chunks of 36 rows (the default chunk of 64,
  balanced), while in the dense run the inner attacks move their rows in such chunks. At a
  finite eps early exit stops a row at its first adversarial point (inside the ball) and the
  dense run goes on to the smallest: the same verdicts; at eps = inf and where nothing is found,
  the same norms."""
  default, args, _ = _result(*EXIT_CASE)
  dense = _compiled(*EXIT_CASE, early_exit=False)(*args)
  assert default.success.shape == (72,)
  np.testing.assert_array_equal(np.asarray(dense.success), default.success)
  n = _points(*EXIT_CASE)
  same = np.isinf(np.asarray(args[4])) | ~default.success
  assert same.sum() == 2 * n
  np.testing.assert_allclose(np.asarray(dense.norm)[same], default.norm[same], rtol=ROUNDING)


def test_the_attack_it_builds():
  inner = jr.attacks.pgd("l1", steps=7, targeted=True, loss="margin")
  attack = jr.attacks.min_norm_search(inner, search_steps=9, init_eps=0.5, max_eps=3.0)
  assert attack.minimum_norm and attack.num_steps == 9 and attack.norm == "l1"
  assert attack.targeted and attack.done is not None
  assert attack.name == f"min-norm-search-9({inner.name})"
  config = json.loads(attack.config)
  assert config["factory"] == "min_norm_search" and config["attack"] == json.loads(inner.config)
  assert (config["search_steps"], config["init_eps"], config["factor"], config["rtol"],
          config["max_eps"]) == (9, 0.5, 2.0, 0.001, 3.0)


def test_refusals():
  search = jr.attacks.min_norm_search
  pgd = jr.attacks.pgd("linf", steps=3)
  with pytest.raises(TypeError, match="wraps a jr.Attack"):
    search(lambda x: x)
  with pytest.raises(ValueError, match="already a minimum-norm attack"):
    search(jr.attacks.fmn("linf", steps=3))
  with pytest.raises(ValueError, match="suite"):
    search(jr.attacks.ensemble(jr.attacks.fgsm("linf"), pgd))
  with pytest.raises(ValueError, match="randomized"):
    search(jr.attacks.eot(pgd, samples=2))
  for bad in ({"rtol": 0.0}, {"rtol": float("inf")}, {"factor": 1.0}, {"factor": float("nan")},
              {"search_steps": 0}, {"init_eps": 0.0}, {"max_eps": -1.0}):
    with pytest.raises(ValueError, match=next(iter(bad))):
      search(pgd, **bad)


def test_default_precision_with_a_complete_inner_attack():
  # On a two-class linear model FGSM (Linf) is complete: its one step eps * sign(w_k - w_y) is
  # the optimal perturbation, inside the box up to 1.05 d* on these points. So every failure is
  # below d* (lo < d*) and the default search returns within (1 + rtol) d*, rtol = 0.001: a
  # tenth of this file's RTOL, which the bisection alone would not reach.
  p = _problem("linf", N)
  attack = jr.attacks.min_norm_search(jr.attacks.fgsm("linf"))
  assert json.loads(attack.config)["rtol"] == 0.001
  result = jax.jit(lambda w, b, x, y, keys: jr.run(attack, _model(w, b), x, y, jr.Budget(jnp.inf),
                                                   keys))(
      jnp.asarray(p.model.w, jnp.float32), jnp.asarray(p.model.b, jnp.float32),
      jnp.asarray(p.x), jnp.asarray(p.y), jax.random.split(jax.random.key(0), N))
  ratio = np.asarray(result.norm, np.float64) / p.distance
  assert np.asarray(result.success).all()
  assert ratio.min() >= 1 - ROUNDING and ratio.max() <= (1 + 0.001) * (1 + ROUNDING), ratio
