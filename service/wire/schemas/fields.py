"""Field types: JSON arrays checked and converted to float64 by :mod:`service.wire.arrays`, with
the JSON schema /docs shows for them."""

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Discriminator,
    Field,
    PlainValidator,
    Strict,
    Tag,
    ValidationInfo,
    WithJsonSchema,
)

from service.core.types import Array, BoolArray
from service.wire.arrays import to_additive_matrix, to_array, to_bool_matrix
from service.wire.errors import excerpt, lone_surrogate

_NUM: dict[str, Any] = {"type": "number"}
_ROW: dict[str, Any] = {"type": "array", "items": _NUM, "minItems": 1}
_MATRIX: dict[str, Any] = {"type": "array", "items": _ROW, "minItems": 1}
_BATCH: dict[str, Any] = {"type": "array", "items": _MATRIX, "minItems": 1}
_NULLABLE_ROW: dict[str, Any] = {"type": "array", "items": {"type": ["number", "null"]}}
_NULLABLE_MATRIX: dict[str, Any] = {"type": "array", "items": _NULLABLE_ROW}
_BOOL_ROW: dict[str, Any] = {"type": "array", "items": {"type": ["boolean", "integer"]}}
_BOOL_MATRIX: dict[str, Any] = {"type": "array", "items": _BOOL_ROW}


def _name(info: ValidationInfo) -> str:
    """The field's name, for messages."""
    return info.field_name or "value"


def _text(value: str, info: ValidationInfo) -> str:
    """Refuse a string that cannot be written back as UTF-8 (Python's json reads a lone
    surrogate, orjson cannot write it): every free-text field is checked here."""
    problem = lone_surrogate(value)
    if problem:
        raise ValueError(f"{_name(info)} is not valid Unicode text: {problem}")
    return value


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


def _padding_flags(value: Any, info: ValidationInfo) -> BoolArray:
    return to_bool_matrix(
        value, _name(info), (1, 2), "[S] (or [B][S]) of true/false or 1/0, true = padding"
    )


def _heads(value: Any, info: ValidationInfo) -> Array:
    return to_array(
        value,
        _name(info),
        (3, 4),
        "heads [h][n][d] (rows of numbers per head) or a batch [B][h][n][d]",
    )


def _norm_weight(value: Any, info: ValidationInfo) -> Array:
    return to_array(value, _name(info), (1, 2), "[d_k], [h·d_k] or one row per head [h][d_k]")


def _table(value: Any, info: ValidationInfo) -> Array:
    return to_array(value, _name(info), (1, 2), "num_buckets rows of one number per head")


def _additive_matrix(value: Any, info: ValidationInfo) -> Array:
    return to_additive_matrix(value, _name(info))


def _positional(value: Any, info: ValidationInfo) -> Literal["sinusoidal"] | Array:
    if isinstance(value, str) and value == "sinusoidal":
        return "sinusoidal"
    if isinstance(value, str):
        raise ValueError(
            f'positional_encoding must be "sinusoidal" or a matrix [L][d_model], got "{excerpt(value, 20)}"'
        )
    return to_array(value, _name(info), (2,), 'a matrix [L][d_model], or "sinusoidal"')


def _grad_output(value: Any, info: ValidationInfo) -> Literal["sum"] | Array:
    """∂loss/∂(the answer's last array), or "sum" (every entry 1): the backward's seed."""
    if isinstance(value, str) and value == "sum":
        return "sum"
    if isinstance(value, str):
        raise ValueError(
            f'grad_output must be "sum" or an array shaped as the answer\'s last array, got '
            f'"{excerpt(value, 20)}"'
        )
    return to_array(
        value,
        _name(info),
        (2, 3),
        'an array shaped as the answer\'s last array ([L][d] or a batch [B][L][d]), or "sum"',
    )


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
PaddingFlags = Annotated[
    BoolArray,
    PlainValidator(_padding_flags),
    WithJsonSchema({"anyOf": [_BOOL_ROW, {"type": "array", "items": _BOOL_ROW}]}),
]
Heads = Annotated[
    Array,
    PlainValidator(_heads),
    WithJsonSchema({"anyOf": [_BATCH, {"type": "array", "items": _BATCH}]}),
]
# a q/k norm's weight or bias: shared [d_k], the projection's [h·d_k], or per head [h][d_k]
NormWeight = Annotated[
    Array, PlainValidator(_norm_weight), WithJsonSchema({"anyOf": [_ROW, _MATRIX]})
]
Table = Annotated[Array, PlainValidator(_table), WithJsonSchema({"anyOf": [_ROW, _MATRIX]})]
Positional = Annotated[
    Literal["sinusoidal"] | Array,
    PlainValidator(_positional),
    WithJsonSchema({"anyOf": [{"type": "string", "enum": ["sinusoidal"]}, _MATRIX]}),
]
GradOutput = Annotated[
    Literal["sum"] | Array,
    PlainValidator(_grad_output),
    WithJsonSchema({"anyOf": [{"type": "string", "enum": ["sum"]}, _MATRIX, _BATCH]}),
]
Text = Annotated[str, AfterValidator(_text)]  # every free-text field: tokens, sentence, names
# JSON's true and false are not numbers (JSON Schema's integer and number exclude them): lax
# mode would read them as 1 and 0, and "3" as 3; strict mode refuses them, and 3.5 or 3.0 where
# an integer belongs. A JSON integer is still accepted where a number belongs.
Int = Annotated[int, Strict()]
FiniteFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]


def _lengths_branch(value: Any) -> str:
    """Which form of key/query lengths the input is: a list, or one integer (or null)."""
    return "each" if isinstance(value, list) else "none" if value is None else "one"


_MAX_LENGTHS = 4096
Lengths = Annotated[
    Annotated[Int, Tag("one")]
    | Annotated[list[Annotated[Int, Field(ge=0)]], Field(max_length=_MAX_LENGTHS), Tag("each")]
    | Annotated[None, Tag("none")],
    Discriminator(_lengths_branch),  # errors come from the form the input has, not from both
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer"},
                {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0},
                    "maxItems": _MAX_LENGTHS,
                },
                {"type": "null"},
            ]
        }
    ),
]
