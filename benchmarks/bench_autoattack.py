#!/usr/bin/env python
"""Cross-check of ``jr.attacks.auto_attack("linf")`` against the reference AutoAttack (PyTorch).

Both sides attack the same demo digits model (``SmallCNN``, plain or adversarially trained) on
the same test examples at the same Linf radii, and report the *cumulative* robust accuracy after
each member of the standard suite (APGD-CE, APGD-T with 9 targets, FAB-T with 9 targets, Square
with 5000 queries): row ``m`` counts the examples that are clean-correct and not broken by members
``0..m``, which is what AutoAttack's ``run_standard_evaluation`` logs as "robust accuracy after
X". An attack that finds at least as many adversarial points as the reference has, after every
member,

    robust_jaxrobust[m] <= robust_reference[m] + tolerance      (tolerance: 2 examples)

and the script prints ``eps | member | reference | jaxrobust | diff`` with PASS/FAIL per row.

Sides.

* Reference: fra31/auto-attack (imported from ``--autoattack-path`` or ``$AUTOATTACK_PATH``;
  never vendored), ``version="standard"``, a fixed seed, CPU, ``verbose=False``, one
  ``AutoAttack`` object per eps. The torch port of the Flax model comes from
  ``bench_peers.torch_port``; its logits are checked against JAX's before anything runs.
  The per-member flags are captured without parsing logs: ``run_standard_evaluation`` calls
  ``state.add_run_attack(name)`` on its ``EvaluationState`` right after each member has updated
  ``state.robust_flags``; the script swaps in a subclass of ``EvaluationState`` (for the duration
  of the call only) whose ``add_run_attack`` also records a copy of the flags. Members skipped
  because nothing was left robust keep the last flags. The final flags are re-derived by
  predicting the returned points and must equal the last recorded row; the points must lie in
  the box and the eps-ball.
* jaxrobust: ``jr.run(auto_attack, ...)`` per eps (``result.info["robust_after"]`` gives the
  per-member breakdown) and the whole curve with ``jr.robustness_curve`` (compile time separately,
  then the compiled program, timed).

By default both sides use the frozen weights in ``benchmarks/reference/digits_{plain,adversarial}
.npz`` and the examples stored in ``benchmarks/reference/digits_examples.npz`` (the first 360
examples of the demo's digits test split), so the stored reference numbers stay valid even if
re-training were not bitwise reproducible. ``--weights train`` uses ``jaxrobust.demo.train``
instead (as ``bench_peers.py`` does); ``--freeze`` rewrites the frozen files from it.

Examples::

  # measure the reference (slow: minutes per eps on CPU) and store it
  python benchmarks/bench_autoattack.py --reference-only --autoattack-path /tmp/autoattack_ref \\
      --out benchmarks/reference/autoattack_digits.json
  # compare jaxrobust with the stored reference numbers
  python benchmarks/bench_autoattack.py --jaxrobust-only

Fast version and model rows (issue #16). ``--version standard fast`` also runs
``auto_attack("linf", version="fast")`` (APGD on the probability-margin loss, then APGD-T towards
MALT's nearest targets) on the jaxrobust side; its final robust counts are compared with the
reference's final counts (same tolerance). Both sides count the rows that go through the model,
with and without a backward pass: jaxrobust with :func:`jaxrobust.metrics.count_evaluations`
(one extra, untimed run of the curve on the counted model), the reference with a forward hook on
the torch model (a row counts as "gradient" when autograd records the call: grad enabled and the
input requires grad). ``--arch mlp`` attacks ``bench_peers.DigitsMLP`` (64-128-64-10, trained
with a fixed seed by ``bench_peers.train_mlp``) instead of the CNN; its reference numbers are not
stored, so run both sides::

  python benchmarks/bench_autoattack.py --arch mlp --version standard fast \\
      --autoattack-path /tmp/autoattack_ref --out /tmp/aa_mlp.json

Timings are only meaningful while nothing else loads the cores; the 1-min load average is
recorded before and after every measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import hashlib
import io
import json
import os
import pathlib
import platform
import sys
import time
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = pathlib.Path(__file__).resolve().parent
for _path in (ROOT, BENCH):
  if str(_path) not in sys.path:
    sys.path.insert(0, str(_path))

import jax
import jax.numpy as jnp

import jaxrobust as jr
from jaxrobust.demo.model import SmallCNN

REFERENCE_DIR = BENCH / "reference"
DEFAULT_JSON = REFERENCE_DIR / "autoattack_digits.json"
EXAMPLES_FILE = REFERENCE_DIR / "digits_examples.npz"
MEMBERS = ("apgd-ce", "apgd-t", "fab-t", "square")
"""AutoAttack's standard Linf suite, in the order it runs."""
FAST_MEMBERS = ("apgd-pm", "apgd-t-malt")
"""jaxrobust's ``version="fast"``, in the order it runs."""
DEFAULT_EPS = (0.05, 0.1, 0.15, 0.2)
DEFAULT_N = 360
TOLERANCE = 2
"""Examples by which jaxrobust's robust count may exceed the reference's before FAIL."""
PORT_TOLERANCE = 1e-4
PIXEL_LEVELS = 16
"""The digits are 4-bit images: every pixel is ``k / 16``; stored as the integers ``k``."""


# ------------------------------------------------------------------------------------------------
# Frozen weights and examples.


def weights_path(kind: str) -> pathlib.Path:
  return REFERENCE_DIR / f"digits_{kind}.npz"


def save_params(params: Any, path: pathlib.Path) -> None:
  """Writes the flax variables ``{"params": {layer: {name: array}}}`` as ``layer/name`` arrays."""
  flat = {f"{layer}/{name}": np.asarray(value, np.float32)
          for layer, leaves in jax.device_get(params)["params"].items()
          for name, value in leaves.items()}
  path.parent.mkdir(parents=True, exist_ok=True)
  np.savez_compressed(path, **flat)


def load_frozen_params(kind: str) -> dict[str, Any]:
  """The flax variables of the frozen demo model ``kind`` ("plain" or "adversarial")."""
  params: dict[str, dict[str, jax.Array]] = {}
  with np.load(weights_path(kind)) as data:
    for key in data.files:
      layer, name = key.split("/")
      params.setdefault(layer, {})[name] = jnp.asarray(data[key])
  return {"params": params}


def load_params(kind: str, source: str, arch: str = "cnn") -> Any:
  if arch == "mlp":  # trained with a fixed seed in seconds; never frozen
    from bench_peers import train_mlp

    return train_mlp(kind == "adversarial")
  if source == "frozen":
    return load_frozen_params(kind)
  from jaxrobust.demo.train import train

  return train(kind == "adversarial", progress=False)


def save_examples(n: int) -> None:
  from bench_peers import load_examples

  x, y = load_examples(n)
  levels = np.rint(x * PIXEL_LEVELS)
  if not np.array_equal(levels / PIXEL_LEVELS, x):
    raise AssertionError("the digits are no longer multiples of 1/16")
  np.savez_compressed(EXAMPLES_FILE, x_levels=levels.astype(np.uint8), y=y.astype(np.int32))


def load_examples(n: int) -> tuple[np.ndarray, np.ndarray]:
  """The first ``n`` stored examples: ``x`` float32 ``[n, 8, 8, 1]`` in [0, 1], ``y`` int32."""
  with np.load(EXAMPLES_FILE) as data:
    x = data["x_levels"].astype(np.float32) / np.float32(PIXEL_LEVELS)
    y = data["y"].astype(np.int32)
  if not 0 < n <= x.shape[0]:
    raise SystemExit(f"--n must be in 1..{x.shape[0]} (the stored examples), got {n}")
  return np.ascontiguousarray(x[:n]), np.ascontiguousarray(y[:n])


def sha256_file(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def flags_to_str(flags: np.ndarray) -> str:
  return "".join("1" if f else "0" for f in np.asarray(flags, bool).ravel())


def str_to_flags(s: str) -> np.ndarray:
  return np.frombuffer(s.encode("ascii"), np.uint8) == ord("1")


def flax_model(arch: str):
  if arch == "mlp":
    from bench_peers import DigitsMLP

    return DigitsMLP()
  return SmallCNN()


def jax_logits(params: Any, x: np.ndarray, arch: str = "cnn") -> np.ndarray:
  return np.asarray(jax.jit(flax_model(arch).apply)(params, jnp.asarray(x)))


def load_average() -> float:
  return float(os.getloadavg()[0])


# ------------------------------------------------------------------------------------------------
# Reference side.


def import_autoattack(path: str | None):
  """``(AutoAttack module, note)``; the module is ``None`` (with the reason) when unavailable."""
  if path:
    if not pathlib.Path(path, "autoattack").is_dir():
      return None, f"no autoattack package under {path!r}"
    if path not in sys.path:
      sys.path.insert(0, path)
  try:
    import autoattack.autoattack as aa_module
  except ImportError as error:
    return None, f"AutoAttack not importable ({error}); pass --autoattack-path"
  return aa_module, "ok"


def autoattack_commit(path: str | None) -> str:
  """The commit of the AutoAttack checkout, if it is a git checkout; else the pinned one."""
  if path:
    head = pathlib.Path(path, ".git", "HEAD")
    if head.is_file():
      ref = head.read_text().strip()
      if ref.startswith("ref: "):
        target = pathlib.Path(path, ".git", ref[5:])
        if target.is_file():
          return target.read_text().strip()
      return ref
  return os.environ.get("AUTOATTACK_COMMIT", "a39220048b3c9f2cca9a4d3a54604793c68eca7e (stated)")


@contextlib.contextmanager
def counting_rows(model):
  """A forward hook on ``model`` counting rows: ``{"forward": ..., "gradient": ...}``.

  A call counts as "gradient" when autograd records it (grad enabled and the input requires
  grad), i.e. when a backward pass through it can follow; AutoAttack's APGD and FAB call the model
  so for every gradient, and Square and the scoring passes under ``torch.no_grad``.
  """
  import torch

  rows = {"forward": 0, "gradient": 0}

  def hook(module, inputs, output):
    del module, output
    x = inputs[0]
    kind = "gradient" if torch.is_grad_enabled() and x.requires_grad else "forward"
    rows[kind] += int(x.shape[0])

  handle = model.register_forward_hook(hook)
  try:
    yield rows
  finally:
    handle.remove()


@contextlib.contextmanager
def recording_state(aa_module):
  """Swaps ``EvaluationState`` in ``aa_module`` for a subclass recording the flags per member.

  Yields a list that receives ``(member name, robust flags)`` after every completed member.
  """
  original = aa_module.EvaluationState
  records: list[tuple[str, np.ndarray]] = []

  class RecordingState(original):

    def add_run_attack(self, attack: str) -> None:
      super().add_run_attack(attack)
      records.append((attack, self.robust_flags.detach().cpu().numpy().copy()))

  aa_module.EvaluationState = RecordingState
  try:
    yield records
  finally:
    aa_module.EvaluationState = original


def reference_eval(aa_module, model, x: np.ndarray, y: np.ndarray, eps: float, seed: int,
                   batch_size: int) -> dict[str, Any]:
  """One standard AutoAttack evaluation at ``eps``; the per-member flags and the time."""
  import torch
  from bench_peers import nchw, torch_predict

  xt = torch.from_numpy(nchw(x))
  yt = torch.from_numpy(y.astype(np.int64))
  clean = torch_predict(model, xt) == y
  adversary = aa_module.AutoAttack(model, norm="Linf", eps=float(eps), seed=seed, verbose=False,
                                   version="standard", device="cpu")
  if list(adversary.attacks_to_run) != list(MEMBERS):
    raise AssertionError(f"unexpected standard suite {adversary.attacks_to_run}")
  log = io.StringIO()
  load_before = load_average()
  start = time.perf_counter()
  with (recording_state(aa_module) as records, contextlib.redirect_stdout(log),
        counting_rows(model) as model_rows):
    x_adv = adversary.run_standard_evaluation(xt, yt, bs=batch_size)
  seconds = time.perf_counter() - start
  load_after = load_average()

  x_adv = x_adv.detach().numpy()
  dist = float(np.max(np.abs(x_adv - nchw(x))))
  if dist > eps + 1e-5 or x_adv.min() < -1e-6 or x_adv.max() > 1 + 1e-6:
    raise AssertionError(f"reference points leave the threat model at eps={eps} (dist {dist})")
  final = clean & (torch_predict(model, x_adv) == y)

  rows, current = [], clean.copy()
  recorded = dict(records)
  for name in MEMBERS:  # a member skipped because nothing was robust keeps the previous flags
    if name in recorded:
      current = recorded[name].astype(bool)
    rows.append(current)
  robust_after = np.stack(rows)
  if not np.array_equal(robust_after[-1], final):
    raise AssertionError(f"eps={eps}: the recorded flags after Square disagree with predicting "
                         "the returned points")
  if np.any(robust_after[1:] & ~robust_after[:-1]) or np.any(robust_after[0] & ~clean):
    raise AssertionError(f"eps={eps}: recorded flags are not cumulative")
  n = x.shape[0]
  return {
    "eps": float(eps),
    "robust_accuracy_after": [float(r.mean()) for r in robust_after],
    "robust_count_after": [int(r.sum()) for r in robust_after],
    "robust_after": [flags_to_str(r) for r in robust_after],
    "final_robust_accuracy": float(final.mean()),
    "final_robust_count": int(final.sum()),
    "robust": flags_to_str(final),
    "members_run": [name for name, _ in records],
    "max_linf_perturbation": dist,
    "time_s": seconds,
    "rows": dict(model_rows),
    "load_average": [load_before, load_after],
    "log": [line for line in log.getvalue().splitlines() if line.strip()],
    "n": n,
  }


def run_reference(args, kinds, epsilons, x, y) -> dict[str, Any]:
  aa_module, note = import_autoattack(args.autoattack_path)
  if aa_module is None:
    print(f"reference AutoAttack skipped: {note}")
    return {}
  import torch
  from bench_peers import torch_port

  torch.set_num_threads(args.torch_threads)
  out = {
    "autoattack_commit": autoattack_commit(args.autoattack_path),
    "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
    "seed": args.seed, "norm": "Linf", "version": "standard", "batch_size": args.reference_bs,
    "capture": "EvaluationState.add_run_attack recorded per member (see the module docstring)",
    "models": {},
  }
  for kind in kinds:
    params = load_params(kind, args.weights, args.arch)
    if args.arch == "mlp":
      from bench_peers import torch_mlp_port

      model = torch_mlp_port(params)
    else:
      model = torch_port(params)
    from bench_peers import nchw, torch_logits

    diff = float(np.max(np.abs(torch_logits(model, nchw(x)) - jax_logits(params, x, args.arch))))
    if not diff <= PORT_TOLERANCE:
      raise AssertionError(f"the torch port disagrees with the Flax model by {diff:g}")
    clean = np.argmax(jax_logits(params, x, args.arch), -1) == y
    print(f"\n=== reference AutoAttack, {args.arch} {kind} model: clean accuracy "
          f"{clean.mean():.4f} ({int(clean.sum())}/{x.shape[0]}); torch port max |dlogits| "
          f"{diff:.2g} ===")
    per_eps, total = [], 0.0
    for eps in epsilons:
      result = reference_eval(aa_module, model, x, y, float(eps), args.seed, args.reference_bs)
      total += result["time_s"]
      per_eps.append(result)
      print(f"  eps={eps:.4g}: robust after " + ", ".join(
        f"{m} {c}" for m, c in zip(MEMBERS, result["robust_count_after"]))
        + f" (of {x.shape[0]}); {result['time_s']:.1f} s, load {result['load_average'][0]:.1f}"
        f"->{result['load_average'][1]:.1f}; rows {result['rows']}", flush=True)
    out["models"][kind] = {"clean_accuracy": float(clean.mean()), "clean": flags_to_str(clean),
                           "torch_port_max_abs_logit_diff": diff, "eps": per_eps,
                           "total_time_s": total,
                           "rows": {k: sum(r["rows"][k] for r in per_eps)
                                    for k in ("forward", "gradient")}}
  return out


# ------------------------------------------------------------------------------------------------
# jaxrobust side.


def jaxrobust_attack(version: str = "standard"):
  factory = getattr(jr.attacks, "auto_attack", None)
  if factory is None:
    raise SystemExit("jaxrobust side unavailable: jr.attacks.auto_attack does not exist yet "
                     "(use --reference-only to measure the reference alone)")
  return factory("linf", version=version)


def count_curve_rows(attack, model, params, x, y, eps, key, chunk_size) -> dict[str, int]:
  """Rows through the model in one run of the curve (an extra, untimed run on a counted model)."""
  counted, counter = jr.metrics.count_evaluations(functools.partial(model.apply, params))
  jax.block_until_ready(jax.jit(lambda x, y, eps, key: jr.robustness_curve(
    attack, counted, x, y, eps, key, chunk_size=chunk_size).robust)(x, y, eps, key))
  jax.effects_barrier()
  return {"forward": counter.forward, "gradient": counter.gradient}


def run_jaxrobust(args, kinds, epsilons, x, y, version: str = "standard") -> dict[str, Any]:
  attack = jaxrobust_attack(version)
  members = MEMBERS if version == "standard" else FAST_MEMBERS
  model = flax_model(args.arch)
  out: dict[str, Any] = {"version": jr.__version__, "suite": version, "members": list(members),
                         "attack": attack.name, "seed": args.seed, "models": {}}
  xj, yj = jnp.asarray(x), jnp.asarray(y)
  for kind in kinds:
    params = load_params(kind, args.weights, args.arch)

    @jax.jit
    def run_fn(params, x, y, eps, key):
      result = jr.run(attack, functools.partial(model.apply, params), x, y, jr.Budget(eps), key,
                      chunk_size=args.chunk_size)
      info = getattr(result, "info", None)
      if info is None or "robust_after" not in info:
        raise SystemExit("jaxrobust side unavailable: AttackResult.info['robust_after'] missing")
      return info["robust_after"], result.success

    @jax.jit
    def curve_fn(params, x, y, eps, key):
      return jr.robustness_curve(attack, functools.partial(model.apply, params), x, y, eps, key,
                                 chunk_size=args.chunk_size)

    key = jax.random.key(args.seed)
    print(f"\n=== jaxrobust auto_attack {version}, {args.arch} {kind} model ===")
    start = time.perf_counter()
    compiled_run = run_fn.lower(params, xj, yj, jnp.float32(epsilons[0]), key).compile()
    run_compile = time.perf_counter() - start
    per_eps = []
    for eps in epsilons:
      load_before = load_average()
      start = time.perf_counter()
      robust_after, success = jax.block_until_ready(
        compiled_run(params, xj, yj, jnp.float32(eps), key))
      seconds = time.perf_counter() - start
      robust_after = np.asarray(robust_after, bool)
      if robust_after.shape != (len(members), x.shape[0]):
        raise AssertionError(f"info['robust_after'] has shape {robust_after.shape}, expected "
                             f"{(len(members), x.shape[0])}")
      final = ~np.asarray(success, bool)
      if not np.array_equal(final, robust_after[-1]):
        raise AssertionError(f"eps={eps}: robust_after[-1] disagrees with ~result.success")
      per_eps.append({
        "eps": float(eps), "robust_count_after": [int(r.sum()) for r in robust_after],
        "robust_accuracy_after": [float(r.mean()) for r in robust_after],
        "robust": flags_to_str(final), "time_s": seconds,
        "load_average": [load_before, load_average()],
      })
      print(f"  eps={eps:.4g}: robust after " + ", ".join(
        f"{m} {c}" for m, c in zip(members, per_eps[-1]["robust_count_after"]))
        + f"; {seconds:.1f} s", flush=True)
    eps_arr = jnp.asarray(epsilons, jnp.float32)
    start = time.perf_counter()
    compiled_curve = curve_fn.lower(params, xj, yj, eps_arr, key).compile()
    curve_compile = time.perf_counter() - start
    load_before = load_average()
    start = time.perf_counter()
    curve = jax.block_until_ready(compiled_curve(params, xj, yj, eps_arr, key))
    curve_s = time.perf_counter() - start
    curve_load = [load_before, load_average()]
    rows = count_curve_rows(attack, model, params, xj, yj, eps_arr, key, args.chunk_size)
    out["models"][kind] = {
      "eps": per_eps, "run_compile_s": run_compile,
      "curve": {"robust_accuracy": np.asarray(curve.robust_accuracy).tolist(),
                "robust_count": np.asarray(curve.robust).sum(1).tolist(),
                "compile_s": curve_compile, "time_s": curve_s, "rows": rows,
                "load_average": curve_load},
    }
    print(f"  run compile {run_compile:.1f} s; curve compile {curve_compile:.1f} s, "
          f"curve {curve_s:.1f} s (load {curve_load[0]:.1f}->{curve_load[1]:.1f}); "
          f"curve rows {rows}")
  return out


# ------------------------------------------------------------------------------------------------
# Report.


def compare(reference: dict[str, Any], ours: dict[str, Any], n: int) -> tuple[str, bool, int]:
  """The eps | member | reference | jaxrobust | diff table (counts of ``n``), whether every row
  passes, and how many rows were compared (the reference's flags are sliced to the first ``n``)."""
  lines = []
  ok, compared = True, 0
  for kind, mine in ours["models"].items():
    ref_model = reference.get("models", {}).get(kind)
    if ref_model is None:
      lines.append(f"\n{kind}: no reference numbers for this model")
      continue
    ref_by_eps = {round(r["eps"], 6): r for r in ref_model["eps"]}
    lines.append(f"\n{kind} model ({n} examples; counts of robust examples; FAIL if jaxrobust "
                 f"> reference + {TOLERANCE})")
    lines.append("| eps | member | reference | jaxrobust | diff | |")
    lines.append("|---|---|---|---|---|---|")
    fast = ours.get("suite", "standard") != "standard"
    for row in mine["eps"]:
      ref = ref_by_eps.get(round(row["eps"], 6))
      if ref is None or ref["n"] < n:
        lines.append(f"| {row['eps']:.4g} | - | (no reference) | | | |")
        continue
      ref_after = [int(str_to_flags(s)[:n].sum()) for s in ref["robust_after"]]
      pairs = zip(MEMBERS, ref_after, row["robust_count_after"])
      if fast:  # other members: compare the final counts only
        pairs = [("final (fast)", ref_after[-1], row["robust_count_after"][-1])]
      for member, r, j in pairs:
        verdict = "PASS" if j <= r + TOLERANCE else "FAIL"
        ok &= verdict == "PASS"
        compared += 1
        lines.append(f"| {row['eps']:.4g} | {member} | {r} | {j} | {j - r:+d} | {verdict} |")
    ref_env, our_env = [], mine["curve"]["robust_count"]
    order = np.argsort([row["eps"] for row in mine["eps"]], kind="stable")
    broken = np.zeros(n, bool)
    for k in order:  # the reference's worst case over the smaller eps, as robustness_curve counts
      ref = ref_by_eps.get(round(mine["eps"][k]["eps"], 6))
      if ref is None or ref["n"] < n:
        break
      broken |= ~str_to_flags(ref["robust"])[:n]
      ref_env.append((k, int((~broken).sum())))
    if len(ref_env) == len(mine["eps"]):
      lines.append("curve (robust at eps and every smaller eps): "
                   + ", ".join(f"eps={mine['eps'][k]['eps']:.4g} reference {c} jaxrobust "
                               f"{our_env[k]}" for k, c in ref_env))
    ref_total = sum(r["time_s"] for r in ref_model["eps"]
                    if any(abs(r["eps"] - e["eps"]) < 1e-9 for e in mine["eps"]))
    curve = mine["curve"]
    if ref_total > 0:
      lines.append(f"time: jaxrobust curve {curve['time_s']:.1f} s (+ compile "
                   f"{curve['compile_s']:.1f} s) / reference total {ref_total:.1f} s = "
                   f"{curve['time_s'] / ref_total:.3f} (with compile "
                   f"{(curve['time_s'] + curve['compile_s']) / ref_total:.3f})")
    ref_rows = ref_model.get("rows")
    if ref_rows and curve.get("rows") and ref_model["eps"][0]["n"] == n:
      ours_total = curve["rows"]["forward"] + curve["rows"]["gradient"]
      ref_sum = ref_rows["forward"] + ref_rows["gradient"]
      lines.append(f"rows: jaxrobust curve {curve['rows']} = {ours_total} / reference per-eps "
                   f"runs {ref_rows} = {ref_sum}: {ours_total / max(ref_sum, 1):.3f}")
  return "\n".join(lines), ok, compared


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", choices=("plain", "adversarial", "both"), default="both")
  parser.add_argument("--arch", choices=("cnn", "mlp"), default="cnn",
                      help="cnn: the frozen demo SmallCNN; mlp: bench_peers.DigitsMLP trained "
                           "with a fixed seed (no stored reference: run both sides)")
  parser.add_argument("--version", nargs="+", choices=("standard", "fast"),
                      default=["standard"], help="jaxrobust suites to run (default standard)")
  parser.add_argument("--n", type=int, default=DEFAULT_N, help="first n stored test examples")
  parser.add_argument("--eps", default=",".join(str(e) for e in DEFAULT_EPS),
                      help="comma-separated Linf radii (default %(default)s)")
  parser.add_argument("--autoattack-path", default=os.environ.get("AUTOATTACK_PATH"),
                      help="directory holding the fra31/auto-attack checkout (default "
                           "$AUTOATTACK_PATH)")
  parser.add_argument("--out", type=pathlib.Path, default=None,
                      help="write the measured figures as JSON")
  parser.add_argument("--reference-json", type=pathlib.Path, default=DEFAULT_JSON,
                      help="stored reference numbers, read by --jaxrobust-only")
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--reference-only", action="store_true")
  mode.add_argument("--jaxrobust-only", action="store_true")
  parser.add_argument("--weights", choices=("frozen", "train"), default="frozen",
                      help="frozen: benchmarks/reference/digits_*.npz; train: jaxrobust.demo")
  parser.add_argument("--freeze", action="store_true",
                      help="(re)write the frozen weights and examples from jaxrobust.demo, exit")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--reference-bs", type=int, default=500,
                      help="AutoAttack's batch size (default 500: one batch)")
  parser.add_argument("--torch-threads", type=int, default=1,
                      help="torch.set_num_threads for the reference (default 1: on a loaded "
                           "2-core machine two OpenMP threads ran AutoAttack 9x slower)")
  parser.add_argument("--chunk-size", type=int, default=0,
                      help="jaxrobust's compute skipping and early exit: survivors run in chunks "
                           "of at most this many rows (0, the default: the library's default, "
                           "64 rows on CPU)")
  args = parser.parse_args(argv)
  args.chunk_size = args.chunk_size or None
  kinds = ["plain", "adversarial"] if args.model == "both" else [args.model]

  if args.arch == "mlp" and args.jaxrobust_only:
    raise SystemExit("--arch mlp has no stored reference numbers: drop --jaxrobust-only")
  if args.freeze:
    from jaxrobust.demo.train import train

    for kind in ("plain", "adversarial"):
      save_params(train(kind == "adversarial", progress=False), weights_path(kind))
      print(f"wrote {weights_path(kind)}")
    save_examples(540)
    print(f"wrote {EXAMPLES_FILE}")
    return 0

  epsilons = [float(e) for e in args.eps.split(",") if e.strip()]
  x, y = load_examples(args.n)
  cores = os.cpu_count() or 1
  machine = f"{cores} cores ({platform.processor() or platform.machine()}), jax {jax.__version__}"
  print(f"machine: {machine}; {x.shape[0]} examples; Linf eps {epsilons}; weights {args.weights}")
  report: dict[str, Any] = {
    "command": "python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:])),
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "machine": machine, "n": int(x.shape[0]), "epsilons": epsilons, "members": list(MEMBERS),
    "data": {"file": EXAMPLES_FILE.name, "sha256": sha256_file(EXAMPLES_FILE),
             "meaning": "first n examples of jaxrobust.demo.data.load_digits() test split"},
    "weights": {kind: {"source": args.weights, **({"file": weights_path(kind).name,
                                                     "sha256": sha256_file(weights_path(kind))}
                                                    if args.weights == "frozen" else {})}
                for kind in kinds},
    "arch": args.arch,
  }
  if args.arch == "mlp":
    from bench_peers import params_digest

    report["weights"] = {kind: {"source": "bench_peers.train_mlp", "digest": params_digest(
      load_params(kind, args.weights, "mlp"))} for kind in kinds}
  if not args.jaxrobust_only:
    report["reference"] = run_reference(args, kinds, epsilons, x, y)
  if not args.reference_only:
    if args.jaxrobust_only:
      stored = json.loads(args.reference_json.read_text())
      reference = stored.get("reference", {})
      for kind in kinds:
        if stored.get("weights", {}).get(kind) != report["weights"][kind]:
          print(f"WARNING: {args.reference_json} was measured on other {kind} weights "
                f"({stored.get('weights', {}).get(kind)}); the comparison is not meaningful")
      if stored.get("data", {}).get("sha256") != report["data"]["sha256"]:
        print(f"WARNING: {args.reference_json} was measured on other examples")
    else:
      reference = report.get("reference", {})
    ok, compared = True, 0
    for version in args.version:
      field = "jaxrobust" if version == "standard" else f"jaxrobust_{version}"
      report[field] = run_jaxrobust(args, kinds, epsilons, x, y, version)
      table, version_ok, version_compared = compare(reference, report[field], x.shape[0])
      print(f"\n--- jaxrobust {version} against the reference ---" + table)
      ok &= version_ok
      compared += version_compared
    if compared:
      print(f"\noverall: {'PASS' if ok else 'FAIL'} ({compared} eps/member rows compared)")
      report["pass"] = ok
    else:
      print("\noverall: nothing compared (no reference numbers for these models/eps)")
  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {args.out}")
  return 1 if report.get("pass") is False else 0


if __name__ == "__main__":
  sys.exit(main())
