"""A decode step with a cache (``past``), ``check_decode`` and ``decode_position_offset``,
against transformers 5.23's own layers and ``DynamicCache`` in float64 (the harness's float64
patches, ``harness.hf_reference``): a LLaMA layer with grouped-query attention, and a Gemma 2
sliding-window layer decoding past its window. The layer fills its cache on a prefill of P
tokens, then runs the new tokens; the service gets that cache as ``past``.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import DynamicCache, LlamaConfig  # noqa: E402
from transformers import modeling_rope_utils as rope_utils  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2  # noqa: E402
from transformers.models.gemma2.configuration_gemma2 import Gemma2Config  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

from harness.hf_reference import _widened, float64_torch_in  # noqa: E402

TOL = 1e-12
F64 = torch.float64
MIN = torch.finfo(F64).min


@contextmanager
def in_float64(modeling: Any) -> Iterator[None]:
    with float64_torch_in(modeling, rope_utils), _widened(), torch.no_grad():
        yield


def additive(allowed: Any) -> Any:
    """HF's eager mask from a boolean (L, S): 0 where allowed, the float64 minimum elsewhere."""
    return torch.where(allowed, 0.0, MIN).to(F64)[None, None]


def llama() -> tuple[Any, Any, Any]:
    """A LLaMA layer (4 query heads, 2 key/value heads, head_dim 4) in float64, its rotary
    embedding and config."""
    config = LlamaConfig(
        hidden_size=8, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
        num_hidden_layers=1, vocab_size=10, intermediate_size=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(3)
    layer = modeling_llama.LlamaAttention(config, 0).double().eval()
    with in_float64(modeling_llama):
        rotary = modeling_llama.LlamaRotaryEmbedding(config)
    return layer, rotary, config


def decode(
    layer: Any,
    rotary: Any,
    config: Any,
    modeling: Any,
    x: Any,
    P: int,
    window: int | None = None,
    positions: list[int] | None = None,
) -> tuple[Any, Any, Any, Any]:
    """The layer's prefill of x[:, :P] into a DynamicCache, then its step on the rest at
    ``positions`` (default P …): (cache k, cache v before the step, the step's output, the
    cache after)."""
    L = x.shape[1]
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= j > i - window
    at = list(range(P, L)) if positions is None else positions
    with in_float64(modeling):
        cache = DynamicCache(config=config)
        cos, sin = rotary(x, torch.arange(P)[None])
        layer(x[:, :P], (cos, sin), additive(allowed[:P, :P]), past_key_values=cache)
        held: Any = cache.layers[0]  # the layer's DynamicLayer (or its sliding one)
        past_k, past_v = held.keys.clone(), held.values.clone()
        cos, sin = rotary(x, torch.tensor(at)[None])
        kept = past_k.shape[2]  # a sliding layer's cache may keep fewer than P
        mask = allowed[P:, P - kept :]
        out, _ = layer(x[:, P:], (cos, sin), additive(mask), past_key_values=cache)
        present = held.keys, held.values
    return past_k, past_v, out, present


def body_of(layer: Any, x: Any, past_k: Any, past_v: Any, **rest: Any) -> dict[str, Any]:
    state = {k: v.tolist() for k, v in layer.state_dict().items()}
    return {"x": x[0].tolist(), "num_heads": layer.config.num_attention_heads, **state,
            "past": {"k": past_k[0].tolist(), "v": past_v[0].tolist()}, **rest}  # fmt: skip


def test_a_llama_decode_step_is_the_layers_with_its_dynamic_cache(client: TestClient) -> None:
    layer, rotary, config = llama()
    x = torch.randn(1, 7, 8, dtype=F64, generator=torch.Generator().manual_seed(5))
    past_k, past_v, out, (present_k, present_v) = decode(
        layer, rotary, config, modeling_llama, x, 5
    )
    new = x[:, 5:]
    r = client.post("/multihead", json=body_of(layer, new, past_k, past_v, rope={"base": 10000.0}))
    assert r.status_code == 200, r.text
    got = r.json()
    np.testing.assert_allclose(got["output"], out[0].numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(got["present_k"], present_k[0].numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(got["present_v"], present_v[0].numpy(), rtol=0, atol=TOL)
    assert np.shape(got["heads"][0]["weights"]) == (2, 7)  # 2 new queries, 5 + 2 keys
    steps = {s["name"]: s["formula"] for s in got["steps"]}
    assert "positions 5…5+L−1 (after the cache)" in steps["q_rotated"]
    assert steps["present_k"].startswith("[past.k | K_r]: the cache's 5 keys, then the 2 new")


def test_a_gemma2_sliding_layer_decodes_past_its_window(client: TestClient) -> None:
    """Gemma 2's sliding layer (window 3) after 6 tokens: the window mask counts the new token
    as row P of the sequence; its softcap and query_pre_attn_scalar apply as in a prefill."""
    config = Gemma2Config(
        hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
        num_hidden_layers=2, vocab_size=10, intermediate_size=8, sliding_window=3,
        attn_logit_softcapping=5.0, query_pre_attn_scalar=6,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(4)
    layer = modeling_gemma2.Gemma2Attention(config, 0).double().eval()
    with in_float64(modeling_gemma2):
        rotary = modeling_gemma2.Gemma2RotaryEmbedding(config)
    x = torch.randn(1, 7, 8, dtype=F64, generator=torch.Generator().manual_seed(6))
    past_k, past_v, out, (present_k, _) = decode(
        layer, rotary, config, modeling_gemma2, x, 6, window=3
    )
    kept = past_k.shape[2]
    body = body_of(layer, x[:, 6:], past_k, past_v, rope={"base": 10000.0}, softcap=5.0,
                   scale=6**-0.5, positions=[6],
                   mask={"type": "window", "left": 2, "right": 0})  # fmt: skip
    r = client.post("/multihead", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    np.testing.assert_allclose(got["output"], out[0].numpy(), rtol=0, atol=TOL)
    # the service keeps every key it was given; the layer's cache keeps its last ones
    np.testing.assert_allclose(
        np.array(got["present_k"])[:, -present_k.shape[2] :], present_k[0].numpy(), rtol=0, atol=TOL
    )
    allowed = np.array(got["mask"])  # (1, kept + 1): the window counts the new token as row kept
    assert allowed.tolist() == [[j > kept - 3 for j in range(kept + 1)]]


@pytest.mark.parametrize(("label", "at"), [("from_zero", [0, 1]), ("one_ahead", [6, 7])],
                         ids=["from_zero", "one_ahead"])  # fmt: skip
def test_a_decode_step_rotated_at_wrong_positions_is_named_decode_position_offset(
    client: TestClient, label: str, at: list[int]
) -> None:
    """The public decoding bugs: every new token at position 0 …, or the offset one ahead."""
    layer, rotary, config = llama()
    x = torch.randn(1, 7, 8, dtype=F64, generator=torch.Generator().manual_seed(5))
    past_k, past_v, wrong, _ = decode(layer, rotary, config, modeling_llama, x, 5, positions=at)
    body = body_of(layer, x[:, 5:], past_k, past_v, rope={"base": 10000.0}, include=["output"],
                   expected={"output": wrong[0].tolist()})  # fmt: skip
    r = client.post("/multihead", json=body)
    assert r.status_code == 200, r.text
    found = r.json()["comparison"][0]["diagnosis"]
    assert found is not None and found["mistakes"] == ["decode_position_offset"], found
    assert f"from position {at[0]} instead of 5" in found["explanation"]


def test_check_decode_is_zero_for_a_causal_layer_and_not_for_a_bidirectional_one(
    client: TestClient,
) -> None:
    layer, _, _ = llama()
    x = np.random.default_rng(7).normal(size=(6, 8))
    state = {k: v.tolist() for k, v in layer.state_dict().items()}
    body = {"x": x.tolist(), "num_heads": 4, **state, "rope": {"base": 10000.0},
            "check_decode": True, "include": ["output"]}  # fmt: skip
    causal = client.post("/multihead", json={**body, "mask": {"type": "causal"}}).json()
    assert causal["decode_check"]["steps"] == 6
    assert causal["decode_check"]["max_abs_diff"] < 1e-14
    open_ = client.post("/multihead", json=body).json()  # no mask: each token sees the future
    assert open_["decode_check"]["max_abs_diff"] > 0.1


def test_check_decode_on_attention_with_a_window_and_alibi(client: TestClient) -> None:
    """Direct q, k, v, a window and ALiBi's bias: each decode step rebuilds the bias over the
    keys so far and counts its query as row t of the sequence."""
    r = np.random.default_rng(8)
    q, k, v = r.normal(size=(5, 4)), r.normal(size=(5, 4)), r.normal(size=(5, 3))
    body = {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "alibi": True, "check_decode": True,
            "mask": [{"type": "causal"}, {"type": "window", "left": 1, "right": 0}]}  # fmt: skip
    got = client.post("/attention", json=body).json()
    assert got["decode_check"] == {"max_abs_diff": pytest.approx(0.0, abs=1e-14), "steps": 5}


@pytest.mark.parametrize(
    ("extra", "field", "words"),
    [
        ({"context": [[0.0] * 8] * 2}, "context", "self-attention"),
        ({"past": {"k": [[[0.0] * 4] * 3] * 3, "v": [[[0.0] * 4] * 3] * 3}}, "past.k", "3 heads"),
        ({"past": {"k": [[[0.0] * 5] * 3] * 2, "v": [[[0.0] * 4] * 3] * 2}}, "past.k", "5 features"),
        ({"check_decode": True}, "check_decode", "leave out past"),
    ],
    ids=["context", "heads", "width", "check_decode_with_past"],
)  # fmt: skip
def test_each_rule_of_past_is_a_422_naming_its_field(
    client: TestClient, extra: dict[str, Any], field: str, words: str
) -> None:
    layer, _, _ = llama()
    state = {k: v.tolist() for k, v in layer.state_dict().items()}
    past = {"k": [[[0.0] * 4] * 3] * 2, "v": [[[0.0] * 4] * 3] * 2}
    body = {"x": [[0.0] * 8], "num_heads": 4, **state, "past": past, **extra}
    r = client.post("/multihead", json=body)
    assert r.status_code == 422, r.text
    error = r.json()["errors"][0]
    assert error["field"] == field and words in error["message"], error


def test_self_attention_at_given_positions_rotates_keys_at_the_queries_positions(
    client: TestClient,
) -> None:
    """Self-attention (x, no context, no cache) with positions [5, 6, 7]: a token has one
    position, so its key turns at it too, as LlamaAttention with position_ids [5, 6, 7] turns
    both q and k (API.md, "Self-attention positions"). Before, the keys turned at 0, 1, 2."""
    layer, rotary, _ = llama()
    x = torch.randn(1, 3, 8, dtype=F64, generator=torch.Generator().manual_seed(9))
    at = torch.tensor([[5, 6, 7]])
    i, j = torch.arange(3)[:, None], torch.arange(3)[None, :]
    with in_float64(modeling_llama):
        cos, sin = rotary(x, at)
        out, _ = layer(x, (cos, sin), additive(j <= i))
        q = layer.q_proj(x).view(1, 3, 4, 4).transpose(1, 2)  # (1, h, L, d)
        k = layer.k_proj(x).view(1, 3, 2, 4).transpose(1, 2)  # (1, h_kv, L, d)
        q_r, k_r = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    state = {k: v.tolist() for k, v in layer.state_dict().items()}
    body = {"x": x[0].tolist(), "num_heads": 4, **state, "rope": {"base": 10000.0},
            "positions": [5, 6, 7], "mask": {"type": "causal"}}  # fmt: skip
    r = client.post("/multihead", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    np.testing.assert_allclose(got["output"], out[0].numpy(), rtol=0, atol=TOL)
    for h in range(4):  # query head h reads key/value head h // 2
        head = got["heads"][h]
        np.testing.assert_allclose(head["q_rotated"], q_r[0, h].numpy(), rtol=0, atol=TOL)
        np.testing.assert_allclose(head["k_rotated"], k_r[0, h // 2].numpy(), rtol=0, atol=TOL)
    steps = {s["name"]: s["formula"] for s in got["steps"]}
    assert "context_positions defaults to positions" in steps["k_rotated"]


def test_keys_of_other_tokens_keep_positions_0_to_s_minus_1(client: TestClient) -> None:
    """Direct q, k, v are other tokens than the queries: their keys turn at 0 … S−1 unless
    context_positions says otherwise, as a NumPy rotate_half RoPE written here computes."""
    r = np.random.default_rng(11)
    q, k, v = r.normal(size=(3, 4)), r.normal(size=(3, 4)), r.normal(size=(3, 2))

    def turned(a: Any, at: list[int]) -> Any:
        theta = 10000.0 ** (-np.arange(2) / 2)  # (d/2,)
        angle = np.asarray(at)[:, None] * np.concatenate([theta, theta])  # (n, d)
        half = np.concatenate([-a[:, 2:], a[:, :2]], axis=1)
        return a * np.cos(angle) + half * np.sin(angle)

    body = {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "rope": True,
            "positions": [5, 6, 7]}  # fmt: skip
    got = client.post("/attention", json=body).json()
    np.testing.assert_allclose(got["q_rotated"], turned(q, [5, 6, 7]), rtol=0, atol=1e-12)
    np.testing.assert_allclose(got["k_rotated"], turned(k, [0, 1, 2]), rtol=0, atol=1e-12)
    steps = {s["name"]: s["formula"] for s in got["steps"]}
    assert "defaults to 0…S−1, not to positions" in steps["k_rotated"]


def test_one_new_token_rotated_at_0_with_a_cache_is_decode_position_offset(
    client: TestClient,
) -> None:
    """A decode step whose one new token forgot the cache: LlamaAttention run on it with
    position_ids [0] after a prefill of 5 (the common bug). RoPE at 0 turns nothing, so
    rope_missing reproduces the numbers as well; with past given, the offset is the likelier
    one and is named first, rope_missing listed as an alternative (API.md, "Compare, third
    edition")."""
    layer, rotary, config = llama()
    x = torch.randn(1, 6, 8, dtype=F64, generator=torch.Generator().manual_seed(12))
    past_k, past_v, wrong, _ = decode(layer, rotary, config, modeling_llama, x, 5, positions=[0])
    body = body_of(layer, x[:, 5:], past_k, past_v, rope={"base": 10000.0}, include=["output"],
                   expected={"output": wrong[0].tolist()})  # fmt: skip
    r = client.post("/multihead", json=body)
    assert r.status_code == 200, r.text
    (row,) = r.json()["comparison"]
    found = row["diagnosis"]
    assert found is not None and found["mistakes"] == ["decode_position_offset"], found
    assert "the new token was rotated from position 0 instead of 5" in found["explanation"]
    assert "after the cache's 5 tokens" in found["explanation"]
    assert ["rope_missing"] in found["alternatives"]
    assert "rope_missing" in row["message"]
    assert row["diagnosis_complete"] is True


def _alibi_decode(**positions: Any) -> dict[str, Any]:
    """/attention's last query of four tokens as a decode step after a cache of three, ALiBi
    on (direct q, k, v; the cache's keys as they are: ALiBi turns nothing)."""
    rng = np.random.default_rng(11)
    q, k, v = (rng.normal(size=(4, 2)) for _ in range(3))
    return {"q": q[3:].tolist(), "k": k[3:].tolist(), "v": v[3:].tolist(),
            "past": {"k": k[:3].tolist(), "v": v[:3].tolist()},
            "alibi": {"slopes": [0.5]}, **positions}  # fmt: skip


def test_a_decode_step_with_a_position_bias_measures_to_the_keys_where_the_prefill_did(
    client: TestClient,
) -> None:
    """Issue 39's review of the page's positions: the bias of a decode step measured to keys at
    0 … P + L − 1 while RoPE turned the new key at the queries' position. Now the keys are the
    cache's then the new tokens' at the queries' positions: the step's weights equal the last
    row of the same four tokens computed at once, at the same positions (NumPy, written here:
    ALiBi's bias slope · (j − i) for key j ≤ query i, the paper's form)."""
    rng = np.random.default_rng(11)
    q, k, _ = (rng.normal(size=(4, 2)) for _ in range(3))
    at = np.array([7, 8, 9, 10])
    for body, query in (
        (_alibi_decode(), np.arange(4)),  # positions 3 after 0, 1, 2
        (_alibi_decode(positions=[10], context_positions=at.tolist()), at),
    ):
        got = client.post("/attention", json=body).json()
        scores = q[3] @ k.T / np.sqrt(2) + 0.5 * (query - query[3])  # (4,)
        expected = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
        np.testing.assert_allclose(got["weights"][0], expected, rtol=1e-12, atol=1e-15)
        assert got["key_positions"] == query.tolist()


def test_new_tokens_that_do_not_follow_the_cache_need_its_positions_for_a_bias(
    client: TestClient,
) -> None:
    r = client.post("/attention", json=_alibi_decode(positions=[10]))
    assert r.status_code == 422
    error = r.json()["errors"][0]
    assert error["field"] == "positions" and "context_positions" in error["message"]
    r = client.post(
        "/attention", json=_alibi_decode(positions=[10], context_positions=[7, 8, 9, 3])
    )
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "context_positions"


def wrong_step(client: TestClient, at: list[int], scaling: float | None = None) -> dict[str, Any]:
    """The LLaMA layer's decode step of 2 new tokens after a prefill of 5, its new tokens
    rotated at ``at`` (``scaling``: the layer's own scale set instead, as a port that forgot
    it): the comparison's one entry, for the output."""
    layer, rotary, config = llama()
    if scaling is not None:
        layer.scaling = scaling
    x = torch.randn(1, 7, 8, dtype=F64, generator=torch.Generator().manual_seed(21))
    past_k, past_v, wrong, _ = decode(layer, rotary, config, modeling_llama, x, 5, positions=at)
    body = body_of(layer, x[:, 5:], past_k, past_v, rope={"base": 10000.0}, include=["output"],
                   mask={"type": "causal"}, expected={"output": wrong[0].tolist()})  # fmt: skip
    r = client.post("/multihead", json=body)
    assert r.status_code == 200, r.text
    (row,) = r.json()["comparison"]
    assert row["diagnosis_complete"] is True, row
    return row  # type: ignore[no-any-return]


def test_a_decode_step_counting_left_padding_is_offset_by_the_padding(client: TestClient) -> None:
    """A batched generate loop whose positions count the 3 left-padding tokens of a short
    prompt (cache_position used as position_ids, where transformers derives them from the
    attention mask's cumsum for padded rows): the new tokens at 8, 9 where they sit at 5, 6.
    The offset, 3, is none of those listed (0, ±1): it is fitted from the numbers."""
    row = wrong_step(client, [8, 9])
    found = row["diagnosis"]
    assert found is not None and found["mistakes"] == ["decode_position_offset"], row
    assert "the new tokens were rotated from position 8 instead of 5" in found["explanation"]
    assert "3 too high (left padding counted" in found["explanation"]


def test_a_decode_step_counting_the_cache_twice_says_so(client: TestClient) -> None:
    """A loop that adds the cache length to positions that already count it: 10, 11 for 5, 6."""
    found = wrong_step(client, [10, 11])["diagnosis"]
    assert found is not None and found["mistakes"] == ["decode_position_offset"], found
    assert "from position 10 instead of 5" in found["explanation"]
    assert "the cache's length counted twice" in found["explanation"]


def test_a_window_of_new_tokens_all_at_the_cache_length_is_decode_position_offset(
    client: TestClient,
) -> None:
    """Speculative decoding or chunked prefill that gives every token of its window the cache
    length as its position (position_ids = past_length, broadcast): 5, 5 for 5, 6."""
    found = wrong_step(client, [5, 5])["diagnosis"]
    assert found is not None and found["mistakes"] == ["decode_position_offset"], found
    assert (
        "the 2 new tokens were all rotated at position 5 where they sit at 5 … 6"
        in found["explanation"]
    )


def test_an_unscaled_port_counting_left_padding_is_a_pair(client: TestClient) -> None:
    """The padded loop's positions in a port that also forgot 1/√d_k (its scaling 1): both."""
    found = wrong_step(client, [8, 9], scaling=1.0)["diagnosis"]
    assert found is not None, found
    assert found["mistakes"] == ["scale_missing", "decode_position_offset"], found
    assert "from position 8 instead of 5" in found["explanation"]
