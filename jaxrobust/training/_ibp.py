"""Interval bound propagation training (Gowal et al. 2018): cross-entropy of the clean logits
mixed with the cross-entropy of the worst-case logits the bounds allow."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrobust import certify
from jaxrobust._batch import expand, like_batch, one_hot_mask, work_dtype
from jaxrobust._types import Budget, as_budget
from jaxrobust._validation import check_inputs
from jaxrobust.training._adversarial import mean_cross_entropy
from jaxrobust.training._aux import Aux
from jaxrobust.training._model import roles
from jaxrobust.training._options import LARGE_EPS_HINT, check_choice, check_weight

Array = jax.Array


def worst_case_logits(margin_lower: Array, y: Array) -> Array:
  r"""``[B, C]`` logits :math:`\hat z` with :math:`\hat z_y = 0` and :math:`\hat z_j = -m_j`,
  from lower bounds :math:`m_j \le z_y - z_j` (``+inf`` at ``j = y``, as
  :func:`jaxrobust.certify.margin_bounds` returns them).

  Then :math:`\hat z_j - \hat z_y` is an upper bound of :math:`z_j - z_y` for every point of the
  box, so :math:`\mathrm{CE}(\hat z, y) \ge \mathrm{CE}(z(x'), y)` there, and
  ``argmax`` :math:`\hat z = y` exactly when the box is certified.

  Examples:
    >>> import jax.numpy as jnp
    >>> worst_case_logits(jnp.array([[jnp.inf, 0.5, -1.0]]), jnp.array([0]))
    Array([[ 0. , -0.5,  1. ]], dtype=float32)
  """
  return jnp.where(one_hot_mask(y, margin_lower.shape[-1]), jnp.zeros_like(margin_lower),
                   -margin_lower)


def ibp_loss(logits_fn: Callable[[Array], Array], x: Array, y: Array, budget: Budget | tuple, *,
             kappa=0.5, norm: str = "linf") -> tuple[Array, Aux]:
  r"""IBP training (Gowal et al. 2018): clean cross-entropy mixed with the worst case's.

  .. math::
     L(\theta) = \kappa \cdot \frac1B \sum_i \mathrm{CE}(z_i, y_i)
       + (1 - \kappa) \cdot \frac1B \sum_i \mathrm{CE}(\hat z_i, y_i)

  with :math:`z = f_\theta(x)` and :math:`\hat z` the worst-case logits of the box
  :math:`[\max(x - \epsilon, l), \min(x + \epsilon, u)]` (the Linf ball intersected with the
  input box): :math:`\hat z_j - \hat z_y` is the interval-bound-propagation upper bound of
  :math:`z_j - z_y`, with the specification :math:`z_j - z_y` merged into the last affine layer
  (:func:`jaxrobust.certify.margin_bounds` with ``method="ibp"``), as in the paper; it is never
  looser than the elementwise form "upper bound of :math:`z_j` minus lower bound of
  :math:`z_y`". Since :math:`\mathrm{CE}` depends on logit differences only, the second term
  bounds the cross-entropy at every point of the box from above; at ``eps = 0`` the loss is the
  clean cross-entropy. Gradients flow through the bounds (the weights are differentiated through
  the propagation).

  The paper ramps ``eps`` from 0 and ``kappa`` from 1 down to 0.5 over training: both are data
  here (``eps`` through ``budget``, traced; ``kappa`` may be a traced scalar), so a schedule
  never recompiles. The model is bounded as given, without state updates (a pure copy); a
  BatchNorm model must therefore be bounded in eval mode (batch statistics mix examples, which
  bounds cannot follow: :class:`NotImplementedError` names the primitive, or, called outside
  ``jit`` on concrete inputs and weights, :func:`jaxrobust.certify.margin_bounds`'
  :class:`ValueError` says that the output of an example depends on the others). The forward
  pass on ``x`` is the model as given (it updates state in train mode).

  Non-finite logits or bounds give a non-finite loss (nothing is masked; the optimiser sees it).

  Args:
    logits_fn: the model being trained; its primitives must be supported by
      :func:`jaxrobust.certify.interval_bounds` (dense, convolution, ReLU, pooling, ...).
    x: ``[B, ...]`` inputs inside the box.
    y: ``[B]`` int labels.
    budget: a :class:`jaxrobust.Budget`; ``eps`` scalar or ``[B]``, traced.
    kappa: weight of the clean term, in ``[0, 1]`` (a traced scalar is used unchecked).
    norm: ``"linf"``, the only threat model IBP bounds here.

  Returns:
    ``(loss [], Aux(x, logits_clean, z_hat))``: no attack point (``x_adv`` is ``x``), and
    ``z_hat`` the worst-case logits above (``argmax z_hat == y`` where the box is certified).

  Raises:
    ValueError: ``kappa`` outside ``[0, 1]``, a norm other than ``"linf"``, inputs that
      :func:`jaxrobust.check_inputs` refuses, or what :func:`jaxrobust.certify.margin_bounds`
      refuses (outside ``jit``: a model whose output for an example depends on the others).
    NotImplementedError: a primitive of the model that bound propagation does not support.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> from jaxrobust import training
    >>> w = jnp.array([[1.0, -1.0], [-1.0, 1.0]])
    >>> x, y = jnp.array([[0.6, 0.4], [0.3, 0.7]]), jnp.array([0, 1])
    >>> loss_fn = jax.jit(lambda eps: training.ibp_loss(lambda v: v @ w, x, y, jr.Budget(eps)))
    >>> bool(jnp.allclose(loss_fn(0.0)[0], jr.losses.cross_entropy(x @ w, y).mean()))
    True
    >>> loss, aux = loss_fn(0.15)  # margins 0.4 and 0.8 shrink by ||w_0 - w_1||_1 * 0.15 = 0.6
    >>> round(float(loss), 4), (jnp.argmax(aux.logits_adv, axis=-1) == y).tolist()  # certified?
    (0.5701, [False, True])

  References:
    S. Gowal, K. Dvijotham, R. Stanforth, R. Bunel, C. Qin, J. Uesato, R. Arandjelovic, T. Mann,
    P. Kohli. On the effectiveness of interval bound propagation for training verifiably robust
    models. arXiv:1810.12715, 2018.
  """
  kappa = check_weight("kappa", kappa, high=1.0)
  check_choice("norm", norm, ("linf",))
  budget = as_budget(budget)
  model = roles(logits_fn)
  check_inputs(model.pure, x, y, budget, norm=norm, name="ibp_loss",
               large_eps_hint=LARGE_EPS_HINT)
  dtype = work_dtype(x)
  xw = x.astype(dtype)
  eps = jnp.broadcast_to(jnp.asarray(budget.eps, dtype), (x.shape[0],))
  eps = expand(like_batch(eps, xw), x.ndim)
  lower = jnp.clip(xw - eps, jnp.asarray(budget.lower, dtype), jnp.asarray(budget.upper, dtype))
  upper = jnp.clip(xw + eps, jnp.asarray(budget.lower, dtype), jnp.asarray(budget.upper, dtype))
  margins = certify.margin_bounds(model.pure, y, lower, upper, method="ibp")
  z_hat = worst_case_logits(margins, y)
  logits_clean = model.outer(x)
  kappa = jnp.asarray(kappa, z_hat.dtype)
  loss = kappa * mean_cross_entropy(logits_clean, y) + (1 - kappa) * mean_cross_entropy(z_hat, y)
  return loss, Aux(jax.lax.stop_gradient(x), logits_clean, z_hat)
