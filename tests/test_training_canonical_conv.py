"""jr.training on CPU with convolutional models: the inner attack loops run with canonical
convolutions (jaxrobust.engine.canonical_conv) and the losses, their parameter gradients, the
adversarial points and the robust counts are those of the loops without the rewrite.

XLA:CPU canonicalises convolutions only in a program's entry computation, so without the rewrite
every input-gradient convolution of an attack step (``dim_labels=b01f_01oi->b01f``, and any NCHW
convolution) runs on the slow generic emitter inside the user's jitted training step
(benchmarks/bench_training_conv.py). One compile per model (NHWC function, NCHW closure, NNX
module with BatchNorm) and mode (rewrite on, rewrite off), its losses with their gradients in one
program; the regression check reads the optimised HLO of the same programs.
"""

from __future__ import annotations

import contextlib
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxrobust as jr
from jaxrobust import training
from jaxrobust.engine import canonical_conv

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

B, C, EPS = 4, 3, 0.1
PGD = jr.attacks.pgd("linf", steps=3)
LAYOUTS = {"nhwc": ("NHWC", "HWIO", "NHWC"), "nchw": ("NCHW", "OIHW", "NCHW")}


def conv_apply(params, x, *, layout):
  """A 3x3 stride-2 convolution (4 channels), ReLU and a dense layer, in ``layout``."""
  h = lax.conv_general_dilated(x, params["kernel"], (2, 2), "SAME",
                               dimension_numbers=LAYOUTS[layout])
  return jax.nn.relu(h).reshape(h.shape[0], -1) @ params["dense"] + params["bias"][None]


def conv_problem(layout):
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(3, 3, 1, 4)) / 2
  params = {"kernel": kernel if layout == "nhwc" else kernel.transpose(3, 2, 0, 1),
            "dense": rng.normal(size=(4 * 4 * 4, C)) / 4, "bias": rng.normal(size=C) / 10}
  x = rng.uniform(size=(B, 8, 8, 1))
  x = x if layout == "nhwc" else x.transpose(0, 3, 1, 2)
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
  return params, jnp.asarray(x, jnp.float32), jnp.arange(B, dtype=jnp.int32) % C


def trades_formula(params, x, y, x_adv, *, layout):
  """TRADES' outer loss at a given point, written here (beta 6), for the gradient's reference."""
  log_p = jax.nn.log_softmax(conv_apply(params, x, layout=layout), axis=-1)
  log_q = jax.nn.log_softmax(conv_apply(params, x_adv, layout=layout), axis=-1)
  ce = -jnp.mean(jnp.sum(jnp.where(jax.nn.one_hot(y, C) > 0, log_p, 0.0), axis=-1))
  return ce + 6.0 * jnp.mean(jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1))


def function_losses(params, x, y, eps, key, *, layout):
  """Losses' values, parameter gradients and points, split between the two models so that each
  runs both inner loops (the engine's attack loop and the Gaussian-start ascent): the NHWC model
  as a ``partial`` (frozen parameters in the attack), the NCHW one as a closure (its parameters
  traced through the rewritten attack under ``jax.value_and_grad``)."""
  budget = jr.Budget(eps)
  if layout == "nhwc":
    model = lambda p: functools.partial(conv_apply, p, layout=layout)
    runs = {
        "adversarial": lambda m: training.adversarial_loss(m, x, y, budget, key, attack=PGD),
        "mart": lambda m: training.mart_loss(m, x, y, budget, key),
    }
  else:
    model = lambda p: (lambda v: conv_apply(p, v, layout=layout))
    runs = {
        "trades": lambda m: training.trades_loss(m, x, y, budget, key, steps=3),
        "trades_l2": lambda m: training.trades_loss(m, x, y, jr.Budget(4 * eps), key, steps=3,
                                                    norm="l2"),
        "mart_pgd": lambda m: training.mart_loss(m, x, y, budget, key, attack=PGD),
    }
  out = {}
  for name, run in runs.items():
    (loss, aux), grad = jax.value_and_grad(lambda p: run(model(p)), has_aux=True)(params)
    out[name] = {"loss": loss, "grad": grad, "x_adv": aux.x_adv}
  if layout == "nhwc":
    counts = training.robust_counts(model(params), x, y, budget, key, attack=PGD)
    out["counts"] = {"verdicts": (counts.clean_correct, counts.robust, counts.success),
                     "perturbation": counts.success_perturbation_sum}
  else:  # the gradient flows exactly: the formula's at the loss's own point
    loss, grad = jax.value_and_grad(trades_formula)(params, x, y, out["trades_l2"]["x_adv"],
                                                    layout=layout)
    out["trades_l2_formula"] = {"loss": loss, "grad": grad}
  return out


def nnx_net():
  from flax import nnx

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.conv = nnx.Conv(1, 4, (3, 3), strides=(2, 2), rngs=rngs)
      self.norm = nnx.BatchNorm(4, momentum=0.5, rngs=rngs)
      self.dense = nnx.Linear(4 * 4 * 4, C, rngs=rngs)

    def __call__(self, x):
      h = nnx.relu(self.norm(self.conv(x)))
      return self.dense(h.reshape(h.shape[0], -1))

  return Net(nnx.Rngs(0))


def nnx_losses(graphdef, state, x, y, eps, key):
  """Madry and TRADES on a train-mode NNX model attacked through an eval-mode view (the usual
  recipe): values, gradients, points and the BatchNorm statistics the outer passes update."""
  from flax import nnx

  budget, out = jr.Budget(eps), {}
  for name, loss in (("adversarial", training.adversarial_loss), ("trades", training.trades_loss)):
    model = nnx.merge(graphdef, state)
    view = nnx.view(model, use_running_average=True)
    (value, aux), grad = nnx.value_and_grad(
        lambda m: loss(m, x, y, budget, key, attack_logits_fn=view), has_aux=True)(model)
    out[name] = {"loss": value, "grad": nnx.to_pure_dict(grad), "x_adv": aux.x_adv,
                 "stats": nnx.to_pure_dict(nnx.state(model, nnx.BatchStat))}
  return out


@contextlib.contextmanager
def rewrite(enabled: bool):
  """The engine's and jr.training's "needs canonical convolutions" test answering no when not
  ``enabled`` (both ask ``canonical_conv.has_convolution``)."""
  with pytest.MonkeyPatch.context() as patch:
    if not enabled:
      patch.setattr(canonical_conv, "has_convolution", lambda *args: False)
    yield


@functools.lru_cache(maxsize=None)
def compiled_step(model: str, enabled: bool):
  """``(outputs, optimised HLO text)`` of the jitted step, traced with the rewrite on or off."""
  key, eps = jax.random.key(3), jnp.float32(EPS)
  if model == "nnx":
    from flax import nnx

    graphdef, state = nnx.split(nnx_net())
    x = jnp.asarray(np.random.default_rng(1).uniform(size=(B, 8, 8, 1)), jnp.float32)
    y = jnp.arange(B, dtype=jnp.int32) % C
    step, args = functools.partial(nnx_losses, graphdef), (state, x, y, eps, key)
  else:
    step, args = functools.partial(function_losses, layout=model), (*conv_problem(model), eps, key)
  with rewrite(enabled):
    compiled = jax.jit(step).trace(*args).lower().compile()
  return jax.device_get(compiled(*args)), compiled.as_text()


def loop_body_noncanonical_convolutions(hlo: str) -> int:
  """Convolutions outside the entry computation (loop bodies and their callees) whose dimension
  labels are not XLA:CPU's canonical ``b01f_01io->b01f``."""
  count = 0
  for computation in re.split(r"\n\s*\n", hlo):
    if computation.lstrip().startswith("ENTRY"):
      continue
    for labels in re.findall(r"convolution\(.*?dim_labels=(\S+?)[,\s]", computation):
      count += labels != "b01f_01io->b01f"
  return count


MODELS = ["nhwc", "nchw", "nnx"]


def assert_close(got, want, rtol, atol, what):
  for u, v in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(u, v, rtol=rtol, atol=atol, err_msg=what)


ROUNDED = {"trades_l2"}
"""Losses whose inner steps are continuous in the gradient (normalised L2 steps): their points
carry the convolutions' float rounding, which differs between XLA:CPU's generic emitter and the
canonical (Eigen) one when the model is NCHW (measured: 9e-6 in x_adv after 3 steps). Sign steps
(PGD, TRADES and MART in Linf) absorb it: their points are equal."""


@pytest.mark.parametrize("model", MODELS)
def test_losses_gradients_and_points_are_those_of_the_loops_without_the_rewrite(model):
  rewritten, _ = compiled_step(model, True)
  plain, _ = compiled_step(model, False)
  assert rewritten.keys() == plain.keys()
  for name in rewritten:
    if name == "counts":  # equal verdicts, the same points
      np.testing.assert_array_equal(rewritten[name]["verdicts"], plain[name]["verdicts"])
      np.testing.assert_allclose(rewritten[name]["perturbation"], plain[name]["perturbation"],
                                 rtol=1e-6)
      continue
    if name.endswith("_formula"):
      continue
    # The inner attack's point (a stop_gradient input of the outer passes) is the same...
    rounded = name in ROUNDED
    assert_close(rewritten[name]["x_adv"], plain[name]["x_adv"], 0, 5e-5 if rounded else 1e-6,
                 f"{name} x_adv")
    # ...so the loss, its parameter gradient and the BatchNorm updates are too.
    for part in ("loss", "grad", "stats"):
      assert_close(rewritten[name].get(part), plain[name].get(part), 1e-4 if rounded else 1e-6,
                   2e-5 if rounded else 1e-7, f"{name} {part}")
  if "trades_l2_formula" in rewritten:
    # Through the rewritten attack (its parameters traced as a closure), the gradient is the
    # formula's at the loss's own point, with or without the rewrite (to the rounding of the
    # formula's other order of operations: 1.2e-7 seen on gradients of size 0.3).
    for result in (rewritten, plain):
      assert_close(result["trades_l2"]["loss"], result["trades_l2_formula"]["loss"], 1e-6, 0,
                   "trades_l2 formula loss")
      assert_close(result["trades_l2"]["grad"], result["trades_l2_formula"]["grad"], 1e-6, 1e-6,
                   "trades_l2 formula grad")


@pytest.mark.parametrize("model", MODELS)
def test_training_step_loops_hold_only_canonical_convolutions(model):
  # Not vacuous: without the rewrite the attack loops hold the input gradient's 01oi convolution
  # (and, in NCHW, every convolution), which XLA:CPU leaves to its generic emitter.
  assert loop_body_noncanonical_convolutions(compiled_step(model, False)[1]) > 0
  assert loop_body_noncanonical_convolutions(compiled_step(model, True)[1]) == 0
