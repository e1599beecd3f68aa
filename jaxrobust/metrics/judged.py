r"""Judged rates: verdicts in {success, failure, unscored} from a judge, counted by
:class:`JudgedRate` with the unscored ones kept apart, reported as a per-sample rate under an
explicit rule, with hit@k over prompts beside it.

A judge (a classifier of the generated tokens, a rule, an external model called from the host,
:mod:`jaxrobust.text`) gives every sampled response a verdict code: :data:`SUCCESS` (1, e.g. the
jailbreak worked), :data:`FAILURE` (0) or :data:`UNSCORED` (-1: the judge errored, refused,
was blocked or its answer did not parse). An unscored verdict is a failure of the judge, not
evidence about the model, so it is never counted as a failure unless asked: counting errored
outputs as "not jailbroken" under-reports the rate (the problem of PyRIT issue #2044).

Verdicts come as ``[B]`` (one response per prompt) or ``[B, S]`` (``S`` samples per prompt).
:class:`JudgedRate` keeps the three per-sample counts and, per prompt, the table of how many
prompts had ``c`` successes and ``u`` unscored samples among their ``S``: exact integer counts,
so it merges across batches, devices and hosts like every reducer, and every convention below is
computed from the same sums.

**Unscored verdicts.** With :math:`s, f, u` the successes, failures and unscored samples:
``unscored="exclude"`` (the default) reports :math:`s / (s + f)`, the rate among the responses
the judge scored (unbiased when unscored responses are like the scored ones);
``"failure"`` :math:`s / (s + f + u)` (HarmBench's and JailbreakBench's convention, a lower
bound); ``"success"`` :math:`(s + u) / (s + f + u)` (an upper bound). Every report carries
``unscored`` and the two bounds ``rate_as_failure`` and ``rate_as_success``: the range the
unscored verdicts could move the rate.

**hit@k.** A prompt with :math:`n` samples, :math:`c` of them successes, has the unbiased
estimate of "at least one success among k fresh samples" (pass@k, Chen et al. 2021)
:math:`1 - \binom{n - c}{k} / \binom{n}{k} = 1 - \prod_{j=0}^{k-1} (n - c - j) / (n - j)`,
averaged over prompts. Under ``"exclude"`` :math:`n` is the prompt's number of scored samples
(and prompts with fewer than ``k`` scored samples leave the average); under ``"failure"``
:math:`n = S` with :math:`c` successes; under ``"success"`` :math:`n = S` with :math:`c + u`.
``hit_any`` is the plain fraction of prompts with any success among their samples (any scored
one under ``"exclude"``, which drops prompts with no scored sample; ``k = S`` under
``"failure"``). Its interval is the exact Clopper--Pearson one over prompts; hit@k's interval is
:func:`jaxrobust.metrics.histogram_mean`'s over prompts (the per-prompt estimates are
independent values in :math:`[0, 1]` whose mean is the population hit@k).

The per-sample rate's interval treats samples as independent trials; samples of one prompt
are usually correlated, so with ``S > 1`` the intervals over prompts (``hit_any``, hit@k with
``k = 1``, the mean over prompts of each prompt's success fraction) are the ones to report.

References:
  Chen et al., "Evaluating large language models trained on code", 2021 (the pass@k estimator).
  Mazeika et al., "HarmBench", ICML 2024; Chao et al., "JailbreakBench", NeurIPS 2024.
  PyRIT issue #2044 (errored responses counted as not jailbroken); garak issue #1911 (per-prompt
  hit@k beside the pooled rate).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._validation import check_positive_int, is_concrete
from jaxrobust.metrics.conventions import array_namespace, float_for_counts, ratio, row_mask
from jaxrobust.metrics.rates import Rate, group_members
from jaxrobust.metrics.reducers import Reducer
from jaxrobust.metrics.scores import check_unscored_rule, histogram_mean

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

SUCCESS = 1
FAILURE = 0
UNSCORED = -1
_AVERAGES = (None, "micro", "macro")


def check_verdicts(verdicts: ArrayLike) -> Array:
  """``verdicts`` as a ``[B, S]`` int32 array (``[B]`` becomes ``[B, 1]``), after checking the
  dtype, the shape and (when concrete) the codes."""
  v = jnp.asarray(verdicts)
  if v.dtype == jnp.bool_ or not jnp.issubdtype(v.dtype, jnp.integer) or v.ndim not in (1, 2):
    raise ValueError(f"verdicts must be a [B] or [B, S] integer array of the codes SUCCESS (1), "
                     f"FAILURE (0) and UNSCORED (-1), got shape {v.shape} and dtype {v.dtype} "
                     "(flags: jnp.where(flags, SUCCESS, FAILURE)).")
  if v.ndim == 1:
    v = v[:, None]
  if v.shape[1] < 1:
    raise ValueError("verdicts needs at least one sample per prompt (S >= 1).")
  if is_concrete(v) and v.is_fully_addressable and v.size:
    codes = np.asarray(v)
    bad = ~np.isin(codes, (SUCCESS, FAILURE, UNSCORED))
    if np.any(bad):
      raise ValueError(f"verdicts must hold only SUCCESS (1), FAILURE (0) and UNSCORED (-1), got "
                       f"{sorted(set(codes[bad].tolist()))[:5]}.")
  return v.astype(jnp.int32)


class _JudgedSums(NamedTuple):
  successes: Array  # [] or [G] int32, samples judged a success
  failures: Array  # [] or [G] int32, samples judged a failure
  unscored: Array  # [] or [G] int32, samples the judge could not score
  prompts: Array  # [S + 1, S + 1] or [G, S + 1, S + 1] int32, prompts by (successes, unscored)


class JudgedRate(_JudgedSums, Reducer):
  r"""A mergeable judged rate: successes, failures and unscored samples counted apart, and the
  prompts by their numbers of successes and unscored samples (for hit@k); see
  :mod:`jaxrobust.metrics.judged` for the conventions and the maths.

  ``prompts[c, u]`` is the number of prompts whose ``S`` samples held ``c`` successes and ``u``
  unscored verdicts (``c + u <= S``); the per-sample counts are its moments, kept as fields so
  that they read directly. Merging adds every field (exact; a table of another ``S`` or another
  number of groups is refused). Inside ``jit`` a code other than the three is counted as
  unscored (never as a failure); concrete verdicts are checked.

  Attributes:
    successes: ``[]`` int32 (``[G]`` per group).
    failures: ``[]`` int32 (``[G]``).
    unscored: ``[]`` int32 (``[G]``).
    prompts: ``[S + 1, S + 1]`` int32 (``[G, S + 1, S + 1]``).

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> S, F, U = metrics.SUCCESS, metrics.FAILURE, metrics.UNSCORED
    >>> r = metrics.JudgedRate.from_verdicts(jnp.array([[S, F, U], [F, F, F], [U, U, S]]))
    >>> int(r.successes), int(r.failures), int(r.unscored)
    (2, 4, 3)
    >>> out = r.compute(k=2)
    >>> [round(float(out[n]), 4) for n in ("rate", "rate_as_failure", "rate_as_success")]
    [0.3333, 0.2222, 0.5556]
    >>> round(float(out["hit_any"]), 4), float(out["hit_at_k"])  # the third has one scored sample
    (0.6667, 0.5)
  """

  __slots__ = ()
  _MERGE_HINT = (" JudgedRates merge only with the same samples per prompt S (prompts is "
                 "[S + 1, S + 1]) and the same groups.")

  @classmethod
  def empty(cls, samples: int = 1, num_groups: Optional[int] = None) -> JudgedRate:
    """Nothing judged: the identity of :meth:`merge` for ``samples`` per prompt (per group with
    ``num_groups``).

    Examples:
      >>> from jaxrobust import metrics
      >>> metrics.JudgedRate.empty(4).prompts.shape, metrics.JudgedRate.empty(2, 3).unscored.shape
      ((5, 5), (3,))
    """
    side = check_positive_int("samples", samples) + 1
    lead = () if num_groups is None else (check_positive_int("num_groups", num_groups),)
    zeros = jnp.zeros(lead, jnp.int32)
    return cls(zeros, zeros, zeros, jnp.zeros(lead + (side, side), jnp.int32))

  @classmethod
  def from_verdicts(cls, verdicts: ArrayLike, mask: Optional[ArrayLike] = None, *,
                    groups: Optional[ArrayLike] = None,
                    num_groups: Optional[int] = None) -> JudgedRate:
    r"""The counts of one batch of verdicts: over the rows with :math:`m_i`, ``successes``
    :math:`= \sum_{i,s} [v_{is} = 1]`, ``failures`` :math:`= \sum_{i,s} [v_{is} = 0]`,
    ``unscored`` the rest, and ``prompts[c, u]`` the rows with ``c`` successes and ``u``
    unscored samples.

    Args:
      verdicts: ``[B]`` or ``[B, S]`` integer codes (:data:`SUCCESS`, :data:`FAILURE`,
        :data:`UNSCORED`).
      mask: optional ``[B]`` bool; ``False`` rows (padding prompts) are not counted.
      groups: optional ``[B]`` int ids in ``[0, num_groups)`` (e.g. behaviours).
      num_groups: ``G`` (static), with ``groups``.

    Returns:
      A :class:`JudgedRate` (``[G]`` fields with ``groups``).

    Raises:
      ValueError: for bool or non-integer verdicts, another shape, (concrete) unknown codes, or
        the errors of the group ids.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrobust import metrics
      >>> r = metrics.JudgedRate.from_verdicts(jnp.array([1, 0, -1, 1]), groups=jnp.array([0, 0, 1, 1]),
      ...                                      num_groups=2)
      >>> r.successes.tolist(), r.failures.tolist(), r.unscored.tolist()
      ([1, 1], [1, 0], [0, 1])
    """
    v = check_verdicts(verdicts)
    batch, samples = v.shape
    keep = row_mask(mask, batch)
    success = jnp.sum(v == SUCCESS, axis=1, dtype=jnp.int32)  # [B]
    failure = jnp.sum(v == FAILURE, axis=1, dtype=jnp.int32)
    unscored = jnp.int32(samples) - success - failure  # every other code is unscored
    side = samples + 1
    cell = success * side + unscored  # [B]
    table = (cell[:, None] == jnp.arange(side * side, dtype=jnp.int32)[None, :]) & keep[:, None]
    rows = [jnp.where(keep, c, 0) for c in (success, failure, unscored)]
    if groups is None and num_groups is None:
      sums = [jnp.sum(c, dtype=jnp.int32) for c in rows]
      return cls(*sums, jnp.sum(table, axis=0, dtype=jnp.int32).reshape(side, side))
    member = group_members(groups, num_groups, batch)  # [B, G]
    sums = [jnp.sum(jnp.where(member, c[:, None], 0), axis=0, dtype=jnp.int32) for c in rows]
    per_group = jnp.sum(member[:, :, None] & table[:, None, :], axis=0, dtype=jnp.int32)
    return cls(*sums, per_group.reshape(-1, side, side))

  def update(self, verdicts: ArrayLike, mask: Optional[ArrayLike] = None, *,
             groups: Optional[ArrayLike] = None) -> JudgedRate:
    """Adds one batch: ``self.merge(JudgedRate.from_verdicts(verdicts, mask, groups=groups,
    num_groups=G))``; a grouped rate needs the batch's ``groups``, an ungrouped one refuses
    them.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrobust import metrics
      >>> int(metrics.JudgedRate.empty().update(jnp.array([1, -1, 0])).unscored)
      1
    """
    own = np.shape(self.successes)
    if own and groups is None:
      raise ValueError(f"This JudgedRate is grouped ({own[0]} groups): pass groups=ids of the "
                       "batch's rows.")
    if not own and groups is not None:
      raise ValueError("This JudgedRate is ungrouped and cannot take groups.")
    return self.merge(JudgedRate.from_verdicts(verdicts, mask, groups=groups,
                                               num_groups=own[0] if own else None))

  def compute(self, confidence: ArrayLike = 0.95, *, unscored: str = "exclude",
              k: Optional[int] = None, average: Optional[str] = None, interval: str = "kl",
              key: Optional[Array] = None, resamples: int = 2000,
              macro_interval: str = "bonferroni") -> dict[str, Array]:
    r"""The per-sample rate under the rule for unscored verdicts, its bounds, hit-any and
    (with ``k``) hit@k over prompts, each with its interval.

    Args:
      confidence: the level in ``(0, 1)``.
      unscored: ``"exclude"`` (default), ``"failure"`` or ``"success"`` (static).
      k: optional int in ``[1, S]`` (static): adds hit@k.
      average: for a grouped rate, ``None`` (every group), ``"micro"`` (pooled) or ``"macro"``
        (mean over the groups; the rates' intervals by ``macro_interval`` as in
        :meth:`Rate.compute`, hit@k's by ``interval``).
      interval: hit@k's interval, ``"kl"``, ``"hoeffding"`` or ``"bootstrap"`` (with ``key``), see
        :func:`histogram_mean`.
      key: a PRNG key for ``interval="bootstrap"``.
      resamples: bootstrap resamples (static).
      macro_interval: the rates' interval for ``average="macro"``, ``"bonferroni"`` or
        ``"hoeffding"`` (see :meth:`Rate.compute`).

    Returns:
      A dict: ``rate``, ``lower``, ``upper``, ``hits``, ``total`` (the per-sample
      :class:`Rate` under the rule, Clopper--Pearson); ``successes``, ``failures``,
      ``unscored``; ``rate_as_failure``, ``rate_as_success``; ``hit_any``, ``hit_any_lower``,
      ``hit_any_upper``, ``prompts`` (prompts counted); with ``k``: ``hit_at_k``,
      ``hit_at_k_lower``, ``hit_at_k_upper``, ``hit_at_k_prompts``.

    Raises:
      ValueError: for an unknown ``unscored``, ``average`` or ``interval``, or ``k`` outside
        ``[1, S]``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrobust import metrics
      >>> r = metrics.JudgedRate.from_verdicts(jnp.array([[1, 0], [0, 0], [-1, -1]]))
      >>> [float(r.compute(unscored=u)["hit_any"]) for u in ("exclude", "failure", "success")]
      [0.5, 0.3333333432674408, 0.6666666865348816]
    """
    check_unscored_rule(unscored)
    if average not in _AVERAGES:
      raise ValueError(f"average must be one of {_AVERAGES}, got {average!r}.")
    samples = self.prompts.shape[-1] - 1
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer))
                          or not 1 <= k <= samples):
      raise ValueError(f"k must be an int in [1, S] = [1, {samples}] (S samples per prompt), "
                       f"got {k!r}.")
    s, f, u = self.successes, self.failures, self.unscored
    per_sample = {"exclude": (s, s + f), "failure": (s, s + f + u), "success": (s + u, s + f + u)}
    out = Rate(*per_sample[unscored]).compute(confidence, average=average,
                                              macro_interval=macro_interval)
    for rule in ("failure", "success"):
      out[f"rate_as_{rule}"] = _point(*per_sample[rule], average)
    xp = array_namespace(s)
    for name, value in (("successes", s), ("failures", f), ("unscored", u)):
      out[name] = value if average is None or np.ndim(value) == 0 else xp.sum(value)
    table = self.prompts.reshape(self.prompts.shape[:-2] + (-1,))  # [..., M]
    hit, counted = _any_table(samples, unscored)
    hits = xp.sum(_weigh(table, hit), axis=-1)
    prompts = xp.sum(_weigh(table, counted), axis=-1)
    any_rate = Rate(hits, prompts).compute(confidence, average=average,
                                           macro_interval=macro_interval)
    out.update(hit_any=any_rate["rate"], hit_any_lower=any_rate["lower"],
               hit_any_upper=any_rate["upper"],
               prompts=prompts if average is None or np.ndim(prompts) == 0 else xp.sum(prompts))
    if k is not None:
      values, counted = _hit_at_k_table(samples, int(k), unscored)
      counts = _weigh(table, counted)
      at_k = histogram_mean(counts, values.astype(np.float32), confidence,
                            average=None if np.ndim(s) == 0 else average, interval=interval,
                            key=key, resamples=resamples)
      out.update(hit_at_k=at_k["mean"], hit_at_k_lower=at_k["lower"],
                 hit_at_k_upper=at_k["upper"], hit_at_k_prompts=at_k["n"])
    return out


def _weigh(table, flags: np.ndarray):
  """``table [..., M]`` times the 0/1 ``flags [M]`` (broadcast explicitly over the groups)."""
  column = array_namespace(table).asarray(flags.astype(np.int32))
  return table * column.reshape((1,) * (table.ndim - 1) + column.shape)


def _point(hits, total, average):
  """The rate alone (no interval): per group, pooled (``"micro"``) or the mean of the group
  rates with trials (``"macro"``)."""
  xp = array_namespace(hits, total)
  wide = float_for_counts(total)
  if average is None or np.ndim(total) == 0:
    return ratio(hits, total, wide)
  if average == "micro":
    return ratio(xp.sum(hits), xp.sum(total), wide)
  has = total > 0
  per_group = xp.where(has, ratio(hits, total, wide), 0.0)
  groups = xp.sum(has)
  return xp.where(groups > 0, xp.sum(per_group) / xp.maximum(groups, 1).astype(wide), xp.nan)


def _cells(samples: int) -> tuple[np.ndarray, np.ndarray]:
  """``(c, u)`` of every cell of the flattened ``[S + 1, S + 1]`` prompt table."""
  c, u = np.meshgrid(np.arange(samples + 1), np.arange(samples + 1), indexing="ij")
  return c.ravel(), u.ravel()


def _scored_as(samples: int, rule: str) -> tuple[np.ndarray, np.ndarray]:
  """``(n, c)`` per cell: the samples a prompt counts and its successes under ``rule``."""
  c, u = _cells(samples)
  if rule == "exclude":
    return samples - u, c
  return np.full_like(c, samples), (c + u if rule == "success" else c)


def _any_table(samples: int, rule: str) -> tuple[np.ndarray, np.ndarray]:
  """Per cell: whether the prompt has a success (hit-any) and whether it is counted."""
  n, c = _scored_as(samples, rule)
  return c >= 1, n >= 1


def _hit_at_k_table(samples: int, k: int, rule: str) -> tuple[np.ndarray, np.ndarray]:
  r"""Per cell: :math:`1 - \binom{n - c}{k} / \binom{n}{k}` (float64) and whether the prompt is
  counted (:math:`n \ge k`)."""
  n, c = _scored_as(samples, rule)
  counted = n >= k
  none = np.ones(n.shape, np.float64)  # the probability that k draws miss every success
  for j in range(k):
    none *= np.clip(n - c - j, 0, None) / np.maximum(n - j, 1)
  return np.where(counted, 1.0 - none, 0.0), counted
