"""Scaled dot-product attention that keeps every intermediate.

Shapes use paper names: L queries, S keys, d_k query/key width, d_v value width. Every
function accepts any number of leading batch axes (``...``): ``(B, L, d)`` for a batch,
``(B, h, L, d)`` for heads. Weights are in ``in_out`` layout (``X @ W``); the API converts
other layouts before calling in here.
"""

from dataclasses import dataclass, replace

import numpy as np

from service.core import chain
from service.core.linear import (
    Past,
    Projections,
    default_scale,
    project,
    project_qkv,
    transposed,
)
from service.core.types import Array, BoolArray, FullyMaskedPolicy
from service.core.variants import Variants

__all__ = [  # the linear parts live in service.core.linear; imported from here as before
    "AttentionTrace",
    "Past",
    "Projections",
    "default_scale",
    "entropy_bits",
    "project",
    "project_qkv",
    "scaled_dot_product_attention",
    "transposed",
]


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
    # the variants (service.core.variants), None when off
    q_clipped: Array | None = None  # (..., L, d_k)  Q clamped to ±clip_qkv (OLMo)
    k_clipped: Array | None = None  # (..., S, d_k)
    v_clipped: Array | None = None  # (..., S, d_v)
    q_normed: Array | None = None  # (..., L, d_k)  qk_norm(Q)
    k_normed: Array | None = None  # (..., S, d_k)  qk_norm(K)
    q_rotated: Array | None = None  # (..., L, d_k)  RoPE(Q), what the scores use
    k_rotated: Array | None = None  # (..., S, d_k)  RoPE(K)
    q_tempered: Array | None = None  # (..., L, d_k)  the queries times their temperature
    v_normed: Array | None = None  # (..., S, d_v)  rms_norm(V), what weights @ V uses
    present_k: Array | None = None  # (..., P + L, d_k)  the cache after this step (with past)
    present_v: Array | None = None  # (..., P + L, d_v)
    capped_scores: Array | None = None  # (..., L, S)  c · tanh(scaled / c)
    position_bias: Array | None = None  # (..., L, S)  ALiBi or T5 bias
    biased_scores: Array | None = None  # (..., L, S)  the scores so far + position_bias
    sink_weights: Array | None = None  # (..., L)  the weight each row gives the sink


def scaled_dot_product_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    scale: float | None = None,
    additive: Array | None = None,
    padded_queries: BoolArray | None = None,
    fully_masked_policy: FullyMaskedPolicy = "zero",
    variants: Variants | None = None,
    past: Past | None = None,
) -> AttentionTrace:
    """softmax(Q Kᵀ · scale + M) V, returning every step.

    q ``(..., L, d_k)``, k ``(..., S, d_k)``, v ``(..., S, d_v)``. ``scale`` defaults to
    1/√d_k. ``additive`` is a mask broadcastable to ``(..., L, S)``: 0 where a query may
    attend, −∞ where it may not, other finite values are biases (PyTorch float masks).
    ``padded_queries`` (broadcastable to ``(..., L)``) marks query rows whose weights, sink
    weight and output are forced to 0. Rows where every key is masked get weights 0
    (``"zero"``), 1/S (``"uniform"``) or raise :class:`FullyMaskedRowsError` (``"error"``);
    padding rows never count as such. Scores that overflow are refused, never taken for
    masked.

    It runs the head's steps (:data:`service.core.chain.HEAD`) with these guards. ``variants``
    adds, in this order (API.md, "Position and score variants"): Q, K and V clipped, QK-norm of Q and K, RoPE at
    ``positions``/``context_positions``, the queries' temperature, the values' norm,
    soft-capping of the scaled scores, a position bias, then (after the mask) the sinks, which join each row's softmax as one more
    key with no value; a row with every key masked then gives all its weight to the sink,
    whatever ``fully_masked_policy`` says (its weights are defined, so ``"error"`` does not
    refuse it), and is still flagged in ``fully_masked_rows``: the flags describe the mask.

    ``past`` makes this a decode step (transformers' ``Cache.update``): q, k, v are the L new
    tokens, at positions P … P + L − 1 unless given (the new keys at the queries' positions);
    their keys and values, normed and rotated, are appended to the cache's, and the scores run
    over all P + L keys (``additive`` must be ``(…, L, P + L)``).
    """
    var = variants or Variants()
    if past is not None:
        if var.positions is None:
            var = replace(var, positions=np.arange(past.length, past.length + q.shape[-2]))
        var = replace(var, context_positions=var.positions)  # the new keys are these tokens
    scale = default_scale(q.shape[-1]) if scale is None else scale
    setup = chain.Setup(var, scale, additive, padded_queries, fully_masked_policy, past)
    st = chain.run(chain.HEAD, chain.start(q, k, v), setup)
    assert st.fully_masked_rows is not None  # the softmax always runs
    return AttentionTrace(
        **_NONE | st.made,  # type: ignore[arg-type]  # the chain's names are the fields
        scale=scale,
        fully_masked_rows=st.fully_masked_rows,
    )


_NONE: dict[str, None] = {"masked_scores": None}  # the one field without a default


ENTROPY_BLOCK = 1 << 15  # weights per block of rows: the temporaries stay small (≈ 0.5 MB)


def entropy_bits(weights: Array) -> Array:
    """Shannon entropy in bits of each weight row, with 0·log 0 = 0.  (..., L, S) -> (..., L)

    Computed a block of rows at a time, so its temporaries never approach the size of the
    weights (they would add half again to a large request's memory)."""
    if weights.size <= ENTROPY_BLOCK:  # small: at once
        logs = np.log2(weights, out=np.zeros_like(weights), where=weights > 0)  # (..., L, S)
        logs *= weights
        return 0.0 - logs.sum(axis=-1)  # type: ignore[no-any-return]  # 0.0 − x: no −0.0
    rows = weights.reshape(-1, weights.shape[-1])  # (N, S), a view of contiguous weights
    out = np.empty(rows.shape[0])  # (N,)
    step = max(1, ENTROPY_BLOCK // max(1, rows.shape[1]))
    for start in range(0, rows.shape[0], step):
        block = rows[start : start + step]  # (n, S)
        logs = np.log2(block, out=np.zeros_like(block), where=block > 0)  # (n, S)
        logs *= block
        out[start : start + step] = 0.0 - logs.sum(axis=-1)  # 0.0 − x: no −0.0
    return out.reshape(weights.shape[:-1])
