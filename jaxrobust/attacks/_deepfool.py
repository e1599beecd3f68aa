r"""DeepFool (Moosavi-Dezfooli, Fawzi & Frossard, 2016): a minimum-norm attack under L2 and Linf.

Each iteration replaces the classifier by its first-order expansion around the current iterate
:math:`x_t` and moves to the nearest boundary of that linear model. For a candidate class
:math:`k \ne y`, with

.. math::
   f_k = z_k(x_t) - z_y(x_t), \qquad w_k = \nabla_x z_k(x_t) - \nabla_x z_y(x_t),

the linearised boundary between ``y`` and ``k`` is at distance :math:`|f_k| / \|w_k\|_q` in the
attack norm (:math:`q` the dual exponent: L2 -> L2, Linf -> L1). The closest candidate
:math:`\hat k` is taken and its minimal step accumulated,

.. math::
   s_t = (1 + \xi)\,\frac{|f_{\hat k}|}{\|w_{\hat k}\|_q} + \xi\,\|r_t\|_p, \qquad
   r_{t+1} = r_t + s_t\, \frac{w_{\hat k}}{\|w_{\hat k}\|_2} \;\;(\ell_2), \qquad
   r_{t+1} = r_t + s_t\, \operatorname{sign}(w_{\hat k}) \;\;(\ell_\infty),

a step of norm :math:`s_t` that lands a relative :math:`\xi = 10^{-4}` past the linearised
boundary rather than on it. The crossing term is relative, in input units: the step to the
boundary, :math:`|f| / \|w\|_q`, does not change when the logits are multiplied by a constant,
and neither does :math:`s_t`, so the attack's answer does not depend on the scale of the logits
(the decision boundary does not). An absolute term in logit units, :math:`(|f| + \xi) / \|w\|_q`
as in common implementations, would: with the logits of a linear model multiplied by
:math:`10^{-6}` it moves every point :math:`\xi / \|w\|_q` past the boundary, a median 110 (L2)
and 140 (Linf) times the exact minimum on ``tests/test_ground_truth_min_norm.py``'s problems
instead of 1.0201 (the overshoot). The term :math:`\xi \|r_t\|_p` keeps an iterate that float
rounding left just short of the boundary (:math:`f \approx 0`) from stalling there. The iterate
is the overshot total, :math:`x_t = \Pi_{[l, u]}\big(x + (1 + \eta)\, r_t\big)`, as in the paper
(the overshoot scales the whole accumulated perturbation, not only the last step).

Non-finite entries of :math:`w_k` (a model whose logits are finite but whose input gradient is
not, e.g. through a ``sqrt`` of 0) are replaced by 0, so the attack works with the finite part of
the gradient and no NaN reaches an iterate.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrobust import projections
from jaxrobust._batch import (expand, finite_or_zero, is_success, like_batch, one_hot_mask,
                              rows_like)
from jaxrobust._types import Attack, Budget
from jaxrobust._validation import check_number, check_positive_int
from jaxrobust.attacks._common import MinNormBest, score_last_iterate, unpack_budget

Array = jax.Array

SUPPORTED_NORMS = ("l2", "linf")
CROSSING = 1e-4
"""How far past the linearised boundary a step lands, relative to the step (so scale-free)."""


class DeepFoolState(NamedTuple):
  """The ``lax.scan`` carry of DeepFool."""

  r_total: Array  # [B, ...] work dtype: sum of the minimal steps so far, before the overshoot.
  classes: Array  # [B, K] int32: candidate classes, the top K by clean logit other than y.
  best: MinNormBest  # smallest successful point seen, per example.
  limit: Array  # [B] work dtype: the budget's eps, for ``done`` (``inf``: no bound).
  # [B] bool: the last iterate scored was adversarial, so r_total no longer moves and no later
  # step (nor finalize) changes anything on the row.
  settled: Array


def _done(state: DeepFoolState) -> Array:
  """Rows whose smallest successful point already lies inside a finite eps-ball, or whose last
  iterate was adversarial (``settled``), at any eps.

  In the first case ``finalize`` returns that point (the last iterate it scores can only make it
  smaller), and no later step can take it away (:meth:`MinNormBest.update` only shrinks it), so
  the verdict at this eps is final. In the second the iterate no longer moves: every later step
  scores the same point again and adds nothing to ``r_total``, so the row's state, and what
  ``finalize`` returns, are those of the full run (the attack is ``done_unbounded``: early exit
  runs at ``eps = inf`` too, and a row stops costing once its iterate is adversarial).
  """
  return state.best.within(state.limit) | state.settled


def _candidates(logits: Array, y: Array, count: int) -> Array:
  """``[B, count]``: the classes with the largest clean logits, the true class excluded."""
  others = jnp.where(one_hot_mask(y, logits.shape[1]), -jnp.inf, logits)
  return jax.lax.top_k(others, count)[1].astype(jnp.int32)


def _minimal_step(logits: Array, pullback, classes: Array, y: Array, travelled: Array,
                  norm: str, dtype: jnp.dtype) -> Array:
  """The step ``[B, ...]`` a relative ``CROSSING`` past the nearest linearised boundary.

  ``pullback`` is the VJP of ``logits_fn`` at the iterate. One backward pass per candidate ``k``
  (vectorised with ``vmap``) with cotangent ``onehot(k) - onehot(y)`` gives ``w_k`` for every
  example at once, since examples are independent. ``travelled [B]`` is ``||r_t||_p``, the norm
  of the accumulated steps. The arithmetic runs in ``dtype``.
  """
  num_classes = logits.shape[1]
  diff = (one_hot_mask(classes, num_classes).astype(dtype)
          - one_hot_mask(y, num_classes).astype(dtype)[:, None, :])  # [B, K, C]
  f = jnp.sum(diff * logits.astype(dtype)[:, None, :], axis=-1).T  # [K, B]
  (w,) = jax.vmap(pullback)(jnp.moveaxis(diff, 1, 0).astype(logits.dtype))  # [K, B, ...]
  shape = w.shape[1:]
  w = w.reshape(w.shape[0], w.shape[1], -1).astype(dtype)  # [K, B, D]
  w = finite_or_zero(w)  # the finite part of a NaN/Inf gradient
  scale = projections.dual_norm(w, norm)  # [K, B]: ||w_k||_q
  movable = scale > 0
  safe = jnp.where(movable, scale, 1.0)
  distance = jnp.where(movable, jnp.abs(f) / safe, jnp.inf)
  distance = jnp.where(jnp.isnan(distance), jnp.inf, distance)
  nearest = jnp.argmin(distance, axis=0).astype(jnp.int32)  # [B]
  chosen = one_hot_mask(nearest, w.shape[0]).T  # [K, B]
  pick = lambda v: jnp.sum(jnp.where(chosen, v, 0.0), axis=0)
  w_hat = jnp.sum(jnp.where(chosen[:, :, None], w, 0.0), axis=0)  # [B, D]
  # Both terms are in input units: the step does not depend on the scale of the logits.
  size = jnp.where(pick(movable.astype(dtype)) > 0,
                   (1 + CROSSING) * pick(distance) + CROSSING * travelled, 0.0)  # [B]
  if norm == "l2":
    step = (size / pick(safe))[:, None] * w_hat  # safe = ||w||_2 for L2
  else:
    step = size[:, None] * jnp.sign(w_hat)
  finite = jnp.all(jnp.isfinite(step), axis=1, keepdims=True)  # never let NaN/Inf into r_total
  return jnp.where(finite, step, 0.0).reshape(shape)


def deepfool(norm: str = "l2", *, steps: int = 50, overshoot: float = 0.02,
             candidates: int = 10) -> Attack:
  r"""DeepFool: the smallest perturbation that crosses the linearised decision boundary.

  A minimum-norm attack (``minimum_norm=True``): it searches for the smallest adversarial
  perturbation rather than for a success within a fixed budget. Each of ``steps`` iterations
  linearises the classifier at the current iterate for the ``candidates`` classes with the largest
  clean logits (the true class excluded) and steps to the nearest linearised boundary,

  .. math::
     \hat k = \arg\min_k \frac{|f_k|}{\|w_k\|_q}, \qquad
     r_{t+1} = r_t + \Big((1 + \xi)\frac{|f_{\hat k}|}{\|w_{\hat k}\|_q} + \xi \|r_t\|_p\Big)
               d_p(w_{\hat k}), \qquad
     x_{t+1} = \Pi_{[l, u]}\big(x + (1 + \eta)\, r_{t+1}\big),

  with :math:`f_k = z_k - z_y`, :math:`w_k = \nabla z_k - \nabla z_y`, :math:`q` the dual exponent
  (L2 -> 2, Linf -> 1), :math:`d_2(w) = w / \|w\|_2`, :math:`d_\infty(w) = \operatorname{sign}(w)`,
  :math:`\xi = 10^{-4}` (a relative crossing, so the result does not depend on the scale of the
  logits) and :math:`\eta` the overshoot. On a linear model the first step is exact: with every
  class a candidate, the returned norm is :math:`(1 + \eta)(1 + \xi)\, d^*`, with :math:`d^*` the
  minimal adversarial distance (when the box does not bind).

  An example stops moving as soon as its iterate is adversarial; points misclassified on the
  clean input are returned unchanged. Every iterate is scored and the smallest successful one
  returned. ``budget.eps`` is an optional upper bound (``inf`` for none): if the smallest
  adversarial point found lies outside the eps-ball, the last iterate projected onto the ball
  (and the box) is returned instead, so the result never leaves the ball and is scored honestly
  (usually as a failure, with norm ``inf``). At a finite eps the attack declares a row ``done``
  once its smallest adversarial point lies inside the ball, so with early exit
  (:func:`jaxrobust.run`'s default) that row stops costing model evaluations; since the iterate
  stops moving at its first success anyway, the point returned is the same as without early
  exit. A row whose iterate is adversarial is ``done`` at any eps, ``inf`` included: its iterate
  no longer moves, so with early exit it stops costing model evaluations and the result is the
  full run's.

  Each iteration costs one forward pass and ``min(candidates, C - 1)`` backward passes (vectorised
  with ``vmap``), with memory proportional to ``candidates * B * D``.

  Args:
    norm: ``"l2"`` or ``"linf"``.
    steps: iterations (>= 1); most points are done after a handful.
    overshoot: :math:`\eta \ge 0`, the factor by which the accumulated perturbation is scaled
      past the boundary, ``(1 + overshoot) * r``.
    candidates: how many classes to linearise, the top ones by clean logit other than the true
      class (>= 1; capped at ``C - 1``). ``C - 1`` considers every class.

  Returns:
    A :class:`jaxrobust.Attack` with ``minimum_norm=True``, for :func:`jaxrobust.run` (where
    ``result.norm`` is the size of the perturbation found, ``inf`` if none) or
    :func:`jaxrobust.robustness_curve` (one run gives the whole curve).

  Raises:
    ValueError: for a norm other than ``"l2"``/``"linf"``, ``steps < 1``, a negative or
      non-finite overshoot, or ``candidates < 1``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> w = jnp.array([[1.0, -1.0], [-1.0, 1.0]])  # two classes, logits z = x @ w
    >>> logits_fn = lambda x: x @ w
    >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])  # margin 0.4, L2 distance 0.4 / sqrt(8)
    >>> result = jr.run(jr.attacks.deepfool("l2"), logits_fn, x, y, jr.Budget(jnp.inf),
    ...                 jax.random.key(0))
    >>> bool(result.success[0]), round(float(result.norm[0] / (0.4 / 8 ** 0.5)), 3)
    (True, 1.02)

  References:
    Moosavi-Dezfooli, Fawzi & Frossard, "DeepFool: a simple and accurate method to fool deep
    neural networks", CVPR 2016.
  """
  if norm not in SUPPORTED_NORMS:
    raise ValueError(f"deepfool supports norm 'l2' or 'linf', got {norm!r}.")
  steps = check_positive_int("steps", steps)
  candidates = check_positive_int("candidates", candidates)
  scale = 1.0 + check_number("overshoot", overshoot, low=0.0)

  def iterate(x, r_total, lower, upper):
    return jnp.clip(x + scale * r_total, lower, upper)

  def init(logits_fn, x, y, budget: Budget, keys, target=None):
    del keys, target
    x, eps, _, _ = unpack_budget(x, budget)
    logits = logits_fn(x)
    count = min(candidates, logits.shape[1] - 1)
    # like_batch: an eps broadcast from a scalar carries x's batch sharding, as best.norm does.
    limit = like_batch(eps, x)
    return DeepFoolState(jnp.zeros_like(x), _candidates(logits, y, count), MinNormBest.empty(x),
                         limit, rows_like(x, False, bool))

  def step(logits_fn, state: DeepFoolState, x, y, budget: Budget, target=None):
    del target
    x, _, lower, upper = unpack_budget(x, budget)
    x_t = iterate(x, state.r_total, lower, upper)
    logits, pullback = jax.vjp(logits_fn, x_t)
    success = is_success(logits, y, None)
    best = state.best.update(x_t, projections.norm(x_t - x, norm), success)
    travelled = projections.norm(state.r_total, norm)
    r_step = _minimal_step(logits, pullback, state.classes, y, travelled, norm, x.dtype)
    r_total = state.r_total + jnp.where(expand(success, x.ndim), 0.0, r_step)  # adversarial: frozen
    return DeepFoolState(r_total, state.classes, best, state.limit, success)

  def finalize(logits_fn, state: DeepFoolState, x, y, budget: Budget, target=None):
    del target
    x, eps, lower, upper = unpack_budget(x, budget)
    x_t = iterate(x, state.r_total, lower, upper)
    best = score_last_iterate(state.best, logits_fn, x_t, y, None,
                              lambda _: projections.norm(x_t - x, norm))
    found = jnp.isfinite(best.norm) & (best.norm <= eps)  # a success, inside the ball
    inside = jnp.clip(x + projections.project(x_t - x, eps, norm), lower, upper)
    return jnp.where(expand(found, x.ndim), best.x, inside)

  return Attack(init=init, step=step, finalize=finalize, num_steps=steps, norm=norm,
                targeted=False, minimum_norm=True,
                name=f"deepfool-{norm}-{steps}-overshoot{overshoot:g}-top{candidates}", done=_done,
                done_unbounded=True)
