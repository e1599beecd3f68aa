r"""Linear problems whose exact minimal adversarial distance is known, for attack strength tests.

For a linear model :math:`z = x W + b` the smallest Lp perturbation that lifts class :math:`j`
to the level of the label :math:`y` has size

.. math:: d_j = \frac{z_y - z_j}{\|w_y - w_j\|_q}, \qquad \tfrac1p + \tfrac1q = 1,

reached by the steepest-ascent step of :math:`z_j - z_y`: :math:`d_j \operatorname{sign}(w_j -
w_y)` for Linf, :math:`d_j (w_j - w_y) / \|w_j - w_y\|_2` for L2, and :math:`d_j` on the single
coordinate of largest :math:`|w_j - w_y|` for L1. The box :math:`[l, u]` can only make a distance
larger. :func:`linear_problem` picks points for which it does not: the nearest class
:math:`t = \arg\min_j d_j`, the distance :math:`d^* = d_t`, and the optimal step of size
:math:`s\, d^*` (``scale`` :math:`s > 1`) both stays inside the box and makes :math:`t` the strict
``argmax``. Then, exactly:

* below :math:`d^*` no point of the ball is adversarial, targeted towards :math:`t` or not
  (every class :math:`j` needs at least :math:`d_j \ge d^*`);
* at every radius in :math:`(d^*, s\, d^*]` the scaled optimal step is adversarial, untargeted
  and targeted towards :math:`t` (along that ray :math:`z_t - z_k` is linear in the radius,
  :math:`\ge 0` at :math:`d^*` for every :math:`k`, since a class above :math:`t` there would be
  nearer than :math:`t`, and :math:`> 0` at :math:`s\, d^*`).

So :math:`d^*` is the exact minimal distance of the untargeted problem and of the targeted problem
towards :math:`t`. Distances are computed in float64 from the float32 inputs and float32-exact
weights, so they are exact for the float32 model that the attacks see; every kept point has a
logit margin of at least ``min_margin`` at both :math:`(2 - s)\, d^*` and :math:`s\, d^*`, so
float32 rounding cannot decide a verdict.

Examples:
  >>> from tests.ground_truth import check_optimal_step, linear_problem
  >>> p = linear_problem(shape=(4, 4, 1), classes=10, norm="l2", n=8, seed=0)
  >>> p.x.shape, p.x.dtype.name, p.y.shape, p.target.shape
  ((8, 4, 4, 1), 'float32', (8,), (8,))
  >>> bool((p.target != p.y).all()), bool((p.distance > 0).all())
  (True, True)
  >>> bool(check_optimal_step(p).all())  # the guarantee, re-checked
  True

References:
  Goodfellow, Shlens & Szegedy, "Explaining and harnessing adversarial examples", ICLR 2015
  (linear models); Carlini et al., "On Evaluating Adversarial Robustness", 2019 (test attacks on
  problems with a known answer).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tests.models import DUAL, Linear


class LinearProblem(NamedTuple):
  """Points on a linear model with their exact minimal adversarial distance (see module doc)."""

  model: Linear  # float32-exact float64 weights w [D, C] and biases b [C]
  x: np.ndarray  # [N, *shape] float32 inputs inside [low, high]
  y: np.ndarray  # [N] int32 labels: the model's own predictions, so every point is correct
  target: np.ndarray  # [N] int32 the nearest class t (reached first by the optimal step)
  distance: np.ndarray  # [N] float64 d* = d_t = min_j d_j, exact in the box
  distances: np.ndarray  # [N, C] float64 d_j per class, ignoring the box (inf at j = y)
  norm: str  # "linf", "l2" or "l1"
  scale: float  # the guarantee holds at every radius in (d*, scale d*]
  lower: float  # the box
  upper: float


def linear_model(seed: int, dim: int, classes: int, dtype=np.float32) -> Linear:
  """A random linear model with every decision boundary through the centre of the box.

  Weights are standard normal rounded to ``dtype`` (float32, or bfloat16 for a model computing
  in it), so float64 arithmetic on them is exact for the model; ``b = -0.5 * sum(w)`` makes every
  logit 0 at ``x = 0.5``, so points near the centre of a ``[0, 1]`` box are near every boundary.
  """
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(dim, classes)).astype(dtype).astype(np.float64)
  b = (-0.5 * w.sum(0)).astype(dtype).astype(np.float64)
  return Linear(w, b)


def class_distances(model: Linear, x: np.ndarray, y: np.ndarray, norm: str) -> np.ndarray:
  """``[N, C]`` float64 ``d_j = (z_y - z_j) / ||w_y - w_j||_q``, box ignored; inf at ``j = y``."""
  flat = np.asarray(x, np.float64).reshape(len(x), -1)
  z = flat @ model.w + model.b
  rows = np.arange(len(x))
  gap = z[rows, y][:, None] - z  # [N, C]
  size = pair_norms(model, norm)[y]  # [N, C]
  d = gap / np.where(size > 0, size, 1.0)
  d[rows, y] = np.inf
  return d


def pair_norms(model: Linear, norm: str) -> np.ndarray:
  """``[C, C]`` float64 ``||w_i - w_j||_q``, q the dual norm of ``norm``."""
  dw = model.w.T[:, None, :] - model.w.T[None, :, :]
  return np.linalg.norm(dw, ord=DUAL[norm], axis=2)


def optimal_step(model: Linear, y: np.ndarray, target: np.ndarray, radius: np.ndarray,
                 norm: str) -> np.ndarray:
  """``[N, D]`` float64: the steepest-ascent step of ``z_target - z_y`` with norm ``radius``."""
  dw = model.w.T[target] - model.w.T[y]  # [N, D]
  radius = np.asarray(radius, np.float64)[:, None]
  if norm == "linf":
    return np.sign(dw) * radius
  if norm == "l2":
    return dw / np.linalg.norm(dw, axis=1, keepdims=True) * radius
  step = np.zeros_like(dw)
  rows, cols = np.arange(len(dw)), np.argmax(np.abs(dw), axis=1)
  step[rows, cols] = np.sign(dw[rows, cols]) * radius[:, 0]
  return step


def check_optimal_step(problem: LinearProblem, min_margin: float = 1e-3) -> np.ndarray:
  """``[N]`` bool: the guarantee of the module docstring holds for each point of ``problem``.

  The optimal step of size ``scale * d*`` towards the target stays inside the box and makes the
  target the argmax by ``min_margin``, and at ``(2 - scale) * d*`` every class stays at least
  ``min_margin`` below the label.
  """
  model, norm, s = problem.model, problem.norm, problem.scale
  flat = problem.x.reshape(len(problem.x), -1).astype(np.float64)
  moved = flat + optimal_step(model, problem.y, problem.target, s * problem.distance, norm)
  inside = np.all((moved >= problem.lower) & (moved <= problem.upper), axis=1)
  z = moved @ model.w + model.b
  rows = np.arange(len(flat))
  others = z.copy()
  others[rows, problem.target] = -np.inf
  wins = z[rows, problem.target] - others.max(axis=1) >= min_margin
  # Below d*, the best any class j can do within radius r is z_j - z_y + r ||w_j - w_y||_q.
  z0 = flat @ model.w + model.b
  reach = (z0 - z0[rows, problem.y][:, None]
           + (2 - s) * problem.distance[:, None] * pair_norms(model, norm)[problem.y])
  reach[rows, problem.y] = -np.inf
  safe = reach.max(axis=1) <= -min_margin
  return inside & wins & safe


def linear_problem(*, shape: tuple[int, ...], classes: int, norm: str, n: int, seed: int = 0,
                   scale: float = 1.02, low: float = 0.35, high: float = 0.65,
                   lower: float = 0.0, upper: float = 1.0, min_margin: float = 1e-3,
                   candidates: int = 8, dtype=np.float32) -> LinearProblem:
  """``n`` points of ``shape`` on a ``classes``-class linear model, with exact distances.

  Draws up to ``candidates * n`` float32 points uniformly in ``[low, high]``, labels them with the
  model, and keeps the first ``n`` that satisfy :func:`check_optimal_step` (the optimal step at
  ``scale * d*`` stays in ``[lower, upper]`` and reaches the nearest class with margin, and every
  class stays ``min_margin`` away at ``(2 - scale) * d*``). Deterministic in ``seed``.

  Args:
    shape: trailing input shape, e.g. ``(64,)``, ``(8, 8, 1)``, ``(8, 8)``; the model flattens it.
    classes: number of classes (>= 2).
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    n: number of points.
    seed: seeds the model (``seed``) and the points (``seed + 1``).
    scale: the largest budget, as a multiple of ``d*``, at which the optimum must be feasible;
      ``2 - scale`` is the budget at which the margin below is checked.
    low, high: the range the inputs are drawn from.
    lower, upper: the box.
    min_margin: the smallest logit margin accepted at either budget.
    candidates: how many candidates per point to draw at most.
    dtype: the weights are exact in it (see :func:`linear_model`).

  Returns:
    A :class:`LinearProblem`.

  Raises:
    ValueError: unknown norm; fewer than ``n`` candidates qualified.
  """
  if norm not in DUAL:
    raise ValueError(f"norm must be one of {sorted(DUAL)}, got {norm!r}.")
  dim = int(np.prod(shape))
  model = linear_model(seed, dim, classes, dtype)
  rng = np.random.default_rng(seed + 1)
  x = rng.uniform(low, high, size=(candidates * n, dim)).astype(np.float32)
  y = np.argmax(x.astype(np.float64) @ model.w + model.b, axis=1).astype(np.int32)
  distances = class_distances(model, x, y, norm)
  target = np.argmin(distances, axis=1).astype(np.int32)
  distance = distances[np.arange(len(x)), target]
  problem = LinearProblem(model, x, y, target, distance, distances, norm, scale, lower, upper)
  keep = np.flatnonzero((distance > 0) & check_optimal_step(problem, min_margin))
  if len(keep) < n:
    raise ValueError(f"only {len(keep)} of {len(x)} candidates qualify, {n} needed; draw more "
                     "candidates or narrow [low, high].")
  keep = keep[:n]
  return LinearProblem(model, x[keep].reshape((n,) + tuple(shape)), y[keep], target[keep],
                       distance[keep], distances[keep], norm, scale, lower, upper)
