#!/usr/bin/env python
"""Throughput of ``jr.evaluate`` on the digits CNN: examples/s and time outside the compiled step.

For each device count (default 1 and 8 CPU devices; each count runs in its own subprocess since
``jax_num_cpu_devices`` must be set before JAX starts) and each batch size, the script evaluates
the demo's ``SmallCNN`` (plain training, cached by ``jaxrobust.demo.train``) on the digits test
split tiled to ``--n`` examples, with

* PGD-20 (Linf, eps 0.1, one random start), and
* ``jr.attacks.auto_attack("linf")`` (standard version), if the library has it (``--auto-attack``;
  otherwise skipped with a note), on ``--aa-n`` examples.

Each configuration runs once to compile (the step is cached) and then ``--repeats`` times; the
best repeat is reported. ``examples/s`` counts steady-state examples (after the first, compiling
batch) over the steady-state wall time; ``outside`` is the fraction of that wall time spent
outside the compiled step (host batching, validation, padding, transfers, reduction; the goal
is < 5%), both from ``Report.timing``. With 8 devices the batch is sharded over an Explicit mesh.
Timings are only meaningful on an otherwise idle machine: the 1-min load average is printed.

Example::

  python benchmarks/bench_evaluate.py --devices 1 8 --batch-sizes 64 256 1024 --n 4096
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> None:
  import jax

  jax.config.update("jax_num_cpu_devices", args.child)
  import jax.numpy as jnp
  import numpy as np

  sys.path.insert(0, str(ROOT))
  import jaxrobust as jr
  from jaxrobust.demo.data import load_digits
  from jaxrobust.demo.model import SmallCNN
  from jaxrobust.demo.train import train

  params = train(False, progress=False)
  model = SmallCNN()

  def logits_fn(x):
    return model.apply(params, x)

  _, _, x_test, y_test = load_digits()
  reps = -(-args.n // len(x_test))
  x = np.ascontiguousarray(np.concatenate([x_test] * reps)[:args.n], np.float32)
  y = np.ascontiguousarray(np.concatenate([y_test] * reps)[:args.n], np.int32)
  mesh = None
  if args.child > 1:
    mesh = jax.make_mesh((args.child,), ("batch",),
                         axis_types=(jax.sharding.AxisType.Explicit,))
  suites = {"pgd20": (jr.attacks.pgd("linf", steps=20), args.n)}
  if args.auto_attack:
    try:
      suites["auto_attack"] = (jr.attacks.auto_attack("linf"), args.aa_n)
    except Exception as e:  # noqa: BLE001 - absent or unfinished: report and go on
      print(json.dumps({"note": f"jr.attacks.auto_attack unavailable ({e!r}): skipped"}),
            flush=True)
  for name, (attack, n) in suites.items():
    for batch in args.batch_sizes:
      if mesh is not None and batch % args.child:
        continue
      runs = []
      for _ in range(1 + args.repeats):  # the first call compiles
        report = jr.evaluate(logits_fn, (x[:n], y[:n]), attacks={name: attack},
                             epsilons=jnp.array([args.eps]), key=jax.random.key(0),
                             batch_size=batch, mesh=mesh, progress=False,
                             unroll=args.unroll or 1,
                             chunk_size=args.chunk_size if name == "auto_attack" else None)
        runs.append(report.timing)
      best = max(runs[1:], key=lambda t: t["examples_per_s"])
      print(json.dumps({
          "attack": name + ("-unrolled" if args.unroll else ""), "devices": args.child, "batch_size": batch, "n": n,
          "examples_per_s": round(best["examples_per_s"], 1),
          "outside_step_fraction": round(best["outside_step_fraction"], 4),
          "compile_and_first_step_s": round(runs[0]["compile_and_first_step_s"], 2),
          "robust_accuracy": float(report.worst_case.robust_accuracy[0]),
          "load_1min": round(os.getloadavg()[0], 2)}), flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--devices", type=int, nargs="+", default=[1, 8])
  parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 1024])
  parser.add_argument("--n", type=int, default=4096, help="examples for PGD-20")
  parser.add_argument("--aa-n", type=int, default=256, help="examples for auto_attack")
  parser.add_argument("--eps", type=float, default=0.1)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--auto-attack", action="store_true", help="also time auto_attack")
  parser.add_argument("--chunk-size", type=int, default=32,
                      help="auto_attack's compute skipping: survivors run in chunks of this size")
  parser.add_argument("--unroll", action="store_true",
                      help="unroll the attack loops (faster on XLA:CPU, slower to compile)")
  parser.add_argument("--out", type=pathlib.Path, help="write the rows as JSON lines here")
  parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args)
    return
  rows = []
  print(f"{'attack':<12} {'devices':>7} {'batch':>6} {'examples/s':>11} {'outside':>8} "
        f"{'compile s':>9} {'load':>5}")
  for devices in args.devices:
    cmd = [sys.executable, __file__, "--child", str(devices), "--n", str(args.n), "--aa-n",
           str(args.aa_n), "--eps", str(args.eps), "--repeats", str(args.repeats),
           "--chunk-size", str(args.chunk_size),
           "--batch-sizes", *map(str, args.batch_sizes)]
    cmd += ["--auto-attack"] if args.auto_attack else []
    cmd += ["--unroll"] if args.unroll else []
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if proc.returncode:
      raise SystemExit(proc.stderr[-3000:])
    for line in proc.stdout.splitlines():
      row = json.loads(line)
      if "note" in row:
        print(row["note"])
        continue
      rows.append(row)
      print(f"{row['attack']:<12} {row['devices']:>7} {row['batch_size']:>6} "
            f"{row['examples_per_s']:>11.1f} {row['outside_step_fraction']:>8.2%} "
            f"{row['compile_and_first_step_s']:>9.2f} {row['load_1min']:>5.2f}")
  if args.out:
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
  main()
