r"""The Square attack (Andriushchenko et al., 2020): score-based random search, no gradients.

Square asks the model only for its logits, one forward pass ("query") per iteration, so it is the
attack to run when gradients are masked (rounded inputs, ``stop_gradient``, saturated logits).
It minimises a margin-like objective :math:`m(x')` (by default
:math:`m = z_y - \max_{j \ne y} z_j`; for a targeted attack :math:`\max_{j \ne t} z_j - z_t`) by
random search over perturbations on the boundary of the eps-ball, accepting a candidate only when
it lowers :math:`m` (or is adversarial):

.. math::
   x^{(k+1)} = \begin{cases} \tilde x & m(\tilde x) < m(x^{(k)}) \text{ or } \tilde x
   \text{ adversarial} \\ x^{(k)} & \text{otherwise,} \end{cases}

where the candidate :math:`\tilde x` changes :math:`x^{(k)}` only inside a random square window
of side :math:`s_k` (the same window for every channel). The window side shrinks with the
iteration :math:`k` of ``queries`` (AutoAttack's rescaled schedule): with
:math:`i = \lfloor 10000\,k / \text{queries} \rfloor`,

.. math::
   p_k = p_\text{init} \cdot 2^{-n(i)}, \qquad n(i) = \#\{\tau \in (10, 50, 200, 500, 1000, 2000,
   4000, 6000, 8000) : i > \tau\},

and :math:`s_k = \min(\max(\operatorname{round}(\sqrt{p_k H W}), 1), \min(H, W))` for Linf
(:math:`\max(\cdot, 3)` and rounded up to an odd number for L2 and L1), so a window covers about
a fraction :math:`p_k` of the image.

**Linf.** Start from vertical stripes :math:`x + \epsilon\,\sigma`, with one random sign
:math:`\sigma` per column and channel; a candidate sets the window to
:math:`x^{(k)} + 2\epsilon\,\sigma_c` (one random sign per channel), clipped to the ball and the
box, so every coordinate sits at a vertex :math:`x \pm \epsilon` unless the box cuts it.

**L2.** Start from a centred grid of :math:`s_0 \times s_0` tiles (:math:`s_0 =
\max(\lfloor \min(H, W) / 5 \rfloor, 1)`), each holding the pattern :math:`\pm\eta(s_0)`
(random sign per tile and channel, random transpose per tile), rescaled to norm
:math:`\epsilon`. Here
:math:`\eta(s)` is an :math:`s \times s` pattern whose top and bottom halves have opposite signs
and equal norm, each half made of nested squares around its centre,
:math:`\eta_{ij} \propto \sum_{k = d_{ij}}^{K-1} (k + 1)^{-2}` with :math:`d_{ij}` the Chebyshev
distance to the half's centre. A candidate draws two windows :math:`W_1, W_2`; per channel
:math:`c` it empties both and refills :math:`W_1` with

.. math::
   \delta_{W_1, c} \leftarrow \frac{v}{\|v\|_2}\sqrt{\frac{\max(\epsilon^2 - \|\delta\|_2^2, 0)}{C}
   + \|\delta_{W_1 \cup W_2, c}\|_2^2}, \qquad
   v = \pm\eta(s_k) + \frac{\delta_{W_1, c}}{\|\delta_{W_1, c}\|_2},

which moves mass from :math:`W_2` into :math:`W_1` and keeps the norm; then the whole
perturbation is rescaled to norm :math:`\epsilon` and clipped to the box. The window's pattern is
evaluated per pixel in closed form, :math:`\sum_{k=d}^{K-1} (k+1)^{-2} = \psi_1(d + 1) -
\psi_1(K + 1)` with the trigamma function :math:`\psi_1`, so placing it costs no gather and no
matrix product.

**L1** (the L1 Square of the AutoAttack reference, introduced with L1-APGD by Croce & Hein,
2021). The same windows, with the L1
pattern :math:`\eta_1(s)`: two halves of opposite signs, each of L1 norm :math:`1/2`, made of
nested squares with the steeper weights :math:`\eta_{ij} \propto \sum_{k = d_{ij}}^{K-1}
(k + 1)^{-4}` (evaluated as :math:`\zeta(4, d + 1) - \zeta(4, K + 1)`, Hurwitz zeta), so the
mass concentrates at the two centres. The start is the L2 start's grid of :math:`\pm\eta_1(s_0)`
tiles, each of unit L1 norm and not rescaled, projected onto the intersection of the L1 ball of
radius :math:`\epsilon` and the box, :math:`\Pi` (:func:`jaxrobust.projections.project_l1_box`,
exact: a soft threshold, so only the largest entries of the tiles survive when their total
exceeds :math:`\epsilon`). A candidate draws two windows; per channel :math:`c` it empties both
and refills :math:`W_1` with

.. math::
   \delta_{W_1, c} \leftarrow \frac{v}{\|v\|_1}\Big(\max(\epsilon - \|\delta\|_1, 0) +
   C\,\|\delta_{W_1 \cup W_2, c}\|_1\Big), \qquad
   v = \pm\eta_1(s_k) + \frac{\delta_{W_1, c}}{\|\delta_{W_1, c}\|_1},

then :math:`x + \Pi(\delta)` is the candidate. With one channel this moves the mass of
:math:`W_2` (and the unused budget) into :math:`W_1`; with :math:`C` channels the factor
:math:`C` is the reference's: the refill overshoots the ball and the projection's soft threshold
takes the excess from every coordinate (measured on ``[B, 4, 4, 4]`` linear problems, 1000
queries: without the factor 0% success at :math:`2\,d^*`, with it 44%). Every iterate lies in
the L1 ball and the box up to the rounding of :math:`x + \delta` (the projection is exact).

**Input layouts.** The windows live on a grid of positions, each holding ``C`` channels; a
window covers every channel of its positions, and a Linf window gives each channel its own sign.
How ``x`` of shape ``[B, ...]`` maps to that grid (always a reshape, never a transpose) is the
``layout`` option of :func:`square` (see :func:`grid`):

* ``"image"``, ``[B, H, W, C]`` (NHWC, as Flax) or ``[B, H, W]`` (one channel): the
  :math:`H \times W` pixels, square windows as above. An image with a single row or column is a
  sequence of its pixels.
* ``"sequence"``, ``[B, T, C]``: ``T`` positions of ``C`` channels (a multichannel signal); any
  ``[B, P_1, \dots, P_k, C]`` is the sequence of its :math:`P_1 \cdots P_k` positions in memory
  order. A window is a run of :math:`s_k` contiguous positions, :math:`s_k =
  \min(\max(\operatorname{round}(p_k T), 1), T)` for Linf (:math:`\max(\cdot, 3)`, rounded up to
  an odd number, for L2: see :func:`run_lengths`), so that it again covers a fraction
  :math:`p_k` of the positions. The Linf start has one sign per position and channel; the L2
  start tiles the sequence with runs of :math:`\max(\lfloor T / 25 \rfloor, 1)` positions (25
  tiles, as the image grid has), and the L2 pattern of a run is the one-dimensional
  :func:`eta_run` (a positive and a negative half, each nested intervals around its centre; the
  random transpose becomes a random mirror image).
* ``"features"``, any ``[B, ...]``: the ``D`` coordinates of an example in memory order, as a
  sequence of ``D`` positions with one channel (tabular data, flat features): a window is a run
  of contiguous features with one sign for Linf, ending with single features, so that on a
  linear model the search reaches every coordinate of the optimal vertex.
* ``"auto"`` (the default): ``[B, D]`` is ``"features"``; ``[B, T, F]`` is a ``"sequence"`` of
  ``T`` positions when ``F`` is at most :data:`MAX_CHANNELS` (4) and smaller than ``T``, and
  otherwise a one-channel ``T x F`` ``"image"`` (a grayscale image, a time-by-feature grid:
  with many channels the :math:`2^F` sign patterns of a window defeat random search);
  ``[B, H, W, C]`` is an ``"image"``; more axes are a ``"sequence"`` when the last one holds at
  most 4 channels and ``"features"`` otherwise. A sequence of a single position is the
  ``"features"`` of its channels. A 4-D input that looks channels-first (NCHW: axis 1 holds at
  most 4 entries, axes 2 and 3 at least 8 each) raises a ``ValueError``: transpose it to
  channels-last and back inside ``logits_fn``, or pass ``layout="image"`` if it really is NHWC.

A point stops changing once it is adversarial. ``restarts`` independent runs are laid end to end
in one scan of ``restarts * (queries + 1) - 1`` steps, each step one query: ``init`` queries the
first run's start, every later step either queries one candidate or, between runs, the next run's
start. The best point over the runs is returned (success first, then the objective); a point
broken in one run is not attacked in the next ones, as in AutoAttack.

Differences from the reference implementation (``fra31/auto-attack``), all deliberate: every
example draws its own windows, signs and transposes from its own key (the reference shares one
window per iteration across the batch), so results do not depend on the batch; window corners are
uniform over all ``H - s + 1`` positions per axis (the reference's ``randint(0, H - s)`` never
places a window at the last position, so with ``s < H`` the last row and column are never
updated); non-square images ``H != W`` are handled per axis (the L2 start grid is centred on each
axis and fits every image size, where the reference's grid fails for images under 5 pixels or
when ``H // (H // 5)`` tiles overflow the image; for ``H = W >= 25`` both grids coincide); inputs
that are not images are sequences of runs (above), where the reference takes images only; the
targeted objective is the targeted margin, not the cross-entropy of the target (see
:func:`square`'s ``loss``). In L1 the reference projects onto the ball of radius
:math:`\epsilon (1 - 10^{-6})` and the box :math:`[0, 1]` with its own bisection; here the
projection is exact, onto the radius :math:`\epsilon` itself and the box ``[lower, upper]`` of
the budget.

**Strength on linear models** (the exact minimal distance :math:`d^*` known in closed form; 64
inputs, the defaults): Linf Square succeeds on every point at :math:`1.02\,d^*`, untargeted and
targeted towards the nearest class, on flat, sequence and image inputs, because the one-position
windows at the end of the schedule reach every coordinate of the optimal vertex. L2 Square does
not reach :math:`d^*`: its perturbation is a sum of windows carrying the fixed pattern
:math:`\eta`, which random search aligns with an arbitrary direction only roughly. Measured
success (100 points): flat ``[B, 64]`` 0% at :math:`1.05\,d^*`, 60% at 1.1, 100% at 1.2;
``[B, 16, 4]`` 3% at 1.2, 82% at 1.3, 100% at 1.5; ``[B, 8, 8, 1]`` 5% at 1.2, 89% at 1.3, 100%
at 1.5; ``[B, 4, 4, 4]`` 12% at 1.5, 100% at 2 (a 4x4 image allows no window below 3x3). L1
Square is weaker still (64 points, 1000 queries): flat ``[B, 64]`` 0% at :math:`1.05\,d^*`, 3%
at 1.2, 77% at 1.5, 100% at 2; ``[B, 8, 8, 1]`` 0% at 1.2, 12% at 1.5, 98% at 2, 100% at 3;
``[B, 16, 4]`` (a sequence) 78% at 2 (32 points); ``[B, 4, 4, 4]`` 30% at 1.2, 44% at 2, 58%
at 3 (the optimal L1 perturbation puts all its mass on one coordinate, which the nested pattern
approaches only as its windows shrink). In
AutoAttack the gradient-based members reach :math:`d^*` on such models; Square is there to expose
gradient masking.

This module holds the attack: its state, the per-norm candidates, ``init``/``step``/``finalize``
and the factory :func:`square`. The windows (size schedule, L2 pattern, placement, starts) are in
:mod:`jaxrobust.attacks._square_windows`, the input layouts (:func:`grid`) in
:mod:`jaxrobust.attacks._square_layouts`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrobust import losses as losses_lib
from jaxrobust._batch import expand, fold_in, is_success
from jaxrobust._types import Attack, Budget
from jaxrobust._validation import check_bool, check_number, check_positive_int
from jaxrobust.attacks._common import Best, Runs, apply_loss, l1_box_point, unpack_budget
from jaxrobust.attacks._square_layouts import LAYOUTS, Grid, grid
from jaxrobust.attacks._square_layouts import MAX_CHANNELS  # noqa: F401 (re-exported)
from jaxrobust.attacks._square_windows import (channel_l1, channel_norm, eta_run_window,
                                               eta_window, image_l1, image_norm, l1_start,
                                               l2_start, linf_start, random_sign,
                                               run_tables, schedule_tables, start_words,
                                               window_mask)
from jaxrobust.attacks._square_windows import (  # noqa: F401 (re-exported, as before the split)
  P_THRESHOLDS, eta, eta_run, p_schedule, run_lengths, window_sizes)

Array = jax.Array


class SquareState(NamedTuple):
  """The ``lax.scan`` carry of the Square attack."""

  x_cur: Array  # [B, ...] work dtype: the current run's accepted point, inside box and ball.
  objective: Array  # [B] float32: the objective (lower is better) at x_cur.
  success: Array  # [B] bool: x_cur is adversarial (the point no longer changes in this run).
  best: Best  # best point of the finished runs (success first, then -objective).
  keys: Array  # [B] typed PRNG keys, one per example.
  t: Array  # [] int32: steps done.


class _Config(NamedTuple):
  """Square's static configuration, chosen by :func:`square` and passed to every piece below."""

  norm: str
  queries: int
  p_init: float
  rescale_schedule: bool
  layout: str
  restarts: int
  runs: Runs  # the restarts laid end to end, one query per scan iteration
  loss_fn: Callable[..., Array]
  start: Callable[..., Array]  # linf_start, l2_start or l1_start
  candidate: Callable[..., Array]  # _linf_candidate, _l2_candidate or _l1_candidate


class _Window(NamedTuple):
  """One iteration's random windows, decoded from an example's words."""

  index: Array  # [] int32: the iteration within the run, for the schedule tables.
  size: Array  # [] int32: the window side s_k.
  first: Array  # [B, H, W, 1] bool: the window W_1 the candidate changes.
  h1: Array  # [B] int32: W_1's top row (0 for a sequence).
  w1: Array  # [B] int32: W_1's left column.
  h2: Array  # [B] int32: W_2's top row (L2 and L1 only move mass out of W_2).
  w2: Array  # [B] int32: W_2's left column.
  signs: Array  # [B, 1, 1, C]: one +-1 per channel.
  flip: Array  # [B] bool: transpose (mirror, for a sequence) the L2 or L1 pattern.


def _view(config: _Config, x: Array) -> tuple[Array, Grid]:
  """``x`` as ``[B, H, W, C]`` (a reshape) and its :class:`Grid`."""
  g = grid(x.shape[1:], config.layout)
  return x.reshape((x.shape[0],) + g.shape), g


def _tables(config: _Config, g: Grid):
  """The window sides ``[queries]`` and, for L2 and L1, the pattern constants of
  :func:`eta_window` (images) or :func:`eta_run_window` (sequences)."""
  if g.image:
    return schedule_tables(config.norm, config.queries, config.p_init, g.height, g.width,
                            config.rescale_schedule)
  return run_tables(config.norm, config.queries, config.p_init, g.width,
                     config.rescale_schedule)


def _draw(config: _Config, x: Array, keys: Array, candidate: bool, start: bool) -> Array:
  """One ``jax.random.bits`` call per example (each call costs compile time): ``[B, n]``."""
  g = grid(x.shape[1:], config.layout)
  words = (5 + g.channels if candidate else 0) + (start_words(config.norm, g) if start else 0)
  return jax.vmap(lambda k: jax.random.bits(k, (words,), jnp.uint32))(keys)


def _start(config: _Config, x: Array, eps: Array, lower: Array, upper: Array,
           bits: Array) -> Array:
  x4, g = _view(config, x)
  return config.start(x4, eps, lower, upper, bits, g).reshape(x.shape)


def _decode_window(config: _Config, g: Grid, bits: Array, j: Array, dtype) -> _Window:
  """The windows of iteration ``j`` of the current run, from ``[B, 5 + C]`` words.

  Four window corners (uniform over the ``H - s + 1`` and ``W - s + 1`` positions, up to a
  modulo bias of at most ``(H - s + 1) / 2**32``), ``C`` signs and one transpose bit. A
  sequence's windows start on its only row.
  """
  height, width, channels = g.shape
  sizes, _ = _tables(config, g)
  j = jnp.minimum(j, config.queries - 1)
  s = jnp.asarray(sizes)[j]
  span_w = (width - s + 1).astype(jnp.uint32)
  w1, w2 = (bits[:, 1] % span_w).astype(jnp.int32), (bits[:, 3] % span_w).astype(jnp.int32)
  if g.image:
    span_h = (height - s + 1).astype(jnp.uint32)
    h1, h2 = (bits[:, 0] % span_h).astype(jnp.int32), (bits[:, 2] % span_h).astype(jnp.int32)
  else:
    h1 = h2 = jnp.zeros_like(w1)
  signs = random_sign(bits[:, 4:4 + channels], dtype)  # [B, C]
  flip = (bits[:, 4 + channels] & 1) == 1  # [B]
  return _Window(index=j, size=s, first=window_mask(h1, w1, s, height, width), h1=h1, w1=w1, h2=h2,
                 w2=w2, signs=signs[:, None, None, :], flip=flip)


def _linf_candidate(config: _Config, x: Array, x_cur: Array, eps: Array, lower: Array,
                    upper: Array, bits: Array, j: Array) -> Array:
  """Linf: the window set to the vertex ``x_cur + 2 eps sign``, clipped to the ball and box."""
  (x4, g), (cur4, _) = _view(config, x), _view(config, x_cur)
  window = _decode_window(config, g, bits, j, x4.dtype)
  e = expand(eps, 4)
  moved = jnp.clip(cur4 + jnp.where(window.first, 2 * e * window.signs, 0), x4 - e, x4 + e)
  return jnp.clip(moved, lower, upper).reshape(x.shape)


def _l2_candidate(config: _Config, x: Array, x_cur: Array, eps: Array, lower: Array,
                  upper: Array, bits: Array, j: Array) -> Array:
  """L2: mass moved from ``W_2`` into ``W_1``, which takes the pattern; the norm stays ``eps``
  (see the module docstring), then clipped to the box."""
  (x4, g), (cur4, _) = _view(config, x), _view(config, x_cur)
  height, width, channels = g.shape
  window = _decode_window(config, g, bits, j, x4.dtype)
  _, constants = _tables(config, g)
  e = expand(eps, 4)
  first = window.first
  delta = cur4 - x4
  both = first | window_mask(window.h2, window.w2, window.size, height, width)
  if g.image:
    placed = eta_window(window.size, jnp.asarray(constants)[window.index], window.h1, window.w1,
                         window.flip, height, width, x4.dtype)
  else:
    placed = eta_run_window(window.size, jnp.asarray(constants)[window.index], window.w1,
                             window.flip, width, x4.dtype)
  old = jnp.where(first, delta, 0)
  direction = placed * window.signs + old / (channel_norm(old) + 1e-12)
  spare = jnp.maximum(e * e - image_norm(delta) ** 2, 0) / channels
  size = jnp.sqrt(spare + channel_norm(jnp.where(both, delta, 0)) ** 2)
  refill = direction / (channel_norm(direction) + 1e-12) * size
  delta = jnp.where(both, 0, delta) + jnp.where(first, refill, 0)
  delta = delta / (image_norm(delta) + 1e-12) * e
  return jnp.clip(x4 + delta, lower, upper).reshape(x.shape)


def _placed_pattern(config: _Config, g: Grid, window: _Window, dtype) -> Array:
  """The window's pattern ``eta(s_k, norm)`` at ``W_1`` (L2 and L1): ``[B, H, W, 1]``."""
  height, width, _ = g.shape
  _, constants = _tables(config, g)
  row = jnp.asarray(constants)[window.index]
  if g.image:
    return eta_window(window.size, row, window.h1, window.w1, window.flip, height, width, dtype,
                      config.norm)
  return eta_run_window(window.size, row, window.w1, window.flip, width, dtype, config.norm)


def _l1_candidate(config: _Config, x: Array, x_cur: Array, eps: Array, lower: Array,
                  upper: Array, bits: Array, j: Array) -> Array:
  """L1: the mass of ``W_1`` and ``W_2`` (plus the unused budget) moved into ``W_1``, which takes
  the pattern; then projected onto the L1 ball and the box (see the module docstring)."""
  (x4, g), (cur4, _) = _view(config, x), _view(config, x_cur)
  height, width, channels = g.shape
  window = _decode_window(config, g, bits, j, x4.dtype)
  e = expand(eps, 4)
  first = window.first
  delta = cur4 - x4
  both = first | window_mask(window.h2, window.w2, window.size, height, width)
  placed = _placed_pattern(config, g, window, x4.dtype)
  old = jnp.where(first, delta, 0)
  direction = placed * window.signs + old / (channel_l1(old) + 1e-12)
  # As the reference: per channel, (spare / C + mass of the two windows) * C.
  spare = jnp.maximum(e - image_l1(delta), 0)
  mass = spare + channels * channel_l1(jnp.where(both, delta, 0))
  refill = direction / (channel_l1(direction) + 1e-12) * mass
  delta = jnp.where(both, 0, delta) + jnp.where(first, refill, 0)
  return l1_box_point(delta, x4, eps, lower, upper).reshape(x.shape)


def _objective(config: _Config, logits_fn, x_new: Array, y: Array,
               target: Array | None) -> tuple[Array, Array]:
  """``(m [B], success [B])``: the objective Square lowers (the negated loss) and success."""
  logits = logits_fn(x_new)
  value = apply_loss(config.loss_fn, logits, y, target)
  return -value.astype(jnp.float32), is_success(logits, y, target)


def _init(config: _Config, logits_fn, x, y, budget: Budget, keys, target=None) -> SquareState:
  x, eps, lower, upper = unpack_budget(x, budget)
  grid(x.shape[1:], config.layout)  # layout errors at trace time, naming the example shape
  bits = _draw(config, x, fold_in(keys, 0), candidate=False, start=True)
  x0 = _start(config, x, eps, lower, upper, bits)
  value, success = _objective(config, logits_fn, x0, y, target)
  return SquareState(x0, value, success, Best.empty(x0), keys, jnp.zeros((), jnp.int32))


def _step(config: _Config, logits_fn, state: SquareState, x, y, budget: Budget,
          target=None) -> SquareState:
  x, eps, lower, upper = unpack_budget(x, budget)
  runs = config.runs
  # Step t draws from fold_in(key, t + 1) (init used fold_in(key, 0)); with restarts, the draw of
  # a run's last step also holds the words of the next run's start, after the candidate's.
  step_keys = fold_in(state.keys, state.t + 1)
  channels = grid(x.shape[1:], config.layout).channels
  bits = _draw(config, x, step_keys, candidate=True, start=False)
  proposal = config.candidate(config, x, state.x_cur, eps, lower, upper, bits,
                              runs.index(state.t))
  if config.restarts > 1:
    # The next run's start is drawn and built only on the step that needs it (a scalar
    # condition: one branch runs), not on every step. Its words follow the candidate's in one
    # draw, so the candidate words above are the same (threefry bits are prefix-consistent).
    def fresh():
      words = _draw(config, x, step_keys, candidate=True, start=True)[:, 5 + channels:]
      return _start(config, x, eps, lower, upper, words)

    proposal = jax.lax.cond(runs.at_end(state.t), fresh, lambda: proposal)
  value, success = _objective(config, logits_fn, proposal, y, target)
  # Only points not yet adversarial move, and only to a lower objective or an adversarial point.
  active = ~state.success & ~state.best.success
  accept = active & ((value < state.objective) | success)
  x_cur = jnp.where(expand(accept, x.ndim), proposal, state.x_cur)
  new_value = jnp.where(accept, value, state.objective)
  new_success = state.success | (accept & success)
  best = state.best
  if config.restarts > 1:
    # Between runs: bank the finished run's point and start the next run from its query.
    restart = runs.at_end(state.t)
    banked = best.update(state.x_cur, -state.objective, state.success)
    best = jax.tree.map(lambda a, b: jnp.where(restart, a, b), banked, best)
    x_cur = jnp.where(restart, proposal, x_cur)
    new_value = jnp.where(restart, value, new_value)
    new_success = jnp.where(restart, success, new_success)
  return SquareState(x_cur, new_value, new_success, best, state.keys, state.t + 1)


def _finalize(config: _Config, logits_fn, state: SquareState, x, y, budget: Budget,
              target=None) -> Array:
  del config, logits_fn, x, y, budget, target
  # The last run's point is scored already (Square queries every point it accepts).
  return state.best.update(state.x_cur, -state.objective, state.success).x


def _done(state: SquareState) -> Array:
  """Rows that are adversarial already: ``finalize`` returns a successful point for them.

  Either the current run's point succeeds (``finalize`` banks it: success ranks first) or a
  finished run's best did. Such a row is never moved again, so freezing it (early exit) keeps
  its verdict; only with restarts may the dense run return another adversarial point (the next
  run's start, when it is adversarial with a larger loss).
  """
  return state.success | state.best.success


def square(norm: str = "linf", *, queries: int = 5000, p_init: float = 0.8,
           loss: str | Callable[..., Array] | None = None, restarts: int = 1,
           targeted: bool = False, rescale_schedule: bool = True,
           layout: str = "auto") -> Attack:
  r"""Square attack: random search over square-window updates, one query per iteration.

  Gradient-free and score-based: each iteration proposes a candidate that differs from the
  current point only in a random :math:`s_k \times s_k` window and keeps it only if it lowers the
  objective :math:`m` (or is adversarial),

  .. math:: x^{(k+1)} = \tilde x \ \text{ if } m(\tilde x) < m(x^{(k)}) \text{ or } \tilde x
            \text{ is adversarial, else } x^{(k)}.

  Linf candidates set the window to the vertex :math:`x \pm \epsilon` (one sign per channel);
  L2 candidates move mass from a second window into the first, reshaped to the pattern
  :math:`\eta(s_k)`, keeping :math:`\|\delta\|_2 = \epsilon`; L1 candidates do the same with
  the L1 pattern :math:`\eta_1(s_k)` and the L1 mass, then project exactly onto the L1 ball and
  the box. The window covers about a fraction
  :math:`p_k` of the image, :math:`p_\text{init}` halved after each of AutoAttack's thresholds
  (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000) on the rescaled iteration
  :math:`\lfloor 10000 k / \text{queries} \rfloor` (see :func:`p_schedule` and the module
  docstring for the full update rules). Every example draws its own windows and signs from its
  own key; a point that is adversarial stops changing.

  Any input shape works; ``layout`` says what the windows are (see the module docstring): square
  windows of pixels on NHWC images ``[B, H, W, C]``, runs of contiguous positions (all channels)
  on sequences ``[B, T, C]``, runs of contiguous features on flat inputs ``[B, D]``. A 4-D input
  that looks channels-first (NCHW) is refused under ``layout="auto"``. The defaults are
  AutoAttack's (5000 queries, ``p_init = 0.8``, margin objective) except the targeted objective
  (see ``loss``).

  On linear models Linf Square reaches the exact minimal distance, L2 Square only 1.2 to 2 times
  it, L1 Square 1.5 to 3 times it (see "Strength on linear models" in the module docstring).

  Args:
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    queries: iterations per run (>= 1), one forward pass each, plus one for each run's start.
    p_init: initial window fraction, in ``(0, 1]``.
    rescale_schedule: stretch the window-size schedule over ``queries`` as if they were 10000
      (the Square reference's default); AutoAttack's suite runs Square with ``False``.
    loss: the objective as a library loss, larger meaning more adversarial (Square minimises its
      negative): ``"margin"``, ``"ce"``, ``"dlr"`` or a function (see :mod:`jaxrobust.losses`).
      Default: ``"margin"``, :math:`m = z_y - \max_{j \ne y} z_j` untargeted (as in AutoAttack)
      and :math:`m = \max_{j \ne t} z_j - z_t` targeted. AutoAttack's targeted Square minimises
      the cross-entropy of the target (``loss="ce"``), whose minimiser over the ball is in general
      not adversarial when the budget is close to the minimal distance: on ten-class linear models
      at 1.02 times the exact minimal distance towards the target, at most 1% success with
      ``"ce"`` and 100% with the margin, while both reach the same rates on the demo CNNs
      (within one point; 200 digits, Linf and L2, random and runner-up targets, 1000 queries).
    restarts: independent runs (>= 1); points broken in one run are not attacked again.
    targeted: drive the prediction to ``target`` (pass ``target=`` to :func:`jaxrobust.run`).
    layout: how ``x`` maps to windows: ``"auto"`` (by the number of axes), ``"image"``,
      ``"sequence"`` or ``"features"`` (see the module docstring and :func:`grid`).

  Returns:
    A fixed-budget :class:`jaxrobust.Attack` with ``restarts * (queries + 1) - 1`` steps.

  Raises:
    ValueError: unknown norm, loss or layout, options out of range; when the attack is traced, a
      4-D input that looks channels-first under ``layout="auto"``, or an input that is not an
      image under ``layout="image"``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> from jaxrobust.attacks._square import square
    >>> def logits_fn(x):  # rounded inputs: the input gradient is zero everywhere
    ...   total = jnp.sum(jnp.round(x * 8) / 8, axis=(1, 2, 3))
    ...   return jnp.stack([jnp.full_like(total, 0.5), total], axis=1)
    >>> x, y = jnp.full((1, 4, 4, 1), 0.05), jnp.array([0])
    >>> attack = square("linf", queries=100)
    >>> run = jax.jit(lambda x: jr.run(attack, logits_fn, x, y, jr.Budget(0.1), jax.random.key(0)))
    >>> result = run(x)
    >>> bool(result.success[0]), float(jnp.max(jnp.abs(result.x_adv - x))) <= 0.1 + 1e-7
    (True, True)

    In L1 every point stays in the L1 ball and the box (here ``[0, 1]``, which cuts the pixels at
    0.05 from going down by more than 0.05):

    >>> attack = square("l1", queries=100)
    >>> run = jax.jit(lambda x: jr.run(attack, logits_fn, x, y, jr.Budget(1.0), jax.random.key(0)))
    >>> result = run(x)
    >>> size = float(jnp.sum(jnp.abs(result.x_adv - x)))
    >>> bool(result.success[0]), size <= 1.0 + 1e-6, float(result.x_adv.min()) >= 0.0
    (True, True, True)

  References:
    Andriushchenko, Croce, Flammarion & Hein, "Square Attack: a query-efficient black-box
    adversarial attack via random search", ECCV 2020.
    Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse
    parameter-free attacks", ICML 2020 (the defaults, as part of AutoAttack).
    Croce & Hein, "Mind the box: l1-APGD for sparse adversarial attacks on image classifiers",
    ICML 2021 (Square in L1, a member of AutoAttack's standard version in L1).
  """
  if not isinstance(norm, str) or norm not in ("linf", "l2", "l1"):
    raise ValueError(f"square supports norm 'linf', 'l2' or 'l1', got {norm!r}.")
  queries = check_positive_int("queries", queries)
  restarts = check_positive_int("restarts", restarts)
  p_init = check_number("p_init", p_init, low=0.0, high=1.0, low_open=True)
  targeted = check_bool("targeted", targeted)
  if not isinstance(layout, str) or layout not in LAYOUTS:
    raise ValueError(f"square: unknown layout {layout!r}; supported: "
                     f"{', '.join(map(repr, LAYOUTS))}.")
  if loss is None:
    loss = "margin"
  runs = Runs(queries, restarts)  # a run's queries, then the query of the next run's start
  config = _Config(
      norm=norm, queries=queries, p_init=p_init, rescale_schedule=rescale_schedule,
      layout=layout, restarts=restarts, runs=runs, loss_fn=losses_lib.resolve(loss, targeted),
      start={"linf": linf_start, "l2": l2_start, "l1": l1_start}[norm],
      candidate={"linf": _linf_candidate, "l2": _l2_candidate, "l1": _l1_candidate}[norm])
  name = f"square-{norm}-{queries}x{restarts}-{loss if isinstance(loss, str) else 'custom'}"
  name += "-targeted" if targeted else ""
  name += "" if layout == "auto" else f"-{layout}"
  return Attack(init=functools.partial(_init, config), step=functools.partial(_step, config),
                finalize=functools.partial(_finalize, config), num_steps=runs.num_steps,
                norm=norm, targeted=targeted, minimum_norm=False, name=name, done=_done)
