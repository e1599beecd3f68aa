r"""The Fast Minimum-Norm attack (FMN; Pintor, Roli, Brendel & Biggio, 2021) under Linf, L2, L1.

FMN searches for the smallest adversarial perturbation by projected gradient descent on the logit
margin inside an eps-ball whose radius :math:`\epsilon_k` adapts at every iteration: it shrinks
while the iterate is adversarial and grows while it is not. With

.. math::
   L(x') = z_y(x') - \max_{j \ne y} z_j(x') \quad\text{(untargeted)}, \qquad
   L(x') = \max_{j \ne t} z_j(x') - z_t(x') \quad\text{(targeted)},

positive exactly when :math:`x'` is not yet adversarial, iteration :math:`k = 0, \dots, K - 1`
evaluates :math:`L` and :math:`g = \nabla_x L` at :math:`x_k = x + \delta_k` (one forward and one
backward pass of the summed loss) and sets

.. math::
   \epsilon_{k+1} = \min\Big(\bar\epsilon, \begin{cases}
     \min\big(\epsilon_k (1 - \gamma_k),\ \|\delta^*\|_p\big) & x_k \text{ adversarial} \\
     \epsilon_k (1 + \gamma_k) & \text{not, but an adversarial iterate was seen} \\
     \max\big(\|\delta_k\|_p + |L(x_k)| / \|g\|_q,\ (1 + \gamma_k)\,\epsilon_k\big)
       & \text{no adversarial iterate yet}
   \end{cases}\Big)

with :math:`\epsilon_0 = \infty` (:math:`\epsilon_0` read as :math:`\|\delta_0\|_p = 0` in the
floor), :math:`\delta^*` the smallest adversarial perturbation seen so far (this iterate
included), :math:`q` the dual exponent of :math:`p` and
:math:`\bar\epsilon = \|\max(x - l, u - x)\|_p` the largest norm the box :math:`[l, u]` allows.
The third case is the paper's first-order estimate of the distance to the boundary (exact for a
linear model), so the first iteration already sets :math:`\epsilon_1` to the linearised
distance. The floor :math:`(1 + \gamma_k)\,\epsilon_k` is an addition to the paper's rule, for
two ways the estimate alone stalls:

* on a linear model the first iterate lands exactly on the boundary, where float32 rounding often
  leaves it on the non-adversarial side with :math:`L \approx 0`, and the estimate keeps it there
  at every later iteration (6-21% of the points of ``tests/test_fmn.py`` were never broken);
* where the gradient points out of the box on some coordinates (inputs on a face of the box), the
  clip removes part of every step, so :math:`\|\delta_k\|_p` stays below :math:`\epsilon_k`, and
  the estimate, blind to the box, settles where the clipped mass equals the estimated remaining
  distance: L2 FMN broke 58% of the points of a small MLP with half its inputs on the faces of
  the box (FAB and DeepFool: 100%), and 33% of the points of a linear model so placed
  (``tests/test_fmn.py``).

With the floor the radius grows geometrically until an iterate is adversarial, and then shrinks.
Then

.. math::
   \delta_{k+1} = \Pi_{[l, u] - x}\Big(\Pi_{\|\cdot\|_p \le \epsilon_{k+1}}
                  \big(\delta_k + \alpha_k\, d_p(-g)\big)\Big),

with :math:`d_\infty(g) = \operatorname{sign}(g)`, :math:`d_2(g) = d_1(g) = g / \|g\|_2`, the
exact projection onto the ball (:func:`jaxrobust.projections.project`; for L1 the sort/threshold
projection) and the clip to the box. The L1 step is the reference implementation's: the
L2-normalised gradient, made sparse by the projection (soft thresholding keeps only the
coordinates whose entries exceed a threshold), which on a linear model concentrates the mass on
the coordinate of largest :math:`|g_i|`, where the optimal L1 perturbation lies. (A step spread
evenly over the top few coordinates, the sparse step of L1 PGD, gives them equal increments that
the projection never separates: the iterate keeps the mass spread over them and ends at 1.14
times the exact minimum, median over ``tests/test_ground_truth_min_norm.py``'s 64-feature
ten-class problems, instead of 1.00.) Projecting exactly onto the intersection of the L1 ball and
the box instead of clipping changed the norms found on a small MLP with half its inputs on the
faces of the box by less than 0.1%, so FMN keeps the reference's clip.

The step size :math:`\alpha_k` (in input units) and the radius factor :math:`\gamma_k` follow
cosine annealing,

.. math::
   \alpha_k = \alpha_K + (\alpha_0 - \alpha_K)\,\frac{1 + \cos(\pi k / K)}{2}, \qquad
   \gamma_k = \gamma_K + (\gamma_0 - \gamma_K)\,\frac{1 + \cos(\pi k / K)}{2}.

Every iterate is scored (the last one by ``finalize``) and the adversarial one with the smallest
norm is returned. The search itself never looks at ``budget.eps``: a finite eps only filters the
returned point, so the verdict within eps is the unbounded run's
(:math:`\|\delta^*\|_p \le \epsilon`), and every eps of a robustness curve follows from one
unbounded run. The smallest adversarial norm can only shrink, so at a finite eps that verdict is
final as soon as some iterate inside the ball is adversarial: the attack declares such a row
``done``, and with early exit it stops there and returns that iterate (``early_exit=False``: the
unbounded result, whenever that fits in the ball).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrobust import losses as losses_lib
from jaxrobust import projections
from jaxrobust._batch import expand, finite_or_zero, is_success, like_batch
from jaxrobust._types import NORMS, Attack, Budget
from jaxrobust._validation import check_bool, check_number, check_positive_int
from jaxrobust.attacks._common import (MinNormBest, annealed, loss_grad_logits, smallest_inside,
                                       unpack_budget)

Array = jax.Array


class FMNState(NamedTuple):
  """The ``lax.scan`` carry of FMN."""

  x_adv: Array  # [B, ...] work dtype: the current iterate x + delta_k, inside the box.
  eps: Array  # [B] work dtype: the current radius eps_k (inf before the first iteration).
  found: Array  # [B] bool: some iterate has been adversarial.
  best: MinNormBest  # smallest adversarial iterate seen, per example (any norm, no eps filter).
  k: Array  # [] int32: iterations done.
  limit: Array  # [B] work dtype: the budget's eps, for ``done`` (``inf``: no bound).


class _Config(NamedTuple):
  """FMN's static configuration, chosen by :func:`fmn` and passed to every piece below."""

  norm: str
  steps: int
  alpha_init: float
  alpha_final: float
  gamma_init: float
  gamma_final: float
  loss_fn: Callable[..., Array]  # the margin, positive while not adversarial


def _margin_to_cross(logits: Array, labels: Array) -> Array:
  r""":math:`z_y - \max_{j \ne y} z_j`: positive exactly when the point is not yet adversarial."""
  return -losses_lib.margin(logits, labels)


def _margin_to_target(logits: Array, labels: Array, target: Array) -> Array:
  r""":math:`\max_{j \ne t} z_j - z_t`: positive exactly when the target is not reached."""
  return -losses_lib.targeted_margin(logits, labels, target)


def _init(config: _Config, logits_fn, x, y, budget: Budget, keys, target=None) -> FMNState:
  del config, logits_fn, y, keys, target
  x, limit, _, _ = unpack_budget(x, budget)
  best = MinNormBest.empty(x)  # [B] fields from a slice of x: they carry its batch sharding.
  return FMNState(x_adv=x, eps=best.norm, found=jnp.zeros_like(best.norm, dtype=bool),
                  best=best, k=jnp.zeros((), jnp.int32), limit=like_batch(limit, x))


def _step(config: _Config, logits_fn, state: FMNState, x, y, budget: Budget,
          target=None) -> FMNState:
  norm = config.norm
  x, _, lower, upper = unpack_budget(x, budget)
  loss, grad, logits = loss_grad_logits(logits_fn, config.loss_fn, state.x_adv, y, target)
  loss, grad = loss.astype(x.dtype), grad.astype(x.dtype)
  # Non-finite gradient entries (a sqrt or log of 0 inside the model) are dropped, so that the
  # attack works with the finite part of the gradient and no NaN reaches the iterate.
  grad = finite_or_zero(grad)
  delta = state.x_adv - x
  size = projections.norm(delta, norm)
  success = is_success(logits, y, target)
  best = state.best.update(state.x_adv, size, success)
  found = state.found | success
  alpha = annealed(config.alpha_init, config.alpha_final, state.k, config.steps, x.dtype)
  gamma = annealed(config.gamma_init, config.gamma_final, state.k, config.steps, x.dtype)

  # The radius: shrink while adversarial, grow while not; before any adversarial iterate,
  # jump to the first-order distance to the boundary (inf for a zero or non-finite gradient),
  # but grow by at least the factor 1 + gamma, so that an iterate on the boundary crosses it
  # and the box cannot hold the iterate below the radius for ever.
  scale = projections.dual_norm(grad.reshape(grad.shape[0], -1), norm)  # ||g||_q
  movable = scale > 0
  to_boundary = jnp.where(movable, jnp.abs(loss) / jnp.where(movable, scale, 1.0), jnp.inf)
  previous = jnp.where(jnp.isfinite(state.eps), state.eps, size)
  estimate = jnp.maximum(size + to_boundary, previous * (1 + gamma))
  grow = jnp.where(found, state.eps * (1 + gamma), estimate)
  eps = jnp.where(success, jnp.minimum(state.eps * (1 - gamma), best.norm), grow)
  worst = projections.norm(jnp.maximum(x - lower, upper - x), norm)
  eps = jnp.where(jnp.isnan(eps), worst, jnp.minimum(eps, worst))

  # Descent along the normalised gradient (its sign for Linf), then the exact projection onto
  # the ball and the box. A zero gradient gives no step.
  d = -grad if norm != "linf" else -jnp.sign(grad)
  if norm != "linf":
    length = projections.norm(grad, "l2")
    d = d / expand(jnp.where(length > 0, length, 1.0), x.ndim)
  finite = jnp.all(jnp.isfinite(d.reshape(d.shape[0], -1)), axis=1)
  d = jnp.where(expand(finite, x.ndim), d, 0.0)  # never let NaN/Inf into the iterate
  delta = projections.project(delta + alpha * d, eps, norm)
  x_next = jnp.clip(x + delta, lower, upper)
  return FMNState(x_adv=x_next, eps=eps, found=found, best=best, k=state.k + 1,
                  limit=state.limit)


def _finalize(config: _Config, logits_fn, state: FMNState, x, y, budget: Budget,
              target=None) -> Array:
  x, eps, _, _ = unpack_budget(x, budget)
  return smallest_inside(state.best, logits_fn, state.x_adv, x, y, target, eps, config.norm)


def _done(state: FMNState) -> Array:
  """Rows whose smallest adversarial iterate already lies inside a finite eps-ball.

  ``finalize`` returns that point or a smaller one, and no later step can take it away
  (:meth:`MinNormBest.update` only shrinks it), so the verdict at this eps is final. At
  ``eps = inf`` (the minimum-norm search, e.g. a minimum-norm curve) no row is ever done: the
  point keeps shrinking.
  """
  return state.best.within(state.limit)


def fmn(norm: str = "linf", *, steps: int = 100, alpha_init: float = 1.0,
        alpha_final: float | None = None, gamma_init: float = 0.05, gamma_final: float = 0.001,
        targeted: bool = False) -> Attack:
  r"""Fast Minimum-Norm: projected descent on the margin inside an adaptively sized eps-ball.

  A minimum-norm attack (``minimum_norm=True``). Each of ``steps`` iterations takes one forward
  and backward pass of the logit margin :math:`L = z_y - \max_{j \ne y} z_j` (targeted:
  :math:`\max_{j \ne t} z_j - z_t`) at the iterate :math:`x + \delta_k`, updates the radius

  .. math::
     \epsilon_{k+1} = \begin{cases}
       \min\big(\epsilon_k (1 - \gamma_k),\ \|\delta^*\|_p\big) & \text{adversarial} \\
       \epsilon_k (1 + \gamma_k) & \text{not, but some iterate was} \\
       \max\big(\|\delta_k\|_p + |L| / \|\nabla L\|_q,\ (1 + \gamma_k)\,\epsilon_k\big)
         & \text{no adversarial iterate yet}
     \end{cases}

  (capped at the largest norm the box allows; :math:`\delta^*` is the smallest adversarial
  perturbation seen, :math:`q` the dual exponent; :math:`\epsilon_0 = \infty`; the floor
  :math:`(1 + \gamma_k)\,\epsilon_k` keeps an iterate on the boundary, or one the box holds back,
  from stalling, see :mod:`jaxrobust.attacks._fmn`), steps along the normalised gradient (its sign
  for Linf), then projects exactly onto the ball of radius :math:`\epsilon_{k+1}` and onto the
  box:

  .. math::
     \delta_{k+1} = \Pi_{[l, u] - x}\Big(\Pi_{\|\cdot\|_p \le \epsilon_{k+1}}
                    \big(\delta_k - \alpha_k\, d_p(\nabla L)\big)\Big).

  :math:`d_\infty = \operatorname{sign}` and :math:`d_2(g) = d_1(g) = g / \|g\|_2` (the reference
  implementation's L1 step, made sparse by the exact L1 projection). The step :math:`\alpha_k`
  (in input units) anneals from ``alpha_init`` to ``alpha_final`` and :math:`\gamma_k` from
  ``gamma_init`` to ``gamma_final``, both along :math:`(1 + \cos(\pi k / K)) / 2`. On a linear
  model the first iteration sets :math:`\epsilon_1` to the exact distance to the current
  runner-up's boundary.

  Every iterate is scored and the adversarial one with the smallest norm returned.
  ``budget.eps`` is an optional upper bound (``inf`` for none) that never changes the search: the
  smallest adversarial point found is returned if it lies in the eps-ball, and ``x`` otherwise
  (scored a failure, with norm ``inf``). At a finite eps the attack declares a row ``done`` once
  an adversarial iterate lies inside the ball, so with early exit (:func:`jaxrobust.run`'s
  default) that row stops there and that iterate is returned rather than the smallest of all
  ``steps`` (the verdict is the same); at ``eps = inf`` no row is ever done. Points misclassified
  on the clean input are returned unchanged.

  Args:
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.
    steps: iterations (>= 1), one forward and one backward pass each.
    alpha_init: first step size :math:`\alpha_0 > 0`, in input units along a unit-norm direction
      (the ball projection caps the move at the current radius).
    alpha_final: last step size, ``0 < alpha_final <= alpha_init``; default ``alpha_init / 100``.
    gamma_init: first radius factor :math:`\gamma_0`, in ``(0, 1)``.
    gamma_final: last radius factor, ``0 <= gamma_final <= gamma_init``.
    targeted: drive the prediction to ``target`` (pass ``target=`` to :func:`jaxrobust.run`).

  Returns:
    A :class:`jaxrobust.Attack` with ``minimum_norm=True``, for :func:`jaxrobust.run` (where
    ``result.norm`` is the size of the perturbation found, ``inf`` if none) or
    :func:`jaxrobust.robustness_curve` (one run gives the whole curve).

  Raises:
    ValueError: for an unknown norm or an option out of range.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> from jaxrobust.attacks._fmn import fmn
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])  # L2 distance to the boundary: 0.1414
    >>> attack = fmn("l2", steps=100)
    >>> run = jax.jit(lambda e: jr.run(attack, logits_fn, x, y, jr.Budget(e), jax.random.key(0)))
    >>> result = run(jnp.inf)  # no bound on the norm
    >>> bool(result.success[0]), round(float(result.norm[0]), 3)
    (True, 0.141)
    >>> bool(run(0.1).success[0])  # no point within 0.1 is adversarial
    False

  References:
    Pintor, Roli, Brendel & Biggio, "Fast Minimum-norm Adversarial Attacks through Adaptive Norm
    Constraints", NeurIPS 2021.
  """
  if not isinstance(norm, str) or norm not in NORMS:
    raise ValueError(f"fmn supports norm 'linf', 'l2' or 'l1', got {norm!r}.")
  steps = check_positive_int("steps", steps)
  alpha_init = check_number("alpha_init", alpha_init, low=0.0, low_open=True)
  if alpha_final is None:
    alpha_final = alpha_init / 100
  else:
    alpha_final = check_number("alpha_final", alpha_final, low=0.0, high=alpha_init,
                               low_open=True)
  gamma_init = check_number("gamma_init", gamma_init, low=0.0, high=1.0, low_open=True,
                            high_open=True)
  gamma_final = check_number("gamma_final", gamma_final, low=0.0, high=gamma_init)
  targeted = check_bool("targeted", targeted)
  config = _Config(norm=norm, steps=steps, alpha_init=alpha_init, alpha_final=alpha_final,
                   gamma_init=gamma_init, gamma_final=gamma_final,
                   loss_fn=_margin_to_target if targeted else _margin_to_cross)
  return Attack(init=functools.partial(_init, config), step=functools.partial(_step, config),
                finalize=functools.partial(_finalize, config), num_steps=steps, norm=norm,
                targeted=targeted, minimum_norm=True,
                name=f"fmn-{norm}-{steps}" + ("-targeted" if targeted else ""), done=_done)
