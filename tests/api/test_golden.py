"""The service against golden cases computed by PyTorch and transformers (scripts/make_golden.py),
no torch needed: tests/fixtures/golden.json (torch ops and modules) and
tests/fixtures/golden_layers.json (whole Hugging Face attention layers in float64)."""

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import assert_close

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = json.loads((FIXTURES / "golden.json").read_text())
CASES: list[dict[str, Any]] = GOLDEN["cases"]
LAYERS = json.loads((FIXTURES / "golden_layers.json").read_text())
LAYER_CASES: list[dict[str, Any]] = LAYERS["cases"]


def test_golden_file_covers_every_kind_of_case() -> None:
    names = {c["name"] for c in CASES}
    for required in (
        "example_batman",
        "example_causal",
        "sdpa_bool_mask",
        "sdpa_additive",
        "sdpa_causal_lower_right",
        "mha_torch_packed",
        "gqa_enable_gqa",
        "block_sinusoidal_residual_layer_norm",
        "mha_out_in_combined_nonsquare",
        "mha_in_out_combined_nonsquare",
        "mha_per_head_out_in_nonsquare",
        "gqa_out_in_nonsquare",
    ):
        assert required in names


def test_golden_layers_file_covers_every_layer() -> None:
    assert LAYERS["transformers_version"] and LAYERS["torch_version"]
    names = {c["name"] for c in LAYER_CASES}
    for required in (
        "hf_llama_gqa_bias_causal",
        "hf_llama3_rope_scaling_offset_positions",
        "hf_llama_batch_padding_causal",
        "hf_qwen3_qk_norm_causal",
        "hf_qwen3_qk_norm_eps_batch",
        "hf_gemma2_softcap_causal",
        "hf_gemma2_softcap_sliding_window",
        "hf_gpt_oss_sinks_causal",
        "hf_gpt_oss_sinks_sliding_batch",
        "torch_mha_key_padding_bool_attn_mask",
        "sdpa_direct_gqa_causal_batch",
        "sdpa_direct_mqa_scale_unbatched",
        # today's layers (harness/hf_today.py)
        "hf_gpt_oss_yarn",
        "hf_phi3_longrope_short",
        "hf_phi3_longrope_long",
        "hf_gemma4_sliding_layer",
        "hf_gemma4_global_layer_k_eq_v",
        "hf_qwen3_next_gated",
        "hf_qwen3_next_explicit_gate",
        "hf_llama4_rope_layer_chunked",
        "hf_llama4_nope_layer_temperature",
        # multi-head latent attention (harness/hf_mla.py)
        "hf_deepseek_v3_mla_q_lora",
        "hf_deepseek_v3_mla_no_q_lora",
        "hf_deepseek_v3_mla_yarn",
    ):
        assert required in names
    for case in LAYER_CASES:  # every case checks the layer's output and stacked weights
        assert {"output", "weights"} <= set(case["expected"]), case["name"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_service_matches_torch_golden(client: TestClient, case: dict[str, Any]) -> None:
    response = client.post(case["endpoint"], json=case["request"])
    assert response.status_code == 200, response.text
    assert_close(response.json(), case["expected"])


@pytest.mark.parametrize("case", LAYER_CASES, ids=[c["name"] for c in LAYER_CASES])
def test_service_matches_hugging_face_layer_golden(
    client: TestClient, case: dict[str, Any]
) -> None:
    """Llama, Qwen3, Gemma 2, gpt-oss, Phi-3, Gemma 4, Qwen3-Next, Llama 4 and DeepSeek V3 (MLA)
    attention layers (transformers, float64), and torch's nn.MultiheadAttention and
    scaled_dot_product_attention, sent with their own names (Phi-3's fused qkv_proj split in
    three)."""
    response = client.post(case["endpoint"], json=case["request"])
    assert response.status_code == 200, response.text
    assert_close(response.json(), case["expected"])
