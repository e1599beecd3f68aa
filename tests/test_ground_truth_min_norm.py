r"""Every minimum-norm attack, with its default settings, against the exact minimal distance.

For logits :math:`z = x W + b` the smallest perturbation in norm :math:`p` that lifts class
:math:`j` to the label's level has size :math:`d_j = (z_y - z_j) / \|w_y - w_j\|_q` (:math:`q`
the dual exponent), reached by the steepest-ascent step of :math:`z_j - z_y` (for L1: all the mass
on the coordinate of largest :math:`|w_j - w_y|`). The points below are chosen so that the
optimal step to the nearest class :math:`t = \arg\min_j d_j`, grown by 5%, stays inside the box;
then :math:`d^* = d_t` is the exact minimal distance, untargeted and targeted towards :math:`t`
(a class above :math:`t` on the way would be nearer than :math:`t`). Hence, on ten-class models
with 64 features (each attack on flat ``[B, D]``, NHWC ``[B, H, W, C]`` or ``[B, T, F]`` inputs,
so that every family meets every layout):

* the same batch carries ``BOX`` more points where the box binds: pixels at its faces raise the
  minimal distance by 5% or more over the box-free one, and :math:`d^*` is computed exactly in the
  box (:func:`tests.ground_truth_box.multiclass_box_points`: the minimum over classes of the
  two-class box distances, kept where it is also exact towards the nearest class);
* at least 99% of the points get an adversarial point (every one can be misclassified inside
  the box), and the misses are counted in ``info["counts"]["minimum_norm_not_found"]``;
* no successful point has a norm below :math:`d^*` (that would be a bug in the success check or
  the norm); points whose logit gap is below 0.01 are left out so that float32 rounding of the
  logits cannot decide a verdict;
* the median of norm / :math:`d^*` is at most 1.05 (the bar every minimum-norm attack must meet),
  over the points where the box binds as well as over the others;
* the answer does not depend on the scale of the logits (the decision boundaries do not);
* float64 inputs under ``jax_enable_x64`` work and are as tight;
* on a model whose input gradient is NaN on a few coordinates, the attack works with the finite
  part of the gradient and lands at the distance reachable through the other coordinates.

Each attack compiles once (twice with the float64 check): model weights and the switch of the
NaN trap are arguments, so a rescaled or trapped model reuses the compilation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from tests.ground_truth_box import multiclass_box_points, solver_distance
from tests.models import DUAL, Linear, linear_points, random_linear

DIM, CLASSES, N = 64, 10, 32
BOX = 16  # points where the box binds, after the N others in the same batch (no new compile)
SHAPES = {"flat": (64,), "nhwc": (4, 4, 4), "btf": (8, 8)}
A = jr.attacks

# name -> (factory with default settings, norm, needs target=, input shape). Each attack runs on
# one of the three layouts, chosen so that every family sees each layout (one compilation each).
ATTACKS = {
    "deepfool-linf": (lambda: A.deepfool("linf"), "linf", False, "nhwc"),
    "deepfool-l2": (lambda: A.deepfool("l2"), "l2", False, "btf"),
    "fmn-linf": (lambda: A.fmn("linf"), "linf", False, "flat"),
    "fmn-l2": (lambda: A.fmn("l2"), "l2", False, "nhwc"),
    "fmn-l1": (lambda: A.fmn("l1"), "l1", False, "btf"),
    "fmn-linf-targeted": (lambda: A.fmn("linf", targeted=True), "linf", True, "nhwc"),
    "fmn-l2-targeted": (lambda: A.fmn("l2", targeted=True), "l2", True, "btf"),
    "fmn-l1-targeted": (lambda: A.fmn("l1", targeted=True), "l1", True, "flat"),
    "fab-linf": (lambda: A.fab("linf"), "linf", False, "btf"),
    "fab-l2": (lambda: A.fab("l2"), "l2", False, "flat"),
    "fab-l1": (lambda: A.fab("l1"), "l1", False, "nhwc"),
    "fab-t-linf": (lambda: A.fab("linf", targeted=True), "linf", False, "flat"),
    "fab-t-l2": (lambda: A.fab("l2", targeted=True), "l2", False, "nhwc"),
    "fab-t-l1": (lambda: A.fab("l1", targeted=True), "l1", False, "btf"),
    "fab-linf-targeted": (lambda: A.fab("linf", targeted=True, n_target_classes=None), "linf",
                          True, "nhwc"),
    "fab-l2-targeted": (lambda: A.fab("l2", targeted=True, n_target_classes=None), "l2", True,
                        "btf"),
    "fab-l1-targeted": (lambda: A.fab("l1", targeted=True, n_target_classes=None), "l1", True,
                        "flat"),
    "carlini-wagner-l2": (lambda: A.carlini_wagner_l2(), "l2", False, "nhwc"),
    "carlini-wagner-l2-targeted": (lambda: A.carlini_wagner_l2(targeted=True), "l2", True,
                                   "btf"),
}
UNTARGETED = sorted(name for name, spec in ATTACKS.items() if not spec[2])
NAN_COORDINATES = 4  # the trap makes the input gradient NaN on these leading coordinates
PROBE = np.random.default_rng(0).normal(size=NAN_COORDINATES).astype(np.float32)


def _compiler_options(name: str) -> dict:
  """XLA:CPU's backend optimisations take longer to compile than they save on these tiny
  programs (this file's compile time halves without them), except for FAB-T, whose nine targets
  of 100 steps each run four times slower unoptimised. Results are the same either way."""
  if name.startswith("fab-t"):
    return {}
  return {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _logits_fn(w, b, offset):
  """The linear model plus ``0 * where(h > 0, sqrt(h), 0)`` with ``h = x[:4] @ probe + offset``.

  The logits are exactly the linear ones. With ``offset = 10`` (``h > 0`` on the whole box) the
  trap's gradient is 0; with ``offset = -10`` the untaken ``sqrt`` branch makes the input gradient
  NaN on the first four coordinates (0 times NaN). ``offset`` is data, so both share a compilation.
  """
  linear = Linear(w, b).logits_fn

  def logits_fn(x):
    h = x.reshape(x.shape[0], -1)[:, :NAN_COORDINATES] @ jnp.asarray(PROBE) + offset
    trap = jnp.where(h > 0, jnp.sqrt(h), 0.0)
    return linear(x) + 0.0 * trap[:, None]

  return logits_fn


def _nearest(model: Linear, x: np.ndarray, y: np.ndarray, norm: str, offset=0.0):
  """The nearest class ``t``, its distance ``d*`` and logit gap, and the optimal step to it.

  ``offset [N, C]`` adds the logits of coordinates that ``x`` leaves out.
  """
  flat = x.reshape(len(x), -1).astype(np.float64)
  z = flat @ model.w + model.b + offset
  rows = np.arange(len(x))
  dw = model.w.T[None, :, :] - model.w.T[y][:, None, :]  # [N, C, D]: w_j - w_y
  size = np.linalg.norm(dw, ord=DUAL[norm], axis=2)
  gap = z[rows, y][:, None] - z
  dist = np.where(np.arange(CLASSES)[None, :] == y[:, None], np.inf,
                  gap / np.where(size > 0, size, 1e-300))
  t = np.argmin(dist, axis=1)
  d, v = dist[rows, t], dw[rows, t]
  if norm == "linf":
    unit = np.sign(v)
  elif norm == "l2":
    unit = v / np.linalg.norm(v, axis=1, keepdims=True)
  else:
    top = np.argmax(np.abs(v), axis=1)
    unit = np.zeros_like(v)
    unit[rows, top] = np.sign(v[rows, top])
  return t.astype(np.int32), d, gap[rows, t], unit * d[:, None]


@functools.lru_cache(maxsize=None)
def _problem(norm: str):
  """A ten-class model with its boundaries through the centre of the box, and ``N`` points whose
  optimal perturbation (grown by 5%) stays inside [0, 1], with ``d* <= 0.3`` and a logit gap of
  at least 0.01, then ``BOX`` points where the box binds (its faces raise ``d*`` by 5% or more;
  ``d* <= 0.3`` too).
  Flat ``[N + BOX, 64]``; every input shape reshapes the same points."""
  model = random_linear(0, DIM, CLASSES)
  model = Linear(model.w, -0.5 * model.w.sum(0))
  x, y, d = linear_points(model, 1, 16 * N, (DIM,), norm)
  t, d_check, gap, step = _nearest(model, x, y, norm)
  np.testing.assert_allclose(d_check, d, rtol=1e-12)
  moved = x.astype(np.float64) + 1.05 * step
  keep = np.all((moved >= 0) & (moved <= 1), axis=1) & (d <= 0.3) & (gap >= 0.01)
  assert keep.sum() >= N, keep.sum()
  box = multiclass_box_points(model, norm=norm, n=BOX, seed=3, max_distance=0.3,
                             candidates=16)
  return (model, np.concatenate([x[keep][:N], box.x]), np.concatenate([y[keep][:N], box.y]),
          np.concatenate([t[keep][:N], box.target]), np.concatenate([d[keep][:N], box.distance]))


@functools.lru_cache(maxsize=None)
def _jitted(name: str):
  """One compiled ``jr.run`` per attack; weights, the trap's offset and the target are data."""
  make, _, targeted, _ = ATTACKS[name]
  attack = make()

  @functools.partial(jax.jit, compiler_options=_compiler_options(name))
  def run(w, b, offset, x, y, target):
    return jr.run(attack, _logits_fn(w, b, offset), x, y, jr.Budget(jnp.inf),
                  jax.random.key(0), target if targeted else None)

  return run


@functools.lru_cache(maxsize=None)
def _run(name: str, scale: float = 1.0, offset: float = 10.0):
  """The attack on its problem, reshaped to its layout, with logits times ``scale`` (cached: the
  tests share the unscaled run)."""
  norm, shape = ATTACKS[name][1], SHAPES[ATTACKS[name][3]]
  model, x, y, t, d = _problem(norm)
  x = x.reshape((len(x),) + shape)
  result = _jitted(name)(model.w * scale, model.b * scale, jnp.float32(offset), jnp.asarray(x),
                         jnp.asarray(y), jnp.asarray(t))
  return result, x, y, t, d


def _check_against_the_exact_minimum(name, result, x, y, t, d, tolerance=1e-4):
  """Success, box, reported norms, the exact lower bound and the median bar; returns the ratios."""
  norm, targeted = ATTACKS[name][1], ATTACKS[name][2]
  success, size = np.asarray(result.success), np.asarray(result.norm, np.float64)
  x_adv = np.asarray(result.x_adv)
  assert x_adv.shape == x.shape
  assert x_adv.min() >= 0.0 and x_adv.max() <= 1.0
  # Every point can be misclassified inside the box (its optimal step fits), so at eps = inf an
  # attack must find nearly all of them, and count the ones it misses.
  assert success.mean() >= 0.99, success.mean()
  assert int(result.info["counts"]["minimum_norm_not_found"]) == int(np.sum(~success))
  assert np.all(np.isinf(size[~success]))
  delta = (x_adv.astype(np.float64) - x.astype(np.float64)).reshape(len(x), -1)
  recomputed = np.linalg.norm(delta, ord={"linf": np.inf, "l2": 2, "l1": 1}[norm], axis=1)
  np.testing.assert_allclose(size[success], recomputed[success], rtol=1e-5)
  pred = np.argmax(np.asarray(result.logits), axis=1)
  np.testing.assert_array_equal(success, pred == t if targeted else pred != y)
  ratio = size[success] / d[success]
  assert ratio.min() >= 1 - tolerance, (ratio.min(), np.flatnonzero(success)[np.argmin(ratio)])
  assert np.median(ratio) <= 1.05, np.median(ratio)
  binding = (size / d)[N:][success[N:]]  # where the box binds
  assert np.median(binding) <= 1.05, f"median {np.median(binding)} where the box binds"
  return ratio


@pytest.mark.parametrize("norm", ["linf", "l2", "l1"])
def test_distances_where_the_box_binds_match_an_independent_solver(norm):
  """The box rows' d* (tests.ground_truth_box.multiclass_box_points) equals a generic solver's
  optimum, untargeted (the minimum over classes j of reaching z_j >= z_y) and towards the nearest
  class (z_t above every class at once); and the box raises it by 5% or more."""
  model, x, y, t, d = _problem(norm)
  rtol = 1e-7 if norm == "l2" else 1e-9
  for i in range(N, N + 4):
    pairs = [solver_distance(model, x[i], j, [int(y[i])], norm)
             for j in range(CLASSES) if j != y[i]]
    np.testing.assert_allclose(min(pairs), d[i], rtol=rtol)
    beaten = [k for k in range(CLASSES) if k != t[i]]
    np.testing.assert_allclose(solver_distance(model, x[i], int(t[i]), beaten, norm), d[i],
                               rtol=rtol)
  assert np.all(d[N:] >= 1.05 * model.min_distance(x[N:], y[N:], norm))


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_never_below_and_close_to_the_exact_minimum(name):
  result, x, y, t, d = _run(name)
  _check_against_the_exact_minimum(name, result, x, y, t, d)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_answer_does_not_depend_on_the_scale_of_the_logits(name):
  """Logits times 1e-6 or 1e6 move no boundary. DeepFool, FAB and FMN only use ratios of logit
  differences to gradient norms, so their norms agree to rounding; C&W's trade-off constant has
  logit units, so it must still meet the bar after its search has moved the constant."""
  base, *_ = _run(name)
  for scale in (1e-6, 1e6):
    result, x, y, t, d = _run(name, scale)
    _check_against_the_exact_minimum(name, result, x, y, t, d)
    if not name.startswith("carlini-wagner"):
      np.testing.assert_allclose(np.asarray(result.norm), np.asarray(base.norm), rtol=1e-3,
                                 err_msg=f"scale {scale:g}")


@pytest.mark.parametrize("name", UNTARGETED)
def test_finite_part_of_a_nan_gradient_still_finds_the_boundary(name):
  """With the input gradient NaN on the first four coordinates (see ``_logits_fn``), the NaN
  entries are dropped and the attack moves through the other 60, where the minimal distance is
  ``min_j gap_j / ||(w_j - w_y)[4:]||_q`` (on the points whose optimal step there, grown by 5%,
  stays inside the box). DeepFool, FAB and C&W used to discard the whole step and report every
  point robust."""
  norm = ATTACKS[name][1]
  model, x, y, _, d = _problem(norm)
  probe_x = jnp.asarray(x.reshape((len(x),) + SHAPES[ATTACKS[name][3]]))
  grad = jax.grad(lambda v: jnp.sum(_logits_fn(model.w, model.b, -10.0)(v)))(probe_x)
  grad = np.asarray(grad).reshape(len(x), -1)
  assert np.isnan(grad[:, :NAN_COORDINATES]).all()
  assert np.isfinite(grad[:, NAN_COORDINATES:]).all()

  result, x, y, t, d = _run(name, offset=-10.0)
  success, size = np.asarray(result.success), np.asarray(result.norm, np.float64)
  assert np.isfinite(np.asarray(result.x_adv)).all()
  assert success.mean() >= 0.95, success.mean()
  assert np.all(size[success] >= d[success] * (1 - 1e-4))
  free = Linear(model.w[NAN_COORDINATES:], model.b)
  flat = x.reshape(len(x), -1).astype(np.float64)
  shifted = flat[:, NAN_COORDINATES:]
  _, reachable, _, step = _nearest(free, shifted, y, norm,
                                   offset=flat[:, :NAN_COORDINATES] @ model.w[:NAN_COORDINATES])
  moved = shifted + 1.05 * step
  fits = np.all((moved >= 0) & (moved <= 1), axis=1) & success
  assert fits.sum() >= N // 2, fits.sum()
  ratio = size[fits] / reachable[fits]
  assert ratio.min() >= 1 - 1e-4, ratio.min()
  assert np.median(ratio) <= 1.05, np.median(ratio)


# One per family (and per code path of FAB: the class choice, and the targeted linearisation).
X64_ATTACKS = ("carlini-wagner-l2", "deepfool-linf", "fab-l1", "fab-l2-targeted", "fmn-l1")


@pytest.mark.parametrize("name", X64_ATTACKS)
def test_float64_inputs_under_x64(name):
  """With ``jax_enable_x64`` (inside a context only) and a float64 model, every field comes back
  in float64 and the result is as tight as in float32; float64 rounding is far below the 1e-7
  tolerance of the lower bound."""
  make, norm, targeted, _ = ATTACKS[name]
  model, x, y, t, d = _problem(norm)
  with jax.enable_x64(True):
    w = jnp.asarray(model.w, jnp.float64)
    b = jnp.asarray(model.b, jnp.float64)
    logits_fn = lambda v: v.reshape(v.shape[0], -1) @ w + b[None, :]
    attack = make()
    run = jax.jit(lambda x, y, t: jr.run(attack, logits_fn, x, y, jr.Budget(jnp.inf),
                                         jax.random.key(0), t if targeted else None),
                  compiler_options=_compiler_options(name))
    result = run(jnp.asarray(x, jnp.float64), jnp.asarray(y), jnp.asarray(t))
    assert result.x_adv.dtype == jnp.float64 and result.norm.dtype == jnp.float64
    assert result.logits.dtype == jnp.float64
    result = jax.tree.map(np.asarray, result)
  _check_against_the_exact_minimum(name, result, x, y, t, d, tolerance=1e-7)
