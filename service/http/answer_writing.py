"""How an answer goes onto a guarded connection's socket (service.http.connection): the
transport the request cycles write to, and uvicorn's request cycle writing an answer's head with
its first body bytes, or framing it for HTTP/1.0."""

import asyncio
import http
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from service.http.connection_limits import Refusal
from service.http.middleware import GONE
from service.wire.errors import ErrorItem, error_json


class Lingering(Protocol):
    """The protocol side a transport asks before closing."""

    def linger(self) -> bool:
        """Start a lingering close instead, when the client is still sending (True)."""


class Transport:
    """The socket's transport as the protocol's request cycles see it: closing it while the
    request body is still arriving starts a lingering close instead (see GuardedProtocol)."""

    def __init__(self, transport: asyncio.Transport, protocol: Lingering) -> None:
        self.real = transport
        self.protocol = protocol
        self._write = transport.write  # called for every answer: bound once, not looked up
        self.written = 0  # bytes of answers written, for the reader's rate
        self.is_closing = transport.is_closing

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self._write(data)

    def close(self) -> None:
        """Close, or linger first when the client is still sending its body."""
        if not self.protocol.linger():
            self.real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)  # is_closing, pause_reading, get_extra_info, …


COALESCE_BYTES = 64 * 1024  # a first body piece up to this size goes out in the head's write


class Cycle(RequestResponseCycle):
    """uvicorn's request/response cycle, writing an answer's head together with its first
    body bytes when they are few: one write (one segment on the wire, one wake-up of the
    client) instead of two."""

    head: bytes | None = None

    async def send(self, message: Any) -> None:
        """Hold the head that uvicorn writes for ``http.response.start``; put it in front of
        the first body bytes (or write it alone first when the message brings none, as for
        HEAD, or more than COALESCE_BYTES)."""
        if self.disconnected:  # the client has gone: nothing is written (as uvicorn's send
            self.scope["state"][GONE] = True  # drops it), and the access line says 499
            return
        transport: Any = self.transport
        real_write = transport.write
        if message["type"] == "http.response.start":
            held: list[bytes] = []
            transport.write = held.append
            try:
                await super().send(message)
            finally:
                transport.write = real_write
            self.head = b"".join(held)
            return
        head, self.head = self.head, None
        if head is None:
            await super().send(message)
            return
        if (
            not 0 < len(message.get("body", b"")) <= COALESCE_BYTES
            or self.scope["method"] == "HEAD"
        ):
            real_write(head)  # alone: nothing to join it to, or too much to copy for it
            await super().send(message)
            return

        def write(data: bytes) -> None:
            nonlocal head
            real_write(head + data if head else data)
            head = None

        transport.write = write
        try:
            await super().send(message)
        finally:
            transport.write = real_write
        if head:  # uvicorn wrote nothing after all
            real_write(head)


class Http10Cycle(Cycle):
    """A request/response cycle for an HTTP/1.0 client: an answer of unknown length is sent as
    it is and ends with the connection (HTTP/1.0 has no chunked coding)."""

    close_delimited = False

    async def send(self, message: Any) -> None:
        """Frame the answer for HTTP/1.0, then let uvicorn's cycle write it."""
        if message["type"] == "http.response.start":
            names = {name.lower() for name, _ in message.get("headers", [])}
            if b"content-length" not in names and self.scope["method"] != "HEAD":
                self.close_delimited = True
                self.keep_alive = False
                self.chunked_encoding = False  # uvicorn then adds no transfer-encoding
        elif message["type"] == "http.response.body" and self.close_delimited:
            size = len(message.get("body", b""))  # uvicorn counts down a length: give it one
            self.expected_content_length = size + (1 if message.get("more_body") else 0)
        await super().send(message)


def refusal_bytes(
    refusal: Refusal,
    default_headers: list[tuple[bytes, bytes]],
    request_id: str,
    retry_after: int | None,
) -> tuple[bytes, bytes]:
    """A refusal's head and JSON error body, with ``Connection: close`` (and ``Retry-After``
    when given), written by the connection itself, past the app."""
    body = error_json([ErrorItem(field=None, message=refusal.message, type=refusal.kind)])
    head = [
        f"HTTP/1.1 {refusal.status} {http.HTTPStatus(refusal.status).phrase}\r\n".encode(),
        *(name + b": " + value + b"\r\n" for name, value in default_headers),
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
        b"x-request-id: " + request_id.encode() + b"\r\n",
        b"retry-after: %d\r\n" % retry_after if retry_after is not None else b"",
        b"\r\n",
    ]
    return b"".join(head), body
