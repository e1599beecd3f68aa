#!/usr/bin/env python
"""Side-by-side benchmark: PGD robustness curves in jaxrobust and in PyTorch peers.

Attack strength first: with each library's DEFAULT step size and with MATCHED step sizes, for
Linf and L2, on the digits models, jaxrobust's robust accuracy must never be above the strongest
peer's beyond seed noise. Timings are reported too, but are secondary (other jobs share the CPU).

Models (identical weights on both sides; a PyTorch port whose logits are checked against JAX's
before anything runs):

* ``cnn``: the demo's ``SmallCNN``, plain and adversarially trained. By default the frozen
  weights of ``benchmarks/reference/digits_{plain,adversarial}.npz`` (the ones the AutoAttack
  cross-check uses), so the figures do not move when training changes; ``--weights demo`` trains
  or loads them through ``jaxrobust.demo.train`` instead.
* ``mlp``: ``DigitsMLP`` (64-128-64-10, ReLU), trained by ``train_mlp`` with a fixed seed:
  plainly, and adversarially (Madry et al., Linf PGD-7 at eps 0.2 with the constant step
  ``2.5 / 7``, so the model does not depend on jaxrobust's default step). By default the frozen
  weights of ``benchmarks/reference/digits_mlp_{plain,adversarial}.npz``, written by
  ``--freeze-mlp`` (``train_mlp`` then ``save_params``; the tests use them too);
  ``--weights demo`` trains them afresh.

Attacks, all with the same number of steps ``K`` (``--steps``) and one restart, on the same test
examples and eps grid (``--num-eps`` points from 0 to ``--eps-max`` for Linf, ``--eps-max-l2``
for L2):

* jaxrobust: ``jr.robustness_curve`` with ``jr.attacks.pgd(norm, steps=K)``, the whole curve
  jitted once (compile time reported apart), with its default step size (``step_size=None``)
  and with each matched constant step;
* torchattacks ``PGD`` / ``PGDL2`` (one call per eps: it has no multi-eps API);
* Foolbox 3 ``LinfPGD`` / ``L2PGD`` (one call with ``epsilons=[...]``, its multi-eps API);
* ART ``ProjectedGradientDescent`` on a ``PyTorchClassifier`` (one ``generate`` per eps).

Step settings (all steps are fractions of eps, since the grid has many eps):

* ``defaults``: each peer with its own default relative step and random start — torchattacks
  ``alpha / eps`` = (2/255)/(8/255) = 1/4 (Linf) and 0.2/1.0 (L2), random start; Foolbox
  ``rel_stepsize`` 0.01/0.3 (Linf) and 0.025 (L2), random start; ART ``eps_step / eps`` =
  0.1/0.3 and no random start (``num_random_init=0``) — against jaxrobust's defaults;
* ``matched``: every library with the same constant step ``s * eps`` and a random start, for each
  ``s`` of ``--matched-steps`` (default ``0.25`` and ``2.5/K``, Madry et al.'s rule).

Robust accuracy = clean-correct and still correct on the adversarial point, shown with
jaxrobust's convention (broken at any smaller eps of the grid counts as broken; the peers' raw
per-eps figures go to ``--out``). Noise at each eps is the larger of the spread over the
``--repeats`` random-start seeds (either side) and two binomial standard errors; the script
prints a NOTE wherever jaxrobust's defaults are above any peer row, or jaxrobust with a matched
step above a peer with the same step, by more than that.

The peers are optional (``pip install 'jaxrobust[peers]'``); a peer that is not installed is
skipped with a note, so the script runs wherever jaxrobust runs. Example::

  python benchmarks/bench_peers.py --arch cnn mlp --model both --norm linf l2 --steps 20 \\
      --repeats 3 --out /tmp/peers.json

Model rows: beside each time, the rows that went through the model during one curve (random-start
seed 0), split into rows with a backward pass ("grad") and without ("fwd"), measured in a separate
untimed run. jaxrobust counts with ``jr.metrics.count_evaluations`` (a counting wrapper around the
``logits_fn``, read when the compiled program runs); the peers with a forward hook on the PyTorch
model, counting a call as "grad" when autograd records it (``torch.is_grad_enabled()`` and the
logits require grad; the weights are frozen, so only an input that requires grad makes them) and
as "fwd" otherwise. Both sides count everything their curve computes, including the final
predictions that decide robustness (for the peers, the benchmark's own ``no_grad`` prediction on
each eps's adversarial points; the clean prediction is made once, outside the timed run).

Timings are only meaningful while nothing else loads the cores: PyTorch's OpenMP threads slow
down many times over when the cores are oversubscribed, XLA far less. The 1-min load average is
printed with every table; repeats are interleaved across libraries and the best one is reported.
``--timing-variants`` adds jaxrobust's faster CPU settings (``eps_batch_size=0``, and unrolled
for Linf) to the tables.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):
  if str(_path) not in sys.path:
    sys.path.insert(0, str(_path))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import jaxrobust as jr  # noqa: E402
from jaxrobust.demo.model import SmallCNN  # noqa: E402
from cpu_devices import split_over_devices, use_cpu_devices  # noqa: E402

PORT_TOLERANCE = 1e-4
"""Largest allowed |torch logits - JAX logits| on the benchmark examples."""

FROZEN_DIR = pathlib.Path(__file__).resolve().parent / "reference"
"""Frozen weights: the demo CNN's ``digits_{plain,adversarial}.npz`` (written by
``bench_autoattack.py``) and the MLP's ``digits_mlp_{plain,adversarial}.npz`` (``--freeze-mlp``)."""

PEER_DEFAULTS = {
  # library: ({norm: default step as a fraction of eps}, default random start)
  "torchattacks": ({"linf": (2 / 255) / (8 / 255), "l2": 0.2 / 1.0}, True),
  "foolbox": ({"linf": 0.01 / 0.3, "l2": 0.025}, True),
  "art": ({"linf": 0.1 / 0.3, "l2": 0.1 / 0.3}, False),
}
"""Each peer's default step (its default absolute step over its default eps) and random start."""

MLP_TRAINING = {"epochs": 30, "batch_size": 64, "learning_rate": 2e-3, "seed": 0, "eps": 0.2,
                "attack_steps": 7}
"""How ``DigitsMLP`` is trained here (adversarial: PGD-7 at Linf eps 0.2, step 2.5/7 of eps)."""


# ------------------------------------------------------------------------------------------------
# Models and data.


class DigitsMLP(nn.Module):
  """``flatten -> Dense(128) -> relu -> Dense(64) -> relu -> Dense(10)`` for 8x8x1 digits."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(128, name="dense1")(x))
    x = nn.relu(nn.Dense(64, name="dense2")(x))
    return nn.Dense(10, name="dense3")(x)


ARCHS = {"cnn": SmallCNN, "mlp": DigitsMLP}


def load_params(kind: str, *, random_init: bool = False) -> Any:
  """The flax variables of the demo model: ``kind`` is "plain" or "adversarial".

  With ``random_init`` the untrained initialisation is returned instead (a quick smoke test).
  """
  if random_init:
    key = jax.random.key(0 if kind == "plain" else 1)
    return SmallCNN().init(key, jnp.zeros((1, 8, 8, 1), jnp.float32))
  from jaxrobust.demo.train import train

  return train(kind == "adversarial", progress=False)


def frozen_path(kind: str, arch: str = "cnn") -> pathlib.Path:
  """``benchmarks/reference/digits_{kind}.npz`` (cnn) or ``digits_mlp_{kind}.npz`` (mlp)."""
  return FROZEN_DIR / (f"digits_{kind}.npz" if arch == "cnn" else f"digits_{arch}_{kind}.npz")


def save_params(params: Any, path: pathlib.Path) -> None:
  """Writes the flax variables ``{"params": {layer: {name: array}}}`` as ``layer/name`` float32
  arrays (the format of the frozen files)."""
  flat = {f"{layer}/{name}": np.asarray(value, np.float32)
          for layer, leaves in jax.device_get(params)["params"].items()
          for name, value in leaves.items()}
  path.parent.mkdir(parents=True, exist_ok=True)
  np.savez_compressed(path, **flat)


def load_frozen_params(kind: str, arch: str = "cnn") -> Any:
  """The frozen variables of ``frozen_path(kind, arch)``: the demo ``SmallCNN`` (cnn) or
  ``DigitsMLP`` (mlp, as ``train_mlp`` left it)."""
  params: dict[str, dict[str, jax.Array]] = {}
  with np.load(frozen_path(kind, arch)) as data:
    for key in data.files:
      layer, name = key.split("/")
      params.setdefault(layer, {})[name] = jnp.asarray(data[key])
  return {"params": params}


def train_mlp(adversarial: bool) -> Any:
  """``DigitsMLP`` trained on the digits training split with ``MLP_TRAINING`` (a few seconds)."""
  from jaxrobust.demo.data import load_digits

  cfg = MLP_TRAINING
  x_train, y_train, _, _ = load_digits()
  model = DigitsMLP()
  key = jax.random.key(cfg["seed"])
  params = model.init(key, jnp.zeros((1, 8, 8, 1), jnp.float32))
  optimizer = optax.adam(cfg["learning_rate"])
  attack = jr.attacks.pgd("linf", steps=cfg["attack_steps"], step_size=2.5 / cfg["attack_steps"])
  batches = x_train.shape[0] // cfg["batch_size"]

  def loss_fn(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y).mean()

  def step(carry, batch):
    params, opt_state = carry
    x, y, key = batch
    if adversarial:
      x = jax.lax.stop_gradient(jr.run(attack, functools.partial(model.apply, params), x, y,
                                       jr.Budget(cfg["eps"]), key).x_adv)
    grads = jax.grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), None

  @jax.jit
  def epoch(params, opt_state, x, y, key):
    perm_key, attack_key = jax.random.split(key)
    order = jax.random.permutation(perm_key, x.shape[0])[:batches * cfg["batch_size"]]
    xb = x[order].reshape((batches, cfg["batch_size"], *x.shape[1:]))
    yb = y[order].reshape((batches, cfg["batch_size"]))
    (params, opt_state), _ = jax.lax.scan(step, (params, opt_state),
                                          (xb, yb, jax.random.split(attack_key, batches)))
    return params, opt_state

  opt_state = optimizer.init(params)
  x, y = jnp.asarray(x_train), jnp.asarray(y_train)
  for e in range(cfg["epochs"]):
    params, opt_state = epoch(params, opt_state, x, y, jax.random.fold_in(key, e + 1))
  return params


def freeze_mlps() -> None:
  """Trains both MLPs (``train_mlp``) and writes them to ``frozen_path(kind, "mlp")``."""
  for kind in ("plain", "adversarial"):
    params = train_mlp(kind == "adversarial")
    save_params(params, frozen_path(kind, "mlp"))
    print(f"wrote {frozen_path(kind, 'mlp')} (weights {params_digest(params)})")


def get_params(arch: str, kind: str, weights: str, random_init: bool) -> Any:
  if arch == "mlp":
    if random_init:
      return DigitsMLP().init(jax.random.key(0), jnp.zeros((1, 8, 8, 1), jnp.float32))
    if weights == "frozen":
      return load_frozen_params(kind, "mlp")
    return train_mlp(kind == "adversarial")
  if weights == "frozen" and not random_init:
    return load_frozen_params(kind)
  return load_params(kind, random_init=random_init)


def params_digest(params: Any) -> str:
  """A short hash of the weights, to tell which model a table was measured on."""
  digest = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(jax.device_get(params)):
    digest.update(np.asarray(leaf, np.float32).tobytes())
  return digest.hexdigest()[:12]


def load_examples(n: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
  """The first ``n`` (all if ``None``) examples of the digits test split, NHWC float32 in [0, 1]."""
  from jaxrobust.demo.data import load_digits

  _, _, x_test, y_test = load_digits()
  if n is not None:
    if not 0 < n <= x_test.shape[0]:
      raise SystemExit(f"--n must be in 1..{x_test.shape[0]}, got {n}")
    x_test, y_test = x_test[:n], y_test[:n]
  return np.ascontiguousarray(x_test, np.float32), np.ascontiguousarray(y_test, np.int32)


def jax_logits(params: Any, x: np.ndarray, arch: str = "cnn") -> np.ndarray:
  return np.asarray(jax.jit(ARCHS[arch]().apply)(params, jnp.asarray(x)))


def torch_port(params: Any):
  """A PyTorch `SmallCNN` (NCHW input ``[N, 1, 8, 8]``) holding exactly the Flax weights.

  Layout notes: Flax conv kernels are HWIO, torch's OIHW; Flax dense kernels are ``[in, out]``,
  torch's ``[out, in]``. XLA's SAME padding of the stride-2 convolution puts the single padding
  row/column at the bottom/right (torch's symmetric ``padding=1`` would shift the sampling grid),
  so the port pads explicitly. The activation is flattened in NHWC order so that dense1's rows
  line up with Flax's.
  """
  import torch
  from torch import nn
  from torch.nn import functional as F

  p = jax.device_get(params["params"])

  class TorchSmallCNN(nn.Module):

    def __init__(self):
      super().__init__()
      self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
      self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=0)
      self.dense1 = nn.Linear(4 * 4 * 32, 64)
      self.dense2 = nn.Linear(64, 10)

    def forward(self, x):
      x = F.relu(self.conv1(x))
      x = F.relu(self.conv2(F.pad(x, (0, 1, 0, 1))))  # (left, right, top, bottom): XLA SAME
      x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # flatten in NHWC order, as Flax
      x = F.relu(self.dense1(x))
      return self.dense2(x)

  model = TorchSmallCNN()

  def tensor(a, *perm):
    a = np.asarray(a, np.float32)
    return torch.from_numpy(np.array(a.transpose(*perm) if perm else a, np.float32))

  with torch.no_grad():
    for name in ("conv1", "conv2"):
      getattr(model, name).weight.copy_(tensor(p[name]["kernel"], 3, 2, 0, 1))  # HWIO -> OIHW
      getattr(model, name).bias.copy_(tensor(p[name]["bias"]))
    for name in ("dense1", "dense2"):
      getattr(model, name).weight.copy_(tensor(p[name]["kernel"], 1, 0))
      getattr(model, name).bias.copy_(tensor(p[name]["bias"]))
  model.eval()
  # Peers differentiate with respect to the input only; frozen weights spare them the parameter
  # gradients that a plain ``loss.backward()`` (Foolbox via eagerpy, ART) would also compute.
  for weight in model.parameters():
    weight.requires_grad_(False)
  return model


def torch_mlp_port(params: Any):
  """A PyTorch `DigitsMLP` (NCHW input ``[N, 1, 8, 8]``) holding exactly the Flax weights."""
  import torch
  from torch import nn as tnn

  p = jax.device_get(params["params"])

  class TorchDigitsMLP(tnn.Module):

    def __init__(self):
      super().__init__()
      self.dense1, self.dense2, self.dense3 = tnn.Linear(64, 128), tnn.Linear(128, 64), \
          tnn.Linear(64, 10)

    def forward(self, x):
      x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # flatten in NHWC order, as Flax
      x = torch.relu(self.dense1(x))
      x = torch.relu(self.dense2(x))
      return self.dense3(x)

  model = TorchDigitsMLP()
  with torch.no_grad():
    for name in ("dense1", "dense2", "dense3"):
      getattr(model, name).weight.copy_(torch.from_numpy(
          np.array(np.asarray(p[name]["kernel"], np.float32).T)))
      getattr(model, name).bias.copy_(torch.from_numpy(np.array(p[name]["bias"], np.float32)))
  model.eval()
  for weight in model.parameters():
    weight.requires_grad_(False)
  return model


def nchw(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def torch_predict(model, x_nchw) -> np.ndarray:
  import torch

  with torch.no_grad():
    return model(torch.as_tensor(np.asarray(x_nchw, np.float32))).argmax(1).numpy()


def torch_logits(model, x_nchw: np.ndarray) -> np.ndarray:
  import torch

  with torch.no_grad():
    return model(torch.from_numpy(x_nchw)).numpy()


# ------------------------------------------------------------------------------------------------
# Runners. Each library and step setting becomes a `Runner`: ``run(repeat)`` computes the whole
# curve once (random start seeded by ``seed + repeat``) and returns the per-example robust flags
# ``[K, B]``; the driver interleaves the repeats of all runners, so background load hits all of
# them alike.


class Problem(NamedTuple):
  """What every runner of one table attacks."""

  x: np.ndarray  # [B, 8, 8, 1] float32 in [0, 1]
  y: np.ndarray  # [B] int32
  epsilons: np.ndarray  # [K] float32
  norm: str  # "linf" or "l2"
  steps: int
  seed: int


class Runner(NamedTuple):
  library: str
  version: str
  setting: str  # "defaults" or "step <s>"
  note: str
  run: Callable[[int], np.ndarray]
  info: dict[str, Any]
  # () -> (rows without gradient, rows with gradient) of one untimed curve with seed 0.
  count_rows: Optional[Callable[[], tuple[int, int]]] = None


def step_label(rel_step: float, random_start: bool) -> str:
  return f"step {rel_step:.4g}" + ("" if random_start else ", no random start")


def envelope(robust: np.ndarray, epsilons: np.ndarray) -> np.ndarray:
  """``[K, B]``: robust at eps_k and at every eps_j <= eps_k (jaxrobust's curve convention)."""
  smaller = epsilons[None, :] <= epsilons[:, None]  # [K, J]
  return np.all(robust[None, :, :] | ~smaller[:, :, None], axis=1)


def check_adv(name: str, x_adv: np.ndarray, x: np.ndarray, eps: float, norm: str = "linf") -> None:
  """Every peer's points must lie in the box and the eps-ball (float32 rounding allowed)."""
  diff = (x_adv - x).reshape(x.shape[0], -1)
  if not x.size:
    return
  dist = float(np.max(np.abs(diff)) if norm == "linf" else np.max(np.linalg.norm(diff, axis=1)))
  if dist > eps * (1 + 1e-5) + 1e-5 or x_adv.min() < -1e-6 or x_adv.max() > 1 + 1e-6:
    raise AssertionError(f"{name}: adversarial points leave the threat model at eps={eps:g} "
                         f"({norm} distance {dist:.6g}, range [{x_adv.min():.4g}, "
                         f"{x_adv.max():.4g}])")


def jaxrobust_runner(apply_fn, params, problem: Problem, step_size: Optional[float],
                     eps_batch_size: Optional[int] = None, unroll: bool = False) -> Runner:
  """Compiles the curve once (timed separately) and warms it up."""
  attack = jr.attacks.pgd(problem.norm, steps=problem.steps, step_size=step_size,
                          random_start=True, restarts=1, loss="ce")

  def curve_fn(params, x, y, eps, key):
    return jr.robustness_curve(attack, functools.partial(apply_fn, params), x, y, eps, key,
                               eps_batch_size=eps_batch_size, unroll=True if unroll else 1
                               ).robust

  # With several CPU devices (--cpu-devices), the batch is split over them (shard_map); the
  # key is the last argument, a new one per repeat.
  data = ((jnp.asarray(problem.x), True), (jnp.asarray(problem.y), True),
          (jnp.asarray(problem.epsilons, jnp.float32), False),
          (jax.random.key(problem.seed), False))
  program, args = split_over_devices(curve_fn, params, *data, out_axis=1)
  start = time.perf_counter()
  compiled = jax.jit(program).lower(*args).compile()
  compile_s = time.perf_counter() - start
  jax.block_until_ready(compiled(*args))  # warm-up

  def run(repeat: int) -> np.ndarray:
    key = jax.random.key(problem.seed + repeat)
    return np.asarray(jax.block_until_ready(compiled(*args[:-1], key)))

  def count_rows() -> tuple[int, int]:
    # A second program with a counting logits_fn: its host callbacks would distort the timing.
    counters = []

    def counted_curve_fn(params, x, y, eps, key):
      logits_fn, counter = jr.metrics.count_evaluations(functools.partial(apply_fn, params))
      counters.append(counter)
      return jr.robustness_curve(attack, logits_fn, x, y, eps, key,
                                 eps_batch_size=eps_batch_size, unroll=True if unroll else 1
                                 ).robust

    # Split over the devices as the timed program is (its rows are every device's together).
    counted, counted_args = split_over_devices(counted_curve_fn, params, *data, out_axis=1)
    jax.block_until_ready(jax.jit(counted)(*counted_args))
    jax.effects_barrier()
    return counters[-1].forward, counters[-1].gradient

  label = "jaxrobust" + ("" if eps_batch_size is None else f" (eps_batch_size={eps_batch_size})")
  label += ", unrolled" if unroll else ""
  setting = "defaults" if step_size is None else step_label(step_size, True)
  return Runner(label, jr.__version__, setting,
                "one jitted program for the whole curve; best iterate; worst case over smaller eps",
                run, {"compile_s": compile_s}, count_rows)


def torch_row_counter(model, run: Callable[[int], np.ndarray]) -> Callable[[], tuple[int, int]]:
  """``() -> (fwd, grad)``: the rows ``run(0)`` puts through the PyTorch ``model``.

  A forward hook counts each call's batch rows as "grad" when autograd records the call (grad
  mode on and logits that require grad: the weights are frozen, so the input requires grad) and
  as "fwd" otherwise.
  """

  def count_rows() -> tuple[int, int]:
    import torch

    rows = {"fwd": 0, "grad": 0}

    def hook(module, inputs, output):
      recorded = torch.is_grad_enabled() and output.requires_grad
      rows["grad" if recorded else "fwd"] += int(inputs[0].shape[0])

    handle = model.register_forward_hook(hook)
    try:
      run(0)
    finally:
      handle.remove()
    return rows["fwd"], rows["grad"]

  return count_rows


def _per_eps(problem: Problem, model, clean: np.ndarray, attack_at: Callable, name: str,
             x_in, labels) -> np.ndarray:
  """Robust flags ``[K, B]`` from one attack call per eps (eps 0 is the clean prediction)."""
  robust = []
  for eps in problem.epsilons:
    if eps == 0:  # nothing to attack (and torchattacks' L2 projection divides 0 by 0)
      robust.append(clean)
      continue
    adv = np.asarray(attack_at(float(eps), x_in, labels))
    check_adv(name, adv, np.asarray(x_in), float(eps), problem.norm)
    robust.append(clean & (torch_predict(model, adv) == problem.y))
  return np.stack(robust)


def torchattacks_runner(model, problem: Problem, rel_step: float,
                        random_start: bool) -> Optional[Runner]:
  try:
    import torch
    import torchattacks
  except ImportError as error:
    print(f"  torchattacks skipped: not installed ({error})")
    return None
  xt, yt = torch.from_numpy(nchw(problem.x)), torch.from_numpy(problem.y.astype(np.int64))
  clean = torch_predict(model, xt) == problem.y
  cls = torchattacks.PGD if problem.norm == "linf" else torchattacks.PGDL2

  def attack_at(eps, images, labels):
    return cls(model, eps=eps, alpha=rel_step * eps, steps=problem.steps,
               random_start=random_start)(images, labels).numpy()

  def run(repeat: int) -> np.ndarray:
    torch.manual_seed(problem.seed + repeat)
    return _per_eps(problem, model, clean, attack_at, "torchattacks", xt, yt)

  attack_at(float(problem.epsilons[-1]), xt[:8], yt[:8])  # warm-up
  return Runner("torchattacks", torchattacks.__version__, step_label(rel_step, random_start),
                f"{cls.__name__}, one call per eps; last iterate", run, {},
                torch_row_counter(model, run))


def foolbox_runner(model, problem: Problem, rel_step: float,
                   random_start: bool) -> Optional[Runner]:
  try:
    import foolbox as fb
    import torch
  except ImportError as error:
    print(f"  foolbox skipped: not installed ({error})")
    return None
  fmodel = fb.PyTorchModel(model, bounds=(0.0, 1.0), device="cpu")
  xt, yt = torch.from_numpy(nchw(problem.x)), torch.from_numpy(problem.y.astype(np.int64))
  clean = torch_predict(model, xt) == problem.y
  # One call serves every eps, so the step is given relative to eps (one abs_stepsize could not).
  cls = fb.attacks.LinfPGD if problem.norm == "linf" else fb.attacks.L2PGD
  attack = cls(rel_stepsize=rel_step, steps=problem.steps, random_start=random_start)
  eps_list = [float(e) for e in problem.epsilons if e > 0]

  def run(repeat: int) -> np.ndarray:
    torch.manual_seed(problem.seed + repeat)
    _, clipped, _ = attack(fmodel, xt, yt, epsilons=eps_list)
    by_eps = dict(zip(eps_list, clipped))
    robust = []
    for eps in problem.epsilons:
      if eps == 0:
        robust.append(clean)
        continue
      adv = by_eps[float(eps)].numpy()
      check_adv("foolbox", adv, xt.numpy(), float(eps), problem.norm)
      robust.append(clean & (torch_predict(model, adv) == problem.y))
    return np.stack(robust)

  attack(fmodel, xt[:8], yt[:8], epsilons=eps_list[-1:])  # warm-up
  return Runner("foolbox", fb.__version__, step_label(rel_step, random_start),
                f"{cls.__name__}, one call with epsilons=[...]; last iterate", run, {},
                torch_row_counter(model, run))


def art_runner(model, problem: Problem, rel_step: float, random_start: bool) -> Optional[Runner]:
  try:
    import art
    import torch
    from art.attacks.evasion import ProjectedGradientDescent
    from art.estimators.classification import PyTorchClassifier
  except ImportError as error:
    print(f"  ART skipped: not installed ({error})")
    return None
  classifier = PyTorchClassifier(model=model, loss=torch.nn.CrossEntropyLoss(),
                                 input_shape=(1, 8, 8), nb_classes=10, clip_values=(0.0, 1.0),
                                 device_type="cpu")
  xn, labels = nchw(problem.x), problem.y.astype(np.int64)
  clean = torch_predict(model, xn) == problem.y
  batch = xn.shape[0]

  def attack_at(eps, images, targets):
    attack = ProjectedGradientDescent(
        estimator=classifier, norm=np.inf if problem.norm == "linf" else 2, eps=eps,
        eps_step=rel_step * eps, max_iter=problem.steps, num_random_init=int(random_start),
        batch_size=batch, verbose=False)
    return attack.generate(x=images, y=targets)

  def run(repeat: int) -> np.ndarray:
    np.random.seed(problem.seed + repeat)  # ART draws its random start with NumPy
    return _per_eps(problem, model, clean, attack_at, "ART", xn, labels)

  attack_at(float(problem.epsilons[-1]), xn[:8], labels[:8])  # warm-up
  return Runner("ART", art.__version__, step_label(rel_step, random_start),
                f"one generate per eps, batch_size={batch}; last iterate", run, {},
                torch_row_counter(model, run))


PEERS = {"torchattacks": torchattacks_runner, "foolbox": foolbox_runner, "art": art_runner}


def measure(runners: list[Runner], epsilons: np.ndarray, repeats: int) -> list[dict[str, Any]]:
  """Round-robin over the runners ``repeats`` times; the best time and repeat 0's flags.

  Then, untimed, each runner's model rows of one curve (seed 0), where it can count them.
  """
  times: list[list[float]] = [[] for _ in runners]
  accuracies: list[list[np.ndarray]] = [[] for _ in runners]
  flags: list[Optional[np.ndarray]] = [None for _ in runners]
  for repeat in range(repeats):
    for i, runner in enumerate(runners):
      start = time.perf_counter()
      robust = runner.run(repeat)
      times[i].append(time.perf_counter() - start)
      accuracies[i].append(envelope(robust, epsilons).mean(axis=1))
      if repeat == 0:
        flags[i] = robust
  rows = [runner.count_rows() if runner.count_rows is not None else (None, None)
          for runner in runners]
  results = []
  for runner, t, acc, robust, (fwd, grad) in zip(runners, times, accuracies, flags, rows):
    acc = np.stack(acc)
    results.append({
      "library": runner.library, "version": runner.version, "setting": runner.setting,
      "note": runner.note, **runner.info,
      "time_s": min(t), "median_s": statistics.median(t), "times_s": t,
      "model_rows_forward": fwd, "model_rows_gradient": grad,
      "robust_accuracy": robust.mean(axis=1).tolist(),
      "robust_accuracy_envelope": envelope(robust, epsilons).mean(axis=1).tolist(),
      "envelope_seeds": acc.tolist(),
      "envelope_seed_mean": acc.mean(axis=0).tolist(),
      "envelope_seed_min": acc.min(axis=0).tolist(), "envelope_seed_max": acc.max(axis=0).tolist(),
    })
  return results


# ------------------------------------------------------------------------------------------------
# Report.


def format_table(results: list[dict[str, Any]], epsilons: np.ndarray, reference: float,
                 key: str) -> str:
  eps_cols = [f"{e:.3g}" for e in epsilons]
  header = (["library", "setting", "curve time (s, best)", "x jaxrobust", "model rows fwd",
             "model rows grad"] + [f"eps={c}" for c in eps_cols])
  count = lambda n: "-" if n is None else str(n)
  rows = []
  for r in results:
    rows.append([r["library"], r["setting"], f"{r['time_s']:.3f}",
                 f"{r['time_s'] / reference:.1f}", count(r.get("model_rows_forward")),
                 count(r.get("model_rows_gradient"))] + [f"{a:.3f}" for a in r[key]])
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines)


def _noise(a: dict[str, Any], b: dict[str, Any], n: int) -> np.ndarray:
  p = np.asarray(a["envelope_seed_mean"])
  spread = lambda r: np.asarray(r["envelope_seed_max"]) - np.asarray(r["envelope_seed_min"])
  binomial = 2 * np.sqrt(np.maximum(p * (1 - p), 1.0 / n) / n)
  return np.maximum(np.maximum(spread(a), spread(b)), binomial)


def discrepancies(results: list[dict[str, Any]], n: int) -> list[str]:
  """Eps where jaxrobust's robust accuracy is above a peer's by more than noise.

  jaxrobust's defaults are compared with every peer row (any setting); jaxrobust with a matched
  step with the peers that use the same step. Both sides are compared by their mean over the
  random-start seeds, with jaxrobust's convention (the envelope). Noise at each eps is the larger
  of the spread over the seeds (either side) and two binomial standard errors on ``n`` examples.
  """
  notes = []
  ours = [r for r in results if r["library"] == "jaxrobust"]
  peers = [r for r in results if not r["library"].startswith("jaxrobust")]
  for mine in ours:
    p = np.asarray(mine["envelope_seed_mean"])
    for r in peers:
      if mine["setting"] != "defaults" and r["setting"] != mine["setting"]:
        continue
      peer = np.asarray(r["envelope_seed_mean"])
      noise = _noise(mine, r, n)
      for k in np.nonzero(p - peer > noise)[0]:
        notes.append(f"{r['library']} ({r['setting']}) finds more adversarial points than "
                     f"jaxrobust ({mine['setting']}) at eps index {k}: {p[k]:.3f} vs "
                     f"{peer[k]:.3f} (noise {noise[k]:.3f})")
  return notes


def strongest_peer_margin(results: list[dict[str, Any]]) -> dict[str, list[float]]:
  """Per jaxrobust setting: its seed-mean robust accuracy minus the lowest comparable peer's."""
  out = {}
  peers = [r for r in results if not r["library"].startswith("jaxrobust")]
  for mine in (r for r in results if r["library"] == "jaxrobust"):
    rows = [r for r in peers if mine["setting"] == "defaults" or r["setting"] == mine["setting"]]
    if rows:
      best = np.min([r["envelope_seed_mean"] for r in rows], axis=0)
      out[mine["setting"]] = (np.asarray(mine["envelope_seed_mean"]) - best).tolist()
  return out


def parse_steps(text: str, steps: int) -> list[float]:
  """``"0.25,2.5/K"`` -> ``[0.25, 2.5 / steps]`` (distinct values, in order)."""
  out = []
  for part in text.split(","):
    part = part.strip().replace("K", str(steps))
    if part:
      num, _, den = part.partition("/")
      value = float(num) / (float(den) if den else 1.0)
      if value not in out:  # e.g. 0.25 and 2.5/K for K = 10
        out.append(value)
  return out


def main(argv: Optional[list[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=20, help="PGD steps (default 20)")
  parser.add_argument("--num-eps", type=int, default=8, help="eps grid size (default 8)")
  parser.add_argument("--eps-max", type=float, default=0.3,
                      help="largest Linf eps; the grid is linspace(0, eps-max, num-eps) "
                           "(default 0.3)")
  parser.add_argument("--eps-max-l2", type=float, default=2.1,
                      help="largest L2 eps (default 2.1)")
  parser.add_argument("--n", type=int, default=None,
                      help="test examples (default: the whole digits test split, 540)")
  parser.add_argument("--arch", nargs="+", choices=tuple(ARCHS), default=["cnn"])
  parser.add_argument("--model", choices=("plain", "adversarial", "both"), default="both")
  parser.add_argument("--norm", nargs="+", choices=("linf", "l2"), default=["linf"])
  parser.add_argument("--weights", choices=("frozen", "demo"), default="frozen",
                      help="the frozen files in benchmarks/reference (default), or trained: "
                           "jaxrobust.demo.train's CNN, train_mlp's MLP")
  parser.add_argument("--freeze-mlp", action="store_true",
                      help="train both MLPs with train_mlp, write them to "
                           "benchmarks/reference/digits_mlp_*.npz, exit")
  parser.add_argument("--settings", default="defaults,matched",
                      help="'defaults' (each library's default step), 'matched' (the same "
                           "constant steps everywhere), or both (default)")
  parser.add_argument("--matched-steps", default="0.25,2.5/K",
                      help="matched constant steps as fractions of eps; K = --steps "
                           "(default '0.25,2.5/K')")
  parser.add_argument("--repeats", type=int, default=3,
                      help="random-start seeds (and timed runs) per runner; the best time is "
                           "reported, the seed spread is the noise (default 3)")
  parser.add_argument("--peers", default="torchattacks,foolbox,art",
                      help="comma-separated peers to run (default: all)")
  parser.add_argument("--timing-variants", action="store_true",
                      help="also time jaxrobust with eps_batch_size=0 (and unrolled, Linf)")
  parser.add_argument("--random-init", action="store_true",
                      help="use untrained random weights (smoke test; no training, no cache)")
  parser.add_argument("--torch-threads", type=int, default=None,
                      help="torch.set_num_threads for the peers (default: the core count)")
  parser.add_argument("--cpu-devices", type=int, default=os.cpu_count() or 1,
                      help="JAX CPU devices: jaxrobust's curve runs data-parallel over them "
                           "(shard_map over the points), since XLA:CPU runs a convolution's "
                           "input gradient on about one core (default: the core count; 1: one device)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", type=pathlib.Path, default=None, help="write the figures as JSON")
  args = parser.parse_args(argv)
  use_cpu_devices(args.cpu_devices)
  if args.freeze_mlp:
    freeze_mlps()
    return 0
  if (args.steps < 1 or args.num_eps < 1 or not 0 <= args.eps_max < 1 or args.repeats < 1
      or not args.eps_max_l2 >= 0):
    parser.error("need --steps >= 1, --num-eps >= 1, 0 <= --eps-max < 1, --eps-max-l2 >= 0, "
                 "--repeats >= 1")
  peers = [p.strip().lower() for p in args.peers.split(",") if p.strip()]
  for p in peers:
    if p not in PEERS:
      parser.error(f"unknown peer {p!r}; choose from {', '.join(PEERS)}")
  settings = {s.strip() for s in args.settings.split(",") if s.strip()}
  if not settings <= {"defaults", "matched"}:
    parser.error("--settings takes 'defaults', 'matched' or both")
  matched = parse_steps(args.matched_steps, args.steps) if "matched" in settings else []

  cores = os.cpu_count() or 1
  torch_note = "torch not installed"
  try:
    import torch

    torch.set_num_threads(args.torch_threads or cores)
    torch_note = f"torch {torch.__version__}, torch.set_num_threads({torch.get_num_threads()})"
  except ImportError:
    pass
  x, y = load_examples(args.n)
  kinds = ["plain", "adversarial"] if args.model == "both" else [args.model]
  machine = (f"{cores} cores ({platform.processor() or platform.machine()}), "
             f"jax {jax.__version__} on {jax.default_backend()} x {len(jax.devices())} "
             "(default XLA CPU threading), "
             f"{torch_note}")
  print(f"machine: {machine}")
  print(f"PGD, {args.steps} steps, 1 restart, {x.shape[0]} digits test examples; settings: "
        f"{sorted(settings)}; matched steps {[round(s, 4) for s in matched]} of eps")

  report: dict[str, Any] = {
    "machine": machine, "command": "python " + " ".join([sys.argv[0]] + sys.argv[1:]),
    "steps": args.steps, "n": int(x.shape[0]), "repeats": args.repeats,
    "matched_steps": matched, "peer_defaults": PEER_DEFAULTS, "tables": {},
  }
  for arch in args.arch:
    for kind in kinds:
      params = get_params(arch, kind, args.weights, args.random_init)
      apply_fn = ARCHS[arch]().apply
      digest = params_digest(params)
      clean_acc = float(np.mean(np.argmax(jax_logits(params, x, arch), axis=-1) == y))
      model = None
      if peers:
        try:
          import torch  # noqa: F401

          model = torch_port(params) if arch == "cnn" else torch_mlp_port(params)
        except ImportError:
          print("  torch not installed: all peers skipped")
      if model is not None:
        diff = float(np.max(np.abs(torch_logits(model, nchw(x)) - jax_logits(params, x, arch))))
        if not diff <= PORT_TOLERANCE:
          raise AssertionError(f"the torch port disagrees with the Flax model by {diff:g}")
      for norm in args.norm:
        eps_max = args.eps_max if norm == "linf" else args.eps_max_l2
        epsilons = np.linspace(0.0, eps_max, args.num_eps).astype(np.float32)
        problem = Problem(x, y, epsilons, norm, args.steps, args.seed)
        title = f"{arch} {kind} {norm}"
        print(f"\n=== {title} (weights {digest}{', random init' if args.random_init else ''}; "
              f"clean accuracy {clean_acc:.3f}) ===")
        print(f"  eps = [{', '.join(f'{e:.4g}' for e in epsilons)}]")
        if model is not None:
          print(f"  torch port: max |torch logits - JAX logits| = {diff:.3g}")
        runners = [jaxrobust_runner(apply_fn, params, problem, None)]
        runners += [jaxrobust_runner(apply_fn, params, problem, s) for s in matched]
        if args.timing_variants:
          runners.append(jaxrobust_runner(apply_fn, params, problem, None, eps_batch_size=0))
          if norm == "linf":  # unrolled L2 compiles for minutes beyond ~10 steps
            runners.append(jaxrobust_runner(apply_fn, params, problem, None, eps_batch_size=0,
                                            unroll=True))
        print("  jaxrobust compile: " + ", ".join(
          f"{r.library} {r.setting} {r.info['compile_s']:.2f} s" for r in runners))
        if model is not None:
          for p in peers:
            defaults, default_start = PEER_DEFAULTS[p]
            configs = [(s, True) for s in matched]
            if "defaults" in settings and (defaults[norm], default_start) not in configs:
              configs.insert(0, (defaults[norm], default_start))
            for rel_step, random_start in configs:
              runner = PEERS[p](model, problem, rel_step, random_start)
              if runner is not None:
                runners.append(runner)

        load_before = os.getloadavg()[0]
        results = measure(runners, epsilons, args.repeats)
        load_after = os.getloadavg()[0]
        reference = results[0]["time_s"]
        print(f"  1-min load average {load_before:.1f} before, {load_after:.1f} after (above "
              f"{cores} means other processes competed for the cores)")
        print(f"\n  robust accuracy, mean over {args.repeats} seeds, jaxrobust's convention "
              "(robust at eps and every smaller eps of the grid):")
        print(format_table(results, epsilons, reference, "envelope_seed_mean"))
        print(f"\n  spread over the {args.repeats} random-start seeds (min-max):")
        for r in results:
          print(f"    {r['library'] + ', ' + r['setting']:52s} " + ", ".join(
            f"{lo:.3f}-{hi:.3f}" for lo, hi in zip(r["envelope_seed_min"],
                                                   r["envelope_seed_max"])))
        margins = strongest_peer_margin(results)
        for setting, margin in margins.items():
          print(f"  jaxrobust ({setting}) minus the strongest comparable peer: "
                + ", ".join(f"{m:+.3f}" for m in margin))
        notes = discrepancies(results, x.shape[0])
        for note in notes:
          print(f"  NOTE: {note}")
        if not notes and model is not None:
          print("  no peer finds more adversarial points than jaxrobust beyond noise")
        report["tables"][title] = {
          "weights": digest, "clean_accuracy": clean_acc, "epsilons": epsilons.tolist(),
          "results": results, "load_average": [load_before, load_after],
          "margin_to_strongest_peer": margins, "discrepancies": notes}

  if args.out is not None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
