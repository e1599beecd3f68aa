"""Bad inputs to ``jr.evaluate`` and ``jaxrobust evaluate``, refused with a clear error; inputs that
are fine accepted, with the result of their canonical form.

The library runs share one tiny linear model (its weights passed through ``functools.partial``,
so they are arguments of the compiled step, and every run reuses one compiled step), a
two-step PGD and two budgets. The command-line runs write a user module and an ``.npz`` file to a
temporary folder, as tests/test_cli_evaluate.py does, and run ``jaxrobust evaluate`` in-process
on one device.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import re
import textwrap

import jax
import numpy as np
import pytest

import jaxrobust as jr
from jaxrobust import cli
from jaxrobust.cli import evaluate as cli_evaluate
from jaxrobust.evaluation import driver
from tests.models import linear_logits, linear_points, random_linear

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

LINEAR = random_linear(seed=0, dim=4, classes=2)
MODEL = functools.partial(linear_logits, LINEAR.weights())
X, Y, _ = linear_points(LINEAR, seed=1, n=10, shape=(4,), norm="linf")
EPS = [0.05, 0.1]
PGD = jr.attacks.pgd(steps=2)
BATCH = 4


def evaluate(data, logits_fn=MODEL, **options):
  settings = {"attacks": {"pgd": PGD}, "epsilons": EPS, "key": jax.random.key(0),
              "batch_size": BATCH, "progress": False, "keep_per_example": True}
  settings.update(options)
  return jr.evaluate(logits_fn, data, **settings)


@pytest.fixture(scope="module")
def reference():
  """Batches of 4, 4 and a padded 2, numbered by default."""
  return evaluate((X, Y))


def batches(*pieces):
  """A generator of ``(x, y)`` or ``(x, y, index)`` batches: each piece is a slice of the data
  and, optionally, its indices."""
  for piece in pieces:
    rows, index = piece if isinstance(piece, tuple) else (piece, None)
    yield (X[rows], Y[rows]) if index is None else (X[rows], Y[rows], np.asarray(index))


# ------------------------------------------------------------------------------------------------
# Global indices: each example once.


def test_repeated_indices_in_arrays_are_refused_before_anything_runs(monkeypatch):
  compiles = []
  original = driver._compile
  monkeypatch.setattr(driver, "_compile",
                      lambda *args, **kwargs: compiles.append(1) or original(*args, **kwargs))
  index = np.array([0, 1, 2, 3, 4, 5, 6, 0, 8, 2])  # 0 and 2 twice: two examples repeat one
  with pytest.raises(ValueError, match=r"^index gives 2 of its 10 examples a global index given "
                     r"before: e.g\. 0, given 2 times in index\. .*np\.arange\(N\)"):
    evaluate((X, Y, index))
  assert not compiles  # refused before the (here last) batch that holds the repeat


@pytest.mark.parametrize("pieces, message", [
    # a repeat inside one batch
    (((slice(0, 4), [0, 1, 1, 1]),), r"^batch 1 of the data \(counting from 1\): index gives 2 "
     r"of its 4 examples a global index given before: e.g\. 1, given 3 times so far\."),
    # a repeat of an earlier batch's index
    (((slice(0, 4), [9, 8, 7, 6]), (slice(4, 8), [5, 4, 7, 3])), r"^batch 2 of the data "
     r"\(counting from 1\): index gives 1 of its 4 examples a global index given before: e\.g\. "
     r"7, given 2 times so far\."),
    # an index that an earlier batch numbered by default (0..3) already took
    ((slice(0, 4), (slice(4, 8), [4, 5, 2, 6])), r"^batch 2 of the data \(counting from 1\): "
     r"index gives 1 of its 4 examples a global index given before: e\.g\. 2, given 2 times"),
    # a batch numbered by default (4..7) after an index that took 5
    (((slice(0, 4), [0, 1, 2, 5]), slice(4, 8)), r"^batch 2 of the data \(counting from 1\): "
     r"index gives 1 of its 4 examples a global index given before: e\.g\. 5, given 2 times"),
])
def test_repeated_indices_in_a_stream_name_the_batch_the_index_and_the_count(pieces, message):
  with pytest.raises(ValueError, match=message) as caught:
    evaluate(batches(*pieces))
  assert isinstance(caught.value.__cause__, ValueError)  # the batch's own error, chained


def test_distinct_indices_in_any_order_and_mixed_with_default_numbering_are_accepted(reference):
  order = np.random.default_rng(0).permutation(len(X))
  shuffled = evaluate(batches((order[:4], order[:4]), (order[4:8], order[4:8]),
                              (order[8:], order[8:])))
  back = np.argsort(shuffled.per_example["index"])
  assert shuffled.to_json() == reference.to_json()
  for k, v in reference.per_example.items():
    np.testing.assert_array_equal(shuffled.per_example[k][..., back], v)
  # Numbered by default (0..3), then given (the indices default numbering would give): the same.
  assert evaluate(batches(slice(0, 4), (slice(4, 8), range(4, 8)), slice(8, 10))) == reference


def test_a_resumed_run_with_explicit_indices_replays_them_without_a_false_repeat(reference,
                                                                                 tmp_path):
  path, index = tmp_path / "run.ckpt", np.arange(len(X))

  def crash_after_first():
    yield X[:4], Y[:4], index[:4]
    raise RuntimeError("simulated crash")

  with pytest.raises(RuntimeError, match="simulated crash"):
    evaluate(crash_after_first(), checkpoint=path)
  resumed = evaluate(batches((slice(0, 4), index[:4]), (slice(4, 8), index[4:8]),
                             (slice(8, 10), index[8:])), checkpoint=path)
  assert resumed == reference and resumed.timing["examples_evaluated"] == len(X) - 4


# ------------------------------------------------------------------------------------------------
# batch_size: any integral number.


def test_a_numpy_integer_batch_size_gives_the_int_batch_size_report(reference, tmp_path):
  path = tmp_path / "run.ckpt"
  for size in (np.int64(BATCH), np.int32(BATCH), np.uint8(BATCH)):
    report = evaluate((X, Y), batch_size=size, checkpoint=path)  # its fingerprint is JSON
    assert report == reference
    assert report.provenance["evaluate"] == reference.provenance["evaluate"]
    assert type(report.provenance["evaluate"]["batch_size"]) is int
    json.dumps(report.provenance)
  assert evaluate((X, Y), batch_size=BATCH, checkpoint=path) == reference  # the same run's file


@pytest.mark.parametrize("size", [4.0, np.float32(4), True, np.bool_(True), 0, -4, "4", None])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused(size):
  with pytest.raises(ValueError, match=rf"^batch_size must be an int >= 1, got "
                     rf"{re.escape(repr(size))}\.$"):
    evaluate((X, Y), batch_size=size)


# ------------------------------------------------------------------------------------------------
# A bad batch of a stream: its number.


@pytest.mark.parametrize("bad, kind, message", [
    ((X[4:8].astype(np.int32), Y[4:8]), TypeError, "x must be a float array"),
    (("four", Y[4:8]), TypeError, "x must be a float array"),
    ((X[4:8], Y[4:7]), ValueError, "Batch sizes differ"),
    ([X[4:8]], ValueError, "Each batch must be a tuple"),
    ((X[4:8].reshape(4, 2, 2), Y[4:8]), ValueError, r"Every batch must have examples of shape "
     r"\(4,\)"),  # (a first batch of this shape is fine: it sets the shape)
])
def test_a_bad_batch_of_a_stream_is_named_with_its_number(bad, kind, message):
  def stream():
    yield X[:4], Y[:4]
    yield bad

  with pytest.raises(kind, match=rf"^batch 2 of the data \(counting from 1\): {message}") as got:
    evaluate(stream())
  assert type(got.value) is kind and isinstance(got.value.__cause__, kind)
  if "Every batch" not in message:
    with pytest.raises(kind, match=rf"^batch 1 of the data \(counting from 1\): {message}"):
      evaluate(iter([bad]))  # the first batch, before anything is compiled


@pytest.mark.parametrize("data, kind, says", [
    (X, ValueError, r"got a numpy\.ndarray of shape \(10, 4\): pass \(x, y\)"),
    ({"x": X, "y": Y}, ValueError, r"got a dict with keys 'x', 'y': pass \(data\['x'\], "
     r"data\['y'\]\)"),
    ([X, Y], ValueError, r"got a list of 2 elements .*: pass a tuple \(x, y\) instead"),
    ((X, list(Y)), ValueError, r"make every element an array"),
    (5, TypeError, r"got an int: pass \(x, y\)"),
])
def test_data_that_is_not_x_and_y_says_what_it_got_and_what_to_pass(data, kind, says):
  """Before, an array was read as a stream whose first batch was one row ("got ndarray of length
  4"), a dict as its keys ("got str of length 1"), a list [x, y] as two batches."""
  with pytest.raises(kind, match=r"^data must be a tuple of arrays \(x, y\) or \(x, y, index\)"
                     rf".*{says}") as got:
    evaluate(data)
  assert type(got.value) is kind


# ------------------------------------------------------------------------------------------------
# A model that works at one batch size only.


def fixed_batch_logits(rows, weights, x):
  """``linear_logits`` written for batches of exactly ``rows`` examples."""
  return linear_logits(weights, x.reshape(rows, -1))


def test_a_model_fixed_to_the_data_size_is_refused_at_the_first_trace():
  model = functools.partial(fixed_batch_logits, 6, LINEAR.weights())
  with pytest.raises(ValueError, match=r"^logits_fn fails on a batch of 8 examples "
                     r"\(batch_size=8\) but works on a batch of 6: logits_fn must accept x "
                     r"\[B, \.\.\.\] for any batch size B.*x\.reshape\(x\.shape\[0\], -1\)") as got:
    evaluate((X[:6], Y[:6]), model, batch_size=8)
  assert isinstance(got.value.__cause__, TypeError)  # JAX's reshape error, chained


def test_a_model_fixed_to_batch_size_is_refused_when_the_attacks_call_it_on_chunks():
  model = functools.partial(fixed_batch_logits, BATCH, LINEAR.weights())
  with pytest.raises(ValueError, match=r"^logits_fn works on a batch of 4 examples "
                     r"\(batch_size=4\) but fails on a batch of 1: logits_fn must accept x "
                     r"\[B, \.\.\.\] for any batch size B") as got:
    evaluate((X, Y), model, chunk_size=2)  # compaction calls the model on chunks of 2 rows
  assert isinstance(got.value.__cause__, TypeError)


def test_a_model_failing_at_every_batch_size_tried_keeps_its_error_with_a_note():
  model = functools.partial(fixed_batch_logits, 3, LINEAR.weights())  # fails at 4, 1 and 2
  with pytest.raises(TypeError, match="cannot reshape") as got:
    evaluate((X, Y), model)
  notes = " ".join(getattr(got.value, "__notes__", []))
  assert ("jaxrobust: jr.evaluate traced logits_fn on x of shape (4, 4) (float32), a batch of 4 "
          "examples (batch_size=4); it failed at every batch size tried. If it was written for "
          "one batch size: logits_fn must accept x [B, ...] for any batch size B") in notes


# ------------------------------------------------------------------------------------------------
# The command line: --checkpoint and --eps.


MODULE = textwrap.dedent('''
    import pathlib
    import jax.numpy as jnp
    import numpy as np

    def make_model():
      weights = np.load(pathlib.Path(__file__).parent / "weights.npz")
      w, b = jnp.asarray(weights["w"], jnp.float32), jnp.asarray(weights["b"], jnp.float32)
      return lambda x: x.reshape(x.shape[0], -1) @ w + b[None, :]
''')


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
  root = tmp_path_factory.mktemp("user")
  (root / "mymodel.py").write_text(MODULE)
  np.savez(root / "weights.npz", w=LINEAR.w, b=LINEAR.b)
  np.savez(root / "data.npz", x=X, y=Y)
  (root / "a_file").write_text("not a folder")
  return root


def run_cli(root: pathlib.Path, out: str, *extra: str) -> int:
  return cli.main(["evaluate", f"{root / 'mymodel.py'}:make_model", "--data",
                   str(root / "data.npz"), "--batch-size", str(BATCH), "--devices", "1",
                   "--quiet", "--out", str(root / out), *extra])


def one_error_line(capsys) -> str:
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("jaxrobust evaluate: error: "), err
  assert "Traceback" not in err
  return err


@pytest.fixture
def no_compile(monkeypatch):
  """Fails the test if jr.evaluate compiles a step."""
  def refuse(*args, **kwargs):
    raise AssertionError("compiled although the options were refused")
  monkeypatch.setattr(driver, "_compile", refuse)


@pytest.mark.parametrize("case, match", [
    ("under a file", "--checkpoint {root}/a_file/sub/run.ckpt cannot be written: {root}/a_file is "
     "a file, not a folder"),
    ("a folder", "--checkpoint {root} is a folder; give a file in it, e.g. --checkpoint "
     "{root}/run.ckpt"),
    ("not writable", "--checkpoint {root}/locked/run.ckpt cannot be written: the folder "
     "{root}/locked is not writable"),
    ("missing, not writable", "--checkpoint {root}/locked/new/run.ckpt cannot be written: the "
     "folder {root}/locked is not writable"),
])
def test_a_checkpoint_that_cannot_be_written_is_a_user_error(workspace, capsys, monkeypatch,
                                                             no_compile, case, match):
  root = workspace
  path = {"under a file": root / "a_file" / "sub" / "run.ckpt", "a folder": root,
          "not writable": root / "locked" / "run.ckpt",
          "missing, not writable": root / "locked" / "new" / "run.ckpt"}[case]
  (root / "locked").mkdir(exist_ok=True)
  access = os.access  # the tests may run as root, whom no permission bit stops: pretend
  monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if pathlib.Path(p) == root /
                      "locked" else access(p, mode, **kw))
  assert run_cli(root, "never", "--eps", "0.1", "--checkpoint", str(path)) == 2
  assert match.format(root=root) in one_error_line(capsys)
  assert not (root / "never").exists() and not (root / "locked" / "new").exists()


def test_a_checkpoint_folder_failing_in_the_library_is_a_user_error(workspace, capsys,
                                                                    monkeypatch, no_compile):
  """jr.evaluate's own attempt to create the folder (were it to change after the command's
  check) is refused in one line too."""
  root = workspace
  path = root / "a_file" / "sub" / "run.ckpt"
  monkeypatch.setattr(cli_evaluate, "check_file_target", lambda *args, **kwargs: None)
  assert run_cli(root, "never", "--eps", "0.1", "--checkpoint", str(path)) == 2
  assert (f"--checkpoint {path} cannot be written: NotADirectoryError: [Errno 20] Not a "
          f"directory: '{root}/a_file/sub'") in one_error_line(capsys)


def test_parse_eps_takes_zero_and_inf_and_refuses_negative_or_nan():
  assert cli_evaluate.parse_eps("0, 8/255, inf") == ([0.0, 8 / 255, float("inf")],
                                                     ["0", "8/255", "inf"])
  assert cli_evaluate.parse_eps("Infinity")[0] == [float("inf")]
  with pytest.raises(argparse.ArgumentTypeError, match="every eps must be >= 0, got -1/255"):
    cli_evaluate.parse_eps("-1/255")
  with pytest.raises(argparse.ArgumentTypeError, match="got 'nan'"):
    cli_evaluate.parse_eps("nan")


def test_eps_zero_and_inf_give_the_library_report_for_a_minimum_norm_attack(workspace):
  root = workspace
  assert run_cli(root, "fmn", "--eps", "0,0.1,inf", "--attack", "fmn", "--steps", "5") == 0
  saved = json.loads((root / "fmn" / "report.json").read_text())
  library = jr.evaluate(MODEL, (X, Y), attacks={"fmn": jr.attacks.fmn(steps=5)},
                        epsilons=[0.0, 0.1, np.inf], key=jax.random.key(0), batch_size=BATCH,
                        progress=False)
  expected = json.loads(library.to_json())["worst_case"]["robust_count"]
  assert saved["worst_case"]["robust_count"] == expected
  counts = saved["worst_case"]["robust_count"]
  assert counts[0] == saved["clean_correct"] and counts[-1] == 0  # no bound: every point breaks
  assert saved["provenance"]["eps_text"] == ["0", "0.1", "inf"]


def test_eps_zero_is_accepted_for_a_fixed_budget_attack(workspace):
  root = workspace
  assert run_cli(root, "pgd0", "--eps", "0,0.1", "--steps", "2") == 0
  saved = json.loads((root / "pgd0" / "report.json").read_text())
  assert saved["worst_case"]["robust_count"][0] == saved["clean_correct"]


@pytest.mark.parametrize("attacks", ["pgd", "fmn,pgd"])
def test_eps_inf_is_refused_for_a_fixed_budget_attack(workspace, capsys, no_compile, attacks):
  root = workspace
  assert run_cli(root, "never", "--eps", "0.1,inf", "--attack", attacks) == 2
  assert ("--eps inf (no bound) is only meaningful for minimum-norm attacks (e.g. fmn, ddn, fab), "
          "but --attack pgd has a fixed budget") in one_error_line(capsys)
  assert not (root / "never").exists()
