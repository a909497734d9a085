"""Pure ASGI middleware around every HTTP request: the answers given before any body byte is
read (404, 405, 401, 415, 406, 413, relative trailing-slash redirects), the body limit (enforced
while the body streams in), the X-Request-ID, one JSON access log line, the Prometheus
metrics, and the compression of JSON answers sent in one piece that no one compressed before
(GET /models, /openapi.json, errors: :func:`_coding`; the compute endpoints compress their own
answers off the event loop, service.http.routes). Once a compute endpoint's body is read, it is answered from here directly
(service.http.routes.DIRECT): every check FastAPI's router would make is made already."""

import asyncio
import logging
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence

from starlette._utils import get_route_path
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.http import metrics
from service.http.auth import key_problem
from service.wire.compress import MIN_BYTES, compressed
from service.wire.errors import CLIENT_CLOSED, ErrorItem, error_response, excerpt
from service.wire.media import JSON_TYPE, MEDIA_TYPE, Coding, body_form, content_coding, negotiate

access_log = logging.getLogger("service.access")
failure_log = logging.getLogger("service.errors")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_WITH_BODY = {"POST", "PUT", "PATCH"}


CUT = 503  # logged for an answer the server's stop cut off (with "outcome": "cut")
REFUSED = "refused"  # scope["state"] key: (status, reason, bytes) when the connection answered
GONE = "gone"  # scope["state"] key: the client left before its answer was written (499)


class _TooLarge(Exception):
    def __init__(self, limit: int, advice: str) -> None:
        self.limit = limit
        self.advice = advice


BODY_ADVICE = "send smaller matrices or split a batch"  # what to change over the body limit


def _mark_cut() -> None:
    """Leave a mark for `python -m service`, which then exits 1: some answer was cut."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        with open(os.path.join(folder, f"cut-{os.getpid()}"), "a") as f:
            f.write("cut\n")


def record(
    *,
    request_id: str,
    method: str,
    path: str,
    endpoint: str,
    status: int,
    seconds: float,
    bytes_in: int,
    bytes_out: int,
    outcome: str,
    reason: str | None = None,
) -> None:
    """One request done: its metrics and its access log line (also for the answers the
    connection gives itself: service.http.connection)."""
    metrics.observe(method, endpoint, status, seconds, bytes_in, bytes_out)
    if not access_log.isEnabledFor(logging.INFO):
        return
    fields = {
        "request_id": request_id,
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": round(seconds * 1000, 3),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "outcome": outcome,
        **({"reason": reason} if reason else {}),
    }
    # made directly: Logger.info would look up the calling frame, which the line never shows
    line = access_log.makeRecord(access_log.name, logging.INFO, __file__, 0, "request", (), None)
    line.__dict__.update(fields)
    access_log.handle(line)


def _early(status: int, kind: str, message: str, headers: dict[str, str]) -> Response:
    """An answer given before the body is read."""
    response = error_response(status, [ErrorItem(field=None, message=message, type=kind)])
    response.headers.update(headers)
    return response


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


class RequestMiddleware:
    """Wraps the app; see the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        routes: Sequence[BaseRoute] = (),
        json_paths: frozenset[str] = frozenset(),
        keyed_paths: frozenset[str] = frozenset(),
        api_keys: Sequence[str] = (),
        direct: Mapping[str, ASGIApp] | None = None,
        body_limits: Mapping[str, tuple[int, str]] | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        # route path -> a body limit of its own (below max_body_bytes) and what to change
        self.body_limits = dict(body_limits or {})
        self.routes = routes  # the app's routes, matched here before the body is read
        self.json_paths = json_paths  # take JSON or safetensors (415, 406 for other types)
        self.keyed_paths = keyed_paths  # need an API key when keys are configured
        self.api_keys = list(api_keys)
        self.direct = dict(direct or {})  # POST route path -> its app, called past the router
        self._known: dict[tuple[str, str], str] = {}  # (method, route path) -> matched route

    def _route(self, scope: Scope) -> tuple[str | None, Response | None]:
        """The matched route's path (None: none) and the answer when the request cannot be
        served as it is (404, 405 with Allow, 308 to the path with or without its slash)."""
        path, method = get_route_path(scope), scope["method"]
        known = self._known.get((method, path))
        if known is not None:
            return known, None
        partial: BaseRoute | None = None
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                found = str(getattr(route, "path", ""))
                if not isinstance(route, Mount):  # mounts match unbounded paths: not cached
                    self._known[(method, path)] = found
                return found, None
            if match is Match.PARTIAL and partial is None:
                partial = route
        if partial is not None:
            allowed = sorted(getattr(partial, "methods", None) or ())
            allowed += ["HEAD"] if "GET" in allowed and "HEAD" not in allowed else []
            message = f"{path} does not take {method}; it takes {', '.join(allowed)}"
            headers = {"Allow": ", ".join(allowed)}
            return str(getattr(partial, "path", "")), _early(
                405, "method_not_allowed", message, headers
            )
        other = path[:-1] if path.endswith("/") and len(path) > 1 else path + "/"
        moved = {**scope, "path": scope.get("root_path", "") + other}
        if any(route.matches(moved)[0] is not Match.NONE for route in self.routes):
            query = scope.get("query_string", b"").decode("latin-1")
            location = (
                scope.get("root_path", "").rstrip("/") + other + (f"?{query}" if query else "")
            )
            return None, _early(308, "moved", f"this endpoint is {other}", {"Location": location})
        return None, _early(404, "not_found", f"there is no endpoint {path[:100]}", {})

    def _refused(self, scope: Scope, headers: dict[bytes, bytes]) -> Response | None:
        """401, 415 or 406 before the body is read (the route needs a key, or takes a body as
        JSON or safetensors and answers in one of them)."""
        path = get_route_path(scope)
        if path in self.keyed_paths:
            problem = key_problem(
                headers.get(b"x-api-key", b"").decode("latin-1") or None,
                headers.get(b"authorization", b"").decode("latin-1") or None,
                self.api_keys,
            )
            if problem:
                return _early(401, "unauthorized", problem, {"WWW-Authenticate": "Bearer"})
        if path in self.json_paths:
            given = headers.get(b"content-type", b"").decode("latin-1")
            if body_form(given) is None:
                media = _media_type(given)
                shown = f"Content-Type {media[:60]}" if media else "no Content-Type"
                return _early(
                    415,
                    "unsupported_media_type",
                    f"the body must be JSON sent with Content-Type: application/json, or "
                    f"safetensors with Content-Type: {MEDIA_TYPE} (this request has {shown}; "
                    "curl needs -H 'Content-Type: application/json')",
                    {},
                )
            accept = headers.get(b"accept", b"").decode("latin-1")
            if negotiate(accept) is None:
                return _early(
                    406,
                    "not_acceptable",
                    f"this endpoint answers application/json or {MEDIA_TYPE}, and the Accept "
                    f"header ({excerpt(accept, 60)}) names neither",
                    {"Vary": "Accept"},
                )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        headers = dict(scope["headers"])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        method = scope["method"]
        status, bytes_in, bytes_out = 500, 0, 0
        complete = False  # the last body message has been handed to the server
        started = False  # the answer's head has been handed to the server
        cut = False  # the server stopped before the answer was complete

        async def send_with_id(message: Message) -> None:
            nonlocal status, bytes_out, complete, started
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode()),
                ]
            elif message["type"] == "http.response.body":
                bytes_out += len(message.get("body", b""))
            await send(message)

        coding = content_coding(headers.get(b"accept-encoding", b"").decode("latin-1"))
        sender = send_with_id if coding is None else _coding(send_with_id, coding)
        endpoint, early = self._route(scope)
        if method == "HEAD" and early is not None and early.status_code == 405:
            scope = {**scope, "method": "GET"}  # HEAD is GET without the body (the server drops it)
            endpoint, early = self._route(scope)
        early = early or self._refused(scope, headers)
        try:
            if early is not None:
                if b"content-length" in headers or b"transfer-encoding" in headers:
                    early.headers["Connection"] = "close"  # its body is not read
                await early(scope, receive, sender)
                return
            if method in _WITH_BODY:
                limit = self.body_limits.get(endpoint or "", (self.max_body_bytes, BODY_ADVICE))
                body = await self._read_body(headers, receive, *limit)
                if body is None:  # the client went away during its upload: not our error
                    status, reason, bytes_out = state.get(REFUSED, (CLIENT_CLOSED, None, 0))
                    if reason:
                        state["reason"] = reason
                    return
                bytes_in = len(body)
                receive = _replay(body, receive)
                del body  # the replay holds it until the app takes it
            handler = self.direct.get(endpoint or "") if method == "POST" else None
            await (handler or self.app)(scope, receive, sender)
        except asyncio.CancelledError:  # the stop's grace period ran out mid-answer
            cut = True
            _mark_cut()
            raise
        except _TooLarge as too_large:
            item = ErrorItem(
                field=None,
                message="the request body is larger than this service's limit of "
                f"{too_large.limit:,} bytes; {too_large.advice}",
                type="body_too_large",
                limit=too_large.limit,
            )
            response = error_response(413, [item])
            response.headers["Connection"] = "close"  # the rest of the body is not read
            await response(scope, receive, sender)
        except Exception:
            if started:  # the answer is under way: uvicorn closes the connection
                raise
            # a defect, never a refusal: still the one error shape with the request's id (not
            # uvicorn's plain-text 500), and its traceback in the log
            failure_log.exception("unhandled error in request %s", request_id)
            item = ErrorItem(
                field=None,
                message=f"the service failed on this request (request id {request_id}); this is "
                "a defect of the service, not of the request: please report it with the id",
                type="internal_error",
            )
            await error_response(500, [item])(scope, receive, sender)
        finally:
            if cut:
                status = CUT
            elif state.get(GONE) or (status < 400 and bytes_out and not complete):
                status = CLIENT_CLOSED  # the client left before its answer was all written
                complete = False
            record(
                request_id=request_id,
                method=method,
                path=scope["path"],
                endpoint=endpoint or "unmatched",
                status=status,
                seconds=time.perf_counter() - start,
                bytes_in=bytes_in,
                bytes_out=bytes_out,
                outcome="cut" if cut else "complete" if complete else "incomplete",
                reason=state.get("reason"),
            )

    async def _read_body(
        self, headers: dict[bytes, bytes], receive: Receive, limit: int, advice: str
    ) -> bytes | None:
        """The whole body, refusing it as soon as it passes ``limit`` (declared or streamed)."""
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            raise _TooLarge(limit, advice)
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
                raise _TooLarge(limit, advice)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _coding(send: Send, coding: Coding) -> Send:
    """``send`` with a JSON answer given in one body message compressed as ``coding`` when it
    has MIN_BYTES (its Content-Length, Content-Encoding and Vary set to match). Any other
    answer passes as it is: not JSON, coded already, or streamed (more than one message)."""
    start: Message | None = None

    async def coding_send(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start" and _plain_json(message["headers"]):
            start = message  # held until the body shows whether it comes in one piece
            return
        if start is None or message["type"] != "http.response.body":
            await send(message)
            return
        head, start = start, None
        body = message.get("body", b"")
        if not message.get("more_body", False) and len(body) >= MIN_BYTES:
            body = compressed(coding, body)
            head = {**head, "headers": _coded_headers(head["headers"], coding, len(body))}
            message = {**message, "body": body}
        await send(head)
        await send(message)

    return coding_send


def _plain_json(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """Whether an answer's headers say JSON with no content coding yet."""
    named = {name.lower(): value for name, value in headers}
    media = named.get(b"content-type", b"").decode("latin-1")
    return _media_type(media) == JSON_TYPE and b"content-encoding" not in named


def _coded_headers(
    headers: Sequence[tuple[bytes, bytes]], coding: Coding, length: int
) -> list[tuple[bytes, bytes]]:
    """``headers`` for the answer compressed as ``coding``: its length, its coding, and
    Accept-Encoding added to its Vary."""
    vary = [value for name, value in headers if name.lower() == b"vary"]
    kept = [(n, v) for n, v in headers if n.lower() not in (b"content-length", b"vary")]
    return [
        *kept,
        (b"content-length", str(length).encode()),
        (b"content-encoding", coding.encode()),
        (b"vary", b", ".join([*vary, b"Accept-Encoding"])),
    ]


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then the real channel; it keeps
    no reference to the body once handed over (a large one's memory goes back once the app
    has parsed it)."""
    held = [body]

    async def replay() -> Message:
        if held:
            return {"type": "http.request", "body": held.pop(), "more_body": False}
        return await receive()

    return replay
