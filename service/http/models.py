"""The trained models over HTTP: GET /models, and POST /model's documented route. A POST /model
is answered by the compute endpoints' own path (service.http.routes, its row of ``DOORS``: the
body parsed by size, the rules, the memory budget held until the answer has left, the send and
disconnect watches, the answer whole or streamed) as JSON or, to ``Accept:
application/x-safetensors``, as one safetensors file (the arrays by their dotted paths, the
rest as JSON in its metadata, as the compute endpoints answer)."""

from typing import Any

from fastapi import APIRouter, Request, Response

from service.http.routes import BINARY_ANSWER, ERRORS, answer_to
from service.models import answer
from service.wire.media import JSON_TYPE

router = APIRouter(tags=["trained models"])
keyed_router = APIRouter(tags=["trained models"])  # behind the API key when keys are configured


@keyed_router.get("/models")
def models(request: Request) -> list[dict[str, Any]]:
    """The trained models this service knows, and whether each is installed here."""
    return answer.listing(request.app.state.settings)


async def _model(request: Request) -> Response:
    """Documentation only: the middleware answers every POST /model from routes.DIRECT (the
    same answer, past the router)."""
    return await answer_to(request, "model")


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
