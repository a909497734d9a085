"""Compare works on the parameters' gradients, through the API (API.md, "The backward pass,
every step": "``expected`` takes any ``grad_*`` name"): grad_w_q, grad_w_k, grad_w_v, grad_w_o,
grad_b_*, grad_x, grad_sinks and grad_state_dict's entries are compared as the answer gives
them (the request's weight_layout; grad_state_dict under the body's own names), in the
backward's order, and a wrong weight gradient is diagnosed with the backward's mistake that
reproduces it. The learner's gradients are made here in torch, float64: autograd of a correct
layer for the right ones, a backward written by hand with the bug for the wrong ones (dS = P ∘ dP,
then dW_q = xᵀ dQ), never by the service."""

from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

F64 = torch.float64
RNG = np.random.default_rng(4402)
B, L, D_MODEL, D_K = 2, 4, 4, 3  # d_k ≠ d_model: a weight's transpose has another shape


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> Any:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()


def back(out: Any, grad: Any) -> None:
    """out.backward(grad): torch's Tensor.backward is untyped."""
    out.backward(grad)


def rand(*shape: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    return RNG.normal(size=shape).round(3)


def listed(a: Any) -> Any:
    return np.asarray(a.detach().numpy() if hasattr(a, "detach") else a).tolist()


def by_name(ans: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in ans["comparison"]}


# ---- /attention: x and its projections, a causal mask -----------------------------------


def projections() -> dict[str, Any]:
    """x (B, L, d_model), W_q, W_k, W_v in_out (d_model, d_k), b_q, dO (B, L, d_k)."""
    return {"x": rand(B, L, D_MODEL), "w_q": rand(D_MODEL, D_K), "w_k": rand(D_MODEL, D_K),
            "w_v": rand(D_MODEL, D_K), "b_q": rand(D_K), "d_o": rand(B, L, D_K)}  # fmt: skip


def attention_body(a: dict[str, Any], layout: str) -> dict[str, Any]:
    def laid(w: Any) -> Any:
        return (w.T if layout == "out_in" else w).tolist()

    return {"x": a["x"].tolist(), "w_q": laid(a["w_q"]), "w_k": laid(a["w_k"]),
            "w_v": laid(a["w_v"]), "b_q": a["b_q"].tolist(), "weight_layout": layout,
            "mask": {"type": "causal"}, "grad_output": a["d_o"].tolist()}  # fmt: skip


def autograd(a: dict[str, Any]) -> dict[str, Any]:
    """The right gradients: torch.autograd of the same layer (in_out weights)."""
    x, w_q, w_k, w_v, b_q = (
        torch.tensor(a[n], dtype=F64, requires_grad=True) for n in ("x", "w_q", "w_k", "w_v", "b_q")
    )
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    out = torch.nn.functional.scaled_dot_product_attention(
        x @ w_q + b_q, x @ w_k, x @ w_v, attn_mask=causal
    )
    back(out, torch.tensor(a["d_o"], dtype=F64))
    return {"grad_x": x.grad, "grad_w_q": w_q.grad, "grad_w_k": w_k.grad, "grad_w_v": w_v.grad,
            "grad_b_q": b_q.grad}  # fmt: skip


def learners(a: dict[str, Any], diagonal: bool = False, unscaled: bool = False) -> dict[str, Any]:
    """The learner's backward written out by hand: dP = dO Vᵀ, dS = P ∘ (dP − D) (or, with
    ``diagonal``, P ∘ dP), dQ = dS K · s, dK = dSᵀ Q · s (without s when ``unscaled``),
    dV = Pᵀ dO, then dW = xᵀ dQ summed over the batch, db = Σ dQ, dx = dQ W_qᵀ + …"""
    x, w_q, w_k, w_v, b_q, d_o = (
        torch.tensor(a[n], dtype=F64) for n in ("x", "w_q", "w_k", "w_v", "b_q", "d_o")
    )
    s = 1 / D_K**0.5
    q, k, v = x @ w_q + b_q, x @ w_k, x @ w_v
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    p = torch.softmax((q @ k.transpose(-2, -1) * s).masked_fill(~causal, float("-inf")), -1)
    d_p = d_o @ v.transpose(-2, -1)
    d_s = p * d_p if diagonal else p * (d_p - (p * d_p).sum(-1, keepdim=True))
    by = 1.0 if unscaled else s
    d_q, d_k, d_v = d_s @ k * by, d_s.transpose(-2, -1) @ q * by, p.transpose(-2, -1) @ d_o
    xt = x.transpose(-2, -1)
    return {"grad_w_q": (xt @ d_q).sum(0), "grad_w_k": (xt @ d_k).sum(0),
            "grad_w_v": (xt @ d_v).sum(0), "grad_b_q": d_q.sum((0, 1)),
            "grad_x": d_q @ w_q.T + d_k @ w_k.T + d_v @ w_v.T}  # fmt: skip


def expected(grads: dict[str, Any], names: tuple[str, ...], layout: str) -> dict[str, Any]:
    """The learner's arrays as the answer gives them: a weight out_in when sent out_in."""
    return {
        n: listed(grads[n].T if layout == "out_in" and n.startswith("grad_w_") else grads[n])
        for n in names
    }


ALL = ("grad_x", "grad_b_q", "grad_w_v", "grad_w_q", "grad_w_k")  # not in the backward's order


def test_the_hand_backward_without_its_bug_is_autograd() -> None:
    """The learner's hand-written backward is right but for the bug it is given."""
    a = projections()
    mine, theirs = learners(a), autograd(a)
    for n in ALL:
        np.testing.assert_allclose(listed(mine[n]), listed(theirs[n]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
def test_right_weight_gradients_match_in_the_requests_layout(
    client: TestClient, layout: str
) -> None:
    a = projections()
    body = attention_body(a, layout) | {"expected": expected(autograd(a), ALL, layout)}
    ans = post(client, "/attention", body)
    assert ans["first_mismatch"] is None, ans["comparison"]
    # the backward's order: the projections' weights, the bias, then x's
    assert [e["name"] for e in ans["comparison"]] == [
        "grad_w_q", "grad_w_k", "grad_w_v", "grad_b_q", "grad_x"]  # fmt: skip
    assert all(e["match"] and e["diagnosis"] is None for e in ans["comparison"])
    w_q = np.asarray(ans["grad_w_q"])
    assert w_q.shape == ((D_K, D_MODEL) if layout == "out_in" else (D_MODEL, D_K))


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
def test_a_weight_gradient_without_d_is_diagnosed_from_it_alone(
    client: TestClient, layout: str
) -> None:
    """dS = P ∘ dP reaches dQ and dK, so W_q's and W_k's gradients: the mistake is found from
    grad_w_q alone, its trial run through the backward to the projections."""
    a = projections()
    body = attention_body(a, layout)
    mine = learners(a, diagonal=True)
    ans = post(client, "/attention", body | {"expected": expected(mine, ("grad_w_q",), layout)})
    assert ans["first_mismatch"] == "grad_w_q"
    entry = ans["comparison"][0]
    assert not entry["match"]
    assert entry["diagnosis"]["mistakes"] == ["softmax_grad_diagonal"]
    assert "your dS has no −D term" in entry["diagnosis"]["explanation"]


def test_the_first_wrong_one_is_named_and_a_right_grad_x_is_never_diagnosed(
    client: TestClient,
) -> None:
    """The learner's W_v's gradient is right (dV = Pᵀ dO has no D), W_k's is not, and their
    right grad_x (autograd's) is a match with no diagnosis, after the first difference."""
    a = projections()
    wrong, right = learners(a, unscaled=True), autograd(a)
    mixed = {
        "grad_x": right["grad_x"],
        "grad_w_v": wrong["grad_w_v"],
        "grad_w_k": wrong["grad_w_k"],
    }
    ans = post(client, "/attention", attention_body(a, "in_out") | {
        "expected": expected(mixed, ("grad_x", "grad_w_v", "grad_w_k"), "in_out")})  # fmt: skip
    rows = by_name(ans)
    assert [e["name"] for e in ans["comparison"]] == ["grad_w_k", "grad_w_v", "grad_x"]
    assert ans["first_mismatch"] == "grad_w_k"
    assert rows["grad_w_k"]["diagnosis"]["mistakes"] == ["grad_scale_missing"]
    assert rows["grad_w_v"]["match"] and rows["grad_w_v"]["diagnosis"] is None
    assert rows["grad_x"]["match"] and rows["grad_x"]["diagnosis"] is None
    assert rows["grad_x"]["diagnosis_complete"] is None


def test_a_right_grad_x_alone_is_a_match_never_a_diagnosis(client: TestClient) -> None:
    a = projections()
    ans = post(client, "/attention", attention_body(a, "out_in") | {
        "expected": expected(autograd(a), ("grad_x",), "out_in")})  # fmt: skip
    assert ans["first_mismatch"] is None
    assert ans["comparison"][0]["match"] and ans["comparison"][0]["diagnosis"] is None


# ---- what is refused -----------------------------------------------------------------


def test_a_weight_gradient_in_the_other_layout_is_a_422_saying_transpose(
    client: TestClient,
) -> None:
    a = projections()
    body = attention_body(a, "out_in") | {
        "expected": expected(autograd(a), ("grad_w_q",), "in_out")
    }
    err = post(client, "/attention", body, 422)
    assert err["errors"][0]["field"] == "expected.grad_w_q"
    assert "transpose" in err["message"]


def test_a_parameter_the_request_does_not_have_is_a_422(client: TestClient) -> None:
    a = projections()
    body = attention_body(a, "in_out")
    for name, shape in (("grad_b_k", (D_K,)), ("grad_state_dict", None)):
        value: Any = (
            {"q_proj.weight": np.zeros((D_K, D_MODEL)).tolist()}
            if shape is None
            else np.zeros(shape).tolist()
        )
        err = post(client, "/attention", body | {"expected": {name: value}}, 422)
        assert err["errors"][0]["field"].startswith(f"expected.{name}"), err
        assert name in err["message"]
    err = post(client, "/attention", body | {"expected": {"grad_b_k": [0.0] * D_K}}, 422)
    assert err["message"].endswith(
        "its parameters' gradients: grad_w_q, grad_w_k, grad_w_v, grad_b_q"
    )


def test_a_gradient_of_a_parameter_needs_grad_output(client: TestClient) -> None:
    a = projections()
    body = attention_body(a, "in_out")
    del body["grad_output"]
    err = post(
        client,
        "/attention",
        body | {"expected": expected(autograd(a), ("grad_w_q",), "in_out")},
        422,
    )
    assert err["errors"][0]["field"] == "expected.grad_w_q"


def test_one_sinks_gradient_is_compared_as_a_number(client: TestClient) -> None:
    q, k, v, g = rand(L, D_K), rand(L, D_K), rand(L, D_K), rand(L, D_K)
    tq, tk, tv, ts = (torch.tensor(a, dtype=F64, requires_grad=True) for a in (q, k, v, 0.3))
    logits = torch.cat([tq @ tk.T / D_K**0.5, ts.expand(L, 1)], -1)
    back(logits.softmax(-1)[:, :-1] @ tv, torch.tensor(g, dtype=F64))
    assert ts.grad is not None
    body = {
        "q": q.tolist(),
        "k": k.tolist(),
        "v": v.tolist(),
        "sinks": 0.3,
        "grad_output": g.tolist(),
    }
    for sent, match in ((float(ts.grad), True), (float(ts.grad) + 0.1, False)):
        ans = post(client, "/attention", body | {"expected": {"grad_sinks": sent}})
        assert ans["comparison"][0]["name"] == "grad_sinks"
        assert ans["comparison"][0]["match"] is match
    err = post(client, "/attention", body | {"expected": {"grad_sinks": [float(ts.grad)]}}, 422)
    assert "grad_sinks is a number: give grad_sinks as a number" in err["message"]


# ---- /multihead: nn.MultiheadAttention's state dict, grouped-query attention -------------


class DiagonalSoftmax(torch.autograd.Function):
    """The learner's softmax: its forward right, its backward dS = P ∘ dP (no −D)."""

    @staticmethod
    def forward(ctx: Any, s: Any) -> Any:
        p = torch.softmax(s, -1)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx: Any, d_p: Any) -> Any:
        (p,) = ctx.saved_tensors
        return p * d_p


def mha_by_hand(sd: dict[str, Any], x: Any, h: int, diagonal: bool, seen: list[Any]) -> Any:
    """nn.MultiheadAttention's forward written out (in_proj_weight packed [q; k; v], out_in),
    its backward by autograd but for the learner's softmax; the heads' queries put in
    ``seen`` (their gradient kept)."""
    b, n, e = x.shape
    d = e // h
    qkv = x @ sd["in_proj_weight"].T + sd["in_proj_bias"]
    q, k, v = (t.reshape(b, n, h, d).transpose(1, 2) for t in qkv.split(e, -1))
    q.retain_grad()
    seen.append(q)
    s = q @ k.transpose(-2, -1) / d**0.5
    wrong: Any = DiagonalSoftmax.apply
    p = wrong(s) if diagonal else torch.softmax(s, -1)
    concat = (p @ v).transpose(1, 2).reshape(b, n, e)
    return concat @ sd["out_proj.weight"].T + sd["out_proj.bias"]


NAMES = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")


def mha_case(diagonal: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The body (nn.MultiheadAttention's state dict, float64), autograd's gradients of the
    module, and the learner's (by hand, with the bug or not)."""
    torch.manual_seed(0)
    e, h = 4, 2
    mha = torch.nn.MultiheadAttention(e, h, bias=True, batch_first=True, dtype=F64)
    x, g = rand(B, L, e), rand(B, L, e)
    tx = torch.tensor(x, dtype=F64)
    out, _ = mha(tx, tx, tx, need_weights=False)
    back(out, torch.tensor(g, dtype=F64))
    right = {n: p.grad for n, p in mha.named_parameters()}
    sd = {n: p.detach().clone().requires_grad_(True) for n, p in mha.named_parameters()}
    seen: list[Any] = []
    back(mha_by_hand(sd, tx, h, diagonal, seen), torch.tensor(g, dtype=F64))
    mine = {n: p.grad for n, p in sd.items()} | {"grad_q": seen[0].grad}  # (B, h, L, d)
    body = {"x": x.tolist(), "num_heads": h, "grad_output": g.tolist(),
            **{n: listed(p) for n, p in mha.state_dict().items()}}  # fmt: skip
    return body, right, mine


def test_a_state_dicts_right_gradients_match_under_its_own_names(client: TestClient) -> None:
    body, right, mine = mha_case(diagonal=False)
    for n in NAMES:  # the hand-written layer is the module
        np.testing.assert_allclose(listed(mine[n]), listed(right[n]), rtol=0, atol=1e-12)
    sent = {"grad_state_dict": {n: listed(right[n]) for n in NAMES}}
    ans = post(client, "/multihead", body | {"expected": sent})
    assert ans["first_mismatch"] is None, ans["comparison"]
    # W_o's (made where the backward leaves the projection) before the heads' projections'
    assert [e["name"] for e in ans["comparison"]] == [
        "grad_state_dict.out_proj.weight", "grad_state_dict.out_proj.bias",
        "grad_state_dict.in_proj_weight", "grad_state_dict.in_proj_bias"]  # fmt: skip
    assert all(e["diagnosis"] is None for e in ans["comparison"])


def test_a_state_dicts_wrong_in_proj_weight_is_diagnosed(client: TestClient) -> None:
    body, right, mine = mha_case(diagonal=True)
    for n in ("out_proj.weight", "out_proj.bias"):  # the bug is in the heads, after W_o
        np.testing.assert_allclose(listed(mine[n]), listed(right[n]), rtol=0, atol=1e-12)
    sent = {"grad_state_dict": {n: listed(mine[n]) for n in NAMES}}
    ans = post(client, "/multihead", body | {"expected": sent})
    rows = by_name(ans)
    assert rows["grad_state_dict.out_proj.weight"]["match"]  # W_o's comes before the softmax
    assert ans["first_mismatch"] == "grad_state_dict.in_proj_weight"
    found = rows["grad_state_dict.in_proj_weight"]["diagnosis"]
    assert found["mistakes"] == ["softmax_grad_diagonal"]
    # the bias of the values is right (dV has no D), the packed bias is not: it comes after
    assert not rows["grad_state_dict.in_proj_bias"]["match"]
    assert rows["grad_state_dict.in_proj_bias"]["diagnosis"] is None


def test_w_os_gradient_comes_where_the_backward_makes_it_before_the_heads(
    client: TestClient,
) -> None:
    """The backward makes W_o's gradient as it leaves the output projection, before the
    heads' gradients: a right out_proj.weight is compared before a head's wrong grad_q, which
    is the first difference and is diagnosed."""
    body, _, mine = mha_case(diagonal=True)
    sent = {"grad_state_dict": {"out_proj.weight": listed(mine["out_proj.weight"])},
            "heads": [{"grad_q": listed(mine["grad_q"][:, 0])}, None]}  # fmt: skip
    ans = post(client, "/multihead", body | {"expected": sent})
    assert [e["name"] for e in ans["comparison"]] == [
        "grad_state_dict.out_proj.weight", "heads.0.grad_q"]  # fmt: skip
    assert ans["first_mismatch"] == "heads.0.grad_q"
    assert ans["comparison"][1]["diagnosis"]["mistakes"] == ["softmax_grad_diagonal"]


H, H_KV, D = 4, 2, 2


def gqa(member: int | None) -> tuple[dict[str, Any], Any]:
    """/multihead with 4 query heads on 2 key/value heads, in_out weights, and grad_w_k: the
    right one by autograd (repeat_kv's gradient sums each group), or the learner's taking each
    key/value head's gradient from query head j·2 + ``member`` of its group."""
    x, g = rand(B, L, D_MODEL), rand(B, L, H * D)
    w = {
        "w_q": rand(D_MODEL, H * D),
        "w_k": rand(D_MODEL, H_KV * D),
        "w_v": rand(D_MODEL, H_KV * D),
    }
    tx = torch.tensor(x, dtype=F64)
    tw = {n: torch.tensor(a, dtype=F64, requires_grad=True) for n, a in w.items()}

    def heads(a: Any, n: int) -> Any:
        return a.reshape(B, L, n, D).transpose(1, 2)

    q = heads(tx @ tw["w_q"], H)
    k = heads(tx @ tw["w_k"], H_KV).repeat_interleave(H // H_KV, 1)
    k.retain_grad()
    v = heads(tx @ tw["w_v"], H_KV).repeat_interleave(H // H_KV, 1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    back(out.transpose(1, 2).reshape(B, L, H * D), torch.tensor(g, dtype=F64))
    body = {"x": x.tolist(), "num_heads": H, "num_kv_heads": H_KV, "mask": {"type": "causal"},
            "grad_output": g.tolist(), **{n: a.tolist() for n, a in w.items()}}  # fmt: skip
    if member is None:
        return body, tw["w_k"].grad
    d_k = k.grad[:, member :: H // H_KV]  # (B, h_kv, L, d): one query head's, not the sum
    return body, tx.transpose(-2, -1).matmul(d_k.transpose(1, 2).reshape(B, L, H_KV * D)).sum(0)


def test_gqa_right_grad_w_k_is_summed_per_kv_head(client: TestClient) -> None:
    body, right = gqa(None)
    ans = post(client, "/multihead", body | {"expected": {"grad_w_k": listed(right)}})
    assert ans["first_mismatch"] is None, ans["comparison"]


def test_gqa_grad_w_k_from_one_query_head_is_kv_grad_not_summed(client: TestClient) -> None:
    body, wrong = gqa(member=1)
    ans = post(client, "/multihead", body | {"expected": {"grad_w_k": listed(wrong)}})
    assert ans["first_mismatch"] == "grad_w_k"
    found = ans["comparison"][0]["diagnosis"]
    assert found["mistakes"] == ["kv_grad_not_summed"]
    assert "query head j·2 + 1" in found["explanation"]


def test_a_gradient_the_diagnosis_cannot_recompute_is_compared_never_diagnosed(
    client: TestClient,
) -> None:
    """T5's bias table: its gradient (autograd's, summed by bucket) is compared; a wrong one
    differs with no diagnosis, as the diagnosis's backward does not make it (not a 500, and
    no mistake named for numbers it cannot reproduce)."""
    from transformers.models.t5.modeling_t5 import T5Attention

    s, buckets = 6, 8
    q, k, v, g, table = rand(L, D_K), rand(s, D_K), rand(s, D_K), rand(L, D_K), rand(buckets, 1)
    tt = torch.tensor(table, dtype=F64, requires_grad=True)
    rel = torch.arange(s)[None, :] - torch.arange(L)[:, None]
    bucket = T5Attention._relative_position_bucket(rel, True, buckets, 5)  # type: ignore[no-untyped-call]
    tq, tk, tv = (torch.tensor(a, dtype=F64) for a in (q, k, v))
    back((tq @ tk.T + tt[bucket][..., 0]).softmax(-1) @ tv, torch.tensor(g, dtype=F64))
    body = {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "grad_output": g.tolist(),
            "scale": 1.0, "relative_bias": {"table": table.tolist(), "bidirectional": True,
                                            "max_distance": 5}}  # fmt: skip
    assert tt.grad is not None
    for sent, match in ((tt.grad, True), (tt.grad * 1.1, False)):
        ans = post(
            client, "/attention", body | {"expected": {"grad_relative_bias_table": listed(sent)}}
        )
        entry = ans["comparison"][0]
        assert entry["match"] is match and entry["diagnosis"] is None
