"""Mask objects as a request writes them; :mod:`service.trace.rules` checks them against the
request's shapes and :mod:`service.trace.plan` turns them into :mod:`service.core.masks` specs."""

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.core.types import Alignment
from service.wire.schemas.fields import AdditiveMatrix, BoolMatrix, Int, Lengths

TrueMeans = Literal["attend", "masked"]  # what true says in a boolean mask

STRICT = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class CausalMask(BaseModel):
    """Causal: query i sees keys j ≤ i (upper_left) or j ≤ i + (S − L) (lower_right)."""

    model_config = STRICT
    type: Literal["causal"]
    alignment: Alignment = Field(
        "upper_left",
        description="upper_left: tril(ones(L, S)) as torch is_causal; lower_right: the diagonal "
        "ends at the last key (KV-cache style)",
    )


class PaddingMask(BaseModel):
    """Padding: keys at index ≥ key_lengths[b] are masked; query rows at index ≥
    query_lengths[b] are padding, their weights and output rows are zero. Give either or both."""

    model_config = STRICT
    type: Literal["padding"]
    key_lengths: Lengths = Field(
        None, description="valid keys per batch item (one int for an unbatched request)"
    )
    query_lengths: Lengths = Field(
        None, description="valid query rows per batch item (one int for an unbatched request)"
    )


class WindowMask(BaseModel):
    """Local window: query i sees keys j with i − left ≤ j ≤ i + right (JAX local_window_size)."""

    model_config = STRICT
    type: Literal["window"]
    left: Int | None = Field(None, ge=0, description="keys before the query it may see (null: all)")
    right: Int | None = Field(None, ge=0, description="keys after the query it may see (null: all)")


class ChunkedMask(BaseModel):
    """Chunked (Llama 4's attention_chunk_size): causal within blocks of ``size`` positions, query
    i sees keys j ≤ i with ⌊j/size⌋ = ⌊i/size⌋."""

    model_config = STRICT
    type: Literal["chunked"]
    size: Int = Field(ge=1, description="positions per block (attention_chunk_size)")


class BooleanMask(BaseModel):
    """An explicit [L][S] (or [B][L][S]) matrix, true (or 1) = may attend unless true_means
    says "masked"."""

    model_config = STRICT
    type: Literal["boolean"]
    matrix: BoolMatrix = Field(
        description="true or 1 = may attend, false or 0 = masked (see true_means)"
    )
    true_means: TrueMeans = Field(
        "attend",
        description="attend: true = may attend (torch scaled_dot_product_attention, JAX); "
        "masked: true = masked (nn.MultiheadAttention's attn_mask)",
    )


class AdditiveMask(BaseModel):
    """A float [L][S] (or [B][L][S]) matrix added to the scaled scores; null = −∞ (masked)."""

    model_config = STRICT
    type: Literal["additive"]
    matrix: AdditiveMatrix = Field(description="added to the scaled scores; null means −∞")


MaskItem = Annotated[
    CausalMask | PaddingMask | WindowMask | ChunkedMask | BooleanMask | AdditiveMask,
    Field(discriminator="type"),
]
MAX_MASKS = 64  # each mask costs a pass over B·L·S entries (counted in the computed numbers)
MaskList = Annotated[
    list[MaskItem],
    BeforeValidator(lambda v: [v] if isinstance(v, dict) else v),
    Field(min_length=1, max_length=MAX_MASKS),
]
