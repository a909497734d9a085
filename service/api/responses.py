"""Response models: they document every field in /docs. The routes return orjson bytes built
from arrays directly, so these models describe the body without being built for each request.
Arrays gain a leading B when the request was batched."""

from pydantic import BaseModel, Field

Matrix = list[list[float]] | list[list[list[float]]]
NullableMatrix = list[list[float | None]] | list[list[list[float | None]]]
BoolMatrix = list[list[bool]] | list[list[list[bool]]]


class SummaryRow(BaseModel):
    """One query row at a glance."""

    token: str | None = Field(description="the query's token (null when no tokens were given)")
    top_key: str | None = Field(
        description="the key token it attends to most (null if unknown or the row is all zero)"
    )
    top_key_index: int | None = Field(
        description="index of that key (null when the row's weights are all zero)"
    )
    top_weight: float = Field(description="its weight")
    entropy_bits: float = Field(
        description="entropy of the row's weights in bits (0: all on one key)"
    )


class Step(BaseModel):
    """One operation performed, in order."""

    name: str = Field(description="the output it produced, e.g. scores")
    formula: str = Field(description="what was computed, e.g. Q Kᵀ")
    shape: list[int] = Field(description="shape of the result")


class Conventions(BaseModel):
    """The conventions this answer was computed with."""

    weight_layout: str = Field(description="in_out: X @ W; out_in: X @ W.T")
    generated_weight_layout: str = Field(
        description="generated weights are always drawn in in_out layout"
    )
    scale: str = Field(description="1/sqrt(d_k) or given")
    boolean_masks: str = Field(description="true = may attend")
    causal_alignment: str = Field(description="upper_left or lower_right")
    fully_masked_rows: str = Field(description="zero, uniform or error")
    softmax: str = Field(description="row-wise over keys, max-subtracted")
    json_non_finite: str = Field(description="how −∞ appears in JSON: null")


class _Common(BaseModel):
    scale: float = Field(description="the factor applied to Q Kᵀ")
    d_k: int = Field(description="width of queries and keys (per head in /multihead)")
    d_v: int = Field(description="width of values (per head in /multihead)")
    tokens: list[str] | None = Field(None, description="labels of the L queries, when known")
    context_tokens: list[str] | None = Field(None, description="labels of the S keys, when known")
    conventions: Conventions
    summary: list[SummaryRow] | list[list[SummaryRow]] | None = Field(
        None,
        description="per query row: top key, its weight and the entropy (per batch item when batched)",
    )
    steps: list[Step] | None = Field(None, description="every operation performed, in order")
    mask: BoolMatrix | None = Field(None, description="the combined mask [L][S], true = may attend")
    additive_mask: NullableMatrix | None = Field(
        None, description="0 where allowed, null (−∞) where masked, plus additive values"
    )
    fully_masked_rows: list[int] | list[list[int]] | None = Field(
        None, description="query rows with no key allowed (per batch item when batched)"
    )
    x: list[list[float]] | None = Field(None, description="generated x, when it was generated")
    w_q: list[list[float]] | None = Field(
        None, description="generated w_q (in_out), when generated"
    )
    w_k: list[list[float]] | None = Field(
        None, description="generated w_k (in_out), when generated"
    )
    w_v: list[list[float]] | None = Field(
        None, description="generated w_v (in_out), when generated"
    )


class AttentionResponse(_Common):
    """Every intermediate of scaled dot-product attention."""

    q: Matrix | None = Field(None, description="queries [L][d_k]")
    k: Matrix | None = Field(None, description="keys [S][d_k]")
    v: Matrix | None = Field(None, description="values [S][d_v]")
    scores: Matrix | None = Field(None, description="Q Kᵀ [L][S]")
    scaled_scores: Matrix | None = Field(None, description="Q Kᵀ · scale [L][S]")
    masked_scores: NullableMatrix | None = Field(
        None,
        description="scaled scores plus the mask; null where masked (only when a mask applies)",
    )
    weights: Matrix | None = Field(
        None, description="row softmax of the (masked) scaled scores [L][S]"
    )
    output: Matrix | None = Field(None, description="weights V [L][d_v]")


class MaskResponse(AttentionResponse):
    """Everything /attention returns, plus the combined mask (always present here)."""


class HeadTrace(BaseModel):
    """One head's scaled dot-product attention."""

    q: Matrix | None = None
    k: Matrix | None = None
    v: Matrix | None = None
    scores: Matrix | None = None
    scaled_scores: Matrix | None = None
    masked_scores: NullableMatrix | None = None
    weights: Matrix | None = None
    output: Matrix | None = None


class MultiheadResponse(_Common):
    """Every intermediate of a multi-head attention block."""

    heads: list[HeadTrace] | None = Field(None, description="h per-head traces")
    average_weights: Matrix | None = Field(
        None,
        description="mean of the heads' weights (nn.MultiheadAttention average_attn_weights=True)",
    )
    x_in: Matrix | None = Field(
        None, description="x after positional encoding (when one is applied)"
    )
    concat: Matrix | None = Field(None, description="the heads' outputs side by side [L][h·d_v]")
    projected: Matrix | None = Field(None, description="concat W_o + b_o")
    residual: Matrix | None = Field(None, description="x_in + projected (when asked)")
    layer_norm: Matrix | None = Field(None, description="layer norm of the residual (when asked)")
    output: Matrix | None = Field(None, description="the final result")
    num_heads: int = Field(description="h")
    num_kv_heads: int = Field(description="key/value heads (h unless grouped-query attention)")
