"""The client's tests against a real server: one uvicorn worker per test module (harness.live)."""

from collections.abc import Iterator

import pytest

from harness.live import start_server


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, base = start_server(workers=1)
    yield base
    proc.terminate()
    assert proc.wait(timeout=15) == 0
