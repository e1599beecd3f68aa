"""The ``jaxrobust`` command line: ``jaxrobust demo`` (also ``python -m jaxrobust demo``).

``jaxrobust demo`` trains (or loads from the cache) two `SmallCNN` models on scikit-learn's 8x8
digits, one plainly and one adversarially (Linf PGD-7, eps 0.2), then measures both with the same
Linf PGD robustness curve over an eps grid ``0 ... --eps-max`` and prints a table such as::

       eps     plain  adversarial
    0.0000    0.9833       0.9741
    0.1000    0.5519       0.8667
    ...

It writes a JSON report (``--out``, default ``./report.json``) with the keys:

* ``jaxrobust_version``, ``jax_version``, ``backend``, ``command`` (the argv), ``seed``;
* ``dataset``: name, sizes, image shape, value range, split;
* ``attack``: the evaluation attack's name and settings;
* ``epsilons``: the eps grid (``--num-eps`` values);
* ``num_test_examples``;
* ``models``: for ``"plain"`` and ``"adversarial"``: ``name``, ``training`` (the full training
  config), ``loaded_from_cache``, ``clean_accuracy``, ``robust_accuracy`` (one per eps, the first
  at eps 0 equal to the clean accuracy), ``auc`` (area under robust accuracy over eps, divided by
  the largest eps), ``train_seconds``, ``eval_seconds``;
* ``timings``: ``train_seconds``, ``compile_seconds``, ``eval_seconds``, ``total_seconds``.

The evaluation function is compiled once (ahead of time) and serves both models and every batch:
parameters, inputs, the eps grid and keys are all arguments, and the last short batch is padded
to the batch size and masked out. Every test example gets its own PRNG key (folded from its index),
so results do not depend on the batch size.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import pathlib
import platform
import sys
import time
from typing import Any, Optional, Sequence

EVAL_BATCH_SIZE = 128
MODEL_NAMES = ("plain", "adversarial")


def _int_at_least(minimum: int):
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
      raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value

  parse.__name__ = f"integer >= {minimum}"
  return parse


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


def build_parser() -> argparse.ArgumentParser:
  """The argument parser of the ``jaxrobust`` command."""
  parser = argparse.ArgumentParser(
    prog="jaxrobust", description="Empirical adversarial robustness evaluation in JAX."
  )
  commands = parser.add_subparsers(dest="command", metavar="COMMAND")
  demo = commands.add_parser(
    "demo",
    help="train a plain and an adversarially trained CNN on the digits and compare their "
    "robustness curves",
    description="Train (or load from the cache) a plain and a PGD-adversarially-trained SmallCNN "
    "on scikit-learn's 8x8 digits, evaluate both with a Linf PGD robustness curve, print a table "
    "and write a JSON report.",
  )
  demo.add_argument("--out", type=pathlib.Path, default=pathlib.Path("report.json"),
                    help="where to write the JSON report (default: ./report.json)")
  demo.add_argument("--eps-max", type=_eps_max, default=0.3,
                    help="largest Linf eps of the grid, in pixel units of [0, 1] (default: 0.3)")
  demo.add_argument("--num-eps", type=_int_at_least(2), default=7,
                    help="number of eps values, evenly spaced from 0 to --eps-max inclusive "
                    "(default: 7)")
  demo.add_argument("--steps", type=_int_at_least(1), default=20,
                    help="PGD steps of the evaluation attack (default: 20)")
  demo.add_argument("--restarts", type=_int_at_least(1), default=1,
                    help="PGD random restarts of the evaluation attack (default: 1)")
  demo.add_argument("--test-size", type=_int_at_least(1), default=None,
                    help="evaluate on the first N test images (default: the whole test split, 540)")
  demo.add_argument("--epochs", type=_int_at_least(1), default=None,
                    help="training epochs of both models (default: 20)")
  demo.add_argument("--cache-dir", type=pathlib.Path, default=None,
                    help="parameter cache directory (default: $XDG_CACHE_HOME/jaxrobust or "
                    "~/.cache/jaxrobust)")
  demo.add_argument("--no-cache", action="store_true",
                    help="always train, and do not write the cache")
  demo.add_argument("--seed", type=_int_at_least(0), default=0,
                    help="seed of training and of the attacks' random starts (default: 0)")
  demo.add_argument("--quiet", action="store_true",
                    help="no progress bars or status messages; only the table and the report path")
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs the ``jaxrobust`` command and returns its exit status (never raises ``SystemExit``).

  Args:
    argv: the arguments after the program name; ``None`` means ``sys.argv[1:]``.

  Returns:
    0 on success, 1 if the demo failed, 2 for bad command-line options.

  Examples:
    >>> main(["demo", "--epochs", "1", "--test-size", "32", "--num-eps", "2", "--steps", "2",
    ...       "--no-cache", "--quiet", "--out", "/tmp/report.json"])  # doctest: +SKIP
    0
  """
  parser = build_parser()
  try:
    args = parser.parse_args(argv)
  except SystemExit as exit_:  # argparse's --help (0) and usage errors (2)
    return exit_.code if isinstance(exit_.code, int) else 2
  if args.command is None:
    parser.print_help(sys.stderr)
    return 2
  try:
    run_demo(args, argv=list(sys.argv[1:] if argv is None else argv))
  except (ImportError, OSError, ValueError) as error:  # missing extra, unwritable path, bad size
    print(f"jaxrobust demo: error: {error}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print("jaxrobust demo: interrupted", file=sys.stderr)
    return 130
  return 0


def _status(args: argparse.Namespace, message: str) -> None:
  if not args.quiet:
    print(message, file=sys.stderr, flush=True)


def make_eval_fn(attack: Any, model: Any):
  """The per-batch evaluation ``(params, x, y, mask, index, epsilons, key) -> (clean, robust)``.

  Returns the jitted function; ``clean`` is the number of correctly classified unmasked examples
  and ``robust`` ``[K]`` the number of unmasked examples robust at each eps. Example ``i`` of the
  test set uses the key ``fold_in(key, index[i])``.
  """
  import jax
  import jax.numpy as jnp

  import jaxrobust as jr

  def eval_batch(params, x, y, mask, index, epsilons, key):
    logits_fn = functools.partial(model.apply, params)
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, index)
    # All eps vectorised and the attack loop unrolled: no loop around the model, which on
    # XLA:CPU runs the strided convolution's input gradient several times faster (see
    # benchmarks/RESULTS.md); results are those of any other setting up to float rounding.
    curve = jr.robustness_curve(attack, logits_fn, x, y, epsilons, keys, eps_batch_size=0,
                                unroll=True)
    correct = (jr.predict(logits_fn(x)) == y) & mask
    robust = curve.robust & mask[None, :]
    return jnp.sum(correct, dtype=jnp.int32), jnp.sum(robust, axis=1, dtype=jnp.int32)

  return jax.jit(eval_batch)


def evaluate(
  compiled: Any, params: Any, x: Any, y: Any, epsilons: Any, key: Any, *, batch_size: int,
  desc: str, progress: bool,
) -> dict[str, Any]:
  """Runs ``compiled`` (from `make_eval_fn`) over ``x``/``y`` in padded, masked batches.

  Returns:
    ``{"clean_accuracy": float, "robust_accuracy": [K floats], "auc": float}``.
  """
  import numpy as np
  from tqdm.auto import tqdm

  import jaxrobust as jr

  n = int(x.shape[0])
  eps_host = np.asarray(epsilons, dtype=np.float32)
  clean_total = 0
  robust_total = np.zeros(eps_host.shape, dtype=np.int64)
  bar = tqdm(total=n, desc=desc, unit="ex", disable=not progress, leave=False)
  for start in range(0, n, batch_size):
    stop = min(start + batch_size, n)
    size = stop - start
    xb = np.zeros((batch_size, *x.shape[1:]), dtype=np.float32)
    yb = np.zeros((batch_size,), dtype=np.int32)
    xb[:size], yb[:size] = x[start:stop], y[start:stop]
    mask = np.arange(batch_size) < size
    index = np.arange(start, start + batch_size, dtype=np.uint32)
    clean, robust = compiled(params, xb, yb, mask, index, epsilons, key)
    clean_total += int(clean)
    robust_total += np.asarray(robust, dtype=np.int64)
    bar.update(size)
    if progress:
      bar.set_postfix(clean=f"{clean_total / stop:.3f}",
                      **{f"robust@{eps_host[-1]:.3g}": f"{robust_total[-1] / stop:.3f}"})
  bar.close()
  clean_accuracy = clean_total / n
  robust_accuracy = robust_total / n
  auc = float(jr.metrics.curve_auc(eps_host, robust_accuracy.astype(np.float32),
                                   np.float32(clean_accuracy)))
  return {
    "clean_accuracy": float(clean_accuracy),
    "robust_accuracy": [float(a) for a in robust_accuracy],
    "auc": auc,
  }


def format_table(report: dict[str, Any]) -> str:
  """The human-readable summary of a demo report: robust accuracy per eps for both models."""
  names = list(report["models"])
  widths = [max(10, len(name) + 2) for name in names]
  attack = report["attack"]
  lines = [
    f"Linf PGD robustness on {report['num_test_examples']} {report['dataset']['name']} test "
    f"images ({attack['steps']} steps, {attack['restarts']} restart"
    f"{'s' if attack['restarts'] != 1 else ''}); robust accuracy:",
    "",
    f"{'eps':>8}" + "".join(f"{name:>{w}}" for name, w in zip(names, widths)),
  ]
  for k, eps in enumerate(report["epsilons"]):
    lines.append(f"{eps:>8.4f}" + "".join(
      f"{report['models'][name]['robust_accuracy'][k]:>{w}.4f}" for name, w in zip(names, widths)
    ))
  lines.append("-" * len(lines[-1]))
  for label, key in (("clean", "clean_accuracy"), ("AUC", "auc")):
    lines.append(f"{label:>8}" + "".join(
      f"{report['models'][name][key]:>{w}.4f}" for name, w in zip(names, widths)
    ))
  return "\n".join(lines)


def run_demo(args: argparse.Namespace, argv: Optional[list[str]] = None) -> dict[str, Any]:
  """Trains or loads both models, evaluates them, prints the table and writes the report.

  Args:
    args: parsed ``jaxrobust demo`` options (see `build_parser`).
    argv: the command line, recorded in the report.

  Returns:
    The report dict (also written to ``args.out``).
  """
  t_start = time.perf_counter()
  from jaxrobust.demo import data  # raises a clear ImportError without scikit-learn

  _, _, x_test, y_test = data.load_digits()

  import jax
  import numpy as np

  import jaxrobust as jr
  from jaxrobust.demo import train as train_lib
  from jaxrobust.demo.model import SmallCNN

  available = int(x_test.shape[0])
  n = available if args.test_size is None else args.test_size
  if n > available:
    raise ValueError(f"--test-size {n} exceeds the {available} images of the test split")
  x_test, y_test = x_test[:n], y_test[:n]
  progress = not args.quiet

  # Training (or the cache).
  models: dict[str, dict[str, Any]] = {}
  params_of: dict[str, Any] = {}
  for name in MODEL_NAMES:
    config = train_lib.training_config(name == "adversarial", epochs=args.epochs, seed=args.seed)
    t0 = time.perf_counter()
    params, cached = train_lib.load_or_train(
      config, cache_dir=args.cache_dir, cache=not args.no_cache, progress=progress
    )
    seconds = time.perf_counter() - t0
    where = "" if args.no_cache else f" ({train_lib.cache_path(config, args.cache_dir)})"
    _status(args, f"{name}: {'loaded from cache' if cached else 'trained'} in "
            f"{seconds:.1f} s{where}")
    params_of[name] = params
    models[name] = {"name": name, "training": config, "loaded_from_cache": cached,
                    "train_seconds": seconds}

  # One compiled evaluation function for both models and every batch.
  model = SmallCNN()
  attack = jr.attacks.pgd("linf", steps=args.steps, restarts=args.restarts)
  eps_grid = np.linspace(0.0, args.eps_max, args.num_eps)
  epsilons = eps_grid.astype(np.float32)
  key = jax.random.key(args.seed + 1)
  batch_size = min(EVAL_BATCH_SIZE, n)
  t0 = time.perf_counter()
  compiled = make_eval_fn(attack, model).lower(
    params_of[MODEL_NAMES[0]],
    np.zeros((batch_size, *x_test.shape[1:]), np.float32), np.zeros((batch_size,), np.int32),
    np.ones((batch_size,), bool), np.zeros((batch_size,), np.uint32), epsilons, key,
  ).compile()
  compile_seconds = time.perf_counter() - t0
  _status(args, f"compiled the evaluation ({attack.name}, {args.num_eps} eps) in "
          f"{compile_seconds:.1f} s")

  for name in MODEL_NAMES:
    t0 = time.perf_counter()
    models[name].update(evaluate(
      compiled, params_of[name], x_test, y_test, epsilons, key, batch_size=batch_size,
      desc=f"eval {name}", progress=progress,
    ))
    models[name]["eval_seconds"] = time.perf_counter() - t0

  train_seconds = sum(m["train_seconds"] for m in models.values())
  eval_seconds = sum(m["eval_seconds"] for m in models.values())
  report = {
    "jaxrobust_version": train_lib.jaxrobust_version(),
    "jax_version": jax.__version__,
    "backend": jax.default_backend(),
    "python_version": platform.python_version(),
    "command": ["jaxrobust", *(argv or [])],
    "seed": args.seed,
    "dataset": {
      "name": "sklearn digits",
      "source": "sklearn.datasets.load_digits",
      "num_examples": data.NUM_EXAMPLES,
      "num_train": data.NUM_EXAMPLES - available,
      "num_test": available,
      "image_shape": list(data.IMAGE_SHAPE),
      "layout": "NHWC",
      "value_range": [0.0, 1.0],
      "num_classes": data.NUM_CLASSES,
      "split": {"test_fraction": 0.3, "seed": 0, "stratified": True},
    },
    "attack": {
      "name": attack.name, "norm": "linf", "steps": args.steps,
      "step_size": "cosine schedule from 2 to 0", "step_size_units": "fraction of eps",
      "random_start": True, "restarts": args.restarts,
      "loss": "ce", "lower": 0.0, "upper": 1.0,
    },
    "epsilons": [round(float(e), 10) for e in eps_grid],
    "num_test_examples": n,
    "eval_batch_size": batch_size,
    "models": models,
    "timings": {
      "train_seconds": train_seconds,
      "compile_seconds": compile_seconds,
      "eval_seconds": eval_seconds,
      "total_seconds": time.perf_counter() - t_start,
    },
  }

  print(format_table(report))
  out = pathlib.Path(args.out)
  if out.parent != pathlib.Path(""):
    out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
  try:
    tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out)
  finally:
    tmp.unlink(missing_ok=True)
  print(f"Report written to {out.resolve()}")
  return report
