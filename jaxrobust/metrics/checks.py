r"""Reliability checks: a flag per batch, the count behind it, and the rule over a data set.

A check says that an evaluation may overestimate robustness (zero gradients, outputs that look
like probabilities, a black-box attack breaking points every gradient attack missed). Each is a
:class:`Check`: a ``[]`` bool flag on the batch and, when the flag is decided from a count, the
count (``[]`` int32) under its name. Runs report them as ``info["flags"]`` and ``info["counts"]``
(:func:`as_info`); a data-set report sums the counts over batches and ORs the flags.

Most flags mean "the count is positive" and OR over batches exactly. A flag that compares its
count with a fraction of the examples (:data:`FRACTION_FLAGS`) does not: a batch compares with
its own size, so :func:`decide_flags` decides it again from the global count,

.. math::
   \text{flag} = \max_k \text{count}_k > f \cdot N,

over the :math:`N` examples of the data set (:math:`k` the eps of a curve), for any batch size.

Examples:
  >>> import jax.numpy as jnp
  >>> check = fraction_check(jnp.int32(3), "square_only_points", SQUARE_ONLY_FRACTION, 1000)
  >>> bool(check.flag), as_info({"square_beats_white_box": check})["counts"]
  (True, {'square_only_points': Array(3, dtype=int32)})

References:
  Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse
  parameter-free attacks", ICML 2020 (AutoAttack's checks and its 0.2% Square rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

SQUARE_ONLY_FRACTION = 0.002
"""AutoAttack's rule: Square breaking more than 0.2% of the examples that every gradient attack
before it missed signals gradient masking."""

FRACTION_FLAGS: Mapping[str, tuple[str, float]] = {
    "square_beats_white_box": ("square_only_points", SQUARE_ONLY_FRACTION)}
"""Flags decided from a count and the number of examples: ``flag -> (count name, fraction)``,
raised when the count (summed over the data set) exceeds ``fraction * N`` at some eps."""


class Check(NamedTuple):
  """One reliability check on a batch.

  Attributes:
    flag: ``[]`` bool, raised on this batch.
    count: ``[]`` int32, the count the flag is decided from, or ``None`` (a flag of the whole
      batch, e.g. "the outputs are probabilities").
    count_name: the count's name in ``info["counts"]`` (with ``count``).
  """

  flag: Array
  count: Optional[Array] = None
  count_name: Optional[str] = None


def count_check(count: Array, count_name: str) -> Check:
  """A flag raised when ``count`` is positive (e.g. points with zero gradients)."""
  return Check(count > 0, count, count_name)


def fraction_check(count: Array, count_name: str, fraction: float, rows: Any) -> Check:
  """A flag raised when ``count > fraction * rows`` (``rows``: the batch's real rows); over a data
  set :func:`decide_flags` decides it again with the data set's size."""
  exceeds = count.astype(jnp.float32) > fraction * jnp.asarray(rows).astype(jnp.float32)
  return Check(exceeds, count, count_name)


def probability_tolerances(dtype, num_classes: int) -> tuple[float, float]:
  r"""How far outputs of ``dtype`` may stray from a probability vector and still count as one.

  A probability rounded to ``dtype`` errs by half its machine epsilon :math:`\varepsilon`
  relative, so each entry stays within :math:`[-\varepsilon, 1 + \varepsilon]` and a row of
  :math:`C` rounded probabilities sums to 1 within :math:`\varepsilon / 2`; a softmax computed in
  ``dtype`` adds the rounding of its normaliser, at worst :math:`C \varepsilon / 2` when it is
  accumulated in ``dtype``. So the row-sum tolerance is :math:`C \varepsilon` (at least
  :math:`10^{-5}`, the reference's float32 tolerance), capped at 0.1 so that the small logits of
  a model with many classes are not mistaken for probabilities. (Measured: ``jax.nn.softmax``
  rows err by at most :math:`0.75\,\varepsilon` in bfloat16 and float16, for 2 to 10000
  classes; a fixed :math:`10^{-5}` misses every one of them.)

  Returns:
    ``(entry_tolerance, sum_tolerance)`` as Python floats.

  Examples:
    >>> import jax.numpy as jnp
    >>> probability_tolerances(jnp.float32, 10)
    (1e-05, 1e-05)
    >>> probability_tolerances(jnp.bfloat16, 10)
    (0.0078125, 0.078125)
  """
  eps = float(jnp.finfo(dtype).eps)
  return max(1e-5, eps), max(1e-5, min(num_classes * eps, 0.1))


def probability_rows(logits: Array) -> Array:
  """``[B]`` bool: the row of outputs lies in ``[0, 1]`` and sums to 1, within the rounding of
  its dtype (:func:`probability_tolerances`): what a softmax (or sigmoid pair) returns, whose
  flat gradients make gradient attacks fail. The ``probability_outputs`` flag is raised when
  every real row of a batch is one.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> z = jnp.array([[2.0, -1.0], [0.3, 0.7]])
    >>> probability_rows(z).tolist(), probability_rows(jax.nn.softmax(z)).tolist()
    ([False, True], [True, True])
  """
  entry_tolerance, sum_tolerance = probability_tolerances(logits.dtype, logits.shape[-1])
  z = logits.astype(jnp.float32)
  return (jnp.all(z <= 1.0 + entry_tolerance, axis=-1) & jnp.all(z >= -entry_tolerance, axis=-1)
          & (jnp.abs(jnp.sum(z, axis=-1) - 1.0) <= sum_tolerance))


def as_info(checks: Mapping[str, Check]) -> dict:
  """``{"flags": name -> flag, "counts": count name -> count}``, in the checks' order."""
  return {"flags": {name: c.flag for name, c in checks.items()},
          "counts": {c.count_name: c.count for c in checks.values() if c.count is not None}}


def decide_flags(flags: Mapping[str, bool], counts: Mapping[str, Any],
                 n: int) -> dict[str, bool]:
  r"""An attack's flags over the whole data set, from its OR-ed flags and global counts.

  A flag of :data:`FRACTION_FLAGS` whose count is present is decided again from the count:
  :math:`\max_k \mathrm{count}_k > \mathrm{fraction} \cdot N` (each batch judged alone would use
  its own size instead of :math:`N`); every other flag is kept as given.

  Args:
    flags: flag name -> bool (OR over batches).
    counts: count name -> int array (``[K]`` per eps, or a scalar), summed over the data set.
    n: the number of examples.

  Returns:
    flag name -> bool.

  Examples:
    >>> import numpy as np
    >>> flags = {"square_beats_white_box": True, "zero_gradients": False}
    >>> decide_flags(flags, {"square_only_points": np.array([1, 1])}, n=600)  # 1 > 1.2: no
    {'square_beats_white_box': False, 'zero_gradients': False}
    >>> decide_flags(flags, {"square_only_points": np.array([0, 2])}, n=600)  # 2 > 1.2 at eps 2
    {'square_beats_white_box': True, 'zero_gradients': False}
  """
  out = {str(k): bool(v) for k, v in flags.items()}
  for flag, (count, fraction) in FRACTION_FLAGS.items():
    if count in counts:
      out[flag] = bool(np.any(np.asarray(counts[count], np.float64) > fraction * n))
  return out
