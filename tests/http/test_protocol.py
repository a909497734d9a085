"""service.http.connection's GuardedProtocol in process, on a transport that records its writes:
an answer's head goes out in the same write as its first body bytes when they are few (one
segment, one wake-up of the client), alone before a large first chunk or for HEAD."""

import asyncio
import json
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from service.config import Settings
from service.http.answer_writing import COALESCE_BYTES
from service.http.app import create_app
from service.http.connection import GuardedProtocol
from service.wire.examples import I_AM_BATMAN


class Recorder(asyncio.Transport):
    """A transport that keeps every write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _served(request: bytes, done: bytes) -> list[bytes]:
    """Feed ``request`` to a GuardedProtocol; the writes once they end with ``done``."""
    config = Config(app=create_app(Settings()), http=GuardedProtocol, log_config=None)
    config.load()
    protocol = GuardedProtocol(config=config, server_state=ServerState(), app_state={})
    transport = Recorder()
    protocol.connection_made(transport)
    protocol.data_received(request)
    for _ in range(500):
        if b"".join(transport.writes).endswith(done):
            break
        await asyncio.sleep(0.01)
    protocol.connection_lost(None)
    return transport.writes


def _post(body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = f"POST /attention HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    return head.encode() + data


def test_a_small_answer_is_one_write_of_head_and_body() -> None:
    writes = asyncio.run(_served(_post(I_AM_BATMAN), b"}"))
    assert len(writes) == 1, [w[:40] for w in writes]
    head, _, body = writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"content-length: %d" % len(body) in head
    assert json.loads(body)["weights"]


def test_a_large_first_chunk_is_not_copied_to_join_the_head() -> None:
    """Above COALESCE_BYTES the head goes out alone and the chunk as it is."""
    body = {"seed": 0, "seq_len": 600, "d_model": 8, "d_k": 8}  # streamed, 1 MB chunks
    writes = asyncio.run(_served(_post(body), b"0\r\n\r\n"))
    assert writes[0].startswith(b"HTTP/1.1 200 OK") and writes[0].endswith(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in writes[0]
    assert len(writes[1]) > COALESCE_BYTES
    assert b'"weights":[[' in b"".join(writes[1:])


@pytest.mark.parametrize("method", ["HEAD", "GET"])
def test_healthz_head_has_no_body_and_get_one_write(method: str) -> None:
    request = f"{method} /healthz HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    done = b"\r\n\r\n" if method == "HEAD" else b"}"
    writes = asyncio.run(_served(request, done))
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 OK")
    assert writes[0].endswith(b"\r\n\r\n") == (method == "HEAD")
