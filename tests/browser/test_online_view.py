"""The explorer's online softmax view and DeepSeek's MLA cells, driven in a real browser: a form
asking for `online_softmax` (on /attention with a causal mask, and on /multihead with sinks), the
block-by-block view of one row stepped through, its m, ℓ and o (the page's own, computed from
the block before, and the service's beside them) against the JSON the page received, and the
last block's o against the output row; then the `deepseek_mla` example, its latent and shared
key drawn, and clicks on c_kv, k_rope and q_rope cells explained with the service's numbers."""

import json
import math
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.support import open_explorer, run_example, run_form

pytestmark = pytest.mark.e2e

TOL = 1e-12


def _rows(n: int, d: int, seed: int) -> list[list[float]]:
    """n rows of d numbers in [−2, 2], the same on every run."""
    return [[round(2 * math.sin(seed + 1.3 * i + 0.7 * t + 0.37 * i * t), 3) for t in range(d)]
            for i in range(n)]  # fmt: skip


def _text(m: list[list[float]]) -> str:
    return "\n".join(" ".join(str(v) for v in row) for row in m)


def _blank_form(page: Any, server: str, endpoint: str, mode: str) -> None:
    """The endpoint and input mode chosen and every box emptied, as a user clearing the form."""
    open_explorer(page, server)
    page.select_option("#endpoint", endpoint)
    page.select_option("#mode", mode)
    page.evaluate("""() => {
      for (const e of document.querySelectorAll('#form input, #form textarea'))
        if (e.type === 'checkbox') e.checked = false; else if (e.id !== 'num_heads') e.value = '';
      for (const id of ['qk_norm', 'positional_kind', 'gate']) document.getElementById(id).value = '';
    }""")
    page.select_option("#weight_layout", "in_out")


def _m(x: float | None) -> float:
    return -math.inf if x is None else x


def _close(page_value: float, json_value: float) -> bool:
    return page_value == json_value or abs(page_value - json_value) <= TOL


def _number(loc: Any) -> tuple[float, float]:
    """A shown number: (the page's, the service's it is shown beside), both in full."""
    return float(loc.get_attribute("data-value")), float(loc.get_attribute("data-service"))


def _check_block(page: Any, blocks: list[dict[str, Any]], k: int, row: int) -> Any:
    """The view shows block k of row ``row``: its m, ℓ and o, the page's and the service's, are
    the JSON's; the keys seen so far and this block's are highlighted; the rescaling factor is
    exp(m_old − m_new) of the JSON's states."""
    box = page.locator("#online .online-block")
    expect(box).to_have_attribute("data-block", str(k))
    assert box.get_attribute("data-row") == str(row)
    entry = blocks[k]
    a, b = entry["keys"]
    mine, theirs = _number(box.locator(".online-m"))
    assert _close(mine, _m(entry["m"][row])) and theirs == _m(entry["m"][row])
    mine, theirs = _number(box.locator(".online-l"))
    assert _close(mine, entry["l"][row]) and theirs == entry["l"][row]
    cells = box.locator("td.online-o")
    assert cells.count() == len(entry["o"][row])
    for c, want in enumerate(entry["o"][row]):
        mine, theirs = _number(cells.nth(c))
        assert _close(mine, want) and theirs == want, (k, row, c, mine, want)
    # the rescaling factor, from the state after the block before (or −∞ before the first)
    m_old = _m(blocks[k - 1]["m"][row]) if k else None
    factor = float(box.locator(".online-rescale").get_attribute("data-value"))
    m_new = _m(entry["m"][row])
    if m_old is not None and math.isfinite(m_new):
        assert abs(factor - math.exp(m_old - m_new)) <= TOL
        assert f"exp({_short(m_old)} − {_short(m_new)})" in box.inner_text()
    # the row's scores in blocks: keys before the block seen, this block's current
    assert box.locator("table.online-strip td.seen").count() == a
    assert box.locator("table.online-strip td.current").count() == b - a
    assert box.locator(".online-check.explain-mismatch").count() == 0
    return box


def _short(x: float) -> str:
    """Six significant digits as the page prints them (lib/format.js), for the numbers here."""
    from tests.browser.support import js_number

    return js_number(x, 6, trim=False)


def _final_equals_output(box: Any, output_row: list[float]) -> None:
    """The last block's o is shown beside the output row, and equals it."""
    final = box.locator(".online-final")
    expect(final).to_contain_text("This is the last block")
    page_o = final.locator("td.online-final-o")
    given = final.locator("td.online-final-output")
    assert page_o.count() == given.count() == len(output_row)
    for c, want in enumerate(output_row):
        assert float(given.nth(c).get_attribute("data-value")) == want
        assert abs(float(page_o.nth(c).get_attribute("data-value")) - want) <= TOL


# /attention, direct Q, K, V with a causal mask, blocks of 2 keys over 5
Q, K, V = _rows(5, 4, 0), _rows(5, 4, 1), _rows(5, 3, 2)


def test_online_softmax_on_attention_with_a_causal_mask(page: Any, server: str) -> None:
    _blank_form(page, server, "attention", "direct")
    page.fill("#tokens", "a b c d e")
    for box, m in (("q", Q), ("k", K), ("v", V)):
        page.fill(f"#{box}", _text(m))
    page.check("#causal")
    page.fill("#online_block", "2")
    body, data = run_form(page, "attention")
    assert body["online_softmax"] == {"block_size": 2}
    blocks = data["online_softmax"]
    assert [e["keys"] for e in blocks] == [[0, 2], [2, 4], [4, 5]]
    expect(page.locator("#online")).to_be_visible()
    assert page.locator("#online-head-label").is_hidden()  # one head on /attention
    # the last row, which sees every key, block by block with the step button
    page.select_option("#online-row", "4")
    _check_block(page, blocks, 0, 4)
    assert "m = −∞, ℓ = 0, o = 0" in page.locator("#online .online-block").inner_text()
    page.click("#online-step")
    _check_block(page, blocks, 1, 4)
    expect(page.locator("#online-where")).to_have_text("block 2 of 3: keys 2…3")
    page.click("#online-step")
    box = _check_block(page, blocks, 2, 4)
    _final_equals_output(box, data["output"][4])
    page.click("#online-step")  # past the last block: it stays there
    _check_block(page, blocks, 2, 4)
    page.click("#online-prev")
    _check_block(page, blocks, 1, 4)
    # row 1 under the causal mask: keys 2… are masked, so its state stops changing after block 0
    page.select_option("#online-row", "1")
    box = _check_block(page, blocks, 1, 1)
    assert "The max did not change" in box.inner_text()
    assert box.locator(".online-rescale").get_attribute("data-value") == "1"
    page.click("#online-first")
    _check_block(page, blocks, 0, 1)
    for _ in range(2):
        page.click("#online-step")
    box = _check_block(page, blocks, 2, 1)
    _final_equals_output(box, data["output"][1])


def test_online_softmax_on_multihead_per_head(page: Any, server: str) -> None:
    _blank_form(page, server, "multihead", "generated")
    page.fill("#sentence", "w0 w1 w2 w3 w4 w5")
    for field, value in (("#seed", "3"), ("#d_model", "8"), ("#num_heads", "2")):
        page.fill(field, value)
    page.fill("#sinks", "0.5 -1")
    page.fill("#online_block", "4")
    body, data = run_form(page, "multihead")
    assert body["online_softmax"] == {"block_size": 4} and body["sinks"] == [0.5, -1]
    expect(page.locator("#online")).to_be_visible()
    page.select_option("#online-head", "1")
    page.select_option("#online-row", "3")
    blocks = data["heads"][1]["online_softmax"]
    assert [e["keys"] for e in blocks] == [[0, 4], [4, 6]]
    box = _check_block(page, blocks, 0, 3)
    assert box.get_attribute("data-head") == "1"
    assert "m = sink = -1.00000, ℓ = 1" in box.inner_text()  # head 1's sink starts the row
    page.click("#online-step")
    box = _check_block(page, blocks, 1, 3)
    _final_equals_output(box, data["heads"][1]["output"][3])
    # head 0's row is head 0's numbers
    page.select_option("#online-head", "0")
    box = _check_block(page, data["heads"][0]["online_softmax"], 1, 3)
    _final_equals_output(box, data["heads"][0]["output"][3])


def _explain_cell(page: Any, name: str, i: int, j: int, head: int | None = None) -> Any:
    """Click cell [i][j] of the table of output ``name`` (head ``head``'s, opening its folded
    tables); return the explanation panel once it explains that cell."""
    key = name if head is None else f"head{head}_{name}"
    folded = page.locator(f'details.head-tables:has(table.matrix[data-name="{key}"])')
    if folded.count() and folded.get_attribute("open") is None:
        folded.locator(":scope > summary").click()
    page.locator(f'table.matrix[data-name="{key}"] td[data-row="{i}"][data-col="{j}"]').click()
    panel = page.locator("#explain")
    title = f"{name}[{i}][{j}]" + ("" if head is None else f" (head {head})")
    expect(panel.locator(".explain-title")).to_have_text(title)
    return panel


def _total(panel: Any) -> float:
    return float(panel.locator(".explain-total").get_attribute("data-total"))


def test_deepseek_mla_latent_and_shared_key(page: Any, server: str) -> None:
    open_explorer(page, server)
    data = run_example(page, "multihead", "deepseek_mla")
    # the latent and the shared key are drawn from the schema's views, cell for cell
    for name in ("c_kv", "k_rope", "c_q"):
        table = page.locator(f'table.matrix[data-name="{name}"]')
        expect(table).to_be_visible()
        assert table.locator("td[data-row]").count() == len(data[name]) * len(data[name][0])
    # the example rounds to 4 decimals: the page's float64 total rounds to the service's number
    for name, i, j in (("c_kv", 2, 1), ("k_rope", 3, 0)):
        panel = _explain_cell(page, name, i, j)
        assert abs(_total(panel) - data[name][i][j]) <= 0.5e-4 + 1e-12
        assert panel.locator(".explain-mismatch").count() == 0
    # without the rounding, every number to 1e-12
    extra = json.loads(page.input_value("#extra"))
    assert extra.pop("decimals") == 4
    page.fill("#extra", json.dumps(extra))
    _, data = run_form(page, "multihead")
    panel = _explain_cell(page, "c_kv", 2, 1)
    text = panel.inner_text()
    assert "kv_a_proj_with_mqa.weight, its first 2 rows" in text and "kv_a_layernorm.weight" in text
    assert "· w[1] = 2.00000" in text  # kv_a_layernorm.weight[1]
    assert abs(_total(panel) - data["c_kv"][2][1]) <= TOL
    assert (
        float(panel.locator(".explain-total").get_attribute("data-service")) == data["c_kv"][2][1]
    )
    assert panel.locator(".explain-mismatch").count() == 0
    for i, j in ((3, 0), (3, 1), (1, 1), (0, 0)):
        panel = _explain_cell(page, "k_rope", i, j)
        assert abs(_total(panel) - data["k_rope"][i][j]) <= TOL, (i, j)
        assert panel.locator(".explain-mismatch").count() == 0
    text = panel.inner_text()
    assert "first members, then their second members" in text and "one key for every head" in text
    panel = _explain_cell(page, "k_rope", 3, 1)
    assert "second member of pair 0" in panel.inner_text()
    # a head's rope queries, and its joined Q = [q_nope | q_rope]
    for head, i, j in ((1, 2, 0), (0, 3, 1)):
        panel = _explain_cell(page, "q_rope", i, j, head=head)
        assert abs(_total(panel) - data["heads"][head]["q_rope"][i][j]) <= TOL
        assert panel.locator(".explain-mismatch").count() == 0
    panel = _explain_cell(page, "q_rotated", 2, 3, head=1)
    assert abs(_total(panel) - data["heads"][1]["q_rotated"][2][3]) <= TOL
    assert "= q_rope[2][1]" in panel.inner_text()
