"""Today's layers (issue 30) in the core: QK-norm zero-centred (Qwen3-Next) and after RoPE
(Llama 4), the values' norm (Gemma 4), Llama 4's temperature and chunked mask, the output gate
(Qwen3-Next), each against the transformers 5.23 module or function that defines it, run in
float64 (``Tensor.float`` widened to ``double`` where the module casts to float32), to 1e-12.
Whole layers are checked in tests/api/test_golden.py (harness/hf_today.py).
"""

from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest

from service.core import masks
from service.core.attention import scaled_dot_product_attention
from service.core.multihead import MultiheadWeights, multihead_attention
from service.core.positions import Rope
from service.core.variants import (
    QKNorm,
    Temperature,
    Variants,
    qk_norm,
    sigmoid,
    temperature_factors,
)
from tests.core.test_variants import reference

TOL = 1e-12


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture
def float64_casts() -> Iterator[None]:
    """``Tensor.float()`` as ``double()``: the norms' float32 cast, widened."""
    torch = reference("torch")
    with mock.patch.object(torch.Tensor, "float", torch.Tensor.double):
        yield


@pytest.mark.usefixtures("float64_casts")
@pytest.mark.parametrize("eps", [1e-6, 1e-3], ids=["eps_1e-6", "eps_1e-3"])
def test_zero_centered_qk_norm_is_qwen3_nexts_rms_norm(eps: float) -> None:
    torch = reference("torch")
    modeling = reference("transformers.models.qwen3_next.modeling_qwen3_next")
    x = rng(1).normal(size=(2, 3, 5, 8))  # (B, h, L, d_k)
    w = rng(2).normal(size=8) * 0.3  # stored around 0
    norm = modeling.Qwen3NextRMSNorm(8, eps=eps).double()
    with torch.no_grad():
        norm.weight.copy_(torch.as_tensor(w))
        expected = norm(torch.as_tensor(x)).numpy()
    ours = qk_norm(x, QKNorm("rms", eps, w, zero_centered=True))
    np.testing.assert_allclose(ours, expected, rtol=0, atol=TOL)
    plain = qk_norm(x, QKNorm("rms", eps, w))  # the same weight as w, not 1 + w: differs
    assert np.abs(plain - expected).max() > 1e-3


@pytest.mark.usefixtures("float64_casts")
def test_v_norm_is_gemma4s_rms_norm_without_scale() -> None:
    torch = reference("torch")
    modeling = reference("transformers.models.gemma4.modeling_gemma4")
    v = rng(3).normal(size=(1, 2, 6, 4)) * 3.0  # (B, h_kv, S, d_v)
    norm = modeling.Gemma4RMSNorm(4, eps=1e-6, with_scale=False)
    expected = norm(torch.as_tensor(v)).numpy()
    q, k = rng(4).normal(size=(1, 2, 6, 4)), rng(5).normal(size=(1, 2, 6, 4))
    trace = scaled_dot_product_attention(q, k, v, variants=Variants(v_norm=QKNorm("rms", 1e-6)))
    assert trace.v_normed is not None
    np.testing.assert_allclose(trace.v_normed, expected, rtol=0, atol=TOL)
    np.testing.assert_allclose(trace.output, trace.weights @ expected, rtol=0, atol=TOL)


@pytest.mark.usefixtures("float64_casts")
def test_after_rope_norm_is_llama4s_l2_norm_of_the_rotated_vectors() -> None:
    """Llama 4 rotates (interleaved pairs, complex multiplication) and then normalises."""
    torch = reference("torch")
    modeling = reference("transformers.models.llama4.modeling_llama4")
    L, d = 6, 8
    q, k = rng(6).normal(size=(1, 1, L, d)), rng(7).normal(size=(1, 1, L, d))
    pos = torch.arange(L, dtype=torch.float64)
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))  # (d/2,)
    freqs_cis = torch.polar(torch.ones(L, d // 2, dtype=torch.float64), pos[:, None] * inv)
    # apply_rotary_emb takes (B, L, h, d) and freqs (B, L, d/2)
    q_r, k_r = modeling.apply_rotary_emb(
        torch.as_tensor(q).transpose(1, 2), torch.as_tensor(k).transpose(1, 2), freqs_cis[None]
    )
    l2 = modeling.Llama4TextL2Norm(1e-5)
    expected_q = l2(q_r).transpose(1, 2).numpy()
    expected_k = l2(k_r).transpose(1, 2).numpy()
    norm = QKNorm("rms", 1e-5, after_rope=True)
    v = Variants(q_norm=norm, k_norm=norm, rope=Rope(500000.0, "interleaved"))
    trace = scaled_dot_product_attention(q, k, rng(8).normal(size=(1, 1, L, d)), variants=v)
    assert trace.q_rotated is not None and trace.q_normed is not None
    assert trace.k_normed is not None
    np.testing.assert_allclose(trace.q_rotated, q_r.transpose(1, 2).numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(trace.q_normed, expected_q, rtol=0, atol=TOL)
    np.testing.assert_allclose(trace.k_normed, expected_k, rtol=0, atol=TOL)
    before = scaled_dot_product_attention(
        q, k, q, variants=Variants(q_norm=QKNorm("rms", 1e-5), k_norm=QKNorm("rms", 1e-5),
                                   rope=Rope(500000.0, "interleaved"))
    )  # fmt: skip
    assert before.q_normed is not None
    assert np.abs(before.q_normed - expected_q).max() > 1e-3  # the order matters


@pytest.mark.parametrize(
    ("floor_scale", "attn_scale", "positions"),
    [(8192.0, 0.1, [0, 8190, 8191, 16383, 100000]), (2.0, 0.25, [0, 1, 2, 3, 4, 5, 6, 7])],
    ids=["llama4_defaults", "small_floor"],
)
def test_temperature_is_llama4s_per_position_factor(
    floor_scale: float, attn_scale: float, positions: list[int]
) -> None:
    """Llama4TextAttention: log1p(floor((p + 1) / floor_scale)) · attn_scale + 1 (torch float64)."""
    torch = reference("torch")
    p = torch.tensor(positions, dtype=torch.float64)
    expected = (torch.log1p(torch.floor((p + 1.0) / floor_scale)) * attn_scale + 1.0).numpy()
    ours = temperature_factors(np.array(positions), Temperature(floor_scale, attn_scale))
    np.testing.assert_allclose(ours, expected, rtol=0, atol=TOL)
    q = rng(9).normal(size=(1, len(positions), 4))
    trace = scaled_dot_product_attention(
        q, q, q, variants=Variants(temperature=Temperature(floor_scale, attn_scale),
                                   positions=np.array(positions))
    )  # fmt: skip
    assert trace.q_tempered is not None
    np.testing.assert_allclose(trace.q_tempered, q * expected[:, None], rtol=0, atol=TOL)


@pytest.mark.parametrize(
    ("beta", "original", "positions"),
    [(0.1, 16384.0, [0, 16383, 16384, 40000, 262143]), (0.5, 4.0, list(range(13)))],
    ids=["ministral3_defaults", "small_original"],
)
def test_temperature_with_position_shift_0_is_ministral3s_query_scale(
    beta: float, original: float, positions: list[int]
) -> None:
    """Ministral3's get_llama_4_attn_scale: 1 + β·log(1 + ⌊p / original⌋) (torch float64) is
    the temperature with attn_scale β, floor_scale original and position_shift 0; position_shift
    1 (Llama 4's) differs at p = original − 1."""
    torch = reference("torch")
    p = torch.tensor(positions, dtype=torch.float64)
    expected = (1 + beta * torch.log(1 + torch.floor(p / original))).numpy()
    ours = temperature_factors(np.array(positions), Temperature(original, beta, 0))
    np.testing.assert_allclose(ours, expected, rtol=0, atol=TOL)
    q = rng(10).normal(size=(1, len(positions), 4))
    trace = scaled_dot_product_attention(
        q, q, q, variants=Variants(temperature=Temperature(original, beta, position_shift=0),
                                   positions=np.array(positions))
    )  # fmt: skip
    assert trace.q_tempered is not None
    np.testing.assert_allclose(trace.q_tempered, q * expected[:, None], rtol=0, atol=TOL)
    edge = np.array([int(original) - 1])
    assert temperature_factors(edge, Temperature(original, beta, 0))[0] == 1.0
    assert temperature_factors(edge, Temperature(original, beta, 1))[0] > 1.0


def test_temperature_is_one_before_the_first_floor() -> None:
    f = temperature_factors(np.arange(8191), Temperature())
    assert (f == 1.0).all()


@pytest.mark.parametrize(("L", "size"), [(7, 3), (8, 4), (5, 1), (4, 9)],
                         ids=["7_by_3", "8_by_4", "size_1_diagonal", "one_chunk"])  # fmt: skip
def test_chunked_mask_is_transformers_chunked_causal_mask(L: int, size: int) -> None:
    torch = reference("torch")
    hf = reference("transformers.masking_utils")
    fn = hf.chunked_causal_mask_function(size, torch.zeros(1, dtype=torch.long))
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]  # index grids, as HF evaluates
    expected = fn(torch.zeros((), dtype=torch.long), 0, i, j).expand(L, L).numpy()
    combined = masks.combine([masks.Chunked(size)], 1, L, L)
    np.testing.assert_array_equal(combined.allowed[0], expected)


def test_sigmoid_is_torchs() -> None:
    torch = reference("torch")
    z = np.concatenate([rng(10).normal(size=50) * 8, [-800.0, -40.0, 0.0, 40.0, 800.0]])
    np.testing.assert_allclose(sigmoid(z), torch.sigmoid(torch.as_tensor(z)).numpy(), rtol=0,
                               atol=1e-15)  # fmt: skip


def test_gate_multiplies_the_concat_before_w_o() -> None:
    """Qwen3-Next: o_proj(concat · sigmoid(x W_gᵀ)), written in torch float64."""
    torch = reference("torch")
    F = torch.nn.functional
    r = rng(11)
    B, L, d_model, h, d = 2, 4, 6, 2, 3
    x = r.normal(size=(B, L, d_model))
    w_q, w_k, w_v = (r.normal(size=(d_model, h * d)) for _ in range(3))
    w_g, b_g, w_o = r.normal(size=(d_model, h * d)), r.normal(size=h * d), r.normal(size=(h * d, 5))
    trace = multihead_attention(
        x, MultiheadWeights(w_q, w_k, w_v, w_o=w_o, w_g=w_g, b_g=b_g), num_heads=h
    )
    t = {n: torch.as_tensor(a) for n, a in dict(x=x, q=w_q, k=w_k, v=w_v, g=w_g, o=w_o).items()}

    def heads(y: Any) -> Any:  # (B, L, h·d) -> (B, h, L, d)
        return y.view(B, L, h, d).transpose(1, 2)

    q, k, v = heads(t["x"] @ t["q"]), heads(t["x"] @ t["k"]), heads(t["x"] @ t["v"])
    concat = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, h * d)
    gate = torch.sigmoid(t["x"] @ t["g"] + torch.as_tensor(b_g))
    expected = (concat * gate) @ t["o"]
    assert trace.gate is not None and trace.gated is not None
    np.testing.assert_allclose(trace.gate, gate.numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(trace.gated, (concat * gate).numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(trace.projected, expected.numpy(), rtol=0, atol=TOL)
