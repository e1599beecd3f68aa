"""Atomic, self-describing checkpoints for :func:`jaxrobust.evaluate`.

A checkpoint is one ``.npz`` file: a JSON header (fingerprint of the run, position in the data,
running data hash, reducer counts) plus NumPy arrays. It is replaced atomically after every batch:
written to a temporary file in the same directory, flushed and ``fsync``-ed, then renamed over
the old one with :func:`os.replace` (atomic on POSIX), and the directory is ``fsync``-ed. A
process killed at any moment (SIGKILL included) leaves either the old or the new checkpoint,
never a torn one.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np

_HEADER = "__header__"


def save(path: os.PathLike | str, header: Mapping[str, Any],
         arrays: Mapping[str, np.ndarray] | None = None) -> None:
  """Atomically replaces ``path`` with a checkpoint holding ``header`` (JSON) and ``arrays``.

  Args:
    path: the checkpoint file.
    header: JSON-serialisable metadata.
    arrays: named NumPy arrays.
  """
  path = pathlib.Path(path)
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  payload = {_HEADER: np.asarray(json.dumps(dict(header), sort_keys=True))}
  payload.update(arrays or {})
  with open(tmp, "wb") as f:
    np.savez(f, **payload)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  try:  # persist the rename itself
    fd = os.open(path.parent, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def load(path: os.PathLike | str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
  """``(header, arrays)`` of the checkpoint at ``path``, or ``None`` if there is none.

  Raises:
    ValueError: the file exists but is not a checkpoint written by :func:`save`.
  """
  path = pathlib.Path(path)
  if not path.exists():
    return None
  try:
    with np.load(path, allow_pickle=False) as f:
      header = json.loads(str(f[_HEADER]))
      arrays = {k: f[k] for k in f.files if k != _HEADER}
  except Exception as e:
    raise ValueError(f"{path} is not a jaxrobust.evaluate checkpoint ({e}). Delete it or pass "
                     "another checkpoint path.") from e
  return header, arrays
