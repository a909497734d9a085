"""FlashAttention-2's backward a block of keys at a time (API.md, "The backward pass, every
step": ``online_softmax_backward``), beside the forward's :func:`service.core.softmax.online_softmax`.

Dao 2023, "FlashAttention-2", Algorithm 2: the forward keeps each query row's log-sum-exp
``L_i = m_i + log ℓ_i`` (its online softmax's last running max and sum, a sink's logit
included) instead of the weights; the backward computes ``D_i = rowsum(dO_i ∘ O_i)`` once, then
for each block j of keys recomputes ``P_ij = exp(S_ij − L_i)`` from the block's final scores
and accumulates::

    dV_j = P_ijᵀ dO_i          dP_ij = dO_i V_jᵀ          dS_ij = P_ij ∘ (dP_ij − D_i)
    dQ_i += dS_ij K_j · scale  dK_j = dS_ijᵀ Q_i · scale

with dS_ij times the softcap's derivative ``1 − tanh²(s/c)`` where one applies (Gemma 2), Q and
K the forms the scores read (rotated, normed, tempered; a decode step's keys with the cache's),
V the form the output read. After the last block dQ is the gradient of that Q, each dK_j and
dV_j the rows a … b − 1 of K's and V's (each block of keys is visited once, with every query
row at once: the kernel's inner loop over query blocks, here one block), and each P_ij the
columns a … b − 1 of the weights. :func:`service.core.backward.attention_backward` computes the
same gradients at once (tests/core/test_online_backward.py holds them equal to 1e-12).

NumPy only, no I/O.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.core import chain
from service.core.attention import AttentionTrace
from service.core.block import repeated_heads
from service.core.errors import AttentionInputError
from service.core.linear import transposed
from service.core.softmax import OnlineSoftmax
from service.core.types import Array, BoolArray, FullyMaskedPolicy
from service.core.variants import Variants, softcap_backward

ENTRY_KEYS = ("keys", "p", "dv", "dp", "ds", "dk", "dq")  # one block's entry, in this order


@dataclass(frozen=True)
class BackwardBlock:
    """One block of keys ``[start, end)`` of the backward, every query row at once; shapes
    with the trace's leading axes (``...``: batch, head), n = end − start."""

    start: int
    end: int
    p: Array  # (..., L, n)  exp(S_ij − L_i): the weights' columns start … end − 1
    dv: Array  # (..., n, d_v)  P_ijᵀ dO_i
    dp: Array  # (..., L, n)  dO_i V_jᵀ
    ds: Array  # (..., L, n)  P_ij ∘ (dP_ij − D_i), times the softcap's derivative
    dk: Array  # (..., n, d_k)  dS_ijᵀ Q_i · scale
    dq: Array  # (..., L, d_k)  Σ over the blocks so far of dS_ij K_j · scale


@dataclass(frozen=True)
class OnlineBackward:
    """The blocks in key order, each row's log-sum-exp ``lse`` (L_i; +∞ on a row with no
    allowed key and no sink, whose weights are all 0) and ``row_dot`` (D_i). Index it as the
    arrays it was computed from (batch, head) to get one trace's entries, as
    :class:`service.core.softmax.OnlineSoftmax`: ``[{"keys": [start, end], "p", "dv", "dp",
    "ds", "dk", "dq"}, …]``."""

    blocks: tuple[BackwardBlock, ...]
    lse: Array  # (..., L)
    row_dot: Array  # (..., L)

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[BackwardBlock]:
        return iter(self.blocks)

    def __getitem__(self, index: Any) -> list[dict[str, Any]]:
        return [
            {
                "keys": [b.start, b.end],
                "p": b.p[index],
                "dv": b.dv[index],
                "dp": b.dp[index],
                "ds": b.ds[index],
                "dk": b.dk[index],
                "dq": b.dq[index],
            }
            for b in self.blocks
        ]


def log_sum_exp(online: OnlineSoftmax) -> Array:
    """Each row's ``L = m + log ℓ`` after the last block (the sink's logit in it when there is
    one); +∞ where ℓ = 0 (no allowed key, no sink), so that ``exp(s − L)`` is 0 on that row
    for every s, −∞ included, without a NaN.  (..., L)"""
    m, ell = online.m[..., -1, :], online.l[..., -1, :]  # (..., L)
    seen = ell > 0
    return np.where(seen, m + np.log(np.where(seen, ell, 1.0)), np.inf)


@dataclass(frozen=True)
class _Read:
    """What the backward reads from the forward's trace: the final scores, the Q and K the
    scores read, the V the output read (keys and values per query head), the output."""

    logits: Array  # (..., L, S)
    q: Array  # (..., L, d_k)
    k: Array  # (..., S, d_k)
    v: Array  # (..., S, d_v)
    output: Array  # (..., L, d_v)
    scaled: Array  # (..., L, S) the scaled scores (what the softcap read)


def _per_query_head(a: Array, q: Array) -> Array:
    """Keys or values kept per key/value head ``(B, h_kv, S, ·)`` (a grouped-query decode
    step's cache) repeated to the query heads of ``q (B, h, L, ·)``, as the scores read them."""
    if a.ndim < 3 or q.ndim < 3 or a.shape[-3] == q.shape[-3]:
        return a
    h, h_kv = q.shape[-3], a.shape[-3]
    if h % h_kv:
        raise AttentionInputError(
            f"the keys have {h_kv} heads, which do not divide the queries' {h}"
        )
    return repeated_heads(a, h)


def _read(trace: AttentionTrace) -> _Read:
    made = trace.made
    present = tuple(name for name in chain.ORDER if name in made)
    q = made[chain.made_from("scores", present)]
    return _Read(
        logits=made[chain.made_from("weights", present)],
        q=q,
        k=_per_query_head(made[chain.made_from("scores", present, slot="k")], q),
        v=_per_query_head(made[chain.made_from("output", present, slot="v")], q),
        output=made["output"],
        scaled=made["scaled_scores"],
    )


def _check(r: _Read, trace: AttentionTrace, online: OnlineSoftmax, grad: Array, cap: bool) -> None:
    """Refuse what would give a wrong answer rather than an error: a forward that does not
    match the trace, a gradient shaped otherwise than the output, a softcap unaccounted for."""
    logits = r.logits
    if online.m.shape[:-2] != logits.shape[:-2] or online.m.shape[-1] != logits.shape[-2]:
        raise AttentionInputError(
            f"the online softmax's rows {list(online.m.shape)} are not the trace's "
            f"(scores shaped {list(logits.shape)})"
        )
    if not online.ends or online.ends[-1] != logits.shape[-1]:
        raise AttentionInputError(
            f"the online softmax's blocks end at {online.ends[-1:]}, not at the trace's "
            f"{logits.shape[-1]} keys"
        )
    if grad.shape != r.output.shape:
        raise AttentionInputError(
            f"grad_output has shape {list(grad.shape)}; it must be shaped as the "
            f"output, {list(r.output.shape)}"
        )
    if ("capped_scores" in trace.made) != cap:
        raise AttentionInputError(
            "the trace's scores were soft-capped but no softcap was given"
            if not cap
            else "a softcap was given but the trace's scores were not soft-capped"
        )


def online_softmax_backward(
    trace: AttentionTrace,
    online: OnlineSoftmax,
    grad_output: Array,
    *,
    variants: Variants | None = None,
    padded_queries: BoolArray | None = None,
    fully_masked_policy: FullyMaskedPolicy = "zero",
) -> OnlineBackward:
    """FlashAttention-2's backward of ``trace`` (made by
    :func:`service.core.attention.scaled_dot_product_attention` with these same ``variants``,
    ``padded_queries`` and ``fully_masked_policy``; the scale is the trace's) a block of keys
    at a time, the blocks those of ``online`` (:func:`service.core.softmax.online_softmax` of
    the trace's final scores and values, the sinks' logits included), from ``grad_output
    (..., L, d_v)``, ∂loss/∂output.

    Every score variant of the forward applies: the mask and the bias (constants: dS passes
    through them, a masked cell's P and dS are 0), the softcap (its derivative applied to dS),
    the sinks (in L_i; their own gradient is −Σ P_sink·D, not a block's), a row with every key
    masked (P = 0, or 1/S with dS = 0 under ``"uniform"``), padded query rows (P = 0), a
    decode step's cache (the blocks run over all P + L keys) and keys kept per key/value head
    (repeated to the query heads). Returns :class:`OnlineBackward`."""
    cap = (variants or Variants()).softcap
    r = _read(trace)
    _check(r, trace, online, grad_output, cap is not None)
    lse = log_sum_exp(online)  # (..., L)
    row_dot = np.sum(grad_output * r.output, axis=-1)  # (..., L)  D = rowsum(dO ∘ O)
    held = _rows(padded_queries, lse.shape)  # P = 0 there whatever the scores
    filled = _rows(
        trace.fully_masked_rows if fully_masked_policy == "uniform" else None, lse.shape
    ) & np.isposinf(lse)  # the uniform policy's rows (no sink took them): P = 1/S, dS = 0
    n_keys = r.logits.shape[-1]
    dq = np.zeros(r.q.shape)  # (..., L, d_k)
    blocks = []
    for a, b in zip(online.starts, online.ends, strict=True):
        p = np.exp(r.logits[..., a:b] - lse[..., None])  # (..., L, n)  s ≤ L: no overflow
        p[np.broadcast_to(held[..., None], p.shape)] = 0.0
        p[np.broadcast_to(filled[..., None], p.shape)] = 1.0 / n_keys
        v_j, k_j = r.v[..., a:b, :], r.k[..., a:b, :]  # (..., n, d_v), (..., n, d_k)
        dp = grad_output @ transposed(v_j)  # (..., L, n)
        ds = p * (dp - row_dot[..., None])  # (..., L, n)
        ds[np.broadcast_to(filled[..., None], ds.shape)] = 0.0
        if cap is not None:
            ds = softcap_backward(ds, r.scaled[..., a:b], cap)
        dq = dq + (ds @ k_j) * trace.scale
        blocks.append(
            BackwardBlock(
                start=a,
                end=b,
                p=p,
                dv=transposed(p) @ grad_output,  # (..., n, d_v)
                dp=dp,
                ds=ds,
                dk=(transposed(ds) @ r.q) * trace.scale,  # (..., n, d_k)
                dq=dq,
            )
        )
    return OnlineBackward(tuple(blocks), lse, row_dot)


def _rows(flags: BoolArray | None, rows: tuple[int, ...]) -> BoolArray:
    """Per-row flags broadcast to the rows ``(..., L)``; none flagged when not given."""
    if flags is None:
        return np.zeros(rows, dtype=bool)
    return np.broadcast_to(np.asarray(flags, dtype=bool), rows)
