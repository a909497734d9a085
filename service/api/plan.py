"""From a request whose rules hold (:mod:`service.api.rules`) to a typed, frozen plan the engine
runs: generated arrays drawn once, every weight converted once into the engine's in_out
layout, masks turned into engine specs."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, assert_never

import numpy as np

from service.api.outputs import drawn_shape
from service.api.rules import Shapes, lengths
from service.api.schemas.masks import (
    AdditiveMask,
    BooleanMask,
    CausalMask,
    PaddingMask,
    WindowMask,
)
from service.api.schemas.requests import (
    AttentionRequest,
    HeadWeights,
    InputFields,
    MultiheadRequest,
)
from service.core import masks
from service.core.attention import Projections
from service.core.generate import draw
from service.core.multihead import LayerNorm, MultiheadWeights, sinusoidal_encoding
from service.core.types import Alignment, Array, FullyMaskedPolicy, Init, WeightLayout


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What every compute request carries into the engine."""

    shapes: Shapes
    mask_specs: tuple[masks.MaskSpec, ...]
    scale: float | None  # None: 1/√d_k
    fully_masked_rows: FullyMaskedPolicy
    generated: Mapping[str, Array]  # drawn arrays by name, in draw order
    seed: int | None
    init: Init
    weight_layout: WeightLayout
    alignment: Alignment  # of the first causal mask (upper_left when there is none)
    include: frozenset[str] | None  # None: every output
    decimals: int | None


@dataclass(frozen=True, kw_only=True)
class AttentionPlan(Plan):
    """POST /attention and /mask: q, k, v given (direct) or x and its projections."""

    q: Array | None = None  # (B, L, d_k), direct mode
    k: Array | None = None  # (B, S, d_k)
    v: Array | None = None  # (B, S, d_v)
    x: Array | None = None  # (B, L, d_model), projections mode
    context: Array | None = None  # (B, S, d_model), cross-attention
    projections: Projections | None = None  # in_out


@dataclass(frozen=True, kw_only=True)
class MultiheadPlan(Plan):
    """POST /multihead: the block's weights in in_out layout and its optional parts."""

    x: Array  # (B, L, d_model)
    context: Array | None  # (B, S, d_model)
    weights: MultiheadWeights
    positional: Array | None  # (L, d_model), added to x
    positional_given: bool  # an explicit matrix, not the sinusoidal encoding
    residual: bool
    norm: LayerNorm | None


P = TypeVar("P", bound=Plan)


def plan_attention(req: AttentionRequest, shapes: Shapes) -> AttentionPlan:
    """The engine's inputs for /attention and /mask (``shapes`` from :func:`attention_shapes`)."""
    generated = _draw(req, shapes)
    if req.q is not None and req.k is not None and req.v is not None:
        q, k, v = _batched(req.q), _batched(req.k), _batched(req.v)
        return _plan(AttentionPlan, req, shapes, generated, q=q, k=k, v=v)
    w_q, w_k, w_v = (_given_or_drawn(req, n, generated) for n in ("w_q", "w_k", "w_v"))
    return _plan(
        AttentionPlan,
        req,
        shapes,
        generated,
        x=_batched(generated.get("x", req.x)),
        context=None if req.context is None else _batched(req.context),
        projections=Projections(w_q, w_k, w_v, req.b_q, req.b_k, req.b_v),
    )


def plan_multihead(req: MultiheadRequest, shapes: Shapes) -> MultiheadPlan:
    """The engine's inputs for /multihead (``shapes`` from :func:`multihead_shapes`)."""
    generated = _draw(req, shapes)
    pe = req.positional_encoding
    positional = (
        sinusoidal_encoding(shapes.seq_len, shapes.d_model or 0) if isinstance(pe, str) else pe
    )
    layer_norm = req.layer_norm
    norm = (
        None
        if layer_norm is False
        else LayerNorm()
        if layer_norm is True
        else LayerNorm(layer_norm.eps, layer_norm.gamma, layer_norm.beta, layer_norm.over)
    )
    return _plan(
        MultiheadPlan,
        req,
        shapes,
        generated,
        x=_batched(generated.get("x", req.x)),
        context=None if req.context is None else _batched(req.context),
        weights=_multihead_weights(req, generated),
        positional=positional,
        positional_given=isinstance(pe, np.ndarray),
        residual=req.residual,
        norm=norm,
    )


def _plan(
    cls: type[P], req: InputFields, shapes: Shapes, generated: dict[str, Array], **rest: Any
) -> P:
    """A plan of class ``cls``: the fields every plan has, from the request, plus ``rest``."""
    alignments = [m.alignment for m in req.mask or [] if isinstance(m, CausalMask)]
    return cls(
        shapes=shapes,
        mask_specs=tuple(_mask_spec(m) for m in req.mask or []),
        scale=req.scale,
        fully_masked_rows=req.fully_masked_rows,
        generated=generated,
        seed=req.seed,
        init=req.init,
        weight_layout=req.weight_layout,
        alignment=alignments[0] if alignments else "upper_left",
        include=None if req.include is None else frozenset(req.include),
        decimals=req.decimals,
        **rest,
    )


def _mask_spec(
    item: CausalMask | PaddingMask | WindowMask | BooleanMask | AdditiveMask,
) -> masks.MaskSpec:
    """A request's mask object as the engine's spec."""
    match item:
        case CausalMask(alignment=alignment):
            return masks.Causal(alignment)
        case PaddingMask(key_lengths=keys, query_lengths=queries):
            return masks.Padding(lengths(keys), lengths(queries))
        case BooleanMask(matrix=matrix):
            return masks.Boolean(matrix)
        case AdditiveMask(matrix=matrix):
            return masks.Additive(matrix)
        case WindowMask(left=left, right=right):
            return masks.Window(left, right)
    assert_never(item)


def _draw(req: InputFields, shapes: Shapes) -> dict[str, Array]:
    """The missing arrays, drawn in the contract's order: x, then w_q, w_k, w_v (in_out)."""
    if not shapes.generated:
        return {}
    assert req.seed is not None
    return draw(req.seed, req.init, [(n, drawn_shape(shapes, n)) for n in shapes.generated])


def _in_out(w: Array, layout: WeightLayout) -> Array:
    """A weight in the engine's in_out layout (X @ W), whatever layout it came in."""
    return w if layout == "in_out" else w.T


def _given_or_drawn(req: InputFields, name: str, generated: Mapping[str, Array]) -> Array:
    """A projection weight in in_out layout: drawn ones already are, given ones follow
    weight_layout."""
    if name in generated:
        return generated[name]
    w = getattr(req, name)
    assert w is not None
    return _in_out(w, req.weight_layout)


def _multihead_weights(req: MultiheadRequest, generated: Mapping[str, Array]) -> MultiheadWeights:
    """Every accepted weight form as combined in_out weights."""
    if req.heads is not None:
        projections = _stack_heads(req.heads, req.weight_layout)
    elif req.in_proj_weight is not None:
        packed = req.in_proj_weight.T  # (d_model, 3·d_model), columns q, k, v
        w_q, w_k, w_v = np.split(packed, 3, axis=1)
        b = req.in_proj_bias
        b_q, b_k, b_v = (None, None, None) if b is None else np.split(b, 3)
        projections = Projections(w_q, w_k, w_v, b_q, b_k, b_v)
    else:
        w_q, w_k, w_v = (_given_or_drawn(req, n, generated) for n in ("w_q", "w_k", "w_v"))
        projections = Projections(w_q, w_k, w_v, req.b_q, req.b_k, req.b_v)
    if req.out_proj_weight is not None:
        w_o: Array | None = req.out_proj_weight.T  # always out_in, as PyTorch stores it
    else:
        w_o = None if req.w_o is None else _in_out(req.w_o, req.weight_layout)
    b_o = req.out_proj_bias if req.out_proj_bias is not None else req.b_o
    p = projections
    return MultiheadWeights(p.w_q, p.w_k, p.w_v, p.b_q, p.b_k, p.b_v, w_o=w_o, b_o=b_o)


def _stack_heads(heads: list[HeadWeights], layout: WeightLayout) -> Projections:
    """Per-head weights side by side in in_out layout, head i in columns i·d_k … (i+1)·d_k − 1;
    a head without a bias gets zeros when another head has one."""
    w = {
        n: [_in_out(getattr(head, "w_" + n), layout) for head in heads] for n in ("q", "k", "v")
    }  # per head (d_model, d_k) or (d_model, d_v)

    def bias(n: str) -> Array | None:
        parts = [getattr(head, "b_" + n) for head in heads]
        if all(p is None for p in parts):
            return None
        return np.concatenate(
            [np.zeros(wh.shape[1]) if p is None else p for p, wh in zip(parts, w[n], strict=True)]
        )

    w_q, w_k, w_v = (np.concatenate(w[n], axis=1) for n in ("q", "k", "v"))
    return Projections(w_q, w_k, w_v, bias("q"), bias("k"), bias("v"))


def _batched(a: Array | None) -> Array:
    """(L, d) -> (1, L, d); a batch stays as it is."""
    assert a is not None
    return a if a.ndim == 3 else a[None]
