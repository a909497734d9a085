"""Row-wise softmax over keys, with a policy for rows where every key is masked."""

from typing import Literal

import numpy as np

from service.core.types import Array, BoolArray


def rows_by_item(flags: BoolArray) -> list[list[int]]:
    """Indices of flagged rows per batch item: (L,) is one item; (B, ..., L) gives B lists,
    a row counting when it is flagged in any of the middle axes (e.g. heads)."""
    per_item: BoolArray = np.asarray(
        flags.reshape(1, -1)
        if flags.ndim == 1
        else flags.reshape(flags.shape[0], -1, flags.shape[-1]).any(axis=1)
    )
    return [np.flatnonzero(r).tolist() for r in per_item]


def fully_masked(masked_scores: Array) -> BoolArray:
    """True for each query row whose scores are all −∞.  (..., L, S) -> (..., L)"""
    return np.asarray(np.isneginf(masked_scores).all(axis=-1))


def softmax(masked_scores: Array, empty_rows: Literal["zero", "uniform"] = "zero") -> Array:
    """Softmax over the last axis (keys), subtracting each row's maximum first.

    ``masked_scores`` is ``(..., L, S)``, finite or −∞; −∞ marks a masked key and gets weight
    exactly 0. A row with every key masked gets weights 0 (``"zero"``: torch ≥ 2.5 math path,
    Keras) or 1/S (``"uniform"``: JAX). The caller refuses +∞ and NaN before this point
    (:func:`service.core.attention.scaled_dot_product_attention`).
    """
    row_max = masked_scores.max(axis=-1, keepdims=True)  # (..., L, 1), −∞ on fully masked rows
    empty = np.isneginf(row_max)  # (..., L, 1)
    weights = masked_scores - np.where(empty, 0.0, row_max)  # (..., L, S), −∞ stays −∞
    np.exp(weights, out=weights)  # exp(−∞) = 0
    denom = weights.sum(axis=-1, keepdims=True)  # (..., L, 1), 0 on fully masked rows
    np.divide(weights, np.where(empty, 1.0, denom), out=weights)
    if empty_rows == "uniform" and empty.any():
        weights[np.broadcast_to(empty, weights.shape)] = 1.0 / weights.shape[-1]
    return weights
