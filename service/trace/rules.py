"""Every rule that involves several fields of a request, applied before anything is drawn or
computed: input modes, shapes, tokens, masks, heads. A request that breaks one gets a
:class:`FieldError` naming the field; one that keeps them all gets the :class:`Shapes` it
implies, from which the limits are checked and the plan is built (:mod:`service.trace.plan`)."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

import numpy as np
from pydantic import BaseModel

from service.core import positions
from service.core.errors import AttentionInputError
from service.core.types import Array
from service.trace.warnings import mask_warnings
from service.wire.errors import ErrorItem, FieldError, RequestError
from service.wire.schemas.mask_fields import AdditiveMask, BooleanMask, PaddingMask
from service.wire.schemas.requests import (
    AttentionRequest,
    InputFields,
    LayerNormOptions,
    MaskRequest,
    MultiheadRequest,
)
from service.wire.schemas.variant_fields import (
    AlibiOptions,
    Llama3ScalingOptions,
    QKNormOptions,
    RopeOptions,
)

Endpoint = Literal["attention", "multihead"]
M = TypeVar("M", bound=BaseModel)
WeightForm = Literal["combined", "in_proj", "per_head", "state_dict"]
_PROJECTION_FIELDS = ("x", "context", "w_q", "w_k", "w_v", "b_q", "b_k", "b_v", "seed", "d_model",
                      "d_k", "d_v")  # fmt: skip
_STATE_DICT = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
_STATE_DICT_BIASES = ("q_proj_bias", "k_proj_bias", "v_proj_bias")
_DOTTED = {f"{n}_{p}": f"{n}.{p}" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm",
           "k_norm") for p in ("weight", "bias")}  # fmt: skip
_MULTIHEAD_INPUTS = ("x", "context", "seed", "d_model", "w_q", "w_k", "w_v", "b_q", "b_k", "b_v",
                     "heads", "in_proj_weight", "in_proj_bias", *_STATE_DICT, *_STATE_DICT_BIASES,
                     "positional_encoding")  # fmt: skip


@dataclass(frozen=True)
class Shapes:
    """Sizes, labels and optional parts a request implies, known before anything is computed.
    On /attention there is one head."""

    endpoint: Endpoint
    batch: int | None  # B; None: an unbatched request
    seq_len: int  # L
    ctx_len: int  # S
    d_model: int | None  # None in direct mode
    d_k: int  # per head
    d_v: int  # per head
    num_heads: int = 1  # h
    num_kv_heads: int = 1  # h_kv
    d_out: int = 0  # width of /multihead's output
    num_masks: int = 0  # mask objects, each a pass over B·L·S entries
    generated: tuple[str, ...] = ()  # arrays to draw, in the contract's order
    positional: bool = False
    residual: bool = False
    layer_norm: bool = False
    tokens: tuple[str, ...] | None = None
    context_tokens: tuple[str, ...] | None = None
    # the variants that are on (API.md, "Position and score variants")
    qk_norm: bool = False
    rope: bool = False
    softcap: bool = False
    position_bias: bool = False  # ALiBi or T5
    sinks: bool = False
    warnings: tuple[dict[str, str], ...] = ()  # what looks wrong (service.trace.warnings)
    expected_numbers: int = 0  # the caller's numbers to compare (expected); 0: none

    @property
    def masked(self) -> bool:
        """Whether any mask applies (and so the mask outputs are returned)."""
        return self.num_masks > 0

    @property
    def comparing(self) -> bool:
        """Whether the request carries expected arrays to compare."""
        return self.expected_numbers > 0


def attention_shapes(req: AttentionRequest) -> Shapes:
    """Check how the fields of an /attention or /mask request fit together."""
    direct = [n for n in ("q", "k", "v") if getattr(req, n) is not None]
    projection = [n for n in _PROJECTION_FIELDS if getattr(req, n) is not None]
    if direct and projection:
        raise FieldError(
            projection[0],
            f"give either q, k and v (direct mode) or x with w_q, w_k, w_v (projections mode), not both: found {direct[0]} and {projection[0]}",
        )
    if isinstance(req, MaskRequest) and not req.mask and req.key_padding_mask is None:
        message = (
            "mask is required on /mask: give mask (one mask object or a list), "
            "key_padding_mask, or both"
        )  # key_padding_mask alone is a mask too: its answer has the mask outputs
        raise RequestError([ErrorItem(field="mask", message=message, type="missing")])
    shapes = _direct_shapes(req) if direct else _projection_shapes(req)
    _check_masks(req, shapes.batch, shapes.seq_len, shapes.ctx_len)
    return _with_variants(req, shapes)


def _given_qkv(req: AttentionRequest | MultiheadRequest, ndim: int, form: str) -> int | None:
    """Check q, k and v given directly (``ndim`` dimensions per sequence, ``form`` naming them
    for messages) against each other; return the batch size (None: unbatched)."""
    for n in ("q", "k", "v"):
        if getattr(req, n) is None:
            raise FieldError(n, f"direct mode needs q, k and v; {n} is missing")
    assert req.q is not None and req.k is not None and req.v is not None
    q, k, v = req.q, req.k, req.v
    if not q.ndim == k.ndim == v.ndim:
        raise FieldError("k", f"q, k and v must all be {form} or all be batches [B]{form}")
    batch = q.shape[0] if q.ndim > ndim else None
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
    return batch


def _direct_shapes(req: AttentionRequest) -> Shapes:
    batch = _given_qkv(req, 2, "[L][d]")
    assert req.q is not None and req.k is not None and req.v is not None
    seq_len, ctx_len = req.q.shape[-2], req.k.shape[-2]
    tokens, ctx_tokens = _labels(req, seq_len, ctx_len)
    return Shapes(
        "attention", batch, seq_len, ctx_len, None, req.q.shape[-1], req.v.shape[-1],
        num_masks=_num_masks(req), tokens=tokens, context_tokens=ctx_tokens,
    )  # fmt: skip


def _projection_shapes(req: AttentionRequest) -> Shapes:
    batch, seq_len, ctx_len, d_model = _sequence_shapes(req)
    generate = ["x"] if req.x is None else []
    widths: dict[str, int] = {}
    for name in ("w_q", "w_k", "w_v"):
        w = getattr(req, name)
        if w is None:
            if req.seed is None:
                raise FieldError(
                    name, f"{name} is missing: give {name}, or give seed to generate it"
                )
            generate.append(name)
        else:
            widths[name] = _weight_out(req, name, w, d_model)
    if "w_q" in widths and "w_k" in widths and widths["w_q"] != widths["w_k"]:
        raise FieldError(
            "w_k",
            f"w_q gives queries of width {widths['w_q']} but w_k gives keys of width {widths['w_k']}: they must match for Q Kᵀ",
        )
    # generated w_q and w_k default to square (d_k = d_model), as a notebook's d_k = embedding_dim
    d_k = widths.get("w_q", widths.get("w_k", req.d_k if req.d_k is not None else d_model))
    _check_size(req.d_k, "d_k", d_k, "the given weights make queries of width")
    d_v = widths.get("w_v", req.d_v if req.d_v is not None else d_k)
    _check_size(req.d_v, "d_v", d_v, "w_v makes values of width")
    _check_bias(req.b_q, "b_q", d_k, "Q")
    _check_bias(req.b_k, "b_k", d_k, "K")
    _check_bias(req.b_v, "b_v", d_v, "V")
    tokens, ctx_tokens = _labels(req, seq_len, ctx_len)
    return Shapes(
        "attention", batch, seq_len, ctx_len, d_model, d_k, d_v, num_masks=_num_masks(req),
        generated=tuple(generate), tokens=tokens, context_tokens=ctx_tokens,
    )  # fmt: skip


def multihead_shapes(req: MultiheadRequest) -> Shapes:
    """Check how the fields of a /multihead request fit together."""
    if any(getattr(req, n) is not None for n in ("q", "k", "v")):
        return _with_variants(req, _heads_shapes(req))
    h = req.num_heads
    if h is None:
        raise FieldError(
            "num_heads",
            "num_heads is missing: give the number of heads h (only q, k and v given per head "
            "[h][L][d_k] imply it)",
        )
    form = _weight_form(req)
    kv_width = None
    if form == "state_dict":
        given = [n for n in ("k_proj_weight", "v_proj_weight") if getattr(req, n) is not None]
        if given and req.context is not None:  # else they take x: d_model columns
            kv_width = int(getattr(req, given[0]).shape[1])
            _check_kdim_vdim(req)
    batch, seq_len, ctx_len, d_model = _sequence_shapes(req, kv_width)
    h_kv = req.num_kv_heads or h
    generate = ["x"] if req.x is None else []
    if form == "state_dict":
        d_k, d_v, h_kv = _state_dict_dims(req, d_model, kv_width or d_model, h)
    else:
        if h % h_kv:
            raise FieldError(
                "num_kv_heads",
                f"num_heads {h} is not a multiple of num_kv_heads {h_kv}: each key/value head must serve the same number of query heads",
            )
        if form == "combined":
            d_k, d_v, missing = _combined_dims(req, d_model, h, h_kv)
            generate += missing
        else:
            d_k, d_v = (
                _per_head_dims(req, d_model) if form == "per_head" else _in_proj_dims(req, d_model)
            )
            _check_size(req.d_k, "d_k", d_k, f"the {form} weights make heads of width")
            _check_size(req.d_v, "d_v", d_v, f"the {form} weights make values of width")
    d_out = _output_dims(req, h * d_v)
    if req.residual and d_out != d_model:
        raise FieldError(
            "residual",
            f"the residual adds x (width {d_model}) to the attention output (width {d_out}): they must match; choose w_o with {d_model} outputs",
        )
    _check_layer_norm(req, d_out)
    pe = req.positional_encoding
    if isinstance(pe, np.ndarray) and pe.shape != (seq_len, d_model):
        got = "×".join(map(str, pe.shape))
        raise FieldError(
            "positional_encoding",
            f"positional_encoding is {got} but x is {seq_len}×{d_model}: it must be [L][d_model]",
        )
    tokens, ctx_tokens = _labels(req, seq_len, ctx_len)
    _check_masks(req, batch, seq_len, ctx_len)
    shapes = Shapes(
        "multihead", batch, seq_len, ctx_len, d_model, d_k, d_v, h, h_kv, d_out,
        num_masks=_num_masks(req), generated=tuple(generate), positional=pe is not None,
        residual=req.residual, layer_norm=req.layer_norm is not False, tokens=tokens,
        context_tokens=ctx_tokens,
    )  # fmt: skip
    return _with_variants(req, shapes)


def _heads_shapes(req: MultiheadRequest) -> Shapes:
    """/multihead with q, k, v given per head, as torch scaled_dot_product_attention takes
    them: q (B, h, L, d_k), k (B, h_kv, S, d_k), v (B, h_kv, S, d_v), B optional."""
    extra = [n for n in _MULTIHEAD_INPUTS if getattr(req, n) is not None]
    extra += ["residual"] if req.residual else []
    if extra:
        name = _DOTTED.get(extra[0], extra[0])
        raise FieldError(
            name,
            f"q, k and v are given per head (direct mode), so there is nothing to project: {name} does not apply; give either q, k, v or x with the projections",
        )
    batch = _given_qkv(req, 3, "[h][n][d]")
    assert req.q is not None and req.k is not None and req.v is not None
    q, k, v = req.q, req.k, req.v
    h, seq_len, d_k = q.shape[-3:]
    h_kv, ctx_len = k.shape[-3:-1]
    if v.shape[-3] != h_kv:
        raise FieldError(
            "v", f"k has {h_kv} key heads but v has {v.shape[-3]}: each key head needs its values"
        )
    _check_size(req.num_heads, "num_heads", h, "q has query heads:")
    _check_size(req.num_kv_heads, "num_kv_heads", h_kv, "k has key/value heads:")
    if h % h_kv:
        raise FieldError(
            "k",
            f"q has {h} heads, which is not a multiple of k's {h_kv} key/value heads: each key/value head must serve the same number of query heads",
        )
    d_v = int(v.shape[-1])
    d_out = _output_dims(req, h * d_v)
    _check_layer_norm(req, d_out)
    tokens, ctx_tokens = _labels(req, seq_len, ctx_len)
    _check_masks(req, batch, seq_len, ctx_len)
    return Shapes(
        "multihead", batch, int(seq_len), int(ctx_len), None, int(d_k), d_v, int(h), int(h_kv),
        d_out, num_masks=_num_masks(req), layer_norm=req.layer_norm is not False, tokens=tokens,
        context_tokens=ctx_tokens,
    )  # fmt: skip


def _check_layer_norm(req: MultiheadRequest, d_out: int) -> None:
    if isinstance(req.layer_norm, LayerNormOptions):
        for name in ("gamma", "beta"):
            vec = getattr(req.layer_norm, name)
            if vec is not None and vec.shape[0] != d_out:
                raise FieldError(
                    f"layer_norm.{name}",
                    f"layer_norm.{name} has {vec.shape[0]} entries but the normalised output has {d_out} features",
                )


def _weight_form(req: MultiheadRequest) -> WeightForm:
    """Which of the three ways to give /multihead's projections the request uses (one only)."""
    combined = any(getattr(req, n) is not None for n in ("w_q", "w_k", "w_v", "b_q", "b_k", "b_v"))
    state_dict = [n for n in (*_STATE_DICT, *_STATE_DICT_BIASES) if getattr(req, n) is not None]
    forms = [
        name
        for name, present in (
            ("w_q/w_k/w_v", combined),
            ("in_proj_weight", req.in_proj_weight is not None),
            ("heads", req.heads is not None),
            (_DOTTED[state_dict[0]] if state_dict else "", bool(state_dict)),
        )
        if present
    ]
    if len(forms) > 1:
        raise FieldError(
            forms[1].split("/")[0],
            f"give the projections in one form only: found {forms[0]} and {forms[1]}",
        )
    if req.heads is not None:
        return "per_head"
    if state_dict:
        return "state_dict"
    return "in_proj" if req.in_proj_weight is not None else "combined"


def _per_head_dims(req: MultiheadRequest, d_model: int) -> tuple[int, int]:
    assert req.heads is not None
    if req.in_proj_bias is not None:
        raise FieldError(
            "in_proj_bias",
            "in_proj_bias goes with in_proj_weight; per-head weights take b_q, b_k, b_v in each head",
        )
    if len(req.heads) != req.num_heads:
        raise FieldError(
            "heads", f"heads has {len(req.heads)} entries but num_heads is {req.num_heads}"
        )
    if req.num_kv_heads not in (None, req.num_heads):
        raise FieldError(
            "num_kv_heads",
            "num_kv_heads needs combined weights (w_k, w_v of d_model × num_kv_heads·d_k); per-head weights give every head its own keys and values",
        )
    sizes = set()
    for i, head in enumerate(req.heads):
        widths = {
            name: _weight_out(req, f"heads[{i}].{name}", getattr(head, name), d_model)
            for name in ("w_q", "w_k", "w_v")
        }
        if widths["w_q"] != widths["w_k"]:
            raise FieldError(
                f"heads[{i}].w_k",
                f"heads[{i}] makes queries of width {widths['w_q']} but keys of width {widths['w_k']}: they must match",
            )
        for b, w in (("b_q", "w_q"), ("b_k", "w_k"), ("b_v", "w_v")):
            _check_bias(getattr(head, b), f"heads[{i}].{b}", widths[w], f"heads[{i}].{w}")
        sizes.add((widths["w_q"], widths["w_v"]))
    if len(sizes) > 1:
        raise FieldError(
            "heads",
            "every head must have the same d_k and d_v so their outputs can be concatenated",
        )
    d_k, d_v = sizes.pop()
    return d_k, d_v


def _check_kdim_vdim(req: MultiheadRequest) -> None:
    """With ``context`` the state dict's k_proj.weight and v_proj.weight take its width, so
    they must take the same one: nn.MultiheadAttention's kdim ≠ vdim (a key and a value of
    different widths) has no single context to stand for it."""
    k, v = req.k_proj_weight, req.v_proj_weight
    if k is not None and v is not None and k.shape[1] != v.shape[1]:
        raise FieldError(
            "v_proj.weight",
            f"k_proj.weight takes {k.shape[1]} features but v_proj.weight takes {v.shape[1]} "
            "(nn.MultiheadAttention's kdim ≠ vdim): one context gives both the keys and the "
            "values, so both must take its width",
        )


def _state_dict_dims(
    req: MultiheadRequest, d_model: int, kv_width: int, h: int
) -> tuple[int, int, int]:
    """(d_k, d_v, h_kv) of q_proj.weight, k_proj.weight, v_proj.weight (always out_in): d_k
    is q_proj.weight's rows ÷ num_heads, num_kv_heads k_proj.weight's rows ÷ d_k."""
    for name in _STATE_DICT:
        if getattr(req, name) is None:
            raise FieldError(
                _DOTTED[name],
                f"{_DOTTED[name]} is missing: a state dict's projections come as q_proj.weight, k_proj.weight and v_proj.weight together",
            )
    assert req.q_proj_weight is not None and req.k_proj_weight is not None
    assert req.v_proj_weight is not None
    for name, w, width, of in (
        ("q_proj.weight", req.q_proj_weight, d_model, "x"),
        (
            "k_proj.weight",
            req.k_proj_weight,
            kv_width,
            "context" if req.context is not None else "x",
        ),
        (
            "v_proj.weight",
            req.v_proj_weight,
            kv_width,
            "context" if req.context is not None else "x",
        ),
    ):
        if w.shape[1] != width:
            rows, cols = w.shape
            raise FieldError(
                name,
                f"{name} is {rows}×{cols} but {of} has {width} columns: a state dict's weights are [out][in] (out_in), so it must have {width} columns",
            )
    q_rows, k_rows, v_rows = (int(getattr(req, n).shape[0]) for n in _STATE_DICT)
    if q_rows % h:
        raise FieldError(
            "q_proj.weight",
            f"q_proj.weight has {q_rows} rows, which num_heads {h} does not divide into equal heads (d_k = rows ÷ num_heads)",
        )
    d_k = q_rows // h
    _check_size(req.d_k, "d_k", d_k, "q_proj.weight's rows ÷ num_heads give heads of width")
    if k_rows % d_k:
        raise FieldError(
            "k_proj.weight",
            f"k_proj.weight has {k_rows} rows, not a multiple of d_k = {d_k} (num_kv_heads = rows ÷ d_k)",
        )
    h_kv = k_rows // d_k
    _check_size(req.num_kv_heads, "num_kv_heads", h_kv, f"k_proj.weight has {k_rows} rows = d_k ·")
    if h % h_kv:
        raise FieldError(
            "k_proj.weight",
            f"k_proj.weight makes {h_kv} key/value heads, which does not divide num_heads {h}: each key/value head must serve the same number of query heads",
        )
    if v_rows % h_kv:
        raise FieldError(
            "v_proj.weight",
            f"v_proj.weight has {v_rows} rows, which the {h_kv} key/value heads do not divide",
        )
    d_v = v_rows // h_kv
    _check_size(req.d_v, "d_v", d_v, "v_proj.weight makes values of width")
    if req.in_proj_bias is not None and any(
        getattr(req, n) is not None for n in _STATE_DICT_BIASES
    ):
        raise FieldError(
            "in_proj_bias", "give in_proj_bias or q_proj.bias, k_proj.bias, v_proj.bias, not both"
        )
    _check_bias(
        req.in_proj_bias, "in_proj_bias", q_rows + k_rows + v_rows, "the three projections together"
    )
    for name, rows in zip(_STATE_DICT_BIASES, (q_rows, k_rows, v_rows), strict=True):
        _check_bias(
            getattr(req, name), _DOTTED[name], rows, _DOTTED[name.replace("bias", "weight")]
        )
    return d_k, d_v, h_kv


def _in_proj_dims(req: MultiheadRequest, d_model: int) -> tuple[int, int]:
    assert req.in_proj_weight is not None and req.num_heads is not None
    if req.num_kv_heads not in (None, req.num_heads):
        raise FieldError(
            "num_kv_heads",
            "in_proj_weight is PyTorch's nn.MultiheadAttention packing, which has no grouped-query attention: give w_q, w_k, w_v to use num_kv_heads",
        )
    if req.in_proj_weight.shape != (3 * d_model, d_model):
        got = "×".join(map(str, req.in_proj_weight.shape))
        raise FieldError(
            "in_proj_weight",
            f"in_proj_weight is {got} but must be {3 * d_model}×{d_model} (3·d_model × d_model, rows q, k, v, as PyTorch packs it)",
        )
    if d_model % req.num_heads:
        raise FieldError(
            "num_heads", f"num_heads {req.num_heads} does not divide d_model {d_model}"
        )
    _check_bias(req.in_proj_bias, "in_proj_bias", 3 * d_model, "in_proj_weight (3·d_model rows)")
    return d_model // req.num_heads, d_model // req.num_heads


def _combined_dims(
    req: MultiheadRequest, d_model: int, h: int, h_kv: int
) -> tuple[int, int, list[str]]:
    """(d_k, d_v, weights to generate) of combined weights w_q, w_k, w_v."""
    if req.in_proj_bias is not None:
        raise FieldError(
            "in_proj_bias",
            "in_proj_bias goes with in_proj_weight; with w_q, w_k, w_v use b_q, b_k, b_v",
        )
    widths = {
        n: _weight_out(req, n, w, d_model)
        for n in ("w_q", "w_k", "w_v")
        if (w := getattr(req, n)) is not None
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
        else req.d_k
    )
    if d_k is None:
        if d_model % h:
            raise FieldError(
                "d_k",
                f"num_heads {h} does not divide d_model {d_model}: give d_k (the width of each head)",
            )
        d_k = d_model // h
    _check_size(req.d_k, "d_k", d_k, "the given weights make heads of width")
    if "w_k" in widths and widths["w_k"] != h_kv * d_k:
        raise FieldError(
            "w_k",
            f"w_k has {widths['w_k']} outputs but needs num_kv_heads·d_k = {h_kv}·{d_k} = {h_kv * d_k} to match the query heads",
        )
    d_v = widths["w_v"] // h_kv if "w_v" in widths else req.d_v if req.d_v is not None else d_k
    _check_size(req.d_v, "d_v", d_v, "the given w_v makes heads of values of width")
    missing = [n for n in ("w_q", "w_k", "w_v") if n not in widths]
    if missing and req.seed is None:
        raise FieldError(
            missing[0],
            f"{missing[0]} is missing: give w_q, w_k and w_v (or in_proj_weight, or heads), or give seed to generate them",
        )
    _check_bias(req.b_q, "b_q", h * d_k, "Q (all heads)")
    _check_bias(req.b_k, "b_k", h_kv * d_k, "K (all key heads)")
    _check_bias(req.b_v, "b_v", h_kv * d_v, "V (all value heads)")
    return d_k, d_v, missing


def _output_dims(req: MultiheadRequest, concat_width: int) -> int:
    """Check w_o / out_proj_* against the concatenated heads; return d_out."""
    for given in (
        [n for n in ("w_o", "out_proj_weight", "o_proj_weight") if getattr(req, n) is not None],
        [n for n in ("b_o", "out_proj_bias", "o_proj_bias") if getattr(req, n) is not None],
    ):
        if len(given) > 1:
            a, b = (_DOTTED.get(n, n) for n in given[:2])
            raise FieldError(b, f"give {a} or {b}, not both: both are the output projection")
    d_out = concat_width
    if req.w_o is not None:
        d_out = _weight_out(
            req,
            "w_o",
            req.w_o,
            concat_width,
            f"the concatenated heads have h·d_v = {concat_width} columns",
        )
    for name in ("out_proj_weight", "o_proj_weight"):
        w = getattr(req, name)
        if w is not None:
            d_out, d_in = w.shape
            if d_in != concat_width:
                label = _DOTTED.get(name, name)
                raise FieldError(
                    label,
                    f"{label} is {d_out}×{d_in} but the concatenated heads have h·d_v = {concat_width} columns: it must have {concat_width} columns (out_in, as PyTorch)",
                )
    _check_bias(req.b_o, "b_o", d_out, "the output")
    _check_bias(req.out_proj_bias, "out_proj_bias", d_out, "the output")
    _check_bias(req.o_proj_bias, "o_proj.bias", d_out, "the output")
    return int(d_out)


def _sequence_shapes(
    req: InputFields, kv_width: int | None = None
) -> tuple[int | None, int, int, int]:
    """(B, L, S, d_model) from x, context and the generated-mode sizes; the context must have
    ``kv_width`` columns (default d_model)."""
    batch = None
    if req.x is not None:
        batch = req.x.shape[0] if req.x.ndim == 3 else None
        seq_len, d_model = req.x.shape[-2:]
        if req.seq_len is not None and req.seq_len != seq_len:
            raise FieldError("seq_len", f"seq_len is {req.seq_len} but x has {seq_len} rows")
        if req.d_model is not None and req.d_model != d_model:
            raise FieldError("d_model", f"d_model is {req.d_model} but x has {d_model} columns")
    else:
        if req.seed is None:
            raise FieldError(
                "x",
                "x is missing: give x, or give seed (with d_model and tokens, sentence or seq_len) to generate it",
            )
        seq_len = _seq_len_from_labels(req)
        found = req.d_model if req.d_model is not None else _d_model_from_weights(req)
        if found is None:
            raise FieldError("d_model", "to generate x, give d_model (its number of columns)")
        d_model = found
    ctx_len = seq_len
    if req.context is not None:
        c_batch = req.context.shape[0] if req.context.ndim == 3 else None
        if c_batch != batch:
            raise FieldError(
                "context",
                f"context is {_batch_words(c_batch)} but x is {_batch_words(batch)}: batch both or neither, with the same B",
            )
        ctx_len, c_width = req.context.shape[-2:]
        if kv_width is None and c_width != d_model:
            raise FieldError(
                "context",
                f"context has {c_width} columns but x has {d_model}: both are projected by the same weights",
            )
        if kv_width is not None and c_width != kv_width:
            raise FieldError(
                "context",
                f"context has {c_width} columns but k_proj.weight takes {kv_width}: the keys and values are projected from the context",
            )
    return batch, int(seq_len), int(ctx_len), int(d_model)


def _seq_len_from_labels(req: InputFields) -> int:
    """L for a generated x: from tokens or sentence, else seq_len."""
    tokens, _ = _labels(req, None, None)
    if tokens is not None:
        if req.seq_len is not None and req.seq_len != len(tokens):
            raise FieldError(
                "seq_len", f"seq_len is {req.seq_len} but there are {len(tokens)} tokens"
            )
        return len(tokens)
    if req.seq_len is None:
        raise FieldError(
            "seq_len",
            "to generate x, give tokens, sentence or seq_len so the sequence length L is known",
        )
    return req.seq_len


def _d_model_from_weights(req: InputFields) -> int | None:
    """d_model as the first given projection weight implies it (its input size)."""
    for name in ("w_q", "w_k", "w_v"):
        w = getattr(req, name, None)
        if isinstance(w, np.ndarray):
            return int(w.shape[0] if req.weight_layout == "in_out" else w.shape[1])
    w = getattr(req, "q_proj_weight", None)  # a state dict's: always out_in
    return None if w is None else int(w.shape[1])


def _labels(
    req: InputFields, seq_len: int | None, ctx_len: int | None
) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """tokens (from tokens or sentence) and context_tokens, checked against L and S."""
    if req.tokens is not None and req.sentence is not None:
        raise FieldError("sentence", "give tokens or sentence, not both")
    tokens = req.sentence.split() if req.sentence is not None else req.tokens
    source = "sentence" if req.sentence is not None else "tokens"
    if tokens is not None and not tokens:
        raise FieldError(
            source, "tokens is empty" if req.sentence is None else "sentence has no words"
        )
    if tokens is not None and seq_len is not None and len(tokens) != seq_len:
        raise FieldError(
            source, f"{source} gives {len(tokens)} tokens but there are {seq_len} query rows (L)"
        )
    ctx = req.context_tokens
    if ctx is not None and ctx_len is not None and len(ctx) != ctx_len:
        raise FieldError(
            "context_tokens",
            f"context_tokens has {len(ctx)} labels but there are {ctx_len} keys (S)",
        )
    if ctx is None and req.context is None and (ctx_len is None or ctx_len == seq_len):
        ctx = tokens  # self-attention: the keys are the queries' tokens
    return (None if tokens is None else tuple(tokens)), (None if ctx is None else tuple(ctx))


def _weight_out(
    req: InputFields, name: str, w: Array, width: int, source: str | None = None
) -> int:
    """Check a weight's input size (rows in in_out, columns in out_in) against ``width``,
    the width of what it multiplies (``source`` says what that is; default x / d_model);
    return its output size."""
    rows, cols = w.shape
    d_in, d_out = (rows, cols) if req.weight_layout == "in_out" else (cols, rows)
    if d_in != width:
        side = "rows" if req.weight_layout == "in_out" else "columns"
        if source is None:
            source = f"x has {width} columns" if req.x is not None else f"d_model is {width}"
        raise FieldError(
            name,
            f"{name} is {rows}×{cols} but {source}: with weight_layout {req.weight_layout} "
            f"{name} must have {width} {side}",
        )
    return int(d_out)


def _check_size(given: int | None, name: str, found: int, what: str) -> None:
    """A size the request states (d_k, d_v) must agree with the one its arrays imply."""
    if given is not None and given != found:
        raise FieldError(name, f"{name} is {given} but {what} {found}")


def _check_bias(b: Array | None, name: str, size: int, of: str) -> None:
    if b is not None and b.shape[0] != size:
        raise FieldError(name, f"{name} has {b.shape[0]} entries but {of} has width {size}")


def _check_masks(req: InputFields, batch: int | None, seq_len: int, ctx_len: int) -> None:
    """Each mask against the scores' shape L×S and the batch."""
    for i, item in enumerate(req.mask or []):
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
            _check_padding(item, field, batch, seq_len, ctx_len)


def _check_padding(
    item: PaddingMask, field: str, batch: int | None, seq_len: int, ctx_len: int
) -> None:
    if item.key_lengths is None and item.query_lengths is None:
        raise FieldError(field, "a padding mask needs key_lengths, query_lengths or both")
    for name, limit, what in (
        ("key_lengths", ctx_len, "keys (S)"),
        ("query_lengths", seq_len, "queries (L)"),
    ):
        given = lengths(getattr(item, name))
        if given is None:
            continue
        if min(given) < 0:
            raise FieldError(
                f"{field}.{name}", f"{field}.{name} must be 0 or more, got {min(given)}"
            )
        if len(given) not in (1, batch or 1):
            raise FieldError(
                f"{field}.{name}",
                f"{field}.{name} has {len(given)} entries but the batch has {batch or 1} item(s)",
            )
        if max(given) > limit:
            raise FieldError(
                f"{field}.{name}",
                f"{field}.{name} has {max(given)} but there are only {limit} {what}",
            )


def lengths(value: int | list[int] | None) -> tuple[int, ...] | None:
    """One int or a list, as a tuple."""
    if value is None:
        return None
    return (value,) if isinstance(value, int) else tuple(value)


def _batch_words(batch: int | None) -> str:
    return "unbatched" if batch is None else f"a batch of {batch}"


def _num_masks(req: InputFields) -> int:
    """Mask objects plus key_padding_mask: each a pass over B·L·S entries."""
    return len(req.mask or []) + (req.key_padding_mask is not None)


@contextmanager
def _engine_rule(field: str) -> Iterator[None]:
    """The engine's own check of a setting, reported on the field that holds it."""
    try:
        yield
    except AttentionInputError as err:
        raise FieldError(field, str(err)) from None


def options(setting: bool | M, model: type[M]) -> M | None:
    """A setting written as true/false or an options object, as its options: the object itself,
    every default for true, None for false."""
    if isinstance(setting, model):
        return setting
    return model() if setting else None


def _with_variants(req: AttentionRequest | MultiheadRequest, shapes: Shapes) -> Shapes:
    """Check the variants against the shapes (per head: d_k; n = h heads on /multihead, 1 on
    /attention) and record which are on."""
    n = shapes.num_heads
    _check_qk_norm(req, shapes.d_k)
    rope = options(req.rope, RopeOptions)
    if rope is not None:
        _check_rope(rope, shapes.d_k)
    alibi = options(req.alibi, AlibiOptions)
    if alibi is not None and req.relative_bias is not None:
        raise FieldError(
            "relative_bias", "give alibi or relative_bias, not both: one position bias at most"
        )
    slopes = None if alibi is None else alibi.slopes
    if slopes is not None and slopes.shape[0] != n:
        raise FieldError(
            "alibi.slopes",
            f"alibi.slopes has {slopes.shape[0]} entries but there {'is 1 head' if n == 1 else f'are {n} heads'}: one slope per head",
        )
    if req.relative_bias is not None:
        _check_relative_bias(req.relative_bias.table, n, req)
    for name, given, size, what in (
        ("positions", req.positions, shapes.seq_len, "queries (L)"),
        ("context_positions", req.context_positions, shapes.ctx_len, "keys (S)"),
    ):
        if given is None:
            continue
        if rope is None and alibi is None and req.relative_bias is None:
            raise FieldError(
                name, f"{name} is used by rope, alibi and relative_bias, and none of them is on"
            )
        if len(given) != size:
            raise FieldError(name, f"{name} has {len(given)} entries but there are {size} {what}")
    if req.key_padding_mask is not None:
        _check_key_padding(req.key_padding_mask, shapes)
    if isinstance(req, MultiheadRequest) and req.sinks is not None:
        _check_sinks(req.sinks, n)
    return replace(
        shapes,
        qk_norm=req.qk_norm is not False or _norm_weights_given(req),
        rope=rope is not None,
        softcap=req.softcap is not None,
        position_bias=alibi is not None or req.relative_bias is not None,
        sinks=req.sinks is not None,
        warnings=mask_warnings(req),
    )


def _norm_weights_given(req: AttentionRequest | MultiheadRequest) -> bool:
    """Whether a state dict's q_norm.weight or k_norm.weight is given (/multihead)."""
    return isinstance(req, MultiheadRequest) and (
        req.q_norm_weight is not None or req.k_norm_weight is not None
    )


def _check_qk_norm(req: AttentionRequest | MultiheadRequest, d_k: int) -> None:
    given = options(req.qk_norm, QKNormOptions)
    weights: dict[str, Array | None] = {
        "qk_norm.q_weight": None if given is None else given.q_weight,
        "qk_norm.k_weight": None if given is None else given.k_weight,
    }
    if isinstance(req, MultiheadRequest):
        for state, field in (
            ("q_norm.weight", "qk_norm.q_weight"),
            ("k_norm.weight", "qk_norm.k_weight"),
        ):
            w = req.q_norm_weight if state.startswith("q") else req.k_norm_weight
            if w is not None and weights[field] is not None:
                raise FieldError(
                    state, f"give {state} or {field}, not both: both are the same weight"
                )
            if w is not None:
                weights[state] = w
    for name, w in weights.items():
        if w is not None and w.shape[0] != d_k:
            raise FieldError(
                name,
                f"{name} has {w.shape[0]} entries but each query/key vector has d_k = {d_k} features",
            )


def _check_rope(rope: RopeOptions, d_k: int) -> None:
    r = d_k if rope.rotary_dim is None else rope.rotary_dim
    if r % 2:
        raise FieldError(
            "rope.rotary_dim" if rope.rotary_dim is not None else "rope",
            f"rope turns pairs of features, so rotary_dim must be even; it is {r}"
            + ("" if rope.rotary_dim is not None else " (d_k): give an even rotary_dim below it"),
        )
    if r > d_k:
        raise FieldError("rope.rotary_dim", f"rope.rotary_dim is {r} but d_k is only {d_k}")
    if isinstance(rope.scaling, Llama3ScalingOptions):
        s = rope.scaling
        if not s.low_freq_factor < s.high_freq_factor:
            raise FieldError(
                "rope.scaling.high_freq_factor",
                f"rope.scaling needs low_freq_factor < high_freq_factor; got {s.low_freq_factor:g} and {s.high_freq_factor:g}",
            )


def _check_relative_bias(table: Array, n: int, req: AttentionRequest | MultiheadRequest) -> None:
    cols = 1 if table.ndim == 1 else table.shape[1]
    if cols != n:
        raise FieldError(
            "relative_bias.table",
            f"relative_bias.table has {cols} column(s) but there {'is 1 head' if n == 1 else f'are {n} heads'}: it is num_buckets × heads",
        )
    assert req.relative_bias is not None
    with _engine_rule("relative_bias"):
        positions.t5_bucket(
            np.zeros(1, dtype=np.int64), req.relative_bias.bidirectional, table.shape[0],
            req.relative_bias.max_distance,
        )  # fmt: skip


def _check_key_padding(flags: np.ndarray, shapes: Shapes) -> None:
    if flags.shape[-1] != shapes.ctx_len:
        raise FieldError(
            "key_padding_mask",
            f"key_padding_mask has {flags.shape[-1]} entries per row but there are {shapes.ctx_len} keys (S)",
        )
    if flags.ndim == 2 and flags.shape[0] != (shapes.batch or 1):
        raise FieldError(
            "key_padding_mask",
            f"key_padding_mask has {flags.shape[0]} rows but the request is {_batch_words(shapes.batch)}: one row [S] per batch item",
        )


def _check_sinks(sinks: Array, n: int) -> None:
    """/multihead's sinks: one per head (on /attention the field is one number)."""
    if sinks.shape[0] != n:
        raise FieldError(
            "sinks", f"sinks has {sinks.shape[0]} entries but there are {n} heads: one per head"
        )
