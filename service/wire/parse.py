"""A body's bytes to a validated request model: JSON (orjson, then Python's json for what orjson
refuses, so that the validators can name the field) or safetensors
(:mod:`service.wire.safetensors_in`)."""

import json
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from service.wire.errors import BodyError, invalid_fields, read_int
from service.wire.media import Format
from service.wire.safetensors_in import decode_request

M = TypeVar("M", bound=BaseModel)


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


def parse(raw: bytes, model: type[M], form: Format = "json") -> M:
    """A JSON or safetensors body to a validated request (400 for a body that is neither, 422
    for fields)."""
    data = decode_request(raw, model, load_json) if form == "safetensors" else load_json(raw)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise invalid_fields(err) from None
