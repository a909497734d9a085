"""Operations: health, readiness, version, metrics, request IDs, access logs, CORS, offline docs,
and the limits checked before any work."""

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.http.app import create_app
from service.wire import examples as ex


def make_client(**settings: Any) -> TestClient:
    return TestClient(create_app(Settings(**settings)))


def test_readyz_after_start_up(client: TestClient) -> None:
    assert client.get("/readyz").json() == {"status": "ready"}


def test_version_reports_numpy_and_blas(client: TestClient) -> None:
    body = client.get("/version").json()
    assert body["service"] == "0.1.0" and body["numpy"] and "name" in body["blas"]


def test_metrics_count_the_requests_made(client: TestClient) -> None:
    def count() -> float:
        for line in client.get("/metrics").text.splitlines():
            if (
                line.startswith("attention_requests_total")
                and 'endpoint="/mask"' in line
                and 'status="200"' in line
            ):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = count()
    for _ in range(3):
        client.post("/mask", json=ex.CAUSAL_FOUR_TOKENS)
    assert count() == before + 3
    text = client.get("/metrics").text
    assert (
        "attention_request_duration_seconds_bucket" in text
        and "attention_response_size_bytes" in text
    )


def test_request_id_is_echoed_or_generated(client: TestClient) -> None:
    assert (
        client.get("/healthz", headers={"X-Request-ID": "job-42"}).headers["x-request-id"]
        == "job-42"
    )
    generated = client.get("/healthz").headers["x-request-id"]
    assert len(generated) == 32
    assert (
        client.get("/healthz", headers={"X-Request-ID": "bad id\twith spaces"}).headers[
            "x-request-id"
        ]
        != "bad id\twith spaces"
    )


def test_one_access_log_line_per_request(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="service.access"):
        client.post("/attention", json=ex.I_AM_BATMAN, headers={"X-Request-ID": "trace-me"})
    lines = [r for r in caplog.records if r.name == "service.access"]
    assert len(lines) == 1
    rec: Any = lines[0]
    assert (rec.request_id, rec.method, rec.path, rec.status) == (
        "trace-me",
        "POST",
        "/attention",
        200,
    )
    assert rec.bytes_in > 0 and rec.bytes_out > 0 and rec.duration_ms > 0


def test_json_log_formatter() -> None:
    import json

    from service.logs import JsonFormatter

    record = logging.LogRecord("service.access", logging.INFO, "", 0, "request", None, None)
    record.status = 200
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "request" and line["status"] == 200 and line["level"] == "info"


def test_cors_closed_by_default_and_configurable(client: TestClient) -> None:
    pre = {"Origin": "http://example.org", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in client.options("/attention", headers=pre).headers
    with make_client(cors_origins=["http://example.org"]) as open_client:
        r = open_client.options("/attention", headers=pre)
        assert r.headers["access-control-allow-origin"] == "http://example.org"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_use_bundled_assets_only(client: TestClient, page: str) -> None:
    html = client.get(page).text
    assert "cdn" not in html.lower() and "https://" not in html
    assert "/docs-assets/" in html
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"):
        assert client.get(f"/docs-assets/{asset}").status_code == 200


def test_swagger_syntax_highlighting_is_off(client: TestClient) -> None:
    assert '"syntaxHighlight": false' in client.get("/docs").text


def test_root_path_prefixes_the_docs_links() -> None:
    with TestClient(create_app(Settings()), root_path="/attention-api") as c:
        html = c.get("/docs").text
        assert "/attention-api/docs-assets/swagger-ui-bundle.js" in html
        assert "/attention-api/openapi.json" in html


# ---- limits ------------------------------------------------------------------------------


@pytest.fixture
def small() -> Iterator[TestClient]:
    with make_client(
        max_body_bytes=2048, max_result_numbers=1000, max_seq_len=50, max_heads=2, max_batch=3
    ) as c:
        yield c


def test_body_over_the_limit_is_413_by_content_length(small: TestClient) -> None:
    r = small.post(
        "/attention",
        content=b"{" + b" " * 5000 + b"}",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413
    err = r.json()["errors"][0]
    assert err["limit"] == 2048 and err["type"] == "body_too_large"


def test_body_over_the_limit_is_413_while_streaming(small: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"q": ['
        for _ in range(1000):
            yield b"[1.0, 2.0],"

    r = small.post("/attention", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_computing_over_the_limit_is_413_even_when_little_is_returned() -> None:
    with make_client(max_computed_numbers=100_000) as c:
        body = {"seed": 0, "seq_len": 200, "d_model": 8, "num_heads": 4, "include": ["output"]}
        r = c.post("/multihead", json=body)  # returns 1,600 numbers, computes ~700,000
        assert r.status_code == 413
        assert "would compute" in r.json()["message"] and r.json()["errors"][0]["limit"] == 100_000
        assert c.post("/multihead", json={**body, "seq_len": 20}).status_code == 200


def test_the_413_advice_names_outputs_the_endpoint_has(small: TestClient) -> None:
    body = {"seed": 0, "seq_len": 20, "d_model": 4, "num_heads": 2}
    r = small.post("/multihead", json=body)
    assert r.status_code == 413
    assert 'include (e.g. ["average_weights", "output"])' in r.json()["message"]
    advice = ["average_weights", "output"]
    assert small.post("/multihead", json={**body, "include": advice}).status_code == 200


def test_result_over_the_number_limit_is_413_before_computing(small: TestClient) -> None:
    q = [[1.0, 0.0]] * 20
    r = small.post("/attention", json={"q": q, "k": q, "v": q})  # 4 outputs of 20×20 alone
    assert r.status_code == 413
    msg = r.json()["message"]
    assert "would return 1,420 numbers" in msg and "limit of 1,000" in msg and "include" in msg
    ok = small.post("/attention", json={"q": q, "k": q, "v": q, "include": ["weights"]})
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "/attention",
            {"seed": 0, "seq_len": 51, "d_model": 1, "d_k": 1, "include": ["output"]},
            "seq_len",
        ),
        (
            "/multihead",
            {"seed": 0, "seq_len": 2, "d_model": 4, "num_heads": 4, "include": ["output"]},
            "num_heads",
        ),
        ("/attention", {"q": [[[1.0]]] * 4, "k": [[[1.0]]] * 4, "v": [[[1.0]]] * 4}, "x"),
    ],
    ids=["seq_len", "num_heads", "batch"],
)
def test_size_caps_are_413(small: TestClient, path: str, body: dict[str, Any], field: str) -> None:
    r = small.post(path, json=body)
    assert r.status_code == 413, r.text
    assert r.json()["errors"][0]["field"] == field


# Run in a child process so that the test process's own heap is left alone. 1,250 arrays of 48 kB
# (under glibc's 128 kB mmap threshold, so they come from the heap) are freed except every 50th,
# which pins the top of the heap: free() alone can only shrink the heap from the top, so the
# ~60 MB of holes stay resident until malloc_trim gives their pages back.
_FRAGMENTED_HEAP = """
import json
import numpy as np
from service.memory import release_memory, tune_allocator

def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")

tuned = tune_allocator()
start = rss_kb()
blocks = [np.full(6000, 1.0) for _ in range(1250)]
pins = blocks[::50]
del blocks
held = rss_kb()
release_memory()
released = rss_kb()
print(json.dumps({"tuned": tuned, "start": start, "held": held, "released": released}))
"""


def test_allocator_tuning_applies_on_glibc() -> None:
    import json
    import platform
    import subprocess
    import sys

    from service.memory import tune_allocator

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not a glibc system: the allocator is left alone")
    assert tune_allocator() is True
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _FRAGMENTED_HEAP],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
    )
    assert out.returncode == 0, out.stderr
    kb = json.loads(out.stdout)
    assert kb["tuned"] is True
    kept = kb["held"] - kb["start"]
    assert kept > 40_000, f"the freed arrays should still be resident before the trim: {kb}"
    # release_memory must hand at least three quarters of the freed memory back to the system
    assert kb["held"] - kb["released"] > 0.75 * kept, f"RSS did not drop after release_memory: {kb}"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "200000 100000\n"}, 2),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ],
    ids=["v2-quota", "v2-none", "v1-quota", "v1-none"],
)
def test_cpus_follow_the_cgroup_quota(
    tmp_path: Path, files: dict[str, str], expected: int | None
) -> None:
    import os

    from service.__main__ import available_cpus

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    affinity = len(os.sched_getaffinity(0))
    assert available_cpus(str(tmp_path)) == (affinity if expected is None else expected)
