"""The variants of modern attention: their settings (:class:`Variants`, in the order they
apply) and their math: clipping, QK-norm, the queries' temperature, logit soft-capping, sinks
and the output gate.

They act between the projections and the weights, in the order the contract fixes: ``clip``
on Q, K and V right after the projections (OLMo's ``clip_qkv``), ``qk_norm`` on Q and K (Qwen3; after RoPE for Llama 4), ``temperature_factors`` on Q (Llama
4), a weightless ``qk_norm`` on V (Gemma 4), then the scores, then ``softcap`` on the scaled
scores (Gemma 2), then position bias and mask, then ``softmax_with_sink`` in place of the plain
softmax (gpt-oss); ``sigmoid`` gates the heads' concatenation (Qwen3-Next). Shapes use paper names: L queries, S keys, d_k query/key width, h heads;
every function accepts leading batch axes (``...``). NumPy only, no I/O.
"""

from dataclasses import dataclass

import numpy as np

from service.core.errors import AttentionInputError, require_finite
from service.core.positions import Rope
from service.core.softmax import fully_masked, softmax
from service.core.types import Array, BoolArray, IntArray, QKNormOver, QKNormType


@dataclass(frozen=True)
class QKNorm:
    """Settings of one QK-norm (the query's or the key's: each has its own weight).

    The contract's ``{"type", "eps", "q_weight", "k_weight"}`` gives two of these, sharing
    ``type`` and ``eps``, as Qwen3 has ``q_norm`` and ``k_norm``. ``over`` says which features
    one norm spans: ``"head"`` each head's d_k (Qwen3), ``"projection"`` all h·d_k features of a
    token's projection, heads together (OLMo 2's ``RMSNorm(num_heads * head_dim)`` before the
    head split). The weight (and the bias, ``"layer"`` only: Phi's ``nn.LayerNorm(head_dim)``)
    is ``(d_k,)`` shared by the heads, ``(H, d_k)`` one row per head (Cohere's
    ``CohereLayerNorm((num_heads, head_dim))``, StableLM's ``StableLmLayerNormPerHead``), or with
    ``"projection"`` ``(H·d_k,)``, the projection's features in head order.
    """

    type: QKNormType = "rms"
    eps: float = 1e-6
    weight: Array | None = None  # (d_k,), (H, d_k) or (H·d_k,) (projection); None = ones
    zero_centered: bool = False  # the weight applies as (1 + w) (Qwen3-Next's RMSNorm)
    after_rope: bool = False  # applied to the rotated vectors (Llama 4), not before RoPE
    over: QKNormOver = "head"  # "projection": all heads of a token at once (OLMo 2)
    bias: Array | None = None  # shaped as the weight; "layer" only (Phi's nn.LayerNorm)


@dataclass(frozen=True)
class Temperature:
    """A query scale growing with the log of the position: the query at position p is multiplied
    by ``log(⌊(p + position_shift)/floor_scale⌋ + 1) · attn_scale + 1``. Llama 4's on its layers
    without RoPE (``attn_temperature_tuning``): position_shift 1; Ministral 3's on every layer,
    after RoPE (``llama_4_scaling_beta`` β as attn_scale, ``original_max_position_embeddings``
    as floor_scale): position_shift 0."""

    floor_scale: float = 8192.0
    attn_scale: float = 0.1
    position_shift: int = 1  # added to p before the division: Llama 4 1, Ministral 3 0


@dataclass(frozen=True)
class SinkSoftmax:
    """Row softmax with an attention sink: the key weights and the sink's share of each row."""

    weights: Array  # (..., L, S)  rows sum to 1 − sink_weights
    sink_weights: Array  # (..., L)  the weight the sink takes in each row
    fully_masked_rows: BoolArray  # (..., L)  rows whose every key is masked (all to the sink)


def clip(x: Array, c: float) -> Array:
    """``x`` clamped to [−c, c] elementwise: OLMo's ``clip_qkv`` (transformers
    ``OlmoAttention.forward``: ``query_states.clamp_(min=-clip_qkv, max=clip_qkv)``, and the
    same for the keys and values, right after the projections, before the heads are split).
    ``x (..., n, d)``: queries, keys or values; ``c`` a finite number > 0. Shaped like ``x``."""
    if not (np.isfinite(c) and c > 0):
        raise AttentionInputError(f"clip_qkv must be a finite number > 0, not {c}")
    return np.clip(x, -c, c)  # (..., n, d)


def qk_norm(x: Array, settings: QKNorm) -> Array:
    """Normalise each query or key vector of ``x (..., n, d_k)`` over its own d_k features, or
    (``over="projection"``) each token's vectors of all heads of ``x (..., H, n, d_k)`` together.

    ``"rms"``: ``x / sqrt(mean(x²) + eps) · w`` (RMSNorm, Zhang & Sennrich 2019; Qwen3's
    ``q_norm``/``k_norm`` = ``Qwen3RMSNorm(head_dim)``, ``torch.nn.functional.rms_norm``).
    ``"layer"``: ``(x − mean) / sqrt(var + eps) · w + b`` with the biased variance
    (``torch.nn.functional.layer_norm``; no bias unless ``settings.bias``, Phi's). ``w`` is
    ``settings.weight``, ones when None, and ``1 + w`` when ``settings.zero_centered``
    (Qwen3-Next's ``Qwen3NextRMSNorm``, which stores w around 0). With no weight and type rms
    it is Llama 4's ``Llama4TextL2Norm`` and Gemma 4's weightless ``v_norm``. For heads pass
    ``(B, H, n, d_k)``: over ``"head"`` the norm is per head, never across heads (Qwen3: "only
    on the head dim"); over ``"projection"`` the mean runs over the H·d_k features of a token
    (OLMo 2's ``q_norm(q_proj(x))`` before ``.view(..., -1, head_dim)``): keys repeated to the
    query heads for grouped-query attention give the same mean, each original head counted
    alike. A weight or bias per head ``(H_w, d_k)`` (or a projection's ``(H_w·d_k,)``) with
    H_w dividing H serves H / H_w heads in a row, as ``repeat_interleave`` repeats key/value
    heads. Returns an array shaped like ``x``.

    A mean square or variance that overflows float64 (values beyond ~1e154) is refused with
    :class:`AttentionInputError`, as is a zero (rms) or constant (layer) vector with eps 0.
    """
    eps = settings.eps
    if not (np.isfinite(eps) and eps >= 0):
        raise AttentionInputError(f"qk_norm eps must be a finite number ≥ 0, not {eps}")
    if settings.bias is not None and settings.type != "layer":
        raise AttentionInputError("a qk_norm bias needs type layer (RMSNorm has none)")
    axes = (-1,) if settings.over == "head" else (-3, -1)  # a head's d_k, or all of a token's
    if settings.over == "projection" and x.ndim < 3:
        raise AttentionInputError("qk_norm over the projection needs heads: (..., h, n, d_k)")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        if settings.type == "rms":
            centred = x  # (..., H, n, d_k)
            spread = np.mean(x * x, axis=axes, keepdims=True)  # (..., 1|H, n, 1)  mean(x²)
        else:
            centred = x - x.mean(axis=axes, keepdims=True)  # (..., H, n, d_k)  x − mean
            spread = np.mean(centred * centred, axis=axes, keepdims=True)  # biased var
    what = "mean square" if settings.type == "rms" else "variance"
    require_finite(spread, f"the {what} in qk_norm ({settings.type})")
    denom = np.sqrt(spread + eps)  # (..., 1|H, n, 1)
    if (denom == 0).any():
        raise AttentionInputError(
            f"a norm ({settings.type}: qk_norm, v_norm or an MLA latent's) with eps 0 met a "
            f"vector whose {what} is 0: it cannot be normalised; give eps > 0"
        )
    out: Array = centred / denom  # (..., H, n, d_k)
    w, b = (
        _along(settings.weight, x, settings, "weight"),
        _along(settings.bias, x, settings, "bias"),
    )
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        if w is not None:
            out = out * (1.0 + w if settings.zero_centered else w)  # (..., H, n, d_k)
        if b is not None:
            out = out + b
    if w is not None or b is not None:
        require_finite(out, f"qk_norm ({settings.type}) times its weight, plus its bias")
    return out


def _along(a: Array | None, x: Array, settings: QKNorm, name: str) -> Array | None:
    """A norm's weight or bias as it broadcasts over ``x (..., H, n, d_k)``: ``(d_k,)`` as it
    is; one row per head, ``(H_w, d_k)`` or over the projection ``(H_w·d_k,)``, as ``(H, 1,
    d_k)`` with each row serving H / H_w heads in a row (grouped-query attention's keys)."""
    if a is None:
        return None
    d_k = x.shape[-1]
    if a.shape == (d_k,) and settings.over == "head":
        return a  # (d_k,)  shared by every head
    heads = x.shape[-3] if x.ndim >= 3 else 0
    rows = a.reshape(-1, d_k) if a.ndim == 1 and a.size % d_k == 0 else a  # (H_w, d_k)
    if rows.ndim != 2 or rows.shape[1] != d_k or not heads or heads % rows.shape[0]:
        raise AttentionInputError(
            f"qk_norm {name} has shape {list(a.shape)} but the query/key vectors have {d_k} "
            f"features in {heads or 'no'} heads: it must be a vector of {d_k} numbers (shared "
            f"by the heads), [h][{d_k}] (one per head) or, over the projection, [h·{d_k}]"
        )
    return np.repeat(rows, heads // rows.shape[0], axis=0)[:, None, :]  # (H, 1, d_k)


def temperature_factors(positions: IntArray, t: Temperature) -> Array:
    """``(L,)`` the factor of each query: ``log1p(⌊(p + s)/floor_scale⌋) · attn_scale + 1`` at
    position p, s the position_shift (transformers ``Llama4TextAttention.forward``, s = 1, from
    "Scalable-Softmax", Nakanishi 2025; ``Ministral3Attention``'s ``get_llama_4_attn_scale``,
    s = 0): 1 within the first floor_scale − s positions, growing with the log of the
    position."""
    if not (np.isfinite(t.floor_scale) and t.floor_scale > 0 and np.isfinite(t.attn_scale)):
        raise AttentionInputError("temperature needs a finite floor_scale > 0 and attn_scale")
    shifted = positions.astype(np.float64) + float(t.position_shift)  # (L,)
    steps = np.floor(shifted / t.floor_scale)  # (L,)
    if (steps <= -1).any():
        raise AttentionInputError(
            "temperature is defined for positions p with p + position_shift ≥ 0 (log of "
            "⌊(p + position_shift)/floor_scale⌋ + 1)"
        )
    return np.log1p(steps) * t.attn_scale + 1.0


def sigmoid(z: Array) -> Array:
    """``1 / (1 + exp(−z))`` elementwise (Qwen3-Next's output gate, ``torch.sigmoid``): exp(−z)
    overflowing to ∞ gives the right limit 0."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-z))


def softcap(scaled_scores: Array, cap: float) -> Array:
    """Soft-cap the scaled scores: ``c · tanh(s / c)`` (Gemma 2, ``attn_logit_softcapping``).

    ``scaled_scores (..., L, S)``; ``cap`` = c, a finite number > 0. The result lies in
    [−c, c], is odd in s and ≈ s for |s| ≪ c. The contract applies it before bias and mask,
    so it normally sees finite scores; should it meet −∞ (a masked key) it keeps −∞ (the key
    stays masked) rather than mapping it to −c as the bare formula would. NaN and +∞ are
    refused with :class:`AttentionInputError`.
    """
    if not (np.isfinite(cap) and cap > 0):
        raise AttentionInputError(f"softcap must be a finite number > 0, not {cap}")
    masked = np.isneginf(scaled_scores)  # (..., L, S)
    if not (np.isfinite(scaled_scores) | masked).all():
        raise AttentionInputError("softcap got scores that are NaN or +infinity")
    with np.errstate(over="ignore"):  # s/c → ±∞ for a tiny c: tanh(±∞) = ±1, the right limit
        capped: Array = cap * np.tanh(scaled_scores / cap)  # (..., L, S)
    capped[masked] = -np.inf  # −∞ stays −∞ (tanh alone would give −c)
    return capped


def softmax_with_sink(scores: Array, sink: float | Array) -> SinkSoftmax:
    """Row softmax over keys plus one sink logit per head (gpt-oss "attention sinks").

    ``weights_j = exp(s_j − m) / (Σ_k exp(s_k − m) + exp(sink − m))``, m the row's max over
    the keys and the sink; the sink is one more key with no value, dropped after the softmax
    (transformers ``models/gpt_oss`` ``eager_attention_forward``). ``scores (..., L, S)`` are
    the final logits (scaled, capped, biased, masked), finite or −∞ (masked). ``sink`` is a
    number, shared by every row (``/attention``, any batch), or an array ``(h,)``, one per
    head, for scores ``(..., h, L, S)`` (``/multihead``: ``(B, h, L, S)``).

    Each row's weights sum to ``1 − sink_weights``; a row whose every key is masked gives all
    its weight to the sink (weights 0, sink weight 1) — no fully-masked policy applies, as
    the contract says. Returns :class:`SinkSoftmax`.
    """
    sinks = np.asarray(sink, dtype=np.float64)
    if not np.isfinite(sinks).all():
        raise AttentionInputError("sinks must be finite numbers")
    if not (np.isfinite(scores) | np.isneginf(scores)).all():
        raise AttentionInputError("the scores before the sink softmax are NaN or +infinity")
    rows = (*scores.shape[:-1], 1)  # (..., L, 1)
    if sinks.ndim == 0:
        sink_col = np.broadcast_to(sinks, rows)  # (..., L, 1)
    elif sinks.ndim == 1 and scores.ndim >= 3 and sinks.shape[0] == scores.shape[-3]:
        sink_col = np.broadcast_to(sinks[:, None, None], rows)  # (..., h, L, 1)
    else:
        heads = scores.shape[-3] if scores.ndim >= 3 else 1
        raise AttentionInputError(
            f"sinks has shape {list(sinks.shape)}: give one number, or one per head "
            f"({heads} numbers for scores shaped {list(scores.shape)})"
        )
    with_sink = np.concatenate([scores, sink_col], axis=-1)  # (..., L, S + 1), sink last
    with np.errstate(over="ignore"):  # s − m below −1.8e308 gives −∞, whose exp is the right 0
        probs = softmax(with_sink)  # (..., L, S + 1)  never empty: the sink is finite
    return SinkSoftmax(
        weights=np.ascontiguousarray(probs[..., :-1]),  # (..., L, S)
        sink_weights=np.ascontiguousarray(probs[..., -1]),  # (..., L)
        fully_masked_rows=fully_masked(scores),  # (..., L)
    )


@dataclass(frozen=True)
class Variants:
    """The variants of modern attention, in the order they apply (each None when off):
    clipping (OLMo), QK-norm (before RoPE, or after it when ``after_rope``), RoPE, the queries' temperature, the
    values' norm, soft-capping, a position bias (ALiBi or T5, computed from the positions by
    service.core.positions), sinks; and the scale a layer sets itself (Granite's
    ``attention_multiplier``: the plan's scale, here for the words and the diagnosis)."""

    clip_qkv: float | None = None  # OLMo: q, k, v clamped to ±clip_qkv after the projections
    q_norm: QKNorm | None = None
    k_norm: QKNorm | None = None
    rope: Rope | None = None
    temperature: Temperature | None = None  # Llama 4, on layers without RoPE
    v_norm: QKNorm | None = None  # Gemma 4: RMSNorm of each value vector, no weight
    positions: IntArray | None = None  # (L,) query positions; default 0 … L−1
    context_positions: IntArray | None = None  # (S,) key positions; default 0 … S−1
    softcap: float | None = None
    position_bias: Array | None = None  # broadcastable to (..., L, S)
    sinks: float | Array | None = None  # one number, or one per head (h,)
    attention_multiplier: float | None = None  # Granite: the scale, in place of 1/√d_k


# ---- the backward of each variant (issue 44: the chain's rules call these) -------------------


def clip_backward(grad: Array, x: Array, c: float) -> Array:
    """The gradient through :func:`clip`: ``grad`` where −c ≤ x ≤ c, 0 where x was clamped
    (``torch.clamp``'s backward, the bounds themselves passing). ``grad``, ``x (..., n, d)``."""
    return np.where((x >= -c) & (x <= c), grad, 0.0)


@dataclass(frozen=True)
class NormGrad:
    """The gradients through a norm: of its input, and of its weight and bias (None when it
    has none), each shaped as what it is the gradient of."""

    x: Array
    weight: Array | None = None
    bias: Array | None = None


def _folded(g: Array, a: Array, x: Array, settings: QKNorm) -> Array:
    """The gradient of :func:`_along`'s broadcast of ``a`` folded back to ``a``'s shape: summed
    over every axis it broadcast along, and over the heads a row served."""
    d_k = x.shape[-1]
    if a.shape == (d_k,) and settings.over == "head":
        shared: Array = g.reshape(-1, d_k).sum(axis=0)  # (d_k,)
        return shared
    per_head = np.moveaxis(g, -3, 0).reshape(g.shape[-3], -1, d_k).sum(axis=1)  # (H, d_k)
    rows = a.size // d_k  # H_w rows, each serving H / H_w heads in a row
    folded: Array = per_head.reshape(rows, -1, d_k).sum(axis=1).reshape(a.shape)
    return folded


def qk_norm_backward(x: Array, settings: QKNorm, grad: Array) -> NormGrad:
    """The gradient through :func:`qk_norm` of ``x`` (the same forms and shapes), given
    ``grad`` of its output: with y the normalised x and r its denominator, n features per norm,
    dy = grad·w, rms ``dx = (dy − y·mean(dy·y)) / r``, layer ``dx = (dy − mean(dy) −
    y·mean(dy·y)) / r`` (Ba et al. 2016's layer norm backward), the weight's ``Σ grad·y`` and
    the bias's ``Σ grad`` over every vector that used them."""
    axes = (-1,) if settings.over == "head" else (-3, -1)
    centred = x if settings.type == "rms" else x - x.mean(axis=axes, keepdims=True)
    denom = np.sqrt(np.mean(centred * centred, axis=axes, keepdims=True) + settings.eps)
    y = centred / denom  # (..., H, n, d_k)
    w = _along(settings.weight, x, settings, "weight")
    scale = None if w is None else (1.0 + w if settings.zero_centered else w)
    dy = grad if scale is None else grad * scale  # (..., H, n, d_k)
    dx = dy - y * np.mean(dy * y, axis=axes, keepdims=True)
    if settings.type == "layer":
        dx = dx - np.mean(dy, axis=axes, keepdims=True)
    weight, bias = settings.weight, settings.bias
    return NormGrad(
        dx / denom,
        None if weight is None else _folded(grad * y, weight, x, settings),
        None if bias is None else _folded(grad, bias, x, settings),
    )


def softcap_backward(grad: Array, scaled_scores: Array, cap: float) -> Array:
    """The gradient through :func:`softcap`: ``grad ∘ (1 − tanh²(s/c))`` (0 where s is −∞)."""
    with np.errstate(over="ignore"):
        t = np.tanh(scaled_scores / cap)  # (..., L, S)
    return grad * (1.0 - t * t)


def sigmoid_backward(grad: Array, gate: Array) -> Array:
    """The gradient through :func:`sigmoid` given its output ``gate``: ``grad·gate·(1 − gate)``."""
    return grad * gate * (1.0 - gate)
