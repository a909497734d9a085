"""/multihead given only ``x``, a layer's state dict and ``config`` + ``layer`` against today's
transformers 5.23 attention layers built from the same tiny config, to 1e-12.

Each tiny config is written with the kinds of fields its family's real config.json has (the
real ones are in tests/trace/test_config_fields.py: Gemma 3's per-layer-type
``rope_parameters``, Gemma 4's ``layer_types``/``global_head_dim``/``attention_k_eq_v``,
Phi-4-mini's LongRoPE with ``partial_rotary_factor`` and ``original_max_position_embeddings``,
DeepSeek V3's ``q_lora_rank``/``rope_interleave``/YaRN with ``mscale_all_dim``, Qwen3-Next's
``partial_rotary_factor``, Llama 4's ``no_rope_layers``/``attention_chunk_size``/temperature
tuning/llama3 rope), built by transformers' configuration class and sent as its ``to_dict()``
(what ``client.layer`` sends; Gemma 4 and Llama 4 as their multimodal configs, whose
``text_config`` holds the layers' keys). The layer is transformers' own class, random weights,
``.double()``, eager attention, run as its decoder model runs it: ``position_embeddings`` from
the model's own rotary embedding class (per layer type for Gemma 3/4), the mask from
transformers' mask function the decoder model picks for that layer type, all under
harness.hf_reference's ``float64_torch_in`` (the modeling module and ``modeling_rope_utils``)
and ``_widened`` (``Tensor.float()`` → double), as harness/hf_today.py and harness/hf_mla.py run
them. The request carries the state dict under its own names, as ``module.state_dict()`` gives it
(Phi-3's fused ``qkv_proj`` and Qwen3-Next's ``q_proj`` with its gate rows as they are) and, for Phi-3 past ``original_max_position_embeddings``,
``positions``/``context_positions``; nothing else. Each case also checks the fields that
show what it exercises (e.g. the Gemma 4 full layer's d_k 16 and one kv head, which 5.23's
``to_dict()`` writes under ``per_layer_config``, not as ``global_head_dim``).
"""

import os
import types
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

import service.main
from service.wire.hf_config import from_config
from service.wire.hf_config_keys import COMPOSITE, KEYS, VERIFIED

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    DeepseekV3Config,
    Gemma3TextConfig,
    Llama4Config,
    Phi3Config,
    Qwen3NextConfig,
)
from transformers import masking_utils as hf_masks  # noqa: E402
from transformers import modeling_rope_utils as hf_rope  # noqa: E402
from transformers.models.apertus import modeling_apertus  # noqa: E402
from transformers.models.apertus.configuration_apertus import ApertusConfig  # noqa: E402
from transformers.models.bert import modeling_bert  # noqa: E402
from transformers.models.bloom import modeling_bloom  # noqa: E402
from transformers.models.codegen import modeling_codegen  # noqa: E402
from transformers.models.cohere import modeling_cohere  # noqa: E402
from transformers.models.cohere2 import modeling_cohere2  # noqa: E402
from transformers.models.cohere2.configuration_cohere2 import Cohere2Config  # noqa: E402
from transformers.models.dbrx import modeling_dbrx  # noqa: E402
from transformers.models.deepseek_v2 import modeling_deepseek_v2  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3  # noqa: E402
from transformers.models.ernie4_5 import modeling_ernie4_5  # noqa: E402
from transformers.models.exaone4 import modeling_exaone4  # noqa: E402
from transformers.models.exaone4.configuration_exaone4 import Exaone4Config  # noqa: E402
from transformers.models.falcon import modeling_falcon  # noqa: E402
from transformers.models.gemma import modeling_gemma  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2  # noqa: E402
from transformers.models.gemma3 import modeling_gemma3  # noqa: E402
from transformers.models.gemma4 import modeling_gemma4  # noqa: E402
from transformers.models.gemma4.configuration_gemma4 import Gemma4Config  # noqa: E402
from transformers.models.glm import modeling_glm  # noqa: E402
from transformers.models.glm4 import modeling_glm4  # noqa: E402
from transformers.models.glm4_moe import modeling_glm4_moe  # noqa: E402
from transformers.models.glm4_moe.configuration_glm4_moe import Glm4MoeConfig  # noqa: E402
from transformers.models.gpt2 import modeling_gpt2  # noqa: E402
from transformers.models.gpt_bigcode import modeling_gpt_bigcode  # noqa: E402
from transformers.models.gpt_neox import modeling_gpt_neox  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402
from transformers.models.gptj import modeling_gptj  # noqa: E402
from transformers.models.granite import modeling_granite  # noqa: E402
from transformers.models.granitemoe import modeling_granitemoe  # noqa: E402
from transformers.models.helium import modeling_helium  # noqa: E402
from transformers.models.hunyuan_v1_dense import modeling_hunyuan_v1_dense  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.llama4 import modeling_llama4  # noqa: E402
from transformers.models.ministral import modeling_ministral  # noqa: E402
from transformers.models.ministral3 import modeling_ministral3  # noqa: E402
from transformers.models.mistral import modeling_mistral  # noqa: E402
from transformers.models.mixtral import modeling_mixtral  # noqa: E402
from transformers.models.mpt import modeling_mpt  # noqa: E402
from transformers.models.nemotron import modeling_nemotron  # noqa: E402
from transformers.models.olmo import modeling_olmo  # noqa: E402
from transformers.models.olmo2 import modeling_olmo2  # noqa: E402
from transformers.models.olmo3 import modeling_olmo3  # noqa: E402
from transformers.models.olmo3.configuration_olmo3 import Olmo3Config  # noqa: E402
from transformers.models.olmoe import modeling_olmoe  # noqa: E402
from transformers.models.opt import modeling_opt  # noqa: E402
from transformers.models.opt.configuration_opt import OPTConfig  # noqa: E402
from transformers.models.phi import modeling_phi  # noqa: E402
from transformers.models.phi3 import modeling_phi3  # noqa: E402
from transformers.models.phimoe import modeling_phimoe  # noqa: E402
from transformers.models.qwen2 import modeling_qwen2  # noqa: E402
from transformers.models.qwen2_moe import modeling_qwen2_moe  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3  # noqa: E402
from transformers.models.qwen3_5 import modeling_qwen3_5  # noqa: E402
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5Config  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe  # noqa: E402
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import (  # noqa: E402
    Qwen3_5MoeConfig,
)
from transformers.models.qwen3_moe import modeling_qwen3_moe  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next  # noqa: E402
from transformers.models.roberta import modeling_roberta  # noqa: E402
from transformers.models.seed_oss import modeling_seed_oss  # noqa: E402
from transformers.models.smollm3 import modeling_smollm3  # noqa: E402
from transformers.models.stablelm import modeling_stablelm  # noqa: E402
from transformers.models.starcoder2 import modeling_starcoder2  # noqa: E402
from transformers.models.t5 import modeling_t5  # noqa: E402

from harness.hf_reference import _widened, float64_torch_in  # noqa: E402

L = 12  # tokens
TOL = 1e-12
SIZES: dict[str, Any] = {"hidden_size": 32, "intermediate_size": 16, "vocab_size": 16}
NO_TOKENS: dict[str, Any] = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


@dataclass
class Layer:
    """A transformers attention layer as its decoder model runs it."""

    modeling: types.ModuleType
    attn: Any  # the torch module
    # (x, position_ids) -> position_embeddings, built anew; None: no RoPE (OPT)
    rotary: Callable[[Any, Any], Any] | None
    mask_fn: Callable[..., Any]  # a masking_utils create_* function
    config: Any  # the (text) config object the layer was built from
    zero_centered: bool = False  # its q/k norms store w for (1 + w)
    forward_kwargs: dict[str, Any] = field(default_factory=dict)
    position_ids: bool = False  # it takes position_ids (GPT-J: its own sin/cos table)


def _layer_type_mask(config: Any, layer: int) -> Callable[..., Any]:
    """The mask function a Gemma 3/4 decoder model gives a layer of that type."""
    return {
        "full_attention": hf_masks.create_causal_mask,
        "sliding_attention": hf_masks.create_sliding_window_causal_mask,
    }[config.layer_types[layer]]


# ---- the tiny configs, from their real configs' kinds of fields ----------------------------


def gemma3(layer: int) -> tuple[Any, Layer]:
    """As google/gemma-3-4b's text config (5.23's per-layer-type rope_parameters, linear ×8 on
    the full layers), sliding_window_pattern 6: layers 0–4 slide (window 4), layer 5 is full;
    query_pre_attn_scalar apart from head_dim; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "gemma3_text", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 6, "query_pre_attn_scalar": 12, "sliding_window": 4,
        "sliding_window_pattern": 6, "rms_norm_eps": 1e-6, "attn_logit_softcapping": None,
        "final_logit_softcapping": None, "max_position_embeddings": 128, **NO_TOKENS,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }  # fmt: skip
    config: Any = Gemma3TextConfig(**fields)
    config._attn_implementation = "eager"
    layer_type = config.layer_types[layer]
    return config.to_dict(), Layer(
        modeling_gemma3, modeling_gemma3.Gemma3Attention(config, layer),
        lambda x, pos: modeling_gemma3.Gemma3RotaryEmbedding(config)(x, pos, layer_type),
        _layer_type_mask(config, layer), config, zero_centered=True,
    )  # fmt: skip


def gemma4(layer: int) -> tuple[Any, Layer]:
    """As google/gemma-4-31B-it's (multimodal; its text_config): five sliding layers to one
    full (window 4), the full one with global_head_dim 16, num_global_key_value_heads 1 and
    attention_k_eq_v, its proportional RoPE turning a quarter of the head; GQA 4/2 on the
    sliding layers. (5.23's ``to_dict()`` writes the full layer's head_dim and kv heads in
    ``per_layer_config``, without ``global_head_dim``/``num_global_key_value_heads``.)"""
    text: dict[str, Any] = {
        **SIZES, "model_type": "gemma4_text", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "global_head_dim": 16, "num_global_key_value_heads": 1,
        "attention_k_eq_v": True, "num_hidden_layers": 6,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "sliding_window": 4,
        "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0, "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 16, "num_kv_shared_layers": 0, "enable_moe_block": False,
        "use_bidirectional_attention": "vision", "max_position_embeddings": 128, **NO_TOKENS,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                               "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
    }  # fmt: skip
    whole = Gemma4Config(text_config=text)
    config: Any = whole.text_config
    config._attn_implementation = "eager"
    layer_type = config.layer_types[layer]
    return whole.to_dict(), Layer(
        modeling_gemma4, modeling_gemma4.Gemma4TextAttention(config, layer),
        lambda x, pos: modeling_gemma4.Gemma4TextRotaryEmbedding(config)(x, pos, layer_type),
        _layer_type_mask(config, layer), config, forward_kwargs={"shared_kv_states": {}},
    )  # fmt: skip


def phi3(layer: int) -> tuple[Any, Layer]:
    """As microsoft/Phi-4-mini-instruct's: LongRoPE in ``rope_scaling`` with ``type`` (short
    and long factors, no factor: max ÷ original gives it), original_max_position_embeddings at
    the top level (16 of 64), partial_rotary_factor 0.75 (head_dim 8: 6 features turn, 3
    factors a side), a sliding_window (6 here, so that it bites); GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "phi3", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "max_position_embeddings": 64,
        "original_max_position_embeddings": 16, "partial_rotary_factor": 0.75,
        "sliding_window": 6, "rope_theta": 10000.0, **NO_TOKENS,
        "rope_scaling": {"long_factor": [1.0, 3.0, 6.5], "short_factor": [1.0, 1.25, 1.5],
                         "type": "longrope"},
    }  # fmt: skip
    config: Any = Phi3Config(**fields)
    config._attn_implementation = "eager"

    def rotary(x: Any, pos: Any) -> Any:
        return modeling_phi3.Phi3RotaryEmbedding(config)(x, pos)

    mask_fn = (  # as Phi3Model picks it
        hf_masks.create_causal_mask
        if getattr(config, "sliding_window", None) is None
        else hf_masks.create_sliding_window_causal_mask
    )
    return config.to_dict(), Layer(
        modeling_phi3, modeling_phi3.Phi3Attention(config, layer), rotary, mask_fn, config
    )


def deepseek_v3(layer: int) -> tuple[Any, Layer]:
    """As deepseek-ai/DeepSeek-V3's: q_lora_rank, kv_lora_rank, qk_nope/qk_rope/v head dims,
    rope_interleave left out (its default, true, as the real config), YaRN in the legacy
    ``rope_scaling`` with ``type`` (factor 40, mscale 1, mscale_all_dim 1, beta_fast 32,
    beta_slow 1) over an original context of 8; 4 heads."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "deepseek_v3", "num_attention_heads": 4,
        "num_key_value_heads": 4, "num_hidden_layers": 2, "moe_intermediate_size": 8,
        "q_lora_rank": 12, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 8,
        "v_head_dim": 6, "max_position_embeddings": 320, "rope_theta": 10000, **NO_TOKENS,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 8,
                         "type": "yarn"},
    }  # fmt: skip
    config: Any = DeepseekV3Config(**fields)
    config._attn_implementation = "eager"
    assert config.rope_interleave

    def rotary(x: Any, pos: Any) -> Any:
        return modeling_deepseek_v3.DeepseekV3RotaryEmbedding(config)(x, pos)

    return config.to_dict(), Layer(
        modeling_deepseek_v3, modeling_deepseek_v3.DeepseekV3Attention(config, layer), rotary,
        hf_masks.create_causal_mask, config,
    )  # fmt: skip


def qwen3_next(layer: int) -> tuple[Any, Layer]:
    """As Qwen/Qwen3-Next-80B-A3B's: full_attention_interval 4 (layers 0–2 Gated DeltaNet,
    layer 3 full attention), head_dim, partial_rotary_factor 0.25 (head_dim 16: 4 features
    turn), rope_theta 10⁷ with rope_scaling null; GQA 4/2; q_proj's rows hold each head's query
    and output gate."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "qwen3_next", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 4, "full_attention_interval": 4,
        "partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_scaling": None,
        "rms_norm_eps": 1e-6, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_value_head_dim": 8,
        "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8,
        "shared_expert_intermediate_size": 8, **NO_TOKENS,
    }  # fmt: skip
    config: Any = Qwen3NextConfig(**fields)
    config._attn_implementation = "eager"

    def rotary(x: Any, pos: Any) -> Any:
        return modeling_qwen3_next.Qwen3NextRotaryEmbedding(config)(x, pos)

    return config.to_dict(), Layer(
        modeling_qwen3_next, modeling_qwen3_next.Qwen3NextAttention(config, layer), rotary,
        hf_masks.create_causal_mask, config, zero_centered=True,
    )  # fmt: skip


def llama4(layer: int) -> tuple[Any, Layer]:
    """As meta-llama/Llama-4-Scout-17B-16E-Instruct's (multimodal; its text_config):
    no_rope_layers [1, 1, 1, 0] (layers 0–2 RoPE, chunked; layer 3 NoPE, causal),
    attention_chunk_size 4, use_qk_norm, temperature tuning (floor_scale 4 so that it shows
    over 12 tokens, attn_scale 0.1; 5.23 takes attn_temperature_tuning as a bool), llama3
    rope_scaling (factor 16, low = high = 1, original 64); GQA 4/2, head_dim 8."""
    text: dict[str, Any] = {
        **SIZES, "model_type": "llama4_text", "intermediate_size_mlp": 16,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 0], "attention_chunk_size": 4,
        "attn_temperature_tuning": True, "floor_scale": 4, "attn_scale": 0.1,
        "use_qk_norm": True, "rms_norm_eps": 1e-5, "num_local_experts": 2,
        "max_position_embeddings": 1024, "rope_theta": 500000.0, **NO_TOKENS,
        "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 64, "rope_type": "llama3"},
    }  # fmt: skip
    whole = Llama4Config(text_config=text)
    config: Any = whole.text_config
    config._attn_implementation = "eager"

    def rotary(x: Any, pos: Any) -> Any:
        return modeling_llama4.Llama4TextRotaryEmbedding(config)(x, pos)

    mask_fn = {  # as Llama4TextModel picks it
        "full_attention": hf_masks.create_causal_mask,
        "chunked_attention": hf_masks.create_chunked_causal_mask,
    }[config.layer_types[layer]]
    return whole.to_dict(), Layer(
        modeling_llama4, modeling_llama4.Llama4TextAttention(config, layer), rotary, mask_fn,
        config,
    )  # fmt: skip


def _decoder(
    modeling: types.ModuleType,
    attention: str,
    rotary: str,
    config: Any,
    layer: int,
    mask_fn: Callable[..., Any] = hf_masks.create_causal_mask,
    zero_centered: bool = False,
) -> Layer:
    """A layer of a one-rotary decoder: the modeling module's attention and rotary classes by
    name, eager, the mask its decoder model gives that layer."""
    config._attn_implementation = "eager"
    return Layer(  # the rotary class built in float64, as _run calls it
        modeling, getattr(modeling, attention)(config, layer),
        lambda x, pos: getattr(modeling, rotary)(config)(x, pos),
        mask_fn, config, zero_centered=zero_centered,
    )  # fmt: skip


def glm4_moe(layer: int) -> tuple[Any, Layer]:
    """As zai-org/GLM-4.5's: head_dim given apart from hidden_size / heads (12, not 8),
    partial_rotary_factor 0.5 (6 of 12 features turn, half-split), use_qk_norm with
    rms_norm_eps 1e-5, causal; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "glm4_moe", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 12, "num_hidden_layers": 2, "partial_rotary_factor": 0.5,
        "use_qk_norm": True, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
        "moe_intermediate_size": 8, "n_routed_experts": 2, "num_experts_per_tok": 1, **NO_TOKENS,
    }  # fmt: skip
    config: Any = Glm4MoeConfig(**fields)
    return config.to_dict(), _decoder(
        modeling_glm4_moe, "Glm4MoeAttention", "Glm4MoeRotaryEmbedding", config, layer
    )


def apertus(layer: int) -> tuple[Any, Layer]:
    """As swiss-ai/Apertus-8B's: q/k RMSNorms (rms_norm_eps 1e-5), llama3 rope in the legacy
    ``rope_scaling`` (factor 8, low 1, high 4, original 8 so that it bites) with rope_theta
    1.2·10⁷ at the top level, causal; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "apertus", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "rope_theta": 12000000.0,
        "max_position_embeddings": 64, **NO_TOKENS,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
    }  # fmt: skip
    config: Any = ApertusConfig(**fields)
    return config.to_dict(), _decoder(
        modeling_apertus, "ApertusAttention", "ApertusRotaryEmbedding", config, layer
    )


def exaone4(layer: int) -> tuple[Any, Layer]:
    """As LGAI-EXAONE/EXAONE-4.0-32B's: layer_types sliding then full (window 4), q/k
    RMSNorms (rms_norm_eps 1e-5), RoPE on the sliding layer only (the full one is NoPE);
    GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "exaone4", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "sliding_window": 4, "rms_norm_eps": 1e-5,
        "layer_types": ["sliding_attention", "full_attention"], "rope_theta": 1000000.0,
        **NO_TOKENS,
    }  # fmt: skip
    config: Any = Exaone4Config(**fields)
    mask_fn = _layer_type_mask(config, layer)
    return config.to_dict(), _decoder(
        modeling_exaone4, "Exaone4Attention", "Exaone4RotaryEmbedding", config, layer, mask_fn
    )


def cohere2(layer: int) -> tuple[Any, Layer]:
    """As CohereLabs/c4ai-command-r7b-12-2024's: layer_types sliding then full (window 4),
    interleaved RoPE (repeat_interleave'd frequencies, pairs (2i, 2i+1)) on the sliding layer
    only, none on the full one; no q/k norms; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "cohere2", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "sliding_window": 4, "layer_norm_eps": 1e-5,
        "layer_types": ["sliding_attention", "full_attention"], "rope_theta": 50000.0,
        "logit_scale": 0.25, **NO_TOKENS,
    }  # fmt: skip
    config: Any = Cohere2Config(**fields)
    mask_fn = _layer_type_mask(config, layer)
    return config.to_dict(), _decoder(
        modeling_cohere2, "Cohere2Attention", "Cohere2RotaryEmbedding", config, layer, mask_fn
    )


def _qwen3_5_text(moe: bool) -> dict[str, Any]:
    """Qwen3.5's text config (its multimodal config's text_config), as Qwen/Qwen3.5-27B's:
    layer_types three linear_attention layers then a full one, head_dim 16 with
    partial_rotary_factor 0.25 (4 features turn), M-RoPE parameters (text positions: the
    three axes equal), q_proj's rows holding each head's query and output gate; GQA 4/2."""
    return {
        **SIZES, "model_type": "qwen3_5_moe_text" if moe else "qwen3_5_text",
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "rms_norm_eps": 1e-6, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_value_head_dim": 8,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                            "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                            "mrope_section": [1, 1, 0]},
        **({"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8,
            "shared_expert_intermediate_size": 8} if moe else {}),
        **NO_TOKENS,
    }  # fmt: skip


def qwen3_5(layer: int) -> tuple[Any, Layer]:
    """Qwen3.5 (multimodal; its text_config): the full attention layer 3."""
    whole = Qwen3_5Config(text_config=_qwen3_5_text(moe=False))
    return whole.to_dict(), _decoder(
        modeling_qwen3_5, "Qwen3_5Attention", "Qwen3_5TextRotaryEmbedding", whole.text_config,
        layer, zero_centered=True,
    )  # fmt: skip


def qwen3_5_moe(layer: int) -> tuple[Any, Layer]:
    """Qwen3.5-MoE (multimodal; its text_config), as Qwen/Qwen3.5-35B-A3B's: layer 3."""
    whole = Qwen3_5MoeConfig(text_config=_qwen3_5_text(moe=True))
    return whole.to_dict(), _decoder(
        modeling_qwen3_5_moe, "Qwen3_5MoeAttention", "Qwen3_5MoeTextRotaryEmbedding",
        whole.text_config, layer, zero_centered=True,
    )  # fmt: skip


def _causal(
    modeling: types.ModuleType, prefix: str, fields: dict[str, Any], layer: int
) -> tuple[Any, Layer]:
    """A decoder of one kind of layer (every layer causal, one RoPE): ``<prefix>Config`` from
    ``fields``, its ``<prefix>Attention`` and ``<prefix>RotaryEmbedding``, the causal mask."""
    config: Any = getattr(modeling, f"{prefix}Config")(**fields)
    config._attn_implementation = "eager"

    def rotary(x: Any, pos: Any) -> Any:
        return getattr(modeling, f"{prefix}RotaryEmbedding")(config)(x, pos)

    attn = getattr(modeling, f"{prefix}Attention")(config, layer)
    return config.to_dict(), Layer(modeling, attn, rotary, hf_masks.create_causal_mask, config)


def granite(layer: int) -> tuple[Any, Layer]:
    """As ibm-granite/granite-3.3-8b-instruct's: attention_multiplier (0.0078125 there, for
    head_dim 128; 0.3 here, not 8^-½) as the scale, residual/embedding multipliers and
    logits_scaling outside the layer, rope_theta 10⁷ in rope_parameters, no head_dim (hidden
    size ÷ heads = 8); GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "granite", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "attention_multiplier": 0.3, "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22, "logits_scaling": 16.0, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0},
        "attention_bias": False, **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_granite, "Granite", fields, layer)


def granitemoe(layer: int) -> tuple[Any, Layer]:
    """As ibm-granite/granite-3.1-3b-a800m-instruct's (GraniteMoE): attention_multiplier (0.2
    here) as the scale, the experts and multipliers outside the layer; head_dim 16 given
    (the class reads it where given: not hidden size ÷ heads = 8); GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "granitemoe", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2, "attention_multiplier": 0.2,
        "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "logits_scaling": 6.0,
        "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_granitemoe, "GraniteMoe", fields, layer)


def olmo(layer: int) -> tuple[Any, Layer]:
    """As allenai/OLMo-7B-0424-hf's: clip_qkv (8.0 there; 0.5 here, so that it bites on
    projections of size ≈ 1), rope_theta 10⁴, no head_dim, MHA (num_key_value_heads equal to
    the heads)."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "olmo", "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 2, "clip_qkv": 0.5, "attention_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_olmo, "Olmo", fields, layer)


def helium(layer: int) -> tuple[Any, Layer]:
    """As kyutai/helium-1-preview-2b's: the interleaved rotation (pairs 2i, 2i + 1), head_dim
    given (8 = hidden size ÷ heads: its o_proj maps hidden size to hidden size), rope_theta
    left out (Helium's default 10⁵), rms_norm_eps 1e-8 of the block's norms; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "helium", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "num_hidden_layers": 2, "rms_norm_eps": 1e-8, "attention_bias": False,
        "mlp_bias": False, **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_helium, "Helium", fields, layer)


def ernie4_5(layer: int) -> tuple[Any, Layer]:
    """As baidu/ERNIE-4.5-0.3B-PT's: the interleaved rotation (pairs 2i, 2i + 1, in float32
    there: its apply_rotary_pos_emb's ``.float()``), head_dim 16 given (not hidden size ÷
    heads), rope_theta 5·10⁵, use_bias false (the state dict brings any bias); GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "ernie4_5", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "use_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_ernie4_5, "Ernie4_5", fields, layer)


def glm(layer: int) -> tuple[Any, Layer]:
    """As THUDM/glm-4-9b-chat-hf's (model_type glm): partial_rotary_factor left out (GLM's
    default 0.5: the first 8 of head_dim 16 turn, in interleaved pairs), attention_bias true
    (q, k, v biases in the state dict, none on o_proj), rope_theta 10⁴; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "glm", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2, "attention_bias": True,
        "rms_norm_eps": 1.5625e-07, "rope_theta": 10000.0, **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_glm, "Glm", fields, layer)


def glm4(layer: int) -> tuple[Any, Layer]:
    """As THUDM/GLM-4-9B-0414's (model_type glm4): partial_rotary_factor 0.5 given, head_dim
    12 (the first 6 of 12 turn, in interleaved pairs), attention_bias true, rope_theta 10⁴;
    GQA 4/1."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "glm4", "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 12, "num_hidden_layers": 2, "attention_bias": True,
        "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_glm4, "Glm4", fields, layer)


def opt(layer: int) -> tuple[Any, Layer]:
    """As facebook/opt-125m's: no RoPE (its learned positions join the embeddings before the
    first layer), the queries scaled by head_dim^-½ right after q_proj (bias included),
    out_proj, enable_bias (q, k, v and out_proj biases in the state dict), do_layer_norm_before
    and ffn_dim of the block around the layer; a head_dim key, which OPTAttention ignores
    (hidden size ÷ heads = 8); 4 heads, no kv heads key."""
    fields: dict[str, Any] = {
        "hidden_size": 32, "ffn_dim": 16, "vocab_size": 16, "model_type": "opt",
        "num_attention_heads": 4, "num_hidden_layers": 2, "enable_bias": True,
        "do_layer_norm_before": True, "word_embed_proj_dim": 32, "head_dim": 16,
        "max_position_embeddings": 64, "dropout": 0.1, **NO_TOKENS,
    }  # fmt: skip
    config: Any = OPTConfig(**fields)
    config._attn_implementation = "eager"
    attn = modeling_opt.OPTAttention(config, layer)
    return config.to_dict(), Layer(modeling_opt, attn, None, hf_masks.create_causal_mask, config)


def phi(layer: int) -> tuple[Any, Layer]:
    """As microsoft/phi-2's config.json: partial_rotary_factor and rope_theta at the top level
    (0.4 there; 0.75 here: 6 of head_dim 8 turn, half-split), qk_layernorm false, q, k, v and
    dense biases (always there: the state dict brings them), the output projection named
    ``dense``, layer_norm_eps of the block's norms, resid_pdrop; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "phi", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "partial_rotary_factor": 0.75, "rope_theta": 10000.0,
        "qk_layernorm": False, "layer_norm_eps": 1e-5, "resid_pdrop": 0.1,
        "max_position_embeddings": 64, **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_phi, "Phi", fields, layer)


def stablelm(layer: int) -> tuple[Any, Layer]:
    """As stabilityai/stablelm-2-1_6b's: use_qkv_bias (q, k, v biases in the state dict; none
    on o_proj), partial_rotary_factor (0.25 there; 0.5 here: 4 of head_dim 8 turn,
    half-split), qk_layernorm false, use_parallel_residual and layer_norm_eps of the block;
    head_dim hidden size ÷ heads; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "stablelm", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "use_qkv_bias": True, "qk_layernorm": False,
        "use_parallel_residual": True, "layer_norm_eps": 1e-5, "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.5},
        **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_stablelm, "StableLm", fields, layer)


# ---- the encoders: BERT, RoBERTa, T5 --------------------------------------------------------


# the encoders' modeling modules, their classes untyped (BertAttention's __init__ has no hints)
_BERT: Any = modeling_bert
_ROBERTA: Any = modeling_roberta
_T5: Any = modeling_t5


def bert(layer: int) -> tuple[Any, Layer]:
    """As google-bert/bert-base-uncased's config.json: position_embedding_type absolute (added
    to the embeddings, outside the layer), type_vocab_size, the dropouts, is_decoder false (no
    mask: BertModel's create_bidirectional_mask gives none without padding), layer_norm_eps
    (1e-12 there; 1e-3 here, so that it bites); head size hidden ÷ heads = 8. The module is the
    whole BertAttention: self.query/key/value with biases, then output.dense, the residual and
    output.LayerNorm."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "bert", "num_attention_heads": 4, "num_hidden_layers": 2,
        "layer_norm_eps": 1e-3, "position_embedding_type": "absolute", "type_vocab_size": 2,
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "is_decoder": False,
        "max_position_embeddings": 64, **NO_TOKENS,
    }  # fmt: skip
    config: Any = transformers.BertConfig(**fields)
    config._attn_implementation = "eager"
    attn = _BERT.BertAttention(config, is_causal=False, layer_idx=layer)
    return config.to_dict(), Layer(
        modeling_bert, attn, None, hf_masks.create_bidirectional_mask, config
    )


def roberta_decoder(layer: int) -> tuple[Any, Layer]:
    """As FacebookAI/roberta-base's config.json, made a decoder (is_decoder true, as
    RobertaForCausalLM asks): RobertaModel's causal mask; layer_norm_eps 1e-5 (1e-5 there);
    the whole RobertaAttention."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "roberta", "num_attention_heads": 4, "num_hidden_layers": 2,
        "layer_norm_eps": 1e-5, "type_vocab_size": 1, "is_decoder": True,
        "max_position_embeddings": 64, **NO_TOKENS,
    }  # fmt: skip
    config: Any = transformers.RobertaConfig(**fields)
    config._attn_implementation = "eager"
    attn = _ROBERTA.RobertaAttention(config, is_causal=True, layer_idx=layer)
    return config.to_dict(), Layer(
        modeling_roberta, attn, None, hf_masks.create_causal_mask, config
    )


T5_FIELDS: dict[str, Any] = {  # google-t5/t5-small's kinds of keys, tiny; d_kv 12 ≠ 32 ÷ 4
    "model_type": "t5", "d_model": 32, "d_kv": 12, "d_ff": 16, "vocab_size": 16,
    "num_heads": 4, "num_layers": 2, "num_decoder_layers": 3,
    "relative_attention_num_buckets": 8, "relative_attention_max_distance": 10,
    "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6, "feed_forward_proj": "relu",
    "n_positions": 512, "output_past": True, "decoder_start_token_id": 0, **NO_TOKENS,
}  # fmt: skip


def _t5(config: Any, layer: int, mask_fn: Callable[..., Any]) -> Layer:
    """T5Attention as T5Stack runs it: layer 0 (has_relative_attention_bias) computes the
    position bias from its table and every layer adds it, scale 1. A later layer's module is
    given layer 0's table as ``relative_attention_bias`` (what the request must carry); its
    bias is computed by a layer-0 module holding that table."""
    config._attn_implementation = "eager"
    attn: Any = _T5.T5Attention(
        config, has_relative_attention_bias=layer == 0, layer_idx=layer, is_causal=config.is_decoder
    )
    first = attn
    if layer > 0:
        first = _T5.T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
        attn.relative_attention_bias = first.relative_attention_bias  # layer 0's, shared
    own = attn.forward

    def forward(hidden_states: Any, attention_mask: Any = None) -> tuple[Any, Any]:
        n = hidden_states.shape[1]
        bias = first.compute_bias(n, n)  # T5Stack: layer 0's, passed to every layer
        out, _, weights = own(hidden_states, mask=attention_mask, position_bias=bias)
        return out, weights

    attn.forward = forward
    return Layer(modeling_t5, attn, None, mask_fn, config)


def t5(layer: int) -> tuple[Any, Layer]:
    """T5's encoder (is_decoder false): bidirectional buckets, no mask (T5Stack's
    create_bidirectional_mask gives none without padding); 8 buckets, max_distance 10, so
    that the logarithmic buckets show over 12 tokens."""
    config: Any = transformers.T5Config(**T5_FIELDS)
    return config.to_dict(), _t5(config, layer, hf_masks.create_bidirectional_mask)


def t5_decoder(layer: int) -> tuple[Any, Layer]:
    """T5's decoder self-attention, its config as T5Model builds the decoder's (is_decoder
    true, num_layers = num_decoder_layers = 3): one-sided buckets, the causal mask."""
    config: Any = transformers.T5Config(**T5_FIELDS)
    config.is_decoder, config.num_layers = True, config.num_decoder_layers
    return config.to_dict(), _t5(config, layer, hf_masks.create_causal_mask)


def gptj(layer: int) -> tuple[Any, Layer]:
    """As EleutherAI/gpt-j-6B's: its own key names (n_head, n_embd, n_positions, n_layer),
    rotary_dim (64 of head_dim 256 there; 6 of 8 here) turned in interleaved pairs
    (rotate_every_two) at 10000^(−2i/rotary_dim), no biases, out_proj, the scores divided by
    sqrt(head_dim) in float32 there (float64 here); 4 heads. Its sin/cos table is a buffer built
    in __init__, so the layer is built in float64 too."""
    fields: dict[str, Any] = {
        "model_type": "gptj", "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 64,
        "rotary_dim": 6, "n_inner": 16, "vocab_size": 16, "layer_norm_epsilon": 1e-5,
        **NO_TOKENS,
    }  # fmt: skip
    config: Any = transformers.GPTJConfig(**fields)
    config._attn_implementation = "eager"
    return config.to_dict(), _sinusoid_table_layer(modeling_gptj, "GPTJ", config, layer)


def _sinusoid_table_layer(
    modeling: types.ModuleType, prefix: str, config: Any, layer: int
) -> Layer:
    """GPT-J's (and CodeGen's) layer, its sin/cos table built in float64: in 5.23 a buffer of
    ``<prefix>Attention``, which reads position_ids; from 5.25 ``<prefix>RotaryEmbedding``'s,
    which gives the layer (sin, cos)."""
    with float64_torch_in(modeling), _widened():
        attn: Any = getattr(modeling, f"{prefix}Attention")(config, layer)
        own: Any = getattr(modeling, f"{prefix}RotaryEmbedding", None)
        table = None if own is None else own(config)
    mask = hf_masks.create_causal_mask
    if table is None:
        assert attn.embed_positions.dtype == torch.float64
        return Layer(modeling, attn, None, mask, config, position_ids=True)
    assert table.embed_positions.dtype == torch.float64
    return Layer(modeling, attn, lambda x, pos: table(x, pos), mask, config)


def _hunyuan(rope: dict[str, Any], layer: int) -> tuple[Any, Layer]:
    """As tencent/Hunyuan-7B-Instruct's: head_dim given (16 here, not hidden size ÷ heads),
    query_layernorm and key_layernorm (RMSNorms with weights, rms_norm_eps 1e-5) applied to
    the rotated queries and keys, no biases, ``rope`` as given; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "hunyuan_v1_dense", "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8, "eod_token_id": 3, "rope_parameters": rope, **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_hunyuan_v1_dense, "HunYuanDenseV1", fields, layer)


def hunyuan_alpha(layer: int) -> tuple[Any, Layer]:
    """Hunyuan-7B's rope_scaling as it is: type dynamic with alpha 1000 (and factor, mscale …
    that its NTK-alpha frequencies ignore): the fixed base θ · α^(d/(d − 2))."""
    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
    return _hunyuan(rope, layer)


def hunyuan_dynamic(layer: int) -> tuple[Any, Layer]:
    """A dynamic rope without alpha: transformers' dynamic NTK past max_position_embeddings
    (8 here, 12 tokens)."""
    return _hunyuan({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, layer)


def ministral3(layer: int) -> tuple[Any, Layer]:
    """As mistralai/Ministral-3-8B's text config: YaRN in rope_parameters (factor 16, beta_fast
    32, beta_slow 1, mscale and mscale_all_dim 1) with llama_4_scaling_beta 0.1 and its own
    max_position_embeddings entry; original_max_position_embeddings 4 here (16384 there) so
    that over 12 tokens the query scale 1 + β·log(1 + ⌊p / 4⌋) takes three values; a
    sliding_window (6 here) on every layer; head_dim 8; GQA 4/2."""
    rope = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
            "original_max_position_embeddings": 4, "max_position_embeddings": 64,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.1}  # fmt: skip
    fields: dict[str, Any] = {
        **SIZES, "model_type": "ministral3", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "num_hidden_layers": 2, "max_position_embeddings": 64,
        "sliding_window": 6, "rope_parameters": rope, **NO_TOKENS,
    }  # fmt: skip
    config: Any = transformers.Ministral3Config(**fields)
    built = _decoder(modeling_ministral3, "Ministral3Attention", "Ministral3RotaryEmbedding",
                     config, layer, hf_masks.create_sliding_window_causal_mask)  # fmt: skip
    return config.to_dict(), replace(built, position_ids=True)  # it reads position_ids too


# the fourth batch: q/k norms over the whole projection, per head, with a bias


def olmo2(layer: int) -> tuple[Any, Layer]:
    """As allenai/OLMo-2-1124-7B's: q_norm/k_norm RMSNorms of the whole projection (h·d and
    h_kv·d features) before the head split, rms_norm_eps (1e-6 there; 1e-3 here, so that it
    bites), rope_theta 5·10⁵; GQA 4/2 (the keys' norm over their 2 heads' 16 features)."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "olmo2", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "rms_norm_eps": 1e-3, "attention_bias": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_olmo2, "Olmo2", fields, layer)


def olmo3(layer: int) -> tuple[Any, Layer]:
    """As allenai/Olmo-3-1025-7B's: layer_types given (here layer 2 full, layer 3 sliding, apart
    from Olmo3Config's default pattern, so that the key must be read; window 4), the
    projection-wide q/k RMSNorms, YaRN on the full layers only (5.23's rope_parameters per
    layer type: the sliding ones default), rope_theta 5·10⁵; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "olmo3", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 4, "rms_norm_eps": 1e-3, "sliding_window": 4,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                        "sliding_attention"],
        "max_position_embeddings": 64, **NO_TOKENS,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
            "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                               "original_max_position_embeddings": 16,
                               "attention_factor": 1.2, "beta_fast": 32.0, "beta_slow": 1.0},
        },
    }  # fmt: skip
    config: Any = Olmo3Config(**fields)
    config._attn_implementation = "eager"
    layer_type = config.layer_types[layer]
    return config.to_dict(), Layer(
        modeling_olmo3, modeling_olmo3.Olmo3Attention(config, layer),
        lambda x, pos: modeling_olmo3.Olmo3RotaryEmbedding(config)(x, pos, layer_type),
        _layer_type_mask(config, layer), config,
    )  # fmt: skip


def olmoe(layer: int) -> tuple[Any, Layer]:
    """As allenai/OLMoE-1B-7B-0924's: the projection-wide q/k RMSNorms (q_norm over
    hidden_size, k_norm over h_kv·head_dim), clip_qkv null (OLMoE clamps after the norms, which
    the service's clip_qkv does not: a clip is refused), the experts outside the layer; GQA
    4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "olmoe", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "rms_norm_eps": 1e-3, "clip_qkv": None, "num_experts": 4,
        "num_experts_per_tok": 2, "rope_parameters": {"rope_type": "default",
                                                      "rope_theta": 10000.0},
        **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_olmoe, "Olmoe", fields, layer)


def cohere(layer: int) -> tuple[Any, Layer]:
    """As CohereLabs/c4ai-command-r-plus's: use_qk_norm (CohereLayerNorm((heads, head_dim)):
    a LayerNorm over each head's features with the head's own weight row, no bias) with
    layer_norm_eps (1e-5 there; 1e-3 here), the interleaved rotation (pairs 2i, 2i + 1),
    logit_scale outside the layer (on the logits); GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "cohere", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "use_qk_norm": True, "layer_norm_eps": 1e-3,
        "logit_scale": 0.125, "rope_parameters": {"rope_type": "default",
                                                  "rope_theta": 75000.0},
        **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_cohere, "Cohere", fields, layer)


def stablelm_qk(layer: int) -> tuple[Any, Layer]:
    """As stabilityai/stablelm-2-12b's: qk_layernorm (one nn.LayerNorm(head_dim, bias=False)
    per head, q_layernorm.norms.<i>.weight), layer_norm_eps (1e-5 there; 1e-3 here), partial
    rotary 0.5; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "stablelm", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "use_qkv_bias": False, "qk_layernorm": True,
        "use_parallel_residual": True, "layer_norm_eps": 1e-3, "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.5},
        **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_stablelm, "StableLm", fields, layer)


def phi_qk(layer: int) -> tuple[Any, Layer]:
    """Phi with qk_layernorm (microsoft/phi-1_5's class; no released checkpoint sets it): one
    nn.LayerNorm(head_dim) with a weight and a bias shared by the heads, layer_norm_eps (1e-3
    here), partial rotary 0.75; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "phi", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "partial_rotary_factor": 0.75, "rope_theta": 10000.0,
        "qk_layernorm": True, "layer_norm_eps": 1e-3, "max_position_embeddings": 64,
        **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_phi, "Phi", fields, layer)


# ---- running a layer -----------------------------------------------------------------------


def gpt_neox(layer: int) -> tuple[Any, Layer]:
    """As EleutherAI/pythia-160m's (its config.json as GPTNeoXConfig writes it): the fused
    ``query_key_value`` per head (each head's q, k, v rows in turn) with its bias, ``dense``,
    rope_parameters' partial_rotary_factor (0.25 there; 0.5 here: 4 of head_dim 8 turn,
    half-split), use_parallel_residual and layer_norm_eps of the block; head_dim hidden size
    ÷ heads; no kv heads."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "gpt_neox", "num_attention_heads": 4, "num_hidden_layers": 2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.5},
        "use_parallel_residual": True, "layer_norm_eps": 1e-5, "attention_bias": True,
        "max_position_embeddings": 64, **NO_TOKENS,
    }  # fmt: skip
    return _causal(modeling_gpt_neox, "GPTNeoX", fields, layer)


def bloom(layer: int) -> tuple[Any, Layer]:
    """As bigscience/bloom-560m's config.json (n_embed, n_head, n_layer; BloomConfig reads
    n_embed as hidden_size): the fused ``query_key_value`` per head with its bias, ``dense``,
    ALiBi as BloomModel builds it (build_alibi_tensor of an all-ones mask: slope·j, added
    unscaled to the scaled scores), the causal mask; pretraining_tp 2 with slow_but_exact (the
    same products summed in slices). BloomAttention adds the residual it is given: zeros."""
    fields: dict[str, Any] = {
        "model_type": "bloom", "n_embed": SIZES["hidden_size"], "n_head": 4, "n_layer": 2,
        "vocab_size": 16, "layer_norm_epsilon": 1e-5, "pretraining_tp": 1,
        "slow_but_exact": True, "apply_residual_connection_post_layernorm": False, **NO_TOKENS,
    }  # fmt: skip
    config: Any = transformers.BloomConfig(**fields)
    config._attn_implementation = "eager"
    with float64_torch_in(modeling_bloom):  # its float32 slopes in float64
        alibi = modeling_bloom.build_alibi_tensor(torch.ones(1, L), 4, torch.float64)
    zeros = torch.zeros(1, L, SIZES["hidden_size"], dtype=torch.float64)
    return config.to_dict() | {"n_embed": SIZES["hidden_size"]}, Layer(
        modeling_bloom, modeling_bloom.BloomAttention(config, layer), None,
        hf_masks.create_causal_mask, config, forward_kwargs={"alibi": alibi, "residual": zeros},
    )  # fmt: skip


def _bool_causal_mask(*args: Any, **kwargs: Any) -> Any:
    """MptModel's mask: the eager additive mask as booleans, True where masked."""
    mask: Any = hf_masks.create_causal_mask(*args, **kwargs)  # additive, in the eager path
    return mask.to(torch.bool)


def mpt(layer: int) -> tuple[Any, Layer]:
    """As mosaicml/mpt-7b's (d_model, n_heads, n_layers, max_seq_len, attn_config nested):
    ``Wqkv`` [q; k; v] rows without bias, ``out_proj``, attn_config's clip_qkv (0.5, so that it
    bites) and softmax_scale (0.3, not 8^-½), ALiBi as MptModel builds it
    (build_mpt_alibi_tensor over max_seq_len 16, sliced to the last L keys: slope·(j − (L − 1))),
    the causal mask as booleans."""
    fields: dict[str, Any] = {
        "model_type": "mpt", "d_model": SIZES["hidden_size"], "n_heads": 4, "n_layers": 2,
        "max_seq_len": 16, "vocab_size": 16, "expansion_ratio": 2, **NO_TOKENS,
        "attn_config": {"clip_qkv": 0.5, "softmax_scale": 0.3, "alibi": True,
                        "alibi_bias_max": 8},
    }  # fmt: skip
    config: Any = transformers.MptConfig(**fields)
    config._attn_implementation = "eager"
    with float64_torch_in(modeling_mpt), _widened():
        alibi = modeling_mpt.build_mpt_alibi_tensor(4, config.max_seq_len)  # type: ignore[no-untyped-call]
    assert alibi.dtype == torch.float64
    return config.to_dict(), Layer(
        modeling_mpt, modeling_mpt.MptAttention(config, layer), None, _bool_causal_mask, config,
        forward_kwargs={"position_bias": alibi},
    )  # fmt: skip


def dbrx(layer: int) -> tuple[Any, Layer]:
    """As databricks/dbrx-instruct's (d_model, n_heads, attn_config with kv_n_heads, clip_qkv
    and rope_theta; 5.23 rotates at rope_parameters' theta, equal here): ``Wqkv`` rows q (h·d),
    k, v (h_kv·d each), no bias, ``out_proj``, clip_qkv 0.5, half-split RoPE; GQA 4/2."""
    fields: dict[str, Any] = {
        "model_type": "dbrx", "d_model": SIZES["hidden_size"], "n_heads": 4, "n_layers": 2,
        "max_seq_len": 64, "vocab_size": 16, **NO_TOKENS,
        "attn_config": {"kv_n_heads": 2, "clip_qkv": 0.5, "rope_theta": 500000.0},
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "ffn_config": {"ffn_hidden_size": 8, "moe_num_experts": 2, "moe_top_k": 1},
    }  # fmt: skip
    config: Any = transformers.DbrxConfig(**fields)
    return config.to_dict(), _decoder(
        modeling_dbrx, "DbrxAttention", "DbrxRotaryEmbedding", config, layer
    )


def _falcon(layer: int, **layout: Any) -> tuple[Any, Layer]:
    """As tiiuae/falcon-7b's (multi_query), falcon-40b's (new_decoder_architecture,
    num_kv_heads) or falcon-rw's per-head layout with rotary: ``query_key_value`` as
    FalconAttention._split_heads reads it, ``dense``, half-split RoPE, causal."""
    fields: dict[str, Any] = {
        "model_type": "falcon", "hidden_size": SIZES["hidden_size"], "num_attention_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 16, "alibi": False, "parallel_attn": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, **NO_TOKENS,
        **layout,
    }  # fmt: skip
    config: Any = transformers.FalconConfig(**fields)
    built = _decoder(modeling_falcon, "FalconAttention", "FalconRotaryEmbedding", config, layer)
    built.forward_kwargs = {"alibi": None}
    return config.to_dict(), built


def falcon_multi_query(layer: int) -> tuple[Any, Layer]:
    return _falcon(layer, multi_query=True, new_decoder_architecture=False, bias=False)


def falcon_grouped(layer: int) -> tuple[Any, Layer]:
    return _falcon(layer, new_decoder_architecture=True, num_kv_heads=2, bias=False)


def falcon_per_head(layer: int) -> tuple[Any, Layer]:
    return _falcon(layer, multi_query=False, new_decoder_architecture=False, bias=True)


# ---- GPT-2, GPTBigCode, CodeGen: fused projections under their own names, GPT-J's key names
GPT_SIZES: dict[str, Any] = {"n_embd": 32, "n_inner": 16, "vocab_size": 16, "n_positions": 64,
                             "layer_norm_epsilon": 1e-5, "attn_pdrop": 0.1, **NO_TOKENS}  # fmt: skip


def _gpt(modeling: types.ModuleType, prefix: str, fields: dict[str, Any], layer: int) -> Layer:
    """A GPT-2-like layer: ``<prefix>Config`` from its own key names, ``<prefix>Attention``
    given its layer index (GPT-2's scale reads it), no RoPE (learned positions before the first
    layer), the causal mask its model builds."""
    config: Any = getattr(modeling, f"{prefix}Config")(**fields)
    config._attn_implementation = "eager"
    attn = getattr(modeling, f"{prefix}Attention")(config, layer_idx=layer)
    return Layer(modeling, attn, None, hf_masks.create_causal_mask, config)


def gpt2(layer: int) -> tuple[Any, Layer]:
    """As openai-community/gpt2's config.json (its own key names n_head, n_embd, n_layer,
    n_positions): ``c_attn`` a Conv1D [d_model][3·d_model] (columns q, k, v) with its bias,
    ``c_proj`` a Conv1D too; scale_attn_by_inverse_layer_idx true (false there; Mistral's
    GPT-2s set it): layer i's scale 8^-½ / (i + 1); reorder_and_upcast_attn false (its
    float32 path); 4 heads of 8."""
    fields: dict[str, Any] = {
        **GPT_SIZES, "model_type": "gpt2", "n_head": 4, "n_layer": 3,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": True,
        "reorder_and_upcast_attn": False, "activation_function": "gelu_new",
        "summary_type": "cls_index", "summary_first_dropout": 0.1,
    }  # fmt: skip
    hf = _gpt(modeling_gpt2, "GPT2", fields, layer)
    return hf.config.to_dict(), hf


def gpt2_unscaled(layer: int) -> tuple[Any, Layer]:
    """GPT-2 with scale_attn_weights false: the scores unscaled (GPT2Attention's scaling 1)."""
    fields = {**GPT_SIZES, "model_type": "gpt2", "n_head": 4, "n_layer": 2,
              "scale_attn_weights": False}  # fmt: skip
    hf = _gpt(modeling_gpt2, "GPT2", fields, layer)
    return hf.config.to_dict(), hf


def gpt_bigcode(layer: int) -> tuple[Any, Layer]:
    """As bigcode/starcoderbase-1b's: multi_query (one key/value head: ``c_attn`` an
    nn.Linear, rows h·d queries, d keys, d values, with its bias), ``c_proj`` an nn.Linear,
    attention_softmax_in_fp32 and scale_attention_softmax_in_fp32 (float16 precision only);
    4 heads of 8."""
    fields: dict[str, Any] = {
        **GPT_SIZES, "model_type": "gpt_bigcode", "n_head": 4, "n_layer": 2,
        "multi_query": True, "attention_softmax_in_fp32": True,
        "scale_attention_softmax_in_fp32": True, "activation_function": "gelu_pytorch_tanh",
    }  # fmt: skip
    hf = _gpt(modeling_gpt_bigcode, "GPTBigCode", fields, layer)
    return hf.config.to_dict(), hf


def gpt_bigcode_heads(layer: int) -> tuple[Any, Layer]:
    """GPTBigCode with multi_query false (every head its own key and value: c_attn viewed
    (…, h, 3·d), as GPT-NeoX's) and scale_attn_weights false (scores unscaled)."""
    fields: dict[str, Any] = {
        **GPT_SIZES, "model_type": "gpt_bigcode", "n_head": 4, "n_layer": 2,
        "multi_query": False, "scale_attn_weights": False,
    }  # fmt: skip
    hf = _gpt(modeling_gpt_bigcode, "GPTBigCode", fields, layer)
    return hf.config.to_dict(), hf


def codegen(layer: int) -> tuple[Any, Layer]:
    """As Salesforce/codegen-350M-mono's: its own key names, ``qkv_proj`` (no bias) in 4 blocks
    (mp_num) of each block's heads' queries, values, keys; rotary_dim (32 of head_dim 64 there;
    2 of 4 here) turned in interleaved pairs at base 10000; n_ctx (unused); out_proj; 8 heads
    of 4, two a block. Its sin/cos table is a buffer built in __init__: built in float64."""
    fields: dict[str, Any] = {
        **GPT_SIZES, "model_type": "codegen", "n_head": 8, "n_layer": 2, "n_ctx": 64,
        "rotary_dim": 2, "activation_function": "gelu_new",
    }  # fmt: skip
    config: Any = transformers.CodeGenConfig(**fields)
    config._attn_implementation = "eager"
    return config.to_dict(), _sinusoid_table_layer(modeling_codegen, "CodeGen", config, layer)


# ---- the families verified first: Llama, Mistral, Qwen, Gemma, … each with its own case ----


def _family(
    modeling: types.ModuleType, prefix: str, fields: dict[str, Any], layer: int, masks: str
) -> tuple[Any, Layer]:
    """``<prefix>Config`` from ``fields``, its ``<prefix>Attention`` and
    ``<prefix>RotaryEmbedding``, and the mask its decoder model gives the layer: ``every``, the
    sliding-window mask on every layer when sliding_window is set (MistralModel's
    ``mask_function``), or ``types``, the mask of the layer's entry in ``layer_types``."""
    config: Any = getattr(modeling, f"{prefix}Config")(**fields)
    mask_fn = (
        _layer_type_mask(config, layer)
        if masks == "types"
        else hf_masks.create_causal_mask
        if getattr(config, "sliding_window", None) is None
        else hf_masks.create_sliding_window_causal_mask
    )
    built = _decoder(modeling, f"{prefix}Attention", f"{prefix}RotaryEmbedding", config, layer,
                     mask_fn)  # fmt: skip
    return config.to_dict(), built


def llama(layer: int) -> tuple[Any, Layer]:
    """As meta-llama/Llama-3.1-8B's: llama3 rope scaling in rope_parameters (factor 8, low 1,
    high 4; original 8 here, 8192 there, so that it bites over 12 tokens), rope_theta 5·10⁵,
    attention_bias true (q, k, v and o_proj biases: Llama's flag, false there); GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "attention_bias": True, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, **NO_TOKENS,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8},
    }  # fmt: skip
    return _family(modeling_llama, "Llama", fields, layer, "every")


def mistral(layer: int) -> tuple[Any, Layer]:
    """As mistralai/Mistral-7B-v0.1's: sliding_window on every layer (4096 there; 4 here, so
    that it bites over 12 tokens), head_dim given, rope_theta 10⁴; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "mistral", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "num_hidden_layers": 2, "sliding_window": 4, "rope_theta": 10000.0,
        **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_mistral, "Mistral", fields, layer, "every")


def mixtral(layer: int) -> tuple[Any, Layer]:
    """As mistralai/Mixtral-8x7B-v0.1's (sliding_window null there; 5 here, on every layer),
    rope_theta 10⁶, the experts outside the layer; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "mixtral", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "sliding_window": 5, "rope_theta": 1000000.0,
        "num_local_experts": 2, "num_experts_per_tok": 1, **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_mixtral, "Mixtral", fields, layer, "every")


def ministral(layer: int) -> tuple[Any, Layer]:
    """As mistralai/Ministral-8B-Instruct-2410's: layer_types (sliding then full here; window
    4), head_dim given (16, not hidden size ÷ heads), rope_theta 10⁸; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "ministral", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2, "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"], "rope_theta": 100000000.0,
        **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_ministral, "Ministral", fields, layer, "types")


def qwen2(layer: int) -> tuple[Any, Layer]:
    """As Qwen/Qwen2.5-7B's config.json (written before 5.x's layer_types: the key left out of
    what is sent, so that use_sliding_window and max_window_layers decide): use_sliding_window
    true (false there), max_window_layers 1 (layer 0 full, layer 1 sliding, window 4), the q,
    k, v biases Qwen2Attention always has, rope_theta 10⁶; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "use_sliding_window": True, "sliding_window": 4,
        "max_window_layers": 1, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, **NO_TOKENS,
    }  # fmt: skip
    cfg, built = _family(modeling_qwen2, "Qwen2", fields, layer, "types")
    assert built.config.layer_types == ["full_attention", "sliding_attention"]
    return {k: v for k, v in cfg.items() if k != "layer_types"}, built


def qwen2_moe(layer: int) -> tuple[Any, Layer]:
    """As Qwen/Qwen1.5-MoE-A2.7B's: qkv_bias (true: q, k, v biases), use_sliding_window true
    (false there) with window 4 and max_window_layers 1: Qwen2MoeConfig's layer_types (sent
    as ``to_dict()`` writes them) slide the even layers below max_window_layers (layer 0),
    the reverse of Qwen2's rule; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "qwen2_moe", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "use_sliding_window": True, "sliding_window": 4,
        "max_window_layers": 1, "qkv_bias": True, "rope_theta": 1000000.0,
        "moe_intermediate_size": 8, "shared_expert_intermediate_size": 8, "num_experts": 2,
        "num_experts_per_tok": 1, **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_qwen2_moe, "Qwen2Moe", fields, layer, "types")


def qwen2_moe_legacy(layer: int) -> tuple[Any, Layer]:
    """Qwen2-MoE's config.json as Qwen1.5-MoE's was written, without layer_types: the service
    must slide what Qwen2MoeConfig slides, the even layers below max_window_layers (not
    Qwen2's layers from max_window_layers on)."""
    cfg, built = qwen2_moe(layer)
    assert built.config.layer_types == ["sliding_attention", "full_attention"]
    return {k: v for k, v in cfg.items() if k != "layer_types"}, built


def qwen3(layer: int) -> tuple[Any, Layer]:
    """As Qwen/Qwen3-8B's: q/k RMSNorms of each head (rms_norm_eps 1e-6 there; 1e-3 here, so
    that it bites), head_dim 16 given (not hidden size ÷ heads), use_sliding_window true (false
    there) with max_window_layers 1 (layer 0 full, layer 1 sliding, window 4), rope_theta 10⁶;
    GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2, "use_sliding_window": True, "sliding_window": 4,
        "max_window_layers": 1, "rms_norm_eps": 1e-3, "rope_theta": 1000000.0,
        "attention_bias": False, **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_qwen3, "Qwen3", fields, layer, "types")


def qwen3_moe(layer: int) -> tuple[Any, Layer]:
    """As Qwen/Qwen3-30B-A3B's: the q/k RMSNorms (eps 1e-3 here), head_dim 16, use_sliding_window
    true (false there; Qwen3MoeModel then slides every layer, window 5), the experts outside the
    layer; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "qwen3_moe", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2, "use_sliding_window": True, "sliding_window": 5,
        "rms_norm_eps": 1e-3, "rope_theta": 1000000.0, "moe_intermediate_size": 8,
        "num_experts": 2, "num_experts_per_tok": 1, **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_qwen3_moe, "Qwen3Moe", fields, layer, "every")


def gemma(layer: int) -> tuple[Any, Layer]:
    """As google/gemma-2b's: head_dim 16 given (256 there; not hidden size ÷ heads), one
    key/value head (multi-query), no q/k norms (its (1 + w) RMSNorms are the block's, outside
    the attention module), causal, rope_theta 10⁴."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "gemma", "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 16, "num_hidden_layers": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "attention_bias": False, **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_gemma, "Gemma", fields, layer, "every")


def gemma2(layer: int) -> tuple[Any, Layer]:
    """As google/gemma-2-9b's: attn_logit_softcapping (50 there; 2 here, so that it bites on
    scores of size ≈ 1), query_pre_attn_scalar 12 (not head_dim 16: the scale 12^-½), sliding
    every other layer from layer 0 (window 4), final_logit_softcapping outside the layer;
    GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "gemma2", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2, "query_pre_attn_scalar": 12,
        "attn_logit_softcapping": 2.0, "final_logit_softcapping": 30.0, "sliding_window": 4,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_gemma2, "Gemma2", fields, layer, "types")


def starcoder2(layer: int) -> tuple[Any, Layer]:
    """As bigcode/starcoder2-7b's: use_bias (q, k, v and o_proj biases), sliding_window on every
    layer (4096 there; 4 here), rope_theta 10⁶, norm_epsilon of the block's LayerNorms;
    GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "starcoder2", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "use_bias": True, "sliding_window": 4, "norm_epsilon": 1e-5,
        "rope_theta": 1000000.0, "max_position_embeddings": 64, **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_starcoder2, "Starcoder2", fields, layer, "every")


def smollm3(layer: int) -> tuple[Any, Layer]:
    """As HuggingFaceTB/SmolLM3-3B's: no_rope_layers (layer 0 rotates, layer 1 is NoPE),
    use_sliding_window true (false there) with window 4: SmolLM3Config slides the NoPE layers;
    rope_theta 2·10⁶; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "smollm3", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "no_rope_layers": [1, 0], "use_sliding_window": True,
        "sliding_window": 4, "rope_theta": 2000000.0, "attention_bias": False, **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_smollm3, "SmolLM3", fields, layer, "types")


def _deepseek_v2(layer: int, **own: Any) -> tuple[Any, Layer]:
    """As deepseek-ai/DeepSeek-V2's (or -Lite's: q_lora_rank null, a plain q_proj): kv_lora_rank,
    qk_nope/qk_rope/v head dims, the complex-pair (interleaved) RoPE; 4 heads."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "deepseek_v2", "num_attention_heads": 4,
        "num_key_value_heads": 4, "num_hidden_layers": 2, "moe_intermediate_size": 8,
        "n_routed_experts": 2, "num_experts_per_tok": 1, "kv_lora_rank": 8,
        "qk_nope_head_dim": 4, "qk_rope_head_dim": 8, "v_head_dim": 6,
        "max_position_embeddings": 320, **NO_TOKENS, **own,
    }  # fmt: skip
    return _family(modeling_deepseek_v2, "DeepseekV2", fields, layer, "every")


def deepseek_v2(layer: int) -> tuple[Any, Layer]:
    """DeepSeek-V2's: q_lora_rank 12, YaRN (factor 40, mscale and mscale_all_dim 0.707, so that
    the scale's mscale² shows: 1 there; over an original 8, 4096 there)."""
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 8}  # fmt: skip
    return _deepseek_v2(layer, q_lora_rank=12, rope_parameters=rope)


def deepseek_v2_lite(layer: int) -> tuple[Any, Layer]:
    """DeepSeek-V2-Lite's: q_lora_rank null (the queries from q_proj), the default rope."""
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    return _deepseek_v2(layer, q_lora_rank=None, rope_parameters=rope)


def gpt_oss(layer: int) -> tuple[Any, Layer]:
    """As openai/gpt-oss-20b's: sinks (one logit per head, in the state dict), attention_bias
    (q, k, v and o_proj biases), sliding every other layer from layer 0 (window 4; 128 there),
    head_dim 8 given, YaRN (factor 32, beta_fast 32, beta_slow 1, truncate false; over an
    original 8, 4096 there), rope_theta 1.5·10⁵; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "gpt_oss", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "num_hidden_layers": 2, "sliding_window": 4, "attention_bias": True,
        "num_local_experts": 2, "num_experts_per_tok": 1, "max_position_embeddings": 256,
        **NO_TOKENS,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                            "original_max_position_embeddings": 8},
    }  # fmt: skip
    return _family(modeling_gpt_oss, "GptOss", fields, layer, "types")


def phimoe(layer: int) -> tuple[Any, Layer]:
    """As microsoft/Phi-3.5-MoE-instruct's: sliding_window on every layer (131072 there; 4
    here), attention_bias true (q, k, v and o_proj biases), rope_theta 10⁴ (its LongRoPE left
    out); GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "phimoe", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "sliding_window": 4, "attention_bias": True,
        "rope_theta": 10000.0, "num_local_experts": 2, "num_experts_per_tok": 1,
        "max_position_embeddings": 64, **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_phimoe, "Phimoe", fields, layer, "every")


def nemotron(layer: int) -> tuple[Any, Layer]:
    """As nvidia/Minitron-8B-Base's (model_type nemotron): partial_rotary_factor 0.5 (4 of
    head_dim 8 turn, half-split), norm_eps of the block's (1 + w) LayerNorms, rope_theta 10⁴;
    GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "nemotron", "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "norm_eps": 1e-5, "attention_bias": False,
        "max_position_embeddings": 64, **NO_TOKENS,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.5},
    }  # fmt: skip
    return _family(modeling_nemotron, "Nemotron", fields, layer, "every")


def seed_oss(layer: int) -> tuple[Any, Layer]:
    """As ByteDance-Seed/Seed-OSS-36B-Instruct's: attention_bias true (q, k, v biases) with
    attention_out_bias false (none on o_proj), head_dim 16 given (not hidden size ÷ heads),
    rope_theta 10⁷; GQA 4/2."""
    fields: dict[str, Any] = {
        **SIZES, "model_type": "seed_oss", "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2, "attention_bias": True,
        "attention_out_bias": False, "rope_theta": 10000000.0, **NO_TOKENS,
    }  # fmt: skip
    return _family(modeling_seed_oss, "SeedOss", fields, layer, "every")


def _fill(layer: Layer, seed: int) -> None:
    """Random weights: projections ~ N(0, 1/fan_in), norms' weights around 1 (or around 0 where
    they are applied as (1 + w))."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in layer.attn.named_parameters():
            scale = p.shape[-1] ** -0.5 if p.ndim == 2 else 0.5
            centre = 1.0 if name.endswith("norm.weight") and not layer.zero_centered else 0.0
            p.copy_(torch.as_tensor(rng.normal(0, scale, tuple(p.shape)) + centre))


def _run(layer: Layer, x: np.ndarray, positions: list[int]) -> np.ndarray:
    """The layer's output for x (L, d_model) at ``positions``, in float64."""
    xs, pos = torch.as_tensor(x)[None], torch.tensor(positions)[None]
    with float64_torch_in(layer.modeling, hf_rope), _widened(), torch.no_grad():
        # the cache fourth, unnamed: 5.25 renames 5.23's past_key_values to cache
        mask = layer.mask_fn(layer.config, xs, None, None, position_ids=pos)
        rotary: dict[str, Any] = {"position_ids": pos} if layer.position_ids else {}
        if layer.rotary is not None:
            emb = layer.rotary(xs, pos)
            first = emb if isinstance(emb, torch.Tensor) else emb[0]
            assert first.dtype in (torch.float64, torch.complex128)
            rotary["position_embeddings"] = emb
        out, _ = layer.attn(hidden_states=xs, attention_mask=mask, **rotary, **layer.forward_kwargs)
    result: np.ndarray = out[0].numpy()
    return result


def _state(layer: Layer) -> dict[str, Any]:
    """The state dict under its own names, as ``module.state_dict()`` gives it (Phi-3's fused
    qkv_proj too: the service unpacks it as the config's family packs it)."""
    return {k: v.numpy().tolist() for k, v in layer.attn.state_dict().items()}


Build = Callable[[int], tuple[Any, Layer]]
CAUSAL = {"type": "causal"}
WINDOW = {"type": "window", "left": 3, "right": 0}
# (id, tiny config, layer, positions, fields the config must give that layer: what it exercises)
CASES: list[tuple[str, Build, int, list[int] | None, dict[str, Any]]] = [
    ("gemma3-sliding", gemma3, 4, None,
     {"rope": {"base": 10000.0}, "scale": 12**-0.5, "mask": [CAUSAL, WINDOW],
      "qk_norm": {"type": "rms", "eps": 1e-6, "zero_centered": True}}),
    ("gemma3-full-linear", gemma3, 5, None,
     {"rope": {"base": 1e6, "scaling": {"type": "linear", "factor": 8.0}}, "mask": [CAUSAL]}),
    ("gemma4-sliding", gemma4, 0, None,
     {"d_k": 8, "num_kv_heads": 2, "rope": {"base": 10000.0}, "mask": [CAUSAL, WINDOW],
      "v_norm": {"type": "rms", "eps": 1e-6}, "scale": 1.0}),
    ("gemma4-full-k_eq_v", gemma4, 5, None,
     {"d_k": 16, "num_kv_heads": 1, "k_eq_v": True, "mask": [CAUSAL],
      "rope": {"base": 1e6, "style": "proportional", "rotary_dim": 4}}),
    ("phi3-longrope-long", phi3, 1, list(range(30, 30 + L)),  # past the original 16
     {"rope": {"base": 10000.0, "rotary_dim": 6, "scaling": {
         "type": "longrope", "short_factor": [1.0, 1.25, 1.5], "long_factor": [1.0, 3.0, 6.5],
         "original_max_position": 16, "max_position": 64}},
      "mask": [CAUSAL, {"type": "window", "left": 5, "right": 0}]}),
    ("deepseek_v3-mla-yarn", deepseek_v3, 1, None,
     {"rope": {"base": 10000.0, "style": "interleaved", "scaling": {
         "type": "yarn", "factor": 40.0, "original_max_position": 8, "beta_fast": 32.0,
         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}},
      "mla": {"q_lora_rank": 12, "kv_lora_rank": 8, "qk_nope_head_dim": 4,
              "qk_rope_head_dim": 8, "v_head_dim": 6}}),
    ("qwen3_next-full", qwen3_next, 3, None,
     {"d_k": 16, "rope": {"base": 1e7, "rotary_dim": 4}, "gate": True,
      "qk_norm": {"type": "rms", "eps": 1e-6, "zero_centered": True}}),
    ("llama4-rope-chunked", llama4, 0, None,
     {"rope": {"base": 500000.0, "style": "interleaved", "scaling": {
         "type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
         "original_max_position": 64}},
      "qk_norm": {"type": "rms", "eps": 1e-5, "after_rope": True},
      "mask": [{"type": "chunked", "size": 4}]}),
    ("llama4-nope-temperature", llama4, 3, None,
     {"rope": None, "qk_norm": None, "temperature": {"floor_scale": 4.0, "attn_scale": 0.1},
      "mask": [CAUSAL]}),
    # the second batch: q/k norms' eps, NoPE full layers, interleaved RoPE, Qwen3.5's gate
    ("glm4_moe-qk_norm-partial", glm4_moe, 1, None,
     {"d_k": 12, "rope": {"base": 1e6, "rotary_dim": 6}, "mask": [CAUSAL],
      "qk_norm": {"type": "rms", "eps": 1e-5}}),
    ("apertus-qk_norm-llama3", apertus, 1, None,
     {"rope": {"base": 1.2e7, "scaling": {"type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position": 8}},
      "qk_norm": {"type": "rms", "eps": 1e-5}, "mask": [CAUSAL]}),
    ("exaone4-sliding-rope", exaone4, 0, None,
     {"rope": {"base": 1e6}, "qk_norm": {"type": "rms", "eps": 1e-5},
      "mask": [CAUSAL, WINDOW]}),
    ("exaone4-full-nope", exaone4, 1, None,
     {"rope": None, "qk_norm": {"type": "rms", "eps": 1e-5}, "mask": [CAUSAL]}),
    ("cohere2-sliding-interleaved", cohere2, 0, None,
     {"rope": {"base": 50000.0, "style": "interleaved"}, "qk_norm": None,
      "mask": [CAUSAL, WINDOW]}),
    ("cohere2-full-nope", cohere2, 1, None, {"rope": None, "mask": [CAUSAL]}),
    ("qwen3_5-full-gate", qwen3_5, 3, None,
     {"d_k": 16, "rope": {"base": 1e7, "rotary_dim": 4}, "gate": True,
      "qk_norm": {"type": "rms", "eps": 1e-6, "zero_centered": True}}),
    ("qwen3_5_moe-full-gate", qwen3_5_moe, 3, None,
     {"d_k": 16, "rope": {"base": 1e7, "rotary_dim": 4}, "gate": True,
      "qk_norm": {"type": "rms", "eps": 1e-6, "zero_centered": True}}),
    ("granite-attention_multiplier", granite, 1, None,
     {"d_k": 8, "attention_multiplier": 0.3, "scale": None, "rope": {"base": 1e7},
      "mask": [CAUSAL]}),
    ("granitemoe-attention_multiplier", granitemoe, 0, None,
     {"d_k": 16, "attention_multiplier": 0.2, "rope": {"base": 10000.0}, "mask": [CAUSAL]}),
    ("olmo-clip_qkv", olmo, 1, None,
     {"clip_qkv": 0.5, "num_kv_heads": 4, "rope": {"base": 10000.0}, "mask": [CAUSAL]}),
    ("helium-interleaved", helium, 1, None,
     {"rope": {"base": 100000.0, "style": "interleaved"}, "mask": [CAUSAL], "qk_norm": None}),
    ("ernie4_5-interleaved", ernie4_5, 0, None,
     {"d_k": 16, "rope": {"base": 500000.0, "style": "interleaved"}, "mask": [CAUSAL]}),
    ("glm-partial-interleaved", glm, 1, None,
     {"rope": {"base": 10000.0, "style": "interleaved", "rotary_dim": 8}, "mask": [CAUSAL]}),
    ("glm4-partial-interleaved", glm4, 0, None,
     {"d_k": 12, "num_kv_heads": 1, "mask": [CAUSAL],
      "rope": {"base": 10000.0, "style": "interleaved", "rotary_dim": 6}}),
    # the third batch: no RoPE (OPT), partial half-split RoPE with a dense/o_proj (Phi, StableLM)
    ("opt-no_rope", opt, 1, None,
     {"d_k": 8, "rope": None, "num_kv_heads": None, "qk_norm": None, "mask": [CAUSAL]}),
    ("phi-partial-dense", phi, 1, None,
     {"d_k": 8, "rope": {"base": 10000.0, "rotary_dim": 6}, "qk_norm": None,
      "mask": [CAUSAL]}),
    ("stablelm-partial-qkv_bias", stablelm, 0, None,
     {"d_k": 8, "rope": {"base": 10000.0, "rotary_dim": 4}, "qk_norm": None,
      "mask": [CAUSAL]}),
    # fused projections, unpacked by the service as the family packs them
    ("gpt_neox-per_head-fused", gpt_neox, 1, None,
     {"qkv_layout": "per_head", "rope": {"base": 10000.0, "rotary_dim": 4},
      "mask": [CAUSAL]}),
    # the encoders: BERT's block (residual, post-LN), no mask; T5's relative bias, scale 1
    ("bert-block-post_ln", bert, 1, None,
     {"d_k": 8, "rope": None, "mask": None, "residual": True, "layer_norm": {"eps": 1e-3}}),
    ("roberta-decoder-causal", roberta_decoder, 0, None,
     {"d_k": 8, "rope": None, "mask": [CAUSAL], "residual": True,
      "layer_norm": {"eps": 1e-5}}),
    ("t5-encoder-layer0", t5, 0, None,
     {"d_k": 12, "rope": None, "mask": None, "scale": 1.0,
      "relative_bias": {"bidirectional": True, "max_distance": 10}}),
    ("t5-encoder-layer1-layer0s_table", t5, 1, None,
     {"d_k": 12, "mask": None, "scale": 1.0,
      "relative_bias": {"bidirectional": True, "max_distance": 10}}),
    ("t5-decoder-causal", t5_decoder, 2, None,
     {"d_k": 12, "mask": [CAUSAL], "scale": 1.0,
      "relative_bias": {"bidirectional": False, "max_distance": 10}}),
    # the fourth batch: a family's own key names (GPT-J's n_head, n_embd), rotary_dim
    ("gptj-rotary_dim-interleaved", gptj, 1, None,
     {"num_heads": 4, "d_k": 8, "num_kv_heads": None, "mask": [CAUSAL], "scale": None,
      "rope": {"base": 10000.0, "style": "interleaved", "rotary_dim": 6}}),
    # HunYuan: q/k RMSNorms with weights after RoPE, NTK alpha as a fixed base
    ("hunyuan_v1_dense-alpha-norm_after_rope", hunyuan_alpha, 1, None,
     {"d_k": 16, "num_kv_heads": 2, "mask": [CAUSAL],
      "rope": {"base": 10000.0 * 1000.0 ** (16 / 14)},
      "qk_norm": {"type": "rms", "eps": 1e-5, "after_rope": True}}),
    ("hunyuan_v1_dense-dynamic", hunyuan_dynamic, 0, None,
     {"rope": {"base": 10000.0, "scaling": {"type": "dynamic", "factor": 2.0,
                                            "original_max_position": 8}},
      "qk_norm": {"type": "rms", "eps": 1e-5, "after_rope": True}}),
    # Ministral 3: its query scale after RoPE as the temperature counting ⌊p / original⌋
    ("ministral3-beta-temperature-yarn", ministral3, 1, None,
     {"temperature": {"attn_scale": 0.1, "floor_scale": 4, "position_shift": 0},
      "mask": [CAUSAL, {"type": "window", "left": 5, "right": 0}],
      "rope": {"base": 1e6, "scaling": {"type": "yarn", "factor": 16.0,
               "original_max_position": 4, "beta_fast": 32.0, "beta_slow": 1.0,
               "mscale": 1.0, "mscale_all_dim": 1.0}}}),
    ("ministral3-beta-temperature-shifted", ministral3, 0, list(range(30, 30 + L)),
     {"temperature": {"attn_scale": 0.1, "floor_scale": 4, "position_shift": 0}}),
]  # fmt: skip
PROJECTION_NORM = {"type": "rms", "over": "projection", "eps": 1e-3}
CASES += [
    ("olmo2-qk_norm-projection", olmo2, 1, None,
     {"rope": {"base": 500000.0}, "qk_norm": PROJECTION_NORM, "num_kv_heads": 2,
      "mask": [CAUSAL]}),
    ("olmo3-sliding-projection", olmo3, 3, None,
     {"rope": {"base": 500000.0}, "qk_norm": PROJECTION_NORM, "mask": [CAUSAL, WINDOW]}),
    ("olmo3-full-yarn", olmo3, 2, None,
     {"rope": {"base": 500000.0, "scaling": {"type": "yarn", "factor": 4.0,
      "original_max_position": 16, "beta_fast": 32.0, "beta_slow": 1.0,
      "attention_factor": 1.2}}, "qk_norm": PROJECTION_NORM, "mask": [CAUSAL]}),
    ("olmoe-qk_norm-projection", olmoe, 0, None,
     {"rope": {"base": 10000.0}, "qk_norm": PROJECTION_NORM, "clip_qkv": None,
      "mask": [CAUSAL]}),
    ("cohere-qk_norm-per-head-interleaved", cohere, 1, None,
     {"rope": {"base": 75000.0, "style": "interleaved"}, "mask": [CAUSAL],
      "qk_norm": {"type": "layer", "eps": 1e-3}}),
    ("stablelm-qk_layernorm-per-head", stablelm_qk, 1, None,
     {"d_k": 8, "rope": {"base": 10000.0, "rotary_dim": 4}, "mask": [CAUSAL],
      "qk_norm": {"type": "layer", "eps": 1e-3}}),
    ("phi-qk_layernorm-bias", phi_qk, 0, None,
     {"d_k": 8, "rope": {"base": 10000.0, "rotary_dim": 6}, "mask": [CAUSAL],
      "qk_norm": {"type": "layer", "eps": 1e-3}}),
    # ALiBi as BLOOM and MPT add it; MPT's and DBRX's Wqkv; Falcon's three layouts
    ("bloom-alibi-per_head", bloom, 1, None,
     {"qkv_layout": "per_head", "alibi": {"origin": "zero"}, "rope": None, "d_k": 8,
      "mask": [CAUSAL]}),
    ("mpt-alibi-clip-softmax_scale", mpt, 1, None,
     {"qkv_layout": "rows", "alibi": {"origin": "last_key"}, "clip_qkv": 0.5, "scale": 0.3,
      "rope": None, "mask": [CAUSAL]}),
    ("dbrx-rows-gqa-clip", dbrx, 1, None,
     {"qkv_layout": "rows", "num_kv_heads": 2, "clip_qkv": 0.5, "rope": {"base": 500000.0},
      "mask": [CAUSAL]}),
    ("falcon-multi_query-rows", falcon_multi_query, 1, None,
     {"qkv_layout": "rows", "num_kv_heads": 1, "rope": {"base": 10000.0}, "alibi": None}),
    ("falcon-new_decoder-grouped", falcon_grouped, 1, None,
     {"qkv_layout": "grouped", "num_kv_heads": 2, "rope": {"base": 10000.0}}),
    ("falcon-per_head-bias", falcon_per_head, 0, None,
     {"qkv_layout": "per_head", "num_kv_heads": 4, "rope": {"base": 10000.0}}),
    # GPT-2, GPTBigCode, CodeGen: c_attn / qkv_proj as they store them, c_proj beside c_attn
    ("gpt2-columns-inverse_layer_idx", gpt2, 2, None,
     {"qkv_layout": "columns", "num_heads": 4, "d_k": 8, "rope": None, "mask": [CAUSAL],
      "scale": 8**-0.5 / 3}),
    ("gpt2-columns-unscaled", gpt2_unscaled, 1, None,
     {"qkv_layout": "columns", "rope": None, "scale": 1.0}),
    ("gpt_bigcode-multi_query-rows", gpt_bigcode, 1, None,
     {"qkv_layout": "rows", "num_kv_heads": 1, "d_k": 8, "rope": None, "mask": [CAUSAL],
      "scale": None}),
    ("gpt_bigcode-per_head-unscaled", gpt_bigcode_heads, 0, None,
     {"qkv_layout": "per_head", "num_kv_heads": 4, "scale": 1.0}),
    ("codegen-blocks-rotary_dim", codegen, 1, None,
     {"qkv_layout": "codegen", "num_heads": 8, "d_k": 4, "mask": [CAUSAL], "scale": None,
      "rope": {"base": 10000.0, "style": "interleaved", "rotary_dim": 2}}),
]  # fmt: skip

# the families verified first: every layer sliding (Mistral, Mixtral, PhiMoE, Starcoder2,
# Qwen3-MoE), layer kinds from layer_types or the family's own rule, biases, q/k norms, MLA
WINDOW_5 = {"type": "window", "left": 4, "right": 0}
CASES += [
    ("llama-llama3-bias", llama, 1, None,
     {"rope": {"base": 500000.0, "scaling": {"type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position": 8}},
      "mask": [CAUSAL]}),
    ("mistral-sliding-every-layer", mistral, 1, None,
     {"d_k": 8, "rope": {"base": 10000.0}, "mask": [CAUSAL, WINDOW]}),
    ("mixtral-sliding-every-layer", mixtral, 1, None,
     {"rope": {"base": 1e6}, "mask": [CAUSAL, WINDOW_5]}),
    ("ministral-layer_types-sliding", ministral, 0, None,
     {"d_k": 16, "rope": {"base": 1e8}, "mask": [CAUSAL, WINDOW]}),
    ("ministral-layer_types-full", ministral, 1, None, {"d_k": 16, "mask": [CAUSAL]}),
    ("qwen2-below-max_window_layers-bias", qwen2, 0, None,
     {"rope": {"base": 1e6}, "mask": [CAUSAL]}),
    ("qwen2-from-max_window_layers-sliding", qwen2, 1, None,
     {"rope": {"base": 1e6}, "mask": [CAUSAL, WINDOW]}),
    ("qwen2_moe-layer_types-sliding", qwen2_moe, 0, None, {"mask": [CAUSAL, WINDOW]}),
    ("qwen2_moe-layer_types-full", qwen2_moe, 1, None, {"mask": [CAUSAL]}),
    ("qwen2_moe-no_layer_types-even-sliding", qwen2_moe_legacy, 0, None,
     {"mask": [CAUSAL, WINDOW]}),
    ("qwen2_moe-no_layer_types-odd-full", qwen2_moe_legacy, 1, None, {"mask": [CAUSAL]}),
    ("qwen3-qk_norm-full", qwen3, 0, None,
     {"d_k": 16, "qk_norm": {"type": "rms", "eps": 1e-3}, "mask": [CAUSAL]}),
    ("qwen3-qk_norm-sliding", qwen3, 1, None,
     {"d_k": 16, "qk_norm": {"type": "rms", "eps": 1e-3}, "mask": [CAUSAL, WINDOW]}),
    ("qwen3_moe-qk_norm-sliding-every-layer", qwen3_moe, 1, None,
     {"d_k": 16, "qk_norm": {"type": "rms", "eps": 1e-3}, "mask": [CAUSAL, WINDOW_5]}),
    ("gemma-head_dim-multi_query", gemma, 1, None,
     {"d_k": 16, "num_kv_heads": 1, "qk_norm": None, "scale": None, "mask": [CAUSAL]}),
    ("gemma2-sliding-softcap-scalar", gemma2, 0, None,
     {"d_k": 16, "softcap": 2.0, "scale": 12**-0.5, "mask": [CAUSAL, WINDOW]}),
    ("gemma2-full-softcap-scalar", gemma2, 1, None,
     {"d_k": 16, "softcap": 2.0, "scale": 12**-0.5, "mask": [CAUSAL]}),
    ("starcoder2-sliding-bias", starcoder2, 1, None,
     {"rope": {"base": 1e6}, "mask": [CAUSAL, WINDOW]}),
    ("smollm3-rope-full", smollm3, 0, None, {"rope": {"base": 2e6}, "mask": [CAUSAL]}),
    ("smollm3-nope-sliding", smollm3, 1, None, {"rope": None, "mask": [CAUSAL, WINDOW]}),
    ("deepseek_v2-mla-yarn-mscale", deepseek_v2, 1, None,
     {"rope": {"base": 10000.0, "style": "interleaved", "scaling": {
         "type": "yarn", "factor": 40.0, "original_max_position": 8, "beta_fast": 32.0,
         "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}},
      "mla": {"q_lora_rank": 12, "kv_lora_rank": 8, "qk_nope_head_dim": 4,
              "qk_rope_head_dim": 8, "v_head_dim": 6}}),
    ("deepseek_v2_lite-mla-q_proj", deepseek_v2_lite, 0, None,
     {"rope": {"base": 10000.0, "style": "interleaved"},
      "mla": {"q_lora_rank": None, "kv_lora_rank": 8, "qk_nope_head_dim": 4,
              "qk_rope_head_dim": 8, "v_head_dim": 6}}),
    ("gpt_oss-sliding-sinks-yarn", gpt_oss, 0, None,
     {"rope": {"base": 150000.0, "scaling": {"type": "yarn", "factor": 32.0,
      "original_max_position": 8, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}},
      "mask": [CAUSAL, WINDOW]}),
    ("gpt_oss-full-sinks", gpt_oss, 1, None, {"mask": [CAUSAL]}),
    ("phimoe-sliding-bias", phimoe, 1, None,
     {"rope": {"base": 10000.0}, "mask": [CAUSAL, WINDOW]}),
    ("nemotron-partial", nemotron, 1, None,
     {"rope": {"base": 10000.0, "rotary_dim": 4}, "mask": [CAUSAL]}),
    ("seed_oss-qkv_bias-no_out_bias", seed_oss, 0, None,
     {"d_k": 16, "rope": {"base": 1e7}, "mask": [CAUSAL]}),
]  # fmt: skip


@pytest.fixture(scope="module")
def service_client() -> TestClient:
    return TestClient(service.main.app)


@pytest.mark.torch
@pytest.mark.parametrize(("build", "layer", "positions", "shows"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_service_with_config_equals_the_transformers_layer(
    service_client: TestClient,
    build: Build,
    layer: int,
    positions: list[int] | None,
    shows: dict[str, Any],
) -> None:
    cfg, hf = build(layer)
    implied = from_config(cfg, layer)
    assert {key: implied.fields.get(key) for key in shows} == shows
    hf.attn = hf.attn.double().eval()
    _fill(hf, 100 + layer)
    x = np.random.default_rng(layer).normal(size=(L, SIZES["hidden_size"]))
    at = list(range(L)) if positions is None else positions
    expected = _run(hf, x, at)
    body: dict[str, Any] = {"x": x.tolist(), **_state(hf), "config": cfg, "layer": layer,
                            "include": ["output"]}  # fmt: skip
    if positions is not None:  # the whole sequence shifted, as position_ids do
        body["positions"] = body["context_positions"] = positions
    response = service_client.post("/multihead", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["conventions"]["config"] == implied.taken
    got = np.asarray(response.json()["output"])
    assert got.shape == expected.shape
    diff = float(np.abs(got - expected).max()) / max(1.0, float(np.abs(expected).max()))
    assert diff <= TOL, f"largest difference {diff:.3e} (scale {np.abs(expected).max():.3g})"


# ---- every verified family's stock config is read, every key of it judged ------------------

VERIFIED_TYPES = [*VERIFIED, *COMPOSITE]
STOCK_AS_RELEASED: dict[str, dict[str, Any]] = {"glm4_moe": {"head_dim": 128}}
STOCK_AS_RELEASED["hunyuan_v1_dense"] = {"head_dim": 128}  # Hunyuan-7B's (null: transformers fails)
STOCK_AS_RELEASED |= {"bloom": {"n_layer": 24}}  # BloomConfig's stock: 2 layers


@pytest.mark.torch
@pytest.mark.parametrize("model_type", VERIFIED_TYPES)
def test_a_stock_config_of_each_verified_family_is_read_and_each_key_judged(
    model_type: str,
) -> None:
    """``AutoConfig.for_model(t).to_dict()`` (every key transformers 5.23 writes) is read for
    layer 3 (a full-attention layer in Qwen3-Next) without a refusal; each of its keys is either
    applied or listed as judged not to change the layer. GLM-4-MoE's stock defaults (hidden
    size 4096 over 96 heads: head_dim 42, half of it 21 features) make an odd rotary count,
    refused on its own (transformers turns 22 features at 21's frequencies): its real
    config.json (GLM-4.5) gives head_dim 128, as here."""
    cfg = transformers.AutoConfig.for_model(model_type).to_dict() | STOCK_AS_RELEASED.get(
        model_type, {}
    )
    got = from_config(cfg, 3)
    text = cfg.get("text_config") if "num_attention_heads" not in cfg else None
    for part, prefix in ((cfg, ""), (text or {}, "text_config.")):
        assert set(part) <= set(KEYS), set(part) - set(KEYS)
        assert all(f"{prefix}{key}" in got.unread or KEYS[key].reads for key in part)


# ---- BERT's self-attention alone: BertSelfAttention's state dict, the heads' concatenation --


@pytest.mark.torch
def test_berts_self_attention_alone_is_answered_without_the_output_block(
    service_client: TestClient,
) -> None:
    """BertSelfAttention's own state dict (query, key, value without ``self.``; no output
    block): the answer is its output, the heads' concatenation, with neither the residual nor
    the layer norm the config would give the whole BertAttention."""
    cfg, hf = bert(0)
    hf.attn = _BERT.BertSelfAttention(hf.config, layer_idx=0).double().eval()
    _fill(hf, 7)
    x = np.random.default_rng(7).normal(size=(L, SIZES["hidden_size"]))
    expected = _run(hf, x, list(range(L)))
    state = _state(hf)
    assert sorted(state) == sorted(f"{p}.{w}" for p in ("query", "key", "value")
                                   for w in ("weight", "bias"))  # fmt: skip
    body = {"x": x.tolist(), **state, "config": cfg, "include": ["output", "residual"]}
    answer = service_client.post("/multihead", json=body).json()
    assert "residual" not in answer and "layer_norm" not in answer["conventions"]["config"]
    diff = float(np.abs(np.asarray(answer["output"]) - expected).max())
    assert diff <= TOL * max(1.0, float(np.abs(expected).max())), diff
