"""The variants of modern attention as rows (API.md, "Position and score variants"), in the
order they apply: clipping (OLMo), QK-norm, RoPE (its row's parts in
:mod:`service.trace.rows.rope`), the temperature, the values' norm, the output gate, k_eq_v,
the layer's own scale (Granite), soft-capping, a position bias (ALiBi or T5), sinks. Each row
says when a request turns it on, checks it against the shapes (the rules, before anything is
drawn), gives the engine its settings (the plan) and says its steps in words. The rules, the
plan and the steps loop over :data:`VARIANTS`; the outputs table shows a variant's rows when it
is in :attr:`Shapes.on`. A new variant is a row here, the rows of its intermediates in the
outputs table, its request field (service.wire.schemas.variant_fields) and its math in the core
(docs/development.md, "Adding a variant").
"""

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from service.core import positions
from service.core.positions import (
    ALIBI_ORIGINS,
    Alibi,
    PositionBias,
    RelativeBias,
    alibi_slopes,
)
from service.core.types import Array
from service.core.variants import QKNorm, Temperature, Variants, temperature_factors
from service.trace.checks import engine_rule, options
from service.trace.outputs import CHAIN, latest
from service.trace.rows.latent import check_latent, latent_steps
from service.trace.rows.rope import Formulas, Req, check_rope, rope_settings, rope_steps, symbol
from service.trace.shapes import Shapes
from service.wire.errors import FieldError
from service.wire.schemas.requests import GateOptions, MultiheadRequest
from service.wire.schemas.variant_fields import (
    AlibiOptions,
    QKNormOptions,
    RopeOptions,
    VNormOptions,
)


def _none(req: Req, shapes: Shapes) -> None:
    """Nothing to check beyond the field's own validation."""


def _no_settings(req: Req) -> Variants:
    """Nothing for the engine: the variant is a weight form, or says only its steps."""
    return Variants()


def _no_steps(v: Variants, bias: PositionBias | None, s: Shapes) -> Formulas:
    return {}


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One variant: the name it is on under (Shapes.on), the outputs it adds, and what the
    rules, the plan and the steps do with it."""

    field: str  # the request field that turns it on (position_bias: alibi or relative_bias)
    outputs: tuple[str, ...] = ()  # rows of the outputs table it adds
    given: Callable[[Req], bool]  # whether the request turns it on
    check: Callable[[Req, Shapes], None] = _none  # against the shapes (d_k per head, n heads)
    settings: Callable[[Req], Variants] = _no_settings  # its part of the engine's variants
    bias: Callable[[Req], PositionBias] | None = None  # a position bias, computed with the
    # attention (service.core.positions)
    steps: Callable[[Variants, PositionBias | None, Shapes], Formulas] = _no_steps  # formulas
    uses_positions: bool = False  # reads positions / context_positions


def _heads(n: int) -> str:
    return "is 1 head" if n == 1 else f"are {n} heads"


def _numbers(a: Array, limit: int = 8) -> str:
    """A short list of numbers for a formula: [0.25, 0.0625, …] (at most ``limit``)."""
    shown = ", ".join(f"{v:.6g}" for v in a.ravel()[:limit])
    return f"[{shown}{', …' if a.size > limit else ''}]"


# ---------------------------------------------------------------------------- clip_qkv


def _clip_given(req: Req) -> bool:
    return req.clip_qkv is not None


def _check_clip(req: Req, shapes: Shapes) -> None:
    if _mla_given(req):
        raise FieldError(
            "clip_qkv",
            "clip_qkv clamps q, k and v right after their projections; MLA's come from latents "
            "and no MLA model clips them",
        )


def _clip_settings(req: Req) -> Variants:
    return Variants(clip_qkv=req.clip_qkv)


def _clip_steps(v: Variants, bias: PositionBias | None, s: Shapes) -> Formulas:
    c = v.clip_qkv
    return {
        f"{side}_clipped": f"{side.upper()}_c = clamp({side.upper()}, −{c:g}, {c:g}): every "
        f"number beyond ±clip_qkv set to ±{c:g}, right after the projection (OLMo)"
        for side in "qkv"
    }


# ------------------------------------------------------------------------------ QK-norm


def _qk_norm_given(req: Req) -> bool:
    """qk_norm is on, or (/multihead) a state dict's q_norm.weight, k_norm.weight or their
    biases are given."""
    return req.qk_norm is not False or any(_state_norm(req, o) is not None for o in _NORM_ARRAYS)


_NORM_ARRAYS = {  # the options' name of each qk_norm array, and its state dict name
    "q_weight": "q_norm.weight",
    "k_weight": "k_norm.weight",
    "q_bias": "q_norm.bias",
    "k_bias": "k_norm.bias",
}


def _state_norm(req: Req, option: str) -> Array | None:
    """/multihead's state dict form of a qk_norm array (q_norm.weight …), None when not given."""
    if not isinstance(req, MultiheadRequest):
        return None
    got: Array | None = getattr(req, _NORM_ARRAYS[option].replace(".", "_"))
    return got


def _norm_arrays(req: Req) -> dict[str, tuple[str, Array]]:
    """The qk_norm arrays given, by option name: (the field that gave it, the array); the
    state dict's name and the option's both given is a FieldError."""
    given = options(req.qk_norm, QKNormOptions)
    out: dict[str, tuple[str, Array]] = {}
    for option, state in _NORM_ARRAYS.items():
        inline = None if given is None else getattr(given, option)
        from_state = _state_norm(req, option)
        if inline is not None and from_state is not None:
            raise FieldError(
                state, f"give {state} or qk_norm.{option}, not both: both are the same array"
            )
        if from_state is not None:
            out[option] = (state, from_state)
        elif inline is not None:
            out[option] = (f"qk_norm.{option}", inline)
    return out


def _check_qk_norm(req: Req, shapes: Shapes) -> None:
    o = options(req.qk_norm, QKNormOptions) or QKNormOptions()
    d_k, one = shapes.d_k, shapes.endpoint == "attention"
    if o.over == "projection" and one:
        raise FieldError(
            "qk_norm.over",
            '"projection" normalises all heads of a token together: /attention has one head, '
            'where it is "head"; use /multihead for a layer\'s heads',
        )
    for option, (name, w) in _norm_arrays(req).items():
        heads = shapes.num_heads if option.startswith("q") else shapes.num_kv_heads
        h = "h" if option.startswith("q") else "h_kv"
        if option.endswith("bias") and o.type != "layer":
            raise FieldError(
                name, f"{name} is a bias: only a LayerNorm (qk_norm.type layer) has one"
            )
        if w.ndim == 2 and (o.over == "projection" or one):
            raise FieldError(
                name,
                f"{name} is one row per head: "
                + (
                    "over the projection the weight is one vector [h·d_k] of the whole projection"
                    if o.over == "projection"
                    else "/attention has one head; give [d_k]"
                ),
            )
        fits: list[tuple[int, ...]] = (
            [(heads * d_k,)] if o.over == "projection" else [(d_k,), (heads, d_k)]
        )
        if w.shape not in fits:
            wanted = (
                f"[{heads * d_k}] ({h} = {heads} heads × d_k = {d_k}, the whole projection)"
                if o.over == "projection"
                else f"[{d_k}] (d_k = {d_k}, shared by the heads)"
                + ("" if one else f" or [{heads}][{d_k}] (one row per head, {h} = {heads})")
            )
            hint = (
                ': one norm over the whole projection (OLMo 2) is qk_norm {"over": "projection"}'
                if o.over == "head" and w.shape == (heads * d_k,) and heads > 1
                else ""
            )
            raise FieldError(name, f"{name} has shape {list(w.shape)}: expected {wanted}{hint}")


def _qk_norm_settings(req: Req) -> Variants:
    o = options(req.qk_norm, QKNormOptions) or QKNormOptions()  # q_norm.weight alone: rms
    got = {option: a for option, (_, a) in _norm_arrays(req).items()}

    def norm(side: str) -> QKNorm:
        w, b = got.get(f"{side}_weight"), got.get(f"{side}_bias")
        return QKNorm(o.type, o.eps, w, o.zero_centered, o.after_rope, o.over, b)

    return Variants(q_norm=norm("q"), k_norm=norm("k"))


def _qk_norm(n: QKNorm, x: str) -> str:
    w = "1" if n.weight is None else "(1 + w)" if n.zero_centered else "w"
    per_head = any(a is not None and a.ndim == 2 for a in (n.weight, n.bias))
    w += " (a row per head)" if per_head and w != "1" else ""
    b = "" if n.bias is None else " + b" + (" (a row per head)" if n.bias.ndim == 2 else "")
    over = (
        "each token's h·d_k features, all heads together, before the head split (OLMo 2)"
        if n.over == "projection"
        else "each vector over its d_k features"
    )
    if n.type == "rms":
        return f"{x} / √(mean({x}²) + {n.eps:g}) · {w}, {over} (RMSNorm)"
    return f"({x} − mean) / √(var + {n.eps:g}) · {w}{b}, {over} (biased var)"


def _qk_norm_steps(v: Variants, bias: PositionBias | None, s: Shapes) -> Formulas:
    assert v.q_norm is not None and v.k_norm is not None
    when = ", after RoPE (Llama 4, HunYuan)" if v.q_norm.after_rope else ""
    q, k = symbol(s, v, "q_normed", "q"), symbol(s, v, "k_normed", "k")
    return {
        "q_normed": "Q_n = " + _qk_norm(v.q_norm, q) + when,
        "k_normed": "K_n = " + _qk_norm(v.k_norm, k).replace("h·d_k", "h_kv·d_k") + when,
    }


# ------------------------------------------------------------- temperature, v_norm, gate


def _temperature_given(req: Req) -> bool:
    return req.temperature is not None


def _temperature_settings(req: Req) -> Variants:
    assert req.temperature is not None
    t = req.temperature
    return Variants(temperature=Temperature(t.floor_scale, t.attn_scale, t.position_shift))


def _temperature_steps(v: Variants, bias: PositionBias | None, s: Shapes) -> Formulas:
    t = v.temperature
    assert t is not None
    p = np.arange(s.seq_len) if v.positions is None else v.positions  # (L,)
    factors = temperature_factors(p, t)  # (L,)
    q = symbol(s, v, "q_tempered", "q")
    shifted, whose = _TEMPERATURE_FORMS[t.position_shift]
    return {
        "q_tempered": f"Q_t = {q} · (log(⌊{shifted}/{t.floor_scale:g}⌋ + 1) · {t.attn_scale:g} + "
        f"1), each query by its position p ({whose}): {_numbers(factors)}"
    }


# the temperature's position term and whose it is, by position_shift
_TEMPERATURE_FORMS = {
    1: ("(p + 1)", "Llama 4's layers without RoPE"),
    0: ("p", "Ministral 3's llama_4_scaling_beta, after RoPE"),
}


def _v_norm_given(req: Req) -> bool:
    return options(req.v_norm, VNormOptions) is not None


def _v_norm_settings(req: Req) -> Variants:
    o = options(req.v_norm, VNormOptions)
    assert o is not None
    return Variants(v_norm=QKNorm(o.type, o.eps))


def _v_norm_steps(v: Variants, bias: PositionBias | None, s: Shapes) -> Formulas:
    assert v.v_norm is not None
    return {"v_normed": "V_n = " + _qk_norm(v.v_norm, "V").replace("d_k", "d_v") + " (Gemma 4)"}


def _rope_given(req: Req) -> bool:
    return options(req.rope, RopeOptions) is not None


def _rope_settings(req: Req) -> Variants:
    return Variants(rope=rope_settings(req)["rope"])


def _mla_given(req: Req) -> bool:
    return isinstance(req, MultiheadRequest) and req.mla is not None


def _k_eq_v_given(req: Req) -> bool:
    return isinstance(req, MultiheadRequest) and req.k_eq_v


def _gate_given(req: Req) -> bool:
    return isinstance(req, MultiheadRequest) and req.gate is not False


def _check_gate(req: Req, shapes: Shapes) -> None:
    assert isinstance(req, MultiheadRequest) and isinstance(req.gate, GateOptions)
    if shapes.d_model is None:
        raise FieldError(
            "gate", "the gate is computed from x: with q, k, v given per head there is no x"
        )
    width = shapes.num_heads * shapes.d_v
    rows, cols = req.gate.w.shape
    if (rows, cols) != (width, shapes.d_model):
        raise FieldError(
            "gate.w",
            f"gate.w is {rows}×{cols} but it must be [h·d_v][d_model] = {width}×{shapes.d_model} "
            "(out_in): one gate per feature of the heads' concat, from x",
        )
    b = req.gate.b
    if b is not None and b.shape[0] != width:
        raise FieldError("gate.b", f"gate.b has {b.shape[0]} entries; the concat has {width}")


def _gate_steps(v: Variants, bias: PositionBias | None, s: Shapes) -> Formulas:
    return {
        "gate": "G = sigmoid(X W_gᵀ + b_g) = 1 / (1 + exp(−(X W_gᵀ + b_g))), one per feature of "
        "the concat (Qwen3-Next's output gate)",
        "gated": "Concat · G, feature by feature",
    }


# ------------------------------------------------------------------ the layer's own scale


def _multiplier_given(req: Req) -> bool:
    return req.attention_multiplier is not None


def _check_multiplier(req: Req, shapes: Shapes) -> None:
    if req.scale is not None:
        raise FieldError(
            "attention_multiplier",
            "give scale or attention_multiplier, not both: attention_multiplier is the scale "
            "(Granite's name for it)",
        )


def _multiplier_settings(req: Req) -> Variants:
    return Variants(attention_multiplier=req.attention_multiplier)


def _multiplier_steps(v: Variants, bias: PositionBias | None, s: Shapes) -> Formulas:
    q, k = symbol(s, v, "scores", "q"), symbol(s, v, "scores", "k")
    m = v.attention_multiplier
    assert m is not None
    return {
        "scaled_scores": f"{q} {k}ᵀ · scale, scale = attention_multiplier = {m:.10g}, the "
        f"layer's own (Granite), not 1/√d_k = {s.d_k**-0.5:.10g}"
    }


# ------------------------------------------------------------------------- soft-capping


def _softcap_given(req: Req) -> bool:
    return req.softcap is not None


def _softcap_settings(req: Req) -> Variants:
    return Variants(softcap=req.softcap)


def _softcap_steps(v: Variants, bias: PositionBias | None, s: Shapes) -> Formulas:
    return {"capped_scores": f"c · tanh(scaled_scores / c), c = {v.softcap:g}"}


# ----------------------------------------------------------- position bias: ALiBi or T5


def _bias_given(req: Req) -> bool:
    return options(req.alibi, AlibiOptions) is not None or req.relative_bias is not None


def _check_position_bias(req: Req, shapes: Shapes) -> None:
    n = shapes.num_heads
    alibi = options(req.alibi, AlibiOptions)
    if alibi is not None and req.relative_bias is not None:
        raise FieldError(
            "relative_bias", "give alibi or relative_bias, not both: one position bias at most"
        )
    if alibi is not None and alibi.symmetric and alibi.origin != "query":
        raise FieldError(
            "alibi.origin",
            f"alibi.origin is {alibi.origin!r} but symmetric measures −slope·|p'_j − p_i| from "
            'the query: leave origin "query" (the default) with symmetric',
        )
    slopes = None if alibi is None else alibi.slopes
    if slopes is not None and slopes.shape[0] != n:
        raise FieldError(
            "alibi.slopes",
            f"alibi.slopes has {slopes.shape[0]} entries but there {_heads(n)}: one slope per head",
        )
    if req.relative_bias is not None:
        _check_relative_bias(req.relative_bias.table, n, req)


def _check_relative_bias(table: Array, n: int, req: Req) -> None:
    cols = 1 if table.ndim == 1 else table.shape[1]
    if cols != n:
        raise FieldError(
            "relative_bias.table",
            f"relative_bias.table has {cols} column(s) but there {_heads(n)}: it is num_buckets × heads",
        )
    assert req.relative_bias is not None
    with engine_rule("relative_bias"):
        positions.t5_bucket(
            np.zeros(1, dtype=np.int64),
            req.relative_bias.bidirectional,
            table.shape[0],
            req.relative_bias.max_distance,
        )


def _alibi_given(req: Req) -> bool:
    return options(req.alibi, AlibiOptions) is not None


def _bias(req: Req) -> PositionBias:
    if req.relative_bias is not None:
        b = req.relative_bias
        table = b.table if b.table.ndim == 2 else b.table[:, None]  # (num_buckets, n)
        return RelativeBias(table, b.bidirectional, b.max_distance)
    alibi = options(req.alibi, AlibiOptions)
    assert alibi is not None
    return Alibi(alibi.slopes, alibi.symmetric, alibi.origin)


# what each ALiBi origin's bias is, beside its formula
_ORIGIN_WORDS = {
    "query": "",
    "zero": " (from position 0, as BLOOM and Falcon add it; the same weights as from the query)",
    "last_key": " (from the last key, as MPT adds it; the same weights as from the query)",
}


def _bias_words(bias: PositionBias | None, h: int) -> str:
    if isinstance(bias, Alibi):
        slopes = alibi_slopes(h) if bias.slopes is None else bias.slopes
        rule = (
            "given"
            if bias.slopes is not None
            else "2^(−8h/n)"
            if h & (h - 1) == 0
            else "the paper's rule for n not a power of two"
        )
        distance = (
            "−slope · |p'_j − p_i|"
            if bias.symmetric
            else f"slope · ({ALIBI_ORIGINS[bias.origin]})" + _ORIGIN_WORDS[bias.origin]
        )
        return f"ALiBi: {distance}, slopes ({rule}) {_numbers(slopes)}"
    assert isinstance(bias, RelativeBias)
    kind = "bidirectional" if bias.bidirectional else "unidirectional"
    return (
        f"T5 relative bias: table[bucket(p'_j − p_i)][head], {bias.table.shape[0]} buckets "
        f"({kind}), distances ≥ {bias.max_distance} share the last"
    )


def _bias_steps(v: Variants, bias: PositionBias | None, s: Shapes) -> Formulas:
    so_far = latest(s, "biased_scores", CHAIN)
    return {
        "position_bias": _bias_words(bias, s.num_heads),
        "biased_scores": f"{so_far} + position_bias",
    }


# -------------------------------------------------------------------------------- sinks


def _sinks_given(req: Req) -> bool:
    return req.sinks is not None


def _sinks_settings(req: Req) -> Variants:
    return Variants(sinks=req.sinks)


def _check_sinks(req: Req, shapes: Shapes) -> None:
    """/multihead's sinks: one per head (on /attention the field is one number)."""
    n = shapes.num_heads
    if isinstance(req, MultiheadRequest) and req.sinks is not None and req.sinks.shape[0] != n:
        raise FieldError(
            "sinks", f"sinks has {req.sinks.shape[0]} entries but there are {n} heads: one per head"
        )


def _sinks_steps(v: Variants, bias: PositionBias | None, s: Shapes) -> Formulas:
    so_far = latest(s, "weights", CHAIN)
    sink = (
        f"{float(v.sinks):g}"
        if isinstance(v.sinks, float)
        else f"sinks {_numbers(np.asarray(v.sinks))} by head"
    )
    return {
        "sink_weights": f"exp(sink − m) / (Σ_j exp(s_j − m) + exp(sink − m)), s = {so_far}, m = max(max_j s_j, sink), sink = {sink}: the sink joins each row's softmax as a key with no value",
        "weights": "exp(s_j − m) / (Σ_k exp(s_k − m) + exp(sink − m)) over keys: each row sums to 1 − sink_weights",
    }


# ---------------------------------------------------------------------------- the table

_POSITIONS = ("query_positions", "key_positions")  # the outputs of the variants that read them


VARIANTS: tuple[Variant, ...] = (
    Variant(
        field="clip_qkv",
        outputs=("q_clipped", "k_clipped", "v_clipped"),
        given=_clip_given,
        check=_check_clip,
        settings=_clip_settings,
        steps=_clip_steps,
    ),
    Variant(
        field="qk_norm",
        outputs=("q_normed", "k_normed"),
        given=_qk_norm_given,
        check=_check_qk_norm,
        settings=_qk_norm_settings,
        steps=_qk_norm_steps,
    ),
    Variant(
        field="rope",
        outputs=("q_rotated", "k_rotated", *_POSITIONS, "rope_frequencies", "rope_gain"),
        given=_rope_given,
        check=check_rope,
        settings=_rope_settings,
        steps=rope_steps,
        uses_positions=True,
    ),
    # DeepSeek's multi-head latent attention: its projections are a weight form of their own
    # (service.trace.rows.latent); the row checks what goes with it and says the latents' steps
    Variant(
        field="mla",
        outputs=("c_q", "c_kv", "k_rope", "q_nope", "q_rope", "k_nope", "mla_cache_numbers"),
        given=_mla_given,
        check=check_latent,
        steps=latent_steps,
    ),
    Variant(
        field="temperature",
        outputs=("q_tempered", "query_positions"),
        given=_temperature_given,
        settings=_temperature_settings,
        steps=_temperature_steps,
        uses_positions=True,
    ),
    Variant(
        field="v_norm",
        outputs=("v_normed",),
        given=_v_norm_given,
        settings=_v_norm_settings,
        steps=_v_norm_steps,
    ),
    Variant(
        field="gate",
        outputs=("gate", "gated"),
        given=_gate_given,
        check=_check_gate,
        steps=_gate_steps,
    ),
    # the values are the keys' projection (folded into the weights by service.wire.fold);
    # the step of V says so
    Variant(field="k_eq_v", given=_k_eq_v_given),
    # Granite's scale: the plan takes it as the scale; the row says so in the scaled scores' step
    Variant(
        field="attention_multiplier",
        given=_multiplier_given,
        check=_check_multiplier,
        settings=_multiplier_settings,
        steps=_multiplier_steps,
    ),
    Variant(
        field="softcap",
        outputs=("capped_scores",),
        given=_softcap_given,
        settings=_softcap_settings,
        steps=_softcap_steps,
    ),
    Variant(
        field="position_bias",
        outputs=("position_bias", "biased_scores", *_POSITIONS),
        given=_bias_given,
        check=_check_position_bias,
        bias=_bias,
        steps=_bias_steps,
        uses_positions=True,
    ),
    # ALiBi's slopes, returned beside its bias (the position_bias row computes and says it)
    Variant(field="alibi", outputs=("alibi_slopes",), given=_alibi_given),
    Variant(
        field="sinks",
        outputs=("sink_weights",),
        given=_sinks_given,
        check=_check_sinks,
        settings=_sinks_settings,
        steps=_sinks_steps,
    ),
)


def engine_settings(req: Req, on: frozenset[str]) -> tuple[Variants, PositionBias | None]:
    """The engine's settings of the variants that are on: their parts of :class:`Variants`
    together (the positions are the plan's to add) and the position bias, if one is on."""
    rows = [row for row in VARIANTS if row.field in on]
    given: dict[str, Any] = {}
    for row in rows:
        part = row.settings(req)
        for f in fields(part):
            if getattr(part, f.name) is not None:
                assert f.name not in given, f"{f.name} set by two variants"
                given[f.name] = getattr(part, f.name)
    biases = [row.bias(req) for row in rows if row.bias is not None]
    return Variants(**given), biases[0] if biases else None
