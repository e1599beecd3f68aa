#!/usr/bin/env python
"""What the ball correction of the scoring (``jaxrobust.engine.scoring.inside_ball``) adds to an
attack program: the optimised HLO's size (lines of ``compiled.as_text()``) and its lowering and
XLA compile seconds, with the correction and with it replaced by the identity (``--identity``
runs only that variant; the default runs both, alternating, in one process).

Programs: robustness curves (PGD-5 Linf and L2, AutoAttack ``steps=5, queries=10`` Linf) of a
small MLP (``tests.models.mlp``, 12 -> 16 -> 4) on 64 random points at two eps, compiled the way
the test suite compiles its compile-bound modules (legacy emitters, backend optimisation level
0). The data are arguments of every compiled program.

Example::

  python benchmarks/bench_ball_cost.py --repeats 3
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
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  os.environ.setdefault("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=false")
  sys.path.insert(0, str(ROOT))
  import jax
  import jax.numpy as jnp

  jax.config.update("jax_disable_most_optimizations", True)
  import jaxrobust as jr
  from jaxrobust.engine import scoring
  from tests.models import mlp

  correction = scoring.inside_ball
  model = mlp(0, 12, 16, 4)
  x = jax.random.uniform(jax.random.key(0), (64, 12))
  y = jnp.argmax(model(x), 1)
  eps = jnp.asarray([0.05, 0.1], jnp.float32)
  attacks = {"pgd-linf": jr.attacks.pgd("linf", steps=5), "pgd-l2": jr.attacks.pgd("l2", steps=5),
             "aa-linf": jr.attacks.auto_attack("linf", steps=5, queries=10)}
  print(f"jax {jax.__version__}, load average {os.getloadavg()[0]:.2f}")
  for variant in ("identity", "correction") * args.repeats:
    scoring.inside_ball = (correction if variant == "correction"
                           else lambda x_adv, x, eps, norm: x_adv)
    cells = []
    for name, attack in attacks.items():

      def program(x, y, eps, key, attack=attack):
        return jr.robustness_curve(attack, model, x, y, eps, key).robust

      jax.clear_caches()
      start = time.perf_counter()
      lowered = jax.jit(program).lower(x, y, eps, jax.random.key(0))
      lowered_at = time.perf_counter()
      compiled = lowered.compile()
      done = time.perf_counter()
      cells.append(f"{name} {compiled.as_text().count(chr(10))} lines, lower "
                   f"{lowered_at - start:.2f} s, compile {done - lowered_at:.2f} s")
    print(f"{variant:10s} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
  main()
