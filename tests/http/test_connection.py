"""End to end: the connection's limits and deadlines (service.http.connection) and the answers
the middleware gives before reading a body, against a real `python -m service` on raw sockets."""

import contextlib
import json
import os
import select
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.live import start_server, stop_server
from service.http.connection import LINGER_SECONDS

pytestmark = pytest.mark.e2e

KEY = "connection-test-key"
MAX_HEADER_BYTES = 16 * 1024
MAX_HEADERS = 20
TIMEOUT = 1.0  # the head, body and send deadlines
SLACK = 3.0  # on top of a deadline, for a loaded 2-core CI machine
MAX_CONNECTIONS = 16
MAX_BODY = 8 << 20  # above what loopback buffers absorb, so that a drain is needed
ENV = {
    "ATTENTION_API_KEYS": KEY,
    "ATTENTION_MAX_HEADER_BYTES": str(MAX_HEADER_BYTES),
    "ATTENTION_MAX_HEADERS": str(MAX_HEADERS),
    "ATTENTION_HEADER_TIMEOUT_SECONDS": str(TIMEOUT),
    "ATTENTION_BODY_TIMEOUT_SECONDS": str(TIMEOUT),
    "ATTENTION_SEND_TIMEOUT_SECONDS": str(TIMEOUT),
    "ATTENTION_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    "ATTENTION_MAX_BODY_BYTES": str(MAX_BODY),
    "ATTENTION_GRACEFUL_SECONDS": "2",
}
KEYED_JSON = [("X-API-Key", KEY), ("Content-Type", "application/json")]


@dataclass(frozen=True)
class Server:
    """A running server: where it listens and where its log goes."""

    base: str
    log: Path

    def connect(self, timeout: float = 10.0, rcvbuf: int | None = None) -> socket.socket:
        """A raw connection (with a small receive buffer when ``rcvbuf`` is given)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(timeout)
        sock.connect(("127.0.0.1", int(self.base.rsplit(":", 1)[1])))
        return sock

    def access_line(self, request_id: str, wait: float = 5.0) -> dict[str, Any]:
        """The access log line of the request ``request_id`` (waiting for it to be written)."""
        deadline = time.monotonic() + wait
        while True:
            for line in self.log.read_text().splitlines():
                if line.startswith("{"):
                    entry: dict[str, Any] = json.loads(line)
                    if entry.get("request_id") == request_id:
                        return entry
            assert time.monotonic() < deadline, f"no access log line for {request_id}"
            time.sleep(0.05)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("connection") / "server.log"
    proc, base = start_server(workers=1, env={**os.environ, **ENV}, log=log)
    yield Server(base, log)
    stop_server(proc)


@dataclass(frozen=True)
class Answer:
    """One HTTP answer as read off the socket."""

    status_line: str
    headers: list[tuple[str, str]]  # names lowercased, in order
    body: bytes  # de-chunked

    @property
    def status(self) -> int:
        return int(self.status_line.split()[1])

    def header(self, name: str) -> str | None:
        values = [v for n, v in self.headers if n == name]
        assert len(values) <= 1, f"{name} appears {len(values)} times"
        return values[0] if values else None

    def json(self) -> Any:
        assert self.header("content-type") == "application/json"
        return json.loads(self.body)


def _dechunk(data: bytes) -> bytes:
    out, at = bytearray(), 0
    while True:
        eol = data.index(b"\r\n", at)
        size = int(data[at:eol].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[eol + 2 : eol + 2 + size]
        assert data[eol + 2 + size : eol + 4 + size] == b"\r\n", "a chunk does not end in CRLF"
        at = eol + 4 + size


def _parse(raw: bytes) -> Answer:
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"no complete answer: {raw[:300]!r}"
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = [(n.strip().lower(), v.strip()) for n, v in (line.split(":", 1) for line in lines)]
    answer = Answer(status_line, headers, body)
    if answer.header("transfer-encoding") == "chunked":
        answer = Answer(status_line, headers, _dechunk(body))
    return answer


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    try:
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
    except TimeoutError:
        raise AssertionError(
            f"the server did not close the connection; got {b''.join(chunks)[:300]!r}"
        ) from None
    return b"".join(chunks)


def _readable(sock: socket.socket, wait: float) -> bool:
    return bool(select.select([sock], [], [], wait)[0])


def _head(
    method: str, path: str, headers: list[tuple[str, str]], version: str = "HTTP/1.1"
) -> bytes:
    lines = [f"{method} {path} {version}", *(f"{n}: {v}" for n, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _post(body: dict[str, Any], request_id: str, version: str = "HTTP/1.1") -> bytes:
    data = json.dumps(body).encode()
    headers = [*KEYED_JSON, ("Content-Length", str(len(data))), ("X-Request-ID", request_id)]
    if version == "HTTP/1.1":
        headers = [("Host", "x"), ("Connection", "close"), *headers]
    return _head("POST", "/attention", headers, version) + data


def _exchange(server: Server, request: bytes) -> Answer:
    with server.connect() as sock:
        sock.sendall(request)
        return _parse(_read_all(sock))


def _assert_error(answer: Answer, status: int, kind: str) -> dict[str, Any]:
    """``answer`` is ``status`` with the service's JSON error shape, its type ``kind``."""
    assert answer.status == status, answer
    body: dict[str, Any] = answer.json()
    assert set(body) == {"message", "errors"}, body
    assert body["errors"] and all({"field", "message", "type"} <= set(e) for e in body["errors"])
    assert body["errors"][0]["type"] == kind and body["message"] == body["errors"][0]["message"]
    return body


def _requests_total(server: Server, **labels: str) -> float:
    """attention_requests_total summed over the series that have ``labels``."""
    with urllib.request.urlopen(server.base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    wanted = [f'{name}="{value}"' for name, value in labels.items()]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("attention_requests_total{") and all(w in line for w in wanted)
    )


def _gauge(server: Server, name: str) -> float:
    with urllib.request.urlopen(server.base + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} is not in /metrics")


def _eventually(check: Callable[[], bool], what: str, wait: float = 5.0) -> None:
    deadline = time.monotonic() + wait
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# 1. the head's size
def test_an_oversized_head_is_431_before_the_client_has_sent_it_all(server: Server) -> None:
    """A 4 MB header value sent in pieces is answered 431 (JSON, connection closed) once the
    head passes the limit, not after the whole head has arrived."""
    piece, total, sent = b"a" * 16384, 4 << 20, 0
    with server.connect() as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        while sent < total and not _readable(sock, 0.05):
            sock.sendall(piece)
            sent += len(piece)
        assert sent < 1 << 20, f"no answer until {sent:,} bytes of the head had been sent"
        answer = _parse(_read_all(sock))
    body = _assert_error(answer, 431, "headers_too_large")
    assert f"{MAX_HEADER_BYTES:,} bytes" in body["message"]
    assert answer.header("connection") == "close"


def _sized_head(size: int) -> bytes:
    start = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: "
    return start + b"p" * (size - len(start) - 4) + b"\r\n\r\n"


def _counted_head(fields: int) -> bytes:
    extra = [(f"X-Field-{i}", "v") for i in range(fields - 2)]
    return _head("GET", "/healthz", [("Host", "x"), ("Connection", "close"), *extra])


# 2. the head's header count (and both limits exactly)
@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (_counted_head(MAX_HEADERS), 200),
        (_counted_head(MAX_HEADERS + 1), 431),
        (_sized_head(MAX_HEADER_BYTES), 200),
        (_sized_head(MAX_HEADER_BYTES + 1), 431),
    ],
    ids=["fields-at-limit", "fields-over-limit", "bytes-at-limit", "bytes-over-limit"],
)
def test_header_limits_are_exact(server: Server, request_bytes: bytes, status: int) -> None:
    """A head at max_headers fields or max_header_bytes bytes is served; one more is 431."""
    answer = _exchange(server, request_bytes)
    if status == 200:
        assert answer.status == 200 and answer.json()["status"] == "ok"
    else:
        _assert_error(answer, 431, "headers_too_large")
        assert answer.header("connection") == "close"


@pytest.mark.parametrize("tail", [1, 2, 3, 4, 5], ids=lambda n: f"last-{n}-bytes-apart")
def test_a_head_split_across_reads_is_counted_exactly(server: Server, tail: int) -> None:
    """A POST head of exactly max_header_bytes whose blank line is split between two reads, the
    second read also carrying the body, is served: the head's end is found across the reads, so
    the body's bytes are not counted as head."""
    body = json.dumps({"q": [[1.0, 0.0]], "k": [[1.0, 0.0]], "v": [[2.0, 3.0]]}).encode()
    fields = [("Host", "x"), *KEYED_JSON, ("Content-Length", str(len(body))), ("X-Pad", "")]
    start = _head("POST", "/attention", fields)[: -len(b"\r\n\r\n")]
    head = start + b"p" * (MAX_HEADER_BYTES - len(start) - 4) + b"\r\n\r\n"
    assert len(head) == MAX_HEADER_BYTES
    with server.connect() as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(head[:-tail])
        time.sleep(0.05)  # two reads on the server
        sock.sendall(head[-tail:] + body + _sized_head(1024))  # and a next request, pipelined
        first = b""
        while b'"output"' not in first and (chunk := sock.recv(1 << 16)):
            first += chunk
    assert first.startswith(b"HTTP/1.1 200"), first[:200]
    assert b'"output":[[2.0,3.0]]' in first


def test_a_pipelined_requests_head_is_counted_against_the_cap(server: Server) -> None:
    """A second request sent in the same read as the first, with a head over the cap: the first
    is answered, the second is 431 (its head counted on its own, not only per read)."""
    big = [("Host", "x"), *((f"X-Pad-{i}", "p" * 4000) for i in range(6))]  # 24 KB > 16 KB
    small = _head("GET", "/healthz", [("Host", "x")])
    with server.connect() as sock:
        sock.sendall(small + _head("GET", "/healthz", big))
        raw = _read_all(sock)
    first, _, rest = raw.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200"), raw[:200]
    assert b"HTTP/1.1 431" in rest, raw[:600]


# 3. the head and body deadlines
@pytest.mark.parametrize("case", ["silent", "head-trickled", "body-trickled"])
def test_a_request_that_arrives_too_slowly_is_408_then_closed(server: Server, case: str) -> None:
    """A socket that sends nothing, a head sent a byte every 0.2 s and a body sent a byte every
    0.2 s each get a JSON 408 about one deadline after it started, the connection is closed,
    and the access log says 408 with the reason."""
    request_id = f"slow-{case}-{time.monotonic_ns()}"
    trickle, kind = b"", "header_timeout"
    with server.connect() as sock:
        start = time.monotonic()
        if case == "head-trickled":
            trickle = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        elif case == "body-trickled":
            upload = [("Host", "x"), *KEYED_JSON, ("Content-Length", "40")]
            sock.sendall(_head("POST", "/attention", [*upload, ("X-Request-ID", request_id)]))
            start = time.monotonic()
            trickle, kind = b" " * 40, "body_timeout"
        for byte in trickle:  # stops once the server has answered
            if _readable(sock, 0.2):
                break
            sock.sendall(bytes([byte]))
        answer = _parse(_read_all(sock))
        elapsed = time.monotonic() - start
    _assert_error(answer, 408, kind)
    assert answer.header("connection") == "close"
    assert 0.9 * TIMEOUT <= elapsed <= TIMEOUT + SLACK, elapsed
    logged_id = request_id if case == "body-trickled" else answer.header("x-request-id")
    assert logged_id is not None
    line = server.access_line(logged_id)
    assert (line["status"], line["reason"]) == (408, kind)


BODY_AFTER_ANSWER = [
    ([("Content-Length", "1000000000")], 0.3),  # faster than the drain's idle second
    ([("Transfer-Encoding", "chunked")], 1.5),  # slower: the drain ends at its idle second
]


@pytest.mark.parametrize(
    ("framing", "gap"), BODY_AFTER_ANSWER, ids=["1-GB-length-0.3s", "chunked-1.5s"]
)
def test_a_body_trickled_after_its_early_answer_is_drained_then_closed(
    server: Server, framing: list[tuple[str, str]], gap: float
) -> None:
    """A GET /healthz that declares a body, reads its 200, then sends that body a byte at a
    time: the connection ends within the lingering close's bounds (LINGER_SECONDS, or an idle
    LINGER_IDLE_SECONDS), not never — a thousand such sockets would hold a worker at its cap."""
    with server.connect() as sock:
        sock.sendall(_head("GET", "/healthz", [("Host", "x"), *framing]))
        assert _readable(sock, TIMEOUT + SLACK), "no answer to the GET"
        answer = sock.recv(1 << 16)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        start, closed, half_closed = time.monotonic(), False, False
        while time.monotonic() - start < LINGER_SECONDS + SLACK:
            try:
                sock.sendall(b"1\r\nx\r\n" if "chunked" in str(framing) else b"x")
            except OSError:  # reset: the server has closed for good
                closed = True
                break
            if half_closed:  # the server said it sends nothing more; it may still drain
                time.sleep(gap)
            elif _readable(sock, gap):
                half_closed = sock.recv(1 << 16) == b""
        elapsed = time.monotonic() - start
    assert closed, f"the connection was still open after {elapsed:.1f} s of trickling"
    assert elapsed <= LINGER_SECONDS + SLACK, elapsed


def test_a_body_timeout_answer_carries_the_requests_id(server: Server) -> None:
    """The 408 for a slow body has the X-Request-ID its access log line has (the client's)."""
    head = _head(
        "POST",
        "/attention",
        [("Host", "x"), *KEYED_JSON, ("Content-Length", "10"), ("X-Request-ID", "slow-body-id")],
    )
    answer = _exchange(server, head)
    assert answer.status == 408
    assert answer.header("x-request-id") == "slow-body-id"
    line = server.access_line("slow-body-id")
    assert (line["status"], line["reason"]) == (408, "body_timeout")
    assert line["bytes_out"] == len(answer.body)  # the 408 the connection wrote


# 4. the connection cap
def test_a_connection_over_the_cap_is_503_with_retry_after(server: Server) -> None:
    """With max_connections idle sockets open the next connection gets a JSON 503 with
    Retry-After at once (the idle ones were admitted: each gets its own 408); then the server
    serves again."""
    idle = [server.connect() for _ in range(MAX_CONNECTIONS)]
    try:
        with server.connect(timeout=TIMEOUT + SLACK) as extra:
            answer = _parse(_read_all(extra))
        _assert_error(answer, 503, "too_many_connections")
        assert answer.header("retry-after") == "2" and answer.header("connection") == "close"
        assert [_parse(_read_all(sock)).status for sock in idle] == [408] * MAX_CONNECTIONS
    finally:
        for sock in idle:
            sock.close()
    with urllib.request.urlopen(server.base + "/healthz", timeout=10) as r:
        assert r.status == 200


# 5. answers before the body
DECLARED = 8_000_000  # under the body limit: only an answer that does not wait for it is quick


@pytest.mark.parametrize(
    ("path", "headers", "status", "kind"),
    [
        ("/attention", [("Content-Type", "application/json")], 401, "unauthorized"),
        ("/nowhere", KEYED_JSON, 404, "not_found"),
        ("/healthz", KEYED_JSON, 405, "method_not_allowed"),
        ("/attention", [("X-API-Key", KEY), ("Content-Type", "text/plain")], 415, "unsupported_media_type"),
        ("/attention", [("X-API-Key", KEY)], 415, "unsupported_media_type"),
        ("/attention", [*KEYED_JSON, ("Accept", "text/html")], 406, "not_acceptable"),
    ],
    ids=["401-no-key", "404-no-route", "405-get-only", "415-text-plain", "415-no-content-type", "406-html-only"],
)  # fmt: skip
def test_a_refusal_comes_before_the_body(
    server: Server, path: str, headers: list[tuple[str, str]], status: int, kind: str
) -> None:
    """A head declaring a large body, with no body byte sent, gets its JSON 401/404/405/415/406
    within a second, with Connection: close, and the connection is closed."""
    head = _head("POST", path, [("Host", "x"), *headers, ("Content-Length", str(DECLARED))])
    with server.connect(timeout=TIMEOUT + SLACK) as sock:
        start = time.monotonic()
        sock.sendall(head)
        raw = _read_all(sock)
        elapsed = time.monotonic() - start
    answer = _parse(raw)
    _assert_error(answer, status, kind)
    assert answer.header("connection") == "close"
    assert elapsed < 2.0, elapsed
    if status == 401:
        assert answer.header("www-authenticate") == "Bearer"
    if status == 405:
        assert answer.header("allow") == "GET, HEAD"  # HEAD is served wherever GET is


# 6. metrics labels
def test_a_cut_upload_is_499_and_a_413_is_labelled_with_its_endpoint(server: Server) -> None:
    """A client that leaves during its upload is counted as 499 (not 500) and a 413 as
    endpoint /attention (not "unmatched")."""
    counts = {
        status: _requests_total(server, endpoint="/attention", status=status)
        for status in ("499", "413", "500")
    }
    unmatched = _requests_total(server, endpoint="unmatched")
    upload = [("Host", "x"), *KEYED_JSON, ("Content-Length", "100000")]
    with server.connect() as sock:
        sock.sendall(_head("POST", "/attention", upload) + b'{"seq_len": 3')
        time.sleep(0.1)
    too_large = [("Host", "x"), *KEYED_JSON, ("Content-Length", str(MAX_BODY + 1))]
    _assert_error(_exchange(server, _head("POST", "/attention", too_large)), 413, "body_too_large")

    def counted() -> bool:
        return all(
            _requests_total(server, endpoint="/attention", status=status) == counts[status] + 1
            for status in ("499", "413")
        )

    _eventually(counted, f"not counted under /attention as 499 and 413 (before: {counts})")
    assert _requests_total(server, endpoint="/attention", status="500") == counts["500"]
    assert _requests_total(server, endpoint="unmatched") == unmatched


# 7. the lingering close
def _urllib_post(server: Server, body: bytes, headers: dict[str, str]) -> urllib.error.HTTPError:
    req = urllib.request.Request(server.base + "/attention", data=body, headers=headers)
    with pytest.raises(urllib.error.HTTPError) as caught:  # not URLError(ECONNRESET / EPIPE)
        urllib.request.urlopen(req, timeout=30)
    return caught.value


LINGER_CASES = [
    ({"Content-Type": "application/json", "X-API-Key": KEY}, 413, "body_too_large"),
    ({"Content-Type": "text/plain"}, 401, "unauthorized"),
]


@pytest.mark.parametrize(("headers", "status", "kind"), LINGER_CASES, ids=["413", "401"])
def test_a_client_that_uploads_before_reading_still_gets_the_answer(
    server: Server, headers: dict[str, str], status: int, kind: str
) -> None:
    """urllib POSTing a body just over the limit (8 MiB, far more than the loopback buffers hold)
    to an answer given before the body is read gets the HTTPError with its JSON message, never a
    reset or a broken pipe (five times in a row)."""
    for _ in range(5):
        err = _urllib_post(server, b"1" * (MAX_BODY + (16 << 10)), headers)
        with err:
            assert err.code == status
            body = json.loads(err.read())
        assert body["errors"][0]["type"] == kind and body["message"]


def test_a_client_that_uploads_far_over_the_limit_still_gets_the_answer(server: Server) -> None:
    """urllib POSTing 4 times the body limit gets the 413, not a broken pipe (the drain is
    bounded by time, not by the body limit)."""
    headers = {"Content-Type": "application/json", "X-API-Key": KEY}
    req = urllib.request.Request(
        server.base + "/attention", data=b"1" * (4 * MAX_BODY), headers=headers
    )
    try:
        urllib.request.urlopen(req, timeout=30)
    except urllib.error.HTTPError as err:
        with err:
            assert err.code == 413
        return
    pytest.fail("a body over the limit was accepted")


# 8. HTTP/1.0 framing
STREAMED = {"seq_len": 600, "seed": 1, "d_model": 8, "d_k": 8}  # over WHOLE_NUMBERS


@pytest.mark.parametrize("version", ["HTTP/1.0", "HTTP/1.1"])
def test_a_streamed_answer_is_framed_for_the_clients_http_version(
    server: Server, version: str
) -> None:
    """A large streamed answer to HTTP/1.0 has no Transfer-Encoding and ends when the connection
    does; to HTTP/1.1 it is chunked; both bodies are whole JSON."""
    answer = _exchange(server, _post(STREAMED, f"framing-{version}", version))
    assert answer.status == 200
    coding = answer.header("transfer-encoding")
    assert coding == (None if version == "HTTP/1.0" else "chunked")
    assert answer.header("content-length") is None
    result = answer.json()
    assert len(result["weights"]) == 600 and len(result["weights"][0]) == 600


# 9. Host and transfer codings
@pytest.mark.parametrize(
    ("request_bytes", "status", "kind"),
    [
        (b"GET /healthz HTTP/1.1\r\n\r\n", 400, "host_invalid"),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "host_invalid"),
        (
            _head(
                "POST",
                "/attention",
                [("Host", "x"), *KEYED_JSON, ("Transfer-Encoding", "gzip, chunked")],
            )
            + b"0\r\n\r\n",
            501,
            "transfer_coding_unsupported",
        ),
        (b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505, "http_version_unsupported"),
    ],
    ids=["no-host", "two-hosts", "gzip-chunked", "http-2.0"],
)
def test_http11_framing_rules(server: Server, request_bytes: bytes, status: int, kind: str) -> None:
    """An HTTP/1.1 request without Host or with two is 400, a transfer coding other than chunked
    is 501; each with the JSON error shape, and the connection is closed."""
    answer = _exchange(server, request_bytes)
    _assert_error(answer, status, kind)
    assert answer.header("connection") == "close"


# 10. HEAD
@pytest.mark.parametrize("path", ["/healthz", "/"])
def test_head_is_answered_like_get_without_the_body(server: Server, path: str) -> None:
    """HEAD is 200 with GET's Content-Length and no body; GET still has its body."""
    conn = [("Host", "x"), ("Connection", "close")]
    got = _exchange(server, _head("GET", path, conn))
    head = _exchange(server, _head("HEAD", path, conn))
    assert got.status == 200 and len(got.body) > 0
    assert head.status == 200 and head.body == b""
    assert head.header("content-length") == str(len(got.body))
    assert head.header("content-type") == got.header("content-type")


# 11. trailing slashes
@pytest.mark.parametrize(
    ("request_bytes", "location"),
    [
        (
            _head(
                "POST",
                "/attention/",
                [("Host", "evil.example"), *KEYED_JSON, ("Content-Length", "2")],
            )
            + b"{}",
            "/attention",
        ),
        (_head("GET", "/docs/", [("Host", "evil.example"), ("Connection", "close")]), "/docs"),
    ],
    ids=["post-attention-slash", "get-docs-slash"],
)
def test_a_trailing_slash_redirects_relatively(
    server: Server, request_bytes: bytes, location: str
) -> None:
    """A path with a trailing slash is 308 to a relative Location without it (the Host header
    is never echoed)."""
    answer = _exchange(server, request_bytes)
    _assert_error(answer, 308, "moved")
    assert answer.header("location") == location
    assert "evil.example" not in repr(answer)


# 12. no server header
@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        _counted_head(MAX_HEADERS + 1),
    ],
    ids=["200", "404-early", "431-connection"],
)
def test_answers_have_no_server_header(server: Server, request_bytes: bytes) -> None:
    """No answer names the server software (from the app, the middleware or the connection)."""
    answer = _exchange(server, request_bytes)
    assert answer.header("date") is not None
    assert answer.header("server") is None, answer.headers


# 13. the send deadline
def test_a_reader_that_stalls_is_disconnected_and_its_memory_given_back(server: Server) -> None:
    """A client that reads the status line of a ~180 MB answer and then nothing is disconnected
    within about send_timeout (logged as 499, reason send_timeout) and the memory comes back."""
    request_id = f"stalled-{time.monotonic_ns()}"
    large = {"seq_len": 1500, "seed": 1, "d_model": 8, "d_k": 8}
    with server.connect(rcvbuf=4096) as sock:
        sock.sendall(_post(large, request_id))
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")  # then reads nothing more
        started = time.monotonic()
        line = server.access_line(request_id, wait=TIMEOUT + 3 * SLACK)
        waited = time.monotonic() - started
    assert (line["status"], line["reason"], line["outcome"]) == (499, "send_timeout", "incomplete")
    assert waited < TIMEOUT + 2 * SLACK, waited
    _eventually(
        lambda: _gauge(server, "attention_budget_in_use_bytes") == 0.0,
        "the stalled reader's memory was not given back",
    )


READER_WINDOW = 6.0  # the send window of the readers' server
ANSWER_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def readers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose send window is long enough for the client's TCP window to open (it opens
    tens of kilobytes at a time) and whose answers may be waited on for ANSWER_TIMEOUT s."""
    log = tmp_path_factory.mktemp("readers") / "server.log"
    env = {
        **os.environ,
        **ENV,
        "ATTENTION_SEND_TIMEOUT_SECONDS": str(READER_WINDOW),
        "ATTENTION_ANSWER_TIMEOUT_SECONDS": str(ANSWER_TIMEOUT),
    }
    proc, base = start_server(workers=1, env=env, log=log)
    yield Server(base, log)
    stop_server(proc)


def _read_at(sock: socket.socket, rate: int, seconds: float) -> tuple[int, bool]:
    """Read at ``rate`` bytes/s for ``seconds`` (a quarter second's worth at a time): the bytes
    read, and whether the server ended the connection meanwhile."""
    got, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            chunk = sock.recv(rate // 4)
        except ConnectionResetError:
            return got, True
        if not chunk:
            return got, True
        got += len(chunk)
        time.sleep(0.25)
    return got, False


def test_a_reader_above_the_minimum_rate_is_never_cut(readers_server: Server) -> None:
    """A client reading a large answer at 8 times the minimum rate, for longer than a send
    window: it is not cut (the kernel's send queue and the client's window made such readers
    look stalled, and cut them at the first window)."""
    request_id = f"steady-{time.monotonic_ns()}"
    large = {"seq_len": 1024, "seed": 1, "d_model": 8, "d_k": 8, "include": ["weights"]}
    with readers_server.connect() as sock:
        sock.sendall(_post(large, request_id))
        got, ended = _read_at(sock, 8 * 4096, 2 * READER_WINDOW + 1)
    assert not ended, f"cut after {got:,} bytes"
    line = readers_server.access_line(request_id)  # written when the client closed
    assert (line["status"], line.get("reason")) != (499, "send_timeout"), line


def test_a_reader_behind_for_longer_than_the_answer_timeout_is_cut(readers_server: Server) -> None:
    """A reader fast enough for the minimum rate but not for its answer (64 KB/s for a ~20 MB
    answer, which would hold its memory for minutes) is disconnected once it has been behind
    for ANSWER_TIMEOUT s: 499, answer_timeout, and the memory comes back."""
    request_id = f"long-{time.monotonic_ns()}"
    large = {"seq_len": 1024, "seed": 2, "d_model": 8, "d_k": 8, "include": ["weights"]}
    line: dict[str, Any] | None = None
    with readers_server.connect() as sock:
        sock.sendall(_post(large, request_id))
        start = time.monotonic()
        while line is None and time.monotonic() - start < ANSWER_TIMEOUT + READER_WINDOW + SLACK:
            _read_at(sock, 16 * 4096, 0.5)  # (what the kernels hold still arrives after the cut)
            with contextlib.suppress(AssertionError):
                line = readers_server.access_line(request_id, wait=0)
        elapsed = time.monotonic() - start
    assert line is not None, f"the reader was not cut in {elapsed:.1f} s"
    assert (line["status"], line["reason"]) == (499, "answer_timeout"), line
    assert ANSWER_TIMEOUT * 0.9 < elapsed < ANSWER_TIMEOUT + READER_WINDOW + SLACK, elapsed
    _eventually(
        lambda: _gauge(readers_server, "attention_budget_in_use_bytes") == 0.0,
        "the slow reader's memory was not given back",
    )


# the connection cap and the open-file limit (in process)
@pytest.mark.parametrize(
    ("soft", "hard", "raised_to", "cap"),
    [
        (1024, 1024, None, 1024 - 64),  # cannot be raised: the cap fits the limit
        (1024, 4096, 1064, 1000),  # raised just enough for 1,000 connections
        (65536, 65536, None, 1000),  # already enough
    ],
    ids=["hard-limit-low", "soft-raised", "enough"],
)
def test_the_connection_cap_fits_the_open_file_limit(
    monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, raised_to: int | None, cap: int
) -> None:
    """The worker raises its soft open-file limit to fit the cap, or lowers the cap to fit."""
    import resource

    from service.config import Settings
    from service.http import connection_limits as connection

    raised: list[int] = []
    monkeypatch.setattr(connection, "get_settings", lambda: Settings(max_connections=1000))
    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, hard))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: raised.append(limits[0]))
    connection.limits.cache_clear()
    try:
        assert connection.limits().max_connections == cap
    finally:
        connection.limits.cache_clear()
    assert raised == ([] if raised_to is None else [raised_to])


def test_start_up_logs_where_the_explorer_and_the_docs_are(server: Server) -> None:
    """The first lines tell a person which URLs to open (the server listens on 127.0.0.1)."""
    lines = [json.loads(x) for x in server.log.read_text().splitlines() if x.startswith("{")]
    said = [x for x in lines if x.get("explorer")]
    assert len(said) == 1
    assert said[0]["explorer"] == f"{server.base}/" and said[0]["docs"] == f"{server.base}/docs"
    assert "the explorer is at" in said[0]["message"]
