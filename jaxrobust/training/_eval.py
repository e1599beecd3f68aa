"""Robust metrics inside the jitted eval step of a training loop: one batch's mergeable counts."""

from __future__ import annotations

from typing import Callable, Optional

import jax

from jaxrobust._batch import is_correct, predict
from jaxrobust._options import RunOptions
from jaxrobust._types import Attack, Budget, as_budget
from jaxrobust._validation import check_inputs
from jaxrobust.attacks import pgd
from jaxrobust.engine.attack_loop import run_attack
from jaxrobust.metrics import Counts
from jaxrobust.metrics.conventions import row_mask
from jaxrobust.training._adversarial import DEFAULT_STEPS
from jaxrobust.training._inner import check_attack
from jaxrobust.training._model import roles
from jaxrobust.training._options import LARGE_EPS_HINT

Array = jax.Array


def robust_counts(logits_fn: Callable[[Array], Array], x: Array, y: Array,
                  budget: Budget | tuple, key: Array, *, attack: Optional[Attack] = None,
                  mask: Optional[Array] = None, unroll: int | bool = 1,
                  early_exit: bool = True) -> Counts:
  r"""Clean and robust accuracy counts of one batch: a mergeable :class:`~jaxrobust.metrics.Counts`.

  The attack (default ``jr.attacks.pgd("linf", steps=10)``) runs with :func:`jaxrobust.run`'s
  evaluation semantics: clean-misclassified points are not attacked (they already count as
  wrong), every returned point is re-predicted, non-finite logits never count as correct. The
  model is evaluated as given, without state updates (put it in eval mode); nothing is
  differentiated. On CPU a convolutional model's attack loop runs with every convolution in
  XLA:CPU's canonical form (as in :func:`jaxrobust.run`): the same counts, faster steps.

  The counts are exact int32 sums: merge them across steps with
  :meth:`~jaxrobust.metrics.Counts.merge` (or ``update``), across devices with
  ``counts.psum(axis_name)`` inside ``jax.shard_map`` (under ``jit`` with batch-sharded inputs
  they are already global), and read them with
  ``counts.compute()``, a dict of float32 scalars (``accuracy``, ``robust_accuracy``,
  ``attack_success_rate``, ...); ``{k: float(v) for k, v in counts.compute().items()}`` suits any
  logger.

  Args:
    logits_fn: the model (``nnx.Module``, ``partial(model.apply, params)``, any function).
    x: ``[B, ...]`` inputs inside the box.
    y: ``[B]`` int labels.
    budget: a :class:`jaxrobust.Budget`.
    key: PRNG key (or ``[B]`` per-example keys) of the attack.
    attack: an untargeted attack for a deterministic model (fixed-budget or minimum-norm, whose
      points lie inside ``budget.eps``); ``None``: ``pgd("linf", steps=10)``.
    mask: optional ``[B]`` bool; ``False`` rows (padding) are neither attacked nor counted.
    unroll: passed to the attack's ``jax.lax.scan`` (see :class:`~jaxrobust._options.RunOptions`).
    early_exit: stop attacking a point once broken (see :class:`~jaxrobust._options.RunOptions`):
      the same counts of robust points, fewer model evaluations; the perturbation sums are then
      those of each broken point's first adversarial point.

  Returns:
    :class:`jaxrobust.metrics.Counts` of the batch (with the attack-norm perturbation sums).

  Raises:
    ValueError: inputs that :func:`jaxrobust.check_inputs` refuses, an attack that cannot be
      used here (targeted, or for a randomized model), or a ``mask`` that is not ``[B]`` (one
      flag per example of ``x``), refused before the attack runs.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> from jaxrobust import training
    >>> w = jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4], [0.52, 0.48], [0.3, 0.7]]), jnp.array([0, 0, 0])
    >>> step = jax.jit(lambda x, y, key: training.robust_counts(lambda v: v @ w, x, y,
    ...                                                         jr.Budget(0.05), key))
    >>> counts = step(x, y, jax.random.key(0))  # margins 0.4 (robust), 0.08 (broken), -0.8
    >>> counts = counts.merge(step(x[::-1], y, jax.random.key(1)))  # a second batch
    >>> metrics = {k: round(float(v), 3) for k, v in counts.compute().items()}  # for a logger
    >>> metrics["accuracy"], metrics["robust_accuracy"], metrics["conditional_robust_accuracy"]
    (0.667, 0.333, 0.5)
  """
  attack = pgd("linf", steps=DEFAULT_STEPS) if attack is None else attack
  check_attack(attack, training=False)
  options = RunOptions(early_exit=early_exit, unroll=unroll)
  budget = as_budget(budget)
  model = roles(logits_fn).frozen
  check_inputs(model, x, y, budget, norm=attack.norm, minimum_norm=attack.minimum_norm,
               name=attack.name, large_eps_hint=LARGE_EPS_HINT)
  active = None if mask is None else row_mask(mask, x.shape[0])  # before the attack runs
  logits_clean = model(x)
  clean_correct = is_correct(logits_clean, y)
  result, _ = run_attack(attack, model, x, y, budget, key, options=options,
                         clean_correct=clean_correct, active=active)
  return Counts.from_batch(predict(logits_clean), predict(result.logits), y, x=x,
                           x_adv=result.x_adv, norm=attack.norm, mask=mask)
