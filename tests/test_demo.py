"""Tests of the digits demo: the data loader, the parameter cache, the driver
(:mod:`jaxrobust.demo.digits`) and the ``jaxrobust demo`` command."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxrobust import cli
from jaxrobust import training
from jaxrobust.cli import demo as demo_command
from jaxrobust.demo import data, digits, files
from jaxrobust.demo import train as train_lib

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

TINY = ["--epochs", "1", "--test-size", "64", "--num-eps", "3", "--steps", "3"]
REPORT_KEYS = {
  "jaxrobust_version", "jax_version", "backend", "python_version", "command", "seed", "dataset",
  "attack", "epsilons", "num_test_examples", "eval_batch_size", "models", "timings",
}
MODEL_KEYS = {
  "name", "training", "loaded_from_cache", "clean_accuracy", "robust_accuracy", "auc", "flags",
  "flag_counts", "train_seconds", "eval_seconds",
}


# ------------------------------------------------------------------------------------------------
# Data.


def test_load_digits_shapes_dtypes_range():
  x_train, y_train, x_test, y_test = data.load_digits()
  assert x_train.shape == (1257, 8, 8, 1) and x_test.shape == (540, 8, 8, 1)
  assert y_train.shape == (1257,) and y_test.shape == (540,)
  assert x_train.shape[0] + x_test.shape[0] == data.NUM_EXAMPLES
  assert x_train.dtype == np.float32 and x_test.dtype == np.float32
  assert y_train.dtype == np.int32 and y_test.dtype == np.int32
  for x in (x_train, x_test):
    assert x.min() == 0.0 and x.max() == 1.0
  # Stratified: every class is in the test split in its share (about 54 of ~180 each).
  counts = np.bincount(y_test, minlength=10)
  assert counts.min() >= 50 and counts.max() <= 56
  assert set(np.unique(y_train)) == set(range(10))


def test_load_digits_is_deterministic_and_seeded():
  first, second = data.load_digits(seed=0), data.load_digits(seed=0)
  for a, b in zip(first, second):
    np.testing.assert_array_equal(a, b)
  other = data.load_digits(seed=1)
  assert not np.array_equal(first[3], other[3])
  small = data.load_digits(test_fraction=0.1)
  assert small[2].shape == (180, 8, 8, 1)


def test_load_digits_rejects_bad_fraction():
  with pytest.raises(ValueError, match="test_fraction"):
    data.load_digits(test_fraction=1.0)


def test_load_digits_names_the_extra_when_sklearn_is_missing(monkeypatch):
  monkeypatch.setitem(sys.modules, "sklearn", None)
  with pytest.raises(ImportError, match=r"pip install 'jaxrobust\[demo\]'"):
    data.load_digits()


# ------------------------------------------------------------------------------------------------
# Training configuration and cache.


def test_cache_path_depends_on_the_whole_config(tmp_path):
  base = train_lib.training_config(True, epochs=2)  # True: the old flag for "adversarial"
  path = train_lib.cache_path(base, tmp_path)
  assert path.parent == tmp_path and path.name.startswith("adversarial-")
  assert train_lib.cache_path(train_lib.training_config("adversarial", epochs=2), tmp_path) == path
  for changed in (dict(epochs=3), dict(eps=0.1), dict(seed=1), dict(learning_rate=1e-3),
                  dict(batch_size=32)):
    assert train_lib.cache_path(train_lib.training_config(True, **{"epochs": 2, **changed}),
                                tmp_path) != path
  # Plain training ignores the attack radius.
  plain = train_lib.training_config(False, eps=0.1)
  assert train_lib.cache_path(plain, tmp_path) == train_lib.cache_path(
    train_lib.training_config("plain", eps=0.3), tmp_path)
  # One file per method, each named after it; the IBP radius is part of the IBP model's hash.
  paths = {m: train_lib.cache_path(train_lib.training_config(m), tmp_path)
           for m in train_lib.METHODS}
  assert len(set(paths.values())) == 4 and all(
    p.name.startswith(f"{m}-") for m, p in paths.items())
  assert train_lib.cache_path(train_lib.training_config("ibp", eps=0.05), tmp_path) != paths["ibp"]


def test_every_robust_model_is_trained_by_a_jr_training_loss():
  assert demo_command.MODEL_NAMES == train_lib.METHODS  # known to --models without the extra
  expected = {"plain": "softmax_cross_entropy",
              "adversarial": "jaxrobust.training.adversarial_loss",
              "trades": "jaxrobust.training.trades_loss", "ibp": "jaxrobust.training.ibp_loss"}
  for method, function in expected.items():
    config = train_lib.training_config(method)
    assert config["name"] == config["method"] == method and config["loss"]["function"] == function
    assert config["epochs"] == train_lib.DEFAULT_EPOCHS[method]
  assert train_lib.training_config("ibp")["loss"]["eps"] == train_lib.DEFAULT_IBP_EPS
  assert train_lib.training_config("trades")["loss"]["beta"] == train_lib.TRADES_BETA
  with pytest.raises(ValueError, match="unknown training method 'mart'"):
    train_lib.training_config("mart")
  with pytest.raises(ValueError, match="eps must be positive for ibp"):
    train_lib.training_config("ibp", eps=0.0)


def test_ibp_schedule_warms_up_ramps_and_holds_as_data():
  total, eps = 200, 0.1
  steps = np.arange(total)
  eps_t, kappa_t = jax.vmap(lambda t: train_lib.ibp_schedule(t, total, eps=eps))(steps)
  # Gowal et al.: eps 0 and kappa 1 through the warm-up (10%), a linear ramp over 50% of the
  # steps to eps and kappa 0.5, then held.
  ramp = np.clip((steps - 20) / 100, 0.0, 1.0)
  np.testing.assert_allclose(eps_t, eps * ramp, atol=1e-7)
  np.testing.assert_allclose(kappa_t, 1.0 - 0.5 * ramp, atol=1e-7)
  assert eps_t[:21].max() == 0.0 and kappa_t[:21].min() == 1.0
  assert np.all(np.diff(eps_t) >= 0) and np.all(np.diff(kappa_t) <= 0)
  assert eps_t[120] == np.float32(eps) and kappa_t[-1] == np.float32(0.5)
  # One epoch of 19 steps (the tests' tiny runs) still warms up, ramps and ends at eps.
  eps_short, _ = train_lib.ibp_schedule(18, 19, eps=eps)
  assert float(eps_short) == pytest.approx(eps)


def test_default_cache_dir_honours_xdg(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert files.default_cache_dir() == tmp_path / "jaxrobust"
  monkeypatch.setenv("XDG_CACHE_HOME", "")
  assert files.default_cache_dir().parts[-2:] == (".cache", "jaxrobust")


def _fake_fit(calls):
  def fit(config, *, progress=True):
    calls.append(config["name"])
    return train_lib._init_fn(config["num_classes"])(jax.random.key(config["seed"]))

  return fit


def test_cache_round_trip_and_corrupt_file_retrains(monkeypatch, tmp_path):
  calls = []
  monkeypatch.setattr(train_lib, "fit", _fake_fit(calls))
  config = train_lib.training_config(False, epochs=1)
  params, cached = train_lib.load_or_train(config, cache_dir=tmp_path, progress=False)
  assert not cached and calls == ["plain"]
  path = train_lib.cache_path(config, tmp_path)
  assert path.is_file() and not list(tmp_path.glob("*.tmp"))

  again, cached = train_lib.load_or_train(config, cache_dir=tmp_path, progress=False)
  assert cached and calls == ["plain"]
  jax.tree.map(np.testing.assert_array_equal, params, again)

  for garbage in (b"", b"\x00not msgpack at all", path.read_bytes()[:100]):
    path.write_bytes(garbage)
    assert train_lib.load_cached(path, config) is None
    _, cached = train_lib.load_or_train(config, cache_dir=tmp_path, progress=False)
    assert not cached
  assert calls == ["plain"] * 4
  assert train_lib.load_cached(path, config) is not None  # the retrained file replaced it

  # train() without the cache neither reads nor writes it.
  train_lib.train(False, epochs=1, cache_dir=tmp_path / "unused", cache=False, progress=False)
  assert not (tmp_path / "unused").exists() and len(calls) == 5


# ------------------------------------------------------------------------------------------------
# Evaluation through jr.evaluate: batch-size independence, one compilation, reliability flags.


def _counting_compiles(fn):
  """``(fn(), number of XLA compilations during the call)``."""
  compiles = []

  def listener(event, duration_secs, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      compiles.append(duration_secs)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    result = fn()
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  return result, len(compiles)


def test_demo_evaluation_does_not_depend_on_batch_size_and_compiles_once_for_both_models():
  from jaxrobust.demo.model import SmallCNN
  import jaxrobust as jr

  _, _, x, y = data.load_digits()
  x, y = x[:40], y[:40]
  first, second = (train_lib._init_fn(10)(jax.random.key(seed)) for seed in (0, 1))
  apply_fn = SmallCNN().apply
  settings = dict(attack=jr.attacks.pgd("linf", steps=2),
                  epsilons=np.array([0.0, 0.05, 0.1], np.float32), key=jax.random.key(3),
                  progress=False)
  # Batches of 32 and 8 (+ 24 masked padding rows), then one batch of 40.
  padded, padded_compiles = _counting_compiles(
    lambda: digits._evaluate_model(apply_fn, first, x, y, batch_size=32, **settings))
  whole = digits._evaluate_model(apply_fn, first, x, y, batch_size=40, **settings)
  assert padded == whole  # every count, flag and AUC bitwise equal
  results = digits.model_results(padded)
  assert results == digits.model_results(whole)
  assert results["robust_accuracy"][0] == results["clean_accuracy"]
  assert np.all(np.diff(results["robust_accuracy"]) <= 0)

  # Other parameters of the same shapes (the demo's second model) reuse the compiled step ...
  other, other_compiles = _counting_compiles(
    lambda: digits._evaluate_model(apply_fn, second, x, y, batch_size=40, **settings))
  assert padded_compiles > 0 and other_compiles == 0
  # ... and are the ones evaluated: clean accuracies match a direct forward pass.
  for params, report in ((first, whole), (second, other)):
    predicted = np.argmax(np.asarray(apply_fn(params, x)), axis=-1)
    assert report.clean_correct == int(np.sum(predicted == y))


def test_model_results_report_non_finite_gradients():
  import jax.numpy as jnp
  import jaxrobust as jr

  def apply(weights, x):  # sqrt has an infinite derivative at 0, where each x has a coordinate
    return jnp.sqrt(x) @ weights

  x = np.array([[0.0, 0.9], [0.8, 0.0], [0.0, 0.5], [0.6, 0.0]], np.float32)
  y = np.array([1, 0, 1, 0], np.int32)  # all correctly classified by the identity weights
  report = digits._evaluate_model(apply, np.eye(2, dtype=np.float32), x, y,
                                  attack=jr.attacks.pgd("linf", steps=1),
                                  epsilons=np.array([0.1, 0.2], np.float32), key=jax.random.key(0),
                                  batch_size=4, progress=False)
  results = digits.model_results(report)
  assert results["clean_accuracy"] == 1.0
  assert results["flags"]["non_finite_gradients"] is True
  assert results["flag_counts"]["non_finite_gradient_points"] == 4  # once, not per eps
  json.dumps(results)  # JSON-ready


# ------------------------------------------------------------------------------------------------
# Command line.


@pytest.mark.parametrize("bad", [
  ["demo", "--models", "plain,mart"], ["demo", "--models", ","],
  ["demo", "--eps-max", "1.5"], ["demo", "--eps-max", "nan"], ["demo", "--num-eps", "1"],
  ["demo", "--steps", "0"], ["demo", "--restarts", "x"], ["demo", "--test-size", "0"],
  ["demo", "--epochs", "-1"], ["demo", "--bogus"], ["nope"], [],
])
def test_cli_rejects_bad_options(bad, capsys):
  assert cli.main(bad) == 2
  assert capsys.readouterr().err.strip()


def test_cli_test_size_larger_than_split(tmp_path, capsys):
  code = cli.main(["demo", "--test-size", "100000", "--cache-dir", str(tmp_path), "--quiet",
                   "--out", str(tmp_path / "r.json")])
  assert code == 1
  assert "exceeds the 540" in capsys.readouterr().err
  assert not (tmp_path / "r.json").exists()


def test_python_dash_m_help():
  done = subprocess.run([sys.executable, "-m", "jaxrobust", "demo", "--help"],
                        capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 0, done.stderr
  assert "--eps-max" in done.stdout and "plain,adversarial,trades,ibp" in done.stdout


def _check_report(report, names=train_lib.METHODS):
  assert REPORT_KEYS <= set(report)
  assert report["num_test_examples"] == 64
  assert report["jax_version"] == jax.__version__
  assert report["epsilons"] == [0.0, 0.15, 0.3]
  assert report["attack"]["steps"] == 3 and report["attack"]["norm"] == "linf"
  assert report["dataset"]["num_examples"] == 1797
  assert list(report["models"]) == list(names)
  for name, model in report["models"].items():
    assert MODEL_KEYS <= set(model)
    assert model["name"] == name and model["training"] == train_lib.training_config(name, epochs=1)
    robust = np.asarray(model["robust_accuracy"])
    assert robust.shape == (3,)
    assert np.all((robust >= 0) & (robust <= 1))
    assert np.all(np.diff(robust) <= 0)
    assert robust[0] == model["clean_accuracy"]
    assert 0 <= model["clean_accuracy"] <= 1 and 0 <= model["auc"] <= 1
    # A ReLU network's gradients are finite: every reliability flag is down, with zero counts.
    assert "non_finite_gradients" in model["flags"] and not any(model["flags"].values())
    assert model["flag_counts"]["non_finite_gradient_points"] == 0
  assert set(report["timings"]) >= {"train_seconds", "compile_seconds", "eval_seconds",
                                    "total_seconds"}


@pytest.mark.slow
@pytest.mark.run_bound  # it trains four models: 26 s with XLA's optimisation, 174 s without
def test_cli_demo_end_to_end_then_from_cache(monkeypatch, tmp_path, capsys):
  calls, losses = [], []
  real_fit = train_lib.fit

  def counting_fit(config, *, progress=True):
    calls.append(config["name"])
    return real_fit(config, progress=progress)

  def spy(name):  # records each jr.training loss the demo's training steps trace
    real = getattr(training, name)

    def loss(*args, **kwargs):
      losses.append(name)
      return real(*args, **kwargs)

    return loss

  monkeypatch.setattr(train_lib, "fit", counting_fit)
  for name in ("adversarial_loss", "trades_loss", "ibp_loss"):
    monkeypatch.setattr(training, name, spy(name))
  cache_dir, out = tmp_path / "cache", tmp_path / "out" / "report.json"
  args = ["demo", *TINY, "--cache-dir", str(cache_dir), "--out", str(out)]

  assert cli.main(args) == 0
  printed = capsys.readouterr().out
  header = next(line for line in printed.splitlines() if line.split()[:1] == ["eps"])
  assert header.split() == ["eps", *train_lib.METHODS]  # a column per model, in order
  assert "AUC" in printed and str(out.resolve()) in printed
  first = json.loads(out.read_text())
  _check_report(first)
  assert calls == list(train_lib.METHODS)
  # The robust models are trained by jaxrobust.training's losses (traced once per jitted step).
  assert losses == ["adversarial_loss", "trades_loss", "ibp_loss"]
  assert not any(m["loaded_from_cache"] for m in first["models"].values())
  cached_files = sorted(cache_dir.glob("*.msgpack"))
  assert [p.name.split("-")[0] for p in cached_files] == sorted(train_lib.METHODS)
  mtimes = [p.stat().st_mtime_ns for p in cached_files]

  # Again from the cache, three of the models (in another order), certified.
  some = ("ibp", "trades", "adversarial")
  assert cli.main([*args, "--quiet", "--certify", "--smoothing-n", "50",
                   "--models", ",".join(some)]) == 0
  assert "certified robust accuracy by CROWN" in capsys.readouterr().out
  second = json.loads(out.read_text())
  _check_report(second, names=some)
  # --certify: the bracket on the digits models, certified (IBP, CROWN) <= PGD at every eps.
  for model in second["models"].values():
    robust = np.asarray(model["robust_accuracy"])
    ibp = np.asarray(model["certified"]["ibp"]["robust_accuracy"])
    crown = np.asarray(model["certified"]["crown"]["robust_accuracy"])
    assert np.all(ibp <= robust) and np.all(crown <= robust) and np.all(ibp <= crown + 1e-9)
    assert ibp[0] == crown[0] == robust[0]  # at eps 0 every correct point is certified
    smoothing = model["smoothing"]
    assert smoothing["n"] == 50 and smoothing["norm"] == "l2"
    assert np.all(np.diff(smoothing["certified_accuracy"]) <= 0)
    assert smoothing["certified_accuracy"][-1] == 0.0  # 50 draws cannot certify L2 radius 0.5
  assert calls == list(train_lib.METHODS)  # no retraining
  assert all(m["loaded_from_cache"] for m in second["models"].values())
  assert [p.stat().st_mtime_ns for p in cached_files] == mtimes
  for name in some:  # same params, same keys: same numbers
    for field in ("clean_accuracy", "robust_accuracy", "auc"):
      assert second["models"][name][field] == first["models"][name][field]

  # One model: nothing to tell its compilation apart from (the step compiled in the first run).
  assert cli.main([*args, "--quiet", "--models", "ibp"]) == 0
  third = json.loads(out.read_text())
  _check_report(third, names=("ibp",))
  assert third["timings"]["compile_seconds"] is None
  assert third["models"]["ibp"]["robust_accuracy"] == first["models"]["ibp"]["robust_accuracy"]
  assert calls == list(train_lib.METHODS)
