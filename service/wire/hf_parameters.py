"""The parameters a verified family's attention module has, by their state-dict names, as its
config decides them (issue 41: never silently wrong about a layer).

The reference is each family's transformers 5.23 ``modeling_<family>.py``: the attention
class's ``__init__`` (each ``nn.Linear``'s ``bias=config.<key>``, its q/k norms, gpt-oss's
``sinks``, DeepSeek's latent projections, Gemma 4's full layers without ``v_proj`` when the
values are the keys). A row (:data:`ROWS`) is one model type: the class and its parts, each
part a set of names present when all of its conditions hold (none: always), a condition
reading a config key (with the configuration class's default for a key the config leaves out)
or a field the config implies for the layer (``k_eq_v``).

service.wire.fold reads it for a request that gives ``config`` and its weights in the state
dict's form: a name the module has that the request lacks (a bias filtered out, o_proj left
out) is a 422 naming it, and so is a name the request has that the module does not have
(``q_proj.bias`` where ``attention_bias`` is false: the config and the weights are from two
models). Without the check the service would compute without the missing bias (or with an
identity o_proj, or q/k norm weights of ones) and answer 200 with another layer's numbers.

A part may name one parameter per head (``per``: StableLM's ``q_layernorm.norms.{i}.weight``
over the layer's num_heads) and say why the module has it where no condition does (T5's
table: layer 0's, which T5Stack passes on, so the request carries it on every layer). A row
may hold a module inside it whose state dict alone is also a layer (``alone``: BERT's and
RoBERTa's SelfAttention, without the output block). The names are the module's own, as the
request's body spells them (fused ``query_key_value.weight``, ``c_attn.weight``, BERT's
``self.query.weight``): fold compares them before any fold renames them.

Every verified model type has a row (tests/wire/test_hf_parameters.py: a type added without
one fails there). Rows leave out parameters without state (Llama 4's L2 q/k norm, Gemma 4's
unscaled v_norm have none) and buffers (GPT-J's and CodeGen's sin/cos tables are not saved).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from service.wire.hf_config_keys import shown


@dataclass(frozen=True)
class When:
    """A condition on a config key (``layer``: a field the config implies for the layer)."""

    key: str
    holds: Literal["true", "false", "set", "null"] = "true"
    default: Any = False  # the configuration class's value when the config leaves it out
    layer: bool = False


@dataclass(frozen=True)
class Part:
    """State-dict names the module has when every condition holds (no condition: always)."""

    names: str  # space-separated
    when: tuple[When, ...] = ()
    # a name per head: each name's ``{i}`` runs over range(the layer's field ``per``), as
    # StableLM's ``q_layernorm.norms.{i}.weight`` over num_heads
    per: str | None = None
    why: str = ""  # why the module has them, where no condition says it


@dataclass(frozen=True)
class Module:
    cls: str  # the attention class, as transformers 5.23 names it
    parts: tuple[Part, ...]
    # a module inside it whose state dict alone is also a layer (BertSelfAttention, inside
    # BertAttention without its output block): a request giving none of the whole's own names
    # is checked against it
    alone: "Module | None" = None


@dataclass(frozen=True)
class Names:
    """What a layer's module has and lacks of its family's names, each with why."""

    model_type: str
    cls: str
    has: tuple[tuple[str, str], ...]  # (name, why), in the module's order
    lacks: dict[str, str]  # {name: why} of the family's names this config leaves out
    alone: "Names | None" = None  # the inner module's, where a row has one (Module.alone)

    def own(self) -> set[str]:
        """The names the module has."""
        return {name for name, _ in self.has}

    def why_not(self, name: str) -> str:
        """Why the module lacks ``name``: the condition that fails, or its family's."""
        return self.lacks.get(name, f"model_type {self.model_type}")


_QKV_W = "q_proj.weight k_proj.weight v_proj.weight"
_QKVO_W = f"{_QKV_W} o_proj.weight"
_QKV_B = "q_proj.bias k_proj.bias v_proj.bias"
_QKVO_B = f"{_QKV_B} o_proj.bias"
_NORMS = "q_norm.weight k_norm.weight"


def _flag(key: str, default: bool) -> tuple[When, ...]:
    return (When(key, "true", default),)


def _llama(cls: str, key: str = "attention_bias", default: bool = False, *more: Part) -> Module:
    """q, k, v, o projections, all four with biases when ``key`` is true (LlamaAttention)."""
    return Module(cls, (Part(_QKVO_W), Part(_QKVO_B, _flag(key, default)), *more))


def _qkv_biased(cls: str, key: str, default: bool, *more: Part) -> Module:
    """q, k, v, o projections, q, k, v with biases when ``key`` is true, o_proj never."""
    return Module(cls, (Part(_QKVO_W), Part(_QKV_B, _flag(key, default)), *more))


def _plain(cls: str, *more: Part) -> Module:
    """q, k, v, o projections without biases, whatever the config says (Mistral)."""
    return Module(cls, (Part(_QKVO_W), *more))


_QK_NORMS = Part(_NORMS)  # q/k RMSNorms on every layer
_FULL_KV = When("k_eq_v", "false", layer=True)  # Gemma 4: no v_proj where values are keys
_LORA = When("q_lora_rank", "set", 1536)  # DeepSeek: q_a_proj … with a query latent
_MLA_BIAS = When("attention_bias")
_USE_QK_NORM = _flag("use_qk_norm", False)
# Phi's q/k nn.LayerNorm(head_dim) with qk_layernorm: weight and bias each
_LAYERNORMS = "q_layernorm.weight q_layernorm.bias k_layernorm.weight k_layernorm.bias"
_SELF = "query.weight query.bias key.weight key.bias value.weight value.bias"
_OUTPUT = "output.dense.weight output.dense.bias output.LayerNorm.weight output.LayerNorm.bias"
_T5_TABLE = "relative_attention_bias.weight"
_C_ATTN = "c_attn.weight c_attn.bias c_proj.weight c_proj.bias"

# one row per verified model type (transformers 5.23's attention class and its parameters)
ROWS: dict[str, Module] = {
    "llama": _llama("LlamaAttention"),
    "mistral": _plain("MistralAttention"),
    "mixtral": _plain("MixtralAttention"),
    "ministral": _plain("MinistralAttention"),
    "qwen2": Module("Qwen2Attention", (Part(_QKVO_W), Part(_QKV_B))),
    "qwen2_moe": _qkv_biased("Qwen2MoeAttention", "qkv_bias", True),
    "qwen3": _llama("Qwen3Attention", "attention_bias", False, _QK_NORMS),
    "qwen3_moe": _llama("Qwen3MoeAttention", "attention_bias", False, _QK_NORMS),
    # q_proj.weight holds each head's query rows then its gate rows (fold's _gate_rows)
    "qwen3_next": _llama("Qwen3NextAttention", "attention_bias", False, _QK_NORMS),
    "qwen3_5_text": _llama("Qwen3_5Attention", "attention_bias", False, _QK_NORMS),
    "qwen3_5_moe_text": _llama("Qwen3_5MoeAttention", "attention_bias", False, _QK_NORMS),
    "gemma": _llama("GemmaAttention"),
    "gemma2": _llama("Gemma2Attention"),
    "gemma3_text": _llama("Gemma3Attention", "attention_bias", False, _QK_NORMS),
    "gemma4_text": Module(
        "Gemma4TextAttention",
        (
            Part("q_proj.weight k_proj.weight"),
            Part("v_proj.weight", (_FULL_KV,)),
            Part("o_proj.weight"),
            Part("q_proj.bias k_proj.bias o_proj.bias", _flag("attention_bias", False)),
            Part("v_proj.bias", (When("attention_bias"), _FULL_KV)),
            _QK_NORMS,
        ),
    ),
    "starcoder2": _llama("Starcoder2Attention", "use_bias", True),
    "smollm3": _llama("SmolLM3Attention"),
    **{
        t: Module(
            cls,
            (
                Part("q_proj.weight", (When("q_lora_rank", "null", 1536),)),
                Part("q_a_proj.weight q_a_layernorm.weight q_b_proj.weight", (_LORA,)),
                Part("q_a_proj.bias", (_LORA, _MLA_BIAS)),
                Part("kv_a_proj_with_mqa.weight kv_a_layernorm.weight kv_b_proj.weight"),
                Part("kv_a_proj_with_mqa.bias", (_MLA_BIAS,)),
                Part("o_proj.weight"),
                Part("o_proj.bias", (_MLA_BIAS,)),
            ),
        )
        for t, cls in (
            ("deepseek_v2", "DeepseekV2Attention"),
            ("deepseek_v3", "DeepseekV3Attention"),
        )
    },
    "gpt_oss": _llama("GptOssAttention", "attention_bias", True, Part("sinks")),
    "llama4_text": _llama("Llama4TextAttention"),  # its L2 q/k norm has no weight
    "phimoe": _llama("PhimoeAttention"),
    "nemotron": _llama("NemotronAttention"),
    "seed_oss": _qkv_biased(
        "SeedOssAttention",
        "attention_bias",
        True,
        Part("o_proj.bias", _flag("attention_out_bias", False)),
    ),
    "phi3": Module("Phi3Attention", (Part("qkv_proj.weight o_proj.weight"),)),
    "glm4_moe": _qkv_biased(
        "Glm4MoeAttention", "attention_bias", False, Part(_NORMS, _flag("use_qk_norm", False))
    ),
    "apertus": _llama("ApertusAttention", "attention_bias", False, _QK_NORMS),
    "exaone4": _plain("Exaone4Attention", _QK_NORMS),
    "cohere2": _llama("Cohere2Attention"),
    "granite": _llama("GraniteAttention"),
    "granitemoe": _llama("GraniteMoeAttention"),
    "olmo": _llama("OlmoAttention"),
    "helium": _qkv_biased("HeliumAttention", "attention_bias", False),
    "ernie4_5": _llama("Ernie4_5Attention", "use_bias", False),
    "glm": _qkv_biased("GlmAttention", "attention_bias", True),
    "glm4": _qkv_biased("Glm4Attention", "attention_bias", True),
    "opt": Module(
        "OPTAttention",
        (
            Part(f"{_QKV_W} out_proj.weight"),
            Part(f"{_QKV_B} out_proj.bias", _flag("enable_bias", True)),
        ),
    ),
    "phi": Module(
        "PhiAttention",
        (
            Part(f"{_QKV_W} dense.weight"),
            Part(f"{_QKV_B} dense.bias"),
            Part(_LAYERNORMS, _flag("qk_layernorm", False)),
        ),
    ),
    "stablelm": _qkv_biased(
        "StableLmAttention",
        "use_qkv_bias",
        False,
        # StableLmLayerNormPerHead: an nn.LayerNorm(head_dim, bias=False) per head
        Part("q_layernorm.norms.{i}.weight", _flag("qk_layernorm", False), per="num_heads"),
        Part("k_layernorm.norms.{i}.weight", _flag("qk_layernorm", False), per="num_kv_heads"),
    ),
    "gpt_neox": Module(
        "GPTNeoXAttention",
        (
            Part("query_key_value.weight dense.weight"),
            Part("query_key_value.bias dense.bias", _flag("attention_bias", True)),
        ),
    ),
    # the encoders: BertAttention (BertSelfAttention under ``self.``, BertSelfOutput's dense
    # and LayerNorm under ``output.``), or BertSelfAttention's state dict alone
    **{
        t: Module(
            f"{prefix}Attention",
            (Part(" ".join(f"self.{n}" for n in _SELF.split())), Part(_OUTPUT)),
            alone=Module(f"{prefix}SelfAttention", (Part(_SELF),)),
        )
        for t, prefix in (("bert", "Bert"), ("roberta", "Roberta"))
    },
    # T5Attention: no biases; the table is layer 0's (has_relative_attention_bias), which T5Stack
    # passes to every layer: the request carries it on every layer (fold's _table_for)
    "t5": Module(
        "T5Attention",
        (
            Part("q.weight k.weight v.weight o.weight"),
            Part(_T5_TABLE, why=f"T5Stack adds the bias of layer 0's {_T5_TABLE} on every layer"),
        ),
    ),
    "gptj": Module("GPTJAttention", (Part(f"{_QKV_W} out_proj.weight"),)),
    "hunyuan_v1_dense": _llama(
        "HunYuanDenseV1Attention",
        "attention_bias",
        False,
        Part("query_layernorm.weight key_layernorm.weight"),  # RMSNorms after RoPE
    ),
    "ministral3": _plain("Ministral3Attention"),
    "olmo2": _llama("Olmo2Attention", "attention_bias", False, _QK_NORMS),
    "olmo3": _llama("Olmo3Attention", "attention_bias", False, _QK_NORMS),
    "olmoe": _llama("OlmoeAttention", "attention_bias", False, _QK_NORMS),
    # CohereLayerNorm (bias=False) per head, with use_qk_norm
    "cohere": _llama("CohereAttention", "attention_bias", False, Part(_NORMS, _USE_QK_NORM)),
    # the fused projections under their own names (service.wire.fused unpacks them)
    "bloom": Module(
        "BloomAttention",
        (Part("query_key_value.weight query_key_value.bias"), Part("dense.weight dense.bias")),
    ),
    "mpt": Module("MptAttention", (Part("Wqkv.weight out_proj.weight"),)),
    "dbrx": Module("DbrxAttention", (Part("Wqkv.weight out_proj.weight"),)),
    # FalconLinear's bias=config.bias, in each of the three layouts (the rows only change)
    "falcon": Module(
        "FalconAttention",
        (
            Part("query_key_value.weight dense.weight"),
            Part("query_key_value.bias dense.bias", _flag("bias", False)),
        ),
    ),
    # Conv1D (GPT-2) or nn.Linear (GPTBigCode), both with a bias; scale flags change no name
    "gpt2": Module("GPT2Attention", (Part(_C_ATTN),)),
    "gpt_bigcode": Module("GPTBigCodeAttention", (Part(_C_ATTN),)),
    "codegen": Module("CodeGenAttention", (Part("qkv_proj.weight out_proj.weight"),)),
}


def _value(w: When, config: Mapping[str, Any], fields: Mapping[str, Any]) -> tuple[Any, str]:
    """The condition's value and where it came from."""
    if w.layer:
        return fields.get(w.key, False), f"the layer's {w.key}"
    if w.key in config:
        return config[w.key], f"config says {w.key} {shown(config[w.key])}"
    return w.default, f"{w.key} absent (its default {shown(w.default)})"


def _holds(w: When, value: Any) -> bool:
    return {
        "true": bool(value),
        "false": not value,
        "set": value is not None,
        "null": value is None,
    }[w.holds]


def module_names(
    model_type: str, config: Mapping[str, Any], fields: Mapping[str, Any]
) -> Names | None:
    """The state-dict names ``model_type``'s attention module has for this config (its text
    part) and layer (``fields``: what the config implies for it); None without a row."""
    row = ROWS.get(model_type)
    return None if row is None else _names(model_type, row, config, fields)


def _names(
    model_type: str, row: Module, config: Mapping[str, Any], fields: Mapping[str, Any]
) -> Names:
    has: list[tuple[str, str]] = []
    lacks: dict[str, str] = {}
    for part in row.parts:
        read = [(w, *_value(w, config, fields)) for w in part.when]
        failed = next((why for w, value, why in read if not _holds(w, value)), None)
        why = "; ".join(why for _, _, why in read) or part.why or f"model_type {model_type}"
        for name in _expanded(part, fields):
            if failed is None:
                has.append((name, why))
            else:
                lacks.setdefault(name, failed)
    owned = {name for name, _ in has}
    alone = None if row.alone is None else _names(model_type, row.alone, config, fields)
    return Names(
        model_type,
        row.cls,
        tuple(has),
        {k: v for k, v in lacks.items() if k not in owned},
        alone,
    )


def _expanded(part: Part, fields: Mapping[str, Any]) -> list[str]:
    """The part's names, one per head where it has ``per`` (none where the layer's count is
    not known)."""
    names = part.names.split()
    if part.per is None:
        return names
    count = fields.get(part.per)
    heads = range(count) if isinstance(count, int) else range(0)
    return [name.format(i=i) for name in names for i in heads]
