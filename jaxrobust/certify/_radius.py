r"""Certified radii from bound propagation: the largest eps whose box provably keeps the label.

For an example :math:`(x, y)` and a radius :math:`\epsilon`, the input region is the eps-ball
intersected with the box, enclosed in the interval

.. math:: R(\epsilon) = [\max(x - \epsilon, \ell), \min(x + \epsilon, u)]

(exactly the region for Linf; for L2 and L1 the ball is enclosed in its Linf box, which is
sound but looser than the ball itself). :func:`jaxrobust.certify.margin_bounds` gives lower bounds
:math:`\underline{m}_j(\epsilon)` of the margins :math:`z_y - z_j` over :math:`R(\epsilon)`; the
prediction is certified at :math:`\epsilon` when :math:`\min_{j \ne y} \underline{m}_j(\epsilon)
> 0`. :func:`certify_bounds` finds the largest such :math:`\epsilon \le \epsilon_{\max}` by
bisection, per example, in a fixed number of steps
:math:`\lceil \log_2(1/\mathrm{tol}) \rceil` (``tol`` relative to :math:`\epsilon_{\max}`), and
returns the lower end of the final bracket, an eps at which the check passed (or 0): the radius is
sound whether or not the bounds grow monotonically with eps (CROWN's adaptive slopes need not),
since a smaller ball lies inside a certified one.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from jaxrobust._batch import expand, like_batch, predict
from jaxrobust._types import NORMS, Budget, Certificate, as_budget
from jaxrobust._validation import check_inputs, check_number
from jaxrobust.certify._jaxpr import check_deterministic
from jaxrobust.certify._linear import check_examples_per_pass, check_rows_independent
from jaxrobust.certify._margins import bound_margins, check_method

Array = jax.Array


def certified_at(logits_fn: Callable[[Array], Array], x: Array, y: Array, eps: Array,
                 lower: Array, upper: Array, method: str,
                 examples_per_pass: int | None = None) -> Array:
  """``[B]`` bool: the bounds prove label ``y`` on the box of radius ``eps`` (``[B]``) around
  ``x``, intersected with ``[lower, upper]``. The model is not checked for batch statistics
  here (:func:`certify_bounds` checks its ``x``; traced callers cannot)."""
  radius = expand(eps.astype(jnp.float32), x.ndim)
  xf = x.astype(jnp.float32)
  low = jnp.maximum(xf - radius, lower).astype(x.dtype)
  high = jnp.minimum(xf + radius, upper).astype(x.dtype)
  bounds = bound_margins(logits_fn, y, low, high, method=method,
                         examples_per_pass=examples_per_pass, check_rows=False)
  return jnp.min(bounds, axis=-1) > 0


def certify_bounds(logits_fn: Callable[[Array], Array], x: Array, y: Array, budget: Budget, *,
                   method: str = "ibp", norm: str = "linf", max_eps: float | Array | None = None,
                   tol: float = 1e-4, examples_per_pass: int | None = None,
                   allow_large_eps: bool = False) -> Certificate:
  r"""A :class:`jaxrobust.Certificate` from bound propagation (see the module docstring).

  Args:
    logits_fn: ``x [B, ...] -> logits [B, C]`` built from primitives the bounds support
      (:mod:`jaxrobust.certify`).
    x: ``[B, ...]`` inputs inside the box.
    y: ``[B]`` labels.
    budget: the box (``budget.lower``, ``budget.upper``) and, unless ``max_eps`` is given, the
      largest radius searched (``budget.eps``, scalar or ``[B]``).
    method: ``"ibp"`` (interval bounds, fast), ``"crown-ibp"`` (linear bounds through the ReLUs
      on IBP's intermediate intervals: one more backward pass, tighter, for any network size) or
      ``"crown"`` (CROWN's intermediate bounds too: tightest, for small networks; static); see
      :func:`jaxrobust.certify.margin_bounds`.
    norm: the norm of the radius (static); L2 and L1 balls are enclosed in their Linf box.
    max_eps: the largest radius searched (data), default ``budget.eps``.
    tol: bisection tolerance relative to ``max_eps`` (static): the returned radius is within
      ``tol * max_eps`` of the largest eps the check passes at (when that set is an interval).
    examples_per_pass: the memory knob (static) of :func:`jaxrobust.certify.margin_bounds`.
    allow_large_eps: accept a largest radius that covers the whole box (as
      :func:`jaxrobust.run` does; otherwise refused, e.g. 8 meant as 8/255).

  Returns:
    ``Certificate(prediction, radius)``: the model's prediction on ``x`` and the certified radius;
    a misclassified point (or a non-finite output) gets radius 0.

  Raises:
    ValueError: what :func:`jaxrobust.check_inputs` refuses of ``x``, ``y``, the box and the
      largest radius (``max_eps``, else ``budget.eps``): a radius that is NaN, negative or
      infinite (the bisection needs a finite top), ``x`` outside the box or non-finite, labels
      out of range, logits that are not ``[B, C]``; an unknown ``norm`` or ``method``; (concrete
      ``x``) a model whose output for an example depends on the other examples of the batch
      (``logits_fn(x[:1])`` differs from ``logits_fn(x)[:1]``: batch statistics, e.g. BatchNorm
      in training mode), for which per-example bounds would be unsound: put it in eval mode.
    TypeError: an integer ``x``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> w = jnp.array([[1.0, -1.0], [-1.0, 1.0]])  # margin 2 (x_0 - x_1), gradient norm 4
    >>> x, y = jnp.array([[0.6, 0.4], [0.45, 0.55]]), jnp.array([0, 0])
    >>> c = jr.certify.certify_bounds(lambda v: v @ w, x, y, jr.Budget(0.5))
    >>> c.prediction.tolist(), [round(float(r), 3) for r in c.radius]  # exact: 0.4/4, wrong
    ([0, 1], [0.1, 0.0])

  References:
    Gowal et al., "On the Effectiveness of Interval Bound Propagation for Training Verifiably
    Robust Models", arXiv:1810.12715, 2018; Zhang et al., "Efficient Neural Network Robustness
    Certification with General Activation Functions", NeurIPS 2018.
  """
  check_deterministic(logits_fn)
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")
  check_method(method)
  check_examples_per_pass(examples_per_pass)
  tol = check_number("tol", tol, low=0.0, high=1.0, low_open=True, high_open=True)
  steps = math.ceil(math.log2(1.0 / tol))
  budget = as_budget(budget)
  largest = budget.eps if max_eps is None else max_eps
  check_inputs(logits_fn, x, y, Budget(largest, budget.lower, budget.upper), norm=norm,
               allow_large_eps=allow_large_eps,
               name="certify_bounds", front_door="jr.certify.certify_bounds")
  lower = jnp.asarray(budget.lower, jnp.float32)
  upper = jnp.asarray(budget.upper, jnp.float32)
  top = jnp.asarray(largest, jnp.float32)
  top = like_batch(jnp.broadcast_to(top, x.shape[:1]), x)
  logits = logits_fn(x)
  check_rows_independent(logits_fn, x, logits)  # concrete x only: one more pass, of one row
  prediction = predict(logits)
  correct = prediction == y
  check = lambda eps: certified_at(logits_fn, x, y, eps, lower, upper, method,
                                   examples_per_pass) & correct
  at_top = check(top)

  def bisect(bracket, _):
    low, high = bracket
    mid = 0.5 * (low + high)
    ok = check(mid)
    return (jnp.where(ok, mid, low), jnp.where(ok, high, mid)), None

  start = (jnp.zeros_like(top), top)
  (low, _), _ = lax.scan(bisect, start, None, length=steps)
  radius = jnp.where(at_top, top, jnp.where(correct, low, 0.0))
  return Certificate(prediction, radius.astype(jnp.float32))
