"""Scaled dot-product attention that keeps every intermediate.

Shapes use paper names: L queries, S keys, d_k query/key width, d_v value width. Every
function accepts any number of leading batch axes (``...``): ``(B, L, d)`` for a batch,
``(B, h, L, d)`` for heads.
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from service.core.softmax import (
    AttentionInputError,
    FullyMaskedPolicy,
    FullyMaskedRowsError,
    fully_masked,
    rows_by_item,
    softmax,
)

WeightLayout = Literal["in_out", "out_in"]
Array = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class AttentionTrace:
    """Every intermediate of one scaled dot-product attention, in order of computation."""

    q: Array  # (..., L, d_k)
    k: Array  # (..., S, d_k)
    v: Array  # (..., S, d_v)
    scores: Array  # (..., L, S)  Q Kᵀ
    scaled_scores: Array  # (..., L, S)  Q Kᵀ · scale
    masked_scores: Array | None  # (..., L, S)  scaled + additive mask, −∞ where masked
    weights: Array  # (..., L, S)  row softmax
    output: Array  # (..., L, d_v)  weights V
    scale: float
    fully_masked_rows: BoolArray  # (..., L)  query rows that could attend to no key


def project(x: Array, w: Array, b: Array | None = None, layout: WeightLayout = "in_out") -> Array:
    """Linear projection of ``x (..., n, d_in)``.

    ``in_out``: ``x @ w`` with w ``(d_in, d_out)``; ``out_in``: ``x @ w.T`` with w
    ``(d_out, d_in)`` (PyTorch ``nn.Linear``). The optional bias ``b (d_out,)`` is added.
    Returns ``(..., n, d_out)``.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        out = x @ (w if layout == "in_out" else w.T)  # (..., n, d_out)
        if b is not None:
            out += b
    require_finite(out, "a projection (X W)")
    return out


def require_finite(a: Array, what: str) -> None:
    """Refuse a result that overflowed: NaN or ±∞ must never reach a response."""
    if not np.isfinite(a).all():
        raise AttentionInputError(
            f"{what} overflowed float64 (a value reached ±infinity or NaN); scale the inputs "
            "down: products of values near 1e154 or larger overflow"
        )


def default_scale(d_k: int) -> float:
    """1/√d_k, the scale of Vaswani et al. (2017)."""
    return 1.0 / float(np.sqrt(d_k))


def scaled_dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    scale: float | None = None,
    additive: Array | None = None,
    padded_queries: BoolArray | None = None,
    fully_masked_policy: FullyMaskedPolicy = "zero",
) -> AttentionTrace:
    """softmax(Q Kᵀ · scale + M) V, returning every step.

    q ``(..., L, d_k)``, k ``(..., S, d_k)``, v ``(..., S, d_v)``. ``scale`` defaults to
    1/√d_k. ``additive`` is a mask broadcastable to ``(..., L, S)``: 0 where a query may
    attend, −∞ where it may not, other finite values are biases (PyTorch float masks).
    ``padded_queries`` (broadcastable to ``(..., L)``) marks query rows whose weights and
    output are forced to 0. Rows where every key is masked follow ``fully_masked_policy``
    (see :func:`service.core.softmax.softmax`); padding rows never count as such.
    """
    d_k = q.shape[-1]
    scale = default_scale(d_k) if scale is None else scale
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported by softmax
        scores = q @ np.swapaxes(k, -1, -2)  # (..., L, S)
        scaled_scores = scores * scale  # (..., L, S)
    require_finite(scaled_scores, "the scaled scores Q Kᵀ · scale")  # −∞ must not pass for a mask
    masked_scores = None if additive is None else scaled_scores + additive  # (..., L, S)
    logits = scaled_scores if masked_scores is None else masked_scores

    empty = fully_masked(logits)  # (..., L)
    if padded_queries is not None:
        empty &= ~padded_queries
    if fully_masked_policy == "error" and empty.any():
        raise FullyMaskedRowsError(rows_by_item(empty))

    weights = softmax(logits, "zero" if fully_masked_policy == "error" else fully_masked_policy)
    if padded_queries is not None and padded_queries.any():
        weights[np.broadcast_to(padded_queries[..., None], weights.shape)] = 0.0
    require_finite(v, "V")
    with np.errstate(over="ignore", invalid="ignore"):
        output = weights @ v  # (..., L, d_v)
    require_finite(output, "the output (weights V)")
    return AttentionTrace(
        q=q,
        k=k,
        v=v,
        scores=scores,
        scaled_scores=scaled_scores,
        masked_scores=masked_scores,
        weights=weights,
        output=output,
        scale=scale,
        fully_masked_rows=empty,
    )


def entropy_bits(weights: Array) -> Array:
    """Shannon entropy in bits of each weight row, with 0·log 0 = 0.  (..., L, S) -> (..., L)"""
    logs = np.log2(weights, out=np.zeros_like(weights), where=weights > 0)  # (..., L, S)
    return 0.0 - (weights * logs).sum(axis=-1)  # type: ignore[no-any-return]  # 0.0 − x: no −0.0
