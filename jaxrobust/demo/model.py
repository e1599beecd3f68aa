"""The small NHWC convolutional network used by the demo, the tests and the benchmarks."""

from __future__ import annotations

import flax.linen as nn
import jax


class SmallCNN(nn.Module):
  """Two 3x3 convolutions and two dense layers for 8x8x1 digits, in NHWC layout.

  NHWC is Flax's layout and the fast one for XLA on CPU (NCHW convolutions inside loops run
  several times slower there, jax issue 12868).

  Layers: ``Conv(16, 3x3, SAME) -> relu -> Conv(32, 3x3, stride 2, SAME) -> relu -> flatten ->
  Dense(64) -> relu -> Dense(num_classes)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> model = SmallCNN()
    >>> params = jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> jax.jit(model.apply)(params, jnp.zeros((2, 8, 8, 1))).shape
    (2, 10)
  """

  num_classes: int = 10

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = nn.relu(nn.Conv(16, (3, 3), padding="SAME", name="conv1")(x))
    x = nn.relu(nn.Conv(32, (3, 3), strides=(2, 2), padding="SAME", name="conv2")(x))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(64, name="dense1")(x))
    return nn.Dense(self.num_classes, name="dense2")(x)
