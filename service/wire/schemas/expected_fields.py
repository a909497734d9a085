"""The comparison fields of a compute request: ``expected`` (the caller's own arrays) and
``tolerance``. Checked against the request's outputs by :mod:`service.trace.comparison`."""

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    Field,
    PlainValidator,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)

from service.core.types import Array
from service.wire.arrays import to_nullable_array
from service.wire.errors import excerpt
from service.wire.schemas.fields import FiniteFloat
from service.wire.schemas.mask_fields import STRICT

MAX_EXPECTED_NAMES = 64
MAX_STATE_NAME = 200  # characters in a grad_state_dict name (a module's dotted path)
NEG_INF_NAMES = frozenset({"masked_scores", "additive_mask"})  # null is −∞ there, NaN elsewhere
STATE_DICT = "grad_state_dict"  # its expected entries are an object under the request's names
SCALARS = frozenset({"grad_sinks"})  # a single sink's gradient is a number (0-d)


@dataclass(frozen=True)
class Expected:
    """The caller's arrays by output name, as the response would shape them; ``heads`` holds
    /multihead's per-head arrays by head index."""

    arrays: dict[str, Array] = field(default_factory=dict)
    heads: dict[int, dict[str, Array]] = field(default_factory=dict)
    # grad_state_dict's entries by the names the request gave the parameters (q_proj.weight)
    state_dict: dict[str, Array] = field(default_factory=dict)


def _array(value: Any, name: str, key: str, scalar: bool = False) -> Array:
    """One expected array: numbers, null (−∞ in masked scores, NaN elsewhere), and true/false
    in a mask; a number where a parameter's gradient may be one (``scalar``: a single sink's)."""
    null = -np.inf if key in NEG_INF_NAMES else np.nan
    if (
        (scalar or key in SCALARS)
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    ):
        return _array([value], name, key).reshape(())
    return to_nullable_array(
        value,
        name,
        (0, 1, 2, 3, 4) if scalar or key in SCALARS else (1, 2, 3, 4),
        "an array shaped as the response returns it",
        null,
        "use null for a masked score or NaN; ",
        booleans=key == "mask",
    )


def _names(value: Any, where: str, longest: int = 40, what: str = "output") -> dict[str, Any]:
    """An object of output names (or parameters' names), not too many, each a short string."""
    if not isinstance(value, dict):
        kind = "a list" if isinstance(value, list) else "a value"
        raise ValueError(f"{where} must be an object of {what} names and arrays, got {kind}")
    if len(value) > MAX_EXPECTED_NAMES:
        raise ValueError(f"{where} has {len(value)} names; at most {MAX_EXPECTED_NAMES}")
    for key in value:
        if len(key) > longest:
            raise ValueError(f'{where} names "{excerpt(key, 40)}", which is not an {what}')
    return value


def _state_dict(value: Any) -> dict[str, Array]:
    """expected.grad_state_dict: {a parameter's name as the request gave it: its gradient},
    as the answer's grad_state_dict holds them (a sink's may be a number)."""
    where = f"expected.{STATE_DICT}"
    items = _names(value, where, MAX_STATE_NAME, "parameter").items()
    return {k: _array(a, f"{where}.{k}", k, scalar=True) for k, a in items}


def _expected(value: Any, info: ValidationInfo) -> Expected:
    arrays: dict[str, Array] = {}
    heads: dict[int, dict[str, Array]] = {}
    state_dict: dict[str, Array] = {}
    for key, item in _names(value, "expected").items():
        if key == STATE_DICT:
            state_dict = _state_dict(item)
            continue
        if key != "heads":
            arrays[key] = _array(item, f"expected.{key}", key)
            continue
        if not isinstance(item, list):
            raise ValueError("expected.heads must be a list with one object (or null) per head")
        for i, head in enumerate(item):
            if head is not None:
                per_head = _names(head, f"expected.heads[{i}]").items()
                heads[i] = {k: _array(a, f"expected.heads[{i}].{k}", k) for k, a in per_head}
    return Expected(arrays, heads, state_dict)


_ANY_ARRAY: dict[str, Any] = {"type": "array", "items": {}}
_ARRAY_OR_NUMBER: dict[str, Any] = {"anyOf": [_ANY_ARRAY, {"type": "number"}]}
ExpectedArrays = Annotated[
    Expected,
    PlainValidator(_expected),
    WithJsonSchema(
        {
            "type": "object",
            "additionalProperties": _ANY_ARRAY,
            "properties": {
                STATE_DICT: {"type": "object", "additionalProperties": _ARRAY_OR_NUMBER},
                **{name: _ARRAY_OR_NUMBER for name in sorted(SCALARS)},
                "heads": {
                    "type": "array",
                    "items": {"type": ["object", "null"], "additionalProperties": _ANY_ARRAY},
                },
            },
        }
    ),
]


class ToleranceOptions(BaseModel):
    """When a caller's number y matches the service's x: |y − x| ≤ atol + rtol·|x|."""

    model_config = STRICT

    atol: FiniteFloat = Field(1e-6, ge=0, description="absolute tolerance")
    rtol: FiniteFloat = Field(1e-6, ge=0, description="relative tolerance")
    precision: Literal["bfloat16", "float16", "float32"] | None = Field(
        None,
        description="judge your numbers as a kernel in this type is judged: they match when "
        "their largest error against ours is at most twice that of the same attention computed "
        "in the type (inputs and each step's result rounded to it, float32 arithmetic) plus "
        "the type's atol (bfloat16 and float16 1e-3, float32 1e-5); not with atol or rtol",
    )

    @model_validator(mode="after")
    def _one_rule(self) -> "ToleranceOptions":
        given = self.model_fields_set & {"atol", "rtol"}
        if self.precision is not None and given:
            raise ValueError(
                f"precision sets its own rule (twice the error of a {self.precision} "
                f"computation plus its atol): leave out {' and '.join(sorted(given))}"
            )
        return self
