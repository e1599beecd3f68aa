r"""The Carlini–Wagner L2 attack: a minimum-norm attack by penalised optimisation in tanh space.

For each example the attack minimises, over an unconstrained ``w`` of the shape of ``x``,

.. math::
   \|x_{adv}(w) - x\|_2^2 + c \cdot \max\big(\kappa - m(z(x_{adv}(w))), 0\big), \qquad
   x_{adv}(w) = l + (u - l)\,\frac{\tanh(w) + 1}{2},

with :math:`[l, u]` the box, :math:`z` the logits, :math:`\kappa` the confidence and :math:`m`
the margin that is positive iff the point is adversarial (:func:`jaxrobust.losses.margin`,
:math:`\max_{j \ne y} z_j - z_y`, or :func:`jaxrobust.losses.targeted_margin`,
:math:`z_t - \max_{j \ne t} z_j`). The tanh change of variables keeps every iterate inside the
box without projection. Adam (:func:`optax.adam`) minimises the sum over the batch; the examples
stay independent because Adam acts coordinate-wise.

The trade-off :math:`c` is searched per example over ``binary_search_steps`` rounds of ``steps``
updates each, all in one fixed-length scan of ``binary_search_steps * steps`` iterations. The
first round starts from the clean point (``w = atanh`` of ``x`` mapped to ``(-1, 1)``), every
later one from the last iterate of the round before, and each with a fresh Adam state whose rate
is cosine-annealed over the round from ``learning_rate`` to a thousandth of it. Between rounds,
for each example: if the round ended on an adversarial point, the upper bound of :math:`c` drops
to :math:`c`, otherwise the lower bound rises to :math:`c`; then :math:`c` becomes the midpoint
of its bounds, or :math:`10c` while no upper bound is known, or :math:`c / 10` while no lower
bound is known. The reference implementation restarts every round from the clean point with a
constant rate of 0.01, judges a round by any adversarial iterate and halves :math:`c` towards 0
when no lower bound is known. The departures, each measured with the others in place, on the
L2 problems of ``tests/test_ground_truth_min_norm.py`` (exact minimum :math:`d^*`) and on the
first 100 digits test images of the four models of ``benchmarks/bench_min_norm_found.py``
(a plain and an adversarially trained CNN and MLP; there against the smallest norm that FMN,
FAB and DeepFool find, per point):

* Each round continues from where the last one ended, and the rate is larger at first and
  annealed. In tanh space a coordinate on a face of the box starts at
  :math:`|w| = \operatorname{atanh}(0.999999) \approx 7.25`, where
  :math:`\partial x_{adv} / \partial w \approx 2 \cdot 10^{-6} (u - l)`. Adam's steps are about
  its rate in :math:`w` whatever the gradient's size, so moving such a coordinate by a tenth of
  the box (to :math:`|w| \approx 1.1`) takes about 600 steps at the rate 0.01. 58% of the
  digits' pixels are 0 or 1, and with the reference's restarts and rate (100 steps a round
  from the clean point) the search moved only the others: it found an adversarial point for
  95, 72, 98 and 65 of the 99, 98, 99 and 97 clean-correct points at ``eps = inf``, at a median
  1.37 to 1.74 times the smallest known norm (a miss counted as infinitely far), and reported
  the rest robust. Continuing from the
  last iterate adds the rounds' moves up; the objective of a round is unchanged, and the
  previous round's end, near the minimiser for a neighbouring :math:`c`, is a closer start than
  the clean point (with the rate 0.01: every point found, median 1.05 to 1.18 times the smallest
  known norm). A larger constant rate moves further but never settles on the boundary (0.1:
  median 1.04 to 1.14 times :math:`d^*`); annealed from 0.05 the steps are large first and
  fine at the end: every point found, median 1.000 to 1.002 times the smallest known norm, and
  1.001 to 1.003 times :math:`d^*` (annealed from 0.02: 1.08 to 1.23 on the digits; from 0.1:
  the 90th percentile of :math:`d^*` ratios reaches 1.11 with the logits times :math:`10^{-6}`).
  A fresh Adam state per round restarts the schedule and forgets the previous :math:`c`'s
  gradient scale, which differs by up to ten times (carrying the moments over, with a constant
  rate of 0.01: median 1.75 times :math:`d^*` with the logits times :math:`10^6`).
* A round is judged by its last iterate, the approximate minimiser of the objective for this
  :math:`c`, which is what the search is about (on a linear model it is adversarial exactly when
  :math:`c \ge c^* = 2 d^* / \|w_j - w_y\|_2`). Adam's first, sign-like steps often cross the
  boundary for a :math:`c` far below :math:`c^*` and recross it; judging by such a transient
  crossing sends the search downwards for ever and returns the transient point: 78% of the
  points ended more than 5% above :math:`d^*` (90th percentile 1.40 times it; with the logits
  times :math:`10^{-6}`, median 2.76), 3% with the last-iterate rule (90th percentile 1.004).
  Every iterate is still a candidate for the returned point.
* :math:`c` is in units of squared input distance per logit, so :math:`c^*` moves with the scale
  of the logits. Dividing by 10 mirrors the growth by 10, so the default 9 rounds reach a
  :math:`c^*` up to eight decades either way from ``initial_const``: with the logits multiplied
  by :math:`10^6`, :math:`c = 10^{-3}` is about :math:`10^5` times too large and halving towards
  0 never gets near :math:`c^*` (median 2.20 times :math:`d^*`; 1.001 dividing by 10). The
  confidence :math:`\kappa` is in logit units by definition.

A point that no round makes adversarial is returned unchanged and scored a failure; at
``eps = inf`` :func:`jaxrobust.run` counts such clean-correct points
(``info["counts"]["minimum_norm_not_found"]``).

Iteration ``t`` runs one forward and backward pass at the current iterate; the logits of that
pass also score the iterate (no extra forward pass). So the iterate a round's last update
produces is scored at the first iteration of the next round, before the bounds move; the
backward pass of that iteration then pulls back the squared distance plus the new :math:`c`
times the hinge, which is the gradient the new round's first update needs. Every round thus
makes ``steps`` updates and every point they produce is scored; the last round's final point is
scored by ``finalize``. Over all rounds, the adversarial point (margin at least :math:`\kappa`)
with the smallest L2 norm that lies inside the optional eps-ball is kept.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxrobust import losses as losses_lib
from jaxrobust import projections
from jaxrobust._batch import finite_or_zero, is_success, like_batch, rows_like
from jaxrobust._types import Attack, Budget
from jaxrobust._validation import check_number, check_positive_int
from jaxrobust.attacks._common import MinNormBest, unpack_budget

Array = jax.Array

_NO_UPPER = 1e10  # the upper bound of c before any adversarial point is found ("none yet")
_FINAL_RATE = 1e-3  # Adam's rate at the end of a round, relative to ``learning_rate``


class CarliniWagnerState(NamedTuple):
  """The ``lax.scan`` carry of the Carlini–Wagner L2 attack."""

  w: Array  # [B, ...] work dtype (x's, float32 at least): the iterate in tanh space.
  opt_state: Any  # optax Adam state over w (moments [B, ...]; its step count [] is shared).
  const: Array  # [B] work dtype: the current trade-off c.
  const_lower: Array  # [B] work dtype: largest c known to fail (0 at first).
  const_upper: Array  # [B] work dtype: smallest c known to succeed (_NO_UPPER at first).
  best: MinNormBest  # smallest adversarial point inside the ball (x, norm inf while none).
  t: Array  # [] int32: iterations done.
  limit: Array  # [B] work dtype: the budget's eps, for ``done`` (``inf``: no bound).


class _Config(NamedTuple):
  """The static configuration, chosen by :func:`carlini_wagner_l2` and passed to every piece."""

  steps: int  # Adam updates per round of the binary search
  initial_const: float
  confidence: float
  optimizer: optax.GradientTransformation  # Adam, its rate annealed over each round


def _to_tanh_space(x: Array, lower: Array, upper: Array) -> Array:
  # Shrunk by 0.999999 so that atanh stays finite for x on the faces of the box.
  unit = jnp.clip((x - lower) / (upper - lower) * 2 - 1, -1, 1)
  return jnp.arctanh(unit * 0.999999)


def _to_box(w: Array, lower: Array, upper: Array) -> Array:
  # The clip only absorbs rounding: (tanh(w) + 1) / 2 is already in [0, 1].
  return jnp.clip(lower + (upper - lower) * ((jnp.tanh(w) + 1) / 2), lower, upper)


def _parts(config: _Config, logits_fn, w: Array, x: Array, y: Array, lower: Array, upper: Array,
           target: Array | None):
  """Per-example squared distance and hinge ``[B]``; aux: (point, logits, margin)."""
  x_adv = _to_box(w, lower, upper)
  logits = logits_fn(x_adv)
  if target is None:
    margin = losses_lib.margin(logits, y)
  else:
    margin = losses_lib.targeted_margin(logits, y, target)
  margin = margin.astype(x.dtype)  # the work dtype: float64 inputs keep float64 margins
  dist = jnp.sum(jnp.square(x_adv - x).reshape(x.shape[0], -1), axis=1)
  hinge = jnp.maximum(config.confidence - margin, 0.0)
  return (dist, hinge), (x_adv, logits, margin)


def _score(config: _Config, x: Array, y: Array, eps: Array, target: Array | None,
           best: MinNormBest, x_adv: Array, logits: Array,
           margin: Array) -> tuple[Array, MinNormBest]:
  """Whether ``x_adv`` is adversarial (margin at least the confidence), and ``best`` updated
  with it where it also lies in the eps-ball."""
  adversarial = is_success(logits, y, target) & (margin >= config.confidence)
  size = projections.norm(x_adv - x, "l2")
  return adversarial, best.update(x_adv, size, adversarial & (size <= eps))


def _search(state: CarliniWagnerState, adversarial: Array,
            boundary: Array) -> tuple[Array, Array, Array]:
  """The binary search over ``c`` between two rounds: ``(c, lower bound, upper bound)``.

  A round that ended adversarial lowers the upper bound to its ``c``, one that did not raises
  the lower bound; the next ``c`` is the midpoint, or ``c * 10`` / ``upper / 10`` while one
  bound is unknown. Inside a round (``boundary`` false) everything stays.
  """
  const = state.const
  upper_c = jnp.where(adversarial, jnp.minimum(state.const_upper, const), state.const_upper)
  lower_c = jnp.where(adversarial, state.const_lower, jnp.maximum(state.const_lower, const))
  next_c = jnp.where(upper_c < _NO_UPPER,
                     jnp.where(lower_c > 0, (lower_c + upper_c) / 2, upper_c / 10),
                     jnp.minimum(const * 10, _NO_UPPER))
  return (jnp.where(boundary, next_c, const), jnp.where(boundary, lower_c, state.const_lower),
          jnp.where(boundary, upper_c, state.const_upper))


def _init(config: _Config, logits_fn, x, y, budget: Budget, keys,
          target=None) -> CarliniWagnerState:
  del logits_fn, y, keys, target
  x, eps, lower, upper = unpack_budget(x, budget)
  w0 = _to_tanh_space(x, lower, upper)
  # [B] fields from rows_like, so that they carry x's batch sharding.
  return CarliniWagnerState(
      w=w0, opt_state=config.optimizer.init(w0),
      const=rows_like(x, config.initial_const, x.dtype),
      const_lower=rows_like(x, 0.0, x.dtype),
      const_upper=rows_like(x, _NO_UPPER, x.dtype),
      best=MinNormBest.empty(x), t=jnp.zeros((), jnp.int32), limit=like_batch(eps, x))


def _step(config: _Config, logits_fn, state: CarliniWagnerState, x, y, budget: Budget,
          target=None) -> CarliniWagnerState:
  x, eps, lower, upper = unpack_budget(x, budget)
  (dist, _), pullback, (x_adv, logits, margin) = jax.vjp(
      lambda w: _parts(config, logits_fn, w, x, y, lower, upper, target), state.w, has_aux=True)
  adversarial, best = _score(config, x, y, eps, target, state.best, x_adv, logits, margin)

  # Between two rounds (the scored iterate was the previous round's last): move the bounds of
  # c by whether that last iterate is adversarial (not by any transient crossing), then go on
  # from that iterate with a fresh Adam state (its rate schedule starts again) and the gradient
  # of the new round's objective there. See the module docstring.
  boundary = (state.t % config.steps == 0) & (state.t > 0)
  const, const_lower, const_upper = _search(state, adversarial, boundary)
  (grad,) = pullback((jnp.ones_like(dist), const.astype(dist.dtype)))  # of dist + c * hinge
  grad = finite_or_zero(grad.astype(x.dtype))
  fresh = config.optimizer.init(state.w)
  opt_state = jax.tree.map(lambda new, old: jnp.where(boundary, new, old), fresh,
                           state.opt_state)

  # optax's Adam raises under jax_numpy_dtype_promotion="strict" (its bias correction raises a
  # float to an int32 power), so only this call runs with standard promotion.
  with jax.numpy_dtype_promotion("standard"):
    updates, opt_state = config.optimizer.update(grad, opt_state, state.w)
  w = optax.apply_updates(state.w, updates)
  return CarliniWagnerState(
      w=w, opt_state=opt_state, const=const, const_lower=const_lower, const_upper=const_upper,
      best=best, t=state.t + 1, limit=state.limit)


def _finalize(config: _Config, logits_fn, state: CarliniWagnerState, x, y, budget: Budget,
              target=None) -> Array:
  x, eps, lower, upper = unpack_budget(x, budget)
  _, (x_adv, logits, margin) = _parts(config, logits_fn, state.w, x, y, lower, upper, target)
  _, best = _score(config, x, y, eps, target, state.best, x_adv, logits, margin)
  return best.x


def _done(state: CarliniWagnerState) -> Array:
  """Rows that already hold an adversarial point inside a finite eps-ball.

  ``best`` only ever takes points inside the ball, each smaller than the last, and ``finalize``
  returns it, so the verdict at this eps is final. At ``eps = inf`` (the minimum-norm search,
  e.g. a minimum-norm curve) no row is ever done: the point keeps shrinking.
  """
  return state.best.within(state.limit)


def carlini_wagner_l2(*, steps: int = 100, binary_search_steps: int = 9,
                      initial_const: float = 1e-3, confidence: float = 0.0,
                      learning_rate: float = 5e-2, targeted: bool = False) -> Attack:
  r"""Carlini–Wagner L2: the smallest L2 perturbation found by penalised optimisation.

  Each example minimises, with Adam in the tanh space of the box :math:`[l, u]`,

  .. math::
     \|x_{adv} - x\|_2^2 + c \cdot \max\big(z_y - \max_{j \ne y} z_j + \kappa, 0\big), \qquad
     x_{adv} = l + (u - l)\,\frac{\tanh(w) + 1}{2}

  (targeted: :math:`\max(\max_{j \ne t} z_j - z_t + \kappa, 0)`), and the trade-off :math:`c`
  is tuned per example by binary search over ``binary_search_steps`` rounds of ``steps`` Adam
  updates. Each round goes on from the last iterate of the one before (the first starts at the
  clean point) with a fresh Adam state whose rate is cosine-annealed from ``learning_rate`` to a
  thousandth of it, and is judged by its last iterate: :math:`c` moves to the midpoint between
  the largest value that failed and the smallest that succeeded, grows by 10 while no round has
  succeeded and shrinks by 10 while none has failed (see :mod:`jaxrobust.attacks._carlini_wagner`
  for why these differ from the reference, and what they change on the digits). The whole
  search is one fixed-length scan of ``binary_search_steps * steps`` iterations (one forward and
  backward pass each), so it compiles into one program. Arithmetic runs in the input's float
  dtype (float32 at least; float64 under ``jax_enable_x64``).

  This is a minimum-norm attack: :func:`jaxrobust.run` returns, per example, the adversarial
  point with the smallest L2 norm seen over all rounds, and its ``norm`` (``inf`` where none was
  found). Points count as adversarial when their margin is at least ``confidence`` (at 0: the
  prediction is wrong, or equals the target; non-finite logits never count). ``budget.eps`` is an
  optional upper bound (``inf`` for none): only points inside the eps-ball are kept, and an
  example with none gets ``x`` back (scored a failure).

  At a finite eps the attack declares a row ``done`` once it holds an adversarial point inside
  the ball, so with early exit (:func:`jaxrobust.run`'s default) that row stops there, and that
  first point inside the ball is returned rather than the smallest of all rounds (the verdict is
  the same); at ``eps = inf`` no row is ever done. The search itself never looks at eps.

  Coordinates on a face of the box start where tanh is flat, so they move slowly (an input at a
  corner of the box barely moves at all); since each round goes on from the last, their moves
  add up over the rounds. A point that no round makes adversarial is scored a failure, and at
  ``eps = inf`` counted in ``info["counts"]["minimum_norm_not_found"]``. There is no early
  abort of a round whose loss has stalled (the reference's): the rounds share one fixed-length
  scan, so ending one early would save no computation.

  Args:
    steps: Adam updates per round of the binary search (>= 1).
    binary_search_steps: rounds of the binary search over ``c`` (>= 1).
    initial_const: ``c`` of the first round (> 0).
    confidence: the margin :math:`\kappa` an adversarial point must reach (>= 0); larger values
      give more strongly misclassified, larger perturbations.
    learning_rate: Adam's learning rate in tanh space at the start of each round (> 0),
      cosine-annealed to a thousandth of it by the round's end. Larger rates move further
      (coordinates on a face of the box need many steps) but settle less precisely on the
      decision boundary.
    targeted: drive the prediction to ``target`` (pass ``target=`` to :func:`jaxrobust.run`).

  Returns:
    A minimum-norm :class:`jaxrobust.Attack` (``norm="l2"``) for :func:`jaxrobust.run` or
    :func:`jaxrobust.robustness_curve`.

  Raises:
    ValueError: for an option out of range.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])  # L2 distance to the boundary: 0.1414
    >>> attack = jr.attacks.carlini_wagner_l2(steps=100, binary_search_steps=6)
    >>> run = jax.jit(lambda e: jr.run(attack, logits_fn, x, y, jr.Budget(e), jax.random.key(0)))
    >>> result = run(jnp.inf)  # no bound on the norm
    >>> bool(result.success[0]), bool(0.1414 <= float(result.norm[0]) < 0.1414 * 1.01)  # <1% above
    (True, True)
    >>> bool(run(0.1).success[0])  # eps caps the norm, and no point within 0.1 is adversarial
    False

  References:
    Carlini & Wagner, "Towards Evaluating the Robustness of Neural Networks", IEEE Symposium on
    Security and Privacy 2017.
  """
  steps = check_positive_int("steps", steps)
  binary_search_steps = check_positive_int("binary_search_steps", binary_search_steps)
  learning_rate = check_number("learning_rate", learning_rate, low=0.0, low_open=True)
  config = _Config(
      steps=steps, initial_const=check_number("initial_const", initial_const, low=0.0,
                                              low_open=True),
      confidence=check_number("confidence", confidence, low=0.0),
      optimizer=optax.adam(optax.cosine_decay_schedule(learning_rate, steps,
                                                       alpha=_FINAL_RATE)))
  return Attack(init=functools.partial(_init, config), step=functools.partial(_step, config),
                finalize=functools.partial(_finalize, config),
                num_steps=binary_search_steps * steps, norm="l2", targeted=targeted,
                minimum_norm=True,
                name=f"carlini-wagner-l2-{steps}x{binary_search_steps}"
                + ("-targeted" if targeted else ""), done=_done)
