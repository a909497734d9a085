"""README and the docs a user reads: every curl example answers what is shown, every Python
example prints what is shown, every link leads somewhere, and README stays a short front door."""

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from harness.live import start_server

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
PAGES = {"README.md": README, **{f"docs/{name}": text for name, text in DOCS.items()}}

CURL = re.compile(r"```bash\n(curl -s localhost:8000(/\S+).*?)```", re.S)
ANSWERED = re.compile(r"```bash\n(curl -s localhost:8000(/\S+).*?)```\n\n```json\n(.*?)```", re.S)
EXAMPLES = [(page, *found) for page, text in PAGES.items() for found in ANSWERED.findall(text)]
COMMANDS = [(page, *found) for page, text in PAGES.items() for found in CURL.findall(text)]
PYTHON = re.compile(r"```python\n(.*?)```\n\n```text\n(.*?)```", re.S)


def _request(client: TestClient, command: str, path: str) -> Any:
    data = re.search(r"-d '(.*)'", command)
    return client.post(path, json=json.loads(data.group(1))) if data else client.get(path)


def test_the_examples_cover_every_endpoint() -> None:
    assert {path for _, _, path, _ in EXAMPLES} >= {"/attention", "/mask", "/multihead", "/healthz"}


@pytest.mark.parametrize(
    ("page", "command", "path", "shown"), EXAMPLES, ids=[f"{p}:{u}" for p, _, u, _ in EXAMPLES]
)
def test_curl_answers_as_shown(
    client: TestClient, page: str, command: str, path: str, shown: str
) -> None:
    response = _request(client, command, path)
    assert response.status_code == 200
    assert response.json() == json.loads(shown)


@pytest.mark.parametrize(
    ("page", "command", "path"), COMMANDS, ids=[f"{p}:{u}" for p, _, u in COMMANDS]
)
def test_every_curl_command_is_answered_200(
    client: TestClient, page: str, command: str, path: str
) -> None:
    assert _request(client, command, path).status_code == 200


def test_readme_is_a_short_front_door() -> None:
    """≤ 250 lines, the two commands, and each kind of user's path with a runnable example
    (a code block) and its guide by line 90."""
    lines = README.splitlines()
    assert len(lines) <= 250
    assert "make run" in README and "make test" in README
    head = "\n".join(lines[:90])
    for path, guide in [
        ("### Checking a course notebook", "docs/guide-notebook.md"),
        ("### Checking a PyTorch or Hugging Face layer", "docs/guide-layers.md"),
        ("### Exploring in the browser", "docs/guide-explorer.md"),
        ("### Deploying", "docs/operations.md"),
    ]:
        assert path in head, f"{path} is not in README's first 90 lines"
        section = head.split(path, 1)[1].split("\n### ", 1)[0]
        assert "```" in section, f"{path} has no example before line 90"
        assert guide in README.split(path, 1)[1].split("\n### ", 1)[0], f"{path} links no guide"


def test_kubernetes_quick_start_pushes_and_sets_the_image_before_applying() -> None:
    """Applying the example overlay as it is pulls an image that does not exist."""
    for name in ("README.md", "docs/operations.md"):
        text = PAGES[name]
        apply = text.index("kubectl apply -k")
        for before in ("docker push", "newName: $IMAGE"):  # the overlay's images: set by sed
            assert -1 < text.find(before) < apply, f"{name}: {before} after kubectl apply"
        assert "kubectl apply -k deploy/kubernetes/overlays/example" not in text


LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES)
def test_links_lead_to_files_that_exist_and_never_outside_the_repository(page: str) -> None:
    base = (ROOT / page).parent
    for target, _ in LINK.findall(PAGES[page]):
        if target.startswith("http"):
            continue
        found = (base / target).resolve()
        assert found.exists(), f"{page} links {target}, which does not exist"
        assert found.is_relative_to(ROOT), f"{page} links {target}, outside the repository"
    assert "../shared" not in PAGES[page]


CACHE_BY_NAME = re.compile(r"\bpast_key_values\s*=|\bcache=(?!=)")  # a keyword, not `x, cache = …`
EXAMPLE_PAGES = ["README.md", "docs/guide-layers.md", "docs/guide-notebook.md", "client/README.md"]


@pytest.mark.parametrize("page", EXAMPLE_PAGES)
def test_examples_pass_a_layers_cache_by_position(page: str) -> None:
    """transformers 5.25 renames the attention layers' ``past_key_values`` to ``cache`` (the
    old name warns until 5.40; 5.23, which the suite pins, knows only the old one): the
    examples pass the cache as the fourth argument, which both read the same."""
    for code in re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S):
        assert not CACHE_BY_NAME.search(code), f"{page} passes the cache by name:\n{code}"


def test_api_reference_sections_run_in_order() -> None:
    numbers = re.findall(r"^##+ (\d+(?:\.\d+)?)[. ]", DOCS["api.md"], re.M)
    keys = [tuple(int(n) for n in number.split(".")) for number in numbers]
    assert keys == sorted(keys), f"api.md sections out of order: {numbers}"


def _run_python_examples(text: str, base: str, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = PYTHON.findall(text)
    assert blocks
    for code, shown in blocks:
        code = code.replace("http://127.0.0.1:8000", base)
        with warnings.catch_warnings():  # a deprecated call (transformers warns so) fails here
            warnings.simplefilter("error", FutureWarning)
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
        assert capsys.readouterr().out == shown


@pytest.mark.e2e
@pytest.mark.torch
def test_readme_python_examples_print_what_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    """The notebook example (the service in process) and the layer example (a real server)."""
    if not os.environ.get("REQUIRE_TORCH"):
        pytest.importorskip("torch", reason="torch is not installed: the layer example needs it")
    proc, base = start_server()
    try:
        _run_python_examples(README, base, capsys)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
