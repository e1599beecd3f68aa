"""A function as a flat graph of primitives, ready for bound propagation.

``fn`` is traced once to a jaxpr at the shape and dtype of its input (``jax.make_jaxpr``); the
jaxpr is then flattened: call-like equations (``jit``/``pjit``, ``closed_call``,
``custom_jvp_call``, ``custom_vjp_call``, ``checkpoint``) are inlined recursively, so
``jax.nn.relu`` (a custom JVP around ``max(x, 0)``) and Flax modules (``jit``-wrapped helpers) are
seen as the primitives they are made of; the multiple-output ``split`` and ``unstack`` become one
``slice`` per output (:data:`SPLITS`). Every value is classified on the way:

* **constant**: it depends only on literals and the jaxpr's constants (weights, BatchNorm
  statistics, ``rsqrt(var + eps) * scale``): it is evaluated on the spot, with the primitive's own
  ``bind``, and never reaches a bound rule;
* **input-dependent**: it is a numbered node of the graph, produced by exactly one equation, and
  its bounds are what the rules propagate.

Bound rules (:mod:`jaxrobust.certify._interval`, :mod:`jaxrobust.certify._linear`) therefore see
equations whose operands are node ids (``int``) or :class:`Const`, in topological order.
"""

from __future__ import annotations

import functools
import inspect

from typing import Any, Callable, NamedTuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import _jaxpr_walk
from jaxrobust.model import trace_model

Array = jax.Array

# Primitives whose sub-jaxpr is the whole computation: they are inlined, not interpreted.
CALL_PRIMITIVES = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call",
                             "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "remat2",
                             "checkpoint"})


class Const(NamedTuple):
  """An operand that does not depend on the input: its value (an array)."""

  value: Array


Operand = Union[int, Const]


class Equation(NamedTuple):
  """One primitive application on input-dependent nodes.

  Attributes:
    primitive: the JAX primitive (``primitive.name`` is what rules dispatch on).
    params: its parameters, as in the jaxpr.
    inputs: node ids (``int``) or :class:`Const` operands, in the primitive's order.
    outputs: node ids of its results.
  """

  primitive: Any
  params: dict
  inputs: tuple
  outputs: tuple


class Graph(NamedTuple):
  """``fn`` as a flat list of equations on nodes; node ``0`` is the input.

  Attributes:
    equations: in topological order.
    avals: ``avals[i]`` is node ``i``'s ``jax.ShapeDtypeStruct`` (as traced).
    output: the output's node id, or a :class:`Const` when it does not depend on the input.
  """

  equations: tuple
  avals: tuple
  output: Operand

  def producer_index(self, node: int) -> int:
    """Index in :attr:`equations` of the equation producing ``node`` (``-1`` for the input)."""
    for index, eqn in enumerate(self.equations):
      if node in eqn.outputs:
        return index
    return -1


def compute_dtype(dtype) -> np.dtype:
  """The float dtype bounds are computed in: at least float32 (bfloat16 inputs get float32)."""
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"bounds need a floating-point input, got dtype {np.dtype(dtype)}")
  dtype = np.dtype(dtype)
  return dtype if jnp.finfo(dtype).bits >= 32 else np.dtype(jnp.float32)


def trace(fn: Callable[[Array], Array], like: Array) -> Graph:
  """Traces ``fn`` at ``like``'s shape and dtype and flattens it into a :class:`Graph`.

  Args:
    fn: a function of one array returning one array.
    like: an array (or tracer, or ``jax.ShapeDtypeStruct``) with the input's shape and dtype.

  Returns:
    The graph; constants inside it are already evaluated.

  Raises:
    TypeError: when ``fn`` does not return exactly one array.
    NotImplementedError: for a loop or conditional (``scan``, ``while``, ``cond``) whose operands
      depend on the input.
  """
  check_deterministic(fn)
  closed = trace_model(fn, jax.ShapeDtypeStruct(like.shape, like.dtype))
  if len(closed.jaxpr.outvars) != 1:
    raise TypeError(f"fn must return a single array, got {len(closed.jaxpr.outvars)} outputs")
  builder = _Builder([jax.ShapeDtypeStruct(like.shape, like.dtype)])
  (output,) = builder.inline(closed.jaxpr, list(closed.consts), [0])
  return Graph(_live(builder.equations, output), tuple(builder.avals), output)


def check_deterministic(fn: Callable[..., Any]) -> None:
  """Raises a clear ``TypeError`` for a randomized model ``fn(x, keys)`` (two required
  positional arguments): bounds hold for a deterministic function of ``x`` only."""
  try:
    parameters = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):  # builtins and some callables have no signature
    return
  required = [p for p in parameters if p.default is inspect.Parameter.empty
              and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  if len(required) >= 2:
    raise TypeError("bounds need a deterministic model fn(x); this one takes (x, keys), a "
                    "randomized model: certify it with jr.certify.smoothing, or bound the "
                    "deterministic function inside it.")


def _live(equations: list, output: Operand) -> tuple:
  """The equations the output depends on (unused branches are never bounded, so an unsupported
  primitive there does not matter)."""
  needed, kept = {output} if isinstance(output, int) else set(), []
  for eqn in reversed(equations):
    if needed.intersection(eqn.outputs):
      kept.append(eqn)
      needed.update(op for op in eqn.inputs if isinstance(op, int))
  return tuple(reversed(kept))


class _Builder:
  """Accumulates the flat equations while walking (possibly nested) jaxprs."""

  def __init__(self, avals):
    self.avals = list(avals)
    self.equations = []

  def new_node(self, aval) -> int:
    self.avals.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype))
    return len(self.avals) - 1

  def inline(self, jaxpr, consts: list, args: list) -> list:
    """Walks ``jaxpr`` with its constvars bound to ``consts`` and its invars to ``args``
    (node ids or constant arrays), call-like equations (:data:`CALL_PRIMITIVES`) inlined;
    returns its outputs as operands."""
    args = [value if isinstance(value, (int, Const)) else Const(value) for value in args]
    return _jaxpr_walk.interpret(jaxpr, [Const(value) for value in consts], args, self.equation,
                                 inline=_is_call, wrap=Const)

  def equation(self, eqn, operands: list) -> list:
    if all(isinstance(op, Const) for op in operands):
      params = eqn.primitive.get_bind_params(eqn.params)
      subfuns, params = params if isinstance(params, tuple) else ((), params)  # older JAX: a pair
      values = eqn.primitive.bind(*subfuns, *[op.value for op in operands], **params)
      values = values if eqn.primitive.multiple_results else [values]
      return [Const(value) for value in values]
    if _jaxpr_walk.sub_jaxprs(eqn.params):
      raise NotImplementedError(
          f"primitive '{eqn.primitive.name}' (a loop or conditional) on input-dependent values is "
          "not supported by bound propagation; write fn without control flow over its input")
    if eqn.primitive.name in SPLITS:
      return self.inline_split(eqn, operands)
    outputs = tuple(self.new_node(var.aval) for var in eqn.outvars)
    self.equations.append(Equation(eqn.primitive, dict(eqn.params), tuple(operands), outputs))
    return list(outputs)

  def inline_split(self, eqn, operands: list) -> list:
    """A multiple-output ``split``/``unstack`` as one ``slice`` (then ``squeeze`` for
    ``unstack``) per output, traced with :mod:`jax.lax` and inlined: every rule then sees
    single-output equations."""
    (operand,) = operands
    closed = jax.make_jaxpr(functools.partial(SPLITS[eqn.primitive.name], **eqn.params))(
        self.avals[operand])
    return self.inline(closed.jaxpr, list(closed.consts), [operand])


def _split(x, *, axis: int, sizes, **_) -> list:
  starts = np.cumsum([0, *sizes])
  return [jax.lax.slice_in_dim(x, int(start), int(stop), axis=axis)
          for start, stop in zip(starts[:-1], starts[1:])]


def _unstack(x, *, axis: int, **_) -> list:
  return [jax.lax.squeeze(jax.lax.slice_in_dim(x, i, i + 1, axis=axis), (axis,))
          for i in range(x.shape[axis])]


SPLITS = {"split": _split, "unstack": _unstack}
"""Multiple-output primitives (``jnp.split``, ``jnp.unstack`` in recent JAX releases), by name,
and the same outputs from ``slice``/``squeeze``: :class:`_Builder` rewrites them so."""


def _is_call(eqn) -> bool:
  return eqn.primitive.name in CALL_PRIMITIVES
