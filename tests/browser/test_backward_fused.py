"""The page's backward on /multihead's last three forms (issue 44's page work): a decode step with
a cache (`past`), OLMo's clamp of q, k, v (`clip_qkv`) and the fused projections as their
modules store them (Phi-3's qkv_proj, GPT-NeoX's and Falcon's query_key_value, MPT's and DBRX's
Wqkv, GPT-2's Conv1D c_attn and c_proj, GPTBigCode's c_attn, CodeGen's qkv_proj). For each,
every cell of the block's and the projections' gradients is computed again by the page
(lib/backward-block.js), none is "unexplained", each equals the service's to 1e-12, and cells
are checked against torch.autograd in float64 of the layer written here or of transformers' own
layer (tests/browser/test_backward_forms.py's _config_case), never the service's functions."""

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from tests.browser.support import post_json
from tests.browser.test_backward_forms import (
    _config_case,
    _explained,
    _layer,
    _near,
    _page_of,
    rand,
)
from tests.browser.test_backward_forms import _rows as _walk
from tests.browser.test_backward_view import D_O, W_K, W_O, W_Q, W_V, X

pytestmark = pytest.mark.e2e

Array = npt.NDArray[np.float64]
F64 = torch.float64


def _rows(page: Any, data: dict[str, Any], body: dict[str, Any]) -> Any:
    """Every gradient cell the page computes (test_backward_forms' walk: each the service's to
    1e-12, none "unexplained"), the projections' and W_o's among them."""
    rows = _walk(page, data, body)
    names = {r[0] for r in rows if r[1] is None}
    assert names >= {"grad_x", "grad_w_q", "grad_w_k", "grad_w_o"}, sorted(names)
    return rows


def T(m: Any) -> list[list[float]]:
    """A weight in the other layout (in_out ↔ out_in)."""
    return np.asarray(m).T.tolist()  # type: ignore[no-any-return]


X4 = [*X, [0.3, 0.2, -0.9, 0.4]]
LN = {"gamma": [1.0, 2.0, 0.5, -1.0], "beta": [0.1, 0.0, -0.2, 0.3], "eps": 1e-5}
PAST_K = [[[0.3, -0.2], [0.9, 0.4], [-0.5, 0.1]]]  # one key/value head, 3 cached tokens
PAST_V = [[[1.0, 0.5], [-0.5, 0.25], [0.2, -0.7]]]


def test_a_decode_step_with_the_block_under_grouped_heads(page: Any, server: str) -> None:
    """past (3 cached tokens, one key/value head for two query heads), in_out weights with a
    query bias, W_o and b_o, the residual and a layer norm: the block's and the projections'
    cells read the new tokens' x only, against torch.autograd."""
    wk, wv = [r[:2] for r in W_K], [r[:2] for r in W_V]
    body = {"x": X4[2:], "w_q": W_Q, "w_k": wk, "w_v": wv, "w_o": W_O, "b_q": [0.1, 0.2, -0.1, 0.0],
            "b_o": [0.1, -0.1, 0.2, 0.0], "num_heads": 2, "num_kv_heads": 1,
            "past": {"k": PAST_K, "v": PAST_V}, "mask": {"type": "causal"}, "residual": True,
            "layer_norm": LN, "grad_output": D_O[:2]}  # fmt: skip
    data = post_json(server, "multihead", body)
    rows = _rows(page, data, body)
    kinds = {r[4] for r in rows}
    assert {"x-back", "weight-back", "bias-back", "concat-back", "ln-back"} <= kinds, kinds
    w = {"w_q": T(W_Q), "w_k": T(wk), "w_v": T(wv), "w_o": T(W_O), "b_q": body["b_q"],
         "b_o": body["b_o"]}  # fmt: skip
    ref = _layer(X4[2:], w, 2, D_O[:2], kv_heads=1, past=(PAST_K, PAST_V), causal=True,
                 residual=True, ln=(LN["gamma"], LN["beta"], 1e-5))  # fmt: skip
    page_of = _page_of(rows)
    _near(page_of[("grad_x", 1, 2)], ref["x"][1, 2])
    _near(page_of[("grad_w_k", 3, 1)], ref["w_k"][1, 3])  # in_out: [m][c]
    _near(page_of[("grad_w_o", 2, 0)], ref["w_o"][0, 2])
    _near(page_of[("grad_b_q", 0, 3)], ref["b_q"][3])
    _near(page_of[("grad_ln_gamma", 0, 1)], ref["ln_gamma"][1])
    # NumPy: grad_w_v = xᵀ dV over the new tokens only (the cache's rows are grad_past_v's)
    want = np.array(body["x"]).T @ np.array(data["grad_v"][0])
    _near(page_of[("grad_w_v", 2, 1)], want[2, 1])
    text = _explained(page, data, body, "grad_w_v", 2, 1)
    assert "Σ_i x[i][2] · grad_v[i][1]" in text, text


def test_olmos_clamp_with_biases_out_in(page: Any, server: str) -> None:
    """clip_qkv with out_in weights and every bias: the projections' cells read grad_q, grad_k,
    grad_v, the gradients before the clamp (0 where it cut), against torch.autograd."""
    wq, wk, wv, wo = rand(4, 4), rand(4, 4), rand(4, 4), rand(4, 4)
    bq, bk, bv = rand(4), rand(4), rand(4)
    body = {"x": X, "w_q": wq, "w_k": wk, "w_v": wv, "w_o": wo, "b_q": bq, "b_k": bk, "b_v": bv,
            "weight_layout": "out_in", "num_heads": 2, "clip_qkv": 0.4, "mask": {"type": "causal"},
            "grad_output": D_O}  # fmt: skip
    data = post_json(server, "multihead", body)
    clipped = np.abs(np.array(data["heads"][0]["q"])) > 0.4
    assert clipped.any() and not clipped.all()  # the clamp cuts some numbers, not all
    rows = _rows(page, data, body)
    w = {"w_q": wq, "w_k": wk, "w_v": wv, "w_o": wo, "b_q": bq, "b_k": bk, "b_v": bv}
    ref = _layer(X, w, 2, D_O, clip=0.4, causal=True)
    page_of = _page_of(rows)
    _near(page_of[("grad_x", 2, 3)], ref["x"][2, 3])
    _near(page_of[("grad_w_q", 1, 2)], ref["w_q"][1, 2])  # w_q out_in: its gradient too
    _near(page_of[("grad_b_k", 0, 1)], ref["b_k"][1])
    _near(page_of[("grad_w_o", 3, 0)], ref["w_o"][3, 0])
    # NumPy: grad_b_v = Σ_i grad_v[i] (the heads side by side), grad_v 0 where v was cut
    d_v = np.hstack([np.array(h["grad_v"]) for h in data["heads"]])
    v = np.hstack([np.array(h["v"]) for h in data["heads"]])
    assert (d_v[np.abs(v) > 0.4] == 0).all()
    _near(page_of[("grad_b_v", 0, 2)], d_v.sum(axis=0)[2])


def _k_at(layout: str, c: int, h: int, h_kv: int, d: int) -> int:
    """Where W_k's output column c is in the fused axis, written from each module's own split
    (Phi-3, MPT, DBRX, GPTBigCode: [q; k; v]; GPT-NeoX: view (h, 3d); Falcon's new decoder:
    view (h_kv, g + 2, d); GPT-2: split(n_embd) of the columns; CodeGen: reshape (4, 3·local),
    split q, v, k)."""
    head, t = divmod(c, d)
    if layout in ("rows", "columns"):
        return h * d + c
    if layout == "per_head":
        return 3 * d * head + d + t
    if layout == "grouped":
        g = h // h_kv
        return (g + 2) * d * head + g * d + t
    per, local = h // 4, h * d // 4  # codegen
    block, i = divmod(head, per)
    return 3 * local * block + 2 * local + d * i + t


# tests/wire/test_config_layers.py's cases: (layout, the fused weight's name, W_o's name, W_o
# stored [in][out] (Conv1D))
FUSED_CASES = {
    "phi3-longrope-long": ("rows", "qkv_proj.weight", "o_proj.weight", False),
    "mpt-alibi-clip-softmax_scale": ("rows", "Wqkv.weight", "out_proj.weight", False),
    "dbrx-rows-gqa-clip": ("rows", "Wqkv.weight", "out_proj.weight", False),
    "gpt_bigcode-multi_query-rows": ("rows", "c_attn.weight", "c_proj.weight", False),
    "gpt_neox-per_head-fused": ("per_head", "query_key_value.weight", "dense.weight", False),
    "falcon-per_head-bias": ("per_head", "query_key_value.weight", "dense.weight", False),
    "falcon-new_decoder-grouped": ("grouped", "query_key_value.weight", "dense.weight", False),
    "gpt2-columns-inverse_layer_idx": ("columns", "c_attn.weight", "c_proj.weight", True),
    "codegen-blocks-rotary_dim": ("codegen", "qkv_proj.weight", "out_proj.weight", False),
}


@pytest.mark.parametrize("case", list(FUSED_CASES), ids=list(FUSED_CASES))
def test_a_fused_projection_as_its_module_stores_it(page: Any, server: str, case: str) -> None:
    """A family's config with its state dict holding a fused projection: every cell of the
    block's and the projections' gradients computed by the page, the service's to 1e-12; grad_x,
    grad_w_k and grad_w_o against torch.autograd of transformers' own layer (float64), W_k's
    column found in the fused weight by this file's own reading of the module; the weight
    cell's explanation names that entry, whose grad_state_dict number is the page's."""
    layout, fused, out, conv1d = FUSED_CASES[case]
    grad_x, params, body = _config_case(case)
    assert fused in body and (out in body) == (out in params)
    data = post_json(server, "multihead", body)
    rows = _rows(page, data, body)
    kinds = {r[4] for r in rows}
    assert {"x-back-fused", "weight-back-fused"} <= kinds, kinds
    assert {r[0] for r in rows} >= {"grad_concat", "grad_w_v"}
    h, h_kv, d = int(data["num_heads"]), int(data["num_kv_heads"]), int(data["d_k"])
    page_of = _page_of(rows)
    _near(page_of[("grad_x", 3, 5)], float(grad_x[0, 3, 5]))
    m, c = 6, h_kv * d - 1  # W_k[m][c]: the last key/value head's last column
    at = _k_at(layout, c, h, h_kv, d)
    g = params[fused].grad
    want = float(g[m, at] if layout == "columns" else g[at, m])
    _near(page_of[("grad_w_k", m, c)], want)
    g_o = params[out].grad  # W_o[m][c] in_out: Conv1D stores it so, nn.Linear transposed
    _near(page_of[("grad_w_o", 2, 7)], float(g_o[2, 7] if conv1d else g_o[7, 2]))
    text = _explained(page, data, body, "grad_w_k", m, c)
    entry = f"[{m}][{at}]" if layout == "columns" else f"[{at}][{m}]"
    assert f"is {fused}{entry} of the weight you gave" in text, text
    assert "unpack" in text, text
    state = np.array(data["grad_state_dict"][fused])
    _near(page_of[("grad_w_k", m, c)], float(state[m, at] if layout == "columns" else state[at, m]))
    if f"{fused[:-7]}.bias" in body:  # the bias's cell: the fused bias's entry
        _near(page_of[("grad_b_k", 0, c)], float(params[f"{fused[:-7]}.bias"].grad[at]))
