"""safetensors bodies against a real `python -m service` on raw sockets: a header NumPy cannot
make is a JSON 4xx with the request's id (never a bare 500), a large body is parsed in the
parser process (the worker's /healthz stays quick meanwhile), and a header of too many tensors
is refused at once."""

import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from harness.live import start_server, stop_server
from service.http.routes import INLINE_BODY_BYTES, THREAD_BODY_BYTES
from service.wire.safetensors_in import MAX_TENSORS

pytestmark = pytest.mark.e2e

ST = "application/x-safetensors"
HEALTHZ_SECONDS = 0.5  # a probe's answer while large bodies parse (1 s and more before)
REFUSED_SECONDS = 1.5  # 300,000 empty tensors, from the last byte sent (9–14 s before)
LARGE_BODIES = 3  # sent at once: the old worker parsed them in threads, all sharing its GIL


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    log = tmp_path_factory.mktemp("binary_server") / "server.log"
    proc, base = start_server(workers=1, env=dict(os.environ), log=log)
    yield int(base.rsplit(":", 1)[1])
    stop_server(proc)


@dataclass(frozen=True)
class Answer:
    """One HTTP answer as read off the socket (the server closes after it)."""

    status: int
    headers: dict[str, str]  # names lowercased
    body: bytes
    seconds: float  # from the request's last byte sent to the answer's last byte read

    def error(self) -> dict[str, Any]:
        """The one JSON error shape (service.wire.errors)."""
        assert self.headers.get("content-type") == "application/json", (self.status, self.body[:200])  # fmt: skip
        body: dict[str, Any] = json.loads(self.body)
        assert set(body) == {"message", "errors"}
        assert set(body["errors"][0]) == {"field", "message", "type", "limit"}
        return body


def exchange(port: int, head: bytes, body: bytes = b"", timeout: float = 120.0) -> Answer:
    """Send one request with ``Connection: close`` and read its whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + body)
        sent = time.perf_counter()
        chunks = []
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
        seconds = time.perf_counter() - sent
    raw = b"".join(chunks)
    top, sep, rest = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete answer: {raw[:300]!r}"
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = {n.strip().lower(): v.strip() for n, v in (line.split(":", 1) for line in lines)}
    assert "chunked" not in headers.get("transfer-encoding", ""), "an error is never chunked"
    return Answer(int(status_line.split()[1]), headers, rest, seconds)


def post(port: int, path: str, body: bytes, request_id: str | None = None) -> Answer:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: {ST}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
        + (f"X-Request-ID: {request_id}\r\n" if request_id else "")
        + "\r\n"
    )
    return exchange(port, head.encode(), body)


def healthz(port: int) -> Answer:
    return exchange(port, b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")


def safetensors(header: dict[str, Any] | bytes, data: bytes = b"") -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def _empty(shape: list[int]) -> dict[str, Any]:
    return {"dtype": "F64", "shape": shape, "data_offsets": [0, 0]}


@pytest.mark.parametrize(
    "padding",
    [0, 4 * INLINE_BODY_BYTES, THREAD_BODY_BYTES],
    ids=["inline", "thread-sized", "parser-sized"],
)
@pytest.mark.parametrize(
    ("shape", "status", "words"),
    [
        ([2**62, 0], 422, "x is shaped [4611686018427387904, 0], more numbers than a tensor may hold"),
        ([0] * 65, 422, "x is a tensor of 65 dimensions; at most 8"),
        ([-1], 400, "its shape must be a list of sizes"),
    ],
    ids=["2^62-by-0", "65-dims", "negative"],
)  # fmt: skip
def test_a_bad_shape_is_a_json_4xx_with_the_request_id(
    port: int, padding: int, shape: list[int], status: int, words: str
) -> None:
    """A body small enough to be checked on the event loop, one checked in a thread, and one
    large enough for the parser process (a long sentence in the metadata): the same JSON
    answer."""
    fields = {"sentence": "a " * (padding // 2)} if padding else {}
    body = safetensors({"__metadata__": {"json": json.dumps(fields)}, "x": _empty(shape)})
    assert (len(body) > INLINE_BODY_BYTES) == bool(padding)
    answer = post(port, "/attention", body, request_id=f"bad-shape-{len(shape)}-{padding}")
    assert answer.status == status, (answer.status, answer.body[:300])
    assert answer.headers["x-request-id"] == f"bad-shape-{len(shape)}-{padding}"
    error = answer.error()
    assert error["errors"][0]["field"] == "x"
    assert words in error["message"]


def _large_body(mib: float = 28.0) -> bytes:
    """A /attention request of ``mib`` MiB of JSON under __metadata__["json"]: x of 4,096 rows
    of single digits (the most numbers a MiB holds, each one a Python int to make and convert),
    refused by a rule once x is read (w_q is 1×1; w_k, w_v missing): all of its cost is the
    parse and the check."""
    rows = 4096
    cols = int(mib * 2**20 / rows / 3)
    digits = np.random.default_rng(0).integers(0, 10, size=cols).astype(str)
    row = "[" + ", ".join(digits) + "]"
    fields = '{"w_q": [[1.0]], "x": [' + ", ".join([row] * rows) + "]}"
    return safetensors({"__metadata__": {"json": fields}})


def test_healthz_answers_at_once_while_large_safetensors_bodies_are_parsed(port: int) -> None:
    """Large safetensors bodies are parsed and checked in the parser process, not in the
    worker: while three 28 MiB ones are read, /healthz on the same worker answers within
    HEALTHZ_SECONDS (in the worker's threads, they held its GIL for a second and more)."""
    body = _large_body()
    assert len(body) > 27 * 2**20
    healthz(port)  # a connection made, the answer path warm
    answers: list[Answer] = []
    senders = [
        threading.Thread(target=lambda: answers.append(post(port, "/attention", body)))
        for _ in range(LARGE_BODIES)
    ]
    for sender in senders:
        sender.start()
    probes = []
    while any(s.is_alive() for s in senders):
        probe = healthz(port)
        assert probe.status == 200
        probes.append(probe.seconds)
        time.sleep(0.02)
    for sender in senders:
        sender.join()
    assert len(answers) == LARGE_BODIES
    for answer in answers:  # read in full and checked: refused by the rule, not by a limit
        assert answer.status == 422, answer.body[:300]
        assert "w_q is 1×1" in answer.error()["message"]
    assert len(probes) >= 5, "the large bodies were answered too fast to probe in between"
    assert max(probes) < HEALTHZ_SECONDS, f"slowest /healthz {max(probes):.3f} s of {len(probes)}"


def test_a_header_of_300000_empty_tensors_is_refused_at_once(port: int) -> None:
    """The header is refused as soon as its parse passes MAX_TENSORS objects: a 413 within
    REFUSED_SECONDS of the body's last byte (the whole header was read, 9–14 s, before)."""
    entry = b'{"dtype": "F64", "shape": [0], "data_offsets": [0, 0]}'
    text = b"{" + b",".join(b'"t%d": %s' % (i, entry) for i in range(300_000)) + b"}"
    body = safetensors(text)
    answer = post(port, "/attention", body, request_id="many-tensors")
    assert answer.status == 413, answer.body[:300]
    assert answer.headers["x-request-id"] == "many-tensors"
    item = answer.error()["errors"][0]
    assert (item["type"], item["limit"]) == ("limit_exceeded", MAX_TENSORS)
    assert answer.seconds < REFUSED_SECONDS, f"{answer.seconds:.2f} s"
    assert healthz(port).seconds < HEALTHZ_SECONDS
