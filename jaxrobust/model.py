r"""The model: a logits function taken apart into its parameters and a pure function of them.

Every front door takes the model as a logits function ``x [B, ...] -> logits [B, C]`` (a
randomized one as ``(x, keys) -> logits``). Several parts of the library need its parameters
apart from its code: :func:`jaxrobust.evaluate` passes them to its compiled step as arguments
(so new weights reuse the program, and XLA never folds them as constants) and fingerprints them
for checkpoints; the training losses attack a frozen copy; the command line compiles one program
for several models. :func:`model_of` is the one place that recognises how a model holds its
parameters:

* a Flax NNX module (``flax.nnx.Module``): its whole state, ``nnx.split``; called by
  ``nnx.merge(graphdef, state)(x)``, a fresh module per call, so whatever the call changes
  (BatchNorm statistics, RNG counters) stays with that copy;
* ``functools.partial(apply, params, ...)`` (Flax linen's ``partial(model.apply, variables)``,
  ``jax.tree_util.Partial``): the array leaves of its bound arguments (``jax.Array`` and NumPy);
  every other bound value is part of the code;
* any other callable: no parameters it shows; whatever it reads is captured when it is traced.

:class:`Model` holds the result: ``params`` (a pytree of arrays) and what calls the model on
them. It is itself a pytree whose only leaves are the parameters, so it can be an argument of a
jitted function (the code is static and compared by identity of the function and structure).

A logits function that *captures* large arrays (a closure, a global, an object's attribute, a
module closed over by the caller's ``jax.jit``) has them compiled into the program as constants:
XLA then folds computations on them at compile time, which on a ResNet means evaluating the
clean forward pass while compiling (for AutoAttack on a WRN-16-4 on CPU, with weights and data
captured, many times the compile time with both as arguments: ``benchmarks/RESULTS.md``,
"Compile time with and without constants"). :func:`captured_constants` lists such arrays from a
trace, and :func:`warn_if_captured` warns (:class:`CapturedConstantsWarning`, once per message and
call site) with the fix.

Examples:
  >>> import functools, jax, jax.numpy as jnp
  >>> apply = lambda w, x: x @ w
  >>> model = model_of(functools.partial(apply, jnp.eye(2)))
  >>> model.kind, [p.shape for p in jax.tree.leaves(model.params)]
  ('partial', [(2, 2)])
  >>> logits = jax.jit(lambda m, x: m(x))(model, jnp.ones((1, 2)))  # params are an argument
  >>> logits.tolist()
  [[1.0, 1.0]]

References:
  Flax NNX, "Functional API" (``nnx.split`` / ``nnx.merge``); JAX, "Pytrees" (closure
  conversion of parameters into arguments).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import _jaxpr_walk

Array = jax.Array

CONSTANT_WARNING_BYTES = 1 << 22
"""Captured arrays above this many bytes in all (4 MiB, a million float32 weights) are warned
about: below it, folding them costs XLA little."""


class CapturedConstantsWarning(UserWarning):
  """A model (or the data) will be compiled into the program as constants; see
  :func:`jaxrobust.model.warn_if_captured`."""


def _nnx():
  """``flax.nnx`` if the user imported it (an ``nnx.Module`` exists only then), else ``None``."""
  return sys.modules.get("flax.nnx")


def _function(spec: Any, params: Any) -> Callable[..., Array]:
  del params
  return spec


def _partial(spec: Any, params: Any) -> functools.partial:
  func, treedef, is_array, statics = spec
  arrays, others = iter(params), iter(statics)
  args, keywords = jax.tree.unflatten(treedef, [next(arrays) if a else next(others)
                                                for a in is_array])
  return functools.partial(func, *args, **keywords)


def _module(spec: Any, params: Any) -> Callable[..., Array]:
  return _nnx().merge(spec, params)


_BUILD = {"function": _function, "partial": _partial, "nnx": _module}


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
  """A logits function as parameters and the code that calls the model on them.

  Callable as the model itself (``model(x)``, or ``model(x, keys)`` for a randomized one);
  :meth:`apply` calls it on other parameters of the same structure. A pytree whose leaves are
  the parameters (``kind`` and ``spec`` are static), so ``jax.jit(lambda m, x: m(x))(model, x)``
  passes the weights as arguments.

  Attributes:
    params: the parameters, a pytree of arrays (``[]`` for a plain callable).
    kind: ``"nnx"``, ``"partial"`` or ``"function"``.
    spec: what identifies the model apart from its parameters (hashable where its parts are).
    compute_dtype: ``None``, or the dtype the model computes in (:meth:`compute_in`).
  """

  params: Any  # a pytree of arrays (empty for an opaque callable)
  kind: str  # "function", "partial" or "nnx"
  spec: Any  # everything but the parameters: the callable, the partial's structure, the graphdef
  compute_dtype: Any = None  # None, or the dtype the model computes in (see compute_in)

  def _replace(self, **changes: Any) -> Model:
    return dataclasses.replace(self, **changes)

  def __call__(self, *inputs: Any) -> Array:
    if self.compute_dtype is None:
      return self.as_callable()(*inputs)
    x, *rest = inputs
    logits = self.as_callable()(x.astype(self.compute_dtype), *rest)
    return logits.astype(jnp.promote_types(x.dtype, jnp.float32))

  def compute_in(self, dtype: Any) -> Model:
    r"""The model computing in ``dtype`` (e.g. ``jnp.bfloat16``): its floating parameters cast
    once, its input cast at every call, its logits returned in float32 (float64 for float64
    inputs).

    Attacks then keep float32 iterates, steps and projections (the engine works in float32 at
    least), and only the model's arithmetic is in ``dtype``: on an accelerator, bfloat16 matrix
    units at about twice the float32 rate and half the memory for activations. The logits
    carry ``dtype``'s rounding (bfloat16: 8 significant bits, about 0.4% of a logit's size), so
    a point within that of the decision boundary may be judged either way; the verdicts are the
    bfloat16 model's, which is the model being evaluated. Only the parameters a model shows are
    cast (an NNX module's state, a ``partial``'s arrays); a plain callable keeps what it
    captures, and gets only its input cast.

    Examples:
      >>> import functools, jax.numpy as jnp
      >>> model = model_of(functools.partial(lambda w, x: x @ w, jnp.ones((2, 2)))).compute_in(
      ...     jnp.bfloat16)
      >>> model.params[0].dtype.name, model(jnp.ones((1, 2))).dtype.name
      ('bfloat16', 'float32')
    """
    cast = lambda v: v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v
    return self._replace(params=jax.tree.map(cast, self.params), compute_dtype=jnp.dtype(dtype))

  def apply(self, params: Any, *inputs: Any) -> Array:
    """The model with ``params`` instead of its own: the pure function of (params, inputs)."""
    return self.with_params(params)(*inputs)

  def as_callable(self) -> Callable[..., Array]:
    """The logits function itself, rebuilt on :attr:`params`: the callable, the ``partial``, or
    a new NNX module (``nnx.merge``) that the calls made on it share."""
    return _BUILD[self.kind](self.spec, self.params)

  def with_params(self, params: Any) -> Model:
    """The same model on other parameters (of the same structure)."""
    return self._replace(params=params)

  @property
  def arguments(self) -> Any:
    """Every array the model reads, as the pytree a compiled program takes it: :attr:`params`
    here; a model that also reads arrays it does not train (a
    :class:`jaxrobust.interop.TorchModel`'s buffers) gives both. :func:`jaxrobust.evaluate`
    passes these to its compiled step, so none of them is a constant of the program."""
    return self.params

  def with_arguments(self, arguments: Any) -> Model:
    """The same model on other :attr:`arguments` (of the same structure)."""
    return self.with_params(arguments)

  @property
  def identity(self) -> tuple:
    """``(kind, spec, compute_dtype)``: equal for two models that differ at most in their
    parameters."""
    return (self.kind, self.spec, self.compute_dtype)

  def frozen(self) -> Model:
    """The model with ``stop_gradient`` on its parameters: no gradient reaches them through it,
    and (for an NNX module) no state update escapes the call."""
    return self.with_params(jax.tree.map(_stop_gradient, self.params))

  def pure(self) -> Model:
    """The model on a copy of its parameters' tree: gradients flow, and (for an NNX module) state
    updates stay with the copy built at each call."""
    return self.with_params(jax.tree.map(lambda v: v, self.params))


def _stop_gradient(value: Any) -> Any:
  return jax.lax.stop_gradient(value) if isinstance(value, jax.Array) else value


jax.tree_util.register_pytree_node(
    Model, lambda m: ((m.params,), (m.kind, m.spec, m.compute_dtype)),
    lambda aux, children: Model(children[0], *aux))


def model_of(logits_fn: Callable[..., Array] | Model) -> Model:
  """``logits_fn`` taken apart into its parameters and the code that calls it (see the module).

  Args:
    logits_fn: the model: an ``nnx.Module``, a ``functools.partial`` of an apply function, a
      :class:`Model` (returned as it is) or any callable.

  Returns:
    A :class:`Model` with ``model(x) == logits_fn(x)``.

  Examples:
    >>> import jax.numpy as jnp
    >>> model_of(lambda x: x).kind, model_of(lambda x: x).params
    ('function', [])
  """
  if isinstance(logits_fn, Model):
    return logits_fn
  refuse_torch_module(logits_fn)
  nnx = _nnx()
  if nnx is not None and isinstance(logits_fn, nnx.Module):
    graphdef, state = nnx.split(logits_fn)
    return Model(state, "nnx", graphdef)
  if isinstance(logits_fn, functools.partial):  # jax.tree_util.Partial included
    leaves, treedef = jax.tree.flatten((logits_fn.args, logits_fn.keywords))
    is_array = tuple(isinstance(v, (jax.Array, np.ndarray)) for v in leaves)
    arrays = [v for v, a in zip(leaves, is_array) if a]
    statics = tuple(v for v, a in zip(leaves, is_array) if not a)
    return Model(arrays, "partial", (logits_fn.func, treedef, is_array, statics))
  return Model([], "function", logits_fn)


def refuse_torch_module(logits_fn: Any) -> None:
  """A ``TypeError`` saying to convert it when ``logits_fn`` is a ``torch.nn.Module`` (known by
  its classes, without importing torch): JAX cannot trace one, and what fails inside it says
  nothing of the cause."""
  if any(c.__module__ == "torch.nn.modules.module" and c.__name__ == "Module"
         for c in type(logits_fn).__mro__):
    raise TypeError(f"logits_fn is a PyTorch module ({type(logits_fn).__name__}), which JAX "
                    "cannot trace: convert it first, model = jr.interop.from_torch(module.eval(), "
                    "example_batch), and pass model.")


def captured_constants(closed_jaxpr: Any) -> list:
  """The arrays a traced function captured: the constants of ``closed_jaxpr`` and of every closed
  jaxpr nested in its equations (an inner ``jax.jit`` keeps what its function closes over as its
  own constants), tracers of an enclosing trace included.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> w = jnp.arange(6.0).reshape(3, 2)
    >>> [c.shape for c in captured_constants(jax.make_jaxpr(lambda x: x @ w)(jnp.ones((1, 3))))]
    [(3, 2)]
  """
  return _jaxpr_walk.all_consts(closed_jaxpr)


TRAIN_MODE_NOTE = (
    "jaxrobust: the model changes its own state when called (Flax's TraceContextError: e.g. "
    "BatchNorm in train mode, updating its batch statistics, or Dropout drawing from its Rngs). "
    "Attacks, bounds and evaluations trace the model as a pure function of x: put it in eval "
    "mode first (nnx: model.eval(); linen: use_running_average=True, deterministic=True).")
"""The note :func:`trace_model` adds to an error raised by a model that mutates its state while
traced."""

TRAIN_MODE_ERRORS = ("TraceContextError", "ModifyScopeVariableError", "InvalidRngError")
"""Flax's errors for a model left in train mode, by name (Flax is optional): NNX's
``TraceContextError``; linen's ``ModifyScopeVariableError`` (BatchNorm updating an immutable
``batch_stats``) and ``InvalidRngError`` (Dropout without an ``rngs`` stream)."""


def trace_model(fn: Callable[..., Any], *args: Any, return_shape: bool = False) -> Any:
  """``jax.make_jaxpr(fn, return_shape=return_shape)(*args)``, the one place the library traces
  a user's model to read it (the input validator, the certifiers). An error the model raises
  because it changes its own state while traced (Flax's errors of :data:`TRAIN_MODE_ERRORS`,
  whose texts name neither train mode nor eval mode) gets :data:`TRAIN_MODE_NOTE`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> closed = trace_model(lambda v: 2 * v, jax.ShapeDtypeStruct((3,), jnp.float32))
    >>> closed.jaxpr.eqns[0].primitive
    mul
  """
  refuse_torch_module(fn)
  try:
    return jax.make_jaxpr(fn, return_shape=return_shape)(*args)
  except Exception as error:
    if type(error).__name__ in TRAIN_MODE_ERRORS:
      error.add_note(TRAIN_MODE_NOTE)
    raise


def tracing() -> bool:
  """Whether a program is being traced here (a ``jax.jit`` or a loop body): a new array would be
  a tracer, so any concrete array used now becomes a constant of that program.

  Examples:
    >>> import jax
    >>> tracing(), jax.jit(lambda: jax.numpy.asarray(tracing()))().item()
    (False, True)
  """
  return isinstance(jax.numpy.zeros((), bool), jax.core.Tracer)


def _concrete_bytes(values: Any) -> int:
  """Bytes of the concrete arrays among ``values`` (tracers of an enclosing trace are arguments
  of that trace, not constants)."""
  return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in values
             if isinstance(v, (jax.Array, np.ndarray)) and not isinstance(v, jax.core.Tracer))


def _size(num_bytes: int) -> str:
  return (f"{num_bytes / 2**20:.1f} MiB" if num_bytes >= 2**20 else f"{num_bytes / 2**10:.1f} KiB")


JIT_REMEDY = (
    "Pass them as arguments of the jitted function instead, e.g. jax.jit(lambda params, x, y, eps, "
    "key: jr.robustness_curve(attack, lambda v: model.apply(params, v), x, y, eps, key)); for Flax "
    "NNX, graphdef, state = nnx.split(model) and nnx.merge(graphdef, state) inside.")
"""What :func:`warn_if_captured` tells a caller of ``jr.run`` or ``jr.robustness_curve`` inside
their own ``jax.jit``."""

EVALUATE_REMEDY = (
    "jr.evaluate passes a model's parameters to its compiled step as arguments when it can see "
    "them: give it functools.partial(model.apply, params) or the nnx.Module itself, not a lambda "
    "or function that reads the weights from outside.")
"""What :func:`warn_if_captured` tells a caller of ``jr.evaluate``, which compiles its own step
(see :func:`model_of`)."""


def warn_if_captured(constants: Any, data: Any = (), *, where: str, stacklevel: int = 3,
                     remedy: str = JIT_REMEDY) -> None:
  """Warns (:class:`CapturedConstantsWarning`) when the concrete arrays among ``constants`` (a
  model's captured arrays, :func:`captured_constants`) or ``data`` (inputs that are concrete while
  the program around them is being traced) hold more than :data:`CONSTANT_WARNING_BYTES`: they
  will be compiled in as constants. Host-side, at trace time; silent otherwise.

  Examples:
    >>> import warnings, numpy as np
    >>> with warnings.catch_warnings(record=True) as caught:
    ...   warnings.simplefilter("always")
    ...   warn_if_captured([np.zeros((1024, 2048), np.float32)], where="jr.run")  # 8 MiB
    >>> caught[0].category.__name__
    'CapturedConstantsWarning'
  """
  weights, inputs = _concrete_bytes(jax.tree.leaves(constants)), _concrete_bytes(
      jax.tree.leaves(data))
  if weights + inputs <= CONSTANT_WARNING_BYTES:
    return
  parts = []
  if weights:
    parts.append(f"the model captures {_size(weights)} of arrays (weights closed over by the "
                 "logits function)")
  if inputs:
    parts.append(f"{_size(inputs)} of inputs are concrete arrays inside the traced function "
                 "(data closed over)")
  warnings.warn(
      f"{where}: {' and '.join(parts)}; they are compiled into the program as constants, which "
      f"XLA folds at compile time (slow compiles, large programs). {remedy}",
      CapturedConstantsWarning, stacklevel=stacklevel)
