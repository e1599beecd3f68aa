#!/usr/bin/env python
"""Cross-eps skipping in ``jr.evaluate``: model evaluations and time on an AutoAttack curve.

Evaluates ``jr.attacks.auto_attack("linf")`` (standard suite, its defaults) on the demo's plain
digits ``SmallCNN`` (cached by ``jaxrobust.demo.train``) over an eps grid, twice:

* **eps by eps** -- one ``jr.evaluate`` call per eps, each with ``chunk_size`` (so the suite's
  members still skip what an earlier member broke, as ``jr.evaluate`` did before the curve
  kernel: every eps attacks every clean-correct point);
* **one call over the grid** -- ``jr.evaluate(..., chunk_size=c)``: the eps run in increasing
  order and each attacks only the points not broken at a smaller eps.

The model counts the rows of every forward pass it runs (``jax.debug.callback``; a gradient step
is one forward plus one backward, so forward rows count model evaluations). The eps-by-eps count
is reported without its repeated clean passes (one forward per example per call), i.e. what one
call without cross-eps skipping would cost. The worst-case robust counts must agree (the suite
gets the same per-example keys only at the first eps, so later eps may differ by a few points of
seed noise; both are printed). Times are best of one run each, after a compiling run; quote the
load average (printed).

Example::

  python benchmarks/bench_skipping.py --n 128 --eps 0.05 0.1 0.15 0.2
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--n", type=int, default=128)
  parser.add_argument("--eps", type=float, nargs="+", default=[0.05, 0.1, 0.15, 0.2])
  parser.add_argument("--batch-size", type=int, default=128)
  parser.add_argument("--chunk-size", type=int, default=16)
  args = parser.parse_args()

  import jax
  import jax.numpy as jnp
  import numpy as np

  sys.path.insert(0, str(ROOT))
  import jaxrobust as jr
  from jaxrobust.demo.data import load_digits
  from jaxrobust.demo.model import SmallCNN
  from jaxrobust.demo.train import train

  params = train(False, progress=False)
  model = SmallCNN()
  rows = []

  def counted(x):
    jax.debug.callback(lambda n: rows.append(int(n)), jnp.asarray(x.shape[0]))
    return model.apply(params, x)

  _, _, x_test, y_test = load_digits()
  x, y = np.asarray(x_test[:args.n], np.float32), np.asarray(y_test[:args.n], np.int32)
  attack = {"aa": jr.attacks.auto_attack("linf")}
  eps = np.asarray(args.eps, np.float32)

  def evaluate(grid):
    rows.clear()
    start = time.perf_counter()
    report = jr.evaluate(counted, (x, y), attacks=attack, epsilons=grid, key=jax.random.key(0),
                         batch_size=args.batch_size, chunk_size=args.chunk_size, progress=False)
    return report, sum(rows), time.perf_counter() - start

  evaluate(eps)  # compile
  grid, grid_rows, grid_s = evaluate(eps)
  for e in eps:  # compile each single-eps program
    evaluate(eps[:1] * 0 + e)
  singles = [evaluate(eps[:1] * 0 + e) for e in eps]
  padded = -(-args.n // args.batch_size) * args.batch_size
  single_rows = sum(r for _, r, _ in singles) - (len(eps) - 1) * padded
  single_s = sum(s for _, _, s in singles)
  print(f"load average (1 min): {os.getloadavg()[0]:.2f}; n={args.n}, eps={eps.tolist()}, "
        f"chunk_size={args.chunk_size}")
  print(f"{'':<26}{'forward rows':>14}{'seconds':>10}  worst-case robust counts")
  print(f"{'eps by eps (no skipping)':<26}{single_rows:>14}{single_s:>10.1f}  "
        f"{[int(r.worst_case.robust_count[0]) for r, _, _ in singles]}")
  print(f"{'one call, skipping':<26}{grid_rows:>14}{grid_s:>10.1f}  "
        f"{grid.worst_case.robust_count.tolist()}")
  print(f"ratio (skipping / eps by eps): rows {grid_rows / single_rows:.3f}, "
        f"time {grid_s / single_s:.3f}")


if __name__ == "__main__":
  main()
