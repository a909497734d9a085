"""Response models for /docs, built from the outputs table (:mod:`service.trace.outputs`).
The routes stream orjson bytes built from arrays directly, so these models describe the body
without being built for each request. Arrays gain a leading B when the request was batched."""

from dataclasses import asdict
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.config import JsonDict

from service.core.diagnosis.search import MASKED_FLOOR
from service.trace.comparison import DIAGNOSIS_TIMES
from service.trace.output_table import Kind, Output
from service.trace.outputs import in_heads, top_level
from service.trace.shapes import Endpoint

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
    config: dict[str, str] | None = Field(
        None, description='with config: {field: the config key it came from, or "request"}'
    )
    config_fields: dict[str, Any] | None = Field(
        None,
        description="with config: the fields it gave, as the service read them (the request "
        "with these fields and without config is the same layer; the request's own fields win)",
    )
    config_keys: list[str] | None = Field(
        None,
        description="with config: its other keys, judged not to change the attention layer "
        "(vocabulary, MLP and MoE sizes, dropout, initialisation …); every other key is "
        "applied (listed in config), read to check the layer (model_type, num_hidden_layers, "
        "hidden_size, max_position_embeddings), null or false, or refused with a 422",
    )


class Diagnosis(BaseModel):
    """The mistakes whose recomputation reproduces the caller's array."""

    mistakes: list[str] = Field(description="codes, e.g. softmax_over_queries")
    explanation: str = Field(description="what went wrong, in words")
    alternatives: list[list[str]] = Field(
        description="other sets of as many mistakes that reproduce your numbers as closely "
        "(e.g. rope_missing beside decode_position_offset for a new token rotated at 0); the "
        "one the request makes likelier is named in mistakes"
    )


class LowPrecision(BaseModel):
    """A low-precision verdict: yours match when ``yours`` ≤ 2 · ``reference`` + the type's
    atol (bfloat16 and float16 1e-3, float32 1e-5), as FlashAttention's tests judge a kernel."""

    type: str = Field(description="bfloat16, float16 or float32")
    yours: float | None = Field(description="your largest |yours − ours| (null: infinite)")
    reference: float | None = Field(
        description="the largest |ours in the type − ours|: the same attention with the inputs "
        "and each step's result rounded to the type, in float32 arithmetic"
    )


class Compared(BaseModel):
    """One of the caller's arrays against the service's."""

    # the explorer reads it: a caller's score at or below it counts as masked (−∞)
    model_config = ConfigDict(json_schema_extra={"x-masked-floor": MASKED_FLOOR})

    name: str = Field(description="the output's name; heads.<i>.<name> per head on /multihead")
    match: bool = Field(description="every number within the tolerance")
    max_abs_diff: float | None = Field(
        description="the largest |yours − ours| (null: one side is null, the other a number)"
    )
    where: list[int] = Field(description="index of the largest difference")
    ours: float | None = Field(description="the service's number there (null: −∞ or NaN)")
    yours: float | None = Field(description="your number there")
    printed: dict[str, int] | None = Field(
        description='the precision your array was printed with and compared at, {"decimals": n} '
        'or {"significant": n}, when no tolerance was given and every number of it has at most '
        "8 decimals (else 8 significant digits); null when compared with the tolerance"
    )
    precision: LowPrecision | None = Field(
        description="when your numbers were judged at a low precision (tolerance.precision, or "
        "no tolerance and every number one of bfloat16's or float16's): the type, your largest "
        "error and that of ours computed in the type; null otherwise"
    )
    message: str = Field(description="the same in a sentence")
    diagnosis: Diagnosis | None = Field(
        description="for the first difference: the mistakes that reproduce it; null when no "
        "listed mistake (alone or in pairs) does, or none of those tried before the diagnosis "
        "stopped at its budget (see diagnosis_complete)"
    )
    diagnosis_complete: bool | None = Field(
        description="for the first difference: true when every candidate set of mistakes was "
        "tried, false when the diagnosis stopped at its compute budget "
        f"({DIAGNOSIS_TIMES} times the numbers the request computes) before that, and the "
        "message says how many were tried and how to get a full diagnosis; null for every "
        "other entry"
    )


class DecodeCheck(BaseModel):
    """Prefill against decoding a token at a time."""

    max_abs_diff: float = Field(description="0 up to float rounding when the layer is right")
    steps: int = Field(description="decode steps run: L")


class OnlineBlock(BaseModel):
    """One block of keys of the online softmax: each row's state after it."""

    keys: list[int] = Field(description="[start, end): the block's keys")
    m: list[float | None] | list[list[float | None]] = Field(
        description="each row's running max (null: −∞, no allowed key yet)"
    )
    l: list[float] | list[list[float]] = Field(  # noqa: E741
        description="each row's running sum: the old sum · exp(m_old − m_new) + the block's"
    )
    o: Matrix = Field(description="each row's running output: the weighted values so far / l")


class OnlineBackwardBlock(BaseModel):
    """One block of keys of FlashAttention-2's backward (Dao 2023, Algorithm 2)."""

    keys: list[int] = Field(description="[start, end): the block's keys")
    p: Matrix = Field(description="the block's weights, exp(s − L_i) from each row's log-sum-exp")
    dv: Matrix = Field(description="the block's values' gradient: pᵀ dO")
    dp: Matrix = Field(description="the block's weights' gradient: dO V_jᵀ")
    ds: Matrix = Field(description="the block's scores' gradient: p ∘ (dp − D), softcap's applied")
    dk: Matrix = Field(description="the block's keys' gradient: dsᵀ Q · scale")
    dq: Matrix = Field(description="the queries' gradient over the blocks so far: Σ ds K_j · scale")


class Warning(BaseModel):
    """Something that looks wrong in the request."""

    code: str = Field(description="mask_polarity")
    field: str = Field(description="the request field it is about")
    message: str = Field(description="what looks wrong and what to do")


TYPES: dict[Kind, Any] = {
    "matrix": Matrix,
    "vector": list[float] | list[list[float]],
    "stack": list[list[list[float]]] | list[list[list[list[float]]]],
    "nullable": NullableMatrix,
    "bool": BoolMatrix,
    "rows": list[int] | list[list[int]],
    "summary": list[SummaryRow] | list[list[SummaryRow]],
    "steps": list[Step],
    "labels": list[str],
    "float": float,
    "int": int,
    "conventions": Conventions,
    "weight": list[list[float]],
    "comparison": list[Compared],
    "name": str | None,
    "warnings": list[Warning],
    "check": DecodeCheck,
    "blocks": list[OnlineBlock],
    "backward_blocks": list[OnlineBackwardBlock],
    "numbers": list[float],
    "integers": list[int],
    "tensor": float | list[float] | list[list[float]],
    "tensors": dict[str, float | list[float] | list[list[float]]],
}  # and "heads", once HeadTrace is built below


def _field(out: Output) -> Any:
    """(type, Field) of one output for create_model; the explorer reads ``x-view``."""
    extra = None if out.view is None else cast(JsonDict, {"x-view": asdict(out.view)})
    if out.required:
        return TYPES[out.kind], Field(description=out.doc, json_schema_extra=extra)
    return TYPES[out.kind] | None, Field(None, description=out.doc, json_schema_extra=extra)


HeadTrace = create_model(
    "HeadTrace",
    __doc__="One head's scaled dot-product attention.",
    **{out.name: _field(out) for out in in_heads("multihead")},
)
TYPES["heads"] = list[HeadTrace]


def response_model(endpoint: Endpoint, name: str, doc: str) -> type[BaseModel]:
    """The documented body of an endpoint's 200 answer, one field per top-level output."""
    return create_model(name, __doc__=doc, **{out.name: _field(out) for out in top_level(endpoint)})


AttentionResponse = response_model(
    "attention", "AttentionResponse", "Every intermediate of scaled dot-product attention."
)
MaskResponse = response_model(
    "attention",
    "MaskResponse",
    "Everything /attention returns; mask, additive_mask, masked_scores and fully_masked_rows "
    "are always present here.",
)
MultiheadResponse = response_model(
    "multihead", "MultiheadResponse", "Every intermediate of a multi-head attention block."
)
