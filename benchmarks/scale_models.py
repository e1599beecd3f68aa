"""Real-size image models for ``bench_scale.py``: Flax NNX networks and their PyTorch mirrors.

* :class:`WideResNet` ``(depth, width)``: the CIFAR WideResNet of Zagoruyko & Komodakis
  (pre-activation basic blocks, ``(depth - 4) / 6`` blocks per group, widths ``16k, 32k, 64k``,
  strides 1, 2, 2, global average pooling, a linear head) on ``[B, 32, 32, 3]``. WRN-28-10 has
  36.5 M parameters. ``use_bn=False`` (the default, as in the issue's H200 run) drops the
  BatchNorm layers and keeps the ReLUs; ``use_bn=True`` keeps them, in eval mode.
* :class:`ResNet50`: the ImageNet ResNet-50 (7x7 stride-2 stem, 3x3 stride-2 max pool,
  bottleneck blocks 3-4-6-3 with the stride on the 3x3 convolution as in torchvision, BatchNorm
  in eval mode) on ``[B, 224, 224, 3]``, 25.6 M parameters.

Every convolution pads explicitly and symmetrically (``k // 2`` on each side), PyTorch's
convention, so the mirror needs no asymmetric padding: XLA's ``"SAME"`` would put the one padding
row of a stride-2 3x3 convolution on an even input at the bottom/right only (see
``bench_peers.torch_port``), which torch's ``padding=1`` does not do. The max pool pads with
``-inf`` on both sides, as ``torch.nn.MaxPool2d(3, 2, 1)`` does.

BatchNorm parameters and statistics are not the trivial 1/0: scales and offsets are drawn at
random around 1 and 0 (:func:`randomize_batchnorm`), then :func:`calibrate_batchnorm` runs one
training-mode pass over a batch of uniform random images with momentum 0, so the running mean and
variance are that batch's (the eval-mode model's activations are normalised on data like it).

The PyTorch mirrors (:func:`torch_mirror`) have the same module tree (attribute names and list
indices), so the weights are copied path by path: conv kernels HWIO -> OIHW, dense kernels
``[in, out]`` -> ``[out, in]``, BatchNorm ``scale/bias/mean/var`` -> ``weight/bias/running_mean/
running_var``; they take NCHW inputs. :func:`check_mirror` compares the logits.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

BN_EPSILON = 1e-5
"""The BatchNorm epsilon of both sides (Flax's and torch's default)."""

ModuleList = getattr(nnx, "List", list)
"""``nnx.List`` where Flax has it (0.12 needs it for a list of modules), else a plain list."""


def iter_modules(module: nnx.Module):
  """``(path, submodule)`` pairs: ``nnx.iter_modules`` or, in older Flax, the method."""
  walk = getattr(nnx, "iter_modules", None)
  return walk(module) if walk is not None else module.iter_modules()


def conv(in_features: int, out_features: int, kernel: int, stride: int, rngs: nnx.Rngs,
         bias: bool = False) -> nnx.Conv:
  pad = kernel // 2
  return nnx.Conv(in_features, out_features, (kernel, kernel), (stride, stride),
                  padding=((pad, pad), (pad, pad)), use_bias=bias, rngs=rngs)


def batchnorm(features: int, rngs: nnx.Rngs) -> nnx.BatchNorm:
  # momentum 0: one training-mode pass sets the running statistics to that batch's
  # (calibrate_batchnorm); eval mode never reads it.
  return nnx.BatchNorm(features, momentum=0.0, epsilon=BN_EPSILON, use_running_average=True,
                       rngs=rngs)


def identity(x: jax.Array) -> jax.Array:
  return x


class WideBlock(nnx.Module):
  """Pre-activation basic block: (BN) ReLU conv3x3(stride) (BN) ReLU conv3x3, plus the shortcut.

  As in the reference WRN code, a block that changes the width or the resolution pre-activates
  its input once and feeds it to both branches, with a 1x1 convolution on the shortcut.
  """

  def __init__(self, in_features: int, out_features: int, stride: int, use_bn: bool,
               rngs: nnx.Rngs):
    self.equal = in_features == out_features and stride == 1
    self.bn1 = batchnorm(in_features, rngs) if use_bn else None
    self.conv1 = conv(in_features, out_features, 3, stride, rngs)
    self.bn2 = batchnorm(out_features, rngs) if use_bn else None
    self.conv2 = conv(out_features, out_features, 3, 1, rngs)
    self.shortcut = None if self.equal else conv(in_features, out_features, 1, stride, rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    pre = jax.nn.relu((self.bn1 or identity)(x))
    out = self.conv1(pre)
    out = self.conv2(jax.nn.relu((self.bn2 or identity)(out)))
    return out + (x if self.equal else self.shortcut(pre))


class WideResNet(nnx.Module):
  """WRN-``depth``-``width`` for ``[B, 32, 32, 3]`` images in [0, 1] -> ``num_classes`` logits."""

  def __init__(self, depth: int = 28, width: int = 10, num_classes: int = 10, *,
               use_bn: bool = False, rngs: nnx.Rngs):
    if (depth - 4) % 6:
      raise ValueError(f"a WideResNet's depth is 6n + 4, got {depth}")
    n = (depth - 4) // 6
    widths = (16, 16 * width, 32 * width, 64 * width)
    self.stem = conv(3, widths[0], 3, 1, rngs)
    blocks = []
    for group, stride in zip(range(3), (1, 2, 2)):
      for i in range(n):
        blocks.append(WideBlock(widths[group] if i == 0 else widths[group + 1],
                                widths[group + 1], stride if i == 0 else 1, use_bn, rngs))
    self.blocks = ModuleList(blocks)
    self.bn = batchnorm(widths[3], rngs) if use_bn else None
    self.head = nnx.Linear(widths[3], num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = self.stem(x)
    for block in self.blocks:
      x = block(x)
    x = jax.nn.relu((self.bn or identity)(x))
    return self.head(jnp.mean(x, axis=(1, 2)))


class Bottleneck(nnx.Module):
  """conv1x1 BN ReLU conv3x3(stride) BN ReLU conv1x1 BN, plus the (projected) shortcut, ReLU."""

  def __init__(self, in_features: int, width: int, stride: int, rngs: nnx.Rngs):
    out_features = 4 * width
    self.conv1, self.bn1 = conv(in_features, width, 1, 1, rngs), batchnorm(width, rngs)
    self.conv2, self.bn2 = conv(width, width, 3, stride, rngs), batchnorm(width, rngs)
    self.conv3, self.bn3 = conv(width, out_features, 1, 1, rngs), batchnorm(out_features, rngs)
    project = stride != 1 or in_features != out_features
    self.down_conv = conv(in_features, out_features, 1, stride, rngs) if project else None
    self.down_bn = batchnorm(out_features, rngs) if project else None

  def __call__(self, x: jax.Array) -> jax.Array:
    out = jax.nn.relu(self.bn1(self.conv1(x)))
    out = jax.nn.relu(self.bn2(self.conv2(out)))
    out = self.bn3(self.conv3(out))
    shortcut = x if self.down_conv is None else self.down_bn(self.down_conv(x))
    return jax.nn.relu(out + shortcut)


class ResNet50(nnx.Module):
  """ImageNet ResNet-50 for ``[B, 224, 224, 3]`` images -> ``num_classes`` logits."""

  def __init__(self, num_classes: int = 1000, *, rngs: nnx.Rngs):
    self.stem = conv(3, 64, 7, 2, rngs)
    self.stem_bn = batchnorm(64, rngs)
    blocks, in_features = [], 64
    for width, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
      for i in range(count):
        blocks.append(Bottleneck(in_features, width, stride if i == 0 else 1, rngs))
        in_features = 4 * width
    self.blocks = ModuleList(blocks)
    self.head = nnx.Linear(in_features, num_classes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = jax.nn.relu(self.stem_bn(self.stem(x)))
    x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for block in self.blocks:
      x = block(x)
    return self.head(jnp.mean(x, axis=(1, 2)))


def parse_arch(name: str) -> tuple[str, dict[str, int]]:
  """``"wrn-28-10"`` -> ``("wrn", {"depth": 28, "width": 10})``; ``"resnet50"`` ->
  ``("resnet50", {})``."""
  match = re.fullmatch(r"wrn-(\d+)-(\d+)", name)
  if match:
    return "wrn", {"depth": int(match[1]), "width": int(match[2])}
  if name in ("resnet50", "resnet-50"):
    return "resnet50", {}
  raise ValueError(f"unknown architecture {name!r} (wrn-DEPTH-WIDTH or resnet50)")


def image_shape(name: str) -> tuple[int, int, int]:
  return (224, 224, 3) if parse_arch(name)[0] == "resnet50" else (32, 32, 3)


def randomize_batchnorm(model: nnx.Module, seed: int) -> None:
  """BN scales drawn uniformly in [0.5, 1.5] and offsets from N(0, 0.1^2) (not the trivial 1/0)."""
  key = jax.random.key(seed)
  norms = [m for _, m in iter_modules(model) if isinstance(m, nnx.BatchNorm)]
  for i, bn in enumerate(norms):
    k1, k2 = jax.random.split(jax.random.fold_in(key, i))
    bn.scale.value = jax.random.uniform(k1, bn.scale.value.shape, minval=0.5, maxval=1.5)
    bn.bias.value = 0.1 * jax.random.normal(k2, bn.bias.value.shape)


def calibrate_batchnorm(model: nnx.Module, x: jax.Array) -> None:
  """Running statistics = those of one training-mode pass over ``x`` (momentum 0); eval mode."""
  if any(isinstance(m, nnx.BatchNorm) for _, m in iter_modules(model)):
    model.train()
    nnx.jit(lambda m, v: m(v))(model, x)
  model.eval()


def build(name: str, *, use_bn: bool = False, seed: int = 0,
          calibration: int = 8) -> nnx.Module:
  """The NNX model ``name`` with seeded random weights, in eval mode (BN calibrated).

  Built under ``nnx.jit`` (eager initialisation of ResNet-50 took 20-30 s on a CPU).
  """
  kind, sizes = parse_arch(name)

  def create():
    rngs = nnx.Rngs(seed)
    model = (ResNet50(rngs=rngs) if kind == "resnet50"
             else WideResNet(**sizes, use_bn=use_bn, rngs=rngs))
    randomize_batchnorm(model, seed + 2)
    return model

  model = nnx.jit(create)()
  calibrate_batchnorm(model, jax.random.uniform(jax.random.key(seed + 1),
                                                (calibration, *image_shape(name))))
  return model


def count_parameters(model: nnx.Module) -> int:
  return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(nnx.state(model, nnx.Param)))


def cast_state(state: Any, dtype: Any) -> Any:
  """Every floating leaf of an NNX state cast to ``dtype`` (once, outside the jitted call)."""
  return jax.tree.map(
    lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, state)


# ------------------------------------------------------------------------------------------------
# PyTorch mirrors.


def torch_classes():
  """The torch module classes (defined lazily: torch is optional)."""
  import torch
  from torch import nn
  from torch.nn import functional as F

  def tconv(i, o, k, s):
    return nn.Conv2d(i, o, k, s, padding=k // 2, bias=False)

  def tbn(c):
    return nn.BatchNorm2d(c, eps=BN_EPSILON)

  class TorchWideBlock(nn.Module):

    def __init__(self, i, o, s, use_bn):
      super().__init__()
      self.equal = i == o and s == 1
      self.bn1 = tbn(i) if use_bn else nn.Identity()
      self.conv1 = tconv(i, o, 3, s)
      self.bn2 = tbn(o) if use_bn else nn.Identity()
      self.conv2 = tconv(o, o, 3, 1)
      self.shortcut = None if self.equal else tconv(i, o, 1, s)

    def forward(self, x):
      pre = F.relu(self.bn1(x))
      out = self.conv2(F.relu(self.bn2(self.conv1(pre))))
      return out + (x if self.equal else self.shortcut(pre))

  class TorchWideResNet(nn.Module):

    def __init__(self, depth, width, num_classes, use_bn):
      super().__init__()
      n = (depth - 4) // 6
      widths = (16, 16 * width, 32 * width, 64 * width)
      self.stem = tconv(3, widths[0], 3, 1)
      blocks = []
      for group, stride in zip(range(3), (1, 2, 2)):
        for i in range(n):
          blocks.append(TorchWideBlock(widths[group] if i == 0 else widths[group + 1],
                                       widths[group + 1], stride if i == 0 else 1, use_bn))
      self.blocks = nn.ModuleList(blocks)
      self.bn = tbn(widths[3]) if use_bn else nn.Identity()
      self.head = nn.Linear(widths[3], num_classes)

    def forward(self, x):
      x = self.stem(x)
      for block in self.blocks:
        x = block(x)
      return self.head(F.relu(self.bn(x)).mean(dim=(2, 3)))

  class TorchBottleneck(nn.Module):

    def __init__(self, i, width, s):
      super().__init__()
      o = 4 * width
      self.conv1, self.bn1 = tconv(i, width, 1, 1), tbn(width)
      self.conv2, self.bn2 = tconv(width, width, 3, s), tbn(width)
      self.conv3, self.bn3 = tconv(width, o, 1, 1), tbn(o)
      project = s != 1 or i != o
      self.down_conv = tconv(i, o, 1, s) if project else None
      self.down_bn = tbn(o) if project else None

    def forward(self, x):
      out = F.relu(self.bn1(self.conv1(x)))
      out = F.relu(self.bn2(self.conv2(out)))
      out = self.bn3(self.conv3(out))
      shortcut = x if self.down_conv is None else self.down_bn(self.down_conv(x))
      return F.relu(out + shortcut)

  class TorchResNet50(nn.Module):

    def __init__(self, num_classes):
      super().__init__()
      self.stem, self.stem_bn = tconv(3, 64, 7, 2), tbn(64)
      self.pool = nn.MaxPool2d(3, 2, 1)
      blocks, i = [], 64
      for width, count, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for j in range(count):
          blocks.append(TorchBottleneck(i, width, stride if j == 0 else 1))
          i = 4 * width
      self.blocks = nn.ModuleList(blocks)
      self.head = nn.Linear(i, num_classes)

    def forward(self, x):
      x = self.pool(F.relu(self.stem_bn(self.stem(x))))
      for block in self.blocks:
        x = block(x)
      return self.head(x.mean(dim=(2, 3)))

  del torch
  return TorchWideResNet, TorchResNet50


def torch_mirror(name: str, model: nnx.Module, *, use_bn: bool = False):
  """A float32 PyTorch module (NCHW, eval mode, frozen weights) holding the NNX model's weights."""
  import torch

  wide, resnet = torch_classes()
  kind, sizes = parse_arch(name)
  num_classes = model.head.out_features
  mirror = resnet(num_classes) if kind == "resnet50" else wide(sizes["depth"], sizes["width"],
                                                               num_classes, use_bn)

  def tensor(a, *perm):
    a = np.asarray(jax.device_get(a), np.float32)
    return torch.from_numpy(np.array(a.transpose(*perm) if perm else a, copy=True))

  copied = 0
  with torch.no_grad():
    for path, module in iter_modules(model):
      if not isinstance(module, (nnx.Conv, nnx.Linear, nnx.BatchNorm)):
        continue
      target = mirror.get_submodule(".".join(str(p) for p in path))
      if isinstance(module, nnx.Conv):
        target.weight.copy_(tensor(module.kernel.value, 3, 2, 0, 1))  # HWIO -> OIHW
      elif isinstance(module, nnx.Linear):
        target.weight.copy_(tensor(module.kernel.value, 1, 0))
        target.bias.copy_(tensor(module.bias.value))
      else:
        target.weight.copy_(tensor(module.scale.value))
        target.bias.copy_(tensor(module.bias.value))
        target.running_mean.copy_(tensor(module.mean.value))
        target.running_var.copy_(tensor(module.var.value))
      copied += 1
  expected = sum(1 for m in mirror.modules()
                 if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear, torch.nn.BatchNorm2d)))
  if copied != expected:
    raise AssertionError(f"copied {copied} layers into a mirror that has {expected}")
  mirror.eval()
  for weight in mirror.parameters():
    weight.requires_grad_(False)
  return mirror


def nchw(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x).transpose(0, 3, 1, 2))


def check_mirror(jax_logits: Callable[[jax.Array], jax.Array], mirror, x: np.ndarray,
                 device: str = "cpu", rtol: float = 1e-3) -> float:
  """Largest |torch - JAX| logit difference over the largest |JAX logit|, both in full float32
  precision (no TF32); raises above ``rtol``."""
  import torch

  cudnn_tf32 = torch.backends.cudnn.allow_tf32
  matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
  torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
  try:
    with torch.no_grad():
      theirs = mirror(torch.from_numpy(nchw(x)).to(device)).float().cpu().numpy()
  finally:
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = (cudnn_tf32,
                                                                               matmul_tf32)
  with jax.default_matmul_precision("highest"):
    ours = np.asarray(jax_logits(jnp.asarray(x)), np.float32)
  rel = float(np.max(np.abs(theirs - ours)) / max(np.max(np.abs(ours)), 1e-30))
  if not rel <= rtol:
    raise AssertionError(f"the torch mirror's logits differ from JAX's by {rel:.3g} (relative "
                         f"to the largest logit), above {rtol:g}")
  return rel
