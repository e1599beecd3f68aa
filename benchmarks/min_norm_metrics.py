"""Shared helpers of the minimum-norm benchmarks (``bench_ddn.py``, ``bench_optimality.py``).

* ``load_examples``: every example of ``benchmarks/reference/digits_examples.npz``;
* ``lp_norms``: per-row Linf / L2 / L1 distances in float64;
* ``check_box``: every point finite and inside [0, 1];
* ``optimality``: AttackBench's optimality (Cinà et al. 2025, ``analysis/utils.py:eval_optimality``)
  of one attack's per-sample distances against the best known ones.

The optimality here integrates the robust-accuracy step curve exactly. With per-sample distances
``d_i`` (0 for a clean-misclassified sample, ``inf`` where nothing was found) the robust accuracy
at ``eps`` is the fraction of ``d_i > eps``, so the area under it on ``[0, eps_max]`` is
``mean(min(d_i, eps_max))``; ``eps_max`` is the largest finite best-known distance and the
clean accuracy the fraction of best-known distances above 0:

    optimality = 1 - (A - A*) / (clean_acc * eps_max - A*).

AttackBench integrates the same curve with ``np.trapz`` through its jump points (a piecewise
linear interpolation between consecutive distances), which is close to but not the exact area
of the step curve; the exact area is used here.
"""

from __future__ import annotations

import os
import pathlib
import platform
import sys

import numpy as np

REFERENCE = pathlib.Path(__file__).resolve().parent / "reference"
ORDERS = {"linf": np.inf, "l2": 2, "l1": 1}


def load_examples() -> tuple[np.ndarray, np.ndarray]:
  """Every example of ``digits_examples.npz``, NHWC float32 in [0, 1] (levels / 16)."""
  with np.load(REFERENCE / "digits_examples.npz") as data:
    return (data["x_levels"].astype(np.float32) / np.float32(16.0),
            data["y"].astype(np.int32))


def lp_norms(x_adv: np.ndarray, x: np.ndarray, norm: str = "l2") -> np.ndarray:
  """``||x_adv - x||_p`` per row, in float64 (``norm``: "linf", "l2" or "l1")."""
  diff = (x_adv.astype(np.float64) - x.astype(np.float64)).reshape(len(x), -1)
  return np.linalg.norm(diff, ord=ORDERS[norm], axis=1)


def check_box(name: str, x_adv: np.ndarray) -> None:
  if not np.isfinite(x_adv).all() or x_adv.min() < 0.0 or x_adv.max() > 1.0:
    raise AssertionError(f"{name}: points outside the box [0, 1]")


def optimality(norms: np.ndarray, best: np.ndarray) -> float:
  """AttackBench's optimality of per-sample ``norms`` against the best known ``best``.

  Both are ``[N]``: 0 for a clean-misclassified sample, ``inf`` where nothing was found. ``nan``
  when the best-known curve is degenerate (no finite positive distance).
  """
  norms, best = np.asarray(norms, np.float64), np.asarray(best, np.float64)
  finite = best[np.isfinite(best)]
  if finite.size == 0 or finite.max() <= 0:
    return float("nan")
  eps_max = float(finite.max())
  clean_acc = float(np.mean(best > 0))
  area = float(np.mean(np.minimum(norms, eps_max)))
  best_area = float(np.mean(np.minimum(best, eps_max)))
  return 1.0 - (area - best_area) / (clean_acc * eps_max - best_area)


def print_machine(argv: list[str] | None, torch_threads: int | None) -> None:
  """Prints the machine line (cores, jax and its backend, torch and its threads, load average)
  and the command, after setting torch's threads (default: the core count), as the benchmarks
  that compare against PyTorch peers record them."""
  import jax  # noqa: PLC0415 - only for its version and backend

  cores = os.cpu_count() or 1
  try:
    import torch  # noqa: PLC0415 - an optional peer

    torch.set_num_threads(torch_threads or cores)
    torch_note = f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
  except ImportError:
    torch_note = "torch not installed"
  print(f"machine: {cores} cores ({platform.processor() or platform.machine()}), jax "
        f"{jax.__version__} on {jax.default_backend()}, {torch_note}; load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
  print("command: python " + " ".join([sys.argv[0]] + (argv or sys.argv[1:])), flush=True)
