r"""bfloat16 models (``jaxrobust.model.Model.compute_in``) attacked with float32 iterates.

A model computing in bfloat16 has its parameters cast once and its input cast at every call, and
returns float32 logits; the attacks keep float32 iterates, steps and projections. Ground truth on
linear models whose weights are exact in bfloat16: the exact minimal distance :math:`d^*` of the
exact model (float64 arithmetic on those weights) is known, and the bfloat16 arithmetic moves a
logit by at most about

.. math:: \sum_i |w_i| |x_i| 2^{-9} + |z| 2^{-8} \approx 0.03

on these problems (16 features in ``[0, 1]``, weights of size 1: the input rounded to 8
significant bits, the output too), so every point is kept only if its logit margin at
:math:`0.9 d^*` and at :math:`1.1 d^*` is at least 0.15, five times that. Then, whatever the
rounding: no point is adversarial below :math:`0.9 d^*` (a success there is a bug: a point outside
the ball, or a verdict the bfloat16 model does not give), and at :math:`1.1 d^*` the optimal step
is adversarial for the bfloat16 model too, so an attack with its defaults must find it for at
least 99% of the points. A Flax NNX convolutional model runs through ``jr.run`` and a curve in
bfloat16 with its parameters as jit arguments, and every verdict is the bfloat16 model's own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxrobust as jr
from jaxrobust.model import model_of
from tests.ground_truth import linear_problem

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

N = 100
MARGIN = 0.15  # five times the bfloat16 error of a logit on these problems (module docstring)
SCALE = 1.1
ATTACKS = {
    "pgd-linf": lambda: jr.attacks.pgd("linf"),
    "pgd-l2": lambda: jr.attacks.pgd("l2"),
    "apgd-linf": lambda: jr.attacks.apgd("linf"),
}


def linear_apply(params, x):
  w, b = params
  return x.reshape(x.shape[0], -1) @ w + b[None, :]


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_linear_ground_truth_in_bfloat16(name):
  norm = name.split("-")[1]
  p = linear_problem(shape=(16,), classes=2, norm=norm, n=N, seed=3, scale=SCALE,
                     min_margin=MARGIN, candidates=400, dtype=jnp.bfloat16)
  attack = ATTACKS[name]()
  params = (jnp.asarray(p.model.w, jnp.float32), jnp.asarray(p.model.b, jnp.float32))

  @jax.jit
  def run(params, x, y, eps, key):
    model = model_of(jax.tree_util.Partial(linear_apply, params)).compute_in(jnp.bfloat16)
    return jr.run(attack, model, x, y, jr.Budget(eps), key)

  x, y = jnp.asarray(p.x), jnp.asarray(p.y)
  keys = jax.random.split(jax.random.key(0), N)
  above = run(params, x, y, jnp.asarray(SCALE * p.distance, jnp.float32), keys)
  below = run(params, x, y, jnp.asarray((2 - SCALE) * p.distance, jnp.float32), keys)
  for result, factor in ((above, SCALE), (below, 2 - SCALE)):
    assert result.x_adv.dtype == jnp.float32 and result.logits.dtype == jnp.float32
    size = jr.projections.norm(result.x_adv - x, norm)
    assert bool(jnp.all(size <= factor * p.distance * (1 + 1e-5) + 1e-6))
    # Every verdict is the bfloat16 model's on the returned point.
    bf16_logits = linear_apply(tuple(v.astype(jnp.bfloat16) for v in params),
                               result.x_adv.astype(jnp.bfloat16)).astype(jnp.float32)
    np.testing.assert_array_equal(result.success, jnp.argmax(bf16_logits, axis=1) != y)
  assert int(jnp.sum(below.success)) == 0
  assert int(jnp.sum(above.success)) >= 99, int(jnp.sum(above.success))


class ConvNet(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.conv = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
    self.head = nnx.Linear(8 * 8 * 8, 4, rngs=rngs)

  def __call__(self, x):
    h = jax.nn.relu(self.conv(x))
    return self.head(h.reshape(h.shape[0], -1))


def test_nnx_conv_model_in_bfloat16_with_parameters_as_arguments():
  net = ConvNet(nnx.Rngs(0))
  model = model_of(net).compute_in(jnp.bfloat16)
  assert {leaf.dtype for leaf in jax.tree.leaves(model.params)} == {jnp.dtype(jnp.bfloat16)}
  x = jax.random.uniform(jax.random.key(1), (16, 8, 8, 1))
  y = jnp.argmax(model(x), axis=1)
  epsilons = jnp.array([0.0, 0.02, 0.1])
  attack = jr.attacks.pgd("linf", steps=10)

  @jax.jit
  def attack_all(model, x, y, epsilons, key):
    curve = jr.robustness_curve(attack, model, x, y, epsilons, key)
    return curve, jr.run(attack, model, x, y, jr.Budget(epsilons[-1]), key)

  curve, result = attack_all(model, x, y, epsilons, jax.random.key(2))
  # The program computes its convolutions in bfloat16 and takes the weights as arguments.
  jaxpr = jax.make_jaxpr(lambda m, x: m(x))(model, x)
  convs = [e for e in jaxpr.eqns if e.primitive.name == "conv_general_dilated"]
  assert convs and all(v.aval.dtype == jnp.bfloat16 for e in convs for v in e.invars)
  assert not jaxpr.consts
  # Verdicts are the bfloat16 model's: re-predicting the returned points agrees.
  np.testing.assert_array_equal(result.success, jnp.argmax(model(result.x_adv), axis=1) != y)
  assert result.x_adv.dtype == jnp.float32
  robust = np.asarray(curve.robust_accuracy)
  assert robust[0] == 1.0 and np.all(np.diff(robust) <= 0) and robust[-1] < 1.0


def test_every_front_door_computes_in_the_models_dtype():
  """A model whose verdict depends on the dtype it is called with (its logits gain +2 for class
  1 only when its input arrives in bfloat16): ``jr.evaluate``, ``jr.run`` and the training losses'
  attacker see the bfloat16 model's verdict (class 1 everywhere), never the float32 one (class
  0). Regression: ``jr.evaluate`` and the frozen copy of the training losses called the bare
  function, dropping ``compute_in``'s input cast."""

  def apply(w, x):
    shift = 2.0 if x.dtype == jnp.bfloat16 else 0.0
    return x.reshape(x.shape[0], -1) @ w + jnp.array([[0.0, shift]], x.dtype)

  w = jnp.zeros((4, 2), jnp.float32)
  model = model_of(jax.tree_util.Partial(apply, w)).compute_in(jnp.bfloat16)
  x = jnp.full((6, 4), 0.5, jnp.float32)
  y = jnp.ones(6, jnp.int32)
  assert jr.predict(model(x)).tolist() == [1] * 6
  report = jr.evaluate(model, (np.asarray(x), np.asarray(y)), attacks={"fgsm": jr.attacks.fgsm()},
                       epsilons=[0.01], key=jax.random.key(0), batch_size=6, progress=False)
  assert report.clean_accuracy == 1.0 and report.attacks["fgsm"].robust_count.tolist() == [6]
  result = jax.jit(lambda x, y: jr.run(jr.attacks.fgsm(), model, x, y, jr.Budget(0.01),
                                       jax.random.key(0)))(x, y)
  assert not bool(result.success.any())
  roles = jr.training._model.roles(model)
  assert jr.predict(roles.frozen(x)).tolist() == [1] * 6
