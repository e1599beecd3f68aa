r"""Gradient-guided greedy word substitution (HotFlip-style) against text classifiers.

The threat model: each position :math:`i` of a token sequence :math:`x^0` may take its original
token or one of that token's listed substitutes, :math:`x_i \in \mathcal S_i = \{x^0_i\} \cup
\{c_{x^0_i, k} : c_{x^0_i, k} \ge 0\}` (``candidates [V, K]``, e.g. synonyms), only at
``editable`` positions, and at most ``max_swaps`` positions may differ from :math:`x^0` (the L0
distance over positions). The search maximises an attack loss :math:`\ell` (``"margin"``:
:math:`\max_{j \ne y} z_j - z_y`, positive iff misclassified; ``"ce"``: the cross-entropy) of
``logits_fn(E[x])`` with ``E`` the embedding table.
"""

from __future__ import annotations

from typing import Callable, Union

import jax
import jax.numpy as jnp

from jaxrobust import losses
from jaxrobust._batch import as_keys, is_correct, like_batch, per_example, rows_like
from jaxrobust._validation import (check_label_shape, check_labels, check_logits,
                                   check_positive_int, logits_shape)
from jaxrobust.attacks._config import recorded
from jaxrobust.text import _checks
from jaxrobust.text._search import (candidate_rows, first_near_best, lookup, substitutes,
                                    tolerance)
from jaxrobust.text._types import Result, WordSwap

Array = jax.Array


@recorded
def word_swap(*, steps: int = 8, search_width: int = 16,
              loss: Union[str, Callable[..., Array]] = "margin") -> WordSwap:
  r"""Static configuration of the gradient-guided greedy word-swap attack.

  Each of ``steps`` greedy steps takes one backward pass through the model at the current tokens
  :math:`x` to get :math:`g_i = \partial \ell / \partial e_i` (``[B, L, D]``, :math:`e_i =
  E[x_i]`), estimates the change of the loss of every allowed move (position :math:`i`, token
  :math:`t \in \mathcal S_i`, :math:`t \ne x_i`) to first order,

  .. math:: \Delta_{i,t} \approx (E[t] - E[x_i]) \cdot g_i,

  re-scores the ``search_width`` best moves exactly with forward passes, and keeps the best one
  if it succeeds or increases the loss (HotFlip, Ebrahimi et al. 2018, with TextAttack's exact
  re-scoring of the shortlist). Run it with :func:`jaxrobust.text.run`.

  Args:
    steps: the number of greedy steps (static); each changes at most one position, so it also
      bounds the swap budget ``max_swaps``.
    search_width: the number of candidate moves re-scored exactly per step and example.
    loss: ``"margin"`` (default; Carlini–Wagner, :math:`\max_{j \ne y} z_j - z_y`, maximised, so
      :math:`z_y - \max_{j \ne y} z_j` is driven below 0), ``"ce"``, ``"dlr"`` or a function
      ``(logits [B, C], labels [B]) -> [B]``, larger meaning more adversarial.

  Returns:
    A hashable :class:`jaxrobust.text.WordSwap` whose ``config`` records this call.

  Raises:
    ValueError: ``steps`` or ``search_width`` not a positive int, or an unknown loss.

  Examples:
    >>> from jaxrobust import text
    >>> attack = text.word_swap(steps=4)
    >>> attack.steps, attack.search_width, attack.loss
    (4, 16, 'margin')

  References:
    J. Ebrahimi, A. Rao, D. Lowd, D. Dou. HotFlip: White-box adversarial examples for text
    classification. ACL 2018.
    J. Morris et al. TextAttack: A framework for adversarial attacks, data augmentation, and
    adversarial training in NLP. EMNLP 2020 (demos).
  """
  steps = check_positive_int("steps", steps)
  search_width = check_positive_int("search_width", search_width)
  losses.resolve(loss, targeted=False)  # raises for an unknown name
  label = loss if isinstance(loss, str) else getattr(loss, "__name__", "custom")
  return WordSwap(steps=steps, search_width=search_width, loss=loss,
                  name=f"word_swap-{steps}x{search_width}-{label}")


def run(attack: WordSwap, logits_fn: Callable[[Array], Array], embedding: Array, tokens: Array,
        y: Array, key: Array, *, candidates: Array, max_swaps: Union[int, Array],
        editable: Array | None = None) -> Result:
  r"""Runs the greedy word-swap attack on a batch of token sequences.

  **Search.** A fixed-length ``lax.scan`` of ``attack.steps`` steps with per-example masks (a
  finished row stops changing and stops costing queries). Each step of a row that is still
  searching: one backward pass gives :math:`g = \partial \ell / \partial E[x]` ``[B, L, D]``; all
  allowed moves :math:`(i, t)` are ranked by :math:`(E[t] - E[x_i]) \cdot g_i`; the best
  ``search_width`` are evaluated exactly in one batched forward pass of ``[B * W]`` rows; the
  chosen move is the successful one with the fewest changed positions (then the largest loss),
  else the one with the largest loss. It is kept when it succeeds or increases the loss; the row
  stops when it succeeds (so the FIRST success is returned, with the fewest swaps the greedy search
  reached), when no move improves (the greedy search has converged: repeating the step would give
  the same moves), or when the chosen move would change more than ``max_swaps`` positions.

  **Conventions.**

  * *Substitutes* come from the ORIGINAL token at each position, ``candidates[tokens[b, i]]``
    (synonyms of the original word, as TextAttack's word-swap transformations do), never from the
    current one, so a chain of swaps cannot drift away from the original meaning.
  * *Revisiting*: a changed position may change again, to another substitute of its original
    token or back to the original token itself (which lowers the swap count); ``swaps`` counts
    positions that differ from ``tokens``, so a revisited position counts once.
  * *Budget*: the ranking and choice of a move never look at ``max_swaps``; a row whose chosen
    move would exceed its budget stops there (unsuccessful). A run at budget ``k`` therefore
    follows the same path as a run at ``steps`` up to that point, so whatever it breaks the long
    run breaks too, at the same step with the same tokens. The converse holds unless a revisit
    lowers the count: the long run may pass through more than ``k`` swaps and then break the row
    with at most ``k`` (4 swaps, then one position put back: broken with 3), where the run at
    ``k`` stopped. :func:`jaxrobust.text.swap_curve` counts such a row as broken at ``k``, a
    genuine ``k``-swap adversarial text, so the curve from one run at ``max_swaps = steps`` is
    never weaker than separate runs at each budget, and equal to them when no row's path lowers
    its swap count (TextFooler never revisits a position: always equal).
  * *Ties* are broken by index, never by a random draw: equal first-order scores by position,
    then slot of the substitute list; exact losses within a relative ``1e-5`` of each other (the
    same sum rounds differently in different batch layouts) count as equal, and the move with the
    better first-order rank wins; a move must beat the current loss by more than that to count
    as an improvement. So a row's result does not depend on its place in the batch, on the batch
    size or on the device count. ``key`` is validated but the search is deterministic.
  * *Queries* (model evaluations per row, the number TextAttack reports): 1 for the clean input,
    plus per step of a searching row 1 for the gradient pass (it includes a forward pass; skipped
    when the row has no move left) and 1 per exactly re-scored move (at most ``search_width``;
    fewer when fewer moves are allowed). A row at ``max_swaps = 0`` does not search (1 query).
    TextAttack's ``num_queries`` counts the goal function's forward calls only, and its cache
    counts a repeated text once; its count for the same search is ours minus the gradient
    passes, at most. The final forward pass on ``tokens_adv`` re-checks
    a text already queried and is not counted.

  *Memory*: the substitutes' embeddings, ``B * L * (K + 1) * D`` float32 values, are gathered
  once; each step's re-scoring pass runs the model on ``B * search_width`` sequences.

  Points misclassified on the clean input are returned unchanged with ``success = True``,
  ``swaps = 0``. ``success`` and ``logits`` always come from one more forward pass on
  ``tokens_adv``: ``success = argmax logits != y`` (non-finite logits count as a success).

  Args:
    attack: from :func:`jaxrobust.text.word_swap`.
    logits_fn: ``embeds [B, L, D] -> logits [B, C]``, the model after its embedding look-up; rows
      must be independent (eval mode).
    embedding: ``[V, D]`` float embedding table (``embeds = embedding[tokens]``).
    tokens: ``[B, L]`` int token ids in ``[0, V)``.
    y: ``[B]`` int labels in ``[0, C)``.
    key: a PRNG key (or one per example, ``[B]``); see *Ties*.
    candidates: ``[V, K]`` int substitutes of each token id, ``-1`` padding.
    max_swaps: int scalar or ``[B]``, the largest number of positions that may change; data (a new
      budget does not recompile), ``0 <= max_swaps <= attack.steps``.
    editable: ``[B, L]`` bool positions that may change (default: all). A row without editable
      positions is returned unchanged; an all-``False`` mask raises.

  Returns:
    A :class:`jaxrobust.text.Result`.

  Raises:
    TypeError: float tokens or candidates, a non-bool ``editable``, a float ``max_swaps``.
    ValueError: token ids outside ``[0, V)``, candidate ids outside ``[-1, V)``, candidates not
      ``[V, K]``, labels outside ``[0, C)``, ``max_swaps`` outside ``[0, steps]``, an empty
      editable mask, mismatched shapes, a ``logits_fn`` that fails on the ``[B * W]`` rows the
      search scores (a closed-over per-example mask). Values are checked only on concrete inputs
      (not inside a user's ``jit``): call :func:`check_inputs` once on the host if they may be
      wrong.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jaxrobust import text
    >>> embedding = jnp.array([[1.0], [0.5], [-1.0], [0.0]])  # token 2 is "negative"
    >>> logits_fn = lambda e: jnp.concatenate([-e.sum((1, 2))[:, None], e.sum((1, 2))[:, None]], 1)
    >>> candidates = jnp.array([[2, 3], [2, -1], [-1, -1], [-1, -1]])  # substitutes per token
    >>> tokens, y = jnp.array([[0, 1, 0]]), jnp.array([1])  # sum 2.5 > 0: class 1, correct
    >>> run = jax.jit(lambda tokens, y, key: text.run(
    ...     text.word_swap(steps=3), logits_fn, embedding, tokens, y, key, candidates=candidates,
    ...     max_swaps=3))
    >>> result = run(tokens, y, jax.random.key(0))
    >>> result.tokens_adv.tolist(), result.success.tolist(), result.swaps.tolist()
    ([[2, 1, 2]], [True], [2])

  References:
    J. Ebrahimi, A. Rao, D. Lowd, D. Dou. HotFlip: White-box adversarial examples for text
    classification. ACL 2018.
    M. Alzantot et al. Generating natural language adversarial examples. EMNLP 2018.
    J. Morris et al. TextAttack: A framework for adversarial attacks, data augmentation, and
    adversarial training in NLP. EMNLP 2020 (demos).
  """
  editable = check_inputs(attack, logits_fn, embedding, tokens, y, candidates=candidates,
                          max_swaps=max_swaps, editable=editable)
  as_keys(key, tokens.shape[0])  # validates the key; the search itself is deterministic
  embedding, y, candidates = jnp.asarray(embedding), jnp.asarray(y), jnp.asarray(candidates)
  tokens, editable = jnp.asarray(tokens).astype(jnp.int32), jnp.asarray(editable)
  budget = like_batch(per_example(max_swaps, tokens.shape[0], jnp.int32), tokens)
  loss_fn = losses.resolve(attack.loss, targeted=False)
  tokens_adv, queries = _search(attack, logits_fn, loss_fn, embedding, tokens, y, candidates,
                                budget, editable)
  logits = logits_fn(lookup(embedding, tokens_adv))
  return Result(tokens_adv=tokens_adv, success=~is_correct(logits, y),
                swaps=jnp.sum(tokens_adv != tokens, axis=1, dtype=jnp.int32), logits=logits,
                queries=queries, max_swaps=budget)


def check_inputs(attack: WordSwap, logits_fn: Callable[[Array], Array], embedding: Array,
                 tokens: Array, y: Array, *, candidates: Array, max_swaps: Union[int, Array],
                 editable: Array | None = None) -> Array:
  """Validates the inputs of :func:`run` (which calls it); returns the editable mask (default:
  all ``True``).

  Shapes and dtypes are always checked; values (token and candidate ids, labels, budgets, an
  empty mask) only on concrete arrays, so inside a user's ``jax.jit`` call this once on the host
  first if the data may be wrong (out-of-range ids would otherwise be clamped by the look-up).

  Raises:
    TypeError, ValueError: as listed in :func:`run`.

  Examples:
    >>> import jax.numpy as jnp
    >>> from jaxrobust import text
    >>> candidates = jnp.array([[1], [2], [-1]])
    >>> text.check_inputs(text.word_swap(steps=2), lambda e: e.sum(1), jnp.zeros((3, 2)),
    ...                   jnp.array([[0, 1]]), jnp.array([0]), candidates=candidates,
    ...                   max_swaps=3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: max_swaps must lie in [0, steps] = [0, 2] ...; got min 3, max 3. Build the ...
  """
  if not isinstance(attack, WordSwap):
    raise TypeError(f"attack must come from jr.text.word_swap(...), got {type(attack).__name__}.")
  vocab_size, dim = _checks.check_embedding(embedding)
  _checks.check_token_ids("tokens", tokens, vocab_size)
  _checks.check_token_ids("candidates", candidates, vocab_size, allow_padding=True)
  if candidates.shape[0] != vocab_size:
    raise ValueError(f"candidates must be [V, K] with one row per token id of the embedding "
                     f"table (V = {vocab_size}), got shape {candidates.shape}.")
  batch, length = tokens.shape
  spec = jax.ShapeDtypeStruct((batch, length, dim), embedding.dtype)
  num_classes = check_logits(logits_shape(logits_fn, spec), batch)
  rows = batch * _width(attack, length, 1 + int(candidates.shape[1]))  # what each step re-scores
  _checks.check_any_row_count(logits_fn, spec, rows, "the word swap")
  if isinstance(attack.loss, str) and num_classes < losses.MIN_CLASSES[attack.loss]:
    raise ValueError(f"loss={attack.loss!r} needs at least {losses.MIN_CLASSES[attack.loss]} "
                     f"classes; the model has {num_classes}.")
  check_label_shape("y", y, batch, f"tokens has {batch} rows")
  check_labels("y", y, num_classes)
  _checks.check_max_swaps(max_swaps, batch, attack.steps)
  if editable is None:
    return jnp.ones_like(tokens, dtype=bool)
  _checks.check_editable(editable, tokens.shape)
  return editable


def _width(attack: WordSwap, length: int, slots: int) -> int:
  """Moves re-scored per example and step: ``search_width``, at most the ``length * slots`` moves
  there are (``slots``: the original token and its ``K`` substitutes, see ``substitutes``)."""
  return min(attack.search_width, length * slots)


def _search(attack: WordSwap, logits_fn, loss_fn, embedding: Array, tokens: Array, y: Array,
            candidates: Array, budget: Array, editable: Array) -> tuple[Array, Array]:
  """The greedy search; returns ``(tokens_adv [B, L], queries [B])``."""
  values, valid = substitutes(tokens, candidates, editable)  # [B, L, S]
  batch, length, slots = values.shape
  width = _width(attack, length, slots)
  value_embeds = lookup(embedding, values).astype(jnp.float32)  # [B, L, S, D], fixed throughout
  # Row b * W + w of a re-scoring pass belongs to example b (broadcast, not jnp.repeat, so the
  # batch sharding carries over to the [B * W] rows).
  labels = jnp.broadcast_to(y[:, None], (batch, width)).reshape(batch * width)

  def loss_and_grad(current):
    def total(embeds):
      per_row = loss_fn(logits_fn(embeds), y).astype(jnp.float32)
      return jnp.sum(per_row), per_row
    return jax.grad(total, has_aux=True)(lookup(embedding, current))

  def step(carry, _):
    current, loss, searching, queries = carry
    grad, _ = loss_and_grad(current)
    grad = grad.astype(jnp.float32)
    here = jnp.einsum("bld,bld->bl", lookup(embedding, current).astype(jnp.float32), grad)
    gain = jnp.einsum("blsd,bld->bls", value_embeds, grad) - here[..., None]
    movable = (valid & (values != current[..., None])).reshape(batch, -1)
    # An allowed move with a non-finite estimate still ranks above every forbidden one.
    lowest = jnp.finfo(jnp.float32).min
    score = jnp.where(movable, jnp.nan_to_num(gain.reshape(batch, -1), nan=lowest,
                                              neginf=lowest), -jnp.inf)
    _, index = jax.lax.top_k(score, width)  # equal scores: lower index first
    usable = jnp.take_along_axis(movable, index, axis=1) & searching[:, None]  # [B, W]
    position = index // slots
    new_token = jnp.take_along_axis(values.reshape(batch, -1), index, axis=1)
    rows = candidate_rows(current, position, new_token)  # [B, W, L]
    logits = logits_fn(lookup(embedding, rows.reshape(batch * width, length)))
    row_loss = loss_fn(logits, labels).astype(jnp.float32).reshape(batch, width)
    row_loss = jnp.where(usable, jnp.nan_to_num(row_loss, nan=lowest, neginf=lowest), -jnp.inf)
    row_success = ~is_correct(logits, labels).reshape(batch, width) & usable
    row_swaps = jnp.sum(rows != tokens[:, None, :], axis=2, dtype=jnp.int32)
    chosen = _choose(row_loss, row_success, row_swaps, usable)
    pick = lambda a: jnp.take_along_axis(a, chosen[:, None], axis=1)[:, 0]
    succeeded = pick(row_success)
    improves = succeeded | (pick(row_loss) > loss + tolerance(loss))
    accept = searching & pick(usable) & improves & (pick(row_swaps) <= budget)
    current = jnp.where(accept[:, None], jnp.take_along_axis(
        rows, chosen[:, None, None], axis=1)[:, 0], current)
    loss = jnp.where(accept, pick(row_loss), loss)
    spent = jnp.any(movable, axis=1).astype(jnp.int32) + jnp.sum(usable, axis=1, dtype=jnp.int32)
    queries = queries + jnp.where(searching, spent, 0)
    return (current, loss, accept & ~succeeded, queries), None

  clean_logits = logits_fn(lookup(embedding, tokens))
  clean_loss = loss_fn(clean_logits, y).astype(jnp.float32)
  searching = is_correct(clean_logits, y) & (budget > 0)  # budget 0: no move can be kept
  queries = rows_like(tokens, 1, jnp.int32)
  (current, _, _, queries), _ = jax.lax.scan(step, (tokens, clean_loss, searching, queries), None,
                                             length=attack.steps)
  return current, queries


def _choose(row_loss: Array, row_success: Array, row_swaps: Array, usable: Array) -> Array:
  """``[B]`` index of the chosen re-scored move: among successful ones the fewest swaps, then the
  largest loss; if none succeeded, the largest loss. Losses within the tie tolerance count as
  equal, and ties go to the lower index (the better first-order rank)."""
  big = jnp.iinfo(jnp.int32).max
  fewest = jnp.min(jnp.where(row_success, row_swaps, big), axis=1, keepdims=True)
  best_success = first_near_best(row_loss, row_success & (row_swaps == fewest))
  best_loss = first_near_best(row_loss, usable)
  return jnp.where(jnp.any(row_success, axis=1), best_success, best_loss).astype(jnp.int32)
