"""JSON lists (or safetensors tensors) to float64 arrays, with errors a person can act on.

The fast path is one ``np.array`` call; only a bad input pays for a walk through the lists to
say exactly where the problem is, and only the first problem is reported. A tensor from a
safetensors body (service.wire.safetensors_in) arrives as an array already and gets the same checks.
"""

import math
from functools import lru_cache
from itertools import chain
from typing import Annotated, Any

import numpy as np
from pydantic import FailFast, Strict, TypeAdapter, ValidationError

from service.core.types import Array, BoolArray
from service.wire.errors import TooManyDigits, excerpt, too_many_digits

_LEVELS = {1: ("entry",), 2: ("row", "column"), 3: ("item", "row", "column")}
_NON_FINITE = "NaN, Infinity and overflowing literals such as 1e999 are rejected"


def _where(path: list[int], depth: int | None = None) -> str:
    """'row 2, column 0' for a path into a matrix; a batch adds 'item b' in front."""
    names = _LEVELS.get(depth or len(path), ("index",) * len(path))
    parts = [f"{n} {i}" for n, i in zip(names, path, strict=False)]
    if parts and names[len(parts) - 1] == "column":
        return " ".join(parts[:-1]) + ", " + parts[-1]
    return " ".join(parts)


def _describe(value: Any) -> str:
    """How a JSON value that is not a number looks, briefly (never the whole value)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'the string "{excerpt(value, 20)}"'
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, TooManyDigits):
        return "a number with too many digits"
    return f"a {type(value).__name__}"


def _first_structure_problem(name: str, value: Any) -> str | None:
    """Describe the first list whose length or nesting differs from the first item's, if any."""
    shape: list[int] = []
    node = value
    while isinstance(node, list) and node:
        shape.append(len(node))
        node = node[0]
    depth = len(shape)
    names = _LEVELS.get(depth, ("index",) * depth)

    def walk(node: Any, path: list[int]) -> str | None:
        level = len(path)
        if level == depth:
            return (
                f"{name} {_where(path, depth)} is a list, not a number"
                if isinstance(node, list)
                else None
            )
        if not isinstance(node, list):
            return f"{name} {_where(path, depth)} is {_describe(node)}, expected a list"
        if len(node) != shape[level]:
            children = "numbers" if level == depth - 1 else names[level] + "s"
            return (
                f"{name} {_where(path, depth)} has {len(node)} {children} "
                f"but {names[level - 1]} 0 has {shape[level]}"
            )
        for i, child in enumerate(node):
            problem = walk(child, [*path, i])
            if problem:
                return problem
        return None

    return walk(value, [])


@lru_cache(maxsize=8)
def _strict_numbers(ndim: int) -> TypeAdapter[Any]:
    """A validator for ``ndim``-deep lists of numbers that stops at the first bad one (Rust speed)."""
    item: Any = Annotated[float, Strict()]
    for _ in range(ndim):
        item = Annotated[list[item], FailFast()]
    return TypeAdapter(item)


def _first_bad_number(name: str, value: Any, ndim: int) -> str:
    """Describe the first element that is not a finite number, stopping there: a million bad
    values cost no more than one. ``ndim`` is the nesting NumPy found."""
    try:
        _strict_numbers(ndim).validate_python(value)
    except ValidationError as err:
        path = [int(i) for i in err.errors()[0]["loc"] if isinstance(i, int)]
        node = value
        for i in path:
            node = node[i]
        if isinstance(node, TooManyDigits):
            return too_many_digits(f"{name} {_where(path)}", node)
        is_number = isinstance(node, int | float) and not isinstance(node, bool)
        if is_number:  # an integer beyond float64
            return f"{name} {_where(path)} is not a finite number ({_NON_FINITE})"
        return f"{name} {_where(path)} is {_describe(node)}, not a number"
    arr = np.asarray(value, dtype=object)  # every element is a number: one is too big or not finite
    for index, item in np.ndenumerate(arr):
        try:
            if math.isfinite(float(item)):
                continue
        except OverflowError:
            pass
        return f"{name} {_where(list(index))} is not a finite number ({_NON_FINITE})"
    return f"{name} holds something that is not a number"


def _depth(value: Any) -> int:
    """How deep lists nest along the first items (without recursion: a JSON body may nest
    lists a thousand deep)."""
    depth = 0
    while isinstance(value, list):
        depth += 1
        value = value[0] if value else None
    return depth


def _nested(
    value: Any, name: str, expected: str, most: int, dtype: type | None = None
) -> np.ndarray:
    """``np.array`` of a JSON list at most ``most`` lists deep, or a ValueError naming the
    first ragged place; a tensor as it is, at most ``most`` dimensions."""
    if isinstance(value, np.ndarray):
        if value.ndim > most:
            raise ValueError(f"{name} must be {expected}, but it has {value.ndim} dimensions")
        return value
    if not isinstance(value, list):
        raise ValueError(f"{name} must be {expected}, got {_describe(value)}")
    depth = _depth(value)
    if depth > most:  # checked first: deeper lists would only make the walks below recurse
        raise ValueError(f"{name} must be {expected}, but it is nested {depth} level(s) deep")
    try:
        return np.array(value, dtype=dtype)
    except (ValueError, TypeError, OverflowError):
        raise ValueError(
            _first_structure_problem(name, value) or f"{name} must be {expected}"
        ) from None


def _has_bool(value: Any, arr: np.ndarray) -> bool:
    """Whether the lists behind the numeric ``arr`` hold a JSON true or false, which NumPy
    reads as 1 or 0: only a large array holding a 0 or a 1 is looked through (a small one is
    looked through at once: cheaper than the test)."""
    if isinstance(value, np.ndarray):  # a tensor: numbers, or a BOOL tensor (kind "b")
        return False
    if arr.size > 256 and not ((arr == 0) | (arr == 1)).any():
        return False
    items: Any = value
    for _ in range(arr.ndim - 1):
        items = chain.from_iterable(items)
    return bool in set(map(type, items))


def to_array(value: Any, name: str, ndims: tuple[int, ...], expected: str) -> Array:
    """Convert a JSON value to a float64 array with one of ``ndims`` dimensions.

    ``expected`` names the shape in words for messages, e.g. "a matrix [L][d_model]".
    Raises ValueError with a sentence that names ``name`` and the first problem found.
    """
    arr = _nested(value, name, expected, max(ndims))
    if arr.dtype.kind == "b" and isinstance(value, np.ndarray):
        raise ValueError(f"{name} is a BOOL tensor: booleans are not numbers")
    if arr.dtype.kind not in "iuf" or _has_bool(value, arr):  # strings, null, booleans, …
        raise ValueError(_first_bad_number(name, value, arr.ndim))
    if arr.ndim not in ndims or 0 in arr.shape:
        if 0 in arr.shape:
            raise ValueError(f"{name} is empty: it must be {expected}")
        raise ValueError(f"{name} must be {expected}, but it is nested {arr.ndim} level(s) deep")
    out = arr.astype(np.float64, copy=False)
    if not np.isfinite(out).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(out))[0])
        raise ValueError(f"{name} {_where(list(bad))} is not a finite number ({_NON_FINITE})")
    return out


def to_bool_matrix(
    value: Any,
    name: str,
    ndims: tuple[int, ...] = (2, 3),
    expected: str = "a matrix [L][S] (or [B][L][S]) of true/false or 1/0",
) -> BoolArray:
    """A boolean array with one of ``ndims`` dimensions (a mask matrix [L][S] or [B][L][S]
    by default): true/false, or 1/0."""
    arr = _nested(value, name, expected, max(ndims))
    if arr.dtype.kind not in "biuf":
        problem = _first_structure_problem(name, value)
        raise ValueError(problem or f"{name} must hold only true/false or 1/0")
    if arr.ndim not in ndims or 0 in arr.shape:
        raise ValueError(f"{name} must be {expected}")
    if arr.dtype.kind != "b":
        bad = np.argwhere((arr != 0) & (arr != 1))
        if len(bad):
            where = _where([int(i) for i in bad[0]])
            raise ValueError(
                f"{name} {where} is {arr[tuple(bad[0])]}: only true/false or 1/0 are allowed"
            )
    return arr.astype(bool)


def to_additive_matrix(value: Any, name: str) -> Array:
    """An additive mask [L][S] or [B][L][S]: finite numbers, null for −∞."""
    expected = "a matrix [L][S] (or [B][L][S]) of numbers, null for −∞"
    return to_nullable_array(value, name, (2, 3), expected, -np.inf, "use null for −∞; ")


def to_nullable_array(
    value: Any,
    name: str,
    ndims: tuple[int, ...],
    expected: str,
    null: float,
    hint: str = "",
    booleans: bool = False,
) -> Array:
    """A float64 array with one of ``ndims`` dimensions whose ``null`` entries become ``null``
    (−∞ or NaN); true/false become 1/0 when ``booleans`` allows them. ``hint`` starts the
    sentence refusing a non-finite literal."""
    if isinstance(value, np.ndarray):
        return _nullable_tensor(value, name, ndims, expected, null, booleans)
    obj = _nested(value, name, expected, max(ndims), dtype=object)
    if obj.ndim not in ndims or 0 in obj.shape:
        raise ValueError(_first_structure_problem(name, value) or f"{name} must be {expected}")
    is_null = np.frompyfunc(lambda e: e is None, 1, 1)(obj).astype(bool)
    obj[is_null] = 0.0
    is_number = np.frompyfunc(
        lambda e: isinstance(e, int | float) and (booleans or not isinstance(e, bool)), 1, 1
    )(obj).astype(bool)
    if not is_number.all():
        index = [int(i) for i in np.argwhere(~is_number)[0]]
        if isinstance(obj[tuple(index)], TooManyDigits):
            raise ValueError(too_many_digits(f"{name} {_where(index)}", obj[tuple(index)]))
        raise ValueError(
            f"{name} {_where(index)} is {_describe(obj[tuple(index)])}, not a number or null"
        )
    try:
        out = obj.astype(np.float64)
    except OverflowError:
        raise ValueError(f"{name} holds an integer too large for float64") from None
    if not np.isfinite(out).all():
        bad = [int(i) for i in np.argwhere(~np.isfinite(out))[0]]
        raise ValueError(f"{name} {_where(bad)} is not a finite number ({hint}{_NON_FINITE})")
    out[is_null] = null
    return out


def _nullable_tensor(
    value: np.ndarray, name: str, ndims: tuple[int, ...], expected: str, null: float, booleans: bool
) -> Array:
    """:func:`to_nullable_array` for a tensor: it holds ``null``'s value itself (−∞ or NaN)
    where JSON would have null, and finite numbers elsewhere."""
    arr = _nested(value, name, expected, max(ndims))
    if arr.ndim not in ndims or 0 in arr.shape:
        raise ValueError(f"{name} must be {expected}")
    if arr.dtype.kind == "b" and not booleans:
        raise ValueError(f"{name} is a BOOL tensor: booleans are not numbers")
    out = arr.astype(np.float64)
    allowed = np.isnan(out) if math.isnan(null) else out == null
    bad = ~np.isfinite(out) & ~allowed
    if bad.any():
        index = [int(i) for i in np.argwhere(bad)[0]]
        where = "NaN" if math.isnan(null) else "−∞"
        raise ValueError(
            f"{name} {_where(index)} is {out[tuple(index)]}: a tensor may hold {where} where "
            "JSON would have null, and finite numbers elsewhere"
        )
    return out
