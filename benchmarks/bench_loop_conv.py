#!/usr/bin/env python
r"""XLA:CPU's loop-body penalty on convolution gradients: reproduction, cause and a workaround.

The step timed everywhere is one input-gradient step of a fixed-budget attack,

.. math::  x \leftarrow \operatorname{clip}_{[0,1]}\bigl(x + \alpha\,
           \operatorname{sign} \nabla_x \textstyle\sum_i \mathrm{CE}(f(x_i), y_i)\bigr),

(one forward and one backward pass through the model w.r.t. the input), on a batch of digits-sized
NHWC images, in these forms:

* ``outside``: one jitted step (the reference; the per-step ratios below divide by its time);
* ``scan``, ``fori_loop`` (static bounds, which JAX lowers to a scan), ``while_loop`` (a traced
  trip count): ``n`` steps in an XLA ``while`` body;
* ``unrolled``: ``n`` steps written out in the program's entry computation (``scan(unroll=True)``);
* attempted workarounds: the model's parameters (or any closure's constants, hoisted with
  ``jax.make_jaxpr``) carried through the loop instead of closed over, an
  ``optimization_barrier`` on them or on the state, ``k`` steps unrolled inside the body, a
  host-stepped loop (a jitted ``k``-step program called from Python), XLA flags (``--xla-flags``,
  each in a fresh process), and the fix, :func:`canonical_convolutions`.

Cause (read from ``.compile().as_text()``, printed by ``--hlo``). ``jax.grad`` of a convolution
w.r.t. its input is a convolution with the kernel's feature axes swapped: JAX emits it with
``dim_labels=b01f_01oi->b01f`` (kernel output features before input features). XLA:CPU's fast
convolution path needs the canonical ``b01f_01io->b01f`` (NHWC input, HWIO kernel), and its pass
``ConvCanonicalization`` (``xla/service/cpu/conv_canonicalization.cc``) rewrites non-canonical
convolutions by inserting transposes -- but it walks ``module->entry_computation()`` only. A
convolution in a ``while`` body (every ``scan``/``fori_loop``/``while_loop``, ``lax.map``, every
nesting level) keeps ``01oi`` and runs on XLA's generic loop emitter. Outside the loop (and
unrolled) the transpose is inserted and then folded into the constant kernel, which is why the
convolution reads ``01io`` there. So it is the dimension numbers (not the memory layout, which is
``{3,2,1,0}`` in both) that differ, and every convolution's input gradient pays, whatever its
stride (a lone stride-1 layer pays as much as the strided one; the strided layer's gradient is
the ``lhs_dilate=2x2`` convolution). Carrying the parameters, barriers, partial unrolling and
the XLA flags tried leave the body's convolutions at ``01oi`` and the penalty in place.

Workaround, for any ``logits_fn``: :func:`canonical_convolutions` re-traces a function to a jaxpr
and writes every ``conv_general_dilated`` in canonical form (transposes of the operands and the
result, which XLA folds into constants or elides), recursing into the jaxprs of nested loops,
conditionals and calls. Applied to a loop body (or to a whole program holding loops) after
``jax.grad`` has produced the backward convolutions, it makes the body's convolutions canonical
before XLA sees them. :func:`loop_with_workaround` is the engine-side form.

Usage::

  python benchmarks/bench_loop_conv.py [--batch 256 540] [--steps 20] [--repeats 7] [--hlo]
      [--xla-flags] [--engine]

Ratios are per step, relative to ``outside``; the best of ``--repeats`` interleaved runs each.

References:
  XLA, ``xla/service/cpu/conv_canonicalization.cc`` (entry computation only) and
  ``PotentiallyImplementedAsEigenConvolution`` (``xla/service/cpu/ir_emission_utils.cc``).
  JAX issue 12868 (NCHW convolutions slow inside loops on CPU).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.extend import core  # noqa: E402

from jaxrobust.demo.model import SmallCNN  # noqa: E402

# ------------------------------------------------------------------------------------------------
# The workaround: canonical convolutions, whatever the model.

# The rewrite lives in the library (jaxrobust.engine.canonical_conv), which the engine applies
# on CPU; the variants below call it directly.
from jaxrobust.engine.canonical_conv import canonical_convolutions  # noqa: E402


def loop_with_workaround(step: Callable[[Any], Any], state: Any, n: int, *,
                         unroll: int | bool = 1) -> Any:
  """``n`` applications of ``step`` to ``state`` under one ``lax.scan``, convolutions canonical.

  The drop-in replacement for ``lax.scan(lambda s, _: (step(s), None), state, None, length=n)``
  in an engine whose ``step`` takes input gradients through a user's model.

  Examples:
    >>> import jax.numpy as jnp
    >>> float(loop_with_workaround(lambda s: s + 1.0, jnp.float32(0.0), 5))
    5.0
  """
  body = canonical_convolutions(step)
  state, _ = lax.scan(lambda s, _: (body(s), None), state, None, length=n, unroll=unroll)
  return state


# ------------------------------------------------------------------------------------------------
# Models.


class StridedConv(nn.Module):
  """One ``Conv(32, 3x3, stride)`` -> relu -> flatten -> ``Dense(10)`` (NHWC)."""

  stride: int = 2

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = nn.relu(nn.Conv(32, (3, 3), strides=(self.stride, self.stride), padding="SAME")(x))
    return nn.Dense(10)(x.reshape((x.shape[0], -1)))


MODELS = {"SmallCNN": SmallCNN(), "strided_conv": StridedConv(2), "stride1_conv": StridedConv(1)}


def make_problem(model_name: str, batch: int):
  model = MODELS[model_name]
  params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1), jnp.float32))
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.uniform(0, 1, (batch, 8, 8, 1)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 10, batch), jnp.int32)
  return model, params, x, y


def gradient_step(logits_fn, x, y, alpha=0.01):
  """One sign-gradient ascent step on the summed cross-entropy, clipped to [0, 1]."""

  def loss(x):
    logp = jax.nn.log_softmax(logits_fn(x))
    return -jnp.sum(jnp.take_along_axis(logp, y[:, None], axis=1))

  return jnp.clip(x + alpha * jnp.sign(jax.grad(loss)(x)), 0.0, 1.0)


# ------------------------------------------------------------------------------------------------
# Variants: each is (jitted function of (x, y) -> x after `steps` steps, steps it runs per call).


def variants(model, params, steps: int, k: int) -> dict[str, tuple[Callable, int]]:
  logits_fn = functools.partial(model.apply, params)
  step = lambda x, y: gradient_step(logits_fn, x, y)
  scan = lambda body, x, n, **kw: lax.scan(lambda c, _: (body(c), None), x, None, length=n,
                                           **kw)[0]
  out: dict[str, tuple[Callable, int]] = {}
  out["outside"] = (jax.jit(step), 1)
  out["scan"] = (jax.jit(lambda x, y: scan(lambda c: step(c, y), x, steps)), steps)
  out["fori_loop"] = (jax.jit(lambda x, y: lax.fori_loop(0, steps, lambda i, c: step(c, y), x)),
                      steps)

  def while_steps(x, y, n):
    return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, step(c[1], y)),
                          (jnp.int32(0), x))[1]

  out["while_loop"] = (jax.jit(lambda x, y: while_steps(x, y, jnp.int32(steps))), steps)
  out["unrolled"] = (jax.jit(lambda x, y: scan(lambda c: step(c, y), x, steps, unroll=True)),
                     steps)
  # FGSM's loop: a length-1 scan, even with unroll=True, stays an XLA while loop.
  out["scan length 1, unroll=True"] = (
      jax.jit(lambda x, y: scan(lambda c: step(c, y), x, 1, unroll=True)), 1)
  out[f"scan, {k} unrolled per body"] = (
      jax.jit(lambda x, y: scan(lambda c: step(c, y), x, steps, unroll=k)), steps)

  # The model's parameters as loop carry (what an engine could do if it saw them).
  def carried_params(x, y, params):
    def body(c):
      p, x = c
      return p, gradient_step(functools.partial(model.apply, p), x, y)
    return scan(body, (params, x), steps)[1]

  out["params carried"] = (jax.jit(lambda x, y: carried_params(x, y, params)), steps)

  # Any closure's constants hoisted (make_jaxpr) and carried, with and without a barrier.
  def hoisted(x, y, barrier: bool):
    closed = jax.make_jaxpr(step)(x, y)

    def body(c):
      consts, x = c
      if barrier:
        consts = lax.optimization_barrier(consts)
      return consts, core.jaxpr_as_fun(core.ClosedJaxpr(closed.jaxpr, consts))(x, y)[0]

    return scan(body, (list(closed.consts), x), steps)[1]

  out["consts carried"] = (jax.jit(lambda x, y: hoisted(x, y, False)), steps)
  out["consts carried + barrier"] = (jax.jit(lambda x, y: hoisted(x, y, True)), steps)
  out["barrier on x"] = (jax.jit(lambda x, y: scan(
      lambda c: step(lax.optimization_barrier(c), y), x, steps)), steps)
  out["WORKAROUND scan"] = (jax.jit(lambda x, y: loop_with_workaround(
      lambda c: step(c, y), x, steps)), steps)
  out["WORKAROUND while_loop"] = (jax.jit(lambda x, y: canonical_convolutions(while_steps)(
      x, y, jnp.int32(steps))), steps)
  return out


def host_stepped(model, params, steps: int, k: int) -> Callable:
  """``steps`` steps as ``steps // k`` calls of a jitted ``k``-step (unrolled) program."""
  logits_fn = functools.partial(model.apply, params)

  # A Python loop, not scan(unroll=True): a scan of length 1 stays a while loop (see main()).
  @jax.jit
  def k_steps(x, y):
    for _ in range(k):
      x = gradient_step(logits_fn, x, y)
    return x

  def run(x, y):
    for _ in range(steps // k):
      x = k_steps(x, y)
    return x

  run.compiled = k_steps
  return run


def best_times(fns: dict[str, Callable], args, repeats: int) -> dict[str, float]:
  """Interleaved repeats (background load hits every variant alike); the best time of each."""
  for fn in fns.values():
    jax.block_until_ready(fn(*args))
  times: dict[str, list[float]] = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - start)
  return {name: min(t) for name, t in times.items()}


def compile_seconds(fn, *args) -> float:
  start = time.perf_counter()
  fn.lower(*args).compile()
  return time.perf_counter() - start


def conv_labels(hlo: str) -> list[str]:
  """``dim_labels`` (and lhs dilation) of every convolution in optimised HLO text."""
  out = []
  for line in hlo.splitlines():
    if " convolution(" in line:
      labels = re.search(r"dim_labels=(\S+?),", line).group(1)
      dilated = "lhs_dilate" in line
      in_loop = "/while/" in line
      out.append(labels + (" lhs_dilate" if dilated else "")
                 + (" [in while body]" if in_loop else ""))
  return out


def dispatch_overhead(batch: int, repeats: int) -> float:
  """Seconds per call of a jitted function that does almost nothing on a PGD-sized state."""
  state = {"x": jnp.zeros((batch, 8, 8, 1)), "best_x": jnp.zeros((batch, 8, 8, 1)),
           "best_loss": jnp.zeros((batch,)), "success": jnp.zeros((batch,), bool),
           "step": jnp.int32(0), "key": jax.random.key(0)}
  tick = jax.jit(lambda s: {**s, "step": s["step"] + 1})
  jax.block_until_ready(tick(state))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(100):
      state = tick(state)
    jax.block_until_ready(state)
    times.append((time.perf_counter() - start) / 100)
  return min(times)


# ------------------------------------------------------------------------------------------------
# Drivers.


def run_table(model_name: str, batch: int, steps: int, k: int, repeats: int,
              show_hlo: bool) -> dict[str, Any]:
  model, params, x, y = make_problem(model_name, batch)
  fns = variants(model, params, steps, k)
  compile_s = {name: compile_seconds(fn, x, y) for name, (fn, _) in fns.items()}
  hosts = {f"host-stepped, k={kk}": host_stepped(model, params, steps, kk)
           for kk in sorted({1, k, steps})}
  timed = {name: fn for name, (fn, _) in fns.items()} | hosts
  times = best_times(timed, (x, y), repeats)
  per_step = {name: times[name] / (fns[name][1] if name in fns else steps) for name in timed}
  reference = per_step["outside"]
  results = {"scan": np.asarray(fns["scan"][0](x, y)),
             "unrolled": np.asarray(fns["unrolled"][0](x, y))}
  print(f"\n=== {model_name}, batch {batch}, {steps} steps; outside = {reference * 1e3:.3f} ms "
        f"per step (1-min load {os.getloadavg()[0]:.1f}) ===")
  print(f"{'variant':32s} {'ms/step':>8s} {'x outside':>9s} {'compile s':>9s}  "
        "max|x - scan's x|, max|x - unrolled's x| (after all steps)")
  rows = {}
  for name, fn in timed.items():
    full = name not in fns or fns[name][1] == steps  # one-step variants have nothing to match
    out = np.asarray(fn(x, y)) if full else None
    diffs = ("-" if out is None else
             f"{np.max(np.abs(out - results['scan'])):.3g}, "
             f"{np.max(np.abs(out - results['unrolled'])):.3g}")
    c = compile_s.get(name, None)
    print(f"{name:32s} {per_step[name] * 1e3:8.3f} {per_step[name] / reference:9.2f} "
          f"{'-' if c is None else f'{c:.2f}':>9s}  {diffs}")
    rows[name] = {"ms_per_step": per_step[name] * 1e3, "ratio": per_step[name] / reference,
                  "compile_s": c, "diff": diffs}
  if show_hlo:
    for name in ("outside", "scan", "WORKAROUND scan"):
      labels = conv_labels(fns[name][0].lower(x, y).compile().as_text())
      print(f"  convolutions after optimisation, {name}: {labels}")
  return rows


def run_flag_child(batch: int, steps: int, repeats: int) -> None:
  """One line of JSON: SmallCNN's scan/outside per-step ratio under this process's XLA_FLAGS."""
  model, params, x, y = make_problem("SmallCNN", batch)
  fns = variants(model, params, steps, 5)
  pick = {name: fns[name][0] for name in ("outside", "scan", "WORKAROUND scan")}
  times = best_times(pick, (x, y), repeats)
  labels = conv_labels(pick["scan"].lower(x, y).compile().as_text())
  print(json.dumps({"outside_ms": times["outside"] * 1e3,
                    "scan_ratio": times["scan"] / steps / times["outside"],
                    "workaround_ratio": times["WORKAROUND scan"] / steps / times["outside"],
                    "scan_conv_labels": labels}))


FLAG_SETS = [
  "",
  "--xla_cpu_experimental_ynn_fusion_type=",
  "--xla_cpu_experimental_ynn_fusion_type=individual_convolution",
  "--xla_cpu_use_xnnpack=true",
  "--xla_cpu_use_onednn=true",
  "--xla_cpu_fold_all_constants=true",
  "--xla_cpu_multi_thread_eigen=false",
  "--xla_cpu_use_fusion_emitters=false",
  "--xla_cpu_enable_fast_math=true",
  "--xla_cpu_small_while_loop_byte_threshold=0",
  "--xla_cpu_use_thunk_runtime=false",
]
"""XLA_FLAGS tried, each in a fresh process (flags are read once, when the backend starts)."""


def run_flag_sweep(batch: int, steps: int, repeats: int) -> None:
  print(f"\n=== XLA_FLAGS sweep (SmallCNN, batch {batch}, {steps} steps; fresh process each) ===")
  for flags in FLAG_SETS:
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())
    proc = subprocess.run([sys.executable, __file__, "--flag-child", "--batch", str(batch),
                           "--steps", str(steps), "--repeats", str(repeats)],
                          env=env, capture_output=True, text=True, timeout=600)
    last = proc.stdout.strip().splitlines()[-1:] if proc.returncode == 0 else []
    if not last:
      error = (proc.stderr.strip().splitlines() or ["?"])[-1][:150]
      print(f"  {flags or '(none)':62s} failed: {error}")
      continue
    r = json.loads(last[0])
    print(f"  {flags or '(none)':62s} outside {r['outside_ms']:.3f} ms, "
          f"scan {r['scan_ratio']:.2f}x, workaround {r['workaround_ratio']:.2f}x; "
          f"loop convs {r['scan_conv_labels']}")


def frozen_digits_problem(batch: int):
  """The frozen plain demo weights (``benchmarks/reference``) and ``batch`` digits test images."""
  from jaxrobust.demo.data import load_digits

  params: dict[str, dict[str, jax.Array]] = {}
  with np.load(ROOT / "benchmarks" / "reference" / "digits_plain.npz") as data:
    for key in data.files:
      layer, name = key.split("/")
      params.setdefault(layer, {})[name] = jnp.asarray(data[key])
  _, _, x_test, y_test = load_digits()
  rows = np.arange(batch) % x_test.shape[0]
  return ({"params": params}, jnp.asarray(x_test[rows], jnp.float32),
          jnp.asarray(y_test[rows], jnp.int32))


def run_engine(batch: int, repeats: int) -> None:
  """The library's own loops: ``jr.run`` (PGD-20, no early exit) and a 4-eps curve (defaults),
  as they are, unrolled, and with the whole program wrapped in :func:`canonical_convolutions`."""
  import jaxrobust as jr

  params, x, y = frozen_digits_problem(batch)
  logits_fn = functools.partial(SmallCNN().apply, params)
  attack = jr.attacks.pgd("linf", steps=20)

  def run(x, y, eps, unroll=1):
    return jr.run(attack, logits_fn, x, y, jr.Budget(eps), jax.random.key(0), unroll=unroll,
                  early_exit=False)

  epsilons = jnp.asarray([0.05, 0.1, 0.15, 0.2], jnp.float32)

  def curve(x, y):
    return jr.robustness_curve(attack, logits_fn, x, y, epsilons, jax.random.key(0))

  eps = jnp.float32(0.1)
  fns = {
    "jr.run PGD-20 (default loop)": (jax.jit(run), (x, y, eps)),
    "jr.run PGD-20 unroll=True": (jax.jit(functools.partial(run, unroll=True)), (x, y, eps)),
    "jr.run PGD-20, canonical_convolutions(whole)": (jax.jit(canonical_convolutions(run)),
                                                     (x, y, eps)),
    "curve 4 eps (defaults)": (jax.jit(curve), (x, y)),
    "curve 4 eps, canonical_convolutions(whole)": (jax.jit(canonical_convolutions(curve)),
                                                   (x, y)),
  }
  print(f"\n=== the engine's loops, SmallCNN, batch {batch} (1-min load "
        f"{os.getloadavg()[0]:.1f}) ===")
  compile_s = {name: compile_seconds(fn, *args) for name, (fn, args) in fns.items()}
  times = {name: [] for name in fns}
  outs = {}
  for name, (fn, args) in fns.items():
    outs[name] = jax.block_until_ready(fn(*args))
  for _ in range(repeats):
    for name, (fn, args) in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[name].append(time.perf_counter() - start)
  for name in fns:
    out = outs[name]
    flags = (np.asarray(out.success).mean() if hasattr(out, "success")
             else np.asarray(out.robust).mean(axis=1).round(3).tolist())
    print(f"  {name:48s} {min(times[name]) * 1e3:9.1f} ms (compile {compile_s[name]:.1f} s); "
          f"{'success rate' if hasattr(out, 'success') else 'robust accuracy'} {flags}")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batch", type=int, nargs="+", default=[256, 540])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--unroll-k", type=int, default=5,
                      help="steps per body / per host call in the k-step variants (default 5)")
  parser.add_argument("--models", nargs="+", choices=tuple(MODELS),
                      default=["SmallCNN", "strided_conv", "stride1_conv"])
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--hlo", action="store_true", help="print the convolutions' dim_labels")
  parser.add_argument("--xla-flags", action="store_true", help="sweep FLAG_SETS")
  parser.add_argument("--engine", action="store_true",
                      help="time jr.run / jr.robustness_curve with and without the workaround")
  parser.add_argument("--no-tables", action="store_true", help="skip the per-model tables")
  parser.add_argument("--flag-child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.flag_child:
    run_flag_child(args.batch[0], args.steps, args.repeats)
    return 0
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} cores")
  if not args.no_tables:
    for batch in args.batch:
      for name in args.models:
        run_table(name, batch, args.steps, args.unroll_k, args.repeats, args.hlo)
      print(f"  dispatch of a jitted call on a PGD-sized state (batch {batch}): "
            f"{dispatch_overhead(batch, args.repeats) * 1e6:.0f} us per call")
  if args.engine:
    for batch in args.batch:
      run_engine(batch, args.repeats)
  if args.xla_flags:
    run_flag_sweep(args.batch[0], args.steps, max(3, args.repeats // 2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
