r"""Attack summaries under TextAttack's conventions, from a :class:`jaxrobust.text.Result` or a
:class:`jaxrobust.text.TextFoolerResult`."""

from __future__ import annotations

from typing import Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._validation import bad_entries, is_concrete
from jaxrobust.text._types import Result, TextAttackSummary, TextFoolerResult

Array = jax.Array


def textattack_summary(result: Union[Result, TextFoolerResult], *,
                       words: Optional[Array] = None) -> TextAttackSummary:
  r"""The numbers TextAttack's ``AttackSummary`` prints, as float32 / int32 scalars (jit-able).

  An example is *skipped* when it was misclassified before the attack (a
  :class:`~jaxrobust.text.TextFoolerResult`'s ``skipped``; for a word-swap
  :class:`~jaxrobust.text.Result`, ``success & (swaps == 0)``: ``run`` returns those unchanged),
  *successful* when attacked and broken, *failed* otherwise. Then, with :math:`N` examples:
  original accuracy :math:`(s + f) / N`, accuracy under attack :math:`f / N`, attack success rate
  :math:`s / (s + f)` (skipped excluded; for its exact interval use
  ``jr.metrics.Rate.from_flags(success, mask=~skipped)``), average perturbed word percentage over
  the successful examples (:math:`100\,\mathrm{swaps} / \mathrm{words}`), average words per text
  over all, average queries over the attacked (successful and failed) examples. A mean over no
  example is NaN (TextAttack prints 0 or fails there).

  Args:
    result: from :func:`jaxrobust.text.run_textfooler` or :func:`jaxrobust.text.run`.
    words: ``[B]`` int words per text (e.g. ``jnp.sum(tokens != pad_id, axis=1)``), each at
      least the example's ``swaps`` (and ``>= 0``); required for a word-swap ``Result``, which
      does not know its padding; a ``TextFoolerResult`` has them.

  Returns:
    A :class:`jaxrobust.text.TextAttackSummary`.

  Raises:
    TypeError: ``result`` is neither result type, or ``words`` is not an int array.
    ValueError: a ``Result`` without ``words``, ``words`` not ``[B]``, or concrete ``words``
      below the example's ``swaps`` or below 0 (inside ``jax.jit`` the values are not read).

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import text
    >>> result = text.Result(tokens_adv=None, success=jnp.array([True, True, False]),
    ...                      swaps=jnp.array([0, 2, 4]), logits=None,
    ...                      queries=jnp.array([1, 30, 50]))
    >>> summary = text.textattack_summary(result, words=jnp.array([2, 4, 4]))
    >>> int(summary.successful), int(summary.failed), int(summary.skipped)
    (1, 1, 1)
    >>> float(summary.attack_success_rate), float(summary.average_perturbed_word_percent)
    (0.5, 50.0)
    >>> float(summary.average_queries)
    40.0
  """
  if isinstance(result, TextFoolerResult):
    skipped = jnp.asarray(result.skipped)
    words = result.words if words is None else words
  elif isinstance(result, Result):
    skipped = jnp.asarray(result.success) & (jnp.asarray(result.swaps) == 0)
    if words is None:
      raise ValueError("a word-swap Result does not know its padding: give words=[B], e.g. "
                       "jnp.sum(tokens != pad_id, axis=1).")
  else:
    raise TypeError(f"result must be a jr.text.Result or TextFoolerResult, got "
                    f"{type(result).__name__}.")
  words = jnp.asarray(words)
  batch = skipped.shape[0]
  if words.shape != (batch,):
    raise ValueError(f"words must be [B] = [{batch}], got shape {words.shape}.")
  _check_words(words, result.swaps)
  success = jnp.asarray(result.success)
  successful, failed = success & ~skipped, ~success & ~skipped
  percent = 100.0 * jnp.asarray(result.swaps).astype(jnp.float32) / jnp.maximum(
      words, 1).astype(jnp.float32)
  queries = jnp.asarray(result.queries).astype(jnp.float32)
  # Every total in one reduction over the batch (counts as float32: exact below 2**24 examples).
  columns = [successful, failed, skipped, jnp.where(successful, percent, 0.0),
             jnp.where(~skipped, queries, 0.0), words]
  totals = jnp.sum(jnp.stack([c.astype(jnp.float32) for c in columns], axis=-1), axis=0)
  s, f, k, percent_sum, queries_sum, words_sum = (totals[i] for i in range(len(columns)))
  return TextAttackSummary(
      successful=s.astype(jnp.int32), failed=f.astype(jnp.int32), skipped=k.astype(jnp.int32),
      original_accuracy=(s + f) / batch, accuracy_under_attack=f / batch,
      attack_success_rate=s / (s + f), average_perturbed_word_percent=percent_sum / s,
      average_words=words_sum / batch, average_queries=queries_sum / (s + f))


def _check_words(words: Array, swaps: Array) -> None:
  """``words``: an int ``[B]`` array (static) with ``swaps <= words`` and ``words >= 0`` on every
  example (concrete arrays only): a text has at least as many words as were swapped in it.

  Examples:
    >>> import jax.numpy as jnp
    >>> _check_words(jnp.array([4, 1, 5]), jnp.array([1, 3, 0]))
    Traceback (most recent call last):
    ...
    ValueError: words must be >= swaps and >= 0 on every example (a text has at least as many words as were swapped in it), got 1 of 3 entries that are not: words[1] = 1 with swaps[1] = 3. words counts the non-padding tokens of each text, e.g. jnp.sum(tokens != pad_id, axis=1).
  """
  fix = "words counts the non-padding tokens of each text, e.g. jnp.sum(tokens != pad_id, axis=1)."
  if not jnp.issubdtype(words.dtype, jnp.integer):
    raise TypeError(f"words must be an int array [B] (words per text), got dtype {words.dtype}. "
                    f"{fix}")
  if not is_concrete(words, swaps):
    return
  counts, swapped = np.asarray(words, np.int64), np.asarray(swaps, np.int64)
  bad = (counts < swapped) | (counts < 0)
  if bad.any():
    shown = bad_entries("words", counts, bad, "are", beside=("swaps", swapped))
    raise ValueError(f"words must be >= swaps and >= 0 on every example (a text has at least as "
                     f"many words as were swapped in it), {shown}. {fix}")
