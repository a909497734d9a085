"""The explorer's trained-model tab at paragraph length (issue 43): a 109-word paragraph, 126
MiniLM tokens, in a real Chromium at 1440 × 900 against a real server. Run asks POST /model for
what the model view draws only, as safetensors (under 10 MB on the wire); the page stays within
three screens; the 72 small maps are drawn at device pixels and are visibly not blank; the
summary names the heads that matter in at most 20 lines; a layer opened fetches its trace (and
its weights) and shows BertViz's head view of all its heads."""

import itertools
import re
import time
from typing import Any

import pytest

from tests.browser.support import ARTIFACTS, open_explorer, post_json, wait_idle

pytestmark = pytest.mark.e2e

# 109 words, 126 tokens with [CLS] and [SEP]
PARAGRAPH = (
    "Once upon a time, in a small village by the sea, there lived an old fisherman who went out "
    "every morning before sunrise. He knew the winds and the tides better than anyone, and the "
    "children of the village loved to hear his stories about storms, strange fish and distant "
    "islands. One winter the sea froze near the harbour, and nobody could sail for weeks. The "
    "fisherman spent those days mending nets and teaching the children how to tie knots. When "
    "spring finally came, the whole village gathered on the shore to watch his boat leave again, "
    "and they cheered, as it disappeared into the grey, misty morning air."
)
FIRST = ["model", "tokens", "attention", "head_roles", "rollout"]
SAFETENSORS = "application/x-safetensors"
SCREENS = 3 * 900  # the page's height before anything is opened, at 1440 × 900
MOST_BYTES = 10_000_000

# Each small map's canvas: its backing store against its CSS size and the device pixel ratio,
# and the share of its pixels at least a quarter of the way from white to the darkest colour.
THUMBS = """els => els.map(c => {
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let dark = 0;
  for (let k = 0; k < px.length; k += 4)
    if (255 - Math.min(px[k], px[k + 1], px[k + 2]) >= 64) dark++;
  return {width: c.width, css: c.getBoundingClientRect().width, dpr: devicePixelRatio,
          dark: dark / (px.length / 4), norm: c.dataset.norm};
})"""
# whether an SVG element is drawn: neither it nor a group around it is display: none
SHOWN = """e => { for (let n = e; n && n.tagName !== 'svg'; n = n.parentNode)
  if (getComputedStyle(n).display === 'none') return false; return true; }"""


def _is_model_post(r: Any) -> bool:
    return bool(r.url.endswith("/model") and r.request.method == "POST")


def run_paragraph(page: Any, server: str) -> tuple[list[Any], float]:
    """Open the model tab, type the paragraph and Run; return every response the page got
    from Run until the answer was drawn, and the seconds from the click to drawn."""
    open_explorer(page, server)
    page.click("#tab-model")
    page.locator("#model-form[data-ready=true]").wait_for(timeout=20_000)
    page.locator("#model-results:not([hidden])").wait_for(timeout=60_000)
    wait_idle(page)
    page.fill("#model-text", PARAGRAPH)
    got: list[Any] = []
    listen = lambda r: got.append(r)  # noqa: E731 (Playwright needs a function of its own)
    page.on("requestfinished", listen)
    started = time.monotonic()
    page.click("#model-run")
    page.locator("#model-status").filter(has_text=re.compile("^(Done|Error)")).wait_for(
        timeout=60_000
    )
    wait_idle(page)
    took = time.monotonic() - started
    page.remove_listener("requestfinished", listen)
    return got, took


def wire_bytes(requests: list[Any]) -> int:
    """The bytes of the answers on the wire (headers and bodies)."""
    return sum(r.sizes()["responseBodySize"] + r.sizes()["responseHeadersSize"] for r in requests)


@pytest.mark.parametrize("offline_page", [(1440, 900)], indirect=True, ids=["1440x900"])
def test_a_paragraph_asks_for_the_model_view_as_safetensors_and_fits_three_screens(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    requests, took = run_paragraph(page, server)
    posts = [r for r in requests if r.url.endswith("/model") and r.method == "POST"]
    # one request: what the model view draws, as safetensors, without the trace
    assert len(posts) == 1
    request = posts[0]
    assert request.post_data_json == {"model": "minilm", "text": PARAGRAPH, "include": FIRST}
    assert request.headers["accept"] == SAFETENSORS
    assert request.response().headers["content-type"].startswith(SAFETENSORS)
    sent = wire_bytes(requests)
    assert sent <= MOST_BYTES, sent
    assert page.locator("#model-tokens .token").count() == 126
    assert page.locator("#results").is_hidden()  # no trace drawn until a layer is opened
    assert page.locator("#model-head").is_hidden()

    height = page.evaluate("document.documentElement.scrollHeight")
    assert height <= SCREENS, height

    # the 72 small maps at device pixels, each row normalised at first: ≥ 90 % visibly not blank
    thumbs = page.locator("#model-grid canvas").evaluate_all(THUMBS)
    assert len(thumbs) == 72
    for t in thumbs:
        assert t["width"] == round(t["css"] * t["dpr"]) and t["width"] > 40, t
        assert t["norm"] == "row"
    seen = sum(t["dark"] >= 0.01 for t in thumbs)
    assert seen >= 0.9 * 72, sorted(t["dark"] for t in thumbs)
    assert page.locator('input[name="model-norm"][value="row"]').is_checked()
    assert (
        "each query row divided by its own largest weight"
        in page.locator("#model-norm-says").text_content()
    )
    # each head normalised: redrawn, and the page says what the colours then mean
    page.check('input[name="model-norm"][value="head"]')
    page.wait_for_function(
        "() => [...document.querySelectorAll('#model-grid canvas')]"
        ".every(c => c.dataset.norm === 'head')"
    )
    assert (
        "each head divided by its own largest weight"
        in page.locator("#model-norm-says").text_content()
    )
    by_head = page.locator("#model-grid canvas").evaluate_all(THUMBS)
    assert sum(t["dark"] for t in by_head) < sum(t["dark"] for t in thumbs)

    # the summary: at most 20 lines; every role the service found, with its heads
    lines = page.locator("#model-summary li").all_text_contents()
    assert 3 <= len(lines) <= 20
    roles = post_json(
        server, "model", {"model": "minilm", "text": PARAGRAPH, "include": ["head_roles"]}
    )["head_roles"]
    prev = [f"L{a} H{h}" for a, row in enumerate(roles) for h, r in enumerate(row)
            if r["role"] == "previous_token"]  # fmt: skip
    assert prev, "MiniLM has a previous-token head on this paragraph"
    said = next(line for line in lines if line.startswith("previous-token heads"))
    assert all(f"{head} (" in said for head in prev[:8])
    assert any(" → " in line for line in lines)  # the strongest links
    page.screenshot(path=str(ARTIFACTS / "explorer-model-paragraph.png"), full_page=True)
    print(f"paragraph: {sent} bytes, page {height} px, click to drawn {took:.2f} s")
    assert outside == []


@pytest.mark.parametrize("offline_page", [(1440, 900, 2)], indirect=True, ids=["1440x900@2x"])
def test_a_layer_opens_with_its_trace_and_the_head_view_of_all_its_heads(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    run_paragraph(page, server)
    thumb = page.locator("#model-grid canvas").first.evaluate(
        "c => [c.width, c.getBoundingClientRect().width]"
    )
    assert thumb[0] == round(thumb[1] * 2)  # twice the CSS pixels on a 2× screen

    layer, head = 2, 9
    got: list[Any] = []
    listen = lambda r: got.append(r)  # noqa: E731
    page.on("requestfinished", listen)
    started = time.monotonic()
    with page.expect_response(_is_model_post) as info:
        page.click(f'#model-grid button.head-cell[data-layer="{layer}"][data-head="{head}"]')
    # the head view is drawn at once from the weights already here
    box = page.locator(f'#model-head[data-layer="{layer}"][data-head="{head}"]')
    box.wait_for()
    request = info.value.request
    assert request.headers["accept"] == SAFETENSORS
    body = request.post_data_json
    assert {k: body[k] for k in ("model", "text", "layer")} == {
        "model": "minilm",
        "text": PARAGRAPH,
        "layer": layer,
    }
    assert body["include"][0] == "trace" and set(body["include"]) <= {"trace", "layer_weights"}
    page.locator("#model-trace-heading", has_text=f"Layer {layer}, step by step").wait_for(
        timeout=60_000
    )
    wait_idle(page)
    took = time.monotonic() - started
    page.remove_listener("requestfinished", listen)
    assert wire_bytes(got) <= 2 * MOST_BYTES
    assert page.locator("#heads-grid figure.heatmap").count() >= 12  # the trace, drawn

    # the head view: a toggle a head, head 9's lines shown at first, a colour a head
    toggles = box.locator(".head-toggle")
    assert toggles.count() == 12
    assert box.locator('.head-toggle[aria-pressed="true"]').evaluate_all(
        "els => els.map(e => +e.dataset.head)"
    ) == [head]
    w = post_json(
        server, "model", {"model": "minilm", "text": PARAGRAPH, "include": ["attention"]}
    )["attention"][layer]
    lines = box.locator("svg.head-lines g.head line").evaluate_all(
        "els => els.map(e => [+e.closest('g.head').dataset.head, +e.dataset.i, +e.dataset.j,"
        " +e.getAttribute('stroke-opacity')])"
    )
    assert {h for h, *_ in lines} == {head}
    L = 126
    assert {(i, j) for _, i, j, _ in lines} == {
        (i, j) for i in range(L) for j in range(L) if w[head][i][j] >= 0.01
    }
    for _, i, j, opacity in lines:
        assert opacity == w[head][i][j]
    page.click("#model-head .head-all")
    colours = box.locator("svg.head-lines g.head").evaluate_all(
        "els => els.map(e => [+e.dataset.head, e.getAttribute('stroke')])"
    )
    assert sorted(h for h, _ in colours) == list(range(12))
    assert len({c for _, c in colours}) == 12
    box.locator('.head-toggle[data-head="3"]').click()  # off again
    assert box.locator('svg.head-lines g.head[data-head="3"]').evaluate(SHOWN) is False

    # legible at 126 tokens: the tokens' labels do not overlap, the column scrolls
    tops = box.locator("svg.head-lines g.tok.q text").evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.top, r.bottom]; })"
    )
    assert len(tops) == L
    assert all(b[0] >= a[1] - 0.5 for a, b in itertools.pairwise(tops))
    assert all(b - a >= 10 for a, b in tops)  # at least 10 px a label
    # hovering a query shows only its lines, in every head shown, and says where each looks
    q = 85
    box.locator(f'svg.head-lines g.tok.q[data-i="{q}"]').hover()
    visible = box.locator("svg.head-lines line").evaluate_all(
        f"els => els.filter({SHOWN}).map(e => [+e.closest('g.head').dataset.head, +e.dataset.i])"
    )
    assert {i for _, i in visible} == {q}
    assert {h for h, _ in visible} <= set(range(12)) - {3} and len({h for h, _ in visible}) >= 8
    said = box.locator("figure.head-view .cell-readout").text_content()
    tokens = page.locator("#model-tokens .token").all_text_contents()
    top = max(range(L), key=lambda j: w[head][q][j])
    assert said.startswith(f"query {q} “{tokens[q]}” attends most to: ")
    assert f"head {head} “{tokens[top]}”" in said

    # a cell of the head's large map explains itself from the trace
    page.locator('figure[data-name="model_head"] canvas').focus()
    page.keyboard.press("Enter")
    panel = page.locator("#explain")
    panel.locator(".explain-total").wait_for()
    assert panel.locator(".explain-mismatch").count() == 0
    page.click("#explain-close")
    box.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "explorer-model-layer.png"))
    print(f"layer {layer}: {wire_bytes(got)} bytes, click to drawn {took:.2f} s")
    assert outside == []
