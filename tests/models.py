"""Tiny models with known answers, shared by the tests."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

DUAL = {"linf": 1, "l2": 2, "l1": np.inf}


class Linear(NamedTuple):
  """``logits = flatten(x) @ w + b``; the minimal adversarial distance is known in closed form."""

  w: np.ndarray  # [D, C] float64
  b: np.ndarray  # [C] float64

  def logits_fn(self, x: jax.Array) -> jax.Array:
    flat = x.reshape(x.shape[0], -1)
    return flat @ jnp.asarray(self.w, jnp.float32) + jnp.asarray(self.b, jnp.float32)[None, :]

  def weights(self) -> tuple[jax.Array, jax.Array]:
    """``(w, b)`` in float32, to pass to a jitted function as arguments (:func:`linear_logits`
    computes ``logits_fn`` from them)."""
    return jnp.asarray(self.w, jnp.float32), jnp.asarray(self.b, jnp.float32)

  def min_distance(self, x: np.ndarray, y: np.ndarray, norm: str) -> np.ndarray:
    """``min_{j != y} (z_y - z_j) / ||w_y - w_j||_q`` in float64 (q the dual norm), ignoring the box.

    Negative for misclassified points. A box can only make the true distance larger.
    """
    flat = np.asarray(x, np.float64).reshape(len(x), -1)
    z = flat @ self.w + self.b
    out = np.full(len(x), np.inf)
    for j in range(self.w.shape[1]):
      gap = z[np.arange(len(x)), y] - z[:, j]
      dw = self.w[:, y].T - self.w[:, j][None, :]
      scale = np.linalg.norm(dw, ord=DUAL[norm], axis=1)
      d = np.where(j == y, np.inf, gap / np.where(scale > 0, scale, 1e-300))
      out = np.minimum(out, d)
    return out


def linear_logits(weights, x: jax.Array) -> jax.Array:
  """:meth:`Linear.logits_fn` with the weights ``(w, b)`` (:meth:`Linear.weights`, traced under
  jit) an argument."""
  return Linear(*weights).logits_fn(x)


def random_linear(seed: int, dim: int, classes: int) -> Linear:
  rng = np.random.default_rng(seed)
  return Linear(rng.normal(size=(dim, classes)), rng.normal(size=classes) * 0.1)


def linear_points(model: Linear, seed: int, n: int, shape: tuple[int, ...], norm: str,
                  low: float = 0.3, high: float = 0.7):
  """Points inside ``[low, high]`` (far from the box) labelled by the model, with distances."""
  rng = np.random.default_rng(seed)
  x = rng.uniform(low, high, size=(n,) + shape).astype(np.float32)
  y = np.argmax(np.asarray(model.logits_fn(jnp.asarray(x))), axis=1).astype(np.int32)
  return x, y, model.min_distance(x, y, norm)


def mlp_params(seed: int, dim: int, hidden: int, classes: int) -> tuple[jax.Array, jax.Array]:
  """The weights ``(w1, w2)`` of :func:`mlp`, to pass to :func:`mlp_logits` as jit arguments."""
  rng = np.random.default_rng(seed)
  w1 = jnp.asarray(rng.normal(size=(dim, hidden)) * 2 / np.sqrt(dim), jnp.float32)
  w2 = jnp.asarray(rng.normal(size=(hidden, classes)) / np.sqrt(hidden), jnp.float32)
  return w1, w2


def mlp_logits(params, x: jax.Array) -> jax.Array:
  """:func:`mlp`'s model with its weights ``params = (w1, w2)`` as an argument."""
  w1, w2 = params
  h = jnp.tanh(x.reshape(x.shape[0], -1) @ w1 - 1.0)
  return h @ w2 * 4.0


def mlp(seed: int, dim: int, hidden: int, classes: int):
  """A small nonlinear ``logits_fn`` on inputs of any trailing shape with ``dim`` elements (its
  weights closed over; :func:`mlp_params` and :func:`mlp_logits` pass them as arguments)."""
  params = mlp_params(seed, dim, hidden, classes)
  return lambda x: mlp_logits(params, x)


def box_points(lower, upper, seed, count=256):
  """``[2 * count, *shape]``: uniform points of the box ``[lower, upper]``, then random vertices
  (where bounds of a piecewise-linear model are tightest)."""
  key_uniform, key_vertex = jax.random.split(jax.random.key(seed))
  uniform = jax.random.uniform(key_uniform, (count,) + lower.shape)
  vertex = jax.random.bernoulli(key_vertex, 0.5, (count,) + lower.shape).astype(jnp.float32)
  lower, width = lower[None], (upper - lower)[None]
  return jnp.concatenate([lower + uniform * width, lower + vertex * width])


def assert_explicit_sharding_matches_one_device(run, *args, sharded_args):
  """``run(*args, *batch_arrays)`` on 8 devices (Explicit mesh, batch-sharded) equals one device.

  ``sharded_args`` are the ``[B, ...]`` arrays to shard; ``args`` are passed unchanged. Skips when
  fewer than 8 devices exist (tests/conftest.py sets ``jax_num_cpu_devices=8``).
  """
  import pytest
  from jax.sharding import AxisType, NamedSharding
  from jax.sharding import PartitionSpec as P

  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets jax_num_cpu_devices=8)")
  single = run(*args, *sharded_args)
  mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Explicit,))
  with jax.set_mesh(mesh):
    put = lambda a: jax.device_put(jnp.asarray(a), NamedSharding(mesh, P("batch")))
    sharded = run(*args, *map(put, sharded_args))
    assert len(sharded.x_adv.sharding.device_set) == 8
  np.testing.assert_allclose(np.asarray(sharded.x_adv), np.asarray(single.x_adv), atol=1e-6)
  np.testing.assert_array_equal(np.asarray(sharded.success), np.asarray(single.success))


def frozen_scan(attack, logits_fn, x, y, budget, keys, target=None, params=None):
  """The dense scan, and the same scan freezing every row once ``attack.done`` says so (what the
  engine's early exit does: batch leaves keep their value, the step counter advances). Returns
  ``(done, finalize)`` after one step, after the dense scan and after the frozen scan.

  With ``params`` the model is ``logits_fn(params, x)``, and the weights, the data, the budget,
  the keys and the target are arguments of the jitted function (not constants); without, the
  model and the data are closed over, as before.
  """
  batch = x.shape[0]

  def freeze(old, new):
    done = attack.done(old)
    return jax.tree.map(
        lambda a, b: jnp.where(done.reshape((batch,) + (1,) * (a.ndim - 1)), a, b)
        if a.ndim and a.shape[0] == batch else b, old, new)

  def outcomes(params, x, y, budget, keys, target):
    model = logits_fn if params is None else functools.partial(logits_fn, params)
    step = lambda s: attack.step(model, s, x, y, budget, target)
    state = attack.init(model, x, y, budget, keys, target)
    dense = jax.lax.scan(lambda s, _: (step(s), None), state, None, length=attack.num_steps)[0]
    frozen = jax.lax.scan(lambda s, _: (freeze(s, step(s)), None), state, None,
                          length=attack.num_steps)[0]
    return [(attack.done(s), attack.finalize(model, s, x, y, budget, target))
            for s in (step(state), dense, frozen)]

  if params is None:
    return jax.jit(lambda: outcomes(None, x, y, budget, keys, target))()
  return jax.jit(outcomes)(params, x, y, budget, keys, target)


FROZEN_ATOL = 1e-5
"""How far a row that is never frozen may move between the dense and the frozen scan of
:func:`frozen_scan`. The two scans are different loop bodies (the frozen one selects between the
old and the new state), which XLA may fuse and contract (FMA) differently, so their arithmetic
can round differently in the last bit (measured: 1.2e-7, one ulp, for C&W under XLA:CPU's legacy
emitters); 1e-5 on inputs in [0, 1] is far below any change of the attack's path."""


def assert_unfrozen_rows_close(x_frozen, x_dense, done) -> None:
  """The rows of :func:`frozen_scan` that were never done agree between the two scans (to
  :data:`FROZEN_ATOL`)."""
  np.testing.assert_allclose(np.asarray(x_frozen)[~done], np.asarray(x_dense)[~done], rtol=0,
                             atol=FROZEN_ATOL)


def min_norm_early_exit_runs(attack, logits_fn, x, y, distance, params=None):
  """A minimum-norm attack run by ``jr.run`` at three per-example budgets, with and without
  early exit (chunks of 8 rows, so the rows left are re-compacted), counting gradient rows.

  Budgets: ``far`` (3 times each point's exact ``distance``: every point breaks early), ``inf``
  (the minimum-norm search: no row is ever done) and ``mixed`` (``inf``, 0.9, 1.5 and 3 times the
  distance in turn). Checks what holds for every such attack: the verdicts equal
  ``early_exit=False``'s, found norms lie inside finite budgets, every ``far`` point is broken,
  and the ``inf`` rows keep the dense run's norms (up to the rounding of the model on other
  chunks) and, unless the attack is ``done_unbounded`` (done at ``inf`` too), run every step.

  With ``params`` the model is ``logits_fn(params, x)``, and the weights, the data, eps and the
  key are arguments of the one jitted function (not constants); without, the model and the data
  are closed over, as before.

  Returns:
    ``(results, rows)``: ``{(budget, early_exit): AttackResult}`` and the gradient rows of each.
  """
  import jaxrobust as jr  # noqa: PLC0415 - tests/models.py stays importable without the library

  n = x.shape[0]
  if params is None:
    counted, counter = jr.metrics.count_evaluations(logits_fn)
    run = jax.jit(lambda eps, early_exit: jr.run(attack, counted, jnp.asarray(x), jnp.asarray(y),
                                                 jr.Budget(eps), jax.random.key(0),
                                                 early_exit=early_exit, chunk_size=8),
                  static_argnums=1)
  else:
    counted_with, counter = jr.metrics.count_evaluations(lambda v, p: logits_fn(p, v))
    jitted = jax.jit(lambda params, x, y, eps, key, early_exit: jr.run(
        attack, lambda v: counted_with(v, params), x, y, jr.Budget(eps), key,
        early_exit=early_exit, chunk_size=8), static_argnums=5)
    run = lambda eps, early_exit: jitted(params, jnp.asarray(x), jnp.asarray(y), eps,
                                         jax.random.key(0), early_exit)
  group = np.arange(n) % 4
  budgets = {"far": 3.0 * distance, "inf": np.full(n, np.inf),
             "mixed": np.select([group == 0, group == 1, group == 2], [np.inf, 0.9, 1.5],
                                3.0) * distance}
  results, rows = {}, {}
  for name, eps in budgets.items():
    for early_exit in (True, False):
      counter.reset()
      results[name, early_exit] = run(jnp.asarray(eps, jnp.float32), early_exit)
      jax.effects_barrier()
      rows[name, early_exit] = counter.gradient
  for name in budgets:
    early, dense = results[name, True], results[name, False]
    np.testing.assert_array_equal(np.asarray(early.success), np.asarray(dense.success), name)
    size = np.asarray(early.norm)
    found = np.isfinite(size)
    assert np.all(size[found] <= budgets[name].astype(np.float32)[found]), name
  assert np.asarray(results["far", True].success).all()
  for name, unbounded in (("inf", np.ones(n, bool)), ("mixed", group == 0)):
    # Equal up to float32 rounding: x_adv holds coordinates near x (|x| <= 1, spacing ~6e-8),
    # so a norm of 2e-3 is only known to a few 1e-8 whichever program computed it.
    np.testing.assert_allclose(np.asarray(results[name, True].norm)[unbounded],
                               np.asarray(results[name, False].norm)[unbounded], rtol=1e-5,
                               atol=1e-6)
  full = attack.num_steps * n  # a gradient per step and point
  assert rows["inf", False] >= full, rows
  if not attack.done_unbounded:  # no row is ever done at inf
    assert rows["inf", True] >= full, rows
  assert rows["far", False] >= full, rows
  return results, rows


def adversarial_inside(model: Linear, x, y, eps, norm, x_adv):
  """Per row: ``x_adv`` is adversarial for the linear ``model``, differs from ``x`` and lies in
  the ``norm`` ball of radius ``eps`` (relative slack 1e-6)."""
  import jaxrobust as jr  # noqa: PLC0415

  x_adv = np.asarray(x_adv)
  adversarial = np.argmax(np.asarray(model.logits_fn(jnp.asarray(x_adv))), axis=1) != y
  size = np.asarray(jr.projections.norm(jnp.asarray(x_adv - x), norm))
  return adversarial & np.any(x_adv != x, axis=1) & (size <= eps * (1 + 1e-6))
