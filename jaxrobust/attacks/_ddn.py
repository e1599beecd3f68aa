r"""The Decoupled Direction and Norm attack (DDN; Rony et al., CVPR 2019), a minimum-norm L2 attack.

DDN keeps, per example, a perturbation :math:`\delta_k` and a radius :math:`\epsilon_k`, and
decouples the two: the direction follows the gradient of the cross-entropy, and the norm is set
by the radius alone, which shrinks while the iterate is adversarial and grows while it is not.
Iteration :math:`k = 0, \dots, K - 1` evaluates the model and the gradient :math:`g` of the loss
at :math:`x_k = x + \delta_k` (one forward and one backward pass) and sets

.. math::
   \epsilon_{k+1} &= \min\big(\bar\epsilon,\ \epsilon_k (1 - \gamma)\big) \text{ if } x_k
     \text{ is adversarial, else } \min\big(\bar\epsilon,\ \epsilon_k (1 + \gamma)\big), \\
   \delta' &= \delta_k + \alpha_k\, g / \|g\|_2, \\
   \delta_{k+1} &= \Pi_{[l, u] - x}\big(\epsilon_{k+1}\, \delta' / \|\delta'\|_2\big),

with :math:`\epsilon_0` = ``init_epsilon``, :math:`\delta_0 = 0`, the last line a projection
onto the *sphere* of radius :math:`\epsilon_{k+1}` (the perturbation is scaled up as well as
down) followed by the clip to the box :math:`[l, u]`, and
:math:`\bar\epsilon = \|\max(x - l, u - x)\|_2` the largest norm the box allows. The step
:math:`\alpha_k` follows cosine annealing from ``alpha_init`` to ``alpha_final``,
:math:`\alpha_k = \alpha_K + (\alpha_0 - \alpha_K)(1 + \cos(\pi k / K)) / 2`. Every iterate is
scored (the last one by ``finalize``) and the adversarial one of smallest norm is returned.

Defaults: ``steps=100``, ``gamma=0.05``, ``init_epsilon=1.0`` and the step annealed from 1 to
0.01 are those of the authors' implementation (adv_lib's ``ddn``) and of Foolbox 3.3's
``DDNAttack``. Where they differ, and where this implementation departs from both:

* **The loss.** Untargeted, the ascent direction is the gradient of
  :math:`L = \log\sum_{j \ne y} e^{z_j} - z_y`; targeted, of
  :math:`L = z_t - \log\sum_{j \ne t} e^{z_j}`. With :math:`p = \operatorname{softmax}(z)`,
  :math:`\nabla \mathrm{CE}(z, y) = (1 - p_y)\, \nabla L`: the same direction as the paper's
  cross-entropy step once normalised. In float32, though, the cross-entropy's gradient with
  respect to the logits, :math:`p - e_y`, loses its label entry once :math:`p_y` rounds to 1 (a
  logit gap beyond about 17, common on confident points) and keeps only the tiny entries
  :math:`p_j` of the other classes, so it raises them without lowering :math:`z_y`; beyond a gap
  of about 100 every entry underflows to 0. The gradient of :math:`L` with respect to the
  logits, :math:`q - e_y` with :math:`q` the softmax over the classes :math:`j \ne y`, has
  neither problem. The input gradient is normalised after division by its largest entry, so a
  tiny gradient does not underflow either.
* **A zero gradient** (a model flat around the iterate) is replaced, as in both references, by a
  Gaussian direction, drawn from the example's own key (``fold_in(key, k)``), so a result does
  not depend on the example's place in the batch. Non-finite gradient entries are dropped first.
* **The box** is the budget's :math:`[l, u]`, not :math:`[0, 1]` (as Foolbox, unlike adv_lib).
* **Quantisation** of every iterate to ``levels`` values of the box (adv_lib's default: 256
  levels of :math:`[0, 1]`, for 8-bit images) is optional and off by default (Foolbox has none):
  inputs need not be images, and rounding every coordinate moves an input that is not on the
  grid. With ``levels`` the iterate is rounded after the clip; the points returned are on the
  grid.
* **The last iterate is scored** (both references return the best of the iterates before the
  last step).

The search never looks at ``budget.eps``: a finite eps only filters the returned point, so the
verdict within eps is the unbounded run's, and every eps of a robustness curve follows from one
unbounded run. At a finite eps a row is ``done`` once some adversarial iterate lies inside the
ball (the smallest adversarial norm can only shrink); at ``eps = inf`` no row is ever done.

On the strength of these defaults against Foolbox's DDN, FMN and C&W on the digits models, see
``benchmarks/RESULTS.md``, section "DDN against Foolbox (issue #27)".
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from jaxrobust import losses as losses_lib
from jaxrobust import projections
from jaxrobust._batch import (expand, finite_or_zero, fold_in, is_success, like_batch, one_hot_mask,
                              work_dtype)
from jaxrobust._types import Attack, Budget
from jaxrobust._validation import check_bool, check_number, check_positive_int
from jaxrobust.attacks._common import (MinNormBest, annealed, loss_grad_logits, smallest_inside,
                                       unpack_budget)

Array = jax.Array


class DDNState(NamedTuple):
  """The ``lax.scan`` carry of DDN."""

  x_adv: Array  # [B, ...] work dtype: the current iterate x + delta_k, inside the box.
  eps: Array  # [B] work dtype: the current radius eps_k.
  best: MinNormBest  # smallest adversarial iterate seen, per example (no eps filter).
  keys: Array  # [B] typed PRNG keys: a direction for a zero gradient.
  k: Array  # [] int32: iterations done.
  limit: Array  # [B] work dtype: the budget's eps, for ``done`` (``inf``: no bound).


class _Config(NamedTuple):
  """DDN's static configuration, chosen by :func:`ddn` and passed to every piece below."""

  steps: int
  init_epsilon: float
  gamma: float
  alpha_init: float
  alpha_final: float
  levels: Optional[int]
  loss_fn: Callable[..., Array]  # ascent raises it towards success


def _away_from_label(logits: Array, labels: Array) -> Array:
  r"""Untargeted: :math:`\log\sum_{j \ne y} e^{z_j} - z_y` (float32 at least), whose gradient is
  the cross-entropy's divided by :math:`1 - p_y` (see the module docstring)."""
  logits = logits.astype(work_dtype(logits))
  others = jnp.where(one_hot_mask(labels, logits.shape[-1]), -jnp.inf, logits)
  return jax.nn.logsumexp(others, axis=-1) - losses_lib.label_logit(logits, labels)


def _towards_target(logits: Array, labels: Array, target: Array) -> Array:
  r"""Targeted: :math:`z_t - \log\sum_{j \ne t} e^{z_j}`, the negative cross-entropy of the
  target's direction divided by :math:`1 - p_t`."""
  del labels
  return -_away_from_label(logits, target)


def _unit_direction(grad: Array, keys: Array, k: Array) -> Array:
  """``grad / ||grad||_2`` per row (scaled by its largest entry first, so that neither a tiny nor
  a huge gradient under- or overflows); a Gaussian direction from ``fold_in(keys, k)`` where the
  gradient is 0 (drawn only when some row needs it)."""
  ndim = grad.ndim
  flat = grad.reshape(grad.shape[0], -1)
  peak = jnp.max(jnp.abs(flat), axis=1)
  moving = peak > 0
  draw = lambda: jax.vmap(lambda key: jax.random.normal(key, grad.shape[1:], grad.dtype))(
      fold_in(keys, k))
  noise = jax.lax.cond(jnp.all(moving), lambda: jnp.zeros_like(grad), draw)
  scale = jnp.where(moving, peak, 1.0)
  g = jnp.where(expand(moving, ndim), grad / expand(scale, ndim), noise)
  length = projections.norm(g, "l2")
  return g / expand(jnp.where(length > 0, length, 1.0), ndim)


def _quantise(config: _Config, x: Array, lower: Array, upper: Array) -> Array:
  """``x`` rounded to the nearest of ``levels`` equally spaced values of ``[lower, upper]``."""
  if config.levels is None:
    return x
  span = upper - lower
  intervals = config.levels - 1
  ticks = jnp.round((x - lower) / jnp.where(span > 0, span, 1.0) * intervals)
  return jnp.clip(lower + ticks * (span / intervals), lower, upper)


def _init(config: _Config, logits_fn, x, y, budget: Budget, keys, target=None) -> DDNState:
  del logits_fn, y, target
  x, limit, _, _ = unpack_budget(x, budget)
  best = MinNormBest.empty(x)  # [B] fields from a slice of x: they carry its batch sharding.
  eps = jnp.full_like(best.norm, config.init_epsilon)
  return DDNState(x_adv=x, eps=eps, best=best, keys=keys, k=jnp.zeros((), jnp.int32),
                  limit=like_batch(limit, x))


def _step(config: _Config, logits_fn, state: DDNState, x, y, budget: Budget,
          target=None) -> DDNState:
  x, _, lower, upper = unpack_budget(x, budget)
  _, grad, logits = loss_grad_logits(logits_fn, config.loss_fn, state.x_adv, y, target)
  grad = finite_or_zero(grad.astype(x.dtype))
  delta = state.x_adv - x
  success = is_success(logits, y, target)
  best = state.best.update(state.x_adv, projections.norm(delta, "l2"), success)

  # The radius: shrink after an adversarial iterate, grow after any other, never beyond the
  # largest norm the box allows.
  worst = projections.norm(jnp.maximum(x - lower, upper - x), "l2")
  eps = state.eps * jnp.where(success, 1 - config.gamma, 1 + config.gamma).astype(x.dtype)
  eps = jnp.minimum(eps, worst)

  # The direction: a step along the unit gradient, then onto the sphere of radius eps, the box
  # and (optionally) the grid.
  alpha = annealed(config.alpha_init, config.alpha_final, state.k, config.steps, x.dtype)
  moved = delta + alpha * _unit_direction(grad, state.keys, state.k)
  length = projections.norm(moved, "l2")
  delta = moved * expand(jnp.where(length > 0, eps / jnp.where(length > 0, length, 1.0), 0.0),
                         x.ndim)
  x_next = _quantise(config, jnp.clip(x + delta, lower, upper), lower, upper)
  return DDNState(x_adv=x_next, eps=eps, best=best, keys=state.keys, k=state.k + 1,
                  limit=state.limit)


def _finalize(config: _Config, logits_fn, state: DDNState, x, y, budget: Budget,
              target=None) -> Array:
  del config
  x, eps, _, _ = unpack_budget(x, budget)
  return smallest_inside(state.best, logits_fn, state.x_adv, x, y, target, eps, "l2")


def _done(state: DDNState) -> Array:
  """Rows whose smallest adversarial iterate already lies inside a finite eps-ball.

  ``finalize`` returns that point or a smaller one, and no later step can take it away
  (:meth:`MinNormBest.update` only shrinks it), so the verdict at this eps is final. At
  ``eps = inf`` no row is ever done: the point keeps shrinking.
  """
  return state.best.within(state.limit)


def ddn(*, steps: int = 100, init_epsilon: float = 1.0, gamma: float = 0.05,
        alpha_init: float = 1.0, alpha_final: float = 0.01, levels: Optional[int] = None,
        targeted: bool = False) -> Attack:
  r"""Decoupled Direction and Norm: an L2 minimum-norm attack with a radius set by success.

  A minimum-norm attack (``minimum_norm=True``, norm ``"l2"``). Each of ``steps`` iterations takes
  one forward and backward pass at the iterate :math:`x + \delta_k`, multiplies the radius
  :math:`\epsilon_k` by :math:`1 - \gamma` if the iterate is adversarial and by :math:`1 + \gamma`
  otherwise (capped at the largest norm the box allows), steps along the unit gradient of the
  cross-entropy's direction (ascent untargeted, towards the target targeted), and puts the
  perturbation on the sphere of the new radius, then clips it to the box:

  .. math::
     \delta_{k+1} = \Pi_{[l, u] - x}\Big(\epsilon_{k+1}\,
       \frac{\delta_k + \alpha_k\, g / \|g\|_2}{\|\delta_k + \alpha_k\, g / \|g\|_2\|_2}\Big),

  with :math:`\alpha_k` cosine-annealed from ``alpha_init`` to ``alpha_final`` and
  :math:`\epsilon_0` = ``init_epsilon``. Every iterate is scored and the adversarial one with the
  smallest norm returned. The ascent direction is the cross-entropy's gradient divided by
  :math:`1 - p_y` (it does not vanish when the softmax saturates in float32); a zero gradient is
  replaced by a Gaussian direction from the example's key. See :mod:`jaxrobust.attacks._ddn` for
  the details and where this departs from the references.

  ``budget.eps`` is an optional upper bound (``inf`` for none) that never changes the search: the
  smallest adversarial point found is returned if it lies in the eps-ball, and ``x`` otherwise
  (scored a failure, with norm ``inf``). At a finite eps a row is ``done`` once an adversarial
  iterate lies inside the ball, so with early exit (:func:`jaxrobust.run`'s default) it stops
  there and that iterate is returned rather than the smallest of all ``steps`` (the verdict is the
  same); at ``eps = inf`` no row is ever done. Points misclassified on the clean input are
  returned unchanged.

  Args:
    steps: iterations (>= 1), one forward and one backward pass each.
    init_epsilon: the first radius :math:`\epsilon_0 > 0`, in input units.
    gamma: the radius factor :math:`\gamma`, in ``(0, 1)``.
    alpha_init: first step size :math:`\alpha_0 > 0`, in input units along a unit-norm direction.
    alpha_final: last step size, ``0 < alpha_final <= alpha_init``.
    levels: ``None`` (the default) or an int ``>= 2``: round every iterate to ``levels`` equally
      spaced values of the box (256 for 8-bit images in ``[0, 1]``, the authors' default).
    targeted: drive the prediction to ``target`` (pass ``target=`` to :func:`jaxrobust.run`).

  Returns:
    A :class:`jaxrobust.Attack` with ``minimum_norm=True`` and ``norm="l2"``, for
    :func:`jaxrobust.run` (where ``result.norm`` is the size of the perturbation found, ``inf`` if
    none) or :func:`jaxrobust.robustness_curve` (one run gives the whole curve).

  Raises:
    ValueError: for an option out of range.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> from jaxrobust.attacks._ddn import ddn
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])  # L2 distance to the boundary: 0.1414
    >>> attack = ddn()
    >>> run = jax.jit(lambda e: jr.run(attack, logits_fn, x, y, jr.Budget(e), jax.random.key(0)))
    >>> result = run(jnp.inf)  # no bound on the norm
    >>> bool(result.success[0]), round(float(result.norm[0]), 2)
    (True, 0.14)
    >>> bool(run(0.1).success[0])  # no point within 0.1 is adversarial
    False

  References:
    Rony, Hafemann, Oliveira, Ben Ayed, Sabourin & Granger, "Decoupling Direction and Norm for
    Efficient Gradient-Based L2 Adversarial Attacks and Defenses", CVPR 2019.
  """
  steps = check_positive_int("steps", steps)
  init_epsilon = check_number("init_epsilon", init_epsilon, low=0.0, low_open=True)
  gamma = check_number("gamma", gamma, low=0.0, high=1.0, low_open=True, high_open=True)
  alpha_init = check_number("alpha_init", alpha_init, low=0.0, low_open=True)
  alpha_final = check_number("alpha_final", alpha_final, low=0.0, high=alpha_init,
                             low_open=True)
  if levels is not None:
    levels = check_positive_int("levels", levels, minimum=2)
  targeted = check_bool("targeted", targeted)
  config = _Config(steps=steps, init_epsilon=init_epsilon, gamma=gamma, alpha_init=alpha_init,
                   alpha_final=alpha_final, levels=levels,
                   loss_fn=_towards_target if targeted else _away_from_label)
  return Attack(init=functools.partial(_init, config), step=functools.partial(_step, config),
                finalize=functools.partial(_finalize, config), num_steps=steps, norm="l2",
                targeted=targeted, minimum_norm=True,
                name=f"ddn-l2-{steps}" + ("-targeted" if targeted else ""), done=_done)
