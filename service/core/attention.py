"""Scaled dot-product attention that keeps every intermediate.

Shapes use paper names: L queries, S keys, d_k query/key width, d_v value width. Every
function accepts any number of leading batch axes (``...``): ``(B, L, d)`` for a batch,
``(B, h, L, d)`` for heads. Weights are in ``in_out`` layout (``X @ W``); the API converts
other layouts before calling in here.
"""

from dataclasses import dataclass, replace

import numpy as np

from service.core.errors import AttentionInputError, FullyMaskedRowsError, require_finite
from service.core.positions import rope, sequence_length
from service.core.softmax import fully_masked, rows_by_item, softmax
from service.core.types import Array, BoolArray, FullyMaskedPolicy
from service.core.variants import (
    Variants,
    qk_norm,
    softcap,
    softmax_with_sink,
    temperature_factors,
)


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
class Past:
    """A key/value cache as a Hugging Face ``DynamicCache`` holds it: keys already normed and
    rotated, values already normed, P tokens."""

    k: Array  # (..., P, d_k)
    v: Array  # (..., P, d_v)

    @property
    def length(self) -> int:
        return int(self.k.shape[-2])

    def repeated(self, group: int) -> "Past":
        """The cache per query head: each key/value head's ``(B, h_kv, P, ·)`` repeated for the
        ``group`` query heads it serves (grouped-query attention, as ``repeat_kv``)."""
        if group == 1:
            return self
        return Past(np.repeat(self.k, group, axis=1), np.repeat(self.v, group, axis=1))


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


@dataclass(frozen=True)
class QueriesAndKeys:
    """The queries and keys as the variants leave them, with the intermediates on the way."""

    q: Array  # (..., L, d_k)  what the scores use
    k: Array  # (..., S, d_k)
    q_normed: Array | None = None
    k_normed: Array | None = None
    q_rotated: Array | None = None
    k_rotated: Array | None = None
    q_tempered: Array | None = None


def queries_and_keys(q: Array, k: Array, var: Variants) -> QueriesAndKeys:
    """QK-norm, RoPE and the temperature in the contract's order: the norm before RoPE
    (Qwen3, Gemma) or after it (``after_rope``: Llama 4's ``Llama4TextL2Norm`` follows
    ``apply_rotary_emb``), then the queries times their temperature (Llama 4's NoPE layers).
    ``q (..., L, d_k)``, ``k (..., S, d_k)``; positions default to 0 … n−1."""
    l_pos = np.arange(q.shape[-2]) if var.positions is None else var.positions  # (L,)
    s_pos = np.arange(k.shape[-2]) if var.context_positions is None else var.context_positions
    after = var.q_norm is not None and var.q_norm.after_rope
    q_normed = k_normed = q_rotated = k_rotated = q_tempered = None
    if var.q_norm is not None and var.k_norm is not None and not after:
        q, k = q_normed, k_normed = qk_norm(q, var.q_norm), qk_norm(k, var.k_norm)
    if var.rope is not None:
        n = sequence_length(l_pos)  # the scalings that depend on it take the queries'
        q = q_rotated = rope(q, l_pos, var.rope, n)  # (..., L, d_k)
        k = k_rotated = rope(k, s_pos, var.rope, n)  # (..., S, d_k)
    if var.q_norm is not None and var.k_norm is not None and after:
        q, k = q_normed, k_normed = qk_norm(q, var.q_norm), qk_norm(k, var.k_norm)
    if var.temperature is not None:
        factors = temperature_factors(l_pos, var.temperature)  # (L,)
        q = q_tempered = q * factors[:, None]  # (..., L, d_k)
    return QueriesAndKeys(q, k, q_normed, k_normed, q_rotated, k_rotated, q_tempered)


def default_scale(d_k: int) -> float:
    """1/√d_k, the scale of Vaswani et al. (2017)."""
    return 1.0 / float(np.sqrt(d_k))


def transposed(a: Array) -> Array:
    """``a (..., n, d)`` as ``(..., d, n)``, contiguous: NumPy multiplies stacked matrices by a
    transposed view in a slow loop of its own instead of BLAS (keys of 12 heads × 128 × 32,
    contiguous: 186 ms against 0.45 ms with the copy, on a busy 2-vCPU Xeon; L = 512, two
    heads, d_k = 2: 6.8 ms against 0.55 ms), and the copy costs n·d numbers next to n² · d."""
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


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

    ``variants`` adds, in this order (API.md, "Position and score variants"): QK-norm of Q and
    K, RoPE at ``positions``/``context_positions`` (:func:`queries_and_keys`), the values'
    norm, soft-capping of the scaled scores, a
    position bias, then (after the mask) the sinks, which join each row's softmax as one more
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
    qk = queries_and_keys(q, k, var)
    q_used, k_used = qk.q, qk.k  # (..., L, d_k), (..., S, d_k)
    v_normed = None if var.v_norm is None else qk_norm(v, var.v_norm)  # (..., S, d_v)
    present_k = present_v = None
    if past is not None:  # the cache as transformers updates it: normed, rotated, then stored
        k_used = present_k = np.concatenate([past.k, k_used], axis=-2)  # (..., P + L, d_k)
        v_new = v if v_normed is None else v_normed
        present_v = np.concatenate([past.v, v_new], axis=-2)  # (..., P + L, d_v)
    d_k = q.shape[-1]
    scale = default_scale(d_k) if scale is None else scale
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        scores = q_used @ transposed(k_used)  # (..., L, S)
        scaled_scores = scores * scale  # (..., L, S)
    require_finite(scaled_scores, "the scaled scores Q Kᵀ · scale")  # −∞ must not pass for a mask
    capped = None if var.softcap is None else softcap(scaled_scores, var.softcap)
    logits = scaled_scores if capped is None else capped
    position_bias = biased = None
    if var.position_bias is not None:
        position_bias = np.broadcast_to(var.position_bias, logits.shape)  # (..., L, S)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
            logits = biased = logits + position_bias  # (..., L, S)
        require_finite(biased, "the scores plus the position bias")
    masked_scores = None if additive is None else _add_mask(logits, additive)
    logits = logits if masked_scores is None else masked_scores

    sunk = None if var.sinks is None else softmax_with_sink(logits, var.sinks)
    if sunk is not None:
        empty = sunk.fully_masked_rows  # (..., L)
    elif masked_scores is None:  # only a mask makes a score −∞ (the others are refused above)
        empty = np.zeros(logits.shape[:-1], dtype=bool)  # (..., L)
    else:
        empty = fully_masked(logits)  # (..., L)
    if padded_queries is not None:
        empty &= ~padded_queries
    if sunk is not None:  # fully masked rows go to the sink: no policy applies
        weights = sunk.weights
    elif fully_masked_policy == "error" and empty.any():
        raise FullyMaskedRowsError(rows_by_item(empty))
    else:
        weights = softmax(logits, "uniform" if fully_masked_policy == "uniform" else "zero")
    sink_weights = None if sunk is None else sunk.sink_weights  # (..., L)
    if padded_queries is not None and padded_queries.any():
        weights[np.broadcast_to(padded_queries[..., None], weights.shape)] = 0.0
        if sink_weights is not None:  # a padded row attends to nothing, the sink included
            sink_weights = np.where(padded_queries, 0.0, sink_weights)  # (..., L)
    v_used = present_v if present_v is not None else v if v_normed is None else v_normed
    require_finite(v_used, "V")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        output = weights @ v_used  # (..., L, d_v)
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
        q_normed=qk.q_normed,
        k_normed=qk.k_normed,
        q_rotated=qk.q_rotated,
        k_rotated=qk.k_rotated,
        q_tempered=qk.q_tempered,
        v_normed=v_normed,
        present_k=present_k,
        present_v=present_v,
        capped_scores=capped,
        position_bias=position_bias,
        biased_scores=biased,
        sink_weights=sink_weights,
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
