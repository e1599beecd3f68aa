"""Which primitives bound propagation understands, and how to re-bind them in the bound dtype.

Three families, by the property every rule relies on (with the constant operands fixed):

* :data:`NONDECREASING`: nondecreasing in every input-dependent operand, so an interval maps to
  ``[f(lower), f(upper)]`` exactly (reshapes, slices, sums, pads, ``max``/``min``, max pooling,
  ``tanh``, ``exp``, ...);
* :data:`AFFINE`: affine in the input-dependent operands jointly, so the backward (CROWN) step is
  the primitive's vector-Jacobian product and its offset is ``f(0)`` (the nondecreasing linear
  ones, plus ``sub``, ``neg``, products and quotients by constants, ``dot_general``,
  ``conv_general_dilated``);
* special cases handled by the interval rules: ``sub``/``neg``/``rsqrt`` (decreasing in an
  operand), ``mul``/``div`` by constants (sign of the constant), ``dot_general``/convolutions
  (centre-radius form with ``|W|``), ``integer_pow``/``square``.

Anything else raises ``NotImplementedError`` naming the primitive.

Rounding. Every rule computes in the bound dtype (float32 at least), but a model computing in
bfloat16 or float16 rounds the result of each of its operations to that type. An equation
*rounds* (:func:`rounding_dtype`) when its output has fewer mantissa bits than the bound dtype
and its primitive is not in :data:`EXACT` (data movement, ``max``/``min`` and friends, whose
result is one of their operands). Its true value is then ``fl(t)``, ``t`` the operation on the
model's operands computed exactly, with ``|fl(t) - t| <= u |fl(t)|`` (``u``,
:func:`unit_roundoff`: ``2**-8`` for bfloat16, ``2**-11`` for float16) plus at most the
smallest subnormal below the normal range; XLA may also skip a rounding and keep ``t`` (its
excess-precision rewrites: XLA:CPU does for an ``add`` of two bfloat16 values), so the rules
allow both. Products, convolutions and sums are assumed accumulated in float32 or wider and
rounded once to their output type (XLA on CPU; cuBLAS and TPU matrix units on accelerators).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust.certify._jaxpr import Const, Equation

NONNEGATIVE_LINEAR = frozenset({
    "add", "add_any", "reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims",
    "slice", "dynamic_slice", "gather", "concatenate", "pad", "reduce_sum", "reduce_window_sum",
    "convert_element_type", "copy", "copy_p", "select_n", "rev", "stack", "tile"})
NONDECREASING = NONNEGATIVE_LINEAR | frozenset({
    "max", "min", "clamp", "reduce_max", "reduce_min", "reduce_window_max", "reduce_window_min",
    "tanh", "logistic", "exp", "exp2", "log", "log1p", "expm1", "sqrt", "cbrt", "erf"})
NONINCREASING = frozenset({"neg", "rsqrt"})
WEIGHTED = frozenset({"mul", "div", "dot_general", "conv_general_dilated"})
AFFINE = NONNEGATIVE_LINEAR | WEIGHTED | frozenset({"sub", "neg"})
EVEN_POWERS = frozenset({"integer_pow", "square"})
SUPPORTED = NONDECREASING | NONINCREASING | WEIGHTED | EVEN_POWERS | frozenset({"sub"})
EXACT = frozenset({
    "reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims", "slice",
    "dynamic_slice", "gather", "concatenate", "pad", "rev", "copy", "copy_p", "select_n", "stack",
    "tile", "split", "unstack", "max", "min", "clamp", "reduce_max", "reduce_min",
    "reduce_window_max", "reduce_window_min", "neg"})
"""Primitives whose result is exact in any precision (moved, chosen or negated operands): they
never round, whatever their output dtype (constants of a low-precision model already are of its
type)."""

_HINT = ("bound propagation supports affine layers (dot_general, convolutions, products by "
         "constants), ReLU (max with a constant), pooling, reshapes/slices/concatenation/padding, "
         "reductions and monotone elementwise functions; rewrite fn with these, or keep the "
         "unsupported part outside the bounded function")


def unsupported(eqn: Equation, why: str = "") -> NotImplementedError:
  """The error for an equation no rule handles, naming its primitive."""
  detail = f" ({why})" if why else ""
  return NotImplementedError(
      f"primitive '{eqn.primitive.name}' is not supported{detail}: {_HINT}")


def variable_positions(eqn: Equation) -> list:
  """Positions of the input-dependent operands of ``eqn``."""
  return [i for i, op in enumerate(eqn.inputs) if not isinstance(op, Const)]


def why_unsupported(eqn: Equation) -> str | None:
  """``None`` if some rule handles ``eqn`` exactly as it stands, else why not (``""`` when the
  primitive has no rule at all)."""
  name, positions = eqn.primitive.name, variable_positions(eqn)
  if name not in SUPPORTED:
    return ""
  if name in ("mul", "dot_general", "conv_general_dilated") and len(positions) != 1:
    return ("a product of two input-dependent values is not affine: a gated activation (GELU, "
            "SiLU) or a BatchNorm in train mode (use eval mode)")
  if name == "select_n" and 0 in positions:
    return "a choice whose predicate depends on the input"
  if name == "div" and positions != [0]:
    return "only division of an input-dependent value by a constant"
  if name == "integer_pow" and eqn.params["y"] < 1:
    return "only positive integer powers"
  if name == "convert_element_type" and not jnp.issubdtype(eqn.params["new_dtype"],
                                                           jnp.floating):
    return "only conversions between floating-point types"
  return None


def check_supported(eqn: Equation) -> None:
  """Raises ``NotImplementedError`` unless some rule handles ``eqn`` exactly as it stands."""
  why = why_unsupported(eqn)
  if why is not None:
    raise unsupported(eqn, why)


def check_graph(equations) -> None:
  """Raises one ``NotImplementedError`` naming *every* primitive of ``equations`` that no rule
  handles (each once, in order of first use, with how many equations use it), so a model
  lowered from another framework (a PyTorch module through torchax, where one layer may become
  several primitives) shows at once everything that stands in the way.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jaxrobust.certify._jaxpr import trace
    >>> graph = trace(lambda x: jax.nn.leaky_relu(jnp.sin(x)), jnp.zeros((1, 2)))
    >>> try:
    ...   check_graph(graph.equations)
    ... except NotImplementedError as error:
    ...   print(str(error)[:73])
    primitives 'sin', 'ge', 'select_n' (a choice whose predicate depends on t
  """
  found: dict[str, list] = {}
  for eqn in equations:
    why = why_unsupported(eqn)
    if why is not None:
      found.setdefault(eqn.primitive.name, []).append(why)
  if not found:
    return
  if len(found) == 1 and len(next(iter(found.values()))) == 1:
    (name, (why,)), = found.items()
    detail = f" ({why})" if why else ""
    raise NotImplementedError(f"primitive '{name}' is not supported{detail}: {_HINT}")
  names = ", ".join(f"'{name}'" + (f" ({whys[0]})" if whys[0] else "") for name, whys in
                    found.items())
  count = sum(len(whys) for whys in found.values())
  raise NotImplementedError(f"primitives {names} are not supported (in {count} equations of the "
                            f"bounded function): {_HINT}")


def is_affine(eqn: Equation, dtype) -> bool:
  """Whether ``eqn`` is affine in its input-dependent operands (constants fixed) when computed in
  ``dtype``; a conversion to a narrower float type rounds, so it is monotone but not affine:
  linear bounds stop there with its interval (exact for the model's conversion of its input,
  which is all a model made with ``compute_in`` converts)."""
  if eqn.primitive.name == "convert_element_type":
    return jnp.finfo(eqn.params["new_dtype"]).bits >= jnp.finfo(dtype).bits
  return eqn.primitive.name in AFFINE


def rounding_dtype(eqn: Equation, out_dtype, dtype) -> np.dtype | None:
  """The float type ``eqn``'s result is rounded to, when the model computes it in a type with
  fewer mantissa bits than the bound ``dtype`` (bfloat16 or float16 against float32), else
  ``None`` (every equation of a float32 model bounded in float32). Static: from dtypes only.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jaxrobust.certify._jaxpr import trace
    >>> graph = trace(lambda x: jnp.maximum(x * 3, 0), jnp.zeros((1, 2), jnp.bfloat16))
    >>> [(e.primitive.name, rounding_dtype(e, graph.avals[e.outputs[0]].dtype, jnp.float32))
    ...  for e in graph.equations]
    [('mul', dtype(bfloat16)), ('max', None)]
  """
  if eqn.primitive.name in EXACT or not jnp.issubdtype(out_dtype, jnp.floating):
    return None
  if jnp.finfo(out_dtype).nmant >= jnp.finfo(dtype).nmant:
    return None
  return np.dtype(out_dtype)


def unit_roundoff(dtype) -> float:
  """``u = 2**-p`` for a float type with ``p`` significant bits: round to nearest moves a value
  by at most ``u`` times its rounded magnitude (normal range)."""
  return float(jnp.finfo(dtype).eps) / 2


def bind(eqn: Equation, values: list, dtype):
  """Applies ``eqn``'s primitive to ``values`` (one per operand) computing in ``dtype``.

  Floating-point constants are cast to ``dtype`` (the bound dtype, at least float32), and so is
  the accumulation type of products and the target of float conversions, so a bfloat16 model is
  bounded in float32; the model's roundings to its own types, explicit conversions included, are
  bounded by the rules (:func:`rounding_dtype`), not here.
  """
  operands = [cast(v, dtype) for v in values]
  params = dict(eqn.params)
  if params.get("preferred_element_type") is not None and jnp.issubdtype(
      params["preferred_element_type"], jnp.floating):
    params["preferred_element_type"] = dtype
  if eqn.primitive.name == "convert_element_type" and jnp.issubdtype(params["new_dtype"],
                                                                     jnp.floating):
    params["new_dtype"] = dtype
  return cast(eqn.primitive.bind(*operands, **params), dtype)


def cast(value, dtype) -> jax.Array:
  """``value`` (an array or :class:`Const`) as an array, floating point cast to ``dtype``."""
  value = value.value if isinstance(value, Const) else value
  value = jnp.asarray(value)
  if jnp.issubdtype(value.dtype, jnp.floating) and value.dtype != dtype:
    return value.astype(dtype)
  return value
