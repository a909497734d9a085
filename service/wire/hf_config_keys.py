"""Which ``config.json`` keys the service reads, per model type, and which it judges not to
change one attention layer's numbers (API.md, "A config as it is, third edition": known or
refused; every key that changes attention honoured or refused).

The reference is each family's transformers 5.23 ``modeling_<family>.py`` (the ``config.<key>``
its attention, rotary embedding and mask code reads) and ``configuration_<family>.py`` (every
key of ``AutoConfig.for_model(model_type).to_dict()`` is a row below). A key's row says:

- ``reads``: the model types whose reading applies it (``*``: every verified type);
- ``inert``: the model types where it does not change the attention layer's numbers (vocabulary,
  MLP and MoE sizes, dropout — the service computes in eval mode —, initialisation, token ids,
  the block's own norms, biases the state dict brings …); ``*``: every type;
- ``neutral``: values with which the key changes nothing where it is neither read nor inert
  (null, or the value meaning "off").

A key present where it is neither read nor inert, with a value that is not neutral, is a 422
naming it; a key in no row is a 422 too unless null or false (the service has not judged it).
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


def _words(text: str) -> list[str]:
    return text.split()


# the model types /multihead reproduces to 1e-10 from their config alone, and the multimodal
# types whose ``text_config`` is one of them
VERIFIED = _words("""
    llama mistral mixtral ministral qwen2 qwen2_moe qwen3 qwen3_moe qwen3_next gemma gemma2
    gemma3_text gemma4_text starcoder2 smollm3 deepseek_v2 deepseek_v3 gpt_oss llama4_text
    phimoe nemotron seed_oss phi3
""")
VERIFIED += _words("glm4_moe apertus exaone4 cohere2 qwen3_5_text qwen3_5_moe_text")
VERIFIED += _words("granite granitemoe olmo helium ernie4_5 glm glm4")
VERIFIED += _words("opt")
VERIFIED += _words("phi")
VERIFIED += _words("stablelm")
VERIFIED += _words("gpt_neox")  # its fused query_key_value: service.wire.fused
VERIFIED += _words("bert roberta t5")  # the encoders (and T5's decoder self-attention)
VERIFIED += _words("gptj")
VERIFIED += _words("hunyuan_v1_dense")
VERIFIED += _words("ministral3")
VERIFIED += _words("olmo2 olmo3 olmoe cohere")  # q/k norms over the projection, per head
VERIFIED += _words("bloom mpt dbrx falcon")  # ALiBi's origins, Wqkv, Falcon's three layouts
# GPT-2's and GPTBigCode's fused c_attn, CodeGen's qkv_proj in blocks: service.wire.fused
VERIFIED += _words("gpt2 gpt_bigcode codegen")
COMPOSITE = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "llama4": "llama4_text"}
COMPOSITE |= {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
# model types judged and left refused: what the request cannot express
REFUSED: dict[str, str] = {}

# a model type's own names for the keys hf_config.py reads: {model type: {the key as
# hf_config.py names it (Llama's name): the names that type's config.json may give it, read in
# that order}}. The type's configuration class maps the one to the other (its
# ``attribute_map``) and ``to_dict()`` writes its own name: GPT-J's ``n_head`` first, then
# Llama's ``num_attention_heads``; T5's own names only. Each own name is a row of KEYS read
# for its types (added below); its default is in DEFAULTS under the own name.
KEY_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "gptj": {
        "num_attention_heads": ("n_head", "num_attention_heads"),
        "hidden_size": ("n_embd", "hidden_size"),
        "max_position_embeddings": ("n_positions", "max_position_embeddings"),
        "num_hidden_layers": ("n_layer", "num_hidden_layers"),
    },
    # T5Config's attribute_map (a decoder's layers: hf_config's num_decoder_layers)
    "t5": {
        "num_attention_heads": ("num_heads",),
        "hidden_size": ("d_model",),
        "head_dim": ("d_kv",),
        "num_hidden_layers": ("num_layers",),
    },
}
# GPT-2's, GPTBigCode's and CodeGen's configuration classes map the same four (attribute_map)
KEY_NAMES |= {t: dict(KEY_NAMES["gptj"]) for t in _words("gpt2 gpt_bigcode codegen")}

# BLOOM (its old config.json's n_embed, which BloomConfig reads as hidden_size), MPT and DBRX
# (their attn_config's keys named ``attn_config.<key>``), Falcon (num_kv_heads)
_MOSAIC = {
    "num_attention_heads": "n_heads",
    "hidden_size": "d_model",
    "num_hidden_layers": "n_layers",
    "max_position_embeddings": "max_seq_len",
    "clip_qkv": "attn_config.clip_qkv",
}
_OWN_FIRST = {  # {model type: {our name: its own name}}, read own name first, then ours
    "bloom": {
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
        "hidden_size": "n_embed",
    },
    "mpt": _MOSAIC,
    "dbrx": _MOSAIC | {"num_key_value_heads": "attn_config.kv_n_heads"},
    "falcon": {"num_key_value_heads": "num_kv_heads"},
}
KEY_NAMES |= {
    t: {ours: (own, ours) for ours, own in names.items()} for t, names in _OWN_FIRST.items()
}
# config keys holding a nested config whose keys are judged one by one, as ``<key>.<its key>``
# (a row of that full name, else the plain key's row: its generic keys)
NESTED = {"mpt": ("attn_config",), "dbrx": ("attn_config",)}

_ALL = "*"
_SLIDING = (
    "mistral mixtral ministral qwen2 qwen2_moe qwen3 qwen3_moe gemma2 gemma3_text gemma4_text "
    "starcoder2 smollm3 gpt_oss phimoe phi3"
)
_SLIDING += " exaone4 cohere2"
_SLIDING += " ministral3"
_SLIDING += " olmo3"
_LAYER_TYPES = (
    "ministral qwen2 qwen2_moe qwen3 qwen3_next gemma2 gemma3_text gemma4_text smollm3 gpt_oss "
    "llama4_text"
)
_QWEN3_5 = "qwen3_5_text qwen3_5_moe_text"
_LAYER_TYPES += f" exaone4 cohere2 {_QWEN3_5}"
_LAYER_TYPES += " olmo3"
_QK_NORM = "qwen3 qwen3_moe qwen3_next gemma3_text gemma4_text llama4_text"
_QK_NORM += f" glm4_moe apertus exaone4 {_QWEN3_5}"
_QK_NORM += " hunyuan_v1_dense"
_QK_NORM += " olmo2 olmo3 olmoe"  # their RMSNorms over the whole projection
_MLA = "deepseek_v2 deepseek_v3"
_GEMMAS = "gemma gemma2 gemma3_text gemma4_text"
_GRANITES = "granite granitemoe"  # attention_multiplier is their scale
_BERTS = "bert roberta"  # BertAttention: self-attention, then output.dense, residual, LayerNorm
_ENCODERS = f"{_BERTS} t5"


class ConfigError(ValueError):
    """``field``: the request field or config key at fault (``layer``, ``config.head_dim``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Key:
    reads: str = ""  # model types whose reading applies it ("*": all)
    inert: str = ""  # model types where it does not change the layer ("*": all)
    neutral: tuple[Any, ...] = (None,)  # values that change nothing elsewhere
    why: str = ""  # what it does where the service does not apply it


_READ = Key(reads=_ALL)
_INERT = Key(inert=_ALL)
_OFF = (None, False)

# one row per key (keys as rows); a key missing here is unjudged
KEYS: dict[str, Key] = {
    # ---- read: the layer's sizes, rope, masks and variants (service.wire.hf_config)
    **{
        k: _READ
        for k in _words("""
            model_type text_config num_attention_heads num_key_value_heads head_dim hidden_size
            num_hidden_layers rope_theta rope_scaling rope_parameters partial_rotary_factor
            max_position_embeddings original_max_position_embeddings
        """)
    },
    "sliding_window": Key(reads=_SLIDING, why="a sliding-window mask"),
    "use_sliding_window": Key(
        reads="qwen2 qwen2_moe qwen3 qwen3_moe smollm3", neutral=_OFF, why="a sliding-window mask"
    ),
    "max_window_layers": Key(reads="qwen2 qwen2_moe qwen3", inert=_ALL),
    "layer_types": Key(reads=_LAYER_TYPES, inert=_ALL),  # the others' masks ignore it
    "sliding_window_pattern": Key(reads="gemma3_text exaone4 cohere2", inert=_ALL),
    "_sliding_window_pattern": Key(reads="gemma3_text", inert=_ALL),
    "rope_local_base_freq": Key(reads="gemma3_text", why="the sliding layers' RoPE base"),
    "rms_norm_eps": Key(reads=_QK_NORM, inert=_ALL),  # elsewhere the block's norms only
    "use_qk_norm": Key(  # HunYuan's attention always has its q/k norms, whatever it says
        reads="llama4_text glm4_moe cohere",
        inert="cohere2 hunyuan_v1_dense",
        neutral=_OFF,
        why="q/k norms",
    ),
    "query_pre_attn_scalar": Key(reads="gemma2 gemma3_text", why="the scale"),
    "attn_logit_softcapping": Key(
        reads="gemma2", inert="gemma3_text gemma4_text", why="a tanh cap on the scores"
    ),
    "use_bidirectional_attention": Key(reads=_GEMMAS, neutral=_OFF, why="no causal mask"),
    "per_layer_config": Key(reads="gemma4_text"),
    "global_head_dim": Key(reads="gemma4_text", why="the full layers' head size"),
    "num_global_key_value_heads": Key(reads="gemma4_text", why="the full layers' kv heads"),
    "attention_k_eq_v": Key(reads="gemma4_text", neutral=_OFF, why="values from the keys"),
    "num_kv_shared_layers": Key(
        neutral=(None, 0), why="the last layers reuse an earlier layer's keys and values"
    ),
    "full_attention_interval": Key(reads=f"qwen3_next {_QWEN3_5}", why="which layers attend"),
    "no_rope_layers": Key(reads="smollm3 llama4_text", why="layers without RoPE"),
    "no_rope_layer_interval": Key(reads="smollm3 llama4_text", why="layers without RoPE"),
    "attention_chunk_size": Key(reads="llama4_text", why="a chunked mask"),
    "attn_temperature_tuning": Key(
        reads="llama4_text", neutral=_OFF, why="a temperature on the queries"
    ),
    "floor_scale": Key(reads="llama4_text", inert=_ALL),
    "attn_scale": Key(reads="llama4_text", inert=_ALL),
    "rope_interleave": Key(reads="deepseek_v3", why="the interleaved rotation"),
    **{
        k: Key(reads=_MLA, why="multi-head latent attention")
        for k in _words("q_lora_rank kv_lora_rank qk_nope_head_dim qk_rope_head_dim v_head_dim")
    },
    # ---- biases: the state dict brings them, as it brings gpt-oss's sinks; which the module
    # has, by these keys, is checked against the state dict (service.wire.hf_parameters)
    **{k: _INERT for k in _words("attention_bias qkv_bias use_bias attention_out_bias")},
    # ---- change attention; applied only for the types in reads (OLMo's clamp, Granite's scale)
    "clip_qkv": Key(
        reads="olmo",
        why="q, k, v clamped to ±clip_qkv; OLMoE clamps them after its q/k norms, where the "
        "service's clip_qkv clamps right after the projections, before qk_norm",
    ),
    "attention_multiplier": Key(reads=_GRANITES, why="the scale (Granite)"),
    # Granite's multipliers outside the attention module (embeddings, residual, logits)
    **{
        k: Key(inert=_GRANITES)
        for k in _words("embedding_multiplier residual_multiplier logits_scaling")
    },
    "qk_layernorm": Key(
        reads="phi stablelm",
        neutral=_OFF,
        why="q/k LayerNorms over each head's features (Phi's with a weight and a bias, "
        "StableLM's with a weight per head)",
    ),
    "rotary_dim": Key(reads="gptj", why="a partial rotation"),
    "rotary_pct": Key(inert="cohere2", why="a partial rotation"),
    "rotary_emb_base": Key(why="the RoPE base"),
    "position_embedding_type": Key(
        inert="cohere2",
        neutral=(None, "absolute"),  # learned positions added to the embeddings, outside
        why="the position encoding (BERT's relative_key and relative_key_query added learned "
        "distance embeddings to the scores; transformers 5.23 no longer computes them)",
    ),
    "alibi": Key(reads="falcon", neutral=_OFF, why="ALiBi"),
    "use_alibi": Key(neutral=_OFF, why="ALiBi"),
    "use_logn_attn": Key(neutral=_OFF, why="log-n query scaling"),
    "scale_attn_by_inverse_layer_idx": Key(neutral=_OFF, why="the scale"),
    "llama_4_scaling_beta": Key(why="a position-dependent query scale"),
    # BERT's block LayerNorm, the q/k LayerNorms' eps (Cohere, Phi, StableLM); elsewhere the
    # block's norms
    "layer_norm_eps": Key(
        reads=f"{_BERTS} cohere phi stablelm",
        inert="cohere2 gpt_neox",
        why="the q/k LayerNorms' eps (Cohere)",
    ),
    "classifier_dropout": _INERT,  # a classification head's, in training
    # ---- Cohere's own config.json keys that 5.23's Cohere2 modeling never reads
    **{
        k: Key(inert="cohere2", why="Cohere's layer layout")
        for k in _words("""
            layer_switch order_of_interleaved_layers use_parallel_block use_parallel_embedding
            use_embedding_sharing use_gated_activation
        """)
    },
    # ---- never the attention layer's numbers (the families of the second batch)
    **{
        k: _INERT
        for k in _words("logit_scale vision_start_token_id vision_end_token_id num_mtp_layers")
    },
    # ---- OPT's block around the layer: its learned positions join x before the first layer,
    # its LayerNorms (before or after the block), the MLP; enable_bias: the state dict's biases
    **{
        k: Key(inert="opt")
        for k in _words("""
            do_layer_norm_before _remove_final_layer_norm word_embed_proj_dim ffn_dim
            layer_norm_elementwise_affine enable_bias
        """)
    },
    # ---- GPT-J's block around the layer (its MLP, LayerNorm, dropouts: eval mode)
    **{k: Key(inert="gptj") for k in _words("n_inner attn_pdrop")},
    # GPT-J's and T5's block norms (T5's RMSNorm before the attention module)
    "layer_norm_epsilon": Key(inert="gptj t5 bloom mpt dbrx falcon"),
    "eod_token_id": _INERT,  # HunYuan's end-of-document token
    "activation_function": Key(inert="opt gptj"),  # their MLPs'
    # GPT-J's config.json (written by transformers 4.x): GPTJAttention always rotates and always
    # divides by sqrt(head_dim), whatever these say (GPT-2's attention reads the second)
    "rotary": Key(inert="gptj", neutral=(None, True), why="whether the layer rotates"),
    "scale_attn_weights": Key(inert="gptj", neutral=(None, True), why="the scale"),
    # the sequence-summary head of old configs (a classifier over the last hidden state), the
    # tokenizer, generation defaults
    **{
        k: _INERT
        for k in _words("""
            summary_type summary_use_proj summary_activation summary_proj_to_labels
            summary_first_dropout tokenizer_class task_specific_params
        """)
    },
    **{k: _INERT for k in _words("dropout layerdrop init_std")},  # training only
    # StableLM: its q, k, v biases come with the state dict; the parallel residual is the block's
    "use_qkv_bias": Key(inert="stablelm"),
    "use_parallel_residual": Key(inert="stablelm gpt_neox"),
    # ---- the encoders: BERT's and RoBERTa's block, T5's names and its relative bias
    # GPTNeoXConfig writes is_decoder false, yet its every layer is causal (GPTNeoXModel's mask)
    "is_decoder": Key(
        reads=_ENCODERS, inert="gpt_neox", neutral=_OFF, why="a decoder's causal mask"
    ),
    **{
        k: Key(reads="t5")
        for k in _words("""
            num_heads d_model d_kv num_layers num_decoder_layers relative_attention_num_buckets
            relative_attention_max_distance
        """)
    },
    # T5's feed-forward, dropouts and initialisation; BERT's token types, dropouts, cross-attention layers
    **{
        k: Key(inert="t5")
        for k in _words("""
            d_ff dropout_rate initializer_factor feed_forward_proj
            dense_act_fn is_gated_act scale_decoder_outputs n_positions output_past
        """)
    },
    **{
        k: Key(inert=_BERTS)
        for k in _words("type_vocab_size hidden_dropout_prob attention_probs_dropout_prob")
    },
    "add_cross_attention": Key(inert=_BERTS, neutral=_OFF, why="cross-attention layers"),
    # ---- BLOOM, MPT, DBRX, Falcon: ALiBi's and the fused projections' families
    "n_embed": Key(why="the hidden size"),  # BLOOM's old name (KEY_NAMES), read for it
    # the blocks around the layer: their LayerNorms, residual order, MLPs and embeddings;
    # BLOOM's pretraining_tp slices of dense (slow_but_exact) sum the same products
    **{
        k: Key(inert="bloom mpt dbrx falcon")
        for k in _words("""
            apply_residual_connection_post_layernorm slow_but_exact
            expansion_ratio emb_pdrop learned_pos_emb init_device no_bias embedding_fraction
            norm_type parallel_attn num_ln_in_parallel_attn ffn_hidden_size activation bias
        """)
    },
    "ffn_config": Key(inert="dbrx"),  # its experts
    "attn_config": Key(reads="mpt dbrx", why="MPT's and DBRX's attention settings"),
    "attn_config.attn_pdrop": Key(inert="mpt dbrx"),
    "attn_config.attn_impl": Key(inert="mpt"),  # transformers' MptAttention is one code path
    "attn_config.softmax_scale": Key(reads="mpt", why="the scale"),
    # transformers 5.23's MptModel adds ALiBi with the slopes of alibi_bias_max 8 whatever these
    # say, and its MptAttention has neither q/k LayerNorms, multi-query heads, a prefix-LM mask
    # nor sequence ids; MPT's own code honours them: any other value is refused
    "attn_config.alibi": Key(neutral=(True,), why="ALiBi on or off (transformers: always on)"),
    "attn_config.alibi_bias_max": Key(
        neutral=(8,), why="the slopes 2^(−alibi_bias_max·h/n) (transformers: always 8)"
    ),
    "attn_config.attn_type": Key(
        neutral=("multihead_attention",), why="multi-query heads (transformers: multi-head)"
    ),
    "attn_config.qk_ln": Key(neutral=_OFF, why="q/k LayerNorms (transformers: none)"),
    "attn_config.prefix_lm": Key(neutral=_OFF, why="a prefix-LM mask (transformers: causal)"),
    "attn_config.attn_uses_sequence_id": Key(
        neutral=_OFF, why="a mask between packed sequences (transformers: none)"
    ),
    # DBRX's: transformers 5.23 rotates at rope_parameters' rope_theta and never uses this one
    "attn_config.rope_theta": Key(reads="dbrx", why="the RoPE base"),
    # Falcon: its fused layout and kv heads; alibi (read, refused when true: hf_config)
    "new_decoder_architecture": Key(reads="falcon", neutral=_OFF, why="the grouped layout"),
    "multi_query": Key(reads="falcon", neutral=_OFF, why="one key/value head"),
    "n_head_kv": Key(why="Falcon's old kv heads (transformers 5.23 reads num_kv_heads)"),
    # ---- never the attention layer's numbers
    **{
        k: _INERT
        for k in _words("""
        _name_or_path architectures transformers_version dtype torch_dtype auto_map
        output_hidden_states output_attentions return_dict chunk_size_feed_forward
        is_encoder_decoder id2label label2id problem_type use_cache tie_word_embeddings
        bos_token_id eos_token_id pad_token_id sep_token_id decoder_start_token_id
        initializer_range vocab_size intermediate_size hidden_act hidden_activation mlp_bias
        pretraining_tp lm_head_bias final_logit_softcapping norm_eps norm_epsilon
        attention_dropout hidden_dropout residual_dropout embedding_dropout resid_pdrop
        embd_pdrop quantization_config cache_implementation sliding_window_size
        num_experts_per_tok num_local_experts num_experts output_router_logits
        router_aux_loss_coef router_jitter_noise input_jitter_noise moe_intermediate_size
        shared_expert_intermediate_size decoder_sparse_step mlp_only_layers norm_topk_prob
        n_group n_routed_experts n_shared_experts routed_scaling_factor topk_group topk_method
        first_k_dense_replace moe_layers interleave_moe_layer_step intermediate_size_mlp
        swiglu_alpha swiglu_limit num_nextn_predict_layers ep_size moe_layer_freq scoring_func
        aux_loss_alpha seq_aux experts_per_token qk_head_dim initial_context_length
        linear_conv_kernel_dim linear_key_head_dim linear_value_head_dim linear_num_key_heads
        linear_num_value_heads vocab_size_per_layer_input hidden_size_per_layer_input
        enable_moe_block use_double_wide_mlp top_k_experts for_llm_compressor full_attn_mod
        interpolate_factor vision_config audio_config mm_tokens_per_image
        boi_token_index eoi_token_index image_token_index boi_token_id eoi_token_id
        image_token_id video_token_id boa_token_id eoa_token_index audio_token_id
    """)
    },
}

# ---- GPT-2, GPTBigCode, CodeGen: their own keys, and the block's keys they share with GPT-J
_GPT2S = "gpt2 gpt_bigcode"
KEYS |= {
    # GPT2Attention: head_dim^-½ when true, else 1; divided by layer_idx + 1 when the second is
    "scale_attn_weights": replace(KEYS["scale_attn_weights"], reads=_GPT2S),
    "scale_attn_by_inverse_layer_idx": replace(
        KEYS["scale_attn_by_inverse_layer_idx"], reads="gpt2"
    ),
    # GPTBigCodeConfig: one key/value head when true (c_attn's rows [q; k; v]), else every
    # head its own (c_attn viewed per head); it writes num_key_value_heads from it
    "multi_query": replace(KEYS["multi_query"], reads="falcon gpt_bigcode"),
    "rotary_dim": replace(KEYS["rotary_dim"], reads=f"{KEYS['rotary_dim'].reads} codegen"),
    # float32 for float16 models only: the same numbers in exact arithmetic. GPT-2's reorder
    # computes q·k in float32 with the scale folded in (baddbmm's alpha); GPTBigCode's 5.23
    # modeling stores its two flags and never reads them (its eager softmax is float32 always)
    "reorder_and_upcast_attn": Key(inert="gpt2", neutral=_OFF, why="float32 scores"),
    "attention_softmax_in_fp32": Key(inert="gpt_bigcode", neutral=_OFF, why="the softmax"),
    "scale_attention_softmax_in_fp32": Key(inert="gpt_bigcode", neutral=_OFF, why="the scale"),
    # a second, cross-attention layer in each block (crossattention, with its own q_attn): the
    # self-attention layer is unchanged, and a q_attn.weight in the state dict is refused
    "add_cross_attention": replace(
        KEYS["add_cross_attention"], inert=f"{KEYS['add_cross_attention'].inert} {_GPT2S}"
    ),
    # CodeGenModel's min(rotary_dim, n_ctx // n_head) is stored, never used: the layer reads
    # config.rotary_dim
    "n_ctx": Key(inert="codegen", why="the rotary size"),
}
for _key in _words("n_inner layer_norm_epsilon attn_pdrop activation_function"):
    KEYS[_key] = replace(KEYS[_key], inert=f"{KEYS[_key].inert} {_GPT2S} codegen")


def _holds(types: str, model_type: str) -> bool:
    return types == _ALL or model_type in types.split()


for _type, _names in KEY_NAMES.items():  # a type's own key names are read for it
    for _own in {name for names in _names.values() for name in names}:
        _row = KEYS.get(_own, Key())
        if not _holds(_row.reads, _type):
            KEYS[_own] = replace(_row, reads=f"{_row.reads} {_type}".strip())


def _neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    return any(value is n or (type(value) is type(n) and value == n) for n in neutral)


def unread_keys(config: Mapping[str, Any], model_type: str, prefix: str = "") -> list[str]:
    """The keys of ``config`` judged not to change ``model_type``'s attention layer (sorted,
    named ``prefix + key``); a :class:`ConfigError` for the first that would change it unread."""
    inert = []
    for key in config:
        name = f"{prefix}{key}"
        row, value = KEYS.get(name, KEYS.get(str(key))), config[key]
        if row is None:
            if not _neutral(value, _OFF):
                raise ConfigError(
                    f"config.{name}",
                    f"{name} is not a key the service knows for model_type "
                    f"{model_type}: it cannot tell whether it changes the attention"
                    " layer. Leave it out if the model's attention does not use it,"
                    f" or state the layer's fields without config",
                )
        elif _holds(row.reads, model_type):
            continue
        elif _holds(row.inert, model_type) or _neutral(value, row.neutral):
            inert.append(name)
        else:
            raise ConfigError(
                f"config.{name}",
                f"{name} ({value!r}) is not supported for model_type "
                f"{model_type}: it changes the attention layer ({row.why}) and "
                "the service does not apply it there. State the layer's fields "
                "without config, or leave the key out if the model does not use "
                "it",
            )
    return sorted(inert)


_GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
_GEMMA4_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {
        "rope_type": "proportional",
        "partial_rotary_factor": 0.25,
        "rope_theta": 1_000_000.0,
    },
}
_MINISTRAL3_ROPE = {  # Ministral3Config's (its max_position_embeddings entry unread: inert)
    "type": "yarn",
    "rope_theta": 1_000_000.0,
    "factor": 16.0,
    "original_max_position_embeddings": 16384,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale_all_dim": 1.0,
    "mscale": 1.0,
    "llama_4_scaling_beta": 0.1,
}
_APERTUS_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 12_000_000.0,
    "factor": 8.0,
    "original_max_position_embeddings": 8192,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
}
_BERT_DEFAULTS = {
    "hidden_size": 768,
    "num_attention_heads": 12,
    "layer_norm_eps": 1e-12,
    "is_decoder": False,
}
# the transformers 5.23 configuration classes' defaults for the keys hf_config.py reads, per
# family (hf_config.py's _FAMILIES)
DEFAULTS: dict[str, dict[str, Any]] = {
    "": {"rope_theta": 10_000.0},
    "mistral": {"sliding_window": 4096},
    "qwen": {"use_sliding_window": False, "max_window_layers": 28},
    "qwen3": {
        "head_dim": 128,
        "use_sliding_window": False,
        "max_window_layers": 28,
        "rms_norm_eps": 1e-6,
    },
    "qwen3_moe": {"use_sliding_window": False, "sliding_window": 4096, "rms_norm_eps": 1e-6},
    "mixtral": {"rope_theta": 1e6},
    "phimoe": {"rope_theta": 1e6},
    "ministral": {"sliding_window": 4096},
    "gemma": {"head_dim": 256},
    "smollm3": {"rope_theta": 2e6, "use_sliding_window": False, "no_rope_layer_interval": 4},
    "nemotron": {"partial_rotary_factor": 0.5},
    "gemma2": {
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "attn_logit_softcapping": 50.0,
        "sliding_window": 4096,
    },
    "gemma3": {
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "rms_norm_eps": 1e-6,
    },
    "gemma4": {
        "head_dim": 256,
        "sliding_window": 512,
        "global_head_dim": 512,
        "rms_norm_eps": 1e-6,
        "rope_parameters": _GEMMA4_ROPE,
    },
    "gpt_oss": {
        "head_dim": 64,
        "sliding_window": 128,
        "rope_theta": 150_000.0,
        "rope_parameters": _GPT_OSS_ROPE,
    },
    "phi3": {"original_max_position_embeddings": 4096},
    "deepseek": {"rope_interleave": True},
    "qwen3_next": {
        "head_dim": 256,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-6,
        "full_attention_interval": 4,
    },
    "glm4_moe": {"rms_norm_eps": 1e-5, "partial_rotary_factor": 0.5, "use_qk_norm": False},
    "apertus": {"rms_norm_eps": 1e-5, "rope_parameters": _APERTUS_ROPE},
    "exaone4": {"rms_norm_eps": 1e-5, "sliding_window": 4096, "sliding_window_pattern": 4},
    "cohere2": {"sliding_window": 4096, "sliding_window_pattern": 4},
    "granite": {"attention_multiplier": 1.0},
    "helium": {"head_dim": 128, "rope_theta": 100_000.0},
    # the encoders' 5.23 defaults (T5's under its own names: hf_config._NAMES)
    "bert": _BERT_DEFAULTS,
    "roberta": _BERT_DEFAULTS,
    "t5": {
        "is_decoder": False,
        "d_model": 512,
        "d_kv": 64,
        "num_heads": 8,
        "num_layers": 6,
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
    },
    "ministral3": {"head_dim": 128, "rope_parameters": _MINISTRAL3_ROPE},
    "gptj": {"n_head": 16, "n_embd": 4096, "n_positions": 2048, "n_layer": 28, "rotary_dim": 64},
    "phi": {"partial_rotary_factor": 0.5, "layer_norm_eps": 1e-5, "qk_layernorm": False},
    "stablelm": {"partial_rotary_factor": 0.25, "layer_norm_eps": 1e-5, "qk_layernorm": False},
    "olmo2": {"rms_norm_eps": 1e-5},
    "olmo3": {"rms_norm_eps": 1e-5, "rope_theta": 500_000.0, "sliding_window": 4096},
    "olmoe": {"rms_norm_eps": 1e-5},
    "cohere": {"layer_norm_eps": 1e-5, "use_qk_norm": False, "rope_theta": 500_000.0},
    "bloom": {"n_head": 8, "n_layer": 2, "n_embed": 64},
    "mpt": {"n_heads": 16, "d_model": 2048, "n_layers": 24, "max_seq_len": 2048},
    "dbrx": {
        "n_heads": 16,
        "d_model": 2048,
        "n_layers": 24,
        "max_seq_len": 2048,
        "attn_config.kv_n_heads": 1,
    },
    "falcon": {
        "num_attention_heads": 71,
        "hidden_size": 4544,
        "num_hidden_layers": 32,
        "new_decoder_architecture": False,
        "multi_query": True,
        "alibi": False,
    },
    "gpt2": {"n_head": 12, "n_embd": 768, "n_positions": 1024, "n_layer": 12}
    | {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False},
    "gpt_bigcode": {"n_head": 12, "n_embd": 768, "n_positions": 1024, "n_layer": 12}
    | {"scale_attn_weights": True, "multi_query": True},
    "codegen": {"n_head": 16, "n_embd": 4096, "n_positions": 2048, "n_layer": 28, "rotary_dim": 64},
    "ernie4_5": {"head_dim": 128, "rope_theta": 500_000.0},
    "glm": {"head_dim": 128, "partial_rotary_factor": 0.5},
    "llama4": {
        "head_dim": 128,
        "rope_theta": 500_000.0,
        "rms_norm_eps": 1e-5,
        "use_qk_norm": True,
        "attention_chunk_size": 8192,
        "no_rope_layer_interval": 4,
        "attn_temperature_tuning": True,
        "floor_scale": 8192,
        "attn_scale": 0.1,
    },
}


INT_MAX = 2**31 - 1  # sizes, windows and positions beyond it are no model's


def as_size(value: Any, where: str, least: int = 1) -> int:
    """A size: an integer (or an integral float) from ``least`` to 2³¹ − 1."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= INT_MAX + 1:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= INT_MAX:
        raise ConfigError(
            f"config.{where}",
            f"{where} is {shown(value)}: it takes an integer from {least} to {INT_MAX}",
        )
    return value


# what a number read from a config may be: (lowest, highest, the lowest itself allowed)
POSITIVE = (0.0, math.inf, False)
NON_NEGATIVE = (0.0, math.inf, True)
ANY = (-math.inf, math.inf, True)
SHARE = (0.0, 1.0, False)


def as_number(value: Any, where: str, bounds: tuple[float, float, bool] = ANY) -> float:
    """A finite number within ``bounds``; the config key ``where`` named when it is not."""
    low, high, low_in = bounds
    number = math.nan
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value) if abs(value) < 1e308 else math.inf  # 10**400: no float
    above = low <= number if low_in else low < number
    if not (math.isfinite(number) and above and number <= high):
        wanted = {
            POSITIVE: "a number > 0",
            NON_NEGATIVE: "a number ≥ 0",
            SHARE: "a number > 0 and ≤ 1",
        }.get(bounds, "a number below 1e308 in size")
        raise ConfigError(f"config.{where}", f"{where} is {shown(value)}: it takes {wanted}")
    return number


def shown(value: Any) -> str:
    """A value as a message quotes it: JSON-like, at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "…"


def as_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"config.{where}",
            f"{where} is {shown(value)}: it takes an object "
            'of rope parameters ({"rope_type": …, "rope_theta": …})',
        )
    return value


_KNOWN = f"{', '.join(VERIFIED)} (and {', '.join(f'{t} with its text_config' for t in COMPOSITE)})"


def model_type_of(raw: Mapping[str, Any], text: Mapping[str, Any] | None) -> str:
    """The verified model type of the config's attention layers (a multimodal config's
    ``text_config``'s), else a ConfigError naming ``model_type``."""
    top = raw.get("model_type")
    inner = None if text is None else text.get("model_type")
    for where, value in (("model_type", top), ("text_config.model_type", inner)):
        if value is None and where == "model_type" and inner is None:
            raise ConfigError(
                "config.model_type",
                "config has no model_type: it must say "
                f"which family the layer is ({_KNOWN}); or state the layer's "
                "fields yourself and leave config out",
            )
        known = isinstance(value, str) and (value in VERIFIED or value in COMPOSITE)
        if value is not None and not known:
            raise ConfigError(
                f"config.{where}",
                f"model_type {shown(value)} is not a family "
                "the service reproduces exactly from its config"
                f"{f' ({REFUSED[value]})' if value in REFUSED else ''}; it knows "
                f"{_KNOWN}. State the layer's fields yourself (num_heads, "
                "num_kv_heads, d_k, rope, mask, scale …) and leave config out",
            )
    chosen = str(inner if inner is not None else top)
    return COMPOSITE.get(chosen, chosen)  # gemma3 → gemma3_text …
