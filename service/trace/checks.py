"""Small checks the rules share (:mod:`service.trace.rules`, :mod:`service.trace.rows.weight_forms`,
:mod:`service.trace.rows.variants`): a weight against the width it multiplies, a stated size
against the one the arrays imply, a bias's length; and how settings written as true/false or
an options object are read."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from pydantic import BaseModel

from service.core.errors import AttentionInputError
from service.core.types import Array
from service.wire.errors import FieldError
from service.wire.schemas.requests import InputFields

M = TypeVar("M", bound=BaseModel)
# a state dict's field names as the caller writes them (q_proj.weight), for messages
DOTTED = {
    f"{n}_{p}": f"{n}.{p}"
    for n in (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "q_norm",
        "k_norm",
        "q_a_proj",
        "q_a_layernorm",
        "q_b_proj",
        "kv_a_proj_with_mqa",
        "kv_a_layernorm",
        "kv_b_proj",
    )
    for p in ("weight", "bias")
}


def weight_out(req: InputFields, name: str, w: Array, width: int, source: str | None = None) -> int:
    """Check a weight's input size (rows in in_out, columns in out_in) against ``width``,
    the width of what it multiplies (``source`` says what that is; default x / d_model);
    return its output size."""
    rows, cols = w.shape
    d_in, d_out = (rows, cols) if req.weight_layout == "in_out" else (cols, rows)
    if d_in != width:
        side = "rows" if req.weight_layout == "in_out" else "columns"
        if source is None:
            source = f"x has {width} columns" if req.x is not None else f"d_model is {width}"
        raise FieldError(
            name,
            f"{name} is {rows}×{cols} but {source}: with weight_layout {req.weight_layout} "
            f"{name} must have {width} {side}",
        )
    return int(d_out)


def check_size(given: int | None, name: str, found: int, what: str) -> None:
    """A size the request states (d_k, d_v) must agree with the one its arrays imply."""
    if given is not None and given != found:
        raise FieldError(name, f"{name} is {given} but {what} {found}")


def check_bias(b: Array | None, name: str, size: int, of: str) -> None:
    if b is not None and b.shape[0] != size:
        raise FieldError(name, f"{name} has {b.shape[0]} entries but {of} has width {size}")


def lengths(value: int | list[int] | None) -> tuple[int, ...] | None:
    """One int or a list, as a tuple."""
    if value is None:
        return None
    return (value,) if isinstance(value, int) else tuple(value)


def batch_words(batch: int | None) -> str:
    return "unbatched" if batch is None else f"a batch of {batch}"


@contextmanager
def engine_rule(field: str) -> Iterator[None]:
    """The engine's own check of a setting, reported on the field that holds it."""
    try:
        yield
    except AttentionInputError as err:
        raise FieldError(field, str(err)) from None


def options(setting: bool | M, model: type[M]) -> M | None:
    """A setting written as true/false or an options object, as its options: the object itself,
    every default for true, None for false."""
    if isinstance(setting, model):
        return setting
    return model() if setting else None
