#!/usr/bin/env python
r"""How many CPU cores a convolution uses: JAX on one or several CPU devices against PyTorch.

A gradient attack's cost is its forward passes and its input gradients,

.. math::  \nabla_x \textstyle\sum_i \mathrm{CE}(f(x_i), y_i),

so on a CPU what matters is how well each framework spreads those over the cores. This script
times, for the WRN-10-2 of ``bench_scale.py`` (``scale_models``, no BatchNorm, the full-cost head)
on ``32x32x3`` uniform random images at each ``--batch``:

* ``jax``: one jitted forward pass and one jitted input gradient, the NNX state and the images as
  arguments, on ``--cpu-devices`` JAX CPU devices: with more than one, the batch is split over
  them (``cpu_devices.split_over_devices``, ``jax.shard_map``, the state replicated), as
  ``jr.evaluate(..., mesh=mesh)`` and ``jaxrobust evaluate`` do;
* ``torch``: the same on the mirror with identical weights (``bench_scale.check_mirror``), on each
  of ``--torch-threads`` (skipped with ``--torch-threads 0``).

Best of ``--repeats`` calls after a warm-up, milliseconds, with the load average. Pinning the
process to one core (``taskset -c 0``) shows what a framework gets from one core.

Usage::

  python benchmarks/bench_cpu_cores.py --cpu-devices 1 [--batch 4 8 16 32 128 512]
  python benchmarks/bench_cpu_cores.py --cpu-devices 2 --torch-threads 0
  taskset -c 0 python benchmarks/bench_cpu_cores.py --cpu-devices 1 --torch-threads 0
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

BENCH = pathlib.Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
  sys.path.insert(0, str(BENCH))

import jax  # noqa: E402

from cpu_devices import split_over_devices, use_cpu_devices  # noqa: E402


def best_ms(fn, repeats: int) -> float:
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return 1e3 * min(times)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch", type=int, nargs="+", default=[4, 8, 16, 32, 128, 512])
  parser.add_argument("--cpu-devices", type=int, default=1, help="JAX CPU devices (default 1)")
  parser.add_argument("--torch-threads", type=int, nargs="+", default=[1, 2],
                      help="torch thread counts to time (0: no torch side)")
  parser.add_argument("--repeats", type=int, default=20)
  args = parser.parse_args(argv)
  use_cpu_devices(args.cpu_devices)  # before any JAX operation

  import jax.numpy as jnp
  import numpy as np
  import optax

  import bench_scale
  import scale_models

  model = bench_scale.build_model("wrn-10-2", False, 0)
  apply, state = model.apply("float32", "full"), model.state["float32"]

  def forward(state, x):
    return apply(state, x)

  def input_gradient(state, x, y):
    loss = lambda v: optax.softmax_cross_entropy_with_integer_labels(apply(state, v), y).sum()
    return jax.grad(loss)(x)

  torch_threads = [t for t in args.torch_threads if t > 0]
  torch = bench_scale.torch_module() if torch_threads else None
  net = None
  if torch is not None:
    mirror, _ = bench_scale.check_mirror(model, 0, "cpu")
    net = bench_scale.torch_model(mirror, "float32", "full", "cpu")
  print(f"jax {jax.__version__}, {len(jax.devices())} CPU device(s); torch "
        f"{torch.__version__ if torch else '-'}; {os.cpu_count()} cores; 1-min load "
        f"{os.getloadavg()[0]:.2f}")
  for batch in args.batch:
    x = np.random.default_rng(0).uniform(size=(batch, 32, 32, 3)).astype(np.float32)
    y = np.zeros(batch, np.int32)
    fwd, fwd_args = split_over_devices(forward, state, (jnp.asarray(x), True))
    grad, grad_args = split_over_devices(input_gradient, state, (jnp.asarray(x), True),
                                         (jnp.asarray(y), True))
    fwd, grad = jax.jit(fwd), jax.jit(grad)
    line = (f"batch {batch:4d}: jax fwd "
            f"{best_ms(lambda: fwd(*fwd_args).block_until_ready(), args.repeats):8.2f} grad "
            f"{best_ms(lambda: grad(*grad_args).block_until_ready(), args.repeats):8.2f} ms")
    if net is not None:
      xt = torch.from_numpy(scale_models.nchw(x))
      yt = torch.zeros(batch, dtype=torch.long)

      def torch_forward():
        with torch.no_grad():
          net(xt)

      def torch_gradient():
        v = xt.clone().requires_grad_(True)
        torch.autograd.grad(torch.nn.functional.cross_entropy(net(v), yt, reduction="sum"), v)

      for threads in torch_threads:
        torch.set_num_threads(threads)
        line += (f" | torch {threads} thread(s) fwd {best_ms(torch_forward, args.repeats):8.2f}"
                 f" grad {best_ms(torch_gradient, args.repeats):8.2f} ms")
    print(line, flush=True)
  print(f"1-min load {os.getloadavg()[0]:.2f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
