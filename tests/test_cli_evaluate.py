"""``jaxrobust evaluate`` and ``jaxrobust compare`` end to end, run in-process as a user would.

The model is a user module written to a temporary directory: a two-class linear model on 4x4x1
NHWC images whose exact minimal Linf distances d* are known (tests/ground_truth.py); with two
classes the cross-entropy ascent of PGD is the margin's, so the default PGD must be exact (on more
classes untargeted CE-PGD may stall short of the nearest class: tests/test_ground_truth.py only
requires that of attacks that try every class). The data keep only points
whose d* is at least 5% away from every eps of the grid, so the robust count at each eps is
exactly #{d* > eps} for any attack at least as strong as the ground-truth rule demands.
"""

from __future__ import annotations

import json
import pathlib
import textwrap

import jax
import numpy as np
import pytest
from scipy import stats

import jaxrobust as jr
from jaxrobust import cli
from jaxrobust.cli import evaluate as cli_evaluate
from jaxrobust.evaluation import driver
from tests.ground_truth import linear_problem

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

EPS_TEXT = "4/255,8/255,16/255"
EPS = np.array([4 / 255, 8 / 255, 16 / 255])

MODULE = textwrap.dedent('''
    import pathlib
    import jax.numpy as jnp
    import numpy as np

    HERE = pathlib.Path(__file__).parent

    def make_model():
      weights = np.load(HERE / "weights.npz")
      w = jnp.asarray(weights["w"], jnp.float32)
      b = jnp.asarray(weights["b"], jnp.float32)
      return lambda x: x.reshape(x.shape[0], -1) @ w + b[None, :]

    def make_quantised_model():
      linear = make_model()
      return lambda x: linear(jnp.round(x * 255) / 255)  # an input-quantisation "defence"

    def make_nnx_model():
      from flax import nnx
      weights = np.load(HERE / "weights.npz")
      layer = nnx.Linear(16, 2, rngs=nnx.Rngs(0))
      layer.kernel.value = jnp.asarray(weights["w"], jnp.float32)
      layer.bias.value = jnp.asarray(weights["b"], jnp.float32)

      class Flat(nnx.Module):
        def __init__(self, layer):
          self.layer = layer

        def __call__(self, x):
          return self.layer(x.reshape(x.shape[0], -1))

      return Flat(layer)

    def make_five_class_model():  # 16 -> 5 classes: fewer than apgd_t's and fab_t's 9 targets
      w = jnp.asarray(np.random.default_rng(0).normal(size=(16, 5)), jnp.float32)
      return lambda x: x.reshape(x.shape[0], -1) @ w

    def broken():
      raise RuntimeError("the weights are not where I left them")

    def make_train_mode_model():  # BatchNorm left in train mode (nnx modules start in it)
      from flax import nnx

      class Net(nnx.Module):
        def __init__(self):
          rngs = nnx.Rngs(0)
          self.norm, self.head = nnx.BatchNorm(16, rngs=rngs), nnx.Linear(16, 2, rngs=rngs)

        def __call__(self, x):
          return self.head(self.norm(x.reshape(x.shape[0], -1)))

      return Net()
''')


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
  """The user's directory: ``mymodel.py``, ``weights.npz``, ``data.npz`` and bad data files;
  and the ground-truth robust count per eps."""
  root = tmp_path_factory.mktemp("user")
  problem = linear_problem(shape=(4, 4, 1), classes=2, norm="linf", n=160, seed=3, candidates=16)
  d = problem.distance
  clear = np.all((d[:, None] > 1.05 * EPS[None, :]) | (d[:, None] < EPS[None, :] / 1.05), axis=1)
  x, y, d = problem.x[clear], problem.y[clear], d[clear]
  y = y.copy()
  y[:5] = 1 - y[:5]  # five clean-misclassified points: never robust
  robust = (d[:, None] > EPS[None, :]) & (np.arange(len(y)) >= 5)[:, None]
  (root / "mymodel.py").write_text(MODULE)
  np.savez(root / "weights.npz", w=problem.model.w, b=problem.model.b)
  np.savez(root / "data.npz", x=x.astype(np.float64), y=y)  # float64, as NumPy saves by default
  np.savez(root / "no_y.npz", x=x)
  np.savez(root / "bytes.npz", x=np.round(x * 255).astype(np.float32), y=y)
  np.savez(root / "normalised.npz", x=(x - 0.5) / 0.25, y=y)
  np.savez(root / "float_labels.npz", x=x, y=y.astype(np.float32))
  np.save(root / "x.npy", x)
  return root, robust.sum(axis=0), len(y)


def evaluate(root: pathlib.Path, out: str, *extra: str, model: str = "make_model") -> int:
  return cli.main(["evaluate", f"{root / 'mymodel.py'}:{model}", "--data",
                   str(root / "data.npz"), "--eps", EPS_TEXT, "--attack", "pgd,fgsm",
                   "--batch-size", "32", "--quiet", "--out", str(root / out), *extra])


@pytest.fixture(scope="module")
def reference(workspace):
  root, *_ = workspace
  assert evaluate(root, "reference", "--devices", "2") == 0
  return json.loads((root / "reference" / "report.json").read_text())


def test_report_matches_ground_truth_with_intervals_and_provenance(workspace, reference):
  root, truth, n = workspace
  assert reference["num_examples"] == n and reference["clean_correct"] == n - 5
  worst = reference["worst_case"]
  assert worst["robust_count"] == truth.tolist()  # exact: PGD finds every breakable point
  accuracy = np.array(worst["robust_accuracy"])
  assert len(accuracy) == len(EPS) and np.all(np.diff(accuracy) <= 0)
  fgsm = reference["attacks"]["fgsm"]["robust_count"]
  assert all(f >= w for f, w in zip(fgsm, worst["robust_count"]))  # the worst case is per example
  # Every accuracy carries the exact two-sided 95% Clopper-Pearson interval (SciPy reference).
  for counts, bounds in [([reference["clean_correct"]], [reference["clean_accuracy_interval"]]),
                         (worst["robust_count"], worst["robust_accuracy_interval"])]:
    k = np.array(counts)
    want_lo = np.where(k == 0, 0.0, stats.beta.ppf(0.025, np.maximum(k, 1), n - k + 1))
    want_hi = np.where(k == n, 1.0, stats.beta.ppf(0.975, k + 1, np.maximum(n - k, 1)))
    np.testing.assert_allclose(np.array(bounds), np.stack([want_lo, want_hi], -1), atol=2e-6)
  p = reference["provenance"]
  assert p["threat_model"]["norm"] == "linf" and p["threat_model"]["box"] == [0.0, 1.0]
  np.testing.assert_allclose(p["threat_model"]["epsilons"], EPS, rtol=1e-6)
  assert p["eps_text"] == EPS_TEXT.split(",")
  assert p["attacks"]["pgd"]["config"] == {
      "factory": "pgd", "norm": "linf", "steps": 10, "step_size": None, "random_start": True,
      "restarts": 1, "loss": "ce", "targeted": False, "l1_sparsity": None}
  assert p["key"] == {"impl": "threefry2x32", "data": [0, 0]} and p["seed"] == 0
  assert p["evaluate"]["devices"] == 2 and p["evaluate"]["batch_size"] == 32
  assert p["data"]["num_examples"] == n and p["data"]["x_shape"] == [4, 4, 1]
  assert p["data"]["x_dtype"] == "float32" and len(p["data"]["sha256"]) == 64
  assert p["command"][:2] == ["jaxrobust", "evaluate"] and p["jax_version"]
  assert p["diagnosis"] == {"findings": []}  # the static diagnosis: a clean linear model


def test_outputs_png_per_example_and_markdown(workspace, reference):
  root, truth, n = workspace
  out = root / "reference"
  png = (out / "curves.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n"
  import matplotlib.image  # noqa: PLC0415

  pixels = matplotlib.image.imread(out / "curves.png")
  assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels[..., :3].std() > 0.05
  with np.load(out / "per_example.npz") as per:
    assert per["index"].tolist() == list(range(n))
    assert per["worst_case"].shape == (len(EPS), n)
    np.testing.assert_array_equal(per["worst_case"].sum(axis=1), truth)
  summary = (out / "summary.md").read_text()
  rows = [line for line in summary.splitlines() if line.startswith("| ")]
  assert len(rows) == 1 + len(EPS)  # header + one row per eps
  assert rows[1].startswith("| 4/255 |") and f"{truth[0] / n:.4f}" in rows[1]
  assert "\nGradient masking (static): none found.\n" in summary


def test_interrupted_run_resumes_to_the_identical_report(workspace, reference, monkeypatch):
  root, *_ = workspace
  checkpoint = root / "not" / "yet" / "run.ckpt"  # jr.evaluate creates the folders
  calls = []
  original = driver._evaluate_batch

  def interrupt_second_batch(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return original(*args, **kwargs)

  monkeypatch.setattr(driver, "_evaluate_batch", interrupt_second_batch)
  assert evaluate(root, "resumed", "--devices", "2", "--checkpoint", str(checkpoint)) == 130
  assert checkpoint.exists() and not (root / "resumed" / "report.json").exists()
  monkeypatch.setattr(driver, "_evaluate_batch", original)
  assert evaluate(root, "resumed", "--devices", "2", "--checkpoint", str(checkpoint)) == 0
  resumed = json.loads((root / "resumed" / "report.json").read_text())
  assert resumed["timing"]["examples_evaluated"] == resumed["num_examples"] - 32  # did resume
  for report in (resumed, reference):
    del report["timing"]
    report["provenance"]["command"] = None  # the output directory differs
  reference_copy = json.loads(json.dumps(reference))
  assert resumed == reference_copy


def test_default_devices_are_one_per_usable_cpu_core(workspace, reference):
  # Without --devices, a CPU run splits each batch over one JAX CPU device per usable core (at
  # most 8, at most what the backend has: tests/conftest.py gives it 8), the batch rounded up to
  # a multiple of them; the report is the one of two devices, batch 32.
  root, truth, n = workspace
  assert evaluate(root, "auto", "--batch-size", "31") == 0
  got = json.loads((root / "auto" / "report.json").read_text())
  devices = min(cli_evaluate.usable_cores(), cli_evaluate.MAX_AUTO_CPU_DEVICES,
                len(jax.devices()))
  assert got["provenance"]["evaluate"]["devices"] == devices
  assert got["provenance"]["evaluate"]["batch_size"] == -(-31 // devices) * devices
  assert got["worst_case"]["robust_count"] == truth.tolist()
  assert got["worst_case"] == reference["worst_case"] and got["attacks"] == reference["attacks"]
  # An explicit --devices is kept, and so is its batch size.
  assert evaluate(root, "one", "--devices", "1", "--batch-size", "31") == 0
  one = json.loads((root / "one" / "report.json").read_text())["provenance"]["evaluate"]
  assert (one["devices"], one["batch_size"]) == (1, 31)


@pytest.fixture(scope="module")
def nnx_report(workspace):
  root, *_ = workspace
  assert evaluate(root, "nnx", "--devices", "2", model="make_nnx_model") == 0
  return json.loads((root / "nnx" / "report.json").read_text())


def test_nnx_module_gives_the_same_report(nnx_report, reference):
  got = nnx_report
  assert got["worst_case"] == reference["worst_case"]
  assert got["attacks"] == reference["attacks"]


def test_max_propagations_caps_every_attack(workspace, reference):
  # 3 propagations per example and eps cover FGSM (a gradient and the last score): its counts
  # are the uncapped ones. 0 covers no attack: every clean-correct point stays robust.
  root, _, n = workspace
  for cap in (3, 0):
    assert evaluate(root, f"capped{cap}", "--max-propagations", str(cap)) == 0
  capped = [json.loads((root / f"capped{c}" / "report.json").read_text()) for c in (3, 0)]
  assert capped[0]["provenance"]["evaluate"]["max_propagations"] == 3
  fgsm = [r["attacks"]["fgsm"]["robust_count"] for r in (capped[0], reference)]
  assert fgsm[0] == fgsm[1]
  assert capped[1]["worst_case"]["robust_count"] == [n - 5] * len(EPS)


@pytest.mark.parametrize("case, match", [
    ("module raises", "broken() raised RuntimeError: the weights are not where I left them"),
    ("missing y", "has no array 'y' (it has: x)"),
    ("0-255 data", "outside the box [0, 1] given by --lower/--upper (8-bit pixel values?"),
    ("no such function", "has no attribute 'nope'"),
    ("norm the attack lacks", "Carlini-Wagner is an L2 attack"),
    ("normalised data", "(normalised by a mean and std? save the images in [0, 1] and normalise "
     "inside the model"),
    ("float labels", "y must hold integer labels, got dtype float32; save y.astype('int64')"),
    ("labels past int32", "y must hold class indices >= 0, got min 0, max 4294967297"),
    (".npy data", "x.npy is a single .npy array; save x and y together with np.savez("),
    ("out is a file", "--out " + "{root}" + "/data.npz is a file; give a folder"),
    ("train mode", "TraceContextError: Cannot mutate BatchStat"),
    ("train mode", "put it in eval mode first (nnx: model.eval()"),
    ("eps over the box", "epsilons = 1 covers the whole box [0.0, 1.0] in linf (the largest "
     "meaningful budget is < 1). Pass --allow-large-eps if this is intended."),
    ("batch not a multiple of devices", "--batch-size 7 is not a multiple of --devices 2 (each "
     "device takes an equal share of every batch): pass --batch-size 6 or 8"),
    ("targeted DLR on two classes", "--attack apgd_t uses the targeted DLR loss, which needs at "
     "least 4 classes, but the model has 2: use --attack apgd,fab_t,square instead"),
])
def test_user_mistakes_exit_2_with_one_clear_line(workspace, capsys, monkeypatch, case, match):
  """Every mistake is caught before anything runs (the eps check: before any compilation) and
  leaves no output folder."""
  root, *_ = workspace
  model, data, extra, out = f"{root / 'mymodel.py'}:make_model", root / "data.npz", [], "never"
  eps, compiles = "0.1", []
  if case == "module raises":
    model = f"{root / 'mymodel.py'}:broken"
  elif case == "missing y":
    data = root / "no_y.npz"
  elif case == "0-255 data":
    data = root / "bytes.npz"
  elif case == "no such function":
    model = f"{root / 'mymodel.py'}:nope"
  elif case == "train mode":
    model = f"{root / 'mymodel.py'}:make_train_mode_model"
  elif case == "normalised data":
    data = root / "normalised.npz"
  elif case == "float labels":
    data = root / "float_labels.npz"
  elif case == "labels past int32":  # 2**32 + 1 wrapped to label 1 and ran
    data = root / "wide_labels.npz"
    with np.load(root / "data.npz") as f:
      np.savez(data, x=f["x"], y=np.where(np.arange(len(f["y"])) == 0, 2**32 + 1, 0))
  elif case == ".npy data":
    data = root / "x.npy"
  elif case == "out is a file":
    out = "data.npz"
  elif case == "batch not a multiple of devices":  # the user's own numbers: named, not rounded
    extra = ["--batch-size", "7", "--devices", "2"]
  elif case == "targeted DLR on two classes":
    extra = ["--attack", "apgd_t"]
  elif case == "eps over the box":
    eps, original = "1", driver._compile
    monkeypatch.setattr(driver, "_compile",
                        lambda *args, **kwargs: compiles.append(1) or original(*args, **kwargs))
  else:
    extra = ["--attack", "cw"]
  code = cli.main(["evaluate", model, "--data", str(data), "--eps", eps, "--quiet",
                   "--out", str(root / out), *extra])
  err = capsys.readouterr().err
  assert code == 2
  assert err.count("\n") == 1 and err.startswith("jaxrobust evaluate: error: "), err
  assert match.format(root=root) in err
  assert "Traceback" not in err and not (root / "never").exists() and not compiles


def test_compare_overlays_saved_reports(workspace, reference, nnx_report, capsys):
  root, *_ = workspace
  out = root / "compare.png"
  code = cli.main(["compare", str(root / "reference"), str(root / "nnx"), "--labels",
                   "linear,nnx", "--out", str(out)])
  text = capsys.readouterr().out
  assert code == 0 and out.read_bytes()[:4] == b"\x89PNG"
  assert text.startswith("linear: ") and "\nnnx: " in text
  assert f"clean {reference['clean_accuracy']:.4f}" in text
  assert text.count("\n  Gradient masking (static): none found\n") == 2  # under each report
  assert cli.main(["compare", str(root / "reference"), str(root / "missing")]) == 2
  capsys.readouterr()
  # A report is its folder or its report.json; reports of two norms are overlaid with a warning.
  l2 = jr.Report.load(root / "reference" / "report.json")
  l2 = jr.Report.from_dict({**l2.to_dict(), "attacks": {
      name: {**summary, "norm": "l2"} for name, summary in l2.to_dict()["attacks"].items()}})
  l2.save(root / "l2")
  assert cli.main(["compare", str(root / "reference" / "report.json"), str(root / "l2"),
                   "--out", str(out)]) == 0
  assert "warning: the reports are for different norms (reference: linf, l2: l2)" in \
      capsys.readouterr().err


def test_a_masked_model_is_diagnosed_printed_and_saved(workspace, capsys):
  """The static diagnosis of a quantised model: warned about, printed at the end of the report,
  written to report.json (provenance) and summary.md; the report is unreliable."""
  root, *_ = workspace
  with pytest.warns(jr.diagnosis.GradientMaskingWarning, match="rounding"):
    code = cli.main(["evaluate", f"{root / 'mymodel.py'}:make_quantised_model", "--data",
                     str(root / "data.npz"), "--eps", "8/255", "--attack", "fgsm", "--limit", "8",
                     "--batch-size", "8", "--quiet", "--out", str(root / "quantised")])
  assert code == 0
  printed = capsys.readouterr().out
  assert "Gradient masking (static): 1 error, 0 warnings\n  error    rounding" in printed
  saved = jr.Report.load(root / "quantised")
  (finding,) = saved.diagnosis
  assert (finding.kind, finding.primitive, finding.file) == (
      "rounding", "round", str(root / "mymodel.py"))
  assert not saved.reliable
  summary = (root / "quantised" / "summary.md").read_text()
  assert "Gradient masking (static): 1 error(s), 0 warning(s)" in summary
  assert "- error `rounding` (`round`) at `mymodel.py:" in summary


TORCH_MODULE = textwrap.dedent('''
    import pathlib
    import numpy as np
    import torch

    HERE = pathlib.Path(__file__).parent

    def make_torch_model(train=False):
      weights = np.load(HERE / "weights.npz")
      linear = torch.nn.Linear(16, 2)
      with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(weights["w"].T.astype(np.float32)))
        linear.bias.copy_(torch.from_numpy(weights["b"].astype(np.float32)))
      module = torch.nn.Sequential(torch.nn.Flatten(), linear)  # NCHW [B, 1, 4, 4] -> 2 logits
      return module.train() if train else module.eval()

    def make_training_model():
      return make_torch_model(train=True)
''')


def test_torch_module_gives_the_same_report(workspace, reference):
  """``--torch``: the same linear model as a PyTorch module (NCHW inside, the data NHWC) gives the
  JAX model's report: PGD is exact on it, so the counts match the ground truth."""
  pytest.importorskip("torch")
  pytest.importorskip("safetensors")
  import importlib.util  # noqa: PLC0415

  if importlib.util.find_spec("torchax") is None:
    pytest.skip("torchax is not installed")
  root, *_ = workspace
  (root / "mytorch.py").write_text(TORCH_MODULE)
  code = cli.main(["evaluate", "--torch", f"{root / 'mytorch.py'}:make_torch_model", "--data",
                   str(root / "data.npz"), "--eps", EPS_TEXT, "--attack", "pgd,fgsm",
                   "--batch-size", "32", "--quiet", "--out", str(root / "torch"), "--devices", "2"])
  assert code == 0
  got = json.loads((root / "torch" / "report.json").read_text())
  assert got["worst_case"] == reference["worst_case"]
  assert got["attacks"] == reference["attacks"]
  assert got["provenance"]["model"] == f"--torch {root / 'mytorch.py'}:make_torch_model"


@pytest.mark.parametrize("case, match", [
    ("training mode", "--torch: ValueError: the module is in training mode"),
    ("no model", "give the model either as MODULE:FUNCTION"),
    ("torch without --torch", "make_torch_model() returned a PyTorch module (Sequential): give it "
     "as --torch "),
    ("NCHW data", "--torch: x has shape (4, 3, 8, 8), which looks channels-first (NCHW), but the "
     ".npz holds channels-last images [N, H, W, C] with --torch too"),
])
def test_torch_mistakes_exit_2_with_one_clear_line(workspace, capsys, case, match):
  root, *_ = workspace
  data = root / "data.npz"
  if case in ("torch without --torch", "NCHW data"):
    pytest.importorskip("torch")
    (root / "mytorch.py").write_text(TORCH_MODULE)
    model = [f"{root / 'mytorch.py'}:make_torch_model"]
    if case == "NCHW data":
      data = root / "nchw.npz"
      np.savez(data, x=np.full((4, 3, 8, 8), 0.5, np.float32), y=np.zeros(4, np.int64))
      model = ["--torch", *model]
  elif case == "training mode":
    pytest.importorskip("torch")
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("torchax") is None:
      pytest.skip("torchax is not installed")
    (root / "mytorch.py").write_text(TORCH_MODULE)
    model = ["--torch", f"{root / 'mytorch.py'}:make_training_model"]
  else:
    model = []
  code = cli.main(["evaluate", *model, "--data", str(data), "--eps", "0.1",
                   "--quiet", "--out", str(root / "never")])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1 and match in err, err
  assert "module.eval()" in err or case != "training mode"


def test_every_attack_name_builds_its_attack_or_names_the_norm():
  for norm in ("linf", "l2", "l1"):
    for name in cli_evaluate.ATTACKS:
      try:
        attack = cli_evaluate.build_attacks([name], norm, 3)[name]
      except cli_evaluate.UserError as error:
        assert f"--attack {name} with --norm {norm}: " in str(error)
        continue
      assert attack.norm == norm, (name, norm)
  bb = cli_evaluate.build_attacks(["brendel_bethge"], "l2", 7)["brendel_bethge"]
  assert bb.minimum_norm and bb.num_steps == 7
  bb = cli_evaluate.build_attacks(["brendel_bethge"], "l1", None)["brendel_bethge"]
  assert bb.norm == "l1" and bb.num_steps == 1000


def test_data_smaller_than_the_batch_runs_on_devices_that_do_not_divide_it(workspace, reference):
  """7 examples on 2 devices: the batch, shrunk to the data's 7 (from --batch-size 32), is rounded
  up to 8 (jr.evaluate pads and masks it) instead of failing on a size the user never typed; the
  counts are those of the reference run on these 7 examples."""
  root, *_ = workspace
  assert evaluate(root, "seven", "--devices", "2", "--limit", "7") == 0
  got = json.loads((root / "seven" / "report.json").read_text())
  assert (got["provenance"]["evaluate"]["devices"], got["provenance"]["evaluate"]["batch_size"],
          got["num_examples"]) == (2, 8, 7)
  with np.load(root / "reference" / "per_example.npz") as per:
    want = per["worst_case"][:, :7].sum(axis=1)
  assert got["worst_case"]["robust_count"] == want.tolist()
  assert got["clean_correct"] == 2  # the first five are misclassified (see workspace)


def test_targeted_attacks_use_at_most_c_minus_1_targets(workspace):
  """apgd_t and fab_t (9 targets, AutoAttack's) run on a 5-class model with 4 targets and fab_t
  on the 2-class model with 1, instead of refusing a number the command line cannot change."""
  root, *_ = workspace
  for model, attacks, targets in [("make_five_class_model", "apgd_t,fab_t", 4),
                                  ("make_model", "fab_t", 1)]:
    out = f"targets{targets}"
    assert evaluate(root, out, "--attack", attacks, "--steps", "2", "--limit", "8",
                    "--batch-size", "8", model=model) == 0, model
    got = json.loads((root / out / "report.json").read_text())
    configs = {name: a["config"] for name, a in got["provenance"]["attacks"].items()}
    assert set(configs) == set(attacks.split(","))
    assert all(c["targeted"] and c["n_target_classes"] == targets for c in configs.values())
    assert got["worst_case"]["robust_count"][0] <= got["clean_correct"]


@pytest.mark.parametrize("classes, targets", [(None, 9), (2, 1), (4, 3), (10, 9), (1000, 9)])
def test_build_attacks_gives_min_9_c_minus_1_targets(classes, targets):
  names = ["fab_t"] if classes == 2 else ["fab_t", "apgd_t"]  # targeted DLR needs 4 classes
  for attack in cli_evaluate.build_attacks(names, "linf", 3, num_classes=classes).values():
    assert json.loads(attack.config)["n_target_classes"] == targets


def test_queries_sets_square_alone_and_in_auto_attack(workspace):
  """--queries sets Square's query budget (square and auto_attack's member; default 5000), which
  --steps leaves alone; the report records it."""
  built = cli_evaluate.build_attacks(["square", "auto_attack"], "linf", 3, queries=7)
  square, auto = (json.loads(built[n].config) for n in ("square", "auto_attack"))
  assert square["queries"] == 7 and built["square"].num_steps == 7
  assert auto["queries"] == 7 and auto["steps"] == 3
  default = cli_evaluate.build_attacks(["square", "auto_attack"], "linf", 3)
  assert [json.loads(a.config)["queries"] for a in default.values()] == [5000, 5000]
  root, *_ = workspace
  assert evaluate(root, "square", "--attack", "square", "--steps", "2", "--queries", "5",
                  "--limit", "8", "--batch-size", "8") == 0
  attack = json.loads((root / "square" / "report.json").read_text())["provenance"]["attacks"][
      "square"]
  assert attack["config"]["queries"] == 5 and attack["num_steps"] == 5
