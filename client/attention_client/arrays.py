"""Turning what callers pass (NumPy arrays, nested lists, torch tensors) into NumPy arrays.

A request is first *normalised*: every value at an array field becomes a NumPy array of the
dtype the service expects, wherever it sits (``x``, ``mask[0].matrix``, ``heads[1].w_q``,
``expected.heads[0].weights``, ``layer_norm.gamma`` …). Encoding (``wire``) then decides, per
mode, whether it travels as a tensor or as JSON. What is not an array (a string, a scalar, a
ragged list) is left as it is, for the service to judge and report.
"""

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

Kind = Literal["float", "int", "any"]

# fields (by their own name, at any depth) holding numbers: float64 on the wire
FLOAT_FIELDS = frozenset(
    {
        "x", "context", "q", "k", "v", "w_q", "w_k", "w_v", "b_q", "b_k", "b_v", "w_o", "b_o",
        "in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias", "sinks",
        "positional_encoding", "gamma", "beta", "q_weight", "k_weight", "slopes", "table",
        "grad_output",
    }
)  # fmt: skip
# integer fields keep integers
INT_FIELDS = frozenset({"positions", "context_positions", "key_lengths", "query_lengths"})
# where a JSON null (and a float -inf) means −∞ rather than NaN
NEG_INF_FIELDS = frozenset({"masked_scores", "additive_mask"})
_SCALARS = (bool, int, float, np.bool_, np.number, type(None))


def is_torch(value: object) -> bool:
    """Whether ``value`` is a torch tensor (detected without importing torch)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def from_torch(tensor: Any) -> npt.NDArray[Any]:
    """A torch tensor as NumPy: floats as float64, booleans and integers in their own dtype."""
    t = tensor.detach().cpu()
    if t.is_floating_point():
        t = t.double()
    return np.asarray(t.numpy())


def _numeric_leaves(value: Any) -> bool:
    """Whether every leaf of a nested list is a number, a boolean or None."""
    if isinstance(value, list | tuple):
        return all(_numeric_leaves(v) for v in value)
    return isinstance(value, _SCALARS)


def _from_list(value: list[Any] | tuple[Any, ...], nulls: float) -> npt.NDArray[Any] | None:
    """A rectangular nested list as an array (None → ``nulls``); None when it is not one."""
    if not value or not _numeric_leaves(value):
        return None
    try:
        obj = np.array(value, dtype=object)
    except ValueError:  # ragged
        return None
    flat = list(obj.flat)
    if any(isinstance(e, list | tuple) for e in flat):  # ragged, older NumPy
        return None
    if all(isinstance(e, bool | np.bool_) for e in flat):
        return obj.astype(bool)
    if all(isinstance(e, int | np.integer) and not isinstance(e, bool) for e in flat):
        return obj.astype(np.int64)
    obj[obj == None] = nulls  # noqa: E711 - elementwise
    return obj.astype(np.float64)


def to_array(value: Any, kind: Kind = "any", nulls: float = np.nan) -> npt.NDArray[Any] | None:
    """``value`` as an array (``float``: numbers as float64; ``int``: integers kept; ``any``:
    as they come, floats as float64); ``None`` when it is not an array at all."""
    if is_torch(value):
        value = from_torch(value)
    elif isinstance(value, list | tuple):
        value = _from_list(value, nulls)
    if not isinstance(value, np.ndarray) or value.ndim == 0 or value.dtype.kind not in "biuf":
        return None
    if value.dtype.kind == "f" or (kind == "float" and value.dtype.kind in "iu"):
        return value.astype(np.float64, copy=False)
    if value.dtype.kind in "iu":
        return value.astype(np.int64, copy=False)
    return value


def _maybe(value: Any, kind: Kind = "any", nulls: float = np.nan) -> Any:
    """``value`` as an array when it is one, otherwise unchanged."""
    array = to_array(value, kind, nulls)
    if array is not None:
        return array
    return from_torch(value) if is_torch(value) else value  # a 0-d tensor: a number


def _kind(name: str) -> Kind:
    """The dtype a field named ``name`` takes; state-dict names (``q_proj.weight``) are floats."""
    if name in FLOAT_FIELDS or "." in name or name.endswith(("_weight", "_bias")):
        return "float"
    return "int" if name in INT_FIELDS else "any"


def _mask(mask: Any) -> Any:
    """One mask object with its matrix (and lengths) as arrays; a bare matrix is a boolean mask
    when it holds booleans, an additive one otherwise."""
    if not isinstance(mask, Mapping):
        matrix = to_array(mask, nulls=-np.inf)
        if matrix is None:
            return mask
        mask = {"type": "boolean" if matrix.dtype == bool else "additive", "matrix": matrix}
    out = {k: _maybe(v, "int") if k in INT_FIELDS else v for k, v in mask.items()}
    if "matrix" in out:
        matrix = to_array(out["matrix"], nulls=-np.inf)
        if matrix is not None and matrix.dtype.kind in "iu":  # 1/0 in a boolean mask
            matrix = matrix.astype(bool if out.get("type") == "boolean" else np.float64)
        if matrix is not None:
            out["matrix"] = matrix
    return out


def _expected(expected: Mapping[str, Any]) -> dict[str, Any]:
    """``expected``: every entry an array, ``heads`` a list of per-head objects (or None)."""
    out: dict[str, Any] = {}
    for name, value in expected.items():
        if name == "heads" and isinstance(value, list | tuple):
            out[name] = [h if h is None else _expected(h) for h in value]
        elif name == "mask":
            out[name] = _maybe(value)
        else:
            out[name] = _maybe(value, "float", -np.inf if name in NEG_INF_FIELDS else np.nan)
    return out


def _nested(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object's array fields as arrays (layer_norm.gamma, qk_norm.q_weight, a head's w_q…)."""
    return {k: _maybe(v, _kind(k)) if _kind(k) != "any" else v for k, v in obj.items()}


def normalise(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A request's fields with every array as a NumPy array of the dtype the service takes.

    ``mask`` always becomes a list of mask objects (the service reads one object as a list of
    one). Numbers are float64, except the integer fields (``positions``, ``key_lengths`` …);
    boolean masks stay boolean; an additive matrix's ``None`` entries become −∞.
    """
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "mask":
            several = isinstance(value, list | tuple) and not _numeric_leaves(value)
            masks = list(value) if several else [value]  # a nested list of numbers: one matrix
            out[name] = [_mask(m) for m in masks]
        elif name == "expected" and isinstance(value, Mapping):
            out[name] = _expected(value)
        elif name == "heads" and isinstance(value, list | tuple):
            out[name] = [_nested(h) if isinstance(h, Mapping) else h for h in value]
        elif isinstance(value, Mapping):
            out[name] = _nested(value)
        else:
            out[name] = _maybe(value, _kind(name))
    return out
