r"""Generative-model rates: jailbreak attack success, prompt injection and paraphrase
consistency, each a mergeable :class:`~jaxrobust.metrics.Rate` of per-prompt judgments.

Judgments are booleans produced by the user's judge (a classifier, a string rule, a human label);
``valid`` marks the verdicts the judge could give, and ``invalid`` says whether the others count
as failed attempts (``"failure"``) or leave the denominator (``"drop"``).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxrobust.metrics.conventions import row_mask
from jaxrobust.metrics.rates import Rate, rate_of_rows

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

_MODES = ("any", "mean")
_INVALID = ("failure", "drop")


def _judgments(value: ArrayLike, name: str, ndim: int) -> Array:
  value = jnp.asarray(value)
  if value.ndim != ndim or value.dtype != jnp.bool_:
    axes = "[B]" if ndim == 1 else "[B, S]"
    raise ValueError(f"{name} must be a {axes} bool array, got shape {value.shape} and dtype "
                     f"{value.dtype}.")
  return value


def _check_invalid(invalid: str) -> None:
  if invalid not in _INVALID:
    raise ValueError(f"invalid must be one of {_INVALID}, got {invalid!r}.")


def _valid_judgments(valid: Optional[ArrayLike], shape: tuple[int, ...]) -> Array:
  """``valid`` as a bool array of ``shape`` (``[B]`` broadcast over samples); all ``True`` for
  ``None``."""
  if valid is None:
    return jnp.ones(shape, bool)
  valid = jnp.asarray(valid)
  if valid.dtype != jnp.bool_ or valid.shape not in (shape, shape[:1]):
    allowed = " or ".join(str(list(s)) for s in dict.fromkeys((shape, shape[:1])))
    raise ValueError(f"valid must be a bool array of shape {allowed}, got shape {valid.shape} "
                     f"and dtype {valid.dtype}.")
  if valid.shape != shape:
    valid = jnp.broadcast_to(valid[:, None], shape)
  return valid


def attack_success_rate_generative(judged_harmful: ArrayLike, mask: Optional[ArrayLike] = None,
                                   *, mode: str = "any", valid: Optional[ArrayLike] = None,
                                   invalid: str = "failure", behavior: Optional[ArrayLike] = None,
                                   num_behaviors: Optional[int] = None) -> Rate:
  r"""Jailbreak attack success rate over prompts, from per-completion harm judgments.

  With :math:`h_{is} \in \{0, 1\}` the judge's verdict on completion :math:`s` of prompt
  :math:`i` (``S`` completions sampled per prompt), :math:`v_{is}` whether that verdict is valid
  (``valid``) and :math:`m_i` the mask:

  * ``mode="any"`` (best-of-S, HarmBench's and GCG's ASR): a prompt succeeds when any completion
    is harmful; ``hits`` :math:`= \sum_i m_i \max_s v_{is} h_{is}`, ``total`` :math:`= \sum_i
    m_i` (``invalid="drop"``: :math:`\sum_i m_i \max_s v_{is}`, prompts with a valid verdict).
  * ``mode="mean"`` (the expected per-completion ASR): ``hits`` :math:`= \sum_i m_i \sum_s
    v_{is} h_{is}`, ``total`` :math:`= S \sum_i m_i` (``invalid="drop"``: :math:`\sum_i m_i
    \sum_s v_{is}`), so the rate is the mean over prompts of each prompt's fraction of harmful
    completions, kept as exact integer counts (mergeable, unlike a mean of means over batches of
    different sizes). Its interval treats the completions as independent trials; completions of
    one prompt are usually correlated, so it is narrower than an interval over prompts: use
    ``"any"`` (or one completion per prompt) when the uncertainty over prompts is what you report.

  **Invalid verdicts** (``valid = False``: the judge's output did not parse, the completion or
  the attack's prompt is missing) never count as hits. ``invalid="failure"`` keeps them in the
  denominator as failed attempts: HarmBench (a classifier answer other than yes/no gets label
  -1, which is not a success) and JailbreakBench (all 100 behaviours are the denominator; a
  behaviour without a submitted prompt or response is not jailbroken). ``invalid="drop"``
  removes them from the denominator: BIPIA, and InjecAgent's "ASR-valid" (its "ASR-all" is
  ``"failure"``). Padding is ``mask``'s job, never ``valid``'s.

  **Averaging.** With ``behavior`` (the behaviour id of each prompt, several prompts or test
  cases per behaviour), the returned :class:`Rate` holds ``[num_behaviors]`` per-behaviour sums;
  ``rate.compute(average="macro")`` is the mean over behaviours of each behaviour's rate,
  HarmBench's "average ASR", and ``average="micro"`` the pooled rate over prompts (GCG's and
  AdvBench's, equal to the macro one when every behaviour has the same number of prompts).

  Args:
    judged_harmful: ``[B, S]`` bool, ``S >= 1``.
    mask: optional ``[B]`` bool; ``False`` rows (padding prompts) are not counted.
    mode: ``"any"`` or ``"mean"`` (static).
    valid: optional ``[B, S]`` or ``[B]`` bool (``[B]``: for every completion of the prompt);
      ``None``: every verdict is valid.
    invalid: ``"failure"`` or ``"drop"`` (static), see above.
    behavior: optional ``[B]`` int behaviour ids in ``[0, num_behaviors)``.
    num_behaviors: the number of behaviours (static), with ``behavior``.

  Returns:
    A :class:`Rate` (``[num_behaviors]`` fields with ``behavior``).

  Raises:
    ValueError: for a wrong shape or dtype, ``S = 0``, an unknown ``mode`` or ``invalid``, or
      ``behavior`` without ``num_behaviors`` (or ids outside its range).

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> h = jnp.array([[True, False, False], [False, False, False], [True, True, False]])
    >>> r = metrics.attack_success_rate_generative(h)
    >>> int(r.hits), int(r.total)
    (2, 3)
    >>> r = metrics.attack_success_rate_generative(h, mode="mean")
    >>> int(r.hits), int(r.total)
    (3, 9)

    The second prompt's judge failed to parse: a failure (HarmBench) or dropped (InjecAgent's
    ASR-valid):

    >>> ok = jnp.array([True, False, True])
    >>> rates = [metrics.attack_success_rate_generative(h, valid=ok, invalid=invalid)
    ...          for invalid in ("failure", "drop")]
    >>> [(int(r.hits), int(r.total)) for r in rates]
    [(2, 3), (2, 2)]

  References:
    Zou, Wang, Carlini, Nasr, Kolter, Fredrikson, "Universal and transferable adversarial attacks
    on aligned language models", 2023.
    Mazeika et al., "HarmBench: a standardized evaluation framework for automated red teaming and
    robust refusal", ICML 2024.
    Chao et al., "JailbreakBench: an open robustness benchmark for jailbreaking large language
    models", NeurIPS 2024 Datasets and Benchmarks.
    Zhan et al., "InjecAgent: benchmarking indirect prompt injections in tool-integrated large
    language model agents", Findings of ACL 2024.
  """
  if mode not in _MODES:
    raise ValueError(f"mode must be one of {_MODES}, got {mode!r}.")
  _check_invalid(invalid)
  harmful = _judgments(judged_harmful, "judged_harmful", 2)
  batch, samples = harmful.shape
  if samples < 1:
    raise ValueError("judged_harmful needs at least one completion per prompt (S >= 1).")
  keep = row_mask(mask, batch)
  ok = _valid_judgments(valid, harmful.shape)
  counted = harmful & ok
  if mode == "any":
    hits = jnp.any(counted, axis=1) & keep
    trials = keep & jnp.any(ok, axis=1) if invalid == "drop" else keep
    return rate_of_rows(hits.astype(jnp.int32), trials.astype(jnp.int32), behavior,
                         num_behaviors)
  hits = jnp.sum(counted & keep[:, None], axis=1, dtype=jnp.int32)
  if invalid == "drop":
    trials = jnp.sum(ok & keep[:, None], axis=1, dtype=jnp.int32)
  else:
    trials = keep.astype(jnp.int32) * jnp.int32(samples)
  return rate_of_rows(hits, trials, behavior, num_behaviors)


def prompt_injection_rate(followed_injection: ArrayLike, mask: Optional[ArrayLike] = None, *,
                          valid: Optional[ArrayLike] = None, invalid: str = "failure") -> Rate:
  r"""Prompt-injection success rate: the fraction of inputs whose output follows the injected
  instruction, ``hits`` :math:`= \sum_i m_i v_i f_i` out of ``total`` :math:`= \sum_i m_i`
  (``invalid="drop"``: :math:`\sum_i m_i v_i`).

  ``valid`` marks the outputs the judge could evaluate; an invalid one is never a hit, and is
  either a failed injection (``invalid="failure"``, InjecAgent's "ASR-all") or left out of the
  denominator (``"drop"``: InjecAgent's "ASR-valid", which counts only outputs that follow the
  agent's format, and BIPIA).

  Args:
    followed_injection: ``[B]`` bool, the judge's verdict that the output carried out the
      injected instruction instead of (or besides) the user's task.
    mask: optional ``[B]`` bool for padded batches.
    valid: optional ``[B]`` bool, ``None``: all valid.
    invalid: ``"failure"`` or ``"drop"`` (static).

  Returns:
    A :class:`Rate`.

  Raises:
    ValueError: for a wrong shape or dtype, or an unknown ``invalid``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> r = metrics.prompt_injection_rate(jnp.array([True, False, False, False]))
    >>> int(r.hits), int(r.total)
    (1, 4)
    >>> r = metrics.prompt_injection_rate(jnp.array([True, False, False, False]),
    ...                                   valid=jnp.array([True, True, False, False]),
    ...                                   invalid="drop")
    >>> int(r.hits), int(r.total)
    (1, 2)

  References:
    Greshake et al., "Not what you've signed up for: compromising real-world LLM-integrated
    applications with indirect prompt injection", AISec 2023.
    Liu et al., "Formalizing and benchmarking prompt injection attacks and defenses", USENIX
    Security 2024.
    Yi et al., "Benchmarking and defending against indirect prompt injection attacks on large
    language models" (BIPIA), 2023.
    Zhan et al., "InjecAgent", Findings of ACL 2024.
  """
  _check_invalid(invalid)
  followed = _judgments(followed_injection, "followed_injection", 1)
  keep = row_mask(mask, followed.shape[0])
  ok = _valid_judgments(valid, followed.shape)
  trials = keep & ok if invalid == "drop" else keep
  return Rate.from_flags(followed & ok & trials, trials)


def paraphrase_consistency(answers: ArrayLike, mask: Optional[ArrayLike] = None) -> Rate:
  r"""The fraction of questions whose ``P`` paraphrases all receive the same answer.

  ``hits`` :math:`= \sum_i m_i [a_{i1} = a_{i2} = \dots = a_{iP}]`, ``total``
  :math:`= \sum_i m_i`, where :math:`a_{ip}` is the canonicalised answer id the model gave to
  paraphrase :math:`p` of question :math:`i`. Ids compare by equality only: a shared sentinel
  (e.g. ``-1`` for "unparseable") counts as the same answer, so give unparseable answers distinct
  ids (or mask the question) if they must not count as consistent. ``P = 1`` is trivially
  consistent.

  Args:
    answers: ``[B, P]`` int answer ids, ``P >= 1``.
    mask: optional ``[B]`` bool for padded batches.

  Returns:
    A :class:`Rate`.

  Raises:
    ValueError: if ``answers`` is not a ``[B, P]`` integer array with ``P >= 1``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import metrics
    >>> answers = jnp.array([[3, 3, 3], [1, 2, 1], [0, 0, 0]])
    >>> r = metrics.paraphrase_consistency(answers, mask=jnp.array([True, True, False]))
    >>> int(r.hits), int(r.total)
    (1, 2)

  References:
    Elazar et al., "Measuring and improving consistency in pretrained language models", TACL 2021.
  """
  answers = jnp.asarray(answers)
  if answers.ndim != 2 or not jnp.issubdtype(answers.dtype, jnp.integer):
    raise ValueError(f"answers must be a [B, P] integer array of answer ids, got shape "
                     f"{answers.shape} and dtype {answers.dtype}.")
  if answers.shape[1] < 1:
    raise ValueError("answers needs at least one paraphrase per question (P >= 1).")
  consistent = jnp.all(answers == answers[:, :1], axis=1)
  return Rate.from_flags(consistent, mask)

