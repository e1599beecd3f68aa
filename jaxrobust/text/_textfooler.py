r"""TextFooler-class black-box word substitution (Jin et al. 2020), as TextAttack runs it.

The attack sees the model only through its outputs on token sequences
(``logits_fn(tokens [N, L]) -> [N, C]``, probabilities :math:`p = \mathrm{softmax}(z)`): no
gradient, no embedding. For a text :math:`x^0` correctly classified as :math:`y`:

1. **Word importance.** Every eligible position :math:`i` (editable, not padding, not a stop
   word) is scored by the drop of the true class's probability when its word is removed:

   .. math:: I_i = p_y(x^0) - p_y(x^0_{\setminus i})
      + [\hat y_i \ne y]\,\big(p_{\hat y_i}(x^0_{\setminus i}) - p_{\hat y_i}(x^0)\big),

   with :math:`x^0_{\setminus i}` the text with word :math:`i` replaced by ``unk_id``
   (``importance="unk"``, TextFooler's code and paper) or deleted (``"delete"``: the words after
   it move left, ``pad_id`` fills the end; TextAttack's recipe), :math:`\hat y_i` the prediction
   on it, and the second term (TextFooler's bonus when the removal alone flips the prediction)
   only with ``flip_bonus=True`` (TextAttack's ``GreedyWordSwapWIR`` ranks by the first term).
2. **Greedy substitution.** Positions are visited once each, in decreasing importance. At a
   position, every substitute of the original word (``candidates``) that passes the constraints
   is scored in one batched query. If any substituted text is misclassified, the one most similar
   to the current text (``sentence_similarity``; without one, the one with the lowest
   :math:`p_y`) is kept and the attack has succeeded. Otherwise the substitute with the lowest
   :math:`p_y` is kept if it lowers :math:`p_y` below the current text's, and the search moves on.
3. **Constraints** (each optional, all applied as masks before a substitute is queried):
   ``stop_words [V]`` are never changed; a substitute's word vector must have cosine similarity
   at least ``min_cos_sim`` with the original word's (``word_vectors [V, E]``); its
   part-of-speech tag must be the original word's (``pos [V]``) or compatible with it
   (``pos_compatible [T, T]``); the ``window_size`` words around the position must keep a
   sentence similarity of at least ``min_similarity`` to the current text's
   (``sentence_similarity``); and any user rule (``constraints``).

The search is fixed-shape and batched: one ``lax.while_loop`` over positions in importance order,
each iteration one model call on ``[B * K]`` rows, with per-example masks (a finished example
stops changing and stops costing queries); the loop ends when every example has finished.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._batch import check_keys, is_correct, like_batch, one_hot_mask, per_example, predict
from jaxrobust._validation import (check_bool, check_label_shape, check_labels, check_logits,
                                   check_number, check_positive_int, is_concrete, logits_shape)
from jaxrobust.attacks._config import recorded
from jaxrobust.text import _checks
from jaxrobust.text._search import (candidate_rows, first_near_best, lookup, substitutes,
                                    tolerance)
from jaxrobust.text._types import TextFooler, TextFoolerResult

Array = jax.Array
Similarity = Callable[[Array, Array, Array], Array]
Constraint = Callable[[Array, Array, Array, Array], Array]

IMPORTANCE = ("unk", "delete")
NO_LIMIT = int(np.iinfo(np.int32).max)
# Importances are ranked on a grid of 2**-17 (7.6e-6 in probability), then, within a grid cell,
# by the log-odds against the true class of the text without the word on a relative grid of
# 2**-16 (exactly the importance's order without the flip bonus, resolving probabilities that
# saturate near 1), then by position: values closer than that are ties, so that the order does not
# depend on how the batch was laid out (a row's outputs may differ in the last bits across batch
# sizes and devices).
RANK_SCALE = 2.0 ** 17
RELATIVE_BITS = 7  # float32 mantissa bits dropped: a relative grid of 2**-16


@recorded
def textfooler(*, importance: str = "unk", unk_id: Optional[int] = None,
               pad_id: Optional[int] = None, flip_bonus: bool = True, min_cos_sim: float = 0.5,
               min_similarity: float = 0.840845057,
               window_size: Optional[int] = 15) -> TextFooler:
  r"""Static configuration of the TextFooler-class black-box word-substitution attack.

  Run it with :func:`jaxrobust.text.run_textfooler`; the module docstring states the algorithm.
  The defaults are Jin et al.'s: importance by replacing a word with the unknown token, with the
  label-flip bonus; substitutes within cosine similarity 0.5 of the word (their code; the paper
  says 0.7); sentence similarity over a 15-word window at TextAttack's threshold for angular
  similarity, 0.840845057 (the code's ``1 - 0.5`` with the angle's missing division by
  :math:`\pi` corrected). TextAttack's recipe (``TextFoolerJin2019``) is
  ``importance="delete", flip_bonus=False``.

  Args:
    importance: ``"unk"`` (replace the word by ``unk_id``) or ``"delete"`` (remove it; needs
      ``pad_id``).
    unk_id: the unknown token's id (required for ``"unk"``).
    pad_id: the padding token's id: sequences are padded at the end with it, padding is never
      changed nor counted as a word, and never swapped in (a candidate equal to ``pad_id`` is
      skipped, as ``-1``). ``None``: every position is a word.
    flip_bonus: add TextFooler's bonus to the importance of a word whose removal flips the
      prediction.
    min_cos_sim: in ``[-1, 1]``, the word-vector constraint's threshold (used when
      ``word_vectors`` are given).
    min_similarity: the sentence-similarity constraint's threshold (used when a
      ``sentence_similarity`` function is given).
    window_size: words around the changed position that the sentence similarity compares
      (TextAttack's ``text_window_around_index``); texts with fewer words skip the check
      (score 1, TextAttack's ``skip_text_shorter_than_window``). ``None``: the whole text.

  Returns:
    A hashable :class:`jaxrobust.text.TextFooler` whose ``config`` records this call.

  Raises:
    ValueError: an unknown ``importance``, a missing ``unk_id`` / ``pad_id``, negative ids,
      ``min_cos_sim`` outside ``[-1, 1]``, a non-finite ``min_similarity``, ``window_size < 1``.

  Examples:
    >>> from jaxrobust import text
    >>> attack = text.textfooler(unk_id=1)
    >>> attack.importance, attack.flip_bonus, attack.min_cos_sim, attack.window_size
    ('unk', True, 0.5, 15)

  References:
    D. Jin, Z. Jin, J. T. Zhou, P. Szolovits. Is BERT really robust? A strong baseline for
    natural language attack on text classification and entailment. AAAI 2020.
    J. Morris et al. TextAttack: A framework for adversarial attacks, data augmentation, and
    adversarial training in NLP. EMNLP 2020 (demos).
  """
  if importance not in IMPORTANCE:
    raise ValueError(f"importance must be one of {IMPORTANCE}, got {importance!r}.")
  if importance == "unk" and unk_id is None:
    raise ValueError("importance='unk' replaces each word by the unknown token: give its id, "
                     "unk_id=..., or use importance='delete' with pad_id=....")
  if importance == "delete" and pad_id is None:
    raise ValueError("importance='delete' removes a word and pads the end: give pad_id=....")
  unk_id = None if unk_id is None else check_positive_int("unk_id", unk_id, minimum=0)
  pad_id = None if pad_id is None else check_positive_int("pad_id", pad_id, minimum=0)
  window_size = None if window_size is None else check_positive_int("window_size", window_size)
  return TextFooler(importance=importance, unk_id=unk_id, pad_id=pad_id,
                    flip_bonus=check_bool("flip_bonus", flip_bonus),
                    min_cos_sim=check_number("min_cos_sim", min_cos_sim, low=-1.0, high=1.0),
                    min_similarity=check_number("min_similarity", min_similarity),
                    window_size=window_size, name=f"textfooler-{importance}")


def run_textfooler(attack: TextFooler, logits_fn: Callable[[Array], Array], tokens: Array,
                   y: Array, key: Array, *, candidates: Array, editable: Optional[Array] = None,
                   stop_words: Optional[Array] = None, word_vectors: Optional[Array] = None,
                   pos: Optional[Array] = None, pos_compatible: Optional[Array] = None,
                   sentence_similarity: Optional[Similarity] = None,
                   constraints: Sequence[Constraint] = (),
                   max_swaps: Union[int, Array, None] = None,
                   max_queries: Union[int, Array, None] = None) -> TextFoolerResult:
  r"""Runs the TextFooler-class attack (see :func:`jaxrobust.text.textfooler`) on a batch.

  **Conventions** (TextAttack's, where Jin et al.'s code differs):

  * *Substitutes* are the other entries of the ORIGINAL word's row of ``candidates`` (``-1``
    padding, the word itself and repeats skipped); each position changes at most once.
  * *Keeping a non-flipping substitute* needs :math:`p_y` below the CURRENT text's (TextAttack;
    Jin et al.'s code compares with the original text's).
  * *Choosing among flips*: the largest sentence similarity, then the lowest :math:`p_y`, then
    the earlier slot of the candidate list. TextAttack considers the flips only when the lowest
    :math:`p_y` of all substitutes is a flip, which for two classes is always the case.
  * *Ties*: importances closer than :math:`2^{-17}` are ordered by the log-odds
    :math:`\log(1 - p_y) - \log p_y` of the text without the word (within a relative
    :math:`2^{-16}`), then by position; substitutes are compared by that log-odds (which keeps
    its resolution where :math:`p_y` saturates) and by similarity, values within a relative
    ``1e-5`` counting as equal and going to the earlier slot. So a row's result does not depend on
    its place in the batch or on the device count. ``key`` is validated; the search is
    deterministic.
  * *Queries* (TextAttack's count, every model row evaluated): 1 for the clean text, 1 per
    eligible position for the importance ranking, and 1 per substitute that passed the
    constraints at each visited position. The constraints cost no query; rows the fixed-shape
    search computes but masks out are not counted. Misclassified clean texts are skipped (1
    query, returned unchanged with ``success = True``), and so is the ranking of a row whose
    ``max_swaps`` is 0 (1 query: no swap is allowed).
  * *Budgets* (traced data, a new value does not recompile): ``max_queries`` as TextAttack's
    ``query_budget`` (a ranking that would reach it ends the attack; at a position only the first
    substitutes within it are queried, and the search stops when it is spent); ``max_swaps``
    stops an example after that many kept swaps. Neither changes the path up to where it stops,
    so :func:`jaxrobust.text.swap_curve` of one run gives every smaller swap budget.
  * *Compile time*: one model call ranks the words (the clean texts and the texts without each
    word, ``[B * (1 + L)]`` rows) and one ``while_loop`` step holds the whole greedy visit. On
    XLA:CPU, when compilation dominates (a small model, one run per program),
    ``jax.jit(..., compiler_options={"xla_cpu_use_fusion_emitters": False,
    "xla_backend_optimization_level": 0})`` compiles this program several times faster (each of
    its ~70 kernels in a few ms of CPU instead of ~30 ms) for the same results, at the cost of
    slower element-wise kernels (gathers); ``benchmarks/RESULTS.md`` has the figures.

  Args:
    attack: from :func:`jaxrobust.text.textfooler`.
    logits_fn: ``tokens [N, L] int32 -> logits [N, C]`` (log-probabilities work too); rows must
      be independent (eval mode). Called on ``[B * (1 + L)]`` and ``[B * K]`` rows.
    tokens: ``[B, L]`` int token ids in ``[0, V)``, ``V`` = ``candidates.shape[0]``; padding (if
      any) at the end.
    y: ``[B]`` int labels.
    key: a PRNG key (or one per example, ``[B]``); the search is deterministic.
    candidates: ``[V, K]`` int substitutes of each token id (e.g. the nearest neighbours in
      counter-fitted word vectors), ``-1`` padding.
    editable: ``[B, L]`` bool positions that may change (default: all but padding).
    stop_words: ``[V]`` bool words never changed nor ranked.
    word_vectors: ``[V, E]`` float word vectors for the cosine constraint.
    pos: ``[V]`` int part-of-speech tags: a substitute needs the original word's tag, or with
      ``pos_compatible [T, T]`` bool (tags in ``[0, T)``), ``pos_compatible[tag, new_tag]``.
    sentence_similarity: ``(reference [B, L], substituted [B, K, L], window [B, L] bool) ->
      [B, K]`` float, the similarity of each substituted text to the current one over the
      window's positions (e.g. the cosine of mean-pooled encodings of the window's tokens).
    constraints: more rules, each ``(original [B, L], current [B, L], position [B],
      substitute [B, K]) -> [B, K]`` bool, ``True`` where the substitute is allowed.
    max_swaps: int or ``[B]`` (default: no limit), ``>= 0``, traced.
    max_queries: int or ``[B]`` (default: no limit), ``>= 1``, traced.

  Returns:
    A :class:`jaxrobust.text.TextFoolerResult`.

  Raises:
    TypeError, ValueError: bad shapes, dtypes or values, as :func:`check_textfooler_inputs`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jaxrobust import text
    >>> weight = jnp.array([0.0, 2.0, 1.0, -3.0])  # token 0 is the unknown word
    >>> logits_fn = lambda t: jnp.stack([jnp.zeros(t.shape[0]), weight[t].sum(1)], axis=1)
    >>> candidates = jnp.array([[-1], [3], [3], [-1]])  # 1 and 2 may become 3
    >>> result = jax.jit(lambda tokens, y, key: text.run_textfooler(
    ...     text.textfooler(unk_id=0), logits_fn, tokens, y, key, candidates=candidates))(
    ...     jnp.array([[2, 1, 2]]), jnp.array([1]), jax.random.key(0))
    >>> result.tokens_adv.tolist(), result.swaps.tolist(), result.queries.tolist()
    ([[2, 3, 2]], [1], [5])

  References:
    D. Jin, Z. Jin, J. T. Zhou, P. Szolovits. Is BERT really robust? A strong baseline for
    natural language attack on text classification and entailment. AAAI 2020.
    J. Morris et al. TextAttack: A framework for adversarial attacks, data augmentation, and
    adversarial training in NLP. EMNLP 2020 (demos).
  """
  editable = check_textfooler_inputs(
      attack, logits_fn, tokens, y, candidates=candidates, editable=editable,
      stop_words=stop_words, word_vectors=word_vectors, pos=pos, pos_compatible=pos_compatible,
      sentence_similarity=sentence_similarity, constraints=constraints, max_swaps=max_swaps,
      max_queries=max_queries)
  tokens, y = jnp.asarray(tokens).astype(jnp.int32), jnp.asarray(y)
  batch, length = tokens.shape
  check_keys(key, batch)  # validates the key; the search itself is deterministic
  swap_budget = like_batch(per_example(length if max_swaps is None else max_swaps, batch,
                                       jnp.int32), tokens)
  query_budget = like_batch(per_example(NO_LIMIT if max_queries is None else max_queries, batch,
                                        jnp.int32), tokens)
  words = _word_mask(attack, tokens)
  eligible = jnp.asarray(editable) & words
  if stop_words is not None:
    eligible = eligible & ~lookup(jnp.asarray(stop_words), tokens)
  values, valid = substitutes(tokens, jnp.asarray(candidates), eligible)
  if attack.pad_id is not None:  # padding is never a word: swapping it in would delete the word
    valid = valid & (values != attack.pad_id)
  # The clean texts and the texts without one word, in one model call ([B * (1 + L)] rows).
  texts = _leave_one_out(attack, tokens, with_clean=True)  # [B, 1 + L, L]
  all_logits = logits_fn(texts.reshape(batch * (1 + length), length)).reshape(
      batch, 1 + length, -1)
  clean_logits = all_logits[:, 0]
  searching = is_correct(clean_logits, y)
  importance, removed, clean_odds = _importance_from(attack, all_logits, y)
  order, steps = _rank(importance, removed, eligible & jnp.any(valid[..., 1:], axis=-1))
  n_eligible = jnp.sum(eligible, axis=1, dtype=jnp.int32)
  ranked = searching & (swap_budget > 0)  # a budget of 0 allows no swap: nothing to rank for
  queries = jnp.where(ranked, jnp.minimum(1 + n_eligible, query_budget), 1)
  active = ranked & (1 + n_eligible < query_budget)
  count = jnp.sum(words, axis=1, dtype=jnp.int32)
  allowed = _allowed(attack, tokens, jnp.asarray(candidates).shape[0], word_vectors, pos,
                     pos_compatible, sentence_similarity, constraints)
  tokens_adv, logits, queries, swaps, success = _greedy(
      attack, logits_fn, tokens, y, values[..., 1:], valid[..., 1:], order, steps, count,
      allowed, (clean_logits, clean_odds, active, queries, ~searching),
      (swap_budget, query_budget))
  return TextFoolerResult(
      tokens_adv=tokens_adv, success=success, swaps=swaps, logits=logits,
      queries=queries, max_swaps=swap_budget, skipped=~searching, words=count,
      perturbed_fraction=swaps.astype(jnp.float32) / jnp.maximum(count, 1).astype(jnp.float32))


def check_textfooler_inputs(attack: TextFooler, logits_fn: Callable[[Array], Array],
                            tokens: Array, y: Array, *, candidates: Array,
                            editable: Optional[Array] = None, stop_words: Optional[Array] = None,
                            word_vectors: Optional[Array] = None, pos: Optional[Array] = None,
                            pos_compatible: Optional[Array] = None,
                            sentence_similarity: Optional[Similarity] = None,
                            constraints: Sequence[Constraint] = (),
                            max_swaps: Union[int, Array, None] = None,
                            max_queries: Union[int, Array, None] = None) -> Array:
  """Validates the inputs of :func:`run_textfooler` (which calls it); returns the editable mask
  (default: every non-padding position).

  Shapes and dtypes are always checked (the model, the similarity function and the constraints
  by tracing their output shapes); values (ids in range, budgets, tags, an empty mask) only on
  concrete arrays: inside a user's ``jax.jit`` call this once on the host first if the data may
  be wrong (out-of-range ids would otherwise be clamped by the look-ups).

  Raises:
    TypeError: an attack not from :func:`textfooler`, float token ids, a non-bool mask or stop
      words, float tags, int word vectors, a float budget, a non-callable rule.
    ValueError: an attack without the id its importance needs, ids outside ``[0, V)``
      (``[-1, V)`` for candidates), tables without one entry per token id, tags outside
      ``[0, T)``, labels outside ``[0, C)``, ``max_swaps < 0``, ``max_queries < 1``, an empty
      editable mask, outputs of the wrong shape, a model that fails on another number of rows.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import text
    >>> text.check_textfooler_inputs(
    ...     text.textfooler(unk_id=0), lambda t: jnp.zeros((t.shape[0], 2)), jnp.array([[0, 3]]),
    ...     jnp.array([0]), candidates=jnp.array([[1], [2], [-1]]))
    Traceback (most recent call last):
    ...
    ValueError: tokens must hold token ids in [0, 3) (rows of candidates, one per token id); got min 0, max 3.
  """
  if not isinstance(attack, TextFooler):
    raise TypeError(f"attack must come from jr.text.textfooler(...), got {type(attack).__name__}.")
  needed = "unk_id" if attack.importance == "unk" else "pad_id"
  if getattr(attack, needed) is None:
    raise ValueError(f"importance={attack.importance!r} needs {needed}: build the attack with "
                     f"jr.text.textfooler(importance={attack.importance!r}, {needed}=...).")
  vocab_size = int(candidates.shape[0]) if getattr(candidates, "ndim", 0) == 2 else 1
  vocabulary = "rows of candidates, one per token id"
  _checks.check_token_ids("candidates", candidates, vocab_size, allow_padding=True,
                          vocabulary=vocabulary)
  _checks.check_token_ids("tokens", tokens, vocab_size, vocabulary=vocabulary)
  for name in ("unk_id", "pad_id"):
    if getattr(attack, name) is not None and getattr(attack, name) >= vocab_size:
      raise ValueError(f"{name}={getattr(attack, name)} is not a token id of the vocabulary "
                       f"(candidates has V = {vocab_size} rows).")
  batch, length = tokens.shape
  spec = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  num_classes = check_logits(logits_shape(logits_fn, spec), batch)
  _checks.check_any_row_count(logits_fn, spec, batch * (1 + length), "TextFooler")
  check_label_shape("y", y, batch, f"tokens has {batch} rows")
  check_labels("y", y, num_classes)
  if max_swaps is not None:
    _checks.check_count("max_swaps", max_swaps, batch, 0)
  if max_queries is not None:
    _checks.check_count("max_queries", max_queries, batch, 1)
  _check_tables(vocab_size, stop_words, word_vectors, pos, pos_compatible)
  slots = int(candidates.shape[1])
  _check_rules(sentence_similarity, constraints, batch, length, slots)
  if editable is None:
    return _word_mask(attack, jnp.asarray(tokens))
  _checks.check_editable(editable, tokens.shape)
  return editable


def word_importance(attack: TextFooler, logits_fn: Callable[[Array], Array], tokens: Array,
                    y: Array, clean_logits: Array) -> Array:
  r"""``[B, L]`` float32 importance :math:`I_i` of every position (the formula of the module
  docstring), from one model call on the ``[B * L]`` texts with one word removed (``unk_id``
  in its place, or deleted). Every position is scored; the search ranks the eligible ones.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import text
    >>> weight = jnp.array([0.0, 2.0, -1.0])
    >>> logits_fn = lambda t: jnp.stack([jnp.zeros(t.shape[0]), weight[t].sum(1)], axis=1)
    >>> tokens, y = jnp.array([[1, 2, 1]]), jnp.array([1])  # margin 3
    >>> importance = word_importance(text.textfooler(unk_id=0), logits_fn, tokens, y,
    ...                              logits_fn(tokens))
    >>> [round(v, 4) for v in importance[0].tolist()]  # sigmoid(3) - sigmoid(1), - sigmoid(4)
    [0.2215, -0.0294, 0.2215]
  """
  return _importance(attack, logits_fn, tokens, y, clean_logits)[0]


def _importance(attack: TextFooler, logits_fn: Callable[[Array], Array], tokens: Array, y: Array,
                clean_logits: Array) -> tuple[Array, Array, Array]:
  """``(importance [B, L], removed [B, L], clean [B])``: :func:`word_importance`, the log-odds
  against the true class of each text without its word (:func:`_log_odds`) and of the clean
  text, from one model call."""
  batch, length = tokens.shape
  rows = _leave_one_out(attack, tokens)  # [B, L, L]
  logits = logits_fn(rows.reshape(batch * length, length)).reshape(batch, length, -1)
  return _importance_from(attack, jnp.concatenate([clean_logits[:, None], logits], axis=1), y)


def _importance_from(attack: TextFooler, logits: Array, y: Array) -> tuple[Array, Array, Array]:
  """:func:`_importance` from the logits ``[B, 1 + L, C]`` of the clean text (first) and of the
  texts without each word (one softmax and one log-odds over all of them)."""
  num_classes = logits.shape[-1]
  probabilities = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)  # [B, 1 + L, C]
  true = one_hot_mask(y, num_classes)[:, None]  # [B, 1, C]
  p_true = jnp.sum(jnp.where(true, probabilities, 0.0), axis=-1)  # [B, 1 + L]
  drop = p_true[:, :1] - p_true[:, 1:]
  odds = _log_odds(logits, y)
  if not attack.flip_bonus:
    return drop, odds[:, 1:], odds[:, 0]
  clean, removed = probabilities[:, 0], probabilities[:, 1:]
  new = predict(logits[:, 1:])  # [B, L], -1 for non-finite logits
  gained = jnp.max(removed, axis=-1) - jnp.sum(
      jnp.where(one_hot_mask(new, num_classes), clean[:, None], 0.0), axis=-1)
  return drop + jnp.where((new != y[:, None]) & (new >= 0), gained, 0.0), odds[:, 1:], odds[:, 0]


def similarity_window(position: Array, words: Array, size: Optional[int], length: int) -> Array:
  """``[B, L]`` bool: the ``size`` words around ``position [B]`` in texts of ``words [B]`` words,
  as TextAttack's ``AttackedText.text_window_around_index`` (``size = None``: all words).

  Examples:
    >>> import jax.numpy as jnp
    >>> similarity_window(jnp.array([0, 4, 9]), jnp.array([10, 10, 10]), 4, 10).astype(int)
    Array([[1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
           [0, 0, 1, 1, 1, 1, 0, 0, 0, 0],
           [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]], dtype=int32)
  """
  start, end = _window_bounds(position.astype(jnp.int32), words.astype(jnp.int32), size)
  j = jnp.arange(length, dtype=jnp.int32)[None, :]
  return (j >= start[:, None]) & (j <= end[:, None])


def _window_bounds(position: Array, words: Array, size: Optional[int]) -> tuple[Array, Array]:
  """``(start, end)``, like ``position [B, ...]``: the first and last position of
  :func:`similarity_window` around each position, in texts of ``words [B]`` words."""
  n = words.reshape(words.shape + (1,) * (position.ndim - 1))
  if size is None:
    return jnp.zeros_like(position), jnp.zeros_like(position) + n - 1
  i = position
  near_start, near_end = 2 * i < size - 1, 2 * i + size - 1 >= 2 * n
  start = jnp.where(near_start, 0, jnp.where(near_end, jnp.maximum(0, n - size), i - size // 2))
  end = jnp.where(near_start, jnp.minimum(size - 1, n - 1),
                  jnp.where(near_end, n - 1, i + (size - 1) // 2))
  return start, end


def _word_mask(attack: TextFooler, tokens: Array) -> Array:
  """``[B, L]`` bool: positions holding a word (not padding)."""
  if attack.pad_id is None:
    return jnp.ones_like(tokens, dtype=bool)
  return tokens != attack.pad_id


def _leave_one_out(attack: TextFooler, tokens: Array, with_clean: bool = False) -> Array:
  """``[B, L, L]``: row ``i`` is ``tokens`` with word ``i`` replaced by ``unk_id`` or deleted;
  ``with_clean``: ``[B, 1 + L, L]``, the unchanged text first (one select builds every row)."""
  length = tokens.shape[1]
  # The position each row removes; the clean row removes one past the end (nothing).
  removed = jnp.arange(length, dtype=jnp.int32)
  if with_clean:
    removed = jnp.concatenate([jnp.full((1,), length, jnp.int32), removed])
  if attack.importance == "unk":
    position = jnp.zeros_like(tokens[:, :1]) + removed[None, :]  # sharded like tokens
    return candidate_rows(tokens, position, jnp.full_like(position, attack.unk_id))
  shifted = jnp.concatenate([tokens[:, 1:], jnp.full_like(tokens[:, :1], attack.pad_id)], axis=1)
  before = jnp.arange(length)[None, :] < removed[:, None]  # [i, j]: j before the removed word
  return jnp.where(before[None], tokens[:, None, :], shifted[:, None, :])


def _rank(importance: Array, removed: Array, rankable: Array) -> tuple[Array, Array]:
  """``(order [B, L], steps [B])``: the rankable positions by decreasing importance (on the
  :data:`RANK_SCALE` grid, then by the log-odds ``removed`` on a relative grid, then by position)
  first, then the others; ``steps`` counts the rankable ones (the positions the greedy search
  visits)."""
  finite = jnp.nan_to_num(importance, nan=-4.0, posinf=4.0, neginf=-4.0)
  coarse = jnp.round(jnp.clip(finite, -4.0, 4.0) * RANK_SCALE).astype(jnp.int32)
  bits = jax.lax.bitcast_convert_type(
      jnp.nan_to_num(removed.astype(jnp.float32), nan=jnp.inf), jnp.int32)
  monotone = jnp.where(bits < 0, jnp.int32(np.iinfo(np.int32).min) - bits, bits)  # -0.0 -> 0
  fine = jnp.right_shift(monotone, RELATIVE_BITS)
  last = jnp.int32(np.iinfo(np.int32).max)
  # One stable sort on the two keys, coarse then fine; equal keys keep the order of positions
  # (the position operand is built from the keys, so it carries their batch sharding).
  position = jnp.zeros_like(coarse) + jnp.arange(coarse.shape[1], dtype=jnp.int32)[None, :]
  _, _, order = jax.lax.sort((jnp.where(rankable, -coarse, last), jnp.where(rankable, -fine, last),
                              position), dimension=1, is_stable=True, num_keys=2)
  return order, jnp.sum(rankable, axis=1, dtype=jnp.int32)


def _allowed(attack: TextFooler, tokens: Array, vocab_size: int, word_vectors, pos,
             pos_compatible, sentence_similarity, constraints):
  """The constraints as one function ``(current, position, original, substitute, rows, window,
  checked) -> (ok [B, K], similarity [B, K] or None)``, with ``window [B, L]`` the similarity
  window and ``checked [B]`` whether the text is long enough for the similarity check."""
  vectors = None if word_vectors is None else jnp.asarray(word_vectors).astype(jnp.float32)
  tags = None if pos is None else jnp.asarray(pos).astype(jnp.int32)
  table = None if pos_compatible is None else jnp.asarray(pos_compatible).reshape(-1)

  def allowed(current, position, original, substitute, rows, window, checked):
    safe = jnp.clip(substitute, 0, vocab_size - 1)  # -1 padding slots are masked anyway
    ok = jnp.ones_like(substitute, dtype=bool)
    if vectors is not None:
      a, b = lookup(vectors, original)[:, None, :], lookup(vectors, safe)  # [B, 1, E], [B, K, E]
      cos = jnp.sum(a * b, axis=-1) / (jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1))
      ok = ok & (cos >= attack.min_cos_sim)  # a zero vector (NaN) never passes
    if tags is not None:
      tag, new_tag = lookup(tags, original)[:, None], lookup(tags, safe)
      if table is None:
        ok = ok & (tag == new_tag)
      else:
        ok = ok & lookup(table, tag * pos_compatible.shape[0] + new_tag)
    for rule in constraints:
      ok = ok & rule(tokens, current, position, substitute)
    if sentence_similarity is None:
      return ok, None
    similarity = sentence_similarity(current, rows, window).astype(jnp.float32)
    similarity = jnp.where(checked[:, None], similarity, 1.0)
    return ok & (similarity >= attack.min_similarity), similarity

  return allowed


def _log_odds(logits: Array, y: Array) -> Array:
  r"""``[B, ...]`` the log-odds against class ``y [B]``, :math:`\log(1 - p_y) - \log p_y =
  \log\sum_{c \ne y} e^{z_c} - z_y`, for logits ``[B, ..., C]``: larger means a lower
  :math:`p_y`, and unlike :math:`p_y` it keeps its resolution where :math:`p_y` saturates near 0
  or 1 (for two classes it is the logit margin :math:`z_{1-y} - z_y`)."""
  z = logits.astype(jnp.float32)
  true = one_hot_mask(y, z.shape[-1]).reshape((z.shape[0],) + (1,) * (z.ndim - 2)
                                               + (z.shape[-1],))
  return (jax.nn.logsumexp(jnp.where(true, -jnp.inf, z), axis=-1)
          - jnp.sum(jnp.where(true, z, 0.0), axis=-1))


def _choose(odds: Array, flips: Array, flipped: Array, evaluated: Array, similarity) -> Array:
  """``[B]`` the slot kept: among flips (``flipped [B]``: any) the most similar (then the lowest
  ``p_y``, i.e. the largest log-odds, then the first slot), else the lowest ``p_y`` of the
  evaluated substitutes."""
  score = jnp.where(evaluated, jnp.nan_to_num(odds, nan=jnp.inf), -jnp.inf)
  near = flips
  if similarity is not None:
    similar = jnp.nan_to_num(similarity, nan=-jnp.inf)
    best = jnp.max(jnp.where(flips, similar, -jnp.inf), axis=1, keepdims=True)
    near = flips & (similar >= best - tolerance(best))
  candidates = jnp.where(flipped[:, None], near, evaluated)
  return first_near_best(score, candidates).astype(jnp.int32)


def _greedy(attack, logits_fn, tokens, y, substitute, movable, order, steps, count, allowed,
            start, budgets):
  """The greedy substitution in importance order; returns ``(tokens_adv, logits, queries,
  swaps, success)``."""
  clean_logits, clean_odds, active, queries, success = start
  swap_budget, query_budget = budgets
  batch, length = tokens.shape
  slots = substitute.shape[-1]
  # What each visit needs, in one int32 array [B, L, 4 + 2K] gathered once in visiting order (a
  # visit takes one dynamic slice): the position, its original token, the similarity window's
  # first and last position, the substitutes and which of them may be used.
  position = jnp.zeros_like(tokens) + jnp.arange(length, dtype=jnp.int32)[None, :]  # sharded
  first, last = _window_bounds(position, count, attack.window_size)
  table = jnp.concatenate([position[..., None], tokens[..., None], first[..., None],
                           last[..., None], substitute, movable.astype(jnp.int32)], axis=-1)
  visits = jnp.take_along_axis(table, order[..., None], axis=1)
  checked = (count >= (attack.window_size or 0))  # TextAttack skips the check on short texts
  j = jnp.arange(length, dtype=jnp.int32)[None, :]
  earlier = (jnp.arange(slots)[:, None] <= jnp.arange(slots)[None, :]).astype(jnp.float32)

  def visit(carry):
    t, current, odds_current, logits, active, queries, swaps, success, _ = carry
    v = jax.lax.dynamic_index_in_dim(visits, t, axis=1, keepdims=False)  # [B, 4 + 2K]
    position, original, new_token = v[:, 0], v[:, 1], v[:, 4:4 + slots]
    window = (j >= v[:, 2:3]) & (j <= v[:, 3:4])
    live = active & (t < steps)
    rows = candidate_rows(current, jnp.broadcast_to(position[:, None], (batch, slots)),
                          new_token)  # [B, K, L]
    ok, similarity = allowed(current, position, original, new_token, rows, window, checked)
    ok = ok & (v[:, 4 + slots:] > 0) & live[:, None]
    # TextAttack's query budget: only the first substitutes within what is left are queried
    # (a running count as a product with a triangular matrix: exact for counts below 2**24).
    before = jnp.dot(ok.astype(jnp.float32), earlier,  # [B, K]: usable slots up to this one
                     precision=jax.lax.Precision.HIGHEST)
    evaluated = ok & (before <= (query_budget - queries).astype(jnp.float32)[:, None])
    row_logits = logits_fn(rows.reshape(batch * slots, length)).reshape(batch, slots, -1)
    odds = _log_odds(row_logits, y)  # [B, K], larger: lower p_y
    prediction = predict(row_logits)
    flips = evaluated & ((prediction != y[:, None]) | (prediction < 0))
    counts = jnp.sum(jnp.stack([flips, evaluated], axis=-1), axis=1, dtype=jnp.int32)  # [B, 2]
    flipped, n_evaluated = counts[:, 0] > 0, counts[:, 1]
    chosen = _choose(odds, flips, flipped, evaluated, similarity)
    slot = jnp.arange(slots, dtype=jnp.int32)[None, :] == chosen[:, None]  # [B, K]
    pick = lambda a: jnp.sum(jnp.where(slot.reshape(slot.shape + (1,) * (a.ndim - 2)), a,
                                       jnp.zeros((), a.dtype)), axis=1)  # a select, no gather
    if jnp.promote_types(row_logits.dtype, jnp.float32) == jnp.float32:  # exact in float32
      picked = pick(jnp.concatenate([odds[..., None], row_logits.astype(jnp.float32)], axis=-1))
      odds_new, logits_new = picked[:, 0], picked[:, 1:].astype(logits.dtype)
    else:
      odds_new, logits_new = pick(odds), pick(row_logits)
    keep = flipped | ((n_evaluated > 0) & (odds_new > odds_current + tolerance(odds_current)))
    current = jnp.where(keep[:, None], pick(rows), current)
    logits = jnp.where(keep[:, None], logits_new, logits)
    odds_current = jnp.where(keep, odds_new, odds_current)
    swaps = swaps + keep.astype(jnp.int32)
    queries = queries + n_evaluated
    success = success | flipped
    active = live & ~flipped & (queries < query_budget) & (swaps < swap_budget)
    going = (t + 1 < length) & jnp.any(active & (t + 1 < steps))
    return t + 1, current, odds_current, logits, active, queries, swaps, success, going

  carry = (jnp.int32(0), tokens, clean_odds, clean_logits, active, queries,
           jnp.zeros_like(queries), success, jnp.any(active & (steps > 0)))
  carry = jax.lax.while_loop(lambda carry: carry[-1], visit, carry)
  _, tokens_adv, _, logits, _, queries, swaps, success, _ = carry
  return tokens_adv, logits, queries, swaps, success


def _check_tables(vocab_size: int, stop_words, word_vectors, pos, pos_compatible) -> None:
  """The per-token tables of the constraints."""
  if stop_words is not None:
    _checks.check_vocab_table("stop_words", stop_words, vocab_size, kind="bool", ndim=1)
  if word_vectors is not None:
    _checks.check_vocab_table("word_vectors", word_vectors, vocab_size, kind="float", ndim=2)
  if pos is None:
    if pos_compatible is not None:
      raise ValueError("pos_compatible needs the tags: give pos=[V] as well.")
    return
  _checks.check_vocab_table("pos", pos, vocab_size, kind="int", ndim=1)
  if pos_compatible is None:
    return
  if not hasattr(pos_compatible, "dtype") or pos_compatible.dtype != jnp.bool_ \
      or pos_compatible.ndim != 2 or pos_compatible.shape[0] != pos_compatible.shape[1]:
    raise ValueError(f"pos_compatible must be a square bool table [T, T] (tag, substitute's tag),"
                     f" got {getattr(pos_compatible, 'dtype', type(pos_compatible).__name__)} "
                     f"{getattr(pos_compatible, 'shape', '')}.")
  if is_concrete(pos):
    lo, hi = int(np.min(np.asarray(pos))), int(np.max(np.asarray(pos)))
    if lo < 0 or hi >= pos_compatible.shape[0]:
      raise ValueError(f"pos must hold tags in [0, {pos_compatible.shape[0]}) (rows of "
                       f"pos_compatible); got min {lo}, max {hi}.")


def _check_rules(sentence_similarity, constraints, batch: int, length: int, slots: int) -> None:
  """The similarity function and the constraints, by the shapes of their outputs."""
  current = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  rows = jax.ShapeDtypeStruct((batch, slots, length), jnp.int32)
  position = jax.ShapeDtypeStruct((batch,), jnp.int32)
  substitute = jax.ShapeDtypeStruct((batch, slots), jnp.int32)
  if sentence_similarity is not None:
    if not callable(sentence_similarity):
      raise TypeError("sentence_similarity must be a function (reference [B, L], substituted "
                      "[B, K, L], window [B, L]) -> [B, K].")
    out = jax.eval_shape(sentence_similarity, current, rows,
                         jax.ShapeDtypeStruct((batch, length), jnp.bool_))
    if getattr(out, "shape", None) != (batch, slots) or \
        not jnp.issubdtype(out.dtype, jnp.floating):
      raise ValueError(f"sentence_similarity must return float scores [B, K] = [{batch}, "
                       f"{slots}], got {getattr(out, 'dtype', '')} {getattr(out, 'shape', out)}.")
  if not isinstance(constraints, (tuple, list)):
    raise TypeError(f"constraints must be a tuple of functions, got {type(constraints).__name__}.")
  for rule in constraints:
    if not callable(rule):
      raise TypeError(f"each constraint must be a function, got {type(rule).__name__}.")
    out = jax.eval_shape(rule, current, current, position, substitute)
    if getattr(out, "shape", None) != (batch, slots) or out.dtype != jnp.bool_:
      raise ValueError(f"a constraint must return a bool mask [B, K] = [{batch}, {slots}], got "
                       f"{getattr(out, 'dtype', '')} {getattr(out, 'shape', out)}.")
