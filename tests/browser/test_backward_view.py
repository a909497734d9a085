"""The backward in the explorer (issue 44 item 4, "Seen"), in a real browser against a real server:
the form asks for grad_output, each gradient map is drawn beside its forward map, a clicked
gradient cell (dS, dP, dV, dQ) is explained with numbers that equal this file's own NumPy backward
to 1e-12, and the backward's steps are listed after the forward's. The reference is written here,
never the service's functions."""

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.browser.support import fill_generated, js_number, post_json, wait_idle

pytestmark = pytest.mark.e2e

Array = npt.NDArray[np.float64]

Q = [[0.3, -1.2, 0.7], [1.5, 0.2, -0.9], [-0.6, 0.9, 1.4], [0.8, -0.4, 0.1]]
K = [[0.8, 0.1, -1.1], [-0.3, 1.6, 0.4], [1.0, -0.8, 0.3], [0.2, 0.4, -0.6]]
V = [[1.0, -0.5], [0.25, 2.0], [-1.5, 0.75], [0.5, 0.5]]
# /multihead: x [3 × 4] and in_out weights [4 × 4], two heads of d_k = 2; dO for the concat
X = [[0.5, -1.0, 0.25, 0.8], [1.2, 0.3, -0.7, 0.1], [-0.4, 0.9, 1.1, -0.6]]
W_Q = [[0.2, -0.5, 0.9, 0.1], [0.7, 0.3, -0.2, 0.6], [-0.4, 0.8, 0.5, -0.3], [0.1, -0.6, 0.4, 0.9]]
W_K = [[0.6, 0.2, -0.3, 0.5], [-0.1, 0.9, 0.4, -0.7], [0.3, -0.2, 0.8, 0.2], [0.5, 0.4, -0.6, 0.1]]
W_V = [[1.0, 0.5, -0.5, 0.2], [-0.3, 0.7, 0.9, -1.1], [0.4, -0.8, 0.6, 0.3], [0.2, 0.1, -0.4, 0.8]]
D_O = [[1.0, -0.5, 0.25, 2.0], [-1.5, 0.75, 0.5, -0.25], [0.3, 1.2, -0.8, 0.6]]


def _pattern(rows: int, cols: int) -> list[list[float]]:
    """The page's default dO (backward-form.js): ((3i + 5c) mod 7 − 3)/4."""
    return [[((3 * i + 5 * c) % 7 - 3) / 4 for c in range(cols)] for i in range(rows)]


def _backward(q: Array, k: Array, v: Array, d_o: Array, causal: bool) -> dict[str, Array]:
    """Scaled dot-product attention and its backward, by hand in float64."""
    scale = 1 / np.sqrt(q.shape[1])
    s = q @ k.T * scale
    allowed = np.tril(np.ones(s.shape, dtype=bool)) if causal else np.ones(s.shape, dtype=bool)
    masked = np.where(allowed, s, -np.inf)
    e = np.exp(masked - masked.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    o = p @ v
    d_p = d_o @ v.T
    d = (d_o * o).sum(axis=1)
    d_s = p * (d_p - d[:, None])
    return {
        "P": p,
        "dP": d_p,
        "D": d,
        "dS": d_s,
        "dV": p.T @ d_o,
        "dQ": d_s @ k * scale,
        "dK": d_s.T @ q * scale,
    }


def _fill(page: Any, ids: dict[str, list[list[float]]]) -> None:
    for field, m in ids.items():
        page.fill(f"#{field}", "\n".join(" ".join(str(x) for x in row) for row in m))


def _open_projections(page: Any, endpoint: str, weights: dict[str, Any]) -> None:
    """The explorer ready, ``endpoint`` chosen, x projected by weights filled in."""
    page.locator("body[data-ready=true]").wait_for(timeout=20_000)
    page.select_option("#endpoint", endpoint)
    wait_idle(page)
    page.select_option("#mode", "projections")
    _fill(page, weights)


def _run_backward(page: Any, endpoint: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Click Run; return the request the page sent with grad_output and the JSON it got back."""
    wait_idle(page)
    with page.expect_response(
        lambda r: (
            r.url.endswith("/" + endpoint)
            and r.request.method == "POST"
            and "grad_output" in (r.request.post_data or "")
        )
    ) as info:
        page.click("#run")
    response = info.value
    wait_idle(page)
    page.locator("#status").filter(has_text="Done").wait_for(timeout=20_000)
    return response.request.post_data_json, response.json()


def _beside(page: Any, forward: str, gradient: str) -> None:
    """The gradient's card is in the forward's pair, to its right on the same line."""
    pair = page.locator(f'.grad-pair:has(> [data-name="{forward}"])')
    assert pair.count() == 1, forward
    a = pair.locator(f':scope > [data-name="{forward}"]').bounding_box()
    b = pair.locator(f':scope > figure[data-name="{gradient}"]').bounding_box()
    assert a is not None and b is not None, (forward, gradient)
    assert b["x"] >= a["x"] + a["width"] - 1, (forward, a, gradient, b)
    assert abs(b["y"] - a["y"]) < 2, (forward, a, gradient, b)


def _explain(page: Any, figure: str, i: int, j: int) -> tuple[float, str]:
    """Click cell (i, j) of the map ``figure``; return the page's total (full precision) and the
    explanation's text."""
    page.locator(f'figure[data-name="{figure}"] rect.cell[data-row="{i}"][data-col="{j}"]').click()
    panel = page.locator("#explain")
    panel.locator(".explain-total").wait_for()
    assert panel.locator(".explain-mismatch").count() == 0, panel.inner_text()
    total = panel.locator(".explain-total").get_attribute("data-total")
    assert total is not None, panel.inner_text()
    return float(total), panel.inner_text()


def _f6(x: float) -> str:
    return js_number(float(x), 6, trim=False)


def _check_cells(page: Any, ref: dict[str, Array], prefix: str, name: str, title: str) -> None:
    """dS, dP, dV and dQ cells clicked and explained with ref's numbers to 1e-12."""
    i, j = 2, 1
    total, text = _explain(page, f"{prefix}grad_masked_scores", i, j)
    assert total == pytest.approx(ref["dS"][i, j], abs=1e-12, rel=1e-12)
    assert f"grad_masked_scores[{i}][{j}]{title}" in text
    said = f"= {_f6(ref['P'][i, j])} · ({_f6(ref['dP'][i, j])} − {_f6(ref['D'][i])})"
    assert said in text, text
    assert f"D[{i}] = {_f6(ref['D'][i])} (the service's row_dot: {_f6(ref['D'][i])})" in text
    total, _ = _explain(page, f"{prefix}grad_masked_scores", 0, 2)  # masked: 0
    assert total == 0.0 and ref["dS"][0, 2] == 0.0
    total, text = _explain(page, f"{prefix}grad_weights", i, 0)
    assert total == pytest.approx(ref["dP"][i, 0], abs=1e-12, rel=1e-12)
    assert "dP = dO Vᵀ" in text
    total, text = _explain(page, f"{prefix}grad_v", 1, 0)
    assert total == pytest.approx(ref["dV"][1, 0], abs=1e-12, rel=1e-12)
    assert "dV = Pᵀ dO" in text
    total, text = _explain(page, f"{prefix}grad_{name}", i, j)
    assert total == pytest.approx(ref["dQ"][i, j], abs=1e-12, rel=1e-12)
    assert "dQ = dS·scale K" in text
    total, _ = _explain(page, f"{prefix}grad_k", 1, 1)
    assert total == pytest.approx(ref["dK"][1, 1], abs=1e-12, rel=1e-12)


def test_attention_with_a_causal_mask_draws_and_explains_its_gradients(page: Any) -> None:
    """/attention, q k v given, causal, the page's default pattern as dO: the request carries it,
    each gradient is beside its array, and the cells of dS, dP, dV, dQ, dK are NumPy's."""
    page.locator("body[data-ready=true]").wait_for(timeout=20_000)
    page.select_option("#endpoint", "attention")
    page.select_option("#mode", "direct")
    _fill(page, {"q": Q, "k": K, "v": V})
    page.fill("#tokens", "a b c d")
    page.fill("#extra", "")
    page.check("#causal")
    page.select_option("#grad_mode", "pattern")
    body, data = _run_backward(page, "attention")
    assert body["grad_output"] == _pattern(4, 2)
    for forward, gradient in [("weights", "grad_weights"), ("masked_scores", "grad_masked_scores"),
                              ("scaled_scores", "grad_scaled_scores"), ("q", "grad_q"),
                              ("k", "grad_k"), ("v", "grad_v"), ("output", "grad_output")]:  # fmt: skip
        _beside(page, forward, gradient)
    legend = page.locator('figure[data-name="grad_weights"] svg.legend').get_attribute("aria-label")
    assert legend is not None and legend.startswith("colour legend from -"), legend  # signed
    ref = _backward(np.array(Q), np.array(K), np.array(V), np.array(_pattern(4, 2)), causal=True)
    assert np.allclose(data["grad_masked_scores"], ref["dS"], atol=1e-12)
    _check_cells(page, ref, "", "q", "")
    # the way back: dS from dP, the scaled scores' gradient from dS
    _explain(page, "grad_scaled_scores", 3, 1)
    page.locator("#explain button.explain-back").click()
    assert page.locator("#explain .explain-title").inner_text() == "grad_masked_scores[3][1]"
    # the backward's steps after the forward's, marked
    steps = page.locator("#steps li")
    names = [t.split(":")[0] for t in steps.all_inner_texts()]
    first = page.locator("#steps li.backward-first")
    assert first.count() == 1 and first.inner_text().split(":")[0].endswith("grad_output")
    back = page.locator("#steps li.backward").count()
    assert back == len([s for s in data["steps"] if s["name"] in names[-back:]]) > 5
    assert names.index("output") < len(names) - back


def test_multihead_draws_each_heads_gradients_beside_its_maps(page: Any) -> None:
    """/multihead, x and in_out weights, two heads, causal, dO pasted: head 1's dS, dP, dV, dQ
    cells are NumPy's (its share of dO: the concat's columns 2 and 3), beside their maps."""
    _open_projections(page, "multihead", {"x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V})
    page.fill("#tokens", "the cat sat")
    for field in ("#context", "#w_o", "#extra"):
        page.fill(field, "")
    page.select_option("#weight_layout", "in_out")
    page.fill("#num_heads", "2")
    page.check("#causal")
    page.select_option("#grad_mode", "mine")
    _fill(page, {"grad_output": D_O})
    body, data = _run_backward(page, "multihead")
    assert body["grad_output"] == D_O
    x, d_o = np.array(X), np.array(D_O)
    q, k, v = x @ np.array(W_Q), x @ np.array(W_K), x @ np.array(W_V)
    h = slice(2, 4)
    ref = _backward(q[:, h], k[:, h], v[:, h], d_o[:, h], causal=True)
    assert np.allclose(data["heads"][1]["grad_masked_scores"], ref["dS"], atol=1e-12)
    page.select_option("#head-pick", "1")
    _beside(page, "head1_weights", "head1_grad_weights")
    _beside(page, "head1_masked_scores", "head1_grad_masked_scores")
    page.locator('details.head-tables[data-head="1"] > summary').click()  # its tables, folded
    _beside(page, "head1_q", "head1_grad_q")
    _check_cells(page, ref, "head1_", "q", " (head 1)")
    # the block's dO, as pasted, beside the block's output
    _beside(page, "output", "grad_output")
    total, text = _explain(page, "grad_output", 2, 1)
    assert total == d_o[2, 1] and "as the request gives it" in text


def test_the_pattern_after_a_layer_norm_moves_the_gradients(page: Any) -> None:
    """ "sum" after a layer norm with γ = 1 gives every gradient 0; the page's default pattern,
    shaped as the block's last array, does not."""
    _open_projections(page, "multihead", {"x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V})
    page.fill("#tokens", "the cat sat")
    for field in ("#context", "#w_o", "#extra"):
        page.fill(field, "")
    page.check("#residual")
    page.check("#layer_norm")
    page.select_option("#grad_mode", "pattern")
    body, data = _run_backward(page, "multihead")
    assert body["grad_output"] == _pattern(3, 4)
    assert np.abs(np.array(data["grad_x"])).max() > 1e-3
    _beside(page, "layer_norm", "grad_layer_norm")
    # the block's last array's gradient is dO as sent
    total, text = _explain(page, "grad_layer_norm", 0, 1)
    assert total == _pattern(3, 4)[0][1] and "as the request gives it" in text


def _layer_norm(z: Array, eps: float = 1e-5) -> tuple[Array, Array]:
    """x̂ and σ of each row (biased variance)."""
    sigma = np.sqrt(z.var(axis=1) + eps)
    return (z - z.mean(axis=1, keepdims=True)) / sigma[:, None], sigma


def _block(
    x: Array, w: dict[str, Array], heads: int, d_o: Array, residual: bool, ln: bool
) -> dict[str, Array]:
    """/multihead's forward (in_out weights, no mask) and its backward by hand in float64: the
    heads' dQ, dK, dV side by side, the block's gradients, grad_x, the weights'."""
    q, k, v = x @ w["q"], x @ w["k"], x @ w["v"]
    d = q.shape[1] // heads
    cols = [slice(h * d, (h + 1) * d) for h in range(heads)]
    outs = []
    for c in cols:
        s = q[:, c] @ k[:, c].T / np.sqrt(d)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        outs.append(e / e.sum(axis=1, keepdims=True) @ v[:, c])
    concat = np.hstack(outs)
    z = x + concat @ w["o"] if residual else concat @ w["o"]
    xhat, sigma = _layer_norm(z)
    d_z = d_o if not ln else (d_o - d_o.mean(1, keepdims=True) - xhat * (d_o * xhat).mean(1, keepdims=True)) / sigma[:, None]  # fmt: skip
    d_concat = d_z @ w["o"].T
    parts = [_backward(q[:, c], k[:, c], v[:, c], d_concat[:, c], causal=False) for c in cols]
    d_q, d_k, d_v = (np.hstack([p[n] for p in parts]) for n in ("dQ", "dK", "dV"))
    d_x = d_q @ w["q"].T + d_k @ w["k"].T + d_v @ w["v"].T + (d_z if residual else 0)
    return {"concat": d_concat, "residual": d_z, "w_o": concat.T @ d_z, "x": d_x, "w_q": x.T @ d_q,
            "b_q": d_q.sum(axis=0)}  # fmt: skip


def _cell(page: Any, data: dict[str, Any], body: dict[str, Any], name: str, i: int, j: int) -> Any:
    """The page's explanation of a gradient cell it does not draw (explain.js's explainCell, what a
    click runs): its total and text."""
    return page.evaluate(
        """async ([data, request, name, i, j]) => {
          const m = await import('/static/explain.js');
          const box = m.explainCell({endpoint: 'multihead', data, request, name, head: null,
                                     batch: null, i, j});
          const t = box.querySelector('.explain-total');
          return [Number(t.dataset.total), box.innerText || box.textContent,
                  !!box.querySelector('.explain-mismatch')];
        }""",
        [data, body, name, i, j],
    )


def test_the_blocks_gradients_are_explained_with_numpys_numbers(page: Any) -> None:
    """/multihead with W_o, the residual and a layer norm: grad_concat (dY W_oᵀ), grad_residual
    (through the layer norm) clicked, grad_w_o and grad_x (with the residual's share) explained,
    each NumPy's to 1e-12 and the service's."""
    _open_projections(page, "multihead", {"x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "w_o": W_O})
    page.fill("#tokens", "the cat sat")
    for field in ("#context", "#extra"):
        page.fill(field, "")
    page.select_option("#weight_layout", "in_out")
    page.fill("#num_heads", "2")
    page.check("#residual")
    page.check("#layer_norm")
    page.select_option("#grad_mode", "pattern")
    body, data = _run_backward(page, "multihead")
    assert body["w_o"] == W_O and body["layer_norm"] is True
    w = {n: np.array(m) for n, m in (("q", W_Q), ("k", W_K), ("v", W_V), ("o", W_O))}
    ref = _block(np.array(X), w, 2, np.array(_pattern(3, 4)), residual=True, ln=True)
    _beside(page, "concat", "grad_concat")
    total, text = _explain(page, "grad_concat", 1, 2)
    assert total == pytest.approx(ref["concat"][1, 2], abs=1e-12, rel=1e-12)
    assert total == pytest.approx(data["grad_concat"][1][2], abs=1e-12, rel=1e-12)  # the service's
    assert "Σ_o grad_projected[1][o] · W_o[2][o]" in text
    assert f"{_f6(data['grad_projected'][1][3])}\t{_f6(W_O[2][3])}" in text  # a term, its numbers
    total, text = _explain(page, "grad_residual", 2, 1)
    assert total == pytest.approx(ref["residual"][2, 1], abs=1e-12, rel=1e-12)
    z = np.array(data["residual"])
    xhat, sigma = _layer_norm(z)
    g = np.array(_pattern(3, 4))
    assert f"σ = √(var + eps) = {_f6(sigma[2])}" in text, text
    assert f"mean(g · x̂) = {_f6((g[2] * xhat[2]).mean())}" in text
    for name, (i, j) in (("grad_w_o", (3, 1)), ("grad_x", (0, 2))):
        total, text, mismatch = _cell(page, data, body, name, i, j)
        assert not mismatch and total == pytest.approx(ref[name[5:]][i, j], abs=1e-12, rel=1e-12)
    assert "grad_residual[0][2]" in text  # grad_x's residual share


def test_attention_projections_explain_grad_x_and_grad_w_q(page: Any) -> None:
    """/attention on generated numbers (sent with weight_layout out_in, generated in in_out):
    grad_x and grad_w_q cells clicked, NumPy's to 1e-12 from the answer's x and weights."""
    page.locator("body[data-ready=true]").wait_for(timeout=20_000)
    page.select_option("#endpoint", "attention")
    wait_idle(page)
    fill_generated(page, 3, seed=1, d_model=4, d_k=2)
    page.fill("#extra", "")
    page.select_option("#grad_mode", "pattern")
    body, data = _run_backward(page, "attention")
    assert body["weight_layout"] == "out_in" and "w_q" not in body  # generated: in_out
    x, d_o = np.array(data["x"]), np.array(_pattern(3, 2))
    w = {n: np.array(data["w_" + n]) for n in "qkv"}
    ref = _backward(x @ w["q"], x @ w["k"], x @ w["v"], d_o, causal=False)
    d_x = ref["dQ"] @ w["q"].T + ref["dK"] @ w["k"].T + ref["dV"] @ w["v"].T
    _beside(page, "x", "grad_x")
    total, text = _explain(page, "grad_x", 1, 3)
    assert total == pytest.approx(d_x[1, 3], abs=1e-12, rel=1e-12)
    assert total == pytest.approx(data["grad_x"][1][3], abs=1e-12, rel=1e-12)
    assert "Σ_c dQ[1][c] · W_q[3][c] + Σ_c dK[1][c] · W_k[3][c] + Σ_c dV[1][c] · W_v[3][c]" in text
    d_wq = x.T @ ref["dQ"]
    total, text = _explain(page, "grad_w_q", 2, 1)
    assert total == pytest.approx(d_wq[2, 1], abs=1e-12, rel=1e-12)
    assert "Σ_i x[i][2] · grad_q[i][1]" in text


# every gradient cell the page computes, against the service's number: [name, head, i, j, kind,
# the page's total or None, the service's]
RECOMPUTE_GRADIENTS = """async (args) => {
  const m = await import('/static/explain.js');
  const b = await import('/static/lib/backward.js');
  const {endpoint, data, request} = args;
  const out = [];
  const scan = (src, head) => {
    for (const name of Object.keys(src).filter((n) => n.startsWith('grad_'))) {
      let a = typeof src[name] === 'number' ? [src[name]] : src[name];  // a number: one cell
      if (!Array.isArray(a) || (head === null && endpoint === 'multihead' && name in data.heads[0])) continue;
      if (!Array.isArray(a[0])) a = [a];  // a bias's: one row
      const batched = Array.isArray(a[0][0]);  // [batch item][row][column]
      const kvs = batched && Array.isArray(a[0][0][0]);  // [batch item][key/value head][row][·]
      // /multihead's keys and values kept per key/value head at the top level: [h_kv][row][·]
      const perKv = endpoint === 'multihead' && head === null && !kvs &&
                    ['grad_k', 'grad_v', 'grad_past_k', 'grad_past_v'].includes(name);
      for (let n = 0; n < (batched ? a.length : 1); n++) for (let g_ = 0; g_ < (kvs ? a[n].length : 1); g_++) {
      const g = kvs ? a[n][g_] : batched ? a[n] : a;
      const kv = kvs ? g_ : perKv && batched ? n : null;
      for (let i = 0; i < g.length; i++) for (let j = 0; j < g[i].length; j++) {
        const ctx = {endpoint, data, request, name, head, batch: batched && !perKv ? n : null,
                     kv, i, j};
        const r = b.gradientCell(ctx);
        if (m.explainCell(ctx) === null) throw new Error('no explanation of ' + name);
        out.push([name, head, i, j, r.kind, r.total ?? null, r.service, kv]);
      }}
    }
  };
  if (endpoint === 'multihead') data.heads.forEach((h, n) => scan(h, n));
  scan(data, null);
  return out;
}"""

ROPE_SOFTCAP: dict[str, Any] = {
    "q": Q, "k": K, "v": V, "mask": {"type": "causal"}, "softcap": 0.8,
    "rope": {"base": 100, "style": "interleaved", "rotary_dim": 2, "scaling": {"type": "yarn", "factor": 4,
             "original_max_position": 2}},
    "positions": [3, 4, 5, 6], "sinks": 0.3, "grad_output": _pattern(4, 2),
}  # fmt: skip
TEMPERED_GQA: dict[str, Any] = {
    "x": X, "w_q": W_Q, "w_k": [r[:2] for r in W_K], "w_v": [r[:2] for r in W_V],
    "num_heads": 2, "num_kv_heads": 1, "temperature": {"floor_scale": 2, "attn_scale": 0.5},
    "mask": {"type": "causal"}, "alibi": True, "grad_output": D_O[:3],
}  # fmt: skip
W_O = [[0.5, -0.2, 0.1, 0.3], [0.4, 0.6, -0.5, 0.2], [-0.3, 0.1, 0.7, -0.4], [0.2, -0.8, 0.3, 0.6]]
LN = {"gamma": [1.0, 2.0, 0.5, -1.0], "beta": [0.1, 0.0, -0.2, 0.3], "eps": 1e-5}
BLOCK_LN: dict[str, Any] = {
    "x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "w_o": W_O, "b_o": [0.1, -0.1, 0.2, 0.0],
    "b_q": [0.1, 0.2, -0.1, 0.0], "num_heads": 2, "mask": {"type": "causal"}, "residual": True,
    "layer_norm": LN, "grad_output": D_O,
}  # fmt: skip
BATCHED_OUT_IN: dict[str, Any] = {
    **BLOCK_LN, "x": [X, [r[::-1] for r in X]], "weight_layout": "out_in", "num_kv_heads": 1,
    "w_k": W_K[:2], "w_v": W_V[2:],
    "grad_output": [D_O, [r[::-1] for r in D_O]],
}  # fmt: skip
PROJECTED: dict[str, Any] = {
    "x": X, "w_q": [r[:3] for r in W_Q], "w_k": [r[:3] for r in W_K], "w_v": W_V,
    "b_q": [0.1, 0.2, -0.3], "b_v": [0.0, 0.5, -0.5, 1.0], "grad_output": D_O,
}  # fmt: skip
Q4 = [[0.3, -1.2, 0.7, 0.4], [1.5, 0.2, -0.9, 0.1], [-0.6, 0.9, 1.4, -0.3], [0.8, -0.4, 0.1, 1.1]]
K4 = [[0.8, 0.1, -1.1, 0.2], [-0.3, 1.6, 0.4, 0.5], [1.0, -0.8, 0.3, -0.7], [0.2, 0.4, -0.6, 0.9]]
QK_NORM_RMS: dict[str, Any] = {
    "q": Q4, "k": K4, "v": V, "mask": {"type": "causal"}, "grad_output": _pattern(4, 2),
    "qk_norm": {"q_weight": [1.1, 0.9, -0.5, 2.0], "k_weight": [0.5, 1.5, 1.0, -1.0], "eps": 1e-5},
}  # fmt: skip
QK_NORM_ZERO_CENTRED: dict[str, Any] = {
    "x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "num_heads": 2, "grad_output": D_O,
    "qk_norm": {"q_weight": [0.1, -0.2, 0.3, 0.05], "k_weight": [-0.1, 0.2, 0.0, 0.4],
                "zero_centered": True, "over": "projection"},
}  # fmt: skip
CLIPPED: dict[str, Any] = {"q": Q4, "k": K4, "v": V, "clip_qkv": 0.9, "grad_output": _pattern(4, 2)}
PAST: dict[str, Any] = {
    "q": Q4[2:], "k": K4[2:], "v": V[2:], "past": {"k": K4[:2], "v": V[:2]},
    "mask": {"type": "causal"}, "grad_output": _pattern(2, 2),
}  # fmt: skip
GATE_W = [
    [0.3, -0.2, 0.5, 0.1],
    [0.2, 0.4, -0.6, 0.3],
    [-0.5, 0.1, 0.2, 0.7],
    [0.6, -0.3, 0.1, -0.2],
]
GATED: dict[str, Any] = {
    "x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "w_o": W_O, "num_heads": 2, "grad_output": D_O,
    "gate": {"w": GATE_W, "b": [0.1, 0.0, -0.1, 0.2]},
}  # fmt: skip
CASES = [("rope_yarn_softcap_sink", "attention", ROPE_SOFTCAP),
         ("gate", "multihead", GATED),
         ("qk_norm_rms_weights", "attention", QK_NORM_RMS),
         ("qk_norm_zero_centred_projection", "multihead", QK_NORM_ZERO_CENTRED),
         ("clip_qkv", "attention", CLIPPED),
         ("past", "attention", PAST),
         ("gqa_temperature_alibi", "multihead", TEMPERED_GQA),
         ("block_w_o_residual_layer_norm", "multihead", BLOCK_LN),
         ("batched_out_in_gqa_block", "multihead", BATCHED_OUT_IN),
         ("attention_projections", "attention", PROJECTED)]  # fmt: skip


@pytest.mark.parametrize(
    ("endpoint", "body"), [(e, b) for _, e, b in CASES], ids=[n for n, _, _ in CASES]
)
def test_every_gradient_cell_the_page_computes_is_the_services(
    page: Any, server: str, endpoint: str, body: dict[str, Any]
) -> None:
    """RoPE's backward (YaRN's gain, interleaved, shifted positions), the softcap's, the sink,
    the temperature's, the bias, grouped-query heads: each cell the page computes equals the
    service's to 1e-12; the others say they are the service's."""
    data = post_json(server, endpoint, body)
    assert "steps" in data, data
    rows = page.evaluate(RECOMPUTE_GRADIENTS, {"endpoint": endpoint, "data": data, "request": body})
    kinds = {r[4] for r in rows}
    bad = [r for r in rows if r[5] is not None and abs(r[5] - r[6]) > 1e-12 * max(1, abs(r[6]))]
    assert bad == [], bad[:10]
    lost = [r for r in rows if r[5] is None and r[4] != "unexplained"]  # NaN arrives as null
    assert lost == [], lost[:10]
    computed = {r[0] for r in rows if r[5] is not None}
    assert {"grad_weights", "grad_q", "grad_scores"} <= computed, computed
    assert kinds >= {"dO", "dP", "dS", "dQ", "score-back"}, kinds
    if "rope" in body:
        assert {"rope-back", "dK", "dV"} <= kinds and "grad_capped_scores" in computed
    elif "temperature" in body:  # grouped: the heads' k and v gradients summed per key/value head
        assert "temper-back" in kinds and "grad_biased_scores" in computed
    if "x" in body and "gate" not in body:  # the projections: x's, the weights', the biases'
        assert {"x-back", "weight-back"} <= kinds, kinds
        params = {r[0] for r in rows if r[0].startswith(("grad_w_", "grad_b_"))} | {"grad_x"}
        assert params <= computed, params - computed
    if "qk_norm" in body:  # back through the norm: every grad_q, grad_k cell
        assert "norm-back" in kinds and {"grad_q", "grad_k"} <= computed, kinds
    if "clip_qkv" in body:  # back through the clamp: passed or 0
        assert "clip-back" in kinds and {"grad_q", "grad_k", "grad_v"} <= computed, kinds
        cut = [r for r in rows if r[4] == "clip-back" and r[6] == 0.0]
        assert cut, "no clamped cell"
    if "gate" in body:  # gated = concat ∘ gate
        assert "gate-back" in kinds and {"grad_concat", "grad_gate", "grad_gated"} <= computed
        assert {"grad_w_o", "grad_w_q"} <= computed, computed
        page_of = {(r[0], r[2], r[3]): r[5] for r in rows if r[1] is None}
        d_gated = np.array(D_O) @ np.array(W_O).T  # NumPy: back through W_o, then the product
        want = d_gated * np.array(data["gate"])
        assert page_of[("grad_concat", 1, 2)] == pytest.approx(want[1, 2], abs=1e-12)
        want = d_gated * np.array(data["concat"])
        assert page_of[("grad_gate", 2, 3)] == pytest.approx(want[2, 3], abs=1e-12)
    if "qk_norm" in body and endpoint == "attention":  # NumPy: RMS norm's backward, weights w
        g, q = np.array(data["grad_q_normed"]), np.array(body["q"])
        w, eps = np.array(body["qk_norm"]["q_weight"]), body["qk_norm"]["eps"]
        rms = np.sqrt((q * q).mean(axis=1, keepdims=True) + eps)
        xhat, wg = q / rms, g * w
        want = (wg - xhat * (wg * xhat).mean(axis=1, keepdims=True)) / rms
        page_of = {(r[0], r[2], r[3]): r[5] for r in rows}
        assert page_of[("grad_q", 2, 1)] == pytest.approx(want[2, 1], abs=1e-12)
        assert page_of[("grad_q", 3, 3)] == pytest.approx(want[3, 3], abs=1e-12)
    if "past" in body:  # the new tokens' part of the cache's gradient
        assert {"grad_k", "grad_v"} <= computed, computed
    if "layer_norm" in body:  # the block: W_o, the residual, the layer norm and its γ, β
        assert {"ln-back", "residual-back", "concat-back", "ln-param-back"} <= kinds, kinds
        block = {"grad_concat", "grad_projected", "grad_residual", "grad_layer_norm", "grad_w_o",
                 "grad_b_o", "grad_ln_gamma", "grad_ln_beta"}  # fmt: skip
        assert block <= computed, block - computed
