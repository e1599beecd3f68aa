"""``python -m jaxrobust``: the same command line as the ``jaxrobust`` console script."""

from __future__ import annotations

from jaxrobust.cli import main

if __name__ == "__main__":
  raise SystemExit(main())
