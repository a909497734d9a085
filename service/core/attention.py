"""Scaled dot-product attention that keeps every intermediate.

Shapes use paper names: L queries, S keys, d_k query/key width, d_v value width. Every
function accepts any number of leading batch axes (``...``): ``(B, L, d)`` for a batch,
``(B, h, L, d)`` for heads. Weights are in ``in_out`` layout (``X @ W``); the API converts
other layouts before calling in here.
"""

from collections.abc import Mapping
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
    """Every intermediate of one scaled dot-product attention, by the name of the step of
    :data:`service.core.chain.HEAD` that made it, in order of computation (``made``): q, k, v
    ``(..., L|S, d)``, the variants' forms of them, the scores ``(..., L, S)`` and their
    scaled, capped, biased and masked forms, the weights and the output ``(..., L, d_v)``,
    and what a step keeps besides (:attr:`service.core.chain.Step.also`: the position bias,
    the sinks' weights). A step that was off is absent: ``trace.q_rotated`` is None then."""

    made: Mapping[str, Array]
    scale: float
    fully_masked_rows: BoolArray  # (..., L)  query rows that could attend to no key

    def __getattr__(self, name: str) -> Array | None:
        """An intermediate by its step's name (None when that step was off)."""
        if name in chain.NAMES:
            return self.made.get(name)
        raise AttributeError(name)

    @property
    def q(self) -> Array:
        return self.made["q"]  # (..., L, d_k)

    @property
    def k(self) -> Array:
        return self.made["k"]  # (..., S, d_k)

    @property
    def v(self) -> Array:
        return self.made["v"]  # (..., S, d_v)

    @property
    def scores(self) -> Array:
        return self.made["scores"]  # (..., L, S)  Q Kᵀ

    @property
    def scaled_scores(self) -> Array:
        return self.made["scaled_scores"]  # (..., L, S)  Q Kᵀ · scale

    @property
    def weights(self) -> Array:
        return self.made["weights"]  # (..., L, S)  row softmax

    @property
    def output(self) -> Array:
        return self.made["output"]  # (..., L, d_v)  weights V

    def with_arrays(self, **arrays: Array) -> "AttentionTrace":
        """This trace with some intermediates in another form (the cache per key/value head,
        MLA's Q and K as it computes them)."""
        return replace(self, made={**self.made, **arrays})


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
    scale = default_scale(q.shape[-1]) if scale is None else scale
    setup = chain.head_setup(
        q,
        scale=scale,
        additive=additive,
        padded_queries=padded_queries,
        fully_masked_policy=fully_masked_policy,
        variants=variants,
        past=past,
    )
    st = chain.run(chain.HEAD, chain.start(q, k, v), setup)
    assert st.fully_masked_rows is not None  # the softmax always runs
    return AttentionTrace(st.made, scale, st.fully_masked_rows)


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
