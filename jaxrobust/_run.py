"""``jr.run``: one attack on one batch at one budget, validated, driven and honestly scored."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrobust._options import RunOptions
from jaxrobust._types import Attack, AttackResult, Budget, as_budget
from jaxrobust._validation import check_inputs, refuse_fixed_batch
from jaxrobust.engine.attack_loop import run_attack
from jaxrobust.engine.propagations import check_cap

Array = jax.Array


def run(attack: Attack, logits_fn: Callable[[Array], Array], x: Array, y: Array,
        budget: Budget | tuple, key: Array, target: Array | None = None, *,
        allow_large_eps: bool = False, unroll: int | bool = 1,
        chunk_size: int | None = None, early_exit: bool = True,
        max_propagations: int | Array | None = None) -> AttackResult:
  """Runs ``attack`` on a batch and returns the best adversarial points with honest scores.

  The attack's ``init``/``step`` run in a loop and ``finalize`` hands back the best point seen.
  With early exit (the default) a point stops costing model evaluations once it is broken, so a
  broken point's ``x_adv`` is its *first* adversarial point; ``early_exit=False`` returns the
  strongest one (the options ``early_exit``, ``chunk_size`` and ``unroll`` are explained once, in
  :class:`jaxrobust._options.RunOptions`). Then, on the returned points only:

  * points misclassified on the clean input are not attacked: they get ``x_adv = x`` and
    ``norm = 0``; an untargeted attack counts them as ``success = True`` (the model is already
    wrong), a targeted one only where the clean prediction already is the target;
  * the returned point is always finite, inside the box and the ball, and of ``x``'s dtype
    (bfloat16 and float16 inputs are attacked in float32 and rounded towards ``x``, so rounding
    never leaves the ball);
  * ``success`` and ``logits`` are recomputed by one more forward pass on ``x_adv``, so they
    always agree with re-predicting the returned points: untargeted, ``argmax != y``; targeted,
    ``argmax == target``. Non-finite logits never count as a correct prediction (they count as a
    success for an untargeted attack and a failure for a targeted one);
  * ``info["propagations"]`` holds, per example, the forward and backward propagations the
    attack spent on it (``{"forward": [B], "backward": [B]}``; a gradient is one of each), and
    ``max_propagations`` caps their sum per example;
  * ``info["flags"]`` holds reliability checks (``[]`` bool) and ``info["counts"]`` the counts
    behind them: ``non_finite_gradients`` (clean-correct points whose input gradient of the
    cross-entropy is NaN or infinite at the clean input: attacks then use the finite part of the
    gradient, and the robust accuracy is likely overestimated), ``non_finite_adversarials``
    (points where an attack produced a non-finite point, replaced by ``x``) and, for a
    minimum-norm attack at ``eps = inf``, ``minimum_norm_not_found`` (clean-correct points for
    which it found no adversarial point: without a budget that is the attack's failure, not
    robustness); composite attacks (ensembles, AutoAttack) add their own.

  A targeted attack's ``success`` (the target was reached) is not the same as the point being
  broken (the prediction is not ``y``): :func:`jaxrobust.robustness_curve` counts a point as
  robust only where the prediction on the returned point is still ``y``.

  On CPU, an attack on a model that holds a convolution runs with canonical convolutions (the
  same values, faster steps; ``canonical`` of :class:`~jaxrobust._options.RunOptions`).

  Inputs are validated here when they are concrete; inside a user's ``jax.jit`` only shapes are
  checked, so call :func:`jaxrobust.check_inputs` on the host once if values may be wrong.

  Args:
    attack: from a factory in :mod:`jaxrobust.attacks`.
    logits_fn: ``x [B, ...] -> logits [B, C]``; treats examples independently (eval mode).
    x: ``[B, ...]`` float inputs inside ``[budget.lower, budget.upper]``.
    y: ``[B]`` int true labels.
    budget: a :class:`jaxrobust.Budget` (or a tuple ``(eps, lower, upper)``).
    key: a PRNG key, or one key per example (``[B]``) so that each example's randomness does not
      depend on its position in the batch.
    target: ``[B]`` int target classes, for targeted attacks only.
    allow_large_eps: accept budgets that cover the whole box (otherwise a ``ValueError``, since
      they usually mean eps in 0-255 units).
    unroll: passed to ``jax.lax.scan``; ``True`` turns early exit off (see
      :class:`~jaxrobust._options.RunOptions`).
    chunk_size: rows per chunk of the compaction that skips points needing no attack (``None``:
      a backend default with early exit, no compaction without; see
      :class:`~jaxrobust._options.RunOptions`).
    early_exit: stop attacking a point once it is broken (see
      :class:`~jaxrobust._options.RunOptions`).
    max_propagations: ``None`` (no cap), or an int or int ``[]``/``[B]`` array (may be traced):
      per example, the most forward plus backward propagations the attack may spend
      (AttackBench's budget). A row runs the steps that fit and keeps the best point found
      within them; a row whose cap does not cover the attack's ``init`` and ``finalize`` is not
      attacked. ``info["propagations"]`` reports what each row spent (see
      :mod:`jaxrobust.engine.propagations`). A ``ValueError`` for a negative, float or bool cap,
      and for an attack whose model calls per step depend on the data and that does not count
      them itself (``min_norm_search`` does, and stops its runs within the cap).

  Returns:
    A :class:`jaxrobust.AttackResult`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4], [0.2, 0.8]]), jnp.array([0, 0])  # 2nd is misclassified
    >>> run = jax.jit(lambda x, y: jr.run(jr.attacks.pgd("l2", steps=20), logits_fn, x, y,
    ...                                   jr.Budget(0.2), jax.random.key(0)))
    >>> result = run(x, y)  # jitted: one compiled program, not one per operation
    >>> result.success.tolist(), [round(float(n), 4) for n in result.norm]
    ([True, True], [0.2, 0.0])
  """
  budget = as_budget(budget)
  check_inputs(logits_fn, x, y, budget, norm=attack.norm, target=target,
               targeted=attack.targeted, minimum_norm=attack.minimum_norm,
               allow_large_eps=allow_large_eps, samples=attack.samples, name=attack.name)
  check_cap(max_propagations)
  x, y = jnp.asarray(x), jnp.asarray(y)  # NumPy float64 without x64: float32 once, here
  options = RunOptions(early_exit=early_exit, chunk_size=chunk_size, unroll=unroll)
  try:
    return run_attack(attack, logits_fn, x, y, budget, key, target, options=options,
                      max_propagations=max_propagations)[0]
  except Exception as error:  # a model written for one batch size fails on a chunk of rows
    refuse_fixed_batch(logits_fn, x, attack.samples, error, f"x's batch of {x.shape[0]}")
    raise
