"""``jaxrobust compare DIR1 DIR2 ...``: prints the worst-case robust accuracies of saved reports
(directories written by ``jaxrobust evaluate``) side by side, each with its static
gradient-masking diagnosis if it has one, and overlays their curves in one PNG.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

import jaxrobust as jr
from jaxrobust.cli._args import add_traceback_option
from jaxrobust.cli._errors import UserError, main_command, one_line
from jaxrobust.cli._paths import check_file_target


def add_parser(commands: Any) -> None:
  """Adds the ``compare`` sub-command to ``commands`` (an argparse sub-parser group)."""
  p = commands.add_parser(
      "compare", help="compare saved reports (directories written by jaxrobust evaluate)",
      description="Print the worst-case robust accuracies of saved reports side by side and "
      "overlay their curves in one PNG.")
  p.add_argument("reports", nargs="+", type=pathlib.Path, metavar="DIR",
                 help="directories holding report.json")
  p.add_argument("--labels", default=None, help="comma-separated labels (default: the "
                 "directory names)")
  p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("compare.png"),
                 help="where to write the overlay (default: ./compare.png)")
  add_traceback_option(p)


def run_compare(args: argparse.Namespace) -> dict[str, Any]:
  """Loads the saved reports, prints their worst-case curves side by side, writes the overlay.
  Raises :class:`UserError` for a ``--out`` that could not be written (checked first: a folder, a
  missing or unwritable folder), bad labels, a missing or malformed ``report.json`` (a report is
  its folder or that file); warns (stderr) when the reports are for different norms."""
  check_file_target("--out", args.out, example="compare.png", create_folders=False)
  # A report is its folder or that folder's report.json.
  folders = [d.parent if d.name == "report.json" and d.is_file() else d for d in args.reports]
  labels = ([s.strip() for s in args.labels.split(",")] if args.labels
            else [d.resolve().name for d in folders])
  if len(labels) != len(folders):
    raise UserError(f"{len(labels)} labels for {len(folders)} reports")
  if len(set(labels)) != len(labels):
    raise UserError(f"labels must differ, got {labels} (pass --labels)")
  reports = {}
  for label, directory in zip(labels, folders):
    if not (directory / "report.json").is_file():
      raise UserError(f"{directory} has no report.json")
    try:
      reports[label] = jr.Report.load(directory)
    except (KeyError, ValueError, OSError) as error:
      raise UserError(f"cannot read {directory / 'report.json'}: {one_line(error)}") from error
    except (TypeError, AttributeError) as error:  # e.g. "attacks" a list, not a mapping
      raise UserError(f"cannot read {directory / 'report.json'}: it is not a report written by "
                      f"jaxrobust evaluate or Report.save (a field has the wrong type: "
                      f"{one_line(error)})") from error
  norms = {label: r.worst_case.norm for label, r in reports.items()}
  if len(set(norms.values())) > 1:
    shown = ", ".join(f"{label}: {norm}" for label, norm in norms.items())
    print(f"warning: the reports are for different norms ({shown}): their eps axes measure "
          "different things, so the overlay's curves are not comparable", file=sys.stderr)
  print(compare_table(reports))
  jr.plotting.plot_reports(reports, args.out)
  print(f"Overlay written to {args.out.resolve()}")
  return reports


def compare_table(reports: dict[str, Any]) -> str:
  """One line per report: examples, clean accuracy, worst-case robust accuracy at each eps; below
  it, indented, the report's "Gradient masking (static)" section if it has a diagnosis."""
  lines = []
  for label, r in reports.items():
    cells = ", ".join(f"{e:g}: {a:.4f}" for e, a in zip(r.epsilons, r.worst_case.robust_accuracy))
    lines.append(f"{label}: {r.num_examples} examples ({r.worst_case.norm}), clean "
                 f"{r.clean_accuracy:.4f}; worst case {cells}")
    if r.diagnosis is not None:
      lines.append(textwrap.indent(r.diagnosis.section(), "  "))
  return "\n".join(lines)


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
  """``jaxrobust compare``: the exit status (``argv`` is not recorded anywhere)."""
  return main_command("compare", lambda: run_compare(args), args)
