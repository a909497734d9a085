"""The words of a response: each step with its formula and shape, and the conventions used.
Shapes come from the outputs table (:func:`service.api.outputs.step_shape`)."""

from typing import Any

from service.api.outputs import step_shape
from service.api.plan import AttentionPlan, MultiheadPlan, Plan
from service.api.rules import Shapes

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


def _attention(plan: Plan, scale: float) -> list[Step]:
    """scores … output: the steps of scaled dot-product attention (per head on /multihead)."""
    s = plan.shapes
    given = f"scale = {scale:.10g} (given)"
    default = f"scale = 1/√d_k = 1/√{s.d_k} = {scale:.10g}"
    steps = [
        _step(s, "scores", "Q Kᵀ"),
        _step(s, "scaled_scores", "Q Kᵀ · scale, " + (default if plan.scale is None else given)),
    ]
    if s.masked:
        steps.append(
            _step(s, "masked_scores", "scaled_scores + M, M = 0 where a query may attend, −∞ "
                  "(null) where masked, plus any additive mask values")
        )  # fmt: skip
    return [
        *steps,
        _step(s, "weights", "softmax over keys: exp(s − max(s)) / Σ exp(s − max(s)), row by row"),
        _step(s, "output", "weights V"),
    ]


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

    steps += [
        _step(s, "q", f"Q = {x} W_q{bias('q')}, split into {heads(h)} of d_k = {s.d_k} columns"),
        _step(s, "k", f"K = {source} W_k{bias('k')}, split into {heads(h_kv)}{gqa}"),
        _step(s, "v", f"V = {source} W_v{bias('v')}, split into {heads(h_kv)}{gqa}"),
    ]
    steps += _attention(plan, scale)
    projected = ("Concat W_o" if w.w_o is not None else "Concat (W_o = identity)") + (
        " + b_o" if w.b_o is not None else ""
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
