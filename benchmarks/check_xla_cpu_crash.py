"""Does this jaxlib's XLA:CPU crash running a WideResNet forward pass? (No jaxrobust, no Flax.)

jaxlib 0.10.2 on a 2-core AMD EPYC (AVX-512) corrupted the heap while running a jitted forward
pass of a plain-JAX WRN-16-4 (pre-activation blocks without BatchNorm, 32x32x3 inputs): the
process died with SIGSEGV or a glibc abort ("malloc(): invalid size", "double free or
corruption") in about a third of the processes, also with ``--xla_cpu_max_isa=AVX2``,
``--xla_cpu_use_xnnpack=false``, ``--xla_cpu_use_onednn=false`` or 2 or 8 CPU devices, while
jaxlib 0.10.1, 0.10.0 and 0.9.2 ran the same script cleanly (figures: ``benchmarks/RESULTS.md``,
"A jaxlib 0.10.2 crash on CPU"). jaxrobust's ``pyproject.toml`` therefore excludes 0.10.2. Each
trial is a fresh process, since a crash ends the process that meets it:

  python benchmarks/check_xla_cpu_crash.py --trials 8                 # WRN-16-4, batch 32
  python benchmarks/check_xla_cpu_crash.py --depth 22 --batch 8 --trials 8

``--once`` runs one forward program three times in this process (what each trial runs).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys


def forward_once(depth: int, width: int, batch: int) -> None:
  """Compiles and runs (three times) the forward pass of WRN-``depth``-``width`` at ``batch``."""
  import jax
  import jax.numpy as jnp
  from jax import lax

  blocks_per_group = (depth - 4) // 6
  widths = (16, 16 * width, 32 * width, 64 * width)
  keys = iter(jax.random.split(jax.random.key(0), 4 * depth))

  def kernel(shape):
    fan_in = shape[0] * shape[1] * shape[2]
    return jax.random.normal(next(keys), shape) * (2.0 / fan_in) ** 0.5

  params = {"stem": kernel((3, 3, 3, 16)), "blocks": [],
            "head": jax.random.normal(next(keys), (widths[3], 10)) * 0.05}
  strides = []
  for group, stride in zip(range(3), (1, 2, 2)):
    for i in range(blocks_per_group):
      cin, cout = (widths[group] if i == 0 else widths[group + 1]), widths[group + 1]
      block = {"c1": kernel((3, 3, cin, cout)), "c2": kernel((3, 3, cout, cout))}
      if cin != cout or (i == 0 and stride != 1):
        block["shortcut"] = kernel((1, 1, cin, cout))
      params["blocks"].append(block)
      strides.append(stride if i == 0 else 1)

  def conv(x, k, stride):
    pad = k.shape[0] // 2
    return lax.conv_general_dilated(x, k, (stride, stride), [(pad, pad), (pad, pad)],
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))

  def forward(params, x):
    x = conv(x, params["stem"], 1)
    for block, stride in zip(params["blocks"], strides):
      out = jax.nn.relu(x)
      y = conv(jax.nn.relu(conv(out, block["c1"], stride)), block["c2"], 1)
      x = y + (conv(out, block["shortcut"], stride) if "shortcut" in block else x)
    return jnp.mean(jax.nn.relu(x), axis=(1, 2)) @ params["head"]

  x = jax.random.uniform(jax.random.key(1), (batch, 32, 32, 3))
  compiled = jax.jit(forward).lower(params, x).compile()  # parameters and data as arguments
  for _ in range(3):
    jax.block_until_ready(compiled(params, x))
  print(f"ok: jax {jax.__version__}, WRN-{depth}-{width}, batch {batch}")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--depth", type=int, default=16)
  parser.add_argument("--width", type=int, default=4)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--trials", type=int, default=8, help="fresh processes to run")
  parser.add_argument("--once", action="store_true", help="run one trial in this process")
  args = parser.parse_args(argv)
  if (args.depth - 4) % 6:
    parser.error(f"a WideResNet's depth is 6n + 4, got {args.depth}")
  if args.once:
    forward_once(args.depth, args.width, args.batch)
    return 0
  command = [sys.executable, __file__, "--once", "--depth", str(args.depth), "--width",
             str(args.width), "--batch", str(args.batch)]
  codes = collections.Counter()
  for trial in range(args.trials):
    done = subprocess.run(command, capture_output=True, text=True)
    codes[done.returncode] += 1
    last = (done.stdout.strip() or done.stderr.strip() or "-").splitlines()[-1]
    print(f"trial {trial + 1}: exit {done.returncode}  {last[:100]}", flush=True)
  crashed = args.trials - codes[0]
  print(f"WRN-{args.depth}-{args.width}, batch {args.batch}: {crashed} of {args.trials} processes "
        f"crashed (exit statuses {dict(codes)})")
  return 1 if crashed else 0


if __name__ == "__main__":
  sys.exit(main())
