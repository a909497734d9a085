"""The HTTP routes: parse (pydantic), compute (service.api.compute), answer with JSON bytes."""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Response

from service import __version__
from service.api.compute import run_attention, run_multihead
from service.api.errors import ErrorBody
from service.api.examples import ATTENTION_EXAMPLES, MASK_EXAMPLES, MULTIHEAD_EXAMPLES
from service.api.responses import AttentionResponse, MaskResponse, MultiheadResponse
from service.api.schemas import AttentionRequest, MaskRequest, MultiheadRequest

router = APIRouter()

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The body is not valid JSON"},
    422: {
        "model": ErrorBody,
        "description": "The request is well-formed JSON but does not fit the contract",
    },
}


def _json(body: bytes) -> Response:
    return Response(content=body, media_type="application/json")


@router.post("/attention", response_model=AttentionResponse, responses=ERRORS, tags=["attention"])
def attention(
    request: Annotated[AttentionRequest, Body(openapi_examples=ATTENTION_EXAMPLES)],
) -> Response:
    """Scaled dot-product attention, every step: Q, K, V, scores, scaled scores, weights, output."""
    return _json(run_attention(request))


@router.post("/mask", response_model=MaskResponse, responses=ERRORS, tags=["attention"])
def mask(request: Annotated[MaskRequest, Body(openapi_examples=MASK_EXAMPLES)]) -> Response:
    """Attention with a mask (causal, padding, window, boolean, additive; combined with AND),
    returning the combined mask, the masked scores and the fully masked rows."""
    return _json(run_attention(request))


@router.post("/multihead", response_model=MultiheadResponse, responses=ERRORS, tags=["attention"])
def multihead(
    request: Annotated[MultiheadRequest, Body(openapi_examples=MULTIHEAD_EXAMPLES)],
) -> Response:
    """Multi-head attention: per-head traces, averaged weights, concat, W_o, residual, layer norm."""
    return _json(run_multihead(request))


@router.get("/healthz", tags=["operations"])
def healthz() -> dict[str, str]:
    """Liveness: answers while the process is up."""
    return {"status": "ok", "version": __version__}
