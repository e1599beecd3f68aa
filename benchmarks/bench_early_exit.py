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
  the question);
* ``whole`` -- early exit with one chunk of the whole batch (``chunk_size`` = the batch): broken
  rows are frozen and the loop ends when none is left, but no row is moved (no compaction);
  ``whole-u4`` the same with ``unroll=4`` (four steps per iteration of the loop, so a quarter of
  its done checks);
* ``dense-eps0`` -- ``early_exit=False, eps_batch_size=0``: the dense run with every eps
  vectorised into one loop.

Printed per (model, attack, schedule): compile seconds, run milliseconds (best of ``--repeats``,
compiled program only), the model rows of one run counted by ``jr.metrics.count_evaluations`` in a
separate untimed run (``grad``: rows with a backward pass, ``fwd``: without), the robust counts per
eps, and whether the flags equal the dense curve's (they must, see
``jaxrobust.engine.early_exit``). The load average is printed before and after; compare only
quiet runs. The weights and the data are arguments of every compiled program.

``--regime full`` puts ``bench_scale.py``'s full-cost head on each model (logits
``1e-3 * model(x) + 10 * onehot(0)``, every label 0): nothing can break, every point runs every
step at every eps, and ``default`` against ``dense`` is early exit's pure overhead, its worst
case (issue #26: never more than 5% over the dense run).

Example::

  python benchmarks/bench_early_exit.py --models mlp,cnn-plain,cnn-adversarial --attacks pgd
  python benchmarks/bench_early_exit.py --models mlp,cnn-plain --attacks pgd \
      --schedules dense,default --regime full --repeats 5
"""

from __future__ import annotations

import argparse
import functools
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
  parser.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                      help="then time the compiled schedules of each (model, attack) in turn for "
                           "ROUNDS rounds (the first two dropped): min and median ms and their "
                           "ratios to dense, less exposed to a machine's drift than best-of runs")
  parser.add_argument("--tile", type=int, default=1,
                      help="repeat the --n examples this many times (a larger batch of the same "
                           "points, each with its own key)")
  parser.add_argument("--schedules", default="dense,default,unrolled")
  parser.add_argument("--regime", choices=("trained", "full"), default="trained",
                      help="full: logits 1e-3 * model(x) + 10 * onehot(0), every label 0, so "
                      "nothing breaks and every point runs every step (early exit's worst case)")
  args = parser.parse_args()

  import jax
  import jax.numpy as jnp
  import numpy as np

  sys.path.insert(0, str(ROOT))
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import jaxrobust as jr
  from bench_peers import ARCHS, get_params, load_examples

  x_np, y_np = load_examples(args.n)
  x, y = jnp.asarray(np.tile(x_np, (args.tile, 1, 1, 1))), jnp.asarray(np.tile(y_np, args.tile))
  rows = x.shape[0]
  attacks = {"pgd": (jr.attacks.pgd("linf", steps=20), np.asarray(args.pgd_eps, np.float32)),
             "auto_attack": (jr.attacks.auto_attack("linf"), np.asarray(args.aa_eps, np.float32))}
  schedules = {"dense": dict(early_exit=False), "default": {},
               "unrolled": dict(eps_batch_size=0, unroll=True), "whole": dict(chunk_size=rows),
               "whole-u4": dict(chunk_size=rows, unroll=4),
               "dense-eps0": dict(early_exit=False, eps_batch_size=0)}
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, n={args.n} x {args.tile}, "
        f"load average {os.getloadavg()[0]:.2f}", flush=True)
  for model_name in args.models.split(","):
    arch, _, kind = model_name.partition("-")
    params = get_params(arch, kind or "plain", "frozen", False)
    apply = ARCHS[arch]().apply
    if args.regime == "full":
      # Nothing can break: the trunk's logits would have to move by 10^4 (bench_scale.py's head).
      head = lambda z: 1e-3 * z + 10.0 * jax.nn.one_hot(0, z.shape[-1], dtype=z.dtype)
      model_fn = lambda params, v, apply=apply: head(apply(params, v))
      labels = jnp.zeros_like(y)
    else:
      model_fn, labels = apply, y
    for attack_name in args.attacks.split(","):
      attack, eps = attacks[attack_name]
      dense_flags = None
      programs = {}
      for schedule in args.schedules.split(","):
        if schedule in ("unrolled", "dense-eps0") and attack_name != "pgd":
          continue
        options = schedules[schedule]

        # The weights and the data are arguments of every program, never constants.
        def curve(params, x, y, eps, count=False, options=options, attack=attack,
                  model_fn=model_fn):
          logits_fn = functools.partial(model_fn, params)
          if count:
            logits_fn, counter = jr.metrics.count_evaluations(logits_fn)
            counters.append(counter)
          return jr.robustness_curve(attack, logits_fn, x, y, eps, jax.random.key(0), **options)

        counters = []
        operands = (params, x, labels, jnp.asarray(eps))
        start = time.perf_counter()
        compiled = jax.jit(curve).lower(*operands).compile()
        compile_s = time.perf_counter() - start
        programs[schedule] = compiled
        times = []
        for _ in range(args.repeats):
          start = time.perf_counter()
          result = jax.block_until_ready(compiled(*operands))
          times.append(time.perf_counter() - start)
        jax.block_until_ready(jax.jit(functools.partial(curve, count=True))(*operands))
        jax.effects_barrier()
        counter = counters[-1]
        flags = np.asarray(result.robust)
        if args.regime == "full" and not flags.all():
          raise AssertionError("a point broke in the full-cost regime")
        if schedule == "dense":
          dense_flags = flags
        same = "-" if dense_flags is None else str(bool(np.array_equal(flags, dense_flags)))
        print(f"{model_name:16s} {attack_name:11s} {schedule:10s} compile {compile_s:6.1f} s  "
              f"run {min(times) * 1e3:9.1f} ms  rows grad {counter.gradient:9d} "
              f"fwd {counter.forward:9d}"
              f"  robust {flags.sum(1).tolist()}  equal to dense: {same}  "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
      if args.interleave:
        interleaved(programs, (params, x, labels, jnp.asarray(eps)), args.interleave,
                    f"{model_name:16s} {attack_name:11s}")


def interleaved(programs: dict, operands: tuple, rounds: int, label: str) -> None:
  """Each compiled program once per round, in turn; min and median of rounds 3.. in ms."""
  import jax
  import numpy as np

  times = {name: [] for name in programs}
  for _ in range(rounds):
    for name, compiled in programs.items():
      start = time.perf_counter()
      jax.block_until_ready(compiled(*operands))
      times[name].append(time.perf_counter() - start)
  stats = {name: (1e3 * np.min(t[2:]), 1e3 * np.median(t[2:])) for name, t in times.items()}
  base = stats.get("dense")
  for name, (low, mid) in stats.items():
    ratio = f"  x dense {low / base[0]:.3f} / {mid / base[1]:.3f}" if base else ""
    print(f"{label} {name:10s} interleaved x{rounds - 2}: min {low:9.1f} ms  median {mid:9.1f} "
          f"ms{ratio}  load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
  main()
