r"""The Fast Adaptive Boundary attack (FAB; Croce & Hein, 2020) under Linf, L2 and L1, with FAB-T.

FAB is a minimum-norm attack. At the iterate :math:`x_k` (starting at the clean point
:math:`x_0`) it linearises the decision boundary between the true class :math:`y` and a class
:math:`j`,

.. math::
   f_j(x) = z_j(x) - z_y(x), \qquad
   \pi_j = \{z : f_j(x_k) + \langle \nabla f_j(x_k), z - x_k\rangle = 0\},

and picks the closest one, :math:`\hat j = \arg\min_{j \ne y} |f_j(x_k)| / \|\nabla f_j(x_k)\|_q`
(:math:`q` the dual exponent of the attack norm :math:`p`; targeted: :math:`\hat j = t`). It
projects both the iterate and the original point onto :math:`\pi_{\hat j} \cap [l, u]`,
:math:`\delta_k = P_p(x_k) - x_k` and :math:`\delta_0 = P_p(x_0) - x_0`, exactly in the attack
norm (:mod:`jaxrobust.attacks._fab_projections`), and takes the biased, extrapolated combination

.. math::
   x_{k+1} = \Pi_{[l, u]}\big((1 - \alpha)(x_k + \eta\delta_k) + \alpha (x_0 + \eta\delta_0)\big),
   \qquad \alpha = \min\Big(\frac{\|\delta_k\|_p}{\|\delta_k\|_p + \|\delta_0\|_p},
                            \alpha_{\max}\Big),

which stays close to :math:`x_0` while pushing across the boundary (overshoot :math:`\eta`). If
:math:`x_{k+1}` is adversarial it is recorded when it is the smallest adversarial point so far,
and the backward step :math:`x_{k+1} \leftarrow x_0 + \beta (x_{k+1} - x_0)` pulls it back
towards the original point, from where the next iteration searches for a closer boundary point.

Each iteration costs one forward pass to linearise, the backward passes for the gradients
(``C - 1`` vector-Jacobian products for untargeted FAB, computed ``class_chunk`` classes at a time
so that memory is :math:`O(\text{chunk} \cdot B \cdot D)`; one for a targeted FAB) and one forward
pass to score the new iterate.

The class choice compares :math:`|f_j| / \|\nabla f_j\|_q` with no constant added (the
reference adds :math:`10^{-12}` to the denominator, a constant in logit units), so the attack
does not depend on the scale of the logits; a class with a zero gradient is never chosen.
Non-finite gradient entries (finite logits, but a ``sqrt`` of 0 inside the model) are replaced by
0, so the attack works with the finite part of the gradient and no NaN reaches an iterate.
Arithmetic runs in the input's float dtype (float32 at least; float64 under
``jax_enable_x64``).

Restarts (random starts at radius :math:`\tfrac12 \min(\|\delta^*\|_p, \epsilon)` around
:math:`x_0`, with :math:`\delta^*` the smallest adversarial perturbation so far) and, for FAB-T,
the target classes are laid end to end as segments of ``steps`` iterations in one fixed-length
``lax.scan``. The smallest adversarial point over all segments is returned when it lies in the
eps-ball; ``budget.eps`` never steers the search except through the random starts' radius.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import projections
from jaxrobust._batch import (expand, finite_or_zero, fold_in, is_success, one_hot_mask, predict,
                              rows_like)
from jaxrobust._types import NORMS, Attack, Budget
from jaxrobust._validation import check_bool, check_number, check_positive_int
from jaxrobust.attacks._common import MinNormBest, unpack_budget
from jaxrobust.attacks._fab_projections import project_hyperplane_box

Array = jax.Array

RESTART_RADIUS = {"linf": 0.3, "l2": 1.0, "l1": 5.0}
"""The reference implementation's default eps per norm (for a [0, 1] box), which sets the radius
of random starts when ``budget.eps`` is ``inf`` and no adversarial point is known yet; scaled by
``upper - lower`` here."""

SMALL_CLASS_COUNT = 16
"""Up to this many classes, untargeted FAB differentiates all logit differences at once."""


class FABState(NamedTuple):
  """The ``lax.scan`` carry of FAB."""

  x_adv: Array  # [B, ...] work dtype: the current iterate, inside the box.
  best: MinNormBest  # smallest adversarial iterate seen, per example (any norm, no eps filter).
  targets: Array  # [B, T] int32: FAB-T's target classes per segment ([B, 1] of y otherwise).
  keys: Array  # [B] typed PRNG keys, one per example.
  t: Array  # [] int32: iterations done.
  eps: Array  # [B] work dtype: the budget's radius (for ``done``; ``inf``: no bound).


def _flat(v: Array) -> Array:
  return v.reshape(v.shape[0], -1)


def _closest_boundary(logits: Array, pullback, x_flat: Array, y: Array, norm: str, chunk: int,
                      dtype: jnp.dtype) -> tuple[Array, Array]:
  r"""``(f, w)`` of the class :math:`\hat j \ne y` with the smallest :math:`|f_j| / \|w_j\|_q`.

  :math:`f_j = z_j - z_y` and :math:`w_j = \nabla z_j - \nabla z_y`, one vector-Jacobian
  product per class with cotangent ``onehot(j) - onehot(y)``, ``chunk`` classes at a time (a
  ``lax.scan`` over chunks keeps a running argmin, so memory is ``O(chunk * B * D)``; ties go to
  the smallest class index whatever ``chunk`` is, so the result depends on ``chunk`` only through
  float rounding of the batched backward pass). The true class and padding classes are excluded.

  Returns:
    ``f [B]`` and ``w [B, D]`` (flattened), in ``dtype``.
  """
  batch, num_classes = logits.shape
  num_chunks = -(-num_classes // chunk)
  classes = np.arange(num_chunks * chunk, dtype=np.int32).reshape(num_chunks, chunk)
  z = logits.astype(dtype)

  def chunk_best(carry, chunk_classes):
    best_dist, best_f, best_w = carry
    chunk_classes = jnp.asarray(chunk_classes)
    hot = one_hot_mask(chunk_classes, num_classes)  # [K, C]
    excluded = (chunk_classes[:, None] == y.astype(jnp.int32)[None, :]) \
        | (chunk_classes[:, None] >= num_classes)  # [K, B]
    cot = hot.astype(dtype)[:, None, :] - one_hot_mask(y, num_classes).astype(dtype)[None]
    cot = jnp.where(excluded[:, :, None], 0.0, cot)  # [K, B, C]
    (w,) = jax.vmap(pullback)(cot.astype(logits.dtype))
    w = w.reshape(chunk, batch, -1).astype(dtype)  # [K, B, D]
    w = finite_or_zero(w)  # the finite part of a NaN/Inf gradient
    f = jnp.sum(cot * z[None], axis=-1)  # [K, B]: z_j - z_y
    size = projections.dual_norm(w, norm)  # [K, B]
    # No absolute constant in the denominator: the distance must not depend on the scale of
    # the logits. A zero gradient means the boundary cannot be reached (inf).
    movable = size > 0
    dist = jnp.where(movable, jnp.abs(f) / jnp.where(movable, size, 1.0), jnp.inf)
    dist = jnp.where(excluded | jnp.isnan(dist), jnp.inf, dist)
    pick = jnp.argmin(dist, axis=0).astype(jnp.int32)  # [B], first minimum
    chosen = one_hot_mask(pick, chunk).T  # [K, B]
    dist_c = jnp.min(dist, axis=0)
    f_c = jnp.sum(jnp.where(chosen, f, 0.0), axis=0)
    w_c = jnp.sum(jnp.where(chosen[:, :, None], w, 0.0), axis=0)
    better = dist_c < best_dist
    return (jnp.where(better, dist_c, best_dist), jnp.where(better, f_c, best_f),
            jnp.where(better[:, None], w_c, best_w)), None

  # [B] and [B, D] state from x: they carry its batch sharding.
  init = (rows_like(x_flat, jnp.inf, dtype), rows_like(x_flat, 0.0, dtype),
          jnp.zeros_like(x_flat, dtype=dtype))
  if num_chunks == 1:
    (_, f, w), _ = chunk_best(init, classes[0])
  else:
    (_, f, w), _ = jax.lax.scan(chunk_best, init, jnp.asarray(classes))
  return f, w


def _random_start(x: Array, keys: Array, radius: Array, lower: Array, upper: Array,
                  norm: str) -> Array:
  """``x`` plus a random direction of norm ``radius`` (reference's sampling), clipped to the box.

  Linf: uniform in ``[-1, 1]`` per coordinate, rescaled to Linf norm 1; L2: Gaussian rescaled to
  L2 norm 1; L1: Gaussian rescaled to L1 norm 1.
  """
  shape = x.shape[1:]
  if norm == "linf":
    draw = jax.vmap(lambda k: jax.random.uniform(k, shape, x.dtype, -1.0, 1.0))(keys)
  else:
    draw = jax.vmap(lambda k: jax.random.normal(k, shape, x.dtype))(keys)
  size = projections.norm(draw, norm)
  size = jnp.where(size > 0, size, 1.0)
  return jnp.clip(x + draw * expand(radius / size, x.ndim), lower, upper)


class _Config(NamedTuple):
  """FAB's static configuration, chosen by :func:`fab` and passed to every piece below."""

  norm: str
  steps: int  # iterations per segment
  restarts: int  # segments per target
  alpha_max: float
  eta: float
  beta: float
  class_chunk: int | None
  n_target_classes: int
  targeted: bool
  multi_target: bool  # FAB-T
  plain_targeted: bool  # towards target=


def _init(config: _Config, logits_fn, x, y, budget: Budget, keys, target=None) -> FABState:
  x, eps, _, _ = unpack_budget(x, budget)
  best = MinNormBest.empty(x)
  if config.multi_target:
    logits = logits_fn(x)
    num_classes = logits.shape[1]
    if config.n_target_classes >= num_classes:
      raise ValueError(f"FAB-T with n_target_classes={config.n_target_classes} needs more "
                       f"classes: the model has {num_classes}, so at most {num_classes - 1} "
                       "targets.")
    # The (k + 2)-th largest clean logit for k = 0..T-1 (the top one is y when correct).
    targets = jax.lax.top_k(logits, config.n_target_classes + 1)[1][:, 1:].astype(jnp.int32)
  elif config.plain_targeted:
    targets = target.astype(jnp.int32)[:, None]
  else:
    targets = y.astype(jnp.int32)[:, None]
  return FABState(x_adv=x, best=best, targets=targets, keys=keys, t=jnp.zeros((), jnp.int32),
                  eps=eps)


def _linearise(config: _Config, logits_fn, x_k: Array, y: Array,
               seg_target: Array) -> tuple[Array, Array]:
  """``f [B]`` and ``w [B, D]`` of the chosen boundary at ``x_k``."""
  dtype = x_k.dtype
  logits, pullback = jax.vjp(logits_fn, x_k)
  num_classes = logits.shape[1]
  if config.targeted:
    # FAB-T: the boundary between y and the segment's target. Targeted (success argmax == t):
    # the boundary between t and its strongest competitor, argmax_{j != t} z_j.
    if config.plain_targeted:
      is_target = one_hot_mask(seg_target, num_classes)
      others = jnp.where(is_target, -jnp.inf, logits)
      rival = jnp.argmax(others, axis=1).astype(jnp.int32)
    else:
      rival = y
    cot = (one_hot_mask(seg_target, num_classes).astype(dtype)
           - one_hot_mask(rival, num_classes).astype(dtype))
    (w,) = pullback(cot.astype(logits.dtype))
    f = jnp.sum(cot * logits.astype(dtype), axis=1)
    w = _flat(w).astype(dtype)
    return f, finite_or_zero(w)  # the finite part of a NaN/Inf gradient
  chunk = config.class_chunk if config.class_chunk is not None else (
      min(num_classes, SMALL_CLASS_COUNT))
  return _closest_boundary(logits, pullback, _flat(x_k), y, config.norm, min(chunk, num_classes),
                           dtype)


def _segment_start(config: _Config, state: FABState, x: Array, eps: Array, lower: Array,
                   upper: Array, segment: Array) -> Array:
  """Where a segment starts: ``x`` for the first restart of each target, else a random point
  around ``x`` (the reference's rule)."""
  if config.restarts == 1:
    return x
  default = jnp.asarray(RESTART_RADIUS[config.norm], x.dtype) * (upper - lower)
  scale = jnp.minimum(state.best.norm, jnp.where(jnp.isfinite(eps), eps, default))
  fresh = _random_start(x, fold_in(state.keys, segment), 0.5 * scale, lower, upper, config.norm)
  return jnp.where(segment % config.restarts == 0, x, fresh)


def _segment_target(config: _Config, state: FABState, segment: Array) -> Array:
  """``[B]``: FAB-T's target of this segment (by one-hot look-up), else ``y`` or ``target``."""
  if not config.multi_target:
    return state.targets[:, 0]
  which = segment // config.restarts
  pick = jnp.arange(config.n_target_classes, dtype=jnp.int32)[None, :] == which
  return jnp.sum(jnp.where(pick, state.targets, 0), axis=1)


def _step(config: _Config, logits_fn, state: FABState, x, y, budget: Budget,
          target=None) -> FABState:
  x, eps, lower, upper = unpack_budget(x, budget)
  segment = state.t // config.steps
  first = state.t % config.steps == 0
  if config.restarts == 1:  # every segment starts at x
    x_k = jnp.where(first, x, state.x_adv)
  else:  # the random start is drawn only on a segment's first step (one branch runs)
    x_k = jax.lax.cond(first, lambda: _segment_start(config, state, x, eps, lower, upper,
                                                     segment), lambda: state.x_adv)
  f, w = _linearise(config, logits_fn, x_k, y, _segment_target(config, state, segment))

  # The hyperplane f + <w, z - x_k> = 0: from x_k it is <w, d> = -f, from x it is
  # <w, d> = -f - <w, x - x_k>.
  x_flat, xk_flat = _flat(x), _flat(x_k)
  r_k = -f
  r_0 = -f + jnp.sum(w * (xk_flat - x_flat), axis=1)
  # Both projections in one vmapped call (a new leading axis; the batch axis keeps its sharding).
  project = jax.vmap(lambda t, r: project_hyperplane_box(t, w, r, lower, upper, config.norm))
  d_k, d_0 = project(jnp.stack([xk_flat, x_flat]), jnp.stack([r_k, r_0]))
  a_k = jnp.maximum(projections.norm(d_k, config.norm), 1e-8)
  a_0 = jnp.maximum(projections.norm(d_0, config.norm), 1e-8)
  alpha = jnp.clip(a_k / (a_k + a_0), 0.0, config.alpha_max)[:, None]
  moved = (xk_flat + config.eta * d_k) * (1 - alpha) + (x_flat + config.eta * d_0) * alpha
  finite = jnp.all(jnp.isfinite(moved), axis=1, keepdims=True)  # never let NaN/Inf in
  x_new = jnp.clip(jnp.where(finite, moved, xk_flat), lower, upper).reshape(x.shape)

  logits_new = logits_fn(x_new)
  if config.plain_targeted:
    success = is_success(logits_new, y, target)
  else:
    success = predict(logits_new) != y.astype(jnp.int32)
  best = state.best.update(x_new, projections.norm(x_new - x, config.norm), success)
  x_next = jnp.where(expand(success, x.ndim), x + config.beta * (x_new - x), x_new)
  return FABState(x_adv=x_next, best=best, targets=state.targets, keys=state.keys,
                  t=state.t + 1, eps=state.eps)


def _finalize(config: _Config, logits_fn, state: FABState, x, y, budget: Budget,
              target=None) -> Array:
  del logits_fn, y, target
  x, eps, _, _ = unpack_budget(x, budget)
  best = state.best
  # The norm recomputed here as jr.run computes it (the loop body may round it differently),
  # so that a budget equal to the reported norm keeps the point.
  size = jnp.where(jnp.isfinite(best.norm), projections.norm(best.x - x, config.norm), jnp.inf)
  # A success inside the ball; `| _done` keeps what `done` promised even where the two norms
  # round to opposite sides of eps.
  inside = (size <= eps) | _done(state)
  return jnp.where(expand(inside, x.ndim), best.x, x)


def _done(state: FABState) -> Array:
  """Rows with a recorded adversarial point inside a finite eps-ball, which ``finalize`` returns.

  Only the fixed-budget use (AutoAttack's FAB and FAB-T at a given eps): with ``eps = inf`` (the
  minimum-norm search, e.g. a minimum-norm curve) no row is ever done, since the smallest
  adversarial point keeps shrinking. At a finite eps the verdict is final once a point inside the
  ball is found (later points are smaller still); the point returned is then that first one
  rather than the smallest of all ``num_steps``.
  """
  return jnp.isfinite(state.eps) & (state.best.norm <= state.eps)


def fab(norm: str = "linf", *, targeted: bool = False, n_target_classes: int | None = 9,
        steps: int = 100, restarts: int = 1, alpha_max: float = 0.1, eta: float = 1.05,
        beta: float = 0.9, class_chunk: int | None = None) -> Attack:
  r"""Fast Adaptive Boundary: minimum-norm steps to the closest linearised decision boundary.

  A minimum-norm attack (``minimum_norm=True``). Each of ``steps`` iterations linearises
  :math:`f_j = z_j - z_y` at the iterate :math:`x_k`, picks the closest linearised boundary
  :math:`\hat j = \arg\min_{j \ne y} |f_j| / \|\nabla f_j\|_q` (:math:`q` the dual exponent),
  projects :math:`x_k` and :math:`x_0` exactly onto that hyperplane intersected with the box
  (steps :math:`\delta_k`, :math:`\delta_0`) and moves to

  .. math::
     x_{k+1} = \Pi_{[l, u]}\big((1 - \alpha)(x_k + \eta\delta_k) + \alpha(x_0 + \eta\delta_0)\big),
     \quad \alpha = \min\Big(\frac{\|\delta_k\|_p}{\|\delta_k\|_p + \|\delta_0\|_p},
                             \alpha_{\max}\Big).

  An adversarial :math:`x_{k+1}` is recorded if it is the smallest so far, then pulled back,
  :math:`x_{k+1} \leftarrow x_0 + \beta(x_{k+1} - x_0)`. Restart ``r > 0`` starts from a random
  point at radius :math:`\tfrac12\min(\|\delta^*\|_p, \epsilon)` (``epsilon`` is ``budget.eps``,
  or when that is ``inf`` the reference's default 0.3 / 1 / 5 for Linf / L2 / L1 times
  ``upper - lower``; :math:`\delta^*` the smallest adversarial perturbation found so far).

  Three modes:

  * ``targeted=False``: untargeted FAB; success is ``argmax != y``.
  * ``targeted=True, n_target_classes=T`` (AutoAttack's FAB-T): ``T`` segments, segment ``k``
    targeting the class with the ``(k + 2)``-th largest clean logit (one gradient per step);
    success is still untargeted (``argmax != y``), no ``target=`` is taken
    (``Attack.targeted`` is ``False``), and the smallest adversarial point of all segments wins.
    ``T`` must be smaller than the number of classes.
  * ``targeted=True, n_target_classes=None``: an ordinary targeted attack towards ``target=``
    (``Attack.targeted`` is ``True``); success is ``argmax == target``. Each step linearises the
    boundary between ``t`` and its strongest rival :math:`\arg\max_{j \ne t} z_j` (one
    gradient). The target's region is an intersection of such half-spaces, so where two rivals
    bind at once the iterates alternate between their boundaries and converge slowly (on the
    10-class linear model of ``tests/test_fab.py``, 27 of 32 points reach the target within 20
    steps and 28 within 100, each within 0.5% of the exact distance). This mode is not in the
    reference implementation, whose targeted FAB is FAB-T.

  ``budget.eps`` is an upper bound (``inf`` for none): the smallest adversarial point found is
  returned if its norm is at most eps, and ``x`` otherwise (scored a failure, norm ``inf``).
  At a finite eps the attack declares a row ``done`` once it holds an adversarial point inside
  the ball, so with early exit (:func:`jaxrobust.run`'s default) that row stops there and the
  first such point is returned rather than the smallest; at ``eps = inf`` it never stops early.
  Points misclassified on the clean input are returned unchanged by :func:`jaxrobust.run`.

  The defaults are those of FAB inside AutoAttack (100 iterations, ``alpha_max = 0.1``,
  ``eta = 1.05``, ``beta = 0.9``; 1 restart and 9 targets in the "standard" suite, 5 restarts in
  "plus").

  Args:
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    targeted: see the three modes above.
    n_target_classes: number of target classes of FAB-T (>= 1), or ``None`` with
      ``targeted=True`` for a targeted attack towards ``target=``. Ignored when untargeted.
    steps: iterations per restart and target (>= 1).
    restarts: runs per target (>= 1); all but the first start at a random point.
    alpha_max: the largest weight of the original point's projection, in ``(0, 1]``.
    eta: overshoot of the projection steps, ``>= 1``.
    beta: backward step towards the original point after a success, in ``(0, 1]``.
    class_chunk: how many classes untargeted FAB differentiates at once (memory
      ``class_chunk * B * D``); default all classes up to 16 classes, else 16. The result does
      not depend on it beyond float32 rounding of the batched backward passes.

  Returns:
    A :class:`jaxrobust.Attack` with ``minimum_norm=True`` and
    ``num_steps = steps * restarts * (n_target_classes for FAB-T, else 1)``.

  Raises:
    ValueError: for an unknown norm or an option out of range; at ``init`` for FAB-T with
      ``n_target_classes`` not smaller than the number of classes.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> from jaxrobust.attacks._fab import fab
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])  # L2 distance to the boundary: 0.1414
    >>> attack = fab("l2", steps=20)
    >>> run = jax.jit(lambda e: jr.run(attack, logits_fn, x, y, jr.Budget(e), jax.random.key(0)))
    >>> result = run(jnp.inf)  # no bound on the norm
    >>> bool(result.success[0]), round(float(result.norm[0]), 3)  # within 0.5% of the optimum
    (True, 0.142)
    >>> bool(run(0.1).success[0])  # no point within 0.1 is adversarial
    False

  References:
    Croce & Hein, "Minimally distorted adversarial examples with a fast adaptive boundary
    attack", ICML 2020.
    Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse
    parameter-free attacks", ICML 2020 (FAB-T in AutoAttack).
  """
  if not isinstance(norm, str) or norm not in NORMS:
    raise ValueError(f"fab supports norm 'linf', 'l2' or 'l1', got {norm!r}.")
  targeted = check_bool("targeted", targeted)
  steps = check_positive_int("steps", steps)
  restarts = check_positive_int("restarts", restarts)
  alpha_max = check_number("alpha_max", alpha_max, low=0.0, high=1.0, low_open=True)
  eta = check_number("eta", eta, low=1.0)
  beta = check_number("beta", beta, low=0.0, high=1.0, low_open=True)
  if n_target_classes is not None:
    n_target_classes = check_positive_int("n_target_classes", n_target_classes)
  elif not targeted:
    n_target_classes = 9  # ignored
  if class_chunk is not None:
    class_chunk = check_positive_int("class_chunk", class_chunk)

  multi_target = targeted and n_target_classes is not None  # FAB-T
  plain_targeted = targeted and n_target_classes is None
  segments = restarts * (n_target_classes if multi_target else 1)
  config = _Config(norm=norm, steps=steps, restarts=restarts, alpha_max=alpha_max, eta=eta,
                   beta=beta, class_chunk=class_chunk, n_target_classes=n_target_classes,
                   targeted=targeted, multi_target=multi_target, plain_targeted=plain_targeted)
  if multi_target:
    name = f"fab-t-{norm}-{steps}x{n_target_classes}targets"
    name += f"x{restarts}" if restarts > 1 else ""
  else:
    name = f"fab-{norm}-{steps}x{restarts}" + ("-targeted" if plain_targeted else "")
  return Attack(init=functools.partial(_init, config), step=functools.partial(_step, config),
                finalize=functools.partial(_finalize, config), num_steps=steps * segments,
                norm=norm, targeted=plain_targeted, minimum_norm=True, name=name, done=_done)
