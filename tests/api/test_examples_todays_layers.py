"""The worked examples of today's layers (service/wire/examples.py: Swagger's) against
transformers 5.23, in float64 (``Tensor.float`` widened to ``double`` and the modules' float32
softmax swapped by ``harness.hf_reference.float64_torch_in``), each posted without its
``decimals``:

- Qwen3-Next: its ``Qwen3NextAttention`` loaded with the example's weights (gate rows in q_proj);
- Llama 4: ``apply_rotary_emb``, ``Llama4TextL2Norm`` and ``chunked_causal_mask_function``;
- Gemma 4: ``Gemma4RMSNorm`` (with and without scale), ``apply_rotary_pos_emb`` with the cos/sin
  of ``_compute_proportional_rope_parameters``;
- DeepSeek: its ``DeepseekV3Attention`` loaded with the example's latents;
- YaRN: the cos/sin of ``_compute_yarn_parameters`` (gpt-oss's settings) and ``rotate_half``.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.wire import examples as ex
from tests.api.test_examples_reference import causal_additive, full_precision

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import Qwen3NextConfig  # noqa: E402
from transformers import modeling_rope_utils as rope_utils  # noqa: E402
from transformers.masking_utils import chunked_causal_mask_function  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3  # noqa: E402
from transformers.models.gemma4 import modeling_gemma4  # noqa: E402
from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig  # noqa: E402
from transformers.models.llama4 import modeling_llama4  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next  # noqa: E402

from harness.hf_reference import float64_torch_in  # noqa: E402

TOL = 1e-12
F64 = torch.float64


@contextmanager
def in_float64(*modules: Any) -> Iterator[None]:
    with (
        float64_torch_in(rope_utils, *modules),
        mock.patch.object(torch.Tensor, "float", torch.Tensor.double),
        torch.no_grad(),
    ):
        yield


def t(a: Any) -> Any:
    return torch.tensor(a, dtype=F64)


def cos_sin(inv_freq: Any, positions: list[int], gain: float = 1.0) -> tuple[Any, Any]:
    """(1, L, 2·len(inv_freq)) as the rotary embeddings return them: [p·θ, p·θ]."""
    freqs = torch.tensor(positions, dtype=F64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * gain)[None], (emb.sin() * gain)[None]


def qwen3_next_layer(body: dict[str, Any]) -> Any:
    """Qwen3NextAttention (a full-attention layer) holding the example's weights."""
    config = Qwen3NextConfig(
        hidden_size=4, num_attention_heads=1, num_key_value_heads=1, head_dim=4,
        rms_norm_eps=1e-6, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": body["rope"]["base"]},
    )  # fmt: skip
    config._attn_implementation = "eager"
    layer = modeling_qwen3_next.Qwen3NextAttention(config, layer_idx=3).double().eval()
    names = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
             "q_norm.weight", "k_norm.weight")  # fmt: skip
    layer.load_state_dict({n: t(body[n]) for n in names}, strict=True)
    return layer


def run_layer(layer: Any, modeling: Any, body: dict[str, Any]) -> Any:
    """The layer's forward on the example's 4 tokens, causal, RoPE over 2 features."""
    inv = 1.0 / body["rope"]["base"] ** (torch.arange(0, 2, 2, dtype=F64) / 2)
    with in_float64(modeling):
        out, _ = layer(t(body["x"])[None], cos_sin(inv, list(range(4))),
                       t(causal_additive(4))[None, None])  # fmt: skip
    assert out.dtype == F64
    return out[0].numpy()


def test_qwen3_next_example_is_qwen3_next_attention(client: TestClient) -> None:
    body = ex.QWEN3_NEXT_GATED
    ours = full_precision(client, "/multihead", body, include=["gate", "gated", "output"])
    layer = qwen3_next_layer(body)
    x = t(body["x"])[None]
    inv = 1.0 / body["rope"]["base"] ** (torch.arange(0, 2, 2, dtype=F64) / 2)  # rotary_dim 2
    with in_float64(modeling_qwen3_next):
        out, _ = layer(x, cos_sin(inv, list(range(4))), t(causal_additive(4))[None, None])
        gate = torch.sigmoid(layer.q_proj(x).view(1, 4, 1, 8)[..., 4:].reshape(1, 4, 4))
    assert out.dtype == F64
    np.testing.assert_allclose(ours["output"], out[0].numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(ours["gate"], gate[0].numpy(), rtol=0, atol=TOL)


def test_llama4_example_rotates_then_normalises_within_chunks(client: TestClient) -> None:
    body = ex.LLAMA4_CHUNKED
    ours = full_precision(client, "/multihead", body, include=["heads", "mask", "output"])
    x = t(body["x"])[None]  # (1, L, 4)
    q, k, v = (x @ t(body[f"{n}_proj.weight"]).T for n in "qkv")  # (1, L, 4)
    inv = 1.0 / body["rope"]["base"] ** (torch.arange(0, 4, 2, dtype=F64) / 4)
    freqs_cis = torch.polar(torch.ones(4, 2, dtype=F64), torch.arange(4, dtype=F64)[:, None] * inv)
    with in_float64(modeling_llama4):
        q_r, k_r = modeling_llama4.apply_rotary_emb(q[:, :, None], k[:, :, None], freqs_cis[None])
        norm = modeling_llama4.Llama4TextL2Norm(1e-5)
        q_n, k_n = norm(q_r)[:, :, 0], norm(k_r)[:, :, 0]  # (1, L, 4)
    i, j = torch.arange(4)[:, None], torch.arange(4)[None, :]
    allowed = chunked_causal_mask_function(2, torch.zeros(1, dtype=torch.long))(
        torch.zeros((), dtype=torch.long), 0, i, j
    ).expand(4, 4)
    s = (q_n @ k_n.transpose(-1, -2) * 0.5).masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(s, dim=-1)
    head = ours["heads"][0]
    np.testing.assert_array_equal(ours["mask"], allowed.numpy())
    np.testing.assert_allclose(head["q_rotated"], q_r[0, :, 0].numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(head["q_normed"], q_n[0].numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(head["weights"], weights[0].numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(ours["output"], (weights @ v)[0].numpy(), rtol=0, atol=TOL)


def gemma4_parts(body: dict[str, Any]) -> tuple[Any, Any, Any, Any, Any]:
    """Gemma 4's full layer on the example, by its own functions: (scores (1, L, L) with the
    causal mask, V = K's projection, V_n, Q_r, K_r)."""
    x = t(body["x"])[None]
    k_raw = x @ t(body["k_proj.weight"]).T  # (1, L, 4): V is this (k_eq_v)
    q = x @ t(body["q_proj.weight"]).T
    fields: dict[str, Any] = {  # global_head_dim is popped from Gemma4TextConfig's kwargs
        "hidden_size": 4,
        "head_dim": 4,
        "global_head_dim": 4,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "rope_parameters": {
            "full_attention": {
                "rope_type": "proportional",
                "rope_theta": 1e6,
                "partial_rotary_factor": 0.5,
            }
        },
    }
    config = Gemma4TextConfig(**fields)  # fmt: skip
    with in_float64(modeling_gemma4):
        inv, _ = rope_utils._compute_proportional_rope_parameters(
            config, torch.device("cpu"), layer_type="full_attention", head_dim_key="global_head_dim"
        )
        cos, sin = cos_sin(inv.to(F64), list(range(4)))
        q_norm, k_norm = (
            modeling_gemma4.Gemma4RMSNorm(4, 1e-6),
            modeling_gemma4.Gemma4RMSNorm(4, 1e-6),
        )
        q_norm.weight.copy_(t(body["q_norm.weight"]))
        k_norm.weight.copy_(t(body["k_norm.weight"]))
        v_norm = modeling_gemma4.Gemma4RMSNorm(4, 1e-6, with_scale=False)
        q_r = modeling_gemma4.apply_rotary_pos_emb(q_norm(q)[:, :, None], cos, sin, unsqueeze_dim=2)
        k_r = modeling_gemma4.apply_rotary_pos_emb(
            k_norm(k_raw)[:, :, None], cos, sin, unsqueeze_dim=2
        )
        v_n = v_norm(k_raw)
    s = q_r[:, :, 0] @ k_r[:, :, 0].transpose(-1, -2) + t(causal_additive(4))  # scale 1
    return s, k_raw, v_n, q_r, k_r


def test_gemma4_example_takes_v_from_k_and_rotates_proportionally(client: TestClient) -> None:
    body = ex.GEMMA4_GLOBAL
    ours = full_precision(client, "/multihead", body, include=["heads", "output"])
    s, k_raw, v_n, q_r, _ = gemma4_parts(body)
    weights = torch.softmax(s, dim=-1)
    head = ours["heads"][0]
    np.testing.assert_array_equal(head["v"], head["k"])
    np.testing.assert_allclose(head["v"], k_raw[0].numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(head["v_normed"], v_n[0].numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(head["q_rotated"], q_r[0, :, 0].numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(ours["output"], (weights @ v_n)[0].numpy(), rtol=0, atol=TOL)


def test_yarn_example_is_transformers_yarn_at_positions_past_the_context(
    client: TestClient,
) -> None:
    body = ex.YARN_PAST_THE_CONTEXT
    ours = full_precision(client, "/attention", body, include=["q_rotated", "weights", "steps"])
    sc = body["rope"]["scaling"]
    config = transformers.GptOssConfig(
        head_dim=8, num_attention_heads=1, num_key_value_heads=1, hidden_size=8,
        max_position_embeddings=sc["factor"] * sc["original_max_position"],
        rope_parameters={"rope_type": "yarn", "rope_theta": body["rope"]["base"],
                         "factor": sc["factor"], "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False,
                         "original_max_position_embeddings": sc["original_max_position"]},
    )  # fmt: skip
    with in_float64():
        inv, gain = rope_utils._compute_yarn_parameters(config, torch.device("cpu"))
    cos, sin = cos_sin(inv.to(F64), body["positions"], gain)

    def rotated(a: Any) -> Any:
        halves = torch.cat((-a[..., 4:], a[..., :4]), dim=-1)  # rotate_half
        return a * cos[0] + halves * sin[0]

    q_r, k_r = rotated(t(body["q"])), rotated(t(body["k"]))
    s = q_r @ k_r.T / 8**0.5 + t(causal_additive(4))
    np.testing.assert_allclose(ours["q_rotated"], q_r.numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(ours["weights"], torch.softmax(s, -1).numpy(), rtol=0, atol=TOL)
    q_step = next(st["formula"] for st in ours["steps"] if st["name"] == "q_rotated")
    assert "yarn scaling: of 4 pairs, 2 kept" in q_step


def deepseek_layer(body: dict[str, Any]) -> Any:
    """DeepseekV3Attention holding the example's latents (interleaved RoPE)."""
    m = body["mla"]
    fields: dict[str, Any] = {
        "hidden_size": 4, "num_attention_heads": 2, "num_key_value_heads": 2,
        "q_lora_rank": m["q_lora_rank"], "kv_lora_rank": m["kv_lora_rank"],
        "qk_nope_head_dim": m["qk_nope_head_dim"], "qk_rope_head_dim": m["qk_rope_head_dim"],
        "v_head_dim": m["v_head_dim"], "rope_interleave": True, "attention_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": body["rope"]["base"]},
    }  # fmt: skip
    config = transformers.DeepseekV3Config(**fields)
    config._attn_implementation = "eager"
    layer = modeling_deepseek_v3.DeepseekV3Attention(config, layer_idx=0).double().eval()
    names = ("q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight",
             "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
             "o_proj.weight")  # fmt: skip
    layer.load_state_dict({n: t(body[n]) for n in names}, strict=True)
    return layer


def test_deepseek_example_is_deepseek_v3_attention(client: TestClient) -> None:
    body = ex.DEEPSEEK_MLA
    ours = full_precision(client, "/multihead", body, include=["c_q", "c_kv", "k_rope", "output"])
    layer = deepseek_layer(body)
    x = t(body["x"])[None]
    inv = 1.0 / body["rope"]["base"] ** (torch.arange(0, 2, 2, dtype=F64) / 2)  # rope dim 2
    with in_float64(modeling_deepseek_v3):
        out, _ = layer(x, cos_sin(inv, list(range(4))), t(causal_additive(4))[None, None])
        assert layer.q_a_layernorm is not None and layer.q_a_proj is not None  # q_lora_rank given
        c_q = layer.q_a_layernorm(layer.q_a_proj(x))
        c_kv = layer.kv_a_layernorm(layer.kv_a_proj_with_mqa(x)[..., :2])
    assert out.dtype == F64
    np.testing.assert_allclose(ours["output"], out[0].numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(ours["c_q"], c_q[0].numpy(), rtol=0, atol=TOL)
    np.testing.assert_allclose(ours["c_kv"], c_kv[0].numpy(), rtol=0, atol=TOL)


# ---- compare: a layer of today's run with a mistake, named by the diagnosis -----------------


def diagnosed(client: TestClient, path: str, body: dict[str, Any], name: str, numbers: Any) -> Any:
    """The diagnosis of ``numbers`` given as the expected ``name`` (the first difference's)."""
    request = {**body, "decimals": None, "include": ["output"], "expected": {name: numbers}}
    answer = client.post(path, json=request)
    assert answer.status_code == 200, answer.text
    first = next(c for c in answer.json()["comparison"] if not c["match"])
    assert first["name"] == name
    return first.get("diagnosis")


@pytest.mark.parametrize(
    ("example", "build", "modeling"),
    [(ex.QWEN3_NEXT_GATED, qwen3_next_layer, modeling_qwen3_next),
     (ex.DEEPSEEK_MLA, deepseek_layer, modeling_deepseek_v3)],
    ids=["qwen3_next_gated", "deepseek_mla"],
)  # fmt: skip
def test_a_layer_run_without_its_scale_is_named_scale_missing(
    client: TestClient, example: dict[str, Any], build: Any, modeling: Any
) -> None:
    """The transformers layer with ``scaling = 1``: the gate (Qwen3-Next) and the latents
    (DeepSeek) are recomputed on the way to the block's output."""
    layer = build(example)
    layer.scaling = 1.0
    found = diagnosed(
        client, "/multihead", example, "output", run_layer(layer, modeling, example).tolist()
    )
    assert found is not None and found["mistakes"] == ["scale_missing"], found


def test_llama4_without_rope_is_named_rope_missing_through_the_norm_after_it(
    client: TestClient,
) -> None:
    """Llama 4's L2 norm of vectors never rotated: the norm after RoPE recomputed unturned."""
    body = ex.LLAMA4_CHUNKED
    x = t(body["x"])[None]
    q, k, v = (x @ t(body[f"{n}_proj.weight"]).T for n in "qkv")  # (1, L, 4)
    with in_float64(modeling_llama4):
        norm = modeling_llama4.Llama4TextL2Norm(1e-5)
        q_n, k_n = norm(q), norm(k)  # no apply_rotary_emb
    i, j = torch.arange(4)[:, None], torch.arange(4)[None, :]
    allowed = (j <= i) & (j // 2 == i // 2)
    weights = torch.softmax(
        (q_n @ k_n.transpose(-1, -2) * 0.5).masked_fill(~allowed, -torch.inf), -1
    )
    found = diagnosed(client, "/multihead", body, "output", (weights @ v)[0].tolist())
    assert found is not None and found["mistakes"] == ["rope_missing"], found


def test_gemma4_softmax_down_the_columns_is_named_through_v_norm(client: TestClient) -> None:
    """Gemma 4's full layer with the softmax over the queries: the output reads V_n."""
    body = ex.GEMMA4_GLOBAL
    s, _, v_n, _, _ = gemma4_parts(body)
    weights = torch.softmax(s, dim=-2)  # down the columns
    found = diagnosed(client, "/multihead", body, "output", (weights @ v_n)[0].tolist())
    assert found is not None and "softmax_over_queries" in found["mistakes"], found
