"""Madry et al.'s adversarial training loss: cross-entropy at the attack's points."""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from jaxrobust import losses
from jaxrobust._types import Attack, Budget, as_budget
from jaxrobust.attacks import pgd
from jaxrobust.training._aux import Aux
from jaxrobust.training._inner import attack_every_point, check_attack, inner_options
from jaxrobust.training._model import roles

Array = jax.Array

DEFAULT_STEPS = 10
"""PGD steps of the default training attack, ``jr.attacks.pgd("linf", steps=10)``."""


def mean_cross_entropy(logits: Array, y: Array) -> Array:
  """``(1/B) sum_i CE(logits_i, y_i)`` in float32 at least, ``[]``."""
  per_example = losses.cross_entropy(logits, y)
  return jnp.mean(per_example.astype(jnp.promote_types(per_example.dtype, jnp.float32)))


def adversarial_loss(logits_fn: Callable[[Array], Array], x: Array, y: Array,
                     budget: Budget | tuple, key: Array, *, attack: Optional[Attack] = None,
                     attack_logits_fn: Optional[Callable[[Array], Array]] = None,
                     unroll: int | bool = 1) -> tuple[Array, Aux]:
  r"""Adversarial training (Madry et al. 2018): the mean cross-entropy at the attack's points.

  .. math::
     L(\theta) = \frac1B \sum_{i=1}^B \mathrm{CE}\big(f_\theta(x'_i), y_i\big), \qquad
     x' = \mathrm{sg}\Big(\arg\max_{\|x'_i - x_i\| \le \epsilon,\ l \le x'_i \le u}
          \mathrm{CE}(f_\theta(x'_i), y_i)\Big)

  with :math:`x'` found by ``attack`` (default ``jr.attacks.pgd("linf", steps=10)``: a uniform
  random start in the ball, steps along a cosine schedule from 2 eps, the best iterate kept) and
  ``sg`` = ``stop_gradient``: the gradient is that of the cross-entropy at the fixed point
  :math:`x'` (Danskin's theorem), never through the attack. **Every** point of the batch is
  attacked, misclassified ones included (unlike :func:`jaxrobust.run`, which leaves them as they
  are: right for evaluation, wrong for training, where early on most points are misclassified).
  The attack defines the norm; ``budget`` its radius and box.

  Non-finite logits give a non-finite loss (and gradients): nothing is masked, so the optimiser
  sees it (``optax.apply_if_finite`` skips such steps). The adversarial points are always finite.

  Args:
    logits_fn: the model being trained, ``x [B, ...] -> logits [B, C]``: an ``nnx.Module``, a
      ``functools.partial(model.apply, params)`` or any function of the parameters being
      differentiated.
    x: ``[B, ...]`` inputs inside ``[budget.lower, budget.upper]``.
    y: ``[B]`` int labels.
    budget: a :class:`jaxrobust.Budget` (``eps`` scalar or ``[B]``, traced).
    key: PRNG key (or ``[B]`` per-example keys) of the attack's randomness.
    attack: a fixed-budget, untargeted :class:`jaxrobust.Attack` (minimum-norm and targeted
      attacks are refused: they do not look for the worst point of the budget).
    attack_logits_fn: the model the attack runs (default ``logits_fn``), e.g. an eval-mode view
      ``nnx.view(model, deterministic=True, use_running_average=True)``.
    unroll: passed to the inner attack's ``jax.lax.scan`` (see
      :class:`~jaxrobust._options.RunOptions`).

  Returns:
    ``(loss [], Aux(x_adv, None, logits_adv))``.

  Raises:
    ValueError: a minimum-norm, targeted or randomized-model attack, or inputs that
      :func:`jaxrobust.check_inputs` refuses.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import jaxrobust as jr
    >>> from jaxrobust import training
    >>> w = jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4], [0.3, 0.7]]), jnp.array([0, 0])  # 2nd is misclassified
    >>> loss_fn = lambda w: training.adversarial_loss(lambda v: v @ w, x, y, jr.Budget(0.1),
    ...                                               jax.random.key(0))
    >>> (loss, aux), grad = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(w)
    >>> bool(jnp.all(aux.x_adv != x))  # both points moved, the misclassified one too
    True
    >>> round(float(loss), 4), np.asarray(aux.x_adv, np.float64).round(4).tolist()
    (1.0782, [[0.5, 0.5], [0.2, 0.8]])

  References:
    A. Madry, A. Makelov, L. Schmidt, D. Tsipras, A. Vladu. Towards deep learning models
    resistant to adversarial attacks. ICLR 2018.
  """
  attack = check_attack(pgd("linf", steps=DEFAULT_STEPS) if attack is None else attack)
  budget = as_budget(budget)
  model = roles(logits_fn)
  attacker = model.frozen if attack_logits_fn is None else roles(attack_logits_fn).frozen
  x_adv = attack_every_point(attack, attacker, x, y, budget, key, options=inner_options(unroll))
  logits_adv = model.outer(x_adv)
  return mean_cross_entropy(logits_adv, y), Aux(x_adv, None, logits_adv)
