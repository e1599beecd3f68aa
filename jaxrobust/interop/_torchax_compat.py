r"""Importing torchax 0.0.13 with a newer PyTorch: aliases for the named-tensor overloads it lists.

torchax 0.0.13 (the release on the package registry, written against PyTorch 2.11) names ATen
overloads at import time, in tables of its own: the operations whose PyTorch decompositions it
uses (``torchax/decompositions.py``) and its mixed-precision policies (``torchax/amp.py``). About
twenty of them are the *named-tensor* ("Dimname") overloads, e.g. ``aten.prod.dim_Dimname``,
``aten.norm.names_ScalarOpt_dim``, ``aten.std.names_dim`` and ``aten.unbind.Dimname``, which
PyTorch 2.13 removed: ``import torchax`` then fails with ``AttributeError: ... has no attribute
'dim_Dimname'``.

:func:`patch_missing_overloads` reads torchax's own source files for every
``torch.ops.aten.<op>.<overload>`` they mention and, for each overload that the installed PyTorch
lacks, sets that attribute on the operation's ``OpOverloadPacket`` to an overload the packet does
have (its ``default`` one, else its first). ``OpOverloadPacket`` caches the overloads it resolves
as attributes in just this way, so torchax's tables then build. It only *adds* names the
installed PyTorch does not have: no existing overload, lowering or decomposition changes, and with
PyTorch 2.11 (or any version that still has them) it adds nothing. The added names are the
named-tensor variants only: in torchax 0.0.13 each one sits in a table that lists the overload it
is aliased to as well, with the same treatment, so the tables' meaning is unchanged; and named
tensors (``Tensor.names``) are never produced by jaxrobust nor by the modules it converts
(torchax does not support them), so no aliased entry is ever dispatched.

Checked with torchax 0.0.13 and PyTorch 2.11 (nothing added) and 2.13 (21 aliases added).

Examples:
  >>> import importlib.util
  >>> importlib.util.find_spec("torchax") is None or isinstance(
  ...     patch_missing_overloads(), tuple)  # the names it added (none the second time)
  True
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
from typing import Any

_OVERLOAD = re.compile(r"torch\.ops\.aten\.(\w+)\.(\w+)")

_ADDED: list[str] = []  # "op.overload" of every alias this process added, in order


def referenced_overloads(root: pathlib.Path) -> set[tuple[str, str]]:
  """``(op, overload)`` of every ``torch.ops.aten.<op>.<overload>`` in the ``.py`` files under
  ``root``."""
  found: set[tuple[str, str]] = set()
  for path in sorted(root.rglob("*.py")):
    found.update(_OVERLOAD.findall(path.read_text(encoding="utf-8", errors="replace")))
  return found


def _torchax_root() -> pathlib.Path | None:
  spec = importlib.util.find_spec("torchax")
  if spec is None or not spec.submodule_search_locations:
    return None
  return pathlib.Path(next(iter(spec.submodule_search_locations)))


def _has_overload(packet: Any, overload: str) -> bool:
  try:
    getattr(packet, overload)
  except AttributeError:
    return False
  return True


def patch_missing_overloads(root: pathlib.Path | None = None) -> tuple[str, ...]:
  """Aliases every ATen overload that torchax's sources (under ``root``, by default the installed
  torchax) name and the installed PyTorch lacks; returns the ``"op.overload"`` names added by
  this call. Idempotent: a second call adds nothing. Imports ``torch``, never ``torchax``."""
  import torch  # noqa: PLC0415 - the optional extra, imported only when asked for

  root = _torchax_root() if root is None else root
  if root is None:
    return ()
  added = []
  for op, overload in sorted(referenced_overloads(root)):
    packet = getattr(torch.ops.aten, op, None)
    if packet is None or _has_overload(packet, overload):
      continue
    names = list(packet.overloads())
    if not names:
      continue
    target = "default" if "default" in names else names[0]
    setattr(packet, overload, getattr(packet, target))
    added.append(f"{op}.{overload}")
  _ADDED.extend(added)
  return tuple(added)


def added_aliases() -> tuple[str, ...]:
  """The ``"op.overload"`` aliases this process added so far (see the module)."""
  return tuple(_ADDED)
