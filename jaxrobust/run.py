"""``jr.run``: drive an attack's ``init``/``step`` under ``lax.scan`` and score what it returns."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrobust import projections
from jaxrobust._types import Attack, AttackResult, Budget
from jaxrobust._validation import check_chunk_size, check_inputs
from jaxrobust.attacks import _compact, _stochastic
from jaxrobust import losses
from jaxrobust.attacks._common import (as_keys, expand, fold_in, is_correct, is_success,
                                       like_batch, rows_finite, work_dtype)

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
    gradient, and the robust accuracy is likely overestimated) and ``non_finite_adversarials``
    (points where an attack produced a non-finite point, replaced by ``x``); composite attacks
    (ensembles, AutoAttack) add their own.

  A targeted attack's ``success`` (the target was reached) is not the same as the point being
  broken (the prediction is not ``y``): :func:`jaxrobust.robustness_curve` counts a point as
  robust only where the prediction on the returned point is still ``y``.

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
      only chunks holding such points are computed. Results equal the dense run (``None``). The
      chunk loop is a ``lax.while_loop``, which JAX cannot differentiate in reverse mode: to take
      ``jax.grad`` through an attack (adversarial training), leave ``chunk_size=None``.

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
               allow_large_eps=allow_large_eps, samples=attack.samples, name=attack.name)
  check_chunk_size(chunk_size)
  return run_unchecked(attack, logits_fn, x, y, budget, key, target, unroll=unroll,
                       chunk_size=chunk_size)


def clean_diagnosis(samples: int, logits_fn: Callable[..., Array], x: Array, y: Array,
                    keys: Array) -> tuple[Array, Array]:
  """The clean verdict and the gradient check, from one forward and one backward pass.

  Returns ``(correct, bad_gradient)``, both ``[B]`` bool: the clean prediction is ``y`` (for a
  randomized model, ``samples > 0``, by a strict majority over ``samples`` draws; see
  :attr:`jaxrobust.Attack.samples`), and the input gradient of the cross-entropy at ``x`` has a
  non-finite entry (not checked for randomized models: ``False``).
  """
  if samples:
    return clean_correct_mask(samples, logits_fn, x, y, keys), jnp.zeros(y.shape, bool)

  def total(inputs):
    logits = logits_fn(inputs)
    return jnp.sum(losses.cross_entropy(logits, y).astype(jnp.float32)), logits

  grad, logits = jax.grad(total, has_aux=True)(x)
  return is_correct(logits, y), ~rows_finite(grad)


def clean_correct_mask(samples: int, logits_fn: Callable[..., Array], x: Array, y: Array,
                       keys: Array) -> Array:
  """``[B]`` bool: the clean prediction is ``y``; for a randomized model (``samples > 0``, see
  :attr:`jaxrobust.Attack.samples`), by a strict majority over ``samples`` draws."""
  if samples:
    counts, _ = _stochastic.votes(logits_fn, x, fold_in(keys, _CLEAN_DRAWS), samples)
    return _stochastic.majority_correct(counts, y, samples)
  return is_correct(logits_fn(x), y)


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


def run_unchecked(attack: Attack, logits_fn: Callable[..., Array], x: Array, y: Array,
                  budget: Budget, key: Array, target: Array | None = None, *,
                  unroll: int | bool = 1, clean_correct: Array | None = None,
                  bad_gradient: Array | None = None, active: Array | None = None,
                  chunk_size: int | None = None) -> AttackResult:
  """:func:`run` without input validation (for drivers that validated once already).

  ``clean_correct`` (``[B]`` bool, clean prediction equals ``y``) and ``bad_gradient`` (``[B]``
  bool, from :func:`clean_diagnosis`) may be passed by a driver that has them already, e.g. a
  curve running the attack once per eps, to skip a forward and a backward pass.
  ``active`` (``[B]`` bool) restricts the attack to some points (the others get ``x_adv = x``);
  with ``chunk_size`` the active points are compacted into chunks of that many rows and only
  chunks holding active points are computed (see :mod:`jaxrobust.attacks._compact`).
  """
  return run_scored(attack, logits_fn, x, y, budget, key, target, unroll=unroll,
                    clean_correct=clean_correct, bad_gradient=bad_gradient, active=active,
                    chunk_size=chunk_size)[0]


def run_scored(attack: Attack, logits_fn: Callable[..., Array], x: Array, y: Array,
               budget: Budget, key: Array, target: Array | None = None, *,
               unroll: int | bool = 1, clean_correct: Array | None = None,
               bad_gradient: Array | None = None, active: Array | None = None,
               chunk_size: int | None = None) -> tuple[AttackResult, Array]:
  """:func:`run_unchecked` and ``broken`` (``[B]`` bool): the point is not robust, i.e. the clean
  prediction or the prediction on ``x_adv`` is not ``y``. For untargeted attacks ``broken`` equals
  ``success``; for targeted ones a point can be broken without the target being reached."""
  budget = Budget(*budget)
  x_input = x
  x = x.astype(work_dtype(x))
  batch = x.shape[0]
  keys = like_batch(as_keys(key, batch), x)
  if clean_correct is None:
    clean_correct, checked = clean_diagnosis(attack.samples, logits_fn, x_input, y, keys)
    bad_gradient = checked if bad_gradient is None else bad_gradient
  clean_wrong = ~clean_correct
  todo = clean_correct if active is None else clean_correct & active
  info = {}
  if attack.drive is not None:
    x_adv, info = attack.drive(logits_fn, x, y, budget, keys, target, todo, chunk_size)
    info = dict(info or {})
  else:
    rows = _attack_rows(attack, logits_fn, budget.lower, budget.upper, unroll)
    eps = like_batch(jnp.broadcast_to(jnp.asarray(budget.eps, x.dtype), (batch,)), x)
    if chunk_size is None:
      x_adv = rows(x, y, eps, keys, target)
    else:
      x_adv = _compact.compacted(rows, todo, chunk_size, x, y, eps, keys, target)
  x_adv = x_adv.astype(x.dtype)
  # The returned point is finite and inside the box whatever the attack did (a NaN gradient, an
  # overflowing loss): a non-finite row falls back to x, and is counted.
  finite = rows_finite(x_adv)
  lower, upper = (jnp.asarray(b, x.dtype) for b in (budget.lower, budget.upper))
  x_adv = jnp.where(expand(todo & finite, x.ndim), jnp.clip(x_adv, lower, upper), x)
  x_adv = round_toward(x_adv, x_input)
  if attack.samples:
    counts, logits = _stochastic.votes(logits_fn, x_adv, fold_in(keys, _SCORE_DRAWS),
                                       attack.samples)
    success = _stochastic.majority_success(counts, y, target, attack.samples)
    broken = _stochastic.majority_success(counts, y, None, attack.samples)
  else:
    logits = logits_fn(x_adv)
    success = is_success(logits, y, target)
    broken = ~is_correct(logits, y)
  broken = broken | clean_wrong
  if target is None:
    success = success | clean_wrong
  size = projections.norm(x_adv.astype(x.dtype) - x, attack.norm)
  if attack.minimum_norm:
    size = jnp.where(success, size, jnp.inf)
  flags, counts = dict(info.pop("flags", {})), dict(info.pop("counts", {}))
  counts["non_finite_adversarials"] = jnp.sum(todo & ~finite, dtype=jnp.int32)
  flags["non_finite_adversarials"] = counts["non_finite_adversarials"] > 0
  if bad_gradient is not None:
    counts["non_finite_gradient_points"] = jnp.sum(clean_correct & bad_gradient, dtype=jnp.int32)
    flags["non_finite_gradients"] = counts["non_finite_gradient_points"] > 0
  info.update(flags=flags, counts=counts)
  return AttackResult(x_adv=x_adv, success=success, norm=size, logits=logits, info=info), broken
