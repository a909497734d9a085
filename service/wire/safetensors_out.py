"""safetensors out (API.md, "Binary arrays"): a response as one safetensors file.

The format: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the raw little-endian bytes. Every array of the JSON response is a
tensor named by its dotted path (``weights``, ``heads.0.weights``) and the rest of the
response, as JSON text, sits under ``__metadata__["json"]``. The bytes are written straight
from the arrays, a block at a time, so a response is never copied whole.
"""

import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import orjson

from service.wire.json_out import CHUNK_BYTES, encode_whole, rounded

_WRITE = {"f8": "F64", "f4": "F32", "i8": "I64", "i4": "I32", "b1": "BOOL", "u1": "U8"}


def _split(value: Any, path: str, tensors: list[tuple[str, np.ndarray]]) -> Any:
    """``value`` without its arrays, which go to ``tensors`` under their dotted paths."""
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            if isinstance(item, np.ndarray):
                tensors.append((f"{path}{key}", item))
            else:
                kept[key] = _split(item, f"{path}{key}.", tensors)
        return kept
    if isinstance(value, list) and any(isinstance(v, dict | list | np.ndarray) for v in value):
        out: list[Any] = []
        for i, item in enumerate(value):
            if isinstance(item, np.ndarray):
                tensors.append((f"{path}{i}", item))
                out.append(None)
            else:
                out.append(_split(item, f"{path}{i}.", tensors))
        return out
    return value


def _dtype_name(a: np.ndarray) -> str:
    name = _WRITE.get(f"{a.dtype.kind}{a.dtype.itemsize}")
    if name is None:  # nothing the service returns; a bug if it ever shows
        raise TypeError(f"no safetensors dtype for {a.dtype}")
    return name


def encode_safetensors(
    body: dict[str, Any],
    decimals: int | None = None,
    written: Callable[[str], None] | None = None,
) -> tuple[int, Iterator[bytes | memoryview]]:
    """``body`` as one safetensors file: its length in bytes, and its bytes as they are made
    (the header, then each array's bytes in blocks of about CHUNK_BYTES, in the order of the
    JSON response); float arrays are rounded to ``decimals`` when given.

    ``body`` is consumed as :func:`service.wire.json_out.encode` consumes it: each top-level
    value is dropped once its bytes are out, and ``written(key)`` called.
    """
    by_key: dict[str, list[tuple[str, np.ndarray]]] = {}
    rest: dict[str, Any] = {}
    for key, value in body.items():
        tensors: list[tuple[str, np.ndarray]] = []
        kept = _split({key: value}, "", tensors)
        if key in kept:
            rest[key] = kept[key]
        by_key[key] = tensors
    header: dict[str, Any] = {"__metadata__": {"json": encode_whole(rest, decimals).decode()}}
    offset = 0
    for tensors in by_key.values():
        for name, a in tensors:
            size = a.size * a.dtype.itemsize
            header[name] = {
                "dtype": _dtype_name(a),
                "shape": list(a.shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
    text = orjson.dumps(header)
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the format advises
    start = struct.pack("<Q", len(text)) + text

    def data() -> Iterator[bytes | memoryview]:
        yield start
        for key in list(body):
            del body[key]
            for _, a in by_key.pop(key):
                yield from _blocks(a, decimals)
            if written is not None:
                written(key)

    return len(start) + offset, data()


def _blocks(a: np.ndarray, decimals: int | None) -> Iterator[memoryview]:
    """The little-endian bytes of ``a`` in C order, a block of leading-axis slices at a time
    (no copy of a contiguous array unless it is rounded)."""
    if a.ndim == 0 or a.size == 0:
        yield _bytes(np.ascontiguousarray(a), decimals)
        return
    item_bytes = a.dtype.itemsize * (a.size // a.shape[0])
    if item_bytes > CHUNK_BYTES:
        for sub in a:
            yield from _blocks(sub, decimals)
        return
    step = max(1, CHUNK_BYTES // item_bytes)
    for start in range(0, a.shape[0], step):
        yield _bytes(np.ascontiguousarray(a[start : start + step]), decimals)


def _bytes(a: np.ndarray, decimals: int | None) -> memoryview:
    if decimals is not None and a.dtype.kind == "f":
        a = rounded(a, decimals)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.data.cast("B")
