"""Request models: the contract of API.md, its field descriptions and its validation.

Single fields are checked by their validators (arrays by :mod:`service.api.arrays`); checks that
involve several fields (shapes, input modes, tokens, masks) live in ``dims()`` methods, called
once by a model validator, so that every bad request is refused before any computing.
"""

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self

import numpy as np
from numpy.typing import NDArray
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)

from service.api.arrays import to_additive_matrix, to_array, to_bool_matrix
from service.core import masks

Array = NDArray[np.float64]


class FieldError(ValueError):
    """A problem with one named request field; the message is the sentence shown to the user."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


# ---- array fields ------------------------------------------------------------------------

_NUM: dict[str, Any] = {"type": "number"}
_ROW: dict[str, Any] = {"type": "array", "items": _NUM, "minItems": 1}
_MATRIX: dict[str, Any] = {"type": "array", "items": _ROW, "minItems": 1}
_BATCH: dict[str, Any] = {"type": "array", "items": _MATRIX, "minItems": 1}
_NULLABLE_ROW: dict[str, Any] = {"type": "array", "items": {"type": ["number", "null"]}}
_NULLABLE_MATRIX: dict[str, Any] = {"type": "array", "items": _NULLABLE_ROW}
_BOOL_ROW: dict[str, Any] = {"type": "array", "items": {"type": ["boolean", "integer"]}}
_BOOL_MATRIX: dict[str, Any] = {"type": "array", "items": _BOOL_ROW}


def _name(info: ValidationInfo) -> str:
    return info.field_name or "value"


def _sequence(value: Any, info: ValidationInfo) -> Array:
    return to_array(
        value, _name(info), (2, 3), "a matrix [L][d] (rows of numbers) or a batch [B][L][d]"
    )


def _matrix(value: Any, info: ValidationInfo) -> Array:
    return to_array(
        value, _name(info), (2,), "a matrix (rows of numbers); weights are never batched"
    )


def _vector(value: Any, info: ValidationInfo) -> Array:
    return to_array(value, _name(info), (1,), "a list of numbers")


def _bool_matrix(value: Any, info: ValidationInfo) -> NDArray[np.bool_]:
    return to_bool_matrix(value, _name(info))


def _additive_matrix(value: Any, info: ValidationInfo) -> Array:
    return to_additive_matrix(value, _name(info))


def _positional(value: Any, info: ValidationInfo) -> Literal["sinusoidal"] | Array:
    if value == "sinusoidal":
        return "sinusoidal"
    if isinstance(value, str):
        raise ValueError(
            f'positional_encoding must be "sinusoidal" or a matrix [L][d_model], got "{value[:20]}"'
        )
    return to_array(value, _name(info), (2,), 'a matrix [L][d_model], or "sinusoidal"')


Sequence = Annotated[Array, PlainValidator(_sequence), WithJsonSchema({"anyOf": [_MATRIX, _BATCH]})]
Matrix = Annotated[Array, PlainValidator(_matrix), WithJsonSchema(_MATRIX)]
Vector = Annotated[Array, PlainValidator(_vector), WithJsonSchema(_ROW)]
BoolMatrix = Annotated[
    NDArray[np.bool_],
    PlainValidator(_bool_matrix),
    WithJsonSchema({"anyOf": [_BOOL_MATRIX, {"type": "array", "items": _BOOL_MATRIX}]}),
]
AdditiveMatrix = Annotated[
    Array,
    PlainValidator(_additive_matrix),
    WithJsonSchema({"anyOf": [_NULLABLE_MATRIX, {"type": "array", "items": _NULLABLE_MATRIX}]}),
]
Positional = Annotated[
    Literal["sinusoidal"] | Array,
    PlainValidator(_positional),
    WithJsonSchema({"anyOf": [{"type": "string", "enum": ["sinusoidal"]}, _MATRIX]}),
]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Lengths = int | Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=4096)]

_STRICT = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


# ---- masks -------------------------------------------------------------------------------


class CausalMask(BaseModel):
    """Causal: query i sees keys j ≤ i (upper_left) or j ≤ i + (S − L) (lower_right)."""

    model_config = _STRICT
    type: Literal["causal"]
    alignment: Literal["upper_left", "lower_right"] = Field(
        "upper_left",
        description="upper_left: tril(ones(L, S)) as torch is_causal; lower_right: the diagonal "
        "ends at the last key (KV-cache style)",
    )

    def to_spec(self) -> masks.MaskSpec:
        return masks.Causal(self.alignment)


class PaddingMask(BaseModel):
    """Padding: keys at index ≥ key_lengths[b] are masked; query rows at index ≥
    query_lengths[b] are padding, their weights and output rows are zero."""

    model_config = _STRICT
    type: Literal["padding"]
    key_lengths: Lengths | None = Field(
        None, description="valid keys per batch item (one int for an unbatched request)"
    )
    query_lengths: Lengths | None = Field(
        None, description="valid query rows per batch item (one int for an unbatched request)"
    )

    @model_validator(mode="after")
    def _some_lengths(self) -> Self:
        if self.key_lengths is None and self.query_lengths is None:
            raise ValueError("a padding mask needs key_lengths, query_lengths or both")
        for name in ("key_lengths", "query_lengths"):
            value = getattr(self, name)
            if isinstance(value, int) and value < 0:
                raise ValueError(f"{name} must be 0 or more, got {value}")
        return self

    def lengths(self, name: str) -> tuple[int, ...] | None:
        value: Lengths | None = getattr(self, name)
        if value is None:
            return None
        return (value,) if isinstance(value, int) else tuple(value)

    def to_spec(self) -> masks.MaskSpec:
        return masks.Padding(self.lengths("key_lengths"), self.lengths("query_lengths"))


class WindowMask(BaseModel):
    """Local window: query i sees keys j with i − left ≤ j ≤ i + right (JAX local_window_size)."""

    model_config = _STRICT
    type: Literal["window"]
    left: int | None = Field(None, ge=0, description="keys before the query it may see (null: all)")
    right: int | None = Field(None, ge=0, description="keys after the query it may see (null: all)")

    def to_spec(self) -> masks.MaskSpec:
        return masks.Window(self.left, self.right)


class BooleanMask(BaseModel):
    """An explicit [L][S] (or [B][L][S]) matrix, true (or 1) = may attend."""

    model_config = _STRICT
    type: Literal["boolean"]
    matrix: BoolMatrix = Field(description="true or 1 = may attend, false or 0 = masked")

    def to_spec(self) -> masks.MaskSpec:
        return masks.Boolean(self.matrix)


class AdditiveMask(BaseModel):
    """A float [L][S] (or [B][L][S]) matrix added to the scaled scores; null = −∞ (masked)."""

    model_config = _STRICT
    type: Literal["additive"]
    matrix: AdditiveMatrix = Field(description="added to the scaled scores; null means −∞")

    def to_spec(self) -> masks.MaskSpec:
        return masks.Additive(self.matrix)


MaskItem = Annotated[
    CausalMask | PaddingMask | WindowMask | BooleanMask | AdditiveMask,
    Field(discriminator="type"),
]
MaskList = Annotated[
    list[MaskItem],
    BeforeValidator(lambda v: [v] if isinstance(v, dict) else v),
    Field(min_length=1),
]


class LayerNormOptions(BaseModel):
    """Layer norm settings; `true` instead of this object means all defaults."""

    model_config = _STRICT
    eps: float = Field(1e-5, gt=0, allow_inf_nan=False, description="added to the variance")
    gamma: Vector | None = Field(None, description="scale per feature (default 1)")
    beta: Vector | None = Field(None, description="shift per feature (default 0)")
    over: Literal["features", "all"] = Field(
        "features",
        description="features: per token (torch nn.LayerNorm); all: over the whole [L][d] matrix",
    )


class HeadWeights(BaseModel):
    """One head's own projections, each d_model × d_k (d_v for w_v) in the request's layout."""

    model_config = _STRICT
    w_q: Matrix
    w_k: Matrix
    w_v: Matrix
    b_q: Vector | None = None
    b_k: Vector | None = None
    b_v: Vector | None = None


# ---- shared input fields -----------------------------------------------------------------

INCLUDABLE_ATTENTION = (
    "q", "k", "v", "scores", "scaled_scores", "masked_scores", "weights", "output",
    "summary", "steps", "tokens", "context_tokens", "mask", "additive_mask",
    "fully_masked_rows", "x", "w_q", "w_k", "w_v",
)  # fmt: skip
INCLUDABLE_MULTIHEAD = (
    "heads", "average_weights", "x_in", "concat", "projected", "residual", "layer_norm",
    "output", "summary", "steps", "tokens", "context_tokens", "mask", "additive_mask",
    "fully_masked_rows", "x", "w_q", "w_k", "w_v",
)  # fmt: skip


@dataclass(frozen=True)
class Dims:
    """Sizes a request implies, known before anything is computed."""

    batch: int | None  # None: unbatched request
    seq_len: int  # L
    ctx_len: int  # S
    d_model: int | None  # None in direct mode
    d_k: int  # per head in /multihead
    d_v: int
    generate: tuple[str, ...]  # arrays to draw, in the contract's order
    tokens: list[str] | None
    context_tokens: list[str] | None


class InputFields(BaseModel):
    """Fields shared by the three compute endpoints."""

    model_config = _STRICT

    x: Sequence | None = Field(
        None, description="input embeddings [L][d_model] (or [B][L][d_model])"
    )
    context: Sequence | None = Field(
        None, description="cross-attention: keys and values are projected from this [S][d_model]"
    )
    w_q: Matrix | None = Field(None, description="query weights, d_model × d_k in in_out layout")
    w_k: Matrix | None = Field(None, description="key weights, d_model × d_k in in_out layout")
    w_v: Matrix | None = Field(None, description="value weights, d_model × d_v in in_out layout")
    b_q: Vector | None = Field(None, description="query bias [d_k]")
    b_k: Vector | None = Field(None, description="key bias [d_k]")
    b_v: Vector | None = Field(None, description="value bias [d_v]")
    seed: int | None = Field(
        None,
        ge=0,
        le=2**32 - 1,
        description="generated mode: numpy.random.RandomState(seed) draws missing arrays",
    )
    init: Literal["uniform", "normal"] = Field(
        "uniform", description="generated mode: uniform = rand (U[0,1)), normal = randn (N(0,1))"
    )
    d_model: int | None = Field(None, ge=1, description="generated mode: width of generated x")
    d_k: int | None = Field(None, ge=1, description="generated mode: width of queries and keys")
    d_v: int | None = Field(None, ge=1, description="generated mode: width of values (default d_k)")
    seq_len: int | None = Field(
        None, ge=1, description="generated mode: L when there are no tokens"
    )
    tokens: list[str] | None = Field(
        None, fail_fast=True, description="labels of the L queries (fix L in generated mode)"
    )  # a million bad labels: one error, not a million
    context_tokens: list[str] | None = Field(
        None, fail_fast=True, description="labels of the S keys"
    )
    sentence: str | None = Field(None, description="split on whitespace into tokens")
    weight_layout: Literal["in_out", "out_in"] = Field(
        "in_out", description="in_out: X @ W, W is (d_in, d_out); out_in: X @ W.T (PyTorch weights)"
    )
    scale: FiniteFloat | None = Field(None, description="multiplies Q Kᵀ; default 1/sqrt(d_k)")
    mask: MaskList | None = Field(None, description="one mask object or a list, combined with AND")
    fully_masked_rows: Literal["zero", "uniform", "error"] = Field(
        "zero", description="rows with every key masked: weights 0, 1/S, or a 422 naming the rows"
    )
    include: list[str] | None = Field(
        None, fail_fast=True, description="output names to return (default: all)"
    )
    decimals: int | None = Field(None, ge=0, le=15, description="round every returned float")

    includable: ClassVar[tuple[str, ...]] = INCLUDABLE_ATTENTION
    _checked: Dims | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _check_shapes(self) -> Self:
        self._checked = self.dims()
        return self

    def checked_dims(self) -> Dims:
        """The dims found when the request was validated (computed again if it was built
        without validation)."""
        return self._checked if self._checked is not None else self.dims()

    def dims(self) -> Dims:
        """Check how the fields fit together and return the sizes they imply."""
        raise NotImplementedError

    # -- pieces shared by the dims() of each endpoint --

    def _check_include(self) -> None:
        for name in self.include or ():
            if name not in self.includable:
                raise FieldError(
                    "include",
                    f'include names "{name[:40]}", which is not an output; choose from {", ".join(self.includable)}',
                )

    def _labels(
        self, seq_len: int | None, ctx_len: int | None
    ) -> tuple[list[str] | None, list[str] | None]:
        """tokens (from tokens or sentence) and context_tokens, checked against L and S."""
        if self.tokens is not None and self.sentence is not None:
            raise FieldError("sentence", "give tokens or sentence, not both")
        tokens = self.sentence.split() if self.sentence is not None else self.tokens
        if tokens is not None and not tokens:
            raise FieldError(
                "tokens", "tokens is empty" if self.sentence is None else "sentence has no words"
            )
        source = "sentence" if self.sentence is not None else "tokens"
        if tokens is not None and seq_len is not None and len(tokens) != seq_len:
            raise FieldError(
                source,
                f"{source} gives {len(tokens)} tokens but there are {seq_len} query rows (L)",
            )
        ctx = self.context_tokens
        if ctx is not None and ctx_len is not None and len(ctx) != ctx_len:
            raise FieldError(
                "context_tokens",
                f"context_tokens has {len(ctx)} labels but there are {ctx_len} keys (S)",
            )
        if ctx is None and self.context is None:
            ctx = tokens
        return tokens, ctx

    def _seq_len_from_labels(self) -> int | None:
        tokens, _ = self._labels(None, None)
        if tokens is not None:
            if self.seq_len is not None and self.seq_len != len(tokens):
                raise FieldError(
                    "seq_len", f"seq_len is {self.seq_len} but there are {len(tokens)} tokens"
                )
            return len(tokens)
        return self.seq_len

    def _sequence_dims(self) -> tuple[int | None, int, int, int | None]:
        """(B, L, S, d_model) from x, context and the generated-mode sizes."""
        batch = None
        if self.x is not None:
            batch = self.x.shape[0] if self.x.ndim == 3 else None
            seq_len, d_model = self.x.shape[-2:]
            if self.seq_len is not None and self.seq_len != seq_len:
                raise FieldError("seq_len", f"seq_len is {self.seq_len} but x has {seq_len} rows")
            if self.d_model is not None and self.d_model != d_model:
                raise FieldError(
                    "d_model", f"d_model is {self.d_model} but x has {d_model} columns"
                )
        else:
            if self.seed is None:
                raise FieldError(
                    "x",
                    "x is missing: give x, or give seed (with d_model and tokens, sentence or seq_len) to generate it",
                )
            found = self._seq_len_from_labels()
            if found is None:
                raise FieldError(
                    "seq_len",
                    "to generate x, give tokens, sentence or seq_len so the sequence length L is known",
                )
            seq_len = found
            d_model = self.d_model if self.d_model is not None else self._d_model_from_weights()
            if d_model is None:
                raise FieldError("d_model", "to generate x, give d_model (its number of columns)")
        ctx_len = seq_len
        if self.context is not None:
            c_batch = self.context.shape[0] if self.context.ndim == 3 else None
            if c_batch != batch:
                raise FieldError(
                    "context",
                    f"context is {_batch_words(c_batch)} but x is {_batch_words(batch)}: batch both or neither, with the same B",
                )
            ctx_len, c_width = self.context.shape[-2:]
            if c_width != d_model:
                raise FieldError(
                    "context",
                    f"context has {c_width} columns but x has {d_model}: both are projected by the same weights",
                )
        return batch, seq_len, ctx_len, d_model

    def _d_model_from_weights(self) -> int | None:
        for name in ("w_q", "w_k", "w_v"):
            w = getattr(self, name)
            if isinstance(w, np.ndarray):
                return int(w.shape[0] if self.weight_layout == "in_out" else w.shape[1])
        return None

    def _weight_out(self, name: str, w: Array, width: int, source: str | None = None) -> int:
        """Check a weight's input size (rows in in_out, columns in out_in) against ``width``,
        the width of what it multiplies (``source`` says what that is; default x / d_model);
        return its output size."""
        rows, cols = w.shape
        d_in, d_out = (rows, cols) if self.weight_layout == "in_out" else (cols, rows)
        if d_in != width:
            side = "rows" if self.weight_layout == "in_out" else "columns"
            if source is None:
                source = f"x has {width} columns" if self.x is not None else f"d_model is {width}"
            raise FieldError(
                name,
                f"{name} is {rows}×{cols} but {source}: with weight_layout {self.weight_layout} "
                f"{name} must have {width} {side}",
            )
        return int(d_out)

    def _check_bias(self, name: str, size: int, of: str) -> None:
        b = getattr(self, name)
        if b is not None and b.shape[0] != size:
            raise FieldError(name, f"{name} has {b.shape[0]} entries but {of} has width {size}")

    def _check_masks(self, batch: int | None, seq_len: int, ctx_len: int) -> None:
        items = self.mask or []
        for i, item in enumerate(items):
            field = f"mask[{i}]"
            if isinstance(item, BooleanMask | AdditiveMask):
                m = item.matrix
                if m.ndim == 3 and (batch is None or m.shape[0] != batch):
                    raise FieldError(
                        f"{field}.matrix",
                        f"{field}.matrix is a batch of {m.shape[0]} but the request is {_batch_words(batch)}",
                    )
                if m.shape[-2:] != (seq_len, ctx_len):
                    got = "×".join(map(str, m.shape[-2:]))
                    raise FieldError(
                        f"{field}.matrix",
                        f"{field}.matrix is {got} but the scores are L×S = {seq_len}×{ctx_len} ({seq_len} queries, {ctx_len} keys)",
                    )
            if isinstance(item, PaddingMask):
                for name, limit, what in (
                    ("key_lengths", ctx_len, "keys (S)"),
                    ("query_lengths", seq_len, "queries (L)"),
                ):
                    lengths = item.lengths(name)
                    if lengths is None:
                        continue
                    if len(lengths) not in (1, batch or 1):
                        raise FieldError(
                            f"{field}.{name}",
                            f"{field}.{name} has {len(lengths)} entries but the batch has {batch or 1} item(s)",
                        )
                    if max(lengths) > limit:
                        raise FieldError(
                            f"{field}.{name}",
                            f"{field}.{name} has {max(lengths)} but there are only {limit} {what}",
                        )

    def mask_specs(self) -> list[masks.MaskSpec]:
        """The request's masks as engine objects."""
        return [item.to_spec() for item in self.mask or []]


def _batch_words(batch: int | None) -> str:
    return "unbatched" if batch is None else f"a batch of {batch}"


class AttentionRequest(InputFields):
    """POST /attention: scaled dot-product attention, every step."""

    q: Sequence | None = Field(None, description="direct mode: queries [L][d_k]")
    k: Sequence | None = Field(None, description="direct mode: keys [S][d_k]")
    v: Sequence | None = Field(None, description="direct mode: values [S][d_v]")

    def dims(self) -> Dims:
        self._check_include()
        direct = [n for n in ("q", "k", "v") if getattr(self, n) is not None]
        projection = [
            n
            for n in (
                "x",
                "context",
                "w_q",
                "w_k",
                "w_v",
                "b_q",
                "b_k",
                "b_v",
                "seed",
                "d_model",
                "d_k",
                "d_v",
            )
            if getattr(self, n) is not None
        ]
        if direct:
            if projection:
                raise FieldError(
                    projection[0],
                    f"give either q, k and v (direct mode) or x with w_q, w_k, w_v (projections mode), not both: found {direct[0]} and {projection[0]}",
                )
            return self._direct_dims()
        return self._projection_dims()

    def _direct_dims(self) -> Dims:
        for n in ("q", "k", "v"):
            if getattr(self, n) is None:
                raise FieldError(n, f"direct mode needs q, k and v; {n} is missing")
        assert self.q is not None and self.k is not None and self.v is not None
        q, k, v = self.q, self.k, self.v
        if not q.ndim == k.ndim == v.ndim:
            raise FieldError(
                "k", "q, k and v must all be single matrices or all be batches [B][·][·]"
            )
        batch = q.shape[0] if q.ndim == 3 else None
        if batch is not None and not q.shape[0] == k.shape[0] == v.shape[0]:
            raise FieldError(
                "k",
                f"q, k and v must have the same batch size; got {q.shape[0]}, {k.shape[0]} and {v.shape[0]}",
            )
        if q.shape[-1] != k.shape[-1]:
            raise FieldError(
                "k",
                f"q has {q.shape[-1]} columns but k has {k.shape[-1]}: queries and keys need the same width d_k for Q Kᵀ",
            )
        if k.shape[-2] != v.shape[-2]:
            raise FieldError(
                "v",
                f"k has {k.shape[-2]} rows but v has {v.shape[-2]}: every key needs its value (S rows each)",
            )
        seq_len, ctx_len = q.shape[-2], k.shape[-2]
        tokens, ctx_tokens = self._labels(seq_len, ctx_len)
        self._check_masks(batch, seq_len, ctx_len)
        return Dims(batch, seq_len, ctx_len, None, q.shape[-1], v.shape[-1], (), tokens, ctx_tokens)

    def _projection_dims(self) -> Dims:
        batch, seq_len, ctx_len, d_model = self._sequence_dims()
        assert d_model is not None
        generate = ["x"] if self.x is None else []
        widths: dict[str, int] = {}
        for name in ("w_q", "w_k", "w_v"):
            w = getattr(self, name)
            if w is None:
                if self.seed is None:
                    raise FieldError(
                        name, f"{name} is missing: give {name}, or give seed and d_k to generate it"
                    )
                generate.append(name)
            else:
                widths[name] = self._weight_out(name, w, d_model)
        if "w_q" in widths and "w_k" in widths and widths["w_q"] != widths["w_k"]:
            raise FieldError(
                "w_k",
                f"w_q gives queries of width {widths['w_q']} but w_k gives keys of width {widths['w_k']}: they must match for Q Kᵀ",
            )
        d_k = widths.get("w_q", widths.get("w_k", self.d_k))
        if d_k is None:
            raise FieldError(
                "d_k", "to generate w_q and w_k, give d_k (the width of queries and keys)"
            )
        if self.d_k is not None and self.d_k != d_k:
            raise FieldError(
                "d_k", f"d_k is {self.d_k} but the given weights make queries of width {d_k}"
            )
        d_v = widths.get("w_v", self.d_v if self.d_v is not None else d_k)
        if self.d_v is not None and self.d_v != d_v:
            raise FieldError("d_v", f"d_v is {self.d_v} but w_v makes values of width {d_v}")
        self._check_bias("b_q", d_k, "Q")
        self._check_bias("b_k", d_k, "K")
        self._check_bias("b_v", d_v, "V")
        tokens, ctx_tokens = self._labels(seq_len, ctx_len)
        if self.x is not None and self.seq_len is not None and self.seq_len != seq_len:
            raise FieldError("seq_len", f"seq_len is {self.seq_len} but x has {seq_len} rows")
        self._check_masks(batch, seq_len, ctx_len)
        return Dims(batch, seq_len, ctx_len, d_model, d_k, d_v, tuple(generate), tokens, ctx_tokens)


class MaskRequest(AttentionRequest):
    """POST /mask: attention with a mask, returning the mask itself too."""

    mask: MaskList = Field(description="one mask object or a list, combined with AND")


@dataclass(frozen=True)
class MultiheadDims(Dims):
    """Dims plus the head layout of a /multihead request."""

    num_heads: int
    num_kv_heads: int
    d_out: int
    form: Literal["combined", "in_proj", "per_head"]


class MultiheadRequest(InputFields):
    """POST /multihead: multi-head attention with optional positional encoding, W_o, residual
    and layer norm."""

    includable: ClassVar[tuple[str, ...]] = INCLUDABLE_MULTIHEAD

    num_heads: int = Field(
        ge=1, description="h; d_model × d_model weights split into h heads of d_k = d_model / h"
    )
    num_kv_heads: int | None = Field(
        None,
        ge=1,
        description="grouped-query attention: key/value heads; num_heads must be a multiple",
    )
    heads: list[HeadWeights] | None = Field(
        None, fail_fast=True, description="per-head weights, one entry per head"
    )
    in_proj_weight: Matrix | None = Field(
        None, description="PyTorch packed [3·d_model][d_model] (rows q, k, v), always out_in"
    )
    in_proj_bias: Vector | None = Field(None, description="PyTorch packed [3·d_model] bias")
    w_o: Matrix | None = Field(
        None, description="output projection h·d_v × d_out (in_out); default identity"
    )
    b_o: Vector | None = Field(None, description="output bias [d_out]")
    out_proj_weight: Matrix | None = Field(
        None, description="PyTorch out_proj.weight [d_out][h·d_v], always out_in"
    )
    out_proj_bias: Vector | None = Field(None, description="PyTorch out_proj.bias [d_out]")
    positional_encoding: Positional | None = Field(
        None,
        description='"sinusoidal" (Vaswani et al. 2017) or an explicit [L][d_model] matrix, added to x',
    )
    residual: bool = Field(
        False, description="add the block's input (x after positional encoding) to its output"
    )
    layer_norm: bool | LayerNormOptions = Field(
        False, description="true or options: layer norm applied after the residual"
    )

    def dims(self) -> MultiheadDims:
        self._check_include()
        batch, seq_len, ctx_len, d_model = self._sequence_dims()
        assert d_model is not None
        h = self.num_heads
        h_kv = self.num_kv_heads or h
        if h % h_kv:
            raise FieldError(
                "num_kv_heads",
                f"num_heads {h} is not a multiple of num_kv_heads {h_kv}: each key/value head must serve the same number of query heads",
            )
        combined = [
            n for n in ("w_q", "w_k", "w_v", "b_q", "b_k", "b_v") if getattr(self, n) is not None
        ]
        forms = [
            name
            for name, present in (
                ("w_q/w_k/w_v", bool(combined)),
                ("in_proj_weight", self.in_proj_weight is not None),
                ("heads", self.heads is not None),
            )
            if present
        ]
        if len(forms) > 1:
            raise FieldError(
                forms[1].split("/")[0],
                f"give the projections in one form only: found {forms[0]} and {forms[1]}",
            )
        generate = ["x"] if self.x is None else []
        if self.heads is not None:
            form: Literal["combined", "in_proj", "per_head"] = "per_head"
            d_k, d_v = self._per_head_dims(d_model)
        elif self.in_proj_weight is not None:
            form = "in_proj"
            d_k, d_v = self._in_proj_dims(d_model)
        else:
            form = "combined"
            d_k, d_v, missing = self._combined_dims(d_model, h, h_kv)
            generate += missing
        d_out = self._output_dims(h * d_v)
        if self.residual and d_out != d_model:
            raise FieldError(
                "residual",
                f"the residual adds x (width {d_model}) to the attention output (width {d_out}): they must match; choose w_o with {d_model} outputs",
            )
        if isinstance(self.layer_norm, LayerNormOptions):
            for name in ("gamma", "beta"):
                vec = getattr(self.layer_norm, name)
                if vec is not None and vec.shape[0] != d_out:
                    raise FieldError(
                        f"layer_norm.{name}",
                        f"layer_norm.{name} has {vec.shape[0]} entries but the normalised output has {d_out} features",
                    )
        if isinstance(self.positional_encoding, np.ndarray) and self.positional_encoding.shape != (
            seq_len,
            d_model,
        ):
            got = "×".join(map(str, self.positional_encoding.shape))
            raise FieldError(
                "positional_encoding",
                f"positional_encoding is {got} but x is {seq_len}×{d_model}: it must be [L][d_model]",
            )
        tokens, ctx_tokens = self._labels(seq_len, ctx_len)
        self._check_masks(batch, seq_len, ctx_len)
        return MultiheadDims(
            batch,
            seq_len,
            ctx_len,
            d_model,
            d_k,
            d_v,
            tuple(generate),
            tokens,
            ctx_tokens,
            h,
            h_kv,
            d_out,
            form,
        )

    def _per_head_dims(self, d_model: int) -> tuple[int, int]:
        assert self.heads is not None
        if len(self.heads) != self.num_heads:
            raise FieldError(
                "heads", f"heads has {len(self.heads)} entries but num_heads is {self.num_heads}"
            )
        if self.num_kv_heads not in (None, self.num_heads):
            raise FieldError(
                "num_kv_heads",
                "num_kv_heads needs combined weights (w_k, w_v of d_model × num_kv_heads·d_k); per-head weights give every head its own keys and values",
            )
        sizes = set()
        for i, head in enumerate(self.heads):
            widths = {}
            for name in ("w_q", "w_k", "w_v"):
                widths[name] = self._weight_out(f"heads[{i}].{name}", getattr(head, name), d_model)
            if widths["w_q"] != widths["w_k"]:
                raise FieldError(
                    f"heads[{i}].w_k",
                    f"heads[{i}] makes queries of width {widths['w_q']} but keys of width {widths['w_k']}: they must match",
                )
            for b, w in (("b_q", "w_q"), ("b_k", "w_k"), ("b_v", "w_v")):
                vec = getattr(head, b)
                if vec is not None and vec.shape[0] != widths[w]:
                    raise FieldError(
                        f"heads[{i}].{b}",
                        f"heads[{i}].{b} has {vec.shape[0]} entries but {w} has {widths[w]} outputs",
                    )
            sizes.add((widths["w_q"], widths["w_v"]))
        if len(sizes) > 1:
            raise FieldError(
                "heads",
                "every head must have the same d_k and d_v so their outputs can be concatenated",
            )
        d_k, d_v = sizes.pop()
        return int(d_k), int(d_v)

    def _in_proj_dims(self, d_model: int) -> tuple[int, int]:
        assert self.in_proj_weight is not None
        if self.num_kv_heads not in (None, self.num_heads):
            raise FieldError(
                "num_kv_heads",
                "in_proj_weight is PyTorch's nn.MultiheadAttention packing, which has no grouped-query attention: give w_q, w_k, w_v to use num_kv_heads",
            )
        if self.in_proj_weight.shape != (3 * d_model, d_model):
            got = "×".join(map(str, self.in_proj_weight.shape))
            raise FieldError(
                "in_proj_weight",
                f"in_proj_weight is {got} but must be {3 * d_model}×{d_model} (3·d_model × d_model, rows q, k, v, as PyTorch packs it)",
            )
        if d_model % self.num_heads:
            raise FieldError(
                "num_heads", f"num_heads {self.num_heads} does not divide d_model {d_model}"
            )
        if self.in_proj_bias is not None and self.in_proj_bias.shape[0] != 3 * d_model:
            raise FieldError(
                "in_proj_bias",
                f"in_proj_bias has {self.in_proj_bias.shape[0]} entries but must have 3·d_model = {3 * d_model}",
            )
        return d_model // self.num_heads, d_model // self.num_heads

    def _combined_dims(self, d_model: int, h: int, h_kv: int) -> tuple[int, int, list[str]]:
        if self.in_proj_bias is not None:
            raise FieldError(
                "in_proj_bias",
                "in_proj_bias goes with in_proj_weight; with w_q, w_k, w_v use b_q, b_k, b_v",
            )
        widths = {
            n: self._weight_out(n, getattr(self, n), d_model)
            for n in ("w_q", "w_k", "w_v")
            if getattr(self, n) is not None
        }
        for name, heads in (("w_q", h), ("w_k", h_kv), ("w_v", h_kv)):
            if name in widths and widths[name] % heads:
                label = "num_heads" if name == "w_q" else "num_kv_heads"
                raise FieldError(
                    name,
                    f"{name} has {widths[name]} outputs, which {label} {heads} does not divide into equal heads",
                )
        d_k = (
            widths["w_q"] // h
            if "w_q" in widths
            else widths["w_k"] // h_kv
            if "w_k" in widths
            else self.d_k
        )
        if d_k is None:
            if d_model % h:
                raise FieldError(
                    "d_k",
                    f"num_heads {h} does not divide d_model {d_model}: give d_k (the width of each head)",
                )
            d_k = d_model // h
        if self.d_k is not None and self.d_k != d_k:
            raise FieldError(
                "d_k", f"d_k is {self.d_k} but the given weights make heads of width {d_k}"
            )
        if "w_k" in widths and widths["w_k"] != h_kv * d_k:
            raise FieldError(
                "w_k",
                f"w_k has {widths['w_k']} outputs but needs num_kv_heads·d_k = {h_kv}·{d_k} = {h_kv * d_k} to match the query heads",
            )
        d_v = (
            widths["w_v"] // h_kv if "w_v" in widths else self.d_v if self.d_v is not None else d_k
        )
        missing = [n for n in ("w_q", "w_k", "w_v") if n not in widths]
        if missing and self.seed is None:
            raise FieldError(
                missing[0],
                f"{missing[0]} is missing: give w_q, w_k and w_v (or in_proj_weight, or heads), or give seed to generate them",
            )
        self._check_bias("b_q", h * d_k, "Q (all heads)")
        self._check_bias("b_k", h_kv * d_k, "K (all key heads)")
        self._check_bias("b_v", h_kv * d_v, "V (all value heads)")
        return d_k, d_v, missing

    def _output_dims(self, concat_width: int) -> int:
        """Check w_o / out_proj_* against the concatenated heads; return d_out."""
        if self.w_o is not None and self.out_proj_weight is not None:
            raise FieldError("out_proj_weight", "give w_o or out_proj_weight, not both")
        if self.b_o is not None and self.out_proj_bias is not None:
            raise FieldError("out_proj_bias", "give b_o or out_proj_bias, not both")
        d_out = concat_width
        if self.w_o is not None:
            d_out = self._weight_out(
                "w_o",
                self.w_o,
                concat_width,
                f"the concatenated heads have h·d_v = {concat_width} columns",
            )
        if self.out_proj_weight is not None:
            d_out, d_in = self.out_proj_weight.shape
            if d_in != concat_width:
                raise FieldError(
                    "out_proj_weight",
                    f"out_proj_weight is {d_out}×{d_in} but the concatenated heads have h·d_v = {concat_width} columns: it must have {concat_width} columns (out_in, as PyTorch)",
                )
        for name in ("b_o", "out_proj_bias"):
            vec = getattr(self, name)
            if vec is not None and vec.shape[0] != d_out:
                raise FieldError(
                    name, f"{name} has {vec.shape[0]} entries but the output has {d_out} features"
                )
        return int(d_out)
