r"""Counting the work an attack does: rows through the model, with and without a backward pass.

Wall-clock time depends on the machine and its load; the number of rows that went through the
model does not. :func:`count_evaluations` wraps a ``logits_fn`` so that every executed call adds
its rows to a host-side :class:`EvaluationCounter`:

* ``forward`` -- rows evaluated without a gradient (scoring, Square's queries, re-scoring);
* ``gradient`` -- rows evaluated with a backward pass (one row of ``jax.grad``/``jax.vjp``
  through the model counts once, forward and backward together).

The counts are taken when the compiled program *runs* (a ``jax.debug.callback``), so loop
iterations that early exit or compute skipping never execute are not counted, and a program run
twice counts twice. This is the model-evaluation counter of the benchmarks and of the tests that
check that a broken point stops costing model evaluations; it adds a host callback per call, so
time the unwrapped model.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from jaxrobust.metrics import count_evaluations
  >>> logits_fn, counter = count_evaluations(lambda x: x @ jnp.ones((3, 2)))
  >>> x = jnp.ones((4, 3))
  >>> _ = jax.jit(jax.grad(lambda x: logits_fn(x).sum()))(x)
  >>> _ = jax.jit(logits_fn)(x[:2])
  >>> jax.effects_barrier()
  >>> counter.forward, counter.gradient
  (2, 4)

References:
  Croce & Hein, *Reliable evaluation of adversarial robustness with an ensemble of diverse
  parameter-free attacks*, ICML 2020 (model queries as the cost of an evaluation).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

import jax
import numpy as np

Array = jax.Array


@dataclasses.dataclass
class EvaluationCounter:
  """Rows that went through the model: ``forward`` (no gradient) and ``gradient`` (with one)."""

  forward: int = 0
  gradient: int = 0
  _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False,
                                            compare=False)

  @property
  def total(self) -> int:
    """All rows, with or without a gradient."""
    return self.forward + self.gradient

  def reset(self) -> None:
    """Sets both counts to zero (call :func:`jax.effects_barrier` first)."""
    with self._lock:
      self.forward = self.gradient = 0

  def _add(self, kind: str, rows: np.ndarray) -> None:
    with self._lock:  # callbacks of different devices may run on different threads
      setattr(self, kind, getattr(self, kind) + int(np.size(rows)))


def count_evaluations(logits_fn: Callable[..., Array]
                      ) -> tuple[Callable[..., Array], EvaluationCounter]:
  """``(counted_logits_fn, counter)``: the same model, counting the rows of every executed call.

  Args:
    logits_fn: ``x [B, ...] (, *more) -> logits [B, C]``; extra arguments (e.g. the keys of a
      randomized model) are passed through without gradient.

  Returns:
    ``counted_logits_fn`` computes exactly what ``logits_fn`` computes (the same gradients);
    ``counter`` accumulates ``forward`` and ``gradient`` rows as the program runs. Under
    ``vmap`` every mapped row counts. Call :func:`jax.effects_barrier` before reading the counter.
  """
  counter = EvaluationCounter()

  def rows(x: Array) -> Array:
    # One value per row of x (batched along with x under vmap), so np.size is the row count.
    return x.reshape(x.shape[:1] + (-1,))[:, 0]

  # Rows of the logits, not of x: a count that depends only on x would be hoisted out of a
  # differentiated lax.map over a randomized model's draws and counted once instead of per draw.
  on = lambda kind: lambda _, logits: jax.debug.callback(lambda r: counter._add(kind, r),
                                                         rows(logits))
  return instrument(logits_fn, forward=on("forward"), gradient=on("gradient")), counter


def instrument(logits_fn: Callable[..., Array], *, forward: Callable[[Array, Array], None],
               gradient: Callable[[Array, Array], None],
               backward: Callable[[Array], None] | None = None) -> Callable[..., Array]:
  """``logits_fn`` with hooks that tell its calls apart: the one place that wraps a model in a
  ``jax.custom_vjp`` to see which calls are differentiated (:func:`count_evaluations` counts
  rows with it; :mod:`jaxrobust.engine.propagations` measures an attack's cost per example).

  ``forward(x, logits)`` runs (while tracing) in a call that is not differentiated,
  ``gradient(x, logits)`` in one whose backward pass is taken (its forward half),
  ``backward(cotangent)`` in each backward pass (a ``jax.vjp`` pullback applied ``K`` times, e.g.
  under ``vmap``, runs it for each). The values and gradients are exactly ``logits_fn``'s; extra
  arguments (the keys of a randomized model) get no gradient.

  A hook's operations that depend only on ``x`` may be hoisted out of a loop when JAX
  differentiates it (a ``lax.map`` over the draws of a randomized model, whose ``x`` is the same
  in every iteration): a hook that must run once per call depends on ``logits``.
  """

  @jax.custom_vjp
  def hooked(x, *more):
    logits = logits_fn(x, *more)
    forward(x, logits)
    return logits

  def forward_half(x, *more):
    logits, pullback = jax.vjp(lambda x: logits_fn(x, *more), x)
    gradient(x, logits)
    return logits, (pullback, more)

  def backward_half(residuals, cotangent):
    pullback, more = residuals
    if backward is not None:
      backward(cotangent)
    zeros = tuple(jax.tree.map(_zero_cotangent, m) for m in more)
    return pullback(cotangent) + zeros

  hooked.defvjp(forward_half, backward_half)
  return hooked


def _zero_cotangent(value):
  """The cotangent of a non-differentiated extra argument (float0 for keys and integers)."""
  dtype = getattr(value, "dtype", None)
  if dtype is not None and jax.numpy.issubdtype(dtype, jax.numpy.floating):
    return jax.numpy.zeros_like(value)
  return np.zeros(np.shape(value), jax.dtypes.float0)
