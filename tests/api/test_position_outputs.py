"""The numbers the position variants used, returned as outputs (query_positions, key_positions,
rope_frequencies, rope_gain, alibi_slopes), against independent references: transformers 5.23's
``ROPE_INIT_FUNCTIONS`` run in float64 for each scaling (at the sequence length n = the largest
query position + 1), the ALiBi paper's ``get_slopes`` written out here, and a NumPy rotation
written here, which must turn the rows at the returned positions by the returned θ_i and gain
into the service's own q_rotated and k_rotated."""

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import numpy as np
import pytest
from fastapi.testclient import TestClient

from harness.hf_reference import float64_torch_in

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")

pytestmark = pytest.mark.torch
D_K = 16
RNG = np.random.default_rng(17)
Q, K, V = RNG.normal(size=(3, D_K)), RNG.normal(size=(4, D_K)), RNG.normal(size=(4, 2))
DIRECT = {"q": Q.tolist(), "k": K.tolist(), "v": V.tolist()}
SHORT = [1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
LONG = [1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 7.5]


@contextmanager
def in_float64() -> Iterator[None]:
    with (
        float64_torch_in(rope_utils),
        mock.patch.object(torch.Tensor, "float", torch.Tensor.double),
    ):
        yield


def hf(rope_type: str, params: dict[str, Any], n: int, max_position: int) -> tuple[Any, float]:
    """transformers' θ_i and attention factor for a head of D_K features, in float64."""
    c = transformers.LlamaConfig(
        hidden_size=2 * D_K, num_attention_heads=2, head_dim=D_K,
        max_position_embeddings=max_position, rope_parameters={"rope_type": rope_type, **params},
    )  # fmt: skip
    with in_float64():
        inv_freq, factor = rope_utils.ROPE_INIT_FUNCTIONS[rope_type](c, "cpu", n)
    assert inv_freq.dtype == torch.float64
    return inv_freq.numpy(), float(factor)


# (id, the request's rope, transformers' rope_type and parameters, max_position_embeddings,
# the queries' positions); each past or within its original context
CASES: list[tuple[str, dict[str, Any], str, dict[str, Any], int, list[int]]] = [
    ("llama3", {"base": 10.0, "scaling": {"type": "llama3", "factor": 8, "original_max_position": 32}},
     "llama3", {"rope_theta": 10.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32}, 4096, [100, 101, 102]),
    ("yarn_gpt_oss", {"base": 150000.0, "scaling": {"type": "yarn", "factor": 32, "original_max_position": 16, "truncate": False}},
     "yarn", {"rope_theta": 150000.0, "factor": 32.0, "original_max_position_embeddings": 16,
              "truncate": False}, 4096, [20, 24, 31]),
    ("yarn_deepseek", {"base": 10.0, "scaling": {"type": "yarn", "factor": 4, "original_max_position": 8, "mscale": 0.707, "mscale_all_dim": 1}},
     "yarn", {"rope_theta": 10.0, "factor": 4.0, "original_max_position_embeddings": 8,
              "mscale": 0.707, "mscale_all_dim": 1.0}, 4096, [30, 31, 40]),
    ("dynamic_past", {"scaling": {"type": "dynamic", "factor": 2, "original_max_position": 8}},
     "dynamic", {"rope_theta": 10000.0, "factor": 2.0}, 8, [9, 12, 15]),
    ("dynamic_within", {"scaling": {"type": "dynamic", "factor": 2, "original_max_position": 8}},
     "dynamic", {"rope_theta": 10000.0, "factor": 2.0}, 8, [0, 1, 2]),
    ("longrope_short", {"base": 500.0, "scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position": 8, "max_position": 32}},
     "longrope", {"rope_theta": 500.0, "short_factor": SHORT, "long_factor": LONG,
                  "original_max_position_embeddings": 8}, 32, [0, 1, 5]),
    ("longrope_long", {"base": 500.0, "scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position": 8, "factor": 3}},
     "longrope", {"rope_theta": 500.0, "short_factor": SHORT, "long_factor": LONG,
                  "original_max_position_embeddings": 8, "factor": 3.0}, 32, [6, 9, 10]),
    ("proportional", {"base": 100.0, "style": "proportional", "rotary_dim": 8},
     "proportional", {"rope_theta": 100.0, "partial_rotary_factor": 0.5}, 4096, [3, 7, 11]),
]  # fmt: skip


def rotate_half(x: np.ndarray, positions: np.ndarray, theta: np.ndarray, gain: float) -> Any:
    """RoPE written out: pair (i, i + d/2) of the row at position p turned by p·θ_i, cos and sin
    times the gain (Su et al. 2021; transformers' apply_rotary_pos_emb)."""
    angle = positions[:, None] * theta[None, :]  # (n, d/2)
    cos = np.cos(np.concatenate([angle, angle], -1)) * gain
    sin = np.sin(np.concatenate([angle, angle], -1)) * gain
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


@pytest.mark.parametrize(
    ("rope", "rope_type", "params", "max_position", "positions"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_rope_frequencies_and_gain_are_transformers_and_turn_the_rows(
    client: TestClient,
    rope: dict[str, Any],
    rope_type: str,
    params: dict[str, Any],
    max_position: int,
    positions: list[int],
) -> None:
    keys = [0, 4, 15, 20]
    body = {**DIRECT, "rope": rope, "positions": positions, "context_positions": keys}
    answer = client.post("/attention", json=body).json()
    n = max(positions) + 1
    want, factor = hf(rope_type, params, n, max_position)
    theta = np.asarray(answer["rope_frequencies"])
    assert theta.shape == want.shape
    np.testing.assert_allclose(theta, want, rtol=1e-12, atol=0)
    assert answer["rope_gain"] == pytest.approx(factor, rel=1e-15)
    assert answer["query_positions"] == positions and answer["key_positions"] == keys
    gain = answer["rope_gain"]
    np.testing.assert_allclose(answer["q_rotated"], rotate_half(Q, np.array(positions), theta, gain), rtol=1e-12, atol=1e-12)  # fmt: skip
    np.testing.assert_allclose(answer["k_rotated"], rotate_half(K, np.array(keys), theta, gain), rtol=1e-12, atol=1e-12)  # fmt: skip


def test_linear_scaling_keeps_theta_and_the_angles_take_the_positions_divided(
    client: TestClient,
) -> None:
    """transformers divides θ by the factor; the service divides the positions (the same
    angles): rope_frequencies are the unscaled θ_i, which times p/factor give its angles."""
    body = {
        **DIRECT,
        "rope": {"scaling": {"type": "linear", "factor": 2}},
        "positions": [40, 41, 42],
    }
    answer = client.post("/attention", json=body).json()
    want, factor = hf("linear", {"rope_theta": 10000.0, "factor": 2.0}, 43, 4096)
    theta = np.asarray(answer["rope_frequencies"])
    np.testing.assert_allclose(theta / 2, want, rtol=1e-12, atol=0)
    assert answer["rope_gain"] == factor == 1.0
    p = np.array(answer["query_positions"]) / 2  # the angles take p / factor
    np.testing.assert_allclose(answer["q_rotated"], rotate_half(Q, p, theta, 1.0), rtol=1e-12, atol=1e-12)  # fmt: skip


def test_plain_rope_is_base_to_the_minus_2i_over_r_on_rotary_dim(client: TestClient) -> None:
    body = {**DIRECT, "rope": {"base": 500, "rotary_dim": 6}}
    answer = client.post("/attention", json=body).json()
    assert answer["rope_frequencies"] == pytest.approx(
        [500.0 ** (-2 * i / 6) for i in range(3)], rel=1e-15
    )
    assert answer["rope_gain"] == 1.0
    assert answer["query_positions"] == [0, 1, 2] and answer["key_positions"] == [0, 1, 2, 3]


def paper_slopes(n: int) -> list[float]:
    """The ALiBi paper's get_slopes (Press et al. 2022, github.com/ofirpress/attention_with_linear_biases)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", [1, 4, 6, 12])
def test_alibi_slopes_are_the_papers(client: TestClient, heads: int) -> None:
    body = {"seed": 1, "seq_len": 3, "d_model": 2 * heads, "num_heads": heads, "alibi": True}
    answer = client.post("/multihead", json=body).json()
    assert answer["alibi_slopes"] == pytest.approx(paper_slopes(heads), rel=1e-15)
    assert answer["query_positions"] == answer["key_positions"] == [0, 1, 2]
    assert "rope_frequencies" not in answer


def test_given_slopes_are_returned_and_t5_has_none(client: TestClient) -> None:
    given = client.post("/attention", json={**DIRECT, "alibi": {"slopes": [0.3]}}).json()
    assert given["alibi_slopes"] == [0.3]
    t5 = client.post("/attention", json={**DIRECT, "relative_bias": {"table": [0.5, -0.25, 1.0, 0.125]}}).json()  # fmt: skip
    assert "alibi_slopes" not in t5 and t5["key_positions"] == [0, 1, 2, 3]
    plain = client.post("/attention", json={**DIRECT, "softcap": 2.0}).json()
    assert not {"query_positions", "key_positions", "rope_gain", "alibi_slopes"} & set(plain)


X = RNG.normal(size=(3, 4)).tolist()
W = {name: RNG.normal(size=(4, 4)).tolist() for name in ("w_q", "w_k", "w_v")}


@pytest.mark.parametrize(
    ("extra", "queries", "keys"),
    [
        ({}, [0, 1, 2], [0, 1, 2]),
        ({"positions": [40, 41, 42]}, [40, 41, 42], [40, 41, 42]),  # self-attention: the queries'
        ({"positions": [40, 41, 42], "context": X[:2]}, [40, 41, 42], [0, 1]),  # other tokens
        ({"context_positions": [5, 9, 11]}, [0, 1, 2], [5, 9, 11]),
    ],
    ids=["default", "self_attention", "cross_attention", "given"],
)
def test_the_keys_positions_are_the_ones_rope_turned_them_by(
    client: TestClient, extra: dict[str, Any], queries: list[int], keys: list[int]
) -> None:
    body = {"x": X, **W, "rope": True, **extra}
    answer = client.post("/attention", json=body).json()
    assert answer["query_positions"] == queries and answer["key_positions"] == keys
    source = np.asarray(extra.get("context", X))
    k = source @ np.asarray(W["w_k"])
    theta = np.asarray(answer["rope_frequencies"])
    np.testing.assert_allclose(answer["k_rotated"], rotate_half(k, np.array(keys), theta, 1.0), rtol=1e-12, atol=1e-12)  # fmt: skip


def test_a_decode_step_puts_the_new_tokens_after_the_cache(client: TestClient) -> None:
    past = {"k": RNG.normal(size=(3, D_K)).tolist(), "v": RNG.normal(size=(3, 2)).tolist()}
    body = {
        "q": Q[:1].tolist(),
        "k": K[:1].tolist(),
        "v": V[:1].tolist(),
        "rope": True,
        "past": past,
    }
    answer = client.post("/attention", json=body).json()
    assert answer["query_positions"] == [3] and answer["key_positions"] == [0, 1, 2, 3]
    theta = np.asarray(answer["rope_frequencies"])
    np.testing.assert_allclose(answer["k_rotated"], rotate_half(K[:1], np.array([3]), theta, 1.0), rtol=1e-12, atol=1e-12)  # fmt: skip
