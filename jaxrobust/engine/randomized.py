r"""Randomized models: predictions judged over several draws, and expected losses and gradients.

A randomized model is a function ``logits_fn(x, keys)`` of the inputs ``[B, ...]`` and one PRNG key
per example (``[B]``), so an example's randomness never depends on its batch neighbours. One draw
of its prediction is not a measurement: a defense that randomizes can be right on one draw and
wrong on the next (AutoAttack PRs #104/#105). Here a point counts as classified as class
:math:`c` only when a strict majority of ``samples`` independent draws predicts :math:`c`:

.. math::
   \text{correct}(x) \iff \#\{s : \hat y_s(x) = y\} > \text{samples} / 2,

so an adversarial point needs to fool the model on at least half of the draws. This errs on the
side of the attacker (a tie counts as broken), never of the defense.

:class:`ExpectedLogits` wraps ``logits_fn`` for one set of draws: calling it returns the mean logits
over the draws, and :func:`jaxrobust.attacks._common.loss_grad_logits` recognises it and averages
the per-draw losses and their input gradients instead (Athalye, Carlini & Wagner's expectation over
transformation), in one backward pass over all draws.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxrobust._batch import fold_in, one_hot_mask, predict

Array = jax.Array


def draw_keys(keys: Array, samples: int) -> Array:
  """``[S, B]`` keys: draw ``s`` of example ``i`` uses ``fold_in(keys[i], s)``."""
  return jax.vmap(lambda s: fold_in(keys, s))(jnp.arange(samples, dtype=jnp.uint32))


def votes(logits_fn: Callable[[Array, Array], Array], x: Array, keys: Array,
          samples: int) -> tuple[Array, Array]:
  """Per-class vote counts ``[B, C]`` over ``samples`` draws, and the mean logits ``[B, C]``.

  Draws run one after another (``lax.map``), so memory does not grow with ``samples``. A draw
  with non-finite logits votes for no class.
  """

  def one(k):
    logits = logits_fn(x, k)
    pred = predict(logits)
    return one_hot_mask(pred, logits.shape[-1]).astype(jnp.int32), logits.astype(jnp.float32)

  counts, logits = jax.lax.map(one, draw_keys(keys, samples))
  return jnp.sum(counts, axis=0), jnp.mean(logits, axis=0)


def label_votes(counts: Array, labels: Array) -> Array:
  """``counts[i, labels[i]]`` without a gather (sharding-safe)."""
  return jnp.sum(jnp.where(one_hot_mask(labels, counts.shape[-1]), counts, 0), axis=-1)


def majority_correct(counts: Array, y: Array, samples: int) -> Array:
  """``[B]`` bool: a strict majority of the draws predicts ``y``."""
  return 2 * label_votes(counts, y) > samples


def majority_success(counts: Array, y: Array, target: Array | None, samples: int) -> Array:
  """Untargeted: ``y`` has no strict majority; targeted: ``target`` has one."""
  if target is None:
    return ~majority_correct(counts, y, samples)
  return 2 * label_votes(counts, target) > samples


class ExpectedLogits(NamedTuple):
  """A randomized ``logits_fn(x, keys)`` bound to ``[S, B]`` draw keys, used as ``f(x)``.

  Calling it gives the mean logits over the draws; ``loss_and_grad`` gives the mean per-draw loss
  and its exact input gradient :math:`\\frac1S\\sum_s \\nabla_x L(f_s(x))`.
  """

  logits_fn: Callable[[Array, Array], Array]
  keys: Array  # [S, B]

  def __call__(self, x: Array) -> Array:
    return jnp.mean(jax.lax.map(lambda k: self.logits_fn(x, k).astype(jnp.float32), self.keys),
                    axis=0)

  def loss_and_grad(self, loss_fn: Callable[..., Array], x: Array, y: Array,
                    target: Array | None) -> tuple[Array, Array, Array]:
    def total(inputs):
      def one(k):
        logits = self.logits_fn(inputs, k)
        per_ex = loss_fn(logits, y) if target is None else loss_fn(logits, y, target)
        return per_ex.astype(jnp.float32), logits.astype(jnp.float32)

      per_ex, logits = jax.lax.map(one, self.keys)
      mean_loss = jnp.mean(per_ex, axis=0)
      return jnp.sum(mean_loss), (mean_loss, jnp.mean(logits, axis=0))

    (_, (per_ex, logits)), grad = jax.value_and_grad(total, has_aux=True)(x)
    return per_ex, grad.astype(x.dtype), logits
