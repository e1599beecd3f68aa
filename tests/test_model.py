"""The model concept (``jaxrobust.model``): a logits function taken apart into its parameters and
the code that calls it, the same logits whatever its kind, parameters as jit arguments (one
compile for new weights), frozen and pure copies, and the warning when weights or data would be
compiled into a program as constants."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxrobust as jr
from jaxrobust import model as model_lib
from jaxrobust.model import CapturedConstantsWarning, Model, model_of

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

KEY = jax.random.key(0)


def apply(params, x, *, scale):
  return scale * (jnp.tanh(x @ params["w"]) @ params["v"] + params["b"][None, :])


def make_params(seed: int) -> dict:
  kw, kv = jax.random.split(jax.random.key(seed))
  # A NumPy leaf too: both kinds of arrays are parameters.
  return {"w": jax.random.normal(kw, (6, 8)), "v": jax.random.normal(kv, (8, 3)),
          "b": np.arange(3, dtype=np.float32)}


class Net(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(6, 8, rngs=rngs)
    self.head = nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x):
    return self.head(jnp.tanh(self.hidden(x)))


def test_every_kind_gives_the_logits_of_the_function_it_came_from():
  x = jax.random.uniform(KEY, (5, 6))
  params = make_params(1)
  partial = functools.partial(apply, params, scale=2.0)
  net = Net(nnx.Rngs(0))
  closure = lambda v: partial(v) + 1.0
  for logits_fn, kind, leaves in [(partial, "partial", 3), (net, "nnx", 4),
                                  (closure, "function", 0)]:
    model = model_of(logits_fn)
    assert model.kind == kind and len(jax.tree.leaves(model.params)) == leaves
    np.testing.assert_array_equal(model(x), logits_fn(x))
    np.testing.assert_array_equal(model.as_callable()(x), logits_fn(x))
    assert model_of(model) is model
  # The static keyword stays code, the arrays are the parameters (NumPy leaves included).
  model = model_of(partial)
  assert model.spec[3] == (2.0,)
  other = make_params(2)
  np.testing.assert_array_equal(model.apply(jax.tree.leaves(other), x),
                                apply(other, x, scale=2.0))


def test_parameters_are_jit_arguments_new_weights_reuse_the_program():
  x = jax.random.uniform(KEY, (5, 6))
  logits = jax.jit(lambda model, x: model(x))
  for seed in (1, 2):
    params = make_params(seed)
    out = logits(model_of(functools.partial(apply, params, scale=1.0)), x)
    np.testing.assert_allclose(out, apply(params, x, scale=1.0), rtol=1e-6, atol=1e-6)
  for seed in (3, 4):
    net = Net(nnx.Rngs(seed))
    np.testing.assert_allclose(logits(model_of(net), x), net(x), rtol=1e-6, atol=1e-6)
  assert logits._cache_size() == 2  # one program per architecture, not per weight set
  # Nothing of the weights is in the program: no constants of their size.
  jaxpr = jax.make_jaxpr(lambda m, x: m(x))(model_of(Net(nnx.Rngs(5))), x)
  assert not model_lib.captured_constants(jaxpr)


def test_frozen_stops_parameter_gradients_and_pure_keeps_them():
  x = jax.random.uniform(KEY, (5, 6))

  def loss(params, which):
    model = model_of(functools.partial(apply, params, scale=1.0))
    return jnp.sum(getattr(model, which)()(x))

  params = make_params(1)
  frozen = jax.grad(loss)(params, "frozen")
  pure = jax.grad(loss)(params, "pure")
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(frozen))
  assert all(float(jnp.abs(g).max()) > 0.0 for g in jax.tree.leaves(pure))


def _linear(scale: float = 1.0):
  w = scale * jnp.ones((64, 2)).at[:, 1].set(-1.0)
  return lambda v: v.reshape(v.shape[0], -1) @ w, w


@pytest.fixture
def small_threshold(monkeypatch):
  """A 2 KiB threshold, so that small test models exercise the warning."""
  monkeypatch.setattr(model_lib, "CONSTANT_WARNING_BYTES", 2048)


def test_warns_when_weights_or_data_would_be_compiled_in_not_for_arguments(small_threshold):
  logits_fn, w = _linear()  # 512 bytes of weights: below the threshold
  extra = jnp.ones((32, 32))  # 4 KiB more
  big_fn = lambda v: logits_fn(v) + 0.0 * jnp.sum(extra)
  x = jax.random.uniform(KEY, (4, 64)) * 0.5 + 0.25
  y = jnp.zeros((4,), jnp.int32)
  attack = jr.attacks.fgsm("linf")
  run = lambda f: (lambda x, y, key: jr.run(attack, f, x, y, jr.Budget(0.01), key))
  with warnings.catch_warnings():
    warnings.simplefilter("error", CapturedConstantsWarning)
    jax.jit(run(logits_fn)).trace(x, y, KEY)  # small: silent (traced: the check is there)
    jr.run(attack, big_fn, x, y, jr.Budget(0.01), KEY)  # eager: nothing is compiled in
    apply_w = lambda p, v: v.reshape(v.shape[0], -1) @ p  # the weights as an argument
    jax.jit(lambda p, x, y, key: jr.run(attack, functools.partial(apply_w, p), x, y,
                                        jr.Budget(0.01), key)).trace(w * 1.0, x, y, KEY)
  with pytest.warns(CapturedConstantsWarning, match=r"jr\.run: the model captures") as caught:
    jax.jit(run(big_fn)).trace(x, y, KEY)
  assert "arguments of the jitted function" in str(caught[0].message)
  big_x = jax.random.uniform(KEY, (16, 64)) * 0.5 + 0.25  # 4 KiB of data closed over
  with pytest.warns(CapturedConstantsWarning,
                    match=r"jr\.robustness_curve: .* and 4\.0 KiB of inputs"):
    jax.jit(lambda key: jr.robustness_curve(attack, logits_fn, big_x, jnp.zeros((16,), jnp.int32),
                                            jnp.array([0.01]), key)).trace(KEY)
  data = (np.asarray(big_x), np.zeros((16,), np.int32))
  with pytest.warns(CapturedConstantsWarning, match=r"jr\.evaluate: the model captures") as caught:
    jr.evaluate(big_fn, data, attacks={"fgsm": attack}, epsilons=[0.01], key=KEY,
                batch_size=8, progress=False)
  # jr.evaluate's caller writes no jitted function: the fix is a partial or a module.
  message = str(caught[0].message)
  assert "functools.partial" in message and "jitted function" not in message
  with warnings.catch_warnings():
    warnings.simplefilter("error", CapturedConstantsWarning)
    jr.evaluate(functools.partial(apply_w, w * 1.0), data, attacks={"fgsm": attack},
                epsilons=[0.01], key=KEY, batch_size=8, progress=False)


def test_model_is_a_pytree_of_its_parameters_only():
  params = make_params(1)
  model = model_of(functools.partial(apply, params, scale=1.0))
  leaves, treedef = jax.tree.flatten(model)
  assert len(leaves) == 3
  rebuilt = jax.tree.unflatten(treedef, [2 * v for v in leaves])
  assert isinstance(rebuilt, Model) and rebuilt.identity == model.identity
