"""/multihead with ``config``: a family the service does not reproduce exactly, a key that
changes attention and is not applied, a number out of its key's range — each a 422 naming
``config.model_type`` or ``config.<key>`` (API.md, "A config as it is, third edition"), never a
200 with wrong numbers or a 500.

The refused families' configs are transformers 5.23's own configuration classes (tiny sizes,
``to_dict()`` as ``client.layer`` sends it); MiMo, which 5.23 has no class for, is its
config.json's kind of dict. Every body is otherwise a valid layer: without the refusal it would
be answered 200.
"""

import logging
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.api.test_api_variants import post

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

D_MODEL, H, H_KV, D, L = 8, 2, 1, 4, 3
TINY = {"hidden_size": D_MODEL, "num_attention_heads": H, "num_key_value_heads": H_KV,
        "head_dim": D, "num_hidden_layers": 2, "intermediate_size": 16, "vocab_size": 16,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}  # fmt: skip


def layer_body(config: dict[str, Any], **rest: Any) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(L, D_MODEL)), "q_proj.weight": rng.normal(size=(H * D, D_MODEL)),
            "k_proj.weight": rng.normal(size=(H_KV * D, D_MODEL)),
            "v_proj.weight": rng.normal(size=(H_KV * D, D_MODEL)),
            "o_proj.weight": rng.normal(size=(D_MODEL, H * D)), "config": config,
            "include": ["output"], **rest}  # fmt: skip


def stock(name: str, **changes: Any) -> dict[str, Any]:
    """transformers' ``<name>`` config class, tiny, as ``to_dict()`` writes it."""
    config: dict[str, Any] = getattr(transformers, name)(**{**TINY, **changes}).to_dict()
    return config


def llama(**changes: Any) -> dict[str, Any]:
    return stock("LlamaConfig", **changes)


MIMO = {  # XiaomiMiMo/MiMo-7B's config.json kind (Qwen2 layers plus multi-token prediction)
    **{k: v for k, v in TINY.items() if v is not None}, "model_type": "mimo",
    "num_nextn_predict_layers": 1, "rope_theta": 640000, "attention_dropout": 0.0,
    "rms_norm_eps": 1e-5, "use_sliding_window": False, "max_window_layers": 36,
}  # fmt: skip


def test_a_verified_family_is_still_answered(client: TestClient) -> None:
    body = post(client, "/multihead", layer_body(llama()))
    assert body["conventions"]["config"]["num_heads"] == "num_attention_heads"


def test_every_key_of_the_config_is_either_applied_or_listed_as_not_mattering(
    client: TestClient,
) -> None:
    """conventions.config names the keys applied, config_keys the keys judged not to change
    the layer: together they are every key of the config (nothing skipped unjudged)."""
    config = llama()
    conventions = post(client, "/multihead", layer_body(config))["conventions"]
    listed = conventions["config_keys"]
    assert {"vocab_size", "intermediate_size", "attention_dropout"} <= set(listed)
    applied = {key.split(" (")[0].split(".")[0] for key in conventions["config"].values()}
    unlisted = set(config) - set(listed) - applied
    # keys read to check the layer or to derive a field that the config also gives (head_dim
    # here: hidden_size / heads is not needed; no RoPE scaling: max_position_embeddings), or
    # null / false
    read = {"model_type", "num_hidden_layers", "hidden_size", "max_position_embeddings"}
    assert all(k in read or not config[k] for k in unlisted), {k: config[k] for k in unlisted}
    assert "num_attention_heads" not in listed


@pytest.mark.parametrize(
    "config",
    [stock("CodeGenConfig"), stock("BloomConfig"),
     stock("Olmo2Config"),
     stock("Ministral3Config"), stock("Gemma3nTextConfig"), MIMO],
    ids=["codegen", "bloom", "olmo2", "ministral3", "gemma3n", "mimo"],
)  # fmt: skip
def test_a_family_the_service_does_not_reproduce_is_a_422_naming_model_type(
    client: TestClient, config: dict[str, Any]
) -> None:
    error = post(client, "/multihead", layer_body(config), status=422)["errors"][0]
    assert error["field"] == "config.model_type", error
    assert repr(config["model_type"]) in error["message"]
    assert "llama, mistral" in error["message"]
    assert "leave config out" in error["message"]


def test_ministral3_is_refused_naming_its_position_dependent_query_scale(
    client: TestClient,
) -> None:
    """Ministral 3 multiplies each query by 1 + β·log(1 + ⌊p / original⌋) (its
    llama_4_scaling_beta): Llama 4's temperature counts p + 1, so no request field is it."""
    config = stock("Ministral3Config")
    assert config["rope_parameters"]["llama_4_scaling_beta"] == 0.1
    error = post(client, "/multihead", layer_body(config), status=422)["errors"][0]
    assert error["field"] == "config.model_type", error
    assert "llama_4_scaling_beta" in error["message"] and "⌊p / original" in error["message"]


def test_a_config_without_model_type_is_a_422_saying_what_it_must_be(client: TestClient) -> None:
    config = {k: v for k, v in llama().items() if k != "model_type"}
    error = post(client, "/multihead", layer_body(config), status=422)["errors"][0]
    assert error["field"] == "config.model_type" and "llama, mistral" in error["message"], error


@pytest.mark.parametrize(
    ("config", "key"),
    [(llama(clip_qkv=8), "clip_qkv"), (llama(attention_multiplier=0.0625), "attention_multiplier"),
     (llama(sliding_window=2), "sliding_window"),
     (stock("Qwen3MoeConfig", use_sliding_window=True, sliding_window=2,
            max_window_layers=1, use_qk_norm=True), "use_qk_norm")],
    ids=["llama_clip_qkv", "llama_attention_multiplier", "llama_sliding_window",
         "qwen3_moe_use_qk_norm"],
)  # fmt: skip
def test_a_key_that_changes_attention_unapplied_is_a_422_naming_it(
    client: TestClient, config: dict[str, Any], key: str
) -> None:
    error = post(client, "/multihead", layer_body(config), status=422)["errors"][0]
    assert error["field"] == f"config.{key}", error
    assert error["message"].startswith(f"{key} (") and "not supported" in error["message"]


def test_a_granite_config_without_its_scale_is_a_422_naming_attention_multiplier(
    client: TestClient,
) -> None:
    """GraniteAttention's scale is config.attention_multiplier: null leaves the layer without
    one (transformers' GraniteConfig refuses it), not 1/√d_k."""
    config = {**stock("GraniteConfig"), "attention_multiplier": None}
    error = post(client, "/multihead", layer_body(config), status=422)["errors"][0]
    assert error["field"] == "config.attention_multiplier", error
    assert "null" in error["message"] and "scale" in error["message"]


def test_an_odd_number_of_turned_features_is_a_422_naming_partial_rotary_factor(
    client: TestClient,
) -> None:
    """head_dim 4 · 0.75 = 3: transformers' rotary turns 4 features at the frequencies of 3
    (``arange(0, 3, 2) / 3``), which no ``rope.rotary_dim`` states (4 would be 0.29 off in a
    GLM-4 layer of head_dim 10, factor 0.75)."""
    config = stock("Glm4Config", partial_rotary_factor=0.75)
    error = post(client, "/multihead", layer_body(config), status=422)["errors"][0]
    assert error["field"] == "config.rope_parameters.partial_rotary_factor", error
    assert "odd" in error["message"] and "rotary_dim" in error["message"]


MISTRAL = stock("MistralConfig", sliding_window=2)
GEMMA2 = stock("Gemma2Config", sliding_window=2, query_pre_attn_scalar=4)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 32}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "field"),
    [({**MISTRAL, "sliding_window": 1e30}, "sliding_window"),
     ({**MISTRAL, "sliding_window": 2**64}, "sliding_window"),
     ({**GEMMA2, "query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
     ({**GEMMA2, "attn_logit_softcapping": 0}, "attn_logit_softcapping"),
     ({**MISTRAL, "rope_parameters": {**YARN, "beta_fast": 1e308}}, "rope_parameters.beta_fast"),
     ({**MISTRAL, "rope_parameters": {**YARN, "factor": -2.0}}, "rope_parameters.factor"),
     ({**MISTRAL, "rope_parameters": {"rope_type": "default", "rope_theta": -1.0}},
      "rope_parameters.rope_theta"),
     ({**MISTRAL, "model_type": "gemma3", "rope_parameters": {"sliding_attention": 5}},
      "rope_parameters.sliding_attention")],
    ids=["window_1e30", "window_2_64", "scalar_0", "softcap_0", "beta_fast_1e308",
         "yarn_factor_negative", "theta_negative", "rope_entry_number"],
)  # fmt: skip
def test_a_number_out_of_its_keys_range_is_a_422_naming_the_key_in_words(
    client: TestClient, config: dict[str, Any], field: str
) -> None:
    """Not a plain-text 500, not Python's exception text: the key and what it takes."""
    error = post(client, "/multihead", layer_body(config), status=422)["errors"][0]
    assert error["field"] == f"config.{field}", error
    assert "Error" not in error["message"] and "invalid literal" not in error["message"]


@pytest.mark.parametrize(
    ("name", "what"),
    [("PhiConfig", "with a weight and a bias"), ("StableLmConfig", "a weight per head")],
    ids=["phi", "stablelm"],
)
def test_qk_layernorm_true_is_a_422_saying_qk_norm_cannot_state_it(
    client: TestClient, name: str, what: str
) -> None:
    """Phi's q/k LayerNorms have a bias, StableLM's one LayerNorm per head: qk_norm's layer
    norm (one weight [d_k], no bias) is neither, so the config is refused, naming the key;
    with qk_layernorm false the same config is answered."""
    half = {"partial_rotary_factor": 0.5}  # 2 of head_dim 4 (StableLM's 0.25: 1, odd)
    # PhiAttention always has biases on q, k, v and dense (its state dict must bring them)
    sizes = {"q_proj.bias": H * D, "k_proj.bias": H_KV * D, "v_proj.bias": H_KV * D,
             "dense.bias": D_MODEL} if name == "PhiConfig" else {}  # fmt: skip
    biases = {k: [0.1] * n for k, n in sizes.items()}
    answered = post(
        client, "/multihead", layer_body(stock(name, qk_layernorm=False, **half), **biases)
    )
    assert "qk_norm" not in answered["conventions"]["config"]
    error = post(
        client, "/multihead", layer_body(stock(name, qk_layernorm=True, **half)), status=422
    )
    first = error["errors"][0]
    assert first["field"] == "config.qk_layernorm", first
    assert what in first["message"] and "no bias" in first["message"], first
