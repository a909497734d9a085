"""Request bodies and response bodies, in JSON or safetensors ("Binary arrays" of the API).

In safetensors, every array is a tensor named by its dotted path (``x``, ``mask.0.matrix``,
``heads.1.weights``) and everything else is one JSON object under ``__metadata__["json"]``, in
which the containers of those arrays stay (a per-head entry as ``{}``) and the arrays are absent.
A decoded body is that same pair in both modes: flat arrays by dotted path, and the JSON rest.
"""

import copy
import json
from collections.abc import Mapping
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import safetensors.numpy

from attention_client.arrays import NEG_INF_FIELDS, from_torch, is_torch, to_array

JSON = "application/json"
SAFETENSORS = "application/x-safetensors"
Arrays = dict[str, npt.NDArray[Any]]

# response fields that are never arrays, whatever they hold
NOT_ARRAYS = frozenset(
    {
        "tokens", "context_tokens", "summary", "steps", "comparison", "first_mismatch",
        "warnings", "conventions", "fully_masked_rows",
    }
)  # fmt: skip


def _json_array(array: npt.NDArray[Any]) -> Any:
    """An array as JSON lists: −∞ and NaN become null (+∞ has no JSON form)."""
    if array.dtype.kind != "f":
        return array.tolist()
    if np.isposinf(array).any():
        raise ValueError("+inf cannot be sent as JSON; send a finite number")
    obj = array.astype(object)
    obj[~np.isfinite(array)] = None
    return obj.tolist()


def jsonable(value: Any) -> Any:
    """``value`` with its NumPy arrays and scalars (and torch tensors) as plain JSON values."""
    if is_torch(value):
        value = from_torch(value)
    if isinstance(value, np.ndarray):
        return _json_array(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def _as_tensor(value: Any) -> bool:
    """Whether a normalised value travels as a tensor (NaN has no tensor form: null in JSON)."""
    return (
        isinstance(value, np.ndarray)
        and value.ndim > 0
        and value.dtype.kind in "biuf"
        and not (value.dtype.kind == "f" and np.isnan(value).any())
    )


def split(value: Any, prefix: str = "") -> tuple[Arrays, Any]:
    """The tensors of a normalised request by dotted path, and the JSON rest."""
    tensors: Arrays = {}
    if isinstance(value, Mapping):
        rest: dict[str, Any] = {}
        for key, item in value.items():
            if _as_tensor(item):
                tensors[prefix + key] = np.ascontiguousarray(item)
            else:
                inner, rest[key] = split(item, f"{prefix}{key}.")
                tensors.update(inner)
        return tensors, rest
    if isinstance(value, list | tuple) and any(isinstance(v, Mapping) for v in value):
        items = []
        for i, item in enumerate(value):
            inner, kept = split(item, f"{prefix}{i}.")
            tensors.update(inner)
            items.append(kept)
        return tensors, items
    return tensors, jsonable(value)


def encode(payload: Mapping[str, Any], binary: bool) -> tuple[bytes, str]:
    """The body of a normalised request and its content type."""
    if not binary:
        return json.dumps(jsonable(payload), allow_nan=False).encode(), JSON
    tensors, rest = split(payload)
    meta = json.dumps(rest, allow_nan=False, ensure_ascii=False)
    return safetensors.numpy.save(tensors, metadata={"json": meta}), SAFETENSORS


def _read_safetensors(content: bytes) -> tuple[Arrays, dict[str, Any]]:
    """A safetensors body's tensors, in the order of their bytes (the service writes them in
    the order of its JSON answer), and the JSON object under ``__metadata__["json"]``."""
    size = int.from_bytes(content[:8], "little")
    header = json.loads(content[8 : 8 + size])
    meta = header.pop("__metadata__", None) or {}
    rest = json.loads(meta.get("json", "{}"))
    if not isinstance(rest, dict):
        raise ValueError(f'__metadata__["json"] holds a {type(rest).__name__}, not an object')
    tensors = safetensors.numpy.load(content)
    order = sorted(header, key=lambda name: header[name]["data_offsets"][0])
    return {name: tensors[name] for name in order}, rest


_ABSENT = object()  # flatten's mark for "this value became an array"


def _objects(value: Any) -> bool:
    """Whether ``value`` is a list of objects (``None`` for a skipped one), like ``heads``."""
    return (
        isinstance(value, list)
        and any(isinstance(v, dict) for v in value)
        and all(v is None or isinstance(v, dict) for v in value)
    )


def flatten(value: Any, prefix: str = "", name: str = "") -> tuple[Arrays, Any]:
    """A JSON response's arrays by dotted path (null: −∞ in masked scores and additive masks,
    NaN elsewhere), and the rest, shaped as the safetensors metadata is."""
    arrays: Arrays = {}
    if isinstance(value, dict):
        rest: dict[str, Any] = {}
        for key, item in value.items():
            if key in NOT_ARRAYS:
                rest[key] = item
                continue
            inner, kept = flatten(item, f"{prefix}{key}.", key)
            arrays.update(inner)
            if kept is not _ABSENT:
                rest[key] = kept
        return arrays, rest
    if _objects(value):
        items = []
        for i, item in enumerate(value):
            inner, kept = flatten(item, f"{prefix}{i}.")
            arrays.update(inner)
            items.append(kept)
        return arrays, items
    if isinstance(value, list):
        array = to_array(value, nulls=-np.inf if name in NEG_INF_FIELDS else np.nan)
        if array is not None:
            return {prefix.rstrip("."): array}, _ABSENT
    return arrays, value


def decode(response: httpx.Response) -> tuple[Arrays, dict[str, Any]]:
    """A successful response as (arrays by dotted path, the JSON rest)."""
    media = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if media == SAFETENSORS:
        return _read_safetensors(response.content)
    arrays, rest = flatten(response.json())
    if not isinstance(rest, dict):
        raise ValueError(f"expected a JSON object, got {type(rest).__name__}")
    return arrays, rest


def _step(key: str) -> str | int:
    """A dotted-path segment: integers index lists."""
    return int(key) if key.isdigit() else key


def _put(node: Any, path: list[str | int], value: Any) -> None:
    """Set ``value`` at ``path`` inside ``node``, making the containers that are missing."""
    key, *more = path
    if isinstance(node, list):
        assert isinstance(key, int), f"a list indexed by {key!r}"
        node.extend({} for _ in range(key + 1 - len(node)))
    if not more:
        node[key] = value
        return
    child = node.get(key) if isinstance(node, dict) else node[key]
    if child is None:
        child = node[key] = [] if isinstance(more[0], int) else {}
    _put(child, more, value)


def rebuild(arrays: Mapping[str, Any], rest: Mapping[str, Any]) -> dict[str, Any]:
    """The full response: a copy of ``rest`` with each array put back at its dotted path."""
    full = copy.deepcopy(dict(rest))
    for name, array in arrays.items():
        _put(full, [_step(s) for s in name.split(".")], array)
    return full
