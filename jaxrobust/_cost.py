r"""What one model evaluation costs: floating-point operations counted on its jaxpr.

The count is an estimate taken while tracing (no compilation, nothing runs): the model is traced
once more at the batch's shape (:func:`jax.make_jaxpr`; parameters it closes over, traced or not,
stay abstract) and every equation, nested ones included, is priced:

* ``dot_general``: :math:`2 \cdot |\text{out}| \cdot \prod_{d \in \text{contracted}} n_d`;
* ``conv_general_dilated``: :math:`2 \cdot |\text{out}| \cdot |\text{kernel}| / c_\text{out}`
  (each output element is a dot product over the kernel's input channels and window);
* any other equation without a sub-jaxpr: one operation per output element.

A loop inside the model is priced once, not once per iteration, so the count is a lower bound
for such models; for the feed-forward networks attacks usually meet it is close to the textbook
figure (WRN-28-10: about 10.5 GFLOP per 32x32 image, i.e. the usual 5.25 G multiply-adds).

The run options use it to choose a curve's schedule on a GPU
(:meth:`jaxrobust._options.RunOptions.for_curve`).

Examples:
  >>> import jax.numpy as jnp
  >>> w = jnp.ones((3, 2))
  >>> model_flops(lambda x: jnp.tanh(x @ w), jnp.ones((4, 3)))  # 2*4*2*3 + 4*2
  56
"""

from __future__ import annotations

import math
from typing import Callable

import jax

from jaxrobust import _jaxpr_walk as walk


def model_flops(logits_fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> int:
  """Floating-point operations of ``logits_fn(x)`` for the whole batch ``x`` (see the module)."""
  total = 0
  for eqn in walk.iter_equations(jax.make_jaxpr(logits_fn)(x)):
    out = sum(math.prod(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
    name = eqn.primitive.name
    if name == "dot_general":
      (contracted, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2 * out * math.prod(lhs[d] for d in contracted)
    elif name == "conv_general_dilated":
      kernel = eqn.invars[1].aval.shape
      out_features = kernel[eqn.params["dimension_numbers"].rhs_spec[0]]
      total += 2 * out * math.prod(kernel) // out_features
    elif not walk.sub_jaxprs(eqn.params):
      total += out
  return total
