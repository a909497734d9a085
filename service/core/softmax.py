"""Row-wise softmax over keys, with a policy for rows where every key is masked; and the same
softmax a block of keys at a time, as FlashAttention computes it (:func:`online_softmax`)."""

from dataclasses import dataclass
from typing import Any, Literal

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
    return softmax_rows(masked_scores, empty_rows)[0]


def softmax_rows(
    masked_scores: Array, empty_rows: Literal["zero", "uniform"] = "zero"
) -> tuple[Array, BoolArray]:
    """:func:`softmax`, and which query rows had every key masked ``(..., L)`` (their maximum is
    −∞: :func:`fully_masked` without another pass over the scores)."""
    row_max = masked_scores.max(axis=-1, keepdims=True)  # (..., L, 1), −∞ on fully masked rows
    empty = np.isneginf(row_max)  # (..., L, 1)
    weights = masked_scores - np.where(empty, 0.0, row_max)  # (..., L, S), −∞ stays −∞
    np.exp(weights, out=weights)  # exp(−∞) = 0
    denom = weights.sum(axis=-1, keepdims=True)  # (..., L, 1), 0 on fully masked rows
    np.divide(weights, np.where(empty, 1.0, denom), out=weights)
    if empty_rows == "uniform" and empty.any():
        weights[np.broadcast_to(empty, weights.shape)] = 1.0 / weights.shape[-1]
    return weights, empty[..., 0]


@dataclass(frozen=True)
class OnlineSoftmax:
    """FlashAttention's softmax a block of keys at a time (Milakov & Gimelshein 2018, "Online
    normalizer calculation for softmax"; Dao et al. 2022): after each block, every query row's
    running max ``m``, running sum ``l`` and running output ``o`` (the weighted sum of the
    values so far divided by ``l``). Index it as the arrays it was computed from (batch, head)
    to get the entries of one trace: ``[{"keys": [start, end], "m", "l", "o"}, …]``."""

    starts: tuple[int, ...]  # each block's first key
    ends: tuple[int, ...]  # one past its last
    m: Array  # (..., n_blocks, L)  −∞ while a row has met no allowed key
    l: Array  # (..., n_blocks, L)  # noqa: E741  (the paper's ℓ)
    o: Array  # (..., n_blocks, L, d_v)

    def __getitem__(self, index: Any) -> list[dict[str, Any]]:
        m, l, o = self.m[index], self.l[index], self.o[index]  # noqa: E741
        return [
            {"keys": [a, b], "m": m[..., i, :], "l": l[..., i, :], "o": o[..., i, :, :]}
            for i, (a, b) in enumerate(zip(self.starts, self.ends, strict=True))
        ]


def online_softmax(
    logits: Array, v: Array, block_size: int, sink: Array | None = None
) -> OnlineSoftmax:
    """Softmax(logits) V computed a block of ``block_size`` keys at a time, as FlashAttention
    does without holding a whole row: for each block, ``m_new = max(m, max_j s_j)``,
    ``l = l · exp(m − m_new) + Σ_j exp(s_j − m_new)``, and the unnormalised output rescaled by
    the same ``exp(m − m_new)`` plus ``Σ_j exp(s_j − m_new) v_j``; ``o`` is it divided by ``l``.
    ``logits (..., L, S)`` are the final scores (−∞ masked), ``v (..., S, d_v)``. ``sink (..., L)``
    (gpt-oss's, broadcast to the rows) starts every row at ``m = sink, l = 1`` with no value.
    After the last block ``o`` equals ``softmax(logits) V`` (rows with every key masked: 0)."""
    rows = logits.shape[:-1]  # (..., L)
    m = np.full(rows, -np.inf) if sink is None else np.broadcast_to(sink, rows).astype(np.float64)
    l = np.zeros(rows) if sink is None else np.ones(rows)  # noqa: E741
    acc = np.zeros((*rows, v.shape[-1]))  # (..., L, d_v)  the unnormalised output
    starts = tuple(range(0, logits.shape[-1], block_size))
    ends = tuple(min(a + block_size, logits.shape[-1]) for a in starts)
    ms, ls, os_ = [], [], []
    for a, b in zip(starts, ends, strict=True):
        block = logits[..., a:b]  # (..., L, b − a)
        m_new = np.maximum(m, block.max(axis=-1))  # (..., L)
        seen = np.isfinite(m_new)  # rows that have met an allowed key (or a sink)
        safe = np.where(seen, m_new, 0.0)[..., None]  # (..., L, 1)
        rescale = np.exp(m - safe[..., 0])  # (..., L)  exp(m_old − m_new); 0 while m_old is −∞
        p = np.exp(block - safe)  # (..., L, b − a), masked keys 0
        l = l * rescale + p.sum(axis=-1)  # noqa: E741
        acc = acc * rescale[..., None] + p @ v[..., a:b, :]  # (..., L, d_v)
        m = m_new
        ms.append(m)
        ls.append(l)
        os_.append(acc / np.where(l > 0, l, 1.0)[..., None])  # (..., L, d_v)
    return OnlineSoftmax(starts, ends, np.stack(ms, -2), np.stack(ls, -2), np.stack(os_, -3))
