"""Every curl example in README.md returns what README shows."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from harness.live import start_server

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCK = re.compile(r"```bash\n(curl -s localhost:8000(/\S+).*?)```\n\n```json\n(.*?)```", re.S)
EXAMPLES = BLOCK.findall(README)


def test_readme_has_an_example_per_endpoint() -> None:
    assert {path for _, path, _ in EXAMPLES} >= {"/attention", "/mask", "/multihead", "/healthz"}


@pytest.mark.parametrize(("command", "path", "shown"), EXAMPLES, ids=[p for _, p, _ in EXAMPLES])
def test_readme_curl_answers_as_shown(
    client: TestClient, command: str, path: str, shown: str
) -> None:
    data = re.search(r"-d '(.*)'", command)
    response: Any = client.post(path, json=json.loads(data.group(1))) if data else client.get(path)
    assert response.status_code == 200
    assert response.json() == json.loads(shown)


CLIENT = re.compile(r"\*\*The Python client\*\*.*?```python\n(.*?)```\n\n```text\n(.*?)```", re.S)


@pytest.mark.e2e
def test_readme_client_example_prints_what_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    """The Python client's example, run against a real server, prints what README shows."""
    found = CLIENT.search(README)
    assert found is not None, "README has no Python client example"
    code, shown = found.groups()
    proc, base = start_server()
    try:
        code = code.replace("http://127.0.0.1:8000", base)
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert capsys.readouterr().out == shown
