"""The trained models over HTTP: GET /models and POST /model (service.models.answer). A /model
answer is admitted like a compute request (the rules, then the memory budget for the numbers it
computes), computed off the event loop, and answered as JSON or, to ``Accept:
application/x-safetensors``, as one safetensors file (the arrays by their dotted paths, the
rest as JSON in its metadata, as the compute endpoints answer)."""

from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from service.config import Settings
from service.http.budget import cost_bytes
from service.http.routes import BINARY_ANSWER, ERRORS, VARY
from service.models import answer
from service.wire.json_out import encode_whole
from service.wire.media import JSON_TYPE, MEDIA_TYPE, body_form, negotiate
from service.wire.parse import parse
from service.wire.safetensors_out import encode_safetensors
from service.wire.schemas.model_fields import ModelRequest

router = APIRouter(tags=["trained models"])
keyed_router = APIRouter(tags=["trained models"])  # behind the API key when keys are configured


@keyed_router.get("/models")
def models(request: Request) -> list[dict[str, Any]]:
    """The trained models this service knows, and whether each is installed here."""
    return answer.listing(request.app.state.settings)


async def _model(request: Request) -> Response:
    settings: Settings = request.app.state.settings
    form = body_form(request.headers.get("content-type", "")) or "json"  # the middleware's 415
    req = parse(await request.body(), ModelRequest, form)
    admitted = await run_in_threadpool(answer.admit, req, settings)  # loads a model once
    binary = negotiate(request.headers.get("accept")) == "safetensors"  # the middleware's 406
    ticket = await request.app.state.budget.admit(cost_bytes(admitted.numbers))
    try:
        body = await run_in_threadpool(answer.run, admitted, lambda: None)
        if binary:
            _, chunks = await run_in_threadpool(encode_safetensors, body, req.decimals)
            content = await run_in_threadpool(b"".join, chunks)
        else:
            content = await run_in_threadpool(encode_whole, body, req.decimals)
    finally:
        ticket()
    return Response(content, media_type=MEDIA_TYPE if binary else JSON_TYPE, headers=VARY)


_model.__name__ = "model"
router.add_api_route(
    "/model",
    _model,
    methods=["POST"],
    name="model",
    description="A trained model's attention on your sentence: every layer's and head's "
    "weights, head roles, attention rollout, and one layer's whole /multihead trace.",
    responses=ERRORS
    | BINARY_ANSWER
    | {501: {"description": "The model is known but not installed here"}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                JSON_TYPE: {
                    "schema": {"$ref": "#/components/schemas/ModelRequest"},
                    "example": {"model": "minilm", "text": "The cat sat on the mat.", "layer": 0},
                }
            },
        }
    },
)
