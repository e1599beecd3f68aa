"""TRADES (Zhang et al. 2019): clean cross-entropy plus beta times the KL divergence between the
predictions at x and at the KL-ascent point x'."""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from jaxrobust._types import Budget, as_budget
from jaxrobust._validation import check_inputs
from jaxrobust.training._adversarial import mean_cross_entropy
from jaxrobust.training._aux import Aux
from jaxrobust.training._inner import gaussian_start_ascent
from jaxrobust.training._model import roles
from jaxrobust.training._options import (LARGE_EPS_HINT, check_choice, check_step_size,
                                         check_steps, check_weight)

Array = jax.Array

LINF_STEP_SIZE = 7 / 31
"""Default Linf inner step as a fraction of eps: the reference's CIFAR-10 setting, step 0.007 at
eps 0.031 (``train_trades_cifar10.py``, whose ``beta = 6`` and 10 steps are the defaults here too;
``trades.py``'s own default of 0.003 is used by none of its training scripts)."""


def kl_divergence(logits_p: Array, logits_q: Array) -> Array:
  r"""``[B]``: :math:`\mathrm{KL}(p \| q) = \sum_c p_c (\log p_c - \log q_c)` with
  ``p = softmax(logits_p)`` and ``q = softmax(logits_q)``, in float32 at least.

  For finite logits, a class whose :math:`p_c` underflows to 0 contributes 0 (``log_softmax``
  stays finite), as in PyTorch's ``KLDivLoss``.

  Examples:
    >>> import jax.numpy as jnp
    >>> kl_divergence(jnp.array([[0.0, 0.0]]), jnp.array([[0.0, jnp.log(3.0)]]))  # .5 log(4/3)
    Array([0.14384101], dtype=float32)
  """
  dtype = jnp.promote_types(logits_p.dtype, jnp.float32)
  log_p = jax.nn.log_softmax(logits_p.astype(dtype), axis=-1)
  log_q = jax.nn.log_softmax(logits_q.astype(dtype), axis=-1)
  return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def trades_loss(logits_fn: Callable[[Array], Array], x: Array, y: Array, budget: Budget | tuple,
                key: Array, *, beta=6.0, steps: int = 10, step_size=None, norm: str = "linf",
                attack_logits_fn: Optional[Callable[[Array], Array]] = None,
                unroll: int | bool = 1) -> tuple[Array, Aux]:
  r"""TRADES (Zhang et al. 2019), as in the reference code (yaodongyu/TRADES, ``trades.py``).

  .. math::
     L(\theta) = \frac1B \sum_i \mathrm{CE}(f_\theta(x_i), y_i)
       + \beta \cdot \frac1B \sum_i \mathrm{KL}\big(p_\theta(x_i) \,\|\, p_\theta(x'_i)\big),
     \qquad p_\theta = \mathrm{softmax} \circ f_\theta,

  the gradient flowing through both :math:`p_\theta(x)` and :math:`p_\theta(x')` (the reference
  detaches neither) but not through :math:`x'`, a ``stop_gradient`` point. The inner attack
  ascends the (batch-summed) :math:`\mathrm{KL}(p(x) \| p(x'))` with :math:`p(x)` fixed,
  starting at :math:`x + 0.001\,\mathcal N(0, I)` (clipped to the box and the ball) and returning
  the last of ``steps`` iterates; every point of the batch is attacked. ``"linf"``: sign steps of
  ``step_size * eps``, each followed by the clip to the ball and then to the box; ``"l2"``: the
  reference's L2 variant, normalised-gradient steps of ``step_size * eps`` (a Gaussian draw where
  the gradient is 0), the point clipped to the box and the perturbation scaled back into the
  ball. With ``beta = 0`` the loss is the clean cross-entropy.

  Defaults follow the reference's CIFAR-10 training (``beta = 6``, 10 steps, step 0.007 at eps
  0.031, i.e. ``step_size = 7/31`` of eps) and, for L2, its step rule ``2 eps / steps``. Unlike
  the reference, the start is clipped into the box before the first gradient (the model never
  sees a point outside it, and ``eps = 0`` gives ``x' = x``), and the clean logits are computed
  once per outer loss (the reference runs the clean batch twice, so a train-mode BatchNorm counts
  it twice). The inner attack runs the model in the mode it is given (the reference switches to
  ``model.eval()``; pass ``attack_logits_fn`` for that, see :mod:`jaxrobust.training`).

  Non-finite logits give a non-finite loss (nothing is masked; the optimiser sees it). The
  adversarial points are always finite.

  Args:
    logits_fn: the model being trained (``nnx.Module``, ``partial(model.apply, params)``, or any
      function of the parameters being differentiated).
    x: ``[B, ...]`` inputs inside the box.
    y: ``[B]`` int labels.
    budget: a :class:`jaxrobust.Budget`; ``eps`` scalar or ``[B]``, traced.
    key: PRNG key, or ``[B]`` per-example keys ``k_i``: example ``i`` starts at
      ``x_i + 0.001 * jax.random.normal(k_i, x.shape[1:])`` (a single key gives
      ``k_i = fold_in(key, i)``).
    beta: weight of the KL term, ``>= 0`` (a traced scalar is used unchecked).
    steps: inner ascent steps (static, ``>= 1``).
    step_size: the inner step as a fraction of eps; ``None``: ``7/31`` for ``"linf"``,
      ``2 / steps`` for ``"l2"``.
    norm: ``"linf"`` or ``"l2"``.
    attack_logits_fn: the model the inner attack runs (default ``logits_fn``).
    unroll: passed to the inner attack's ``jax.lax.scan`` (see
      :class:`~jaxrobust._options.RunOptions`).

  Returns:
    ``(loss [], Aux(x_adv, logits_clean, logits_adv))``.

  Raises:
    ValueError: ``beta < 0``, ``steps < 1``, ``step_size <= 0``, an unsupported norm, or inputs
      that :func:`jaxrobust.check_inputs` refuses.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import jaxrobust as jr
    >>> from jaxrobust import training
    >>> w = jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4], [0.3, 0.7]]), jnp.array([0, 1])
    >>> loss_fn = jax.jit(lambda beta: training.trades_loss(lambda v: v @ w, x, y, jr.Budget(0.1),
    ...                                                     jax.random.key(0), beta=beta))
    >>> clean = jr.losses.cross_entropy(x @ w, y).mean()
    >>> bool(jnp.allclose(loss_fn(0.0)[0], clean))  # beta = 0: clean training
    True
    >>> loss, aux = loss_fn(6.0)  # beta is data: no new compile
    >>> # The KL grows on both sides of x: here x' is the more confident corner of the ball.
    >>> round(float(loss), 4), np.asarray(aux.x_adv, np.float64).round(4).tolist()
    (0.5465, [[0.7, 0.3], [0.2, 0.8]])

  References:
    H. Zhang, Y. Yu, J. Jiao, E. P. Xing, L. El Ghaoui, M. I. Jordan. Theoretically principled
    trade-off between robustness and accuracy. ICML 2019.
  """
  beta = check_weight("beta", beta)
  steps = check_steps(steps)
  norm = check_choice("norm", norm, ("linf", "l2"))
  step_size = check_step_size(step_size, LINF_STEP_SIZE if norm == "linf" else 2 / steps)
  budget = as_budget(budget)
  model = roles(logits_fn)
  attacker = model.frozen if attack_logits_fn is None else roles(attack_logits_fn).frozen
  check_inputs(attacker, x, y, budget, norm=norm, name="trades_loss",
               large_eps_hint=LARGE_EPS_HINT)
  target_logits = jax.lax.stop_gradient(attacker(x))
  x_adv = gaussian_start_ascent(lambda v: kl_divergence(target_logits, attacker(v)), x, budget,
                                key, steps=steps, step_size=step_size, norm=norm,
                                unroll=unroll)
  logits_clean = model.outer(x)
  logits_adv = model.outer(x_adv)
  robust = jnp.sum(kl_divergence(logits_clean, logits_adv)) / x.shape[0]
  loss = mean_cross_entropy(logits_clean, y) + jnp.asarray(beta, robust.dtype) * robust
  return loss, Aux(x_adv, logits_clean, logits_adv)
