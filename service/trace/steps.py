"""The words of a response: each step with its formula and shape, and the conventions used.
Shapes come from the outputs table (:func:`service.trace.outputs.step_shape`)."""

from functools import lru_cache
from typing import Any

from service.core import chain
from service.trace.outputs import CHAIN, latest, step_order, step_shape
from service.trace.plan import AttentionPlan, MultiheadPlan, Plan
from service.trace.rows.rope import symbol
from service.trace.rows.variants import VARIANTS
from service.trace.shapes import Endpoint, Shapes

Step = dict[str, Any]


def _step(shapes: Shapes, name: str, formula: str) -> Step:
    return {"name": name, "formula": formula, "shape": step_shape(shapes, name)}


def conventions(plan: Plan) -> dict[str, Any]:
    """The conventions this answer was computed with (echoed in every response), with where
    each field came from when a Hugging Face config gave some (``config``), and the config's
    keys judged not to change the layer (``config_keys``: nothing was skipped unjudged), and the
    fields it gave as the service read them (``config_fields``)."""
    taken = (
        {}
        if plan.config_taken is None
        else {
            "config": dict(plan.config_taken),
            "config_keys": list(plan.config_keys),
            "config_fields": dict(plan.config_fields or {}),
        }
    )
    return {
        "weight_layout": plan.weight_layout,
        "generated_weight_layout": "in_out",
        "scale": "1/sqrt(d_k)" if plan.scale is None else "given",
        "boolean_masks": "true = may attend",
        "causal_alignment": plan.alignment,
        "fully_masked_rows": plan.fully_masked_rows,
        "softmax": "row-wise over keys, max-subtracted",
        "json_non_finite": "null (a masked score is −∞)",
    } | taken


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


def _attention(plan: Plan, scale: float) -> dict[str, str]:
    """The formulas of scaled dot-product attention's steps with the variants that are on, by
    step name (per head on /multihead); a variant's formula replaces the plain one of the same
    step (the sinks' weights)."""
    s = plan.shapes
    q, k = symbol(s, plan.variants, "scores", "q"), symbol(s, plan.variants, "scores", "k")
    given = f"scale = {scale:.10g} (given)"
    default = f"scale = 1/√d_k = 1/√{s.d_k} = {scale:.10g}"
    if abs(scale * s.d_k**0.5 - 1.0) > 1e-12:  # not given, yet not 1/√d_k: MLA under YaRN
        default = (
            f"scale = 1/√d_k · mscale(factor, mscale_all_dim)² = {scale:.10g} (YaRN, as "
            "DeepseekV3Attention)"
        )
    formulas = {
        "scores": f"{q} {k}ᵀ",
        "scaled_scores": f"{q} {k}ᵀ · scale, " + (default if plan.scale is None else given),
        "weights": f"softmax of {latest(s, 'weights', CHAIN)} over keys: exp(s − max(s)) / "
        "Σ exp(s − max(s)), row by row",
        "output": f"weights {symbol(s, plan.variants, 'output', 'v')}",
    }
    if s.masked:
        formulas["masked_scores"] = (
            f"{latest(s, 'masked_scores', CHAIN)} + M, M = 0 where a query may attend, −∞ "
            "(null) where masked, plus any additive mask values"
        )
    for variant in VARIANTS:
        if variant.field in s.on:
            formulas |= variant.steps(plan.variants, plan.bias, s)
    if s.past_len:  # a decode step: the cache grows by the new tokens' keys and values
        p, n = s.past_len, s.seq_len
        k_new = symbol(s, plan.variants, "scores", "k")
        formulas |= {
            "present_k": f"[past.k | {k_new}]: the cache's {p} keys, then the {n} new tokens' "
            f"(positions {p}…{p + n - 1} unless given), as a Hugging Face cache stores them",
            "present_v": f"[past.v | {symbol(s, plan.variants, 'present_v', 'v')}]: the cache's {p} "
            f"values, then the {n} new",
            "scores": f"{q} present_kᵀ: the {n} new queries against all {p + n} keys",
            "masked_scores": formulas.get("masked_scores", "")
            + f"; a decode step is causal over the cache: query i (row {p} + i of the sequence) "
            f"sees keys j ≤ {p} + i",
        }
        formulas["output"] = "weights present_v"
    return formulas


def _in_order(plan: Plan, formulas: dict[str, str]) -> list[Step]:
    """The steps in the order of the outputs table (per-head rows for the heads' steps), the
    head's own in the order its chain made them (a norm after RoPE comes after it)."""
    order = _order(plan.shapes.endpoint, chain.made_with(plan.variants))
    ordered = sorted(formulas, key=order.__getitem__)
    return [_step(plan.shapes, name, formulas[name]) for name in ordered]


@lru_cache(maxsize=256)
def _order(endpoint: Endpoint, made: tuple[str, ...]) -> dict[str, int]:
    """Each step's place: the table's, the names the head's chain ``made``
    (:func:`service.core.chain.made`) taking the table's places of those names in their own
    order."""
    order = dict(step_order(endpoint))
    rows = [n for n in made if n in order]  # the steps this endpoint's table has
    return order | dict(zip(rows, sorted(order[n] for n in rows), strict=True))


def _online(plan: Plan, steps: list[Step]) -> list[Step]:
    """The steps with online_softmax's, one per block of keys, after the heads' output."""
    s = plan.shapes
    size = s.online_block
    if size is None:
        return steps
    lead = ([s.batch] if s.batch is not None else []) + (
        [s.num_heads] if s.endpoint == "multihead" else []
    )
    blocks = []
    for start in range(0, s.ctx_len, size):
        end = min(start + size, s.ctx_len)
        first = (
            "m = max_j s_j, ℓ = Σ_j exp(s_j − m), o = Σ_j exp(s_j − m) v_j / ℓ"
            if not start
            else (
                "m_new = max(m, max_j s_j), ℓ = ℓ·exp(m − m_new) + Σ_j exp(s_j − m_new), "
                "o = (o·ℓ·exp(m − m_new) + Σ_j exp(s_j − m_new) v_j) / ℓ_new"
            )
        )
        last = "; this is the last block: o = weights V" if end == s.ctx_len else ""
        blocks.append(
            {
                "name": f"online_softmax keys {start}…{end - 1}",
                "formula": f"FlashAttention's softmax over keys {start}…{end - 1}, each row: {first}{last}",
                "shape": [*lead, s.seq_len],
            }
        )
    at = next(i for i, step in enumerate(steps) if step["name"] == "output") + 1
    return steps[:at] + blocks + steps[at:]


def attention_steps(plan: AttentionPlan, scale: float) -> list[Step]:
    """Every step of /attention and /mask, in order."""
    formulas = _attention(plan, scale)
    if plan.projections is not None:
        source = "X" if plan.context is None else "C"
        for name, inp in (("q", "X"), ("k", source), ("v", source)):
            t = "ᵀ" if plan.weight_layout == "out_in" and f"w_{name}" not in plan.generated else ""
            bias = f" + b_{name}" if getattr(plan.projections, f"b_{name}") is not None else ""
            formulas[name] = f"{name.upper()} = {inp} W_{name}{t}{bias}"
    return _online(plan, _generation(plan) + _in_order(plan, formulas))


def multihead_steps(plan: MultiheadPlan, scale: float) -> list[Step]:
    """Every step of /multihead, in order."""
    s = plan.shapes
    h, h_kv = s.num_heads, s.num_kv_heads
    formulas = _attention(plan, scale)
    x = "X"
    if plan.positional is not None:
        x = "X_in"
        kind = "P (given)" if plan.positional_given else "sinusoidal PE (Vaswani et al. 2017)"
        formulas["x_in"] = f"X_in = X + {kind}"
    source = x if plan.context is None else "C"
    gqa = f", key/value head ⌊i·{h_kv}/{h}⌋ serves query head i" if h_kv != h else ""
    w = plan.weights

    def heads(n: int) -> str:
        return "1 head" if n == 1 else f"{n} heads"

    def bias(name: str) -> str:
        return f" + b_{name}" if getattr(w, f"b_{name}") is not None else ""

    if w is not None:
        formulas["q"] = f"Q = {x} W_q{bias('q')}, split into {heads(h)} of d_k = {s.d_k} columns"
        formulas["k"] = f"K = {source} W_k{bias('k')}, split into {heads(h_kv)}{gqa}"
        formulas["v"] = f"V = {source} W_v{bias('v')}, split into {heads(h_kv)}{gqa}"
        if "k_eq_v" in s.on:  # W_v is W_k (service.wire.fold)
            formulas["v"] = (
                f"V = K as projected, {source} W_k{bias('k')}, before any norm or RoPE (k_eq_v, Gemma 4)"
            )
    elif h_kv != h:  # q, k, v given per head
        formulas["k"] = f"K and V as given, {heads(h_kv)}{gqa}"
    heads_out = "(Concat · G)" if "gate" in s.on else "Concat"
    projected = (
        f"{heads_out} W_o" if plan.w_o is not None else f"{heads_out} (W_o = identity)"
    ) + (" + b_o" if plan.b_o is not None else "")
    formulas |= {
        "average_weights": "mean of the heads' weights",
        "concat": "Concat(head_1, …, head_h)",
        "projected": projected,
    }
    if plan.residual:
        formulas["residual"] = f"{x} + projected"
    if plan.norm is not None:
        over = (
            "each token's features"
            if plan.norm.over == "features"
            else "all numbers of the sequence"
        )
        formulas["layer_norm"] = (
            f"(z − mean) / √(var + {plan.norm.eps:g}) · γ + β, mean and biased var over {over}"
        )
    unpack = []
    if plan.unpack is not None:  # a fused projection read as W_q, W_k, W_v (service.wire.fused)
        formula, shape = plan.unpack
        unpack = [{"name": "unpack", "formula": formula, "shape": list(shape)}]
    return _online(plan, _generation(plan) + unpack + _in_order(plan, formulas))
