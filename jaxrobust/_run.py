"""``jr.run``: one attack on one batch at one budget, validated, driven and honestly scored."""

from __future__ import annotations

from typing import Callable

import jax

from jaxrobust._types import Attack, AttackResult, Budget
from jaxrobust._validation import check_chunk_size, check_inputs
from jaxrobust.engine.attack_loop import run_attack

Array = jax.Array


def run(attack: Attack, logits_fn: Callable[[Array], Array], x: Array, y: Array,
        budget: Budget | tuple, key: Array, target: Array | None = None, *,
        allow_large_eps: bool = False, unroll: int | bool = 1,
        chunk_size: int | None = None, early_exit: bool = True) -> AttackResult:
  """Runs ``attack`` on a batch and returns the best adversarial points with honest scores.

  The attack's ``init``/``step`` run in a loop and ``finalize`` hands back the best point seen.
  With ``early_exit`` (the default) a point stops costing model evaluations once the attack has
  found an adversarial point for it: broken rows are frozen, the rows left are re-compacted every
  few steps, and the loop ends when none is left (:mod:`jaxrobust.engine.early_exit`; attacks
  that declare ``done``: FGSM/PGD, APGD(-T), Square, and DeepFool, C&W, FMN and FAB at a finite
  eps). The success flags are those of the full run, but a broken point's ``x_adv`` is its
  *first* adversarial point rather than the one of largest loss (or, for FMN and C&W, the
  smallest found); pass ``early_exit=False`` for the strongest
  adversarial example (one fixed-length ``jax.lax.scan``, which can also be differentiated in
  reverse mode). Then, on the returned points only:

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

  On CPU, an attack on a model that holds a convolution is traced once more with every
  convolution in XLA:CPU's canonical form (the same values): XLA canonicalises convolutions only
  outside loops, and the input gradient's convolution would otherwise run 3-7 times slower per
  step (:mod:`jaxrobust.engine.canonical_conv`).

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
    unroll: passed to ``jax.lax.scan`` (with early exit: steps per iteration of its inner loop).
      ``True`` unrolls the whole attack loop and so turns early exit off (no loop is left to
      leave). It used to be the fast setting on CPU for convolutional models; now that the
      attack's convolutions are made canonical on CPU (see below) the loops run as fast, and
      unrolling only costs compile time (about 4 s at 10 unrolled L2 PGD steps, a minute at 14
      on the demo CNN). Results agree up to float rounding.
    chunk_size: skip the points that need no attack (misclassified ones; for an ensemble, those an
      earlier member broke): the points to attack are compacted into chunks of this many rows and
      only chunks holding such points are computed. Results equal the dense run (``None``). The
      chunk loop is a ``lax.while_loop``, which JAX cannot differentiate in reverse mode: to take
      ``jax.grad`` through an attack (adversarial training), leave ``chunk_size=None`` and pass
      ``early_exit=False``. With early exit, the rows per chunk of its re-compaction (``None``:
      up to 64 rows on CPU, 512 on accelerators, balanced across the batch).
    early_exit: stop attacking a point once it is broken (see above).

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
  budget = Budget(*budget)
  check_inputs(logits_fn, x, y, budget, norm=attack.norm, target=target,
               targeted=attack.targeted, minimum_norm=attack.minimum_norm,
               allow_large_eps=allow_large_eps, samples=attack.samples, name=attack.name)
  check_chunk_size(chunk_size)
  return run_attack(attack, logits_fn, x, y, budget, key, target, unroll=unroll,
                    chunk_size=chunk_size, early_exit=early_exit, canonical=True)[0]
