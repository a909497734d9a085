"""The steps of attention recomputed under a set of mistakes, for the diagnosis
(:mod:`service.core.diagnosis`): :data:`STAGES`, in the engine's order, each naming the
arrays it makes and the mistakes that change it; :func:`recompute` runs them from the first
one a trial changes up to the target, and :func:`set_cost` says beforehand what that costs.
Engine shapes: ``(B, L, ·)`` on /attention, ``(B, h, L, ·)`` per head on /multihead,
``(B, L, ·)`` for the block. NumPy only, no I/O."""

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from service.core import masks
from service.core.attention import Projections, project
from service.core.errors import AttentionInputError
from service.core.multihead import LayerNorm, layer_norm, merge_heads, split_heads
from service.core.positions import rope
from service.core.softmax import softmax
from service.core.types import Array, FullyMaskedPolicy, RopeStyle
from service.core.variants import Variants, qk_norm, softcap, softmax_with_sink

MASK_MISTAKES = frozenset({"mask_inverted", "causal_diagonal_masked"})  # change the mask
RowPolicy = Literal["zero", "uniform", "nan"]  # what a fully masked row holds


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


@dataclass(frozen=True)
class Trial:
    """One recomputation: a set of mistakes, what its fully masked rows hold, and how heads
    taken as every h-th column were put side by side again (back in their columns, or in
    blocks as np.concatenate does)."""

    mistakes: frozenset[str]
    rows: RowPolicy
    merge: Literal["interleaved", "blocks"] = "interleaved"


State = dict[str, Array]
Compute = Callable[[State, Setup, Trial], Mapping[str, Array]]


@dataclass(frozen=True)
class Stage:
    """One step of the chain: the names it produces and the mistakes that change it.
    ``reads``: whether it is made from earlier steps; one that is not (the mask, made from the
    request's mask settings alone) is recomputed only under its own mistakes. ``feeds``:
    whether later steps read it; one that does not (average_weights) is recomputed only when
    it is the array to explain."""

    names: tuple[str, ...]
    compute: Compute
    mistakes: frozenset[str] = frozenset()
    reads: bool = True
    feeds: bool = True


class _Unfit(Exception):
    """A mistake that cannot happen with these shapes (a transposed non-square weight)."""


def _projected(name: Literal["q", "k", "v"]) -> Compute:
    def compute(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
        p = s.projections
        if p is None or s.x_in is None:
            raise _Unfit  # q, k, v were given: nothing to recompute
        w, b = {"q": (p.w_q, p.b_q), "k": (p.w_k, p.b_k), "v": (p.w_v, p.b_v)}[name]
        if "weights_transposed" in t.mistakes:
            if w.shape[0] != w.shape[1]:
                raise _Unfit
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


def _normed(name: Literal["q", "k"]) -> Compute:
    def compute(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
        settings = s.variants.q_norm if name == "q" else s.variants.k_norm
        assert settings is not None
        return {f"{name}_normed": qk_norm(st[name], settings)}

    return compute


def _rotated(name: Literal["q", "k"]) -> Compute:
    def compute(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
        v = s.variants
        assert v.rope is not None
        settings = v.rope
        if "rope_style_swapped" in t.mistakes:
            other: RopeStyle = "interleaved" if settings.style == "half" else "half"
            settings = replace(settings, style=other)
        given = v.positions if name == "q" else v.context_positions
        n = s.seq_len if name == "q" else s.ctx_len
        positions = np.arange(n) if given is None else given  # (n,)
        x = _latest(st, (f"{name}_normed", name))
        return {f"{name}_rotated": rope(x, positions, settings)}

    return compute


def _latest(st: State, names: tuple[str, ...]) -> Array:
    """The first of ``names`` the state holds: the latest form of an array."""
    return next(st[n] for n in names if n in st)


def _scores(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    q = _latest(st, ("q_rotated", "q_normed", "q"))  # (..., L, d_k)
    k = _latest(st, ("k_rotated", "k_normed", "k"))  # (..., S, d_k)
    if "q_k_swapped" in t.mistakes:
        q, k = k, q
    return {"scores": q @ _transposed(k)}  # (..., L, S); K Qᵀ (..., S, L) when swapped


def _transposed(a: Array) -> Array:
    """``a`` with its last two axes swapped, as matmul takes it fastest: NumPy multiplies
    stacked matrices by a transposed view with a narrow inner axis in a slow loop (L = 512,
    two heads, d_k = 2: 6.8 ms of CPU against 0.55 ms for a copy), so narrow ones are copied."""
    swapped = np.swapaxes(a, -1, -2)
    return np.ascontiguousarray(swapped) if a.shape[-1] < 16 else swapped


def _scaled(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    scores = st["scores"]
    if t.mistakes & {"scale_missing", "scale_after_softmax"}:
        return {"scaled_scores": scores}
    if "scale_by_d_k" in t.mistakes:
        return {"scaled_scores": scores / s.d_k}
    return {"scaled_scores": scores * s.scale}


def _capped(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    assert s.variants.softcap is not None
    return {"capped_scores": softcap(st["scaled_scores"], s.variants.softcap)}


def _biased(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    return {"biased_scores": _latest(st, ("capped_scores", "scaled_scores")) + st["position_bias"]}


def _mask(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    specs = [_mistaken_spec(spec, s, t.mistakes) for spec in s.mask_specs]
    combined = masks.combine(specs, s.batch, s.seq_len, s.ctx_len)
    return {
        "mask": combined.allowed.astype(np.float64),  # (B, L, S), 1 = may attend
        "additive_mask": combined.additive,  # (B, L, S)
        "padded_queries": combined.padded_queries.astype(np.float64),  # (B, L)
    }


def _mistaken_spec(spec: masks.MaskSpec, s: Setup, mistakes: frozenset[str]) -> masks.MaskSpec:
    """A mask as the caller may have built it: a boolean one inverted, a causal one that also
    hides the diagonal."""
    if isinstance(spec, masks.Boolean) and "mask_inverted" in mistakes:
        return masks.Boolean(~spec.matrix)
    if isinstance(spec, masks.Causal) and "causal_diagonal_masked" in mistakes:
        strict = masks.causal(s.seq_len, s.ctx_len, spec.alignment, diagonal=False)  # (L, S)
        return masks.Boolean(strict)
    return spec


def _heads_axis(st: State, s: Setup, name: str) -> Array:
    """A (B, L, ·) mask array with a heads axis on /multihead: (B, 1, L, ·)."""
    return st[name] if s.num_heads is None else st[name][:, None]


def _masked(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    logits = _latest(st, ("biased_scores", "capped_scores", "scaled_scores"))  # (..., L, S)
    return {"masked_scores": logits + _heads_axis(st, s, "additive_mask")}


def _weights(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    logits = _latest(st, ("masked_scores", "biased_scores", "capped_scores", "scaled_scores"))
    over_queries = "softmax_over_queries" in t.mistakes
    sink_weights = None
    if over_queries:
        weights = np.swapaxes(_softmax(np.swapaxes(logits, -1, -2), t.rows), -1, -2)
    elif s.variants.sinks is not None:
        sunk = softmax_with_sink(logits, s.variants.sinks)
        weights, sink_weights = sunk.weights, sunk.sink_weights
    else:
        weights = _softmax(logits, t.rows)  # (..., L, S)
    if "scale_after_softmax" in t.mistakes:
        weights = weights * s.scale
    if "padded_queries" in st:
        padded = _heads_axis(st, s, "padded_queries").astype(bool)  # (..., L)
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
    return {"output": st["weights"] @ st["v"]}  # (..., L, d_v)


def _average(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    return {"average_weights": st["weights"].mean(axis=1)}  # (B, L, S)


def _concat(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    interleaved = "heads_interleaved" in t.mistakes and t.merge == "interleaved"
    merge = _merge_interleaved if interleaved else merge_heads
    return {"concat": merge(st["output"])}  # (B, L, h·d_v)


def _block_projected(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
    out, w_o = st["concat"], s.w_o
    if w_o is not None:
        if "weights_transposed" in t.mistakes:
            if w_o.shape[0] != w_o.shape[1]:
                raise _Unfit
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


STAGES: tuple[Stage, ...] = (
    Stage(("q",), _projected("q"), frozenset({"weights_transposed", "heads_interleaved"})),
    Stage(("k",), _projected("k"), frozenset({"weights_transposed", "heads_interleaved"})),
    Stage(("v",), _projected("v"), frozenset({"weights_transposed", "heads_interleaved"})),
    Stage(("q_normed",), _normed("q")),
    Stage(("k_normed",), _normed("k")),
    Stage(("q_rotated",), _rotated("q"), frozenset({"rope_style_swapped"})),
    Stage(("k_rotated",), _rotated("k"), frozenset({"rope_style_swapped"})),
    Stage(("scores",), _scores, frozenset({"q_k_swapped"})),
    Stage(
        ("scaled_scores",),
        _scaled,
        frozenset({"scale_missing", "scale_by_d_k", "scale_after_softmax"}),
    ),
    Stage(("capped_scores",), _capped),
    Stage(("biased_scores",), _biased),
    Stage(("mask", "additive_mask", "padded_queries"), _mask, MASK_MISTAKES, reads=False),
    Stage(("masked_scores",), _masked),
    Stage(
        ("weights", "sink_weights"),
        _weights,
        frozenset({"softmax_over_queries", "scale_after_softmax"}),
    ),
    Stage(("output",), _output),
    Stage(("average_weights",), _average, feeds=False),
    Stage(("concat",), _concat, frozenset({"heads_interleaved"})),
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


def _recomputed(
    base: State, given: Mapping[str, tuple[int, ...] | None], trial: Trial, target: str
) -> list[Stage]:
    """The stages :func:`recompute` runs for ``trial``: from the first step the mistakes change
    or the first after an array the caller gave, whichever comes first, to the target's; only
    those this computation has, a stage that reads no earlier step (the mask) only when the
    mistakes change it, and one that no later step reads only when it is the target. Empty
    when the mistakes leave the target alone."""
    last = next(i for i, stage in enumerate(STAGES) if target in stage.names)
    changed = [i for i, stage in enumerate(STAGES) if stage.mistakes & trial.mistakes]
    if not changed or changed[0] > last:
        return []
    after_given = [i + 1 for i, stage in enumerate(STAGES) if set(stage.names) & set(given)]
    return [
        stage
        for stage in STAGES[min([changed[0], *after_given]) : last + 1]
        if any(n in base for n in stage.names)  # a step this computation has
        and (stage.reads or stage.mistakes & trial.mistakes)  # else the base's is the same
        and (stage.feeds or target in stage.names)  # else nothing on the way reads it
    ]


def _shared(stages: list[Stage], variants: Sequence[Trial]) -> int:
    """How many of ``stages`` the variants of one set of mistakes share: those before the
    first that reads a setting they differ in (the fully masked rows: the weights; the way
    interleaved heads are put back: the concat)."""
    differ = {"weights"} if len({t.rows for t in variants}) > 1 else set()
    differ |= {"concat"} if len({t.merge for t in variants}) > 1 else set()
    return next((i for i, stage in enumerate(stages) if differ & set(stage.names)), len(stages))


def set_cost(
    base: State, given: Mapping[str, tuple[int, ...] | None], variants: Sequence[Trial], target: str
) -> int:
    """The numbers recomputing one set of mistakes with all its variants makes
    (:func:`recomputations`): the arrays of the stages they share once, of the others once per
    variant, each as large as the base's (0 when no stage runs)."""
    stages = _recomputed(base, given, variants[0], target)
    k = _shared(stages, variants)

    def size(part: list[Stage]) -> int:
        return sum(base[n].size for stage in part for n in stage.names if n in base)

    return size(stages[:k]) + len(variants) * size(stages[k:])


def recomputations(
    base: State,
    given: Mapping[str, tuple[int, ...] | None],
    s: Setup,
    variants: Sequence[Trial],
    target: str,
    check: Callable[[], None] = lambda: None,
) -> Iterator[tuple[Trial, Array]]:
    """The ``target`` array recomputed under each variant of one set of mistakes (as
    :func:`recompute`; those that cannot happen here left out), the stages before the first
    one the variants differ in run once for all. ``check`` is called before each part."""
    stages = _recomputed(base, given, variants[0], target)
    if not stages:
        return
    k = _shared(stages, variants)
    check()
    shared = _run(dict(base), stages[:k], base, given, s, variants[0], target)
    if shared is None:
        return
    for trial in variants:
        check()
        st = _run(dict(shared), stages[k:], base, given, s, trial, target)
        made = None if st is None else st[target]
        del st  # one variant's arrays at a time
        if made is not None:
            yield trial, made


def recompute(
    base: State,
    given: Mapping[str, tuple[int, ...] | None],
    s: Setup,
    trial: Trial,
    target: str,
) -> Array | None:
    """The ``target`` array recomputed under ``trial``, from the first step the mistakes
    change or the first after an array the caller gave (``given``: a name's heads, or None
    for all of it), whichever comes first; the caller's arrays stay theirs, except the
    target. None when the mistakes cannot happen here or leave the target alone."""
    stages = _recomputed(base, given, trial, target)
    st = _run(dict(base), stages, base, given, s, trial, target) if stages else None
    return None if st is None else st[target]


def _run(
    st: State,
    stages: list[Stage],
    base: State,
    given: Mapping[str, tuple[int, ...] | None],
    s: Setup,
    trial: Trial,
    target: str,
) -> State | None:
    """``st`` with ``stages`` recomputed under ``trial`` in order, the caller's given parts
    kept (:func:`_keep_given`); None when the mistakes cannot happen here."""
    for stage in stages:
        try:
            with np.errstate(all="ignore"):
                made = stage.compute(st, s, trial)
        except (_Unfit, AttentionInputError):
            return None
        for name, value in made.items():
            st[name] = _keep_given(value, base[name], given.get(name, ()), name == target)
    return st


def _keep_given(made: Array, base: Array, heads: tuple[int, ...] | None, target: bool) -> Array:
    """The recomputed array with the caller's given parts put back (never for the target)."""
    if target or heads == ():
        return made
    if heads is None or made.shape != base.shape:
        return base
    out = made.copy()
    out[:, list(heads)] = base[:, list(heads)]
    return out
