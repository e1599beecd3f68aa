"""Checkpoints as PyTorch users ship them, loaded into the user's own module definition.

Two formats: a ``state_dict`` saved with ``torch.save(module.state_dict(), path)`` (read with
``torch.load(path, map_location="cpu", weights_only=True)``: tensors and plain containers only,
never arbitrary pickled objects), and a ``.safetensors`` file (read with the ``safetensors``
package's NumPy API, no pickle and no PyTorch involved in the reading; dtypes NumPy lacks, such
as bfloat16, through its PyTorch API). Either goes into ``module`` with
``module.load_state_dict(state, strict=True)``: missing and unexpected keys and shape mismatches
raise PyTorch's own ``RuntimeError``, its message prefixed with the file.

References:
  PyTorch, "Saving and loading models" (``state_dict``, ``weights_only``); Hugging Face
  safetensors, ``safetensors.numpy.load_file``.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

from jaxrobust.interop._pytorch import EXTRA, import_torch


def _read_safetensors(torch: Any, path: pathlib.Path) -> dict[str, Any]:
  try:
    import safetensors.numpy  # noqa: PLC0415 - part of the optional extra
  except ImportError as error:
    raise ImportError(f"reading .safetensors needs the safetensors package: {EXTRA}") from error
  import numpy as np  # noqa: PLC0415

  try:
    arrays = safetensors.numpy.load_file(path)
    return {name: torch.from_numpy(np.array(value)) for name, value in arrays.items()}
  except (TypeError, ValueError):
    # A dtype NumPy has not (bfloat16): an error in older safetensors releases, an ml_dtypes
    # array that torch.from_numpy refuses in newer ones. PyTorch reads it.
    import safetensors.torch  # noqa: PLC0415

    return safetensors.torch.load_file(path, device="cpu")


def load_state_dict(module: Any, path: str | os.PathLike, *, strict: bool = True) -> Any:
  """Loads the checkpoint at ``path`` into ``module`` and returns ``module``.

  Args:
    module: the ``torch.nn.Module`` the checkpoint was saved from (a fresh instance of its class).
    path: a ``.safetensors`` file, or any other file as saved by ``torch.save`` holding a
      ``state_dict`` (name -> tensor), read with ``weights_only=True``.
    strict: as for ``module.load_state_dict``: every key must match (default).

  Returns:
    ``module``, its parameters and buffers replaced (its training mode unchanged: call
    ``module.eval()`` before :func:`jaxrobust.interop.from_torch`).

  Raises:
    ImportError: PyTorch (or safetensors, for a ``.safetensors`` file) is not installed.
    FileNotFoundError: no file at ``path``.
    TypeError: the file holds no ``state_dict`` (a mapping of names to tensors).
    RuntimeError: PyTorch's missing/unexpected key or shape error, prefixed with the file.
  """
  torch, _ = import_torch()
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"no checkpoint file at {path}")
  if path.suffix == ".safetensors":
    state = _read_safetensors(torch, path)
  else:
    state = torch.load(path, map_location="cpu", weights_only=True)
  if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
    keys = list(state)[:5] if isinstance(state, dict) else None
    raise TypeError(f"{path} holds no state_dict (a dict of names to tensors) but a "
                    f"{type(state).__name__}" + (f" with keys {keys}; if the weights are under "
                                                 "one of them, load it with torch.load and call "
                                                 "module.load_state_dict" if keys else ""))
  try:
    module.load_state_dict(state, strict=strict)
  except RuntimeError as error:
    raise RuntimeError(f"{path}: {error}") from error
  return module
