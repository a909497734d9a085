"""service.core.rope_scaling against transformers 5.23's own parameter functions
(``modeling_rope_utils``: ``_compute_yarn_parameters``, ``_compute_dynamic_ntk_parameters``,
``_compute_longrope_parameters``, ``_compute_proportional_rope_parameters``), run in float64:
the module's ``torch.float``/``torch.float32`` name float64 while they run (the harness's
swap) and ``Tensor.float`` widens to float64 (LongRoPE's exponent calls it), so the reference
is float64 throughout. Over sequence lengths that cross the original context. Then a whole
rotation through the engine against transformers' ``LlamaRotaryEmbedding`` with YaRN and its
``apply_rotary_pos_emb``, and the step text naming what was scaled."""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import numpy as np
import pytest

from harness.hf_reference import float64_torch_in
from service.core.positions import Rope, rope, rope_frequencies
from service.core.rope_scaling import (
    DynamicScaling,
    Llama3Scaling,
    LongRopeScaling,
    Scaling,
    YarnScaling,
)

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")

pytestmark = pytest.mark.torch
HEAD_DIM = 64


@contextmanager
def in_float64() -> Iterator[None]:
    with (
        float64_torch_in(rope_utils),
        mock.patch.object(torch.Tensor, "float", torch.Tensor.double),
    ):
        yield


def config(rope_parameters: dict[str, Any], max_position: int = 4096, **kw: Any) -> Any:
    c = transformers.LlamaConfig(
        hidden_size=HEAD_DIM * 2, num_attention_heads=2, head_dim=HEAD_DIM,
        max_position_embeddings=max_position, rope_parameters=rope_parameters, **kw,
    )  # fmt: skip
    return c


def theirs(fn: Any, c: Any, seq_len: int | None = None) -> tuple[np.ndarray, float]:
    with in_float64():
        inv_freq, factor = fn(c, "cpu", seq_len)
    assert inv_freq.dtype == torch.float64
    return inv_freq.numpy(), float(factor)


def close(ours: np.ndarray, want: np.ndarray) -> None:
    assert ours.shape == want.shape
    assert np.all(np.abs(ours - want) <= 1e-12 * np.abs(want)), np.abs(ours / want - 1).max()


YARNS: dict[str, dict[str, Any]] = {
    "gpt-oss": {"factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": False},
    "deepseek-v3": {"factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
                    "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "qwen": {"factor": 4.0, "original_max_position_embeddings": 32768},
    "given-attention-factor": {"factor": 8.0, "original_max_position_embeddings": 2048,
                               "attention_factor": 1.25, "beta_fast": 16.0, "beta_slow": 2.0},
}  # fmt: skip


@pytest.mark.parametrize("name", YARNS)
@pytest.mark.parametrize("base", [10_000.0, 150_000.0])
def test_yarn_is_transformers(name: str, base: float) -> None:
    p = YARNS[name]
    c = config({"rope_type": "yarn", "rope_theta": base, **p}, max_position=131072)
    want, factor = theirs(rope_utils._compute_yarn_parameters, c)
    ours = YarnScaling(
        p["factor"], p["original_max_position_embeddings"], float(p.get("beta_fast", 32)),
        float(p.get("beta_slow", 1)), p.get("mscale"), p.get("mscale_all_dim"),
        p.get("truncate", True), p.get("attention_factor"),
    )  # fmt: skip
    close(rope_frequencies(HEAD_DIM, base, ours, 10), want)
    assert ours.attention_factor == pytest.approx(factor, rel=1e-15)


@pytest.mark.parametrize("n", [1, 100, 2048, 2049, 5000, 100_000])
def test_dynamic_ntk_is_transformers_at_every_length(n: int) -> None:
    c = config({"rope_type": "dynamic", "rope_theta": 10_000.0, "factor": 2.0}, max_position=2048)
    want, factor = theirs(rope_utils._compute_dynamic_ntk_parameters, c, n)
    ours = DynamicScaling(2.0, 2048)
    close(rope_frequencies(HEAD_DIM, 10_000.0, ours, n), want)
    assert ours.attention_factor == factor == 1.0
    unchanged = np.array_equal(rope_frequencies(HEAD_DIM, 10_000.0, ours, n),
                               rope_frequencies(HEAD_DIM, 10_000.0, None, n))  # fmt: skip
    assert unchanged == (n <= 2048)


RNG = np.random.default_rng(5)
SHORT = tuple(float(f) for f in 1 + RNG.random(HEAD_DIM // 2))
LONG = tuple(float(f) for f in 1 + 10 * RNG.random(HEAD_DIM // 2))


@pytest.mark.parametrize("n", [1, 4096, 4097, 20_000])
@pytest.mark.parametrize("given", [{}, {"factor": 32.0}, {"attention_factor": 1.5}],
                         ids=["default-factor", "factor", "attention-factor"])  # fmt: skip
def test_longrope_is_transformers_on_both_sides_of_the_original_context(
    n: int, given: dict[str, float]
) -> None:
    params = {"rope_type": "longrope", "rope_theta": 10_000.0, "short_factor": list(SHORT),
              "long_factor": list(LONG), "original_max_position_embeddings": 4096, **given}  # fmt: skip
    c = config(params, max_position=131072)
    want, factor = theirs(rope_utils._compute_longrope_parameters, c, n)
    ours = LongRopeScaling(SHORT, LONG, 4096, 131072, given.get("factor"),
                           given.get("attention_factor"))  # fmt: skip
    close(rope_frequencies(HEAD_DIM, 10_000.0, ours, n), want)
    assert ours.attention_factor == pytest.approx(factor, rel=1e-15)


@pytest.mark.parametrize("proportion", [1.0, 0.5, 0.25])
def test_proportional_rope_is_gemma4s(proportion: float) -> None:
    """Frequencies base^(−2i/d_k) over the whole head for the first r/2 pairs, 0 after: the
    rotation turns pairs (i, i + d_k/2) and leaves the others, as transformers applies them."""
    c = config({"rope_type": "proportional", "rope_theta": 1_000_000.0,
                "partial_rotary_factor": proportion})  # fmt: skip
    want, _ = theirs(rope_utils._compute_proportional_rope_parameters, c)
    x = RNG.normal(size=(2, 7, HEAD_DIM))
    positions = np.arange(3, 10)
    angle = positions[:, None] * want[None, :]  # (n, d_k/2)
    cos, sin = np.cos(np.concatenate([angle, angle], -1)), np.sin(np.concatenate([angle] * 2, -1))
    half = np.concatenate([-x[..., HEAD_DIM // 2 :], x[..., : HEAD_DIM // 2]], -1)
    rotary = int(proportion * HEAD_DIM)
    got = rope(x, positions, Rope(1_000_000.0, "proportional", rotary))
    np.testing.assert_allclose(got, x * cos + half * sin, rtol=0, atol=1e-13)


def test_a_yarn_rotation_is_llama_rotary_embedding_with_its_attention_factor() -> None:
    """The engine's rotated queries against LlamaRotaryEmbedding (YaRN, float64 throughout) and
    apply_rotary_pos_emb, at positions past the original context."""
    llama = transformers.models.llama.modeling_llama
    params = {"rope_type": "yarn", "rope_theta": 500_000.0, **YARNS["gpt-oss"]}
    c = config(params, max_position=131072)
    positions = np.array([0, 1, 5000, 9000, 70_000])
    x = RNG.normal(size=(1, 2, 5, HEAD_DIM))
    with in_float64(), float64_torch_in(llama):
        emb = llama.LlamaRotaryEmbedding(c)
        t = torch.from_numpy(x)
        cos, sin = emb(t, torch.from_numpy(positions)[None])
        want, _ = llama.apply_rotary_pos_emb(t, t, cos, sin)
    yarn = YarnScaling(32.0, 4096, 32.0, 1.0, None, None, False, None)
    got = rope(x, positions, Rope(500_000.0, "half", None, yarn))
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-11 * np.abs(x).max() * 70_000)


@pytest.mark.parametrize(
    ("scaling", "n", "words"),
    [
        (YarnScaling(32.0, 4096, 32.0, 1.0, truncate=False), 10, ["of 32 pairs", "kept", "× 1.34657"]),
        (DynamicScaling(2.0, 2048), 100, ["n = 100 ≤ 2048", "unchanged"]),
        (DynamicScaling(2.0, 2048), 5000, ["n = 5000 > 2048", "base raised to"]),
        (LongRopeScaling(SHORT, LONG, 4096, 131072), 5000, ["long_factor", "× 1.19"]),
    ],
    ids=["yarn", "dynamic-short", "dynamic-long", "longrope-long"],
)  # fmt: skip
def test_the_step_says_what_was_scaled(scaling: Scaling, n: int, words: list[str]) -> None:
    text = scaling.describe(HEAD_DIM, 10_000.0, n)
    for w in words:
        assert w in text, text


def test_the_keys_take_the_queries_length() -> None:
    """Dynamic NTK depends on n: the keys are rotated with the queries' n (the largest query
    position + 1), as transformers computes one table from the position ids for both."""
    from service.core.attention import scaled_dot_product_attention
    from service.core.variants import Variants

    q, k, v = RNG.normal(size=(1, 6, 8)), RNG.normal(size=(1, 6, 8)), RNG.normal(size=(1, 6, 8))
    settings = Rope(10_000.0, "half", None, DynamicScaling(2.0, 16))
    queries, keys = np.arange(20, 26), np.arange(6)
    trace = scaled_dot_product_attention(
        q, k, v, variants=Variants(rope=settings, positions=queries, context_positions=keys)
    )
    assert trace.k_rotated is not None
    np.testing.assert_array_equal(trace.k_rotated, rope(k, keys, settings, 26))
    assert not np.allclose(trace.k_rotated, rope(k, keys, settings))  # its own n would be 6


@pytest.mark.parametrize(
    ("low", "high"), [(1.0, 4.0), (1.0, 1.0)], ids=["llama3_1", "llama4_scout_no_blend"]
)
def test_llama3_scaling_is_transformers_also_with_nothing_blended(low: float, high: float) -> None:
    """Llama 4 Scout's config has low_freq_factor = high_freq_factor = 1: no band is blended,
    wavelengths past the original context are divided by the factor, the others kept."""
    p = {"factor": 16.0, "low_freq_factor": low, "high_freq_factor": high,
         "original_max_position_embeddings": 8192}  # fmt: skip
    c = config({"rope_type": "llama3", "rope_theta": 500_000.0, **p}, max_position=131072)
    want, factor = theirs(rope_utils._compute_llama3_parameters, c)
    ours = Llama3Scaling(16.0, low, high, 8192)
    close(rope_frequencies(HEAD_DIM, 500_000.0, ours, 10), want)
    assert factor == 1.0
