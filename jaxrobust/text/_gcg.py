r"""Greedy Coordinate Gradient (GCG, Zou et al. 2023): an adversarial suffix for a causal LM.

The attacked sequence is ``prompt + suffix + after_suffix + target`` (teacher forcing; an empty
``after_suffix`` unless given, e.g. a chat template's end-of-turn and assistant header). With
:math:`x` the whole sequence, :math:`s` the suffix, :math:`t_{1..T}` the target and :math:`p_j`
the position just before :math:`t_j`, the loss is the mean cross-entropy of the target tokens,

.. math:: \mathcal L(s) = -\frac1T \sum_{j=1}^{T} \log \operatorname{softmax}(f(x)_{p_j})_{t_j},

and the attack minimises it over suffixes of ``suffix_length`` tokens drawn from the ``allowed``
vocabulary. One step, for each example:

1. **Token gradient.** With :math:`e_i = E^\top \mathbb 1_{s_i}` the suffix embeddings
   (:math:`E` the ``[V, D]`` table), the gradient of :math:`\mathcal L` with respect to the
   one-hot indicators is :math:`G = (\partial\mathcal L / \partial e)\, E^\top`, ``[S, V]``;
   :math:`-G_{iv}` is the first-order decrease of the loss when position :math:`i` takes token
   :math:`v`.
2. **Top-k.** Per position, the ``topk`` allowed tokens with the largest :math:`-G_{iv}`
   (disallowed tokens are never ranked; when fewer than ``topk`` tokens are allowed, all of them).
3. **Candidates.** ``search_width`` copies of the current suffix, each with ``n_replace``
   distinct positions drawn uniformly and each of those set to a uniform draw from its top-k.
4. **Exact re-scoring.** The loss of every candidate by forward passes (``chunk_size`` candidates
   per example at a time, so memory is that of ``B * chunk_size`` sequences). With ``dedupe``
   (the default) each distinct candidate is scored once and its draws share its loss: at most
   ``comb(S, n_replace) * topk ** n_replace`` candidates are distinct (``S * topk`` for
   ``n_replace=1``), so when that is below ``search_width`` a step scores that many rows
   instead (``GCG.scored_rows``; :mod:`jaxrobust.text._gcg_distinct`), with the same results
   up to float rounding (see :func:`gcg`'s ``dedupe``). In chunks, the distinct candidates come
   first and the chunks past the last one of every example are skipped (``lax.cond``), so the
   repeats are saved whatever the bound: 512 draws among ``20 * 32 = 640`` possible candidates
   are about 352 distinct ones, 3 chunks of 128 instead of 4.
5. **Move.** The current suffix becomes the candidate of lowest loss, even when that is worse
   than the current one (Zou et al.'s Algorithm 1 and nanoGCG without a buffer).

The returned suffix is the best one seen, counting the initial suffix and every candidate of
every step, ranked first by success, then by loss (as ``jr.run`` ranks adversarial points): a
suffix that made the model emit the target is never dropped for one of lower loss that does not
(that would be a "silent success", Pintor et al. 2022). ``loss`` and ``success`` are recomputed
on it.

**Success = greedy decoding reproduces the target.** Teacher forcing scores every target position
in one forward pass; ``success`` is ``argmax f(x)_{p_j} = t_j`` for every ``j`` (finite logits,
ties to the lowest id as ``jnp.argmax``). This equals greedy decoding: greedy step 1 sees exactly
the teacher-forced context ``prompt + suffix + after_suffix``, so it emits ``t_1`` iff the
teacher-forced argmax at :math:`p_1` is ``t_1``; if it did, the context of greedy step 2 is
``... + t_1``, again exactly the teacher-forced one, and so on by induction. Conversely at the
first mismatch :math:`j` greedy decoding has seen the teacher-forced context and emits the
mismatching argmax. (A decoder with a KV cache in low precision may round differently.)

**Conventions vs nanoGCG** (GraySwanAI/nanoGCG, defaults ``num_steps=250, search_width=512,
topk=256, n_replace=1``, which :func:`gcg` keeps):

* The initial suffix: nanoGCG tokenizes ``"x x x ... x"`` (20 x's). Here there is no tokenizer:
  ``init_suffix`` is a token id repeated (pass your tokenizer's id of ``" x"`` for nanoGCG's
  start), a ``[S]`` or ``[B, S]`` array, or by default uniform random allowed tokens drawn from
  each example's key.
* nanoGCG returns the lowest-loss step's candidate and never its initial string; here the
  initial suffix competes too and success ranks before loss (see above).
* nanoGCG's ``early_stop`` ends the run when a candidate matches the target under argmax; here
  (``early_stop=True``) an example whose best suffix succeeds stops changing, and once every
  example of the batch has, the remaining steps are skipped (``lax.cond``); the scan keeps its
  fixed length.
* nanoGCG's ``allow_non_ascii=False`` and ``filter_ids=True`` (drop candidates that change when
  decoded and re-tokenized) need a tokenizer: build ``allowed`` from your tokenizer (exclude
  special, non-ASCII and non-round-tripping tokens). nanoGCG ranks a disallowed token last
  (gradient ``+inf``), so with ``topk`` above the allowed count it can still sample one; here
  never.
* nanoGCG's ``use_prefix_cache`` (its default): give ``prefix_fn`` (below). Without it,
  ``lm_logits_fn`` sees whole sequences and the prompt is recomputed in every pass.
* Not implemented: nanoGCG's attack buffer (``buffer_size > 0``), mellowmax loss and probe
  sampling.

**Prefix cache.** The prompt comes first and never changes, so a causal model's keys and values
on it (the state every later position attends to) are the same in every pass. With
``prefix_fn`` the model is given in two parts: ``prefix_fn(prompt_embeds [B, P, D]) -> cache``
(any pytree of ``[B, ...]`` arrays, one row per prompt), computed once per call before the
search, and ``lm_logits_fn(embeds [N, L', D], cache) -> [N, L', V']`` for the
``L' = S + A + T`` tokens after the prompt, at positions ``P .. P + L' - 1``. Each prompt's
``N`` rows (its candidates, or the current suffix for the gradient) are scored in one call whose
``cache`` is that prompt's alone, with a leading axis of 1: the library ``vmap``-s over prompts
and never copies a cache ``search_width`` times; the model broadcasts it, by
``jnp.broadcast_to`` (simplest) or by attending to the shared keys with an ``einsum`` that has
no row axis (no copies). Chunks of candidates (``chunk_size``) reuse the same cache. Losses
equal the uncached ones up to float rounding (a different order of the same sums), and so do
the suffixes unless two candidates' losses tie to within that rounding. The gradient pass sees
the cache as a constant (no gradient flows to the prompt; none is needed).

The ``jaxrobust.demo`` language model implements both parts
(``TinyCausalLM.prefix_cache`` and ``TinyCausalLM.logits_after_prefix``).

**Randomness.** Example ``i`` uses key ``keys[i]`` (``fold_in(key, i)`` for a single key, or a
given ``[B]`` array of keys): its initial suffix from one half of ``split(keys[i])``, step ``t``'s
draws from ``fold_in`` of the other half with ``t``. So results do not depend on the example's
batch neighbours, and a longer run repeats a shorter one's steps first (more steps never return
a worse suffix).

**Plugging in a real JAX LLM.** GCG needs the model as a function of input embeddings and its
token-embedding table. For a Flax NNX decoder (names follow Flax's Gemma example; adapt them to
your model) replace the embedding lookup by the embeddings given::

  table = model.embedder.input_embedding[...]                      # [V, D]

  def lm_logits_fn(embeds):                                        # [B, L, D] -> [B, L, V]
    h = embeds * jnp.sqrt(embeds.shape[-1]).astype(embeds.dtype)   # what the lookup also did
    positions = jnp.broadcast_to(jnp.arange(embeds.shape[1]), embeds.shape[:2])
    causal = jnp.tril(jnp.ones((embeds.shape[1],) * 2, bool))[None]
    for layer in model.layers:
      _, h = layer(h, positions, None, causal)
    return model.embedder.decode(model.final_norm(h))

  attack = jr.text.gcg(steps=250, search_width=512, topk=256)
  result = jax.jit(functools.partial(jr.text.run_gcg, attack, lm_logits_fn))(
      table, prompt_ids, target_ids, jax.random.key(0), allowed=allowed,
      after_suffix=template_ids, context_length=8192)

With a key/value cache, split the layers' attention into the prompt's part, run once, and the
rest (a sketch: the attention call with an external cache is model-specific; adapt it)::

  def prefix_fn(prompt_embeds):                                   # [B, P, D] -> cache
    h = prompt_embeds * jnp.sqrt(prompt_embeds.shape[-1]).astype(prompt_embeds.dtype)
    positions = jnp.broadcast_to(jnp.arange(h.shape[1]), h.shape[:2])
    cache = []
    for layer in model.layers:                                    # keys/values [B, P, K, H]
      keys, values, h = layer_with_kv(layer, h, positions, causal_mask(h.shape[1]))
      cache.append((keys, values))
    return cache

  def lm_logits_fn(embeds, cache):                                # [N, L', D], leading axis 1
    h = embeds * jnp.sqrt(embeds.shape[-1]).astype(embeds.dtype)
    start = cache[0][0].shape[1]                                  # P: positions continue
    positions = jnp.broadcast_to(start + jnp.arange(h.shape[1]), h.shape[:2])
    for layer, (keys, values) in zip(model.layers, cache):
      keys, values = (jnp.broadcast_to(a, (h.shape[0],) + a.shape[1:]) for a in (keys, values))
      h = layer_after_kv(layer, h, positions, keys, values)       # causal among the L' tokens,
    return model.embedder.decode(model.final_norm(h))             # all P cached ones visible

  result = jax.jit(functools.partial(jr.text.run_gcg, attack, lm_logits_fn,
                                     prefix_fn=prefix_fn))(table, prompt_ids, target_ids,
                                                           jax.random.key(0), allowed=allowed)

Token ids come from the model's tokenizer (``prompt_ids`` ``[B, P]``, ``target_ids`` ``[B, T]``;
rows of one call share ``P`` and ``T``: batch prompts by length, or give ``target_mask`` for
right-padded targets). Give ``context_length``: an out-of-range position-embedding lookup is
clamped silently by JAX, so an over-long sequence would be scored without an error.

References:
  Zou, Wang, Carlini, Nasr, Kolter & Fredrikson, "Universal and Transferable Adversarial Attacks
  on Aligned Language Models", arXiv:2307.15043, 2023 (Algorithm 1, GCG).
  GraySwanAI/nanoGCG (defaults, candidate sampling, mean cross-entropy loss).
  Pintor et al., "Indicators of Attack Failure", NeurIPS 2022 (silent success).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from jaxrobust._batch import as_keys, like_batch, one_hot_mask
from jaxrobust._validation import check_bool, check_positive_int
from jaxrobust.text._gcg_checks import call_after_prefix, check_gcg_inputs
from jaxrobust.text._gcg_distinct import distinct_bound, distinct_rows

Array = jax.Array


class GCGResult(NamedTuple):
  """What :func:`run_gcg` returns; ``loss`` and ``success`` are recomputed on ``suffix``.

  Attributes:
    suffix: ``[B, S]`` int32, the best suffix seen (success first, then loss), allowed tokens only.
    loss: ``[B]`` float32, the mean cross-entropy of the target tokens after
      ``prompt + suffix (+ after_suffix)`` (NaN where the model's logits are not finite).
    success: ``[B]`` bool, greedy decoding after ``prompt + suffix (+ after_suffix)`` reproduces
      the target exactly (the teacher-forced argmax is the target token at every position).
  """

  suffix: Array
  loss: Array
  success: Array


class GCG(NamedTuple):
  """Static configuration of Greedy Coordinate Gradient, built by :func:`gcg`; hashable, so it
  can be a static argument of ``jax.jit``. See :func:`gcg` for the fields."""

  suffix_length: int = 20
  steps: int = 250
  search_width: int = 512
  topk: int = 256
  n_replace: int = 1
  chunk_size: Optional[int] = None
  early_stop: bool = False
  name: str = "gcg"
  config: Optional[str] = None
  dedupe: bool = True  # last: a field added after name and config keeps their positions

  @property
  def scored_rows(self) -> int:
    """Candidate rows scored per step and example, at most: ``search_width``, or with
    ``dedupe`` the bound ``min(search_width, comb(suffix_length, n_replace) * topk **
    n_replace)`` on the distinct ones (with ``chunk_size``, the chunks past the distinct
    candidates drawn are skipped at run time)."""
    if not self.dedupe:
      return self.search_width
    return distinct_bound(self.search_width, self.suffix_length, self.topk, self.n_replace)


def gcg(*, suffix_length: int = 20, steps: int = 250, search_width: int = 512, topk: int = 256,
        n_replace: int = 1, chunk_size: Optional[int] = None, early_stop: bool = False,
        dedupe: bool = True) -> GCG:
  """Greedy Coordinate Gradient (Zou et al. 2023) with nanoGCG's defaults; run it with
  :func:`run_gcg` (the module docstring has the algorithm and its conventions).

  Each step costs one forward and backward pass on the current suffix and ``search_width``
  forward passes per example, or fewer with ``dedupe``: with ``n_replace=1`` at most
  ``suffix_length * topk`` distinct candidates exist, so a step scores at most
  ``GCG.scored_rows = min(search_width, suffix_length * topk)`` rows, and with ``chunk_size``
  only the chunks that hold distinct candidates of some example.

  Args:
    suffix_length: ``S``, the number of adversarial tokens.
    steps: GCG iterations (a fixed-length ``lax.scan``).
    search_width: candidate suffixes re-scored exactly per step and example.
    topk: tokens kept per position from the token gradient (at most the vocabulary size ``V``,
      checked by :func:`run_gcg`).
    n_replace: positions changed in each candidate (``1 <= n_replace <= suffix_length``).
    chunk_size: at most this many candidates per example in one forward pass (``None``: all
      ``scored_rows`` at once), in equal chunks (the fewest that allows). Results do not depend
      on it; peak memory is that of ``B * chunk_size`` sequences. With ``dedupe``, a chunk is run
      only if some example has a distinct candidate in it (under ``vmap`` of the whole search,
      where ``lax.cond`` runs both branches, every chunk runs).
    early_stop: stop changing an example once its best suffix succeeds (see the module
      docstring); the returned suffix then keeps the loss it had when it first succeeded.
    dedupe: score each distinct candidate suffix of a step once and give every draw of it that
      loss (``False``: score all ``search_width`` draws, as nanoGCG does). The same search either
      way: the same rows are scored, each once instead of once per draw, and the lowest loss's
      first draw moves. Only float rounding can differ: XLA may round a loss in a pass of
      another row count differently in the last bit (as for another ``chunk_size``), which
      matters only for candidates tied to within that; with passes of one shape (a
      ``chunk_size`` dividing both counts) the losses are bitwise equal. Without ``chunk_size``
      it saves passes only where fewer distinct candidates than ``search_width`` can exist
      (``math.comb(suffix_length, n_replace) * topk ** n_replace < search_width``); with it,
      also the chunks beyond the distinct candidates actually drawn.

  Returns:
    A :class:`GCG` configuration.

  Raises:
    ValueError: for a non-positive count, ``n_replace > suffix_length`` or a non-bool
      ``early_stop`` or ``dedupe``.

  Examples:
    >>> gcg(suffix_length=4, steps=10, search_width=8, topk=4).search_width
    8
    >>> gcg(suffix_length=6, topk=32).scored_rows  # 512 draws, at most 6 * 32 distinct ones
    192
    >>> gcg(suffix_length=6, topk=32, dedupe=False).scored_rows
    512
    >>> gcg(suffix_length=2, n_replace=3)
    Traceback (most recent call last):
    ...
    ValueError: n_replace (3) must be at most suffix_length (2): a candidate changes n_replace \
distinct suffix positions.

  References:
    Zou et al., arXiv:2307.15043, 2023; GraySwanAI/nanoGCG ``GCGConfig``.
  """
  suffix_length = check_positive_int("suffix_length", suffix_length)
  steps = check_positive_int("steps", steps)
  search_width = check_positive_int("search_width", search_width)
  topk = check_positive_int("topk", topk)
  n_replace = check_positive_int("n_replace", n_replace)
  if n_replace > suffix_length:
    raise ValueError(f"n_replace ({n_replace}) must be at most suffix_length ({suffix_length}): "
                     f"a candidate changes n_replace distinct suffix positions.")
  if chunk_size is not None:
    chunk_size = check_positive_int("chunk_size (None or an int)", chunk_size)
  early_stop = check_bool("early_stop", early_stop)
  dedupe = check_bool("dedupe", dedupe)
  settings = dict(suffix_length=suffix_length, steps=steps, search_width=search_width, topk=topk,
                  n_replace=n_replace, chunk_size=chunk_size, early_stop=early_stop,
                  dedupe=dedupe)
  name = f"gcg-{suffix_length}tok-{steps}x{search_width}-top{topk}"
  return GCG(**settings, name=name, config=json.dumps({"factory": "gcg", **settings}))


class _State(NamedTuple):
  current: Array  # [B, S] int32, the suffix the next token gradient is taken at
  best: Array  # [B, S] int32, the best suffix seen (success first, then loss)
  best_loss: Array  # [B] float32, its loss (inf when NaN)
  best_success: Array  # [B] bool, its success


class _Problem(NamedTuple):
  """Everything fixed during a run, with the embeddings of the fixed tokens computed once."""

  lm_logits_fn: Callable[..., Array]
  embedding: Array  # [V, D]
  prompt_embeds: Array  # [B, P, D]
  cache: Any  # None, or prefix_fn(prompt_embeds): a pytree of [B, ...] arrays, computed once
  after_embeds: Array  # [B, A, D]
  target_embeds: Array  # [B, T, D]
  target: Array  # [B, T] int32
  target_weights: Array  # [B, T] float32, 1 for scored target tokens, 0 for padding


def _target_scores(logits: Array, target: Array, weights: Array) -> tuple[Array, Array]:
  """Mean cross-entropy ``[...]`` and teacher-forced exact match ``[...]`` from the logits
  ``[..., T, V]`` that predict the target tokens ``[..., T]`` (weights ``[..., T]``)."""
  logits = logits.astype(jnp.float32)
  hit = one_hot_mask(target, logits.shape[-1])
  nll = jax.nn.logsumexp(logits, axis=-1) - jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)
  # where, not a product: a padded position's NaN logits must not reach the loss (NaN * 0).
  scored = jnp.where(weights > 0.0, nll * weights, 0.0)
  loss = jnp.sum(scored, axis=-1) / jnp.sum(weights, axis=-1)
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  match = (greedy == target) & jnp.all(jnp.isfinite(logits), axis=-1)
  return loss, jnp.all(match | (weights == 0.0), axis=-1)


def _score_embeds(problem: _Problem, suffix_embeds: Array) -> tuple[Array, Array]:
  """``(loss, success)``, each ``[B, N]``, of ``N`` suffixes per example given as embeddings
  ``[B, N, S, D]``: one forward pass on ``B * N`` sequences."""
  if problem.cache is not None:
    return _score_after_prefix(problem, suffix_embeds)
  batch, num = suffix_embeds.shape[:2]

  def tile(embeds):  # [B, K, D] -> [B, N, K, D]
    return jnp.broadcast_to(embeds[:, None], (batch, num) + embeds.shape[1:])

  pieces = (tile(problem.prompt_embeds), suffix_embeds, tile(problem.after_embeds),
            tile(problem.target_embeds))
  sequence = jnp.concatenate(pieces, axis=2)
  length, width = sequence.shape[2:]
  logits = problem.lm_logits_fn(sequence.reshape(batch * num, length, width))
  num_target = problem.target.shape[1]
  # Logits at position i predict token i + 1: the target is predicted by the T positions before
  # its last token.
  predicting = logits[:, length - num_target - 1:length - 1]
  predicting = predicting.reshape((batch, num) + predicting.shape[1:])
  return _target_scores(predicting, problem.target[:, None], problem.target_weights[:, None])


def _score_after_prefix(problem: _Problem, suffix_embeds: Array) -> tuple[Array, Array]:
  """:func:`_score_embeds` with the prompt's cache: the model sees only ``suffix + after_suffix +
  target``, ``N`` rows per prompt sharing that prompt's cache (:func:`call_after_prefix`)."""
  batch, num = suffix_embeds.shape[:2]
  tile = lambda embeds: jnp.broadcast_to(embeds[:, None], (batch, num) + embeds.shape[1:])
  pieces = (suffix_embeds, tile(problem.after_embeds), tile(problem.target_embeds))
  sequence = jnp.concatenate(pieces, axis=2)  # [B, N, L', D]
  logits = call_after_prefix(problem.lm_logits_fn, sequence, problem.cache)  # [B, N, L', V']
  length, num_target = sequence.shape[2], problem.target.shape[1]
  # The suffix is never empty, so the T predicting positions all lie after the prompt.
  predicting = logits[:, :, length - num_target - 1:length - 1]
  return _target_scores(predicting, problem.target[:, None], problem.target_weights[:, None])


def _embed(embedding: Array, ids: Array) -> Array:
  """``embedding[ids]``, laid out like ``ids``: under an Explicit mesh axis the gather of a
  replicated table at batch-sharded ids needs its output sharding spelled out (the ids' own)."""
  sharding = getattr(jax.typeof(ids), "sharding", None)
  spec = getattr(sharding, "spec", None)
  if not spec or all(axis is None for axis in spec):
    return jnp.take(embedding, ids, axis=0)
  out = PartitionSpec(*spec, None)
  return embedding.at[ids].get(out_sharding=NamedSharding(sharding.mesh, out))


def _score(problem: _Problem, suffixes: Array) -> tuple[Array, Array]:
  """``(loss, success)`` ``[B, N]`` of the token suffixes ``[B, N, S]``."""
  return _score_embeds(problem, _embed(problem.embedding, suffixes))


def _score_in_chunks(problem: _Problem, suffixes: Array, chunk_size: Optional[int],
                     needed: Optional[Array] = None) -> tuple[Array, Array]:
  """:func:`_score` on ``[B, W, S]`` suffixes, at most ``chunk_size`` per example at a time: the
  fewest chunks that allows, of equal size (192 rows in chunks of at most 128: two of 96, not
  128 + 64 padded to 128), the last one padded with copies of the first suffix, whose scores are
  dropped. With ``needed`` (an int32 scalar: only the first ``needed`` rows of every example are
  read), a chunk that starts at or after it is not run (``lax.cond``; under ``vmap`` both
  branches run) and its rows get loss ``inf`` and no success."""
  batch, width, length = suffixes.shape
  if chunk_size is None or chunk_size >= width:
    return _score(problem, suffixes)
  chunks = -(-width // chunk_size)
  chunk_size = -(-width // chunks)
  pad = chunks * chunk_size - width
  padded = jnp.concatenate(
      [suffixes, jnp.broadcast_to(suffixes[:, :1], (batch, pad, length))], axis=1)
  per_chunk = padded.reshape(batch, chunks, chunk_size, length).transpose(1, 0, 2, 3)
  if needed is None:
    loss, success = lax.map(lambda c: _score(problem, c), per_chunk)  # [chunks, B, chunk]
  else:
    # Losses are float32 whatever the model's dtype (_target_scores). Built from the chunk's own
    # ids, so the rows carry its batch sharding (Explicit mesh axes).
    skipped = lambda c: (jnp.full_like(c[..., 0], jnp.inf, dtype=jnp.float32),
                         jnp.zeros_like(c[..., 0], dtype=bool))
    starts = jnp.arange(chunks, dtype=jnp.int32) * chunk_size
    loss, success = lax.map(
        lambda args: lax.cond(args[1] < needed, functools.partial(_score, problem), skipped,
                              args[0]), (per_chunk, starts))
  unchunk = lambda a: a.transpose(1, 0, 2).reshape(batch, chunks * chunk_size)[:, :width]
  return unchunk(loss), unchunk(success)


def _score_candidates(problem: _Problem, attack: GCG, candidates: Array) -> tuple[Array, Array]:
  """``(loss, success)`` ``[B, W]`` of the step's draws ``[B, W, S]``: with ``attack.dedupe``
  each distinct candidate is scored once, in at most ``attack.scored_rows`` rows per example
  (:func:`distinct_rows`), and every draw gets its candidate's scores; otherwise every draw is
  scored. In chunks (``attack.chunk_size``), the chunks past the last distinct candidate of
  every example are skipped, which saves passes even when ``scored_rows == search_width``
  (e.g. 512 draws among 640 possible candidates are about 352 distinct ones)."""
  rows, chunked = attack.scored_rows, attack.chunk_size is not None
  if not attack.dedupe or (rows >= attack.search_width and not chunked):
    return _score_in_chunks(problem, candidates, attack.chunk_size)
  unique, inverse = jax.vmap(lambda c: distinct_rows(c, rows))(candidates)  # [B, D, S], [B, W]
  needed = jnp.max(inverse) + 1 if chunked else None  # the most distinct rows of any example
  loss, success = _score_in_chunks(problem, unique, attack.chunk_size, needed)  # [B, D]
  return jax.vmap(lambda l, s, i: (l[i], s[i]))(loss, success, inverse)


def _token_scores(problem: _Problem, suffix: Array, allowed: Array) -> Array:
  """``[B, S, V]`` float32: minus the one-hot token gradient of the loss at ``suffix`` ``[B, S]``
  (larger = a larger first-order decrease); ``-inf`` for disallowed tokens, and the lowest finite
  value for allowed tokens whose gradient is not finite (ranked after every finite one)."""
  embeds = _embed(problem.embedding, suffix)[:, None]  # [B, 1, S, D]
  # Examples are independent, so the gradient of the summed loss is each example's gradient.
  grad = jax.grad(lambda e: jnp.sum(_score_embeds(problem, e)[0]))(embeds)[:, 0]
  # d loss / d onehot = (d loss / d embeds) E^T, the chain rule through embeds = onehot @ E.
  onehot_grad = jnp.einsum("bsd,vd->bsv", grad.astype(problem.embedding.dtype), problem.embedding,
                           preferred_element_type=jnp.float32)
  lowest = jnp.finfo(jnp.float32).min
  score = jnp.where(jnp.isfinite(onehot_grad), -onehot_grad, lowest)
  return jnp.where(allowed[None, None], score, -jnp.inf)


def _sample_candidates(key: Array, scores: Array, current: Array, num_choices: Array, *,
                       attack: GCG) -> Array:
  """``[W, S]`` candidates for one example: ``current`` ``[S]`` with ``n_replace`` distinct
  uniform positions each set to a uniform draw among that position's best ``num_choices``
  (``min(topk, #allowed)``) tokens by ``scores`` ``[S, V]``."""
  width, replace = attack.search_width, attack.n_replace
  length = current.shape[0]
  top_tokens = lax.top_k(scores, attack.topk)[1].astype(jnp.int32)  # [S, topk]
  position_key, token_key = jax.random.split(key)
  positions = jnp.argsort(jax.random.uniform(position_key, (width, length)), axis=-1)
  positions = positions[:, :replace].astype(jnp.int32)  # [W, R], distinct per candidate
  rank = jax.random.randint(token_key, (width, replace), 0, num_choices, dtype=jnp.int32)
  tokens = top_tokens[positions, rank]  # [W, R]
  at = positions[..., None] == jnp.arange(length, dtype=jnp.int32)[None, None]  # [W, R, S]
  replaced = jnp.sum(jnp.where(at, tokens[..., None], 0), axis=1)
  return jnp.where(jnp.any(at, axis=1), replaced, current[None])


def _pick(rows: Array, index: Array) -> Array:
  """``rows[b, index[b]]`` for ``rows`` ``[B, W, ...]`` (a masked sum: no gather, so it shards
  like the batch)."""
  chosen = jnp.arange(rows.shape[1], dtype=jnp.int32)[None] == index[:, None]  # [B, W]
  chosen = chosen.reshape(chosen.shape + (1,) * (rows.ndim - 2))
  if rows.dtype == jnp.bool_:
    return jnp.any(chosen & rows, axis=1)
  return jnp.sum(jnp.where(chosen, rows, jnp.zeros((), rows.dtype)), axis=1)


def _better(loss: Array, success: Array, than_loss: Array, than_success: Array) -> Array:
  """Success first, then a strictly lower loss."""
  return (success & ~than_success) | ((success == than_success) & (loss < than_loss))


def _step(problem: _Problem, attack: GCG, allowed: Array, step_keys: Array, state: _State,
          step: Array) -> _State:
  """One GCG step for every example (see the module docstring)."""
  scores = _token_scores(problem, state.current, allowed)
  num_choices = jnp.minimum(jnp.sum(allowed, dtype=jnp.int32), attack.topk)
  keys = jax.vmap(lambda k: jax.random.fold_in(k, step))(step_keys)
  candidates = jax.vmap(
      lambda k, s, c: _sample_candidates(k, s, c, num_choices, attack=attack))(
          keys, scores, state.current)  # [B, W, S]
  loss, success = _score_candidates(problem, attack, candidates)
  loss = jnp.where(jnp.isnan(loss), jnp.inf, loss)
  lowest = jnp.argmin(loss, axis=1).astype(jnp.int32)
  # The step's best by (success, loss): a succeeding candidate of higher loss beats the others.
  lowest_success = jnp.argmin(jnp.where(success, loss, jnp.inf), axis=1).astype(jnp.int32)
  best_here = jnp.where(jnp.any(success, axis=1), lowest_success, lowest)
  here_loss, here_success = _pick(loss, best_here), _pick(success, best_here)
  better = _better(here_loss, here_success, state.best_loss, state.best_success)
  return _State(
      current=_pick(candidates, lowest),
      best=jnp.where(better[:, None], _pick(candidates, best_here), state.best),
      best_loss=jnp.where(better, here_loss, state.best_loss),
      best_success=jnp.where(better, here_success, state.best_success))


def _start(problem: _Problem, init: Array) -> _State:
  """The state before the first step: ``init`` ``[B, S]``, current and best, scored."""
  loss, success = _score(problem, init[:, None])
  loss = jnp.where(jnp.isnan(loss[:, 0]), jnp.inf, loss[:, 0])
  return _State(init, init, loss, success[:, 0])


def _advance(problem: _Problem, attack: GCG, allowed: Array, step_keys: Array, state: _State,
             steps: Array, *, bounded: bool = False) -> _State:
  """The scan of :func:`_step` over the step indices ``steps`` ``[n]`` int32 from ``state``;
  with ``bounded`` (traced indices that may pass the budget), an index at or past
  ``attack.steps`` leaves the state as it is."""

  def body(state, step):
    if not attack.early_stop:
      if bounded:
        return lax.cond(step >= attack.steps, lambda s: s,
                        lambda s: _step(problem, attack, allowed, step_keys, s, step), state), None
      return _step(problem, attack, allowed, step_keys, state, step), None
    done = state.best_success | (step >= attack.steps) if bounded else state.best_success

    def advance(state):
      new = _step(problem, attack, allowed, step_keys, state, step)
      keep = lambda n, o: jnp.where(done.reshape(done.shape + (1,) * (n.ndim - 1)), o, n)
      return jax.tree.map(keep, new, state)

    # Every example done: skip the step's passes (a real branch unless the caller vmaps).
    return lax.cond(jnp.all(done), lambda s: s, advance, state), None

  return lax.scan(body, state, steps)[0]


def _search(problem: _Problem, attack: GCG, allowed: Array, init: Array, step_keys: Array
            ) -> _State:
  """The fixed-length scan of :func:`_step` from the suffix ``init`` ``[B, S]``."""
  return _advance(problem, attack, allowed, step_keys, _start(problem, init),
                  jnp.arange(attack.steps, dtype=jnp.int32))


def _initial_suffix(init_suffix: Any, allowed: Array, init_keys: Array, batch: int,
                    length: int) -> Array:
  """``[B, S]`` int32 initial suffix (see :func:`run_gcg`'s ``init_suffix``)."""
  if init_suffix is None:
    logits = jnp.where(allowed, 0.0, -jnp.inf).astype(jnp.float32)
    draw = lambda k: jax.random.categorical(k, logits, shape=(length,)).astype(jnp.int32)
    return jax.vmap(draw)(init_keys)
  init = jnp.asarray(init_suffix, jnp.int32)
  if init.ndim == 0:
    return jnp.full((batch, length), init, jnp.int32)
  return jnp.broadcast_to(init, (batch, length)) if init.ndim == 1 else init


def run_gcg(attack: GCG, lm_logits_fn: Callable[..., Array], embedding: Array, prompt: Array,
            target: Array, key: Array, *, allowed: Optional[Array] = None,
            init_suffix: Any = None, after_suffix: Optional[Array] = None,
            target_mask: Optional[Array] = None, context_length: Optional[int] = None,
            prefix_fn: Optional[Callable[[Array], Any]] = None) -> GCGResult:
  """Greedy Coordinate Gradient on a causal LM: the suffix after ``prompt`` that makes the model
  most likely to continue with ``target`` (algorithm, conventions and the recipe for a real LLM:
  the module docstring).

  Args:
    attack: from :func:`gcg`.
    lm_logits_fn: the causal LM as a function of input embeddings, ``[N, L, D] -> [N, L, V']``
      (next-token logits at every position; rows independent; any ``V' >`` every target id).
      With ``prefix_fn``: ``(embeds [N, L', D], cache) -> [N, L', V']`` on the tokens after the
      prompt (positions from ``P`` on), ``cache`` one prompt's (leading axis 1, shared by the
      ``N`` rows; the module docstring, "Prefix cache").
    embedding: ``[V, D]`` its token-embedding table; suffix tokens range over its ``V`` rows.
    prompt: ``[B, P]`` int token ids before the suffix (``P`` may be 0).
    target: ``[B, T]`` int token ids the model should emit after the suffix (``T >= 1``).
    key: a PRNG key, or ``[B]`` keys (one per example: results then do not depend on the
      example's position in the batch).
    allowed: ``[V]`` bool, the tokens the suffix may use (``None``: all); e.g. no special tokens.
    init_suffix: the starting suffix: ``None`` (uniform random allowed tokens from each example's
      key), a token id repeated ``S`` times (nanoGCG starts from ``"x x ... x"``), or ``[S]`` /
      ``[B, S]`` ids; allowed tokens only.
    after_suffix: ``[B, A]`` int token ids between the suffix and the target (e.g. the chat
      template's end of the user turn and the assistant header); none by default.
    target_mask: ``[B, T]`` bool, which target tokens count (right-padded targets of different
      lengths); every row needs one. ``None``: all.
    context_length: the model's maximum sequence length; ``P + S + A + T`` above it raises. Give
      it: a learned position-embedding lookup past its table is clamped silently by JAX.
    prefix_fn: ``None`` (the model sees whole sequences), or the prompt's cache
      ``prompt_embeds [B, P, D] -> cache`` (a pytree of ``[B, ...]`` arrays), computed once.

  Returns:
    :class:`GCGResult`: ``suffix [B, S]`` int32, ``loss [B]`` float32 and ``success [B]`` bool,
    recomputed on the returned suffix.

  Raises:
    ValueError: token ids outside ``[0, V)`` (targets outside ``[0, V')``), an ``allowed`` mask
      of the wrong shape or with no allowed token (or an ``init_suffix`` outside it), ``topk > V``,
      a sequence longer than ``context_length``, mismatched batch sizes, an empty target or
      ``target_mask`` row, model outputs not ``[N, L, V']``, or a ``prefix_fn`` cache without
      one row per prompt (each array's leading axis ``B``). Value checks run on concrete
      arrays; under ``jit`` only shapes are checked, so call it once outside ``jit`` (or run
      :func:`check_gcg_inputs`) when the ids are untrusted.

  Examples:
    A bigram LM (the logits at a position depend only on its token) where only token 2 is
    followed by token 3:

    >>> import functools, jax, jax.numpy as jnp
    >>> table = jnp.array([[2., 0, 0, 0], [2., 0, 0, 0], [0., 0, 0, 9], [0., 9, 0, 0]])
    >>> lm = lambda embeds: embeds  # embedding row v = the logits after token v
    >>> attack = gcg(suffix_length=1, steps=2, search_width=4, topk=4)
    >>> attack_fn = jax.jit(functools.partial(run_gcg, attack, lm))
    >>> result = attack_fn(table, jnp.array([[0]]), jnp.array([[3]]), jax.random.key(0))
    >>> result.suffix.tolist(), result.success.tolist()
    ([[2]], [True])

    The same model with a prompt cache (here the prompt's last embedding; a bigram model's
    logits after the prompt do not depend on the prompt, so it goes unused):

    >>> prefix_fn = lambda prompt_embeds: prompt_embeds[:, -1]       # [B, D]
    >>> cached_lm = lambda embeds, cache: embeds                     # cache [1, D] unused here
    >>> cached = jax.jit(functools.partial(run_gcg, attack, cached_lm, prefix_fn=prefix_fn))
    >>> cached(table, jnp.array([[0]]), jnp.array([[3]]), jax.random.key(0)).suffix.tolist()
    [[2]]

  References:
    Zou et al., "Universal and Transferable Adversarial Attacks on Aligned Language Models",
    arXiv:2307.15043, 2023.
  """
  problem, allowed, init, step_keys = prepare(
      attack, lm_logits_fn, embedding, prompt, target, key, allowed=allowed,
      init_suffix=init_suffix, after_suffix=after_suffix, target_mask=target_mask,
      context_length=context_length, prefix_fn=prefix_fn)
  state = _search(problem, attack, allowed, init, step_keys)
  loss, success = _score(problem, state.best[:, None])
  return GCGResult(state.best, loss[:, 0], success[:, 0])


def prepare(attack: GCG, lm_logits_fn: Callable[..., Array], embedding: Array, prompt: Array,
            target: Array, key: Array, **options: Any) -> tuple[_Problem, Array, Array, Array]:
  """The checked inputs of :func:`run_gcg` as ``(problem, allowed [V], init [B, S], step_keys
  [B])``, with the fixed tokens embedded and the prompt's cache computed, once."""
  if not isinstance(attack, GCG):
    raise ValueError(f"attack must come from jr.text.gcg(...), got {type(attack).__name__}.")
  init_suffix, prefix_fn = options["init_suffix"], options["prefix_fn"]
  arrays = check_gcg_inputs(attack, lm_logits_fn, embedding, prompt, target, **options)
  embedding, prompt, target, allowed, after_suffix, weights = arrays
  batch = prompt.shape[0]
  # Per-example arrays built here (or given unsharded) follow the prompt's batch sharding.
  target, after_suffix, weights = (like_batch(a, prompt) for a in (target, after_suffix, weights))
  keys = like_batch(as_keys(key, batch), prompt)
  init_keys, step_keys = jax.vmap(lambda k: tuple(jax.random.split(k)))(keys)
  init = like_batch(_initial_suffix(init_suffix, allowed, init_keys, batch, attack.suffix_length),
                    prompt)
  prompt_embeds = _embed(embedding, prompt)
  cache = None if prefix_fn is None else prefix_fn(prompt_embeds)
  problem = _Problem(lm_logits_fn, embedding, prompt_embeds, cache,
                     _embed(embedding, after_suffix), _embed(embedding, target), target, weights)
  return problem, allowed, init, step_keys


__all__ = ["GCG", "GCGResult", "check_gcg_inputs", "gcg", "run_gcg"]
