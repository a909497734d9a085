"""The model view at paragraph length in a real Jupyter kernel (ipykernel, the ``python3``
kernel of this environment; docs/guide-notebook.md, "The model view at paragraph length"): a
notebook whose last value is ``client.model(paragraph)`` on 126 tokens shows it inline as one
HTML output under 2 MB, with every head's thumbnail, the summary and the rollout, and the saved
notebook stays about that size. Run with no server started, as tests/docs/test_notebook.py."""

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from tests.client.test_model_display import MAX_HTML, MAX_SUMMARY_LINES, PARAGRAPH, thumbs

CELLS = (
    "from attention_client import Client\nclient = Client.local()",
    f"paragraph = {PARAGRAPH!r}\nresult = client.model(paragraph, layer=2)\nresult",
    "client.close()",
)


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The notebook run in a fresh kernel, and where it was saved afterwards."""
    notebook = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]  # type: ignore[no-untyped-call]
    notebook.metadata.kernelspec = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    folder = tmp_path_factory.mktemp("notebook")
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    ).execute()  # raises on the first failing cell
    saved = folder / "model-view.ipynb"
    nbformat.write(notebook, saved)  # type: ignore[no-untyped-call]
    return notebook, saved


def test_the_model_answer_is_drawn_inline_and_small(executed: tuple[Any, Path]) -> None:
    notebook, saved = executed
    cell = notebook.cells[1]
    assert all(o.output_type != "error" for c in notebook.cells for o in c.outputs)
    (shown,) = [o for o in cell.outputs if o.output_type == "execute_result"]
    page = shown.data["text/html"]
    assert 100_000 < len(page.encode()) <= MAX_HTML
    assert shown.data["text/plain"].startswith("Result(")
    found = thumbs(page)
    assert len(found) == 72 and {(t[4], t[5]) for t in found} == {(126, 126)}
    assert 'data-name="rollout"' in page and "Trace of layer 2" in page
    summary = re.search(r'<div class="model-summary".*?</ul>', page, re.S)
    assert summary is not None and 0 < summary[0].count("<li>") <= MAX_SUMMARY_LINES
    assert saved.stat().st_size <= MAX_HTML + 100_000  # the notebook kept with its output
