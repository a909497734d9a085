"""Position variants of attention: rotary embeddings (RoPE), ALiBi and T5 relative bias.

Shapes use paper names: n heads, L queries, S keys, d_k query/key width. ``positions`` (L,)
are the queries' token positions and ``context_positions`` (S,) the keys'; both are integers
(default 0 … L−1 and 0 … S−1, chosen by the caller). The relative position of key j seen from
query i is ``p'_j − p_i`` (T5's "memory position − query position"): negative for earlier keys.
"""

import math
from dataclasses import dataclass
from decimal import Context, Decimal

import numpy as np
from numpy.typing import NDArray

from service.core.errors import AttentionInputError, require_finite
from service.core.rope_scaling import Scaling, default_frequencies
from service.core.types import Array, IntArray, RopeStyle

MAX_POSITION = 2**53  # |p| above this is not exact in float64 (and p' − p could overflow int64)


@dataclass(frozen=True)
class Rope:
    """Rotary position embedding settings (Su et al. 2021)."""

    base: float = 10000.0  # HF: rope_theta
    style: RopeStyle = "half"
    rotary_dim: int | None = None  # None = d_k; even, ≤ d_k
    scaling: Scaling | None = None


def check_positions(positions: IntArray, length: int | None, what: str) -> None:
    """Refuse positions that are not a list of ``length`` (any if None) integers within ±2^53."""
    if positions.ndim != 1 or (length is not None and positions.shape[0] != length):
        wanted = "" if length is None else f"{length} "
        raise AttentionInputError(
            f"{what} must be a list of {wanted}integers (one per token), got shape "
            f"{list(positions.shape)}"
        )
    if not np.issubdtype(positions.dtype, np.integer):
        raise AttentionInputError(f"{what} must be integers")
    if positions.size and np.abs(positions.astype(np.float64)).max() > MAX_POSITION:
        raise AttentionInputError(f"{what} must lie between −2^53 and 2^53")


def _relative_positions(positions: IntArray, context_positions: IntArray) -> NDArray[np.int64]:
    """(L, S): p'_j − p_i, the key's position minus the query's (exact: |p| ≤ 2^53)."""
    check_positions(positions, None, "positions")
    check_positions(context_positions, None, "context_positions")
    p = positions.astype(np.int64)
    p_ctx = context_positions.astype(np.int64)
    return p_ctx[None, :] - p[:, None]  # (L, S)


# --- RoPE -------------------------------------------------------------------------------------


def rope_frequencies(
    rotary_dim: int, base: float, scaling: Scaling | None = None, n: int = 1
) -> Array:
    """(rotary_dim/2,): the rotation frequency θ_i of each feature pair i for a sequence whose
    largest position is n − 1: θ_i = base^(−2i/rotary_dim) (Su et al. 2021, eq. 15; computed as
    transformers does, ``1 / base^(2i/rotary_dim)``), changed by the ``scaling``
    (:mod:`service.core.rope_scaling`)."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise AttentionInputError(f"rope rotary_dim must be even and > 0, got {rotary_dim}")
    if not (math.isfinite(base) and base > 0):
        raise AttentionInputError(f"rope base must be a finite number > 0, got {base}")
    if scaling is None:
        theta = default_frequencies(rotary_dim, base)  # (r/2,)
    else:
        scaling.check()
        theta = scaling.frequencies(rotary_dim, base, n)  # (r/2,)
        if not math.isfinite(scaling.attention_factor):
            raise AttentionInputError(
                f"rope scaling's attention factor is {scaling.attention_factor} (from its factor "
                "and mscale): give a smaller mscale or mscale_all_dim, or an attention_factor"
            )
    if not np.isfinite(theta).all():
        how = "" if scaling is None else " with its scaling (a factor this small divides θ)"
        raise AttentionInputError(
            f"rope base {base:g}{how} makes a rotation frequency θ_i overflow float64: "
            "use a base of 1 or more, or a larger scaling factor"
        )
    return theta


def rope_angles(positions: IntArray, frequencies: Array, scaling: Scaling | None = None) -> Array:
    """(n, r/2): the angle p·θ_i by which token p's feature pair i turns (p/f with linear
    scaling)."""
    check_positions(positions, None, "positions")
    p = positions.astype(np.float64)  # (n,)
    if scaling is not None:
        p = scaling.positions(p)
    with np.errstate(over="ignore", invalid="ignore"):  # refused just below
        angles = p[:, None] * frequencies[None, :]  # (n, r/2)
    if not np.isfinite(angles).all():
        largest = int(np.abs(positions).max())
        raise AttentionInputError(
            f"rope angles p·θ_i overflow float64 at position {largest}: a rotation frequency "
            f"of up to {float(np.abs(frequencies).max()):g} (from the base and the scaling) "
            "is too fast; use a base of 1 or more, or a larger scaling factor"
        )
    return angles


def rotate_half(x: Array) -> Array:
    """(..., r) -> (..., r): [x1, x2] -> [−x2, x1], the halves of the last axis (transformers)."""
    half = x.shape[-1] // 2
    return np.concatenate((-x[..., half:], x[..., :half]), axis=-1)


def rotate_every_two(x: Array) -> Array:
    """(..., r) -> (..., r): each pair (x_2i, x_2i+1) -> (−x_2i+1, x_2i) (GPT-J, RoFormer)."""
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def sequence_length(positions: IntArray) -> int:
    """n = the largest position + 1: what dynamic NTK and LongRoPE scale by (1 when empty)."""
    return int(positions.max()) + 1 if positions.size else 1


def rope_theta(settings: Rope, d_k: int, length: int) -> Array:
    """θ_i the rotation of a head of width ``d_k`` takes, for a sequence of ``length``:
    :func:`rope_frequencies` of the ``rotary_dim`` turned features with the scaling, ``(r/2,)``;
    ``"proportional"`` (Gemma 4): θ_i = base^(−2i/d_k) for the first r/2 of the head's d_k/2
    pairs and 0 (unturned) for the others, ``(d_k/2,)``."""
    r = d_k if settings.rotary_dim is None else settings.rotary_dim
    if settings.style == "proportional":
        turned = rope_frequencies(d_k, settings.base, None)[: r // 2]  # (r/2,) over d_k
        return np.concatenate((turned, np.zeros(d_k // 2 - r // 2)))  # (d_k/2,)
    return rope_frequencies(r, settings.base, settings.scaling, length)  # (r/2,)


def rope_gain(settings: Rope) -> float:
    """The factor on cos and sin: the scaling's attention factor (YaRN, LongRoPE), else 1."""
    return 1.0 if settings.scaling is None else settings.scaling.attention_factor


def rope(x: Array, positions: IntArray, settings: Rope, length: int | None = None) -> Array:
    """Rotate ``x (..., n, d_k)`` by its tokens' ``positions (n,)``; returns ``(..., n, d_k)``.

    RoPE (Su et al. 2021, "RoFormer"): feature pair i of the token at position p turns by the
    angle p·θ_i (:func:`rope_frequencies`, :func:`rope_angles`), so that the score of a rotated
    query and key depends only on the offset between their positions. ``"half"`` pairs feature
    i with feature i + r/2 (``x·cos + rotate_half(x)·sin``: transformers' LLaMA, GPT-NeoX,
    Qwen, Mistral); ``"interleaved"`` pairs features 2i and 2i+1 (RoFormer, GPT-J, Meta's
    original LLaMA). Only the first r = ``rotary_dim`` features turn (partial rotary, GPT-NeoX
    ``rotary_pct``); the others pass through unchanged. ``"proportional"`` (Gemma 4,
    ``_compute_proportional_rope_parameters``) pairs feature i with i + d_k/2 over the whole
    head, with θ_i = base^(−2i/d_k) for the first r/2 pairs and the other pairs unturned. A
    scaling's attention factor multiplies cos and sin. ``length``: the sequence's n for the
    scalings that depend on it (default: the largest of ``positions`` + 1; the keys take the
    queries').
    """
    d_k, n = x.shape[-1], x.shape[-2]
    r = d_k if settings.rotary_dim is None else settings.rotary_dim
    if r > d_k:
        raise AttentionInputError(f"rope rotary_dim ({r}) must not exceed d_k ({d_k})")
    check_positions(positions, n, "positions")
    size = sequence_length(positions) if length is None else length
    if settings.style == "proportional":
        if d_k % 2:
            raise AttentionInputError(f"proportional rope needs an even d_k, got {d_k}")
        r = d_k  # every pair of the head, the unturned ones with θ = 0
    theta = rope_theta(settings, d_k, size)  # (r/2,)
    angles = rope_angles(positions, theta, settings.scaling)  # (n, r/2)
    gain = rope_gain(settings)
    if settings.style == "interleaved":
        cos = np.repeat(np.cos(angles), 2, axis=-1) * gain  # (n, r): a_0, a_0, a_1, a_1, …
        sin = np.repeat(np.sin(angles), 2, axis=-1) * gain  # (n, r)
        turn = rotate_every_two
    else:
        cos = np.cos(np.concatenate((angles, angles), axis=-1)) * gain  # (n, r): [a, a]
        sin = np.sin(np.concatenate((angles, angles), axis=-1)) * gain  # (n, r)
        turn = rotate_half
    x_rot = x[..., :r]  # (..., n, r)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        rotated = x_rot * cos + turn(x_rot) * sin  # (..., n, r)
    require_finite(rotated, "the rotated vectors (RoPE)")
    return np.concatenate((rotated, x[..., r:]), axis=-1)  # (..., n, d_k)


# --- ALiBi ------------------------------------------------------------------------------------


def alibi_slopes(n: int) -> Array:
    """(n,): the ALiBi slope of each head (Press et al. 2022, "Train Short, Test Long").

    For n a power of two, head h (1-based) has slope 2^(−8h/n). Otherwise, with p the largest
    power of two below n: the p slopes for p heads, then the 1st, 3rd, 5th, … slopes for 2p
    heads (2^(−8·1/2p), 2^(−8·3/2p), …) until there are n (the paper's ``get_slopes``).
    """
    if n < 1:
        raise AttentionInputError(f"ALiBi needs at least one head, got {n}")
    p = 1 << (n.bit_length() - 1)  # largest power of two ≤ n
    h = np.arange(1, p + 1, dtype=np.float64)  # (p,)
    slopes = np.exp2(-8.0 * h / p)  # (p,)
    if p == n:
        return slopes
    odd = np.arange(1, 2 * (n - p), 2, dtype=np.float64)  # (n − p,): 1, 3, 5, …
    return np.concatenate((slopes, np.exp2(-8.0 * odd / (2 * p))))  # (n,)


# where ALiBi measures a key's distance from: {origin: its words}. The paper's (and the
# service's default) is the query's position; BLOOM and Falcon (build_alibi_tensor) add
# slope · p'_j, the key's position (its padding's cumulative sum − 1) alone; MPT
# (build_mpt_alibi_tensor) slope · (p'_j − p'_{S−1}), from the last key. A constant per query row
# leaves the softmax unchanged, so the weights agree; position_bias and biased_scores do not.
ALIBI_ORIGINS = {
    "query": "p'_j − p_i",
    "zero": "p'_j",
    "last_key": "p'_j − p'_last",
}


def alibi_bias(
    slopes: Array,
    positions: IntArray,
    context_positions: IntArray,
    symmetric: bool = False,
    origin: str = "query",
) -> Array:
    """(n, L, S): the ALiBi bias ``slope_h · (p'_j − p_i)`` (Press et al. 2022).

    0 where key and query share a position, −slope·distance to earlier keys (and +slope·distance
    to later ones); with ``symmetric`` ``−slope_h · |p'_j − p_i|`` (bidirectional encoders).
    ``origin`` (:data:`ALIBI_ORIGINS`) "zero": ``slope_h · p'_j`` (BLOOM's and Falcon's
    ``build_alibi_tensor``); "last_key": ``slope_h · (p'_j − p'_{S−1})`` (MPT's
    ``build_mpt_alibi_tensor``); symmetric only from the query. ``slopes (n,)`` usually come
    from :func:`alibi_slopes`.
    """
    if slopes.ndim != 1 or not np.isfinite(slopes).all():
        raise AttentionInputError("ALiBi slopes must be a list of finite numbers, one per head")
    if origin not in ALIBI_ORIGINS:
        raise AttentionInputError(f"ALiBi origin {origin!r}: one of {', '.join(ALIBI_ORIGINS)}")
    if symmetric and origin != "query":
        raise AttentionInputError(
            "a symmetric ALiBi measures |p'_j − p_i|: its origin is the query"
        )
    rel = _relative_positions(positions, context_positions)  # (L, S): p'_j − p_i
    if origin == "zero":
        rel = rel + positions.astype(np.int64)[:, None]  # p'_j
    elif origin == "last_key" and context_positions.size:
        rel = rel + (positions.astype(np.int64)[:, None] - int(context_positions[-1]))
    dist = rel.astype(np.float64)  # (L, S)
    if symmetric:
        dist = -np.abs(dist)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        bias = slopes[:, None, None] * dist[None]  # (n, L, S)
    require_finite(bias, "the ALiBi bias (slope · distance)")
    return bias


# --- T5 relative bias -------------------------------------------------------------------------

# transformers takes torch.log of a float32 tensor, which on x86-64 is Intel MKL's vmsLn (VML_HA:
# within 1 ulp, not always correctly rounded) whatever ATEN_CPU_CAPABILITY says, and MKL picks its
# code path by CPU at run time. At a T5 tie (see t5_bucket) that last bit decides the bucket, so
# transformers' bucket there depends on the machine. With torch 2.13.0 (MKL 2024.2), of the 31
# (b, max_distance, distance) ties where some path leaves the correctly rounded logarithm's
# bucket (b ≤ 128 buckets per direction, max_distance ≤ 1024), MKL's AVX-512 path (Intel Xeon)
# gives that bucket at all 31, its AVX2 path (Intel CPUs without AVX-512) a neighbour at 28, and
# its SSE4.2 path (the one the earlier table, measured on an AMD EPYC, matches) a neighbour at 28.
# The service takes the correctly rounded logarithm on every machine.
_NEAR_MIDPOINT_ULPS = 16  # float64 logs this close to a float32 midpoint are decided exactly


def _exact_log_f32(x: float) -> np.float32:
    """The float32 nearest to ln(x), x > 0, from ``decimal``'s 50-digit logarithm (correctly
    rounded, computed in software: the same on every machine)."""
    ln = Decimal(x).ln(Context(prec=50))
    guess = np.float32(float(ln))
    below = np.nextafter(guess, np.float32(-np.inf))
    above = np.nextafter(guess, np.float32(np.inf))
    return min((below, guess, above), key=lambda c: abs(Decimal(float(c)) - ln))


def _log_f32(x: NDArray[np.float32]) -> NDArray[np.float32]:
    """The correctly rounded float32 natural logarithm of float32 ``x`` ≥ 1, same shape.

    NumPy's float64 logarithm rounded to float32. Its last float64 bit depends on the CPU (NumPy's
    AVX-512 log differs from glibc's ``log`` for ~0.05 % of arguments), which can only change the
    float32 when the float64 value lies within a few float64 ulps of a float32 midpoint: those
    (15 float32s in [1, 2^24]) are decided exactly by :func:`_exact_log_f32`. One of them,
    0x1.2f1fd6p+3 ≈ 9.4726, is a double-rounding case: its float64 logarithm rounds onto the
    midpoint and then to the wrong float32.
    """
    log = np.log(x.astype(np.float64))  # (...,) within a few float64 ulps on any CPU
    out = log.astype(np.float32)  # (...,)
    side = np.where(log >= out, np.float32(np.inf), np.float32(-np.inf))  # (...,)
    other = np.nextafter(out, side)  # (...,): the float32 neighbour on log's side of out
    midpoint = (out.astype(np.float64) + other.astype(np.float64)) / 2  # (...,) exact
    near = np.abs(log - midpoint) <= _NEAR_MIDPOINT_ULPS * np.spacing(log)  # (...,)
    for i in np.flatnonzero(near):  # ~1 argument in 10^7
        out.flat[i] = _exact_log_f32(float(x.flat[i]))
    return out


def t5_bucket(
    relative_position: NDArray[np.int64],
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> NDArray[np.int64]:
    """The T5 bucket (Raffel et al. 2020) of each relative position ``p'_j − p_i``, same shape.

    As T5's ``_relative_position_bucket`` (Mesh TensorFlow; transformers): when bidirectional,
    half the buckets are for keys after the query (``relative_position > 0``) and the distance
    is |relative_position|; otherwise only earlier keys count (later ones are distance 0). Of
    the b buckets left, distances below b/2 get a bucket each; larger ones share logarithmic
    bins up to ``max_distance``, beyond which all fall in the last bucket.

    A distance d ≥ m = b/2 (integer division) falls in bucket
    ``min(m + trunc(log(d / m) / log(max_distance / m) · (b − m)), b − 1)``, computed as
    transformers does: every step rounded to float32 (``f32(d) / f32(m)``, its logarithm,
    divided by ``f32(math.log(max_distance / m))``, times ``b − m``). Where the exact value is
    an integer (``d / m`` and ``max_distance / m`` powers of one number, e.g. 12/8 and 27/8 =
    (3/2)^1 and (3/2)^3) or within float32 rounding of one, the bucket depends on the last bit
    of the float32 logarithm, and so does transformers' bucket: torch's float32 log is MKL's,
    not always correctly rounded, and its last bit there depends on the CPU, through MKL's
    AVX-512, AVX2 and SSE4.2 code paths (PyTorch's own AVX2/AVX-512 kernels,
    ``ATEN_CPU_CAPABILITY``, do not change it). The service's convention is the correctly rounded
    float32 logarithm (:func:`_log_f32`), on every machine. Its buckets equal transformers' on
    MKL's AVX-512 path for every relative position when b ≤ 128 and max_distance ≤ 1024
    (checked exhaustively by the tests; once up to max_distance 4096 too); on the AVX2 and SSE4.2
    paths (Intel CPUs without AVX-512; AMD EPYC) too, except at 28 ties on each path (max_distance
    ≤ 1024), where they are one bucket apart.
    """
    b = num_buckets // 2 if bidirectional else num_buckets
    max_exact = b // 2
    if max_exact < 1:
        raise AttentionInputError(
            f"relative_bias needs at least {4 if bidirectional else 2} buckets, got {num_buckets}"
        )
    if max_distance <= max_exact:
        raise AttentionInputError(
            f"relative_bias max_distance ({max_distance}) must exceed the {max_exact} exact buckets"
        )
    rel = relative_position.astype(np.int64)
    if bidirectional:
        offset = (rel > 0).astype(np.int64) * b  # keys after the query: upper half
        distance = np.abs(rel)
    else:
        offset = np.zeros_like(rel)
        distance = -np.minimum(rel, 0)
    # float32 at every step, as transformers (distances below max_exact never reach the log)
    ratio = np.maximum(distance, max_exact).astype(np.float32) / np.float32(max_exact)
    log_bin = (
        _log_f32(ratio) / np.float32(math.log(max_distance / max_exact)) * np.float32(b - max_exact)
    )
    large = np.minimum(max_exact + log_bin.astype(np.int64), b - 1)  # truncated, as .to(long)
    return offset + np.where(distance < max_exact, distance, large)


def relative_bias(
    table: Array,
    positions: IntArray,
    context_positions: IntArray,
    bidirectional: bool = True,
    max_distance: int = 128,
) -> Array:
    """(n, L, S): T5's learned relative position bias ``table[bucket(p'_j − p_i)][h]``.

    ``table (num_buckets, n)`` holds one learned scalar per bucket and head (T5's
    ``relative_attention_bias`` embedding); the bucket is :func:`t5_bucket`'s.
    """
    if table.ndim != 2 or not np.isfinite(table).all():
        raise AttentionInputError(
            "relative_bias table must be num_buckets rows of finite numbers, one per head"
        )
    rel = _relative_positions(positions, context_positions)  # (L, S)
    bucket = t5_bucket(rel, bidirectional, table.shape[0], max_distance)  # (L, S)
    return np.moveaxis(table[bucket], -1, 0)  # (L, S, n) -> (n, L, S)


# --- either bias, as a request names it ------------------------------------------------------


@dataclass(frozen=True)
class Alibi:
    """ALiBi settings: explicit slopes (one per head) or the paper's (None), and symmetry."""

    slopes: Array | None = None  # (n,)
    symmetric: bool = False
    origin: str = "query"  # where distances start (ALIBI_ORIGINS)


@dataclass(frozen=True)
class RelativeBias:
    """T5 relative position bias settings: the learned table and its bucketing."""

    table: Array  # (num_buckets, n)
    bidirectional: bool = True
    max_distance: int = 128


PositionBias = Alibi | RelativeBias


def position_bias(
    spec: PositionBias, num_heads: int, positions: IntArray, context_positions: IntArray
) -> Array:
    """(n, L, S): the ALiBi or T5 bias of ``num_heads`` heads for queries at ``positions (L,)``
    and keys at ``context_positions (S,)``."""
    if isinstance(spec, Alibi):
        slopes = alibi_slopes(num_heads) if spec.slopes is None else spec.slopes  # (n,)
        return alibi_bias(slopes, positions, context_positions, spec.symmetric, spec.origin)
    return relative_bias(
        spec.table, positions, context_positions, spec.bidirectional, spec.max_distance
    )


def rope_backward(
    grad: Array, positions: IntArray, settings: Rope, length: int | None = None
) -> Array:
    """The gradient through :func:`rope` (same ``positions``, ``settings`` and ``length``) given
    ``grad (..., n, d_k)`` of the rotated vectors: the rotation's transpose, each pair turned
    back by −p·θ_i and times the scaling's attention factor, ``grad·cos − turn(grad·sin)``
    (turn is antisymmetric: its transpose is −turn); the unturned features pass as they are."""
    d_k = grad.shape[-1]
    r = d_k if settings.style == "proportional" else settings.rotary_dim or d_k  # turned
    size = sequence_length(positions) if length is None else length
    angles = rope_angles(positions, rope_theta(settings, d_k, size), settings.scaling)  # (n, r/2)
    gain = rope_gain(settings)
    if settings.style == "interleaved":
        cos = np.repeat(np.cos(angles), 2, axis=-1) * gain  # (n, r)
        sin = np.repeat(np.sin(angles), 2, axis=-1) * gain
        turn = rotate_every_two
    else:
        cos = np.cos(np.concatenate((angles, angles), axis=-1)) * gain  # (n, r)
        sin = np.sin(np.concatenate((angles, angles), axis=-1)) * gain
        turn = rotate_half
    g = grad[..., :r]  # (..., n, r)
    return np.concatenate((g * cos - turn(g * sin), grad[..., r:]), axis=-1)  # (..., n, d_k)
