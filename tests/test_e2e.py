"""End to end: the real server (`python -m service`, uvicorn) on a free loopback port."""

import json
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.live import http_json, start_server
from service.api import examples as ex
from tests.conftest import assert_close

pytestmark = pytest.mark.e2e
GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "golden.json").read_text())


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, base = start_server(workers=2)
    yield base
    proc.terminate()
    assert proc.wait(timeout=15) == 0


def test_healthz_and_docs(server: str) -> None:
    assert http_json(server + "/healthz") == (200, {"status": "ok", "version": "0.1.0"})
    with urllib.request.urlopen(server + "/docs", timeout=10) as r:
        assert b"swagger" in r.read().lower()
    status, spec = http_json(server + "/openapi.json")
    assert status == 200 and {"/attention", "/mask", "/multihead"} <= set(spec["paths"])


@pytest.mark.parametrize("case", GOLDEN["cases"][:8], ids=[c["name"] for c in GOLDEN["cases"][:8]])
def test_golden_cases_over_http(server: str, case: dict[str, Any]) -> None:
    status, body = http_json(server + case["endpoint"], case["request"])
    assert status == 200
    assert_close(body, case["expected"])


def test_bad_input_over_http(server: str) -> None:
    status, body = http_json(server + "/attention", {**ex.I_AM_BATMAN, "x": [[1, 0], [0]]})
    assert status == 422 and body["errors"][0]["field"] == "x"


def test_multihead_over_http(server: str) -> None:
    status, body = http_json(server + "/multihead", ex.TWO_HEADS_FULL_BLOCK)
    assert status == 200 and len(body["heads"]) == 2


def _mask_count(server: str) -> list[float]:
    with urllib.request.urlopen(server + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("attention_requests_total")
        and 'endpoint="/mask"' in line
        and 'status="200"' in line
    ]


def test_metrics_add_up_across_workers(server: str) -> None:
    (before,) = _mask_count(server) or [0.0]
    for _ in range(10):  # spread over both workers by the kernel
        http_json(server + "/mask", ex.CAUSAL_FOUR_TOKENS)
    assert _mask_count(server) == [before + 10]  # one series, summed over the workers


def test_sigterm_finishes_the_request_in_flight_then_exits_0() -> None:
    proc, base = start_server(workers=1)
    result: dict[str, Any] = {}
    body = {"seed": 0, "seq_len": 1500, "d_model": 64, "d_k": 64}  # a second or so of work

    def slow_request() -> None:
        result["status"], answer = http_json(base + "/attention", body)
        result["rows"] = len(answer.get("weights", []))

    worker = threading.Thread(target=slow_request)
    worker.start()
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    worker.join(timeout=60)
    assert proc.wait(timeout=60) == 0
    assert result == {"status": 200, "rows": 1500}
