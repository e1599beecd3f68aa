#!/usr/bin/env python
"""Compaction where it pays: a batch of two or three of the backend's chunks, with and without it.

Early exit freezes the rows that are broken and, where it moves rows (compaction,
``jaxrobust.engine.early_exit.compacts``), re-packs the rows still to attack into chunks so that
finished chunks cost nothing. With the backend's chunks (64 rows on a CPU) a batch of two or
three chunks is compacted only when one model evaluation of the batch costs at least
``COMPACTION_MIN_FLOPS``; a batch of four or more chunks, or an explicit ``chunk_size``, always.

This script runs ``jr.run`` with PGD-10 (Linf; ``--attack fgsm``: FGSM) on a batch of ``--rows`` rows (default 128: two
CPU chunks) on the models of ``scale_models.py`` (seeded random weights, random uniform images
labelled by the clean prediction) and on the digits models of ``bench_peers.py`` (their test
images), in two schedules:

* ``default``: the library's defaults (compaction only where the model costs enough);
* ``chunked``: ``chunk_size`` set to the chunk the backend default resolves to, which always
  compacts (what the defaults did before);
* ``one-chunk``: ``chunk_size`` set to the batch: broken rows frozen in place, no row moved (what
  the defaults now do for a cheap model).

at each ``--eps`` (in 1/255: on a random WideResNet ``0.5`` breaks no point, ``8`` all but a few,
which then run every step, ``24`` every point). Printed per (model, eps, schedule): the batch's forward GFLOP
(``jaxrobust._cost.model_flops``), compile seconds, run seconds (best of ``--repeats``), the
points broken (equal in every schedule: the verdicts do not depend on compaction). The weights and
the data are arguments of every compiled program.

Example::

  python benchmarks/bench_compaction.py --models wrn-10-1,wrn-10-2,cnn,mlp --rows 128
  python benchmarks/bench_compaction.py --models mlp,cnn --rows 150 --attack fgsm
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
  parser.add_argument("--models", default="wrn-10-1,wrn-10-2,cnn,mlp")
  parser.add_argument("--rows", type=int, default=128)
  parser.add_argument("--eps", type=float, nargs="+", default=[0.5, 8.0, 24.0])
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--attack", choices=("pgd", "fgsm"), default="pgd")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()

  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  sys.path.insert(0, str(ROOT))
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import jaxrobust as jr
  import scale_models
  from jaxrobust import _cost
  from jaxrobust._options import RunOptions
  from bench_peers import ARCHS, get_params, load_examples

  attack = (jr.attacks.pgd("linf", steps=args.steps) if args.attack == "pgd"
            else jr.attacks.fgsm("linf"))
  chunk = RunOptions().chunk_rows(args.rows)
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, {args.rows} rows, chunks of "
        f"{chunk}, load average {os.getloadavg()[0]:.2f}", flush=True)
  for name in args.models.split(","):
    if name in ("cnn", "mlp"):
      params = get_params(name, "plain", "frozen", False)
      apply = ARCHS[name]().apply
      x_np, y_np = load_examples(args.rows)
      x, y = jnp.asarray(x_np), jnp.asarray(y_np)
    else:
      graphdef, params = nnx.split(scale_models.build(name))
      apply = functools.partial(lambda graphdef, state, v: nnx.merge(graphdef, state)(v),
                                graphdef)
      x = jax.random.uniform(jax.random.key(1), (args.rows, *scale_models.image_shape(name)))
      y = jnp.argmax(jax.jit(apply)(params, x), axis=-1)
    flops = _cost.model_flops(functools.partial(apply, params), x)
    for eps in args.eps:
      schedules = (("default", {}), ("chunked", {"chunk_size": chunk}),
                   ("one-chunk", {"chunk_size": args.rows}))
      for schedule, options in schedules:

        def program(params, x, y, eps, key, options=options):
          return jr.run(attack, functools.partial(apply, params), x, y, jr.Budget(eps), key,
                        **options).success

        operands = (params, x, y, jnp.float32(eps / 255), jax.random.key(0))
        start = time.perf_counter()
        compiled = jax.jit(program).lower(*operands).compile()
        compile_s = time.perf_counter() - start
        jax.block_until_ready(compiled(*operands))
        times = []
        for _ in range(args.repeats):
          start = time.perf_counter()
          success = jax.block_until_ready(compiled(*operands))
          times.append(time.perf_counter() - start)
        print(f"{name:9s} {flops / 1e9:8.3f} GFLOP  eps {eps:5.1f}/255  {schedule:9s} compile "
              f"{compile_s:5.2f} s  run {min(times):7.3f} s  broken {int(np.sum(success))}  "
              f"load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
  main()
