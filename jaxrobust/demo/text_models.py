r"""The text demo's Flax NNX models, their training with optax, and their on-disk cache.

* :class:`TextCNN`, a sentiment classifier: embedding, a 1-D convolution, max-pooling over
  positions, a linear head.
* :class:`TinyCausalLM`, a decoder-only transformer (pre-LayerNorm blocks of causal multi-head
  self-attention and a GELU MLP, learned position embeddings), also in a key/value-cache form
  (``prefix_cache`` and ``logits_after_prefix``: GCG's ``prefix_fn`` and cached model).

Both expose ``logits_from_embeddings(embeds)`` and their embedding table, which is exactly how
:mod:`jaxrobust.text` attacks a model: it differentiates through the embeddings and looks tokens
up itself.

Training (Adam, one jitted ``lax.scan`` over the shuffled batches per epoch) takes seconds on a
CPU. Trained parameters are cached under ``cache_dir`` (default ``$XDG_CACHE_HOME/jaxrobust`` or
``~/.cache/jaxrobust``, the image demo's directory) in a file named after a hash of the whole
training configuration and the jax and jaxrobust versions: a changed setting or an upgrade
retrains, an unchanged one loads in milliseconds. Files are written atomically; an unreadable or
mismatched file is retrained.

Examples:
  >>> import jax.numpy as jnp
  >>> from flax import nnx
  >>> model = TextCNN(82, rngs=nnx.Rngs(0))
  >>> model(jnp.zeros((3, 20), jnp.int32)).shape
  (3, 2)
  >>> lm = TinyCausalLM(39, context_length=24, rngs=nnx.Rngs(0))
  >>> lm(jnp.zeros((2, 10), jnp.int32)).shape
  (2, 10, 39)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import warnings
from typing import Any, Callable, Optional

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxrobust
from jaxrobust.demo import files, text_data

CACHE_FORMAT = 1
"""Bumped whenever the meaning of a cached file changes."""


# ------------------------------------------------------------------------------------------------
# Models.


class TextCNN(nnx.Module):
  r"""A convolutional sentence classifier (Kim 2014, one filter width).

  For token ids :math:`t_1 \dots t_L` with embeddings :math:`e_i = E[t_i]`:
  :math:`h_i = \mathrm{relu}(\sum_{j=-1}^{1} W_j e_{i+j} + b)` (zero padding at the ends),
  :math:`z = V \max_i h_i + c`. ``<pad>`` positions take part (their embedding is learned), so
  the logits are a function of the embeddings alone.

  Examples:
    >>> import jax.numpy as jnp
    >>> model = TextCNN(10, embed_dim=4, channels=8, rngs=nnx.Rngs(0))
    >>> embeds = model.embedding[jnp.zeros((2, 5), jnp.int32)]
    >>> bool(jnp.all(model.logits_from_embeddings(embeds) == model(jnp.zeros((2, 5), jnp.int32))))
    True

  References:
    Kim, "Convolutional neural networks for sentence classification", EMNLP 2014.
  """

  def __init__(self, vocab_size: int, *, num_classes: int = 2, embed_dim: int = 32,
               channels: int = 64, kernel_size: int = 3, rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab_size, embed_dim, rngs=rngs)
    self.conv = nnx.Conv(embed_dim, channels, kernel_size=(kernel_size,), padding="SAME",
                         rngs=rngs)
    self.head = nnx.Linear(channels, num_classes, rngs=rngs)

  @property
  def embedding(self) -> jax.Array:
    """The ``[V, D]`` embedding table."""
    return self.embed.embedding[...]

  def logits_from_embeddings(self, embeds: jax.Array) -> jax.Array:
    """``[B, L, D]`` embeddings -> ``[B, C]`` logits."""
    hidden = jax.nn.relu(self.conv(embeds))
    return self.head(jnp.max(hidden, axis=1))

  def __call__(self, tokens: jax.Array) -> jax.Array:
    """``[B, L]`` int token ids -> ``[B, C]`` logits."""
    return self.logits_from_embeddings(self.embed(tokens))


class _Block(nnx.Module):
  """Pre-LayerNorm transformer block: causal self-attention, then a GELU MLP."""

  def __init__(self, dim: int, heads: int, rngs: nnx.Rngs):
    self.heads = heads
    self.norm_attention = nnx.LayerNorm(dim, epsilon=1e-5, rngs=rngs)
    self.qkv = nnx.Linear(dim, 3 * dim, rngs=rngs)
    self.out = nnx.Linear(dim, dim, rngs=rngs)
    self.norm_mlp = nnx.LayerNorm(dim, epsilon=1e-5, rngs=rngs)
    self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
    self.down = nnx.Linear(4 * dim, dim, rngs=rngs)

  def _heads(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Queries, keys and values ``[B, L, H, D / H]`` of ``x`` ``[B, L, D]``."""
    batch, length, dim = x.shape
    q, k, v = jnp.split(self.qkv(self.norm_attention(x)), 3, axis=-1)
    return tuple(a.reshape(batch, length, self.heads, dim // self.heads) for a in (q, k, v))

  def _finish(self, x: jax.Array, attended: jax.Array) -> jax.Array:
    x = x + self.out(attended.reshape(x.shape))
    return x + self.down(jax.nn.gelu(self.up(self.norm_mlp(x)), approximate=True))

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.with_keys(x)[0]

  def with_keys(self, x: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """The block's output on ``x`` ``[B, L, D]`` and its keys and values ``[B, L, H, D / H]``."""
    length = x.shape[1]
    q, k, v = self._heads(x)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    causal = jnp.tril(jnp.ones((length, length), bool))
    scores = jnp.where(causal, scores, -1e9)
    attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    return self._finish(x, attended), (k, v)

  def after_prefix(self, x: jax.Array, cache: tuple[jax.Array, jax.Array]) -> jax.Array:
    r"""The block's output on ``x`` ``[B, L, D]`` continuing a prefix whose keys and values
    ``[R, P, H, D / H]`` are ``cache``: ``R = B`` (a prefix per row) or ``R = 1`` (one prefix
    shared by every row, attended to without copying it ``B`` times).

    One softmax over the prefix's keys and the causal ones of ``x``, computed in two parts that
    share their maximum and their normaliser,
    :math:`w_j = e^{s_j - m} / (\sum_{k \le P} e^{s_k - m} + \sum_{k > P} e^{s_k - m})`, so the two
    score blocks are never concatenated. A shared prefix is attended to by all ``B * L`` queries
    of a head in one matrix product (``[B L, D / H] x [D / H, P]``): on XLA:CPU that runs 3-4
    times faster than the per-row batched form for GCG's hundreds of candidate rows."""
    batch, length = x.shape[:2]
    q, k, v = self._heads(x)
    heads, width = q.shape[2:]
    prefix_k, prefix_v = cache
    shared = prefix_k.shape[0] == 1
    scale = math.sqrt(width)
    if shared:
      earlier = jnp.einsum("nhd,khd->hnk", q.reshape(batch * length, heads, width), prefix_k[0])
      earlier = earlier.reshape(heads, batch, length, -1) / scale
    else:
      earlier = jnp.einsum("bqhd,bkhd->hbqk", q, prefix_k) / scale
    own = jnp.einsum("bqhd,bkhd->hbqk", q, k) / scale
    own = jnp.where(jnp.tril(jnp.ones((length, length), bool)), own, -jnp.inf)
    top = jnp.maximum(jnp.max(earlier, axis=-1, keepdims=True),
                      jnp.max(own, axis=-1, keepdims=True))
    to_prefix, to_own = jnp.exp(earlier - top), jnp.exp(own - top)
    total = jnp.sum(to_prefix, axis=-1, keepdims=True) + jnp.sum(to_own, axis=-1, keepdims=True)
    to_prefix, to_own = to_prefix / total, to_own / total
    if shared:
      flat = to_prefix.reshape(heads, batch * length, -1)
      attended = jnp.einsum("hnk,khd->nhd", flat, prefix_v[0]).reshape(q.shape)
    else:
      attended = jnp.einsum("hbqk,bkhd->bqhd", to_prefix, prefix_v)
    attended = attended + jnp.einsum("hbqk,bkhd->bqhd", to_own, v)
    return self._finish(x, attended)


class TinyCausalLM(nnx.Module):
  r"""A decoder-only transformer language model.

  :math:`x^{(0)}_i = E[t_i] + P_i`; each of ``layers`` blocks adds causal multi-head
  self-attention and an MLP to the residual stream (pre-LayerNorm, GELU, width ``4 dim``);
  logits :math:`z_i = W\, \mathrm{LN}(x^{(n)}_i) + b` predict token :math:`t_{i+1}` from
  :math:`t_{\le i}` only.

  Examples:
    >>> import jax.numpy as jnp
    >>> lm = TinyCausalLM(12, context_length=8, dim=16, heads=2, layers=1, rngs=nnx.Rngs(0))
    >>> tokens = jnp.array([[1, 2, 3, 4], [1, 2, 3, 5]], jnp.int32)  # the last token differs
    >>> logits = nnx.jit(lambda lm, tokens: lm(tokens))(lm, tokens)  # the state an argument
    >>> bool(jnp.allclose(logits[0, :3], logits[1, :3]))  # earlier logits never see it
    True

  References:
    Vaswani et al., "Attention is all you need", NeurIPS 2017; Radford et al., "Language models
    are unsupervised multitask learners" (GPT-2), 2019.
  """

  def __init__(self, vocab_size: int, *, context_length: int, dim: int = 64, heads: int = 4,
               layers: int = 2, rngs: nnx.Rngs):
    if dim % heads:
      raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
    self.context_length = context_length
    self.embed = nnx.Embed(vocab_size, dim, rngs=rngs)
    self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(), (context_length, dim)))
    self.blocks = nnx.List([_Block(dim, heads, rngs) for _ in range(layers)])
    self.norm = nnx.LayerNorm(dim, epsilon=1e-5, rngs=rngs)
    self.head = nnx.Linear(dim, vocab_size, rngs=rngs)

  @property
  def embedding(self) -> jax.Array:
    """The ``[V, D]`` token embedding table."""
    return self.embed.embedding[...]

  def logits_from_embeddings(self, embeds: jax.Array) -> jax.Array:
    """``[B, L, D]`` token embeddings (``L <= context_length``) -> ``[B, L, V]`` next-token
    logits."""
    length = embeds.shape[1]
    if length > self.context_length:
      raise ValueError(f"{length} tokens exceed the context of {self.context_length}")
    x = embeds + self.positions[...][None, :length]
    for block in self.blocks:
      x = block(x)
    return self.head(self.norm(x))

  def __call__(self, tokens: jax.Array) -> jax.Array:
    """``[B, L]`` int token ids -> ``[B, L, V]`` next-token logits."""
    return self.logits_from_embeddings(self.embed(tokens))

  def prefix_cache(self, embeds: jax.Array) -> tuple[tuple[jax.Array, jax.Array], ...]:
    """The key/value cache of a prefix: per block, its keys and values ``[B, P, H, D / H]`` on
    the prefix's embeddings ``embeds`` ``[B, P, D]`` (the ``prefix_fn`` of
    :func:`jaxrobust.text.run_gcg`)."""
    x = embeds + self.positions[...][None, :embeds.shape[1]]
    cache = []
    for block in self.blocks:
      x, keys = block.with_keys(x)
      cache.append(keys)
    return tuple(cache)

  def logits_after_prefix(self, embeds: jax.Array,
                          cache: tuple[tuple[jax.Array, jax.Array], ...]) -> jax.Array:
    """``[B, L, D]`` embeddings of the tokens after a prefix of ``P`` tokens whose
    :meth:`prefix_cache` is ``cache`` (leading axis ``B``, or 1 for a prefix shared by every
    row) -> ``[B, L, V]`` next-token logits: the last ``L`` rows of
    :meth:`logits_from_embeddings` on the whole sequence (up to float rounding).

    Examples:
      >>> import jax.numpy as jnp
      >>> lm = TinyCausalLM(12, context_length=8, dim=16, heads=2, layers=1, rngs=nnx.Rngs(0))
      >>> @nnx.jit  # the model's state and the embeddings are arguments of one program
      ... def errors(lm, embeds):
      ...   whole = lm.logits_from_embeddings(embeds)
      ...   per_row = lm.logits_after_prefix(embeds[:, 3:], lm.prefix_cache(embeds[:, :3]))
      ...   shared = lm.prefix_cache(embeds[:1, :3])  # one prefix for every row
      ...   repeated = lm.logits_after_prefix(jnp.concatenate([embeds[:1, 3:]] * 4), shared)
      ...   return (jnp.max(jnp.abs(per_row - whole[:, 3:])),
      ...           jnp.max(jnp.abs(repeated - whole[:1, 3:])))
      >>> embeds = lm.embedding[jnp.array([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])]
      >>> [bool(error < 1e-5) for error in errors(lm, embeds)]  # a prefix per row; one shared
      [True, True]
    """
    num_prefix = cache[0][0].shape[1] if cache else 0
    end = num_prefix + embeds.shape[1]
    if end > self.context_length:
      raise ValueError(f"{num_prefix} + {embeds.shape[1]} tokens exceed the context of "
                       f"{self.context_length}")
    x = embeds + self.positions[...][None, num_prefix:end]
    for block, keys in zip(self.blocks, cache):
      x = block.after_prefix(x, keys)
    return self.head(self.norm(x))


# ------------------------------------------------------------------------------------------------
# Configurations.


def classifier_config(*, num_train: int = 4000, epochs: int = 10, batch_size: int = 64,
                      learning_rate: float = 3e-3, embed_dim: int = 32, channels: int = 64,
                      seed: int = 0) -> dict[str, Any]:
  """The complete, JSON-serialisable description of the classifier's training run.

  Everything that changes the trained parameters is in here; its hash names the cache file.

  Examples:
    >>> classifier_config()["model"]
    'TextCNN'
  """
  _check_positive(num_train=num_train, epochs=epochs, batch_size=batch_size)
  return {
    "name": "text-classifier", "model": "TextCNN", "embed_dim": int(embed_dim),
    "channels": int(channels), "kernel_size": 3, "num_classes": 2,
    "vocabulary_size": len(text_data.sentiment_vocabulary().words),
    "data": {"corpus": "jaxrobust.demo.text_data.sentiment_corpus", "num_train": int(num_train),
             "seed": int(seed), "generator": text_data.fingerprint()},
    "optimizer": "adam", "loss": "softmax_cross_entropy", "epochs": int(epochs),
    "batch_size": int(batch_size), "learning_rate": float(learning_rate), "seed": int(seed),
  }


def language_model_config(*, num_sequences: int = 4000, epochs: int = 6, batch_size: int = 64,
                          learning_rate: float = 3e-3, dim: int = 32, heads: int = 4,
                          layers: int = 2, seed: int = 0) -> dict[str, Any]:
  """The complete, JSON-serialisable description of the language model's training run.

  Examples:
    >>> language_model_config()["context_length"]
    24
  """
  _check_positive(num_sequences=num_sequences, epochs=epochs, batch_size=batch_size)
  return {
    "name": "text-lm", "model": "TinyCausalLM", "dim": int(dim), "heads": int(heads),
    "layers": int(layers), "context_length": text_data.CONTEXT_LENGTH,
    "vocabulary_size": len(text_data.INSTRUCTION_WORDS),
    "data": {"corpus": "jaxrobust.demo.text_data.instruction_corpus",
             "num_sequences": int(num_sequences), "forbidden_fraction": 0.4, "seed": int(seed),
             "generator": text_data.fingerprint()},
    "optimizer": "adam", "loss": "next-token softmax_cross_entropy (non-padding targets)",
    "epochs": int(epochs), "batch_size": int(batch_size), "learning_rate": float(learning_rate),
    "seed": int(seed),
  }


def _check_positive(**values: int) -> None:
  for name, value in values.items():
    if int(value) < 1:
      raise ValueError(f"{name} must be at least 1, got {value}")


def _construct(config: dict[str, Any]) -> nnx.Module:
  rngs = nnx.Rngs(config["seed"])
  if config["model"] == "TextCNN":
    return TextCNN(config["vocabulary_size"], num_classes=config["num_classes"],
                   embed_dim=config["embed_dim"], channels=config["channels"],
                   kernel_size=config["kernel_size"], rngs=rngs)
  return TinyCausalLM(config["vocabulary_size"], context_length=config["context_length"],
                      dim=config["dim"], heads=config["heads"], layers=config["layers"],
                      rngs=rngs)


def build_model(config: dict[str, Any]) -> nnx.Module:
  """The untrained model of ``config`` (initialised from ``config["seed"]``).

  The initialisation runs as one compiled program (eagerly, every random draw of every layer
  would be dispatched, and compiled, one by one: seconds)."""
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: _construct(config)))
  state = jax.jit(lambda: nnx.state(_construct(config)))()
  return nnx.merge(graphdef, state)


# ------------------------------------------------------------------------------------------------
# Training.


def _classifier_loss(model: TextCNN, tokens: jax.Array, labels: jax.Array) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(model(tokens), labels).mean()


def _language_model_loss(model: TinyCausalLM, tokens: jax.Array) -> jax.Array:
  logits = model(tokens[:, :-1])
  targets = tokens[:, 1:]
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  weights = (targets != 0).astype(jnp.float32)  # <pad> targets do not count
  return jnp.sum(losses * weights) / jnp.sum(weights)


def _fit(model: nnx.Module, loss_fn: Callable[..., jax.Array], arrays: tuple[np.ndarray, ...],
         config: dict[str, Any]) -> nnx.Module:
  """Adam on ``loss_fn(model, *batch)``; one jitted epoch (shuffle, ``lax.scan`` over the full
  batches) per call. Returns the trained model (a new module; ``model`` is not changed)."""
  graphdef, params = nnx.split(model, nnx.Param)
  optimizer = optax.adam(config["learning_rate"])
  batch_size = config["batch_size"]
  num = arrays[0].shape[0]
  num_batches = num // batch_size
  if num_batches < 1:
    raise ValueError(f"batch_size {batch_size} exceeds the {num} training examples")

  def step(carry, batch):
    params, opt_state = carry
    loss, grads = jax.value_and_grad(
      lambda p: loss_fn(nnx.merge(graphdef, p), *batch))(params)
    # optax's Adam computes ``decay ** count`` (Python float ** int32), which strict dtype
    # promotion rejects; standard promotion is confined to the update.
    with jax.numpy_dtype_promotion("standard"):
      updates, opt_state = optimizer.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
    return (params, opt_state), loss

  @jax.jit
  def epoch(params, opt_state, key, *data):
    order = jax.random.permutation(key, num)[:num_batches * batch_size]
    batches = tuple(a[order].reshape(num_batches, batch_size, *a.shape[1:]) for a in data)
    (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), batches)
    return params, opt_state, jnp.mean(losses)

  opt_state = optimizer.init(params)
  key = jax.random.key(config["seed"] + 1)
  data = tuple(jnp.asarray(a) for a in arrays)
  for i in range(config["epochs"]):
    params, opt_state, _ = epoch(params, opt_state, jax.random.fold_in(key, i), *data)
  return nnx.merge(graphdef, jax.block_until_ready(params))


def fit(config: dict[str, Any]) -> nnx.Module:
  """Trains the model of ``config`` from scratch on its corpus (no cache).

  Examples:
    >>> model = fit(classifier_config(num_train=64, epochs=1))
    >>> model(jnp.zeros((1, 20), jnp.int32)).shape
    (1, 2)
  """
  model = build_model(config)
  data = config["data"]
  if config["model"] == "TextCNN":
    corpus = text_data.sentiment_splits(data["num_train"], 0, data["seed"])[0]
    return _fit(model, _classifier_loss, (corpus.tokens, corpus.labels), config)
  corpus = text_data.instruction_corpus(data["num_sequences"], data["seed"],
                                        data["forbidden_fraction"])
  return _fit(model, _language_model_loss, (corpus.tokens,), config)


# ------------------------------------------------------------------------------------------------
# The cache.


def cache_path(config: dict[str, Any],
               cache_dir: Optional[os.PathLike | str] = None) -> pathlib.Path:
  """``<cache_dir>/<name>-<16 hex digits>.msgpack``: a hash of ``config`` and the versions.

  Examples:
    >>> a, b = cache_path(classifier_config(), "/c"), cache_path(classifier_config(seed=1), "/c")
    >>> a.parent.as_posix(), a.name.startswith("text-classifier-"), a != b
    ('/c', True, True)
  """
  key = json.dumps({"config": config, "jax": jax.__version__, "flax": flax.__version__,
                    "jaxrobust": jaxrobust.__version__, "format": CACHE_FORMAT}, sort_keys=True)
  digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
  directory = pathlib.Path(cache_dir) if cache_dir is not None else files.default_cache_dir()
  return directory / f"{config['name']}-{digest}.msgpack"


def save_cached(path: os.PathLike | str, model: nnx.Module) -> None:
  """Writes the model's parameters atomically (:func:`jaxrobust.demo.files.write_bytes`)."""
  pure = nnx.state(model, nnx.Param).to_pure_dict()
  files.write_bytes(path, flax.serialization.to_bytes(jax.device_get(pure)))


def load_cached(path: os.PathLike | str, config: dict[str, Any]) -> Optional[nnx.Module]:
  """The model of ``config`` with the parameters of ``path``, or ``None`` if the file is
  missing, unreadable, or holds other shapes or dtypes."""
  try:
    raw = pathlib.Path(path).read_bytes()
  except OSError:
    return None
  # Shapes only (an eager initialisation runs op by op: seconds); the file supplies the values.
  model = nnx.eval_shape(lambda: _construct(config))
  state = nnx.state(model, nnx.Param)
  expected = state.to_pure_dict()
  try:
    restored = flax.serialization.from_bytes(expected, raw)
    leaves, want = jax.tree.leaves(restored), jax.tree.leaves(expected)
    if (jax.tree.structure(restored) != jax.tree.structure(expected)
        or any(np.shape(a) != b.shape or np.asarray(a).dtype != b.dtype
               for a, b in zip(leaves, want))):
      return None
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, restored))
  except Exception:  # noqa: BLE001 - any unreadable file is simply retrained
    return None
  nnx.update(model, state)
  return model


def load_or_train(config: dict[str, Any], *, cache_dir: Optional[os.PathLike | str] = None,
                  cache: bool = True) -> tuple[nnx.Module, bool]:
  """Loads ``config``'s model from the cache, or trains and caches it.

  Returns:
    ``(model, loaded_from_cache)``.
  """
  path = cache_path(config, cache_dir) if cache else None
  if path is not None:
    model = load_cached(path, config)
    if model is not None:
      return model, True
  model = fit(config)
  if path is not None:
    try:
      save_cached(path, model)
    except OSError as error:
      warnings.warn(f"could not write the parameter cache {path}: {error}", RuntimeWarning,
                    stacklevel=2)
  return model, False
