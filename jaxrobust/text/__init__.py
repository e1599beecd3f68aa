r"""Discrete threat models for text: word-swap attacks on classifiers and their robustness curves.

A text model is attacked through its embedding table: pass ``embedding [V, D]`` and the rest of
the model as ``logits_fn(embeds [B, L, D]) -> logits [B, C]`` (any JAX model: split off its
embedding look-up). The threat model is a list of allowed substitutes per token id
(``candidates [V, K]``, ``-1`` padding, e.g. synonym groups), an ``editable [B, L]`` mask, and a
budget of changed positions (``max_swaps``, traced data).

* :func:`word_swap` + :func:`run`: gradient-guided greedy substitution (HotFlip-style), returning
  a :class:`Result` with the first success found, swaps and model queries per example;
* :func:`textfooler` + :func:`run_textfooler`: TextFooler-class black-box substitution (Jin et
  al. 2020): words ranked by the drop of the true class's probability without them, then greedy
  substitution in that order under pluggable constraints and a query budget, returning a
  :class:`TextFoolerResult` (the model is a function of token ids; no gradient);
* :func:`swap_curve`: robust accuracy over swap budgets from one run, as a
  :class:`jaxrobust.Curve`; :func:`textattack_summary`: TextAttack's summary numbers;
* :func:`gcg` + :func:`run_gcg`: Greedy Coordinate Gradient (Zou et al. 2023) on causal language
  models given as ``lm_logits_fn(embeds [B, L, D]) -> [B, L, V]``, returning a
  :class:`GCGResult` (adversarial suffix, target loss, success); optionally with the prompt's
  key/value cache computed once (``prefix_fn``), and in resumable segments
  (:func:`gcg_segment`, :class:`GCGState`, :func:`save_gcg_state`, :func:`load_gcg_state`);
* :func:`classifier_judge` and :func:`host_judge`: verdicts (success, failure, unscored) on
  generated responses from a JAX classifier or a Python judge called on the host in batches,
  for :class:`jaxrobust.metrics.JudgedRate`.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> from jaxrobust import text
  >>> embedding = jnp.array([[1.0], [-1.0]])
  >>> logits_fn = lambda e: jnp.concatenate([e.sum((1, 2))[:, None], -e.sum((1, 2))[:, None]], 1)
  >>> tokens, y, candidates = jnp.array([[0, 0, 0]]), jnp.array([0]), jnp.array([[1], [0]])
  >>> attack = jax.jit(lambda tokens, y, key, max_swaps: text.run(
  ...     text.word_swap(steps=3), logits_fn, embedding, tokens, y, key, candidates=candidates,
  ...     max_swaps=max_swaps))  # the budget is data: a new one does not recompile
  >>> result = attack(tokens, y, jax.random.key(0), 3)
  >>> result.swaps.tolist()  # 3 -> 1 - 1 + 1 = 1 -> 1 - 1 - 1 = -1: two swaps flip the sign
  [2]
  >>> text.swap_curve(result, y, jnp.arange(4)).robust_accuracy.tolist()
  [1.0, 1.0, 0.0, 0.0]

References:
  J. Ebrahimi, A. Rao, D. Lowd, D. Dou. HotFlip: White-box adversarial examples for text
  classification. ACL 2018.
  D. Jin, Z. Jin, J. T. Zhou, P. Szolovits. Is BERT really robust? A strong baseline for natural
  language attack on text classification and entailment. AAAI 2020.
  J. Morris et al. TextAttack: A framework for adversarial attacks, data augmentation, and
  adversarial training in NLP. EMNLP 2020 (demos).
  A. Zou, Z. Wang, N. Carlini, M. Nasr, J. Z. Kolter, M. Fredrikson. Universal and transferable
  adversarial attacks on aligned language models. arXiv:2307.15043, 2023.
"""

from jaxrobust.text._curve import swap_curve
from jaxrobust.text._gcg import GCG, GCGResult, check_gcg_inputs, gcg, run_gcg
from jaxrobust.text._gcg_resume import GCGState, gcg_segment, load_gcg_state, save_gcg_state
from jaxrobust.text._judge import classifier_judge, host_judge, parse_verdict
from jaxrobust.text._summary import textattack_summary
from jaxrobust.text._textfooler import check_textfooler_inputs, run_textfooler, textfooler
from jaxrobust.text._types import (Result, TextAttackSummary, TextFooler, TextFoolerResult,
                                   WordSwap)
from jaxrobust.text._word_swap import check_inputs, run, word_swap

__all__ = ["GCG", "GCGResult", "GCGState", "Result", "TextAttackSummary", "TextFooler",
           "TextFoolerResult", "WordSwap", "check_gcg_inputs", "check_inputs",
           "check_textfooler_inputs", "classifier_judge", "gcg", "gcg_segment", "host_judge",
           "load_gcg_state", "parse_verdict", "run", "run_gcg", "run_textfooler",
           "save_gcg_state", "swap_curve", "textattack_summary", "textfooler",
           "word_swap"]
