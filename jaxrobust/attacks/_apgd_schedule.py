r"""APGD's step-size schedule and its per-norm steps, which :func:`jaxrobust.attacks._apgd.apgd`
chooses once, at factory time, with the state and static configuration they share.

**Linf/L2.** The checkpoints (:func:`checkpoints`) are :math:`w_j = \lceil p_j N \rceil` for
``N = steps``, :math:`p_1 = 0.22`, :math:`p_{j+1} = p_j + \max(p_j - p_{j-1} - 0.03, 0.06)`, in
the reference's rounding. At :math:`w_j` (:func:`momentum_checkpoint`) an example halves its
step size :math:`\eta` and restarts from its best-loss point when at most :math:`\rho\,(w_j -
w_{j-1})` of the window's steps increased the loss, or when neither :math:`\eta` nor the best loss
changed since :math:`w_{j-1}`. The step (:func:`momentum_update`) is

.. math::
   z_{k+1} = P\big(x_k + \eta_k\, d(\nabla L(x_k))\big), \qquad
   x_{k+1} = P\big(x_k + \alpha (z_{k+1} - x_k) + (1 - \alpha)(x_k - x_{k-1})\big),

with :math:`P` the projection onto the ball and the box, :math:`d(g)` the steepest-ascent
direction (:math:`\operatorname{sign}(g)` for Linf, :math:`g / \|g\|_2` for L2) and
:math:`\alpha` the ``momentum`` (1 at a run's first step).

**L1.** Every ``max(int(0.04 N), 1)`` iterations (:func:`l1_checkpoints`,
:func:`l1_checkpoint`) the support :math:`m` of the best point's perturbation sets the number of
moved coordinates :math:`k = \lceil m / 1.5 \rceil` (:func:`l1_coordinates`; fewer for a run that
stalled, :func:`l1_fewer_coordinates`) and the step size is reset to :math:`\epsilon` with a
restart when :math:`m` fell below 0.95 of its previous value, divided by 1.5 otherwise, in
:math:`[\epsilon / 10, \epsilon]`. The step (:func:`l1_update`) moves :math:`\eta` of L1 mass
evenly over the :math:`k` largest :math:`|g_i|` and projects exactly onto the L1 ball and the
box.

The algorithm, its references and the differences from the reference implementation are in
:mod:`jaxrobust.attacks._apgd`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._batch import expand, one_hot_mask
from jaxrobust.attacks._ascent import direction
from jaxrobust.attacks._common import Best, Runs, l1_box_point
from jaxrobust.attacks._gradient_attack import project_into_budget

Array = jax.Array

INITIAL_STEP = {"linf": 2.0, "l2": 2.0, "l1": 1.0}
"""The first step size of a run, as a multiple of eps."""

L1_INITIAL_SPARSITY = 0.2
L1_STEP_DIVISOR = 1.5
L1_MIN_STEP_FRACTION = 0.1
L1_SPARSITY_DROP = 0.95


def checkpoints(steps: int) -> tuple[int, ...]:
  r"""The iterations after which Linf/L2 APGD may halve its step size.

  The reference implementation's rounding of :math:`w_j = \lceil p_j N \rceil`,
  :math:`p_1 = 0.22`, :math:`p_{j+1} = p_j + \max(p_j - p_{j-1} - 0.03, 0.06)`: the first window
  has ``max(int(0.22 N), 1)`` iterations and each next one ``max(int(0.03 N), 1)`` fewer, but at
  least ``max(int(0.06 N), 1)``.

  Args:
    steps: iterations per run, ``N``.

  Returns:
    The checkpoints ``w_1 < w_2 < ... <= N``.

  Examples:
    >>> checkpoints(100)
    (22, 41, 57, 70, 80, 87, 93, 99)

  References:
    Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse
    parameter-free attacks", ICML 2020, Section 3.
  """
  length = max(int(0.22 * steps), 1)
  shortest = max(int(0.06 * steps), 1)
  decrease = max(int(0.03 * steps), 1)
  out, position = [], length
  while position <= steps:
    out.append(position)
    length = max(length - decrease, shortest)
    position += length
  return tuple(out)


def l1_checkpoints(steps: int) -> tuple[int, ...]:
  """The iterations after which L1 APGD adapts its sparsity and step size.

  Examples:
    >>> l1_checkpoints(100)[:5]
    (4, 8, 12, 16, 20)
  """
  period = max(int(0.04 * steps), 1)
  return tuple(range(period, steps + 1, period))


class APGDState(NamedTuple):
  """The ``lax.scan`` carry of APGD. Fields marked *run* are reset at the start of each run."""

  x_adv: Array  # [B, ...] work dtype (x's, float32 at least): the point the next step evaluates.
  x_prev: Array  # [B, ...] work dtype: the iterate before x_adv (for the momentum), run.
  x_best: Array  # [B, ...] work dtype: the run's highest-loss point, run.
  grad_best: Array  # [B, ...] work dtype: the gradient at x_best, run.
  loss_best: Array  # [B] float32: the loss at x_best, run.
  loss_prev: Array  # [B] float32: the loss of the last evaluated point, run.
  loss_best_at_check: Array  # [B] float32: loss_best at the last checkpoint, run.
  halved_at_check: Array  # [B] bool: the step was halved at the last checkpoint, run.
  increases: Array  # [B] int32: steps that increased the loss since the last checkpoint, run.
  step_size: Array  # [B] work dtype: the step size eta, in input units, run.
  coordinates: Array  # [B] int32: L1 only, how many coordinates a step moves, run.
  support_at_check: Array  # [B] float32: L1 only, ||x_best - x||_0 at the last checkpoint, run.
  best: Best  # the best point seen in any run (success first, then loss).
  targets: Array | None  # [B, n_target_classes] int32 for APGD-T (in run order), else None.
  keys: Array  # [B] typed PRNG keys, one per example.
  t: Array  # [] int32: evaluations done.


def _l1_direction(grad: Array, coordinates: Array) -> Array:
  """``sign`` of the gradient on its ``coordinates`` largest-magnitude entries, unit L1 norm.

  The threshold is the ascending-sorted ``|g|`` at index ``D - coordinates``, looked up with a
  one-hot mask (no gather); ties at the threshold are all kept, as in the reference.
  """
  g = grad.reshape(grad.shape[0], -1)
  d = g.shape[1]
  magnitude = jnp.abs(g)
  ordered = jnp.sort(magnitude, axis=1)
  index = jnp.clip(d - coordinates, 0, d - 1).astype(jnp.int32)
  threshold = jnp.sum(jnp.where(one_hot_mask(index, d), ordered, 0.0), axis=1, keepdims=True)
  s = jnp.where(magnitude >= threshold, jnp.sign(g), 0.0)
  s = s / (jnp.sum(jnp.abs(s), axis=1, keepdims=True) + 1e-10)
  return s.reshape(grad.shape)


def l1_initial_coordinates(size: int) -> int:
  """The coordinates the first L1 steps of a run move: the reference's ``D - int(0.8 D)`` for
  ``D`` input coordinates (the top 20%, rounded up; float32 arithmetic as in the reference).

  Examples:
    >>> l1_initial_coordinates(64), l1_initial_coordinates(3072)
    (13, 615)
  """
  return size - int(np.float32(1.0 - np.float32(L1_INITIAL_SPARSITY)) * np.float32(size))


def l1_coordinates(support: Array) -> Array:
  r"""How many coordinates an L1-APGD step moves after a check, from the best point's support.

  The reference's :math:`\lceil m / 1.5 \rceil` for a support of :math:`m` coordinates (from its
  sparsity :math:`m / (1.5 D)`), and at least one.

  Examples:
    >>> import jax.numpy as jnp
    >>> l1_coordinates(jnp.array([0, 1, 2, 3, 4, 5, 64], jnp.int32)).tolist()
    [1, 1, 2, 2, 3, 4, 43]
  """
  support = support.astype(jnp.int32)
  return jnp.maximum((2 * support + 2) // 3, 1)  # ceil(m / 1.5) in integers


def l1_fewer_coordinates(coordinates: Array) -> Array:
  r"""The count a stalled L1 run moves next: :math:`\lceil k / 1.5 \rceil`, but at least one
  fewer than :math:`k` (so 2 becomes 1), and at least one.

  Examples:
    >>> import jax.numpy as jnp
    >>> l1_fewer_coordinates(jnp.array([1, 2, 3, 6, 13], jnp.int32)).tolist()
    [1, 1, 2, 4, 9]
  """
  return jnp.maximum(jnp.minimum(l1_coordinates(coordinates), coordinates - 1), 1)


LARGE_EPS_FACTORS = (3.0, 2.0, 1.0)
"""AutoAttack's ``use_largereps`` stages: eps multiplied by these factors, in this order."""
LARGE_EPS_FRACTIONS = (0.3, 0.3)
"""The fractions of ``steps`` of every stage but the last, rounded up (the last has the rest)."""


class Stages(NamedTuple):
  r"""A run's eps stages, as static tables over the ``period`` scan iterations of one run.

  One stage (the plain attack) or AutoAttack's ``use_largereps`` schedule (:func:`stages`).
  Stage :math:`s` makes :math:`n_s` updates at :math:`c_s \epsilon`, i.e. :math:`n_s + 1`
  evaluations; a stage after the first starts from the previous stage's best-loss point
  projected onto the :math:`c_s \epsilon` L1 ball and the box.
  """

  factor: np.ndarray  # [period] float: the eps factor of each iteration's stage
  next_factor: np.ndarray  # [period] float: the factor of the stage that follows (at its end)
  first: np.ndarray  # [period] bool: the iteration evaluates its stage's first point
  end: np.ndarray  # [period] bool: the last evaluation of a stage that is not the last one
  scored: np.ndarray  # [period] bool: the iteration is in the last stage (at eps): scored
  lengths: tuple[int, ...]  # updates per stage


def stages(steps: int, large_eps: bool) -> Stages:
  r"""The stages of one run of ``steps`` updates: one stage, or AutoAttack's ``use_largereps``.

  With ``large_eps`` the run is three stages at :math:`3\epsilon, 2\epsilon, \epsilon` of
  ``ceil(0.3 N)``, ``ceil(0.3 N)`` and the remaining updates (the reference's arithmetic), each
  with its own start, so a run evaluates ``steps + 3`` points.

  Examples:
    >>> s = stages(10, True)
    >>> s.lengths, s.factor.tolist()
    ((3, 3, 4), [3.0, 3.0, 3.0, 3.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    >>> np.flatnonzero(s.first).tolist(), np.flatnonzero(s.end).tolist()
    ([0, 4, 8], [3, 7])
    >>> stages(3, False).lengths
    (3,)
  """
  if large_eps:
    lengths = [math.ceil(f * steps) for f in LARGE_EPS_FRACTIONS]
    lengths.append(steps - sum(lengths))
    if lengths[-1] < 0:
      raise ValueError(f"large_eps needs steps >= 2 (three stages of ceil(0.3 steps), "
                       f"ceil(0.3 steps) and the rest); got steps={steps}.")
    factors = LARGE_EPS_FACTORS
  else:
    lengths, factors = [steps], (1.0,)
  period = sum(lengths) + len(lengths)
  factor, next_factor = np.ones(period), np.ones(period)
  first, end, scored = (np.zeros(period, bool) for _ in range(3))
  start = 0
  for s, (n, c) in enumerate(zip(lengths, factors)):
    factor[start:start + n + 1] = c
    first[start] = True
    last = s == len(lengths) - 1
    if last:
      scored[start:start + n + 1] = True
    else:
      end[start + n] = True
      next_factor[start + n] = factors[s + 1]
    start += n + 1
  return Stages(factor, next_factor, first, end, scored, tuple(lengths))


class APGDConfig(NamedTuple):
  """APGD's static configuration, chosen by :func:`apgd` and passed to every piece below."""

  norm: str
  name: str
  loss: str | Callable[..., Array]  # as given (for the class-count check)
  loss_name: str
  loss_fn: Callable[..., Array]
  targeted: bool
  multi: bool  # APGD-T: n_target_classes runs of targeted losses, untargeted success
  n_target_classes: int | None
  targets: str  # APGD-T's target order: "logits" (AutoAttack) or "malt"
  malt_candidates: int  # classes MALT scores (the largest clean logits other than y)
  restarts: int
  runs: Runs  # all runs (restarts, times the targets of APGD-T) laid end to end
  table: np.ndarray  # [steps + 1] int32: window length at each checkpoint, 0 elsewhere
  initial_step: float  # first step of a run, as a multiple of eps
  rho: float
  momentum: float
  checkpoint: Callable[..., "_Checkpoint"]  # momentum_checkpoint or l1_checkpoint
  update: Callable[..., Array]  # momentum_update or l1_update
  stages: "Stages"  # the eps stages of a run (one stage unless large_eps)

  @property
  def large_eps(self) -> bool:
    """AutoAttack's ``use_largereps`` (L1): the run is stages at 3, 2 and 1 times eps."""
    return len(self.stages.lengths) > 1


class _Checkpoint(NamedTuple):
  """What the step-size schedule decides at one iteration (fields as in :class:`APGDState`)."""

  restart: Array  # [B] bool: restart from the run's best-loss point before stepping.
  step_size: Array
  halved_at_check: Array
  loss_best_at_check: Array
  increases: Array
  coordinates: Array
  support_at_check: Array


def momentum_checkpoint(config: APGDConfig, state: APGDState, x: Array, eps: Array, first: Array,
                         at_check: Array, window: Array, loss_value: Array, loss_best: Array,
                         x_best: Array, increases: Array, step_size: Array) -> _Checkpoint:
  """Linf/L2: halve the step and restart from the best point when the run oscillates (at most
  ``rho`` of the window's steps increased the loss) or stalls (no halving and no improvement
  since the previous checkpoint)."""
  del x, eps, x_best
  halved_before = jnp.where(first, True, state.halved_at_check)
  loss_best_before = jnp.where(first, loss_value, state.loss_best_at_check)
  oscillating = increases.astype(jnp.float32) <= config.rho * window.astype(jnp.float32)
  stalled = ~halved_before & (loss_best_before >= loss_best)
  halve = oscillating | stalled
  restart = at_check & halve
  return _Checkpoint(
      restart=restart, step_size=jnp.where(restart, step_size / 2, step_size),
      halved_at_check=jnp.where(at_check, halve, halved_before),
      loss_best_at_check=jnp.where(at_check, loss_best, loss_best_before),
      increases=jnp.where(at_check, 0, increases), coordinates=state.coordinates,
      support_at_check=state.support_at_check)


def l1_checkpoint(config: APGDConfig, state: APGDState, x: Array, eps: Array, first: Array,
                   at_check: Array, window: Array, loss_value: Array, loss_best: Array,
                   x_best: Array, increases: Array, step_size: Array) -> _Checkpoint:
  """L1: adapt the sparsity to the best point's support and the step size to its change;
  restart from the best point when the support shrank (see the module docstring)."""
  del window
  size = math.prod(x.shape[1:])
  coordinates = jnp.where(first, l1_initial_coordinates(size), state.coordinates)
  support_old = jnp.where(first, float(size), state.support_at_check)
  support = jnp.sum((x_best != x).reshape(x.shape[0], -1), axis=1, dtype=jnp.int32)
  shrunk = support.astype(jnp.float32) < L1_SPARSITY_DROP * support_old
  restart = at_check & shrunk
  full = config.initial_step * eps
  adapted = jnp.clip(jnp.where(shrunk, full, step_size / L1_STEP_DIVISOR),
                     full * L1_MIN_STEP_FRACTION, full)
  step_size = jnp.where(at_check, adapted, step_size)
  # A run whose best loss did not improve since the last check sits at a fixed point of the
  # step and the projection (every moved coordinate gains the same mass, which the L1
  # projection takes back evenly): it moves fewer coordinates from then on.
  loss_best_before = jnp.where(first, loss_value, state.loss_best_at_check)
  stalled = loss_best <= loss_best_before
  fewer = jnp.minimum(l1_coordinates(support),
                      jnp.where(stalled, l1_fewer_coordinates(coordinates), size))
  return _Checkpoint(
      restart=restart, step_size=step_size, halved_at_check=state.halved_at_check,
      loss_best_at_check=jnp.where(at_check, loss_best, loss_best_before), increases=increases,
      coordinates=jnp.where(at_check, fewer, coordinates),
      support_at_check=jnp.where(at_check, support.astype(jnp.float32), support_old))


def momentum_update(config: APGDConfig, x: Array, x_cur: Array, x_prev: Array, g: Array,
                     checkpoint: _Checkpoint, first: Array, eps: Array, lower: Array,
                     upper: Array) -> Array:
  """Linf/L2: the projected steepest step, then the momentum combination with the previous
  iterate (no momentum at a run's first step)."""
  eta = expand(checkpoint.step_size, x.ndim)
  z = project_into_budget(x, x_cur + eta * direction(g, config.norm, x_cur, lower, upper, 1.0),
                          eps, lower, upper, config.norm)
  a = jnp.where(first, jnp.ones((), x.dtype), jnp.asarray(config.momentum, x.dtype))
  return project_into_budget(x, x_cur + a * (z - x_cur) + (1 - a) * (x_cur - x_prev), eps,
                             lower, upper, config.norm)


def l1_update(config: APGDConfig, x: Array, x_cur: Array, x_prev: Array, g: Array,
               checkpoint: _Checkpoint, first: Array, eps: Array, lower: Array,
               upper: Array) -> Array:
  """L1: step mass over the top coordinates, then the exact L1-ball-and-box projection."""
  del config, x_prev, first
  eta = expand(checkpoint.step_size, x.ndim)
  moved = x_cur + eta * _l1_direction(g, checkpoint.coordinates)
  return l1_box_point(moved - x, x, eps, lower, upper)
