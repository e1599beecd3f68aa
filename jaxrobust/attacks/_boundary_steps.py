r"""The trust-region steps of the Brendel-Bethge attack: move towards the clean point along the
linearised decision boundary, inside the box and a trust region.

At the current point :math:`x` (inside the box :math:`[l, u]`), with the clean point :math:`x_0`,
the boundary normal :math:`b` (the gradient of the logit difference) and the change :math:`c` of
the logit difference that puts the linearised model on (or just across) the boundary, each step
solves, per example, over the step :math:`\delta`,

.. math::
   \min_\delta\ \|x_0 - x - \delta\|_p \quad\text{s.t.}\quad b^\top \delta = c,\quad
   l \le x + \delta \le u,\quad \|\delta\|_2 \le r,

with the trust region :math:`r` in L2 whatever the norm :math:`p`. Every solution below lies in the
two-parameter family

.. math:: \delta(a, \beta) = \operatorname{clip}_{[lo, hi]}(a - \beta\, b),\qquad
   lo = l - x,\ hi = u - x,

which is what the KKT conditions of a separable convex objective under one linear equation and a
box give: for fixed :math:`a`, :math:`h(\beta) = b^\top \delta(a, \beta)` is continuous,
piecewise linear and non-increasing in :math:`\beta`, so the plane :math:`b^\top\delta = c` is
reached by a 1-D search on the multiplier :math:`\beta` (:func:`solve_plane`), bracketed by the
kinks where every coordinate is clipped (there :math:`h` takes its extremes
:math:`c_{\max} = \sum_i \max(b_i\, lo_i, b_i\, hi_i)` and :math:`c_{\min}`).

* **The plane out of reach** (:math:`c \notin [c_{\min}, c_{\max}]`), or its nearest point in the
  box, :math:`\delta(0, \beta)`, farther than :math:`r`: the largest step towards the plane,
  :math:`\delta = \operatorname{clip}(t \operatorname{sign}(c)\, b)` with :math:`\|\delta\|_2 = r`
  (or every coordinate clipped, if that is shorter) (:func:`towards_plane`). This problem does not
  depend on :math:`p`.
* **L2** (:func:`l2_step`): with :math:`d = x_0 - x`, the Lagrangian
  :math:`\|d - \delta\|^2 + \mu(\|\delta\|^2 - r^2) + \lambda(b^\top\delta - c)` is minimised over
  the box by :math:`\delta(\alpha d, \beta)` with :math:`\alpha = 1 / (1 + \mu) \in (0, 1]` and
  :math:`\beta = \lambda \alpha / 2`. Without the trust region (:math:`\alpha = 1`) one plane
  search gives the optimum; if it is longer than :math:`r`, :math:`\|\delta(\alpha)\|_2` (each
  :math:`\alpha` with its plane solution) grows with :math:`\alpha` from the nearest plane point
  (:math:`\alpha = 0`, inside the region) and a search on :math:`\alpha` finds the
  :math:`\alpha` at which it equals :math:`r`: the exact optimum, found by nested 1-D searches.
* **Linf** (:func:`linf_step`): for a target distance :math:`\epsilon`, the points within
  :math:`\epsilon` of :math:`x_0` in the box form the box
  :math:`[\max(l, x_0 - \epsilon), \min(u, x_0 + \epsilon)]`; the plane is reachable inside it
  within the trust region iff the shortest step to the plane in that box,
  :math:`\delta_\epsilon = \delta(0, \beta)`, exists and has :math:`\|\delta_\epsilon\|_2 \le r`.
  That is monotone in :math:`\epsilon`, so a bisection on :math:`\epsilon` finds the smallest
  reachable Linf distance, and the step is :math:`\delta_\epsilon` there (the paper's appendix:
  the Linf problem is a search over :math:`\epsilon` of L2 problems in a shrunken box).
* **L1** (:func:`l1_step`): with :math:`d = x_0 - x`, the Lagrangian
  :math:`\|d - \delta\|_1 + \lambda(b^\top\delta - c) + \mu(\|\delta\|_2^2 - r^2)` is separable;
  for :math:`\mu > 0` each coordinate minimises
  :math:`|d_i - \delta_i| + \lambda b_i \delta_i + \mu\delta_i^2` over :math:`[lo_i, hi_i]`, a
  strictly convex function of one variable whose minimiser is the point of the interval
  :math:`[w_i - t, w_i + t]` nearest :math:`d_i`, clipped to the box, with
  :math:`w_i = -\beta b_i`, :math:`\beta = \lambda / (2\mu)` and :math:`t = 1 / (2\mu)`:

  .. math:: \delta_i(\beta, t) = \operatorname{clip}_{[lo_i, hi_i]}
     \big(\operatorname{clip}_{[w_i - t,\, w_i + t]}(d_i)\big)

  (the soft threshold of the L1 term, shifted to :math:`d`). For a fixed :math:`t`,
  :math:`b^\top\delta` is piecewise linear and non-increasing in :math:`\beta`: the same plane
  search as above. :math:`t \to 0` gives the nearest point of the plane (inside the region, as
  :math:`\delta(0, \beta)`); :math:`t \to \infty` (:math:`\mu \to 0`) the linear programme
  without the trust region, solved exactly as a fractional knapsack (:func:`linear_programme`:
  from :math:`\delta = d`, the coordinates of largest :math:`|b_i|`, the cheapest per unit of
  :math:`b^\top\delta`, move to the face in turn, the last one part-way). If that solution fits
  in the region it is the step. Otherwise, with :math:`\beta` re-solved for each :math:`t`,
  :math:`\|\delta(t)\|_2^2` is the derivative in :math:`\mu` of the concave partial dual, so it
  grows with :math:`t`, and a search on :math:`\log_2 t` over
  :math:`[-30, 0] + \log_2 t_{\max}` (:math:`t_{\max} = 64\,\max_i(hi_i - lo_i)`) finds the
  :math:`t` at which :math:`\|\delta(t)\|_2 = r`: the optimum (:math:`\mu > 0`, the region
  binds; where :math:`\|\delta(t_{\max})\|_2 < r`, near-ties in :math:`|b_i|`, the farthest
  point within :math:`r` on the segment from :math:`\delta(t_{\max})` to the linear programme's
  solution, both feasible, which can only lower the convex objective). Foolbox 3.3's ``L1Optimizer`` maximises the same dual over :math:`(\lambda, \mu)` with
  a box-constrained BFGS and then moves one coordinate to meet the plane exactly.

Every search has a fixed number of iterations (per row, masked; nothing loops over examples). The
1-D root searches alternate a bisection with a linear interpolation between the bracket's ends
(exact once the bracket holds one linear piece), so the bracket halves at least every other
iteration. The arrays are ``[B, D]`` (flattened inputs), the parameters ``[B]``.

References:
  Brendel, Rauber, Kümmerer, Ustyuzhaninov & Bethge, "Accurate, reliable and fast robustness
  evaluation", NeurIPS 2019 (the trust-region problems; appendix: the L2 and Linf solvers).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array

PLANE_ITERATIONS = 24
"""Iterations of the search on the plane multiplier :math:`\\beta`."""
OUTER_ITERATIONS = 16
"""Iterations of the search on the L2 trust-region multiplier :math:`\\alpha` (twice as many for
the step length towards an unreachable plane)."""
L1_REACH = 64.0
"""The largest soft threshold :math:`t_{\\max}` of the L1 step, in box widths (beyond it the
segment to the linear programme's solution)."""
L1_SPAN = 30
"""The L1 step searches :math:`\\log_2 t` in :math:`[-30, 0] + \\log_2 t_{\\max}`."""
L1_ITERATIONS = 20
"""Iterations of the search on :math:`\\log_2 t` (alternately a bisection and an interpolation)."""
EPS_ITERATIONS = 24
"""Bisections on the Linf distance :math:`\\epsilon` (a relative precision of :math:`2^{-24}` of
the box's reach)."""


def _col(v: Array) -> Array:
  return v[:, None]


def _root(f: Callable[[Array], Array], lo: Array, hi: Array, f_lo: Array, f_hi: Array,
          target: Array, iterations: int) -> tuple[Array, Array, Array]:
  """A root of a monotone ``f`` (``[B] -> [B]``) on ``[lo, hi]`` with ``f(lo) <= target <=
  f(hi)`` or ``f(lo) >= target >= f(hi)``: the bracket's ends after ``iterations`` (alternately
  a bisection and a linear interpolation) and the interpolated root.

  Returns ``(lo, hi, root)``; ``lo`` keeps ``f(lo)`` on the side of ``f``'s value at ``lo``.
  """
  increasing = f_hi >= f_lo

  def interpolate(lo, hi, f_lo, f_hi):
    span = f_hi - f_lo
    weight = jnp.where(span != 0, (target - f_lo) / jnp.where(span != 0, span, 1.0), 0.5)
    return lo + jnp.clip(weight, 0.0, 1.0) * (hi - lo)

  def body(i, carry):
    lo, hi, f_lo, f_hi = carry
    mid = jnp.where(i % 2 == 0, (lo + hi) / 2, interpolate(lo, hi, f_lo, f_hi))
    value = f(mid)
    below = jnp.where(increasing, value <= target, value >= target)  # mid on lo's side
    return (jnp.where(below, mid, lo), jnp.where(below, hi, mid), jnp.where(below, value, f_lo),
            jnp.where(below, f_hi, value))

  lo, hi, f_lo, f_hi = jax.lax.fori_loop(0, iterations, body, (lo, hi, f_lo, f_hi))
  return lo, hi, interpolate(lo, hi, f_lo, f_hi)


def _newton_root(f: Callable[[Array], tuple[Array, Array]], low: Array, high: Array,
                 start: Array, target: Array, increasing: bool, iterations: int) -> Array:
  """A root of ``f(t) = target`` for a monotone, piecewise smooth ``f`` (``[B] -> [B]``) on the
  bracket ``[low, high]``: Newton's steps from ``start`` with the slope ``f`` returns beside its
  value, kept inside the bracket, which every evaluation narrows; a bisection wherever a step
  would leave it or the slope is 0. On a linear piece one step is exact, so the scale of the
  bracket (kinks of coordinates with a tiny normal entry lie far out) does not matter."""

  def body(_, carry):
    low, high, t = carry
    value, slope = f(t)
    excess = value - target
    above = excess > 0 if increasing else excess < 0  # the root lies below t
    low, high = jnp.where(above, low, t), jnp.where(above, t, high)
    step = t - excess / jnp.where(slope != 0, slope, 1.0)
    inside = (slope != 0) & (step > low) & (step < high)
    return low, high, jnp.where(excess == 0, t, jnp.where(inside, step, (low + high) / 2))

  return jax.lax.fori_loop(0, iterations, body, (low, high, jnp.clip(start, low, high)))[2]


def plane_range(b: Array, lo: Array, hi: Array) -> tuple[Array, Array]:
  """``(c_min, c_max)``: the range of :math:`b^\\top\\delta` over the box ``[lo, hi]``."""
  return (jnp.sum(jnp.minimum(b * lo, b * hi), axis=1),
          jnp.sum(jnp.maximum(b * lo, b * hi), axis=1))


def solve_plane(a: Array, b: Array, lo: Array, hi: Array, c: Array) -> Array:
  r"""``clip(a - beta b, lo, hi)`` with :math:`b^\top\delta = c` (the nearest end of the
  reachable range where ``c`` lies outside it): ``[B, D]``.

  :math:`h(\beta) = b^\top\delta` is non-increasing with slope :math:`-\sum b_i^2` over the
  unclipped coordinates; the search starts at the unclipped solution
  :math:`\beta_0 = (b^\top a - c) / \|b\|^2`, inside the bracket of the outermost kinks.
  """
  nonzero = b != 0
  safe = jnp.where(nonzero, b, 1.0)
  kink_a, kink_b = (a - lo) / safe, (a - hi) / safe
  low = jnp.min(jnp.where(nonzero, jnp.minimum(kink_a, kink_b), jnp.inf), axis=1)
  high = jnp.max(jnp.where(nonzero, jnp.maximum(kink_a, kink_b), -jnp.inf), axis=1)
  low = jnp.where(jnp.isfinite(low), low, 0.0)  # b = 0: nothing moves the plane's side
  high = jnp.where(jnp.isfinite(high), high, 0.0)
  c_min, c_max = plane_range(b, lo, hi)
  goal = jnp.clip(c, c_min, c_max)
  weight = _squared(b)
  start = (jnp.sum(a * b, axis=1) - goal) / jnp.where(weight > 0, weight, 1.0)

  def offset(beta):
    moved = a - _col(beta) * b
    free = (moved > lo) & (moved < hi)
    return (jnp.sum(b * jnp.clip(moved, lo, hi), axis=1),
            -jnp.sum(jnp.where(free, b * b, 0.0), axis=1))

  beta = _newton_root(offset, low, high, start, goal, False, PLANE_ITERATIONS)
  return jnp.clip(a - _col(beta) * b, lo, hi)


def _squared(v: Array) -> Array:
  return jnp.sum(v * v, axis=1)


def towards_plane(b: Array, lo: Array, hi: Array, c: Array, r: Array) -> Array:
  r"""The largest step towards the plane :math:`b^\top\delta = c` inside the box and the trust
  region: ``clip(t sign(c) b, lo, hi)`` with :math:`\|\delta\|_2 = r` (every coordinate clipped
  if that is shorter)."""
  direction = jnp.where(_col(c) >= 0, b, -b)
  moving = direction != 0
  safe = jnp.where(moving, direction, 1.0)
  full = jnp.max(jnp.where(moving, jnp.where(direction > 0, hi, lo) / safe, 0.0), axis=1)

  def length(t):
    moved = _col(t) * direction
    free = (moved > lo) & (moved < hi)
    return (_squared(jnp.clip(moved, lo, hi)),
            2 * t * jnp.sum(jnp.where(free, direction * direction, 0.0), axis=1))

  goal = jnp.minimum(r * r, length(full)[0])
  weight = _squared(direction)
  start = r / jnp.sqrt(jnp.where(weight > 0, weight, 1.0))  # exact where nothing is clipped
  t = _newton_root(length, jnp.zeros_like(full), full, start, goal, True, PLANE_ITERATIONS)
  return jnp.clip(_col(t) * direction, lo, hi)


def _reach_plane(b: Array, lo: Array, hi: Array, c: Array, r: Array) -> tuple[Array, Array]:
  """The shortest step to the plane in the box, and ``[B]`` whether it exists within ``r``."""
  c_min, c_max = plane_range(b, lo, hi)
  nearest = solve_plane(jnp.zeros_like(b), b, lo, hi, c)
  return nearest, (c >= c_min) & (c <= c_max) & (_squared(nearest) <= r * r)


def _where_rows(rows: Array, a: Array, b: Array) -> Array:
  return jnp.where(_col(rows), a, b)


def l2_step(x0: Array, x: Array, b: Array, c: Array, r: Array, lower: Array,
            upper: Array) -> Array:
  r"""The step of :math:`\min \|x_0 - x - \delta\|_2` on the plane, in the box and the trust
  region (see the module docstring): ``[B, D]``.

  Examples:
    >>> import jax.numpy as jnp
    >>> x0, x = jnp.array([[0.0, 0.0]]), jnp.array([[0.5, 0.5]])  # on the plane x_1 = 0.5
    >>> b, c = jnp.array([[0.0, 1.0]]), jnp.array([0.0])  # stay on it
    >>> l2_step(x0, x, b, c, jnp.array([1.0]), 0.0, 1.0).tolist()  # slide along it to x0's foot
    [[-0.5, 0.0]]
    >>> step = l2_step(x0, x, b, c, jnp.array([0.1]), 0.0, 1.0)  # within the trust region
    >>> [round(float(v), 4) for v in step[0]]
    [-0.1, 0.0]
  """
  lo, hi = lower - x, upper - x
  d = x0 - x
  nearest, fits = _reach_plane(b, lo, hi, c, r)
  free = solve_plane(d, b, lo, hi, c)  # alpha = 1: the optimum without the trust region
  inside = _squared(free) <= r * r

  def shrink():
    # ||delta(alpha)|| grows with alpha; alpha = 0 lies inside the region (fits), 1 outside.
    length = lambda alpha: _squared(solve_plane(_col(alpha) * d, b, lo, hi, c))
    zero, one = jnp.zeros_like(c), jnp.ones_like(c)
    alpha, _, _ = _root(length, zero, one, _squared(nearest), _squared(free), r * r,
                        OUTER_ITERATIONS)
    return solve_plane(_col(alpha) * d, b, lo, hi, c)

  bounded = jax.lax.cond(jnp.any(fits & ~inside), shrink, lambda: free)
  step = _where_rows(inside, free, bounded)
  return _where_rows(fits, step, towards_plane(b, lo, hi, c, r))


def linf_step(x0: Array, x: Array, b: Array, c: Array, r: Array, lower: Array,
              upper: Array) -> Array:
  r"""The step of :math:`\min \|x_0 - x - \delta\|_\infty` on the plane, in the box and the trust
  region (see the module docstring): ``[B, D]``."""
  lo, hi = lower - x, upper - x
  _, fits = _reach_plane(b, lo, hi, c, r)
  widest = jnp.max(jnp.maximum(x0 - lower, upper - x0), axis=1)  # the whole box

  def shrunk(eps):
    eps = _col(eps)
    return jnp.maximum(lower, x0 - eps) - x, jnp.minimum(upper, x0 + eps) - x

  def reachable(eps):
    return _reach_plane(b, *shrunk(eps), c, r)[1].astype(c.dtype)

  zero, one = jnp.zeros_like(c), jnp.ones_like(c)
  _, eps, _ = _root(reachable, zero, widest, reachable(zero), one, 0.5 * one, EPS_ITERATIONS)
  nearest = solve_plane(jnp.zeros_like(b), b, *shrunk(eps), c)
  return _where_rows(fits, nearest, towards_plane(b, lo, hi, c, r))


def solve_plane_l1(d: Array, b: Array, lo: Array, hi: Array, c: Array, t: Array) -> Array:
  r"""``clip(clip(d, w - t, w + t), lo, hi)`` with :math:`w = -\beta b` on the plane
  :math:`b^\top\delta = c` (its nearest end where ``c`` lies outside the box's range): the
  minimiser of :math:`\|d - \delta\|_1 + \mu\|\delta\|_2^2` on the plane in the box, for
  :math:`t = 1 / (2\mu)` (``[B]``): ``[B, D]``.

  :math:`h(\beta) = b^\top\delta` is non-increasing, with slope :math:`-\sum b_i^2` over the
  coordinates that neither sit at :math:`d_i` nor at the box; beyond the kinks where
  :math:`w_i \pm t` meets :math:`lo_i` or :math:`hi_i` every coordinate is at the box.
  """
  t = _col(t)
  nonzero = b != 0
  safe = jnp.where(nonzero, b, 1.0)
  kinks = [(side + sign * t) / safe for side in (-lo, -hi) for sign in (-1.0, 1.0)]
  low = jnp.min(jnp.where(nonzero, functools.reduce(jnp.minimum, kinks), jnp.inf), axis=1)
  high = jnp.max(jnp.where(nonzero, functools.reduce(jnp.maximum, kinks), -jnp.inf), axis=1)
  low = jnp.where(jnp.isfinite(low), low, 0.0)
  high = jnp.where(jnp.isfinite(high), high, 0.0)
  c_min, c_max = plane_range(b, lo, hi)
  goal = jnp.clip(c, c_min, c_max)
  weight = _squared(b)
  start = -goal / jnp.where(weight > 0, weight, 1.0)  # the plane point of t = 0 without the box

  def point(beta):
    w = -_col(beta) * b
    return jnp.clip(d, w - t, w + t), w

  def offset(beta):
    near, w = point(beta)
    free = (d != near) & (near > lo) & (near < hi)
    return (jnp.sum(b * jnp.clip(near, lo, hi), axis=1),
            -jnp.sum(jnp.where(free, b * b, 0.0), axis=1))

  beta = _newton_root(offset, low, high, start, goal, False, PLANE_ITERATIONS)
  return jnp.clip(point(beta)[0], lo, hi)


def linear_programme(d: Array, b: Array, lo: Array, hi: Array, c: Array) -> Array:
  r"""The exact solution of :math:`\min \|d - \delta\|_1` s.t. :math:`b^\top\delta = c` in the
  box (``c`` clipped to the box's range): ``[B, D]``.

  A fractional knapsack: from :math:`\delta = d` the residual :math:`c - b^\top d` is made up by
  moving coordinates towards the face that changes :math:`b^\top\delta` in its direction, at a
  cost of :math:`1 / |b_i|` per unit; the cheapest go first, so the coordinates are taken in
  decreasing :math:`|b_i|`, each up to its face, the last one part-way.
  """
  c_min, c_max = plane_range(b, lo, hi)
  residual = jnp.clip(c, c_min, c_max) - jnp.sum(b * d, axis=1)
  up = _col(residual) >= 0
  gain = jnp.where(up, 1.0, -1.0) * b  # what one unit along +1 adds to |residual|
  face = jnp.where(gain > 0, hi, lo)
  capacity = jnp.abs(b * (face - d))  # |residual| the coordinate can make up
  order = jnp.argsort(-jnp.abs(b), axis=1, stable=True)
  sorted_capacity = jnp.take_along_axis(capacity, order, axis=1)
  before = jnp.cumsum(sorted_capacity, axis=1) - sorted_capacity
  taken = jnp.clip(_col(jnp.abs(residual)) - before, 0.0, sorted_capacity)
  fraction = jnp.where(sorted_capacity > 0, taken / jnp.where(sorted_capacity > 0,
                                                                sorted_capacity, 1.0), 0.0)
  fraction = jnp.take_along_axis(fraction, jnp.argsort(order, axis=1), axis=1)
  return d + fraction * (face - d)


def l1_step(x0: Array, x: Array, b: Array, c: Array, r: Array, lower: Array,
            upper: Array) -> Array:
  r"""The step of :math:`\min \|x_0 - x - \delta\|_1` on the plane, in the box and the trust
  region (see the module docstring): ``[B, D]``.

  Examples:
    >>> import jax.numpy as jnp
    >>> x0, x = jnp.array([[0.0, 0.0, 0.0]]), jnp.array([[0.5, 0.5, 0.5]])
    >>> b, c = jnp.array([[1.0, 2.0, 0.5]]), jnp.array([0.0])  # stay on the plane
    >>> step = l1_step(x0, x, b, c, jnp.array([10.0]), 0.0, 1.0)  # the region does not bind:
    >>> [round(float(v), 4) for v in step[0]]  # x0 on two coordinates, the largest b_i pays
    [-0.5, 0.375, -0.5]
    >>> step = l1_step(x0, x, b, c, jnp.array([0.1]), 0.0, 1.0)  # ||step||_2 = 0.1
    >>> round(float(jnp.linalg.norm(step)), 4), round(float(step[0] @ b[0]), 4)
    (0.1, 0.0)
  """
  lo, hi = lower - x, upper - x
  d = x0 - x
  _, fits = _reach_plane(b, lo, hi, c, r)
  top = L1_REACH * jnp.max(jnp.broadcast_to(hi - lo, d.shape), axis=1)
  far = linear_programme(d, b, lo, hi, c)  # t = inf: no trust region
  inside = _squared(far) <= r * r

  def shrink():
    # ||delta(t)|| grows with t; t -> 0 is the nearest plane point (inside: fits), t_max outside.
    length = lambda s: _squared(solve_plane_l1(d, b, lo, hi, c, top * jnp.exp2(s)))
    low, high = jnp.full_like(c, -float(L1_SPAN)), jnp.zeros_like(c)
    widest = solve_plane_l1(d, b, lo, hi, c, top)
    s, _, _ = _root(length, low, high, length(low), _squared(widest), r * r, L1_ITERATIONS)
    searched = solve_plane_l1(d, b, lo, hi, c, top * jnp.exp2(s))
    # Beyond t_max (near-ties in |b_i|): the farthest point within r on the segment from
    # delta(t_max) to the linear programme's solution (both on the plane, in the box).
    gap = far - widest
    along, span = jnp.sum(widest * gap, axis=1), _squared(gap)
    root = jnp.sqrt(jnp.maximum(along * along - span * (_squared(widest) - r * r), 0.0))
    theta = jnp.clip((root - along) / jnp.where(span > 0, span, 1.0), 0.0, 1.0)
    return _where_rows(_squared(widest) < r * r, widest + _col(theta) * gap, searched)

  bounded = jax.lax.cond(jnp.any(fits & ~inside), shrink, lambda: far)
  step = _where_rows(inside, far, bounded)
  return _where_rows(fits, step, towards_plane(b, lo, hi, c, r))
