"""POST /model through the compute endpoints' door, on a real server (issue: the probe's H1, H2,
M1 and the low findings about /model): a text that cannot fit the token cap is refused before
it is tokenized, /model has a body limit of its own, large bodies are parsed off the event loop,
an answer's memory stays counted until it has left, and a client that reads nothing is cut and
logged as cut. Sizes differ from the probe's on purpose."""

import http.client
import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import safetensors.numpy

from harness.live import start_server
from service.config import Settings
from service.models import answer
from service.models.catalog import BY_NAME

pytestmark = pytest.mark.e2e

SEND_TIMEOUT = 1.0
BUDGET = 600 << 20  # far above one /model answer: what stays counted is the answer's own
ENV = {
    "ATTENTION_SEND_TIMEOUT_SECONDS": str(SEND_TIMEOUT),
    "ATTENTION_MEMORY_BUDGET_BYTES": str(BUDGET),
}
SENTENCE = "the quick brown fox jumps over the lazy dog while "  # 10 words, 10 tokens


@dataclass(frozen=True)
class Server:
    base: str
    log: Path

    def connect(self, rcvbuf: int | None = None) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", int(self.base.rsplit(":", 1)[1])))
        return sock

    def access_line(self, request_id: str, wait: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + wait
        while True:
            for line in self.log.read_text().splitlines():
                if line.startswith("{") and json.loads(line).get("request_id") == request_id:
                    entry: dict[str, Any] = json.loads(line)
                    return entry
            assert time.monotonic() < deadline, f"no access log line for {request_id}"
            time.sleep(0.05)

    def gauge(self, name: str) -> float:
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(f"{name} is not in /metrics")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not BY_NAME["minilm"].installed(Settings().models_dir):
        pytest.skip("minilm is not installed here (make models)")
    log = tmp_path_factory.mktemp("model-door") / "server.log"
    proc, base = start_server(workers=1, env={**os.environ, **ENV}, log=log)
    yield Server(base, log)
    proc.terminate()
    proc.wait(timeout=15)


def _post(body: bytes, request_id: str = "") -> bytes:
    head = (
        "POST /model HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"X-Request-ID: {request_id or 'model-' + str(time.monotonic_ns())}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of a whole answer (Content-Length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"closed before the head: {data[:200]!r}"
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        piece = sock.recv(1 << 20)
        assert piece, "closed mid-answer"
        body += piece
    return int(head.split()[1]), json.loads(body)


class Stalls:
    """The longest a GET /healthz waited while something else ran."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.worst = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            with urllib.request.urlopen(self.base + "/healthz", timeout=60) as r:
                r.read()
            self.worst = max(self.worst, time.monotonic() - start)
            time.sleep(0.02)

    def __enter__(self) -> "Stalls":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_a_text_over_the_character_cap_is_refused_before_it_is_tokenized(server: Server) -> None:
    """One 600,000-character word (a single [UNK] token: under the token cap, so tokenizing it
    whole was answered 200) and 400,000 short words are refused with 413 naming text, quickly,
    without stalling /healthz."""
    cap = answer.max_text_chars(Settings())
    for text in ("x" * 600_000, "a " * 200_000):
        body = json.dumps({"model": "minilm", "text": text, "include": ["tokens"]}).encode()
        with Stalls(server.base) as stalls, server.connect() as sock:
            start = time.monotonic()
            sock.sendall(_post(body))
            status, error = _answer(sock)
            took = time.monotonic() - start
        assert status == 413, error
        assert error["errors"][0]["field"] == "text"
        assert f"limit of {cap:,}" in error["message"] and "shorter text" in error["message"]
        assert took < 2.0 and stalls.worst < 1.0, (took, stalls.worst)


def test_a_text_within_the_character_cap_but_over_the_token_cap_says_shorter_text(
    server: Server,
) -> None:
    tokens = Settings().max_model_tokens
    body = json.dumps({"model": "minilm", "text": "cat " * (tokens + 5)}).encode()
    with server.connect() as sock:
        sock.sendall(_post(body))
        status, error = _answer(sock)
    assert status == 413 and error["errors"][0]["field"] == "text"
    assert "tokens" in error["message"] and "shorter text" in error["message"]
    assert "heads" not in error["message"] and "masks" not in error["message"]


def test_a_text_of_only_special_tokens_is_a_422_as_an_empty_one_is(server: Server) -> None:
    """Zero-width and control characters tokenize to nothing but [CLS] [SEP]."""
    for text in ("\u200b\u200b", "\x00\x01"):
        body = json.dumps({"model": "minilm", "text": text}).encode()
        with server.connect() as sock:
            sock.sendall(_post(body))
            status, error = _answer(sock)
        assert status == 422, error
        assert error["errors"][0]["field"] == "text"
        assert "[CLS]" in error["message"]


def test_model_has_a_body_limit_of_its_own(server: Server) -> None:
    """A body over /model's own limit (well under the service's 32 MiB) is refused before it is
    read, and the 413 says what a /model body holds."""
    limit = answer.max_body_bytes(Settings())
    assert limit < Settings().max_body_bytes
    with server.connect() as sock:
        sock.sendall(
            b"POST /model HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {limit + 1}\r\n\r\n".encode()
        )
        status, error = _answer(sock)
    assert status == 413 and f"{limit:,} bytes" in error["message"]
    assert "shorter text" in error["message"]


def test_a_large_model_body_is_parsed_off_the_event_loop(server: Server) -> None:
    """A 17 MB body of expected arrays (parsed on the event loop it stalled every other request
    for seconds) is parsed in the parser process: /healthz keeps answering meanwhile."""
    row = [0.123456789012345] * 384
    body = json.dumps(
        {"model": "minilm", "text": SENTENCE, "expected": {"output": [row] * 2400}}
    ).encode()
    assert 16 << 20 < len(body) < answer.max_body_bytes(Settings())
    with Stalls(server.base) as stalls, server.connect() as sock:
        sock.sendall(_post(body))
        status, error = _answer(sock)
    assert status == 422, error  # 2,400 rows for a 12-token text
    assert stalls.worst < 1.0, stalls.worst


def test_an_unread_model_answer_stays_counted_and_its_reader_is_cut(server: Server) -> None:
    """A ~100-token /model answer (about 1 M numbers, tens of MB of JSON) to a client that reads
    only its first bytes: its memory stays in the budget while it waits (it showed 0 in use),
    the send watch cuts the reader after about send_timeout, the access line says 499
    send_timeout (it said 200 complete), and the memory comes back."""
    request_id = f"unread-model-{time.monotonic_ns()}"
    body = json.dumps({"model": "minilm", "text": SENTENCE * 10}).encode()
    with server.connect(rcvbuf=4096) as sock:
        sock.sendall(_post(body, request_id))
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        in_use = server.gauge("attention_budget_in_use_bytes")
        line = server.access_line(request_id, wait=SEND_TIMEOUT + 20)
    assert in_use > 16 << 20, in_use
    assert (line["status"], line.get("reason"), line["outcome"]) == (
        499,
        "send_timeout",
        "incomplete",
    ), line
    deadline = time.monotonic() + 10
    while server.gauge("attention_budget_in_use_bytes") != 0.0:
        assert time.monotonic() < deadline, "the unread answer's memory was not given back"
        time.sleep(0.1)


@pytest.mark.parametrize("accept", ["application/json", "application/x-safetensors"])
def test_a_client_that_reads_gets_the_whole_model_answer(server: Server, accept: str) -> None:
    """A streamed /model answer, as JSON and as safetensors."""
    body = json.dumps({"model": "minilm", "text": SENTENCE * 10, "layer": 2}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", int(server.base.rsplit(":", 1)[1]), timeout=60)
    headers = {"Content-Type": "application/json", "Accept": accept}
    conn.request("POST", "/model", body, headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    assert r.status == 200
    if accept != "application/json":
        tensors = safetensors.numpy.load(data)
        assert tensors["attention"].shape == (6, 12, 102, 102)
        assert tensors["trace.output"].shape == (102, 384)
        return
    got = json.loads(data)
    n = len(got["tokens"])
    assert n == 102 and len(got["attention"]) == 6 and len(got["attention"][0][0]) == n
    assert len(got["trace"]["output"]) == n
