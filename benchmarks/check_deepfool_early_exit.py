#!/usr/bin/env python
"""DeepFool at ``eps = inf`` on the digits zoo: early exit (the default) against the dense run.

For each model of ``bench_optimality.py``'s zoo and each norm (Linf, L2), the first ``--n``
images attacked by ``jr.attacks.deepfool(norm)`` without a budget, once with ``early_exit=False``
and once with the default; prints whether ``x_adv``, ``success``, ``norm`` and ``logits`` are
bitwise equal, and the propagations per attacked sample (``info["propagations"]``, forward plus
backward: mean and max) of each. The weights, images, labels and key are arguments of the jitted
function.

Example::

  python benchmarks/check_deepfool_early_exit.py --n 100
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
  if str(path) not in sys.path:
    sys.path.insert(0, str(path))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxrobust as jr  # noqa: E402
from bench_optimality import MODELS, zoo_model  # noqa: E402
from min_norm_metrics import load_examples  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--n", type=int, default=100)
  parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
  args = parser.parse_args(argv)
  x, y = load_examples()
  x, y = jnp.asarray(x[:args.n]), jnp.asarray(y[:args.n])
  for model in args.models:
    apply_fn, params, _ = zoo_model(model, False)
    for norm in ("linf", "l2"):
      attack = jr.attacks.deepfool(norm)
      out = {}
      for early_exit in (False, True):
        run = jax.jit(lambda p, x, y, k, e=early_exit: jr.run(
            attack, lambda v: apply_fn(p, v), x, y, jr.Budget(jnp.inf), k, early_exit=e))
        out[early_exit] = run(params, x, y, jax.random.key(0))
      same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                 zip(jax.tree.leaves(out[False][:4]), jax.tree.leaves(out[True][:4])))
      total = {e: np.asarray(r.info["propagations"]["forward"])
               + np.asarray(r.info["propagations"]["backward"]) for e, r in out.items()}
      attacked = total[False] > 0
      print(f"{model} {norm}: bitwise {same}; fwd+bwd per attacked sample dense "
            f"{total[False][attacked].mean():.1f} (max {total[False].max()}), early exit "
            f"{total[True][attacked].mean():.1f} (max {total[True].max()})", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
