"""Compressed JSON answers through the app (Accept-Encoding, RFC 9110 §12.5.3): POST /model
and the compute endpoints, whole and streamed, GET /openapi.json; each decoded here with the
coding's own library and compared byte for byte with the identity answer to the same request.
The raw bytes are read (``iter_raw``): no client library decodes them on the way."""

import zlib
from collections.abc import Callable
from typing import Any

import brotli
import orjson
import pytest
import zstandard
from fastapi.testclient import TestClient

from service.config import Settings
from service.http.app import create_app
from service.http.budget import cost_bytes
from service.http.doors import checked
from service.models.catalog import BY_NAME


def _unzstd(data: bytes) -> bytes:
    z = zstandard.ZstdDecompressor().decompressobj()
    out = z.decompress(data)
    assert z.eof, "the zstd frame is incomplete"
    return out


DECODE: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: zlib.decompress(data, 16 + zlib.MAX_WBITS),
    "br": brotli.decompress,
    "zstd": _unzstd,
}


def _raw(
    client: TestClient, path: str, body: dict[str, Any] | None, coding: str
) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and the body's bytes as sent, for Accept-Encoding: ``coding``."""
    method = "GET" if body is None else "POST"
    headers = {"Accept-Encoding": coding}
    with client.stream(method, path, json=body, headers=headers) as r:
        return r.status_code, dict(r.headers), b"".join(r.iter_raw())


def _decoded(headers: dict[str, str], raw: bytes) -> bytes:
    coding = headers.get("content-encoding")
    return raw if coding is None else DECODE[coding](raw)


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
@pytest.mark.parametrize(
    "body",
    [
        {"seed": 2, "seq_len": 16, "d_model": 8, "d_k": 8},  # inline
        {"seed": 2, "seq_len": 200, "d_model": 8, "d_k": 8},  # whole, from a thread
        {"seed": 2, "seq_len": 620, "d_model": 8, "d_k": 8},  # streamed
    ],
    ids=["inline", "whole", "streamed"],
)
def test_compute_answers_decode_to_the_identity_answer(
    client: TestClient, body: dict[str, Any], coding: str
) -> None:
    status, _, plain = _raw(client, "/attention", body, "identity")
    got_status, headers, raw = _raw(client, "/attention", body, coding)
    assert status == got_status == 200
    assert headers["content-encoding"] == coding
    assert headers["vary"] == "Accept, Accept-Encoding"
    assert len(raw) < 0.6 * len(plain)
    assert _decoded(headers, raw) == plain


@pytest.mark.torch  # needs minilm (make models), as tests/api/test_model.py
def test_post_model_json_is_compressed(client: TestClient) -> None:
    if not BY_NAME["minilm"].installed(Settings().models_dir):
        pytest.fail("minilm is not installed: run make models")
    body = {"model": "minilm", "text": "The cat sat on the mat. The cat slept.", "layer": 1}
    _, _, plain = _raw(client, "/model", body, "identity")
    for coding in ("zstd", "gzip"):
        status, headers, raw = _raw(client, "/model", body, coding)
        assert status == 200 and headers["content-encoding"] == coding
        assert _decoded(headers, raw) == plain
    binary = {"Accept": "application/x-safetensors", "Accept-Encoding": "zstd"}
    answer = client.post("/model", json=body, headers=binary)
    assert answer.status_code == 200 and "content-encoding" not in answer.headers


def test_openapi_json_is_compressed(client: TestClient) -> None:
    _, plain_headers, plain = _raw(client, "/openapi.json", None, "identity")
    status, headers, raw = _raw(client, "/openapi.json", None, "gzip")
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert "content-encoding" not in plain_headers
    assert int(headers["content-length"]) == len(raw) < len(plain) / 3
    assert "Accept-Encoding" in headers["vary"]
    assert _decoded(headers, raw) == plain


def test_a_budget_that_fits_the_answer_but_not_a_compressor_answers_identity() -> None:
    """A compressor's memory is counted; when only it would not fit, the answer streams out
    without compression rather than as a 413."""
    body = {"seed": 1, "seq_len": 200, "d_model": 8, "d_k": 8}
    settings = Settings(log_level="warning")
    cost = cost_bytes(checked(orjson.dumps(body), "attention", settings, "json").numbers)
    app = create_app(settings.model_copy(update={"memory_budget_bytes": cost + 100}))
    with TestClient(app) as client:
        _, _, plain = _raw(client, "/attention", body, "identity")
        status, headers, raw = _raw(client, "/attention", body, "zstd")
        assert status == 200 and "content-encoding" not in headers
        assert raw == plain and app.state.budget.in_use == 0
