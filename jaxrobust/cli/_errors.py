"""One-line errors and exit statuses of ``jaxrobust evaluate`` and ``jaxrobust compare``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


class UserError(Exception):
  """A mistake in the user's module, data or options: reported in one line, exit status 2."""


def one_line(error: BaseException) -> str:
  """``"TypeName: message"`` with the message's whitespace collapsed (the type alone if empty),
  followed by the notes jaxrobust added to it (e.g. "put the model in eval mode")."""
  notes = [n for n in getattr(error, "__notes__", ()) if n.startswith("jaxrobust: ")]
  text = " ".join(" ".join([str(error), *notes]).split())
  return f"{type(error).__name__}: {text}" if text else type(error).__name__


def main_command(name: str, run: Callable[[], Any], args: argparse.Namespace) -> int:
  """Runs a command, turning errors into one line and an exit status: 2 for the user's mistakes
  (and ``ValueError``/``TypeError`` from the library about the inputs), 1 for anything else,
  130 when interrupted."""
  try:
    run()
  except KeyboardInterrupt:
    where = getattr(args, "checkpoint", None)
    again = f"; run the same command to resume from {where}" if where else ""
    print(f"jaxrobust {name}: interrupted{again}", file=sys.stderr)
    return 130
  except (UserError, ValueError, TypeError) as error:
    if args.traceback:
      raise
    message = str(error) if isinstance(error, UserError) else one_line(error)
    print(f"jaxrobust {name}: error: {message}", file=sys.stderr)
    return 2
  except Exception as error:  # noqa: BLE001 - one line; --traceback for the rest
    if args.traceback:
      raise
    print(f"jaxrobust {name}: internal error: {one_line(error)} (rerun with --traceback and "
          "report it)", file=sys.stderr)
    return 1
  return 0
