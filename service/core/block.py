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


def layer_norm_backward(
    x: Array, norm: LayerNorm, grad: Array
) -> tuple[Array, Array | None, Array | None]:
    """The gradients through :func:`layer_norm` (ddof 0) of ``x (B, L, d)``, γ and β (None
    where not given), given ``grad`` of its output: with y = (x − mean)/r, dy = grad·γ,
    ``dx = (dy − mean(dy) − y·mean(dy·y)) / r`` over the normalised axes (Ba et al. 2016),
    ``dγ = Σ grad·y`` and ``dβ = Σ grad`` over the tokens (and batch items)."""
    axes: tuple[int, ...] = (-1,) if norm.over == "features" else (-2, -1)
    centred = x - x.mean(axis=axes, keepdims=True)
    denom = np.sqrt(np.mean(centred * centred, axis=axes, keepdims=True) + norm.eps)
    y = centred / denom  # (B, L, d)
    dy = grad if norm.gamma is None else grad * norm.gamma
    dx = (
        dy - np.mean(dy, axis=axes, keepdims=True) - y * np.mean(dy * y, axis=axes, keepdims=True)
    ) / denom
    rows = (-1, x.shape[-1])  # γ and β are (d,): summed over every token
    gamma = None if norm.gamma is None else (grad * y).reshape(rows).sum(axis=0)
    beta = None if norm.beta is None else grad.reshape(rows).sum(axis=0)
    return dx, gamma, beta


def repeated_heads(a: Array, num_heads: int) -> Array:
    """Each key/value head of ``a (..., h_kv, n, d)`` repeated for the ``num_heads / h_kv``
    query heads it serves (grouped-query attention; transformers' ``repeat_kv``): ``(..., h,
    n, d)``, ``a`` itself when it has a head per query head already."""
    h_kv = a.shape[-3]
    return a if h_kv == num_heads else np.repeat(a, num_heads // h_kv, axis=-3)


def repeated_heads_backward(grad: Array, num_kv_heads: int) -> Array:
    """The transpose of repeating each of h_kv key/value heads for the h / h_kv query heads it
    serves (``repeat_kv``, ``np.repeat(…, axis=1)``): ``grad (B, h, n, d)`` summed over each
    group, ``(B, h_kv, n, d)``."""
    b, h, n, d = grad.shape
    summed: Array = grad.reshape(b, num_kv_heads, h // num_kv_heads, n, d).sum(axis=2)
    return summed
