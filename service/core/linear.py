"""The linear parts around attention: the projections (``X W + b``), the key/value cache
(:class:`Past`), the scale and the contiguous transpose the scores multiply by. Weights are in
``in_out`` layout (``X @ W``); the API converts other layouts before calling in here.
"""

from dataclasses import dataclass

import numpy as np

from service.core.errors import require_finite
from service.core.types import Array


@dataclass(frozen=True)
class Projections:
    """Query, key and value weights in in_out layout (``X @ W + b``)."""

    w_q: Array  # (d_model, d_q), d_q = h·d_k
    w_k: Array  # (d_model, d_kv), d_kv = h_kv·d_k
    w_v: Array  # (d_model, h_kv·d_v)
    b_q: Array | None = None  # (d_q,)
    b_k: Array | None = None  # (d_kv,)
    b_v: Array | None = None  # (h_kv·d_v,)


@dataclass(frozen=True)
class Past:
    """A key/value cache as a Hugging Face ``DynamicCache`` holds it: keys already normed and
    rotated, values already normed, P tokens."""

    k: Array  # (..., P, d_k)
    v: Array  # (..., P, d_v)

    @property
    def length(self) -> int:
        return int(self.k.shape[-2])

    def repeated(self, group: int) -> "Past":
        """The cache per query head: each key/value head's ``(B, h_kv, P, ·)`` repeated for the
        ``group`` query heads it serves (grouped-query attention, as ``repeat_kv``)."""
        if group == 1:
            return self
        return Past(np.repeat(self.k, group, axis=1), np.repeat(self.v, group, axis=1))


def project(x: Array, w: Array, b: Array | None = None) -> Array:
    """Linear projection ``x @ w + b`` of ``x (..., n, d_in)`` with w ``(d_in, d_out)`` and the
    optional bias ``b (d_out,)``. Returns ``(..., n, d_out)``."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused below
        out = x @ w  # (..., n, d_out)
        if b is not None:
            out += b
    require_finite(out, "a projection (X W)")
    return out


def project_qkv(x: Array, source: Array, p: Projections) -> tuple[Array, Array, Array]:
    """Q from ``x (..., L, d_model)``; K and V from ``source (..., S, d_model)`` (x itself for
    self-attention, the context for cross-attention)."""
    return project(x, p.w_q, p.b_q), project(source, p.w_k, p.b_k), project(source, p.w_v, p.b_v)


def default_scale(d_k: int) -> float:
    """1/√d_k, the scale of Vaswani et al. (2017)."""
    return 1.0 / float(np.sqrt(d_k))


def transposed(a: Array) -> Array:
    """``a (..., n, d)`` as ``(..., d, n)``, contiguous: NumPy multiplies stacked matrices by a
    transposed view in a slow loop of its own instead of BLAS (keys of 12 heads × 128 × 32,
    contiguous: 186 ms against 0.45 ms with the copy, on a busy 2-vCPU Xeon; L = 512, two
    heads, d_k = 2: 6.8 ms against 0.55 ms), and the copy costs n·d numbers next to n² · d."""
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


@dataclass(frozen=True)
class ProjectionGrad:
    """The gradients through :func:`project`: of its input, its weight and its bias."""

    x: Array  # (..., n, d_in)
    w: Array  # (d_in, d_out)
    b: Array | None  # (d_out,); None when the projection had no bias


def project_backward(x: Array, w: Array, grad: Array, bias: bool = False) -> ProjectionGrad:
    """The gradient through ``x @ w + b`` given ``grad (..., n, d_out)`` of its output:
    ``dx = grad wᵀ``, ``dw = xᵀ grad`` and ``db = Σ grad`` summed over the batch items and
    tokens (torch.nn.Linear's backward, in in_out layout)."""
    rows_in, rows_out = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
    return ProjectionGrad(
        grad @ transposed(w),  # (..., n, d_in)
        rows_in.T @ rows_out,  # (d_in, d_out)
        rows_out.sum(axis=0) if bias else None,  # (d_out,)
    )
