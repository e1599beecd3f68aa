"""Input validation at the Python boundary.

Shape and dtype checks are static, so they also run while ``jit`` traces. Checks that need values
(labels in range, eps units, ``x`` inside the box, NaN) run only on concrete arrays: inside a
user's ``jax.jit`` they are skipped, so call :func:`check_inputs` once on the host before jitting.
Every message says what was wrong and how to fix it.
"""

from __future__ import annotations

import inspect
import math
import operator

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._types import Budget, as_budget
from jaxrobust.model import captured_constants, trace_model, tracing, warn_if_captured
from jaxrobust.projections import check_norm


def is_concrete(*values: Any) -> bool:
  """True when none of ``values`` is a tracer, so their contents can be read."""
  return not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(values))


def check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
  """``value`` as a Python int: an integral number ``>= minimum`` (a Python or NumPy int, or a
  concrete JAX integer scalar: anything :func:`operator.index` takes); a bool, float or string is
  refused, not converted."""
  number = None
  if not isinstance(value, (bool, np.bool_)) and getattr(value, "dtype", None) != np.bool_:
    try:
      number = operator.index(value)
    except TypeError:
      pass
  if number is None or number < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")
  return number


def check_step_size(step_size: Any) -> float:
  if not isinstance(step_size, (int, float, np.floating)) or not np.isfinite(step_size) \
      or step_size <= 0:
    raise ValueError(
        f"step_size must be a finite number > 0 (a fraction of eps), got {step_size!r}.")
  return float(step_size)


def check_number(name: str, value: Any, *, low: float = -math.inf, high: float = math.inf,
                 low_open: bool = False, high_open: bool = False) -> float:
  """A finite real number (not a bool) inside an interval, as a Python float.

  The interval is ``[low, high]``, with ``low_open``/``high_open`` excluding an end; an infinite
  end is always open (every accepted value is finite).

  Raises:
    ValueError: naming the option, the interval and the value.

  Examples:
    >>> check_number("beta", 0.9, low=0.0, high=1.0, low_open=True)
    0.9
    >>> check_number("eta", 0.5, low=1.0)
    Traceback (most recent call last):
    ...
    ValueError: eta must be a finite number >= 1, got 0.5.
  """
  ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
      and math.isfinite(value)
  if ok:
    ok = (value > low if low_open else value >= low) and (value < high if high_open else
                                                          value <= high)
  if not ok:
    interval = _interval_words(low, high, low_open, high_open) or "(not NaN or inf)"
    raise ValueError(f"{name} must be a finite number {interval}, got {value!r}.")
  return float(value)


def _interval_words(low: float, high: float, low_open: bool = False,
                    high_open: bool = False) -> str:
  """``">= 0"``, ``"< 1"``, ``"in (0, 1]"``: the interval as the messages say it (``""``: all)."""
  if low == -math.inf and high == math.inf:
    return ""
  if high == math.inf:
    return f"{'>' if low_open else '>='} {low:g}"
  if low == -math.inf:
    return f"{'<' if high_open else '<='} {high:g}"
  return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"


def check_bool(name: str, value: Any) -> bool:
  """A Python (or NumPy) bool; a truthy number or string is refused, not guessed at."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name} must be a bool, got {value!r}.")  # noqa: TRY004 (house style)
  return bool(value)


def _takes_arguments(fn: Callable[..., Any], count: int) -> bool:
  """Whether ``fn`` accepts ``count`` positional arguments (``True`` when it cannot be told)."""
  try:
    inspect.signature(fn).bind(*range(count))
  except TypeError:
    return False
  except ValueError:  # no signature (some builtins and C extensions)
    return True
  return True


def logits_shape(logits_fn: Callable[..., jax.Array], x: jax.Array,
                 samples: int = 0) -> tuple[int, ...]:
  """The shape of ``logits_fn(x)`` (``logits_fn(x, keys)`` if ``samples``), by tracing only."""
  return trace_logits(logits_fn, x, samples)[0]


BATCH_SIZE_FIX = ("logits_fn must accept x [B, ...] for any batch size B: the attacks also call "
                  "it on parts of a batch (early exit's chunks, a device's rows with a mesh). A "
                  "model written for one batch size (e.g. x.reshape(32, -1)) needs "
                  "x.reshape(x.shape[0], -1).")
"""The fix for a model that only works at one batch size, as every front door words it."""


def traces_at(logits_fn: Callable[..., jax.Array], example: jax.ShapeDtypeStruct, samples: int,
              sizes: Any) -> int | None:
  """The first batch size of ``sizes`` at which ``logits_fn`` traces on examples like
  ``example``'s (shape ``[B, ...]``, its ``B`` ignored), or ``None``: a probe, after a failure, of
  whether it depends on the batch size. Tracing only: nothing is compiled or run."""
  for size in sizes:
    try:
      logits_shape(logits_fn, jax.ShapeDtypeStruct((size,) + tuple(example.shape[1:]),
                                                   example.dtype), samples)
    except Exception:  # noqa: BLE001 (a probe: the caller reports the original error)
      continue
    return size
  return None


def refuse_fixed_batch(logits_fn: Callable[..., jax.Array], x: Any, samples: int,
                       error: Exception, where: str) -> None:
  """After ``error`` while running an attack on ``x`` (``[B, ...]``, at which ``logits_fn``
  traced): a ``ValueError`` (``error`` chained) when ``logits_fn`` fails on a batch of 1, i.e.
  only works at one batch size (the engine calls it on chunks of rows); otherwise nothing, and
  the caller re-raises ``error``. ``where`` names the batch for the message."""
  if x.shape[0] == 1 or traces_at(logits_fn, x, samples, [1]) is not None:
    return
  raise ValueError(f"logits_fn works on {where} but fails on a batch of 1: {BATCH_SIZE_FIX} "
                   f"The error: {error}") from error


def looks_channels_first(example_shape: tuple[int, ...]) -> bool:
  """Whether one example of shape ``example_shape`` looks like a channels-first image ``(C, H, W)``
  (PyTorch's NCHW): at most 4 entries before two axes of at least 8 each. jaxrobust reads 4-D
  inputs as channels-last ``[B, H, W, C]`` (NHWC, as Flax) where it looks at the layout.

  Examples:
    >>> looks_channels_first((3, 32, 32)), looks_channels_first((32, 32, 3))
    (True, False)
  """
  return len(example_shape) == 3 and example_shape[0] <= 4 and min(example_shape[1:]) >= 8


def channels_first_note(example_shape: tuple[int, ...]) -> str:
  """What to tell a user whose model failed on examples of ``example_shape``, when they look
  channels-first (:func:`looks_channels_first`); ``""`` otherwise."""
  if not looks_channels_first(example_shape):
    return ""
  return (f"x has shape [B, {', '.join(map(str, example_shape))}], which looks channels-first "
          "(NCHW), and the model failed on it. jaxrobust passes x to the model as given: a model "
          "built for channels-last images (NHWC, as Flax's convolutions) needs "
          "x.transpose(0, 2, 3, 1).")


def _traced(logits_fn: Callable[..., jax.Array], x: jax.ShapeDtypeStruct, *rest: Any):
  """:func:`jaxrobust.model.trace_model` with the shape; an error the model raises on a
  channels-first ``x`` gets a note that says so (a Flax convolution's shape error does not)."""
  try:
    return trace_model(logits_fn, x, *rest, return_shape=True)
  except Exception as error:
    note = channels_first_note(tuple(x.shape[1:]))
    if note:
      error.add_note(f"jaxrobust: {note}")
    raise


def trace_logits(logits_fn: Callable[..., jax.Array], x: jax.Array,
                 samples: int = 0) -> tuple[tuple[int, ...], list]:
  """The shape of ``logits_fn(x)`` (``logits_fn(x, keys)`` if ``samples``) and the arrays the
  model captured (:func:`jaxrobust.model.captured_constants`), from one trace."""
  spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
  if samples:
    keys = jax.ShapeDtypeStruct((x.shape[0],), jax.random.key(0).dtype)
    try:
      closed, out = _traced(logits_fn, spec, keys)
    except TypeError as error:
      if _takes_arguments(logits_fn, 2):
        raise
      raise ValueError(
          "This attack is for a randomized model logits_fn(x, keys) (one PRNG key per example), "
          "as built by jr.attacks.eot(...) or auto_attack(version='rand'), but logits_fn cannot "
          f"be called as logits_fn(x, keys): {error}. For a deterministic model logits_fn(x) use "
          "the attack without eot() (or auto_attack(version='standard')).") from error
  else:
    try:
      closed, out = _traced(logits_fn, spec)
    except TypeError as error:
      if _takes_arguments(logits_fn, 1) or not _takes_arguments(logits_fn, 2):
        raise
      raise ValueError(
          f"logits_fn must be called as logits_fn(x), but it needs more arguments: {error}. A "
          "randomized model logits_fn(x, keys) is attacked through jr.attacks.eot(attack, "
          "samples).") from error
  if not hasattr(out, "shape"):
    raise ValueError(f"logits_fn must return one array of logits [B, C], got {out!r}.")
  return tuple(out.shape), captured_constants(closed)


def check_batch(x: Any, y: Any, target: Any = None) -> None:
  """Static checks of ``x`` (float, non-empty batch) and of ``y`` / ``target`` (int ``[B]``)."""
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    raise TypeError(f"x must be an array, got {type(x).__name__}.")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(
        f"x must be a float array in the box [lower, upper], got dtype {x.dtype}. "
        "Convert images with x.astype(jnp.float32) / 255 and keep normalisation inside the model.")
  if x.ndim < 1 or x.shape[0] == 0:
    raise ValueError(f"x must be a non-empty batch [B, ...], got shape {x.shape}.")
  for name, labels in (("y", y), ("target", target)):
    if labels is not None:
      check_label_shape(name, labels, x.shape[0], f"x has {x.shape[0]} examples ({x.shape})")


def check_label_shape(name: str, labels: Any, batch: int, rows: str) -> None:
  """Static: ``labels`` is a 1-D int array ``[B]`` of class indices with ``B = batch``; ``rows``
  says where ``batch`` comes from, for the message (e.g. ``"tokens has 4 rows"``).

  Examples:
    >>> import jax.numpy as jnp
    >>> check_label_shape("y", jnp.array([0, 1]), 3, "tokens has 3 rows")
    Traceback (most recent call last):
    ...
    ValueError: Batch sizes differ: tokens has 3 rows, y has 2.
  """
  if not hasattr(labels, "shape") or labels.ndim != 1 or \
      not jnp.issubdtype(labels.dtype, jnp.integer):
    observed = f"{getattr(labels, 'dtype', type(labels).__name__)} {getattr(labels, 'shape', '')}"
    raise ValueError(f"{name} must be a 1-D int array [B] of class indices, got "
                     f"{observed.strip()}.")
  if labels.shape[0] != batch:
    raise ValueError(f"Batch sizes differ: {rows}, {name} has {labels.shape[0]}.")


def check_logits(shape: tuple[int, ...], batch: int) -> int:
  """Checks that logits are ``[B, C]`` with ``C >= 2``; returns ``C``."""
  if len(shape) != 2 or shape[0] != batch:
    raise ValueError(f"logits_fn must return logits of shape [B, C] = [{batch}, C], got {shape}.")
  if shape[1] < 2:
    raise ValueError(f"logits_fn returns {shape[1]} class(es); at least 2 are needed.")
  return shape[1]


def check_labels(name: str, labels: Any, num_classes: int) -> None:
  """Values of class indices (concrete arrays only; ``None`` or traced: nothing to check): every
  entry of ``labels`` lies in ``[0, num_classes)``. The one range check of labels, for images
  (:func:`check_inputs`, :func:`jaxrobust.evaluate`), certificates and text.

  Examples:
    >>> import jax.numpy as jnp
    >>> check_labels("y", jnp.array([0, 3]), 3)
    Traceback (most recent call last):
    ...
    ValueError: y must lie in [0, 3) for a model with 3 classes; got min 0, max 3.
  """
  if labels is None or not is_concrete(labels):
    return
  values = np.asarray(labels)
  if values.size == 0:
    return
  lo, hi = int(values.min()), int(values.max())
  if lo < 0 or hi >= num_classes:
    raise ValueError(f"{name} must lie in [0, {num_classes}) for a model with {num_classes} "
                     f"classes; got min {lo}, max {hi}.")


def check_bounds(lower: Any, upper: Any) -> None:
  for name, v in (("lower", lower), ("upper", upper)):
    if np.ndim(v) != 0:
      raise ValueError(f"{name} must be a scalar, got shape {np.shape(v)}.")
  if not is_concrete(lower, upper):
    return
  lo, hi = float(lower), float(upper)
  if not (np.isfinite(lo) and np.isfinite(hi)):
    raise ValueError(f"Box bounds must be finite, got lower={lo}, upper={hi}.")
  if lo >= hi:
    raise ValueError(f"lower must be < upper, got lower={lo}, upper={hi}.")


def check_finite(x: Any) -> None:
  """A concrete ``x`` holds no NaN/Inf (traced: nothing to check)."""
  if is_concrete(x) and not np.all(np.isfinite(np.asarray(x))):
    raise ValueError(f"x contains {int(np.sum(~np.isfinite(np.asarray(x))))} NaN/Inf value(s).")


def check_values(name: str, values: Any, *, low: float = -math.inf, high: float = math.inf,
                 where: Any = None, hint: str = "") -> None:
  """Concrete ``values`` only (traced: nothing to check): no entry is NaN or outside
  ``[low, high]`` (``inf`` passes where the interval reaches it). Entries where ``where`` (an
  array of ``values``' shape, e.g. a row mask) is ``False`` are not read: padding may hold
  anything. The message gives the rule, how many entries break it, the first few with their
  index, then ``hint`` (how to fix it).

  Raises:
    ValueError: for a NaN entry or one outside the interval.

  Examples:
    >>> import jax.numpy as jnp
    >>> check_values("q", jnp.array([0.5, 1.5, jnp.nan]), low=0.0, high=1.0)
    Traceback (most recent call last):
    ...
    ValueError: q must lie in [0, 1], got 2 of 3 entries that do not: q[1] = 1.5, q[2] = nan.
    >>> check_values("q", jnp.array([0.5, 1.5, jnp.nan]), low=0.0, high=1.0,
    ...              where=jnp.array([True, False, False]))  # only q[0] is read: passes
  """
  if not is_concrete(values, where):
    return
  array = np.asarray(values, np.float64)
  bad = np.isnan(array) | (array < low) | (array > high)
  if where is not None:
    bad &= np.asarray(where, bool)
  if not bad.any():
    return
  interval = _interval_words(low, high)
  if not interval:
    rule = "must not be NaN"
  elif interval.startswith("in "):
    rule = f"must lie {interval}"
  else:
    rule = f"must be {interval} ({'-' if low == -math.inf else ''}inf allowed) and not NaN"
  raise ValueError(f"{name} {rule}, {bad_entries(name, array, bad, 'do')}."
                   + (f" {hint}" if hint else ""))


def bad_entries(name: str, array: np.ndarray, bad: np.ndarray, verb: str = "do",
                beside: tuple[str, np.ndarray] | None = None) -> str:
  """``"got 2 of 3 entries that do not: q[1] = 1.5, q[2] = nan"``: how many entries of ``array``
  break a rule (``bad``) and the first three, for messages (a 0-d ``array``: ``"got 1.5"``).
  ``beside = (other_name, other)`` shows the entry of ``other`` (``array``'s shape) that the rule
  compares with each one.

  Examples:
    >>> import numpy as np
    >>> bad_entries("counts", np.array([2.0, -1.0]), np.array([False, True]), "are")
    'got 1 of 2 entries that are not: counts[1] = -1'
    >>> bad_entries("lower", np.array([0.1, 0.5]), np.array([False, True]), "are",
    ...             beside=("upper", np.array([0.2, 0.3])))
    'got 1 of 2 entries that are not: lower[1] = 0.5 with upper[1] = 0.3'
  """
  if array.ndim == 0:
    return f"got {float(array):g}"

  def entry(i: tuple) -> str:
    index = ", ".join(map(str, i))
    text = f"{name}[{index}] = {array[i]:g}"
    return text if beside is None else f"{text} with {beside[0]}[{index}] = {beside[1][i]:g}"

  first = [np.unravel_index(i, array.shape) for i in np.flatnonzero(bad)[:3]]
  more = ", ..." if int(bad.sum()) > len(first) else ""
  return (f"got {int(bad.sum())} of {array.size} entries that {verb} not: "
          f"{', '.join(map(entry, first))}{more}")


def check_min_norms(norms: Any, where: Any = None, *, name: str = "norms") -> None:
  """Concrete minimal adversarial norms (``AttackResult.norm``; traced: nothing to check): each
  ``>= 0`` or ``inf``, none NaN (:func:`check_values`, with the fix in the message). ``where`` is
  the row mask of a function that takes ``mask=`` (padded rows are not read, and the message
  points to ``mask=``); ``None`` reads every row."""
  hint = ("A minimal adversarial norm is 0 for a point misclassified on the clean input and inf "
          "where no adversarial point was found, as jr.run reports"
          + ("; padded rows belong under mask=False." if where is not None else "."))
  check_values(name, norms, low=0.0, where=where, hint=hint)


def check_x_in_box(x: Any, lower: Any, upper: Any) -> None:
  if not is_concrete(x, lower, upper):
    return
  check_finite(x)
  values = np.asarray(x)
  lo, hi = float(values.min()), float(values.max())
  if lo < float(lower) or hi > float(upper):
    raise ValueError(
        f"x must lie in the box [{float(lower)}, {float(upper)}], observed min {lo:.4g}, max "
        f"{hi:.4g}. For 0-255 images divide by 255; for mean/std-normalised data put the "
        "normalisation inside the model (logits_fn) and pass raw [0, 1] inputs.")


LARGE_EPS_HINT = "Pass allow_large_eps=True if this is intended."
"""How a front door that takes ``allow_large_eps`` says a budget covering the box is allowed."""


def check_eps(eps: Any, batch: int, norm: str, *, lower: Any, upper: Any, input_size: int,
              minimum_norm: bool, allow_large_eps: bool, name: str = "eps",
              large_eps_hint: str = LARGE_EPS_HINT) -> None:
  """Checks the budget: shape ``[]`` / ``[B]`` (or ``[K]`` for a curve), sign, finiteness, units.

  Args:
    eps: the budget(s).
    batch: the allowed length of a 1-D ``eps``, or ``None`` for any length (curves).
    norm: the attack's norm.
    lower, upper: the box.
    input_size: number of elements of one example, to judge L2/L1 budgets.
    minimum_norm: minimum-norm attacks accept ``inf`` ("no bound").
    allow_large_eps: skip the check that flags budgets covering the whole box.
    name: how to call the value in messages.
    large_eps_hint: the message's last sentence for such a budget (how to allow it, where the
      caller can).
  """
  check_bool("allow_large_eps", allow_large_eps)
  shape = np.shape(eps)
  if len(shape) > 1 or (len(shape) == 1 and batch is not None and shape[0] != batch):
    expected = "a scalar or a per-example [B] array" if batch is not None else "[K]"
    raise ValueError(f"{name} must be {expected}, got shape {shape}"
                     + (f" for a batch of {batch}." if batch is not None else "."))
  if not is_concrete(eps, lower, upper):
    return
  values = np.asarray(eps, dtype=np.float64)
  if np.any(np.isnan(values)):
    raise ValueError(f"{name} contains NaN.")
  if np.any(values < 0):
    raise ValueError(f"{name} must be >= 0, got min {values.min()}.")
  if np.any(np.isinf(values)):
    if not minimum_norm:
      raise ValueError(f"{name} = inf is only meaningful for minimum-norm attacks; a "
                       "fixed-budget attack needs a finite budget.")
    values = values[np.isfinite(values)]
  if allow_large_eps or values.size == 0:
    return
  width = float(upper) - float(lower)
  largest = {"linf": width, "l2": width * np.sqrt(input_size), "l1": width * input_size}[norm]
  biggest = float(values.max())
  if biggest >= largest:
    hint = (f" It looks like 0-255 units: use e.g. {biggest:g}/255, not {biggest:g}."
            if norm == "linf" and biggest >= 2 and width <= 1 else "")
    raise ValueError(
        f"{name} = {biggest:g} covers the whole box [{float(lower)}, {float(upper)}] in {norm} "
        f"(the largest meaningful budget is < {largest:g}).{hint} {large_eps_hint}")


def check_inputs(logits_fn: Callable[[jax.Array], jax.Array], x: Any, y: Any, budget: Budget,
                 *, norm: str, target: Any = None, targeted: bool = False,
                 minimum_norm: bool = False, allow_large_eps: bool = False,
                 samples: int = 0, name: str = "this attack",
                 front_door: str = "jr.run", large_eps_hint: str = LARGE_EPS_HINT) -> int:
  """Validates one attack call; returns the number of classes.

  Shape checks always run; value checks run on concrete inputs only (see the module docstring).
  Inside a trace (the caller's ``jax.jit``), a model that captures large arrays, or inputs that
  are concrete arrays, get a :class:`jaxrobust.model.CapturedConstantsWarning` (they would be
  compiled in as constants; :func:`jaxrobust.model.warn_if_captured`).

  Raises:
    TypeError: integer-dtype ``x``.
    ValueError: anything else that is wrong, with the observed values and a fix.

  Examples:
    >>> import jax.numpy as jnp
    >>> import jaxrobust as jr
    >>> logits_fn = lambda x: jnp.stack([x.sum((1, 2)), -x.sum((1, 2))], axis=-1)
    >>> x, y = jnp.zeros((2, 3, 3)), jnp.array([0, 1])
    >>> jr.check_inputs(logits_fn, x, y, jr.Budget(8.0), norm="linf")
    Traceback (most recent call last):
    ...
    ValueError: eps = 8 covers the whole box [0.0, 1.0] in linf (the largest meaningful budget is < 1). It looks like 0-255 units: use e.g. 8/255, not 8. Pass allow_large_eps=True if this is intended.
  """
  check_norm(norm)
  if targeted and target is None:
    raise ValueError("This attack is targeted: pass target= (int [B] of target classes).")
  if not targeted and target is not None:
    raise ValueError(
        f"target= was given to {name}, which takes no targets: it is untargeted, or it chooses its "
        "own targets (APGD-T / FAB-T with n_target_classes set, which succeed when the prediction "
        "leaves y). For an attack towards given targets build it with targeted=True (and "
        "n_target_classes=None for apgd/fab).")
  check_batch(x, y, target)
  batch = x.shape[0]
  shape, constants = trace_logits(logits_fn, x, samples)
  num_classes = check_logits(shape, batch)
  if tracing():  # what is concrete here is a constant of the program being traced
    warn_if_captured(constants, x, where=front_door, stacklevel=4)
  check_labels("y", y, num_classes)
  check_labels("target", target, num_classes)
  if target is not None and is_concrete(y, target):
    same = int(np.sum(np.asarray(y) == np.asarray(target)))
    if same:
      raise ValueError(f"target equals the true label y for {same} example(s); a targeted attack "
                       "needs target != y.")
  eps, lower, upper = as_budget(budget)
  check_bounds(lower, upper)
  check_x_in_box(x, lower, upper)
  check_eps(eps, batch, norm, lower=lower, upper=upper, input_size=int(np.prod(x.shape[1:])),
            minimum_norm=minimum_norm, allow_large_eps=allow_large_eps,
            large_eps_hint=large_eps_hint)
  return num_classes
