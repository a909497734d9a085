"""Position variants of attention: rotary embeddings (RoPE), ALiBi and T5 relative bias.

Shapes use paper names: n heads, L queries, S keys, d_k query/key width. ``positions`` (L,)
are the queries' token positions and ``context_positions`` (S,) the keys'; both are integers
(default 0 … L−1 and 0 … S−1, chosen by the caller). The relative position of key j seen from
query i is ``p'_j − p_i`` (T5's "memory position − query position"): negative for earlier keys.
"""

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.core.errors import AttentionInputError, require_finite
from service.core.types import Array, IntArray, RopeStyle

MAX_POSITION = 2**53  # |p| above this is not exact in float64 (and p' − p could overflow int64)


@dataclass(frozen=True)
class LinearScaling:
    """Linear position interpolation (kaiokendev; Chen et al. 2023): positions divided by f."""

    factor: float


@dataclass(frozen=True)
class Llama3Scaling:
    """LLaMA 3.1 frequency scaling: long wavelengths slowed by ``factor``, short ones kept,
    a smooth blend between (Hugging Face ``rope_type: "llama3"``)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192  # HF: original_max_position_embeddings


RopeScaling = LinearScaling | Llama3Scaling


@dataclass(frozen=True)
class Rope:
    """Rotary position embedding settings (Su et al. 2021)."""

    base: float = 10000.0  # HF: rope_theta
    style: RopeStyle = "half"
    rotary_dim: int | None = None  # None = d_k; even, ≤ d_k
    scaling: RopeScaling | None = None


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


def _check_scaling(scaling: RopeScaling | None) -> None:
    if scaling is None:
        return
    if not (math.isfinite(scaling.factor) and scaling.factor > 0):
        raise AttentionInputError("rope scaling factor must be a finite number > 0")
    if isinstance(scaling, Llama3Scaling):
        low, high = scaling.low_freq_factor, scaling.high_freq_factor
        if not (math.isfinite(low) and math.isfinite(high) and 0 < low < high):
            raise AttentionInputError(
                "rope llama3 scaling needs 0 < low_freq_factor < high_freq_factor (finite)"
            )
        if scaling.original_max_position <= 0:
            raise AttentionInputError("rope llama3 original_max_position must be > 0")


def rope_frequencies(rotary_dim: int, base: float, scaling: RopeScaling | None = None) -> Array:
    """(rotary_dim/2,): the rotation frequency θ_i of each feature pair i.

    θ_i = base^(−2i/rotary_dim) (Su et al. 2021, eq. 15; computed as transformers does,
    ``1 / base^(2i/rotary_dim)``). With :class:`Llama3Scaling` the frequencies are rescaled as
    transformers' ``_compute_llama3_parameters`` (LLaMA 3.1): with wavelength λ_i = 2π/θ_i and
    λ_low = original_max_position / low_freq_factor, λ_high = original_max_position /
    high_freq_factor, θ_i is kept when λ_i < λ_high, divided by ``factor`` when λ_i > λ_low,
    and otherwise blended ``(1 − s)·θ_i/factor + s·θ_i`` with
    ``s = (original_max_position/λ_i − low_freq_factor) / (high_freq_factor − low_freq_factor)``.
    :class:`LinearScaling` leaves the frequencies alone: it divides the positions instead
    (:func:`rope_angles`), as the API contract states it.
    """
    if rotary_dim <= 0 or rotary_dim % 2:
        raise AttentionInputError(f"rope rotary_dim must be even and > 0, got {rotary_dim}")
    if not (math.isfinite(base) and base > 0):
        raise AttentionInputError(f"rope base must be a finite number > 0, got {base}")
    _check_scaling(scaling)
    two_i = np.arange(0, rotary_dim, 2, dtype=np.float64)  # (r/2,)
    theta = 1.0 / base ** (two_i / rotary_dim)  # (r/2,)
    if isinstance(scaling, Llama3Scaling):
        theta = _llama3_frequencies(theta, scaling)
    return theta


def _llama3_frequencies(theta: Array, s: Llama3Scaling) -> Array:
    """LLaMA 3.1's piecewise rescaling of θ (see :func:`rope_frequencies`)."""
    old_context = float(s.original_max_position)
    low_wavelen = old_context / s.low_freq_factor  # longer than this: slowed by factor
    high_wavelen = old_context / s.high_freq_factor  # shorter than this: kept
    wavelen = 2 * math.pi / theta  # (r/2,)
    smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * theta / s.factor + smooth * theta  # (r/2,)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    out = np.where(wavelen > low_wavelen, theta / s.factor, theta)  # (r/2,)
    return np.where(medium, blended, out)


def rope_angles(
    positions: IntArray, frequencies: Array, scaling: RopeScaling | None = None
) -> Array:
    """(n, r/2): the angle p·θ_i by which token p's feature pair i turns.

    With :class:`LinearScaling` the positions are divided by its factor first: (p/f)·θ_i.
    """
    check_positions(positions, None, "positions")
    p = positions.astype(np.float64)  # (n,)
    if isinstance(scaling, LinearScaling):
        _check_scaling(scaling)
        p = p / scaling.factor
    return p[:, None] * frequencies[None, :]  # (n, r/2)


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


def rope(x: Array, positions: IntArray, settings: Rope) -> Array:
    """Rotate ``x (..., n, d_k)`` by its tokens' ``positions (n,)``; returns ``(..., n, d_k)``.

    RoPE (Su et al. 2021, "RoFormer"): feature pair i of the token at position p turns by the
    angle p·θ_i (:func:`rope_frequencies`, :func:`rope_angles`), so that the score of a rotated
    query and key depends only on the offset between their positions. ``"half"`` pairs feature
    i with feature i + r/2 (``x·cos + rotate_half(x)·sin``: transformers' LLaMA, GPT-NeoX,
    Qwen, Mistral); ``"interleaved"`` pairs features 2i and 2i+1 (RoFormer, GPT-J, Meta's
    original LLaMA). Only the first r = ``rotary_dim`` features turn (partial rotary, GPT-NeoX
    ``rotary_pct``); the others pass through unchanged.
    """
    d_k, n = x.shape[-1], x.shape[-2]
    r = d_k if settings.rotary_dim is None else settings.rotary_dim
    if r > d_k:
        raise AttentionInputError(f"rope rotary_dim ({r}) must not exceed d_k ({d_k})")
    check_positions(positions, n, "positions")
    theta = rope_frequencies(r, settings.base, settings.scaling)  # (r/2,)
    angles = rope_angles(positions, theta, settings.scaling)  # (n, r/2)
    if settings.style == "half":
        cos = np.cos(np.concatenate((angles, angles), axis=-1))  # (n, r): [a, a]
        sin = np.sin(np.concatenate((angles, angles), axis=-1))  # (n, r)
        turn = rotate_half
    else:
        cos = np.repeat(np.cos(angles), 2, axis=-1)  # (n, r): a_0, a_0, a_1, a_1, …
        sin = np.repeat(np.sin(angles), 2, axis=-1)  # (n, r)
        turn = rotate_every_two
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


def alibi_bias(
    slopes: Array, positions: IntArray, context_positions: IntArray, symmetric: bool = False
) -> Array:
    """(n, L, S): the ALiBi bias ``slope_h · (p'_j − p_i)`` (Press et al. 2022).

    0 where key and query share a position, −slope·distance to earlier keys (and +slope·distance
    to later ones); with ``symmetric`` ``−slope_h · |p'_j − p_i|`` (bidirectional encoders).
    ``slopes (n,)`` usually come from :func:`alibi_slopes`.
    """
    if slopes.ndim != 1 or not np.isfinite(slopes).all():
        raise AttentionInputError("ALiBi slopes must be a list of finite numbers, one per head")
    rel = _relative_positions(positions, context_positions).astype(np.float64)  # (L, S)
    if symmetric:
        rel = -np.abs(rel)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        bias = slopes[:, None, None] * rel[None]  # (n, L, S)
    require_finite(bias, "the ALiBi bias (slope · distance)")
    return bias


# --- T5 relative bias -------------------------------------------------------------------------

# torch.log of a float32 CPU tensor is MKL's vmsLn (VML_HA: within 1 ulp, not correctly rounded;
# 3.6 % of the float32s in [1, 4096] get the other neighbour of the exact logarithm). Where that
# moves a T5 bucket edge for num_buckets ≤ 128 and max_distance ≤ 1024 (found by comparing every
# bucket there with transformers: torch 2.13.0 and its MKL 2024.2 on x86-64, the same bits with
# ATEN_CPU_CAPABILITY default/avx2/avx512 and MKL_CBWR SSE4_2/AVX2), here is torch's value:
# argument (the float32 d / max_exact) → torch.log(argument), both float32 in hex. Elsewhere the
# correctly rounded float32 logarithm gives torch's buckets. (torch without MKL, e.g. on macOS or
# ARM, takes SLEEF's logarithm, whose last bit may differ at these same ties.)
_TORCH_LOG_F32 = {
    "0x1.800000p+0": "0x1.9f3240p-2",  # 3/2
    "0x1.924924p+0": "0x1.ced530p-2",  # 11/7
    "0x1.aaaaaap+0": "0x1.058af0p-1",  # 5/3
    "0x1.ccccccp+0": "0x1.2cf260p-1",  # 9/5
    "0x1.500000p+1": "0x1.ee1f14p-1",  # 21/8
    "0x1.5b6db6p+1": "0x1.ff3f2cp-1",  # 19/7
    "0x1.c00000p+1": "0x1.40b514p+0",  # 7/2
    "0x1.1af286p+2": "0x1.7c8340p+0",  # 84/19
    "0x1.2bda12p+2": "0x1.8b5e28p+0",  # 253/54
    "0x1.4cccccp+2": "0x1.a60e7cp+0",  # 26/5
    "0x1.8cccccp+2": "0x1.d315a8p+0",  # 31/5
    "0x1.c00000p+2": "0x1.f2272cp+0",  # 7
    "0x1.880000p+3": "0x1.40b514p+1",  # 49/4
    "0x1.880000p+5": "0x1.f2272cp+1",  # 49
}
_LOG_TABLE = sorted((float.fromhex(a), float.fromhex(v)) for a, v in _TORCH_LOG_F32.items())
_LOG_ARGUMENTS = np.array([a for a, _ in _LOG_TABLE], dtype=np.float32)  # ascending
_LOG_VALUES = np.array([v for _, v in _LOG_TABLE], dtype=np.float32)


def _torch_log_f32(x: NDArray[np.float32]) -> NDArray[np.float32]:
    """float32 natural logarithm of float32 ``x`` ≥ 1 as torch's where it matters to T5 buckets
    (see ``_TORCH_LOG_F32``): the float64 logarithm rounded to float32, which is the correctly
    rounded one (but for double rounding within ~1e-16 of a float32 midpoint), except at the
    arguments of ``_TORCH_LOG_F32``, which get torch's value."""
    log = np.log(x.astype(np.float64)).astype(np.float32)
    at = np.minimum(np.searchsorted(_LOG_ARGUMENTS, x), _LOG_ARGUMENTS.size - 1)
    return np.where(_LOG_ARGUMENTS[at] == x, _LOG_VALUES[at], log)


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
    of the float32 logarithm. torch's (MKL's) is not correctly rounded, nor is NumPy's float32
    ``log``, and they disagree there; so the logarithm is :func:`_torch_log_f32`: the correctly
    rounded one, with torch's value at the few arguments where the two differ at a bucket
    edge. The buckets then equal transformers' (torch 2.13 on x86-64 with MKL, PyTorch's
    wheels) for every relative position when num_buckets ≤ 128 and max_distance ≤ 1024,
    checked exhaustively there; beyond, a near-tie may still differ by one bucket (at one
    distance for about 1 in 6,500 (num_buckets, max_distance) pairs with max_distance 1025 …
    4096).
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
        _torch_log_f32(ratio)
        / np.float32(math.log(max_distance / max_exact))
        * np.float32(b - max_exact)
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
        return alibi_bias(slopes, positions, context_positions, spec.symmetric)
    return relative_bias(
        spec.table, positions, context_positions, spec.bidirectional, spec.max_distance
    )
