#!/usr/bin/env python
"""What counting ``min_norm_search``'s propagations costs: trace, compile and run time.

``min_norm_search`` counts the propagations of its search steps itself (issue #27): its inner
runs are metered (a step counter per row in the inner loop's carry) and it measures its inner
attack's cost while tracing (three more traces of the inner attack's phases in ``init`` and in
``step``). This times ``jr.run(min_norm_search(pgd("linf", steps=10), search_steps=10))`` at
``eps = inf`` on a random tanh MLP (3072-256-10, batch 64), as one jitted program whose weights
and data are its arguments: trace + lower, compile, and a run (medians over ``--repeats``). Run it
on two checkouts (``PYTHONPATH``) in the same hour to compare.

Usage:
  python benchmarks/bench_min_norm_search_counting.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import jaxrobust as jr


def mlp(params, x):
  hidden = jnp.tanh(x.reshape(x.shape[0], -1) @ params[0])
  return hidden @ params[1]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
  params = (jax.random.normal(k1, (3072, 256)) * 0.02, jax.random.normal(k2, (256, 10)) * 0.1)
  x = jax.random.uniform(k3, (64, 32, 32, 3))
  y = jnp.argmax(mlp(params, x), -1)
  keys = jax.random.split(k4, 64)
  attack = jr.attacks.min_norm_search(jr.attacks.pgd("linf", steps=10), search_steps=10)
  run = lambda p, x, y, keys, eps: jr.run(attack, lambda v: mlp(p, v), x, y, jr.Budget(eps),
                                          keys)
  inputs = (params, x, y, keys, jnp.float32(jnp.inf))
  lower, compile_, execute = [], [], []
  for _ in range(args.repeats):
    jax.clear_caches()
    t0 = time.perf_counter()
    lowered = jax.jit(run).lower(*inputs)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    jax.block_until_ready(compiled(*inputs))
    t3 = time.perf_counter()
    lower.append(t1 - t0)
    compile_.append(t2 - t1)
    execute.append(t3 - t2)
  result = compiled(*inputs)
  counted = "propagations" in result.info
  print(f"trace+lower {statistics.median(lower):.2f} s, compile {statistics.median(compile_):.2f}"
        f" s, run {statistics.median(execute):.3f} s (medians of {args.repeats}); counts "
        f"reported: {counted}")


if __name__ == "__main__":
  main()
