"""The backward pass on the forms the first wiring refused (API.md, "The backward pass, every
step"): FlashAttention-2's block-by-block backward (``online_softmax_backward``), fused
projections and the other state-dict forms packed back under their own names, T5's bucket
table, multi-head latent attention. Each against torch.autograd in float64 of torch code
written here or of transformers' own layers, to 1e-10."""

from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from tests.api.test_backward import F64, back, close, post, t

RNG = np.random.default_rng(4404)


def rand(*shape: int) -> list[Any]:
    return RNG.normal(size=shape).round(3).tolist()  # type: ignore[no-any-return]


def side_by_side(blocks: list[dict[str, Any]], name: str, axis: int) -> np.ndarray:
    return np.concatenate([np.asarray(b[name], dtype=np.float64) for b in blocks], axis=axis)


# ---- 1. FlashAttention-2's backward, block by block ---------------------------------------


@pytest.mark.parametrize("block", [1, 2, 5])
def test_online_softmax_backward_equals_autograd_block_by_block(
    client: TestClient, block: int
) -> None:
    """/attention, batched, causal, softcap and a sink: each block's p the weights' columns,
    dv and dk side by side dV and dK, the last dq dQ, ds the scaled scores' gradient, all
    against torch.autograd of the same computation written in torch."""
    B, L, S, d_k, d_v, cap, sink = 2, 4, 5, 3, 2, 1.5, 0.4
    q, k, v, g = rand(B, L, d_k), rand(B, S, d_k), rand(B, S, d_v), rand(B, L, d_v)
    body = {"q": q, "k": k, "v": v, "grad_output": g, "online_softmax": {"block_size": block},
            "mask": {"type": "causal"}, "softcap": cap, "sinks": sink}  # fmt: skip
    ans = post(client, "/attention", body)
    tq, tk, tv = t(q, True), t(k, True), t(v, True)
    scaled = tq @ tk.transpose(-1, -2) / d_k**0.5
    capped = cap * torch.tanh(scaled / cap)
    allowed = torch.ones(L, S, dtype=torch.bool).tril()  # upper_left, torch is_causal
    masked = capped.masked_fill(~allowed, float("-inf"))
    scaled.retain_grad()
    logits = torch.cat([masked, torch.full((B, L, 1), sink, dtype=F64)], -1)
    weights = logits.softmax(-1)[..., :S]
    back(weights @ tv, t(g))
    blocks = ans["online_softmax_backward"]
    assert [b["keys"] for b in blocks] == [[a, min(a + block, S)] for a in range(0, S, block)]
    close(side_by_side(blocks, "p", -1), weights, "p")
    close(side_by_side(blocks, "ds", -1), scaled.grad, "ds")  # the softcap's factor applied
    close(side_by_side(blocks, "dv", -2), tv.grad, "dv")
    close(side_by_side(blocks, "dk", -2), tk.grad, "dk")
    close(blocks[-1]["dq"], tq.grad, "dq")
    close(ans["grad_q"], tq.grad, "grad_q")
    dp = (t(g) @ tv.transpose(-1, -2)).detach()
    close(side_by_side(blocks, "dp", -1), dp, "dp")
    assert (side_by_side(blocks, "ds", -1)[:, ~allowed.numpy()] == 0).all()
    names = [s["name"] for s in ans["steps"]]
    tail = [f"online_softmax_backward keys {a}…{min(a + block, S) - 1}" for a in range(0, S, block)]
    assert names[-len(tail) :] == tail


def test_online_softmax_backward_per_head_under_gqa_with_rope(client: TestClient) -> None:
    """/multihead, 4 query heads on 2 key/value heads, RoPE, W_o, a batch whose second item's
    last query row is padding: each head's blocks inside heads[i]; its dk side by side the
    gradient of the rotated keys it read (repeated per query head), its last dq that of its
    rotated queries, a padded row's p 0."""
    B, L, d_model, h, h_kv, d = 2, 3, 4, 4, 2, 2
    x, g = rand(B, L, d_model), rand(B, L, d_model)
    w_q, w_k, w_v, w_o = rand(d_model, h * d), rand(d_model, h_kv * d), rand(d_model, h_kv * d), rand(h * d, d_model)  # fmt: skip
    body = {"x": x, "num_heads": h, "num_kv_heads": h_kv, "w_q": w_q, "w_k": w_k, "w_v": w_v,
            "w_o": w_o, "grad_output": g, "online_softmax": {"block_size": 2}, "rope": True,
            "mask": [{"type": "causal"}, {"type": "padding", "query_lengths": [3, 2]}]}  # fmt: skip
    ans = post(client, "/multihead", body)
    tx = t(x, True)
    q = (tx @ t(w_q)).reshape(B, L, h, d).transpose(1, 2)
    k = (tx @ t(w_k)).reshape(B, L, h_kv, d).transpose(1, 2)
    v = (tx @ t(w_v)).reshape(B, L, h_kv, d).transpose(1, 2)
    pos = torch.arange(L, dtype=F64)
    theta = 10000.0 ** (-torch.arange(d // 2, dtype=F64) * 2 / d)
    ang = pos[:, None] * theta
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rot(a: torch.Tensor) -> torch.Tensor:
        a1, a2 = a[..., : d // 2], a[..., d // 2 :]
        return a * cos + torch.cat([-a2, a1], -1) * sin

    qr = rot(q)
    kr = rot(k).repeat_interleave(h // h_kv, 1)
    vr = v.repeat_interleave(h // h_kv, 1)
    for a in (qr, kr, vr):
        a.retain_grad()
    allowed = torch.ones(L, L, dtype=torch.bool).tril()
    kept = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=F64)[:, None, :, None]
    s = (qr @ kr.transpose(-1, -2) / d**0.5).masked_fill(~allowed, float("-inf"))
    p = s.softmax(-1) * kept  # a padded query row: weights 0
    out = p @ vr
    back(out.transpose(1, 2).reshape(B, L, h * d) @ t(w_o), t(g))
    assert qr.grad is not None and kr.grad is not None and vr.grad is not None
    for i, head in enumerate(ans["heads"]):
        blocks = head["online_softmax_backward"]
        assert [b["keys"] for b in blocks] == [[0, 2], [2, 3]]
        close(blocks[-1]["dq"], qr.grad[:, i], f"dq {i}")
        close(side_by_side(blocks, "dk", -2), kr.grad[:, i], f"dk {i}")
        close(side_by_side(blocks, "dv", -2), vr.grad[:, i], f"dv {i}")
        close(side_by_side(blocks, "p", -1), p[:, i], f"p {i}")
        assert not side_by_side(blocks, "p", -1)[1, 2].any()
    close(ans["grad_x"], tx.grad, "grad_x")


# ---- 2. the state dict's own forms: transformers' layers in float64, backward ---------------

# the cases of tests/wire/test_config_layers.py whose parameters the folds unpack or rename
FORMS = {
    "phi3-longrope-long": "qkv_proj rows",
    "gpt_neox-per_head-fused": "query_key_value per_head",
    "falcon-new_decoder-grouped": "query_key_value grouped",
    "falcon-per_head-bias": "query_key_value per_head, biases",
    "mpt-alibi-clip-softmax_scale": "Wqkv rows",
    "dbrx-rows-gqa-clip": "Wqkv rows, GQA",
    "gpt2-columns-inverse_layer_idx": "c_attn columns (Conv1D), c_proj transposed",
    "gpt_bigcode-multi_query-rows": "c_attn rows (Linear), c_proj as it is",
    "codegen-blocks-rotary_dim": "qkv_proj codegen",
    "gemma4-full-k_eq_v": "k_eq_v",
    "qwen3_next-full": "gate: true",
    "qwen3_5-full-gate": "gate: true",
    "stablelm-qk_layernorm-per-head": "StableLM's per-head norms",
    "hunyuan_v1_dense-alpha-norm_after_rope": "HunYuan's query_layernorm",
    "bert-block-post_ln": "BERT's output.LayerNorm",
    "t5-encoder-layer0": "T5's relative_attention_bias.weight",
    "t5-decoder-causal": "T5's relative_attention_bias.weight, causal",
}


def _autograd(layer: Any, x: np.ndarray, positions: list[int], g: np.ndarray) -> Any:
    """The layer run as tests/wire/test_config_layers.py's _run runs it, with gradients: x's
    and every parameter's, from dO = g."""
    from transformers import modeling_rope_utils as hf_rope

    from harness.hf_reference import _widened, float64_torch_in

    xs = torch.tensor(x[None], dtype=F64, requires_grad=True)
    pos = torch.tensor(positions)[None]
    with float64_torch_in(layer.modeling, hf_rope), _widened():
        mask = layer.mask_fn(layer.config, xs, None, None, position_ids=pos)
        rotary: dict[str, Any] = {"position_ids": pos} if layer.position_ids else {}
        if layer.rotary is not None:
            rotary["position_embeddings"] = layer.rotary(xs, pos)
        out, _ = layer.attn(hidden_states=xs, attention_mask=mask, **rotary, **layer.forward_kwargs)
        back(out, torch.tensor(g[None], dtype=F64))
    return xs.grad, dict(layer.attn.named_parameters())


def config_case(case: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """tests/wire/test_config_layers.py's layer ``case`` from its config, in float64 with
    random weights: torch.autograd's grad_x and parameters from dO = g, and the request body
    (x, the layer's state dict, the config, grad_output g)."""
    from tests.wire import test_config_layers as layers

    _, build, layer, positions, _ = next(c for c in layers.CASES if c[0] == case)
    cfg, hf = build(layer)
    hf.attn = hf.attn.double().eval()
    layers._fill(hf, 100 + layer)
    rng = np.random.default_rng(layer)
    x = rng.normal(size=(layers.L, layers.SIZES["hidden_size"]))
    g = rng.normal(size=(layers.L, layers.SIZES["hidden_size"]))
    at = list(range(layers.L)) if positions is None else positions
    grad_x, params = _autograd(hf, x, at, g)
    body: dict[str, Any] = {"x": x.tolist(), **layers._state(hf), "config": cfg, "layer": layer,
                            "grad_output": g.tolist()}  # fmt: skip
    if positions is not None:
        body["positions"] = body["context_positions"] = positions
    return grad_x, params, body


@pytest.mark.torch
@pytest.mark.parametrize("case", list(FORMS), ids=list(FORMS))
def test_grad_state_dict_under_the_modules_own_names(client: TestClient, case: str) -> None:
    """grad_x and grad_state_dict, keyed exactly as the module's named_parameters(), against
    torch.autograd of transformers' own layer (float64, the harness's patches)."""
    grad_x, params, body = config_case(case)
    body["include"] = ["grad_x", "grad_state_dict"]
    ans = post(client, "/multihead", body)
    close(ans["grad_x"], grad_x[0], "grad_x")
    ours = ans["grad_state_dict"]
    assert set(ours) == set(params), (sorted(ours), sorted(params))
    for name, p in params.items():
        close(ours[name], p.grad, name)


def test_relative_bias_tables_gradient_on_attention(client: TestClient) -> None:
    """relative_bias on /attention: grad_relative_bias_table [num_buckets][1] is the bias's
    gradient summed by T5's bucket (transformers' own _relative_position_bucket here)."""
    from transformers.models.t5.modeling_t5 import T5Attention

    L, S, d, buckets = 4, 6, 3, 8
    q, k, v, g = rand(L, d), rand(S, d), rand(S, d), rand(L, d)
    table = rand(buckets, 1)
    body = {"q": q, "k": k, "v": v, "grad_output": g, "scale": 1.0,
            "relative_bias": {"table": table, "bidirectional": True, "max_distance": 5}}  # fmt: skip
    ans = post(client, "/attention", body)
    tq, tt = t(q, True), t(table, True)
    rel = torch.arange(S)[None, :] - torch.arange(L)[:, None]
    bucket = T5Attention._relative_position_bucket(rel, True, buckets, 5)  # type: ignore[no-untyped-call]
    bias = tt[bucket][..., 0]  # (L, S)
    back((tq @ t(k).T + bias).softmax(-1) @ t(v), t(g))
    close(ans["grad_relative_bias_table"], tt.grad, "grad_relative_bias_table")
    close(ans["grad_q"], tq.grad, "grad_q")


def test_k_eq_v_with_heads_given_directly_sums_both_reads_into_grad_k(
    client: TestClient,
) -> None:
    """k_eq_v with q, k given per head (Gemma 4's full layers, the projections done by the
    caller): the given k is read as the keys (through an RMS norm with weights, two query heads
    to each key head, causal) and as the values, so its gradient is both reads', as autograd
    gives it for one tensor read twice; grad_v is the values' read alone."""
    h, h_kv, L, d = 4, 2, 3, 4
    q, k, g = rand(h, L, d), rand(h_kv, L, d), rand(L, h * d)
    wq, wk = rand(d), rand(d)
    body = {"q": q, "k": k, "num_heads": h, "num_kv_heads": h_kv, "k_eq_v": True,
            "mask": {"type": "causal"}, "qk_norm": {"q_weight": wq, "k_weight": wk, "eps": 1e-6},
            "grad_output": g}  # fmt: skip
    ans = post(client, "/multihead", body)

    def rms(a: torch.Tensor, w: list[float]) -> torch.Tensor:
        return a / torch.sqrt((a * a).mean(-1, keepdim=True) + 1e-6) * t(w)

    tq, tk = t(q, True), t(k, True)
    keys = rms(tk, wk).repeat_interleave(h // h_kv, dim=0)  # (h, L, d)
    values = tk.repeat_interleave(h // h_kv, dim=0)  # the same k, before the norm
    causal = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
    scores = (rms(tq, wq) @ keys.transpose(1, 2) / d**0.5).masked_fill(causal, -torch.inf)
    out = scores.softmax(-1) @ values  # (h, L, d)
    back(out.transpose(0, 1).reshape(L, h * d), t(g))
    assert tk.grad is not None
    close(ans["grad_k"], tk.grad, "grad_k")  # [h_kv][L][d]: both reads
    close([hd["grad_q"] for hd in ans["heads"]], tq.grad, "grad_q")  # per query head
    p = out.detach().new_tensor(np.stack([hd["weights"] for hd in ans["heads"]]))
    d_out = t(g).reshape(L, h, d).transpose(0, 1)  # (h, L, d)
    grad_v = (p.transpose(1, 2) @ d_out).reshape(h_kv, h // h_kv, L, d).sum(1)
    close(ans["grad_v"], grad_v, "grad_v")  # the values' read alone
    assert np.abs(np.asarray(ans["grad_k"]) - grad_v.numpy()).max() > 1e-3  # not the same read


def _users_k_eq_v_backward(q: Any, k: Any, g: Any, diagonal: bool) -> tuple[Any, Any]:
    """A learner's NumPy backward of two causal heads whose values are their keys: dK and
    dV per head, the softmax's Jacobian taken as diagonal when ``diagonal`` (dS = P ∘ dP)."""
    q_, k_ = np.asarray(q), np.asarray(k)
    h, L, d = q_.shape
    s = q_ @ k_.transpose(0, 2, 1) / np.sqrt(d) + np.triu(np.full((L, L), -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    d_o = np.asarray(g).reshape(L, h, d).transpose(1, 0, 2)
    d_p = d_o @ k_.transpose(0, 2, 1)  # dO Vᵀ, V = K
    d_s = p * d_p if diagonal else p * (d_p - (d_p * p).sum(-1, keepdims=True))
    d_k = d_s.transpose(0, 2, 1) @ q_ / np.sqrt(d)
    d_v = p.transpose(0, 2, 1) @ d_o
    return d_k, d_v


def test_k_eq_v_gradients_are_diagnosed_from_both_reads(client: TestClient) -> None:
    """Under k_eq_v the diagnosis recomputes grad_k (k given per head) and grad_w_k (x given)
    as the answer makes them, both reads summed: a learner's diagonal softmax Jacobian is named
    on either, and the keys' read alone (the values' forgotten) matches no listed mistake."""
    h, L, d = 2, 3, 2
    q, k, g = rand(h, L, d), rand(h, L, d), rand(L, h * d)
    body = {"q": q, "k": k, "num_heads": h, "k_eq_v": True, "mask": {"type": "causal"},
            "grad_output": g}  # fmt: skip
    d_k, d_v = _users_k_eq_v_backward(q, k, g, diagonal=True)

    def each(a: Any) -> dict[str, Any]:  # a head's grad_k in each head's object
        return {"expected": {"heads": [{"grad_k": a[i].tolist()} for i in range(h)]}}

    found = post(client, "/multihead", body | each(d_k + d_v))
    assert found["comparison"][0]["diagnosis"]["mistakes"] == ["softmax_grad_diagonal"]
    d_k, d_v = _users_k_eq_v_backward(q, k, g, diagonal=False)
    right = post(client, "/multihead", body | each(d_k + d_v))
    assert all(c["match"] for c in right["comparison"]), right["comparison"]
    half = post(client, "/multihead", body | each(d_k))
    assert half["comparison"][0]["diagnosis"] is None, half["comparison"]
    assert "No listed mistake" in half["comparison"][0]["message"]

    x, w_q, w_k = np.asarray(rand(L, 4)), np.asarray(rand(4, 4)), np.asarray(rand(4, 4))
    q_x = (x @ w_q).reshape(L, h, d).transpose(1, 0, 2)
    k_x = (x @ w_k).reshape(L, h, d).transpose(1, 0, 2)
    d_k, d_v = _users_k_eq_v_backward(q_x, k_x, g, diagonal=True)
    merged = (d_k + d_v).transpose(1, 0, 2).reshape(L, h * d)  # the heads side by side
    body = {"x": x.tolist(), "w_q": w_q.tolist(), "w_k": w_k.tolist(), "num_heads": h,
            "k_eq_v": True, "mask": {"type": "causal"}, "grad_output": g,
            "expected": {"grad_w_k": (x.T @ merged).tolist()}}  # fmt: skip
    found = post(client, "/multihead", body)
    assert found["comparison"][0]["diagnosis"]["mistakes"] == ["softmax_grad_diagonal"]


@pytest.mark.torch
@pytest.mark.parametrize(
    "case",
    ["olmo-clip_qkv", "gptj-rotary_dim-interleaved", "phi3-longrope-long", "t5-decoder-causal",
     "gemma4-full-k_eq_v", "bert-block-post_ln", "deepseek_v3-mla-yarn", "qwen3_next-full",
     "mpt-alibi-clip-softmax_scale"],
)  # fmt: skip
def test_config_fields_are_the_layer_the_config_gave(client: TestClient, case: str) -> None:
    """conventions.config_fields says which fields a config gave and how the service read
    them: the same body without config, with those fields, answers the same numbers (forward
    and backward)."""
    _, _, body = config_case(case)
    with_config = post(client, "/multihead", body)
    fields = with_config["conventions"]["config_fields"]
    named = {key.split(".")[0] for key in with_config["conventions"]["config"]}
    assert fields and set(fields) <= named, (sorted(fields), sorted(named))
    restated = {"config", "layer"}
    if "table" in fields.get("relative_bias", {}):  # T5's: the state dict's, as the config read it
        restated.add("relative_attention_bias.weight")
    plain = {k: v for k, v in body.items() if k not in restated} | fields
    without = post(client, "/multihead", plain)
    assert "config" not in without["conventions"]
    for name in ("output", "grad_x", "heads"):
        assert without[name] == with_config[name], name
