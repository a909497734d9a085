"""The page's explanation of the q/k norms' weight and bias gradients, of a decode step's cache
gradients (grad_past_k, grad_past_v) and RoPE's backward at the shifted positions, and of a
key/value head's gradients under grouped-query heads (its query heads' summed; a norm over the
key projection): every cell of these is recomputed by the page (lib/backward.js) and equals the
service's to 1e-12, and a few equal torch.autograd of the same attention written here in float64
(never the service's functions)."""

import math
from typing import Any

import numpy as np
import pytest
import torch

from tests.browser.support import post_json
from tests.browser.test_backward_view import (
    D_O,
    K4,
    Q4,
    RECOMPUTE_GRADIENTS,
    W_K,
    W_Q,
    W_V,
    V,
    X,
    _pattern,
)

pytestmark = pytest.mark.e2e

T = torch.float64
# /multihead's block and projections with `past` are lib/backward-block.js's (not this file's)
BLOCK = {"grad_projected", "grad_concat", "grad_w_q", "grad_w_k", "grad_w_v", "grad_x"}


def t(a: Any) -> torch.Tensor:
    return torch.tensor(a, dtype=T, requires_grad=True)


def back(out: torch.Tensor, d_o: Any) -> None:
    """loss = Σ out ∘ dO, backward (torch's Tensor.backward is untyped)."""
    loss: Any = (out * torch.tensor(d_o, dtype=T)).sum()
    loss.backward()


def grad(leaf: torch.Tensor) -> torch.Tensor:
    assert leaf.grad is not None
    return leaf.grad


def _norm(x: torch.Tensor, n: dict[str, Any], w: Any = None, b: Any = None) -> torch.Tensor:
    """qk_norm over the last axis: rms or layer, times w (1 + w zero-centred), plus b."""
    c = x - x.mean(-1, keepdim=True) if n.get("type") == "layer" else x
    y = c / torch.sqrt((c * c).mean(-1, keepdim=True) + n.get("eps", 1e-6))
    if w is not None:
        y = y * (1 + w if n.get("zero_centered") else w)
    return y if b is None else y + b


def _rope(x: torch.Tensor, pos: list[int], base: float) -> torch.Tensor:
    """RoPE, half style, over the last axis of x [..., n, d] at positions pos."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=T) / d)
    ang = torch.tensor(pos, dtype=T)[:, None] * theta[None, :]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([a * ang.cos() - b * ang.sin(), b * ang.cos() + a * ang.sin()], -1)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q kᵀ / √d) v over [..., L, d] against [..., S, d]; causal lower-right."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(L, S).triu(S - L + 1).bool(), -math.inf)
    return torch.softmax(s, -1) @ v


def _page(
    page: Any, server: str, endpoint: str, body: dict[str, Any]
) -> tuple[Any, dict[Any, Any]]:
    """The answer (with grad_past_* when asked: only `include` returns them), the page's rows
    checked against the service's, and the page's totals by (name, head, batch-or-kv, i, j)."""
    data = post_json(server, endpoint, body)
    if "past" in body:
        data |= post_json(server, endpoint, {**body, "include": ["grad_past_k", "grad_past_v"]})
    rows = page.evaluate(RECOMPUTE_GRADIENTS, {"endpoint": endpoint, "data": data, "request": body})
    lost = [r for r in rows if r[4] == "unexplained" and r[0] not in BLOCK]
    assert lost == [], lost[:10]
    bad = [r for r in rows if r[5] is None or abs(r[5] - r[6]) > 1e-12 * max(1, abs(r[6]))]
    assert [r for r in bad if r[0] not in BLOCK] == [], bad[:10]
    return data, {(r[0], r[1], r[2], r[3]): r[5] for r in rows}


def close(page_total: float, want: float) -> None:
    assert page_total == pytest.approx(want, abs=1e-12, rel=1e-12)


def test_attention_layer_norm_after_rope_weights_and_biases(page: Any, server: str) -> None:
    """/attention, qk_norm layer with weights and biases after RoPE: grad_q_norm_weight[j] =
    Σ_r grad_q_normed[r][j] · x̂[r][j], grad_k_norm_bias[j] = Σ_r grad_k_normed[r][j]."""
    n = {"type": "layer", "after_rope": True, "eps": 1e-5, "q_weight": [1.1, 0.9, -0.5, 2.0],
         "k_weight": [0.5, 1.5, 1.0, -1.0], "q_bias": [0.1, -0.2, 0.3, 0.0],
         "k_bias": [0.0, 0.4, -0.1, 0.2]}  # fmt: skip
    body = {"q": Q4, "k": K4, "v": V, "mask": {"type": "causal"}, "rope": {"base": 100},
            "qk_norm": n, "grad_output": _pattern(4, 2)}  # fmt: skip
    _, mine = _page(page, server, "attention", body)
    w = {k: t(n[k]) for k in ("q_weight", "k_weight", "q_bias", "k_bias")}
    pos = list(range(4))
    q = _norm(_rope(torch.tensor(Q4, dtype=T), pos, 100), n, w["q_weight"], w["q_bias"])
    k = _norm(_rope(torch.tensor(K4, dtype=T), pos, 100), n, w["k_weight"], w["k_bias"])
    out = _attend(q, k, torch.tensor(V, dtype=T), causal=True)
    back(out, _pattern(4, 2))
    close(mine[("grad_q_norm_weight", None, 0, 2)], float(grad(w["q_weight"])[2]))
    close(mine[("grad_k_norm_bias", None, 0, 1)], float(grad(w["k_bias"])[1]))
    close(mine[("grad_k_norm_weight", None, 0, 3)], float(grad(w["k_weight"])[3]))


def test_attention_batched_zero_centred_rms_weights(page: Any, server: str) -> None:
    """/attention batched, RMS zero_centered: the weight's gradient sums both batch items."""
    n = {"zero_centered": True, "q_weight": [0.1, -0.2, 0.3, 0.05],
         "k_weight": [-0.1, 0.2, 0.0, 0.4]}  # fmt: skip
    d_o = [_pattern(4, 2), _pattern(4, 2)[::-1]]
    body = {"q": [Q4, Q4[::-1]], "k": [K4, K4[::-1]], "v": [V, V[::-1]], "qk_norm": n,
            "grad_output": d_o}  # fmt: skip
    _, mine = _page(page, server, "attention", body)
    wq, wk = t(n["q_weight"]), t(n["k_weight"])
    q = _norm(torch.tensor(body["q"], dtype=T), n, wq)
    k = _norm(torch.tensor(body["k"], dtype=T), n, wk)
    out = _attend(q, k, torch.tensor(body["v"], dtype=T), causal=False)
    back(out, d_o)
    close(mine[("grad_q_norm_weight", None, 0, 0)], float(grad(wq)[0]))
    close(mine[("grad_k_norm_weight", None, 0, 3)], float(grad(wk)[3]))


def _multihead(body: dict[str, Any], d_o: Any) -> dict[str, torch.Tensor]:
    """/multihead without W_o (concat is the output) in torch: in_out weights, h heads, h_kv
    key/value heads, qk_norm over the head (weights [d] or [h][d]) or the projection ([h·d]),
    RoPE half at positions P … P + L − 1 after a cache `past` (keys already rotated), causal
    lower-right when asked. Returns the leaves' gradients by the service's names."""
    h = body["num_heads"]
    h_kv = body.get("num_kv_heads", h)
    x = torch.tensor(body["x"], dtype=T)
    proj = {s: (x @ torch.tensor(body["w_" + s], dtype=T)).detach().requires_grad_() for s in "qkv"}
    n = body.get("qk_norm")
    leaves = dict(proj)
    L = x.shape[0]
    d = proj["q"].shape[1] // h

    def side(s: str, heads: int) -> torch.Tensor:
        a = proj[s]
        if n is not None and s != "v":
            for what in ("weight", "bias"):
                if f"{s}_{what}" in n:
                    leaves[f"{s}_norm_{what}"] = t(n[f"{s}_{what}"])
            w, b = leaves.get(f"{s}_norm_weight"), leaves.get(f"{s}_norm_bias")
            if n.get("over") == "projection":
                a = _norm(a, n, w, b)  # the whole row, before the head split
        a = a.view(L, heads, d).transpose(0, 1)  # [heads, L, d]
        if n is not None and s != "v" and n.get("over") != "projection":
            w, b = leaves.get(f"{s}_norm_weight"), leaves.get(f"{s}_norm_bias")
            a = _norm(a, n, None if w is None else w.view(-1, 1, d) if w.dim() == 2 else w,
                      None if b is None else b.view(-1, 1, d) if b.dim() == 2 else b)  # fmt: skip
        return a

    q, k, v = side("q", h), side("k", h_kv), side("v", h_kv)
    past = body.get("past")
    P = 0 if past is None else len(past["k"][0])
    if "rope" in body:
        pos = list(range(P, P + L))
        q, k = _rope(q, pos, body["rope"]["base"]), _rope(k, pos, body["rope"]["base"])
    if past is not None:
        leaves["past_k"], leaves["past_v"] = t(past["k"]), t(past["v"])
        k, v = torch.cat([leaves["past_k"], k], 1), torch.cat([leaves["past_v"], v], 1)
    g = h // h_kv
    out = _attend(q, k.repeat_interleave(g, 0), v.repeat_interleave(g, 0), "mask" in body)
    concat = out.transpose(0, 1).reshape(L, -1)
    back(concat, d_o)
    grads = {n_: grad(leaf) for n_, leaf in leaves.items()}
    for s in "qkv":  # [L][heads·d] → [heads][L][d]
        grads[s] = grads[s].view(L, -1, d).transpose(0, 1)
    return grads


def test_multihead_per_head_layer_norms_under_grouped_query_heads(page: Any, server: str) -> None:
    """/multihead, 2 query heads on 1 key/value head, layer qk_norm with a row per head: the key
    head's grad_k (its query heads' copies summed, then back through the norm once) and the
    weights' and biases' rows (a key row summed over the query heads it serves)."""
    n = {"type": "layer", "q_weight": [[1.2, -0.7], [0.3, 0.9]], "k_weight": [[0.4, 1.3]],
         "q_bias": [[0.1, 0.2], [-0.3, 0.0]], "k_bias": [[0.5, -0.5]]}  # fmt: skip
    body = {"x": X, "w_q": W_Q, "w_k": [r[:2] for r in W_K], "w_v": [r[:2] for r in W_V],
            "num_heads": 2, "num_kv_heads": 1, "qk_norm": n, "grad_output": D_O}  # fmt: skip
    _, mine = _page(page, server, "multihead", body)
    ref = _multihead(body, D_O)
    close(mine[("grad_k", None, 1, 0)], float(ref["k"][0, 1, 0]))  # kv head 0 ("batch" 0)
    close(mine[("grad_k_norm_weight", None, 0, 1)], float(ref["k_norm_weight"][0, 1]))
    close(mine[("grad_q_norm_bias", None, 1, 0)], float(ref["q_norm_bias"][1, 0]))
    close(mine[("grad_q", 1, 2, 1)], float(ref["q"][1, 2, 1]))


def test_multihead_key_norm_over_the_projection_under_grouped_query_heads(
    page: Any, server: str
) -> None:
    """/multihead, 2 query heads of d_k 4 on 1 key head, qk_norm over the projection: the key
    head's grad_k back through the norm over its h_kv·d_k features, its query heads' gradients
    summed; the query weight [h·d_k] and the key weight [h_kv·d_k] explained."""
    w_q = [r + [x * 0.5 - 0.1 for x in r[::-1]] for r in W_Q]  # 4 × 8: 2 heads of 4
    w_k = [r + [x * -0.7 + 0.2 for x in r[::-1]] for r in W_K]
    w_v = [r + [x * 0.3 for x in r] for r in W_V]
    n = {"over": "projection", "q_weight": [1.1, 0.9, -0.5, 2.0, 0.3, 0.7, 1.2, -0.4],
         "k_weight": [0.5, 1.5, 1.0, -1.0]}  # fmt: skip
    d_o = [[((3 * i + 5 * c) % 7 - 3) / 4 for c in range(8)] for i in range(3)]
    body = {"x": X, "w_q": w_q, "w_k": [r[:4] for r in w_k], "w_v": [r[:4] for r in w_v],
            "num_heads": 2, "num_kv_heads": 1, "mask": {"type": "causal"}, "qk_norm": n,
            "grad_output": d_o}  # fmt: skip
    _, mine = _page(page, server, "multihead", body)
    ref = _multihead(body, d_o)
    close(mine[("grad_k", None, 2, 3)], float(ref["k"][0, 2, 3]))
    close(mine[("grad_k", None, 0, 1)], float(ref["k"][0, 0, 1]))
    close(mine[("grad_q_norm_weight", None, 0, 6)], float(ref["q_norm_weight"][6]))
    close(mine[("grad_k_norm_weight", None, 0, 2)], float(ref["k_norm_weight"][2]))


def test_multihead_shared_weight_summed_over_the_heads_with_rope(page: Any, server: str) -> None:
    """/multihead, a [d_k] weight shared by both heads (over the head), RoPE: its gradient sums
    every head's rows."""
    n = {"q_weight": [1.2, -0.7], "k_weight": [0.4, 1.3]}
    body = {"x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "num_heads": 2, "rope": {"base": 100},
            "qk_norm": n, "grad_output": D_O}  # fmt: skip
    _, mine = _page(page, server, "multihead", body)
    ref = _multihead(body, D_O)
    close(mine[("grad_q_norm_weight", None, 0, 0)], float(ref["q_norm_weight"][0]))
    close(mine[("grad_k_norm_weight", None, 0, 1)], float(ref["k_norm_weight"][1]))


def test_attention_decode_step_cache_gradients_and_rope_at_shifted_positions(
    page: Any, server: str
) -> None:
    """/attention with `past` (2 cached keys) and RoPE: grad_past_k and grad_past_v (the scores'
    columns before the new tokens'), grad_k and grad_q turned back at positions 2 and 3."""
    body = {"q": Q4[2:], "k": K4[2:], "v": V[2:], "past": {"k": K4[:2], "v": V[:2]},
            "rope": {"base": 100}, "grad_output": _pattern(2, 2)}  # fmt: skip
    _, mine = _page(page, server, "attention", body)
    q, k, v = t(Q4[2:]), t(K4[2:]), t(V[2:])
    pk, pv = t(K4[:2]), t(V[:2])
    keys = torch.cat([pk, _rope(k, [2, 3], 100)])
    out = _attend(_rope(q, [2, 3], 100), keys, torch.cat([pv, v]), causal=True)
    back(out, _pattern(2, 2))
    close(mine[("grad_past_k", None, 1, 2)], float(grad(pk)[1, 2]))
    close(mine[("grad_past_v", None, 0, 1)], float(grad(pv)[0, 1]))
    close(mine[("grad_k", None, 1, 3)], float(grad(k)[1, 3]))
    close(mine[("grad_q", None, 0, 0)], float(grad(q)[0, 0]))


def test_multihead_decode_step_under_grouped_query_heads(page: Any, server: str) -> None:
    """/multihead with `past` per key/value head, 2 query heads on 1, RoPE: grad_past_k,
    grad_past_v and grad_k of the key head, each its query heads' copies summed."""
    x4 = [*X, [0.3, 0.2, -0.9, 0.4]]
    body = {"x": x4[2:], "w_q": W_Q, "w_k": [r[:2] for r in W_K], "w_v": [r[:2] for r in W_V],
            "num_heads": 2, "num_kv_heads": 1, "rope": {"base": 100}, "grad_output": D_O[:2],
            "past": {"k": [[[0.3, -0.2], [0.9, 0.4]]], "v": [[[1.0, 0.5], [-0.5, 0.25]]]},
            "mask": {"type": "causal"}}  # fmt: skip
    data, mine = _page(page, server, "multihead", body)
    ref = _multihead(body, D_O[:2])
    close(mine[("grad_past_k", None, 1, 0)], float(ref["past_k"][0, 1, 0]))
    close(mine[("grad_past_v", None, 0, 1)], float(ref["past_v"][0, 0, 1]))
    close(mine[("grad_k", None, 1, 1)], float(ref["k"][0, 1, 1]))
    assert np.allclose(data["grad_past_k"], ref["past_k"].numpy(), atol=1e-12)
