"""A trained BERT-shaped model's forward pass in float64: embeddings, then post-LN blocks of
multi-head attention and a GELU feed-forward (Devlin et al. 2019; transformers'
``BertModel``, ``BertEmbeddings``, ``BertLayer``), the attention run by
:func:`service.core.multihead.multihead_attention` so that each layer is exactly what
/multihead computes. ``causal`` makes it a decoder (``BertConfig(is_decoder=True)``). Then
what people look at in a trained model: each head's role (:func:`head_roles`) and attention
rollout (:func:`rollout`, Abnar & Zuidema 2020). NumPy only, no I/O.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from service.core import masks
from service.core.multihead import LayerNorm, MultiheadWeights, layer_norm, multihead_attention
from service.core.types import Array, IntArray


@dataclass(frozen=True)
class Block:
    """One post-LN block's weights, in in_out layout (``x @ w + b``)."""

    attention: MultiheadWeights  # w_q, w_k, w_v (d, d), w_o (d, d), with biases
    attention_norm: LayerNorm  # after attention + residual
    w_in: Array  # (d, d_ff)
    b_in: Array  # (d_ff,)
    w_out: Array  # (d_ff, d)
    b_out: Array  # (d,)
    output_norm: LayerNorm  # after the feed-forward + residual


@dataclass(frozen=True)
class Encoder:
    """A whole model: embedding tables, their layer norm, the blocks."""

    word: Array  # (vocab, d)
    position: Array  # (max_positions, d)
    token_type: Array  # (types, d)
    embedding_norm: LayerNorm
    blocks: tuple[Block, ...]
    num_heads: int
    causal: bool = False


@dataclass(frozen=True)
class Forward:
    """What the forward pass computed, layer by layer."""

    hidden: tuple[Array, ...]  # layers + 1 of (L, d): the embeddings, then each block's output
    attention: Array  # (layers, h, L, L): every head's weights, rows are queries
    attention_output: tuple[Array, ...]  # layers of (L, d): the attention block after its norm


# erf on a grid, with its first two derivatives, for quintic Hermite interpolation: within
# ~1e-16 of the correctly rounded erf on |x| < 6 (and exactly ±1 beyond, where erfc < 2e-17).
# Each interval's polynomial in t ∈ [0, 1] is worked out once, in extended precision, from the
# exact values and derivatives at its two ends.
_ERF_STEP = 1.0 / 256


def _erf_polynomials() -> Array:
    """(n, 6): the coefficients c_0 … c_5 of erf(x_i + t·h) = Σ c_k t^k on each interval."""
    grid = np.arange(0.0, 6.0 + 2 * _ERF_STEP, _ERF_STEP)  # (n + 1,)
    h = np.longdouble(_ERF_STEP)
    p = np.array([math.erf(float(x)) for x in grid], dtype=np.longdouble)  # erf
    m = (
        h * 2 / np.sqrt(np.longdouble(math.pi)) * np.exp(-(grid.astype(np.longdouble) ** 2))
    )  # h·erf′
    a = h * -2 * grid.astype(np.longdouble) * m  # h²·erf″ = h²·(−2x erf′)
    p0, p1, m0, m1, a0, a1 = p[:-1], p[1:], m[:-1], m[1:], a[:-1], a[1:]
    c3 = -10 * p0 - 6 * m0 - 1.5 * a0 + 0.5 * a1 - 4 * m1 + 10 * p1
    c4 = 15 * p0 + 8 * m0 + 1.5 * a0 - a1 + 7 * m1 - 15 * p1
    c5 = -6 * p0 - 3 * m0 - 0.5 * a0 + 0.5 * a1 - 3 * m1 + 6 * p1
    return np.stack([p0, m0, a0 / 2, c3, c4, c5], axis=1).astype(np.float64)


_ERF_POLY = _erf_polynomials()  # (n, 6)
# each coefficient's column on its own, contiguous: gathered by index one at a time (a gather of
# whole (…, 6) rows and its strided columns cost twice as much, profiled at 128 tokens)
_ERF_COEFFICIENTS = tuple(np.ascontiguousarray(_ERF_POLY[:, k]) for k in range(6))


_BLOCK = 16_384  # elements worked on at a time: its few temporaries stay in the CPU's cache (a
# 128 × 1536 GELU input at once: 5.9 ms; in blocks of 16k: 1.9 ms; of 4k: 2.5 ms; of 64k: 5.6 ms)


def _erf_block(x: Array) -> Array:
    """:func:`erf` of a flat block ``x (n,)``."""
    a = np.minimum(np.abs(x), 6.0)  # erf is odd; erf(6) = 1 − 2e-17 rounds to 1
    scaled = a * (1.0 / _ERF_STEP)
    i = np.minimum(scaled.astype(np.intp), _ERF_POLY.shape[0] - 1)  # (n,)
    t = scaled - i  # (n,) in [0, 1]
    c = _ERF_COEFFICIENTS
    value: Array = np.take(c[5], i)  # (n,) Horner's rule, in place: c5·t⁵ + … + c0
    for k in (4, 3, 2, 1, 0):
        value *= t
        value += np.take(c[k], i)
    value[a >= 6.0] = 1.0
    np.copysign(value, x, out=value)
    return value


def _blockwise(f: Callable[[Array], Array], x: Array) -> Array:
    """``f`` (elementwise) of ``x``, a block of _BLOCK elements at a time."""
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat)
    for start in range(0, flat.size, _BLOCK):
        out[start : start + _BLOCK] = f(flat[start : start + _BLOCK])
    return out.reshape(np.shape(x))


def erf(x: Array) -> Array:
    """The error function, elementwise, as ``math.erf`` gives it (to ~1e-16), vectorised:
    quintic Hermite interpolation between exact values on a grid of step 1/256."""
    return _blockwise(_erf_block, x)


def _gelu_block(x: Array) -> Array:
    value = _erf_block(x / math.sqrt(2.0))  # (n,)
    value += 1.0
    value *= x
    value *= 0.5
    return value


def gelu(x: Array) -> Array:
    """GELU with the exact erf (Hendrycks & Gimpel 2016; torch's ``gelu``, BERT's "gelu"):
    x · Φ(x) = x/2 · (1 + erf(x/√2))."""
    return _blockwise(_gelu_block, x)


def embed(ids: IntArray, model: Encoder) -> Array:
    """(L, d): word + position + token type 0 embeddings, layer-normed (``BertEmbeddings``)."""
    n = ids.shape[0]
    summed = model.word[ids] + model.position[:n] + model.token_type[0]  # (L, d)
    normed: Array = layer_norm(summed[None], model.embedding_norm)[0]
    return normed


def forward(ids: IntArray, model: Encoder, layers: int | None = None) -> Forward:
    """The model's first ``layers`` blocks (default: all) on one sequence of token ids
    ``(L,)``: the hidden states entering block ``layers`` need no block after it."""
    hidden = [embed(ids, model)]
    weights, attended = [], []
    n = ids.shape[0]
    mask = masks.combine([masks.Causal()], 1, n, n) if model.causal else None
    for block in model.blocks[:layers]:
        x = hidden[-1]  # (L, d)
        trace = multihead_attention(
            x[None],
            block.attention,
            num_heads=model.num_heads,
            mask=mask,
            residual=True,
            norm=block.attention_norm,
        )
        a = trace.output[0]  # (L, d)
        inner = gelu(a @ block.w_in + block.b_in)  # (L, d_ff)
        out = layer_norm((a + inner @ block.w_out + block.b_out)[None], block.output_norm)[0]
        weights.append(trace.heads.weights[0])  # (h, L, L)
        attended.append(a)
        hidden.append(out)
    heads = np.stack(weights) if weights else np.zeros((0, model.num_heads, n, n))
    return Forward(tuple(hidden), heads, tuple(attended))


@dataclass(frozen=True)
class HeadRole:
    """What one head does on this sequence (API.md, "Trained models"): the mean weight its
    rows give to each kind of key, the mean entropy of its rows, and the role whose score is
    largest when it is at least 0.5."""

    previous_token: float
    next_token: float
    self: float
    first_token: float
    last_token: float
    induction: float | None  # None: no token repeats
    entropy_bits: float
    role: str | None


def _earlier(ids: IntArray) -> list[tuple[int, int]]:
    """(i, j): the positions whose token occurred before, with its most recent occurrence j."""
    last: dict[int, int] = {}
    pairs = []
    for i, token in enumerate(ids.tolist()):
        if token in last:
            pairs.append((i, last[token]))
        last[token] = i
    return pairs


def head_roles(weights: Array, ids: IntArray) -> list[list[HeadRole]]:
    """``[layers][heads]`` roles of ``weights (layers, h, L, L)`` on the tokens ``ids (L,)``."""
    n = ids.shape[0]
    rows = np.arange(n)  # (L,)
    earlier = np.array(_earlier(ids), dtype=np.intp).reshape(-1, 2)  # (k, 2): (i, j)
    queries, keys = earlier[:, 0], earlier[:, 1] + 1  # the token after j's occurrence
    plogp = np.log2(weights, out=np.zeros_like(weights), where=weights > 0)  # 0 where w = 0
    plogp *= weights  # (ℓ, h, L, L): w·log₂w, in place (one array of the weights' size)
    bits = -plogp.sum(axis=-1)  # (ℓ, h, L)

    def role(w: Array, entropy: Array) -> HeadRole:  # w (L, L)
        scores = {
            "previous_token": float(w[rows[1:], rows[1:] - 1].mean()) if n > 1 else 0.0,
            "next_token": float(w[rows[:-1], rows[:-1] + 1].mean()) if n > 1 else 0.0,
            "self": float(w[rows, rows].mean()),
            "first_token": float(w[:, 0].mean()),
            "last_token": float(w[:, n - 1].mean()),
        }
        induction = float(w[queries, keys].mean()) if queries.size else None
        candidates = scores if induction is None else scores | {"induction": induction}
        best = max(candidates, key=lambda k: candidates[k])
        return HeadRole(
            **scores,
            induction=induction,
            entropy_bits=float(entropy.mean()),
            role=best if candidates[best] >= 0.5 else None,
        )

    return [
        [role(weights[layer, h], bits[layer, h]) for h in range(weights.shape[1])]
        for layer in range(weights.shape[0])
    ]


def rollout(weights: Array) -> Array:
    """(L, L) attention rollout (Abnar & Zuidema 2020) of ``weights (layers, h, L, L)``:
    Â_ℓ = rows of ½·mean_heads(A_ℓ) + ½·I renormalised; R_1 = Â_1, R_ℓ = Â_ℓ · R_(ℓ−1)."""
    n = weights.shape[-1]
    result = np.eye(n)
    for layer in weights:  # (h, L, L)
        a = 0.5 * layer.mean(axis=0) + 0.5 * np.eye(n)  # (L, L)
        a = a / a.sum(axis=-1, keepdims=True)
        result = a @ result
    return result
