"""jr.interop: PyTorch modules through torchax (the optional extra ``torch``; skipped without it).

The reference for the attacks is an independent JAX mirror of the same weights written here with
``lax.conv_general_dilated`` (NHWC), not torchax: the converted model must give its logits, and
the same robustness curve and robust flags as it under ``jax.jit`` with the parameters as
arguments, on one device and on a batch-sharded mesh of the 8 CPU devices.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
if importlib.util.find_spec("torchax") is None:  # not importorskip: torchax needs the shim first
  pytest.skip("torchax is not installed (pip install 'jaxrobust[torch]')", allow_module_level=True)

import jaxrobust as jr  # noqa: E402
from jaxrobust.interop import _torchax_compat  # noqa: E402
from jaxrobust.model import captured_constants, model_of  # noqa: E402
from tests import test_docs  # noqa: E402

pytestmark = pytest.mark.compile_bound  # small programs: see tests/conftest.py

EPS = np.array([0.02, 0.05, 0.1], np.float32)


class Net(torch.nn.Module):
  """conv 3x3 (2 -> 4) + BatchNorm (eval) + ReLU + max-pool 2 + flatten (NCHW order) + linear."""

  def __init__(self):
    super().__init__()
    self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
    self.bn = torch.nn.BatchNorm2d(4)
    self.fc = torch.nn.Linear(4 * 4 * 4, 4)

  def forward(self, x):
    h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
    return self.fc(torch.flatten(h, 1))


def make_net(seed: int = 0) -> Net:
  torch.manual_seed(seed)
  net = Net()
  with torch.no_grad():  # non-trivial running statistics, so eval-mode BatchNorm matters
    net.bn.running_mean.uniform_(-0.2, 0.2)
    net.bn.running_var.uniform_(0.5, 2.0)
    net.bn.weight.uniform_(0.5, 1.5)
    net.bn.bias.uniform_(-0.1, 0.1)
  return net.eval()


def mirror(weights: dict, x):
  """The same network in plain JAX on NHWC inputs (independent of torchax)."""
  w = {k: jnp.asarray(v) for k, v in weights.items()}
  h = jax.lax.conv_general_dilated(x, w["conv.weight"], (1, 1), ((1, 1), (1, 1)),
                                   dimension_numbers=("NHWC", "OIHW", "NHWC"))
  h = h + w["conv.bias"][None, None, None, :]
  scale = w["bn.weight"] / jnp.sqrt(w["bn.running_var"] + 1e-5)
  h = (h - w["bn.running_mean"][None, None, None, :]) * scale[None, None, None, :]
  h = jax.nn.relu(h + w["bn.bias"][None, None, None, :])
  h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
  h = jnp.transpose(h, (0, 3, 1, 2)).reshape(h.shape[0], -1)  # PyTorch's flatten order
  return h @ w["fc.weight"].T + w["fc.bias"][None, :]


@pytest.fixture(scope="module")
def setup():
  net = make_net()
  rng = np.random.default_rng(0)
  x = rng.uniform(0, 1, (32, 8, 8, 2)).astype(np.float32)  # NHWC, as jaxrobust takes images
  with torch.no_grad():
    logits = net(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()
  y = logits.argmax(1).astype(np.int32)
  y[:3] = (y[:3] + 1) % 4  # three misclassified points
  model = jr.interop.from_torch(net, x[:4].transpose(0, 3, 1, 2))
  weights = {k: v.detach().numpy() for k, v in net.state_dict().items()}
  return net, model, weights, x, y, logits


def test_logits_match_the_module_on_nhwc_inputs(setup):
  net, model, weights, x, y, logits = setup
  assert isinstance(model, jr.model.Model) and model_of(model) is model
  assert set(model.params) == {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight",
                                "fc.bias"}  # the trainable floats; the rest are buffers
  assert set(model.buffers) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
  np.testing.assert_allclose(np.asarray(model(x)), logits, atol=2e-5, rtol=1e-5)
  params, apply = model  # unpacks as (params, apply)
  np.testing.assert_allclose(np.asarray(apply(params, x)), logits, atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(mirror(weights, x)), logits, atol=2e-5, rtol=1e-5)
  assert model.check_error < 1e-5
  # Input gradients equal PyTorch's.
  xt = torch.from_numpy(x.transpose(0, 3, 1, 2)).requires_grad_(True)
  net(xt)[:, 0].sum().backward()
  grad = jax.grad(lambda v: model(v)[:, 0].sum())(jnp.asarray(x))
  np.testing.assert_allclose(np.asarray(grad), xt.grad.numpy().transpose(0, 2, 3, 1), atol=1e-5)


def test_parameters_are_arguments_never_constants(setup):
  _, model, _, x, *_ = setup
  # The model as an argument: its parameters and buffers are both arguments.
  closed = jax.make_jaxpr(lambda m, p, v: m.apply(p, v))(model, model.params, x)
  assert captured_constants(closed) == []
  closed = jax.make_jaxpr(lambda a, v: model.with_arguments(a)(v))(model.arguments, x)
  assert captured_constants(closed) == [] and len(closed.jaxpr.invars) == 10  # 6 + 3 + x
  with warnings.catch_warnings():
    warnings.simplefilter("error", jr.model.CapturedConstantsWarning)
    jax.jit(lambda m, v: m(v))(model, x).block_until_ready()


def test_curve_under_jit_equals_the_hand_written_mirror(setup):
  """Same weights, same attack and keys: both programs compute the same float32 arithmetic up to
  the order of a few sums, so PGD's iterates may differ in the last bits. The verdicts agree
  exactly here; the bound allows one example per eps in case a rounding flips a sign step."""
  _, model, weights, x, y, _ = setup
  attack = jr.attacks.pgd("linf", steps=10)

  @jax.jit
  def curve(params, x, y, key):
    return jr.robustness_curve(attack, functools.partial(model.apply, params), x, y, EPS, key)

  @jax.jit
  def mirror_curve(weights, x, y, key):
    return jr.robustness_curve(attack, functools.partial(mirror, weights), x, y, EPS, key)

  got = curve(model.params, x, y, jax.random.key(0))
  want = mirror_curve({k: jnp.asarray(v) for k, v in weights.items()}, x, y, jax.random.key(0))
  assert float(got.clean_accuracy) == float(want.clean_accuracy) == 29 / 32
  differ = np.sum(np.asarray(got.robust) != np.asarray(want.robust), axis=1)
  assert np.all(differ <= 1), differ
  ra = np.asarray(want.robust_accuracy)
  assert ra[0] > ra[-1]  # the grid is informative: some points break, not all at once


def test_auto_attack_fast_and_evaluate_on_a_sharded_mesh(setup):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets jax_num_cpu_devices=8)")
  _, model, _, x, y, _ = setup
  aa = jax.jit(lambda m, x, y, key: jr.run(jr.attacks.auto_attack("linf", "fast", steps=5), m, x,
                                           y, jr.Budget(0.01), key))(model, x, y,
                                                                     jax.random.key(1))
  assert aa.success.shape == (32,) and 3 <= int(aa.success.sum()) < 32, aa.success
  common = dict(attacks={"pgd": jr.attacks.pgd("linf", steps=5)}, epsilons=EPS,
                key=jax.random.key(0), batch_size=32, progress=False, keep_per_example=True)
  single = jr.evaluate(model, (x, y), **common)
  sharded = jr.evaluate(model, (x, y), mesh=jax.make_mesh((8,), ("batch",)), **common)
  np.testing.assert_array_equal(single.per_example["worst_case"],
                                sharded.per_example["worst_case"])
  assert single.clean_accuracy == 29 / 32


def test_refusals_name_the_fix(setup):
  net, _, _, x, *_ = setup
  training = make_net().train()
  with pytest.raises(ValueError, match=r"training mode \(Net, conv, bn and 1 more\).*module\.eval\(\)"):
    jr.interop.from_torch(training, x[:2].transpose(0, 3, 1, 2))
  half = make_net()
  half.bn.train()  # one submodule is enough
  with pytest.raises(ValueError, match=r"training mode \(bn\)"):
    jr.interop.from_torch(half, x[:2].transpose(0, 3, 1, 2))
  with pytest.raises(ValueError, match=r"failed on example_input of shape \(2, 8, 8, 2\).*NCHW"):
    jr.interop.from_torch(net, x[:2])  # NHWC given where the module wants NCHW
  with pytest.raises(ValueError, match="layout must be one of"):
    jr.interop.from_torch(net, x[:2].transpose(0, 3, 1, 2), layout="hwc")

  class Airy(torch.nn.Module):
    def forward(self, v):
      return torch.special.airy_ai(v.flatten(1))

  with pytest.raises(jr.interop.UnsupportedOperationError, match="aten::special_airy_ai") as info:
    jr.interop.from_torch(Airy().eval(), np.ones((2, 3), np.float32))
  assert info.value.operation == "aten::special_airy_ai"

  class Noisy(torch.nn.Module):  # random in eval mode: PyTorch's draw and JAX's differ
    def forward(self, v):
      return v + torch.rand_like(v)

  with pytest.raises(ValueError, match=r"differ from the module's on example_input by up to"):
    jr.interop.from_torch(Noisy().eval(), np.zeros((2, 3), np.float32))
  nchw = x[:2].transpose(0, 3, 1, 2)
  for dtype in (torch.float16, torch.bfloat16, torch.float64):  # the attacks call it in float32
    with pytest.raises(ValueError, match=rf"are {str(dtype)[6:]}; convert a float32 module, "
                       r"module\.float\(\).*compute_in"):
      jr.interop.from_torch(make_net().to(dtype), torch.from_numpy(nchw).to(dtype))
  hooked = make_net()
  hooked.register_forward_pre_hook(lambda module, args: (args[0] * 2,))  # torchax would skip it
  with pytest.raises(ValueError, match=r"forward hooks registered on itself \(forward_pre_hooks\)"):
    jr.interop.from_torch(hooked, nchw)
  spectral = torch.nn.Sequential(
      torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(3, 2))).eval()
  with pytest.raises(ValueError, match=r"torchax could not run the module's forward in JAX"):
    jr.interop.from_torch(spectral, np.ones((2, 3), np.float32))  # torchax's AssertionError
  with pytest.raises(TypeError, match=r"PyTorch module \(Net\).*jr\.interop\.from_torch"):
    jr.run(jr.attacks.fgsm("linf"), net, x[:2], np.zeros(2, np.int32), jr.Budget(0.1),
           jax.random.key(0))  # the module itself, not converted


def test_a_module_put_back_in_training_mode_after_the_conversion_is_refused(setup):
  """torchax runs the live module's forward at every trace: in training mode BatchNorm would use
  the batch's statistics (the converted weights are a copy, the mode is not)."""
  x = setup[3]
  net = make_net()
  model = jr.interop.from_torch(net, x[:2].transpose(0, 3, 1, 2))
  net.train()
  with pytest.raises(ValueError, match=r"put back in training mode after from_torch"):
    jax.jit(lambda m, v: m(v))(model, x[:4])
  net.eval()
  np.testing.assert_allclose(np.asarray(jax.jit(lambda m, v: m(v))(model, x[:4])),
                             np.asarray(setup[1](x[:4])), atol=1e-6)


def test_flat_inputs_and_nchw_layout():
  torch.manual_seed(1)
  mlp = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).eval()
  v = np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32)
  model = jr.interop.from_torch(mlp, torch.from_numpy(v))
  np.testing.assert_allclose(np.asarray(model(v)), mlp(torch.from_numpy(v)).detach().numpy(),
                             atol=1e-6)
  net = make_net()
  nchw = np.random.default_rng(2).uniform(size=(2, 2, 8, 8)).astype(np.float32)
  model = jr.interop.from_torch(net, nchw, layout="nchw")
  np.testing.assert_allclose(np.asarray(model(nchw)), net(torch.from_numpy(nchw)).detach().numpy(),
                             atol=2e-5)


def test_compat_shim_only_adds_missing_names_and_is_idempotent():
  root = _torchax_compat._torchax_root()
  referenced = _torchax_compat.referenced_overloads(root)
  assert ("prod", "dim_Dimname") in referenced and len(referenced) > 500
  aliased = set(_torchax_compat.added_aliases())  # what from_torch's import added, if anything
  before = {}
  for op, overload in referenced:
    packet = getattr(torch.ops.aten, op, None)
    if packet is not None:
      before[(op, overload)] = getattr(packet, overload)  # every name resolves now
  assert _torchax_compat.patch_missing_overloads() == ()  # idempotent: nothing more to add
  for (op, overload), value in before.items():
    assert getattr(getattr(torch.ops.aten, op), overload) is value
  for name in aliased:  # only named-tensor variants, each an alias of a real overload
    op, overload = name.split(".")
    assert re.search(r"[Dd]imname|names", overload), name
    packet = getattr(torch.ops.aten, op)
    assert overload not in packet.overloads()
    assert getattr(packet, overload) in [getattr(packet, o) for o in packet.overloads()]


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_checkpoints_load_into_a_fresh_module(setup, tmp_path, suffix):
  net, model, _, x, *_ = setup
  path = tmp_path / f"net{suffix}"
  if suffix == ".pt":
    torch.save(net.state_dict(), path)
  else:
    import safetensors.torch  # noqa: PLC0415

    safetensors.torch.save_file(net.state_dict(), path)
  fresh = jr.interop.load_state_dict(make_net(seed=5), path).eval()
  loaded = jr.interop.from_torch(fresh, x[:2].transpose(0, 3, 1, 2))
  np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(model(x)))
  partial = {k: v for k, v in net.state_dict().items() if k != "bn.running_var"}
  if suffix == ".pt":
    torch.save(partial, path)
  else:
    safetensors.torch.save_file(partial, path)
  with pytest.raises(RuntimeError, match=r'(?s)net.*Missing key\(s\) in state_dict: "bn.running_var"'):
    jr.interop.load_state_dict(make_net(), path)
  if suffix == ".safetensors":  # bfloat16 tensors, which NumPy (or ml_dtypes) cannot hand torch
    state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
             for k, v in net.state_dict().items()}
    safetensors.torch.save_file(state, path)
    loaded = jr.interop.load_state_dict(make_net(seed=5), path)
    assert torch.equal(loaded.fc.weight, net.fc.weight.to(torch.bfloat16).float())


def test_readme_pytorch_example_runs(tmp_path, monkeypatch):
  """The README's "Your model" PyTorch block (skipped by tests/test_docs.py, which runs without
  PyTorch) runs here."""
  monkeypatch.chdir(tmp_path)
  blocks = [code for _, code, _ in test_docs.code_blocks(test_docs.README)
            if "jr.interop.from_torch" in code]
  assert blocks
  for code in blocks:
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102 (the docs)
