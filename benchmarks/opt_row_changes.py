#!/usr/bin/env python
"""Before/after optimality of re-run jaxrobust rows of ``bench_optimality.py``, on one per-sample
best.

``--before`` is the JSON-lines files of the tables as they stand (merged as ``--summarize`` merges
them: the first entry's row of a name wins), ``--after`` the re-runs of some rows (e.g. with a
changed default, ``--no-peers --skip ...``). The after table is the before table with each
re-run row replacing the row of its name (a re-run ``jaxrobust bb`` replaces ``jaxrobust
bb+mns(apgd)`` where the tables hold that name: the default BB's row there, the older ``bb`` row
being BB from FMN and FAB alone). Every optimality (AttackBench's, ``min_norm_metrics.optimality``)
is scored against one per-sample best, the minimum over every before and after row, so a row's
change is its own and not the effect of a new best on the others. Printed per model and norm:
each re-run row before and after, the jaxrobust and peers ensembles (the per-sample minimum over
each side's rows) before and after, and the best single jaxrobust row.

Example::

  python benchmarks/opt_row_changes.py --before opt.jsonl opt_bb.jsonl --after rerun.jsonl
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from bench_optimality import MODELS, NORMS, merge  # noqa: E402
from min_norm_metrics import optimality  # noqa: E402


def load(files) -> list[dict]:
  return [json.loads(line) for f in files for line in pathlib.Path(f).read_text().splitlines()
          if line.strip()]


def changes(before: dict, after: dict) -> list[dict]:
  """Per (model, norm) of ``after``: the re-run rows' and the ensembles' optimality, before and
  after, on one best (see the module)."""
  out = []
  for key in sorted(after, key=lambda k: (NORMS.index(k[1]), MODELS.index(k[0]))):
    b, a = before[key], after[key]
    assert (b["weights"], b["n"]) == (a["weights"], a["n"]), key
    old = {k: np.asarray(v["norms"]) for k, v in b["rows"].items() if "norms" in v}
    new = {k: np.asarray(v["norms"]) for k, v in a["rows"].items() if "norms" in v}
    if "jaxrobust bb+mns(apgd)" in old and "jaxrobust bb" in new:
      new["jaxrobust bb+mns(apgd)"] = new.pop("jaxrobust bb")
    both = dict(old, **new)
    best = np.min(np.stack(list(old.values()) + list(new.values())), 0)
    side = lambda rows, ours: optimality(np.min(np.stack(
        [v for k, v in rows.items() if k.startswith("jaxrobust") == ours]), 0), best)
    top = lambda rows: max((optimality(v, best), k) for k, v in rows.items()
                           if k.startswith("jaxrobust"))
    out.append({"model": key[0], "norm": key[1],
                "rows": {k: (optimality(old[k], best) if k in old else float("nan"),
                             optimality(v, best)) for k, v in sorted(new.items())},
                "ours": (side(old, True), side(both, True)), "peers": side(old, False),
                "top": (top(old), top(both))})
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--before", nargs="+", required=True)
  parser.add_argument("--after", nargs="+", required=True)
  args = parser.parse_args(argv)
  print("| model | norm | row | before | after | jaxrobust ensemble before | after | peers "
        "ensemble | best single jaxrobust before | after |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for c in changes(merge(load(args.before)), merge(load(args.after))):
    for i, (row, (b, a)) in enumerate(c["rows"].items()):
      rest = " | | | | |"
      if i == 0:
        (tb, nb), (ta, na) = c["top"]
        rest = (f" {c['ours'][0]:.4f} | {c['ours'][1]:.4f} | {c['peers']:.4f} | "
                f"{tb:.4f} ({nb[10:]}) | {ta:.4f} ({na[10:]}) |")
      print(f"| {c['model']} | {c['norm']} | {row[10:]} | {b:.4f} | {a:.4f} |{rest}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
