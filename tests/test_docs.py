"""The documentation runs: every ```python block of docs/API.md and of the README is executed, the
signatures docs/API.md prints are the code's, and the README's claims about models whose weights
change between calls are checked by counting compilations.

A block preceded by the line ``<!-- skip -->`` is not run: in the README, the blocks before "Flax
NNX and linen" use the reader's own model and data (``model``, ``params``, ``x``), a mesh, a
cluster or minutes of AutoAttack compute; every block from "Flax NNX and linen" on runs. The blocks of one file run in order in one namespace, as a reader would run
them, inside a temporary working directory.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxrobust as jr

pytestmark = pytest.mark.compile_bound  # see tests/conftest.py

ROOT = pathlib.Path(__file__).resolve().parent.parent
API_MD = ROOT / "docs" / "API.md"
README = ROOT / "README.md"
SKIP = "<!-- skip -->"
MAINTAINER = "(written by the maintainer)"



def code_blocks(path: pathlib.Path, language: str = "python") -> list[tuple[int, str, bool]]:
  """``(line number, code, skipped)`` of every fenced block of ``language`` in ``path``."""
  blocks, lines, i = [], path.read_text().splitlines(), 0
  while i < len(lines):
    if lines[i].strip() == f"```{language}":
      previous = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
      end = lines.index("```", i + 1)
      blocks.append((i + 1, "\n".join(lines[i + 1:end]), previous == SKIP))
      i = end
    i += 1
  return blocks


def run_blocks(path: pathlib.Path, namespace: dict) -> list[int]:
  """Executes the unskipped python blocks of ``path`` in order; returns their line numbers."""
  ran = []
  for line, code, skipped in code_blocks(path):
    if skipped:
      continue
    try:
      exec(compile(code, f"{path.name}:{line}", "exec"), namespace)  # noqa: S102 (the docs)
    except Exception as error:
      raise AssertionError(f"{path.name}, block at line {line} failed: {error!r}") from error
    ran.append(line)
  return ran


def backend_compiles() -> contextlib.AbstractContextManager[list]:
  """Collects one entry per XLA backend compilation while the context is open."""
  events: list = []

  def listener(name, _duration, **_):
    if name == "/jax/core/compile/backend_compile_duration":
      events.append(name)

  @contextlib.contextmanager
  def collecting():
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
      yield events
    finally:
      jax.monitoring.unregister_event_duration_listener(listener)

  return collecting()


# ------------------------------------------------------------------------------------------------
# docs/API.md


def test_api_examples_run(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  ran = run_blocks(API_MD, {"__name__": "api_md"})
  assert len(ran) >= 9 and not any(skipped for _, _, skipped in code_blocks(API_MD))


def _documented_signatures(text: str) -> dict[str, str]:
  """``jr.<name>(...)`` signatures in the ```text blocks and table rows of API.md."""
  sources = [m.group(1) for m in re.finditer(r"```text\n(.*?)```", text, re.S)]
  sources += [line for line in text.splitlines() if line.startswith("|")]
  found = {}
  for source in sources:
    for match in re.finditer(r"`?(jr\.[\w.]+)\(", source):
      depth, start = 0, match.end() - 1
      for end in range(start, len(source)):
        depth += {"(": 1, ")": -1}.get(source[end], 0)
        if depth == 0:
          break
      found.setdefault(match.group(1), source[start:end + 1])
  return found


def _code_signature(obj) -> str:
  sig = inspect.signature(obj)
  sig = sig.replace(parameters=[p.replace(annotation=inspect.Parameter.empty)
                                for p in sig.parameters.values()],
                    return_annotation=inspect.Signature.empty)
  return str(sig).replace("<class 'jax.numpy.float32'>", "jnp.float32")


def test_api_signatures_are_the_code():
  documented = _documented_signatures(API_MD.read_text())
  assert len(documented) >= 50
  for name, text in documented.items():
    obj = functools.reduce(getattr, name.split(".")[1:], jr)
    assert re.sub(r"\s+", " ", text) == _code_signature(obj), name


def test_api_covers_every_public_name():
  text = API_MD.read_text()
  documented = _documented_signatures(text)
  public = [f"jr.{n}" for n in jr.__all__ if not inspect.ismodule(getattr(jr, n))]
  public += [f"jr.attacks.{n}" for n in jr.attacks.__all__]
  public += [f"jr.metrics.{n}" for n in jr.metrics.__all__ if n[0].islower()]
  public += [f"jr.certify.{n}" for n in jr.certify.__all__]
  public += [f"jr.training.{n}" for n in jr.training.__all__]
  public += [f"jr.text.{n}" for n in jr.text.__all__]
  public += [f"jr.projections.{n}" for n in ("norm", "project", "project_box", "project_l1_box",
                                            "sample_ball", "dual_norm")]
  public += [f"jr.losses.{n}" for n in jr.losses.LOSSES[1:]] + [
      f"jr.losses.{n}" for n in ("cross_entropy", "targeted_cross_entropy", "targeted_margin",
                                 "targeted_dlr")]
  classes = {"jr.Report", "jr.CurveConsistency",  # documented by their fields, not a call
             "jr.text.Result", "jr.text.GCGResult", "jr.text.WordSwap", "jr.text.GCG",
             "jr.text.GCGState"}
  missing = [n for n in public if n not in documented and not (n in classes and n in text)]
  assert not missing
  for reducer in ("Counts", "CurveCounts", "NormHistogram", "Rate", "Reducer"):
    assert f"`{reducer}`" in text or f"jr.metrics.{reducer}" in text, reducer
  assert text.count("## Reports, plots and the command line\n") == 1 and MAINTAINER not in text


# ------------------------------------------------------------------------------------------------
# README.md


@pytest.fixture(scope="module")
def readme_namespace(tmp_path_factory):
  """The namespace after running every unskipped README block (the NNX model, data, attack)."""
  with pytest.MonkeyPatch.context() as patch:
    patch.chdir(tmp_path_factory.mktemp("readme"))
    namespace = {"__name__": "readme"}
    ran = run_blocks(README, namespace)
  return namespace, ran


def test_readme_examples_run(readme_namespace):
  namespace, ran = readme_namespace
  sections = README.read_text().split("## Flax NNX and linen")[1]
  assert len(ran) >= sections.count("```python") - sections.count(f"{SKIP}\n```python")
  # The NNX module under nnx.jit and its split state under jax.jit attack the same model, and the
  # last evaluation saw the trained weights (its report is a valid curve of the 64 examples).
  assert np.array_equal(namespace["result"].x_adv, namespace["same"].x_adv)
  assert namespace["linen_result"].x_adv.shape == (64, 8, 8, 1)
  report = namespace["report"]
  assert report.num_examples == 64
  assert np.all(np.diff(report.worst_case.robust_accuracy) <= 0)


def test_readme_stands_alone():
  text = README.read_text()
  assert "](docs/API.md)" in text and API_MD.exists()
  assert "../" not in text and "/work/" not in text and "shared/API.md" not in text
  # CI runs the second command verbatim.
  assert "```bash\npip install -e '.[demo]' && jaxrobust demo\n```" in text
  assert "```bash\npip install -e '.[test]' && python -m pytest -q\n```" in text
  section = "## Your own model on the command line\n\n"
  assert text.count(section) == 1
  assert MAINTAINER not in text and "jaxrobust evaluate" in text.split(section)[1]


def test_new_nnx_weights_reuse_the_compiled_step_and_change_the_report(readme_namespace):
  """What "Evaluating while the weights change" promises, on the README's NNX CNN and data."""
  namespace, _ = readme_namespace
  from flax import nnx
  model, data, attack = namespace["model"], namespace["data"], namespace["attack"]
  evaluate = functools.partial(jr.evaluate, data=data, attacks={"pgd": attack},
                               epsilons=[2 / 255, 8 / 255], key=jax.random.key(0),
                               batch_size=32, progress=False)
  before = evaluate(model)
  # New weights, as an optimizer would leave them: the head now always predicts class 0.
  bias = nnx.state(model, nnx.Param)["head"]["bias"]
  nnx.update(model, {"head": {"bias": bias[...] + jnp.array([50.0] + [0.0] * 9)}})
  with backend_compiles() as compiles:
    after = evaluate(model)
  assert after.clean_accuracy == float(np.mean(data[1] == 0)) != before.clean_accuracy
  assert len(compiles) == 0
  # A closure over the same weights has them compiled in as constants: new weights recompile.
  graphdef, state = nnx.split(model)
  closure = lambda v: nnx.merge(graphdef, state)(v)  # noqa: E731
  evaluate(closure)
  state = jax.tree.map(lambda a: a * 1.0, state)
  with backend_compiles() as compiles:
    evaluate(closure)
  assert len(compiles) >= 1
