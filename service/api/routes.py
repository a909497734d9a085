"""The compute routes.

Each route reads the raw body and then, off the event loop for anything but tiny requests:
parses it with orjson, validates it with the pydantic model, checks the limits, computes, and
streams the JSON straight from the arrays (service.api.encode). Tiny requests (small body, small
result) are answered inline, where a thread hop would cost more than the work.
"""

import json
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.models import Example
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from service.api.auth import require_api_key
from service.api.compute import run_attention, run_multihead
from service.api.encode import encode, encode_whole
from service.api.errors import ErrorBody
from service.api.examples import ATTENTION_EXAMPLES, MASK_EXAMPLES, MULTIHEAD_EXAMPLES
from service.api.limits import check_limits
from service.api.responses import AttentionResponse, MaskResponse, MultiheadResponse
from service.api.schemas import AttentionRequest, InputFields, MaskRequest, MultiheadRequest
from service.config import Settings
from service.memory import release_memory

router = APIRouter(tags=["attention"], dependencies=[Depends(require_api_key)])
Model = TypeVar("Model", bound=InputFields)

INLINE_BODY_BYTES = 16 * 1024  # parse on the event loop below this
INLINE_NUMBERS = 20_000  # compute and serialise on the event loop below this many numbers

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The body is not valid JSON"},
    401: {
        "model": ErrorBody,
        "description": "An API key is configured and the request has none, or a wrong one",
    },
    413: {
        "model": ErrorBody,
        "description": "The body, a size, or the result is over a configured limit",
    },
    422: {"model": ErrorBody, "description": "The request is JSON but does not fit the contract"},
}
REQUEST_MODELS: tuple[type[InputFields], ...] = (AttentionRequest, MaskRequest, MultiheadRequest)


def request_body(model: type[InputFields], examples: dict[str, Example]) -> dict[str, Any]:
    """OpenAPI for a body the route parses itself: the model's schema and the worked examples
    (service.api.app adds the model schemas to the components)."""
    content = {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"},
        "examples": {k: dict(e) for k, e in examples.items()},
    }
    return {"requestBody": {"required": True, "content": {"application/json": content}}}


def _parse(raw: bytes, model: type[Model]) -> Model:
    """JSON bytes to a validated request, or the same errors FastAPI would raise."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:  # NaN, Infinity, 1e999: valid for Python's json, refused with 422 by the validators
            data = json.loads(raw)
        except RecursionError:
            raise RequestValidationError(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body",),
                        "msg": "JSON decode error",
                        "ctx": {"error": "nested too deeply (more than 1000 levels)"},
                    }
                ]
            ) from None
        except ValueError as err:
            pos = getattr(err, "pos", 0)
            msg = getattr(err, "msg", str(err))
            raise RequestValidationError(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body", pos),
                        "msg": "JSON decode error",
                        "ctx": {"error": msg},
                    }
                ]
            ) from None
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise RequestValidationError(err.errors(include_url=False)) from None


def _planned(raw: bytes, model: type[Model], settings: Settings) -> tuple[Model, Any, int]:
    """Parse, validate and check the limits; return the request, its dims and how many numbers
    it computes (intermediates included)."""
    req = _parse(raw, model)
    dims = req.checked_dims()
    _, computed = check_limits(req, dims, settings)
    return req, dims, computed


async def _answer(
    request: Request, model: type[Model], run: Callable[[Model, Any], dict[str, Any]]
) -> Response:
    raw = await request.body()
    settings: Settings = request.app.state.settings
    if len(raw) <= INLINE_BODY_BYTES:
        req, dims, numbers = _planned(raw, model, settings)
    else:
        req, dims, numbers = await run_in_threadpool(_planned, raw, model, settings)
    if numbers <= INLINE_NUMBERS:
        return Response(encode_whole(run(req, dims), req.decimals), media_type="application/json")
    body = await run_in_threadpool(run, req, dims)
    return StreamingResponse(
        encode(body, req.decimals),
        media_type="application/json",
        background=BackgroundTask(run_in_threadpool, release_memory),  # after the last byte
    )


@router.post(
    "/attention",
    response_model=AttentionResponse,
    responses=ERRORS,
    openapi_extra=request_body(AttentionRequest, ATTENTION_EXAMPLES),
)
async def attention(request: Request) -> Response:
    """Scaled dot-product attention, every step: Q, K, V, scores, scaled scores, weights, output."""
    return await _answer(request, AttentionRequest, run_attention)


@router.post(
    "/mask",
    response_model=MaskResponse,
    responses=ERRORS,
    openapi_extra=request_body(MaskRequest, MASK_EXAMPLES),
)
async def mask(request: Request) -> Response:
    """Attention with a mask (causal, padding, window, boolean, additive; combined with AND),
    returning the combined mask, the masked scores and the fully masked rows."""
    return await _answer(request, MaskRequest, run_attention)


@router.post(
    "/multihead",
    response_model=MultiheadResponse,
    responses=ERRORS,
    openapi_extra=request_body(MultiheadRequest, MULTIHEAD_EXAMPLES),
)
async def multihead(request: Request) -> Response:
    """Multi-head attention: per-head traces, averaged weights, concat, W_o, residual, layer norm."""
    return await _answer(request, MultiheadRequest, run_multihead)
