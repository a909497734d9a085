"""The per-row summary: for each query, the key it attends to most and how spread its weights are."""

from typing import Any

import numpy as np

from service.core.attention import entropy_bits
from service.core.types import Array


def summary(
    weights: Array,
    tokens: tuple[str, ...] | None,
    ctx: tuple[str, ...] | None,
    decimals: int | None,
) -> list[list[dict[str, Any]]]:
    """Per batch item, per query row of ``weights (B, L, S)``: the key it attends to most, that
    weight, and the entropy in bits. A row whose weights are all 0 (fully masked) has no top
    key."""
    top = weights.argmax(axis=-1)  # (B, L)
    top_w = weights.max(axis=-1)  # (B, L), the weight at `top`
    attends = (top_w > 0.0).tolist()  # (B, L), false on rows with every key masked
    entropy = entropy_bits(weights)  # (B, L)
    if decimals is not None:
        top_w, entropy = np.round(top_w, decimals), np.round(entropy, decimals)
    return [
        [
            {
                "token": tokens[i] if tokens else None,
                "top_key": ctx[j] if ctx and a else None,
                "top_key_index": j if a else None,
                "top_weight": w,
                "entropy_bits": e,
            }
            for i, (j, w, e, a) in enumerate(zip(js, ws, es, has, strict=True))
        ]
        for js, ws, es, has in zip(
            top.tolist(), top_w.tolist(), entropy.tolist(), attends, strict=True
        )
    ]
