#!/usr/bin/env python
"""One PyTorch module, one process, every tool (issue #29, item 4).

The fairest comparison there is: the *same* ``torch.nn.Module`` object is attacked by jaxrobust
(through ``jr.interop.from_torch``: torchax lowers it to JAX, no hand-written mirror) and by the
PyTorch tools themselves, on the same examples and eps grid.

Section ``digits`` (robust accuracy, time, model rows). The module is the PyTorch ``SmallCNN`` of
``bench_peers.torch_port`` holding the frozen demo weights of
``benchmarks/reference/digits_{plain,adversarial}.npz`` (its logits checked against the Flax
model's), the first ``--n`` stored digits test examples (``bench_autoattack.load_examples``),
Linf eps ``--eps`` (default 0.05, 0.1, 0.15, 0.2: the grid of ``bench_autoattack.py``; the digits
are 8x8 images with 16 grey levels, where 8/255 breaks almost nothing). Rows:

* reference AutoAttack (fra31/auto-attack from ``--autoattack-path``), ``version="standard"``,
  one ``run_standard_evaluation`` per eps (``bench_autoattack.reference_eval``: flags checked,
  rows counted with a forward hook);
* jaxrobust ``auto_attack("linf")`` standard and fast on the converted module: one
  ``jr.robustness_curve`` program for the whole grid, jitted with the model's parameters and
  buffers (``model.arguments``) and the data as arguments, compiled ahead of time (compile time
  reported apart from run time), ``chunk_size=--chunk-size``;
* PGD-``--steps`` (relative step 1/4, random start) in jaxrobust (converted module, and the Flax
  model of the same weights for scale), torchattacks ``PGD`` and Foolbox ``LinfPGD``; APGD-CE
  (``--apgd-steps``) in jaxrobust and torchattacks ``APGD``.

Robust accuracy is jaxrobust's convention (clean-correct and not broken at this eps or any
smaller one of the grid) for every row. Rows through the model: jaxrobust with
``jr.metrics.count_evaluations`` (a separate, untimed run), the PyTorch tools with a forward hook
on the module ("grad" when autograd records the call). Goals (issue #29): the interop's robust
count at most the reference's + 1 (of 360) at every eps, its AutoAttack time at most 0.5x the
reference's on the same device.

Section ``wrn`` (per-step cost). A CIFAR-shaped WideResNet (``--wrn``, default WRN-10-2 with
BatchNorm in eval mode, random weights from ``scale_models.build``) in the full-cost regime of
the scale issue (``bench_scale.full_cost_head``: nothing breaks, every step runs for every row):
the PyTorch module is ``bench_scale.torch_model`` around ``scale_models.torch_mirror``, and the
same weights run as the hand-written Flax NNX model. PGD-``--wrn-steps`` (Linf 8/255) and
``--wrn-steps`` raw input gradients: the interop's program against the Flax program (goal: at most
1.10x per step) and against torchattacks ``PGD`` / torch's own gradients on the module.

Times are best of ``--repeats`` where cheap, single runs for AutoAttack; the 1-min load average
(``uptime``) is printed beside every time: the machine is shared, and PyTorch's threads suffer
more from other jobs than XLA's. Examples::

  python benchmarks/bench_torch_models.py --autoattack-path .aa --out /tmp/torch_models.json
  python benchmarks/bench_torch_models.py --quick --autoattack-path .aa
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import numpy as np

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
for _path in (ROOT, BENCH):
  if str(_path) not in sys.path:
    sys.path.insert(0, str(_path))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxrobust as jr  # noqa: E402
import bench_autoattack as aa_bench  # noqa: E402
import bench_peers  # noqa: E402
import bench_scale  # noqa: E402
import min_norm_metrics  # noqa: E402
import scale_models  # noqa: E402

REL_STEP = 0.25
"""PGD's step relative to eps (torchattacks' default 2/255 of 8/255), for every library."""


def uptime() -> str:
  """``uptime``'s load averages (1, 5, 15 min)."""
  try:
    text = subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout
    return text.split("load average:")[-1].strip()
  except (OSError, subprocess.CalledProcessError):
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def compiled_curve(attack, apply, arguments, x, y, epsilons, seed: int, chunk_size):
  """``jr.robustness_curve`` jitted with the model's arrays and the data as arguments, compiled
  ahead of time: ``(run(repeat) -> robust [K, B], compile seconds, rows() -> (fwd, grad))``."""

  def curve(arguments, x, y, eps, key):
    return jr.robustness_curve(attack, functools.partial(apply, arguments), x, y, eps, key,
                               chunk_size=chunk_size).robust

  args = (arguments, jnp.asarray(x), jnp.asarray(y), jnp.asarray(epsilons, jnp.float32))
  start = time.perf_counter()
  compiled = jax.jit(curve).lower(*args, jax.random.key(seed)).compile()
  compile_s = time.perf_counter() - start

  def run(repeat: int) -> np.ndarray:
    return np.asarray(jax.block_until_ready(compiled(*args, jax.random.key(seed + repeat))))

  def rows() -> tuple[int, int]:  # a second program: the counter's callbacks stay out of timings
    counters = []

    def counted(arguments, x, y, eps, key):
      logits_fn, counter = jr.metrics.count_evaluations(functools.partial(apply, arguments))
      counters.append(counter)
      return jr.robustness_curve(attack, logits_fn, x, y, eps, key, chunk_size=chunk_size).robust

    jax.block_until_ready(jax.jit(counted)(*args, jax.random.key(seed)))
    jax.effects_barrier()
    return counters[-1].forward, counters[-1].gradient

  return run, compile_s, rows


def flops_of(compiled) -> float | None:
  """XLA's estimate of a compiled program's floating-point operations (``None`` if absent)."""
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"])
  except Exception:  # noqa: BLE001 - not every backend reports it
    return None


def interop_apply(arguments, x, *, model):
  """The converted module on its arrays ``(params, buffers)``: ``model`` is only the code."""
  return model.with_arguments(arguments)(x)


def jaxrobust_runner(label: str, attack, apply, arguments, problem, chunk_size,
                     warmup: bool) -> bench_peers.Runner:
  run, compile_s, rows = compiled_curve(attack, apply, arguments, problem.x, problem.y,
                                        problem.epsilons, problem.seed, chunk_size)
  if warmup:
    run(0)
  return bench_peers.Runner(label, jr.__version__, attack.name,
                            "one jitted robustness_curve, arrays as arguments", run,
                            {"compile_s": compile_s}, rows)


def torchattacks_apgd_runner(module, problem, steps: int) -> bench_peers.Runner | None:
  try:
    import torch
    import torchattacks
  except ImportError as error:
    print(f"  torchattacks skipped: {error}")
    return None
  xt = torch.from_numpy(bench_peers.nchw(problem.x))
  yt = torch.from_numpy(problem.y.astype(np.int64))
  clean = bench_peers.torch_predict(module, xt) == problem.y

  def attack_at(eps, images, labels):
    return torchattacks.APGD(module, norm="Linf", eps=eps, steps=steps, n_restarts=1, loss="ce",
                             seed=problem.seed)(images, labels).detach().numpy()

  def run(repeat: int) -> np.ndarray:
    torch.manual_seed(problem.seed + repeat)
    return bench_peers._per_eps(problem, module, clean, attack_at, "torchattacks APGD", xt, yt)

  attack_at(float(problem.epsilons[-1]), xt[:8], yt[:8])  # warm-up
  return bench_peers.Runner("torchattacks", torchattacks.__version__, f"APGD-CE {steps}",
                            "APGD, one call per eps", run, {},
                            bench_peers.torch_row_counter(module, run))


def reference_row(aa_module, module, problem, batch_size: int) -> dict[str, Any]:
  """The reference AutoAttack, one run per eps, as a result row of ``bench_peers.measure``."""
  robust, seconds, rows, loads = [], 0.0, {"forward": 0, "gradient": 0}, []
  for eps in problem.epsilons:
    out = aa_bench.reference_eval(aa_module, module, problem.x, problem.y, float(eps),
                                  problem.seed, batch_size)
    robust.append(aa_bench.str_to_flags(out["robust"]))
    seconds += out["time_s"]
    loads += out["load_average"]
    for k in rows:
      rows[k] += out["rows"][k]
    print(f"    reference eps {eps:g}: {out['final_robust_count']} robust, {out['time_s']:.1f} s "
          f"(load {out['load_average'][0]:.2f}->{out['load_average'][1]:.2f})", flush=True)
  robust = np.stack(robust)
  envelope = bench_peers.envelope(robust, problem.epsilons)
  return {"library": "AutoAttack reference", "version": "standard", "setting": "standard",
          "time_s": seconds, "model_rows_forward": rows["forward"],
          "model_rows_gradient": rows["gradient"], "robust_accuracy": robust.mean(1).tolist(),
          "robust_accuracy_envelope": envelope.mean(1).tolist(),
          "robust_count_envelope": envelope.sum(1).tolist(), "load": [min(loads), max(loads)]}


def timed(runners, problem, repeats: int) -> list[dict[str, Any]]:
  """``bench_peers.measure`` with the load average beside each row and robust counts."""
  load_before = uptime()
  results = bench_peers.measure(runners, problem.epsilons, repeats)
  load_after = uptime()
  for result in results:
    result["robust_count_envelope"] = [int(round(a * problem.x.shape[0]))
                                       for a in result["robust_accuracy_envelope"]]
    result["load"] = f"{load_before} -> {load_after}"
  return results


def print_rows(title: str, results: list[dict[str, Any]], n: int) -> None:
  print(f"\n  {title} (robust examples of {n} per eps, envelope; time without compile)")
  for r in results:
    rows = ("-" if r.get("model_rows_forward") is None else
            f"{r['model_rows_forward']:,} + {r['model_rows_gradient']:,}")
    compile_s = f" (+{r['compile_s']:.1f} compile)" if "compile_s" in r else ""
    print(f"    {r['library']:<24} {r['setting']:<22} {str(r['robust_count_envelope']):<22} "
          f"{r['time_s']:8.2f} s{compile_s}  rows fwd+grad {rows}  load {r['load']}", flush=True)


def digits(args, kind: str) -> dict[str, Any]:
  import torch

  params = aa_bench.load_frozen_params(kind)
  module = bench_peers.torch_port(params)  # THE module every tool attacks
  x, y = aa_bench.load_examples(args.n)
  epsilons = np.asarray(args.eps, np.float32)
  diff = float(np.max(np.abs(bench_peers.torch_logits(module, bench_peers.nchw(x))
                             - bench_peers.jax_logits(params, x))))
  start = time.perf_counter()
  model = jr.interop.from_torch(module, torch.from_numpy(bench_peers.nchw(x[:8])))
  convert_s = time.perf_counter() - start
  clean = bench_peers.torch_predict(module, bench_peers.nchw(x)) == y
  print(f"\n=== digits SmallCNN ({kind}) as one PyTorch module: n={args.n}, clean "
        f"{int(clean.sum())}/{args.n}, eps {args.eps}; torch port vs Flax max |dlogit| {diff:.2g}, "
        f"from_torch {convert_s:.1f} s (check error {model.check_error:.2g}) ===", flush=True)
  problem = bench_peers.Problem(x, y, epsilons, "linf", args.steps, args.seed)
  apply = functools.partial(interop_apply, model=model)
  out: dict[str, Any] = {"kind": kind, "clean": int(clean.sum()), "port_diff": diff,
                         "convert_s": convert_s}

  # AutoAttack: the reference, then jaxrobust's suites on the converted module (single runs).
  aa_rows = []
  aa_module, note = aa_bench.import_autoattack(args.autoattack_path)
  if aa_module is None:
    print(f"  reference AutoAttack skipped: {note}")
  else:
    aa_rows.append(reference_row(aa_module, module, problem, args.reference_bs))
    aa_rows[-1]["load"] = f"{aa_rows[-1]['load'][0]:.2f}..{aa_rows[-1]['load'][1]:.2f}"
  runners = [jaxrobust_runner("jaxrobust interop", jr.attacks.auto_attack("linf", version=v),
                              apply, model.arguments, problem, args.chunk_size, warmup=False)
             for v in args.versions]
  for runner in runners:
    print(f"  compiled {runner.setting}: {runner.info['compile_s']:.1f} s", flush=True)
  aa_rows += timed(runners, problem, 1)
  print_rows("AutoAttack", aa_rows, args.n)
  out["autoattack"] = aa_rows

  # PGD and APGD: every tool on the same module (the Flax model for scale).
  flax_apply = lambda p, v: aa_bench.flax_model("cnn").apply(p, v)
  pgd = jr.attacks.pgd("linf", steps=args.steps, step_size=REL_STEP, random_start=True,
                       restarts=1, loss="ce")
  runners = [jaxrobust_runner("jaxrobust interop", pgd, apply, model.arguments, problem,
                              args.chunk_size, warmup=True),
             jaxrobust_runner("jaxrobust Flax", pgd, flax_apply, params, problem,
                              args.chunk_size, warmup=True),
             bench_peers.torchattacks_runner(module, problem, REL_STEP, True),
             bench_peers.foolbox_runner(module, problem, REL_STEP, True)]
  apgd = jr.attacks.apgd("linf", loss="ce", steps=args.apgd_steps)
  runners += [jaxrobust_runner("jaxrobust interop", apgd, apply, model.arguments, problem,
                               args.chunk_size, warmup=True),
              torchattacks_apgd_runner(module, problem, args.apgd_steps)]
  results = timed([r for r in runners if r is not None], problem, args.repeats)
  print_rows(f"PGD-{args.steps} and APGD-CE-{args.apgd_steps}", results, args.n)
  out["gradient_attacks"] = results
  out["goals"] = digits_goals(aa_rows, args.n)
  return out


def digits_goals(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
  reference = next((r for r in rows if r["library"] == "AutoAttack reference"), None)
  if reference is None:
    return {}
  goals = {}
  for r in rows:
    if r is reference:
      continue
    excess = max(a - b for a, b in zip(r["robust_count_envelope"],
                                       reference["robust_count_envelope"]))
    ratio = r["time_s"] / reference["time_s"]
    with_compile = (r["time_s"] + r.get("compile_s", 0.0)) / reference["time_s"]
    goals[r["setting"]] = {"max_excess": excess, "strength_met": excess <= 1,
                           "time_ratio": ratio, "time_ratio_with_compile": with_compile,
                           "time_met": ratio <= 0.5}
    print(f"  goal {r['setting']}: robust count - reference's <= {excess:+d} (<= +1 of {n}: "
          f"{'met' if excess <= 1 else 'MISSED'}); time {ratio:.2f}x the reference "
          f"({with_compile:.2f}x with compile; <= 0.5x: {'met' if ratio <= 0.5 else 'MISSED'})")
  return goals


def wrn(args) -> dict[str, Any]:
  import torch
  import torchattacks

  name, batch, steps = args.wrn, args.wrn_batch, args.wrn_steps
  flax_model = bench_scale.build_model(name, True, args.seed)
  mirror = scale_models.torch_mirror(name, flax_model.module, use_bn=True)
  module = bench_scale.torch_model(mirror, "float32", "full", "cpu")  # THE module
  x, y = bench_scale.make_data(flax_model, "float32", "full", batch, args.seed)
  xt, yt = torch.from_numpy(bench_peers.nchw(np.asarray(x))), torch.from_numpy(
      np.asarray(y, np.int64))
  model = jr.interop.from_torch(module, xt[:2])
  flax_apply, state = flax_model.apply("float32", "full"), flax_model.state["float32"]
  rel = float(np.max(np.abs(np.asarray(model(x)) - np.asarray(flax_apply(state, x)))))
  print(f"\n=== {name} (BatchNorm, random weights, full-cost head), batch {batch}, "
        f"PGD-{steps} Linf 8/255; interop vs Flax max |dlogit| {rel:.2g} ===", flush=True)
  eps, key = jnp.float32(8 / 255), jax.random.key(args.seed)
  sides = {"interop": (functools.partial(interop_apply, model=model), model.arguments),
           "flax": (flax_apply, state)}
  out: dict[str, Any] = {"model": name, "batch": batch, "steps": steps, "logit_diff": rel,
                         "rows": []}

  def record(side, program, seconds, compile_s, rows):
    out["rows"].append({"side": side, "program": program, "time_s": seconds,
                        "per_step_ms": 1e3 * seconds / steps, "compile_s": compile_s,
                        "rows": rows, "load": uptime()})
    print(f"  {side:<8} {program:<26} {seconds:7.3f} s = {1e3 * seconds / steps:7.1f} ms/step"
          + (f" (compile {compile_s:.1f} s)" if compile_s is not None else "")
          + f"  rows {rows}  load {out['rows'][-1]['load']}", flush=True)

  program = bench_scale.pgd_program(bench_scale.pgd_attack("linf", steps), early_exit=True)
  jobs = []  # (side, program, run, compile seconds, rows): compiled first, timed round-robin
  flops = {}  # XLA's own count of each compiled program's FLOPs: a load-free comparison
  for side, (apply, arguments) in sides.items():
    compiled, info = bench_scale.compile_program(bench_scale.input_gradient(apply), arguments,
                                                 x, y)
    jobs.append((side, f"{steps} x input gradient", functools.partial(compiled, arguments, x, y),
                 info["compile_s"], {"forward": 0, "gradient": steps * batch}, steps))
    flops[(side, "gradient")] = flops_of(compiled)
    compiled, info = bench_scale.compile_program(bench_scale.with_state(program, apply),
                                                 arguments, x, y, eps, key)
    if np.any(np.asarray(compiled(arguments, x, y, eps, key))):
      raise AssertionError("the full-cost regime lost points to PGD")
    flops[(side, "pgd")] = flops_of(compiled)
    rows = bench_scale.count_rows(program, apply, arguments, x, y, eps, key)
    jobs.append((side, f"jaxrobust PGD-{steps}", functools.partial(compiled, arguments, x, y, eps,
                                                                   key),
                 info["trace_lower_s"] + info["compile_s"], rows, 1))

  def torch_gradients():
    for _ in range(steps):
      v = xt.clone().requires_grad_(True)
      loss = torch.nn.functional.cross_entropy(module(v), yt, reduction="sum")
      torch.autograd.grad(loss, v)

  attack = torchattacks.PGD(module, eps=8 / 255, alpha=REL_STEP * 8 / 255, steps=steps,
                            random_start=True)
  for program_name, fn in ((f"{steps} x input gradient", torch_gradients),
                           (f"torchattacks PGD-{steps}", lambda: attack(xt, yt))):
    with bench_scale.torch_rows(module) as rows:
      fn()  # warm-up and count
    jobs.append(("torch", program_name, fn, None, dict(rows), 1))
  times = [[] for _ in jobs]
  for _ in range(args.repeats):  # interleaved, so background load hits every side alike
    for i, (_, _, fn, _, _, calls) in enumerate(jobs):
      start = time.perf_counter()
      for _ in range(calls):
        jax.block_until_ready(fn())
      times[i].append(time.perf_counter() - start)
  for (side, name, _, compile_s, rows, _), t in zip(jobs, times):
    record(side, name, min(t), compile_s, rows)
  by = {(r["side"], r["program"].split(" ")[-1]): r["time_s"] for r in out["rows"]}
  ratio = by[("interop", f"PGD-{steps}")] / by[("flax", f"PGD-{steps}")]
  raw_ratio = by[("interop", "gradient")] / by[("flax", "gradient")]
  torch_ratio = by[("interop", f"PGD-{steps}")] / by[("torch", f"PGD-{steps}")]
  flop_ratios = {k: flops[("interop", k)] / flops[("flax", k)] for k in ("gradient", "pgd")
                 if flops.get(("interop", k)) and flops.get(("flax", k))}
  print(f"  XLA cost analysis, interop / Flax FLOPs: {flop_ratios} "
        f"({ {k: f'{v:.3g}' for k, v in flops.items()} })")
  out["flops"] = {f"{a} {b}": v for (a, b), v in flops.items()}
  out["goals"] = {"interop_over_flax_flops": flop_ratios, "interop_over_flax_pgd": ratio,
                  "interop_over_flax_gradients": raw_ratio,
                  "interop_over_torchattacks_pgd": torch_ratio, "per_step_met": ratio <= 1.10}
  print(f"  goal: interop / Flax per PGD step {ratio:.3f} (<= 1.10: "
        f"{'met' if ratio <= 1.10 else 'MISSED'}); raw gradients {raw_ratio:.3f}; interop / "
        f"torchattacks {torch_ratio:.3f}", flush=True)
  return out


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sections", nargs="+", choices=("digits", "wrn"), default=["digits", "wrn"])
  p.add_argument("--model", choices=("plain", "adversarial", "both"), default="plain")
  p.add_argument("--n", type=int, default=360, help="first n stored digits test examples")
  p.add_argument("--eps", type=float, nargs="+", default=list(aa_bench.DEFAULT_EPS))
  p.add_argument("--versions", nargs="*", choices=("standard", "fast"),
                 default=["standard", "fast"], help="jaxrobust AutoAttack suites")
  p.add_argument("--steps", type=int, default=20, help="PGD steps")
  p.add_argument("--apgd-steps", type=int, default=100)
  p.add_argument("--chunk-size", type=int, default=64)
  p.add_argument("--reference-bs", type=int, default=500)
  p.add_argument("--autoattack-path", default=os.environ.get("AUTOATTACK_PATH"))
  p.add_argument("--wrn", default="wrn-10-2", help="wrn-DEPTH-WIDTH, CIFAR-shaped")
  p.add_argument("--wrn-batch", type=int, default=32)
  p.add_argument("--wrn-steps", type=int, default=10)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--torch-threads", type=int, default=1,
                 help="PyTorch's threads (1, as bench_autoattack: 2 collapse under load)")
  p.add_argument("--quick", action="store_true",
                 help="n=100, eps 0.1 0.2, PGD-10, APGD-20, WRN batch 8 x 5 steps, 2 repeats")
  p.add_argument("--out", type=pathlib.Path, default=None)
  if p.parse_known_args(argv)[0].quick:  # smaller defaults; options given explicitly still win
    p.set_defaults(n=100, eps=[0.1, 0.2], steps=10, apgd_steps=20, wrn_batch=8, wrn_steps=5,
                   repeats=2, chunk_size=32)
  return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  min_norm_metrics.print_machine(argv, args.torch_threads)
  print(f"load average (uptime): {uptime()}")
  start = time.perf_counter()
  out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
  if "digits" in args.sections:
    kinds = ["plain", "adversarial"] if args.model == "both" else [args.model]
    out["digits"] = [digits(args, kind) for kind in kinds]
  if "wrn" in args.sections:
    out["wrn"] = wrn(args)
  out["wall_s"] = time.perf_counter() - start
  out["process_cpu_s"] = time.process_time()
  print(f"\nwall {out['wall_s']:.0f} s, process CPU {out['process_cpu_s']:.0f} s; load average "
        f"(uptime): {uptime()}")
  if args.out is not None:
    args.out.write_text(json.dumps(out, indent=1, default=str))
  return 0


if __name__ == "__main__":
  sys.exit(main())
