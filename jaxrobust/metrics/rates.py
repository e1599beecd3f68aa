r"""The mergeable :class:`Rate`: hits out of trials, reported with an exact binomial interval.

A rate here is ``hits / total`` over independent Bernoulli trials (attack successes, judged-harmful
completions, followed injections, consistent paraphrase sets). :class:`Rate` keeps the two integer
sums, so it merges across batches, devices (:func:`jaxrobust.metrics.psum`) and hosts
(:meth:`Rate.to_host`) exactly, and :meth:`Rate.compute` reports the rate with the exact
Clopper--Pearson interval of :func:`~jaxrobust.metrics.binomial_interval`.

The numerics of the interval are :mod:`jaxrobust.metrics.intervals`; the generative-model rates
built on :class:`Rate` are :mod:`jaxrobust.metrics.generative`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._validation import is_concrete
from jaxrobust.metrics.conventions import array_namespace, float_for_counts, ratio, row_mask
from jaxrobust.metrics.intervals import (binomial_interval, check_confidence,
                                         hoeffding_half_width, host_binomial_interval)
from jaxrobust.metrics.reducers import Reducer

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

_AVERAGES = ("micro", "macro")
_MACRO_INTERVALS = ("bonferroni", "hoeffding")


class _RateSums(NamedTuple):
  hits: Array  # [] or [G] int32, trials that count (successes), per group when grouped
  total: Array  # [] or [G] int32, trials


class Rate(_RateSums, Reducer):
  r"""A mergeable rate: ``hits`` out of ``total`` trials, reported with an exact interval.

  Over the valid rows of every batch seen, ``hits`` :math:`= \sum_i m_i f_i` and ``total``
  :math:`= \sum_i m_i` (int32 on device; :meth:`to_host` gives int64 for sums past
  :math:`2^{31}`). Merging adds both (associative, commutative, exact, :meth:`empty` is the
  identity), so the result never depends on batching, padding, order or device count;
  :func:`jaxrobust.metrics.psum` (or :meth:`psum`) sums per-shard rates inside
  ``jax.shard_map``. :meth:`compute` gives the rate and its Clopper--Pearson interval
  (:func:`binomial_interval`), which assumes the trials are independent.

  **Grouped rates.** Built with ``groups`` (e.g. the behaviour each prompt tests), both fields
  are ``[G]`` vectors of per-group sums; they merge the same way, and :meth:`compute` reports
  every group (``average=None``), the pooled rate over all trials (``"micro"``) or the mean of
  the group rates (``"macro"``, HarmBench's "average ASR" over behaviours).

  **Benchmark conventions** (which setting reproduces which published number):

  ======================================  ==================================================
  benchmark                               setting
  ======================================  ==================================================
  HarmBench "average ASR"                 ``groups=`` behaviour ids, ``compute(average=
                                          "macro")``; unparseable classifier verdicts count
                                          as failures (``invalid="failure"``)
  GCG (Zou et al.), AdvBench ASR          one row per behaviour, micro (the plain rate)
  JailbreakBench                          one row for each of its 100 behaviours, missing
                                          prompts or responses ``valid=False`` with
                                          ``invalid="failure"`` (the denominator stays 100)
  InjecAgent "ASR-valid" / BIPIA          invalid outputs dropped (``invalid="drop"``);
                                          InjecAgent's "ASR-all" is ``invalid="failure"``
  TextAttack attack success rate          ``Rate.from_flags(success, mask=clean_correct)``:
                                          skipped (clean-misclassified) examples leave the
                                          denominator; ``mask=None`` counts them (as
                                          :func:`jaxrobust.metrics.attack_success_rate`'s
                                          ``over="all"``)
  ======================================  ==================================================

  Attributes:
    hits: ``[]`` int32 counted trials (``[G]`` per group for a grouped rate).
    total: ``[]`` int32 trials (``[G]`` per group).

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> r = metrics.Rate.from_flags(jnp.array([True, False, True, True]))
    >>> r = r.merge(metrics.Rate.from_flags(jnp.array([False, True]), jnp.array([True, False])))
    >>> int(r.hits), int(r.total)
    (3, 5)
    >>> out = r.compute()
    >>> round(float(out["rate"]), 2), round(float(out["lower"]), 4), round(float(out["upper"]), 4)
    (0.6, 0.1466, 0.9473)
  """

  __slots__ = ()
  _MERGE_HINT = (" A grouped Rate ([G] sums, built with groups=) merges only with grouped rates "
                 "of the same G; add a batch with rate.update(flags, groups=ids).")

  @classmethod
  def empty(cls, num_groups: Optional[int] = None) -> Rate:
    """Zero hits out of zero trials (int32): the identity of :meth:`merge`; ``[num_groups]``
    zeros for a grouped rate.

    Examples:
      >>> from jaxrobust import metrics
      >>> int(metrics.Rate.empty().total), metrics.Rate.empty(3).total.shape
      (0, (3,))
    """
    if num_groups is None:
      return cls(jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    zeros = jnp.zeros((_num_groups(num_groups),), jnp.int32)
    return cls(zeros, zeros)

  @classmethod
  def from_flags(cls, flags: ArrayLike, mask: Optional[ArrayLike] = None, *,
                 groups: Optional[ArrayLike] = None, num_groups: Optional[int] = None) -> Rate:
    r"""The rate of one batch: ``hits`` :math:`= \sum_i m_i f_i`, ``total`` :math:`= \sum_i m_i`;
    with ``groups``, per group :math:`g`: :math:`\sum_{i : g_i = g} m_i f_i` and
    :math:`\sum_{i : g_i = g} m_i` (``[num_groups]`` each).

    ``mask`` is the place for every "this row is not a trial" rule: padding, and TextAttack's
    skipped examples (``mask=clean_correct`` gives its attack success rate).

    Args:
      flags: ``[B]`` bool, ``True`` where the trial is a hit (a success, a harmful completion,
        ...). Other dtypes are refused rather than guessed (compare first, e.g. ``label == 1``).
      mask: optional ``[B]`` bool; ``False`` rows (padding) are not counted.
      groups: optional ``[B]`` int group ids in ``[0, num_groups)`` (e.g. behaviour ids).
      num_groups: the number of groups ``G`` (static); required with ``groups``.

    Returns:
      A :class:`Rate` (``[G]`` fields with ``groups``).

    Raises:
      ValueError: if ``flags`` is not ``[B]`` bool or ``mask`` is not ``[B]``; for ``groups``
        without ``num_groups`` (or the reverse), not ``[B]`` integers, or (concrete) ids outside
        ``[0, num_groups)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrobust import metrics
      >>> r = metrics.Rate.from_flags(jnp.array([True, True, False]), jnp.array([1, 0, 1]))
      >>> int(r.hits), int(r.total)
      (1, 2)
    """
    flags = jnp.asarray(flags)
    if flags.ndim != 1 or flags.dtype != jnp.bool_:
      raise ValueError(f"flags must be a [B] bool array, got shape {flags.shape} and dtype "
                       f"{flags.dtype} (reduce extra axes first, e.g. jnp.any(flags, axis=1)).")
    keep = row_mask(mask, flags.shape[0])
    return rate_of_rows((flags & keep).astype(jnp.int32), keep.astype(jnp.int32), groups,
                         num_groups)

  def update(self, flags: ArrayLike, mask: Optional[ArrayLike] = None, *,
             groups: Optional[ArrayLike] = None, num_groups: Optional[int] = None) -> Rate:
    r"""Adds one batch: ``self.merge(Rate.from_flags(flags, mask, groups=groups,
    num_groups=num_groups))``.

    A grouped rate (``[G]`` fields) takes the group id of every row of the batch (``groups``;
    ``num_groups`` defaults to its ``G``): group :math:`g` gains :math:`\sum_{i : g_i = g} m_i
    f_i` hits out of :math:`\sum_{i : g_i = g} m_i` trials. An ungrouped rate takes none.

    Args:
      flags: ``[B]`` bool, ``True`` where the trial is a hit.
      mask: optional ``[B]`` bool; ``False`` rows are not counted.
      groups: ``[B]`` int group ids in ``[0, G)``; required for a grouped rate, refused for an
        ungrouped one.
      num_groups: ``G`` (static), optional: it must equal this rate's.

    Returns:
      The merged :class:`Rate`.

    Raises:
      ValueError: for ``groups`` missing on a grouped rate or given to an ungrouped one, a
        ``num_groups`` other than this rate's, or the errors of :meth:`from_flags`.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrobust import metrics
      >>> int(metrics.Rate.empty().update(jnp.array([True, False])).hits)
      1
      >>> r = metrics.Rate.from_flags(jnp.array([True, False, True]), groups=jnp.array([0, 1, 1]),
      ...                             num_groups=2)
      >>> r = r.update(jnp.array([True, True]), groups=jnp.array([0, 1]))
      >>> r.hits.tolist(), r.total.tolist()
      ([2, 2], [2, 3])
    """
    own = np.shape(self.total)
    if own and groups is None:
      raise ValueError(f"This Rate is grouped ([G] = {list(own)} per-group sums), so every batch "
                       "says which group each row belongs to: rate.update(flags, mask, "
                       f"groups=ids) with ids in [0, {own[0]}) (the batch's trials would "
                       "otherwise be added to every group).")
    if not own and (groups is not None or num_groups is not None):
      raise ValueError("This Rate is ungrouped ([] sums) and cannot take groups: build it grouped "
                       "(Rate.empty(num_groups) or Rate.from_flags(..., groups=, num_groups=)) "
                       "or leave groups out.")
    if own:
      if num_groups is not None and num_groups != own[0]:
        raise ValueError(f"num_groups={num_groups!r} differs from this Rate's {own[0]} groups.")
      num_groups = own[0]
    return self.merge(Rate.from_flags(flags, mask, groups=groups, num_groups=num_groups))

  def compute(self, confidence: ArrayLike = 0.95, *, average: Optional[str] = None,
              macro_interval: str = "bonferroni") -> dict[str, Array]:
    r"""The rate with its two-sided Clopper--Pearson interval at ``confidence``.

    Returns a dict: ``rate`` = hits / total (NaN when ``total == 0``); ``lower`` and ``upper``
    from :func:`binomial_interval` (``(0, 1)`` when ``total == 0``); ``hits`` and ``total`` as
    stored. Device values give float32 JAX scalars (traceable, ``confidence`` is data). A host
    reducer (:meth:`to_host`, int64 sums, possibly past :math:`2^{31}`) computes on the host
    without truncating to int32 and without compiling: ``rate`` and the bounds in float64, as
    NumPy values (the bounds from :func:`binomial_interval_table`'s SciPy path).

    For a grouped rate (``[G]`` fields), ``average`` chooses what is reported:

    * ``None``: every group, elementwise (``[G]`` values);
    * ``"micro"``: the pooled rate :math:`\sum_g h_g / \sum_g n_g` over all trials, with its
      exact interval (the same as an ungrouped rate over the same rows);
    * ``"macro"``: the mean of the group rates over the :math:`G'` groups with trials,
      :math:`\frac{1}{G'} \sum_{g : n_g > 0} h_g / n_g` (HarmBench's "average ASR"), with the
      mean of the groups' Clopper--Pearson bounds at level :math:`1 - \alpha / G'`: all
      :math:`G'` group intervals hold at once with probability at least :math:`1 - \alpha`
      (Bonferroni), so this interval covers the mean of the true group rates at least as often
      as asked. It is conservative; no exact interval exists for a mean of differently sized
      binomial proportions. The dict also holds ``groups`` (:math:`G'`).

      ``macro_interval="hoeffding"`` gives instead :math:`\hat\theta \pm \sqrt{\log(2/\alpha)
      \sum_g 1 / (G'^2 n_g) / 2}`, clipped to :math:`[0, 1]`: the macro rate is
      :math:`\sum_i w_i X_i`, a weighted sum of independent trials :math:`X_i \in \{0, 1\}`
      with :math:`w_i = 1 / (G' n_{g(i)})`, and Hoeffding's inequality (1963, Theorem 2) bounds
      :math:`P(|\sum_i w_i (X_i - p_i)| \ge t)` by :math:`2 e^{-2t^2 / \sum_i w_i^2}` for
      every set of group rates, so it covers at least as often as asked. Its width falls like
      :math:`1 / \sqrt{G' \bar n}` as behaviours are added, while the Bonferroni one widens
      (each group's bound moves to level :math:`1 - \alpha / G'`): with many behaviours and
      few prompts each (HarmBench) it is far narrower; with a few groups of many trials and
      rates near 0 or 1 the Bonferroni one can be narrower.

    An ungrouped rate is one group: ``"micro"`` and ``"macro"`` give its own rate.

    Args:
      confidence: the level in ``(0, 1)``.
      average: ``None``, ``"micro"`` or ``"macro"`` (static).
      macro_interval: ``"bonferroni"`` (default) or ``"hoeffding"`` (static), the interval of
        ``average="macro"``.

    Returns:
      A dict with keys ``rate``, ``lower``, ``upper``, ``hits``, ``total`` (and ``groups`` for
      ``"macro"``).

    Raises:
      ValueError: for an unknown ``average`` or ``macro_interval``.

    Examples:
      >>> import numpy as np
      >>> from jaxrobust import metrics
      >>> big = metrics.Rate(np.int64(3_000_000_000), np.int64(4_000_000_000))
      >>> out = big.compute()
      >>> float(out["rate"]), int(out["total"]), bool(out["lower"] < 0.75 < out["upper"])
      (0.75, 4000000000, True)

      Per behaviour: two prompts of behaviour 0 (one succeeded), one of behaviour 1 (it did):

      >>> import jax.numpy as jnp
      >>> grouped = metrics.Rate.from_flags(jnp.array([True, False, True]),
      ...                                   groups=jnp.array([0, 0, 1]), num_groups=2)
      >>> grouped.hits.tolist(), grouped.total.tolist()
      ([1, 1], [2, 1])
      >>> [round(float(grouped.compute(average=a)["rate"]), 4) for a in ("micro", "macro")]
      [0.6667, 0.75]
    """
    if macro_interval not in _MACRO_INTERVALS:
      raise ValueError(f"macro_interval must be one of {_MACRO_INTERVALS}, got "
                       f"{macro_interval!r}.")
    if average is not None:
      if average not in _AVERAGES:
        raise ValueError(f"average must be None or one of {_AVERAGES}, got {average!r}.")
      if average == "micro" or np.ndim(self.total) == 0:
        pooled = Rate(*(v if np.ndim(v) == 0 else _sum_groups(v) for v in self))
        out = pooled.compute(confidence)
        if average == "macro":
          xp = array_namespace(self.total)
          out["groups"] = (xp.asarray(self.total) > 0).astype(xp.int32)
        return out
      return _macro_average(self, confidence, macro_interval)
    # Elementwise for a grouped rate ([G] sums). Host sums (NumPy int64) give NumPy float64
    # values; device sums give float32 JAX arrays.
    xp = array_namespace(self.hits, self.total)
    lower, upper = _interval(self.hits, self.total, confidence)
    return {"rate": ratio(self.hits, self.total, float_for_counts(self.total)),
            "lower": xp.asarray(lower), "upper": xp.asarray(upper),
            "hits": self.hits, "total": self.total}


def _num_groups(num_groups) -> int:
  if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or (
      num_groups < 1):
    raise ValueError(f"the number of groups must be a positive int, got {num_groups!r}.")
  return int(num_groups)


def rate_of_rows(hits: Array, trials: Array, groups: Optional[ArrayLike],
                 num_groups: Optional[int]) -> Rate:
  """The :class:`Rate` of per-row hit and trial counts (``[B]`` int32), summed over the batch,
  or per group (``[G]`` fields) when ``groups`` are given."""
  if groups is None and num_groups is None:
    return Rate(jnp.sum(hits, dtype=jnp.int32), jnp.sum(trials, dtype=jnp.int32))
  member = group_members(groups, num_groups, hits.shape[0])  # [B, G]
  return Rate(jnp.sum(jnp.where(member, hits[:, None], 0), axis=0, dtype=jnp.int32),
              jnp.sum(jnp.where(member, trials[:, None], 0), axis=0, dtype=jnp.int32))


def group_members(groups: Optional[ArrayLike], num_groups: Optional[int], batch: int) -> Array:
  """``[B, G]`` bool, ``True`` where row ``i`` belongs to group ``g`` (``groups[i] == g``), after
  checking that ``groups`` is ``[B]`` integers in ``[0, num_groups)`` (its values when
  concrete); the one home of group ids for every grouped reducer."""
  if groups is None or num_groups is None:
    raise ValueError("group ids and the number of groups go together: pass both (e.g. behavior= "
                     "and num_behaviors=) or neither.")
  count = _num_groups(num_groups)
  ids = jnp.asarray(groups)
  if ids.shape != (batch,) or not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(f"group ids must be a {[batch]} integer array, got shape "
                     f"{ids.shape} and dtype {ids.dtype}.")
  if is_concrete(ids) and ids.is_fully_addressable and ids.size:
    low, high = int(jnp.min(ids)), int(jnp.max(ids))
    if low < 0 or high >= count:
      raise ValueError(f"group ids must lie in [0, {count}), got min {low} and max {high}.")
  return ids[:, None] == jnp.arange(count, dtype=ids.dtype)[None, :]


def _sum_groups(counts):
  """The sum of per-group counts, in their own dtype: int64 for host sums, int32 on device."""
  xp = array_namespace(counts)
  return xp.sum(counts, dtype=xp.asarray(counts).dtype)


def _interval(hits, total, confidence) -> tuple[Array, Array]:
  """The two-sided Clopper--Pearson bounds: for host sums (NumPy) and a host ``confidence``, in
  float64 on the host (:func:`~jaxrobust.metrics.intervals.host_binomial_interval`, nothing to
  compile); otherwise :func:`binomial_interval`'s float32 (traceable, ``confidence`` data)."""
  if array_namespace(hits, total) is np and not isinstance(confidence, jax.Array):
    return host_binomial_interval(hits, total, confidence)
  return binomial_interval(hits, total, confidence)


def _bonferroni_level(confidence: ArrayLike, divisor, dtype) -> Array:
  """``1 - (1 - confidence) / divisor`` (``divisor`` groups): ``1 - confidence`` is formed in
  float64 for a host ``confidence`` (then the division runs in ``dtype``), in float32 for a
  ``jax.Array`` one (traced data)."""
  if isinstance(confidence, jax.Array):
    return 1.0 - (1.0 - confidence.astype(jnp.float32)) / divisor.astype(jnp.float32)
  check_confidence(np.asarray(confidence, np.float64))
  alpha = 1.0 - np.asarray(confidence, np.float64)  # float64 before any division
  return 1.0 - array_namespace(divisor).asarray(alpha, dtype) / divisor.astype(dtype)


def _macro_average(rate: Rate, confidence: ArrayLike,
                   interval: str = "bonferroni") -> dict[str, Array]:
  """:meth:`Rate.compute` with ``average="macro"`` for ``[G]`` fields."""
  # Host sums (NumPy int64) average in float64, device sums (int32) in float32.
  xp = array_namespace(rate.hits, rate.total)
  wide = float_for_counts(rate.total)
  has_trials = rate.total > 0
  groups = xp.sum(has_trials, dtype=rate.total.dtype)
  divisor = xp.maximum(groups, 1)
  per_group = xp.where(has_trials, ratio(rate.hits, rate.total, wide), 0.0)
  count = divisor.astype(wide)

  def mean(values, empty):
    values = xp.asarray(values).astype(wide)
    return xp.where(groups > 0, xp.sum(xp.where(has_trials, values, 0.0)) / count, empty)

  rate_mean = mean(per_group, xp.nan)
  if interval == "hoeffding":
    # sum_i w_i^2 = sum_g n_g / (G' n_g)^2 = sum_g 1 / (G'^2 n_g)
    trials = xp.maximum(rate.total, 1).astype(wide)
    square_weights = xp.sum(xp.where(has_trials, 1.0 / trials, 0.0)) / (count * count)
    half = hoeffding_half_width(confidence, square_weights, wide)
    lower = xp.where(groups > 0, xp.clip(rate_mean - half, 0.0, 1.0), 0.0)
    upper = xp.where(groups > 0, xp.clip(rate_mean + half, 0.0, 1.0), 1.0)
  else:
    group_lower, group_upper = _interval(rate.hits, rate.total,
                                         _bonferroni_level(confidence, divisor, wide))
    lower, upper = mean(group_lower, 0.0), mean(group_upper, 1.0)
  return {"rate": rate_mean, "lower": lower, "upper": upper, "hits": rate.hits,
          "total": rate.total, "groups": groups}
