"""From a request whose rules hold (:mod:`service.trace.rules`) to a typed, frozen plan the engine
runs: generated arrays drawn once, every weight converted once into the engine's in_out
layout, masks turned into engine specs."""

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar, assert_never

import numpy as np
from numpy.typing import NDArray

from service.core import masks
from service.core.attention import Past, Projections
from service.core.diagnosis.search import Tolerance
from service.core.generate import draw
from service.core.latent import LatentWeights
from service.core.multihead import LayerNorm, MultiheadWeights, sinusoidal_encoding
from service.core.positions import (
    PositionBias,
)
from service.core.types import Alignment, Array, FullyMaskedPolicy, Init, WeightLayout
from service.core.variants import Variants
from service.trace.checks import lengths, options
from service.trace.gradients import Packed, given_names, packed_back
from service.trace.outputs import drawn_shape
from service.trace.rows.latent import latent_weights
from service.trace.rows.variants import engine_settings
from service.trace.rows.weight_forms import BY_NAME, given_or_drawn, in_out
from service.trace.shapes import Shapes
from service.wire.schemas.expected_fields import Expected
from service.wire.schemas.mask_fields import (
    AdditiveMask,
    BooleanMask,
    CausalMask,
    ChunkedMask,
    PaddingMask,
    WindowMask,
)
from service.wire.schemas.requests import (
    AttentionRequest,
    GateOptions,
    InputFields,
    LayerNormOptions,
    MultiheadRequest,
)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What every compute request carries into the engine."""

    shapes: Shapes
    mask_specs: tuple[masks.MaskSpec, ...]
    scale: float | None  # None: 1/√d_k; given, or a variant's (attention_multiplier)
    fully_masked_rows: FullyMaskedPolicy
    generated: Mapping[str, Array]  # drawn arrays by name, in draw order
    seed: int | None
    init: Init
    weight_layout: WeightLayout
    alignment: Alignment  # of the first causal mask (upper_left when there is none)
    include: frozenset[str] | None  # None: every output
    decimals: int | None
    variants: Variants  # position_bias not yet computed: see bias
    bias: PositionBias | None  # ALiBi or T5 settings; the bias is computed with the attention
    config_taken: Mapping[str, str] | None  # {field: config key or "request"}; None: no config
    config_keys: tuple[str, ...]  # the config's keys judged not to change the layer
    config_fields: Mapping[str, Any] | None  # the fields the config gave, as read (JSON values)
    past: Past | None  # a decode step's cache: (B, P, ·), or (B, h_kv, P, ·) on /multihead
    expected: Expected | None  # the caller's arrays to compare with
    tolerance: Tolerance | None  # None: none given (the default, or each array's printed precision)
    grad_output: Array | Literal["sum"] | None = None  # the backward's seed, batched; None: none
    # {a parameter's gradient (grad_w_q, grad_q_proj_weight …): the name the request gave the
    # parameter}, for the weights' layouts and grad_state_dict (service.trace.gradients)
    given: Mapping[str, str] = field(default_factory=dict)
    # the parameters given in a form the folds unpacked (a fused projection, gate: true's rows,
    # StableLM's per-head norms): grad_state_dict packs their gradients back
    packed: tuple[Packed, ...] = ()


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

    x: Array | None  # (B, L, d_model); None: q, k, v given per head
    context: Array | None  # (B, S, d_model)
    weights: MultiheadWeights | None  # None: q, k, v given per head
    heads: tuple[Array, Array, Array] | None  # q (B, h, L, d_k), k, v (B, h_kv, S, ·)
    w_o: Array | None  # (h·d_v, d_out) in_out; None = identity
    b_o: Array | None  # (d_out,)
    positional: Array | None  # (L, d_model), added to x
    positional_given: bool  # an explicit matrix, not the sinusoidal encoding
    residual: bool
    norm: LayerNorm | None
    latent: LatentWeights | None = None  # mla: the latents' weights (weights is then None)
    # a fused projection's unpacking (service.wire.fused.Unpacked): (formula, fused shape)
    unpack: tuple[str, tuple[int, ...]] | None = None


P = TypeVar("P", bound=Plan)


def plan_attention(req: AttentionRequest, shapes: Shapes) -> AttentionPlan:
    """The engine's inputs for /attention and /mask (``shapes`` from :func:`attention_shapes`)."""
    generated = _draw(req, shapes)
    if req.q is not None and req.k is not None and req.v is not None:
        q, k, v = _batched(req.q), _batched(req.k), _batched(req.v)
        return _plan(AttentionPlan, req, shapes, generated, q=q, k=k, v=v)
    w_q, w_k, w_v = (given_or_drawn(req, n, generated) for n in ("w_q", "w_k", "w_v"))
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
    w_o, b_o = _output_projection(req)
    if req.q is not None and req.k is not None and req.v is not None:
        return _plan(
            MultiheadPlan,
            req,
            shapes,
            generated,
            x=None,
            context=None,
            weights=None,
            heads=(_batched(req.q, 4), _batched(req.k, 4), _batched(req.v, 4)),
            w_o=w_o,
            b_o=b_o,
            positional=None,
            positional_given=False,
            residual=False,
            norm=_norm(req),
        )
    latent = shapes.form == "latent"
    pe = req.positional_encoding
    positional = (
        sinusoidal_encoding(shapes.seq_len, shapes.d_model or 0) if isinstance(pe, str) else pe
    )
    return _plan(
        MultiheadPlan,
        req,
        shapes,
        generated,
        x=_batched(generated.get("x", req.x)),
        context=None if req.context is None else _batched(req.context),
        weights=None if latent else _multihead_weights(req, shapes, generated, w_o, b_o),
        latent=latent_weights(req, w_o, b_o) if latent else None,
        unpack=None if req._unpacked is None else (req._unpacked.formula, req._unpacked.shape),
        heads=None,
        w_o=w_o,
        b_o=b_o,
        positional=positional,
        positional_given=isinstance(pe, np.ndarray),
        residual=req.residual,
        norm=_norm(req),
    )


def _norm(req: MultiheadRequest) -> LayerNorm | None:
    """The layer norm settings (None when off)."""
    o = options(req.layer_norm, LayerNormOptions)
    return None if o is None else LayerNorm(o.eps, o.gamma, o.beta, o.over)


def _output_projection(req: MultiheadRequest) -> tuple[Array | None, Array | None]:
    """(w_o in in_out, b_o) from whichever of w_o, out_proj.weight, o_proj.weight is given."""
    if req.out_proj_weight is not None:
        w_o: Array | None = req.out_proj_weight.T  # always out_in, as PyTorch stores it
    elif req.o_proj_weight is not None:
        w_o = req.o_proj_weight.T  # Hugging Face: out_in too
    else:
        w_o = None if req.w_o is None else in_out(req.w_o, req.weight_layout)
    b_o = next((b for b in (req.out_proj_bias, req.o_proj_bias, req.b_o) if b is not None), None)
    return w_o, b_o


def _positions(given: list[int] | None) -> NDArray[np.int64] | None:
    """Token positions as given (None: the engine uses 0 … n−1)."""
    return None if given is None else np.asarray(given, dtype=np.int64)


def self_attention(req: AttentionRequest | MultiheadRequest) -> bool:
    """Whether the keys are the queries' own tokens: x (given or drawn), no context, no
    direct q/k/v, no cache (API.md, "Self-attention positions")."""
    direct = req.q is not None and req.k is not None and req.v is not None
    return req.context is None and req.past is None and not direct


def _key_positions(
    req: AttentionRequest | MultiheadRequest, positions: NDArray[np.int64] | None
) -> NDArray[np.int64] | None:
    """The keys' positions: context_positions as given; else, in self-attention, the queries'
    own (the same array: a token has one position, and :func:`service.trace.rows.rope.rope_steps`
    tells the default by it); else None (the engine's 0 … S−1, keys that are other tokens)."""
    if req.context_positions is not None:
        return _positions(req.context_positions)
    return positions if self_attention(req) else None


def _plan(
    cls: type[P],
    req: AttentionRequest | MultiheadRequest,
    shapes: Shapes,
    generated: dict[str, Array],
    **rest: Any,
) -> P:
    """A plan of class ``cls``: the fields every plan has, from the request, plus ``rest``."""
    given, bias = engine_settings(req, shapes.on)
    positions = _positions(req.positions)
    keys = _key_positions(req, positions)
    variants = (  # replace() costs ~5 µs, a twentieth of a small answer's own work
        given
        if positions is None and keys is None
        else replace(given, positions=positions, context_positions=keys)
    )
    alignments = [m.alignment for m in req.mask or [] if isinstance(m, CausalMask)]
    specs = [_mask_spec(m) for m in req.mask or []]
    past = None
    if req.past is not None:  # a decode step: causal over the cache and the new tokens
        ndim = 4 if isinstance(req, MultiheadRequest) else 3
        past = Past(_batched(req.past.k, ndim), _batched(req.past.v, ndim))
        specs.append(masks.Causal())
    if req.key_padding_mask is not None:  # true = padding: (S,) or (B, S) -> allowed (·, 1, S)
        specs.append(masks.Boolean(~req.key_padding_mask[..., None, :]))
    return cls(
        shapes=shapes,
        mask_specs=tuple(specs),
        scale=req.scale if given.attention_multiplier is None else given.attention_multiplier,
        fully_masked_rows=req.fully_masked_rows,
        generated=generated,
        seed=req.seed,
        init=req.init,
        weight_layout=req.weight_layout,
        alignment=alignments[0] if alignments else "upper_left",
        include=None if req.include is None else frozenset(req.include),
        decimals=req.decimals,
        variants=variants,
        bias=bias,
        past=past,
        config_taken=req._config_taken if isinstance(req, MultiheadRequest) else None,
        config_keys=tuple(req._config_keys or ()) if isinstance(req, MultiheadRequest) else (),
        config_fields=req._config_fields if isinstance(req, MultiheadRequest) else None,
        expected=req.expected,
        tolerance=None if req.tolerance is None else Tolerance(**req.tolerance.model_dump()),
        grad_output=_seed(req.grad_output),
        given=given_names(req) if shapes.backward else {},
        packed=packed_back(req) if shapes.backward and isinstance(req, MultiheadRequest) else (),
        **rest,
    )


def _seed(grad: Array | Literal["sum"] | None) -> Array | Literal["sum"] | None:
    """grad_output with its batch axis ((L, d) -> (1, L, d)); "sum" and None as they are."""
    return grad if grad is None or isinstance(grad, str) else _batched(grad)


def _mask_spec(
    item: CausalMask | PaddingMask | WindowMask | ChunkedMask | BooleanMask | AdditiveMask,
) -> masks.MaskSpec:
    """A request's mask object as the engine's spec."""
    match item:
        case CausalMask(alignment=alignment):
            return masks.Causal(alignment)
        case PaddingMask(key_lengths=keys, query_lengths=queries):
            return masks.Padding(lengths(keys), lengths(queries))
        case BooleanMask(matrix=matrix, true_means=true_means):
            return masks.Boolean(matrix if true_means == "attend" else ~matrix)
        case AdditiveMask(matrix=matrix):
            return masks.Additive(matrix)
        case WindowMask(left=left, right=right):
            return masks.Window(left, right)
        case ChunkedMask(size=size):
            return masks.Chunked(size)
    assert_never(item)


def _draw(req: InputFields, shapes: Shapes) -> dict[str, Array]:
    """The missing arrays, drawn in the contract's order: x, then w_q, w_k, w_v (in_out)."""
    if not shapes.generated:
        return {}
    assert req.seed is not None
    return draw(req.seed, req.init, [(n, drawn_shape(shapes, n)) for n in shapes.generated])


def _batched(a: Array | None, ndim: int = 3) -> Array:
    """(L, d) -> (1, L, d), or with ``ndim`` 4 (h, L, d) -> (1, h, L, d); a batch stays as it
    is."""
    assert a is not None
    return a if a.ndim == ndim else a[None]


def _multihead_weights(
    req: MultiheadRequest,
    shapes: Shapes,
    generated: Mapping[str, Array],
    w_o: Array | None,
    b_o: Array | None,
) -> MultiheadWeights:
    """The request's weight form (decided by the rules) as combined in_out weights, with the
    output projection."""
    assert shapes.form is not None
    p = BY_NAME[shapes.form].convert(req, generated)
    gate = req.gate if isinstance(req.gate, GateOptions) else None  # gate: true is folded
    return MultiheadWeights(
        p.w_q,
        p.w_k,
        p.w_v,
        p.b_q,
        p.b_k,
        p.b_v,
        w_o=w_o,
        b_o=b_o,
        w_g=None if gate is None else gate.w.T,
        b_g=None if gate is None else gate.b,
    )
