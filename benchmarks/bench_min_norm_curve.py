#!/usr/bin/env python
"""A minimum-norm robustness curve costs one attack run, whatever the size of the eps grid.

On the demo's digits SmallCNN (identical weights everywhere), prints the wall time of

* ``jr.robustness_curve`` with a minimum-norm attack (runs once; every eps follows from eps*)
  for grids of 8 and 32 eps;
* ``jr.robustness_curve`` with fixed-budget Linf PGD for the same grids (one attack run per eps);
* Foolbox 3's multi-eps call (``LinfPGD(...)(model, x, y, epsilons=[...])``) when installed;

as ratios to the minimum-norm curve on 8 eps, plus the robust accuracies and the disagreement
counts of :func:`jaxrobust.curve_consistency` (minimum-norm vs PGD, per example).

Usage:
  python benchmarks/bench_min_norm_curve.py [--n 256] [--model plain|adversarial] [--steps 100]
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrobust as jr  # noqa: E402
from jaxrobust.demo.model import SmallCNN  # noqa: E402
from bench_peers import load_examples, load_params, nchw, torch_port  # noqa: E402


def timed(fn, *args, repeats=3):
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return out, statistics.median(times), first


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", type=int, default=256)
  parser.add_argument("--model", choices=["plain", "adversarial"], default="plain")
  parser.add_argument("--min-norm-steps", type=int, default=100)
  parser.add_argument("--pgd-steps", type=int, default=20)
  parser.add_argument("--eps-max", type=float, default=0.3)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()

  params = load_params(args.model)
  x, y = load_examples(args.n)
  model = SmallCNN()
  logits_fn = functools.partial(model.apply, params)
  min_norm = (jr.attacks.fmn("linf", steps=args.min_norm_steps) if hasattr(jr.attacks, "fmn")
              else jr.attacks.deepfool("linf", steps=args.min_norm_steps))
  pgd = jr.attacks.pgd("linf", steps=args.pgd_steps)
  print(f"digits SmallCNN ({args.model}), n={args.n}, backend={jax.default_backend()}, "
        f"2-core CPU; ratios to the minimum-norm curve on 8 eps")

  def curve_fn(attack):
    return jax.jit(lambda x, y, eps: jr.robustness_curve(attack, logits_fn, x, y, eps,
                                                         jax.random.key(0), unroll=True,
                                                         eps_batch_size=0))

  rows = []
  curves = {}
  for label, attack in (("min-norm " + min_norm.name, min_norm), ("pgd " + pgd.name, pgd)):
    fn = curve_fn(attack)
    for k in (8, 32):
      eps = jnp.linspace(0.0, args.eps_max, k, dtype=jnp.float32)
      curve, seconds, first = timed(fn, jnp.asarray(x), jnp.asarray(y), eps,
                                    repeats=args.repeats)
      rows.append((f"{label} [{k} eps]", seconds, first))
      curves[(label.split()[0], k)] = curve

  try:
    import foolbox as fb
    import torch

    torch.set_num_threads(2)
    tmodel = torch_port(params)
    fmodel = fb.PyTorchModel(tmodel, bounds=(0.0, 1.0))
    tx, ty = torch.from_numpy(nchw(x)), torch.from_numpy(np.asarray(y, np.int64))
    for k in (8, 32):
      eps = np.linspace(0.0, args.eps_max, k).astype(np.float32)
      # Foolbox's LinfPGD takes a relative step (fraction of eps), like jaxrobust.
      attack = fb.attacks.LinfPGD(rel_stepsize=2.5 / args.pgd_steps, steps=args.pgd_steps,
                                  random_start=True)
      start = time.perf_counter()
      attack(fmodel, tx, ty, epsilons=[float(e) for e in eps])
      rows.append((f"foolbox LinfPGD multi-eps [{k} eps]", time.perf_counter() - start, None))
  except ImportError:
    print("foolbox/torch not installed: skipped (pip install 'jaxrobust[peers]')")

  reference = rows[0][1]
  print(f"{'curve':<52} {'ratio':>8} {'first call (compile) s':>24}")
  for label, seconds, first in rows:
    first_text = "" if first is None else f"{first:.1f}"
    print(f"{label:<52} {seconds / reference:>8.2f} {first_text:>24}")

  for k in (8, 32):
    mn, pg = curves[("min-norm", k)], curves[("pgd", k)]
    print(f"\n[{k} eps] robust accuracy  min-norm: "
          f"{np.round(np.asarray(mn.robust_accuracy), 3).tolist()}")
    print(f"[{k} eps] robust accuracy  pgd     : "
          f"{np.round(np.asarray(pg.robust_accuracy), 3).tolist()}")
  # Per-example disagreement on the 8-eps grid.
  result = jax.jit(lambda x, y: jr.run(min_norm, logits_fn, x, y, jr.Budget(jnp.inf),
                                       jax.random.key(0)))(jnp.asarray(x), jnp.asarray(y))
  correct = jr.predict(logits_fn(jnp.asarray(x))) == jnp.asarray(y)
  check = jr.curve_consistency(result.norm, correct, curves[("pgd", 8)])
  print(f"\nconsistency on 8 eps: PGD broke but eps* larger (min-norm weaker): "
        f"{np.asarray(check.norm_attack_weaker).tolist()}; eps* within eps but PGD failed "
        f"(PGD weaker): {np.asarray(check.budget_attack_weaker).tolist()}")


if __name__ == "__main__":
  main()
