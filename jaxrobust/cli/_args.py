"""Argument types and options that several commands of the ``jaxrobust`` command line share."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(minimum: int) -> Callable[[str], int]:
  """An argparse ``type``: an integer of at least ``minimum``, with a one-line error otherwise."""
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
      raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value

  parse.__name__ = f"integer >= {minimum}"
  return parse


def add_traceback_option(parser: argparse.ArgumentParser) -> None:
  """``--traceback``: show the Python traceback of an error instead of its one line."""
  parser.add_argument("--traceback", action="store_true", help="show Python tracebacks of errors")
