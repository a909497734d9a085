"""Row-wise softmax over keys, with a policy for rows where every key is masked."""

from typing import Literal

import numpy as np
from numpy.typing import NDArray

FullyMaskedPolicy = Literal["zero", "uniform", "error"]
Array = NDArray[np.float64]


class AttentionInputError(ValueError):
    """Input the math cannot proceed with; the message is written for the person who sent it."""


class FullyMaskedRowsError(AttentionInputError):
    """Raised under the "error" policy when some query rows may attend to no key."""

    def __init__(self, rows: list[list[int]]) -> None:
        self.rows = rows
        listed = "; ".join(
            f"batch item {b}: rows {r}" if len(rows) > 1 else f"rows {r}"
            for b, r in enumerate(rows)
            if r
        )
        super().__init__(
            f"every key is masked for some query rows ({listed}); with fully_masked_rows 'error' "
            "this is refused: relax the mask, or choose 'zero' or 'uniform'"
        )


def rows_by_item(flags: NDArray[np.bool_]) -> list[list[int]]:
    """Indices of flagged rows per batch item: (L,) is one item; (B, ..., L) gives B lists,
    a row counting when it is flagged in any of the middle axes (e.g. heads)."""
    per_item: NDArray[np.bool_] = np.asarray(
        flags.reshape(1, -1)
        if flags.ndim == 1
        else flags.reshape(flags.shape[0], -1, flags.shape[-1]).any(axis=1)
    )
    return [np.flatnonzero(r).tolist() for r in per_item]


def fully_masked(masked_scores: Array) -> NDArray[np.bool_]:
    """True for each query row whose scores are all −∞.  (..., L, S) -> (..., L)"""
    return np.asarray(np.isneginf(masked_scores).all(axis=-1))


def softmax(masked_scores: Array, policy: FullyMaskedPolicy = "zero") -> Array:
    """Softmax over the last axis (keys), subtracting each row's maximum first.

    ``masked_scores`` is ``(..., L, S)``; −∞ marks a masked key and gets weight exactly 0.
    A row with every key masked gets weights 0 (``"zero"``, torch ≥ 2.5 math path, Keras),
    1/S (``"uniform"``, JAX), or raises :class:`FullyMaskedRowsError` (``"error"``).
    Scores must not hold +∞ or NaN: :func:`service.core.attention.scaled_dot_product_attention`
    refuses overflowed scores before it gets here.
    """
    row_max = masked_scores.max(axis=-1, keepdims=True)  # (..., L, 1), −∞ on fully masked rows
    empty = np.isneginf(row_max)  # (..., L, 1)
    if empty.any() and policy == "error":
        raise FullyMaskedRowsError(rows_by_item(empty[..., 0]))
    weights = masked_scores - np.where(empty, 0.0, row_max)  # (..., L, S), −∞ stays −∞
    np.exp(weights, out=weights)  # exp(−∞) = 0
    denom = weights.sum(axis=-1, keepdims=True)  # (..., L, 1), 0 on fully masked rows
    np.divide(weights, np.where(empty, 1.0, denom), out=weights)
    if empty.any() and policy == "uniform":
        weights[np.broadcast_to(empty, weights.shape)] = 1.0 / weights.shape[-1]
    return weights
