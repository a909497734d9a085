"""Multi-head latent attention (DeepSeek-V2 §2.1, DeepSeek V3, Kimi K2), keeping every
intermediate: queries and keys/values pass through low-rank latents, and one RoPE key per token
is shared by all heads, so a cache holds ``kv_lora_rank + qk_rope_head_dim`` numbers a token.

Follows transformers' ``DeepseekV3Attention.forward``:

    c_q   = rms_norm(x W_qa + b_qa) · w_qa          (q_lora_rank given; else q = x W_q)
    q     = c_q W_qb  → heads → [q_nope | q_rope]
    [c_kv | k_rope] = x W_kva + b_kva,  c_kv = rms_norm(c_kv) · w_kva
    kv    = c_kv W_kvb → heads → [k_nope | v]
    q_rope, k_rope rotated (k_rope once, for every head)
    Q = [q_nope | q_rope],  K = [k_nope | k_rope]   → attention per head, concat, W_o

Weights in in_out layout (``X @ W``). With ``interleave`` (DeepSeek's ``rope_interleave``) the
rope features turn in pairs (2i, 2i + 1) and come out as transformers'
``apply_rotary_pos_emb_interleave`` returns them: the pairs' first members, then their second
members (a permutation of both Q and K, so the scores are those of the interleaved layout).
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from service.core.attention import default_scale, project
from service.core.backward import heads_backward
from service.core.block import merge_heads
from service.core.linear import project_backward
from service.core.masks import CombinedMask
from service.core.multihead import MultiheadTrace, attend_heads, split_heads
from service.core.positions import Rope, rope, rope_backward, sequence_length
from service.core.rope_scaling import YarnScaling, mscale
from service.core.types import Array, FullyMaskedPolicy, IntArray
from service.core.variants import QKNorm, Variants, qk_norm, qk_norm_backward


@dataclass(frozen=True)
class LatentDims:
    """The sizes of one MLA layer (DeepseekV3Config's names)."""

    q_lora_rank: int | None  # None: queries straight from x (q_proj)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def cache_numbers(self) -> int:
        """What a cache holds per token: the latent and the shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class LatentWeights:
    """An MLA layer's weights in in_out layout."""

    w_q: Array  # (d_model, h·(nope + rope)): q_b_proj after the latent, or q_proj
    w_kv_a: Array  # (d_model, kv_lora_rank + rope)  kv_a_proj_with_mqa
    kv_norm: Array  # (kv_lora_rank,)  kv_a_layernorm
    w_kv_b: Array  # (kv_lora_rank, h·(nope + d_v))  kv_b_proj
    w_q_a: Array | None = None  # (d_model, q_lora_rank)  q_a_proj
    q_norm: Array | None = None  # (q_lora_rank,)  q_a_layernorm
    b_q_a: Array | None = None  # (q_lora_rank,)
    b_kv_a: Array | None = None  # (kv_lora_rank + rope,)
    w_o: Array | None = None  # (h·d_v, d_out)
    b_o: Array | None = None  # (d_out,)
    eps: float = 1e-6  # the latents' RMSNorm


@dataclass(frozen=True)
class LatentTrace:
    """Every intermediate of an MLA layer; ``block.heads`` holds Q = [q_nope | q_rope] as
    ``q_rotated`` (and the unrotated one as ``q``), K likewise."""

    c_q: Array | None  # (B, L, q_lora_rank)
    c_kv: Array  # (B, S, kv_lora_rank)
    k_rope: Array  # (B, S, rope)  rotated, one per token for every head
    q_nope: Array  # (B, h, L, nope)
    q_rope: Array  # (B, h, L, rope)  rotated
    k_nope: Array  # (B, h, S, nope)
    block: MultiheadTrace


def softmax_gain(settings: Rope) -> float:
    """What DeepSeek multiplies its softmax scale by under YaRN with ``mscale_all_dim``:
    ``mscale(factor, mscale_all_dim)²`` (transformers' ``yarn_apply_mscale``), else 1."""
    s = settings.scaling
    if isinstance(s, YarnScaling) and s.mscale_all_dim:
        return mscale(s.factor, s.mscale_all_dim) ** 2
    return 1.0


def turned(x: Array, positions: IntArray, settings: Rope, n: int) -> Array:
    """RoPE over all of ``x (..., n, r)``; interleaved pairs come out as DeepSeek lays them."""
    out = rope(x, positions, settings, n)  # (..., n, r)
    if settings.style == "interleaved":
        out = np.concatenate([out[..., 0::2], out[..., 1::2]], axis=-1)  # (..., n, r)
    return out


def latent_attention(
    x: Array,
    w: LatentWeights,
    dims: LatentDims,
    *,
    num_heads: int,
    settings: Rope,
    positions: IntArray | None = None,
    mask: CombinedMask | None = None,
    scale: float | None = None,
    fully_masked_policy: FullyMaskedPolicy = "zero",
    variants: Variants | None = None,
) -> LatentTrace:
    """MLA over ``x (B, L, d_model)`` (self-attention), RoPE ``settings`` on the rope features
    at ``positions`` (default 0 … L−1); the other ``variants`` (softcap, sinks, …) as in
    :func:`service.core.multihead.attend_heads`. ``scale`` defaults to 1/√(nope + rope) times
    :func:`softmax_gain`."""
    h, nope, r = num_heads, dims.qk_nope_head_dim, dims.qk_rope_head_dim
    norm = QKNorm("rms", w.eps)
    c_q = None
    if w.w_q_a is not None:
        c_q = qk_norm(project(x, w.w_q_a, w.b_q_a), replace(norm, weight=w.q_norm))  # (B, L, r_q)
    q = split_heads(project(x if c_q is None else c_q, w.w_q), h)  # (B, h, L, nope + r)
    q_nope, q_pass = q[..., :nope], q[..., nope:]  # (B, h, L, nope), (B, h, L, r)
    compressed = project(x, w.w_kv_a, w.b_kv_a)  # (B, S, kv_lora_rank + r)
    c_kv = qk_norm(compressed[..., : dims.kv_lora_rank], replace(norm, weight=w.kv_norm))
    kv = split_heads(project(c_kv, w.w_kv_b), h)  # (B, h, S, nope + d_v)
    k_nope, v = kv[..., :nope], kv[..., nope:]  # (B, h, S, nope), (B, h, S, d_v)
    p = np.arange(x.shape[1]) if positions is None else positions  # (L,)
    n = sequence_length(p)
    turn = replace(settings, rotary_dim=r)
    q_rope = turned(q_pass, p, turn, n)  # (B, h, L, r)
    k_rope = turned(compressed[..., dims.kv_lora_rank :], p, turn, n)  # (B, S, r)
    k_pass = np.broadcast_to(compressed[:, None, :, dims.kv_lora_rank :], (*k_nope.shape[:3], r))
    k_rotated = np.concatenate([k_nope, np.broadcast_to(k_rope[:, None], k_pass.shape)], -1)
    q_rotated = np.concatenate([q_nope, q_rope], axis=-1)  # (B, h, L, nope + r)
    if scale is None:  # 1/√(nope + r), times YaRN's gain as DeepseekV3Attention.scaling
        scale = default_scale(nope + r) * softmax_gain(settings)
    block = attend_heads(
        q_rotated,
        k_rotated,
        v,
        w_o=w.w_o,
        b_o=w.b_o,
        mask=mask,
        scale=scale,
        fully_masked_policy=fully_masked_policy,
        variants=replace(variants or Variants(), rope=None),
    )
    heads = block.heads.with_arrays(
        q=q,  # (B, h, L, nope + r)  before RoPE
        k=np.concatenate([k_nope, k_pass], axis=-1),  # (B, h, S, nope + r)
        q_rotated=q_rotated,
        k_rotated=k_rotated,
    )
    return LatentTrace(c_q, c_kv, k_rope, q_nope, q_rope, k_nope, replace(block, heads=heads))


def _turned_backward(grad: Array, positions: IntArray, settings: Rope, n: int) -> Array:
    """The transpose of :func:`turned`: DeepSeek's layout of interleaved pairs undone (its
    transpose puts the first half back on the even features, the second on the odd), then
    RoPE's transpose (:func:`service.core.positions.rope_backward`)."""
    if settings.style == "interleaved":
        half = grad.shape[-1] // 2
        laid = np.empty_like(grad)  # (..., n, r)
        laid[..., 0::2], laid[..., 1::2] = grad[..., :half], grad[..., half:]
        grad = laid
    return rope_backward(grad, positions, settings, n)


def _heads_as_attended(trace: LatentTrace) -> MultiheadTrace:
    """The block's trace as :func:`attend_heads` made it: the heads' q and k are Q and K as the
    scores read them (rotated), without the rotation's own names."""
    made = dict(trace.block.heads.made)
    q, k = made.pop("q_rotated"), made.pop("k_rotated")
    heads = replace(trace.block.heads, made={**made, "q": q, "k": k})
    return replace(trace.block, heads=heads)


def _renamed(grads: dict[str, Array], names: dict[str, str]) -> dict[str, Array]:
    """``grads`` in the same order, some under other names."""
    return {names.get(name, name): g for name, g in grads.items()}


def _summed_over_heads(grad: Array) -> Array:
    """The shared rotated key's gradient: the sum of every head's share, (B, h, S, r) → (B, S, r)
    (the key is one tensor expanded to the heads; an expanded tensor's gradient is the sum)."""
    summed: Array = grad.sum(axis=1)
    return summed


def _as_made(name: str, grad: Array) -> Array:
    return grad


@dataclass(frozen=True)
class LatentRules:
    """The rules of the backward through the latents that a caller may write otherwise, each
    replaceable (the diagnosis of gradients, :mod:`service.core.diagnosis.gradients`, puts a
    wrong one in place): ``turn_back``, RoPE's transpose on the rope features
    (:func:`_turned_backward`); ``shared``, the one rotated key's gradient from the heads'
    shares (:func:`_summed_over_heads`); ``keep``, a gradient by name → the one the walk goes
    on with (the caller's own, where they gave it)."""

    turn_back: Callable[[Array, IntArray, Rope, int], Array] = _turned_backward
    shared: Callable[[Array], Array] = _summed_over_heads
    keep: Callable[[str, Array], Array] = _as_made


@dataclass(frozen=True)
class LatentLayer:
    """What the backward through the latents reads besides the heads' gradients: the layer's
    input ``x (B, L, d_model)``, its weights and sizes, and the latents its forward made
    (:attr:`LatentTrace.c_q`, :attr:`LatentTrace.c_kv`)."""

    x: Array
    weights: LatentWeights
    dims: LatentDims
    c_q: Array | None
    c_kv: Array


def latent_backward(
    x: Array,
    w: LatentWeights,
    dims: LatentDims,
    trace: LatentTrace,
    grad: Array,
    *,
    settings: Rope,
    positions: IntArray | None = None,
    mask: CombinedMask | None = None,
    fully_masked_policy: FullyMaskedPolicy = "zero",
    variants: Variants | None = None,
) -> dict[str, Array]:
    """The gradients of :func:`latent_attention`'s ``trace`` (made from ``x`` with these same
    arguments) from ``grad (B, L, d_out)``, ∂loss/∂(its output), in reverse order of the
    forward: the block's and each head's as :func:`service.core.backward.heads_backward` makes
    them (with ``grad_q_rotated``, ``grad_k_rotated`` for the Q and K the scores read), then
    the latents' (:func:`latents_backward`)."""
    grads = _renamed(
        heads_backward(
            _heads_as_attended(trace),
            grad,
            w_o=w.w_o,
            b_o=w.b_o,
            mask=mask,
            fully_masked_policy=fully_masked_policy,
            variants=replace(variants or Variants(), rope=None),
        ),
        {"grad_q": "grad_q_rotated", "grad_k": "grad_k_rotated"},
    )
    layer = LatentLayer(x, w, dims, trace.c_q, trace.c_kv)
    return grads | latents_backward(layer, grads, settings=settings, positions=positions)


def latents_backward(
    layer: LatentLayer,
    grads: Mapping[str, Array],
    *,
    settings: Rope,
    positions: IntArray | None = None,
    rules: LatentRules = LatentRules(),
) -> dict[str, Array]:
    """From the heads' ``grad_q_rotated``, ``grad_k_rotated`` and ``grad_v`` (B, h, ·, ·), back
    through the latents, under ``rules``: ``grad_q_rope``, ``grad_q_nope``, ``grad_k_rope``
    (B, S, r: summed over the heads that share the one rotated key), ``grad_k_nope``,
    ``grad_q`` and ``grad_k`` per head before RoPE (the rotation's transpose, DeepSeek's
    interleaved layout undone), ``grad_c_kv`` (kv_b_proj's transpose), ``grad_c_q``, and the
    weights' in in_out layout: ``grad_w_kv_b``, ``grad_kv_a_norm_weight``, ``grad_w_kv_a``
    (``grad_b_kv_a``), ``grad_w_q`` (q_b_proj's or q_proj's), ``grad_q_a_norm_weight``,
    ``grad_w_q_a`` (``grad_b_q_a``), and ``grad_x`` (the queries' and the latents' shares
    summed). Every RMS norm backward is :func:`service.core.variants.qk_norm_backward` (Zhang &
    Sennrich 2019)."""
    x, w, dims, keep = layer.x, layer.weights, layer.dims, rules.keep
    nope, rank = dims.qk_nope_head_dim, dims.kv_lora_rank
    p = np.arange(x.shape[1]) if positions is None else positions  # (L,)
    n = sequence_length(p)
    turn = replace(settings, rotary_dim=dims.qk_rope_head_dim)
    d_qr = keep("grad_q_rotated", grads["grad_q_rotated"])  # (B, h, L, nope + r)
    d_kr = keep("grad_k_rotated", grads["grad_k_rotated"])  # (B, h, S, nope + r)
    d_v = keep("grad_v", grads["grad_v"])  # (B, h, S, d_v)
    d_k_rope = keep("grad_k_rope", rules.shared(d_kr[..., nope:]))  # (B, S, r): every head's
    d_q = keep(
        "grad_q",
        np.concatenate([d_qr[..., :nope], rules.turn_back(d_qr[..., nope:], p, turn, n)], -1),
    )
    out: dict[str, Array] = {
        "grad_q_rope": d_qr[..., nope:],  # (B, h, L, r)
        "grad_q_nope": d_qr[..., :nope],  # (B, h, L, nope)
        "grad_k_rope": d_k_rope,
        "grad_k_nope": d_kr[..., :nope],  # (B, h, S, nope)
        "grad_q": d_q,  # (B, h, L, nope + r)
        "grad_k": np.concatenate(
            [d_kr[..., :nope], rules.turn_back(d_kr[..., nope:], p, turn, n)], -1
        ),  # (B, h, S, nope + r): each head's copy of k_pe
    }
    # the keys' and values' latent: [k_nope | v] = c_kv W_kvb, per head
    d_kv = merge_heads(np.concatenate([d_kr[..., :nope], d_v], -1))  # (B, S, h·…)
    kv_b = project_backward(layer.c_kv, w.w_kv_b, d_kv)
    d_c_kv = keep("grad_c_kv", kv_b.x)  # (B, S, kv_lora_rank)
    compressed = project(x, w.w_kv_a, w.b_kv_a)  # (B, S, kv_lora_rank + r)
    norm = QKNorm("rms", w.eps)
    kv_norm = qk_norm_backward(
        compressed[..., :rank], replace(norm, weight=w.kv_norm), d_c_kv
    )  # through kv_a_layernorm
    d_pe = rules.turn_back(d_k_rope, p, turn, n)  # (B, S, r): k_pe before RoPE
    kv_a = project_backward(
        x, w.w_kv_a, np.concatenate([kv_norm.x, d_pe], -1), w.b_kv_a is not None
    )
    out["grad_c_kv"] = d_c_kv
    q_b = project_backward(x if layer.c_q is None else layer.c_q, w.w_q, merge_heads(d_q))
    made: dict[str, Array] = {"grad_w_kv_b": kv_b.w}
    assert kv_norm.weight is not None
    made |= {"grad_kv_a_norm_weight": kv_norm.weight, "grad_w_kv_a": kv_a.w}
    made |= {} if kv_a.b is None else {"grad_b_kv_a": kv_a.b}
    made["grad_w_q"] = q_b.w
    grad_x = kv_a.x
    if layer.c_q is None:  # q = x W_q
        grad_x = grad_x + q_b.x
    else:  # c_q = rms_norm(x W_qa + b) · w_qa, q = c_q W_qb
        assert w.w_q_a is not None
        d_c_q = keep("grad_c_q", q_b.x)  # (B, L, q_lora_rank)
        out["grad_c_q"] = d_c_q
        q_norm = qk_norm_backward(
            project(x, w.w_q_a, w.b_q_a), replace(norm, weight=w.q_norm), d_c_q
        )
        q_a = project_backward(x, w.w_q_a, q_norm.x, w.b_q_a is not None)
        if q_norm.weight is not None:
            made["grad_q_a_norm_weight"] = q_norm.weight
        made["grad_w_q_a"] = q_a.w
        made |= {} if q_a.b is None else {"grad_b_q_a": q_a.b}
        grad_x = grad_x + q_a.x
    return out | made | {"grad_x": grad_x}
