r"""Two-class linear problems where the box binds at the minimal distance, solved exactly.

:mod:`tests.ground_truth` keeps only points whose optimal step stays inside the box, so the box
never changes :math:`d^*` there. Images are not like that: pixels sit at 0 or 1, and an attack
that ignores the box (or clips its step to it afterwards) is weaker than the ball suggests. Here
the box is the point.

For two classes the decision is the sign of one linear function: class ``y`` holds while
:math:`m(x + \delta) = m - \langle v, \delta\rangle > 0`, with :math:`v = w_t - w_y` and the
clean margin :math:`m = z_y - z_t > 0`. Within radius :math:`r` and the box :math:`[l, u]`, the
most an attacker can take off the margin is the concave, nondecreasing

.. math:: G(r) = \max\{\langle v, \delta\rangle : \|\delta\|_p \le r,\; l \le x + \delta \le u\},

and :math:`d^* = \min\{r : G(r) \ge m\}`. Each coordinate moves only towards
:math:`\operatorname{sign}(v_i)`, by at most its room :math:`\rho_i` (:math:`u - x_i` if
:math:`v_i > 0`, :math:`x_i - l` otherwise), and the maximiser is, per norm:

* Linf: :math:`|\delta_i| = \min(r, \rho_i)`;
* L1: the fractional knapsack, coordinates in decreasing :math:`|v_i|` each filled to
  :math:`\rho_i` until :math:`r` is spent;
* L2: :math:`|\delta_i| = \min(\tau |v_i|, \rho_i)` with :math:`\tau` such that the norm is
  :math:`r` (the KKT conditions of the problem: a coordinate is either free and proportional to
  :math:`v_i`, or on its face).

:func:`box_gain` computes :math:`G` in float64 and :func:`box_problem` finds :math:`d^*` by
bisection on it, then keeps points where the box raises :math:`d^*` above the box-free distance
:math:`m / \|v\|_q` by at least ``min_binding`` and where float32 rounding cannot decide a verdict:
:math:`G((2 - s) d^*) \le m - \mu` (no point of the smaller ball is adversarial) and
:math:`G(s\, d^*) \ge m + \mu` (the maximiser at :math:`s\, d^*` is, by margin :math:`\mu`).
``tests/test_ground_truth.py`` and ``tests/test_ground_truth_min_norm.py`` check the distances
against :func:`solver_distance`, SciPy's linear and quadratic programmes.

Examples:
  >>> from tests.ground_truth_box import box_problem
  >>> p = box_problem(norm="l1", n=4, seed=0)
  >>> p.x.shape, bool((p.distance > 1.05 * p.free_distance).all())
  ((4, 16), True)

References:
  Croce & Hein, "Mind the box: l1-APGD for sparse adversarial attacks on image classifiers",
  ICML 2021 (the L1 ball intersected with the box, and why attacks must respect it).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tests.ground_truth import linear_model
from tests.models import DUAL, Linear


class BoxProblem(NamedTuple):
  """Points of a two-class linear model whose minimal distance the box raises (module doc)."""

  model: Linear  # float32-exact float64 weights w [D, 2] and biases b [2]
  x: np.ndarray  # [N, *shape] float32 inputs in [lower, upper]
  y: np.ndarray  # [N] int32 labels: the model's predictions
  distance: np.ndarray  # [N] float64 d*, exact in the box
  free_distance: np.ndarray  # [N] float64 m / ||v||_q, the distance without the box
  norm: str
  scale: float  # the maximiser at scale * d* is adversarial by min_margin
  lower: float
  upper: float


def _direction(model: Linear, x: np.ndarray, y: np.ndarray):
  """``(flat x [N, D], v [N, D], margin m [N])`` in float64 for the two-class model."""
  flat = np.asarray(x, np.float64).reshape(len(x), -1)
  z = flat @ model.w + model.b
  rows = np.arange(len(x))
  v = model.w.T[1 - y] - model.w.T[y]
  return flat, v, z[rows, y] - z[rows, 1 - y]


def box_step(v: np.ndarray, flat: np.ndarray, radius: np.ndarray, norm: str, lower: float,
             upper: float) -> np.ndarray:
  """``[N, D]`` float64: the maximiser of ``<v, delta>`` over the ball of ``radius`` and the box."""
  radius = np.asarray(radius, np.float64).reshape(-1, 1)
  room = np.where(v > 0, upper - flat, flat - lower)
  a = np.abs(v)
  if norm == "linf":
    size = np.minimum(radius, room)
  elif norm == "l1":
    order = np.argsort(-a, axis=1, kind="stable")
    sorted_room = np.take_along_axis(room, order, axis=1)
    before = np.cumsum(sorted_room, axis=1) - sorted_room
    filled = np.clip(radius - before, 0, sorted_room)
    size = np.empty_like(filled)
    np.put_along_axis(size, order, filled, axis=1)
  else:
    # |delta_i| = min(tau a_i, room_i). With the breakpoints tau_i = room_i / a_i sorted, on
    # [tau_(k), tau_(k+1)] the squared norm is S_k + tau^2 A_k (S_k: the k full rooms squared,
    # A_k: the other a_i squared); take the first piece whose right end reaches r^2.
    safe = np.where(a > 0, a, 1.0)
    breaks = np.where(a > 0, room / safe, np.inf)
    order = np.argsort(breaks, axis=1, kind="stable")
    tau_k = np.take_along_axis(breaks, order, axis=1)
    full_sq = np.cumsum(np.take_along_axis(np.where(a > 0, room, 0.0) ** 2, order, axis=1), axis=1)
    full_sq = np.concatenate([np.zeros_like(radius), full_sq[:, :-1]], axis=1)  # S_k, k = 0..D-1
    a_sq = np.take_along_axis(a ** 2, order, axis=1)
    free_sq = np.cumsum(a_sq[:, ::-1], axis=1)[:, ::-1]  # A_k
    end_sq = full_sq + np.where(np.isfinite(tau_k), tau_k, 0.0) ** 2 * free_sq
    end_sq = np.where(np.isfinite(tau_k), end_sq, np.inf)
    piece = np.argmax(end_sq >= radius ** 2, axis=1)[:, None]
    s_k = np.take_along_axis(full_sq, piece, axis=1)
    a_k = np.take_along_axis(free_sq, piece, axis=1)
    reaches = np.take_along_axis(end_sq, piece, axis=1) >= radius ** 2
    tau = np.where(reaches & (a_k > 0), np.sqrt(np.maximum(radius ** 2 - s_k, 0)
                                                / np.where(a_k > 0, a_k, 1.0)), np.inf)
    size = np.where(a > 0, np.minimum(tau * safe, room), 0.0)
  return np.sign(v) * size


def box_gain(v: np.ndarray, flat: np.ndarray, radius: np.ndarray, norm: str, lower: float,
             upper: float) -> np.ndarray:
  """``[N]`` float64 ``G(r)``: the most ``<v, delta>`` within the ball of ``radius`` and the box."""
  return np.sum(v * box_step(v, flat, radius, norm, lower, upper), axis=1)


def box_distance(v: np.ndarray, flat: np.ndarray, margin: np.ndarray, norm: str, lower: float,
                 upper: float) -> np.ndarray:
  """``[N]`` float64 ``d* = min{r : G(r) >= margin}`` (inf where the whole box cannot reach it)."""
  dim = flat.shape[1]
  power = {"linf": 0.0, "l2": 0.5, "l1": 1.0}[norm]
  top = np.full(len(flat), (upper - lower) * dim ** power)  # a radius that covers the box
  reachable = box_gain(v, flat, top, norm, lower, upper) >= margin
  lo, hi = np.zeros(len(flat)), top.copy()
  for _ in range(100):
    mid = (lo + hi) / 2
    enough = box_gain(v, flat, mid, norm, lower, upper) >= margin
    lo, hi = np.where(enough, lo, mid), np.where(enough, mid, hi)
  return np.where(reachable, hi, np.inf)


def _draw(rng: np.random.Generator, shape: tuple[int, int], at_faces: float, lower: float,
          upper: float) -> np.ndarray:
  """float32 candidates: each coordinate uniform in the box or, with probability ``at_faces``, on
  one of its two faces (as saturated pixels are)."""
  x = rng.uniform(lower, upper, size=shape)
  face = rng.uniform(size=shape) < at_faces
  return np.where(face, np.where(rng.uniform(size=shape) < 0.5, lower, upper), x).astype(np.float32)


def box_problem(*, norm: str, n: int, seed: int = 0, dim: int = 16, shape=None,
                scale: float = 1.02, min_binding: float = 1.05, min_margin: float = 1e-3,
                lower: float = 0.0, upper: float = 1.0, at_faces: float = 0.5,
                candidates: int = 64) -> BoxProblem:
  """``n`` points in ``[lower, upper]^dim`` of a two-class linear model where the box binds.

  Each coordinate is drawn uniformly in the box, or with probability ``at_faces`` put on one of
  its two faces (as saturated pixels are); the points are labelled by the model and kept when the
  box raises ``d*`` by the factor ``min_binding`` at least over the box-free distance and the
  margins of the module docstring hold at ``(2 - scale) d*`` and ``scale d*``. The model is
  :func:`tests.ground_truth.linear_model` of ``seed``, so the points can share a batch with
  :func:`tests.ground_truth.linear_problem`'s two-class points of the same seed and ``dim``.
  Deterministic in ``seed``.

  Raises:
    ValueError: unknown norm; fewer than ``n`` of ``candidates * n`` draws qualified.
  """
  if norm not in DUAL:
    raise ValueError(f"norm must be one of {sorted(DUAL)}, got {norm!r}.")
  model = linear_model(seed, dim, 2)  # tests.ground_truth's two-class model of that seed and dim
  rng = np.random.default_rng(seed + 2)  # not linear_problem's draws (seed + 1)
  x = _draw(rng, (candidates * n, dim), at_faces, lower, upper)
  y = np.argmax(x.astype(np.float64) @ model.w + model.b, axis=1).astype(np.int32)
  flat, v, margin = _direction(model, x, y)
  free = margin / np.linalg.norm(v, ord=DUAL[norm], axis=1)
  distance = box_distance(v, flat, margin, norm, lower, upper)
  finite = np.isfinite(distance) & (margin > 0)
  d = np.where(finite, distance, 1.0)
  below = box_gain(v, flat, (2 - scale) * d, norm, lower, upper) <= margin - min_margin
  above = box_gain(v, flat, scale * d, norm, lower, upper) >= margin + min_margin
  keep = np.flatnonzero(finite & below & above & (distance >= min_binding * free))
  if len(keep) < n:
    raise ValueError(f"only {len(keep)} of {len(x)} candidates qualify, {n} needed.")
  keep = keep[:n]
  shape = (dim,) if shape is None else tuple(shape)
  return BoxProblem(model, x[keep].reshape((n,) + shape), y[keep], distance[keep], free[keep],
                    norm, scale, lower, upper)


class MulticlassBoxPoints(NamedTuple):
  """Points of a many-class linear model whose minimal distance the box raises."""

  x: np.ndarray  # [N, D] float32 inputs in [lower, upper]
  y: np.ndarray  # [N] int32 labels: the model's predictions
  target: np.ndarray  # [N] int32 the nearest class within the box
  distance: np.ndarray  # [N] float64 d*, exact in the box, untargeted and towards ``target``
  free_distance: np.ndarray  # [N] float64 the untargeted distance without the box


def multiclass_box_points(model: Linear, *, norm: str, n: int, seed: int = 0,
                          min_binding: float = 1.05, min_gap: float = 0.01,
                          max_distance: float = np.inf, lower: float = 0.0, upper: float = 1.0,
                          at_faces: float = 0.5, candidates: int = 64) -> MulticlassBoxPoints:
  r"""``n`` points of the linear ``model`` (any number of classes) where the box binds.

  Untargeted, the adversarial region is the union over :math:`j \ne y` of the half-spaces
  :math:`z_j \ge z_y`, so :math:`d^* = \min_j d^*_j` with :math:`d^*_j` the two-class distance
  (:func:`box_distance` on :math:`v = w_j - w_y`), exact in the box. Towards the nearest class
  :math:`t`, :math:`d^*_t` is a lower bound (``t`` must at least reach ``y``), and it is reached
  when at the maximiser of radius :math:`d^*_t` every other class stays at least ``min_gap``
  below :math:`z_t`: only such points are kept, so :math:`d^*` is exact for both. Also kept only:
  the box raises :math:`d^*` by ``min_binding`` over the box-free distance, the clean logit gap
  to ``t`` is at least ``min_gap`` (float32 rounding cannot decide a verdict), and
  :math:`d^* \le` ``max_distance``. Coordinates are drawn as in :func:`box_problem`.
  Deterministic in ``seed``.

  Raises:
    ValueError: unknown norm; fewer than ``n`` of ``candidates * n`` draws qualified.
  """
  if norm not in DUAL:
    raise ValueError(f"norm must be one of {sorted(DUAL)}, got {norm!r}.")
  w, b = np.asarray(model.w, np.float64), np.asarray(model.b, np.float64)
  dim, classes = w.shape
  x = _draw(np.random.default_rng(seed), (candidates * n, dim), at_faces, lower, upper)
  flat = x.astype(np.float64)
  z = flat @ w + b
  y = np.argmax(z, axis=1).astype(np.int32)
  rows = np.arange(len(x))
  v = w.T[None, :, :] - w.T[y][:, None, :]  # [M, C, D]: w_j - w_y
  gap = z[rows, y][:, None] - z  # [M, C]
  pairs = np.repeat(flat, classes, axis=0)
  per_class = box_distance(v.reshape(-1, dim), pairs, gap.reshape(-1), norm, lower,
                           upper).reshape(len(x), classes)
  per_class[rows, y] = np.inf
  free = np.where(np.arange(classes)[None, :] == y[:, None], np.inf,
                  gap / np.maximum(np.linalg.norm(v, ord=DUAL[norm], axis=2), 1e-300)).min(1)
  t = np.argmin(per_class, axis=1).astype(np.int32)
  distance = per_class[rows, t]
  finite = np.isfinite(distance)
  d = np.where(finite, distance, 0.0)
  moved = flat + box_step(v[rows, t], flat, d, norm, lower, upper)
  z_moved = moved @ w + b
  others = np.where(np.arange(classes)[None, :] == t[:, None], -np.inf, z_moved)
  others[rows, y] = -np.inf  # y ties with t at d*_t by construction
  clear = z_moved[rows, t] - others.max(axis=1) >= min_gap
  keep = np.flatnonzero(finite & clear & (gap[rows, t] >= min_gap) & (distance <= max_distance)
                        & (distance >= min_binding * free))
  if len(keep) < n:
    raise ValueError(f"only {len(keep)} of {len(x)} candidates qualify, {n} needed.")
  keep = keep[:n]
  return MulticlassBoxPoints(x[keep], y[keep], t[keep], distance[keep], free[keep])


def solver_distance(model: Linear, x: np.ndarray, target: int, beaten: list[int], norm: str,
                    lower: float = 0.0, upper: float = 1.0) -> float:
  """Independent reference for the distances here and in :mod:`tests.ground_truth`:
  ``min ||delta||_p`` with ``x + delta`` in ``[lower, upper]`` and ``z_target >= z_k`` for every
  ``k`` in ``beaten``, by a generic solver (HiGHS LP for Linf, with an epigraph variable, and L1,
  with ``delta = u - v``; SLSQP for L2)."""
  from scipy.optimize import linprog, minimize

  x = x.reshape(-1).astype(np.float64)
  dim = x.size
  rows = np.stack([model.w[:, k] - model.w[:, target] for k in beaten])
  rhs = -(rows @ x + model.b[beaten] - model.b[target])  # rows @ delta <= rhs
  if norm == "l2":
    constraints = [{"type": "ineq", "fun": lambda d, r=r, h=h: h - r @ d, "jac": lambda d, r=r: -r}
                   for r, h in zip(rows, rhs)]
    solution = minimize(lambda d: d @ d, np.zeros(dim), jac=lambda d: 2 * d, method="SLSQP",
                        constraints=constraints, bounds=[(lower - v, upper - v) for v in x],
                        options={"ftol": 1e-14, "maxiter": 500})
    assert solution.success, solution.message
    return float(np.sqrt(solution.fun))
  if norm == "linf":
    cost = np.concatenate([np.zeros(dim), [1.0]])
    a_ub = np.vstack([np.hstack([rows, np.zeros((len(rows), 1))]),
                      np.hstack([np.eye(dim), -np.ones((dim, 1))]),
                      np.hstack([-np.eye(dim), -np.ones((dim, 1))])])
    b_ub = np.concatenate([rhs, np.zeros(2 * dim)])
    bounds = [(lower - v, upper - v) for v in x] + [(0, None)]
  else:
    cost, a_ub, b_ub = np.ones(2 * dim), np.hstack([rows, -rows]), rhs
    bounds = [(0, upper - v) for v in x] + [(0, v - lower) for v in x]
  solution = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
  assert solution.status == 0, solution.message
  return float(solution.fun)
