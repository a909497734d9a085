"""Position variants (RoPE, ALiBi, T5 relative bias) against independent references in float64:
Hugging Face transformers' own functions, and the ALiBi paper's ``get_slopes``.

transformers builds some of its tables in float32 (``dtype=torch.float`` in the RoPE init
functions, ``torch.float32`` in BLOOM's slopes). Those functions are run verbatim with their
module's ``torch`` swapped for :class:`_Float64Torch`, so that every reference is float64.
"""

import functools
import math
import os
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Context, Decimal
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from service.core.errors import AttentionInputError
from service.core.positions import (
    Rope,
    _log_f32,
    alibi_bias,
    alibi_slopes,
    relative_bias,
    rope,
    rope_frequencies,
    t5_bucket,
)
from service.core.rope_scaling import LinearScaling, Llama3Scaling
from service.core.rope_scaling import Scaling as RopeScaling
from service.core.types import RopeStyle

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed: position cross-checks skipped (install torch==2.13.0)",
)
transformers = pytest.importorskip(
    "transformers",
    reason="transformers is not installed: position cross-checks skipped",
)

from transformers import GPTNeoXConfig, LlamaConfig, T5Config  # noqa: E402
from transformers import modeling_rope_utils as hf_rope  # noqa: E402
from transformers.models.bloom import modeling_bloom  # noqa: E402
from transformers.models.gpt_neox import modeling_gpt_neox  # noqa: E402
from transformers.models.gptj import modeling_gptj  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.mpt import modeling_mpt  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

ATOL = 1e-12


class _Float64Torch(types.ModuleType):
    """``torch``, except that ``torch.float`` and ``torch.float32`` name float64."""

    def __getattr__(self, name: str) -> Any:
        if name in ("float", "float32"):
            return torch.float64
        return getattr(torch, name)


@contextmanager
def float64_torch_in(*modules: types.ModuleType) -> Iterator[None]:
    """Run the given transformers modules' code with :class:`_Float64Torch` as their torch."""
    saved = [m.torch for m in modules]
    for m in modules:
        m.torch = _Float64Torch("torch")  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m, t in zip(modules, saved, strict=True):
            m.torch = t  # type: ignore[attr-defined]


def t64(a: Any) -> Any:
    return torch.as_tensor(np.asarray(a), dtype=torch.float64)


def hf_rope_parameters(base: float, scaling: RopeScaling | None) -> dict[str, Any]:
    """transformers 5's ``rope_parameters`` dict for these settings."""
    if scaling is None:
        return {"rope_type": "default", "rope_theta": base}
    if isinstance(scaling, LinearScaling):
        return {"rope_type": "linear", "rope_theta": base, "factor": scaling.factor}
    assert isinstance(scaling, Llama3Scaling)
    return {
        "rope_type": "llama3",
        "rope_theta": base,
        "factor": scaling.factor,
        "low_freq_factor": scaling.low_freq_factor,
        "high_freq_factor": scaling.high_freq_factor,
        "original_max_position_embeddings": scaling.original_max_position,
    }


def llama_inv_freq(d_k: int, base: float, scaling: RopeScaling | None) -> Any:
    """transformers' ``LlamaRotaryEmbedding(config).inv_freq`` for a tiny LlamaConfig, float64."""
    config = LlamaConfig(
        hidden_size=2 * d_k,
        num_attention_heads=2,
        head_dim=d_k,
        max_position_embeddings=131072,
        rope_parameters=hf_rope_parameters(base, scaling),
    )
    with float64_torch_in(hf_rope, modeling_llama):
        emb = modeling_llama.LlamaRotaryEmbedding(config)
    assert emb.inv_freq.dtype == torch.float64
    assert emb.attention_scaling == 1.0
    return emb.inv_freq


def hf_cos_sin(inv_freq: Any, positions: np.ndarray) -> tuple[Any, Any]:
    """``LlamaRotaryEmbedding.forward`` in float64: (1, n, r) cos and sin of ``[p·θ, p·θ]``."""
    freqs = t64(positions)[:, None] * inv_freq[None, :]  # (n, r/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (n, r)
    return emb.cos()[None], emb.sin()[None]


LLAMA3 = Llama3Scaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
SCALINGS: list[tuple[str, RopeScaling | None]] = [
    ("none", None),
    ("linear-4", LinearScaling(4.0)),
    ("linear-2.5", LinearScaling(2.5)),
    ("llama3-3.1", LLAMA3),
    ("llama3-odd", Llama3Scaling(32.0, 2.0, 16.0, 4096)),
]


# --- RoPE frequencies -------------------------------------------------------------------------


@pytest.mark.parametrize(("d_k", "base"), [(8, 500000.0), (128, 500000.0), (64, 10000.0)])
@pytest.mark.parametrize(
    ("name", "scaling"), [s for s in SCALINGS if not isinstance(s[1], LinearScaling)]
)
def test_rope_frequencies_match_transformers_inv_freq(
    d_k: int, base: float, name: str, scaling: RopeScaling | None
) -> None:
    expected = llama_inv_freq(d_k, base, scaling).numpy()
    np.testing.assert_allclose(rope_frequencies(d_k, base, scaling), expected, rtol=1e-14, atol=0)


def test_llama3_frequencies_cover_all_three_regimes() -> None:
    # d_k 8, base 5e5: wavelengths ≈ 6, 167 (kept), 4443 (blended), 118 000 (slowed 8×)
    plain = rope_frequencies(8, 500000.0)
    scaled = rope_frequencies(8, 500000.0, LLAMA3)
    assert scaled[0] == plain[0] and scaled[1] == plain[1]
    assert plain[2] / 8 < scaled[2] < plain[2]
    assert scaled[3] == pytest.approx(plain[3] / 8, rel=1e-15)


def test_linear_scaling_divides_positions_not_frequencies() -> None:
    x = np.random.default_rng(0).normal(size=(5, 8))
    pos = np.array([0, 4, 8, 12, 16])
    scaled = rope(x, pos, Rope(scaling=LinearScaling(4.0)))
    np.testing.assert_allclose(scaled, rope(x, pos // 4, Rope()), rtol=0, atol=ATOL)
    np.testing.assert_array_equal(
        rope_frequencies(8, 10000.0, LinearScaling(4.0)), rope_frequencies(8, 10000.0)
    )


# --- RoPE rotation ----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "scaling"), SCALINGS, ids=[s[0] for s in SCALINGS])
@pytest.mark.parametrize("positions", ["default", "offset", "gaps"])
def test_rope_half_matches_transformers_llama(
    name: str, scaling: RopeScaling | None, positions: str
) -> None:
    rng = np.random.default_rng(1)
    h, n, d_k, base = 3, 6, 16, 500000.0
    q, k = rng.normal(size=(2, 1, h, n, d_k))  # (1, h, n, d_k) each
    pos = {
        "default": np.arange(n),
        "offset": np.arange(n) + 9000,  # beyond original_max_position: llama3 matters
        "gaps": np.array([0, 3, 4, 100, 20000, 7]),
    }[positions]
    cos, sin = hf_cos_sin(llama_inv_freq(d_k, base, scaling), pos)
    q_ref, k_ref = modeling_llama.apply_rotary_pos_emb(t64(q), t64(k), cos, sin)
    settings_ = Rope(base=base, scaling=scaling)
    # angles up to 2·10⁴ rad: a 1-ulp difference in the angle is ~4e-12
    np.testing.assert_allclose(rope(q, pos, settings_), q_ref.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(rope(k, pos, settings_), k_ref.numpy(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("rotary_pct", [0.25, 0.5, 1.0], ids=lambda p: f"pct{p}")
def test_rope_half_partial_matches_transformers_gpt_neox(rotary_pct: float) -> None:
    rng = np.random.default_rng(2)
    h, n, d_k = 2, 5, 16
    config = GPTNeoXConfig(
        hidden_size=h * d_k,
        num_attention_heads=h,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": rotary_pct,
        },
    )
    with float64_torch_in(hf_rope, modeling_gpt_neox):
        emb = modeling_gpt_neox.GPTNeoXRotaryEmbedding(config)
    assert emb.inv_freq.dtype == torch.float64
    r = int(d_k * rotary_pct)
    assert emb.inv_freq.shape == (r // 2,)
    q, k = rng.normal(size=(2, 1, h, n, d_k))
    pos = np.arange(n) + 3
    cos, sin = hf_cos_sin(emb.inv_freq, pos)
    q_ref, k_ref = modeling_gpt_neox.apply_rotary_pos_emb(  # type: ignore[no-untyped-call]
        t64(q), t64(k), cos, sin
    )
    np.testing.assert_allclose(rope(q, pos, Rope(rotary_dim=r)), q_ref.numpy(), rtol=0, atol=ATOL)
    np.testing.assert_allclose(rope(k, pos, Rope(rotary_dim=r)), k_ref.numpy(), rtol=0, atol=ATOL)
    np.testing.assert_array_equal(rope(q, pos, Rope(rotary_dim=r))[..., r:], q[..., r:])


@pytest.mark.parametrize("rotary_dim", [4, 8, 16], ids=lambda r: f"rot{r}")
def test_rope_interleaved_matches_transformers_gptj(rotary_dim: int) -> None:
    rng = np.random.default_rng(3)
    h, n, d_k = 2, 7, 16
    key = rng.normal(size=(1, n, h, d_k))  # GPT-J's layout (B, n, h, d_k)
    pos = np.array([0, 1, 2, 5, 9, 30, 31])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # GPT-J's table is then float64 throughout
    try:
        sincos = modeling_gptj.create_sinusoidal_positions(64, rotary_dim)
    finally:
        torch.set_default_dtype(previous)
    assert sincos.dtype == torch.float64
    sin, cos = torch.split(sincos[torch.as_tensor(pos)][None], rotary_dim // 2, dim=-1)
    k_t = t64(key)
    k_rot = modeling_gptj.apply_rotary_pos_emb(k_t[..., :rotary_dim], sin, cos)
    expected = torch.cat((k_rot, k_t[..., rotary_dim:]), dim=-1).numpy()
    ours = rope(key.transpose(0, 2, 1, 3), pos, Rope(style="interleaved", rotary_dim=rotary_dim))
    np.testing.assert_allclose(ours.transpose(0, 2, 1, 3), expected, rtol=0, atol=ATOL)


def test_rope_styles_differ_by_a_feature_permutation() -> None:
    # interleaved on x equals half on x with its pairs (2i, 2i+1) moved to (i, i + d/2)
    x = np.random.default_rng(4).normal(size=(2, 5, 8))
    pos = np.arange(5)
    perm = np.concatenate((np.arange(0, 8, 2), np.arange(1, 8, 2)))
    half = rope(x[..., perm], pos, Rope(style="half"))
    np.testing.assert_allclose(half, rope(x, pos, Rope(style="interleaved"))[..., perm], atol=ATOL)


finite = st.floats(-100, 100, allow_nan=False, allow_infinity=False)
STYLES: tuple[RopeStyle, ...] = ("half", "interleaved")
styles = st.sampled_from(STYLES)


@st.composite
def rope_case(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, Rope]:
    n, half_d = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    d_k = 2 * half_d + draw(st.integers(0, 3))
    x = draw(arrays(np.float64, (n, d_k), elements=finite))
    pos = draw(arrays(np.int64, (n,), elements=st.integers(-5000, 5000)))
    r = 2 * draw(st.integers(1, half_d))
    scaling = draw(st.sampled_from([s for _, s in SCALINGS]))
    base = draw(st.sampled_from([10000.0, 500000.0, 2.0]))
    return x, pos, Rope(base=base, style=draw(styles), rotary_dim=r, scaling=scaling)


@settings(max_examples=200, deadline=None)
@given(rope_case())
def test_rope_keeps_each_vector_norm(case: tuple[np.ndarray, np.ndarray, Rope]) -> None:
    x, pos, s = case
    out = rope(x, pos, s)
    np.testing.assert_allclose(
        np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12, atol=1e-12
    )


@settings(max_examples=200, deadline=None)
@given(
    arrays(np.float64, (2, 8), elements=finite),
    st.integers(-3000, 3000),
    st.integers(-3000, 3000),
    st.integers(-3000, 3000),
    styles,
)
def test_rope_score_depends_only_on_the_offset(
    qk: np.ndarray, p_q: int, p_k: int, shift: int, style: Any
) -> None:
    s = Rope(style=style)
    q, k = qk[0:1], qk[1:2]

    def score(a: int, b: int) -> float:
        return float(rope(q, np.array([a]), s)[0] @ rope(k, np.array([b]), s)[0])

    assert score(p_q + shift, p_k + shift) == pytest.approx(score(p_q, p_k), rel=1e-9, abs=1e-8)


def test_rope_rotates_a_unit_pair_by_position_times_theta() -> None:
    # d_k 2: θ_0 = 1, so position p turns (1, 0) to (cos p, sin p) in either style
    expected = np.array([[1, 0], [math.cos(1), math.sin(1)], [math.cos(2), math.sin(2)]])
    for style in STYLES:
        out = rope(np.array([[1.0, 0.0]] * 3), np.array([0, 1, 2]), Rope(style=style))
        np.testing.assert_allclose(out, expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("settings_", "positions", "message"),
    [
        (Rope(rotary_dim=3), np.arange(2), "even"),
        (Rope(rotary_dim=10), np.arange(2), "must not exceed d_k"),
        (Rope(rotary_dim=0), np.arange(2), "even and > 0"),
        (Rope(base=0.0), np.arange(2), "base"),
        (Rope(scaling=LinearScaling(0.0)), np.arange(2), "factor"),
        (Rope(scaling=Llama3Scaling(8.0, 4.0, 2.0)), np.arange(2), "low_freq_factor"),
        (Rope(), np.arange(3), "2 integers"),
        (Rope(), np.array([0.0, 1.0]), "integers"),
        (Rope(), np.array([0, 2**60]), r"2\^53"),
    ],
    ids=[
        "odd-dim",
        "dim-too-big",
        "zero-dim",
        "base-0",
        "linear-0",
        "llama3-low-above-high",
        "positions-count",
        "float-positions",
        "huge-position",
    ],
)
def test_rope_refuses_bad_settings(settings_: Rope, positions: np.ndarray, message: str) -> None:
    with pytest.raises(AttentionInputError, match=message):
        rope(np.ones((2, 8)), positions, settings_)


# --- ALiBi ------------------------------------------------------------------------------------


def paper_get_slopes(n: int) -> list[float]:
    """Press et al.'s ``get_slopes`` (github.com/ofirpress/attention_with_linear_biases), verbatim."""

    def get_slopes_power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + paper_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def bloom_slopes(n: int) -> np.ndarray:
    """transformers' BLOOM ``_get_alibi_slopes``, run in float64."""
    with float64_torch_in(modeling_bloom):
        slopes = modeling_bloom._get_alibi_slopes(n, torch.device("cpu"))
    assert slopes.dtype == torch.float64
    return slopes.numpy()


HEADS = [1, 2, 3, 5, 6, 8, 12, 16, 20, 32, 40, 64, 96]


@pytest.mark.parametrize("n", HEADS, ids=lambda n: f"{n}heads")
@pytest.mark.parametrize(
    "reference", [paper_get_slopes, bloom_slopes], ids=["paper-get_slopes", "bloom"]
)
def test_alibi_slopes_match_references(n: int, reference: Callable[[int], Any]) -> None:
    np.testing.assert_allclose(alibi_slopes(n), reference(n), rtol=1e-14, atol=0)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 8))
def test_alibi_slopes_for_powers_of_two_are_the_formula(k: int) -> None:
    n = 2**k
    h = np.arange(1, n + 1)
    np.testing.assert_allclose(alibi_slopes(n), 2.0 ** (-8.0 * h / n), rtol=1e-15, atol=0)


def test_alibi_slopes_for_six_heads_follow_the_paper_rule() -> None:
    # p = 4: 2^-2, 2^-4, 2^-6, 2^-8; then the 1st and 3rd of the 8-head sequence: 2^-1, 2^-3
    np.testing.assert_array_equal(alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


def test_alibi_bias_values() -> None:
    slopes = np.array([0.5, 0.25])
    pos, ctx = np.array([2, 3]), np.array([0, 1, 2, 3])
    expected = np.array([[-2, -1, 0, 1], [-3, -2, -1, 0]], dtype=float)  # p'_j − p_i
    bias = alibi_bias(slopes, pos, ctx)
    assert bias.shape == (2, 2, 4)
    np.testing.assert_array_equal(bias, slopes[:, None, None] * expected)
    np.testing.assert_array_equal(
        alibi_bias(slopes, pos, ctx, symmetric=True), -slopes[:, None, None] * np.abs(expected)
    )


@pytest.mark.parametrize("n", [4, 6], ids=lambda n: f"{n}heads")
def test_alibi_causal_softmax_matches_bloom_alibi(n: int) -> None:
    # BLOOM adds slope·j (not slope·(j − i)); under a causal mask the softmax is the same
    L = 6
    scores = np.random.default_rng(5).normal(size=(n, L, L))
    causal = np.triu(np.full((L, L), -np.inf), 1)
    bloom = modeling_bloom.build_alibi_tensor(torch.ones(1, L), n, torch.float64)  # (n, 1, L)
    ref = torch.softmax(t64(scores) + bloom + t64(causal), dim=-1).numpy()
    ours = scores + alibi_bias(alibi_slopes(n), np.arange(L), np.arange(L)) + causal
    ours = np.exp(ours - ours.max(axis=-1, keepdims=True))
    # bloom's slopes are float32 (cast to float64 at the end): 1e-7 relative
    np.testing.assert_allclose(ours / ours.sum(axis=-1, keepdims=True), ref, rtol=0, atol=1e-6)


def mpt_slopes(n: int) -> np.ndarray:
    """transformers' MPT ``build_mpt_alibi_tensor`` (alibi_bias_max 8), run in float64: its
    last key's bias is −slope · 1 one key back, so the slope is minus the bias at S − 2."""
    with (
        float64_torch_in(modeling_mpt),
        mock.patch.object(torch.Tensor, "float", torch.Tensor.double),
    ):
        bias = modeling_mpt.build_mpt_alibi_tensor(n, 2)  # type: ignore[no-untyped-call]
    assert bias.dtype == torch.float64  # (n, 1, 2): −slope, 0
    slopes: np.ndarray = -bias[:, 0, 0].numpy()
    return slopes


@pytest.mark.parametrize("n", HEADS, ids=lambda n: f"{n}heads")
def test_alibi_slopes_match_mpt(n: int) -> None:
    # MPT takes the next power of two's slopes, odd-indexed first: the paper's rule again
    np.testing.assert_allclose(alibi_slopes(n), mpt_slopes(n), rtol=1e-14, atol=0)


def test_alibi_origins_values() -> None:
    slopes = np.array([0.5, 0.25])
    pos, ctx = np.array([2, 3]), np.array([0, 1, 2, 5])
    keys = np.array([[0, 1, 2, 5], [0, 1, 2, 5]], dtype=float)  # p'_j
    for origin, distance in (
        ("query", keys - pos[:, None]),  # p'_j − p_i
        ("zero", keys),  # p'_j
        ("last_key", keys - 5),  # p'_j − p'_last
    ):
        bias = alibi_bias(slopes, pos, ctx, origin=origin)
        np.testing.assert_array_equal(bias, slopes[:, None, None] * distance[None], err_msg=origin)
    with pytest.raises(AttentionInputError, match="origin is the query"):
        alibi_bias(slopes, pos, ctx, symmetric=True, origin="zero")
    with pytest.raises(AttentionInputError, match="origin 'end'"):
        alibi_bias(slopes, pos, ctx, origin="end")


@pytest.mark.parametrize("n", [4, 6], ids=lambda n: f"{n}heads")
def test_alibi_zero_origin_is_bloom_build_alibi_tensor_with_padding(n: int) -> None:
    # BLOOM's key positions are the attention mask's cumulative sum − 1 (0 on padding): given as
    # context_positions, origin "zero" is its tensor, query by query
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    with float64_torch_in(modeling_bloom):
        bloom = modeling_bloom.build_alibi_tensor(mask, n, torch.float64)  # (n, 1, S)
    keys = ((mask.cumsum(-1) - 1) * mask)[0].numpy()  # (S,)
    queries = np.arange(7)
    ours = alibi_bias(alibi_slopes(n), queries, keys, origin="zero")  # (n, L, S)
    np.testing.assert_allclose(ours, np.broadcast_to(bloom.numpy(), ours.shape), rtol=1e-15, atol=0)


@pytest.mark.parametrize("n", [4, 6], ids=lambda n: f"{n}heads")
def test_alibi_last_key_origin_is_mpt_build_mpt_alibi_tensor(n: int) -> None:
    # MPT builds slope · (j − (M − 1)) for its max_seq_len M and keeps the last S keys
    S, M = 5, 9
    with (
        float64_torch_in(modeling_mpt),
        mock.patch.object(torch.Tensor, "float", torch.Tensor.double),
    ):
        mpt = modeling_mpt.build_mpt_alibi_tensor(n, M)[:, :, M - S :]  # type: ignore[no-untyped-call]
    ours = alibi_bias(alibi_slopes(n), np.arange(3), np.arange(S), origin="last_key")  # (n, 3, S)
    np.testing.assert_allclose(ours, np.broadcast_to(mpt.numpy(), ours.shape), rtol=1e-15, atol=0)


def test_alibi_refuses_bad_slopes_and_heads() -> None:
    with pytest.raises(AttentionInputError, match="at least one head"):
        alibi_slopes(0)
    with pytest.raises(AttentionInputError, match="finite"):
        alibi_bias(np.array([np.nan]), np.arange(2), np.arange(2))
    with pytest.raises(AttentionInputError, match="overflowed"):
        alibi_bias(np.array([1e300]), np.array([0]), np.array([2**52]))


# --- T5 relative bias -------------------------------------------------------------------------

# The T5 bucket formula's ties (see t5_bucket) are decided by the last bit of torch's float32 log,
# which is MKL's vmsLn and depends on the code path MKL picks for the CPU (not on
# ATEN_CPU_CAPABILITY). Measured with torch 2.13.0 (MKL 2024.2) on an Intel Xeon by forcing each
# path (MKL_ENABLE_INSTRUCTIONS=SSE4_2 or MKL_CBWR=COMPATIBLE, AVX2; natively AVX-512; the earlier
# table, measured on an AMD EPYC, is SSE4.2's at its 14 arguments): every argument f32(d) / f32(b // 2) at which some path gives another
# bucket than the correctly rounded logarithm for b ≤ 128 buckets per direction and
# max_distance ≤ 1024 → torch.log(argument) on the (SSE4.2, AVX2) paths, float32 in hex. The
# AVX-512 path gives the correctly rounded value at all of them.
MKL_LOG_AT_TIES = {
    "0x1.800000p+0": ("0x1.9f3240p-2", "0x1.9f3240p-2"),  # 3/2
    "0x1.924924p+0": ("0x1.ced530p-2", "0x1.ced530p-2"),  # 11/7
    "0x1.aaaaaap+0": ("0x1.058af0p-1", "0x1.058af0p-1"),  # 5/3
    "0x1.ccccccp+0": ("0x1.2cf260p-1", "0x1.2cf25ep-1"),  # 9/5
    "0x1.4cccccp+1": ("0x1.e938cap-1", "0x1.e938ccp-1"),  # 13/5
    "0x1.500000p+1": ("0x1.ee1f14p-1", "0x1.ee1f14p-1"),  # 21/8
    "0x1.5b6db6p+1": ("0x1.ff3f2cp-1", "0x1.ff3f2cp-1"),  # 19/7
    "0x1.c00000p+1": ("0x1.40b514p+0", "0x1.40b514p+0"),  # 7/2
    "0x1.1af286p+2": ("0x1.7c8340p+0", "0x1.7c8340p+0"),  # 84/19
    "0x1.2bda12p+2": ("0x1.8b5e28p+0", "0x1.8b5e28p+0"),  # 253/54
    "0x1.4cccccp+2": ("0x1.a60e7cp+0", "0x1.a60e7ep+0"),  # 26/5
    "0x1.8cccccp+2": ("0x1.d315a8p+0", "0x1.d315a8p+0"),  # 31/5
    "0x1.c00000p+2": ("0x1.f2272cp+0", "0x1.f2272cp+0"),  # 7
    "0x1.dedb6ep+2": ("0x1.019a3ap+1", "0x1.019a3cp+1"),  # 419/56
    "0x1.880000p+3": ("0x1.40b514p+1", "0x1.40b514p+1"),  # 49/4
    "0x1.880000p+5": ("0x1.f2272cp+1", "0x1.f2272cp+1"),  # 49
}
CORRECTLY_ROUNDED = "MKL's AVX-512 path (correctly rounded at the T5 ties)"
MKL_PATHS = ("MKL's SSE4.2 path (e.g. AMD EPYC)", "MKL's AVX2 path (Intel without AVX-512)")
TIE_ARGUMENTS = np.array([float.fromhex(a) for a in MKL_LOG_AT_TIES], dtype=np.float32)

# The ties themselves, unidirectional: (b, max_distance, distance, the correctly rounded
# logarithm's bucket (the service's), transformers' bucket on MKL's SSE4.2 path, on its AVX2 path).
T5_TIES = [
    (5, 686, 14, 2, 3, 3), (5, 686, 98, 3, 4, 4), (17, 27, 12, 10, 11, 11),
    (17, 343, 28, 10, 11, 11), (17, 343, 98, 13, 14, 14), (19, 25, 15, 13, 14, 14),
    (36, 50, 30, 26, 27, 27), (48, 81, 36, 31, 32, 32), (51, 81, 45, 37, 38, 37),
    (51, 169, 65, 37, 37, 38), (51, 676, 130, 38, 37, 38), (51, 961, 155, 38, 37, 37),
    (54, 125, 45, 35, 36, 36), (55, 75, 45, 40, 41, 41), (65, 108, 48, 42, 43, 43),
    (72, 100, 60, 53, 54, 54), (73, 294, 60, 44, 45, 45), (91, 125, 75, 67, 68, 68),
    (96, 162, 72, 63, 64, 64), (99, 121, 77, 73, 74, 74), (99, 361, 133, 73, 74, 74),
    (100, 162, 90, 74, 75, 74), (100, 338, 130, 74, 74, 75), (108, 150, 90, 80, 81, 81),
    (108, 250, 90, 71, 72, 72), (108, 676, 253, 86, 87, 87), (112, 616, 419, 102, 102, 103),
    (113, 189, 84, 74, 75, 75), (115, 1009, 252, 87, 86, 86), (127, 175, 105, 94, 95, 95),
    (128, 441, 168, 96, 95, 95),
]  # fmt: skip
TIE_EDGES = sorted({(b, max_distance) for b, max_distance, *_ in T5_TIES})


def correctly_rounded_log_f32(x: float) -> float:
    """The float32 nearest to ln(x), x > 0: the one whose rounding interval (between the
    midpoints to its neighbours) holds ``decimal``'s 60-digit logarithm."""
    ln = Decimal(x).ln(Context(prec=60))
    r = np.float32(float(ln))
    while True:
        low = (Decimal(float(r)) + Decimal(float(np.nextafter(r, np.float32(-np.inf))))) / 2
        high = (Decimal(float(r)) + Decimal(float(np.nextafter(r, np.float32(np.inf))))) / 2
        if ln < low:
            r = np.nextafter(r, np.float32(-np.inf))
        elif ln > high:
            r = np.nextafter(r, np.float32(np.inf))
        else:
            return float(r)


def torch_log_f32(x: np.ndarray) -> np.ndarray:
    """torch's float32 log of float32 ``x`` as transformers takes it: in a tensor of at least 64
    elements (a vectorised call, like its (L, S) one)."""
    padded = np.ones(max(64, x.size), dtype=np.float32)  # (≥ 64,)
    padded[: x.size] = x
    return np.asarray(torch.log(torch.from_numpy(padded)).numpy()[: x.size])


@functools.cache
def torch_log_path() -> str:
    """Which float32 log this machine's torch takes, told by its values at TIE_ARGUMENTS."""
    here = [float(v) for v in torch_log_f32(TIE_ARGUMENTS)]
    if here == [correctly_rounded_log_f32(float(a)) for a in TIE_ARGUMENTS]:
        return CORRECTLY_ROUNDED
    for i, path in enumerate(MKL_PATHS):
        if here == [float.fromhex(v[i]) for v in MKL_LOG_AT_TIES.values()]:
            return path
    mkl = "on" if torch.backends.mkl.is_available() else "off"  # type: ignore[no-untyped-call]
    capability = torch.backends.cpu.get_cpu_capability()
    return f"an unmeasured float32 log (torch CPU capability {capability}, MKL {mkl})"


def hf_t5_bucket(
    rel: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int
) -> np.ndarray:
    """transformers' ``T5Attention._relative_position_bucket`` of ``rel`` (int64), as NumPy."""
    bucket = T5Attention._relative_position_bucket(  # type: ignore[no-untyped-call]
        torch.as_tensor(rel), bidirectional, num_buckets, max_distance
    )
    return np.asarray(bucket.numpy())


def log_bin_bucket(log: np.ndarray, b: int, max_distance: int) -> np.ndarray:
    """The large-distance bucket (no offset) that the float32 logarithm ``log`` of f32(d) / f32(m)
    gives, each step in float32 as transformers: min(m + trunc(log / log(md / m) · (b − m)), b − 1)."""
    m = b // 2
    log_bin = log.astype(np.float32) / np.float32(math.log(max_distance / m)) * np.float32(b - m)
    return np.minimum(m + log_bin.astype(np.int64), b - 1)


def assert_transformers_buckets(
    rel: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int, where: str = ""
) -> None:
    """``t5_bucket`` equals transformers' at every relative position of ``rel``, except where
    this machine's torch log of the formula's argument f32(d) / f32(m) is not the correctly
    rounded one: there transformers may be one bucket off, and then the formula with torch's
    log must give transformers' bucket and the formula with the correctly rounded one ours."""
    ours = t5_bucket(rel, bidirectional, num_buckets, max_distance)
    theirs = hf_t5_bucket(rel, bidirectional, num_buckets, max_distance)
    differ = np.flatnonzero(ours != theirs)
    if differ.size == 0:
        return
    b = num_buckets // 2 if bidirectional else num_buckets
    m = b // 2
    r = rel[differ]
    distance = np.abs(r) if bidirectional else -np.minimum(r, 0)
    offset = (r > 0) * b if bidirectional else 0
    argument = np.maximum(distance, m).astype(np.float32) / np.float32(m)
    torch_log = torch_log_f32(argument)
    exact_log = np.array([correctly_rounded_log_f32(float(a)) for a in argument], np.float32)
    explained = (
        (distance >= m)
        & (torch_log != exact_log)
        & (np.abs(ours[differ] - theirs[differ]) == 1)
        & (offset + log_bin_bucket(torch_log, b, max_distance) == theirs[differ])
        & (offset + log_bin_bucket(exact_log, b, max_distance) == ours[differ])
    )
    bad = ~explained
    assert not bad.any(), (
        f"{where}relative positions {r[bad].tolist()} get buckets {ours[differ][bad].tolist()}, "
        f"transformers {theirs[differ][bad].tolist()} (torch's float32 log here: "
        f"{torch_log_path()})"
    )


BUCKETS = [
    (True, 32, 128),
    (False, 32, 128),
    (True, 64, 256),
    (False, 16, 20),
    (True, 4, 3),
    (False, 2, 5),
    (True, 10, 1000),
]


@pytest.mark.parametrize(
    ("bidirectional", "num_buckets", "max_distance"),
    BUCKETS,
    ids=[f"{'bi' if b else 'uni'}-{nb}-{md}" for b, nb, md in BUCKETS],
)
def test_t5_bucket_matches_transformers(
    bidirectional: bool, num_buckets: int, max_distance: int
) -> None:
    """No tie in these settings: transformers' buckets on any CPU, exactly."""
    rel = np.arange(-5000, 5001, dtype=np.int64)
    np.testing.assert_array_equal(
        t5_bucket(rel, bidirectional, num_buckets, max_distance),
        hf_t5_bucket(rel, bidirectional, num_buckets, max_distance),
    )


def test_t5_log_is_correctly_rounded() -> None:
    """The service's float32 logarithm is the correctly rounded one: at the ties, at the float32s
    whose float64 logarithm is closest to a float32 midpoint (0x1.2f1fd6p+3's rounds onto it),
    and at random float32s in [1, 2^24]."""
    hard = [
        "0x1.8aa6f2p+0", "0x1.a6c9aep+0", "0x1.b88ea0p+0", "0x1.a09964p+1", "0x1.addc8ap+1",
        "0x1.2f1fd6p+3", "0x1.c7655ep+4", "0x1.585704p+7", "0x1.9e4750p+7", "0x1.7886c0p+10",
        "0x1.0cea86p+13", "0x1.9ab656p+13", "0x1.cb534cp+13", "0x1.94d8eap+14", "0x1.ee64b4p+23",
    ]  # fmt: skip
    rng = np.random.default_rng(7)
    random = rng.integers(np.float32(1).view(np.int32), np.float32(2**24).view(np.int32), 3000)
    x = np.concatenate(
        (
            TIE_ARGUMENTS,
            np.array([float.fromhex(h) for h in hard], dtype=np.float32),
            random.astype(np.int32).view(np.float32),
        )
    )
    expected = np.array([correctly_rounded_log_f32(float(v)) for v in x], dtype=np.float32)
    np.testing.assert_array_equal(_log_f32(x), expected)
    # the double-rounding case: float64 logarithm then float32 is one ulp too high
    double_rounded = np.float32(math.log(float.fromhex("0x1.2f1fd6p+3")))
    assert float(double_rounded).hex() == "0x1.1fcbd00000000p+1"
    assert float(_log_f32(np.array([float.fromhex("0x1.2f1fd6p+3")], np.float32))[0]).hex() == (
        "0x1.1fcbce0000000p+1"
    )


def test_t5_torch_log_at_the_ties_is_a_measured_path() -> None:
    """This machine's torch takes one of the float32 logs measured at the ties: the correctly
    rounded one (MKL's AVX-512 path) or MKL's SSE4.2 or AVX2 path; and at each tie argument at
    least one of those two is not correctly rounded (else it would be no tie)."""
    exact = [correctly_rounded_log_f32(float(a)) for a in TIE_ARGUMENTS]
    for argument, e, values in zip(MKL_LOG_AT_TIES, exact, MKL_LOG_AT_TIES.values(), strict=True):
        assert any(float.fromhex(v) != e for v in values), argument
    if not torch.backends.mkl.is_available():  # type: ignore[no-untyped-call]
        pytest.skip("torch without MKL (e.g. ARM, macOS): its float32 log was not measured")
    assert torch_log_path() in (CORRECTLY_ROUNDED, *MKL_PATHS), torch_log_path()


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize(
    ("b", "max_distance", "distance", "bucket", "sse42", "avx2"),
    T5_TIES,
    ids=[f"b{t[0]}-md{t[1]}-d{t[2]}" for t in T5_TIES],
)
def test_t5_bucket_at_the_ties(
    bidirectional: bool,
    b: int,
    max_distance: int,
    distance: int,
    bucket: int,
    sse42: int,
    avx2: int,
) -> None:
    """At each tie the service gives the correctly rounded logarithm's bucket on every machine,
    and transformers gives the bucket of the float32 log this machine's torch takes: the same on
    MKL's AVX-512 path, the measured neighbour on its SSE4.2 or AVX2 path."""
    num_buckets = 2 * b if bidirectional else b
    rel = np.array([-distance, distance] if bidirectional else [-distance], dtype=np.int64)
    expected = [bucket, b + bucket] if bidirectional else [bucket]
    assert t5_bucket(rel, bidirectional, num_buckets, max_distance).tolist() == expected
    path = torch_log_path()
    theirs = {CORRECTLY_ROUNDED: bucket, MKL_PATHS[0]: sse42, MKL_PATHS[1]: avx2}.get(path)
    if theirs is None:  # an unmeasured log: at least the rule of assert_transformers_buckets
        assert_transformers_buckets(rel, bidirectional, num_buckets, max_distance)
        return
    their_buckets = [theirs, b + theirs] if bidirectional else [theirs]
    assert hf_t5_bucket(rel, bidirectional, num_buckets, max_distance).tolist() == their_buckets, (
        f"transformers with torch's float32 log from {path}"
    )


@pytest.mark.parametrize(
    ("relative_position", "bucket", "sse42_avx2"), [(-12, 10, 11), (-18, 13, 13)]
)
def test_t5_bucket_fuzz_find_17_buckets_max_distance_27(
    relative_position: int, bucket: int, sse42_avx2: int
) -> None:
    """A differential fuzz's find (unidirectional, 17 buckets, max_distance 27: max_exact 8).
    12/8 = 3/2 and 18/8 = (3/2)^2 while 27/8 = (3/2)^3: the exact log ratios times 9 are the
    integers 3 and 6 (buckets 11 and 14), so float32 rounding decides. The correctly rounded
    logarithm (the service; transformers on MKL's AVX-512 path) gives 10 and 13, MKL's SSE4.2
    and AVX2 paths 11 and 13, NumPy's float32 log 10 and 14."""
    rel = np.array([relative_position], dtype=np.int64)
    assert t5_bucket(rel, False, 17, 27).tolist() == [bucket]
    path = torch_log_path()
    if path in MKL_PATHS:
        assert hf_t5_bucket(rel, False, 17, 27).tolist() == [sse42_avx2], path
    elif path == CORRECTLY_ROUNDED:
        assert hf_t5_bucket(rel, False, 17, 27).tolist() == [bucket], path
    else:
        assert_transformers_buckets(rel, False, 17, 27)


EXHAUSTIVE = bool(os.environ.get("T5_BUCKETS_EXHAUSTIVE"))  # every max_distance (~80 s)
SWEEP = [(bi, nb) for bi in (False, True) for nb in range(4 if bi else 2, 129)]


def sweep_max_distances(b: int) -> list[int]:
    """max_distance values swept for b buckets per direction: all from b // 2 + 1 to 64, every
    16th above up to 1024 (starting at 65 + b mod 16, so that the b's share out the residues),
    T5's 128 and those of TIE_EDGES; every one up to 1024 with T5_BUCKETS_EXHAUSTIVE set."""
    first = b // 2 + 1
    if EXHAUSTIVE:
        return list(range(first, 1025))
    edges = {md for edge_b, md in TIE_EDGES if edge_b == b}
    return sorted({*range(first, 65), *range(65 + b % 16, 1025, 16), 128, *edges})


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch on one thread: small ops on a busy machine are far faster without OpenMP."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize(
    ("bidirectional", "num_buckets"),
    SWEEP,
    ids=[f"{'bi' if bi else 'uni'}-{nb}" for bi, nb in SWEEP],
)
def test_t5_bucket_equals_transformers_at_every_edge(bidirectional: bool, num_buckets: int) -> None:
    """Every relative position −4096 … 4096 gets transformers' bucket (but at the ties where this
    machine's torch log is not correctly rounded: :func:`assert_transformers_buckets`), for
    num_buckets 2 … 128 (4 … 128 bidirectional) and the max_distances of
    :func:`sweep_max_distances`."""
    rel = np.arange(-4096, 4097, dtype=np.int64)
    b = num_buckets // 2 if bidirectional else num_buckets
    for max_distance in sweep_max_distances(b):
        assert_transformers_buckets(
            rel, bidirectional, num_buckets, max_distance, f"max_distance {max_distance}: "
        )


@st.composite
def t5_case(draw: st.DrawFn) -> tuple[np.ndarray, bool, int, int]:
    bidirectional = draw(st.booleans())
    num_buckets = draw(st.integers(4 if bidirectional else 2, 128))
    b = num_buckets // 2 if bidirectional else num_buckets
    max_distance = draw(st.integers(b // 2 + 1, 1024))
    rel = draw(arrays(np.int64, st.integers(1, 64), elements=st.integers(-5000, 5000)))
    return rel, bidirectional, num_buckets, max_distance


@settings(max_examples=300, deadline=None)
@given(t5_case())
def test_t5_bucket_equals_transformers_anywhere(case: tuple[np.ndarray, bool, int, int]) -> None:
    rel, bidirectional, num_buckets, max_distance = case
    assert_transformers_buckets(rel, bidirectional, num_buckets, max_distance)


@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("past", [0, 37], ids=["prefill", "cached"])
def test_relative_bias_matches_transformers_t5_compute_bias(decoder: bool, past: int) -> None:
    n, L, S = 3, 4, 40
    config = T5Config(
        d_model=8,
        d_kv=4,
        num_heads=n,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=20,
        is_decoder=decoder,
    )
    attention = T5Attention(config, has_relative_attention_bias=True).double()
    table = np.random.default_rng(6).normal(size=(32, n))
    with torch.no_grad():
        attention.relative_attention_bias.weight.copy_(t64(table))
        bias = attention.compute_bias(L, S, past_seen_tokens=past)  # type: ignore[no-untyped-call]
        expected = bias[0].numpy()  # (n, L, S)
    ours = relative_bias(table, np.arange(L) + past, np.arange(S), not decoder, 20)
    np.testing.assert_array_equal(ours, expected)


def test_relative_bias_refuses_bad_input() -> None:
    with pytest.raises(AttentionInputError, match="table"):
        relative_bias(np.ones(4), np.arange(2), np.arange(2))
    with pytest.raises(AttentionInputError, match="at least 4 buckets"):
        relative_bias(np.ones((2, 1)), np.arange(2), np.arange(2))
    with pytest.raises(AttentionInputError, match="max_distance"):
        relative_bias(np.ones((32, 1)), np.arange(2), np.arange(2), max_distance=8)
    with pytest.raises(AttentionInputError, match="context_positions"):
        relative_bias(np.ones((32, 1)), np.arange(2), np.arange(4).reshape(2, 2))
