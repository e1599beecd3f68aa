#!/usr/bin/env python
"""How often each minimum-norm attack, with its defaults, finds an adversarial point at eps = inf.

A minimum-norm attack run without a budget (``jr.Budget(jnp.inf)``) should return an adversarial
point for every clean-correct input that can be misclassified inside the box; a miss reads as
"robust at every eps". On the first ``--n`` digits test images (``benchmarks/reference/
digits_examples.npz``) of the four digits models of ``bench_peers.py`` (the frozen SmallCNN and
DigitsMLP weights, plain and PGD-AT), the script prints, per attack, norm and model, the points
found over the clean-correct ones and the median norm of those found. Each attack is jitted once
per architecture, with the weights, inputs, labels and key as arguments. Example::

  python benchmarks/bench_min_norm_found.py --n 100 --attacks cw fmn
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxrobust as jr  # noqa: E402
from bench_peers import ARCHS, load_frozen_params  # noqa: E402

ATTACKS = {
  "cw": [("l2", lambda: jr.attacks.carlini_wagner_l2())],
  "fmn": [(n, (lambda n=n: jr.attacks.fmn(n))) for n in ("linf", "l2", "l1")],
  "deepfool": [(n, (lambda n=n: jr.attacks.deepfool(n))) for n in ("l2", "linf")],
  "fab": [(n, (lambda n=n: jr.attacks.fab(n))) for n in ("linf", "l2", "l1")],
}


def load_examples(n: int) -> tuple[jax.Array, jax.Array]:
  with np.load(ROOT / "benchmarks" / "reference" / "digits_examples.npz") as data:
    x = data["x_levels"][:n].astype(np.float32) / np.float32(16.0)
    return jnp.asarray(x), jnp.asarray(data["y"][:n].astype(np.int32))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--n", type=int, default=100)
  parser.add_argument("--attacks", nargs="+", choices=tuple(ATTACKS), default=list(ATTACKS))
  parser.add_argument("--arch", nargs="+", choices=tuple(ARCHS), default=list(ARCHS))
  args = parser.parse_args(argv)
  x, y = load_examples(args.n)
  key = jax.random.key(0)
  print(f"{'attack':<10} {'norm':<5} {'model':<16} {'found/correct':>13} {'median':>8} "
        f"{'counted':>8} {'s':>6}")
  for name in args.attacks:
    for norm, make in ATTACKS[name]:
      attack = make()
      for arch in args.arch:
        apply_fn = ARCHS[arch]().apply
        run = jax.jit(lambda params, x, y, key, attack=attack, apply_fn=apply_fn: jr.run(
            attack, lambda v: apply_fn(params, v), x, y, jr.Budget(jnp.inf), key))
        for kind in ("plain", "adversarial"):
          params = load_frozen_params(kind, arch)
          correct = np.asarray(jnp.argmax(apply_fn(params, x), -1) == y)
          start = time.perf_counter()
          result = run(params, x, y, key)
          success = np.asarray(result.success)
          seconds = time.perf_counter() - start
          found = success & correct
          norms = np.asarray(result.norm)[found]
          counted = result.info["counts"].get("minimum_norm_not_found")
          counted = "-" if counted is None else str(int(counted))
          median = float(np.median(norms)) if norms.size else float("nan")
          print(f"{name:<10} {norm:<5} {arch + '-' + kind:<16} "
                f"{int(found.sum()):>6}/{int(correct.sum()):<6} {median:>8.4f} {counted:>8} "
                f"{seconds:>6.1f}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
