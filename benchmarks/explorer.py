"""E1/E2/E3 of `make bench`: the explorer page drawing a large answer, in Debian's Chromium.

In one page, runs alternate between two sides on the same request (a generated sentence of L
tokens, ``include: ["weights"]``, the explorer's own path for L ≥ 512: the answer as
safetensors):
- the page: the form's Run, from the click to the first paint after the weights map is drawn
  (``window.explorerTiming.first_paint_ms``, set by run.js);
- the floor: the same POST by ``fetch``, the page's own safetensors reader (lib/safetensors.js) and
  the next frame, measured as the page's first paint is: the numbers in JavaScript arrays and a
  frame painted with nothing new drawn.
E1 and E2 are page ÷ floor (medians) at L = 2048 and 512. E3 is the JavaScript heap the drawn
L = 2048 page holds (after a garbage collection) ÷ the weights' bytes as float64: what the
nested arrays, the map's picture and the page cost per byte of answer.
"""

import json
import statistics
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--enable-precise-memory-info", "--js-flags=--expose-gc"]  # fmt: skip

FLOOR = """async (body) => {
  const { readSafetensors } = await import('/static/lib/safetensors.js');
  const t0 = performance.now();
  const r = await fetch('attention', {method: 'POST', body: JSON.stringify(body),
    headers: {'Content-Type': 'application/json', Accept: 'application/x-safetensors'}});
  const data = readSafetensors(await r.arrayBuffer());
  if (data.weights.length !== body.seq_len) throw new Error('wrong answer');
  await new Promise((done) => requestAnimationFrame(() => setTimeout(done, 0))); // a frame, as the page's
  return performance.now() - t0;
}"""

# The heap after full collections: a detached DOM tree (the answer drawn before) goes only after
# a second one (DOM and JavaScript objects are collected in turns)
HEAP = """async () => {
  for (let k = 0; k < 4; k++) { gc(); await new Promise((done) => setTimeout(done, 50)); }
  return performance.memory.usedJSHeapSize;
}"""


def _form(page: Any, length: int) -> dict[str, Any]:
    """Fill the form for a generated sentence of ``length`` tokens; return the body it sends."""
    page.select_option("#mode", "generated")
    page.fill("#tokens", "")
    for field, value in (("#seed", "0"), ("#d_model", "16"), ("#d_k", "16")):
        page.fill(field, value)
    page.fill("#extra", json.dumps({"seq_len": length, "include": ["weights"]}))
    body: dict[str, Any] = page.evaluate(
        "async () => (await import('/static/request.js')).buildBody()"
    )
    return body


def _page_run(page: Any) -> float:
    """One Run through the form: ms from the click to the first paint of the drawn answer."""
    page.evaluate("() => { window.explorerTiming = null; }")
    page.locator("body:not([data-busy])").wait_for(state="attached", timeout=120_000)
    page.click("#run")
    page.wait_for_function("() => window.explorerTiming", timeout=120_000)
    assert page.locator("#status").inner_text().startswith("Done"), page.locator(
        "#status"
    ).inner_text()
    return float(page.evaluate("() => window.explorerTiming.first_paint_ms"))


def measure(base: str, runs: int) -> dict[str, Any]:
    """{L: (page ms, floor ms)} medians for L = 2048 and 512, and E3's heap and weights bytes."""
    from playwright.sync_api import sync_playwright

    out: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(base + "/")
            page.locator("body[data-ready=true]").wait_for(timeout=30_000)
            for length in (2048, 512):
                body = _form(page, length)
                _page_run(page)  # warm: modules, JIT, the server's first large answer
                sides: dict[str, list[float]] = {"page": [], "floor": []}
                for _ in range(runs):
                    sides["page"].append(_page_run(page))
                    sides["floor"].append(float(page.evaluate(FLOOR, body)))
                out[str(length)] = {k: statistics.median(v) for k, v in sides.items()}
                if length == 2048:  # the drawn page, as a user leaves it
                    out["heap"] = int(page.evaluate(HEAP))
                    out["weights_bytes"] = length * length * 8
        finally:
            browser.close()
    return out
