"""Lp norms, exact projections onto Lp balls and the box, and uniform sampling in Lp balls.

These are the geometric primitives of every attack: the size of a perturbation (``norm``), the
dual norm that measures distances to linearised boundaries (``dual_norm``), the Euclidean
projection onto the threat model's eps-ball (``project``), onto the valid input box
(``project_box``) and onto their intersection for L1 (``project_l1_box``), and uniform random
starts inside the ball (``sample_ball``).

Conventions shared by every function here:

* ``delta`` (or ``x``) is a float array ``[B, ...]``; norms are taken per example over all
  non-batch axes, so an image batch ``[B, H, W, C]`` has ``D = H * W * C`` coordinates
  (``dual_norm`` alone reduces the last axis, for stacks of flattened gradients).
* ``eps`` is a Python float, a scalar array or a per-example ``[B]`` array. It is data, never a
  static argument, so sweeping it under ``jax.jit`` does not recompile.
* ``norm`` is one of ``NORMS = ("linf", "l2", "l1")``; it is a static Python string.
* Computations stay in the dtype of ``delta`` (``eps`` is cast to it); nothing is upcast,
  except in ``project_l1_box``, which works and returns in float32 at least.

Everything is pure ``jax.numpy``: it traces under ``jit``, ``vmap`` and ``lax.scan``, with no
Python loop over examples and no data-dependent shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._types import NORMS, Array, ArrayLike

__all__ = ["NORMS", "check_norm", "dual_norm", "norm", "project", "project_box",
           "project_l1_box", "sample_ball"]


def check_norm(name: str) -> str:
  """Validates a norm name and returns it unchanged.

  The supported names are those of ``NORMS``: ``"linf"``, ``"l2"`` and ``"l1"`` (lower case,
  exactly). The check is on a static Python string, so it is free inside ``jax.jit``.

  Args:
    name: the norm name to check.

  Returns:
    ``name``, unchanged.

  Raises:
    ValueError: if ``name`` is not one of ``NORMS``; the message lists the supported names.

  Examples:
    >>> check_norm("l2")
    'l2'
    >>> check_norm("l3")
    Traceback (most recent call last):
    ...
    ValueError: Unknown norm 'l3'; supported: 'linf', 'l2', 'l1'.
  """
  if not isinstance(name, str) or name not in NORMS:
    supported = ", ".join(repr(n) for n in NORMS)
    raise ValueError(f"Unknown norm {name!r}; supported: {supported}.")
  return name


def _flatten(delta: Array) -> Array:
  """Reshapes ``[B, ...]`` to ``[B, D]`` (``D`` = number of non-batch elements, maybe 1)."""
  if delta.ndim < 1:
    raise ValueError(f"expected an array with a batch axis [B, ...], got shape {delta.shape}")
  return delta.reshape(delta.shape[0], math.prod(delta.shape[1:]))


def _per_example(eps: ArrayLike, ndim: int, dtype=None, batch: int | None = None) -> Array:
  """Turns ``eps`` (scalar or ``[B]``) into an array of rank ``ndim`` broadcastable to ``[B, ...]``.

  A scalar becomes shape ``[1] * ndim``; a ``[B]`` vector becomes ``[B, 1, ..., 1]``. The result
  has the same rank as the arrays it is combined with, as strict rank promotion requires. With
  ``batch`` given, a vector must have exactly ``batch`` entries. A concrete ``eps`` must be
  ``>= 0`` (``inf`` allowed): a negative radius is an empty ball, and the L1 projection's
  threshold, the L2 scale and the Linf clip would each return a different wrong point for it.
  Traced radii (inside an attack) are the callers' to check, at their front doors.
  """
  if not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(eps)):
    values = np.asarray(eps, np.float64)
    if values.size and not np.all(values >= 0):  # also refuses NaN
      raise ValueError(f"eps must be >= 0 (inf allowed); got min {np.min(values):g} (NaN: "
                       f"{int(np.sum(np.isnan(values)))} entries).")
  eps = jnp.asarray(eps, dtype=dtype)
  if eps.ndim == 0:
    return eps.reshape((1,) * ndim)
  if eps.ndim == 1:
    if batch is not None and eps.shape[0] != batch:
      raise ValueError(f"eps has {eps.shape[0]} entries but the batch has {batch} examples")
    return eps.reshape((eps.shape[0],) + (1,) * (ndim - 1))
  raise ValueError(f"eps must be a scalar or a per-example [B] array, got shape {eps.shape}")


def _safe_sqrt(sq: Array) -> Array:
  """``sqrt`` with value and gradient 0 at 0 (``jnp.sqrt`` has an infinite gradient there)."""
  positive = sq > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1)), 0)


def _norm_flat(v: Array, name: str) -> Array:
  """Per-row norm of a ``[B, D]`` array, as ``[B, 1]``."""
  if name == "linf":
    return jnp.max(jnp.abs(v), axis=1, keepdims=True)
  if name == "l2":
    return _safe_sqrt(jnp.sum(v * v, axis=1, keepdims=True))
  return jnp.sum(jnp.abs(v), axis=1, keepdims=True)


def norm(delta: ArrayLike, norm: str) -> Array:
  """Per-example Lp norm over all non-batch axes.

  With ``v`` the ``D`` non-batch coordinates of one example:
  ``linf: max_i |v_i|``, ``l2: sqrt(sum_i v_i^2)``, ``l1: sum_i |v_i|``. The L2 norm has gradient
  0 (not NaN) at ``v = 0``.

  Args:
    delta: ``[B, ...]`` float array.
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.

  Returns:
    ``[B]`` array of norms, in the dtype of ``delta``.

  Raises:
    ValueError: for an unknown norm name.

  Examples:
    >>> import jax.numpy as jnp
    >>> d = jnp.array([[3.0, -4.0], [1.0, 0.0]])
    >>> print(norm(d, "linf"), norm(d, "l2"), norm(d, "l1"))
    [4. 1.] [5. 1.] [7. 1.]
  """
  name = check_norm(norm)
  v = _flatten(jnp.asarray(delta))
  return _norm_flat(v, name)[:, 0]


_DUAL = {"linf": "l1", "l2": "l2", "l1": "linf"}


def dual_norm(v: ArrayLike, norm: str) -> Array:
  r"""The dual norm of the attack norm ``norm``, over the last axis of ``v``.

  The dual of :math:`\|\cdot\|_p` is :math:`\|w\|_q = \max_{\|d\|_p \le 1} \langle w, d\rangle`
  with :math:`1/p + 1/q = 1`: ``linf`` -> :math:`\|w\|_1 = \sum_i |w_i|`, ``l2`` ->
  :math:`\|w\|_2`, ``l1`` -> :math:`\|w\|_\infty = \max_i |w_i|`. It turns a gradient into
  distances: the linearised boundary :math:`f + \langle w, d\rangle = 0` lies at distance
  :math:`|f| / \|w\|_q` in the attack norm (Hölder's inequality is tight), which is how DeepFool,
  FAB and FMN pick the nearest boundary.

  Unlike :func:`norm`, which reduces every non-batch axis of ``[B, ...]``, this reduces only the
  last axis, so that a stack of flattened gradients ``[K, B, D]`` (one per candidate class) gives
  ``[K, B]``; flatten ``[B, ...]`` to ``[B, D]`` first for one value per example. The L2 case has
  gradient 0 (not NaN) at ``w = 0``, as in :func:`norm`.

  Args:
    v: ``[..., D]`` float array.
    norm: the attack norm, ``"linf"``, ``"l2"`` or ``"l1"`` (not the dual's name).

  Returns:
    ``[...]``, in the dtype of ``v``.

  Raises:
    ValueError: for an unknown norm name.

  Examples:
    >>> import jax.numpy as jnp
    >>> w = jnp.array([[3.0, -4.0], [1.0, 0.0]])
    >>> print(dual_norm(w, "linf"), dual_norm(w, "l2"), dual_norm(w, "l1"))
    [7. 1.] [5. 1.] [4. 1.]

  References:
    Moosavi-Dezfooli, Fawzi & Frossard, "DeepFool: a simple and accurate method to fool deep
    neural networks", CVPR 2016 (the distance to a linearised boundary in any Lp norm).
  """
  dual = _DUAL[check_norm(norm)]
  v = jnp.asarray(v)
  if dual == "l1":
    return jnp.sum(jnp.abs(v), axis=-1)
  if dual == "l2":
    return _safe_sqrt(jnp.sum(v * v, axis=-1))
  return jnp.max(jnp.abs(v), axis=-1)


def _project_l1(v: Array, eps: Array) -> Array:
  """Exact projection of each row of ``v [B, D]`` onto the L1 ball of radius ``eps [B|1, 1]``."""
  d = v.shape[1]
  a = jnp.abs(v)
  l1 = jnp.sum(a, axis=1, keepdims=True)
  inside = l1 <= eps
  # Rows that are inside are returned unchanged; give them a harmless finite radius (their own
  # norm) so that the unused branch has no inf or NaN (e.g. eps = inf), in values or gradients.
  eps = jnp.where(inside, l1, eps)
  k = jnp.arange(1, d + 1, dtype=v.dtype).reshape(1, d)
  u = -jnp.sort(-a, axis=1)  # magnitudes, descending
  # Pass 1: the closed-form threshold theta = max_k (sum_{i<=k} u_i - eps) / k.
  theta = jnp.max((jnp.cumsum(u, axis=1) - eps) / k, axis=1, keepdims=True)
  theta = jnp.maximum(theta, 0)
  # Pass 2: the same formula on the shifted magnitudes t = u - theta (still sorted). Their
  # positive part sums to about eps, so this correction c is free of the cancellation in
  # (cumsum - eps) when ||v||_1 >> eps; theta + c is the threshold.
  t = u - theta
  c = jnp.max((jnp.cumsum(t, axis=1) - eps) / k, axis=1, keepdims=True)
  w = jnp.clip((a - theta) - c, 0, a)
  return jnp.where(inside, v, jnp.sign(v) * w)


def project(delta: ArrayLike, eps: ArrayLike, norm: str) -> Array:
  """Exact Euclidean projection of each example onto its eps-ball.

  Returns ``argmin_{||w||_p <= eps} ||w - v||_2`` for each example ``v``, over all non-batch
  coordinates:

  * ``linf``: ``clip(v, -eps, eps)``.
  * ``l2``: ``v * min(1, eps / ||v||_2)`` (``v = 0`` and ``eps = 0`` give 0, never NaN).
  * ``l1``: if ``||v||_1 <= eps``, ``v``; otherwise soft-thresholding
    ``w_i = sign(v_i) max(|v_i| - theta, 0)`` with the unique ``theta > 0`` such that
    ``||w||_1 = eps`` (Duchi et al., 2008). With ``u`` the magnitudes sorted in decreasing order,
    ``s_k = u_1 + ... + u_k`` and ``f(k) = (s_k - eps) / k``, Duchi et al. take
    ``rho = max{k : u_k > f(k)}`` and ``theta = f(rho)``. Since
    ``f(k+1) - f(k) = (u_{k+1} - f(k)) / (k + 1)`` and ``u_{k+1} > f(k)`` iff
    ``u_{k+1} > f(k+1)``, ``f`` increases up to ``rho`` and never increases after it, so
    ``theta = max_k f(k)``: a sort, a cumulative sum and a max, batched over examples with no
    data-dependent shape. The formula is applied a second time, to the already sorted
    ``u - theta``, to correct the rounding of ``s_k - eps`` when ``||v||_1 >> eps`` (in exact
    arithmetic the correction is 0; in float32 it keeps ``||w||_1 = eps`` to relative precision).
    Ties, zero vectors and ``eps = 0`` (result 0) need no special case.

  Points already inside the ball are returned bitwise unchanged for every norm (except that XLA
  on CPU may flush subnormal values to zero in the Linf clip). ``eps = inf`` is allowed
  (identity), and no branch produces inf or NaN, in values or gradients, for ``v = 0``,
  ``eps = 0`` or ``eps = inf``.

  Args:
    delta: ``[B, ...]`` float array.
    eps: radius, a Python float, a scalar array or a per-example ``[B]`` array, ``>= 0``.
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.

  Returns:
    An array with the shape and dtype of ``delta``.

  Raises:
    ValueError: for an unknown norm name, an ``eps`` that is neither a scalar nor ``[B]``, or a
      concrete ``eps`` that is negative or NaN.

  Examples:
    >>> import jax.numpy as jnp
    >>> print(project(jnp.array([[3.0, 4.0]]), 1.0, "l2").round(3))
    [[0.6 0.8]]
    >>> print(project(jnp.array([[3.0, 1.0, -2.0]]), 2.0, "l1"))
    [[ 1.5  0.  -0.5]]
    >>> print(project(jnp.array([[3.0, -0.5], [1.0, 2.0]]), jnp.array([1.0, 0.0]), "linf"))
    [[ 1.  -0.5]
     [ 0.   0. ]]

  References:
    J. Duchi, S. Shalev-Shwartz, Y. Singer, T. Chandra. Efficient projections onto the l1-ball
    for learning in high dimensions. ICML 2008.
  """
  name = check_norm(norm)
  delta = jnp.asarray(delta)
  if name == "linf":
    e = _per_example(eps, delta.ndim, delta.dtype, delta.shape[0])
    return jnp.clip(delta, -e, e)
  v = _flatten(delta)
  e = _per_example(eps, 2, delta.dtype, delta.shape[0])
  if name == "l2":
    n = _norm_flat(v, "l2")
    outside = n > e
    # Both operands are replaced where unused, so that neither values nor gradients see 0/0 or
    # inf (eps = 0 with v = 0, or eps = inf).
    scale = jnp.where(outside, jnp.where(outside, e, 1) / jnp.where(outside, n, 1), 1)
    out = jnp.where(outside, v * scale, v)
  else:
    out = _project_l1(v, e)
  return out.reshape(delta.shape)


def project_box(delta: ArrayLike, x: ArrayLike, lower: ArrayLike, upper: ArrayLike) -> Array:
  """Clips a perturbation so that ``x + delta`` lies in the box ``[lower, upper]``.

  Returns ``clip(x + delta, lower, upper) - x``, the Euclidean projection of ``delta`` onto
  ``{d : lower <= x + d <= upper}`` (the box constraint is separable per coordinate). Where
  ``x + delta`` is already inside, the result equals ``delta`` up to the rounding of
  ``(x + delta) - x``.

  Args:
    delta: ``[B, ...]`` float array.
    x: ``[B, ...]`` clean inputs, same shape and dtype as ``delta``.
    lower: smallest valid input value (Python float or scalar array).
    upper: largest valid input value (Python float or scalar array).

  Returns:
    An array with the shape and dtype of ``delta``.

  Examples:
    >>> import jax.numpy as jnp
    >>> x = jnp.array([[0.25, 0.5, 0.75]])
    >>> print(project_box(jnp.array([[-0.5, 0.25, 0.5]]), x, 0.0, 1.0))
    [[-0.25  0.25  0.25]]
  """
  delta = jnp.asarray(delta)
  x = jnp.asarray(x, dtype=delta.dtype)
  lo = jnp.asarray(lower, dtype=delta.dtype)
  hi = jnp.asarray(upper, dtype=delta.dtype)
  if lo.ndim != 0 or hi.ndim != 0:
    raise ValueError(f"lower and upper must be scalars, got shapes {lo.shape} and {hi.shape}")
  return jnp.clip(x + delta, lo, hi) - x


def _l1_box_magnitudes(a: Array, cap: Array, eps: Array, refinements: int = 2) -> Array:
  """``clip(a - lam, 0, cap)`` for the root ``lam >= 0`` of ``sum_i clip(a_i - lam, 0, cap_i) = eps``.

  Rows ``[B, D]``; ``eps`` is ``[B|1, 1]``. Rows whose box projection already has
  ``sum_i min(a_i, cap_i) <= eps`` use ``lam = 0``.
  """
  d = a.shape[1]
  dtype = a.dtype
  # f(lam) = sum_i clip(a_i - lam, 0, cap_i) is continuous, non-increasing and piecewise
  # linear: coordinate i is constant (cap_i) for lam <= a_i - cap_i, then falls with slope -1
  # until lam = a_i. Sort the 2D breakpoints, carrying the change of the number of falling
  # coordinates (+1 where one starts to fall, -1 where it reaches 0), and walk f along them.
  start = jnp.maximum(a - cap, 0)
  breaks = jnp.concatenate([start, a], axis=1)
  change = jnp.concatenate([jnp.ones_like(a), -jnp.ones_like(a)], axis=1)
  breaks, change = jax.lax.sort((breaks, change), dimension=1, num_keys=1)
  slope = jnp.cumsum(change, axis=1)  # falling coordinates just after each breakpoint
  f0 = jnp.sum(jnp.minimum(a, cap), axis=1, keepdims=True)
  drop = slope[:, :-1] * (breaks[:, 1:] - breaks[:, :-1])
  f = f0 - jnp.concatenate([jnp.zeros_like(f0), jnp.cumsum(drop, axis=1)], axis=1)
  # The last breakpoint with f > eps starts the linear piece that contains the root. A one-hot
  # select along the coordinate axis (never a gather) keeps batch-sharded rows where they live.
  index = jnp.arange(2 * d, dtype=jnp.int32).reshape(1, 2 * d)
  last = jnp.max((f > eps).astype(jnp.int32) * index, axis=1, keepdims=True)
  pick = lambda v: jnp.sum(jnp.where(index == last, v, 0), axis=1, keepdims=True)
  lam = pick(breaks) + (pick(f) - eps) / jnp.maximum(pick(slope), 1)
  lam = jnp.where(f0 > eps, jnp.maximum(lam, 0), jnp.zeros_like(lam))
  # The cumulative sums cancel badly when f(0) >> eps, and lam itself only carries the ulp of
  # the largest |v_i|. So the threshold is kept as lam + mu: t = a - lam is exact near the
  # root (Sterbenz), and Newton steps on f evaluated directly (a sum of non-negative terms
  # close to eps) find the small correction mu. On the right linear piece one step is exact.
  t = a - lam
  mu = jnp.zeros_like(lam)
  for _ in range(refinements):
    value = jnp.sum(jnp.clip(t - mu, 0, cap), axis=1, keepdims=True)
    falling = jnp.sum(((t - mu > 0) & (t - mu < cap)).astype(dtype), axis=1, keepdims=True)
    step = (value - eps) / jnp.maximum(falling, 1)
    mu = jnp.where((falling > 0) & (f0 > eps), mu + step, mu)
  return jnp.clip(t - mu, 0, cap)


def project_l1_box(delta: ArrayLike, x: ArrayLike, eps: ArrayLike, lower: ArrayLike,
                   upper: ArrayLike) -> Array:
  r"""Exact Euclidean projection onto the intersection of the L1 ball and the box.

  For each example, with ``v = delta`` and the box of perturbations ``[lo, hi] = [lower - x,
  upper - x]`` (``lo <= 0 <= hi`` since ``x`` is in the box), returns

  .. math::
     \operatorname*{argmin}_{\|w\|_1 \le \epsilon,\; lo \le w \le hi} \|w - v\|_2 .

  The problem separates per coordinate once the multiplier :math:`\lambda \ge 0` of the L1
  constraint is known (KKT): :math:`w_i(\lambda) = \operatorname{clip}(\operatorname{sign}(v_i)
  \max(|v_i| - \lambda, 0), lo_i, hi_i)`. If the box projection ``w(0) = clip(v, lo, hi)`` has
  :math:`\|w(0)\|_1 \le \epsilon` it is the answer; otherwise :math:`\lambda > 0` is the root of
  :math:`f(\lambda) = \|w(\lambda)\|_1 = \sum_i \operatorname{clip}(|v_i| - \lambda, 0, c_i) =
  \epsilon` with :math:`c_i` the box room in the direction of :math:`v_i`. :math:`f` is
  continuous, non-increasing and piecewise linear with the ``2D`` breakpoints
  :math:`\max(|v_i| - c_i, 0)` and :math:`|v_i|`; sorting them and accumulating the slopes gives
  :math:`f` at every breakpoint, the linear piece that crosses :math:`\epsilon` and the root in
  closed form (``O(D log D)``). Two Newton steps on :math:`f` evaluated directly then remove the
  float32 cancellation of the cumulative sums when :math:`\|w(0)\|_1 \gg \epsilon`.

  This is not "project onto the L1 ball, then clip to the box": that point can be far from the
  projection (the clipped mass is lost instead of being spent on other coordinates). Where the box
  does not bind the result equals :func:`project` with ``"l1"``.

  Args:
    delta: ``[B, ...]`` float perturbations.
    x: ``[B, ...]`` clean inputs inside ``[lower, upper]``.
    eps: L1 radius ``>= 0``, a Python float, a scalar array or a per-example ``[B]`` array.
    lower: smallest valid input value (scalar).
    upper: largest valid input value (scalar).

  Returns:
    The projected perturbation, shape of ``delta``, in float32 (or a wider float dtype of
    ``delta``). ``eps = 0`` gives exactly 0.

  Examples:
    >>> import jax.numpy as jnp
    >>> x = jnp.array([[0.75, 0.5, 0.5]])  # the box leaves 0.25 above the first coordinate
    >>> v = jnp.array([[0.75, 0.375, 0.0]])
    >>> print(project_l1_box(v, x, 1.0, 0.0, 1.0))  # only the box binds
    [[0.25  0.375 0.   ]]
    >>> print(project_l1_box(v, x, 0.5, 0.0, 1.0))  # both bind: lambda = 0.125
    [[0.25 0.25 0.  ]]

  References:
    F. Croce, M. Hein. Mind the box: l1-APGD for sparse adversarial attacks on image
    classifiers. ICML 2021 (the L1-box projection).
  """
  delta = jnp.asarray(delta)
  # float32 at least, float64 kept; by bit width, since strict promotion refuses promote_types.
  dtype = delta.dtype if jnp.finfo(delta.dtype).bits >= 32 else jnp.dtype(jnp.float32)
  v = _flatten(delta.astype(dtype))
  xf = _flatten(jnp.asarray(x, dtype))
  lo = jnp.asarray(lower, dtype)
  hi = jnp.asarray(upper, dtype)
  if lo.ndim != 0 or hi.ndim != 0:
    raise ValueError(f"lower and upper must be scalars, got shapes {lo.shape} and {hi.shape}")
  if xf.shape != v.shape:
    raise ValueError(f"x and delta must have the same shape, got {x.shape} and {delta.shape}")
  e = _per_example(eps, 2, dtype, v.shape[0])
  # Under an Explicit mesh a select needs its operands sharded alike; adding zeros gives v the
  # sharding of x (and x that of v) when only one of them is batch-sharded.
  v, xf = v + jnp.zeros_like(xf), xf + jnp.zeros_like(v)
  a = jnp.abs(v)
  cap = jnp.maximum(jnp.where(v > 0, hi - xf, xf - lo), 0)
  out = jnp.sign(v) * _l1_box_magnitudes(a, cap, e)
  out = jnp.where((e > 0) & (a >= 0), out, jnp.zeros_like(out))
  return out.reshape(delta.shape)


def sample_ball(
    key: ArrayLike, shape: Sequence[int], eps: ArrayLike, norm: str, *, dtype=jnp.float32
) -> Array:
  """Draws one point uniformly from the eps-ball of each example, for random starts.

  ``shape = (B, ...)`` includes the batch axis; with ``D`` the number of non-batch elements:

  * ``linf``: each coordinate uniform in ``[-eps, eps)``.
  * ``l2``: ``eps * u^(1/D) * g / ||g||_2`` with ``g ~ N(0, I_D)`` and ``u ~ U[0, 1)``. The
    direction ``g / ||g||`` is uniform on the sphere (the Gaussian is rotation invariant) and
    ``P(radius <= r) = (r / eps)^D`` is the volume fraction of the ball of radius ``r``.
  * ``l1``: ``eps * s * e_{1:D} / (e_1 + ... + e_{D+1})`` with ``e_i`` iid ``Exp(1)`` and ``s``
    iid random signs. The density of ``e`` is ``exp(-sum_i e_i)``; in the variables
    ``y_i = e_i / S`` (``i <= D``) and ``S = e_1 + ... + e_{D+1}`` the Jacobian is ``S^D``, so the
    joint density ``S^D exp(-S)`` factorises and ``y`` is uniform on the simplex
    ``{y >= 0, sum_i y_i <= 1}``. Independent signs map it uniformly onto the ``2^D`` orthant
    copies, whose union is the unit L1 ball (this is the case ``p = 1`` of Barthe et al., 2005).

  Args:
    key: a single JAX PRNG key (``jax.random.key`` or a raw ``uint32 [2]`` key).
    shape: output shape ``(B, ...)``.
    eps: radius, a Python float, a scalar array or a per-example ``[B]`` array.
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    dtype: floating dtype of the samples (default ``float32``).

  Returns:
    ``shape`` array of samples, each example inside its eps-ball (up to rounding).

  Raises:
    ValueError: for an unknown norm name, an empty ``shape``, an ``eps`` that is neither a
      scalar nor ``[B]``, or a concrete ``eps`` that is negative or NaN.

  Examples:
    >>> import jax
    >>> s = sample_ball(jax.random.key(0), (4, 3, 2), 0.5, "l1")
    >>> print(s.shape, s.dtype, bool((norm(s, "l1") <= 0.5).all()))
    (4, 3, 2) float32 True

  References:
    M. E. Muller. A note on a method for generating points uniformly on n-dimensional spheres.
    Communications of the ACM, 1959.
    F. Barthe, O. Guedon, S. Mendelson, A. Naor. A probabilistic approach to the geometry of the
    l_p^n-ball. Annals of Probability, 2005.
  """
  name = check_norm(norm)
  shape = tuple(int(s) for s in shape)
  if not shape:
    raise ValueError("shape must include the batch axis, e.g. (B, ...)")
  b, d = shape[0], math.prod(shape[1:])
  e = _per_example(eps, 2, dtype, b)
  if name == "linf":
    out = jax.random.uniform(key, (b, d), dtype, -1, 1) * e
  elif name == "l2":
    k_dir, k_rad = jax.random.split(key)
    g = jax.random.normal(k_dir, (b, d), dtype)
    n = _norm_flat(g, "l2")
    direction = g / jnp.where(n > 0, n, 1)
    radius = jax.random.uniform(k_rad, (b, 1), dtype) ** (1.0 / d)
    out = direction * (radius * e)
  else:
    k_exp, k_sign = jax.random.split(key)
    ex = jax.random.exponential(k_exp, (b, d + 1), dtype)
    y = ex[:, :d] / jnp.sum(ex, axis=1, keepdims=True)
    sign = jnp.where(jax.random.bernoulli(k_sign, 0.5, (b, d)), 1, -1).astype(dtype)
    out = sign * y * e
  return out.reshape(shape)
