#!/usr/bin/env python
"""AttackBench's optimality (issue #27, item 3): jaxrobust's minimum-norm attacks against peers.

On a local zoo of digits models (every model in JAX and mirrored in PyTorch with identical
weights, the logits checked to agree), the first ``--n`` images of ``benchmarks/reference/
digits_examples.npz`` are attacked without a budget by every minimum-norm attack of jaxrobust and
of the peers, in Linf, L2 and L1. Per model and norm, the per-sample best known distance ``d*_i``
is the smallest distance any attack of the table found (0 for a clean-misclassified sample,
``inf`` if none); each attack's optimality is AttackBench's (``min_norm_metrics.optimality``,
the exact area under the step curve). The "ensembles" are the per-sample best over jaxrobust's
attacks and over the peers' attacks.

Zoo (``--models``):

* ``cnn-plain``, ``cnn-adversarial``, ``mlp-plain``, ``mlp-adversarial``: the four frozen models of
  ``bench_peers.py`` (SmallCNN and DigitsMLP, plain and PGD-AT);
* ``mlp-trades``: DigitsMLP trained with ``jr.training.trades_loss`` (Linf eps 0.2, beta 6,
  10 steps) with ``bench_peers.MLP_TRAINING``'s schedule and seed;
* ``mlp-kwta``: a k-WTA MLP (Xiao et al. 2020): 64-128-64-10 where each hidden layer keeps its
  ``ceil(0.1 * width)`` largest pre-activations and zeroes the rest (no ReLU), trained plainly;
  the activation is piecewise linear with jumps, a gradient-obfuscating model;
* ``mlp-ibp``: DigitsMLP trained with ``jr.training.ibp_loss`` (Gowal et al. 2018), Linf, with
  ``IBP_TRAINING``'s schedule: ``eps = 0`` and ``kappa = 1`` for the warm-up epochs, then both
  ramped linearly per step to ``eps = 0.1`` and ``kappa = 0.5``, held there to the end; the
  other settings (epochs, batch, learning rate, seed) are ``MLP_TRAINING``'s;
* ``mlp-ccat``: a DigitsMLP trained CCAT-style (Stutz, Hein & Schiele 2020; ``ccat_loss``: half
  of each batch clean, half at a PGD point maximising the largest wrong-class probability within
  Linf ``CCAT_TRAINING["eps"]``, trained towards ``lambda * onehot(y) + (1 - lambda) / 10`` with
  ``lambda = (1 - min(1, |delta|_inf / eps))^10``), evaluated through a confidence gate
  (``ccat_gate``): ``z`` where the max softmax is at least ``tau``, else ``100 z``. ``tau`` keeps
  99% of the correct clean test points (CCAT's choice; stored with the weights as ``gate/tau``).
  The gate changes no argmax, so it changes no prediction and no minimum adversarial distance:
  CCAT's rejection cannot be expressed by argmax success, which every peer and AttackBench use;
  instead, the logits jump by 100x where the confidence crosses ``tau`` (measured: it misleads
  loss-value attacks, Square and C&W/EAD, far more than gradient steps). Its port may differ by 100
  times the other new models' tolerance (the gate scales the rounding with the logits).

The four new models are trained on first use (seconds on a CPU) and frozen under
``benchmarks/reference/digits_mlp_{trades,kwta,ibp,ccat}.npz`` (about 70 kB each); ``--retrain``
regenerates them. ``--certify`` prints each model's clean accuracy and IBP-certified accuracy at
``IBP_TRAINING["eps"]`` on the digits test split (``jr.certify.margin_bounds``); ``--diagnose``
prints each model's static gradient-masking diagnosis (``jr.diagnose``), one line per model.

Attacks, each at its defaults unless noted, without a budget:

* jaxrobust, each ``jax.jit``-ed with the weights, inputs, labels and key as arguments (the
  compile time, from ``lower().compile()``, reported apart): Linf ``fmn``, ``fab``,
  ``min_norm_search(apgd)``, ``min_norm_search(pgd)``, ``deepfool``, ``brendel_bethge`` (row
  ``bb``, 1000 steps from its default start), ``min_norm_search(square)`` (gradient-free: 5000
  queries per eps tried); L2 ``ddn``, ``fmn``, ``carlini_wagner_l2``, ``fab``, ``deepfool``,
  ``min_norm_search(apgd)``, ``brendel_bethge``, ``min_norm_search(square)``; L1 ``fmn``,
  ``fab``, ``min_norm_search(apgd)``, ``brendel_bethge``, ``min_norm_search(square)`` (Square's
  L1 form, AutoAttack's L1 Square); in every norm also ``min_norm_search(apgd-t)`` (row
  ``mns(apgd-t)``: AutoAttack's standard APGD-T member, ``apgd(norm, loss="dlr",
  targeted=True)`` with 100 steps and 9 target classes in Linf and L2, 5 in L1 as the standard
  L1 AutoAttack; ``apgd_t``), the search at ``min_norm_search``'s defaults; in Linf and L2
  also ``mns(apgd-t) 2 restarts`` (the same with two runs per target) and ``mns(square)
  2x2500`` (Square's 5000 queries per eps as two runs of 2500, ``square_2x2500``), added for
  the k-WTA model, where one unlucky run ends a search high, and ``bb+mns(apgd-t)``,
  ``brendel_bethge`` started from the best of its default starts and ``min_norm_search(apgd-t)``
  (``bb_from_apgd_t``), and ``mns(apgd-t) fine``, ``mns(apgd-t)`` through
  ``min_norm_search(..., **FINE_SEARCH)`` (rtol 1e-4, 30 search steps: the precision at which the
  peers' ``eps_search`` ends); in L1 also the two APGD members of the standard L1 AutoAttack
  exactly as ``auto_attack("l1", "standard")`` builds them (``l1_standard_apgd``:
  ``large_eps=True``, the reference's ``use_largereps``; APGD-CE with 5 restarts, APGD-T with 5
  targets), rows ``mns(apgd, large)`` and ``mns(apgd-t, large)`` (the rows ``mns(apgd)`` and
  ``mns(apgd-t)`` run without ``large_eps``, APGD-CE with 1 restart), and ``bb+mns(large)``, L1
  BB started from FMN, FAB and those two rows' attacks (``l1_bb_from_large_eps``);
* Foolbox 3: FMN (Linf, L2, L1), DDN, L2 C&W (9 binary-search steps x 100 steps, the budget
  of jaxrobust's default), DeepFool (Linf, L2), EAD (L1; 9 x 100), Brendel-Bethge (Linf, L2, L1;
  started from the best point the other Foolbox attacks found, the eps searches left out; only
  with ``--bb``); PGD (``LinfPGD``, ``L2PGD``, ``L1PGD`` at their defaults) made minimum-norm by
  AttackBench's per-sample eps search (``eps_search``; ``run_foolbox_eps_search``: every sample
  within its own eps in one batch);
* the AutoAttack reference (``--autoattack-path``): FAB (Linf, L2, L1), untargeted, one run of
  ``attack_single_run`` (the minimum-norm mode: the smallest adversarial point found); APGD-CE
  (Linf, L2, L1) and APGD-T (targeted DLR, 9 target classes in Linf and L2, 5 in L1 with
  ``use_largereps``, the reference's standard L1 suite) made minimum-norm by
  the same eps search (``run_apgd_eps_search``): in Linf and L2 every sample within its own eps
  in one batch, in L1 (whose step does not take a per-sample eps) one run of the reference's
  ``perturb`` per distinct eps, as AttackBench does (batches of one once the bisection starts:
  tens of times slower);
* torchattacks: DeepFool (L2), CW (L2, its defaults ``c=1, steps=50``: a fixed penalty, no
  search);
* ART (adversarial-robustness-toolbox): DeepFool (L2), Carlini-Wagner L2 (its defaults, 10 x 10),
  EAD (L1, ``decision_rule="L1"``, 5 x 20). ART's and Foolbox's C&W/EAD cost about 10 ms per
  step here whatever the batch, so larger settings did not fit the time of this benchmark.

Propagations per sample (issue #27, item 3), forward and backward, are recorded for every row
(JSON keys ``forward_mean``, ``backward_mean``, ``forward_max``, ``backward_max``, ``total_max``
and ``how``; absent in files written before, where the tables print ``-``), over the samples
attacked (the clean-correct ones):

* jaxrobust (``how = "info"``): the library's exact per-example counts,
  ``result.info["propagations"]`` (``jaxrobust.engine.propagations``: AttackBench's semantics,
  a gradient is one forward and one backward, ``jr.run``'s own scoring not counted); mean and
  max over the samples. An attack without them (``how = "count_evaluations"``) is run a second
  time with the model wrapped by ``jr.metrics.count_evaluations``: its row totals less
  ``jr.run``'s own work (one gradient and one forward row per point), divided by the samples
  (no max; a pullback applied K times to one call counts once there);
* peers (``how = "hooks"``): the PyTorch port inside a counting module (``counted_port``): the
  batch size of every call (forward) and the rows of every gradient flowing back through the
  logits (backward, a hook on the output), divided by the samples; also the calls of each, which
  is AttackBench's own per-batch count (its model wrapper counts calls). Foolbox BB's count
  leaves out the Foolbox attacks that found its starting points.

``--check-counting`` runs each peer also on the bare port, and each jaxrobust attack also under
``count_evaluations``, and records whether the points are the same, bitwise (``same_points``).

A point counts as found when the attack's own framework (JAX or the PyTorch port) misclassifies
it; a peer's point is also re-judged by the JAX model and disagreements are counted. Time is the
wall time of one call (2 cores shared with other jobs: the 1-min load average is printed).

``--seed N`` (default 0) is jaxrobust's key ``jax.random.key(N)`` and the peers' torch seed (and
the AutoAttack reference's own ``seed``); the entry records it, and for N other than 0 every row
name gets the suffix `` seedN`` (``seed_name``), so the runs of several seeds merge as separate
rows. Seed 0 reproduces the rows of files written before the option, bitwise.

Each model x norm is appended to ``--out`` (JSON lines) as soon as it is done, so a run cut by a
timeout keeps what it finished; ``--summarize FILE...`` prints the tables of RESULTS.md from
those lines, merging the rows of several runs on the same model, norm and weights (e.g. a later
``--bb --no-jaxrobust`` run; a row already read keeps its first value), and ends with issue
#27's goal table (``goals``: per goal, the cells met and the cells missed with their figures).
Example::

  timeout 1500 python benchmarks/bench_optimality.py --models mlp-plain --n 100 \\
      --autoattack-path .aa --out /tmp/opt.jsonl
  python benchmarks/bench_optimality.py --summarize /tmp/opt.jsonl
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
for path in (ROOT, ROOT / "benchmarks"):
  if str(path) not in sys.path:
    sys.path.insert(0, str(path))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import jaxrobust as jr  # noqa: E402
from bench_autoattack import import_autoattack  # noqa: E402
from bench_peers import (ARCHS, MLP_TRAINING, DigitsMLP, frozen_path, load_frozen_params,  # noqa: E402
                         nchw, params_digest, save_params, torch_mlp_port, torch_port)
from min_norm_metrics import (check_box, load_examples, lp_norms, optimality,  # noqa: E402
                              print_machine)

NORMS = ("linf", "l2", "l1")
KWTA_RATIO = 0.1
NEW_PORT_TOLERANCE = 1e-5
"""|torch logits - JAX logits| allowed for the models trained here (the brief's 1e-5)."""
NEW_KINDS = ("trades", "kwta", "ibp", "ccat")
"""The MLPs trained by ``train_new_mlp`` (the others are ``bench_peers.py``'s frozen models)."""
IBP_TRAINING = {"eps": 0.1, "warmup_epochs": 2, "ramp_epochs": 10, "kappa_end": 0.5}
"""``mlp-ibp``'s schedule (Gowal et al. 2018's shape on ``MLP_TRAINING``'s 30 epochs): eps 0 and
kappa 1 for ``warmup_epochs``, then linear per step to ``eps`` and ``kappa_end`` over
``ramp_epochs``, then constant. Linf, on inputs in [0, 1]."""
CCAT_TRAINING = {"eps": 0.2, "rho": 10.0, "attack_steps": 10, "keep": 0.99, "temperature": 100.0}
"""``mlp-ccat``: Linf ``eps`` of the training attack (``MLP_TRAINING``'s), CCAT's ``rho``, PGD steps
maximising the largest wrong-class probability, the fraction of correct clean test points the
confidence threshold keeps, and the factor ``T`` of the gate below the threshold."""


# ------------------------------------------------------------------------------------------------
# The zoo.


def kwta(h: jax.Array, ratio: float = KWTA_RATIO) -> jax.Array:
  """k-winners-take-all: keep the ``ceil(ratio * width)`` largest entries of each row, zero the
  others (ties at the threshold are all kept)."""
  k = max(1, math.ceil(ratio * h.shape[-1]))
  threshold = jax.lax.top_k(h, k)[0][..., -1:]
  return jnp.where(h >= threshold, h, 0.0)


class KWTAMLP(nn.Module):
  """``flatten -> Dense(128) -> kWTA -> Dense(64) -> kWTA -> Dense(10)``, DigitsMLP's layer names."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape((x.shape[0], -1))
    x = kwta(nn.Dense(128, name="dense1")(x))
    x = kwta(nn.Dense(64, name="dense2")(x))
    return nn.Dense(10, name="dense3")(x)


def torch_kwta_port(params: Any):
  """The PyTorch mirror of ``KWTAMLP``: the DigitsMLP port with k-WTA in place of ReLU."""
  import torch

  model = torch_mlp_port(params)

  def top_k(h):
    k = max(1, math.ceil(KWTA_RATIO * h.shape[-1]))
    threshold = torch.topk(h, k, dim=-1).values[..., -1:]
    return torch.where(h >= threshold, h, torch.zeros_like(h))

  def forward(x):
    x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
    x = top_k(model.dense1(x))
    x = top_k(model.dense2(x))
    return model.dense3(x)

  model.forward = forward
  return model


def ccat_gate(logits: jax.Array, tau: jax.Array,
              temperature: float = CCAT_TRAINING["temperature"]) -> jax.Array:
  r"""The confidence gate of ``mlp-ccat``: ``z`` where :math:`\max_j \mathrm{softmax}(z)_j \ge \tau`,
  else ``T z`` (``T = temperature``).

  Scaling by ``T > 0`` keeps the argmax, so every prediction (and every minimum adversarial
  distance) is the ungated model's; below the threshold the softmax of ``T z`` saturates (CE
  gradients vanish where z's top-two margin is large), and the loss jumps where it crosses tau.

  >>> z = jnp.array([[4.0, 0.0], [0.1, 0.0]])
  >>> ccat_gate(z, jnp.float32(0.9)).tolist()
  [[4.0, 0.0], [10.0, 0.0]]
  """
  confidence = jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1, keepdims=True)
  return jnp.where(confidence >= tau, logits, temperature * logits)


def ccat_apply(variables: Any, x: jax.Array) -> jax.Array:
  """``mlp-ccat``'s logits: DigitsMLP's, through ``ccat_gate`` at the stored threshold
  ``variables["params"]["gate"]["tau"]`` (a weight like the others: an argument of the jitted
  programs)."""
  p = variables["params"]
  logits = DigitsMLP().apply({"params": {k: p[k] for k in ("dense1", "dense2", "dense3")}}, x)
  return ccat_gate(logits, p["gate"]["tau"])


def torch_ccat_port(params: Any):
  """The PyTorch mirror of ``ccat_apply``: the DigitsMLP port and the gate with ``torch.where``."""
  import torch

  model = torch_mlp_port(params)
  tau = torch.tensor(np.asarray(params["params"]["gate"]["tau"], np.float32))
  temperature = CCAT_TRAINING["temperature"]
  mlp = model.forward

  def forward(x):
    z = mlp(x)
    confidence = torch.softmax(z, dim=-1).max(dim=-1, keepdim=True).values
    return torch.where(confidence >= tau, z, temperature * z)

  model.forward = forward
  return model


def wrong_confidence(logits: jax.Array, y: jax.Array) -> jax.Array:
  """CCAT's attack objective, ``max_{j != y} softmax(z)_j`` (``[B]``, larger is more adversarial)."""
  return jr.losses.max_other_logit(jax.nn.softmax(logits, axis=-1), y)


def ccat_loss(logits_fn: Callable, x: jax.Array, y: jax.Array, key: jax.Array,
              eps: jax.Array) -> jax.Array:
  r"""CCAT's loss (Stutz, Hein & Schiele 2020) on one batch: cross-entropy on the first half
  (clean) and, on the second half, cross-entropy towards
  :math:`\lambda\,\mathrm{onehot}(y) + (1 - \lambda)/C` at :math:`x + \delta`, with
  :math:`\lambda = (1 - \min(1, \|\delta\|_\infty / \epsilon))^\rho`; :math:`\delta` from
  ``jr.attacks.pgd("linf")`` (``CCAT_TRAINING["attack_steps"]`` steps, random start) maximising
  ``wrong_confidence`` on every point (``jr.training.adversarial_loss``'s inner attack)."""
  cfg = CCAT_TRAINING
  half = x.shape[0] // 2
  attack = jr.attacks.pgd("linf", steps=cfg["attack_steps"], loss=wrong_confidence)
  _, aux = jr.training.adversarial_loss(logits_fn, x[half:], y[half:], jr.Budget(eps), key,
                                        attack=attack)
  delta = jnp.max(jnp.abs(aux.x_adv - x[half:]).reshape(x.shape[0] - half, -1), axis=-1)
  lam = (1.0 - jnp.minimum(1.0, delta / eps)) ** cfg["rho"]
  logits_clean, logits_adv = logits_fn(x[:half]), logits_fn(aux.x_adv)
  classes = logits_adv.shape[-1]
  target = (lam[:, None] * jax.nn.one_hot(y[half:], classes)
            + (1.0 - lam[:, None]) / classes)
  return jnp.concatenate([
      optax.softmax_cross_entropy_with_integer_labels(logits_clean, y[:half]),
      optax.softmax_cross_entropy(logits_adv, target)]).mean()


def ccat_threshold(params: Any) -> tuple[float, dict]:
  """``tau`` of ``mlp-ccat``: between the confidences (max softmax) of the correct clean digits test
  points so that exactly ``ceil(keep * n_correct)`` lie above it (the midpoint of the two
  neighbouring confidences, so no test point sits on the threshold), and what it leaves: clean
  accuracy, points below ``tau`` (all and correct). Weights and data are jit arguments."""
  from jaxrobust.demo.data import load_digits

  _, _, x_test, y_test = load_digits()
  probs = jax.jit(lambda params, x: jax.nn.softmax(DigitsMLP().apply(params, x), axis=-1))
  p = np.asarray(probs(params, jnp.asarray(x_test)), np.float64)
  confidence, correct = p.max(-1), p.argmax(-1) == np.asarray(y_test)
  ranked = np.sort(confidence[correct])
  drop = len(ranked) - math.ceil(CCAT_TRAINING["keep"] * len(ranked))
  tau = float(np.float32((ranked[drop - 1] + ranked[drop]) / 2 if drop else ranked[0] / 2))
  stats = {"tau": tau, "clean": f"{int(correct.sum())}/{len(correct)}",
           "below_tau": f"{int((confidence < tau).sum())}/{len(correct)}",
           "correct_below_tau": f"{int((confidence[correct] < tau).sum())}/{int(correct.sum())}"}
  return tau, stats


def ibp_schedule(epochs: int, batches: int) -> tuple[np.ndarray, np.ndarray]:
  """``(eps, kappa)``, each ``[epochs, batches]``: ``IBP_TRAINING``'s per-step schedule.

  >>> eps, kappa = ibp_schedule(14, 2)
  >>> [round(float(v), 4) for v in (eps[:2].max(), eps[2, 0], eps[11, 1], eps[-1, -1])]
  [0.0, 0.005, 0.1, 0.1]
  >>> [round(float(v), 4) for v in (kappa[1, 1], kappa[2, 0], kappa[11, 1], kappa[-1, -1])]
  [1.0, 0.975, 0.5, 0.5]
  """
  cfg = IBP_TRAINING
  step = np.arange(epochs * batches, dtype=np.float64) - cfg["warmup_epochs"] * batches + 1
  ramp = np.clip(step / (cfg["ramp_epochs"] * batches), 0.0, 1.0).reshape(epochs, batches)
  return ((cfg["eps"] * ramp).astype(np.float32),
          (1.0 - (1.0 - cfg["kappa_end"]) * ramp).astype(np.float32))


def train_new_mlp(kind: str) -> Any:
  """``mlp-trades``, ``mlp-kwta``, ``mlp-ibp`` or ``mlp-ccat`` trained on the digits training split
  with ``bench_peers.MLP_TRAINING``'s epochs, batch, learning rate and seed (``mlp-ibp``: eps and
  kappa per step from ``ibp_schedule``, passed to the jitted epoch as data; ``mlp-ccat``:
  ``ccat_loss`` at ``CCAT_TRAINING["eps"]``, also passed as data, then its gate's threshold
  ``ccat_threshold`` stored with the weights as ``gate/tau``)."""
  from jaxrobust.demo.data import load_digits

  cfg = MLP_TRAINING
  x_train, y_train, _, _ = load_digits()
  model = KWTAMLP() if kind == "kwta" else DigitsMLP()
  key = jax.random.key(cfg["seed"])
  params = model.init(key, jnp.zeros((1, 8, 8, 1), jnp.float32))
  optimizer = optax.adam(cfg["learning_rate"])
  batches = x_train.shape[0] // cfg["batch_size"]
  eps_schedule, kappa_schedule = ibp_schedule(cfg["epochs"], batches)
  if kind == "ccat":
    eps_schedule = np.full_like(eps_schedule, CCAT_TRAINING["eps"])

  def loss_fn(params, x, y, key, eps, kappa):
    logits_fn = functools.partial(model.apply, params)
    if kind == "trades":
      return jr.training.trades_loss(logits_fn, x, y, jr.Budget(cfg["eps"]), key)[0]
    if kind == "ibp":
      return jr.training.ibp_loss(logits_fn, x, y, jr.Budget(eps), kappa=kappa)[0]
    if kind == "ccat":
      return ccat_loss(logits_fn, x, y, key, eps)
    return optax.softmax_cross_entropy_with_integer_labels(logits_fn(x), y).mean()

  def step(carry, batch):
    params, opt_state = carry
    grads = jax.grad(loss_fn)(params, *batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), None

  @jax.jit
  def epoch(params, opt_state, x, y, key, eps, kappa):
    perm_key, attack_key = jax.random.split(key)
    order = jax.random.permutation(perm_key, x.shape[0])[:batches * cfg["batch_size"]]
    xb = x[order].reshape((batches, cfg["batch_size"], *x.shape[1:]))
    yb = y[order].reshape((batches, cfg["batch_size"]))
    (params, opt_state), _ = jax.lax.scan(
        step, (params, opt_state), (xb, yb, jax.random.split(attack_key, batches), eps, kappa))
    return params, opt_state

  opt_state = optimizer.init(params)
  x, y = jnp.asarray(x_train), jnp.asarray(y_train)
  for e in range(cfg["epochs"]):
    params, opt_state = epoch(params, opt_state, x, y, jax.random.fold_in(key, e + 1),
                              jnp.asarray(eps_schedule[e]), jnp.asarray(kappa_schedule[e]))
  if kind == "ccat":
    tau, stats = ccat_threshold(params)
    print(f"mlp-ccat gate: {stats}")
    params = {"params": {**params["params"], "gate": {"tau": jnp.float32(tau)}}}
  return params


def zoo_model(name: str, retrain: bool = False) -> tuple[Callable, Any, Callable]:
  """``(apply_fn, params, torch_port_builder)`` of a zoo model."""
  arch, kind = name.split("-")
  if kind in NEW_KINDS:
    path = frozen_path(kind, "mlp")
    if retrain or not path.is_file():
      start = time.perf_counter()
      save_params(train_new_mlp(kind), path)
      print(f"trained {name} in {time.perf_counter() - start:.1f} s, wrote {path} "
            f"({path.stat().st_size} bytes)")
    params = load_frozen_params(kind, "mlp")
    if kind == "kwta":
      return KWTAMLP().apply, params, torch_kwta_port
    if kind == "ccat":
      return ccat_apply, params, torch_ccat_port
    return DigitsMLP().apply, params, torch_mlp_port
  return ARCHS[arch]().apply, load_frozen_params(kind, arch), (
      torch_port if arch == "cnn" else torch_mlp_port)


MODELS = ("cnn-plain", "cnn-adversarial", "mlp-plain", "mlp-adversarial", "mlp-trades",
          "mlp-kwta", "mlp-ibp", "mlp-ccat")


def certified_accuracy(model: str, x: np.ndarray, y: np.ndarray) -> str:
  """One line: ``model``'s clean accuracy and IBP-certified accuracy at ``IBP_TRAINING["eps"]``
  (Linf, within [0, 1]) on ``x, y``; certified where correct and every IBP margin bound
  (``jr.certify.margin_bounds``) is positive. Weights, data and eps are arguments of the jitted
  programs."""
  apply_fn, params, _ = zoo_model(model)
  clean = jax.jit(lambda params, x: jnp.argmax(apply_fn(params, x), -1))
  bounds = jax.jit(lambda params, x, y, eps: jr.certify.margin_bounds(
      functools.partial(apply_fn, params), y, jnp.clip(x - eps, 0.0, 1.0),
      jnp.clip(x + eps, 0.0, 1.0), method="ibp"))
  x, y, eps = jnp.asarray(x), jnp.asarray(y), jnp.float32(IBP_TRAINING["eps"])
  correct = np.asarray(clean(params, x)) == np.asarray(y)
  line = f"{model} (weights {params_digest(params)}): clean {correct.sum()}/{len(correct)}"
  try:
    margins = np.asarray(bounds(params, x, y, eps))
  except NotImplementedError as error:
    return f"{line}; IBP-certified at Linf {IBP_TRAINING['eps']}: not bounded ({error})"
  certified = correct & np.all(margins > 0, axis=-1)
  return (f"{line}; IBP-certified at Linf {IBP_TRAINING['eps']}: {certified.sum()}/"
          f"{len(certified)}")


def diagnosis_line(model: str, n: int) -> str:
  """One line: ``jr.diagnose`` of ``model``'s logits function (``functools.partial`` of its apply
  function and weights, so the weights are arguments of the traced program) at ``n`` digits:
  ``clean`` or each finding's kind, severity, primitive and location."""
  apply_fn, params, _ = zoo_model(model)
  found = jr.diagnose(functools.partial(apply_fn, params),
                      jax.ShapeDtypeStruct((n, 8, 8, 1), jnp.float32))
  if not found:
    return f"{model}: clean (no gradient-masking operation on the path from x to the logits)"
  return f"{model}: " + "; ".join(
      f"{f.kind} ({f.severity}, {f.primitive}) at {f.location.removeprefix(f'{ROOT}{os.sep}')}"
      for f in found)


# ------------------------------------------------------------------------------------------------
# jaxrobust.


def jaxrobust_attacks(norm: str) -> dict[str, Callable[[], jr.Attack]]:
  a = jr.attacks
  mns = a.min_norm_search
  if norm == "linf":
    return {"fmn": lambda: a.fmn("linf"), "fab": lambda: a.fab("linf"),
            "mns(apgd)": lambda: mns(a.apgd("linf")), "mns(pgd)": lambda: mns(a.pgd("linf")),
            "deepfool": lambda: a.deepfool("linf"), "bb": lambda: a.brendel_bethge("linf"),
            "mns(square)": lambda: mns(a.square("linf")),
            "mns(apgd-t)": lambda: mns(apgd_t("linf")),
            "mns(apgd-t) fine": lambda: mns(apgd_t("linf"), **FINE_SEARCH),
            "mns(apgd-t) 2 restarts": lambda: mns(apgd_t("linf", restarts=2)),
            "mns(square) 2x2500": lambda: mns(square_2x2500("linf")),
            "bb+mns(apgd-t)": lambda: bb_from_apgd_t("linf")}
  if norm == "l2":
    return {"ddn": lambda: a.ddn(), "fmn": lambda: a.fmn("l2"),
            "cw": lambda: a.carlini_wagner_l2(), "fab": lambda: a.fab("l2"),
            "deepfool": lambda: a.deepfool("l2"), "mns(apgd)": lambda: mns(a.apgd("l2")),
            "bb": lambda: a.brendel_bethge("l2"), "mns(square)": lambda: mns(a.square("l2")),
            "mns(apgd-t)": lambda: mns(apgd_t("l2")),
            "mns(apgd-t) fine": lambda: mns(apgd_t("l2"), **FINE_SEARCH),
            "mns(apgd-t) 2 restarts": lambda: mns(apgd_t("l2", restarts=2)),
            "mns(square) 2x2500": lambda: mns(square_2x2500("l2")),
            "bb+mns(apgd-t)": lambda: bb_from_apgd_t("l2")}
  return {"fmn": lambda: a.fmn("l1"), "fab": lambda: a.fab("l1"),
          "mns(apgd)": lambda: mns(a.apgd("l1")), "bb": lambda: a.brendel_bethge("l1"),
          "mns(square)": lambda: mns(a.square("l1")), "mns(apgd-t)": lambda: mns(apgd_t("l1")),
          "mns(apgd, large)": lambda: mns(l1_standard_apgd(targeted=False)),
          "mns(apgd-t, large)": lambda: mns(l1_standard_apgd(targeted=True)),
          "bb+mns(large)": l1_bb_from_large_eps}


FINE_SEARCH = {"rtol": 1e-4, "search_steps": 30}
"""``min_norm_search``'s settings of the row ``mns(apgd-t) fine`` (Linf, L2): bisection to a
relative width of 1e-4 (about 2^-13, where ``eps_search``'s 16 runs end), with room for the
doubling steps."""


def apgd_t(norm: str, restarts: int = 1) -> jr.Attack:
  """AutoAttack's standard APGD-T member (``auto_attack``'s construction): targeted DLR at
  APGD's defaults (100 steps, one run per target), 9 target classes in Linf and L2, 5 in L1;
  ``restarts`` runs per target (row ``mns(apgd-t) 2 restarts``: 2, twice the cost).

  >>> apgd_t("l1").name == jr.attacks.apgd("l1", loss="dlr", targeted=True,
  ...                                        n_target_classes=5).name
  True
  >>> apgd_t("linf", restarts=2).num_steps, apgd_t("linf").num_steps
  (1817, 908)
  """
  return jr.attacks.apgd(norm, loss="dlr", targeted=True,
                         n_target_classes=5 if norm == "l1" else 9, restarts=restarts)


def square_2x2500(norm: str) -> jr.Attack:
  """Square's default budget of 5000 queries per eps as two independent runs of 2500 (row
  ``mns(square) 2x2500``; the window schedule stretched over 2500 queries).

  On ``mlp-kwta`` one run's result depends much on its key, and ``min_norm_search`` keeps the
  largest eps at which a run failed as a lower bound, so one unlucky run ends the search high:
  ``min_norm_search(square("l2"))`` on digit 1 with 8 keys returned 0.18 to 0.50. A second run
  per eps makes a failure rarer at the same cost.

  >>> square_2x2500("l2").num_steps, jr.attacks.square("l2").num_steps  # restarts (queries + 1) - 1
  (5001, 5000)
  """
  return jr.attacks.square(norm, queries=2500, restarts=2)


def bb_from_apgd_t(norm: str) -> jr.Attack:
  """Brendel-Bethge (its defaults: 1000 steps) started from the best of its default starts and
  ``min_norm_search(apgd_t(norm))``; never worse than that start per point.

  >>> bb_from_apgd_t("linf").name.startswith("brendel-bethge")
  True
  """
  from jaxrobust.attacks._brendel_bethge import default_init_attack
  starts = default_init_attack(norm) + (jr.attacks.min_norm_search(apgd_t(norm)),)
  return jr.attacks.brendel_bethge(norm, init_attack=starts)


def l1_standard_apgd(targeted: bool) -> jr.Attack:
  """An APGD member of AutoAttack's standard L1 suite, as ``auto_attack("l1", "standard")``
  builds it: the reference's ``use_largereps`` (``large_eps=True``: 30% of the 100 steps at
  3 eps, 30% at 2 eps, 40% at eps), APGD-CE with 5 restarts, APGD-T (targeted DLR) with 5 target
  classes and one restart each.

  >>> from jaxrobust.attacks._auto_attack import _members
  >>> ce, t = _members("l1", "standard", 10, 9, 100, 5000, 20)[:2]
  >>> (l1_standard_apgd(False).name, l1_standard_apgd(True).name) == (ce.name, t.name)
  True
  >>> l1_standard_apgd(True).name
  'apgd-t-dlr-l1-100x5targets-large-eps'
  """
  if targeted:
    return jr.attacks.apgd("l1", loss="dlr", targeted=True, n_target_classes=5, large_eps=True)
  return jr.attacks.apgd("l1", loss="ce", restarts=5, large_eps=True)


def l1_bb_from_large_eps() -> jr.Attack:
  """L1 Brendel-Bethge (its defaults, 1000 steps) started from the smallest adversarial point of
  FMN, FAB and both ``l1_standard_apgd`` members in ``min_norm_search`` at its defaults (row
  ``bb+mns(large)``; BB's default start has ``min_norm_search(apgd)`` without ``large_eps``, at
  ``rtol=0.01``, in their place). The result is never worse than the start."""
  a = jr.attacks
  return a.brendel_bethge("l1", init_attack=(
      a.fmn("l1"), a.fab("l1", n_target_classes=None),
      a.min_norm_search(l1_standard_apgd(False)), a.min_norm_search(l1_standard_apgd(True))))


def run_jaxrobust(attack: jr.Attack, norm: str, apply_fn, params, x, y,
                  check_counting: bool = False, seed: int = 0) -> dict:
  run = jax.jit(lambda params, x, y, key: jr.run(attack, lambda v: apply_fn(params, v), x, y,
                                                 jr.Budget(jnp.inf), key))
  args = (params, jnp.asarray(x), jnp.asarray(y), jax.random.key(seed))
  start = time.perf_counter()
  compiled = run.lower(*args).compile()
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  result = jax.block_until_ready(compiled(*args))
  seconds = time.perf_counter() - start
  x_adv = np.asarray(result.x_adv)
  check_box(attack.name, x_adv)
  success = np.asarray(jnp.argmax(apply_fn(params, result.x_adv), -1)) != y
  if not np.array_equal(success, np.asarray(result.success)):
    print(f"  note: {attack.name}: result.success differs from the model's verdict on "
          f"{int(np.sum(success != np.asarray(result.success)))} points")
  props = (propagations_of_info(result.info["propagations"])
           if "propagations" in (result.info or {}) else None)
  if props is None or check_counting:
    counted = count_jaxrobust(attack, apply_fn, params, x, y, seed)
    counted["same_points"] = bool(np.array_equal(counted.pop("x_adv"), x_adv))
    if props is None:
      props = counted
    else:  # the check: the library's per-example counts against count_evaluations' totals
      props["same_points"] = counted["same_points"]
      props["check_count_evaluations"] = {k: counted[k] for k in
                                          ("forward_mean", "backward_mean")}
  return {"norms": np.where(success, lp_norms(x_adv, x, norm), np.inf), "seconds": seconds,
          "compile_s": compile_s, "disagree": 0, **props}


def propagations_of_info(counts: dict) -> dict:
  """The row's propagation keys from ``info["propagations"]`` (per example, exact).

  >>> row = propagations_of_info({"forward": np.array([3, 5]), "backward": np.array([2, 4])})
  >>> row["forward_mean"], row["backward_mean"], row["total_max"], row["how"]
  (4.0, 3.0, 9, 'info')
  """
  forward, backward = (np.asarray(counts[k], np.int64) for k in ("forward", "backward"))
  return {"forward_mean": float(forward.mean()), "backward_mean": float(backward.mean()),
          "forward_max": int(forward.max()), "backward_max": int(backward.max()),
          "total_max": int((forward + backward).max()), "how": "info"}


def run_overhead(forward_rows: int, gradient_rows: int, n: int) -> dict:
  """The row's propagation keys from ``count_evaluations``' totals of one ``jr.run`` on ``n``
  clean-correct points, less ``jr.run``'s own work (one gradient row per point for the clean
  verdict and gradient check, one forward row per point for re-scoring the returned point; see
  ``tests/test_propagations.py``). A gradient row is one forward and one backward (a pullback
  applied K times to one call counts once: a lower bound on the backward propagations then).

  >>> row = run_overhead(forward_rows=50, gradient_rows=110, n=10)
  >>> row["forward_mean"], row["backward_mean"], row["total_max"], row["how"]
  (14.0, 10.0, None, 'count_evaluations')
  """
  gradient, forward = gradient_rows - n, forward_rows - n
  return {"forward_mean": (forward + gradient) / n, "backward_mean": gradient / n,
          "forward_max": None, "backward_max": None, "total_max": None,
          "how": "count_evaluations"}


def count_jaxrobust(attack: jr.Attack, apply_fn, params, x, y, seed: int = 0) -> dict:
  """``jr.run`` again with the model wrapped by ``jr.metrics.count_evaluations`` (weights, data
  and key arguments of the jitted program, as the timed run): the row's propagation keys and the
  returned points (to check that counting changes nothing)."""
  holder = {}

  def counted_run(params, x, y, key):
    logits_fn, holder["counter"] = jr.metrics.count_evaluations(lambda v: apply_fn(params, v))
    return jr.run(attack, logits_fn, x, y, jr.Budget(jnp.inf), key)

  compiled = jax.jit(counted_run).lower(params, jnp.asarray(x), jnp.asarray(y),
                                        jax.random.key(seed)).compile()
  holder["counter"].reset()  # nothing ran yet; the counter of the traced program
  result = jax.block_until_ready(compiled(params, jnp.asarray(x), jnp.asarray(y),
                                          jax.random.key(seed)))
  jax.effects_barrier()
  counter = holder["counter"]
  return dict(run_overhead(counter.forward, counter.gradient, len(y)),
              x_adv=np.asarray(result.x_adv))


# ------------------------------------------------------------------------------------------------
# Peers (PyTorch, on the port).


def counted_port(port):
  """``port`` inside a PyTorch module that counts what goes through it, AttackBench's way (a
  model wrapper) but per row: ``forward_rows`` (the batch size of every call) and
  ``backward_rows`` (the rows of every gradient that flows back through the logits: a hook on
  the output tensor, which runs once per backward pass, so a graph differentiated K times with
  ``retain_graph`` counts K), and the calls of each (AttackBench's per-batch counts). The
  logits and gradients are ``port``'s, untouched."""
  import torch

  class Counted(torch.nn.Module):

    def __init__(self, model):
      super().__init__()
      self.model = model
      self.forward_rows = self.backward_rows = self.forward_calls = self.backward_calls = 0

    def _backward(self, grad):
      self.backward_rows += int(grad.shape[0])
      self.backward_calls += 1

    def forward(self, x):
      out = self.model(x)
      self.forward_rows += int(x.shape[0])
      self.forward_calls += 1
      if out.requires_grad:
        out.register_hook(self._backward)
      return out

  return Counted(port).eval()


def propagations_of_port(counted, n: int) -> dict:
  """The row's propagation keys from a ``counted_port`` after a peer attacked ``n`` points:
  rows / n per sample (the max per sample is not known: at most the calls, when no call holds a
  point twice).

  >>> class C: forward_rows, backward_rows, forward_calls, backward_calls = 60, 40, 3, 2
  >>> row = propagations_of_port(C, 20)
  >>> row["forward_mean"], row["backward_mean"], row["forward_calls"], row["how"]
  (3.0, 2.0, 3, 'hooks')
  """
  return {"forward_mean": counted.forward_rows / n, "backward_mean": counted.backward_rows / n,
          "forward_max": None, "backward_max": None, "total_max": None,
          "forward_calls": counted.forward_calls, "backward_calls": counted.backward_calls,
          "how": "hooks"}


def foolbox_attacks(norm: str, bb: bool) -> dict[str, Callable]:
  try:
    import foolbox as fb
  except ImportError:
    return {}
  f = fb.attacks
  table = {
    "linf": {"fmn": f.LInfFMNAttack, "deepfool": f.LinfDeepFoolAttack,
             "bb": f.LinfinityBrendelBethgeAttack},
    "l2": {"ddn": f.DDNAttack, "fmn": f.L2FMNAttack,
           "cw 9x100": lambda: f.L2CarliniWagnerAttack(binary_search_steps=9, steps=100),
           "deepfool": f.L2DeepFoolAttack, "bb": f.L2BrendelBethgeAttack},
    "l1": {"fmn": f.L1FMNAttack, "ead 9x100": lambda: f.EADAttack(binary_search_steps=9,
                                                                    steps=100),
           "bb": f.L1BrendelBethgeAttack},
  }[norm]
  if not bb:
    table.pop("bb")
  return {f"foolbox {k}": v for k, v in table.items()}


def run_foolbox(make, port, x, y, starting_points=None) -> np.ndarray:
  import foolbox as fb
  import torch

  fmodel = fb.PyTorchModel(port, bounds=(0.0, 1.0), device="cpu")
  xt, yt = torch.from_numpy(nchw(x)), torch.from_numpy(y.astype(np.int64))
  kwargs = {} if starting_points is None else {
      "starting_points": torch.from_numpy(nchw(starting_points))}
  adv = make().run(fmodel, xt, fb.criteria.Misclassification(yt), **kwargs)
  return adv.numpy()


def run_fab_reference(aa_path: str, norm: str, port, x, y, *, seed: int = 0) -> np.ndarray:
  import torch

  module, note = import_autoattack(aa_path)
  if module is None:
    raise RuntimeError(note)
  from autoattack.fab_pt import FABAttack_PT

  torch.manual_seed(seed)
  attack = FABAttack_PT(port, norm={"linf": "Linf", "l2": "L2", "l1": "L1"}[norm], n_restarts=1,
                        n_iter=100, seed=seed, device="cpu")
  with torch.no_grad():
    adv = attack.attack_single_run(torch.from_numpy(nchw(x)),
                                   torch.from_numpy(y.astype(np.int64)),
                                   use_rand_start=False, is_targeted=False)
  return adv.detach().numpy()


INIT_EPS = {"linf": 8 / 255, "l2": 0.5, "l1": 1.0}
"""The eps each sample's search starts from (the usual image budgets in Linf and L2; in L1, 1.0,
below the median best-known L1 distance of every zoo model, 0.9-1.2; doubled until it breaks)."""


def eps_search(attack_at: Callable[[np.ndarray], np.ndarray], norm: str, port, x, y, *,
               search_steps: int = 16, init_eps: float | None = None) -> np.ndarray:
  """A fixed-budget attack made minimum-norm by a per-sample search on eps, as AttackBench wraps
  fixed-budget attacks: from ``init_eps`` (default ``INIT_EPS[norm]``) the eps of a sample
  doubles until the attack finds an adversarial point, then bisects between the largest eps that
  failed and the smallest norm found, ``search_steps`` runs in all (every sample in every run).

  ``attack_at(eps)`` runs the attack once on the whole batch, sample ``i`` within ``eps[i]``
  (float64, shape ``[B]``), and returns its points, NCHW; a point counts as found when ``port``
  misclassifies it. After ``k`` doublings the bracket ``[lower, upper]`` (``lower`` < every
  distance the attack can reach, ``upper`` the smallest found) halves with every run, so a sample
  found at step ``k`` ends within ``upper_k / 2^(search_steps - k)`` of the smallest eps at which
  the attack breaks it. Returns the smallest adversarial point found per sample (the clean point
  where none was), NCHW.

  >>> import torch
  >>> port = lambda v: torch.stack([0.3 - v.flatten(1).sum(1), 0 * v[:, 0, 0, 0]], 1)
  >>> x, y = np.zeros((1, 2, 2, 1), np.float32), np.zeros(1, np.int64)
  >>> along = lambda eps: np.full((1, 1, 2, 2), eps[0] / 4, np.float32)  # L1 = eps, sum = eps
  >>> d = np.abs(eps_search(along, "l1", port, x, y, init_eps=1.0)).sum()
  >>> bool(0.3 * (1 - 1e-6) <= d <= 0.3 * (1 + 2 ** -13))  # 15 halvings of [0, 1]
  True
  """
  import torch

  num = len(y)
  eps = np.full(num, INIT_EPS[norm] if init_eps is None else init_eps)
  lower, upper = np.zeros(num), np.full(num, np.inf)
  best = nchw(x).copy()
  yt = torch.from_numpy(y.astype(np.int64))
  for _ in range(search_steps):
    adv = np.asarray(attack_at(eps), np.float32)
    with torch.no_grad():
      fooled = (port(torch.from_numpy(adv)).argmax(1) != yt).numpy()
    size = lp_norms(adv.transpose(0, 2, 3, 1), x, norm)
    better = fooled & (size < upper)
    best[better], upper[better] = adv[better], size[better]
    lower[~fooled] = np.maximum(lower[~fooled], eps[~fooled])
    eps = np.where(np.isfinite(upper), (lower + upper) / 2, 2 * eps)
  return best


def in_groups_of_equal_eps(run: Callable, x, y) -> Callable[[np.ndarray], np.ndarray]:
  """``attack_at`` for ``eps_search`` from an attack that takes one eps for its whole batch
  (AttackBench's wrappers of Foolbox and of the AutoAttack reference do the same): ``run(xt, yt,
  eps) -> points`` (torch NCHW inputs, a Python float) is called once per distinct eps on the
  samples that have it, so after the doubling phase mostly on batches of one."""
  import torch

  xt, yt = torch.from_numpy(nchw(x)), torch.from_numpy(y.astype(np.int64))

  def attack_at(eps: np.ndarray) -> np.ndarray:
    out = nchw(x).copy()
    for value in np.unique(eps):
      rows = np.flatnonzero(eps == value)
      index = torch.from_numpy(rows)
      out[rows] = np.asarray(run(xt[index], yt[index], float(value)), np.float32)
    return out

  return attack_at


def reference_apgd(aa_path: str, norm: str, targeted: bool = False, **kwargs):
  """A maker ``port -> attack`` of the AutoAttack reference's ``APGDAttack`` (cross-entropy) or
  ``APGDAttack_targeted`` (targeted DLR, 9 target classes): 100 iterations, one restart, seed 0,
  its defaults; ``kwargs`` override (``eps`` is required)."""
  module, note = import_autoattack(aa_path)
  if module is None:
    raise RuntimeError(note)
  from autoattack.autopgd_base import APGDAttack, APGDAttack_targeted

  common = dict(norm={"linf": "Linf", "l2": "L2", "l1": "L1"}[norm], n_iter=100, n_restarts=1,
                seed=0, device="cpu")
  if targeted:
    return lambda port: APGDAttack_targeted(port, **{"n_target_classes": 9, **common, **kwargs})
  return lambda port: APGDAttack(port, **{"loss": "ce", **common, **kwargs})


def apgd_per_sample_eps(attack, port, x, y, targeted: bool) -> Callable[[np.ndarray], np.ndarray]:
  """``attack_at`` for ``eps_search`` from the reference's APGD in Linf or L2, whose steps and
  projections broadcast a per-sample eps (a ``[B, 1, 1, 1]`` tensor): one batched
  ``attack_single_run`` per eps tried (APGD-CE), or, for APGD-T, the loop of the reference's
  ``APGDAttack_targeted.perturb`` with one restart: for the target classes ranked 2nd to 10th by
  the clean logits, in turn, ``attack_single_run`` on the samples no earlier target fooled, each
  within its own eps (``perturb`` itself takes a single eps). The first adversarial point of a
  sample is kept (``x_best_adv``), as ``perturb`` keeps it."""
  import torch

  xt, yt = torch.from_numpy(nchw(x)), torch.from_numpy(y.astype(np.int64))
  attack.init_hyperparam(xt)
  num = len(y)

  def attack_at(eps: np.ndarray) -> np.ndarray:
    eps_t = torch.from_numpy(eps.astype(np.float32)).view(num, 1, 1, 1)
    if not targeted:
      attack.eps = eps_t
      return attack.attack_single_run(xt, yt)[3].detach().numpy()
    adv, fooled = xt.clone(), torch.zeros(num, dtype=torch.bool)
    for target_class in range(2, attack.n_target_classes + 2):
      todo = (~fooled).nonzero().squeeze(1)
      if todo.numel() == 0:
        break
      with torch.no_grad():
        attack.y_target = port(xt[todo]).sort(dim=1)[1][:, -target_class]
      attack.eps = eps_t[todo]
      _, acc, _, found = attack.attack_single_run(xt[todo], yt[todo])
      won = acc == 0
      adv[todo[won]] = found[won].detach()
      fooled[todo[won]] = True
    return adv.numpy()

  return attack_at


def run_apgd_eps_search(aa_path: str, norm: str, port, x, y, *, targeted: bool = False,
                        search_steps: int = 16, seed: int = 0) -> np.ndarray:
  """The AutoAttack reference's APGD-CE, or APGD-T (``targeted``), made minimum-norm by
  ``eps_search``. Linf and L2: every sample within its own eps in one batch
  (``apgd_per_sample_eps``). L1: the reference's L1 step and projection do not broadcast a
  per-sample eps (its step size is ``[B, 1, 1, 1]`` times eps, its projection's budget ``[B]``),
  so each distinct eps is one call of the reference's ``perturb`` on the samples that have it
  (``in_groups_of_equal_eps``, AttackBench's ``apgd_minimal_wrapper``), with
  ``use_largereps=True`` (AttackBench's L1 configuration and the reference's L1 AutoAttack: 30%
  of the iterations at 3 eps, 30% at 2 eps, 40% at eps, from a random start); APGD-T there
  with 5 target classes, as the reference's standard L1 suite (``set_version``). ``seed``: the
  torch seed, set once per search, and the reference's own ``seed`` (which its ``perturb`` sets
  per call, so in L1 only)."""
  import torch

  torch.manual_seed(seed)
  if norm == "l1":  # the reference's L1 AutoAttack: APGD-T with 5 target classes
    targets = {"n_target_classes": 5} if targeted else {}
    make = reference_apgd(aa_path, norm, targeted, use_largereps=True, eps=1.0, seed=seed,
                          **targets)

    def run(xt, yt, eps):
      attack = make(port)
      attack.eps_orig = attack.eps = eps
      return attack.perturb(xt, yt).detach().numpy()

    attack_at = in_groups_of_equal_eps(run, x, y)
  else:
    attack = reference_apgd(aa_path, norm, targeted, eps=1.0, seed=seed)(port)
    attack_at = apgd_per_sample_eps(attack, port, x, y, targeted)
  return eps_search(attack_at, norm, port, x, y, search_steps=search_steps)


def foolbox_pgd(norm: str, **kwargs):
  """Foolbox 3's PGD of ``norm`` (its defaults unless ``kwargs``: ``LinfPGD`` 40 steps of 0.01/0.3
  eps, ``L2PGD`` and ``L1PGD`` 50 steps of 0.025 eps; a random start in each), taking a
  per-sample eps: ``run``'s ``epsilon`` may be a ``[B, 1, 1, 1]`` torch tensor. Its random start,
  step size and Linf projection broadcast it as they are; its L2/L1 projection
  (``clip_lp_norms``, which divides eps by the ``[B]`` norms) is given it as ``[B]``. Nothing else
  changes: on a batch, the points equal those of one ``run`` per sample with a float eps (to the
  float32 rounding; ``tests/test_bench_optimality_search.py``)."""
  import foolbox as fb

  base = {"linf": fb.attacks.LinfPGD, "l2": fb.attacks.L2PGD, "l1": fb.attacks.L1PGD}[norm]

  class PerSampleEps(base):

    def project(self, x, x0, epsilon):
      if norm != "linf" and not isinstance(epsilon, float):
        epsilon = epsilon.flatten()
      return super().project(x, x0, epsilon)

  return PerSampleEps(**kwargs)


def run_foolbox_eps_search(norm: str, port, x, y, *, search_steps: int = 16,
                           init_eps: float | None = None, **kwargs) -> np.ndarray:
  """Foolbox's PGD (``foolbox_pgd``) made minimum-norm by ``eps_search``, every sample within its
  own eps in one batch (AttackBench's ``FoolboxMinimalWrapper`` calls ``run`` once per distinct
  eps instead, the same points at a cost of batches of one); ``kwargs`` go to the attack."""
  import foolbox as fb
  import torch

  attack = foolbox_pgd(norm, **kwargs)
  fmodel = fb.PyTorchModel(port, bounds=(0.0, 1.0), device="cpu")
  xt, yt = torch.from_numpy(nchw(x)), torch.from_numpy(y.astype(np.int64))

  def attack_at(eps: np.ndarray) -> np.ndarray:
    eps_t = torch.from_numpy(eps.astype(np.float32)).view(-1, 1, 1, 1)
    return attack.run(fmodel, xt, fb.criteria.Misclassification(yt), epsilon=eps_t).numpy()

  return eps_search(attack_at, norm, port, x, y, search_steps=search_steps, init_eps=init_eps)


def run_torchattacks(which: str, port, x, y) -> np.ndarray:
  import torchattacks
  import torch

  attack = torchattacks.DeepFool(port) if which == "deepfool" else torchattacks.CW(port)
  return attack(torch.from_numpy(nchw(x)), torch.from_numpy(y.astype(np.int64))).detach().numpy()


def run_art(which: str, port, x, y) -> np.ndarray:
  import torch
  from art.attacks.evasion import CarliniL2Method, DeepFool, ElasticNet
  from art.estimators.classification import PyTorchClassifier

  classifier = PyTorchClassifier(model=port, loss=torch.nn.CrossEntropyLoss(),
                                 input_shape=(1, 8, 8), nb_classes=10, clip_values=(0.0, 1.0),
                                 device_type="cpu")
  n = len(x)
  if which == "deepfool":
    attack = DeepFool(classifier, batch_size=n, verbose=False)
  elif which == "cw":
    attack = CarliniL2Method(classifier, batch_size=n, verbose=False)  # its defaults: 10 x 10
  else:
    attack = ElasticNet(classifier, binary_search_steps=5, max_iter=20, batch_size=n,
                        decision_rule="L1", verbose=False)
  return attack.generate(x=nchw(x), y=y.astype(np.int64)).astype(np.float32)


def peer_attacks(norm: str, args) -> dict[str, Callable]:
  """Name -> ``run(port, x, y) -> x_adv NCHW``; the optional peers that import."""
  peers: dict[str, Callable] = {}
  for name, make in foolbox_attacks(norm, args.bb).items():
    if name == "foolbox bb":
      continue  # started from the other Foolbox points, see peer_rows
    peers[name] = functools.partial(lambda make, port, x, y: run_foolbox(make, port, x, y), make)
  if foolbox_attacks(norm, False):
    peers["foolbox pgd (eps search)"] = functools.partial(run_foolbox_eps_search, norm)
  if args.autoattack_path:
    peers["autoattack fab"] = functools.partial(run_fab_reference, args.autoattack_path, norm,
                                                seed=args.seed)
    peers["autoattack apgd-ce (eps search)"] = functools.partial(
        run_apgd_eps_search, args.autoattack_path, norm, seed=args.seed)
    peers["autoattack apgd-t (eps search)"] = functools.partial(
        run_apgd_eps_search, args.autoattack_path, norm, targeted=True, seed=args.seed)
  try:
    import torchattacks  # noqa: F401

    if norm == "l2":
      peers["torchattacks deepfool"] = functools.partial(run_torchattacks, "deepfool")
      peers["torchattacks cw"] = functools.partial(run_torchattacks, "cw")
  except ImportError:
    pass
  try:
    import art  # noqa: F401

    if norm == "l2":
      peers["art deepfool"] = functools.partial(run_art, "deepfool")
      peers["art cw 10x10"] = functools.partial(run_art, "cw")
    if norm == "l1":
      peers["art ead 5x20"] = functools.partial(run_art, "ead")
  except ImportError:
    pass
  return {name: run for name, run in peers.items() if name not in args.skip}


def judge_peer(x_adv_nchw: np.ndarray, norm: str, port, apply_fn, params, x, y) -> dict:
  import torch

  x_adv_nchw = np.asarray(x_adv_nchw, np.float32)
  with torch.no_grad():
    success = port(torch.from_numpy(x_adv_nchw)).argmax(1).numpy() != y
  x_adv = np.ascontiguousarray(x_adv_nchw.transpose(0, 2, 3, 1))
  check_box("peer", x_adv)
  jax_success = np.asarray(jnp.argmax(apply_fn(params, jnp.asarray(x_adv)), -1)) != y
  return {"norms": np.where(success, lp_norms(x_adv, x, norm), np.inf),
          "disagree": int(np.sum(success != jax_success)), "x_adv": x_adv}


# ------------------------------------------------------------------------------------------------
# One model x norm.


def measure(model: str, norm: str, args, x_all, y_all) -> dict:
  apply_fn, params, port_fn = zoo_model(model, args.retrain)
  x, y = x_all[:args.n], y_all[:args.n]
  correct = np.asarray(jnp.argmax(apply_fn(params, jnp.asarray(x)), -1)) == y
  xc, yc = x[correct], y[correct]
  rows: dict[str, dict] = {}

  def full(norms_correct: np.ndarray) -> list[float]:
    norms = np.zeros(len(y))
    norms[correct] = norms_correct
    return [float(v) for v in norms]

  load = [os.getloadavg()[0]]
  for name, make in jaxrobust_attacks(norm).items():
    if args.no_jaxrobust or f"jaxrobust {name}" in args.skip:
      continue
    row = run_jaxrobust(make(), norm, apply_fn, params, xc, yc, args.check_counting, args.seed)
    rows[f"jaxrobust {name}"] = dict(row, norms=full(row["norms"]))
    same = "" if "same_points" not in row else f", same points counted: {row['same_points']}"
    check = row.get("check_count_evaluations")
    if check and (check["forward_mean"], check["backward_mean"]) != (row["forward_mean"],
                                                                      row["backward_mean"]):
      same += f", count_evaluations differs: {check}"
    print(f"  jaxrobust {name}: {row['seconds']:.2f} s (+{row['compile_s']:.1f} compile), "
          f"{props_cell(row)} fwd+bwd per sample ({row['how']}){same}", flush=True)
  load.append(os.getloadavg()[0])
  port_gap = None
  if not args.no_peers:
    import torch

    port = port_fn(params)
    with torch.no_grad():
      port_gap = float(np.max(np.abs(port(torch.from_numpy(nchw(x_all))).numpy()
                                     - np.asarray(apply_fn(params, jnp.asarray(x_all))))))
    tolerance = NEW_PORT_TOLERANCE if model.endswith(NEW_KINDS) else 1e-4
    if model == "mlp-ccat":  # the gate scales the logits below tau, and their rounding, by T
      tolerance *= CCAT_TRAINING["temperature"]
    assert port_gap <= tolerance, f"{model}: the PyTorch port differs by {port_gap}"
    best_fb = None
    for name, run in peer_attacks(norm, args).items():
      counted = counted_port(port)
      torch.manual_seed(args.seed)
      start = time.perf_counter()
      try:
        x_adv = run(counted, xc, yc)
      except Exception as error:  # a peer failing is reported, not fatal
        print(f"  {name}: failed ({type(error).__name__}: {error})", flush=True)
        rows[name] = {"error": f"{type(error).__name__}: {error}"}
        continue
      seconds = time.perf_counter() - start
      props = propagations_of_port(counted, len(yc))
      if args.check_counting:  # the same attack on the bare port: the same points, bitwise
        torch.manual_seed(args.seed)
        props["same_points"] = bool(np.array_equal(np.asarray(run(port, xc, yc), np.float32),
                                                   np.asarray(x_adv, np.float32)))
      judged = judge_peer(x_adv, norm, port, apply_fn, params, xc, yc)
      if name.startswith("foolbox") and "eps search" not in name:  # BB's starts, as before
        better = judged["norms"] if best_fb is None else np.minimum(best_fb[0], judged["norms"])
        take = judged["norms"] <= (best_fb[0] if best_fb is not None else np.inf)
        points = judged["x_adv"] if best_fb is None else np.where(
            take[:, None, None, None], judged["x_adv"], best_fb[1])
        best_fb = (better, points)
      rows[name] = {"norms": full(judged["norms"]), "seconds": seconds, "compile_s": 0.0,
                    "disagree": judged["disagree"], **props}
      same = "" if "same_points" not in props else f", same points bare: {props['same_points']}"
      print(f"  {name}: {seconds:.2f} s, {props_cell(props)} fwd+bwd per sample{same}",
            flush=True)
    if args.bb and "foolbox bb" not in args.skip:
      make = foolbox_attacks(norm, True).get("foolbox bb")
      if make is None or best_fb is None or not np.isfinite(best_fb[0]).all():
        rows["foolbox bb"] = {"error": "no Foolbox starting point for every sample"}
      else:
        counted = counted_port(port)
        start = time.perf_counter()
        try:
          x_adv = run_foolbox(make, counted, xc, yc, starting_points=best_fb[1])
          seconds = time.perf_counter() - start
          props = propagations_of_port(counted, len(yc))  # its start's cost not included
          judged = judge_peer(x_adv, norm, port, apply_fn, params, xc, yc)
          rows["foolbox bb"] = {"norms": full(judged["norms"]), "seconds": seconds,
                                "compile_s": 0.0, "disagree": judged["disagree"], **props}
          print(f"  foolbox bb: {seconds:.2f} s, {props_cell(props)} fwd+bwd per sample",
                flush=True)
        except Exception as error:
          rows["foolbox bb"] = {"error": f"{type(error).__name__}: {error}"}
          print(f"  foolbox bb: failed ({error})", flush=True)
  load.append(os.getloadavg()[0])
  if args.seed:  # another seed's rows merge beside seed 0's (``merge`` keeps the first of a name)
    rows = {seed_name(name, args.seed): row for name, row in rows.items()}
  return {"model": model, "norm": norm, "weights": params_digest(params), "n": int(len(y)),
          "clean_correct": int(correct.sum()), "port_gap": port_gap, "load": load,
          "seed": args.seed, "rows": rows}


def seed_name(name: str, seed: int) -> str:
  """The row name of ``name`` run with ``--seed seed``: unchanged for seed 0 (the rows of every
  earlier file), else suffixed, so the runs of several seeds merge as separate rows.

  >>> seed_name("jaxrobust mns(apgd-t)", 0), seed_name("autoattack apgd-t (eps search)", 2)
  ('jaxrobust mns(apgd-t)', 'autoattack apgd-t (eps search) seed2')
  """
  return f"{name} seed{seed}" if seed else name


# ------------------------------------------------------------------------------------------------
# Tables.


def props_cell(row: dict) -> str:
  """``fwd+bwd per sample``: the mean and, where known, the max over the samples; marked where
  only ``count_evaluations``' totals counted it; ``-`` for a row without counts (files written
  before they were recorded).

  >>> props_cell({"forward_mean": 101.0, "backward_mean": 100.0, "total_max": 201})
  '201.0 (max 201)'
  >>> props_cell({"forward_mean": 12.5, "backward_mean": 10.0, "total_max": None}), props_cell({})
  ('22.5', '-')
  >>> props_cell({"forward_mean": 2.0, "backward_mean": 1.0, "how": "count_evaluations"})
  '3.0 (count_evaluations)'
  """
  if row.get("forward_mean") is None:
    return "-"
  mean = f"{row['forward_mean'] + row['backward_mean']:.1f}"
  if row.get("how") == "count_evaluations":
    return f"{mean} (count_evaluations)"
  return mean if row.get("total_max") is None else f"{mean} (max {row['total_max']})"


def scores(entry: dict) -> dict:
  """Per row: found, median, optimality; plus the ensembles and the best rows of each side."""
  rows = {k: v for k, v in entry["rows"].items() if "norms" in v}
  norms = {k: np.asarray(v["norms"], np.float64) for k, v in rows.items()}
  best = np.min(np.stack(list(norms.values())), axis=0)
  correct = best > 0
  out = {}
  for name, d in norms.items():
    found = np.isfinite(d[correct])
    out[name] = {"found": int(found.sum()), "of": int(correct.sum()),
                 "median": float(np.median(d[correct])), "optimality": optimality(d, best),
                 "seconds": rows[name]["seconds"], "compile_s": rows[name]["compile_s"],
                 "disagree": rows[name]["disagree"], "props": props_cell(rows[name])}
  ours = [k for k in norms if k.startswith("jaxrobust")]
  peers = [k for k in norms if not k.startswith("jaxrobust")]
  ens = {}
  for side, names in (("jaxrobust", ours), ("peers", peers)):
    if names:
      d = np.min(np.stack([norms[k] for k in names]), axis=0)
      ens[side] = {"optimality": optimality(d, best), "found": int(np.isfinite(d[correct]).sum()),
                   "best": max(names, key=lambda k: out[k]["optimality"])}
  return {"rows": out, "ensembles": ens, "eps_max": float(np.max(best[np.isfinite(best)])),
          "errors": {k: v["error"] for k, v in entry["rows"].items() if "error" in v}}


def merge(entries: list[dict]) -> dict[tuple[str, str], dict]:
  """One entry per (model, norm): rows of later entries on the same weights and examples are
  added (a row of the same name is kept from the earlier entry); an entry on other weights
  replaces the earlier."""
  merged: dict[tuple[str, str], dict] = {}
  for e in entries:
    key, old = (e["model"], e["norm"]), merged.get((e["model"], e["norm"]))
    if old and (old["weights"], old["n"]) == (e["weights"], e["n"]):
      merged[key] = dict(old, rows={**e["rows"], **old["rows"]},
                         load=old["load"] + e["load"])
    else:
      merged[key] = e
  return merged


STANDARD_MODELS = ("cnn-plain", "cnn-adversarial", "mlp-plain", "mlp-adversarial", "mlp-trades",
                   "mlp-ibp")
"""The standard and adversarially trained (or certifiably trained) models of the zoo."""
MASKING_MODELS = ("mlp-kwta", "mlp-ccat")
"""The models that obfuscate gradients (k-WTA) or gate their confidence (CCAT-like)."""

GOALS = {
    "single": "best single jaxrobust row >= every peer's best",
    "single_099": "best single jaxrobust row >= 0.99 (standard and adversarially trained models)",
    "ensemble": "jaxrobust ensemble >= peers' ensemble",
    "ensemble_0995": "jaxrobust ensemble >= 0.995",
    "masking": "k-WTA and CCAT-like: best single jaxrobust row >= the best peer",
}
"""Issue #27's goals for the optimality table, by key."""


def goals(merged: dict[tuple[str, str], dict]) -> dict[str, list[tuple[str, bool, str]]]:
  """Issue #27's goals (:data:`GOALS`) cell by cell: ``goal -> [(cell, met, evidence)]`` over the
  (model, norm) cells of ``merged`` (from :func:`merge`) that have both sides.

  >>> entry = {"rows": {
  ...     "jaxrobust a": {"norms": [0.5, 1.0, 0.0], "seconds": 0, "compile_s": 0, "disagree": 0},
  ...     "peer b": {"norms": [0.4, 1.0, 0.0], "seconds": 0, "compile_s": 0, "disagree": 0}}}
  >>> table = goals({("mlp-plain", "l2"): entry})  # not a masking model: no cell there
  >>> {goal: [met for _, met, _ in cells] for goal, cells in table.items()}
  ... # doctest: +NORMALIZE_WHITESPACE
  {'single': [False], 'single_099': [False], 'ensemble': [False], 'ensemble_0995': [False],
   'masking': []}
  >>> table["single"][0][2]
  '0.8333 (jaxrobust a) vs 1.0000 (peer b)'
  """
  out: dict[str, list[tuple[str, bool, str]]] = {goal: [] for goal in GOALS}
  for (model, norm), entry in sorted(merged.items(), key=lambda kv: (NORMS.index(kv[0][1]),
                                                                     MODELS.index(kv[0][0]))):
    s = scores(entry)
    ours, peers = s["ensembles"].get("jaxrobust"), s["ensembles"].get("peers")
    if not (ours and peers):
      continue
    cell = f"{model} {norm}"
    mine, theirs = (s["rows"][side["best"]]["optimality"] for side in (ours, peers))
    single = (mine >= theirs, f"{mine:.4f} ({ours['best']}) vs {theirs:.4f} ({peers['best']})")
    out["single"].append((cell, *single))
    if model in STANDARD_MODELS:
      out["single_099"].append((cell, mine >= 0.99, f"{mine:.4f} ({ours['best']})"))
    out["ensemble"].append((cell, ours["optimality"] >= peers["optimality"],
                            f"{ours['optimality']:.5f} vs {peers['optimality']:.5f}"))
    out["ensemble_0995"].append((cell, ours["optimality"] >= 0.995,
                                 f"{ours['optimality']:.4f} (peers {peers['optimality']:.4f})"))
    if model in MASKING_MODELS:
      out["masking"].append((cell, *single))
  return out


def summarize(entries: list[dict]) -> None:
  latest = merge(entries)
  for norm in NORMS:
    keys = [k for k in latest if k[1] == norm]
    if not keys:
      continue
    print(f"\n#### {norm}: best single attack and ensembles\n")
    print("| model | best jaxrobust | opt. | fwd+bwd per sample | best peer | opt. | "
          "fwd+bwd per sample | jaxrobust ensemble | peers ensemble |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(keys, key=lambda k: MODELS.index(k[0])):
      s = scores(latest[key])
      ours, peers = s["ensembles"].get("jaxrobust"), s["ensembles"].get("peers")
      cell = lambda side: (f"{side['best']} | {s['rows'][side['best']]['optimality']:.4f} | "
                           f"{s['rows'][side['best']]['props']}" if side else "- | - | -")
      print(f"| {key[0]} | {cell(ours)} | {cell(peers)} | "
            f"{ours['optimality'] if ours else float('nan'):.4f} | "
            f"{peers['optimality'] if peers else float('nan'):.4f} |")
    models = sorted({k[0] for k in keys}, key=MODELS.index)
    cells = {(name, m): props_cell(row) for (m, nm), e in latest.items() if nm == norm
             for name, row in e["rows"].items() if "norms" in row}
    if any(c != "-" for c in cells.values()):
      print(f"\n#### {norm}: fwd+bwd per sample (mean over the attacked samples; max where "
            "counted per sample)\n")
      print("| attack | " + " | ".join(models) + " |")
      print("|---|" + "---|" * len(models))
      names = sorted({name for name, _ in cells}, key=lambda k: (not k.startswith("jaxrobust"), k))
      for name in names:
        print(f"| {name} | " + " | ".join(cells.get((name, m), "") for m in models) + " |")
  for key in sorted(latest, key=lambda k: (NORMS.index(k[1]), MODELS.index(k[0]))):
    entry, s = latest[key], scores(latest[key])
    load = " → ".join(f"{v:.1f}" for v in entry["load"])
    print(f"\n#### {key[0]}, {key[1]} (weights {entry['weights']}; {entry['clean_correct']}/"
          f"{entry['n']} clean-correct; eps_max {s['eps_max']:.4f}; port gap "
          f"{entry['port_gap'] if entry['port_gap'] is not None else float('nan'):.1e}; load {load})\n")
    print("| attack | found | median | optimality | fwd+bwd per sample | s (compile) |")
    print("|---|---|---|---|---|---|")
    for name, r in sorted(s["rows"].items(), key=lambda kv: -kv[1]["optimality"]):
      disagree = f" ({r['disagree']} judged otherwise by JAX)" if r["disagree"] else ""
      compile_s = f" ({r['compile_s']:.1f})" if r["compile_s"] else ""
      print(f"| {name} | {r['found']}/{r['of']}{disagree} | {r['median']:.4f} | "
            f"{r['optimality']:.4f} | {r['props']} | {r['seconds']:.2f}{compile_s} |")
    for side, e in s["ensembles"].items():
      print(f"| *{side} ensemble* | {e['found']}/{s['rows'][e['best']]['of']} | | "
            f"{e['optimality']:.4f} | | |")
    for name, error in s["errors"].items():
      print(f"| {name} | failed: {error[:80]} | | | | |")
  table = goals(latest)
  if any(table.values()):
    print("\n#### The goals of issue #27\n")
    print("| goal | cells met | cells missed (evidence) |")
    print("|---|---|---|")
    for goal, cells in table.items():
      missed = "; ".join(f"{cell}: {why}" for cell, met, why in cells if not met) or "-"
      print(f"| {GOALS[goal]} | {sum(met for _, met, _ in cells)} of {len(cells)} | {missed} |")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--n", type=int, default=100, help="first images of digits_examples.npz")
  parser.add_argument("--models", nargs="+", default=None, choices=MODELS,
                      help="default: mlp-plain (every model with --certify or --diagnose)")
  parser.add_argument("--norms", nargs="+", default=list(NORMS), choices=NORMS)
  parser.add_argument("--autoattack-path", default=None, help="checkout of fra31/auto-attack")
  parser.add_argument("--bb", action="store_true", help="also Foolbox's Brendel-Bethge")
  parser.add_argument("--no-peers", action="store_true")
  parser.add_argument("--no-jaxrobust", action="store_true",
                      help="peers only (e.g. a later --bb run, merged by --summarize)")
  parser.add_argument("--skip", nargs="*", default=[], help="row names to leave out")
  parser.add_argument("--retrain", action="store_true",
                      help="retrain mlp-trades, mlp-kwta, mlp-ibp and mlp-ccat")
  parser.add_argument("--certify", action="store_true",
                      help="print clean and IBP-certified accuracy on the test split and exit")
  parser.add_argument("--diagnose", action="store_true",
                      help="print jr.diagnose of each model (one line each) and exit")
  parser.add_argument("--check-counting", action="store_true",
                      help="run every attack also without counting (jaxrobust: also with "
                      "count_evaluations) and record whether the points are the same, bitwise")
  parser.add_argument("--torch-threads", type=int, default=None)
  parser.add_argument("--seed", type=int, default=0,
                      help="jaxrobust's key jax.random.key(seed) and the peers' torch seed; "
                      "rows of a seed other than 0 are named with the suffix ' seedN'")
  parser.add_argument("--out", type=pathlib.Path, default=None, help="append JSON lines here")
  parser.add_argument("--summarize", nargs="+", type=pathlib.Path, default=None,
                      help="print the tables of these JSON-lines files and exit")
  args = parser.parse_args(argv)
  if args.summarize:
    summarize([json.loads(line) for f in args.summarize for line in f.read_text().splitlines()
               if line.strip()])
    return 0
  if args.certify or args.diagnose:
    from jaxrobust.demo.data import load_digits

    _, _, x_test, y_test = load_digits()
    for model in args.models or MODELS:
      if args.retrain and model.split("-")[1] in NEW_KINDS:
        zoo_model(model, retrain=True)
      if args.certify:
        print(certified_accuracy(model, x_test, y_test), flush=True)
      if args.diagnose:
        print(diagnosis_line(model, args.n), flush=True)
    return 0
  print_machine(argv, args.torch_threads)
  x_all, y_all = load_examples()
  for model in args.models or ["mlp-plain"]:
    for norm in args.norms:
      print(f"{model} {norm}:", flush=True)
      entry = measure(model, norm, args, x_all, y_all)
      if args.out:
        with args.out.open("a") as f:
          f.write(json.dumps(entry) + "\n")
      summarize([entry])
  return 0


if __name__ == "__main__":
  sys.exit(main())
