"""One home for the API's errors and one JSON shape for all of them:
{"message": ..., "errors": [{"field", "message", "type", "limit"?}]}.

Messages are sentences for people; nothing of the input is echoed beyond a short excerpt.
"""

import math
import re
import sys
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from service.core.errors import AttentionInputError, FullyMaskedRowsError

MAX_LISTED = 10
# pydantic's union tags
_MASK_TAGS = {"causal", "padding", "window", "chunked", "boolean", "additive"}
# and the tags of the unions service.wire.schemas picks by the input's JSON type (layer_norm,
# key_lengths, query_lengths): in an error's loc, none of them is a field
_TAGS = _MASK_TAGS | {
    "flag",
    "options",
    "one",
    "each",
    "none",
    "linear",
    "llama3",
    "yarn",
    "dynamic",
    "longrope",
}


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


class RequestError(Exception):
    """A request the service refuses; ``status`` and ``items`` make the answer (with
    ``extra``'s fields beside ``message`` and ``errors``)."""

    status = 422
    headers: dict[str, str] = {}  # noqa: RUF012 - read only
    extra: dict[str, str] = {}  # noqa: RUF012 - read only

    def __init__(self, items: list[ErrorItem]) -> None:
        self.items = items
        super().__init__(items[0].message if items else "bad request")


class FieldError(RequestError):
    """A rule about one named field (or how it fits the others) is broken: 422."""

    def __init__(self, field: str | None, message: str) -> None:
        self.field = field
        super().__init__([ErrorItem(field=field, message=message, type="value_error")])


class LimitError(RequestError):
    """A request over a configured limit: 413, before any computing."""

    status = 413

    def __init__(self, field: str | None, message: str, limit: int) -> None:
        self.limit = limit
        super().__init__(
            [ErrorItem(field=field, message=message, type="limit_exceeded", limit=limit)]
        )


class ModelNotInstalled(RequestError):
    """A trained model this service knows but whose files are not installed here: 501, with
    the command that installs it."""

    status = 501

    def __init__(self, name: str, install_command: str) -> None:
        self.extra = {"install_command": install_command}
        message = (
            f"the model {name} is not installed on this server: its operator installs it with "
            f"{install_command}"
        )
        super().__init__([ErrorItem(field="model", message=message, type="model_not_installed")])


class BodyError(RequestError):
    """The body is not JSON (or nested too deeply to read), or not safetensors: 400."""

    status = 400

    def __init__(self, problem: str, form: str = "JSON") -> None:
        message = f"the body is not valid {form}: {problem}"
        kind = "json_invalid" if form == "JSON" else "safetensors_invalid"
        super().__init__([ErrorItem(field=None, message=message, type=kind)])


class ClientGone(Exception):
    """The client went away before its answer was ready: its work stops here (logged as 499)."""


CLIENT_CLOSED = 499  # nginx's status for a client that closed the connection first


def invalid_fields(err: ValidationError | RequestValidationError) -> RequestError:
    """pydantic's per-field errors, as one 422 with a sentence per problem (first 10)."""
    return RequestError([_item(e) for e in list(err.errors())[:MAX_LISTED]])


EXCERPT_CHARS = 64  # the most of a name or string from the input that an answer repeats
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class TooManyDigits:
    """Stands for a JSON integer with more digits than Python reads (the json fallback's
    ``parse_int``), so that validation can name its field instead of refusing the whole body."""

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"<an integer of {self.digits} digits>"


def read_int(text: str) -> int | TooManyDigits:
    """``parse_int`` for the json fallback: an int, or a stand-in when it has too many digits."""
    try:
        return int(text)
    except ValueError:
        return TooManyDigits(len(text.lstrip("-")))


def too_many_digits(where: str, number: TooManyDigits) -> str:
    """The sentence for an integer too long to read, e.g. 'seq_len: the number has too many
    digits'."""
    limit = sys.get_int_max_str_digits()
    return f"{where}: the number has too many digits ({number.digits}; at most {limit})"


def lone_surrogate(text: str) -> str | None:
    """Why ``text`` is not valid Unicode, e.g. 'it contains a lone surrogate (\\ud800) at
    character 3' (JSON's "\\ud800" with no pair; Python's json reads it, no encoder writes
    it), or None when it is valid."""
    bad = None if text.isascii() else _SURROGATE.search(text)
    if bad is None:
        return None
    return f"it contains a lone surrogate ({escaped(bad.group())}) at character {bad.start()}"


def escaped(text: str) -> str:
    """``text`` with lone surrogates written as \\udxxx, so that it can be encoded as JSON."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """A short, encodable excerpt of a string from the input: at most ``limit`` characters, then
    '…'."""
    return escaped(text if len(text) <= limit else text[:limit] + "…")


def _field(loc: tuple[Any, ...], kind: str = "") -> str | None:
    """('body', 'mask', 0, 'matrix') -> 'mask[0].matrix'; union tags are dropped (except an
    unknown field's own name) and each name is cut to a short excerpt."""
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    for n, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in _TAGS or (kind == "extra_forbidden" and n == len(parts) - 1):
            out += ("." if out else "") + excerpt(str(part))
    return out or None


def _leaf(loc: tuple[Any, ...]) -> str:
    """The name a validator knows its field by: the last name in ``loc`` that is not a tag."""
    names = [str(p) for p in loc if isinstance(p, str) and p not in _TAGS and p != "body"]
    return names[-1] if names else ""


def _huge_integer(value: Any) -> bool:
    """Whether ``value`` is what orjson makes of an integer literal over 2^64 − 1: a float."""
    return isinstance(value, float) and math.isfinite(value) and abs(value) >= 2.0**64


def _item(err: Any) -> ErrorItem:
    """One pydantic error as an ErrorItem whose message is a sentence naming the field."""
    loc = tuple(err.get("loc", ()))
    kind = str(err.get("type", "value_error"))
    field = _field(loc, kind)
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ValueError):  # raised by our validators: already a sentence
        message, leaf = str(cause), _leaf(loc)
        if field and leaf and field != leaf and message.startswith(leaf + " "):
            message = field + message[len(leaf) :]  # "matrix row 0 …" -> "mask[0].matrix row 0 …"
        return ErrorItem(field=field, message=escaped(message), type=kind)
    msg = str(err.get("msg", "invalid value"))
    ctx = err.get("ctx") or {}
    if kind == "missing":
        msg = f"{field} is required"
    elif kind == "extra_forbidden":
        msg = f"{field} is not a field of this endpoint (check the spelling; see /docs)"
    elif kind == "string_unicode" and isinstance(err.get("input"), str):  # a name or a literal
        problem = lone_surrogate(err["input"]) or "it cannot be read"
        if not loc or isinstance(loc[-1], int) or loc[-1] in _TAGS:  # an object's field name
            msg = (
                f"{field or 'the body'} has a field name that is not valid Unicode text: {problem}"
            )
        else:
            msg = f"{field} is not valid Unicode text: {problem}"
    elif isinstance(err.get("input"), TooManyDigits):
        msg = too_many_digits(field or "the body", err["input"])
    elif kind == "int_type" and _huge_integer(err.get("input")):
        msg = (
            f"{field or 'the body'} must be a whole number below 2^63; {err['input']:g} is a float "
            "(an integer literal over 2^64 − 1 is read as one)"
        )
    elif kind == "union_tag_invalid":
        given = err.get("input")  # pydantic's ctx has the tag with lone surrogates mangled
        tag = given.get("type") if isinstance(given, dict) else ctx.get("tag")
        tags = str(ctx.get("expected_tags", "")).replace("'", "")
        name = f"{field}.type" if field else "type"
        msg = f'{name} is "{excerpt(str(tag))}", which is not one of {tags}'
    elif field:
        msg = f"{field}: {msg[0].lower()}{msg[1:]}"
    return ErrorItem(field=field, message=escaped(msg[:300]), type=kind)


def error_json(items: list[ErrorItem], extra: dict[str, str] | None = None) -> bytes:
    """The one error shape, as JSON bytes (``extra``: fields after message and errors)."""
    body = ErrorBody(
        message=items[0].message if items else "bad request", errors=items[:MAX_LISTED]
    )
    return orjson.dumps(body.model_dump() | (extra or {}))


def error_response(
    status: int, items: list[ErrorItem], extra: dict[str, str] | None = None
) -> Response:
    """The one error shape, as a JSON response."""
    return Response(error_json(items, extra), status_code=status, media_type="application/json")


def error_answer(exc: Exception, scope: Scope) -> Response | None:
    """The answer for an exception the service raises on purpose (None for any other): a
    refused request, a client gone, an input the engine refuses."""
    if isinstance(exc, RequestError):
        reason = getattr(exc, "reason", None)
        if reason:  # for the access log line (service.http.middleware)
            scope.setdefault("state", {})["reason"] = reason
        response = error_response(exc.status, exc.items, exc.extra)
        response.headers.update(exc.headers)
        return response
    if isinstance(exc, ClientGone):
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it: it names the outcome
    if isinstance(exc, AttentionInputError):
        field = "mask" if isinstance(exc, FullyMaskedRowsError) else None
        return error_response(
            422, [ErrorItem(field=field, message=str(exc), type="attention_error")]
        )
    return None


def install(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the one error shape."""

    async def _ours(request: Request, exc: Exception) -> Response:
        answer = error_answer(exc, request.scope)
        assert answer is not None  # registered for those types only
        return answer

    for kind in (RequestError, ClientGone, AttentionInputError):
        app.add_exception_handler(kind, _ours)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        error = invalid_fields(exc)  # FastAPI's own checks (query parameters of ops routes)
        return error_response(error.status, error.items)

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
