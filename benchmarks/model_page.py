"""E4–E9 of `make bench`: the explorer's trained-model tab at paragraph length (issue 43's
"Measured"), in Debian's Chromium through Playwright, against the server run.py started (one
uvicorn worker on this machine: server and browser share its CPUs).

The page (1440 × 900, the model tab) runs :data:`PARAGRAPH`, an ordinary English paragraph of 109
words that all-MiniLM-L6-v2's tokenizer makes 126 tokens ([CLS] and [SEP] counted), once to warm
up and then :data:`RUNS` times:

- **drawn**: the page marked itself busy after the click (``body[data-busy]``, set by the model
  mode's Run) and idle again, its status reads "Done", a frame has been painted after that (a
  ``requestAnimationFrame``, then a task: as E1's first paint), and the thumbnails' pixels no
  longer change (read on each frame until three frames in a row agree; a later change moves
  "drawn" to the frame that showed it). The clock starts in the click's own event handler;
- **E4** bytes on the wire from the click to drawn: Chromium's ``Network.loadingFinished``
  ``encodedDataLength`` (headers and body as received, before decompression) summed over every
  request the page starts after the click and before drawn (requests still in flight at drawn
  are waited for and counted); data: and blob: URLs are not on the wire and are left out;
- **E5** click to drawn, median of the runs (the best in the detail);
- **E6** the page's height in screens before anything is opened: ``scrollHeight`` ÷ 900;
- **E7** the share of thumbnails visibly non-blank: each thumbnail canvas drawn over white (the
  page's background) into a scratch canvas and its pixels read; its background is its most
  frequent colour; a pixel differs visibly when one of its channels is :data:`VISIBLE` or more
  (of 255) away from it; a thumbnail is non-blank when :data:`NON_BLANK` of its pixels or more
  differ visibly;
- **E8** the summary's lines (the elements of :data:`SELECTORS` ``summary_line`` shown);
- **E9** compare present and answering on the model tab (1 yes, 0 no): layer LAYER opened, its
  :data:`COMPARE_OUTPUT` as the service computes it pasted into its "Compare with my numbers"
  box, Compare clicked; yes when the page posts to /model and its compare status reads
  "Compared".

Every selector the measurement needs is in :data:`SELECTORS`. A row whose selector finds
nothing says "not measurable: <why>" instead of failing (value and met null).
"""

import json
import statistics
import time
import urllib.request
from collections.abc import Callable
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
WIDTH, HEIGHT = 1440, 900  # the viewport
RUNS = 3
TIMEOUT_MS = 120_000

# The page as it is on this branch; adjust here when the page changes.
SELECTORS = {
    "tab": "#tab-model",  # the trained-model tab
    "form_ready": "#model-form[data-ready=true]",  # the tab's form, models listed
    "text": "#model-text",  # the sentence box
    "run": "#model-run",  # its Run button
    "status": "#model-status",  # "Done in … ms." / "Error …"
    "busy": "body[data-busy]",  # set while a Run is under way
    "thumbnail": "#model-grid canvas",  # one small map per layer × head
    "summary": "#model-summary",  # the summary of the heads that matter (absent: not measurable)
    "summary_line": "#model-summary > li",  # one line of it
    "open_layer": '#model-grid button.layer-label[data-layer="{layer}"]',  # opens a layer
    "trace_heading": "#model-trace-heading",  # "Layer ℓ, step by step" once its trace is drawn
    "compare_box": 'details.my-numbers[data-name="{name}"]',  # a "Compare with my numbers" box
    "compare_text": "textarea",  # inside the box
    "compare": "#compare",  # the Compare button (the box's own when this one is hidden)
    "compare_here": ".compare-here",  # the box's own Compare button
    "compare_status": "#compare-status",  # "Compared …" / "Error …"
}
DONE = "Done"  # how the status starts when the Run was answered and drawn
COMPARED = "Compared"  # how the compare status starts when the comparison was drawn
COMPARE_OUTPUT = "output"  # the trace's output pasted for E9 (the layer's [L][d_model])

PARAGRAPH = (
    "On Saturday morning the market square fills up long before the church bells ring. Farmers "
    "arrive in vans and set out crates of plums, potatoes and fresh eggs on folding tables. A "
    "baker sells warm bread from a cart, and the smell reaches the bus stop across the road. "
    "Children run between the stalls while their parents compare prices and talk about the "
    "weather. By ten o'clock the cafe on the corner has no empty chairs left, so people drink "
    "their coffee standing outside. Around noon the traders start packing up, and an old man "
    "sweeps the leaves and paper from the cobblestones until the square is quiet again."
)
WORDS, TOKENS, MODEL, LAYER = 109, 126, "minilm", 0

VISIBLE = 32  # of 255 in one channel: a pixel visibly not the background
NON_BLANK = 0.02  # share of a thumbnail's pixels that must differ visibly

WHAT = {
    "E4": "model tab, 126 tokens: MB on the wire from Run to drawn",
    "E5": "model tab, 126 tokens: seconds from Run to drawn (median)",
    "E6": "model tab, 126 tokens: page height in screens (÷ 900 px) before opening anything",
    "E7": "model tab, 126 tokens: share of thumbnails visibly non-blank",
    "E8": "model tab, 126 tokens: summary lines",
    "E9": "model tab, 126 tokens: compare present and answering (1 yes, 0 no)",
}
TARGETS: dict[str, tuple[str, float]] = {
    "E4": ("≤", 10.0), "E5": ("≤", 1.5), "E6": ("≤", 3.0),
    "E7": ("≥", 0.9), "E8": ("≤", 20.0), "E9": ("≥", 1.0),
}  # fmt: skip
IDS = list(WHAT)

# Before the click: the click's time, and a promise kept when the page has been busy and is idle.
ARM = """(busy) => {
  const s = { t0: null, sawBusy: false, tIdle: null };
  s.idle = new Promise((resolve) => {
    const watch = new MutationObserver(() => {
      if (document.querySelector(busy)) s.sawBusy = true;
      else if (s.sawBusy) { s.tIdle = performance.now(); watch.disconnect(); resolve(); }
    });
    watch.observe(document.body, { attributes: true });
  });
  window.__pageBench = s;
}"""

CLICKED = """(run) => { const b = document.querySelector(run);
  b.addEventListener('click', () => { window.__pageBench.t0 = performance.now(); },
                     { capture: true, once: true }); }"""

# A thumbnail's pixels over white; a signature of them; and E7's count of those differing.
PIXELS = """
const pixelsOf = (el) => {
  const w = el.width || el.naturalWidth || 1, h = el.height || el.naturalHeight || 1;
  const c = document.createElement('canvas'); c.width = w; c.height = h;
  const ctx = c.getContext('2d', { willReadFrequently: true });
  ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, w, h); ctx.drawImage(el, 0, 0);
  return ctx.getImageData(0, 0, w, h).data;
};
const signature = (sel) => [...document.querySelectorAll(sel)].map((el) => {
  const d = pixelsOf(el); let s = d.length;
  for (let k = 0; k < d.length; k += 4) s = (s * 31 + d[k] + 7 * d[k + 1] + 13 * d[k + 2]) | 0;
  return s; }).join(',');
"""

DRAWN = (
    """async ([sel, timeout]) => {
  const s = window.__pageBench;
  const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
  const late = new Promise((_, no) => setTimeout(() => no(new Error('timeout')), timeout));
  try { await Promise.race([s.idle, late]); }
  catch { return { why: s.sawBusy ? 'the page stayed busy' : 'the page never marked itself busy ('
                   + sel.busy + ')', t0: s.t0 }; }
  const status = (document.querySelector(sel.status) || { textContent: '' }).textContent;
  await frame();
  let drawn = performance.now();"""
    + PIXELS
    + """
  let last = signature(sel.thumbnail), same = 0;
  const until = performance.now() + 5000;
  while (same < 3 && performance.now() < until) {
    await frame();
    const now = signature(sel.thumbnail);
    if (now === last) same += 1; else { same = 0; last = now; drawn = performance.now(); }
  }
  return { ms: drawn - s.t0, idle_ms: s.tIdle - s.t0, status, settled: same >= 3, t0: s.t0 };
}"""
)

BLANKS = (
    """([sel, visible]) => {"""
    + PIXELS
    + """
  return [...document.querySelectorAll(sel)].map((el) => {
    const d = pixelsOf(el), n = d.length / 4, counts = new Map();
    for (let k = 0; k < d.length; k += 4) {
      const c = (d[k] << 16) | (d[k + 1] << 8) | d[k + 2];
      counts.set(c, (counts.get(c) || 0) + 1);
    }
    let bg = 0, most = -1;
    for (const [c, m] of counts) if (m > most) { bg = c; most = m; }
    const [r, g, b] = [(bg >> 16) & 255, (bg >> 8) & 255, bg & 255];
    let off = 0;
    for (let k = 0; k < d.length; k += 4)
      if (Math.max(Math.abs(d[k] - r), Math.abs(d[k + 1] - g), Math.abs(d[k + 2] - b)) >= visible)
        off += 1;
    return off / n;
  });
}"""
)

SHOWN_COUNT = """(sel) => [...document.querySelectorAll(sel)].filter(
  (e) => e.checkVisibility ? e.checkVisibility() : e.offsetParent !== null).length"""

# Open every closed <details> around an element (the page folds some tables).
UNFOLD = """(el) => { for (let n = el.parentElement; n; n = n.parentElement)
  if (n.tagName === 'DETAILS') n.open = true; }"""


class NotMeasurable(Exception):
    """A row cannot be measured on this page: the message says why."""


class Network:
    """Bytes on the wire through a CDP session: every request started while armed, its
    ``encodedDataLength`` once loaded (or its failure)."""

    def __init__(self, page: Any) -> None:
        self.cdp = page.context.new_cdp_session(page)
        self.cdp.send("Network.enable")
        self.armed = False
        self.started: dict[str, str] = {}  # requestId → "METHOD path"
        self.done: dict[str, float] = {}  # requestId → bytes (failed: what arrived, 0)
        self.cdp.on("Network.requestWillBeSent", self._start)
        self.cdp.on("Network.loadingFinished", self._finish)
        self.cdp.on("Network.loadingFailed", lambda e: self.done.setdefault(e["requestId"], 0.0))

    def _start(self, event: dict[str, Any]) -> None:
        url = event["request"]["url"]
        if self.armed and not url.startswith(("data:", "blob:")):
            path = "/" + url.split("/", 3)[-1] if url.count("/") >= 3 else url
            self.started[event["requestId"]] = f"{event['request']['method']} {path}"

    def _finish(self, event: dict[str, Any]) -> None:
        self.done[event["requestId"]] = float(event["encodedDataLength"])

    def arm(self) -> None:
        self.started, self.done, self.armed = {}, {}, True

    def total(self, page: Any) -> tuple[float, dict[str, float]]:
        """Stop counting new requests, wait for those started to finish; bytes, per request."""
        self.armed = False
        deadline = time.monotonic() + 30
        while set(self.started) - set(self.done) and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        per: dict[str, float] = {}
        for rid, what in self.started.items():
            per[what] = per.get(what, 0.0) + self.done.get(rid, 0.0)
        return sum(per.values()), per


def _visible(page: Any, selector: str) -> bool:
    loc = page.locator(selector)
    return bool(loc.count() and loc.first.is_visible())


def _open_model_tab(page: Any, base: str) -> None:
    page.goto(base + "/")
    page.locator("body[data-ready=true]").wait_for(timeout=30_000)
    if not _visible(page, SELECTORS["tab"]):
        raise NotMeasurable(f"no model tab ({SELECTORS['tab']})")
    page.click(SELECTORS["tab"])
    page.locator(SELECTORS["form_ready"]).wait_for(timeout=60_000)
    page.locator(f"body:not({SELECTORS['busy'].removeprefix('body')})").wait_for(
        state="attached", timeout=TIMEOUT_MS
    )
    for key in ("text", "run"):
        if not _visible(page, SELECTORS[key]):
            raise NotMeasurable(f"the model tab shows no {key} ({SELECTORS[key]})")


def _run(page: Any, net: Network) -> dict[str, Any]:
    """One Run of the paragraph: ms click to drawn, and the bytes it took."""
    page.fill(SELECTORS["text"], PARAGRAPH)
    page.evaluate(ARM, SELECTORS["busy"])
    page.evaluate(CLICKED, SELECTORS["run"])
    net.arm()
    page.click(SELECTORS["run"])
    got: dict[str, Any] = page.evaluate(DRAWN, [SELECTORS, TIMEOUT_MS])
    total, per = net.total(page)
    if "why" in got:
        raise NotMeasurable(got["why"])
    if not got["status"].startswith(DONE):
        raise NotMeasurable(f"the Run did not draw: the status says {got['status']!r}")
    return got | {"bytes": total, "requests": per}


def _thumbnails(page: Any) -> list[float]:
    shares: list[float] = page.evaluate(BLANKS, [SELECTORS["thumbnail"], VISIBLE])
    return shares


def _summary_lines(page: Any) -> int:
    if not page.locator(SELECTORS["summary"]).count():
        raise NotMeasurable(f"no summary on the model tab ({SELECTORS['summary']})")
    n: int = page.evaluate(SHOWN_COUNT, SELECTORS["summary_line"])
    return n


def _ask(base: str, include: list[str]) -> Any:
    """POST /model of the paragraph, as JSON, straight to the server (not through the page)."""
    body = {"model": MODEL, "text": PARAGRAPH, "layer": LAYER, "include": include}
    req = urllib.request.Request(base + "/model", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def _reference_output(base: str) -> Any:
    """The layer's COMPARE_OUTPUT as POST /model computes it, to paste."""
    return _ask(base, ["trace"])["trace"][COMPARE_OUTPUT]


def _compare(page: Any, base: str) -> tuple[int, str]:
    """(1, how) when the model tab's compare answers, (0, why not) when it is there but does not;
    NotMeasurable when the model tab has no box to paste into. The layer is opened first (its
    trace, and the boxes under its outputs, come when it is opened) when the page offers it."""
    opener = page.locator(SELECTORS["open_layer"].format(layer=LAYER))
    if opener.count():
        opener.first.click()
        heading = page.locator(SELECTORS["trace_heading"], has_text=f"Layer {LAYER}, step by step")
        heading.wait_for(timeout=TIMEOUT_MS)
    box = page.locator(SELECTORS["compare_box"].format(name=COMPARE_OUTPUT))
    if not box.count():
        raise NotMeasurable(
            "no compare on the model tab (no "
            + SELECTORS["compare_box"].format(name=COMPARE_OUTPUT)
            + ")"
        )
    box = box.first
    box.evaluate(UNFOLD)
    box.evaluate("(d) => { d.open = true; }")
    area = box.locator(SELECTORS["compare_text"])
    if not (box.is_visible() and area.count() and area.first.is_visible()):
        raise NotMeasurable(
            "no compare on the model tab (its box "
            + SELECTORS["compare_box"].format(name=COMPARE_OUTPUT)
            + " is in the page but not shown, even unfolded)"
        )
    area.first.fill(json.dumps(_reference_output(base)))
    go = SELECTORS["compare"]
    button = page.locator(go) if _visible(page, go) else box.locator(SELECTORS["compare_here"])
    posted: list[str] = []
    page.on("request", lambda r: posted.append(r.url) if r.method == "POST" else None)
    button.first.click()
    status = page.locator(SELECTORS["compare_status"])
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    text = ""
    while time.monotonic() < deadline:
        text = status.inner_text() if status.count() else ""
        if text.startswith((COMPARED, "Error")):
            break
        page.wait_for_timeout(100)
    where = ", ".join("/" + u.split("/", 3)[-1] for u in posted) or "nothing"
    answered = text.startswith(COMPARED) and any(u.endswith("/model") for u in posted)
    return int(answered), f"posted to {where}; the compare status says {text[:120]!r}"


def _or_why(measure_it: Callable[[], Any]) -> Any:
    """What ``measure_it`` measured, or {"why": …} when the page does not let it (a selector
    that finds nothing, a wait that times out: its first line)."""
    from playwright.sync_api import Error

    try:
        return measure_it()
    except (NotMeasurable, Error) as why:
        return {"why": str(why).strip().splitlines()[0][:300]}


def measure(base: str, runs: int = RUNS) -> dict[str, Any]:
    """Every measure, or {"why": …} per row that could not be measured."""
    from playwright.sync_api import sync_playwright

    try:
        tokens = len(_ask(base, ["tokens"])["tokens"])
    except OSError as error:
        return {"why": f"POST /model of the paragraph failed: {error}"}
    assert tokens == TOKENS, f"the paragraph is {tokens} tokens, not {TOKENS}"
    out: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            net = Network(page)

            def run_all() -> list[dict[str, Any]]:
                _open_model_tab(page, base)
                _run(page, net)  # warm: modules, JIT, the server's first answer of this length
                return [_run(page, net) for _ in range(runs)]

            out["runs"] = _or_why(run_all)
            if isinstance(out["runs"], dict):
                return dict(out["runs"])
            out["height"] = page.evaluate("() => document.documentElement.scrollHeight")
            out["thumbnails"] = _thumbnails(page)
            out["summary"] = _or_why(lambda: _summary_lines(page))
            out["compare"] = _or_why(lambda: _compare(page, base))
        finally:
            browser.close()
    return out


Row = dict[str, Any]


def not_measurable(rid: str, why: str) -> Row:
    op, target = TARGETS[rid]
    return {"id": rid, "workload": WHAT[rid], "value": None, "target": f"{op} {target:g}",
            "met": None, "detail": "not measurable: " + why}  # fmt: skip


def rows(
    base: str, ids: set[str], row: Callable[..., Row], skipped: Callable[..., Row]
) -> list[Row]:
    """The rows of ``ids`` among E4–E9 (``row`` and ``skipped``: run.py's)."""
    wanted = [rid for rid in IDS if rid in ids]
    from pathlib import Path

    try:
        import playwright  # noqa: F401
    except ImportError:
        return [skipped(r, WHAT[r], "playwright is not installed", " ".join(map(str, TARGETS[r]))) for r in wanted]  # fmt: skip
    if not Path(CHROMIUM).exists():
        return [skipped(r, WHAT[r], f"{CHROMIUM} is missing", " ".join(map(str, TARGETS[r]))) for r in wanted]  # fmt: skip
    got = measure(base)
    if "why" in got:
        return [not_measurable(rid, got["why"]) for rid in wanted]
    return [build(rid, got, row) for rid in wanted]


def build(rid: str, got: dict[str, Any], row: Callable[..., Row]) -> Row:
    op, target = TARGETS[rid]
    runs = got["runs"]
    n = len(runs)
    times = sorted(r["ms"] / 1e3 for r in runs)
    where = (f"{WIDTH}×{HEIGHT}, Chromium and the server sharing this "
             "machine's CPUs")  # fmt: skip
    if rid == "E4":
        megabytes = statistics.median(r["bytes"] for r in runs) / 1e6
        each = ", ".join(f"{r['bytes'] / 1e6:.2f}" for r in runs)
        parts = ", ".join(f"{what} {b / 1e6:.2f} MB" for what, b in runs[-1]["requests"].items())
        return row(rid, WHAT[rid], megabytes, op, target,
                   f"median of {n} Runs ({each} MB): "
                   f"{parts or 'no request'}; CDP Network.loadingFinished encodedDataLength "
                   "(headers + body as received) of every request from the click to drawn")  # fmt: skip
    if rid == "E5":
        idle = statistics.median(r["idle_ms"] for r in runs) / 1e3
        unsettled = sum(not r["settled"] for r in runs)
        return row(rid, WHAT[rid], statistics.median(times), op, target,
                   f"best {times[0]:.2f} s of {n} ({', '.join(f'{t:.2f}' for t in times)} s); idle "
                   f"(busy cleared) at {idle:.2f} s, drawn = a frame after idle with the "
                   f"thumbnails' pixels stable over 3 frames{f' ({unsettled} never settled in 5 s)' if unsettled else ''}; "
                   f"{where}")  # fmt: skip
    if rid == "E6":
        height = got["height"]
        return row(rid, WHAT[rid], height / HEIGHT, op, target,
                   f"document scrollHeight {height} px after the Run, nothing opened; {where}")  # fmt: skip
    if rid == "E7":
        shares = got["thumbnails"]
        if not shares:
            return not_measurable(rid, f"no thumbnails ({SELECTORS['thumbnail']})")
        lit = sum(s >= NON_BLANK for s in shares)
        quart = statistics.quantiles(shares, n=4) if len(shares) > 1 else shares * 3
        return row(rid, WHAT[rid], lit / len(shares), op, target,
                   f"{lit} of {len(shares)} non-blank: ≥ {NON_BLANK:.0%} of a thumbnail's pixels at "
                   f"≥ {VISIBLE}/255 in a channel from its most frequent colour (drawn over white); "
                   f"share of such pixels: quartiles {', '.join(f'{q:.1%}' for q in quart)}, "
                   f"max {max(shares):.1%}")  # fmt: skip
    if rid == "E8":
        lines = got["summary"]
        if isinstance(lines, dict):
            return not_measurable(rid, lines["why"])
        return row(rid, WHAT[rid], float(lines), op, target,
                   f"{lines} shown elements {SELECTORS['summary_line']} after the Run")  # fmt: skip
    compared = got["compare"]
    if isinstance(compared, dict):
        return not_measurable(rid, compared["why"])
    yes, how = compared
    return row(rid, WHAT[rid], float(yes), op, target,
               f"{'yes' if yes else 'no'}: the layer's {COMPARE_OUTPUT} as the service computes it "
               f"pasted and compared; {how}")  # fmt: skip
