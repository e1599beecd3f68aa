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

Other test modules compile at XLA's default optimisation level. Unoptimised code can round differently in the
last bits (other fusion and vectorisation), so a test must not sit on a tie that rounding decides
(the AutoAttack doctest did: its success at exactly the minimal distance flipped); every test
passes with either setting. A module-scoped fixture compiles with its module's setting.
"""

import os

from tests.xla_options import suite_xla_flags

# Before jax is imported (XLA reads XLA_FLAGS once); subprocesses of tests inherit it.
os.environ["XLA_FLAGS"] = suite_xla_flags(os.environ.get("XLA_FLAGS", ""))
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

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
