"""The tables that ``jaxrobust demo --text`` prints: :func:`format_report` turns the report of
:func:`jaxrobust.demo.text_demo.run` (a JSON-serialisable dict) into the human-readable summary:
the robust accuracy at each number of word swaps with its 95% interval, the attack's summary in
TextAttack's terms (and the black-box TextFooler's beside it), and the jailbreak success rates
with no suffix, a random one and GCG's, beside GCG's target success under teacher forcing."""

from __future__ import annotations

from typing import Any


def _percent(interval: list[float]) -> str:
  return f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def format_report(report: dict[str, Any]) -> str:
  """The human-readable summary of a text demo report."""
  swap, jail = report["word_swap"], report["jailbreak"]
  ta = swap["textattack"]
  lines = [
    "SYNTHETIC data: generated from templates and word lists (jaxrobust.demo.text_data).",
    "",
    f"Sentiment TextCNN on {swap['num_test_examples']} held-out reviews; word swaps with synonym "
    f"substitutes only",
    f"({swap['attack']['steps']} greedy steps, {swap['attack']['search_width']} re-scored per "
    "step):",
    "",
    f"{'swaps':>8}{'robust accuracy':>18}{'95% interval':>20}",
  ]
  for k, acc, ci in zip(swap["budgets"], swap["robust_accuracy"],
                        swap["robust_accuracy_interval"]):
    lines.append(f"{k:>8}{acc:>18.4f}{_percent(ci):>20}")
  asr = ta["attack_success_rate"]
  words = ta["average_perturbed_word_percent"]
  queries = ta["average_queries"]
  lines += [
    "",
    f"TextAttack summary (at {swap['max_swaps']} swaps): {ta['successful']} successful, "
    f"{ta['failed']} failed, {ta['skipped']} skipped;",
    f"  original accuracy {ta['original_accuracy']:.4f}, accuracy under attack "
    f"{ta['accuracy_under_attack']:.4f}, attack success rate {asr['rate']:.4f} "
    f"{_percent(asr['interval'])};",
    f"  average perturbed words {'-' if words is None else f'{words:.1f}%'}, words per input "
    f"{ta['average_words_per_input']:.1f}, queries {'-' if queries is None else f'{queries:.1f}'}",
  ]
  for example in swap["examples"][:1]:
    lines += [f"  e.g. '{example['original']}'", f"    -> '{example['adversarial']}' (label "
              f"{'positive' if example['label'] else 'negative'}, {example['swaps']} swaps)"]
  if "textfooler" in report:  # reports written before the black-box attack have none
    fooler = report["textfooler"]["textattack"]
    rate, words = fooler["attack_success_rate"], fooler["average_perturbed_word_percent"]
    queries = fooler["average_queries"]
    lines += [
      "",
      f"TextFooler, black box (deletion importance, at {report['textfooler']['max_swaps']} "
      f"swaps): {fooler['successful']} successful, {fooler['failed']} failed;",
      f"  accuracy under attack {fooler['accuracy_under_attack']:.4f}, attack success rate "
      f"{rate['rate']:.4f} {_percent(rate['interval'])}, average perturbed words "
      f"{'-' if words is None else f'{words:.1f}%'}, queries "
      f"{'-' if queries is None else f'{queries:.1f}'}",
    ]
  help_ = jail["helpfulness"]
  lines += [
    "",
    f"Tiny causal LM trained to refuse {len(jail['forbidden_behaviours'])} forbidden behaviours "
    f"(it answers {help_['hits']}/{help_['total']} allowed requests);",
    f"jailbreak success over {jail['num_prompts']} forbidden requests, judged by a string rule on "
    "greedy decoding",
    f"(the response starts with '{jail['target']}' and has no refusal word):",
    "",
    f"{'suffix':>16}{'success rate':>15}{'95% interval':>20}{'per behaviour':>15}",
  ]
  for name, label in (("no_suffix", "none (clean)"), ("random_suffix", "random"),
                      ("gcg_suffix", "GCG")):
    r = jail[name]
    lines.append(f"{label:>16}{r['rate']:>15.4f}{_percent(r['interval']):>20}"
                 f"{r['per_behaviour_average']['rate']:>15.4f}")
  target = jail["gcg_target_success"]
  lines += [
    "",
    f"GCG ({jail['attack']['steps']} steps, {jail['attack']['suffix_length']}-token suffix, "
    f"width {jail['attack']['search_width']}, top-k {jail['attack']['topk']}, early stop):",
    f"  target reached under teacher forcing on {target['hits']}/{target['total']}, mean target "
    f"loss {jail['gcg_mean_loss']:.3f}",
  ]
  for example in jail["examples"][:1]:
    lines += [f"  e.g. '{example['request']} {example['suffix']} response:'",
              f"    -> '{example['response']}'"]
  return "\n".join(lines)
