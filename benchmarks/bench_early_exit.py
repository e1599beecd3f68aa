#!/usr/bin/env python
"""Early exit and cross-eps skipping (the curve defaults) against the dense computation.

On the digits models of ``bench_peers.py`` (the frozen plain and adversarially trained
``SmallCNN``, and the ``DigitsMLP`` trained here in a few seconds), one robustness curve per
schedule, with the attack's defaults otherwise:

* ``dense`` -- ``early_exit=False``: every clean-correct point runs every step at every eps (what
  jaxrobust did before issue #16, and what a per-eps loop of a peer does);
* ``default`` -- ``jr.robustness_curve``'s defaults: early exit (broken rows are frozen, the rows
  left are re-compacted every few steps) and cross-eps skipping;
* ``unrolled`` -- ``eps_batch_size=0, unroll=True``: the former CPU fast path for convolutional
  models (no loop around the model, so no early exit); PGD only (unrolling AutoAttack is out of
  the question).

Printed per (model, attack, schedule): compile seconds, run milliseconds (best of ``--repeats``,
compiled program only), the model rows of one run counted by ``jr.metrics.count_evaluations`` in a
separate untimed run (``grad``: rows with a backward pass, ``fwd``: without), the robust counts per
eps, and whether the flags equal the dense curve's (they must, see
``jaxrobust.engine.early_exit``). The load average is printed before and after; compare only
quiet runs.

Example::

  python benchmarks/bench_early_exit.py --models mlp,cnn-plain,cnn-adversarial --attacks pgd
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
  parser.add_argument("--n", type=int, default=540)
  parser.add_argument("--models", default="mlp,cnn-plain,cnn-adversarial")
  parser.add_argument("--attacks", default="pgd,auto_attack")
  parser.add_argument("--pgd-eps", type=float, nargs="+",
                      default=[0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.3])
  parser.add_argument("--aa-eps", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.3])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--schedules", default="dense,default,unrolled")
  args = parser.parse_args()

  import jax
  import jax.numpy as jnp
  import numpy as np

  sys.path.insert(0, str(ROOT))
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import jaxrobust as jr
  from bench_peers import ARCHS, get_params, load_examples

  x_np, y_np = load_examples(args.n)
  x, y = jnp.asarray(x_np), jnp.asarray(y_np)
  attacks = {"pgd": (jr.attacks.pgd("linf", steps=20), np.asarray(args.pgd_eps, np.float32)),
             "auto_attack": (jr.attacks.auto_attack("linf"), np.asarray(args.aa_eps, np.float32))}
  schedules = {"dense": dict(early_exit=False), "default": {},
               "unrolled": dict(eps_batch_size=0, unroll=True)}
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, n={args.n}, "
        f"load average {os.getloadavg()[0]:.2f}", flush=True)
  for model_name in args.models.split(","):
    arch, _, kind = model_name.partition("-")
    params = get_params(arch, kind or "plain", "frozen", False)
    apply = ARCHS[arch]().apply
    logits_fn = lambda x, params=params, apply=apply: apply(params, x)
    for attack_name in args.attacks.split(","):
      attack, eps = attacks[attack_name]
      dense_flags = None
      for schedule in args.schedules.split(","):
        if schedule == "unrolled" and attack_name != "pgd":
          continue
        options = schedules[schedule]

        def curve(model, eps, options=options, attack=attack):
          return jr.robustness_curve(attack, model, x, y, eps, jax.random.key(0), **options)

        start = time.perf_counter()
        compiled = jax.jit(lambda eps: curve(logits_fn, eps)).lower(eps).compile()
        compile_s = time.perf_counter() - start
        times = []
        for _ in range(args.repeats):
          start = time.perf_counter()
          result = jax.block_until_ready(compiled(eps))
          times.append(time.perf_counter() - start)
        counted, counter = jr.metrics.count_evaluations(logits_fn)
        jax.block_until_ready(jax.jit(lambda eps: curve(counted, eps))(eps))
        jax.effects_barrier()
        flags = np.asarray(result.robust)
        if schedule == "dense":
          dense_flags = flags
        same = "-" if dense_flags is None else str(bool(np.array_equal(flags, dense_flags)))
        print(f"{model_name:16s} {attack_name:11s} {schedule:8s} compile {compile_s:6.1f} s  "
              f"run {min(times) * 1e3:9.1f} ms  rows grad {counter.gradient:9d} "
              f"fwd {counter.forward:9d}"
              f"  robust {flags.sum(1).tolist()}  equal to dense: {same}  "
              f"load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
  main()
