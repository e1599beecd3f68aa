"""Lower bounds on classification margins, with the last affine layers merged into the margin."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxrobust import _validation
from jaxrobust.certify._interval import check_box, propagate
from jaxrobust.certify._jaxpr import check_deterministic, compute_dtype
from jaxrobust.certify._linear import backward_lower, crown_intervals, per_example_graph

Array = jax.Array
METHODS = ("ibp", "crown")


def margin_bounds(logits_fn: Callable[[Array], Array], y: Array, lower: Array, upper: Array, *,
                  method: str = "ibp") -> Array:
  r"""Lower bounds ``[B, C]`` on the margins ``z_y(x) - z_j(x)`` over the box ``[lower, upper]``.

  The margin function itself is bounded, not the logits one by one: the specification rows
  ``e_y - e_j`` are pulled back through the affine tail of the network (every equation after the
  last nonlinearity, the final ``Dense`` included) with the primitives' vector-Jacobian products,
  and only then meet an interval. With ``method="ibp"`` the pull-back stops at the first nonlinear
  equation and uses its IBP interval (IBP with the margin merged into the last layer, as in Gowal
  et al. 2018); with ``method="crown"`` it continues through ReLUs by linear relaxation with CROWN
  intermediate bounds, and the result is the better of the two bounds elementwise. On an affine
  model ``z = Wx + b`` both are exact: for the box ``[x - eps, x + eps]``

  .. math:: \min_{x'} z_y(x') - z_j(x') = z_y(x) - z_j(x) - \epsilon \|w_y - w_j\|_1.

  A bound ``> 0`` for every ``j != y`` certifies that no point of the box changes the prediction
  away from ``y``. Entries at ``j = y`` are ``+inf`` (the margin of a class to itself is not a
  constraint), so ``min`` over classes is the certificate.

  Args:
    logits_fn: ``x [B, ...] -> logits [B, C]``, examples treated independently.
    y: ``[B]`` int labels.
    lower, upper: the box, arrays of ``x``'s full shape.
    method: ``"ibp"`` or ``"crown"`` (static).

  Returns:
    ``[B, C]`` float32 (or wider) lower bounds, ``+inf`` at each example's label.

  Raises:
    ValueError: for an unknown method, labels that are not ``[B]`` ints in ``[0, C)``, or logits
      that are not ``[B, C]``.
    NotImplementedError: naming the first primitive of ``logits_fn`` that no rule handles.

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
  """
  check_deterministic(logits_fn)
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")
  lower, upper = check_box(lower, upper)
  y = jnp.asarray(y)
  _validation.check_batch(lower, y)
  out_shape = jax.eval_shape(logits_fn, jax.ShapeDtypeStruct(lower.shape, lower.dtype)).shape
  num_classes = _validation.check_logits(tuple(out_shape), lower.shape[0])
  _validation.check_labels("y", y, num_classes)
  graph = per_example_graph(logits_fn, lower, out_shape)
  dtype = compute_dtype(lower.dtype)
  classes = jnp.arange(num_classes)

  def one_example(example_lower, example_upper, label):
    box = example_lower[None].astype(dtype), example_upper[None].astype(dtype)
    onehot = (classes == label).astype(dtype)
    spec = (onehot[None, :] - jnp.eye(num_classes, dtype=dtype)).reshape(
        (num_classes, 1, num_classes))
    bound = backward_lower(graph, propagate(graph, *box), graph.output, spec, relax=False,
                           dtype=dtype)
    if method == "crown":
      crown = backward_lower(graph, crown_intervals(graph, *box), graph.output, spec, relax=True,
                             dtype=dtype)
      bound = jnp.maximum(bound, crown)
    return jnp.where(classes == label, jnp.asarray(jnp.inf, dtype), bound)

  return jax.vmap(one_example)(lower, upper, y)
