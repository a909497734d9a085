"""Pure ASGI middleware around every HTTP request: the body limit (enforced while the body
streams in), the X-Request-ID, one JSON access log line, and the Prometheus metrics."""

import asyncio
import logging
import os
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api import metrics
from service.api.errors import CLIENT_CLOSED, ErrorItem, error_response

access_log = logging.getLogger("service.access")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_WITH_BODY = {"POST", "PUT", "PATCH"}


CUT = 503  # logged for an answer the server's stop cut off (with "outcome": "cut")


class _TooLarge(Exception):
    pass


def _mark_cut() -> None:
    """Leave a mark for `python -m service`, which then exits 1: some answer was cut."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        with open(os.path.join(folder, f"cut-{os.getpid()}"), "a") as f:
            f.write("cut\n")


class RequestMiddleware:
    """Wraps the app; see the module docstring."""

    def __init__(
        self, app: ASGIApp, max_body_bytes: int, paths: frozenset[str] = frozenset()
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.paths = paths  # known endpoints, to label requests refused before routing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        headers = dict(scope["headers"])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        status, bytes_in, bytes_out = 500, 0, 0
        complete = False  # the last body message has been handed to the server
        cut = False  # the server stopped before the answer was complete

        async def send_with_id(message: Message) -> None:
            nonlocal status, bytes_out, complete
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode()),
                ]
            elif message["type"] == "http.response.body":
                bytes_out += len(message.get("body", b""))
            await send(message)

        try:
            if scope["method"] in _WITH_BODY:
                body = await self._read_body(headers, receive)
                if body is None:  # the client went away during its upload: not our error
                    status = CLIENT_CLOSED
                    return
                bytes_in = len(body)
                receive = _replay(body, receive)
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:  # the stop's grace period ran out mid-answer
            cut = True
            _mark_cut()
            raise
        except _TooLarge:
            limit = self.max_body_bytes
            item = ErrorItem(
                field=None,
                message=f"the request body is larger than this service's limit of {limit:,} bytes; "
                "send smaller matrices or split a batch",
                type="body_too_large",
                limit=limit,
            )
            await error_response(413, [item])(scope, receive, send_with_id)
        finally:
            if cut:
                status = CUT
            elif status < 400 and bytes_out and not complete:  # the client left mid-answer
                status = CLIENT_CLOSED
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or (
                scope["path"] if scope["path"] in self.paths else "unmatched"
            )
            seconds = time.perf_counter() - start
            metrics.observe(scope["method"], endpoint, status, seconds, bytes_in, bytes_out)
            access_log.info(
                "request",
                extra={
                    "request_id": request_id,
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round(seconds * 1000, 3),
                    "bytes_in": bytes_in,
                    "bytes_out": bytes_out,
                    "outcome": "cut" if cut else "complete" if complete else "incomplete",
                    **({"reason": reason} if (reason := scope["state"].get("reason")) else {}),
                },
            )

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes | None:
        """The whole body, refusing it as soon as it passes the limit (declared or streamed)."""
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _TooLarge
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then the real channel."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
