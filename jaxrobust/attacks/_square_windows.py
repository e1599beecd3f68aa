r"""The Square attack's windows: their size schedule, the L2 pattern they carry, where they go,
and the starting perturbations tiled from them.

The tables are NumPy, computed once per configuration and cached; a window and its L2 pattern
are placed by comparing ``iota`` positions with per-example corners (no gather, no matrix
product). The attack that draws the corners and signs and accepts or rejects the
candidates is :mod:`jaxrobust.attacks._square`.

**Schedule.** At iteration :math:`k` of a run of ``queries``, with :math:`i = \lfloor 10000\,k /
\text{queries} \rfloor` (or :math:`i = k` without rescaling), a window covers a fraction

.. math::
   p_k = p_\text{init} \cdot 2^{-n(i)}, \qquad n(i) = \#\{\tau \in (10, 50, 200, 500, 1000, 2000,
   4000, 6000, 8000) : i > \tau\}

of the grid (:func:`p_schedule`, :data:`P_THRESHOLDS`): its side is :math:`s_k =
\min(\max(\operatorname{round}(\sqrt{p_k H W}), 1), \min(H, W))` on an image
(:func:`window_sizes`) and its length :math:`\min(\max(\operatorname{round}(p_k T), 1), T)` on a
sequence (:func:`run_lengths`); for L2 the lower bound is 3 and an even size is rounded up to an
odd one before the cap.

**Pattern.** The L2 window carries :math:`\eta(s)` (:func:`eta`; :func:`eta_run` on a sequence):
two halves of opposite signs and equal norm, each nested squares (intervals) around its centre,
:math:`\eta_{ij} \propto \sum_{k = d_{ij}}^{K-1} (k + 1)^{-2}` at Chebyshev distance
:math:`d_{ij}`. Placed per pixel in closed form (:func:`eta_window`, :func:`eta_run_window`)
through :math:`\sum_{k=d}^{K-1} (k+1)^{-2} = \psi_1(d + 1) - \psi_1(K + 1)` with the trigamma
function :math:`\psi_1` (:func:`_trigamma`). The L1 window carries ``eta(s, "l1")``: the same
halves with weights :math:`(k+1)^{-4}` and L1 norm :math:`1/2` each, placed through the Hurwitz
zeta :math:`\zeta(4, d + 1) - \zeta(4, K + 1)` (:func:`_zeta4`).

**Starts.** Linf: vertical stripes :math:`x + \epsilon\,\sigma`, one sign per column (position)
and channel (:func:`linf_start`). L2: a centred grid of :math:`\pm\eta` tiles with a random sign
per tile and channel and a random transpose (mirror) per tile, rescaled to norm
:math:`\epsilon` (:func:`l2_start`, :func:`_start_grid`). Both are clipped to the box. L1: the
same grid of ``eta(s, "l1")`` tiles, unscaled, projected exactly onto the L1 ball and the box
(:func:`l1_start`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._batch import expand
from jaxrobust.attacks._common import l1_box_point
from jaxrobust.attacks._square_layouts import Grid

Array = jax.Array

P_THRESHOLDS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)
"""Rescaled-iteration thresholds after which the Square window fraction ``p`` halves."""

_HIGHEST = jax.lax.Precision.HIGHEST


def p_schedule(queries: int, p_init: float = 0.8, rescale: bool = True) -> np.ndarray:
  r"""The fraction :math:`p_k` of the image a window covers at each iteration ``k`` of a run.

  The rescaled schedule (the Square reference's default): :math:`i = \lfloor 10000 k /
  \text{queries} \rfloor` and :math:`p_k = p_\text{init} / 2^{n}` with :math:`n` the number of
  thresholds in :data:`P_THRESHOLDS` that :math:`i` exceeds. With ``rescale=False`` (what the
  AutoAttack suite runs) :math:`i = k`.

  Args:
    queries: iterations per run.
    p_init: the initial fraction.
    rescale: map the run onto 10000 iterations before applying the thresholds.

  Returns:
    ``[queries]`` float64 array.

  Examples:
    >>> (p_schedule(20, 0.8) * 512 / 0.8).astype(int).tolist()[:6]
    [512, 64, 32, 16, 16, 8]

  References:
    Andriushchenko, Croce, Flammarion & Hein, "Square Attack: a query-efficient black-box
    adversarial attack via random search", ECCV 2020.
  """
  out = np.empty(queries)
  for k in range(queries):
    i = int(k / queries * 10000) if rescale else k
    out[k] = p_init / 2 ** sum(i > tau for tau in P_THRESHOLDS)
  return out


def window_sizes(norm: str, queries: int, p_init: float, height: int, width: int,
                 rescale: bool = True) -> np.ndarray:
  """The window side ``s_k`` at each iteration of a run on an image (``[queries]`` int array).

  Linf: ``max(round(sqrt(p_k H W)), 1)``; L2: ``max(round(sqrt(p_k H W)), 3)``, plus one if even;
  both capped at ``min(H, W)``. ``round`` is Python's (halves to even), as in the reference.

  Examples:
    >>> window_sizes("linf", 5000, 0.8, 32, 32)[[0, 6, 26, 101, 4999]].tolist()
    [29, 20, 14, 10, 1]
    >>> window_sizes("l2", 5000, 0.8, 32, 32)[[0, 6, 26, 101, 4999]].tolist()
    [29, 21, 15, 11, 3]
  """
  sizes = []
  for p in p_schedule(queries, p_init, rescale):
    s = round(math.sqrt(p * height * width))
    if norm == "linf":
      s = max(s, 1)
    else:
      s = max(s, 3)
      s += 1 - s % 2
    sizes.append(min(s, height, width))
  return np.asarray(sizes, np.int32)


def run_lengths(norm: str, queries: int, p_init: float, length: int,
                rescale: bool = True) -> np.ndarray:
  """The window length ``s_k`` at each iteration of a run on a sequence of ``length`` positions.

  The one-dimensional :func:`window_sizes`: a window covers a fraction ``p_k`` of the positions.
  Linf: ``max(round(p_k T), 1)``; L2: ``max(round(p_k T), 3)``, plus one if even; both capped at
  ``T``.

  Examples:
    >>> at = [0, 11, 51, 201, 501, 1001, 2001]
    >>> run_lengths("linf", 5000, 0.8, 64, rescale=False)[at].tolist()
    [51, 26, 13, 6, 3, 2, 1]
    >>> run_lengths("l2", 5000, 0.8, 64, rescale=False)[at].tolist()
    [51, 27, 13, 7, 3, 3, 3]
  """
  sizes = []
  for p in p_schedule(queries, p_init, rescale):
    s = round(p * length)
    if norm == "linf":
      s = max(s, 1)
    else:
      s = max(s, 3)
      s += 1 - s % 2
    sizes.append(min(s, length))
  return np.asarray(sizes, np.int32)


def _power(norm: str) -> int:
  """The exponent of the nested-square weights: 2 for the L2 pattern, 4 for the L1 one."""
  return 4 if norm == "l1" else 2


def _nested(rows: int, cols: int, power: int = 2) -> np.ndarray:
  """Nested squares around the centre of a ``rows x cols`` array, not normalised (float64).

  The entry at Chebyshev distance ``d`` from the centre ``(rows // 2, cols // 2)`` is
  ``sum_{k=d}^{K-1} 1 / (k + 1)**power`` with ``K = max(rows, cols) // 2 + 1``.
  """
  levels = max(rows, cols) // 2 + 1
  tail = np.cumsum((1.0 / np.arange(1, levels + 1) ** power)[::-1])[::-1]  # sum_{k>=d}
  dist = np.maximum(np.abs(np.arange(rows) - rows // 2)[:, None],
                    np.abs(np.arange(cols) - cols // 2)[None, :])
  return tail[dist]


def _unit(v: np.ndarray, norm: str) -> np.ndarray:
  """``v`` divided by its L2 norm (its L1 norm for ``norm="l1"``)."""
  size = np.sum(np.abs(v)) if norm == "l1" else np.sqrt(np.sum(v * v))
  return v / size


def _rectangle(rows: int, cols: int, norm: str = "l2") -> np.ndarray:
  """:func:`_nested` with unit L2 norm, or unit L1 norm and weights ``(k + 1)**-4`` for
  ``norm="l1"`` (an empty array when ``rows`` or ``cols`` is 0)."""
  if rows == 0 or cols == 0:
    return np.zeros((rows, cols))
  return _unit(_nested(rows, cols, _power(norm)), norm)


def eta(s: int, norm: str = "l2") -> np.ndarray:
  r"""The window pattern :math:`\eta(s)`: ``[s, s]`` float64 of unit L2 norm (L1 for ``"l1"``).

  L2: the top ``s // 2`` rows are nested squares (:math:`\sum_{k \ge d} (k+1)^{-2}` at
  Chebyshev distance :math:`d` from their centre) of norm :math:`1/\sqrt 2`; the bottom rows the
  same with a minus sign. L1 (Square L1 of Croce et al., 2021): the weights are
  :math:`\sum_{k \ge d} (k+1)^{-4}`, more concentrated at the centres, and each half has L1
  norm :math:`1/2`.

  Examples:
    >>> import numpy as np
    >>> e = eta(5)
    >>> round(float(np.sum(e ** 2)), 6), bool((e[:2] > 0).all() and (e[2:] < 0).all())
    (1.0, True)
    >>> e = eta(5, "l1")
    >>> round(float(np.abs(e).sum()), 6), round(float(e[:2].sum()), 6)
    (1.0, 0.5)
  """
  top = _rectangle(s // 2, s, norm)
  bottom = -_rectangle(s - s // 2, s, norm)
  return _unit(np.concatenate([top, bottom], axis=0), norm)


def eta_run(s: int, norm: str = "l2") -> np.ndarray:
  r"""The pattern of a run of ``s`` positions, the one-dimensional :math:`\eta(s)`: ``[s]``.

  The first ``s // 2`` entries are nested intervals around their centre (:math:`\sum_{k \ge d}
  (k+1)^{-2}` at distance :math:`d` from it; :math:`(k+1)^{-4}` for ``"l1"``) of norm
  :math:`1/\sqrt 2` (L1 norm :math:`1/2`); the others the same with a minus sign. Unit L2 norm
  (unit L1 norm for ``"l1"``).

  Examples:
    >>> import numpy as np
    >>> e = eta_run(5)
    >>> round(float(np.sum(e ** 2)), 6), bool((e[:2] > 0).all() and (e[2:] < 0).all())
    (1.0, True)
  """
  first = _rectangle(1, s // 2, norm)
  second = -_rectangle(1, s - s // 2, norm)
  return _unit(np.concatenate([first, second], axis=1)[0], norm)


def _trigamma(x: Array) -> Array:
  r""":math:`\psi_1(x) = \sum_{k \ge 0} (x + k)^{-2}` for :math:`x \ge 1`, elementwise.

  Six terms of the series, then the asymptotic expansion at :math:`z = x + 6 \ge 7` (truncation
  error below :math:`10^{-10}`).
  """
  head = sum(1 / (x + i) ** 2 for i in range(6))
  z = x + 6
  w = 1 / (z * z)
  tail = (1 + (1 / 2 + (1 / 6 + (-1 / 30 + (1 / 42 - w / 30) * w) * w) / z) / z) / z
  return head + tail


def _zeta4(x: Array) -> Array:
  r"""The Hurwitz zeta :math:`\zeta(4, x) = \sum_{k \ge 0} (x + k)^{-4}` for :math:`x \ge 1`.

  Six terms of the series, then the Euler-Maclaurin expansion at :math:`z = x + 6 \ge 7`,
  :math:`z^{-3}/3 + z^{-4}/2 + z^{-5}/3 - z^{-7}/6 + 2 z^{-9}/9` (truncation error below
  :math:`10^{-9}` relative). The L1 pattern's nested sums are :math:`\sum_{k=d}^{K-1} (k+1)^{-4} =
  \zeta(4, d + 1) - \zeta(4, K + 1)`.
  """
  head = sum(1 / (x + i) ** 4 for i in range(6))
  z = x + 6
  w = 1 / (z * z)
  tail = (1 / 3 + (1 / 2 + (1 / 3 + (-1 / 6 + 2 / 9 * w) * w) / z) / z) / (z * z * z)
  return head + tail


def _tail(x: Array, power: int) -> Array:
  """``sum_{k >= 0} (x + k)**-power`` for the pattern's exponent (2: L2, 4: L1)."""
  return _zeta4(x) if power == 4 else _trigamma(x)


def _half_scale(rows: int, cols: int, norm: str, halves: bool) -> float:
  """The factor that turns :func:`_nested` into one half of :func:`eta` (0 for an empty half)."""
  if not rows or not cols:
    return 0.0
  r = _nested(rows, cols, _power(norm))
  if norm == "l1":
    return 1 / (np.sum(r) * (2.0 if halves else 1.0))
  return 1 / (math.sqrt(np.sum(r ** 2)) * (math.sqrt(2.0) if halves else 1.0))


@functools.lru_cache(maxsize=32)
def schedule_tables(norm: str, queries: int, p_init: float, height: int, width: int,
                     rescale: bool = True):
  """Static per-iteration tables: window sides ``[queries]`` and, for L2 and L1, the ``eta``
  constants.

  For L2 the second result is ``[queries, 3]``: ``psi_1(K + 1)`` with ``K = s // 2 + 1`` (so the
  nested-square sum is ``psi_1(d + 1) - psi_1(K + 1)`` at Chebyshev distance ``d``), and the
  scales of the top and bottom halves that make the pattern equal :func:`eta`. For L1 the same
  with ``zeta(4, K + 1)`` (:func:`_zeta4`) and the scales of ``eta(s, "l1")``.
  """
  sizes = window_sizes(norm, queries, p_init, height, width, rescale)
  if norm == "linf":
    return sizes, None
  constants = {}
  for s in set(sizes.tolist()):
    scales = [_half_scale(rows, s, norm, s // 2 > 0) for rows in (s // 2, s - s // 2)]
    constants[s] = (float(_tail(float(s // 2 + 2), _power(norm))), *scales)
  return sizes, np.asarray([constants[s] for s in sizes.tolist()])


@functools.lru_cache(maxsize=32)
def run_tables(norm: str, queries: int, p_init: float, length: int, rescale: bool = True):
  """:func:`schedule_tables` for runs: lengths ``[queries]`` and, for L2 and L1,
  ``[queries, 4]``.

  The four constants are ``psi_1(K + 1)`` (``zeta(4, K + 1)`` for L1) of the first and of the
  second half (``K`` = half length ``// 2 + 1``) and the scales that make the two halves equal
  :func:`eta_run`.
  """
  sizes = run_lengths(norm, queries, p_init, length, rescale)
  if norm == "linf":
    return sizes, None
  constants = {}
  for s in set(sizes.tolist()):
    halves = (s // 2, s - s // 2)
    scales = [_half_scale(1, n, norm, s // 2 > 0) for n in halves]
    constants[s] = (*(float(_tail(float(n // 2 + 2), _power(norm))) for n in halves), *scales)
  return sizes, np.asarray([constants[s] for s in sizes.tolist()])


def eta_window(s: Array, constants: Array, start_h: Array, start_w: Array, flip: Array,
                height: int, width: int, dtype, norm: str = "l2") -> Array:
  """``eta(s, norm)`` (transposed where ``flip``) placed at ``(start_h, start_w)``:
  ``[B, H, W, 1]``.

  Evaluated per pixel in closed form from iota comparisons (no gathers, no matmuls): 0 outside
  the window. ``constants`` is a row of :func:`schedule_tables` for the same ``norm``.
  """
  rows = jax.lax.broadcasted_iota(jnp.int32, (1, height, width, 1), 1) - expand(start_h, 4)
  cols = jax.lax.broadcasted_iota(jnp.int32, (1, height, width, 1), 2) - expand(start_w, 4)
  inside = (rows >= 0) & (rows < s) & (cols >= 0) & (cols < s)
  flip = expand(flip, 4)
  li, lj = jnp.where(flip, cols, rows), jnp.where(flip, rows, cols)
  half = s // 2
  top = li < half
  centre = jnp.where(top, half // 2, half + (s - half) // 2)
  d = jnp.maximum(jnp.abs(li - centre), jnp.abs(lj - half))
  psi_k, scale_top, scale_bottom = (constants[i].astype(dtype) for i in range(3))
  value = _tail(d.astype(dtype) + 1, _power(norm)) - psi_k
  value = jnp.where(top, value * scale_top, -value * scale_bottom)
  return jnp.where(inside, value, 0)


def eta_run_window(s: Array, constants: Array, start: Array, mirror: Array, length: int,
                    dtype, norm: str = "l2") -> Array:
  """``eta_run(s, norm)`` (mirrored where ``mirror``) placed at ``start``: ``[B, 1, T, 1]``, in
  closed form as :func:`eta_window`; 0 outside the run."""
  pos = jax.lax.broadcasted_iota(jnp.int32, (1, 1, length, 1), 2) - expand(start, 4)
  inside = (pos >= 0) & (pos < s)
  pos = jnp.where(expand(mirror, 4), s - 1 - pos, pos)
  half = s // 2
  first = pos < half
  d = jnp.abs(pos - jnp.where(first, half // 2, half + (s - half) // 2))
  psi_first, psi_second, scale_first, scale_second = (constants[i].astype(dtype)
                                                       for i in range(4))
  value = _tail(d.astype(dtype) + 1, _power(norm)) - jnp.where(first, psi_first, psi_second)
  value = jnp.where(first, value * scale_first, -value * scale_second)
  return jnp.where(inside, value, 0)


@functools.lru_cache(maxsize=32)
def _start_grid(height: int, width: int, image: bool = True, norm: str = "l2"):
  """The L2 (L1) start's tiles: ``one_hot [H*W, T]`` pixel-to-tile and the pattern maps ``[H*W]``
  of ``eta(s, norm)``.

  Images: tiles of side ``s = max(min(H, W) // 5, 1)`` on a grid centred on each axis; ``plain``
  and ``transposed`` hold, per pixel, the value of ``eta(s)`` (or its transpose) of its tile (0
  off the grid). Sequences (``H = 1``, ``image=False``): runs of ``max(W // 25, 1)`` positions
  holding ``eta_run`` (or its mirror image), centred.
  """
  if not image:
    s = max(width // 25, 1)
    tiles, left = width // s, (width - width // s * s) // 2
    one_hot = np.zeros((width, tiles))
    plain, mirrored = np.zeros(width), np.zeros(width)
    for b in range(tiles):
      c0 = left + b * s
      one_hot[c0:c0 + s, b] = 1.0
      plain[c0:c0 + s] = eta_run(s, norm)
      mirrored[c0:c0 + s] = eta_run(s, norm)[::-1]
    return one_hot, plain, mirrored
  s = max(min(height, width) // 5, 1)
  pattern = eta(s, norm)
  rows, cols = height // s, width // s
  top, left = (height - rows * s) // 2, (width - cols * s) // 2
  one_hot = np.zeros((height, width, rows * cols))
  plain = np.zeros((height, width))
  transposed = np.zeros((height, width))
  for a in range(rows):
    for b in range(cols):
      r0, c0 = top + a * s, left + b * s
      one_hot[r0:r0 + s, c0:c0 + s, a * cols + b] = 1.0
      plain[r0:r0 + s, c0:c0 + s] = pattern
      transposed[r0:r0 + s, c0:c0 + s] = pattern.T
  return (one_hot.reshape(height * width, rows * cols), plain.reshape(-1),
          transposed.reshape(-1))


def window_mask(start_h: Array, start_w: Array, s: Array, height: int, width: int) -> Array:
  """``[B, H, W, 1]`` bool: the per-example ``s x s`` window at ``(start_h, start_w)`` (for a
  sequence, ``H = 1`` and ``start_h = 0``: the run of ``s`` positions from ``start_w``)."""
  rows = jax.lax.broadcasted_iota(jnp.int32, (1, height, 1, 1), 1)
  cols = jax.lax.broadcasted_iota(jnp.int32, (1, 1, width, 1), 2)
  h0, w0 = expand(start_h, 4), expand(start_w, 4)
  return (rows >= h0) & (rows < h0 + s) & (cols >= w0) & (cols < w0 + s)


def channel_norm(v: Array) -> Array:
  """Per-example, per-channel L2 norm over the spatial axes of ``[B, H, W, C]``, ``[B, 1, 1, C]``.

  Used by the L2 window update, which (like the reference) rescales each channel separately.
  """
  return jnp.sqrt(jnp.sum(v * v, axis=(1, 2), keepdims=True))


def image_norm(v: Array) -> Array:
  """Per-example L2 norm of ``[B, H, W, C]``: ``[B, 1, 1, 1]``."""
  return jnp.sqrt(jnp.sum(v * v, axis=(1, 2, 3), keepdims=True))


def channel_l1(v: Array) -> Array:
  """Per-example, per-channel L1 norm over the spatial axes of ``[B, H, W, C]``: ``[B, 1, 1, C]``
  (the L1 window update's :func:`channel_norm`)."""
  return jnp.sum(jnp.abs(v), axis=(1, 2), keepdims=True)


def image_l1(v: Array) -> Array:
  """Per-example L1 norm of ``[B, H, W, C]``: ``[B, 1, 1, 1]``."""
  return jnp.sum(jnp.abs(v), axis=(1, 2, 3), keepdims=True)


def random_sign(bits: Array, dtype) -> Array:
  """``+1`` or ``-1`` from the lowest bit of each word."""
  return jnp.where((bits & 1) == 1, 1, -1).astype(dtype)


def start_words(norm: str, g: Grid) -> int:
  """Random ``uint32`` words one example's start needs."""
  if norm == "linf":
    return g.width * g.channels
  return _start_grid(g.height, g.width, g.image, norm)[0].shape[1] * (g.channels + 1)


def linf_start(x4: Array, eps: Array, lower: Array, upper: Array, bits: Array,
                g: Grid) -> Array:
  """Vertical stripes: ``x + eps * sign`` with one sign per column and channel, in the box (for a
  sequence, one sign per position and channel)."""
  batch, _, width, channels = x4.shape
  signs = random_sign(bits.reshape(batch, 1, width, channels), x4.dtype)
  return jnp.clip(x4 + expand(eps, 4) * signs, lower, upper)


def _tiles(x4: Array, bits: Array, g: Grid, norm: str) -> Array:
  """The start's unscaled perturbation: ``±eta(s, norm)`` tiles, ``[B, H, W, C]``."""
  batch, height, width, channels = x4.shape
  one_hot, plain, transposed = (jnp.asarray(a, x4.dtype)
                                for a in _start_grid(height, width, g.image, norm))
  tiles = one_hot.shape[1]

  bits = bits.reshape(batch, tiles, channels + 1)
  signs = random_sign(bits[:, :, :channels], x4.dtype)  # [B, T, C]
  flips = (bits[:, :, channels] & 1).astype(x4.dtype)  # [B, T]: transpose the tile's pattern
  flipped = jnp.einsum("pt,bt->bp", one_hot, flips, precision=_HIGHEST)  # [B, H*W] in {0, 1}
  value = jnp.where(flipped > 0.5, transposed[None, :], plain[None, :])
  sign_map = jnp.einsum("pt,btc->bpc", one_hot, signs, precision=_HIGHEST)  # [B, H*W, C]
  return (value[:, :, None] * sign_map).reshape(batch, height, width, channels)


def l2_start(x4: Array, eps: Array, lower: Array, upper: Array, bits: Array, g: Grid) -> Array:
  """A centred grid of ``±eta`` tiles (random sign per tile and channel, random transpose; for a
  sequence, runs of ``±eta_run`` with a random mirror image), rescaled to norm ``eps`` and
  clipped to the box."""
  delta = _tiles(x4, bits, g, "l2")
  delta = delta / (image_norm(delta) + 1e-12) * expand(eps, 4)
  return jnp.clip(x4 + delta, lower, upper)


def l1_start(x4: Array, eps: Array, lower: Array, upper: Array, bits: Array, g: Grid) -> Array:
  """The same grid of ``±eta(s, "l1")`` tiles (each of unit L1 norm, not rescaled), projected
  exactly onto the intersection of the L1 ball of radius ``eps`` and the box
  (:func:`jaxrobust.projections.project_l1_box`), as the reference does."""
  delta = _tiles(x4, bits, g, "l1")
  return l1_box_point(delta, x4, eps, lower, upper)
