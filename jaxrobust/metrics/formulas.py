"""Robustness metrics: accuracies, attack success, perturbation sizes, certified accuracy, AUC.

Every function here is pure and traceable: it runs inside ``jax.jit``, ``jax.vmap``,
``lax.scan`` and ``jax.shard_map`` and never loops over examples in Python. Strings (``norm``,
``over``) and shapes are static; everything else is data.

Conventions shared by all metrics:

* ``pred`` is an integer array ``[B]`` (the argmax of the logits). The value ``-1`` means "no
  prediction" (an abstention, or non-finite logits). It never equals a label or a target, so it
  always counts as a wrong prediction.
* ``y`` (labels) and ``target`` are integer arrays ``[B]``; they are cast to the dtype of ``pred``.
* ``mask`` is an optional bool array ``[B]`` (``None`` means all ``True``). Examples with
  ``mask == False`` (padding) are excluded from every numerator and denominator, whatever values
  they hold (even NaN inputs).
* A ratio whose denominator is zero is NaN (for instance any metric of an all-``False`` mask).
* Ratios are returned as float32 scalars; perturbation norms are computed in float32.

These conventions are implemented once, in :mod:`jaxrobust.metrics.conventions`, for the formulas
and the reducers alike.

For evaluation over many batches or devices, :class:`jaxrobust.metrics.Counts` accumulates the
sums behind these metrics (see :mod:`jaxrobust.metrics.reducers`).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxrobust import projections
from jaxrobust._validation import check_min_norms, check_values
from jaxrobust.metrics.conventions import (array_namespace, as_predictions, count_true, int_like,
                                           masked_sum, matches, ratio, row_mask)

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

_OVER = ("all", "clean_correct")


# ------------------------------------------------------------------------------------------------
# Pieces of the metrics that the reducers share.


def _lp_norm(v: Array, norm: str) -> Array:
  """Per-example ``norm`` of ``v [B, ...]`` over all non-batch axes, in float32: ``[B]``."""
  return projections.norm(jnp.asarray(v).astype(jnp.float32), norm)


def perturbation_sizes(x: ArrayLike, x_adv: ArrayLike, norm: str, batch: int
                       ) -> tuple[Array, Array]:
  """``(||x_adv - x||_p, ||x_adv - x||_p / ||x||_p)``, each ``[B]`` float32.

  The relative size is 0 where the perturbation is 0 (even if ``x == 0``) and ``inf`` where
  ``x == 0`` but the perturbation is not.
  """
  projections.check_norm(norm)
  x = jnp.asarray(x)
  x_adv = jnp.asarray(x_adv)
  if x.shape != x_adv.shape:
    raise ValueError(f"x and x_adv must have the same shape, got {x.shape} and {x_adv.shape}.")
  if x.ndim == 0 or x.shape[0] != batch:
    raise ValueError(f"x must have shape [{batch}, ...], got {x.shape}.")
  x = x.astype(jnp.float32)
  size = _lp_norm(x_adv.astype(jnp.float32) - x, norm)
  scale = _lp_norm(x, norm)
  rel = jnp.where(size == 0, 0.0, size / scale)  # size / 0 = inf for a nonzero size.
  return size, rel


def success_flags(pred_adv: Array, y: Array, target: Optional[Array]) -> Array:
  """Per-example attack success ``[B]``: ``pred_adv != y`` untargeted (a missing prediction
  succeeds), ``pred_adv == target`` targeted (a missing prediction does not)."""
  if target is None:
    return ~matches(pred_adv, y)
  return matches(pred_adv, target)


# ------------------------------------------------------------------------------------------------
# Metrics.


def accuracy(pred: ArrayLike, y: ArrayLike, mask: Optional[ArrayLike] = None) -> Array:
  """Clean accuracy: the fraction of examples predicted correctly.

  ``acc = sum_i m_i [pred_i = y_i] / sum_i m_i``, where ``pred_i = -1`` is always wrong.

  Args:
    pred: ``[B]`` int predictions (``-1`` = no prediction).
    y: ``[B]`` int labels.
    mask: optional ``[B]`` bool; ``False`` excludes an example.

  Returns:
    A float32 scalar; NaN if no example is selected by ``mask``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> float(metrics.accuracy(jnp.array([0, 1, -1, 3]), jnp.array([0, 1, 2, 2])))
    0.5
  """
  pred = as_predictions(pred, "pred")
  y = int_like(y, pred, "y")
  m = row_mask(mask, pred.shape[0])
  return ratio(count_true(matches(pred, y) & m), count_true(m))


def robust_accuracy(
  pred_clean: ArrayLike, pred_adv: ArrayLike, y: ArrayLike, mask: Optional[ArrayLike] = None
) -> Array:
  """Robust accuracy: the fraction of all examples correct on both the clean and adversarial input.

  ``RA = sum_i m_i [pred_clean_i = y_i] [pred_adv_i = y_i] / sum_i m_i``.

  Args:
    pred_clean: ``[B]`` int predictions on the clean inputs (``-1`` = no prediction).
    pred_adv: ``[B]`` int predictions on the adversarial inputs.
    y: ``[B]`` int labels.
    mask: optional ``[B]`` bool; ``False`` excludes an example.

  Returns:
    A float32 scalar; NaN if no example is selected by ``mask``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> y = jnp.array([0, 1, 2, 3])
    >>> float(metrics.robust_accuracy(jnp.array([0, 1, 2, 0]), jnp.array([0, 2, 2, 3]), y))
    0.5

  References:
    Croce et al., "RobustBench: a standardized adversarial robustness benchmark", NeurIPS 2021
    Datasets and Benchmarks.
  """
  pc = as_predictions(pred_clean, "pred_clean")
  pa = int_like(pred_adv, pc, "pred_adv")
  y = int_like(y, pc, "y")
  m = row_mask(mask, pc.shape[0])
  return ratio(count_true(matches(pc, y) & matches(pa, y) & m), count_true(m))


def conditional_robust_accuracy(
  pred_clean: ArrayLike, pred_adv: ArrayLike, y: ArrayLike, mask: Optional[ArrayLike] = None
) -> Array:
  """Robust accuracy among the examples that are correct on the clean input.

  ``CRA = sum_i m_i [pred_clean_i = y_i] [pred_adv_i = y_i] / sum_i m_i [pred_clean_i = y_i]``.

  Args:
    pred_clean: ``[B]`` int predictions on the clean inputs (``-1`` = no prediction).
    pred_adv: ``[B]`` int predictions on the adversarial inputs.
    y: ``[B]`` int labels.
    mask: optional ``[B]`` bool; ``False`` excludes an example.

  Returns:
    A float32 scalar; NaN if no selected example is correct on the clean input.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> y = jnp.array([0, 1, 2, 3])
    >>> float(metrics.conditional_robust_accuracy(
    ...     jnp.array([0, 1, 2, 0]), jnp.array([0, 2, 2, 3]), y))
    0.6666666865348816
  """
  pc = as_predictions(pred_clean, "pred_clean")
  pa = int_like(pred_adv, pc, "pred_adv")
  y = int_like(y, pc, "y")
  m = row_mask(mask, pc.shape[0])
  clean = matches(pc, y) & m
  return ratio(count_true(clean & matches(pa, y)), count_true(clean))


def adversarial_accuracy(
  pred_clean: ArrayLike, pred_adv: ArrayLike, y: ArrayLike, mask: Optional[ArrayLike] = None
) -> Array:
  """Adversarial accuracy: how often the attack leaves a correct prediction unchanged.

  ``AA = sum_i m_i [pred_adv_i = pred_clean_i] [pred_clean_i = y_i]
  / sum_i m_i [pred_clean_i = y_i]``.

  On clean-correct examples ``pred_adv = pred_clean`` is the same as ``pred_adv = y``, so this
  equals :func:`conditional_robust_accuracy`; both names are kept for readers of either
  literature.

  Args:
    pred_clean: ``[B]`` int predictions on the clean inputs (``-1`` = no prediction).
    pred_adv: ``[B]`` int predictions on the adversarial inputs.
    y: ``[B]`` int labels.
    mask: optional ``[B]`` bool; ``False`` excludes an example.

  Returns:
    A float32 scalar; NaN if no selected example is correct on the clean input.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> y = jnp.array([0, 1, 2, 3])
    >>> float(metrics.adversarial_accuracy(jnp.array([0, 1, 2, 3]), jnp.array([0, 1, 0, 0]), y))
    0.5
  """
  return conditional_robust_accuracy(pred_clean, pred_adv, y, mask)


def attack_success_rate(
  pred_clean: ArrayLike,
  pred_adv: ArrayLike,
  y: ArrayLike,
  target: Optional[ArrayLike] = None,
  over: str = "all",
  mask: Optional[ArrayLike] = None,
) -> Array:
  """Attack success rate: the fraction of examples on which the attack reached its goal.

  Success is ``s_i = [pred_adv_i != y_i]`` for an untargeted attack (``pred_adv_i = -1`` is a
  success) and ``s_i = [pred_adv_i = target_i]`` for a targeted one (``-1`` is never a success).
  With ``over="all"``: ``ASR = sum_i m_i s_i / sum_i m_i`` (a clean-misclassified example is an
  untargeted success). With ``over="clean_correct"``:
  ``ASR = sum_i m_i s_i [pred_clean_i = y_i] / sum_i m_i [pred_clean_i = y_i]``.

  Args:
    pred_clean: ``[B]`` int predictions on the clean inputs (``-1`` = no prediction).
    pred_adv: ``[B]`` int predictions on the adversarial inputs.
    y: ``[B]`` int labels.
    target: optional ``[B]`` int target classes; ``None`` for an untargeted attack.
    over: ``"all"`` or ``"clean_correct"`` (static).
    mask: optional ``[B]`` bool; ``False`` excludes an example.

  Returns:
    A float32 scalar; NaN if the denominator is zero.

  Raises:
    ValueError: if ``over`` is not ``"all"`` or ``"clean_correct"``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> pc, pa, y = jnp.array([0, 1, 0, 3]), jnp.array([1, 1, 0, -1]), jnp.array([0, 1, 2, 3])
    >>> float(metrics.attack_success_rate(pc, pa, y))
    0.75
    >>> float(metrics.attack_success_rate(pc, pa, y, over="clean_correct"))
    0.6666666865348816
    >>> float(metrics.attack_success_rate(pc, pa, y, target=jnp.array([1, 0, 0, 0])))
    0.5
  """
  if over not in _OVER:
    raise ValueError(f"over must be one of {_OVER}, got {over!r}.")
  pc = as_predictions(pred_clean, "pred_clean")
  pa = int_like(pred_adv, pc, "pred_adv")
  y = int_like(y, pc, "y")
  t = None if target is None else int_like(target, pc, "target")
  m = row_mask(mask, pc.shape[0])
  if over == "clean_correct":
    m = m & matches(pc, y)
  return ratio(count_true(success_flags(pa, y, t) & m), count_true(m))


def empirical_robustness(
  x: ArrayLike,
  x_adv: ArrayLike,
  pred_clean: ArrayLike,
  pred_adv: ArrayLike,
  norm: str,
  mask: Optional[ArrayLike] = None,
) -> Array:
  """Empirical robustness: the mean relative size of the perturbations that flip the prediction.

  With ``f_i = [pred_adv_i != pred_clean_i]`` (a change to or from ``-1`` is a flip; two ``-1``
  are not), ``ER = sum_i m_i f_i ||x_adv_i - x_i||_p / ||x_i||_p / sum_i m_i f_i``; norms are
  over all non-batch axes.

  A flipped example with ``x_i = 0`` contributes ``inf`` (so ``ER = inf``) unless its perturbation
  is also 0, in which case it contributes 0. Such examples never produce NaN and never affect the
  result when not flipped or masked out.

  Args:
    x: ``[B, ...]`` clean inputs.
    x_adv: ``[B, ...]`` adversarial inputs.
    pred_clean: ``[B]`` int predictions on ``x`` (``-1`` = no prediction).
    pred_adv: ``[B]`` int predictions on ``x_adv``.
    norm: ``"linf"``, ``"l2"`` or ``"l1"`` (static).
    mask: optional ``[B]`` bool; ``False`` excludes an example.

  Returns:
    A float32 scalar; NaN if no selected prediction flipped.

  Raises:
    ValueError: if ``norm`` is not one of ``"linf"``, ``"l2"``, ``"l1"``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> x = jnp.array([[3.0, 4.0], [1.0, 0.0], [2.0, 0.0]])
    >>> x_adv = jnp.array([[3.0, 4.0], [1.0, 1.0], [2.0, 1.0]])
    >>> pc, pa = jnp.array([0, 1, 1]), jnp.array([0, 2, 0])
    >>> float(metrics.empirical_robustness(x, x_adv, pc, pa, "l2"))
    0.75

  References:
    Moosavi-Dezfooli, Fawzi, Frossard, "DeepFool: a simple and accurate method to fool deep
    neural networks", CVPR 2016 (the robustness measure rho_adv).
  """
  pc = as_predictions(pred_clean, "pred_clean")
  pa = int_like(pred_adv, pc, "pred_adv")
  m = row_mask(mask, pc.shape[0])
  _, rel = perturbation_sizes(x, x_adv, norm, pc.shape[0])
  flipped = (pa != pc) & m
  return ratio(masked_sum(flipped, rel), count_true(flipped))


def mean_perturbation(
  x: ArrayLike, x_adv: ArrayLike, success: ArrayLike, norm: str, mask: Optional[ArrayLike] = None
) -> Array:
  """Mean size of the successful perturbations.

  ``MP = sum_i m_i s_i ||x_adv_i - x_i||_p / sum_i m_i s_i``, norms over all non-batch axes.

  Args:
    x: ``[B, ...]`` clean inputs.
    x_adv: ``[B, ...]`` adversarial inputs.
    success: ``[B]`` bool, whether the attack succeeded on each example.
    norm: ``"linf"``, ``"l2"`` or ``"l1"`` (static).
    mask: optional ``[B]`` bool; ``False`` excludes an example.

  Returns:
    A float32 scalar; NaN if no selected attack succeeded.

  Raises:
    ValueError: if ``norm`` is not one of ``"linf"``, ``"l2"``, ``"l1"``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> x = jnp.zeros((3, 2))
    >>> x_adv = jnp.array([[0.5, 0.0], [0.0, -1.5], [9.0, 9.0]])
    >>> float(metrics.mean_perturbation(x, x_adv, jnp.array([True, True, False]), "linf"))
    1.0
  """
  success = jnp.asarray(success)
  if success.ndim != 1:
    raise ValueError(f"success must have shape [B], got {success.shape}.")
  s = success.astype(bool) & row_mask(mask, success.shape[0])
  size, _ = perturbation_sizes(x, x_adv, norm, success.shape[0])
  return ratio(masked_sum(s, size), count_true(s))


def certified_accuracy(
  radius: ArrayLike, pred: ArrayLike, y: ArrayLike, r: ArrayLike, mask: Optional[ArrayLike] = None
) -> Array:
  """Certified accuracy at radius ``r``: correct and certified at least as far as ``r``.

  ``CA(r) = sum_i m_i [pred_i = y_i] [radius_i >= r] / sum_i m_i``; an abstention
  (``pred_i = -1``) is wrong whatever its radius.

  Args:
    radius: ``[B]`` float certified radii.
    pred: ``[B]`` int certified predictions (``-1`` = abstain).
    y: ``[B]`` int labels.
    r: the radius to evaluate at: a scalar, or an array (e.g. ``[R]``) of radii.
    mask: optional ``[B]`` bool; ``False`` excludes an example.

  Returns:
    A float32 array with the shape of ``r`` (a scalar for a scalar ``r``); NaN if no example is
    selected by ``mask``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> radius, pred, y = jnp.array([0.5, 1.0, 2.0, 0.0]), jnp.array([0, 1, -1, 3]), jnp.arange(4)
    >>> metrics.certified_accuracy(radius, pred, y, jnp.array([0.0, 0.5, 1.0, 2.0])).tolist()
    [0.75, 0.5, 0.25, 0.0]

  References:
    Cohen, Rosenfeld, Kolter, "Certified adversarial robustness via randomized smoothing",
    ICML 2019.
  """
  pred = as_predictions(pred, "pred")
  y = int_like(y, pred, "y")
  radius = jnp.asarray(radius)
  if radius.shape != pred.shape:
    raise ValueError(f"radius must have shape {pred.shape}, got {radius.shape}.")
  if not jnp.issubdtype(radius.dtype, jnp.floating):
    radius = radius.astype(jnp.float32)
  r = jnp.asarray(r).astype(radius.dtype)
  m = row_mask(mask, pred.shape[0])
  ok = matches(pred, y) & m
  # [R, B]: explicit ranks on both sides (no implicit rank promotion).
  hits = ok[None, :] & (radius[None, :] >= r.reshape((-1, 1)))
  return ratio(jnp.sum(hits, axis=1, dtype=jnp.int32), count_true(m)).reshape(r.shape)


def curve_auc(epsilons: ArrayLike, accuracies: ArrayLike, clean_accuracy: ArrayLike) -> Array:
  """Normalized area under the robust-accuracy curve, by the trapezoid rule.

  The curve passes through ``(0, clean_accuracy)`` and ``(eps_k, acc_k)`` for each ``k``, sorted
  by eps (the input may be in any order; duplicates are allowed). With the sorted points
  ``(e_0 = 0, a_0), ..., (e_K, a_K)``:
  ``AUC = sum_j (e_{j+1} - e_j) (a_j + a_{j+1}) / 2 / max_k eps_k``,
  so a curve that stays at ``c`` scores ``c``. Epsilons must be non-negative; ``inf`` (the "no
  bound" entry a minimum-norm grid may hold) is left out of the area, which covers the finite
  eps.

  If the largest finite eps is 0 (or there is none) the area is empty and the result is
  ``clean_accuracy``, the limit of the normalized area as the largest eps shrinks to 0.

  Args:
    epsilons: ``[K]`` budgets, non-negative, in any order.
    accuracies: ``[K]`` robust accuracy at each budget.
    clean_accuracy: scalar accuracy at eps 0.

  Returns:
    A scalar with the float dtype of ``accuracies`` (float32 if they are not floating).

  Raises:
    ValueError: concrete ``epsilons`` with a NaN or negative entry.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> float(metrics.curve_auc(jnp.array([2.0, 1.0]), jnp.array([0.0, 0.5]), 1.0))
    0.5
    >>> float(metrics.curve_auc(jnp.array([2.0, 1.0, jnp.inf]), jnp.array([0.0, 0.5, 0.0]), 1.0))
    0.5
  """
  check_values("epsilons", epsilons, low=0.0)
  return trapezoid_auc(*(jnp.asarray(v) for v in (epsilons, accuracies, clean_accuracy)))


def trapezoid_auc(epsilons, accuracies, clean_accuracy):
  """:func:`curve_auc` computed in the array namespace of its arguments
  (:func:`~jaxrobust.metrics.conventions.array_namespace`): ``jax.numpy`` for JAX arrays
  (traceable), NumPy when all three are NumPy (host reports: no dozen small device ops dispatched
  one by one). The sort is stable in both, so tied eps keep their order and both give the same
  formula."""
  xp = array_namespace(epsilons, accuracies, clean_accuracy)
  acc = xp.asarray(accuracies)
  dtype = acc.dtype if xp.issubdtype(acc.dtype, xp.floating) else xp.float32
  acc = acc.astype(dtype)
  eps = xp.asarray(epsilons).astype(dtype)
  clean = xp.asarray(clean_accuracy).astype(dtype)
  if eps.ndim != 1 or acc.shape != eps.shape:
    raise ValueError(f"epsilons and accuracies must both have shape [K], got {eps.shape} and "
                     f"{acc.shape}.")
  if clean.ndim != 0:
    raise ValueError(f"clean_accuracy must be a scalar, got shape {clean.shape}.")
  if eps.shape[0] == 0:
    return clean
  order = xp.argsort(eps, stable=True)
  e = xp.concatenate([xp.zeros((1,), dtype), eps[order]])
  a = xp.concatenate([clean[None], acc[order]])
  finite = xp.isfinite(e)  # sorted: any inf entries come last, and add no area
  e = xp.where(finite, e, 0)
  area = xp.sum(xp.where(finite[1:], e[1:] - e[:-1], 0) * (a[1:] + a[:-1])) / 2
  top = xp.max(e)
  positive = top > 0
  return xp.where(positive, area / xp.where(positive, top, 1), clean)


# ---------------------------------------------------------------------------------------------
# Minimal adversarial perturbations eps*(x): quantiles and a mergeable histogram.
# ---------------------------------------------------------------------------------------------


def perturbation_quantiles(norms: ArrayLike, q: ArrayLike, mask: Optional[ArrayLike] = None
                           ) -> Array:
  r"""Quantiles of the per-example minimal adversarial norms :math:`\epsilon^*(x)`.

  ``norms`` is what a minimum-norm attack returns (``AttackResult.norm``): 0 for points
  misclassified on the clean input, ``inf`` where no adversarial point was found. Infinite values
  take part (a median of ``inf`` means that at least half the points resisted the attack); the
  quantiles interpolate linearly between order statistics, and any interpolation that touches
  ``inf`` is ``inf``.

  Args:
    norms: ``[B]`` minimal adversarial norms: each ``>= 0`` or ``inf``.
    q: a quantile in ``[0, 1]`` or a ``[Q]`` array of them.
    mask: optional ``[B]`` bool; only ``True`` entries count (the others may hold anything, even
      NaN). NaN if none do, as for an empty ``norms`` (``B = 0``).

  Returns:
    A float32 array of the shape of ``q``.

  Raises:
    ValueError: ``norms`` not 1-D, ``q`` not a scalar or 1-D, ``mask`` not ``[B]``; and, for
      concrete values (not under ``jax.jit``), a ``q`` outside ``[0, 1]`` or NaN, or a norm of a
      selected entry that is NaN or negative.

  Examples:
    >>> import jax.numpy as jnp
    >>> norms = jnp.array([0.1, 0.2, 0.4, jnp.inf])
    >>> perturbation_quantiles(norms, jnp.array([0.0, 0.5, 1.0])).tolist()
    [0.10000000149011612, 0.30000001192092896, inf]
  """
  norms, q = jnp.asarray(norms, jnp.float32), jnp.asarray(q, jnp.float32)
  if norms.ndim != 1:
    raise ValueError(f"norms must be a 1-D array [B] of minimal adversarial norms (one per "
                     f"example), got shape {norms.shape}.")
  if q.ndim > 1:
    raise ValueError(f"q must be a quantile or a 1-D array [Q] of them, got shape {q.shape}.")
  keep = row_mask(mask, norms.shape[0])
  check_values("q", q, low=0.0, high=1.0,
               hint="Quantiles are fractions: the median is q=0.5, not 50.")
  check_min_norms(norms, keep)
  if norms.shape[0] == 0:  # no entry counts, as under an all-False mask
    return jnp.full(q.shape, jnp.nan, jnp.float32)
  big = jnp.finfo(jnp.float32).max
  finite = jnp.where(jnp.isinf(norms), big, norms)
  values = jnp.where(keep, finite, jnp.nan)
  out = jnp.nanquantile(values, q)
  # Any interpolation that involved the stand-in for inf is at least big / 2.
  return jnp.where(out >= big / 2, jnp.inf, out)


def median_perturbation(norms: ArrayLike, mask: Optional[ArrayLike] = None) -> Array:
  r"""The median of :math:`\epsilon^*(x)` (see :func:`perturbation_quantiles`): a float32
  scalar, NaN if no entry is selected by ``mask`` (or ``norms`` is empty).

  Raises:
    ValueError: as :func:`perturbation_quantiles` (``norms`` not ``[B]``, ``mask`` not ``[B]``,
      a concrete selected norm that is NaN or negative).

  Examples:
    >>> import jax.numpy as jnp
    >>> float(median_perturbation(jnp.array([0.3, 0.1, 0.2])))
    0.20000000298023224
  """
  return perturbation_quantiles(norms, 0.5, mask)
