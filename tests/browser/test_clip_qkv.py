"""OLMo's clip_qkv in the explorer (issue 40): an answer with q_clipped, k_clipped and v_clipped
drawn by the page, and a click on a cell of each explaining it — the number before the clamp,
the bounds ±clip_qkv, whether the clamp bit — with the total the service returned; RoPE turning
the clipped queries, and the heads' outputs read from the clipped values.

The first test hands the page the service's JSON for a request sent here, as a Run leaves it
(``state.lastResult``), drawn by its own render(). The others go through the form as a user does:
the clip_qkv and attention_multiplier boxes typed, Run pressed (OLMo's clamp on /multihead,
Granite's scale on /attention, the expected numbers computed here with NumPy from the request's
own arrays), and a request carrying both loaded back into those boxes."""

from typing import Any

import numpy as np
import pytest
from playwright.sync_api import expect

from tests.browser.support import js_number, map_cells, open_explorer, post_json, run_form
from tests.browser.test_todays_layers import (
    _blank_form,
    _explain,
    _fmt6,
    _rows,
    _says_the_services_number,
    _text,
)

pytestmark = pytest.mark.e2e

CLIP = 2.5
OLMO: dict[str, Any] = {
    "tokens": ["the", "cat", "sat"], "x": _rows(3, 4, 20), "num_heads": 2,
    "q_proj.weight": _rows(4, 4, 21), "k_proj.weight": _rows(4, 4, 22),
    "v_proj.weight": _rows(4, 4, 23), "o_proj.weight": _rows(4, 4, 24),
    "rope": True, "clip_qkv": CLIP,
}  # fmt: skip

DRAW = """async ({ep, body, data}) => {
  const { state } = await import('/static/lib/state.js');
  const { render, setupBatch } = await import('/static/render.js');
  document.getElementById('endpoint').value = ep;
  state.lastResult = { ep, body, data };
  setupBatch(ep, data);
  render();
}"""


RECOMPUTE_OUTPUT = """async ({data, request}) => {
  const m = await import('/static/explain.js');
  const ctx = {endpoint: 'multihead', data, request, name: 'output', head: 1, batch: null, i: 2, j: 1};
  const r = m.recompute(ctx);
  return {vName: r.vName, total: r.total};
}"""


def test_clicked_cells_of_the_clipped_forms_explain_the_clamp(page: Any, server: str) -> None:
    data = post_json(server, "multihead", OLMO)
    open_explorer(page, server)
    page.evaluate(DRAW, {"ep": "multihead", "body": OLMO, "data": data})
    head = data["heads"][1]
    # a number the clamp set to the bound, and one it left
    beyond = next(
        (i, j) for i, row in enumerate(head["q"]) for j, x in enumerate(row) if abs(x) > CLIP
    )
    within = next((i, j) for i, row in enumerate(head["k"]) for j, x in enumerate(row) if abs(x) < CLIP)  # fmt: skip
    i, j = beyond
    panel = _explain(page, "q_clipped", i, j, head=1)
    text = panel.inner_text()
    assert f"q_clipped[{i}][{j}] = min(max(q[{i}][{j}], −c), c), c = clip_qkv = 2.50000" in text
    assert f"{js_number(head['q'][i][j], 6, trim=False)} lies beyond ±2.50000" in text
    assert abs(head["q_clipped"][i][j]) == CLIP
    _says_the_services_number(panel, head["q_clipped"][i][j])
    i, j = within
    panel = _explain(page, "k_clipped", i, j, head=1)
    assert "so the clamp leaves it" in panel.inner_text()
    assert panel.inner_text().count(f"key {i} “{OLMO['tokens'][i]}”") == 1
    _says_the_services_number(panel, head["k_clipped"][i][j])
    panel = _explain(page, "v_clipped", 2, 0, head=0)
    _says_the_services_number(panel, data["heads"][0]["v_clipped"][2][0])
    # RoPE turned the clipped queries; the scores and the output read the clipped forms
    panel = _explain(page, "q_rotated", 1, 0, head=1)
    assert "q_clipped[1]" in panel.inner_text()
    _says_the_services_number(panel, head["q_rotated"][1][0])
    # the heads' outputs are weights · v_clipped, as the page's arithmetic reads them
    out = page.evaluate(RECOMPUTE_OUTPUT, {"data": data, "request": OLMO})
    assert out["vName"] == "v_clipped"
    assert abs(out["total"] - head["output"][2][1]) <= 1e-12 * max(1.0, abs(out["total"]))
    expect(page.locator("#explain .explain-mismatch")).to_have_count(0)


# ---- through the form ------------------------------------------------------------------------

# an OLMo layer typed into the form: 2 heads of d_k 2, w_q … w_v in_out; c = 1.5 bites some
# numbers of x · W (up to about ±5) and leaves others
C_FORM = 1.5
OLMO_FORM: dict[str, Any] = {
    "tokens": ["the", "cat", "sat"], "x": _rows(3, 4, 30), "w_q": _rows(4, 4, 31),
    "w_k": _rows(4, 4, 32), "w_v": _rows(4, 4, 33), "num_heads": 2, "clip_qkv": C_FORM,
}  # fmt: skip


def _heads(m: np.ndarray, h: int) -> list[np.ndarray]:
    """[L][h·d] → h arrays [L][d]: head i's columns (the service's split, written here)."""
    d = m.shape[1] // h
    return [m[:, i * d : (i + 1) * d] for i in range(h)]


def test_clip_qkv_typed_in_the_form_clamps_q_k_v_and_each_cell_explains_c(
    page: Any, server: str
) -> None:
    _blank_form(page, server, "multihead", "projections")
    page.select_option("#weight_names", "w")
    page.fill("#num_heads", "2")
    page.fill("#tokens", "the cat sat")
    for box in ("x", "w_q", "w_k", "w_v"):
        page.fill(f"#{box}", _text(OLMO_FORM[box]))
    page.fill("#clip_qkv", "1.5")
    body, data = run_form(page, "multihead")
    assert body == OLMO_FORM  # the box sends clip_qkv, nothing else changed
    # the clamp with NumPy, from the request's own arrays
    x = np.array(OLMO_FORM["x"], dtype=np.float64)
    clipped = {
        name: _heads(np.clip(x @ np.array(OLMO_FORM[w], dtype=np.float64), -C_FORM, C_FORM), 2)
        for name, w in (("q_clipped", "w_q"), ("k_clipped", "w_k"), ("v_clipped", "w_v"))
    }
    for h, head in enumerate(data["heads"]):
        for name, expected in clipped.items():
            np.testing.assert_allclose(head[name], expected[h], rtol=1e-12, atol=1e-12)
    q1 = np.array(data["heads"][1]["q"])  # head 1's q before the clamp
    assert (np.abs(q1) > C_FORM).any() and (np.abs(q1) < C_FORM).any()
    # the clipped steps are drawn, each cell explained with c
    i, j = (int(n) for n in np.argwhere(np.abs(q1) > C_FORM)[0])
    panel = _explain(page, "q_clipped", i, j, head=1)
    text = panel.inner_text()
    assert f"q_clipped[{i}][{j}] = min(max(q[{i}][{j}], −c), c), c = clip_qkv = 1.50000" in text
    assert f"{_fmt6(float(q1[i, j]))} lies beyond ±1.50000" in text
    _says_the_services_number(panel, float(clipped["q_clipped"][1][i, j]))
    v0 = np.array(data["heads"][0]["v"])
    i, j = (int(n) for n in np.argwhere(np.abs(v0) < C_FORM)[0])
    panel = _explain(page, "v_clipped", i, j, head=0)
    assert "c = clip_qkv = 1.50000" in panel.inner_text()
    assert "so the clamp leaves it" in panel.inner_text()
    _says_the_services_number(panel, float(clipped["v_clipped"][0][i, j]))
    # a bound the service refuses is said beside the box
    page.fill("#clip_qkv", "-1")
    run_form(page, "multihead")
    error = page.locator('.field[data-field="clip_qkv"] .field-error')
    expect(error).to_contain_text("clip_qkv")


GRANITE_FORM: dict[str, Any] = {
    "tokens": ["a", "b", "c"], "x": _rows(3, 4, 40), "w_q": _rows(4, 4, 41),
    "w_k": _rows(4, 4, 42), "w_v": _rows(4, 4, 43), "attention_multiplier": 0.3,
}  # fmt: skip


def test_attention_multiplier_typed_in_the_form_scales_q_kt(page: Any, server: str) -> None:
    _blank_form(page, server, "attention", "projections")
    page.fill("#tokens", "a b c")
    for box in ("x", "w_q", "w_k", "w_v"):
        page.fill(f"#{box}", _text(GRANITE_FORM[box]))
    page.fill("#attention_multiplier", "0.3")
    body, data = run_form(page, "attention")
    assert body == GRANITE_FORM
    # Q Kᵀ · multiplier with NumPy, from the request's own arrays (not 1/√d_k = 0.5)
    x = np.array(GRANITE_FORM["x"], dtype=np.float64)
    q = x @ np.array(GRANITE_FORM["w_q"], dtype=np.float64)
    k = x @ np.array(GRANITE_FORM["w_k"], dtype=np.float64)
    expected = q @ k.T * 0.3
    np.testing.assert_allclose(data["scaled_scores"], expected, rtol=1e-12, atol=1e-12)
    assert data["scale"] == 0.3 and data["conventions"]["scale"] == "given"
    cells = map_cells(page, "scaled_scores")  # the map the page drew
    assert len(cells) == 9
    for (i, j), value in cells.items():
        assert float(value) == pytest.approx(expected[i, j], rel=1e-12, abs=1e-12)
    page.locator('figure[data-name="scaled_scores"] rect.cell[data-row="2"][data-col="1"]').click()
    panel = page.locator("#explain")
    expect(panel.locator(".explain-title")).to_have_text("scaled_scores[2][1]")
    assert "scale = attention_multiplier = 0.300000" in panel.inner_text()
    _says_the_services_number(panel, float(expected[2, 1]))
    # the multiplier is the scale: with scale typed too the service's 422 sits beside the box
    page.fill("#scale", "0.5")
    run_form(page, "attention")
    error = page.locator('.field[data-field="attention_multiplier"] .field-error')
    expect(error).to_contain_text("give scale or attention_multiplier, not both")


LOAD = """async (request) => {
  const { fillForm } = await import('/static/form.js');
  const { buildBody } = await import('/static/request.js');
  fillForm(request);
  return {
    clip: document.getElementById('clip_qkv').value,
    multiplier: document.getElementById('attention_multiplier').value,
    extra: document.getElementById('extra').value,
    body: buildBody(),
  };
}"""


@pytest.mark.parametrize("endpoint", ["attention", "mask", "multihead"])
def test_a_request_with_both_fields_loads_back_into_their_boxes(
    page: Any, server: str, endpoint: str
) -> None:
    """A request carrying clip_qkv and attention_multiplier (as a worked example would) fills
    their boxes, on every endpoint that takes them, and the form sends the same request back."""
    page.select_option("#endpoint", endpoint)
    request: dict[str, Any] = {
        "tokens": ["a", "b", "c"], "x": _rows(3, 4, 50), "w_q": _rows(4, 4, 51),
        "w_k": _rows(4, 4, 52), "w_v": _rows(4, 4, 53), "clip_qkv": 2.5,
        "attention_multiplier": 0.125,
        "mask": {"type": "causal", "alignment": "upper_left"},
    }  # fmt: skip
    if endpoint == "multihead":
        request["num_heads"] = 2
    loaded = page.evaluate(LOAD, request)
    assert (loaded["clip"], loaded["multiplier"], loaded["extra"]) == ("2.5", "0.125", "")
    assert loaded["body"] == request
    for box in ("#clip_qkv", "#attention_multiplier"):
        expect(page.locator(box)).to_be_visible()


# ---- the output reads the values as the steps left them -----------------------------------------

# one head of d 4 from projections (in_out): c = 1.5 bites some numbers of x · W_v and leaves others
CLIPPED_V: dict[str, Any] = {
    "tokens": ["the", "cat", "sat"], "x": _rows(3, 4, 60), "w_q": _rows(4, 4, 61),
    "w_k": _rows(4, 4, 62), "w_v": _rows(4, 4, 63), "clip_qkv": C_FORM,
}  # fmt: skip


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("v_norm", "said"),
    [(False, "clipped V"), (True, "clipped and normalised V")],
    ids=["clip_qkv", "clip_qkv_and_v_norm"],
)
def test_the_output_says_what_the_steps_did_to_the_values(
    page: Any, server: str, v_norm: bool, said: str
) -> None:
    """The output's explanation names the values it read by what was done to them: clipped
    only (clip_qkv, no v_norm) is not "normalised"; with v_norm too both. The numbers are NumPy's,
    from the request's arrays: OLMo's clamp, the RMS norm, softmax(Q Kᵀ / √d) V."""
    request = {**CLIPPED_V, **({"v_norm": {"type": "rms"}} if v_norm else {})}
    data = post_json(server, "attention", request)
    x = np.array(request["x"], dtype=np.float64)
    q, k, v = (np.clip(x @ np.array(request[w], dtype=np.float64), -C_FORM, C_FORM)
               for w in ("w_q", "w_k", "w_v"))  # fmt: skip
    assert (np.abs(x @ np.array(request["w_v"])) > C_FORM).any()  # the clamp bites V
    if v_norm:
        v = v / np.sqrt((v**2).mean(axis=1, keepdims=True) + 1e-6)
    output = _softmax(q @ k.T / 2.0) @ v  # √d_k = 2
    np.testing.assert_allclose(data["output"], output, rtol=1e-12, atol=1e-12)
    v_name = "v_normed" if v_norm else "v_clipped"
    open_explorer(page, server)
    page.evaluate(DRAW, {"ep": "attention", "body": request, "data": data})
    i, j = 2, 1
    panel = _explain(page, "output", i, j)
    text = panel.inner_text()
    assert (
        f"output[{i}][{j}] = Σ_k weights[{i}][k] · {v_name}[k][{j}], the weighted sum of the "
        f"{said} rows"
    ) in text
    assert ("normalised" in text) == v_norm
    cells = panel.locator("table.explain-terms tr td:nth-child(3)").all_inner_texts()
    assert cells == [_fmt6(float(x)) for x in v[:, j]]
    _says_the_services_number(panel, float(output[i, j]))
