"""The compute routes: parse (pydantic), check limits, compute (service.api.compute), answer
with JSON bytes."""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request, Response

from service.api.compute import run_attention, run_multihead
from service.api.errors import ErrorBody
from service.api.examples import ATTENTION_EXAMPLES, MASK_EXAMPLES, MULTIHEAD_EXAMPLES
from service.api.limits import check_limits
from service.api.responses import AttentionResponse, MaskResponse, MultiheadResponse
from service.api.schemas import AttentionRequest, InputFields, MaskRequest, MultiheadRequest

router = APIRouter(tags=["attention"])

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The body is not valid JSON"},
    413: {
        "model": ErrorBody,
        "description": "The body, a size, or the result is over a configured limit",
    },
    422: {"model": ErrorBody, "description": "The request is JSON but does not fit the contract"},
}


def _checked(body: InputFields, request: Request) -> None:
    check_limits(body, body.dims(), request.app.state.settings)


def _json(content: bytes) -> Response:
    return Response(content=content, media_type="application/json")


@router.post("/attention", response_model=AttentionResponse, responses=ERRORS)
def attention(
    body: Annotated[AttentionRequest, Body(openapi_examples=ATTENTION_EXAMPLES)], request: Request
) -> Response:
    """Scaled dot-product attention, every step: Q, K, V, scores, scaled scores, weights, output."""
    _checked(body, request)
    return _json(run_attention(body))


@router.post("/mask", response_model=MaskResponse, responses=ERRORS)
def mask(
    body: Annotated[MaskRequest, Body(openapi_examples=MASK_EXAMPLES)], request: Request
) -> Response:
    """Attention with a mask (causal, padding, window, boolean, additive; combined with AND),
    returning the combined mask, the masked scores and the fully masked rows."""
    _checked(body, request)
    return _json(run_attention(body))


@router.post("/multihead", response_model=MultiheadResponse, responses=ERRORS)
def multihead(
    body: Annotated[MultiheadRequest, Body(openapi_examples=MULTIHEAD_EXAMPLES)], request: Request
) -> Response:
    """Multi-head attention: per-head traces, averaged weights, concat, W_o, residual, layer norm."""
    _checked(body, request)
    return _json(run_multihead(body))
