"""``jr.run``: drive an attack's ``init``/``step`` under ``lax.scan`` and score what it returns."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrobust import projections
from jaxrobust._types import Attack, AttackResult, Budget
from jaxrobust._validation import check_chunk_size, check_inputs
from jaxrobust.attacks import _compact, _stochastic
from jaxrobust.attacks._common import (as_keys, expand, fold_in, is_success, like_batch, predict,
                                       work_dtype)

Array = jax.Array

# Tags folded into the per-example keys for the draws of a randomized model that judge the clean
# input and the returned point (distinct from any attack's own use of the keys).
_CLEAN_DRAWS = 0x7C1EA
_SCORE_DRAWS = 0x5C03E


def run(attack: Attack, logits_fn: Callable[[Array], Array], x: Array, y: Array,
        budget: Budget | tuple, key: Array, target: Array | None = None, *,
        allow_large_eps: bool = False, unroll: int | bool = 1,
        chunk_size: int | None = None) -> AttackResult:
  """Runs ``attack`` on a batch and returns the best adversarial points with honest scores.

  The attack's ``init``/``step`` run under one fixed-length ``jax.lax.scan``; ``finalize`` hands
  back the best point seen. Then, on the returned points only:

  * points misclassified on the clean input get ``x_adv = x``, ``success = True``, ``norm = 0``;
  * ``success`` and ``logits`` are recomputed by one more forward pass on ``x_adv``, so they
    always agree with re-predicting the returned points;
  * non-finite logits never count as a correct prediction (they count as a success for an
    untargeted attack and a failure for a targeted one).

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
    unroll: passed to ``jax.lax.scan``. ``True`` unrolls the whole attack loop: compilation takes
      longer, but on XLA:CPU the input gradient of a strided convolution runs several times
      slower inside a loop body than outside one (the kernel keeps a non-canonical layout there;
      see ``benchmarks/RESULTS.md``), so short attacks on convolutional models run faster fully
      unrolled on CPU. Results agree up to float rounding. Unrolling is not free: XLA:CPU's
      compile time grows quickly with unrolled L2 PGD steps (about 4 s at 10 steps, a minute at
      14 on the demo CNN), so unroll short attacks only.
    chunk_size: skip the points that need no attack (misclassified ones; for an ensemble, those an
      earlier member broke): the points to attack are compacted into chunks of this many rows and
      only chunks holding such points are computed. Results equal the dense run (``None``).

  Returns:
    A :class:`jaxrobust.AttackResult`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> logits_fn = lambda x: x @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4], [0.2, 0.8]]), jnp.array([0, 0])  # 2nd is misclassified
    >>> result = jr.run(jr.attacks.pgd("l2", steps=20), logits_fn, x, y, jr.Budget(0.2),
    ...                 jax.random.key(0))
    >>> result.success.tolist(), [round(float(n), 4) for n in result.norm]
    ([True, True], [0.2, 0.0])
  """
  budget = Budget(*budget)
  check_inputs(logits_fn, x, y, budget, norm=attack.norm, target=target,
               targeted=attack.targeted, minimum_norm=attack.minimum_norm,
               allow_large_eps=allow_large_eps, samples=attack.samples)
  check_chunk_size(chunk_size)
  return run_unchecked(attack, logits_fn, x, y, budget, key, target, unroll=unroll,
                       chunk_size=chunk_size)


def clean_correct_mask(samples: int, logits_fn: Callable[..., Array], x: Array, y: Array,
                       keys: Array) -> Array:
  """``[B]`` bool: the clean prediction is ``y``; for a randomized model (``samples > 0``, see
  :attr:`jaxrobust.Attack.samples`), by a strict majority over ``samples`` draws."""
  if samples:
    counts, _ = _stochastic.votes(logits_fn, x, fold_in(keys, _CLEAN_DRAWS), samples)
    return _stochastic.majority_correct(counts, y, samples)
  return predict(logits_fn(x)) == y.astype(jnp.int32)


def _attack_rows(attack: Attack, logits_fn, lower, upper, unroll):
  """``(x, y, eps, keys, target) -> x_adv``: the attack's ``init``/``step`` loop and ``finalize``."""

  def rows(x, y, eps, keys, target):
    budget = Budget(eps, lower, upper)

    def body(state, _):
      return attack.step(logits_fn, state, x, y, budget, target), None

    state = attack.init(logits_fn, x, y, budget, keys, target)
    state, _ = jax.lax.scan(body, state, None, length=attack.num_steps, unroll=unroll)
    return attack.finalize(logits_fn, state, x, y, budget, target).astype(x.dtype)

  return rows


def run_unchecked(attack: Attack, logits_fn: Callable[..., Array], x: Array, y: Array,
                  budget: Budget, key: Array, target: Array | None = None, *,
                  unroll: int | bool = 1, clean_correct: Array | None = None,
                  active: Array | None = None, chunk_size: int | None = None) -> AttackResult:
  """:func:`run` without input validation (for drivers that validated once already).

  ``clean_correct`` (``[B]`` bool, clean prediction equals ``y``) may be passed by a driver that
  has it already, e.g. a curve running the attack once per eps, to skip one forward pass.
  ``active`` (``[B]`` bool) restricts the attack to some points (the others get ``x_adv = x``);
  with ``chunk_size`` the active points are compacted into chunks of that many rows and only
  chunks holding active points are computed (see :mod:`jaxrobust.attacks._compact`).
  """
  budget = Budget(*budget)
  x = x.astype(work_dtype(x))
  batch = x.shape[0]
  keys = like_batch(as_keys(key, batch), x)
  if clean_correct is None:
    clean_correct = clean_correct_mask(attack.samples, logits_fn, x, y, keys)
  clean_wrong = ~clean_correct
  todo = clean_correct if active is None else clean_correct & active
  info = None
  if attack.drive is not None:
    x_adv, info = attack.drive(logits_fn, x, y, budget, keys, target, todo, chunk_size)
  else:
    rows = _attack_rows(attack, logits_fn, budget.lower, budget.upper, unroll)
    eps = like_batch(jnp.broadcast_to(jnp.asarray(budget.eps, x.dtype), (batch,)), x)
    if chunk_size is None:
      x_adv = rows(x, y, eps, keys, target)
    else:
      x_adv = _compact.compacted(rows, todo, chunk_size, x, y, eps, keys, target)
  x_adv = jnp.where(expand(todo, x.ndim), x_adv.astype(x.dtype), x)
  if attack.samples:
    counts, logits = _stochastic.votes(logits_fn, x_adv, fold_in(keys, _SCORE_DRAWS),
                                       attack.samples)
    success = _stochastic.majority_success(counts, y, target, attack.samples)
  else:
    logits = logits_fn(x_adv)
    success = is_success(logits, y, target)
  success = success | clean_wrong
  size = projections.norm(x_adv - x, attack.norm)
  if attack.minimum_norm:
    size = jnp.where(success, size, jnp.inf)
  return AttackResult(x_adv=x_adv, success=success, norm=size, logits=logits, info=info)
