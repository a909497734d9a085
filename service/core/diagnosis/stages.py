"""The steps of attention as a caller with a mistake computes them, for the diagnosis
(:mod:`service.core.diagnosis.search`): :data:`STAGES`, in the engine's order, each naming the
arrays it makes, the mistakes that change it and how it makes them under a :class:`Trial`
(a set of mistakes, and how each was made where there are several ways). Running them is
:mod:`service.core.diagnosis.recompute`'s. Engine shapes: ``(B, L, ·)`` on /attention, ``(B, h, L, ·)``
per head on /multihead, ``(B, L, ·)`` for the block. NumPy only, no I/O."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from service.core import chain, masks
from service.core.attention import Past, Projections, project, transposed
from service.core.multihead import (
    LayerNorm,
    MultiheadWeights,
    layer_norm,
    merge_heads,
    split_heads,
)
from service.core.positions import rope, sequence_length
from service.core.softmax import softmax
from service.core.types import Array, FullyMaskedPolicy, RopeStyle
from service.core.variants import (
    Variants,
    clip,
    qk_norm,
    sigmoid,
    softcap,
    softmax_with_sink,
    temperature_factors,
)

# change which keys a query may see (and so may leave a query row with none)
MASK_MISTAKES = frozenset({"mask_inverted", "causal_diagonal_masked", "window_off_by_one"})
RowPolicy = Literal["zero", "uniform", "nan"]  # what a fully masked row holds
Way = str | float  # how a mistake with several ways was made (a base, a width, a shift)


@dataclass(frozen=True)
class Setup:
    """What recomputing the steps needs besides the step arrays (engine layout, in_out)."""

    scale: float
    d_k: int
    fully_masked_policy: FullyMaskedPolicy
    variants: Variants  # position_bias already computed
    mask_specs: tuple[masks.MaskSpec, ...]
    batch: int
    seq_len: int
    ctx_len: int
    num_heads: int | None = None  # /multihead: h; None on /attention (no heads axis)
    num_kv_heads: int | None = None
    x_in: Array | None = None  # (B, L, d_model); None: q, k, v were given
    context: Array | None = None  # (B, S, d_model): cross-attention's keys and values
    projections: Projections | None = None
    w_o: Array | None = None  # (h·d_v, d_out)
    b_o: Array | None = None
    residual: bool = False
    norm: LayerNorm | None = None
    latent: bool = False  # DeepSeek's MLA: Q and K come rotated in part, as given
    past: Past | None = None  # a decode step's cache, per head as the stages run: (B, h, P, ·)


@dataclass(frozen=True)
class Trial:
    """One recomputation: a set of mistakes, what its fully masked rows hold, and how each
    mistake with several ways was made (``ways``: code → way, e.g. the RoPE base used, or how
    heads taken as every h-th column were put side by side again)."""

    mistakes: frozenset[str]
    rows: RowPolicy
    ways: tuple[tuple[str, Way], ...] = ()

    def way(self, code: str) -> Way:
        return dict(self.ways)[code]


State = dict[str, Array]
Compute = Callable[[State, Setup, Trial], Mapping[str, Array]]


@dataclass(frozen=True)
class Stage:
    """One step of the chain: the names it produces and the mistakes that change it.
    ``reads``: whether it is made from earlier steps; one that is not (the mask, made from the
    request's mask settings alone) is recomputed only under its own mistakes. ``feeds``:
    whether later steps read it; one that does not (average_weights) is recomputed only when
    it is the array to explain. ``ways``: the mistakes whose way of being made it reads
    (variants of a trial share the stages before the first that reads a way they differ in)."""

    names: tuple[str, ...]
    compute: Compute
    mistakes: frozenset[str] = frozenset()
    reads: bool = True
    feeds: bool = True
    ways: frozenset[str] = frozenset()


class Unfit(Exception):
    """A mistake that cannot happen with these shapes (a transposed non-square weight)."""


def _projected(name: Literal["q", "k", "v"]) -> Compute:
    def compute(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
        p = s.projections
        if p is None or s.x_in is None:
            raise Unfit  # q, k, v were given: nothing to recompute
        w, b = {"q": (p.w_q, p.b_q), "k": (p.w_k, p.b_k), "v": (p.w_v, p.b_v)}[name]
        if "weights_transposed" in t.mistakes:
            if w.shape[0] != w.shape[1]:
                raise Unfit
            w = w.T  # X Wᵀ where X W was meant
        source = s.x_in if name == "q" or s.context is None else s.context  # (B, n, d_model)
        out = project(source, w, b)  # (B, n, heads·d)
        if s.num_heads is None:
            return {name: out}
        h = s.num_heads if name == "q" else s.num_kv_heads or s.num_heads
        split = _split_interleaved if "heads_interleaved" in t.mistakes else split_heads
        heads = split(out, h)  # (B, h_·, n, d)
        if h != s.num_heads:
            heads = np.repeat(heads, s.num_heads // h, axis=1)  # (B, h, n, d), GQA
        return {name: heads}

    return compute


def _split_interleaved(t: Array, num_heads: int) -> Array:
    """(B, n, h·d) -> (B, h, n, d) where head i takes columns i, i+h, i+2h, …"""
    b, n, width = t.shape
    return t.reshape(b, n, width // num_heads, num_heads).transpose(0, 3, 1, 2)


def _merge_interleaved(t: Array) -> Array:
    """(B, h, n, d) -> (B, n, h·d), the inverse of :func:`_split_interleaved`."""
    b, h, n, d = t.shape
    return t.transpose(0, 2, 3, 1).reshape(b, n, d * h)


def _clipped(name: Literal["q", "k", "v"]) -> Compute:
    """OLMo's clamp of a projection to ±clip_qkv; left out under ``clip_missing``."""

    def compute(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
        c = s.variants.clip_qkv
        assert c is not None
        x = st[name]  # (..., n, ·) the projection
        return {f"{name}_clipped": x if "clip_missing" in t.mistakes else clip(x, c)}

    return compute


def _normed(name: Literal["q", "k"]) -> Compute:
    def compute(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
        settings = s.variants.q_norm if name == "q" else s.variants.k_norm
        assert settings is not None
        after = _after_rope(s)  # Llama 4: the norm turns the form RoPE reads itself
        x = _read(st, s, f"{name}_rotated" if after else f"{name}_normed")  # q, or q_clipped
        x = _turned(x, name, s, t) if after else x
        return {f"{name}_normed": qk_norm(x, settings)}

    return compute


def _turned(x: Array, name: Literal["q", "k"], s: Setup, t: Trial) -> Array:
    """``x (..., n, d_k)`` rotated as the caller with the trial's RoPE mistakes did."""
    v = s.variants
    assert v.rope is not None
    if s.latent:
        raise Unfit  # MLA turns only its rope features: its Q and K stay as computed
    settings = v.rope
    if "rope_missing" in t.mistakes:
        return x  # never rotated
    if "rope_style_swapped" in t.mistakes:
        other: RopeStyle = "interleaved" if settings.style == "half" else "half"
        settings = replace(settings, style=other)
    if "rope_base_wrong" in t.mistakes:
        settings = replace(settings, base=float(t.way("rope_base_wrong")))
    given = v.positions if name == "q" else v.context_positions
    n = s.seq_len if name == "q" else s.ctx_len
    positions = np.arange(n) if given is None else given  # (n,)
    queries = np.arange(s.seq_len) if v.positions is None else v.positions  # (L,)
    if "decode_position_offset" in t.mistakes:  # the new tokens at 0 … L − 1, or one off
        way = t.way("decode_position_offset")
        shift = -positions[0] if way == "from_zero" else int(way)
        positions, queries = positions + shift, queries + shift
    return rope(x, positions, settings, sequence_length(queries))


def _after_rope(s: Setup) -> bool:
    """Whether QK-norm follows RoPE (Llama 4)."""
    return s.variants.q_norm is not None and s.variants.q_norm.after_rope


def _rotated(name: Literal["q", "k"]) -> Compute:
    def compute(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
        made = f"{name}_rotated"
        return {made: _turned(_read(st, s, made), name, s, t)}  # (..., n, d_k)

    return compute


def _tempered(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    v = s.variants
    assert v.temperature is not None
    positions = np.arange(s.seq_len) if v.positions is None else v.positions  # (L,)
    q = _read(st, s, "q_tempered")  # (..., L, d_k)
    return {"q_tempered": q * temperature_factors(positions, v.temperature)[:, None]}


def _v_normed(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    assert s.variants.v_norm is not None
    return {"v_normed": qk_norm(_read(st, s, "v_normed"), s.variants.v_norm)}


def _read(st: State, s: Setup, step: str, slot: chain.Slot | None = None) -> Array:
    """What the head's step ``step`` reads from its slot (or from ``slot``): the latest form
    made before it in the chain (:func:`service.core.chain.made_from`), among those this
    computation holds."""
    made = chain.made_with(s.variants, masked=bool(s.mask_specs))  # a decode's cache aside
    return st[chain.made_from(step, tuple(n for n in made if n in st), slot)]


def _latest(st: State, names: tuple[str, ...]) -> Array:
    """The first of ``names`` the state holds: the latest form of an array."""
    return next(st[n] for n in names if n in st)


def _scores(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    q = _read(st, s, "scores")  # (..., L, d_k)
    k = _read(st, s, "scores", "k")  # (..., S, d_k); with a cache the L new keys
    if s.past is not None:  # a decode step: the cached keys, then the new (P + L keys)
        k = np.concatenate([s.past.k, k], axis=-2)
    if "q_k_swapped" in t.mistakes:
        q, k = k, q
    return {"scores": q @ transposed(k)}  # (..., L, S); K Qᵀ (..., S, L) when swapped


def _scaled(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    scores = st["scores"]
    if t.mistakes & {"scale_missing", "scale_after_softmax"}:
        return {"scaled_scores": scores}
    if "scale_by_d_k" in t.mistakes:
        return {"scaled_scores": scores / s.d_k}
    if "scale_by_model_dim" in t.mistakes:  # √d_model (or √(h·d_k)) where √d_k was meant
        return {"scaled_scores": scores / np.sqrt(float(t.way("scale_by_model_dim")))}
    if "scale_inverted" in t.mistakes:  # · √d_k where / √d_k was meant
        return {"scaled_scores": scores / s.scale}
    if "scale_from_config_ignored" in t.mistakes:  # 1/√d_k where the layer sets its own
        return {"scaled_scores": scores / np.sqrt(s.d_k)}
    return {"scaled_scores": scores * s.scale}


def _capped(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    assert s.variants.softcap is not None
    return {"capped_scores": softcap(st["scaled_scores"], s.variants.softcap)}


def _biased(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    return {"biased_scores": _read(st, s, "biased_scores") + st["position_bias"]}


def _mask(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    given = () if "mask_missing" in t.mistakes else s.mask_specs  # never applied
    specs = [_mistaken_spec(spec, s, t) for spec in given]
    cached = 0 if s.past is None else s.past.length  # a decode step's rows come after it
    combined = masks.combine(specs, s.batch, s.seq_len, s.ctx_len, cached)
    return {
        "mask": combined.allowed.astype(np.float64),  # (B, L, S), 1 = may attend
        "additive_mask": combined.additive,  # (B, L, S)
        "padded_queries": combined.padded_queries.astype(np.float64),  # (B, L)
    }


def _mistaken_spec(spec: masks.MaskSpec, s: Setup, t: Trial) -> masks.MaskSpec:
    """A mask as the caller may have built it: a boolean one inverted, a causal one that also
    hides the diagonal, a window one key wider or narrower on each bounded side (the right
    one only where it reaches past the query)."""
    if isinstance(spec, masks.Boolean) and "mask_inverted" in t.mistakes:
        return masks.Boolean(~spec.matrix)
    if isinstance(spec, masks.Causal) and "causal_diagonal_masked" in t.mistakes:
        strict = masks.causal(s.seq_len, s.ctx_len, spec.alignment, diagonal=False)  # (L, S)
        return masks.Boolean(strict)
    if isinstance(spec, masks.Window) and "window_off_by_one" in t.mistakes:
        shift = int(t.way("window_off_by_one"))  # +1 or −1
        left = None if spec.left is None else max(spec.left + shift, 0)
        right = spec.right if not spec.right else max(spec.right + shift, 0)
        return masks.Window(left, right)
    return spec


def _heads_axis(st: State, s: Setup, name: str) -> Array:
    """A (B, L, ·) mask array with a heads axis on /multihead: (B, 1, L, ·)."""
    return st[name] if s.num_heads is None else st[name][:, None]


def _masked(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    logits = _read(st, s, "masked_scores")  # (..., L, S)
    if "mask_after_softmax" in t.mistakes:
        return {"masked_scores": logits}  # the mask waits for the weights
    return {"masked_scores": logits + _heads_axis(st, s, "additive_mask")}


def _weights(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    logits = _read(st, s, "weights")  # (..., L, S) the scores so far
    over_queries = "softmax_over_queries" in t.mistakes
    sink_weights = None
    if over_queries:
        down = _softmax(np.swapaxes(logits, -1, -2), t.rows)  # (..., S, L), over the queries
        weights = np.ascontiguousarray(np.swapaxes(down, -1, -2))  # matmul's fast path
    elif s.variants.sinks is not None:
        sunk = softmax_with_sink(logits, s.variants.sinks)
        weights, sink_weights = sunk.weights, sunk.sink_weights
    else:
        weights = _softmax(logits, t.rows)  # (..., L, S)
    if "scale_after_softmax" in t.mistakes:
        weights = weights * s.scale
    if "mask_after_softmax" in t.mistakes:
        weights = weights * _heads_axis(st, s, "mask")  # masked weights zeroed, (..., L, S)
        if t.way("mask_after_softmax") == "renormalised":  # a row with no key left: 0/0
            weights = weights / weights.sum(axis=-1, keepdims=True)
    padded = _heads_axis(st, s, "padded_queries").astype(bool) if "padded_queries" in st else None
    if padded is not None and padded.any():  # (..., L); none: no pass over the weights
        weights = np.where(padded[..., None], 0.0, weights)
        if sink_weights is not None:  # a padded row gives the sink nothing either
            sink_weights = np.where(padded, 0.0, sink_weights)
    out = {"weights": weights}
    return out if sink_weights is None else out | {"sink_weights": sink_weights}


def _softmax(logits: Array, rows: RowPolicy) -> Array:
    """Softmax over the last axis; a fully masked row holds 0, 1/S or NaN."""
    weights = softmax(logits, "uniform" if rows == "uniform" else "zero")
    if rows == "nan":
        empty = np.asarray(np.isneginf(logits).all(axis=-1))  # (..., L)
        weights[empty] = np.nan
    return weights


def _output(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    v = _read(st, s, "output", "v")  # (..., S, d_v); with a cache the L new values
    if s.past is not None:
        v = np.concatenate([s.past.v, v], axis=-2)  # (..., P + L, d_v)
    return {"output": st["weights"] @ v}  # (..., L, d_v)


def _average(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    return {"average_weights": st["weights"].mean(axis=1)}  # (B, L, S)


def _concat(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    output = st["output"]  # (B, h, L, d_v)
    if "heads_merged_without_transpose" in t.mistakes:
        b, h, n, d = output.shape
        return {"concat": output.reshape(b, n, h * d)}  # the head axis never moved back
    interleaved = "heads_interleaved" in t.mistakes and t.way("heads_interleaved") == "interleaved"
    merge = _merge_interleaved if interleaved else merge_heads
    return {"concat": merge(output)}  # (B, L, h·d_v)


def _gate(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    p = s.projections
    if not isinstance(p, MultiheadWeights) or p.w_g is None or s.x_in is None:
        raise Unfit  # the gate is the service's own: nothing to recompute
    return {"gate": sigmoid(project(s.x_in, p.w_g, p.b_g))}  # (B, L, h·d_v)


def _gated(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    return {"gated": st["concat"] * st["gate"]}  # (B, L, h·d_v)


def _block_projected(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    out, w_o = _latest(st, ("gated", "concat")), s.w_o
    if w_o is not None:
        if "weights_transposed" in t.mistakes:
            if w_o.shape[0] != w_o.shape[1]:
                raise Unfit
            w_o = w_o.T
        out = out @ w_o  # (B, L, d_out)
    return {"projected": out if s.b_o is None else out + s.b_o}


def _residual(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    assert s.x_in is not None
    return {"residual": s.x_in + st["projected"]}


def _layer_norm(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    assert s.norm is not None
    norm = s.norm
    if t.mistakes & {"layer_norm_over_all", "layer_norm_per_token"}:
        norm = replace(norm, over="all" if norm.over == "features" else "features")
    ddof = 1 if "unbiased_variance" in t.mistakes else 0
    return {"layer_norm": layer_norm(_latest(st, ("residual", "projected")), norm, ddof=ddof)}


def _block_output(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    return {"block_output": _latest(st, ("layer_norm", "residual", "projected"))}


_ROPE = frozenset(
    {"rope_style_swapped", "rope_missing", "rope_base_wrong", "decode_position_offset"}
)
_ROPE_WAYS = frozenset({"rope_base_wrong", "decode_position_offset"})
_SCALE = frozenset(
    {"scale_missing", "scale_by_d_k", "scale_after_softmax", "scale_by_model_dim", "scale_inverted",
     "scale_from_config_ignored"}
)  # fmt: skip
STAGES: tuple[Stage, ...] = (
    Stage(("q",), _projected("q"), frozenset({"weights_transposed", "heads_interleaved"})),
    Stage(("k",), _projected("k"), frozenset({"weights_transposed", "heads_interleaved"})),
    Stage(("v",), _projected("v"), frozenset({"weights_transposed", "heads_interleaved"})),
    Stage(("q_clipped",), _clipped("q"), frozenset({"clip_missing"})),
    Stage(("k_clipped",), _clipped("k"), frozenset({"clip_missing"})),
    Stage(("v_clipped",), _clipped("v"), frozenset({"clip_missing"})),
    # with after_rope (Llama 4) the norm turns the vectors itself: RoPE's mistakes change it
    Stage(("q_normed",), _normed("q"), _ROPE, ways=_ROPE_WAYS),
    Stage(("k_normed",), _normed("k"), _ROPE, ways=_ROPE_WAYS),
    Stage(("q_rotated",), _rotated("q"), _ROPE, ways=_ROPE_WAYS),
    Stage(("k_rotated",), _rotated("k"), _ROPE, ways=_ROPE_WAYS),
    Stage(("q_tempered",), _tempered),
    Stage(("v_normed",), _v_normed),
    Stage(("scores",), _scores, frozenset({"q_k_swapped", "batch_as_sequence"})),
    Stage(("scaled_scores",), _scaled, _SCALE, ways=frozenset({"scale_by_model_dim"})),
    Stage(("capped_scores",), _capped),
    Stage(("biased_scores",), _biased),
    Stage(
        ("mask", "additive_mask", "padded_queries"),
        _mask,
        MASK_MISTAKES | {"mask_missing"},
        reads=False,
        ways=frozenset({"window_off_by_one"}),
    ),
    Stage(("masked_scores",), _masked, frozenset({"mask_after_softmax"})),
    Stage(
        ("weights", "sink_weights"),
        _weights,
        frozenset({"softmax_over_queries", "scale_after_softmax"}),
        ways=frozenset({"mask_after_softmax"}),
    ),
    Stage(("output",), _output),
    Stage(("average_weights",), _average, feeds=False),
    Stage(
        ("concat",),
        _concat,
        frozenset({"heads_interleaved", "heads_merged_without_transpose"}),
        ways=frozenset({"heads_interleaved"}),
    ),
    Stage(("gate",), _gate, reads=False),
    Stage(("gated",), _gated),
    Stage(("projected",), _block_projected, frozenset({"weights_transposed"})),
    Stage(("residual",), _residual),
    Stage(
        ("layer_norm",),
        _layer_norm,
        frozenset({"layer_norm_over_all", "layer_norm_per_token", "unbiased_variance"}),
    ),
    Stage(("block_output",), _block_output),
)
ORDER: tuple[str, ...] = tuple(name for stage in STAGES for name in stage.names)
