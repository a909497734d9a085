"""Multi-head attention (Vaswani et al. 2017, §3.2.2) with positional encoding, residual and
layer norm, keeping every intermediate. Weights arrive in ``in_out`` layout (``X @ W``); the
API converts PyTorch's ``out_in``, packed and per-head forms before calling in here.
"""

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from service.core import chain
from service.core.attention import (
    AttentionTrace,
    Past,
    Projections,
    project,
    project_qkv,
    scaled_dot_product_attention,
)
from service.core.block import LayerNorm, layer_norm, merge_heads, repeated_heads, split_heads
from service.core.errors import require_finite
from service.core.masks import CombinedMask
from service.core.types import Array, FullyMaskedPolicy
from service.core.variants import Variants, sigmoid

__all__ = [  # the block's pieces live in service.core.block; imported from here as before
    "BLOCK_NAMES",
    "LayerNorm",
    "MultiheadTrace",
    "MultiheadWeights",
    "attend_heads",
    "layer_norm",
    "merge_heads",
    "multihead_attention",
    "sinusoidal_encoding",
    "split_heads",
]


@dataclass(frozen=True)
class MultiheadWeights(Projections):
    """Projection weights in in_out layout; head i owns columns i·d_k … (i+1)·d_k − 1 of w_q
    (and of w_k, w_v for key/value head i), plus the output projection."""

    w_o: Array | None = None  # (h·d_v, d_out); None = identity
    b_o: Array | None = None  # (d_out,)
    w_g: Array | None = None  # (d_model, h·d_v): Qwen3-Next's output gate; None = no gate
    b_g: Array | None = None  # (h·d_v,)


@dataclass(frozen=True)
class MultiheadTrace:
    """Every intermediate of a multi-head attention block: the heads' (``heads``), and the
    block's after them by the name of the step of :data:`service.core.chain.BLOCK` that made
    it (``block``: concat ``(B, L, h·d_v)``, gated, projected ``(B, L, d_out)``, residual,
    layer_norm), with the gate they read ``(B, L, h·d_v)`` (sigmoid(x_in W_g + b_g)) when there
    is one. A step that was off is absent: ``trace.residual`` is None then."""

    x_in: Array | None  # (B, L, d_model)  x after positional encoding; None: direct heads
    heads: AttentionTrace  # arrays shaped (B, h, L, ·)
    average_weights: Array  # (B, L, S)  mean of the heads' weights
    block: Mapping[str, Array]
    output: Array  # (B, L, d_out)  the last of projected / residual / layer_norm

    def __getattr__(self, name: str) -> Array | None:
        """A block intermediate by its step's name, or the gate (None when it was off)."""
        if name in BLOCK_NAMES:
            return self.block.get(name)
        raise AttributeError(name)

    @property
    def concat(self) -> Array:
        return self.block["concat"]  # (B, L, h·d_v)

    @property
    def projected(self) -> Array:
        return self.block["projected"]  # (B, L, d_out)  (gated or) concat W_o + b_o


BLOCK_NAMES = frozenset({"gate", *(step.name for step in chain.BLOCK)})  # all a block keeps


def sinusoidal_encoding(seq_len: int, d_model: int) -> Array:
    """(L, d_model): PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same)."""
    pos = np.arange(seq_len)[:, None]  # (L, 1)
    two_i = np.arange(0, d_model, 2)  # (⌈d_model/2⌉,)
    angle = pos / np.power(10000.0, two_i / d_model)  # (L, ⌈d_model/2⌉)
    pe = np.zeros((seq_len, d_model))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return pe


def multihead_attention(
    x: Array,
    weights: MultiheadWeights,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    context: Array | None = None,
    positional: Array | None = None,
    mask: CombinedMask | None = None,
    scale: float | None = None,
    fully_masked_policy: FullyMaskedPolicy = "zero",
    residual: bool = False,
    norm: LayerNorm | None = None,
    variants: Variants | None = None,
    past: Past | None = None,
) -> MultiheadTrace:
    """Multi-head attention over ``x (B, L, d_model)``, keys/values from ``context (B, S, d_model)``
    (default: x itself); with ``past`` (keys and values ``(B, h_kv, P, ·)``) a decode step.

    ``positional (L, d_model)`` is added to x first. The projections are split into h query
    heads and h_kv = ``num_kv_heads`` key/value heads (default h) of d_k columns each, then
    :func:`attend_heads` runs the heads (with the ``variants``), concatenates them and applies
    ``w_o``, the residual ``x_in + projected`` and layer norm when asked.
    """
    h = num_heads
    h_kv = num_kv_heads or h
    x_in = x if positional is None else x + positional  # (B, L, d_model)
    source = x_in if context is None else context  # (B, S, d_model)

    # (B, L, h·d_k), (B, S, h_kv·d_k), (B, S, h_kv·d_v)
    q, k, v = project_qkv(x_in, source, weights)
    gate = None
    if weights.w_g is not None:  # Qwen3-Next: from the layer's input, one per concat feature
        gate = sigmoid(project(x_in, weights.w_g, weights.b_g))  # (B, L, h·d_v)
    return attend_heads(
        split_heads(q, h),  # (B, h, L, d_k)
        split_heads(k, h_kv),  # (B, h_kv, S, d_k)
        split_heads(v, h_kv),  # (B, h_kv, S, d_v)
        w_o=weights.w_o,
        b_o=weights.b_o,
        x_in=x_in,
        mask=mask,
        scale=scale,
        fully_masked_policy=fully_masked_policy,
        residual=residual,
        norm=norm,
        variants=variants,
        gate=gate,
        past=past,
    )


def attend_heads(
    q: Array,
    k: Array,
    v: Array,
    *,
    w_o: Array | None = None,
    b_o: Array | None = None,
    x_in: Array | None = None,
    mask: CombinedMask | None = None,
    scale: float | None = None,
    fully_masked_policy: FullyMaskedPolicy = "zero",
    residual: bool = False,
    norm: LayerNorm | None = None,
    variants: Variants | None = None,
    gate: Array | None = None,
    past: Past | None = None,
) -> MultiheadTrace:
    """The heads of multi-head attention and the block after them.

    ``q (B, h, L, d_k)``, ``k (B, h_kv, S, d_k)``, ``v (B, h_kv, S, d_v)``, as
    ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` takes them: with
    h_kv < h (grouped-query attention) query head i uses key/value head ⌊i·h_kv/h⌋ (torch's
    ``repeat_interleave``). Each head runs scaled dot-product attention (scale 1/√d_k by
    default) with the ``variants``; per-head ones (ALiBi slopes, T5 table columns, sinks) are
    indexed by the query head. The heads' outputs are concatenated, multiplied elementwise by
    ``gate (B, L, h·d_v)`` when given (Qwen3-Next's ``attn_output * torch.sigmoid(gate)``), and
    multiplied by ``w_o
    (h·d_v, d_out)`` (identity if None) plus ``b_o``; ``residual`` adds ``x_in (B, L, d_out)``
    and ``norm`` is applied last.
    """
    h, h_kv = q.shape[1], k.shape[1]
    if h_kv != h:
        k = repeated_heads(k, h)  # (B, h, S, d_k)
        v = repeated_heads(v, h)  # (B, h, S, d_v)
        if past is not None:  # the cache per key/value head, shared as the new keys are
            past = past.repeated(h // h_kv)

    heads = scaled_dot_product_attention(
        q,
        k,
        v,
        scale=scale,
        additive=None if mask is None else mask.additive[:, None],  # (B, 1, L, S)
        padded_queries=None if mask is None else mask.padded_queries[:, None],  # (B, 1, L)
        fully_masked_policy=fully_masked_policy,
        variants=variants,
        past=past,
    )
    if heads.present_k is not None and heads.present_v is not None and h_kv != h:
        group = h // h_kv  # the cache keeps one copy per key/value head: (B, h_kv, P + L, ·)
        heads = heads.with_arrays(
            present_k=heads.present_k[:, ::group], present_v=heads.present_v[:, ::group]
        )
    block = chain.Setup(
        Variants(), w_o=w_o, b_o=b_o, gate=gate, x_in=x_in, residual=residual, norm=norm
    )
    st = chain.run(chain.BLOCK, chain.State({"output": heads.output}, {"out": "output"}), block)
    output = st["block"]  # (B, L, d_out)  the last of projected, residual, layer norm
    require_finite(output, "the multi-head output")
    made = {name: a for name, a in st.made.items() if name != "output"}  # the heads' aside
    return MultiheadTrace(
        x_in=x_in,
        heads=heads,
        average_weights=heads.weights.mean(axis=1),  # (B, L, S)
        block=made if gate is None else {"gate": gate, **made},
        output=output,
    )
