"""Atomic files for the demos, and their cache directory (:func:`default_cache_dir`): a crash
or a full disk never leaves a half-written cache or report.

Each writer puts the bytes in a temporary file in the target's directory, flushes and ``fsync``s
it, then renames it over the target with :func:`os.replace` (atomic on POSIX), so a reader sees
the old file or the new one, never a mixture. The temporary file is removed on any failure.

Examples:
  >>> import json, pathlib, tempfile
  >>> out = pathlib.Path(tempfile.mkdtemp()) / "sub" / "report.json"
  >>> write_json({"clean_accuracy": 0.98}, out) == out.resolve()
  True
  >>> json.loads(out.read_text())
  {'clean_accuracy': 0.98}
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any


def default_cache_dir() -> pathlib.Path:
  """Where both demos cache trained models (and the text demo compiled programs):
  ``$XDG_CACHE_HOME/jaxrobust`` if that variable is set and non-empty, else
  ``~/.cache/jaxrobust``."""
  base = os.environ.get("XDG_CACHE_HOME")
  root = pathlib.Path(base) if base else pathlib.Path.home() / ".cache"
  return root / "jaxrobust"


def write_bytes(path: os.PathLike | str, payload: bytes) -> pathlib.Path:
  """Writes ``payload`` to ``path`` atomically, creating the parent directories; returns the
  absolute path."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(payload)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise
  return path.resolve()


def write_json(report: Any, path: os.PathLike | str) -> pathlib.Path:
  """Writes ``report`` as indented JSON (a trailing newline) to ``path`` atomically; returns the
  absolute path."""
  return write_bytes(path, (json.dumps(report, indent=2) + "\n").encode("utf-8"))
