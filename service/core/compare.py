"""Compare a caller's arrays with the service's, and find the mistake behind a difference.

A caller (a course notebook, their own kernel) sends the arrays they computed. Each is
compared with the service's (:func:`difference`); for the earliest one that differs,
:func:`diagnose` recomputes the steps leading to it under each common mistake of
:data:`MISTAKES`, then under each pair, and returns the smallest set that reproduces the
caller's numbers within the tolerance. Nothing is guessed: a set is named only when the
recomputation reproduces the array.

The diagnosis can cost far more than the request itself (up to ~75 candidate sets, some tried
several ways, each recomputed from its first changed step), so :func:`search` is given a
budget of numbers to compute: a set's cost is known before it runs (:func:`set_cost`: the
arrays of the stages it recomputes, those its variants share counted once), the sets run in
order (singles first, then pairs, in the table's order) and the search stops before the first
set that no longer fits, saying so (:attr:`Search.complete`).

Arrays use the engine's shapes: ``(B, L, ·)`` on /attention, ``(B, h, L, ·)`` per head on
/multihead, ``(B, L, ·)`` for the multi-head block. NumPy only, no I/O.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations, groupby
from typing import Literal

import numpy as np

from service.core import masks
from service.core.attention import Projections, Variants, project
from service.core.errors import AttentionInputError
from service.core.multihead import LayerNorm, layer_norm, merge_heads, split_heads
from service.core.positions import rope
from service.core.softmax import softmax
from service.core.types import Array, FullyMaskedPolicy, RopeStyle
from service.core.variants import qk_norm, softcap, softmax_with_sink

# The contract's codes, in its table's order (a diagnosis lists its codes in this order).
MISTAKES: tuple[str, ...] = (
    "softmax_over_queries",
    "scale_after_softmax",
    "scale_missing",
    "scale_by_d_k",
    "weights_transposed",
    "q_k_swapped",
    "mask_inverted",
    "causal_diagonal_masked",
    "layer_norm_over_all",
    "layer_norm_per_token",
    "unbiased_variance",
    "heads_interleaved",
    "rope_style_swapped",
)
# Ways of doing the same thing: a pair from one group is never tried.
_EXCLUSIVE = (
    frozenset({"scale_after_softmax", "scale_missing", "scale_by_d_k"}),
    frozenset({"layer_norm_over_all", "layer_norm_per_token"}),
)
_MASK_MISTAKES = frozenset({"mask_inverted", "causal_diagonal_masked"})
MASKED_FLOOR = -1e9  # a caller's score at or below this counts as masked (masked_fill(-1e9))

RowPolicy = Literal["zero", "uniform", "nan"]  # what a fully masked row holds
_ROW_POLICIES: tuple[RowPolicy, ...] = ("zero", "uniform", "nan")


@dataclass(frozen=True)
class Tolerance:
    """A caller's number y matches the service's x when |y − x| ≤ atol + rtol·|x|."""

    atol: float = 1e-6
    rtol: float = 1e-6


@dataclass(frozen=True)
class Difference:
    """How a caller's array differs from the service's."""

    match: bool
    max_abs_diff: float  # ∞ where one side is finite and the other not
    where: tuple[int, ...]  # index of the largest difference
    ours: float
    yours: float


def difference(ours: Array, yours: Array, tol: Tolerance) -> Difference:
    """Compare two arrays of one shape element by element.

    NaN matches NaN and −∞ matches −∞; where ``ours`` is −∞ (a masked score) any value of
    ``yours`` at or below :data:`MASKED_FLOOR` matches too. Elsewhere a non-finite number
    facing a finite one is an infinite difference.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        same = (np.isnan(ours) & np.isnan(yours)) | (np.isinf(ours) & (ours == yours))
        same |= np.isneginf(ours) & (yours <= MASKED_FLOOR)
        diff = np.abs(ours - yours)  # NaN or ∞ where one side is not finite
        diff = np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))
        bound = tol.atol + tol.rtol * np.abs(np.where(np.isfinite(ours), ours, 0.0))
    close = same | (diff <= bound)
    at = np.unravel_index(int(np.argmax(diff)), diff.shape)
    where = tuple(int(i) for i in at)
    return Difference(bool(close.all()), float(diff[at]), where, float(ours[at]), float(yours[at]))


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
    Stage(("mask", "additive_mask", "padded_queries"), _mask, _MASK_MISTAKES, reads=False),
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


def applicable(s: Setup, present: frozenset[str]) -> tuple[str, ...]:
    """The mistakes that could have happened in this computation (``present``: the names of
    the arrays it has), in table order."""
    specs = s.mask_specs
    square = s.projections is not None and any(
        w.shape[0] == w.shape[1] for w in (s.projections.w_q, s.projections.w_k, s.projections.w_v)
    )
    multi = s.num_heads is not None and s.num_heads > 1
    norm = s.norm
    possible = {
        "softmax_over_queries": s.seq_len > 1,
        "scale_after_softmax": s.scale != 1.0,
        "scale_missing": s.scale != 1.0,
        "scale_by_d_k": s.scale != 1.0 / s.d_k,
        "weights_transposed": (s.x_in is not None and square)
        or (s.w_o is not None and s.w_o.shape[0] == s.w_o.shape[1]),
        "q_k_swapped": s.seq_len == s.ctx_len,
        "mask_inverted": any(isinstance(m, masks.Boolean) for m in specs),
        "causal_diagonal_masked": any(isinstance(m, masks.Causal) for m in specs),
        "layer_norm_over_all": norm is not None and norm.over == "features",
        "layer_norm_per_token": norm is not None and norm.over == "all",
        "unbiased_variance": norm is not None,
        "heads_interleaved": multi,
        "rope_style_swapped": "q_rotated" in present,
    }
    return tuple(code for code in MISTAKES if possible[code])


@dataclass(frozen=True)
class Target:
    """The array to explain: a name of :data:`ORDER`, one head of it (or all), and the
    caller's numbers shaped as that selection of the engine's array."""

    name: str
    head: int | None
    yours: Array


@dataclass(frozen=True)
class Diagnosis:
    """The smallest set of mistakes whose recomputation reproduces the caller's array."""

    mistakes: tuple[str, ...]  # in table order
    rows: RowPolicy  # what the fully masked rows held (matters for the mask mistakes)
    difference: Difference  # the reproduction against the caller's array


def trials(codes: tuple[str, ...], policy: FullyMaskedPolicy) -> Iterator[Trial]:
    """Each mistake alone, then each pair (never two from one group); a set with a mask
    mistake is tried with fully masked rows of zeros, 1/S and NaN, and one with interleaved
    heads with both ways of putting them side by side, as notebooks differ."""
    own: RowPolicy = "uniform" if policy == "uniform" else "zero"
    singles = [frozenset({c}) for c in codes]
    pairs = [
        frozenset(p)
        for p in combinations(codes, 2)
        if not any(frozenset(p) <= group for group in _EXCLUSIVE)
    ]
    for mistakes in (*singles, *pairs):
        rows: tuple[RowPolicy, ...] = (own,)
        if mistakes & _MASK_MISTAKES:
            rows = (own, *(r for r in _ROW_POLICIES if r != own))
        merges: tuple[Literal["interleaved", "blocks"], ...] = ("interleaved",)
        if "heads_interleaved" in mistakes:
            merges = ("interleaved", "blocks")
        for r in rows:
            for m in merges:
                yield Trial(mistakes, r, m)


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


@dataclass(frozen=True)
class Search:
    """What :func:`search` found and how far it went."""

    found: Diagnosis | None
    complete: bool  # every candidate set that could change the answer was tried
    tried: int  # candidate sets of mistakes tried (each with all its variants)
    sets: int  # candidate sets of mistakes there were
    spent: int  # numbers computed (:func:`set_cost`, and the full comparisons)
    size: int  # how many mistakes the sets tried last held (1 or 2; 0: none tried)


def search(
    base: State,
    given: Mapping[str, tuple[int, ...] | None],
    s: Setup,
    target: Target,
    tol: Tolerance,
    budget: int | None = None,
    check: Callable[[], None] = lambda: None,
) -> Search:
    """Which mistakes (the fewest: one, else two) reproduce the caller's ``target`` array,
    computing at most ``budget`` numbers (None: no limit).

    ``base`` holds every array of the computation by name (:data:`ORDER`, engine shapes),
    with the arrays the caller gave (``given``) already put in place of the service's: the
    steps before the target are recomputed from the caller's own numbers where they exist.
    Among sets of one size that reproduce the array, the closest wins. The candidate sets run
    in the order of :func:`trials`, a set with all its variants at once
    (:func:`recomputations`); before each, its cost (:func:`set_cost`) is counted, and the
    search stops before the first set that would take the numbers computed over ``budget``.
    A recomputation is compared with the caller's array first where it differs most from the
    service's, and in full (a pass over the target, counted too) only when it agrees there.
    ``check`` is called between recomputations (it raises when the client has gone).
    """
    codes = applicable(s, frozenset(base))
    sets = [list(group) for _, group in groupby(trials(codes, s.fully_masked_policy), _mistakes)]
    ours = base[target.name] if target.head is None else base[target.name][:, target.head]
    at = difference(ours, target.yours, tol).where if ours.shape == target.yours.shape else None
    found: list[Diagnosis] = []
    spent = tried = size = 0
    complete = True
    for variants in sets:
        if found and len(variants[0].mistakes) > len(found[0].mistakes):
            break
        cost = set_cost(base, given, variants, target.name)
        if budget is not None and spent + cost > budget:
            complete = False
            break
        spent, tried, size = spent + cost, tried + 1, len(variants[0].mistakes)
        for trial, made in recomputations(base, given, s, variants, target.name, check):
            mine = made if target.head is None else made[:, target.head]
            if mine.shape != target.yours.shape or not _agrees(mine, target.yours, at, tol):
                continue
            spent += target.yours.size
            diff = difference(mine, target.yours, tol)
            if diff.match:
                ordered = tuple(c for c in MISTAKES if c in trial.mistakes)
                found.append(Diagnosis(ordered, trial.rows, diff))
    best = min(found, key=lambda d: d.difference.max_abs_diff, default=None)
    return Search(best, complete, tried, len(sets), spent, size)


def _mistakes(trial: Trial) -> frozenset[str]:
    return trial.mistakes


def _agrees(mine: Array, yours: Array, at: tuple[int, ...] | None, tol: Tolerance) -> bool:
    """Whether two arrays of one shape agree at index ``at`` (a match needs it; None: yes)."""
    if at is None:
        return True
    return difference(np.asarray(mine[at]).reshape(1), np.asarray(yours[at]).reshape(1), tol).match


def diagnose(
    base: State,
    given: Mapping[str, tuple[int, ...] | None],
    s: Setup,
    target: Target,
    tol: Tolerance,
    check: Callable[[], None] = lambda: None,
) -> Diagnosis | None:
    """Which mistakes (the fewest: one, else two) reproduce the caller's ``target`` array:
    :func:`search` without a budget (see there)."""
    return search(base, given, s, target, tol, None, check).found
