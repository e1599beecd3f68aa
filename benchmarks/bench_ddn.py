#!/usr/bin/env python
"""DDN against Foolbox (issue #27): minimum-norm L2 attacks on the four digits models, per sample.

On each of the four digits models of ``bench_peers.py`` (the frozen SmallCNN and DigitsMLP
weights, plain and PGD-AT; the PyTorch ports hold identical weights and their logits are checked
against JAX's), the first ``--n`` clean-correct images of ``benchmarks/reference/
digits_examples.npz`` are attacked without a budget by

* jaxrobust: ``jr.attacks.ddn()`` (defaults, or ``--ddn-kwargs``), ``jr.attacks.fmn("l2")`` and
  ``jr.attacks.carlini_wagner_l2()``, each jitted once per architecture with the weights, inputs,
  labels and key as arguments (compile time reported apart), at ``jr.Budget(jnp.inf)``;
* Foolbox 3 (optional, ``pip install 'jaxrobust[peers]'``): ``DDNAttack()`` and ``L2FMNAttack()``
  at their defaults, through ``fb.PyTorchModel(port, bounds=(0, 1))`` and ``attack.run`` (the raw
  minimum-norm points).

Per model and attack the script prints: the points found (an adversarial point judged by the
attack's own framework; a Foolbox point is also re-judged by the JAX model and disagreements are
counted), the median and mean L2 norm (a miss counts as ``inf`` in the median and is left out of
the mean), AttackBench's optimality (Cinà et al. 2025) against the per-sample best over every
attack of the table,

    optimality = 1 - (A - A*) / (eps_max - A*),

with ``A`` the area under the attack's robust-accuracy curve up to ``eps_max`` (the largest best
known distance; the mean of ``min(d_i, eps_max)`` since every point is clean-correct) and ``A*``
the best-known area; and the wall time (jaxrobust: the second call; Foolbox: one call). Then,
per sample, jaxrobust's DDN against Foolbox's: on how many points its norm is at most Foolbox's
(to a relative 1e-4), smaller or larger by more than 1%, and the median ratio. Example::

  python benchmarks/bench_ddn.py --n 100 --out /tmp/ddn.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
  if str(path) not in sys.path:
    sys.path.insert(0, str(path))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxrobust as jr  # noqa: E402
from bench_peers import (ARCHS, PORT_TOLERANCE, load_frozen_params, nchw,  # noqa: E402
                         params_digest, torch_mlp_port, torch_port)
from min_norm_metrics import (check_box, load_examples, lp_norms, optimality,  # noqa: E402
                              print_machine)

MODELS = [(arch, kind) for arch in ("cnn", "mlp") for kind in ("plain", "adversarial")]
RELATIVE = 1e-4  # "at most Foolbox's norm" allows this relative slack (float32 rounding)


def jaxrobust_attacks(ddn_kwargs: dict) -> dict:
  return {"jaxrobust ddn": jr.attacks.ddn(**ddn_kwargs),
          "jaxrobust fmn-l2": jr.attacks.fmn("l2"),
          "jaxrobust cw-l2": jr.attacks.carlini_wagner_l2()}


def run_jaxrobust(attack, apply_fn, params, x, y) -> dict:
  """Norms ``[N]`` (``inf`` where nothing was found), wall and compile time of one attack."""
  run = jax.jit(lambda params, x, y, key: jr.run(attack, lambda v: apply_fn(params, v), x, y,
                                                 jr.Budget(jnp.inf), key))
  args = (params, jnp.asarray(x), jnp.asarray(y), jax.random.key(0))
  start = time.perf_counter()
  jax.block_until_ready(run(*args))
  first = time.perf_counter() - start
  start = time.perf_counter()
  result = jax.block_until_ready(run(*args))
  seconds = time.perf_counter() - start
  x_adv = np.asarray(result.x_adv)
  check_box(attack.name, x_adv)
  success = np.asarray(jnp.argmax(apply_fn(params, result.x_adv), -1)) != y
  np.testing.assert_array_equal(success, np.asarray(result.success))
  norms = np.where(success, lp_norms(x_adv, x, "l2"), np.inf)
  return {"norms": norms, "seconds": seconds, "compile_s": first - seconds, "disagree": 0}


def foolbox_attacks() -> dict:
  try:
    import foolbox as fb
  except ImportError as error:
    print(f"foolbox skipped: not installed ({error})")
    return {}
  return {f"foolbox {fb.__version__} ddn": fb.attacks.DDNAttack(),
          f"foolbox {fb.__version__} fmn-l2": fb.attacks.L2FMNAttack()}


def run_foolbox(attack, port, apply_fn, params, x, y) -> dict:
  import foolbox as fb
  import torch

  fmodel = fb.PyTorchModel(port, bounds=(0.0, 1.0), device="cpu")
  xt, yt = torch.from_numpy(nchw(x)), torch.from_numpy(y.astype(np.int64))
  criterion = fb.criteria.Misclassification(yt)
  start = time.perf_counter()
  adv = attack.run(fmodel, xt, criterion)
  seconds = time.perf_counter() - start
  with torch.no_grad():
    success = port(adv).argmax(1).numpy() != y
  x_adv = np.ascontiguousarray(adv.numpy().transpose(0, 2, 3, 1))
  check_box(type(attack).__name__, x_adv)
  jax_success = np.asarray(jnp.argmax(apply_fn(params, jnp.asarray(x_adv)), -1)) != y
  norms = np.where(success, lp_norms(x_adv, x, "l2"), np.inf)
  return {"norms": norms, "seconds": seconds, "compile_s": 0.0,
          "disagree": int(np.sum(success != jax_success))}


def per_sample(ours: np.ndarray, theirs: np.ndarray) -> dict:
  """jaxrobust's DDN against Foolbox's, point by point."""
  both = np.isfinite(ours) & np.isfinite(theirs)
  ratio = ours[both] / theirs[both]
  return {"at_most": int(np.sum(ours <= theirs * (1 + RELATIVE))),
          "smaller_1pct": int(np.sum(ours < theirs * 0.99)),
          "larger_1pct": int(np.sum(ours > theirs * 1.01)),
          "median_ratio": float(np.median(ratio)) if ratio.size else float("nan"),
          "n": int(ours.size)}


def model_table(arch: str, kind: str, x_all, y_all, n: int, ddn_kwargs: dict) -> dict:
  params = load_frozen_params(kind, arch)
  apply_fn = ARCHS[arch]().apply
  correct = np.asarray(jnp.argmax(apply_fn(params, jnp.asarray(x_all)), -1)) == y_all
  index = np.flatnonzero(correct)[:n]
  x, y = x_all[index], y_all[index]
  rows = {}
  for name, attack in jaxrobust_attacks(ddn_kwargs).items():
    rows[name] = run_jaxrobust(attack, apply_fn, params, x, y)
  peers = foolbox_attacks()
  if peers:
    import torch

    port = (torch_port if arch == "cnn" else torch_mlp_port)(params)
    with torch.no_grad():
      gap = np.max(np.abs(port(torch.from_numpy(nchw(x))).numpy()
                          - np.asarray(apply_fn(params, jnp.asarray(x)))))
    assert gap <= PORT_TOLERANCE, f"the PyTorch port differs from the JAX model by {gap}"
    for name, attack in peers.items():
      rows[name] = run_foolbox(attack, port, apply_fn, params, x, y)
  best = np.min(np.stack([row["norms"] for row in rows.values()]), axis=0)
  for row in rows.values():
    row["optimality"] = optimality(row["norms"], best)
  table = {"model": f"{arch}-{kind}", "weights": params_digest(params), "n": int(len(y)),
           "examples": index.tolist(), "rows": rows}
  fb_ddn = next((name for name in rows if name.startswith("foolbox") and "ddn" in name), None)
  if fb_ddn:
    table["ddn_vs_foolbox"] = per_sample(rows["jaxrobust ddn"]["norms"], rows[fb_ddn]["norms"])
  return table


def print_table(table: dict) -> None:
  print(f"\n{table['model']} (weights {table['weights']}), {table['n']} clean-correct points, "
        f"load {os.getloadavg()[0]:.2f}")
  print("| attack | found | median L2 | mean L2 | optimality | s (compile) |")
  print("|---|---|---|---|---|---|")
  for name, row in table["rows"].items():
    norms = row["norms"]
    found = np.isfinite(norms)
    mean = float(np.mean(norms[found])) if found.any() else float("nan")
    disagree = f" ({row['disagree']} judged otherwise by JAX)" if row["disagree"] else ""
    compile_s = f" ({row['compile_s']:.1f})" if row["compile_s"] else ""
    print(f"| {name} | {int(found.sum())}/{norms.size}{disagree} | {np.median(norms):.4f} | "
          f"{mean:.4f} | {row['optimality']:.4f} | {row['seconds']:.2f}{compile_s} |")
  if "ddn_vs_foolbox" in table:
    c = table["ddn_vs_foolbox"]
    print(f"jaxrobust ddn vs foolbox ddn, per point: at most on {c['at_most']}/{c['n']}, "
          f"smaller by >1% on {c['smaller_1pct']}, larger by >1% on {c['larger_1pct']}, "
          f"median ratio {c['median_ratio']:.4f}")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--n", type=int, default=100, help="clean-correct points per model")
  parser.add_argument("--models", nargs="+", default=[f"{a}-{k}" for a, k in MODELS],
                      choices=[f"{a}-{k}" for a, k in MODELS])
  parser.add_argument("--ddn-kwargs", type=json.loads, default={},
                      help='options of jr.attacks.ddn as JSON, e.g. \'{"steps": 200}\'')
  parser.add_argument("--torch-threads", type=int, default=None,
                      help="torch.set_num_threads (default: the core count)")
  parser.add_argument("--out", type=pathlib.Path, default=None, help="write the tables as JSON")
  args = parser.parse_args(argv)
  print_machine(argv, args.torch_threads)
  x_all, y_all = load_examples()
  tables = []
  for model in args.models:
    arch, kind = model.split("-")
    table = model_table(arch, kind, x_all, y_all, args.n, args.ddn_kwargs)
    print_table(table)
    tables.append(table)
  if args.out:
    for table in tables:
      for row in table["rows"].values():
        row["norms"] = [float(v) for v in row["norms"]]
    args.out.write_text(json.dumps({"ddn_kwargs": args.ddn_kwargs, "tables": tables}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
