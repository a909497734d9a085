"""The steps of attention as a caller with a mistake computes them, for the diagnosis
(:mod:`service.core.diagnosis.search`): :data:`STAGES`, in the engine's order, each naming the
arrays it makes, the mistakes that change it and how it makes them under a :class:`Trial`
(a set of mistakes, and how each was made where there are several ways). The head's steps are
the engine's own (:data:`service.core.chain.HEAD`), run as they are or with a mistake put in
their place (:data:`CHANGES`); the projections, the mask and the block around the heads are
stated here. Running them is :mod:`service.core.diagnosis.recompute`'s. Engine shapes: ``(B, L, ·)`` on /attention, ``(B, h, L, ·)``
per head on /multihead, ``(B, L, ·)`` for the block. NumPy only, no I/O."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from service.core import chain, masks
from service.core.attention import Past, Projections, project, transposed
from service.core.latent import LatentLayer
from service.core.multihead import (
    LayerNorm,
    MultiheadWeights,
    layer_norm,
    split_heads,
)
from service.core.rope_scaling import LongRopeScaling, YarnScaling
from service.core.softmax import softmax
from service.core.types import Alignment, Array, BoolArray, FullyMaskedPolicy, RopeStyle
from service.core.variants import Variants, sigmoid

# change which keys a query may see (and so may leave a query row with none)
MASK_MISTAKES = frozenset(
    {"mask_inverted", "causal_diagonal_masked", "window_off_by_one", "causal_alignment_swapped"}
)
_CAUSAL = frozenset({"causal_diagonal_masked", "causal_alignment_swapped"})
RowPolicy = Literal["zero", "uniform", "nan"]  # what a fully masked row holds
Way = str | float  # how a mistake with several ways was made (a base, a width, a shift)
ALL: Way = "all"  # partial_rotary_wrong: every feature of the head turned
GAIN: Way = "attention_factor"  # rope_scaling_missing: only the scaling's factor on cos, sin
TWICE: Way = "attention_factor_twice"  # rope_scaling_missing: YaRN's factor on cos, sin twice
BOOLEAN: Way = "boolean"  # mask_inverted: the boolean masks (and key_padding_mask) inverted
CAUSAL: Way = "causal"  # mask_inverted: the causal mask inverted (SDPA handed triu(ones, 1))
ONE_POSITION: Way = "one_position"  # decode_position_offset: every new token at one position
FIT: Way = "fit"  # a way found from the caller's numbers (:mod:`service.core.diagnosis.fit`)


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
    latent: LatentLayer | None = None  # DeepSeek's MLA: Q and K come rotated in part, as given
    past: Past | None = None  # a decode step's cache, per head as the stages run: (B, h, P, ·)
    values_are_keys: bool = False  # k_eq_v: one read twice, its gradient both reads'


def _always(s: chain.Setup) -> bool:
    return True


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
    (variants of a trial share the stages before the first that reads a way they differ in).
    ``on``: whether this computation has the step (a head's step with its variant on)."""

    names: tuple[str, ...]
    compute: Compute
    mistakes: frozenset[str] = frozenset()
    reads: bool = True
    feeds: bool = True
    ways: frozenset[str] = frozenset()
    on: Callable[[chain.Setup], bool] = _always


class Unfit(Exception):
    """A mistake that cannot happen with these shapes (a transposed non-square weight)."""


def _projected(name: Literal["q", "k", "v"]) -> Compute:
    def compute(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
        p = s.projections
        if p is None or s.x_in is None:
            if (
                name == "q"
                or "kv_heads_repeated_wrong" not in t.mistakes
                or t.mistakes & _PROJECTING
            ):
                raise Unfit  # q, k, v were given: nothing to recompute
            return {name: _tiled(st[name], s)}  # k and v given: their heads regrouped
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
            if "kv_heads_repeated_wrong" in t.mistakes:
                heads = _tiled(heads, s)
        return {name: heads}

    return compute


_PROJECTING = frozenset({"weights_transposed", "heads_interleaved"})  # need the projections


def _tiled(heads: Array, s: Setup) -> Array:
    """Keys or values per query head, (B, h, n, d), as grouped-query attention repeats them
    (``repeat_interleave``: key/value head j serves query heads j·g … j·g + g − 1), regrouped
    as a tile (``Tensor.repeat``, ``np.tile``: query head i gets key/value head i mod h_kv)."""
    assert s.num_heads is not None and s.num_kv_heads is not None
    group = s.num_heads // s.num_kv_heads
    return np.tile(heads[:, ::group], (1, group, 1, 1))  # (B, h, n, d)


def _split_interleaved(t: Array, num_heads: int) -> Array:
    """(B, n, h·d) -> (B, h, n, d) where head i takes columns i, i+h, i+2h, …"""
    b, n, width = t.shape
    return t.reshape(b, n, width // num_heads, num_heads).transpose(0, 3, 1, 2)


def _merge_interleaved(t: Array) -> Array:
    """(B, h, n, d) -> (B, n, h·d), the inverse of :func:`_split_interleaved`."""
    b, h, n, d = t.shape
    return t.transpose(0, 2, 3, 1).reshape(b, n, d * h)


# ---- the chain's steps, with the mistakes put into them ----------------------------------


@dataclass(frozen=True)
class Change:
    """How mistakes change one kind of step of the chain (:data:`service.core.chain.HEAD` and
    ``BLOCK``): ``run`` gives what the step computes under a trial (the step's own ``run`` when
    the trial has none of ``mistakes``); ``ways``: the mistakes whose way of being made it
    reads; ``also``: the other names the step makes that the diagnosis explains (the sinks'
    weights)."""

    mistakes: frozenset[str]
    run: Callable[[chain.Step, Setup, Trial], chain.Run]
    ways: frozenset[str] = frozenset()
    also: tuple[str, ...] = ()


def _unclipped(step: chain.Step, s: Setup, t: Trial) -> chain.Run:
    """OLMo's clamp to ±clip_qkv, left out under ``clip_missing``."""
    return (lambda x, st, hs: x) if "clip_missing" in t.mistakes else step.run


def _turned(step: chain.Step, s: Setup, t: Trial) -> chain.Run:
    """RoPE as the caller with the trial's mistakes turned the vectors: never, in the other
    style, with another base, at positions from 0 (or one off) in a decode step, or over
    every feature where only the first rotary_dim were meant (or over the first r only), or
    without the request's scaling (or only without its attention factor on cos and sin, or
    with YaRN's factor applied twice)."""
    if s.latent:
        raise Unfit  # MLA turns only its rope features: its Q and K stay as computed
    if not t.mistakes & _ROPE:
        return step.run
    if "rope_missing" in t.mistakes:
        return lambda x, st, hs: x  # never rotated
    v = s.variants
    assert v.rope is not None
    settings = v.rope
    if "rope_style_swapped" in t.mistakes:
        other: RopeStyle = "interleaved" if settings.style == "half" else "half"
        settings = replace(settings, style=other)
    if "rope_scaling_missing" in t.mistakes:  # the default frequencies, cos and sin × 1
        scaling = settings.scaling
        way = t.way("rope_scaling_missing")
        if way not in (GAIN, TWICE):
            scaling = None
        elif isinstance(scaling, YarnScaling | LongRopeScaling):  # its frequencies, × 1 or × g²
            factor = scaling.attention_factor**2 if way == TWICE else 1.0
            scaling = replace(scaling, given_attention_factor=factor)
        settings = replace(settings, scaling=scaling)
    if "partial_rotary_wrong" in t.mistakes:  # every feature turned, or only the first r
        turned = t.way("partial_rotary_wrong")
        settings = replace(settings, rotary_dim=None if turned == ALL else int(turned))
    if FIT in (dict(t.ways).get("decode_position_offset"), dict(t.ways).get("rope_base_wrong")):
        raise Unfit  # a way still to be fitted (search's): nothing to rotate by
    if "rope_base_wrong" in t.mistakes:
        settings = replace(settings, base=float(t.way("rope_base_wrong")))

    def run(x: Array, st: chain.State, hs: chain.Setup) -> Array:
        queries = np.arange(s.seq_len) if v.positions is None else v.positions  # (L,)
        keys = np.arange(s.ctx_len) if v.context_positions is None else v.context_positions
        if "decode_position_offset" in t.mistakes:  # the new tokens at 0 … L − 1, or off
            way = t.way("decode_position_offset")
            own = queries if step.reads == "q" else keys  # (n,) the positions it turns
            if way == ONE_POSITION:  # every new token at the first one's position
                queries, keys = np.full_like(queries, own[0]), np.full_like(keys, own[0])
            else:
                shift = -own[0] if way == "from_zero" else int(way)
                queries, keys = queries + shift, keys + shift
        turned = replace(v, rope=settings, positions=queries, context_positions=keys)
        return step.run(x, st, replace(hs, variants=turned))  # (..., n, d_k)

    return run


def _swapped_scores(step: chain.Step, s: Setup, t: Trial) -> chain.Run:
    """K Qᵀ (..., S, L) where Q Kᵀ was meant; with a cache K is all P + L keys."""
    if "q_k_swapped" not in t.mistakes:
        return step.run
    return lambda q, st, hs: st["k"] @ transposed(q)


def _mis_scaled(step: chain.Step, s: Setup, t: Trial) -> chain.Run:
    if t.mistakes & {"scale_missing", "scale_after_softmax"}:
        return lambda scores, st, hs: scores
    if "scale_by_d_k" in t.mistakes:
        return lambda scores, st, hs: scores / s.d_k
    if "scale_by_model_dim" in t.mistakes:  # √d_model (or √(h·d_k)) where √d_k was meant
        root = np.sqrt(float(t.way("scale_by_model_dim")))
        return lambda scores, st, hs: scores / root
    if "scale_inverted" in t.mistakes:  # · √d_k where / √d_k was meant
        return lambda scores, st, hs: scores / s.scale
    if "scale_from_config_ignored" in t.mistakes:  # 1/√d_k where the layer sets its own
        return lambda scores, st, hs: scores / np.sqrt(s.d_k)
    return step.run


def _unmasked(step: chain.Step, s: Setup, t: Trial) -> chain.Run:
    """The mask left for the weights under ``mask_after_softmax``; under ``mask_not_infinite``
    the masked scores filled with a finite number (``masked_fill(~mask, fill)``: 0 as
    ``torch.tril(scores)`` or ``scores * mask`` leave them, or a large negative one),
    the additive values elsewhere added as they are."""
    if "mask_after_softmax" in t.mistakes:
        return lambda logits, st, hs: logits
    if "mask_not_infinite" not in t.mistakes:
        return step.run
    fill = float(t.way("mask_not_infinite"))

    def run(scores: Array, st: chain.State, hs: chain.Setup) -> Array:
        additive = hs.additive
        assert additive is not None
        masked = np.isneginf(additive)  # (B, ·, L, S)
        return np.where(masked, fill, scores + np.where(masked, 0.0, additive))  # (..., L, S)

    return run


def _weighted(step: chain.Step, s: Setup, t: Trial) -> chain.Run:
    """The softmax as the caller computed it: over the queries or over the batch (axis 0, as
    ``F.softmax`` without ``dim`` takes it for a 3-D tensor), its fully masked rows NaN, the
    scale or the mask applied after it (renormalised or not); padded rows 0 all the same."""

    def run(logits: Array, st: chain.State, hs: chain.Setup) -> Array:
        if "softmax_over_queries" in t.mistakes:
            down = _softmax(np.swapaxes(logits, -1, -2), t.rows)  # (..., S, L), over queries
            weights = np.ascontiguousarray(np.swapaxes(down, -1, -2))  # matmul's fast path
        elif "softmax_over_batch" in t.mistakes:
            across = _softmax(np.moveaxis(logits, 0, -1), t.rows)  # (..., L, S, B), over items
            weights = np.ascontiguousarray(np.moveaxis(across, -1, 0))
        else:
            weights = step.run(logits, st, hs)  # (..., L, S), the sink's share in st
            empty = st.fully_masked_rows  # (..., L)
            if t.rows == "nan" and s.variants.sinks is None and empty is not None and empty.any():
                weights[empty] = np.nan
        if "scale_after_softmax" in t.mistakes:  # the request's scale, or 1/√d_model's
            dim = dict(t.ways).get("scale_by_model_dim")
            weights = weights * (s.scale if dim is None else 1.0 / np.sqrt(float(dim)))
        if "mask_after_softmax" in t.mistakes:
            weights = weights * _heads_axis(st.made, s, "mask")  # masked weights zeroed
            if t.way("mask_after_softmax") == "renormalised":  # a row with no key left: 0/0
                weights = weights / weights.sum(axis=-1, keepdims=True)
        padded = hs.padded_queries  # (..., L)
        if padded is not None and padded.any():  # 0 again after the mistakes
            weights = np.where(padded[..., None], 0.0, weights)
        return weights

    return run


def _softmax(logits: Array, rows: RowPolicy) -> Array:
    """Softmax over the last axis; a fully masked row holds 0, 1/S or NaN."""
    weights = softmax(logits, "uniform" if rows == "uniform" else "zero")
    if rows == "nan":
        empty = np.asarray(np.isneginf(logits).all(axis=-1))  # (..., L)
        weights[empty] = np.nan
    return weights


_ROPE = frozenset(
    {
        "rope_style_swapped",
        "rope_missing",
        "rope_base_wrong",
        "decode_position_offset",
        "partial_rotary_wrong",
        "rope_scaling_missing",
    }
)
_ROPE_WAYS = frozenset(
    {"rope_base_wrong", "decode_position_offset", "partial_rotary_wrong", "rope_scaling_missing"}
)
_SCALE = frozenset(
    {
        "scale_missing",
        "scale_by_d_k",
        "scale_after_softmax",
        "scale_by_model_dim",
        "scale_inverted",
        "scale_from_config_ignored",
    }
)


def _mis_merged(step: chain.Step, s: Setup, t: Trial) -> chain.Run:
    """The heads put side by side without moving the head axis back, or as every h-th column."""
    if "heads_merged_without_transpose" in t.mistakes:

        def unmoved(out: Array, st: chain.State, hs: chain.Setup) -> Array:
            b, h, n, d = out.shape
            return out.reshape(b, n, h * d)  # the head axis never moved back

        return unmoved
    if "heads_interleaved" in t.mistakes and t.way("heads_interleaved") == "interleaved":
        return lambda out, st, hs: _merge_interleaved(out)  # (B, L, h·d_v)
    return step.run


def _mis_projected(step: chain.Step, s: Setup, t: Trial) -> chain.Run:
    """X Wᵀ where X W was meant, or W_o and b_o never applied (the concatenated heads as they
    are); a square W_o only (else the shapes tell)."""
    if not t.mistakes & {"weights_transposed", "output_projection_missing"} or s.w_o is None:
        return step.run
    w_o = s.w_o
    if w_o.shape[0] != w_o.shape[1]:
        raise Unfit
    if "output_projection_missing" in t.mistakes:
        return lambda x, st, hs: x  # (B, L, h·d_v): concat (or gated) as the output
    return lambda x, st, hs: step.run(x, st, replace(hs, w_o=w_o.T))


def _mis_normed(step: chain.Step, s: Setup, t: Trial) -> chain.Run:
    """Layer norm over the other axes (per token where over all was meant, or the reverse), or
    with the unbiased variance (n − 1)."""
    if not t.mistakes & _LAYER_NORM:
        return step.run

    def run(x: Array, st: chain.State, hs: chain.Setup) -> Array:
        norm = hs.norm
        assert norm is not None
        if t.mistakes & {"layer_norm_over_all", "layer_norm_per_token"}:
            norm = replace(norm, over="all" if norm.over == "features" else "features")
        return layer_norm(x, norm, ddof=1 if "unbiased_variance" in t.mistakes else 0)

    return run


_LAYER_NORM = frozenset({"layer_norm_over_all", "layer_norm_per_token", "unbiased_variance"})
CHANGES: dict[str, Change] = {
    "clip": Change(frozenset({"clip_missing"}), _unclipped),
    "rotate": Change(_ROPE, _turned, ways=_ROPE_WAYS),
    # batch_as_sequence swaps the world (recompute's), the scores on are recomputed in it
    "scores": Change(frozenset({"q_k_swapped", "batch_as_sequence"}), _swapped_scores),
    "scale": Change(_SCALE, _mis_scaled, ways=frozenset({"scale_by_model_dim"})),
    "mask": Change(
        frozenset({"mask_after_softmax", "mask_not_infinite"}),
        _unmasked,
        ways=frozenset({"mask_not_infinite"}),
    ),
    "softmax": Change(
        frozenset({"softmax_over_queries", "scale_after_softmax", "softmax_over_batch"}),
        _weighted,
        ways=frozenset({"mask_after_softmax", "scale_by_model_dim"}),
        also=("sink_weights",),
    ),
    "concat": Change(
        frozenset({"heads_interleaved", "heads_merged_without_transpose"}),
        _mis_merged,
        ways=frozenset({"heads_interleaved"}),
    ),
    "project": Change(
        frozenset({"weights_transposed", "output_projection_missing"}), _mis_projected
    ),
    "layer_norm": Change(_LAYER_NORM, _mis_normed),
}
"""How the mistakes change the chain's steps, by the kind of step (:attr:`chain.Step.kind`: RoPE
on the queries and on the keys alike); every other step is recomputed as the engine computes
it."""


def _chained(step: chain.Step, on: Callable[[chain.Setup], bool] = _always) -> "Stage":
    """The diagnosis's stage for one step of the chain: the step's own computation, or the one
    its :data:`CHANGES` row puts in its place, over the diagnosis's arrays."""
    change = CHANGES.get(step.kind)

    def compute(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
        present = _present(st, s)
        made = dict(st)  # what the step adds (the sinks' share) stays out of st until kept
        view = chain.State(
            made, {slot: chain.made_from(step.name, present, slot) for slot in _SLOTS}
        )
        run = step.run if change is None else change.run(step, s, t)
        out = run(made[chain.made_from(step.name, present)], view, _chain_setup(st, s, t))
        also = () if change is None else change.also
        return {step.name: out} | {n: made[n] for n in also if made.get(n) is not st.get(n)}

    return Stage(
        (step.name, *(() if change is None else change.also)),
        compute,
        frozenset() if change is None else change.mistakes,
        ways=frozenset() if change is None else change.ways,
        on=on,
    )


_SLOTS: tuple[chain.Slot, ...] = ("q", "k", "v")  # those the steps read through the state
_BLOCK_NAMES = tuple(step.name for step in chain.BLOCK)


def _present(st: State, s: Setup) -> tuple[str, ...]:
    """The names of the head's chain this computation holds, in the order made."""
    made = chain.made_with(s.variants, masked=bool(s.mask_specs), cached=s.past is not None)
    return tuple(n for n in (*made, *_BLOCK_NAMES) if n in st)


def _chain_setup(st: State, s: Setup, t: Trial) -> chain.Setup:
    """The chain's setup for one of the trial's steps: the trial's mask (its additive values and
    padded rows, as its mask stage made them), its rows' policy, nothing refused."""
    additive = _heads_axis(st, s, "additive_mask") if "additive_mask" in st else None
    padded = _heads_axis(st, s, "padded_queries").astype(bool) if "padded_queries" in st else None
    policy: FullyMaskedPolicy = "uniform" if t.rows == "uniform" else "zero"
    past = s.past
    if past is not None and "kv_heads_repeated_wrong" in t.mistakes:  # the cache tiled alike
        past = Past(_tiled(past.k, s), _tiled(past.v, s))
    return chain.Setup(
        s.variants,
        s.scale,
        additive,
        padded,
        policy,
        past,
        refuse=False,
        w_o=s.w_o,
        b_o=s.b_o,
        gate=st.get("gate"),
        x_in=s.x_in,
        residual=s.residual,
        norm=s.norm,
    )


def _latest(st: State, names: tuple[str, ...]) -> Array:
    """The first of ``names`` the state holds: the latest form of an array."""
    return next(st[n] for n in names if n in st)


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
    """A mask as the caller may have built it: a boolean one inverted; a causal one inverted
    (``torch.triu(ones, 1).bool()``, the keys to hide, handed to
    ``F.scaled_dot_product_attention``, whose boolean ``attn_mask`` is true where a query may
    attend), or one that also hides the diagonal; a window one key wider or narrower on each
    bounded side (the right one only where it reaches past the query), a window or a chunk
    left out while its causal part was kept (``F.scaled_dot_product_attention(is_causal=True)``
    has no window)."""
    inverted = dict(t.ways).get("mask_inverted", BOOLEAN) if "mask_inverted" in t.mistakes else None
    if isinstance(spec, masks.Boolean) and inverted == BOOLEAN:
        return masks.Boolean(~spec.matrix)
    if isinstance(spec, masks.Causal) and inverted == CAUSAL:  # as built, then read the other way
        return masks.Boolean(~_mistaken_causal(spec, s, t))
    if isinstance(spec, masks.Causal) and t.mistakes & _CAUSAL:
        return masks.Boolean(_mistaken_causal(spec, s, t))
    if isinstance(spec, masks.Window) and "window_missing" in t.mistakes:
        return masks.Window(None, 0 if spec.right == 0 else None)  # the causal part kept
    if isinstance(spec, masks.Chunked) and "window_missing" in t.mistakes:
        return masks.Causal()  # every earlier key, not only those of the query's chunk
    if isinstance(spec, masks.Window) and "window_off_by_one" in t.mistakes:
        shift = int(t.way("window_off_by_one"))  # +1 or −1
        left = None if spec.left is None else max(spec.left + shift, 0)
        right = spec.right if not spec.right else max(spec.right + shift, 0)
        return masks.Window(left, right)
    return spec


def _mistaken_causal(spec: masks.Causal, s: Setup, t: Trial) -> BoolArray:
    """(L, S) a causal mask as the caller built it: hiding each query's own key too, or aligned
    the other way when L ≠ S — upper-left (PyTorch's ``is_causal``: query i sees keys 0 … i)
    where lower-right was meant (0 … i + S − L, the last query sees every key) or the reverse;
    in a decode step (which counts its rows after the cache) upper-left from the first key,
    the cache's offset dropped."""
    alignment: Alignment = spec.alignment
    offset = 0 if s.past is None else s.past.length
    if "causal_alignment_swapped" in t.mistakes:
        swapped: Alignment = "lower_right" if alignment == "upper_left" else "upper_left"
        alignment, offset = ("upper_left" if s.past is not None else swapped), 0
    diagonal = "causal_diagonal_masked" not in t.mistakes
    return masks.causal(s.seq_len, s.ctx_len, alignment, diagonal=diagonal, row_offset=offset)


def _heads_axis(st: State, s: Setup, name: str) -> Array:
    """A (B, L, ·) mask array with a heads axis on /multihead: (B, 1, L, ·)."""
    return st[name] if s.num_heads is None else st[name][:, None]


def _average(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    return {"average_weights": st["weights"].mean(axis=1)}  # (B, L, S)


def _gate(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    p = s.projections
    if not isinstance(p, MultiheadWeights) or p.w_g is None or s.x_in is None:
        raise Unfit  # the gate is the service's own: nothing to recompute
    return {"gate": sigmoid(project(s.x_in, p.w_g, p.b_g))}  # (B, L, h·d_v)


def _block_output(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    return {"block_output": _latest(st, ("layer_norm", "residual", "projected"))}


_PROJECTIONS = (
    Stage(("q",), _projected("q"), frozenset({"weights_transposed", "heads_interleaved"})),
    Stage(("k",), _projected("k"), _PROJECTING | {"kv_heads_repeated_wrong"}),
    Stage(("v",), _projected("v"), _PROJECTING | {"kv_heads_repeated_wrong"}),
)
_MASK = Stage(
    ("mask", "additive_mask", "padded_queries"),
    _mask,
    MASK_MISTAKES | {"mask_missing", "window_missing"},
    reads=False,
    ways=frozenset({"window_off_by_one", "mask_inverted"}),
)
_HEAD = tuple(_chained(step, step.on) for step in chain.HEAD)
_MASKED_AT = next(i for i, step in enumerate(chain.HEAD) if step.kind == "mask")
# the block's steps are on where the computation holds their arrays (recompute's filter)
_BLOCK = tuple(_chained(step) for step in chain.BLOCK)
_GATED_AT = next(i for i, step in enumerate(chain.BLOCK) if step.kind == "gated")
STAGES: tuple[Stage, ...] = (
    *_PROJECTIONS,
    *_HEAD[:_MASKED_AT],
    _MASK,
    *_HEAD[_MASKED_AT:],
    Stage(("average_weights",), _average, feeds=False),
    *_BLOCK[:_GATED_AT],
    Stage(("gate",), _gate, reads=False),
    *_BLOCK[_GATED_AT:],
    Stage(("block_output",), _block_output),
)
"""Every step in the engine's order: the projections, the head's chain (the mask made just
before the scores take it), the block around the heads (the gate made just before it
applies)."""
ORDER: tuple[str, ...] = tuple(
    dict.fromkeys(n for stage in STAGES for n in stage.names if n not in chain.CACHED)
)
"""The names the diagnosis may explain (a decode step's cache is compared, not explained: the
answer holds it per key/value head, the stages per query head)."""


def per_query_head(base: State, s: Setup) -> State:
    """``base`` with a decode step's cache after it (``present_k``, ``present_v``) made again as
    the stages hold it, per query head (the answer keeps one per key/value head)."""
    if s.past is None:
        return base
    base, plain = dict(base), Trial(frozenset(), "zero")
    for stage in _HEAD:
        if stage.names[0] in chain.CACHED and stage.names[0] in base:
            base |= stage.compute(base, s, plain)
    return base


def heads_setup(s: Setup) -> chain.Setup:
    """The chain's setup that says which of the head's steps this computation has (QK-norm
    before RoPE or after it, a mask or not, a cache or not)."""
    additive = np.zeros(()) if s.mask_specs else None  # a mask's presence
    return chain.Setup(s.variants, s.scale, additive, past=s.past, refuse=False)
