"""Models from other frameworks: PyTorch modules through torchax (optional extra ``torch``).

* :func:`from_torch` ``(module, example_input)``: a ``torch.nn.Module`` in eval mode as a
  jaxrobust model, its parameters and buffers a pytree of ``jax.Array`` (arguments of compiled
  programs, never constants) and a pure apply on NHWC images;
* :func:`load_state_dict` ``(module, path)``: a checkpoint as PyTorch users ship it
  (``torch.save`` state_dicts, ``.safetensors``) into the user's module definition, with
  PyTorch's strict key checks.

This package imports without PyTorch; calling them without it raises an ``ImportError`` that
says ``pip install 'jaxrobust[torch]'``. Flax models (linen, NNX, weights saved with orbax or
msgpack) need no conversion: they are jaxrobust models as they are.
"""

from jaxrobust.interop._checkpoint import load_state_dict
from jaxrobust.interop._pytorch import TorchModel, UnsupportedOperationError, from_torch

__all__ = ["TorchModel", "UnsupportedOperationError", "from_torch", "load_state_dict"]
