"""Regression tests: jr.run and jr.robustness_curve never turn a broken computation into a verdict.

Each test reproduces one way a number could silently be wrong: NaN input gradients, overflowing
logits, targeted success on points that were already misclassified, invalid labels with NaN
logits, low-precision inputs whose rounding changes the verdict, Explicit-mesh arrays used without
``jax.set_mesh``, and confusing errors for randomized-model and targeted options.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxrobust as jr
from jaxrobust.engine import scoring

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

DIM, CLASSES, BATCH = 16, 4, 32


@pytest.fixture(scope="module")
def problem():
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(DIM, CLASSES)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(DIM, 4)), jnp.float32)
  x = jnp.asarray(rng.uniform(0.3, 0.7, size=(BATCH, DIM)), jnp.float32)
  y = jnp.argmax(x @ w, axis=1).astype(jnp.int32)
  return w, v, x, y


def linear(w, x):
  return x.reshape(x.shape[0], -1) @ w


def nan_gradient(w, v, x):
  """The same logits as ``linear``, but the input gradient is NaN wherever some ``h < 0`` (the
  ``where(h > 0, sqrt(h), 0)`` trap: the untaken branch's derivative is NaN, times 0)."""
  h = x.reshape(x.shape[0], -1) @ v - 2.0
  masked = jnp.where(h > 0, jnp.sqrt(h), 0.0)
  return linear(w, x) + 0.0 * jnp.sum(masked, axis=1, keepdims=True)


# Every attack family at small settings: (attack, eps). Minimum-norm attacks take eps = inf.
ATTACKS = {
    "fgsm": (lambda: jr.attacks.fgsm("linf"), 0.05),
    "pgd-linf": (lambda: jr.attacks.pgd("linf", steps=5), 0.05),
    "pgd-l2": (lambda: jr.attacks.pgd("l2", steps=5), 0.3),
    "apgd": (lambda: jr.attacks.apgd("linf", steps=5), 0.05),
    "square": (lambda: jr.attacks.square("linf", queries=20), 0.05),
    "fab": (lambda: jr.attacks.fab("l2", steps=5), float("inf")),
    "fmn": (lambda: jr.attacks.fmn("l2", steps=5), float("inf")),
    "deepfool": (lambda: jr.attacks.deepfool("l2", steps=5), float("inf")),
    "carlini_wagner_l2": (lambda: jr.attacks.carlini_wagner_l2(steps=5, binary_search_steps=2),
                          float("inf")),
    "auto_attack": (lambda: jr.attacks.auto_attack("linf", n_target_classes=2, steps=4,
                                                   queries=20), 0.05),
}


def _budget_argument(eps):
  """A finite eps as a jit argument; ``None`` for the minimum-norm attacks' ``eps = inf``, which
  stays a constant of the program (traced, it cost ~8 s more CPU in tests/test_min_norm_found)."""
  return jnp.float32(eps) if np.isfinite(eps) else None


def _budget(eps):
  return jnp.inf if eps is None else eps


def one_program(runs, *args):
  """``name -> result`` of ``runs[name](*args)``, compiled together into one program (one
  compilation instead of one per run) on first use; ``args`` (weights, data, budgets, keys) are
  the program's arguments, never constants folded into it. If that raises, each run is compiled
  on its own, so only the tests of the runs that raise fail."""
  names, results = list(runs), {}

  def get(name):
    if not results:
      try:  # a list: the names need not be sortable pytree keys
        results.update(zip(names, jax.jit(lambda *a: [runs[n](*a) for n in names])(*args)))
      except Exception:  # noqa: BLE001 - the test of the run that raises reports it
        results.update({n: None for n in names})
    if results[name] is None:
      results[name] = jax.jit(runs[name])(*args)
    return results[name]

  return get


@pytest.fixture(scope="module")
def nan_gradient_runs(problem):
  w, v, x, y = problem
  attacks = {name: make() for name, (make, _) in ATTACKS.items()}
  eps = {name: _budget_argument(eps) for name, (_, eps) in ATTACKS.items()}

  def run(name, w, v, x, y, eps, key):
    return jr.run(attacks[name], functools.partial(nan_gradient, w, v), x, y,
                  jr.Budget(_budget(eps[name])), key)

  return attacks, one_program({name: functools.partial(run, name) for name in ATTACKS},
                              w, v, x, y, eps, jax.random.key(0))


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_nan_gradients_give_finite_points_and_a_flag(problem, nan_gradient_runs, name):
  w, v, x, y = problem
  _, eps = ATTACKS[name]
  model = functools.partial(nan_gradient, w, v)
  grad = jax.grad(lambda x: jnp.sum(jax.nn.log_softmax(model(x))[jnp.arange(BATCH), y]))(x)
  bad = ~np.isfinite(np.asarray(grad)).all(axis=1)
  assert bad.sum() >= BATCH // 2  # the model really has NaN gradients on most points

  attacks, result_of = nan_gradient_runs
  attack, result = attacks[name], result_of(name)
  x_adv = np.asarray(result.x_adv)
  assert np.isfinite(x_adv).all()
  assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
  if np.isfinite(eps):
    assert np.all(np.asarray(jr.projections.norm(result.x_adv - x, attack.norm)) <= eps * 1.0001)
  # Verdicts are re-predictions of the returned (finite) points, never artefacts of NaN.
  pred = np.asarray(jnp.argmax(linear(w, result.x_adv), axis=1))
  np.testing.assert_array_equal(np.asarray(result.success), pred != np.asarray(y))
  assert bool(result.info["flags"]["non_finite_gradients"])
  assert int(result.info["counts"]["non_finite_gradient_points"]) == int(bad.sum())


def test_plain_model_raises_no_gradient_flag(problem):
  w, _, x, y = problem
  result = jax.jit(lambda w, x, y, eps, key: jr.run(
      jr.attacks.pgd(steps=3), functools.partial(linear, w), x, y, jr.Budget(eps), key))(
          w, x, y, jnp.float32(0.05), jax.random.key(0))
  assert not bool(result.info["flags"]["non_finite_gradients"])
  assert int(result.info["counts"]["non_finite_gradient_points"]) == 0
  assert not bool(result.info["flags"]["non_finite_adversarials"])


def test_nan_gradient_curve_at_eps_zero_is_clean_accuracy_and_flagged(problem):
  w, v, x, y = problem
  curve = jax.jit(lambda w, v, x, y, eps, key: jr.robustness_curve(
      jr.attacks.pgd("l2", steps=5), functools.partial(nan_gradient, w, v), x, y, eps, key))(
          w, v, x, y, jnp.array([0.0, 0.5]), jax.random.key(0))
  assert float(curve.robust_accuracy[0]) == float(curve.clean_accuracy) == 1.0
  assert bool(curve.info["flags"]["non_finite_gradients"])


def _bad_gradient_rows(model, x, y):
  """The independent count's rows: clean-correct points whose cross-entropy input gradient has
  a non-finite entry; and the rows with such a gradient, correct or not."""
  grad = jax.grad(lambda x: jnp.sum(jr.losses.cross_entropy(model(x), y)))(x)
  correct = np.asarray(jnp.argmax(model(x), axis=1) == y)
  non_finite = ~np.isfinite(np.asarray(grad)).all(axis=1)
  return correct & non_finite, non_finite


def test_non_finite_gradient_count_is_the_same_at_every_front_door(problem):
  """jr.run, jr.robustness_curve (fixed budget and minimum norm) and jr.evaluate count the same
  rows (engine.scoring.gradient_checks): clean-correct data rows, once, never the padding."""
  w, v, x, y = problem
  model = functools.partial(nan_gradient, w, v)
  y = jnp.where(jnp.arange(BATCH) % 3 == 0, (y + 1) % CLASSES, y).astype(jnp.int32)
  bad, non_finite = _bad_gradient_rows(model, x, y)
  # Misclassified rows with NaN gradients exist, so counting them would show.
  assert bad.sum() >= 4 and np.any(non_finite & ~bad)
  first = int(np.flatnonzero(bad)[0])
  # 27 rows in batches of 8: the last batch (3 rows) starts with a counted row, copied into its
  # 5 padding rows, so counting the padding would add 5.
  rest = np.delete(np.arange(BATCH), first)
  rows = np.concatenate([rest[:24], [first], rest[24:26]])
  x, y, bad = x[rows], y[rows], bad[rows]
  expected = int(bad.sum())

  pgd = jr.attacks.pgd("l2", steps=1)
  key = jax.random.key(0)

  # The three in-graph front doors in one compiled program (run eagerly, each compiled its own
  # loops and dozens of single operations: about 2.5 s more CPU), the weights, data, eps and key
  # its arguments.
  @jax.jit
  def front_doors(w, v, x, y, eps, grid, min_norm_grid, key):
    model = functools.partial(nan_gradient, w, v)
    return {
        "run": jr.run(pgd, model, x, y, jr.Budget(eps), key).info,
        "curve": jr.robustness_curve(pgd, model, x, y, grid, key).info,
        "min-norm curve": jr.robustness_curve(jr.attacks.fmn("l2", steps=2), model, x, y,
                                              min_norm_grid, key).info,
    }

  counts = front_doors(w, v, x, y, jnp.float32(0.3), jnp.array([0.0, 0.3, 0.6]),
                       jnp.array([0.3]), key)
  counts = {k: (int(i["counts"]["non_finite_gradient_points"]),
                bool(i["flags"]["non_finite_gradients"])) for k, i in counts.items()}
  report = jr.evaluate(model, (np.asarray(x), np.asarray(y)), attacks={"pgd": pgd},
                       epsilons=np.array([0.3], np.float32), key=key, batch_size=8,
                       progress=False)
  counts["evaluate"] = (int(report.attacks["pgd"].counts["non_finite_gradient_points"]),
                        bool(report.flags["pgd"]["non_finite_gradients"]))
  assert counts == dict.fromkeys(counts, (expected, True))


def test_run_attack_counts_non_finite_gradients_on_active_rows_only(problem):
  """Rows outside ``active`` are not data (padding): the engine's own clean diagnosis does not
  count them either."""
  from jaxrobust._options import RunOptions
  from jaxrobust.engine.attack_loop import run_attack
  w, v, x, y = problem
  model = functools.partial(nan_gradient, w, v)
  bad, _ = _bad_gradient_rows(model, x, y)
  active = np.arange(BATCH) % 2 == 0
  assert 0 < (bad & active).sum() < bad.sum()
  result, _ = run_attack(jr.attacks.fgsm("linf"), model, x, y, jr.Budget(0.05),
                         jax.random.key(0), active=jnp.asarray(active),
                         options=RunOptions(early_exit=False, canonical=False))
  assert int(result.info["counts"]["non_finite_gradient_points"]) == int((bad & active).sum())


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_huge_logits_do_not_break_points_at_eps_zero(problem, norm):
  w, _, x, y = problem
  model = lambda w, x: 1e9 * linear(w, x)  # overflows the loss, not the prediction
  result = jax.jit(lambda w, x, y, eps, key: jr.run(
      jr.attacks.pgd(norm, steps=5), functools.partial(model, w), x, y, jr.Budget(eps), key))(
          w, x, y, jnp.float32(0.0), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(result.x_adv), np.asarray(x))
  assert not np.asarray(result.success).any()


def _misclassified_half(y):
  """Labels with every other point made wrong, and targets different from the label and from
  the clean prediction on the wrong points (so success there would be a lie)."""
  y_used = jnp.where(jnp.arange(BATCH) % 2 == 0, y, (y + 1) % CLASSES)
  target = (y_used + 1) % CLASSES
  target = jnp.where(target == y, (target + 1) % CLASSES, target)
  return y_used.astype(jnp.int32), target.astype(jnp.int32)


TARGETED = {
    "pgd": (lambda: jr.attacks.pgd("linf", steps=5, targeted=True), 0.02),
    "fmn": (lambda: jr.attacks.fmn("l2", steps=10, targeted=True), float("inf")),
    "fab": (lambda: jr.attacks.fab("l2", targeted=True, n_target_classes=None, steps=5),
            float("inf")),
    "square": (lambda: jr.attacks.square("linf", queries=20, targeted=True), 0.02),
}


@pytest.fixture(scope="module")
def targeted_runs(problem):
  w, _, x, y = problem
  y_used, target = _misclassified_half(y)
  attacks = {name: make() for name, (make, _) in TARGETED.items()}
  eps = {name: _budget_argument(eps) for name, (_, eps) in TARGETED.items()}

  def run(name, w, x, y, target, eps, key):
    return jr.run(attacks[name], functools.partial(linear, w), x, y, jr.Budget(_budget(eps[name])),
                  key, target=target)

  return one_program({name: functools.partial(run, name) for name in TARGETED},
                     w, x, y_used, target, eps, jax.random.key(0))


@pytest.mark.parametrize("name", sorted(TARGETED))
def test_targeted_success_means_target_reached(problem, targeted_runs, name):
  w, _, x, y = problem
  y_used, target = _misclassified_half(y)
  model = functools.partial(linear, w)
  result = targeted_runs(name)
  pred = jnp.argmax(model(result.x_adv), axis=1)
  np.testing.assert_array_equal(np.asarray(result.success), np.asarray(pred == target))
  clean_pred = jnp.argmax(model(x), axis=1)
  rate = jr.metrics.attack_success_rate(clean_pred, pred, y_used, target=target)
  assert float(jnp.mean(result.success)) == pytest.approx(float(rate))
  wrong = np.asarray(clean_pred != y_used)
  np.testing.assert_array_equal(np.asarray(result.x_adv)[wrong], np.asarray(x)[wrong])


def test_targeted_curve_counts_points_whose_prediction_left_y(problem):
  """A targeted attack that moves a point to a class other than its target did not succeed, but
  the point is not robust: the curve agrees with re-predicting the attack's points."""
  w, _, x, y = problem
  y_used, target = _misclassified_half(y)
  model = functools.partial(linear, w)
  attack = jr.attacks.pgd("linf", steps=5, targeted=True)
  eps = jnp.array([0.0, 0.02, 0.1])
  curve = jax.jit(lambda w, x, y, eps, key, target: jr.robustness_curve(
      attack, functools.partial(linear, w), x, y, eps, key, target=target))(
          w, x, y_used, eps, jax.random.key(0), target)
  run = jax.jit(lambda w, x, y, eps, keys, target: jr.run(
      attack, functools.partial(linear, w), x, y, jr.Budget(eps), keys, target=target))
  correct = np.asarray(jnp.argmax(model(x), axis=1) == y_used)
  assert float(curve.clean_accuracy) == pytest.approx(correct.mean())
  # The curve runs eps k with each example's key (fold_in(key, i)) folded with k.
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(
      jnp.arange(BATCH, dtype=jnp.uint32))
  for k, e in enumerate(np.asarray(eps)):
    keys_k = jax.vmap(lambda key: jax.random.fold_in(key, k))(keys)
    result = run(w, x, y_used, jnp.float32(e), keys_k, target)
    robust = correct & np.asarray(jnp.argmax(model(result.x_adv), axis=1) == y_used)
    if k:  # the curve also takes the worst case over smaller eps
      robust &= np.asarray(curve.robust[k - 1])
    np.testing.assert_array_equal(np.asarray(curve.robust[k]), robust)


def test_invalid_label_with_nan_logits_is_not_correct(problem):
  _, _, x, y = problem
  model = lambda x: jnp.full((x.shape[0], CLASSES), jnp.nan)
  labels = jnp.full_like(y, -1)  # only shape-checked inside jit
  result = jax.jit(lambda x, y, eps, key: jr.run(jr.attacks.fgsm(), model, x, y, jr.Budget(eps),
                                                 key))(x, labels, jnp.float32(0.05),
                                                       jax.random.key(0))
  assert np.asarray(result.success).all()
  curve = jax.jit(lambda x, y, eps, key: jr.robustness_curve(jr.attacks.fgsm(), model, x, y, eps,
                                                             key))(x, labels, jnp.array([0.0]),
                                                                   jax.random.key(0))
  assert float(curve.clean_accuracy) == 0.0


LOW_PRECISION = [jnp.bfloat16, jnp.float16]
LOW_PRECISION_EPS = {"linf": 0.05, "l2": 0.3, "l1": 1.0}


def low_precision_model(w, dtype):
  return functools.partial(_low_precision_logits, dtype, w)


def _low_precision_logits(dtype, w, x):
  return linear(w.astype(dtype), x.astype(dtype)).astype(jnp.float32)


def low_precision_problem(problem, dtype):
  w, _, x, _ = problem
  xl = x.astype(dtype)
  return xl, jnp.argmax(low_precision_model(w, dtype)(xl), axis=1).astype(jnp.int32)


@pytest.fixture(scope="module")
def low_precision_runs(problem):
  w = problem[0]
  data = {jnp.dtype(dtype).name: low_precision_problem(problem, dtype) for dtype in LOW_PRECISION}
  eps = {norm: jnp.float32(eps) for norm, eps in LOW_PRECISION_EPS.items()}

  def run(dtype, norm, w, data, eps, key):
    xl, yl = data[jnp.dtype(dtype).name]
    return jr.run(jr.attacks.pgd(norm, steps=5), low_precision_model(w, dtype), xl, yl,
                  jr.Budget(eps[norm]), key)

  return one_program({(dtype, norm): functools.partial(run, dtype, norm)
                      for dtype in LOW_PRECISION for norm in LOW_PRECISION_EPS},
                     w, data, eps, jax.random.key(0))


@pytest.mark.parametrize("dtype", LOW_PRECISION)
@pytest.mark.parametrize("norm", ["linf", "l2", "l1"])
def test_low_precision_inputs_come_back_in_their_dtype_inside_the_ball(problem, low_precision_runs,
                                                                       dtype, norm):
  w = problem[0]
  xl, yl = low_precision_problem(problem, dtype)
  model = low_precision_model(w, dtype)
  eps = LOW_PRECISION_EPS[norm]
  result = low_precision_runs((dtype, norm))
  assert result.x_adv.dtype == dtype
  delta = result.x_adv.astype(jnp.float32) - xl.astype(jnp.float32)
  assert float(jnp.max(jr.projections.norm(delta, norm))) <= float(jnp.float32(eps))
  np.testing.assert_array_equal(np.asarray(result.success),
                                np.asarray(jnp.argmax(model(result.x_adv), axis=1) != yl))


# Float32 points inside the ball exactly (as computed), on a [0, 255] box where x + eps rounds:
# before, Linf PGD returned max |x_adv - x| = 8.0000076 at eps 8 on every row, L2 Square 0.50000024.
BALL_ATTACKS = {
    "pgd-linf": (lambda: jr.attacks.pgd("linf", steps=5), 8.0),
    "pgd-l2": (lambda: jr.attacks.pgd("l2", steps=5), 0.3 * 255),
    "pgd-l1": (lambda: jr.attacks.pgd("l1", steps=5), 255.0),
    "apgd-l2": (lambda: jr.attacks.apgd("l2", steps=5), 0.3 * 255),
    "square-l2": (lambda: jr.attacks.square("l2", queries=20), 0.3 * 255),
}


@pytest.fixture(scope="module")
def ball_runs(problem):
  w, _, x, y = problem
  x255 = x * 255
  eps = {name: jnp.float32(eps) for name, (_, eps) in BALL_ATTACKS.items()}

  def run(name, w, x, y, eps, key):
    model = lambda v: linear(w, v / 255)
    return jr.run(BALL_ATTACKS[name][0](), model, x, y, jr.Budget(eps[name], 0.0, 255.0), key,
                  early_exit=False)

  return x255, one_program({name: functools.partial(run, name) for name in BALL_ATTACKS},
                           w, x255, y, eps, jax.random.key(0))


@pytest.mark.parametrize("name", sorted(BALL_ATTACKS))
def test_float32_points_are_inside_the_ball_as_computed(problem, ball_runs, name):
  x, results = ball_runs
  result = results(name)
  make, eps = BALL_ATTACKS[name]
  eps = float(jnp.float32(eps))
  norm = make().norm
  delta = result.x_adv - x
  assert float(jnp.max(result.norm)) <= eps
  assert float(jnp.max(jr.projections.norm(delta, norm))) <= eps
  if norm == "linf":
    assert float(jnp.max(jnp.abs(delta))) <= eps
  assert float(jnp.min(result.x_adv)) >= 0 and float(jnp.max(result.x_adv)) <= 255
  # Every row went to the sphere (not vacuous) and none fell back to x.
  assert float(jnp.min(result.norm)) >= 0.99 * eps
  np.testing.assert_array_equal(
      np.asarray(result.success),
      np.asarray(jnp.argmax(linear(problem[0], result.x_adv / 255), axis=1) != problem[3]))


def test_inside_ball_moves_only_rows_on_the_sphere_and_keeps_them_between_x_and_x_adv():
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.uniform(0, 255, size=(64, 48)), jnp.float32)
  direction = jnp.asarray(rng.normal(size=(64, 48)), jnp.float32)
  eps = jnp.asarray(rng.uniform(0.5, 20, size=64), jnp.float32)
  on_sphere = np.arange(64) % 2 == 0  # a few units in the last place outside; the others at eps/2
  for norm in ("linf", "l2", "l1"):
    unit = direction / jr.projections.norm(direction, norm)[:, None]
    x_adv = x + unit * eps[:, None] * jnp.where(on_sphere, 1 + 4e-7, 0.5)[:, None]
    assert bool(jnp.any(jr.projections.norm(x_adv - x, norm) > eps))
    inside = scoring.inside_ball(x_adv, x, eps, norm)
    size = jr.projections.norm(inside - x, norm)
    assert bool(jnp.all(size <= eps)), norm
    assert bool(jnp.all(size[on_sphere] >= eps[on_sphere] * (1 - 2**-10))), norm  # barely moved
    np.testing.assert_array_equal(np.asarray(inside)[~on_sphere], np.asarray(x_adv)[~on_sphere])
    between = (jnp.minimum(x, x_adv) <= inside) & (inside <= jnp.maximum(x, x_adv))
    assert bool(jnp.all(between)), norm


def _meshes():
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices")
  return {"explicit": jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,)),
          "auto": jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))}


MESH_CASES = [(entry, set_mesh, axes) for entry in ("run", "curve") for set_mesh in (False, True)
              for axes in ("explicit", "auto")]
# The compute-skipping paths reshard rows: without a mesh context is the case that used to fail.
MESH_CASES += [(entry, False, axes) for entry in ("curve_chunked", "auto_attack_chunked")
               for axes in ("explicit", "auto")]


@pytest.fixture(scope="module")
def mesh_entries(problem):
  """``entry -> (fn, its one-device result)``: the reference is compiled once per entry, not once
  per (mesh, set_mesh) case."""
  w, _, x, y = problem
  # The weights, budgets and key are arguments too: (w, x, y, curve eps, run eps, key).
  params = (w, jnp.array([0.0, 0.03, 0.1]), jnp.float32(0.05), jax.random.key(0))
  attack = jr.attacks.auto_attack("linf", n_target_classes=2, steps=3, queries=10)
  fns = {
      "run": lambda w, x, y, eps, run_eps, key: jr.run(
          jr.attacks.pgd(steps=3), functools.partial(linear, w), x, y, jr.Budget(run_eps),
          key).success,
      "curve": lambda w, x, y, eps, run_eps, key: jr.robustness_curve(
          jr.attacks.pgd(steps=3), functools.partial(linear, w), x, y, eps, key).robust,
      "curve_chunked": lambda w, x, y, eps, run_eps, key: jr.robustness_curve(
          jr.attacks.pgd(steps=3), functools.partial(linear, w), x, y, eps, key,
          chunk_size=8).robust,
      "auto_attack_chunked": lambda w, x, y, eps, run_eps, key: jr.run(
          attack, functools.partial(linear, w), x, y, jr.Budget(run_eps), key,
          chunk_size=8).success,
  }
  cache = {}

  def get(entry):
    if entry not in cache:
      w, eps, run_eps, key = params
      cache[entry] = fns[entry], params, np.asarray(
          jax.jit(fns[entry])(w, x, y, eps, run_eps, key))
    return cache[entry]

  return get


@pytest.mark.parametrize("entry,set_mesh,axes", MESH_CASES)
def test_sharded_arrays_with_and_without_set_mesh(problem, mesh_entries, axes, set_mesh, entry):
  _, _, x, y = problem
  mesh = _meshes()[axes]
  entry_fn, (w, eps, run_eps, key), expected = mesh_entries(entry)
  fn = lambda *a: entry_fn(*a)  # a new function: traced afresh, never a cached program
  xs = jax.device_put(x, NamedSharding(mesh, P("data")))
  ys = jax.device_put(y, NamedSharding(mesh, P("data")))
  if set_mesh:
    with jax.set_mesh(mesh):
      got = jax.jit(fn)(w, xs, ys, eps, run_eps, key)
  else:
    got = jax.jit(fn)(w, xs, ys, eps, run_eps, key)
  np.testing.assert_array_equal(np.asarray(got), expected)


def test_eot_on_a_deterministic_model_says_what_to_do(problem):
  w, _, x, y = problem
  with pytest.raises(ValueError, match="randomized model logits_fn"):
    jr.run(jr.attacks.eot(jr.attacks.pgd(steps=2), 2), functools.partial(linear, w), x, y,
           jr.Budget(0.05), jax.random.key(0))


def test_randomized_model_without_eot_says_what_to_do(problem):
  w, _, x, y = problem
  noisy = lambda x, keys: linear(w, x)
  with pytest.raises(ValueError, match="jr.attacks.eot"):
    jr.run(jr.attacks.pgd(steps=2), noisy, x, y, jr.Budget(0.05), jax.random.key(0))


def test_target_for_apgd_t_explains_n_target_classes(problem):
  w, _, x, y = problem
  with pytest.raises(ValueError, match="n_target_classes=None"):
    jr.run(jr.attacks.apgd(targeted=True, steps=2), functools.partial(linear, w), x, y,
           jr.Budget(0.05), jax.random.key(0), target=(y + 1) % CLASSES)


def saturated(w, x):
  """``linear``'s decisions, with logits clipped flat around every clean point of ``problem``:
  the input gradient is exactly zero wherever no margin is within 1e-4 of 0 (a masked model)."""
  return 1e3 * jnp.clip(1e4 * linear(w, x), -1.0, 1.0)


def _clean_rows(model, x, y):
  """The independent counts: clean-correct rows with an exactly zero cross-entropy input
  gradient, and whether every row's outputs lie in [0, 1] and sum to 1."""
  logits = model(x)
  grad = jax.grad(lambda x: jnp.sum(jr.losses.cross_entropy(model(x), y)))(x)
  correct = np.asarray(jnp.argmax(logits, axis=1) == y)
  zero = correct & np.all(np.asarray(grad) == 0, axis=1)
  z = np.asarray(logits, np.float64)
  probabilities = bool(np.all((z >= -1e-5) & (z <= 1 + 1e-5))
                       and np.all(np.abs(z.sum(1) - 1) <= 1e-5))
  return int(zero.sum()), probabilities


@pytest.mark.parametrize("kind", ["linear", "saturated", "softmax"])
def test_zero_gradients_and_probability_outputs_are_flagged_by_every_front_door(problem, kind):
  """A masked model (zero gradients) and a softmax model (probability outputs) make PGD report
  robustness that is not there; every attack at every front door flags them from the clean pass,
  with the independent count, and a plain linear model is flagged by none (before: only
  AutoAttack checked, so PGD's report read reliable)."""
  w, _, x, y = problem
  make = {"linear": linear, "saturated": saturated,
          "softmax": lambda w, x: jax.nn.softmax(linear(w, x))}[kind]
  zero, probabilities = _clean_rows(functools.partial(make, w), x, y)
  assert (zero > 0) == (kind == "saturated") and probabilities == (kind == "softmax")
  pgd, fmn = jr.attacks.pgd("linf", steps=2), jr.attacks.fmn("l2", steps=2)

  @jax.jit
  def front_doors(w, x, y, key):
    model = functools.partial(make, w)
    return {"run": jr.run(pgd, model, x, y, jr.Budget(0.05), key).info,
            "square": jr.run(jr.attacks.square("linf", queries=3), model, x, y, jr.Budget(0.05),
                             key).info,
            "curve": jr.robustness_curve(pgd, model, x, y, jnp.array([0.0, 0.05]), key).info,
            "min-norm curve": jr.robustness_curve(fmn, model, x, y, jnp.array([0.3]), key).info}

  found = front_doors(w, x, y, jax.random.key(0))
  report = jr.evaluate(functools.partial(make, w), (np.asarray(x), np.asarray(y)),
                       attacks={"pgd": pgd}, epsilons=[0.05], key=jax.random.key(0),
                       batch_size=12, progress=False)  # 32 rows: the last batch is padded
  found["evaluate"] = {"flags": report.flags["pgd"], "counts": report.attacks["pgd"].counts}
  for door, info in found.items():
    assert int(info["counts"]["zero_gradient_points"]) == zero, door
    assert bool(info["flags"]["zero_gradients"]) == (zero > 0), door
    assert bool(info["flags"]["probability_outputs"]) == probabilities, door
    assert int(info["counts"]["non_finite_logits"]) == 0, door
  assert report.reliable == (kind == "linear")
  statuses = {item.check: item.status for item in report.checklist}
  assert statuses["zero gradients"] == ("warn" if kind == "saturated" else "pass")
  assert statuses["logits, not probabilities"] == ("warn" if kind == "softmax" else "pass")


def test_non_finite_logits_at_the_returned_point_are_broken_and_counted(problem):
  """A model finite at x and NaN everywhere else: the attacked point is scored broken (NaN
  logits are never a correct prediction) and counted, and the checklist says so (it said "every
  returned point has finite logits", reading the finiteness of x_adv instead)."""
  w, _, x, y = problem
  model = lambda w, v: jnp.where(jnp.all(v == x[:4], axis=1, keepdims=True), 1.0, jnp.nan) \
      * linear(w, v)
  result = jr.run(jr.attacks.pgd("linf", steps=2), functools.partial(model, w), x[:4], y[:4],
                  jr.Budget(0.05), jax.random.key(0))
  assert np.asarray(result.success).all()
  assert int(result.info["counts"]["non_finite_adversarial_logits"]) == 4
  assert int(result.info["counts"]["non_finite_logits"]) == 0  # finite on the clean points
  assert not bool(result.info["flags"]["non_finite_adversarials"])  # the points are finite
  report = jr.evaluate(functools.partial(model, w), (np.asarray(x[:4]), np.asarray(y[:4])),
                       attacks={"pgd": jr.attacks.pgd("linf", steps=2)}, epsilons=[0.05],
                       key=jax.random.key(0), batch_size=4, progress=False)
  statuses = {item.check: item.status for item in report.checklist}
  assert statuses["finite adversarial logits"] == "warn" and not report.reliable
  assert statuses["finite adversarial points"] == "pass"


def test_numpy_float64_inputs_are_taken_as_float32_without_warnings(problem):
  """NumPy images are float64 (``x / 255.``); without x64 they become float32 once, at the front
  door, as ``jnp.asarray`` and ``jr.evaluate`` make them: no dtype warning from inside the library
  (the suite turns warnings into errors; before, one call raised 14)."""
  w, _, x, y = problem
  x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.int64)
  model = functools.partial(linear, w)
  attack = jr.attacks.pgd("linf", steps=2)
  result = jr.run(attack, model, x64, y64, jr.Budget(0.05), jax.random.key(0))
  assert result.x_adv.dtype == jnp.float32
  assert float(jnp.max(jnp.abs(result.x_adv - x))) <= float(jnp.float32(0.05))
  curve = jr.robustness_curve(attack, model, x64, y64, np.array([0.0, 0.05]), jax.random.key(0))
  assert float(curve.robust_accuracy[0]) == 1.0  # y is the clean prediction
  np.testing.assert_array_equal(np.asarray(curve.robust[1]), ~np.asarray(result.success))
