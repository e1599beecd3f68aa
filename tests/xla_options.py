"""The XLA options the test suite compiles with, readable before JAX starts (no JAX import here).

XLA:CPU has two code generators for fused computations: the fusion emitters (the default) and the
legacy emitters. The legacy ones compile this suite's programs in about two thirds of the CPU time
(measured on the whole suite, 2-core AMD EPYC, jax 0.10.2: 1362 -> 961 s user, 12:11 -> 8:38
wall), so ``tests/conftest.py`` adds :data:`LEGACY_EMITTERS` to ``XLA_FLAGS`` unless
``JAXROBUST_TEST_XLA_DEFAULTS=1`` or ``XLA_FLAGS`` already sets the option. Every test passes with
either (the closing note of issue #24 records both runs). A few large programs that run long
compile faster, or run faster, with the fusion emitters: they ask for them per program with
:data:`FUSION_EMITTERS` (``jax.jit(f).lower(...).compile(FUSION_EMITTERS | ...)``).
"""

from __future__ import annotations

import importlib.util
import mmap
import os
import pathlib

OPTION = "xla_cpu_use_fusion_emitters"
LEGACY_EMITTERS = f"--{OPTION}=false"


def xla_defines(name: str) -> bool:
  """Whether the installed jaxlib's XLA knows the option ``name``: XLA aborts the process on an
  unknown flag in ``XLA_FLAGS`` and refuses an unknown per-program option, so an option is only
  used where its name is in the library."""
  spec = importlib.util.find_spec("jaxlib")
  if spec is None or spec.origin is None:
    return False
  for library in pathlib.Path(spec.origin).parent.glob("*.so"):
    if library.stat().st_size == 0:
      continue
    with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
      if data.find(name.encode()) >= 0:
        return True
  return False


KNOWN = xla_defines(OPTION)
FUSION_EMITTERS = {OPTION: True} if KNOWN else {}
"""Per-program compile options that select the fusion emitters (empty where XLA lacks the option)."""


def suite_xla_flags(flags: str) -> str:
  """``XLA_FLAGS`` for the suite: ``flags`` plus :data:`LEGACY_EMITTERS` where it applies."""
  if os.environ.get("JAXROBUST_TEST_XLA_DEFAULTS") == "1" or OPTION in flags or not KNOWN:
    return flags
  return f"{flags} {LEGACY_EMITTERS}".strip()
