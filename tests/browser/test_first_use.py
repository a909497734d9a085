"""What a new user of the explorer ran into, each in a real browser (Debian's Chromium, driven by
Playwright) against a real server, offline: an answer left drawn after an error, a sentence that
needed d_k, folded cards as tall as open ones, a worked example whose weights sat in "More
fields", a multi-head answer several screens tall, difference maps that named the wrong axes,
and docs pages with no way back to the explorer. (Swagger UI's examples, one number a line:
test_explorer.py, with "Try it out".)"""

import json
import os
from typing import Any

import numpy as np
import pytest

from harness.live import start_server
from service.wire.examples import LLAMA_LAYER
from tests.browser.support import (
    ARTIFACTS,
    compare_mine,
    map_cells,
    open_explorer,
    paste_mine,
    post_json,
    run_example,
    run_form,
)

pytestmark = pytest.mark.e2e

# ---- an error leaves the answer drawn before: marked as stale, its exports off ----------------

# what exports or acts on the answer drawn (each map's and table's own buttons are checked too)
RESULT_CONTROLS = ("#export-json", "#export-safetensors", "#compare", "#pick-all", "#pick-none")


def _is_stale(page: Any) -> bool:
    marked = "stale" in (page.locator("#results").get_attribute("class") or "")
    return marked and page.locator("#stale-note").is_visible()


def test_a_failed_run_marks_the_answer_drawn_before_as_stale(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    open_explorer(page, server)  # I am Batman, drawn
    page.click("#copy-curl")  # a curl command of the request drawn
    assert page.locator("#curl").is_visible() and not _is_stale(page)
    page.fill("#x", "1 0\n0 0 1\n0 1")  # the service refuses it
    _, data = run_form(page, "attention")
    assert data["errors"][0]["field"] == "x"
    assert _is_stale(page)
    assert "This answer is from the previous run" in page.locator("#stale-note").inner_text()
    assert page.locator("#results").is_visible()  # still there to read, dimmed
    for control in RESULT_CONTROLS:
        assert page.locator(control).is_disabled(), control
    weights = page.locator('figure[data-name="weights"]')
    for kind in ("SVG", "PNG", "CSV"):
        assert weights.get_by_role(
            "button", name=f"Download weights  softmax as {kind}"
        ).is_disabled()
    assert page.locator('table.matrix[data-name="output"] caption button').is_disabled()
    assert page.locator("#results button:enabled").count() == 0  # none at all
    assert page.evaluate("() => document.getElementById('results').inert")  # nor its cells
    assert page.locator("#curl").is_hidden()  # the old request's command is gone
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-stale-answer.png"))

    # a Run that succeeds draws a fresh answer: unmarked, everything on again
    page.fill("#x", "1 0\n0 0\n0 1")
    run_form(page, "attention")
    assert not _is_stale(page)
    assert page.locator("#stale-note").is_hidden()
    for control in RESULT_CONTROLS:
        assert page.locator(control).is_enabled(), control
    assert weights.get_by_role("button", name="Download weights  softmax as CSV").is_enabled()
    assert not page.evaluate("() => document.getElementById('results').inert")

    # an error the page finds itself (a number it cannot read) marks it too
    page.fill("#x", "1 0\n0 zero\n0 1")
    page.click("#run")
    page.locator('.field[data-field="x"] .field-error').wait_for()
    assert _is_stale(page)
    assert outside == []


# ---- a sentence with d_model and no d_k ---------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "hint", "d_k"),
    [
        ("attention", "= d_model", 4),
        ("mask", "= d_model", 4),
        ("multihead", "= d_model ÷ heads", 2),
    ],
)
def test_a_sentence_with_d_model_and_no_d_k_is_drawn(
    offline_page: tuple[Any, list[str]], server: str, endpoint: str, hint: str, d_k: int
) -> None:
    """d_k is optional in sentence mode: its box says what a blank one means, a blank one is not
    sent, and the service's default answers (d_model; d_model ÷ heads on /multihead)."""
    page, _ = offline_page
    open_explorer(page, server)
    page.select_option("#endpoint", endpoint)
    page.select_option("#mode", "generated")
    page.select_option("#weight_layout", "in_out")
    page.fill("#tokens", "")
    page.fill("#sentence", "the cat sat down")
    page.fill("#seed", "0")
    page.fill("#d_model", "4")
    page.fill("#d_k", "")
    if endpoint == "mask":
        page.check("#causal")
    assert page.get_attribute("#d_k", "placeholder") == hint
    assert hint in page.locator('.field[data-field="d_k"] label').inner_text()
    body, data = run_form(page, endpoint)
    assert "d_k" not in body and body["d_model"] == 4
    assert "errors" not in data, data
    assert data["d_k"] == d_k
    assert page.locator("#outcome-status").inner_text().startswith("Done")
    key = "average_weights" if endpoint == "multihead" else "weights"
    assert len(map_cells(page, key)) == 16  # the answer is drawn


# ---- a folded card is one header high -----------------------------------------------------------


def test_a_folded_card_is_as_tall_as_its_header(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    run_example(page, "multihead", "generated")  # each head's masked scores, folded
    folded = page.locator("details.collapsed-map")
    assert folded.count() == 2
    tallest = max(
        box["height"]
        for box in page.locator("#heatmaps > figure").evaluate_all(
            "els => els.map(e => e.getBoundingClientRect().toJSON())"
        )
    )
    for n in range(folded.count()):
        card = folded.nth(n)
        header = card.locator(":scope > summary").bounding_box()
        box = card.bounding_box()
        assert header is not None and box is not None
        assert box["height"] <= header["height"] + 16, (box, header)  # its padding and border
    assert tallest > 150  # beside open cards far taller
    folded.first.locator(":scope > summary").click()  # unfolded, it holds its map
    assert folded.first.bounding_box()["height"] > 150


# ---- the LLaMA example's weights in the weight boxes ---------------------------------------------

STATE_DICT = {
    "w_q": "q_proj.weight",
    "w_k": "k_proj.weight",
    "w_v": "v_proj.weight",
    "w_o": "o_proj.weight",
}


def _rows(text: str) -> list[list[float]]:
    return [[float(v) for v in line.split()] for line in text.splitlines() if line.strip()]


def test_the_llama_example_puts_its_state_dict_weights_in_the_weight_boxes(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    run_example(page, "multihead", "llama")
    for box, name in STATE_DICT.items():
        assert page.locator(f"#{box}").is_visible()
        assert _rows(page.input_value(f"#{box}")) == LLAMA_LAYER[name], box
        label = page.locator(f"#{box}-name").inner_text()
        assert label.startswith(name) and "(out_in" in label, label  # PyTorch's layout, named
    assert page.input_value("#weight_names") == "state_dict"
    extra = json.loads(page.input_value("#extra") or "{}")
    assert not set(extra) & set(STATE_DICT.values())  # not in "More fields" any more
    # the request is the example's (the page leaves out only `include`: it draws every step)
    body, data = run_form(page, "multihead")
    example = {k: v for k, v in LLAMA_LAYER.items() if k != "include"}
    assert body["mask"] == {**example["mask"], "alignment": "upper_left"}  # the form's default
    assert {**body, "mask": example["mask"]} == example
    assert data == post_json(server, "multihead", example)
    # an edited box still sends the state dict's name; w_q … w_o again on request
    page.fill("#w_o", "1 0 0 0\n0 1 0 0\n0 0 1 0\n0 0 0 1")
    body, data = run_form(page, "multihead")
    assert body["o_proj.weight"][3] == [0, 0, 0, 1] and "w_o" not in body
    page.select_option("#weight_names", "w")
    assert page.locator("#w_q-name").inner_text().startswith("w_q [d_model × h·d_k]")
    page.select_option("#weight_layout", "out_in")
    assert page.locator("#w_q-name").inner_text().startswith("w_q [h·d_k × d_model] (out_in")


# ---- a multi-head answer: small maps side by side, details folded ---------------------------------

# The LLaMA example's page (4 tokens, two heads) at 1440 × 900, measured before its answer was
# laid out compactly: every map a row or two of its own and every table below the last.
HEIGHT_BEFORE = 5720


@pytest.mark.parametrize("offline_page", [(1440, 900)], indirect=True, ids=["1440"])
def test_a_multihead_answer_is_compact(offline_page: tuple[Any, list[str]], server: str) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    data = run_example(page, "multihead", "llama")
    # the answer's column: the form beside it has grown with the form's own choices (the
    # backward's), which say nothing of how compact the answer is
    height = page.evaluate(
        "() => { const r = document.getElementById('results').getBoundingClientRect();"
        " return Math.round(r.bottom + window.scrollY); }"
    )
    print(f"\nthe LLaMA example's answer ends at {height} px (the page before: {HEIGHT_BEFORE} px)")
    assert height <= 0.45 * HEIGHT_BEFORE, height
    # the heads' weights, their average and the difference of two heads: one row of small maps
    figures = page.locator("#heads-maps figure.heatmap")
    assert figures.count() == 4
    tops = {round(box["y"]) for box in figures.evaluate_all(
        "els => els.map(e => e.getBoundingClientRect().toJSON())"
    )}  # fmt: skip
    assert len(tops) == 1, tops
    # each head's maps side by side, its masked scores folded
    scaled = [page.locator(f'figure[data-name="head{h}_scaled_scores"]') for h in (0, 1)]
    first, second = (s.bounding_box() for s in scaled)
    assert first is not None and second is not None and first["y"] == second["y"]
    # each head's tables (Q, K, V, RoPE) folded together, still there to unfold
    folds = page.locator("details.head-tables")
    assert folds.count() == len(data["heads"])
    assert all(folds.nth(h).get_attribute("open") is None for h in range(folds.count()))
    q = page.locator('table.matrix[data-name="head1_q"]')
    assert q.count() == 1 and q.is_hidden()
    folds.nth(1).locator(":scope > summary").click()
    assert q.is_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-multihead-compact.png"), full_page=True)


# ---- difference maps name the axes of what they compare -------------------------------------------


def _axes(page: Any, name: str) -> str:
    label = page.locator(f'figure.diff[data-name="diff_{name}"] text.axis-name')
    return " ".join((label.text_content() or "").split())


def test_difference_maps_name_the_axes_of_the_array_compared(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)  # I am Batman: 3 tokens, 2 features
    _, data = run_form(page, "attention")
    paste_mine(page, "q", json.dumps(data["q"]))
    paste_mine(page, "k", json.dumps(data["k"]))
    paste_mine(page, "weights", json.dumps(data["weights"]))
    paste_mine(page, "output", json.dumps((np.array(data["output"]) + 0.1).tolist()))
    _, got = compare_mine(page, "attention")
    assert got["first_mismatch"] == "output"
    assert _axes(page, "output") == "queries ↓ features →"
    assert _axes(page, "q") == "queries ↓ features →"
    assert _axes(page, "k") == "keys ↓ features →"
    assert _axes(page, "weights") == "queries ↓ keys →"
    assert _axes(page, "output") != _axes(page, "weights")


# ---- the docs pages link back to the explorer -----------------------------------------------------


@pytest.mark.parametrize("docs", ["/docs", "/redoc"])
def test_the_docs_pages_link_back_to_the_explorer(
    offline_page: tuple[Any, list[str]], server: str, docs: str
) -> None:
    page, outside = offline_page
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.goto(server + docs)
    link = page.get_by_role("link", name="← Attention explorer")
    link.wait_for(timeout=20_000)
    assert link.is_visible()
    box = link.bounding_box()
    assert box is not None and box["y"] < 100  # at the top
    link.click()
    page.locator("body[data-ready=true]").wait_for(timeout=20_000)  # the explorer, drawn
    assert page.url == server + "/"
    assert outside == []
    assert console == [], f"console errors: {console}"  # the CSP refuses nothing


def test_the_docs_link_back_under_a_root_path(browser: Any) -> None:
    """Served under ATTENTION_ROOT_PATH (behind a proxy), the link goes to the prefix's "/"."""
    proc, base = start_server(env={**os.environ, "ATTENTION_ROOT_PATH": "/attention-api"})
    try:
        context = browser.new_context()
        page = context.new_page()
        for docs in ("/docs", "/redoc"):
            page.goto(f"{base}/attention-api{docs}")
            link = page.get_by_role("link", name="← Attention explorer")
            link.wait_for(timeout=20_000)
            assert link.get_attribute("href") == "/attention-api/"
            link.click()
            page.locator("body[data-ready=true]").wait_for(timeout=20_000)
            assert page.url == f"{base}/attention-api/"
        context.close()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
