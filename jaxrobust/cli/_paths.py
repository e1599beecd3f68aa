"""Paths the commands of the ``jaxrobust`` command line write to, checked before the work starts:
a path that could not be written fails at once in one line (exit status 2), not after the run or
as an internal error. The checks create nothing."""

from __future__ import annotations

import os
import pathlib

from jaxrobust.cli._errors import UserError


def nearest_existing(path: pathlib.Path) -> pathlib.Path:
  """``path`` (made absolute) or its nearest ancestor that exists."""
  path = path.absolute()
  while not path.exists():
    path = path.parent
  return path


def check_file_target(option: str, path: pathlib.Path, *, example: str,
                      create_folders: bool) -> None:
  """Raises :class:`UserError` when the file ``path`` given to ``option`` could not be written: a
  folder (``example`` names a file to suggest in it), or a file whose folder is a file or not
  writable. A missing folder is refused too unless the command creates it (``create_folders``;
  then its nearest existing ancestor must be a writable folder).

  Examples:
    >>> import pathlib, tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> check_file_target("--out", root / "x.png", example="x.png", create_folders=False)
    >>> try:
    ...   check_file_target("--out", root / "new" / "x.png", example="x.png", create_folders=False)
    ... except UserError as error:
    ...   print(str(error).replace(str(root), "ROOT").split("; ")[0])
    --out ROOT/new/x.png cannot be written: the folder ROOT/new does not exist
    >>> root.rmdir()
  """
  if path.is_dir():
    raise UserError(f"{option} {path} is a folder; give a file in it, e.g. "
                    f"{option} {path / example}")
  folder = path.absolute().parent
  ancestor = nearest_existing(folder)
  if not ancestor.is_dir():
    raise UserError(f"{option} {path} cannot be written: {ancestor} is a file, not a folder; "
                    "give a path in a folder you can write to")
  if ancestor != folder and not create_folders:
    raise UserError(f"{option} {path} cannot be written: the folder {folder} does not exist; "
                    "create it first or give a path in an existing folder")
  if not os.access(ancestor, os.W_OK | os.X_OK):
    raise UserError(f"{option} {path} cannot be written: the folder {ancestor} is not "
                    "writable; give a path in a folder you can write to")
