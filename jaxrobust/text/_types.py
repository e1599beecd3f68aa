"""The word-swap attack's configuration and result (see :func:`jaxrobust.text.run`)."""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Union

import jax

Array = jax.Array


class WordSwap(NamedTuple):
  """Static configuration of the gradient-guided greedy word-swap attack, built by
  :func:`jaxrobust.text.word_swap`; hashable, so it can be a static argument of ``jax.jit``.

  Attributes:
    steps: greedy steps (a static Python int); each changes at most one position, so it bounds
      the number of swaps ever tried.
    search_width: how many of the best first-order candidate swaps are re-scored exactly each
      step, with ``search_width`` forward rows per example.
    loss: ``"margin"``, ``"ce"`` or a function ``loss(logits [B, C], labels [B]) -> [B]``,
      larger meaning more adversarial (as in :mod:`jaxrobust.losses`).
    name: a short description for reports.
    config: the factory call as a JSON string (as :attr:`jaxrobust.Attack.config`).
  """

  steps: int = 8
  search_width: int = 16
  loss: Union[str, Callable[..., Array]] = "margin"
  name: str = "word_swap"
  config: Optional[str] = None


class Result(NamedTuple):
  """What :func:`jaxrobust.text.run` returns; ``success`` and ``logits`` come from one forward
  pass on ``tokens_adv``.

  Attributes:
    tokens_adv: ``[B, L]`` int32 adversarial tokens: the first success found (the fewest swaps
      the greedy search reached), else the best attempt; clean-misclassified rows unchanged.
    success: ``[B]`` bool, ``argmax logits != y`` (non-finite logits count as a success: the
      model is not correct there).
    swaps: ``[B]`` int32 number of positions where ``tokens_adv`` differs from ``tokens``.
    logits: ``[B, C]`` logits on ``tokens_adv``.
    queries: ``[B]`` int32 model queries spent on the example (see :func:`jaxrobust.text.run`).
    max_swaps: ``[B]`` int32 the swap budget the example was attacked with, so that
      :func:`jaxrobust.text.swap_curve` can refuse budgets the run never searched.
  """

  tokens_adv: Array
  success: Array
  swaps: Array
  logits: Array
  queries: Array
  max_swaps: Optional[Array] = None


class TextFooler(NamedTuple):
  """Static configuration of the TextFooler-class black-box attack, built by
  :func:`jaxrobust.text.textfooler`; hashable, so it can be a static argument of ``jax.jit``.

  Attributes:
    importance: ``"unk"`` (a word's importance is the drop of the true class's probability when
      it is replaced by ``unk_id``) or ``"delete"`` (when it is deleted: the words after it move
      one position left and ``pad_id`` fills the end).
    unk_id: the token id of the unknown word (``importance="unk"``).
    pad_id: the padding token id (trailing padding), or ``None`` when sequences are unpadded.
    flip_bonus: add TextFooler's bonus to a word's importance when removing it flips the
      prediction (Jin et al.'s code; TextAttack's recipe has none).
    min_cos_sim: the smallest cosine similarity of a substitute's word vector to the original
      word's (when ``word_vectors`` are given).
    min_similarity: the smallest sentence similarity of a substituted text's window to the
      current text's (when a ``sentence_similarity`` function is given).
    window_size: the number of words around the changed position that the sentence similarity
      sees (``None``: the whole text); texts with fewer words skip the similarity check.
    name: a short description for reports.
    config: the factory call as a JSON string (as :attr:`jaxrobust.Attack.config`).
  """

  importance: str = "unk"
  unk_id: Optional[int] = None
  pad_id: Optional[int] = None
  flip_bonus: bool = True
  min_cos_sim: float = 0.5
  min_similarity: float = 0.840845057
  window_size: Optional[int] = 15
  name: str = "textfooler"
  config: Optional[str] = None


class TextFoolerResult(NamedTuple):
  """What :func:`jaxrobust.text.run_textfooler` returns; the first six fields are those of
  :class:`Result` (so :func:`jaxrobust.text.swap_curve` takes it too).

  Attributes:
    tokens_adv: ``[B, L]`` int32 adversarial tokens: the first success found, else the text after
      the last accepted swap; clean-misclassified rows unchanged.
    success: ``[B]`` bool, ``argmax logits != y`` (``True`` for skipped rows).
    swaps: ``[B]`` int32 positions where ``tokens_adv`` differs from ``tokens``.
    logits: ``[B, C]`` the logits of ``tokens_adv`` (from the query that scored it).
    queries: ``[B]`` int32 model queries (rows evaluated) spent on the example.
    max_swaps: ``[B]`` int32 the swap budget the example was attacked with.
    skipped: ``[B]`` bool, misclassified before the attack (TextAttack's "skipped").
    words: ``[B]`` int32 words of the text (non-padding tokens).
    perturbed_fraction: ``[B]`` float32 ``swaps / words``.
  """

  tokens_adv: Array
  success: Array
  swaps: Array
  logits: Array
  queries: Array
  max_swaps: Array
  skipped: Array
  words: Array
  perturbed_fraction: Array


class TextAttackSummary(NamedTuple):
  """Attack summaries under TextAttack's conventions, from :func:`jaxrobust.text.summarize`
  (scalars; NaN where a mean has no element).

  Attributes:
    successful: examples correct on the clean text and broken.
    failed: examples correct on the clean text and not broken.
    skipped: examples misclassified on the clean text (not attacked).
    original_accuracy: ``(successful + failed) / N``.
    accuracy_under_attack: ``failed / N``.
    attack_success_rate: ``successful / (successful + failed)`` (skipped excluded).
    average_perturbed_word_percent: mean over successful examples of ``100 * swaps / words``.
    average_words: mean words per text over all examples.
    average_queries: mean queries over successful and failed examples (skipped excluded).
  """

  successful: Array
  failed: Array
  skipped: Array
  original_accuracy: Array
  accuracy_under_attack: Array
  attack_success_rate: Array
  average_perturbed_word_percent: Array
  average_words: Array
  average_queries: Array
