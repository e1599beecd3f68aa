#!/usr/bin/env python
"""Per-iteration cost of Square, FAB-T and APGD-T on a small MLP, against the reference.

On a model this cheap (an MLP 64-256-10) the model's own matrix products take a few microseconds
per row, so what an iteration costs is mostly the attack's loop body: sampling the window,
projecting, bookkeeping. For each attack the script reports

* ``iter_ms``: ``jr.run``'s wall time with ``early_exit=False`` (every row runs every
  iteration) divided by the attack's iterations (``num_steps``), best of ``--repeats`` after a
  warm-up run (compile time excluded); the default run (early exit) is reported beside it;
* ``model_ms``: the model work an iteration cannot avoid, timed alone in the same kind of
  compiled loop (one forward pass for Square; one forward and one vector-Jacobian product plus one
  forward pass for FAB-T; one gradient for APGD-T), so ``iter_ms / model_ms`` is the loop body's
  overhead factor;
* ``hlo_ops`` and ``kernels``: instructions of the compiled ``step`` (all computations) and the
  top-level instructions of its entry computation (roughly the kernels launched per iteration),
  with the most frequent opcodes;
* ``rows``: model rows with and without a gradient over the whole run
  (:func:`jaxrobust.metrics.count_evaluations`);
* the reference (fra31/auto-attack, PyTorch CPU, ``--autoattack-path``): the same attack on the
  same weights and points (NCHW ``[B, 1, 8, 8]``; its Square takes images only), wall time divided
  by its iterations, and its rows counted by a forward hook (a row counts as ``gradient`` when the
  forward pass records a graph).

The budget is small (Linf ``--eps``, default 0.01) so that few points break and both sides do the
full work per iteration (the reference shrinks its batch to the unbroken points; jaxrobust's early
exit does the same per chunk): the robust fractions are printed beside the times.

Usage::

  python benchmarks/bench_loop_bodies.py --autoattack-path /tmp/autoattack_ref
  python benchmarks/bench_loop_bodies.py --attacks square fab-t --no-reference --json out.json
  python benchmarks/bench_loop_bodies.py --attacks apgd-t --no-reference --apgd-loss ce

``--apgd-loss`` changes jaxrobust's APGD-T loss only (the reference's APGD-T is DLR-targeted
always): with ``ce`` beside the default ``dlr`` it prices what DLR's top logits add per step.

``--jaxrobust-path DIR`` imports ``jaxrobust`` from ``DIR`` (e.g. an export of an older revision,
``git archive HEAD jaxrobust | tar -x -C /tmp/before``) to measure before/after on one machine.
The 1-minute load average is printed before and after: timings mean something only on idle cores.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import platform
import re
import sys
import time


def _parse() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--attacks", nargs="+", default=["square", "fab-t", "apgd-t"],
                      choices=["square", "fab-t", "apgd-t"])
  parser.add_argument("--shapes", nargs="+", default=["flat", "image"], choices=["flat", "image"],
                      help="flat: [B, 64]; image: [B, 8, 8, 1] (the reference always gets NCHW)")
  parser.add_argument("--batch", type=int, default=360)
  parser.add_argument("--eps", type=float, default=0.01)
  parser.add_argument("--queries", type=int, default=5000)
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--targets", type=int, default=9)
  parser.add_argument("--apgd-loss", default="dlr",
                      choices=["dlr", "ce", "margin", "probability_margin"],
                      help="APGD-T's targeted loss (AutoAttack: dlr); ce prices DLR's top logits")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--no-reference", action="store_true")
  parser.add_argument("--autoattack-path", default=os.environ.get("AUTOATTACK_PATH"))
  parser.add_argument("--jaxrobust-path", default=None)
  parser.add_argument("--json", default=None, help="write the measurements here")
  return parser.parse_args()


ARGS = _parse()
if ARGS.jaxrobust_path:
  sys.path.insert(0, ARGS.jaxrobust_path)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrobust as jr  # noqa: E402

HIDDEN, CLASSES, SIDE = 256, 10, 8


def load() -> float:
  return os.getloadavg()[0]


def weights(seed: int = 0) -> dict[str, np.ndarray]:
  """A random MLP 64-256-10 (ReLU), scaled so that logits are of order one."""
  rng = np.random.default_rng(seed)
  dim = SIDE * SIDE
  return {"w1": (rng.normal(size=(dim, HIDDEN)) * 2 / np.sqrt(dim)).astype(np.float32),
          "b1": (rng.normal(size=HIDDEN) * 0.1).astype(np.float32),
          "w2": (rng.normal(size=(HIDDEN, CLASSES)) / np.sqrt(HIDDEN)).astype(np.float32),
          "b2": (rng.normal(size=CLASSES) * 0.1).astype(np.float32)}


def jax_model(w: dict[str, np.ndarray]):
  w1, b1, w2, b2 = (jnp.asarray(w[k]) for k in ("w1", "b1", "w2", "b2"))

  def logits_fn(x):
    h = jax.nn.relu(x.reshape(x.shape[0], -1) @ w1 + b1)
    return h @ w2 + b2

  return logits_fn


def points(w: dict[str, np.ndarray], batch: int, seed: int = 1):
  """Uniform points in [0, 1]^64, labelled by the model (every point is clean-correct)."""
  x = np.random.default_rng(seed).uniform(0, 1, (batch, SIDE * SIDE)).astype(np.float32)
  h = np.maximum(x @ w["w1"] + w["b1"], 0)
  return x, np.argmax(h @ w["w2"] + w["b2"], axis=1).astype(np.int64)


def make_attack(name: str):
  if name == "square":  # as in AutoAttack's suite
    return jr.attacks.square("linf", queries=ARGS.queries, rescale_schedule=False)
  if name == "fab-t":
    return jr.attacks.fab("linf", targeted=True, n_target_classes=ARGS.targets, steps=ARGS.steps)
  return jr.attacks.apgd("linf", loss=ARGS.apgd_loss, targeted=True,
                         n_target_classes=ARGS.targets, steps=ARGS.steps)


def best_time(fn, *args) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(ARGS.repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return min(times)


def hlo_profile(attack, logits_fn, x, y, budget) -> dict:
  """Instruction counts of the compiled ``step`` (one loop iteration)."""
  keys = jax.random.split(jax.random.key(0), x.shape[0])
  state = jax.jit(lambda: attack.init(logits_fn, x, y, budget, keys, None))()
  step = jax.jit(lambda s: attack.step(logits_fn, s, x, y, budget, None))
  text = step.lower(state).compile().as_text()
  computations, current, entry = collections.defaultdict(list), None, None
  for line in text.splitlines():
    header = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
    if header and not line.startswith(" "):
      current = header.group(2)
      if header.group(1):
        entry = current
      continue
    op = re.match(r"^\s+(ROOT\s+)?%?[\w.\-]+\s*=\s*\S+\s+([\w\-]+)\(", line)
    if op and current is not None:
      computations[current].append(op.group(2))
  every = [o for ops in computations.values() for o in ops]
  top = collections.Counter(computations.get(entry, []))
  return {"hlo_ops": len(every), "kernels": len(computations.get(entry, [])),
          "entry_opcodes": dict(top.most_common(8)),
          "all_opcodes": dict(collections.Counter(every).most_common(12))}


def model_floor(name: str, logits_fn, x, y, iterations: int) -> float:
  """Seconds per iteration of the model work alone, in a compiled loop of ``iterations``."""

  def forward(v, i):
    return v + 1e-9 * logits_fn(v)[:, :1].reshape((-1,) + (1,) * (v.ndim - 1))

  def gradient(v, i):
    g = jax.grad(lambda u: jnp.sum(logits_fn(u)[:, 0] - logits_fn(u)[:, 1] * 0))(v)
    return v + 1e-9 * g

  def fab_like(v, i):
    return forward(gradient(v, i), i)

  body = {"square": forward, "fab-t": fab_like, "apgd-t": gradient}[name]
  run = jax.jit(lambda v: jax.lax.fori_loop(0, iterations, lambda i, u: body(u, i), v))
  return best_time(run, x) / iterations


def measure_jax(name: str, shape: str, w, x_np, y_np) -> dict:
  logits_fn = jax_model(w)
  x = jnp.asarray(x_np if shape == "flat" else x_np.reshape(-1, SIDE, SIDE, 1))
  y = jnp.asarray(y_np, jnp.int32)
  attack = make_attack(name)
  budget = jr.Budget(ARGS.eps)
  key = jax.random.key(0)
  # The loop body's cost: every row runs every iteration (no early exit, where jr.run has it).
  has_early_exit = "early_exit" in inspect.signature(jr.run).parameters
  dense = {"early_exit": False} if has_early_exit else {}
  run = jax.jit(lambda x, y: jr.run(attack, logits_fn, x, y, budget, key, **dense))
  before = load()
  total = best_time(run, x, y)
  success = float(np.mean(np.asarray(run(x, y).success)))
  counted, counter = jr.metrics.count_evaluations(logits_fn)
  jax.block_until_ready(
      jax.jit(lambda x, y: jr.run(attack, counted, x, y, budget, key, **dense))(x, y))
  jax.effects_barrier()
  floor = model_floor(name, logits_fn, x, y, min(attack.num_steps, 1000))
  out = {"side": "jaxrobust", "attack": name, "shape": shape, "batch": int(x.shape[0]),
         "iterations": attack.num_steps, "total_s": total,
         "iter_ms": 1e3 * total / attack.num_steps, "model_ms": 1e3 * floor,
         "robust": 1 - success, "rows_forward": counter.forward,
         "rows_gradient": counter.gradient, "load_before": before, "load_after": load()}
  if name == "apgd-t":
    out["loss"] = ARGS.apgd_loss
  if has_early_exit:  # jr.run's default: broken rows stop costing model evaluations
    default = jax.jit(lambda x, y: jr.run(attack, logits_fn, x, y, budget, key))
    out["early_exit_total_s"] = best_time(default, x, y)
    counter.reset()
    jax.block_until_ready(jax.jit(lambda x, y: jr.run(attack, counted, x, y, budget, key))(x, y))
    jax.effects_barrier()
    out["early_exit_rows"] = counter.total
  out.update(hlo_profile(attack, logits_fn, x, y, budget))
  return out


def measure_reference(name: str, w, x_np, y_np) -> dict:
  import torch

  if ARGS.autoattack_path and ARGS.autoattack_path not in sys.path:
    sys.path.insert(0, ARGS.autoattack_path)
  from autoattack.autopgd_base import APGDAttack_targeted
  from autoattack.fab_pt import FABAttack_PT
  from autoattack.square import SquareAttack

  class MLP(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.hidden = torch.nn.Linear(SIDE * SIDE, HIDDEN)
      self.out = torch.nn.Linear(HIDDEN, CLASSES)
      with torch.no_grad():
        self.hidden.weight.copy_(torch.from_numpy(w["w1"].T.copy()))
        self.hidden.bias.copy_(torch.from_numpy(w["b1"]))
        self.out.weight.copy_(torch.from_numpy(w["w2"].T.copy()))
        self.out.bias.copy_(torch.from_numpy(w["b2"]))

    def forward(self, v):
      return self.out(torch.relu(self.hidden(v.reshape(v.shape[0], -1))))

  model = MLP().eval()
  rows = {"forward": 0, "gradient": 0}

  def hook(module, inputs):
    kind = "gradient" if torch.is_grad_enabled() and inputs[0].requires_grad else "forward"
    rows[kind] += int(inputs[0].shape[0])

  model.register_forward_pre_hook(hook)
  x = torch.from_numpy(x_np.reshape(-1, 1, SIDE, SIDE))
  y = torch.from_numpy(y_np)
  if name == "square":
    attack = SquareAttack(model, norm="Linf", n_queries=ARGS.queries, eps=ARGS.eps, p_init=0.8,
                          n_restarts=1, seed=0, resc_schedule=False, device="cpu")
    iterations = ARGS.queries
  elif name == "fab-t":
    attack = FABAttack_PT(model, norm="Linf", n_restarts=1, n_iter=ARGS.steps, eps=ARGS.eps,
                          seed=0, targeted=True, n_target_classes=ARGS.targets, device="cpu")
    iterations = ARGS.steps * ARGS.targets
  else:
    attack = APGDAttack_targeted(model, norm="Linf", n_restarts=1, n_iter=ARGS.steps, eps=ARGS.eps,
                                seed=0, n_target_classes=ARGS.targets, device="cpu")
    iterations = ARGS.steps * ARGS.targets
  before = load()
  times = []
  for _ in range(ARGS.repeats):
    rows.update(forward=0, gradient=0)
    start = time.perf_counter()
    adv = attack.perturb(x, y)
    times.append(time.perf_counter() - start)
  with torch.no_grad():
    robust = float((model(adv).argmax(1) == y).float().mean())
  total = min(times)
  return {"side": "reference", "attack": name, "shape": "image", "batch": int(x.shape[0]),
          "iterations": iterations, "total_s": total, "iter_ms": 1e3 * total / iterations,
          "robust": robust, "rows_forward": rows["forward"], "rows_gradient": rows["gradient"],
          "torch_threads": torch.get_num_threads(), "load_before": before, "load_after": load()}


def main() -> None:
  w = weights()
  x_np, y_np = points(w, ARGS.batch)
  print(f"jax {jax.__version__} backend={jax.default_backend()} cores={os.cpu_count()} "
        f"cpu={platform.processor() or platform.machine()} batch={ARGS.batch} eps={ARGS.eps} "
        f"load={load():.2f} jaxrobust={os.path.dirname(jr.__file__)}")
  results = []
  for name in ARGS.attacks:
    for shape in ARGS.shapes:
      r = measure_jax(name, shape, w, x_np, y_np)
      results.append(r)
      loss = f" ({ARGS.apgd_loss})" if name == "apgd-t" else ""
      print(f"jaxrobust {name}{loss} {shape:5s} iter {r['iter_ms']:.3f} ms (model alone "
            f"{r['model_ms']:.3f} ms, x{r['iter_ms'] / r['model_ms']:.1f}) total "
            f"{r['total_s']:.2f} s robust {r['robust']:.3f} rows fwd {r['rows_forward']} grad "
            f"{r['rows_gradient']} hlo_ops {r['hlo_ops']} kernels {r['kernels']} "
            f"load {r['load_before']:.2f}->{r['load_after']:.2f}")
      if "early_exit_rows" in r:
        print(f"    with early exit (jr.run's default): total {r['early_exit_total_s']:.2f} s, "
              f"rows {r['early_exit_rows']}")
      print(f"    entry: {r['entry_opcodes']}\n    all:   {r['all_opcodes']}")
    if not ARGS.no_reference:
      r = measure_reference(name, w, x_np, y_np)
      results.append(r)
      print(f"reference {name:7s} image iter {r['iter_ms']:.3f} ms total {r['total_s']:.2f} s "
            f"robust {r['robust']:.3f} rows fwd {r['rows_forward']} grad {r['rows_gradient']} "
            f"threads {r['torch_threads']} load {r['load_before']:.2f}->{r['load_after']:.2f}")
      mine = [m for m in results if m["side"] == "jaxrobust" and m["attack"] == name]
      theirs = max(r["rows_forward"] + r["rows_gradient"], 1)
      for m in mine:
        print(f"    ratio jaxrobust/reference ({m['shape']}): time "
              f"{m['total_s'] / r['total_s']:.3f}, rows "
              f"{(m['rows_forward'] + m['rows_gradient']) / theirs:.2f}")
  if ARGS.json:
    with open(ARGS.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
