"""The words of a response: each step with its formula and shape, and the conventions used.
Shapes come from the outputs table (:func:`service.trace.outputs.step_shape`)."""

from typing import Any

import numpy as np

from service.core.positions import Alibi, LinearScaling, RelativeBias, Rope, alibi_slopes
from service.core.types import Array
from service.core.variants import QKNorm
from service.trace.outputs import step_shape
from service.trace.plan import AttentionPlan, MultiheadPlan, Plan
from service.trace.rules import Shapes

Step = dict[str, Any]


def _step(shapes: Shapes, name: str, formula: str) -> Step:
    return {"name": name, "formula": formula, "shape": step_shape(shapes, name)}


def conventions(plan: Plan) -> dict[str, str]:
    """The conventions this answer was computed with (echoed in every response)."""
    return {
        "weight_layout": plan.weight_layout,
        "generated_weight_layout": "in_out",
        "scale": "1/sqrt(d_k)" if plan.scale is None else "given",
        "boolean_masks": "true = may attend",
        "causal_alignment": plan.alignment,
        "fully_masked_rows": plan.fully_masked_rows,
        "softmax": "row-wise over keys, max-subtracted",
        "json_non_finite": "null (a masked score is −∞)",
    }


def _generation(plan: Plan) -> list[Step]:
    """One step per drawn array: all come from one RandomState, one after the other."""
    sample = "rand" if plan.init == "uniform" else "randn"
    steps, before = [], ""
    for name, a in plan.generated.items():
        draw = f"RandomState({plan.seed}).{sample}({', '.join(map(str, a.shape))})"
        formula = f"{name} = {draw}" + (
            f", drawn after {before} from the same state" if before else ""
        )
        steps.append({"name": f"generate {name}", "formula": formula, "shape": list(a.shape)})
        before = name
    return steps


def _numbers(a: Array, limit: int = 8) -> str:
    """A short list of numbers for a formula: [0.25, 0.0625, …] (at most ``limit``)."""
    shown = ", ".join(f"{v:.6g}" for v in a.ravel()[:limit])
    return f"[{shown}{', …' if a.size > limit else ''}]"


def _qk_norm(n: QKNorm, x: str) -> str:
    w = "w" if n.weight is not None else "1"
    if n.type == "rms":
        return f"{x} / √(mean({x}²) + {n.eps:g}) · {w}, each vector over its d_k features (RMSNorm)"
    return (
        f"({x} − mean) / √(var + {n.eps:g}) · {w}, each vector over its d_k features (biased var)"
    )


def _rope(r: Rope, d_k: int, x: str, at: str) -> str:
    dim = d_k if r.rotary_dim is None else r.rotary_dim
    pairs = "(i, i + r/2)" if r.style == "half" else "(2i, 2i + 1)"
    rest = (
        ""
        if dim == d_k
        else f"; feature {dim} passes unchanged"
        if dim == d_k - 1
        else f"; features {dim}…{d_k - 1} pass unchanged"
    )
    scaling = ""
    if isinstance(r.scaling, LinearScaling):
        scaling = f"; positions divided by {r.scaling.factor:g} (linear scaling)"
    elif r.scaling is not None:
        sc = r.scaling
        scaling = (
            f"; θ_i rescaled as LLaMA 3.1 (factor {sc.factor:g}, low_freq_factor "
            f"{sc.low_freq_factor:g}, high_freq_factor {sc.high_freq_factor:g}, "
            f"original_max_position {sc.original_max_position})"
        )
    return (
        f"RoPE({x}): feature pair {pairs} of the token at position p turns by p·θ_i, "
        f"θ_i = {r.base:g}^(−2i/r), r = {dim}, {r.style} style{rest}{scaling}; positions {at}"
    )


def _at(given: bool, n: str) -> str:
    return "as given" if given else f"0…{n}−1"


def _bias(plan: Plan) -> str:
    bias, h = plan.bias, plan.shapes.num_heads
    if isinstance(bias, Alibi):
        slopes = alibi_slopes(h) if bias.slopes is None else bias.slopes
        rule = (
            "given"
            if bias.slopes is not None
            else "2^(−8h/n)"
            if h & (h - 1) == 0
            else "the paper's rule for n not a power of two"
        )
        distance = "−slope · |p'_j − p_i|" if bias.symmetric else "slope · (p'_j − p_i)"
        return f"ALiBi: {distance}, slopes ({rule}) {_numbers(slopes)}"
    assert isinstance(bias, RelativeBias)
    kind = "bidirectional" if bias.bidirectional else "unidirectional"
    return (
        f"T5 relative bias: table[bucket(p'_j − p_i)][head], {bias.table.shape[0]} buckets "
        f"({kind}), distances ≥ {bias.max_distance} share the last"
    )


def _attention(plan: Plan, scale: float) -> list[Step]:
    """qk_norm … output: the steps of scaled dot-product attention with its variants, in the
    contract's order (per head on /multihead)."""
    s, v = plan.shapes, plan.variants
    q, k = "Q", "K"
    steps = []
    if v.q_norm is not None and v.k_norm is not None:
        steps += [
            _step(s, "q_normed", "Q_n = " + _qk_norm(v.q_norm, "Q")),
            _step(s, "k_normed", "K_n = " + _qk_norm(v.k_norm, "K")),
        ]
        q, k = "Q_n", "K_n"
    if v.rope is not None:
        given_q, given_k = v.positions is not None, v.context_positions is not None
        steps += [
            _step(s, "q_rotated", f"Q_r = {_rope(v.rope, s.d_k, q, _at(given_q, 'L'))}"),
            _step(s, "k_rotated", f"K_r = {_rope(v.rope, s.d_k, k, _at(given_k, 'S'))}"),
        ]
        q, k = "Q_r", "K_r"
    given = f"scale = {scale:.10g} (given)"
    default = f"scale = 1/√d_k = 1/√{s.d_k} = {scale:.10g}"
    steps += [
        _step(s, "scores", f"{q} {k}ᵀ"),
        _step(
            s, "scaled_scores", f"{q} {k}ᵀ · scale, " + (default if plan.scale is None else given)
        ),
    ]
    so_far = "scaled_scores"
    if v.softcap is not None:
        steps.append(_step(s, "capped_scores", f"c · tanh(scaled_scores / c), c = {v.softcap:g}"))
        so_far = "capped_scores"
    if plan.bias is not None:
        steps += [
            _step(s, "position_bias", _bias(plan)),
            _step(s, "biased_scores", f"{so_far} + position_bias"),
        ]
        so_far = "biased_scores"
    if s.masked:
        steps.append(
            _step(s, "masked_scores", f"{so_far} + M, M = 0 where a query may attend, −∞ "
                  "(null) where masked, plus any additive mask values")
        )  # fmt: skip
        so_far = "masked_scores"
    if v.sinks is not None:
        sink = (
            f"{float(v.sinks):g}"
            if isinstance(v.sinks, float)
            else f"sinks {_numbers(np.asarray(v.sinks))} by head"
        )
        steps += [
            _step(
                s,
                "sink_weights",
                f"exp(sink − m) / (Σ_j exp(s_j − m) + exp(sink − m)), s = {so_far}, m = max(max_j s_j, sink), sink = {sink}: the sink joins each row's softmax as a key with no value",
            ),
            _step(
                s,
                "weights",
                "exp(s_j − m) / (Σ_k exp(s_k − m) + exp(sink − m)) over keys: each row sums to 1 − sink_weights",
            ),
        ]
    else:
        steps.append(
            _step(s, "weights", f"softmax of {so_far} over keys: exp(s − max(s)) / Σ exp(s − max(s)), row by row")
        )  # fmt: skip
    return [*steps, _step(s, "output", "weights V")]


def attention_steps(plan: AttentionPlan, scale: float) -> list[Step]:
    """Every step of /attention and /mask, in order."""
    steps = _generation(plan)
    if plan.projections is not None:
        source = "X" if plan.context is None else "C"
        for name, inp in (("q", "X"), ("k", source), ("v", source)):
            t = "ᵀ" if plan.weight_layout == "out_in" and f"w_{name}" not in plan.generated else ""
            bias = f" + b_{name}" if getattr(plan.projections, f"b_{name}") is not None else ""
            steps.append(_step(plan.shapes, name, f"{name.upper()} = {inp} W_{name}{t}{bias}"))
    return steps + _attention(plan, scale)


def multihead_steps(plan: MultiheadPlan, scale: float) -> list[Step]:
    """Every step of /multihead, in order."""
    s = plan.shapes
    h, h_kv = s.num_heads, s.num_kv_heads
    steps = _generation(plan)
    x = "X"
    if plan.positional is not None:
        x = "X_in"
        kind = "P (given)" if plan.positional_given else "sinusoidal PE (Vaswani et al. 2017)"
        steps.append(_step(s, "x_in", f"X_in = X + {kind}"))
    source = x if plan.context is None else "C"
    gqa = f", key/value head ⌊i·{h_kv}/{h}⌋ serves query head i" if h_kv != h else ""
    w = plan.weights

    def heads(n: int) -> str:
        return "1 head" if n == 1 else f"{n} heads"

    def bias(name: str) -> str:
        return f" + b_{name}" if getattr(w, f"b_{name}") is not None else ""

    if w is not None:
        steps += [
            _step(
                s, "q", f"Q = {x} W_q{bias('q')}, split into {heads(h)} of d_k = {s.d_k} columns"
            ),
            _step(s, "k", f"K = {source} W_k{bias('k')}, split into {heads(h_kv)}{gqa}"),
            _step(s, "v", f"V = {source} W_v{bias('v')}, split into {heads(h_kv)}{gqa}"),
        ]
    elif h_kv != h:  # q, k, v given per head
        steps.append(_step(s, "k", f"K and V as given, {heads(h_kv)}{gqa}"))
    steps += _attention(plan, scale)
    projected = ("Concat W_o" if plan.w_o is not None else "Concat (W_o = identity)") + (
        " + b_o" if plan.b_o is not None else ""
    )
    steps += [
        _step(s, "average_weights", "mean of the heads' weights"),
        _step(s, "concat", "Concat(head_1, …, head_h)"),
        _step(s, "projected", projected),
    ]
    if plan.residual:
        steps.append(_step(s, "residual", f"{x} + projected"))
    if plan.norm is not None:
        over = (
            "each token's features"
            if plan.norm.over == "features"
            else "all numbers of the sequence"
        )
        steps.append(
            _step(s, "layer_norm", f"(z − mean) / √(var + {plan.norm.eps:g}) · γ + β, mean and biased var over {over}")
        )  # fmt: skip
    return steps
