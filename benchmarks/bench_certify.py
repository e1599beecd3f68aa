#!/usr/bin/env python
"""Side-by-side benchmark: certification in jaxrobust against PyTorch references (issue 13).

Two parts, both on the digits models with identical weights on both sides (the PyTorch ports of
``bench_peers.py``, whose logits are checked against JAX's to ``PORT_TOLERANCE`` first):

1. Randomized smoothing. ``jr.certify.smoothing`` (one jitted program for all examples) against
   this script's own straight PyTorch port of Cohen, Rosenfeld & Kolter (2019)'s CERTIFY: a
   Python loop over the examples, and per example over batches of noisy copies; the class is
   selected from ``n0`` draws, its probability bounded from ``n`` fresh draws by the one-sided
   Clopper--Pearson lower bound ``p_A = Beta.ppf(alpha; n_A, n - n_A + 1)`` (SciPy), abstain
   when ``p_A < 1/2``, else radius ``sigma * Phi^-1(p_A)``. Printed: certified accuracy
   ``1/N sum 1[g(x_i) = y_i and R_i >= r]`` at each radius for both, their difference in units
   of its Monte-Carlo standard error, wall times and their ratio, and model evaluations.

   The Monte-Carlo standard error of the difference of two independent runs is estimated from
   the paired per-example flags, ``se = sqrt(sum_i (a_i - b_i)^2) / N`` (under the hypothesis
   that both compute the same random certificate, ``E[a_i - b_i] = 0`` and
   ``Var(sum_i (a_i - b_i)) = sum_i E[(a_i - b_i)^2]``). A second, finer check compares the
   estimates themselves: where both certify the same class, the hit counts ``n_A`` are recovered
   from the radii (``Phi(R / sigma)`` is the Clopper--Pearson bound of exactly one count), and
   ``z_i = (n_A - n_A') / sqrt(2 n p (1 - p))`` of two independent runs should be standard
   normal (mean ``z^2`` near 1). ``--torch-budget`` stops the port after so many seconds; both
   sides are then compared on the images it finished (jaxrobust re-runs on exactly those).

2. Bounds. IBP (``jr.certify.interval_bounds``) and CROWN (``jr.certify.linear_bounds``) on the
   logits, and both ``jr.certify.margin_bounds`` methods on the margins ``z_y - z_j``, over the
   Linf box ``[x - eps, x + eps]`` intersected with ``[0, 1]``: time per example (jitted, compile
   apart), mean logit bound width, mean margin lower bound and the verified fraction. Compared
   against an independent float64 NumPy IBP on the same weights (written here), and, when it
   can be imported (``--auto-lirpa-path``), auto_LiRPA's ``IBP`` and ``CROWN`` on the PyTorch
   port: max |difference| of the lower bounds, and which side is tighter. (PyPI's auto_LiRPA,
   0.2/0.3, pins ``torch<1.13`` and fails on NumPy 2; the GitHub source tree, 0.7.x, imports
   on torch 2.13 with ``appdirs`` and ``graphviz`` beside it: point ``--auto-lirpa-path`` at
   both directories. Without it the comparison is skipped with a note.)

Usage::

  python benchmarks/bench_certify.py --quick            # ~1 minute smoke run
  python benchmarks/bench_certify.py --torch-budget 200 --auto-lirpa-path /tmp/auto_lirpa_src

Timings depend on the load: PyTorch's threads slow down many times over when other jobs
oversubscribe the cores, XLA far less (see RESULTS.md); the 1-min load average is printed
beside every timing. ``torch.set_num_threads(--torch-threads)`` (default 2).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import pathlib
import sys
import time
from typing import Any, Callable

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from scipy import stats  # noqa: E402

import jaxrobust as jr  # noqa: E402
from bench_peers import (ARCHS, PORT_TOLERANCE, load_examples, load_frozen_params,  # noqa: E402
                         nchw, params_digest, torch_logits, torch_mlp_port, torch_port,
                         train_mlp)

RADII = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Radii (L2) at which certified accuracy is reported."""


def load_average() -> float:
  return round(os.getloadavg()[0], 2)


def get_model(arch: str, kind: str) -> tuple[Any, Callable, Any]:
  """``(params, jax logits_fn, torch module)`` of the same network.

  ``cnn``: the demo SmallCNN from the frozen ``benchmarks/reference`` weights; ``mlp``: the
  64-128-64-10 ``DigitsMLP`` of ``bench_peers.py`` trained there with a fixed seed (seconds).
  """
  params = load_frozen_params(kind) if arch == "cnn" else train_mlp(kind == "adversarial")
  port = torch_port(params) if arch == "cnn" else torch_mlp_port(params)
  return params, functools.partial(ARCHS[arch]().apply, params), port


def check_port(logits_fn: Callable, port: Any, x: np.ndarray) -> float:
  """Largest |torch - JAX| logit on ``x`` (and a noisy copy); raises beyond PORT_TOLERANCE."""
  noisy = x + 0.25 * np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
  worst = 0.0
  for batch in (x, noisy):
    reference = np.asarray(jax.jit(logits_fn)(jnp.asarray(batch)))
    worst = max(worst, float(np.max(np.abs(torch_logits(port, nchw(batch)) - reference))))
  if worst > PORT_TOLERANCE:
    raise SystemExit(f"the PyTorch port disagrees with JAX: max |dlogits| = {worst:.2e}")
  return worst


# ------------------------------------------------------------------------------------------------
# Part 1: randomized smoothing.


class TorchCertify:
  """A straight PyTorch port of Cohen et al.'s CERTIFY, one example at a time.

  Each example draws ``n0`` selection copies and then ``n`` estimation copies, ``batch_size``
  at a time: ``x`` repeated, plus ``sigma * randn``, through the model, arg-max, class counts.
  ``evaluations`` counts the rows that went through the model.
  """

  def __init__(self, model: Any, num_classes: int, sigma: float, batch_size: int):
    self.model, self.num_classes, self.sigma = model, num_classes, sigma
    self.batch_size = batch_size
    self.evaluations = 0

  def counts(self, x, num: int) -> np.ndarray:
    import torch

    counts = np.zeros(self.num_classes, np.int64)
    with torch.no_grad():
      remaining = num
      while remaining > 0:
        size = min(self.batch_size, remaining)
        remaining -= size
        copies = x.repeat(size, 1, 1, 1)
        labels = self.model(copies + self.sigma * torch.randn_like(copies)).argmax(1)
        counts += np.bincount(labels.cpu().numpy(), minlength=self.num_classes)
        self.evaluations += size
    return counts

  def certify(self, x, n0: int, n: int, alpha: float) -> tuple[int, float]:
    """``(class, radius)`` or ``(-1, 0.0)`` for one example ``x [1, C, H, W]``."""
    selected = int(np.argmax(self.counts(x, n0)))
    hits = int(self.counts(x, n)[selected])
    # One-sided Clopper-Pearson lower bound at level 1 - alpha (0 when there is no hit).
    p_lower = float(stats.beta.ppf(alpha, hits, n - hits + 1)) if hits > 0 else 0.0
    if p_lower < 0.5:
      return -1, 0.0
    return selected, self.sigma * float(stats.norm.ppf(p_lower))


def recover_hits(radius: np.ndarray, sigma: float, n: int, alpha: float) -> np.ndarray:
  """The hit counts ``n_A`` behind certified radii: the ``k`` whose Clopper--Pearson bound
  ``Beta.ppf(alpha; k, n - k + 1)`` is nearest ``Phi(R / sigma)`` (the bound grows with ``k``)."""
  target = stats.norm.cdf(np.asarray(radius, np.float64) / sigma)
  bound = lambda k: stats.beta.ppf(alpha, k, n - k + 1)  # noqa: E731
  low, high = np.ones_like(target, np.int64), np.full(target.shape, n, np.int64)
  while np.any(low < high):  # smallest k with bound(k) >= target
    middle = (low + high) // 2
    above = bound(middle) >= target
    high, low = np.where(above, middle, high), np.where(above, low, middle + 1)
  below = np.maximum(low - 1, 1)
  closer = np.abs(bound(below) - target) < np.abs(bound(low) - target)
  return np.where(closer, below, low).astype(np.float64)


def certified_accuracy(prediction: np.ndarray, radius: np.ndarray, y: np.ndarray) -> np.ndarray:
  """``[R, N]`` flags: correct (not abstaining) with radius at least each of ``RADII``."""
  return np.stack([(prediction == y) & (radius >= r) for r in RADII])


def smoothing_part(arch: str, kind: str, images: int, args, report: dict) -> None:
  import torch

  x, y = load_examples(images)
  params, logits_fn, port = get_model(arch, kind)
  port_error = check_port(logits_fn, port, x)
  clean = float(np.mean(np.argmax(np.asarray(jax.jit(logits_fn)(jnp.asarray(x))), -1) == y))
  print(f"\n== smoothing: {arch} {kind} (weights {params_digest(params)}, clean acc {clean:.3f}, "
        f"port max |dlogits| {port_error:.1e}), {images} images, sigma {args.sigma}, "
        f"n0 {args.n0}, n {args.n}, alpha {args.alpha}", flush=True)

  # jaxrobust: one program for all images, per-example keys.
  keys = jax.random.split(jax.random.key(args.seed), images)
  certify = jax.jit(lambda x, keys: jr.certify.smoothing(
      logits_fn, x, keys, sigma=args.sigma, n0=args.n0, n=args.n, alpha=args.alpha,
      batch_size=args.jax_batch_size))

  def run_jax(count: int) -> tuple:
    x_jax, keys_jax = jnp.asarray(x[:count]), keys[:count]
    load_before = load_average()
    start = time.perf_counter()
    compiled = certify.lower(x_jax, keys_jax).compile()
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    certificate = jax.block_until_ready(compiled(x_jax, keys_jax))
    seconds = time.perf_counter() - start
    print(f"jaxrobust, {count} images: {seconds:.1f} s (+ compile {compile_s:.1f} s), load "
          f"{load_before} -> {load_average()}", flush=True)
    return np.asarray(certificate.prediction), np.asarray(certificate.radius), seconds, compile_s

  jax_pred, jax_radius, jax_s, compile_s = run_jax(images)
  select_size, estimate_size = min(args.jax_batch_size, args.n0), min(args.jax_batch_size, args.n)
  jax_evals_per_image = (math.ceil(args.n0 / select_size) * select_size
                         + math.ceil(args.n / estimate_size) * estimate_size)

  # The PyTorch port: a loop over examples, stopped after --torch-budget seconds.
  torch.manual_seed(args.seed)
  reference = TorchCertify(port, 10, args.sigma, args.batch_size)
  x_torch = torch.from_numpy(nchw(x))
  load_before = load_average()
  start = time.perf_counter()
  results = []
  for i in range(images):
    results.append(reference.certify(x_torch[i:i + 1], args.n0, args.n, args.alpha))
    if time.perf_counter() - start > args.torch_budget:
      break
  torch_s = time.perf_counter() - start
  torch_pred = np.array([c for c, _ in results], np.int32)
  torch_radius = np.array([r for _, r in results], np.float32)
  print(f"PyTorch port, {len(results)} images: {torch_s:.1f} s, load {load_before} -> "
        f"{load_average()}", flush=True)
  full = {"images": images, "jaxrobust": certified_accuracy(jax_pred, jax_radius, y).mean(1)}
  if len(results) < images:
    # Compare on the images both ran; jaxrobust re-runs on exactly those (per-example keys: the
    # certificates must be bit for bit those of the full run) for a like-for-like time.
    images = len(results)
    print(f"the port ran out of --torch-budget after {images} images; jaxrobust on all "
          f"{full['images']}: certified accuracy {np.round(full['jaxrobust'], 4).tolist()} "
          f"at radii {list(RADII)}; re-running jaxrobust on the first {images}", flush=True)
    subset_pred, subset_radius, jax_s, compile_s = run_jax(images)
    same = (np.array_equal(subset_pred, jax_pred[:images])
            and np.array_equal(subset_radius, jax_radius[:images]))
    print(f"certificates of the first {images} equal to the full run's: {same}")
    jax_pred, jax_radius, x, y = subset_pred, subset_radius, x[:images], y[:images]
  jax_evals = images * jax_evals_per_image

  jax_flags = certified_accuracy(jax_pred, jax_radius, y)
  torch_flags = certified_accuracy(torch_pred, torch_radius, y)
  difference = jax_flags.mean(1) - torch_flags.mean(1)
  paired_se = np.sqrt(np.sum((jax_flags.astype(float) - torch_flags) ** 2, axis=1)) / images
  in_se = np.where(paired_se > 0, difference / np.where(paired_se > 0, paired_se, 1.0), 0.0)
  print(f"{'radius':>8} {'jaxrobust':>10} {'torch port':>11} {'diff':>8} {'MC se':>7} "
        f"{'diff/se':>8}")
  for k, r in enumerate(RADII):
    print(f"{r:>8.2f} {jax_flags[k].mean():>10.4f} {torch_flags[k].mean():>11.4f} "
          f"{difference[k]:>+8.4f} {paired_se[k]:>7.4f} {in_se[k]:>+8.2f}")

  # Finer check on the estimates, where both certify the same class: the hit counts n_A
  # (recovered from the radii) of two independent runs differ by N(0, 2 n p (1 - p)).
  both = (jax_pred == torch_pred) & (jax_pred >= 0)
  hits_jax = recover_hits(jax_radius[both], args.sigma, args.n, args.alpha)
  hits_torch = recover_hits(torch_radius[both], args.sigma, args.n, args.alpha)
  p_mean = (hits_jax + hits_torch) / (2 * args.n)
  varied = p_mean < 1  # where both runs hit every time there is no spread to test
  z = (hits_jax - hits_torch)[varied] / np.sqrt(2 * args.n * p_mean[varied]
                                                * (1 - p_mean[varied]))
  mean_z2 = float(np.mean(z ** 2)) if z.size else float("nan")
  max_z = float(np.max(np.abs(z))) if z.size else float("nan")
  # The same on the bounds p_A = Phi(R / sigma) themselves, with the spread taken at p_A; where
  # few draws miss, 1 - p_A is well above 1 - n_A / n and this z is smaller (conservative).
  p_jax = stats.norm.cdf(jax_radius[both] / args.sigma)
  p_torch = stats.norm.cdf(torch_radius[both] / args.sigma)
  p_bound = (p_jax + p_torch) / 2
  z_bound = (p_jax - p_torch)[varied] / np.sqrt(2 * p_bound[varied] * (1 - p_bound[varied])
                                                / args.n)
  mean_z2_bound = float(np.mean(z_bound ** 2)) if z.size else float("nan")
  ceiling = float(args.alpha ** (1.0 / args.n))  # p_A's lower bound when all n draws hit
  agree = float(np.mean(jax_pred == torch_pred))
  print(f"same class (or both abstain): {agree:.4f}; both certify the same class: "
        f"{int(both.sum())}, of which {int(varied.sum())} with a miss in either run (all n hit: "
        f"p_A = {ceiling:.6f}, radius {args.sigma * stats.norm.ppf(ceiling):.3f}); z-scores of "
        f"the hit counts: mean z^2 {mean_z2:.2f} (expected 1), max |z| {max_z:.2f}; of the "
        f"p_A bounds (SE at p_A, conservative): mean z^2 {mean_z2_bound:.2f}")
  ratio = jax_s / torch_s
  print(f"time: jaxrobust {jax_s:.1f} s, torch port {torch_s:.1f} s, ratio {ratio:.3f} "
        f"(goal <= 0.5: {'met' if ratio <= 0.5 else 'NOT met'}); per image "
        f"{1e3 * jax_s / images:.1f} / {1e3 * torch_s / images:.1f} ms")
  print(f"model evaluations: jaxrobust {jax_evals} ({jax_evals / images:.0f} per image, by "
        f"construction of the chunked scan), torch port {reference.evaluations} "
        f"({reference.evaluations / images:.0f} per image, counted)")
  report.setdefault("smoothing", []).append({
    "arch": arch, "kind": kind, "weights": params_digest(params), "images": images,
    "clean_accuracy": clean, "port_max_dlogits": port_error, "radii": list(RADII),
    "jaxrobust": jax_flags.mean(1).tolist(), "torch_port": torch_flags.mean(1).tolist(),
    "paired_se": paired_se.tolist(), "diff_in_se": in_se.tolist(), "same_class": agree,
    "z_mean_square": mean_z2, "z_max": max_z, "z_count": int(varied.sum()),
    "z_mean_square_bound_se": mean_z2_bound,
    "certificates": {"y": y.tolist(), "jaxrobust": [jax_pred.tolist(), jax_radius.tolist()],
                     "torch_port": [torch_pred.tolist(), torch_radius.tolist()]},
    "jax_s": jax_s, "jax_compile_s": compile_s, "torch_s": torch_s, "ratio": ratio,
    "jax_evaluations": jax_evals, "torch_evaluations": reference.evaluations,
    "jax_batch_size": args.jax_batch_size, "torch_batch_size": args.batch_size,
    "jaxrobust_all_images": {"images": full["images"], "accuracy": full["jaxrobust"].tolist()},
  })


# ------------------------------------------------------------------------------------------------
# Part 2: IBP and CROWN bounds.


def numpy_ibp(params: Any, arch: str, lower: np.ndarray, upper: np.ndarray) -> tuple:
  """Float64 IBP of the logits, written independently of jaxrobust (NHWC, Flax's weights).

  An affine map ``v -> W v + b`` sends the box ``centre ± radius`` to ``W centre + b ±
  |W| radius``; ReLU is monotone, so it maps the endpoints.
  """
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), jax.device_get(params))["params"]

  def dense(name, centre, radius):
    kernel = p[name]["kernel"]
    return centre @ kernel + p[name]["bias"], radius @ np.abs(kernel)

  def conv(name, centre, radius, stride):
    # SAME padding as XLA: total pad max((out - 1) * stride + k - size, 0), the extra at the end.
    kernel = p[name]["kernel"]  # HWIO
    size, k = centre.shape[1], kernel.shape[0]
    out = -(-size // stride)
    total = max((out - 1) * stride + k - size, 0)
    pad = ((0, 0), (total // 2, total - total // 2), (total // 2, total - total // 2), (0, 0))
    results = []
    for values, weights in ((centre, kernel), (radius, np.abs(kernel))):
      windows = np.lib.stride_tricks.sliding_window_view(np.pad(values, pad), (k, k), (1, 2))
      windows = windows[:, ::stride, ::stride]  # [B, out, out, I, kh, kw]
      results.append(np.einsum("bxyihw,hwio->bxyo", windows, weights))
    return results[0] + p[name]["bias"], results[1]

  def relu(centre, radius):
    lo, hi = np.maximum(centre - radius, 0), np.maximum(centre + radius, 0)
    return (lo + hi) / 2, (hi - lo) / 2

  lower, upper = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
  centre, radius = (lower + upper) / 2, (upper - lower) / 2
  if arch == "cnn":
    centre, radius = relu(*conv("conv1", centre, radius, 1))
    centre, radius = relu(*conv("conv2", centre, radius, 2))
    centre, radius = centre.reshape(len(centre), -1), radius.reshape(len(radius), -1)
    centre, radius = relu(*dense("dense1", centre, radius))
    centre, radius = dense("dense2", centre, radius)
  else:
    centre, radius = centre.reshape(len(centre), -1), radius.reshape(len(radius), -1)
    centre, radius = relu(*dense("dense1", centre, radius))
    centre, radius = relu(*dense("dense2", centre, radius))
    centre, radius = dense("dense3", centre, radius)
  return centre - radius, centre + radius


def import_auto_lirpa(paths: str | None):
  """``(module or None, note)``; ``paths``: ``os.pathsep``-separated directories to import from."""
  for path in reversed((paths or "").split(os.pathsep)):
    if path and path not in sys.path:
      sys.path.insert(0, path)
  try:
    import auto_LiRPA
    return auto_LiRPA, f"auto_LiRPA {auto_LiRPA.__version__}"
  except ImportError as error:
    return None, f"auto_LiRPA not importable ({error}); pass --auto-lirpa-path"


def margin_spec(y: np.ndarray, num_classes: int) -> np.ndarray:
  """``[B, C-1, C]`` rows ``e_y - e_j`` for ``j != y`` (ascending ``j``)."""
  eye = np.eye(num_classes, dtype=np.float32)
  return np.stack([eye[label] - eye[[j for j in range(num_classes) if j != label]]
                   for label in y])


def others(margins: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Drop the label column of ``[B, C]`` margins (``+inf`` there): ``[B, C-1]``."""
  keep = np.arange(margins.shape[1])[None, :] != y[:, None]
  return margins[keep].reshape(len(y), -1)


def best_time(fn, *args, repeats: int) -> tuple[Any, float, float]:
  """``(output, best seconds over repeats, first call seconds incl. compile)``."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  best = math.inf
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return out, best, first


def bounds_part(arch: str, kind: str, images: int, args, lirpa, report: dict) -> None:
  x, y = load_examples(images)
  params, logits_fn, port = get_model(arch, kind)
  check_port(logits_fn, port, x)
  correct = np.argmax(np.asarray(jax.jit(logits_fn)(jnp.asarray(x))), -1) == y
  print(f"\n== bounds: {arch} {kind} (weights {params_digest(params)}), {images} images, "
        f"Linf box [x - eps, x + eps] ∩ [0, 1]; times per example, best of {args.repeats}; "
        f"load {load_average()}", flush=True)
  jitted = {
    "ibp logits": jax.jit(lambda lo, hi, y: jr.certify.interval_bounds(logits_fn, lo, hi)),
    "crown logits": jax.jit(lambda lo, hi, y: jr.certify.linear_bounds(logits_fn, lo, hi)),
    "ibp margins": jax.jit(lambda lo, hi, y: jr.certify.margin_bounds(logits_fn, y, lo, hi,
                                                                      method="ibp")),
    "crown margins": jax.jit(lambda lo, hi, y: jr.certify.margin_bounds(logits_fn, y, lo, hi,
                                                                        method="crown")),
  }
  spec = margin_spec(y, 10)
  lirpa_port = None
  for eps in args.eps:
    lower = np.clip(x - eps, 0.0, 1.0).astype(np.float32)
    upper = np.clip(x + eps, 0.0, 1.0).astype(np.float32)
    args_jax = (jnp.asarray(lower), jnp.asarray(upper), jnp.asarray(y))
    out = {}
    print(f"-- eps {eps}")
    print(f"{'jaxrobust':<16} {'ms/example':>10} {'compile s':>9} {'mean width':>10} "
          f"{'mean margin lb':>14} {'verified':>9}")
    for name, fn in jitted.items():
      value, seconds, first = best_time(fn, *args_jax, repeats=args.repeats)
      out[name] = (seconds, value)
      if name.endswith("logits"):
        lo, hi = map(np.asarray, value)
        summary = f"{np.mean(hi - lo):>10.4f} {'':>14} {'':>9}"
      else:
        margins = others(np.asarray(value), y)
        verified = np.mean(correct & np.all(margins > 0, axis=1))
        summary = f"{'':>10} {np.mean(margins):>14.4f} {verified:>9.3f}"
      compile_s = max(first - seconds, 0.0)
      print(f"{name:<16} {1e3 * seconds / images:>10.3f} {compile_s:>9.1f} {summary}")
    ibp_lo, ibp_hi = map(np.asarray, out["ibp logits"][1])
    crown_lo, crown_hi = map(np.asarray, out["crown logits"][1])
    ibp_margin = others(np.asarray(out["ibp margins"][1]), y)
    crown_margin = others(np.asarray(out["crown margins"][1]), y)
    np_lo, np_hi = numpy_ibp(params, arch, lower, upper)
    start = time.perf_counter()
    numpy_ibp(params, arch, lower, upper)
    numpy_s = time.perf_counter() - start
    numpy_diff = max(float(np.max(np.abs(ibp_lo - np_lo))), float(np.max(np.abs(ibp_hi - np_hi))))
    print(f"numpy float64 IBP ({1e3 * numpy_s / images:.3f} ms/example): max |diff| of IBP logit "
          f"bounds {numpy_diff:.2e}")
    entry = {"arch": arch, "kind": kind, "eps": eps, "images": images,
             "ms_per_example": {k: 1e3 * v[0] / images for k, v in out.items()},
             "ibp_width": float(np.mean(ibp_hi - ibp_lo)),
             "crown_width": float(np.mean(crown_hi - crown_lo)),
             "ibp_margin_mean": float(np.mean(ibp_margin)),
             "crown_margin_mean": float(np.mean(crown_margin)),
             "numpy_ibp_max_diff": numpy_diff}
    if lirpa is not None:
      if lirpa_port is None:
        lirpa_port = lirpa_cnn_port(params) if arch == "cnn" else port
        check_port(logits_fn, lirpa_port, x)
      entry["auto_lirpa"] = compare_auto_lirpa(lirpa, lirpa_port, x, lower, upper, spec, images, {
        "IBP logits": (ibp_lo, None), "CROWN logits": (crown_lo, crown_hi),
        "IBP margins": (ibp_margin, None), "CROWN margins": (crown_margin, None)}, args)
    report.setdefault("bounds", []).append(entry)


def lirpa_cnn_port(params: Any):
  """The SmallCNN port without an explicit ``F.pad`` (which auto_LiRPA's Pad node rejects).

  XLA's SAME padding of the stride-2 3x3 convolution pads one row/column at the bottom/right
  only: ``out[i] = sum_k w[k] x[2i + k]``. A 4x4 kernel ``w'`` with ``w'[k + 1] = w[k]`` and
  ``w'[0] = 0`` under symmetric padding 1 computes ``sum_k' w'[k'] x[2i + k' - 1]``, the same sum.
  """
  import torch
  from torch import nn

  p = jax.device_get(params["params"])
  kernel = np.zeros((4, 4, 16, 32), np.float32)
  kernel[1:, 1:] = np.asarray(p["conv2"]["kernel"], np.float32)

  class Flatten(nn.Module):

    def forward(self, x):
      return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # NHWC order, as Flax

  model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                        nn.Conv2d(16, 32, 4, stride=2, padding=1), nn.ReLU(), Flatten(),
                        nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))
  weights = [np.asarray(p["conv1"]["kernel"], np.float32).transpose(3, 2, 0, 1),
             np.asarray(p["conv1"]["bias"]), kernel.transpose(3, 2, 0, 1),
             np.asarray(p["conv2"]["bias"]), np.asarray(p["dense1"]["kernel"]).T,
             np.asarray(p["dense1"]["bias"]), np.asarray(p["dense2"]["kernel"]).T,
             np.asarray(p["dense2"]["bias"])]
  with torch.no_grad():
    for parameter, value in zip(model.parameters(), weights):
      parameter.copy_(torch.from_numpy(np.array(value, np.float32)))
  return model.eval()


def compare_auto_lirpa(lirpa, port, x, lower, upper, spec, images, ours: dict, args) -> dict:
  """auto_LiRPA's IBP and CROWN on the PyTorch port, against jaxrobust's bounds ``ours``."""
  import torch

  x_t, lo_t, hi_t = (torch.from_numpy(nchw(a)) for a in (x, lower, upper))
  bounded = lirpa.BoundedModule(port, torch.zeros_like(x_t[:1]), verbose=False)
  perturbation = lirpa.PerturbationLpNorm(norm=float("inf"), x_L=lo_t, x_U=hi_t)
  inputs = lirpa.BoundedTensor(x_t, perturbation)
  spec_t = torch.from_numpy(spec)
  results = {}
  print(f"{'auto_LiRPA':<16} {'ms/example':>10} {'max |Δ lb|':>10} {'jr tighter':>10} "
        f"{'jr looser':>9} {'mean lb (theirs)':>16}")
  for name, (our_lower, our_upper) in ours.items():
    method = name.split()[0]
    c = spec_t if name.endswith("margins") else None
    best = math.inf
    for _ in range(max(1, args.repeats)):
      start = time.perf_counter()
      with torch.no_grad():
        lb, ub = bounded.compute_bounds(x=(inputs,), C=c, method=method)
      best = min(best, time.perf_counter() - start)
    lb, ub = lb.numpy().astype(np.float64), ub.numpy().astype(np.float64)
    difference = our_lower - lb
    # float32 rounding of either side: ~1e-6 relative to the size of the terms summed.
    tolerance = 1e-4 * np.maximum(1.0, np.abs(lb))
    tighter, looser = int(np.sum(difference > tolerance)), int(np.sum(difference < -tolerance))
    upper_diff = (float(np.max(np.abs(our_upper - ub))) if our_upper is not None else None)
    extra = "" if upper_diff is None else f"; max |Δ ub| {upper_diff:.2e}"
    print(f"{name:<16} {1e3 * best / images:>10.3f} {np.max(np.abs(difference)):>10.2e} "
          f"{tighter:>10} {looser:>9} {np.mean(lb):>16.4f}{extra}")
    results[name] = {"ms_per_example": 1e3 * best / images,
                     "max_abs_diff_lower": float(np.max(np.abs(difference))),
                     "jr_tighter": tighter, "jr_looser": looser, "entries": int(lb.size),
                     "max_abs_diff_upper": upper_diff}
  return results


# ------------------------------------------------------------------------------------------------


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: n 2000, 32 MLP / 8 CNN smoothing images, 64 bound images")
  parser.add_argument("--kind", choices=["plain", "adversarial"], default="plain")
  parser.add_argument("--smoothing-arch", nargs="*", default=["mlp", "cnn"],
                      choices=["mlp", "cnn"], help="models for part 1 (none: skip it)")
  parser.add_argument("--bounds-arch", nargs="*", default=["mlp", "cnn"],
                      choices=["mlp", "cnn"], help="models for part 2 (none: skip it)")
  parser.add_argument("--images", type=int, default=540, help="MLP smoothing images")
  parser.add_argument("--cnn-images", type=int, default=48,
                      help="CNN smoothing images (the PyTorch CNN port needs seconds per image)")
  parser.add_argument("--bound-images", type=int, default=540, help="MLP bound images")
  parser.add_argument("--cnn-bound-images", type=int, default=200,
                      help="CNN bound images (CROWN takes tens of ms per image on both sides)")
  parser.add_argument("--sigma", type=float, default=0.25)
  parser.add_argument("--n0", type=int, default=100)
  parser.add_argument("--n", type=int, default=100_000)
  parser.add_argument("--alpha", type=float, default=0.001)
  parser.add_argument("--batch-size", type=int, default=1000,
                      help="the PyTorch port's noise batch (Cohen et al.'s default 1000)")
  parser.add_argument("--jax-batch-size", type=int, default=100,
                      help="jr.certify.smoothing's batch_size: draws per example per scan step "
                           "(memory only; the results do not depend on it)")
  parser.add_argument("--eps", type=float, nargs="+", default=[0.01, 0.03])
  parser.add_argument("--repeats", type=int, default=3, help="timed repeats for the bounds")
  parser.add_argument("--auto-lirpa-path", default=None,
                      help="directories (os.pathsep-separated) holding the auto_LiRPA package "
                           "and its pure-Python dependencies, if it is not installed")
  parser.add_argument("--torch-threads", type=int, default=2)
  parser.add_argument("--torch-budget", type=float, default=math.inf,
                      help="seconds after which the PyTorch port stops (both sides are then "
                           "compared on the images it finished)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", type=pathlib.Path, default=None, help="write the figures as JSON")
  args = parser.parse_args(argv)
  if args.quick:
    args.n, args.images, args.cnn_images, args.bound_images = 2000, 32, 8, 64
    args.cnn_bound_images = 32
    args.repeats = 1

  import torch

  torch.set_num_threads(args.torch_threads)
  lirpa, lirpa_note = import_auto_lirpa(args.auto_lirpa_path)
  machine = (f"{os.cpu_count()} cores, jax {jax.__version__} on {jax.default_backend()}, "
             f"torch {torch.__version__} with {torch.get_num_threads()} threads, {lirpa_note}")
  print(f"machine: {machine}; load {load_average()}", flush=True)
  report: dict[str, Any] = {"machine": machine, "command": " ".join(sys.argv)}
  started = time.perf_counter()
  for arch in args.smoothing_arch:
    smoothing_part(arch, args.kind, args.images if arch == "mlp" else args.cnn_images, args,
                   report)
  for arch in args.bounds_arch:
    bounds_part(arch, args.kind, args.bound_images if arch == "mlp" else args.cnn_bound_images,
                args, lirpa, report)
  print(f"\ntotal {time.perf_counter() - started:.0f} s; load {load_average()}")
  if args.out:
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
  main()
