"""The ``jaxrobust`` command line (also ``python -m jaxrobust``): ``demo``, ``evaluate`` and
``compare``.

One module per command, each with ``add_parser(commands)`` and ``main(args, argv) -> int``:

* :mod:`jaxrobust.cli.demo`: ``jaxrobust demo``, the digits demo (its driver is
  :mod:`jaxrobust.demo.digits`) or, with ``--text``, the text demo
  (:mod:`jaxrobust.demo.text_demo`);
* :mod:`jaxrobust.cli.evaluate`: ``jaxrobust evaluate MODULE:FUNCTION --data FILE.npz --eps
  8/255`` evaluates a user's own model;
* :mod:`jaxrobust.cli.compare`: ``jaxrobust compare DIR ...`` overlays saved reports.

What the commands share: argument types (:mod:`jaxrobust.cli._args`) and, for ``evaluate`` and
``compare``, one-line errors with their exit statuses (:mod:`jaxrobust.cli._errors`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Optional

from jaxrobust.cli import compare, demo, evaluate

COMMANDS = {"demo": demo, "evaluate": evaluate, "compare": compare}  # in the order of --help


def build_parser() -> argparse.ArgumentParser:
  """The argument parser of the ``jaxrobust`` command."""
  parser = argparse.ArgumentParser(
    prog="jaxrobust", description="Empirical adversarial robustness evaluation in JAX."
  )
  commands = parser.add_subparsers(dest="command", metavar="COMMAND")
  for command in COMMANDS.values():
    command.add_parser(commands)
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs the ``jaxrobust`` command and returns its exit status (never raises ``SystemExit``).

  Args:
    argv: the arguments after the program name; ``None`` means ``sys.argv[1:]``.

  Returns:
    0 on success, 1 if the command failed, 2 for bad command-line options (and, for
    ``evaluate``/``compare``, mistakes in the user's module or data), 130 when interrupted.

  Examples:
    >>> main(["demo", "--epochs", "1", "--test-size", "32", "--num-eps", "2", "--steps", "2",
    ...       "--no-cache", "--quiet", "--out", "/tmp/report.json"])  # doctest: +SKIP
    0
  """
  parser = build_parser()
  try:
    args = parser.parse_args(argv)
  except SystemExit as exit_:  # argparse's --help (0) and usage errors (2)
    return exit_.code if isinstance(exit_.code, int) else 2
  if args.command is None:
    parser.print_help(sys.stderr)
    return 2
  argv = list(sys.argv[1:] if argv is None else argv)
  return COMMANDS[args.command].main(args, argv)
