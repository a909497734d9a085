"""Warnings that need no expected numbers: a boolean mask whose polarity looks inverted.
Found while the rules are checked (:mod:`service.trace.rules`); returned as ``warnings``."""

import numpy as np

from service.core.masks import causal
from service.core.types import BoolArray
from service.wire.schemas.mask_fields import BooleanMask
from service.wire.schemas.requests import InputFields


def mask_warnings(req: InputFields) -> tuple[dict[str, str], ...]:
    """A ``mask_polarity`` warning for each boolean mask that looks inverted: it blocks each
    query's own key and allows only later ones (an inverted causal mask), or leaves a query
    row with no key; and for a key_padding_mask that pads every key of an item."""
    found: list[dict[str, str]] = []
    for i, m in enumerate(req.mask or []):
        if not isinstance(m, BooleanMask):
            continue
        allowed = m.matrix if m.true_means == "attend" else ~m.matrix  # (L, S) or (B, L, S)
        problem = _polarity_problem(allowed)
        if problem:
            other = "masked" if m.true_means == "attend" else "attend"
            means = "may attend" if m.true_means == "attend" else "masked"
            found.append(
                {
                    "code": "mask_polarity",
                    "field": f"mask[{i}].matrix",
                    "message": f"mask[{i}] {problem}. Its true means {means}; if yours means "
                    f'the opposite, add "true_means": "{other}" to the mask',
                }
            )
    kpm = req.key_padding_mask
    if kpm is not None and kpm.reshape(-1, kpm.shape[-1]).all(axis=-1).any():
        found.append(
            {
                "code": "mask_polarity",
                "field": "key_padding_mask",
                "message": "key_padding_mask marks every key of a sequence as padding, so no "
                "query can attend to anything. Here true means padding (ignored), as in "
                "torch's nn.MultiheadAttention; if your true means keep, invert it",
            }
        )
    return tuple(found)


def _polarity_problem(allowed: BoolArray) -> str | None:
    """What looks inverted about a boolean mask (true = may attend), or None."""
    n_q, n_k = allowed.shape[-2:]
    later_only = ~(allowed & causal(n_q, n_k)).any()  # nothing at or before the diagonal
    if n_q > 1 and later_only and allowed.any():
        return (
            "blocks each query's own key and lets it see only later keys: the opposite of a "
            "causal mask"
        )
    empty = ~allowed.any(axis=-1)  # (..., L)
    if empty.any():
        rows = np.flatnonzero(empty.reshape(-1, n_q).any(axis=0))[:8].tolist()
        return f"masks every key of query row(s) {rows}, so those rows attend to nothing"
    return None
