"""The chain of one attention head, written once: :data:`HEAD`, its steps in order.

Each :class:`Step` names the intermediate it makes and the slot it reads and advances (``q``,
``k``, ``v``: the latest form of the queries, keys, values; ``scores``: the scores so far;
``weights``; ``out``), and when it is on. :func:`run` runs the steps that are on, in order,
over a :class:`State` (every intermediate by name, and each slot's latest name); the engine
(:func:`service.core.attention.scaled_dot_product_attention`) runs them with the guards on,
and :func:`made_from` answers what a step read, for every reader of the chain (the trace's
symbols and the order of its steps). The contract fixes the order (API.md, "Position and
score variants"): q, k and v clipped right after the projections (OLMo's ``clip_qkv``), QK-norm of Q and K (Qwen3, Gemma 3), RoPE (Su et al. 2021), the norm after
RoPE instead (Llama 4's ``Llama4TextL2Norm``), the queries' temperature (Llama 4), the values'
norm (Gemma 4), the cache (transformers' ``Cache.update``), then the scores Q Kᵀ (Vaswani et
al. 2017), scaled, soft-capped (Gemma 2), biased (ALiBi, T5), masked, the softmax (with a sink,
gpt-oss) and the weights times the values.

Shapes use paper names: L queries, S keys, d_k query/key width, d_v value width, with any
leading batch axes (``...``): ``(B, L, ·)`` on /attention, ``(B, h, L, ·)`` per head.
NumPy only, no I/O.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Literal
from weakref import ref

import numpy as np

from service.core.block import LayerNorm, layer_norm, layer_norm_backward, merge_heads, split_heads
from service.core.errors import AttentionInputError, FullyMaskedRowsError, require_finite
from service.core.linear import Past, project_backward, transposed
from service.core.positions import rope, rope_backward, sequence_length
from service.core.softmax import rows_by_item, softmax_rows
from service.core.types import Array, BoolArray, FullyMaskedPolicy, IntArray
from service.core.variants import (
    NormGrad,
    Variants,
    clip,
    clip_backward,
    qk_norm,
    qk_norm_backward,
    softcap,
    softcap_backward,
    softmax_with_sink,
)
from service.core.variants import temperature_factors as temperature

Slot = Literal["q", "k", "v", "scores", "weights", "out", "block"]


@dataclass(slots=True)  # not frozen: built for every head run, and frozen's init costs 2×
class Setup:
    """What the steps read besides the arrays: the variants (positions already those of a
    decode step), the scale, the mask and its policies, the cache; for the block around the
    heads (:data:`BLOCK`), its weights, the gate, the block's input and its norm."""

    variants: Variants
    scale: float = 1.0
    additive: Array | None = None  # broadcastable to (..., L, S): 0, −∞ masked, or a bias
    padded_queries: BoolArray | None = None  # broadcastable to (..., L)
    fully_masked_policy: FullyMaskedPolicy = "zero"
    past: Past | None = None  # a decode step's cache: (..., P, d_k), (..., P, d_v)
    refuse: bool = True  # refuse sums that overflow (the engine); False: keep ±∞, NaN (a trial)
    w_o: Array | None = None  # (h·d_v, d_out); None: the identity
    b_o: Array | None = None  # (d_out,)
    gate: Array | None = None  # (B, L, h·d_v) Qwen3-Next's sigmoid(x W_g + b_g)
    x_in: Array | None = None  # (B, L, d_model) what the residual adds
    residual: bool = False
    norm: LayerNorm | None = None


def head_setup(
    q: Array,
    *,
    scale: float,
    additive: Array | None = None,
    padded_queries: BoolArray | None = None,
    fully_masked_policy: FullyMaskedPolicy = "zero",
    variants: Variants | None = None,
    past: Past | None = None,
) -> Setup:
    """The setup of :data:`HEAD` for queries ``q (..., L, d_k)``: a decode step's (``past``)
    queries at positions P … P + L − 1 unless given, its new keys at the queries' positions
    (as :func:`service.core.attention.scaled_dot_product_attention` runs it and the backward
    replays it)."""
    var = variants or Variants()
    if past is not None:
        if var.positions is None:
            var = replace(var, positions=np.arange(past.length, past.length + q.shape[-2]))
        var = replace(var, context_positions=var.positions)  # the new keys are these tokens
    return Setup(var, scale, additive, padded_queries, fully_masked_policy, past)


@dataclass
class State:
    """The intermediates made so far, by name in the order made, and the name of each slot's
    latest form (``state["q"]``: the queries as the next step reads them)."""

    made: dict[str, Array]
    latest: dict[Slot, str]
    fully_masked_rows: BoolArray | None = None  # (..., L) set by the softmax

    def __getitem__(self, slot: Slot) -> Array:
        return self.made[self.latest[slot]]


def start(q: Array, k: Array, v: Array) -> State:
    """The state before the first step: the projections, each its own slot's first form."""
    return State({"q": q, "k": k, "v": v}, {"q": "q", "k": "k", "v": "v"})


Run = Callable[[Array, State, Setup], Array]  # (what the step reads, the state, the setup)
Grads = dict[str, Array]
Back = Callable[[Array, Array, State, Setup], Grads]
"""A step's backward rule: (the gradient of what it made, what it read, the state after the
forward, the setup) → the gradients of what it read, by slot (its own slot's previous form; the
scores also ``k``, the output also ``v``: those slots' latest forms), and of what else it read
by the full name the answer gives them (``grad_sinks``, ``grad_q_norm_weight``, ``grad_past_k``,
``grad_w_o``…; the softmax's ``row_dot``)."""
Trial = Mapping[str, Run]  # a step's name → the computation put in its place
NONE: Trial = MappingProxyType({})


def _always(s: Setup) -> bool:
    return True


@dataclass(frozen=True)
class Step:
    """One step: the intermediate it makes (``name``), what it does (``kind``: ``rotate`` for
    RoPE on the queries and on the keys alike, ``clip``, ``norm``, ``scale``, ``softmax``, …:
    what a mistake or an explanation of a cell is written for), the slot it reads and advances
    (``reads``; ``into`` when it makes another slot's first form, as the scores from the
    queries), how (``run``) and when (``on``); ``symbol``: how formulas write a form of the
    queries, keys or values it makes (Q_r for the rotated queries); ``also``: what else it
    keeps in the state (the position bias it added, the sinks' share)."""

    name: str
    kind: str
    reads: Slot
    run: Run
    on: Callable[[Setup], bool] = _always
    into: Slot | None = None
    symbol: str | None = None
    also: tuple[str, ...] = ()
    back: Back | None = None  # its backward rule, written beside run
    advances: Slot = field(init=False)  # into, else reads: the slot whose latest form it makes

    def __post_init__(self) -> None:
        object.__setattr__(self, "advances", self.reads if self.into is None else self.into)


# ---- the queries, keys and values -------------------------------------------------------


def _positions(st: State, s: Setup) -> IntArray:
    """The queries' positions: as given, else 0 … L − 1."""
    given = s.variants.positions
    return np.arange(st.made["q"].shape[-2]) if given is None else given  # (L,)


def _clipped(x: Array, st: State, s: Setup) -> Array:
    assert s.variants.clip_qkv is not None
    return clip(x, s.variants.clip_qkv)  # (..., n, ·)  OLMo: each projection clamped


def _clipping(s: Setup) -> bool:
    return s.variants.clip_qkv is not None


def _clipped_back(side: Slot) -> Back:
    """0 where the projection was clamped, the gradient as it is elsewhere (torch.clamp's)."""

    def back(g: Array, x: Array, st: State, s: Setup) -> Grads:
        assert s.variants.clip_qkv is not None
        return {side: clip_backward(g, x, s.variants.clip_qkv)}

    return back


def _normed(side: Literal["q", "k"]) -> Run:
    def run(x: Array, st: State, s: Setup) -> Array:
        settings = s.variants.q_norm if side == "q" else s.variants.k_norm
        assert settings is not None
        # (..., h, n, d_k): per vector (Zhang & Sennrich 2019), or over all heads of a token
        # (OLMo 2's projection-wide norm): the keys come repeated to the h query heads, which
        # leaves a mean over heads as it was, and qk_norm repeats a key weight per head alike
        return qk_norm(x, settings)

    return run


def _normed_back(side: Literal["q", "k"]) -> Back:
    """The norm's backward (:func:`service.core.variants.qk_norm_backward`), its weight's and
    bias's gradients named ``grad_q_norm_weight`` … (per query head's copy of a key weight
    summed back to the weight given)."""

    def back(g: Array, x: Array, st: State, s: Setup) -> Grads:
        settings = s.variants.q_norm if side == "q" else s.variants.k_norm
        assert settings is not None
        return _norm_grads(side, qk_norm_backward(x, settings, g))

    return back


def _norm_grads(side: Slot, grads: NormGrad) -> Grads:
    out: Grads = {side: grads.x}
    if grads.weight is not None:
        out[f"grad_{side}_norm_weight"] = grads.weight
    if grads.bias is not None:
        out[f"grad_{side}_norm_bias"] = grads.bias
    return out


def _rotated_q(x: Array, st: State, s: Setup) -> Array:
    assert s.variants.rope is not None
    at = _positions(st, s)  # (L,)
    return rope(x, at, s.variants.rope, sequence_length(at))  # (..., L, d_k)


def _rotated_q_back(g: Array, x: Array, st: State, s: Setup) -> Grads:
    """Turned back by −θ (the rotation's transpose), times the attention factor."""
    assert s.variants.rope is not None
    at = _positions(st, s)  # (L,)
    return {"q": rope_backward(g, at, s.variants.rope, sequence_length(at))}


def _rotated_k(x: Array, st: State, s: Setup) -> Array:
    """The keys at ``context_positions`` (0 … S − 1 unless given); the scalings that depend on
    the length take the queries'."""
    assert s.variants.rope is not None
    given = s.variants.context_positions
    at = np.arange(x.shape[-2]) if given is None else given  # (S,)
    return rope(x, at, s.variants.rope, sequence_length(_positions(st, s)))  # (..., S, d_k)


def _rotated_k_back(g: Array, x: Array, st: State, s: Setup) -> Grads:
    assert s.variants.rope is not None
    given = s.variants.context_positions
    at = np.arange(x.shape[-2]) if given is None else given  # (S,)
    length = sequence_length(_positions(st, s))
    return {"k": rope_backward(g, at, s.variants.rope, length)}


def _tempered(x: Array, st: State, s: Setup) -> Array:
    assert s.variants.temperature is not None
    return x * temperature(_positions(st, s), s.variants.temperature)[:, None]  # (..., L, d_k)


def _tempered_back(g: Array, x: Array, st: State, s: Setup) -> Grads:
    assert s.variants.temperature is not None
    return {"q": g * temperature(_positions(st, s), s.variants.temperature)[:, None]}


def _v_normed(x: Array, st: State, s: Setup) -> Array:
    assert s.variants.v_norm is not None
    return qk_norm(x, s.variants.v_norm)  # (..., S, d_v)


def _v_normed_back(g: Array, x: Array, st: State, s: Setup) -> Grads:
    assert s.variants.v_norm is not None
    return _norm_grads("v", qk_norm_backward(x, s.variants.v_norm, g))


def _cached(side: Literal["k", "v"]) -> Run:
    """The cache as transformers updates it: the new keys (values) normed and rotated, then
    appended to the P cached ones."""

    def run(x: Array, st: State, s: Setup) -> Array:
        assert s.past is not None
        return np.concatenate([s.past.k if side == "k" else s.past.v, x], axis=-2)  # (..., P+L, ·)

    return run


def _cached_back(side: Literal["k", "v"]) -> Back:
    """The new tokens' part of the gradient to the step before; the cache's as
    ``grad_past_k`` (``grad_past_v``)."""

    def back(g: Array, x: Array, st: State, s: Setup) -> Grads:
        assert s.past is not None
        p = s.past.length
        return {side: g[..., p:, :], f"grad_past_{side}": g[..., :p, :]}

    return back


def _caching(s: Setup) -> bool:
    return s.past is not None


def _capping(s: Setup) -> bool:
    return s.variants.softcap is not None


def _biasing(s: Setup) -> bool:
    return s.variants.position_bias is not None


def _masking(s: Setup) -> bool:
    return s.additive is not None


def _gating(s: Setup) -> bool:
    return s.gate is not None


def _adding(s: Setup) -> bool:
    return s.residual


def _layer_norming(s: Setup) -> bool:
    return s.norm is not None


def _rotating(s: Setup) -> bool:
    return s.variants.rope is not None


def _tempering(s: Setup) -> bool:
    return s.variants.temperature is not None


def _v_norming(s: Setup) -> bool:
    return s.variants.v_norm is not None


def _qk_norm_before(s: Setup) -> bool:
    n = s.variants.q_norm
    return n is not None and s.variants.k_norm is not None and not n.after_rope


def _qk_norm_after(s: Setup) -> bool:
    n = s.variants.q_norm
    return n is not None and s.variants.k_norm is not None and n.after_rope


# ---- the scores --------------------------------------------------------------------------


def _scores(q: Array, st: State, s: Setup) -> Array:
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused when scaled
        return q @ transposed(st["k"])  # (..., L, S)


def _scores_back(g: Array, q: Array, st: State, s: Setup) -> Grads:
    """dQ = dS K, dK = dSᵀ Q, with Q and K the forms the scores read."""
    return {"q": g @ st["k"], "k": transposed(g) @ q}  # (..., L, d_k), (..., S, d_k)


def _scaled(scores: Array, st: State, s: Setup) -> Array:
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        scaled = scores * s.scale  # (..., L, S)
    if s.refuse:
        require_finite(scaled, "the scaled scores Q Kᵀ · scale")  # −∞ must not pass for a mask
    return scaled


def _scaled_back(g: Array, scores: Array, st: State, s: Setup) -> Grads:
    return {"scores": g * s.scale}


def _capped(scores: Array, st: State, s: Setup) -> Array:
    assert s.variants.softcap is not None
    return softcap(scores, s.variants.softcap)  # (..., L, S)


def _capped_back(g: Array, scores: Array, st: State, s: Setup) -> Grads:
    assert s.variants.softcap is not None
    return {"scores": softcap_backward(g, scores, s.variants.softcap)}


def _biased(scores: Array, st: State, s: Setup) -> Array:
    """The scores so far plus the position bias (kept as ``position_bias``)."""
    assert s.variants.position_bias is not None
    bias = st.made["position_bias"] = np.broadcast_to(s.variants.position_bias, scores.shape)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        biased = scores + bias  # (..., L, S)
    if s.refuse:
        require_finite(biased, "the scores plus the position bias")
    return biased


def _biased_back(g: Array, scores: Array, st: State, s: Setup) -> Grads:
    """The gradient passes to the scores; the bias's, summed to the shape it was given."""
    assert s.variants.position_bias is not None
    return {"scores": g, "grad_position_bias": _summed_to(g, np.shape(s.variants.position_bias))}


def _summed_to(g: Array, shape: tuple[int, ...]) -> Array:
    """``g`` summed over the axes an array of ``shape`` was broadcast along to reach g's."""
    lead = g.ndim - len(shape)
    summed = g.sum(axis=tuple(range(lead))) if lead else g
    along = tuple(i for i, n in enumerate(shape) if n == 1 and summed.shape[i] != 1)
    return summed.sum(axis=along, keepdims=True) if along else summed


def _masked(scores: Array, st: State, s: Setup) -> Array:
    """The scores so far + M, refusing sums that overflow (finite + finite reaching ±∞)."""
    assert s.additive is not None
    with np.errstate(over="ignore", invalid="ignore"):
        masked = scores + s.additive  # (..., L, S)
    if s.refuse and not (np.isfinite(masked) | np.isneginf(s.additive)).all():
        raise AttentionInputError(
            "the masked scores (scaled scores plus the additive mask) overflowed float64; "
            "use smaller additive values or inputs"
        )
    return masked


def _masked_back(g: Array, scores: Array, st: State, s: Setup) -> Grads:
    """M is a constant: the gradient passes (a masked cell's is 0 already, its weight being 0)."""
    return {"scores": g}


# ---- the weights and the output -----------------------------------------------------------


def _weights(logits: Array, st: State, s: Setup) -> Array:
    """The row softmax; with sinks, one more key with no value (its share kept as
    ``sink_weights``), and a row with every key masked gives the sink all its weight whatever
    the policy says (flagged all the same: the flags describe the mask). Without sinks, rows
    where every key is masked get 0, 1/S or raise :class:`FullyMaskedRowsError`; padded query
    rows get 0 and never count as such."""
    sinks, padded = s.variants.sinks, s.padded_queries
    if sinks is not None:  # fully masked rows go to the sink: no policy applies
        sunk = softmax_with_sink(logits, sinks)
        weights, empty = sunk.weights, sunk.fully_masked_rows  # (..., L, S), (..., L)
    else:
        weights, empty = softmax_rows(
            logits, "uniform" if s.fully_masked_policy == "uniform" else "zero"
        )
    if padded is not None:
        empty &= ~padded
    st.fully_masked_rows = empty
    if sinks is None and s.fully_masked_policy == "error" and empty.any():
        raise FullyMaskedRowsError(rows_by_item(empty))
    if padded is not None and padded.any():
        weights[np.broadcast_to(padded[..., None], weights.shape)] = 0.0
    if sinks is not None:  # a padded row attends to nothing, the sink included
        sunk_weights = sunk.sink_weights  # (..., L)
        if padded is not None and padded.any():
            sunk_weights = np.where(padded, 0.0, sunk_weights)
        st.made["sink_weights"] = sunk_weights
    return weights


def _weights_back(g: Array, logits: Array, st: State, s: Setup) -> Grads:
    """The softmax's backward from dP: D = rowsum(P ∘ dP) (``row_dot``), dS = P ∘ (dP − D),
    0 on rows the ``uniform`` policy filled (their weights do not depend on the scores); a
    sink's logit gets −Σ P_sink·D over its rows (it has no value: its dP is 0)."""
    p = st.made["weights"]  # (..., L, S)
    row_dot = np.sum(p * g, axis=-1)  # (..., L)  D
    ds = p * (g - row_dot[..., None])  # (..., L, S)
    sinks = s.variants.sinks
    if sinks is None and s.fully_masked_policy == "uniform" and st.fully_masked_rows is not None:
        filled = np.broadcast_to(st.fully_masked_rows, row_dot.shape)
        ds[filled] = 0.0
    out: Grads = {"scores": ds, "row_dot": row_dot}
    if sinks is not None:
        share = -st.made["sink_weights"] * row_dot  # (..., L)
        per_head = np.ndim(sinks) == 1  # (h,): one per head, scores (..., h, L, S)
        out["grad_sinks"] = (
            np.moveaxis(share, -2, 0).reshape(share.shape[-2], -1).sum(axis=1)
            if per_head
            else np.asarray(share.sum())
        )
    return out


def _output(weights: Array, st: State, s: Setup) -> Array:
    v = st["v"]  # (..., S, d_v): the values as the last step left them
    if s.refuse:
        require_finite(v, "V")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        output = weights @ v  # (..., L, d_v)
    if s.refuse:
        require_finite(output, "the output (weights V)")
    return output


def _output_back(g: Array, weights: Array, st: State, s: Setup) -> Grads:
    """dP = dO Vᵀ, dV = Pᵀ dO."""
    return {"weights": g @ transposed(st["v"]), "v": transposed(weights) @ g}


# ---- the block around the heads -------------------------------------------------------------


def _concat(out: Array, st: State, s: Setup) -> Array:
    return merge_heads(out)  # (B, h, L, d_v) -> (B, L, h·d_v)


def _concat_back(g: Array, out: Array, st: State, s: Setup) -> Grads:
    return {"out": split_heads(g, out.shape[1])}  # (B, L, h·d_v) -> (B, h, L, d_v)


def _gated(x: Array, st: State, s: Setup) -> Array:
    assert s.gate is not None
    return x * s.gate  # (B, L, h·d_v)  Qwen3-Next: attn_output * sigmoid(gate)


def _gated_back(g: Array, x: Array, st: State, s: Setup) -> Grads:
    assert s.gate is not None
    return {"block": g * s.gate, "grad_gate": g * x}


def _projected(x: Array, st: State, s: Setup) -> Array:
    """The concatenated (or gated) heads times W_o (the identity when there is none), plus b_o."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        projected = x if s.w_o is None else x @ s.w_o  # (B, L, d_out)
        if s.b_o is not None:
            projected = projected + s.b_o
    if s.refuse:
        require_finite(projected, "the projected heads (concat W_o)")
    return projected


def _projected_back(g: Array, x: Array, st: State, s: Setup) -> Grads:
    """dX = dY W_oᵀ, dW_o = Xᵀ dY and db_o = Σ dY over batch items and tokens."""
    if s.w_o is None:
        out: Grads = {"block": g}
    else:
        grads = project_backward(x, s.w_o, g)
        out = {"block": grads.x, "grad_w_o": grads.w}
    if s.b_o is not None:
        out["grad_b_o"] = g.reshape(-1, g.shape[-1]).sum(axis=0)
    return out


def _residual(x: Array, st: State, s: Setup) -> Array:
    assert s.x_in is not None, "the residual needs the block's input"
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        res = s.x_in + x  # (B, L, d_model)
    if s.refuse:
        require_finite(res, "the residual x + projected")
    return res


def _residual_back(g: Array, x: Array, st: State, s: Setup) -> Grads:
    return {"block": g, "grad_x_in": g}


def _normed_block(x: Array, st: State, s: Setup) -> Array:
    assert s.norm is not None
    return layer_norm(x, s.norm)  # (B, L, d_out)


def _normed_block_back(g: Array, x: Array, st: State, s: Setup) -> Grads:
    assert s.norm is not None
    dx, gamma, beta = layer_norm_backward(x, s.norm, g)
    out: Grads = {"block": dx}
    if gamma is not None:
        out["grad_ln_gamma"] = gamma
    if beta is not None:
        out["grad_ln_beta"] = beta
    return out


_BIAS, _SINK = ("position_bias",), ("sink_weights",)  # what the bias and the softmax keep besides
_Q, _K, _V = _clipped_back("q"), _clipped_back("k"), _clipped_back("v")
_QN, _KN, _PK, _PV = _normed_back("q"), _normed_back("k"), _cached_back("k"), _cached_back("v")
HEAD: tuple[Step, ...] = (
    Step("q_clipped", "clip", reads="q", symbol="Q_c", run=_clipped, on=_clipping, back=_Q),
    Step("k_clipped", "clip", reads="k", symbol="K_c", run=_clipped, on=_clipping, back=_K),
    Step("v_clipped", "clip", reads="v", symbol="V_c", run=_clipped, on=_clipping, back=_V),
    Step("q_normed", "norm", reads="q", symbol="Q_n", run=_normed("q"), on=_qk_norm_before,
         back=_QN),
    Step("k_normed", "norm", reads="k", symbol="K_n", run=_normed("k"), on=_qk_norm_before,
         back=_KN),
    Step("q_rotated", "rotate", reads="q", symbol="Q_r", run=_rotated_q, on=_rotating,
         back=_rotated_q_back),
    Step("k_rotated", "rotate", reads="k", symbol="K_r", run=_rotated_k, on=_rotating,
         back=_rotated_k_back),
    Step("q_normed", "norm", reads="q", symbol="Q_n", run=_normed("q"), on=_qk_norm_after,
         back=_QN),
    Step("k_normed", "norm", reads="k", symbol="K_n", run=_normed("k"), on=_qk_norm_after,
         back=_KN),
    Step("q_tempered", "temper", reads="q", symbol="Q_t", run=_tempered, on=_tempering,
         back=_tempered_back),
    Step("v_normed", "norm", reads="v", symbol="V_n", run=_v_normed, on=_v_norming,
         back=_v_normed_back),
    Step("present_k", "cache", reads="k", run=_cached("k"), on=_caching, back=_PK),
    Step("present_v", "cache", reads="v", run=_cached("v"), on=_caching, back=_PV),
    Step("scores", "scores", reads="q", into="scores", run=_scores, back=_scores_back),
    Step("scaled_scores", "scale", reads="scores", run=_scaled, back=_scaled_back),
    Step("capped_scores", "softcap", reads="scores", run=_capped, on=_capping,
         back=_capped_back),
    Step("biased_scores", "bias", reads="scores", run=_biased, on=_biasing, also=_BIAS,
         back=_biased_back),
    Step("masked_scores", "mask", reads="scores", run=_masked, on=_masking, back=_masked_back),
    Step("weights", "softmax", reads="scores", into="weights", run=_weights, also=_SINK,
         back=_weights_back),
    Step("output", "output", reads="weights", into="out", run=_output, back=_output_back),
)  # fmt: skip
BLOCK: tuple[Step, ...] = (
    Step("concat", "concat", reads="out", into="block", run=_concat, back=_concat_back),
    Step("gated", "gated", reads="block", run=_gated, on=_gating, back=_gated_back),
    Step("projected", "project", reads="block", run=_projected, back=_projected_back),
    Step("residual", "residual", reads="block", run=_residual, on=_adding, back=_residual_back),
    Step("layer_norm", "layer_norm", reads="block", run=_normed_block, on=_layer_norming,
         back=_normed_block_back),
)  # fmt: skip
"""The block after the heads (Vaswani et al. 2017, §3.2.2; the gate of Qwen3-Next): the heads'
outputs side by side, gated, times W_o, plus the block's input, layer-normed."""


def run(
    steps: Sequence[Step],
    state: State,
    setup: Setup,
    trial: Trial = NONE,
    start: int = 0,
    stop: int | None = None,
) -> State:
    """``state`` with ``steps[start:stop]`` that are on under ``setup`` run in order, each
    reading its slot's latest form and advancing it; a step named in ``trial`` runs the
    computation given there instead."""
    made, latest = state.made, state.latest
    for step in steps[start:stop] if start or stop is not None else steps:
        if step.on(setup):
            compute = trial.get(step.name, step.run) if trial else step.run
            made[step.name] = compute(made[latest[step.reads]], state, setup)
            latest[step.advances] = step.name
    return state


def made(steps: Sequence[Step], setup: Setup) -> tuple[str, ...]:
    """The names the steps that are on under ``setup`` make, in order, after the projections
    (``q``, ``k``, ``v``): the ``present`` :func:`made_from` reads."""
    return ("q", "k", "v", *(step.name for step in steps if step.on(setup)))


# the variants asked last (weakly: their arrays are the request's), a mask or not, a cache or
# not, their names
_made: list[tuple[ref[Variants], bool, bool, tuple[str, ...]]] = []
_NO_PAST = Past(np.zeros((0, 0)), np.zeros((0, 0)))  # a cache's presence, for made_with


def made_with(variants: Variants, masked: bool = False, cached: bool = False) -> tuple[str, ...]:
    """:func:`made` of :data:`HEAD` with ``variants`` (a mask or not, a cache or not), kept for
    the two asked last: an answer asks several times, and made costs ~2 µs where a small
    answer takes ~110 µs."""
    for asked, mask, cache, names in _made:
        if asked() is variants and (mask, cache) == (masked, cached):  # frozen: the same names
            return names
    past = _NO_PAST if cached else None
    names = made(HEAD, Setup(variants, additive=np.zeros(()) if masked else None, past=past))
    _made[:] = [*_made[-1:], (ref(variants), masked, cached, names)]
    return names


CACHED: tuple[str, ...] = tuple(
    name
    for name in made(HEAD, Setup(Variants(), past=_NO_PAST))
    if name not in made(HEAD, Setup(Variants()))
)  # the steps a decode step's cache adds: the keys and values after it
_PROJECTIONS: dict[str, Slot] = {"q": "q", "k": "k", "v": "v"}
SYMBOLS: dict[str, str] = {"q": "Q", "k": "K", "v": "V"} | {
    step.name: step.symbol for step in HEAD if step.symbol is not None
}  # each form of the queries, keys and values as formulas write it
_ADVANCES: dict[str, Slot] = _PROJECTIONS | {step.name: step.advances for step in HEAD + BLOCK}
READS: dict[str, Slot] = {step.name: step.reads for step in HEAD + BLOCK}  # each step's slot
ORDER: tuple[str, ...] = tuple(dict.fromkeys(("q", "k", "v", *(s.name for s in HEAD))))
NAMES: frozenset[str] = frozenset(ORDER).union(*(s.also for s in HEAD))  # all a head keeps


def slot_of(name: str) -> Slot | None:
    """The slot the step ``name`` advances (None for a name the head's chain does not make)."""
    return _ADVANCES.get(name)


@lru_cache(maxsize=1024)  # a few chains, asked several times by every answer
def made_from(name: str, present: tuple[str, ...], slot: Slot | None = None) -> str:
    """The name the step ``name`` read from its slot (or from ``slot``: the keys the scores
    read), given the names ``present`` in the order they were made (:func:`made`): the latest
    form of that slot made before it, or the latest of all when ``name`` was not made (what it
    would read)."""
    wanted = READS[name] if slot is None else slot
    before = present[: present.index(name)] if name in present else present
    return next(n for n in reversed(before) if _ADVANCES.get(n) == wanted)
