"""Atomic, self-describing checkpoints for :func:`jaxrobust.evaluate`.

A checkpoint is one ``.npz`` file: a JSON header (fingerprint of the run, position in the data,
running data hash, reducer counts) plus NumPy arrays. It is replaced atomically after every batch:
written to a temporary file in the same directory, flushed and ``fsync``-ed, then renamed over
the old one with :func:`os.replace` (atomic on POSIX), and the directory is ``fsync``-ed. A
process killed at any moment (SIGKILL included) leaves either the old or the new checkpoint,
never a torn one. The temporary file has a unique name (:func:`tempfile.mkstemp`), so writers in
several threads or processes never share one: the file ends up holding one writer's complete
checkpoint (the last to rename), never a mixture.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile
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

  Examples:
    >>> import os, tempfile
    >>> import numpy as np
    >>> from jaxrobust import _checkpoint
    >>> directory = tempfile.mkdtemp()
    >>> path = os.path.join(directory, "run.ckpt")
    >>> _checkpoint.save(path, {"position": 3}, {"robust": np.array([5, 2])})
    >>> header, arrays = _checkpoint.load(path)
    >>> header, arrays["robust"].tolist(), os.listdir(directory)  # no temporary file left
    ({'position': 3}, [5, 2], ['run.ckpt'])
  """
  path = pathlib.Path(path)
  payload = {_HEADER: np.asarray(json.dumps(dict(header), sort_keys=True))}
  payload.update(arrays or {})
  # A name of its own for every call: a pid-based name is shared by the threads of one process,
  # which then write into, and rename, each other's half-written file.
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez(f, **payload)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise
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
