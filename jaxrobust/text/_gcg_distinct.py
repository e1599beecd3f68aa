r"""Distinct candidate suffixes of a GCG step, found inside ``jit`` with static shapes.

A GCG step draws ``W = search_width`` candidates, each the current suffix of ``S`` tokens with
``R = n_replace`` distinct positions set to one of the ``K = topk`` best tokens of that position.
At most

.. math:: D = \min\bigl(W, \tbinom{S}{R} K^R\bigr)

of them are distinct (a position set and a token per position; fewer when a drawn token equals
the current one, since all such draws are the current suffix itself, or when fewer than ``K``
tokens are allowed). With nanoGCG's ``n_replace=1``, ``S = 6`` and ``K = 32`` that is 192 for 512
draws, which are uniform over the 192 (position, rank) pairs: about
:math:`192\,(1 - (191/192)^{512}) \approx 179` distinct ones are drawn, and 65% of the draws
repeat an earlier one.
Scoring the ``D`` distinct rows once and giving each draw its row's loss does the same
arithmetic on each row, so the step's losses, its argmin (the first draw of the lowest loss, as
before) and its move are unchanged, up to float rounding: XLA may round a pass of ``D`` rows
differently from one of ``W`` rows in the last bit (1 ulp seen on CPU for 16 rows against 6);
passes of one shape give bitwise equal losses. All draws of one candidate share one loss, so a
tie between them always goes to the first draw.

:func:`distinct_rows` finds, for every draw, the first draw equal to it (an all-pairs comparison
of the ``[W, S]`` token rows: ``W^2 S`` integer comparisons, negligible beside ``D`` forward
passes of a language model), keeps those first draws in draw order and pads to the static ``D``
with copies of draw 0 (real token ids, scored and never read).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Array = jax.Array


def distinct_bound(search_width: int, suffix_length: int, topk: int, n_replace: int) -> int:
  """The static number of distinct rows a step scores: ``min(W, comb(S, R) * K**R)``.

  Examples:
    >>> distinct_bound(512, 6, 32, 1), distinct_bound(512, 20, 256, 1), distinct_bound(64, 3, 2, 2)
    (192, 512, 12)
  """
  return min(search_width, math.comb(suffix_length, n_replace) * topk ** n_replace)


def distinct_rows(rows: Array, size: int) -> tuple[Array, Array]:
  """The distinct rows of ``rows`` ``[W, S]``, in order of first appearance, and where each row
  went.

  Args:
    rows: ``[W, S]`` int token rows (one example's candidates).
    size: static ``D``, at least the number of distinct rows (e.g. :func:`distinct_bound`).

  Returns:
    ``(unique [D, S], inverse [W] int32)``: ``unique[inverse[w]] == rows[w]`` for every ``w``;
    ``unique[:n]`` are the ``n`` distinct rows in the order of their first draw, and rows ``n..D-1``
    copies of ``rows[0]`` (padding, referenced by no ``inverse``).

  Examples:
    >>> rows = jnp.array([[1, 2], [3, 2], [1, 2], [1, 5], [3, 2]])
    >>> unique, inverse = distinct_rows(rows, 4)
    >>> unique.tolist(), inverse.tolist()
    ([[1, 2], [3, 2], [1, 5], [1, 2]], [0, 1, 0, 2, 1])
  """
  width = rows.shape[0]
  same = jnp.all(rows[:, None, :] == rows[None, :, :], axis=-1)  # [W, W]
  first = jnp.argmax(same, axis=1).astype(jnp.int32)  # the first draw equal to each (itself at worst)
  is_first = first == jnp.arange(width, dtype=jnp.int32)
  slot = jnp.cumsum(is_first, dtype=jnp.int32) - 1  # a first draw's place among the distinct rows
  keep = jnp.nonzero(is_first, size=size, fill_value=0)[0]
  return rows[keep], slot[first]


__all__ = ["distinct_bound", "distinct_rows"]
