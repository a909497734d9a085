"""Hostile and careless input: every one gets a short, clear 4xx and the service keeps working."""

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.http.app import create_app
from service.wire import examples as ex

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def lenient() -> TestClient:
    """A client that turns server exceptions into 500 responses, as a real server would."""
    return TestClient(create_app(Settings()), raise_server_exceptions=False)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"q": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"mask": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}",
    ],
    ids=["deep-array", "deep-object"],
)
def test_deeply_nested_json_is_400_not_a_crash(lenient: TestClient, raw: bytes) -> None:
    r = lenient.post("/attention", content=raw, headers=JSON)
    assert r.status_code == 400
    assert "nested too deeply" in r.json()["message"]


def test_nesting_deeper_than_a_batch_is_422(lenient: TestClient) -> None:
    raw = b'{"q": ' + b"[" * 800 + b"1" + b"]" * 800 + b', "k": [[1]], "v": [[1]]}'
    r = lenient.post("/attention", content=raw, headers=JSON)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "q"


@pytest.mark.parametrize(
    ("row", "last", "phrase"),
    [
        (b'["x","y"]', b'["x","y"]', 'row 0, column 0 is the string "x"'),
        (b"[1,2]", b'[1,"x"]', 'row 500000, column 1 is the string "x"'),
        (b"[1,null]", b"[1,null]", "row 0, column 1 is null"),
        (b"[1,2]", b"[1," + b"9" * 400 + b"]", "row 500000, column 1 is not a finite number"),
    ],
    ids=["strings", "one-string-at-the-end", "nulls", "huge-integer-at-the-end"],
)
def test_a_million_bad_numbers_give_one_short_error(
    lenient: TestClient, row: bytes, last: bytes, phrase: str
) -> None:
    raw = b'{"q": [' + b",".join([row] * 500_000) + b"," + last + b'], "k": [[1,2]], "v": [[1]]}'
    r = lenient.post("/attention", content=raw, headers=JSON)
    assert r.status_code == 422
    assert phrase in r.json()["message"]
    assert len(r.content) < 1000


def test_a_million_bad_labels_stop_at_the_first(lenient: TestClient) -> None:
    raw = (
        b'{"q": [[1]], "k": [[1]], "v": [[1]], "tokens": [' + b",".join([b"1"] * 1_000_000) + b"]}"
    )
    r = lenient.post("/attention", content=raw, headers=JSON)
    assert r.status_code == 422
    assert len(r.json()["errors"]) == 1 and r.json()["errors"][0]["field"] == "tokens[0]"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/attention", {"q": [[1e200]], "k": [[1e200]], "v": [[1.0]]}),
        ("/attention", {"q": [[1e200], [1.0]], "k": [[-1e200], [1.0]], "v": [[1.0], [2.0]]}),
        ("/attention", {"x": [[1e200, 1.0]], "w_q": [[1.0], [1.0]], "w_k": [[1.0], [1.0]], "w_v": [[1e200], [1.0]]}),
        ("/attention", {"x": [[1e200, 1.0]], "w_q": [[1e200], [1.0]], "w_k": [[1.0], [1.0]], "w_v": [[1.0], [1.0]]}),
        ("/multihead", {"x": [[1e300, 1e300]], "num_heads": 1, "w_q": [[1.0, 0.0], [0.0, 1.0]], "w_k": [[1.0, 0.0], [0.0, 1.0]],
                        "w_v": [[1e10, 0.0], [0.0, 1e10]]}),
    ],
    ids=["scores", "scores-to-minus-infinity", "values", "projection", "multihead"],
)  # fmt: skip
def test_overflow_during_the_computation_is_422_never_nan(
    lenient: TestClient, path: str, body: dict[str, Any]
) -> None:
    r = lenient.post(path, json=body)
    assert r.status_code == 422, r.text
    assert "overflowed float64" in r.json()["message"]


def test_large_but_safe_magnitudes_still_compute(lenient: TestClient) -> None:
    r = lenient.post(
        "/attention", json={"q": [[1e150, 0.0]], "k": [[1e-150, 1.0]], "v": [[1.0, 2.0]]}
    )
    assert r.status_code == 200 and r.json()["weights"] == [[1.0]]


def test_the_service_keeps_serving_after_abuse(lenient: TestClient) -> None:
    lenient.post("/attention", content=b"[" * 50_000, headers=JSON)
    assert lenient.post("/attention", json=ex.I_AM_BATMAN).status_code == 200


# ---- API keys ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(api_keys=["s3cret", "rotated-key"]))) as client:
        yield client


def test_no_key_configured_means_open(lenient: TestClient) -> None:
    assert lenient.post("/attention", json=ex.I_AM_BATMAN).status_code == 200


@pytest.mark.parametrize("path", ["/attention", "/mask", "/multihead"])
def test_compute_endpoints_require_a_key(keyed: TestClient, path: str) -> None:
    r = keyed.post(path, json=ex.I_AM_BATMAN)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert "API key" in r.json()["message"] and r.json()["errors"][0]["type"] == "unauthorized"


@pytest.mark.parametrize(
    "headers",
    [{"Authorization": "Bearer s3cret"}, {"X-API-Key": "s3cret"}, {"X-API-Key": "rotated-key"}],
    ids=["bearer", "x-api-key", "second-key"],
)
def test_a_valid_key_is_accepted(keyed: TestClient, headers: dict[str, str]) -> None:
    assert keyed.post("/attention", json=ex.I_AM_BATMAN, headers=headers).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{"Authorization": "Bearer s3cre"}, {"X-API-Key": "S3CRET"}, {"Authorization": "Basic s3cret"}],
)
def test_a_wrong_or_malformed_key_is_401(keyed: TestClient, headers: dict[str, str]) -> None:
    r = keyed.post("/attention", json=ex.I_AM_BATMAN, headers=headers)
    assert r.status_code == 401


@pytest.mark.parametrize(
    "path", ["/healthz", "/readyz", "/metrics", "/docs", "/redoc", "/openapi.json"]
)
def test_health_metrics_and_docs_stay_open(keyed: TestClient, path: str) -> None:
    assert keyed.get(path).status_code == 200


def test_versions_are_behind_the_key_when_keys_are_configured(keyed: TestClient) -> None:
    """/version names Python, the platform and BLAS: only key holders see it."""
    assert keyed.get("/version").status_code == 401
    answer = keyed.get("/version", headers={"X-API-Key": "s3cret"})
    assert answer.status_code == 200 and "python" in answer.json()


def test_a_defect_still_answers_the_one_error_shape_with_the_request_id(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Never meant to happen: an exception the service does not raise on purpose (the probe's
    out-of-range numbers did, before they were refused) reaches the client as a JSON 500 in the
    one error shape with its X-Request-ID, not as uvicorn's plain text, and is logged with its
    traceback."""
    from dataclasses import replace

    from service.http import doors

    def broken(admitted: Any, check: Any) -> dict[str, Any]:
        raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setitem(doors.DOORS, "attention", replace(doors.DOORS["attention"], run=broken))
    with TestClient(create_app(Settings()), raise_server_exceptions=False) as c:
        r = c.post("/attention", json=ex.I_AM_BATMAN, headers={"X-Request-ID": "defect-1"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "defect-1"
    body = r.json()
    assert body["errors"][0]["type"] == "internal_error" and "defect-1" in body["message"]
    assert "C long" not in r.text  # Python's words stay in the log
    assert any("defect-1" in rec.getMessage() and rec.exc_info for rec in caplog.records)
