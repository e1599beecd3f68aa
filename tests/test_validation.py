"""Every bad input of FIELD.md's table that applies to run / curves / factories raises clearly."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

W = jnp.asarray(np.random.default_rng(0).normal(size=(6, 3)), jnp.float32)


def logits_fn(x):
  return x.reshape(x.shape[0], -1) @ W


X = jnp.full((4, 2, 3), 0.5, jnp.float32)
Y = jnp.array([0, 1, 2, 0], jnp.int32)
KEY = jax.random.key(0)
PGD = jr.attacks.pgd("linf", steps=2)


def run(x=X, y=Y, eps=0.1, lower=0.0, upper=1.0, attack=PGD, fn=logits_fn, key=KEY, **kw):
  return jr.run(attack, fn, x, y, jr.Budget(eps, lower, upper), key, **kw)


@pytest.mark.parametrize("kwargs, message", [
    (dict(y=Y[:3]), r"Batch sizes differ: x has 4 examples"),
    (dict(y=Y.astype(jnp.float32)), r"y must be a 1-D int array"),
    (dict(y=Y[:, None]), r"y must be a 1-D int array"),
    (dict(y=jnp.array([0, 1, 3, 0])), r"y must lie in \[0, 3\).*min 0, max 3"),
    (dict(y=jnp.array([0, -1, 2, 0])), r"min -1, max 2"),
    (dict(fn=lambda x: logits_fn(x)[:, 0]), r"logits of shape \[B, C\]"),
    (dict(fn=lambda x: logits_fn(x)[:, :1]), r"at least 2 are needed"),
    (dict(eps=-0.1), r"eps must be >= 0"),
    (dict(eps=float("nan")), r"eps contains NaN"),
    (dict(eps=float("inf")), r"only meaningful for minimum-norm attacks"),
    (dict(eps=jnp.full((3,), 0.1)), r"eps must be a scalar or a per-example \[B\] array"),
    (dict(eps=8.0), r"looks like 0-255 units"),
    (dict(eps=1.0), r"covers the whole box"),
    (dict(eps=0.5, lower=0.4, upper=0.6), r"covers the whole box"),
    (dict(x=X * 255), r"observed min 127.5, max 127.5.*normalisation inside the model"),
    (dict(x=X - 0.6), r"must lie in the box"),
    (dict(x=X.at[0, 0, 0].set(jnp.nan)), r"NaN/Inf"),
    (dict(lower=1.0, upper=0.0), r"lower must be < upper"),
    (dict(lower=0.0, upper=float("inf")), r"must be finite"),
    (dict(x=X[:0], y=Y[:0]), r"non-empty batch"),
    (dict(attack=jr.attacks.pgd("l2")), r"eps = 3 covers the whole box|covers the whole box"),
    (dict(key=jnp.zeros((3,), jnp.uint32)), r"key must be"),
    (dict(key=jax.random.split(KEY, 3)), r"Per-example keys must have shape \[B\] = \[4\]"),
])
def test_bad_inputs_raise_value_error(kwargs, message):
  if kwargs.get("attack") is not None and kwargs["attack"].norm == "l2":
    kwargs = dict(kwargs, eps=3.0)  # input size 6: the L2 diameter of [0, 1]^6 is sqrt(6)
  with pytest.raises(ValueError, match=message):
    run(**kwargs)


def _nhwc_conv(x):
  """A channels-last model (as Flax's convolutions): 3 input channels, a 3x3 kernel."""
  kernel = jnp.ones((3, 3, 3, 2), x.dtype) / 27
  h = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  return jnp.stack([h.mean((1, 2, 3)), -h.mean((1, 2, 3)), h[..., 0].mean((1, 2))], axis=-1)


def test_a_model_failing_on_channels_first_images_says_so():
  nhwc = jnp.full((2, 8, 8, 3), 0.5, jnp.float32)
  y = jnp.array([0, 1], jnp.int32)
  run(x=nhwc, y=y, fn=_nhwc_conv)  # channels-last: runs
  data = (np.asarray(nhwc.transpose(0, 3, 1, 2)), np.asarray(y))
  for call in (lambda: run(x=jnp.asarray(data[0]), y=y, fn=_nhwc_conv),
               lambda: jr.evaluate(_nhwc_conv, data, attacks={"pgd": PGD}, epsilons=[0.1],
                                   key=KEY, batch_size=2, progress=False)):
    with pytest.raises(Exception) as caught:  # the model's own error (here XLA's shape check)
      call()
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "looks channels-first (NCHW)" in notes and "x.transpose(0, 2, 3, 1)" in notes
  # A model failing on an input that is not an image: its error, and no layout note.
  failing = lambda v: v.reshape(v.shape[0], 5) @ W
  with pytest.raises(TypeError) as caught:
    run(fn=failing)
  assert "channels-first" not in " ".join(getattr(caught.value, "__notes__", []))


def test_a_model_in_train_mode_is_told_to_use_eval_mode():
  """An nnx BatchNorm in train mode updates its statistics when called: Flax's TraceContextError
  names neither mode; every front door that traces the model adds the note."""
  nnx = pytest.importorskip("flax.nnx")

  class Net(nnx.Module):
    def __init__(self, rngs):
      self.hidden, self.norm = nnx.Linear(6, 8, rngs=rngs), nnx.BatchNorm(8, rngs=rngs)
      self.head = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
      return self.head(jax.nn.relu(self.norm(self.hidden(x.reshape(x.shape[0], -1)))))

  net, x = Net(nnx.Rngs(0)), X.reshape(4, 6)
  calls = {"jr.run": lambda: run(x=x, fn=net),
           "certify_bounds": lambda: jr.certify.certify_bounds(net, x, Y, jr.Budget(0.05))}
  for name, call in calls.items():
    with pytest.raises(Exception) as caught:
      call()
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "put it in eval mode first (nnx: model.eval()" in notes, name
  net.eval()
  run(x=x, fn=net)  # eval mode: runs
  with pytest.raises(NotImplementedError, match="BatchNorm in train mode"):  # IBP of a product
    jr.certify.interval_bounds(lambda v: v * v, x, x + 0.1)


@pytest.mark.parametrize("layer", ["batch_norm", "dropout"])
def test_a_linen_model_in_train_mode_is_told_to_use_eval_mode(layer):
  """linen's errors for train mode (BatchNorm updating an immutable ``batch_stats``: a
  ModifyScopeVariableError; Dropout without an ``rngs`` stream: an InvalidRngError) get the note."""
  linen = pytest.importorskip("flax.linen")

  class Net(linen.Module):
    @linen.compact
    def __call__(self, x, train: bool = True):
      h = linen.Dense(8)(x.reshape(x.shape[0], -1))
      if layer == "batch_norm":
        h = linen.BatchNorm(use_running_average=not train)(h)
      else:
        h = linen.Dropout(0.3, deterministic=not train)(h)
      return linen.Dense(3)(jax.nn.relu(h))

  x = X.reshape(4, 6)
  variables = Net().init(jax.random.key(0), x, train=False)
  with pytest.raises(Exception) as caught:
    run(x=x, fn=functools.partial(Net().apply, variables))  # train=True: the user forgot it
  notes = " ".join(getattr(caught.value, "__notes__", []))
  assert "linen: use_running_average=True, deterministic=True" in notes
  run(x=x, fn=functools.partial(Net().apply, variables, train=False))  # eval mode: runs


def test_integer_x_is_a_type_error():
  with pytest.raises(TypeError, match=r"float array.*astype"):
    run(x=jnp.full((4, 2, 3), 128, jnp.int32))


def test_large_eps_allowed_explicitly():
  result = run(eps=1.0, allow_large_eps=True)
  assert np.asarray(result.success).shape == (4,)
  # The minimum-norm curve too (it checked its largest eps without the option).
  fmn = jr.attacks.fmn("linf", steps=2)
  curve = jr.robustness_curve(fmn, logits_fn, X, Y, jnp.array([0.1, 1.0]), KEY,
                              allow_large_eps=True)
  assert curve.robust_accuracy.shape == (2,)
  with pytest.raises(ValueError, match="covers the whole box"):
    jr.robustness_curve(fmn, logits_fn, X, Y, jnp.array([0.1, 1.0]), KEY)


def test_switches_are_bools_not_truthy_values():
  """``allow_large_eps="no"`` is truthy: it ran at eps 8; now refused, as evaluate's switches."""
  with pytest.raises(ValueError, match="allow_large_eps must be a bool"):
    run(eps=8.0, allow_large_eps="no")
  with pytest.raises(ValueError, match="allow_large_eps must be a bool"):
    jr.robustness_curve(PGD, logits_fn, X, Y, jnp.array([0.1]), KEY, allow_large_eps=1)
  data = (np.asarray(X), np.asarray(Y))
  for switch in ("progress", "diagnose", "keep_per_example", "allow_large_eps"):
    with pytest.raises(ValueError, match=f"{switch} must be a bool"):
      jr.evaluate(logits_fn, data, attacks=PGD, epsilons=[0.1], key=KEY, batch_size=4,
                  **{"progress": False, switch: "no"})


def test_targeting_mistakes():
  targeted = jr.attacks.pgd("linf", steps=2, targeted=True)
  with pytest.raises(ValueError, match="pass target="):
    run(attack=targeted)
  with pytest.raises(ValueError, match="takes no targets"):
    run(target=jnp.array([1, 2, 0, 1]))
  with pytest.raises(ValueError, match="target equals the true label y for 1 example"):
    run(attack=targeted, target=jnp.array([1, 2, 2, 1]))
  with pytest.raises(ValueError, match=r"target must lie in \[0, 3\)"):
    run(attack=targeted, target=jnp.array([1, 2, 5, 1]))


def test_too_few_classes_for_dlr():
  two = lambda x: logits_fn(x)[:, :2]
  y = jnp.array([0, 1, 1, 0])
  with pytest.raises(ValueError, match="dlr needs at least 3 classes"):
    run(fn=two, y=y, attack=jr.attacks.pgd("linf", steps=2, loss="dlr"))
  with pytest.raises(ValueError, match="targeted_dlr needs at least 4 classes"):
    run(attack=jr.attacks.pgd("linf", steps=2, loss="dlr", targeted=True),
        target=jnp.array([1, 2, 0, 1]))


@pytest.mark.parametrize("factory, message", [
    (lambda: jr.attacks.pgd("l3"), r"Unknown norm 'l3'; supported: 'linf', 'l2', 'l1'"),
    (lambda: jr.attacks.fgsm("Linf"), r"Unknown norm 'Linf'"),
    (lambda: jr.attacks.pgd(loss="hinge"), r"Unknown loss 'hinge'; supported: 'ce', 'margin'"),
    (lambda: jr.attacks.pgd(steps=0), r"steps must be an int >= 1"),
    (lambda: jr.attacks.pgd(steps=2.5), r"steps must be an int >= 1"),
    (lambda: jr.attacks.pgd(restarts=0), r"restarts must be an int >= 1"),
    (lambda: jr.attacks.pgd(step_size=0.0), r"step_size must be a finite number > 0"),
    (lambda: jr.attacks.pgd(step_size=-1.0), r"step_size must be a finite number > 0"),
    (lambda: jr.attacks.pgd("l1", l1_sparsity=0.0), r"l1_sparsity must be None or in \(0, 1\]"),
    (lambda: jr.attacks.pgd("linf", l1_sparsity=0.5), r"l1_sparsity is an option of the L1 "
                                                      r"attack; got it with norm 'linf'"),
    (lambda: jr.attacks.fgsm("l2", l1_sparsity=0.5), r"got it with norm 'l2'"),
    (lambda: jr.attacks.pgd(steps=4, step_size=lambda t: 0.5 - 0.25 * t.astype(jnp.float32)),
     r"step_size\(t\) must be finite and >= 0 .* got step_size\(3\) = -0.25"),
    (lambda: jr.attacks.pgd(steps=4, step_size=lambda t: jnp.where(t == 4, jnp.nan, 0.1)),
     r"got step_size\(4\) = nan"),
])
def test_bad_factory_options(factory, message):
  with pytest.raises(ValueError, match=message):
    factory()


def test_curve_bad_inputs():
  curve = lambda eps, **kw: jr.robustness_curve(PGD, logits_fn, X, Y, eps, KEY, **kw)
  with pytest.raises(ValueError, match=r"epsilons must be a non-empty 1-D array"):
    curve(jnp.zeros((2, 2)))
  with pytest.raises(ValueError, match=r"epsilons must be >= 0"):
    curve(jnp.array([0.0, -0.1]))
  with pytest.raises(ValueError, match=r"looks like 0-255 units"):
    curve(jnp.array([0.0, 2.0, 8.0]))
  with pytest.raises(ValueError, match=r"eps_batch_size must be None, 0 or a positive int"):
    curve(jnp.array([0.0, 0.1]), eps_batch_size=-1)


def test_shape_checks_still_run_inside_jit_and_value_checks_do_not_break_it():
  jitted = jax.jit(lambda x, y, eps: run(x=x, y=y, eps=eps))
  with pytest.raises(ValueError, match="Batch sizes differ"):
    jitted(X, Y[:3], 0.1)
  # Values are not inspected under jit: an out-of-range eps traces fine (documented behaviour;
  # jr.check_inputs is the host-side validator for that).
  assert jitted(X, Y, jnp.float32(0.1)).success.shape == (4,)
  with pytest.raises(ValueError, match="looks like 0-255"):
    jr.check_inputs(logits_fn, X, Y, jr.Budget(8.0), norm="linf")


@pytest.mark.parametrize("kwargs, value, message", [
    (dict(low=0.0, low_open=True), 0.0, r"beta must be a finite number > 0, got 0.0"),
    (dict(low=1.0), 0.5, r"beta must be a finite number >= 1, got 0.5"),
    (dict(low=0.0, high=1.0, low_open=True), 1.5, r"beta must be a finite number in \(0, 1\]"),
    (dict(low=0.0, high=1.0, high_open=True), 1.0, r"beta must be a finite number in \[0, 1\)"),
    (dict(high=2.0), 3.0, r"beta must be a finite number <= 2"),
    (dict(low=0.0), float("nan"), r"finite number >= 0, got nan"),
    (dict(low=0.0), float("inf"), r"finite number >= 0, got inf"),
    (dict(), True, r"beta must be a finite number \(not NaN or inf\), got True"),
    (dict(), "0.5", r"got '0.5'"),
])
def test_check_number_refuses(kwargs, value, message):
  from jaxrobust._validation import check_number

  with pytest.raises(ValueError, match=message):
    check_number("beta", value, **kwargs)


def test_check_number_and_check_bool_accept():
  from jaxrobust._validation import check_bool, check_number

  assert check_number("beta", np.float32(0.5), low=0.0, high=1.0, low_open=True) == 0.5
  assert check_number("beta", 1, low=0.0, high=1.0) == 1.0 and check_number("beta", -3) == -3.0
  assert check_bool("targeted", np.bool_(True)) is True
  for bad in (1, "yes", None):
    with pytest.raises(ValueError, match="targeted must be a bool"):
      check_bool("targeted", bad)


def test_a_bare_eps_instead_of_a_budget_says_how_to_write_one():
  message = r"budget must be a jr.Budget\(eps, lower=0.0, upper=1.0\) .* got float"
  with pytest.raises(TypeError, match=message):
    jr.run(PGD, logits_fn, X, Y, 0.1, KEY)
  with pytest.raises(TypeError, match="got ArrayImpl"):
    jr.check_inputs(logits_fn, X, Y, jnp.float32(0.1), norm="linf")
  with pytest.raises(TypeError, match="got dict"):
    jr.certify.certify_bounds(logits_fn, X, Y, {"eps": 0.1})
  # Tuples stay accepted: (eps,), (eps, lower, upper).
  a, b = jr.run(PGD, logits_fn, X, Y, (0.1,), KEY), run(eps=0.1)
  np.testing.assert_array_equal(np.asarray(a.x_adv), np.asarray(b.x_adv))


def test_a_model_written_for_one_batch_size_is_named_as_such():
  """The engine calls the model on chunks of rows: a model that reshapes to a fixed batch fails
  there with a raw shape error, which the front doors turn into what to change."""
  fixed = lambda w, x: x.reshape(4, -1) @ w  # the batch of X, hard-wired
  message = (r"logits_fn works on x's batch of 4 but fails on a batch of 1: logits_fn must "
             r"accept x \[B, \.\.\.\] for any batch size B")
  with pytest.raises(ValueError, match=message):
    jax.jit(lambda w, x, y, key: jr.run(PGD, functools.partial(fixed, w), x, y, jr.Budget(0.1),
                                        key, chunk_size=2))(W, X, Y, KEY)
  with pytest.raises(ValueError, match=message):
    jax.jit(lambda w, x, y, eps, key: jr.robustness_curve(
        PGD, functools.partial(fixed, w), x, y, eps, key, chunk_size=2))(
            W, X, Y, jnp.array([0.0, 0.1]), KEY)
  # A model that works on one row keeps its own error.
  def odd(x):
    if x.shape[0] == 2:
      raise KeyError("not about the batch size")
    return logits_fn(x)
  with pytest.raises(KeyError, match="not about the batch size"):
    jr.run(PGD, odd, X, Y, jr.Budget(0.1), KEY, chunk_size=2)
