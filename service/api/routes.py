"""The compute routes.

Each route reads the raw body and then, off the event loop for anything but tiny requests:
parses it (JSON with orjson, or safetensors: service.api.binary), validates each field with the pydantic model, applies the rules that
involve several fields (service.api.rules), checks the limits, plans (draws generated arrays,
converts weights: service.api.plan), computes, and streams the JSON straight from the arrays
(service.api.encode), or writes safetensors straight from them when the Accept header asks
for it. Tiny requests (small body, small result) are answered inline, where a
thread hop would cost more than the work.
"""

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.openapi.models import Example
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api import outputs
from service.api.binary import (
    JSON_TYPE,
    MEDIA_TYPE,
    Format,
    body_form,
    decode_request,
    encode_safetensors,
    negotiate,
)
from service.api.budget import BASE_COST, Budget, Ticket, cost_bytes, held_bytes
from service.api.compare import check_expected
from service.api.compute import Check, run_attention, run_multihead
from service.api.encode import encode, encode_whole
from service.api.errors import (
    BodyError,
    ClientGone,
    ErrorBody,
    error_answer,
    invalid_fields,
    read_int,
)
from service.api.examples import ATTENTION_EXAMPLES, MASK_EXAMPLES, MULTIHEAD_EXAMPLES
from service.api.limits import check_limits
from service.api.plan import Plan, plan_attention, plan_multihead
from service.api.responses import AttentionResponse, MaskResponse, MultiheadResponse
from service.api.rules import Endpoint, Shapes, attention_shapes, multihead_shapes
from service.api.schemas.requests import (
    AttentionRequest,
    InputFields,
    MaskRequest,
    MultiheadRequest,
)
from service.config import Settings
from service.memory import release_memory

router = APIRouter(tags=["attention"])  # API keys: service.api.app and the middleware
Req = TypeVar("Req", bound=InputFields)
P = TypeVar("P", bound=Plan)

INLINE_BODY_BYTES = 16 * 1024  # parse on the event loop below this
VARY = {"Vary": "Accept"}  # the answer's form depends on it (for caches in between)
INLINE_NUMBERS = 20_000  # draw, compute and serialise on the event loop below this many numbers

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


@dataclass(frozen=True)
class Route(Generic[Req, P]):
    """One compute endpoint: its request model and the three steps from request to body."""

    name: str  # the path without its slash
    endpoint: Endpoint  # which outputs it has
    model: type[Req]
    shapes: Callable[[Req], Shapes]  # every cross-field rule
    plan: Callable[[Req, Shapes], P]  # generated arrays drawn, weights converted
    run: Callable[[P, Check], dict[str, Any]]  # the engine, then the outputs table


ATTENTION = Route(
    "attention", "attention", AttentionRequest, attention_shapes, plan_attention, run_attention
)
MASK = Route("mask", "attention", MaskRequest, attention_shapes, plan_attention, run_attention)
MULTIHEAD = Route(
    "multihead", "multihead", MultiheadRequest, multihead_shapes, plan_multihead, run_multihead
)
ROUTES: dict[str, Route[Any, Any]] = {r.name: r for r in (ATTENTION, MASK, MULTIHEAD)}
REQUEST_MODELS: tuple[type[BaseModel], ...] = (AttentionRequest, MaskRequest, MultiheadRequest)


_BINARY: dict[str, Any] = {"schema": {"type": "string", "format": "binary"}}
BINARY_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {
        "description": f"The response as JSON, or with Accept: {MEDIA_TYPE} as one safetensors "
        "file: each array a tensor named by its path in the JSON (weights, heads.0.weights), "
        'the rest as JSON text under __metadata__["json"]',
        "content": {MEDIA_TYPE: _BINARY},
    }
}


def request_body(model: type[BaseModel], examples: dict[str, Example]) -> dict[str, Any]:
    """OpenAPI for a body the route parses itself: the model's schema and the worked examples
    as JSON, or safetensors (service.api.app adds the model schemas to the components)."""
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


def load_json(raw: bytes) -> Any:
    """JSON bytes to Python values (400 for bytes that are not JSON)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # NaN, Infinity, 1e999, integers of thousands of digits, lone surrogates ("\ud800"):
        # Python's json reads them, and the validators refuse them with a 422 naming the field
        try:
            return json.loads(raw, parse_int=read_int)
        except RecursionError:
            raise BodyError("nested too deeply (more than 1000 levels)") from None
        except ValueError as err:
            raise BodyError(getattr(err, "msg", str(err))) from None


def _parse(raw: bytes, model: type[Req], form: Format) -> Req:
    """A JSON or safetensors body to a validated request (400 for a body that is neither, 422
    for fields)."""
    data = decode_request(raw, model, load_json) if form == "safetensors" else load_json(raw)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise invalid_fields(err) from None


def checked(
    raw: bytes, route: Route[Req, P], settings: Settings, form: Format = "json"
) -> tuple[Req, Shapes, int]:
    """Parse, apply the rules and check the limits; return the request, its shapes and how
    many numbers it computes (intermediates included)."""
    req = _parse(raw, route.model, form)
    shapes = check_expected(req.expected, route.shapes(req))
    outputs.check_include(route.endpoint, req.include)
    return req, shapes, check_limits(shapes, req.include, settings)


def _body(route: Route[Req, P], req: Req, shapes: Shapes, gone: threading.Event) -> dict[str, Any]:
    """Plan, then run: the response body as arrays and values. Stops (ClientGone) at the next
    step once ``gone`` is set."""

    def check() -> None:
        if gone.is_set():
            raise ClientGone

    plan = route.plan(req, shapes)
    check()
    return route.run(plan, check)


async def _watch_disconnect(request: Request, gone: threading.Event) -> None:
    """Set ``gone`` when the client disconnects (its body has been read: receive() now waits
    for the disconnect, or for nothing)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.set()


class _Budgeted(StreamingResponse):
    """A streamed answer (of a known ``length`` when given: no chunked coding) whose ticket
    gives back whatever memory it still holds when the last
    byte is sent, or when the client goes away (parts go back earlier: _giving_back)."""

    def __init__(
        self,
        content: Iterator[bytes | memoryview],
        ticket: Ticket,
        media: str,
        length: int | None = None,
    ) -> None:
        super().__init__(
            content,
            media_type=media,
            headers=VARY if length is None else {**VARY, "Content-Length": str(length)},
            background=BackgroundTask(run_in_threadpool, release_memory),  # after the last byte
        )
        self.ticket = ticket

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.ticket()


async def _answer(request: Request, route: Route[Req, P]) -> Response:
    raw = await request.body()
    state = request.app.state
    settings: Settings = state.settings
    form = body_form(request.headers.get("content-type", "")) or "json"  # the middleware's 415
    answer = negotiate(request.headers.get("accept")) or "json"  # and its 406
    if len(raw) <= INLINE_BODY_BYTES:
        req, shapes, numbers = checked(raw, route, settings, form)
    else:  # JSON or safetensors (its header and metadata JSON): never on the worker's GIL
        req, shapes, numbers = await state.parser.check(raw, route.name, settings, form)
    # small: answered at once, never queued behind large ones; a comparison's recomputations
    # (up to ~100 of them) always run off the event loop
    if numbers <= INLINE_NUMBERS and not shapes.comparing:
        body = _body(route, req, shapes, threading.Event())
        if answer == "json":
            return Response(encode_whole(body, req.decimals), media_type=JSON_TYPE, headers=VARY)
        whole = b"".join(encode_safetensors(body, req.decimals)[1])
        return Response(whole, media_type=MEDIA_TYPE, headers=VARY)
    gone = threading.Event()
    watcher = asyncio.create_task(_watch_disconnect(request, gone))
    try:
        ticket = await _admitted(state.budget, cost_bytes(numbers), watcher)
        try:
            body = await run_in_threadpool(_body, route, req, shapes, gone)
        except BaseException:
            ticket()
            raise
    finally:
        watcher.cancel()
    given_back = _giving_back(ticket, shapes, body)
    if answer == "json":
        return _Budgeted(encode(body, req.decimals, given_back), ticket, JSON_TYPE)
    length, chunks = encode_safetensors(body, req.decimals, given_back)
    return _Budgeted(chunks, ticket, MEDIA_TYPE, length)


def _giving_back(ticket: Ticket, shapes: Shapes, body: dict[str, Any]) -> Callable[[str], None]:
    """Memory goes back as the answer streams out: at once, what the body does not hold (the
    intermediates `include` left out, masks); then each output's share once it is written."""
    held = {name: held_bytes(n) for name, n in outputs.sizes(shapes).items() if name in body}
    ticket.give_back(ticket.held - BASE_COST - sum(held.values()))
    loop = asyncio.get_running_loop()

    def written(name: str) -> None:  # in the encoding thread
        loop.call_soon_threadsafe(ticket.give_back, held.get(name, 0))

    return written


async def _admitted(budget: Budget, cost: int, watcher: asyncio.Task[None]) -> Ticket:
    """Wait for the budget to admit ``cost``, unless the client leaves first (then it gives up
    its place in the queue: ClientGone)."""
    admission = asyncio.ensure_future(budget.admit(cost))
    done, _ = await asyncio.wait({admission, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if admission in done:
        return admission.result()  # or the 413 / 503 it raised
    admission.cancel()  # leaves the queue; memory already given to it comes back
    with contextlib.suppress(asyncio.CancelledError):
        (await admission)()  # admitted just before the cancel: give it back
    raise ClientGone


def direct(route: Route[Req, P]) -> ASGIApp:
    """The route as a plain ASGI app, for the middleware to call once it has made the checks
    FastAPI's router would repeat (path, method, key) and read the body: the same answer,
    without the router's layers (exception middleware, dependency solving) on every request."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            response = await _answer(Request(scope, receive), route)
        except Exception as exc:
            answer = error_answer(exc, scope)
            if answer is None:
                raise
            response = answer
        await response(scope, receive, send)

    return app


DIRECT: dict[str, ASGIApp] = {f"/{name}": direct(route) for name, route in ROUTES.items()}


@router.post(
    "/attention",
    response_model=AttentionResponse,
    responses={**ERRORS, **BINARY_ANSWER},
    openapi_extra=request_body(AttentionRequest, ATTENTION_EXAMPLES),
)
async def attention(request: Request) -> Response:
    """Scaled dot-product attention, every step: Q, K, V, scores, scaled scores, weights, output."""
    return await _answer(request, ATTENTION)


@router.post(
    "/mask",
    response_model=MaskResponse,
    responses={**ERRORS, **BINARY_ANSWER},
    openapi_extra=request_body(MaskRequest, MASK_EXAMPLES),
)
async def mask(request: Request) -> Response:
    """Attention with a mask (causal, padding, window, boolean, additive; combined with AND),
    returning the combined mask, the masked scores and the fully masked rows."""
    return await _answer(request, MASK)


@router.post(
    "/multihead",
    response_model=MultiheadResponse,
    responses={**ERRORS, **BINARY_ANSWER},
    openapi_extra=request_body(MultiheadRequest, MULTIHEAD_EXAMPLES),
)
async def multihead(request: Request) -> Response:
    """Multi-head attention: per-head traces, averaged weights, concat, W_o, residual, layer norm."""
    return await _answer(request, MULTIHEAD)
