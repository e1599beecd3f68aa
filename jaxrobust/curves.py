r"""Robustness curves: robust accuracy as a function of the budget, in one XLA program.

A point counts as robust at :math:`\epsilon_k` when it is classified correctly on the clean input
and no attack broke it at :math:`\epsilon_k` *or at any smaller budget of the grid*: a point
broken at a small eps is broken at every larger one (the smaller ball is inside the larger), so
the per-example worst case across eps is taken and the curve is non-increasing by construction.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import metrics
from jaxrobust._batch import as_keys, like_batch
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack, Budget, Curve
from jaxrobust._validation import (check_eps, check_inputs, check_min_norms, check_values,
                                   refuse_fixed_batch)
from jaxrobust.engine.curve_kernel import robust_flags
from jaxrobust.engine.propagations import check_cap
from jaxrobust.engine.scoring import clean_diagnosis

Array = jax.Array


def curve_from_norms(norms: Array, correct: Array, epsilons: Array) -> Curve:
  r"""The robustness curve implied by per-example minimal adversarial norms :math:`\epsilon^*`.

  A point is robust at eps iff it is clean-correct and :math:`\epsilon^*(x) > \epsilon`.

  Args:
    norms: ``[B]`` smallest adversarial perturbation found per example, each ``>= 0`` (``inf``
      where none).
    correct: ``[B]`` bool, clean prediction correct.
    epsilons: ``[K]`` budgets, each ``>= 0`` (``inf`` allowed).

  Returns:
    A :class:`jaxrobust.Curve`.

  Raises:
    ValueError: ``norms`` and ``correct`` not both ``[B]`` (one entry per example), or
      ``epsilons`` not ``[K]``; for concrete values (not under ``jax.jit``), a NaN or negative
      eps or norm.

  Examples:
    >>> import jax.numpy as jnp
    >>> c = curve_from_norms(jnp.array([0.1, 0.3, jnp.inf, 0.0]),
    ...                      jnp.array([True, True, True, False]), jnp.array([0.0, 0.2, 0.4]))
    >>> c.robust_accuracy
    Array([0.75, 0.5 , 0.25], dtype=float32)
  """
  norms, correct = jnp.asarray(norms), jnp.asarray(correct, bool)
  epsilons = jnp.asarray(epsilons, jnp.float32)
  if norms.ndim != 1 or correct.shape != norms.shape or epsilons.ndim != 1:
    raise ValueError(f"curve_from_norms takes norms [B] and correct [B] (one entry per example) "
                     f"and epsilons [K]; got norms {norms.shape}, correct {correct.shape}, "
                     f"epsilons {epsilons.shape}.")
  check_values("epsilons", epsilons, low=0.0)
  check_min_norms(norms)
  robust = correct[None, :] & (norms.astype(jnp.float32)[None, :] > epsilons[:, None])
  return _curve(epsilons, correct, robust)


def _curve(epsilons: Array, correct: Array, robust: Array, info: dict | None = None) -> Curve:
  """The :class:`jaxrobust.Curve` of one batch, from its :class:`jaxrobust.metrics.CurveCounts`."""
  curve = metrics.CurveCounts.from_flags(robust, correct).compute(epsilons)
  return Curve(epsilons=epsilons, clean_accuracy=curve["clean_accuracy"],
               robust_accuracy=curve["robust_accuracy"], robust=robust, auc=curve["auc"],
               info=info)


def robustness_curve(attack: Attack, logits_fn: Callable[[Array], Array], x: Array, y: Array,
                     epsilons: Array, key: Array, lower: float | Array = 0.0,
                     upper: float | Array = 1.0, eps_batch_size: int | None = None, *,
                     target: Array | None = None, allow_large_eps: bool = False,
                     unroll: int | bool = 1, chunk_size: int | None = None,
                     early_exit: bool = True, max_propagations: int | Array | None = None) -> Curve:
  """Robust accuracy of ``logits_fn`` against ``attack`` at every budget in ``epsilons``.

  The whole curve is one program under ``jax.jit``; ``epsilons`` is data, so new values never
  recompile. A fixed-budget attack runs once per eps, with the example's key folded with the eps
  index; a minimum-norm attack runs once and every eps follows from its norms
  (:func:`curve_from_norms`).

  By default the work falls with every point broken: early exit within each run, and cross-eps
  skipping across the grid (the eps in increasing order, each attacking only the points still
  robust at the smaller ones). On a GPU a small curve (a plain attack, the model's evaluation of
  the batch at every eps under 8 GFLOP) runs dense with every eps vectorised instead, which is
  faster there (:meth:`jaxrobust._options.RunOptions.for_curve`). The curve is the same as the dense
  computation's; this is what makes an expensive attack such as
  :func:`jaxrobust.attacks.auto_attack` affordable over a whole curve. The options
  ``eps_batch_size``, ``unroll``, ``chunk_size`` and ``early_exit`` are explained once, in
  :class:`jaxrobust._options.RunOptions`.

  Args:
    attack: from :mod:`jaxrobust.attacks`.
    logits_fn: ``x [B, ...] -> logits [B, C]``.
    x: ``[B, ...]`` inputs in ``[lower, upper]``.
    y: ``[B]`` int labels.
    epsilons: ``[K]`` budgets in any order (duplicates allowed).
    key: a PRNG key, or ``[B]`` per-example keys.
    lower, upper: the box.
    eps_batch_size: ``None`` runs the eps one after another (least memory), ``0`` vectorises all
      of them at once, ``b`` runs chunks of ``b`` vectorised eps (see
      :class:`~jaxrobust._options.RunOptions`).
    target: ``[B]`` target classes for a targeted attack.
    allow_large_eps: accept budgets covering the whole box.
    unroll: how far to unroll each attack loop (see :class:`~jaxrobust._options.RunOptions`).
    chunk_size: rows per chunk of the compaction (``None``: a backend default with early exit,
      no compaction without); needs ``eps_batch_size=None`` (see
      :class:`~jaxrobust._options.RunOptions`).
    early_exit: stop attacking points once broken and skip across eps (see
      :class:`~jaxrobust._options.RunOptions`).
    max_propagations: ``None`` (no cap), or an int or int ``[]``/``[B]`` array (data: a new
      value never recompiles): :func:`jaxrobust.run`'s cap on forward plus backward
      propagations per example, given to **each run**: per example and per eps for a
      fixed-budget attack (the flags at eps_k are those of :func:`jaxrobust.run` at every
      eps_j <= eps_k under the cap, worst case taken; cross-eps skipping only spares the runs of
      rows already broken, so it changes no flag; a row's whole curve costs at most ``K`` caps),
      per example for a minimum-norm attack (its one run).

  Returns:
    A :class:`jaxrobust.Curve` whose ``info`` holds the attack's reliability checks over the grid:
    ``info["flags"]`` (name -> ``[]`` bool, OR over eps, e.g. AutoAttack's ``zero_gradients``),
    ``info["counts"]`` (the counts behind them: ``[K]`` per eps for a fixed-budget attack, ``[]``
    for a minimum-norm one; ``non_finite_gradient_points`` is counted once) and, for ensembles and
    suites, ``info["robust_after"]`` ``[K, M, B]``: robust after members ``1..m`` at eps_k (and at
    every smaller eps), whose means are the per-member breakdown. ``info["propagations"]``
    (``{"forward", "backward"}``, int32) holds the attack's propagations per example
    (:func:`jaxrobust.run`): ``[K, B]`` per eps for a fixed-budget attack (0 at an eps where
    the row was not attacked, e.g. broken at a smaller eps under cross-eps skipping; the sum
    over eps is the curve's cost per example), ``[B]`` for a minimum-norm one (one run).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4], [0.9, 0.1]]), jnp.array([0, 0])  # Linf distances 0.1, 0.4
    >>> curve_fn = jax.jit(lambda eps: jr.robustness_curve(jr.attacks.pgd(), logits_fn, x, y, eps,
    ...                                                    jax.random.key(0)))
    >>> curve_fn(jnp.array([0.0, 0.05, 0.15, 0.45])).robust_accuracy
    Array([1. , 1. , 0.5, 0. ], dtype=float32)
  """
  options = RunOptions(early_exit=early_exit, chunk_size=chunk_size, unroll=unroll,
                       eps_batch_size=eps_batch_size)
  options.check_curve(attack)
  epsilons = jnp.asarray(epsilons, jnp.float32)
  if epsilons.ndim != 1 or epsilons.shape[0] == 0:
    raise ValueError(f"epsilons must be a non-empty 1-D array [K], got shape {epsilons.shape}.")
  budget = Budget(jnp.max(epsilons) if attack.minimum_norm else 0.0, lower, upper)
  check_inputs(logits_fn, x, y, budget, norm=attack.norm, target=target,
               targeted=attack.targeted, minimum_norm=attack.minimum_norm,
               allow_large_eps=allow_large_eps,
               samples=attack.samples, front_door="jr.robustness_curve")
  check_cap(max_propagations)
  check_eps(epsilons, None, attack.norm, lower=lower, upper=upper,
            input_size=int(np.prod(x.shape[1:])), minimum_norm=attack.minimum_norm,
            allow_large_eps=allow_large_eps, name="epsilons")
  x, y = jnp.asarray(x), jnp.asarray(y)  # NumPy float64 without x64: float32 once, here
  keys = like_batch(as_keys(key, x.shape[0]), x)
  correct, findings = clean_diagnosis(attack.samples, logits_fn, x, y, keys)
  try:
    flags = robust_flags(attack, logits_fn, x, y, epsilons, keys, lower=lower, upper=upper,
                         correct=correct, findings=findings, target=target,
                         options=options, max_propagations=max_propagations)
  except Exception as error:  # a model written for one batch size fails on a chunk of rows
    refuse_fixed_batch(logits_fn, x, attack.samples, error, f"x's batch of {x.shape[0]}")
    raise
  return _curve(epsilons, correct, flags.robust, flags.info)


class CurveConsistency(NamedTuple):
  r"""Per-eps disagreements between minimal norms :math:`\epsilon^*` and a fixed-budget curve.

  Both describe the same thing: a clean-correct point is broken at eps iff
  :math:`\epsilon^* \le \epsilon`. Each disagreement exposes a weak attack.

  Attributes:
    epsilons: ``[K]`` the budgets of the fixed-budget curve.
    norm_attack_weaker: ``[K]`` points the fixed-budget attack broke at eps although the
      minimum-norm attack reported :math:`\epsilon^* > \epsilon` (it missed a smaller
      perturbation).
    budget_attack_weaker: ``[K]`` clean-correct points with :math:`\epsilon^* \le \epsilon` that
      the fixed-budget attack did not break (it missed a perturbation inside the ball).
  """

  epsilons: Array
  norm_attack_weaker: Array
  budget_attack_weaker: Array


def curve_consistency(norms: Array, correct: Array, curve: Curve) -> CurveConsistency:
  r"""Compares a minimum-norm attack's :math:`\epsilon^*` with a fixed-budget curve, per example.

  The true minimal distance is at most both answers; where they disagree, one attack is weak and
  the robust accuracy of the better one should be reported (or both fixed).

  Args:
    norms: ``[B]`` minimal adversarial norms (``AttackResult.norm`` of a minimum-norm attack).
    correct: ``[B]`` bool, clean prediction correct.
    curve: a fixed-budget :class:`jaxrobust.Curve` on the same examples, same order.

  Returns:
    A :class:`CurveConsistency`.

  Raises:
    TypeError: ``curve`` is not a :class:`jaxrobust.Curve`.
    ValueError: ``norms`` and ``correct`` not both ``[B]`` with the ``B`` of ``curve.robust``
      (``[K, B]``), e.g. a report's curve without per-example flags; for a concrete ``norms``
      (not under ``jax.jit``), a NaN or negative norm.

  Examples:
    >>> import jax.numpy as jnp
    >>> eps = jnp.array([0.1, 0.2])
    >>> curve = curve_from_norms(jnp.array([0.15, 0.5]), jnp.array([True, True]), eps)
    >>> c = curve_consistency(jnp.array([0.15, 0.18]), jnp.array([True, True]), curve)
    >>> c.norm_attack_weaker.tolist(), c.budget_attack_weaker.tolist()
    ([0, 0], [0, 1])
  """
  if not isinstance(curve, Curve):
    raise TypeError(f"curve must be a jaxrobust.Curve (from jr.robustness_curve, "
                    f"jr.curve_from_norms or Report.curve), got {type(curve).__name__}.")
  norms, correct = jnp.asarray(norms, jnp.float32), jnp.asarray(correct, bool)
  robust, epsilons = jnp.asarray(curve.robust, bool), jnp.asarray(curve.epsilons, jnp.float32)
  if norms.ndim != 1 or correct.shape != norms.shape or robust.shape != (*epsilons.shape,
                                                                         norms.shape[0]):
    hint = (" A report's curve has per-example flags only from jr.evaluate(..., "
            "keep_per_example=True)." if robust.ndim == 2 and robust.shape[1] == 0 else "")
    raise ValueError(f"curve_consistency takes norms [B] and correct [B] of the curve's examples, "
                     f"in its order (curve.robust is [K, B], curve.epsilons [K]); got norms "
                     f"{norms.shape}, correct {correct.shape}, curve.robust {robust.shape}, "
                     f"curve.epsilons {epsilons.shape}.{hint}")
  check_min_norms(norms)
  within = correct[None, :] & (norms[None, :] <= epsilons[:, None])
  broken = correct[None, :] & ~robust
  return CurveConsistency(
      epsilons=curve.epsilons,
      norm_attack_weaker=jnp.sum(broken & ~within, axis=1, dtype=jnp.int32),
      budget_attack_weaker=jnp.sum(within & robust, axis=1, dtype=jnp.int32))
