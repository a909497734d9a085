"""service.wire.hf_config: a Hugging Face config.json and a layer index → /multihead fields.

Two kinds of test:
- each family's config written in from the public fields of a real config.json (nothing is
  downloaded; sizes as they are), with the fields and the keys they came from;
- for LLaMA 3.1, Mistral, Qwen3, Gemma 2 and gpt-oss, a tiny config of the same kinds of fields
  builds transformers 5.23's own attention layer (random weights, float64, its float32 steps
  widened by harness.hf_reference's patches as harness.hf_today does); /multihead given ``x``,
  the layer's state dict and ``from_config(cfg, layer).fields`` must return the layer's output
  to 1e-12. The layer's mask comes from transformers' own mask functions, chosen as its decoder
  model chooses them from the config object transformers builds from the same dict.
"""

import json
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

import service.main
from service.wire.hf_config import ConfigError, from_config

# ---- real configs (public config.json fields) ------------------------------------------------

LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 128256,
}  # fmt: skip
MISTRAL_7B_V0_1 = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 32000,
}  # fmt: skip
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip
GEMMA_2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "sliding_window_size": 4096, "torch_dtype": "float32",
    "use_cache": True, "vocab_size": 256000,
}  # fmt: skip
GEMMA_3_1B = {  # as google/gemma-3-1b-it's config.json, its rope in 5.23's per-layer-type form
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 262144,
}  # fmt: skip
GEMMA_3_4B_TEXT_LEGACY = {  # google/gemma-3-4b-it's text_config: the older rope keys
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
        "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
}  # fmt: skip
GEMMA_4_31B = {  # google/gemma-4-31B-it's text_config (60 layers, five sliding to one full)
    "model_type": "gemma4",
    "text_config": {
        "attention_bias": False, "attention_dropout": 0.0, "attention_k_eq_v": True,
        "enable_moe_block": False, "final_logit_softcapping": 30.0, "global_head_dim": 512,
        "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 5376,
        "hidden_size_per_layer_input": 0, "intermediate_size": 21504,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
        "max_position_embeddings": 262144, "model_type": "gemma4_text",
        "num_attention_heads": 32, "num_experts": None, "num_global_key_value_heads": 4,
        "num_hidden_layers": 60, "num_key_value_heads": 16, "num_kv_shared_layers": 0,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                               "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": 1024, "tie_word_embeddings": True, "top_k_experts": None,
        "use_bidirectional_attention": "vision", "use_cache": True,
        "use_double_wide_mlp": False, "vocab_size": 262144, "vocab_size_per_layer_input": 262144,
    },
}  # fmt: skip
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 201088,
}  # fmt: skip
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "v_head_dim": 128, "vocab_size": 129280,
}  # fmt: skip
PHI4_LONG_FACTOR = [
    1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817,
    2.187582649, 2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023,
    4.785517845, 5.351743533, 5.984965424, 6.693110555, 7.485043894, 8.370679318, 9.36110372,
    10.4687158, 11.70738129, 13.09260651, 14.64173252, 16.37415215, 18.31155283, 20.47818807,
    22.90118105, 25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23, 32.6, 32.61, 32.64,
    32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77,
]  # fmt: skip
PHI_4_MINI = {  # microsoft/Phi-4-mini-instruct (model_type phi3): LongRoPE, partial rotary
    "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1,
    "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
    "intermediate_size": 8192, "interpolate_factor": 1, "lm_head_bias": False,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "phi3",
    "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "original_max_position_embeddings": 4096, "pad_token_id": 199999,
    "partial_rotary_factor": 0.75, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"long_factor": PHI4_LONG_FACTOR, "short_factor": [1.0] * 48,
                     "type": "longrope"},
    "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 200064,
}  # fmt: skip
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
    "eos_token_id": 151645, "full_attention_interval": 4, "head_dim": 256,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next",
    "moe_intermediate_size": 512, "norm_topk_prob": True, "num_attention_heads": 16,
    "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
    "num_key_value_heads": 2, "output_router_logits": False, "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip
LLAMA_4_SCOUT = {  # meta-llama/Llama-4-Scout-17B-16E-Instruct
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "text_config": {
        "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0,
        "attn_scale": 0.1, "attn_temperature_tuning": 4, "bos_token_id": 200000,
        "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192,
        "for_llm_compressor": False, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 5120, "initializer_range": 0.02, "interleave_moe_layer_step": 1,
        "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "max_position_embeddings": 10485760, "model_type": "llama4_text",
        "no_rope_layers": [1, 1, 1, 0] * 12, "num_attention_heads": 40,
        "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
        "num_local_experts": 16, "output_router_logits": False, "pad_token_id": 200018,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
        "torch_dtype": "bfloat16", "use_qk_norm": True, "vocab_size": 202048,
    },
}  # fmt: skip

CAUSAL = {"type": "causal"}


def window(w: int) -> dict[str, Any]:
    return {"type": "window", "left": w - 1, "right": 0}


# ---- the fields of each family ---------------------------------------------------------------


def test_llama_3_1_llama3_rope() -> None:
    got = from_config(LLAMA_3_1_8B, 31)
    assert got.fields == {
        "num_heads": 32, "num_kv_heads": 8, "d_k": 128,
        "rope": {"base": 500000.0, "scaling": {
            "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position": 8192}},
        "mask": [CAUSAL],
    }  # fmt: skip
    assert got.taken["num_kv_heads"] == "num_key_value_heads"
    assert got.taken["d_k"] == "hidden_size / num_attention_heads"
    assert got.taken["rope.base"] == "rope_theta"
    assert got.taken["rope.scaling.type"] == "rope_scaling.rope_type"
    assert got.taken["rope.scaling.original_max_position"] == (
        "rope_scaling.original_max_position_embeddings"
    )
    json.dumps(got.fields)  # JSON-shaped


def test_mistral_sliding_window_on_every_layer() -> None:
    for layer in (0, 17):
        got = from_config(MISTRAL_7B_V0_1, layer)
        assert got.fields == {
            "num_heads": 32, "num_kv_heads": 8, "d_k": 128, "rope": {"base": 10000.0},
            "mask": [CAUSAL, window(4096)],
        }  # fmt: skip
        assert got.taken["mask.window.left"] == "sliding_window"
    # v0.2 on: "sliding_window": null is no window (not the class's default of 4096)
    assert from_config({**MISTRAL_7B_V0_1, "sliding_window": None}, 0).fields["mask"] == [CAUSAL]
    no_key = {k: v for k, v in MISTRAL_7B_V0_1.items() if k != "sliding_window"}
    assert from_config(no_key, 0).taken["mask.window.left"] == (
        "sliding_window (absent: mistral's default)"
    )


def test_qwen3_qk_norm() -> None:
    got = from_config(QWEN3_8B, 35)
    assert got.fields == {
        "num_heads": 32, "num_kv_heads": 8, "d_k": 128, "rope": {"base": 1000000.0},
        "qk_norm": {"type": "rms", "eps": 1e-06}, "mask": [CAUSAL],
    }  # fmt: skip
    assert got.taken["qk_norm.eps"] == "rms_norm_eps"
    assert got.taken["d_k"] == "head_dim"
    # use_sliding_window: the layers from max_window_layers on slide
    sliding = {**QWEN3_8B, "use_sliding_window": True, "sliding_window": 4096}
    assert from_config(sliding, 35).fields["mask"] == [CAUSAL]  # max_window_layers 36
    sliding["max_window_layers"] = 28
    assert from_config(sliding, 28).fields["mask"] == [CAUSAL, window(4096)]
    assert from_config(sliding, 27).fields["mask"] == [CAUSAL]


def test_gemma_2_softcap_scale_and_alternating_window() -> None:
    sliding, full = from_config(GEMMA_2_9B, 0), from_config(GEMMA_2_9B, 41)
    common = {"num_heads": 16, "num_kv_heads": 8, "d_k": 256, "rope": {"base": 10000.0},
              "softcap": 50.0, "scale": 256**-0.5}  # fmt: skip
    assert sliding.fields == {**common, "mask": [CAUSAL, window(4096)]}
    assert full.fields == {**common, "mask": [CAUSAL]}
    assert sliding.taken["softcap"] == "attn_logit_softcapping"
    assert sliding.taken["scale"] == "query_pre_attn_scalar"
    assert (
        sliding.taken["mask.window"] == "model_type gemma2: every other layer slides, from layer 0"
    )


def test_gemma_3_per_layer_type_rope() -> None:
    common = {"num_heads": 4, "num_kv_heads": 1, "d_k": 256, "scale": 0.0625,
              "qk_norm": {"type": "rms", "eps": 1e-06, "zero_centered": True}}  # fmt: skip
    sliding, full = from_config(GEMMA_3_1B, 4), from_config(GEMMA_3_1B, 5)
    assert sliding.fields == {**common, "rope": {"base": 10000.0}, "mask": [CAUSAL, window(512)]}
    assert full.fields == {**common, "rope": {"base": 1000000.0}, "mask": [CAUSAL]}
    assert sliding.taken["rope.base"] == "rope_parameters.sliding_attention.rope_theta"
    assert full.taken["rope.base"] == "rope_parameters.full_attention.rope_theta"
    assert full.taken["mask.causal"] == "model_type gemma3_text (a decoder)"
    # the older keys (a multimodal config's text_config): rope_scaling on the full layers only,
    # thetas and head sizes from Gemma3TextConfig's defaults
    legacy_full, legacy_sliding = (from_config(GEMMA_3_4B_TEXT_LEGACY, i) for i in (5, 6))
    assert legacy_full.fields["rope"] == {
        "base": 1e6, "scaling": {"type": "linear", "factor": 8.0}}  # fmt: skip
    assert legacy_sliding.fields["rope"] == {"base": 1e4}
    assert legacy_sliding.fields["mask"] == [CAUSAL, window(1024)]
    assert legacy_full.taken["rope.scaling.factor"] == "text_config.rope_scaling.factor"
    assert (legacy_full.fields["num_heads"], legacy_full.fields["d_k"]) == (8, 256)
    assert legacy_full.taken["num_heads"] == (
        "text_config.num_attention_heads (absent: gemma3_text's default)"
    )


def test_gemma_4_sliding_and_full_layer() -> None:
    sliding, full = from_config(GEMMA_4_31B, 0), from_config(GEMMA_4_31B, 59)
    norms = {"qk_norm": {"type": "rms", "eps": 1e-6}, "v_norm": {"type": "rms", "eps": 1e-6},
             "scale": 1.0}  # fmt: skip
    assert sliding.fields == {
        "num_heads": 32, "num_kv_heads": 16, "d_k": 256, "rope": {"base": 10000.0}, **norms,
        "mask": [CAUSAL, window(1024)],
    }  # fmt: skip
    assert full.fields == {
        "num_heads": 32, "num_kv_heads": 4, "d_k": 512,
        "rope": {"base": 1000000.0, "style": "proportional", "rotary_dim": 128},
        **norms, "k_eq_v": True, "mask": [CAUSAL],
    }  # fmt: skip
    assert full.taken["d_k"] == "text_config.global_head_dim"
    assert full.taken["num_kv_heads"] == "text_config.num_global_key_value_heads"
    assert full.taken["k_eq_v"] == "text_config.attention_k_eq_v"
    assert full.taken["rope.rotary_dim"] == (
        "text_config.rope_parameters.full_attention.partial_rotary_factor"
    )
    assert sliding.taken["mask.window"] == "text_config.layer_types[0]"


def test_gpt_oss_yarn_and_layer_types() -> None:
    sliding, full = from_config(GPT_OSS_20B, 0), from_config(GPT_OSS_20B, 1)
    rope = {"base": 150000.0, "scaling": {
        "type": "yarn", "factor": 32.0, "original_max_position": 4096, "beta_fast": 32.0,
        "beta_slow": 1.0, "truncate": False}}  # fmt: skip
    common = {"num_heads": 64, "num_kv_heads": 8, "d_k": 64, "rope": rope}
    assert sliding.fields == {**common, "mask": [CAUSAL, window(128)]}
    assert full.fields == {**common, "mask": [CAUSAL]}
    assert sliding.taken["mask.window"] == "layer_types[0]"
    assert full.taken["rope.scaling.truncate"] == "rope_scaling.truncate"
    assert "sinks" not in full.fields  # weights: the state dict brings them


def test_deepseek_v3_mla_with_yarn_mscale() -> None:
    got = from_config(DEEPSEEK_V3, 60)
    assert got.fields == {
        "num_heads": 128,
        "rope": {"base": 10000.0, "style": "interleaved", "scaling": {
            "type": "yarn", "factor": 40.0, "original_max_position": 4096, "beta_fast": 32.0,
            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}},
        "mask": [CAUSAL],
        "mla": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64, "v_head_dim": 128},
    }  # fmt: skip
    assert got.taken["rope.style"] == "rope_interleave (absent: deepseek_v3's default)"
    assert got.taken["rope.scaling.type"] == "rope_scaling.type"
    assert got.taken["mla.kv_lora_rank"] == "kv_lora_rank"
    flat = from_config({**DEEPSEEK_V3, "rope_interleave": False, "q_lora_rank": None}, 0)
    assert "style" not in flat.fields["rope"] and flat.fields["mla"]["q_lora_rank"] is None


def test_phi_4_mini_longrope_and_partial_rotary() -> None:
    got = from_config(PHI_4_MINI, 0)
    assert got.fields == {
        "num_heads": 24, "num_kv_heads": 8, "d_k": 128,
        "rope": {"base": 10000.0, "rotary_dim": 96, "scaling": {
            "type": "longrope", "short_factor": [1.0] * 48,
            "long_factor": [float(f) for f in PHI4_LONG_FACTOR], "original_max_position": 4096,
            "max_position": 131072}},
        "mask": [CAUSAL, window(262144)], "qkv_layout": "rows",
    }  # fmt: skip
    assert got.taken["qkv_layout"] == "model_type phi3"  # its qkv_proj: [q; k; v] rows
    assert got.taken["rope.rotary_dim"] == "partial_rotary_factor"
    assert got.taken["rope.scaling.type"] == "rope_scaling.type"
    assert got.taken["rope.scaling.original_max_position"] == "original_max_position_embeddings"
    assert got.taken["rope.scaling.max_position"] == "max_position_embeddings"


def test_qwen3_next_full_attention_layer() -> None:
    got = from_config(QWEN3_NEXT_80B, 3)
    assert got.fields == {
        "num_heads": 16, "num_kv_heads": 2, "d_k": 256,
        "rope": {"base": 10000000.0, "rotary_dim": 64},
        "qk_norm": {"type": "rms", "eps": 1e-06, "zero_centered": True}, "gate": True,
        "mask": [CAUSAL],
    }  # fmt: skip
    assert got.taken["rope.rotary_dim"] == "partial_rotary_factor"
    with pytest.raises(ConfigError, match="linear_attention") as caught:
        from_config(QWEN3_NEXT_80B, 0)  # Gated DeltaNet: no softmax attention
    assert caught.value.field == "layer"


def test_llama_4_rope_and_nope_layer() -> None:
    rope_layer, nope_layer = from_config(LLAMA_4_SCOUT, 0), from_config(LLAMA_4_SCOUT, 3)
    assert rope_layer.fields == {
        "num_heads": 40, "num_kv_heads": 8, "d_k": 128,
        "rope": {"base": 500000.0, "style": "interleaved", "scaling": {
            "type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
            "original_max_position": 8192}},
        "qk_norm": {"type": "rms", "eps": 1e-05, "after_rope": True},
        "mask": [{"type": "chunked", "size": 8192}],
    }  # fmt: skip
    assert nope_layer.fields == {
        "num_heads": 40, "num_kv_heads": 8, "d_k": 128,
        "temperature": {"floor_scale": 8192.0, "attn_scale": 0.1}, "mask": [CAUSAL],
    }  # fmt: skip
    assert rope_layer.taken["qk_norm"] == "text_config.use_qk_norm"
    assert rope_layer.taken["mask.chunked"] == "text_config.no_rope_layers[0]"
    assert rope_layer.taken["mask.chunked.size"] == "text_config.attention_chunk_size"
    assert nope_layer.taken["temperature"] == "text_config.attn_temperature_tuning"


# ---- the rules of the second batch's families that their tiny layers do not reach -------------

TINY_2: dict[str, Any] = {
    "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 4, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
}  # fmt: skip


def test_cohere2_head_dim_is_hidden_size_over_heads_and_its_pattern_without_layer_types() -> None:
    """Cohere2Config sets head_dim to hidden_size // heads whatever the config says; without
    layer_types its legacy sliding_window_pattern (4) picks the full layers, which are NoPE.
    The keys of Cohere's own config.json that Cohere2's 5.23 modeling never reads are listed."""
    unused = {"position_embedding_type": "rope_gptj", "rotary_pct": 1.0, "layer_switch": 4,
              "order_of_interleaved_layers": "local_attn_first", "use_parallel_block": True,
              "use_qk_norm": False}  # fmt: skip
    config = {**TINY_2, "model_type": "cohere2", "head_dim": 64, "sliding_window": 4, **unused}
    sliding, full = from_config(config, 2), from_config(config, 3)
    assert sliding.fields["d_k"] == 8 and full.fields["d_k"] == 8
    assert sliding.taken["d_k"] == "hidden_size / num_attention_heads"
    assert sliding.fields["rope"] == {"base": 10000.0, "style": "interleaved"}
    assert sliding.fields["mask"] == [CAUSAL, {"type": "window", "left": 3, "right": 0}]
    assert "rope" not in full.fields and full.fields["mask"] == [CAUSAL]
    assert "sliding_window_pattern" in sliding.taken["mask.window"]
    assert set(unused) - {"use_qk_norm"} <= set(sliding.unread)


def test_exaone4_without_a_window_rotates_every_layer() -> None:
    """EXAONE 4.0 1.2B's kind: sliding_window null, every layer full attention: each layer
    rotates (Exaone4Attention: RoPE when sliding_window is None or the layer slides)."""
    config = {**TINY_2, "model_type": "exaone4", "sliding_window": None,
              "layer_types": ["full_attention"] * 4}  # fmt: skip
    got = from_config(config, 3).fields
    assert got["rope"] == {"base": 10000.0} and got["mask"] == [CAUSAL]
    assert got["qk_norm"] == {"type": "rms", "eps": 1e-5}


@pytest.mark.parametrize("model_type", ["exaone4", "cohere2"])
def test_a_sliding_layer_without_a_window_is_a_config_error(model_type: str) -> None:
    """transformers builds no mask for it (create_sliding_window_causal_mask raises)."""
    config = {**TINY_2, "model_type": model_type, "sliding_window": None,
              "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}  # fmt: skip
    with pytest.raises(ConfigError, match="sliding_window is null") as e:
        from_config(config, 0)
    assert e.value.field == "config.sliding_window"


def test_glm4_moe_qk_norm_only_with_use_qk_norm_and_partial_rotary_by_default() -> None:
    """Glm4MoeConfig: use_qk_norm false and partial_rotary_factor 0.5 when absent."""
    config = {**TINY_2, "model_type": "glm4_moe", "head_dim": 16}
    off, on = from_config(config, 0), from_config({**config, "use_qk_norm": True}, 0)
    assert "qk_norm" not in off.fields and on.fields["qk_norm"] == {"type": "rms", "eps": 1e-5}
    assert off.fields["rope"] == {"base": 10000.0, "rotary_dim": 8}
    assert off.taken["rope.rotary_dim"] == "partial_rotary_factor (absent: glm4_moe's default)"


def test_apertus_without_rope_keys_takes_its_llama3_default() -> None:
    """ApertusConfig's rope when neither rope_scaling nor rope_parameters is given: llama3 with
    θ 1.2·10⁷, whatever the top-level rope_theta."""
    got = from_config({**TINY_2, "model_type": "apertus"}, 0).fields
    assert got["rope"] == {"base": 12000000.0, "scaling": {
        "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position": 8192}}  # fmt: skip


def test_the_new_families_defaults_where_their_config_json_leaves_a_key_out() -> None:
    """Each family's transformers 5.23 default, said so in ``taken``: Helium's rope_theta 10⁵
    and head_dim 128, ERNIE 4.5's rope_theta 5·10⁵, GLM's and GLM-4's partial_rotary_factor
    0.5 (with head_dim 128)."""
    bare = {"num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2}
    got = from_config({**bare, "model_type": "helium"}, 1)
    assert got.fields["rope"] == {"base": 1e5, "style": "interleaved"}
    assert got.fields["d_k"] == 128 and got.taken["d_k"] == "head_dim (absent: helium's default)"
    assert got.taken["rope.base"] == "rope_theta (absent: helium's default)"
    ernie = from_config({**bare, "model_type": "ernie4_5", "head_dim": None}, 0)
    assert ernie.fields["rope"] == {"base": 5e5, "style": "interleaved"}
    assert ernie.fields["d_k"] == 16  # null: hidden size ÷ heads, as Ernie4_5Config sets it
    for model_type in ("glm", "glm4"):  # half the head turns, in interleaved pairs
        glm = from_config({**bare, "model_type": model_type}, 0)
        assert glm.fields["rope"] == {"base": 1e4, "style": "interleaved", "rotary_dim": 64}
        assert (
            glm.taken["rope.rotary_dim"]
            == f"partial_rotary_factor (absent: {model_type}'s default)"
        )


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="layer 40 but the config has num_hidden_layers 32") as e:
        from_config(LLAMA_3_1_8B, 40)
    assert e.value.field == "layer"
    odd = {**LLAMA_3_1_8B, "rope_scaling": {"rope_type": "mrope", "factor": 2.0}}
    with pytest.raises(ConfigError, match="'mrope'") as e:
        from_config(odd, 0)
    assert e.value.field == "config.rope_scaling.rope_type"
    with pytest.raises(ConfigError) as e:
        from_config({**LLAMA_3_1_8B, "num_key_value_heads": "8"}, 0)
    assert e.value.field == "config.num_key_value_heads"
    with pytest.raises(ConfigError, match="bidirectional") as e:  # EmbeddingGemma's kind
        from_config({**GEMMA_3_1B, "use_bidirectional_attention": True}, 0)
    assert e.value.field == "config.use_bidirectional_attention"


GEMMA_4_TEXT: dict[str, Any] = dict(GEMMA_4_31B["text_config"])  # type: ignore[arg-type]
GPT_OSS_YARN: dict[str, Any] = dict(GPT_OSS_20B["rope_scaling"])  # type: ignore[call-overload]


def test_a_model_type_outside_the_verified_families_is_refused() -> None:
    """No family is read with another's (or generic) defaults: GPT-Neo's local layers attend
    within a window of their own key, MiniMax-M2 norms the whole projection … — each would
    have been a 200 with wrong numbers."""
    for model_type in ("mine", "gpt_neo", "minimax_m2", "gemma3n_text", "mimo", 7):
        with pytest.raises(ConfigError, match=r"(?i)state the layer's fields yourself") as e:
            from_config({**LLAMA_3_1_8B, "model_type": model_type}, 0)
        assert e.value.field == "config.model_type"
        assert "llama, mistral" in e.value.message and "gemma3 with its text_config" in (
            e.value.message
        )
    with pytest.raises(ConfigError, match="no model_type") as e:
        from_config({k: v for k, v in LLAMA_3_1_8B.items() if k != "model_type"}, 0)
    assert e.value.field == "config.model_type"
    inner = {**GEMMA_4_31B, "text_config": {**GEMMA_4_TEXT, "model_type": "gpt_neo"}}
    with pytest.raises(ConfigError) as e:  # a multimodal config's text part: a verified type
        from_config(inner, 0)
    assert e.value.field == "config.text_config.model_type"


@pytest.mark.parametrize(
    ("extra", "key"),
    [({"clip_qkv": 8}, "clip_qkv"), ({"attention_multiplier": 0.015625}, "attention_multiplier"),
     ({"qk_layernorm": True}, "qk_layernorm"), ({"sliding_window": 4096}, "sliding_window"),
     ({"query_pre_attn_scalar": 144}, "query_pre_attn_scalar"),
     ({"rotary_dim": 64}, "rotary_dim"), ({"my_attention_trick": 2}, "my_attention_trick")],
    ids=["clip_qkv", "attention_multiplier", "qk_layernorm", "sliding_window_on_llama",
         "query_pre_attn_scalar_on_llama", "rotary_dim", "unjudged_key"],
)  # fmt: skip
def test_a_key_that_changes_attention_and_is_not_applied_is_refused(
    extra: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError, match=key) as e:
        from_config({**LLAMA_3_1_8B, **extra}, 0)
    assert e.value.field == f"config.{key}"


def test_neutral_values_and_inert_keys_pass_and_are_listed() -> None:
    quiet = {**LLAMA_3_1_8B, "clip_qkv": None, "qk_layernorm": False, "use_sliding_window": False,
             "sliding_window": None, "my_flag": False}  # fmt: skip
    got = from_config(quiet, 0)
    assert got.fields == from_config(LLAMA_3_1_8B, 0).fields
    assert {"vocab_size", "intermediate_size", "clip_qkv", "attention_bias", "torch_dtype",
            "rms_norm_eps"} <= set(got.unread)  # fmt: skip
    assert "rope_theta" not in got.unread and "num_attention_heads" not in got.unread
    nested = from_config(GEMMA_4_31B, 0)  # a multimodal config's text keys, named as nested
    assert "text_config.vocab_size" in nested.unread and "text_config" not in nested.unread
    # Gemma 4 layers that reuse an earlier layer's keys and values: not computed from weights
    shared = {**GEMMA_4_TEXT, "num_kv_shared_layers": 20}
    with pytest.raises(ConfigError) as e:
        from_config({**GEMMA_4_31B, "text_config": shared}, 0)
    assert e.value.field == "config.text_config.num_kv_shared_layers"


@pytest.mark.parametrize(
    ("config", "layer", "field"),
    [({**MISTRAL_7B_V0_1, "sliding_window": 1e30}, 0, "sliding_window"),
     ({**MISTRAL_7B_V0_1, "sliding_window": 2**63}, 0, "sliding_window"),
     ({**GEMMA_2_9B, "query_pre_attn_scalar": 0}, 0, "query_pre_attn_scalar"),
     ({**GEMMA_2_9B, "query_pre_attn_scalar": -4}, 0, "query_pre_attn_scalar"),
     ({**GEMMA_2_9B, "attn_logit_softcapping": 0.0}, 0, "attn_logit_softcapping"),
     ({**LLAMA_3_1_8B, "rope_theta": 0}, 0, "rope_theta"),
     ({**LLAMA_3_1_8B, "rope_theta": 10**400}, 0, "rope_theta"),
     ({**LLAMA_3_1_8B, "num_attention_heads": 2**40}, 0, "num_attention_heads"),
     ({**LLAMA_3_1_8B, "hidden_size": 16}, 0, "hidden_size"),
     ({**PHI_4_MINI, "partial_rotary_factor": 1e308}, 0, "partial_rotary_factor"),
     ({**QWEN3_8B, "rms_norm_eps": -1e-6}, 0, "rms_norm_eps"),
     ({**GPT_OSS_20B, "rope_scaling": {**GPT_OSS_YARN, "beta_fast": 1e308}}, 0,
      "rope_scaling.beta_fast"),
     ({**GEMMA_3_1B, "rope_parameters": {"sliding_attention": 5, "full_attention": {}}}, 0,
      "rope_parameters.sliding_attention")],
    ids=["window_1e30", "window_2_63", "scalar_0", "scalar_negative", "softcap_0", "theta_0",
         "theta_10_400", "heads_2_40", "hidden_below_heads", "partial_huge", "eps_negative",
         "beta_fast_1e308", "rope_entry_not_object"],
)  # fmt: skip
def test_each_numeric_edge_is_a_config_error_naming_its_key(
    config: dict[str, Any], layer: int, field: str
) -> None:
    with pytest.raises(ConfigError) as e:
        from_config(config, layer)
    assert e.value.field == f"config.{field}", e.value.message
    assert field.split(".")[-1] in e.value.message and "Error" not in e.value.message


# ---- against transformers' own layers --------------------------------------------------------

TINY = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "intermediate_size": 16, "vocab_size": 16}  # fmt: skip
L = 12  # tokens; windows of 4 keys


def _tiny(real: dict[str, Any], **changes: Any) -> dict[str, Any]:
    cfg = {k: v for k, v in real.items() if k not in ("architectures", "torch_dtype")}
    return {**cfg, **TINY, **changes}


HF_CASES = [
    ("llama", _tiny(LLAMA_3_1_8B), 0),
    ("mistral", _tiny(MISTRAL_7B_V0_1, sliding_window=4), 1),
    ("qwen3", _tiny(QWEN3_8B, head_dim=16, max_window_layers=1, rms_norm_eps=0.01), 1),
    ("qwen3", _tiny(QWEN3_8B, head_dim=16, use_sliding_window=True, sliding_window=4,
                    max_window_layers=1, rms_norm_eps=0.01), 1),
    ("gemma2", _tiny(GEMMA_2_9B, head_dim=16, query_pre_attn_scalar=12, sliding_window=4), 0),
    ("gemma2", _tiny(GEMMA_2_9B, head_dim=16, query_pre_attn_scalar=12, sliding_window=4), 1),
    ("gpt_oss", _tiny(GPT_OSS_20B, head_dim=8, sliding_window=4, num_local_experts=2,
                      layer_types=["sliding_attention", "full_attention"]), 0),
    ("gpt_oss", _tiny(GPT_OSS_20B, head_dim=8, sliding_window=4, num_local_experts=2,
                      layer_types=["sliding_attention", "full_attention"]), 1),
]  # fmt: skip


@pytest.fixture(scope="module")
def service_client() -> TestClient:
    return TestClient(service.main.app)


def _hf_layer_output(family: str, cfg: dict[str, Any], layer: int, x: Any) -> Any:
    """transformers' attention layer ``layer`` of ``cfg`` in float64 (random weights), its
    output for ``x`` and its state dict."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import masking_utils as hf_masks
    from transformers import modeling_rope_utils as hf_rope
    from transformers.models.gemma2 import modeling_gemma2
    from transformers.models.gpt_oss import modeling_gpt_oss
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral
    from transformers.models.qwen3 import modeling_qwen3

    from harness.hf_reference import _widened, float64_torch_in

    modeling, prefix = {
        "llama": (modeling_llama, "Llama"), "mistral": (modeling_mistral, "Mistral"),
        "qwen3": (modeling_qwen3, "Qwen3"), "gemma2": (modeling_gemma2, "Gemma2"),
        "gpt_oss": (modeling_gpt_oss, "GptOss"),
    }[family]  # fmt: skip
    config = getattr(modeling, f"{prefix}Config")(**cfg)
    config._attn_implementation = "eager"
    attn = getattr(modeling, f"{prefix}Attention")(config, layer).double().eval()
    rng = np.random.default_rng(layer + 7)
    with torch.no_grad():
        for name, p in attn.named_parameters():
            scale = p.shape[-1] ** -0.5 if p.ndim == 2 else 0.5
            values = rng.normal(0, scale, p.shape) + (1.0 if name.endswith("norm.weight") else 0)
            p.copy_(torch.as_tensor(values))
    # the mask as the decoder model picks it (from transformers' own config object)
    sliding = (config.sliding_window is not None if family == "mistral"
               else family != "llama" and config.layer_types[layer] == "sliding_attention")  # fmt: skip
    make_mask = (
        hf_masks.create_sliding_window_causal_mask if sliding else hf_masks.create_causal_mask
    )
    xs, pos = torch.as_tensor(np.asarray(x))[None], torch.arange(L)[None]
    with float64_torch_in(modeling, hf_rope), _widened(), torch.no_grad():
        mask = make_mask(config=config, inputs_embeds=xs, attention_mask=None,
                         past_key_values=None, position_ids=pos)  # fmt: skip
        cos_sin = getattr(modeling, f"{prefix}RotaryEmbedding")(config)(xs, pos)
        assert cos_sin[0].dtype == torch.float64
        out, _ = attn(hidden_states=xs, position_embeddings=cos_sin, attention_mask=mask)
    state = {k: v.numpy().tolist() for k, v in attn.state_dict().items()}
    return out[0].numpy(), state


@pytest.mark.torch
@pytest.mark.parametrize(("family", "cfg", "layer"), HF_CASES,
                         ids=[f"{f}-layer{i}-{n}" for n, (f, _, i) in enumerate(HF_CASES)])  # fmt: skip
def test_service_with_config_fields_equals_the_transformers_layer(
    service_client: TestClient, family: str, cfg: dict[str, Any], layer: int
) -> None:
    x = np.random.default_rng(layer).normal(size=(L, TINY["hidden_size"]))
    expected, state = _hf_layer_output(family, cfg, layer, x)
    body = {"x": x.tolist(), **state, "config": cfg, "layer": layer, "include": ["output"]}
    response = service_client.post("/multihead", json=body)  # the config as it is
    assert response.status_code == 200, response.text
    taken = response.json()["conventions"]["config"]
    assert taken == from_config(cfg, layer).taken  # every field the config gave, echoed
    got = np.asarray(response.json()["output"])
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-12 * max(1.0, np.abs(expected).max())


def test_phi_takes_half_the_head_when_partial_rotary_factor_is_left_out() -> None:
    """PhiConfig's default partial_rotary_factor 0.5 (phi-1's config.json has none): head_dim
    80 → 40 features turn, half-split, said so in ``taken``."""
    bare = {"model_type": "phi", "num_attention_heads": 32, "hidden_size": 2560,
            "num_hidden_layers": 32, "rope_theta": 10000.0, "qk_layernorm": False}  # fmt: skip
    got = from_config(bare, 0)
    assert got.fields["rope"] == {"base": 1e4, "rotary_dim": 40}
    assert got.taken["rope.rotary_dim"] == "partial_rotary_factor (absent: phi's default)"


def test_stablelm_takes_a_quarter_of_the_head_and_hidden_size_over_heads() -> None:
    """StableLmConfig's default partial_rotary_factor 0.25 where the config.json has none,
    and StableLmAttention's head_dim hidden_size // heads (a head_dim key is not read)."""
    bare = {"model_type": "stablelm", "num_attention_heads": 32, "hidden_size": 2048,
            "num_hidden_layers": 24, "rope_theta": 10000.0, "head_dim": 128}  # fmt: skip
    got = from_config(bare, 0)
    assert got.fields["d_k"] == 64 and got.taken["d_k"] == "hidden_size / num_attention_heads"
    assert got.fields["rope"] == {"base": 1e4, "rotary_dim": 16}
    assert got.taken["rope.rotary_dim"] == "partial_rotary_factor (absent: stablelm's default)"


# ---- the encoders: T5's own key names, BERT's block -----------------------------------------

T5_SMALL = {  # google-t5/t5-small's config.json (its task_specific_params shortened)
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 2048, "d_kv": 64, "d_model": 512,
    "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1,
    "initializer_factor": 1.0, "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06,
    "model_type": "t5", "n_positions": 512, "num_heads": 8, "num_layers": 6,
    "output_past": True, "pad_token_id": 0, "relative_attention_num_buckets": 32,
    "task_specific_params": {"summarization": {"prefix": "summarize: "}}, "vocab_size": 32128,
}  # fmt: skip
BERT_BASE = {  # google-bert/bert-base-uncased's config.json
    "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1,
    "gradient_checkpointing": False, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
    "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0,
    "position_embedding_type": "absolute", "transformers_version": "4.6.0.dev0",
    "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522,
}  # fmt: skip


def test_t5_small_under_its_own_key_names() -> None:
    """num_heads, d_kv (the head size, not d_model ÷ heads in general), scale 1, the relative
    bias bidirectional in the encoder, relative_attention_max_distance left out (T5's 128);
    no mask, no RoPE."""
    got = from_config(T5_SMALL, 5)
    assert got.fields == {
        "num_heads": 8, "d_k": 64, "scale": 1.0,
        "relative_bias": {"bidirectional": True, "max_distance": 128},
    }  # fmt: skip
    assert got.buckets == (32, "relative_attention_num_buckets")
    assert got.taken["num_heads"] == "num_heads" and got.taken["d_k"] == "d_kv"
    assert got.taken["relative_bias.max_distance"] == (
        "relative_attention_max_distance (absent: t5's default)"
    )
    assert {"d_ff", "layer_norm_epsilon", "task_specific_params", "n_positions"} <= set(got.unread)
    with pytest.raises(ConfigError, match="layer 6 but the config has num_layers 6"):
        from_config(T5_SMALL, 6)


def test_t5s_decoder_is_causal_with_one_sided_buckets_and_counts_its_own_layers() -> None:
    """is_decoder true (T5Model's decoder config): the causal mask, bidirectional false, and
    num_decoder_layers (here 8, the encoder's 6) counts the layers."""
    decoder = {**T5_SMALL, "is_decoder": True, "num_decoder_layers": 8}
    got = from_config(decoder, 7)
    assert got.fields["mask"] == [{"type": "causal"}]
    assert got.fields["relative_bias"]["bidirectional"] is False
    assert got.taken["relative_bias.bidirectional"] == "is_decoder"
    with pytest.raises(ConfigError, match="num_decoder_layers 8"):
        from_config(decoder, 8)


def test_bert_base_its_block_no_mask_and_no_rope() -> None:
    """bert-base-uncased: head size 768 ÷ 12, the block's residual and layer norm (eps
    layer_norm_eps 1e-12) as fields that hold only with output.LayerNorm in the state dict,
    no mask (an encoder), no RoPE (absolute positions join the embeddings)."""
    got = from_config(BERT_BASE, 11)
    assert got.fields == {"num_heads": 12, "d_k": 64, "residual": True,
                          "layer_norm": {"eps": 1e-12}}  # fmt: skip
    assert got.block == ("residual", "layer_norm") and got.taken["layer_norm.eps"] == (
        "layer_norm_eps"
    )
    assert got.taken["mask"] == "is_decoder (absent: bert's default)"
    assert "position_embedding_type" in got.unread


GPT_J_6B = {  # EleutherAI/gpt-j-6B's config.json (written by transformers 4.18)
    "activation_function": "gelu_new", "architectures": ["GPTJForCausalLM"], "attn_pdrop": 0.0,
    "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256,
    "gradient_checkpointing": False, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
    "model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_inner": None, "n_layer": 28,
    "n_positions": 2048, "resid_pdrop": 0.0, "rotary": True, "rotary_dim": 64,
    "scale_attn_weights": True, "summary_activation": None, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50,
                                                 "temperature": 1.0}},
    "tie_word_embeddings": False, "tokenizer_class": "GPT2Tokenizer",
    "transformers_version": "4.18.0.dev0", "use_cache": True, "vocab_size": 50400,
}  # fmt: skip


def test_gpt_j_under_its_own_key_names_with_rotary_dim_interleaved() -> None:
    """GPT-J's n_head and n_embd (GPTJConfig's attribute_map), head_dim n_embd // n_head, its
    rotary_dim first features turned in interleaved pairs at base 10000 (fixed in its
    create_sinusoidal_positions); its old keys (rotary, scale_attn_weights, summary_*) judged."""
    got = from_config(GPT_J_6B, 27)
    assert got.fields == {
        "num_heads": 16, "d_k": 256, "mask": [{"type": "causal"}],
        "rope": {"base": 10000.0, "style": "interleaved", "rotary_dim": 64},
    }  # fmt: skip
    assert got.taken["num_heads"] == "n_head" and got.taken["d_k"] == "n_embd / n_head"
    assert got.taken["rope.rotary_dim"] == "rotary_dim"
    assert got.taken["rope.base"].startswith("model_type gptj: create_sinusoidal_positions")
    assert {"rotary", "scale_attn_weights", "summary_type", "n_inner"} <= set(got.unread)
    with pytest.raises(ConfigError) as error:
        from_config(GPT_J_6B, 28)  # n_layer 28
    assert error.value.field == "layer" and "28" in error.value.message


def test_gpt_j_reads_our_key_name_where_its_own_is_absent_and_ignores_rope_keys() -> None:
    """GPTJConfig maps num_attention_heads onto n_head, so a config.json with Llama's name is
    read too; a rope_theta (no key GPT-J's modeling reads) leaves the base 10000, listed as
    not changing the layer."""
    config = {k: v for k, v in GPT_J_6B.items() if k != "n_head"}
    got = from_config({**config, "num_attention_heads": 32, "rope_theta": 5e5}, 0)
    assert got.fields["num_heads"] == 32 and got.fields["d_k"] == 128
    assert got.taken["num_heads"] == "num_attention_heads"
    assert got.fields["rope"]["base"] == 10000.0 and "rope_theta" in got.unread


@pytest.mark.parametrize(
    ("rotary_dim", "n_head", "words"),
    [(63, 16, "even number"), (258, 16, "within the head_dim 256"), (None, 16, "null")],
    ids=["odd", "beyond_head_dim", "null_several_heads"],
)
def test_a_gpt_j_rotary_dim_transformers_fails_on_is_a_config_error(
    rotary_dim: int | None, n_head: int, words: str
) -> None:
    with pytest.raises(ConfigError) as error:
        from_config({**GPT_J_6B, "rotary_dim": rotary_dim, "n_head": n_head}, 0)
    assert error.value.field == "config.rotary_dim" and words in error.value.message


def test_a_gpt_j_rotary_dim_null_with_one_head_turns_the_whole_head() -> None:
    got = from_config({**GPT_J_6B, "rotary_dim": None, "n_head": 1, "n_embd": 64}, 0)
    assert got.fields["rope"] == {"base": 10000.0, "style": "interleaved"}


HUNYUAN = {  # the kinds of fields of tencent/Hunyuan-7B-Instruct's config.json
    "model_type": "hunyuan_v1_dense", "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 32,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "use_qk_norm": True,
    "rope_theta": 10000.0, "eod_token_id": 127967,
    "rope_scaling": {"alpha": 1000.0, "beta_fast": 32, "beta_slow": 1, "factor": 1.0,
                     "mscale": 1.0, "mscale_all_dim": 1.0, "type": "dynamic"},
}  # fmt: skip


def test_hunyuan_ntk_alpha_is_a_fixed_base_and_its_norms_follow_rope() -> None:
    """HunYuanDenseV1RotaryEmbedding: a dynamic rope with alpha is θ · α^(d/(d − 2)), not
    dynamic NTK; query_layernorm/key_layernorm are RMSNorms (rms_norm_eps) after RoPE."""
    got = from_config(HUNYUAN, 0)
    assert got.fields["rope"] == {"base": 10000.0 * 1000.0 ** (128 / 126)}
    assert got.taken["rope.base"] == "rope_theta · rope_scaling.alpha^(head_dim / (head_dim − 2))"
    assert got.fields["qk_norm"] == {"type": "rms", "eps": 1e-5, "after_rope": True}
    assert (got.fields["d_k"], got.fields["num_kv_heads"]) == (128, 8)
    assert "use_qk_norm" in got.unread and "eod_token_id" in got.unread
    dynamic = {**HUNYUAN, "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    assert from_config(dynamic, 0).fields["rope"]["scaling"]["type"] == "dynamic"


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [({"head_dim": None}, "config.head_dim", "transformers fails"),
     ({"partial_rotary_factor": 0.5}, "config.partial_rotary_factor", "whole head"),
     ({"rope_scaling": {"type": "dynamic", "alpha": 2.0}, "head_dim": 2},
      "config.rope_scaling.alpha", "head_dim 2")],
    ids=["head_dim_null", "partial_rotary_factor", "alpha_head_dim_2"],
)  # fmt: skip
def test_hunyuan_configs_transformers_cannot_run_are_config_errors(
    change: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as error:
        from_config({**HUNYUAN, **change}, 0)
    assert error.value.field == field and words in error.value.message, error.value.message


def test_olmo3s_config_json_without_layer_types_and_with_a_legacy_yarn() -> None:
    """Olmo3Config's layer_types when absent: every fourth layer full, the others slide; its
    ``rope_scaling`` goes to the full layers only (``rope_parameters["full_attention"]
    .update``), the sliding ones rotating plainly at rope_theta; q/k RMSNorms of the whole
    projection with rms_norm_eps."""
    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192,
            "attention_factor": 1.2, "beta_fast": 32, "beta_slow": 1}  # fmt: skip
    config = {**TINY_2, "model_type": "olmo3", "rope_theta": 500000.0, "sliding_window": 4096,
              "rope_scaling": yarn, "max_position_embeddings": 65536}  # fmt: skip
    sliding, full = from_config(config, 2), from_config(config, 3)
    assert sliding.fields["rope"] == {"base": 500000.0}
    assert sliding.fields["mask"] == [CAUSAL, window(4096)]
    assert full.fields["rope"]["scaling"]["type"] == "yarn" and full.fields["mask"] == [CAUSAL]
    norm = {"type": "rms", "over": "projection", "eps": 1e-5}
    assert sliding.fields["qk_norm"] == full.fields["qk_norm"] == norm
    assert "every fourth layer" in sliding.taken["mask.window"]


@pytest.mark.parametrize(
    ("model_type", "flag"),
    [("phi", "qk_layernorm"), ("stablelm", "qk_layernorm"), ("cohere", "use_qk_norm")],
)
def test_the_layer_norms_of_phi_stablelm_and_cohere_only_with_their_flag(
    model_type: str, flag: str
) -> None:
    """A LayerNorm of each head's features (the state dict brings the weights: per head for
    StableLM and Cohere, with a bias for Phi), eps layer_norm_eps; none when the flag is false
    or absent (the families' default); Cohere turns interleaved pairs."""
    config = {**TINY_2, "model_type": model_type, "layer_norm_eps": 1e-4}
    off, on = from_config(config, 0), from_config({**config, flag: True}, 0)
    assert "qk_norm" not in off.fields
    assert on.fields["qk_norm"] == {"type": "layer", "eps": 1e-4}
    assert on.taken["qk_norm"] == flag and on.taken["qk_norm.eps"] == "layer_norm_eps"
    assert (on.fields["rope"].get("style") == "interleaved") == (model_type == "cohere")
