r"""Judges of generated text: verdicts in {success, failure, unscored} from a JAX classifier of the
generated tokens, or from any Python function called on the host in batches.

Both return the verdict codes of :mod:`jaxrobust.metrics.judged` (:data:`~jaxrobust.metrics.
SUCCESS` 1, :data:`~jaxrobust.metrics.FAILURE` 0, :data:`~jaxrobust.metrics.UNSCORED` -1) with
the shape of the tokens less their last axis: ``[N]`` for ``[N, L]`` tokens, ``[B, k]`` for ``k``
samples per prompt (``[B, k, L]``), ready for :meth:`jaxrobust.metrics.JudgedRate.from_verdicts`.
A judge that cannot answer (a non-finite score, an exception, ``None``, an answer that is not a
verdict) gives ``UNSCORED``, never a failure.

* :func:`classifier_judge`: ``classify(tokens [N, L], *args) -> scores [N]``, any JAX function
  (a harm classifier's logit difference, a rule on token ids); ``score > threshold`` is a
  success, ``score <= threshold`` a failure, a non-finite score or one within ``abstain`` of the
  threshold unscored. Pure JAX: traceable, ``vmap``-able, ``threshold`` and ``abstain`` are data.
* :func:`host_judge`: ``judge_fn(items) -> answers``, a Python function over a list of up to
  ``batch_size`` items (token rows, or strings with ``decode``), e.g. a call to an external judge
  model or API, run through :func:`jax.pure_callback` so that it works inside ``jit`` and
  ``vmap``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._validation import check_positive_int, check_values
from jaxrobust.metrics.judged import FAILURE, SUCCESS, UNSCORED

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


def _check_tokens(tokens: ArrayLike) -> Array:
  tokens = jnp.asarray(tokens)
  if tokens.ndim not in (2, 3) or not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"tokens must be [N, L] or [B, k, L] integer token ids, got shape "
                     f"{tokens.shape} and dtype {tokens.dtype}.")
  return tokens


def classifier_judge(classify: Callable[..., Array], tokens: ArrayLike, *args: Any,
                     threshold: ArrayLike = 0.0, abstain: ArrayLike = 0.0) -> Array:
  r"""Verdicts from a JAX classifier of generated tokens: with :math:`s` the score of a response,
  :math:`t` the threshold and :math:`a` the abstention margin,

  .. math:: v = \begin{cases} \text{UNSCORED} & s \text{ not finite, or } |s - t| < a \\
            \text{SUCCESS} & s > t \\ \text{FAILURE} & s \le t. \end{cases}

  ``[B, k, L]`` tokens (``k`` samples per prompt) are judged as ``B k`` rows in one call.

  Args:
    classify: ``classify(tokens [N, L], *args) -> [N]`` float scores (e.g. the logit of
      "harmful" minus that of "harmless"; NaN where the classifier cannot judge).
    tokens: ``[N, L]`` or ``[B, k, L]`` integer token ids of the generated responses.
    *args: passed on to ``classify`` (its parameters: arguments, never closed over).
    threshold: :math:`t` (data: a new value does not recompile), not NaN.
    abstain: :math:`a \ge 0` (data), not NaN; 0 abstains only on non-finite scores.

  Returns:
    int32 verdicts ``[N]`` or ``[B, k]``.

  Raises:
    ValueError: for tokens of another rank or dtype, scores of another shape than ``[N]``, a
      concrete NaN ``threshold`` (every score would be a failure), or a concrete ``abstain``
      that is negative or NaN (inside ``jax.jit`` these values are not read).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jaxrobust import text
    >>> # A rule: the fraction of token 3 in the response, NaN when it starts with token 0.
    >>> rule = lambda t: jnp.where(t[:, 0] == 0, jnp.nan, jnp.mean(t == 3, axis=1))
    >>> tokens = jnp.array([[[3, 3, 1], [1, 1, 3]], [[0, 3, 3], [2, 2, 2]]])  # [B=2, k=2, L=3]
    >>> jax.jit(lambda t, th: text.classifier_judge(rule, t, threshold=th))(tokens, 0.5).tolist()
    [[1, 0], [-1, 0]]
  """
  tokens = _check_tokens(tokens)
  check_values("threshold", threshold,
               hint="A NaN threshold makes every finite score a failure: pass a number.")
  check_values("abstain", abstain, low=0.0,
               hint="abstain is the margin around the threshold within which a score is "
               "unscored: 0 abstains only on non-finite scores.")
  flat = tokens.reshape(-1, tokens.shape[-1])
  scores = jnp.asarray(classify(flat, *args))
  if scores.shape != flat.shape[:1]:
    raise ValueError(f"classify must return one score per response, shape {flat.shape[:1]}, "
                     f"got {scores.shape} (reduce class logits to a score first, e.g. "
                     "logits[:, 1] - logits[:, 0]).")
  scores = scores.astype(jnp.float32)
  threshold = jnp.asarray(threshold, jnp.float32)
  abstain = jnp.asarray(abstain, jnp.float32)
  unscored = ~jnp.isfinite(scores) | (jnp.abs(scores - threshold) < abstain)
  verdicts = jnp.where(unscored, UNSCORED, jnp.where(scores > threshold, SUCCESS, FAILURE))
  return verdicts.astype(jnp.int32).reshape(tokens.shape[:-1])


def parse_verdict(answer: Any) -> int:
  """One host answer as a verdict code: ``True`` / ``1`` -> SUCCESS, ``False`` / ``0`` ->
  FAILURE; anything else (``None``, ``-1``, a string, a float, an exception object) -> UNSCORED.

  A NumPy scalar (``np.bool_``, ``np.int64``) or a 0-d array of a bool or integer dtype (NumPy's
  ``np.array(True)``, a JAX scalar array) counts as the Python value it holds; a float stays
  unscored in every form (``1.0`` is a score, not a verdict: threshold it in the judge).

  Examples:
    >>> import numpy as np
    >>> from jaxrobust.text._judge import parse_verdict
    >>> [parse_verdict(a) for a in (True, 0, None, "yes", 2, float("nan"))]
    [1, 0, -1, -1, -1, -1]
    >>> [parse_verdict(a) for a in (np.bool_(True), np.array(False), np.int64(1), np.array(1.0))]
    [1, 0, 1, -1]
  """
  if not isinstance(answer, (bool, int, np.generic)) and getattr(answer, "shape", None) == ():
    try:  # a 0-d array (NumPy, JAX): its value, if its dtype is bool or integer
      kind = np.dtype(answer.dtype).kind
    except (AttributeError, TypeError):  # no dtype NumPy knows (e.g. another framework's)
      return UNSCORED
    if kind not in "biu":
      return UNSCORED
    answer = np.asarray(answer).item()
  if isinstance(answer, (bool, np.bool_)):
    return SUCCESS if answer else FAILURE
  if isinstance(answer, (int, np.integer)) and int(answer) in (SUCCESS, FAILURE):
    return int(answer)
  return UNSCORED


_ACCEPTED_ANSWERS = ("True / False or 1 / 0 (Python values, NumPy scalars, or 0-d bool or integer "
                    "arrays)")
"""What :func:`parse_verdict` reads as a verdict, for messages."""


def _host_verdicts(judge_fn, decode, batch_size, tokens: np.ndarray) -> np.ndarray:
  """The host side of :func:`host_judge`: ``judge_fn`` on consecutive batches of rows. When every
  answer the judge returned (in the batches that did not fail as a whole) is unscored, one
  ``UserWarning`` says so: usually answers of a type :func:`parse_verdict` does not read."""
  tokens = np.asarray(tokens)
  flat = tokens.reshape(-1, tokens.shape[-1])
  verdicts = np.full(flat.shape[0], UNSCORED, np.int32)
  answered, scored, kinds = 0, False, set()
  for start in range(0, flat.shape[0], batch_size):
    rows = flat[start:start + batch_size]
    try:
      items = [decode(row) for row in rows] if decode is not None else list(rows)
      answers = list(judge_fn(items))
    except Exception as error:  # noqa: BLE001 - an external judge's failure is "unscored"
      warnings.warn(f"host_judge: the judge raised {type(error).__name__}: {error}; the "
                    f"{len(rows)} responses of this batch are unscored.", RuntimeWarning)
      continue
    if len(answers) != len(rows):
      warnings.warn(f"host_judge: the judge returned {len(answers)} answers for {len(rows)} "
                    "responses; the batch is unscored.", RuntimeWarning)
      continue
    parsed = [parse_verdict(a) for a in answers]
    verdicts[start:start + len(rows)] = parsed
    answered += len(parsed)
    scored = scored or any(v != UNSCORED for v in parsed)
    kinds.update(type(a).__name__ for a in answers)
  if answered and not scored:
    warnings.warn(f"host_judge: every one of the {answered} answers of the judge was unscored "
                  f"(answers of type {', '.join(sorted(kinds))}). A verdict is "
                  f"{_ACCEPTED_ANSWERS}; anything else (None, a string, a float such as 1.0 or a "
                  "score) is unscored: make the judge return bools, e.g. bool(score > 0.5).",
                  UserWarning, stacklevel=2)
  return verdicts.reshape(tokens.shape[:-1])


def host_judge(judge_fn: Callable[[list], Any], tokens: ArrayLike, *, batch_size: int,
               decode: Optional[Callable[[np.ndarray], Any]] = None) -> Array:
  r"""Verdicts from a Python judge run on the host (an external classifier, an LLM judge, an API),
  called in batches through :func:`jax.pure_callback`, so usable inside ``jit`` and ``vmap``.

  The responses (``[N, L]`` or ``[B, k, L]`` token rows, flattened in order) are cut into
  consecutive batches of at most ``batch_size``; each batch's items (the token rows as NumPy
  arrays, or ``decode(row)``, e.g. a tokenizer's decode) go to ``judge_fn(items)``, which
  returns one answer per item, parsed by :func:`parse_verdict`: ``True`` / ``1`` success,
  ``False`` / ``0`` failure (NumPy scalars and 0-d bool or integer arrays as the values they
  hold), anything else (``None``, an unparsed string, a float) unscored. A batch whose call (or
  decoding) raises, or that returns another number of answers, is unscored as a whole, with a
  ``RuntimeWarning``: a judge's failure never becomes a "not jailbroken". When every answer of a
  call is unscored, a ``UserWarning`` (once per call) names the answers' types: usually the
  judge returns something :func:`parse_verdict` does not read (e.g. float scores).

  As any ``pure_callback``, the call may be skipped when its result is unused, or repeated
  (e.g. under ``vmap`` once per mapped row); use a deterministic judge (temperature 0, cached)
  when repeated answers must agree.

  Args:
    judge_fn: ``judge_fn(items: list) -> sequence of answers``, one per item.
    tokens: ``[N, L]`` or ``[B, k, L]`` integer token ids of the generated responses.
    batch_size: the most items per call (static), e.g. the judge's batch size.
    decode: optional ``decode(row [L] numpy ints) -> item`` (static), e.g. to text.

  Returns:
    int32 verdicts ``[N]`` or ``[B, k]``.

  Raises:
    ValueError: for tokens of another rank or dtype, or a ``batch_size`` below 1.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jaxrobust import text
    >>> calls = []
    >>> def judge(items):  # a rule on the token rows: 3 present -> success, 9 -> cannot tell
    ...   calls.append(len(items))
    ...   return [None if 9 in row else bool(3 in row) for row in items]
    >>> tokens = jnp.array([[3, 1], [1, 1], [9, 3], [2, 2], [3, 3]])
    >>> jax.jit(lambda t: text.host_judge(judge, t, batch_size=2))(tokens).tolist(), calls
    ([1, 0, -1, 0, 1], [2, 2, 1])
  """
  tokens = _check_tokens(tokens)
  batch_size = check_positive_int("batch_size", batch_size)
  host = functools.partial(_host_verdicts, judge_fn, decode, batch_size)
  shape = jax.ShapeDtypeStruct(tokens.shape[:-1], jnp.int32)
  return jax.pure_callback(host, shape, tokens, vmap_method="expand_dims")
