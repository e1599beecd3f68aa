r"""Canonical convolutions: the workaround for XLA:CPU's loop-body convolution penalty.

``jax.grad`` of a convolution with respect to its input is a convolution with the kernel's feature
axes swapped: JAX emits it with ``dim_labels=b01f_01oi->b01f``. XLA:CPU's fast convolution path
needs the canonical ``b01f_01io->b01f`` (NHWC input, HWIO kernel), and its pass
``ConvCanonicalization`` (``xla/service/cpu/conv_canonicalization.cc``) rewrites non-canonical
convolutions by inserting transposes -- in the program's entry computation only. A convolution in
a ``while`` body (every ``lax.scan``/``while_loop``, i.e. every attack loop) keeps ``01oi`` and
runs on XLA's generic emitter, several times slower per step on the demo CNN
(``benchmarks/bench_loop_conv.py`` reproduces it and rules out parameters carried through the
loop, optimisation barriers, partial unrolling and the XLA flags tried; the figures are in
``benchmarks/RESULTS.md``, "Loop-body penalty of convolution gradients on XLA:CPU").

:func:`canonical_convolutions` re-traces a function to a jaxpr and evaluates it with every
``conv_general_dilated`` written as transposes around an NHWC/HWIO/NHWC convolution (exact:
dimension numbers only name axes), recursing into the jaxprs of loops, conditionals and calls, so
that XLA sees canonical convolutions inside the loop bodies too. The engine applies it on CPU to
every attack whose model contains a convolution (:func:`jaxrobust.engine.attack_loop.run_attack`),
and the certifiers to their linear bounds' per-example passes
(:func:`jaxrobust.certify._linear.per_example`).

References:
  XLA, ``xla/service/cpu/conv_canonicalization.cc`` (entry computation only).
  JAX issue 12868 (convolutions slow inside loops on CPU).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

import jax
import numpy as np
from jax import lax
from jax.extend import core

from jaxrobust import _jaxpr_walk
from jaxrobust._batch import work_dtype

Array = jax.Array
T = TypeVar("T")

_INLINED_CALLS = frozenset({"closed_call", "core_call"})
"""Call primitives whose jaxpr is evaluated in place (so its convolutions get rewritten too).
Nested ``jit`` calls are not inlined but re-bound with a rewritten jaxpr: their in/out shardings
may reshard operands (explicit sharding), which inlining would drop."""

_KEPT_CALLS = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})
"""Calls bound unchanged, so that their custom derivative rules still hold if the rewritten
function is differentiated. The backward convolutions of an attack's own ``jax.grad`` are plain
equations by the time the function is traced, so this only leaves a custom rule's *primal*
convolutions (forward passes, canonical already in NHWC models) as written."""


def _canonical_conv(lhs, rhs, *, dimension_numbers, **params):
  """``conv_general_dilated`` with NHWC/HWIO/NHWC dimension numbers (any rank), same result.

  The operands are transposed into canonical order (batch, spatial..., feature) and
  (spatial..., in, out), and the result back; dimension numbers only name axes, so this is exact.
  """
  lhs_spec, rhs_spec, out_spec = dimension_numbers
  rank = len(lhs_spec)
  lhs_perm = (lhs_spec[0], *lhs_spec[2:], lhs_spec[1])
  rhs_perm = (*rhs_spec[2:], rhs_spec[1], rhs_spec[0])
  out_perm = (out_spec[0], *out_spec[2:], out_spec[1])
  identity = tuple(range(rank))
  if lhs_perm == rhs_perm == out_perm == identity:
    return lax.conv_general_dilated_p.bind(lhs, rhs, dimension_numbers=dimension_numbers,
                                           **params)
  spatial = tuple(range(1, rank - 1))
  canonical = lax.ConvDimensionNumbers(lhs_spec=(0, rank - 1, *spatial),
                                       rhs_spec=(rank - 1, rank - 2, *range(rank - 2)),
                                       out_spec=(0, rank - 1, *spatial))
  lhs = lhs if lhs_perm == identity else lax.transpose(lhs, lhs_perm)
  rhs = rhs if rhs_perm == identity else lax.transpose(rhs, rhs_perm)
  out = lax.conv_general_dilated_p.bind(lhs, rhs, dimension_numbers=canonical, **params)
  return out if out_perm == identity else lax.transpose(out, tuple(np.argsort(out_perm)))


def _shape_of(aval) -> jax.ShapeDtypeStruct:
  """``aval`` as an example argument, keeping an explicit-mesh sharding where there is one."""
  sharding = getattr(aval, "sharding", None)
  if sharding is not None and not getattr(getattr(sharding, "mesh", None), "empty", True):
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type,
                                sharding=sharding)
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def _rewrite(sub: Any) -> Any:
  """A loop's, conditional's or call's jaxpr (closed or open) re-traced with its convolutions
  canonical, recursively; an open one that would need constants, or an exotic one that cannot be
  re-traced (e.g. ``shard_map``'s), stays as it was. Constants of inlined calls become the
  rewritten jaxpr's own: loops and branches take a closed jaxpr's constants as they are (its
  operands keep their order and count)."""
  try:
    jaxpr, consts = _jaxpr_walk.open_jaxpr(sub)
    avals = [_shape_of(aval) for aval in jaxpr.in_avals]
    rewritten = jax.make_jaxpr(lambda *args: _eval_canonical(jaxpr, consts, *args))(*avals)
  except Exception:  # noqa: BLE001 -- an exotic sub-jaxpr stays as it was
    return sub
  if isinstance(sub, core.ClosedJaxpr):
    return rewritten
  return sub if rewritten.consts else rewritten.jaxpr


def _canonical_equation(eqn: Any, invals: list) -> list:
  """One equation of :func:`_eval_canonical` (inlined calls aside): a convolution made
  canonical, any other primitive bound with its sub-jaxprs rewritten (not a kept call's)."""
  if eqn.primitive is lax.conv_general_dilated_p:
    return [_canonical_conv(*invals, **eqn.params)]
  params = eqn.primitive.get_bind_params(eqn.params)
  if eqn.primitive.name not in _KEPT_CALLS:
    params = _jaxpr_walk.map_sub_jaxprs(params, _rewrite)
  with eqn.ctx.manager:
    outs = eqn.primitive.bind(*invals, **params)
  return outs if eqn.primitive.multiple_results else [outs]


def _inlined(eqn: Any) -> bool:
  return eqn.primitive.name in _INLINED_CALLS


def _eval_canonical(jaxpr: core.Jaxpr, consts, *args) -> list[Any]:
  """``jax.core.eval_jaxpr`` with every convolution made canonical, recursively."""
  return _jaxpr_walk.interpret(jaxpr, consts, args, _canonical_equation, inline=_inlined)


def canonical_convolutions(fn: Callable[..., Any]) -> Callable[..., Any]:
  """``fn`` with every convolution it computes in XLA:CPU's canonical form (same values).

  ``fn`` is traced to a jaxpr (its closed-over arrays, tracers included, become constants) and
  evaluated with each ``conv_general_dilated`` rewritten as transposes around an NHWC/HWIO/NHWC
  convolution, inside nested scans, while loops, conditionals and jitted calls too. Use it on a
  loop body that takes gradients: the backward convolutions ``jax.grad`` emits (kernel features
  swapped, ``01oi``) are canonicalised by XLA:CPU only in a program's entry computation.

  Args:
    fn: any function of pytrees of arrays that JAX can trace.

  Returns:
    a function with ``fn``'s signature, values and derivatives (calls with custom derivative
    rules are kept as they are, with their convolutions: see ``_KEPT_CALLS``).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> kernel = jnp.ones((3, 3, 1, 4))
    >>> def loss(x):
    ...   return jnp.sum(jax.lax.conv_general_dilated(
    ...       x, kernel, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) ** 2)
    >>> x = jnp.linspace(0, 1, 2 * 8 * 8).reshape(2, 8, 8, 1)
    >>> bool(jnp.allclose(canonical_convolutions(jax.grad(loss))(x), jax.grad(loss)(x)))
    True

  References:
    XLA ``ConvCanonicalization`` (``xla/service/cpu/conv_canonicalization.cc``).
  """

  @functools.wraps(fn)
  def wrapped(*args):
    leaves, tree = jax.tree.flatten(args)
    closed, out_shape = jax.make_jaxpr(lambda *xs: fn(*jax.tree.unflatten(tree, xs)),
                                       return_shape=True)(*leaves)
    outs = _eval_canonical(closed.jaxpr, closed.consts, *leaves)
    return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

  return wrapped


def noncanonical_convolutions(fn: Callable[..., Any], *args) -> int:
  """How many ``conv_general_dilated`` in ``fn``'s jaxpr (nested jaxprs included) are not in
  NHWC/HWIO/NHWC form: 0 for ``canonical_convolutions(fn)`` (a check for tests).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> kernel = jnp.ones((3, 3, 1, 4))
    >>> def loss(x):
    ...   return jnp.sum(jax.lax.conv_general_dilated(
    ...       x, kernel, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
    >>> x = jnp.ones((2, 8, 8, 1))
    >>> noncanonical_convolutions(jax.grad(loss), x), noncanonical_convolutions(
    ...     canonical_convolutions(jax.grad(loss)), x)
    (1, 0)
  """

  def noncanonical(eqn) -> bool:
    lhs, rhs, out = eqn.params["dimension_numbers"]
    rank = len(lhs)
    spatial = tuple(range(1, rank - 1))
    return (lhs, rhs, out) != ((0, rank - 1, *spatial), (rank - 1, rank - 2, *range(rank - 2)),
                               (0, rank - 1, *spatial))

  return sum(noncanonical(eqn) for eqn in _jaxpr_walk.iter_equations(jax.make_jaxpr(fn)(*args))
             if eqn.primitive is lax.conv_general_dilated_p)


def has_convolution(fn: Callable[..., Any], *args) -> bool:
  """Whether ``fn`` (traced on ``args``, arrays or ``jax.ShapeDtypeStruct``) holds a
  ``conv_general_dilated`` anywhere, nested jaxprs included.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> has_convolution(lambda x: x @ jnp.ones((3, 2)), jnp.ones((1, 3)))
    False
  """

  return any(eqn.primitive is lax.conv_general_dilated_p
             for eqn in _jaxpr_walk.iter_equations(jax.make_jaxpr(fn)(*args)))


class _Depth(threading.local):
  depth = 0


_CANONICAL = _Depth()
"""How many canonical rewrites are being traced on this thread (nested ones are redundant)."""


def needs_canonical_convolutions(fn: Callable[[Array], object], x: Array) -> bool:
  """Whether attack loops on ``fn`` (``x -> logits``, or any ``x -> ...`` objective) should be
  traced with canonical convolutions: on CPU, outside another such rewrite, ``fn`` holding a
  convolution (:func:`jaxrobust.engine.canonical_conv.has_convolution`).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> kernel = jnp.ones((3, 3, 1, 2))
    >>> conv = lambda v: jax.lax.conv_general_dilated(
    ...     v, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    >>> x = jnp.ones((2, 4, 4, 1))
    >>> needs_canonical_convolutions(conv, x) == (jax.default_backend() == "cpu")
    True
    >>> needs_canonical_convolutions(lambda v: v.reshape(2, -1) @ jnp.ones((16, 3)), x)
    False
  """
  if jax.default_backend() != "cpu" or _CANONICAL.depth:
    return False
  try:
    return has_convolution(fn, jax.ShapeDtypeStruct(x.shape, work_dtype(x)))
  except Exception:  # noqa: BLE001 - a model that cannot be traced alone: leave it as it is
    return False


def on_cpu_canonical(compute: Callable[[], T], fn: Callable[[Array], object], x: Array) -> T:
  """``compute()``, traced with every convolution in XLA:CPU's canonical form where
  :func:`needs_canonical_convolutions` says so (else as it is): the same values, and loops whose
  convolutions run on XLA:CPU's fast path. Nested calls (``compute`` calling this again, e.g.
  ensemble members or a training loss's inner attack) are not rewritten twice.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> kernel = jnp.arange(6.0).reshape(3, 2, 1, 1)
    >>> conv = lambda v: jnp.sum(jax.lax.conv_general_dilated(
    ...     v, kernel, (2, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")) ** 2)
    >>> x = jnp.linspace(0.0, 1.0, 32).reshape(2, 4, 4, 1)
    >>> gradient = lambda: jax.grad(conv)(x)  # the input gradient's convolution is 01oi
    >>> bool(jnp.allclose(on_cpu_canonical(gradient, conv, x), gradient()))
    True
  """
  if not needs_canonical_convolutions(fn, x):
    return compute()
  _CANONICAL.depth += 1
  try:
    return canonical_convolutions(compute)()
  finally:
    _CANONICAL.depth -= 1
