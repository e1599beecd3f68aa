"""Lower bounds on classification margins, with the last affine layers merged into the margin."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrobust import _validation
from jaxrobust.certify._interval import check_box, propagate
from jaxrobust.certify._jaxpr import check_deterministic, compute_dtype
from jaxrobust.certify._linear import (CENTRE, backward_lower, check_examples_per_pass,
                                       check_rows_independent, crown_intervals, per_example,
                                       per_example_graph)

Array = jax.Array
METHODS = ("ibp", "crown-ibp", "crown")
"""Bound methods, cheapest first: the backward pass from the margins stops at the first
nonlinearity (``"ibp"``), goes through every ReLU with IBP intermediate intervals
(``"crown-ibp"``), or with CROWN intermediate intervals (``"crown"``)."""


def check_method(method: str) -> str:
  """``method`` if it is one of :data:`METHODS`, else a ``ValueError`` listing them."""
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")
  return method


def margin_bounds(logits_fn: Callable[[Array], Array], y: Array, lower: Array, upper: Array, *,
                  method: str = "ibp", examples_per_pass: int | None = None) -> Array:
  r"""Lower bounds ``[B, C]`` on the margins ``z_y(x) - z_j(x)`` over the box ``[lower, upper]``.

  The margin function itself is bounded, not the logits one by one: the specification rows
  ``e_y - e_j`` are pulled back through the affine tail of the network (every equation after the
  last nonlinearity, the final ``Dense`` included) with the primitives' vector-Jacobian products,
  and only then meet an interval. With ``method="ibp"`` the pull-back stops at the first nonlinear
  equation and uses its IBP interval (IBP with the margin merged into the last layer, as in Gowal
  et al. 2018); with ``method="crown"`` it continues through ReLUs by linear relaxation with CROWN
  intermediate bounds, and the result is the better of the two bounds elementwise. With
  ``method="crown-ibp"`` it continues through ReLUs too, but the relaxations use the IBP
  intervals of the pre-activations (Zhang et al. 2020's CROWN-IBP bound, here never looser than
  IBP either): one backward pass with ``C`` rows per example, where CROWN runs one per nonlinear
  layer with twice as many rows as the layer has units (at 32x32x16 units, 32,768 rows, each a
  backward pass through the layers below: out of reach for a WideResNet). On an affine model
  ``z = Wx + b`` all three are exact: for the box ``[x - eps, x + eps]``

  .. math:: \min_{x'} z_y(x') - z_j(x') = z_y(x) - z_j(x) - \epsilon \|w_y - w_j\|_1.

  A bound ``> 0`` for every ``j != y`` certifies that no point of the box changes the prediction
  away from ``y``. Entries at ``j = y`` are ``+inf`` (the margin of a class to itself is not a
  constraint), so ``min`` over classes is the certificate.

  Args:
    logits_fn: ``x [B, ...] -> logits [B, C]``, examples treated independently (on a concrete
      box this is checked: ``logits_fn(c[:1])`` must match ``logits_fn(c)[:1]`` at the box
      centre ``c``).
    y: ``[B]`` int labels.
    lower, upper: the box, arrays of ``x``'s full shape.
    method: ``"ibp"``, ``"crown-ibp"`` or ``"crown"`` (static).
    examples_per_pass: the memory knob (static): ``None`` bounds every example at once (one
      ``vmap``); an int bounds that many at a time (``lax.map``), which caps the memory of the
      backward passes at that many examples' for the same result.

  Returns:
    ``[B, C]`` float32 (or wider) lower bounds, ``+inf`` at each example's label.

  Raises:
    ValueError: for an unknown method, labels that are not ``[B]`` ints in ``[0, C)``, logits
      that are not ``[B, C]``, an ``examples_per_pass`` that is not a positive int, a box that
      is NaN, infinite or has ``lower > upper`` (concrete), or (concrete box) a model whose
      output for an example depends on the other examples of the batch (batch statistics, e.g.
      BatchNorm in training mode: per-example bounds would be unsound; put it in eval mode),
      checked on the box centre.
    NotImplementedError: naming every primitive of ``logits_fn`` that no rule handles.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import certify
    >>> w = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    >>> x = jnp.array([[0.75, 0.25]])
    >>> certify.margin_bounds(lambda v: v @ w.T, jnp.array([0]), x - 0.125, x + 0.125)
    Array([[ inf, 0.25]], dtype=float32)

  References:
    S. Gowal et al. On the effectiveness of interval bound propagation for training verifiably
    robust models. arXiv:1810.12715, 2018 (the margin merged into the last layer).
    H. Zhang et al. Efficient neural network robustness certification with general activation
    functions. NeurIPS 2018.
    H. Zhang et al. Towards stable and efficient training of verifiably robust neural networks
    (CROWN-IBP). ICLR 2020.
  """
  return bound_margins(logits_fn, y, lower, upper, method=method,
                       examples_per_pass=examples_per_pass, check_rows=True)


def bound_margins(logits_fn: Callable[[Array], Array], y: Array, lower: Array, upper: Array, *,
                  method: str, examples_per_pass: int | None, check_rows: bool) -> Array:
  """:func:`margin_bounds`; ``check_rows``: on a concrete box, refuse a model whose output for an
  example depends on the others (:func:`jaxrobust.certify._linear.check_rows_independent`, on the
  box centre), which a caller that checked its ``x`` already skips."""
  check_deterministic(logits_fn)
  check_method(method)
  check_examples_per_pass(examples_per_pass)
  lower, upper = check_box(lower, upper)
  y = jnp.asarray(y)
  _validation.check_batch(lower, y)
  # The validator's trace: a model in train mode or on channels-first images says so.
  out_shape = _validation.logits_shape(logits_fn, jax.ShapeDtypeStruct(lower.shape, lower.dtype))
  num_classes = _validation.check_logits(out_shape, lower.shape[0])
  _validation.check_labels("y", y, num_classes)
  graph = per_example_graph(logits_fn, lower, out_shape)
  if check_rows and _validation.is_concrete(lower, upper):
    check_rows_independent(logits_fn, (lower + upper) / 2, rows="c", at=CENTRE)
  dtype = compute_dtype(lower.dtype)
  classes = jnp.arange(num_classes)

  def one_example(example_lower, example_upper, label):
    box = example_lower[None].astype(dtype), example_upper[None].astype(dtype)
    onehot = (classes == label).astype(dtype)
    spec = (onehot[None, :] - jnp.eye(num_classes, dtype=dtype)).reshape(
        (num_classes, 1, num_classes))
    intervals = propagate(graph, *box)
    bound = backward_lower(graph, intervals, graph.output, spec, relax=False, dtype=dtype)
    if method == "crown-ibp":
      relaxed = backward_lower(graph, intervals, graph.output, spec, relax=True, dtype=dtype)
      bound = jnp.maximum(bound, relaxed)
    if method == "crown":
      crown = backward_lower(graph, crown_intervals(graph, *box), graph.output, spec, relax=True,
                             dtype=dtype)
      bound = jnp.maximum(bound, crown)
    return jnp.where(classes == label, jnp.asarray(jnp.inf, dtype), bound)

  return per_example(one_example, examples_per_pass, logits_fn, lower, upper, y)
