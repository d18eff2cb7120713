"""Every notebook runs top to bottom in a real Jupyter kernel, on a small budget, and
is kept in the repository without outputs."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"
# environment steps per training run, small enough for CI, large enough for a few rows of metrics
BUDGETS = {"quickstart": 20_000, "write_your_own": 10_000, "distribution_policies": 4096, "sweeps": 4096,
           "multi_agent": 20_000}


def test_every_notebook_is_tested_and_stored_without_outputs() -> None:
    assert {p.stem for p in NOTEBOOKS.glob("*.ipynb")} == set(BUDGETS)
    for path in NOTEBOOKS.glob("*.ipynb"):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name} holds outputs"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_notebook_runs_top_to_bottom(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAXRL_FRAG_NOTEBOOK_STEPS", str(BUDGETS[name]))
    monkeypatch.setenv("XLA_FLAGS", "")  # the kernel is a fresh process: the notebook sets what it needs
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    # the kernel inherits this process's environment, so the budget above
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    images = [base64.b64decode(out.data["image/png"]) for cell in notebook.cells if cell.cell_type == "code"
              for out in cell.outputs if "data" in out and "image/png" in out.data]
    assert images and all(image.startswith(b"\x89PNG") for image in images)
    out_dir = os.environ.get("JAXRL_FRAG_NOTEBOOK_IMAGES")
    if out_dir:  # to look at the plots: JAXRL_FRAG_NOTEBOOK_IMAGES=/some/dir pytest tests/test_notebooks.py
        for i, image in enumerate(images):
            (Path(out_dir) / f"{name}-{i}.png").write_bytes(image)
