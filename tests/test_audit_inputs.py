"""Inputs an audit found accepted silently are refused with a ValueError or TypeError that says what
was wrong (the observed values) and how to fix it: histogram_mean's counts and values, the
classifier judge's threshold and abstention margin, textattack_summary's words, certified counts
and empty attack sets in reports, and ``jaxrobust compare``'s ``--out`` and malformed report
files. Judges that answer with NumPy or JAX scalars are read as the values they hold, and a host
judge whose every answer is unscored warns once. Valid inputs still give the documented numbers,
under ``jax.jit`` too where the function is jittable; value checks run on concrete inputs only
(inside ``jax.jit`` the values are tracers), shape and dtype checks always."""

from __future__ import annotations

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust import cli, metrics, text

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

NAN = float("nan")


# ------------------------------------------------------------------------------------------------
# metrics.histogram_mean: counts are whole numbers >= 0, values lie in [0, 1].


@pytest.mark.parametrize("counts, values, match", [
    ([-5, 10], [0.0, 1.0], r"counts must be whole numbers >= 0 .*got 1 of 2 entries that are "
                           r"not: counts\[0\] = -5\. Pass integer counts"),
    ([0.5, 0.5], [0.0, 1.0], r"counts\[0\] = 0\.5, counts\[1\] = 0\.5\."),
    ([3.0, NAN], [0.0, 1.0], r"counts\[1\] = nan"),
    ([[1, 2], [-1, 0]], [0.0, 1.0], r"counts\[1, 0\] = -1"),
    ([10, 10], [0.0, 5.0], r"values must lie in \[0, 1\], got 1 of 2 entries that do not: "
                           r"values\[1\] = 5\. .*rescale"),
    ([10, 10], [0.0, NAN], r"values\[1\] = nan"),
])
def test_histogram_mean_refuses_bad_counts_and_values(counts, values, match):
  with pytest.raises(ValueError, match=match):
    metrics.histogram_mean(jnp.asarray(counts), jnp.asarray(values))


def test_histogram_mean_keeps_its_numbers_for_valid_inputs_and_under_jit():
  values = jnp.array([0.0, 0.5, 1.0])
  want_half = np.sqrt(np.log(40) / 200)  # Hoeffding at 95% over 100 responses
  for counts in (jnp.array([50, 0, 50]), np.array([50, 0, 50], np.int64),
                 jnp.array([50.0, 0.0, 50.0])):  # whole float counts are counts too
    out = metrics.histogram_mean(counts, values, interval="hoeffding")
    assert float(out["mean"]) == 0.5 and float(out["n"]) == 100
    assert float(out["upper"] - out["mean"]) == pytest.approx(want_half, abs=1e-6)
  jitted = jax.jit(lambda c, v: metrics.histogram_mean(c, v, interval="hoeffding"))
  out = jitted(jnp.array([50, 0, 50]), values)
  assert float(out["mean"]) == 0.5
  assert float(out["upper"] - out["mean"]) == pytest.approx(want_half, abs=1e-6)
  jitted(jnp.array([-1, 0, 1]), values)  # traced: the values are not read
  low = metrics.histogram_mean(jnp.array([98, 2]), jnp.array([0.0, 1.0]))
  assert round(float(low["upper"]), 3) == 0.083  # the documented KL bound


# ------------------------------------------------------------------------------------------------
# text.classifier_judge: threshold not NaN, abstain >= 0 and not NaN.


def fraction_of_three(tokens):
  return jnp.mean(tokens == 3, axis=1)


TOKENS = jnp.array([[3, 3, 3], [3, 3, 1], [1, 1, 1]])  # scores 1, 2/3, 0


@pytest.mark.parametrize("options, match", [
    (dict(threshold=NAN), r"threshold must not be NaN, got nan\. A NaN threshold makes every "
                          r"finite score a failure"),
    (dict(threshold=jnp.array([0.5, NAN, 0.5])), r"threshold\[1\] = nan"),
    (dict(threshold=0.5, abstain=NAN), r"abstain must be >= 0 .*got nan\. abstain is the margin"),
    (dict(threshold=0.5, abstain=-1.0), r"abstain must be >= 0 .*got -1\."),
])
def test_classifier_judge_refuses_nan_threshold_and_bad_abstain(options, match):
  with pytest.raises(ValueError, match=match):
    text.classifier_judge(fraction_of_three, TOKENS, **options)


def test_classifier_judge_keeps_its_verdicts_and_takes_traced_options():
  assert text.classifier_judge(fraction_of_three, TOKENS, threshold=0.5).tolist() == [1, 1, 0]
  # |2/3 - 0.5| < 0.2: the second response is too close to the threshold to judge.
  assert text.classifier_judge(fraction_of_three, TOKENS, threshold=0.5,
                               abstain=0.2).tolist() == [1, -1, 0]
  jitted = jax.jit(lambda t, th, a: text.classifier_judge(fraction_of_three, t, threshold=th,
                                                          abstain=a))
  assert jitted(TOKENS, 0.5, 0.2).tolist() == [1, -1, 0]
  assert jitted(TOKENS, 0.5, 0.0).tolist() == [1, 1, 0]


# ------------------------------------------------------------------------------------------------
# text.textattack_summary: words are ints, >= swaps and >= 0.


def swap_result():
  return text.Result(tokens_adv=None, success=jnp.array([True, True, False]),
                     swaps=jnp.array([0, 2, 4]), logits=None, queries=jnp.array([1, 30, 50]))


@pytest.mark.parametrize("words, error, match", [
    ([2, 1, 4], ValueError, r"words must be >= swaps and >= 0 on every example .*got 1 of 3 "
                            r"entries that are not: words\[1\] = 1 with swaps\[1\] = 2\. "
                            r"words counts the non-padding tokens"),
    ([-4, 4, 4], ValueError, r"words\[0\] = -4 with swaps\[0\] = 0"),
    ([2.5, 4.0, 4.0], TypeError, r"words must be an int array \[B\] .*got dtype float32"),
])
def test_textattack_summary_refuses_impossible_words(words, error, match):
  with pytest.raises(error, match=match):
    text.textattack_summary(swap_result(), words=jnp.asarray(words))


def test_textattack_summary_refuses_a_textfooler_result_with_impossible_words():
  result = text.TextFoolerResult(
      tokens_adv=None, success=jnp.array([True, False]), swaps=jnp.array([3, 1], jnp.int32),
      logits=None, queries=jnp.array([5, 5], jnp.int32), max_swaps=None,
      skipped=jnp.array([False, False]), words=jnp.array([2, 4], jnp.int32),
      perturbed_fraction=None)
  with pytest.raises(ValueError, match=r"words\[0\] = 2 with swaps\[0\] = 3"):
    text.textattack_summary(result)


def test_textattack_summary_keeps_its_numbers_and_jits():
  words = jnp.array([2, 4, 4])
  for summary in (text.textattack_summary(swap_result(), words=words),
                  jax.jit(lambda r, w: text.textattack_summary(r, words=w))(swap_result(),
                                                                            words)):
    assert (int(summary.successful), int(summary.failed), int(summary.skipped)) == (1, 1, 1)
    assert float(summary.attack_success_rate) == 0.5
    assert float(summary.average_perturbed_word_percent) == 50.0
    assert float(summary.average_queries) == 40.0
  # Traced words are not read (the dtype still is).
  summary = jax.jit(lambda r, w: text.textattack_summary(r, words=w))
  summary(swap_result(), jnp.array([0, 0, 0]))
  with pytest.raises(TypeError, match="int array"):
    summary(swap_result(), jnp.ones(3))


# ------------------------------------------------------------------------------------------------
# text.parse_verdict / host_judge: NumPy and JAX scalars; a call with every answer unscored warns.


@pytest.mark.parametrize("answer, verdict", [
    (True, 1), (False, 0), (1, 1), (0, 0), (np.bool_(True), 1), (np.bool_(False), 0),
    (np.int64(1), 1), (np.uint8(0), 0), (np.array(True), 1), (np.array(0), 0),
    (jnp.array(True), 1), (jnp.array(0, jnp.int32), 0),
    (np.array(2), -1), (np.array([True]), -1), (np.array(1.0), -1), (jnp.array(1.0), -1),
    (1.0, -1), (np.float32(0.0), -1), (None, -1), ("yes", -1), (-1, -1),
])
def test_parse_verdict_reads_numpy_and_jax_scalars_as_their_values(answer, verdict):
  assert text.parse_verdict(answer) == verdict


def judged(judge, tokens, batch_size):
  """``host_judge``'s verdicts eagerly and under ``jit``, with the warnings of both calls."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    eager = np.asarray(text.host_judge(judge, tokens, batch_size=batch_size))
    jitted = np.asarray(jax.jit(lambda t: text.host_judge(judge, t, batch_size=batch_size))(
        tokens))
  np.testing.assert_array_equal(eager, jitted)
  return eager.tolist(), [(w.category, str(w.message)) for w in caught]


RESPONSES = jnp.array([[3, 1], [1, 1], [3, 3]])


@pytest.mark.parametrize("wrap", [np.bool_, np.array, jnp.array, lambda v: np.int64(int(v))])
def test_host_judge_reads_scalar_arrays_without_a_warning(wrap):
  verdicts, caught = judged(lambda items: [wrap(bool(3 in r)) for r in items], RESPONSES, 2)
  assert verdicts == [1, 0, 1] and caught == []


def test_host_judge_warns_once_when_every_answer_is_unscored():
  verdicts, caught = judged(lambda items: [float(3 in r) for r in items], RESPONSES, 1)
  assert verdicts == [-1, -1, -1]
  assert len(caught) == 2  # once per call (eager, jit), not once per batch of 1
  for category, message in caught:
    assert category is UserWarning
    assert message.startswith("host_judge: every one of the 3 answers of the judge was unscored "
                              "(answers of type float)")
    assert "0-d bool or integer arrays" in message and "bool(score > 0.5)" in message
  # Some answers scored, or every batch failed as a whole (already warned): no such warning.
  verdicts, caught = judged(lambda items: [None if 1 in r else True for r in items], RESPONSES, 2)
  assert verdicts == [-1, -1, 1] and caught == []

  def failing(items):
    raise RuntimeError("judge down")

  verdicts, caught = judged(failing, RESPONSES, 2)
  assert verdicts == [-1, -1, -1] and {c for c, _ in caught} == {RuntimeWarning}


# ------------------------------------------------------------------------------------------------
# Report: at least one attack; certified counts by one rule (from_counts and with_certified).


EPS = np.array([0.1, 0.2], np.float32)
PGD = dict(robust={"pgd": np.array([2, 1])}, worst_case=np.array([2, 1]),
           info={"pgd": ("pgd-linf", "linf", False)}, flags={"pgd": {}})


def report(**changes):
  options = dict(epsilons=EPS, n=4, clean_correct=3, **PGD)
  options.update(changes)
  return jr.Report.from_counts(**options)


def test_a_report_needs_an_attack():
  with pytest.raises(ValueError, match=r"robust is empty: a report needs at least one attack"):
    report(robust={}, worst_case=np.array([3, 3]), info={}, flags={})
  d = report().to_dict()
  d["attacks"] = {}
  with pytest.raises(ValueError, match="at least one attack"):
    jr.Report.from_dict(d)


@pytest.mark.parametrize("counts, match", [
    ([4, 4], r"certified\['ibp'\] counts \[4, 4\] exceed the empirical worst case \[2, 1\] at "
             r"eps 0\.1, 0\.2: .*allow_above_empirical=True"),  # above clean_correct = 3 too
    ([2, 2], r"counts \[2, 2\] exceed the empirical worst case \[2, 1\] at eps 0\.2:"),
    ([-1, 0], r"certified\['ibp'\] counts \[-1, 0\] must lie in \[0, n\] = \[0, 4\]"),
])
def test_certified_counts_follow_one_rule_everywhere(counts, match, tmp_path):
  with pytest.raises(ValueError, match=match):
    report(certified={"ibp": ("ibp", "linf", np.array(counts))})
  with pytest.raises(ValueError, match=match):
    report().with_certified("ibp", np.array(counts))
  # A stored file: counts outside [0, n] are refused; a curve above the worst case loads with
  # the flag above_empirical (an allowed one, or one written before the flag was saved).
  good = report().with_certified("ibp", np.array([1, 0]))
  d = json.loads(good.to_json())
  d["certified"]["ibp"]["robust_count"] = counts
  good.save(tmp_path)
  (tmp_path / "report.json").write_text(json.dumps(d))
  for load in (lambda: jr.Report.from_dict(d), lambda: jr.Report.load(tmp_path)):
    if min(counts) < 0:
      with pytest.raises(ValueError, match=match):
        load()
    else:
      assert load().certified["ibp"].flags == {"above_empirical": True}


def test_valid_certified_counts_and_an_allowed_crossing_survive_save_and_load(tmp_path):
  r = report()
  assert r.with_certified("ibp", np.array([1, 0])).certified["ibp"].robust_accuracy.tolist() == [
      0.25, 0.0]
  direct = report(certified={"ibp": ("ibp", "linf", np.array([1, 0]))})
  assert direct == r.with_certified("ibp", np.array([1, 0]), description="ibp")
  assert direct.certified["ibp"].flags == {}
  noisy = r.with_certified("smoothing", np.array([2, 2]), allow_above_empirical=True)
  assert noisy.certified["smoothing"].flags == {"above_empirical": True}
  assert "FLAGS: above_empirical" in str(noisy).splitlines()[-1]
  again = jr.Report.load(noisy.save(tmp_path / "noisy"))
  assert again == noisy and again.certified["smoothing"].robust_count.tolist() == [2, 2]
  both = again.with_certified("ibp", np.array([1, 0]))  # rebuilt: the allowance is kept
  assert both.certified["smoothing"].flags == {"above_empirical": True}
  assert report(certified={"s": ("s", "l2", np.array([2, 2]), True)}).certified["s"].flags == {
      "above_empirical": True}
  with pytest.raises(ValueError, match=r"must be \(description, norm, \[K\] counts\)"):
    report(certified={"s": ("s", np.array([2, 2]))})


# ------------------------------------------------------------------------------------------------
# jaxrobust compare: --out and malformed report files are the user's errors (exit 2, one line).


@pytest.fixture
def saved(tmp_path):
  for name in ("a", "b"):
    report().save(tmp_path / name)
  return tmp_path


def compare(capsys, root, out, *extra):
  code = cli.main(["compare", str(root / "a"), str(root / "b"), "--out", str(out), *extra])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def one_error_line(err):
  assert err.count("\n") == 1 and err.startswith("jaxrobust compare: error: "), err
  assert "Traceback" not in err and "internal error" not in err
  return err


def test_compare_refuses_an_out_it_could_not_write(saved, capsys):
  missing = saved / "no" / "such" / "x.png"
  code, out, err = compare(capsys, saved, missing)
  assert code == 2 and out == ""  # checked before anything is read or printed
  assert (f"--out {missing} cannot be written: the folder {missing.parent} does not exist; "
          "create it first") in one_error_line(err)
  code, _, err = compare(capsys, saved, saved)
  assert code == 2 and f"--out {saved} is a folder; give a file in it, e.g. --out " \
      f"{saved / 'compare.png'}" in one_error_line(err)
  (saved / "a_file").write_text("")
  code, _, err = compare(capsys, saved, saved / "a_file" / "x.png")
  assert code == 2 and f"{saved / 'a_file'} is a file, not a folder" in one_error_line(err)
  assert not (saved / "no").exists()


@pytest.mark.parametrize("field, value, match", [
    ("attacks", [], "it is not a report written by jaxrobust evaluate or Report.save (a field "
                    "has the wrong type: AttributeError:"),
    ("attacks", {"pgd": 3}, "(a field has the wrong type: TypeError:"),
    ("worst_case", None, "(a field has the wrong type: TypeError:"),
    ("num_examples", "four", "ValueError: n must be integer counts"),
])
def test_compare_names_a_malformed_report_file(saved, capsys, field, value, match):
  path = saved / "b" / "report.json"
  d = json.loads(path.read_text())
  d[field] = value
  path.write_text(json.dumps(d))
  code, _, err = compare(capsys, saved, saved / "x.png")
  assert code == 2
  err = one_error_line(err)
  assert f"cannot read {path}: " in err and match in err


def test_compare_still_writes_the_overlay(saved, capsys):
  code, out, err = compare(capsys, saved, saved / "x.png", "--labels", "one,two")
  assert code == 0 and err == "" and (saved / "x.png").read_bytes()[:4] == b"\x89PNG"
  assert out.startswith("one: 4 examples (linf), clean 0.7500; worst case 0.1: 0.5000, "
                        "0.2: 0.2500\ntwo: ")
