r"""Backward linear bound propagation (CROWN): linear bounds pulled back to the input box.

To bound ``s(x) = <Λ, v(x)>`` for a node ``v`` and a specification ``Λ`` (one row per quantity
bounded), the coefficient ``Λ`` is pushed backward through the graph, equation by equation in
reverse topological order:

* through an affine equation ``z = A(v) + a`` (every linear primitive with its constant operands
  fixed) ``<Λ, z> = <Aᵀ Λ, v> + <Λ, a>``: ``Aᵀ Λ`` is the primitive's vector-Jacobian product,
  vmapped over the rows of ``Λ``, and ``a = A(0)`` -- one mechanism for every linear primitive;
* through ``z = max(v, c)`` with a constant ``c`` (ReLU) the linear relaxation
  ``α v + (1 - α) c <= z <= s v + c - s l`` on ``[l, u]`` with the chord slope
  ``s = (u - c) / (u - l)`` when ``l < c < u`` (exact lines when the unit is stable), and the
  adaptive lower slope ``α = 1`` if ``u - c > c - l`` else ``0`` (CROWN-Ada); a positive
  coefficient takes the lower line, a negative one the upper; ``min(v, c) = -max(-v, -c)``;
* every other nonlinear equation (``tanh``, ``exp``, ``reduce_max``, max pooling, the max of two
  input-dependent values, ...) is replaced by the constant bounds of its output's interval:
  ``<Λ, z> >= <Λ⁺, l_z> + <Λ⁻, u_z>``; so is the input, with the box ``[lower, upper]``.

A model computing in bfloat16 or float16 rounds each result to its type
(:func:`jaxrobust.certify._primitives.rounding_dtype`; products and sums accumulated in float32
or wider, rounded once). Through such an affine equation ``z = fl(A(v)) = A(v) + e`` with
``|e| <= u M_z`` elementwise (``u`` the unit roundoff, ``2**-8`` for bfloat16, ``M_z`` the
largest magnitude of ``z``'s interval, which holds the rounded and the unrounded value; plus the
smallest subnormal), so the step's offset loses ``<|Λ|, u M_z>``. Nonlinear equations need
nothing more: a relaxed ``max``/``min`` is exact in any precision, and a concretized one (an
explicit conversion to a narrower type among them) uses its output's interval, already widened
for the rounding by IBP (:func:`jaxrobust.certify._interval.rounded`); the intermediate bounds
come from the same backward pass. A float32 model bounded in float32 rounds nowhere: its bounds
are unchanged.

The result is a lower bound of each row of ``<Λ, v(x)>`` over the box (upper bounds use ``-Λ``).
The intervals the relaxations need are computed by the same backward pass, started from every
input of a nonlinear equation with the identity specification (CROWN's intermediate bounds), and
intersected with the forward IBP intervals, so no bound is looser than IBP's.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import _validation
from jaxrobust.certify import _primitives as prim
from jaxrobust.certify._interval import Interval, check_box, interval_bounds, propagate
from jaxrobust.certify._jaxpr import Const, Equation, Graph, compute_dtype, trace
from jaxrobust.engine import canonical_conv

Array = jax.Array


def _row_sum(values: Array) -> Array:
  """``[K, ...] -> [K]``: the sum of each specification row."""
  return jnp.sum(values.reshape(values.shape[0], -1), axis=1)


def _concretize(coeff: Array, box: Interval) -> Array:
  """``min over v in box of <coeff[k], v>`` for each row ``k``."""
  return _row_sum(jnp.where(coeff >= 0, coeff * box.lower[None], coeff * box.upper[None]))


def max_relaxation(lower: Array, upper: Array, c: Array) -> tuple:
  """Lines ``(a_low, b_low, a_up, b_up)`` with ``a_low v + b_low <= max(v, c) <= a_up v + b_up``
  for ``lower <= v <= upper``, elementwise; the lower slope is CROWN's adaptive choice."""
  active, inactive = lower >= c, upper <= c
  unstable = ~(active | inactive)
  width = jnp.where(unstable, upper - lower, jnp.ones_like(lower))
  one, zero = jnp.ones_like(lower), jnp.zeros_like(lower)
  chord = (upper - c) / width
  a_up = jnp.where(active, one, jnp.where(inactive, zero, chord))
  b_up = jnp.where(active, zero, jnp.where(inactive, c, c - chord * lower))
  a_low = jnp.where(active, one, jnp.where(inactive, zero,
                                           jnp.where(upper - c > c - lower, one, zero)))
  return a_low, (1 - a_low) * c, a_up, b_up


def _relaxation(eqn: Equation, graph: Graph, intervals: dict, dtype):
  """``(node, lines)`` when ``eqn`` is ``max``/``min`` of one node and a constant of the output's
  shape (after broadcasting), else ``None``."""
  positions = prim.variable_positions(eqn)
  if eqn.primitive.name not in ("max", "min") or len(positions) != 1:
    return None
  node = eqn.inputs[positions[0]]
  shape = graph.avals[eqn.outputs[0]].shape
  if graph.avals[node].shape != shape:
    return None
  c = jnp.broadcast_to(prim.cast(eqn.inputs[1 - positions[0]], dtype), shape)
  box = intervals[node]
  if eqn.primitive.name == "max":
    return node, max_relaxation(box.lower, box.upper, c)
  a_low, b_low, a_up, b_up = max_relaxation(-box.upper, -box.lower, -c)
  return node, (a_up, -b_up, a_low, -b_low)


def _affine_step(eqn: Equation, graph: Graph, coeff: Array, dtype) -> tuple:
  """``(offset [K], {position: coefficient})`` of ``<coeff, eqn(v)>`` for an affine equation."""
  positions = prim.variable_positions(eqn)

  def affine(*variables):
    values = list(eqn.inputs)
    for position, value in zip(positions, variables):
      values[position] = value
    return prim.bind(eqn, values, dtype)

  zeros = [jnp.zeros(graph.avals[eqn.inputs[p]].shape, dtype) for p in positions]
  offset, pullback = jax.vjp(affine, *zeros)
  pulled = jax.vmap(pullback)(coeff)
  return _row_sum(coeff * offset[None]), dict(zip(positions, pulled))


def _rounding_error(coeff: Array, box: Interval, dtype) -> Array:
  """``[K]``: the most ``<coeff[k], e>`` can be when the model rounds ``z = A(v)`` to ``dtype``,
  ``z = A(v) + e``: ``|e| <= u max(|l_z|, |u_z|) + s`` elementwise (``u`` the unit roundoff,
  ``s`` the smallest subnormal, for results below the normal range), ``[l_z, u_z]`` ``z``'s
  interval, which holds both the rounded and the unrounded value."""
  finfo = jnp.finfo(dtype)
  size = jnp.maximum(jnp.abs(box.lower), jnp.abs(box.upper))
  error = prim.unit_roundoff(dtype) * size + float(finfo.smallest_subnormal)
  weight = jnp.abs(coeff)
  return _row_sum(jnp.where(weight > 0, weight * error[None], jnp.zeros_like(weight)))


def backward_lower(graph: Graph, intervals: dict, target, spec: Array, *, relax: bool,
                   dtype) -> Array:
  """Lower bounds ``[K]`` of ``<spec[k], target(x)>`` over the box held in ``intervals[0]``.

  Args:
    graph: the traced function.
    intervals: sound intervals of every node computed so far (at least up to ``target``).
    target: the node (or :class:`Const`) bounded.
    spec: ``[K, *shape of target]`` specification rows.
    relax: ``True`` for CROWN (linear relaxation of ReLU-like equations); ``False`` stops at every
      nonlinear equation with its output interval (IBP with the affine tail kept exact).
    dtype: the bound dtype.
  """
  spec = spec.astype(dtype)
  if isinstance(target, Const):
    return _row_sum(spec * prim.cast(target, dtype)[None])
  coeffs = {target: spec}
  bound = jnp.zeros(spec.shape[:1], dtype)
  for eqn in reversed(graph.equations[:graph.producer_index(target) + 1]):
    (node,) = eqn.outputs
    if node not in coeffs:
      continue
    coeff = coeffs.pop(node)
    relaxation = None
    if not prim.is_affine(eqn, dtype) and relax:
      relaxation = _relaxation(eqn, graph, intervals, dtype)
    if prim.is_affine(eqn, dtype):
      offset, pulled = _affine_step(eqn, graph, coeff, dtype)
      sources = [(eqn.inputs[position], value) for position, value in pulled.items()]
      rounding = prim.rounding_dtype(eqn, graph.avals[node].dtype, dtype)
      if rounding is not None:
        offset = offset - _rounding_error(coeff, intervals[node], rounding)
    elif relaxation is not None:
      source, (a_low, b_low, a_up, b_up) = relaxation
      positive = coeff >= 0
      offset = _row_sum(jnp.where(positive, coeff * b_low[None], coeff * b_up[None]))
      sources = [(source, jnp.where(positive, coeff * a_low[None], coeff * a_up[None]))]
    else:
      offset, sources = _concretize(coeff, intervals[node]), []
    bound = bound + offset
    for source, value in sources:  # a node used several times sums its coefficients
      coeffs[source] = coeffs[source] + value if source in coeffs else value
  for node, coeff in coeffs.items():  # only the input is left
    bound = bound + _concretize(coeff, intervals[node])
  return bound


def _identity_spec(shape: tuple, dtype) -> Array:
  """``[2n, *shape]``: the rows ``e_i`` then ``-e_i`` for the ``n`` elements of a node."""
  size = 1
  for dim in shape:
    size *= dim
  eye = jnp.eye(size, dtype=dtype)
  return jnp.concatenate([eye, -eye]).reshape((2 * size,) + tuple(shape))


def node_bounds(graph: Graph, intervals: dict, node, dtype) -> Interval:
  """CROWN bounds of every element of ``node``, intersected with its interval."""
  if isinstance(node, Const):
    value = prim.cast(node, dtype)
    return Interval(value, value)
  box = intervals[node]
  if node == 0:
    return box
  shape = graph.avals[node].shape
  bound = backward_lower(graph, intervals, node, _identity_spec(shape, dtype), relax=True,
                         dtype=dtype)
  size = bound.shape[0] // 2
  lower, upper = bound[:size].reshape(shape), -bound[size:].reshape(shape)
  return Interval(jnp.maximum(box.lower, lower), jnp.minimum(box.upper, upper))


def crown_intervals(graph: Graph, lower: Array, upper: Array) -> dict:
  """Intervals of every node, where each input of a nonlinear equation is tightened by CROWN."""
  dtype = lower.dtype
  preactivations = {op for eqn in graph.equations if not prim.is_affine(eqn, dtype)
                    for op in eqn.inputs if not isinstance(op, Const)}

  def refine(node, intervals):
    if node not in preactivations:
      return intervals[node]
    return node_bounds(graph, intervals, node, dtype)

  return propagate(graph, lower, upper, refine)


def check_examples_per_pass(examples_per_pass: int | None) -> int | None:
  """``None`` or a positive int, else a ``ValueError``."""
  if examples_per_pass is not None and (
      isinstance(examples_per_pass, bool) or not isinstance(examples_per_pass, int)
      or examples_per_pass < 1):
    raise ValueError("examples_per_pass must be None (every example at once) or a positive int, "
                     f"got {examples_per_pass!r}")
  return examples_per_pass


def per_example(fn: Callable, examples_per_pass: int | None, model: Callable[[Array], Array],
                lower: Array, *arrays: Array):
  """``fn(lower, *arrays)`` mapped over the leading axis: all at once (``vmap``) when
  ``examples_per_pass`` is ``None``, else ``examples_per_pass`` at a time (``lax.map``), so the
  memory of the pass is that of ``examples_per_pass`` examples.

  On CPU, when ``model`` (the bounded ``x -> output``, ``x`` shaped like ``lower``) holds a
  convolution, the passes are traced with canonical convolutions
  (:func:`jaxrobust.engine.canonical_conv.on_cpu_canonical`, an exact rewrite): the backward
  passes' transposed convolutions would otherwise run on XLA:CPU's slow generic emitter inside
  the ``lax.map`` loop, or inside any loop the caller runs the bounds in (measured: CROWN-IBP
  margins of 8 points on a WRN-10-2, 4 per pass, 0.70 -> 0.10 s; ``benchmarks/RESULTS.md``).
  """
  if examples_per_pass is None:
    compute = lambda: jax.vmap(fn)(lower, *arrays)  # noqa: E731
  else:
    compute = lambda: jax.lax.map(lambda a: fn(*a), (lower, *arrays),  # noqa: E731
                                  batch_size=examples_per_pass)
  return canonical_conv.on_cpu_canonical(compute, model, lower)


def per_example_graph(fn: Callable[[Array], Array], lower: Array, full_shape: tuple) -> Graph:
  """``fn`` traced on one example (batch 1); its output must be ``[1, ...]`` and match the full
  batch's output shape ``full_shape`` (bounds are computed one example at a time)."""
  # A shape, not the slice lower[:1]: an Explicit batch-sharded axis cannot type a 1-row slice.
  graph = trace(fn, jax.ShapeDtypeStruct((1, *lower.shape[1:]), lower.dtype))
  out = (graph.output.value.shape if isinstance(graph.output, Const)
         else graph.avals[graph.output].shape)
  if not out or out[0] != 1 or tuple(full_shape) != (lower.shape[0],) + tuple(out[1:]):
    raise ValueError(
        "linear bounds are computed one example at a time: fn must map x [B, ...] to an output "
        f"[B, ...] treating examples independently; got {tuple(full_shape)} for a batch of "
        f"{lower.shape[0]} and {tuple(out)} for a batch of 1")
  return graph


def _first_row(x: Array) -> Array:
  """``x[:1]``; a batch sharded over an Explicit mesh axis is replicated first (a 1-row slice of
  it has no sharding type)."""
  sharding = getattr(jax.typeof(x), "sharding", None)
  spec = getattr(sharding, "spec", None)
  if spec and spec[0] is not None:
    x = jax.reshard(x, jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec()))
  return x[:1]


CENTRE = " (checked at the box centre c = (lower + upper) / 2)"
"""Where :func:`linear_bounds` and :func:`jaxrobust.certify.margin_bounds` check it."""

MIXING_TOLERANCE = 1e-3
"""How far ``fn(x[:1])`` may be from ``fn(x)[:1]``, relative to ``1 + max |fn(x)[:1]|``, for a
model that treats examples independently (float32; :func:`check_rows_independent` allows 16 ulps
of a lower-precision input or output dtype): batch sizes change only the order of float sums."""


def check_rows_independent(fn: Callable[[Array], Array], x: Array, out: Array | None = None, *,
                           name: str = "logits_fn", rows: str = "x", at: str = "") -> None:
  """Concrete ``x`` only (traced, or a model that closes over tracers: nothing to check): the
  first example's output does not depend on the other examples of the batch, i.e.
  ``fn(x[:1])`` matches ``fn(x)[:1]`` within :data:`MIXING_TOLERANCE` (a batch of 1 is compared
  with itself duplicated to 2 rows). Bounds are computed one example at a time, which is sound
  only for such a model; one that uses batch statistics (BatchNorm in training mode, batch
  centring) would get bounds, and certified radii, that do not hold for it. One extra forward
  pass of 1 row (of the whole batch too unless ``out = fn(x)`` is given).

  Args:
    fn: the model, ``[B, ...] -> [B, ...]``.
    x: the rows to compare on (``[B, ...]``).
    out: ``fn(x)`` if already computed (``B > 1``), else ``None``.
    name, rows: how the message calls ``fn`` and ``x``; ``at`` says what ``x`` is, if needed.

  Raises:
    ValueError: with the largest difference, the values there, and the fix (eval mode).

  Examples:
    >>> import jax.numpy as jnp
    >>> x = jnp.array([[0.6, 0.4], [0.3, 0.7]])
    >>> check_rows_independent(lambda v: 2 * v, x)  # per example: passes
    >>> check_rows_independent(lambda v: v - v.mean(0, keepdims=True), x)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: logits_fn's output for an example depends on the other examples of the batch: ...
  """
  if not _validation.is_concrete(x, out):
    return
  if x.shape[0] == 1:
    one, full = (fn(x) if out is None else out), fn(jnp.concatenate([x, x]))
    alone_label, batched_label = f"{name}({rows})", f"{name}(concatenate([{rows}, {rows}]))"
  else:
    one, full = fn(_first_row(x)), (fn(x) if out is None else out)
    alone_label, batched_label = f"{name}({rows}[:1])", f"{name}({rows})"
  if not _validation.is_concrete(one, full) or tuple(one.shape) != (1, *full.shape[1:]):
    return  # a closure over tracers (e.g. under jax.grad), or a shape the callers report
  floats = [jnp.dtype(a.dtype) for a in (x, one) if jnp.issubdtype(a.dtype, jnp.floating)]
  tolerance = max([MIXING_TOLERANCE] + [16 * float(jnp.finfo(d).eps) for d in floats])
  alone, batched = np.asarray(one, np.float64), np.asarray(full, np.float64)[:1]
  finite = np.isfinite(alone) & np.isfinite(batched)
  gap = np.abs(np.where(finite, alone, 0.0) - np.where(finite, batched, 0.0))
  scale = 1.0 + float(np.max(np.abs(np.where(finite, batched, 0.0)), initial=0.0))
  same = np.where(finite, gap <= tolerance * scale,
                  (alone == batched) | (np.isnan(alone) & np.isnan(batched)))
  if same.all():
    return
  gap = np.where(finite, gap, np.inf)
  where = np.unravel_index(int(np.argmax(np.where(same, -1.0, gap))), alone.shape)
  index = ", ".join(map(str, where))
  raise ValueError(
      f"{name}'s output for an example depends on the other examples of the batch{at}: "
      f"{alone_label}[{index}] = {alone[where]:.6g} but {batched_label}[{index}] = "
      f"{batched[where]:.6g} ({int((~same).sum())} of {same.size} outputs of the first example "
      f"differ by more than {tolerance:g} * (1 + their largest magnitude)). Bounds are computed "
      "one example at a time, so for a model that uses batch statistics (e.g. BatchNorm in "
      "training mode, or centring by the batch mean) they, and the certified radii, would be "
      "unsound. Put the model in eval mode (nnx: model.eval(); linen: "
      "use_running_average=True) so that each example's output depends on that example only.")


def linear_bounds(fn: Callable[[Array], Array], lower: Array, upper: Array, *,
                  examples_per_pass: int | None = None) -> tuple:
  r"""Sound elementwise bounds on ``fn(x)`` for ``lower <= x <= upper``, by CROWN.

  Backward linear relaxation (Zhang et al. 2018): each output element ``z_k`` is bounded by
  pulling the specification ``e_k`` back through the graph to a linear function of ``x``,

  .. math:: z_k(x) \ge \Lambda_k^\top x + \beta_k \ge
     \sum_i \min(\Lambda_{k,i} l_i, \Lambda_{k,i} u_i) + \beta_k,

  exactly through affine layers (their vector-Jacobian products), and through ReLU
  (``max(v, 0)``, any constant threshold, and ``min`` likewise) with the triangle relaxation: the
  chord above and the adaptive line (slope 1 if ``u > -l`` else 0) below. The pre-activation
  intervals the relaxation needs are CROWN bounds themselves; other nonlinear functions (``tanh``,
  ``exp``, ``log``, ``sqrt``, powers, ``reduce_max``, max pooling) contribute the constant bounds
  of their IBP interval. The result is intersected with :func:`interval_bounds`, so it is never
  looser.

  Examples are bounded one at a time (``vmap`` over the batch): ``fn`` must treat them
  independently, as every ``logits_fn`` does, and map ``[B, ...]`` to ``[B, ...]``. The cost is one
  backward pass per nonlinear layer with twice as many rows as that layer has units per example,
  and the memory of one such pass holds a ``[rows, units]`` coefficient per layer below it: fine
  for MLPs and small convolutional networks, out of reach at 32x32x16 units (a WideResNet's
  first group), where :func:`jaxrobust.certify.margin_bounds` with ``method="crown-ibp"`` is the
  linear bound that scales. Call it under ``jax.jit``: run eagerly, every small operation of the backward passes is
  compiled on its own (seconds even for a tiny network).

  Args:
    fn: function of ``x [B, ...]`` returning ``[B, ...]`` (typically logits ``[B, C]``); a Flax
      ``nnx`` module works as it is.
    lower, upper: arrays of ``x``'s full shape, ``lower <= upper``; may be tracers. bfloat16 boxes
      are bounded in float32.
    examples_per_pass: the memory knob (static): ``None`` bounds every example at once (one
      ``vmap``); an int bounds that many at a time (``lax.map``) for the same result.

  Returns:
    ``(lo, hi)``, each of ``fn(x)``'s shape, in float32 (or the input's dtype if wider).

  Raises:
    NotImplementedError: naming every primitive of ``fn`` that no rule handles.
    ValueError: for boxes of different shapes, a concrete box that is NaN, infinite or has
      ``lower > upper``, when ``fn``'s output is not ``[B, ...]``, or (concrete box) when
      ``fn``'s output for an example depends on the other examples of the batch (batch
      statistics, e.g. BatchNorm in training mode: put the model in eval mode), checked at the
      box centre: ``fn(c[:1])`` against ``fn(c)[:1]``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jaxrobust import certify
    >>> w1, w2 = jnp.array([[1.0, 1.0], [1.0, -1.0]]), jnp.array([[1.0, 1.0]])
    >>> fn = lambda x: jnp.maximum(x @ w1.T, 0.0) @ w2.T
    >>> box = jnp.array([[-1.0, -1.0]]), jnp.array([[1.0, 1.0]])
    >>> upper = jax.jit(lambda l, u: (certify.interval_bounds(fn, l, u)[1],  # IBP
    ...                                certify.linear_bounds(fn, l, u)[1]))  # CROWN
    >>> upper(*box)
    (Array([[4.]], dtype=float32), Array([[3.]], dtype=float32))

  References:
    H. Zhang, T.-W. Weng, P.-Y. Chen, C.-J. Hsieh, L. Daniel. Efficient neural network robustness
    certification with general activation functions. NeurIPS 2018.
  """
  check_examples_per_pass(examples_per_pass)
  lower, upper = check_box(lower, upper)
  ibp_lower, ibp_upper = interval_bounds(fn, lower, upper)
  graph = per_example_graph(fn, lower, ibp_lower.shape)
  if _validation.is_concrete(lower, upper):
    check_rows_independent(fn, (lower + upper) / 2, name="fn", rows="c", at=CENTRE)
  dtype = compute_dtype(lower.dtype)

  def one_example(example_lower, example_upper):
    intervals = crown_intervals(graph, example_lower[None].astype(dtype),
                                example_upper[None].astype(dtype))
    return tuple(node_bounds(graph, intervals, graph.output, dtype))

  crown_lower, crown_upper = per_example(one_example, examples_per_pass, fn, lower, upper)
  return (jnp.maximum(ibp_lower, crown_lower.reshape(ibp_lower.shape)),
          jnp.minimum(ibp_upper, crown_upper.reshape(ibp_upper.shape)))
