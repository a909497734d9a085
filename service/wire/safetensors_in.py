"""safetensors in (API.md, "Binary arrays"): a request body in safetensors as the JSON object
it stands for.

The format: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the raw little-endian bytes. A request names each array by its
field's dotted path (``x``, ``q_proj.weight``, ``mask.0.matrix``) and puts every other field,
as JSON text, under ``__metadata__["json"]``. Every size in the header is checked before
anything is allocated (the limits below).
"""

import json
import math
import re
import struct
from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
from pydantic import AliasChoices, BaseModel

from service.wire.errors import (
    BodyError,
    FieldError,
    LimitError,
    TooManyDigits,
    excerpt,
    lone_surrogate,
)
from service.wire.schemas.requests import PER_HEAD_NORM

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
MAX_SEGMENTS = 6  # a tensor name's dotted parts: "expected.heads.0.weights" has 4
MAX_INDEX = 4096  # a list index in a tensor name (heads, masks)
MAX_NAME = 200  # characters in a tensor name
# tensors in one request: more than any request has (1,024 heads × 6 weights and biases, 64
# masks, 64 expected outputs and 64 per head of 128 heads, the top-level fields); the header is
# refused as soon as its parse passes this many objects, so a huge one costs no more than this
MAX_TENSORS = 16_384
MAX_DIMS = 8  # dimensions of a tensor (the service's arrays have at most 4; NumPy's cap is 64)
MAX_NUMBERS = 2**31 - 1  # a tensor's dimensions multiplied, zeros left out
U64 = 2**64  # the format's sizes and offsets are unsigned 64-bit


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
    text = meta.get("json")
    problem = None if text is None else lone_surrogate(text)
    if problem:
        raise BodyError(f'__metadata__["json"] is not valid Unicode text: {problem}', "safetensors")
    fields = read_json(text.encode()) if text is not None else {}
    if not isinstance(fields, dict):
        raise BodyError('__metadata__["json"] must hold a JSON object', "safetensors")
    entries = _entries(header, len(data))
    tree = _Tree(fields, _top_level_names(model), len(entries))
    for name, dtype, shape, begin, end in entries:
        tree.place(name, _value(name, dtype, shape, data[begin:end]))
    return fields


def _header(raw: bytes) -> tuple[dict[str, Any], memoryview]:
    """The header object and the data after it. The header is read in one linear pass that
    stops as soon as it holds more objects than MAX_TENSORS allows (413), and refuses a name
    given twice in one object (400): JSON readers keep the last, which would hide a tensor."""
    if len(raw) < 8:
        raise BodyError(
            f"it has {len(raw)} bytes, fewer than the 8 of the header's length", "safetensors"
        )
    (length,) = struct.unpack("<Q", raw[:8])
    if length > len(raw) - 8:
        raise BodyError(
            f"the header is said to be {length:,} bytes long but the body has only "
            f"{len(raw) - 8:,} after the length",
            "safetensors",
        )
    try:
        text = str(memoryview(raw)[8 : 8 + length], "utf-8")
    except UnicodeDecodeError as err:
        raise BodyError(
            f"the header is not UTF-8 text ({err.reason} at byte {err.start:,} of it)",
            "safetensors",
        ) from None
    objects = 0

    def made(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal objects
        objects += 1  # the header, __metadata__ and one per tensor
        if objects > MAX_TENSORS + 2 or (
            len(pairs) > MAX_TENSORS
            and len(pairs) - sum(k == "__metadata__" for k, _ in pairs) > MAX_TENSORS
        ):
            raise _too_many()
        out = dict(pairs)
        if len(out) != len(pairs):
            counted = Counter(k for k, _ in pairs)
            twice = next(k for k, _ in pairs if counted[k] > 1)
            raise BodyError(
                f'the header gives "{excerpt(twice, 60)}" twice in one object (each tensor needs a name of its own, and one dtype, shape and data_offsets)',
                "safetensors",
            )
        return out

    try:
        header = json.loads(text, object_pairs_hook=made, parse_int=_integer)
    except RecursionError:
        raise BodyError("the header is nested too deeply", "safetensors") from None
    except ValueError as err:  # json.JSONDecodeError
        raise BodyError(f"the header is not JSON ({err})", "safetensors") from None
    if not isinstance(header, dict):
        raise BodyError("the header must be a JSON object", "safetensors")
    return header, memoryview(raw)[8 + length :]


def _too_many() -> LimitError:
    return LimitError(
        None,
        f"the safetensors header lists more than {MAX_TENSORS:,} tensors, more than a request "
        "takes (its arrays: the fields, heads, masks and expected outputs)",
        MAX_TENSORS,
    )


def _integer(text: str) -> int | TooManyDigits:
    """A JSON integer of the header; one longer than any u64 is not converted (a tensor's shape
    or offsets holding it are refused, as for any value past 2^64)."""
    return int(text) if len(text) <= 21 else TooManyDigits(len(text.lstrip("-")))


Entry = tuple[str, str, list[int], int, int]  # name, dtype, shape, begin, end


def _entries(header: dict[str, Any], size: int) -> list[Entry]:
    """The tensors' (name, dtype, shape, begin, end): each one's shape one NumPy can make and
    a request can hold (422), its bytes its shape times its dtype's size, and the tensors
    tiling the data exactly (400)."""
    entries = []
    for name, info in header.items():
        entries.append(_entry(name, info, size))
    at = 0
    for name, *_, begin, end in sorted(entries, key=lambda e: (e[3], e[4])):
        if begin != at:
            raise _invalid(
                name,
                f'tensor "{excerpt(name, 60)}" starts at byte {begin:,} of the data, but the one before ends at {at:,} (tensors must follow each other with no gap or overlap)',
            )
        at = end
    if at != size:
        raise BodyError(
            f"the tensors end at byte {at:,} of the data, but it has {size:,} bytes", "safetensors"
        )
    return entries


def _entry(name: str, info: Any, size: int) -> Entry:
    """One tensor's header entry, checked on its own (see :func:`_entries`)."""
    where = f'tensor "{excerpt(name, 60)}"'
    if len(name) > MAX_NAME:
        raise BodyError(
            f"{where} has a name of {len(name)} characters; at most {MAX_NAME}", "safetensors"
        )
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise _invalid(name, f"{where} must have exactly dtype, shape and data_offsets")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str):
        raise _invalid(name, f'{where}: its dtype must be a string such as "F64"')
    for key, value, length in (("shape", shape, None), ("data_offsets", offsets, 2)):
        problem = _not_sizes(value, length)
        if problem:
            what = "a list of sizes" if length is None else "two byte offsets"
            raise _invalid(
                name,
                f"{where}: its {key} must be {what}, whole numbers from 0 to 2^64 − 1 ({problem})",
            )
    begin, end = offsets
    if begin > end:
        raise _invalid(name, f"{where}'s data_offsets [{begin:,}, {end:,}] end before they begin")
    if end > size:
        raise _invalid(
            name, f"{where} ends at byte {end:,} of the data, but the data has {size:,} bytes"
        )
    shown = _json_name(name)
    if len(shape) > MAX_DIMS:
        raise FieldError(
            shown, f"{shown} is a tensor of {len(shape)} dimensions; at most {MAX_DIMS}"
        )
    numbers = math.prod(n for n in shape if n)
    if numbers > MAX_NUMBERS:
        raise FieldError(
            shown,
            f"{shown} is shaped {_shape(shape)}, more numbers than a tensor may hold (its dimensions multiplied, zeros left out, at most {MAX_NUMBERS:,})",
        )
    if dtype not in _READ:
        raise FieldError(
            shown,
            f"{shown} is a {excerpt(dtype, 20)} tensor; send F64 (or F32, F16, "
            "BF16, an integer type, or BOOL for a mask)",
        )
    expected = math.prod(shape) * np.dtype(_READ[dtype]).itemsize
    if end - begin != expected:
        raise _invalid(
            name,
            f"{where} is {dtype} shaped {_shape(shape)}, which takes {expected:,} bytes, but its data_offsets span {end - begin:,}",
        )
    return name, dtype, shape, begin, end


def _invalid(name: str, message: str) -> BodyError:
    """A 400 about one tensor's header entry, naming its field."""
    error = BodyError(message, "safetensors")
    error.items[0].field = _json_name(name)
    return error


def _shape(shape: list[int]) -> str:
    """A shape as messages write it: [2, 3]."""
    return excerpt(f"[{', '.join(str(n) for n in shape)}]", 80)


def _not_sizes(value: Any, length: int | None) -> str | None:
    """Why ``value`` is not a list of integers from 0 to 2^64 − 1 (of ``length`` items when
    given), or None when it is one."""
    if not isinstance(value, list):
        return f"it is {_kind(value)}"
    if length is not None and len(value) != length:
        return f"it has {len(value)} item{'s' * (len(value) != 1)}"
    for i, n in enumerate(value):
        if type(n) is not int:
            return f"item {i} is {_kind(n)}"
        if not 0 <= n < U64:
            return f"item {i} is {n:,}"
    return None


def _kind(value: Any) -> str:
    """What a JSON value is, in words: 'a string', '1.5'."""
    if isinstance(value, TooManyDigits):
        return f"an integer of {value.digits} digits"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return excerpt(repr(value), 24)
    kinds: dict[type, str] = {str: "a string", list: "a list", dict: "an object"}
    return kinds.get(type(value), "a number")


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


def _index(part: str) -> int | None:
    """A name part as a list index (``0``, ``12``), or None when it is not one."""
    return int(part) if part.isascii() and part.isdigit() and len(part) <= 9 else None


# objects whose keys are a module's parameter names, dots and all: the rest of a tensor's name
# after one of these paths is one key (expected.grad_state_dict.q_proj.weight)
WHOLE_KEYS = (("expected", "grad_state_dict"),)


def _whole_keys(parts: list[str]) -> list[str]:
    """A tensor name's parts with what follows a :data:`WHOLE_KEYS` path joined into one."""
    for path in WHOLE_KEYS:
        n = len(path)
        if tuple(parts[:n]) == path and len(parts) > n + 1:
            return [*path, ".".join(parts[n:])]
    return parts


class _Tree:
    """The request's fields as the tensors fill them in: each tensor at the place its name
    gives, a top-level field name as it is (``q_proj.weight``), else a dotted path
    (``mask.0.matrix``) whose numbers index lists."""

    def __init__(self, fields: dict[str, Any], top: frozenset[str], tensors: int) -> None:
        self.fields = fields
        self.top = top
        self.tensors = tensors
        self.given: dict[int, int] = {}  # id of a list -> its length before any tensor
        self.placed: set[tuple[int, Any]] = set()  # (id of a node, key) a tensor filled

    def place(self, name: str, value: Any) -> None:
        """Put one tensor's ``value`` at the place ``name`` gives."""
        shown = _json_name(name)
        if name in self.top or "." not in name or PER_HEAD_NORM.fullmatch(name):
            parts = [name]
        elif name.split(".", 1)[0] not in self.top:  # e.g. q_proj.weight sent to /attention
            raise FieldError(
                shown, f"{shown} is not a field of this endpoint (check the spelling; see /docs)"
            )
        else:
            parts = _whole_keys(name.split("."))
            if len(parts) > MAX_SEGMENTS or "" in parts:
                raise FieldError(shown, f'tensor "{shown}" does not name a field')
        node: Any = self.fields
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            key: Any = part
            if isinstance(node, list):
                key = self._list_index(node, part, shown)
                node.extend({} for _ in range(key + 1 - len(node)))
            elif not isinstance(node, dict):
                raise FieldError(shown, f'tensor "{shown}" does not name a field')
            elif _index(part) == 0 and part not in node and i:
                continue  # mask.0.matrix for a single mask object: the object is item 0
            if last:
                self._set(node, key, value, shown)
            else:
                node[key] = _container(
                    node[key] if isinstance(node, list) else node.get(key), parts[i + 1], shown
                )
                node = node[key]

    def _list_index(self, node: list[Any], part: str, shown: str) -> int:
        """``part`` as an index of ``node``: one of its items in the JSON, or one this
        request's tensors can fill (at most one new item each), below MAX_INDEX."""
        given = self.given.setdefault(id(node), len(node))
        end = min(given + self.tensors, MAX_INDEX)
        index = _index(part)
        if index is None or index >= end:
            reason = (
                "a list index is a whole number"
                if index is None
                else f"the list has {given} item{'s' * (given != 1)} in the JSON and the header "
                f"{self.tensors} tensor{'s' * (self.tensors != 1)}"
                if end < MAX_INDEX
                else f"a list here has at most {MAX_INDEX} items"
            )
            raise FieldError(
                shown,
                f'tensor "{shown}": {excerpt(part, 12)} is not an index of a list here (0 to {end - 1}: {reason})',
            )
        return index

    def _set(self, node: Any, key: Any, value: Any, shown: str) -> None:
        """Set one place, refusing a field given twice."""
        if (id(node), key) in self.placed:  # e.g. mask.matrix and mask.0.matrix
            raise FieldError(shown, f"{shown} is given twice: by two tensor names")
        existing = node[key] if isinstance(node, list) else node.get(key)
        if existing is not None and not (isinstance(existing, dict) and not existing):
            raise FieldError(shown, f"{shown} is given twice: as a tensor and in the JSON metadata")
        node[key] = value
        self.placed.add((id(node), key))


def _container(value: Any, next_part: str, shown: str) -> Any:
    """The object or list a tensor's path goes through: the one the JSON gave, or a new one
    (``true`` stands for an object of defaults, as in ``layer_norm: true``)."""
    if value is None or value is True:
        return [] if _index(next_part) is not None else {}
    if isinstance(value, dict | list):
        return value
    raise FieldError(
        shown, f'tensor "{shown}" goes inside a field that the JSON gives as a plain value'
    )
