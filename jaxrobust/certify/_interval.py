"""Interval bound propagation (IBP): elementwise bounds pushed forward through the graph.

Every input-dependent node ``v`` carries an interval ``[l_v, u_v]`` that contains ``v(x)`` for
every ``x`` in the input box. Rules, with the constant operands fixed:

* nondecreasing ``f`` (reshapes, slices, sums, padding, ``max`` -- hence ReLU --, pooling,
  ``tanh``, ``exp``, ...): ``[f(l), f(u)]``, exact for each element;
* ``sub``: ``[l_a - u_b, u_a - l_b]``; ``neg``, ``rsqrt``: ``[f(u), f(l)]``;
* products and quotients by a constant ``w``: ``[min(lw, uw), max(lw, uw)]`` elementwise;
* a linear map with constant weights ``W`` (``dot_general``, ``conv_general_dilated``): the
  centre-radius form ``c = (l + u) / 2``, ``r = (u - l) / 2``, ``[Wc - |W|r, Wc + |W|r]``, exact
  for each output element of one affine layer;
* ``integer_pow``/``square`` with an even power: ``0`` is the minimum when ``l <= 0 <= u``.

Bounds are computed in float32 at least (a bfloat16 model is bounded in float32). A model that
computes in bfloat16 or float16 rounds each result to that type: for such an equation
(:func:`jaxrobust.certify._primitives.rounding_dtype`) the interval ``[l, u]`` of the exact
result ``t`` becomes ``[min(l, fl(l)), max(u, fl(u))]``, ``fl`` rounding to the output type and
back. Round to nearest is monotone, so ``fl(l) <= fl(t) <= fl(u)``: the interval holds the
rounded result and the unrounded one (XLA's excess precision may skip a rounding), and so every
interval holds the model's own value, as long as its products, convolutions and sums accumulate
in float32 or wider and round once to their output type (XLA on CPU, cuBLAS and TPU matrix units
on accelerators). The bounds are sound for the model's own low-precision arithmetic under that
assumption, and otherwise for the real-number computation, up to the float rounding of the bound
arithmetic itself. A float32 model bounded in float32 has no rounding equation: nothing changes.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import _validation
from jaxrobust.certify import _primitives as prim
from jaxrobust.certify._jaxpr import Const, Equation, Graph, compute_dtype, trace

Array = jax.Array


class Interval(NamedTuple):
  """Elementwise bounds ``lower <= v <= upper`` of one node."""

  lower: Array
  upper: Array


def _operand_values(eqn: Equation, intervals: dict, side: str) -> list:
  """Each operand of ``eqn``: its constant, or the ``side`` ("lower"/"upper") of its interval."""
  return [op if isinstance(op, Const) else getattr(intervals[op], side) for op in eqn.inputs]


def interval_rule(eqn: Equation, intervals: dict, dtype) -> Interval:
  """The interval of ``eqn``'s (single) output from the intervals of its input nodes."""
  prim.check_supported(eqn)
  name = eqn.primitive.name
  lows = _operand_values(eqn, intervals, "lower")
  highs = _operand_values(eqn, intervals, "upper")
  if name in prim.NONDECREASING:
    return Interval(prim.bind(eqn, lows, dtype), prim.bind(eqn, highs, dtype))
  if name in prim.NONINCREASING:
    return Interval(prim.bind(eqn, highs, dtype), prim.bind(eqn, lows, dtype))
  if name == "sub":
    return Interval(prim.bind(eqn, [lows[0], highs[1]], dtype),
                    prim.bind(eqn, [highs[0], lows[1]], dtype))
  if name in ("mul", "div"):
    at_low, at_high = prim.bind(eqn, lows, dtype), prim.bind(eqn, highs, dtype)
    return Interval(jnp.minimum(at_low, at_high), jnp.maximum(at_low, at_high))
  if name in ("dot_general", "conv_general_dilated"):
    return _centre_radius(eqn, intervals, dtype)
  if name in prim.EVEN_POWERS:
    at_low, at_high = prim.bind(eqn, lows, dtype), prim.bind(eqn, highs, dtype)
    if name == "integer_pow" and eqn.params["y"] % 2 == 1:
      return Interval(at_low, at_high)
    (node,) = eqn.inputs
    straddles = (intervals[node].lower <= 0) & (intervals[node].upper >= 0)
    low = jnp.where(straddles, jnp.zeros_like(at_low), jnp.minimum(at_low, at_high))
    return Interval(low, jnp.maximum(at_low, at_high))
  raise prim.unsupported(eqn)


def _centre_radius(eqn: Equation, intervals: dict, dtype) -> Interval:
  """``[Wc - |W|r, Wc + |W|r]`` for a linear map with one input-dependent operand."""
  (position,) = prim.variable_positions(eqn)
  box = intervals[eqn.inputs[position]]
  centre = (box.lower + box.upper) / 2
  radius = (box.upper - box.lower) / 2
  centres = list(eqn.inputs)
  radii = [Const(jnp.abs(prim.cast(op, dtype))) for op in eqn.inputs]
  centres[position], radii[position] = centre, radius
  mid, spread = prim.bind(eqn, centres, dtype), prim.bind(eqn, radii, dtype)
  return Interval(mid - spread, mid + spread)


def rounded(box: Interval, dtype) -> Interval:
  """``[min(l, fl(l)), max(u, fl(u))]``, ``fl`` rounding to nearest in ``dtype`` (and back): it
  holds ``t`` and ``fl(t)`` for every ``t`` in ``box``, since ``fl`` is nondecreasing.

  Examples:
    >>> import jax.numpy as jnp
    >>> t = jnp.array([1 + 2 ** -10, 1 + 3 * 2 ** -9])  # bfloat16 steps by 2**-7 above 1
    >>> [v.tolist() for v in rounded(Interval(t, t), jnp.bfloat16)]
    [[1.0, 1.005859375], [1.0009765625, 1.0078125]]
  """
  def fl(v):
    return v.astype(dtype).astype(v.dtype)

  return Interval(jnp.minimum(box.lower, fl(box.lower)), jnp.maximum(box.upper, fl(box.upper)))


def propagate(graph: Graph, lower: Array, upper: Array,
              refine: Optional[Callable[[int, dict], Interval]] = None) -> dict:
  """Intervals of every node of ``graph`` for inputs in ``[lower, upper]``.

  Args:
    graph: the traced function.
    lower, upper: the input box, already in the bound dtype.
    refine: optional ``(node, intervals) -> Interval`` called on each new node with the intervals
      found so far; its (tighter, still sound) answer replaces the node's interval. CROWN uses it
      to tighten the inputs of nonlinear equations.

  Returns:
    ``{node: Interval}`` for every node.
  """
  prim.check_graph(graph.equations)  # every unsupported primitive named at once
  intervals = {0: Interval(lower, upper)}
  for eqn in graph.equations:
    result = interval_rule(eqn, intervals, lower.dtype)
    (node,) = eqn.outputs
    rounding = prim.rounding_dtype(eqn, graph.avals[node].dtype, lower.dtype)
    intervals[node] = result if rounding is None else rounded(result, rounding)
    if refine is not None:
      intervals[node] = refine(node, intervals)
  return intervals


def output_interval(graph: Graph, intervals: dict, dtype) -> Interval:
  """The interval of ``graph``'s output (a constant output is its own interval)."""
  if isinstance(graph.output, Const):
    value = prim.cast(graph.output, dtype)
    return Interval(value, value)
  return intervals[graph.output]


def _check_box_values(lower: Array, upper: Array) -> None:
  """Concrete boxes: finite everywhere, ``lower <= upper`` everywhere."""
  values = {"lower": np.asarray(lower, np.float64), "upper": np.asarray(upper, np.float64)}
  for name, side in values.items():
    bad = ~np.isfinite(side)
    if bad.any():
      shown = _validation.bad_entries(name, side, bad, "are")
      raise ValueError(
          f"{name} must be finite (no NaN or inf), {shown}. Bounds of a box with a NaN or "
          "infinite side are NaN: give finite bounds (e.g. the eps-ball around x clipped to the "
          "input range, jnp.clip(x - eps, 0, 1) and jnp.clip(x + eps, 0, 1)).")
  above = values["lower"] > values["upper"]
  if above.any():
    shown = _validation.bad_entries("lower", values["lower"], above, "are",
                                    beside=("upper", values["upper"]))
    raise ValueError(f"lower must be <= upper everywhere, {shown}. Pass the box as (lower, "
                     "upper), in that order.")


def check_box(lower, upper) -> tuple:
  """``lower``/``upper`` as floating-point arrays of one shape and dtype (the wider of theirs);
  concrete boxes are checked to be finite with ``lower <= upper`` (traced: shapes and dtypes
  only).

  Raises:
    ValueError: boxes of different shapes; concrete boxes with a NaN or infinite entry, or with
      ``lower > upper`` somewhere.
    TypeError: a box that is not floating point.
  """
  lower, upper = jnp.asarray(lower), jnp.asarray(upper)
  if lower.shape != upper.shape:
    raise ValueError(f"lower and upper must have the same shape (the input's), got "
                     f"{lower.shape} and {upper.shape}")
  compute_dtype(lower.dtype), compute_dtype(upper.dtype)  # both floating point
  if lower.dtype != upper.dtype:
    wider = max(lower.dtype, upper.dtype, key=lambda d: jnp.finfo(d).bits)
    lower, upper = lower.astype(wider), upper.astype(wider)
  if _validation.is_concrete(lower, upper):
    _check_box_values(lower, upper)
  return lower, upper


def interval_bounds(fn: Callable[[Array], Array], lower: Array, upper: Array) -> tuple:
  r"""Sound elementwise bounds on ``fn(x)`` for every ``x`` with ``lower <= x <= upper``.

  Interval bound propagation (Gowal et al. 2018) through ``fn``'s traced jaxpr: each
  input-dependent value gets an interval, pushed forward primitive by primitive; for an affine
  layer ``z = Wx + b`` the rule is the centre-radius form

  .. math:: z \in [Wc + b - |W| r,\; Wc + b + |W| r], \quad c = \tfrac{l + u}{2},\;
     r = \tfrac{u - l}{2},

  exact elementwise for one layer, and ReLU (``max(z, 0)``) maps ``[l, u]`` to
  ``[max(l, 0), max(u, 0)]``. Sub-jaxprs (``jax.nn.relu``, Flax modules) are inlined; values that
  do not depend on ``x`` (weights, eval-mode BatchNorm statistics) are computed, not bounded.
  ``fn`` may mix examples (no per-example assumption here).

  Args:
    fn: function of one array ``x`` (the box's shape and dtype) returning one array (typically
      logits ``[B, C]``); a Flax ``nnx`` module works as it is.
    lower, upper: arrays of ``x``'s full shape (batch included), ``lower <= upper``; may be
      tracers (``jit``, ``vmap``). bfloat16 boxes are bounded in float32.

  Returns:
    ``(lo, hi)``, each of ``fn(x)``'s shape, in float32 (or the input's dtype if wider).

  Raises:
    NotImplementedError: naming every primitive of ``fn`` that no rule handles.
    ValueError: when ``lower`` and ``upper`` differ in shape, or (concrete box) hold a NaN or
      infinite entry, or ``lower > upper`` somewhere.
    TypeError: a box that is not floating point.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import certify
    >>> w = jnp.array([[1.0, -2.0]])
    >>> lo, hi = certify.interval_bounds(lambda x: jnp.maximum(x @ w.T, 0.0),
    ...                                  jnp.array([[0.0, 0.0]]), jnp.array([[1.0, 1.0]]))
    >>> lo, hi
    (Array([[0.]], dtype=float32), Array([[1.]], dtype=float32))

  References:
    S. Gowal, K. Dvijotham, R. Stanforth, R. Bunel, C. Qin, J. Uesato, R. Arandjelovic, T. Mann,
    P. Kohli. On the effectiveness of interval bound propagation for training verifiably robust
    models. arXiv:1810.12715, 2018.
  """
  lower, upper = check_box(lower, upper)
  graph = trace(fn, lower)
  dtype = compute_dtype(lower.dtype)
  intervals = propagate(graph, lower.astype(dtype), upper.astype(dtype))
  return tuple(output_interval(graph, intervals, dtype))
