"""JSON bytes straight from NumPy arrays, in chunks.

Large arrays are serialised a block of rows at a time with orjson, so a response is produced
piece by piece: it can go out on the socket while the rest is still being written, the whole
body never sits in memory at once, and no single step holds the GIL for long.
"""

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import orjson

OPTIONS = orjson.OPT_SERIALIZE_NUMPY
BLOCK_NUMBERS = 32_768  # numbers serialised per orjson call (a few ms at most)
CHUNK_BYTES = 1 << 18  # bytes handed to the server at a time (256 KiB: a shorter hold of the GIL)


# values never rounded, at any depth: a comparison reports differences smaller than the rounding
EXACT = frozenset({"comparison"})


def encode_whole(body: Any, decimals: int | None = None) -> bytes:
    """The JSON of a small value in one orjson call (what :func:`encode` yields, joined)."""
    if decimals is not None and isinstance(body, dict):
        body = {k: v if k in EXACT else _rounded(v, decimals) for k, v in body.items()}
    elif decimals is not None:
        body = _rounded(body, decimals)
    return orjson.dumps(body, option=OPTIONS, default=_contiguous)


WHOLE = 2.0**52  # a float64 at least this large has no fraction: rounding leaves it as it is


def rounded(a: np.ndarray, decimals: int) -> np.ndarray:
    """``a`` rounded to ``decimals``: np.round, except for numbers too large to have decimals,
    kept as they are (np.round computes x·10^decimals, which overflows to ∞ and came back as
    NaN, sent as null, for a finite 1.7e308)."""
    with np.errstate(over="ignore", invalid="ignore"):  # the huge ones are put back below
        out = np.round(a, decimals)
    huge = np.abs(a) >= WHOLE  # ±∞ included: they stay ±∞
    if huge.any():
        out[huge] = a[huge]
    return out


def _rounded(value: Any, decimals: int) -> Any:
    """A copy of ``value`` with its float arrays and floats rounded."""
    if isinstance(value, np.ndarray):
        return rounded(value, decimals) if value.dtype.kind == "f" else value
    if isinstance(value, dict):
        return {k: v if k in EXACT else _rounded(v, decimals) for k, v in value.items()}
    if isinstance(value, list) and any(isinstance(v, np.ndarray | dict) for v in value):
        return [_rounded(v, decimals) for v in value]
    if isinstance(value, float):
        return round(value, decimals)
    return value


def _contiguous(value: Any) -> Any:
    """orjson's fallback: it serialises only C-contiguous arrays of one dimension or more itself
    (head slices are views)."""
    if isinstance(value, np.ndarray):  # a 0-d one is a number (orjson takes no 0-d arrays)
        return value.item() if value.ndim == 0 else np.ascontiguousarray(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def encode(
    body: dict[str, Any],
    decimals: int | None = None,
    written: Callable[[str], None] | None = None,
) -> Iterator[bytes]:
    """Yield the JSON of ``body`` in chunks of about CHUNK_BYTES; arrays become nested lists,
    −∞ and NaN become null (orjson), float arrays are rounded to ``decimals`` when given.

    ``body`` is consumed: each top-level value is dropped from it once written (and
    ``written(key)`` called), so its memory can go back while the rest streams out.
    """
    pieces: list[bytes | memoryview] = []
    size = 0
    for piece in _consumed(body, decimals, written):
        pieces.append(piece)
        size += len(piece)
        if size >= CHUNK_BYTES:
            yield pieces[0] if len(pieces) == 1 else b"".join(pieces)  # type: ignore[misc]
            pieces, size = [], 0
    if pieces:
        yield b"".join(pieces)


def _consumed(
    body: dict[str, Any], decimals: int | None, written: Callable[[str], None] | None
) -> Iterator[bytes | memoryview]:
    """The top-level object, each value popped before it is written and forgotten after."""
    yield b"{"
    for i, key in enumerate(list(body)):
        value = body.pop(key)
        yield (b',"' if i else b'"') + key.encode() + b'":'
        yield from _value(value, None if key in EXACT else decimals)
        del value
        if written is not None:
            written(key)
    yield b"}"


def _value(value: Any, decimals: int | None) -> Iterator[bytes | memoryview]:
    if isinstance(value, np.ndarray):
        yield from _array(value, decimals)
    elif not _big(value):
        yield encode_whole(value, decimals)
    elif isinstance(value, dict):
        yield b"{"
        for i, (key, item) in enumerate(value.items()):
            yield (b',"' if i else b'"') + key.encode() + b'":'
            yield from _value(item, None if key in EXACT else decimals)
        yield b"}"
    else:
        yield b"["
        for i, item in enumerate(value):
            if i:
                yield b","
            yield from _value(item, decimals)
        yield b"]"


def _big(value: Any) -> bool:
    """Whether ``value`` holds an array worth streaming (lists of plain values never do)."""
    if isinstance(value, np.ndarray):
        return value.size > BLOCK_NUMBERS
    if isinstance(value, dict):
        return any(_big(v) for v in value.values())
    if isinstance(value, list):
        return any(_big(v) for v in value if isinstance(v, np.ndarray | dict | list))
    return False


def _array(a: np.ndarray, decimals: int | None) -> Iterator[bytes | memoryview]:
    """An array as nested JSON lists, a block of leading-axis slices per orjson call."""
    if a.size <= BLOCK_NUMBERS or a.ndim == 1:
        yield _dump(a, decimals)
        return
    per_item = a.size // a.shape[0]
    if per_item > BLOCK_NUMBERS:  # one item is itself big: recurse into it
        yield b"["
        for i in range(a.shape[0]):
            if i:
                yield b","
            yield from _array(a[i], decimals)
        yield b"]"
        return
    step = max(1, BLOCK_NUMBERS // per_item)
    yield b"["
    for start in range(0, a.shape[0], step):
        if start:
            yield b","
        block = _dump(a[start : start + step], decimals)
        yield memoryview(block)[1:-1]  # the block's rows without its brackets, not copied
    yield b"]"


def _dump(a: np.ndarray, decimals: int | None) -> bytes:
    if decimals is not None and a.dtype.kind == "f":
        a = rounded(a, decimals)
    return orjson.dumps(a, option=OPTIONS, default=_contiguous)  # a view, a 0-d array: _contiguous
