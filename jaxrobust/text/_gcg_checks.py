"""Input checks of :func:`jaxrobust.text.run_gcg` and :func:`jaxrobust.text.gcg_segment`: token
ids in range, the ``allowed`` mask, the sequence within the context, and the model's shapes
(uncached, or a prefix cache and the model after it), run on the host before a jitted call."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrobust._validation import check_positive_int, is_concrete

Array = jax.Array


def _ids(name: str, ids: Any, batch: Optional[int], high: Optional[int], what: str = "") -> Array:
  """``ids`` as a ``[B, K]`` int32 array, checked to lie in ``[0, high)`` when concrete (and
  ``high`` is given)."""
  array = jnp.asarray(ids)
  if not jnp.issubdtype(array.dtype, jnp.integer) or array.ndim != 2:
    raise ValueError(f"{name} must be an int array [B, length] of token ids, got dtype "
                     f"{array.dtype}, shape {array.shape}.")
  if batch is not None and array.shape[0] != batch:
    raise ValueError(f"{name} has {array.shape[0]} rows but prompt has {batch}: one row per "
                     f"example.")
  if high is not None and array.size and is_concrete(array):
    low, top = int(np.min(np.asarray(array))), int(np.max(np.asarray(array)))
    if low < 0 or top >= high:
      raise ValueError(f"{name} token ids must lie in [0, {high}) ({what}), got min {low}, "
                       f"max {top}.")
  return array.astype(jnp.int32)


def _check_allowed(allowed: Any, vocab: int, init_suffix: Any) -> Array:
  if allowed is None:
    return jnp.ones((vocab,), jnp.bool_)
  mask = jnp.asarray(allowed)
  if mask.dtype != jnp.bool_ or mask.shape != (vocab,):
    raise ValueError(f"allowed must be a bool array [V] = [{vocab}] (one flag per row of the "
                     f"embedding table), got dtype {mask.dtype}, shape {mask.shape}.")
  if is_concrete(mask):
    flags = np.asarray(mask)
    if not flags.any():
      raise ValueError("allowed is all False: the suffix must be able to use some token.")
    if init_suffix is not None and is_concrete(init_suffix):
      init = np.asarray(init_suffix)
      if init.size and np.issubdtype(init.dtype, np.integer) and np.all(init >= 0) \
          and np.all(init < vocab) and not flags[init].all():
        raise ValueError(f"init_suffix uses disallowed token ids "
                         f"{sorted(set(init[~flags[init]].tolist()))}.")
  return mask


def _check_init(init_suffix: Any, batch: int, length: int, vocab: int) -> None:
  if init_suffix is None:
    return
  init = jnp.asarray(init_suffix)
  shapes = ((), (length,), (batch, length))
  if not jnp.issubdtype(init.dtype, jnp.integer) or init.shape not in shapes:
    raise ValueError(f"init_suffix must be None, a token id, or int ids of shape [S] = "
                     f"[{length}] or [B, S] = [{batch}, {length}], got dtype {init.dtype}, "
                     f"shape {init.shape}.")
  if not is_concrete(init):
    return
  low, top = int(np.min(np.asarray(init))), int(np.max(np.asarray(init)))
  if low < 0 or top >= vocab:
    raise ValueError(f"init_suffix token ids must lie in [0, {vocab}) (rows of the embedding "
                     f"table), got min {low}, max {top}.")


def call_after_prefix(lm_logits_fn: Callable[[Array, Any], Array], embeds: Array, cache: Any
                      ) -> Array:
  """The cached model on ``[B, N, L', D]`` embeddings, ``N`` rows after each of ``B`` prompts:
  ``lm_logits_fn(embeds[b], cache_b)`` for every prompt ``b`` (a ``vmap``), where ``cache_b`` is
  prompt ``b``'s rows of the cache with a leading axis of 1, shared by its ``N`` rows (nothing
  is copied ``N`` times here; the model broadcasts it). Returns ``[B, N, L', V']``."""
  one = lambda e, c: lm_logits_fn(e, jax.tree.map(lambda leaf: leaf[None], c))
  return jax.vmap(one)(embeds, cache)


def _check_model(lm_logits_fn: Callable[..., Array], prefix_fn: Optional[Callable[[Array], Any]],
                 embedding: Array, batch: int, prefix: int, length: int) -> int:
  """The number of output classes ``V'``, after checking the model's shapes by tracing it."""
  width, dtype = embedding.shape[1], embedding.dtype
  if prefix_fn is None:
    out = jax.eval_shape(lm_logits_fn, jax.ShapeDtypeStruct((batch, length, width), dtype))
    if not hasattr(out, "shape") or len(out.shape) != 3 or tuple(out.shape[:2]) != (batch, length):
      raise ValueError(f"lm_logits_fn must map embeddings [N, L, D] to next-token logits "
                       f"[N, L, V']; for [{batch}, {length}, {width}] it returned "
                       f"{getattr(out, 'shape', out)}.")
    return out.shape[2]
  cache = jax.eval_shape(prefix_fn, jax.ShapeDtypeStruct((batch, prefix, width), dtype))
  if cache is None:
    raise ValueError("prefix_fn returned None: return the prompt's cache (a pytree of [B, ...] "
                     "arrays), or pass prefix_fn=None for a model of whole sequences.")
  bad = [tuple(leaf.shape) for leaf in jax.tree.leaves(cache)
         if not leaf.shape or leaf.shape[0] != batch]
  if bad:
    raise ValueError(f"prefix_fn must return a cache whose every array has one row per prompt "
                     f"(leading axis B = {batch}); for prompt embeddings [B, P, D] = [{batch}, "
                     f"{prefix}, {width}] it returned arrays of shapes {bad}.")
  rest = length - prefix
  spec = jax.ShapeDtypeStruct((batch, 1, rest, width), dtype)
  out = jax.eval_shape(functools.partial(call_after_prefix, lm_logits_fn), spec, cache)
  if not hasattr(out, "shape") or len(out.shape) != 4 or tuple(out.shape[:3]) != (batch, 1, rest):
    shape = getattr(out, "shape", out)
    raise ValueError(f"with prefix_fn, lm_logits_fn(embeds, cache) must map the embeddings after "
                     f"the prompt [N, L', D] and one prompt's cache (leading axis 1) to "
                     f"next-token logits [N, L', V']; for [1, {rest}, {width}] it returned "
                     f"{shape[1:] if isinstance(shape, tuple) else shape}.")
  return out.shape[3]


def check_gcg_inputs(attack: Any, lm_logits_fn: Callable[..., Array], embedding: Array,
                     prompt: Array, target: Array, *, allowed: Optional[Array] = None,
                     init_suffix: Any = None, after_suffix: Optional[Array] = None,
                     target_mask: Optional[Array] = None, context_length: Optional[int] = None,
                     prefix_fn: Optional[Callable[[Array], Any]] = None) -> tuple[Array, ...]:
  """The checks of :func:`run_gcg` (it calls this), usable on the host before a jitted call.

  Returns:
    ``(embedding, prompt, target, allowed, after_suffix, target_weights)`` as arrays (int32 ids,
    a ``[V]`` bool mask, ``[B, 0]`` for no ``after_suffix``, float32 ``[B, T]`` weights).

  Raises:
    ValueError: see :func:`run_gcg`.
  """
  embedding = jnp.asarray(embedding)
  if embedding.ndim != 2 or not jnp.issubdtype(embedding.dtype, jnp.floating):
    raise ValueError(f"embedding must be a float table [V, D], got dtype {embedding.dtype}, "
                     f"shape {embedding.shape}.")
  vocab = embedding.shape[0]
  if attack.topk > vocab:
    raise ValueError(f"topk ({attack.topk}) must be at most the vocabulary size V = {vocab}.")
  rows = "rows of the embedding table"
  prompt = _ids("prompt", prompt, None, vocab, rows)
  batch = prompt.shape[0]
  if batch == 0:
    raise ValueError("prompt is empty: give at least one example.")
  after = jnp.zeros((batch, 0), jnp.int32) if after_suffix is None else after_suffix
  after = _ids("after_suffix", after, batch, vocab, rows)
  target = _ids("target", target, batch, None)
  if target.shape[1] == 0:
    raise ValueError("target is empty ([B, 0]): give at least one target token.")
  length = prompt.shape[1] + attack.suffix_length + after.shape[1] + target.shape[1]
  if context_length is not None:
    context_length = check_positive_int("context_length", context_length)
    if length > context_length:
      raise ValueError(
          f"prompt + suffix + after_suffix + target = {prompt.shape[1]} + {attack.suffix_length}"
          f" + {after.shape[1]} + {target.shape[1]} = {length} tokens exceeds the model's "
          f"context_length {context_length}: shorten the prompt, suffix or target.")
  classes = _check_model(lm_logits_fn, prefix_fn, embedding, batch, prompt.shape[1], length)
  target = _ids("target", target, batch, classes, "the model's output classes")
  _check_init(init_suffix, batch, attack.suffix_length, vocab)
  allowed = _check_allowed(allowed, vocab, init_suffix)
  if target_mask is None:
    weights = jnp.ones(target.shape, jnp.float32)
  else:
    mask = jnp.asarray(target_mask)
    if mask.dtype != jnp.bool_ or mask.shape != target.shape:
      raise ValueError(f"target_mask must be bool [B, T] = {list(target.shape)}, got dtype "
                       f"{mask.dtype}, shape {mask.shape}.")
    if is_concrete(mask) and not np.asarray(mask).any(axis=1).all():
      raise ValueError("target_mask has a row with no target token: every example needs one.")
    weights = mask.astype(jnp.float32)
  return embedding, prompt, target, allowed, after, weights
