"""Mask objects for the ``mask`` argument (section 4 of the API); lists of them combine with AND."""

from typing import Any, Literal


def causal(alignment: Literal["upper_left", "lower_right"] = "upper_left") -> dict[str, Any]:
    """Query i sees keys j ≤ i (``lower_right``: j ≤ i + S − L, for decoding with a cache)."""
    return {"type": "causal", "alignment": alignment}


def padding(key_lengths: Any = None, query_lengths: Any = None) -> dict[str, Any]:
    """Keys (queries) at index ≥ the length are padding; one length per batch item, or one."""
    out: dict[str, Any] = {"type": "padding"}
    if key_lengths is not None:
        out["key_lengths"] = key_lengths
    if query_lengths is not None:
        out["query_lengths"] = query_lengths
    return out


def window(left: int | None = None, right: int | None = None) -> dict[str, Any]:
    """Query i sees keys i − left … i + right (None: unbounded on that side)."""
    return {"type": "window", "left": left, "right": right}


def boolean(matrix: Any, true_means: Literal["attend", "masked"] = "attend") -> dict[str, Any]:
    """A boolean ``[L][S]`` matrix; ``true_means="masked"`` reads it as torch's ``attn_mask``."""
    return {"type": "boolean", "matrix": matrix, "true_means": true_means}


def additive(matrix: Any) -> dict[str, Any]:
    """Numbers added to the scaled scores; −∞ (or None) hides the key."""
    return {"type": "additive", "matrix": matrix}
