"""GCG with a prefix cache (issue #28, item 4): time per prompt-step of ``jr.text.run_gcg`` with
``prefix_fn`` (the prompt's keys and values computed once) against the same attack on whole
sequences and against nanoGCG (GraySwanAI/nanoGCG) with and without its own prefix cache
(``use_prefix_cache``), on the same model weights in one process.

Two settings:

* ``demo``: the text demo's trained 2-layer 32-wide causal LM and its first forbidden requests
  (``<bos> request: please VERB OBJECT``: a 5-token prompt), suffix of 6 tokens, the template's
  ``response:`` after it and the 7-token target "sure here is how to do it" (the setting of
  ``bench_text.py`` (b)); the prompt is 5 of the 19 tokens, so a cache can save little.
* ``long``: the same architecture at random weights with a longer context, prompts of
  ``--long-prompt`` tokens (``<bos> request:`` and random words), the same suffix, template and
  target: the prompt dominates the sequence, which is where a cache pays.

nanoGCG runs one prompt at a time (its API) on a PyTorch port of the model (weights copied,
logits checked equal) that also takes and returns Hugging Face's legacy key/value cache
(``past_key_values``, per layer ``(keys, values)`` of ``[N, H, P, D/H]``), with
``filter_ids=False`` (its per-step decode and re-tokenisation of every candidate, a no-op for
this word-level vocabulary) and its per-batch ``gc.collect()`` disabled, so that both sides do the
same arithmetic per scored row; ``--nanogcg-as-shipped`` adds one run with both on. The cached
runs use the port twice: attention written out (Hugging Face's "eager") and with PyTorch's
``scaled_dot_product_attention`` (Hugging Face's default); the ratios take the faster.
jaxrobust scores each distinct candidate once (``gcg(dedupe=True)``, its default: here at most
``suffix_length * topk`` = 192 rows of the 512 draws) and, cached, also every draw
(``dedupe=False``: nanoGCG's arithmetic, like for like; ``--skip-all-draws`` leaves it out);
nanoGCG scores all 512; in chunks, jaxrobust also skips the chunks past the distinct candidates
drawn, which saves passes with ``--suffix-length 20`` too (640 possible, ~352 drawn). Both sides run with all
(distinct) candidates in one pass (their default) and in chunks of ``--chunk-size``
(jaxrobust's ``chunk_size``, nanoGCG's ``batch_size``): on a CPU the chunks' working set fits the
caches. jaxrobust runs one prompt per call (and, chunked, all prompts in one call); time of the
best of ``--repeats`` calls after a compiling one. Reported beside each time: the rows a step
scores on each side, the model passes of a step without dedupe (the gradient pass and the
``search_width`` candidates) and the tokens they run, and the load average.

Usage::

    /tmp/gcg_venv/bin/python benchmarks/bench_gcg_cache.py      # 19-21 min wall, 2 cores at load 10
    python benchmarks/bench_gcg_cache.py --steps 3 --prompts 1  # smoke run, jaxrobust only
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import pathlib
import sys
import time
from types import SimpleNamespace

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))
if str(ROOT / "benchmarks") not in sys.path:
  sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from bench_text import (demo_models, import_peers, load_average, torch_layer_norm,  # noqa: E402
                        torch_linear, word_level_tokenizer)
from jaxrobust import text as jr_text  # noqa: E402
from jaxrobust.demo import text_data, text_demo, text_models  # noqa: E402


def problems(args):
  """``{setting: (model, prompts [B, P], target [B, T], allowed [V], init [S])}``."""
  words = text_data.INSTRUCTION_WORDS
  special = set(text_data.SPECIAL_TOKENS)
  allowed = np.array([w not in special for w in words])
  target = np.broadcast_to(text_data.instruction_ids(text_data.COMPLIANCE),
                           (args.prompts, len(text_data.COMPLIANCE)))
  init = np.full(args.suffix_length, text_data.instruction_ids(["please"])[0], np.int32)
  _, demo_lm = demo_models()
  demo_prompts = text_demo.attacked_prompts(True)[0][:args.prompts]
  rng = np.random.default_rng(0)
  head = text_data.instruction_ids(["<bos>", "request:"])
  body = rng.choice(np.flatnonzero(allowed), (args.prompts, args.long_prompt - head.size))
  long_prompts = np.concatenate([np.broadcast_to(head, (args.prompts, head.size)), body], axis=1)
  context = args.long_prompt + args.suffix_length + 1 + target.shape[1]
  config = text_models.language_model_config()
  long_lm = text_models.TinyCausalLM(len(words), context_length=context, dim=config["dim"],
                                     heads=config["heads"], layers=config["layers"],
                                     rngs=nnx.Rngs(0))
  return {"demo": (demo_lm, demo_prompts, target, allowed, init),
          "long": (long_lm, long_prompts.astype(np.int32), target, allowed, init)}


def jax_runs(model, prompts, target, allowed, init, *, cached, chunk_size, batch, args,
             dedupe=True):
  attack = jr_text.gcg(suffix_length=init.size, steps=args.steps, search_width=args.width,
                       topk=args.topk, chunk_size=chunk_size, dedupe=dedupe)
  graphdef, state = nnx.split(model)
  after = text_data.instruction_ids(["response:"])

  @jax.jit
  def run(state, prompt, target, allowed, init, key):
    lm = nnx.merge(graphdef, state)
    options = dict(allowed=allowed, init_suffix=init, context_length=lm.context_length,
                   after_suffix=jnp.broadcast_to(jnp.asarray(after), (prompt.shape[0], 1)))
    if cached:
      return jr_text.run_gcg(attack, lm.logits_after_prefix, lm.embedding, prompt, target, key,
                             prefix_fn=lm.prefix_cache, **options)
    return jr_text.run_gcg(attack, lm.logits_from_embeddings, lm.embedding, prompt, target, key,
                           **options)

  out = {}
  labels = (("one_prompt", slice(0, 1)),) + ((("batch", slice(None)),) if batch else ())
  for label, rows in labels:
    call = (state, jnp.asarray(prompts[rows]), jnp.asarray(target[rows]), jnp.asarray(allowed),
            jnp.asarray(init), jax.random.key(0))
    t0 = time.perf_counter()
    result = jax.block_until_ready(run(*call))
    first = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(run(*call))
      times.append(time.perf_counter() - t0)
    num = int(call[1].shape[0])
    out[label] = {"prompts": num, "seconds": min(times), "compile_seconds": first - min(times),
                  "dedupe": dedupe,  # an upper bound with dedupe and chunks (chunks of repeats are skipped)
                  "rows_per_prompt_step": attack.scored_rows + 1,
                  "ms_per_prompt_step": 1e3 * min(times) / args.steps / num,
                  "loss": np.asarray(result.loss).tolist(),
                  "suffix": np.asarray(result.suffix).tolist(), "load": load_average()}
  return out


def torch_cached_language_model(model, attention: str = "matmul"):
  """The TinyCausalLM in PyTorch, same weights, behind the part of the Hugging Face causal-LM
  interface nanoGCG uses, key/value cache included: ``model(inputs_embeds=...,
  past_key_values=..., use_cache=...)`` returns ``.logits`` and ``.past_key_values`` (per layer
  ``(keys, values)`` ``[N, H, P, D/H]``; a cache of one row is broadcast over the inputs' rows).
  ``attention``: ``"matmul"`` (scores, mask, softmax and product written out, Hugging Face's
  "eager" attention) or ``"sdpa"`` (``torch.nn.functional.scaled_dot_product_attention`` with
  the same boolean mask, Hugging Face's default attention implementation)."""
  import torch

  if attention not in ("matmul", "sdpa"):
    raise ValueError(f"attention must be 'matmul' or 'sdpa', not {attention!r}")

  linear, norm = torch_linear, torch_layer_norm

  class Block(torch.nn.Module):

    def __init__(self, block):
      super().__init__()
      self.heads = block.heads
      self.norm_attention, self.norm_mlp = norm(block.norm_attention), norm(block.norm_mlp)
      self.qkv, self.out, self.up, self.down = (linear(block.qkv), linear(block.out),
                                                linear(block.up), linear(block.down))

    def forward(self, x, past):
      rows, length, dim = x.shape
      q, k, v = (a.view(rows, length, self.heads, dim // self.heads).transpose(1, 2)
                 for a in self.qkv(self.norm_attention(x)).split(dim, dim=-1))
      start = 0
      if past is not None:
        start = past[0].shape[2]
        k = torch.cat([past[0].expand(rows, -1, -1, -1), k], dim=2)
        v = torch.cat([past[1].expand(rows, -1, -1, -1), v], dim=2)
      visible = torch.ones(length, start + length, dtype=torch.bool).tril(diagonal=start)
      if attention == "sdpa":
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible)
      else:
        scores = q @ k.transpose(-1, -2) / (dim // self.heads) ** 0.5
        attended = (scores.masked_fill(~visible, -1e9).softmax(-1) @ v)
      x = x + self.out(attended.transpose(1, 2).reshape(rows, length, dim))
      x = x + self.down(torch.nn.functional.gelu(self.up(self.norm_mlp(x)), approximate="tanh"))
      return x, (k, v)

  class TorchCachedLM(torch.nn.Module):

    def __init__(self):
      super().__init__()
      self.embed = torch.nn.Embedding.from_pretrained(torch.tensor(np.asarray(model.embedding)),
                                                      freeze=False)
      self.positions = torch.nn.Parameter(torch.tensor(np.asarray(model.positions[...])))
      self.blocks = torch.nn.ModuleList(Block(b) for b in model.blocks)
      self.norm, self.head = norm(model.norm), linear(model.head)
      self.dtype, self.device = torch.float32, torch.device("cpu")

    def get_input_embeddings(self):
      return self.embed

    def forward(self, input_ids=None, inputs_embeds=None, past_key_values=None, use_cache=False,
                **_):
      x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
      start = 0 if not past_key_values else past_key_values[0][0].shape[2]
      x = x + self.positions[start:start + x.shape[1]]
      cache = []
      for i, block in enumerate(self.blocks):
        x, keys = block(x, past_key_values[i] if past_key_values else None)
        cache.append(keys)
      return SimpleNamespace(logits=self.head(self.norm(x)),
                             past_key_values=tuple(cache) if use_cache else None)

  return TorchCachedLM().eval()


def nanogcg_runs(nanogcg, model, prompts, *, cached, batch_size, as_shipped, args,
                 attention="matmul"):
  import logging

  import torch

  torch.set_num_threads(args.torch_threads)
  logging.getLogger("nanogcg").setLevel(logging.WARNING)
  words = text_data.INSTRUCTION_WORDS
  special = set(text_data.SPECIAL_TOKENS)
  disallowed = [i for i, w in enumerate(words) if w in special]
  port = torch_cached_language_model(model, attention)
  config = nanogcg.GCGConfig(num_steps=args.steps, search_width=args.width, topk=args.topk,
                             n_replace=1, optim_str_init=" ".join(["please"] * args.suffix_length),
                             use_prefix_cache=cached, seed=0, verbosity="WARNING",
                             filter_ids=as_shipped, batch_size=batch_size)
  runs, collect = [], nanogcg.gcg.gc.collect
  # One untimed step first: torch's first passes of a shape (allocations, thread pool) are slow.
  warm = dataclasses.replace(config, num_steps=1)
  for row, timed in [(prompts[0], False)] + [(row, True) for row in prompts]:
    attack = nanogcg.gcg.GCG(port, word_level_tokenizer(), config if timed else warm)
    attack.not_allowed_ids = torch.tensor(disallowed)
    if not as_shipped:
      nanogcg.gcg.gc.collect = lambda *_: 0
    try:
      t0 = time.perf_counter()
      result = attack.run(" ".join(words[t] for t in row[2:]), " ".join(text_data.COMPLIANCE))
      seconds = time.perf_counter() - t0
    finally:
      nanogcg.gcg.gc.collect = collect
    if timed:
      runs.append({"ms_per_step": 1e3 * seconds / args.steps,
                 "rows_per_step": args.width + 1,  # every draw and the gradient pass
                   "best_loss": float(result.best_loss)})
  return {"use_prefix_cache": cached, "filter_ids_and_gc": as_shipped, "runs": runs,
          "batch_size": batch_size, "attention": attention,
          "ms_per_prompt_step": float(np.mean([r["ms_per_step"] for r in runs])),
          "load": load_average()}


def port_error(model, prompts, attention="matmul"):
  """Max |logit difference| of the PyTorch port against the JAX model, whole and cached."""
  import torch

  port = torch_cached_language_model(model, attention)
  tokens = torch.tensor(np.asarray(prompts, np.int64))
  split = prompts.shape[1] // 2
  with torch.no_grad():
    whole = port(tokens).logits.numpy()
    past = port(tokens[:, :split], use_cache=True).past_key_values
    after = port(tokens[:, split:], past_key_values=past).logits.numpy()
  reference = np.asarray(model(jnp.asarray(prompts)))
  return float(max(np.abs(whole - reference).max(), np.abs(after - reference[:, split:]).max()))


def passes(prompt_length, args):
  """Model passes of one prompt-step and the tokens they run, with and without the cache."""
  after = args.suffix_length + 1 + len(text_data.COMPLIANCE)
  sequences = args.width + 1  # the candidates and the gradient pass
  return {"sequences": sequences, "tokens_whole": sequences * (prompt_length + after),
          "tokens_cached": sequences * after}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--prompts", type=int, default=4)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--width", type=int, default=512, help="nanoGCG's default")
  parser.add_argument("--topk", type=int, default=32,
                      help="nanoGCG's default 256 exceeds the allowed tokens")
  parser.add_argument("--suffix-length", type=int, default=6)
  parser.add_argument("--long-prompt", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--torch-threads", type=int, default=1)
  parser.add_argument("--nanogcg-prompts", type=int, default=1)
  parser.add_argument("--chunk-size", type=int, default=128,
                      help="the second candidate chunk size timed on both sides (besides all "
                           "search_width candidates in one pass, both sides' default)")
  parser.add_argument("--nanogcg-as-shipped", action="store_true")
  parser.add_argument("--skip-nanogcg", action="store_true")
  parser.add_argument("--skip-all-draws", action="store_true",
                      help="skip jaxrobust's cached runs with dedupe=False (every one of the "
                           "--width draws scored, as nanoGCG does)")
  parser.add_argument("--settings", nargs="+", choices=["demo", "long"], default=["demo", "long"])
  parser.add_argument("--out", type=pathlib.Path, default=None)
  args = parser.parse_args(argv)
  report = {"command": ["python", "benchmarks/bench_gcg_cache.py", *(argv or sys.argv[1:])],
            "jax": jax.__version__, "load_before": load_average(), "settings": {}}
  nanogcg = None if args.skip_nanogcg else import_peers()[1]
  for name, (model, prompts, target, allowed, init) in problems(args).items():
    if name not in args.settings:
      continue
    out = {"prompt_length": int(prompts.shape[1]), "passes": passes(prompts.shape[1], args)}
    chunks = {"all": None, "chunked": args.chunk_size}
    for (chunk, size), cached in itertools.product(chunks.items(), (True, False)):
      out[f"jaxrobust_{'cached' if cached else 'whole'}_{chunk}"] = jax_runs(
        model, prompts, target, allowed, init, cached=cached, chunk_size=size,
        batch=size is not None, args=args)
      if cached and not args.skip_all_draws:  # like-for-like: every draw scored, as nanoGCG
        out[f"jaxrobust_cached_{chunk}_all_draws"] = jax_runs(
          model, prompts, target, allowed, init, cached=True, chunk_size=size, batch=False,
          args=args, dedupe=False)
    if nanogcg is not None:
      out["port_max_abs_logit_difference"] = port_error(model, prompts)
      out["sdpa_port_max_abs_logit_difference"] = port_error(model, prompts, "sdpa")
      few = prompts[:args.nanogcg_prompts]
      for (chunk, size), cached in itertools.product(chunks.items(), (True, False)):
        out[f"nanogcg_{'cached' if cached else 'whole'}_{chunk}"] = nanogcg_runs(
          nanogcg, model, few, cached=cached, batch_size=size, as_shipped=False, args=args)
        if cached:  # the port with PyTorch's fused attention too; the faster one is the peer
          out[f"nanogcg_cached_{chunk}_sdpa"] = nanogcg_runs(
            nanogcg, model, few, cached=True, batch_size=size, as_shipped=False, args=args,
            attention="sdpa")
      if args.nanogcg_as_shipped:
        out["nanogcg_cached_all_as_shipped"] = nanogcg_runs(
          nanogcg, model, few[:1], cached=True, batch_size=None, as_shipped=True, args=args)
    report["settings"][name] = out
  report["load_after"] = load_average()
  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
  print_summary(report)


def print_summary(report):
  print(f"load before {report['load_before']}, after {report['load_after']}")
  for name, out in report["settings"].items():
    p = out["passes"]
    print(f"\n{name}: prompt {out['prompt_length']} tokens; per prompt-step {p['sequences']} "
          f"sequences, {p['tokens_whole']} tokens whole, {p['tokens_cached']} after the prompt")
    if "port_max_abs_logit_difference" in out:
      print(f"  port max |logit diff| {out['port_max_abs_logit_difference']:.1e}"
            + (f" (sdpa port {out['sdpa_port_max_abs_logit_difference']:.1e})"
               if "sdpa_port_max_abs_logit_difference" in out else ""))
    for chunk in ("all", "chunked"):
      cached, whole = out[f"jaxrobust_cached_{chunk}"], out[f"jaxrobust_whole_{chunk}"]
      for label in cached:
        c, w = cached[label], whole[label]
        gap = np.max(np.abs(np.array(c["loss"]) - np.array(w["loss"])))
        print(f"  jaxrobust {chunk} {label} ({c['prompts']}): cached "
              f"{c['ms_per_prompt_step']:.1f} ms, whole {w['ms_per_prompt_step']:.1f} ms per "
              f"prompt-step (ratio {c['ms_per_prompt_step'] / w['ms_per_prompt_step']:.2f}); "
              f"at most {c.get('rows_per_prompt_step', '?')} rows per prompt-step (dedupe "
              f"skips chunks past the distinct candidates); "
              f"same suffixes {c['suffix'] == w['suffix']}, max |loss diff| {gap:.1e}, mean "
              f"loss {np.mean(c['loss']):.4f}; compile {c['compile_seconds']:.1f} s; load "
              f"{c['load']}")
      if f"jaxrobust_cached_{chunk}_all_draws" in out:
        c, a = cached["one_prompt"], out[f"jaxrobust_cached_{chunk}_all_draws"]["one_prompt"]
        print(f"  jaxrobust {chunk} one_prompt cached, every draw scored (dedupe=False): "
              f"{a['ms_per_prompt_step']:.1f} ms per prompt-step, {a['rows_per_prompt_step']} "
              f"rows; same suffixes as dedupe {a['suffix'] == c['suffix']}, losses bitwise "
              f"equal {a['loss'] == c['loss']}; load {a['load']}")
    for key, n in out.items():
      if key.startswith("nanogcg"):
        print(f"  {key}: {n['ms_per_prompt_step']:.1f} ms per prompt-step, "
              f"{n['runs'][0].get('rows_per_step', '?')} rows per step, mean best loss "
              f"{np.mean([r['best_loss'] for r in n['runs']]):.4f}; load {n['load']}")
    if "nanogcg_cached_all" in out:
      def peer_ms(chunk):  # the faster of the two ports' attention
        return min(out[key]["ms_per_prompt_step"] for key in
                   (f"nanogcg_cached_{chunk}", f"nanogcg_cached_{chunk}_sdpa") if key in out)

      best_peer = min(peer_ms(c) for c in ("all", "chunked"))
      for chunk in ("all", "chunked"):
        ours = out[f"jaxrobust_cached_{chunk}"]["one_prompt"]["ms_per_prompt_step"]
        peer = peer_ms(chunk)
        print(f"  ratio jaxrobust cached / nanoGCG cached, {chunk}: {ours / peer:.2f} (vs "
              f"nanoGCG's faster chunking: {ours / best_peer:.2f})")
        if f"jaxrobust_cached_{chunk}_all_draws" in out:
          alike = out[f"jaxrobust_cached_{chunk}_all_draws"]["one_prompt"]["ms_per_prompt_step"]
          print(f"    every draw scored (dedupe=False, like-for-like arithmetic), {chunk}: "
                f"{alike / peer:.2f} (vs nanoGCG's faster chunking: {alike / best_peer:.2f})")


if __name__ == "__main__":
  main()
