"""PGD-K wall time divided by K jitted input-gradient evaluations (goal: <= 1.10).

The ratio says how much jaxrobust's attack machinery (projections, best-point bookkeeping,
restart logic, the clean and re-scoring forward passes) costs on top of the gradients PGD cannot
avoid. Both sides run the same NHWC SmallCNN on the same batch, jitted once, timed after warm-up.

The third column wraps the whole ``jr.run`` in ``canonical_convolutions`` (from
``bench_loop_conv.py``): XLA:CPU runs convolution gradients inside a loop body on a slow path
unless their dimension numbers are canonical, which that rewrite ensures (see bench_loop_conv.py).

Usage:
  python benchmarks/bench_pgd_overhead.py [--batch 512] [--steps 10 20 50] [--repeats 5]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))

import jaxrobust as jr  # noqa: E402
from bench_loop_conv import canonical_convolutions  # noqa: E402
from jaxrobust.demo.model import SmallCNN  # noqa: E402


def median_time(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))  # compile and warm up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=512)
  parser.add_argument("--steps", type=int, nargs="+", default=[10, 20, 50])
  parser.add_argument("--norms", nargs="+", default=["linf", "l2", "l1"])
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()

  model = SmallCNN()
  params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.uniform(0, 1, (args.batch, 8, 8, 1)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 10, args.batch), jnp.int32)
  logits_fn = functools.partial(model.apply, params)
  eps = {"linf": 0.1, "l2": 1.0, "l1": 4.0}

  grad = jax.jit(jax.grad(lambda x: jnp.sum(jr.losses.cross_entropy(logits_fn(x), y))))
  t_grad = median_time(grad, x, repeats=args.repeats * 4)
  print(f"backend={jax.default_backend()} devices={len(jax.devices())} batch={args.batch} "
        f"(ratios only; this machine: 2 cores, CPU)")
  print(f"{'norm':>5} {'K':>4} {'scan loop':>10} {'unrolled':>10} {'canonical':>10}   "
        "(PGD-K / (K x grad); canonical: scan loop, canonical_convolutions)")
  for norm in args.norms:
    for k in args.steps:
      attack = jr.attacks.pgd(norm, steps=k)
      ratios = []
      for unroll, canonical in ((1, False), (True, False), (1, True)):
        def pgd(x, y, e, unroll=unroll):
          # No early exit: every row runs all K steps, so the ratio is the machinery's overhead.
          return jr.run(attack, logits_fn, x, y, jr.Budget(e), jax.random.key(0), unroll=unroll,
                        early_exit=False)
        run = jax.jit(canonical_convolutions(pgd) if canonical else pgd)
        t_pgd = median_time(run, x, y, jnp.float32(eps[norm]), repeats=args.repeats)
        ratios.append(t_pgd / (k * t_grad))
      print(f"{norm:>5} {k:>4} {ratios[0]:>10.3f} {ratios[1]:>10.3f} {ratios[2]:>10.3f}")


if __name__ == "__main__":
  main()
