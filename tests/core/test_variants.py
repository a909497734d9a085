"""Score variants (issue 13): qk_norm, softcap and attention sinks, checked against independent
float64 references (PyTorch and the Hugging Face transformers models that introduced them)
and by Hypothesis properties.

The NumPy-only tests always run; each reference test imports torch/transformers itself and
skips when they are missing, unless REQUIRE_TORCH is set (then a missing one fails), as
tests/core/test_torch_live.py does at its top.
"""

import importlib
import os
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from service.core.errors import AttentionInputError
from service.core.softmax import softmax
from service.core.types import QKNormType
from service.core.variants import QKNorm, qk_norm, softcap, softmax_with_sink

TOL = 1e-12


def reference(module: str) -> ModuleType | Any:
    """torch or a transformers module: a skip when missing, a failure if REQUIRE_TORCH is set."""
    if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
        return importlib.import_module(module)
    return pytest.importorskip(
        module,
        reason=f"{module} is not installed: reference cross-check skipped "
        "(install torch==2.13.0 and transformers==5.23.0)",
    )


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- qk_norm

NORM_CASES = [
    pytest.param((3, 8), 1e-6, False, id="L3-dk8-eps1e-6-no-weight"),
    pytest.param((2, 4, 5, 8), 1e-6, True, id="B2-h4-L5-dk8-weighted"),
    pytest.param((1, 2, 3, 16), 1e-2, True, id="B1-h2-L3-dk16-large-eps"),
    pytest.param((2, 3, 1, 4), 0.0, True, id="B2-h3-L1-dk4-eps0"),
]


@pytest.mark.torch
@pytest.mark.parametrize(("shape", "eps", "weighted"), NORM_CASES)
def test_rms_qk_norm_equals_torch_rms_norm_in_float64(
    shape: tuple[int, ...], eps: float, weighted: bool
) -> None:
    torch = reference("torch")
    g = rng(1)
    x = g.normal(size=shape) * g.choice([1e-3, 1.0, 30.0], size=(*shape[:-1], 1))
    w = g.normal(size=shape[-1]) if weighted else None
    ours = qk_norm(x, QKNorm("rms", eps, w))
    expected = torch.nn.functional.rms_norm(
        torch.from_numpy(x), (shape[-1],), None if w is None else torch.from_numpy(w), eps
    )
    assert expected.dtype == torch.float64
    np.testing.assert_allclose(ours, expected.numpy(), rtol=TOL, atol=TOL)


@pytest.mark.torch
@pytest.mark.parametrize(("shape", "eps", "weighted"), NORM_CASES)
def test_layer_qk_norm_equals_torch_layer_norm_weight_only_in_float64(
    shape: tuple[int, ...], eps: float, weighted: bool
) -> None:
    torch = reference("torch")
    g = rng(2)
    x = g.normal(loc=3.0, size=shape)
    w = g.normal(size=shape[-1]) if weighted else None
    ours = qk_norm(x, QKNorm("layer", eps, w))
    expected = torch.nn.functional.layer_norm(
        torch.from_numpy(x), (shape[-1],), None if w is None else torch.from_numpy(w), None, eps
    )
    assert expected.dtype == torch.float64
    np.testing.assert_allclose(ours, expected.numpy(), rtol=TOL, atol=TOL)


@pytest.mark.torch
@pytest.mark.parametrize("seed", [0, 1, 2], ids=lambda s: f"seed{s}")
def test_rms_qk_norm_equals_qwen3_q_norm_and_k_norm_per_head(seed: int) -> None:
    """Qwen3Attention normalises q and k over each head's head_dim (``.view(B, L, h, d)``).

    Qwen3RMSNorm casts its input to float32 inside (``hidden_states.to(torch.float32)``) and
    back: on float64 it returns float64 but only float32-accurate, hence rtol 1e-6 here; the
    float64 agreement to 1e-12 is checked against torch's rms_norm above.
    """
    torch = reference("torch")
    qwen3 = reference("transformers.models.qwen3.modeling_qwen3")
    config = reference("transformers").Qwen3Config(
        hidden_size=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=1,
        vocab_size=10,
        intermediate_size=8,
    )
    torch.manual_seed(seed)
    attn = qwen3.Qwen3Attention(config, 0).double().eval()
    with torch.no_grad():
        attn.q_norm.weight.normal_()
        attn.k_norm.weight.normal_()
        hidden = torch.randn(2, 5, 16, dtype=torch.float64)  # (B, L, d_model)
        q = attn.q_proj(hidden).view(2, 5, -1, 8)  # (B, L, h, d_k) as Qwen3Attention.forward
        k = attn.k_proj(hidden).view(2, 5, -1, 8)  # (B, L, h_kv, d_k)
        q_ref, k_ref = attn.q_norm(q), attn.k_norm(k)
    assert q_ref.dtype == torch.float64 and k_ref.dtype == torch.float64
    eps = config.rms_norm_eps
    q_ours = qk_norm(
        q.numpy().transpose(0, 2, 1, 3), QKNorm("rms", eps, attn.q_norm.weight.detach().numpy())
    )
    k_ours = qk_norm(
        k.numpy().transpose(0, 2, 1, 3), QKNorm("rms", eps, attn.k_norm.weight.detach().numpy())
    )
    np.testing.assert_allclose(q_ours, q_ref.numpy().transpose(0, 2, 1, 3), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(k_ours, k_ref.numpy().transpose(0, 2, 1, 3), rtol=1e-6, atol=1e-6)


vectors = arrays(
    np.float64,
    st.tuples(st.integers(1, 3), st.integers(1, 9)),
    elements=st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
).filter(lambda a: bool((np.abs(a) > 1e-3).any(axis=-1).all()))


@settings(max_examples=150, deadline=None)
@given(vectors, st.floats(0.1, 10.0))
def test_rms_normed_vectors_have_rms_equal_to_the_weight(x: np.ndarray, w: float) -> None:
    out = qk_norm(x, QKNorm("rms", 0.0, np.full(x.shape[-1], w)))
    np.testing.assert_allclose(np.sqrt(np.mean(out**2, axis=-1)), w, rtol=1e-12)


@settings(max_examples=150, deadline=None)
@given(vectors, st.floats(1e-3, 1e3), st.sampled_from(["rms", "layer"]))
def test_qk_norm_with_eps_0_ignores_the_scale_of_each_vector(
    x: np.ndarray, a: float, kind: QKNormType
) -> None:
    if kind == "layer" and not (np.ptp(x, axis=-1) > 1e-3).all():
        return  # a constant vector has no variance to normalise by
    norm = QKNorm(kind, 0.0)
    np.testing.assert_allclose(qk_norm(a * x, norm), qk_norm(x, norm), rtol=1e-9, atol=1e-9)


@settings(max_examples=150, deadline=None)
@given(vectors)
def test_layer_normed_vectors_have_mean_0_and_variance_1(x: np.ndarray) -> None:
    if not (np.ptp(x, axis=-1) > 1e-3).all():
        return
    out = qk_norm(x, QKNorm("layer", 0.0))
    np.testing.assert_allclose(out.mean(axis=-1), 0.0, atol=1e-9)
    np.testing.assert_allclose(out.var(axis=-1), 1.0, rtol=1e-9)


@pytest.mark.parametrize(
    ("x", "norm", "message"),
    [
        pytest.param(np.full((2, 4), 1e200), QKNorm("rms"), "overflowed", id="rms-overflow"),
        pytest.param(
            np.array([[1e200, -1e200]]), QKNorm("layer"), "overflowed", id="layer-overflow"
        ),
        pytest.param(np.zeros((1, 4)), QKNorm("rms", 0.0), "eps > 0", id="rms-zero-vector-eps0"),
        pytest.param(
            np.ones((1, 4)), QKNorm("layer", 0.0), "eps > 0", id="layer-constant-vector-eps0"
        ),
        pytest.param(np.ones((1, 4)), QKNorm("rms", -1.0), "eps", id="negative-eps"),
        pytest.param(np.ones((1, 4)), QKNorm("rms", np.nan), "eps", id="nan-eps"),
        pytest.param(
            np.ones((1, 4)), QKNorm("rms", weight=np.ones(3)), "4 numbers", id="weight-3-for-dk4"
        ),
        pytest.param(
            np.array([[1.0, 0.0, 0.0, 0.0]]),  # normed: [2, 0, 0, 0]
            QKNorm("rms", weight=np.full(4, 1e308)),
            "overflowed",
            id="weight-overflow",
        ),
    ],
)
def test_qk_norm_refuses_what_it_cannot_normalise(
    x: np.ndarray, norm: QKNorm, message: str
) -> None:
    with pytest.raises(AttentionInputError, match=message):
        qk_norm(x, norm)


def test_qk_norm_of_a_zero_vector_with_eps_is_zero() -> None:
    assert (qk_norm(np.zeros((2, 3)), QKNorm("rms")) == 0.0).all()
    assert (qk_norm(np.full((2, 3), 7.0), QKNorm("layer")) == 0.0).all()


# ---------------------------------------------------------------- softcap

SOFTCAP_CASES = [
    pytest.param(50.0, 1.0, id="gemma2-cap50-scores-1"),
    pytest.param(50.0, 200.0, id="gemma2-cap50-scores-200"),
    pytest.param(0.5, 3.0, id="cap0.5-scores-3"),
]


@pytest.mark.torch
@pytest.mark.parametrize(("cap", "spread"), SOFTCAP_CASES)
def test_softcap_then_mask_equals_gemma2_eager_attention(
    cap: float, spread: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers models/gemma2 ``eager_attention_forward``: scores · scaling, then
    ``/ softcap; tanh; * softcap``, then ``+ attention_mask``, then the softmax.

    That softmax is called with ``dtype=torch.float32``; for a float64 comparison it is run
    here in the input's dtype (the only change), so its weights must match ours to 1e-12.
    """
    torch = reference("torch")
    gemma2 = reference("transformers.models.gemma2.modeling_gemma2")
    plain_softmax = torch.nn.functional.softmax

    def softmax_float64(t: Any, dim: int, dtype: Any = None) -> Any:
        return plain_softmax(t, dim=dim)

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax_float64)
    g = rng(3)
    b, h, L, S, d = 2, 3, 4, 5, 8
    q = g.normal(size=(b, h, L, d)) * spread / np.sqrt(d)
    k = g.normal(size=(b, h, S, d))
    v = g.normal(size=(b, h, S, d))
    allowed = g.random((b, 1, L, S)) < 0.7
    allowed[..., 0] = True  # no fully masked row: torch's softmax would give NaN there
    additive = np.where(allowed, 0.0, -np.inf)  # (B, 1, L, S)
    module = SimpleNamespace(num_key_value_groups=1, training=False, head_dim=d)
    _, ref_weights = gemma2.eager_attention_forward(
        module,
        torch.from_numpy(q),
        torch.from_numpy(k),
        torch.from_numpy(v),
        torch.from_numpy(additive),
        scaling=d**-0.5,
        softcap=cap,
    )
    assert ref_weights.dtype == torch.float64
    scaled = q @ k.swapaxes(-1, -2) * d**-0.5  # (B, h, L, S)
    ours = softmax(softcap(scaled, cap) + additive)
    np.testing.assert_allclose(ours, ref_weights.numpy(), rtol=TOL, atol=TOL)


scores = arrays(
    np.float64,
    st.tuples(st.integers(1, 4), st.integers(1, 6)),
    elements=st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False),
)
caps = st.floats(1e-3, 1e3)


@settings(max_examples=200, deadline=None)
@given(scores, caps)
def test_softcap_is_odd_and_bounded_by_the_cap(s: np.ndarray, cap: float) -> None:
    capped = softcap(s, cap)
    np.testing.assert_array_equal(softcap(-s, cap), -capped)
    assert (np.abs(capped) <= cap).all()
    assert (capped * s >= 0).all()  # same sign as the score (or 0 on underflow)
    assert np.isfinite(capped).all()


@settings(max_examples=200, deadline=None)
@given(scores, caps)
def test_softcap_is_almost_the_identity_far_below_the_cap(s: np.ndarray, cap: float) -> None:
    small = s / np.max(np.abs(s), initial=1.0) * cap * 1e-4  # |s| ≤ 1e-4 c
    # c·tanh(s/c) = s − s³/(3c²) + …: relative error ≤ (s/c)²/3 ≈ 3e-9
    np.testing.assert_allclose(softcap(small, cap), small, rtol=4e-9, atol=1e-300)  # subnormals


def test_softcap_keeps_masked_scores_masked_so_it_commutes_with_the_mask() -> None:
    s = np.array([[0.3, -2.0, 70.0], [5.0, 1.0, -80.0]])
    additive = np.array([[0.0, -np.inf, 0.0], [-np.inf, 0.0, 0.0]])
    np.testing.assert_array_equal(softcap(s + additive, 30.0), softcap(s, 30.0) + additive)


def test_softcap_saturates_to_exactly_the_cap_without_overflow_warnings() -> None:
    out = softcap(np.array([1e308, -1e308, 0.0]), 1e-300)
    np.testing.assert_array_equal(out, [1e-300, -1e-300, 0.0])


@pytest.mark.parametrize(
    ("s", "cap"),
    [
        pytest.param(np.ones((2, 2)), 0.0, id="cap-0"),
        pytest.param(np.ones((2, 2)), -1.0, id="cap-negative"),
        pytest.param(np.ones((2, 2)), np.inf, id="cap-infinite"),
        pytest.param(np.ones((2, 2)), np.nan, id="cap-nan"),
        pytest.param(np.array([[np.nan, 1.0]]), 1.0, id="score-nan"),
        pytest.param(np.array([[np.inf, 1.0]]), 1.0, id="score-plus-infinity"),
    ],
)
def test_softcap_refuses_a_bad_cap_or_bad_scores(s: np.ndarray, cap: float) -> None:
    with pytest.raises(AttentionInputError):
        softcap(s, cap)


# ---------------------------------------------------------------- sinks


@pytest.mark.torch
@pytest.mark.parametrize(
    ("seed", "num_kv_heads", "mask_kind"),
    [
        pytest.param(0, 4, "none", id="mha-no-mask"),
        pytest.param(1, 2, "causal", id="gqa-causal"),
        pytest.param(2, 2, "random-with-empty-row", id="gqa-random-mask-one-row-fully-masked"),
        pytest.param(3, 1, "causal-large-sinks", id="mqa-causal-sinks-dominate"),
    ],
)
def test_softmax_with_sink_equals_gpt_oss_eager_attention(
    seed: int, num_kv_heads: int, mask_kind: str
) -> None:
    """transformers models/gpt_oss ``eager_attention_forward`` called with a real
    ``GptOssAttention`` (tiny ``GptOssConfig``, float64, random sinks): it concatenates the
    sink as one more logit, subtracts the row max, softmaxes and drops the sink column."""
    torch = reference("torch")
    gpt_oss = reference("transformers.models.gpt_oss.modeling_gpt_oss")
    config = reference("transformers").GptOssConfig(
        hidden_size=16,
        num_attention_heads=4,
        num_key_value_heads=num_kv_heads,
        head_dim=4,
        num_hidden_layers=1,
        vocab_size=10,
        intermediate_size=8,
        num_local_experts=2,
        num_experts_per_tok=1,
    )
    torch.manual_seed(seed)
    attn = gpt_oss.GptOssAttention(config, 0).double().eval()
    g = rng(seed)
    b, h, L, S, d = 2, 4, 5, 6, 4
    sinks = g.normal(size=h) * (8.0 if mask_kind == "causal-large-sinks" else 1.0)
    with torch.no_grad():
        attn.sinks.copy_(torch.from_numpy(sinks))
    q = g.normal(size=(b, h, L, d)) * 2
    k = g.normal(size=(b, num_kv_heads, S, d)) * 2
    v = g.normal(size=(b, num_kv_heads, S, d))
    allowed = np.ones((b, 1, L, S), dtype=bool)
    if mask_kind.startswith("causal"):
        allowed = np.broadcast_to(np.tril(np.ones((L, S), dtype=bool), S - L), allowed.shape)
    elif mask_kind.startswith("random"):
        allowed = g.random((b, 1, L, S)) < 0.5
        allowed[1, 0, 2] = False  # batch item 1, query 2: every key masked
    additive = np.where(allowed, 0.0, -np.inf)  # (B, 1, L, S)
    with torch.no_grad():
        ref_out, ref_weights = gpt_oss.eager_attention_forward(
            attn,
            torch.from_numpy(q),
            torch.from_numpy(k),
            torch.from_numpy(v),
            None if mask_kind == "none" else torch.from_numpy(additive),
            scaling=attn.scaling,
        )
    assert ref_weights.dtype == torch.float64

    k_rep = np.repeat(k, h // num_kv_heads, axis=1)  # (B, h, S, d), as repeat_kv
    v_rep = np.repeat(v, h // num_kv_heads, axis=1)  # (B, h, S, d)
    logits = q @ k_rep.swapaxes(-1, -2) * attn.scaling + additive  # (B, h, L, S)
    result = softmax_with_sink(logits, sinks)
    np.testing.assert_allclose(result.weights, ref_weights.numpy(), rtol=TOL, atol=TOL)
    np.testing.assert_allclose(
        result.sink_weights, 1.0 - ref_weights.numpy().sum(axis=-1), rtol=1e-10, atol=1e-12
    )
    output = (result.weights @ v_rep).transpose(0, 2, 1, 3)  # (B, L, h, d) as gpt-oss returns it
    np.testing.assert_allclose(output, ref_out.numpy(), rtol=TOL, atol=TOL)
    empty = ~allowed.any(axis=-1)  # (B, 1, L)
    assert (
        result.fully_masked_rows == np.broadcast_to(empty, result.fully_masked_rows.shape)
    ).all()
    if empty.any():
        assert (result.sink_weights[np.broadcast_to(empty, result.sink_weights.shape)] == 1.0).all()


@st.composite
def masked_scores(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    b, h, L, S = (draw(st.integers(1, 4)) for _ in range(4))
    s = draw(arrays(np.float64, (b, h, L, S), elements=st.floats(-50, 50)))
    allowed = draw(arrays(np.bool_, (b, h, L, S)))
    sinks = draw(arrays(np.float64, (h,), elements=st.floats(-50, 50)))
    return np.where(allowed, s, -np.inf), allowed, sinks


@settings(max_examples=200, deadline=None)
@given(masked_scores())
def test_sink_weight_plus_row_sum_is_one_and_masked_keys_get_exactly_zero(
    case: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    logits, allowed, sinks = case
    result = softmax_with_sink(logits, sinks)
    np.testing.assert_allclose(result.weights.sum(axis=-1) + result.sink_weights, 1.0, rtol=1e-12)
    assert (result.weights >= 0).all() and (result.sink_weights >= 0).all()
    assert (result.weights[~allowed] == 0.0).all()
    empty = ~allowed.any(axis=-1)  # (B, h, L)
    assert (result.fully_masked_rows == empty).all()
    assert (result.sink_weights[empty] == 1.0).all()


@settings(max_examples=200, deadline=None)
@given(masked_scores(), st.floats(-100, 100))
def test_sink_softmax_ignores_a_shift_of_scores_and_sinks_together(
    case: tuple[np.ndarray, np.ndarray, np.ndarray], shift: float
) -> None:
    logits, _, sinks = case
    a, b = softmax_with_sink(logits, sinks), softmax_with_sink(logits + shift, sinks + shift)
    np.testing.assert_allclose(b.weights, a.weights, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(b.sink_weights, a.sink_weights, rtol=1e-9, atol=1e-12)


def test_a_sink_far_below_the_scores_gives_the_plain_softmax() -> None:
    s = rng(4).normal(size=(2, 3, 4))  # (B, L, S), /attention with a batch: a scalar sink
    result = softmax_with_sink(s, -1e4)
    np.testing.assert_allclose(result.weights, softmax(s), rtol=TOL, atol=0)
    assert result.sink_weights.shape == (2, 3) and (result.sink_weights == 0.0).all()


def test_a_sink_equal_to_the_only_key_takes_half() -> None:
    result = softmax_with_sink(np.array([[2.0, -np.inf], [-np.inf, -np.inf]]), 2.0)
    np.testing.assert_allclose(result.weights, [[0.5, 0.0], [0.0, 0.0]], rtol=TOL)
    np.testing.assert_allclose(result.sink_weights, [0.5, 1.0], rtol=TOL)


def test_sink_huge_scores_do_not_overflow() -> None:
    result = softmax_with_sink(np.array([[1e308, -1e308]]), -1e308)
    np.testing.assert_array_equal(result.weights, [[1.0, 0.0]])
    np.testing.assert_array_equal(result.sink_weights, [0.0])


@pytest.mark.parametrize(
    ("s", "sink", "message"),
    [
        pytest.param(np.zeros((1, 3, 2, 2)), np.zeros(2), "one per head", id="2-sinks-for-3-heads"),
        pytest.param(
            np.zeros((2, 2)), np.zeros(2), "one per head", id="per-head-sinks-without-heads"
        ),
        pytest.param(np.zeros((1, 2, 2, 2)), np.zeros((2, 1)), "shape", id="sinks-2d"),
        pytest.param(np.zeros((2, 2)), np.inf, "finite", id="sink-infinite"),
        pytest.param(np.zeros((1, 2, 2, 2)), np.array([0.0, np.nan]), "finite", id="sink-nan"),
        pytest.param(np.array([[np.nan, 0.0]]), 0.0, "NaN", id="score-nan"),
        pytest.param(np.array([[np.inf, 0.0]]), 0.0, "infinity", id="score-plus-infinity"),
    ],
)
def test_softmax_with_sink_refuses_bad_sinks_and_scores(
    s: np.ndarray, sink: float | np.ndarray, message: str
) -> None:
    with pytest.raises(AttentionInputError, match=message):
        softmax_with_sink(s, sink)


# ---------------------------------------------------------------- all of them in one attention
COMBINATIONS = {
    "qk_norm": {"qk_norm"},
    "rope": {"rope"},
    "qwen3-like": {"qk_norm", "rope"},
    "gemma2-like": {"rope", "softcap"},
    "alibi": {"bias"},
    "gpt-oss-like": {"rope", "sinks"},
    "everything": {"qk_norm", "rope", "softcap", "bias", "sinks"},
}


@pytest.mark.parametrize("parts", list(COMBINATIONS.values()), ids=list(COMBINATIONS))
def test_the_variants_apply_in_the_contracts_order(parts: set[str]) -> None:
    """scaled_dot_product_attention with variants equals the contract's order built from torch
    in float64: rms_norm, transformers' LLaMA apply_rotary_pos_emb (half style) at positions
    3…7, scaling, c·tanh(s/c), + bias, causal mask, softmax with one sink column per head."""
    torch = reference("torch")
    llama = reference("transformers.models.llama.modeling_llama")
    from service.core.attention import scaled_dot_product_attention
    from service.core.masks import causal
    from service.core.positions import Rope, alibi_bias, alibi_slopes
    from service.core.variants import Variants

    g = rng(7)
    b, h, n, d = 2, 3, 5, 8
    q, k, v = (g.normal(size=(b, h, n, d)) for _ in range(3))  # (B, h, L, d)
    w_q, w_k = g.normal(size=d), g.normal(size=d)
    positions = np.arange(3, 3 + n)
    bias = alibi_bias(alibi_slopes(h), positions, positions)  # (h, L, L)
    sinks = g.normal(size=h)
    additive = np.where(causal(n, n, "upper_left"), 0.0, -np.inf)  # (L, L)
    variants = Variants(
        q_norm=QKNorm(weight=w_q) if "qk_norm" in parts else None,
        k_norm=QKNorm(weight=w_k) if "qk_norm" in parts else None,
        rope=Rope() if "rope" in parts else None,
        positions=positions,
        context_positions=positions,
        softcap=2.0 if "softcap" in parts else None,
        position_bias=bias if "bias" in parts else None,
        sinks=sinks if "sinks" in parts else None,
    )
    ours = scaled_dot_product_attention(q, k, v, additive=additive, variants=variants)

    tq, tk, tv = (torch.tensor(a, dtype=torch.float64) for a in (q, k, v))
    if "qk_norm" in parts:
        tq = torch.nn.functional.rms_norm(tq, (d,), torch.tensor(w_q), eps=1e-6)
        tk = torch.nn.functional.rms_norm(tk, (d,), torch.tensor(w_k), eps=1e-6)
    if "rope" in parts:
        inv_freq = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = torch.tensor(positions, dtype=torch.float64)[:, None] * inv_freq  # (L, d/2)
        emb = torch.cat([angles, angles], dim=-1)[None]  # (1, L, d)
        tq, tk = llama.apply_rotary_pos_emb(tq, tk, emb.cos(), emb.sin())
    logits = tq @ tk.transpose(-1, -2) / d**0.5
    if "softcap" in parts:
        logits = 2.0 * torch.tanh(logits / 2.0)
    if "bias" in parts:
        logits = logits + torch.tensor(bias)
    logits = logits + torch.tensor(additive)
    if "sinks" in parts:
        column = torch.tensor(sinks).reshape(1, h, 1, 1).expand(b, h, n, 1)
        probs = torch.softmax(torch.cat([logits, column], dim=-1), dim=-1)
        weights, sunk = probs[..., :-1], probs[..., -1]
        assert ours.sink_weights is not None
        np.testing.assert_allclose(ours.sink_weights, sunk.numpy(), rtol=0, atol=1e-12)
    else:
        weights = torch.softmax(logits, dim=-1)
        assert ours.sink_weights is None
    np.testing.assert_allclose(ours.weights, weights.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours.output, (weights @ tv).numpy(), rtol=0, atol=1e-12)
    assert (ours.q_rotated is None) == ("rope" not in parts)
    assert (ours.capped_scores is None) == ("softcap" not in parts)
    assert (ours.biased_scores is None) == ("bias" not in parts)
