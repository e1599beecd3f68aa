"""jr.diagnose: the static gradient-masking diagnosis (issue #27, item 4).

Each planted mask is a small model whose masking line carries the comment ``# planted``: the test
reads that line's number from the source and expects exactly one finding, of the right kind,
severity and primitive, located there. Clean models (an MLP with JAX's activations, a conv net,
Flax linen and NNX) report nothing; masks off the path from x to the logits are not reported;
masks inside jit, scan, cond, checkpoint and custom-derivative calls are found where they were
written. Nothing here compiles or runs a model: diagnose only traces (make_jaxpr).
"""

from __future__ import annotations

import functools
import inspect
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen, nnx

import jaxrobust as jr
from jaxrobust import diagnosis

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

RNG = np.random.default_rng(0)
W1 = RNG.normal(size=(6, 8)).astype(np.float32)
W2 = RNG.normal(size=(8, 4)).astype(np.float32)
X = jax.ShapeDtypeStruct((2, 6), jnp.float32)
IMAGES = jax.ShapeDtypeStruct((2, 8, 8, 1), jnp.float32)
KEY = jax.random.key(0)
HERE = pathlib.Path(__file__).resolve()


def planted_line(fn) -> int:
  """The line number of the line of ``fn``'s source marked ``# planted``."""
  lines, start = inspect.getsourcelines(fn)
  (index,) = [i for i, text in enumerate(lines) if "# planted" in text]
  return start + index


def only(found: diagnosis.Diagnosis) -> diagnosis.Finding:
  assert len(found) == 1, found.summary()
  return found[0]


def assert_at(finding: diagnosis.Finding, fn) -> None:
  assert pathlib.Path(finding.file).resolve() == HERE, finding.location
  assert finding.line == planted_line(fn), (finding.location, planted_line(fn))


# ------------------------------------------------------------------------------------------------
# Planted masks, one per kind.


def stop_gradient_model(x):
  h = jnp.tanh(x @ W1)
  h = h + jax.lax.stop_gradient(h * h)  # planted
  return h @ W2


def round_model(x):
  q = jnp.round(x * 255.0) / 255.0  # planted
  return jnp.tanh(q @ W1) @ W2


def floor_model(x):
  return jnp.floor(x @ W1 * 4.0) @ W2  # planted


def ceil_model(x):
  h = x @ W1
  return jnp.ceil(h) @ W2 + h @ W2  # planted


def sign_model(x):
  h = jnp.sign(x @ W1)  # planted
  return h @ W2


def argmax_model(x):
  h = x @ W1
  index = jnp.argmax(h, axis=-1, keepdims=True)  # planted
  return jnp.take_along_axis(h, index, axis=-1) * jnp.tanh(h @ W2)


def argsort_model(x):
  h = x @ W1
  order = jnp.argsort(h, axis=-1)  # planted
  return jnp.take_along_axis(h, order, axis=-1) @ W2


def top_k_indices_model(x):
  h = jax.nn.relu(x @ W1)
  _, indices = jax.lax.top_k(h, 3)  # planted
  return (h * jax.nn.one_hot(indices, 8, dtype=h.dtype).sum(axis=-2)) @ W2


def uint8_model(x):
  pixels = (x * 255.0).astype(jnp.uint8)  # planted
  return (pixels.astype(jnp.float32) / 255.0) @ W1 @ W2


def bool_cast_model(x):
  gate = (x @ W1).astype(jnp.bool_)  # planted
  return jnp.where(gate, 1.0, 0.5) * (x @ W1) @ W2


def comparison_model(x):
  h = x @ W1
  h = jnp.where(h > 0.5, h, 1.0 - h)  # planted
  return h @ W2


def kwta_model(x):
  """k-winners-take-all (Xiao et al. 2020): keep the 3 largest activations of each row."""
  h = x @ W1
  threshold = jax.lax.top_k(h, 3)[0][:, -1:]
  h = jnp.where(h >= threshold, h, 0.0)  # planted
  return h @ W2


@jax.custom_vjp
def straight_through_round(h):
  return jnp.round(h)


straight_through_round.defvjp(lambda h: (jnp.round(h), None), lambda _, g: (g,))


def custom_vjp_model(x):
  return straight_through_round(x @ W1) @ W2  # planted


@jax.custom_jvp
def clipped_tanh(h):
  return jnp.tanh(h)


clipped_tanh.defjvp(lambda primals, tangents: (jnp.tanh(primals[0]), tangents[0] * 0.0))


def custom_jvp_model(x):
  return clipped_tanh(x @ W1) @ W2  # planted


def loop_model(x):
  h = jax.lax.while_loop(lambda h: jnp.sum(h * h) < 100.0, lambda h: 2.0 * h, x @ W1)  # planted
  return h @ W2


def random_model(x):
  noisy = x + 0.1 * jax.random.normal(KEY, x.shape)  # planted
  return jnp.tanh(noisy @ W1) @ W2


PLANTED = [
    (stop_gradient_model, "stop_gradient", "stop_gradient"),
    (round_model, "rounding", "round"),
    (floor_model, "rounding", "floor"),
    (ceil_model, "rounding", "ceil"),
    (sign_model, "rounding", "sign"),
    (argmax_model, "index", "argmax"),
    (argsort_model, "index", "sort"),
    (top_k_indices_model, "index", "top_k"),
    (uint8_model, "integer_cast", "convert_element_type"),
    (bool_cast_model, "integer_cast", "convert_element_type"),
    (comparison_model, "comparison", "gt"),
    (kwta_model, "rank_mask", "ge"),
    (custom_vjp_model, "custom_derivative", "custom_vjp_call"),
    (custom_jvp_model, "custom_derivative", "custom_jvp_call"),
    (loop_model, "loop", "while"),
    (random_model, "random", "random_bits"),
]


@pytest.mark.parametrize("model, kind, primitive", PLANTED, ids=[p[0].__name__ for p in PLANTED])
def test_each_planted_mask_is_reported_once_with_its_kind_and_line(model, kind, primitive):
  finding = only(jr.diagnose(model, X))
  assert (finding.kind, finding.primitive) == (kind, primitive)
  assert finding.severity == diagnosis.KINDS[kind].severity
  assert finding.remedy == diagnosis.KINDS[kind].remedy
  assert_at(finding, model)


def test_the_kinds_table_and_its_severity_rule():
  errors = {k for k, v in diagnosis.KINDS.items() if v.severity == "error"}
  warnings = {k for k, v in diagnosis.KINDS.items() if v.severity == "warning"}
  assert errors == {"stop_gradient", "rounding", "index", "integer_cast", "loop"}
  assert warnings == {"comparison", "rank_mask", "custom_derivative", "random"}
  assert {kind for _, kind, _ in PLANTED} == set(diagnosis.KINDS)
  # The remedies name the technique: BPDA for shattered gradients, EOT for randomness.
  assert "BPDA" in diagnosis.KINDS["rounding"].remedy
  assert "EOT" in diagnosis.KINDS["random"].remedy
  assert "square" in diagnosis.KINDS["rank_mask"].remedy


def test_messages_name_what_was_found():
  assert "uint8" in only(jr.diagnose(uint8_model, X)).message
  assert "bool" in only(jr.diagnose(bool_cast_model, X)).message
  custom = only(jr.diagnose(custom_vjp_model, X)).message
  assert "straight_through_round" in custom and "custom_vjp" in custom
  assert "depends on x" not in only(jr.diagnose(random_model, X)).message

  def keyed_by_x(x):
    seed = jnp.sum(x).astype(jnp.int32)
    return (x + jax.random.normal(jax.random.key(seed), x.shape)) @ W1 @ W2

  kinds = {f.kind: f for f in jr.diagnose(keyed_by_x, X)}
  assert set(kinds) == {"integer_cast", "random"} and "depends on x" in kinds["random"].message


# ------------------------------------------------------------------------------------------------
# Clean models.


def clean_mlp(x):
  h = x @ W1
  h = jax.nn.relu(h) + jax.nn.gelu(h) + jax.nn.gelu(h, approximate=False) + jax.nn.softplus(h)
  h = h + jax.nn.elu(h) + jax.nn.leaky_relu(h) + jax.nn.silu(h) + jnp.maximum(h, 0.0)
  h = jax.nn.softmax(h) + jax.nn.logsumexp(h, axis=-1, keepdims=True) + jnp.clip(h, -1.0, 1.0)
  h = jnp.nan_to_num(jax.nn.standardize(h)) + jnp.abs(h) + jnp.sort(h, axis=-1)
  return jax.nn.log_softmax(h @ W2)


def test_a_clean_mlp_reports_nothing():
  found = jr.diagnose(clean_mlp, X)
  assert len(found) == 0 and not found and found == ()
  assert str(found) == "No gradient-masking operation on the path from x to the logits."


CONV = RNG.normal(size=(3, 3, 1, 4)).astype(np.float32)
HEAD = RNG.normal(size=(4 * 4 * 4, 3)).astype(np.float32)


def clean_cnn(x):
  h = jax.lax.conv_general_dilated(x, CONV, (1, 1), "SAME",
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
  h = jax.nn.relu(h)
  h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
  return jax.nn.log_softmax(h.reshape((h.shape[0], -1)) @ HEAD)


def test_a_clean_conv_net_reports_nothing():
  assert len(jr.diagnose(clean_cnn, IMAGES)) == 0


class LinenNet(linen.Module):
  dropout: bool = False

  @linen.compact
  def __call__(self, x):
    h = linen.relu(linen.Conv(4, (3, 3))(x))
    h = linen.BatchNorm(use_running_average=True)(h)
    h = linen.max_pool(h, (2, 2), (2, 2))
    h = linen.Dropout(0.5, deterministic=not self.dropout)(h)  # planted
    h = linen.LayerNorm()(h.reshape((h.shape[0], -1)))
    return linen.Dense(3)(linen.gelu(linen.Dense(8)(h)))


@pytest.fixture(scope="module")
def linen_variables():
  """Zero weights of the right shapes (diagnose reads shapes only; nothing is compiled)."""
  shapes = jax.eval_shape(LinenNet().init, KEY, IMAGES)
  return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)


def test_flax_linen_clean_and_with_dropout(linen_variables):
  assert len(jr.diagnose(functools.partial(LinenNet().apply, linen_variables), IMAGES)) == 0
  noisy = LinenNet(dropout=True)
  finding = only(jr.diagnose(
      lambda x: noisy.apply(linen_variables, x, rngs={"dropout": KEY}), IMAGES))
  assert finding.kind == "random"
  assert_at(finding, LinenNet.__call__)


class NNXNet(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.conv = nnx.Conv(1, 4, (3, 3), rngs=rngs)
    self.norm = nnx.BatchNorm(4, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)
    self.head = nnx.Linear(4 * 4 * 4, 3, rngs=rngs)

  def __call__(self, x):
    h = nnx.relu(self.norm(self.conv(x)))
    h = self.drop(nnx.max_pool(h, (2, 2), (2, 2)))  # planted
    return nnx.log_softmax(self.head(h.reshape((h.shape[0], -1))))


def test_flax_nnx_clean_in_eval_mode_random_in_train_mode_state_untouched():
  model = NNXNet(nnx.Rngs(0))
  model.eval()
  assert len(jr.diagnose(model, IMAGES)) == 0
  model.train()
  state = lambda: jax.tree.leaves(nnx.state(model, nnx.BatchStat, nnx.RngCount))  # noqa: E731
  before = [np.asarray(leaf) for leaf in state()]
  finding = only(jr.diagnose(model, IMAGES))
  assert finding.kind == "random"
  assert_at(finding, NNXNet.__call__)
  # Tracing a split-and-merged copy changed neither the statistics nor the RNG counts.
  assert len(before) == 3 and all(map(np.array_equal, before, state()))


# ------------------------------------------------------------------------------------------------
# Only the path from x to the logits counts.


def test_masks_off_the_path_are_not_reported():
  def masks_elsewhere(x):
    w = jax.lax.stop_gradient(W1)  # on a parameter
    bias = jnp.round(jnp.argmax(W2, axis=0).astype(jnp.float32))[None, :]  # constants only
    unused = jnp.floor(x), jax.random.normal(KEY, x.shape), jnp.argsort(x)  # never read
    del unused
    return jnp.tanh(x @ w) @ W2 + bias

  assert len(jr.diagnose(masks_elsewhere, X)) == 0


def test_a_dropped_index_output_and_sorted_values_are_clean():
  def sorted_values(x):
    values, _ = jax.lax.top_k(x @ W1, 4)  # the indices are dropped
    return jnp.sort(values, axis=-1) @ W2[:4]

  assert len(jr.diagnose(sorted_values, X)) == 0


def test_user_where_is_reported_where_jax_nn_is_not():
  def own_leaky_relu(x):
    h = x @ W1
    return jnp.where(h >= 0, h, 0.01 * h) @ W2  # planted

  assert len(jr.diagnose(lambda x: jax.nn.leaky_relu(x @ W1) @ W2, X)) == 0
  finding = only(jr.diagnose(own_leaky_relu, X))
  assert (finding.kind, finding.severity) == ("comparison", "warning")
  assert_at(finding, own_leaky_relu)


# ------------------------------------------------------------------------------------------------
# Nested programs: calls, loops, branches, custom rules.


def test_masks_inside_jit_scan_cond_and_checkpoint():
  @jax.jit
  def quantise(h):
    return h + jax.lax.stop_gradient(jnp.round(h) - h)  # planted

  def step(carry, _):
    return jax.lax.cond(jnp.sum(carry) > 0.0, quantise, jnp.tanh, carry), None

  def nested(x):
    h = jax.checkpoint(lambda v: v @ W1)(x)
    return jax.lax.scan(step, h, None, length=2)[0] @ W2

  found = jr.diagnose(nested, X)
  kinds = sorted((f.kind, f.primitive) for f in found)
  assert kinds == [("comparison", "gt"), ("rounding", "round"), ("stop_gradient", "stop_gradient")]
  for finding in found:
    if finding.kind != "comparison":
      assert_at(finding, quantise)
  (branch,) = [f for f in found if f.kind == "comparison"]
  assert branch.line == inspect.getsourcelines(step)[1] + 1


def test_a_loop_carry_that_depends_on_x_only_after_two_steps():
  def delayed(x):
    def step(carry, _):
      a, b = carry
      return (b, jnp.floor(a) + x), None  # planted

    zeros = jnp.zeros(x.shape, x.dtype)
    return jax.lax.scan(step, (zeros, zeros), None, length=3)[0][0] @ W1 @ W2

  assert_at(only(jr.diagnose(delayed, X)), delayed)

  def never(x):  # the same loop with x added after it: the floor never sees x
    def step(carry, _):
      a, b = carry
      return (b, jnp.floor(a) + 1.0), None

    zeros = jnp.zeros(x.shape, x.dtype)
    return (jax.lax.scan(step, (zeros, zeros), None, length=3)[0][0] + x) @ W1 @ W2

  assert len(jr.diagnose(never, X)) == 0


def test_custom_rule_inside_jit_and_the_rules_own_body_is_not_searched():
  user_rule = jax.jit(lambda x: straight_through_round(x @ W1) @ W2)
  finding = only(jr.diagnose(user_rule, X))  # the round inside the custom_vjp is the rule's
  assert finding.kind == "custom_derivative"
  assert finding.line == inspect.getsourcelines(
      test_custom_rule_inside_jit_and_the_rules_own_body_is_not_searched)[1] + 1


def test_one_finding_per_location_however_often_it_runs():
  def helper(h):
    return jnp.round(h)  # planted

  found = jr.diagnose(lambda x: helper(helper(x @ W1)) @ W2 + helper(x) @ W1 @ W2, X)
  assert_at(only(found), helper)


# ------------------------------------------------------------------------------------------------
# Inputs, outputs, errors.


def test_inputs_an_array_a_numpy_array_a_spec_and_traced_parameters():
  x = np.ones(X.shape, np.float32)
  for given in (x, jnp.asarray(x), X, x.tolist()):
    assert [f.kind for f in jr.diagnose(round_model, given)] == ["rounding"]

  seen = []

  def traced(w):  # a model closing over the parameters of an enclosing trace
    seen.append(jr.diagnose(lambda v: jnp.sign(v @ w) @ W2, X))
    return w

  jax.eval_shape(traced, W1)
  assert [(f.kind, f.primitive) for f in seen[0]] == [("rounding", "sign")]


def test_bad_inputs_are_refused_with_clear_errors():
  with pytest.raises(TypeError, match="logits_fn must be callable"):
    jr.diagnose(W1, X)
  with pytest.raises(TypeError, match="x must be an array"):
    jr.diagnose(clean_mlp, "not an array")
  with pytest.raises(TypeError, match="x must be an array"):
    jr.diagnose(clean_mlp, object())
  with pytest.raises(TypeError, match="x must be floating"):
    jr.diagnose(clean_mlp, np.zeros(X.shape, np.int32))


def test_diagnose_never_runs_the_model():
  calls = []

  def model(x):
    jax.debug.callback(lambda v: calls.append(v), x)
    return jnp.round(x) @ W1

  assert [f.kind for f in jr.diagnose(model, np.ones(X.shape, np.float32))] == ["rounding"]
  assert calls == []


def test_the_diagnosis_is_a_tuple_of_findings_with_a_table():
  found = jr.diagnose(lambda x: jnp.where(stop_gradient_model(x) > 0, x[:, :4], 0.0), X)
  assert isinstance(found, tuple) and found.findings == tuple(found)
  assert [f.severity for f in found.errors] == ["error"]
  assert [f.kind for f in found.warnings] == ["comparison"]
  assert found[0].kind == "stop_gradient"  # program order
  table = str(found)
  assert table.splitlines()[0] == ("2 gradient-masking operations on the path from x to the "
                                   "logits (1 error, 1 warning):")
  assert f"test_diagnose.py:{planted_line(stop_gradient_model)}" in table
  assert table.count("remedy: ") == 2
  assert found[0].location == f"{found[0].file}:{found[0].line}"


def test_records_round_trip_render_as_a_section_and_warn_on_errors():
  """What jr.evaluate keeps of a diagnosis (jaxrobust._findings): the JSON record, the report's
  section and the one warning, naming each error's place and remedy."""
  found = jr.diagnose(lambda x: jnp.where(stop_gradient_model(x) > 0, x[:, :4], 0.0), X)
  assert diagnosis.Diagnosis.from_record(found.to_record()) == found
  section = found.section().splitlines()
  assert section[0] == "Gradient masking (static): 1 error, 1 warning"
  assert section[1].split()[:3] == ["error", "stop_gradient", "stop_gradient"]
  assert f"test_diagnose.py:{planted_line(stop_gradient_model)}" in section[1]
  assert section[1].endswith(diagnosis.KINDS["stop_gradient"].remedy) and len(section) == 3
  assert diagnosis.Diagnosis().section() == "Gradient masking (static): none found"
  with pytest.warns(diagnosis.GradientMaskingWarning, match="stop_gradient .*Remedy: stop_grad"):
    diagnosis.warn_if_masked(found, where="here")
  diagnosis.warn_if_masked(diagnosis.Diagnosis(found.warnings), where="here")  # no error: quiet


def test_a_traced_randomized_model_reports_draws_from_its_keys():
  """diagnose_traced, as jr.evaluate runs it on logits_fn(x, keys): the keys are inputs that do
  not depend on x, and a draw from them that reaches the logits is reported."""
  def randomized(x, keys):
    noise = jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(keys)  # planted
    return (x + 0.1 * noise) @ W1

  keys = jax.ShapeDtypeStruct((X.shape[0],), KEY.dtype)
  finding = only(diagnosis.diagnose_traced(jax.make_jaxpr(randomized)(X, keys), num_inputs=2))
  assert finding.kind == "random"
  assert_at(finding, randomized)
