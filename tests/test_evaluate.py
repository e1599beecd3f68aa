"""Tests for jr.evaluate and jr.Report: references, invariance, sharding, HLO, checkpoints, streams.

Every run shares one tiny MLP and one pair of attacks (tests/evaluate_worker.setup), so that
jr.evaluate's cached compiled step is reused wherever the options agree.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import sys
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxrobust as jr
from jaxrobust import _checkpoint
from jaxrobust._options import RunOptions
from jaxrobust.evaluation import checkpointing
from jaxrobust.model import model_of

evaluate_lib = importlib.import_module("jaxrobust.evaluation.device_step")
from tests import evaluate_worker
from tests.models import linear_points, random_linear

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

BATCH = evaluate_worker.BATCH_SIZE


@pytest.fixture(scope="module")
def setup():
  return evaluate_worker.setup()


def run(setup, data=None, **kwargs):
  logits_fn, x, y, attacks, eps, key = setup
  options = {"attacks": attacks, "epsilons": eps, "key": key, "batch_size": BATCH, "progress": False,
                 "keep_per_example": True, "unroll": evaluate_worker.UNROLL}
  options.update(kwargs)
  return jr.evaluate(logits_fn, (x, y) if data is None else data, **options)


@pytest.fixture(scope="module")
def reference(setup):
  """Batches of 8: four full ones and a padded one of 5."""
  return run(setup)


def ragged(x, y, sizes):
  start = 0
  for size in sizes:
    yield x[start:start + size], y[start:start + size]
    start += size
  assert start == len(x)


# ------------------------------------------------------------------------------------------------
# Agreement with independent references.


def test_matches_robustness_curve_per_example(setup, reference):
  logits_fn, x, y, attacks, eps, key = setup
  pe = reference.per_example
  np.testing.assert_array_equal(pe["index"], np.arange(len(x)))
  # robustness_curve with one key folds in the example's position: the global index here.
  curves = jax.jit(lambda e, k: [jr.robustness_curve(
      a, logits_fn, jnp.asarray(x), jnp.asarray(y), e, k, unroll=evaluate_worker.UNROLL)
                                 for a in attacks.values()])(eps, key)
  for a, (name, curve) in enumerate(zip(attacks, curves)):
    np.testing.assert_array_equal(pe["robust"][a], np.asarray(curve.robust))
    np.testing.assert_array_equal(reference.attacks[name].robust_accuracy,
                                  np.asarray(curve.robust_accuracy))
    assert reference.attacks[name].auc == pytest.approx(float(curve.auc), abs=1e-6)
  clean = np.argmax(np.asarray(logits_fn(jnp.asarray(x))), axis=1) == y
  np.testing.assert_array_equal(pe["correct"], clean)
  assert reference.clean_correct == int(clean.sum())
  assert reference.clean_accuracy == pytest.approx(clean.mean())


def test_worst_case_is_per_example_over_attacks(reference):
  pe = reference.per_example
  np.testing.assert_array_equal(pe["worst_case"], pe["robust"].all(axis=0))
  np.testing.assert_array_equal(reference.worst_case.robust_count, pe["worst_case"].sum(axis=1))
  counts = np.stack([s.robust_count for s in reference.attacks.values()])
  assert np.all(reference.worst_case.robust_count <= counts.min(axis=0))
  # Curves are non-increasing in eps (the grid is sorted) and start below clean accuracy.
  for s in [*reference.attacks.values(), reference.worst_case]:
    assert np.all(np.diff(s.robust_count) <= 0)
    assert s.robust_count[0] <= reference.clean_correct


def test_linear_model_closed_form():
  """Two classes, Linf: PGD-3 (step 2.5/3 eps) and FGSM reach the optimal corner exactly."""
  model = random_linear(5, 12, 2)
  x, y, dist = linear_points(model, 6, 40, (3, 4), "linf")
  # Budgets halfway between the widest-spaced consecutive distances: no point lies near an eps.
  d = np.sort(dist[(dist > 0.005) & (dist < 0.15)])
  widest = np.sort(np.argsort(np.diff(d))[-3:])
  eps = ((d[widest] + d[widest + 1]) / 2).astype(np.float32)
  assert np.min(np.abs(dist[None, :] - eps[:, None])) > 1e-4
  report = jr.evaluate(model.logits_fn, (x, y),
                       attacks={"pgd": jr.attacks.pgd("linf", steps=3),
                                "fgsm": jr.attacks.fgsm("linf")},
                       epsilons=eps, key=jax.random.key(0), batch_size=16, progress=False)
  expected = (dist[None, :] > eps[:, None]).sum(axis=1)
  assert 0 < expected[-1] < expected[0] < len(x)  # the grid is informative
  for s in [*report.attacks.values(), report.worst_case]:
    np.testing.assert_array_equal(s.robust_count, expected)
  assert report.clean_accuracy == 1.0


# ------------------------------------------------------------------------------------------------
# Invariance: batch size, padding, ragged batches, batch order of the stream, devices.


def test_batch_size_padding_and_ragged_batches_do_not_matter(setup, reference):
  # (robustness_curve above ran all 37 examples as one batch and agreed per example.)
  _, x, y, *_ = setup
  assert run(setup, data=ragged(x, y, [8, 3, 8, 8, 8, 2])) == reference  # short batches mid-way
  assert run(setup, data=(x, y, np.arange(len(x)))) == reference  # explicit global indices
  with pytest.raises(ValueError, match="shape"):  # every batch must match the compiled one
    run(setup, data=[(x[:4], y[:4]), (x[4:8].reshape(4, 12), y[4:8])])


def test_explicit_indices_make_order_irrelevant(setup, reference):
  _, x, y, *_ = setup
  order = np.random.default_rng(0).permutation(len(x))
  shuffled = run(setup, data=(x[order], y[order], order))
  assert shuffled.to_json() == reference.to_json()
  back = np.argsort(shuffled.per_example["index"])
  for k, v in reference.per_example.items():
    np.testing.assert_array_equal(shuffled.per_example[k][..., back], v)


@pytest.mark.parametrize("shard_map", [False, True])
def test_eight_devices_explicit_mesh_bitwise_equal_one(setup, reference, shard_map):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets jax_num_cpu_devices=8)")
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
  report = run(setup, batch_size=16, mesh=mesh, use_shard_map=shard_map)  # 16 + 16 + padded 5
  assert report == reference
  if shard_map:  # data already sharded over the mesh's devices (slicing it crashed)
    _logits_fn, x, y, *_ = setup
    rows = NamedSharding(mesh, P("data"))
    placed = (jax.device_put(jnp.asarray(x[:32]), rows), jax.device_put(jnp.asarray(y[:32]), rows))
    assert run(setup, data=placed, batch_size=16, mesh=mesh) == run(
        setup, data=(x[:32], y[:32]), batch_size=16, mesh=mesh)


def test_eight_devices_auto_2d_mesh_named_batch_axis_bitwise_equal_one(setup, reference):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  mesh = jax.make_mesh((2, 4), ("model", "data"), axis_types=(AxisType.Auto,) * 2)
  assert run(setup, mesh=mesh, batch_axis="data") == reference  # replicated over "model"


def cached_step(identity, **options):
  """The compiled step jr.evaluate cached for a model (its identity: the logits_fn of a closure,
  the function of a partial) and options (``keep_per_example``, ``chunk_size``, ...; one device
  unless ``mesh`` is given)."""
  options = {"mesh": None, **options}
  found = []
  for (base, _), (step, _) in evaluate_lib._STEP_CACHE.items():
    kind, spec, _ = base[0]  # the Model's identity: (kind, spec, compute_dtype)
    model_identity = spec[0] if kind == "partial" else spec  # a partial's function
    keep_per_example, run_options, mesh = base[4:7]  # run_options: one RunOptions
    settings = {"keep_per_example": keep_per_example, "mesh": mesh, **run_options.provenance()}
    if model_identity is identity and all(settings[k] == v for k, v in options.items()):
      found.append(step)
  assert len(found) == 1, f"{len(found)} cached steps for this model and options"
  return found[0]


def test_no_retrace_across_batches_and_calls(setup, reference):
  logits_fn, x, y, _attacks, eps, _key = setup
  run(setup, data=(x[:16], y[:16]))  # two full batches: compiled (or cached) for batches of 8
  step = cached_step(logits_fn, keep_per_example=True, chunk_size=None)
  programs = step._cache_size()
  traced = len(evaluate_worker.CALLS)  # logits_fn counts its Python calls (= traces)
  # A new eps grid, a new key, other data and a padded last batch: no new program, and the step
  # is not traced again (that would call logits_fn once per attack step). Only the forward pass
  # is traced, to see the model as it is now (its weights could have changed since).
  again = run(setup, data=(x[:20], y[:20]), epsilons=eps * 0.5, key=jax.random.key(7))
  assert len(evaluate_worker.CALLS) - traced <= 2
  assert cached_step(logits_fn, keep_per_example=True, chunk_size=None) is step
  assert step._cache_size() == programs
  assert again.num_examples == 20 and again.per_example["index"].tolist() == list(range(20))


def affine(params, x):
  w, b = params
  return x.reshape(x.shape[0], -1) @ w + b[None, :]


def test_partial_model_arrays_are_step_arguments(setup):
  """functools.partial(apply, params): params are arguments, not constants; new params reuse it."""
  _, x, y, attacks, eps, key = setup
  rng = np.random.default_rng(4)
  models = [functools.partial(affine, (jnp.asarray(rng.normal(size=(12, 4)), jnp.float32),
                                       jnp.asarray(rng.normal(size=4), jnp.float32)))
            for _ in range(2)]
  reports, sizes = [], []
  for model in models:
    reports.append(jr.evaluate(model, (x, y), attacks={"fgsm": attacks["fgsm"]}, epsilons=eps,
                               key=key, batch_size=BATCH, progress=False))
    step = cached_step(affine)
    sizes.append(step._cache_size())
  assert sizes[0] == sizes[1] == 1  # the second parameter set reused the compiled program
  for model, report in zip(models, reports):  # ... and was really used
    clean = np.argmax(np.asarray(model(jnp.asarray(x))), axis=1) == y
    assert report.clean_correct == int(clean.sum())
  assert reports[0].clean_correct != reports[1].clean_correct
  arrays = model_of(models[0]).params
  args = (x[:BATCH], y[:BATCH], np.ones(BATCH, bool), np.arange(BATCH, dtype=np.uint32), eps,
          np.asarray(jax.random.key_data(key)), np.float32(0), np.float32(1))
  text = step.lower(arrays, *args).as_text()
  assert "tensor<12x4xf32>" in text
  assert not re.search(r"constant dense<[^\n]*tensor<12x4xf32>", text)


# ------------------------------------------------------------------------------------------------
# A model changed between calls (in place, as a training loop evaluating each epoch does) is
# evaluated as it is at call time; compiled code is reused only where it computes the same thing.

FGSM = {"fgsm": jr.attacks.fgsm("linf")}  # one object: the tests below share compiled steps
EPS_SMALL = np.array([0.02], np.float32)
_GLOBAL_WEIGHTS = None  # read by global_model, rebound by the test


def global_model(x):
  return x @ _GLOBAL_WEIGHTS


class ObjectModel:
  """A callable object: its weights and its Python scale are attributes, changed in place."""

  def __init__(self, weights, scale):
    self.weights, self.scale = weights, scale

  def __call__(self, x):
    return (x @ self.weights) * self.scale


def matmul(weights, x):
  return x @ weights


@pytest.fixture(scope="module")
def two_models():
  """16 points, 4 features, 3 classes; ``good`` classifies all of them, ``bad = -good`` none."""
  rng = np.random.default_rng(11)
  x = rng.uniform(0.0, 1.0, (16, 4)).astype(np.float32)
  good = rng.normal(size=(4, 3)).astype(np.float32)
  y = np.argmax(x @ good, axis=1).astype(np.int32)
  assert np.all(np.argmax(x @ -good, axis=1) != y)
  return x, y, jnp.asarray(good), jnp.asarray(-good)


def evaluate_small(logits_fn, x, y, **kwargs):
  return jr.evaluate(logits_fn, (x, y), attacks=FGSM, epsilons=EPS_SMALL, key=jax.random.key(0),
                     batch_size=8, progress=False, **kwargs)


def test_model_changed_in_place_is_evaluated_anew(two_models):
  """Regression: the step cache was keyed on the logits_fn object, so a second call after an
  in-place weight change repeated the first model's numbers (clean 1.0 reported, truth 0.0)."""
  from flax import nnx

  x, y, good, bad = two_models
  # The truth for each weight set: the same weights passed as arguments (a new partial each).
  truth = {id(w): evaluate_small(functools.partial(matmul, w), x, y) for w in (good, bad)}
  assert truth[id(good)].clean_accuracy == 1.0 and truth[id(bad)].clean_accuracy == 0.0

  module = nnx.Linear(4, 3, use_bias=False, rngs=nnx.Rngs(0))
  holder = ObjectModel(good, 1.0)

  def set_global(w):
    global _GLOBAL_WEIGHTS
    _GLOBAL_WEIGHTS = w

  def set_kernel(w):
    module.kernel.value = w

  def set_attribute(w):
    holder.weights = w

  cases = {"global rebound": (global_model, set_global, global_model),
           "object attribute": (holder, set_attribute, holder),
           "nnx kernel.value": (module, set_kernel, None)}
  for name, (model, set_weights, _) in cases.items():
    for w in (good, bad):
      set_weights(w)
      assert evaluate_small(model, x, y) == truth[id(w)], name
  for _, _, identity in cases.values():
    if identity is not None:  # the stale step (other captured weights) was dropped, not kept
      cached_step(identity)
  # The module's state is an argument: one compiled program served both weight sets.
  nnx_steps = [step for (base, _), (step, _) in evaluate_lib._STEP_CACHE.items()
               if base[0][0] == "nnx"]
  assert len(nnx_steps) == 1 and nnx_steps[0]._cache_size() == 1
  # The same weights again: the compiled step is reused (and no new program compiled), for a
  # closure over unchanged arrays as for a partial with the same or new parameters.
  step = cached_step(global_model)  # the loop above left the global at `bad`
  assert evaluate_small(global_model, x, y) == truth[id(bad)]
  assert cached_step(global_model) is step and step._cache_size() == 1
  step = cached_step(matmul)
  assert evaluate_small(functools.partial(matmul, good), x, y) == truth[id(good)]
  assert cached_step(matmul) is step and step._cache_size() == 1
  # A changed Python constant (not an array) is part of the traced program: a new step too.
  holder.weights, holder.scale = good, -1.0
  assert evaluate_small(holder, x, y) == truth[id(bad)]


# ------------------------------------------------------------------------------------------------
# The compiled attack loop needs no communication.

_COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter)"
                         r"(-start|-done)?\(")


def _computations(hlo: str) -> dict[str, str]:
  comps, name, lines = {}, None, []
  for line in hlo.splitlines():
    head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
    if head and name is None:
      name, lines = head.group(1), []
    elif line.startswith("}") and name is not None:
      comps[name] = "\n".join(lines)
      name = None
    elif name is not None:
      lines.append(line)
  return comps


def _called(text: str) -> set[str]:
  names = set(re.findall(r"(?:body|condition|to_apply|calls)=%?([\w.\-]+)", text))
  for group in re.findall(r"(?:branch_computations|called_computations)=\{([^}]*)\}", text):
    names.update(n.strip().lstrip("%") for n in group.split(","))
  return names


def test_hlo_attack_loop_has_no_collective(setup):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  logits_fn, x, y, attacks, eps, key = setup
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
  # The program jr.evaluate compiled for test_eight_devices_explicit_mesh_bitwise_equal_one[False]
  # (taken from its cache; compiled here if that test did not run).
  model = model_of(logits_fn)
  spec = jax.ShapeDtypeStruct((16, *x.shape[1:]), x.dtype, sharding=NamedSharding(mesh, P("data")))
  with jax.set_mesh(mesh):
    trace = evaluate_lib._trace_model(model, spec, None)
  options = RunOptions(unroll=evaluate_worker.UNROLL)  # jr.evaluate's, with the worker's unroll
  step = evaluate_lib._jitted_step(model, trace, attacks, jax.random.key_impl(key), True, options,
                                   mesh, "data", False)
  with jax.set_mesh(mesh):
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
    args = (put(x[:16], P("data")), put(y[:16], P("data")), put(np.ones(16, bool), P("data")),
            put(np.arange(16, dtype=np.uint32), P("data")), put(eps, P()),
            put(np.asarray(jax.random.key_data(key)), P()), put(np.float32(0), P()),
            put(np.float32(1), P()))
    hlo = step.lower(model.params, *args).compile().as_text()
  comps = _computations(hlo)
  bodies = {b for text in comps.values() for b in re.findall(r"body=%?([\w.\-]+)", text)}
  assert bodies, "expected the attack loops (over steps or eps) as while loops"
  inside, todo = set(), list(bodies)
  while todo:  # every computation reachable from a while body
    name = todo.pop()
    if name in inside or name not in comps:
      continue
    inside.add(name)
    todo.extend(_called(comps[name]))
  # Inside the loops (over eps; the unrolled attack steps sit in their bodies) no attack data
  # moves between devices: the only collectives allowed are all-reduces of integer scalars, the
  # reliability counts jr.run sums over the batch for each eps, and (early exit) whether any row
  # of the batch is left to attack; XLA may combine several into one all-reduce of a tuple.
  scalar = r"(s32|pred)\[\]"
  for name in inside:
    for line in comps[name].splitlines():
      if _COLLECTIVE.search(line):
        assert re.search(rf"= ({scalar}|\({scalar}(, {scalar})*\)) all-reduce\(", line), (
            f"collective in loop body {name}: {line}")
  assert _COLLECTIVE.search(hlo), "the global metric sum should be an all-reduce"


# ------------------------------------------------------------------------------------------------
# Checkpoints.


def crash_after(x, y, batches, batch=BATCH):
  for i, start in enumerate(range(0, len(x), batch)):
    if i == batches:
      raise RuntimeError("simulated crash")
    yield x[start:start + batch], y[start:start + batch]


def test_checkpoint_resume_equals_uninterrupted(setup, reference, tmp_path):
  _, x, y, *_ = setup
  path = tmp_path / "run.ckpt"
  with pytest.raises(RuntimeError, match="simulated crash"):
    run(setup, data=crash_after(x, y, 3), checkpoint=path)
  header, arrays = _checkpoint.load(path)
  assert header["state"]["position"] == 3 and header["state"]["n"] == 24
  assert arrays["per_example.index"].tolist() == list(range(24))
  resumed = run(setup, checkpoint=path)
  assert resumed == reference
  assert resumed.timing["examples_evaluated"] == len(x) - 24  # the first 24 were not redone
  assert run(setup, checkpoint=path) == reference  # a finished checkpoint: nothing left to do
  assert not [p for p in tmp_path.iterdir() if p.name != "run.ckpt"]  # no temporary files left


def test_checkpoint_resumes_on_another_mesh_or_none(setup, reference, tmp_path):
  """A run's verdicts do not depend on the devices, so neither does its checkpoint: one written on
  an 8-device mesh resumes without a mesh and the other way round (both were refused as written
  for "a different model": the sharded trace's text carries the mesh). A checkpoint holding the
  sharded trace's digest, as earlier versions wrote on a mesh, still resumes on that mesh."""
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  _, x, y, *_ = setup
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
  on_mesh = {"mesh": mesh, "use_shard_map": True}  # the steps test_eight_devices_... compiled
  for written, resumed in ((on_mesh, {}), ({}, {"mesh": mesh})):
    path = tmp_path / f"{len(written)}.ckpt"
    with pytest.raises(RuntimeError, match="simulated crash"):
      run(setup, data=crash_after(x, y, 1, 16), batch_size=16, checkpoint=path, **written)
    again = run(setup, batch_size=16, checkpoint=path, **resumed)
    assert again == reference and again.timing["examples_evaluated"] == len(x) - 16
  path = tmp_path / "earlier.ckpt"
  with pytest.raises(RuntimeError, match="simulated crash"):
    run(setup, data=crash_after(x, y, 1, 16), batch_size=16, checkpoint=path, **on_mesh)
  header, arrays = _checkpoint.load(path)
  spec = jax.ShapeDtypeStruct((16, *x.shape[1:]), jnp.float32,
                              sharding=NamedSharding(mesh, P("data")))
  sharded = evaluate_lib._trace_model(model_of(setup[0]), spec, None).program
  assert sharded != header["model"]["program"]
  header["model"]["program"] = sharded
  _checkpoint.save(path, header, arrays)
  with pytest.raises(ValueError, match="different model"):
    run(setup, batch_size=16, checkpoint=path)
  assert run(setup, batch_size=16, checkpoint=path, **on_mesh) == reference


def test_checkpoint_refuses_another_run(setup, tmp_path):
  _logits_fn, x, y, attacks, eps, _key = setup
  path = tmp_path / "run.ckpt"
  with pytest.raises(RuntimeError):
    run(setup, data=crash_after(x, y, 2), checkpoint=path)
  with pytest.raises(ValueError, match="epsilons"):
    run(setup, checkpoint=path, epsilons=eps * 2)
  with pytest.raises(ValueError, match="key"):
    run(setup, checkpoint=path, key=jax.random.key(99))
  with pytest.raises(ValueError, match="batch_size"):
    run(setup, checkpoint=path, batch_size=4)
  with pytest.raises(ValueError, match="max_propagations"):  # a cap changes the verdicts
    run(setup, checkpoint=path, max_propagations=10)
  # Same attack names and descriptions, another step size: caught by the configuration digest.
  other = {"pgd": jr.attacks.pgd("linf", steps=3, step_size=0.5), "fgsm": attacks["fgsm"]}
  assert other["pgd"].name == attacks["pgd"].name
  with pytest.raises(ValueError, match="attacks"):
    run(setup, checkpoint=path, attacks=other)
  changed = x.copy()
  changed[9, 0, 0] = 0.5 * changed[9, 0, 0]  # in the second batch, already done
  with pytest.raises(ValueError, match="different data"):
    run(setup, data=(changed, y), checkpoint=path)
  with pytest.raises(ValueError, match="only 1"):
    run(setup, data=(x[:8], y[:8]), checkpoint=path)
  path.write_bytes(b"not a checkpoint")
  with pytest.raises(ValueError, match="not a jaxrobust.evaluate checkpoint"):
    run(setup, checkpoint=path)


def test_checkpoint_refuses_another_model(two_models, tmp_path):
  """Regression: the model was not fingerprinted, so an untrained model re-run with a trained
  model's checkpoint got the trained model's finished report back without evaluating anything."""
  from flax import nnx

  x, y, good, bad = two_models
  module = nnx.Linear(4, 3, use_bias=False, rngs=nnx.Rngs(0))

  def set_kernel(w):
    module.kernel.value = w

  def set_global(w):
    global _GLOBAL_WEIGHTS
    _GLOBAL_WEIGHTS = w

  cases = {"partial": (lambda: functools.partial(matmul, _GLOBAL_WEIGHTS), set_global),
           "nnx": (lambda: module, set_kernel),
           "closure over a global": (lambda: global_model, set_global)}
  for name, (model, set_weights) in cases.items():
    path = tmp_path / f"{name}.ckpt"
    set_weights(good)
    finished = evaluate_small(model(), x, y, checkpoint=path)
    set_weights(bad)  # "untrained": other weights, same architecture
    with pytest.raises(ValueError, match="different model: its weights"):
      evaluate_small(model(), x, y, checkpoint=path)
    set_weights(good)  # the same weights again resume (here: nothing left to do)
    again = evaluate_small(model(), x, y, checkpoint=path)
    assert again == finished and again.timing["examples_evaluated"] == 0, name
  # A changed Python constant is caught by the traced program.
  holder = ObjectModel(good, 1.0)
  evaluate_small(holder, x, y, checkpoint=tmp_path / "object.ckpt")
  holder.scale = -1.0
  with pytest.raises(ValueError, match="traced program differs"):
    evaluate_small(holder, x, y, checkpoint=tmp_path / "object.ckpt")


def test_checkpoint_writers_in_threads_never_collide(tmp_path):
  """Regression: the temporary file was named after the process id, so two threads
  checkpointing to one path wrote into and renamed each other's file (FileNotFoundError)."""
  import threading

  path, errors = tmp_path / "run.ckpt", []

  def write(writer):
    try:
      for step in range(25):
        _checkpoint.save(path, {"writer": writer, "step": step},
                         {"values": np.full(50_000, writer, np.int64)})
    except Exception as error:  # noqa: BLE001 - reported below
      errors.append(repr(error))

  threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors
  header, arrays = _checkpoint.load(path)
  assert header["step"] == 24 and np.all(arrays["values"] == header["writer"])  # one writer's
  assert [p.name for p in tmp_path.iterdir()] == ["run.ckpt"]  # no temporary file left


# ------------------------------------------------------------------------------------------------
# Streaming, progress, flags.


def test_generator_streams_with_bounded_memory(setup):
  _logits_fn, _x, _y, _attacks, _eps, _key = setup
  live, most = [0], [0]

  def dead():
    live[0] -= 1

  def stream():
    rng = np.random.default_rng(1)
    for _ in range(200):
      xb = rng.uniform(0.0, 1.0, (BATCH, 3, 4)).astype(np.float32)  # fresh arrays every batch
      yb = rng.integers(0, 4, BATCH).astype(np.int32)
      for a in (xb, yb):
        weakref.finalize(a, dead)
      live[0] += 2
      most[0] = max(most[0], live[0])
      yield xb, yb

  report = run(setup, data=stream())
  assert report.num_examples == 200 * BATCH
  # Two batches are alive when the next is read (the one just evaluated is released when its
  # name is rebound); a third may linger while XLA's runtime releases the input buffers it
  # aliased on CPU, later under load (seen once in a loaded -n 2 run). Retaining consumed
  # batches would keep hundreds alive.
  assert most[0] <= 6, f"{most[0]} batch arrays alive at once: consumed batches are retained"


def test_progress_bar_shows_rate_and_running_accuracy(setup, reference, capsys):
  report = run(setup, progress=True)
  err = capsys.readouterr().err
  assert "ex/s" in err and "robust=" in err and "clean=" in err
  assert f"{reference.num_examples}/{reference.num_examples}" in err
  # Before the first batch (while the program compiles) the bar says so, at 0 examples.
  assert "status=compiling the evaluation program" in err.split("clean=")[0]
  assert report == reference


def flagging_attack(threshold):
  """A no-op attack (x_adv = x) whose ``info`` flags inputs with a first pixel above threshold."""

  def drive(logits_fn, x, y, budget, keys, target, active, chunk_size):
    bright = jnp.any(active & (x.reshape(x.shape[0], -1)[:, 0] > threshold))
    return x, {"flags": {"bright_input": bright, "never": jnp.zeros((), bool)}}

  unused = lambda *args: None
  return jr.Attack(init=unused, step=unused, finalize=unused, num_steps=0, norm="linf",
                   name=f"flagger-{threshold}", drive=drive)


@pytest.mark.parametrize("shard_map", [False, True])
def test_reliability_flags_are_or_over_batches(setup, shard_map):
  if shard_map and len(jax.devices()) < 8:
    pytest.skip("needs 8 devices")
  logits_fn, x, y, _attacks, eps, key = setup
  x = np.minimum(x, 0.9)
  x[30, 0, 0] = 0.97  # one example in the fourth batch
  y = np.argmax(np.asarray(logits_fn(jnp.asarray(x))), axis=1).astype(np.int32)  # all correct
  mesh = jax.make_mesh((8,), ("data",)) if shard_map else None
  attack = {"flag": flagging_attack(0.95)}  # one object: both runs share the compiled step
  report = jr.evaluate(logits_fn, (x, y), attacks=attack, epsilons=eps,
                       key=key, batch_size=BATCH, progress=False, mesh=mesh,
                       use_shard_map=shard_map)
  # jr.run's own checks (non-finite gradients, ...) come too; this finite model raises none.
  own = {k: False for k in report.flags["flag"] if k not in ("bright_input", "never")}
  assert report.flags == {"flag": {"bright_input": True, "never": False, **own}}
  assert not report.reliable
  # x_adv = x breaks nothing.
  np.testing.assert_array_equal(report.attacks["flag"].robust_count, [len(x)] * len(eps))
  quiet = jr.evaluate(logits_fn, (x[:24], y[:24]), attacks=attack,
                      epsilons=eps, key=key, batch_size=BATCH, progress=False, mesh=mesh,
                      use_shard_map=shard_map)
  assert quiet.flags == {"flag": {"bright_input": False, "never": False, **own}} and quiet.reliable


def square_like_attack():
  """A no-op attack (x_adv = x) reporting AutoAttack's Square check as auto_attack does: the
  points "only Square broke" (here: clean-correct ones whose first input is above 0.999) are
  counted, and each call decides the flag against 0.2% of its own batch."""
  from jaxrobust.metrics.checks import SQUARE_ONLY_FRACTION as SQUARE_THRESHOLD

  def drive(logits_fn, x, y, budget, keys, target, todo, chunk_size):
    only_square = todo & (x.reshape(x.shape[0], -1)[:, 0] > 0.999)
    count = jnp.sum(only_square, dtype=jnp.int32)
    flag = count.astype(jnp.float32) > SQUARE_THRESHOLD * x.shape[0]
    return x, {"flags": {"square_beats_white_box": flag},
               "counts": {"square_only_points": count}}

  unused = lambda *args: None
  return jr.Attack(init=unused, step=unused, finalize=unused, num_steps=0, norm="linf",
                   name="square-like", drive=drive)


def test_square_flag_is_decided_on_global_counts_for_any_batch_size():
  """Regression: the flag compared each batch's count with 0.002 x its padded rows, so the same
  data raised it at batch size 20 or 60 and not at 600. AutoAttack's rule, over the data set:
  flag when more than 0.2% of all N points were broken by Square alone."""
  rng = np.random.default_rng(5)
  x = rng.uniform(0.0, 0.99, (600, 4)).astype(np.float32)
  weights = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
  attack = {"aa": square_like_attack()}
  mesh = jax.make_mesh((8,), ("data",)) if len(jax.devices()) >= 8 else None
  for planted, expected in ((1, False), (2, True)):  # 1 > 0.002 * 600 = 1.2 is false, 2 > 1.2 true
    data = x.copy()
    data[rng.choice(600, planted, replace=False), 0] = 1.0
    y = np.argmax(data @ np.asarray(weights), axis=1).astype(np.int32)  # all clean-correct
    reports = []
    # Batches of 20 (each judged alone: 1 > 0.04), the whole set, and devices of 10 (shard_map).
    for batch_size, options in ((20, {}), (600, {}), (80, {"mesh": mesh, "use_shard_map": True})):
      if options.get("mesh", True) is None:
        continue
      reports.append(jr.evaluate(functools.partial(matmul, weights), (data, y), attacks=attack,
                                 epsilons=EPS_SMALL, key=jax.random.key(0),
                                 batch_size=batch_size, progress=False, **options))
    for report in reports:
      assert report.flags["aa"]["square_beats_white_box"] is expected, planted
      assert report.attacks["aa"].counts["square_only_points"].tolist() == [planted]
      assert report == reports[0]


def nan_gradient_model(w, v, x):
  """Finite logits ``x @ w``; the input gradient is NaN where ``x @ v`` is exactly 0: there
  d sqrt(u ** 2)/du = u / |u| is 0 / 0, and 0 * NaN is NaN."""
  return x @ w + 0.0 * jnp.sqrt((x @ v) ** 2)


def test_eps_zero_reproduces_clean_accuracy_with_nan_gradients():
  """At eps = 0 robust accuracy equals clean accuracy exactly, even where the model's input
  gradient is NaN (a NaN step must not turn into a NaN point scored as a misclassification), and
  the non-finite gradients are flagged with their exact count (padding not counted)."""
  rng = np.random.default_rng(2)
  x = rng.uniform(0.0, 1.0, (21, 4)).astype(np.float32)  # batches of 8: the last one padded
  w = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
  v = jnp.asarray([[1.0], [-1.0], [0.0], [0.0]], jnp.float32)  # NaN gradient where x0 == x1
  nan_rows = [1, 2, 7, 11, 16]  # 16: the first row of the padded batch, copied into its padding
  x[nan_rows, 1] = x[nan_rows, 0]
  y = np.argmax(x @ np.asarray(w), axis=1).astype(np.int32)
  y[::5] = (y[::5] + 1) % 3  # some clean errors
  model = functools.partial(nan_gradient_model, w, v)
  report = jr.evaluate(model, (x, y), attacks={"pgd": jr.attacks.pgd(steps=1)},
                       epsilons=np.array([0.0, 0.05], np.float32), key=jax.random.key(1),
                       batch_size=8, progress=False)
  clean = np.argmax(x @ np.asarray(w), axis=1) == y
  assert report.clean_correct == int(clean.sum())
  for summary in [*report.attacks.values(), report.worst_case]:
    assert summary.robust_count[0] == report.clean_correct, summary.name
  # The independent count: clean-correct points whose cross-entropy input gradient is not finite.
  grad = jax.jit(jax.grad(lambda z: jnp.sum(jr.losses.cross_entropy(model(z), y))))(x)
  bad = clean & ~np.all(np.isfinite(np.asarray(grad)), axis=1)
  assert 0 < bad.sum() < clean.sum() and bad[16]
  assert report.flags["pgd"]["non_finite_gradients"]
  # Counted once per example (not once per eps): the clean gradient does not depend on eps.
  assert report.attacks["pgd"].counts["non_finite_gradient_points"].tolist() == bad.sum()


# ------------------------------------------------------------------------------------------------
# Report.


def test_report_save_load_json_and_curve(reference, tmp_path):
  again = jr.Report.load(reference.save(tmp_path / "r"))
  assert again == reference
  d = json.loads(reference.to_json())
  assert d["num_examples"] == 37 and set(d["attacks"]) == {"pgd", "fgsm"}
  assert "timing" not in d and "timing" in json.loads((tmp_path / "r" / "report.json").read_text())
  curve = reference.curve("fgsm")
  np.testing.assert_array_equal(curve.robust, reference.per_example["robust"][1])
  np.testing.assert_allclose(curve.robust_accuracy, curve.robust.mean(axis=1))
  with pytest.raises(ValueError, match="Unknown attack"):
    reference.curve("nope")
  assert "worst_case" in str(reference)


def test_static_diagnosis_is_kept_shown_and_judged(setup, reference, tmp_path):
  """jr.evaluate diagnoses the model it evaluates (jr.diagnose): a clean model's report has an
  empty diagnosis and its reliability is its flags'; a planted stop_gradient on the input is
  found, warned about, shown, kept through save/load and from_dict, and makes the report
  unreliable; diagnose=False leaves it out. Nothing of it enters to_dict() but provenance."""
  logits_fn, x, y, _attacks, eps, key = setup
  assert reference.diagnosis == () and reference.reliable
  assert reference.provenance["diagnosis"] == {"findings": []}
  assert str(reference).endswith("Gradient masking (static): none found")

  def masked(v):
    return logits_fn(jax.lax.stop_gradient(v))  # the planted mask

  options = {"attacks": {"flag": flagging_attack(2.0)}, "epsilons": eps, "key": key,
             "batch_size": BATCH, "progress": False}  # a no-op attack that never flags
  with pytest.warns(jr.diagnosis.GradientMaskingWarning,
                    match=r"stop_gradient \(stop_gradient\) at test_evaluate\.py:\d+.*Remedy: "
                    r"stop_gradient: Remove it") as caught:
    report = jr.evaluate(masked, (x[:8], y[:8]), **options)
  assert len(caught) == 1 and caught[0].filename == __file__  # once, at the caller's line
  (finding,) = report.diagnosis
  assert (finding.kind, finding.severity, finding.primitive) == (
      "stop_gradient", "error", "stop_gradient")
  assert finding.line == masked.__code__.co_firstlineno + 1
  # The attack flags nothing of its own; the clean pass sees the mask as zero gradients.
  clean_pass = {"zero_gradients", "non_finite_gradients", "non_finite_logits",
                "probability_outputs", "non_finite_adversarials", "non_finite_adversarial_logits"}
  assert not any(v for k, v in report.flags["flag"].items() if k not in clean_pass)
  assert report.flags["flag"]["zero_gradients"] and not report.reliable
  text = str(report).splitlines()
  assert text[-2] == "Gradient masking (static): 1 error, 0 warnings"
  assert "stop_gradient" in text[-1] and "test_evaluate.py:" in text[-1] and "BPDA" in text[-1]
  assert "diagnosis" not in json.dumps(report.to_dict(include_provenance=False))
  for again in (jr.Report.load(report.save(tmp_path / "masked")),
                jr.Report.from_dict(json.loads(report.to_json())),
                report.with_certified("none", np.zeros(len(eps), np.int64))):
    assert again.diagnosis == report.diagnosis and not again.reliable
  skipped = jr.evaluate(masked, (x[:8], y[:8]), diagnose=False, **options)  # no warning
  assert skipped.diagnosis is None and "diagnosis" not in skipped.provenance
  assert skipped == report and "Gradient masking" not in str(skipped)
  # Without the static diagnosis the clean pass's zero gradients still make it unreliable.
  assert not skipped.reliable and skipped.flags["flag"]["zero_gradients"]


def test_report_round_trips_minimal_norms(tmp_path):
  per = {"index": np.arange(3), "correct": np.array([True, True, False]),
         "robust": np.zeros((1, 2, 3), bool), "worst_case": np.zeros((2, 3), bool),
         "eps_star/fmn": np.array([0.1, np.inf, 0.0], np.float32)}
  report = jr.Report.from_counts(epsilons=np.array([0.1, 0.2]), n=3, clean_correct=2,
                                 robust={"fmn": np.array([1, 1])}, worst_case=np.array([1, 1]),
                                 info={"fmn": ("fmn-linf", "linf", True)}, flags={"fmn": {}},
                                 per_example=per)
  again = jr.Report.load(report.save(tmp_path))
  assert again == report
  assert again.per_example["eps_star/fmn"].tolist() == [np.float32(0.1), np.inf, 0.0]
  changed = dict(per, **{"eps_star/fmn": np.array([0.1, np.inf, 0.5], np.float32)})
  assert report != jr.Report.from_counts(
      epsilons=np.array([0.1, 0.2]), n=3, clean_correct=2, robust={"fmn": np.array([1, 1])},
      worst_case=np.array([1, 1]), info={"fmn": ("fmn-linf", "linf", True)}, flags={"fmn": {}},
      per_example=changed)


# ------------------------------------------------------------------------------------------------
# Bad configurations and data.


def test_bad_inputs_raise_clear_errors(setup):
  _logits_fn, x, y, attacks, _eps, key = setup
  with pytest.raises(ValueError, match="targeted"):
    run(setup, attacks={"t": jr.attacks.pgd("linf", steps=3, targeted=True)})
  with pytest.raises(ValueError, match="one norm"):
    run(setup, attacks={"a": attacks["pgd"], "b": jr.attacks.pgd("l2", steps=3)})
  with pytest.raises(ValueError, match="larger than batch_size"):
    run(setup, data=[(x[:9], y[:9])])
  with pytest.raises(ValueError, match="box"):
    run(setup, data=(x * 2, y))
  with pytest.raises(ValueError, match=r"\[0, 4\)"):
    run(setup, data=(x, y + 4))
  # A bad value in a later batch names that batch (the earlier ones are done and checkpointed).
  with pytest.raises(ValueError,
                     match=r"^batch 2 of the data \(counting from 1\): y must lie in \[0, 4\)"):
    run(setup, data=[(x[:8], y[:8]), (x[8:16], y[8:16] + 4)], batch_size=8)
  with pytest.raises(ValueError,
                     match=r"^batch 2 of the data \(counting from 1\): Batch sizes differ"):
    run(setup, data=[(x[:8], y[:8]), (x[8:16], y[8:15])], batch_size=8)
  with pytest.raises(ValueError, match="batch_size"):
    run(setup, batch_size=0)
  with pytest.raises(ValueError, match="single PRNG key"):
    run(setup, key=jax.random.split(key, 3))
  with pytest.raises(ValueError, match="epsilons"):
    run(setup, epsilons=np.array([8.0]))
  with pytest.raises(ValueError, match="empty"):
    run(setup, data=iter([]))
  with pytest.raises(TypeError, match="jr.Attack"):
    run(setup, attacks=[attacks["pgd"]])
  if len(jax.devices()) >= 8:
    with pytest.raises(ValueError, match="multiple of the mesh axis"):
      run(setup, batch_size=12, mesh=jax.make_mesh((8,), ("data",)))


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_compute_skipping_on_a_mesh_equals_one_device(axis_type):
  """chunk_size with a mesh: per-device compaction, with the parameters as step arguments."""
  from jax.sharding import AxisType

  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets jax_num_cpu_devices=8)")
  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.normal(size=(16, 5)), jnp.float32)

  def apply(w, x):
    return jnp.tanh(x.reshape(x.shape[0], -1) @ w) * 4

  x = rng.uniform(0, 1, (64, 4, 4, 1)).astype(np.float32)
  y = np.asarray(jnp.argmax(apply(w, jnp.asarray(x)), 1)).astype(np.int32)
  attack = jr.attacks.ensemble(jr.attacks.fgsm(), jr.attacks.pgd(steps=3))
  kind = AxisType.Explicit if axis_type == "explicit" else AxisType.Auto
  mesh = jax.make_mesh((8,), ("batch",), axis_types=(kind,))
  common = dict(attacks={"e": attack}, epsilons=[0.05, 0.1], key=jax.random.key(0),
                batch_size=32, progress=False)
  sharded = jr.evaluate(functools.partial(apply, w), (x, y), mesh=mesh, chunk_size=4, **common)
  single = jr.evaluate(functools.partial(apply, w), (x, y), **common)
  np.testing.assert_array_equal(np.asarray(sharded.worst_case.robust_accuracy),
                                np.asarray(single.worst_case.robust_accuracy))
  assert 0 < float(single.worst_case.robust_accuracy[-1]) < float(single.clean_accuracy)


def test_cross_eps_skipping_evaluates_fewer_rows_with_the_same_report():
  """With chunk_size a point broken at a small eps never reaches the model at larger ones: the
  model sees fewer rows than the same grid attacked eps by eps, and the report is unchanged."""
  model = random_linear(5, 6, 3)
  x, y, distance = linear_points(model, 6, 24, (6,), "linf")
  rows = []

  def counted(inputs):
    jax.debug.callback(lambda n: rows.append(int(n)), jnp.asarray(inputs.shape[0]))
    return model.logits_fn(inputs)

  attack = {"pgd": jr.attacks.pgd("linf", steps=5, random_start=False)}
  eps = np.quantile(distance, [0.2, 0.4, 0.6, 0.8]).astype(np.float32) * np.float32(1.1)
  common = dict(attacks=attack, key=jax.random.key(0), batch_size=8, progress=False)

  def evaluated(epsilons, chunk_size):
    rows.clear()
    report = jr.evaluate(counted, (x, y), epsilons=epsilons, chunk_size=chunk_size, **common)
    return report, sum(rows)

  skipping, skipping_rows = evaluated(eps, 4)
  dense, _ = evaluated(eps, None)
  eps_by_eps = [evaluated(eps[k:k + 1], 4) for k in range(len(eps))]
  assert skipping.attacks["pgd"].robust_count.tolist() == dense.attacks["pgd"].robust_count.tolist()
  # A deterministic attack: each single-eps run breaks the same points as the grid run does at
  # that eps (before the worst case over smaller eps is taken).
  singles = [r.attacks["pgd"].robust_count[0] for r, _ in eps_by_eps]
  assert np.minimum.accumulate(singles).tolist() == dense.attacks["pgd"].robust_count.tolist()
  broken_early = dense.clean_correct - dense.attacks["pgd"].robust_count[0]
  assert broken_early > 0  # so there is something to skip
  # Attacking eps by eps in one call (no skipping) would cost the single runs' rows less their
  # repeated clean passes (one forward per example and call).
  without_skipping = sum(n for _, n in eps_by_eps) - (len(eps) - 1) * len(x)
  assert skipping_rows < without_skipping


def test_progress_without_tqdm_prints_a_text_line(monkeypatch, capsys):
  """tqdm is an optional extra: without it the progress bar is a plain line on stderr."""
  monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # makes `from tqdm.auto import ...` fail
  monkeypatch.setitem(sys.modules, "tqdm", None)
  x = np.array([[0.6, 0.4], [0.9, 0.1], [0.3, 0.7]], np.float32)
  report = jr.evaluate(lambda v: v @ jnp.array([[1.0, -1.0], [-1.0, 1.0]]), (x, np.array([0, 0, 1])),
                       attacks=jr.attacks.fgsm(), epsilons=[0.15], key=jax.random.key(0),
                       batch_size=2, progress=True)
  err = capsys.readouterr().err
  assert "jr.evaluate: 3/3 ex" in err and "clean=1.0000" in err
  assert "jr.evaluate: 0/3 ex status=compiling the evaluation program" in err
  assert report.num_examples == 3


def test_a_hand_built_attack_is_identified_by_what_its_functions_capture():
  """Checkpoints identify factory-built attacks by their recorded config and hand-built ones
  (``config=None``) by the static values their closures capture: another threshold, another
  digest; the same, the same."""
  digest = checkpointing.attack_digest
  assert flagging_attack(0.5).config is None
  assert digest(flagging_attack(0.5)) == digest(flagging_attack(0.5))
  assert digest(flagging_attack(0.5)) != digest(flagging_attack(0.25))
  assert digest(jr.attacks.fgsm()) != digest(jr.attacks.fgsm("l2"))


def test_a_minimum_norm_grid_ending_at_inf_has_a_finite_auc():
  """eps = inf is allowed for minimum-norm attacks ("no bound"): the report's AUC covers the
  finite eps (it was NaN, and NumPy's inf / inf warning failed the run under -W error)."""
  x = np.array([[0.6, 0.4], [0.9, 0.1], [0.3, 0.7]], np.float32)
  model = lambda v: v @ jnp.array([[1.0, -1.0], [-1.0, 1.0]])
  report = jr.evaluate(model, (x, np.array([0, 0, 1])), attacks={"fmn": jr.attacks.fmn("linf",
                       steps=5)}, epsilons=[0.15, np.inf], key=jax.random.key(0), batch_size=3,
                       progress=False)
  finite = jr.metrics.curve_auc(np.array([0.15], np.float32),
                                report.attacks["fmn"].robust_accuracy[:1],
                                report.clean_accuracy)
  assert report.attacks["fmn"].robust_count.tolist()[1] == 0  # unbounded: every point broken
  assert np.isfinite(report.worst_case.auc)
  np.testing.assert_allclose(report.attacks["fmn"].auc, float(finite), rtol=1e-6)
