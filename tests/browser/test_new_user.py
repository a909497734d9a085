"""What a new user ran into on the explorer (issue 39, "Tried as a new user would"), each in a
real browser (Debian's Chromium, driven by Playwright) against a real server, offline:
`check_decode`'s answer shown nowhere, a decode step's cache columns all labelled "cache…", a
one-head layer's difference of head 0 with itself, the LLaMA example's weight layout control
contradicting its boxes, and "1 decimals" or "All 1 compared array match" in the page's words."""

import json
from typing import Any

import numpy as np
import pytest

from service.wire.examples import LLAMA_LAYER
from tests.browser.support import (
    compare_mine,
    js_number,
    open_explorer,
    paste_mine,
    run_example,
    run_form,
)

pytestmark = pytest.mark.e2e

# a cache of 2 tokens for the LLaMA example's one key/value head of d_k = 2: [h_kv][P][d_k]
PAST = {"k": [[[0.5, -1.0], [1.0, 0.25]]], "v": [[[1.0, 0.0], [-0.5, 2.0]]]}


def _with_extra(page: Any, **more: Any) -> None:
    """Merge ``more`` into the form's "More fields" (None removes a field)."""
    extra = json.loads(page.input_value("#extra") or "{}")
    extra.update(more)
    page.fill("#extra", json.dumps({k: v for k, v in extra.items() if v is not None}))


# ---- check_decode: its verdict and the numbers it compared ---------------------------------------


def test_check_decode_says_whether_a_token_at_a_time_gives_the_prefill(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    open_explorer(page, server)
    run_example(page, "multihead", "llama")  # causal, RoPE, GQA; decimals 4
    box = page.locator("#decode-check")
    assert box.is_hidden()  # nothing asked, nothing shown
    _with_extra(page, check_decode=True)
    body, data = run_form(page, "multihead")
    assert body["check_decode"] is True and body["decimals"] == 4
    check = data["decode_check"]
    assert check == {"max_abs_diff": 0.0, "steps": 4}
    assert box.is_visible()
    verdict = box.locator(".verdict")
    assert "ok" in (verdict.get_attribute("class") or "")
    assert verdict.inner_text().startswith("✓")
    assert "4 decimals" in verdict.inner_text()  # the answer is rounded: it says to what
    numbers = box.locator("dl").inner_text()
    assert "4" in numbers and "0" in numbers
    assert box.locator('[data-value="steps"]').inner_text() == "4"
    assert box.locator('[data-value="max_abs_diff"]').inner_text() == "0"
    # at full precision: float rounding, said with the number
    _with_extra(page, decimals=None)
    _, data = run_form(page, "multihead")
    diff = data["decode_check"]["max_abs_diff"]
    assert diff < 1e-12
    assert box.locator(".verdict.ok").count() == 1
    shown = box.locator('[data-value="max_abs_diff"]').inner_text()
    assert shown == js_number(diff, 3, True)
    # without its causal mask the prefill lets each token see the later ones: a difference
    page.uncheck("#causal")
    _, data = run_form(page, "multihead")
    diff = data["decode_check"]["max_abs_diff"]
    assert diff > 1e-3
    verdict = box.locator(".verdict")
    assert "bad" in (verdict.get_attribute("class") or "")
    text = verdict.inner_text()
    assert text.startswith("✗") and "causal" in text
    assert box.locator('[data-value="max_abs_diff"]').inner_text() == js_number(diff, 3, True)
    # a plain Run afterwards hides it again
    _with_extra(page, check_decode=None)
    run_form(page, "multihead")
    assert box.is_hidden()
    assert outside == []


# ---- a decode step: the cache's columns named one by one ----------------------------------------


def _column_labels(page: Any, name: str) -> list[str]:
    """The column labels as drawn (an abbreviated one has its whole text in a <title>)."""
    labels: list[str] = page.locator(f'figure[data-name="{name}"] text.col-label').evaluate_all(
        "els => els.map(e => e.firstChild.nodeValue)"
    )
    return labels


def test_a_decode_steps_cache_columns_are_named_by_their_index(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    run_example(page, "multihead", "llama")
    _with_extra(page, past=PAST)
    _, data = run_form(page, "multihead")
    assert data["context_tokens"] == ["cache 0", "cache 1", *LLAMA_LAYER["tokens"]]
    for name in ("head0_weights", "head1_scaled_scores", "mask"):
        assert _column_labels(page, name) == data["context_tokens"], name
    # without tokens the cache is still named, then the new tokens as their rows are
    page.fill("#tokens", "")
    _, data = run_form(page, "multihead")
    assert data.get("context_tokens") is None
    assert _column_labels(page, "head0_weights") == ["cache 0", "cache 1", "0", "1", "2", "3"]


# ---- one head: no difference of a head with itself --------------------------------------------


def test_one_head_offers_no_difference_of_heads(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    run_example(page, "multihead", "generated")
    assert page.locator('figure[data-name="heads_diff"]').count() == 1
    page.fill("#num_heads", "1")
    _, data = run_form(page, "multihead")
    assert len(data["heads"]) == 1
    assert page.locator("#heads").is_visible()
    assert page.locator('figure[data-name="heads_diff"]').count() == 0
    assert page.locator("#diff-a").is_hidden() and page.locator("#diff-b").is_hidden()
    assert "head 0 − head 0" not in page.locator("#heads").inner_text()
    # two heads again: the difference is back
    page.fill("#num_heads", "2")
    run_form(page, "multihead")
    assert page.locator("#diff-a").is_visible()
    caption = page.locator('figure[data-name="heads_diff"] figcaption').inner_text()
    assert caption.startswith("weights: head 0 − head 1")


# ---- the LLaMA example's weight layout ------------------------------------------------------------


def test_the_weight_layout_control_shows_the_state_dicts_out_in(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)  # I am Batman: out_in
    page.select_option("#endpoint", "multihead")
    page.select_option("#weight_layout", "in_out")
    run_example(page, "multihead", "llama")
    assert page.input_value("#weight_names") == "state_dict"
    assert "(out_in" in page.locator("#w_q-name").inner_text()
    assert page.input_value("#weight_layout") == "out_in"  # what the boxes say
    assert page.locator("#weight_layout").is_disabled()  # a state dict is always out_in
    # the request is still the example's: the control sends nothing of its own
    body, _ = run_form(page, "multihead")
    assert "weight_layout" not in body
    # w_q … w_o names again: the layout is the user's to choose, as it was
    page.select_option("#weight_names", "w")
    assert page.locator("#weight_layout").is_enabled()
    assert page.input_value("#weight_layout") == "in_out"
    assert "(in_out" in page.locator("#w_q-name").inner_text()


# ---- the page's words: one decimal, one number, the compared array ------------------------------


def test_counts_of_one_read_in_the_singular(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    words = page.evaluate(
        """async () => {
          const { count, plural } = await import("./static/lib/format.js");
          return [count(1, "decimal"), count(2, "decimal"), count(0, "query", "queries"),
                  count(1, "query", "queries"), plural(1, "has", "have"), plural(3, "has", "have")];
        }"""
    )
    assert words == ["1 decimal", "2 decimals", "0 queries", "1 query", "has", "have"]
    # a row one number short
    _, data = run_form(page, "attention")
    paste_mine(page, "weights", "0.1 0.2 0.3\n0.4\n0.6 0.7 0.8")
    page.click("#compare")
    error = page.locator('details.my-numbers[data-name="weights"] .box-error')
    error.wait_for()
    assert error.inner_text() == "Can't read your weights: row 1 has 1 number but row 0 has 3"
    # one array, printed with one decimal
    printed = "\n".join(" ".join(f"{v:.1f}" for v in row) for row in data["weights"])
    paste_mine(page, "weights", printed)
    _, got = compare_mine(page, "attention")
    assert got["comparison"][0]["printed"] == {"decimals": 1}
    assert got["first_mismatch"] is None
    verdict = page.locator("#comparison .verdict.ok").inner_text()
    assert verdict == "✓ The compared array matches (the 1 decimal you printed)."
    item = page.locator('#comparison ol.compared li[data-name="weights"]').inner_text()
    assert "agrees to the 1 decimal you printed" in item
    assert "used: the 1 decimal you printed (weights)" in page.locator("#tol-used").inner_text()
    # two arrays: the plural
    paste_mine(page, "output", json.dumps(np.array(data["output"]).tolist()))
    compare_mine(page, "attention")
    verdict = page.locator("#comparison .verdict.ok").inner_text()
    assert verdict.startswith("✓ All 2 compared arrays match")


def test_a_cells_explanation_says_one_decimal(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    open_explorer(page, server)
    _with_extra(page, decimals=1)
    run_form(page, "attention")
    page.locator('figure[data-name="weights"] rect.cell[data-row="2"][data-col="0"]').click()
    total = page.locator("#explain .explain-total").inner_text()
    assert "(the service, rounded to 1 decimal:" in total, total
