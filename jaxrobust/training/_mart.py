"""MART (Wang et al. 2020): boosted cross-entropy at x' plus beta times the KL divergence,
weighted by how badly the clean point is classified."""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from jaxrobust import losses
from jaxrobust._batch import one_hot_mask
from jaxrobust._types import Attack, Budget, as_budget
from jaxrobust._validation import check_inputs
from jaxrobust.training._adversarial import mean_cross_entropy
from jaxrobust.training._aux import Aux
from jaxrobust.training._inner import attack_every_point, gaussian_start_ascent, inner_options
from jaxrobust.training._model import roles
from jaxrobust.training._options import LARGE_EPS_HINT, check_weight
from jaxrobust.training._trades import LINF_STEP_SIZE

Array = jax.Array

DEFAULT_STEPS = 10
"""Steps of the default inner attack (the reference's ``perturb_steps``)."""

BOOST = 1.0001
"""The reference's constant in the boosted term ``-log(1.0001 - p_{y'}(x') + 1e-12)``."""

WEIGHT = 1.0000001
"""The reference's constant in the KL weight ``1.0000001 - p_y(x)``."""

TINY = 1e-12
"""The reference's guard inside both logarithms of probabilities."""


def mart_terms(logits_clean: Array, logits_adv: Array, y: Array) -> tuple[Array, Array]:
  r"""``(boosted_ce [], weighted_kl [])`` of MART, as the reference computes them.

  .. math::
     \mathrm{BCE} = \frac1B \sum_i \Big[\mathrm{CE}(z'_i, y_i)
       - \log\big(1.0001 - q_{i, y'_i} + 10^{-12}\big)\Big], \quad
     \mathrm{WKL} = \frac1B \sum_i \Big[\sum_c p_{ic} \big(\log p_{ic}
       - \log(q_{ic} + 10^{-12})\big)\Big]\big(1.0000001 - p_{i, y_i}\big)

  with :math:`p = \mathrm{softmax}(z)` on the clean logits, :math:`q = \mathrm{softmax}(z')` on
  the adversarial ones and :math:`y'_i` the most likely class of :math:`q_i` other than
  :math:`y_i` (the second most likely when the top one is :math:`y_i`: the reference's
  ``argsort`` rule).

  Examples:
    >>> import jax.numpy as jnp
    >>> z = jnp.array([[2.0, 1.0, 0.0]])
    >>> [round(float(t), 3) for t in mart_terms(z, z, jnp.array([0]))]  # no KL at x' = x
    [0.688, 0.0]
  """
  dtype = jnp.promote_types(logits_adv.dtype, jnp.float32)
  logits_clean, logits_adv = logits_clean.astype(dtype), logits_adv.astype(dtype)
  num_classes = logits_adv.shape[-1]
  is_label = one_hot_mask(y, num_classes)
  q = jax.nn.softmax(logits_adv, axis=-1)
  # The best wrong class: one-hot by comparison with the argmax (no gather: shards like y).
  wrong_best = jnp.argmax(jnp.where(is_label, -jnp.inf, q), axis=-1)
  q_wrong = jnp.sum(jnp.where(one_hot_mask(wrong_best, num_classes), q, 0.0), axis=-1)
  boosted = mean_cross_entropy(logits_adv, y) + jnp.mean(-jnp.log(BOOST - q_wrong + TINY))
  log_p = jax.nn.log_softmax(logits_clean, axis=-1)
  p = jnp.exp(log_p)
  kl = jnp.sum(p * (log_p - jnp.log(q + TINY)), axis=-1)
  p_true = jnp.sum(jnp.where(is_label, p, 0.0), axis=-1)
  return boosted, jnp.sum(kl * (WEIGHT - p_true)) / y.shape[0]


def mart_loss(logits_fn: Callable[[Array], Array], x: Array, y: Array, budget: Budget | tuple,
              key: Array, *, beta=6.0, attack: Optional[Attack] = None,
              attack_logits_fn: Optional[Callable[[Array], Array]] = None,
              unroll: int | bool = 1) -> tuple[Array, Aux]:
  r"""MART (Wang et al. 2020), as in the reference code (YisenWang/MART, ``mart.py``).

  .. math::
     L(\theta) = \mathrm{BCE}(z', y) + \beta\, \mathrm{WKL}(z, z', y)

  with :math:`z = f_\theta(x)`, :math:`z' = f_\theta(x')` and the boosted cross-entropy and
  weighted KL of :func:`mart_terms` (the reference's constants 1.0001, 1.0000001 and 1e-12 in
  the same places). Gradients flow through both :math:`z` and :math:`z'` (the KL weight
  :math:`1 - p_y(x)` included, as in the reference) but not through :math:`x'`, a
  ``stop_gradient`` point.

  ``attack=None`` is the reference's attack: cross-entropy ascent with sign steps of ``7/31``
  eps (0.007 at eps 0.031) for 10 steps from :math:`x + 0.001\,\mathcal N(0, I)` (clipped to the
  box and the ball), each step clipped to the ball then the box, the last iterate kept. Any other
  fixed-budget, untargeted :class:`jaxrobust.Attack` may be passed instead (its norm is then the
  threat model). Every point of the batch is attacked. The attack runs the model in the mode it
  is given (the reference switches to ``model.eval()``; pass ``attack_logits_fn`` for that).

  Non-finite logits give a non-finite loss (nothing is masked; the optimiser sees it). The
  adversarial points are always finite.

  Args:
    logits_fn: the model being trained.
    x: ``[B, ...]`` inputs inside the box.
    y: ``[B]`` int labels.
    budget: a :class:`jaxrobust.Budget`; ``eps`` scalar or ``[B]``, traced.
    key: PRNG key (or ``[B]`` per-example keys) of the attack; with ``attack=None`` example
      ``i`` starts at ``x_i + 0.001 * jax.random.normal(k_i, x.shape[1:])``, as in
      :func:`trades_loss`.
    beta: weight of the KL term, ``>= 0`` (a traced scalar is used unchecked).
    attack: ``None`` (the reference's attack, Linf) or a fixed-budget untargeted attack.
    attack_logits_fn: the model the inner attack runs (default ``logits_fn``).
    unroll: passed to the inner attack's ``jax.lax.scan`` (see
      :class:`~jaxrobust._options.RunOptions`).

  Returns:
    ``(loss [], Aux(x_adv, logits_clean, logits_adv))``.

  Raises:
    ValueError: ``beta < 0``, a minimum-norm, targeted or randomized-model attack, or inputs
      that :func:`jaxrobust.check_inputs` refuses.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import jaxrobust as jr
    >>> from jaxrobust import training
    >>> w = jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4], [0.3, 0.7]]), jnp.array([0, 1])
    >>> loss_fn = jax.jit(lambda x, y, key: training.mart_loss(lambda v: v @ w, x, y,
    ...                                                        jr.Budget(0.1), key))
    >>> loss, aux = loss_fn(x, y, jax.random.key(0))
    >>> round(float(loss), 4), np.asarray(aux.x_adv, np.float64).round(4).tolist()
    (1.2462, [[0.5, 0.5], [0.4, 0.6]])

  References:
    Y. Wang, D. Zou, J. Yi, J. Bailey, X. Ma, Q. Gu. Improving adversarial robustness requires
    revisiting misclassified examples. ICLR 2020.
  """
  beta = check_weight("beta", beta)
  budget = as_budget(budget)
  model = roles(logits_fn)
  attacker = model.frozen if attack_logits_fn is None else roles(attack_logits_fn).frozen
  if attack is None:
    check_inputs(attacker, x, y, budget, norm="linf", name="mart_loss",
                 large_eps_hint=LARGE_EPS_HINT)
    x_adv = gaussian_start_ascent(lambda v: losses.cross_entropy(attacker(v), y), x, budget, key,
                                  steps=DEFAULT_STEPS, step_size=LINF_STEP_SIZE, norm="linf",
                                  unroll=unroll)
  else:
    x_adv = attack_every_point(attack, attacker, x, y, budget, key,
                               options=inner_options(unroll))
  logits_clean = model.outer(x)
  logits_adv = model.outer(x_adv)
  boosted, weighted_kl = mart_terms(logits_clean, logits_adv, y)
  loss = boosted + jnp.asarray(beta, weighted_kl.dtype) * weighted_kl
  return loss, Aux(x_adv, logits_clean, logits_adv)
