"""Discrete attacks vs their PyTorch peers on the text demo's models (issue #15).

(a) Word swap: ``jr.text.run(jr.text.word_swap(...))`` against TextAttack's greedy word swap
    (``GreedySearch``, i.e. beam search of width 1, with ``RepeatModification`` and
    ``MaxWordsPerturbed(max_swaps)``; every TextAttack recipe has the first), the same synonym
    candidates (a ``WordSwap`` transformation returning the other members of the word's synonym
    group, which from any member is the original word's group too), the same held-out reviews,
    the demo's TextCNN ported to PyTorch (logits checked equal). Reported as TextAttack reports
    it: attack success rate (skipped reviews excluded), average perturbed word %, average queries,
    and the time.
(c) TextFooler: ``jr.text.run_textfooler`` against TextAttack's TextFooler recipe
    (``TextFoolerJin2019``) rebuilt from its components without downloads: ``GreedyWordSwapWIR``
    ("delete", the recipe's, and "unk"), ``RepeatModification``, ``StopwordModification`` (the
    function words), ``WordEmbeddingDistance(min_cos_sim=0.5)`` on word vectors of our own, a
    part-of-speech table constraint (the synonym group's role; TextAttack's tagger needs a
    download), a ``SentenceEncoder`` of our own (mean-pooled word vectors, a tanh projection,
    angular similarity >= 0.840845057 over a window) and a ``WordSwap`` returning the synonym
    lists; jaxrobust with the same tables, encoder weights and thresholds. Reported: the same
    success, adversarial text, swaps and queries per review, TextAttack's summary numbers and the
    time (jaxrobust's with and without compilation, per compile configuration, ``--tf-configs``:
    ``fast`` = :data:`FAST_COMPILE`, XLA's ``default``, ``O0``; the first configuration's first
    call also pays the process's one-time JAX tracing warm-up).
(b) GCG: ``jr.text.run_gcg`` against nanoGCG's ``GCG`` (GraySwanAI/nanoGCG) on the demo's language
    model ported to PyTorch behind a Hugging Face-style interface (``get_input_embeddings``,
    ``model(inputs_embeds=...).logits``) and a word-level ``PreTrainedTokenizerFast`` whose chat
    template is the demo's (``<bos> request: ... response:``): the same prompts, target ("sure
    here is how to do it"), initial suffix, steps, search width, top-k, ``n_replace`` and allowed
    tokens; nanoGCG runs one prompt at a time (its API), jaxrobust all of them in one call and one
    at a time. Reported: the loss reached and the time per step.
    With a prefix cache on both sides (``prefix_fn``, nanoGCG's ``use_prefix_cache``) and a
    longer prompt: ``benchmarks/bench_gcg_cache.py``.

Both peers are optional: without them only the jaxrobust side runs. They were installed into a
separate virtual environment layered over the project's (see benchmarks/RESULTS.md, "Text and
generative (issue #15)"). Two workarounds for that environment, both confined to this script:
the installed torchvision does not load (its C operators are missing), so it is hidden from
transformers' optional-import probe; and TextAttack reads NLTK's English stopwords when
imported, so an empty stand-in corpus is supplied when NLTK has none (no stopword constraint is
used here).

Usage::

    python benchmarks/bench_text.py                         # every part, defaults as recorded
    python benchmarks/bench_text.py --reviews 50 --gcg-steps 5 --gcg-prompts 2   # smoke run
    python benchmarks/bench_text.py --skip word_swap --skip gcg --tf-reviews 1000  # (c) only
    python benchmarks/bench_text.py --skip word_swap --skip gcg --tf-importance delete  # (c2)
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import pathlib
import sys
import tempfile
import time
from types import SimpleNamespace

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repository's jaxrobust, whichever environment runs this
  sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from jaxrobust import text as jr_text  # noqa: E402
from jaxrobust.demo import text_data, text_demo, text_models  # noqa: E402


def load_average() -> str:
  return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def demo_models(language_model: bool = True):
  """The text demo's two models (its default settings; trained and cached if missing); the
  language model only if asked for (``None`` otherwise)."""
  settings = text_demo.DEFAULT_SETTINGS
  classifier, _ = text_models.load_or_train(text_demo.classifier_config(settings))
  if not language_model:
    return classifier, None
  language_model, _ = text_models.load_or_train(text_demo.language_model_config(settings))
  return classifier, language_model


# ------------------------------------------------------------------------------------------------
# PyTorch ports.


def torch_text_cnn(model):
  """The TextCNN in PyTorch, with the same weights."""
  import torch

  class TorchTextCNN(torch.nn.Module):

    def __init__(self):
      super().__init__()
      table = np.asarray(model.embedding)
      kernel = np.asarray(model.conv.kernel[...])  # [width, in, out]
      self.embed = torch.nn.Embedding.from_pretrained(torch.tensor(table), freeze=True)
      self.conv = torch.nn.Conv1d(kernel.shape[1], kernel.shape[2], kernel.shape[0],
                                  padding=kernel.shape[0] // 2)
      self.conv.weight.data = torch.tensor(kernel.transpose(2, 1, 0).copy())
      self.conv.bias.data = torch.tensor(np.asarray(model.conv.bias[...]))
      self.head = torch.nn.Linear(*np.asarray(model.head.kernel[...]).shape)
      self.head.weight.data = torch.tensor(np.asarray(model.head.kernel[...]).T.copy())
      self.head.bias.data = torch.tensor(np.asarray(model.head.bias[...]))

    def forward(self, tokens):
      hidden = torch.relu(self.conv(self.embed(tokens).transpose(1, 2)))
      return self.head(hidden.amax(dim=2))

  return TorchTextCNN().eval()


def torch_linear(layer):
  """A ``torch.nn.Linear`` with the weights of the Flax ``nnx.Linear`` ``layer``."""
  import torch

  kernel = np.asarray(layer.kernel[...])
  out = torch.nn.Linear(*kernel.shape)
  out.weight.data = torch.tensor(kernel.T.copy())
  out.bias.data = torch.tensor(np.asarray(layer.bias[...]))
  return out


def torch_layer_norm(layer):
  """A ``torch.nn.LayerNorm`` with the scale, bias and epsilon of the Flax ``nnx.LayerNorm``."""
  import torch

  out = torch.nn.LayerNorm(layer.scale[...].shape[0], eps=layer.epsilon)
  out.weight.data = torch.tensor(np.asarray(layer.scale[...]))
  out.bias.data = torch.tensor(np.asarray(layer.bias[...]))
  return out


def torch_language_model(model):
  """The TinyCausalLM in PyTorch, same weights, behind the part of the Hugging Face causal-LM
  interface nanoGCG uses (``get_input_embeddings``, ``dtype``, ``device``,
  ``model(inputs_embeds=...).logits``; no KV cache: run nanoGCG with ``use_prefix_cache=False``)."""
  import torch

  linear, norm = torch_linear, torch_layer_norm

  class Block(torch.nn.Module):

    def __init__(self, block):
      super().__init__()
      self.heads = block.heads
      self.norm_attention, self.norm_mlp = norm(block.norm_attention), norm(block.norm_mlp)
      self.qkv, self.out = linear(block.qkv), linear(block.out)
      self.up, self.down = linear(block.up), linear(block.down)

    def forward(self, x):
      batch, length, dim = x.shape
      q, k, v = self.qkv(self.norm_attention(x)).split(dim, dim=-1)
      q, k, v = (a.view(batch, length, self.heads, dim // self.heads).transpose(1, 2)
                 for a in (q, k, v))
      scores = q @ k.transpose(-1, -2) / (dim // self.heads) ** 0.5
      causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
      scores = scores.masked_fill(~causal, -1e9)
      attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, dim)
      x = x + self.out(attended)
      return x + self.down(torch.nn.functional.gelu(self.up(self.norm_mlp(x)),
                                                     approximate="tanh"))

  class TorchTinyLM(torch.nn.Module):

    def __init__(self):
      super().__init__()
      self.embed = torch.nn.Embedding.from_pretrained(torch.tensor(np.asarray(model.embedding)),
                                                      freeze=False)
      self.positions = torch.nn.Parameter(torch.tensor(np.asarray(model.positions[...])))
      self.blocks = torch.nn.ModuleList(Block(b) for b in model.blocks)
      self.norm, self.head = norm(model.norm), linear(model.head)

    @property
    def dtype(self):
      return torch.float32

    @property
    def device(self):
      return torch.device("cpu")

    def get_input_embeddings(self):
      return self.embed

    def forward(self, input_ids=None, inputs_embeds=None, **_):
      x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
      x = x + self.positions[:x.shape[1]]
      for block in self.blocks:
        x = block(x)
      return SimpleNamespace(logits=self.head(self.norm(x)), past_key_values=None)

  return TorchTinyLM().eval()


def import_peers():
  """``(textattack, nanogcg)`` modules, ``None`` for those not installed (or not importable)."""
  find_spec = importlib.util.find_spec
  # This environment's torchvision fails on import; transformers probes for it with find_spec.
  importlib.util.find_spec = lambda name, package=None: (
    None if name.split(".")[0] == "torchvision" else find_spec(name, package))
  modules = {}
  try:
    try:
      import nltk

      try:
        nltk.data.find("corpora/stopwords")
      except LookupError:  # TextAttack reads the stopword list at import; none is used here
        root = pathlib.Path(tempfile.mkdtemp(prefix="nltk_stand_in_"))
        (root / "corpora" / "stopwords").mkdir(parents=True)
        (root / "corpora" / "stopwords" / "english").write_text("")
        nltk.data.path.insert(0, str(root))
    except ImportError:
      pass
    for name in ("textattack", "nanogcg"):
      try:
        modules[name] = __import__(name)
      except Exception as error:  # noqa: BLE001 - report and run without it
        print(f"{name} unavailable: {type(error).__name__}: {error}", file=sys.stderr)
        modules[name] = None
  finally:
    importlib.util.find_spec = find_spec
  return modules["textattack"], modules["nanogcg"]


# ------------------------------------------------------------------------------------------------
# (a) Word swap.


def jax_word_swap(model, corpus, candidates, *, max_swaps, search_width, repeats):
  """jaxrobust's attack on every review in one jitted call; time without compilation (the best
  of ``repeats``) and with it (the first call)."""
  attack = jr_text.word_swap(steps=2 * max_swaps, search_width=search_width)
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, tokens, labels, editable):
    return jr_text.run(attack, nnx.merge(graphdef, state).logits_from_embeddings,
                       nnx.merge(graphdef, state).embedding, tokens, labels, jax.random.key(0),
                       candidates=candidates, max_swaps=max_swaps, editable=editable)

  args = (state, jnp.asarray(corpus.tokens), jnp.asarray(corpus.labels),
          jnp.asarray(corpus.editable))
  t0 = time.perf_counter()
  result = jax.block_until_ready(run(*args))
  first = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(run(*args))
    times.append(time.perf_counter() - t0)
  clean_correct = ~(np.asarray(result.success) & (np.asarray(result.swaps) == 0))
  summary = text_demo.textattack_summary(result, clean_correct, corpus.tokens)
  return {"attack": json.loads(attack.config), "seconds": min(times),
          "seconds_with_compile": first, **_summary_fields(summary),
          "success": np.asarray(result.success).tolist(),
          "swaps": np.asarray(result.swaps).tolist()}


def _summary_fields(summary):
  return {"successful": summary["successful"], "failed": summary["failed"],
          "skipped": summary["skipped"],
          "attack_success_rate": summary["attack_success_rate"]["rate"],
          "attack_success_rate_interval": summary["attack_success_rate"]["interval"],
          "average_perturbed_word_percent": summary["average_perturbed_word_percent"],
          "average_queries": summary["average_queries"]}


def textattack_word_swap(textattack, torch_model, corpus, vocab, *, max_swaps):
  """TextAttack's greedy word swap on every review, one ``attack.attack`` call each."""
  import torch
  from textattack.attack_results import SkippedAttackResult, SuccessfulAttackResult
  from textattack.constraints.overlap import MaxWordsPerturbed
  from textattack.constraints.pre_transformation import RepeatModification
  from textattack.goal_functions import UntargetedClassification
  from textattack.models.wrappers import ModelWrapper
  from textattack.search_methods import GreedySearch
  from textattack.transformations import WordSwap

  index = {w: i for i, w in enumerate(vocab.words)}

  class Wrapper(ModelWrapper):

    def __init__(self):
      self.model = torch_model

    def __call__(self, texts):
      tokens = np.zeros((len(texts), text_data.REVIEW_LENGTH), np.int64)
      for row, text in enumerate(texts):
        ids = [index[w] for w in text.split()]
        tokens[row, :len(ids)] = ids
      with torch.no_grad():
        return self.model(torch.tensor(tokens)).numpy()

  class SynonymSwap(WordSwap):

    def _get_replacement_words(self, word):
      if word not in index:
        return []
      return [vocab.words[c] for c in vocab.candidates[index[word]] if c >= 0]

  attack = textattack.Attack(UntargetedClassification(Wrapper()),
                             [RepeatModification(), MaxWordsPerturbed(max_num_words=max_swaps)],
                             SynonymSwap(), GreedySearch())
  texts = [text_data.decode(row, vocab.words) for row in corpus.tokens]
  t0 = time.perf_counter()
  results = [attack.attack(text, int(label)) for text, label in zip(texts, corpus.labels)]
  seconds = time.perf_counter() - t0
  skipped = np.array([isinstance(r, SkippedAttackResult) for r in results])
  success = np.array([isinstance(r, SuccessfulAttackResult) for r in results]) | skipped
  swaps = np.array([0 if s else len(r.original_result.attacked_text.all_words_diff(
    r.perturbed_result.attacked_text)) for r, s in zip(results, skipped)])
  queries = np.array([r.perturbed_result.num_queries for r in results])
  result = SimpleNamespace(success=success, swaps=swaps, queries=queries)
  summary = text_demo.textattack_summary(result, ~skipped, corpus.tokens)
  return {"search": "GreedySearch (beam width 1)",
          "constraints": ["RepeatModification", f"MaxWordsPerturbed({max_swaps})"],
          "seconds": seconds, **_summary_fields(summary), "success": success.tolist(),
          "swaps": swaps.tolist()}


def bench_word_swap(args, classifier, textattack):
  vocab = text_data.sentiment_vocabulary()
  corpus = text_data.sentiment_splits(0, args.reviews, text_demo.DEFAULT_SETTINGS.seed)[1]
  candidates = jnp.asarray(vocab.candidates)
  out = {"reviews": args.reviews, "max_swaps": args.max_swaps, "jaxrobust": {}}
  for width in args.search_widths:
    out["jaxrobust"][f"search_width_{width}"] = jax_word_swap(
      classifier, corpus, candidates, max_swaps=args.max_swaps, search_width=width,
      repeats=args.repeats)
  if textattack is not None:
    import torch

    torch.set_num_threads(args.torch_threads)
    port = torch_text_cnn(classifier)
    with torch.no_grad():
      ported = port(torch.tensor(corpus.tokens.astype(np.int64))).numpy()
    out["port_max_abs_logit_difference"] = float(np.max(np.abs(
      ported - np.asarray(classifier(jnp.asarray(corpus.tokens))))))
    out["textattack"] = textattack_word_swap(textattack, port, corpus, vocab,
                                             max_swaps=args.max_swaps)
    out["torch_threads"] = args.torch_threads
  return out


# ------------------------------------------------------------------------------------------------
# (c) TextFooler.

ROLES = ("function", "adjective", "verb", "noun", "intensifier")


def textfooler_tables(vocab, seed: int = 0, *, word_noise: float = 0.8,
                      sentence_noise: float = 0.65):
  """The constraints' tables, shared by both sides: word vectors ``[V, 16]`` (the synonym group's
  centroid plus noise, like counter-fitted vectors: 20% of the synonym pairs fall below cosine
  0.5), part-of-speech tags ``[V]`` (the group's role, function words 0: synonyms share a role,
  so this constraint never filters here), and the sentence encoder's weights (word vectors
  ``[V, 32]`` built the same way, a ``[32, 32]`` projection: on the original reviews, 13% of the
  substitutes fall below the similarity threshold over a 5-word window)."""
  rng = np.random.default_rng(seed)
  size = len(vocab.words)

  def grouped(dim, noise):
    centroids = rng.normal(size=(int(vocab.group.max()) + 1, dim))
    own = rng.normal(size=(size, dim))  # function words: a vector of their own
    return np.where((vocab.group >= 0)[:, None], centroids[vocab.group] + noise * own,
                    own).astype(np.float32)

  role = {g: ROLES.index(group.role) for g, group in enumerate(text_data.SYNONYM_GROUPS)}
  tags = np.array([role.get(int(g), 0) for g in vocab.group], np.int32)
  word_vectors = grouped(16, word_noise)
  encoder_words = grouped(32, sentence_noise)
  projection = (rng.normal(size=(32, 32)) / np.sqrt(32)).astype(np.float32)
  return word_vectors, tags, encoder_words, projection


def sorted_candidates(vocab):
  """The synonym lists in TextAttack's order: it sorts a position's substituted texts by their
  text, i.e. by the substitute followed by a space (ties and budget cuts then agree)."""
  table = np.full_like(vocab.candidates, -1)
  for v, row in enumerate(vocab.candidates):
    listed = sorted((c for c in row if c >= 0), key=lambda c: vocab.words[c] + " ")
    table[v, :len(listed)] = listed
  return table


def jax_similarity(encoder_words, projection, width):
  """``sentence_similarity`` for jaxrobust: angular similarity of the mean-pooled, projected
  encodings of the window's words (at most ``width``, the attack's ``window_size``: the window is
  contiguous, so only its words are looked up, as TextAttack encodes only the window's text). The
  reference and its ``K`` substituted texts are encoded in one pass, ``[B, 1 + K, width]``."""
  table, weight = jnp.asarray(encoder_words), jnp.asarray(projection)

  def similarity(reference, substituted, window):
    texts = jnp.concatenate([reference[:, None], substituted], axis=1)  # [B, 1 + K, L]
    slot = jnp.arange(width, dtype=jnp.int32)[None, :]
    at = jnp.minimum(jnp.argmax(window, axis=1).astype(jnp.int32)[:, None] + slot,
                     texts.shape[-1] - 1)  # [B, width]: the window's positions
    inside = (slot < jnp.sum(window, axis=1, dtype=jnp.int32)[:, None]).astype(jnp.float32)
    words = jnp.take_along_axis(texts, at[:, None, :], axis=2)  # [B, 1 + K, width]
    w = inside[:, None, :, None]
    pooled = jnp.sum(table[words] * w, axis=-2) / jnp.maximum(jnp.sum(w, axis=-2), 1.0)
    code = jnp.tanh(pooled @ weight)
    unit = code / jnp.linalg.norm(code, axis=-1, keepdims=True)
    cos = jnp.sum(unit[:, :1] * unit[:, 1:], axis=-1)
    return 1.0 - jnp.arccos(jnp.clip(cos, -1.0, 1.0)) / jnp.pi

  return similarity


# XLA:CPU options a user passes to ``jax.jit(..., compiler_options=...)`` (documented in
# ``jr.text.run_textfooler``): the legacy loop emitters instead of the MLIR fusion emitters, and
# LLVM at -O0. This program compiles about 5x faster (its ~70 kernels cost ~4 ms of CPU each
# instead of ~25-40 ms); its gathers run several times slower.
FAST_COMPILE = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 0}
TF_CONFIGS = {"fast": FAST_COMPILE, "default": None, "O0": {"xla_backend_optimization_level": 0}}


def textfooler_program(model, corpus, vocab, tables, *, importance, window,
                       compiler_options=None):
  """``(run, args, attack)``: jaxrobust's TextFooler on every review as one jitted function of
  the model's state, the data and the constraints' tables (all arguments, none closed over).
  ``compiler_options`` go to ``jax.jit`` (see :data:`FAST_COMPILE`)."""
  word_vectors, tags, encoder_words, projection = tables
  attack = jr_text.textfooler(importance=importance, unk_id=0, pad_id=0, flip_bonus=False,
                              min_cos_sim=0.5, min_similarity=0.840845057, window_size=window)
  graphdef, state = nnx.split(model)

  @functools.partial(jax.jit, compiler_options=compiler_options)
  def run(state, tokens, labels, editable, candidates, word_vectors, tags, encoder_words,
          projection):
    result = jr_text.run_textfooler(
      attack, nnx.merge(graphdef, state), tokens, labels, jax.random.key(0),
      candidates=candidates, editable=editable, word_vectors=word_vectors, pos=tags,
      sentence_similarity=jax_similarity(encoder_words, projection, window or tokens.shape[1]))
    return result, jr_text.textattack_summary(result)

  args = (state, jnp.asarray(corpus.tokens), jnp.asarray(corpus.labels),
          jnp.asarray(corpus.editable), jnp.asarray(sorted_candidates(vocab)),
          jnp.asarray(word_vectors), jnp.asarray(tags), jnp.asarray(encoder_words),
          jnp.asarray(projection))
  return run, args, attack


def jax_textfooler(model, corpus, vocab, tables, *, importance, window, repeats,
                   compiler_options=None):
  """jaxrobust's TextFooler on every review in one jitted call; time of the first call
  (tracing, compilation and the run) and the best of ``repeats`` later calls."""
  run, args, attack = textfooler_program(model, corpus, vocab, tables, importance=importance,
                                         window=window, compiler_options=compiler_options)
  jax.block_until_ready(args)
  t0 = time.perf_counter()
  result, summary = jax.block_until_ready(run(*args))
  first = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(run(*args))
    times.append(time.perf_counter() - t0)
  return {"attack": json.loads(attack.config), "compiler_options": compiler_options,
          "seconds": min(times), "seconds_with_compile": first, **_tf_summary(summary),
          "success": np.asarray(result.success).tolist(),
          "skipped": np.asarray(result.skipped).tolist(),
          "swaps": np.asarray(result.swaps).tolist(),
          "queries": np.asarray(result.queries).tolist(),
          "tokens_adv": np.asarray(result.tokens_adv).tolist()}


def _tf_summary(summary):
  return {k: (float(v) if np.ndim(v) == 0 and np.isfinite(float(v)) else None)
          for k, v in summary._asdict().items()}


def textattack_textfooler(textattack, torch_model, corpus, vocab, tables, *, importance, window):
  """TextAttack's TextFooler recipe from its components (no downloads), one ``attack.attack``
  call per review."""
  import torch
  from textattack.attack_results import SkippedAttackResult, SuccessfulAttackResult
  from textattack.constraints import Constraint
  from textattack.constraints.pre_transformation import (RepeatModification,
                                                          StopwordModification)
  from textattack.constraints.semantics import WordEmbeddingDistance
  from textattack.constraints.semantics.sentence_encoders import SentenceEncoder
  from textattack.goal_functions import UntargetedClassification
  from textattack.models.wrappers import ModelWrapper
  from textattack.search_methods import GreedyWordSwapWIR
  from textattack.shared import WordEmbedding
  from textattack.transformations import WordSwap

  word_vectors, tags, encoder_words, projection = tables
  index = {w: i for i, w in enumerate(vocab.words)}
  table, weight = torch.tensor(encoder_words), torch.tensor(projection)

  class Wrapper(ModelWrapper):

    def __init__(self):
      self.model = torch_model

    def __call__(self, texts):
      tokens = np.zeros((len(texts), text_data.REVIEW_LENGTH), np.int64)
      for row, text in enumerate(texts):
        ids = [index.get(w, 0) for w in text.split()]  # "[UNK]" -> 0, as jaxrobust's unk_id
        tokens[row, :len(ids)] = ids
      with torch.no_grad():
        return self.model(torch.tensor(tokens)).numpy()

  class SynonymSwap(WordSwap):

    def _get_replacement_words(self, word):
      if word not in index:
        return []
      return [vocab.words[c] for c in vocab.candidates[index[word]] if c >= 0]

  class TagTable(Constraint):
    """Part of speech from a table: the substitute's tag must be the original word's."""

    def __init__(self):
      super().__init__(compare_against_original=True)

    def _check_constraint(self, transformed_text, reference_text):
      i = next(iter(transformed_text.attack_attrs["newly_modified_indices"]))
      return tags[index[reference_text.words[i]]] == tags[index[transformed_text.words[i]]]

  class MeanPoolEncoder(SentenceEncoder):
    """The sentence encoder jaxrobust's similarity computes, in PyTorch."""

    def encode(self, sentences):
      out = []
      for sentence in sentences:
        ids = torch.tensor([index[w] for w in sentence.split()], dtype=torch.long)
        out.append(torch.tanh(table[ids].mean(0) @ weight))
      return torch.stack(out)

  embedding = WordEmbedding(word_vectors, index, dict(enumerate(vocab.words)))
  stopwords = set(text_data.FUNCTION_WORDS) - {"<pad>"}
  constraints = [RepeatModification(), StopwordModification(stopwords=stopwords),
                 WordEmbeddingDistance(embedding=embedding, min_cos_sim=0.5), TagTable(),
                 MeanPoolEncoder(threshold=0.840845057, metric="angular",
                                 compare_against_original=False, window_size=window,
                                 skip_text_shorter_than_window=True)]
  goal = UntargetedClassification(Wrapper())
  attack = textattack.Attack(goal, constraints, SynonymSwap(),
                             GreedyWordSwapWIR(wir_method=importance))
  texts = [text_data.decode(row, vocab.words) for row in corpus.tokens]
  results, spent = [], []
  t0 = time.perf_counter()
  for text, label in zip(texts, corpus.labels):
    results.append(attack.attack(text, int(label)))
    spent.append(goal.num_queries)  # every query of this review (see the summary below)
  seconds = time.perf_counter() - t0
  skipped = np.array([isinstance(r, SkippedAttackResult) for r in results])
  success = np.array([isinstance(r, SuccessfulAttackResult) for r in results]) | skipped
  adversarial = np.zeros_like(corpus.tokens)
  for row, r in enumerate(results):
    ids = [index[w] for w in r.perturbed_result.attacked_text.words]
    adversarial[row, :len(ids)] = ids
  swaps = np.sum(adversarial != corpus.tokens, axis=1)
  reported = np.array([r.perturbed_result.num_queries for r in results])
  result = SimpleNamespace(success=success, swaps=swaps, queries=np.array(spent),
                           tokens_adv=adversarial)
  summary = text_demo.textattack_summary(result, ~skipped, corpus.tokens)
  return {"search": f"GreedyWordSwapWIR(wir_method={importance!r})",
          "constraints": [type(c).__name__ for c in constraints], "window_size": window,
          "seconds": seconds, "successful": summary["successful"], "failed": summary["failed"],
          "skipped": summary["skipped"],
          "attack_success_rate": summary["attack_success_rate"]["rate"],
          "accuracy_under_attack": summary["accuracy_under_attack"],
          "average_perturbed_word_percent": summary["average_perturbed_word_percent"],
          "average_queries": summary["average_queries"],
          "average_queries_reported": float(np.mean(reported[~skipped])),
          "success": success.tolist(), "skipped_flags": skipped.tolist(),
          "swaps": swaps.tolist(), "queries": spent, "tokens_adv": adversarial.tolist()}


def bench_textfooler(args, classifier, textattack):
  vocab = text_data.sentiment_vocabulary()
  corpus = text_data.sentiment_splits(0, args.tf_reviews, text_demo.DEFAULT_SETTINGS.seed)[1]
  tables = textfooler_tables(vocab)
  out = {"reviews": args.tf_reviews, "window_size": args.tf_window, "jaxrobust": {}}
  for importance in args.tf_importance:
    for label in args.tf_configs:
      options = TF_CONFIGS[label]
      out["jaxrobust"][f"{importance} {label}"] = jax_textfooler(
        classifier, corpus, vocab, tables, importance=importance, window=args.tf_window,
        repeats=args.repeats, compiler_options=options)
  if textattack is not None:
    import torch

    torch.set_num_threads(args.torch_threads)
    port = torch_text_cnn(classifier)
    with torch.no_grad():
      ported = port(torch.tensor(corpus.tokens.astype(np.int64))).numpy()
    out["port_max_abs_logit_difference"] = float(np.max(np.abs(
      ported - np.asarray(classifier(jnp.asarray(corpus.tokens))))))
    out["textattack"] = {}
    for importance in args.tf_importance:
      out["textattack"][importance] = textattack_textfooler(
        textattack, port, corpus, vocab, tables, importance=importance, window=args.tf_window)
    out["torch_threads"] = args.torch_threads
  return out


# ------------------------------------------------------------------------------------------------
# (b) GCG.


def word_level_tokenizer():
  """A Hugging Face fast tokenizer over the demo's instruction vocabulary (whitespace-split
  words; ``<bos>`` prepended; the demo's template as its chat template)."""
  from tokenizers import Tokenizer, models, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast

  vocab = {w: i for i, w in enumerate(text_data.INSTRUCTION_WORDS)}
  backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
  backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  backend.post_processor = processors.TemplateProcessing(
    single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
  tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>",
                                      eos_token="<eos>", pad_token="<pad>")
  tokenizer.chat_template = ("{% for m in messages %}<bos> request: {{ m['content'] }} response:"
                             "{% endfor %}")
  return tokenizer


def jax_gcg(model, prompts, target, allowed, init, *, steps, width, topk, repeats):
  attack = jr_text.gcg(suffix_length=init.shape[0], steps=steps, search_width=width, topk=topk)
  graphdef, state = nnx.split(model)
  after = text_data.instruction_ids(["response:"])

  @jax.jit
  def run(state, prompt, target, key):
    lm = nnx.merge(graphdef, state)
    return jr_text.run_gcg(attack, lm.logits_from_embeddings, lm.embedding, prompt, target, key,
                           allowed=allowed, init_suffix=init,
                           after_suffix=np.broadcast_to(after, (prompt.shape[0], 1)),
                           context_length=text_data.CONTEXT_LENGTH)

  out = {"attack": json.loads(attack.config)}
  for label, rows in (("batch", slice(None)), ("one_prompt", slice(0, 1))):
    call = (state, jnp.asarray(prompts[rows]), jnp.asarray(target[rows]), jax.random.key(0))
    t0 = time.perf_counter()
    result = jax.block_until_ready(run(*call))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(run(*call))
      times.append(time.perf_counter() - t0)
    out[label] = {"prompts": int(call[1].shape[0]), "seconds": min(times),
                  "seconds_with_compile": first,
                  "seconds_per_step": min(times) / steps,
                  "seconds_per_prompt_step": min(times) / steps / int(call[1].shape[0]),
                  "loss": np.asarray(result.loss).tolist(),
                  "success": np.asarray(result.success).tolist()}
  return out


def nanogcg_runs(nanogcg, model, prompts_text, target_text, disallowed, init_text, *, steps,
                 width, topk, torch_threads, filter_ids, collect_garbage=True):
  import logging

  import torch

  torch.set_num_threads(torch_threads)
  logging.getLogger("nanogcg").setLevel(logging.WARNING)
  tokenizer = word_level_tokenizer()
  port = torch_language_model(model)
  config = nanogcg.GCGConfig(num_steps=steps, search_width=width, topk=topk, n_replace=1,
                             optim_str_init=init_text, use_prefix_cache=False, seed=0,
                             verbosity="WARNING", filter_ids=filter_ids)
  runs = []
  collect = nanogcg.gcg.gc.collect
  for prompt in prompts_text:
    attack = nanogcg.gcg.GCG(port, tokenizer, config)
    attack.not_allowed_ids = torch.tensor(disallowed)  # the same allowed set as jaxrobust's
    if not collect_garbage:  # nanoGCG calls gc.collect() after every candidate batch
      nanogcg.gcg.gc.collect = lambda *_: 0
    try:
      t0 = time.perf_counter()
      result = attack.run(prompt, target_text)
      seconds = time.perf_counter() - t0
    finally:
      nanogcg.gcg.gc.collect = collect
    runs.append({"prompt": prompt, "seconds": seconds, "seconds_per_step": seconds / steps,
                 "best_loss": float(result.best_loss), "best_string": result.best_string})
  return {"config": {"num_steps": steps, "search_width": width, "topk": topk, "n_replace": 1,
                     "optim_str_init": init_text, "use_prefix_cache": False, "seed": 0,
                     "filter_ids": filter_ids}, "gc_collect_per_batch": collect_garbage,
          "torch_threads": torch_threads, "runs": runs,
          "seconds_per_step": float(np.mean([r["seconds_per_step"] for r in runs])),
          "best_loss": [r["best_loss"] for r in runs]}


def bench_gcg(args, language_model, nanogcg):
  prompts, _, names = text_demo.attacked_prompts(True)
  prompts = prompts[:args.gcg_prompts]
  target = np.broadcast_to(text_data.instruction_ids(text_data.COMPLIANCE),
                           (len(prompts), len(text_data.COMPLIANCE)))
  special = set(text_data.SPECIAL_TOKENS)
  allowed = np.array([w not in special for w in text_data.INSTRUCTION_WORDS])
  init_word = "please"
  init = np.full(args.suffix_length, text_data.instruction_ids([init_word])[0], np.int32)
  out = {"prompts": len(prompts), "target": " ".join(text_data.COMPLIANCE),
         "suffix_length": args.suffix_length, "init_suffix": " ".join([init_word] * len(init)),
         "jaxrobust": jax_gcg(language_model, prompts, target, allowed, init,
                              steps=args.gcg_steps, width=args.gcg_width, topk=args.gcg_topk,
                              repeats=args.repeats)}
  if nanogcg is not None:
    words = text_data.INSTRUCTION_WORDS
    texts = [" ".join(words[t] for t in row[2:]) for row in prompts]  # after "<bos> request:"
    # nanoGCG as it is (filter_ids: decode and re-tokenize every candidate, a Python loop that
    # real tokenizers need, a no-op for this word-level vocabulary; and a full gc.collect() after
    # every candidate batch, whose cost grows with the process's heap), then without each.
    variants = (("nanogcg", True, True), ("nanogcg_no_filter_ids", False, True),
                ("nanogcg_no_filter_ids_no_gc", False, False))
    for key, filter_ids, collect_garbage in variants:
      out[key] = nanogcg_runs(
        nanogcg, language_model, texts, " ".join(text_data.COMPLIANCE),
        np.flatnonzero(~allowed).tolist(), " ".join([init_word] * len(init)),
        steps=args.gcg_steps, width=args.gcg_width, topk=args.gcg_topk,
        torch_threads=args.torch_threads, filter_ids=filter_ids,
        collect_garbage=collect_garbage)
    import torch

    port = torch_language_model(language_model)
    tokens = np.asarray(prompts, np.int64)
    with torch.no_grad():
      ported = port(torch.tensor(tokens)).logits.numpy()
    out["port_max_abs_logit_difference"] = float(np.max(np.abs(
      ported - np.asarray(language_model(jnp.asarray(prompts))))))
  return out


# ------------------------------------------------------------------------------------------------


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--reviews", type=int, default=200)
  parser.add_argument("--max-swaps", type=int, default=4)
  parser.add_argument("--search-widths", type=int, nargs="+", default=[16, 64],
                      help="jaxrobust's search widths (64 covers every move: exhaustive greedy)")
  parser.add_argument("--gcg-prompts", type=int, default=4)
  parser.add_argument("--gcg-steps", type=int, default=50)
  parser.add_argument("--gcg-width", type=int, default=512, help="nanoGCG's default")
  parser.add_argument("--gcg-topk", type=int, default=32,
                      help="nanoGCG's default 256 exceeds the 38 allowed tokens")
  parser.add_argument("--suffix-length", type=int, default=6)
  parser.add_argument("--torch-threads", type=int, default=1)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--tf-reviews", type=int, default=1000, help="(c)'s held-out reviews")
  parser.add_argument("--tf-window", type=int, default=5,
                      help="(c)'s similarity window (the recipe's 15 exceeds most reviews, which "
                           "would skip the check)")
  parser.add_argument("--tf-configs", nargs="+", default=list(TF_CONFIGS),
                      choices=list(TF_CONFIGS),
                      help="(c)'s jaxrobust compile options, in this order (the first call of the "
                           "first also pays the process's one-time JAX tracing warm-up): fast = "
                           "FAST_COMPILE, default = XLA's defaults, O0 = LLVM -O0 only")
  parser.add_argument("--tf-importance", nargs="+", default=["delete", "unk"],
                      choices=["delete", "unk"])
  parser.add_argument("--skip", choices=["word_swap", "gcg", "textfooler"], action="append",
                      default=[])
  parser.add_argument("--out", type=pathlib.Path, default=None)
  args = parser.parse_args(argv)

  report = {"load_before": load_average(), "jax": jax.__version__,
            "command": ["python", "benchmarks/bench_text.py", *(argv or sys.argv[1:])]}
  textattack, nanogcg = import_peers()
  classifier, language_model = demo_models(language_model="gcg" not in args.skip)
  if "word_swap" not in args.skip:
    report["word_swap"] = bench_word_swap(args, classifier, textattack)
    report["load_after_word_swap"] = load_average()
  if "textfooler" not in args.skip:
    report["textfooler"] = bench_textfooler(args, classifier, textattack)
    report["load_after_textfooler"] = load_average()
  if "gcg" not in args.skip:
    report["gcg"] = bench_gcg(args, language_model, nanogcg)
  report["load_after"] = load_average()
  print_summary(report)
  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


def print_summary(report):
  print(f"load before {report['load_before']}, after {report['load_after']}")
  if "word_swap" in report:
    ws = report["word_swap"]
    print(f"\n(a) word swap, {ws['reviews']} reviews, max {ws['max_swaps']} swaps")
    if "textattack" in ws:
      ta = ws["textattack"]
      for name, r in ws["jaxrobust"].items():
        same = np.mean(np.array(r["success"]) == np.array(ta["success"]))
        swaps = np.mean(np.array(r["swaps"]) == np.array(ta["swaps"]))
        print(f"  {name} vs TextAttack: same success on {same:.1%} of reviews, same swap count "
              f"on {swaps:.1%}; compile {r['seconds_with_compile'] - r['seconds']:.1f} s")
    rows = [(f"jaxrobust {k}", v) for k, v in ws["jaxrobust"].items()]
    if "textattack" in ws:
      rows.append((f"TextAttack greedy ({ws['torch_threads']} torch thread)", ws["textattack"]))
      print(f"port max |logit diff| {ws['port_max_abs_logit_difference']:.2e}")
    for name, r in rows:
      attacked = r["successful"] + r["failed"]
      print(f"  {name:38s} ASR {r['attack_success_rate']:.4f} ({r['successful']}/{attacked}), "
            f"perturbed {r['average_perturbed_word_percent']:.1f}%, queries "
            f"{r['average_queries']:.1f}, {r['seconds']:.2f} s")
  if "textfooler" in report:
    print_textfooler(report["textfooler"])
  if "gcg" in report:
    g = report["gcg"]
    j = g["jaxrobust"]
    print(f"\n(b) GCG, {g['prompts']} prompts, {j['attack']['steps']} steps, width "
          f"{j['attack']['search_width']}, top-k {j['attack']['topk']}")
    for label in ("batch", "one_prompt"):
      r = j[label]
      print(f"  jaxrobust {label:10s}: {1e3 * r['seconds_per_step']:.1f} ms/step "
            f"({1e3 * r['seconds_per_prompt_step']:.1f} ms per prompt-step), mean loss "
            f"{np.mean(r['loss']):.4f}")
    for key in ("nanogcg", "nanogcg_no_filter_ids", "nanogcg_no_filter_ids_no_gc"):
      if key in g:
        n = g[key]
        print(f"  {key} ({n['torch_threads']} torch thread): {1e3 * n['seconds_per_step']:.1f} "
              f"ms per prompt-step, mean best loss {np.mean(n['best_loss']):.4f}")
    if "port_max_abs_logit_difference" in g:
      print(f"  port max |logit diff| {g['port_max_abs_logit_difference']:.2e}")


def print_textfooler(tf):
  print(f"\n(c) TextFooler, {tf['reviews']} reviews, similarity window {tf['window_size']}")
  if "port_max_abs_logit_difference" in tf:
    print(f"  port max |logit diff| {tf['port_max_abs_logit_difference']:.2e}")
  for name, ours in tf["jaxrobust"].items():
    importance = name.split()[0]
    rows = [(f"jaxrobust {name}", ours)]
    if "textattack" in tf:
      peer = tf["textattack"][importance]
      rows.append((f"TextAttack {importance} ({tf['torch_threads']} torch thread)", peer))
      same = lambda key: np.mean(np.array(ours[key]) == np.array(peer[key]))
      adversarial = np.mean(np.all(np.array(ours["tokens_adv"]) == np.array(peer["tokens_adv"]),
                                   axis=1))
      print(f"  {name}: same success on {same('success'):.1%} of reviews, same adversarial "
            f"text on {adversarial:.1%}, same swaps on {same('swaps'):.1%}, same queries on "
            f"{same('queries'):.1%}; queries ratio "
            f"{ours['average_queries'] / peer['average_queries']:.3f}, time ratio "
            f"{ours['seconds_with_compile'] / peer['seconds']:.3f} with compilation, "
            f"{ours['seconds'] / peer['seconds']:.4f} without")
    for name, r in rows:
      print(f"    {name:36s} ASR {r['attack_success_rate']:.4f} ({r['successful']:.0f}/"
            f"{r['successful'] + r['failed']:.0f}), after-attack accuracy "
            f"{r['accuracy_under_attack']:.4f}, perturbed {r['average_perturbed_word_percent']:.1f}"
            f"%, queries {r['average_queries']:.2f}, {r['seconds']:.2f} s"
            + (f" ({r['seconds_with_compile']:.2f} s with compilation)"
               if "seconds_with_compile" in r else "")
            + (f"; TextAttack's reported queries {r['average_queries_reported']:.2f}"
               if "average_queries_reported" in r else ""))


if __name__ == "__main__":
  main()
