"""Errors the engine raises; their messages are written for the person who sent the input."""

import numpy as np

from service.core.types import Array


class AttentionInputError(ValueError):
    """Input the math cannot proceed with (e.g. numbers that overflow float64)."""


class FullyMaskedRowsError(AttentionInputError):
    """Raised under the "error" policy when some query rows may attend to no key."""

    def __init__(self, rows: list[list[int]]) -> None:
        self.rows = rows  # per batch item, the indices of its fully masked rows
        listed = "; ".join(
            f"batch item {b}: rows {r}" if len(rows) > 1 else f"rows {r}"
            for b, r in enumerate(rows)
            if r
        )
        super().__init__(
            f"every key is masked for some query rows ({listed}); with fully_masked_rows 'error' "
            "this is refused: relax the mask, or choose 'zero' or 'uniform'"
        )


FLAGS_AT_ONCE = 1 << 16  # entries checked with a temporary array of flags (64 kB)


def _all_finite(a: Array) -> bool:
    """Whether every entry of ``a`` is finite. A large array is summed first: a finite sum
    means every entry is (±∞ and NaN propagate through it), so only a sum that is not (finite
    entries adding up past float64's range) is looked at entry by entry. One pass, and no
    temporary array of flags as large as ``a``."""
    if a.size <= FLAGS_AT_ONCE:
        return bool(np.isfinite(a).all())
    with np.errstate(over="ignore", invalid="ignore"):  # finite entries' sum may overflow
        total = np.add.reduce(a, axis=None)
    return bool(np.isfinite(total)) or bool(np.isfinite(a).all())


def require_finite(a: Array, what: str) -> None:
    """Refuse a result that overflowed: NaN or ±∞ must never reach a response."""
    if not _all_finite(a):
        raise AttentionInputError(
            f"{what} overflowed float64 (a value reached ±infinity or NaN); scale the inputs "
            "down: products of values near 1e154 or larger overflow"
        )
