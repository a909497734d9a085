"""The request bodies of POST /attention, /mask and /multihead: fields and their docs, and the
two things /multihead reads from the body's own keys before its aliases merge them (the names
the body gave, for the state dict's check; StableLM's per-head norm names, gathered)."""

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    Tag,
    model_validator,
)

from service.core.types import FullyMaskedPolicy, Init, NormOver, WeightLayout
from service.wire.errors import FieldError
from service.wire.schemas.expected_fields import ExpectedArrays, ToleranceOptions
from service.wire.schemas.fields import (
    FiniteFloat,
    GradOutput,
    Heads,
    Int,
    Matrix,
    NormWeight,
    PaddingFlags,
    Positional,
    Sequence,
    Text,
    Vector,
)
from service.wire.schemas.mask_fields import STRICT, MaskList
from service.wire.schemas.variant_fields import VariantFields, any_of, flag_or_options

# how a fused projection holds W_q, W_k and W_v (service.wire.fused.LAYOUTS)
QkvLayout = Literal["rows", "per_head", "grouped", "columns", "codegen"]
MAX_HEAD_ENTRIES = 1024  # refused before their weights are converted (num_heads has its own cap)


class InputFields(BaseModel):
    """Fields shared by the three compute endpoints."""

    model_config = STRICT

    x: Sequence | None = Field(
        None, description="input embeddings [L][d_model] (or [B][L][d_model])"
    )
    context: Sequence | None = Field(
        None, description="cross-attention: keys and values are projected from this [S][d_model]"
    )
    seed: Int | None = Field(
        None,
        ge=0,
        le=2**32 - 1,
        description="generated mode: numpy.random.RandomState(seed) draws missing arrays",
    )
    init: Init = Field(
        "uniform", description="generated mode: uniform = rand (U[0,1)), normal = randn (N(0,1))"
    )
    d_model: Int | None = Field(None, ge=1, description="generated mode: width of generated x")
    d_k: Int | None = Field(
        None,
        ge=1,
        description="generated mode: width of queries and keys (default d_model on /attention "
        "and /mask; d_model ÷ num_heads per head on /multihead)",
    )
    d_v: Int | None = Field(None, ge=1, description="generated mode: width of values (default d_k)")
    seq_len: Int | None = Field(
        None, ge=1, description="generated mode: L when there are no tokens"
    )
    tokens: list[Text] | None = Field(
        None, fail_fast=True, description="labels of the L queries (fix L in generated mode)"
    )  # a million bad labels: one error, not a million
    context_tokens: list[Text] | None = Field(
        None, fail_fast=True, description="labels of the S keys"
    )
    sentence: Text | None = Field(None, description="split on whitespace into tokens")
    weight_layout: WeightLayout = Field(
        "in_out",
        description="in_out: X @ W, W is (d_in, d_out); out_in: X @ W.T, W is (d_out, d_in) "
        "(PyTorch weights as they are). Generated weights are always in_out",
    )
    scale: FiniteFloat | None = Field(None, description="multiplies Q Kᵀ; default 1/sqrt(d_k)")
    mask: MaskList | None = Field(None, description="one mask object or a list, combined with AND")
    key_padding_mask: PaddingFlags | None = Field(
        None,
        description="[S] or [B][S], true = padding (that key is ignored), as torch's "
        "nn.MultiheadAttention key_padding_mask",
    )
    fully_masked_rows: FullyMaskedPolicy = Field(
        "zero", description="rows with every key masked: weights 0, 1/S, or a 422 naming the rows"
    )
    include: list[Text] | None = Field(
        None, fail_fast=True, description="output names to return (default: all)"
    )
    decimals: Int | None = Field(None, ge=0, le=15, description="round every returned float")
    expected: ExpectedArrays | None = Field(
        None,
        description="your own arrays by output name (q, k, v, q_rotated, scores, "
        "scaled_scores, masked_scores, weights, output, …; on /multihead also concat, "
        "projected, residual, layer_norm, the stacked weights and heads: a list of per-head "
        "objects), shaped as the response returns them; null is −∞ in masked scores and NaN "
        "elsewhere. The response then carries comparison and first_mismatch, and names the "
        "mistake behind the first difference when recomputing with it reproduces your numbers",
    )
    tolerance: ToleranceOptions | None = Field(
        None, description='when your numbers match: default {"atol": 1e-6, "rtol": 1e-6}'
    )
    grad_output: GradOutput | None = Field(
        None,
        description="the backward pass: ∂loss/∂(the answer's last array), shaped as it "
        "(output on /attention and /mask; on /multihead layer_norm, residual or projected, "
        'or concat when heads are given without W_o), or "sum" (every entry 1). The answer '
        "then carries grad_ + the name of every array the gradient reaches, and a step for "
        "each after the forward's",
    )


class AttentionPast(BaseModel):
    """A key/value cache as a Hugging Face cache holds it (keys already rotated)."""

    model_config = STRICT
    k: Sequence = Field(description="cached keys [P][d_k] ([B][P][d_k] when batched), rotated")
    v: Sequence = Field(description="cached values [P][d_v] ([B][P][d_v] when batched)")


class AttentionRequest(VariantFields, InputFields):
    """POST /attention: scaled dot-product attention, every step."""

    sinks: FiniteFloat | None = Field(
        None,
        description="a sink logit that joins each row's softmax as one more key with no value "
        "(gpt-oss); returns sink_weights",
    )

    past: AttentionPast | None = Field(
        None,
        description="a decode step: the cache's keys (rotated) and values; q, k, v (or x) are "
        "the new tokens at positions P … P + L − 1, causal lower-right over P + L keys; "
        "returns present_k, present_v",
    )
    w_q: Matrix | None = Field(
        None, description="query weights: d_model × d_k (in_out), d_k × d_model (out_in)"
    )
    w_k: Matrix | None = Field(
        None, description="key weights: d_model × d_k (in_out), d_k × d_model (out_in)"
    )
    w_v: Matrix | None = Field(
        None, description="value weights: d_model × d_v (in_out), d_v × d_model (out_in)"
    )
    b_q: Vector | None = Field(None, description="query bias [d_k]")
    b_k: Vector | None = Field(None, description="key bias [d_k]")
    b_v: Vector | None = Field(None, description="value bias [d_v]")
    q: Sequence | None = Field(None, description="direct mode: queries [L][d_k]")
    k: Sequence | None = Field(None, description="direct mode: keys [S][d_k]")
    v: Sequence | None = Field(None, description="direct mode: values [S][d_v]")


class MaskRequest(AttentionRequest):
    """POST /mask: attention with a mask, returning the mask itself too."""

    mask: MaskList | None = Field(
        None,
        description="one mask object or a list, combined with AND; required unless "
        "key_padding_mask is given",
    )


class LayerNormOptions(BaseModel):
    """Layer norm settings; `true` instead of this object means all defaults."""

    model_config = STRICT
    eps: FiniteFloat = Field(
        1e-5,
        gt=0,
        description="added to the variance before the square root (default 1e-5, as torch); "
        "must be greater than 0: with 0, a token whose features are all equal would divide 0 by 0",
    )
    gamma: Vector | None = Field(None, description="scale per feature (default 1)")
    beta: Vector | None = Field(None, description="shift per feature (default 0)")
    over: NormOver = Field(
        "features",
        description="features: per token (torch nn.LayerNorm); all: over the whole [L][d] matrix",
    )


LayerNormSetting = Annotated[
    Annotated[bool, Tag("flag")] | Annotated[LayerNormOptions, Tag("options")],
    Discriminator(flag_or_options),  # errors come from the branch the input's type picks
]


class GateOptions(BaseModel):
    """Qwen3-Next's output gate given as its own projection."""

    model_config = STRICT
    w: Matrix = Field(description="W_g [h·d_v][d_model], always out_in: gate = sigmoid(x W_gᵀ + b)")
    b: Vector | None = Field(None, description="b [h·d_v]")


class LatentOptions(BaseModel):
    """DeepSeek's multi-head latent attention: the sizes of its latents and heads."""

    model_config = STRICT
    q_lora_rank: Int | None = Field(
        description="the queries' latent width (q_a_proj); null: q_proj straight from x", ge=1
    )
    kv_lora_rank: Int = Field(ge=1, description="the keys' and values' latent width (c_kv)")
    qk_nope_head_dim: Int = Field(ge=0, description="each head's query/key features without RoPE")
    qk_rope_head_dim: Int = Field(ge=2, description="the rotated features; the key's are shared")
    v_head_dim: Int = Field(ge=1, description="each head's value width")
    eps: FiniteFloat = Field(1e-6, gt=0, description="the latents' RMSNorm epsilon")


GateSetting = Annotated[
    Annotated[bool, Tag("flag")] | Annotated[GateOptions, Tag("options")],
    Discriminator(flag_or_options),
]


class HeadWeights(BaseModel):
    """One head's own projections: d_model × d_k (d_v for w_v) in in_out layout, transposed in
    out_in."""

    model_config = STRICT
    w_q: Matrix
    w_k: Matrix
    w_v: Matrix
    b_q: Vector | None = None
    b_k: Vector | None = None
    b_v: Vector | None = None


# StableLM's per-head norm names (service.wire.fold reads them as q_norm/k_norm rows too)
PER_HEAD_NORM = re.compile(r"([qk])_layernorm\.norms\.(\d{1,4})\.weight")


def gathered_norms(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with each ``<q|k>_layernorm.norms.<i>.weight`` moved into a list
    ``<q|k>_layernorm.norms`` at index i; an index missing below the highest given is a 422
    naming it (never a shifted head)."""
    found = [(m, key) for key in data if (m := PER_HEAD_NORM.fullmatch(str(key)))]
    if not found:
        return data
    out = {k: v for k, v in data.items() if k not in {key for _, key in found}}
    for side in "qk":
        rows = {int(m[2]): data[key] for m, key in found if m[1] == side}
        gap = next((i for i in range(max(rows, default=0)) if i not in rows), None)
        if gap is not None:
            name = f"{side}_layernorm.norms.{gap}.weight"
            raise FieldError(
                name,
                f"the per-head norms run from {side}_layernorm.norms.0.weight: "
                f"StableLmLayerNormPerHead has {name}, which the request lacks; send the "
                f"module's state_dict() as it is (head {gap}'s norm cannot be drawn)",
            )
        if rows:
            out[f"{side}_layernorm.norms"] = [rows[i] for i in range(max(rows) + 1)]
    return out


def _named(*names: str) -> AliasChoices:
    """A field read under each of these names (a state dict's dotted name and its underscore
    form); the first is the one /docs shows."""
    return AliasChoices(*names)


# the encoders' state dict names of the q_proj/k_proj/v_proj/o_proj fields: BertAttention's
# (self.query …, output.dense), BertSelfAttention's alone (query …), T5Attention's (q, k, v, o;
# no biases); read as those fields and named so in errors
_ENCODER_NAMES: dict[str, tuple[str, ...]] = {
    "q_proj.weight": ("self.query.weight", "query.weight", "q.weight"),
    "k_proj.weight": ("self.key.weight", "key.weight", "k.weight"),
    "v_proj.weight": ("self.value.weight", "value.weight", "v.weight"),
    "q_proj.bias": ("self.query.bias", "query.bias"),
    "k_proj.bias": ("self.key.bias", "key.bias"),
    "v_proj.bias": ("self.value.bias", "value.bias"),
    "o_proj.weight": ("output.dense.weight", "o.weight"),
    "o_proj.bias": ("output.dense.bias",),
}


class MultiheadPast(BaseModel):
    """A key/value cache per key/value head, as a Hugging Face DynamicCache layer holds it."""

    model_config = STRICT
    k: Heads = Field(description="cached keys [h_kv][P][d_k] ([B][h_kv][P][d_k] batched), rotated")
    v: Heads = Field(description="cached values [h_kv][P][d_v] ([B][h_kv][P][d_v] batched)")


class MultiheadRequest(VariantFields, InputFields):
    """POST /multihead: multi-head attention with optional positional encoding, W_o, residual
    and layer norm."""

    # {field: config key, or "request"} once config is read (service.wire.fold)
    _config_taken: dict[str, str] | None = PrivateAttr(default=None)
    # the config's keys judged not to change the layer (service.wire.hf_config_keys)
    _config_keys: list[str] | None = PrivateAttr(default=None)
    # the fields the config gave, as the service read them (JSON values), for the answer
    _config_fields: dict[str, Any] | None = PrivateAttr(default=None)
    # how a fused projection was unpacked (service.wire.fused.Unpacked), for the unpack step
    _unpacked: Any = PrivateAttr(default=None)
    # gate: true as the body gave it (the folds make it gate.w from q_proj.weight's rows): the
    # backward packs the gate's gradient back into q_proj.weight (service.trace.gradients)
    _gate_rows: bool = PrivateAttr(default=False)
    # the body's own keys, as it spells them (the state-dict names it gives, before aliases
    # and the per-head gathering merge them): service.wire.fold checks them against the module
    _sent: tuple[str, ...] = PrivateAttr(default=())
    config: dict[str, Any] | None = Field(
        None,
        description="a Hugging Face model's config.json as it is: the fields it implies for "
        "layer (heads, head_dim, RoPE and its scaling, window, softcap, scale, norms, MLA …) are "
        "taken from it, fields given here win, a mask here is combined with its; "
        "conventions.config says where each came from",
    )
    layer: Int = Field(0, ge=0, description="the layer of config to take (default 0)")

    @model_validator(mode="before")
    @classmethod
    def _per_head_norms(cls, data: Any) -> Any:
        """StableLM's state dict names, ``q_layernorm.norms.<i>.weight``, gathered into
        ``q_layernorm.norms`` (row i from head i; a head left out below the last is a 422
        naming it) for :mod:`service.wire.fold` to read as ``q_norm.weight``."""
        return gathered_norms(data) if isinstance(data, dict) else data

    @model_validator(mode="wrap")
    @classmethod
    def _sent_keys(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        """The request, remembering the keys its body gave (run before _per_head_norms)."""
        req = handler(data)
        if isinstance(data, dict) and isinstance(req, MultiheadRequest):
            req._sent = tuple(k for k in data if isinstance(k, str))
        return req

    num_heads: Int | None = Field(
        None,
        ge=1,
        description="h; combined weights are split into h heads of d_k columns each (required "
        "unless q, k and v are given per head)",
    )
    num_kv_heads: Int | None = Field(
        None,
        ge=1,
        description="grouped-query attention: key/value heads; num_heads must be a multiple",
    )
    w_q: Matrix | None = Field(
        None,
        description="all heads' query weights: d_model × h·d_k (in_out), h·d_k × d_model "
        "(out_in); head i uses outputs i·d_k … (i+1)·d_k − 1",
    )
    w_k: Matrix | None = Field(
        None, description="key weights: d_model × h_kv·d_k (in_out), transposed in out_in"
    )
    w_v: Matrix | None = Field(
        None, description="value weights: d_model × h_kv·d_v (in_out), transposed in out_in"
    )
    b_q: Vector | None = Field(None, description="query bias [h·d_k]")
    b_k: Vector | None = Field(None, description="key bias [h_kv·d_k]")
    b_v: Vector | None = Field(None, description="value bias [h_kv·d_v]")
    heads: list[HeadWeights] | None = Field(
        None,
        fail_fast=True,
        max_length=MAX_HEAD_ENTRIES,
        description=f"per-head weights, one entry per head (at most {MAX_HEAD_ENTRIES})",
    )
    q_proj_weight: Matrix | None = Field(
        None,
        validation_alias=_named("q_proj.weight", "q_proj_weight", *_ENCODER_NAMES["q_proj.weight"]),
        description="Hugging Face q_proj.weight [h·d_k][d_model] (or nn.MultiheadAttention's "
        "q_proj_weight), always out_in; d_k = its rows ÷ num_heads",
    )
    k_proj_weight: Matrix | None = Field(
        None,
        validation_alias=_named("k_proj.weight", "k_proj_weight", *_ENCODER_NAMES["k_proj.weight"]),
        description="k_proj.weight [h_kv·d_k][d_model or the context's width], always out_in; "
        "num_kv_heads = its rows ÷ d_k",
    )
    v_proj_weight: Matrix | None = Field(
        None,
        validation_alias=_named("v_proj.weight", "v_proj_weight", *_ENCODER_NAMES["v_proj.weight"]),
        description="v_proj.weight [h_kv·d_v][d_model or the context's width], always out_in",
    )
    q_proj_bias: Vector | None = Field(
        None,
        validation_alias=_named("q_proj.bias", "q_proj_bias", *_ENCODER_NAMES["q_proj.bias"]),
        description="[h·d_k]",
    )
    k_proj_bias: Vector | None = Field(
        None,
        validation_alias=_named("k_proj.bias", "k_proj_bias", *_ENCODER_NAMES["k_proj.bias"]),
        description="[h_kv·d_k]",
    )
    v_proj_bias: Vector | None = Field(
        None,
        validation_alias=_named("v_proj.bias", "v_proj_bias", *_ENCODER_NAMES["v_proj.bias"]),
        description="[h_kv·d_v]",
    )
    q_norm_weight: NormWeight | None = Field(
        None,
        validation_alias=_named("q_norm.weight", "q_norm_weight", "q_layernorm.weight"),
        description="the queries' qk_norm weight: Qwen3's q_norm.weight [d_k], OLMo 2's over "
        "the projection [h·d_k], Cohere's per head [h][d_k], Phi's q_layernorm.weight [d_k] "
        "(turns qk_norm on, rms with eps 1e-6, unless qk_norm is given)",
    )
    k_norm_weight: NormWeight | None = Field(
        None,
        validation_alias=_named("k_norm.weight", "k_norm_weight", "k_layernorm.weight"),
        description="the keys' qk_norm weight: [d_k], [h_kv·d_k] or [h_kv][d_k]",
    )
    q_norm_bias: NormWeight | None = Field(
        None,
        validation_alias=_named("q_norm.bias", "q_norm_bias", "q_layernorm.bias"),
        description="the queries' qk_norm bias, type layer only (Phi's q_layernorm.bias [d_k])",
    )
    k_norm_bias: NormWeight | None = Field(
        None,
        validation_alias=_named("k_norm.bias", "k_norm_bias", "k_layernorm.bias"),
        description="the keys' qk_norm bias, type layer only (Phi's k_layernorm.bias [d_k])",
    )
    q_layernorm_norms: NormWeight | None = Field(
        None,
        validation_alias=_named("q_layernorm.norms"),
        description="StableLM's q_layernorm.norms.0.weight, q_layernorm.norms.1.weight …, one "
        "LayerNorm weight [d_k] per head, read as q_norm.weight [h][d_k]",
    )
    k_layernorm_norms: NormWeight | None = Field(
        None,
        validation_alias=_named("k_layernorm.norms"),
        description="StableLM's k_layernorm.norms.<i>.weight, read as k_norm.weight [h_kv][d_k]",
    )
    query_layernorm_weight: Vector | None = Field(
        None,
        validation_alias=_named("query_layernorm.weight", "query_layernorm_weight"),
        description="HunYuan's query_layernorm.weight [d_k]: the queries' qk_norm weight, "
        "normalising after RoPE; needs config or qk_norm (read as q_norm.weight)",
    )
    key_layernorm_weight: Vector | None = Field(
        None,
        validation_alias=_named("key_layernorm.weight", "key_layernorm_weight"),
        description="HunYuan's key_layernorm.weight [d_k]: the keys' qk_norm weight",
    )
    k_eq_v: bool = Field(
        False,
        description="the values are the keys (their projection, before norms and RoPE), as "
        "Gemma 4's full-attention layers: no w_v or v_proj.weight",
    )
    gate: GateSetting = Field(
        False,
        description='{"w", "b"}, or true with a state dict whose q_proj.weight has twice the '
        "rows (each head's query rows then its gate rows, as Qwen3-Next stores them): the "
        "heads' concat is multiplied by sigmoid(x W_gᵀ + b) before w_o; returns gate, gated",
        json_schema_extra=any_of,
    )
    past: MultiheadPast | None = Field(
        None,
        description="a decode step: the cache's keys (rotated) and values per key/value head; "
        "x (or q, k, v) are the new tokens at positions P … P + L − 1, causal lower-right over "
        "P + L keys; returns present_k, present_v",
    )
    mla: LatentOptions | None = Field(
        None,
        description="multi-head latent attention (DeepSeek V2/V3, Kimi K2) from the state dict's "
        "q_a_proj, q_a_layernorm, q_b_proj (or q_proj), kv_a_proj_with_mqa, kv_a_layernorm, "
        "kv_b_proj and o_proj; returns c_q, c_kv, k_rope, q_nope, q_rope, k_nope and "
        "mla_cache_numbers",
    )
    q_a_proj_weight: Matrix | None = Field(
        None,
        validation_alias=_named("q_a_proj.weight", "q_a_proj_weight"),
        description="MLA: [q_lora_rank][d_model], out_in",
    )
    q_a_proj_bias: Vector | None = Field(
        None, validation_alias=_named("q_a_proj.bias", "q_a_proj_bias"), description="[q_lora_rank]"
    )
    q_a_layernorm_weight: Vector | None = Field(
        None,
        validation_alias=_named("q_a_layernorm.weight", "q_a_layernorm_weight"),
        description="MLA: the query latent's RMSNorm weight [q_lora_rank]",
    )
    q_b_proj_weight: Matrix | None = Field(
        None,
        validation_alias=_named("q_b_proj.weight", "q_b_proj_weight"),
        description="MLA: [h·(qk_nope_head_dim + qk_rope_head_dim)][q_lora_rank], out_in",
    )
    kv_a_proj_with_mqa_weight: Matrix | None = Field(
        None,
        validation_alias=_named("kv_a_proj_with_mqa.weight", "kv_a_proj_with_mqa_weight"),
        description="MLA: [kv_lora_rank + qk_rope_head_dim][d_model], out_in",
    )
    kv_a_proj_with_mqa_bias: Vector | None = Field(
        None,
        validation_alias=_named("kv_a_proj_with_mqa.bias", "kv_a_proj_with_mqa_bias"),
        description="[kv_lora_rank + qk_rope_head_dim]",
    )
    kv_a_layernorm_weight: Vector | None = Field(
        None,
        validation_alias=_named("kv_a_layernorm.weight", "kv_a_layernorm_weight"),
        description="MLA: the key/value latent's RMSNorm weight [kv_lora_rank]",
    )
    kv_b_proj_weight: Matrix | None = Field(
        None,
        validation_alias=_named("kv_b_proj.weight", "kv_b_proj_weight"),
        description="MLA: [h·(qk_nope_head_dim + v_head_dim)][kv_lora_rank], out_in",
    )
    sinks: Vector | None = Field(
        None,
        description="gpt-oss sinks [h]: one sink logit per head joins each row's softmax as one "
        "more key with no value; returns sink_weights",
    )
    q: Heads | None = Field(
        None, description="direct mode: queries per head [h][L][d_k] or [B][h][L][d_k]"
    )
    k: Heads | None = Field(
        None, description="direct mode: keys per key/value head [h_kv][S][d_k] (or batched)"
    )
    v: Heads | None = Field(
        None, description="direct mode: values per key/value head [h_kv][S][d_v] (or batched)"
    )
    in_proj_weight: Matrix | None = Field(
        None, description="PyTorch packed [3·d_model][d_model] (rows q, k, v), always out_in"
    )
    in_proj_bias: Vector | None = Field(None, description="PyTorch packed [3·d_model] bias")
    w_o: Matrix | None = Field(
        None,
        description="output projection: h·d_v × d_out (in_out), d_out × h·d_v (out_in); "
        "default identity",
    )
    b_o: Vector | None = Field(None, description="output bias [d_out]")
    out_proj_weight: Matrix | None = Field(
        None,
        validation_alias=_named("out_proj_weight", "out_proj.weight"),
        description="PyTorch out_proj.weight [d_out][h·d_v], always out_in",
    )
    out_proj_bias: Vector | None = Field(
        None,
        validation_alias=_named("out_proj_bias", "out_proj.bias"),
        description="PyTorch out_proj.bias [d_out]",
    )
    o_proj_weight: Matrix | None = Field(
        None,
        validation_alias=_named(
            "o_proj.weight", "o_proj_weight", "dense.weight", *_ENCODER_NAMES["o_proj.weight"]
        ),
        description="Hugging Face o_proj.weight [d_out][h·d_v], always out_in (Phi names it "
        "dense.weight: read as o_proj.weight, and named so in errors)",
    )
    o_proj_bias: Vector | None = Field(
        None,
        validation_alias=_named(
            "o_proj.bias", "o_proj_bias", "dense.bias", *_ENCODER_NAMES["o_proj.bias"]
        ),
        description="Hugging Face o_proj.bias [d_out] (Phi's dense.bias)",
    )
    qkv_layout: QkvLayout | None = Field(
        None,
        description="how a fused projection (qkv_proj.weight, query_key_value.weight, "
        'Wqkv.weight, c_attn.weight) holds W_q, W_k and W_v: "rows" ([q; k; v] one after the '
        'other: Phi-3, MPT, DBRX, multi-query Falcon and GPTBigCode), "per_head" (each head\'s '
        'q, k, v in turn: GPT-NeoX, BLOOM, Falcon), "grouped" (each kv head\'s query heads, then '
        "its k and v: Falcon's new decoder), \"columns\" (GPT-2's Conv1D c_attn, stored "
        '[d_model][3·d_model]: columns q, k, v) or "codegen" (CodeGen\'s qkv_proj: 4 blocks, '
        "each its heads' q, v, k); a config's family implies it",
    )
    qkv_proj_weight: Matrix | None = Field(
        None,
        validation_alias=_named("qkv_proj.weight", "qkv_proj_weight"),
        description="a fused projection (Phi-3) [(h + 2·h_kv)·d_k][d_model], out_in, laid out "
        "as qkv_layout says; unpacked into q_proj, k_proj, v_proj (the unpack step)",
    )
    qkv_proj_bias: Vector | None = Field(
        None, validation_alias=_named("qkv_proj.bias", "qkv_proj_bias"), description="its bias"
    )
    query_key_value_weight: Matrix | None = Field(
        None,
        validation_alias=_named("query_key_value.weight", "query_key_value_weight"),
        description="a fused projection (GPT-NeoX, BLOOM, Falcon) [(h + 2·h_kv)·d_k][d_model], "
        "out_in, laid out as qkv_layout says; unpacked into q_proj, k_proj, v_proj",
    )
    query_key_value_bias: Vector | None = Field(
        None,
        validation_alias=_named("query_key_value.bias", "query_key_value_bias"),
        description="its bias",
    )
    wqkv_weight: Matrix | None = Field(
        None,
        validation_alias=_named("Wqkv.weight", "Wqkv_weight", "wqkv_weight"),
        description="MPT's and DBRX's fused projection Wqkv.weight [(h + 2·h_kv)·d_k][d_model], "
        "out_in, [q; k; v] rows (qkv_layout rows); unpacked into q_proj, k_proj, v_proj",
    )
    wqkv_bias: Vector | None = Field(
        None, validation_alias=_named("Wqkv.bias", "Wqkv_bias", "wqkv_bias"), description="its bias"
    )
    # GPT-2's and GPTBigCode's names: a fused projection and the output projection, whose
    # orientation is c_attn's layout's (GPT-2's Conv1D stores [in][out], GPTBigCode's Linear
    # [out][in])
    c_attn_weight: Matrix | None = Field(
        None,
        validation_alias=_named("c_attn.weight", "c_attn_weight"),
        description="a fused projection (GPT-2: a Conv1D [d_model][3·d_model], in_out; "
        "GPTBigCode: a Linear [(h + 2·h_kv)·d_k][d_model], out_in), laid out as qkv_layout "
        "says (its conv1d layouts read the columns); unpacked into q_proj, k_proj, v_proj",
    )
    c_attn_bias: Vector | None = Field(
        None, validation_alias=_named("c_attn.bias", "c_attn_bias"), description="its bias"
    )
    c_proj_weight: Matrix | None = Field(
        None,
        validation_alias=_named("c_proj.weight", "c_proj_weight"),
        description="the output projection beside c_attn.weight (GPT-2, GPTBigCode), read as "
        "o_proj.weight: transposed where c_attn's layout is Conv1D's (columns), as it is "
        "otherwise; only with c_attn.weight",
    )
    c_proj_bias: Vector | None = Field(
        None,
        validation_alias=_named("c_proj.bias", "c_proj_bias"),
        description="its bias, read as o_proj.bias",
    )
    positional_encoding: Positional | None = Field(
        None,
        description='"sinusoidal" (Vaswani et al. 2017) or an explicit [L][d_model] matrix, added to x',
    )
    residual: bool = Field(
        False, description="add the block's input (x after positional encoding) to its output"
    )
    layer_norm: LayerNormSetting = Field(
        False,
        description="true or options: layer norm applied after the residual",
        json_schema_extra=any_of,
    )
    # ---- the encoders' own state dict entries (service.wire.fold): BERT's and RoBERTa's
    # output.LayerNorm, T5's relative_attention_bias
    output_layer_norm_weight: Vector | None = Field(
        None,
        validation_alias=_named("output.LayerNorm.weight", "output_LayerNorm_weight"),
        description="BertAttention's output.LayerNorm.weight [d_model] (BERT, RoBERTa): with "
        "output.LayerNorm.bias, the block's residual and layer norm (its eps from config's "
        "layer_norm_eps, or layer_norm.eps): LayerNorm(output.dense(attention) + x)",
    )
    output_layer_norm_bias: Vector | None = Field(
        None,
        validation_alias=_named("output.LayerNorm.bias", "output_LayerNorm_bias"),
        description="BertAttention's output.LayerNorm.bias [d_model]",
    )
    relative_attention_bias_weight: Matrix | None = Field(
        None,
        validation_alias=_named("relative_attention_bias.weight", "relative_attention_bias_weight"),
        description="T5's relative_attention_bias.weight [num_buckets][h], layer 0's (T5 adds "
        "layer 0's bias on every layer): relative_bias's table, with config (model_type t5)",
    )
