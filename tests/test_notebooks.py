"""Every notebook in ``notebooks/`` runs without error, and the outputs stored in it are current.

Each notebook is executed on a copy (the file is never written by the test) in a fresh Jupyter
kernel that runs *this* interpreter (``sys.executable``), whatever kernelspec of the notebook's
name the machine has installed, with ``JAX_PLATFORMS=cpu``, in the notebook's directory. Then every
code cell's stored text outputs must equal the fresh ones: the ``stdout`` stream, and the
``text/plain`` form and MIME types of results and displays (an image must be present in both;
its bytes are not compared, since PNG encoders differ between matplotlib builds). ``stderr`` is
not compared: warnings printed by libraries in the kernel are not the notebook's content and must
not fail it.

To refresh the stored outputs after changing a notebook (or the library under it), run from the
repository root::

    python tests/test_notebooks.py            # every notebook
    python tests/test_notebooks.py notebooks/quickstart.ipynb
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import warnings

import pytest

# Some jupyter_core 5.x releases warn (a DeprecationWarning, when jupyter_core.paths is first
# imported) that their per-user paths will move to platformdirs unless JUPYTER_PLATFORM_DIRS is
# set. Nothing here uses those paths (the kernelspec and the connection file live in a temporary
# directory) and pytest turns warnings into errors, so that one warning is ignored on import.
JUPYTER_PATHS_WARNING = "Jupyter is migrating its paths"
with warnings.catch_warnings():
  warnings.filterwarnings("ignore", JUPYTER_PATHS_WARNING, DeprecationWarning)
  import nbclient
  import nbformat
  from jupyter_client.kernelspec import KernelSpecManager
  from jupyter_client.manager import AsyncKernelManager
  from traitlets import default

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 120
KERNEL_ENV = {"JAX_PLATFORMS": "cpu"}
# Appended to the executed copy only: proves the kernel is this interpreter.
PROBE = "import sys\nprint(sys.executable)"


def _kernel_manager_class(kernel_dir: pathlib.Path, kernel_name: str) -> type:
  """An ``AsyncKernelManager`` that finds only one kernelspec: ``kernel_name`` on this Python.

  A kernelspec of the same name installed on the machine (a system ``python3`` kernel, another
  virtual environment's) is never consulted, so the notebook runs against the library and
  packages the test suite itself imports.
  """
  spec_dir = kernel_dir / kernel_name
  spec_dir.mkdir(parents=True, exist_ok=True)
  spec = {
    "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    "display_name": f"Python ({sys.executable})",
    "language": "python",
    "env": KERNEL_ENV,
  }
  (spec_dir / "kernel.json").write_text(json.dumps(spec))

  class ThisInterpreterKernelManager(AsyncKernelManager):

    @default("kernel_spec_manager")
    def _only_this_interpreter(self):
      return KernelSpecManager(kernel_dirs=[str(kernel_dir)])

    @default("connection_file")
    def _connection_file_beside_spec(self):
      return str(kernel_dir / "connection.json")

  return ThisInterpreterKernelManager


def execute(path: pathlib.Path, kernel_dir: pathlib.Path) -> tuple[nbformat.NotebookNode, str]:
  """Executes a copy of the notebook at ``path``; returns it and the kernel's ``sys.executable``.

  Raises ``nbclient.exceptions.CellExecutionError`` (with the traceback) if a cell raises.
  """
  notebook = nbformat.read(path, as_version=4)
  kernelspec = notebook.metadata.get("kernelspec", {})
  kernel_name = kernelspec.get("name", "python3")
  language = notebook.metadata.get("language_info", {}).get("name", "python")
  assert language == "python", f"{path.name}: a {language!r} notebook cannot run in ipykernel"
  notebook.cells.append(nbformat.v4.new_code_cell(PROBE))
  client = nbclient.NotebookClient(
    notebook, timeout=CELL_TIMEOUT_S, startup_timeout=60, kernel_name=kernel_name,
    kernel_manager_class=_kernel_manager_class(kernel_dir, kernel_name), record_timing=False,
    resources={"metadata": {"path": str(path.parent)}},
  )
  client.execute()
  probe = notebook.cells.pop()
  return notebook, "".join(output.get("text", "") for output in probe.outputs).strip()


def text_outputs(cell: nbformat.NotebookNode) -> dict[str, object]:
  """The deterministic content of a code cell's outputs: stdout and the text of results.

  Streams are joined (the kernel may split one ``print`` sequence into several messages);
  ``stderr`` is left out, and of rich outputs only the ``text/plain`` form and the set of MIME
  types are kept.
  """
  stdout, rich = [], []
  for output in cell.outputs:
    if output.output_type == "stream":
      if output.name == "stdout":
        stdout.append(output.text)
    elif output.output_type in ("execute_result", "display_data"):
      rich.append((output.output_type, sorted(output.data), output.data.get("text/plain")))
    else:  # an error output
      rich.append((output.output_type, output.get("ename"), output.get("evalue")))
  return {"stdout": "".join(stdout), "rich": rich}


def test_notebooks_exist():
  # An empty glob would silently parametrize the test below away.
  assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_notebook_runs_and_stored_outputs_are_current(path, tmp_path):
  stored = nbformat.read(path, as_version=4)
  nbformat.validate(stored)
  fresh, kernel_python = execute(path, tmp_path / "kernels")

  assert kernel_python == sys.executable
  stored_code = [cell for cell in stored.cells if cell.cell_type == "code"]
  fresh_code = [cell for cell in fresh.cells if cell.cell_type == "code"]
  assert [cell.source for cell in fresh_code] == [cell.source for cell in stored_code]
  stale = "stale stored outputs: run `python tests/test_notebooks.py` to refresh them"
  assert [cell.execution_count for cell in stored_code] == list(range(1, len(stored_code) + 1)), (
    f"{path.name}: not executed top to bottom in one kernel; {stale}")
  for index, (old, new) in enumerate(zip(stored_code, fresh_code)):
    assert text_outputs(old) == text_outputs(new), f"{path.name}, code cell {index}: {stale}"


def main(paths: list[str]) -> None:
  """Executes the given notebooks (default: all) and stores their outputs in place."""
  for path in [pathlib.Path(p).resolve() for p in paths] or NOTEBOOKS:
    with tempfile.TemporaryDirectory() as kernel_dir:
      executed, kernel_python = execute(path, pathlib.Path(kernel_dir))
    assert kernel_python == sys.executable, kernel_python
    nbformat.validate(executed)
    nbformat.write(executed, path)
    print(f"executed and stored {path.name}")


if __name__ == "__main__":
  main(sys.argv[1:])
