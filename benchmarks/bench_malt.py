"""MALT's target selection on a WideResNet: XLA's buffers and the time of ``jr.run``.

APGD-T with MALT targets (``apgd(targeted=True, targets="malt")``, AutoAttack ``fast``'s second
member) ranks up to ``malt_candidates`` classes by one gradient per candidate at ``init``. This
times ``jax.jit(jr.run)`` of that attack (few steps, so that ``init`` weighs) on a Flax NNX
WideResNet with random weights and random images labelled by the model, parameters and data as
arguments, and prints XLA's temporary buffers of the compiled program (its own estimate), the best
of ``--repeats`` calls, and the result's success count and sum as a fingerprint of the points:

  python benchmarks/bench_malt.py --depth 10 --width 2 --batch 32

To compare two versions of the library, run it from each checkout (``PYTHONPATH=<worktree>``).
Figures: ``benchmarks/RESULTS.md``, "MALT's candidate gradients, a few candidates per pass".
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import scale_models  # noqa: E402  (benchmarks/scale_models.py)

import jaxrobust as jr  # noqa: E402


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--depth", type=int, default=10)
  parser.add_argument("--width", type=int, default=2)
  parser.add_argument("--classes", type=int, default=10)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--targets", type=int, default=3, help="n_target_classes")
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)

  model = scale_models.WideResNet(args.depth, args.width, args.classes, rngs=nnx.Rngs(0))
  graph, state = nnx.split(model)
  attack = jr.attacks.apgd("linf", targeted=True, targets="malt",
                           n_target_classes=args.targets, steps=args.steps)

  def attack_batch(state, x, y, key):
    result = jr.run(attack, nnx.merge(graph, state), x, y, jr.Budget(2 / 255), key)
    return result.x_adv, result.success

  x = jax.random.uniform(jax.random.key(0), (args.batch, 32, 32, 3))
  y = jnp.argmax(model(x), -1).astype(jnp.int32)
  key = jax.random.key(1)
  start = time.perf_counter()
  compiled = jax.jit(attack_batch).lower(state, x, y, key).compile()
  compile_s = time.perf_counter() - start
  temp = compiled.memory_analysis().temp_size_in_bytes / 2**30
  x_adv, success = jax.block_until_ready(compiled(state, x, y, key))
  times = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    x_adv, success = jax.block_until_ready(compiled(state, x, y, key))
    times.append(time.perf_counter() - start)
  print(f"WRN-{args.depth}-{args.width}, {args.classes} classes, batch {args.batch}, "
        f"APGD-T (MALT, {args.targets} targets, {args.steps} steps), jax {jax.__version__}: "
        f"XLA temp buffers {temp:.3f} GiB, compile {compile_s:.1f} s, best {min(times):.2f} s; "
        f"successes {int(np.sum(success))}, sum of x_adv {float(jnp.sum(x_adv)):.4f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
