#!/usr/bin/env python
r"""What a report's Clopper-Pearson intervals cost a fresh process: the host table against the
float32 JAX path it replaced.

Every :class:`jaxrobust.Report` (``jr.evaluate``, ``Report.load``, ``jaxrobust compare``, the
plots, the demos) computes its intervals with
:func:`jaxrobust.metrics.binomial_interval_table`. Until 2026-11-29 that table ran
:func:`jaxrobust.metrics.binomial_interval` eagerly on the host counts (float32, a bisection whose
loops XLA compiled as about fifty small programs, once per table size and process); it now calls
SciPy's inverse incomplete beta functions in float64. Each measurement here runs in a fresh
Python process (what a user's command pays), on ``--size`` counts out of ``--trials``:

* ``table``: ``binomial_interval_table(k, n)``, the first call and the second (new counts, same
  size);
* ``jax eager``: ``binomial_interval(k, n)`` on the same NumPy counts, the computation the table
  ran before (without its padding to a power of two), first call and second.

Printed per size: seconds, XLA compilations in the call (``jax.log_compiles`` records), and the
largest difference between the two paths' bounds, with the load average.

Usage::

  python benchmarks/bench_host_intervals.py [--sizes 4 40 400] [--trials 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import json, logging, sys, time
import numpy as np
import jax
from jaxrobust import metrics

size, trials, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
compiles = []
handler = logging.Handler()
handler.emit = lambda record: compiles.append(record.getMessage().startswith("Compiling"))
logging.getLogger("jax").addHandler(handler)
logging.getLogger("jax").setLevel(logging.DEBUG)
rng = np.random.default_rng(0)
out = {}
for call in ("first", "second"):
  k = rng.integers(0, trials + 1, size=size)
  if path == "table":
    run = lambda: metrics.binomial_interval_table(k, trials)
  else:
    run = lambda: np.stack([np.asarray(b, np.float64)
                            for b in metrics.binomial_interval(k, trials)], -1)
  del compiles[:]
  with jax.log_compiles():
    start = time.perf_counter()
    bounds = run()
    seconds = time.perf_counter() - start
  out[call] = {"seconds": seconds, "compilations": sum(compiles)}
out["bounds"] = bounds.tolist()
print(json.dumps(out))
"""


def measure(path: str, size: int, trials: int) -> dict:
  done = subprocess.run([sys.executable, "-c", _CHILD, str(size), str(trials), path],
                        check=True, capture_output=True, text=True)
  return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--sizes", type=int, nargs="+", default=[4, 40, 400])
  parser.add_argument("--trials", type=int, default=10_000)
  args = parser.parse_args()
  print(f"load average {os.getloadavg()[0]:.2f}; {args.trials} trials per count")
  print("| counts | table: first s (compilations) | table: second s | jax eager: first s "
        "(compilations) | jax eager: second s | largest difference |")
  print("|---|---|---|---|---|---|")
  for size in args.sizes:
    table, eager = measure("table", size, args.trials), measure("jax", size, args.trials)
    difference = max(abs(a - b) for row_a, row_b in zip(table["bounds"], eager["bounds"])
                     for a, b in zip(row_a, row_b))
    print(f"| {size} | {table['first']['seconds']:.3f} ({table['first']['compilations']}) | "
          f"{table['second']['seconds']:.4f} | {eager['first']['seconds']:.3f} "
          f"({eager['first']['compilations']}) | {eager['second']['seconds']:.4f} | "
          f"{difference:.1e} |")
  print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
