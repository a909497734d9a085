"""Score variants of the NumPy engine (soft-capping, ALiBi, T5 relative bias, with masks) against
PyTorch's ``torch.nn.attention.flex_attention`` in float64.

The reference is flex_attention run eagerly on the CPU (never ``torch.compile``): in eager mode
it computes ``Q Kᵀ · scale`` in float64, applies the ``score_mod`` to every scaled score (the
scale comes first, then the score_mod), sets the entries its ``block_mask`` rejects to −∞, and
returns ``softmax · V`` and the row logsumexp. Each variant is written here a second time as a
score_mod, from the papers and not from service.core: ``c · tanh(s / c)`` (Gemma 2), ALiBi's
``slope_h · (p'_j − p_i)`` with the slopes of the paper's ``get_slopes`` (Press et al. 2022),
and T5's ``table[bucket(p'_j − p_i), h]`` with the bucket of transformers'
``T5Attention._relative_position_bucket``. The engine's output is compared with flex_attention's;
its weights with ``exp(s − lse)``, s the same score_mod applied to an explicit torch ``Q Kᵀ``;
its final logits (capped, biased, masked) with s itself. Tolerance 1e-12, absolute and relative.

Eager flex_attention warns that it is unfused (it materialises the whole score matrix, which is
what a float64 reference wants); that one warning is silenced here. The file skips without torch
and transformers, unless REQUIRE_TORCH is set (then a missing one fails), as
tests/core/test_positions.py does.
"""

import math
import os
import warnings
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.attention import AttentionTrace, scaled_dot_product_attention
from service.core.masks import Causal, MaskSpec, Padding, Window, combine
from service.core.positions import alibi_bias, alibi_slopes, relative_bias
from service.core.types import Array, IntArray
from service.core.variants import Variants

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed: flex_attention cross-checks skipped (install torch==2.13.0)",
)
transformers = pytest.importorskip(
    "transformers",
    reason="transformers is not installed: flex_attention cross-checks skipped",
)

from torch.nn.attention.flex_attention import (  # noqa: E402
    AuxRequest,
    create_block_mask,
    flex_attention,
)
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

pytestmark = pytest.mark.torch

TOL = 1e-12

Tensor = torch.Tensor
# score_mod(score, b, h, q_idx, kv_idx) and mask_mod(b, h, q_idx, kv_idx), as flex_attention
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


# ---------------------------------------------------------------- the reference


def paper_slopes(n: int) -> list[float]:
    """ALiBi slopes as the paper's ``get_slopes`` (ofirpress/attention_with_linear_biases)."""

    def power_of_2(m: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


def t64(x: Array) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))


def run_flex(
    q: Array,
    k: Array,
    v: Array,
    scale: float,
    score_mod: ScoreMod | None,
    mask_mod: MaskMod | None,
) -> tuple[Array, Array]:
    """flex_attention, eager on the CPU in float64: (output (B, h, L, d_v), lse (B, h, L))."""
    B, H, L, _ = q.shape
    S = k.shape[-2]
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", "flex_attention called without torch.compile", UserWarning
        )
        block_mask = (
            None
            if mask_mod is None
            else create_block_mask(mask_mod, B=B, H=H, Q_LEN=L, KV_LEN=S, device="cpu")
        )
        out, aux = flex_attention(
            t64(q),
            t64(k),
            t64(v),
            score_mod=score_mod,
            block_mask=block_mask,
            scale=scale,
            return_aux=AuxRequest(lse=True),
        )
    assert out.dtype == torch.float64
    assert aux.lse is not None and aux.lse.dtype == torch.float64
    return out.numpy(), aux.lse.numpy()


def explicit_logits(
    q: Array,
    k: Array,
    scale: float,
    score_mod: ScoreMod | None,
    mask_mod: MaskMod | None,
) -> Array:
    """(B, h, L, S): the same score_mod and mask_mod on an explicit torch ``Q Kᵀ · scale``,
    called once on broadcast index tensors instead of once per entry."""
    B, H, L, _ = q.shape
    S = k.shape[-2]
    s = (t64(q) @ t64(k).transpose(-1, -2)) * scale  # (B, h, L, S)
    b = torch.arange(B)[:, None, None, None]
    h = torch.arange(H)[None, :, None, None]
    qi = torch.arange(L)[None, None, :, None]
    ki = torch.arange(S)[None, None, None, :]
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki).expand(B, H, L, S)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, ki).expand(B, H, L, S), -math.inf)
    return s.numpy()


def final_logits(trace: AttentionTrace) -> Array:
    """What the engine feeds its softmax: the last of scaled, capped, biased, masked scores."""
    for logits in (trace.masked_scores, trace.biased_scores, trace.capped_scores):
        if logits is not None:
            return logits
    return trace.scaled_scores


def assert_close(actual: Array, expected: Array, what: str) -> None:
    """Equal within 1e-12 absolute and relative; −∞ entries must match exactly."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=TOL, atol=TOL, err_msg=what)


def check_against_flex(
    q: Array,
    k: Array,
    v: Array,
    *,
    scale: float | None,
    masks: list[MaskSpec],
    variants: Variants,
    score_mod: ScoreMod | None,
    mask_mod: MaskMod | None,
) -> AttentionTrace:
    """Run the engine on ``(B, h, L, ·)`` inputs with ``masks`` folded as the service folds them,
    and flex_attention with ``score_mod``/``mask_mod``; compare output, weights and logits."""
    B, _, L, d_k = q.shape
    S = k.shape[-2]
    mask = combine(masks, B, L, S) if masks else None
    trace = scaled_dot_product_attention(
        q,
        k,
        v,
        scale=scale,
        additive=None if mask is None else mask.additive[:, None],  # (B, 1, L, S)
        padded_queries=None if mask is None else mask.padded_queries[:, None],  # (B, 1, L)
        variants=variants,
    )
    flex_scale = 1.0 / math.sqrt(d_k) if scale is None else scale  # always given explicitly
    out, lse = run_flex(q, k, v, flex_scale, score_mod, mask_mod)
    logits = explicit_logits(q, k, flex_scale, score_mod, mask_mod)  # (B, h, L, S)
    seen = np.isfinite(lse)  # (B, h, L)  rows with at least one key (flex: lse −∞ otherwise)
    with np.errstate(invalid="ignore"):  # −∞ − (−∞) in rows with no key, replaced by 0
        weights = np.where(seen[..., None], np.exp(logits - lse[..., None]), 0.0)
    assert_close(trace.output, out, "output vs flex_attention")
    assert_close(trace.weights, weights, "weights vs exp(score_mod(Q Kᵀ·scale) − flex lse)")
    assert_close(final_logits(trace), logits, "logits vs score_mod(Q Kᵀ·scale)")
    padded = np.zeros((B, 1, L), dtype=bool) if mask is None else mask.padded_queries[:, None]
    np.testing.assert_array_equal(trace.fully_masked_rows, ~seen & ~padded)  # (B, h, L)
    return trace


def inputs(
    seed: int, B: int, H: int, L: int, S: int, d_k: int = 8, spread: float = 2.0
) -> tuple[Array, Array, Array]:
    """Q (B, h, L, d_k), K (B, h, S, d_k), V (B, h, S, d_k); ``spread`` widens the scores."""
    g = np.random.default_rng(seed)
    q = g.normal(scale=spread, size=(B, H, L, d_k))
    k = g.normal(scale=spread, size=(B, H, S, d_k))
    v = g.normal(size=(B, H, S, d_k))
    return q, k, v


# ---------------------------------------------------------------- masks as mask_mods


def causal_mod(L: int, S: int, alignment: str = "upper_left") -> MaskMod:
    offset = S - L if alignment == "lower_right" else 0

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx <= q_idx + offset

    return mod


def window_mod(left: int, right: int) -> MaskMod:
    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx >= q_idx - left) & (kv_idx <= q_idx + right)

    return mod


def padding_mod(key_lengths: tuple[int, ...], query_lengths: tuple[int, ...]) -> MaskMod:
    """Keys at or past key_lengths[b] masked; query rows at or past query_lengths[b] see
    nothing (flex then gives them output 0, as the engine gives padding rows)."""
    kl = torch.tensor(key_lengths)
    ql = torch.tensor(query_lengths)

    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (kv_idx < kl[b]) & (q_idx < ql[b])

    return mod


def both(first: MaskMod, second: MaskMod) -> MaskMod:
    def mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return first(b, h, q_idx, kv_idx) & second(b, h, q_idx, kv_idx)

    return mod


def softcap_mod(cap: float) -> ScoreMod:
    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return cap * torch.tanh(score / cap)

    return mod


# ---------------------------------------------------------------- 1. soft-capping

# (L, S, engine masks, the same masks as a mask_mod)
MASKS: dict[str, tuple[int, int, list[MaskSpec], MaskMod | None]] = {
    "no-mask": (7, 9, [], None),
    "causal": (9, 9, [Causal()], causal_mod(9, 9)),
    "causal-lower-right-L5-S9": (5, 9, [Causal("lower_right")], causal_mod(5, 9, "lower_right")),
    "window-left2-right1": (9, 9, [Window(2, 1)], window_mod(2, 1)),
    "causal-window-left3": (9, 9, [Causal(), Window(3, None)], window_mod(3, 0)),
}


@pytest.mark.parametrize("cap", [0.5, 5.0, 15.0], ids=lambda c: f"cap{c:g}")
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_softcap_matches_flex_attention(mask_name: str, cap: float) -> None:
    L, S, masks, mask_mod = MASKS[mask_name]
    q, k, v = inputs(1, 2, 3, L, S)
    trace = check_against_flex(
        q,
        k,
        v,
        scale=None,
        masks=masks,
        variants=Variants(softcap=cap),
        score_mod=softcap_mod(cap),
        mask_mod=mask_mod,
    )
    assert trace.capped_scores is not None
    assert np.abs(trace.scaled_scores).max() > cap  # the cap bites: tanh is far from linear
    assert np.abs(trace.capped_scores).max() <= cap


@pytest.mark.parametrize("mask_name", ["causal", "window-left2-right1", "causal-lower-right-L5-S9"])
def test_softcap_with_mask_written_as_minus_inf_score_mod(mask_name: str) -> None:
    """The mask folded into the score_mod (−∞ where masked) instead of a block_mask."""
    L, S, masks, mask_mod = MASKS[mask_name]
    assert mask_mod is not None
    cap = 2.0

    def capped_or_masked(
        score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor
    ) -> Tensor:
        capped = cap * torch.tanh(score / cap)
        return torch.where(mask_mod(b, h, q_idx, kv_idx), capped, -math.inf)

    q, k, v = inputs(2, 2, 2, L, S)
    check_against_flex(
        q,
        k,
        v,
        scale=0.4,
        masks=masks,
        variants=Variants(softcap=cap),
        score_mod=capped_or_masked,
        mask_mod=None,
    )


# ---------------------------------------------------------------- 2. ALiBi


def alibi_mod(
    n: int, positions: IntArray, context_positions: IntArray, symmetric: bool = False
) -> ScoreMod:
    """score + slope_h · (p'_j − p_i), or − slope_h · |p'_j − p_i| when symmetric."""
    slopes = torch.tensor(paper_slopes(n), dtype=torch.float64)
    pos = torch.from_numpy(np.asarray(positions, dtype=np.int64))
    ctx = torch.from_numpy(np.asarray(context_positions, dtype=np.int64))

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        rel = ctx[kv_idx] - pos[q_idx]
        return score + slopes[h] * (-rel.abs() if symmetric else rel)

    return mod


def alibi_variants(
    n: int, positions: IntArray, context_positions: IntArray, symmetric: bool
) -> Variants:
    bias = alibi_bias(alibi_slopes(n), positions, context_positions, symmetric)  # (n, L, S)
    return Variants(positions=positions, context_positions=context_positions, position_bias=bias)


@pytest.mark.parametrize("n", [4, 6], ids=lambda n: f"heads{n}")
def test_alibi_with_causal_mask_matches_flex_attention(n: int) -> None:
    L = S = 10
    q, k, v = inputs(3, 2, n, L, S)
    pos = np.arange(L)
    trace = check_against_flex(
        q,
        k,
        v,
        scale=None,
        masks=[Causal()],
        variants=alibi_variants(n, pos, pos, symmetric=False),
        score_mod=alibi_mod(n, pos, pos),
        mask_mod=causal_mod(L, S),
    )
    assert trace.biased_scores is not None


@pytest.mark.parametrize("n", [4, 6], ids=lambda n: f"heads{n}")
def test_symmetric_alibi_without_mask_matches_flex_attention(n: int) -> None:
    L, S = 8, 11
    q, k, v = inputs(4, 2, n, L, S)
    pos, ctx = np.arange(L), np.arange(S)
    check_against_flex(
        q,
        k,
        v,
        scale=None,
        masks=[],
        variants=alibi_variants(n, pos, ctx, symmetric=True),
        score_mod=alibi_mod(n, pos, ctx, symmetric=True),
        mask_mod=None,
    )


# (L, S, query positions, key positions)
ALIBI_POSITIONS = [
    pytest.param(1, 12, np.array([11]), np.arange(12), id="decode-step-L1-at-S-1"),
    pytest.param(4, 12, np.arange(8, 12), np.arange(12), id="L4-S12-lower-right"),
    pytest.param(3, 7, np.arange(1000, 1003) + 4, np.arange(1000, 1007), id="L3-S7-offset-1000"),
]


@pytest.mark.parametrize("n", [4, 6], ids=lambda n: f"heads{n}")
@pytest.mark.parametrize(("L", "S", "pos", "ctx"), ALIBI_POSITIONS)
def test_alibi_with_explicit_positions_matches_flex_attention(
    L: int, S: int, pos: IntArray, ctx: IntArray, n: int
) -> None:
    """Queries at the end of the keys (a KV cache): lower-right causal mask, bias from the
    tokens' positions, not from their indices."""
    q, k, v = inputs(5, 2, n, L, S)
    check_against_flex(
        q,
        k,
        v,
        scale=None,
        masks=[Causal("lower_right")],
        variants=alibi_variants(n, pos, ctx, symmetric=False),
        score_mod=alibi_mod(n, pos, ctx),
        mask_mod=causal_mod(L, S, "lower_right"),
    )


# ---------------------------------------------------------------- 3. T5 relative bias


def t5_mod(
    table: Array,
    positions: IntArray,
    context_positions: IntArray,
    bidirectional: bool,
    max_distance: int,
) -> ScoreMod:
    """score + table[bucket(p'_j − p_i), h], the bucket of transformers' T5Attention."""
    weights = t64(table)  # (num_buckets, n)
    num_buckets = table.shape[0]
    pos = torch.from_numpy(np.asarray(positions, dtype=np.int64))
    ctx = torch.from_numpy(np.asarray(context_positions, dtype=np.int64))

    def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        bucket = T5Attention._relative_position_bucket(  # type: ignore[no-untyped-call]
            ctx[kv_idx] - pos[q_idx], bidirectional, num_buckets, max_distance
        )
        return score + weights[bucket, h]

    return mod


T5_CASES = [
    pytest.param(True, 24, 24, [], id="bidirectional-L24-S24"),
    pytest.param(False, 24, 24, [], id="unidirectional-L24-S24"),
    pytest.param(False, 24, 24, [Causal()], id="unidirectional-causal-L24-S24"),
    pytest.param(True, 24, 24, [Window(12, 20)], id="bidirectional-window-L24-S24"),
    pytest.param(True, 5, 24, [], id="bidirectional-last-5-of-S24"),
    pytest.param(False, 4, 24, [Causal("lower_right")], id="unidirectional-cached-L4-S24"),
]


@pytest.mark.parametrize(("bidirectional", "L", "S", "masks"), T5_CASES)
def test_t5_relative_bias_matches_flex_attention(
    bidirectional: bool, L: int, S: int, masks: list[MaskSpec]
) -> None:
    n, num_buckets, max_distance = 3, 8, 16
    table = np.random.default_rng(6).normal(size=(num_buckets, n))
    pos, ctx = np.arange(S - L, S), np.arange(S)  # L < S: the last L tokens query
    mask_mod: MaskMod | None = None
    for spec in masks:
        match spec:
            case Causal(alignment):
                mask_mod = causal_mod(L, S, alignment)
            case Window(left, right):
                assert left is not None and right is not None
                mask_mod = window_mod(left, right)
    q, k, v = inputs(7, 2, n, L, S)
    bias = relative_bias(table, pos, ctx, bidirectional, max_distance)  # (n, L, S)
    check_against_flex(
        q,
        k,
        v,
        scale=None,
        masks=masks,
        variants=Variants(position_bias=bias),
        score_mod=t5_mod(table, pos, ctx, bidirectional, max_distance),
        mask_mod=mask_mod,
    )
    rel = torch.from_numpy(ctx[None, :] - pos[:, None])
    buckets = T5Attention._relative_position_bucket(  # type: ignore[no-untyped-call]
        rel, bidirectional, num_buckets, max_distance
    )
    half = num_buckets // 2 if bidirectional else num_buckets
    used = set(buckets.unique().tolist())
    assert {half - 2, half - 1} <= used  # the logarithmic buckets and the last (beyond 16)


# ---------------------------------------------------------------- 4. softcap + ALiBi + masks


COMBINED_SCALES = [
    pytest.param(None, id="scale-default"),
    pytest.param(0.05, id="scale0.05"),
    pytest.param(0.9, id="scale0.9"),
]
COMBINED_MASKS = [
    pytest.param(
        [Causal(), Padding(key_lengths=(9, 6, 3), query_lengths=(9, 7, 4))],
        both(causal_mod(9, 9), padding_mod((9, 6, 3), (9, 7, 4))),
        9,
        id="causal-padding",
    ),
    pytest.param(
        [Padding(key_lengths=(9, 5, 1))],
        padding_mod((9, 5, 1), (9, 9, 9)),
        6,
        id="key-padding-L6",
    ),
]


@pytest.mark.parametrize("scale", COMBINED_SCALES)
@pytest.mark.parametrize(("masks", "mask_mod", "L"), COMBINED_MASKS)
@pytest.mark.parametrize("symmetric", [False, True], ids=["alibi", "symmetric-alibi"])
def test_softcap_alibi_and_masks_match_flex_attention(
    masks: list[MaskSpec], mask_mod: MaskMod, L: int, scale: float | None, symmetric: bool
) -> None:
    n, S, cap = 6, 9, 3.0
    pos, ctx = np.arange(L), np.arange(S)
    capped = softcap_mod(cap)
    biased = alibi_mod(n, pos, ctx, symmetric)

    def capped_then_biased(
        score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor
    ) -> Tensor:
        return biased(capped(score, b, h, q_idx, kv_idx), b, h, q_idx, kv_idx)

    q, k, v = inputs(8, 3, n, L, S, spread=3.0)
    bias = alibi_bias(alibi_slopes(n), pos, ctx, symmetric)  # (n, L, S)
    trace = check_against_flex(
        q,
        k,
        v,
        scale=scale,
        masks=masks,
        variants=Variants(softcap=cap, position_bias=bias),
        score_mod=capped_then_biased,
        mask_mod=mask_mod,
    )
    # the intermediates on their own, against torch formulas
    flex_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    assert trace.capped_scores is not None and trace.biased_scores is not None
    assert_close(
        trace.capped_scores,
        explicit_logits(q, k, flex_scale, capped, None),
        "capped_scores vs cap·tanh(Q Kᵀ·scale / cap)",
    )
    assert_close(
        trace.biased_scores,
        explicit_logits(q, k, flex_scale, capped_then_biased, None),
        "biased_scores vs cap·tanh(Q Kᵀ·scale / cap) + ALiBi",
    )


# ---------------------------------------------------------------- 5. properties


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 16), st.integers(-(2**40), 2**40))
def test_alibi_bias_is_symmetric_or_antisymmetric(n: int, L: int, start: int) -> None:
    """With the same positions for queries and keys (L == S), the symmetric bias equals its
    transpose over (L, S) and the plain one is minus its transpose, exactly."""
    pos = np.arange(L) + start
    slopes = alibi_slopes(n)
    symmetric = alibi_bias(slopes, pos, pos, symmetric=True)  # (n, L, L)
    plain = alibi_bias(slopes, pos, pos)  # (n, L, L)
    np.testing.assert_array_equal(symmetric, np.swapaxes(symmetric, -1, -2))
    np.testing.assert_array_equal(plain, -np.swapaxes(plain, -1, -2))
    np.testing.assert_array_equal(symmetric, -np.abs(plain))
    assert (symmetric <= 0).all()
