r"""Honest verdicts: the clean diagnosis before an attack and the score of what it returns.

Every driver (:func:`jaxrobust.run`, the curve kernel, :func:`jaxrobust.evaluate`) judges points
the same way, here:

* before the attack, :func:`clean_diagnosis`: is the clean prediction ``y`` (for a randomized
  model, by a strict majority of draws), and what the same forward and backward pass show of
  each row (:class:`CleanFindings`: a non-finite or exactly zero input gradient of the
  cross-entropy, non-finite logits, outputs that are probabilities), which
  :func:`clean_checks` turns into every result's reliability flags and counts;
* after it, :func:`score`: the returned point is made finite, put in the box and rounded towards
  ``x`` in ``x``'s dtype (:func:`round_toward`), then ``success`` and ``logits`` are recomputed on
  it by one more forward pass, so a result never claims what re-predicting it would not show.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrobust import losses, projections
from jaxrobust._batch import expand, fold_in, is_correct, is_success, like_batch, rows_finite
from jaxrobust._types import Attack, AttackResult, Budget
from jaxrobust.engine import randomized
from jaxrobust.metrics import checks as checks_lib

Array = jax.Array

# Tags folded into the per-example keys for the draws of a randomized model that judge the clean
# input and the returned point (distinct from any attack's own use of the keys).
_CLEAN_DRAWS = 0x7C1EA
_SCORE_DRAWS = 0x5C03E


class CleanFindings(NamedTuple):
  """What the clean forward and backward pass show of each row, beside its verdict (``[B]`` bool
  each; all ``False`` for a randomized model, whose clean pass is a vote without gradients).

  Attributes:
    non_finite_gradient: the cross-entropy's input gradient has a NaN/Inf entry.
    zero_gradient: that gradient is exactly zero everywhere (saturated or masked: a
      cross-entropy attack cannot move from there).
    non_finite_logits: a logit is NaN/Inf (the row is never clean-correct).
    probability_row: the outputs lie in ``[0, 1]`` and sum to 1
      (:func:`jaxrobust.metrics.checks.probability_rows`).
  """

  non_finite_gradient: Array
  zero_gradient: Array
  non_finite_logits: Array
  probability_row: Array


def clean_diagnosis(samples: int, logits_fn: Callable[..., Array], x: Array, y: Array,
                    keys: Array) -> tuple[Array, CleanFindings | None]:
  """The clean verdict and :class:`CleanFindings`, from one forward and one backward pass.

  Returns ``(correct, findings)``: ``correct`` (``[B]`` bool) says the clean prediction is ``y``
  (for a randomized model, ``samples > 0``, by a strict majority over ``samples`` draws; see
  :attr:`jaxrobust.Attack.samples`); ``findings`` what the cross-entropy's input gradient at
  ``x`` and the logits show of each row. A randomized model's findings are ``None``: one draw's
  gradient says nothing of the expectation the attacks ascend, so its results carry none of
  :func:`clean_checks`' flags and a report's checklist says "n/a" there, not "pass".

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> logits_fn = lambda x: jnp.sqrt(x) @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4], [0.0, 0.5]]), jnp.array([0, 0])
    >>> correct, found = clean_diagnosis(0, logits_fn, x, y, jax.random.split(jax.random.key(0), 2))
    >>> correct.tolist(), found.non_finite_gradient.tolist()  # sqrt'(0) is infinite
    ([True, False], [False, True])
  """
  if samples:
    return clean_correct_mask(samples, logits_fn, x, y, keys), None

  def total(inputs):
    logits = logits_fn(inputs)
    return jnp.sum(losses.cross_entropy(logits, y).astype(jnp.float32)), logits

  grad, logits = jax.grad(total, has_aux=True)(x)
  flat = grad.reshape(grad.shape[0], -1)
  found = CleanFindings(non_finite_gradient=~rows_finite(grad),
                        zero_gradient=jnp.all(flat == 0, axis=1),
                        non_finite_logits=~rows_finite(logits),
                        probability_row=checks_lib.probability_rows(logits))
  return is_correct(logits, y), found


def clean_checks(correct: Array, findings: CleanFindings, active: Array | None = None
                 ) -> tuple[dict[str, Array], dict[str, Array]]:
  r"""The reliability checks of a batch's clean pass, as ``(flags, counts)`` for
  ``AttackResult.info``. With :math:`a_i` ``active`` (the rows that are data: not the padding of
  a batch, not copies of a real row) and :math:`c_i` the clean verdict:

  * ``non_finite_gradient_points`` :math:`= \sum_i a_i c_i g_i`, :math:`g_i` "the clean input
    gradient has a non-finite entry"; flag ``non_finite_gradients``;
  * ``zero_gradient_points`` :math:`= \sum_i a_i c_i z_i`, :math:`z_i` "that gradient is exactly
    zero" (AutoAttack's check; a saturated or masked model); flag ``zero_gradients``;
  * ``non_finite_logits`` :math:`= \sum_i a_i n_i`, :math:`n_i` "a clean logit is NaN/Inf" (such
    a row is never correct, so it is exactly what the count reports); the flag of the same name;
  * flag ``probability_outputs``: every active row's outputs lie in :math:`[0, 1]` and sum to 1
    (softmax outputs flatten the losses' gradients: pass logits).

  Only clean-correct rows count for the gradients, because only they are attacked: a
  misclassified point is broken whatever its gradient, so a NaN there cannot overestimate
  robustness. The clean pass does not depend on eps, so a curve counts it once, not once per
  eps. Every front door (:func:`jaxrobust.run`, :func:`jaxrobust.robustness_curve`,
  :func:`jaxrobust.evaluate`) reports these, for every attack on a deterministic model.

  Args:
    correct: ``[B]`` bool clean verdicts.
    findings: the batch's :class:`CleanFindings`.
    active: optional ``[B]`` bool rows that are data (``None``: all).

  Returns:
    ``(flags, counts)``: ``[]`` bool flags and ``[]`` int32 counts by name.

  Examples:
    >>> import jax.numpy as jnp
    >>> correct = jnp.array([True, True, False, True])
    >>> found = CleanFindings(jnp.array([True, False, True, True]), jnp.zeros(4, bool),
    ...                       jnp.zeros(4, bool), jnp.zeros(4, bool))
    >>> flags, counts = clean_checks(correct, found, active=jnp.array([True, True, True, False]))
    >>> int(counts["non_finite_gradient_points"]), bool(flags["non_finite_gradients"])
    (1, True)
  """
  real = jnp.ones_like(correct) if active is None else active
  attacked = correct & real
  count = lambda rows: jnp.sum(rows, dtype=jnp.int32)
  counts = {"non_finite_gradient_points": count(attacked & findings.non_finite_gradient),
            "zero_gradient_points": count(attacked & findings.zero_gradient),
            "non_finite_logits": count(real & findings.non_finite_logits)}
  probability = jnp.all(findings.probability_row | ~real) & jnp.any(real)
  flags = {"non_finite_gradients": counts["non_finite_gradient_points"] > 0,
           "zero_gradients": counts["zero_gradient_points"] > 0,
           "non_finite_logits": counts["non_finite_logits"] > 0,
           "probability_outputs": probability}
  return flags, counts


def clean_correct_mask(samples: int, logits_fn: Callable[..., Array], x: Array, y: Array,
                       keys: Array) -> Array:
  """``[B]`` bool: the clean prediction is ``y``; for a randomized model (``samples > 0``, see
  :attr:`jaxrobust.Attack.samples`), by a strict majority over ``samples`` draws."""
  if samples:
    counts, _ = randomized.votes(logits_fn, x, fold_in(keys, _CLEAN_DRAWS), samples)
    return randomized.majority_correct(counts, y, samples)
  return is_correct(logits_fn(x), y)


def round_toward(x_adv: Array, x: Array) -> Array:
  """``x_adv`` (work dtype) in ``x``'s dtype, rounded towards ``x`` where rounding to nearest
  would move it away from ``x``: every coordinate of ``result - x`` is then no larger than that of
  ``x_adv - x``, so the point stays inside any Lp ball around ``x`` and inside the box.

  Examples:
    >>> import jax.numpy as jnp
    >>> x = jnp.array([[0.5]], jnp.bfloat16)
    >>> round_toward(jnp.array([[0.5 + 0.0031]]), x).astype(jnp.float32).tolist()
    [[0.5]]
  """
  if x_adv.dtype == x.dtype:
    return x_adv
  nearest = x_adv.astype(x.dtype)
  reference = x.astype(x_adv.dtype)
  farther = jnp.abs(nearest.astype(x_adv.dtype) - reference) > jnp.abs(x_adv - reference)
  return jnp.where(farther, jnp.nextafter(nearest, x), nearest)


MARGIN = 2.0**-20
"""How far inside its L2 or L1 ball (relative to ``eps``) :func:`inside_ball` puts a row whose
norm comes within this of ``eps``: more than a norm's rounding differs between two orders of
summation, so that any program, and the user's own check, finds the point inside."""

SHRINKS = (2.0**-19, 2.0**-11)
"""The relative distances below ``eps`` to which :func:`inside_ball` scales such a row, one per
try (the first almost always suffices: the rounding of ``x + d`` is what can undo it)."""


def inside_ball(x_adv: Array, x: Array, eps: Array, norm: str) -> Array:
  r"""``x_adv`` with its perturbation inside the ``eps``-ball *as computed*: afterwards
  ``projections.norm(result - x, norm) <= eps`` holds in ``x``'s floating-point arithmetic.

  A projection computed in floats can land a few units in the last place outside the ball:
  ``x + eps`` rounds up as often as down (Linf PGD on a ``[0, 255]`` box at eps 8 returned
  ``max |x_adv - x| = 8.0000076``), and an L2 or L1 rescaling by ``eps / ||d||`` leaves the
  rounding of the norm and of ``x + d`` (Square L2 at eps 0.5: 0.50000024). Here

  * Linf: each coordinate is clipped to ``[fl(x - eps), fl(x + eps)]``, then stepped one float
    towards ``x`` where ``|fl(result - x)| > eps`` (a bound ``fl(x + eps)`` is within half a unit
    of the real sum, so the float below it is not above it, and rounding is monotone): exact;
  * L2, L1: a norm is a sum, whose rounding depends on the order of summation, which XLA
    chooses per program (fusion, vectorisation, the batch's layout over devices): the same
    array's norm can differ by a unit in the last place between two places of one program. So a
    row whose norm exceeds ``eps (1 - MARGIN)`` (:data:`MARGIN`, ``2**-20``; a point on the sphere
    does) is scaled to ``eps (1 - s)``, ``s`` the first of :data:`SHRINKS` that brings it below
    that (the first, ``2**-19``, almost always does; the second, ``2**-11``, where the rounding of
    ``x + d`` is large against ``eps``, e.g. an eps of a few units on a ``[0, 255]`` box): a few
    times ``2**-20`` of ``eps`` inside, more than any order of summation changes a norm.

  Every check reads the values as stored, behind ``jax.lax.optimization_barrier``: otherwise XLA
  may simplify ``(x + eps) - x`` to ``eps`` and pass a point that is outside. A scaled row stays
  between ``x`` and ``x_adv`` coordinate by coordinate, so inside any box that holds both; other
  rows are returned unchanged, bit for bit. :func:`score` still falls back to ``x`` for a row
  that is outside after these tries (never seen), so no result claims a point outside its ball.

  Args:
    x_adv, x: ``[B, ...]`` in the same floating dtype.
    eps: ``[B]`` radii (``inf``: no ball).
    norm: ``"linf"``, ``"l2"`` or ``"l1"``.

  Examples:
    >>> import jax.numpy as jnp
    >>> x = jnp.array([[200.3, 17.9]])
    >>> x_adv = jnp.array([[208.30002, 9.9]])  # fl(200.3 + 8), one float above the real sum
    >>> float(jnp.max(jnp.abs(x_adv - x))) > 8
    True
    >>> float(jnp.max(jnp.abs(inside_ball(x_adv, x, jnp.array([8.0]), "linf") - x))) <= 8
    True
  """
  radius = expand(eps.astype(x.dtype), x.ndim)
  if norm == "linf":
    out = jax.lax.optimization_barrier(jnp.clip(x_adv, x - radius, x + radius))
    return jnp.where(jnp.abs(out - x) > radius, jnp.nextafter(out, x), out)
  eps = eps.astype(x.dtype)
  for shrink in SHRINKS:  # static: a few element-wise passes, no loop around the model
    x_adv = jax.lax.optimization_barrier(x_adv)
    size = projections.norm(x_adv - x, norm)
    over = size > eps * (1 - MARGIN)
    scale = jnp.where(over, eps / jnp.where(over, size, 1) * (1 - shrink), 1)
    x_adv = jnp.where(expand(over, x.ndim), x + (x_adv - x) * expand(scale, x.ndim), x_adv)
  return jax.lax.optimization_barrier(x_adv)


def score(attack: Attack, logits_fn: Callable[..., Array], x_input: Array, x: Array,
          x_adv: Array, y: Array, budget: Budget, keys: Array, target: Array | None, *,
          todo: Array, clean_correct: Array, findings: CleanFindings | None,
          info: dict, logits_of_todo: Callable[[Array], Array] | None = None,
          active: Array | None = None) -> tuple[AttackResult, Array]:
  """The :class:`jaxrobust.AttackResult` of the point an attack returned, and ``broken`` (``[B]``
  bool: the clean prediction or the prediction on the returned point is not ``y``).

  ``x_input`` is the user's input (its dtype is the result's), ``x`` the same in the work dtype;
  ``todo`` the rows the attack was run on (the others get ``x_adv = x``). A non-finite returned
  row falls back to ``x`` and is counted (``non_finite_adversarials``), and so is an attacked row
  whose logits at the returned point are NaN/Inf (``non_finite_adversarial_logits``: scored as
  broken, since such logits are never a correct prediction); ``findings`` (from
  :func:`clean_diagnosis`) become :func:`clean_checks`' flags and counts over ``active`` (the rows
  that are data; ``None``: all).
  A minimum-norm attack's ``todo`` rows that come back without success at ``eps = inf`` are
  counted (``minimum_norm_not_found``): with no budget, "no adversarial point" is the attack's
  failure, not a verdict of robustness (at a finite eps it is the verdict, and is not counted).

  ``logits_of_todo(x_adv)``, when given, computes the logits of the ``todo`` rows only (zeros
  elsewhere, e.g. :func:`jaxrobust.engine.compaction.map_rows`), for callers that read only
  ``broken`` and ``success`` of those rows (curves, ensemble members): a row outside ``todo``
  then gets ``broken`` = its clean verdict (what re-predicting ``x`` gives) and ``success`` =
  ``broken`` (untargeted) or ``False`` (targeted), and zero logits.
  """
  x_adv = x_adv.astype(x.dtype)
  finite = rows_finite(x_adv)
  lower, upper = (jnp.asarray(b, x.dtype) for b in (budget.lower, budget.upper))
  x_adv = jnp.where(expand(todo & finite, x.ndim), jnp.clip(x_adv, lower, upper), x)
  eps = like_batch(jnp.broadcast_to(jnp.asarray(budget.eps, x.dtype), x.shape[:1]), x)
  x_adv = round_toward(inside_ball(x_adv, x, eps, attack.norm), x_input)
  # Rounding towards x keeps every coordinate's distance, so the ball still holds; a row that
  # float rounding still leaves outside (see inside_ball) falls back to x. The norm reported is
  # this one computation of it, so result.norm <= eps holds exactly.
  size = projections.norm(x_adv.astype(x.dtype) - x, attack.norm)
  outside = size > eps
  x_adv = jnp.where(expand(outside, x.ndim), x_input, x_adv)
  size = jnp.where(outside, jnp.zeros_like(size), size)
  if attack.samples:
    counts, logits = randomized.votes(logits_fn, x_adv, fold_in(keys, _SCORE_DRAWS),
                                      attack.samples)
    success = randomized.majority_success(counts, y, target, attack.samples)
    broken = randomized.majority_success(counts, y, None, attack.samples)
    # A row returned unchanged keeps its clean verdict (a second, independent vote on the same
    # input could flip it): at eps 0 robust accuracy is exactly the clean accuracy.
    unchanged = jnp.all((x_adv == x_input.astype(x_adv.dtype)).reshape(x.shape[0], -1), axis=1)
    broken = broken & ~unchanged
    if target is None:
      success = success & ~unchanged
  else:
    logits = logits_fn(x_adv) if logits_of_todo is None else logits_of_todo(x_adv)
    success = is_success(logits, y, target)
    broken = ~is_correct(logits, y)
    if logits_of_todo is not None:
      success, broken = success & todo, broken & todo
  clean_wrong = ~clean_correct
  broken = broken | clean_wrong
  if target is None:
    success = success | clean_wrong
  if attack.minimum_norm:
    size = jnp.where(success, size, jnp.inf)
  info = dict(info)
  flags, counts = dict(info.pop("flags", {})), dict(info.pop("counts", {}))
  counts["non_finite_adversarials"] = jnp.sum(todo & ~finite, dtype=jnp.int32)
  flags["non_finite_adversarials"] = counts["non_finite_adversarials"] > 0
  counts["non_finite_adversarial_logits"] = jnp.sum(todo & ~rows_finite(logits), dtype=jnp.int32)
  flags["non_finite_adversarial_logits"] = counts["non_finite_adversarial_logits"] > 0
  if findings is not None:
    clean_flags, clean_counts = clean_checks(clean_correct, findings, active)
    flags.update(clean_flags)
    counts.update(clean_counts)
  if attack.minimum_norm:
    missed = todo & ~success & jnp.isinf(jnp.asarray(budget.eps))
    counts["minimum_norm_not_found"] = jnp.sum(missed, dtype=jnp.int32)
    flags["minimum_norm_not_found"] = counts["minimum_norm_not_found"] > 0
  info.update(flags=flags, counts=counts)
  return AttackResult(x_adv=x_adv, success=success, norm=size, logits=logits, info=info), broken
