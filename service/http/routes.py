"""The endpoints that compute, over HTTP: one per row of :data:`DOORS` — the compute endpoints
of :data:`service.trace.ENDPOINTS` and POST /model (service.models.answer) — all answered by
the one path below, so that every protection holds for each of them.

A POST to one of them is answered by :data:`DIRECT`, called by the middleware
(service.http.middleware) once it has made every check FastAPI's router would make and read the
body. The routes on :data:`router` are generated from the compute endpoints' table (service.http.models
declares /model's): they give /docs and openapi.json the endpoint, and the middleware's route
matching (404, 405) its paths; a POST never reaches them.

An answer: parse the body (service.wire.parse: JSON or safetensors), admit it (the door's
``admit``: service.trace.admit's rules and limits, or /model's rules that need no model; then
its ``ready``, in a thread, where a trained model is loaded and the text tokenized), wait for
the memory budget (service.http.budget) unless it is small, run it and encode it as JSON
(service.wire.json_out; compressed as the client's Accept-Encoding allows, service.wire.compress)
or safetensors (service.wire.safetensors_out). Where each stage runs depends on the sizes, so that
fixed costs never dominate a small answer and a large one never stalls the event loop:

- the body is parsed on the event loop up to INLINE_BODY_BYTES, in a thread up to
  THREAD_BODY_BYTES, and in a parser process above (service.http.parser);
- an answer of up to INLINE_NUMBERS numbers is computed and encoded on the event loop (its last
  byte awaited as a whole answer's is, when it is larger than the socket takes at once); up to
  WHOLE_NUMBERS (when its encoded bytes fit the memory budget as well), in one thread hop and
  sent in one piece, its memory counted until it has left the process; above, computed in a
  thread and streamed straight from the arrays as it is encoded, each output's memory given
  back once it is written.
"""

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.openapi.models import Example
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from service.config import Settings
from service.http.budget import (
    BASE_COST,
    Budget,
    Ticket,
    cost_bytes,
    held_bytes,
    whole_cost_bytes,
)
from service.http.doors import DOORS, Answerable, Door, checked
from service.trace import ENDPOINTS, ComputeEndpoint
from service.wire.compress import MIN_BYTES, STATE_BYTES, compressed, compressing
from service.wire.errors import ClientGone, ErrorBody, error_answer
from service.wire.json_out import encode, encode_whole
from service.wire.media import (
    JSON_TYPE,
    MEDIA_TYPE,
    Coding,
    Format,
    body_form,
    content_coding,
    negotiate,
)
from service.wire.safetensors_out import encode_safetensors

INLINE_BODY_BYTES = 16 * 1024  # parse on the event loop below this
THREAD_BODY_BYTES = 1 << 20  # parse in a thread below this (orjson holds the GIL ≲ 3 ms); above
# it, in a parser process
VARY = {"Vary": "Accept, Accept-Encoding"}  # the answer's form and coding depend on them (caches)
INLINE_NUMBERS = 20_000  # draw, compute and serialise on the event loop below this many numbers
WHOLE_NUMBERS = 1 << 20  # computed and encoded in one thread hop below this, sent in one piece
# (≲ 26 MB of JSON, counted in the budget); larger answers stream out as they are encoded

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The body is not valid JSON"},
    401: {
        "model": ErrorBody,
        "description": "An API key is configured and the request has none, or a wrong one",
    },
    404: {"model": ErrorBody, "description": "No such endpoint (answered before the body is read)"},
    405: {"model": ErrorBody, "description": "The endpoint takes POST (see the Allow header)"},
    408: {
        "model": ErrorBody,
        "description": "The headers or the body arrived too slowly; the connection is closed",
    },
    406: {
        "model": ErrorBody,
        "description": f"The Accept header names neither {JSON_TYPE} nor {MEDIA_TYPE}",
    },
    413: {
        "model": ErrorBody,
        "description": "The body, a size, the result, or the memory the request needs is over "
        "a configured limit",
    },
    415: {
        "model": ErrorBody,
        "description": f"The body is sent neither as JSON (Content-Type: {JSON_TYPE}) nor as "
        f"safetensors ({MEDIA_TYPE})",
    },
    422: {"model": ErrorBody, "description": "The request is JSON but does not fit the contract"},
    431: {"model": ErrorBody, "description": "The request's headers are over the limits"},
    503: {
        "model": ErrorBody,
        "description": "The worker's memory is taken and the request could not wait; retry "
        "after the Retry-After header's seconds",
        "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}},
    },
}


_BINARY: dict[str, Any] = {"schema": {"type": "string", "format": "binary"}}
BINARY_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {
        "description": f"The response as JSON, or with Accept: {MEDIA_TYPE} as one safetensors "
        "file: each array a tensor named by its path in the JSON (weights, heads.0.weights), "
        'the rest as JSON text under __metadata__["json"]',
        "content": {MEDIA_TYPE: _BINARY},
    }
}


def request_body(model: type[BaseModel], examples: Mapping[str, Example]) -> dict[str, Any]:
    """OpenAPI for a body the route parses itself: the model's schema and the worked examples
    as JSON, or safetensors (service.http.app adds the model schemas to the components)."""
    content = {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"},
        "examples": {k: dict(e) for k, e in examples.items()},
    }
    binary = {
        **_BINARY,
        "description": "the arrays as tensors named as the JSON fields (x, w_q, "
        'q_proj.weight, mask.0.matrix), every other field as JSON text under __metadata__["json"]',
    }
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": content, MEDIA_TYPE: binary},
        }
    }


def _body(door: Door, admitted: Answerable, gone: threading.Event) -> dict[str, Any]:
    """The response body as arrays and values; stops (ClientGone) at the next step once
    ``gone`` is set."""

    def check() -> None:
        if gone.is_set():
            raise ClientGone

    return door.run(admitted, check)


_NEVER = threading.Event()  # an inline answer's client cannot be seen to go: never set


def _encoded(
    door: Door, admitted: Answerable, gone: threading.Event, answer: Format, coding: Coding | None
) -> tuple[bytes, Coding | None]:
    """The whole response's bytes (JSON or safetensors), computed and encoded in one go, and
    their content coding: JSON is compressed as ``coding`` when given and it has MIN_BYTES,
    once the arrays are dropped (the JSON and its compressed form are held together a moment:
    a float's JSON is some 20 bytes of the 41 a number is counted for in a whole answer)."""
    body = _body(door, admitted, gone)
    if answer != "json":
        return b"".join(encode_safetensors(body, admitted.decimals)[1]), None
    encoded = encode_whole(body, admitted.decimals)
    del body
    if coding is None or len(encoded) < MIN_BYTES:
        return encoded, None
    return compressed(coding, encoded), coding


async def _watch_disconnect(request: Request, gone: threading.Event) -> None:
    """Set ``gone`` when the client disconnects (its body has been read: receive() now waits
    for the disconnect, or for nothing)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.set()


SOCKET_TAKES = 64 * 1024  # an answer up to this size is taken by the socket at once


def _headers(coding: Coding | None, length: int | None = None) -> dict[str, str]:
    """An answer's Vary, and its Content-Encoding and Content-Length when it has them."""
    coded = {} if coding is None else {"Content-Encoding": coding}
    sized = {} if length is None else {"Content-Length": str(length)}
    return {**VARY, **coded, **sized}


class _Whole(Response):
    """An answer sent in one piece whose end is handed to the server only once its bytes
    have left the process (the connection's buffer drained below its low mark), when it is
    larger than the socket takes at once: a client that reads nothing is then cut by the
    connection's send watch while its answer is still being sent, and logged as cut (499 with
    its reason), not as a 200 complete."""

    def __init__(self, content: bytes, media: str, coding: Coding | None = None) -> None:
        super().__init__(content, media_type=media, headers=_headers(coding))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = {"status": self.status_code, "headers": self.raw_headers}
        await send({"type": "http.response.start", **start})
        if len(self.body) <= SOCKET_TAKES:
            await send({"type": "http.response.body", "body": self.body})
            return
        await send({"type": "http.response.body", "body": self.body, "more_body": True})
        # the last (empty) piece is sent once the buffer has drained below its low mark
        await send({"type": "http.response.body", "body": b""})


class _Held(_Whole):
    """A whole answer whose ticket gives its memory back once the answer has left the
    process (or the client has gone): the server's write takes the whole answer into the
    connection's buffer at once, where a client that reads slowly, or not at all, would keep
    it uncounted."""

    def __init__(
        self, content: bytes, ticket: Ticket, media: str, coding: Coding | None = None
    ) -> None:
        super().__init__(content, media, coding)
        self.ticket = ticket

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.ticket()
            await self.ticket.budget.trim_when_idle()  # as after a streamed answer


Chunk = bytes | memoryview
AHEAD_CHUNKS = 1  # pieces an answer's encoding thread may make before the socket takes them
_MAKERS: set[asyncio.Future[None]] = set()


async def _made_ahead(chunks: Iterator[Chunk]) -> AsyncGenerator[Chunk, None]:
    """The pieces of ``chunks``, made by one thread up to AHEAD_CHUNKS ahead of the writer:
    one thread for the whole answer rather than a hop to the thread pool and back for each
    piece (~750 of them for a 200 MB answer). The thread stops at its next piece once this
    iterator is closed (the answer is written, or its client has gone)."""
    loop = asyncio.get_running_loop()
    made: asyncio.Queue[Chunk | BaseException | None] = asyncio.Queue()
    room = threading.Semaphore(AHEAD_CHUNKS)
    stop = threading.Event()

    def make() -> None:
        try:
            for chunk in chunks:
                room.acquire()
                if stop.is_set():
                    return
                loop.call_soon_threadsafe(made.put_nowait, chunk)
                time.sleep(0)  # the GIL, offered to the event loop between pieces
            loop.call_soon_threadsafe(made.put_nowait, None)  # the end
        except BaseException as exc:  # handed to the writer, which raises it
            if not stop.is_set():
                loop.call_soon_threadsafe(made.put_nowait, exc)

    maker = asyncio.ensure_future(run_in_threadpool(make))
    _MAKERS.add(maker)  # held until it ends (the loop keeps only weak references to tasks)
    maker.add_done_callback(_MAKERS.discard)
    try:
        while (item := await made.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            room.release()
            yield item
    finally:
        stop.set()
        room.release()  # a maker waiting for room sees the stop; it ends at its next piece


class _Budgeted(StreamingResponse):
    """A streamed answer (of a known ``length`` when given: no chunked coding) whose ticket
    gives back whatever memory it still holds when the last
    byte is sent, or when the client goes away (parts go back earlier: _giving_back)."""

    def __init__(
        self,
        content: Iterator[Chunk],
        ticket: Ticket,
        media: str,
        length: int | None = None,
        coding: Coding | None = None,
    ) -> None:
        self.made = _made_ahead(content)
        super().__init__(
            self.made,
            media_type=media,
            headers=_headers(coding, length),
            background=BackgroundTask(ticket.budget.trim_when_idle),  # after the last byte
        )
        self.ticket = ticket

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.made.aclose()  # its thread stops (a client gone mid-answer)
            self.ticket()


async def _read(request: Request) -> bytes:
    """The body, read from the channel rather than through ``Request.body()``, whose copy
    would live as long as the request (the whole answer)."""
    chunks = []
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def answer_to(request: Request, endpoint: str) -> Response:
    """The answer to a POST of ``endpoint`` (a key of DOORS) whose body the middleware has read
    (see the module's doc)."""
    door = DOORS[endpoint]
    raw = await _read(request)
    state = request.app.state
    settings: Settings = state.settings
    form = body_form(request.headers.get("content-type", "")) or "json"  # the middleware's 415
    answer = negotiate(request.headers.get("accept")) or "json"  # and its 406
    coding = content_coding(request.headers.get("accept-encoding")) if answer == "json" else None
    if len(raw) <= INLINE_BODY_BYTES:
        parsed = checked(raw, endpoint, settings, form)
    elif len(raw) <= THREAD_BODY_BYTES:
        parsed = await run_in_threadpool(checked, raw, endpoint, settings, form)
    else:  # JSON or safetensors (its header and metadata JSON): never on the worker's GIL
        parsed = await state.parser.check(raw, endpoint, settings, form)
    del raw  # parsed: its memory goes back now, not after the answer
    admitted: Answerable = (
        parsed if door.ready is None else await run_in_threadpool(door.ready, parsed, settings)
    )
    media = JSON_TYPE if answer == "json" else MEDIA_TYPE
    # small: answered at once, never queued behind large ones; a comparison's recomputations
    # (up to ~100 of them) always run off the event loop
    if admitted.numbers <= INLINE_NUMBERS and not admitted.comparing:
        encoded, coded = _encoded(door, admitted, _NEVER, answer, coding)
        return _Whole(encoded, media, coded)
    # sent whole when its encoded bytes fit the budget too (a small configured budget streams)
    coder = 0 if coding is None else STATE_BYTES[coding]  # the compressor's own memory
    if cost_bytes(admitted.numbers) + coder > state.budget.total:
        coding, coder = None, 0  # compression never turns an answer that fits into a 413
    whole_cost = whole_cost_bytes(admitted.numbers) + coder
    whole = admitted.numbers <= WHOLE_NUMBERS and whole_cost <= state.budget.total
    gone = threading.Event()
    watcher = asyncio.create_task(_watch_disconnect(request, gone))
    try:
        cost = whole_cost if whole else cost_bytes(admitted.numbers) + coder
        ticket = await _admitted(state.budget, cost, watcher, door.advice)
        try:
            if whole:  # one thread hop, one write: the fixed costs of streaming would dominate
                encoded, coded = await run_in_threadpool(
                    _encoded, door, admitted, gone, answer, coding
                )
                ticket.give_back(ticket.held - BASE_COST - len(encoded))  # all it holds now
                return _Held(encoded, ticket, media, coded)
            body = await run_in_threadpool(_body, door, admitted, gone)
        except BaseException:
            ticket()
            raise
    finally:
        watcher.cancel()
    given_back = _giving_back(ticket, admitted, body, BASE_COST + coder)
    if answer == "json":
        chunks = encode(body, admitted.decimals, given_back)
        if coding is not None:  # compressed as it is encoded, in the same thread
            chunks = compressing(coding, chunks)
        return _Budgeted(chunks, ticket, JSON_TYPE, coding=coding)
    length, pieces = encode_safetensors(body, admitted.decimals, given_back)
    return _Budgeted(pieces, ticket, MEDIA_TYPE, length)


def _giving_back(
    ticket: Ticket, admitted: Answerable, body: dict[str, Any], kept: int
) -> Callable[[str], None]:
    """Memory goes back as the answer streams out: at once, what the body does not hold (the
    intermediates `include` left out, masks); then each output's share once it is written.
    ``kept`` (the buffers, a compressor's state) goes back when the answer ends."""
    held = {name: held_bytes(n) for name, n in admitted.numbers_in(body).items()}
    ticket.give_back(ticket.held - kept - sum(held.values()))
    loop = asyncio.get_running_loop()

    def written(name: str) -> None:  # in the encoding thread
        loop.call_soon_threadsafe(ticket.give_back, held.get(name, 0))

    return written


async def _admitted(budget: Budget, cost: int, watcher: asyncio.Task[None], advice: str) -> Ticket:
    """Wait for the budget to admit ``cost``, unless the client leaves first (then it gives up
    its place in the queue: ClientGone); ``advice`` says what to change when it never fits."""
    admission = asyncio.ensure_future(budget.admit(cost, advice))
    done, _ = await asyncio.wait({admission, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if admission in done:
        return admission.result()  # or the 413 / 503 it raised
    admission.cancel()  # leaves the queue; memory already given to it comes back
    with contextlib.suppress(asyncio.CancelledError):
        (await admission)()  # admitted just before the cancel: give it back
    raise ClientGone


def direct(endpoint: str) -> ASGIApp:
    """The endpoint as a plain ASGI app, for the middleware to call once it has made the checks
    FastAPI's router would repeat (path, method, key) and read the body: the same answer,
    without the router's layers (exception middleware, dependency solving) on every request
    (measured: docs/performance.md)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            response = await answer_to(Request(scope, receive), endpoint)
        except Exception as exc:
            answer = error_answer(exc, scope)
            if answer is None:
                raise
            response = answer
        await response(scope, receive, send)

    return app


DIRECT: dict[str, ASGIApp] = {f"/{name}": direct(name) for name in DOORS}


def _documented(e: ComputeEndpoint) -> Callable[[Request], Awaitable[Response]]:
    """The route function FastAPI documents for ``e``. Documentation only: the middleware
    answers every POST to the path from :data:`DIRECT` (the same answer, past the router); this
    function would give it too if it were ever called."""

    async def endpoint(request: Request) -> Response:
        return await answer_to(request, e.name)

    endpoint.__name__ = e.name  # openapi.json's operationId: attention_attention_post
    return endpoint


router = APIRouter(tags=["attention"])  # API keys: service.http.app and the middleware
for _e in ENDPOINTS.values():
    router.add_api_route(
        f"/{_e.name}",
        _documented(_e),
        methods=["POST"],
        name=_e.name,
        description=_e.description,
        response_model=_e.response,
        responses={**ERRORS, **BINARY_ANSWER},
        openapi_extra=request_body(_e.model, _e.examples),
    )
REQUEST_MODELS: tuple[type[BaseModel], ...] = tuple(e.model for e in ENDPOINTS.values())
