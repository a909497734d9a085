"""Scaled dot-product attention that keeps every intermediate.

Shapes use paper names: L queries, S keys, d_k query/key width, d_v value width. Every
function accepts any number of leading batch axes (``...``): ``(B, L, d)`` for a batch,
``(B, h, L, d)`` for heads. Weights are in ``in_out`` layout (``X @ W``); the API converts
other layouts before calling in here.
"""

from dataclasses import dataclass

import numpy as np

from service.core.errors import AttentionInputError, FullyMaskedRowsError
from service.core.softmax import fully_masked, rows_by_item, softmax
from service.core.types import Array, BoolArray, FullyMaskedPolicy


@dataclass(frozen=True)
class Projections:
    """Query, key and value weights in in_out layout (``X @ W + b``)."""

    w_q: Array  # (d_model, d_q), d_q = h·d_k
    w_k: Array  # (d_model, d_kv), d_kv = h_kv·d_k
    w_v: Array  # (d_model, h_kv·d_v)
    b_q: Array | None = None  # (d_q,)
    b_k: Array | None = None  # (d_kv,)
    b_v: Array | None = None  # (h_kv·d_v,)


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


def project(x: Array, w: Array, b: Array | None = None) -> Array:
    """Linear projection ``x @ w + b`` of ``x (..., n, d_in)`` with w ``(d_in, d_out)`` and the
    optional bias ``b (d_out,)``. Returns ``(..., n, d_out)``."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused below
        out = x @ w  # (..., n, d_out)
        if b is not None:
            out += b
    require_finite(out, "a projection (X W)")
    return out


def project_qkv(x: Array, source: Array, p: Projections) -> tuple[Array, Array, Array]:
    """Q from ``x (..., L, d_model)``; K and V from ``source (..., S, d_model)`` (x itself for
    self-attention, the context for cross-attention)."""
    return project(x, p.w_q, p.b_q), project(source, p.w_k, p.b_k), project(source, p.w_v, p.b_v)


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
    output are forced to 0. Rows where every key is masked get weights 0 (``"zero"``), 1/S
    (``"uniform"``) or raise :class:`FullyMaskedRowsError` (``"error"``); padding rows never
    count as such. Scores that overflow are refused, never taken for masked.
    """
    d_k = q.shape[-1]
    scale = default_scale(d_k) if scale is None else scale
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        scores = q @ np.swapaxes(k, -1, -2)  # (..., L, S)
        scaled_scores = scores * scale  # (..., L, S)
    require_finite(scaled_scores, "the scaled scores Q Kᵀ · scale")  # −∞ must not pass for a mask
    masked_scores = None if additive is None else _add_mask(scaled_scores, additive)
    logits = scaled_scores if masked_scores is None else masked_scores

    empty = fully_masked(logits)  # (..., L)
    if padded_queries is not None:
        empty &= ~padded_queries
    if fully_masked_policy == "error" and empty.any():
        raise FullyMaskedRowsError(rows_by_item(empty))

    weights = softmax(logits, "uniform" if fully_masked_policy == "uniform" else "zero")
    if padded_queries is not None and padded_queries.any():
        weights[np.broadcast_to(padded_queries[..., None], weights.shape)] = 0.0
    require_finite(v, "V")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
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


def _add_mask(scaled_scores: Array, additive: Array) -> Array:
    """scaled scores + M, refusing sums that overflow (finite + finite reaching ±∞)."""
    with np.errstate(over="ignore", invalid="ignore"):
        masked = scaled_scores + additive  # (..., L, S)
    if not (np.isfinite(masked) | np.isneginf(additive)).all():
        raise AttentionInputError(
            "the masked scores (scaled scores plus the additive mask) overflowed float64; "
            "use smaller additive values or inputs"
        )
    return masked


def entropy_bits(weights: Array) -> Array:
    """Shannon entropy in bits of each weight row, with 0·log 0 = 0.  (..., L, S) -> (..., L)"""
    logs = np.log2(weights, out=np.zeros_like(weights), where=weights > 0)  # (..., L, S)
    return 0.0 - (weights * logs).sum(axis=-1)  # type: ignore[no-any-return]  # 0.0 − x: no −0.0
