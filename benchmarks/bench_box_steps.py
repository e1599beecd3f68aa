#!/usr/bin/env python
"""FGM and PGD in L2 and L1 where the box binds: linear ground truth and the digits models.

Two measurements of the library that is importable (run it once at the commit to judge and once
with ``PYTHONPATH`` pointing at a worktree of the commit before, to compare):

1. Box-binding ground truth (``tests/ground_truth_box.py``): two-class linear models, half the
   coordinates of each point on a face of [0, 1], the box raising the exact minimal distance d*
   by 5% or more. Successes of FGM and PGD (10 and 20 steps) at 1.02 d* and 1.05 d*.
2. Robust accuracy on the frozen digits models of ``benchmarks/bench_peers.py`` (540 test
   images, weights as arguments of the jitted function): FGM (one run) and PGD at 10 and 20 steps
   (mean and spread over ``--seeds`` random starts), L2 and L1, at one eps per model and norm.

Usage::

  python benchmarks/bench_box_steps.py [--seeds 3] [--points 64]
  PYTHONPATH=/tmp/base python benchmarks/bench_box_steps.py   # the library at another commit
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.append(str(ROOT))  # after PYTHONPATH: another commit's library can be measured

import jaxrobust as jr  # noqa: E402
from bench_peers import ARCHS, get_params, load_examples  # noqa: E402
from tests.ground_truth_box import box_problem  # noqa: E402
from tests.models import linear_logits  # noqa: E402

# (arch, frozen weights, norm, eps): eps where the adversarially trained models keep a robust
# accuracy between 0.05 and 0.7, so both directions of a change show.
CELLS = [("cnn", "adversarial", "l2", 1.0), ("cnn", "plain", "l2", 0.5),
         ("mlp", "adversarial", "l2", 1.0), ("mlp", "plain", "l2", 0.5),
         ("cnn", "adversarial", "l1", 1.5), ("cnn", "plain", "l1", 1.0),
         ("mlp", "adversarial", "l1", 1.5), ("mlp", "plain", "l1", 1.0)]


def attacks(norm: str) -> list[tuple[str, jr.Attack, bool]]:
  """``(label, attack, random)``: FGM and PGD at 10 and 20 steps, with their defaults."""
  return [("fgm", jr.attacks.fgsm(norm), False), ("pgd10", jr.attacks.pgd(norm, steps=10), True),
          ("pgd20", jr.attacks.pgd(norm, steps=20), True)]


def ground_truth(points: int) -> None:
  print("| norm | attack | successes at 1.02 d* | at 1.05 d* | at 0.98 d* (must be 0) |")
  print("|---|---|---|---|---|")
  for norm in ("l2", "l1"):
    p = box_problem(norm=norm, n=points, seed=0)
    for label, attack, _ in attacks(norm):
      run = jax.jit(lambda w, x, y, eps, key, attack=attack: jr.run(
          attack, functools.partial(linear_logits, w), x, y, jr.Budget(eps), key).success)
      hits = [int(np.sum(run(p.model.weights(), jnp.asarray(p.x), jnp.asarray(p.y),
                             jnp.asarray(s * p.distance, jnp.float32), jax.random.key(0))))
              for s in (1.02, 1.05, 0.98)]
      print(f"| {norm} | {label} | {hits[0]}/{points} | {hits[1]}/{points} | {hits[2]} |")


def digits(seeds: int) -> None:
  x, y = load_examples(None)
  print("| model | norm, eps | FGM | PGD-10 | PGD-20 |")
  print("|---|---|---|---|---|")
  for arch, kind, norm, eps in CELLS:
    params = get_params(arch, kind, "frozen", False)
    model = ARCHS[arch]()
    clean = np.argmax(np.asarray(jax.jit(model.apply)(params, jnp.asarray(x))), 1) == y
    cells = []
    for _, attack, random in attacks(norm):
      run = jax.jit(lambda params, x, y, eps, key, attack=attack: jr.run(
          attack, functools.partial(model.apply, params), x, y, jr.Budget(eps), key).success)
      accuracy = [np.mean(clean & ~np.asarray(run(params, jnp.asarray(x), jnp.asarray(y),
                                                  jnp.float32(eps), jax.random.key(seed))))
                  for seed in range(seeds if random else 1)]
      cells.append(f"{np.mean(accuracy):.4f}" + (f" ± {np.std(accuracy):.4f}" if random else ""))
    print(f"| {arch} {kind} | {norm}, {eps} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=3, help="PGD random starts (default 3)")
  parser.add_argument("--points", type=int, default=64, help="ground-truth points (default 64)")
  args = parser.parse_args()
  print(f"jaxrobust from {pathlib.Path(jr.__file__).parent}; jax {jax.__version__}; "
        f"load {os.getloadavg()[0]:.1f}")
  ground_truth(args.points)
  digits(args.seeds)


if __name__ == "__main__":
  main()
