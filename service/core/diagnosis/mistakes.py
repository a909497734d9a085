"""The mistakes the diagnosis knows (API.md's two tables), one row each: when it can have
happened, the ways it is tried, and a learner's sentence with the computation's numbers. How a
mistake changes a step is that step's (:mod:`service.core.diagnosis.stages`); which sets are tried, and
in what order, is :mod:`service.core.diagnosis.search`'s. NumPy only, no I/O."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from service.core import chain, masks
from service.core.diagnosis import gradients
from service.core.diagnosis.stages import (
    ALL,
    BOOLEAN,
    CAUSAL,
    CHANGES,
    FIT,
    GAIN,
    ONE_POSITION,
    TWICE,
    RowPolicy,
    Setup,
    Way,
)
from service.core.rope_scaling import (
    DynamicScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    Scaling,
    YarnScaling,
)

FLOAT32 = "float32_arithmetic"  # no recomputation: a difference of float32's size
FLOAT32_RELATIVE = 1e-5  # ... is at most this times the largest number of the array
ROPE_BASES = (10_000.0, 500_000.0, 1_000_000.0)  # RoPE's, Llama 3's, Qwen's (rope_theta)
# partial_rotary_factor of the models that turn part of each head: GPT-NeoX/Pythia's and
# StableLM's rotary_pct 0.25, ChatGLM's and Persimmon's 0.5, Phi-2's 0.4
PARTIAL_FACTORS = (0.25, 0.5, 0.4)
# what masked scores are filled with instead of −∞: 0 (torch.tril(scores), scores * mask), or
# a large negative number — the Annotated Transformer's −1e9, transformers' finfo(float32).min,
# GPT-2's −1e4 give the same weights (exp of each is 0 next to an allowed key), and differ
# from −∞ only in a row whose every key is masked
ZERO_FILL, LARGE_FILL = 0.0, -1e9


@dataclass(frozen=True)
class Seen:
    """What a sentence may cite: the computation, how the mistakes were made, and the
    caller's array (what its columns and rows sum to where they all agree, when it is the
    weights; its largest difference relative to the service's largest number)."""

    setup: Setup
    rows: RowPolicy
    ways: Mapping[str, Way]
    column_sum: float | None = None
    row_sum: float | None = None
    relative: float = 0.0


@dataclass(frozen=True)
class Mistake:
    """One code: ``tried`` says whether it can have happened in this computation (``present``:
    the arrays it has), ``ways`` how many ways it is tried, ``sentence`` what it was, and
    ``likely`` whether the request makes it the likelier of sets that reproduce the numbers
    equally (API.md, "When two explanations fit")."""

    code: str
    tried: Callable[[Setup, frozenset[str]], bool]
    sentence: Callable[[Seen], str]
    ways: Callable[[Setup], tuple[Way, ...]] = lambda s: ()
    likely: Callable[[Setup], bool] = lambda s: False


def _changes_a_step(code: str) -> Callable[[Setup, frozenset[str]], bool]:
    """``tried`` for a mistake in a step of a variant: whether this computation has a step the
    mistake changes (:data:`~service.core.diagnosis.stages.CHANGES`)."""
    kinds = {kind for kind, change in CHANGES.items() if code in change.mistakes}
    steps = frozenset(step.name for step in chain.HEAD + chain.BLOCK if step.kind in kinds)
    return lambda s, present: not steps.isdisjoint(present)


def _scale(s: Setup) -> str:
    if abs(s.scale * np.sqrt(s.d_k) - 1.0) < 1e-12:
        return f"{s.scale:.4g} = 1/√{s.d_k}"
    return f"{s.scale:.4g}, as given"


def _root(s: Setup) -> str:
    return f"√d_k = {np.sqrt(s.d_k):.4g}"


def _style(s: Setup) -> tuple[str, str]:
    style = s.variants.rope.style if s.variants.rope is not None else "half"
    return style, "interleaved" if style == "half" else "half"


def _rows(seen: Seen) -> str:
    return {"zero": "zeros", "uniform": "1/S each", "nan": "NaN"}[seen.rows]


def _model_dims(s: Setup) -> tuple[Way, ...]:
    """√d_model (the input's width) and √(h·d_k), where they differ from √d_k."""
    dims = [] if s.x_in is None else [s.x_in.shape[-1]]
    dims += [] if s.num_heads is None else [s.num_heads * s.d_k]
    return tuple(float(d) for d in dict.fromkeys(dims) if d != s.d_k)


def _model_dim(seen: Seen) -> str:
    s, dim = seen.setup, int(seen.ways["scale_by_model_dim"])
    names = ["√d_model"] if s.x_in is not None and s.x_in.shape[-1] == dim else []
    names += ["√(h·d_k)"] if s.num_heads is not None and s.num_heads * s.d_k == dim else []
    return (
        f"the scores were divided by {' = '.join(names)} = √{dim} = {np.sqrt(dim):.4g} "
        f"instead of by {_root(s)} of one head"
    )


def _inverted(seen: Seen) -> str:
    s = seen.setup
    if abs(s.scale * np.sqrt(s.d_k) - 1.0) < 1e-12:
        return f"the scores were multiplied by {_root(s)} instead of divided by it"
    return f"the scores were divided by the scale ({_scale(s)}) instead of multiplied by it"


def _after_softmax(seen: Seen) -> str:
    text = (
        "the mask was applied to the weights after the softmax: the masked weights were set "
        "to 0, but the softmax had already shared each row among every key"
    )
    if seen.ways["mask_after_softmax"] == "renormalised":
        return (
            f"{text}; dividing each row by its sum gave the right weights again, except in a "
            "row with no key allowed, where 0/0 left NaN. Mask the scores with −∞ before "
            "the softmax"
        )
    return f"{text}, so your rows sum to less than 1. Mask the scores with −∞ before the softmax"


def _windows(s: Setup) -> list[masks.Window]:
    return [m for m in s.mask_specs if isinstance(m, masks.Window)]


def _window(seen: Seen) -> str:
    shift = int(seen.ways["window_off_by_one"])
    window = _windows(seen.setup)[0]
    sides = [("left", window.left), ("right", window.right or None)]
    asked = [(side, n) for side, n in sides if n is not None]
    used = ", ".join(f"{side} = {max(n + shift, 0)}" for side, n in asked)
    wanted = ", ".join(f"{side} = {n}" for side, n in asked)
    text = (
        f"the sliding window kept one key {'more' if shift > 0 else 'fewer'} than asked on "
        f"each bounded side ({used} where {wanted} was asked)"
    )
    if window.right:
        return text
    return (
        f"{text}: Hugging Face's sliding_window = W keeps W keys including the query's own, "
        "which is left = W − 1 here, as flash-attention's window_size = (W − 1, 0)"
    )


def _banded(s: Setup) -> list[masks.Window | masks.Chunked]:
    """The request's windows that bound a side (a window of ``right`` = 0 alone is the causal
    mask) and its chunks: what window_missing leaves out."""
    return [
        m
        for m in s.mask_specs
        if isinstance(m, masks.Chunked)
        or (isinstance(m, masks.Window) and (m.left is not None or m.right not in (None, 0)))
    ]


def _window_missing(seen: Seen) -> str:
    band = _banded(seen.setup)[0]
    if isinstance(band, masks.Chunked):
        n = band.size
        return (
            f"the chunked attention (chunks of {n} positions, Llama 4's attention_chunk_size) "
            "was never applied, only the causal part: each query saw every earlier key instead "
            f"of the earlier keys of its own chunk (⌊i/{n}⌋ = ⌊j/{n}⌋). "
            "scaled_dot_product_attention(is_causal=True) has no chunks: pass the chunked mask "
            "(transformers' chunked_causal_mask_function) as attn_mask"
        )
    sides = [] if band.left is None else [f"left = {band.left}"]
    sides += [] if band.right in (None, 0) else [f"right = {band.right}"]
    asked = ", ".join(sides)
    if band.right != 0:
        causal = any(isinstance(m, masks.Causal) for m in seen.setup.mask_specs)
        return (
            f"the window ({asked}) was never applied: every query saw every "
            f"{'earlier ' if causal else ''}key. Apply the band (i − left ≤ j ≤ i + right) to "
            "the scores before the softmax"
        )
    left = band.left
    return (
        f"the sliding window ({asked}: each query sees its own key and the {left} before it) "
        "was never applied, only the causal part: every query saw every earlier key. "
        "scaled_dot_product_attention(is_causal=True) has no window: pass the band "
        f"(i − {left} ≤ j ≤ i) as attn_mask, or flash-attn's window_size = ({left}, 0)"
    )


def _projects(s: Setup, present: frozenset[str]) -> bool:
    """Whether the heads go through a square W_o (another shape is told by the shapes)."""
    w_o = s.w_o
    return w_o is not None and w_o.shape[0] == w_o.shape[1] and "projected" in present


def _projection_missing(seen: Seen) -> str:
    plus = "" if seen.setup.b_o is None else " + b_o"
    return (
        "the output projection was never applied: your numbers are the heads' outputs side by "
        f"side (concat), where the layer's output is concat W_o{plus}. Pass the concatenated "
        "heads through the output projection (self.o_proj, nn.MultiheadAttention's out_proj) "
        "before returning them"
    )


def _grouped(s: Setup, present: frozenset[str]) -> bool:
    """Grouped-query attention with more than one key/value head (one: tile and interleave
    agree)."""
    h, h_kv = s.num_heads, s.num_kv_heads
    return h is not None and h_kv is not None and 1 < h_kv < h and not s.latent


def _kv_repeated(seen: Seen) -> str:
    s = seen.setup
    h, h_kv = s.num_heads or 0, s.num_kv_heads or 0
    g = h // h_kv if h_kv else 0
    return (
        f"the {h_kv} key/value heads were repeated as a tile (k.repeat(1, {g}, 1, 1), "
        f"np.tile: query head i used key/value head i mod {h_kv}) where each serves a block "
        f"of {g} consecutive query heads (query head i uses key/value head ⌊i/{g}⌋): repeat "
        f"them with repeat_interleave({g}, dim=1), as transformers' repeat_kv and "
        "scaled_dot_product_attention(enable_gqa=True) do"
    )


def _fill(seen: Seen) -> str:
    fill = float(seen.ways["mask_not_infinite"])
    if fill == 0.0:
        return (
            "the masked scores were set to 0 instead of −∞ (torch.tril(scores) or scores * mask "
            "zero them), so each masked key kept the weight exp(0 − max) in the softmax. Fill "
            "them with −∞ before the softmax: scores.masked_fill(~mask, float('-inf'))"
        )
    return (
        "the masked scores were filled with a large finite number instead of −∞ (-1e9, "
        "torch.finfo(torch.float32).min as transformers fills, GPT-2's -1e4): exp of it is 0 "
        "next to an allowed key, but a row whose every key is masked shares its weight equally "
        "among them (1/S each) where −∞ leaves it empty. Fill with float('-inf') and zero "
        'such rows, or ask for "fully_masked_rows": "uniform" if your model means it'
    )


def _fills(s: Setup) -> tuple[Way, ...]:
    """The fills mask_not_infinite is tried with: 0, and a large one where the request's mask
    leaves a query (not a padded one) with no key — the only place its numbers differ from
    −∞'s (masked scores at or below −1e9 compare as masked)."""
    cached = 0 if s.past is None else s.past.length
    combined = masks.combine(list(s.mask_specs), s.batch, s.seq_len, s.ctx_len, cached)
    empty = ~combined.allowed.any(axis=-1) & ~combined.padded_queries  # (B, L)
    return (ZERO_FILL, LARGE_FILL) if empty.any() else (ZERO_FILL,)


def _misaligned(s: Setup, present: frozenset[str]) -> bool:
    """A causal mask with L ≠ S (a decode step's included): the two alignments differ."""
    return s.seq_len != s.ctx_len and any(isinstance(m, masks.Causal) for m in s.mask_specs)


def _alignment(seen: Seen) -> str:
    s = seen.setup
    big, shift = s.seq_len, s.ctx_len - s.seq_len
    causal = next(m for m in s.mask_specs if isinstance(m, masks.Causal))
    if s.past is not None:
        p = s.past.length
        text = (
            f"the decode step's causal mask was aligned upper-left from the first key "
            f"(scaled_dot_product_attention's is_causal=True with {big} new "
            f"quer{'y' if big == 1 else 'ies'} and {s.ctx_len} keys: query i saw keys 0 … i) "
            f"where the new tokens come after the cache's {p}: query i sees keys 0 … {p} + i. "
            "With a cache, pass is_causal=False for one new token, or a lower-right mask "
            "(torch.nn.attention.bias.causal_lower_right(L, S)) for several"
        )
    elif causal.alignment == "lower_right":
        text = (
            "the causal mask was aligned upper-left (query i sees keys 0 … i, as "
            "scaled_dot_product_attention's is_causal=True) where lower-right was asked (query "
            f"i sees keys 0 … i + {shift}: the last query sees every key, as a decode step or "
            "FlashAttention's causal=True): pass torch.nn.attention.bias.causal_lower_right(L, "
            "S) as attn_mask"
        )
    else:
        text = (
            f"the causal mask was aligned lower-right (query i sees keys 0 … i + {shift}, as "
            "FlashAttention's causal=True since 2.1 or causal_lower_right) where upper-left "
            "was asked (query i sees keys 0 … i, as is_causal=True): if your model aligns it "
            'so, set the causal mask\'s "alignment": "lower_right"; else mask with '
            "tril(ones(L, S))"
        )
    return text + ("" if seen.rows == "zero" else f"; your fully masked rows hold {_rows(seen)}")


def _float32(seen: Seen) -> str:
    return (
        "no mistake: your numbers agree with ours to float32's precision (the largest "
        f"difference is {seen.relative:.1e} of the array's largest number; float32 keeps about "
        "7 significant digits): numbers computed in float32, or by a stock transformers layer, "
        "which computes its RoPE tables, RMSNorms and eager softmax in float32 even in float64. "
        "Compute those steps in float64 to compare closer, or compare with a tolerance of "
        "about 1e-6"
    )


_INVERTED: tuple[tuple[Way, type[masks.MaskSpec]], ...] = (
    (BOOLEAN, masks.Boolean),
    (CAUSAL, masks.Causal),
)


def _inversions(s: Setup) -> tuple[Way, ...]:
    """How mask_inverted is tried: the request's boolean masks (key_padding_mask's included)
    read the other way, and its causal mask handed over inverted."""
    kinds = {type(m) for m in s.mask_specs}
    return tuple(way for way, kind in _INVERTED if kind in kinds)


def _inverted_mask(seen: Seen) -> str:
    rows = "" if seen.rows == "zero" else f"; your fully masked rows hold {_rows(seen)}"
    if seen.ways["mask_inverted"] == CAUSAL:
        return (
            "the causal mask was applied inverted: each query attended to the keys after it and "
            "hid itself and every earlier key, as torch.triu(ones(L, S), 1).bool() (the keys to "
            "hide) handed to scaled_dot_product_attention as attn_mask does, where a boolean "
            "mask's True means attend (not masked). Pass torch.tril(ones(L, S)).bool(), the "
            "inverse ~mask, or is_causal=True" + rows
        )
    return (
        "a boolean mask was read with the opposite polarity (every true and false "
        "swapped). Here a mask's true means the query may attend (as "
        'scaled_dot_product_attention) unless the mask says "true_means": "masked" (as '
        "nn.MultiheadAttention's attn_mask), and key_padding_mask's true means padding: flip "
        "the setting, or your mask" + rows
    )


def _has_mask(s: Setup, present: frozenset[str]) -> bool:
    return bool(s.mask_specs)


def _rope_bases(s: Setup) -> tuple[Way, ...]:
    """The common bases, then one fitted to the caller's numbers (any base: 20000, 8·10⁶)
    where the head turns a pair besides the first (whose frequency is 1 whatever the base)."""
    rope = s.variants.rope
    asked = rope.base if rope is not None else None
    turned = s.d_k if rope is None or rope.rotary_dim is None else rope.rotary_dim
    fit: tuple[Way, ...] = (FIT,) if turned >= 4 else ()
    return (*(b for b in ROPE_BASES if b != asked), *fit)


def _base(base: float) -> str:
    """A base as a person writes it: 20,000; 1,000,000; 12,345.6789 where it is not whole."""
    return f"{base:,.0f}" if base == round(base) else f"{base:,.6f}".rstrip("0")


def _base_wrong(seen: Seen) -> str:
    s, used = seen.setup, float(seen.ways["rope_base_wrong"])
    asked = s.variants.rope.base if s.variants.rope is not None else 10_000.0
    return (
        f"the rotary embedding used base {_base(used)} where {_base(asked)} was asked "
        "(rope.base, Hugging Face's rope_theta; 10,000 is the original RoPE's, 500,000 Llama "
        "3's, 1,000,000 Qwen's): build the frequencies 1/base^(2i/d) from the model's "
        "rope_theta"
    )


def _partials(s: Setup) -> tuple[Way, ...]:
    """How partial_rotary_wrong is tried: every feature turned where the request turns only
    the first rotary_dim; where it turns the whole head, only the first r = int(factor·d_k)
    of a common partial_rotary_factor (as transformers computes it: even, 0 < r < d_k)."""
    rope = s.variants.rope
    if rope is None or s.latent:
        return ()
    if rope.rotary_dim is not None and rope.rotary_dim < s.d_k:
        return (ALL,)
    dims = (int(f * s.d_k) for f in PARTIAL_FACTORS)
    return tuple(float(r) for r in dict.fromkeys(dims) if 0 < r < s.d_k and r % 2 == 0)


def _partial(seen: Seen) -> str:
    s, way = seen.setup, seen.ways["partial_rotary_wrong"]
    d_k, rope = s.d_k, s.variants.rope
    if way == ALL:
        r = rope.rotary_dim if rope is not None and rope.rotary_dim is not None else d_k
        return (
            f"every one of the head's {d_k} features was rotated where only the first {r} "
            f"were meant (rope.rotary_dim = {r}, Hugging Face's partial_rotary_factor = "
            f"{r / d_k:g}): rotate q[..., :{r}] and k[..., :{r}] with θ_i = base^(−2i/{r}) "
            f"and pass the other {d_k - r} features through unchanged, as transformers' "
            "GPT-NeoX and Phi layers split them"
        )
    r = int(way)
    return (
        f"only the first {r} of the head's {d_k} features were rotated (partial_rotary_factor "
        f"= {r / d_k:g}, as GPT-NeoX's rotary_pct or Phi's partial_rotary_factor) where the "
        f"request rotates the whole head: if your model turns part of each head, set "
        f"rope.rotary_dim to {r}; else rotate all {d_k} features"
    )


# each scaling's rope_type and what it does, in a learner's words
_SCALINGS: dict[type[Scaling], tuple[str, str]] = {
    LinearScaling: ("linear", "positions divided by its factor"),
    Llama3Scaling: ("llama3", "Llama 3.1's long wavelengths slowed by its factor"),
    YarnScaling: ("yarn", "YaRN's slowed frequencies"),
    DynamicScaling: ("dynamic", "dynamic NTK's larger base past the original length"),
    LongRopeScaling: ("longrope", "LongRoPE's per-pair factors"),
}


def _scaled(s: Setup, present: frozenset[str]) -> bool:
    rope = s.variants.rope
    scaled = rope is not None and rope.scaling is not None and not s.latent
    return scaled and _changes_a_step("rope_scaling_missing")(s, present)


def _scaling_ways(s: Setup) -> tuple[Way, ...]:
    """The scaling left out whole, and, where it has an attention factor (YaRN's mscale,
    LongRoPE's), only that factor on cos and sin; for YaRN's, also that factor applied twice
    (cos and sin × mscale where the table read already carries it)."""
    rope = s.variants.rope
    if rope is None or rope.scaling is None:
        return ()
    if rope.scaling.attention_factor == 1.0:
        return ("scaling",)
    return ("scaling", GAIN, *((TWICE,) if isinstance(rope.scaling, YarnScaling) else ()))


def _scaling_missing(seen: Seen) -> str:
    rope = seen.setup.variants.rope
    assert rope is not None and rope.scaling is not None
    kind, what = _SCALINGS.get(type(rope.scaling), ("its", "the scaled frequencies"))
    gain = rope.scaling.attention_factor
    if seen.ways["rope_scaling_missing"] == TWICE:
        return (
            f"YaRN's attention factor {gain:.6g} was applied twice: cos and sin were multiplied "
            f"by it where the table already carried it (× {gain**2:.6g} in all, transformers' "
            "attention_scaling on top of a cos and sin that include mscale), so the scores carry "
            f"g⁴ = {gain**4:.6g} where g² = {gain**2:.6g} was meant: multiply cos and sin by "
            "the factor once"
        )
    if seen.ways["rope_scaling_missing"] == GAIN:
        return (
            f"the rotary embedding used the request's {kind} frequencies but left out its "
            f"attention factor {gain:.6g} on cos and sin ({'YaRN' if kind == 'yarn' else kind}"
            "'s mscale, transformers' attention_scaling: cos = emb.cos() · attention_scaling): "
            "multiply cos and sin by it"
        )
    factor = "" if gain == 1.0 else f", and its attention factor {gain:.6g} on cos and sin"
    return (
        f"the rotary embedding left out the request's {kind} scaling (rope.scaling: {what}"
        f"{factor}): your numbers are RoPE's default frequencies 1/base^(2i/d). Build cos and "
        f"sin as the model's rope_parameters (rope_scaling) say, as transformers' "
        f'ROPE_INIT_FUNCTIONS["{kind}"] does'
        + ("" if gain == 1.0 else ", the attention factor included")
    )


def _decode_offsets(s: Setup) -> tuple[Way, ...]:
    """From 0 (the common bug) first, one ahead or behind, every new token at one position
    (several new tokens), then any whole offset fitted to the numbers."""
    one: tuple[Way, ...] = (ONE_POSITION,) if s.seq_len > 1 else ()
    return ("from_zero", 1.0, -1.0, *one, FIT)


def _decode_offset(seen: Seen) -> str:
    s, way = seen.setup, seen.ways["decode_position_offset"]
    p = s.variants.positions
    first = int(p[0]) if p is not None else 0
    cached = 0 if s.past is None else s.past.length
    after = (
        f"after the cache's {cached} token{'' if cached == 1 else 's'} "
        "(position_ids = cache length + arange(L), transformers' cache_position)"
    )
    if way == ONE_POSITION:
        return (
            f"the {s.seq_len} new tokens were all rotated at position {first} where they sit "
            f"at {first} … {first + s.seq_len - 1}: in a decode step they come one after "
            f"another {after}, not all at the cache's length"
        )
    shift = -first if way == "from_zero" else int(way)
    new, come = (
        ("the new token was", "it comes")
        if s.seq_len == 1
        else ("the new tokens were", "they come")
    )
    why = (
        ""
        if way == "from_zero" or abs(shift) == 1
        else "; the cache's length counted twice"
        if shift == cached
        else f"; positions {shift} too {'high' if shift > 0 else 'low'} (left padding "
        "counted, or a position counter that jumped)"
    )
    return (
        f"{new} rotated from position {first + shift} instead of {first}: in a decode step "
        f"{come} {after}{why}"
    )


def _own_scale(s: Setup) -> bool:
    """Whether the scale is not 1/√d_k: the layer (or the request) sets its own."""
    return bool(abs(s.scale * np.sqrt(s.d_k) - 1.0) > 1e-12)


def _config_scale(seen: Seen) -> str:
    s = seen.setup
    m = s.variants.attention_multiplier
    own = (
        f"attention_multiplier = {m:.4g} (Granite)"
        if m is not None
        else "1/√d_k · mscale² of its YaRN scaling (MLA)"
        if s.latent
        else f"scale = {s.scale:.4g}"
    )
    return (
        f"the scores were scaled by 1/√d_k = {1 / np.sqrt(s.d_k):.4g} where the layer sets its "
        f"own scale, {own}: read the layer's scaling (transformers' self.scaling), not the "
        "default"
    )


def _clip(seen: Seen) -> str:
    c = seen.setup.variants.clip_qkv
    return (
        f"q, k and v were never clamped to ±{c:g} (clip_qkv, as OLMo clamps each projection "
        "right after computing it): your numbers are what they give unclipped"
    )


def _token_by_token(s: Setup) -> bool:
    """Whether the steps before the scores work token by token (batch_as_sequence)."""
    v = s.variants
    plain = v.rope is None and v.position_bias is None and v.sinks is None
    return s.batch > 1 and s.seq_len == s.ctx_len and not s.mask_specs and plain


def _multi(s: Setup) -> bool:
    return s.num_heads is not None and s.num_heads > 1


def _square(s: Setup) -> bool:
    p = s.projections
    ws = [] if s.x_in is None or p is None else [p.w_q, p.w_k, p.w_v]
    ws += [] if s.w_o is None else [s.w_o]
    return any(w.shape[0] == w.shape[1] for w in ws)


TABLE: tuple[Mistake, ...] = (
    Mistake(
        "softmax_over_queries",
        lambda s, p: s.seq_len > 1,
        lambda e: (
            "the softmax ran over the queries (axis 0, down each column) instead of over "
            "the keys of each row (axis −1)"
            + (
                ""
                if e.column_sum is None
                else f": each column of your weights sums to {e.column_sum:.4g}"
            )
        ),
    ),
    Mistake(
        "scale_after_softmax",
        lambda s, p: s.scale != 1.0,
        lambda e: (
            f"the scores were multiplied by the scale ({_scale(e.setup)}) after the "
            "softmax instead of before it"
            + ("" if e.row_sum is None else f": each row of your weights sums to {e.row_sum:.4g}")
        ),
    ),
    Mistake(
        "scale_missing",
        lambda s, p: s.scale != 1.0,
        lambda e: (
            "the scores were never scaled: softmax(Q Kᵀ) where softmax(Q Kᵀ · scale) was "
            f"meant (scale {_scale(e.setup)})"
        ),
    ),
    Mistake(
        "scale_by_d_k",
        lambda s, p: s.scale != 1.0 / s.d_k,
        lambda e: f"the scores were divided by d_k = {e.setup.d_k} instead of by {_root(e.setup)}",
    ),
    Mistake(
        "weights_transposed",
        lambda s, p: _square(s),
        lambda e: (
            "a projection used the transposed weight matrix (X Wᵀ where X W was meant, or "
            "the reverse): PyTorch's nn.Linear weights are (out, in) and need "
            '"weight_layout": "out_in"; notebook weights (in, out) need "in_out"'
        ),
    ),
    Mistake(
        "q_k_swapped",
        lambda s, p: s.seq_len == s.ctx_len,
        lambda e: (
            "the scores are transposed: K Qᵀ (a row per key) where Q Kᵀ (a row per query, "
            "a column per key) was meant"
        ),
    ),
    Mistake("mask_inverted", lambda s, p: bool(_inversions(s)), _inverted_mask, _inversions),
    Mistake(
        "causal_diagonal_masked",
        lambda s, p: any(isinstance(m, masks.Causal) for m in s.mask_specs),
        lambda e: (
            "the causal mask also hid each query's own key (triu(ones, 0) where "
            "triu(ones, 1) was meant): a query sees itself and every earlier key; your fully "
            f"masked first row holds {_rows(e)}"
        ),
    ),
    Mistake(
        "layer_norm_over_all",
        lambda s, p: s.norm is not None and s.norm.over == "features",
        lambda e: (
            "the layer norm normalised the whole matrix at once instead of each token "
            "over its own features (nn.LayerNorm(d_model))"
        ),
    ),
    Mistake(
        "layer_norm_per_token",
        lambda s, p: s.norm is not None and s.norm.over == "all",
        lambda e: (
            "the layer norm normalised each token over its own features where this "
            'request asks for the whole matrix ("over": "all")'
        ),
    ),
    Mistake(
        "unbiased_variance",
        lambda s, p: s.norm is not None,
        lambda e: (
            "the layer norm divided the variance by n − 1 (torch.var's and pandas' "
            "default) instead of n, as nn.LayerNorm does"
        ),
    ),
    Mistake(
        "heads_interleaved",
        lambda s, p: _multi(s),
        lambda e: (
            "the heads took every h-th column (head i: columns i, i + h, …) instead of "
            "contiguous blocks (head i: columns i·d_k … (i+1)·d_k − 1, as PyTorch splits them)"
        ),
        lambda s: ("interleaved", "blocks"),  # how the heads were put side by side again
    ),
    Mistake(
        "rope_style_swapped",
        _changes_a_step("rope_style_swapped"),
        lambda e: (
            f'the rotary embedding paired the features "{_style(e.setup)[1]}" where '
            f'"{_style(e.setup)[0]}" was meant; if your model rotates that way, set rope.style to '
            f'"{_style(e.setup)[1]}"'
        ),
    ),
    Mistake(
        "scale_by_model_dim",
        lambda s, p: bool(_model_dims(s)),
        _model_dim,
        _model_dims,
    ),
    Mistake("scale_inverted", lambda s, p: abs(s.scale) != 1.0, _inverted),
    Mistake(
        "mask_after_softmax",
        _has_mask,
        _after_softmax,
        lambda s: ("zeroed", "renormalised"),
    ),
    Mistake(
        "mask_missing",
        _has_mask,
        lambda e: (
            "the request's mask was never applied: every query attended to every key"
            + (
                ", padding included"
                if any(isinstance(m, masks.Padding) for m in e.setup.mask_specs)
                else ""
            )
        ),
    ),
    Mistake(
        "window_off_by_one",
        lambda s, p: bool(_windows(s)),
        _window,
        lambda s: (1.0, -1.0),
    ),
    Mistake(
        "heads_merged_without_transpose",
        lambda s, p: _multi(s) and "concat" in p,
        lambda e: (
            "the heads' outputs (B, h, L, d_v) were reshaped straight to (B, L, h·d_v) "
            "without moving the head axis back first: out.transpose(1, 2).reshape(B, L, h·d_v) "
            "was meant"
        ),
    ),
    Mistake(
        "batch_as_sequence",
        lambda s, p: _token_by_token(s),
        lambda e: (
            "the batch and sequence axes were swapped: a batch-first (B, L, d) tensor "
            "went into a sequence-first layer (nn.MultiheadAttention without batch_first=True), so "
            f"at each position the {e.setup.batch} items of the batch attended to each other. "
            "Pass batch_first=True, or transpose(0, 1) on the way in and out"
        ),
    ),
    Mistake(
        "rope_missing",
        _changes_a_step("rope_missing"),
        lambda e: (
            "the queries and keys were never rotated: the request asks for RoPE, and "
            "your numbers are what they give without it"
        ),
    ),
    Mistake(
        "rope_base_wrong",
        _changes_a_step("rope_base_wrong"),
        _base_wrong,
        _rope_bases,
    ),
    Mistake(
        "decode_position_offset",
        lambda s, p: s.past is not None and _changes_a_step("decode_position_offset")(s, p),
        _decode_offset,
        _decode_offsets,
        # a cache says a decode step: a new token at 0 is one that forgot it, not RoPE left
        # out (the rotation at 0 turns nothing, so rope_missing reproduces it as well)
        likely=lambda s: s.past is not None,
    ),
    Mistake(FLOAT32, lambda s, p: True, _float32),
    # the third edition's (API.md, "Compare, third edition")
    Mistake("scale_from_config_ignored", lambda s, p: _own_scale(s), _config_scale),
    Mistake("clip_missing", _changes_a_step("clip_missing"), _clip),
    Mistake("kv_heads_repeated_wrong", _grouped, _kv_repeated),
    Mistake("window_missing", lambda s, p: bool(_banded(s)), _window_missing),
    Mistake("output_projection_missing", _projects, _projection_missing),
    Mistake(
        "softmax_over_batch",
        lambda s, p: s.batch > 1,
        lambda e: (
            f"the softmax ran over the batch (axis 0 of the [B][L][S] scores: the {e.setup.batch} "
            "items' weights for each query and key sum to 1) instead of over the keys of each "
            "row: F.softmax without dim picks dim 0 for a 3-D tensor (its deprecation warning "
            "says so). Pass dim=-1"
        ),
    ),
    Mistake("causal_alignment_swapped", _misaligned, _alignment),
    Mistake("mask_not_infinite", _has_mask, _fill, _fills),
    Mistake(
        "partial_rotary_wrong",
        lambda s, p: bool(_partials(s)) and _changes_a_step("partial_rotary_wrong")(s, p),
        _partial,
        _partials,
    ),
    Mistake("rope_scaling_missing", _scaled, _scaling_missing, _scaling_ways),
)
MISTAKES: tuple[str, ...] = tuple(m.code for m in TABLE)  # the contract's order


# ---- the backward's (API.md, "The backward pass, every step": "Compare works on gradients")


def _diagonal(seen: Seen) -> str:
    return (
        "your dS has no −D term: dS = P ∘ dP takes the softmax's Jacobian as its diagonal, "
        "but it is not diagonal (∂P_ij/∂S_ik = P_ij (δ_jk − P_ik): every weight of a row moves "
        "when one score does). Subtract each row's D_i = Σ_j P_ij dP_ij (= rowsum(dO ∘ O)): "
        "dS = P ∘ (dP − D), as dS = P * (dP - (P * dP).sum(-1, keepdim=True))"
    )


def _unweighted(seen: Seen) -> str:
    every = seen.ways.get(gradients.UNWEIGHTED) == gradients.EVERY_KEY
    over = (
        "over every key of the row, the masked ones included (dP.sum(-1))"
        if every
        else "over the allowed keys"
    )
    return (
        f"your row term D is the plain sum of dP {over}, D_i = Σ_j dP_ij, where it is "
        "weighted by the weights: D_i = Σ_j P_ij dP_ij (= rowsum(dO ∘ O), the output's row "
        "times its gradient's). The softmax's Jacobian gives dS_ij = P_ij (dP_ij − Σ_k P_ik "
        "dP_ik): D = (P * dP).sum(-1, keepdim=True)"
    )


def _grad_scale(seen: Seen) -> str:
    s = seen.setup
    return (
        f"your dQ and dK leave out the scale {_scale(s)}: the forward multiplied the scores by "
        "it, so the way back multiplies their gradient by it too — dQ = (dS · s) K, "
        f"dK = (dS · s)ᵀ Q. Yours are 1/s = {1 / s.scale:.4g} times ours"
    )


def _transposed_grad(seen: Seen) -> str:
    way = seen.ways.get(gradients.TRANSPOSED)
    dv = (
        "your dV = P dO is missing a transpose: O = P V gives each value row j to every query "
        "i with the weight P_ij, so V_j's gradient gathers over the queries, dV = Pᵀ dO "
        "(P.transpose(-2, -1) @ dO)"
    )
    dk = (
        "your dK = dS Q (· s) is missing a transpose: S = Q Kᵀ scores key j against every "
        "query i, so K_j's gradient gathers down column j, dK = dSᵀ Q (· s) "
        "(dS.transpose(-2, -1) @ Q)"
    )
    text = {gradients.DV: dv, gradients.DK: dk}.get(way or gradients.BOTH, f"{dv}; and {dk}")
    return f"{text}. With as many queries as keys (L = S) the shapes could not catch it"


def _rope_forward(seen: Seen) -> str:
    mla = (
        " — on this MLA layer the rope features' gradients, q_pe's and the shared k_pe's "
        "(the nope features are not turned), with DeepSeek's interleaved layout undone first "
        "where the forward laid the pairs out"
        if seen.setup.latent is not None
        else ""
    )
    return (
        "your gradient was rotated forward, by +θ as the forward rotates the queries and keys, "
        "where it goes back by −θ: a rotation's gradient is its transpose, the turn the other "
        "way (the same cos, sin negated: dX = dX_r cos − rotate_half(dX_r) sin, with the "
        f"scaling's attention factor where there is one){mla}"
    )


def _not_summed(seen: Seen) -> str:
    s = seen.setup
    if s.latent is not None:
        return _rope_key_not_summed(seen)
    h, h_kv = s.num_heads or 0, s.num_kv_heads or 0
    g = h // h_kv if h_kv else 0
    r = int(seen.ways.get(gradients.NOT_SUMMED, 0))
    first = f"query head {r}" if h_kv == 1 else f"query head j·{g} + {r}"
    return (
        f"each shared key/value head's gradient was taken from one query head of its group "
        f"({first} for key/value head j) instead of summed over the {g} query heads it serves: "
        "repeating K and V for the query heads (repeat_kv, repeat_interleave) copies them, and "
        f"a copy's gradient is the sum of its copies' — dK_j = Σ over the group of the query "
        f"heads' dK (dk.view(B, {h_kv}, {g}, S, d).sum(2)), and dV likewise"
    )


def _rope_key_not_summed(seen: Seen) -> str:
    h = seen.setup.num_heads or 0
    r = int(seen.ways.get(gradients.NOT_SUMMED, 0))
    return (
        f"the shared rope key's gradient (grad_k_rope) was taken from query head {r} instead "
        f"of summed over the {h} heads that read it: MLA computes one rotated k_pe per token "
        "and expands it to every head (k_pe.expand(-1, h, -1, -1)), and an expanded "
        "tensor's gradient is the sum of its copies' — dk_pe = Σ over the heads of the rope "
        "part of each head's dK (dk[..., qk_nope_head_dim:].sum(1))"
    )


def _unweighted_ways(s: Setup) -> tuple[Way, ...]:
    """D summed over the allowed keys, and, where a mask is given, over every key."""
    every = (gradients.EVERY_KEY,) if s.mask_specs else ()
    return (gradients.ALLOWED_KEYS, *every)


def _member_ways(s: Setup) -> tuple[Way, ...]:
    """Which query head of each group the gradient was taken from (the first, …, the last);
    on an MLA layer, which of all the heads that share its rope key."""
    h, h_kv = s.num_heads or 1, 1 if s.latent is not None else s.num_kv_heads or 1
    return tuple(float(r) for r in range(h // h_kv))


def _shared_kv(s: Setup, present: frozenset[str]) -> bool:
    """Grouped-query attention's key/value heads each read by several query heads, or MLA's
    one rope key read by every head (its k_nope and V are each head's own)."""
    h, h_kv = s.num_heads, s.num_kv_heads
    if s.latent is not None:
        return h is not None and h > 1
    return h is not None and h_kv is not None and h_kv < h


BACKWARD: tuple[Mistake, ...] = (
    Mistake(gradients.DIAGONAL, lambda s, p: True, _diagonal),
    Mistake(gradients.UNWEIGHTED, lambda s, p: True, _unweighted, _unweighted_ways),
    Mistake(gradients.SCALE_MISSING, lambda s, p: s.scale != 1.0, _grad_scale),
    Mistake(
        gradients.TRANSPOSED,
        lambda s, p: s.seq_len == s.ctx_len,
        _transposed_grad,
        lambda s: (gradients.DV, gradients.DK, gradients.BOTH),
    ),
    Mistake(
        gradients.ROPE_FORWARD,
        lambda s, p: s.variants.rope is not None,
        _rope_forward,
    ),
    Mistake(gradients.NOT_SUMMED, _shared_kv, _not_summed, _member_ways),
)
"""The backward's mistakes, tried only on a gradient (and only they are: the forward the
gradients read matched, or was the service's)."""
CODES: tuple[str, ...] = MISTAKES + tuple(m.code for m in BACKWARD)  # every code, in order
BY_CODE: dict[str, Mistake] = {m.code: m for m in TABLE + BACKWARD}

_SCALES = frozenset(
    {
        "scale_after_softmax",
        "scale_missing",
        "scale_by_d_k",
        "scale_by_model_dim",
        "scale_inverted",
        "scale_from_config_ignored",
    }
)
_MASKS = (
    "mask_inverted",
    "causal_diagonal_masked",
    "mask_after_softmax",
    "window_off_by_one",
    "window_missing",
    "mask_not_infinite",
)
# the scale's value, each wrong one in place of the request's: one at a time
_SCALE_VALUES = _SCALES - {"scale_after_softmax"}
# what real code divides the weights by when it scales after the softmax: the ViT tutorial's
# F.softmax(energy) / emb_size ** (1/2), copied into many repositories (√d_model). Not
# scale_missing (no scale anywhere: scale_missing alone), nor another value no code is known for
_AFTER_SOFTMAX_BY = frozenset({"scale_by_model_dim"})
# Ways of doing the same thing, or mistakes that exclude each other: a pair inside one of
# these sets is never tried.
EXCLUSIVE: tuple[frozenset[str], ...] = (
    _SCALE_VALUES,
    *(frozenset({"scale_after_softmax", c}) for c in sorted(_SCALE_VALUES - _AFTER_SOFTMAX_BY)),
    frozenset({"layer_norm_over_all", "layer_norm_per_token"}),
    frozenset({"rope_missing", "rope_style_swapped"}),
    frozenset({"rope_missing", "rope_base_wrong"}),
    frozenset({"rope_missing", "decode_position_offset"}),
    frozenset({"rope_missing", "partial_rotary_wrong"}),
    frozenset({"rope_missing", "rope_scaling_missing"}),
    frozenset({"heads_interleaved", "heads_merged_without_transpose"}),
    frozenset({"window_missing", "window_off_by_one"}),  # one window: left out, or off by one
    frozenset({"mask_after_softmax", "mask_not_infinite"}),  # where the mask is applied, how
    frozenset({"softmax_over_queries", "softmax_over_batch"}),  # the softmax's one axis
    *(frozenset({"mask_missing", m}) for m in _MASKS),
    frozenset({gradients.DIAGONAL, gradients.UNWEIGHTED}),  # no D, or a wrong one
)


def applicable(s: Setup, present: frozenset[str], backward: bool = False) -> tuple[str, ...]:
    """The mistakes that could have happened in this computation (``present``: the names of
    the arrays it has) and are tried by recomputing, in table order (float32 arithmetic is
    no recomputation: the diagnosis looks at every one for it): the forward's, or with
    ``backward`` (the array to explain is a gradient) the backward's."""
    table = BACKWARD if backward else TABLE
    return tuple(m.code for m in table if m.code != FLOAT32 and m.tried(s, present))


def ways(s: Setup) -> dict[str, tuple[Way, ...]]:
    """The ways each mistake with several is tried in this computation."""
    return {m.code: w for m in TABLE + BACKWARD if (w := m.ways(s))}


def likelier(s: Setup) -> frozenset[str]:
    """The codes this request makes likelier than others that reproduce the numbers as well."""
    return frozenset(m.code for m in TABLE + BACKWARD if m.likely(s))


def _scaled_after_by_model_dim(seen: Seen) -> str:
    s, dim = seen.setup, int(seen.ways["scale_by_model_dim"])
    name = "√d_model" if s.x_in is not None and s.x_in.shape[-1] == dim else "√(h·d_k)"
    sums = "" if seen.row_sum is None else f": each row of your weights sums to {seen.row_sum:.4g}"
    return (
        f"Two mistakes in one line: the weights were divided by {name} = √{dim} = "
        f"{np.sqrt(dim):.4g} after the softmax of the unscaled scores, softmax(Q Kᵀ) / "
        f"{name} (the ViT tutorial's F.softmax(energy) / emb_size ** (1/2)), where the scores "
        f"were meant to be divided by {_root(s)} of one head before it, softmax(Q Kᵀ / √d_k)" + sums
    )


# pairs whose two mistakes are made in one stroke, told in one sentence
TOGETHER: dict[frozenset[str], Callable[[Seen], str]] = {
    frozenset({"scale_after_softmax", "scale_by_model_dim"}): _scaled_after_by_model_dim,
}


def explain(codes: tuple[str, ...], seen: Seen) -> str:
    """A learner's sentences for a diagnosis's mistakes, with this computation's numbers."""
    mistakes = [BY_CODE[c].sentence(seen) for c in codes if c != FLOAT32]
    if not mistakes:
        return _float32(seen) + "."
    if FLOAT32 in codes:
        return (
            f"{mistakes[0]}. Your numbers also carry float32 rounding: they agree with that "
            f"recomputation to {seen.relative:.1e} of the array's largest number"
        ) + "."
    if len(mistakes) == 1:
        return mistakes[0] + "."
    if (together := TOGETHER.get(frozenset(codes))) is not None:
        return together(seen) + "."
    return (
        "Two mistakes: "
        + "; and ".join(f"({n}) {s[0].lower()}{s[1:]}" for n, s in enumerate(mistakes, 1))
        + "."
    )
