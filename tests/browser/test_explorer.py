"""Swagger UI, ReDoc and the explorer page in a real browser (Debian's Chromium, driven by
Playwright) against a real server, with every request that leaves the server blocked: the pages
must work offline."""

import json
import math
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.browser.support import (
    ARTIFACTS,
    compare_mine,
    fill_generated,
    map_cells,
    open_explorer,
    paste_mine,
    post_json,
    run_example,
    run_form,
    wait_idle,
)

pytestmark = pytest.mark.e2e


# a line of Swagger UI's own layout of an array: a number alone
NUMBER_ALONE = re.compile(r"\s*-?[0-9.]+(?:e[+-]?[0-9]+)?,?")


def _execute(page: Any, block: Any, path: str) -> tuple[Any, dict[str, Any]]:
    """Click Swagger UI's Execute; return the body it sent (decoded) and the answer's JSON, once
    the answer is shown."""
    with page.expect_response(
        lambda r: r.url.endswith(path) and r.request.method == "POST"
    ) as info:
        block.get_by_role("button", name="Execute").click()
    live = block.locator(".live-responses-table tbody .response-col_status").first
    live.wait_for(timeout=20_000)
    assert live.inner_text().strip().startswith("200")
    return json.loads(info.value.request.post_data), info.value.json()


def test_swagger_ui_renders_and_try_it_out_executes_offline(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    """Try it out: each worked example in the body editor reads as rows (one matrix row a line,
    not one number), Execute sends it as valid JSON and gets 200, and the answer is shown in
    rows too."""
    from service.wire.examples import ATTENTION_EXAMPLES, I_AM_BATMAN, MULTIHEAD_EXAMPLES

    page, outside = offline_page
    page.goto(server + "/docs")
    block = page.locator("#operations-attention-attention_attention_post")
    block.locator(".opblock-summary").click()
    editor = block.locator("textarea.body-param__text")
    editor.wait_for(timeout=20_000)
    text = editor.input_value()
    assert json.loads(text) == I_AM_BATMAN
    assert '  "x": [\n    [1, 0],\n    [0, 0],\n    [0, 1]\n  ],\n' in text  # a row a line
    assert '  "tokens": ["I", "am", "Batman"],\n' in text
    assert len(text.splitlines()) == 21  # Swagger UI's own layout (indent 2): 52 lines
    picker = block.locator(".examples-select select")
    assert picker.input_value() == "batman"  # still known as the example, not "[Modified value]"
    sent, answer = _execute(page, block, "/attention")
    assert sent == I_AM_BATMAN
    assert "Batman" in block.locator(".live-responses-table").inner_text()
    shown = block.locator(".live-responses-table .highlight-code pre").first.inner_text()
    assert json.loads(shown) == answer
    assert f'  "weights": [\n    {json.dumps(answer["weights"][0])},\n' in shown  # a row a line
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "swagger-try-it-out.png"), full_page=False)
    # every other example too: laid out in rows, sent as itself, answered 200
    for key, example in ATTENTION_EXAMPLES.items():
        picker.select_option(key)
        text = editor.input_value()
        assert json.loads(text) == example["value"], key
        assert not [line for line in text.splitlines() if NUMBER_ALONE.fullmatch(line)], key
        sent, _ = _execute(page, block, "/attention")
        assert sent == example["value"], key
    # an edited body is sent as typed
    editor.fill(json.dumps({**I_AM_BATMAN, "scale": 0.5}, indent=1))
    assert editor.input_value() == json.dumps({**I_AM_BATMAN, "scale": 0.5}, indent=1)
    sent, answer = _execute(page, block, "/attention")
    assert sent["scale"] == answer["scale"] == 0.5
    # /multihead's examples, whose names have dots (q_proj.weight) and whose arrays nest deeper
    block = page.locator("#operations-attention-multihead_multihead_post")
    block.locator(".opblock-summary").click()
    picker = block.locator(".examples-select select")
    for key, example in MULTIHEAD_EXAMPLES.items():
        picker.select_option(key)
        sent, _ = _execute(page, block, "/multihead")
        assert sent == example["value"], key
    picker.select_option("llama")
    text = block.locator("textarea.body-param__text").input_value()
    assert '  "q_proj.weight": [\n    [1, 0, 0.5, 0],\n    [0, 1, 0, 0.5],\n' in text
    assert outside == []


def test_redoc_renders_offline(offline_page: tuple[Any, list[str]], server: str) -> None:
    """ReDoc renders from the service alone, and nothing it does is refused by its CSP."""
    page, outside = offline_page
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.goto(server + "/redoc")
    page.get_by_text("Scaled dot-product attention, every step").first.wait_for(timeout=20_000)
    page.get_by_text("API docs by Redocly").first.wait_for(timeout=5_000)  # the footer is drawn
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "redoc.png"))
    assert outside == []
    assert console == [], f"console errors: {console}"


def test_swagger_shows_no_authorize_button_without_keys(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    """Without ATTENTION_API_KEYS nothing needs a key, so Swagger UI offers none."""
    page, _ = offline_page
    page.goto(server + "/docs")
    page.locator("#operations-attention-attention_attention_post").wait_for(timeout=20_000)
    assert page.locator(".auth-wrapper .authorize").count() == 0
    assert page.locator(".authorization__btn").count() == 0


# ---- the explorer page ----------------------------------------------------------------------


def _examples() -> list[tuple[str, str]]:
    from fastapi.testclient import TestClient

    from service.http.app import create_app

    spec = TestClient(create_app()).get("/openapi.json").json()
    return [
        (ep, key)
        for ep in ("attention", "mask", "multihead")
        for key in spec["paths"][f"/{ep}"]["post"]["requestBody"]["content"]["application/json"][
            "examples"
        ]
    ]


@pytest.mark.parametrize(
    ("endpoint", "example"), _examples(), ids=[f"{e}-{k}" for e, k in _examples()]
)
def test_each_worked_example_shows_what_the_api_returns(
    offline_page: tuple[Any, list[str]], server: str, endpoint: str, example: str
) -> None:
    page, outside = offline_page
    open_explorer(page, server)
    run_example(page, endpoint, example)
    body, data = run_form(page, endpoint)
    assert post_json(server, endpoint, body) == data  # the page shows the API's own answer

    batched = page.locator("#batch-pick").is_visible()
    key = "average_weights" if endpoint == "multihead" else "weights"
    weights = data[key][0] if batched else data[key]
    cells = map_cells(page, key)
    assert len(cells) == len(weights) * len(weights[0])
    for (i, j), shown in cells.items():
        assert float(shown) == pytest.approx(weights[i][j], rel=1e-12, abs=1e-12)
    tokens = data.get("tokens")
    if tokens:
        figure = page.locator(f'figure[data-name="{key}"]')
        assert figure.locator("text.row-label").all_text_contents() == tokens
    summary = page.locator("#summary li").all_inner_texts()
    rows = data["summary"][0] if batched else data["summary"]
    assert len(summary) == len(rows)
    steps = page.locator("#steps li").all_inner_texts()
    assert [s.split(":")[0] for s in steps] == [s["name"] for s in data["steps"]]
    if endpoint == "mask":  # masked cells are drawn apart from small weights
        masked = page.locator(f'figure[data-name="{key}"] rect.cell.masked').count()
        allowed = data["mask"][0] if batched else data["mask"]
        assert masked == sum(not a for row in allowed for a in row)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"explorer-{endpoint}-{example}.png"), full_page=True)
    assert outside == []


def test_batman_summary_sentence(offline_page: tuple[Any, list[str]], server: str) -> None:
    page, _ = offline_page
    open_explorer(page, server)  # the first example (I am Batman) is loaded on arrival
    run_form(page, "attention")
    assert "Batman attends most to I, 0.667" in page.locator("#summary").inner_text()


def test_an_api_error_is_shown_next_to_its_field(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    page.fill("#x", "1 0\n0 0 1\n0 1")
    _, data = run_form(page, "attention")
    assert data["errors"][0]["field"] == "x"
    message = page.locator('.field[data-field="x"] .field-error').inner_text()
    assert message == "x row 1 has 3 numbers but row 0 has 2"
    assert page.locator("#error").is_visible()


def test_256_tokens_render_on_canvas_and_read_by_keyboard(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    fill_generated(page, 256)
    for field in ("#x", "#w_q", "#w_k", "#w_v"):
        page.fill(field, "")
    page.fill("#extra", "")
    page.select_option("#weight_layout", "in_out")
    _, data = run_form(page, "attention")
    assert len(data["weights"]) == 256
    canvas = page.locator('figure[data-name="weights"] canvas')
    assert canvas.get_attribute("data-rows") == "256"
    canvas.focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    readout = page.locator('figure[data-name="weights"] .cell-readout').inner_text()
    assert readout.startswith("w1 → w1: ")
    assert float(readout.split(": ")[1]) == pytest.approx(data["weights"][1][1], abs=5e-4)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-256-tokens.png"))


def test_heatmaps_export_as_svg_and_png(offline_page: tuple[Any, list[str]], server: str) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    run_form(page, "attention")
    figure = page.locator('figure[data-name="weights"]')
    with page.expect_download() as svg:
        figure.get_by_role("button", name="Download weights  softmax as SVG").click()
    assert Path(svg.value.path()).read_text().startswith("<svg")
    with page.expect_download() as png:
        figure.get_by_role("button", name="Download weights  softmax as PNG").click()
    assert Path(png.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_copy_as_curl_gives_a_command_that_works(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    page.click("#copy-curl")
    command = page.locator("#curl").inner_text()
    assert command.startswith(f"curl -s {server}/attention ")
    out = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    assert json.loads(out)["summary"][2]["top_key"] == "I"


@pytest.mark.parametrize("offline_page", [(390, 844)], indirect=True, ids=["phone"])
def test_usable_at_phone_width(offline_page: tuple[Any, list[str]], server: str) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    # on arrival the first screen shows the example's answer; the inputs follow it
    assert page.locator("#summary").bounding_box()["y"] < 844
    assert page.locator("#results").bounding_box()["y"] < page.locator("#form").bounding_box()["y"]
    page.get_by_role("link", name="Change the inputs ↓").click()
    assert page.evaluate(
        "() => Math.abs(document.getElementById('form').getBoundingClientRect().top) < 5"
    )
    run_form(page, "attention")
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth + 1")
    assert page.locator("#run").is_visible()
    # a cell explained and two queries picked: still no sideways scrolling
    page.locator('figure[data-name="weights"] rect.cell[data-row="2"][data-col="0"]').click()
    page.locator("#explain .explain-total").wait_for()
    page.click("#pick-none")
    page.locator("#pick-chips button", has_text="Batman").click()
    assert page.locator("table.pick-table").is_visible()
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth + 1")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-phone.png"), full_page=True)


# ---- the position and score variants (API 2.6) -----------------------------------------------


def _table(page: Any, name: str) -> list[list[str]]:
    """The values (full precision, from each cell's title) of a drawn matrix table."""
    rows: list[list[str]] = page.locator(f'table.matrix[data-name="{name}"] tbody tr').evaluate_all(
        "trs => trs.map(tr => [...tr.querySelectorAll('td')].map(td => td.title))"
    )
    return rows


def test_variants_from_the_form_draw_what_the_api_returns(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    open_explorer(page, server)  # I am Batman: d_k 2
    page.check("#causal")
    page.check("#rope")
    page.fill("#rope_base", "100")
    page.fill("#softcap", "2")
    page.check("#alibi")
    page.fill("#sinks", "0.5")
    body, data = run_form(page, "attention")
    assert body["rope"] == {"base": 100}
    assert (body["softcap"], body["alibi"], body["sinks"]) == (2, True, 0.5)
    assert body["mask"] == {"type": "causal", "alignment": "upper_left"}
    assert "qk_norm" not in body and "positions" not in body
    assert post_json(server, "attention", body) == data

    caption = page.locator('table.matrix[data-name="q_rotated"] caption').inner_text()
    assert caption.startswith("Q rotated (RoPE)")
    shown = _table(page, "q_rotated")
    assert len(shown) == len(data["q_rotated"])
    for row, expected in zip(shown, data["q_rotated"], strict=True):
        assert [float(v) for v in row] == pytest.approx(expected, rel=1e-12, abs=1e-12)
    for name, title in (("capped_scores", "capped scores"), ("position_bias", "position bias")):
        figure = page.locator(f'figure[data-name="{name}"]')
        assert figure.locator("figcaption").inner_text().startswith(title)
        cells = map_cells(page, name)
        assert len(cells) == 9
        for (i, j), value in cells.items():
            assert float(value) == pytest.approx(data[name][i][j], rel=1e-12, abs=1e-12)
    assert page.locator('figure[data-name="biased_scores"]').count() == 1
    sinks = _table(page, "sink_weights")
    assert [float(r[0]) for r in sinks] == pytest.approx(data["sink_weights"], rel=1e-12)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-variants.png"), full_page=True)
    assert outside == []


def test_variants_per_head_on_multihead(offline_page: tuple[Any, list[str]], server: str) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    run_example(page, "multihead", "two_heads")
    page.select_option("#qk_norm", "layer")
    page.check("#rope")
    page.select_option("#rope_style", "interleaved")
    page.fill("#softcap", "5")
    page.check("#alibi")
    page.check("#alibi_symmetric")
    page.fill("#sinks", "0.5 -1")
    body, data = run_form(page, "multihead")
    assert body["qk_norm"] == {"type": "layer"}
    assert body["rope"] == {"style": "interleaved"}
    assert (body["alibi"], body["sinks"]) == ({"symmetric": True}, [0.5, -1])
    assert post_json(server, "multihead", body) == data
    for h, head in enumerate(data["heads"]):
        for name in ("capped_scores", "position_bias", "biased_scores"):
            cells = map_cells(page, f"head{h}_{name}")
            assert cells and all(
                float(v) == pytest.approx(head[name][i][j], rel=1e-12, abs=1e-12)
                for (i, j), v in cells.items()
            )
        for name in ("q_normed", "q_rotated", "k_rotated", "sink_weights"):
            assert page.locator(f'table.matrix[data-name="head{h}_{name}"]').count() == 1


def test_a_rope_error_is_shown_next_to_the_rope_field(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    page.check("#rope")
    page.fill("#rope_rotary_dim", "1")
    body, data = run_form(page, "attention")
    assert body["rope"] == {"rotary_dim": 1}
    assert data["errors"][0]["field"] == "rope.rotary_dim"
    message = page.locator('.field[data-field="rope"] .field-error').inner_text()
    assert message == data["errors"][0]["message"]
    assert page.locator("#error").is_visible()


# ---- compare with my numbers (compare.js) ----------------------------------------------------


def _notebook_weights(body: dict[str, Any]) -> npt.NDArray[np.float64]:
    """The course notebook's weights: softmax down the columns (axis 0) of Q Kᵀ, then ÷ √d_k."""
    x, w_q, w_k = (np.array(body[n], dtype=np.float64) for n in ("x", "w_q", "w_k"))
    if body.get("weight_layout") == "out_in":  # PyTorch layout: X · Wᵀ
        w_q, w_k = w_q.T, w_k.T
    q, k = x @ w_q, x @ w_k
    scores = q @ k.T
    e = np.exp(scores - scores.max(axis=0, keepdims=True))
    weights: npt.NDArray[np.float64] = e / e.sum(axis=0, keepdims=True) / np.sqrt(q.shape[1])
    return weights


def _rows(m: list[list[float]]) -> str:
    """Whitespace-separated rows, one per line, at full precision."""
    return "\n".join(" ".join(repr(v) for v in row) for row in m)


def test_my_numbers_parser_reads_notebook_formats(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    cases: dict[str, list[Any]] = {
        "[[0.1, 0.2], [0.3, 0.4]]": [["0.1", "0.2"], ["0.3", "0.4"]],
        "[[0.1 0.2]\n [0.3 0.4]]": [["0.1", "0.2"], ["0.3", "0.4"]],
        "array([[ 1.,  2.],\n       [-3.,  4.]])": [["1", "2"], ["-3", "4"]],
        "array([[1.5, nan]], dtype=float32)": [["1.5", "NaN"]],
        "tensor([[1.0000e-03, 2.0000e+00],\n        [3.5000e+00,       -inf]], dtype=torch.float64)": [
            ["0.001", "2"],
            ["3.5", "-Infinity"],
        ],
        "tensor([[0.5, 0.5]], requires_grad=True)": [["0.5", "0.5"]],
        "1.2e-03 -4E+2\nnan -inf\n inf 7": [
            ["0.0012", "-400"],
            ["NaN", "-Infinity"],
            ["Infinity", "7"],
        ],
        "1, 2, 3\n4,5,6\n\n": [["1", "2", "3"], ["4", "5", "6"]],
        "1 2; 3 4": [["1", "2"], ["3", "4"]],
        "[[[1. 2.]\n  [3. 4.]]\n\n [[5. 6.]\n  [7. 8.]]]": [
            [["1", "2"], ["3", "4"]],
            [["5", "6"], ["7", "8"]],
        ],
    }
    parsed = page.evaluate(
        """cases => Object.fromEntries(cases.map(c => {
            const show = v => Array.isArray(v) ? v.map(show) : String(v);
            return [c, show(parseNumbers(c))];
        }))""",
        list(cases),
    )
    assert parsed == cases
    errors = {
        "1 2 3 4\n5 6 7 8\n1 2 3": "row 2 has 3 numbers but row 0 has 4",
        "[[1, 2], [3, 4, 5]]": "row 1 has 3 numbers but row 0 has 2",
        "[[0.1 0.2]\n [0.3]]": "row 1 has 1 number but row 0 has 2",
        "1 2\nabc 3": "row 1: “abc” is not a number",
        "[[1, 2], [x, 4]]": "row 1: “x” is not a number",
        "[[1, 2], [3, 4]": "a [ is never closed (1 ] missing at the end)",
        "array([[1, 2, ..., 9]])": "the array was printed shortened",
        "[[[1, 2]], [[3, 4], [5, 6]]]": "block 1 has 2 rows but block 0 has 1",
        "[[1, 2], 3]": "row 1 is a single number where a list was expected",
        "Out: [[1, 2]]": "unexpected text before the first [",
    }
    found = page.evaluate(
        """cases => Object.fromEntries(cases.map(c => {
            try { parseNumbers(c); return [c, "no error"]; } catch (e) { return [c, e.message]; }
        }))""",
        list(errors),
    )
    for text, message in errors.items():
        assert found[text].startswith(message), (text, found[text])
    assert page.evaluate("() => parseNumbers('   ')") is None


def test_compare_names_the_course_notebook_mistake(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    open_explorer(page, server)  # I am Batman (weight_layout out_in)
    body, data = run_form(page, "attention")
    wrong = _notebook_weights(body)
    paste_mine(page, "q", json.dumps(data["q"]))  # the right Q, as JSON rows
    paste_mine(page, "weights", str(wrong))  # what print(weights) shows in the notebook
    sent, got = compare_mine(page, "attention")
    assert sent["expected"]["q"] == data["q"]
    assert np.allclose(sent["expected"]["weights"], wrong, atol=1e-8)
    assert "tolerance" not in sent  # the boxes are empty: printed numbers compare as printed
    assert {k: v for k, v in sent.items() if k != "expected"} == body
    assert got["first_mismatch"] == "weights"

    panel = page.locator("#comparison")
    assert panel.is_visible()
    codes = panel.locator(".verdict code.mistake").all_inner_texts()
    assert codes == ["softmax_over_queries", "scale_after_softmax"]
    explanation = panel.locator(".verdict .explanation").inner_text()
    assert explanation == got["comparison"][-1]["diagnosis"]["explanation"]
    items = panel.locator("ol.compared li")
    assert items.evaluate_all("els => els.map(e => e.dataset.name)") == ["q", "weights"]
    assert items.nth(0).inner_text().startswith("✓ q")
    first = panel.locator("ol.compared li.first-mismatch")
    assert first.get_attribute("data-name") == "weights"
    assert first.inner_text().startswith("✗ weights")
    assert "first difference" in first.inner_text()
    card = page.locator('figure[data-name="weights"]')
    assert "first-mismatch" in (card.get_attribute("class") or "")

    diff = page.locator('figure.diff[data-name="diff_weights"]')
    assert diff.is_visible()
    where = got["comparison"][-1]["where"]
    assert diff.get_attribute("data-where") == f"{where[0]},{where[1]}"
    outlined = diff.locator("rect.cell.where")
    assert outlined.count() == 1
    assert (outlined.get_attribute("data-row"), outlined.get_attribute("data-col")) == (
        str(where[0]),
        str(where[1]),
    )
    cells = map_cells(page, "diff_weights")
    assert len(cells) == 9
    ours = np.array(data["weights"])
    for (i, j), shown in cells.items():
        assert float(shown) == pytest.approx(wrong[i][j] - ours[i][j], abs=1e-8)
    assert page.locator('figure.diff[data-name="diff_q"]').count() == 1  # q: all zeros
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-compare-diagnosis.png"), full_page=True)
    assert outside == []


def test_compare_with_the_services_own_numbers_all_match(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    _, data = run_form(page, "attention")
    paste_mine(page, "k", json.dumps(data["k"]))
    paste_mine(page, "scores", _rows(data["scores"]))
    paste_mine(page, "weights", "array(" + json.dumps(data["weights"]) + ")")
    paste_mine(page, "output", _rows(data["output"]))
    page.fill("#atol", "1e-9")
    page.fill("#rtol", "0")
    sent, got = compare_mine(page, "attention")
    assert sent["tolerance"] == {"atol": 1e-9, "rtol": 0}
    assert got["first_mismatch"] is None
    items = page.locator("#comparison ol.compared li")
    names = ["k", "scores", "weights", "output"]
    assert items.evaluate_all("els => els.map(e => e.dataset.name)") == names
    assert all(t.startswith("✓") for t in items.all_inner_texts())
    assert page.locator("#comparison .verdict.ok").inner_text().startswith("✓ All 4")
    assert page.locator("#comparison .first-mismatch").count() == 0
    for name in names:
        assert page.locator(f'figure.diff[data-name="diff_{name}"]').count() == 1
    assert set(map_cells(page, "diff_weights").values()) == {"0"}
    # a plain Run afterwards sends no expected numbers and hides the comparison
    body, again = run_form(page, "attention")
    assert "expected" not in body and "comparison" not in again
    assert page.locator("#comparison").is_hidden()
    assert page.locator('details.my-numbers[data-name="weights"] textarea').input_value()


def test_per_head_boxes_fill_expected_heads(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    run_example(page, "multihead", "two_heads")
    assert json.loads(page.input_value("#extra")) == {"decimals": 4}
    page.fill("#extra", "")  # the service's numbers at full precision, to paste back
    _, data = run_form(page, "multihead")
    paste_mine(page, "heads.1.weights", json.dumps(data["heads"][1]["weights"]))
    paste_mine(page, "concat", _rows(data["concat"]))
    paste_mine(page, "output", json.dumps(data["output"]))
    sent, got = compare_mine(page, "multihead")
    assert sent["expected"]["heads"] == [None, {"weights": data["heads"][1]["weights"]}]
    assert set(sent["expected"]) == {"heads", "concat", "output"}
    assert [r["name"] for r in got["comparison"]] == ["heads.1.weights", "concat", "output"]
    items = page.locator("#comparison ol.compared li")
    assert all(t.startswith("✓") for t in items.all_inner_texts())
    assert page.locator('figure.diff[data-name="diff_head1_weights"]').count() == 1


def test_my_numbers_errors_are_shown_next_to_the_box(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    _, data = run_form(page, "attention")
    paste_mine(page, "weights", "0.1 0.2 0.3\n0.4 0.5\n0.6 0.7 0.8")
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.click("#compare")
    error = page.locator('details.my-numbers[data-name="weights"] .box-error')
    error.wait_for()
    assert error.inner_text() == "Can't read your weights: row 1 has 2 numbers but row 0 has 3"
    assert posts == []  # nothing is sent while a box cannot be read
    # the service refuses a transposed array; its words go next to the box too
    paste_mine(page, "weights", "")
    paste_mine(page, "output", json.dumps(np.array(data["output"]).T.tolist()))
    _, got = compare_mine(page, "attention")
    assert got["errors"][0]["field"] == "expected.output"
    shown = page.locator('details.my-numbers[data-name="output"] .box-error').inner_text()
    assert shown == got["errors"][0]["message"]
    assert "transpose" in shown
    page.fill("#atol", "-1")
    page.click("#compare")
    assert page.locator("#atol-error").inner_text().startswith("atol: “-1” is not a number ≥ 0")


def test_an_inverted_causal_mask_is_warned_about(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    page.select_option("#endpoint", "mask")
    page.fill("#boolean", "0 1 1\n0 0 1\n0 0 0")  # true = may attend: the opposite of causal
    body, data = run_form(page, "mask")
    assert body["mask"] == {"type": "boolean", "matrix": [[0, 1, 1], [0, 0, 1], [0, 0, 0]]}
    assert [w["code"] for w in data["warnings"]] == ["mask_polarity"]
    warnings = page.locator("#warnings")
    assert warnings.is_visible()
    assert "mask_polarity" in warnings.inner_text()
    assert data["warnings"][0]["message"] in warnings.inner_text()
    beside = page.locator('.field[data-field="boolean"] .field-warning')
    assert data["warnings"][0]["message"] in beside.inner_text()
    assert page.locator("#comparison").is_hidden()  # a warning needs no expected numbers
    page.fill("#boolean", "1 0 0\n1 1 0\n1 1 1")
    _, data = run_form(page, "mask")
    assert "warnings" not in data
    assert page.locator("#warnings").is_hidden()
    assert page.locator(".field-warning").count() == 0


@pytest.mark.parametrize("offline_page", [(390, 844)], indirect=True, ids=["phone"])
def test_compare_at_phone_width(offline_page: tuple[Any, list[str]], server: str) -> None:
    page, _ = offline_page
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    open_explorer(page, server)
    body, _ = run_form(page, "attention")
    paste_mine(page, "weights", str(_notebook_weights(body)))
    compare_mine(page, "attention")
    assert page.locator("#comparison .verdict code.mistake").count() == 2
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth + 1")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-compare-phone.png"), full_page=True)
    assert console == [], f"console errors: {console}"


def test_compare_leaves_out_decimals_and_shows_the_batch_item_that_differs(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    page.fill("#x", json.dumps([[[1, 0], [0, 0], [0, 1]], [[0, 1], [1, 1], [1, 0]]]))
    page.fill("#extra", '{"decimals": 3}')
    body, _ = run_form(page, "attention")
    assert body["decimals"] == 3 and page.locator("#batch-pick").is_visible()
    exact = post_json(server, "attention", {k: v for k, v in body.items() if k != "decimals"})
    mine = np.array(exact["weights"])
    mine[1, 2, 0] += 0.01
    paste_mine(page, "weights", json.dumps(mine.tolist()))
    sent, got = compare_mine(page, "attention")
    assert "decimals" not in sent  # rounded answers would hide small differences
    assert sent["expected"]["weights"] == mine.tolist()
    entry = got["comparison"][0]
    assert entry["where"] == [1, 2, 0]
    assert entry["max_abs_diff"] == pytest.approx(0.01, abs=1e-12)
    assert page.input_value("#batch") == "1"
    assert '"decimals": 3' in page.locator("#comparison").inner_text()
    diff = page.locator('figure.diff[data-name="diff_weights"]')
    assert diff.get_attribute("data-where") == "2,0"
    assert float(map_cells(page, "diff_weights")[(2, 0)]) == pytest.approx(0.01, abs=1e-12)
    page.select_option("#batch", "0")  # the other item: nothing outlined, no difference
    assert diff.get_attribute("data-where") is None
    assert set(map_cells(page, "diff_weights").values()) == {"0"}


def test_a_torch_print_of_the_right_weights_agrees_to_its_4_decimals(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    """A student pastes torch's print of their (correct) weights: the page says they agree to
    the 4 decimals printed, where a 1e-6 tolerance called them wrong; typing a tolerance wins."""
    torch = pytest.importorskip("torch")
    page, _ = offline_page
    open_explorer(page, server)
    _, data = run_form(page, "attention")
    printed = str(torch.tensor(data["weights"], dtype=torch.float64))  # 4 decimals
    paste_mine(page, "weights", printed)
    sent, got = compare_mine(page, "attention")
    assert "tolerance" not in sent and got["first_mismatch"] is None
    assert got["comparison"][0]["printed"] == {"decimals": 4}
    verdict = page.locator("#comparison .verdict.ok").inner_text()
    assert verdict == "✓ The compared array matches (the 4 decimals you printed)."
    item = page.locator('#comparison ol.compared li[data-name="weights"]').inner_text()
    assert item.startswith("✓ weights") and "agrees to the 4 decimals you printed" in item
    page.fill("#atol", "1e-6")
    page.fill("#rtol", "1e-6")
    sent, got = compare_mine(page, "attention")
    assert sent["tolerance"] == {"atol": 1e-6, "rtol": 1e-6}
    assert got["first_mismatch"] == "weights" and got["comparison"][0]["printed"] is None


def test_a_bfloat16_kernels_output_is_judged_at_bfloat16_rounding(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    """An engineer pastes the output of their attention run in bfloat16 (torch's SDPA on the
    answer's own q, k, v): no tolerance typed, the service detects bfloat16 numbers and judges
    them as a kernel is; the page says so in the verdict, the list and the tolerance note."""
    torch = pytest.importorskip("torch")
    page, _ = offline_page
    open_explorer(page, server)
    sent, data = run_form(page, "attention")
    assert "mask" not in sent  # the default form: no mask, the scale 1/√d_k
    q, k, v = (torch.tensor(data[n], dtype=torch.bfloat16)[None] for n in ("q", "k", "v"))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)[0].double()
    paste_mine(page, "output", json.dumps(out.tolist()))
    sent, got = compare_mine(page, "attention")
    entry = got["comparison"][0]
    assert "tolerance" not in sent and entry["match"], entry["message"]
    assert entry["precision"]["type"] == "bfloat16"
    verdict = page.locator("#comparison .verdict.ok").inner_text()
    assert verdict == "✓ The compared array matches (bfloat16 rounding)."
    item = page.locator('#comparison ol.compared li[data-name="output"]').inner_text()
    assert "agrees to bfloat16 rounding" in item
    assert page.locator("#tol-used").inner_text() == "used: bfloat16 rounding (output)"


def test_the_tolerance_inputs_show_what_each_comparison_used(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    """After each Compare the note under atol and rtol says what was used: the 4 decimals the
    weights were printed with, the default 1e-6 for numbers not printed-rounded (the two grouped
    when mixed), or the tolerance typed in; editing the inputs clears it until the next Compare."""
    torch = pytest.importorskip("torch")
    page, _ = offline_page
    open_explorer(page, server)
    _, data = run_form(page, "attention")
    note = page.locator("#tol-used")
    assert note.is_hidden()
    for field in ("atol", "rtol"):  # read with the inputs by a screen reader
        assert "tol-used" in (page.get_attribute(f"#{field}", "aria-describedby") or "").split()
    assert note.get_attribute("aria-live") == "polite"

    printed = str(torch.tensor(data["weights"], dtype=torch.float64))  # 4 decimals
    paste_mine(page, "weights", printed)
    sent, got = compare_mine(page, "attention")
    assert "tolerance" not in sent and got["comparison"][0]["printed"] == {"decimals": 4}
    assert note.inner_text() == "used: the 4 decimals you printed (weights)"
    assert page.get_attribute("#atol", "placeholder") == "as printed"

    paste_mine(page, "output", json.dumps(data["output"]))  # full precision: not printed-rounded
    sent, got = compare_mine(page, "attention")
    assert [(r["name"], r["printed"]) for r in got["comparison"]] == [
        ("weights", {"decimals": 4}),
        ("output", None),
    ]
    assert (
        note.inner_text() == "used: the 4 decimals you printed (weights); the default 1e-6 (output)"
    )
    assert page.get_attribute("#rtol", "placeholder") == "printed / 1e-6"
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#compare-bar").screenshot(path=str(ARTIFACTS / "explorer-tolerance-used.png"))

    page.fill("#atol", "1e-3")  # an edit: the note no longer says what the inputs hold
    assert note.is_hidden() and note.inner_text() == ""
    assert page.get_attribute("#rtol", "placeholder") == "1e-6, or as printed"
    sent, got = compare_mine(page, "attention")
    assert sent["tolerance"] == {"atol": 1e-3, "rtol": 1e-6}
    assert all(r["printed"] is None for r in got["comparison"])  # a tolerance typed in wins
    assert note.inner_text() == "used: atol 1e-3 (yours), rtol 1e-6 (the default)"
    assert page.input_value("#rtol") == ""  # the default is not written into the empty input
    assert page.get_attribute("#rtol", "placeholder") == "1e-6 (default)"
    page.locator("#compare-bar").screenshot(path=str(ARTIFACTS / "explorer-tolerance-yours.png"))
    page.fill("#rtol", "0")
    sent, _ = compare_mine(page, "attention")
    assert sent["tolerance"] == {"atol": 1e-3, "rtol": 0}
    assert note.inner_text() == "used: atol 1e-3, rtol 0 (yours)"

    page.fill("#atol", "")
    page.fill("#rtol", "")
    paste_mine(page, "weights", "")  # only the full-precision output: the default
    sent, got = compare_mine(page, "attention")
    assert "tolerance" not in sent and got["comparison"][0]["printed"] is None
    assert note.inner_text() == "used: atol 1e-6, rtol 1e-6 (the default)"
    assert page.get_attribute("#atol", "placeholder") == "1e-6 (default)"
    body, _ = run_form(page, "attention")  # a plain Run compares nothing: no note
    assert "expected" not in body
    assert note.is_hidden()
    assert page.get_attribute("#atol", "placeholder") == "1e-6, or as printed"


def test_expected_numbers_in_a_worked_example_fill_the_boxes(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    """An example whose request carries `expected` (in "more fields"): Run shows the comparison,
    the boxes and the tolerance take its numbers, and Compare gives the same answer."""
    from fastapi.testclient import TestClient

    from service.http.app import create_app

    spec = TestClient(create_app()).get("/openapi.json").json()
    content = spec["paths"]["/attention"]["post"]["requestBody"]["content"]["application/json"]
    with_expected = [k for k, ex in content["examples"].items() if "expected" in ex["value"]]
    if not with_expected:
        pytest.skip("no /attention example carries expected numbers")
    key = with_expected[0]
    value = content["examples"][key]["value"]
    page, _ = offline_page
    open_explorer(page, server)
    page.select_option("#example", key)
    body, data = run_form(page, "attention")
    assert body["expected"] == value["expected"]
    names = [r["name"] for r in data["comparison"]]
    assert (
        page.locator("#comparison ol.compared li").evaluate_all(
            "els => els.map(e => e.dataset.name)"
        )
        == names
    )
    for name, array in value["expected"].items():
        text = page.locator(f'details.my-numbers[data-name="{name}"] textarea').input_value()
        assert page.evaluate("t => parseNumbers(t)", text) == array
    tolerance = value.get("tolerance", {})
    for field in ("atol", "rtol"):
        if field in tolerance:
            assert float(page.input_value(f"#{field}")) == tolerance[field]
    sent, got = compare_mine(page, "attention")
    assert sent["expected"] == value["expected"]
    assert got["first_mismatch"] == data["first_mismatch"]
    assert [r["diagnosis"] for r in got["comparison"]] == [
        r["diagnosis"] for r in data["comparison"]
    ]
    if data["first_mismatch"]:
        first = next(r for r in data["comparison"] if r["name"] == data["first_mismatch"])
        if first["diagnosis"]:
            codes = page.locator("#comparison .verdict code.mistake").all_inner_texts()
            assert codes == first["diagnosis"]["mistakes"]


def test_masked_scores_printed_with_minus_inf_match(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    page.select_option("#endpoint", "mask")
    page.check("#causal")
    _, data = run_form(page, "mask")
    scores = np.array([[-np.inf if v is None else v for v in row] for row in data["masked_scores"]])
    with np.printoptions(precision=17):
        printed = repr(scores)  # array([[ 3.53553390593273731, -inf, ...
    assert "-inf" in printed
    paste_mine(page, "masked_scores", printed)
    sent, got = compare_mine(page, "mask")
    assert sent["expected"]["masked_scores"] == data["masked_scores"]  # −∞ goes as null
    assert got["first_mismatch"] is None
    assert page.locator("#comparison li[data-name=masked_scores]").inner_text().startswith("✓")
    assert set(map_cells(page, "diff_masked_scores").values()) == {"0"}


# ---- drawn at once; each input mode sends only its own fields ----------------------------------


def test_the_page_opens_with_the_first_example_drawn(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    open_explorer(page, server)  # no Run clicked
    assert posts == [server + "/attention"]
    assert page.locator("#results").is_visible()
    assert "Batman attends most to I, 0.667" in page.locator("#summary").inner_text()
    assert len(map_cells(page, "weights")) == 9
    assert page.locator("#outcome-status").inner_text().startswith("Done in")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-on-arrival.png"))
    assert outside == []


def test_picking_an_example_runs_it(offline_page: tuple[Any, list[str]], server: str) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    data = run_example(page, "mask", "causal")
    weights = map_cells(page, "weights")
    assert len(weights) == len(data["weights"]) * len(data["weights"][0])
    assert page.locator('figure[data-name="weights"] rect.cell.masked').count() > 0


def test_switching_the_input_mode_sends_only_that_modes_fields(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)  # I am Batman: x and weights
    x = page.input_value("#x")
    page.select_option("#mode", "generated")
    assert page.input_value("#x") == ""  # the projections' x is put away, not sent
    page.fill("#sentence", "the cat sat on the mat")
    for field, value in (("#seed", "1"), ("#d_model", "16"), ("#d_k", "4")):
        page.fill(field, value)
    body, data = run_form(page, "attention")
    assert not {"x", "w_q", "w_k", "w_v", "q", "k", "v"} & set(body)
    assert "errors" not in data and len(data["weights"]) == 6
    page.select_option("#mode", "direct")
    page.fill("#q", "1 0\n0 1")
    page.fill("#k", "1 0\n0 1")
    page.fill("#v", "1 2\n3 4")
    page.fill("#tokens", "")
    body, data = run_form(page, "attention")
    assert set(body) & {"x", "w_q", "sentence", "seed", "d_model"} == set()
    assert data["output"] and "errors" not in data
    page.select_option("#mode", "projections")
    assert page.input_value("#x") == x  # and comes back on return
    page.select_option("#mode", "direct")
    assert page.input_value("#q") == "1 0\n0 1"


def test_errors_and_status_are_shown_at_the_top_of_the_results(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    page.fill("#x", "1 0\n0 0 1\n0 1")
    run_form(page, "attention")
    top = page.locator("#outcome-error")
    assert top.is_visible() and top.inner_text() == page.locator("#error").inner_text()
    assert page.locator("#outcome-status").inner_text() == "Error 422"
    box = top.bounding_box()
    assert box is not None and box["y"] < 400  # beside the form's top, not below it
    page.fill("#x", "1 0\n0 0\n0 1")
    run_form(page, "attention")
    assert top.is_hidden()


# ---- the cell-explanation hook (explain.js) --------------------------------------------------

# A stand-in for explain.js, so that the hook is tested on its own: it records every ctx and
# explains everything but capped_scores.
EXPLAIN_STUB = """
export function explainCell(ctx) {
  (window.explained = window.explained || []).push(ctx);
  if (ctx.name === "capped_scores") return null;
  const p = document.createElement("p");
  p.className = "stub-explanation";
  p.textContent = `${ctx.name} head=${ctx.head} batch=${ctx.batch} ${ctx.i},${ctx.j}`;
  return p;
}
"""


def _stub_explain(page: Any) -> None:
    page.route(
        "**/static/explain.js",
        lambda route: route.fulfill(status=200, content_type="text/javascript", body=EXPLAIN_STUB),
    )


def _last_ctx(page: Any) -> dict[str, Any]:
    ctx: dict[str, Any] = page.evaluate("() => window.explained.at(-1)")
    return ctx


def test_clicking_a_cell_calls_explain_cell_and_shows_the_answer(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    _stub_explain(page)
    open_explorer(page, server)
    body, data = run_form(page, "attention")
    panel = page.locator("#explain")
    assert panel.is_hidden()
    page.locator('figure[data-name="weights"] rect.cell[data-row="1"][data-col="2"]').click()
    panel.locator(".stub-explanation").wait_for()
    assert panel.inner_text().count("weights head=null batch=null 1,2") == 1
    ctx = _last_ctx(page)
    assert (ctx["endpoint"], ctx["name"], ctx["i"], ctx["j"]) == ("attention", "weights", 1, 2)
    assert ctx["request"] == body and ctx["data"] == data
    # the keyboard: focus a cell of another map and press Enter; the answer replaces the last
    cell = page.locator('figure[data-name="scores"] rect.cell[data-row="0"][data-col="1"]')
    cell.focus()
    page.keyboard.press("Enter")
    assert panel.locator(".stub-explanation").inner_text() == "scores head=null batch=null 0,1"
    assert panel.locator(".stub-explanation").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-explain.png"))
    page.keyboard.press("Escape")
    assert panel.is_hidden()
    # every cell of the output table too, and the close button
    page.locator('table.matrix[data-name="output"] td[data-row="2"][data-col="0"]').click()
    assert panel.locator(".stub-explanation").inner_text() == "output head=null batch=null 2,0"
    page.click("#explain-close")
    assert panel.is_hidden()
    # the maps named by the hook are focusable; the others (inputs) are not
    assert page.locator('figure[data-name="scaled_scores"] rect.cell[tabindex="0"]').count() == 9
    assert page.locator('figure[data-name="mask"] rect.cell[tabindex]').count() == 0
    assert outside == []


def test_explain_hook_names_the_head_and_shows_nothing_for_null(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    _stub_explain(page)
    open_explorer(page, server)
    run_example(page, "multihead", "two_heads")
    page.fill("#softcap", "5")
    _, data = run_form(page, "multihead")
    page.locator('figure[data-name="head1_weights"] rect.cell[data-row="2"][data-col="0"]').click()
    panel = page.locator("#explain")
    panel.locator(".stub-explanation").wait_for()
    ctx = _last_ctx(page)
    assert (ctx["endpoint"], ctx["name"], ctx["head"], ctx["i"], ctx["j"]) == (
        "multihead",
        "weights",
        1,
        2,
        0,
    )
    assert ctx["data"] == data
    # explainCell answers null for capped_scores: nothing is shown
    page.locator('figure[data-name="head0_capped_scores"] rect.cell').first.click()
    page.wait_for_function("() => window.explained.at(-1).name === 'capped_scores'")
    assert panel.is_hidden()


def test_explain_hook_on_a_canvas_map_uses_the_keyboard_cursor(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    _stub_explain(page)
    open_explorer(page, server)
    fill_generated(page, 40)
    page.fill("#extra", "")
    run_form(page, "attention")
    canvas = page.locator('figure[data-name="weights"] canvas')
    canvas.focus()
    for key in ("ArrowDown", "ArrowDown", "ArrowRight", "Enter"):
        page.keyboard.press(key)
    page.locator("#explain .stub-explanation").wait_for()
    assert page.locator("#explain").inner_text().endswith("weights head=null batch=null 2,1")


# The colour of a canvas cell: the pixel a quarter of the way into the cell (off the hatching's
# diagonal and the grid)
CANVAS_PIXEL = """([name, i, j]) => {
  const c = document.querySelector(`figure[data-name="${name}"] canvas`);
  const cell = +c.dataset.cell, d = devicePixelRatio;
  const x = +c.dataset.ox + (j - +c.dataset.left + 0.25) * cell, y = +c.dataset.oy + (i - +c.dataset.top + 0.25) * cell;
  return [...c.getContext('2d').getImageData(Math.floor(x * d), Math.floor(y * d), 1, 1).data.slice(0, 3)];
}"""


def test_a_canvas_map_colours_each_cell_by_its_value(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    """40 causal tokens: each weight is white → blue by its share of the map's largest weight
    (scores: red below 0, blue above, by |value| ÷ the largest); the masked weights grey."""
    page, _ = offline_page
    open_explorer(page, server)
    fill_generated(page, 40, seed=3)
    page.check("#causal")
    _, data = run_form(page, "attention")
    white, blue, red = np.array([255, 255, 255]), np.array([36, 88, 166]), np.array([179, 38, 30])
    for name in ("weights", "scaled_scores"):
        page.locator(f'figure[data-name="{name}"] canvas[data-cell]').wait_for()
        m = data[name]
        top = max(abs(v) for row in m for v in row if v is not None)
        for i, j in ((0, 0), (5, 3), (39, 20), (39, 39), (2, 30)):
            got = np.array(page.evaluate(CANVAS_PIXEL, [name, i, j]))
            v = m[i][j]
            if name == "weights" and i < j:  # above the diagonal: masked (0 in the weights)
                want = np.array([201, 206, 214])
            else:
                t = v / top
                want = white + ((blue if t >= 0 else red) - white) * abs(t)
            assert np.abs(got - want).max() <= 1.5, (name, i, j, v, got, want)


@pytest.mark.parametrize("offline_page", [(1280, 900, 2)], indirect=True, ids=["hidpi"])
def test_a_canvas_map_is_sharp_on_a_hidpi_screen_and_clicks_find_their_cell(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    """Two device pixels a CSS pixel: the canvas holds twice the pixels of its size on the page,
    and a click in CSS pixels still lands on the cell drawn there."""
    page, _ = offline_page
    _stub_explain(page)
    open_explorer(page, server)
    fill_generated(page, 40)
    run_form(page, "attention")
    canvas = page.locator('figure[data-name="weights"] canvas')
    width, css = canvas.evaluate("c => [c.width, c.getBoundingClientRect().width]")
    assert width == round(2 * css)
    cell, ox, oy = (
        float(canvas.get_attribute(a) or 0) for a in ("data-cell", "data-ox", "data-oy")
    )
    canvas.click(position={"x": ox + 7.5 * cell, "y": oy + 3.5 * cell})
    page.locator("#explain .stub-explanation").wait_for()  # explain.js is loaded on the first click
    assert page.locator("#explain").inner_text().endswith("weights head=null batch=null 3,7")


# ---- export: CSV, JSON, safetensors ------------------------------------------------------------


def test_export_csv_json_and_safetensors(offline_page: tuple[Any, list[str]], server: str) -> None:
    page, outside = offline_page
    open_explorer(page, server)
    _, data = run_form(page, "attention")
    figure = page.locator('figure[data-name="weights"]')
    with page.expect_download() as csv:
        figure.get_by_role("button", name="Download weights  softmax as CSV").click()
    lines = Path(csv.value.path()).read_text().splitlines()
    assert lines[0] == ",I,am,Batman"
    assert [float(v) for v in lines[3].split(",")[1:]] == data["weights"][2]
    with page.expect_download() as out:
        page.locator('table.matrix[data-name="output"] caption button').click()
    rows = Path(out.value.path()).read_text().splitlines()
    assert [float(v) for v in rows[1].split(",")[1:]] == data["output"][0]
    with page.expect_download() as whole:
        page.click("#export-json")
    assert json.loads(Path(whole.value.path()).read_text()) == data
    with page.expect_download() as tensors:
        page.click("#export-safetensors")
    raw = Path(tensors.value.path()).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    entry = header["weights"]
    begin, end = entry["data_offsets"]
    assert entry["dtype"] == "F64" and entry["shape"] == [3, 3]
    weights = np.frombuffer(raw[8 + n + begin : 8 + n + end], dtype="<f8").reshape(3, 3)
    assert np.allclose(weights, data["weights"], rtol=0, atol=1e-12)
    assert outside == []


# ---- heads side by side (/multihead) ---------------------------------------------------------


def test_heads_side_by_side_with_average_and_difference(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    open_explorer(page, server)
    data = run_example(page, "multihead", "generated")
    grid = page.locator("#heads-grid")
    names = grid.locator(":scope > figure").evaluate_all("els => els.map(e => e.dataset.name)")
    heads = len(data["heads"])
    assert names == [f"head{h}_weights" for h in range(heads)] + ["average_weights"]
    # the difference of two chosen heads
    page.select_option("#diff-a", str(heads - 1))
    page.select_option("#diff-b", "0")
    diff = map_cells(page, "heads_diff")
    a, b = np.array(data["heads"][heads - 1]["weights"]), np.array(data["heads"][0]["weights"])
    for (i, j), shown in diff.items():
        assert float(shown) == pytest.approx(a[i, j] - b[i, j], abs=1e-12)
    # masked-score maps are folded away
    folded = page.locator("details.collapsed-map")
    assert folded.count() == heads and folded.first.get_attribute("open") is None
    assert page.locator('figure[data-name="head0_masked_scores"]').is_hidden()
    for h in range(heads):  # each head's scaled scores stay in view; only the masked are folded
        assert page.locator(f'#heatmaps > figure[data-name="head{h}_scaled_scores"]').is_visible()
    folded.first.locator(":scope > summary").click()
    assert page.locator('figure[data-name="head0_masked_scores"]').is_visible()
    # one head's detailed maps only
    page.select_option("#head-pick", "1")
    assert page.locator('#heatmaps > [data-head="0"]').first.is_hidden()
    assert page.locator('#heatmaps > [data-head="1"]').first.is_visible()
    assert page.locator('figure[data-name="head0_weights"]').is_visible()  # the grid keeps all
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#heads").screenshot(path=str(ARTIFACTS / "explorer-heads.png"))
    assert outside == []


# ---- large inputs ----------------------------------------------------------------------------


# How many colours the middle of the first whole cell in view holds (a cell of one colour: 1).
CELL_COLOURS = """() => {
  const c = document.querySelector('figure[data-name="weights"] canvas');
  const cell = +c.dataset.cell, top = +c.dataset.top, left = +c.dataset.left;
  const x = +c.dataset.ox + (Math.ceil(left) - left + 0.2) * cell;
  const y = +c.dataset.oy + (Math.ceil(top) - top + 0.3) * cell;
  const d = devicePixelRatio;  // the canvas holds d × d pixels a CSS pixel
  const px = c.getContext('2d').getImageData(x * d, y * d, cell * 0.6 * d, cell * 0.4 * d).data;
  const seen = new Set();
  for (let k = 0; k < px.length; k += 4) seen.add(`${px[k]},${px[k + 1]},${px[k + 2]}`);
  return seen.size;
}"""


@pytest.mark.parametrize("length", [512, 2048])
def test_time_to_first_paint_of_a_large_weights_map(
    offline_page: tuple[Any, list[str]], server: str, length: int
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    page.select_option("#mode", "generated")
    page.fill("#tokens", "")
    for field, value in (("#seed", "0"), ("#d_model", "16"), ("#d_k", "16")):
        page.fill(field, value)
    page.fill("#extra", json.dumps({"seq_len": length, "include": ["weights"]}))
    page.evaluate("() => { window.explorerTiming = null; }")
    wait_idle(page)
    with page.expect_request(lambda r: r.url.endswith("/attention")) as sent:
        page.click("#run")  # the answer is too large for the inspector to hand back: read the page
    assert sent.value.headers.get("accept") == "application/x-safetensors"
    page.locator("#status").filter(has_text=re.compile("^(Done|Error)")).wait_for(timeout=120_000)
    assert page.locator("#status").inner_text().startswith("Done")
    page.wait_for_function("() => window.explorerTiming", timeout=60_000)
    timing = page.evaluate("() => window.explorerTiming")
    assert timing.pop("format") == "safetensors"  # large answers are read as typed arrays
    print(f"\nL={length}: " + ", ".join(f"{k} {v:.0f}" for k, v in timing.items()))
    canvas = page.locator('figure[data-name="weights"] canvas')
    assert canvas.get_attribute("data-rows") == str(length)
    canvas.focus()
    page.keyboard.press("ArrowDown")  # the tab still answers
    readout = page.locator('figure[data-name="weights"] .cell-readout').inner_text()
    assert readout.startswith("1 → 0: ")
    if length == 512:  # the numbers read from safetensors are the API's
        exact = post_json(server, "attention", sent.value.post_data_json)["weights"][1][0]
        assert float(readout.split(": ")[1]) == pytest.approx(exact, rel=5e-3)
    # the card fits its map (the page does not scroll sideways); zoom in and out, labels drawn
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth + 1")
    figure = page.locator('figure[data-name="weights"]')
    fitted = float(canvas.get_attribute("data-cell") or 0)
    assert int(canvas.get_attribute("data-ox") or 0) > 0
    card, drawn = figure.bounding_box(), canvas.bounding_box()
    assert card is not None and drawn is not None
    assert drawn["x"] + drawn["width"] <= card["x"] + card["width"]  # the map sits in its card
    # "fit" shows the whole map: every row and key in the view, a fraction of a pixel a cell
    assert fitted * length <= drawn["width"] and "the whole map" in figure.inner_text()
    for _ in range(12):  # zoom in until the values are printed in the cells, and pan
        figure.get_by_role("button", name="Zoom in on weights").click()
    closest = float(canvas.get_attribute("data-cell") or 0)
    assert closest >= 40, closest
    assert "drag to pan" in figure.inner_text()
    # the value is printed in the cell: the middle of a cell holds more than its own colour
    assert page.evaluate(CELL_COLOURS) > 2
    canvas.hover()
    page.mouse.wheel(0, 4000)
    top = float(canvas.get_attribute("data-top") or 0)
    left = float(canvas.get_attribute("data-left") or 0)
    assert top > 0  # the wheel moved the view down
    # a click after panning names the cell under the pointer
    ox, oy = int(canvas.get_attribute("data-ox") or 0), int(canvas.get_attribute("data-oy") or 0)
    canvas.click(position={"x": ox + closest * 1.5, "y": oy + closest * 1.5})
    readout = page.locator('figure[data-name="weights"] .cell-readout').inner_text()
    i, j = math.floor(top + 1.5), math.floor(left + 1.5)
    assert readout.startswith(f"{i} → {j}: "), (readout, top, left)
    figure.get_by_role("button", name="Fit weights").click()
    assert float(canvas.get_attribute("data-cell") or 0) == fitted
    assert canvas.get_attribute("data-top") == "0"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"explorer-L{length}.png"))
    # exports of a large map: PNG at most 2048 px a side, whole pixels a cell; no SVG of 4M shapes
    assert figure.get_by_role("button", name="Download weights  softmax as SVG").is_disabled()
    with page.expect_download() as png:
        figure.get_by_role("button", name="Download weights  softmax as PNG").click()
    head = Path(png.value.path()).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert width == height == 2048, (width, height)


# ---- selected queries ------------------------------------------------------------------------


def _picked_rows(page: Any) -> list[tuple[str, float, float]]:
    """The selection table, row by row: (key, sum, average), from the full-precision data-value."""
    rows: list[list[Any]] = page.locator("table.pick-table tbody tr").evaluate_all(
        "trs => trs.map(tr => [tr.querySelector('th').textContent,"
        " ...[...tr.querySelectorAll('td[data-value]')].map(td => +td.dataset.value)])"
    )
    return [(k, s, a) for k, s, a in rows]


def _picked(page: Any) -> dict[str, tuple[float, float]]:
    """The selection table as key -> (sum, average), for keys named once."""
    return {k: (s, a) for k, s, a in _picked_rows(page)}


def test_selected_queries_sum_and_average_their_attention(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    open_explorer(page, server)
    _, data = run_form(page, "attention")
    w = np.array(data["weights"])
    # every query at first: the column sums of the weights
    assert page.input_value("#pick-queries") == "0-2"
    for j, key in enumerate(data["tokens"]):
        s, a = _picked(page)[key]
        assert s == pytest.approx(w[:, j].sum(), abs=1e-12)
        assert a == pytest.approx(w[:, j].mean(), abs=1e-12)
    # two tokens picked by their buttons
    page.click("#pick-none")
    assert page.locator("#pick-result").inner_text().startswith("No query picked")
    page.locator("#pick-chips button", has_text="I").click()
    page.locator("#pick-chips button", has_text="Batman").click()
    assert page.input_value("#pick-queries") == "0 2"
    assert page.locator('#pick-chips button[aria-pressed="true"]').all_inner_texts() == [
        "I",
        "Batman",
    ]
    got = _picked(page)
    for j, key in enumerate(data["tokens"]):
        assert got[key][0] == pytest.approx(w[[0, 2], j].sum(), abs=1e-12)
        assert got[key][1] == pytest.approx(w[[0, 2], j].mean(), abs=1e-12)
    top = data["tokens"][int(np.argmax(w[[0, 2]].sum(axis=0)))]
    assert f"give most attention to {top}:" in page.locator(".pick-summary").inner_text()
    with page.expect_download() as csv:
        page.get_by_role("button", name="Download the selected queries' sums as CSV").click()
    lines = Path(csv.value.path()).read_text().splitlines()
    assert lines[0] == ",sum,average" and lines[1].startswith("I,")
    assert float(lines[1].split(",")[1]) == got["I"][0]
    # a range typed in the box; a query out of range is refused next to the box
    page.fill("#pick-queries", "7")
    page.press("#pick-queries", "Enter")
    assert page.locator("#pick-error").inner_text() == "7: the queries are 0 to 2"
    page.fill("#pick-queries", "1-2")
    page.press("#pick-queries", "Enter")
    assert page.locator("#pick-error").is_hidden()
    assert _picked(page)["I"][0] == pytest.approx(w[1:, 0].sum(), abs=1e-12)
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#pick").screenshot(path=str(ARTIFACTS / "explorer-selected-queries.png"))
    assert outside == []


def test_selected_queries_per_head_and_with_the_sink(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    data = run_example(page, "multihead", "generated")
    page.fill("#pick-queries", "0 2-3")
    page.press("#pick-queries", "Enter")
    average = np.array(data["average_weights"])[[0, 2, 3]].sum(axis=0)
    assert [s for _, s, _ in _picked_rows(page)] == pytest.approx(average, abs=1e-12)
    page.select_option("#pick-source", "1")
    head = np.array(data["heads"][1]["weights"])[[0, 2, 3]]
    assert [a for _, _, a in _picked_rows(page)] == pytest.approx(head.mean(axis=0), abs=1e-12)
    # the sink's share is its own row, beside the keys'
    data = run_example(page, "attention", "sink")
    got = _picked(page)
    assert got["(sink)"][0] == pytest.approx(sum(data["sink_weights"]), abs=1e-12)
    keys = [s for k, s, _ in _picked_rows(page) if k != "(sink)"]
    assert keys == pytest.approx(np.array(data["weights"]).sum(axis=0), abs=1e-12)


@pytest.mark.parametrize("include", ["heads", "weights"])
def test_selected_queries_read_a_head_when_the_average_is_not_asked_for(
    offline_page: tuple[Any, list[str]], server: str, include: str
) -> None:
    """`include` without average_weights: the heads' traces, or the stacked weights [h][L][S]."""
    page, _ = offline_page
    open_explorer(page, server)
    run_example(page, "multihead", "generated")
    page.fill("#extra", json.dumps({"include": [include]}))
    _, data = run_form(page, "multihead")
    assert "average_weights" not in data
    options = page.locator("#pick-source option").evaluate_all("os => os.map(o => o.value)")
    assert options == [str(h) for h in range(data["num_heads"])]
    page.select_option("#pick-source", "1")
    second = np.array(data["heads"][1]["weights"] if include == "heads" else data["weights"][1])
    assert [s for _, s, _ in _picked_rows(page)] == pytest.approx(second.sum(axis=0), abs=1e-12)
