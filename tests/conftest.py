"""Test configuration: 8 CPU devices and strict promotion, set before any JAX operation.

How much XLA optimises: most test programs are tiny and compile-bound (seconds of optimising,
milliseconds of running), and ``jax_disable_most_optimizations`` (XLA:CPU backend optimisation
level 0, no expensive LLVM passes) compiles them in about half the time: 25-50% less CPU for
such a file (measured file by file). It is on for

* the doctests of ``jaxrobust/`` (set here at import, so whenever this file is loaded, as in the
  whole suite; ``pytest jaxrobust`` alone compiles them with XLA's defaults);
* every test of a module marked ``pytestmark = pytest.mark.compile_bound``, unless the test is
  marked ``run_bound``: programs that run long (900 APGD-T steps on 150 points run 3.5 times
  slower unoptimised, a small CNN under AutoAttack 20 times) belong in unmarked modules or carry
  that mark.

Which code generator: the suite compiles with XLA:CPU's legacy emitters instead of its default
fusion emitters (``tests/xla_options.py``; about a third less CPU for the whole suite), unless
``JAXROBUST_TEST_XLA_DEFAULTS=1`` is set or ``XLA_FLAGS`` already chooses; every test passes with
either, and with ``XLA_FLAGS=--xla_cpu_max_isa=AVX2`` (or ``SSE4_2``) on an AVX-512 machine.

Other test modules compile at XLA's default optimisation level. Unoptimised code can round
differently in the last bits (other fusion and vectorisation), so a test must not sit on a tie
that rounding decides (the AutoAttack doctest did: its success at exactly the minimal distance
flipped); every test passes with either setting. A module-scoped fixture compiles with its
module's setting.
"""

import importlib.util
import os

from tests.xla_options import suite_xla_flags

# Before jax is imported (XLA reads XLA_FLAGS once); subprocesses of tests inherit it.
os.environ["XLA_FLAGS"] = suite_xla_flags(os.environ.get("XLA_FLAGS", ""))
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
# Weights and data are arguments of every jitted function here, never closure constants (XLA
# constant-folds them). JAX warns when a program captures more constant bytes than this, and the
# suite turns the warning into an error. The library's own largest constants are Square's
# schedule and window tables: 112 KB in the suite's largest case (a run of the whole suite with
# JAX_CAPTURED_CONSTANTS_WARN_BYTES=16384 failed only in programs holding Square, every other
# program captured under 16 KB). Older jax releases without the option skip the guard.
CAPTURED_CONSTANTS_LIMIT_BYTES = 256 * 1024
if "jax_captured_constants_warn_bytes" in jax.config.values:
  jax.config.update("jax_captured_constants_warn_bytes", CAPTURED_CONSTANTS_LIMIT_BYTES)

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("jaxrobust", max_examples=60, deadline=None, derandomize=True)
settings.load_profile("jaxrobust")

_FAST_COMPILE = "jax_disable_most_optimizations"
_DOCTEST_DEFAULT = True  # outside the test modules: the doctests of jaxrobust/
jax.config.update(_FAST_COMPILE, _DOCTEST_DEFAULT)


@pytest.fixture(scope="session")
def devices():
  return jax.devices()


def _compile_bound(node) -> bool:
  """A ``run_bound`` mark on the test wins over its module's ``compile_bound`` mark."""
  if node is None or node.get_closest_marker("run_bound") is not None:
    return False
  return node.get_closest_marker("compile_bound") is not None


@pytest.fixture(scope="module", autouse=True)
def _module_compile_options(request):
  """The module's setting, for its module-scoped fixtures too (autouse: set up before them)."""
  jax.config.update(_FAST_COMPILE, _compile_bound(request.node))
  yield
  jax.config.update(_FAST_COMPILE, _DOCTEST_DEFAULT)


@pytest.fixture(autouse=True)
def _test_compile_options(request):
  """The test's own setting, then its module's again: no state leaks from test to test."""
  jax.config.update(_FAST_COMPILE, _compile_bound(request.node))
  yield
  jax.config.update(_FAST_COMPILE, _compile_bound(request.node.getparent(pytest.Module)))


# Which file runs first. The suite runs on two pytest-xdist workers, a whole file per worker at a
# time (``--dist loadfile``: a file's module-scoped programs compile once). xdist's default queue
# orders the files by their number of tests, which sends the few-test, long files (the notebooks,
# the ground-truth matrix, the WideResNet) last, where one worker runs them while the other has
# nothing left to do. ``--no-loadscope-reorder`` (pyproject.toml) keeps the order set here: the
# longest files first (longest-processing-time-first scheduling), every other file after them in
# collection order. The figures are each file's seconds in one run of the whole suite on a quiet
# 2-core machine (2026-11-29, test time summed per file); they only order the queue, so a stale
# figure costs time, never a test.
LONGEST_FIRST = {
    "tests/test_ground_truth.py": 98, "tests/test_notebooks.py": 78,
    "tests/test_honest_scores.py": 53, "tests/test_early_exit.py": 41,
    "tests/test_attack_conformance.py": 39, "tests/test_auto_attack.py": 39,
    "tests/test_demo.py": 38, "tests/test_equivalence.py": 36, "tests/test_square.py": 35,
    "tests/test_brendel_bethge.py": 35, "tests/test_propagations.py": 33, "tests/test_docs.py": 32,
    "tests/test_wide_resnet.py": 32, "tests/test_ground_truth_min_norm.py": 29,
    "tests/test_evaluate.py": 29, "tests/test_autoattack_reference.py": 27,
    "tests/test_min_norm_found.py": 26, "tests/test_ensemble.py": 26, "tests/test_training.py": 23,
    "tests/test_pgd_strength.py": 23, "tests/test_certify_bounds.py": 22,
    "tests/test_certify.py": 19, "tests/test_fast_evaluation.py": 19,
    "tests/test_certify_training_inputs.py": 18, "tests/test_text_gcg_cache.py": 16,
    "tests/test_apgd.py": 16, "tests/test_judged.py": 15, "tests/test_projections.py": 14,
}


# Library modules whose docstring examples import an optional package (PyTorch: the `test` extra
# installs it, a bare environment may not).
DOCTESTS_NEED = {"jaxrobust/interop/_pytorch.py": "torch"}


def pytest_collection_modifyitems(session, config, items):
  """Orders the files by :data:`LONGEST_FIRST`, keeping each file's tests together and in order;
  skips the examples of :data:`DOCTESTS_NEED` where their package is missing."""
  root = config.rootpath

  def file_of(item) -> str:
    try:
      return item.path.relative_to(root).as_posix()
    except ValueError:
      return item.path.as_posix()

  first_seen: dict[str, int] = {}
  for item in items:
    first_seen.setdefault(file_of(item), len(first_seen))
    needs = DOCTESTS_NEED.get(file_of(item))
    if needs and importlib.util.find_spec(needs) is None:  # as the test modules' importorskip
      item.add_marker(pytest.mark.skip(reason=f"its example needs {needs}, not installed"))
  order = {name: (-LONGEST_FIRST.get(name, 0), index) for name, index in first_seen.items()}
  items[:] = sorted(items, key=lambda item: order[file_of(item)])  # stable: in-file order kept
