"""The backward pass through the API (API.md, "The backward pass, every step"): every gradient
the answer returns against torch.autograd in float64 of the same computation — torch's
scaled_dot_product_attention and plain torch ops, nn.MultiheadAttention, transformers'
Qwen3Attention under the harness's float64 patches — to 1e-10; then what is refused (422)
and what is too large (413)."""

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fastapi.testclient import TestClient

from service.trace.gradients import check_grad_output
from service.trace.shapes import Shapes
from service.wire.schemas.requests import MultiheadRequest

BAR = 1e-10
F64 = torch.float64
RNG = np.random.default_rng(44)


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> Any:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()


def t(a: Any, grad: bool = False) -> torch.Tensor:
    return torch.tensor(np.asarray(a, dtype=np.float64), dtype=F64, requires_grad=grad)


def close(ours: Any, theirs: torch.Tensor | None, name: str) -> float:
    assert theirs is not None, name
    diff = float(np.max(np.abs(np.asarray(ours, dtype=np.float64) - theirs.detach().numpy())))
    assert diff < BAR, f"{name}: {diff}"
    return diff


def back(out: Any, grad: torch.Tensor) -> None:
    """out.backward(grad): torch's Tensor.backward is untyped."""
    out.backward(grad)


def rand(*shape: int) -> list[Any]:
    return RNG.normal(size=shape).round(3).tolist()  # type: ignore[no-any-return]


# ---- /attention and /mask: torch SDPA and plain torch ------------------------------------


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None
) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("seed", ["array", "sum"])
def test_attention_gradients_equal_sdpa_autograd(
    client: TestClient, batched: bool, seed: str
) -> None:
    B, L, S, d_k, d_v = 2, 3, 4, 2, 3
    q, k, v = rand(B, L, d_k), rand(B, S, d_k), rand(B, S, d_v)
    g = rand(B, L, d_v) if seed == "array" else "sum"
    body = {"q": q, "k": k, "v": v, "grad_output": g}
    if not batched:
        body = {"q": q[0], "k": k[0], "v": v[0], "grad_output": g if g == "sum" else g[0]}
    ans = post(client, "/attention", body)
    tq, tk, tv = t(q, True), t(k, True), t(v, True)
    out = _attend(tq, tk, tv, None)
    dO = torch.ones_like(out) if g == "sum" else t(g)
    back(out, dO)

    def pick(a: torch.Tensor | None) -> torch.Tensor | None:  # the answer drops B unbatched
        return a if batched or a is None else a[0]

    close(ans["grad_q"], pick(tq.grad), "grad_q")
    close(ans["grad_k"], pick(tk.grad), "grad_k")
    close(ans["grad_v"], pick(tv.grad), "grad_v")
    close(ans["grad_output"], pick(dO), "grad_output")
    names = [s["name"] for s in ans["steps"]]
    assert names.index("output") < names.index("grad_output") < names.index("grad_v")
    assert names.index("grad_weights") < names.index("row_dot") < names.index("grad_scaled_scores")
    assert names[-1] in ("grad_q", "grad_k")


def test_masked_intermediates_and_a_masked_cells_ds_is_zero(client: TestClient) -> None:
    """Every intermediate's gradient (torch's retain_grad), under a causal mask and softcap."""
    L, d = 4, 3
    q, k, v, g = rand(L, d), rand(L, d), rand(L, d), rand(L, d)
    ans = post(
        client,
        "/mask",
        {"q": q, "k": k, "v": v, "grad_output": g, "mask": {"type": "causal"}, "softcap": 2.0},
    )
    tq, tk, tv = t(q, True), t(k, True), t(v, True)
    scores = tq @ tk.T
    scaled = scores / d**0.5
    capped = 2.0 * torch.tanh(scaled / 2.0)
    allowed = torch.tril(torch.ones(L, L, dtype=torch.bool))
    masked = capped.masked_fill(~allowed, float("-inf"))
    weights = masked.softmax(-1)
    out = weights @ tv
    for a in (scores, scaled, capped, masked, weights):
        a.retain_grad()
    back(out, t(g))
    close(ans["grad_weights"], weights.grad, "grad_weights")
    close(ans["grad_masked_scores"], masked.grad, "grad_masked_scores")
    close(ans["grad_capped_scores"], capped.grad, "grad_capped_scores")
    close(ans["grad_scaled_scores"], scaled.grad, "grad_scaled_scores")
    close(ans["grad_scores"], scores.grad, "grad_scores")
    close(ans["grad_q"], tq.grad, "grad_q")
    close(ans["grad_k"], tk.grad, "grad_k")
    ds = np.array(ans["grad_masked_scores"])
    assert (ds[~allowed.numpy()] == 0).all()
    D = (np.array(g) * np.array(ans["output"])).sum(-1)
    np.testing.assert_allclose(ans["row_dot"], D, rtol=0, atol=BAR)


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
def test_projections_give_grad_x_and_the_weights_in_the_requests_layout(
    client: TestClient, layout: str
) -> None:
    L, d_model, d_k = 3, 4, 2
    x, ctx = rand(2, L, d_model), rand(2, 5, d_model)
    w = {n: rand(d_model, d_k) for n in ("w_q", "w_k", "w_v")}
    given = {n: (np.array(a).T.tolist() if layout == "out_in" else a) for n, a in w.items()}
    g = rand(2, L, d_k)
    body = {"x": x, "context": ctx, **given, "b_q": [0.1, -0.2], "weight_layout": layout,
            "grad_output": g, "rope": True, "positions": [0, 1, 2], "context_positions": [0, 1, 2, 3, 4]}  # fmt: skip
    ans = post(client, "/attention", body)
    tx, tc = t(x, True), t(ctx, True)
    tw = {n: t(a, True) for n, a in w.items()}
    bq = t([0.1, -0.2], True)
    q, k, v = tx @ tw["w_q"] + bq, tc @ tw["w_k"], tc @ tw["w_v"]

    def rot(a: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # RoPE, half style, base 10000
        half = a.shape[-1] // 2
        theta = 10000.0 ** (-torch.arange(half, dtype=F64) * 2 / a.shape[-1])
        ang = pos[:, None].to(F64) * theta
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        a1, a2 = a[..., :half], a[..., half:]
        return a * cos + torch.cat([-a2, a1], -1) * sin

    out = _attend(rot(q, torch.arange(3)), rot(k, torch.arange(5)), v, None)
    back(out, t(g))
    close(ans["grad_x"], tx.grad, "grad_x")
    close(ans["grad_context"], tc.grad, "grad_context")
    close(ans["grad_b_q"], bq.grad, "grad_b_q")
    for n in ("w_q", "w_k", "w_v"):
        grad = tw[n].grad
        assert grad is not None
        close(ans[f"grad_{n}"], grad.T if layout == "out_in" else grad, f"grad_{n}")


def test_a_decode_step_with_past_and_its_cache_gradients_when_asked(client: TestClient) -> None:
    P, L, d = 3, 2, 2
    pk, pv, q, k, v, g = rand(P, d), rand(P, d), rand(L, d), rand(L, d), rand(L, d), rand(L, d)
    body = {"q": q, "k": k, "v": v, "past": {"k": pk, "v": pv}, "grad_output": g}
    ans = post(client, "/attention", body)
    assert "grad_past_k" not in ans  # only when include names it
    asked = post(
        client, "/attention", {**body, "include": ["grad_past_k", "grad_past_v", "grad_q"]}
    )
    tensors = [t(a, True) for a in (pk, pv, q, k, v)]
    tpk, tpv, tq, tk, tv = tensors
    keys, values = torch.cat([tpk, tk]), torch.cat([tpv, tv])
    allowed = torch.ones(L, P + L, dtype=torch.bool).tril(P)  # lower-right causal
    back(_attend(tq, keys, values, allowed), t(g))
    for name, a in zip(("grad_past_k", "grad_past_v", "grad_q"), (tpk, tpv, tq), strict=True):
        close(asked[name], a.grad, name)
    close(ans["grad_k"], tk.grad, "grad_k")
    close(ans["grad_v"], tv.grad, "grad_v")


def test_sinks_gradient_on_attention(client: TestClient) -> None:
    L, d = 3, 2
    q, k, v, g = rand(L, d), rand(L, d), rand(L, d), rand(L, d)
    ans = post(client, "/attention", {"q": q, "k": k, "v": v, "sinks": 0.3, "grad_output": g})
    tq, tk, tv, ts = t(q, True), t(k, True), t(v, True), t(0.3, True)
    s = tq @ tk.T / d**0.5
    logits = torch.cat([s, ts.expand(L, 1)], -1)
    out = logits.softmax(-1)[:, :-1] @ tv
    back(out, t(g))
    assert isinstance(ans["grad_sinks"], float)  # a number, as sinks is on /attention
    close(ans["grad_sinks"], ts.grad, "grad_sinks")
    close(ans["grad_q"], tq.grad, "grad_q")


# ---- /multihead: nn.MultiheadAttention, GQA, transformers' Qwen3Attention ---------------


@pytest.mark.parametrize("form", ["in_proj", "combined_out_in"])
def test_multihead_equals_nn_multihead_attention(client: TestClient, form: str) -> None:
    """nn.MultiheadAttention in float64 with a key padding mask, then a residual and a layer
    norm with γ and β: grad_x, the weights (grad_state_dict under torch's names), γ, β."""
    torch.manual_seed(0)
    B, L, E, h = 2, 3, 4, 2
    mha = torch.nn.MultiheadAttention(E, h, bias=True, batch_first=True, dtype=F64)
    x, g = rand(B, L, E), rand(B, L, E)
    gamma, beta = rand(E), rand(E)
    pad = [[False, False, True], [False, False, False]]
    sd = {k: v.detach().numpy().tolist() for k, v in mha.state_dict().items()}
    if form == "in_proj":
        weights = {"in_proj_weight": sd["in_proj_weight"], "in_proj_bias": sd["in_proj_bias"],
                   "out_proj.weight": sd["out_proj.weight"], "out_proj.bias": sd["out_proj.bias"]}  # fmt: skip
    else:
        wq, wk, wv = np.split(np.array(sd["in_proj_weight"]), 3)
        bq, bk, bv = np.split(np.array(sd["in_proj_bias"]), 3)
        weights = {"w_q": wq.tolist(), "w_k": wk.tolist(), "w_v": wv.tolist(), "b_q": bq.tolist(),
                   "b_k": bk.tolist(), "b_v": bv.tolist(), "w_o": sd["out_proj.weight"],
                   "b_o": sd["out_proj.bias"], "weight_layout": "out_in"}  # fmt: skip
    body = {"x": x, "num_heads": h, **weights, "key_padding_mask": pad, "residual": True,
            "layer_norm": {"gamma": gamma, "beta": beta}, "grad_output": g}  # fmt: skip
    ans = post(client, "/multihead", body)
    tx = t(x, True)
    attn, _ = mha(tx, tx, tx, key_padding_mask=torch.tensor(pad))
    tg, tb = t(gamma, True), t(beta, True)
    out = F.layer_norm(attn + tx, (E,), tg, tb)
    back(out, t(g))
    close(ans["grad_x"], tx.grad, "grad_x")
    close(ans["grad_ln_gamma"], tg.grad, "grad_ln_gamma")
    close(ans["grad_ln_beta"], tb.grad, "grad_ln_beta")
    grads = {k: p.grad for k, p in mha.named_parameters()}
    if form == "in_proj":
        sd_grads = ans["grad_state_dict"]
        assert set(sd_grads) == {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias",
                                 "layer_norm.gamma", "layer_norm.beta"}  # fmt: skip
        for name in ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"):
            close(sd_grads[name], grads[name], name)
    else:
        assert "grad_state_dict" not in ans
        in_w = grads["in_proj_weight"]
        assert in_w is not None
        for i, n in enumerate("qkv"):
            close(ans[f"grad_w_{n}"], in_w[i * E : (i + 1) * E], f"grad_w_{n}")  # out_in as given
        close(ans["grad_w_o"], grads["out_proj.weight"], "grad_w_o")
        close(ans["grad_b_o"], grads["out_proj.bias"], "grad_b_o")


def test_gqa_heads_given_directly_sum_each_kv_heads_gradient(client: TestClient) -> None:
    """q, k, v per head with 4 query heads on 2 key/value heads and W_o: grad_k, grad_v per
    key/value head at the top level (summed over its group), grad_q per head."""
    B, h, h_kv, L, d = 2, 4, 2, 3, 2
    q, k, v = rand(B, h, L, d), rand(B, h_kv, L, d), rand(B, h_kv, L, d)
    w_o, g = rand(h * d, 3), rand(B, L, 3)
    ans = post(client, "/multihead", {"q": q, "k": k, "v": v, "w_o": w_o, "grad_output": g,
                                       "mask": {"type": "causal"}})  # fmt: skip
    tq, tk, tv, two = t(q, True), t(k, True), t(v, True), t(w_o, True)
    out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
    back(out.transpose(1, 2).reshape(B, L, h * d) @ two, t(g))
    close(ans["grad_k"], tk.grad, "grad_k")
    close(ans["grad_v"], tv.grad, "grad_v")
    assert np.array(ans["grad_k"]).shape == (B, h_kv, L, d)
    assert tq.grad is not None
    close([head["grad_q"] for head in ans["heads"]], tq.grad.transpose(0, 1), "grad_q")
    assert "grad_k" not in ans["heads"][0]
    close(ans["grad_w_o"], two.grad, "grad_w_o")


def test_qwen3_layer_grad_state_dict_equals_transformers_autograd(client: TestClient) -> None:
    """transformers' Qwen3Attention (GQA 4/2, q_norm, k_norm, RoPE) in float64 under the
    harness's patches: grad_x and grad_state_dict under its own names."""
    from transformers import Qwen3Config
    from transformers import modeling_rope_utils as hf_rope
    from transformers.models.qwen3 import modeling_qwen3

    from harness import hf_reference as hf

    config = Qwen3Config(hidden_size=8, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                         rms_norm_eps=1e-6, num_hidden_layers=1, vocab_size=10,
                         intermediate_size=8,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    attn = modeling_qwen3.Qwen3Attention(config, 0).double()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("norm.weight") else 0.0))
    B, L = 2, 4
    x, g = rand(B, L, 8), rand(B, L, 8)
    tx = t(x, True)
    allowed = torch.ones(L, L, dtype=torch.bool).tril()
    mask = torch.zeros(L, L, dtype=F64).masked_fill(~allowed, torch.finfo(F64).min)
    with hf.float64_torch_in(modeling_qwen3, hf_rope):
        rotary = modeling_qwen3.Qwen3RotaryEmbedding(config)
        cos, sin = rotary(tx, torch.arange(L)[None].expand(B, -1))
        out, _ = attn(hidden_states=tx, position_embeddings=(cos, sin),
                      attention_mask=mask[None, None].expand(B, 1, L, L))  # fmt: skip
        back(out, t(g))
    state = {k: v.detach().numpy().tolist() for k, v in attn.state_dict().items()}
    body = {"x": x, "num_heads": 4, **state, "mask": {"type": "causal"}, "grad_output": g,
            "rope": {"base": 10000.0, "style": "half", "rotary_dim": 4}}  # fmt: skip
    ans = post(client, "/multihead", body)
    close(ans["grad_x"], tx.grad, "grad_x")
    theirs = dict(attn.named_parameters())
    assert set(ans["grad_state_dict"]) == set(theirs)
    for name, p in theirs.items():
        close(ans["grad_state_dict"][name], p.grad, name)


def test_per_head_weights_get_their_gradients_per_head(client: TestClient) -> None:
    L, d_model, d = 3, 4, 2
    x, g = rand(L, d_model), rand(L, 2 * d)
    heads = [{"w_q": rand(d_model, d), "w_k": rand(d_model, d), "w_v": rand(d_model, d),
              "b_q": rand(d)} for _ in range(2)]  # fmt: skip
    ans = post(client, "/multihead", {"x": x, "num_heads": 2, "heads": heads, "grad_output": g})
    tx = t(x, True)
    tw = [{n: t(a, True) for n, a in head.items()} for head in heads]
    outs = [_attend(tx @ w["w_q"] + w["b_q"], tx @ w["w_k"], tx @ w["w_v"], None) for w in tw]
    back(torch.cat(outs, -1), t(g))
    sd = ans["grad_state_dict"]
    assert set(sd) == {f"heads.{i}.{n}" for i in range(2) for n in ("w_q", "w_k", "w_v", "b_q")}
    for i, w in enumerate(tw):
        for n, a in w.items():
            close(sd[f"heads.{i}.{n}"], a.grad, f"heads.{i}.{n}")
    close(ans["grad_x"], tx.grad, "grad_x")


def test_the_gradient_steps_come_after_the_forwards_in_reverse_order(client: TestClient) -> None:
    body = {"seed": 2, "seq_len": 3, "d_model": 4, "num_heads": 2, "residual": True,
            "layer_norm": True, "grad_output": rand(3, 4), "rope": True}  # fmt: skip
    ans = post(client, "/multihead", body)
    names = [s["name"] for s in ans["steps"]]
    backward = names[names.index("grad_layer_norm") :]
    assert backward[:4] == ["grad_layer_norm", "grad_residual", "grad_projected", "grad_concat"]
    assert backward.index("grad_q_rotated") < backward.index("grad_q") < backward.index("grad_w_q")
    for step in ans["steps"][names.index("grad_layer_norm") :]:
        assert step["formula"].startswith(step["name"] + " = ") and step["shape"]
    assert "grad_w_q" in ans and "grad_state_dict" not in ans  # generated: in_out


def test_the_steps_and_the_comparison_walk_the_backward_in_one_order(client: TestClient) -> None:
    """Every gradient given back as expected is compared in the order of the gradient steps:
    a parameter's right after the gradient its step reads (γ, β after grad_layer_norm; W_o,
    b_o after grad_projected; the sinks after dP; a norm's weight after its input's), the
    projections' last."""
    body = {"seed": 5, "seq_len": 3, "d_model": 4, "num_heads": 2, "residual": True,
            "layer_norm": {"gamma": rand(4), "beta": rand(4)}, "b_o": rand(4), "b_q": rand(4),
            "qk_norm": {"q_weight": rand(2), "k_weight": rand(2)}, "sinks": rand(2),
            "mask": {"type": "causal"}, "grad_output": rand(3, 4)}  # fmt: skip
    ans = post(client, "/multihead", body)
    names = [s["name"] for s in ans["steps"]]
    steps = [n for n in names[names.index("grad_layer_norm") :] if n != "grad_output"]
    grads = {n: ans[n] for n in steps if n in ans}
    heads = [{n: h[n] for n in steps if n in h} for h in ans["heads"]]
    compared = post(client, "/multihead", body | {"expected": grads | {"heads": heads}})
    order = [c["name"].split(".")[-1] for c in compared["comparison"]]
    walked = [n for i, n in enumerate(order) if n != "grad_output" and n not in order[:i]]
    assert walked == steps, (walked, steps)
    at = steps.index
    assert at("grad_layer_norm") < at("grad_ln_gamma") < at("grad_residual")
    assert at("grad_projected") < at("grad_b_o") < at("grad_concat")
    assert at("grad_weights") < at("grad_sinks") < at("grad_masked_scores")
    assert at("grad_q_normed") < at("grad_q_norm_weight") and steps[-1] == "grad_x"


# ---- refused, too large -------------------------------------------------------------------

Q3 = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]


@pytest.mark.parametrize(
    ("path", "extra", "words"),
    [
        ("/attention", {"grad_output": [[1.0, 2.0]]}, "gradient of output, which is 3×2"),
        ("/attention", {"grad_output": "mean"}, '"sum"'),
        ("/attention", {"grad_output": [[1.0, None], [0, 0], [0, 0]]}, "grad_output"),
        ("/attention", {"grad_output": [[True, 1.0], [0, 0], [0, 0]]}, "grad_output"),
    ],
)
def test_what_the_backward_cannot_take_is_a_422_naming_grad_output(
    client: TestClient, path: str, extra: dict[str, Any], words: str
) -> None:
    body = {"q": Q3, "k": Q3, "v": Q3, **extra}
    err = post(client, path, body, 422)
    assert err["errors"][0]["field"] == "grad_output", err
    assert words in err["errors"][0]["message"], err


def test_multihead_refusals_name_grad_output_and_the_variant(client: TestClient) -> None:
    wrong = post(client, "/multihead", {"seed": 1, "seq_len": 3, "d_model": 4, "num_heads": 2,
                                         "residual": True, "grad_output": rand(3, 3)}, 422)  # fmt: skip
    assert "gradient of residual, which is 3×4" in wrong["errors"][0]["message"]
    shapes = Shapes(endpoint="multihead", batch=None, seq_len=3, ctx_len=3, d_model=8, d_k=4,
                    d_v=2, on=frozenset({"mla", "rope"}))  # fmt: skip
    req = MultiheadRequest.model_validate({"grad_output": "sum"})
    assert check_grad_output(req, shapes).backward  # mla's backward: tests/api/test_backward_mla.py


def test_the_backwards_numbers_count_against_the_limits(client: TestClient) -> None:
    """A request whose forward fits but whose gradients do not: a 413 before computing."""
    from service.config import Settings
    from service.trace import admit
    from service.wire.errors import LimitError
    from service.wire.schemas.requests import AttentionRequest

    L = 40
    body = {"q": rand(L, 8), "k": rand(L, 8), "v": rand(L, 8)}
    forward = admit(AttentionRequest.model_validate(body), "attention", Settings())
    both = admit(
        AttentionRequest.model_validate({**body, "grad_output": "sum"}), "attention", Settings()
    )
    assert both.numbers > 1.9 * forward.numbers
    tight = Settings(max_computed_numbers=(forward.numbers + both.numbers) // 2)
    admit(AttentionRequest.model_validate(body), "attention", tight)
    with pytest.raises(LimitError):
        admit(AttentionRequest.model_validate({**body, "grad_output": "sum"}), "attention", tight)
