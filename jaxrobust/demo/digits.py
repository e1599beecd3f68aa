"""The digits demo's driver: what ``jaxrobust demo`` does (its options: :mod:`jaxrobust.cli.demo`).

``jaxrobust demo`` trains (or loads from the cache) four `SmallCNN` models on scikit-learn's 8x8
digits with the losses of :mod:`jaxrobust.training` (see :mod:`jaxrobust.demo.train`): ``plain``
(clean cross-entropy), ``adversarial`` (Madry et al.'s PGD-7 training at Linf eps 0.2),
``trades`` (TRADES, beta 6, at eps 0.2) and ``ibp`` (interval-bound-propagation training, eps
ramped to 0.1); ``--models`` picks some of them. It measures every model with the same Linf PGD
robustness curve over an eps grid ``0 ... --eps-max`` and prints a table such as::

       eps     plain  adversarial    trades       ibp
    0.0000    0.9833       0.9815    0.9685    0.9130
    0.0500    0.8741       0.9370    0.9333    0.8407
    0.1000    0.5537       0.8370    0.8537    0.7019
    ...

With ``--certify`` it adds the certified (IBP and CROWN) accuracy of every model at the same eps,
a lower bound beside the PGD upper bound: the trade-offs of the training methods on real data
(IBP training: lower clean accuracy, but IBP certifies 78% of the test set at eps 0.05 and 56% at
0.1, where it certifies none of the other models, and CROWN 64% at 0.1 against at most 38%).

It writes a JSON report (``--out``, default ``./report.json``) with the keys:

* ``jaxrobust_version``, ``jax_version``, ``backend``, ``python_version``, ``command`` (the
  argv), ``seed``;
* ``dataset``: name, sizes, image shape, value range, split;
* ``attack``: the evaluation attack's name and settings;
* ``epsilons``: the eps grid (``--num-eps`` values);
* ``num_test_examples``, ``eval_batch_size``;
* ``models``: for each model (``"plain"``, ``"adversarial"``, ``"trades"``, ``"ibp"``, or those
  of ``--models``): ``name``, ``training`` (the full training config), ``loaded_from_cache``,
  ``clean_accuracy``, ``robust_accuracy`` (one per eps, the first at eps 0 equal to the clean
  accuracy), ``auc`` (area under robust accuracy over eps, divided by
  the largest eps), ``flags`` (the evaluation's reliability flags, e.g. ``non_finite_gradients``:
  the attack met NaN or infinite input gradients and the robust accuracy is likely
  overestimated; a raised flag is also printed under the table), ``flag_counts`` (the counts
  behind the flags: one per eps, or one number for a count made once such as
  ``non_finite_gradient_points``), ``train_seconds``, ``eval_seconds``;
* ``timings``: ``train_seconds``, ``compile_seconds``, ``eval_seconds`` (all models, without
  the compilation; with a single model the compilation cannot be told apart and
  ``compile_seconds`` is ``null``), ``total_seconds``;
* ``confidence``: the level (0.95) of the exact binomial intervals that come with every accuracy
  (``clean_accuracy_interval``, ``robust_accuracy_interval`` of each model).

``attack.config`` is the attack's full factory configuration (:attr:`jaxrobust.Attack.config`).
With ``--certify`` each model also gets ``certified`` (``ibp``, ``crown``: ``robust_accuracy``
per eps, with intervals) and ``smoothing`` (randomized smoothing's certified L2 accuracy).
Beside the report it draws every model's curve, with its confidence band, in ``curves.png``
(when matplotlib is installed; it is part of the ``demo`` extra).

Every model is measured by :func:`jaxrobust.evaluate` (padded, masked batches of
``eval_batch_size``; exact integer counts), given ``functools.partial(SmallCNN().apply,
params)``: the parameters are arguments of its compiled step, so the step is compiled once, for
the first model, and reused for the others. ``compile_seconds`` is the first model's first step
minus the fastest first step of the others (which ran the compiled step). Every test example gets
its own PRNG key (``fold_in(key, i)`` for the ``i``-th test image), so results do not depend on
the batch size.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import platform
import sys
import time
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

import jaxrobust as jr
from jaxrobust.demo import data, files
from jaxrobust.demo import train as train_lib
from jaxrobust.demo.model import SmallCNN
from jaxrobust.model import model_of

EVAL_BATCH_SIZE = 128
SMOOTHING_SIGMA = 0.25  # of --certify's randomized smoothing, in pixel units of [0, 1]
SMOOTHING_RADII = (0.0, 0.125, 0.25, 0.5)  # L2 radii of its certified accuracy
ATTACK_KEY = "pgd"  # the attack's name in each model's jr.Report


def _status(args: argparse.Namespace, message: str) -> None:
  if not args.quiet:
    print(message, file=sys.stderr, flush=True)


def format_table(report: dict[str, Any]) -> str:
  """The human-readable summary of a demo report: robust accuracy per eps for every model.

  A model whose evaluation raised a reliability flag (``models[name]["flags"]``, e.g.
  ``non_finite_gradients``: the attack saw NaN or infinite gradients, so its robust accuracy is
  likely overestimated) gets a warning line under the table.

  Examples:
    >>> report = {
    ...   "num_test_examples": 4, "dataset": {"name": "toy"}, "epsilons": [0.0, 0.5],
    ...   "attack": {"steps": 2, "restarts": 1},
    ...   "models": {"plain": {"robust_accuracy": [0.75, 0.25], "clean_accuracy": 0.75,
    ...                        "auc": 0.5, "flags": {"non_finite_gradients": True}}}}
    >>> print(format_table(report))
    Linf PGD robustness on 4 toy test images (2 steps, 1 restart); robust accuracy:
    <BLANKLINE>
         eps     plain
      0.0000    0.7500
      0.5000    0.2500
    ------------------
       clean    0.7500
         AUC    0.5000
    warning: plain: non_finite_gradients (the robust accuracy may be overestimated)
  """
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
  for name in names:
    raised = sorted(flag for flag, up in report["models"][name].get("flags", {}).items() if up)
    if raised:
      lines.append(f"warning: {name}: {', '.join(raised)} (the robust accuracy may be "
                   "overestimated)")
  lines += _certified_lines(report)
  return "\n".join(lines)


def _certified_lines(report: dict[str, Any]) -> list[str]:
  """With ``--certify``: one table per certifier (IBP, CROWN) of the certified (lower-bound) Linf
  accuracy of every model, laid out like the PGD table, and the smoothed models' certified L2
  accuracies.

  Examples:
    >>> models = {"plain": {"certified": {"ibp": {"robust_accuracy": [0.75, 0.0]}}},
    ...           "ibp": {"certified": {"ibp": {"robust_accuracy": [0.5, 0.25]}}}}
    >>> print("\\n".join(_certified_lines({"epsilons": [0.0, 0.5], "models": models})))
    <BLANKLINE>
    certified robust accuracy by IBP (a lower bound; PGD's is an upper bound):
    <BLANKLINE>
         eps     plain       ibp
      0.0000    0.7500    0.5000
      0.5000    0.0000    0.2500
  """
  models = report["models"]
  names = [name for name in models if models[name].get("certified")]
  certifiers = list(dict.fromkeys(c for name in names for c in models[name]["certified"]))
  lines = []
  widths = [max(10, len(name) + 2) for name in names]
  for certifier in certifiers:
    lines += ["", f"certified robust accuracy by {certifier.upper()} (a lower bound; PGD's is an "
              "upper bound):", "",
              f"{'eps':>8}" + "".join(f"{name:>{w}}" for name, w in zip(names, widths))]
    for k, eps in enumerate(report["epsilons"]):
      lines.append(f"{eps:>8.4f}" + "".join(
          f"{models[name]['certified'][certifier]['robust_accuracy'][k]:>{w}.4f}"
          for name, w in zip(names, widths)))
  for name, model in models.items():
    s = model.get("smoothing")
    if s:
      cells = ", ".join(f"r={r:g}: {a:.4f}" for r, a in zip(s["radii"], s["certified_accuracy"]))
      lines.append(f"smoothed {name} (L2, sigma {s['sigma']:g}, n {s['n']}): certified {cells}")
  return lines


def _test_split(test_size: Optional[int]) -> tuple[Any, Any, int]:
  """``(x, y, available)``: the first ``test_size`` images of the digits test split (all of them
  for ``None``) and the size of the whole split."""
  _, _, x_test, y_test = data.load_digits()  # a clear ImportError without scikit-learn
  available = int(x_test.shape[0])
  n = available if test_size is None else test_size
  if n > available:
    raise ValueError(f"--test-size {n} exceeds the {available} images of the test split")
  return x_test[:n], y_test[:n], available


def _train_models(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
  """Trains (or loads from the cache) the models of ``--models``.

  Returns:
    ``(params_of, models)``, both keyed by model name: the parameters, and each model's entry of
    the report so far (``name``, ``training``, ``loaded_from_cache``, ``train_seconds``).
  """
  models: dict[str, dict[str, Any]] = {}
  params_of: dict[str, Any] = {}
  for name in args.models:
    config = train_lib.training_config(name, epochs=args.epochs, seed=args.seed)
    t0 = time.perf_counter()
    params, cached = train_lib.load_or_train(
      config, cache_dir=args.cache_dir, cache=not args.no_cache, progress=not args.quiet
    )
    seconds = time.perf_counter() - t0
    where = "" if args.no_cache else f" ({train_lib.cache_path(config, args.cache_dir)})"
    _status(args, f"{name}: {'loaded from cache' if cached else 'trained'} in "
            f"{seconds:.1f} s{where}")
    params_of[name] = params
    models[name] = {"name": name, "training": config, "loaded_from_cache": cached,
                    "train_seconds": seconds}
  return params_of, models


def _evaluate_model(apply_fn: Any, params: Any, x: Any, y: Any, *, attack: Any, epsilons: Any,
                    key: Any, batch_size: int, progress: bool,
                    certifiers: Optional[dict[str, Any]] = None) -> Any:
  """``jr.evaluate`` of ``partial(apply_fn, params)`` against ``attack`` on ``(x, y)``.

  Example ``i`` of ``x`` draws its randomness from ``fold_in(key, i)`` (then ``fold_in(., k)`` at
  the ``k``-th eps), so the report does not depend on ``batch_size``. Passing the parameters
  through a ``functools.partial`` of one function makes them arguments of ``jr.evaluate``'s
  compiled step, which the next call reuses for other parameters of the same shapes.

  Returns:
    A :class:`jaxrobust.Report` with the attack under the name :data:`ATTACK_KEY`.
  """
  # jr.evaluate's defaults (early exit, cross-eps skipping). They used to be slower on XLA:CPU than
  # all eps vectorised with the attack loop unrolled; since the attack's convolutions are made
  # canonical they are faster: 4.4-5.8 s of evaluation against 6.3-8.0 s, on 2 cores, with the
  # same report (2026-11-28).
  return jr.evaluate(functools.partial(apply_fn, params), (x, y), attacks={ATTACK_KEY: attack},
                     epsilons=epsilons, key=key, batch_size=batch_size, progress=progress,
                     certifiers=certifiers)


def model_results(report: Any) -> dict[str, Any]:
  """A model's evaluation entries of the demo's JSON report, from its :class:`jaxrobust.Report`.

  The accuracies are the exact ratios of the report's integer counts (Python floats, so 55 of 64
  prints as 0.859375), each with its exact two-sided 95% binomial interval
  (``clean_accuracy_interval``, ``robust_accuracy_interval``: ``[lower, upper]`` per eps);
  ``auc`` is the report's. ``flags`` are the reliability flags of the attack
  over the whole test set and ``flag_counts`` the counts behind them, one per eps or counted once
  (e.g. ``non_finite_gradient_points``: clean-correct points whose input gradient was NaN or
  infinite).

  Examples:
    >>> import numpy as np
    >>> import jaxrobust as jr
    >>> report = jr.Report.from_counts(
    ...   epsilons=np.array([0.0, 0.2], np.float32), n=4, clean_correct=3,
    ...   robust={ATTACK_KEY: np.array([3, 1])}, worst_case=np.array([3, 1]),
    ...   info={ATTACK_KEY: ("pgd-linf", "linf", False)},
    ...   flags={ATTACK_KEY: {"non_finite_gradients": False}},
    ...   counts={ATTACK_KEY: {"non_finite_gradient_points": np.array(0)}})
    >>> results = model_results(report)
    >>> results["clean_accuracy"], results["robust_accuracy"], results["auc"], results["flags"]
    (0.75, [0.75, 0.25], 0.5, {'non_finite_gradients': False})
    >>> [[round(b, 4) for b in ci] for ci in results["robust_accuracy_interval"]]
    [[0.1941, 0.9937], [0.0063, 0.8059]]
  """
  n = report.num_examples
  attack = report.attacks[ATTACK_KEY]
  return {
    "clean_accuracy": report.clean_correct / n,
    "clean_accuracy_interval": list(report.clean_interval),
    "robust_accuracy": [int(count) / n for count in attack.robust_count],
    "robust_accuracy_interval": attack.robust_interval.tolist(),
    "auc": float(attack.auc),
    "flags": {name: bool(up) for name, up in sorted(attack.flags.items())},
    "flag_counts": {name: np.asarray(count).tolist()
                    for name, count in sorted(attack.counts.items())},
    **({"certified": {name: {"robust_accuracy": [int(c) / n for c in s.robust_count],
                             "robust_accuracy_interval": s.robust_interval.tolist(),
                             "description": s.description}
                      for name, s in report.certified.items()}} if report.certified else {}),
  }


@functools.lru_cache(maxsize=None)
def _demo_apply() -> Any:
  """``SmallCNN().apply``, one bound method per process (bound methods of two equal modules are
  different functions to ``jax.jit``), so every model and every run in the process shares the
  compiled evaluation step."""
  return SmallCNN().apply


class _Evaluation(NamedTuple):
  """Both models' evaluation: the shared settings and each model's report entries."""

  results: dict[str, dict[str, Any]]  # model name -> `model_results` + eval_seconds
  reports: dict[str, Any]  # model name -> its jr.Report
  attack: Any  # the jr.Attack
  eps_grid: Any  # [K] float64, the grid as asked for (evaluated in float32)
  batch_size: int
  compile_seconds: Optional[float]  # None with a single model (not separable from its first step)


def _evaluate_models(args: argparse.Namespace, params_of: dict[str, Any], x: Any,
                     y: Any) -> _Evaluation:
  """Evaluates every model of ``--models`` with the same attack, eps grid, keys and compiled step.

  ``jr.evaluate`` times its first step, which compiles the step for the first model and reuses
  it for the others (see `_evaluate_model`); the compilation time is the first model's first step
  minus the fastest first step of the others, and each model's ``eval_seconds`` is its
  ``jr.evaluate`` time without it (with a single model it includes it).
  """
  apply_fn = _demo_apply()  # one function for every partial: the compiled step is reused
  attack = jr.attacks.pgd("linf", steps=args.steps, restarts=args.restarts)
  eps_grid = np.linspace(0.0, args.eps_max, args.num_eps)
  key = jax.random.key(args.seed + 1)
  batch_size = min(EVAL_BATCH_SIZE, int(x.shape[0]))
  results: dict[str, dict[str, Any]] = {}
  reports: dict[str, Any] = {}
  first_steps = []
  certifiers = None
  if args.certify:
    certifiers = {"ibp": jr.certify.bounds_certifier(),
                  "crown": jr.certify.bounds_certifier(method="crown")}
  for name in args.models:
    _status(args, f"evaluating {name} ({attack.name}, {args.num_eps} eps"
            f"{', IBP and CROWN certificates' if certifiers else ''})")
    t0 = time.perf_counter()
    report = _evaluate_model(apply_fn, params_of[name], x, y, attack=attack,
                             epsilons=eps_grid.astype(np.float32), key=key,
                             batch_size=batch_size, progress=not args.quiet,
                             certifiers=certifiers)
    results[name] = {**model_results(report), "eval_seconds": time.perf_counter() - t0}
    if args.certify:
      _status(args, f"randomized smoothing of {name} (sigma {SMOOTHING_SIGMA}, "
              f"n {args.smoothing_n})")
      results[name]["smoothing"] = smoothing_results(
          functools.partial(apply_fn, params_of[name]), x, y, n=args.smoothing_n,
          key=jax.random.key(args.seed + 2))
    reports[name] = report
    first_steps.append(report.timing["compile_and_first_step_s"])
  compile_seconds = None
  if len(first_steps) > 1:
    compile_seconds = max(first_steps[0] - min(first_steps[1:]), 0.0)
    results[args.models[0]]["eval_seconds"] -= compile_seconds
    _status(args, f"compiled the evaluation step once for all {len(first_steps)} models in "
            f"{compile_seconds:.1f} s")
  return _Evaluation(results, reports, attack, eps_grid, batch_size, compile_seconds)


@functools.lru_cache(maxsize=None)
def _smoothing_program(n: int, sigma: float, radii: tuple[float, ...]) -> Any:
  """``(model, x, y, key) -> (certified counts [R], abstentions)``, jitted once per setting;
  ``model`` is a :class:`jaxrobust.model.Model`, whose parameters are arguments, so other
  parameters of the same shapes (the demo's other models) reuse the compiled program."""
  radii_array = np.asarray(radii, np.float32)

  @jax.jit
  def certify(logits_fn, x, y, key):
    certificate = jr.certify.smoothing(logits_fn, x, key, sigma=sigma, n=n,
                                       batch_size=min(n, 64))
    curve = jr.certify.certified_curve(certificate, y, radii_array)
    return jnp.sum(curve.robust, axis=1), jnp.sum(certificate.prediction < 0)

  return certify


def smoothing_results(logits_fn: Any, x: Any, y: Any, *, n: int, key: Any,
                      sigma: float = SMOOTHING_SIGMA) -> dict[str, Any]:
  """Cohen et al.'s CERTIFY (:func:`jaxrobust.certify.smoothing`, n0 = 100, alpha = 0.001) on
  every image at once (image ``i`` keyed ``fold_in(key, i)``; 64 noise draws per image at a time
  bound the memory), and the smoothed classifier's certified L2 accuracy at
  :data:`SMOOTHING_RADII` (:func:`jaxrobust.certify.certified_curve`) with exact 95% intervals.
  It certifies the smoothed model, not the one the PGD column attacks.

  The model's parameters (:func:`jaxrobust.model.model_of`) are arguments of the compiled
  program (compiled once for all the demo's models)."""
  counts, abstained = _smoothing_program(n, float(sigma), tuple(SMOOTHING_RADII))(
      model_of(logits_fn), x, np.asarray(y), key)
  counts = np.asarray(counts)
  return {"sigma": sigma, "n0": 100, "n": n, "alpha": 0.001, "norm": "l2",
          "radii": list(SMOOTHING_RADII),
          "certified_accuracy": [int(c) / len(x) for c in counts],
          "certified_accuracy_interval": jr.metrics.binomial_interval_table(
              counts, len(x)).tolist(),
          "abstained": int(abstained)}


def _dataset_info(available: int) -> dict[str, Any]:
  """The report's description of the data set; ``available`` is the size of the test split."""
  return {
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
  }


def _build_report(args: argparse.Namespace, argv: Optional[list[str]],
                  models: dict[str, dict[str, Any]], evaluation: _Evaluation, num_test: int,
                  available: int, t_start: float) -> dict[str, Any]:
  """The JSON report (see the module docstring)."""
  for name, results in evaluation.results.items():
    models[name].update(results)
  train_seconds = sum(m["train_seconds"] for m in models.values())
  eval_seconds = sum(m["eval_seconds"] for m in models.values())
  return {
    "jaxrobust_version": jr.__version__,
    "jax_version": jax.__version__,
    "backend": jax.default_backend(),
    "python_version": platform.python_version(),
    "command": ["jaxrobust", *(argv or [])],
    "seed": args.seed,
    "dataset": _dataset_info(available),
    "attack": {
      "name": evaluation.attack.name, "norm": "linf", "steps": args.steps,
      "step_size": "cosine schedule from 2 to 0", "step_size_units": "fraction of eps",
      "random_start": True, "restarts": args.restarts,
      "loss": "ce", "lower": 0.0, "upper": 1.0,
      "config": json.loads(evaluation.attack.config),
    },
    "confidence": 0.95,
    "epsilons": [round(float(e), 10) for e in evaluation.eps_grid],
    "num_test_examples": num_test,
    "eval_batch_size": evaluation.batch_size,
    "models": models,
    "timings": {
      "train_seconds": train_seconds,
      "compile_seconds": evaluation.compile_seconds,
      "eval_seconds": eval_seconds,
      "total_seconds": time.perf_counter() - t_start,
    },
  }


def _write_report(report: dict[str, Any], out: pathlib.Path) -> pathlib.Path:
  """Writes ``report`` as JSON to ``out`` atomically (:func:`jaxrobust.demo.files.write_json`)."""
  return files.write_json(report, out)


def run_demo(args: argparse.Namespace, argv: Optional[list[str]] = None) -> dict[str, Any]:
  """Trains or loads the models, evaluates them, prints the table and writes the report.

  Args:
    args: parsed ``jaxrobust demo`` options (see :func:`jaxrobust.cli.demo.add_parser`).
    argv: the command line, recorded in the report.

  Returns:
    The report dict (also written to ``args.out``).
  """
  t_start = time.perf_counter()
  x_test, y_test, available = _test_split(args.test_size)
  params_of, models = _train_models(args)
  evaluation = _evaluate_models(args, params_of, x_test, y_test)
  report = _build_report(args, argv, models, evaluation, int(x_test.shape[0]), available, t_start)
  print(format_table(report))
  print(f"Report written to {_write_report(report, args.out)}")
  plot = _write_plot(evaluation.reports, pathlib.Path(args.out).with_name("curves.png"))
  if plot is not None:
    print(f"Curves drawn in {plot}")
  return report


def _write_plot(reports: dict[str, Any], path: pathlib.Path) -> Optional[pathlib.Path]:
  """Every model's curve with its confidence band in one PNG (``None`` without matplotlib)."""
  try:
    jr.plotting.plot_reports(reports, path, title="Linf PGD on the digits (bands: 95% exact CI)")
  except ImportError as error:
    print(f"curves.png not written: {error}", file=sys.stderr)
    return None
  return path.resolve()
