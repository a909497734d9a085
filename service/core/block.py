"""The block around the heads, its pieces: the heads split from a projection and merged again
(Vaswani et al. 2017, §3.2.2), and layer norm (Ba et al. 2016; ``torch.nn.LayerNorm``). The
steps that use them are :data:`service.core.chain.BLOCK`. NumPy only, no I/O."""

from dataclasses import dataclass

import numpy as np

from service.core.errors import require_finite
from service.core.types import Array, NormOver


@dataclass(frozen=True)
class LayerNorm:
    """Layer norm settings: per token (``features``, the standard) or over the whole matrix."""

    eps: float = 1e-5
    gamma: Array | None = None  # (d_model,)
    beta: Array | None = None  # (d_model,)
    over: NormOver = "features"


def layer_norm(x: Array, norm: LayerNorm, ddof: int = 0) -> Array:
    """Normalise ``x (B, L, d)`` to zero mean and unit (biased) variance, then γ·x + β.

    ``features`` normalises each token over its d features (``torch.nn.LayerNorm(d)``);
    ``all`` normalises each sequence over all its L·d numbers. ``ddof`` 1 divides the
    variance by n − 1 instead (a mistake :mod:`service.core.diagnosis.search` recognises).
    """
    axes: tuple[int, ...] = (-1,) if norm.over == "features" else (-2, -1)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused just below
        mean = x.mean(axis=axes, keepdims=True)
        var = x.var(axis=axes, keepdims=True, ddof=ddof)  # biased (ddof 0), as torch
    require_finite(var, "the variance in layer norm")  # ∞ would silently give 0 for every value
    out = (x - mean) / np.sqrt(var + norm.eps)  # (B, L, d)
    if norm.gamma is not None:
        out *= norm.gamma
    if norm.beta is not None:
        out += norm.beta
    return out  # type: ignore[no-any-return]


def split_heads(t: Array, num_heads: int) -> Array:
    """(B, n, h·d) -> (B, h, n, d): head i takes columns i·d … (i+1)·d − 1."""
    b, n, width = t.shape
    return t.reshape(b, n, num_heads, width // num_heads).transpose(0, 2, 1, 3)


def merge_heads(t: Array) -> Array:
    """(B, h, n, d) -> (B, n, h·d), the inverse of :func:`split_heads`."""
    b, h, n, d = t.shape
    return t.transpose(0, 2, 1, 3).reshape(b, n, h * d)
