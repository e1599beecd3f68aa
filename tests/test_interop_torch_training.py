"""jr.interop models fine-tuned by jr.training and bounded by jr.certify (skipped without torch).

* Training: a converted module's ``params`` are its trainable floats only (BatchNorm's integer
  ``num_batches_tracked`` and running statistics are ``buffers``), so ``jax.grad`` over them
  works; one step of :func:`jr.training.adversarial_loss` and optax SGD, jitted with the model as
  an argument, gives the gradients and new weights that ``torch.autograd`` and ``torch.optim.SGD``
  give for the same loss at the same adversarial points.
* Certification: bound propagation interprets the lowered program; on a converted MLP its bounds
  and certified radii equal those of a hand-written JAX mirror of the same weights, and
  primitives it cannot bound (LeakyReLU's comparison and select, GELU's ``erfc`` and product) are
  all named in one error.
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
optax = pytest.importorskip("optax")
if importlib.util.find_spec("torchax") is None:  # not importorskip: torchax needs the shim first
  pytest.skip("torchax is not installed (pip install 'jaxrobust[torch]')", allow_module_level=True)

import jaxrobust as jr  # noqa: E402
from jaxrobust import certify, training  # noqa: E402
from jaxrobust.model import captured_constants  # noqa: E402
from tests.test_interop_torch import make_net  # noqa: E402

pytestmark = pytest.mark.compile_bound  # small programs: see tests/conftest.py

LR = 0.1


def make_mlp(seed: int = 3, activation=None):
  torch.manual_seed(seed)
  act = torch.nn.ReLU() if activation is None else activation
  return torch.nn.Sequential(torch.nn.Linear(6, 16), act, torch.nn.Linear(16, 8),
                             torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()


def mlp_mirror(weights: dict, x):
  """The MLP above in plain JAX (independent of torchax): ``x W^T + b`` per layer."""
  w = {k: jnp.asarray(v) for k, v in weights.items()}
  h = jax.nn.relu(x @ w["0.weight"].T + w["0.bias"][None])
  h = jax.nn.relu(h @ w["2.weight"].T + w["2.bias"][None])
  return h @ w["4.weight"].T + w["4.bias"][None]


def _data(shape, classes, seed):
  rng = np.random.default_rng(seed)
  return (rng.uniform(0, 1, shape).astype(np.float32),
          rng.integers(0, classes, shape[0]).astype(np.int32))


@jax.jit
def _train_step(model, opt_state, x, y, eps, key):
  """One adversarial-training step; the model (parameters and buffers) is an argument."""
  optimizer = optax.sgd(LR)

  def loss_fn(params):
    return training.adversarial_loss(model.with_params(params), x, y, jr.Budget(eps), key)

  (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(model.params)
  updates, opt_state = optimizer.update(grads, opt_state, model.params)
  return model.with_params(optax.apply_updates(model.params, updates)), opt_state, loss, aux, grads


@pytest.mark.parametrize("name", ["mlp", "cnn_batchnorm"])
def test_adversarial_training_step_matches_torch_autograd(name):
  if name == "mlp":
    net, (x, y), to_torch = make_mlp(), _data((16, 6), 3, 0), lambda v: v
  else:  # conv + eval-mode BatchNorm (non-trivial running statistics) + max-pool + linear
    net, (x, y) = make_net(), _data((16, 8, 8, 2), 4, 1)
    to_torch = lambda v: v.transpose(0, 3, 1, 2)  # NHWC (jaxrobust) -> NCHW (the module)
  model = jr.interop.from_torch(net, to_torch(x[:4]))
  assert all(jnp.issubdtype(v.dtype, jnp.floating) for v in model.params.values())
  if name == "cnn_batchnorm":
    assert model.buffers["bn.num_batches_tracked"].dtype.kind == "i"  # the leaf that broke grad
  closed = jax.make_jaxpr(_train_step.__wrapped__)(model, optax.sgd(LR).init(model.params), x, y,
                                                   np.float32(0.05), jax.random.key(0))
  assert captured_constants(closed) == []  # weights and buffers are arguments, never constants

  new, _, loss, aux, grads = _train_step(model, optax.sgd(LR).init(model.params), x, y,
                                         np.float32(0.05), jax.random.key(0))
  x_adv = np.array(aux.x_adv)  # writable, for torch.from_numpy
  assert np.abs(x_adv - x).max() <= 0.05 + 1e-6 and np.abs(x_adv - x).max() > 0.04
  # PyTorch: the same cross-entropy at the same adversarial points, autograd and SGD.
  sgd = torch.optim.SGD(net.parameters(), lr=LR)
  sgd.zero_grad()
  torch_loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(to_torch(x_adv))),
                                                 torch.from_numpy(y).long())
  torch_loss.backward()
  np.testing.assert_allclose(float(loss), torch_loss.item(), rtol=1e-5)
  named = dict(net.named_parameters())
  assert set(grads) == set(named)
  for key, param in named.items():
    np.testing.assert_allclose(np.asarray(grads[key]), param.grad.numpy(), atol=2e-6, rtol=1e-4,
                               err_msg=key)
  sgd.step()
  for key, param in named.items():
    np.testing.assert_allclose(np.asarray(new.params[key]), param.detach().numpy(), atol=1e-6,
                               err_msg=key)
  for key, buffer in dict(net.named_buffers()).items():  # eval mode: statistics unchanged
    np.testing.assert_array_equal(np.asarray(new.buffers[key]), buffer.numpy())
  # The updated model is still the module: with PyTorch's updated weights, the same logits.
  with torch.no_grad():
    want = net(torch.from_numpy(to_torch(x))).numpy()
  np.testing.assert_allclose(np.asarray(new(x)), want, atol=1e-5, rtol=1e-5)


def test_frozen_parameters_are_buffers_and_compute_in_casts_buffers():
  net = make_net()
  net.conv.weight.requires_grad_(False)  # frozen, as PyTorch users freeze layers
  x, _ = _data((4, 8, 8, 2), 4, 2)
  model = jr.interop.from_torch(net, x.transpose(0, 3, 1, 2))
  assert "conv.weight" in model.buffers and "conv.weight" not in model.params
  half = model.compute_in(jnp.bfloat16)
  assert half.params["fc.weight"].dtype == half.buffers["bn.running_var"].dtype == jnp.bfloat16
  assert half.buffers["bn.num_batches_tracked"].dtype.kind == "i"
  np.testing.assert_allclose(np.asarray(half(x)), np.asarray(model(x)), atol=0.05)


@pytest.mark.parametrize("method", ["ibp", "crown"])
def test_certifiers_bound_the_converted_mlp_as_the_mirror(method):
  net = make_mlp(seed=4)
  x, _ = _data((24, 6), 3, 3)
  model = jr.interop.from_torch(net, x[:4])
  weights = {k: v.detach().numpy() for k, v in net.state_dict().items()}
  mirror = lambda v: mlp_mirror(weights, v)
  y = np.asarray(mirror(x).argmax(1))
  lower, upper = x - 0.02, x + 0.02
  got = certify.margin_bounds(model, y, lower, upper, method=method)
  want = certify.margin_bounds(mirror, y, lower, upper, method=method)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
  bounds = certify.linear_bounds if method == "crown" else certify.interval_bounds
  for a, b in zip(bounds(model, lower, upper), bounds(mirror, lower, upper)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
  budget = jr.Budget(0.0, lower=-1.0, upper=2.0)  # a box wide enough for every radius searched
  got = certify.certify_bounds(model, x, y, budget, method=method, max_eps=0.5, tol=1e-4)
  want = certify.certify_bounds(mirror, x, y, budget, method=method, max_eps=0.5, tol=1e-4)
  np.testing.assert_allclose(np.asarray(got.radius), np.asarray(want.radius), atol=2e-4)
  radii = np.array([0.05, 0.39, 0.6], np.float32)  # IBP certifies 0.37-0.42, CROWN 0.5 (max)
  curve, mirror_curve = (certify.certified_curve(c, y, radii) for c in (got, want))
  np.testing.assert_array_equal(np.asarray(curve.robust), np.asarray(mirror_curve.robust))
  accuracy = np.asarray(curve.robust_accuracy)
  assert accuracy[0] > accuracy[-1]  # the grid is informative


@pytest.mark.parametrize("activation, primitives", [
    (torch.nn.LeakyReLU(0.1),
     ["'ge'", "'select_n' (a choice whose predicate depends on the input)"]),
    (torch.nn.GELU(), ["'erfc'", "'mul' (a product of two input-dependent values is not affine: a "
                                 "gated activation (GELU, SiLU) or a BatchNorm in train mode (use "
                                 "eval mode))"])])
def test_unsupported_lowered_primitives_are_all_named(activation, primitives):
  net = make_mlp(activation=activation)
  x, _ = _data((4, 6), 3, 4)
  model = jr.interop.from_torch(net, x)
  for bounds in (certify.interval_bounds, certify.linear_bounds):
    with pytest.raises(NotImplementedError) as info:
      bounds(model, x - 0.01, x + 0.01)
    message = str(info.value)
    assert message.startswith("primitives " + ", ".join(primitives) + " are not supported")
    assert "bound propagation supports affine layers" in message
