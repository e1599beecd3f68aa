r"""Expectation over transformation (EOT): attacking a randomized model.

A randomized defense ``logits_fn(x, keys)`` (noise, random resizing, dropout at test time, ...)
draws fresh randomness on every call, so one gradient is a noisy estimate and one prediction is
not a verdict. ``eot(attack, samples)`` runs ``attack`` on the expected model: at every step the
loss and its input gradient are averaged over ``samples`` independent draws,

.. math::
   \nabla_x\, \mathbb{E}_{\theta}\,L\big(f_\theta(x), y\big) \approx
   \frac1S \sum_{s=1}^{S} \nabla_x L\big(f_{\theta_s}(x), y\big),

(fresh draws at every step, from the example's own key), and :func:`jaxrobust.run` judges the
clean input and the returned point by a strict majority over ``samples`` further draws: a point
is robust only if the model predicts ``y`` on more than half of them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from jaxrobust._types import Attack
from jaxrobust._validation import check_positive_int
from jaxrobust._batch import fold_in
from jaxrobust.engine import randomized

Array = jax.Array

_TAG = 0xE07  # folded into the per-example keys for the attack's own draws


class EOTState(NamedTuple):
  """The wrapped attack's state, the per-example keys and the step counter."""

  inner: Any
  keys: Array  # [B] typed keys
  t: Array  # [] int32


def eot(attack: Attack, samples: int = 20) -> Attack:
  r"""``attack`` on a randomized ``logits_fn(x, keys)``, with losses, gradients and verdicts
  averaged over ``samples`` draws.

  The randomized model takes the inputs ``[B, ...]`` and one PRNG key per example ``[B]`` (so an
  example's randomness does not depend on its batch neighbours) and returns logits ``[B, C]``.
  Inside the attack, every forward pass is the mean of ``samples`` draws and every gradient the
  mean of the per-draw loss gradients, in one backward pass. Each step uses fresh draws.
  :func:`jaxrobust.run` then counts a point as correctly classified only when a strict majority
  of ``samples`` fresh draws predicts its label (see :mod:`jaxrobust.engine.randomized`).

  Args:
    attack: a gradient or score-based attack from :mod:`jaxrobust.attacks` (not an ensemble:
      wrap each member instead, ``ensemble(eot(a, n), eot(b, n))``).
    samples: draws per forward pass and per verdict (AutoAttack's ``rand`` version uses 20).

  Returns:
    A :class:`jaxrobust.Attack` with ``samples`` set; ``logits_fn`` must be ``(x, keys) -> logits``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> w = jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> def noisy(x, keys):  # Gaussian noise on the input, one key per example
    ...   noise = jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(keys)
    ...   return (x + 0.05 * noise) @ w
    >>> x, y = jnp.array([[0.6, 0.4]]), jnp.array([0])  # Linf distance 0.1
    >>> attack = jr.attacks.eot(jr.attacks.pgd("linf", steps=10), samples=8)
    >>> run = jax.jit(lambda x, y: jr.run(attack, noisy, x, y, jr.Budget(0.2), jax.random.key(0)))
    >>> bool(run(x, y).success[0])
    True

  References:
    Athalye, Engstrom, Ilyas & Kwok, "Synthesizing Robust Adversarial Examples", ICML 2018.
    Athalye, Carlini & Wagner, "Obfuscated Gradients Give a False Sense of Security", ICML 2018.
    Croce & Hein, ICML 2020 (AutoAttack's ``rand`` version: APGD with 20 EOT draws).
  """
  if not isinstance(attack, Attack):
    raise TypeError(f"eot() wraps a jr.Attack, got {type(attack).__name__}.")
  samples = check_positive_int("samples", samples)
  if attack.samples:
    raise ValueError(f"{attack.name} already attacks a randomized model; do not nest eot().")
  if attack.suite is not None or attack.drive is not None:
    raise ValueError(f"eot() cannot wrap the ensemble {attack.name!r}: wrap each member, e.g. "
                     "ensemble(eot(a, n), eot(b, n)).")

  def expected(logits_fn, keys, t):
    return randomized.ExpectedLogits(
        logits_fn, randomized.draw_keys(fold_in(fold_in(keys, _TAG), t), samples))

  def init(logits_fn, x, y, budget, keys, target=None):
    inner = attack.init(expected(logits_fn, keys, 0), x, y, budget, keys, target)
    t = jax.numpy.zeros((), jax.numpy.int32)
    return EOTState(inner, keys, t)

  def step(logits_fn, state: EOTState, x, y, budget, target=None):
    f = expected(logits_fn, state.keys, state.t + 1)
    return EOTState(attack.step(f, state.inner, x, y, budget, target), state.keys, state.t + 1)

  def finalize(logits_fn, state: EOTState, x, y, budget, target=None):
    f = expected(logits_fn, state.keys, state.t + 1)
    return attack.finalize(f, state.inner, x, y, budget, target)

  return Attack(init=init, step=step, finalize=finalize, num_steps=attack.num_steps,
                norm=attack.norm, targeted=attack.targeted, minimum_norm=attack.minimum_norm,
                name=f"eot{samples}({attack.name})", samples=samples)
