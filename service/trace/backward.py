"""The backward pass on a computed forward (API.md, "The backward pass, every step"): the core's
gradients (:mod:`service.core.backward`) from ``grad_output``, the projections' in the
request's layout, ``grad_state_dict`` under the names the request gave, and a step for each
gradient after the forward's, in the order the backward made them.

With ``online_softmax``, FlashAttention-2's backward a block of keys at a time
(:func:`online_blocks`, :mod:`service.core.online_backward`: Dao 2023, Algorithm 2) is one more
output, ``online_softmax_backward``, and one more step per block after the backward's
(:func:`backward_steps`).
"""

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from service.core import chain
from service.core.attention import AttentionTrace
from service.core.backward import (
    attention_backward,
    heads_backward,
    multihead_backward,
    projections_backward,
    values_read_as_keys,
)
from service.core.latent import LatentTrace, latent_backward
from service.core.masks import CombinedMask
from service.core.multihead import MultiheadTrace
from service.core.online_backward import OnlineBackward, online_softmax_backward
from service.core.positions import RelativeBias, t5_bucket
from service.core.softmax import OnlineSoftmax
from service.core.types import Array, IntArray
from service.core.variants import Variants
from service.trace.gradient_outputs import GRADIENTS
from service.trace.gradients import PARAMETERS
from service.trace.outputs import gradient_position
from service.trace.plan import AttentionPlan, MultiheadPlan, Plan

Grads = dict[str, Array]


def seed(plan: Plan, last: Array) -> Array:
    """dO: grad_output as given (batched), or every entry 1 for "sum"."""
    g = plan.grad_output
    assert g is not None
    return np.ones_like(last) if isinstance(g, str) else g


def attention_grads(
    plan: AttentionPlan,
    trace: AttentionTrace,
    mask: CombinedMask | None,
    variants: Variants,
) -> Grads:
    """/attention and /mask: every gradient of the head, then the projections' (x, the
    weights in in_out, the biases given) when x was projected."""
    grads = attention_backward(
        trace,
        seed(plan, trace.output),
        additive=None if mask is None else mask.additive,
        padded_queries=None if mask is None else mask.padded_queries,
        fully_masked_policy=plan.fully_masked_rows,
        variants=variants,
        past=plan.past,
    )
    p = plan.projections
    if p is None:
        return grads
    assert plan.x is not None
    return grads | projections_backward(
        plan.x, plan.context, p, {n: grads[f"grad_{n}"] for n in "qkv"}
    )


def multihead_grads(
    plan: MultiheadPlan,
    trace: MultiheadTrace,
    mask: CombinedMask | None,
    variants: Variants,
) -> Grads:
    """/multihead: the block's gradients, every head's, and the projections' when x was
    projected (grad_k, grad_v per key/value head under grouped-query attention)."""
    s = plan.shapes
    d_out = seed(plan, trace.output)
    common: dict[str, Any] = {
        "mask": mask,
        "fully_masked_policy": plan.fully_masked_rows,
        "norm": plan.norm,
        "variants": variants,
        "past": plan.past,
        "num_kv_heads": s.num_kv_heads,
    }
    if plan.weights is None:  # q, k, v given per head
        grads = heads_backward(trace, d_out, w_o=plan.w_o, b_o=plan.b_o, **common)
    else:
        assert plan.x is not None
        grads = multihead_backward(
            plan.x,
            plan.weights,
            trace,
            d_out,
            context=plan.context,
            residual=plan.residual,
            **common,
        )
    return values_read_as_keys(grads) if "k_eq_v" in s.on else grads


def latent_grads(
    plan: MultiheadPlan,
    trace: LatentTrace,
    mask: CombinedMask | None,
    variants: Variants,
) -> Grads:
    """/multihead with mla: the block's and the heads' gradients, then back through the
    latents to x (:func:`service.core.latent.latent_backward`), the weights in_out."""
    s = plan.shapes
    assert plan.latent is not None and plan.x is not None and s.latent is not None
    assert variants.rope is not None
    return latent_backward(
        plan.x,
        plan.latent,
        s.latent,
        trace,
        seed(plan, trace.block.output),
        settings=variants.rope,
        positions=variants.positions,
        mask=mask,
        fully_masked_policy=plan.fully_masked_rows,
        variants=variants,
    )


def bias_table(plan: Plan, grads: Grads, queries: IntArray, keys: IntArray) -> Grads:
    """With T5's relative bias: the gradient of its table [num_buckets][h], the bias's
    gradient summed by bucket, head by head (the bias is table[bucket(p'_j − p_i)][h])."""
    spec = plan.bias
    if not isinstance(spec, RelativeBias) or "grad_position_bias" not in grads:
        return {}
    table = spec.table  # (num_buckets, h)
    bucket = t5_bucket(
        keys[None, :].astype(np.int64) - queries[:, None].astype(np.int64),
        spec.bidirectional,
        table.shape[0],
        spec.max_distance,
    ).ravel()  # (L·S,)
    g = np.broadcast_to(
        grads["grad_position_bias"], (table.shape[1], *grads["grad_position_bias"].shape[-2:])
    )
    per_head = [
        np.bincount(bucket, weights=g[i].ravel(), minlength=table.shape[0])
        for i in range(table.shape[1])
    ]
    return {"grad_relative_bias_table": np.stack(per_head, axis=-1)}  # (num_buckets, h)


def online_blocks(
    plan: Plan,
    trace: AttentionTrace,
    online: OnlineSoftmax,
    grads: Grads,
    mask: CombinedMask | None,
    variants: Variants,
) -> OnlineBackward:
    """FlashAttention-2's backward of the head(s) of ``trace`` a block of keys at a time, the
    blocks those of the forward's ``online`` softmax, from each head's dO (on /multihead its
    share of grad_concat, ``grads["grad_output"]`` (B, h, L, d_v))."""
    padded = None if mask is None else mask.padded_queries  # (B, L)
    if padded is not None and trace.output.ndim == 4:
        padded = padded[:, None]  # (B, 1, L) against the heads' (B, h, L)
    return online_softmax_backward(
        trace,
        online,
        grads["grad_output"],
        variants=variants,
        padded_queries=padded,
        fully_masked_policy=plan.fully_masked_rows,
    )


# ------------------------------------------------ the answer: layouts and grad_state_dict

_ROWS = frozenset(out.name for out in GRADIENTS)


def _transposed_if(layout: str, field: str, given: Mapping[str, str]) -> bool:
    """Whether a combined weight field (w_q …, w_o) was given in out_in (its gradient too)."""
    return field in given and layout == "out_in"


def answer(plan: Plan, grads: Grads) -> dict[str, Any]:
    """The gradients as the answer gives them: the weights in the request's layout (a given
    w_q, w_k, w_v, w_o in weight_layout; gate.w out_in as given; else in_out) and, where the
    projections were given under a module's names, grad_state_dict."""
    out: dict[str, Any] = {n: g for n, g in grads.items() if n in _ROWS}
    for n in ("q", "k", "v", "o"):
        name = f"grad_w_{n}"
        if name in out and _transposed_if(plan.weight_layout, f"w_{n}", plan.given):
            out[name] = out[name].T
    if "grad_gate_w" in out:
        out["grad_gate_w"] = out["grad_gate_w"].T  # gate.w is out_in: [h·d_v][d_model]
    if isinstance(plan, MultiheadPlan) and plan.shapes.form in (
        "in_proj",
        "per_head",
        "state_dict",
        "latent",
    ):
        out["grad_state_dict"] = state_dict(plan, grads)
    return out


def _out_in(grads: Grads, name: str) -> Array:
    return grads[name].T


def _per_head(plan: MultiheadPlan, grads: Grads) -> dict[str, Array]:
    """heads.<i>.w_q … : head i's columns of the combined in_out gradients, in weight_layout;
    a bias only where that head gave one."""
    s = plan.shapes
    out: dict[str, Array] = {}
    for i in range(s.num_heads):
        for n, width in (("q", s.d_k), ("k", s.d_k), ("v", s.d_v)):
            cols = slice(i * width, (i + 1) * width)
            w = grads[f"grad_w_{n}"][:, cols]
            out[f"heads.{i}.w_{n}"] = w.T if plan.weight_layout == "out_in" else w
            if f"heads.{i}.b_{n}" in plan.given:
                out[f"heads.{i}.b_{n}"] = grads[f"grad_b_{n}"][cols]
    return out


# how each parameter's gradient is made from the core's (in_out weights), by request field
_STATE: dict[str, Callable[[Grads], Array]] = {
    "q_proj_weight": lambda g: _out_in(g, "grad_w_q"),
    "k_proj_weight": lambda g: _out_in(g, "grad_w_k"),
    "v_proj_weight": lambda g: _out_in(g, "grad_w_v"),
    "in_proj_weight": lambda g: np.concatenate([g[f"grad_w_{n}"].T for n in "qkv"]),
    "in_proj_bias": lambda g: np.concatenate([g[f"grad_b_{n}"] for n in "qkv"]),
    "out_proj_weight": lambda g: _out_in(g, "grad_w_o"),
    "o_proj_weight": lambda g: _out_in(g, "grad_w_o"),
    "gate.w": lambda g: _out_in(g, "grad_gate_w"),
    "q_a_proj_weight": lambda g: _out_in(g, "grad_w_q_a"),
    "q_b_proj_weight": lambda g: _out_in(g, "grad_w_q"),
    "kv_a_proj_with_mqa_weight": lambda g: _out_in(g, "grad_w_kv_a"),
    "kv_b_proj_weight": lambda g: _out_in(g, "grad_w_kv_b"),
}


def state_dict(plan: MultiheadPlan, grads: Grads) -> dict[str, Array]:
    """Every given parameter's gradient under the name the request gave it, shaped as given:
    q_proj.weight … out_in as a module stores them, in_proj_weight packed [q; k; v] as
    PyTorch packs it, heads.<i>.w_q per head, and the norms', sinks', gate's, layer norm's."""
    out: dict[str, Array] = {pack.name: pack.make(grads) for pack in plan.packed}
    for field, name in plan.given.items():
        if field == "heads":
            out |= _per_head(plan, grads)
            continue
        if field.startswith("heads."):  # a head's bias: made with its weights
            continue
        make = _STATE.get(field)
        if make is not None:
            out[name] = make(grads)
        elif field in ("w_q", "w_k", "w_v", "w_o"):
            g = grads[PARAMETERS[field]]
            out[name] = g.T if plan.weight_layout == "out_in" else g
        elif PARAMETERS[field] in grads:
            out[name] = grads[PARAMETERS[field]]
    return out


# ----------------------------------------------------------------------------- the steps

Step = dict[str, Any]
_BATCHED = frozenset(out.name for out in GRADIENTS if out.batched)
_KINDS = {step.name: step.kind for step in chain.HEAD}
_SCORES = ("grad_masked_scores", "grad_biased_scores", "grad_capped_scores", "grad_scaled_scores")
_AFTER = {  # a score's gradient when it is not dS: the next score's, as the step adds a constant
    "grad_biased_scores": "grad_masked_scores (the mask adds a constant)",
    "grad_capped_scores": "grad_biased_scores (the position bias adds a constant)",
    "grad_scaled_scores": "the next score's gradient (the step adds a constant)",
}


def _consumer(name: str, made: tuple[str, ...], cached: bool) -> str:
    """The step that read the form ``name`` of the queries, keys or values."""
    slot = chain.slot_of(name)
    after = made[made.index(name) + 1 :] if name in made else ()
    later = next((n for n in after if chain.slot_of(n) == slot), None)
    if later is not None:
        return later
    if slot == "v":
        return "present_v" if cached else "output"
    return "present_k" if cached and slot == "k" else "scores"


def _form(plan: Plan, name: str, made: tuple[str, ...]) -> str:
    """The formula of a query, key or value form's gradient: the backward of its reader."""
    s = plan.shapes
    c = _consumer(name, made, s.past_len > 0)
    kind = _KINDS.get(c, c)
    slot = chain.slot_of(name)
    g = f"grad_{c}"
    if kind == "scores":
        read = chain.made_from("scores", made, slot="k" if slot == "q" else "q")
        other = chain.SYMBOLS.get(read, read)
        return (
            f"grad_scores {other}: dQ = dS·scale K"
            if slot == "q"
            else f"grad_scoresᵀ {other}: dK = (dS·scale)ᵀ Q"
            + (", K repeated per query head" if s.num_kv_heads != s.num_heads else "")
        )
    texts = {
        "output": "weightsᵀ grad_output: dV = Pᵀ dO",
        "cache": f"the new tokens' rows of grad_{c} (the cache's rows are grad_past_{slot})",
        "clip": f"{g} where |{name}| ≤ clip_qkv, 0 where it was clamped (torch.clamp's)",
        "norm": f"the norm's Jacobian applied to {g}: with dy = w ∘ {g} (1 + w when "
        "zero-centred), (dy − x̂·mean(dy ∘ x̂))/σ per vector (a layer norm subtracts mean(dy) "
        "too)",
        "rotate": f"RoPE's transpose: {g} rotated back by −θ (times the scaling's attention "
        "factor where it has one)",
        "temper": f"{g} × each query's temperature",
    }
    text = texts.get(kind, f"the backward of {c} applied to {g}")
    if name in ("k", "v") and s.endpoint == "multihead" and s.num_kv_heads != s.num_heads:
        text += ", summed over the query heads each key/value head serves (repeat_kv's transpose)"
    return text


def _formulas(plan: Plan, grads: Grads, scale: float) -> dict[str, str]:
    s = plan.shapes
    context = getattr(plan, "context", None)  # both plans have it
    seed = (
        'every entry 1 ("sum": loss = the sum of that array)'
        if isinstance(plan.grad_output, str)
        else "grad_output as given"
    )
    d_s = next(n for n in _SCORES if n in grads)
    dss = "dS = P ∘ (dP − D), P = weights" + ("; 0 where masked" if s.masked else "")
    if plan.fully_masked_rows == "uniform" and s.masked:
        dss += " and on rows the uniform policy filled"
    f: dict[str, str] = {
        "grad_output": f"dO: {seed}",
        "grad_weights": "dP = dO Vᵀ",
        "row_dot": "D = rowsum(dO ∘ O) = rowsum(P ∘ dP)",
        "grad_scores": f"grad_scaled_scores · scale = · {scale:.10g}",
        "grad_sinks": "−Σ P_sink · D over the rows and batch items (per head)",
        "grad_x": "dQ W_qᵀ + dK W_kᵀ + dV W_vᵀ"
        + (" (the keys' and values' in grad_context)" if context is not None else "")
        + (" + the residual's grad_residual" if s.residual else "")
        + (" + the gate's" if "gate" in s.on else ""),
        "grad_context": "dK W_kᵀ + dV W_vᵀ",
        "grad_ln_gamma": "Σ grad_layer_norm ∘ x̂ over tokens and batch items",
        "grad_ln_beta": "Σ grad_layer_norm over tokens and batch items",
        "grad_w_o": "(gated) concatᵀ grad_projected, summed over tokens and batch items",
        "grad_b_o": "Σ grad_projected over tokens and batch items",
        "grad_gate": "grad_gated ∘ concat",
        "grad_gate_w": "xᵀ (grad_gate ∘ gate ∘ (1 − gate)), as gate.w is stored (out_in)",
        "grad_gate_b": "Σ grad_gate ∘ gate ∘ (1 − gate)",
    }
    for n in "qkv":
        src = "X" if n == "q" or context is None else "C"
        f[f"grad_w_{n}"] = f"{src}ᵀ d{n.upper()} summed over tokens and batch items" + (
            ", transposed (out_in, as given)"
            if plan.weight_layout == "out_in" and f"w_{n}" in plan.given
            else ""
        )
        f[f"grad_b_{n}"] = f"Σ d{n.upper()} over tokens and batch items"
        f[f"grad_{n}_norm_weight"] = f"Σ grad ∘ x̂ of the {n} norm, summed back to the weight given"
        f[f"grad_{n}_norm_bias"] = f"Σ grad of the {n} norm, summed back to the bias given"
    f[d_s] = dss
    for name, text in _AFTER.items():
        f.setdefault(name, text)
    if "softcap" in s.on:
        f["grad_scaled_scores"] = "grad_capped_scores ∘ (1 − tanh²(scaled_scores / c))"
    if d_s == "grad_scaled_scores":
        f["grad_scaled_scores"] = dss
    last = "layer_norm" if s.layer_norm else "residual" if s.residual else "projected"
    if s.endpoint == "multihead":
        block = {
            "grad_layer_norm": f"dO: {seed}",
            "grad_residual": "the layer norm's Jacobian applied to grad_layer_norm"
            if s.layer_norm
            else f"dO: {seed}",
            "grad_projected": "grad_residual (the residual adds x)"
            if s.residual
            else "the layer norm's Jacobian applied to grad_layer_norm"
            if s.layer_norm
            else f"dO: {seed}",
            "grad_gated": "grad_projected W_oᵀ",
            "grad_concat": "grad_gated ∘ gate"
            if "gate" in s.on
            else "grad_projected W_oᵀ"
            if isinstance(plan, MultiheadPlan) and plan.w_o is not None
            else "grad_projected (W_o = identity)",
            "grad_output": "grad_concat split into the heads' d_v columns",
        }
        f |= block
        f[f"grad_{last}"] = f"dO: {seed}"
    made = chain.made_with(plan.variants, s.masked, s.past_len > 0)
    for name in grads:
        base = name[5:]
        if chain.slot_of(base) in ("q", "k", "v") and base not in ("output",):
            f[name] = _form(plan, base, made)
    return f | (_LATENT if s.latent is not None else {})


_TURNED_BACK = "RoPE's transpose (back by −θ, times the scaling's attention factor"
_LATENT = {  # mla: back through Q's and K's parts and the latents (service.core.latent)
    "grad_q_rope": "the last qk_rope_head_dim columns of grad_q_rotated",
    "grad_q_nope": "the first qk_nope_head_dim columns of grad_q_rotated",
    "grad_k_rope": "Σ over the heads of the last qk_rope_head_dim columns of grad_k_rotated (one "
    "rotated key read by every head)",
    "grad_k_nope": "the first qk_nope_head_dim columns of grad_k_rotated",
    "grad_q": f"[grad_q_nope | {_TURNED_BACK}; DeepSeek's interleaved layout undone first) of "
    "grad_q_rope]",
    "grad_k": f"[grad_k_nope | {_TURNED_BACK}) of this head's rope columns of grad_k_rotated]",
    "grad_c_kv": "[grad_k_nope | grad_v] of all heads times kv_b_projᵀ: d[k_nope | V] W_kvbᵀ",
    "grad_c_q": "grad_q of all heads times q_b_projᵀ: dQ W_qbᵀ",
    "grad_x": "back through kv_a_layernorm's and q_a_layernorm's RMS-norm Jacobians "
    "(dy − x̂·mean(dy ∘ x̂))/σ with dy = w ∘ g, then kv_a_proj_with_mqa ([dC_kv | RoPE's transpose of "
    "grad_k_rope]) and q_a_proj (or q_proj): the shares summed",
    "grad_w_q": "C_qᵀ dQ (Xᵀ dQ without q_lora_rank) summed over tokens and batch items, in_out",
}


def _shape(plan: Plan, name: str, g: Array) -> list[int]:
    """The step's shape as the answer gives the array: without the batch axis of an
    unbatched request."""
    batched = name in _BATCHED
    return list(g.shape[1:] if batched and plan.shapes.batch is None else g.shape)


def _online_steps(plan: Plan) -> list[Step]:
    """With online_softmax: a step per block of keys of FlashAttention-2's backward."""
    s = plan.shapes
    size = s.online_block
    if size is None:
        return []
    lead = ([s.batch] if s.batch is not None else []) + (
        [s.num_heads] if s.endpoint == "multihead" else []
    )
    steps = []
    for start in range(0, s.ctx_len, size):
        end = min(start + size, s.ctx_len)
        last = (
            "; the last block: dq = the gradient of the Q the scores read"
            if end == s.ctx_len
            else ""
        )
        steps.append(
            {
                "name": f"online_softmax_backward keys {start}…{end - 1}",
                "formula": f"FlashAttention-2's backward over keys {start}…{end - 1}: "
                "p = exp(s − L_i) with L_i = m_i + log ℓ_i, dv = pᵀ dO, dp = dO V_jᵀ, "
                "ds = p ∘ (dp − D_i)"
                + (" ∘ (1 − tanh²(s/c))" if "softcap" in s.on else "")
                + f", dk = dsᵀ Q · scale, dq += ds K_j · scale{last}",
                "shape": [*lead, s.seq_len, end - start],
            }
        )
    return steps


def backward_steps(plan: Plan, grads: Grads, scale: float) -> list[Step]:
    """A step per gradient, in the backward's order (the reverse of the forward's, the block's
    before the heads', a parameter's right after the gradient its step reads, D after dP, the
    projections' last: :func:`gradient_position`, as the comparison); then, with
    online_softmax, a step per block of FlashAttention-2's backward."""
    formulas = _formulas(plan, grads, scale)
    endpoint = plan.shapes.endpoint
    order = sorted((n for n in grads if n in _ROWS), key=lambda n: gradient_position(endpoint, n))
    steps = []
    for name in order:
        g = np.asarray(grads[name])
        first = f"{g.flat[0]:.6g}" if g.size else "—"
        steps.append(
            {
                "name": name,
                "formula": f"{name} = {formulas.get(name, 'its step backward')}; first entry "
                f"{first}",
                "shape": _shape(plan, name, g),
            }
        )
    return steps + _online_steps(plan)
