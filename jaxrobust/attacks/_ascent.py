r"""Steepest-ascent directions under each norm, batched over examples.

For a gradient :math:`g`, the steepest-ascent direction of unit :math:`\ell_p` norm maximises
:math:`\langle g, d \rangle` subject to :math:`\|d\|_p \le 1`:

* :math:`\ell_\infty`: :math:`d = \operatorname{sign}(g)` (FGSM, Goodfellow et al. 2015);
* :math:`\ell_2`: :math:`d = g / \|g\|_2`;
* :math:`\ell_1`: all mass on the largest :math:`|g_i|`. A single coordinate stalls as soon as it
  hits the box. :func:`direction` offers the sparse variant of Tramèr & Boneh (2019): spread the
  step evenly over the top fraction of coordinates by :math:`|g_i|`, skipping coordinates that the
  box blocks (at ``lower`` with :math:`g_i < 0` or at ``upper`` with :math:`g_i > 0`), as
  AutoAttack's L1 APGD also does. :func:`l1_box_step` is the exact answer instead: the step of
  L1 mass :math:`m` that maximises :math:`\langle g, d \rangle` inside the box (see there).

References:
  Goodfellow, Shlens & Szegedy, "Explaining and Harnessing Adversarial Examples", ICLR 2015.
  Tramèr & Boneh, "Adversarial Training and Robustness for Multiple Perturbations", NeurIPS 2019.
  Croce & Hein, "Mind the box: l1-APGD for sparse adversarial attacks", ICML 2021.
  Jaggi, "Revisiting Frank-Wolfe: projection-free sparse convex optimization", ICML 2013 (the
  linear maximisation oracle of the L1 ball).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxrobust._batch import expand, work_dtype

Array = jax.Array


def _flat(a: Array) -> Array:
  return a.reshape(a.shape[0], -1)


def l1_topk(num_elements: int, sparsity: float) -> int:
  """How many coordinates one sparse L1 step moves: ``ceil(sparsity * D)``, at least 1."""
  return max(1, min(num_elements, math.ceil(sparsity * num_elements)))


def direction(grad: Array, norm: str, x_adv: Array, lower: Array, upper: Array,
              l1_sparsity: float) -> Array:
  """The unit-norm steepest-ascent direction ``[B, ...]`` (0 where the gradient is 0)."""
  if norm == "linf":
    return jnp.sign(grad)
  if norm == "l2":
    g = _flat(grad)
    n = jnp.sqrt(jnp.sum(g * g, axis=1))
    safe = jnp.where(n > 0, n, 1.0)
    return grad / expand(safe, grad.ndim)
  if norm == "l1":
    g = _flat(grad)
    xa = _flat(x_adv)
    blocked = ((xa <= lower) & (g < 0)) | ((xa >= upper) & (g > 0))
    magnitude = jnp.where(blocked, 0.0, jnp.abs(g))
    k = l1_topk(g.shape[1], l1_sparsity)
    kth = jax.lax.top_k(magnitude, k)[0][:, k - 1:k]
    chosen = (magnitude >= kth) & (magnitude > 0)
    count = jnp.sum(chosen, axis=1, keepdims=True).astype(g.dtype)
    d = jnp.where(chosen, jnp.sign(g), 0.0) / jnp.maximum(count, 1.0)
    return d.reshape(grad.shape)
  # Unreachable through the factories, which validate the norm.
  raise ValueError(f"Unknown norm {norm!r}; supported: 'linf', 'l2', 'l1'.")


def l1_box_step(grad: Array, x_adv: Array, lower: Array, upper: Array, mass: Array) -> Array:
  r"""The step ``d [B, ...]`` of L1 mass ``mass [B]`` that best follows ``grad`` inside the box.

  For each example it solves the linear programme

  .. math::
     \max_d \langle g, d \rangle \quad \text{s.t.} \quad \|d\|_1 \le m,\;
     l \le x + d \le u ,

  whose answer is greedy (a fractional knapsack: every unit of L1 mass earns :math:`|g_i|` on
  coordinate :math:`i`, which can absorb its box headroom :math:`h_i = u - x_i` if
  :math:`g_i > 0`, :math:`x_i - l` if :math:`g_i < 0`): visit the coordinates in decreasing
  :math:`|g_i|` and give each :math:`\min(h_i, m - \text{mass already given})` in the direction
  of :math:`\operatorname{sign}(g_i)`. With :math:`m = \epsilon` and ``x_adv`` the clean point
  this is the exact maximiser of the linearised loss over the L1 ball intersected with the box,
  i.e. the best single step (a vertex of that set, as in Frank-Wolfe's linear maximisation
  oracle); the top-fraction step of :func:`direction` spreads mass over several coordinates
  instead and can never concentrate on the best one. Coordinates with :math:`g_i = 0` get
  nothing; ties in :math:`|g_i|` go to the lower index. Two per-row sorts of the ``D``
  coordinates (by :math:`-|g_i|`, then back by position) keep every row where it lives, with no
  gather.

  Args:
    grad: ``[B, ...]`` gradient.
    x_adv: ``[B, ...]`` current point, inside ``[lower, upper]``.
    lower: scalar lower bound of the box.
    upper: scalar upper bound of the box.
    mass: ``[B]`` L1 mass of the step, ``>= 0``.

  Returns:
    ``[B, ...]`` step ``d`` with ``||d||_1 <= mass`` and ``lower <= x_adv + d <= upper``.

  Examples:
    >>> import jax.numpy as jnp
    >>> g = jnp.array([[3.0, -2.0, 1.0]])
    >>> x = jnp.array([[0.75, 0.5, 0.5]])  # 0.25 of room above the best coordinate
    >>> l1_box_step(g, x, 0.0, 1.0, jnp.array([1.0]))  # fills 0.25 up, then 0.5 down, then 0.25
    Array([[ 0.25, -0.5 ,  0.25]], dtype=float32)
  """
  g = _flat(grad)
  room = _headroom(g, _flat(x_adv).astype(g.dtype), lower, upper)
  given = _greedy_fill(-jnp.abs(g), room, expand(mass.astype(g.dtype), 2))
  return (jnp.sign(g) * given).reshape(grad.shape)


def _headroom(g: Array, xa: Array, lower: Array, upper: Array) -> Array:
  """``[B, D]``: how far each coordinate of ``xa`` can move in the direction of ``sign(g)``
  inside the box (0 where ``g`` is 0)."""
  room = jnp.where(g > 0, upper - xa, jnp.where(g < 0, xa - lower, 0.0))
  return jnp.maximum(room, 0.0)


def _greedy_fill(order: Array, capacity: Array, amount: Array) -> Array:
  """``[B, D]``: ``amount [B, 1]`` poured into the coordinates in increasing ``order`` (ties to the
  lower index), each taking at most its ``capacity``: the fractional knapsack behind
  :func:`l1_box_step` (mass given) and :func:`l1_shed` (mass taken). Two per-row sorts (by
  ``order``, then back by position) keep every row where it lives, with no gather."""
  # Adding zeros gives the positions the rows' batch sharding (an Explicit mesh axis types every
  # array, and sort needs its operands sharded alike).
  position = (jax.lax.broadcasted_iota(jnp.int32, capacity.shape, 1)
              + jnp.zeros_like(capacity, jnp.int32))
  # A stable sort, so that ties go to the lower index on every backend.
  _, capacity_sorted, position_sorted = jax.lax.sort((order, capacity, position), dimension=1,
                                                     is_stable=True, num_keys=1)
  # The amount taken by the coordinates ahead of each one.
  before = jnp.concatenate([jnp.zeros_like(capacity_sorted[:, :1]),
                            jnp.cumsum(capacity_sorted[:, :-1], axis=1)], axis=1)
  filled_sorted = jnp.clip(amount - before, 0.0, capacity_sorted)
  _, filled = jax.lax.sort((position_sorted, filled_sorted), dimension=1, num_keys=1)
  return filled


def l2_box_step(grad: Array, x_adv: Array, lower: Array, upper: Array, length: Array) -> Array:
  r"""The step ``d [B, ...]`` of L2 norm ``<= length [B]`` that best follows ``grad`` in the box.

  For each example it solves

  .. math::
     \max_d \langle g, d \rangle \quad \text{s.t.} \quad \|d\|_2 \le r,\;
     l \le x + d \le u ,

  whose answer, by the KKT conditions, is :math:`d_i = \operatorname{sign}(g_i) \min(\tau |g_i|,
  h_i)` with the headroom :math:`h_i` (:math:`u - x_i` if :math:`g_i > 0`, :math:`x_i - l` if
  :math:`g_i < 0`) and the largest :math:`\tau \ge 0` that keeps :math:`\|d\|_2 \le r`: every
  coordinate is either proportional to the gradient or on its face. Where no coordinate meets
  its face this is the plain step :math:`r\, g / \|g\|_2`; where some do (pixels at 0 or 1), the
  plain step clipped to the box afterwards loses the clipped part of :math:`r`, and this one
  spends it on the free coordinates. :math:`\tau` is exact: with the breakpoints
  :math:`\beta_i = h_i / |g_i|` in increasing order, on :math:`[\beta_{(k-1)}, \beta_{(k)}]` the
  squared norm is :math:`S_k + \tau^2 A_k` (:math:`S_k`: the squared headroom of the
  coordinates already on their face, :math:`A_k`: the squared gradient of the others), so one
  sort and two cumulative sums find the piece where it reaches :math:`r^2`. If every coordinate
  can sit on its face within :math:`r`, they all do. Computed in float32 at least.

  Args:
    grad: ``[B, ...]`` gradient.
    x_adv: ``[B, ...]`` current point, inside ``[lower, upper]``.
    lower: scalar lower bound of the box.
    upper: scalar upper bound of the box.
    length: ``[B]`` L2 norm of the step, ``>= 0``.

  Returns:
    ``[B, ...]`` step ``d`` in ``grad``'s dtype with ``||d||_2 <= length`` (up to rounding) and
    ``lower <= x_adv + d <= upper``.

  Examples:
    >>> import jax.numpy as jnp
    >>> g = jnp.array([[3.0, 4.0]])
    >>> x = jnp.array([[0.5, 0.5]])
    >>> l2_box_step(g, x, 0.0, 1.0, jnp.array([0.5]))  # the box does not bind: 0.5 g / |g|
    Array([[0.3, 0.4]], dtype=float32)
    >>> x = jnp.array([[0.5, 0.875]])  # 0.125 of room left on the second coordinate
    >>> d = l2_box_step(g, x, 0.0, 1.0, jnp.array([0.5]))  # the rest: sqrt(15) / 8 = 0.4841
    >>> [round(float(v), 4) for v in d[0]]
    [0.4841, 0.125]

  References:
    Boyd & Vandenberghe, "Convex Optimization", 2004, section 5.5 (the KKT conditions).
  """
  dtype = work_dtype(grad)
  g = _flat(grad).astype(dtype)
  xa = _flat(x_adv).astype(dtype)
  a = jnp.abs(g)
  a = a / jnp.maximum(jnp.max(a, axis=1, keepdims=True), jnp.finfo(dtype).tiny)
  moving = a > 0
  room = jnp.where(moving, _headroom(g, xa, lower, upper), 0.0)
  breaks = jnp.where(moving, room / jnp.where(moving, a, 1.0), jnp.inf)
  breaks_s, room_s, a_s = jax.lax.sort((breaks, room, a), dimension=1, num_keys=1)
  full_sq = jnp.cumsum(room_s * room_s, axis=1) - room_s * room_s  # S_k: faces before k
  free_sq = jnp.flip(jnp.cumsum(jnp.flip(a_s * a_s, axis=1), axis=1), axis=1)  # A_k
  finite = jnp.isfinite(breaks_s)
  end_sq = full_sq + jnp.where(finite, breaks_s, 0.0) ** 2 * free_sq
  end_sq = jnp.where(finite, end_sq, full_sq)  # past the last moving coordinate: all faces
  radius_sq = expand(length.astype(dtype), 2) ** 2
  reaches = end_sq >= radius_sq
  piece = jnp.argmax(reaches, axis=1, keepdims=True)
  found = jnp.any(reaches, axis=1, keepdims=True)
  s_k = jnp.take_along_axis(full_sq, piece, axis=1)
  a_k = jnp.take_along_axis(free_sq, piece, axis=1)
  tau = jnp.sqrt(jnp.maximum(radius_sq - s_k, 0.0) / jnp.where(a_k > 0, a_k, 1.0))
  tau = jnp.where(found & (a_k > 0), tau, jnp.inf)
  d = jnp.where(moving, jnp.minimum(tau * a, room), 0.0) * jnp.sign(g)
  return d.astype(grad.dtype).reshape(grad.shape)


def l1_shed(delta: Array, grad: Array, eps: Array) -> Array:
  r"""``delta [B, ...]`` with its L1 mass above ``eps [B]`` taken from its least useful coordinates.

  Each coordinate earns :math:`\operatorname{sign}(\delta_i)\, g_i` per unit of
  :math:`|\delta_i|` on the linearised loss; the excess :math:`\|\delta\|_1 - \epsilon` (if
  positive) is removed from the coordinates in increasing order of that rate, each shrunk towards
  0 at most to 0. This is the exact maximiser of :math:`\langle g, \delta' \rangle` among the
  :math:`\delta'` with :math:`0 \le \delta'_i / \delta_i \le 1` and
  :math:`\|\delta'\|_1 = \min(\|\delta\|_1, \epsilon)` (it removes no more than the excess), and
  it keeps a point of the box in the box (coordinates only move towards the clean input). The
  Euclidean projection onto the L1 ball instead shrinks every coordinate by the same amount, the
  best ones too; PGD-L1 uses this in its last step, where that uniform shrinking would leave
  mass on the wrong coordinates.

  Args:
    delta: ``[B, ...]`` perturbation.
    grad: ``[B, ...]`` gradient of the loss at the point the step came from.
    eps: ``[B]`` L1 radius, ``>= 0``.

  Returns:
    ``[B, ...]`` in ``delta``'s dtype with ``||result||_1 <= eps`` (up to rounding).

  Examples:
    >>> import jax.numpy as jnp
    >>> d = jnp.array([[0.5, 0.5, -0.5]])
    >>> g = jnp.array([[3.0, 1.0, 2.0]])  # the last coordinate moves against its gradient
    >>> l1_shed(d, g, jnp.array([0.75])) + 0.0  # it goes first, then 0.25 of the weakest other
    Array([[0.5 , 0.25, 0.  ]], dtype=float32)
  """
  dtype = work_dtype(delta)
  d = _flat(delta).astype(dtype)
  g = _flat(grad).astype(dtype)
  magnitude = jnp.abs(d)
  rate = jnp.sign(d) * g
  excess = jnp.maximum(jnp.sum(magnitude, axis=1, keepdims=True)
                       - expand(eps.astype(dtype), 2), 0.0)
  removed = _greedy_fill(rate, magnitude, excess)
  return (jnp.sign(d) * (magnitude - removed)).astype(delta.dtype).reshape(delta.shape)
