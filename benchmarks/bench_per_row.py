#!/usr/bin/env python
r"""What one attack step costs per row: XLA (inside a compiled loop) against PyTorch, same weights.

When an attack cannot skip work (the points survive every step, as most points of an
adversarially trained model do at small eps), a curve's time is its model rows times the cost of a
row, and no scheduling can beat the peers by more than the ratio of those costs. This script
measures that ratio for the step every gradient attack repeats,

.. math::  x \leftarrow \operatorname{clip}_{[0,1]}\bigl(x + \alpha\,
           \operatorname{sign} \nabla_x \textstyle\sum_i \mathrm{CE}(f(x_i), y_i)\bigr),

one forward and one backward pass w.r.t. the input:

* ``jaxrobust``: ``--steps`` steps in a ``lax.fori_loop`` (an XLA ``while`` body, as in every
  attack), written with XLA:CPU's canonical convolutions exactly as ``jr.run`` writes them
  (:mod:`jaxrobust.engine.canonical_conv`), jitted, compile excluded;
* ``torch``: the same steps in a Python loop with ``torch.autograd.grad`` (how torchattacks and
  the reference AutoAttack step), the model's weights frozen (``requires_grad=False``), on
  ``--torch-threads`` threads.

Both sides use the digits models of ``bench_peers.py`` (the frozen demo ``SmallCNN`` and the
seeded ``DigitsMLP``) on the first ``--batch`` test digits, repeated to fill the batch. Printed:
microseconds per row per step on each side, and their ratio (jaxrobust / torch; below 1 means
XLA is cheaper per row), best of ``--repeats`` interleaved runs, with the load average.

Usage::

  python benchmarks/bench_per_row.py [--arch cnn mlp] [--batch 8 60 540] [--steps 20]
      [--repeats 5] [--torch-threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_peers  # noqa: E402  (the models, their torch ports and the data)

from jaxrobust.engine.canonical_conv import canonical_convolutions  # noqa: E402


def jax_steps(apply_fn, params, steps: int):
  """A jitted ``(x, y, alpha) -> x`` of ``steps`` sign-gradient steps in one ``fori_loop``."""

  def loss(x, y):
    logits = apply_fn(params, x)
    return -jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

  def run(x, y, alpha):
    def body(_, x):
      return jnp.clip(x + alpha * jnp.sign(jax.grad(loss)(x, y)), 0.0, 1.0)
    return jax.lax.fori_loop(0, steps, body, x)

  return jax.jit(canonical_convolutions(run))


def torch_steps(model, steps: int):
  import torch
  from torch.nn import functional as F

  def run(x, y, alpha):
    for _ in range(steps):
      x = x.detach().requires_grad_(True)
      loss = F.cross_entropy(model(x), y, reduction="sum")
      grad, = torch.autograd.grad(loss, [x])
      x = torch.clamp(x.detach() + alpha * grad.sign(), 0.0, 1.0)
    return x

  return run


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--arch", nargs="+", default=["cnn", "mlp"], choices=["cnn", "mlp"])
  parser.add_argument("--kind", default="plain", choices=["plain", "adversarial"])
  parser.add_argument("--batch", nargs="+", type=int, default=[8, 60, 540])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--torch-threads", type=int, default=2)
  args = parser.parse_args(argv)

  import torch
  torch.set_num_threads(args.torch_threads)
  x_all, y_all = bench_peers.load_examples(None)
  print(f"machine: {os.cpu_count()} cores, jax {jax.__version__} ({jax.default_backend()}), "
        f"torch {torch.__version__} ({args.torch_threads} threads); {args.steps} steps; "
        f"load {os.getloadavg()[0]:.2f}")
  print("| model | batch | jaxrobust us/row/step | torch us/row/step | ratio |")
  print("|---|---|---|---|---|")
  for arch in args.arch:
    params = bench_peers.get_params(arch, args.kind, "frozen", False)
    apply_fn = bench_peers.ARCHS[arch]().apply
    model = (bench_peers.torch_port if arch == "cnn" else bench_peers.torch_mlp_port)(params)
    run_jax = jax_steps(apply_fn, params, args.steps)
    run_torch = torch_steps(model, args.steps)
    for batch in args.batch:
      index = np.arange(batch) % x_all.shape[0]
      x, y = x_all[index], y_all[index]
      xj, yj, alpha = jnp.asarray(x), jnp.asarray(y), jnp.float32(0.01)
      xt, yt = torch.from_numpy(bench_peers.nchw(x)), torch.from_numpy(y.astype(np.int64))
      run_jax(xj, yj, alpha).block_until_ready()  # compile
      run_torch(xt, yt, 0.01)
      best = {"jax": np.inf, "torch": np.inf}
      for _ in range(args.repeats):  # interleaved, so that load hits both sides alike
        start = time.perf_counter()
        run_jax(xj, yj, alpha).block_until_ready()
        best["jax"] = min(best["jax"], time.perf_counter() - start)
        start = time.perf_counter()
        run_torch(xt, yt, 0.01)
        best["torch"] = min(best["torch"], time.perf_counter() - start)
      per_row = {k: 1e6 * v / (batch * args.steps) for k, v in best.items()}
      print(f"| {arch} {args.kind} | {batch} | {per_row['jax']:.2f} | {per_row['torch']:.2f} | "
            f"{per_row['jax'] / per_row['torch']:.2f} |", flush=True)
  print(f"load after: {os.getloadavg()[0]:.2f}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
