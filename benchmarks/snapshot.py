#!/usr/bin/env python
"""A bitwise snapshot of the library's numerical results, for refactors that must not change any
bit (issue #25: "every array ``np.array_equal``").

What it computes: a flat dict ``name -> NumPy array`` of

* ``run/<attack>/<eps>/...``: ``jr.run`` of every attack of the conformance registry
  (``tests/test_attack_conformance.REGISTRY``, every factory with its configuration there) on a
  16-point problem of that file's shape (a tanh MLP, inputs ``[16, 4, 4, 1]``, 5 classes, two box
  corners), one per-example key each: ``x_adv``, ``success``, ``norm``, ``logits`` and every
  ``info`` flag and count (``run/<attack>/eps/info/counts/<name>``), at the file's finite eps, at a
  per-example eps alternating 0 and that eps, and, for minimum-norm attacks, at ``eps = inf``;
* ``curve/<case>/...``: ``jr.robustness_curve`` (``epsilons``, ``clean_accuracy``,
  ``robust_accuracy``, ``robust``, ``auc``, ``info``) on an unsorted grid with 0 and a duplicate:
  PGD with early exit (the default), dense (``early_exit=False``), chunked (``chunk_size=4``),
  vectorised (``eps_batch_size=0``) and in pairs (``eps_batch_size=2``); a targeted PGD; FMN
  (minimum norm, early exit and dense), DeepFool; an ensemble and AutoAttack (with
  ``robust_after``); EOT on a randomized model; and PGD, the ensemble and FMN on 8 CPU devices
  (``jax.make_mesh((8,), ("batch",))``, Explicit axis, ``x``/``y`` batch-sharded);
* ``evaluate/<case>/...``: ``jr.evaluate`` reports (``Report.to_dict()`` without provenance,
  flattened, and every ``per_example`` array) of PGD, FGSM and FMN with an IBP certifier on 21
  examples in batches of 8 (a padded last batch): without a checkpoint, with one (uninterrupted,
  then run again on the finished file), stopped after one batch (the data generator raises, as
  ``tests/test_evaluate.py`` does) then resumed, on an 8-device mesh, and once without the
  certifier and the per-example arrays;
* ``certify/...``: ``interval_bounds``, ``linear_bounds``, ``margin_bounds`` (IBP, CROWN),
  ``certify_bounds`` (IBP/CROWN, Linf/L2), ``smoothing``, ``smoothed_predict`` and
  ``certified_curve`` on small ReLU and tanh MLPs;
* ``training/<linen|nnx>/<loss>/...``: value, ``Aux`` and parameter gradients of
  ``jr.training.adversarial_loss``, ``trades_loss``, ``mart_loss`` and ``ibp_loss``, and
  ``robust_counts(...).compute()``, on a linen MLP (``functools.partial(model.apply, params)``) and
  on a ``flax.nnx`` MLP with BatchNorm in train mode (its updated batch statistics too; IBP in
  eval mode, as bounds need an affine BatchNorm; and Madry's loss attacking an eval-mode view);
* ``text/...``: ``jr.text.run`` (word swap, margin and CE losses, with ``swap_curve``) and
  ``jr.text.run_gcg`` (two configurations) on tiny models;
* ``metrics/<device|host>/...``: the reducers ``Counts``, ``CurveCounts`` (from flags and from
  norms), ``NormHistogram`` and ``Rate`` (plain and grouped: micro, macro), the generative rates,
  the formulas and ``binomial_interval``, computed on the device (under ``jit``) and on the host
  (``to_host()``, int64), plus ``binomial_interval_table``.

Every model parameter and data array is an argument of the ``jax.jit`` that computes with it,
never a constant closed over, so a refactor that changes how constants are folded cannot hide
behind the snapshot. Attack configurations (static) are closed over, as the factories intend.

Use around a refactor (an untouched copy of the old commit, so that nobody's edits leak in)::

  mkdir /tmp/before && git archive <old commit> | tar -x -C /tmp/before
  python /tmp/before/benchmarks/snapshot.py --write /tmp/before.npz
  python benchmarks/snapshot.py --compare /tmp/before.npz   # on the refactored tree

The script imports ``jaxrobust`` and ``tests`` from the tree it lives in (its parent directory
goes first on ``sys.path``, ahead of the editable install), and prints which ``jaxrobust`` it
used. ``--compare`` checks that both files hold exactly the same names, and per name the same
dtype, shape and values (``np.array_equal``, NaN equal to NaN for floats); it prints every
differing name (with the largest absolute difference where both are numeric of one shape) and
exits with status 1 on any difference, 0 otherwise.

Bitwise equality is only meaningful on one machine with one software stack and one set of XLA
flags: another CPU (vector width, FMA), jaxlib or flag can round differently in the last bit. The
script uses the test suite's XLA flags: it sets ``XLA_FLAGS`` through
``tests.xla_options.suite_xla_flags`` before JAX starts (XLA:CPU's legacy emitters,
``--xla_cpu_use_fusion_emitters=false``, unless ``JAXROBUST_TEST_XLA_DEFAULTS=1`` or ``XLA_FLAGS``
already chooses), and asks for 8 CPU devices and strict dtype and rank promotion as
``tests/conftest.py`` does. It compiles every program at XLA's default optimisation level
(``jax_disable_most_optimizations`` off), as the suite's unmarked modules do; the suite's
``compile_bound`` modules (the conformance tests among them) compile at level 0, which can round
differently, so their numbers need not equal these in the last bit. Run "before" and "after" with
the same environment. Runs with the same key and inputs are deterministic, so two passes on one
machine agree bit for bit (checked when the script was written, in two processes; one pass took
142 s of wall time and 146 s of CPU on a 2-core AMD EPYC, and 238 s while other jobs loaded it).

Not in the snapshot: ``Report.timing`` and ``Report.provenance`` (wall clock, versions, devices),
checkpoint files themselves (their resumed reports are), and the per-group ``compute()`` of a
grouped ``Rate`` on the host, which raises at the commit this was written on (its averages are
in).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's jaxrobust and tests, ahead of any installed copy

from tests.xla_options import suite_xla_flags  # noqa: E402 - no JAX import there

# Before jax is imported (XLA reads XLA_FLAGS once), as tests/conftest.py does.
os.environ["XLA_FLAGS"] = suite_xla_flags(os.environ.get("XLA_FLAGS", ""))

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_disable_most_optimizations", False)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxrobust as jr  # noqa: E402
from tests import test_training  # noqa: E402
from tests.test_attack_conformance import CLASSES, EPS, REGISTRY, SHAPE  # noqa: E402

BATCH = 16  # a multiple of 8: the 8-device curves shard it
Snapshot = dict  # name -> np.ndarray


# ------------------------------------------------------------------------------------------------
# Flattening results into named NumPy arrays.


def _leaf(value) -> np.ndarray:
  if isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
    value = jax.random.key_data(value)
  return np.asarray(value)


def flatten(prefix: str, tree, out: Snapshot) -> None:
  """Adds every array of ``tree`` (dicts, NamedTuples, dataclasses, lists, scalars, strings) to
  ``out`` under ``prefix/<field>/...``; ``None`` adds nothing."""
  if tree is None:
    return
  if isinstance(tree, dict) or (hasattr(tree, "items") and hasattr(tree, "keys")):
    for key in sorted(tree.keys(), key=str):
      flatten(f"{prefix}/{key}", tree[key], out)
  elif isinstance(tree, tuple) and hasattr(tree, "_fields"):
    for field in tree._fields:
      flatten(f"{prefix}/{field}", getattr(tree, field), out)
  elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
    for field in dataclasses.fields(tree):
      flatten(f"{prefix}/{field.name}", getattr(tree, field.name), out)
  elif isinstance(tree, (list, tuple)):
    array = np.asarray(tree) if tree else None
    if array is not None and array.dtype != object:
      _put(prefix, array, out)
    else:
      for i, item in enumerate(tree):
        flatten(f"{prefix}/{i}", item, out)
  else:
    _put(prefix, _leaf(tree), out)


def _put(name: str, array: np.ndarray, out: Snapshot) -> None:
  if name in out:
    raise KeyError(f"duplicate snapshot name {name!r}")
  if array.dtype == object:
    raise TypeError(f"{name}: not an array ({array!r})")
  out[name] = np.array(array)  # a copy, detached from any device buffer


# ------------------------------------------------------------------------------------------------
# The models: parameters are data, passed to every jitted function.


def tanh_mlp_params(seed: int, dim: int, hidden: int, classes: int) -> dict:
  """The weights of ``tests.models.mlp`` (same draws), as arguments instead of constants."""
  rng = np.random.default_rng(seed)
  return {"w1": jnp.asarray(rng.normal(size=(dim, hidden)) * 2 / np.sqrt(dim), jnp.float32),
          "w2": jnp.asarray(rng.normal(size=(hidden, classes)) / np.sqrt(hidden), jnp.float32)}


def tanh_mlp(params, x):
  hidden = jnp.tanh(x.reshape(x.shape[0], -1) @ params["w1"] - 1.0)
  return hidden @ params["w2"] * 4.0


relu_mlp_params, relu_mlp = test_training.mlp_params, test_training.mlp_apply


def per_example_keys(seed: int, n: int) -> jax.Array:
  return jax.vmap(lambda i: jax.random.fold_in(jax.random.key(seed), i))(jnp.arange(n))


def registry_problem():
  """The conformance problem's model, shapes and draws (tests/test_attack_conformance.problem)
  with 16 points, labelled by the model except three (its random labels would leave only 3 of
  16 points clean-correct, so that few would be attacked)."""
  params = tanh_mlp_params(0, int(np.prod(SHAPE)), 16, CLASSES)
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.uniform(0, 1, size=(BATCH,) + SHAPE), jnp.float32)
  x = x.at[0].set(0.0).at[1].set(1.0)  # corners of the box
  y = np.argmax(np.asarray(tanh_mlp(params, x)), axis=1).astype(np.int32)
  y[[2, 7, 12]] = (y[[2, 7, 12]] + 1) % CLASSES  # clean-misclassified points
  y = jnp.asarray(y)
  rng.integers(0, CLASSES, size=BATCH)  # the conformance problem's labels: the same target draws
  target = (y + 1 + jnp.asarray(rng.integers(0, CLASSES - 1, size=BATCH), jnp.int32)) % CLASSES
  return params, x, y, target


def _model(attack, logits_fn):
  """``logits_fn(x, keys)`` for attacks on randomized models (one that ignores its keys)."""
  return (lambda x, keys: logits_fn(x)) if attack.samples else logits_fn


# ------------------------------------------------------------------------------------------------
# jr.run over the registry.


def snapshot_runs(out: Snapshot) -> None:
  params, x, y, target = registry_problem()
  keys = per_example_keys(0, BATCH)
  for name in sorted(REGISTRY):
    attack = REGISTRY[name]()

    @jax.jit
    def run(params, x, y, eps, keys, target, attack=attack):
      logits_fn = _model(attack, functools.partial(tanh_mlp, params))
      return jr.run(attack, logits_fn, x, y, jr.Budget(eps), keys,
                    target if attack.targeted else None)

    eps = EPS[attack.norm]
    budgets = {"eps": np.full(BATCH, eps, np.float32),
               "mixed": np.where(np.arange(BATCH) % 2 == 0, 0.0, eps).astype(np.float32)}
    if attack.minimum_norm:
      budgets["inf"] = np.full(BATCH, np.inf, np.float32)
    for label, budget in budgets.items():
      flatten(f"run/{name}/{label}", run(params, x, y, jnp.asarray(budget), keys, target), out)


# ------------------------------------------------------------------------------------------------
# jr.robustness_curve: every code path of the curve kernel, 1 and 8 devices.

GRIDS = {"linf": [0.1, 0.0, 0.05, 0.2, 0.05], "l2": [1.0, 0.0, 0.25, 0.5, 0.5]}


def _curve_fn(attack, options):
  @jax.jit
  def curve(params, x, y, epsilons, key, target):
    logits_fn = _model(attack, functools.partial(tanh_mlp, params))
    return jr.robustness_curve(attack, logits_fn, x, y, epsilons, key,
                               target=target if attack.targeted else None, **options)
  return curve


def snapshot_curves(out: Snapshot) -> None:
  params, x, y, target = registry_problem()
  key = jax.random.key(11)
  pgd = REGISTRY["pgd-linf"]()
  cases = {
      "pgd-linf/early_exit": (pgd, {}),
      "pgd-linf/dense": (pgd, {"early_exit": False}),
      "pgd-linf/chunked": (pgd, {"chunk_size": 4}),
      "pgd-linf/dense_chunked": (pgd, {"chunk_size": 4, "early_exit": False}),
      "pgd-linf/vectorised": (pgd, {"eps_batch_size": 0}),
      "pgd-linf/eps_pairs": (pgd, {"eps_batch_size": 2}),
      "pgd-l2-dlr-targeted/early_exit": (REGISTRY["pgd-l2-dlr-targeted"](), {}),
      "fmn-l2/early_exit": (REGISTRY["fmn-l2"](), {}),
      "fmn-l2/dense": (REGISTRY["fmn-l2"](), {"early_exit": False}),
      "deepfool-linf/early_exit": (REGISTRY["deepfool-linf"](), {}),
      "ensemble-linf/early_exit": (REGISTRY["ensemble-linf"](), {}),
      "ensemble-linf/dense": (REGISTRY["ensemble-linf"](), {"early_exit": False}),
      "auto_attack-linf/early_exit": (REGISTRY["auto_attack-linf"](), {}),
      "eot-pgd-linf/early_exit": (REGISTRY["eot-pgd-linf"](), {}),
  }
  for case, (attack, options) in cases.items():
    epsilons = jnp.asarray(GRIDS[attack.norm], jnp.float32)
    flatten(f"curve/{case}", _curve_fn(attack, options)(params, x, y, epsilons, key, target), out)

  # 8 devices: x and y batch-sharded over an Explicit mesh (the suite's configuration).
  from jax.sharding import AxisType, NamedSharding  # noqa: PLC0415
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  mesh = jax.make_mesh((8,), ("batch",), axis_types=(AxisType.Explicit,))
  sharded = {"pgd-linf/early_exit": (pgd, {}),
             "pgd-linf/dense": (pgd, {"early_exit": False}),
             "ensemble-linf/early_exit": (REGISTRY["ensemble-linf"](), {}),
             "fmn-l2/early_exit": (REGISTRY["fmn-l2"](), {})}
  with jax.set_mesh(mesh):
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("batch")))
    xs, ys, ts = put(x), put(y), put(target)
    for case, (attack, options) in sharded.items():
      epsilons = jnp.asarray(GRIDS[attack.norm], jnp.float32)
      curve = _curve_fn(attack, options)(params, xs, ys, epsilons, key, ts)
      if len(curve.robust.sharding.device_set) != 8:
        raise AssertionError(f"{case}: the 8-device curve is not sharded")
      flatten(f"curve8/{case}", curve, out)


# ------------------------------------------------------------------------------------------------
# jr.evaluate: reports with and without checkpoints, resumed, certified, on a mesh.

EVAL_N, EVAL_BATCH, EVAL_EPS = 21, 8, (0.03, 0.08, 0.15)


def _eval_setup():
  params = tanh_mlp_params(3, 12, 16, 4)
  rng = np.random.default_rng(3)
  x = rng.uniform(0.0, 1.0, (EVAL_N, 3, 4)).astype(np.float32)
  y = np.argmax(np.asarray(tanh_mlp(params, jnp.asarray(x))), axis=1).astype(np.int32)
  y[::6] = (y[::6] + 1) % 4  # some clean errors
  return jax.tree_util.Partial(tanh_mlp, params), x, y


def _stop_after(x, y, batches):
  """The data set in batches, raising after ``batches`` of them (an interrupted run)."""
  for i, start in enumerate(range(0, len(x), EVAL_BATCH)):
    if i == batches:
      raise RuntimeError("snapshot: simulated interruption")
    yield x[start:start + EVAL_BATCH], y[start:start + EVAL_BATCH]


def _flatten_report(prefix: str, report, out: Snapshot) -> None:
  flatten(prefix, report.to_dict(include_provenance=False), out)
  flatten(f"{prefix}/per_example_arrays", report.per_example, out)


def snapshot_evaluate(out: Snapshot) -> None:
  logits_fn, x, y = _eval_setup()
  options = {"attacks": {"pgd": jr.attacks.pgd("linf", steps=3), "fgsm": jr.attacks.fgsm("linf"),
                         "fmn": jr.attacks.fmn("linf", steps=5)},
             "epsilons": np.asarray(EVAL_EPS, np.float32), "key": jax.random.key(3),
             "batch_size": EVAL_BATCH, "progress": False, "keep_per_example": True,
             "certifiers": {"ibp": jr.certify.bounds_certifier()}}
  _flatten_report("evaluate/plain", jr.evaluate(logits_fn, (x, y), **options), out)
  no_certifier = {k: v for k, v in options.items() if k not in ("certifiers", "keep_per_example")}
  _flatten_report("evaluate/summary_only", jr.evaluate(logits_fn, (x, y), **no_certifier), out)
  with tempfile.TemporaryDirectory() as directory:
    whole = pathlib.Path(directory) / "whole.ckpt"
    _flatten_report("evaluate/checkpoint",
                    jr.evaluate(logits_fn, (x, y), checkpoint=whole, **options), out)
    _flatten_report("evaluate/checkpoint_finished",
                    jr.evaluate(logits_fn, (x, y), checkpoint=whole, **options), out)
    stopped = pathlib.Path(directory) / "stopped.ckpt"
    try:
      jr.evaluate(logits_fn, _stop_after(x, y, 1), checkpoint=stopped, **options)
      raise AssertionError("the interrupted evaluation did not stop")
    except RuntimeError as error:
      if "simulated interruption" not in str(error):
        raise
    resumed = jr.evaluate(logits_fn, (x, y), checkpoint=stopped, **options)
    if resumed.timing.get("examples_evaluated") != EVAL_N - EVAL_BATCH:
      raise AssertionError(f"the resumed run redid batches: {resumed.timing}")
    _flatten_report("evaluate/resumed", resumed, out)
  mesh = jax.make_mesh((8,), ("batch",))
  _flatten_report("evaluate/mesh8", jr.evaluate(logits_fn, (x, y), mesh=mesh, **options), out)


# ------------------------------------------------------------------------------------------------
# jr.certify.


def snapshot_certify(out: Snapshot) -> None:
  relu = relu_mlp_params(5, 8, 16, 3)
  tanh = tanh_mlp_params(6, 8, 12, 3)
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.uniform(0.2, 0.8, (BATCH, 8)), jnp.float32)
  y = jnp.asarray(np.argmax(np.asarray(relu_mlp(relu, x)), axis=1), jnp.int32).at[3].set(0)
  key = jax.random.key(5)
  models = {"relu": (relu_mlp, relu), "tanh": (tanh_mlp, tanh)}
  for name, (apply, params) in models.items():

    @jax.jit
    def bounds(params, x, y, eps, apply=apply):
      fn = functools.partial(apply, params)
      lower, upper = jnp.clip(x - eps, 0.0, 1.0), jnp.clip(x + eps, 0.0, 1.0)
      budget = jr.Budget(eps)
      return {"interval_bounds": jr.certify.interval_bounds(fn, lower, upper),
              "linear_bounds": jr.certify.linear_bounds(fn, lower, upper),
              "margin_bounds_ibp": jr.certify.margin_bounds(fn, y, lower, upper, method="ibp"),
              "margin_bounds_crown": jr.certify.margin_bounds(fn, y, lower, upper,
                                                              method="crown"),
              "certify_bounds_ibp": jr.certify.certify_bounds(fn, x, y, budget),
              "certify_bounds_crown": jr.certify.certify_bounds(fn, x, y, budget,
                                                                method="crown"),
              "certify_bounds_ibp_l2": jr.certify.certify_bounds(fn, x, y, budget, norm="l2")}

    flatten(f"certify/{name}", bounds(params, x, y, jnp.float32(0.1)), out)

  @jax.jit
  def smoothing(params, x, y, key, sigma, radii):
    fn = functools.partial(relu_mlp, params)
    certificate = jr.certify.smoothing(fn, x, key, sigma=sigma, n0=16, n=256, batch_size=64)
    return {"smoothing": certificate,
            "smoothed_predict": jr.certify.smoothed_predict(fn, x, key, sigma=sigma, n=128,
                                                            batch_size=64),
            "certified_curve": jr.certify.certified_curve(certificate, y, radii)}

  flatten("certify/smoothing", smoothing(relu, x, y, key, jnp.float32(0.25),
                                         jnp.asarray([0.0, 0.05, 0.1, 0.2], jnp.float32)), out)


# ------------------------------------------------------------------------------------------------
# jr.training on linen and nnx models.

TRAIN_D, TRAIN_H, TRAIN_C = 8, 16, 3


def _losses():
  """name -> ``loss(logits_fn, x, y, eps, key)`` returning ``(value, aux)``."""
  budget = lambda eps: jr.Budget(eps)
  return {
      "adversarial_loss": lambda f, x, y, eps, key: jr.training.adversarial_loss(
          f, x, y, budget(eps), key),
      "adversarial_loss_apgd_l2": lambda f, x, y, eps, key: jr.training.adversarial_loss(
          f, x, y, budget(eps * 4), key, attack=jr.attacks.apgd("l2", steps=5)),
      "trades_loss": lambda f, x, y, eps, key: jr.training.trades_loss(f, x, y, budget(eps), key),
      "mart_loss": lambda f, x, y, eps, key: jr.training.mart_loss(f, x, y, budget(eps), key),
      "ibp_loss": lambda f, x, y, eps, key: jr.training.ibp_loss(f, x, y, budget(eps)),
  }


def snapshot_training(out: Snapshot) -> None:
  import flax.linen as nn  # noqa: PLC0415
  from flax import nnx  # noqa: PLC0415

  rng = np.random.default_rng(7)
  x = jnp.asarray(rng.uniform(0, 1, (BATCH, TRAIN_D)), jnp.float32)
  y = jnp.asarray(rng.integers(0, TRAIN_C, BATCH), jnp.int32)
  keys = per_example_keys(7, BATCH)
  eps = jnp.float32(0.1)
  mask = jnp.asarray(np.arange(BATCH) < BATCH - 3)

  class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, v):
      return nn.Dense(TRAIN_C)(nn.relu(nn.Dense(TRAIN_H)(v.reshape(v.shape[0], -1))))

  linen = LinenMLP()
  params = linen.init(jax.random.key(8), x)
  for name, loss in _losses().items():

    @jax.jit
    def value_and_grad(params, x, y, eps, keys, loss=loss):
      fn = lambda p: loss(functools.partial(linen.apply, p), x, y, eps, keys)
      return jax.value_and_grad(fn, has_aux=True)(params)

    (value, aux), grads = value_and_grad(params, x, y, eps, keys)
    flatten(f"training/linen/{name}", {"value": value, "aux": aux, "grads": grads}, out)

  @jax.jit
  def counts(params, x, y, eps, keys, mask):
    fn = functools.partial(linen.apply, params)
    return jr.training.robust_counts(fn, x, y, jr.Budget(eps), keys, mask=mask).compute()

  flatten("training/linen/robust_counts", counts(params, x, y, eps, keys, mask), out)

  class NnxMLP(nnx.Module):
    def __init__(self, rngs):
      self.dense1 = nnx.Linear(TRAIN_D, TRAIN_H, rngs=rngs)
      self.norm = nnx.BatchNorm(TRAIN_H, momentum=0.5, rngs=rngs)
      self.dense2 = nnx.Linear(TRAIN_H, TRAIN_C, rngs=rngs)

    def __call__(self, v):
      return self.dense2(nnx.relu(self.norm(self.dense1(v))))

  graphdef, state = nnx.split(NnxMLP(nnx.Rngs(9)))
  nnx_losses = _losses()
  nnx_losses["adversarial_loss_eval_attack"] = lambda m, x, y, eps, key: (
      jr.training.adversarial_loss(m, x, y, jr.Budget(eps), key,
                                   attack_logits_fn=nnx.view(m, use_running_average=True)))
  for name, loss in nnx_losses.items():

    @jax.jit
    def nnx_value_and_grad(state, x, y, eps, keys, loss=loss, name=name):
      model = nnx.merge(graphdef, state)
      if name == "ibp_loss":  # bounds need an affine BatchNorm: its running statistics
        model.eval()
      (value, aux), grads = nnx.value_and_grad(
          lambda m: loss(m, x, y, eps, keys), has_aux=True)(model)
      return value, aux, nnx.to_pure_dict(grads), nnx.to_pure_dict(nnx.state(model, nnx.BatchStat))

    value, aux, grads, stats = nnx_value_and_grad(state, x, y, eps, keys)
    flatten(f"training/nnx/{name}",
            {"value": value, "aux": aux, "grads": grads, "batch_stats": stats}, out)

  @jax.jit
  def nnx_counts(state, x, y, eps, keys, mask):
    model = nnx.merge(graphdef, state)
    model.eval()
    return jr.training.robust_counts(model, x, y, jr.Budget(eps), keys, mask=mask).compute()

  flatten("training/nnx/robust_counts", nnx_counts(state, x, y, eps, keys, mask), out)


# ------------------------------------------------------------------------------------------------
# jr.text: word swaps and GCG.


def snapshot_text(out: Snapshot) -> None:
  from jaxrobust import text  # noqa: PLC0415

  vocab, dim, length, subs = 24, 4, 6, 3
  rng = np.random.default_rng(10)
  params = {"embedding": jnp.asarray(rng.normal(size=(vocab, dim)), jnp.float32),
            "w1": jnp.asarray(rng.normal(size=(dim, 16)), jnp.float32),
            "w2": jnp.asarray(rng.normal(size=(16, 3)) * 0.5, jnp.float32)}
  tokens = rng.integers(0, vocab, size=(BATCH, length)).astype(np.int32)
  candidates = rng.integers(0, vocab, size=(vocab, subs)).astype(np.int32)
  candidates[rng.random((vocab, subs)) < 0.25] = -1
  editable = rng.random((BATCH, length)) < 0.8
  editable[:2] = False
  max_swaps = rng.integers(0, length + 1, size=BATCH).astype(np.int32)

  def pooled(params, embeds):
    return jnp.tanh(jnp.mean(embeds, axis=1) @ params["w1"]) @ params["w2"]

  y = np.argmax(np.asarray(pooled(params, params["embedding"][tokens])), axis=1).astype(np.int32)
  y[[3, 9]] = (y[[3, 9]] + 1) % 3  # clean-misclassified rows
  for loss in ("margin", "ce"):
    attack = text.word_swap(steps=length, search_width=8, loss=loss)

    @jax.jit
    def swap(params, tokens, y, key, candidates, max_swaps, editable, attack=attack):
      result = text.run(attack, functools.partial(pooled, params), params["embedding"], tokens,
                        y, key, candidates=candidates, max_swaps=max_swaps, editable=editable)
      return result, text.swap_curve(result, y, jnp.arange(length + 1))

    result, curve = swap(params, jnp.asarray(tokens), jnp.asarray(y), jax.random.key(10),
                         jnp.asarray(candidates), jnp.asarray(max_swaps), jnp.asarray(editable))
    flatten(f"text/word_swap/{loss}", {"result": result, "curve": curve}, out)

  # GCG on a causal LM whose logits at t are M[x_t] + N[x_{t-1}] (read from the embedding table).
  v = 32

  def shift_lm(embeds):
    now, previous = embeds[..., :v], embeds[..., v:]
    return now + jnp.pad(previous[:, :-1], ((0, 0), (1, 0), (0, 0)))

  gcg_rng = np.random.default_rng(12)
  table = jnp.asarray(gcg_rng.normal(0.0, 3.0, (v, 2 * v)), jnp.float32)
  prompt = jnp.asarray(gcg_rng.integers(0, v, (8, 3)), jnp.int32)
  target = jnp.asarray(gcg_rng.integers(0, v, (8, 2)), jnp.int32)
  allowed = jnp.asarray(np.arange(v) != 5)
  configs = {"plain": text.gcg(suffix_length=3, steps=4, search_width=8, topk=8),
             "chunked_early_stop": text.gcg(suffix_length=3, steps=4, search_width=8, topk=8,
                                            n_replace=2, chunk_size=4, early_stop=True)}
  for name, attack in configs.items():

    @jax.jit
    def gcg(table, prompt, target, key, allowed, attack=attack):
      return text.run_gcg(attack, shift_lm, table, prompt, target, key, allowed=allowed)

    flatten(f"text/gcg/{name}", gcg(table, prompt, target, jax.random.key(12), allowed), out)


# ------------------------------------------------------------------------------------------------
# jr.metrics: reducers on the device and on the host.


def _reducers(inputs):
  m = jr.metrics
  pred_clean, pred_adv, y, x, x_adv, norms, flags, groups, mask, epsilons, edges, judged = inputs
  half = pred_clean.shape[0] // 2
  first, second = (slice(0, half), slice(half, None))
  counts = [m.Counts.from_batch(pred_clean[s], pred_adv[s], y[s], x=x[s], x_adv=x_adv[s],
                                norm="l2", mask=mask[s]) for s in (first, second)]
  correct = pred_clean == y
  robust = jnp.stack([correct & (norms > e) for e in epsilons])  # [K, B]
  curve_flags = [m.CurveCounts.from_flags(robust[:, s], correct[s], mask=mask[s])
                 for s in (first, second)]
  curve_norms = [m.CurveCounts.from_norms(norms[s], correct[s], epsilons, mask=mask[s])
                 for s in (first, second)]
  histograms = [m.NormHistogram.from_batch(norms[s], correct[s], edges, mask=mask[s])
                for s in (first, second)]
  rates = [m.Rate.from_flags(flags[s], mask=mask[s]) for s in (first, second)]
  nothing = m.Rate.from_flags(flags, mask=jnp.zeros_like(mask))  # no trials: a NaN rate
  grouped = [m.Rate.from_flags(flags[s], mask=mask[s], groups=groups[s], num_groups=3)
             for s in (first, second)]
  generative = m.attack_success_rate_generative(judged, mask=mask, behavior=groups,
                                                num_behaviors=3)
  return {"Counts": counts[0].merge(counts[1]),
          "CurveCounts_flags": curve_flags[0].merge(curve_flags[1]),
          "CurveCounts_norms": curve_norms[0].merge(curve_norms[1]),
          "NormHistogram": histograms[0].merge(histograms[1]),
          "Rate": rates[0].merge(rates[1]), "Rate_grouped": grouped[0].merge(grouped[1]),
          "Rate_no_trials": nothing,
          "generative": generative,
          "generative_mean": m.attack_success_rate_generative(judged, mode="mean", mask=mask),
          "injection": m.prompt_injection_rate(flags, valid=correct, invalid="drop"),
          "paraphrase": m.paraphrase_consistency(judged.astype(jnp.int32))}


def _computed(reducers, epsilons, edges):
  return {"Counts": reducers["Counts"].compute(),
          "CurveCounts_flags": reducers["CurveCounts_flags"].compute(epsilons),
          "CurveCounts_norms": reducers["CurveCounts_norms"].compute(epsilons),
          "NormHistogram": reducers["NormHistogram"].compute(edges),
          "Rate": reducers["Rate"].compute(0.9),
          "Rate_no_trials": reducers["Rate_no_trials"].compute(),
          # Not the grouped rate's per-group compute(): on a host (to_host) grouped Rate it
          # raises at this commit (`if total > 0` on a [G] array), so only its averages are kept.
          "Rate_grouped_micro": reducers["Rate_grouped"].compute(average="micro"),
          "Rate_grouped_macro": reducers["Rate_grouped"].compute(average="macro"),
          "generative_macro": reducers["generative"].compute(average="macro"),
          "generative_mean": reducers["generative_mean"].compute(),
          "injection": reducers["injection"].compute(),
          "paraphrase": reducers["paraphrase"].compute()}


def _formulas(inputs):
  m = jr.metrics
  pred_clean, pred_adv, y, x, x_adv, norms, flags, groups, mask, epsilons, edges, judged = inputs
  correct = pred_clean == y
  return {"accuracy": m.accuracy(pred_clean, y, mask),
          "robust_accuracy": m.robust_accuracy(pred_clean, pred_adv, y, mask),
          "conditional_robust_accuracy": m.conditional_robust_accuracy(pred_clean, pred_adv, y,
                                                                       mask),
          "adversarial_accuracy": m.adversarial_accuracy(pred_clean, pred_adv, y, mask),
          "attack_success_rate": m.attack_success_rate(pred_clean, pred_adv, y, mask=mask),
          "attack_success_rate_clean_correct": m.attack_success_rate(
              pred_clean, pred_adv, y, over="clean_correct", mask=mask),
          "empirical_robustness": m.empirical_robustness(x, x_adv, pred_clean, pred_adv, "l2",
                                                         mask),
          "mean_perturbation": m.mean_perturbation(x, x_adv, pred_adv != y, "linf", mask),
          "certified_accuracy": m.certified_accuracy(jnp.where(jnp.isfinite(norms), norms, 0.0),
                                                     pred_clean, y, epsilons, mask),
          "curve_auc": m.curve_auc(epsilons, jnp.asarray([0.9, 0.7, 0.5, 0.2], jnp.float32),
                                   jnp.float32(0.95)),
          "perturbation_quantiles": m.perturbation_quantiles(
              norms, jnp.asarray([0.1, 0.5, 0.9], jnp.float32), mask),
          "median_perturbation": m.median_perturbation(norms, mask),
          "binomial_interval": m.binomial_interval(jnp.asarray([0, 3, 7, 10]), 10),
          "binomial_interval_lower": m.binomial_interval(jnp.asarray([0, 3, 7, 10]), 10, 0.9,
                                                         sided="lower"),
          "correct": correct}


def snapshot_metrics(out: Snapshot) -> None:
  n, classes = 24, 4
  rng = np.random.default_rng(13)
  y = rng.integers(0, classes, n).astype(np.int32)
  pred_clean = np.where(rng.random(n) < 0.8, y, (y + 1) % classes).astype(np.int32)
  pred_clean[5] = -1  # an abstention
  pred_adv = np.where(rng.random(n) < 0.5, pred_clean, (pred_clean + 2) % classes).astype(np.int32)
  x = rng.uniform(0, 1, (n, 6)).astype(np.float32)
  x_adv = np.clip(x + rng.normal(0, 0.05, (n, 6)), 0, 1).astype(np.float32)
  norms = rng.exponential(0.2, n).astype(np.float32)
  norms[[2, 11]] = np.inf
  inputs = tuple(jnp.asarray(a) for a in (
      pred_clean, pred_adv, y, x, x_adv, norms, rng.random(n) < 0.4,
      rng.integers(0, 3, n).astype(np.int32), np.arange(n) < n - 4,
      np.asarray([0.05, 0.1, 0.2, 0.4], np.float32), np.asarray([0.0, 0.1, 0.3], np.float32),
      rng.random((n, 3)) < 0.3))

  @jax.jit
  def on_device(inputs):
    reducers = _reducers(inputs)
    return reducers, _computed(reducers, inputs[9], inputs[10]), _formulas(inputs)

  reducers, device_computed, formulas = on_device(inputs)
  flatten("metrics/device/sums", reducers, out)
  flatten("metrics/device/compute", device_computed, out)
  flatten("metrics/device/formulas", formulas, out)
  host = {name: r.to_host() for name, r in reducers.items()}
  flatten("metrics/host/sums", host, out)
  flatten("metrics/host/compute",
          _computed(host, np.asarray(inputs[9]), np.asarray(inputs[10])), out)
  flatten("metrics/host/binomial_interval_table", jr.metrics.binomial_interval_table(
      np.asarray([0, 1, 5, 2**33], np.int64), np.asarray([3, 3, 9, 2**34], np.int64)), out)


# ------------------------------------------------------------------------------------------------
# Writing and comparing.

SECTIONS = {"run": snapshot_runs, "curves": snapshot_curves, "evaluate": snapshot_evaluate,
            "certify": snapshot_certify, "training": snapshot_training, "text": snapshot_text,
            "metrics": snapshot_metrics}


def compute(verbose: bool = True) -> Snapshot:
  out: Snapshot = {}
  for name, section in SECTIONS.items():
    start, before = time.perf_counter(), len(out)
    section(out)
    if verbose:
      print(f"  {name:9s} {len(out) - before:5d} arrays  {time.perf_counter() - start:6.1f} s",
            flush=True)
  return out


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> str:
  if a.shape != b.shape or a.dtype.kind not in "biuf" or b.dtype.kind not in "biuf":
    return ""
  a64, b64 = a.astype(np.float64), b.astype(np.float64)
  both_nan = np.isnan(a64) & np.isnan(b64)
  with np.errstate(invalid="ignore"):
    diff = np.where(both_nan | (a64 == b64), 0.0, np.abs(a64 - b64))
  diff = np.where(np.isnan(diff), np.inf, diff)  # NaN against a number
  largest = diff.max() if diff.size else 0.0
  return f"max abs diff {largest:.3g}, {int((diff > 0).sum())} of {diff.size} elements differ"


def equal(a: np.ndarray, b: np.ndarray) -> bool:
  if a.dtype != b.dtype or a.shape != b.shape:
    return False
  return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def compare(before: Snapshot, after: Snapshot) -> list[str]:
  """What differs: arrays missing now, and arrays of both whose dtype, shape or bits differ.
  Arrays that are new now (attacks or cases added since ``before``) are additions, listed by
  :func:`main`, not differences."""
  problems = []
  for name in sorted(set(before) - set(after)):
    problems.append(f"missing now: {name}")
  for name in sorted(set(before) & set(after)):
    a, b = before[name], after[name]
    if a.dtype != b.dtype or a.shape != b.shape:
      problems.append(f"differs: {name}: {a.dtype}{list(a.shape)} before, "
                      f"{b.dtype}{list(b.shape)} now")
    elif not equal(a, b):
      problems.append(f"differs: {name}: {_max_abs_diff(a, b)}")
  return problems


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  group = parser.add_mutually_exclusive_group(required=True)
  group.add_argument("--write", metavar="FILE.npz", help="compute and save the snapshot")
  group.add_argument("--compare", metavar="FILE.npz", help="compute and compare with a snapshot")
  args = parser.parse_args(argv)
  print(f"jaxrobust from {pathlib.Path(jr.__file__).parent}; jax {jax.__version__}; "
        f"{len(jax.devices())} {jax.default_backend()} devices; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
  start = time.perf_counter()
  snapshot = compute()
  print(f"computed {len(snapshot)} arrays in {time.perf_counter() - start:.1f} s", flush=True)
  if args.write:
    np.savez(args.write, **snapshot)
    print(f"wrote {args.write}")
    return 0
  with np.load(args.compare, allow_pickle=False) as stored:
    before = {name: stored[name] for name in stored.files}
  problems = compare(before, snapshot)
  for line in problems:
    print(line)
  added = sorted(set(snapshot) - set(before))
  groups = sorted({"/".join(name.split("/")[:2]) for name in added})
  same = len(set(before) & set(snapshot)) - sum(p.startswith("differs") for p in problems)
  print(f"compared {len(before)} arrays: {same} bitwise equal, {len(problems)} differences"
        + (f"; {len(added)} new arrays, not in the stored snapshot ({', '.join(groups)})"
           if added else ""))
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
