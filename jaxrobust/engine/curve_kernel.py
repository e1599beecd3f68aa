r"""The one per-batch curve kernel: per-example robust flags of one attack over an eps grid.

Every curve front door calls :func:`robust_flags`: :func:`jaxrobust.robustness_curve` (one
batch), :func:`jaxrobust.evaluate` (each padded batch of a data set, every attack) and, through
``evaluate``, the command line. For a fixed-budget attack and the grid
:math:`\epsilon_1..\epsilon_K` (any order, duplicates allowed) the flag of example :math:`i` is

.. math::
   r_{k,i} = c_i \wedge \neg \bigvee_{j:\ \epsilon_j \le \epsilon_k} b_{j,i},

with :math:`c_i` the clean verdict and :math:`b_{j,i}` "broken by the attack run at
:math:`\epsilon_j`" (keys ``fold_in(keys, j)``): a point broken inside a smaller ball is broken
inside every larger one, so the curve is non-increasing by construction. A minimum-norm attack
runs once: :math:`r_{k,i} = c_i \wedge [\epsilon^*_i > \epsilon_k]`.

Three schedules compute the same flags: eps one after another (``eps_batch_size=None``),
vectorised (``0``) or in vectorised chunks (``b``), as the run's
:class:`~jaxrobust._options.RunOptions` say. One after another, with early exit or with
``chunk_size`` (:attr:`~jaxrobust._options.RunOptions.skips_across_eps`), they use **cross-eps
skipping**: the eps run in increasing order and each attacks only the rows not yet broken, so a
point broken at a small eps costs close to nothing at the larger ones (with early exit those rows
are frozen from the start and compacted away, :mod:`jaxrobust.engine.early_exit`; with
``chunk_size`` alone they are compacted away, :mod:`jaxrobust.engine.compaction`). A skipped row
reads "not broken" at that eps, and the worst case over smaller eps restores it, so the flags
equal the dense ones.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrobust._batch import fold_in, rows_like
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack, Budget
from jaxrobust.engine import scoring
from jaxrobust.engine.attack_loop import run_attack

Array = jax.Array


class CurveFlags(NamedTuple):
  """What the kernel returns for one attack on one batch."""

  robust: Array  # [K, B] bool: robust at eps_k (clean-correct, not broken up to eps_k)
  eps_star: Array | None  # [B] float32 minimal norms (minimum-norm attacks), else None
  info: dict  # "flags": name -> [] bool; "counts": name -> [K] (per eps) or [] int32;
  #             "robust_after": [K, M, B] bool per-member breakdown (ensembles and suites)


def worst_case_over_smaller_eps(broken: Array, epsilons: Array, *, strict: bool = False) -> Array:
  """``[K, B]``: broken at some eps_j <= eps_k (``strict``: eps_j < eps_k). No sort, no gather,
  so it shards like ``broken``.

  Examples:
    >>> import jax.numpy as jnp
    >>> broken = jnp.array([[False, True], [True, False]])  # eps 0.2, 0.1
    >>> worst_case_over_smaller_eps(broken, jnp.array([0.2, 0.1])).tolist()
    [[True, True], [True, False]]
  """
  smaller = (epsilons[None, :] < epsilons[:, None]) if strict else (
      epsilons[None, :] <= epsilons[:, None])  # [K, J]
  return jnp.any(broken[None, :, :] & smaller[:, :, None], axis=1)


def robust_flags(attack: Attack, logits_fn: Callable[..., Array], x: Array, y: Array,
                 epsilons: Array, keys: Array, *, lower, upper, correct: Array,
                 findings: scoring.CleanFindings | None = None, active: Array | None = None,
                 target: Array | None = None, options: RunOptions,
                 max_propagations: Array | None = None) -> CurveFlags:
  """Per-example robust flags ``[K, B]`` of ``attack`` over ``epsilons`` (see the module).

  Args:
    attack: a :class:`jaxrobust.Attack` (validated by the caller, with
      :meth:`~jaxrobust._options.RunOptions.check_curve`).
    logits_fn: the model.
    x: ``[B, ...]`` inputs; y: ``[B]`` labels; epsilons: ``[K]`` float32.
    keys: ``[B]`` per-example keys (a fixed-budget attack uses ``fold_in(keys, k)`` at eps k).
    lower, upper: the box.
    correct: ``[B]`` clean verdicts (:func:`jaxrobust.engine.scoring.clean_diagnosis`).
    findings: the clean pass's :class:`~jaxrobust.engine.scoring.CleanFindings`, counted once
      over ``active`` rows (:func:`~jaxrobust.engine.scoring.clean_checks`).
    active: ``[B]`` rows to attack and count (``None``: all); padding is inactive.
    target: ``[B]`` targets of a targeted attack (robust still means "prediction is ``y``").
    options: the schedule (see the module) and how each run goes; every run scores only the
      rows it attacked (``score_skipped_rows=False``).
    max_propagations: ``None``, or an int ``[]``/``[B]`` (data): the cap of
      :func:`jaxrobust.run` on each run, so per example and per eps for a fixed-budget attack
      (each eps's run is the run :func:`jaxrobust.run` makes at that eps under the cap; a row
      skipped across eps spends nothing there), per example for a minimum-norm one (one run).

  Returns:
    A :class:`CurveFlags`.
  """
  epsilons = jnp.asarray(epsilons, jnp.float32)
  active = jnp.ones_like(correct) if active is None else active
  # On a GPU a latency-bound curve runs dense with its eps vectorised (same flags; see there).
  options = options.for_curve(attack, logits_fn, x, epsilons.shape[0],
                              capped=max_propagations is not None)
  runs = options.replace(score_skipped_rows=False)
  if attack.minimum_norm:
    budget = Budget(rows_like(x, jnp.inf, jnp.float32), lower, upper)
    # At eps = inf no row is ever done (the answer keeps shrinking): the plain scan.
    result, _ = run_attack(attack, logits_fn, x, y, budget, keys, target,
                           options=runs.replace(early_exit=False), clean_correct=correct,
                           active=active, max_propagations=max_propagations)
    eps_star = result.norm.astype(jnp.float32)
    robust = correct[None, :] & (eps_star[None, :] > epsilons[:, None])
    return CurveFlags(robust, eps_star, _with_clean_checks(
        _checks(result.info), correct, findings, active))

  def run_at(index, eps, rows):
    budget = Budget(rows_like(x, 0.0, jnp.float32) + eps, lower, upper)
    result, broken = run_attack(attack, logits_fn, x, y, budget, fold_in(keys, index), target,
                                options=runs, clean_correct=correct, active=rows,
                                max_propagations=max_propagations)
    return broken, _checks(result.info)

  indexed = (jnp.arange(epsilons.shape[0], dtype=jnp.uint32), epsilons)
  if options.skips_across_eps:
    broken, per_eps = _skipping(run_at, epsilons, correct, active)
  elif options.eps_batch_size == 0:
    broken, per_eps = jax.vmap(lambda ie: run_at(*ie, active))(indexed)
  else:
    broken, per_eps = jax.lax.map(lambda ie: run_at(*ie, active), indexed,
                                  batch_size=options.eps_batch_size or None)
  robust = correct[None, :] & ~worst_case_over_smaller_eps(broken, epsilons)
  info = {"flags": {k: jnp.any(v) for k, v in per_eps["flags"].items()},
          "counts": per_eps["counts"]}
  if "robust_after" in per_eps:
    before = correct[None, :] & ~worst_case_over_smaller_eps(broken, epsilons, strict=True)
    info["robust_after"] = per_eps["robust_after"] & before[:, None, :]
  if "propagations" in per_eps:  # [K, B] each: 0 at eps where a row was not attacked
    info["propagations"] = per_eps["propagations"]
  return CurveFlags(robust, None, _with_clean_checks(info, correct, findings, active))


def _checks(info: dict) -> dict:
  """The parts of ``AttackResult.info`` a curve keeps: flags, counts, the member breakdown, the
  propagations per example."""
  kept = {"flags": dict(info.get("flags", {})), "counts": dict(info.get("counts", {}))}
  for name in ("robust_after", "propagations"):
    if name in info:
      kept[name] = info[name]
  return kept


def _with_clean_checks(info: dict, correct: Array, findings: scoring.CleanFindings | None,
                       active: Array) -> dict:
  """``info`` with the batch's clean-pass checks (:func:`scoring.clean_checks`), counted once
  for the whole grid (the clean pass does not depend on eps)."""
  if findings is not None:
    flags, counts = scoring.clean_checks(correct, findings, active)
    info["counts"].update(counts)
    info["flags"].update(flags)
  return info


def _skipping(run_at, epsilons: Array, correct: Array, active: Array) -> tuple[Array, dict]:
  """``broken [K, B]`` and per-eps checks, eps in increasing order, each eps attacking only the
  rows not broken at a smaller one (a skipped row reads "not broken" at that eps: it was broken
  before, which the worst case over smaller eps accounts for, so the flags equal the dense
  ones). Each eps keeps its own folded key (its index in the caller's grid)."""
  order = jnp.argsort(epsilons, stable=True).astype(jnp.uint32)

  def body(broken_before, index_and_eps):
    k, eps = index_and_eps
    broken, checks = run_at(k, eps, active & ~broken_before)
    broken = broken & correct & ~broken_before
    return broken_before | broken, (broken, checks)

  _, in_order = jax.lax.scan(body, jnp.zeros_like(correct), (order, jnp.sort(epsilons)))
  # Back to the caller's eps order by a one-hot contraction (no gather on a sharded array).
  back = order[None, :] == jnp.arange(epsilons.shape[0], dtype=jnp.uint32)[:, None]  # [K, J]

  def reorder(v):
    picked = jnp.where(back.reshape(back.shape + (1,) * (v.ndim - 1)), v[None],
                       jnp.zeros((), v.dtype))
    return jnp.any(picked, axis=1) if v.dtype == bool else jnp.sum(picked, axis=1, dtype=v.dtype)

  return jax.tree.map(reorder, in_order)
