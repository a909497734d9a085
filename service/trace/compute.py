"""Run a plan on the engine and hand the trace to the outputs table. ``check`` is called
between the large steps: it raises when the client has gone, so its work stops there."""

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

import numpy as np

from service.core import masks
from service.core.attention import AttentionTrace, project_qkv, scaled_dot_product_attention
from service.core.diagnosis.stages import Setup
from service.core.latent import LatentDims, latent_attention
from service.core.multihead import attend_heads, multihead_attention
from service.core.positions import position_bias
from service.core.softmax import rows_by_item
from service.core.types import Array
from service.core.variants import Variants
from service.trace import outputs, steps
from service.trace.comparison import compare, state_of
from service.trace.plan import AttentionPlan, MultiheadPlan, Plan
from service.trace.shapes import Shapes
from service.trace.summary import summary


def _combined_mask(plan: Plan) -> masks.CombinedMask | None:
    s = plan.shapes
    return (
        masks.combine(list(plan.mask_specs), s.batch or 1, s.seq_len, s.ctx_len)
        if s.masked
        else None
    )


def _variants(plan: Plan) -> Variants:
    """The plan's variants with the position bias computed: (h, L, S), h = 1 on /attention."""
    v = plan.variants
    if plan.bias is None:
        return v
    s = plan.shapes
    p = np.arange(s.seq_len) if v.positions is None else v.positions  # (L,)
    p_ctx = np.arange(s.ctx_len) if v.context_positions is None else v.context_positions  # (S,)
    bias = position_bias(plan.bias, s.num_heads, p, p_ctx)  # (h, L, S)
    return replace(v, position_bias=bias)


def _common(plan: Plan, trace: AttentionTrace, mask: masks.CombinedMask | None) -> dict[str, Any]:
    """The values both endpoints return besides their arrays."""
    s = plan.shapes
    values: dict[str, Any] = {
        "scale": trace.scale,
        "d_k": s.d_k,
        "d_v": s.d_v,
        "tokens": s.tokens,
        "context_tokens": s.context_tokens,
        "conventions": steps.conventions(plan),
        "warnings": list(s.warnings),
        **plan.generated,
    }
    if mask is not None:
        values |= {
            "mask": mask.allowed,
            "additive_mask": mask.additive,
            "fully_masked_rows": rows_by_item(trace.fully_masked_rows),  # per batch item
        }
    return values


def _arrays(trace: AttentionTrace) -> dict[str, Any]:
    """The trace's fields by name: the values of the table's head rows."""
    return {f.name: getattr(trace, f.name) for f in fields(trace)}


Check = Callable[[], None]


def run_attention(plan: AttentionPlan, check: Check) -> dict[str, Any]:
    """POST /attention and /mask: scaled dot-product attention with every intermediate."""
    if plan.projections is not None:
        assert plan.x is not None
        source = plan.x if plan.context is None else plan.context
        q, k, v = project_qkv(plan.x, source, plan.projections)  # (B, L, d_k), (B, S, ·)
    else:
        assert plan.q is not None and plan.k is not None and plan.v is not None
        q, k, v = plan.q, plan.k, plan.v
    check()
    mask = _combined_mask(plan)
    check()
    variants = _variants(plan)
    trace = scaled_dot_product_attention(
        q,
        k,
        v,
        scale=plan.scale,
        additive=None if mask is None else mask.additive,
        padded_queries=None if mask is None else mask.padded_queries,
        fully_masked_policy=plan.fully_masked_rows,
        variants=variants,
    )
    check()
    values = _common(plan, trace, mask) | {
        "summary": lambda: _summary(plan, trace.weights),
        "steps": lambda: steps.attention_steps(plan, trace.scale),
    }
    if plan.expected is not None:
        setup = _setup(
            plan, trace, variants, x_in=plan.x, context=plan.context, projections=plan.projections
        )
        values |= _compared(plan, _head_state(trace), mask, setup, check)
    return outputs.response(plan.shapes, plan.include, values, _arrays(trace))


def run_multihead(plan: MultiheadPlan, check: Check) -> dict[str, Any]:
    """POST /multihead: multi-head attention, per-head traces and the block around them."""
    s = plan.shapes
    mask = _combined_mask(plan)
    check()
    variants = _variants(plan)
    latent = None
    if plan.latent is not None:
        assert plan.x is not None and variants.rope is not None
        latent = latent_attention(
            plan.x, plan.latent, _latent_dims(s), num_heads=s.num_heads, settings=variants.rope,
            positions=variants.positions, mask=mask, scale=plan.scale,
            fully_masked_policy=plan.fully_masked_rows, variants=variants,
        )  # fmt: skip
        trace = latent.block
    elif plan.heads is not None:
        q, k, v = plan.heads  # (B, h, L, d_k), (B, h_kv, S, d_k), (B, h_kv, S, d_v)
        trace = attend_heads(
            q, k, v, w_o=plan.w_o, b_o=plan.b_o, mask=mask, scale=plan.scale,
            fully_masked_policy=plan.fully_masked_rows, norm=plan.norm, variants=variants,
        )  # fmt: skip
    else:
        assert plan.x is not None and plan.weights is not None
        trace = multihead_attention(
            plan.x,
            plan.weights,
            num_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads,
            context=plan.context,
            positional=plan.positional,
            mask=mask,
            scale=plan.scale,
            fully_masked_policy=plan.fully_masked_rows,
            residual=plan.residual,
            norm=plan.norm,
            variants=variants,
        )
    check()
    values = _common(plan, trace.heads, mask) | {
        "num_heads": s.num_heads,
        "num_kv_heads": s.num_kv_heads,
        "average_weights": trace.average_weights,
        "weights": trace.heads.weights,  # (B, h, L, S)
        "x_in": trace.x_in,
        "concat": trace.concat,
        "gate": trace.gate,
        "gated": trace.gated,
        "projected": trace.projected,
        "residual": trace.residual,
        "layer_norm": trace.layer_norm,
        "output": trace.output,
        "summary": lambda: _summary(plan, trace.average_weights),
        "steps": lambda: steps.multihead_steps(plan, trace.heads.scale),
    }
    per_head = _arrays(trace.heads)
    if latent is not None:
        values |= {"c_q": latent.c_q, "c_kv": latent.c_kv, "k_rope": latent.k_rope,
                   "mla_cache_numbers": _latent_dims(s).cache_numbers}  # fmt: skip
        per_head |= {"q_nope": latent.q_nope, "q_rope": latent.q_rope, "k_nope": latent.k_nope}
    if plan.expected is not None:
        setup = _setup(
            plan, trace.heads, variants, x_in=trace.x_in, context=plan.context,
            projections=plan.weights, num_heads=s.num_heads, num_kv_heads=s.num_kv_heads,
            w_o=plan.w_o, b_o=plan.b_o, residual=plan.residual, norm=plan.norm,
            latent=plan.latent is not None,
        )  # fmt: skip
        block = {
            "x_in": trace.x_in,
            "average_weights": trace.average_weights,
            "concat": trace.concat,
            "gate": trace.gate,
            "gated": trace.gated,
            "projected": trace.projected,
            "residual": trace.residual,
            "layer_norm": trace.layer_norm,
            "block_output": trace.output,
        }
        values |= _compared(plan, _head_state(trace.heads) | block, mask, setup, check)
    return outputs.response(s, plan.include, values, per_head)


def _latent_dims(s: Shapes) -> LatentDims:
    assert s.latent is not None
    return s.latent


def _head_state(trace: AttentionTrace) -> dict[str, Array | None]:
    """The trace's arrays by name (its scale and row flags left out)."""
    return {n: a for n, a in _arrays(trace).items() if n not in ("scale", "fully_masked_rows")}


def _setup(plan: Plan, trace: AttentionTrace, variants: Variants, **block: Any) -> Setup:
    """What recomputing the steps under a mistake needs (service.core.diagnosis.stages)."""
    s = plan.shapes
    return Setup(
        scale=trace.scale, d_k=s.d_k, fully_masked_policy=plan.fully_masked_rows,
        variants=variants, mask_specs=plan.mask_specs, batch=s.batch or 1,
        seq_len=s.seq_len, ctx_len=s.ctx_len, **block,
    )  # fmt: skip


def _compared(
    plan: Plan,
    arrays: dict[str, Array | None],
    mask: masks.CombinedMask | None,
    setup: Setup,
    check: Check,
) -> dict[str, Any]:
    """comparison and first_mismatch: the caller's expected arrays against these."""
    assert plan.expected is not None
    state = state_of(arrays, mask)
    return compare(plan.expected, plan.tolerance, state, setup, plan.shapes.batch is None, check)


def _summary(plan: Plan, weights: Array) -> list[list[dict[str, Any]]]:
    return summary(weights, plan.shapes.tokens, plan.shapes.context_tokens, plan.decimals)
