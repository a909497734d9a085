"""RoPE as a variant's row (API.md, "Position and score variants" and its scalings): its checks
against the shapes, the engine's settings (each scaling's options as the core's class), its
step in words; and the symbols of the queries, keys and values as each step reads them (Q,
Q_n, Q_r, Q_t, V, V_n), asked of the core's chain. The row itself is in
:data:`service.trace.rows.variants.VARIANTS`."""

from collections.abc import Callable
from typing import Any

import numpy as np

from service.core import chain
from service.core.chain import Slot
from service.core.positions import PositionBias, Rope, sequence_length
from service.core.rope_scaling import (
    DynamicScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    Scaling,
    YarnScaling,
)
from service.core.variants import Variants
from service.trace.checks import options
from service.trace.shapes import Shapes
from service.wire.errors import FieldError
from service.wire.schemas.requests import AttentionRequest, MultiheadRequest
from service.wire.schemas.variant_fields import (
    Llama3ScalingOptions,
    LongRopeScalingOptions,
    RopeOptions,
)

Req = AttentionRequest | MultiheadRequest
Formulas = dict[str, str]  # step name -> its formula


def check_rope(req: Req, shapes: Shapes) -> None:
    rope = options(req.rope, RopeOptions)
    assert rope is not None
    d_k = shapes.d_k
    r = d_k if rope.rotary_dim is None else rope.rotary_dim
    if r % 2:
        raise FieldError(
            "rope.rotary_dim" if rope.rotary_dim is not None else "rope",
            f"rope turns pairs of features, so rotary_dim must be even; it is {r}"
            + ("" if rope.rotary_dim is not None else " (d_k): give an even rotary_dim below it"),
        )
    if r > d_k:
        raise FieldError("rope.rotary_dim", f"rope.rotary_dim is {r} but d_k is only {d_k}")
    if rope.style == "proportional" and d_k % 2:
        raise FieldError("rope.style", f"proportional rope turns halves of d_k, which is {d_k}")
    if rope.style == "proportional" and rope.scaling is not None:
        raise FieldError("rope.scaling", "proportional rope takes no scaling (as Gemma 4)")
    if isinstance(rope.scaling, Llama3ScalingOptions):
        s = rope.scaling
        if not s.low_freq_factor <= s.high_freq_factor:
            raise FieldError(
                "rope.scaling.high_freq_factor",
                f"rope.scaling needs low_freq_factor ≤ high_freq_factor; got {s.low_freq_factor:g} and {s.high_freq_factor:g}",
            )
    if isinstance(rope.scaling, LongRopeScalingOptions):
        for name in ("short_factor", "long_factor"):
            given = getattr(rope.scaling, name)
            if given.shape[0] != r // 2:
                raise FieldError(
                    f"rope.scaling.{name}",
                    f"rope.scaling.{name} has {given.shape[0]} entries; it needs one per "
                    f"feature pair: rotary_dim/2 = {r // 2}",
                )
            if not np.all(given > 0):
                raise FieldError(f"rope.scaling.{name}", f"rope.scaling.{name} must be > 0")


def rope_settings(req: Req) -> dict[str, Rope]:
    r = options(req.rope, RopeOptions)
    assert r is not None
    scaling = None if r.scaling is None else _SCALINGS[r.scaling.type](r.scaling)
    return {"rope": Rope(r.base, r.style, r.rotary_dim, scaling)}


# each scaling's request options as the core's settings
_SCALINGS: dict[str, Callable[[Any], Scaling]] = {
    "linear": lambda o: LinearScaling(o.factor),
    "llama3": lambda o: Llama3Scaling(
        o.factor, o.low_freq_factor, o.high_freq_factor, o.original_max_position
    ),
    "yarn": lambda o: YarnScaling(
        o.factor,
        o.original_max_position,
        o.beta_fast,
        o.beta_slow,
        o.mscale,
        o.mscale_all_dim,
        o.truncate,
        o.attention_factor,
    ),
    "dynamic": lambda o: DynamicScaling(o.factor, o.original_max_position),
    "longrope": lambda o: LongRopeScaling(
        tuple(float(f) for f in o.short_factor),
        tuple(float(f) for f in o.long_factor),
        o.original_max_position,
        o.max_position,
        o.factor,
        o.attention_factor,
    ),
}


def _rope(r: Rope, d_k: int, x: str, at: str, n: int) -> str:
    dim = d_k if r.rotary_dim is None else r.rotary_dim
    pairs = {
        "half": "(i, i + r/2)",
        "interleaved": "(2i, 2i + 1)",
        "proportional": "(i, i + d_k/2)",
    }
    theta = f"θ_i = {r.base:g}^(−2i/r), r = {dim}"
    if r.style == "proportional":
        theta = f"θ_i = {r.base:g}^(−2i/d_k) for i < {dim // 2}, the other pairs unturned"
    rest = (
        ""
        if dim == d_k or r.style == "proportional"
        else f"; feature {dim} passes unchanged"
        if dim == d_k - 1
        else f"; features {dim}…{d_k - 1} pass unchanged"
    )
    scaling = "" if r.scaling is None else r.scaling.describe(dim, r.base, n)
    return (
        f"RoPE({x}): feature pair {pairs[r.style]} of the token at position p turns by p·θ_i, "
        f"{theta}, {r.style} style{rest}{scaling}; positions {at}"
    )


def _at(given: bool, n: str) -> str:
    return "as given" if given else f"0…{n}−1"


def _key_at(v: Variants) -> str:
    """Where the keys are rotated, and which default was taken (API.md, "Self-attention
    positions"): the plan passes the queries' own positions array for a self-attention's keys
    (:func:`service.trace.plan._key_positions`)."""
    if v.positions is not None and v.context_positions is v.positions:
        return (
            "the queries' (self-attention: each key is a query's own token, so "
            "context_positions defaults to positions)"
        )
    if v.context_positions is not None:
        return "as given (context_positions)"
    if v.positions is not None:
        return (
            "0…S−1 (the keys are other tokens than the queries, so context_positions "
            "defaults to 0…S−1, not to positions)"
        )
    return "0…S−1"


def symbol(s: Shapes, v: Variants, step: str, side: Slot) -> str:
    """The queries' (``side`` "q"), keys' ("k") or values' ("v") symbol as the step ``step``
    reads them (:func:`service.core.chain.made_from`): the form before it, or the last one for
    a later step (the scores); on a decode step the new tokens' form."""
    return chain.SYMBOLS[chain.made_from(step, chain.made_with(v), slot=side)]


def rope_steps(v: Variants, bias: PositionBias | None, s: Shapes) -> Formulas:
    assert v.rope is not None
    q, k = symbol(s, v, "q_rotated", "q"), symbol(s, v, "k_rotated", "k")
    given_q = v.positions is not None
    p = s.past_len  # a decode step's new tokens come after the cache
    at = np.arange(p, p + s.seq_len) if v.positions is None else v.positions  # (L,)
    q_at = (
        _at(given_q, "L") if not p else "as given" if given_q else f"{p}…{p}+L−1 (after the cache)"
    )
    k_at = _key_at(v) if not p else "the new tokens', as the queries'"
    return {
        "q_rotated": f"Q_r = {_rope(v.rope, s.d_k, q, q_at, sequence_length(at))}",
        "k_rotated": f"K_r = {_rope(v.rope, s.d_k, k, k_at, sequence_length(at))}",
    }
