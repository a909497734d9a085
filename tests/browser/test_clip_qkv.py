"""OLMo's clip_qkv in the explorer (issue 40): an answer with q_clipped, k_clipped and v_clipped
drawn by the page, and a click on a cell of each explaining it — the number before the clamp,
the bounds ±clip_qkv, whether the clamp bit — with the total the service returned; RoPE turning
the clipped queries, and the heads' outputs read from the clipped values.

The form has no clip_qkv box yet, so the answer is the service's JSON for a request sent here,
handed to the page as a Run leaves it (``state.lastResult``) and drawn by its own render()."""

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.support import js_number, open_explorer, post_json
from tests.browser.test_todays_layers import _explain, _rows, _says_the_services_number

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
