"""``jaxrobust demo``: its options, and the call of its driver: :mod:`jaxrobust.demo.digits` (the
digits models, their robustness curves and report) or, with ``--text``,
:mod:`jaxrobust.demo.text_demo` (word swaps and GCG on synthetic text)."""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

from jaxrobust.cli._args import int_at_least

# The drivers import the demo extra (flax; tqdm for the digits): without it `jaxrobust evaluate`
# and `compare` still run, and the demo that needs it fails with the import's error in one line.
_MISSING: dict[str, ImportError] = {}  # driver module name -> why it cannot be imported
try:
  from jaxrobust.demo import digits
except ImportError as error:
  digits, _MISSING["digits"] = None, error
try:
  from jaxrobust.demo import text_demo
except ImportError as error:
  text_demo, _MISSING["text_demo"] = None, error

MODEL_NAMES = ("plain", "adversarial", "trades", "ibp")  # jaxrobust.demo.train.METHODS


def _eps_max(text: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
  if not (math.isfinite(value) and 0.0 < value < 1.0):
    raise argparse.ArgumentTypeError(
      f"must be in (0, 1): a Linf radius for images in [0, 1], got {text}"
    )
  return value


def _model_names(text: str) -> tuple[str, ...]:
  """``--models``: comma-separated names of `MODEL_NAMES`, repeats dropped, in the given order."""
  names = [name.strip() for name in text.split(",") if name.strip()]
  unknown = [name for name in names if name not in MODEL_NAMES]
  if not names or unknown:
    raise argparse.ArgumentTypeError(
      f"expected a comma-separated list of {','.join(MODEL_NAMES)}, got {text!r}")
  return tuple(dict.fromkeys(names))


def add_parser(commands: Any) -> None:
  """Adds the ``demo`` sub-command to ``commands`` (an argparse sub-parser group)."""
  demo = commands.add_parser(
    "demo",
    help="train CNNs on the digits plainly and robustly (PGD, TRADES, IBP) and compare their "
    "robustness curves",
    description="Train (or load from the cache) SmallCNNs on scikit-learn's 8x8 digits, plainly "
    "and with jaxrobust.training's losses (PGD adversarial training, TRADES, IBP), evaluate every "
    "one with the same Linf PGD robustness curve (and, with --certify, certified accuracy), print "
    "a table and write a JSON report.",
  )
  demo.add_argument("--out", type=pathlib.Path, default=pathlib.Path("report.json"),
                    help="where to write the JSON report (default: ./report.json)")
  demo.add_argument("--eps-max", type=_eps_max, default=0.3,
                    help="largest Linf eps of the grid, in pixel units of [0, 1] (default: 0.3)")
  demo.add_argument("--num-eps", type=int_at_least(2), default=7,
                    help="number of eps values, evenly spaced from 0 to --eps-max inclusive "
                    "(default: 7)")
  demo.add_argument("--steps", type=int_at_least(1), default=20,
                    help="PGD steps of the evaluation attack (default: 20)")
  demo.add_argument("--restarts", type=int_at_least(1), default=1,
                    help="PGD random restarts of the evaluation attack (default: 1)")
  demo.add_argument("--test-size", type=int_at_least(1), default=None,
                    help="evaluate on the first N test images (default: the whole test split, 540)")
  demo.add_argument("--models", type=_model_names, default=MODEL_NAMES, metavar="NAMES",
                    help="which models to train and compare, comma-separated (default: "
                    f"{','.join(MODEL_NAMES)}): plain training, PGD-7 adversarial training "
                    "(Madry et al., Linf 0.2), TRADES (beta 6, Linf 0.2), IBP training (Gowal et "
                    "al., Linf ramped to 0.1)")
  demo.add_argument("--epochs", type=int_at_least(1), default=None,
                    help="training epochs of every model (default: 20)")
  demo.add_argument("--cache-dir", type=pathlib.Path, default=None,
                    help="parameter cache directory (default: $XDG_CACHE_HOME/jaxrobust or "
                    "~/.cache/jaxrobust)")
  demo.add_argument("--no-cache", action="store_true",
                    help="always train, and do not write the cache")
  demo.add_argument("--seed", type=int_at_least(0), default=0,
                    help="seed of training and of the attacks' random starts (default: 0)")
  demo.add_argument("--certify", action="store_true",
                    help="also certify every model: IBP and CROWN certified Linf curves beside the "
                    "PGD curves (lower bounds), and randomized smoothing (L2)")
  demo.add_argument("--smoothing-n", type=int_at_least(1), default=1_000,
                    help="noise draws per image for --certify's randomized smoothing "
                    "(default: 1000; Cohen et al. use 100000)")
  demo.add_argument("--quiet", action="store_true",
                    help="no progress bars or status messages; only the table and the report path")
  demo.add_argument("--text", action="store_true",
                    help="the text demo instead (synthetic data): word swaps against a sentiment "
                    "classifier and GCG jailbreaks of a tiny language model, see "
                    "jaxrobust.demo.text_demo (uses --out, --seed, --test-size, --epochs, "
                    "--cache-dir, --no-cache, --quiet)")


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
  """``jaxrobust demo``: runs the digits demo (with ``--text`` the text demo), which prints its
  tables and writes its report; the exit status: 1 for a missing extra, an unwritable path or a
  bad size (one line on stderr), 130 when interrupted."""
  try:
    driver = "text_demo" if args.text else "digits"
    if driver in _MISSING:
      raise _MISSING[driver]
    if args.text:
      text_demo.run_text_demo(args, argv)
    else:
      digits.run_demo(args, argv=argv)
  except (ImportError, OSError, ValueError) as error:  # missing extra, unwritable path, bad size
    print(f"jaxrobust demo: error: {error}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print("jaxrobust demo: interrupted", file=sys.stderr)
    return 130
  return 0
