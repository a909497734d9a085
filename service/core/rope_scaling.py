"""RoPE's scalings for contexts longer than a model was trained on, one class each: how it
changes the rotation frequencies θ_i (and, for linear interpolation, the positions), the factor
that multiplies cos and sin, and whether the answer depends on the sequence's length n (dynamic
NTK and LongRoPE do: n = the largest query position + 1). Each follows the transformers 5.23
function named in its docstring (``modeling_rope_utils``), computed in float64. NumPy only.
"""

import math
import sys
from dataclasses import dataclass

import numpy as np

from service.core.errors import AttentionInputError
from service.core.types import Array

_LOG_2PI = math.log(2 * math.pi)


def _log_turns(context: int, rotations: float) -> float:
    """ln(context / (2π·rotations)) as transformers' ``find_correction_dim`` computes it; where
    that quotient leaves float64's normal range (2π·1e308 overflows, a rotations of 5e-324
    makes it infinite, transformers then raises a math domain error) the same logarithm as a
    difference of logarithms, finite for every finite rotations > 0 and context ≥ 1."""
    quotient = context / (rotations * 2 * math.pi)  # Python floats: inf or 0, no exception
    if math.isfinite(quotient) and quotient >= sys.float_info.min:
        return math.log(quotient)
    return math.log(context) - math.log(rotations) - _LOG_2PI


def _positive(value: float, what: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise AttentionInputError(f"rope scaling {what} must be a finite number > 0, got {value}")


def default_frequencies(rotary_dim: int, base: float) -> Array:
    """(r/2,): θ_i = base^(−2i/r) (Su et al. 2021, eq. 15; as transformers computes it,
    ``1 / base^(2i/r)``)."""
    two_i = np.arange(0, rotary_dim, 2, dtype=np.float64)  # (r/2,)
    with np.errstate(over="ignore", divide="ignore"):  # a base near 0: refused by the caller
        return 1.0 / base ** (two_i / rotary_dim)


@dataclass(frozen=True)
class Scaling:
    """What every scaling answers; this base scales nothing: the frequencies and positions as
    they are, cos and sin × 1."""

    def check(self) -> None:
        """Refuse settings the scaling cannot use (AttentionInputError)."""

    def frequencies(self, rotary_dim: int, base: float, n: int) -> Array:
        """(r/2,): θ_i for a sequence whose largest position is n − 1."""
        return default_frequencies(rotary_dim, base)

    def positions(self, p: Array) -> Array:
        return p

    @property
    def attention_factor(self) -> float:
        return 1.0

    def describe(self, rotary_dim: int, base: float, n: int) -> str:
        """Which frequencies this scaling changed, in words."""
        return ""


@dataclass(frozen=True)
class LinearScaling(Scaling):
    """Linear position interpolation (kaiokendev; Chen et al. 2023): positions divided by f
    (``_compute_linear_scaling_rope_parameters`` divides θ instead: the same angles)."""

    factor: float = 1.0

    def check(self) -> None:
        _positive(self.factor, "factor")

    def positions(self, p: Array) -> Array:
        with np.errstate(over="ignore"):  # p / 5e-324: refused by rope_angles
            return p / self.factor

    def describe(self, rotary_dim: int, base: float, n: int) -> str:
        return f"; positions divided by {self.factor:g} (linear scaling)"


@dataclass(frozen=True)
class Llama3Scaling(Scaling):
    """LLaMA 3.1's frequency scaling (``_compute_llama3_parameters``): with wavelength
    λ_i = 2π/θ_i, λ_low = original_max_position / low_freq_factor and λ_high =
    original_max_position / high_freq_factor, θ_i is kept when λ_i < λ_high, divided by
    ``factor`` when λ_i > λ_low, and blended ``(1 − s)·θ_i/factor + s·θ_i`` between, with
    ``s = (original_max_position/λ_i − low_freq_factor) / (high_freq_factor − low_freq_factor)``."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192  # HF: original_max_position_embeddings

    def check(self) -> None:
        _positive(self.factor, "factor")
        low, high = self.low_freq_factor, self.high_freq_factor
        if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
            raise AttentionInputError(
                "rope llama3 scaling needs 0 < low_freq_factor ≤ high_freq_factor (finite)"
            )
        if self.original_max_position <= 0:
            raise AttentionInputError("rope llama3 original_max_position must be > 0")

    def frequencies(self, rotary_dim: int, base: float, n: int) -> Array:
        theta = default_frequencies(rotary_dim, base)  # (r/2,)
        old_context = float(self.original_max_position)
        low_wavelen = old_context / self.low_freq_factor  # longer than this: slowed by factor
        high_wavelen = old_context / self.high_freq_factor  # shorter than this: kept
        span = self.high_freq_factor - self.low_freq_factor  # 0: nothing blended (Llama 4)
        # a θ/factor not chosen may overflow; one chosen is refused by rope_frequencies
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            wavelen = 2 * math.pi / theta  # (r/2,)
            smooth = (old_context / wavelen - self.low_freq_factor) / (span or 1.0)
            blended = (1 - smooth) * theta / self.factor + smooth * theta  # (r/2,)
            slowed = theta / self.factor  # (r/2,)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        out = np.where(wavelen > low_wavelen, slowed, theta)  # (r/2,)
        return np.where(medium, blended, out)

    def describe(self, rotary_dim: int, base: float, n: int) -> str:
        return (
            f"; llama3 scaling: wavelengths over {self.original_max_position}/"
            f"{self.low_freq_factor:g} slowed by {self.factor:g}, under "
            f"{self.original_max_position}/{self.high_freq_factor:g} kept, blended between"
        )


def mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's ``get_mscale``: 1 for scale ≤ 1, else 0.1 · mscale · ln(scale) + 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class YarnScaling(Scaling):
    """YaRN (Peng et al. 2023; ``_compute_yarn_parameters``): the pairs that turn fewer than
    ``beta_slow`` times over the original context are interpolated (θ/factor), those that turn
    more than ``beta_fast`` times are kept, a linear ramp blends between (over the pair index,
    its ends floored and ceiled when ``truncate``); cos and sin are multiplied by the attention
    factor: given, else mscale(factor, mscale)/mscale(factor, mscale_all_dim) when both are
    given, else 0.1·ln(factor) + 1."""

    factor: float = 1.0
    original_max_position: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    given_attention_factor: float | None = None

    def check(self) -> None:
        _positive(self.factor, "factor")
        if self.original_max_position <= 0:
            raise AttentionInputError("rope yarn original_max_position must be > 0")
        _positive(self.beta_fast, "beta_fast")
        _positive(self.beta_slow, "beta_slow")

    def _ramp(self, rotary_dim: int, base: float) -> tuple[Array, float, float]:
        """The extrapolation share of each pair (1 kept … 0 interpolated), and the ramp's ends."""
        if not base > 1:
            raise AttentionInputError(
                f"rope yarn needs a base above 1 (the pairs' turns are counted in log base); "
                f"got {base:g}"
            )

        def correction(rotations: float) -> float:  # the pair index turning that many times
            return (rotary_dim * _log_turns(self.original_max_position, rotations)) / (
                2 * math.log(base)
            )

        low, high = correction(self.beta_fast), correction(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rotary_dim - 1)
        if low == high:
            high += 0.001  # as transformers: no division by zero
        i = np.arange(rotary_dim // 2, dtype=np.float64)  # (r/2,)
        ramp = np.clip((i - low) / (high - low), 0.0, 1.0)  # (r/2,)
        return 1.0 - ramp, low, high

    def frequencies(self, rotary_dim: int, base: float, n: int) -> Array:
        theta = default_frequencies(rotary_dim, base)  # (r/2,) extrapolation: kept
        kept, _, _ = self._ramp(rotary_dim, base)  # (r/2,)
        with np.errstate(over="ignore", invalid="ignore"):  # refused by rope_frequencies
            return theta / self.factor * (1 - kept) + theta * kept

    @property
    def attention_factor(self) -> float:
        if self.given_attention_factor is not None:
            return self.given_attention_factor
        if self.mscale and self.mscale_all_dim:
            return mscale(self.factor, self.mscale) / mscale(self.factor, self.mscale_all_dim)
        return mscale(self.factor)

    def describe(self, rotary_dim: int, base: float, n: int) -> str:
        kept, low, high = self._ramp(rotary_dim, base)
        whole, none = int((kept == 1).sum()), int((kept == 0).sum())
        return (
            f"; yarn scaling: of {rotary_dim // 2} pairs, {whole} kept (more than "
            f"{self.beta_fast:g} turns over {self.original_max_position} positions), {none} "
            f"divided by {self.factor:g} (fewer than {self.beta_slow:g}), "
            f"{rotary_dim // 2 - whole - none} blended (ramp from pair {low:g} to {high:g}); "
            f"cos and sin × {self.attention_factor:.6g}"
        )


@dataclass(frozen=True)
class DynamicScaling(Scaling):
    """Dynamic NTK (bloc97, emozilla; ``_compute_dynamic_ntk_parameters``): past
    ``original_max_position`` the base grows with the sequence's length n:
    base·(f·n/M − (f − 1))^(r/(r − 2)); at or under it nothing changes."""

    factor: float = 1.0
    original_max_position: int = 2048  # HF: max_position_embeddings

    def check(self) -> None:
        _positive(self.factor, "factor")
        if self.original_max_position <= 0:
            raise AttentionInputError("rope dynamic original_max_position must be > 0")

    def grown_base(self, rotary_dim: int, base: float, n: int) -> float:
        if rotary_dim <= 2:
            raise AttentionInputError(
                f"rope dynamic scaling needs rotary_dim > 2 (its exponent is r/(r − 2)); got "
                f"{rotary_dim}"
            )
        m = self.original_max_position
        length = max(n, m)
        try:
            growth = (self.factor * length / m - (self.factor - 1)) ** (
                rotary_dim / (rotary_dim - 2)
            )
            grown = base * growth
        except OverflowError:
            grown = math.inf
        if not (math.isfinite(grown) and grown > 0):
            raise AttentionInputError(
                f"rope dynamic scaling: factor {self.factor:g} at n = {n} makes the base "
                "overflow; use a smaller factor"
            )
        return float(grown)

    def frequencies(self, rotary_dim: int, base: float, n: int) -> Array:
        return default_frequencies(rotary_dim, self.grown_base(rotary_dim, base, n))

    def describe(self, rotary_dim: int, base: float, n: int) -> str:
        if n <= self.original_max_position:
            return (
                f"; dynamic NTK scaling: n = {n} ≤ {self.original_max_position}, frequencies "
                "unchanged"
            )
        return (
            f"; dynamic NTK scaling: n = {n} > {self.original_max_position}, base raised to "
            f"{self.grown_base(rotary_dim, base, n):.8g}"
        )


@dataclass(frozen=True)
class LongRopeScaling(Scaling):
    """LongRoPE (Ding et al. 2024; Phi-3; ``_compute_longrope_parameters``): θ_i divided by a
    factor per pair, ``long_factor`` when the sequence's length n exceeds
    ``original_max_position``, else ``short_factor``; cos and sin × the attention factor:
    given, else √(1 + ln f / ln original_max_position) with f = ``factor`` (or max_position /
    original_max_position), 1 when f ≤ 1."""

    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    original_max_position: int = 4096
    max_position: int | None = None
    factor: float | None = None
    given_attention_factor: float | None = None

    @property
    def overall_factor(self) -> float:
        if self.factor is not None:
            return self.factor
        return (self.max_position or self.original_max_position) / self.original_max_position

    def check(self) -> None:
        if self.original_max_position <= 0:
            raise AttentionInputError("rope longrope original_max_position must be > 0")
        for f in (*self.short_factor, *self.long_factor):
            _positive(f, "short_factor and long_factor entries")

    def _factors(self, rotary_dim: int, n: int) -> tuple[Array, str]:
        long = n > self.original_max_position
        chosen = self.long_factor if long else self.short_factor
        if len(chosen) != rotary_dim // 2:
            name = "long_factor" if long else "short_factor"
            raise AttentionInputError(
                f"rope longrope {name} has {len(chosen)} entries; it needs one per pair "
                f"(rotary_dim/2 = {rotary_dim // 2})"
            )
        return np.asarray(chosen, dtype=np.float64), "long_factor" if long else "short_factor"

    def frequencies(self, rotary_dim: int, base: float, n: int) -> Array:
        ext, _ = self._factors(rotary_dim, n)  # (r/2,)
        two_i = np.arange(0, rotary_dim, 2, dtype=np.float64)  # (r/2,)
        with np.errstate(over="ignore", divide="ignore"):  # refused by rope_frequencies
            return 1.0 / (ext * base ** (two_i / rotary_dim))

    @property
    def attention_factor(self) -> float:
        if self.given_attention_factor is not None:
            return self.given_attention_factor
        f = self.overall_factor
        if f <= 1.0:
            return 1.0
        if self.original_max_position < 2:
            raise AttentionInputError(
                "rope longrope's attention factor divides by ln(original_max_position): give "
                "original_max_position ≥ 2 or an attention_factor"
            )
        return math.sqrt(1 + math.log(f) / math.log(self.original_max_position))

    def describe(self, rotary_dim: int, base: float, n: int) -> str:
        _, name = self._factors(rotary_dim, n)
        side = ">" if name == "long_factor" else "≤"
        return (
            f"; longrope scaling: n = {n} {side} {self.original_max_position}, so each θ_i is "
            f"divided by {name}[i]; cos and sin × {self.attention_factor:.6g}"
        )
