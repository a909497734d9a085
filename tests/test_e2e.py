"""End to end: the real server (`python -m service`, uvicorn) on a free loopback port."""

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.api import examples as ex
from tests.conftest import assert_close

pytestmark = pytest.mark.e2e
GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "golden.json").read_text())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if _request(base + "/healthz")[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out = proc.stdout.read().decode() if proc.stdout else ""
            pytest.fail(f"server did not start:\n{out}")
        time.sleep(0.2)
    yield base
    proc.terminate()
    assert proc.wait(timeout=15) == 0


def test_healthz_and_docs(server: str) -> None:
    assert _request(server + "/healthz") == (200, {"status": "ok", "version": "0.1.0"})
    with urllib.request.urlopen(server + "/docs", timeout=10) as r:
        assert b"swagger" in r.read().lower()
    status, spec = _request(server + "/openapi.json")
    assert status == 200 and {"/attention", "/mask", "/multihead"} <= set(spec["paths"])


@pytest.mark.parametrize("case", GOLDEN["cases"][:8], ids=[c["name"] for c in GOLDEN["cases"][:8]])
def test_golden_cases_over_http(server: str, case: dict[str, Any]) -> None:
    status, body = _request(server + case["endpoint"], case["request"])
    assert status == 200
    assert_close(body, case["expected"])


def test_bad_input_over_http(server: str) -> None:
    status, body = _request(server + "/attention", {**ex.I_AM_BATMAN, "x": [[1, 0], [0]]})
    assert status == 422 and body["errors"][0]["field"] == "x"


def test_multihead_over_http(server: str) -> None:
    status, body = _request(server + "/multihead", ex.TWO_HEADS_FULL_BLOCK)
    assert status == 200 and len(body["heads"]) == 2
