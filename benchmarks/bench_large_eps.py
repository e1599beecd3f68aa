#!/usr/bin/env python
"""``min_norm_search(apgd("l1"))`` with and without ``large_eps`` (AutoAttack's use_largereps).

For each zoo model of ``bench_optimality.py`` named on the command line, the first ``n`` digits of
``digits_examples.npz`` are attacked without a budget by ``min_norm_search`` of L1 APGD-CE (100
steps, one restart), once plain and once with ``large_eps=True`` (stages at 3, 2 and 1 times
eps). The model's own verdict on each returned point decides success; its L1 distance is
recomputed from ``x_adv``. Printed per model: seconds (compile included), points found among the
clean-correct ones, the median distance, and on how many points each variant is lower than the
other by more than 1e-4 relative.

Example::

  python benchmarks/bench_large_eps.py --models cnn-adversarial mlp-kwta --n 100
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxrobust as jr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_optimality as bo  # noqa: E402


def distances(model: str, n: int, large_eps: bool) -> tuple[np.ndarray, np.ndarray, float]:
  """``(L1 distance or inf, clean-correct mask, seconds)`` of one variant on ``model``."""
  apply_fn, params, _ = bo.zoo_model(model)
  x_all, y_all = bo.load_examples()
  x, y = np.asarray(x_all[:n]), np.asarray(y_all[:n])
  correct = np.asarray(jnp.argmax(apply_fn(params, jnp.asarray(x)), -1)) == y
  attack = jr.attacks.min_norm_search(jr.attacks.apgd("l1", large_eps=large_eps))
  run = jax.jit(lambda params, x, y, key: jr.run(attack, lambda v: apply_fn(params, v), x, y,
                                                 jr.Budget(jnp.inf), key))
  start = time.perf_counter()
  x_adv = jax.block_until_ready(run(params, jnp.asarray(x), jnp.asarray(y),
                                    jax.random.key(0)).x_adv)
  seconds = time.perf_counter() - start
  pred = np.asarray(jnp.argmax(apply_fn(params, x_adv), -1))
  size = np.abs(np.asarray(x_adv) - x).reshape(n, -1).sum(1)
  return np.where((pred != y) & correct, size, np.inf), correct, seconds


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", nargs="+", default=["cnn-adversarial"], choices=bo.MODELS)
  parser.add_argument("--n", type=int, default=100)
  args = parser.parse_args(argv)
  print("load average before:", open("/proc/loadavg").read().split()[0])
  for model in args.models:
    found = {}
    for large in (False, True):
      size, correct, seconds = distances(model, args.n, large)
      found[large] = size[correct]
      print(f"{model} large_eps={large}: {seconds:.0f} s (compile included); found "
            f"{np.isfinite(size[correct]).sum()}/{correct.sum()}; median L1 "
            f"{np.median(size[correct]):.4f}")
    plain, large = found[False], found[True]
    print(f"{model}: large_eps lower on {(large < plain * (1 - 1e-4)).sum()}, higher on "
          f"{(large > plain * (1 + 1e-4)).sum()}; median of the per-point minimum "
          f"{np.median(np.minimum(plain, large)):.4f}")
  print("load average after:", open("/proc/loadavg").read().split()[0])
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
