"""Checks of the losses' hyperparameters, at call time, on the values that can be read.

Python numbers and concrete arrays are checked when the loss is called (under ``jit`` that is
while tracing, once per compilation). A traced hyperparameter (a ``beta`` or ``kappa`` schedule
passed as data) cannot be read while tracing and is used as given: keep it in range yourself.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from jaxrobust._validation import check_number, check_positive_int, is_concrete


LARGE_EPS_HINT = ("The training losses take no allow_large_eps: give eps in the units of x "
                  "(e.g. 8/255 for pixels in [0, 1]).")
"""The end of :func:`jaxrobust.check_inputs`' message for a budget that covers the whole box."""


def check_weight(name: str, value: Any, *, high: float = math.inf) -> Any:
  """A loss weight in ``[0, high]``: returned as a Python float when it can be read, else as the
  traced array it is (unchecked).

  Raises:
    ValueError: a readable value outside ``[0, high]``, NaN, inf, or not a real scalar.

  Examples:
    >>> check_weight("beta", 6)
    6.0
    >>> check_weight("kappa", 1.5, high=1.0)
    Traceback (most recent call last):
    ...
    ValueError: kappa must be a finite number in [0, 1], got 1.5.
  """
  if isinstance(value, (jax.Array, np.ndarray)):
    if np.ndim(value) != 0:
      raise ValueError(f"{name} must be a scalar, got shape {np.shape(value)}.")
    if not is_concrete(value):
      return value
    value = np.asarray(value).item()
  return check_number(name, value, low=0.0, high=high)


def check_steps(steps: Any) -> int:
  """The number of inner steps, a Python int ``>= 1`` (static: it sets the loop length)."""
  return check_positive_int("steps", steps)


def check_step_size(step_size: Any, default: float) -> Any:
  """The inner step as a fraction of eps: ``default`` for ``None``, a readable value ``> 0``, or
  a traced scalar (unchecked)."""
  if step_size is None:
    return default
  if isinstance(step_size, (jax.Array, np.ndarray)) and np.ndim(step_size) == 0 and \
      not is_concrete(step_size):
    return step_size
  value = step_size.item() if isinstance(step_size, (jax.Array, np.ndarray)) and \
      np.ndim(step_size) == 0 else step_size
  return check_number("step_size", value, low=0.0, low_open=True)


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
  """One of ``choices`` (static strings).

  Examples:
    >>> check_choice("norm", "l1", ("linf",))
    Traceback (most recent call last):
    ...
    ValueError: norm must be one of ('linf',), got 'l1'.
  """
  if not isinstance(value, str) or value not in choices:
    raise ValueError(f"{name} must be one of {choices}, got {value!r}.")
  return value
