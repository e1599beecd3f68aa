#!/usr/bin/env python
r"""jr.training's inner attack loops on CPU with and without canonical convolutions.

One jitted training step of the demo's ``SmallCNN`` on the digits (a batch of ``--batch``
training images, ``jax.value_and_grad`` of the loss and an optax Adam update, the model as
``functools.partial(model.apply, params)``), for

* ``pgd-at``: ``jr.training.adversarial_loss`` with ``jr.attacks.pgd("linf", steps=10)``
  (Madry et al.);
* ``trades``: ``jr.training.trades_loss`` (10 KL-ascent steps, beta 6);

each traced three ways:

* ``before``: the attack loop as XLA:CPU got it before jr.training applied the rewrite (the rewrite
  switched off by making ``canonical_conv.has_convolution`` answer no while tracing): the input
  gradient's convolution (``dim_labels=b01f_01oi->b01f``) runs on XLA:CPU's generic emitter
  inside the loop body, since ``ConvCanonicalization`` only rewrites the entry computation;
* ``after``: the library as it is: on CPU the inner loop is traced with every convolution in
  canonical form (:mod:`jaxrobust.engine.canonical_conv`);
* ``unrolled`` (``--unrolled``): ``unroll=True``, the previous workaround (every step in the entry
  computation), slower to compile.

Per variant: compile seconds (trace, lower and compile), then the best of ``--repeats`` timed
rounds of ``--steps`` training steps each (rounds interleaved across variants so background load
hits them alike), reported per step; the inner attack's model rows per step
(``jr.metrics.count_evaluations`` on the model the attack runs: forward and gradient rows, equal in
all variants); and the loss and parameter gradient of the
first step against ``before`` (equal up to float rounding). The 1-min load average is printed
before and after.

Usage::

  python benchmarks/bench_training_conv.py [--batch 128] [--steps 5] [--repeats 3] [--unrolled]
      [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import pathlib
import sys
import time
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxrobust as jr  # noqa: E402
from jaxrobust import training  # noqa: E402
from jaxrobust.demo import data  # noqa: E402
from jaxrobust.demo.model import SmallCNN  # noqa: E402
from jaxrobust.engine import canonical_conv  # noqa: E402

EPS = 0.2
"""Linf radius on the digits' [0, 1] pixels (as in ``bench_training.py``)."""


@contextlib.contextmanager
def rewrite(enabled: bool):
  """While tracing: the engine's and jr.training's "holds a convolution" test answers no unless
  ``enabled`` (so no loop is rewritten)."""
  original = canonical_conv.has_convolution
  if not enabled:
    canonical_conv.has_convolution = lambda *args: False
  try:
    yield
  finally:
    canonical_conv.has_convolution = original


def loss_fns(apply_fn: Callable, attack_logits_fn: Callable | None = None
             ) -> dict[str, Callable]:
  """``{name: (params, x, y, eps, key, unroll) -> (loss, aux)}``."""
  pgd = jr.attacks.pgd("linf", steps=10)
  return {
      "pgd-at": lambda p, x, y, eps, key, unroll: training.adversarial_loss(
          functools.partial(apply_fn, p), x, y, jr.Budget(eps), key, attack=pgd, unroll=unroll,
          attack_logits_fn=attack_logits_fn),
      "trades": lambda p, x, y, eps, key, unroll: training.trades_loss(
          functools.partial(apply_fn, p), x, y, jr.Budget(eps), key, unroll=unroll,
          attack_logits_fn=attack_logits_fn),
  }


def train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, unroll: int | bool):
  """``(params, opt_state, x, y, eps, key) -> (params, opt_state, loss, grads)``, not jitted."""

  def step(params, opt_state, x, y, eps, key):
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y, eps, key, unroll)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, grads

  return step


def compiled(step: Callable, args: tuple, enabled: bool) -> tuple[Any, float]:
  start = time.perf_counter()
  with rewrite(enabled):
    program = jax.jit(step).trace(*args).lower().compile()
  return program, time.perf_counter() - start


def attack_rows(loss_name: str, apply_fn: Callable, args: tuple, unroll,
                enabled: bool) -> tuple[int, int]:
  """Forward and gradient rows of the inner attack in one training step (the attack runs a
  counted copy of the model, ``attack_logits_fn``; the loss's own outer passes are not counted)."""
  params, _, x, y, eps, key = args
  counted, counter = jr.metrics.count_evaluations(functools.partial(apply_fn, params))
  loss = loss_fns(apply_fn, attack_logits_fn=counted)[loss_name]
  with rewrite(enabled):
    program = jax.jit(lambda *a: jax.value_and_grad(loss, has_aux=True)(*a, unroll)[0][0])
    jax.block_until_ready(program(params, x, y, eps, key))
  jax.effects_barrier()
  return int(counter.forward), int(counter.gradient)


def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--steps", type=int, default=5, help="training steps per timed round")
  parser.add_argument("--repeats", type=int, default=3, help="timed rounds (the best is kept)")
  parser.add_argument("--unrolled", action="store_true", help="also time unroll=True")
  parser.add_argument("--json", type=pathlib.Path, default=None)
  args = parser.parse_args(argv)

  print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} cores, "
        f"1-min load {os.getloadavg()[0]:.2f}", flush=True)
  x_train, y_train, _, _ = data.load_digits()
  steps = args.steps
  rows = np.random.default_rng(0).permutation(x_train.shape[0])[: steps * args.batch]
  xb = jnp.asarray(x_train[rows].reshape(steps, args.batch, *x_train.shape[1:]))
  yb = jnp.asarray(y_train[rows].reshape(steps, args.batch))
  model = SmallCNN()
  params = jax.jit(model.init)(jax.random.key(0), xb[0])
  optimizer = optax.adam(1e-3)
  opt_state = optimizer.init(params)
  eps, keys = jnp.float32(EPS), jax.random.split(jax.random.key(1), steps)
  first = (params, opt_state, xb[0], yb[0], eps, keys[0])

  modes = {"before": (1, False), "after": (1, True)}
  if args.unrolled:
    modes["unrolled"] = (True, True)
  programs, compile_s, results, counts = {}, {}, {}, {}
  for loss_name, loss_fn in loss_fns(model.apply).items():
    for mode, (unroll, enabled) in modes.items():
      name = f"{loss_name} {mode}"
      programs[name], compile_s[name] = compiled(train_step(loss_fn, optimizer, unroll), first,
                                                 enabled)
      results[name] = jax.device_get(programs[name](*first))
      counts[name] = attack_rows(loss_name, model.apply, first, unroll, enabled)

  def epoch(program):
    state = (params, opt_state)
    for i in range(steps):
      state = program(*state, xb[i], yb[i], eps, keys[i])[:2]
    jax.block_until_ready(state)

  load_before = os.getloadavg()[0]
  best = {name: np.inf for name in programs}
  for _ in range(args.repeats):
    for name, program in programs.items():
      start = time.perf_counter()
      epoch(program)
      best[name] = min(best[name], (time.perf_counter() - start) / steps)
  load_after = os.getloadavg()[0]

  print(f"\n=== SmallCNN on digits, batch {args.batch}, eps {EPS}, best of {args.repeats} rounds "
        f"of {steps} steps; 1-min load {load_before:.2f} before, {load_after:.2f} after ===")
  print(f"{'variant':18s} {'ms/step':>8s} {'x before':>8s} {'compile s':>9s} {'atk fwd':>8s} "
        f"{'atk grad':>9s}  |loss - before's|, max rel |grad - before's|")
  report = {"batch": args.batch, "steps": steps, "repeats": args.repeats, "eps": EPS,
            "load_before": load_before, "load_after": load_after, "variants": {}}
  for name in programs:
    base = name.split()[0] + " before"
    loss_diff = abs(float(results[name][2]) - float(results[base][2]))
    grad_diff = max(float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))
                    for a, b in zip(jax.tree.leaves(results[name][3]),
                                    jax.tree.leaves(results[base][3])))
    ratio = best[base] / best[name]
    print(f"{name:18s} {best[name] * 1e3:8.1f} {ratio:8.2f} {compile_s[name]:9.1f} "
          f"{counts[name][0]:8d} {counts[name][1]:9d}  {loss_diff:.2g}, {grad_diff:.2g}")
    report["variants"][name] = {
        "ms_per_step": best[name] * 1e3, "speedup": ratio, "compile_s": compile_s[name],
        "attack_forward_rows": counts[name][0], "attack_gradient_rows": counts[name][1],
        "loss_diff": loss_diff, "grad_max_rel_diff": grad_diff}
  if args.json is not None:
    args.json.write_text(json.dumps(report, indent=1))
  return report


if __name__ == "__main__":
  main()
