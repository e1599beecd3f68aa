"""Validation of token inputs at the Python boundary, shared by the text attacks.

Shape and dtype checks are static and also run while ``jit`` traces; checks that read values
(token ids in range, budgets, an empty editable mask) run on concrete arrays only, like
:func:`jaxrobust.check_inputs`. Every message names the argument, what was observed and what is
expected. Labels are class indices as for images: :mod:`jaxrobust._validation` checks them
(``check_label_shape``, ``check_labels``), for every front door alike.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._validation import is_concrete, logits_shape


def _describe(value: Any) -> str:
  return f"{getattr(value, 'dtype', type(value).__name__)} {getattr(value, 'shape', '')}".strip()


def check_embedding(embedding: Any) -> tuple[int, int]:
  """A float ``[V, D]`` embedding table; returns ``(V, D)``."""
  if not hasattr(embedding, "shape") or not hasattr(embedding, "dtype"):
    raise TypeError(f"embedding must be an array [V, D], got {type(embedding).__name__}.")
  if not jnp.issubdtype(embedding.dtype, jnp.floating):
    raise TypeError(f"embedding must be a float array [V, D], got {_describe(embedding)}.")
  if embedding.ndim != 2 or embedding.shape[0] < 1 or embedding.shape[1] < 1:
    raise ValueError(f"embedding must be a 2-D table [V, D] (one row per token id), got shape "
                     f"{embedding.shape}.")
  return int(embedding.shape[0]), int(embedding.shape[1])


def check_token_ids(name: str, ids: Any, vocab_size: int, *, ndim: int = 2,
                    allow_padding: bool = False, vocabulary: str = "rows of the embedding") -> None:
  """``ids``: an int array with ``ndim`` axes (none empty) whose values lie in ``[0, V)``, or in
  ``[-1, V)`` with ``allow_padding`` (``-1`` marks an unused slot); ``vocabulary`` says in the
  message where ``V`` comes from.

  Raises:
    TypeError: a float or non-array ``ids``.
    ValueError: the wrong rank, an empty axis, or ids out of range (with the observed min, max).

  Examples:
    >>> import jax.numpy as jnp
    >>> check_token_ids("tokens", jnp.array([[0, 5]]), 5)
    Traceback (most recent call last):
    ...
    ValueError: tokens must hold token ids in [0, 5) (rows of the embedding); got min 0, max 5.
  """
  if not hasattr(ids, "shape") or not hasattr(ids, "dtype"):
    raise TypeError(f"{name} must be an int array, got {type(ids).__name__}.")
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise TypeError(f"{name} must be an int array of token ids, got {_describe(ids)}; token ids "
                    "are indices into the embedding table, not embeddings or scores.")
  if ids.ndim != ndim or 0 in ids.shape:
    raise ValueError(f"{name} must be a non-empty {ndim}-D int array, got shape {ids.shape}.")
  if not is_concrete(ids):
    return
  values = np.asarray(ids)
  lowest = -1 if allow_padding else 0
  lo, hi = int(values.min()), int(values.max())
  if lo < lowest or hi >= vocab_size:
    raise ValueError(
        f"{name} must hold token ids in [{lowest}, {vocab_size}) ({vocabulary}"
        f"{'; -1 pads unused slots' if allow_padding else ''}); got min {lo}, max {hi}.")


def check_any_row_count(logits_fn: Callable[[Any], Any], spec: jax.ShapeDtypeStruct, rows: int,
                        attack: str) -> None:
  """``logits_fn`` also runs on ``rows`` rows shaped as ``spec``'s (by tracing only): the attacks
  score every example's candidate texts in one batch, so a model must take any number of
  independent rows. A model that closes over a per-example input (a ``[B, L]`` padding mask)
  works on the ``B`` rows of ``tokens`` and fails here, with this message instead of a shape
  error from inside the model."""
  if rows == spec.shape[0]:
    return
  other = jax.ShapeDtypeStruct((rows,) + tuple(spec.shape[1:]), spec.dtype)
  try:
    shape = logits_shape(logits_fn, other)
  except Exception as error:  # noqa: BLE001 - the user's model, re-raised with its cause
    raise ValueError(
        f"logits_fn runs on the {spec.shape[0]} rows of tokens but fails on {rows} rows: {attack} "
        "scores the candidate texts of every example in one batch, so the model must treat its "
        "rows independently and take any number of them. A per-example input the model closes "
        "over (e.g. a [B, L] padding mask) cannot follow the rows: derive it from the inputs "
        "instead (e.g. an extra embedding channel that is 1 for real tokens and 0 for the pad "
        f"id). The model's error: {type(error).__name__}: {error}") from error
  if tuple(shape[:1]) != (rows,):
    raise ValueError(f"logits_fn must return [N, C] logits for N rows; on {rows} rows it returned "
                     f"shape {tuple(shape)}.")


def check_editable(editable: Any, shape: tuple[int, ...]) -> None:
  """``editable``: a bool ``[B, L]`` mask with at least one ``True`` (when concrete).

  A row without editable positions is allowed (that text cannot be attacked: it is robust at
  every budget); a mask without any ``True`` is refused, since it makes the whole attack vacuous
  (usually an inverted mask).
  """
  if not hasattr(editable, "shape") or editable.dtype != jnp.bool_:
    raise TypeError(f"editable must be a bool array [B, L] like tokens {shape}, got "
                    f"{_describe(editable)}.")
  if tuple(editable.shape) != tuple(shape):
    raise ValueError(f"editable must have the shape of tokens, {tuple(shape)}, got "
                     f"{tuple(editable.shape)}.")
  if is_concrete(editable) and not np.any(np.asarray(editable)):
    raise ValueError("editable has no True entry: no position of any row may change, so the "
                     "attack could not do anything. Mark the positions that may be swapped "
                     "(e.g. tokens != pad_id).")


def check_max_swaps(max_swaps: Any, batch: int, steps: int) -> None:
  """``max_swaps``: an int scalar or ``[B]`` array in ``[0, steps]`` (values when concrete)."""
  if isinstance(max_swaps, bool) or not (
      isinstance(max_swaps, (int, np.integer))
      or (hasattr(max_swaps, "dtype") and jnp.issubdtype(max_swaps.dtype, jnp.integer))):
    raise TypeError(f"max_swaps must be an int (scalar or per-example [B] array), got "
                    f"{_describe(max_swaps)}.")
  shape = np.shape(max_swaps)
  if shape not in ((), (batch,)):
    raise ValueError(f"max_swaps must be a scalar or a per-example [B] = [{batch}] array, got "
                     f"shape {shape}.")
  if is_concrete(max_swaps):
    lo, hi = int(np.min(np.asarray(max_swaps))), int(np.max(np.asarray(max_swaps)))
    if lo < 0 or hi > steps:
      raise ValueError(
          f"max_swaps must lie in [0, steps] = [0, {steps}] (each greedy step changes at most one "
          f"position); got min {lo}, max {hi}. Build the attack with word_swap(steps={max(hi, 1)})"
          " or more for a larger budget.")


def check_count(name: str, value: Any, batch: int, minimum: int) -> None:
  """``value``: an int scalar or ``[B]`` array of counts ``>= minimum`` (values when concrete),
  e.g. a swap or query budget.

  Examples:
    >>> check_count("max_queries", 0, 2, 1)
    Traceback (most recent call last):
    ...
    ValueError: max_queries must be >= 1; got min 0.
  """
  if isinstance(value, bool) or not (
      isinstance(value, (int, np.integer))
      or (hasattr(value, "dtype") and jnp.issubdtype(value.dtype, jnp.integer))):
    raise TypeError(f"{name} must be an int (scalar or per-example [B] array), got "
                    f"{_describe(value)}.")
  shape = np.shape(value)
  if shape not in ((), (batch,)):
    raise ValueError(f"{name} must be a scalar or a per-example [B] = [{batch}] array, got "
                     f"shape {shape}.")
  if is_concrete(value):
    lo = int(np.min(np.asarray(value)))
    if lo < minimum:
      raise ValueError(f"{name} must be >= {minimum}; got min {lo}.")


def check_vocab_table(name: str, table: Any, vocab_size: int, *, kind: str, ndim: int) -> None:
  """``table``: one entry (``ndim=1``) or row (``ndim=2``) per token id, ``[V]`` or ``[V, E]``,
  of ``kind`` ``"bool"``, ``"int"`` or ``"float"``.

  Examples:
    >>> import jax.numpy as jnp
    >>> check_vocab_table("stop_words", jnp.zeros(4, bool), 5, kind="bool", ndim=1)
    Traceback (most recent call last):
    ...
    ValueError: stop_words must have one entry per token id, shape [V] = [5], got (4,).
  """
  dtypes = {"bool": jnp.bool_, "int": jnp.integer, "float": jnp.floating}
  if not hasattr(table, "shape") or not jnp.issubdtype(table.dtype, dtypes[kind]):
    article = "an" if kind == "int" else "a"
    raise TypeError(f"{name} must be {article} {kind} array indexed by token id, got "
                    f"{_describe(table)}.")
  if table.ndim != ndim or table.shape[0] != vocab_size or 0 in table.shape:
    expected = "[V]" if ndim == 1 else "[V, E]"
    raise ValueError(f"{name} must have one {'entry' if ndim == 1 else 'row'} per token id, "
                     f"shape {expected} = [{vocab_size}{'' if ndim == 1 else ', E'}], got "
                     f"{tuple(table.shape)}.")
