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

Every search has a fixed number of iterations (per row, masked; nothing loops over examples). The
1-D root searches alternate a bisection with a linear interpolation between the bracket's ends
(exact once the bracket holds one linear piece), so the bracket halves at least every other
iteration. The arrays are ``[B, D]`` (flattened inputs), the parameters ``[B]``.

References:
  Brendel, Rauber, Kümmerer, Ustyuzhaninov & Bethge, "Accurate, reliable and fast robustness
  evaluation", NeurIPS 2019 (the trust-region problems; appendix: the L2 and Linf solvers).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array

PLANE_ITERATIONS = 24
"""Iterations of the search on the plane multiplier :math:`\\beta`."""
OUTER_ITERATIONS = 16
"""Iterations of the search on the L2 trust-region multiplier :math:`\\alpha` (twice as many for
the step length towards an unreachable plane)."""
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
