"""FlashAttention-2's backward traced block by block (issue 44 item 2;
service/core/online_backward.py): for every score variant the forward's online softmax takes
(mask, bias, softcap, sinks, fully masked rows under each policy, padded queries, a decode
step's cache, grouped-query heads) and block sizes that do and do not divide the keys,

- each block's ``p`` equals those columns of the weights, ``dp`` and ``ds`` those of
  service.core.backward's ``grad_weights`` and ``grad_scaled_scores`` (the softcap's factor
  applied), to 1e-12;
- each running ``dq`` equals the exact dS's columns so far times K's rows · scale; the last
  ``dq``, the blocks' ``dk`` and ``dv`` side by side equal the exact gradients of the Q, K and V
  the scores and output read, to 1e-12;
- and the same final dq, dk, dv equal ``torch.autograd`` of the computation written here in
  torch, float64 (never the service's functions), to 1e-12.

Differences are relative to the largest magnitude of the reference (or 1, if larger).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from service.core.attention import AttentionTrace, scaled_dot_product_attention
from service.core.backward import attention_backward, heads_backward
from service.core.errors import AttentionInputError
from service.core.latent import LatentDims, LatentWeights, latent_attention
from service.core.linear import Past
from service.core.masks import CombinedMask
from service.core.multihead import attend_heads
from service.core.online_backward import ENTRY_KEYS, OnlineBackward, online_softmax_backward
from service.core.positions import Rope
from service.core.softmax import OnlineSoftmax, online_softmax
from service.core.types import Array, BoolArray, FullyMaskedPolicy
from service.core.variants import Temperature, Variants

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
T = Any  # a torch tensor
TOL = 1e-12
WORST: dict[str, float] = {}  # case → the largest relative difference met (for the report)

B, H, L, S, D_K, D_V = 2, 2, 5, 7, 4, 3
BLOCKS = (1, 2, 3, 7, 9)  # 3 leaves a last block of 1; 9 > S: one block


def close(case: str, got: Array, want: Array) -> None:
    assert got.shape == want.shape, (case, got.shape, want.shape)
    diff = float(np.abs(got - want).max(initial=0.0)) / max(1.0, float(np.abs(want).max(initial=0)))
    assert diff <= TOL, (case, diff)
    WORST[case] = max(WORST.get(case, 0.0), diff)


# ---- the forward's arrays, as the wiring reads them -------------------------------------------

FINAL = ("masked_scores", "biased_scores", "capped_scores", "scaled_scores")  # the last made
Q_READ = ("q_tempered", "q_normed", "q_rotated", "q_clipped", "q")  # the Q the scores read
K_READ = ("present_k", "k_normed", "k_rotated", "k_clipped", "k")
V_READ = ("present_v", "v_normed", "v_clipped", "v")


def first(trace: AttentionTrace, names: tuple[str, ...]) -> str:
    return next(n for n in names if n in trace.made)


def forward_online(trace: AttentionTrace, block: int, sinks: Array | float | None) -> OnlineSoftmax:
    """The forward's online softmax of the trace's final scores and the values the output read;
    sinks one number, or one per head against (B, h, L) rows."""
    sink = None
    if sinks is not None:
        given = np.asarray(sinks, dtype=np.float64)
        sink = given if given.ndim == 0 else given[None, :, None]
    logits = trace.made[first(trace, FINAL)]
    v = trace.made[first(trace, V_READ)]
    if v.ndim == 4 and v.shape[1] != logits.shape[1]:  # a GQA cache kept per key/value head
        v = np.repeat(v, logits.shape[1] // v.shape[1], axis=1)
    return online_softmax(logits, v, block, sink)


# ---- the reference, in torch, from the Q, K and V the scores and output read ------------------


@dataclass
class Case:
    variants: Variants = field(default_factory=Variants)
    scale: float = 0.6
    additive: Array | None = None  # (…, L, S)
    padded: BoolArray | None = None  # (…, L)
    policy: FullyMaskedPolicy = "zero"


def t_forward(q: T, k: T, v: T, c: Case) -> T:
    """softmax(mask(bias(cap(Q Kᵀ · scale)))) V with the case's sinks, policy and padding."""
    var = c.variants
    s = (q @ k.transpose(-1, -2)) * c.scale
    if var.softcap is not None:
        s = var.softcap * torch.tanh(s / var.softcap)
    if var.position_bias is not None:
        s = s + torch.tensor(var.position_bias)
    if c.additive is not None:
        s = s + torch.tensor(c.additive)
    full = torch.isneginf(s).all(-1, keepdim=True)  # (…, L, 1)
    if var.sinks is not None:
        sinks = torch.tensor(np.asarray(var.sinks, dtype=np.float64))
        col = (sinks[:, None, None] if sinks.ndim else sinks).expand(*s.shape[:-1], 1)
        p = torch.cat((s, col), -1).softmax(-1)[..., :-1]
    else:
        p = torch.where(full, 0.0, s).softmax(-1)
        p = torch.where(full, 1.0 / s.shape[-1] if c.policy == "uniform" else 0.0, p)
    if c.padded is not None:
        p = torch.where(torch.tensor(c.padded)[..., None], 0.0, p)
    return p @ v


def t_grads(q: Array, k: Array, v: Array, c: Case, d_out: Array) -> tuple[Array, Array, Array]:
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    t_forward(tq, tk, tv, c).backward(torch.tensor(d_out))
    return tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


# ---- the cases ----------------------------------------------------------------------------------


def causal(n_q: int, n_k: int) -> Array:
    """(L, S) additive: −∞ above the lower-right diagonal."""
    return np.where(np.arange(n_k)[None] > np.arange(n_q)[:, None] + (n_k - n_q), -np.inf, 0.0)


def full_rows() -> Array:
    """(B, 1, L, S): causal, key 0 masked, row 1 of item 0 and row L − 2 of item 1 fully masked."""
    m = np.broadcast_to(causal(L, S), (B, 1, L, S)).copy()
    m[:, :, :, 0] = -np.inf
    m[0, :, 1, :] = -np.inf
    m[1, :, L - 2, :] = -np.inf
    return m


def padded_rows() -> BoolArray:
    """(B, 1, L): the last query row of item 1 is padding."""
    return np.array([[False] * L, [False] * (L - 1) + [True]])[:, None, :]


CASES: dict[str, Callable[[np.random.Generator], Case]] = {
    "plain": lambda r: Case(),
    "causal": lambda r: Case(additive=causal(L, S)),
    "padding_and_float_mask": lambda r: Case(
        additive=np.where(np.arange(S) >= np.array([[S], [S - 3]])[:, None], -np.inf, 0.0)[:, None]
        + 0.3 * r.normal(size=(B, 1, L, S)),
        padded=padded_rows(),
    ),
    "fully_masked_zero": lambda r: Case(additive=full_rows()),
    "fully_masked_uniform": lambda r: Case(additive=full_rows(), policy="uniform"),
    "softcap": lambda r: Case(Variants(softcap=0.9), scale=1.3),
    "position_bias": lambda r: Case(
        Variants(position_bias=r.normal(size=(H, L, S))), additive=causal(L, S)
    ),
    "sinks_scalar_fully_masked": lambda r: Case(Variants(sinks=0.4), additive=full_rows()),
    "sinks_per_head_padded": lambda r: Case(
        Variants(sinks=r.normal(size=H)), additive=causal(L, S), padded=padded_rows()
    ),
    "rope_temperature": lambda r: Case(
        Variants(rope=Rope(10_000.0), temperature=Temperature(2.0, 0.7, 1))
    ),
    "all_together": lambda r: Case(
        Variants(
            rope=Rope(10_000.0, "interleaved"),
            softcap=1.1,
            position_bias=r.normal(size=(1, L, S)),
            sinks=r.normal(size=H),
        ),
        additive=full_rows(),
        padded=padded_rows(),
        scale=1.4,
    ),
}


@dataclass
class Run:
    trace: AttentionTrace
    online: OnlineSoftmax
    ours: OnlineBackward
    exact: dict[str, Array]
    d_out: Array


def run(
    c: Case, r: np.random.Generator, block: int, past: int = 0, lead: tuple[int, ...] = (B, H)
) -> Run:
    n_new = S - past
    assert not past or n_new == L, "a decode step's new keys are its queries' tokens"
    q = 1.5 * r.normal(size=(*lead, L, D_K))
    k, v = 1.5 * r.normal(size=(*lead, n_new, D_K)), r.normal(size=(*lead, n_new, D_V))
    cache = (
        None
        if not past
        else Past(r.normal(size=(*lead, past, D_K)), r.normal(size=(*lead, past, D_V)))
    )
    kw: dict[str, Any] = {  # what the forward and both backwards take alike
        "padded_queries": c.padded,
        "fully_masked_policy": c.policy,
        "variants": c.variants,
    }
    given: dict[str, Any] = {"additive": c.additive, "past": cache}  # read from the trace
    trace = scaled_dot_product_attention(q, k, v, scale=c.scale, **given, **kw)
    d_out = r.normal(size=trace.output.shape)
    online = forward_online(trace, block, c.variants.sinks)
    ours = online_softmax_backward(trace, online, d_out, **kw)
    exact = attention_backward(trace, d_out, **given, **kw)
    return Run(trace, online, ours, exact, d_out)


def check_blocks(case: str, run_: Run, scale: float) -> None:
    """Each block against service.core.backward's exact arrays; the running dq included."""
    t, ours, exact = run_.trace, run_.ours, run_.exact
    ds_all = exact["grad_scaled_scores"]  # dS through the mask, bias and softcap
    k_read = t.made[first(t, K_READ)]
    assert [(b.start, b.end) for b in ours] == list(
        zip(run_.online.starts, run_.online.ends, strict=True)
    )
    for b in ours:
        cols = slice(b.start, b.end)
        close(case, b.p, t.weights[..., cols])
        close(case, b.dp, exact["grad_weights"][..., cols])
        close(case, b.ds, ds_all[..., cols])
        close(case, b.dq, ds_all[..., : b.end] @ k_read[..., : b.end, :] * scale)


def check_final(case: str, run_: Run, c: Case) -> None:
    """The last dq, the dk and dv side by side, against the exact and torch.autograd."""
    t, ours, exact = run_.trace, run_.ours, run_.exact
    q_name, k_name, v_name = first(t, Q_READ), first(t, K_READ), first(t, V_READ)
    dq = ours.blocks[-1].dq
    dk = np.concatenate([b.dk for b in ours], axis=-2)
    dv = np.concatenate([b.dv for b in ours], axis=-2)
    close(case, dq, exact[f"grad_{q_name}"])
    close(case, dk, exact[f"grad_{k_name}"])
    close(case, dv, exact[f"grad_{v_name}"])
    want = t_grads(t.made[q_name], t.made[k_name], t.made[v_name], c, run_.d_out)
    for got, w in zip((dq, dk, dv), want, strict=True):
        close(case + " (autograd)", got, w)


# ---- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("case", CASES)
def test_each_block_and_the_last_are_the_exact_gradients(case: str, block: int) -> None:
    r = np.random.default_rng(len(case) + block)
    c = CASES[case](r)
    run_ = run(c, r, block)
    check_blocks(case, run_, c.scale)
    check_final(case, run_, c)


@pytest.mark.parametrize("block", [2, 4])
def test_attention_shapes_without_heads(block: int) -> None:
    """/attention's (B, L, d): a mask per batch item, one sink for every row."""
    r = np.random.default_rng(11)
    additive = np.where(np.arange(S) >= np.array([[S], [S - 2]]), -np.inf, 0.0)[:, None, :]
    c = Case(Variants(sinks=-0.3, softcap=2.0), additive=np.broadcast_to(additive, (B, L, S)))
    run_ = run(c, r, block, lead=(B,))
    check_blocks("attention_shapes", run_, c.scale)
    check_final("attention_shapes", run_, c)


@pytest.mark.parametrize("block", [2, 3, 6])
@pytest.mark.parametrize("case", ["plain", "sinks_per_head_padded", "all_together"])
def test_a_decode_step_runs_the_blocks_over_the_cache_and_the_new_keys(
    case: str, block: int
) -> None:
    """A decode step, S − L = 2 cached tokens and L new: the blocks run over all P + L keys, dk
    and dv are the gradients of the cache-extended K and V (grad_present_k, grad_present_v)."""
    r = np.random.default_rng(5 + block)
    c = CASES[case](r)
    past = S - L
    c.additive = None if c.additive is None else causal(L, S)
    run_ = run(c, r, block, past=past)
    assert run_.ours.blocks[-1].end == S
    check_blocks(case + "_decode", run_, c.scale)
    check_final(case + "_decode", run_, c)


def test_grouped_query_heads_with_a_cache_kept_per_key_value_head() -> None:
    """attend_heads with 4 query heads on 2 key/value heads and a cache: the trace keeps the
    cache per key/value head; the blocks read it repeated per query head, and the dk, dv of a
    group's query heads sum to heads_backward's grad_k, grad_v (and the cache's)."""
    r = np.random.default_rng(21)
    h, h_kv, past, n_new = 4, 2, 3, 2
    q = r.normal(size=(B, h, n_new, D_K))
    k, v = r.normal(size=(B, h_kv, n_new, D_K)), r.normal(size=(B, h_kv, n_new, D_V))
    cache = Past(r.normal(size=(B, h_kv, past, D_K)), r.normal(size=(B, h_kv, past, D_V)))
    allowed = np.ones((B, n_new, past + n_new), dtype=bool)
    allowed[1, :, 0] = False
    mask = CombinedMask(allowed, np.where(allowed, 0.0, -np.inf), np.zeros((B, n_new), bool))
    variants = Variants(sinks=r.normal(size=h))
    w_o = r.normal(size=(h * D_V, 5))
    trace = attend_heads(q, k, v, w_o=w_o, mask=mask, scale=0.8, variants=variants, past=cache)
    assert trace.heads.present_k is not None and trace.heads.present_k.shape[1] == h_kv
    grad = r.normal(size=trace.output.shape)
    exact = heads_backward(
        trace, grad, w_o=w_o, mask=mask, variants=variants, past=cache, num_kv_heads=h_kv
    )
    heads = trace.heads
    online = forward_online(heads, 2, variants.sinks)
    kw: dict[str, Any] = {"variants": variants, "padded_queries": mask.padded_queries[:, None]}
    ours = online_softmax_backward(heads, online, exact["grad_output"], **kw)
    for b in ours:
        close("gqa_cache", b.p, heads.weights[..., b.start : b.end])
    close("gqa_cache", ours.blocks[-1].dq, exact["grad_q"])

    def per_kv_head(a: Array) -> Array:  # (B, h, n, ·) -> (B, h_kv, n, ·)
        summed: Array = a.reshape(B, h_kv, h // h_kv, *a.shape[2:]).sum(axis=2)
        return summed

    dk = per_kv_head(np.concatenate([b.dk for b in ours], axis=-2))
    dv = per_kv_head(np.concatenate([b.dv for b in ours], axis=-2))
    close("gqa_cache", dk[..., :past, :], exact["grad_past_k"])
    close("gqa_cache", dk[..., past:, :], exact["grad_k"])
    close("gqa_cache", dv[..., :past, :], exact["grad_past_v"])
    close("gqa_cache", dv[..., past:, :], exact["grad_v"])


def test_masked_cells_and_uniform_rows() -> None:
    """A masked cell's p and ds are exactly 0; a row the uniform policy filled has p = 1/S in
    every block and ds = 0; a fully masked row under "zero" has p = 0 and an infinite lse."""
    for policy, fill in (("uniform", 1.0 / S), ("zero", 0.0)):
        r = np.random.default_rng(2)
        c = Case(additive=full_rows(), policy=policy)  # type: ignore[arg-type]
        ours = run(c, r, 3).ours
        masked = np.isneginf(np.broadcast_to(full_rows(), (B, H, L, S)))
        for b in ours:
            cells = masked[..., b.start : b.end]
            assert (b.ds[cells] == 0).all()
            assert (b.p[0, :, 1] == fill).all() and (b.p[1, :, L - 2] == fill).all()
            assert (b.ds[0, :, 1] == 0).all() and (b.ds[1, :, L - 2] == 0).all()
            assert (b.p[cells & ~np.isin(np.arange(L), [1, L - 2])[:, None]] == 0).all()
        assert np.isposinf(ours.lse[0, :, 1]).all()


def test_the_entries_index_like_the_forwards() -> None:
    """``ours[b, i]`` gives one head's entries in block order, with the contract's keys, as
    ``OnlineSoftmax[b, i]`` does for the forward."""
    r = np.random.default_rng(4)
    run_ = run(Case(additive=causal(L, S)), r, 3)
    entries = run_.ours[1, 0]
    assert [e["keys"] for e in entries] == [[0, 3], [3, 6], [6, 7]]
    assert [list(e) for e in entries] == [list(ENTRY_KEYS)] * 3
    assert entries[1]["p"].shape == (L, 3) and entries[2]["dk"].shape == (1, D_K)
    assert entries[2]["dq"].shape == (L, D_K) and entries[0]["dv"].shape == (3, D_V)
    np.testing.assert_array_equal(entries[1]["ds"], run_.ours.blocks[1].ds[1, 0])
    assert len(run_.online[1, 0]) == len(entries)


def test_it_refuses_what_would_give_a_wrong_answer() -> None:
    r = np.random.default_rng(6)
    c = Case(Variants(softcap=1.0))
    run_ = run(c, r, 3)
    t, online = run_.trace, run_.online
    with pytest.raises(AttentionInputError, match="soft-capped but no softcap"):
        online_softmax_backward(t, online, run_.d_out)
    with pytest.raises(AttentionInputError, match="grad_output has shape"):
        online_softmax_backward(t, online, run_.d_out[..., :2], variants=c.variants)
    other = online_softmax(t.made["capped_scores"][..., :4], t.v[..., :4, :], 3)
    with pytest.raises(AttentionInputError, match="blocks end at"):
        online_softmax_backward(t, other, run_.d_out, variants=c.variants)
    plain = run(Case(), r, 3)
    with pytest.raises(AttentionInputError, match="were not soft-capped"):
        online_softmax_backward(plain.trace, plain.online, plain.d_out, variants=c.variants)


def test_mla_heads_read_the_latents_rotated_queries_and_keys() -> None:
    """DeepSeek's MLA: the heads' trace keeps Q = [q_nope | q_rope] as ``q_rotated`` (the
    unrotated one as ``q``); the blocks read the rotated ones, as the scores did."""
    r = np.random.default_rng(8)
    h, nope, rope_dim, rank, d_model = 2, 2, 2, 3, 6
    dims = LatentDims(None, rank, nope, rope_dim, D_V)
    w = LatentWeights(
        w_q=r.normal(size=(d_model, h * (nope + rope_dim))),
        w_kv_a=r.normal(size=(d_model, rank + rope_dim)),
        kv_norm=r.normal(size=rank),
        w_kv_b=r.normal(size=(rank, h * (nope + D_V))),
    )
    c = Case(Variants(softcap=2.5, sinks=r.normal(size=h)), additive=causal(L, L)[None, None])
    mask = CombinedMask(
        np.broadcast_to(np.isfinite(causal(L, L)), (B, L, L)),
        np.broadcast_to(causal(L, L), (B, L, L)),
        np.zeros((B, L), bool),
    )
    x = r.normal(size=(B, L, d_model))
    mla = latent_attention(
        x, w, dims, num_heads=h, settings=Rope(10_000.0), mask=mask, variants=c.variants
    )
    heads = mla.block.heads
    c.scale = heads.scale
    d_out = r.normal(size=heads.output.shape)
    ours = online_softmax_backward(
        heads, forward_online(heads, 2, c.variants.sinks), d_out, variants=c.variants
    )
    for b in ours:
        close("mla", b.p, heads.weights[..., b.start : b.end])
    assert heads.q_rotated is not None and heads.k_rotated is not None
    want = t_grads(heads.q_rotated, heads.k_rotated, heads.v, c, d_out)
    close("mla (autograd)", ours.blocks[-1].dq, want[0])
    close("mla (autograd)", np.concatenate([b.dk for b in ours], axis=-2), want[1])
    close("mla (autograd)", np.concatenate([b.dv for b in ours], axis=-2), want[2])
