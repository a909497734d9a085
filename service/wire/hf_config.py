"""A Hugging Face ``config.json`` and a layer index → that layer's /multihead request fields
(API.md, "A Hugging Face config as it is"; docs/api.md 2.6, 5.6), as transformers 5.23 builds it.

``fields`` are JSON-shaped request fields; ``taken`` is {request field: the config key it came
from}, e.g. ``{"rope.base": "rope_theta", "mask.window.left": "sliding_window"}``.

Choices where the contract is silent:
- Multimodal configs (Gemma 3/4, Llama 4): without a top-level ``num_attention_heads`` the
  ``text_config`` is read, its keys named ``text_config.<key>``. The layer's ``per_layer_config``
  entry (5.23's ``to_dict()``: Gemma 4's full layers' head_dim, kv heads) wins; ``global_*`` unread.
- A key left out takes the default of its ``model_type``'s 5.23 configuration class (DeepSeek's
  ``rope_interleave`` true, Gemma 2's ``query_pre_attn_scalar`` 256, Mistral's
  ``sliding_window`` 4096 …), ``taken`` saying ``"<key> (absent: <model_type>'s default)"``; a
  key given as null stays null. Only the verified model types are read (hf_config_keys.VERIFIED;
  a multimodal gemma3/gemma4/llama4 as its text model type); any other, or none, is a
  ConfigError naming ``model_type``. Every key is applied, judged inert, or refused
  (hf_config_keys.KEYS); every number read is range-checked (sizes 1 … 2³¹ − 1).
- ``head_dim`` (else hidden_size // num_attention_heads) goes as ``d_k`` (the service checks it
  against ``q_proj.weight``), ``num_key_value_heads`` as ``num_kv_heads`` only when given; with
  MLA neither, and ``mla.eps`` stays 1e-6 (DeepSeek's latent norms ignore ``rms_norm_eps``).
- ``rope.rotary_dim`` only with ``partial_rotary_factor``: int(head_dim · factor); an odd one
  is a ConfigError (transformers' ``arange(0, dim, 2)`` turns dim + 1 features at the
  frequencies of dim, which no rotary_dim states); ``rope.style`` only when not ``half``. The
  rope: ``rope_scaling`` over ``rope_parameters``, the layer type's entry when nested,
  ``rope_theta``/``partial_rotary_factor`` from the top level when the entry lacks them; for
  llama3, yarn and longrope a top-level ``original_max_position_embeddings`` wins, else the
  entry's, else ``max_position_embeddings``; a yarn without ``factor``: max_position ÷ original.
- Which layers slide: ``layer_types`` (Mistral and Phi-3 ignore it: they slide every layer),
  else the family's pattern (Gemma 2, gpt-oss: every other from 0; Gemma 3: all but every
  ``sliding_window_pattern``-th; Gemma 4: five in six, never the last; Qwen: with
  ``use_sliding_window``, layers ≥ ``max_window_layers``; Qwen2-MoE: the even layers below
  it), else all when ``sliding_window`` is set. Mask: causal, plus the window; Llama 4's
  chunked layers: the chunked mask alone (causal within chunks, as docs/api.md's Llama 4 row).
- Exaone 4 and Cohere 2 rotate their sliding layers only (their full layers are NoPE); with
  ``sliding_window`` null every Exaone 4 layer rotates and no Cohere 2 layer does, and a
  sliding layer is a ConfigError (transformers builds no mask for it). Cohere 2 turns
  interleaved pairs and its ``head_dim`` is hidden_size // heads (its configuration class
  overwrites the key). GLM-4-MoE's q/k norms only with ``use_qk_norm``; Apertus's and Exaone
  4's always; their eps ``rms_norm_eps``. Qwen3.5 (dense and MoE) reads as Qwen3-Next (the
  gate rows in ``q_proj``, (1 + w) norms); its M-RoPE is the plain rotation on text positions
  (the three axes equal), the only positions a request has.
- Granite's ``attention_multiplier`` → ``attention_multiplier`` (the scale; null a ConfigError),
  OLMo's ``clip_qkv`` → ``clip_qkv``; Helium, ERNIE 4.5, GLM and GLM-4 rotate interleaved pairs
  (``rope.style``), as Llama 4 does.
- OPT has no RoPE (its learned positions join the embeddings before the first layer) and its
  head_dim is hidden_size // heads whatever the config says (OPTAttention's embed_dim // heads).
- StableLM's head_dim is hidden_size // heads (as OPT's), its partial_rotary_factor 0.25 when
  absent. Phi's partial_rotary_factor defaults to 0.5. Their qk_layernorm: a layer qk_norm with
  eps layer_norm_eps (Phi's weight and bias shared by the heads, StableLM's a weight per head,
  both from the state dict); Cohere's use_qk_norm likewise (a weight per head), its pairs
  interleaved. OLMo 2, OLMo 3 and OLMoE: an rms qk_norm over the whole projection, eps
  rms_norm_eps; OLMo 3's layer_types absent: three sliding then one full, its legacy
  rope_scaling the full layers' only (Olmo3Config's rope_parameters["full_attention"].update).
- GPT-J's config names its keys its own way (``n_head``, ``n_embd`` …: hf_config_keys.KEY_NAMES,
  read before Llama's names); its ``rotary_dim`` first features turn in interleaved pairs at
  base 10000, fixed in its modeling (its config's rope keys unread); head_dim n_embd // n_head.
- HunYuan's q/k RMSNorms follow RoPE (``after_rope``, eps ``rms_norm_eps``; their weights come
  as ``query_layernorm.weight``/``key_layernorm.weight``); a ``dynamic`` rope with ``alpha`` is
  its NTK alpha, the fixed base θ · α^(d/(d − 2)); its ``head_dim`` null and a
  ``partial_rotary_factor`` are ConfigErrors (transformers fails on both).
- Ministral 3's query scale 1 + β·log(1 + ⌊p / original⌋) after RoPE on every layer (its
  ``rope_parameters`` ``llama_4_scaling_beta`` and ``original_max_position_embeddings``) →
  ``temperature`` with ``position_shift`` 0; either missing is a ConfigError.
- GPT-2, GPTBigCode and CodeGen name their keys as GPT-J does (KEY_NAMES); head_dim
  n_embd // n_head. GPT-2 and GPTBigCode have no RoPE (learned positions before the first
  layer); their scale is head_dim^-½ with ``scale_attn_weights`` (true when absent), else 1,
  GPT-2's divided by layer + 1 with ``scale_attn_by_inverse_layer_idx`` (``scale``, only when
  not the usual). Fused projections (service.wire.fused): GPT-2's Conv1D ``c_attn``
  (``qkv_layout`` "columns"), GPTBigCode's ``c_attn`` ("rows" with ``multi_query``, true when
  absent, and one key/value head — ``num_key_value_heads`` is its echo —, else "per_head"),
  CodeGen's ``qkv_proj`` ("codegen"). CodeGen rotates as GPT-J (its rotary_dim null a
  ConfigError: its model fails on it).
- ``attn_logit_softcapping`` → ``softcap`` except Gemma 3/4 (their 5.23 attention ignores it);
  gpt-oss's sinks are weights (``sinks`` in the state dict), not config.
- ConfigError: a layer out of range, a rope type the service lacks, a non-attention layer
  (Qwen3-Next's ``linear_attention``), bidirectional attention (Gemma 3/4's
  ``use_bidirectional_attention`` true or "all"), a proportional rope with a ``factor``, a key
  of the wrong JSON type (integral floats such as 4096.0 are read as sizes).
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from service.wire import hf_config_keys as ck
from service.wire.hf_config_keys import (
    KEY_NAMES,
    KEYS,
    NESTED,
    VERIFIED,
    ConfigError,
    model_type_of,
    unread_keys,
)
from service.wire.hf_parameters import Names, module_names

_ANY, _POSITIVE, _NON_NEGATIVE, _SHARE = ck.ANY, ck.POSITIVE, ck.NON_NEGATIVE, ck.SHARE
_DEFAULTS, _int, _num, _mapping = ck.DEFAULTS, ck.as_size, ck.as_number, ck.as_mapping

__all__ = ["ConfigError", "FromConfig", "from_config"]


@dataclass(frozen=True)
class FromConfig:
    fields: dict[str, Any]  # request fields the config implies for that layer (JSON-shaped)
    taken: dict[str, str]  # {request field: the config key it came from}
    # the config's other keys, judged not to change this layer (hf_config_keys.KEYS)
    unread: list[str] = field(default_factory=list)
    # fields that hold only when the state dict has the module's output block (BERT's and
    # RoBERTa's output.LayerNorm): without it the module is the self-attention alone
    block: tuple[str, ...] = ()
    # T5: relative_bias.table's rows (relative_attention_num_buckets) and the key that says so;
    # the table itself is the state dict's relative_attention_bias.weight (layer 0's)
    buckets: tuple[int, str] | None = None
    # the state-dict names its attention module has (service.wire.hf_parameters; None: no row)
    parameters: Names | None = None


# model type -> the family whose defaults and rules it takes (the verified types only)
_TYPES_OF_FAMILY = {
    "qwen": "qwen2 qwen2_moe",
    "gemma3": "gemma3_text",
    "gemma4": "gemma4_text",
    "deepseek": "deepseek_v2 deepseek_v3",
    "llama4": "llama4_text",
    "qwen3_next": "qwen3_next qwen3_5_text qwen3_5_moe_text",  # Qwen3.5's attention is Qwen3-Next's
    "granite": "granite granitemoe",
    "glm": "glm glm4",
}
_FAMILIES = {t: family for family, types in _TYPES_OF_FAMILY.items() for t in types.split()}
_FAMILIES |= {t: t for t in VERIFIED if t not in _FAMILIES}
# families whose every layer slides when sliding_window is set (their masks ignore layer_types)
_EVERY_LAYER_SLIDES: tuple[str, ...] = ("mistral", "mixtral", "phimoe", "starcoder2", "phi3")
_EVERY_LAYER_SLIDES += ("qwen3_moe",)
_EVERY_LAYER_SLIDES += ("ministral3",)
_KINDS = ("full_attention", "sliding_attention")  # indexed by "it slides"
# with use_sliding_window and no layer_types, which layers slide given max_window_layers m, as
# each configuration class writes its layer_types: Qwen2's and Qwen3's the layers from m on,
# Qwen2-MoE's the even layers below m (Qwen2MoeConfig: (i + 1) % 2 and i < m)
_WINDOW_LAYERS: dict[str, Callable[[int, int], bool]] = {
    "qwen2": lambda layer, m: layer >= m,
    "qwen2_moe": lambda layer, m: layer % 2 == 0 and layer < m,
}
# families whose full layers skip RoPE (NoPE) while their sliding layers rotate: {family: whether
# every layer rotates when sliding_window is null} (Exaone 4: all rotate; Cohere 2: none)
_FULL_LAYERS_NOPE = {"exaone4": True, "cohere2": False}
# families with q/k RMSNorms on every layer, and those where use_qk_norm decides
_QK_NORMED: tuple[str, ...] = ("qwen3", "qwen3_moe", "gemma3", "gemma4", "qwen3_next")
_QK_NORMED += ("apertus", "exaone4")
_QK_NORMED += ("hunyuan_v1_dense",)
# families whose q/k norms follow RoPE: Llama 4's weightless L2 norm; HunYuan's RMSNorms
# (query_layernorm, key_layernorm: weights in the state dict)
_QK_NORM_AFTER_ROPE = ("llama4", "hunyuan_v1_dense")
_QK_NORM_FLAG = ("llama4", "glm4_moe")
# families whose q/k norms are not Qwen3's RMSNorm of each head: {family: (type, over, the eps
# key, the key that turns them on or "" for always)}. OLMo 2/3 and OLMoE: an RMSNorm of the
# whole projection before the head split; Cohere: CohereLayerNorm((heads, head_dim)), a weight
# per head, no bias; StableLM: a LayerNorm per head, no bias; Phi: one LayerNorm(head_dim) with
# a bias (the state dict brings the weights and biases)
_QK_NORM_FORMS: dict[str, tuple[str, str, str, str]] = {
    "olmo2": ("rms", "projection", "rms_norm_eps", ""),
    "olmo3": ("rms", "projection", "rms_norm_eps", ""),
    "olmoe": ("rms", "projection", "rms_norm_eps", ""),
    "cohere": ("layer", "head", "layer_norm_eps", "use_qk_norm"),
    "stablelm": ("layer", "head", "layer_norm_eps", "qk_layernorm"),
    "phi": ("layer", "head", "layer_norm_eps", "qk_layernorm"),
}
# families whose apply_rotary_pos_emb turns the pairs (2i, 2i + 1): Llama 4's complex pairs;
# Helium's, ERNIE 4.5's, GLM's and GLM-4's rotate_half of x[..., 0::2], x[..., 1::2], cos and
# sin repeat_interleave'd (GLM's on the first rotary_dim features)
_INTERLEAVED: tuple[str, ...] = ("llama4",)
_INTERLEAVED += ("helium", "ernie4_5", "glm", "glm4")
_INTERLEAVED += ("cohere2",)  # Cohere 2: repeat_interleave'd frequencies
_INTERLEAVED += ("gptj",)  # GPT-J: rotate_every_two, repeat_interleave'd sin and cos
_INTERLEAVED += ("cohere",)  # Cohere: its rotate_half turns x[..., ::2], x[..., 1::2]
# families without RoPE: OPT's learned positions are added to the embeddings, outside the layer
_NO_ROPE: tuple[str, ...] = ("opt",)
# families whose head_dim is hidden_size // num_attention_heads whatever the config says
# (Cohere2Config overwrites the key; OPTAttention's head_dim is embed_dim // num_heads)
_HEAD_DIM_OF_HIDDEN: tuple[str, ...] = ("cohere2",)
_HEAD_DIM_OF_HIDDEN += ("opt",)
_HEAD_DIM_OF_HIDDEN += ("stablelm",)  # StableLmAttention: hidden_size // num_heads
# how each family's module packs a fused projection (service.wire.fused.LAYOUTS), read when the
# state dict holds one (Phi-3's qkv_proj: [q; k; v] rows)
_QKV_LAYOUTS = {"phi3": "rows", "gpt_neox": "per_head"}
# the encoders: no RoPE (learned absolute positions, or T5's relative bias), no causal mask
# unless is_decoder; BERT's head size is hidden_size // heads (BertSelfAttention)
_BERTS = ("bert", "roberta")
_ENCODERS = (*_BERTS, "t5")
_NO_ROPE += _ENCODERS
_HEAD_DIM_OF_HIDDEN += _BERTS
# a T5 decoder's layers are counted by num_decoder_layers
_DECODER_NAMES = {"t5": {"num_hidden_layers": ("num_decoder_layers", "num_layers")}}
_HEAD_DIM_OF_HIDDEN += ("gptj",)  # GPTJAttention: embed_dim // num_attention_heads
# families whose attention reads config.head_dim with no fallback (null fails in transformers)
_HEAD_DIM_NEEDED = ("hunyuan_v1_dense",)
# families whose "dynamic" rope with an ``alpha`` is a fixed NTK base, θ · α^(d/(d − 2)), not
# dynamic NTK (HunYuanDenseV1RotaryEmbedding's ntk_alpha), and that turn the whole head (they
# ignore partial_rotary_factor, or fail on it)
_NTK_ALPHA = ("hunyuan_v1_dense",)
# families that scale each query after RoPE by 1 + β·log(1 + ⌊p / original⌋) (Ministral 3's
# rope_parameters.llama_4_scaling_beta): the temperature field with position_shift 0
_BETA_TEMPERATURE = ("ministral3",)
# families whose RoPE is fixed in their modeling, not configured: {family: (base, why)}; the
# config's rope keys do not reach the layer (judged inert, listed unread). GPT-J's
# create_sinusoidal_positions: 10000^(−2i/rotary_dim), its ``rotary_dim`` first features
# turned in interleaved pairs (rotate_every_two); CodeGen copies all three functions
_FIXED_ROPE = {"gptj": (10_000.0, "create_sinusoidal_positions' base 10000")}
_ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor")
_QKV_LAYOUTS |= {"bloom": "per_head", "mpt": "rows", "dbrx": "rows"}
# Falcon's: {(new_decoder_architecture, multi_query): (layout, its kv heads: "config" for
# num_kv_heads, 1, or "heads" for num_attention_heads)} (FalconAttention._split_heads)
_FALCON_LAYOUTS = {
    (True, True): ("grouped", "config"),
    (True, False): ("grouped", "config"),
    (False, True): ("rows", 1),
    (False, False): ("per_head", "heads"),
}
# ALiBi where the family adds it, from where its distances start (docs/api.md 2.6's origin):
# BLOOM's build_alibi_tensor slope·p'_j, MPT's build_mpt_alibi_tensor slope·(p'_j − p'_last);
# both with the paper's slopes (MPT's alibi_bias_max 8: hf_config_keys refuses any other)
_ALIBI = {"bloom": "zero", "mpt": "last_key"}
_NO_ROPE += ("bloom", "mpt")
_HEAD_DIM_OF_HIDDEN += ("bloom", "mpt", "dbrx", "falcon")  # hidden_size // heads, in each class
# ---- GPT-2, GPTBigCode, CodeGen: fused c_attn / qkv_proj, their own key names (KEY_NAMES),
# head_dim n_embd // n_head (their attention classes' embed_dim // num_heads)
_HEAD_DIM_OF_HIDDEN += ("gpt2", "gpt_bigcode", "codegen")
_NO_ROPE += ("gpt2", "gpt_bigcode")  # learned positions (wpe), added before the first layer
# CodeGen copies GPT-J's create_sinusoidal_positions, rotate_every_two, apply_rotary_pos_emb
_INTERLEAVED += ("codegen",)
_FIXED_ROPE |= {"codegen": (10_000.0, "create_sinusoidal_positions' base 10000")}
# GPT-2's Conv1D c_attn: columns [q | k | v]; CodeGen's qkv_proj: 4 blocks of [q | v | k]
_QKV_LAYOUTS |= {"gpt2": "columns", "codegen": "codegen"}
# layouts a config flag picks: {family: (flag, layout when true, layout when false)};
# GPTBigCode's multi_query c_attn splits (h·d, d, d), else views (…, h, 3·d) as GPT-NeoX's
_QKV_LAYOUT_OF_FLAG = {"gpt_bigcode": ("multi_query", "rows", "per_head")}
# key/value heads a flag gives: {family: flag}, one head when true, num_heads when false
# (GPTBigCodeConfig's __post_init__ writes num_key_value_heads from it: that key is its echo)
_ONE_KV_HEAD_OF_FLAG = {"gpt_bigcode": "multi_query"}
# GPT-2's scale: head_dim^-½ with scale_attn_weights (else 1), divided by layer_idx + 1 with
# scale_attn_by_inverse_layer_idx: {family: the flags it reads}
_SCALE_FLAGS = {
    "gpt2": ("scale_attn_weights", "scale_attn_by_inverse_layer_idx"),
    "gpt_bigcode": ("scale_attn_weights",),
}
# families whose model fails on a null rotary_dim (CodeGenModel's min(rotary_dim, …))
_ROTARY_DIM_NEEDED = ("codegen",)
_SCALINGS = ("default", "linear", "llama3", "yarn", "dynamic", "longrope", "proportional")
# a family's own step, from the config key of the field's name where hf_config_keys.KEYS says
# the type reads it: {key: what the layer does with it, when null is no layer ("" when null is
# the step off: OlmoAttention clamps q, k, v to ±clip_qkv unless it is null)}
_OWN_STEPS = {
    "attention_multiplier": "GraniteAttention scales the scores by it (self.scaling)",
    "clip_qkv": "",
}


def _key(source: str) -> str:
    """The config key of a ``taken`` source (without a default's note)."""
    return source.split(" (")[0]


class _Config:
    """The config (its text part) with its family's defaults, and what was taken from it."""

    def __init__(self, raw: Mapping[str, Any], layer: int) -> None:
        text = raw.get("text_config")
        nested = "num_attention_heads" not in raw and isinstance(text, Mapping)
        self.c: Mapping[str, Any] = text if nested and isinstance(text, Mapping) else raw
        self.prefix = "text_config." if nested else ""
        self.model_type = model_type_of(raw, self.c if nested else None)
        self.family = _FAMILIES[self.model_type]
        self.taken: dict[str, str] = {}
        self.names = KEY_NAMES.get(self.family, {})
        if self.c.get("is_decoder") and self.family in _DECODER_NAMES:
            self.names = self.names | _DECODER_NAMES[self.family]
        per_layer = self.c.get("per_layer_config")  # 5.23's to_dict: {"05": {"head_dim": …}}
        entries = per_layer.items() if isinstance(per_layer, Mapping) else ()
        self.own: tuple[Mapping[str, Any], str] = next(
            (
                (v, f"{self.prefix}per_layer_config.{k}.")
                for k, v in entries
                if str(k).isdigit() and int(k) == layer and isinstance(v, Mapping)
            ),
            ({}, ""),
        )

    def get(self, key: str) -> tuple[Any, str]:
        """The key's value and where it came from (None, "" when neither given nor defaulted),
        under the family's own names where it has them (hf_config_keys.KEY_NAMES: T5's
        ``num_heads``, GPT-J's ``n_head`` …): the first name given with a value, else the first
        given as null, else the first name's default."""
        names = self.names.get(key, (key,))
        given = [got for name in names if (got := self._given(name))[1]]
        if given:
            return next((got for got in given if got[0] is not None), given[0])
        return next((got for name in names if (got := self._default(name))[1]), (None, ""))

    def _given(self, key: str) -> tuple[Any, str]:
        """A key in the layer's own entry or the config; a dotted name (MPT's
        ``attn_config.clip_qkv``) in its nested mapping."""
        if key in self.own[0]:
            return self.own[0][key], self.own[1] + key
        if (found := _nested(self.c, key)) is not None:
            return found[0], self.prefix + key
        return None, ""

    def _default(self, key: str) -> tuple[Any, str]:
        for family in (self.family, ""):
            if key in _DEFAULTS.get(family, {}):
                whose = f"{self.model_type}'s" if family else "transformers'"
                return _DEFAULTS[family][key], f"{self.prefix}{key} (absent: {whose} default)"
        return None, ""

    def value(self, key: str, *others: str) -> Any:
        return self.first(key, *others)[0]

    def first(self, *keys: str) -> tuple[Any, str]:  # the first key given or defaulted
        return next((got for k in keys if (got := self.get(k))[0] is not None), (None, ""))

    def take(self, field: str, source: str, value: Any) -> Any:
        self.taken[field] = source
        return value

    def reads(self, key: str) -> bool:
        """Whether the service applies ``key`` (under the type's own name) for this model type
        (hf_config_keys.KEYS)."""
        rows = [KEYS.get(name) for name in self.names.get(key, (key,))]
        return any(
            r is not None and (r.reads == "*" or self.model_type in r.reads.split()) for r in rows
        )


def _nested(c: Mapping[str, Any], name: str) -> tuple[Any] | None:
    """(the value,) of ``name`` in ``c``, a dotted name looked up in its nested mapping; None
    when absent."""
    if name in c:
        return (c[name],)
    outer, _, inner = name.partition(".")
    sub = c.get(outer) if inner else None
    return (sub[inner],) if isinstance(sub, Mapping) and inner in sub else None


def from_config(config: Mapping[str, Any], layer: int) -> FromConfig:
    """The /multihead fields that ``config`` (a ``config.json`` object) implies for ``layer``."""
    if not isinstance(config, Mapping):
        raise ConfigError("config", "config must be the config.json object")
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ConfigError("layer", f"layer is {layer!r}: expected an integer ≥ 0")
    c = _Config(config, layer)
    unread = unread_keys(c.c, c.model_type, c.prefix)
    if c.family in _FIXED_ROPE:  # its modeling never reads them
        unread = sorted({*unread, *(c.prefix + k for k in _ROPE_KEYS if k in c.c)})
    for outer in NESTED.get(c.model_type, ()):  # MPT's and DBRX's attn_config, key by key
        inner = _mapping(c.c.get(outer) or {}, c.prefix + outer)
        unread += unread_keys(inner, c.model_type, f"{c.prefix}{outer}.")
    if c.family in _ONE_KV_HEAD_OF_FLAG and "num_key_value_heads" in c.c:  # the flag's echo
        unread = sorted({*unread, f"{c.prefix}num_key_value_heads"})
    if c.prefix:  # a multimodal config: its own keys around text_config
        unread += unread_keys(config, c.model_type)
    n_layers, n_src = c.get("num_hidden_layers")
    if n_layers is not None and layer >= _int(n_layers, _key(n_src)):
        raise ConfigError("layer", f"layer {layer} but the config has {_key(n_src)} {n_layers}")
    heads, h_src = c.get("num_attention_heads")
    if heads is None:
        raise ConfigError("config.num_attention_heads", "the config has no num_attention_heads")
    fields: dict[str, Any] = {"num_heads": c.take("num_heads", h_src, _int(heads, _key(h_src)))}
    kind, kind_src = _layer_type(c, layer)
    mla = _mla(c)
    glob = c.family == "gemma4" and kind == "full_attention" and "per_layer_config" not in c.c
    head_dim, hd_src = _head_dim(c, fields["num_heads"], glob)
    kv, kv_src = c.first(
        *["num_global_key_value_heads"] * bool(glob and c.value("attention_k_eq_v")),
        "num_key_value_heads",
    )
    if c.family in _ONE_KV_HEAD_OF_FLAG:
        kv, kv_src = _kv_heads_of_flag(c, fields["num_heads"])
    if mla is None:
        if kv is not None and c.family not in _ENCODERS:  # BERT, T5: every head its own k, v
            fields["num_kv_heads"] = c.take("num_kv_heads", kv_src, _int(kv, _key(kv_src)))
        fields["d_k"] = c.take("d_k", hd_src, head_dim)
    rope = _rope(c, kind, layer, head_dim, mla is not None)
    fields |= {"rope": rope} if rope is not None else {}
    fields |= _variants(c, kind, rope is not None)
    mask = _encoder_mask(c) if c.family in _ENCODERS else _mask(c, kind, kind_src, layer)
    fields |= {"mask": mask} if mask else {}
    fields |= {"mla": mla} if mla is not None else {}
    fields |= _scale_of_flags(c, layer, head_dim)
    if (layout := _QKV_LAYOUTS.get(c.family)) is not None:
        fields["qkv_layout"] = c.take("qkv_layout", f"model_type {c.model_type}", layout)
    if c.family in _QKV_LAYOUT_OF_FLAG:
        flag, when_on, when_off = _QKV_LAYOUT_OF_FLAG[c.family]
        on, src = _flag(c, flag)
        fields["qkv_layout"] = c.take("qkv_layout", src, when_on if on else when_off)
    if c.family in _ENCODERS:
        own, block, buckets = _encoder(c)
        fields |= own
        return FromConfig(fields, c.taken, unread, block, buckets, _names(c, fields))
    fields |= _alibi_family(c, fields)
    return FromConfig(fields, c.taken, unread, parameters=_names(c, fields))


def _names(c: _Config, fields: dict[str, Any]) -> Names | None:
    """The state-dict names the layer's attention module has (service.wire.hf_parameters)."""
    return module_names(c.model_type, c.c, fields)


def _alibi_family(c: _Config, fields: dict[str, Any]) -> dict[str, Any]:
    """BLOOM's and MPT's ALiBi (and MPT's softmax_scale), DBRX's unused rope_theta, Falcon's
    layout and kv heads (and its ALiBi, refused)."""
    out: dict[str, Any] = {}
    why = f"model_type {c.model_type}"
    if (origin := _ALIBI.get(c.family)) is not None:
        c.taken["alibi"] = why
        out["alibi"] = {"origin": c.take("alibi.origin", why, origin)}
    scale, s_src = c.get("attn_config.softmax_scale") if c.family == "mpt" else (None, "")
    if scale is not None:
        out["scale"] = c.take("scale", s_src, _num(scale, _key(s_src), _POSITIVE))
    theta, t_src = c.get("attn_config.rope_theta") if c.family == "dbrx" else (None, "")
    base = fields.get("rope", {}).get("base")
    if theta is not None and _num(theta, _key(t_src), _POSITIVE) != base:
        raise ConfigError(
            f"config.{_key(t_src)}",
            f"{_key(t_src)} is {theta} but transformers 5.23's DBRX rotates at rope_parameters' "
            f"rope_theta {base} and never reads this one (DBRX's own code does): the service "
            "will not pick one; make them agree",
        )
    tp, tp_src = c.get("pretraining_tp") if c.family == "bloom" else (None, "")
    if c.get("slow_but_exact")[0] and tp is not None and _int(tp, _key(tp_src)) > 1:
        raise ConfigError(
            "config.slow_but_exact",
            f"slow_but_exact with pretraining_tp {tp}: BloomAttention then sums dense's slices "
            "without dense.bias; send the layer's fields without config (and without dense.bias)",
        )
    if c.family == "falcon":
        out |= _falcon(c, fields["num_heads"])
    return out


def _falcon(c: _Config, heads: int) -> dict[str, Any]:
    """Falcon's query_key_value layout and kv heads; its ALiBi refused: 5.23's eager
    FalconAttention adds slope·p'_j / √d twice (in its logits and again in the mask
    FalconModel folds it into) where its sdpa path adds it once."""
    alibi, a_src = c.get("alibi")
    if alibi:
        raise ConfigError(
            f"config.{_key(a_src)}",
            "alibi is true: transformers 5.23's Falcon adds the ALiBi bias once on its sdpa path "
            "and twice on its eager one (in the logits, then again in the mask FalconModel "
            "folds it into), so the service cannot say which is the layer; send its fields "
            "without config (alibi with origin zero and slopes / √d_k)",
        )
    new, n_src = c.get("new_decoder_architecture")
    multi, m_src = c.get("multi_query")
    layout, kv = _FALCON_LAYOUTS[bool(new), bool(multi)]
    src = n_src if new else f"{n_src}, {m_src}"
    out: dict[str, Any] = {"qkv_layout": c.take("qkv_layout", src, layout)}
    if kv == "config":
        value, kv_src = c.get("num_key_value_heads")
        if value is not None:
            out["num_kv_heads"] = c.take("num_kv_heads", kv_src, _int(value, _key(kv_src)))
    else:
        out["num_kv_heads"] = c.take("num_kv_heads", src, 1 if kv == 1 else heads)
    return out


def _flag(c: _Config, key: str) -> tuple[bool, str]:
    """A true/false key (null: false, as the modeling's ``if config.<key>`` reads it)."""
    value, src = c.get(key)
    if value is not None and not isinstance(value, bool):
        raise ConfigError(
            f"config.{_key(src)}", f"{_key(src)} is {value!r}: it takes true or false"
        )
    return bool(value), src


def _kv_heads_of_flag(c: _Config, heads: int) -> tuple[int, str]:
    """GPTBigCode's key/value heads: one with multi_query, else one per query head."""
    flag = _ONE_KV_HEAD_OF_FLAG[c.family]
    on, src = _flag(c, flag)
    return (1 if on else heads), src


def _scale_of_flags(c: _Config, layer: int, head_dim: int) -> dict[str, Any]:
    """GPT2Attention's ``self.scaling``: head_dim^-½ if scale_attn_weights else 1, divided by
    layer + 1 if scale_attn_by_inverse_layer_idx; no ``scale`` field when it is the usual."""
    flags = _SCALE_FLAGS.get(c.family, ())
    got = [_flag(c, key) for key in flags]
    weights = got[0] if got else (True, "")
    inverse = got[1] if len(got) > 1 else (False, "")
    if weights[0] and not inverse[0]:
        return {}
    scale = head_dim**-0.5 if weights[0] else 1.0
    if inverse[0]:
        scale /= float(layer + 1)
    src = weights[1] + (f", {inverse[1]} (layer {layer} + 1)" if inverse[0] else "")
    return {"scale": c.take("scale", src, scale)}


def _layer_type(c: _Config, layer: int) -> tuple[str, str]:
    """The layer's type as transformers names it, and why."""
    fam, why = c.family, f"model_type {c.model_type}: "
    types, src = c.get("layer_types")
    if types is not None and c.reads("layer_types"):
        if not isinstance(types, list) or len(types) <= layer:
            raise ConfigError(f"config.{src}", f"{src} has no entry for layer {layer}")
        if fam == "gemma4" and layer == len(types) - 1:
            return "full_attention", why + "the last layer is full attention"
        return str(types[layer]), f"{src}[{layer}]"
    if fam in ("gemma2", "gpt_oss"):
        return _KINDS[bool((layer + 1) % 2)], why + "every other layer slides, from layer 0"
    if fam in ("gemma3", "gemma4", *_FULL_LAYERS_NOPE):
        pattern, p_src = (
            c.first("sliding_window_pattern", "_sliding_window_pattern")
            if fam != "gemma4"
            else (6, why + "5:1")
        )
        n_layers, n_src = c.get("num_hidden_layers")
        last = fam == "gemma4" and n_layers is not None and layer == _int(n_layers, _key(n_src)) - 1
        return _KINDS[bool((layer + 1) % _int(pattern, _key(p_src))) and not last], p_src
    if fam == "qwen3_next":
        every, e_src = c.get("full_attention_interval")
        full = (layer + 1) % _int(every, _key(e_src)) == 0
        return ("full_attention" if full else "linear_attention"), e_src
    if fam == "olmo3":  # Olmo3Config's layer_types when absent
        return _KINDS[bool((layer + 1) % 4)], why + "every fourth layer full, the others slide"
    if fam == "llama4":
        use_rope, r_src = _rope_layer(c, layer)
        return ("chunked_attention" if use_rope else "full_attention"), r_src
    use, u_src = c.get("use_sliding_window") if c.reads("use_sliding_window") else (None, "")
    window, w_src = c.get("sliding_window")
    if use is not None and fam == "qwen3_moe":  # Qwen3MoeConfig: every layer, when on
        return _KINDS[bool(use) and window is not None], f"{u_src}, {w_src}" if use else u_src
    if use is not None and fam == "smollm3":  # SmolLM3Config: the layers without RoPE
        rotates, r_src = _rope_layer(c, layer)
        on = bool(use) and window is not None and not rotates
        return _KINDS[on], f"{u_src}, {w_src}, {r_src}" if use else u_src
    if use is not None:
        first, f_src = c.get("max_window_layers")
        slides = _WINDOW_LAYERS.get(c.model_type, _WINDOW_LAYERS["qwen2"])
        on = bool(use) and slides(layer, _int(first, _key(f_src), 0))
        return _KINDS[on], f"{u_src}, {f_src}" if use else u_src
    if fam in _EVERY_LAYER_SLIDES or c.reads("sliding_window"):
        return _KINDS[window is not None], w_src
    return "full_attention", f"model_type {c.model_type}: no sliding window"


def _rope_layer(c: _Config, layer: int) -> tuple[bool, str]:
    """Whether the layer rotates (``no_rope_layers[i]``: 0 means no RoPE), and why."""
    flags, src = c.get("no_rope_layers")
    if not flags and c.family in ("llama4", "smollm3"):  # absent or empty → every interval-th
        every, e_src = c.get("no_rope_layer_interval")
        return bool((layer + 1) % _int(every, _key(e_src))), e_src
    if not flags:
        return True, ""
    if not isinstance(flags, list) or len(flags) <= layer:
        raise ConfigError(f"config.{_key(src)}", f"{_key(src)} has no entry for layer {layer}")
    return bool(flags[layer]), f"{src}[{layer}]"


def _head_dim(c: _Config, heads: int, glob: bool) -> tuple[int, str]:
    if c.family in _HEAD_DIM_NEEDED and c.value("head_dim") is None:
        raise ConfigError(
            f"config.{c.prefix}head_dim",
            f"head_dim is null: {c.model_type}'s attention reads config.head_dim itself (its "
            "sizes and scale), and transformers fails without it; send the model's head_dim",
        )
    own = ["head_dim"] * (c.family not in _HEAD_DIM_OF_HIDDEN)
    value, src = c.first(*["global_head_dim"] * glob, *own)
    if value is not None:
        return _int(value, _key(src)), src
    hidden, src = c.get("hidden_size")
    if hidden is None:
        raise ConfigError("config.head_dim", "the config has neither head_dim nor hidden_size")
    if _int(hidden, _key(src)) < heads:
        raise ConfigError(
            f"config.{_key(src)}",
            f"{_key(src)} {hidden} is less than "
            f"num_attention_heads {heads}: a head needs at least one feature",
        )
    return hidden // heads, f"{src} / {c.get('num_attention_heads')[1] or 'num_attention_heads'}"


def _mla(c: _Config) -> dict[str, Any] | None:
    """DeepSeek's multi-head latent attention sizes, when the config has ``kv_lora_rank``."""
    if c.c.get("kv_lora_rank") is None:
        return None
    keys = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    c.taken |= {f"mla.{key}": c.prefix + key for key in keys}
    return {k: None if c.c.get(k) is None else _int(c.c[k], c.prefix + k, 0) for k in keys}


def _rope(c: _Config, kind: str, layer: int, head_dim: int, mla: bool) -> dict[str, Any] | None:
    """The layer's ``rope`` field, or None on a layer without RoPE."""
    rotates = _rope_layer(c, layer)[0] and _kind_rotates(c, kind) and c.family not in _NO_ROPE
    p = _rope_entry(c, kind) if rotates else None
    if p is None:
        return None
    kind_v, kind_src = p.get("rope_type") or p.get("type") or ("default", "")
    rope_type = str(kind_v)
    if c.family == "phi3" and rope_type in ("su", "yarn"):  # Phi-3's old names for LongRoPE
        rope_type = "longrope"
    if rope_type not in _SCALINGS:
        raise ConfigError(
            f"config.{_key(kind_src)}",
            f"rope_type {rope_type!r}: the service has {', '.join(_SCALINGS)}",
        )
    theta, t_src = p.get("rope_theta") or c.get("rope_theta")
    base = _num(theta, _key(t_src) or "rope_theta", _POSITIVE)
    factor, f_src = p.get("partial_rotary_factor", (None, ""))
    if c.family in _NTK_ALPHA:
        base, t_src, rope_type = _ntk_alpha(p, rope_type, base, t_src, head_dim)
        if factor is not None and _num(factor, _key(f_src), _SHARE) != 1.0:
            raise ConfigError(
                f"config.{_key(f_src)}",
                f"{c.model_type}'s rotary turns the whole head: its own frequencies ignore "
                f"{_key(f_src)} and the other rope types fail on it in transformers",
            )
        factor = None
    rope: dict[str, Any] = {"base": c.take("rope.base", t_src, base)}
    if rope_type == "proportional":
        scale, s_src = p.get("factor", (None, ""))
        if scale is not None and _num(scale, _key(s_src)) != 1.0:
            raise ConfigError(f"config.{_key(s_src)}", "a proportional rope takes no factor")
        share = 1.0 if factor is None else _num(factor, _key(f_src), _SHARE)
        rope["style"] = c.take("rope.style", kind_src, "proportional")
        rope["rotary_dim"] = c.take(
            "rope.rotary_dim", f_src or kind_src, 2 * int(share * head_dim // 2)
        )
        return rope
    if mla or c.family in _INTERLEAVED:
        on, i_src = c.get("rope_interleave") if mla else (True, f"model_type {c.model_type}")
        if on:
            rope["style"] = c.take("rope.style", i_src, "interleaved")
    if c.reads("rotary_dim"):
        rope |= _rotary_dim(c, head_dim)
    elif factor is not None and not mla:
        dim = int(head_dim * _num(factor, _key(f_src), _SHARE))
        if dim % 2:  # transformers turns dim + 1 features at base^(−2i/dim): no rotary_dim
            raise ConfigError(
                f"config.{_key(f_src)}",
                f"head_dim {head_dim} · {_key(f_src)} {factor} = {dim} features, an odd "
                f"number: transformers turns {dim + 1} of them with the frequencies of {dim} "
                f"(base^(−2i/{dim})), which rope.rotary_dim cannot state",
            )
        rope["rotary_dim"] = c.take("rope.rotary_dim", f_src, dim)
    if rope_type != "default":
        rope["scaling"] = _scaling(c, rope_type, kind_src, p)
    return rope


def _rotary_dim(c: _Config, head_dim: int) -> dict[str, Any]:
    """GPT-J's ``rotary_dim``: how many of each head's first features turn; null turns the whole
    head only with one head (its sin and cos have n_embd / 2 frequencies: more heads fail)."""
    dim, src = c.get("rotary_dim")
    heads, h_src = c.get("num_attention_heads")
    if dim is None and _int(heads, _key(h_src)) == 1 and c.family not in _ROTARY_DIM_NEEDED:
        return {}
    if dim is None and c.family in _ROTARY_DIM_NEEDED:
        raise ConfigError(
            f"config.{_key(src) or 'rotary_dim'}",
            f"rotary_dim is null: {c.model_type}'s model fails on it in transformers "
            "(min(rotary_dim, n_ctx // n_head)); state rope.rotary_dim yourself",
        )
    where = _key(src) or "rotary_dim"
    if dim is None:
        raise ConfigError(
            f"config.{where}",
            f"{where} is null: {c.model_type} then builds sin and cos for the whole hidden size, "
            "which fit no head of several; state rope.rotary_dim yourself",
        )
    dim = _int(dim, where)
    if dim % 2 or dim > head_dim:
        raise ConfigError(
            f"config.{where}",
            f"{where} is {dim}: {c.model_type} turns an even number of features within the "
            f"head_dim {head_dim} (transformers fails on any other)",
        )
    return {"rotary_dim": c.take("rope.rotary_dim", src, dim)}


def _kind_rotates(c: _Config, kind: str) -> bool:
    """Whether a layer of this kind rotates (Exaone 4, Cohere 2: RoPE on the sliding layers only,
    a null sliding_window meaning every layer for Exaone 4, none for Cohere 2)."""
    if c.family not in _FULL_LAYERS_NOPE:
        return True
    if c.value("sliding_window") is None:
        return _FULL_LAYERS_NOPE[c.family]
    return kind == "sliding_attention"


Entry = dict[str, tuple[Any, str]]  # rope parameter -> (value, its config key)


def _ntk_alpha(
    p: Entry, rope_type: str, base: float, t_src: str, head_dim: int
) -> tuple[float, str, str]:
    """HunYuan's "dynamic" rope with an ``alpha``: the fixed base θ · α^(d/(d − 2)) and no
    scaling (compute_ntk_alpha_rope_parameters), else the rope as it is; (base, its source,
    the rope type left)."""
    alpha, a_src = p.get("alpha", (None, ""))
    if rope_type != "dynamic" or not alpha:
        return base, t_src, rope_type
    alpha = _num(alpha, _key(a_src), _POSITIVE)
    if head_dim <= 2:
        raise ConfigError(
            f"config.{_key(a_src)}",
            f"an NTK alpha stretches the base by α^(d/(d − 2)), which head_dim {head_dim} lacks",
        )
    stretched = base * alpha ** (head_dim / (head_dim - 2))
    return stretched, f"{t_src} · {_key(a_src)}^(head_dim / (head_dim − 2))", "default"


def _rope_entry(c: _Config, kind: str) -> Entry | None:
    """This layer's rope parameters with their keys (None: the config gives it no RoPE)."""
    pre = c.prefix
    if c.family in _FIXED_ROPE:
        base, why = _FIXED_ROPE[c.family]
        return {"rope_theta": (base, f"model_type {c.model_type}: {why}")}
    if c.family == "gemma3":  # 5.23's conversion of Gemma 3's older keys
        entries = _mapping(c.c.get("rope_parameters") or {}, f"{pre}rope_parameters")
        entry = _mapping(entries.get(kind) or {}, f"{pre}rope_parameters.{kind}")
        p = {k: (v, f"{pre}rope_parameters.{kind}.{k}") for k, v in entry.items()}
        if kind == "full_attention" and c.c.get("rope_scaling"):
            legacy = _mapping(c.c["rope_scaling"], f"{pre}rope_scaling")
            p |= {k: (v, f"{pre}rope_scaling.{k}") for k, v in legacy.items()}
        if "rope_theta" not in p:
            key, default = (
                ("rope_theta", 1e6) if kind == "full_attention" else ("rope_local_base_freq", 1e4)
            )
            p["rope_theta"] = (
                (c.c[key], pre + key)
                if key in c.c
                else (default, f"{pre}{key} (absent: {c.model_type}'s default)")
            )
        return p
    scaling, params = c.c.get("rope_scaling"), c.c.get("rope_parameters")
    if c.family == "olmo3" and kind == "sliding_attention":  # Olmo3Config: rope_scaling is
        scaling = None  # the full layers' (rope_parameters["full_attention"].update)
    chosen, src = (
        (scaling, pre + "rope_scaling")
        if scaling
        else (params, pre + "rope_parameters")
        if params
        else c.get("rope_parameters")
    )
    chosen = _mapping(chosen or {}, _key(src))  # (scaling over parameters; else the default)
    if any(str(k).endswith("_attention") for k in chosen):  # one entry per layer type
        if kind not in chosen:
            raise ConfigError(f"config.{_key(src)}", f"{_key(src)} has no {kind} entry")
        if chosen[kind] is None:
            return None
        chosen, src = _mapping(chosen[kind], f"{_key(src)}.{kind}"), f"{src}.{kind}"
    p = {str(k): (v, f"{src}.{k}") for k, v in chosen.items()}
    for key in ("rope_theta", "partial_rotary_factor"):
        if p.get(key, (None,))[0] is None:
            p.pop(key, None)
            value, v_src = c.get(key)
            if value is not None:
                p[key] = (value, v_src)
    return p


def _scaling(c: _Config, rope_type: str, type_src: str, p: Entry) -> dict[str, Any]:
    """``rope.scaling`` as docs/api.md's table maps Hugging Face's rope parameters."""
    out: dict[str, Any] = {"type": c.take("rope.scaling.type", type_src, rope_type)}

    def put(field: str, value: Any, src: str, number: bool = True) -> None:
        where = _key(src)
        out[field] = c.take(
            f"rope.scaling.{field}", src, _num(value, where) if number else _int(value, where)
        )

    def copy(*keys: str, truthy: bool = False) -> None:
        for key in keys:
            value, src = p.get(key, (None, ""))
            if value is not None and (value or not truthy):
                put(key, value, src)

    def max_position() -> tuple[Any, str]:
        value, src = c.get("max_position_embeddings")
        if value is None:
            raise ConfigError(
                "config.max_position_embeddings",
                f"a {rope_type} rope needs max_position_embeddings",
            )
        return value, src

    if rope_type == "dynamic":  # transformers' dynamic NTK counts from max_position_embeddings
        copy("factor")
        put("original_max_position", *max_position(), number=False)
        return out
    if rope_type == "linear":
        copy("factor")
        return out
    top, top_src = c.get("original_max_position_embeddings")
    own = p.get("original_max_position_embeddings", (None, ""))
    original = (top, top_src) if top is not None else own if own[0] is not None else max_position()
    if rope_type == "llama3":
        copy("factor", "low_freq_factor", "high_freq_factor")
        put("original_max_position", *original, number=False)
    elif rope_type == "yarn":
        if p.get("factor", (None,))[0] is None:  # transformers: max_position ÷ original
            (most, m_src), orig = max_position(), _int(original[0], _key(original[1]))
            put("factor", _num(most, _key(m_src)) / orig, f"{m_src} / {original[1]}")
        else:
            copy("factor")
        put("original_max_position", *original, number=False)
        copy("beta_fast", "beta_slow", "mscale", "mscale_all_dim", truthy=True)
        copy("attention_factor")
        truncate, t_src = p.get("truncate", (None, ""))
        if truncate is not None:
            out["truncate"] = c.take("rope.scaling.truncate", t_src, bool(truncate))
    else:  # longrope
        for key in ("short_factor", "long_factor"):
            value, src = p.get(key, (None, ""))
            if not isinstance(value, list):
                raise ConfigError(f"config.{_key(src) or key}", f"a longrope needs {key}")
            out[key] = c.take(f"rope.scaling.{key}", src, [_num(v, _key(src)) for v in value])
        put("original_max_position", *original, number=False)
        copy("factor", "attention_factor")
        most, m_src = c.get("max_position_embeddings")
        if most is not None:
            put("max_position", most, m_src, number=False)
    return out


def _variants(c: _Config, kind: str, rotates: bool) -> dict[str, Any]:
    """qk_norm, v_norm, k_eq_v, temperature, gate, attention_multiplier, clip_qkv, softcap and
    scale, as the family has them."""
    fam, out = c.family, dict[str, Any]()
    eps, e_src = c.get("rms_norm_eps")
    why = f"model_type {c.model_type}"
    norm: dict[str, Any] = {"type": "rms"}
    flag = fam in _QK_NORM_FLAG and (rotates or fam != "llama4") and c.value("use_qk_norm")
    if fam in _QK_NORMED or flag:
        c.taken["qk_norm"] = c.get("use_qk_norm")[1] if fam in _QK_NORM_FLAG else why
        if eps is not None:
            norm["eps"] = c.take("qk_norm.eps", e_src, _num(eps, _key(e_src), _NON_NEGATIVE))
        if fam in ("gemma3", "qwen3_next"):  # their RMSNorms apply (1 + w)
            norm["zero_centered"] = c.take("qk_norm.zero_centered", why, True)
        if fam in _QK_NORM_AFTER_ROPE:
            norm["after_rope"] = c.take("qk_norm.after_rope", why, True)
        out["qk_norm"] = norm
    if fam in _QK_NORM_FORMS:
        out |= _qk_norm_form(c)
    if fam == "gemma4":
        out["v_norm"] = {"type": "rms", **({"eps": norm["eps"]} if "eps" in norm else {})}
        c.taken["v_norm"], c.taken["v_norm.eps"] = why, e_src
        k_eq_v, k_src = c.get("attention_k_eq_v")
        if kind == "full_attention" and k_eq_v:
            out["k_eq_v"] = c.take("k_eq_v", k_src, True)
    if fam == "llama4" and not rotates and c.value("attn_temperature_tuning"):
        c.taken["temperature"] = c.get("attn_temperature_tuning")[1]
        got = {key: c.get(key) for key in ("floor_scale", "attn_scale")}
        bounds = {"floor_scale": _POSITIVE, "attn_scale": _ANY}
        out["temperature"] = {
            k: c.take(f"temperature.{k}", s, _num(v, _key(s), bounds[k]))
            for k, (v, s) in got.items()
        }
    if fam in _BETA_TEMPERATURE and rotates:
        out["temperature"] = _beta_temperature(c, kind)
    if fam == "qwen3_next":  # q_proj holds each head's query and output gate
        out["gate"] = c.take("gate", why, True)
    for key, needed in _OWN_STEPS.items():
        value, src = c.get(key) if c.reads(key) else (None, "")
        if value is None and src and needed:
            raise ConfigError(
                f"config.{_key(src)}",
                f"{_key(src)} is null: {needed}, so the layer has none and the service will "
                "not guess one; send the layer's number",
            )
        if value is not None:
            out[key] = c.take(key, src, _num(value, _key(src), _POSITIVE))
    cap, cap_src = c.get("attn_logit_softcapping")
    if cap is not None and fam not in ("gemma3", "gemma4"):
        out["softcap"] = c.take("softcap", cap_src, _num(cap, _key(cap_src), _POSITIVE))
    scalar, s_src = c.get("query_pre_attn_scalar")
    if fam == "gemma4":
        out["scale"] = c.take("scale", why, 1.0)
    elif scalar is not None:
        out["scale"] = c.take("scale", s_src, _num(scalar, _key(s_src), _POSITIVE) ** -0.5)
    return out


def _beta_temperature(c: _Config, kind: str) -> dict[str, Any]:
    """Ministral 3's query scale after RoPE, on every layer: 1 + β·log(1 + ⌊p / original⌋),
    β and original from the rope parameters (get_llama_4_attn_scale) — the temperature field with
    attn_scale β, floor_scale original and position_shift 0."""
    p = _rope_entry(c, kind) or {}
    got = {}
    for key in ("llama_4_scaling_beta", "original_max_position_embeddings"):
        value, src = p.get(key, (None, ""))
        if value is None:
            raise ConfigError(
                f"config.{c.prefix}rope_parameters.{key}",
                f"{c.model_type} scales each query by 1 + β·log(1 + ⌊p / "
                "original_max_position_embeddings⌋) with both from rope_parameters; without "
                f"{key} transformers fails, and the service will not guess it",
            )
        got[key] = (value, src)
    (beta, b_src), (original, o_src) = got.values()
    c.taken["temperature"] = b_src
    return {
        "attn_scale": c.take("temperature.attn_scale", b_src, _num(beta, _key(b_src))),
        "floor_scale": c.take("temperature.floor_scale", o_src, _int(original, _key(o_src))),
        "position_shift": c.take("temperature.position_shift", f"model_type {c.model_type}", 0),
    }


def _qk_norm_form(c: _Config) -> dict[str, Any]:
    """The family's q/k norms of another form (:data:`_QK_NORM_FORMS`), when on."""
    kind, over, eps_key, flag = _QK_NORM_FORMS[c.family]
    on, on_src = c.get(flag) if flag else (True, f"model_type {c.model_type}")
    if not on:
        return {}
    c.taken["qk_norm"] = on_src
    eps, e_src = c.get(eps_key)
    norm: dict[str, Any] = {"type": c.take("qk_norm.type", on_src, kind)}
    if over != "head":
        norm["over"] = c.take("qk_norm.over", f"model_type {c.model_type}", over)
    if eps is not None:
        norm["eps"] = c.take("qk_norm.eps", e_src, _num(eps, _key(e_src), _NON_NEGATIVE))
    return {"qk_norm": norm}


def _mask(c: _Config, kind: str, kind_src: str, layer: int) -> list[dict[str, Any]]:
    """The causal mask of a decoder, the window of a sliding layer, or a chunked layer's mask."""
    if c.value("use_bidirectional_attention") in (True, "all"):
        raise ConfigError(
            f"config.{c.prefix}use_bidirectional_attention",
            "bidirectional attention: not the decoder masks the service builds from a config",
        )
    if kind == "chunked_attention":
        size, src = c.get("attention_chunk_size")
        if size is None:
            raise ConfigError("config.attention_chunk_size", "a chunked layer needs its size")
        c.taken["mask.chunked"] = kind_src
        size = c.take("mask.chunked.size", src, _int(size, _key(src)))
        return [{"type": "chunked", "size": size}]
    if kind not in ("full_attention", "sliding_attention"):
        raise ConfigError(
            "layer",
            f"layer {layer} is a {kind} layer ({kind_src}): /multihead "
            "computes softmax attention layers only",
        )
    mask: list[dict[str, Any]] = [{"type": "causal"}]
    c.taken["mask.causal"] = f"model_type {c.model_type or '?'} (a decoder)"
    window, w_src = c.get("sliding_window")
    if kind == "sliding_attention" and window is None and c.family in (*_FULL_LAYERS_NOPE, "olmo3"):
        raise ConfigError(
            f"config.{c.prefix}sliding_window",
            f"layer {layer} is a sliding_attention layer ({kind_src}) but sliding_window is "
            "null: transformers builds no mask for it",
        )
    gated = c.reads("use_sliding_window") and c.value("use_sliding_window") == 0
    if kind == "sliding_attention" and window is not None and not gated:
        c.taken["mask.window"], c.taken["mask.window.left"] = kind_src, w_src
        mask.append({"type": "window", "left": _int(window, _key(w_src)) - 1, "right": 0})
    return mask


def _encoder_mask(c: _Config) -> list[dict[str, Any]]:
    """BERT, RoBERTa and T5 attend both ways (their models' create_bidirectional_mask, no
    mask without padding); with ``is_decoder`` their models build the causal mask."""
    decoder, src = c.get("is_decoder")
    if not decoder:
        c.taken["mask"] = src  # an encoder: no mask
        return []
    c.taken["mask.causal"] = src
    return [{"type": "causal"}]


def _encoder(c: _Config) -> tuple[dict[str, Any], tuple[str, ...], tuple[int, str] | None]:
    """The encoders' own fields: BERT's and RoBERTa's output block (BertSelfOutput:
    LayerNorm(dense(attention) + x), eps ``layer_norm_eps``; it holds only with
    ``output.LayerNorm`` in the state dict), T5's scale 1 (T5Attention.scaling) and bucketed
    relative bias (``bidirectional`` unless ``is_decoder``; the table is layer 0's
    ``relative_attention_bias.weight``, which T5Stack uses for every layer)."""
    why = f"model_type {c.model_type}"
    if c.family in _BERTS:
        eps, e_src = c.get("layer_norm_eps")
        c.taken["residual"] = f"{why} (BertSelfOutput: LayerNorm(dense(attention) + x))"
        norm = {"eps": c.take("layer_norm.eps", e_src, _num(eps, _key(e_src), _POSITIVE))}
        return {"residual": True, "layer_norm": norm}, ("residual", "layer_norm"), None
    decoder, d_src = c.get("is_decoder")
    buckets, b_src = c.get("relative_attention_num_buckets")
    distance, m_src = c.get("relative_attention_max_distance")
    c.taken["relative_bias"] = f"{why} (layer 0's relative_attention_bias.weight, every layer)"
    bias = {
        "bidirectional": c.take("relative_bias.bidirectional", d_src, not decoder),
        "max_distance": c.take("relative_bias.max_distance", m_src, _int(distance, _key(m_src))),
    }
    scale = c.take("scale", f"{why} (T5Attention.scaling: 1)", 1.0)
    return {"relative_bias": bias, "scale": scale}, (), (_int(buckets, _key(b_src)), b_src)
