"""What the browser tests share besides fixtures: where Chromium and the screenshots are, and the
steps every explorer test takes (open the page, run the form, read a map's cells)."""

import json
import math
import re
import urllib.request
from decimal import ROUND_HALF_UP, Decimal, localcontext
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# Chromium as root, offline: no sandbox, no GPU, nothing fetched in the background
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"  # screenshots


def open_explorer(page: Any, server: str) -> None:
    """Open the explorer and wait until the first worked example is drawn."""
    page.goto(server + "/")
    page.locator("body[data-ready=true]").wait_for(timeout=20_000)


def wait_idle(page: Any) -> None:
    """Wait until no Run is under way (picking an example starts one)."""
    page.locator("body:not([data-busy])").wait_for(state="attached", timeout=20_000)


def run_form(page: Any, endpoint: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Click Run; return the request body the page sent and the JSON it got back."""
    wait_idle(page)
    with page.expect_response(
        lambda r: r.url.endswith("/" + endpoint) and r.request.method == "POST"
    ) as info:
        page.click("#run")
    response = info.value
    page.locator("#status").filter(has_text=re.compile("^(Done|Error)")).wait_for(timeout=20_000)
    wait_idle(page)
    return response.request.post_data_json, response.json()


def post_json(server: str, endpoint: str, body: dict[str, Any]) -> Any:
    """POST ``body`` to the service directly (not through the page) and decode the answer."""
    req = urllib.request.Request(
        f"{server}/{endpoint}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def paste_mine(page: Any, name: str, text: str) -> None:
    """Open the "Compare with my numbers" box under output ``name`` and paste ``text``."""
    box = page.locator(f'details.my-numbers[data-name="{name}"]')
    if box.get_attribute("open") is None:
        box.locator("summary").click()
    box.locator("textarea").fill(text)


def compare_mine(page: Any, endpoint: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Click Compare; return the request body the page sent and the JSON it got back."""
    with page.expect_response(
        lambda r: r.url.endswith("/" + endpoint) and r.request.method == "POST"
    ) as info:
        page.click("#compare")
    response = info.value
    status = page.locator("#compare-status").filter(has_text=re.compile("^(Compared|Error)"))
    status.wait_for(timeout=20_000)
    return response.request.post_data_json, response.json()


def map_cells(page: Any, name: str) -> dict[tuple[int, int], str]:
    """The cells of the SVG map ``name``: (row, col) -> data-value (the full-precision number)."""
    cells = page.locator(f'figure[data-name="{name}"] rect.cell')
    found = cells.evaluate_all(
        "els => els.map(e => [+e.dataset.row, +e.dataset.col, e.dataset.value])"
    )
    return {(i, j): v for i, j, v in found}


def run_example(page: Any, endpoint: str, example: str) -> dict[str, Any]:
    """Pick ``endpoint`` and its worked example ``example`` (picking runs it); return the JSON
    the page got back, once it is drawn."""
    page.select_option("#endpoint", endpoint)
    page.locator(f"#example option[value={example}]").wait_for(state="attached")
    with page.expect_response(
        lambda r: r.url.endswith("/" + endpoint) and r.request.method == "POST"
    ) as info:
        page.select_option("#example", example)
    data: dict[str, Any] = info.value.json()
    wait_idle(page)
    return data


def fill_generated(page: Any, tokens: int, seed: int = 0, d_model: int = 8, d_k: int = 8) -> None:
    """Switch the form to "a sentence with generated numbers": ``tokens`` words w0 w1 …, drawn
    from ``seed`` at ``d_model`` and ``d_k``."""
    page.select_option("#mode", "generated")
    page.fill("#tokens", "")
    page.fill("#sentence", " ".join(f"w{i}" for i in range(tokens)))
    for field, value in (("#seed", seed), ("#d_model", d_model), ("#d_k", d_k)):
        page.fill(field, str(value))


def js_number(v: float | bool | None, digits: int, trim: bool) -> str:
    """lib/format.js ``formatNumber``, exactly: ``digits`` significant digits, plain decimals from 1e-4
    up to a million (whole numbers printed whole), exponent form (JavaScript's toExponential)
    outside; ``trim`` drops trailing zeros. None is −∞ (a masked score), a boolean 1 or 0.
    Rounding is JavaScript's toFixed / toExponential: from the double's exact value, ties away
    from zero."""
    if v is None:
        return "−∞"
    if isinstance(v, bool):
        return "1" if v else "0"
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if v == 0:
        return "0"
    sign = "-" if v < 0 else ""
    with localcontext() as ctx:
        ctx.prec = 800
        a = abs(Decimal(v))  # exact
        e = a.adjusted()  # floor(log10(a))
        if abs(v) < 1e-4 or abs(v) >= 1e6:
            unit = 10 ** (digits - 1)
            n = int(a.scaleb(digits - 1 - e).quantize(Decimal(1), rounding=ROUND_HALF_UP))
            if n == 10 * unit:
                n, e = unit, e + 1
            mantissa = f"{n // unit}.{n % unit:0{digits - 1}d}"
            return f"{sign}{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"
        decimals = max(0, digits - 1 - e)
        s = f"{a.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP):f}"
    if trim and "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s == "0" else sign + s
