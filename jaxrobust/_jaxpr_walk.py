"""Walking jaxprs: the one place that knows where sub-jaxprs live and how to descend into them.

A jaxpr's equations hold further jaxprs in their parameters: loop bodies and conditions
(``scan``'s ``jaxpr``, ``while``'s ``cond_jaxpr`` and ``body_jaxpr``), conditional branches
(``cond``'s ``branches``, a tuple), called functions (``jit``'s ``jaxpr``, ``closed_call``'s and
the custom-derivative calls' ``call_jaxpr``, ``checkpoint``'s ``jaxpr``), closed
(:class:`jax.extend.core.ClosedJaxpr`, with constants) or open (:class:`jax.extend.core.Jaxpr`).
Rather than naming parameters per primitive, any parameter value that is a jaxpr, or a tuple or
list holding jaxprs (nested ones too), counts.

* :func:`sub_jaxprs` finds them in one equation's parameters, :func:`map_sub_jaxprs` replaces
  them (a re-traced loop body), :func:`call_body` picks the one a call-like equation evaluates;
* :func:`iter_equations` reads every equation, nested ones included, :func:`iter_jaxprs` every
  jaxpr; :func:`all_consts` collects the constants of a closed jaxpr and of every closed jaxpr
  nested in it;
* :func:`interpret` evaluates a jaxpr with a rule per equation, inlining chosen calls.

Used by :mod:`jaxrobust.engine.canonical_conv` (re-evaluation with canonical convolutions),
:mod:`jaxrobust.certify._jaxpr` (flattening for bound propagation),
:func:`jaxrobust.model.captured_constants` and :func:`jaxrobust.diagnosis.diagnose` (which
operations lie on the path from the input to the logits).

Examples:
  >>> import jax, jax.numpy as jnp
  >>> w = jnp.ones((3, 2))
  >>> closed = jax.make_jaxpr(lambda x: jax.jit(lambda v: jnp.sin(v @ w))(x))(jnp.ones((1, 3)))
  >>> [eqn.primitive.name for eqn in iter_equations(closed)]
  ['jit', 'dot_general', 'sin']
  >>> [c.shape for c in all_consts(closed)]
  [(3, 2)]
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from jax.extend import core

CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
"""The parameters a call-like equation keeps its function's jaxpr in, the first present wins."""


def is_jaxpr(value: Any) -> bool:
  """Whether ``value`` is a jaxpr, closed or open."""
  return isinstance(value, (core.ClosedJaxpr, core.Jaxpr))


def open_jaxpr(jaxpr: Any) -> tuple[Any, tuple]:
  """``(open jaxpr, constants)`` of a closed or open jaxpr (an open one has none)."""
  if isinstance(jaxpr, core.ClosedJaxpr):
    return jaxpr.jaxpr, jaxpr.consts
  return jaxpr, ()


def _in_value(value: Any) -> Iterator[Any]:
  if is_jaxpr(value):
    yield value
  elif isinstance(value, (tuple, list)):
    for item in value:
      yield from _in_value(item)


def sub_jaxprs(params: Mapping[str, Any]) -> list:
  """The jaxprs (closed or open, as they are) held by an equation's ``params``, in the order of
  the parameters and of the tuples and lists holding them.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda p, x: jax.lax.cond(p, jnp.sin, jnp.cos, x))(True, 1.0)
    >>> len(sub_jaxprs(closed.jaxpr.eqns[-1].params))  # the two branches
    2
  """
  return [jaxpr for value in params.values() for jaxpr in _in_value(value)]


def _map_value(value: Any, fn: Callable[[Any], Any]) -> Any:
  if is_jaxpr(value):
    return fn(value)
  if isinstance(value, (tuple, list)) and any(True for _ in _in_value(value)):
    items = [_map_value(item, fn) for item in value]
    return type(value)(items) if type(value) in (tuple, list) else type(value)(*items)
  return value


def map_sub_jaxprs(params: Mapping[str, Any], fn: Callable[[Any], Any]) -> dict:
  """``params`` with every jaxpr :func:`sub_jaxprs` finds replaced by ``fn(jaxpr)`` (tuples,
  lists and named tuples keep their type); other values unchanged."""
  return {name: _map_value(value, fn) for name, value in params.items()}


def call_body(eqn: Any) -> tuple[Any, tuple] | None:
  """``(open jaxpr, constants)`` of the function a call-like equation (``jit``, ``closed_call``,
  a custom-derivative call, ``checkpoint``) evaluates: its first :data:`CALL_PARAMS` parameter;
  ``None`` when it has none."""
  name = next((p for p in CALL_PARAMS if p in eqn.params), None)
  return None if name is None else open_jaxpr(eqn.params[name])


def iter_equations(jaxpr: Any, recursive: bool = True) -> Iterator[Any]:
  """The equations of ``jaxpr`` (closed or open) in order, each followed, if ``recursive``, by
  those of the jaxprs in its parameters (depth first)."""
  for eqn in open_jaxpr(jaxpr)[0].eqns:
    yield eqn
    if recursive:
      for sub in sub_jaxprs(eqn.params):
        yield from iter_equations(sub)


def iter_jaxprs(jaxpr: Any) -> Iterator[Any]:
  """The open jaxpr of ``jaxpr`` (closed or open), then those nested in its equations'
  parameters, recursively, depth first (a jaxpr held twice is yielded twice)."""
  inner = open_jaxpr(jaxpr)[0]
  yield inner
  for eqn in inner.eqns:
    for sub in sub_jaxprs(eqn.params):
      yield from iter_jaxprs(sub)


def all_consts(jaxpr: Any) -> list:
  """The constants of ``jaxpr`` and of every closed jaxpr nested in its equations' parameters,
  recursively: its own first, then each nested jaxpr's, the last found first (an order that
  fingerprints depend on: keep it)."""
  inner, found = open_jaxpr(jaxpr)
  found = list(found)
  nested = [sub for eqn in inner.eqns for sub in sub_jaxprs(eqn.params)]
  for sub in reversed(nested):
    found.extend(all_consts(sub))
  return found


def _same(value: Any) -> Any:
  return value


def _never(eqn: Any) -> bool:
  del eqn
  return False


def interpret(jaxpr: Any, consts: Any, args: Any, rule: Callable[[Any, list], Any], *,
              inline: Callable[[Any], bool] = _never,
              wrap: Callable[[Any], Any] = _same) -> list:
  """Evaluates the open ``jaxpr`` on ``args``, its constvars bound to ``consts``.

  Each equation's results are ``rule(eqn, operands)`` (a sequence, one per outvar), except that
  an equation for which ``inline(eqn)`` holds and that has a :func:`call_body` is evaluated in
  place: its body is interpreted the same way on the operands. Literals and the constants of
  inlined bodies enter as ``wrap(value)``; ``consts`` and ``args`` as given.

  Returns:
    the values of ``jaxpr``'s outvars.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda x: jax.jit(jnp.sin)(x) + 1.0)(0.5)
    >>> bind = lambda eqn, ops: [eqn.primitive.bind(*ops, **eqn.params)]
    >>> names = []
    >>> rule = lambda eqn, ops: names.append(eqn.primitive.name) or bind(eqn, ops)
    >>> out = interpret(closed.jaxpr, closed.consts, [0.5], rule, inline=lambda e: True)
    >>> names, bool(jnp.allclose(out[0], jnp.sin(0.5) + 1.0))
    (['sin', 'add'], True)
  """
  env: dict[Any, Any] = {}

  def read(atom):
    return wrap(atom.val) if isinstance(atom, core.Literal) else env[atom]

  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    operands = [read(atom) for atom in eqn.invars]
    body = call_body(eqn) if inline(eqn) else None
    if body is None:
      results = rule(eqn, operands)
    else:
      sub, sub_consts = body
      results = interpret(sub, [wrap(c) for c in sub_consts], operands, rule, inline=inline,
                          wrap=wrap)
    # A dropped output (a DropVar) is stored too: no equation reads it. (Not checked by type:
    # jax.extend.core has DropVar only from jax 0.10.)
    env.update(zip(eqn.outvars, results))
  return [read(atom) for atom in jaxpr.outvars]
