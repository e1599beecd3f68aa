r"""``jaxrobust evaluate``: the command line for a user's own model.

``jaxrobust evaluate MODULE:FUNCTION --data FILE.npz --eps 8/255`` imports ``MODULE`` (a path to a
``.py`` file, or a dotted module name importable from the working directory), calls
``FUNCTION()`` with no arguments, and evaluates what it returns — a ``logits_fn``
``x [B, ...] -> logits [B, C]``, or a ``flax.nnx.Module`` — with :func:`jaxrobust.evaluate` on the
arrays ``x`` (any shape ``[N, ...]``, e.g. NHWC images, with values in ``[--lower, --upper]``) and
``y`` (``[N]`` integer labels) of ``FILE.npz``. With ``--torch MODULE:FUNCTION`` instead,
``FUNCTION()`` returns a PyTorch ``nn.Module`` in eval mode, converted by
:func:`jaxrobust.interop.from_torch` (checked against the module on the first examples): ``x``
is NHWC as for a JAX model (4-D inputs reach the module as NCHW). It writes into ``--out``:

* ``report.json``: the :class:`jaxrobust.Report` (accuracies with their exact binomial intervals,
  reliability flags, provenance: attacks' full configurations, eps units, box, key, versions, the
  command, the data file's SHA-256, the model's static gradient-masking diagnosis), and
  ``per_example.npz`` (per-example flags and :math:`\epsilon^*`);
* ``summary.md``: the same numbers as a Markdown table, with the diagnosis's findings;
* ``curves.png``: :meth:`jaxrobust.Report.plot`.

The printed report ends with its "Gradient masking (static)" section (:func:`jaxrobust.diagnose`
of the model: ``none found``, or one line per finding with its remedy); findings of severity
``error`` also warn and make the report unreliable.

Without ``--devices``, a CPU run splits every batch over one JAX CPU device per usable core (at
most :data:`MAX_AUTO_CPU_DEVICES`): XLA:CPU runs a convolution's input gradient on about one
core, so this puts the others to work; the report does not depend on the device count.

With ``--checkpoint FILE`` an interrupted run resumes where it stopped and gives the identical
report. Mistakes in the user's module, the data's shapes or its value range end the command with
exit status 2 and one line saying what is wrong (``--traceback`` shows the Python traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import math
import os
import pathlib
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import jax
import numpy as np

import jaxrobust as jr
from jaxrobust._validation import logits_shape, looks_channels_first
from jaxrobust.cli._args import add_traceback_option, int_at_least
from jaxrobust.cli._errors import UserError, main_command, one_line
from jaxrobust.cli._paths import check_file_target, nearest_existing

ATTACKS = ("pgd", "fgsm", "apgd", "apgd_t", "auto_attack", "square", "fab", "fab_t", "fmn",
           "deepfool", "cw", "ddn", "brendel_bethge")
"""The attack names ``--attack`` accepts (comma-separated for several)."""

MAX_TARGETS = 9
"""Target classes of ``apgd_t`` and ``fab_t`` (AutoAttack's), at most ``C - 1`` on a ``C``-class
model."""

DEFAULT_BATCH_SIZE = 256
"""``--batch-size`` when not given (rounded up to a multiple of the device count)."""


def parse_eps(text: str) -> tuple[list[float], list[str]]:
  """``"0.01,0.02"`` or ``"2/255,8/255"`` -> the budgets and their text as given. Each is ``>= 0``;
  ``inf`` (no bound) is taken here and refused later for a fixed-budget attack
  (:func:`check_eps_for_attacks`), as :func:`jaxrobust.evaluate` does.

  Examples:
    >>> parse_eps("2/255, 8/255")[1], round(parse_eps("8/255")[0][0], 6)
    (['2/255', '8/255'], 0.031373)
    >>> parse_eps("0,0.5,inf")[0]
    [0.0, 0.5, inf]
  """
  values, texts = [], []
  for part in text.split(","):
    part = part.strip()
    try:
      value = (math.inf if part.lower().lstrip("+") in ("inf", "infinity")
               else float(Fraction(part)))
    except (ValueError, ZeroDivisionError):
      raise argparse.ArgumentTypeError(
          f"expected numbers or fractions separated by commas (0.01,0.02 or 8/255; inf: no "
          f"bound, for minimum-norm attacks), got {part!r}") from None
    if value < 0:
      raise argparse.ArgumentTypeError(f"every eps must be >= 0, got {part}")
    values.append(value)
    texts.append(part)
  return values, texts


def check_eps_for_attacks(epsilons: Sequence[float], attacks: dict[str, Any]) -> None:
  """``--eps inf`` (no bound) only with minimum-norm attacks, as :func:`jaxrobust.evaluate`
  accepts it; a :class:`UserError` names the fixed-budget attacks otherwise."""
  fixed = [name for name, attack in attacks.items() if not attack.minimum_norm]
  if math.inf in epsilons and fixed:
    raise UserError(f"--eps inf (no bound) is only meaningful for minimum-norm attacks (e.g. fmn, "
                    f"ddn, fab), but --attack {', '.join(fixed)} has a fixed budget: drop inf "
                    "from --eps or run those attacks with finite budgets")


def parse_attacks(text: str) -> list[str]:
  """Comma-separated attack names, each one of :data:`ATTACKS`."""
  names = [t.strip().replace("-", "_") for t in text.split(",") if t.strip()]
  unknown = [n for n in names if n not in ATTACKS]
  if unknown or not names:
    raise argparse.ArgumentTypeError(f"unknown attack {', '.join(unknown) or text!r}; choose "
                                     f"from {', '.join(ATTACKS)}")
  if len(set(names)) != len(names):
    raise argparse.ArgumentTypeError(f"an attack is named twice in {text!r}")
  return names


def add_parser(commands: Any) -> None:
  """Adds the ``evaluate`` sub-command to ``commands`` (an argparse sub-parser group)."""
  p = commands.add_parser(
      "evaluate", help="evaluate your own model on your own data (.npz with x and y)",
      description="Evaluate the robustness of your model: MODULE:FUNCTION names a function "
      "(in a .py file or an importable module) that takes no arguments and returns a logits "
      "function x [B, ...] -> logits [B, C] or a flax.nnx.Module (with --torch: a PyTorch "
      "nn.Module in eval mode). Writes report.json, "
      "per_example.npz, summary.md and curves.png into --out.")
  p.add_argument("model", metavar="MODULE:FUNCTION", nargs="?", default=None,
                 help="e.g. mymodel.py:make_model or mypackage.models:load")
  p.add_argument("--torch", metavar="MODULE:FUNCTION", default=None,
                 help="instead of MODULE:FUNCTION: a function returning a PyTorch nn.Module in "
                 "eval mode (NCHW images), converted with jr.interop.from_torch; x stays NHWC "
                 "(needs pip install 'jaxrobust[torch]')")
  p.add_argument("--data", required=True, type=pathlib.Path, metavar="FILE.npz",
                 help="an .npz file with arrays x [N, ...] (floats in [--lower, --upper]) and "
                 "y [N] (integer labels)")
  p.add_argument("--eps", required=True, type=parse_eps, metavar="EPS[,EPS...]",
                 help="budgets in the units of x, numbers or fractions: 0.01,0.02 or 8/255 (0 "
                 "allowed; inf, no bound, for minimum-norm attacks only)")
  p.add_argument("--attack", type=parse_attacks, default=["pgd"], metavar="NAME[,NAME...]",
                 help=f"attacks, worst case taken per example: {', '.join(ATTACKS)} "
                 f"(default: pgd); apgd_t and fab_t target the min({MAX_TARGETS}, C - 1) "
                 "runner-up classes of a C-class model, as auto_attack's members do")
  p.add_argument("--norm", choices=("linf", "l2", "l1"), default="linf",
                 help="the threat model's norm (default: linf)")
  p.add_argument("--steps", type=int_at_least(1), default=None,
                 help="iterations of pgd, apgd, apgd_t, fab, fab_t, fmn, deepfool, cw, ddn, "
                 "brendel_bethge and of auto_attack's APGD and FAB members (default: each "
                 "attack's own); not Square's queries, see --queries")
  p.add_argument("--queries", type=int_at_least(1), default=None,
                 help="queries (iterations, one forward pass each) of square and of "
                 "auto_attack's Square member (default: 5000, AutoAttack's)")
  p.add_argument("--allow-large-eps", action="store_true",
                 help="accept budgets that cover the whole box (refused by default: usually a "
                 "unit mistake, e.g. 8 for 8/255)")
  p.add_argument("--lower", type=float, default=0.0, help="smallest valid input (default: 0)")
  p.add_argument("--upper", type=float, default=1.0, help="largest valid input (default: 1)")
  p.add_argument("--batch-size", type=int_at_least(1), default=None,
                 help=f"examples per step, all devices together (default: {DEFAULT_BATCH_SIZE}, "
                 "rounded up to a multiple of the device count). With --devices N it must be a "
                 "multiple of N; without --devices it is rounded up to one. A data set smaller "
                 "than the batch runs as one batch of its size rounded up to a multiple of the "
                 "device count (the padding is masked)")
  p.add_argument("--limit", type=int_at_least(1), default=None,
                 help="evaluate only the first N examples")
  p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("jaxrobust-report"),
                 help="output directory (default: ./jaxrobust-report)")
  p.add_argument("--checkpoint", type=pathlib.Path, default=None,
                 help="checkpoint file: written after every batch, resumed from if present (its "
                 "folder is created; it must lie in a writable folder)")
  p.add_argument("--devices", type=int_at_least(1), default=None,
                 help="shard every batch over this many devices (default: on a CPU one JAX "
                 f"CPU device per usable core, at most {MAX_AUTO_CPU_DEVICES}, since XLA:CPU "
                 "runs a convolution's input gradient on about one core; on an accelerator "
                 "one device)")
  p.add_argument("--max-propagations", type=int_at_least(0), default=None, metavar="N",
                 help="cap every attack's forward plus backward propagations per example and "
                      "per eps at N (AttackBench's budget; default: no cap)")
  p.add_argument("--seed", type=int, default=0, help="seed of the attacks' randomness (default 0)")
  p.add_argument("--quiet", action="store_true", help="no progress bar")
  add_traceback_option(p)


def load_model(spec: str, *, torch: bool = False) -> tuple[Any, Any]:
  """``MODULE:FUNCTION`` -> ``(FUNCTION(), FUNCTION)``; every failure is a :class:`UserError`.
  ``torch``: ``FUNCTION`` was given with ``--torch`` (it must return a PyTorch ``nn.Module``);
  otherwise a PyTorch module it returns is refused with a pointer to ``--torch``."""
  module_name, sep, function_name = spec.rpartition(":")
  if not sep or not module_name or not function_name:
    raise UserError(f"expected MODULE:FUNCTION (e.g. mymodel.py:make_model), got {spec!r}")
  try:
    if module_name.endswith(".py") or os.sep in module_name:
      path = pathlib.Path(module_name)
      if not path.is_file():
        raise UserError(f"no such file: {module_name}")
      module_spec = importlib.util.spec_from_file_location(f"_jaxrobust_user_{path.stem}", path)
      module = importlib.util.module_from_spec(module_spec)
      sys.path.insert(0, str(path.resolve().parent))  # its sibling imports work as in python
      module_spec.loader.exec_module(module)
    else:
      sys.path.insert(0, os.getcwd())
      module = importlib.import_module(module_name)
  except UserError:
    raise
  except BaseException as error:  # noqa: BLE001 - the user's code: any failure is theirs
    if isinstance(error, KeyboardInterrupt):
      raise
    raise UserError(f"importing {module_name} failed: {one_line(error)}") from error
  function = getattr(module, function_name, None)
  if function is None:
    raise UserError(f"{module_name} has no attribute {function_name!r}")
  if not callable(function):
    raise UserError(f"{module_name}:{function_name} is not callable")
  try:
    model = function()
  except Exception as error:  # noqa: BLE001 - the user's code
    raise UserError(f"{function_name}() raised {one_line(error)}") from error
  if torch and not _is_torch_module(model):
    raise UserError(f"--torch {spec}: {function_name}() must return a PyTorch nn.Module in eval "
                    f"mode, got {type(model).__name__}")
  if not torch and _is_torch_module(model):
    raise UserError(f"{function_name}() returned a PyTorch module ({type(model).__name__}): give "
                    f"it as --torch {spec} (converted with jr.interop.from_torch)")
  if not callable(model):
    raise UserError(f"{function_name}() must return a logits function or an nnx.Module, got "
                    f"{type(model).__name__}")
  return model, function


def _is_torch_module(model: Any) -> bool:
  """Whether ``model`` is a ``torch.nn.Module`` (without importing torch if nothing did)."""
  torch = sys.modules.get("torch")
  return torch is not None and isinstance(model, torch.nn.Module)


def _check_torch_layout(x: Any) -> None:
  """With ``--torch`` the command line reads 4-D ``x`` as NHWC and hands the module NCHW: data
  saved NCHW already is refused before the conversion."""
  if looks_channels_first(tuple(x.shape[1:])):
    raise UserError(f"--torch: x has shape {tuple(x.shape)}, which looks channels-first (NCHW), "
                    "but the .npz holds channels-last images [N, H, W, C] with --torch too (they "
                    "reach the module as NCHW): save x.transpose(0, 2, 3, 1).")


def load_data(path: pathlib.Path, *, lower: float, upper: float,
              limit: int | None) -> tuple[Any, Any, str]:
  """``(x, y, sha256)`` from an ``.npz`` file, checked; every problem is a :class:`UserError`."""
  if not path.is_file():
    raise UserError(f"no such data file: {path}")
  digest = hashlib.sha256(path.read_bytes()).hexdigest()
  if not zipfile.is_zipfile(path):
    with open(path, "rb") as f:
      kind = "a single .npy array" if f.read(6) == b"\x93NUMPY" else "not an .npz archive"
    raise UserError(f"{path} is {kind}; save x and y together with np.savez(file, x=x, y=y)")
  try:
    with np.load(path, allow_pickle=False) as f:
      files = list(f.files)
      missing = [k for k in ("x", "y") if k not in files]
      if missing:
        raise UserError(f"{path} has no array {' or '.join(map(repr, missing))} (it has: "
                        f"{', '.join(files) or 'nothing'}); save it with np.savez(file, x=x, y=y)")
      x, y = f["x"], f["y"]
  except UserError:
    raise
  except Exception as error:  # noqa: BLE001 - not a readable archive
    raise UserError(f"cannot read {path} as .npz: {one_line(error)}") from error
  if limit is not None:
    x, y = x[:limit], y[:limit]
  if x.ndim < 2:
    raise UserError(f"x must be [N, ...] with at least one feature dimension, got shape {x.shape}")
  if y.ndim != 1:
    hint = " (one-hot? save y.argmax(-1))" if y.ndim == 2 else ""
    raise UserError(f"y must be [N] integer labels, got shape {y.shape}{hint}")
  if x.shape[0] != y.shape[0]:
    raise UserError(f"x has {x.shape[0]} examples but y has {y.shape[0]}")
  if x.shape[0] == 0:
    raise UserError("the data set is empty")
  if not np.issubdtype(y.dtype, np.integer):
    whole = (np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y))
             and np.all(y == np.round(y)))
    hint = "; save y.astype('int64')" if whole else ""
    raise UserError(f"y must hold integer labels, got dtype {y.dtype}{hint}")
  if not np.issubdtype(x.dtype, np.floating):
    raise UserError(f"x must be floating point, got {x.dtype}; e.g. for 8-bit images save "
                    "x.astype('float32') / 255 (values in [0, 1])")
  if x.dtype == np.float64:
    x = x.astype(np.float32)  # np.savez keeps NumPy's float64 default; JAX computes in float32
  finite = np.isfinite(x)
  if not finite.all():
    raise UserError(f"x has {int(np.sum(~finite))} NaN or infinite values")
  low, high = float(x.min()), float(x.max())
  if low < lower or high > upper:
    hint = (" (8-bit pixel values? save x / 255, or pass --upper 255)"
            if high > 1.5 and high <= 255 and upper <= 1 and low >= lower else
            " (normalised by a mean and std? save the images in [0, 1] and normalise inside the "
            "model, so that eps is in the images' units)" if low < 0 <= lower else "")
    raise UserError(f"x has values in [{low:g}, {high:g}], outside the box [{lower:g}, "
                    f"{upper:g}] given by --lower/--upper{hint}")
  if int(y.min()) < 0 or int(y.max()) > np.iinfo(np.int32).max:
    raise UserError(f"y must hold class indices >= 0, got min {int(y.min())}, max {int(y.max())}")
  return x, y.astype(np.int32), digest  # in range: the cast keeps every label


def build_attacks(names: Sequence[str], norm: str, steps: int | None,
                  queries: int | None = None, num_classes: int | None = None) -> dict[str, Any]:
  """``--attack`` names -> ``{name: jr.Attack}`` for ``norm``; raises :class:`UserError` for a
  norm an attack does not support.

  ``steps`` (``--steps``) sets the iterations of every attack that has steps, Square's excepted;
  ``queries`` (``--queries``) sets Square's, alone and as AutoAttack's member (``None``: each
  attack's default). ``apgd_t`` and ``fab_t`` target ``min(MAX_TARGETS, num_classes - 1)``
  classes (:data:`MAX_TARGETS` when ``num_classes`` is ``None``; at least one), so that a model
  with fewer than ten classes runs them as ``auto_attack`` runs its targeted members.
  """
  if num_classes is not None:
    _check_class_count(names, num_classes)
  a = jr.attacks
  with_steps = {} if steps is None else {"steps": steps}
  with_queries = {} if queries is None else {"queries": queries}
  targets = MAX_TARGETS if num_classes is None else max(1, min(MAX_TARGETS, num_classes - 1))
  factories: dict[str, Callable[[], Any]] = {
      "pgd": lambda: a.pgd(norm, **with_steps),
      "fgsm": lambda: a.fgsm(norm),
      "apgd": lambda: a.apgd(norm, **with_steps),
      "apgd_t": lambda: a.apgd(norm, targeted=True, n_target_classes=targets, **with_steps),
      "auto_attack": lambda: a.auto_attack(norm, **with_steps, **with_queries),
      "square": lambda: a.square(norm, **with_queries),
      "fab": lambda: a.fab(norm, **with_steps),
      "fab_t": lambda: a.fab(norm, targeted=True, n_target_classes=targets, **with_steps),
      "fmn": lambda: a.fmn(norm, **with_steps),
      "deepfool": lambda: a.deepfool(norm, **with_steps),
      "cw": lambda: _carlini_wagner(norm, with_steps),
      "ddn": lambda: _ddn(norm, with_steps),
      "brendel_bethge": lambda: a.brendel_bethge(norm, **with_steps),
  }
  out = {}
  for name in names:
    try:
      out[name] = factories[name]()
    except ValueError as error:
      raise UserError(f"--attack {name} with --norm {norm}: {one_line(error)}") from error
  return out


def _check_class_count(names: Sequence[str], num_classes: int) -> None:
  """``apgd_t`` and ``auto_attack`` use the targeted DLR loss, which needs four classes: on a
  smaller model a :class:`UserError` names the attacks the command line can run instead."""
  needed = jr.losses.MIN_CLASSES_TARGETED["dlr"]
  dlr = [name for name in names if name in ("apgd_t", "auto_attack")]
  if dlr and num_classes < needed:
    raise UserError(f"--attack {', '.join(dlr)} uses the targeted DLR loss, which needs at least "
                    f"{needed} classes, but the model has {num_classes}: use --attack "
                    "apgd,fab_t,square instead")


def _ddn(norm: str, with_steps: dict[str, int]) -> Any:
  if norm != "l2":
    raise ValueError("DDN is an L2 attack; pass --norm l2")
  return jr.attacks.ddn(**with_steps)


def _carlini_wagner(norm: str, with_steps: dict[str, int]) -> Any:
  if norm != "l2":
    raise ValueError("Carlini-Wagner is an L2 attack; pass --norm l2")
  return jr.attacks.carlini_wagner_l2(**with_steps)


def _check_model(model: Any, x: Any) -> int:
  """Runs the model abstractly on two examples: a failure there is the user's, in one line.
  Returns the model's class count ``C`` (its logits are ``[B, C]``)."""
  spec = jax.ShapeDtypeStruct((min(2, x.shape[0]),) + x.shape[1:], x.dtype)
  try:  # the library's own trace of a model: its notes (train mode, NCHW) reach one_line
    shape = logits_shape(lambda inputs: model(inputs), spec)
  except Exception as error:  # noqa: BLE001 - the user's model
    raise UserError(f"the model failed on inputs of shape {tuple(spec.shape)} and dtype "
                    f"{spec.dtype}: {one_line(error)}") from error
  if len(shape) != 2 or shape[0] != spec.shape[0]:
    raise UserError(f"the model must return logits [B, C]; on inputs of shape "
                    f"{tuple(spec.shape)} it returned shape {shape}")
  return int(shape[1])


def convert_torch(module: Any, x: Any) -> Any:
  """``--torch``: the user's ``nn.Module`` as a jaxrobust model
  (:func:`jaxrobust.interop.from_torch`), checked on the first (up to 8) examples of ``x``
  (NHWC images are given to the module as NCHW); every failure is a :class:`UserError`."""
  _check_torch_layout(x)
  example = x[:8]
  if example.ndim == 4:
    example = example.transpose(0, 3, 1, 2)  # the module's own layout
  try:
    return jr.interop.from_torch(module, example)
  except (ImportError, TypeError, ValueError, NotImplementedError) as error:
    raise UserError(f"--torch: {one_line(error)}") from error


MAX_AUTO_CPU_DEVICES = 8
"""At most this many CPU devices without ``--devices``: each holds its own copy of the weights."""


def usable_cores() -> int:
  """The CPU cores this process may run on (its affinity mask where the OS has one)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # macOS, Windows
    return os.cpu_count() or 1


def _use_devices(count: int | None) -> Any:
  """A 1-D mesh over the first ``count`` devices (``None``: no mesh). On CPU, asks JAX for
  ``count`` devices if no JAX operation ran yet.

  ``count=None`` (no ``--devices``): on a CPU backend, one device per usable core, at most
  :data:`MAX_AUTO_CPU_DEVICES` (and at most the devices JAX has, if its backend is already up).
  XLA:CPU runs a convolution's input gradient on about one core, so an attack's batch split over
  the cores' devices runs up to that many times faster (2 cores: ``benchmarks/RESULTS.md``,
  "Every core of a CPU"); the report does not depend on the device count. On an accelerator: no
  mesh (one device).
  """
  auto = count is None
  wanted = min(usable_cores(), MAX_AUTO_CPU_DEVICES) if auto else count
  try:
    if wanted > 1:
      jax.config.update("jax_num_cpu_devices", wanted)
  except RuntimeError:  # the backend is already up: use the devices it has
    pass
  devices = jax.devices()
  if auto:
    count = min(wanted, len(devices))
    if jax.default_backend() != "cpu" or count == 1:
      return None
  elif count > len(devices):
    raise UserError(f"--devices {count} but JAX sees {len(devices)} {devices[0].platform} "
                    "device(s)")
  return jax.make_mesh((count,), ("batch",), devices=devices[:count])


def _batch_size(args: argparse.Namespace, num_examples: int, mesh: Any) -> int:
  """The global batch size: a multiple of the mesh's device count, as :func:`jaxrobust.evaluate`
  requires (it pads and masks the last batch).

  ``--batch-size`` (default :data:`DEFAULT_BATCH_SIZE`) is used as given when it is a multiple of
  the device count; otherwise it is rounded up to one, unless the user gave both ``--batch-size``
  and ``--devices``: then a :class:`UserError` names both and suggests valid sizes. A data set
  smaller than the batch runs as one batch of its size rounded up to a multiple of the devices,
  whatever the options.
  """
  devices = 1 if mesh is None else mesh.size
  batch = DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size
  if batch >= num_examples:  # one batch holds the whole data set
    batch = num_examples
  elif batch % devices and args.batch_size is not None and args.devices is not None:
    below, above = batch // devices * devices, -(-batch // devices) * devices
    valid = f"{below} or {above}" if below else f"{above}"
    raise UserError(f"--batch-size {batch} is not a multiple of --devices {args.devices} (each "
                    f"device takes an equal share of every batch): pass --batch-size {valid}")
  return -(-batch // devices) * devices


def run_evaluate(args: argparse.Namespace, argv: Sequence[str]) -> Any:
  """Loads the model and data, runs :func:`jaxrobust.evaluate`, writes the outputs; returns the
  :class:`jaxrobust.Report`. Raises :class:`UserError` for the user's mistakes."""
  if not args.lower < args.upper:
    raise UserError(f"--lower {args.lower} must be below --upper {args.upper}")
  _check_out_folder(args.out)  # before the run, which a bad --out would otherwise waste
  if args.checkpoint is not None:  # before anything compiles: a path it could not write
    check_file_target("--checkpoint", args.checkpoint, example="run.ckpt", create_folders=True)
  mesh = _use_devices(args.devices)
  epsilons, eps_text = args.eps
  attacks = build_attacks(args.attack, args.norm, args.steps, args.queries)  # fails early
  check_eps_for_attacks(epsilons, attacks)
  if (args.model is None) == (args.torch is None):
    raise UserError("give the model either as MODULE:FUNCTION (a JAX model) or as --torch "
                    "MODULE:FUNCTION (a PyTorch module), not " + ("both" if args.model else
                                                                  "neither"))
  model, _ = load_model(args.model or args.torch, torch=args.torch is not None)
  x, y, digest = load_data(args.data, lower=args.lower, upper=args.upper, limit=args.limit)
  if args.torch is not None:
    model = convert_torch(model, x)
  num_classes = _check_model(model, x)
  # Again for the model's class count: the targets of apgd_t and fab_t, targeted DLR's minimum.
  attacks = build_attacks(args.attack, args.norm, args.steps, args.queries, num_classes)
  batch_size = _batch_size(args, len(x), mesh)
  try:
    report = jr.evaluate(model, (x, y), attacks=attacks, epsilons=epsilons,
                         key=jax.random.key(args.seed), batch_size=batch_size,
                         mesh=mesh, checkpoint=args.checkpoint, progress=not args.quiet,
                         lower=args.lower, upper=args.upper, keep_per_example=True,
                         max_propagations=args.max_propagations,
                         allow_large_eps=args.allow_large_eps)
  except ValueError as error:  # bad eps, labels out of range, a checkpoint of another run
    message = one_line(error).removeprefix("ValueError: ")
    raise UserError(message.replace("Pass allow_large_eps=True", "Pass --allow-large-eps")) \
        from error
  except OSError as error:  # the checkpoint's folder, if it changed since checked
    if args.checkpoint is None or not _concerns(error, args.checkpoint):
      raise
    raise UserError(f"--checkpoint {args.checkpoint} cannot be written: {one_line(error)}") \
        from error
  provenance = dict(report.provenance, command=["jaxrobust", *argv],
                    model=args.model or f"--torch {args.torch}",
                    seed=args.seed, eps_text=eps_text,
                    data={"path": str(args.data), "sha256": digest, "num_examples": int(len(x)),
                          "x_shape": list(x.shape[1:]), "x_dtype": str(x.dtype)})
  report = dataclasses.replace(report, provenance=provenance)
  write_outputs(report, args.out)
  return report


def _check_out_folder(path: pathlib.Path) -> None:
  """Raises :class:`UserError` when ``--out`` could not be written after the run: a file, or a
  folder whose nearest existing ancestor is not a writable folder. Creates nothing (a run that
  fails creates no folder)."""
  if path.exists() and not path.is_dir():
    raise UserError(f"--out {path} is a file; give a folder (it will hold report.json, "
                    "per_example.npz, summary.md and curves.png)")
  ancestor = nearest_existing(path)
  if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
    raise UserError(f"--out {path} cannot be created: {ancestor} is not a writable folder")


def _concerns(error: OSError, path: pathlib.Path) -> bool:
  """Whether ``error`` is about ``path``'s folder, a file in it or one of its ancestors."""
  if not error.filename:
    return False
  named, folder = pathlib.Path(os.fsdecode(error.filename)).absolute(), path.absolute().parent
  return named == folder or folder in named.parents or named in folder.parents


def write_outputs(report: Any, out: pathlib.Path) -> list[pathlib.Path]:
  """``report.json`` and ``per_example.npz`` (:meth:`jaxrobust.Report.save`), ``summary.md`` and,
  if matplotlib is installed, ``curves.png``; returns the paths written."""
  report.save(out)
  written = [out / "report.json"]
  if report.per_example is not None:
    written.append(out / "per_example.npz")
  (out / "summary.md").write_text(summary_markdown(report), encoding="utf-8")
  written.append(out / "summary.md")
  try:
    report.plot(out / "curves.png")
    written.append(out / "curves.png")
  except ImportError as error:
    print(f"jaxrobust: curves.png not written: {error}", file=sys.stderr)
  return written


def _fmt(value: float, interval: Sequence[float]) -> str:
  return f"{value:.4f} [{interval[0]:.4f}, {interval[1]:.4f}]"


def summary_markdown(report: Any) -> str:
  """The report as Markdown: threat model, clean accuracy and a table of robust accuracies with
  their intervals (one row per eps), flags, the static diagnosis (if the report has one) and
  provenance.

  Examples:
    >>> import numpy as np
    >>> import jaxrobust as jr
    >>> r = jr.Report.from_counts(epsilons=np.array([0.5], np.float32), n=4, clean_correct=4,
    ...                           robust={"pgd": np.array([2])}, worst_case=np.array([2]),
    ...                           info={"pgd": ("pgd-linf", "linf", False)}, flags={"pgd": {}})
    >>> print(summary_markdown(r).splitlines()[-4])
    | 0.5 | 0.5000 [0.0676, 0.9324] | 0.5000 [0.0676, 0.9324] |
  """
  p = report.provenance or {}
  percent = round(100 * report.confidence)
  eps_text = p.get("eps_text") or [f"{e:g}" for e in report.epsilons]
  names = list(report.attacks)
  lines = ["# Robustness report", ""]
  if "model" in p:
    data = p.get("data", {})
    lines.append(f"Model `{p['model']}` on `{data.get('path', '?')}` ({report.num_examples} "
                 f"examples of shape {data.get('x_shape')}, {data.get('x_dtype')}).")
  threat = p.get("threat_model", {})
  lines += [f"Threat model: {threat.get('eps_units', report.worst_case.norm + ' norm')}; the "
            "worst case is taken per example over the attacks.", "",
            f"Clean accuracy: {_fmt(report.clean_accuracy, report.clean_interval)} "
            f"({report.num_examples} examples; brackets: exact {percent}% binomial interval).",
            ""]
  headers = ["eps", *names, "worst case", *(f"certified: {c}" for c in report.certified)]
  lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
  summaries = [*report.attacks.values(), report.worst_case, *report.certified.values()]
  for k, text in enumerate(eps_text):
    cells = [_fmt(s.robust_accuracy[k], s.robust_interval[k]) for s in summaries]
    lines.append("| " + " | ".join([text, *cells]) + " |")
  lines.append("")
  raised = [f"{n}: {f}" for n, fl in report.flags.items() for f, up in sorted(fl.items()) if up]
  lines.append("Reliability flags: " + (", ".join(raised) + " (the robust accuracy may be "
                                        "overestimated)" if raised else "none raised."))
  lines.append("")
  lines += _diagnosis_markdown(report.diagnosis)
  for name, attack in p.get("attacks", {}).items():
    lines.append(f"- `{name}`: `{json.dumps(attack.get('config') or attack.get('description'))}`")
  if p:
    lines.append(f"- jaxrobust {p.get('jaxrobust_version')}, JAX {p.get('jax_version')} "
                 f"({p.get('backend')}), key {p.get('key')}")
  return "\n".join(lines) + "\n"


def _diagnosis_markdown(diagnosis: Any) -> list[str]:
  """The static diagnosis's lines of ``summary.md``: none without a diagnosis."""
  if diagnosis is None:
    return []
  if not diagnosis:
    return [f"{jr.diagnosis.SECTION}: none found.", ""]
  lines = [f"{jr.diagnosis.SECTION}: {len(diagnosis.errors)} error(s), "
           f"{len(diagnosis.warnings)} warning(s) on the path from x to the logits"
           + (" (the robust accuracy may be overestimated):" if diagnosis.errors else ":"), ""]
  lines += [f"- {f.severity} `{f.kind}` (`{f.primitive}`) at `{f.place}`: {f.message} "
            f"Remedy: {f.remedy}" for f in diagnosis]
  return lines + [""]


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
  """``jaxrobust evaluate``: the exit status."""
  def run():
    start = time.perf_counter()
    report = run_evaluate(args, argv)
    print(report)
    print(f"Report written to {args.out.resolve()} ({time.perf_counter() - start:.1f} s)")
  return main_command("evaluate", run, args)

