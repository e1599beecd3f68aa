#!/usr/bin/env python
"""Real model sizes (issue #26): WideResNets and ResNet-50 against torchattacks and AutoAttack.

Everything else in ``benchmarks/`` runs 8x8 digits models. This script measures jaxrobust on the
models its users evaluate: a CIFAR-10 WideResNet (WRN-28-10, 36.5 M parameters; WRN-16-4;
WRN-10-2 for CPUs) on ``32x32x3`` and an ImageNet ResNet-50 on ``224x224x3``, each mirrored in
PyTorch with identical weights (``benchmarks/scale_models.py``; logits checked to 1e-3 relative in
full float32 precision before anything is timed).

Data and regimes. Images are uniform random (seeded); labels are the model's clean prediction,
so every point starts clean-correct.

* ``random``: the randomly initialised network. Points break (at Linf 8/255 nearly all of them),
  so early exit (jaxrobust's default) can matter.
* ``full``: the full-cost regime. The same network with a down-scaled head,
  ``logits = 1e-3 * trunk(x) + 10 * onehot(0)``, all images labelled 0. No point can break (the
  trunk's logits would have to move by 10^4), so every attack runs its whole budget: the worst
  case, and the one that dominates evaluations of robust models. The input gradients still flow
  (checked: every row's cross-entropy gradient is non-zero), so the attacks really compute; and
  the script asserts that no side breaks any point.

Sections (``--sections``):

* ``pgd``: PGD-K (``--steps``, one restart, random start, step ``eps / 4`` on both sides, Linf eps
  8/255 and L2 0.5) on ``--model`` at ``--batch``: jaxrobust's ``jr.run`` on the random regime with
  early exit (the default) and dense (``early_exit=False``), and on the full-cost regime (default
  early exit, nothing to exit); the time of K raw input gradients (one jitted cross-entropy input
  gradient, times K) as the floor; torchattacks ``PGD`` / ``PGDL2`` and K torch input gradients.
* ``resnet``: the same on ``--resnet-model`` (ResNet-50) at ``--resnet-batch`` with
  ``--resnet-steps``, ``--resnet-dtypes``, ``--resnet-norms`` and ``--resnet-programs``.
* ``aa``: AutoAttack's standard Linf suite as one ``jr.robustness_curve`` over ``--eps`` on
  ``--aa-model`` with ``--points`` points, full-cost regime, against the reference AutoAttack
  (fra31/auto-attack from ``--autoattack-path``, one ``run_standard_evaluation`` per eps). The
  reference may run fewer points (``--reference-points``) and fewer eps (``--reference-eps``, the
  largest ones); in the full-cost regime every point and eps costs the same, so the time and row
  ratios are taken per point and eps (said so in the output).
* ``evaluate``: ``jr.evaluate`` (with a mesh over the ``--cpu-devices`` on a CPU) streaming
  ``--eval-images`` random images (a generator that draws them batch by batch, labels from the
  clean prediction) through AutoAttack ``fast`` (or ``--eval-version standard``) on
  ``--eval-model`` at ``--eval-batch``, one run per image count: XLA compilations (counted from
  JAX's compile events), the process's peak resident memory before and after each run (flat in
  N when the evaluation streams), throughput, and a checkpointed run of the first count stopped
  halfway, then resumed, whose report must equal the uninterrupted one. Not in the presets' default
  sections (``--sections evaluate``; small: WRN-10-2, 64 and 256 images in batches of 32).
* ``certify``: certification at scale (issue #26, item 6), two units. ``bounds``: IBP logit
  bounds on ``--ibp-model`` and IBP and CROWN-IBP margin bounds on ``--crown-model`` for
  ``--cert-points`` points in the Linf box of radius ``--cert-eps``, CROWN-IBP once per
  ``examples_per_pass`` of ``--crown-chunks`` (the documented memory knob of
  ``jr.certify.margin_bounds``: XLA's buffer sizes show what it bounds); each bound checked
  against the logits and margins of the clean points and 8 uniform draws of the box, CROWN-IBP
  checked equal at every setting and never looser than IBP. (Full CROWN runs one backward pass
  per unit of every nonlinear layer: out of reach at 32x32, see ``margin_bounds``.)
  ``smoothing``: ``jr.certify.smoothing`` (one program for every image, split over the
  ``--cpu-devices`` with each image's key) against the PyTorch port
  of Cohen et al.'s CERTIFY in ``bench_certify.py`` (one image at a time) on the torch mirror,
  ``--smoothing-points`` images, ``--sigma``, ``--n0``, ``--n``, ``--alpha``, draws per model
  call ``--smoothing-batch`` on both sides. Not in the presets' default sections (``--sections
  certify``; small: WRN-10-2, 8 points, n 1,000; device: IBP on WRN-28-10 and CROWN-IBP on
  WRN-16-4 with 128 points, smoothing on WRN-16-4, 32 images, n 10,000).
* ``compile``: trace+lower and compile time of the AutoAttack curve program on
  ``--compile-model`` (``--points`` points, ``--eps``), with the weights and data as arguments
  (``args``), with the weights closed over (``weights``: XLA constants) and with weights and data
  closed over (``weights+data``); ``--constants`` adds the last two (they can take minutes).

Parameters and data are arguments of every jitted program: the NNX model is split once
(``nnx.split``) and each program takes ``(state, x, y, eps, key)`` and merges the model inside
(the ``compile`` section's constant variants excepted, on purpose).

dtypes (``--dtypes``): ``float32``, and ``bfloat16`` = the model computing in bfloat16 (the NNX
state cast once, outside the program; inputs cast inside; logits returned in float32; iterates
float32). The torch side runs under ``torch.autocast("cuda", torch.bfloat16)`` on a GPU and with
bfloat16 weights on a CPU.

Measurements. Compile time is measured apart (``jax.jit(f).lower(...)``, then ``.compile()``);
each PGD program is run once to warm up, then ``--repeats`` times, best reported; the AutoAttack
curve (minutes on a CPU) runs ``--aa-repeats`` times after its AOT compile without a separate
warm-up. Model rows with and without gradient come from separate untimed runs:
``jr.metrics.count_evaluations`` on the jaxrobust side (split over the CPU devices as the timed
program is), a forward hook on the torch model on the
peers' side (a call counts as "gradient" when autograd records it), as ``bench_peers.py`` counts.
Where rows cannot depend on which points break (the dense program, the full-cost regime: nothing
breaks) they are counted on a stand-in trunk (a linear layer under the same head, same shapes)
whose program compiles in seconds; ``--check-rows`` also counts on the real model and asserts
equality. Peak device memory: for JAX, the compiled program's XLA buffers
(``compiled.memory_analysis()``: arguments + temporaries + outputs - aliased), XLA's estimate of
the program's live peak (``peak_memory_in_bytes``, where the jaxlib reports it) and the process
peak ``peak_bytes_in_use`` after the program (JAX cannot reset it, so each section/dtype runs in
its own subprocess (``--isolate``, the default) and the peak is cumulative within it; on a GPU it
includes compile-time scratch such as XLA's convolution autotuning, which the first program
compiled carries: ``XLA_FLAGS=--xla_gpu_autotune_level=0`` leaves that out, at some speed); for
torch, ``torch.cuda.max_memory_allocated`` after a reset. On a CPU there is no device peak
("-").

Every core on a CPU. XLA:CPU runs these networks' convolution input gradients on about one core
(WRN-10-2, batch 32, one input gradient: 68 ms pinned to one core, 56 ms on two; its forward
passes use both cores at large batches), while torch's run on all of them (34 ms on two threads,
65 ms on one; ``bench_cpu_cores.py``). ``--cpu-devices N`` asks JAX for N CPU devices
(``jax_num_cpu_devices``) and runs jaxrobust's ``pgd``, ``resnet``, ``aa`` and smoothing programs
(and the raw-gradient floor) data-parallel over them: ``jax.shard_map`` over the batch, the state
replicated, the key folded with the device index: what ``jr.evaluate(..., mesh=mesh)`` runs per
device on its ``shard_map`` path; the ``evaluate`` section passes ``jr.evaluate`` that mesh.
``--torch-threads`` sets torch's threads. Both default to the
core count on a CPU (``--cpu-devices 1 --torch-threads 1``: one core each).

Peers are optional and imported lazily; a missing peer is skipped with a note. Every table is
printed with the device, the jax/torch versions and the 1-min load average; ``--out`` gets all
figures as JSON.

Presets. ``--small`` (the default): 2 CPU cores, a few minutes on a quiet machine (9 on a
loaded one): WRN-10-2 PGD-10 at batch 32 (Linf and L2, float32 and bfloat16), AutoAttack on
WRN-10-2 with 4 points at 0.5/255 and 2/255 (the reference at 2/255 only), the compile of that
curve with and without constants, ResNet-50 PGD-3 at batch 2 (float32, Linf, dense and full
cost); both sides on every core: torch with one thread per core, and jaxrobust's PGD and
AutoAttack programs split over one JAX CPU device per core (``--cpu-devices``, below).
``--device-preset``: an H100/H200 lent for 15 minutes: WRN-28-10 PGD-10 at batch 512
(float32 and bfloat16), AutoAttack on WRN-16-4 with 128 points at 1/255 and 2/255 (the reference
at 2/255; 4 eps would take about as long as the reference's 150 s for the jaxrobust run alone),
the compile of the AutoAttack curve for WRN-28-10 with parameters as arguments, ResNet-50 PGD-10
at batch 128 (float32 and bfloat16, dense and full cost); rows counted on the stand-in only
(``--rows cheap``), each unit killed after 150 s, and no unit started with less than 30 s left of
``--budget`` 450 s (float32 units first). Every size can be overridden on the command line.

Examples::

  # 2 CPU cores, a few minutes (WRN-10-2, small batches, ResNet-50 at batch 2)
  python benchmarks/bench_scale.py --small --autoattack-path /tmp/autoattack_ref --out /tmp/s.json
  # the CPU goals of issue #26: AutoAttack full cost on WRN-10-2, 16 points, vs the reference;
  # the compile of the AutoAttack curve for WRN-28-10 with parameters as arguments
  python benchmarks/bench_scale.py --sections aa --aa-model wrn-10-2 --points 16 \\
      --eps 0.5/255 2/255 --reference-eps 2 --autoattack-path /tmp/autoattack_ref
  python benchmarks/bench_scale.py --sections compile --compile-model wrn-28-10 --points 16 \\
      --no-constants
  # an accelerator (each section and dtype in its own subprocess)
  python benchmarks/bench_scale.py --device-preset --autoattack-path .aa --out $OUT/scale.json
  # certification at scale (issue #26, item 6): CPU sizes, then an accelerator's
  python benchmarks/bench_scale.py --small --sections certify --out /tmp/certify.json
  python benchmarks/bench_scale.py --device-preset --sections certify --out $OUT/certify.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

# Torch shares the accelerator with JAX in one process: JAX allocates as it needs, instead of
# taking 75% of the device memory up front. Its allocator still reports peak_bytes_in_use.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
for _path in (ROOT, BENCH):
  if str(_path) not in sys.path:
    sys.path.insert(0, str(_path))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

import jaxrobust as jr  # noqa: E402
from jaxrobust.model import model_of  # noqa: E402
import scale_models  # noqa: E402
from cpu_devices import batch_mesh, split_over_devices, use_cpu_devices  # noqa: E402
from bench_autoattack import import_autoattack  # noqa: E402

SECTIONS = ("pgd", "aa", "compile", "resnet", "evaluate", "certify")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
COMPILE_VARIANTS = ("args", "weights", "weights+data")
PROGRAMS = ("early-exit", "dense", "full-cost")
"""jaxrobust's PGD programs: random regime with early exit and dense, full-cost regime."""
FULL_COST_SCALE = 1e-3
FULL_COST_MARGIN = 10.0
"""Full-cost head: ``1e-3 * trunk(x) + 10 * onehot(0)``; labels are all 0."""
REL_STEP = 0.25
"""PGD's step as a fraction of eps on both sides (torchattacks' default 2/255 at 8/255)."""
GIB = 2.0 ** 30
PARTIAL: list[pathlib.Path] = []
"""Where a worker writes its unit's figures after every measurement (a killed unit keeps them)."""

PRESETS: dict[str, dict[str, Any]] = {
  # 2 CPU cores, a few minutes in all (the reference AutoAttack on the largest eps only); torch
  # threads and JAX CPU devices default to the core count (on a loaded machine, two OpenMP
  # threads ran 5-10x slower: --torch-threads 1 --cpu-devices 1 there).
  "small": dict(sections=["pgd", "aa", "compile", "resnet"], dtypes=["float32", "bfloat16"],
                norms=["linf", "l2"], model="wrn-10-2", batch=32, steps=10,
                programs=["early-exit", "dense", "full-cost"], resnet_model="resnet50",
                resnet_batch=2, resnet_steps=3, resnet_dtypes=["float32"],
                resnet_norms=["linf"], resnet_programs=["dense", "full-cost"],
                aa_model="wrn-10-2", points=4, eps=["0.5/255", "2/255"], reference_points=None,
                reference_eps=1, aa_dtypes=["float32"], compile_model="wrn-10-2",
                constants=True, repeats=3, aa_repeats=1, rows="all", torch_threads=None,
                eval_model="wrn-10-2", eval_images=[64, 256], eval_batch=32,
                ibp_model="wrn-10-2", crown_model="wrn-10-2", cert_points=8,
                cert_eps="1/255", crown_chunks=["all", "4", "1"], smoothing_model="wrn-10-2",
                smoothing_points=4, sigma=0.25, n0=100, n=1000, alpha=0.001,
                smoothing_batch=500, section_timeout=600.0, budget=1800.0),
  # An H100/H200 lent for 15 minutes: each unit (section, dtype) under 150 s, all well under 8
  # minutes. AutoAttack at 2 eps (the full-cost curve costs the same per point and eps; 4 eps of
  # 128 points would take ~150 s alone), the reference on the largest eps only.
  "device": dict(sections=["pgd", "aa", "compile", "resnet"], dtypes=["float32", "bfloat16"],
                 norms=["linf"], model="wrn-28-10", batch=512, steps=10,
                 programs=["early-exit", "dense", "full-cost"], resnet_model="resnet50",
                 resnet_batch=128, resnet_steps=10, resnet_dtypes=["float32", "bfloat16"],
                 resnet_norms=["linf"], resnet_programs=["dense", "full-cost"],
                 aa_model="wrn-16-4", points=128, eps=["1/255", "2/255"], reference_points=None,
                 reference_eps=1, aa_dtypes=["float32"], compile_model="wrn-28-10",
                 constants=False, repeats=3, aa_repeats=1, rows="cheap", torch_threads=None,
                 eval_model="wrn-16-4", eval_images=[2048, 10000], eval_batch=1024,
                 ibp_model="wrn-28-10", crown_model="wrn-16-4", cert_points=128,
                 cert_eps="1/255", crown_chunks=["all", "32", "8"], smoothing_model="wrn-16-4",
                 smoothing_points=32, sigma=0.25, n0=100, n=10_000, alpha=0.001,
                 smoothing_batch=1000, section_timeout=150.0, budget=450.0),
}


# ------------------------------------------------------------------------------------------------
# Environment.


def load_average() -> float:
  return float(os.getloadavg()[0])


def torch_module():
  try:
    import torch
  except ImportError:
    return None
  return torch


def torch_device() -> str:
  torch = torch_module()
  return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"


def environment() -> dict[str, Any]:
  device = jax.devices()[0]
  torch = torch_module()
  env = {"jax": jax.__version__, "jaxrobust": jr.__version__, "backend": jax.default_backend(),
         "device": f"{device.platform}:{getattr(device, 'device_kind', '?')}",
         "devices": len(jax.devices()),
         "cpu": f"{os.cpu_count()} cores ({platform.processor() or platform.machine()})",
         "torch": torch.__version__ if torch is not None else None}
  if torch is not None:
    env["torch_device"] = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
                           else f"cpu, {torch.get_num_threads()} threads")
    env["torch_tf32"] = {"cudnn": torch.backends.cudnn.allow_tf32,
                         "matmul": torch.backends.cuda.matmul.allow_tf32}
  env["jax_default_matmul_precision"] = jax.config.jax_default_matmul_precision
  return env


def header(env: dict[str, Any]) -> str:
  count = env.get("devices", 1)
  return (f"device {env['device']}{f' x {count}' if count > 1 else ''} (jax {env['jax']}, "
          f"backend {env['backend']}); torch "
          f"{env['torch']} on {env.get('torch_device', '-')}; {env['cpu']}; 1-min load "
          f"{load_average():.2f}")


def jax_peak() -> int | None:
  stats = jax.devices()[0].memory_stats()
  return None if not stats else stats.get("peak_bytes_in_use")


def save_partial(out: dict[str, Any]) -> None:
  for path in PARTIAL:
    path.write_text(json.dumps(out, default=str))


def gib(n: int | float | None) -> str:
  return "-" if n is None else f"{n / GIB:.2f}"


# ------------------------------------------------------------------------------------------------
# Models as functions of their state.


def full_cost_head(z: jax.Array) -> jax.Array:
  return FULL_COST_SCALE * z + FULL_COST_MARGIN * jax.nn.one_hot(0, z.shape[-1], dtype=z.dtype)


def identity(z: jax.Array) -> jax.Array:
  return z


class StandIn(nnx.Module):
  """A linear trunk: the cheap model whose rows equal the real one's where nothing breaks."""

  def __init__(self, shape: tuple[int, ...], num_classes: int, rngs: nnx.Rngs):
    self.dense = nnx.Linear(int(np.prod(shape)), num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.dense(x.reshape(x.shape[0], -1))


class Model:
  """An NNX model split once: ``apply(state, x)`` is a pure function of its state.

  ``state[dtype]`` holds the parameters cast to each dtype; ``apply`` casts the inputs to the
  parameters' dtype and returns float32 logits through the regime's head.
  """

  def __init__(self, name: str, module: nnx.Module, use_bn: bool = False):
    self.name, self.module, self.use_bn = name, module, use_bn
    self.graphdef, state = nnx.split(module)
    self.state = {d: state if d == "float32" else scale_models.cast_state(state, DTYPES[d])
                  for d in DTYPES}
    self.num_classes = module.head.out_features if hasattr(module, "head") else \
        module.dense.out_features

  def apply(self, dtype: str, regime: str) -> Callable[[Any, jax.Array], jax.Array]:
    graphdef, head = self.graphdef, full_cost_head if regime == "full" else identity
    compute = DTYPES[dtype]

    def apply(state, x):
      return head(nnx.merge(graphdef, state)(x.astype(compute)).astype(jnp.float32))

    return apply


def build_model(name: str, use_bn: bool, seed: int) -> Model:
  start = time.perf_counter()
  model = Model(name, scale_models.build(name, use_bn=use_bn, seed=seed), use_bn)
  print(f"  built {name} ({scale_models.count_parameters(model.module) / 1e6:.2f} M parameters"
        f"{', BatchNorm' if use_bn or name.startswith('resnet') else ', no BatchNorm'}) in "
        f"{time.perf_counter() - start:.1f} s", flush=True)
  return model


def stand_in(name: str, num_classes: int) -> Model:
  return Model("stand-in", StandIn(scale_models.image_shape(name), num_classes, nnx.Rngs(0)))


def make_data(model: Model, dtype: str, regime: str, n: int, seed: int):
  """Uniform random images ``[n, H, W, 3]`` and their clean labels under ``dtype``."""
  shape = scale_models.image_shape(model.name)
  x = np.random.default_rng(seed).uniform(size=(n, *shape)).astype(np.float32)
  logits = jax.jit(model.apply(dtype, regime))(model.state[dtype], jnp.asarray(x))
  y = np.asarray(jnp.argmax(logits, -1), np.int32)
  if regime == "full" and np.any(y != 0):
    raise AssertionError("the full-cost head does not predict class 0 everywhere")
  return jnp.asarray(x), jnp.asarray(y)


# ------------------------------------------------------------------------------------------------
# JAX programs.


def compile_program(fn: Callable, *args) -> tuple[Any, dict[str, Any]]:
  """AOT-compiles ``jax.jit(fn)`` for ``args``: the compiled program, trace+lower and compile
  seconds, and XLA's buffer sizes."""
  start = time.perf_counter()
  lowered = jax.jit(fn).lower(*args)
  lowered_s = time.perf_counter() - start
  start = time.perf_counter()
  compiled = lowered.compile()
  info = {"trace_lower_s": lowered_s, "compile_s": time.perf_counter() - start}
  try:
    mem = compiled.memory_analysis()
    info["xla_bytes"] = int(mem.argument_size_in_bytes + mem.temp_size_in_bytes
                            + mem.output_size_in_bytes - mem.alias_size_in_bytes)
    info["xla_temp_bytes"] = int(mem.temp_size_in_bytes)
    # XLA's own estimate of the program's live peak (its buffer assignment's heap simulation),
    # where the jaxlib reports it: unlike the allocator's peak, it leaves out compile-time scratch.
    peak = getattr(mem, "peak_memory_in_bytes", None)
    info["xla_peak_bytes"] = int(peak) if peak else None
  except Exception:  # noqa: BLE001 (not every backend reports it)
    info["xla_bytes"] = None
  return compiled, info


def time_program(compiled, args, repeats: int, warmup: bool = True) -> tuple[Any, list[float]]:
  if warmup:
    jax.block_until_ready(compiled(*args))
  times, out = [], None
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  return out, times


def count_rows(program: Callable, apply: Callable, state, x, y, *rest,
               out_axis: int = 0) -> dict[str, int]:
  """Rows through the model in one run of ``program(logits_fn, x, y, *rest)`` (a separate
  program), split over the CPU devices as the timed one is (every device's rows together)."""
  counters = []

  def fn(state, *args):
    logits_fn, counter = jr.metrics.count_evaluations(functools.partial(apply, state))
    counters.append(counter)
    return program(logits_fn, *args)

  split, placed = split_over_devices(fn, state, (x, True), (y, True), *((a, False) for a in rest),
                                     out_axis=out_axis)
  jax.block_until_ready(jax.jit(split)(*placed))
  jax.effects_barrier()
  return {"forward": counters[-1].forward, "gradient": counters[-1].gradient}


def input_gradient(apply: Callable) -> Callable:
  def grad(state, x, y):
    loss = lambda v: optax.softmax_cross_entropy_with_integer_labels(apply(state, v), y).sum()
    return jax.grad(loss)(x)

  return grad


def pgd_attack(norm: str, steps: int):
  return jr.attacks.pgd(norm, steps=steps, step_size=REL_STEP, random_start=True, restarts=1,
                        loss="ce")


def pgd_program(attack, early_exit: bool) -> Callable:
  def program(logits_fn, x, y, eps, key):
    return jr.run(attack, logits_fn, x, y, jr.Budget(eps), key, early_exit=early_exit).success

  return program


def with_state(program: Callable, apply: Callable) -> Callable:
  return lambda state, *rest: program(functools.partial(apply, state), *rest)


# ------------------------------------------------------------------------------------------------
# Torch side.


def torch_model(mirror, dtype: str, regime: str, device: str):
  """The mirror on ``device`` in ``dtype`` (autocast on CUDA, bf16 weights on CPU), float32
  logits through the regime's head."""
  import torch

  class Wrapped(torch.nn.Module):

    def __init__(self, inner):
      super().__init__()
      self.inner = inner

    def forward(self, x):
      if dtype == "bfloat16" and device == "cuda":
        with torch.autocast("cuda", dtype=torch.bfloat16):
          z = self.inner(x)
      elif dtype == "bfloat16":
        z = self.inner(x.to(torch.bfloat16))
      else:
        z = self.inner(x)
      z = z.float()
      if regime == "full":
        offset = torch.zeros(z.shape[-1], device=z.device)
        offset[0] = FULL_COST_MARGIN
        z = FULL_COST_SCALE * z + offset
      return z

  inner = mirror.to(device)
  if dtype == "bfloat16" and device == "cpu":
    inner = inner.to(torch.bfloat16)
  return Wrapped(inner).eval()


def torch_sync(device: str) -> None:
  if device == "cuda":
    import torch

    torch.cuda.synchronize()


@contextlib.contextmanager
def torch_rows(model):
  """A forward hook counting rows: "gradient" when autograd records the call, else "forward"."""
  import torch

  rows = {"forward": 0, "gradient": 0}

  def hook(module, inputs, output):
    del module
    recorded = torch.is_grad_enabled() and output.requires_grad
    rows["gradient" if recorded else "forward"] += int(inputs[0].shape[0])

  handle = model.register_forward_hook(hook)
  try:
    yield rows
  finally:
    handle.remove()


def torch_timed(fn: Callable[[], Any], device: str, repeats: int, warmup: bool = True):
  """Best-of-``repeats`` seconds of ``fn`` and torch's peak device memory (after a reset)."""
  import torch

  if warmup:
    fn()
    torch_sync(device)
  if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
  times, out = [], None
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    torch_sync(device)
    times.append(time.perf_counter() - start)
  peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
  return out, times, peak


def torch_predict(model, x):
  import torch

  with torch.no_grad():
    return model(x).argmax(1)


# ------------------------------------------------------------------------------------------------
# Sections.


def check_mirror(model: Model, seed: int, device: str) -> tuple[Any, float]:
  mirror = scale_models.torch_mirror(model.name, model.module, use_bn=model.use_bn)
  x = np.random.default_rng(seed + 7).uniform(
    size=(2, *scale_models.image_shape(model.name))).astype(np.float32)
  rel = scale_models.check_mirror(
    jax.jit(functools.partial(model.apply("float32", "random"), model.state["float32"])),
    mirror.to(device), x, device=device)
  print(f"  torch mirror: max |torch - JAX| logits / max |logit| = {rel:.2g} (float32, no TF32)")
  return mirror, rel


def pgd_unit(args, name: str, batch: int, steps: int, dtype: str, norms: list[str],
             programs: list[str]) -> dict[str, Any]:
  """PGD-``steps`` on ``name``: raw gradients, jaxrobust's programs, torchattacks."""
  env = environment()
  print(f"\n=== PGD-{steps} on {name}, batch {batch}, {dtype} ===\n{header(env)}", flush=True)
  model = build_model(name, args.wrn_bn, args.seed)
  cheap = stand_in(name, model.num_classes)
  state = model.state[dtype]
  key = jax.random.key(args.seed)
  data = {regime: make_data(model, dtype, regime, batch, args.seed) for regime in ("random",
                                                                                     "full")}
  out: dict[str, Any] = {"env": env, "model": name, "batch": batch, "steps": steps,
                         "dtype": dtype, "rows_policy": args.rows, "results": []}
  rows_out = out["results"]

  # The floor: K jitted input gradients (full-cost head: also the check that gradients flow).
  x, y = data["full"]
  grad_fn, args_grad = split_over_devices(input_gradient(model.apply(dtype, "full")), state,
                                          (x, True), (y, True))
  compiled, info = compile_program(grad_fn, *args_grad)
  grad, times = time_program(compiled, args_grad, args.repeats)
  row_norms = np.asarray(jnp.sqrt(jnp.sum(jnp.square(grad.reshape(batch, -1)), -1)))
  if not np.all(row_norms > 0) or not np.all(np.isfinite(row_norms)):
    raise AssertionError("the full-cost model has zero or non-finite input gradients")
  raw = min(times) * steps
  rows_out.append({"side": "jax", "program": f"{steps} x input gradient", "regime": "full",
                   "norm": "-", "time_s": raw, "times_s": [t * steps for t in times],
                   "rows": {"forward": 0, "gradient": steps * batch}, "broken": None,
                   "peak_bytes": jax_peak(), **info})
  print(f"  {steps} raw input gradients: {raw:.3f} s (compile {info['compile_s']:.1f} s); "
        f"full-cost gradient row norms {row_norms.min():.3g}..{row_norms.max():.3g}", flush=True)
  save_partial(out)
  # The peers first: seconds on an accelerator, where the unit may be cut off during a compile.
  torch_pgd(args, model, data, batch, steps, dtype, norms, out)

  for norm in norms:
    eps = jnp.float32(args.eps_linf if norm == "linf" else args.eps_l2)
    attack = pgd_attack(norm, steps)
    for program_name in programs:
      regime = "full" if program_name == "full-cost" else "random"
      early_exit = program_name != "dense"
      x, y = data[regime]
      program = pgd_program(attack, early_exit)
      apply = model.apply(dtype, regime)
      split, placed = split_over_devices(with_state(program, apply), state, (x, True), (y, True),
                                         (eps, False), (key, False))
      compiled, info = compile_program(split, *placed)
      success, times = time_program(compiled, placed, args.repeats)
      peak = jax_peak()
      broken = int(np.sum(np.asarray(success)))
      if regime == "full" and broken:
        raise AssertionError(f"the full-cost regime lost {broken} points to PGD")
      rows = measure_rows(args, program, model, cheap, dtype, regime, early_exit,
                          (x, y, eps, key))
      rows_out.append({"side": "jax", "program": f"jaxrobust PGD ({program_name})",
                       "regime": regime, "norm": norm, "time_s": min(times), "times_s": times,
                       "rows": rows, "broken": broken, "peak_bytes": peak, **info})
      print(f"  jaxrobust {norm} {program_name}: {min(times):.3f} s = "
            f"{min(times) / raw:.2f} x raw gradients, compile {info['trace_lower_s']:.1f} + "
            f"{info['compile_s']:.1f} s, broken {broken}/{batch}, rows {rows}", flush=True)
      save_partial(out)

  print(pgd_table(out, raw))
  return out


def measure_rows(args, program, model: Model, cheap: Model, dtype: str, regime: str,
                 early_exit: bool, rest: tuple, out_axis: int = 0) -> dict[str, int] | None:
  """Rows of one run: on the stand-in where they cannot depend on breaks, else on the model."""
  breaks_matter = regime == "random" and early_exit
  if args.rows == "none" or (breaks_matter and args.rows == "cheap"):
    return None
  if breaks_matter:
    return count_rows(program, model.apply(dtype, regime), model.state[dtype], *rest,
                      out_axis=out_axis)
  x, y = rest[0], rest[1]
  if regime == "random":  # dense: every row runs every step whatever breaks; labels of the stand-in
    y = jnp.argmax(jax.jit(cheap.apply(dtype, regime))(cheap.state[dtype], x), -1).astype(y.dtype)
  rows = count_rows(program, cheap.apply(dtype, regime), cheap.state[dtype], x, y, *rest[2:],
                    out_axis=out_axis)
  if args.check_rows:
    real = count_rows(program, model.apply(dtype, regime), model.state[dtype], *rest,
                      out_axis=out_axis)
    if real != rows:
      raise AssertionError(f"stand-in rows {rows} differ from the model's {real}")
    print(f"  --check-rows: the stand-in's rows equal the model's ({rows})")
  return rows


def torch_pgd(args, model: Model, data, batch: int, steps: int, dtype: str, norms: list[str],
              out: dict[str, Any]) -> None:
  """torch input gradients and torchattacks, appended to ``out["results"]``."""
  torch = torch_module()
  if torch is None:
    print("  torch not installed: torch side skipped")
    out["torch"] = {"skipped": "torch not installed"}
    return
  device = torch_device()
  mirror, rel = check_mirror(model, args.seed, device)
  out["torch"] = {"mirror_rel_diff": rel, "device": device}
  x, y = data["full"]
  xt = torch.from_numpy(scale_models.nchw(np.asarray(x))).to(device)
  yt = torch.from_numpy(np.asarray(y).astype(np.int64)).to(device)
  net = torch_model(mirror, dtype, "full", device)

  def grad():
    v = xt.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(net(v), yt, reduction="sum")
    return torch.autograd.grad(loss, v)[0]

  _, times, peak = torch_timed(grad, device, args.repeats)
  print(f"  {steps} torch input gradients: {min(times) * steps:.3f} s, peak {gib(peak)} GiB",
        flush=True)
  out["results"].append({"side": "torch", "program": f"{steps} x torch input gradient",
                         "regime": "full", "norm": "-", "time_s": min(times) * steps,
                         "times_s": [t * steps for t in times], "peak_bytes": peak,
                         "rows": {"forward": 0, "gradient": steps * batch}, "broken": None})
  try:
    import torchattacks
  except ImportError as error:
    print(f"  torchattacks skipped: not installed ({error})")
    out["torch"]["torchattacks"] = f"not installed ({error})"
    return
  out["torch"]["torchattacks"] = torchattacks.__version__
  for norm in norms:
    eps = args.eps_linf if norm == "linf" else args.eps_l2
    cls = torchattacks.PGD if norm == "linf" else torchattacks.PGDL2
    for regime in ("random", "full"):
      x, y = data[regime]
      xt = torch.from_numpy(scale_models.nchw(np.asarray(x))).to(device)
      yt = torch.from_numpy(np.asarray(y).astype(np.int64)).to(device)
      net = torch_model(mirror, dtype, regime, device)
      clean = int((torch_predict(net, xt) == yt).sum())
      attack = cls(net, eps=eps, alpha=REL_STEP * eps, steps=steps, random_start=True)
      torch.manual_seed(args.seed)
      adv, times, peak = torch_timed(lambda: attack(xt, yt), device, args.repeats)
      broken = int((torch_predict(net, adv) != yt).sum())
      if regime == "full" and broken:
        raise AssertionError(f"the full-cost regime lost {broken} points to torchattacks")
      with torch_rows(net) as rows:
        attack(xt, yt)
      out["results"].append({"side": "torch", "program": f"torchattacks {cls.__name__}",
                             "regime": regime, "norm": norm, "time_s": min(times),
                             "times_s": times, "rows": dict(rows), "broken": broken,
                             "clean_correct": clean, "peak_bytes": peak})
      print(f"  torchattacks {cls.__name__} {regime}: {min(times):.3f} s, broken "
            f"{broken}/{batch} (clean-correct {clean}), peak {gib(peak)} GiB, rows {rows}",
            flush=True)
      save_partial(out)


def pgd_table(out: dict[str, Any], raw: float) -> str:
  lines = [f"\n{out['model']}, batch {out['batch']}, PGD-{out['steps']}, {out['dtype']} "
           f"({header(out['env'])})",
           "| program | regime | norm | time s (best) | x jax raw grads | compile s (trace+lower "
           "/ XLA) | broken | rows fwd | rows grad | XLA buffers GiB | XLA peak GiB | peak GiB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in out["results"]:
    rows = r.get("rows") or {}
    compile_s = (f"{r['trace_lower_s']:.1f} / {r['compile_s']:.1f}" if "compile_s" in r
                 else "-")
    lines.append(f"| {r['program']} | {r['regime']} | {r['norm']} | {r['time_s']:.3f} | "
                 f"{r['time_s'] / raw:.2f} | {compile_s} | "
                 f"{'-' if r.get('broken') is None else r['broken']} | "
                 f"{rows.get('forward', '-')} | {rows.get('gradient', '-')} | "
                 f"{gib(r.get('xla_bytes'))} | {gib(r.get('xla_peak_bytes'))} | "
                 f"{gib(r.get('peak_bytes'))} |")
  lines.append("(XLA peak: the compiled program's own estimate of its live buffers; JAX peak: "
               "the allocator's, cumulative within this process after the program, compile-time "
               "scratch such as convolution autotuning included; torch peak: reset before each "
               "timed attack)")
  return "\n".join(lines)


def parse_eps(values: list[str]) -> list[float]:
  out = []
  for v in values:
    num, _, den = v.partition("/")
    out.append(float(num) / (float(den) if den else 1.0))
  return sorted(out)


def aa_curve_program(attack) -> Callable:
  def program(logits_fn, x, y, eps, key):
    return jr.robustness_curve(attack, logits_fn, x, y, eps, key).robust

  return program


def aa_jax_unit(args, dtype: str) -> dict[str, Any]:
  env = environment()
  epsilons = parse_eps(args.eps)
  print(f"\n=== AutoAttack standard curve (jaxrobust), {args.aa_model}, {args.points} points, "
        f"eps {[round(e * 255, 3) for e in epsilons]}/255, full cost, {dtype} ===\n"
        f"{header(env)}", flush=True)
  model = build_model(args.aa_model, args.wrn_bn, args.seed)
  cheap = stand_in(args.aa_model, model.num_classes)
  x, y = make_data(model, dtype, "full", args.points, args.seed)
  eps = jnp.asarray(epsilons, jnp.float32)
  key = jax.random.key(args.seed)
  attack = jr.attacks.auto_attack("linf")
  program = aa_curve_program(attack)
  state = model.state[dtype]
  split, placed = split_over_devices(with_state(program, model.apply(dtype, "full")), state,
                                     (x, True), (y, True), (eps, False), (key, False), out_axis=1)
  compiled, info = compile_program(split, *placed)
  save_partial({"env": env, "model": args.aa_model, "points": args.points,
                "epsilons": epsilons, "dtype": dtype, **info})
  print(f"  compile: trace+lower {info['trace_lower_s']:.1f} s, XLA {info['compile_s']:.1f} s; "
        f"XLA buffers {gib(info.get('xla_bytes'))} GiB", flush=True)
  load_before = load_average()
  robust, times = time_program(compiled, placed, args.aa_repeats, warmup=False)
  load_after = load_average()
  robust = np.asarray(robust)
  if not robust.all():
    raise AssertionError(f"the full-cost regime lost {int((~robust).sum())} point-eps to "
                         "AutoAttack")
  rows = measure_rows(args, program, model, cheap, dtype, "full", True, (x, y, eps, key),
                      out_axis=1)
  out = {"env": env, "model": args.aa_model, "points": args.points, "epsilons": epsilons,
         "dtype": dtype, "time_s": min(times), "times_s": times, "rows": rows,
         "peak_bytes": jax_peak(), "load_average": [load_before, load_after], **info}
  print(f"  jaxrobust curve: {min(times):.1f} s ({min(times) / (args.points * len(epsilons)):.3f} "
        f"s per point and eps), nothing broken, rows {rows}, peak {gib(out['peak_bytes'])} GiB, "
        f"load {load_before:.1f}->{load_after:.1f}", flush=True)
  return out


def aa_reference_unit(args, dtype: str) -> dict[str, Any]:
  env = environment()
  epsilons = parse_eps(args.eps)
  ref_eps = epsilons[-args.reference_eps:] if args.reference_eps else epsilons
  points = args.reference_points or args.points
  print(f"\n=== AutoAttack standard (reference), {args.aa_model}, {points} points, eps "
        f"{[round(e * 255, 3) for e in ref_eps]}/255, full cost, {dtype} ===\n{header(env)}",
        flush=True)
  aa_module, note = import_autoattack(args.autoattack_path)
  torch = torch_module()
  if aa_module is None or torch is None:
    note = note if torch is not None else "torch not installed"
    print(f"  reference skipped: {note}")
    return {"env": env, "skipped": note}
  device = torch_device()
  model = build_model(args.aa_model, args.wrn_bn, args.seed)
  mirror, rel = check_mirror(model, args.seed, device)
  x, y = make_data(model, dtype, "full", args.points, args.seed)
  xt = torch.from_numpy(scale_models.nchw(np.asarray(x)[:points]))
  yt = torch.from_numpy(np.asarray(y)[:points].astype(np.int64))
  net = torch_model(mirror, dtype, "full", device)
  per_eps = []
  for eps in ref_eps:
    adversary = aa_module.AutoAttack(net, norm="Linf", eps=float(eps), seed=args.seed,
                                     verbose=False, version="standard", device=device)
    if device == "cuda":
      torch.cuda.reset_peak_memory_stats()
    load_before = load_average()
    with torch_rows(net) as rows, contextlib.redirect_stdout(open(os.devnull, "w")):
      start = time.perf_counter()
      x_adv = adversary.run_standard_evaluation(xt, yt, bs=points)
      torch_sync(device)
      seconds = time.perf_counter() - start
    broken = int((torch_predict(net, x_adv.to(device)).cpu() != yt).sum())
    if broken:
      raise AssertionError(f"the full-cost regime lost {broken} points to the reference")
    per_eps.append({"eps": eps, "time_s": seconds, "rows": dict(rows),
                    "peak_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
                    "load_average": [load_before, load_average()]})
    print(f"  reference eps {eps * 255:.3g}/255: {seconds:.1f} s, nothing broken, rows "
          f"{dict(rows)}, peak {gib(per_eps[-1]['peak_bytes'])} GiB, load "
          f"{load_before:.1f}->{per_eps[-1]['load_average'][1]:.1f}", flush=True)
    save_partial(reference_result(env, args.aa_model, points, dtype, rel, per_eps))
  return reference_result(env, args.aa_model, points, dtype, rel, per_eps)


def reference_result(env, model: str, points: int, dtype: str, rel: float,
                     per_eps: list[dict[str, Any]]) -> dict[str, Any]:
  """The reference's figures over the eps run so far."""
  return {"env": env, "model": model, "points": points, "epsilons": [r["eps"] for r in per_eps],
          "dtype": dtype, "mirror_rel_diff": rel, "per_eps": per_eps,
          "time_s": sum(r["time_s"] for r in per_eps),
          "rows": {k: sum(r["rows"][k] for r in per_eps) for k in ("forward", "gradient")},
          "peak_bytes": max((r["peak_bytes"] or 0) for r in per_eps) or None}


def aa_summary(ours: dict[str, Any], ref: dict[str, Any]) -> str:
  """Time and rows per point and eps: jaxrobust's curve against the reference's runs."""
  if "time_s" not in ours or "time_s" not in ref:
    return "  (no AutoAttack comparison: a side is missing)"
  units_ours = ours["points"] * len(ours["epsilons"])
  units_ref = ref["points"] * len(ref["epsilons"])
  t_ours, t_ref = ours["time_s"] / units_ours, ref["time_s"] / units_ref
  lines = [f"\nAutoAttack standard, {ours['model']}, full cost, {ours['dtype']} "
           f"({header(ours['env'])})",
           "| side | points x eps | time s | compile s | s per point-eps | rows fwd + grad per "
           "point-eps | peak GiB |", "|---|---|---|---|---|---|---|"]

  def per(rows, n):
    return "-" if not rows else (f"{rows['forward'] / n:.0f} + {rows['gradient'] / n:.0f} = "
                                 f"{(rows['forward'] + rows['gradient']) / n:.0f}")

  lines.append(f"| reference | {ref['points']} x {len(ref['epsilons'])} | {ref['time_s']:.1f} | "
               f"- | {t_ref:.3f} | {per(ref['rows'], units_ref)} | {gib(ref['peak_bytes'])} |")
  lines.append(f"| jaxrobust curve | {ours['points']} x {len(ours['epsilons'])} | "
               f"{ours['time_s']:.1f} | {ours['trace_lower_s'] + ours['compile_s']:.1f} | "
               f"{t_ours:.3f} | {per(ours['rows'], units_ours)} | {gib(ours['peak_bytes'])} |")
  ratio = f"time per point-eps: jaxrobust / reference = {t_ours / t_ref:.3f}"
  if ours.get("rows") and ref.get("rows"):
    r_ours = (ours["rows"]["forward"] + ours["rows"]["gradient"]) / units_ours
    r_ref = (ref["rows"]["forward"] + ref["rows"]["gradient"]) / units_ref
    ratio += f"; rows per point-eps: {r_ours / r_ref:.3f}"
  lines.append(ratio)
  if units_ours != units_ref:
    lines.append(f"(the reference ran {units_ref} point-eps, jaxrobust {units_ours}: in the "
                 "full-cost regime every point and eps runs the whole budget, so the ratios are "
                 "per point-eps; a smaller batch is less efficient on an accelerator)")
  return "\n".join(lines)


def compile_unit(args, variant: str) -> dict[str, Any]:
  """Trace+lower and compile time of the AutoAttack curve with weights/data as arguments or
  closed over (constants)."""
  env = environment()
  epsilons = parse_eps(args.eps)
  print(f"\n=== compile: AutoAttack standard curve, {args.compile_model}, {args.points} points, "
        f"{len(epsilons)} eps, {variant} ===\n{header(env)}", flush=True)
  model = build_model(args.compile_model, args.wrn_bn, args.seed)
  x, y = make_data(model, "float32", "full", args.points, args.seed)
  eps, key = jnp.asarray(epsilons, jnp.float32), jax.random.key(args.seed)
  program = aa_curve_program(jr.attacks.auto_attack("linf"))
  apply, state = model.apply("float32", "full"), model.state["float32"]
  if variant == "args":
    fn, fargs = with_state(program, apply), (state, x, y, eps, key)
  elif variant == "weights":
    fn, fargs = (lambda x, y, eps, key: program(functools.partial(apply, state), x, y, eps,
                                                key)), (x, y, eps, key)
  else:
    fn, fargs = (lambda eps, key: program(functools.partial(apply, state), x, y, eps, key)), \
        (eps, key)
  _, info = compile_program(fn, *fargs)
  print(f"  {variant}: trace+lower {info['trace_lower_s']:.1f} s, XLA compile "
        f"{info['compile_s']:.1f} s, total {info['trace_lower_s'] + info['compile_s']:.1f} s; "
        f"XLA buffers {gib(info.get('xla_bytes'))} GiB; load {load_average():.1f}", flush=True)
  return {"env": env, "model": args.compile_model, "points": args.points, "epsilons": epsilons,
          "variant": variant, "parameters": scale_models.count_parameters(model.module), **info}


def image_stream(model: Model, n: int, batch: int, seed: int, labels: Callable):
  """``(x, y)`` batches of uniform random images, drawn batch by batch (never all of them in host
  memory), labelled by ``labels`` (the clean prediction)."""
  shape = scale_models.image_shape(model.name)
  for start in range(0, n, batch):
    rows = min(batch, n - start)
    x = np.random.default_rng([seed, start]).uniform(size=(rows, *shape)).astype(np.float32)
    yield x, np.asarray(labels(x), np.int32)


def evaluate_unit(args, dtype: str) -> dict[str, Any]:
  """``jr.evaluate`` streaming ``--eval-images`` images through AutoAttack ``--eval-version``
  (random regime): compilations, host memory per image count, throughput, and a checkpointed
  run of the first count stopped after its first batches and resumed to the same report."""
  import resource
  import shutil

  env = environment()
  epsilons = parse_eps(args.eps)
  name = f"aa-{args.eval_version}"
  print(f"\n=== jr.evaluate, AutoAttack {args.eval_version}, {args.eval_model}, batches of "
        f"{args.eval_batch}, eps {[round(e * 255, 3) for e in epsilons]}/255, {dtype} ===\n"
        f"{header(env)}", flush=True)
  model = build_model(args.eval_model, args.wrn_bn, args.seed)
  apply, state = model.apply(dtype, "random"), model.state[dtype]
  graphdef = nnx.split(model.module)[0]
  module = nnx.merge(graphdef, state)  # jr.evaluate passes an NNX module's state as arguments
  compute = DTYPES[dtype]
  logits_fn = module if dtype == "float32" else model_of(module).compute_in(compute)
  predict = jax.jit(lambda state, x: jnp.argmax(apply(state, x), -1))
  labels = lambda x: predict(state, jnp.asarray(x))
  compiles: list[float] = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, secs, **kw: compiles.append(secs)
      if event == "/jax/core/compile/backend_compile_duration" else None)
  options = dict(attacks={name: jr.attacks.auto_attack("linf", version=args.eval_version)},
                 epsilons=np.asarray(epsilons, np.float32), key=jax.random.key(args.seed),
                 batch_size=args.eval_batch, progress=True, mesh=batch_mesh())
  out: dict[str, Any] = {"env": env, "model": args.eval_model, "dtype": dtype,
                         "version": args.eval_version, "batch": args.eval_batch,
                         "epsilons": epsilons, "runs": []}
  reports = {}

  def measure(n: int) -> None:
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    before, start = len(compiles), time.perf_counter()
    report = jr.evaluate(logits_fn, image_stream(model, n, args.eval_batch, args.seed, labels),
                         **options)
    wall = time.perf_counter() - start
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    reports[n] = report
    run = {"images": n, "wall_s": wall, "images_per_s": n / wall,
           "compiles": len(compiles) - before,
           "compile_s": float(sum(compiles[before:])),
           "largest_compile_s": float(max(compiles[before:], default=0.0)),
           "max_rss_gib_before": rss_before,
           "max_rss_gib_after": rss_after,
           "robust_accuracy": [float(a) for a in report.attacks[name].robust_accuracy]}
    out["runs"].append(run)
    save_partial(out)
    # The largest is the step's program; one more is this benchmark's labelling forward pass
    # (`predict`, run by the stream), the rest small eager operations of the report's
    # Clopper-Pearson intervals (compiled once per table size in a process).
    print(f"  {n} images: {wall:.1f} s ({n / wall:.1f} images/s), {run['compiles']} XLA "
          f"compilations ({run['compile_s']:.1f} s, the largest {run['largest_compile_s']:.1f} s)"
          f", process max RSS {rss_before:.2f} -> "
          f"{rss_after:.2f} GiB, robust accuracy {run['robust_accuracy']}", flush=True)

  def resume_check(n: int, batches: int) -> None:
    """Checkpoints a run of ``n`` images, stops it after half its batches and resumes it: the
    resumed report must equal the uninterrupted one."""
    stop = batches // 2
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="bench_scale_ckpt_"))
    path = workdir / "eval.ckpt"

    def interrupted():
      for i, batch in enumerate(image_stream(model, n, args.eval_batch, args.seed, labels)):
        if i == stop:
          raise KeyboardInterrupt(f"stopped after {stop} batches")
        yield batch

    try:
      jr.evaluate(logits_fn, interrupted(), checkpoint=path, **options)
    except KeyboardInterrupt:
      pass
    before, start = len(compiles), time.perf_counter()
    resumed = jr.evaluate(logits_fn, image_stream(model, n, args.eval_batch, args.seed, labels),
                          checkpoint=path, **options)
    same = (resumed.attacks[name].robust_count.tolist()
            == reports[n].attacks[name].robust_count.tolist()
            and resumed.clean_correct == reports[n].clean_correct)
    out["resume"] = {"images": n, "stopped_after_batches": stop, "equal_report": bool(same),
                     "compiles": len(compiles) - before, "wall_s": time.perf_counter() - start}
    save_partial(out)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"  stopped after {stop} of {batches} batches and resumed: report equal to the "
          f"uninterrupted one: {same} ({out['resume']['compiles']} compilations, "
          f"{out['resume']['wall_s']:.1f} s)", flush=True)
    if not same:
      raise AssertionError("the resumed report differs from the uninterrupted one")

  # The first count, then the resume check on it, then the larger counts: a unit cut off by its
  # time limit during the longest run keeps the resume check.
  n = args.eval_images[0]
  measure(n)
  batches = -(-n // args.eval_batch)
  if batches >= 2:
    resume_check(n, batches)
  else:  # nothing to stop between: the check would compare a finished run with itself
    out["resume"] = {"images": n, "skipped": "one batch"}
    print(f"  resume check skipped: {n} images are one batch of {args.eval_batch}", flush=True)
  for n in args.eval_images[1:]:
    measure(n)
  return out


def parse_chunks(values: list[str]) -> list[int | None]:
  """``--crown-chunks`` values: ``all`` (every example in one pass) or a positive int."""
  return [None if v == "all" else int(v) for v in values]


def certify_bounds_unit(args) -> dict[str, Any]:
  """IBP on ``--ibp-model`` and CROWN-IBP on ``--crown-model`` at ``--cert-points`` points, one
  program per setting, the state and the data arguments; checked sound on sampled points."""
  env = environment()
  eps = parse_eps([args.cert_eps])[0]
  print(f"\n=== certification bounds: IBP on {args.ibp_model}, CROWN-IBP on {args.crown_model}, "
        f"{args.cert_points} points, Linf eps {eps * 255:.3g}/255, float32 ===\n{header(env)}",
        flush=True)
  out: dict[str, Any] = {"env": env, "eps": eps, "points": args.cert_points, "results": []}
  key = jax.random.key(args.seed + 1)

  def box(x, eps):
    return jnp.clip(x - eps, 0.0, 1.0), jnp.clip(x + eps, 0.0, 1.0)

  def sampled_logits(apply, state, x, eps, key):
    """Logits ``[9, B, C]`` at the clean points and 8 uniform draws of the box each."""
    lower, upper = box(x, eps)
    draws = jax.random.uniform(key, (8, *x.shape), minval=lower, maxval=upper)
    return jax.vmap(functools.partial(apply, state))(jnp.concatenate([x[None], draws]))

  def sampled_margins(apply, state, x, y, eps, key):
    """Margins ``z_y - z_j`` of :func:`sampled_logits`, ``[9, B, C]``."""
    z = sampled_logits(apply, state, x, eps, key)
    return jnp.take_along_axis(z, y[None, :, None], axis=2) - z

  def bench(label: str, model_name: str, program: Callable, model: Model, x, y,
            extra: dict[str, Any]) -> np.ndarray:
    state, eps_arg = model.state["float32"], jnp.float32(eps)
    compiled, info = compile_program(program, state, x, y, eps_arg)
    load_before = load_average()
    bounds, times = time_program(compiled, (state, x, y, eps_arg), args.repeats)
    row = {"what": label, "model": model_name, "time_s": min(times), "times_s": times,
           "peak_bytes": jax_peak(), "load_average": [load_before, load_average()], **extra,
           **info}
    out["results"].append(row)
    save_partial(out)
    print(f"  {label:<34} {min(times):8.3f} s ({1e3 * min(times) / len(x):.1f} ms per point), "
          f"compile {info['compile_s']:.1f} s, XLA buffers {gib(info.get('xla_bytes'))} GiB "
          f"(temporaries {gib(info.get('xla_temp_bytes'))}), peak {gib(row['peak_bytes'])} GiB",
          flush=True)
    return np.asarray(bounds)

  # IBP of the logits: the interval must contain the logits of every sampled point of the box.
  model = build_model(args.ibp_model, args.wrn_bn, args.seed)
  apply = model.apply("float32", "random")
  x, y = make_data(model, "float32", "random", args.cert_points, args.seed)

  def ibp(state, x, y, eps):
    del y
    return jnp.stack(jr.certify.interval_bounds(functools.partial(apply, state), *box(x, eps)))

  lower_upper = bench("IBP logit bounds", args.ibp_model, ibp, model, x, y, {})
  logits = np.asarray(jax.jit(functools.partial(sampled_logits, apply))(
      model.state["float32"], x, jnp.float32(eps), key))
  slack = 1e-4 * (1 + np.abs(logits))
  if not (np.all(logits >= lower_upper[0] - slack) and np.all(logits <= lower_upper[1] + slack)):
    raise AssertionError("IBP's interval misses a sampled point's logits")
  out["ibp_mean_width"] = float(np.mean(lower_upper[1] - lower_upper[0]))
  print(f"  IBP intervals contain the logits of the clean points and 8 draws each; mean width "
        f"{out['ibp_mean_width']:.3g}", flush=True)

  # CROWN-IBP margin bounds with the memory knob: the same bounds at every setting.
  if args.crown_model != args.ibp_model:  # else the same model and data
    del model
    model = build_model(args.crown_model, args.wrn_bn, args.seed)
    apply = model.apply("float32", "random")
    x, y = make_data(model, "float32", "random", args.cert_points, args.seed)
  margins = np.asarray(jax.jit(functools.partial(sampled_margins, apply))(
      model.state["float32"], x, y, jnp.float32(eps), key))
  other = np.arange(model.num_classes)[None, :] != np.asarray(y)[:, None]
  found = {}
  for method in ("ibp", "crown-ibp"):
    for chunk in ([None] if method == "ibp" else parse_chunks(args.crown_chunks)):
      def program(state, x, y, eps, method=method, chunk=chunk):
        return jr.certify.margin_bounds(functools.partial(apply, state), y, *box(x, eps),
                                        method=method, examples_per_pass=chunk)

      label = f"{method} margins, {'all' if chunk is None else chunk} per pass"
      bound = bench(label, args.crown_model, program, model, x, y,
                    {"method": method, "examples_per_pass": chunk})
      if not np.all(np.where(other[None], margins >= bound[None] - 1e-4 * (1 + np.abs(margins)),
                             True)):
        raise AssertionError(f"{label}: a margin bound above a sampled margin")
      found[label] = bound
  crown = [b for label, b in found.items() if label.startswith("crown-ibp")]
  for b in crown[1:]:
    np.testing.assert_allclose(b, crown[0], rtol=1e-4, atol=1e-4)
  # The label's own entries are +inf on both sides: compared as 0.
  ibp_bound = np.where(other, found["ibp margins, all per pass"], 0.0)
  crown_bound = np.where(other, crown[0], 0.0)
  if not np.all(crown_bound >= ibp_bound - 1e-4 * (1 + np.abs(ibp_bound))):
    raise AssertionError("CROWN-IBP looser than IBP")
  certified = lambda b: int(np.sum(np.all(np.where(other, b > 0, True), axis=1)))  # noqa: E731
  out["certified"] = {"ibp": certified(ibp_bound), "crown-ibp": certified(crown_bound)}
  out["crown_ibp_gap_to_ibp"] = float(np.sum(crown_bound - ibp_bound) / np.sum(other))
  print(f"  every bound below the sampled margins; CROWN-IBP equal at every examples_per_pass and "
        f"never looser than IBP (mean gain {out['crown_ibp_gap_to_ibp']:.3g}); certified "
        f"{out['certified']} of {args.cert_points}", flush=True)
  return out


def certify_smoothing_unit(args) -> dict[str, Any]:
  """``jr.certify.smoothing`` against ``bench_certify``'s PyTorch port of CERTIFY on the same
  weights (``--smoothing-model``, ``--smoothing-points`` images, one program for all of them)."""
  from bench_certify import TorchCertify

  env = environment()
  print(f"\n=== randomized smoothing: {args.smoothing_model}, {args.smoothing_points} images, "
        f"sigma {args.sigma}, n0 {args.n0}, n {args.n}, alpha {args.alpha}, batch "
        f"{args.smoothing_batch} ===\n{header(env)}", flush=True)
  model = build_model(args.smoothing_model, args.wrn_bn, args.seed)
  apply = model.apply("float32", "random")
  x, y = make_data(model, "float32", "random", args.smoothing_points, args.seed)
  keys = jax.random.split(jax.random.key(args.seed + 2), args.smoothing_points)

  def program(state, x, keys, sigma, alpha):
    return jr.certify.smoothing(functools.partial(apply, state), x, keys, sigma=sigma,
                                n0=args.n0, n=args.n, alpha=alpha,
                                batch_size=args.smoothing_batch)

  split, call = split_over_devices(program, model.state["float32"], (x, True), (keys, True),
                                   (jnp.float32(args.sigma), False),
                                   (jnp.float32(args.alpha), False))
  compiled, info = compile_program(split, *call)
  load_before = load_average()
  certificate, times = time_program(compiled, call, args.repeats)
  jax_load = [load_before, load_average()]
  ours = {"time_s": min(times), "times_s": times, "peak_bytes": jax_peak(),
          "load_average": jax_load, "prediction": np.asarray(certificate.prediction).tolist(),
          "radius": np.asarray(certificate.radius).tolist(), **info}
  print(f"  jaxrobust: {min(times):.2f} s (+ compile {info['compile_s']:.1f} s), peak "
        f"{gib(ours['peak_bytes'])} GiB, load {jax_load[0]:.1f}->{jax_load[1]:.1f}", flush=True)
  out: dict[str, Any] = {"env": env, "model": args.smoothing_model,
                         "points": args.smoothing_points, "sigma": args.sigma, "n0": args.n0,
                         "n": args.n, "alpha": args.alpha, "batch": args.smoothing_batch,
                         "jaxrobust": ours}
  save_partial(out)
  torch = torch_module()
  if torch is None:
    print("  PyTorch port skipped: torch not installed")
    return out
  device = torch_device()
  mirror, rel = check_mirror(model, args.seed, device)
  net = torch_model(mirror, "float32", "random", device)
  torch.manual_seed(args.seed)
  port = TorchCertify(net, model.num_classes, args.sigma, args.smoothing_batch)
  xt = torch.from_numpy(scale_models.nchw(np.asarray(x))).to(device)
  load_before = load_average()
  start = time.perf_counter()
  theirs = [port.certify(xt[i:i + 1], args.n0, args.n, args.alpha)
            for i in range(args.smoothing_points)]
  torch_sync(device)
  seconds = time.perf_counter() - start
  out["torch_port"] = {"time_s": seconds, "evaluations": port.evaluations,
                       "load_average": [load_before, load_average()], "mirror_rel_diff": rel,
                       "prediction": [c for c, _ in theirs], "radius": [r for _, r in theirs]}
  same = float(np.mean(np.asarray(out["torch_port"]["prediction"])
                       == np.asarray(ours["prediction"])))
  out["same_prediction"] = same
  out["ratio"] = ours["time_s"] / seconds
  print(f"  PyTorch port (one image at a time, {port.evaluations} rows): {seconds:.2f} s; "
        f"jaxrobust / port {out['ratio']:.3f}; same class or both abstain on {same:.2f} of the "
        f"images; mean radius {np.mean(ours['radius']):.3f} vs "
        f"{np.mean(out['torch_port']['radius']):.3f}", flush=True)
  return out


# ------------------------------------------------------------------------------------------------
# Orchestration: each unit (a section and dtype, an AutoAttack side, a compile variant) runs in
# its own subprocess, so its JAX peak memory is its own and a unit over --section-timeout is
# killed without losing the others.


def unit_list(args) -> list[dict[str, str]]:
  units = []
  for section in args.sections:
    if section in ("pgd", "resnet"):
      units += [{"section": section, "dtype": d}
                for d in (args.dtypes if section == "pgd" else args.resnet_dtypes)]
    elif section == "evaluate":
      units += [{"section": "evaluate", "dtype": d} for d in args.aa_dtypes]
    elif section == "certify":
      units += [{"section": "certify", "dtype": "float32", "side": side}
                for side in args.certify_units]
    elif section == "aa":
      for d in args.aa_dtypes:
        units += [{"section": "aa", "dtype": d, "side": "jaxrobust"},
                  {"section": "aa", "dtype": d, "side": "reference"}]
    else:
      variants = COMPILE_VARIANTS if args.constants else COMPILE_VARIANTS[:1]
      units += [{"section": "compile", "dtype": "float32", "variant": v} for v in variants]
  # float32 first: when --budget runs out, the bfloat16 units are the ones left out.
  return sorted(units, key=lambda unit: unit["dtype"] != "float32")


def unit_name(unit: dict[str, str]) -> str:
  return "/".join(unit[k] for k in ("section", "dtype", "side", "variant") if k in unit)


def run_unit(args, unit: dict[str, str]) -> dict[str, Any]:
  section, dtype = unit["section"], unit["dtype"]
  jax.devices()  # JAX's backend (and its CUDA libraries) first, then torch's
  torch = torch_module()
  if torch is not None and torch_device() == "cpu":
    torch.set_num_threads(args.torch_threads or os.cpu_count() or 1)
  if section == "pgd":
    return pgd_unit(args, args.model, args.batch, args.steps, dtype, args.norms, args.programs)
  if section == "resnet":
    return pgd_unit(args, args.resnet_model, args.resnet_batch, args.resnet_steps, dtype,
                    args.resnet_norms, args.resnet_programs)
  if section == "evaluate":
    return evaluate_unit(args, dtype)
  if section == "certify":
    return (certify_bounds_unit if unit["side"] == "bounds" else certify_smoothing_unit)(args)
  if section == "aa":
    return (aa_jax_unit if unit["side"] == "jaxrobust" else aa_reference_unit)(args, dtype)
  return compile_unit(args, unit["variant"])


def run_isolated(args, unit: dict[str, str], timeout: float, workdir: pathlib.Path
                 ) -> dict[str, Any]:
  spec = workdir / f"{unit_name(unit).replace('/', '_')}.json"
  spec.write_text(json.dumps({"args": vars(args) | {"out": None}, "unit": unit}))
  result = workdir / (spec.stem + "_out.json")
  start = time.perf_counter()
  try:
    proc = subprocess.run([sys.executable, __file__, "--worker", str(spec), str(result)],
                          timeout=timeout, check=False)
    returncode = proc.returncode
  except subprocess.TimeoutExpired:
    print(f"\n!!! {unit_name(unit)} killed after {timeout:.0f} s (--section-timeout)", flush=True)
    partial = json.loads(result.read_text()) if result.exists() else {}
    return {"unit": unit, **partial, "timed_out": True, "limit_s": timeout,
            "wall_s": time.perf_counter() - start}
  out = json.loads(result.read_text()) if result.exists() else {}
  return {"unit": unit, "returncode": returncode, "wall_s": time.perf_counter() - start, **out}


def summary(report: dict[str, Any]) -> str:
  units = report["units"]
  lines = ["\n=== summary ===", "| unit | wall s | key figures |", "|---|---|---|"]
  aa = {}
  for u in units:
    name, section = unit_name(u["unit"]), u["unit"]["section"]
    status = ("killed after {:.0f} s; ".format(u["limit_s"]) if u.get("timed_out") else
              f"failed (exit {u['returncode']}); " if u.get("returncode") else "")
    figure = ""
    if u.get("budget_skipped"):
      status = "skipped: --budget spent"
    elif section in ("pgd", "resnet"):
      figure = "; ".join(f"{r['program']} {r['regime']} {r['norm']} {r['time_s']:.3f} s"
                         + (f" (compile {r['compile_s']:.1f})" if "compile_s" in r else "")
                         for r in u.get("results", []))
    elif section == "aa":
      if "time_s" in u:  # a killed reference keeps the eps it finished
        aa.setdefault(u["unit"]["dtype"], {})[u["unit"]["side"]] = u
      figure = (u["skipped"] if "skipped" in u else
                f"{u['points']} points x {len(u['epsilons'])} eps: {u['time_s']:.1f} s"
                if "time_s" in u else
                f"compile {u['compile_s']:.1f} s" if "compile_s" in u else "")
    elif section == "evaluate":
      figure = "; ".join(f"{r['images']} images {r['wall_s']:.1f} s, {r['compiles']} compiles, "
                         f"max RSS {r['max_rss_gib_after']:.2f} GiB" for r in u.get("runs", []))
      if "resume" in u:
        figure += (f"; resumed report equal: {u['resume']['equal_report']}"
                   if "equal_report" in u["resume"] else "; resume check skipped (one batch)")
    elif section == "certify":
      figure = "; ".join(f"{r['what']} {r['time_s']:.3f} s, XLA buffers {gib(r.get('xla_bytes'))} "
                         "GiB" for r in u.get("results", []))
      if "jaxrobust" in u:
        figure = f"jaxrobust {u['jaxrobust']['time_s']:.2f} s"
        if "torch_port" in u:
          figure += (f", PyTorch port {u['torch_port']['time_s']:.2f} s (ratio "
                     f"{u['ratio']:.3f})")
    elif "compile_s" in u:
      figure = (f"trace+lower {u['trace_lower_s']:.1f} s + XLA {u['compile_s']:.1f} s = "
                f"{u['trace_lower_s'] + u['compile_s']:.1f} s")
    figure = status + figure
    lines.append(f"| {name} | {u.get('wall_s', 0):.0f} | {figure} |")
  for dtype, sides in aa.items():
    if "jaxrobust" in sides and "reference" in sides:
      lines.append(aa_summary(sides["jaxrobust"], sides["reference"]))
  return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  preset = parser.add_mutually_exclusive_group()
  preset.add_argument("--small", dest="preset", action="store_const", const="small",
                      help="2 CPU cores, a few minutes (the default sizes)")
  preset.add_argument("--device-preset", dest="preset", action="store_const", const="device",
                      help="an H100/H200: WRN-28-10 at batch 512, ResNet-50 at 128, AutoAttack "
                           "on WRN-16-4 with 128 points; each unit under 150 s")
  parser.add_argument("--sections", nargs="+", choices=SECTIONS)
  parser.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES))
  parser.add_argument("--aa-dtypes", nargs="+", choices=tuple(DTYPES))
  parser.add_argument("--norms", nargs="+", choices=("linf", "l2"))
  parser.add_argument("--model", help="pgd section: wrn-DEPTH-WIDTH")
  parser.add_argument("--batch", type=int)
  parser.add_argument("--steps", type=int)
  parser.add_argument("--programs", nargs="+", choices=PROGRAMS,
                      help="jaxrobust PGD programs of the pgd section")
  parser.add_argument("--resnet-model")
  parser.add_argument("--resnet-batch", type=int)
  parser.add_argument("--resnet-steps", type=int)
  parser.add_argument("--resnet-programs", nargs="+", choices=PROGRAMS)
  parser.add_argument("--resnet-dtypes", nargs="+", choices=tuple(DTYPES))
  parser.add_argument("--resnet-norms", nargs="+", choices=("linf", "l2"))
  parser.add_argument("--aa-model")
  parser.add_argument("--compile-model")
  parser.add_argument("--eval-model", help="evaluate section: the model")
  parser.add_argument("--eval-images", type=int, nargs="+",
                      help="evaluate section: image counts, one jr.evaluate run each")
  parser.add_argument("--eval-batch", type=int, help="evaluate section: batch size")
  parser.add_argument("--eval-version", choices=("fast", "standard"), default="fast",
                      help="evaluate section: the AutoAttack version")
  parser.add_argument("--points", type=int, help="AutoAttack (and compile) points")
  parser.add_argument("--ibp-model", help="certify section: the model IBP bounds")
  parser.add_argument("--crown-model", help="certify section: the model CROWN-IBP bounds")
  parser.add_argument("--cert-points", type=int, help="certify section: points bounded")
  parser.add_argument("--cert-eps", help="certify section: Linf radius of the box, e.g. 1/255")
  parser.add_argument("--crown-chunks", nargs="+",
                      help="certify section: examples_per_pass values ('all' or ints)")
  parser.add_argument("--certify-units", nargs="+", choices=("bounds", "smoothing"),
                      default=["bounds", "smoothing"],
                      help="certify section: which of its units run (default both)")
  parser.add_argument("--smoothing-model", help="certify section: randomized smoothing's model")
  parser.add_argument("--smoothing-points", type=int, help="certify section: smoothed images")
  parser.add_argument("--sigma", type=float, help="certify section: smoothing noise")
  parser.add_argument("--n0", type=int, help="certify section: selection draws")
  parser.add_argument("--n", type=int, help="certify section: estimation draws")
  parser.add_argument("--alpha", type=float, help="certify section: failure probability")
  parser.add_argument("--smoothing-batch", type=int,
                      help="certify section: draws per model call (both sides)")
  parser.add_argument("--eps", nargs="+", help="AutoAttack Linf radii, e.g. 0.5/255 2/255")
  parser.add_argument("--reference-points", type=int,
                      help="points for the reference AutoAttack (default --points)")
  parser.add_argument("--reference-eps", type=int,
                      help="run the reference on the largest N eps only (default all)")
  parser.add_argument("--eps-linf", type=float, default=8 / 255)
  parser.add_argument("--eps-l2", type=float, default=0.5)
  parser.add_argument("--wrn-bn", action="store_true",
                      help="WideResNets with BatchNorm (eval mode, calibrated statistics); "
                           "default none, as the issue's H200 run")
  constants = parser.add_mutually_exclusive_group()
  constants.add_argument("--constants", dest="constants", action="store_true", default=None,
                         help="compile section: also weights / weights+data closed over")
  constants.add_argument("--no-constants", dest="constants", action="store_false")
  parser.add_argument("--repeats", type=int)
  parser.add_argument("--aa-repeats", type=int)
  parser.add_argument("--rows", choices=("all", "cheap", "none"),
                      help="all: count rows everywhere; cheap: skip the counts that need the "
                           "real model (early exit on the random regime)")
  parser.add_argument("--check-rows", action="store_true",
                      help="also count rows on the real model where the stand-in is used, "
                           "and assert they are equal")
  parser.add_argument("--autoattack-path", default=os.environ.get("AUTOATTACK_PATH"))
  parser.add_argument("--torch-threads", type=int,
                      help="torch.set_num_threads on a CPU (default: the core count)")
  parser.add_argument("--cpu-devices", type=int, default=os.cpu_count() or 1,
                      help="on a CPU backend, JAX devices (jax_num_cpu_devices): the pgd, "
                           "resnet, aa and smoothing programs of jaxrobust run data-parallel over them "
                           "(shard_map over the batch), as jr.evaluate(mesh=...) does; ignored "
                           "on an accelerator (default: the core count)")
  parser.add_argument("--section-timeout", type=float,
                      help="seconds after which a unit's subprocess is killed")
  parser.add_argument("--budget", type=float,
                      help="seconds for all units; a unit starts only with 30 s left")
  parser.add_argument("--no-isolate", dest="isolate", action="store_false",
                      help="run every unit in this process (peak memory then cumulative)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", type=pathlib.Path)
  args = parser.parse_args(argv)
  args.preset = args.preset or "small"
  for key, value in PRESETS[args.preset].items():
    if getattr(args, key, None) is None:
      setattr(args, key, value)
  return args


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ["--worker"]:
    spec = json.loads(pathlib.Path(argv[1]).read_text())
    args = argparse.Namespace(**spec["args"])
    PARTIAL.append(pathlib.Path(argv[2]))
    use_cpu_devices(args.cpu_devices)
    result = run_unit(args, spec["unit"])
    pathlib.Path(argv[2]).write_text(json.dumps(result, default=str))
    return 0
  args = parse_args(argv)
  if not args.isolate:
    use_cpu_devices(args.cpu_devices)
  # A SIGTERM raises SystemExit, so subprocess.run kills the running unit on the way out.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  report: dict[str, Any] = {
    "command": "python " + " ".join([sys.argv[0]] + argv),
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "preset": args.preset, "args": {k: v for k, v in vars(args).items() if k != "out"},
    "load_average_start": load_average(), "units": []}
  print(f"bench_scale: preset {args.preset}; units "
        f"{[unit_name(u) for u in unit_list(args)]}; load {load_average():.2f}", flush=True)
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    for unit in unit_list(args):
      left = args.budget - (time.perf_counter() - start)
      if left < 30:
        print(f"\n!!! {unit_name(unit)} skipped: {left:.0f} s left of --budget {args.budget:.0f}")
        report["units"].append({"unit": unit, "budget_skipped": True})
        continue
      if args.isolate:
        result = run_isolated(args, unit, min(args.section_timeout, left), pathlib.Path(tmp))
      else:
        begin = time.perf_counter()
        result = {"unit": unit, **run_unit(args, unit), "wall_s": time.perf_counter() - begin}
      report["units"].append(result)
      if args.out is not None:  # after every unit: a later kill keeps what was measured
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
  report["wall_s"] = time.perf_counter() - start
  report["load_average_end"] = load_average()
  print(summary(report))
  print(f"\ntotal {report['wall_s']:.0f} s; load {report['load_average_start']:.2f} -> "
        f"{report['load_average_end']:.2f}")
  if args.out is not None:
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
  failed = [u for u in report["units"] if u.get("returncode") or u.get("timed_out")]
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
