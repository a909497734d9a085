"""docs/guide-notebook.md: its Python blocks run in order, as a notebook's cells would (one
namespace, the service in process), and each prints exactly the ``text`` block that follows it."""

import contextlib
import io
import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-notebook.md"
FENCE = re.compile(r"```(\w+)\n(.*?)```", re.S)


def blocks() -> list[tuple[str, str, str | None]]:
    """(language, code, the text block right after it or None), in the guide's order."""
    text = GUIDE.read_text()
    found = list(FENCE.finditer(text))
    out: list[tuple[str, str, str | None]] = []
    for i, block in enumerate(found):
        if block.group(1) == "text":
            continue
        after = found[i + 1] if i + 1 < len(found) else None
        follows = after is not None and not text[block.end() : after.start()].strip()
        shown = (
            after.group(2) if after is not None and follows and after.group(1) == "text" else None
        )
        out.append((block.group(1), block.group(2), shown))
    return out


def test_the_guide_shows_the_install_and_the_first_check() -> None:
    languages = [language for language, _, _ in blocks()]
    assert set(languages) == {"bash", "python"}
    bash = [code for language, code, _ in blocks() if language == "bash"]
    assert bash == ["pip install -e . -e ./client\n", "python scripts/install_models.py\n"]
    python = [code for language, code, _ in blocks() if language == "python"]
    assert "Client.local()" in python[1]


def test_the_guide_links_resolve_and_name_nothing_private() -> None:
    text = GUIDE.read_text()
    assert "../shared" not in text
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert "notebooks/checking-attention.ipynb" in targets and "api.md" in targets
    for target in targets:
        assert (GUIDE.parent / target).exists(), target


def test_every_python_block_runs_and_prints_what_the_guide_shows() -> None:
    namespace: dict[str, object] = {"__name__": "guide"}
    ran = 0
    try:
        for language, code, shown in blocks():
            if language != "python":
                continue
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(code, str(GUIDE), "exec"), namespace)
            ran += 1
            if shown is not None:
                assert printed.getvalue() == shown, code
            else:
                assert printed.getvalue() == "", f"prints but shows nothing:\n{code}"
    finally:
        client = namespace.get("client")
        close = getattr(client, "close", None)
        if callable(close):
            close()
    assert ran >= 8


@pytest.mark.parametrize("phrase", ["tolerance", "weight_layout", "np.random.seed", "expected"])
def test_the_guide_covers(phrase: str) -> None:
    assert phrase in GUIDE.read_text()


def test_the_guide_says_how_to_install_the_trained_model_where_the_notebook_runs() -> None:
    """The notebook's last section needs all-MiniLM-L6-v2, which is not committed."""
    text = GUIDE.read_text()
    install = text.split("### The trained model", 1)[1].split("\n## ", 1)[0]
    for needed in ("make models", "ATTENTION_MODELS_DIR", "models/minilm/", "ModelNotInstalled"):
        assert needed in install, needed
    script = GUIDE.parents[1] / "scripts" / "install_models.py"
    assert "--models-dir" in install and "--models-dir" in script.read_text()
