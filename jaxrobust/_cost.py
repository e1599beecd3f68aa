r"""What one model evaluation costs: floating-point operations counted on its jaxpr.

The count is an estimate taken while tracing (no compilation, nothing runs): the model is traced
once more at the batch's shape (:func:`jax.make_jaxpr`; parameters it closes over, traced or not,
stay abstract) and every equation, nested ones included, is priced:

* ``dot_general``: :math:`2 \cdot |\text{out}| \cdot \prod_{d \in \text{contracted}} n_d`;
* ``conv_general_dilated``: :math:`2 \cdot |\text{out}| \cdot |\text{kernel}| / c_\text{out}`
  (each output element is a dot product over the kernel's input channels and window);
* any other equation without a sub-jaxpr: one operation per output element;
* an equation holding jaxprs: ``scan`` its body times its ``length`` (a model that loops over
  its layers or its tokens), ``cond`` its costliest branch, a call (``jit``, ``checkpoint``, a
  custom derivative) what it calls; ``while`` its condition and body once, since its trip count
  is data, so for a model with such a loop the count is a lower bound.

For the feed-forward networks attacks usually meet it is close to the textbook figure
(WRN-28-10: about 10.5 GFLOP per 32x32 image, i.e. the usual 5.25 G multiply-adds).

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
  return _price(jax.make_jaxpr(logits_fn)(x))


def _price(jaxpr) -> int:
  """The operations of one evaluation of ``jaxpr`` (closed or open), nested jaxprs included."""
  total = 0
  for eqn in walk.open_jaxpr(jaxpr)[0].eqns:
    name, subs = eqn.primitive.name, walk.sub_jaxprs(eqn.params)
    out = sum(math.prod(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
    if name == "dot_general":
      (contracted, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2 * out * math.prod(lhs[d] for d in contracted)
    elif name == "conv_general_dilated":
      kernel = eqn.invars[1].aval.shape
      out_features = kernel[eqn.params["dimension_numbers"].rhs_spec[0]]
      total += 2 * out * math.prod(kernel) // out_features
    elif not subs:
      total += out
    elif name == "scan":
      total += eqn.params["length"] * sum(_price(sub) for sub in subs)
    elif name == "cond":
      total += max(_price(sub) for sub in subs)
    else:
      total += sum(_price(sub) for sub in subs)
  return total
