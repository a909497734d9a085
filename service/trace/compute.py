"""Run a plan on the engine and hand the trace to the outputs table. ``check`` is called
between the large steps: it raises when the client has gone, so its work stops there."""

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from service.core import chain, masks
from service.core.attention import (
    AttentionTrace,
    Past,
    project_qkv,
    scaled_dot_product_attention,
)
from service.core.block import repeated_heads
from service.core.diagnosis.stages import Setup
from service.core.latent import LatentDims, LatentLayer, latent_attention
from service.core.multihead import (
    BLOCK_NAMES,
    MultiheadTrace,
    attend_heads,
    multihead_attention,
)
from service.core.positions import (
    Alibi,
    alibi_slopes,
    position_bias,
    rope_gain,
    rope_theta,
    sequence_length,
)
from service.core.softmax import OnlineSoftmax, online_softmax, rows_by_item
from service.core.types import Array, IntArray
from service.core.variants import Variants
from service.trace import backward, outputs, steps
from service.trace.comparison import Answered, compare, state_of
from service.trace.decode import replay
from service.trace.gradients import PARAMETERS
from service.trace.plan import AttentionPlan, MultiheadPlan, Plan
from service.trace.shapes import Shapes
from service.trace.summary import summary


def _combined_mask(plan: Plan) -> masks.CombinedMask | None:
    s = plan.shapes
    return (
        masks.combine(list(plan.mask_specs), s.batch or 1, s.seq_len, s.ctx_len, s.past_len)
        if s.masked
        else None
    )


def _variants(plan: Plan) -> Variants:
    """The plan's variants with the position bias computed: (h, L, S), h = 1 on /attention."""
    v = plan.variants
    if plan.bias is None:
        return v
    queries, keys = _positions(plan)  # (L,), (S,)
    bias = position_bias(plan.bias, plan.shapes.num_heads, queries, keys)  # (h, L, S)
    return replace(v, position_bias=bias)


def _positions(plan: Plan) -> tuple[IntArray, IntArray]:
    """The queries' positions (L,) and the keys' (S,) as every position variant takes them:
    as given; else the queries at 0 … L − 1, after a cache of P at P … P + L − 1; the keys at
    ``context_positions`` (the queries' own in self-attention: service.trace.plan), else, after
    a cache, the cache's 0 … P − 1 then the new tokens' at the queries' positions (RoPE turns
    them there; service.trace.rules refuses new tokens that do not follow the cache when a
    position bias needs the cache's positions), else 0 … S − 1."""
    s, v = plan.shapes, plan.variants
    p = s.past_len
    queries = np.arange(p, p + s.seq_len) if v.positions is None else v.positions  # (L,)
    if v.context_positions is not None:
        return queries, v.context_positions
    if p:  # the cache's keys, then the new tokens'
        return queries, np.concatenate((np.arange(p), queries))  # (P + L,)
    return queries, np.arange(s.ctx_len)


def _positions_used(plan: Plan) -> dict[str, Any]:
    """The numbers the position variants used, returned as outputs so that a cell can be
    explained from the answer: the queries' and keys' positions (:func:`_positions`), θ_i
    after the scaling and the factor on cos and sin (the core's :func:`rope_theta` and
    :func:`rope_gain`, which the rotation takes), each head's ALiBi slope. Only the present
    ones are read (service.trace.outputs)."""
    s, v = plan.shapes, plan.variants
    queries, keys = _positions(plan)  # (L,), (S,)
    values: dict[str, Any] = {"query_positions": queries, "key_positions": keys}
    if v.rope is not None:
        width = s.d_k if s.latent is None else s.latent.qk_rope_head_dim  # mla: its rope part
        theta = rope_theta(v.rope, width, sequence_length(queries))  # (r/2,)
        values |= {"rope_frequencies": theta, "rope_gain": rope_gain(v.rope)}
    if isinstance(plan.bias, Alibi):
        given = plan.bias.slopes
        values["alibi_slopes"] = alibi_slopes(s.num_heads) if given is None else given  # (h,)
    return values


POSITIONED = frozenset({"rope", "temperature", "position_bias"})  # the variants that read positions


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
        **(_positions_used(plan) if s.on & POSITIONED else {}),
    }
    if mask is not None:
        values |= {
            "mask": mask.allowed,
            "additive_mask": mask.additive,
            "fully_masked_rows": rows_by_item(trace.fully_masked_rows),  # per batch item
        }
    return values


def _arrays(trace: AttentionTrace) -> dict[str, Any]:
    """The trace's intermediates by name (None for a step that was off), its scale and row
    flags: the values of the table's head rows."""
    made = trace.made
    arrays: dict[str, Any] = {name: made.get(name) for name in chain.NAMES}
    return arrays | {"scale": trace.scale, "fully_masked_rows": trace.fully_masked_rows}


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
    trace = _attend(plan, q, k, v, mask, variants, plan.past)
    check()
    values = _common(plan, trace, mask) | {
        "summary": lambda: _summary(plan, trace.weights),
        "steps": lambda: steps.attention_steps(plan, trace.scale),
        "present_k": trace.present_k,
        "present_v": trace.present_v,
    }
    online = None
    if plan.shapes.online_block is not None:
        online = _online(plan, trace)
        values["online_softmax"] = online[0] if plan.shapes.batch is None else online[:]
    if plan.shapes.check_decode:

        def step(rows: slice, cache: Past) -> tuple[Array, Past]:
            at = _decode_step(plan, rows, cache.length)
            one = _attend(
                at, q[:, rows], k[:, rows], v[:, rows], _combined_mask(at), _variants(at), cache
            )
            assert one.present_k is not None and one.present_v is not None
            return one.output, Past(one.present_k, one.present_v)

        empty = Past(k[:, :0], v[:, :0])  # (B, 0, ·)
        values["decode_check"] = replay(step, plan.shapes.seq_len, trace.output, empty, check)
    per_head = _arrays(trace)
    grads: backward.Grads = {}
    if plan.shapes.backward:
        check()
        grads = backward.attention_grads(plan, trace, mask, variants)
        grads |= backward.bias_table(plan, grads, *_positions(plan))
        values |= backward.answer(plan, grads)
        if online is not None:
            back = backward.online_blocks(plan, trace, online, grads, mask, variants)
            values["online_softmax_backward"] = back[0] if plan.shapes.batch is None else back[:]
        per_head |= values
        values["steps"] = _with_backward(values["steps"], plan, grads, trace.scale)
    if plan.expected is not None:  # the gradients compared too (their engine shapes)
        setup = _setup(
            plan, trace, variants, x_in=plan.x, context=plan.context, projections=plan.projections
        )
        values |= _compared(plan, {**_head_state(trace), **grads}, mask, setup, check)
    return outputs.body(plan.shapes, plan.include, values, per_head)


def _with_backward(
    forward: Callable[[], list[dict[str, Any]]], plan: Plan, grads: backward.Grads, scale: float
) -> Callable[[], list[dict[str, Any]]]:
    """The steps: the forward's, then a step per gradient."""
    return lambda: forward() + backward.backward_steps(plan, grads, scale)


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
            plan.x,
            plan.latent,
            _latent_dims(s),
            num_heads=s.num_heads,
            settings=variants.rope,
            positions=variants.positions,
            mask=mask,
            scale=plan.scale,
            fully_masked_policy=plan.fully_masked_rows,
            variants=variants,
        )
        trace = latent.block
    else:
        trace = _multihead(plan, plan.x, plan.heads, plan.positional, mask, variants, plan.past)
    check()
    values = _common(plan, trace.heads, mask) | {
        "num_heads": s.num_heads,
        "num_kv_heads": s.num_kv_heads,
        "average_weights": trace.average_weights,
        "weights": trace.heads.weights,  # (B, h, L, S)
        "x_in": trace.x_in,
        **_block(trace),
        "output": trace.output,
        "summary": lambda: _summary(plan, trace.average_weights),
        "steps": lambda: steps.multihead_steps(plan, trace.heads.scale),
        "present_k": trace.heads.present_k,
        "present_v": trace.heads.present_v,
    }
    if s.check_decode and latent is None:
        x, heads, pe = plan.x, plan.heads, plan.positional

        def step(rows: slice, cache: Past) -> tuple[Array, Past]:
            at = _decode_step(plan, rows, cache.length)
            one = _multihead(
                at,
                None if x is None else x[:, rows],
                None
                if heads is None
                else (heads[0][:, :, rows], heads[1][:, :, rows], heads[2][:, :, rows]),
                None if pe is None else pe[rows],
                _combined_mask(at),
                _variants(at),
                cache,
            )
            p_k, p_v = one.heads.present_k, one.heads.present_v
            assert p_k is not None and p_v is not None
            return one.output, Past(p_k, p_v)

        b, h_kv = trace.output.shape[0], s.num_kv_heads
        empty = Past(np.zeros((b, h_kv, 0, s.d_k)), np.zeros((b, h_kv, 0, s.d_v)))
        values["decode_check"] = replay(step, s.seq_len, trace.output, empty, check)
    per_head = _arrays(trace.heads)
    online = None
    if s.online_block is not None:
        online = _online(plan, trace.heads)
        per_head["online_softmax"] = online
    if latent is not None:
        values |= {
            "c_q": latent.c_q,
            "c_kv": latent.c_kv,
            "k_rope": latent.k_rope,
            "mla_cache_numbers": _latent_dims(s).cache_numbers,
        }
        per_head |= {"q_nope": latent.q_nope, "q_rope": latent.q_rope, "k_nope": latent.k_nope}
    grads: backward.Grads = {}
    if s.backward:
        check()
        grads = (
            backward.multihead_grads(plan, trace, mask, variants)
            if latent is None
            else backward.latent_grads(plan, latent, mask, variants)
        )
        grads |= backward.bias_table(plan, grads, *_positions(plan))
        answered = backward.answer(plan, grads)
        per_head |= answered  # the heads' (B, h, ·, ·)
        if online is not None:  # each head's blocks, from its share of grad_concat
            per_head["online_softmax_backward"] = backward.online_blocks(
                plan, trace.heads, online, grads, mask, variants
            )
        values |= answered | {"grad_output": backward.seed(plan, trace.output)}  # the block's
        values["steps"] = _with_backward(values["steps"], plan, grads, trace.heads.scale)
    if plan.expected is not None:
        setup = _setup(
            plan,
            trace.heads,
            variants,
            x_in=trace.x_in,
            context=plan.context,
            projections=plan.weights,
            num_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads,
            w_o=plan.w_o,
            b_o=plan.b_o,
            residual=plan.residual,
            norm=plan.norm,
            latent=None
            if latent is None or plan.x is None or plan.latent is None
            else LatentLayer(plan.x, plan.latent, _latent_dims(s), latent.c_q, latent.c_kv),
            values_are_keys="k_eq_v" in s.on,
        )
        block = {
            "x_in": trace.x_in,
            "average_weights": trace.average_weights,
            **_block(trace),
            "block_output": trace.output,
        }
        if s.backward:  # the gradients compared too; the block's seed as the core reads it
            block |= grads | {"grad_block_output": backward.seed(plan, trace.output)}
        values |= _compared(plan, _head_state(trace.heads) | block, mask, setup, check)
    return outputs.body(s, plan.include, values, per_head)


def _block(trace: MultiheadTrace) -> dict[str, Array | None]:
    """The block's intermediates by name (None for a step that was off): the values of the
    table's block rows."""
    return {name: trace.block.get(name) for name in BLOCK_NAMES}


def _latent_dims(s: Shapes) -> LatentDims:
    assert s.latent is not None
    return s.latent


def _online(plan: Plan, trace: AttentionTrace) -> OnlineSoftmax:
    """The trace's softmax and weights V again, a block of keys at a time: the final scores
    (−∞ masked), the values the output read, the sink where there is one."""
    assert plan.shapes.online_block is not None
    made = trace.made
    present = tuple(name for name in chain.ORDER if name in made)
    logits = made[chain.made_from("weights", present)]  # (..., L, S) the final scores
    v = made[chain.made_from("output", present, slot="v")]  # (..., S, d_v)
    if v.ndim == 4:  # a cache kept per key/value head (GQA): repeated as the output read it
        v = repeated_heads(v, logits.shape[1])  # (B, h, S, d_v)
    sinks = plan.variants.sinks
    sink = None
    if sinks is not None:  # one number, or one per head: (h,) -> (1, h, 1) against (B, h, L)
        given = np.asarray(sinks, dtype=np.float64)
        sink = given if given.ndim == 0 else given[None, :, None]
    return online_softmax(logits, v, plan.shapes.online_block, sink)


def _attend(
    plan: AttentionPlan,
    q: Array,
    k: Array,
    v: Array,
    mask: masks.CombinedMask | None,
    variants: Variants,
    past: Past | None,
) -> AttentionTrace:
    """The engine on /attention's q (B, L, d_k), k, v (B, S, ·), with a cache when given."""
    return scaled_dot_product_attention(
        q,
        k,
        v,
        scale=plan.scale,
        additive=None if mask is None else mask.additive,
        padded_queries=None if mask is None else mask.padded_queries,
        fully_masked_policy=plan.fully_masked_rows,
        variants=variants,
        past=past,
    )


def _multihead(
    plan: MultiheadPlan,
    x: Array | None,
    heads: tuple[Array, Array, Array] | None,
    positional: Array | None,
    mask: masks.CombinedMask | None,
    variants: Variants,
    past: Past | None,
) -> MultiheadTrace:
    """The engine on /multihead's x (B, L, d_model) with its weights, or the heads given."""
    s = plan.shapes
    if heads is not None:
        q, k, v = heads  # (B, h, L, d_k), (B, h_kv, S, d_k), (B, h_kv, S, d_v)
        return attend_heads(
            q,
            k,
            v,
            w_o=plan.w_o,
            b_o=plan.b_o,
            mask=mask,
            scale=plan.scale,
            fully_masked_policy=plan.fully_masked_rows,
            norm=plan.norm,
            variants=variants,
            past=past,
        )
    assert x is not None and plan.weights is not None
    return multihead_attention(
        x,
        plan.weights,
        num_heads=s.num_heads,
        num_kv_heads=s.num_kv_heads,
        context=plan.context,
        positional=positional,
        mask=mask,
        scale=plan.scale,
        fully_masked_policy=plan.fully_masked_rows,
        residual=plan.residual,
        norm=plan.norm,
        variants=variants,
        past=past,
    )


P = TypeVar("P", AttentionPlan, MultiheadPlan)


def _decode_step(plan: P, rows: slice, cached: int) -> P:
    """The plan of one token of ``check_decode``: the query ``rows`` of the sequence after
    ``cached`` tokens, at their positions, causal over the cache and themselves."""
    v = plan.variants
    every = np.arange(plan.shapes.seq_len) if v.positions is None else v.positions  # (L,)
    at = every[rows]  # (1,)
    shapes = replace(
        plan.shapes,
        seq_len=1,
        ctx_len=cached + 1,
        past_len=cached,
        num_masks=plan.shapes.num_masks + 1,
    )
    return replace(
        plan,
        shapes=shapes,
        mask_specs=(*plan.mask_specs, masks.Causal()),
        variants=replace(v, positions=at, context_positions=every[: cached + 1]),
    )


def _head_state(trace: AttentionTrace) -> dict[str, Array | None]:
    """The trace's arrays by name (its scale and row flags left out)."""
    return {n: a for n, a in _arrays(trace).items() if n not in ("scale", "fully_masked_rows")}


def _setup(plan: Plan, trace: AttentionTrace, variants: Variants, **block: Any) -> Setup:
    """What recomputing the steps under a mistake needs (service.core.diagnosis.stages)."""
    s = plan.shapes
    past = plan.past
    if past is not None:  # the new tokens at their positions; the cache per query head
        at = np.arange(s.past_len, s.ctx_len) if variants.positions is None else variants.positions
        variants = replace(variants, positions=at, context_positions=at)
        if s.endpoint == "multihead":
            past = past.repeated(s.num_heads // s.num_kv_heads)
    return Setup(
        scale=trace.scale,
        d_k=s.d_k,
        fully_masked_policy=plan.fully_masked_rows,
        variants=variants,
        mask_specs=plan.mask_specs,
        batch=s.batch or 1,
        seq_len=s.seq_len,
        ctx_len=s.ctx_len,
        past=past,
        **block,
    )


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
    unbatched = plan.shapes.batch is None
    answered = _answered(plan) if plan.shapes.backward else None
    return compare(plan.expected, plan.tolerance, state, setup, unbatched, check, answered)


def _answered(plan: Plan) -> Answered:
    """How the answer gives the parameters' gradients (:func:`backward.answer`), and the
    engine's gradient each grad_state_dict name is made from."""
    made_from: dict[str, str] = {}
    for field, name in plan.given.items():
        if field == "heads":  # heads.<i>.w_q …: that head's columns of grad_w_q
            made_from |= {
                f"heads.{i}.w_{n}": f"grad_w_{n}"
                for i in range(plan.shapes.num_heads)
                for n in "qkv"
            }
        elif field.startswith("heads."):  # heads.<i>.b_q
            made_from[name] = f"grad_b_{field[-1]}"
        else:
            made_from[name] = PARAMETERS[field]
    for pack in plan.packed:  # a fused projection …: where the first of its gradients is made
        made_from[pack.name] = PARAMETERS[min(pack.fields)]
    return Answered(lambda grads: backward.answer(plan, dict(grads)), made_from)


def _summary(plan: Plan, weights: Array) -> list[list[dict[str, Any]]]:
    return summary(weights, plan.shapes.tokens, plan.shapes.context_tokens, plan.decimals)
