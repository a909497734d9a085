"""docs/notebooks/checking-attention.ipynb: kept with its outputs (a reader sees the maps without
running it), and run top to bottom in a real Jupyter kernel (ipykernel, the ``python3`` kernel of
this environment) with no server started. Both the outputs it is kept with and those of a fresh
run must say what its text claims; without the trained model installed, its cell says how to
install it instead of failing."""

import os
import re
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "notebooks" / "checking-attention.ipynb"
TOKENS = ("The", "cat", "sat")
MAX_BYTES = 1 << 20  # the notebook with its outputs (the maps are inline SVG: ≈ 160 KB)


def load() -> Any:
    """The notebook as it is kept in the repository."""
    return nbformat.read(NOTEBOOK, as_version=4)  # type: ignore[no-untyped-call]


def code_cells(notebook: Any) -> list[Any]:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def text_of(cell: Any) -> str:
    """What a cell printed (its streams and plain-text results)."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif "text/plain" in output.get("data", {}):
            parts.append(output.data["text/plain"])
    return "".join(parts)


def html_of(cell: Any) -> str:
    """The HTML a cell displayed (a rich result)."""
    return "".join(o.data["text/html"] for o in cell.outputs if "text/html" in o.get("data", {}))


def cell_with(notebook: Any, source: str) -> Any:
    """The one code cell whose source contains ``source``."""
    (found,) = [c for c in code_cells(notebook) if source in c.source]
    return found


def execute(env: dict[str, str] | None = None) -> Any:
    """The notebook run top to bottom in a fresh kernel (its environment: ``env``)."""
    notebook = load()
    start = time.monotonic()
    NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    ).execute(**({"env": env} if env is not None else {}))  # raises on the first failing cell
    notebook.metadata["seconds"] = time.monotonic() - start
    return notebook


@pytest.fixture(scope="module")
def fresh() -> Any:
    return execute()


@pytest.fixture(params=["kept", "fresh"])
def executed(request: pytest.FixtureRequest) -> Any:
    """The notebook with the outputs it is kept with, then with those of a fresh run."""
    return load() if request.param == "kept" else request.getfixturevalue("fresh")


def test_the_notebook_is_kept_run_in_order_and_small() -> None:
    notebook = load()
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec.name == "python3"
    counts = [cell.execution_count for cell in code_cells(notebook)]
    assert counts == list(range(1, len(counts) + 1)), "run it top to bottom once, then save"
    assert all(cell.outputs for cell in code_cells(notebook)[1:-1]), "kept without its outputs"
    assert NOTEBOOK.stat().st_size < MAX_BYTES
    assert "/work/" not in NOTEBOOK.read_text() and "/home/" not in NOTEBOOK.read_text()


def test_the_notebook_starts_no_server() -> None:
    source = "\n".join(c.source for c in code_cells(load()))
    assert "Client.local()" in source
    assert "127.0.0.1" not in source and "make run" not in source and "subprocess" not in source


def test_every_cell_runs_without_error_quickly(executed: Any) -> None:
    for cell in code_cells(executed):
        assert all(o.output_type != "error" for o in cell.outputs), cell.source[:60]
    assert executed.metadata.get("seconds", 0) < 60


def test_the_service_agrees_with_the_hand_computation(executed: Any) -> None:
    text = text_of(cell_with(executed, "largest = max("))
    found = re.search(r"largest difference: (\S+)", text)
    assert found is not None, text
    assert float(found.group(1)) < 1e-12
    assert "the service drew the same W_q, W_k, W_v: True" in text_of(
        cell_with(executed, "client = Client.local()")
    )


def test_the_planted_mistake_is_named(executed: Any) -> None:
    text = text_of(cell_with(executed, "wrong_weights = "))
    assert "scaled_scores: matches" in text and "weights: differs" in text
    assert "mistakes: ['softmax_over_queries']" in text
    assert "axis 0" in text  # the explanation
    printed = text_of(cell_with(executed, "printed = np.round("))
    assert "mistakes: ['softmax_over_queries', 'scale_after_softmax']" in printed
    assert "compared at: {'decimals': 4}" in printed  # printed numbers, no tolerance given


def test_the_result_draws_its_maps_with_the_tokens(executed: Any) -> None:
    page = html_of(_display_cell(executed))
    assert page.index('class="comparison"') < page.index("<svg")
    assert "<code>softmax_over_queries</code>" in page
    weights = re.search(r'<figure class="map" data-name="weights".*?</figure>', page, re.S)
    assert weights is not None
    assert weights.group(0).count('class="cell"') == 9
    for token in TOKENS:
        assert re.search(rf'class="query"[^>]*>{token}</text>', weights.group(0))
        assert re.search(rf'class="key"[^>]*>{token}</text>', weights.group(0))
    multihead = html_of(cell_with(executed, "client.multihead("))
    assert 'data-name="heads[1].weights"' in multihead


def _display_cell(notebook: Any) -> Any:
    """The cell that only shows ``checked``."""
    (found,) = [c for c in code_cells(notebook) if c.source.strip() == "checked"]
    return found


def test_a_trained_head_is_shown_beside_a_random_one(executed: Any) -> None:
    """all-MiniLM-L6-v2 has a head that attends to the previous token almost always; random
    attention over the same tokens has none."""
    cell = cell_with(executed, "client.model(sentence")
    text = text_of(cell)
    found = re.search(r"is a previous_token head \(previous_token score ([0-9.]+)\)", text)
    assert found is not None and float(found[1]) > 0.9, text
    random = re.search(r"random: previous_token score ([0-9.]+)", text)
    assert random is not None and float(random[1]) < 0.5, text
    assert html_of(cell).count("<svg") == 2


def test_without_the_trained_model_its_cell_says_how_to_install_it(tmp_path: Path) -> None:
    """A kernel whose service finds no models (ATTENTION_MODELS_DIR: an empty folder): the
    cell catches the client's ModelNotInstalled and prints one sentence instead of a 501."""
    notebook = execute({**os.environ, "ATTENTION_MODELS_DIR": str(tmp_path)})
    cell = cell_with(notebook, "client.model(sentence")
    assert all(o.output_type == "stream" for o in cell.outputs), cell.outputs
    assert text_of(cell) == (
        "all-MiniLM-L6-v2 is not installed here: run `make models` in the repository (or "
        "python scripts/install_models.py), then run this cell again.\n"
    )
    assert text_of(code_cells(notebook)[-1]) == ""  # the next cells still run
