"""jaxrobust._jaxpr_walk: sub-jaxprs found wherever params hold them, nested equations walked,
constants collected in their fingerprinted order, calls inlined by the interpreter."""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust import _jaxpr_walk as walk


def _closed(fn, *args):
  return jax.make_jaxpr(fn)(*args)


def test_sub_jaxprs_in_values_tuples_lists_and_named_tuples():
  a, b = _closed(jnp.sin, 1.0), _closed(jnp.cos, 1.0)
  pair = collections.namedtuple("Pair", "first second")
  params = {"n": 3, "jaxpr": a, "branches": (a, b), "nested": [(b,), None], "named": pair(a, None),
            "none": (1, 2)}
  assert walk.sub_jaxprs(params) == [a, a, b, b, a]
  mapped = walk.map_sub_jaxprs(params, lambda j: j.jaxpr)
  assert mapped["jaxpr"] is a.jaxpr and mapped["branches"] == (a.jaxpr, b.jaxpr)
  assert mapped["nested"] == [(b.jaxpr,), None]
  assert type(mapped["named"]) is pair and mapped["named"] == pair(a.jaxpr, None)
  assert mapped["none"] is params["none"] and mapped["n"] == 3


def test_iter_equations_reaches_loops_conditionals_and_calls():
  def fn(x):
    y = jax.lax.scan(lambda c, _: (jnp.sin(c), None), x, None, length=2)[0]
    y = jax.lax.cond(y > 0, jnp.exp, lambda v: jax.jit(jnp.tanh)(v), y)
    return jax.lax.while_loop(lambda v: v < 1, jnp.log1p, y)

  names = {eqn.primitive.name for eqn in walk.iter_equations(_closed(fn, 0.5))}
  assert {"sin", "exp", "tanh", "log1p", "scan", "cond", "while"} <= names
  top = [eqn.primitive.name for eqn in walk.iter_equations(_closed(fn, 0.5), recursive=False)]
  assert "sin" not in top and "scan" in top


def test_iter_jaxprs_yields_every_nested_jaxpr_once_per_place():
  def fn(x):
    y = jax.lax.cond(x > 0, jnp.sin, lambda v: jax.jit(jnp.tanh)(v), x)
    return jax.lax.scan(lambda c, _: (jnp.cos(c), None), y, None, length=2)[0]

  closed = _closed(fn, 0.5)
  jaxprs = list(walk.iter_jaxprs(closed))
  assert jaxprs[0] is closed.jaxpr
  # top, the two branches, the jit inside the second, the scan body (jnp.sin/tanh/cos may be
  # further jits of their own, each with one equation)
  names = [[e.primitive.name for e in j.eqns] for j in jaxprs]
  assert ["scan" in n for n in names].count(True) == 1 and any(n == ["cos"] for n in names)
  assert sum(len(j.eqns) for j in jaxprs) == len(list(walk.iter_equations(closed)))


def test_all_consts_own_first_then_nested_last_found_first():
  w1, w2, w3 = np.ones(3), np.full(3, 2.0), np.full(3, 3.0)

  def fn(x):
    y = jax.jit(lambda v: v * w1)(x)
    return jax.jit(lambda v: v * w2)(y) + jnp.asarray(w3)

  closed = _closed(fn, jnp.ones(3))
  found = walk.all_consts(closed)
  assert [float(np.asarray(c)[0]) for c in found] == [3.0, 2.0, 1.0]
  assert walk.all_consts(closed.jaxpr) == found[1:]  # an open jaxpr has no constants of its own


def test_interpret_inlines_chosen_calls_only():
  closed = _closed(lambda x: jax.jit(jnp.sin)(x) * 2.0, 0.5)
  seen = []

  def rule(eqn, operands):
    seen.append(eqn.primitive.name)
    if eqn.primitive.name == "jit":  # not inlined: evaluated whole
      return jax.core.eval_jaxpr(*walk.call_body(eqn), *operands)
    return [eqn.primitive.bind(*operands, **eqn.params)]

  out = walk.interpret(closed.jaxpr, closed.consts, [0.5], rule)
  assert seen == ["jit", "mul"] and np.allclose(out[0], 2 * np.sin(0.5))
  seen.clear()
  walk.interpret(closed.jaxpr, closed.consts, [0.5], rule, inline=lambda eqn: True)
  assert seen == ["sin", "mul"]

