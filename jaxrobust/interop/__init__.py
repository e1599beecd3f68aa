"""Models from other frameworks: PyTorch modules through torchax (optional extra ``torch``).

* :func:`from_torch` ``(module, example_input)``: a ``torch.nn.Module`` in eval mode as a
  jaxrobust model, its parameters and buffers a pytree of ``jax.Array`` (arguments of compiled
  programs, never constants) and a pure apply on NHWC images.

This package imports without PyTorch; calling it without it raises an ``ImportError`` that
says ``pip install 'jaxrobust[torch]'``. Flax models (linen, NNX, weights saved with orbax or
msgpack) need no conversion: they are jaxrobust models as they are.
"""

from jaxrobust.interop._pytorch import TorchModel, UnsupportedOperationError, from_torch

__all__ = ["TorchModel", "UnsupportedOperationError", "from_torch"]
