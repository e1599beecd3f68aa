r"""Honest verdicts: the clean diagnosis before an attack and the score of what it returns.

Every driver (:func:`jaxrobust.run`, the curve kernel, :func:`jaxrobust.evaluate`) judges points
the same way, here:

* before the attack, :func:`clean_diagnosis`: is the clean prediction ``y`` (for a randomized
  model, by a strict majority of draws), and is the input gradient of the cross-entropy finite;
* after it, :func:`score`: the returned point is made finite, put in the box and rounded towards
  ``x`` in ``x``'s dtype (:func:`round_toward`), then ``success`` and ``logits`` are recomputed on
  it by one more forward pass, so a result never claims what re-predicting it would not show.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrobust import losses, projections
from jaxrobust._batch import expand, fold_in, is_correct, is_success, rows_finite
from jaxrobust._types import Attack, AttackResult, Budget
from jaxrobust.engine import randomized

Array = jax.Array

# Tags folded into the per-example keys for the draws of a randomized model that judge the clean
# input and the returned point (distinct from any attack's own use of the keys).
_CLEAN_DRAWS = 0x7C1EA
_SCORE_DRAWS = 0x5C03E


def clean_diagnosis(samples: int, logits_fn: Callable[..., Array], x: Array, y: Array,
                    keys: Array) -> tuple[Array, Array]:
  """The clean verdict and the gradient check, from one forward and one backward pass.

  Returns ``(correct, bad_gradient)``, both ``[B]`` bool: the clean prediction is ``y`` (for a
  randomized model, ``samples > 0``, by a strict majority over ``samples`` draws; see
  :attr:`jaxrobust.Attack.samples`), and the input gradient of the cross-entropy at ``x`` has a
  non-finite entry (not checked for randomized models: ``False``).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> logits_fn = lambda x: jnp.sqrt(x) @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4], [0.0, 0.5]]), jnp.array([0, 0])
    >>> correct, bad = clean_diagnosis(0, logits_fn, x, y, jax.random.split(jax.random.key(0), 2))
    >>> correct.tolist(), bad.tolist()  # sqrt'(0) is infinite
    ([True, False], [False, True])
  """
  if samples:
    return clean_correct_mask(samples, logits_fn, x, y, keys), jnp.zeros(y.shape, bool)

  def total(inputs):
    logits = logits_fn(inputs)
    return jnp.sum(losses.cross_entropy(logits, y).astype(jnp.float32)), logits

  grad, logits = jax.grad(total, has_aux=True)(x)
  return is_correct(logits, y), ~rows_finite(grad)


def gradient_checks(correct: Array, bad_gradient: Array, active: Array | None = None
                    ) -> tuple[dict[str, Array], dict[str, Array]]:
  r"""The non-finite-gradient check of a batch, as ``(flags, counts)`` for ``AttackResult.info``.

  ``counts["non_finite_gradient_points"]`` :math:`= \sum_i a_i c_i g_i` (``[]`` int32) and
  ``flags["non_finite_gradients"]`` says it is positive, with :math:`g_i` "the clean input
  gradient of row :math:`i` has a non-finite entry" (``bad_gradient`` from
  :func:`clean_diagnosis`), :math:`c_i` its clean verdict and :math:`a_i` ``active``. Only
  clean-correct rows count, because only they are attacked: a misclassified point is broken
  whatever its gradient, so a NaN there cannot overestimate robustness. Only active rows count,
  because inactive ones are not examples (the padding of a batch, copies of a real row). The
  clean gradient does not depend on eps, so a curve counts it once, not once per eps. Every
  front door (:func:`jaxrobust.run`, :func:`jaxrobust.robustness_curve`,
  :func:`jaxrobust.evaluate`) reports this count.

  Args:
    correct: ``[B]`` bool clean verdicts.
    bad_gradient: ``[B]`` bool non-finite clean gradients.
    active: optional ``[B]`` bool rows that are data (``None``: all).

  Returns:
    ``({"non_finite_gradients": [] bool}, {"non_finite_gradient_points": [] int32})``.

  Examples:
    >>> import jax.numpy as jnp
    >>> correct, bad = jnp.array([True, True, False, True]), jnp.array([True, False, True, True])
    >>> flags, counts = gradient_checks(correct, bad, active=jnp.array([True, True, True, False]))
    >>> int(counts["non_finite_gradient_points"]), bool(flags["non_finite_gradients"])
    (1, True)
  """
  counted = correct & bad_gradient
  if active is not None:
    counted = counted & active
  count = jnp.sum(counted, dtype=jnp.int32)
  return {"non_finite_gradients": count > 0}, {"non_finite_gradient_points": count}


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


def score(attack: Attack, logits_fn: Callable[..., Array], x_input: Array, x: Array,
          x_adv: Array, y: Array, budget: Budget, keys: Array, target: Array | None, *,
          todo: Array, clean_correct: Array, bad_gradient: Array | None,
          info: dict, logits_of_todo: Callable[[Array], Array] | None = None,
          active: Array | None = None) -> tuple[AttackResult, Array]:
  """The :class:`jaxrobust.AttackResult` of the point an attack returned, and ``broken`` (``[B]``
  bool: the clean prediction or the prediction on the returned point is not ``y``).

  ``x_input`` is the user's input (its dtype is the result's), ``x`` the same in the work dtype;
  ``todo`` the rows the attack was run on (the others get ``x_adv = x``). A non-finite returned
  row falls back to ``x`` and is counted (``non_finite_adversarials``); ``bad_gradient`` (from
  :func:`clean_diagnosis`) is counted by :func:`gradient_checks` over the clean-correct rows of
  ``active`` (the rows that are data; ``None``: all).
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
  x_adv = round_toward(x_adv, x_input)
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
  size = projections.norm(x_adv.astype(x.dtype) - x, attack.norm)
  if attack.minimum_norm:
    size = jnp.where(success, size, jnp.inf)
  info = dict(info)
  flags, counts = dict(info.pop("flags", {})), dict(info.pop("counts", {}))
  counts["non_finite_adversarials"] = jnp.sum(todo & ~finite, dtype=jnp.int32)
  flags["non_finite_adversarials"] = counts["non_finite_adversarials"] > 0
  if bad_gradient is not None:
    gradient_flags, gradient_counts = gradient_checks(clean_correct, bad_gradient, active)
    flags.update(gradient_flags)
    counts.update(gradient_counts)
  if attack.minimum_norm:
    missed = todo & ~success & jnp.isinf(jnp.asarray(budget.eps))
    counts["minimum_norm_not_found"] = jnp.sum(missed, dtype=jnp.int32)
    flags["minimum_norm_not_found"] = counts["minimum_norm_not_found"] > 0
  info.update(flags=flags, counts=counts)
  return AttackResult(x_adv=x_adv, success=success, norm=size, logits=logits, info=info), broken
