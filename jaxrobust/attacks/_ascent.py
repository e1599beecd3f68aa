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

from jaxrobust._batch import expand

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
  xa = _flat(x_adv).astype(g.dtype)
  room = jnp.where(g > 0, upper - xa, jnp.where(g < 0, xa - lower, 0.0))
  room = jnp.maximum(room, 0.0)
  # Adding zeros gives the positions g's batch sharding (an Explicit mesh axis types every
  # array, and sort needs its operands sharded alike).
  position = jax.lax.broadcasted_iota(jnp.int32, g.shape, 1) + jnp.zeros_like(g, jnp.int32)
  # A stable sort, so that ties go to the lower index on every backend.
  _, room_sorted, position_sorted = jax.lax.sort((-jnp.abs(g), room, position), dimension=1,
                                                 is_stable=True, num_keys=1)
  # Mass handed to the coordinates ahead of each one in the greedy order.
  before = jnp.concatenate([jnp.zeros_like(room_sorted[:, :1]),
                            jnp.cumsum(room_sorted[:, :-1], axis=1)], axis=1)
  budget = expand(mass.astype(g.dtype), 2)
  given_sorted = jnp.clip(budget - before, 0.0, room_sorted)
  _, given = jax.lax.sort((position_sorted, given_sorted), dimension=1, num_keys=1)
  return (jnp.sign(g) * given).reshape(grad.shape)
