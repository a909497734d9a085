"""The position and score variants as a request writes them (API.md, "Position and score
variants" and "Today's layers"): clip_qkv, qk_norm, rope, v_norm, temperature,
attention_multiplier, softcap, alibi, relative_bias, sinks, positions. Fields and their
docs only; :mod:`service.trace.rules` checks them against the request's shapes."""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag

from service.core.types import QKNormOver, QKNormType, RopeStyle
from service.wire.schemas.fields import FiniteFloat, Int, NormWeight, Table, Vector
from service.wire.schemas.mask_fields import STRICT

MAX_POSITION = 2**53  # positions beyond ±2^53 are not exact in float64
# a context length (original_max_position, max_position, relative_bias.max_distance): any
# position count up to 2^53, where positions themselves end; beyond it int → float would round
ContextLength = Annotated[Int, Field(ge=1, le=MAX_POSITION)]


def flag_or_options(value: Any) -> str:
    """An object is an options object; anything else is read as true or false."""
    return "options" if isinstance(value, dict | BaseModel) else "flag"


def any_of(schema: dict[str, Any]) -> None:
    """Show a union picked by the input's type as anyOf, as plain unions are."""
    schema["anyOf"] = schema.pop("oneOf")


class QKNormOptions(BaseModel):
    """Normalise each query and key vector over its own d_k features (per head, as Qwen3), or
    each token's whole projection before the head split (OLMo 2)."""

    model_config = STRICT
    type: QKNormType = Field(
        "rms",
        description="rms: x / sqrt(mean(x²) + eps) · w (RMSNorm); layer: (x − mean) / "
        "sqrt(var + eps) · w + b (biased variance; b only when a bias is given)",
    )
    eps: FiniteFloat = Field(1e-6, ge=0, description="added under the square root")
    over: QKNormOver = Field(
        "head",
        description="head: each head's d_k features (Qwen3); projection: all h·d_k features of "
        "a token's query projection (h_kv·d_k of its keys) at once, before the head split "
        "(OLMo 2, OLMo 3, OLMoE, MiniMax-M2)",
    )
    q_weight: NormWeight | None = Field(
        None,
        description="the queries' weight w: [d_k] shared by the heads, [h][d_k] one per head "
        "(Cohere, StableLM), or with over projection [h·d_k] (default ones)",
    )
    k_weight: NormWeight | None = Field(
        None, description="the keys' weight w: [d_k], [h_kv][d_k] or [h_kv·d_k] (default ones)"
    )
    q_bias: NormWeight | None = Field(
        None, description="the queries' bias b (type layer only: Phi), shaped as q_weight"
    )
    k_bias: NormWeight | None = Field(
        None, description="the keys' bias b (type layer only: Phi), shaped as k_weight"
    )
    zero_centered: bool = Field(
        False, description="the weights apply as (1 + w), as Qwen3-Next stores them"
    )
    after_rope: bool = Field(
        False, description="normalise the rotated vectors, after RoPE (Llama 4's L2 norm)"
    )


class OnlineSoftmaxOptions(BaseModel):
    """FlashAttention's softmax, traced a block of keys at a time."""

    model_config = STRICT
    block_size: Int = Field(4, ge=1, description="keys per block")


class VNormOptions(BaseModel):
    """Gemma 4's norm of each value vector over its d_v features, with no weight."""

    model_config = STRICT
    type: Literal["rms"] = Field("rms", description="rms: v / sqrt(mean(v²) + eps)")
    eps: FiniteFloat = Field(1e-6, ge=0, description="added under the square root")


class TemperatureOptions(BaseModel):
    """A query scale log(⌊(p + position_shift)/floor_scale⌋ + 1) · attn_scale + 1: Llama 4's
    attention temperature on its layers without RoPE, Ministral 3's llama_4_scaling_beta after
    RoPE on every layer."""

    model_config = STRICT
    floor_scale: FiniteFloat = Field(
        8192.0,
        gt=0,
        description="positions per step of the temperature (Llama 4: floor_scale 8192; "
        "Ministral 3: rope_parameters.original_max_position_embeddings)",
    )
    attn_scale: FiniteFloat = Field(
        0.1,
        description="the temperature's slope (Llama 4: attn_scale 0.1; Ministral 3: "
        "rope_parameters.llama_4_scaling_beta)",
    )
    position_shift: Int = Field(
        1,
        ge=0,
        le=1,
        description="added to the position p before the division: 1 counts ⌊(p + 1)/floor_scale⌋ "
        "(Llama 4), 0 counts ⌊p/floor_scale⌋ (Ministral 3)",
    )


class LinearScalingOptions(BaseModel):
    """Linear position interpolation: positions divided by factor."""

    model_config = STRICT
    type: Literal["linear"]
    factor: FiniteFloat = Field(gt=0, description="positions are divided by this")


class Llama3ScalingOptions(BaseModel):
    """LLaMA 3.1's frequency scaling (Hugging Face rope_type "llama3")."""

    model_config = STRICT
    type: Literal["llama3"]
    factor: FiniteFloat = Field(8.0, gt=0, description="long wavelengths are slowed by this")
    low_freq_factor: FiniteFloat = Field(1.0, gt=0, description="below high_freq_factor")
    high_freq_factor: FiniteFloat = Field(4.0, gt=0, description="above low_freq_factor")
    original_max_position: ContextLength = Field(
        8192,
        description="the context the model was trained on "
        "(Hugging Face: original_max_position_embeddings)",
    )


class YarnScalingOptions(BaseModel):
    """YaRN (Hugging Face rope_type "yarn": gpt-oss, DeepSeek V3, Kimi K2, Qwen long context)."""

    model_config = STRICT
    type: Literal["yarn"]
    factor: FiniteFloat = Field(gt=0, description="slow pairs are interpolated: θ/factor")
    original_max_position: ContextLength = Field(
        description="the context the model was trained on (original_max_position_embeddings)"
    )
    beta_fast: FiniteFloat = Field(32.0, gt=0, description="pairs turning more often are kept")
    beta_slow: FiniteFloat = Field(1.0, gt=0, description="pairs turning less often: θ/factor")
    mscale: FiniteFloat | None = Field(
        None, description="with mscale_all_dim: the attention factor"
    )
    mscale_all_dim: FiniteFloat | None = Field(None, description="see mscale")
    truncate: bool = Field(True, description="the ramp's ends floored and ceiled (gpt-oss: false)")
    attention_factor: FiniteFloat | None = Field(
        None, gt=0, description="multiplies cos and sin (default 0.1·ln(factor) + 1, or mscale's)"
    )


class DynamicScalingOptions(BaseModel):
    """Dynamic NTK (Hugging Face rope_type "dynamic"): the base grows past the trained context."""

    model_config = STRICT
    type: Literal["dynamic"]
    factor: FiniteFloat = Field(gt=0, description="how fast the base grows with n")
    original_max_position: ContextLength = Field(
        description="n up to which nothing changes (Hugging Face: max_position_embeddings)"
    )


class LongRopeScalingOptions(BaseModel):
    """LongRoPE (Hugging Face rope_type "longrope": Phi-3, Phi-3.5, Phi-4-mini)."""

    model_config = STRICT
    type: Literal["longrope"]
    short_factor: Vector = Field(description="θ_i divided by short_factor[i] while n ≤ original")
    long_factor: Vector = Field(description="θ_i divided by long_factor[i] once n > original")
    original_max_position: ContextLength = Field(description="original_max_position_embeddings")
    factor: FiniteFloat | None = Field(
        None, gt=0, description="for the attention factor (default max_position ÷ original)"
    )
    max_position: ContextLength | None = Field(None, description="max_position_embeddings")
    attention_factor: FiniteFloat | None = Field(
        None, gt=0, description="multiplies cos and sin (default √(1 + ln f / ln original))"
    )


RopeScalingOptions = Annotated[
    LinearScalingOptions
    | Llama3ScalingOptions
    | YarnScalingOptions
    | DynamicScalingOptions
    | LongRopeScalingOptions,
    Field(discriminator="type"),
]


class RopeOptions(BaseModel):
    """Rotary position embedding (Su et al. 2021); `true` instead of this object means all
    defaults."""

    model_config = STRICT
    base: FiniteFloat = Field(
        10000.0, gt=0, description="θ_i = base^(−2i/rotary_dim) (Hugging Face: rope_theta)"
    )
    style: RopeStyle = Field(
        "half",
        description="half: feature i turns with feature i + rotary_dim/2 (rotate_half: GPT-NeoX, "
        "LLaMA, Qwen, Mistral in Hugging Face); interleaved: pairs (2i, 2i+1) (RoFormer, GPT-J, "
        "Meta's original LLaMA); proportional: pairs (i, i + d_k/2) over the whole head with "
        "θ_i = base^(−2i/d_k), only the first rotary_dim/2 pairs turning (Gemma 4)",
    )
    rotary_dim: Int | None = Field(
        None, ge=2, description="features that turn (even, ≤ d_k; default d_k); the rest pass"
    )
    scaling: RopeScalingOptions | None = Field(
        None,
        description='{"type": "linear", "factor": f}, or "llama3", "yarn", "dynamic", '
        '"longrope" with their fields',
    )


# where ALiBi's distances start (service.core.positions.ALIBI_ORIGINS)
AlibiOrigin = Literal["query", "zero", "last_key"]


class AlibiOptions(BaseModel):
    """ALiBi (Press et al. 2022); `true` instead of this object means the paper's slopes."""

    model_config = STRICT
    slopes: Vector | None = Field(
        None, description="one slope per head (default: the paper's 2^(−8h/n) rule)"
    )
    symmetric: bool = Field(
        False, description="−slope·|p'_j − p_i| (bidirectional) instead of slope·(p'_j − p_i)"
    )
    origin: AlibiOrigin = Field(
        "query",
        description="where each key's distance starts: \"query\" slope·(p'_j − p_i) (the "
        "paper's); \"zero\" slope·p'_j (BLOOM, Falcon: the key's position alone); "
        "\"last_key\" slope·(p'_j − p'_last) (MPT: from the last key). A constant per query "
        "row: the weights are the same, position_bias and biased_scores differ",
    )


class RelativeBiasOptions(BaseModel):
    """T5's learned relative position bias."""

    model_config = STRICT
    table: Table = Field(
        description="num_buckets × n (one column per head; a vector of num_buckets on /attention)"
    )
    bidirectional: bool = Field(
        True, description="half the buckets for keys after the query (encoders); false: decoders"
    )
    max_distance: ContextLength = Field(
        128, description="distances from here on share the last bucket"
    )


_BY_TYPE = Discriminator(flag_or_options)  # errors come from the branch the input's type picks
QKNormSetting = Annotated[
    Annotated[bool, Tag("flag")] | Annotated[QKNormOptions, Tag("options")], _BY_TYPE
]
RopeSetting = Annotated[
    Annotated[bool, Tag("flag")] | Annotated[RopeOptions, Tag("options")], _BY_TYPE
]
VNormSetting = Annotated[
    Annotated[bool, Tag("flag")] | Annotated[VNormOptions, Tag("options")], _BY_TYPE
]
AlibiSetting = Annotated[
    Annotated[bool, Tag("flag")] | Annotated[AlibiOptions, Tag("options")], _BY_TYPE
]
Position = Annotated[Int, Field(ge=-MAX_POSITION, le=MAX_POSITION)]


class VariantFields(BaseModel):
    """The variants every compute endpoint accepts (API.md, "Position and score variants"),
    applied in this order: clip_qkv, qk_norm, rope (qk_norm after it when after_rope),
    temperature, v_norm, scores (scaled by attention_multiplier when given), softcap, alibi or
    relative_bias, mask, sinks."""

    model_config = STRICT
    clip_qkv: FiniteFloat | None = Field(
        None,
        gt=0,
        description="c: clamp every number of Q, K and V to [−c, c] right after the projections "
        "(OLMo, OLMoE, DBRX: config clip_qkv); returns q_clipped, k_clipped, v_clipped",
    )
    qk_norm: QKNormSetting = Field(
        False,
        description='true or {"type": "rms" | "layer", "eps", "over": "head" | "projection", '
        '"q_weight", "k_weight", "q_bias", "k_bias", "zero_centered", "after_rope"}: normalise '
        "each query and key vector (or each token's whole projection, over projection) before "
        "RoPE (Qwen3, Gemma, OLMo 2) or after it (Llama 4); returns q_normed, k_normed",
        json_schema_extra=any_of,
    )
    v_norm: VNormSetting = Field(
        False,
        description='true or {"type": "rms", "eps"}: normalise each value vector, no weight '
        "(Gemma 4); returns v_normed",
        json_schema_extra=any_of,
    )
    temperature: TemperatureOptions | None = Field(
        None,
        description='{"floor_scale", "attn_scale"}: multiply the query at position p by '
        "log(⌊(p + 1)/floor_scale⌋ + 1) · attn_scale + 1 (Llama 4's layers without RoPE); "
        "returns q_tempered",
    )
    rope: RopeSetting = Field(
        False,
        description='true or {"base", "style", "rotary_dim", "scaling"}: rotary position '
        "embedding of queries and keys; returns q_rotated, k_rotated",
        json_schema_extra=any_of,
    )
    attention_multiplier: FiniteFloat | None = Field(
        None,
        gt=0,
        description="the scale the layer sets itself, in place of 1/sqrt(d_k): scaled_scores = "
        "Q Kᵀ · attention_multiplier (Granite: config attention_multiplier); not with scale",
    )
    softcap: FiniteFloat | None = Field(
        None, gt=0, description="c: capped_scores = c · tanh(scaled_scores / c) (Gemma 2)"
    )
    alibi: AlibiSetting = Field(
        False,
        description='true or {"slopes", "symmetric"}: add slope · (p\'_j − p_i) to the scores '
        "(Press et al. 2022); returns position_bias, biased_scores",
        json_schema_extra=any_of,
    )
    relative_bias: RelativeBiasOptions | None = Field(
        None,
        description="T5's bucketed relative position bias; returns position_bias, biased_scores",
    )
    online_softmax: OnlineSoftmaxOptions | None = Field(
        None,
        description='{"block_size": 4}: the softmax a block of keys at a time, as FlashAttention '
        "computes it; returns online_softmax, one entry per block: the running max m, sum l and "
        "output o of every query row",
    )
    check_decode: bool = Field(
        False,
        description="run the sequence at once (prefill) and a token at a time with a growing "
        "cache, and compare: returns decode_check {max_abs_diff, steps}",
    )
    positions: list[Position] | None = Field(
        None, fail_fast=True, description="the L queries' positions (default 0 … L−1)"
    )
    context_positions: list[Position] | None = Field(
        None, fail_fast=True, description="the S keys' positions (default 0 … S−1)"
    )
