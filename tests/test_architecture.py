"""The package's architecture as properties: layered imports without cycles (function bodies
included), no jaxrobust import inside a function body (the known exceptions listed), short
functions, module names that no function shadows, and no ``jax.jit`` below the drivers (see
ARCHITECTURE.md)."""

from __future__ import annotations

import ast
import importlib
import pathlib
import pkgutil
import types

import pytest

import jaxrobust

ROOT = pathlib.Path(jaxrobust.__file__).parent

# Lower layers never import higher ones. A module's layer is the first rule its name matches.
LAYERS = (
    ("base", ("jaxrobust._types", "jaxrobust._batch", "jaxrobust._validation",
              "jaxrobust._options", "jaxrobust._checkpoint", "jaxrobust._jaxpr_walk",
              "jaxrobust._cost", "jaxrobust.model", "jaxrobust._findings", "jaxrobust.diagnosis",
              "jaxrobust.projections", "jaxrobust.losses",
              "jaxrobust.metrics")),
    ("engine", ("jaxrobust.engine",)),
    ("attacks", ("jaxrobust.attacks",)),
    ("front doors", ("jaxrobust._run", "jaxrobust.curves", "jaxrobust.report",
                     "jaxrobust.checklist", "jaxrobust.evaluation", "jaxrobust.plotting",
                     "jaxrobust.certify", "jaxrobust.training", "jaxrobust.text",
                     "jaxrobust.interop")),
    # The applications: the demos' drivers, models and data, under the command line that runs
    # them (and jaxrobust/__init__.py, the rule every remaining module falls to).
    ("demos", ("jaxrobust.demo",)),
    ("command line", ("jaxrobust.cli", "jaxrobust.__main__", "jaxrobust")),
)
MAX_FUNCTION_LINES = 150  # including the docstring


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in ROOT.rglob("*.py"):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    out[name] = path
  return out


MODULES = _modules()


def _layer(name: str) -> int:
  for index, (_, prefixes) in enumerate(LAYERS):
    if any(name == p or name.startswith(p + ".") for p in prefixes):
      return index
  raise AssertionError(f"{name} is in no layer of LAYERS: add it")


def _imports(name: str) -> set[str]:
  """The jaxrobust modules ``name`` imports anywhere (function bodies included), with the
  subpackages whose ``__init__`` such an import executes; not ``name``'s own ancestors (Python
  initialises them before ``name``), so a submodule importing a sibling is no cycle."""
  path = MODULES[name]
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    targets = []
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([base] if base else []))
      targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
    for target in targets:
      if target in MODULES and target.startswith("jaxrobust"):
        parts = target.split(".")
        found.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
  ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
  return {m for m in found if m in MODULES and m != name and m not in ancestors}


GRAPH = {name: _imports(name) for name in MODULES}


def test_layers_import_only_downwards():
  upward = [f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
            for a, deps in GRAPH.items() for b in deps if _layer(b) > _layer(a)]
  assert not upward, "\n".join(upward)


def test_engine_never_imports_attacks():
  engine = {a: deps for a, deps in GRAPH.items() if a.startswith("jaxrobust.engine")}
  assert engine and not any(d.startswith("jaxrobust.attacks") for deps in engine.values()
                            for d in deps)


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """A cycle of ``graph`` as a list of nodes (first == last), or ``None``."""
  done, path = set(), []

  def visit(node):
    if node in path:
      return path[path.index(node):] + [node]
    if node in done:
      return None
    path.append(node)
    for dep in sorted(graph[node]):
      cycle = visit(dep)
      if cycle:
        return cycle
    path.pop()
    done.add(node)
    return None

  for name in sorted(graph):
    cycle = visit(name)
    if cycle:
      return cycle
  return None


def test_no_import_cycle_even_inside_functions():
  cycle = _find_cycle(GRAPH)
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_detector_finds_a_planted_cycle():
  planted = {name: set(deps) for name, deps in GRAPH.items()}
  planted["jaxrobust.engine.scoring"].add("jaxrobust.attacks._ensemble")  # ensemble -> engine
  assert "jaxrobust.engine.scoring" in _find_cycle(planted)


# Imports of jaxrobust modules inside function bodies that remain, as (module, function): the
# version that jaxrobust/__init__.py, which imports report.py, defines, and plotting (which draws
# with matplotlib, an optional extra) in Report.plot. Never add a module of jaxrobust.cli here.
FUNCTION_IMPORT_EXCEPTIONS = {("jaxrobust.report", "_version"), ("jaxrobust.report", "plot")}


def _function_imports(source: str) -> list[tuple[str, int, str]]:
  """``(function, line, module)`` of every import of a jaxrobust module inside a function body of
  ``source``: ``import``, ``from ... import`` (relative ones included, as ``.name``) and
  ``importlib.import_module``/``__import__`` of a literal ``"jaxrobust..."``; ``function`` is the
  innermost function around it."""
  found = []

  def named(module: str) -> bool:
    return module.startswith(".") or module == "jaxrobust" or module.startswith("jaxrobust.")

  def visit(node: ast.AST, function: str | None) -> None:
    for child in ast.iter_child_nodes(node):
      inner = function
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        inner = child.name
      elif function is not None:
        modules = []
        if isinstance(child, ast.Import):
          modules = [alias.name for alias in child.names]
        elif isinstance(child, ast.ImportFrom):
          modules = ["." * child.level + (child.module or "")]
        elif (isinstance(child, ast.Call) and child.args
              and isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str)
              and ((isinstance(child.func, ast.Attribute) and child.func.attr == "import_module")
                   or (isinstance(child.func, ast.Name) and child.func.id == "__import__"))):
          modules = [child.args[0].value]
        found.extend((function, child.lineno, m) for m in modules if named(m))
      visit(child, inner)

  visit(ast.parse(source), None)
  return found


def test_no_jaxrobust_import_inside_a_function_body():
  """A module's jaxrobust dependencies all stand at its top, where readers and the layer rules
  see them; the command line's included (``jaxrobust.cli`` imports every command, and each
  command its driver, at module level)."""
  found = [(name, function, line, module) for name, path in sorted(MODULES.items())
           for function, line, module in _function_imports(path.read_text())]
  unexpected = [f"{name}:{line} imports {module} inside {function}"
                for name, function, line, module in found
                if (name, function) not in FUNCTION_IMPORT_EXCEPTIONS]
  assert not unexpected, "\n".join(unexpected)
  stale = FUNCTION_IMPORT_EXCEPTIONS - {(name, function) for name, function, _, _ in found}
  assert not stale, f"no longer exceptions, remove them from FUNCTION_IMPORT_EXCEPTIONS: {stale}"
  assert not any(name.startswith("jaxrobust.cli") for name, _ in FUNCTION_IMPORT_EXCEPTIONS)


def test_the_function_import_detector_finds_planted_imports():
  planted = '''import importlib
import jaxrobust as jr
from jaxrobust.demo import files

def build_attacks(norm):
  import jaxrobust as jr  # noqa: PLC0415
  return jr.attacks.pgd(norm)

class Report:
  def plot(self):
    from . import plotting
    def inner():
      from jaxrobust.demo import data
      return importlib.import_module("jaxrobust.demo.text_demo")
    return inner

def load_user_module(name):
  import numpy as np
  import jaxrobustness
  return importlib.import_module(name)
'''
  assert _function_imports(planted) == [
    ("build_attacks", 6, "jaxrobust"), ("plot", 11, "."), ("inner", 13, "jaxrobust.demo"),
    ("inner", 14, "jaxrobust.demo.text_demo")]


def _jit_uses(source: str) -> list[int]:
  """Lines of ``source`` that use ``jax.jit`` (a call, a decorator, ``jax.jit`` passed on) or
  import ``jit`` from ``jax``; docstrings and comments are not code, so examples may show it."""
  lines = []
  for node in ast.walk(ast.parse(source)):
    if (isinstance(node, ast.Attribute) and node.attr == "jit" and isinstance(node.value, ast.Name)
        and node.value.id == "jax"):
      lines.append(node.lineno)
    elif isinstance(node, ast.ImportFrom) and node.module == "jax" and any(
        alias.name == "jit" for alias in node.names):
      lines.append(node.lineno)
  return sorted(lines)


DRIVERS = ("jaxrobust.evaluation", "jaxrobust.cli", "jaxrobust.demo")
"""The packages that own a whole loop (jr.evaluate, the command line, the demos' drivers): the
only ones that may compile."""


def test_only_the_drivers_call_jax_jit():
  """Only drivers that own the whole loop compile (ARCHITECTURE.md): every other function is
  traced by its caller (a user's jit, vmap, scan, shard_map), and host-side helpers stay eager."""
  below = [name for name in MODULES
           if not any(name == d or name.startswith(d + ".") for d in DRIVERS)]
  assert {"jaxrobust.metrics.intervals", "jaxrobust.engine.attack_loop", "jaxrobust.curves",
          "jaxrobust.attacks._apgd", "jaxrobust.certify", "jaxrobust.training"} <= set(below)
  found = [f"{name}:{line}" for name in below for line in _jit_uses(MODULES[name].read_text())]
  assert not found, "jax.jit below the drivers: " + ", ".join(found)


def test_the_jit_detector_finds_planted_uses():
  planted = '''import functools
import jax
from jax import jit

@functools.cache
def f():
  return jax.jit(abs)

@jax.jit
def g(x):
  """jax.jit(g) in a docstring."""
  return x  # jax.jit(x) in a comment
'''
  assert _jit_uses(planted) == [3, 7, 9]


def test_no_function_is_longer_than_150_lines():
  long = []
  for name, path in MODULES.items():
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        length = node.end_lineno - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
          long.append(f"{name}.{node.name}: {length} lines")
  assert not long, "\n".join(long)


def _packages() -> list[types.ModuleType]:
  return [importlib.import_module(name) for name, path in MODULES.items()
          if path.name == "__init__.py"]


def test_module_names_are_not_shadowed_by_functions():
  """``import jaxrobust.attacks._pgd as m`` must give a module, never the function ``pgd``."""
  shadowed = []
  for package in _packages():
    for info in pkgutil.iter_modules(package.__path__):
      value = getattr(package, info.name, None)
      if value is not None and not isinstance(value, types.ModuleType):
        shadowed.append(f"{package.__name__}.{info.name} is a {type(value).__name__}")
  assert not shadowed, "\n".join(shadowed)
