r"""Exact minimum-norm projections onto a hyperplane intersected with a box (the core of FAB).

For each row of ``t [B, D]`` (a point inside the box :math:`[l, u]`), ``w [B, D]`` and
``r [B]`` the problem is

.. math::
   \min_d \|d\|_p \quad\text{s.t.}\quad \langle w, d\rangle = r, \qquad l \le t + d \le u,

the smallest step from :math:`t` onto the hyperplane :math:`\{z : \langle w, z - t\rangle = r\}`
that stays in the box. Flipping the signs of :math:`w` and :math:`r` if needed makes
:math:`r \ge 0`; then no coordinate moves against :math:`\operatorname{sign}(w_i)`, and with
:math:`v_i = |w_i|`, the room :math:`m_i \ge 0` to the box face in the helpful direction and
:math:`d_i = \operatorname{sign}(w_i)\, a_i` the problem becomes

.. math::
   \min_a \|a\|_p \quad\text{s.t.}\quad \sum_i v_i a_i = r, \qquad 0 \le a_i \le m_i,

feasible if and only if :math:`\sum_i v_i m_i \ge r`. Its solutions (KKT conditions):

* :math:`\ell_2`: :math:`a_i = \min(\lambda v_i, m_i)`;
* :math:`\ell_\infty`: :math:`a_i = \min(\lambda, m_i)` for :math:`v_i > 0` (else 0);
* :math:`\ell_1`: fill the coordinates in decreasing order of :math:`v_i` (the largest decrease
  of the constraint gap per unit of L1 norm) up to their room, the last one partially; tied
  coordinates at the pivot share the remainder in proportion to their room (every split of a tie
  has the same L1 norm).

For L2 and Linf, :math:`g(\lambda) = \sum_i v_i a_i(\lambda)` is piecewise linear and
non-decreasing with breakpoints :math:`\beta_i` (:math:`m_i / v_i` for L2, :math:`m_i` for Linf).
The coordinates saturated at the solution are those with :math:`\beta_i < \lambda^*`, where
:math:`\lambda^* = \min\{\lambda : g(\lambda) \ge r\}`; then
:math:`\lambda = (r - \sum_{\text{saturated}} v_i m_i) / \sum_{\text{free}} \omega_i` with
:math:`\omega_i = v_i^2` (L2) or :math:`v_i` (Linf). For L1 the greedy fill stops at the pivot
value :math:`v^* = \max\{\tau : \sum_{v_i \ge \tau} v_i m_i \ge r\}`. Both thresholds are found
by bisection on the bit pattern of a non-negative float (whose order is that of the numbers):
31 halvings for float32 (63 for float64) end on two adjacent floats around the threshold, so
the partition is exact, each halving one fused pass over the ``D`` coordinates. This replaces a
sort of the coordinates, which XLA:CPU runs with a comparator call per comparison and which costs
several times the whole bisection (``benchmarks/RESULTS.md``, "Loop bodies: Square, FAB-T").
Nothing is gathered along the batch axis.

When the problem is infeasible (the box does not reach the hyperplane), the box corner that
moves furthest towards it is returned, :math:`a_i = m_i` where :math:`v_i > 0` and 0 elsewhere
(the point of the box closest to the hyperplane in the sense of the constraint, with the
smallest norm among those), as the reference implementation does for L2 and L1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def _bisect(predicate, like: Array, dtype) -> tuple[Array, Array]:
  """``(lo, hi)`` ``[B]``: adjacent non-negative floats of ``dtype`` (``hi`` may be ``inf``) with
  ``predicate(lo)`` True and ``predicate(hi)`` False, for a ``predicate(tau [B]) -> [B] bool``
  that is True on ``[0, threshold)`` (or ``[0, threshold]``) and False above.

  Bisects on the bit patterns of ``[0, inf]``, which are ordered as the numbers; ``lo`` stays 0
  where ``predicate(0)`` is False. The bounds are built from ``like`` (``[B]``), so that they
  carry its batch sharding.
  """
  bits = jnp.uint32 if jnp.dtype(dtype).itemsize == 4 else jnp.uint64
  top = np.array(np.inf, dtype).view(bits)  # the bit pattern of +inf
  lo = jnp.full_like(like, 0, dtype=bits)
  hi = jnp.full_like(like, top, dtype=bits)

  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    below = predicate(jax.lax.bitcast_convert_type(mid, dtype))
    return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

  lo, hi = jax.lax.fori_loop(0, int(top).bit_length(), halve, (lo, hi))
  return (jax.lax.bitcast_convert_type(lo, dtype), jax.lax.bitcast_convert_type(hi, dtype))


def _lambda_from_breakpoints(breaks: Array, saturated: Array, slope: Array, r: Array) -> Array:
  r"""Solves :math:`\sum_{\beta_i \le \lambda} s_i + \lambda \sum_{\beta_i > \lambda} \omega_i = r`.

  The left side :math:`g(\lambda)` is continuous and non-decreasing; bisection finds the first
  float :math:`\tau` with :math:`g(\tau) \ge r`, the coordinates with :math:`\beta_i < \tau` are
  the saturated ones, and :math:`\lambda` follows in closed form from that partition.

  Args:
    breaks: ``[B, D]`` breakpoints :math:`\beta_i \ge 0` (``inf`` for inactive coordinates).
    saturated: ``[B, D]`` :math:`s_i = \omega_i \beta_i`, a coordinate's contribution once past
      its breakpoint (0 for inactive coordinates).
    slope: ``[B, D]`` :math:`\omega_i \ge 0` (0 for inactive coordinates).
    r: ``[B]`` the target value, ``>= 0``.

  Returns:
    ``[B]`` :math:`\lambda \ge 0`, ``inf`` when no finite :math:`\lambda` reaches ``r``.
  """

  def below(tau):  # g(tau) < r
    tau = tau[:, None]
    return jnp.sum(jnp.where(breaks <= tau, saturated, tau * slope), axis=1) < r

  _, first = _bisect(below, r, breaks.dtype)
  prefix = breaks < first[:, None]  # the saturated coordinates
  fixed = jnp.sum(jnp.where(prefix, saturated, 0.0), axis=1)
  free = jnp.sum(jnp.where(prefix, 0.0, slope), axis=1)
  ok = free > 0
  lam = jnp.where(ok, (r - fixed) / jnp.where(ok, free, 1.0), jnp.inf)
  return jnp.maximum(lam, 0.0)


def _l1_amounts(v: Array, room: Array, cap: Array, r: Array) -> Array:
  """The L1 solution ``a [B, D]``: greedy fill by decreasing ``v``, ties share the remainder.

  The pivot is the largest ``v`` whose coordinates, with all larger ones, can cover ``r``
  (``0`` when even all of them cannot: every coordinate with ``v > 0`` is then filled).
  """

  def covers(tau):  # the coordinates with v >= tau can cover r
    return jnp.sum(jnp.where(v >= tau[:, None], cap, 0.0), axis=1) >= r

  pivot, _ = _bisect(covers, r, v.dtype)
  pivot = jnp.minimum(pivot, jnp.max(v, axis=1))  # r = 0: the largest v, as a greedy fill has
  above = v > pivot[:, None]
  tied = (v == pivot[:, None]) & (v > 0)
  remainder = r - jnp.sum(jnp.where(above, cap, 0.0), axis=1)
  tied_cap = jnp.sum(jnp.where(tied, cap, 0.0), axis=1)
  ok = tied_cap > 0
  share = jnp.clip(jnp.where(ok, remainder / jnp.where(ok, tied_cap, 1.0), 1.0), 0.0, 1.0)
  return jnp.where(above, room, jnp.where(tied, room * share[:, None], 0.0))


def project_hyperplane_box(t: Array, w: Array, r: Array, lower: Array, upper: Array,
                           norm: str) -> Array:
  r"""The smallest step ``d`` with :math:`\langle w, d\rangle = r` and ``t + d`` in the box.

  Solves, for each row independently,

  .. math::
     \min_d \|d\|_p \quad\text{s.t.}\quad \langle w, d\rangle = r,\quad
     \text{lower} \le t + d \le \text{upper},

  exactly (see the module docstring for the closed forms). Where the box does not reach the
  hyperplane, returns the box corner that moves furthest towards it (``d_i`` at the box face in
  the direction :math:`\operatorname{sign}(r\, w_i)` where :math:`w_i \ne 0`, and 0 elsewhere).

  Args:
    t: ``[B, D]`` points inside ``[lower, upper]``.
    w: ``[B, D]`` hyperplane normals (a zero row gives ``d = 0``).
    r: ``[B]`` the required change of :math:`\langle w, \cdot\rangle`.
    lower: scalar lower bound of the box.
    upper: scalar upper bound of the box.
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.

  Returns:
    ``[B, D]`` the step ``d``, in the dtype of ``t``.

  Examples:
    >>> import jax.numpy as jnp
    >>> t, w = jnp.array([[0.5, 0.9]]), jnp.array([[1.0, 1.0]])
    >>> d = project_hyperplane_box(t, w, jnp.array([0.4]), 0.0, 1.0, "l2")  # the second clips at 1
    >>> [round(float(v), 4) for v in d[0]]
    [0.3, 0.1]

  References:
    Croce & Hein, "Minimally distorted adversarial examples with a fast adaptive boundary
    attack", ICML 2020 (Section 3, the projection onto the linearised boundary and the box).
  """
  dtype = t.dtype
  w = w.astype(dtype)
  r = r.astype(dtype)
  lower = jnp.asarray(lower, dtype)
  upper = jnp.asarray(upper, dtype)
  flip = jnp.where(r < 0, -1.0, 1.0).astype(dtype)
  r = jnp.abs(r)
  direction = jnp.sign(w) * flip[:, None]  # +1: increasing d_i helps, -1: decreasing, 0: neither
  v = jnp.abs(w)
  active = v > 0
  room = jnp.maximum(jnp.where(direction > 0, upper - t, t - lower), 0.0)
  room = jnp.where(active, room, 0.0)
  cap = v * room
  feasible = jnp.sum(cap, axis=1) >= r

  if norm == "l1":
    a = _l1_amounts(v, room, cap, r)
  else:
    safe_v = jnp.where(active, v, 1.0)
    if norm == "l2":
      breaks, slope = room / safe_v, v * v
      scale = lambda lam: lam[:, None] * v
    elif norm == "linf":
      breaks, slope = room, v
      scale = lambda lam: jnp.broadcast_to(lam[:, None], v.shape)
    else:
      raise ValueError(f"norm must be 'linf', 'l2' or 'l1', got {norm!r}.")
    breaks = jnp.where(active, breaks, jnp.inf)
    lam = _lambda_from_breakpoints(breaks, cap, slope, r)
    a = jnp.minimum(scale(jnp.where(jnp.isfinite(lam), lam, 0.0)), room)
    a = jnp.where(jnp.isfinite(lam)[:, None], a, room)
  a = jnp.where(feasible[:, None], a, room)
  return jnp.where(active, direction * a, 0.0)
