"""The HTTP/1.1 connection: uvicorn's httptools protocol with the limits and deadlines it lacks.

uvicorn bounds neither a request's head nor the time a request takes to arrive (its keep-alive
timeout starts only after a response), so one client could hold a worker's sockets and event
loop. ``python -m service`` serves with :class:`GuardedProtocol`, which adds, per connection:

- a cap on the head's bytes and header count: **431**, before the excess is buffered;
- a deadline for the head and a minimum rate for the body: **408**, then close;
- a minimum rate for reading the answer: a reader that stalls is disconnected (its memory goes
  back to the budget);
- a cap on open connections per worker: **503** with ``Retry-After`` rather than a failed accept;
- HTTP/1.1's framing rules: exactly one ``Host`` (400), no transfer coding but ``chunked`` (501),
  and HTTP/1.0 answers that are not chunked (RFC 9112 §6.1: they end when the connection does);
- a lingering close: an answer given before the body was read (401, 413, …) is followed by a
  bounded drain of the rest, so clients that upload before reading still see it;
- an answer's head written together with its first body bytes (uvicorn writes them apart): one
  segment and one wake-up of the client instead of two, which small requests notice.

Every refusal has the service's JSON error shape and is logged and counted like any request.
"""

import asyncio
import contextlib
import fcntl
import sys
import termios
import time
import uuid
from dataclasses import replace
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from service.http.answer_writing import Cycle, Http10Cycle, Transport, refusal_bytes
from service.http.connection_limits import Refusal, limits
from service.http.middleware import REFUSED, record

RETRY_AFTER_SECONDS = 2
LINGER_SECONDS = 10.0  # the longest drain after an early answer (bounded by time, as nginx's)
LINGER_IDLE_SECONDS = 1.0  # ... ending sooner when the client sends nothing this long


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing; the refusal is on the protocol."""


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above; pass it as uvicorn's ``http``."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits()
        self.opened = time.monotonic()
        self.in_head = True  # the next bytes belong to a request's head
        self.head_bytes = 0
        self.head_tail = b""  # the head's last bytes, to find its end across reads
        self.header_count = 0
        self.parsed_head_bytes = 0  # this request's head as the parser has read it
        self.hosts = 0  # Host fields in this head
        self.codings = b""  # its Transfer-Encoding values, each after a comma
        self.refusal: Refusal | None = None
        self.deferred: Refusal | None = None  # a pipelined request's, after the answer before it
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.body_bytes = 0
        self.body_mark = (0.0, 0)  # (when, body bytes then): the current window's start
        self.send_timer: asyncio.TimerHandle | None = None
        self.send_mark = (0.0, 0)  # (when, bytes sent then): the send window's start
        self.behind: tuple[float, int] | None = None  # (when, bytes sent) this answer fell behind
        self.lingering = False
        self.linger_until = 0.0
        self.last_read = 0.0

    # the connection
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Refuse beyond the connection cap; otherwise start the head's deadline."""
        if len(self.connections) >= self.limits.max_connections:
            self.transport = transport
            self._answer(
                Refusal(
                    503,
                    "too_many_connections",
                    f"this worker has {self.limits.max_connections:,} open connections, its "
                    f"limit; retry after {RETRY_AFTER_SECONDS} s",
                    linger=False,
                ),
                retry_after=True,
            )
            return
        super().connection_made(Transport(transport, self))  # type: ignore[arg-type]
        self.head_timer = self.loop.call_later(self.limits.header_timeout, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the timers, then uvicorn's own clean-up."""
        for timer in (self.head_timer, self.body_timer, self.send_timer):
            if timer is not None:
                timer.cancel()
        if self.flow is None:  # refused at connection_made: uvicorn's state was never set up
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Count the head's bytes before the parser sees them; drain while lingering."""
        self._unset_keepalive_if_required()
        self.last_read = time.monotonic()
        if self.lingering:
            if self.last_read > self.linger_until:
                self._transport().close()
            return
        if self.in_head:
            if self.head_timer is None:  # the first bytes of a keep-alive connection's next head
                self.head_timer = self.loop.call_later(self.limits.header_timeout, self._head_late)
            found = data.find(b"\r\n\r\n")
            end = found + 4 if found >= 0 else None  # how much of ``data`` is head
            if self.head_tail and found != 0:  # the blank line may straddle the previous read
                straddled = (self.head_tail + data[:3]).find(b"\r\n\r\n")
                end = straddled + 4 - len(self.head_tail) if straddled >= 0 else end
            self.head_bytes += len(data) if end is None else end
            if self.head_bytes > self.limits.max_header_bytes:
                self._answer(self._head_too_large())
                return
            self.head_tail = (self.head_tail + data[-3:])[-3:] if end is None else b""
        else:
            self.body_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no upgrades (h2c; WebSocket is off in service.__main__): answered as HTTP/1.1
        except httptools.HttpParserError:
            refusal = self.refusal or Refusal(
                400, "http_invalid", "the request is not valid HTTP/1.1", linger=False
            )
            if self.in_head and self.cycle is not None and not self.cycle.response_complete:
                # a pipelined request, refused while the one before it is still answered: its
                # refusal follows that answer (on_response_complete), and nothing more is read
                self.deferred = refusal
                self.flow.pause_reading()
                return
            self._answer(refusal)
            return
        cycle = self.cycle
        if not self.in_head and cycle is not None and cycle.more_body and self.body_timer is None:
            self.body_mark = (time.monotonic(), self.body_bytes)
            self.body_timer = self.loop.call_later(self.limits.body_timeout, self._body_check)

    # parser callbacks
    def on_message_begin(self) -> None:
        """A new request: its head is counted afresh."""
        HttpToolsProtocol.on_message_begin(self)
        self.header_count = self.hosts = self.parsed_head_bytes = 0
        self.codings = b""

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url) + 16)  # the request line: method, target, version
        super().on_url(url)

    def _count_head(self, size: int) -> None:
        """The head as the parser reads it, request by request: a pipelined request's head
        arrives in the read that ends the one before, where data_received does not count it."""
        self.parsed_head_bytes += size
        if self.parsed_head_bytes > self.limits.max_header_bytes:
            self.refusal = self._head_too_large()
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        """Keep the header (as uvicorn does), counting the fields and noting Host and
        Transfer-Encoding for the framing rules."""
        self.header_count += 1
        self._count_head(len(name) + len(value) + 4)
        if self.header_count > self.limits.max_headers:
            self.refusal = Refusal(
                431,
                "headers_too_large",
                f"the request has more than {self.limits.max_headers} header fields",
            )
            raise _Refused
        name = name.lower()
        if name == b"host":
            self.hosts += 1
        elif name == b"transfer-encoding":
            self.codings += b"," + value
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        """HTTP/1.1's framing rules, then uvicorn starts the request."""
        self.in_head = False
        self.head_bytes, self.head_tail = 0, b""
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        self.body_bytes = 0
        version = self.parser.get_http_version()
        if version not in ("1.0", "1.1"):
            self.refusal = Refusal(
                505,
                "http_version_unsupported",
                f"this service speaks HTTP/1.1 (and 1.0), not HTTP/{version}",
            )
            self.scope["method"] = self.parser.get_method().decode("ascii", "replace")
            raise _Refused
        if self.hosts > 1 or (self.hosts == 0 and version != "1.0"):
            self.refusal = Refusal(
                400, "host_invalid", "an HTTP/1.1 request needs exactly one Host header"
            )
            self.scope["method"] = self.parser.get_method().decode("ascii", "replace")  # the log
            raise _Refused
        if self.codings and [c.strip().lower() for c in self.codings.split(b",")[1:]] != [
            b"chunked"
        ]:
            self.refusal = Refusal(
                501,
                "transfer_coding_unsupported",
                "the only transfer coding this service reads is chunked; send the body "
                "uncompressed",
            )
            self.scope["method"] = self.parser.get_method().decode("ascii", "replace")
            raise _Refused
        super().on_headers_complete()
        if self.cycle is not None:  # the same cycle, head and body written together
            self.cycle.__class__ = Http10Cycle if version == "1.0" else Cycle

    def on_message_complete(self) -> None:
        """The request is all here: its body deadline ends, the next head may begin."""
        HttpToolsProtocol.on_message_complete(self)
        self.in_head = True
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None

    def on_response_complete(self) -> None:
        """An answer has gone out. If its request's body is still arriving (answered early: a
        ``GET /healthz`` declaring a body, a refusal before reading), end the connection with a
        bounded drain: once the answer is out no body deadline watches the rest, and a client
        trickling it a byte at a time would otherwise hold the socket for ever (each byte also
        restarts the keep-alive timer)."""
        super().on_response_complete()
        self.behind = None  # the next answer's reader starts afresh
        if self.deferred is not None:
            refusal, self.deferred = self.deferred, None
            self._answer(replace(refusal, linger=False))
            return
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.lingering:
            return
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        if not self._start_linger():
            self._transport().close()

    # answers and deadlines
    def _transport(self) -> asyncio.Transport:
        """The socket's own transport (not the lingering wrapper)."""
        t = self.transport
        return t.real if isinstance(t, Transport) else t

    def _answer(self, refusal: Refusal, retry_after: bool = False) -> None:
        """Write ``refusal`` as a JSON error with ``Connection: close``, log and count it, and
        close (after a lingering drain when it asks for one)."""
        cycle = self.cycle
        routed = cycle is not None and not cycle.response_complete  # the app has its request
        state = cycle.scope["state"] if cycle is not None and routed else {}
        request_id = str(state.get("request_id") or uuid.uuid4().hex)
        headers = self.server_state.default_headers
        retry = RETRY_AFTER_SECONDS if retry_after else None
        head, body = refusal_bytes(refusal, headers, request_id, retry)
        transport = self._transport()
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            transport.abort()  # an answer is going out (pipelining): no room for another
            return
        if not transport.is_closing():
            transport.write(head + body)
        if cycle is not None and routed:  # the app's access line says 408 …
            state[REFUSED] = (refusal.status, refusal.kind, len(body))
            cycle.disconnected = True  # … and its app stops reading and writing
            cycle.message_event.set()
        else:
            record(
                request_id=request_id,
                method=self.scope["method"] if self.scope and "method" in self.scope else "-",
                path=self.scope.get("path", "-") if self.scope else "-",
                endpoint="unmatched",
                status=refusal.status,
                seconds=time.monotonic() - self.opened,
                bytes_in=0,
                bytes_out=len(body),
                outcome="complete",
                reason=refusal.kind,
            )
        if not (refusal.linger and self._start_linger()):
            transport.close()

    def _head_too_large(self) -> Refusal:
        return Refusal(
            431,
            "headers_too_large",
            f"the request's head is larger than this service's limit of "
            f"{self.limits.max_header_bytes:,} bytes",
        )

    def _head_late(self) -> None:
        """The head's deadline: 408 unless it is complete."""
        self.head_timer = None
        if self.in_head and not self._transport().is_closing() and not self.lingering:
            seconds = self.limits.header_timeout
            self._answer(
                Refusal(
                    408,
                    "header_timeout",
                    f"the request's headers did not arrive within {seconds:g} s",
                    linger=False,
                )
            )

    def _body_check(self) -> None:
        """The end of a body window: 408 unless the body came at the minimum rate."""
        self.body_timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body or cycle.response_complete or self.lingering:
            return
        now = time.monotonic()
        since, then = self.body_mark
        if not self.flow.read_paused:  # (paused: the app is not reading; not the client's fault)
            needed = max(1, int(self.limits.min_rate * (now - since)))
            if self.body_bytes - then < needed:
                self._answer(
                    Refusal(
                        408,
                        "body_timeout",
                        f"the request body arrived slower than {self.limits.min_rate:,} bytes/s "
                        f"over {self.limits.body_timeout:g} s",
                        linger=False,
                    )
                )
                return
        self.body_mark = (now, self.body_bytes)
        self.body_timer = self.loop.call_later(self.limits.body_timeout, self._body_check)

    def pause_writing(self) -> None:
        """The client reads slower than the answer is written: watch what it reads, from now
        on for this answer, and over each window."""
        super().pause_writing()
        now = time.monotonic()
        if self.behind is None:
            self.behind = (now, self._sent())
        elif now - self.behind[0] > self.limits.answer_timeout:
            self._cut_reader("answer_timeout")
            return
        if self.send_timer is None:
            self.send_mark = (now, self._sent())
            self.send_timer = self.loop.call_later(self.limits.send_timeout, self._send_check)

    def resume_writing(self) -> None:
        """The client caught up."""
        super().resume_writing()
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def _sent(self) -> int:
        """Bytes of this connection's answers that have left for the client: those written,
        less those still waiting in the transport's buffer and in the kernel's send queue. The
        transport's buffer alone drains in bursts (the kernel wakes a writer only once a good
        part of its queue of megabytes is free), and the client's window opens a segment or
        more at a time: a reader well above the minimum rate can show nothing for seconds."""
        transport = self._transport()
        waiting = transport.get_write_buffer_size()
        sock = transport.get_extra_info("socket")
        if sock is not None and hasattr(termios, "TIOCOUTQ"):
            with contextlib.suppress(OSError, ValueError):
                queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
                waiting += int.from_bytes(queued, sys.byteorder, signed=True)
        written = self.transport.written if isinstance(self.transport, Transport) else 0
        return written - waiting

    def _send_check(self) -> None:
        """The end of a send window while the answer waits for its reader: disconnect a reader
        that has read nothing since it fell behind, or less than the minimum rate on average
        (with one window of grace: the client's window opens in steps of many kilobytes), or
        that has been behind longer than the answer timeout. Its answer stops, and its memory
        goes back."""
        self.send_timer = None
        if not self.flow.write_paused or self.behind is None:
            return
        now, sent = time.monotonic(), self._sent()
        behind_at, sent_then = self.behind
        owed = self.limits.min_rate * (now - behind_at - self.limits.send_timeout)
        if sent == sent_then or sent - sent_then < owed:
            self._cut_reader("send_timeout")
            return
        if now - behind_at > self.limits.answer_timeout:
            self._cut_reader("answer_timeout")
            return
        self.send_mark = (now, sent)
        self.send_timer = self.loop.call_later(self.limits.send_timeout, self._send_check)

    def _cut_reader(self, reason: str) -> None:
        """Disconnect a client that reads its answer too slowly (its answer stops, and its
        memory goes back): logged as 499 with ``reason``."""
        if self.cycle is not None:
            self.cycle.scope["state"]["reason"] = reason
        self._transport().abort()

    # the lingering close
    def linger(self) -> bool:
        """Called for every close: linger (and say so) when the client is still sending the
        body of a request that has been answered."""
        if self.lingering:
            return False  # closing for good
        cycle = self.cycle
        if cycle is None or not cycle.more_body or self.parser is None:
            return False
        return self._start_linger()

    def _start_linger(self) -> bool:
        """Half-close (the answer is complete), then read and drop what the client still
        sends, for at most LINGER_SECONDS (a client that uploads before reading then sees the
        answer, whatever its body's size)."""
        transport = self._transport()
        if transport.is_closing() or not transport.can_write_eof():
            return False
        self.lingering = True
        self.linger_until = time.monotonic() + LINGER_SECONDS
        transport.write_eof()
        if self.flow is not None:
            self.flow.resume_reading()
        self.loop.call_later(LINGER_IDLE_SECONDS, self._linger_check)
        return True

    def _linger_check(self) -> None:
        now = time.monotonic()
        transport = self._transport()
        if transport.is_closing():
            return
        if now - self.last_read >= LINGER_IDLE_SECONDS or now > self.linger_until:
            transport.close()
        else:
            self.loop.call_later(LINGER_IDLE_SECONDS, self._linger_check)
