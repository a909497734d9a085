"""The gradients no forward map has beside it, in a real browser against a real server: with x
and the weights given (not generated) there is no x or w_q card, and no card is a bias's, a
sink's, a norm's weight's or a layer norm's γ, so their gradients (and a /multihead head's share
of dO, its grad_scores, the keys' and values' per key/value head) are drawn in a section of their
own after the maps (gradient-params.js). Every grad_* array of the answer is drawn somewhere, with
the service's numbers in its cells, and a clicked cell of the new section is explained with
torch.autograd's number (float64, written here, never the service's functions)."""

import json
from typing import Any

import pytest
import torch

from tests.browser.support import map_cells, wait_idle
from tests.browser.test_backward_view import (
    D_O,
    W_K,
    W_O,
    W_Q,
    W_V,
    X,
    _explain,
    _fill,
    _open_projections,
    _pattern,
    _run_backward,
)

pytestmark = pytest.mark.e2e

T = torch.float64
SECTION = "#param-grads"
B_Q = [0.1, -0.2, 0.3, 0.05]
B_K = [0.0, 0.4, -0.1, 0.2]
B_V = [-0.3, 0.1, 0.2, 0.0]
SINK = 0.3
# /multihead: two query heads of d_k = 2 sharing one key/value head
B_Q4 = [0.2, -0.1, 0.05, 0.3]
B_KV = [0.1, -0.2]
B_VV = [0.3, 0.1]
SINKS = [0.1, -0.2]
QN = [1.1, 0.9]
KN = [0.5, 1.5]
QK_EPS = 1e-6
LN: dict[str, Any] = {"gamma": [1.0, 2.0, 0.5, -1.0], "beta": [0.1, 0.0, -0.2, 0.3], "eps": 1e-5}


def _t(m: Any) -> torch.Tensor:
    return torch.tensor(m, dtype=T, requires_grad=True)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """Causal softmax attention whose every row has one more logit, the sink, with no value."""
    n, d = q.shape[0], q.shape[1]
    s = q @ k.T / d**0.5
    s = s.masked_fill(~torch.tril(torch.ones(n, k.shape[0], dtype=torch.bool)), float("-inf"))
    p = torch.softmax(torch.cat([s, sink.expand(n, 1)], dim=1), dim=1)
    return p[:, :-1] @ v


def _back(out: torch.Tensor, d_o: Any) -> None:
    """loss = Σ out ∘ dO, backward (torch's Tensor.backward is untyped)."""
    loss: Any = (out * torch.tensor(d_o, dtype=T)).sum()
    loss.backward()


def _section_names(page: Any, visible: bool = False) -> list[str]:
    """The names of the new section's cards (only those shown, with `visible`)."""
    found: list[str] = page.locator(f"{SECTION} figure.heatmap").evaluate_all(
        "(els, visible) => els.filter(e => !visible || e.offsetParent !== null)"
        ".map(e => e.dataset.name)",
        visible,
    )
    return found


def _every_gradient_drawn(page: Any, data: dict[str, Any]) -> set[str]:
    """Every grad_* array of the answer is a card on the page (beside its forward card or in the
    new section, once), its cells the service's numbers; returns the new section's names."""
    names: list[str] = page.locator("#results figure.heatmap").evaluate_all(
        "els => els.map(e => e.dataset.name)"
    )
    assert len(names) == len(set(names)), names
    heads = data.get("heads") or []
    want: dict[str, Any] = {}
    for name, a in data.items():
        if not name.startswith("grad_") or name == "grad_state_dict":
            continue
        if heads and all(name in h for h in heads) and len(torch.tensor(a).shape) == 3:
            continue  # /multihead's stack of the heads' own (grad_weights [h][L][S]): per head
        if data.get("num_kv_heads") and name in ("grad_k", "grad_v"):  # [h_kv][S][·]
            want.update({f"kv{g}_{name}": m for g, m in enumerate(a)})
        else:
            want[name] = a
    for h, head in enumerate(heads):
        want.update({f"head{h}_{n}": a for n, a in head.items() if n.startswith("grad_")})
    missing = sorted(set(want) - set(names))
    assert missing == [], missing
    for key, a in want.items():
        m = torch.tensor(a, dtype=T).reshape(
            -1, torch.tensor(a).shape[-1] if torch.tensor(a).dim() else 1
        )
        cells = map_cells(page, key)
        assert len(cells) == m.numel(), key
        for (i, j), said in cells.items():
            assert float(said) == pytest.approx(m[i, j].item(), abs=1e-12, rel=1e-12), (key, i, j)
    return set(_section_names(page))


def _cell(page: Any, name: str, i: int, j: int, want: float, service: float) -> str:
    """Click cell (i, j) of the new section's card `name`: the page's total is torch's and the
    service's; returns the explanation's text."""
    fig = page.locator(f'{SECTION} figure[data-name="{name}"]')
    assert fig.count() == 1, name
    total, text = _explain(page, name, i, j)
    assert total == pytest.approx(want, abs=1e-12, rel=1e-12), (name, i, j, text)
    assert total == pytest.approx(service, abs=1e-12, rel=1e-12), (name, i, j)
    return text


def test_attention_with_x_weights_biases_and_a_sink_draws_every_gradient(page: Any) -> None:
    """/attention, x and in_out weights given, biases, a sink, causal, the page's pattern as dO:
    grad_x, the weights', the biases' and the sink's gradients (no card beside) are drawn after
    the maps; their cells are torch's."""
    _open_projections(page, "attention", {"x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V})
    page.fill("#tokens", "the cat sat")
    page.select_option("#weight_layout", "in_out")
    page.fill("#extra", f'{{"b_q": {B_Q}, "b_k": {B_K}, "b_v": {B_V}}}')
    page.fill("#sinks", str(SINK))
    page.check("#causal")
    page.select_option("#grad_mode", "pattern")
    body, data = _run_backward(page, "attention")
    assert body["b_q"] == B_Q and body["sinks"] == SINK and "w_q" in body
    section = _every_gradient_drawn(page, data)
    params = {"grad_x", "grad_w_q", "grad_w_k", "grad_w_v", "grad_b_q", "grad_b_k", "grad_b_v",
              "grad_sinks"}  # fmt: skip
    assert section == params, section
    assert page.locator(SECTION).is_visible()
    # torch: the same forward in float64, its backward with the pattern as dO
    x, wq, wk, wv, bq, bk, bv = map(_t, (X, W_Q, W_K, W_V, B_Q, B_K, B_V))
    sink = _t(SINK)
    out = _attend(x @ wq + bq, x @ wk + bk, x @ wv + bv, sink)
    _back(out, _pattern(3, 4))
    assert x.grad is not None and wq.grad is not None and bq.grad is not None
    assert sink.grad is not None
    text = _cell(page, "grad_x", 1, 3, x.grad[1, 3].item(), data["grad_x"][1][3])
    assert "grad_x[1][3]" in text
    _cell(page, "grad_w_q", 2, 1, wq.grad[2, 1].item(), data["grad_w_q"][2][1])
    text = _cell(page, "grad_b_q", 0, 2, bq.grad[2].item(), data["grad_b_q"][2])
    assert "grad_b_q[2]" in text
    text = _cell(page, "grad_sinks", 0, 0, sink.grad.item(), data["grad_sinks"])
    assert "grad_sinks" in text
    # keyboard: focus a cell of the section and press Enter
    page.keyboard.press("Escape")
    page.locator(
        f'{SECTION} figure[data-name="grad_w_k"] rect.cell[data-row="3"][data-col="0"]'
    ).focus()
    page.keyboard.press("Enter")
    page.locator("#explain .explain-title").filter(has_text="grad_w_k[3][0]").wait_for()
    total = page.locator("#explain .explain-total").get_attribute("data-total")
    assert wk.grad is not None and float(total or "nan") == pytest.approx(
        wk.grad[3, 0].item(), abs=1e-12
    )


def _rms(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return z / torch.sqrt((z * z).mean(dim=-1, keepdim=True) + QK_EPS) * w


def test_multihead_state_dict_norms_sinks_layer_norm_gqa_draws_every_gradient(page: Any) -> None:
    """/multihead, a state dict (q_proj.weight … out_in) with biases, RMS qk_norm weights, a sink
    per head, the residual and a layer norm with γ and β, two query heads on one key/value head,
    causal, dO pasted: every gradient is drawn (the heads' shares of dO and grad_scores, the keys'
    and values' per key/value head, the parameters'), and clicked cells are torch's."""
    page.locator("body[data-ready=true]").wait_for(timeout=20_000)
    page.select_option("#endpoint", "multihead")
    wait_idle(page)
    page.select_option("#mode", "projections")
    page.select_option("#weight_names", "state_dict")
    _fill(page, {"x": X, "w_q": W_Q, "w_k": W_K[:2], "w_v": W_V[2:], "w_o": W_O})
    page.fill("#tokens", "the cat sat")
    page.fill("#context", "")
    page.fill("#num_heads", "2")
    page.fill("#num_kv_heads", "1")
    page.check("#causal")
    page.check("#residual")
    page.check("#layer_norm")
    page.select_option("#qk_norm", "rms")
    page.evaluate("document.getElementById('layers-more').open = true")
    page.fill("#qk_norm_eps", str(QK_EPS))
    page.fill("#qk_norm_q_weight", " ".join(map(str, QN)))
    page.fill("#qk_norm_k_weight", " ".join(map(str, KN)))
    page.fill("#sinks", " ".join(map(str, SINKS)))
    extra = {"q_proj.bias": B_Q4, "k_proj.bias": B_KV, "v_proj.bias": B_VV, "layer_norm": LN}
    page.fill("#extra", json.dumps(extra))
    page.select_option("#grad_mode", "mine")
    _fill(page, {"grad_output": D_O})
    body, data = _run_backward(page, "multihead")
    assert body["q_proj.weight"] == W_Q and body["num_kv_heads"] == 1 and body["sinks"] == SINKS
    assert body["layer_norm"] == LN and body["grad_output"] == D_O, body
    section = _every_gradient_drawn(page, data)
    want = {"grad_x", "grad_w_q", "grad_w_k", "grad_w_v", "grad_w_o", "grad_b_q", "grad_b_k",
            "grad_b_v", "grad_sinks", "grad_q_norm_weight", "grad_k_norm_weight",
            "grad_ln_gamma", "grad_ln_beta", "kv0_grad_k", "kv0_grad_v",
            "head0_grad_output", "head1_grad_output", "head0_grad_scores", "head1_grad_scores"}  # fmt: skip
    assert section == want, (section - want, want - section)
    # torch: the layer in float64 (out_in weights, PyTorch's), its backward with dO
    x, wq, wk, wv, wo, bq, bk, bv, sinks, qn, kn, gamma, beta = map(
        _t,
        (X, W_Q, W_K[:2], W_V[2:], W_O, B_Q4, B_KV, B_VV, SINKS, QN, KN, LN["gamma"], LN["beta"]),
    )
    q, k, v = x @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv
    k.retain_grad()
    kk = _rms(k, kn)
    outs = [_attend(_rms(q[:, 2 * h : 2 * h + 2], qn), kk, v, sinks[h]) for h in range(2)]
    concat = torch.cat(outs, dim=1)
    concat.retain_grad()
    z = x + concat @ wo.T
    ln = torch.nn.functional.layer_norm(z, (4,), gamma, beta, LN["eps"])
    _back(ln, D_O)
    grads = {n: t.grad for n, t in (("x", x), ("w_q", wq), ("b_q", bq), ("sinks", sinks),
             ("qn", qn), ("gamma", gamma), ("k", k), ("concat", concat))}  # fmt: skip
    g = {n: a for n, a in grads.items() if a is not None}
    assert len(g) == len(grads)
    assert torch.allclose(torch.tensor(data["grad_x"], dtype=T), g["x"], atol=1e-12)
    _cell(page, "grad_x", 2, 1, g["x"][2, 1].item(), data["grad_x"][2][1])
    # grad_w_q is in_out (the state dict's own, out_in, is grad_state_dict's): W.grad's transpose
    _cell(page, "grad_w_q", 3, 1, g["w_q"][1, 3].item(), data["grad_w_q"][3][1])
    _cell(page, "grad_b_q", 0, 2, g["b_q"][2].item(), data["grad_b_q"][2])
    text = _cell(page, "grad_sinks", 0, 1, g["sinks"][1].item(), data["grad_sinks"][1])
    assert "grad_sinks[1]" in text
    _cell(page, "grad_q_norm_weight", 0, 1, g["qn"][1].item(), data["grad_q_norm_weight"][1])
    _cell(page, "grad_ln_gamma", 0, 3, g["gamma"][3].item(), data["grad_ln_gamma"][3])
    # a key/value head's keys: its query heads' copies summed; the title names the head
    text = _cell(page, "kv0_grad_k", 2, 0, g["k"][2, 0].item(), data["grad_k"][0][2][0])
    assert "(key/value head 0)" in text and "batch item" not in text
    # the picker's head 1: its own cards show, head 0's hide; the key/value head it reads shows
    page.select_option("#head-pick", "1")
    shown = set(_section_names(page, visible=True))
    assert {"head1_grad_output", "kv0_grad_k", "grad_x"} <= shown, shown
    assert not {"head0_grad_output", "head0_grad_scores"} & shown, shown
    # a head's share of dO: grad_concat's columns 2 and 3, as the block passed it back
    _cell(
        page,
        "head1_grad_output",
        1,
        0,
        g["concat"][1, 2].item(),
        data["heads"][1]["grad_output"][1][0],
    )


X2 = [[r[3], r[2], r[1], r[0]] for r in X]  # the second batch item: x's features reversed


def test_a_batched_answer_draws_the_picked_items_gradients(page: Any) -> None:
    """/multihead, x batched [2][3][4], in_out weights, a query bias, two query heads on one
    key/value head, the pattern as dO: batch item 1 picked, grad_x's and a head's dO share's cards
    are item 1's and explained as item 1's (torch's); the parameters' (summed over the items) stay
    one card; the keys' per key/value head are item 1's, drawn and explained as item 1's key/value
    head 0 (torch's)."""
    page.locator("body[data-ready=true]").wait_for(timeout=20_000)
    page.select_option("#endpoint", "multihead")
    wait_idle(page)
    page.select_option("#mode", "projections")
    page.select_option("#weight_names", "w")
    _fill(page, {"x": X, "w_q": W_Q, "w_k": [r[:2] for r in W_K], "w_v": [r[:2] for r in W_V]})
    for field in ("#tokens", "#context", "#w_o"):
        page.fill(field, "")
    page.select_option("#weight_layout", "in_out")
    page.fill("#num_heads", "2")
    page.fill("#num_kv_heads", "1")
    page.fill("#extra", json.dumps({"x": [X, X2], "b_q": B_Q4}))
    page.select_option("#grad_mode", "pattern")
    body, data = _run_backward(page, "multihead")
    assert body["x"] == [X, X2] and len(body["grad_output"]) == 2
    page.select_option("#batch", "1")
    wait_idle(page)
    section = set(_section_names(page))
    assert {"grad_x", "grad_w_q", "grad_b_q", "kv0_grad_k", "head1_grad_output"} <= section
    item = {k: v[1] for k, v in data.items() if k in ("grad_x", "grad_k")}
    for key, m in (("grad_x", item["grad_x"]), ("kv0_grad_k", item["grad_k"][0]),
                   ("grad_w_q", data["grad_w_q"])):  # fmt: skip
        cells = map_cells(page, key)
        assert all(float(v) == m[i][j] for (i, j), v in cells.items()), key
    # torch: item 1 alone (the parameters' gradients are both items')
    x, wq, wk, wv, bq = map(_t, ([X, X2], W_Q, [r[:2] for r in W_K], [r[:2] for r in W_V], B_Q4))
    q, k, v = x @ wq + bq, x @ wk, x @ wv
    k.retain_grad()  # the key/value head's keys: its two query heads' reads
    outs = [torch.cat([_unmasked(q[b, :, 2 * h : 2 * h + 2], k[b], v[b]) for h in range(2)], dim=1)
            for b in range(2)]  # fmt: skip
    _back(torch.stack(outs), body["grad_output"])
    assert x.grad is not None and wq.grad is not None
    text = _cell(page, "grad_x", 2, 3, x.grad[1, 2, 3].item(), data["grad_x"][1][2][3])
    assert "batch item 1" in text
    _cell(page, "grad_w_q", 1, 2, wq.grad[1, 2].item(), data["grad_w_q"][1][2])
    assert k.grad is not None
    text = _cell(page, "kv0_grad_k", 1, 0, k.grad[1, 1, 0].item(), data["grad_k"][1][0][1][0])
    assert "key/value head 0, batch item 1" in text


def _unmasked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention without a mask."""
    return torch.softmax(q @ k.T / q.shape[1] ** 0.5, dim=1) @ v
