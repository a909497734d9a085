"""Compressed answers on a real server (`python -m service`, uvicorn), read on raw sockets: the
answer's framing (Content-Length of the compressed bytes, or chunks, or HTTP/1.0's close) is
read here by hand, and the bytes decoded with each coding's own library (zlib's gzip, brotli,
zstandard) must equal the identity answer to the same request byte for byte."""

import json
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import brotli
import pytest
import zstandard

from harness.live import start_server, stop_server

pytestmark = pytest.mark.e2e

# between INLINE_NUMBERS and WHOLE_NUMBERS: computed in a thread, sent whole (≈ 5 MB of JSON)
WHOLE = {"seed": 3, "seq_len": 220, "d_model": 16, "d_k": 16}
# above WHOLE_NUMBERS (3 × 620² weights-shaped outputs): streamed as it is encoded (≈ 25 MB)
STREAMED = {"seed": 4, "seq_len": 620, "d_model": 16, "d_k": 16}
# under INLINE_NUMBERS: answered on the event loop, still over 1 KiB
INLINE = {"seed": 5, "seq_len": 12, "d_model": 8, "d_k": 8}


def _gunzip(data: bytes) -> bytes:
    z = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip's header and trailer, checked
    out = z.decompress(data) + z.flush()
    assert z.eof and not z.unused_data, "the gzip stream is not one complete member"
    return out


def _unzstd(data: bytes) -> bytes:
    z = zstandard.ZstdDecompressor().decompressobj()  # a streamed frame states no length
    out = z.decompress(data)
    assert z.eof, "the zstd frame is incomplete"
    return out


DECODE: dict[str, Callable[[bytes], bytes]] = {
    "gzip": _gunzip,
    "br": brotli.decompress,
    "zstd": _unzstd,
}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, base = start_server(workers=1)
    yield base
    stop_server(proc)


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def _request(
    path: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    method: str = "POST",
    version: str = "HTTP/1.1",
) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {path} {version}", "Host: x", "Connection: close"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


class Answer:
    """An answer as read off the socket: status, headers (lower-case names; a repeated one
    joined with ", "), the body's bytes as framed (chunks taken apart, checked)."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes, chunks: int) -> None:
        self.status, self.headers, self.body, self.chunks = status, headers, body, chunks

    def decoded(self) -> bytes:
        coding = self.headers.get("content-encoding")
        return self.body if coding is None else DECODE[coding](self.body)


def _exchange(base: str, request: bytes, head_only: bool = False) -> Answer:
    """Send ``request`` (with Connection: close) and read the whole answer until the server
    closes; the framing is checked: a Content-Length is the body's length exactly, a chunked
    body ends with its zero chunk and nothing after."""
    with socket.create_connection(("127.0.0.1", _port(base)), timeout=60) as sock:
        sock.sendall(request)
        pieces = []
        while piece := sock.recv(1 << 20):
            pieces.append(piece)
    raw = b"".join(pieces)
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    status = int(status_line.split()[1])
    if head_only:
        assert rest == b"", "a HEAD answer has no body"
        return Answer(status, headers, rest, 0)
    if headers.get("transfer-encoding") == "chunked":
        assert "content-length" not in headers
        body, count = _dechunked(rest)
        return Answer(status, headers, body, count)
    if "content-length" in headers:
        assert len(rest) == int(headers["content-length"]), "Content-Length is not the body's"
    return Answer(status, headers, rest, 0)


def _dechunked(data: bytes) -> tuple[bytes, int]:
    """A chunked body taken apart (RFC 9112 §7.1): its bytes and its number of chunks."""
    out: list[bytes] = []
    count, at = 0, 0
    while True:
        end = data.index(b"\r\n", at)
        size = int(data[at:end].split(b";")[0], 16)
        at = end + 2
        if size == 0:
            assert data[at:] == b"\r\n", "bytes after the last chunk"
            return b"".join(out), count
        out.append(data[at : at + size])
        assert data[at + size : at + size + 2] == b"\r\n", "a chunk is not as long as it says"
        at += size + 2
        count += 1


@pytest.fixture(scope="module")
def identity(server: str) -> dict[str, bytes]:
    """Each request's answer without any coding (asked for with an explicit identity)."""
    answers = {}
    for name, body in (("whole", WHOLE), ("streamed", STREAMED), ("inline", INLINE)):
        answer = _exchange(server, _request("/attention", body, {"Accept-Encoding": "identity"}))
        assert answer.status == 200 and "content-encoding" not in answer.headers
        answers[name] = answer.body
    return answers


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_a_whole_answer_is_compressed_with_its_length(
    server: str, identity: dict[str, bytes], coding: str
) -> None:
    answer = _exchange(server, _request("/attention", WHOLE, {"Accept-Encoding": coding}))
    assert answer.status == 200
    assert answer.headers["content-encoding"] == coding
    assert "transfer-encoding" not in answer.headers  # the compressed length, stated
    assert int(answer.headers["content-length"]) < len(identity["whole"]) * 0.6
    assert answer.headers["vary"] == "Accept, Accept-Encoding"
    assert answer.decoded() == identity["whole"]


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_a_streamed_answer_is_compressed_as_it_streams(
    server: str, identity: dict[str, bytes], coding: str
) -> None:
    answer = _exchange(server, _request("/attention", STREAMED, {"Accept-Encoding": coding}))
    assert answer.status == 200
    assert answer.headers["transfer-encoding"] == "chunked"
    assert answer.headers["content-encoding"] == coding
    assert answer.chunks > 10  # sent piece by piece, not compressed whole at the end
    assert len(answer.body) < len(identity["streamed"]) * 0.6
    assert answer.decoded() == identity["streamed"]


def test_an_inline_answer_is_compressed_and_a_tiny_one_is_not(
    server: str, identity: dict[str, bytes]
) -> None:
    answer = _exchange(server, _request("/attention", INLINE, {"Accept-Encoding": "gzip"}))
    assert answer.headers["content-encoding"] == "gzip"
    assert answer.decoded() == identity["inline"]
    tiny = {"seed": 0, "seq_len": 2, "d_model": 2, "d_k": 2, "include": ["weights"]}
    small = _exchange(server, _request("/attention", tiny, {"Accept-Encoding": "gzip"}))
    assert small.status == 200 and "content-encoding" not in small.headers
    assert len(small.body) < 1024 and json.loads(small.body)["weights"]


@pytest.mark.parametrize(
    ("accept_encoding", "coding"),
    [
        ("gzip, deflate, br, zstd", "zstd"),  # a browser's: the service's preference
        ("gzip;q=1, zstd;q=0.5, br;q=0.8", "gzip"),  # the client's q first
        ("zstd;q=0, *", "br"),
        ("GZip", "gzip"),  # case-insensitive
        ("deflate", None),  # nothing the service makes
        ("identity, gzip;q=0.5", None),  # identity preferred
        ("identity;q=0, *;q=0", None),  # nothing acceptable: identity anyway, not a 406
        ("gzip;q=0", None),
    ],
)
def test_the_coding_follows_accept_encoding(
    server: str, identity: dict[str, bytes], accept_encoding: str, coding: str | None
) -> None:
    answer = _exchange(server, _request("/attention", WHOLE, {"Accept-Encoding": accept_encoding}))
    assert answer.status == 200
    assert answer.headers.get("content-encoding") == coding
    assert answer.decoded() == identity["whole"]


def test_an_http_1_0_client_gets_a_compressed_stream_ended_by_the_close(
    server: str, identity: dict[str, bytes]
) -> None:
    request = _request("/attention", STREAMED, {"Accept-Encoding": "gzip"}, version="HTTP/1.0")
    answer = _exchange(server, request)
    assert answer.status == 200
    assert "transfer-encoding" not in answer.headers  # HTTP/1.0 has no chunks
    assert "content-length" not in answer.headers  # the close ends it
    assert answer.headers["content-encoding"] == "gzip"
    assert answer.decoded() == identity["streamed"]


def test_head_states_the_compressed_length_of_the_get(server: str) -> None:
    headers = {"Accept-Encoding": "br"}
    got = _exchange(server, _request("/openapi.json", headers=headers, method="GET"))
    head = _exchange(server, _request("/openapi.json", headers=headers, method="HEAD"), True)
    plain = _exchange(server, _request("/openapi.json", method="GET"))
    assert got.status == head.status == 200
    assert got.headers["content-encoding"] == head.headers["content-encoding"] == "br"
    assert head.headers["content-length"] == got.headers["content-length"]
    assert "accept-encoding" in got.headers["vary"].lower()
    assert got.decoded() == plain.body and json.loads(plain.body)["openapi"]


def test_errors_stay_errors_and_safetensors_stays_identity(server: str) -> None:
    """A long 422 (41 fields refused, over 1 KiB) is compressed and still the one error shape; a short
    404 is not; a safetensors answer never is."""
    headers = {"Accept-Encoding": "gzip, br, zstd"}
    bad = {"seed": 0, "seq_len": 4, "d_model": 4, "d_k": 4, **{f"extra{i}": i for i in range(41)}}
    wrong = _exchange(server, _request("/attention", bad, headers))
    assert wrong.status == 422 and wrong.headers["content-encoding"] == "zstd"
    errors = json.loads(wrong.decoded())["errors"]
    assert len(errors) >= 10 and [e["field"] for e in errors] == [
        f"extra{i}" for i in range(len(errors))
    ]
    unknown = _exchange(server, _request("/nowhere", {}, headers))
    assert unknown.status == 404 and json.loads(unknown.decoded())["message"]
    binary = {**headers, "Accept": "application/x-safetensors"}
    answer = _exchange(server, _request("/attention", WHOLE, binary))
    assert answer.status == 200 and "content-encoding" not in answer.headers
    assert answer.headers["content-type"] == "application/x-safetensors"


def _gauge(base: str, name: str) -> float:
    answer = _exchange(base, _request("/metrics", method="GET"))
    for line in answer.body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in /metrics")


def test_a_whole_compressed_answer_holds_its_compressed_bytes_in_the_budget() -> None:
    """An answer nobody reads is counted until it has left: as the compressed bytes and the
    request's buffers, not as the numbers and their JSON it no longer holds."""
    proc, base = start_server(workers=1)
    try:
        body = {"seed": 1, "seq_len": 512, "d_model": 64, "d_k": 64}  # ≈ 0.8 M numbers
        request = _request("/attention", body, {"Accept-Encoding": "gzip"})
        with socket.create_connection(("127.0.0.1", _port(base)), timeout=60) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(request)
            first = sock.recv(4096)
            assert first.startswith(b"HTTP/1.1 200")
            head = first.partition(b"\r\n\r\n")[0].lower()
            length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
            time.sleep(1.0)  # encoded and compressed; the answer waits in the buffers
            held = _gauge(base, "attention_budget_in_use_bytes")
            assert length < held <= length + (1 << 20)  # the request's buffers: BASE_COST
    finally:
        stop_server(proc)
