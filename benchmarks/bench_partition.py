#!/usr/bin/env python
r"""What moving the rows still to attack to the front of the batch costs, per compaction.

Every segment of early exit, and every compaction (``jr.run``'s scoring of attacked rows, the
curve's cross-eps skipping, ensemble members), partitions the batch: the active rows first, in
order, then the others, and afterwards puts the outputs back (:mod:`jaxrobust.engine.compaction`).
Two ways to get the permutation and its inverse are timed here, inside a compiled ``fori_loop`` of
``--iterations`` partitions (so the figure is the per-partition cost inside a program, not a
dispatch):

* ``argsort``: a stable ``argsort(~active)`` and a second ``argsort`` for the inverse (the engine
  did this until 2026-11-28);
* ``prefix sum``: :func:`jaxrobust.engine.compaction.active_first`, one cumulative sum and one
  scatter (what the engine does now).

Both are checked equal before timing. Printed: microseconds per partition, best of ``--repeats``,
per batch size, on the default backend, with the load average.

Usage::

  python benchmarks/bench_partition.py [--batch 64 540 4096] [--iterations 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust.engine import compaction


def argsort_partition(active: jax.Array) -> tuple[jax.Array, jax.Array]:
  order = jnp.argsort(~active, stable=True).astype(jnp.int32)
  return order, jnp.argsort(order).astype(jnp.int32)


def looped(partition, iterations: int):
  """``iterations`` partitions of masks that change every iteration (so none is hoisted)."""

  def run(active):
    def body(i, acc):
      order, position = partition(active ^ (acc[0] > i))  # data-dependent: never loop-invariant
      return acc + order[:1] + position[:1]

    return jax.lax.fori_loop(0, iterations, body, jnp.zeros((1,), jnp.int32))

  return run


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch", type=int, nargs="+", default=[64, 540, 4096])
  parser.add_argument("--iterations", type=int, default=1000)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}, "
        f"1-min load {os.getloadavg()[0]:.2f}")
  print("| batch | argsort µs | prefix sum µs | ratio |\n|---|---|---|---|")
  rng = np.random.default_rng(0)
  for batch in args.batch:
    active = jnp.asarray(rng.random(batch) < 0.5)
    for got, want in zip(jax.jit(compaction.active_first)(active),
                         jax.jit(argsort_partition)(active)):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    micros = []
    for partition in (argsort_partition, compaction.active_first):
      compiled = jax.jit(looped(partition, args.iterations)).lower(active).compile()
      jax.block_until_ready(compiled(active))
      best = float("inf")
      for _ in range(args.repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(active))
        best = min(best, time.perf_counter() - start)
      micros.append(best / args.iterations * 1e6)
    print(f"| {batch} | {micros[0]:.1f} | {micros[1]:.1f} | {micros[1] / micros[0]:.3f} |",
          flush=True)
  print(f"1-min load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
