"""safetensors in and out (API.md, "Binary arrays").

The format: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the raw little-endian bytes. A response puts every array of the JSON
response in it as a tensor named by its dotted path (``weights``, ``heads.0.weights``) and the
rest of the response, as JSON text, under ``__metadata__["json"]``; a request does the same with
the request's fields. The bytes are written straight from the arrays, a block at a time, so a
response is never copied whole.
"""

import math
import re
import struct
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import AliasChoices, BaseModel

from service.api.encode import CHUNK_BYTES, encode_whole
from service.api.errors import BodyError, FieldError, excerpt

MEDIA_TYPE = "application/x-safetensors"
JSON_TYPE = "application/json"
Format = Literal["json", "safetensors"]

# dtype names of the format, and how each is read; BF16 is the upper half of a float32
_READ: dict[str, str] = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
}
_WRITE = {"f8": "F64", "f4": "F32", "i8": "I64", "i4": "I32", "b1": "BOOL", "u1": "U8"}
MAX_SEGMENTS = 6  # a tensor name's dotted parts: "expected.heads.0.weights" has 4
MAX_INDEX = 4096  # a list index in a tensor name (heads, masks)
MAX_NAME = 200  # characters in a tensor name


# ------------------------------------------------------------------------ Content-Type, Accept


def body_form(content_type: str) -> Format | None:
    """The form of a body by its ``Content-Type``: JSON (``application/json`` or any
    ``application/…+json``), safetensors, or None (415)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == JSON_TYPE or (media.startswith("application/") and media.endswith("+json")):
        return "json"
    return "safetensors" if media == MEDIA_TYPE else None


def negotiate(accept: str | None) -> Format | None:
    """The response format an ``Accept`` header asks for: the type with the highest q that
    names it most specifically, the earlier one on a tie; JSON when there is no header; None
    when it names neither (406)."""
    if not accept or accept == "*/*" or accept == JSON_TYPE:
        return "json"
    # format -> (q, specificity, -position, JSON first on a full tie)
    best: dict[Format, tuple[float, int, int, bool]] = {}
    for position, part in enumerate(accept.split(",")):
        media, _, params = part.partition(";")
        media = media.strip().lower()
        q = _quality(params)
        for form, full in (("json", JSON_TYPE), ("safetensors", MEDIA_TYPE)):
            specificity = _matches(media, full)
            if specificity < 0:
                continue
            known = best.get(form)  # type: ignore[call-overload]
            if known is None or specificity > known[1]:  # the most specific range decides
                best[form] = (q, specificity, -position, form == "json")  # type: ignore[index]
    wanted = [(v, f) for f, v in best.items() if v[0] > 0]
    return max(wanted)[1] if wanted else None


def _quality(params: str) -> float:
    """The q of a media range's parameters (1 when absent, 0 when unreadable)."""
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def _matches(media: str, full: str) -> int:
    """How specifically ``media`` names ``full``: 2 exactly, 1 as type/*, 0 as */*, −1 not."""
    if media == full:
        return 2
    if media == full.split("/")[0] + "/*":
        return 1
    return 0 if media == "*/*" else -1


# ------------------------------------------------------------------------------- responses


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

    ``body`` is consumed as :func:`service.api.encode.encode` consumes it: each top-level
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
        a = np.round(a, decimals)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.data.cast("B")


# -------------------------------------------------------------------------------- requests


def decode_request(
    raw: bytes, model: type[BaseModel], read_json: Callable[[bytes], Any]
) -> dict[str, Any]:
    """A safetensors request body as the JSON object it stands for: the fields under
    ``__metadata__["json"]``, with each tensor put at the place its name gives.

    A float tensor becomes a float64 array (F32, F16 and BF16 exactly), a BOOL tensor a boolean
    array, an integer tensor a list of ints (for positions and lengths; numbers anywhere else),
    a 0-d tensor a number. The fields' validators then check them as they check JSON, and
    ``read_json`` (the JSON bodies' reader) reads the metadata.
    """
    header, data = _header(raw)
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise BodyError("__metadata__ must be an object of strings", "safetensors")
    fields = read_json(meta["json"].encode()) if "json" in meta else {}
    if not isinstance(fields, dict):
        raise BodyError('__metadata__["json"] must hold a JSON object', "safetensors")
    top = _top_level_names(model)
    for name, dtype, shape, begin, end in _entries(header, len(data)):
        value = _value(name, dtype, shape, data[begin:end])
        _place(fields, name, value, top)
    return fields


def _header(raw: bytes) -> tuple[dict[str, Any], memoryview]:
    """The header object and the data after it."""
    if len(raw) < 8:
        raise BodyError(f"it has {len(raw)} bytes, fewer than the 8 of the header's length", "safetensors")  # fmt: skip
    (length,) = struct.unpack("<Q", raw[:8])
    if length > len(raw) - 8:
        raise BodyError(
            f"the header is said to be {length:,} bytes long but the body has only "
            f"{len(raw) - 8:,} after the length",
            "safetensors",
        )
    try:
        header = orjson.loads(raw[8 : 8 + length])
    except orjson.JSONDecodeError as err:
        raise BodyError(f"the header is not JSON ({err})", "safetensors") from None
    if not isinstance(header, dict):
        raise BodyError("the header must be a JSON object", "safetensors")
    return header, memoryview(raw)[8 + length :]


def _entries(header: dict[str, Any], size: int) -> list[tuple[str, str, list[int], int, int]]:
    """The tensors' (name, dtype, shape, begin, end), checked to tile the data exactly."""
    entries = []
    for name, info in header.items():
        where = f'tensor "{excerpt(name, 60)}"'
        if len(name) > MAX_NAME:
            raise BodyError(f"{where} has a name of {len(name)} characters; at most {MAX_NAME}", "safetensors")  # fmt: skip
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise BodyError(f"{where} must have exactly dtype, shape and data_offsets", "safetensors")  # fmt: skip
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or not _counts(shape) or not _counts(offsets, 2):
            raise BodyError(f"{where}: dtype must be a string, shape a list of sizes and data_offsets two byte offsets", "safetensors")  # fmt: skip
        if dtype not in _READ:
            raise FieldError(
                _json_name(name),
                f"{_json_name(name)} is a {excerpt(dtype, 20)} tensor; send F64 (or F32, F16, "
                "BF16, an integer type, or BOOL for a mask)",
            )
        begin, end = offsets
        expected = math.prod(shape) * np.dtype(_READ[dtype]).itemsize
        if end - begin != expected:
            raise BodyError(f"{where} is {dtype} shaped {shape}, which takes {expected:,} bytes, but its data_offsets span {end - begin:,}", "safetensors")  # fmt: skip
        entries.append((name, dtype, shape, begin, end))
    at = 0
    for name, *_, begin, end in sorted(entries, key=lambda e: (e[3], e[4])):
        if begin != at:
            raise BodyError(f'tensor "{excerpt(name, 60)}" starts at byte {begin:,} of the data, but the one before ends at {at:,} (tensors must follow each other with no gap or overlap)', "safetensors")  # fmt: skip
        at = end
    if at != size:
        raise BodyError(f"the tensors end at byte {at:,} of the data, but it has {size:,} bytes", "safetensors")  # fmt: skip
    return entries


def _counts(value: Any, length: int | None = None) -> bool:
    """Whether ``value`` is a list of non-negative integers (of ``length`` items if given)."""
    return (
        isinstance(value, list)
        and (length is None or len(value) == length)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)
    )


def _value(name: str, dtype: str, shape: list[int], data: memoryview) -> Any:
    """One tensor as a field's value (see :func:`decode_request`)."""
    a = np.frombuffer(data, dtype=_READ[dtype]).reshape(shape)
    if dtype == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    if a.dtype.kind in "iu":
        return a.tolist()
    if a.dtype.kind == "b":
        out: Any = a.copy()
    else:
        out = a.astype(np.float64)  # a copy: the body's bytes are not kept
    return out.item() if out.ndim == 0 else out


def _json_name(name: str) -> str:
    """A tensor name as error messages write the field: mask.0.matrix -> mask[0].matrix."""
    return excerpt(re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", name), 60)


@lru_cache(maxsize=8)
def _top_level_names(model: type[BaseModel]) -> frozenset[str]:
    """The field names a request model takes at its top level, aliases included."""
    names = set()
    for field_name, info in model.model_fields.items():
        names.add(field_name)
        alias = info.validation_alias
        if isinstance(alias, str):
            names.add(alias)
        elif isinstance(alias, AliasChoices):
            names.update(c for c in alias.choices if isinstance(c, str))
    return frozenset(names)


def _place(fields: dict[str, Any], name: str, value: Any, top: frozenset[str]) -> None:
    """Put ``value`` into ``fields`` at the place the tensor ``name`` gives: a top-level field
    name as it is (``q_proj.weight``), else a dotted path (``mask.0.matrix``)."""
    shown = _json_name(name)
    if name in top or "." not in name:
        parts = [name]
    elif name.split(".", 1)[0] not in top:  # e.g. q_proj.weight sent to /attention
        raise FieldError(shown, f"{shown} is not a field of this endpoint (check the spelling; see /docs)")  # fmt: skip
    else:
        parts = name.split(".")
        if len(parts) > MAX_SEGMENTS or "" in parts:
            raise FieldError(shown, f'tensor "{shown}" does not name a field')
    node: Any = fields
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= MAX_INDEX:
                raise FieldError(shown, f'tensor "{shown}": {part!r} is not an index of a list here (0 to {MAX_INDEX - 1})')  # fmt: skip
            index = int(part)
            node.extend({} for _ in range(index + 1 - len(node)))
            if last:
                _set(node, index, value, shown)
            else:
                node[index] = _container(node[index], parts[i + 1], shown)
                node = node[index]
        elif isinstance(node, dict):
            if part.isdigit() and part not in node and i and int(part) == 0:
                continue  # mask.0.matrix for a single mask object: the object is item 0
            if last:
                _set(node, part, value, shown)
            else:
                node[part] = _container(node.get(part), parts[i + 1], shown)
                node = node[part]
        else:
            raise FieldError(shown, f'tensor "{shown}" does not name a field')


def _container(value: Any, next_part: str, shown: str) -> Any:
    """The object or list a tensor's path goes through: the one the JSON gave, or a new one
    (``true`` stands for an object of defaults, as in ``layer_norm: true``)."""
    if value is None or value is True:
        return [] if next_part.isdigit() else {}
    if isinstance(value, dict | list):
        return value
    raise FieldError(shown, f'tensor "{shown}" goes inside a field that the JSON gives as a plain value')  # fmt: skip


def _set(node: Any, key: Any, value: Any, shown: str) -> None:
    """Set one place, refusing a field given both in the JSON and as a tensor."""
    existing = node[key] if isinstance(node, list) else node.get(key)
    if existing is not None and existing != {}:
        raise FieldError(shown, f"{shown} is given twice: as a tensor and in the JSON metadata")
    node[key] = value
