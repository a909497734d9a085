"""One JSON shape for every error: {"message": ..., "errors": [{"field", "message", "type"}]}.

Messages are sentences for people; nothing of the input is echoed beyond a short excerpt.
"""

from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.limits import LimitError
from service.api.schemas import FieldError
from service.core.softmax import AttentionInputError, FullyMaskedRowsError

MAX_LISTED = 10


class ErrorItem(BaseModel):
    """One problem with the request."""

    field: str | None = Field(
        description="dotted path of the field, e.g. mask[0].matrix; null for the whole body"
    )
    message: str = Field(description="what is wrong, in words")
    type: str = Field(description="machine-readable kind, e.g. value_error, missing, json_invalid")
    limit: int | None = Field(None, description="the configured limit, when a limit was exceeded")


class ErrorBody(BaseModel):
    """Every 4xx answer has this shape."""

    message: str = Field(description="the first problem, as a sentence")
    errors: list[ErrorItem] = Field(description="every problem found (at most 10)")


def _field(loc: tuple[Any, ...]) -> str | None:
    """('body', 'mask', 0, 'matrix') -> 'mask[0].matrix'; discriminator tags are dropped."""
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in (
            "causal",
            "padding",
            "window",
            "boolean",
            "additive",
            "function-after[_some_lengths(), PaddingMask]",
        ):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or None


def _item(err: dict[str, Any]) -> ErrorItem:
    ctx = err.get("ctx") or {}
    cause = ctx.get("error")
    kind = str(err.get("type", "value_error"))
    if isinstance(cause, FieldError):
        return ErrorItem(field=cause.field, message=str(cause), type=kind)
    field = _field(tuple(err.get("loc", ())))
    if kind == "json_invalid":
        return ErrorItem(
            field=None,
            message=f"the body is not valid JSON: {ctx.get('error', 'parse error')}",
            type=kind,
        )
    if isinstance(cause, ValueError):
        return ErrorItem(field=field, message=str(cause), type=kind)
    msg = str(err.get("msg", "invalid value"))
    if kind == "missing":
        msg = f"{field} is required"
    elif kind == "extra_forbidden":
        msg = f"{field} is not a field of this endpoint (check the spelling; see /docs)"
    elif field:
        msg = f"{field}: {msg[0].lower()}{msg[1:]}"
    return ErrorItem(field=field, message=msg[:300], type=kind)


def error_response(status: int, items: list[ErrorItem]) -> Response:
    """The one error shape, as a JSON response."""
    body = ErrorBody(
        message=items[0].message if items else "bad request", errors=items[:MAX_LISTED]
    )
    return Response(
        orjson.dumps(body.model_dump()), status_code=status, media_type="application/json"
    )


def install(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the one error shape."""

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        errors = list(exc.errors())
        items = [_item(e) for e in errors[:MAX_LISTED]]
        status = 400 if any(i.type == "json_invalid" for i in items) else 422
        return error_response(status, items)

    @app.exception_handler(AttentionInputError)
    async def _math(_: Request, exc: AttentionInputError) -> Response:
        field = "mask" if isinstance(exc, FullyMaskedRowsError) else None
        return error_response(
            422, [ErrorItem(field=field, message=str(exc), type="attention_error")]
        )

    @app.exception_handler(LimitError)
    async def _limit(_: Request, exc: LimitError) -> Response:
        return error_response(
            413,
            [ErrorItem(field=exc.field, message=str(exc), type="limit_exceeded", limit=exc.limit)],
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        kind = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error"
        )
        response = error_response(
            exc.status_code, [ErrorItem(field=None, message=str(exc.detail), type=kind)]
        )
        response.headers.update(exc.headers or {})
        return response
