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


def layer_body(config: dict[str, Any] | None, **rest: Any) -> dict[str, Any]:
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
    [stock("GPTNeoConfig", attention_types=[[["global", "local"], 1]]),
     stock("Gemma3nTextConfig"), MIMO],
    ids=["gpt_neo", "gemma3n", "mimo"],
)  # fmt: skip
def test_a_family_the_service_does_not_reproduce_is_a_422_naming_model_type(
    client: TestClient, config: dict[str, Any]
) -> None:
    error = post(client, "/multihead", layer_body(config), status=422)["errors"][0]
    assert error["field"] == "config.model_type", error
    assert repr(config["model_type"]) in error["message"]
    assert "llama, mistral" in error["message"]
    assert "leave config out" in error["message"]


def test_ministral3_is_read_with_its_query_scale_as_the_temperature(
    client: TestClient,
) -> None:
    """Ministral 3 multiplies each query by 1 + β·log(1 + ⌊p / original⌋) after RoPE (its
    llama_4_scaling_beta): the temperature with position_shift 0; without β a 422 naming it."""
    config = stock("Ministral3Config")
    assert config["rope_parameters"]["llama_4_scaling_beta"] == 0.1
    taken = post(client, "/multihead", layer_body(config))["conventions"]["config"]
    assert taken["temperature.attn_scale"] == "rope_parameters.llama_4_scaling_beta"
    assert taken["temperature.position_shift"] == "model_type ministral3"
    rope = {k: v for k, v in config["rope_parameters"].items() if k != "llama_4_scaling_beta"}
    error = post(client, "/multihead", layer_body({**config, "rope_parameters": rope}), status=422)
    first = error["errors"][0]
    assert first["field"] == "config.rope_parameters.llama_4_scaling_beta", first


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


# ---- the encoders: BERT's and RoBERTa's output block, T5's relative bias table -------------

T5_TINY = {"d_model": D_MODEL, "d_kv": D, "num_heads": H, "num_layers": 2, "d_ff": 16,
           "vocab_size": 16, "relative_attention_num_buckets": 8,
           "relative_attention_max_distance": 16, "pad_token_id": None, "eos_token_id": None}  # fmt: skip


def t5_body(layer: int, table: bool = True, **rest: Any) -> dict[str, Any]:
    """A T5 layer's request: its config, x and T5Attention's q, k, v, o (and a table)."""
    rng = np.random.default_rng(1)
    config = transformers.T5Config(**T5_TINY).to_dict()
    state = {f"{p}.weight": rng.normal(size=(H * D, D_MODEL)) for p in "qkv"}
    state["o.weight"] = rng.normal(size=(D_MODEL, H * D))
    if table:
        state["relative_attention_bias.weight"] = rng.normal(size=(8, H))
    return {"x": rng.normal(size=(L, D_MODEL)), **state, "config": config, "layer": layer,
            "include": ["output"], **rest}  # fmt: skip


def test_a_later_t5_layer_without_layer_0s_table_is_a_422_asking_for_it(
    client: TestClient,
) -> None:
    """T5Stack adds layer 0's bucketed bias on every layer: a later layer's request without
    layer 0's table cannot be computed (no bias would be a 200 with wrong numbers)."""
    error = post(client, "/multihead", t5_body(1, table=False), status=422)["errors"][0]
    assert error["field"] == "relative_attention_bias.weight", error
    assert "layer 0's relative_attention_bias.weight" in error["message"]
    answered = post(client, "/multihead", t5_body(1))["conventions"]["config"]
    assert answered["relative_bias.bidirectional"] == "is_decoder"


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [({**t5_body(0), "relative_attention_bias.weight": np.ones((6, H))},
      "relative_attention_bias.weight", "relative_attention_num_buckets is 8"),
     ({**t5_body(0), "config": None}, "relative_attention_bias.weight", "give the model's config"),
     (t5_body(0, relative_bias={"table": np.ones((8, H)).tolist()}),
      "relative_attention_bias.weight", "same numbers")],
    ids=["rows_not_num_buckets", "without_config", "with_relative_bias"],
)  # fmt: skip
def test_t5s_table_where_it_cannot_be_placed_is_a_422(
    client: TestClient, body: dict[str, Any], field: str, words: str
) -> None:
    error = post(client, "/multihead", body, status=422)["errors"][0]
    assert error["field"] == field and words in error["message"], error


def bert_body(**state: Any) -> dict[str, Any]:
    """A BERT layer's request: its config (layer_norm_eps 1e-3), x, BertAttention's state
    dict as given here."""
    sizes = {k: v for k, v in TINY.items() if k not in ("num_key_value_heads", "head_dim")}
    config = transformers.BertConfig(**sizes, layer_norm_eps=1e-3).to_dict()
    rng = np.random.default_rng(2)
    return {"x": rng.normal(size=(L, D_MODEL)), "config": config, "include": ["output"],
            **{k: rng.normal(size=v) for k, v in state.items()}}  # fmt: skip


QKV = {f"self.{p}.{w}": (D_MODEL, D_MODEL) if w == "weight" else (D_MODEL,)
       for p in ("query", "key", "value") for w in ("weight", "bias")}  # fmt: skip
DENSE = {"output.dense.weight": (D_MODEL, D_MODEL), "output.dense.bias": (D_MODEL,)}
NORM = {"output.LayerNorm.weight": (D_MODEL,), "output.LayerNorm.bias": (D_MODEL,)}


@pytest.mark.parametrize(
    ("state", "field"),
    [({**QKV, **DENSE}, "output.LayerNorm.weight"),
     ({**QKV, **DENSE, "output.LayerNorm.weight": (D_MODEL,)}, "output.LayerNorm.bias"),
     ({**QKV, **NORM}, "output.dense.weight")],
    ids=["dense_without_layernorm", "layernorm_without_bias", "layernorm_without_dense"],
)  # fmt: skip
def test_part_of_berts_output_block_is_a_422_naming_what_is_missing(
    client: TestClient, state: dict[str, Any], field: str
) -> None:
    """BertSelfOutput is dense, the residual and the LayerNorm together: a part of it alone
    would be some other block's numbers."""
    error = post(client, "/multihead", bert_body(**state), status=422)["errors"][0]
    assert error["field"] == field, error


def test_berts_layernorm_without_config_needs_its_eps(client: TestClient) -> None:
    """Without config nothing says BERT's eps (1e-12 in bert-base, not torch's 1e-5): a 422
    naming layer_norm.eps; with layer_norm {"eps"} the block is answered, as the config's."""
    body = {**bert_body(**QKV, **DENSE, **NORM), "config": None, "num_heads": H}
    error = post(client, "/multihead", body, status=422)["errors"][0]
    assert error["field"] == "layer_norm.eps", error
    stated = post(client, "/multihead", {**body, "layer_norm": {"eps": 1e-3}})["output"]
    from_config = post(client, "/multihead", bert_body(**QKV, **DENSE, **NORM))["output"]
    assert np.allclose(stated, from_config, rtol=0, atol=1e-13)


def test_berts_relative_position_embeddings_are_a_422_naming_the_key(client: TestClient) -> None:
    """position_embedding_type relative_key added learned distance embeddings to BERT's
    scores (transformers before 5; 5.23 no longer computes them): refused, not ignored."""
    body = bert_body(**QKV, **DENSE, **NORM)
    body["config"] = {**body["config"], "position_embedding_type": "relative_key"}
    error = post(client, "/multihead", body, status=422)["errors"][0]
    assert error["field"] == "config.position_embedding_type", error
    absolute = {**body["config"], "position_embedding_type": "absolute"}
    assert post(client, "/multihead", {**body, "config": absolute})["output"]


def test_hunyuan_norm_weights_without_qk_norm_are_a_422_and_with_config_are_read(
    client: TestClient,
) -> None:
    """query_layernorm.weight alone cannot say HunYuan's norm follows RoPE or its eps (alone,
    q_norm.weight is Qwen3's, before RoPE): a 422 naming it; with Llama's config the module
    has no such weight; with HunYuan's it is the queries' qk_norm weight, after RoPE, and the
    module's own (left out, or given twice under q_norm.weight: a 422 naming it)."""
    rng = np.random.default_rng(1)
    norms = {
        "query_layernorm.weight": rng.normal(size=D) + 1,
        "key_layernorm.weight": rng.normal(size=D) + 1,
    }
    heads = {"num_heads": H, "num_kv_heads": H_KV}
    error = post(client, "/multihead", layer_body(None, **norms, **heads), status=422)
    first = error["errors"][0]
    assert first["field"] == "query_layernorm.weight" and "after RoPE" in first["message"]
    error = post(client, "/multihead", layer_body(llama(), **norms), status=422)["errors"][0]
    assert error["field"] == "query_layernorm.weight", error
    assert "LlamaAttention has no query_layernorm.weight" in error["message"]
    both = {**norms, "q_norm.weight": norms["query_layernorm.weight"]}
    qk_norm = {"qk_norm": {"eps": 1e-5, "after_rope": True}}
    error = post(client, "/multihead", layer_body(None, **both, **heads, **qk_norm), status=422)
    assert "not both" in error["errors"][0]["message"], error
    config = stock("HunYuanDenseV1Config")
    error = post(client, "/multihead", layer_body(config, **both), status=422)["errors"][0]
    assert error["field"] == "q_norm.weight" and "has no q_norm.weight" in error["message"]
    body = post(client, "/multihead", layer_body(config, **norms))
    assert body["conventions"]["config"]["qk_norm.after_rope"] == "model_type hunyuan_v1_dense"
    weightless = post(client, "/multihead", layer_body(config), status=422)["errors"][0]
    assert weightless["field"] == "query_layernorm.weight", weightless
    assert "which the request lacks" in weightless["message"]


def test_olmoe_with_clip_qkv_is_a_422_saying_it_clamps_after_its_norms(client: TestClient) -> None:
    """OlmoeAttention clamps q, k, v after q_norm/k_norm; the service's clip_qkv clamps right
    after the projections, before qk_norm: not the same numbers, so the key is refused (OLMo's
    clamp, before any norm, is read)."""
    q_rows = {"q_norm.weight": np.ones(H * D), "k_norm.weight": np.ones(H_KV * D)}
    body = layer_body(stock("OlmoeConfig", clip_qkv=None), **q_rows)
    answered = post(client, "/multihead", body)
    assert answered["conventions"]["config"]["qk_norm.over"] == "model_type olmoe"
    body = layer_body(stock("OlmoeConfig", clip_qkv=8.0), **q_rows)
    first = post(client, "/multihead", body, status=422)["errors"][0]
    assert first["field"] == "config.clip_qkv", first
    assert "after its q/k norms" in first["message"], first


def test_olmo2s_norm_weight_of_one_head_is_a_422_naming_it(client: TestClient) -> None:
    """OLMo 2's q_norm.weight is the whole projection's [h·d]: a Qwen3-like [d], or rows
    per head, is refused, naming the weight and the shape it takes."""
    for weight in (np.ones(D), np.ones((H, D))):
        keys = np.ones(H_KV * D)  # the module's k_norm.weight, as it is
        body = layer_body(stock("Olmo2Config"), **{"q_norm.weight": weight, "k_norm.weight": keys})
        first = post(client, "/multihead", body, status=422)["errors"][0]
        assert first["field"] == "q_norm.weight", first


# ---- ALiBi's and the fused projections' families: what transformers 5.23 leaves ambiguous
MOSAIC = {"d_model": D_MODEL, "n_heads": H, "n_layers": 2, "vocab_size": 16}
ALIBI_REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    ("falcon-alibi", transformers.FalconConfig(hidden_size=D_MODEL, num_attention_heads=H,
                                               alibi=True, multi_query=False).to_dict(),
     "config.alibi", "twice on its eager one"),
    ("mpt-alibi_bias_max", transformers.MptConfig(**MOSAIC, attn_config={"alibi_bias_max": 4}
                                                  ).to_dict(),
     "config.attn_config.alibi_bias_max", "always 8"),
    ("mpt-alibi-off", transformers.MptConfig(**MOSAIC, attn_config={"alibi": False}).to_dict(),
     "config.attn_config.alibi", "always on"),
    ("mpt-qk_ln", transformers.MptConfig(**MOSAIC, attn_config={"qk_ln": True}).to_dict(),
     "config.attn_config.qk_ln", "q/k LayerNorms"),
    ("dbrx-rope_theta", transformers.DbrxConfig(**MOSAIC, attn_config={"rope_theta": 5e5}
                                                ).to_dict(),
     "config.attn_config.rope_theta", "rope_theta 10000.0 and never reads this one"),
    ("bloom-slow_but_exact", transformers.BloomConfig(
        hidden_size=D_MODEL, n_head=H, pretraining_tp=2, slow_but_exact=True).to_dict(),
     "config.slow_but_exact", "without dense.bias"),
]  # fmt: skip


@pytest.mark.parametrize(("config", "field", "says"), [r[1:] for r in ALIBI_REFUSALS],
                         ids=[r[0] for r in ALIBI_REFUSALS])  # fmt: skip
def test_what_bloom_mpt_dbrx_and_falcon_leave_ambiguous_is_a_422_naming_the_key(
    client: TestClient, config: dict[str, Any], field: str, says: str
) -> None:
    """Falcon's ALiBi (5.23's eager path adds it twice, its sdpa path once), MPT's attn_config
    keys transformers ignores (alibi_bias_max, alibi off, qk_ln), DBRX's attn_config.rope_theta
    unused by 5.23, BLOOM's slow_but_exact dropping dense.bias: each refused, naming the key;
    the same configs without them are answered (tests/wire/test_config_layers.py)."""
    error = post(client, "/multihead", layer_body(config), status=422)["errors"][0]
    assert error["field"] == field, error
    assert says in error["message"], error


def test_alibi_origin_with_symmetric_is_a_422_naming_alibi_origin(client: TestClient) -> None:
    body = {"x": np.eye(3), "w_q": np.eye(3), "w_k": np.eye(3), "w_v": np.eye(3),
            "alibi": {"symmetric": True, "origin": "zero"}}  # fmt: skip
    error = post(client, "/attention", body, status=422)["errors"][0]
    assert error["field"] == "alibi.origin", error
    assert "from the query" in error["message"]


# ---- GPT-2, GPTBigCode, CodeGen: their flags, CodeGen's rotary_dim, GPT-2's cross-attention
GPT_TINY = {"n_embd": D_MODEL, "n_head": H, "n_layer": 2, "vocab_size": 16, "n_positions": 16,
            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}  # fmt: skip


def gpt(name: str, **changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = getattr(transformers, name)(**{**GPT_TINY, **changes}).to_dict()
    return config


def gpt2_body(config: dict[str, Any], **rest: Any) -> dict[str, Any]:
    """A GPT-2 self-attention layer's state dict as it is: c_attn and c_proj, Conv1Ds."""
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(L, D_MODEL)), "c_attn.weight": rng.normal(size=(D_MODEL, 3 * D_MODEL)),
            "c_attn.bias": rng.normal(size=3 * D_MODEL), "c_proj.bias": rng.normal(size=D_MODEL),
            "c_proj.weight": rng.normal(size=(D_MODEL, D_MODEL)), "config": config,
            "include": ["output"], **rest}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "key"),
    [({**gpt("GPTBigCodeConfig"), "multi_query": "yes"}, "multi_query"),
     ({**gpt("GPT2Config"), "scale_attn_weights": 1}, "scale_attn_weights"),
     ({**gpt("GPT2Config"), "scale_attn_by_inverse_layer_idx": "true"},
      "scale_attn_by_inverse_layer_idx")],
    ids=["gpt_bigcode_multi_query", "gpt2_scale_attn_weights", "gpt2_inverse_layer_idx"],
)  # fmt: skip
def test_a_gpt2_flag_that_is_not_true_or_false_is_a_422_naming_it(
    client: TestClient, config: dict[str, Any], key: str
) -> None:
    """GPT2Attention and GPTBigCodeAttention read these as ``if config.<key>``: a string or a
    number would be read by its truthiness, which the service does not guess at."""
    error = post(client, "/multihead", gpt2_body(config), status=422)["errors"][0]
    assert error["field"] == f"config.{key}", error
    assert "takes true or false" in error["message"]


def test_codegen_without_rotary_dim_is_a_422_naming_it(client: TestClient) -> None:
    """CodeGenModel's min(rotary_dim, n_ctx // n_head) fails on null (GPT-J's one head would
    turn whole): no layer to reproduce; with rotary_dim the same config is answered."""
    rng = np.random.default_rng(0)
    body = {"x": rng.normal(size=(L, D_MODEL)), "num_kv_heads": None,
            "qkv_proj.weight": rng.normal(size=(3 * D_MODEL, D_MODEL)),
            "out_proj.weight": rng.normal(size=(D_MODEL, D_MODEL))}  # fmt: skip
    null = {**gpt("CodeGenConfig", n_head=4), "rotary_dim": None}  # 4 heads: CodeGen's blocks
    error = post(client, "/multihead", {**body, "config": null}, status=422)["errors"][0]
    assert error["field"] == "config.rotary_dim", error
    assert "min(rotary_dim, n_ctx // n_head)" in error["message"]
    assert "rope.rotary_dim" in error["message"]
    answered = post(client, "/multihead", {**body, "config": gpt("CodeGenConfig", n_head=4,
                                                                  rotary_dim=2)})  # fmt: skip
    assert answered["conventions"]["config"]["qkv_layout"] == "model_type codegen"


def test_a_gpt2_cross_attention_state_dict_is_a_422_naming_q_attn(client: TestClient) -> None:
    """add_cross_attention adds a second layer (crossattention, with q_attn and a [d][2d]
    c_attn) beside the self-attention layer the config describes; its state dict is refused by
    its q_attn, never read as a self-attention layer's."""
    config = gpt("GPT2Config", add_cross_attention=True)
    answered = post(client, "/multihead", gpt2_body(config))
    assert "add_cross_attention" in answered["conventions"]["config_keys"]
    rng = np.random.default_rng(1)
    cross = gpt2_body(config, **{"q_attn.weight": rng.normal(size=(D_MODEL, D_MODEL))})
    cross["c_attn.weight"] = rng.normal(size=(D_MODEL, 2 * D_MODEL))
    error = post(client, "/multihead", cross, status=422)["errors"][0]
    assert error["field"] == "q_attn.weight", error
