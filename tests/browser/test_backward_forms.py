"""The page's backward on /multihead's other request forms (issue 44's page work): the output
gate's weights (gate {w, b}, gate: true's rows in q_proj.weight), weights under PyTorch's,
a state dict's and the heads' own names, k_eq_v, a positional encoding, BERT's output.LayerNorm
and a family's config with its state dict. For each, every cell of the block's, the
projections' and the gate's gradients is computed again by the page and equals the service's to
1e-12, none is "unexplained", and cells are checked against torch.autograd of the layer written
here (float64; torch.nn.MultiheadAttention for in_proj_weight; transformers' own layers for the
configs), never the service's functions."""

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from tests.api.test_backward import back
from tests.browser.support import post_json
from tests.browser.test_backward_view import D_O, RECOMPUTE_GRADIENTS, W_K, W_O, W_Q, W_V, X

pytestmark = pytest.mark.e2e

Array = npt.NDArray[np.float64]
F64 = torch.float64
RNG = np.random.default_rng(4444)

# the block's, the projections' and the gate's gradients: this file's arrays
MINE = ("grad_x", "grad_concat", "grad_gated", "grad_gate", "grad_projected", "grad_residual",
        "grad_layer_norm", "grad_ln_gamma", "grad_ln_beta", "grad_gate_w", "grad_gate_b")  # fmt: skip


def rand(*shape: int) -> list[Any]:
    return RNG.normal(scale=0.5, size=shape).round(3).tolist()  # type: ignore[no-any-return]


def _t(a: Any) -> torch.Tensor:
    return torch.tensor(np.asarray(a, dtype=np.float64), dtype=F64, requires_grad=True)


def _layer(
    x: Any,
    w: dict[str, Any],
    heads: int,
    d_o: Any,
    *,
    kv_heads: int | None = None,
    gate: tuple[Any, Any] | None = None,
    pe: Any = None,
    past: tuple[Any, Any] | None = None,
    clip: float | None = None,
    causal: bool = False,
    residual: bool = False,
    ln: tuple[Any, Any, float] | None = None,
) -> dict[str, Array]:
    """/multihead by hand in torch float64 and torch.autograd's gradients: ``w`` holds out_in
    weights w_q, w_k, w_v, w_o (nn.Linear's) and biases b_*; ``gate`` (W_g out_in, b_g); ``pe``
    added to x; under k_eq_v give no w_v (the values are the keys' projection); ``past`` the
    cache (k, v) [h_kv][P][d] before the new tokens' keys and values; ``clip`` clamps q, k, v
    right after the projections (OLMo); causal lower-right (new token i sees the cache and new
    keys 0 … i)."""
    xt = _t(x)
    p = {n: _t(a) for n, a in w.items()}
    x_in = xt + torch.tensor(pe, dtype=F64) if pe is not None else xt

    def lin(name: str, inp: torch.Tensor) -> torch.Tensor:
        out = inp @ p["w_" + name].T
        return out + p["b_" + name] if "b_" + name in p else out

    q, k = lin("q", x_in), lin("k", x_in)
    v = lin("v", x_in) if "w_v" in p else k
    if clip is not None:
        q, k, v = (t.clamp(-clip, clip) for t in (q, k, v))
    d = q.shape[1] // heads
    group = heads // (kv_heads or heads)
    cache = None if past is None else (_t(past[0]), _t(past[1]))
    outs = []
    for h in range(heads):
        kv = h // group
        keys, values = k[:, kv * d : (kv + 1) * d], v[:, kv * d : (kv + 1) * d]
        if cache is not None:
            keys, values = torch.cat([cache[0][kv], keys]), torch.cat([cache[1][kv], values])
        s = q[:, h * d : (h + 1) * d] @ keys.T / np.sqrt(d)
        if causal:
            n, m = s.shape
            allowed = torch.ones(n, m, dtype=torch.bool).tril(m - n)
            s = s.masked_fill(~allowed, float("-inf"))
        outs.append(torch.softmax(s, dim=-1) @ values)
    concat = torch.cat(outs, dim=1)
    g_t = None
    if gate is not None:
        g_w, g_b = _t(gate[0]), _t(gate[1]) if gate[1] is not None else None
        z = x_in @ g_w.T + (g_b if g_b is not None else 0)
        concat = concat * torch.sigmoid(z)
        g_t = (g_w, g_b)
    out = lin("o", concat) if "w_o" in p else concat
    if residual:
        out = out + x_in
    lnp = None
    if ln is not None:
        lnp = (_t(ln[0]), _t(ln[1]))
        out = torch.nn.functional.layer_norm(out, (out.shape[1],), lnp[0], lnp[1], ln[2])
    back(out, torch.tensor(d_o, dtype=F64))
    grads = {"x": xt.grad} | {n: t.grad for n, t in p.items()}
    if g_t is not None:
        grads["gate_w"] = g_t[0].grad
        if g_t[1] is not None:
            grads["gate_b"] = g_t[1].grad
    if cache is not None:
        grads["past_k"], grads["past_v"] = cache[0].grad, cache[1].grad
    if lnp is not None:
        grads["ln_gamma"], grads["ln_beta"] = lnp[0].grad, lnp[1].grad
    return {n: g.numpy() for n, g in grads.items() if g is not None}


def _rows(page: Any, data: dict[str, Any], body: dict[str, Any]) -> Any:
    """Every gradient cell of the answer, as the page computes it: none "unexplained" (a
    config layer's heads and norms read with the fields the config gave), each the service's
    to 1e-12."""
    args = {"endpoint": "multihead", "data": data, "request": body}
    rows = page.evaluate(RECOMPUTE_GRADIENTS, args)
    bad = [r for r in rows if r[5] is not None and abs(r[5] - r[6]) > 1e-12 * max(1, abs(r[6]))]
    assert bad == [], bad[:10]
    mine = [r for r in rows if r[1] is None and _mine(r[0])]
    assert mine, "no gradient of this file's"
    lost = [r[:5] for r in rows if r[5] is None]
    assert lost == [], lost[:10]  # none "unexplained"
    return rows


def _mine(name: str) -> bool:
    return name in MINE or name.startswith(("grad_w_", "grad_b_"))


def _page_of(rows: Any) -> dict[tuple[str, int, int], float]:
    return {(r[0], r[2], r[3]): r[5] for r in rows if r[1] is None}


def _near(page_total: float, want: float) -> None:
    assert page_total == pytest.approx(want, abs=1e-12, rel=1e-12)


def _explained(
    page: Any, data: dict[str, Any], body: dict[str, Any], name: str, i: int, j: int
) -> str:
    """The explanation's text of cell (i, j) of `name` (what a click shows)."""
    text: str = page.evaluate(
        """async ([data, request, name, i, j]) => {
          const m = await import('/static/explain.js');
          const box = m.explainCell({endpoint: 'multihead', data, request, name, head: null,
                                     batch: null, i, j});
          if (box.querySelector('.explain-mismatch')) throw new Error('mismatch');
          return box.textContent;
        }""",
        [data, body, name, i, j],
    )
    assert "does not compute" not in text, text
    return text


def T(m: list[list[float]]) -> list[list[float]]:
    """A weight in the other layout (in_out ↔ out_in)."""
    return np.asarray(m).T.tolist()  # type: ignore[no-any-return]


GATE_W = rand(4, 4)  # [h·d_v][d_model], out_in
GATE_B = rand(4)
PE = rand(3, 4)


def test_the_gate_with_a_positional_encoding(page: Any, server: str) -> None:
    """gate {w, b}, x + PE, W_o and the residual: grad_gate_w, grad_gate_b (back through the
    sigmoid, against x_in), grad_x with the gate's share, the weights against x_in."""
    body = {"x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "w_o": W_O, "num_heads": 2,
            "gate": {"w": GATE_W, "b": GATE_B}, "positional_encoding": PE, "residual": True,
            "grad_output": D_O}  # fmt: skip
    data = post_json(server, "multihead", body)
    rows = _rows(page, data, body)
    kinds = {r[4] for r in rows}
    assert {"gate-w-back", "gate-b-back", "x-back-forms", "weight-back-forms"} <= kinds, kinds
    w = {"w_q": T(W_Q), "w_k": T(W_K), "w_v": T(W_V), "w_o": T(W_O)}
    ref = _layer(X, w, 2, D_O, gate=(GATE_W, GATE_B), pe=PE, residual=True)
    page_of = _page_of(rows)
    _near(page_of[("grad_gate_w", 1, 3)], ref["gate_w"][1, 3])
    _near(page_of[("grad_gate_b", 0, 2)], ref["gate_b"][2])
    _near(page_of[("grad_x", 2, 1)], ref["x"][2, 1])
    _near(page_of[("grad_w_k", 3, 0)], ref["w_k"][0, 3])  # in_out: [m][c]
    # NumPy: dz = grad_gate ∘ gate ∘ (1 − gate), summed against x + PE
    g, s = np.array(data["grad_gate"]), np.array(data["gate"])
    want = ((np.array(X) + np.array(PE)).T @ (g * s * (1 - s))).T
    _near(page_of[("grad_gate_w", 2, 0)], want[2, 0])
    text = _explained(page, data, body, "grad_gate_w", 1, 3)
    assert "dz = grad_gate ∘ gate ∘ (1 − gate)" in text and "x_in[i][3]" in text, text
    text = _explained(page, data, body, "grad_x", 2, 1)
    assert "Σ_c dz[2][c] · W_g[c][1]" in text and "grad_residual[2][1]" in text, text


def test_gate_true_reads_the_gate_rows_of_q_proj(page: Any, server: str) -> None:
    """gate: true with a state dict: q_proj.weight and q_proj.bias hold each head's d query rows
    then its d gate rows; grad_gate_w, grad_gate_b, grad_w_q (the query rows), grad_x."""
    q_rows, q_bias = rand(8, 4), rand(8)
    body = {"x": X, "q_proj.weight": q_rows, "q_proj.bias": q_bias, "k_proj.weight": rand(4, 4),
            "v_proj.weight": rand(4, 4), "o_proj.weight": rand(4, 4), "gate": True,
            "num_heads": 2, "grad_output": D_O}  # fmt: skip
    data = post_json(server, "multihead", body)
    rows = _rows(page, data, body)
    assert {"grad_gate_w", "grad_gate_b", "grad_w_q", "grad_x"} <= {r[0] for r in rows}
    query = [0, 1, 4, 5]
    gate = [2, 3, 6, 7]
    w = {"w_q": [q_rows[r] for r in query], "b_q": [q_bias[r] for r in query],
         "w_k": body["k_proj.weight"], "w_v": body["v_proj.weight"], "w_o": body["o_proj.weight"]}  # fmt: skip
    ref = _layer(X, w, 2, D_O, gate=([q_rows[r] for r in gate], [q_bias[r] for r in gate]))
    page_of = _page_of(rows)
    _near(page_of[("grad_gate_w", 3, 2)], ref["gate_w"][3, 2])
    _near(page_of[("grad_gate_b", 0, 1)], ref["gate_b"][1])
    _near(page_of[("grad_w_q", 1, 2)], ref["w_q"][2, 1])  # in_out
    _near(page_of[("grad_x", 0, 3)], ref["x"][0, 3])
    text = _explained(page, data, body, "grad_x", 0, 3)
    assert "gate rows" in text and "query rows" in text, text


def test_in_proj_weight_equals_nn_multihead_attention(page: Any, server: str) -> None:
    """PyTorch's in_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias: grad_w_q …
    (in_out), the biases, grad_w_o, grad_x, each torch.nn.MultiheadAttention's."""
    ipw, ipb, opw, opb = rand(12, 4), rand(12), rand(4, 4), rand(4)
    body = {"x": X, "in_proj_weight": ipw, "in_proj_bias": ipb, "out_proj_weight": opw,
            "out_proj_bias": opb, "num_heads": 2, "grad_output": D_O}  # fmt: skip
    data = post_json(server, "multihead", body)
    rows = _rows(page, data, body)
    assert {"weight-back-forms", "x-back-forms", "bias-back-forms"} <= {r[4] for r in rows}
    mha = torch.nn.MultiheadAttention(4, 2, batch_first=True, dtype=F64)
    with torch.no_grad():
        for p, a in ((mha.in_proj_weight, ipw), (mha.in_proj_bias, ipb),
                     (mha.out_proj.weight, opw), (mha.out_proj.bias, opb)):  # fmt: skip
            p.copy_(torch.tensor(a, dtype=F64))
    x = torch.tensor([X], dtype=F64, requires_grad=True)
    out, _ = mha(x, x, x, need_weights=False)
    back(out, torch.tensor([D_O], dtype=F64))
    assert x.grad is not None and mha.in_proj_weight.grad is not None
    assert mha.in_proj_bias.grad is not None and mha.out_proj.weight.grad is not None
    page_of = _page_of(rows)
    _near(page_of[("grad_x", 1, 2)], float(x.grad[0, 1, 2]))
    _near(page_of[("grad_w_k", 2, 1)], float(mha.in_proj_weight.grad[4 + 1, 2]))  # in_out [m][c]
    _near(page_of[("grad_w_v", 0, 3)], float(mha.in_proj_weight.grad[8 + 3, 0]))
    _near(page_of[("grad_b_k", 0, 3)], float(mha.in_proj_bias.grad[4 + 3]))
    _near(page_of[("grad_w_o", 2, 1)], float(mha.out_proj.weight.grad[1, 2]))
    text = _explained(page, data, body, "grad_w_k", 2, 1)
    assert "in_proj_weight's k rows" in text, text


def test_the_heads_own_weights_out_in(page: Any, server: str) -> None:
    """heads: each head's w_q, w_k, w_v (out_in) and a query bias, W_o: grad_w_q … side by side
    (in_out), grad_b_q, grad_x."""
    heads = [
        {"w_q": rand(2, 4), "w_k": rand(2, 4), "w_v": rand(2, 4), "b_q": rand(2)} for _ in "ab"
    ]
    body = {"x": X, "heads": heads, "num_heads": 2, "weight_layout": "out_in", "w_o": T(W_O),
            "grad_output": D_O}  # fmt: skip
    data = post_json(server, "multihead", body)
    rows = _rows(page, data, body)
    w = {f"w_{n}": heads[0][f"w_{n}"] + heads[1][f"w_{n}"] for n in "qkv"}
    w |= {"b_q": heads[0]["b_q"] + heads[1]["b_q"], "w_o": T(W_O)}
    ref = _layer(X, w, 2, D_O)
    page_of = _page_of(rows)
    _near(page_of[("grad_w_v", 3, 2)], ref["w_v"][2, 3])
    _near(page_of[("grad_b_q", 0, 3)], ref["b_q"][3])
    _near(page_of[("grad_x", 2, 0)], ref["x"][2, 0])
    _near(page_of[("grad_w_o", 1, 0)], ref["w_o"][1, 0])  # w_o out_in: its gradient too


def test_a_state_dict_with_grouped_heads_and_the_block(page: Any, server: str) -> None:
    """q_proj.weight … o_proj.weight (out_in; grouped-query: one key/value head), their biases,
    the residual and a layer norm with γ, β: every cell, grad_w_k's summed over the group."""
    sd = {"q_proj.weight": rand(4, 4), "k_proj.weight": rand(2, 4), "v_proj.weight": rand(2, 4),
          "o_proj.weight": rand(4, 4), "q_proj.bias": rand(4), "k_proj.bias": rand(2),
          "o_proj.bias": rand(4)}  # fmt: skip
    ln = {"gamma": [1.0, 2.0, 0.5, -1.0], "beta": [0.1, 0.0, -0.2, 0.3], "eps": 1e-5}
    body = {"x": X, **sd, "num_heads": 2, "residual": True, "layer_norm": ln, "grad_output": D_O}
    data = post_json(server, "multihead", body)
    rows = _rows(page, data, body)
    w = {"w_q": sd["q_proj.weight"], "w_k": sd["k_proj.weight"], "w_v": sd["v_proj.weight"],
         "w_o": sd["o_proj.weight"], "b_q": sd["q_proj.bias"], "b_k": sd["k_proj.bias"],
         "b_o": sd["o_proj.bias"]}  # fmt: skip
    ref = _layer(X, w, 2, D_O, kv_heads=1, residual=True, ln=(ln["gamma"], ln["beta"], 1e-5))
    page_of = _page_of(rows)
    _near(page_of[("grad_w_k", 3, 1)], ref["w_k"][1, 3])  # in_out
    _near(page_of[("grad_b_k", 0, 0)], ref["b_k"][0])
    _near(page_of[("grad_w_o", 2, 3)], ref["w_o"][3, 2])
    _near(page_of[("grad_x", 1, 1)], ref["x"][1, 1])
    _near(page_of[("grad_ln_gamma", 0, 2)], ref["ln_gamma"][2])


def test_k_eq_v_the_keys_weight_gets_both_reads(page: Any, server: str) -> None:
    """k_eq_v with k_proj.weight and its bias: grad_w_k and grad_b_k hold the keys' and the
    values' reads; grad_x reads W_k twice."""
    wq, wk, bk = rand(4, 4), rand(4, 4), rand(4)
    body = {"x": X, "q_proj.weight": wq, "k_proj.weight": wk, "k_proj.bias": bk, "k_eq_v": True,
            "num_heads": 2, "grad_output": D_O}  # fmt: skip
    data = post_json(server, "multihead", body)
    rows = _rows(page, data, body)
    assert "grad_w_v" not in data
    ref = _layer(X, {"w_q": wq, "w_k": wk, "b_k": bk}, 2, D_O)
    page_of = _page_of(rows)
    _near(page_of[("grad_w_k", 0, 2)], ref["w_k"][2, 0])
    _near(page_of[("grad_b_k", 0, 1)], ref["b_k"][1])
    _near(page_of[("grad_x", 2, 3)], ref["x"][2, 3])
    text = _explained(page, data, body, "grad_w_k", 0, 2)
    assert "k_eq_v" in text and "grad_v[i][2]" in text, text


def test_bert_output_layer_norm_and_a_config(page: Any, server: str) -> None:
    """A family's config (BERT) with its state dict (self.query.weight …, output.dense.weight,
    output.LayerNorm.weight/.bias, the config's layer_norm_eps): every cell, against
    transformers' BertAttention under torch.autograd."""
    grad_x, params, body = _config_case("bert-block-post_ln")
    data = post_json(server, "multihead", body)
    rows = _rows(page, data, body)
    assert {"grad_ln_gamma", "grad_ln_beta", "grad_w_q", "grad_b_o"} <= {r[0] for r in rows}
    page_of = _page_of(rows)
    _near(page_of[("grad_x", 3, 5)], float(grad_x[0, 3, 5]))
    _near(page_of[("grad_w_q", 7, 2)], float(params["self.query.weight"].grad[2, 7]))
    _near(page_of[("grad_ln_gamma", 0, 4)], float(params["output.LayerNorm.weight"].grad[4]))
    _near(page_of[("grad_w_o", 1, 6)], float(params["output.dense.weight"].grad[6, 1]))


@pytest.mark.parametrize("case", ["gemma4-full-k_eq_v", "qwen3_next-full"])
def test_a_config_with_k_eq_v_or_the_gate(page: Any, server: str, case: str) -> None:
    """Gemma 4's full layer (the config's attention_k_eq_v) and Qwen3-Next's (the config's gate
    in q_proj.weight): grad_x and the weights' cells, against transformers' layer."""
    grad_x, params, body = _config_case(case)
    data = post_json(server, "multihead", body)
    rows = _rows(page, data, body)
    page_of = _page_of(rows)
    _near(page_of[("grad_w_k", 5, 1)], float(params["k_proj.weight"].grad[1, 5]))
    _near(page_of[("grad_w_o", 0, 3)], float(params["o_proj.weight"].grad[3, 0]))
    if "gate" in data:  # grad_gate_w is q_proj.weight's gate rows' gradient: head 0's d..2d
        d = int(data["d_k"])
        _near(page_of[("grad_gate_w", 1, 4)], float(params["q_proj.weight"].grad[d + 1, 4]))
    assert {"grad_x", "grad_w_q"} <= {r[0] for r in rows}
    assert page_of[("grad_x", 0, 0)] is not None and grad_x is not None


def _config_case(case: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """tests/api/test_backward_forms.py's layer from its config: torch.autograd's grad_x and
    parameters, and the request body."""
    from tests.api.test_backward_forms import config_case

    return config_case(case)
