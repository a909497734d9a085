"""Field types: JSON arrays checked and converted to float64 by :mod:`service.api.arrays`, with
the JSON schema /docs shows for them."""

from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, ValidationInfo, WithJsonSchema

from service.api.arrays import to_additive_matrix, to_array, to_bool_matrix
from service.core.types import Array, BoolArray

_NUM: dict[str, Any] = {"type": "number"}
_ROW: dict[str, Any] = {"type": "array", "items": _NUM, "minItems": 1}
_MATRIX: dict[str, Any] = {"type": "array", "items": _ROW, "minItems": 1}
_BATCH: dict[str, Any] = {"type": "array", "items": _MATRIX, "minItems": 1}
_NULLABLE_ROW: dict[str, Any] = {"type": "array", "items": {"type": ["number", "null"]}}
_NULLABLE_MATRIX: dict[str, Any] = {"type": "array", "items": _NULLABLE_ROW}
_BOOL_ROW: dict[str, Any] = {"type": "array", "items": {"type": ["boolean", "integer"]}}
_BOOL_MATRIX: dict[str, Any] = {"type": "array", "items": _BOOL_ROW}


def _name(info: ValidationInfo) -> str:
    return info.field_name or "value"


def _sequence(value: Any, info: ValidationInfo) -> Array:
    return to_array(
        value, _name(info), (2, 3), "a matrix [L][d] (rows of numbers) or a batch [B][L][d]"
    )


def _matrix(value: Any, info: ValidationInfo) -> Array:
    return to_array(
        value, _name(info), (2,), "a matrix (rows of numbers); weights are never batched"
    )


def _vector(value: Any, info: ValidationInfo) -> Array:
    return to_array(value, _name(info), (1,), "a list of numbers")


def _bool_matrix(value: Any, info: ValidationInfo) -> BoolArray:
    return to_bool_matrix(value, _name(info))


def _additive_matrix(value: Any, info: ValidationInfo) -> Array:
    return to_additive_matrix(value, _name(info))


def _positional(value: Any, info: ValidationInfo) -> Literal["sinusoidal"] | Array:
    if value == "sinusoidal":
        return "sinusoidal"
    if isinstance(value, str):
        raise ValueError(
            f'positional_encoding must be "sinusoidal" or a matrix [L][d_model], got "{value[:20]}"'
        )
    return to_array(value, _name(info), (2,), 'a matrix [L][d_model], or "sinusoidal"')


Sequence = Annotated[Array, PlainValidator(_sequence), WithJsonSchema({"anyOf": [_MATRIX, _BATCH]})]
Matrix = Annotated[Array, PlainValidator(_matrix), WithJsonSchema(_MATRIX)]
Vector = Annotated[Array, PlainValidator(_vector), WithJsonSchema(_ROW)]
BoolMatrix = Annotated[
    BoolArray,
    PlainValidator(_bool_matrix),
    WithJsonSchema({"anyOf": [_BOOL_MATRIX, {"type": "array", "items": _BOOL_MATRIX}]}),
]
AdditiveMatrix = Annotated[
    Array,
    PlainValidator(_additive_matrix),
    WithJsonSchema({"anyOf": [_NULLABLE_MATRIX, {"type": "array", "items": _NULLABLE_MATRIX}]}),
]
Positional = Annotated[
    Literal["sinusoidal"] | Array,
    PlainValidator(_positional),
    WithJsonSchema({"anyOf": [{"type": "string", "enum": ["sinusoidal"]}, _MATRIX]}),
]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Lengths = int | Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=4096)]
