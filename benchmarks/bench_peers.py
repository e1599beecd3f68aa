#!/usr/bin/env python
"""Side-by-side benchmark: a Linf PGD robustness curve in jaxrobust and in PyTorch peers.

The same `SmallCNN` (the demo's digits model, plain or adversarially trained) is evaluated by

* jaxrobust: ``jr.robustness_curve`` with ``jr.attacks.pgd("linf")``, the whole curve jitted once
  (with the default settings, the ``--jr-eps-batch-size`` ones, and ``eps_batch_size=0,
  unroll=True``, the fastest setting on CPU);
* torchattacks ``PGD`` (one call per eps: it has no multi-eps API);
* Foolbox 3 ``LinfPGD`` (one call with ``epsilons=[...]``, its multi-eps API);
* ART ``ProjectedGradientDescent`` on a ``PyTorchClassifier`` (one ``generate`` per eps);

with the same eps grid, the same number of steps, the same absolute step ``2.5 * eps / steps``, a
uniform random start and the same test examples. The PyTorch model is a port of the Flax model
with identical weights; its logits are checked against JAX's before anything is timed.

For every library the script reports the wall time of the whole curve (jaxrobust: compile time
separately, then the compiled program after a warm-up call) and the robust accuracy at each eps,
counted as "clean-correct and still correct on the adversarial point". jaxrobust's curve also
takes each example's worst case over the smaller eps of the grid (its curve is non-increasing by
construction); the peers' per-eps figures are shown as they come and with the same envelope.

The peers are optional (``pip install 'jaxrobust[peers]'``); a peer that is not installed is
skipped with a note, so the script runs wherever jaxrobust runs. Example::

  python benchmarks/bench_peers.py --model both --steps 20 --num-eps 8 --eps-max 0.3 \\
      --repeats 5 --out /tmp/peers.json

Timings are only meaningful while nothing else loads the cores: PyTorch's OpenMP threads slow
down many times over when the cores are oversubscribed, XLA far less. The 1-min load average is
printed with every table; repeats are interleaved across libraries and the best one is reported.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxrobust as jr  # noqa: E402
from jaxrobust.demo.model import SmallCNN  # noqa: E402

PORT_TOLERANCE = 1e-4
"""Largest allowed |torch logits - JAX logits| on the benchmark examples."""


# ------------------------------------------------------------------------------------------------
# Model and data.


def load_params(kind: str, *, random_init: bool = False) -> Any:
  """The flax variables of the demo model: ``kind`` is "plain" or "adversarial".

  With ``random_init`` the untrained initialisation is returned instead (a quick smoke test).
  """
  if random_init:
    key = jax.random.key(0 if kind == "plain" else 1)
    return SmallCNN().init(key, jnp.zeros((1, 8, 8, 1), jnp.float32))
  from jaxrobust.demo.train import train

  return train(kind == "adversarial", progress=False)


def load_examples(n: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
  """The first ``n`` (all if ``None``) examples of the digits test split, NHWC float32 in [0, 1]."""
  from jaxrobust.demo.data import load_digits

  _, _, x_test, y_test = load_digits()
  if n is not None:
    if not 0 < n <= x_test.shape[0]:
      raise SystemExit(f"--n must be in 1..{x_test.shape[0]}, got {n}")
    x_test, y_test = x_test[:n], y_test[:n]
  return np.ascontiguousarray(x_test, np.float32), np.ascontiguousarray(y_test, np.int32)


def jax_logits(params: Any, x: np.ndarray) -> np.ndarray:
  return np.asarray(jax.jit(SmallCNN().apply)(params, jnp.asarray(x)))


def torch_port(params: Any):
  """A PyTorch `SmallCNN` (NCHW input ``[N, 1, 8, 8]``) holding exactly the Flax weights.

  Layout notes: Flax conv kernels are HWIO, torch's OIHW; Flax dense kernels are ``[in, out]``,
  torch's ``[out, in]``. XLA's SAME padding of the stride-2 convolution puts the single padding
  row/column at the bottom/right (torch's symmetric ``padding=1`` would shift the sampling grid),
  so the port pads explicitly. The activation is flattened in NHWC order so that dense1's rows
  line up with Flax's.
  """
  import torch
  from torch import nn
  from torch.nn import functional as F

  p = jax.device_get(params["params"])

  class TorchSmallCNN(nn.Module):

    def __init__(self):
      super().__init__()
      self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
      self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=0)
      self.dense1 = nn.Linear(4 * 4 * 32, 64)
      self.dense2 = nn.Linear(64, 10)

    def forward(self, x):
      x = F.relu(self.conv1(x))
      x = F.relu(self.conv2(F.pad(x, (0, 1, 0, 1))))  # (left, right, top, bottom): XLA SAME
      x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # flatten in NHWC order, as Flax
      x = F.relu(self.dense1(x))
      return self.dense2(x)

  model = TorchSmallCNN()

  def tensor(a, *perm):
    a = np.asarray(a, np.float32)
    return torch.from_numpy(np.array(a.transpose(*perm) if perm else a, np.float32))

  with torch.no_grad():
    for name in ("conv1", "conv2"):
      getattr(model, name).weight.copy_(tensor(p[name]["kernel"], 3, 2, 0, 1))  # HWIO -> OIHW
      getattr(model, name).bias.copy_(tensor(p[name]["bias"]))
    for name in ("dense1", "dense2"):
      getattr(model, name).weight.copy_(tensor(p[name]["kernel"], 1, 0))
      getattr(model, name).bias.copy_(tensor(p[name]["bias"]))
  model.eval()
  # Peers differentiate with respect to the input only; frozen weights spare them the parameter
  # gradients that a plain ``loss.backward()`` (Foolbox via eagerpy, ART) would also compute.
  for weight in model.parameters():
    weight.requires_grad_(False)
  return model


def nchw(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def torch_predict(model, x_nchw) -> np.ndarray:
  import torch

  with torch.no_grad():
    return model(torch.as_tensor(np.asarray(x_nchw, np.float32))).argmax(1).numpy()


# ------------------------------------------------------------------------------------------------
# Runners. Each library becomes a `Runner`: ``run(repeat)`` computes the whole curve once (random
# start seeded by ``seed + repeat``) and returns the per-example robust flags ``[K, B]``; the
# driver interleaves the repeats of all libraries, so background load hits all of them alike.


class Runner(NamedTuple):
  library: str
  version: str
  note: str
  run: Callable[[int], np.ndarray]
  info: dict[str, Any]


def envelope(robust: np.ndarray, epsilons: np.ndarray) -> np.ndarray:
  """``[K, B]``: robust at eps_k and at every eps_j <= eps_k (jaxrobust's curve convention)."""
  smaller = epsilons[None, :] <= epsilons[:, None]  # [K, J]
  return np.all(robust[None, :, :] | ~smaller[:, :, None], axis=1)


def check_adv(name: str, x_adv: np.ndarray, x: np.ndarray, eps: float) -> None:
  """Every peer's points must lie in the box and the eps-ball (float32 rounding allowed)."""
  dist = float(np.max(np.abs(x_adv - x))) if x.size else 0.0
  if dist > eps + 1e-5 or x_adv.min() < -1e-6 or x_adv.max() > 1 + 1e-6:
    raise AssertionError(f"{name}: adversarial points leave the threat model at eps={eps:g} "
                         f"(Linf distance {dist:.6g}, range [{x_adv.min():.4g}, {x_adv.max():.4g}])")


def jaxrobust_runner(params, x, y, epsilons, steps, seed, eps_batch_size,
                     unroll: bool = False) -> Runner:
  """Compiles the curve once (timed separately) and warms it up."""
  model = SmallCNN()
  attack = jr.attacks.pgd("linf", steps=steps, step_size=None, random_start=True, restarts=1,
                          loss="ce")

  def curve_fn(params, x, y, eps, key):
    return jr.robustness_curve(attack, functools.partial(model.apply, params), x, y, eps, key,
                               eps_batch_size=eps_batch_size, unroll=True if unroll else 1)

  args = (params, jnp.asarray(x), jnp.asarray(y), jnp.asarray(epsilons, jnp.float32))
  start = time.perf_counter()
  compiled = jax.jit(curve_fn).lower(*args, jax.random.key(seed)).compile()
  compile_s = time.perf_counter() - start
  jax.block_until_ready(compiled(*args, jax.random.key(seed)))  # warm-up

  def run(repeat: int) -> np.ndarray:
    curve = jax.block_until_ready(compiled(*args, jax.random.key(seed + repeat)))
    return np.asarray(curve.robust)

  label = "jaxrobust" + ("" if eps_batch_size is None else f" (eps_batch_size={eps_batch_size})")
  label += ", unrolled" if unroll else ""
  return Runner(label, jr.__version__,
                "one jitted program for the whole curve; best iterate; worst case over smaller eps",
                run, {"compile_s": compile_s})


def torchattacks_runner(model, x, y, epsilons, steps, seed) -> Optional[Runner]:
  try:
    import torch
    import torchattacks
  except ImportError as error:
    print(f"  torchattacks skipped: not installed ({error})")
    return None
  xt, yt = torch.from_numpy(nchw(x)), torch.from_numpy(y.astype(np.int64))
  clean = torch_predict(model, xt) == y

  def attack_at(eps, images, labels):
    return torchattacks.PGD(model, eps=float(eps), alpha=2.5 * float(eps) / steps, steps=steps,
                            random_start=True)(images, labels)

  def run(repeat: int) -> np.ndarray:
    torch.manual_seed(seed + repeat)
    robust = []
    for eps in epsilons:  # no multi-eps API: one call per eps
      adv = attack_at(eps, xt, yt).numpy()
      check_adv("torchattacks", adv, xt.numpy(), float(eps))
      robust.append(clean & (torch_predict(model, adv) == y))
    return np.stack(robust)

  attack_at(epsilons[-1], xt[:8], yt[:8])  # warm-up
  return Runner("torchattacks", torchattacks.__version__, "one PGD call per eps; last iterate",
                run, {})


def foolbox_runner(model, x, y, epsilons, steps, seed) -> Optional[Runner]:
  try:
    import foolbox as fb
    import torch
  except ImportError as error:
    print(f"  foolbox skipped: not installed ({error})")
    return None
  fmodel = fb.PyTorchModel(model, bounds=(0.0, 1.0), device="cpu")
  xt, yt = torch.from_numpy(nchw(x)), torch.from_numpy(y.astype(np.int64))
  clean = torch_predict(model, xt) == y
  # One call serves every eps, so the step is given relative to eps: rel_stepsize * eps is the
  # same absolute step 2.5 * eps / steps as everywhere else (one abs_stepsize could not be).
  attack = fb.attacks.LinfPGD(rel_stepsize=2.5 / steps, steps=steps, random_start=True)
  eps_list = [float(e) for e in epsilons]

  def run(repeat: int) -> np.ndarray:
    torch.manual_seed(seed + repeat)
    _, clipped, _ = attack(fmodel, xt, yt, epsilons=eps_list)
    robust = []
    for eps, adv in zip(eps_list, clipped):
      adv = adv.numpy()
      check_adv("foolbox", adv, xt.numpy(), eps)
      robust.append(clean & (torch_predict(model, adv) == y))
    return np.stack(robust)

  attack(fmodel, xt[:8], yt[:8], epsilons=eps_list[-1:])  # warm-up
  return Runner("foolbox", fb.__version__,
                "one call with epsilons=[...]; rel_stepsize=2.5/steps; last iterate", run, {})


def art_runner(model, x, y, epsilons, steps, seed) -> Optional[Runner]:
  try:
    import art
    import torch
    from art.attacks.evasion import ProjectedGradientDescent
    from art.estimators.classification import PyTorchClassifier
  except ImportError as error:
    print(f"  ART skipped: not installed ({error})")
    return None
  classifier = PyTorchClassifier(model=model, loss=torch.nn.CrossEntropyLoss(),
                                 input_shape=(1, 8, 8), nb_classes=10, clip_values=(0.0, 1.0),
                                 device_type="cpu")
  xn, labels = nchw(x), y.astype(np.int64)
  clean = torch_predict(model, xn) == y
  batch = xn.shape[0]

  def attack_at(eps, images, targets):
    # ART rejects eps_step = 0; at eps = 0 any step is projected away.
    step = 2.5 * float(eps) / steps if eps > 0 else 1e-8
    attack = ProjectedGradientDescent(estimator=classifier, norm=np.inf, eps=float(eps),
                                      eps_step=step, max_iter=steps, num_random_init=1,
                                      batch_size=batch, verbose=False)
    return attack.generate(x=images, y=targets)

  def run(repeat: int) -> np.ndarray:
    np.random.seed(seed + repeat)  # ART draws its random start with NumPy
    robust = []
    for eps in epsilons:  # one generate per eps
      adv = attack_at(eps, xn, labels)
      check_adv("ART", adv, xn, float(eps))
      robust.append(clean & (torch_predict(model, adv) == y))
    return np.stack(robust)

  attack_at(epsilons[-1], xn[:8], labels[:8])  # warm-up
  return Runner("ART", art.__version__, f"one generate per eps, batch_size={batch}; last iterate",
                run, {})


PEERS = {"torchattacks": torchattacks_runner, "foolbox": foolbox_runner, "art": art_runner}


def measure(runners: list[Runner], epsilons: np.ndarray, repeats: int) -> list[dict[str, Any]]:
  """Round-robin over the libraries ``repeats`` times; the best time and repeat 0's flags."""
  times: list[list[float]] = [[] for _ in runners]
  accuracies: list[list[np.ndarray]] = [[] for _ in runners]
  flags: list[Optional[np.ndarray]] = [None for _ in runners]
  for repeat in range(repeats):
    for i, runner in enumerate(runners):
      start = time.perf_counter()
      robust = runner.run(repeat)
      times[i].append(time.perf_counter() - start)
      accuracies[i].append(envelope(robust, epsilons).mean(axis=1))
      if repeat == 0:
        flags[i] = robust
  results = []
  for runner, t, acc, robust in zip(runners, times, accuracies, flags):
    acc = np.stack(acc)
    results.append({
      "library": runner.library, "version": runner.version, "note": runner.note, **runner.info,
      "time_s": min(t), "median_s": statistics.median(t), "times_s": t,
      "robust_accuracy": robust.mean(axis=1).tolist(),
      "robust_accuracy_envelope": envelope(robust, epsilons).mean(axis=1).tolist(),
      "envelope_seed_min": acc.min(axis=0).tolist(), "envelope_seed_max": acc.max(axis=0).tolist(),
    })
  return results


# ------------------------------------------------------------------------------------------------
# Report.


def format_table(results: list[dict[str, Any]], epsilons: np.ndarray, reference: float,
                 key: str) -> str:
  eps_cols = [f"{e:.3g}" for e in epsilons]
  header = ["library", "curve time (s, best)", "x jaxrobust"] + [f"eps={c}" for c in eps_cols]
  rows = []
  for r in results:
    rows.append([r["library"], f"{r['time_s']:.3f}", f"{r['time_s'] / reference:.1f}"]
                + [f"{a:.3f}" for a in r[key]])
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines)


def discrepancies(results: list[dict[str, Any]], n: int) -> list[str]:
  """Eps where jaxrobust's robust accuracy is above a peer's by more than noise.

  Both are compared with jaxrobust's convention (the envelope). Noise at each eps is the larger
  of the spread over the random-start seeds of the repeats (either library) and two binomial
  standard errors of one estimate on ``n`` examples.
  """
  ours = results[0]
  p = np.asarray(ours["robust_accuracy_envelope"])
  spread = np.asarray(ours["envelope_seed_max"]) - np.asarray(ours["envelope_seed_min"])
  binomial = 2 * np.sqrt(np.maximum(p * (1 - p), 1.0 / n) / n)
  notes = []
  for r in results[1:]:
    if r["library"].startswith("jaxrobust"):
      continue
    peer = np.asarray(r["robust_accuracy_envelope"])
    peer_spread = np.asarray(r["envelope_seed_max"]) - np.asarray(r["envelope_seed_min"])
    noise = np.maximum(np.maximum(spread, peer_spread), binomial)
    for k in np.nonzero(p - peer > noise)[0]:
      notes.append(f"{r['library']} finds more adversarial points at eps index {k}: jaxrobust "
                   f"{p[k]:.3f} vs {peer[k]:.3f} (noise {noise[k]:.3f})")
  return notes


def main(argv: Optional[list[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=20, help="PGD steps (default 20)")
  parser.add_argument("--num-eps", type=int, default=8, help="eps grid size (default 8)")
  parser.add_argument("--eps-max", type=float, default=0.3,
                      help="largest eps; the grid is linspace(0, eps-max, num-eps) (default 0.3)")
  parser.add_argument("--n", type=int, default=None,
                      help="test examples (default: the whole digits test split, 540)")
  parser.add_argument("--model", choices=("plain", "adversarial", "both"), default="both")
  parser.add_argument("--repeats", type=int, default=3,
                      help="timed runs per library; the best (minimum) is reported, the "
                           "median and every time go to --out (default 3)")
  parser.add_argument("--peers", default="torchattacks,foolbox,art",
                      help="comma-separated peers to run (default: all)")
  parser.add_argument("--jr-eps-batch-size", default="none,0",
                      help="jaxrobust eps_batch_size settings to time, comma-separated; 'none' is "
                           "the default (eps one after another), 0 vectorises all eps; the first "
                           "is the reference of the ratio column (default 'none,0')")
  parser.add_argument("--random-init", action="store_true",
                      help="use untrained random weights (smoke test; no training, no cache)")
  parser.add_argument("--torch-threads", type=int, default=None,
                      help="torch.set_num_threads for the peers (default: the core count)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", type=pathlib.Path, default=None, help="write the figures as JSON")
  args = parser.parse_args(argv)
  if args.steps < 1 or args.num_eps < 1 or not 0 <= args.eps_max < 1 or args.repeats < 1:
    parser.error("need --steps >= 1, --num-eps >= 1, 0 <= --eps-max < 1, --repeats >= 1")
  peers = [p.strip().lower() for p in args.peers.split(",") if p.strip()]
  for p in peers:
    if p not in PEERS:
      parser.error(f"unknown peer {p!r}; choose from {', '.join(PEERS)}")
  jr_settings = []
  for s in args.jr_eps_batch_size.split(","):
    s = s.strip().lower()
    jr_settings.append(None if s in ("", "none") else int(s))

  cores = os.cpu_count() or 1
  torch_note = "torch not installed"
  try:
    import torch

    torch.set_num_threads(args.torch_threads or cores)
    torch_note = f"torch {torch.__version__}, torch.set_num_threads({torch.get_num_threads()})"
  except ImportError:
    pass
  epsilons = np.linspace(0.0, args.eps_max, args.num_eps).astype(np.float32)
  x, y = load_examples(args.n)
  kinds = ["plain", "adversarial"] if args.model == "both" else [args.model]
  machine = (f"{cores} cores ({platform.processor() or platform.machine()}), "
             f"jax {jax.__version__} on {jax.default_backend()} (default XLA CPU threading), "
             f"{torch_note}")
  print(f"machine: {machine}")
  print(f"PGD Linf, {args.steps} steps, step 2.5*eps/{args.steps}, random start, 1 restart, "
        f"{x.shape[0]} digits test examples, eps = [{', '.join(f'{e:.4g}' for e in epsilons)}]")

  report: dict[str, Any] = {
    "machine": machine, "command": "python " + " ".join([sys.argv[0]] + sys.argv[1:]),
    "steps": args.steps, "epsilons": epsilons.tolist(), "n": int(x.shape[0]),
    "repeats": args.repeats, "models": {},
  }
  for kind in kinds:
    print(f"\n=== {kind} model{' (random init)' if args.random_init else ''} ===")
    params = load_params(kind, random_init=args.random_init)
    clean_acc = float(np.mean(np.argmax(jax_logits(params, x), axis=-1) == y))
    runners = [jaxrobust_runner(params, x, y, epsilons, args.steps, args.seed, s)
               for s in jr_settings]
    # On CPU the fastest setting: no loop around the model (see benchmarks/RESULTS.md).
    runners.append(jaxrobust_runner(params, x, y, epsilons, args.steps, args.seed, 0,
                                    unroll=True))
    print("  jaxrobust compile: "
          + ", ".join(f"{r.library} {r.info['compile_s']:.2f} s" for r in runners))

    model = None
    if peers:
      try:
        import torch  # noqa: F401

        model = torch_port(params)
      except ImportError:
        print("  torch not installed: all peers skipped")
    if model is not None:
      diff = float(np.max(np.abs(torch_logits(model, nchw(x)) - jax_logits(params, x))))
      print(f"  torch port: max |torch logits - JAX logits| = {diff:.3g} on {x.shape[0]} examples")
      if not diff <= PORT_TOLERANCE:
        raise AssertionError(f"the torch port disagrees with the Flax model by {diff:g}")
      for p in peers:
        runner = PEERS[p](model, x, y, epsilons, args.steps, args.seed)
        if runner is not None:
          runners.append(runner)

    load_before = os.getloadavg()[0]
    results = measure(runners, epsilons, args.repeats)
    load_after = os.getloadavg()[0]
    reference = results[0]["time_s"]
    print(f"  clean accuracy {clean_acc:.3f}; 1-min load average {load_before:.1f} before, "
          f"{load_after:.1f} after (above {cores} means other processes competed for the cores)")
    print("\n  robust accuracy as each library reports it (per eps):")
    print(format_table(results, epsilons, reference, "robust_accuracy"))
    print("\n  with jaxrobust's convention (robust at eps and every smaller eps of the grid):")
    print(format_table(results, epsilons, reference, "robust_accuracy_envelope"))
    jr_main = results[0]
    print(f"\n  spread of the (envelope) robust accuracy over the {args.repeats} random-start seeds:")
    for r in results:
      print(f"    {r['library']:40s} " + ", ".join(
        f"{lo:.3f}-{hi:.3f}" for lo, hi in zip(r["envelope_seed_min"], r["envelope_seed_max"])))
    peer_times = [r["time_s"] for r in results if not r["library"].startswith("jaxrobust")]
    goal = None
    if peer_times:
      fastest = min(peer_times)
      best_jr = min(r["time_s"] for r in results if r["library"].startswith("jaxrobust"))
      goal = {"default": jr_main["time_s"] <= fastest / 2, "best_setting": best_jr <= fastest / 2}
      print(f"  goal (jaxrobust <= half the fastest peer, {fastest:.3f} s / 2 = "
            f"{fastest / 2:.3f} s): default settings {jr_main['time_s']:.3f} s -> "
            f"{'met' if goal['default'] else 'NOT met'}; best setting {best_jr:.3f} s -> "
            f"{'met' if goal['best_setting'] else 'NOT met'} (fastest peer / best jaxrobust = "
            f"{fastest / best_jr:.2f})")
    notes = discrepancies(results, x.shape[0])
    for note in notes:
      print(f"  NOTE: {note}")
    if not notes and peer_times:
      print("  no peer finds more adversarial points than jaxrobust beyond noise")
    report["models"][kind] = {"clean_accuracy": clean_acc, "results": results,
                              "load_average": [load_before, load_after],
                              "goal_met": goal, "discrepancies": notes}

  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
  return 0


def torch_logits(model, x_nchw: np.ndarray) -> np.ndarray:
  import torch

  with torch.no_grad():
    return model(torch.from_numpy(x_nchw)).numpy()


if __name__ == "__main__":
  sys.exit(main())
