"""The explorer's reading aids in a real browser (Debian's Chromium, driven by Playwright) against a
real server, offline: a colour legend under each map, axis names instead of a repeated title, values
printed with three significant digits, a visible grid for zeros, the position and score variants
drawn from the form, and a readable hover read-out."""

import json
import math
import re
import urllib.request
from typing import Any

import pytest

from tests.browser.support import ARTIFACTS, js_number, map_cells, open_explorer, run_form

pytestmark = pytest.mark.e2e

Value = float | bool | None  # a cell's data-value: a number, a mask's true/false, or null (−∞)


def _map_kinds(server: str, endpoint: str) -> dict[str, str]:
    """Each output the endpoint draws as a map, and its colours (scores, weights, mask)."""
    with urllib.request.urlopen(f"{server}/openapi.json", timeout=60) as r:
        spec = json.loads(r.read())
    ref = spec["paths"][f"/{endpoint}"]["post"]["responses"]["200"]["content"]["application/json"][
        "schema"
    ]["$ref"]
    props = spec["components"]["schemas"][ref.split("/")[-1]]["properties"]
    return {n: p["x-view"]["map"] for n, p in props.items() if p.get("x-view", {}).get("map")}


def _value(text: str) -> Value:
    words: dict[str, Value] = {"null": None, "true": True, "false": False}
    return words[text] if text in words else float(text)


def fmt(v: Value) -> str:
    """lib/format.js ``fmt``: 3 significant digits, trailing zeros dropped."""
    return js_number(v, 3, trim=True)


def test_fmt_reference() -> None:
    """The Python reference itself, on cases worked by hand; all but the last are what the page's
    fmt prints in Chromium."""
    cases = {
        0.6665982784226228: "0.667",
        0.0009151139905202558: "0.000915",
        1.0055230967545396e-06: "1.01e-6",
        1.0806392775963846e-30: "1.08e-30",
        -229.99999999999997: "-230",
        -1380.0: "-1380",
        4.949747468305832: "4.95",
        0.5: "0.5",
        1.0: "1",
        0.99951: "1",
        9.9996e-5: "1.00e-4",
        1e-4: "0.0001",
        -0.00012345: "-0.000123",
        999_999.4: "999999",
        1e6: "1.00e+6",
        1e22: "1.00e+22",
    }
    assert {v: fmt(v) for v in cases} == cases


def _figures(page: Any) -> list[Any]:
    figures = page.locator("figure.heatmap")
    assert figures.count() > 0
    return list(figures.all())


def _printed(figure: Any) -> list[tuple[int, int, str, str, float]]:
    """(row, col, data-value, printed text, px the text sticks out of its cell) of each value
    printed inside a cell of an SVG map: a <text> belongs to the cell its box's centre falls in."""
    return list(
        figure.evaluate(
            """fig => {
              const svg = fig.querySelector('.map-scroll svg');
              const cells = [...svg.querySelectorAll('rect.cell')].map((r) => [r, r.getBBox()]);
              const out = [];
              for (const t of svg.querySelectorAll('text')) {
                const b = t.getBBox(), x = b.x + b.width / 2, y = b.y + b.height / 2;
                const hit = cells.find(([, c]) => x >= c.x && x < c.x + c.width && y >= c.y && y < c.y + c.height);
                if (!hit) continue;
                const [r, c] = hit, over = Math.max(c.x - b.x, b.x + b.width - c.x - c.width);
                out.push([+r.dataset.row, +r.dataset.col, r.dataset.value, t.textContent, over]);
              }
              return out;
            }"""
        )
    )


def _legend_labels(figure: Any) -> list[str]:
    """The legend's texts, left to right."""
    found = figure.locator("svg.legend text").evaluate_all(
        "els => els.map(e => [e.getBBox().x + e.getBBox().width / 2, e.textContent])"
    )
    return [t for _, t in sorted(found)]


# ---- 1. a colour legend per map ----------------------------------------------------------------


@pytest.mark.parametrize("example", ["batman", "causal"])
def test_each_map_has_one_legend_with_its_own_range(
    offline_page: tuple[Any, list[str]], server: str, example: str
) -> None:
    """Weights: a sequential legend 0 … the map's largest weight; signed maps (scores): a diverging
    one −m, 0, m with m the map's largest |value|; "masked" in the legend exactly when the map has
    masked cells; a mask map: its two swatches."""
    page, outside = offline_page
    open_explorer(page, server)
    if example != "batman":  # the page opens with batman drawn
        page.select_option("#example", example)
        run_form(page, "attention")
    kinds = _map_kinds(server, "attention")
    seen = set()
    for figure in _figures(page):
        name = figure.get_attribute("data-name")
        kind = kinds[name]
        seen.add(kind)
        assert figure.locator("svg.legend").count() == 1, name
        labels = _legend_labels(figure)
        if kind == "mask":
            assert labels == ["may attend", "masked"], name
            continue
        has_masked = figure.locator("rect.cell.masked").count() > 0
        assert ("masked" in labels) == has_masked, (name, labels)
        numbers = [t for t in labels if t != "masked"]
        values = [v for v in map(_value, map_cells(page, name).values()) if v is not None]
        assert values, name
        if kind == "weights":
            assert numbers == ["0", fmt(max(values))], name
        else:
            m = max(abs(v) for v in values)
            assert m > 0, name
            assert numbers == [fmt(-m), "0", fmt(m)], name
    assert {"scores", "weights"} <= seen
    if example == "causal":
        assert "mask" in seen
        assert page.locator('figure[data-name="weights"] rect.cell.masked').count() > 0
    assert outside == []


# ---- 2. axis names, no title inside the picture ------------------------------------------------


def test_maps_name_their_axes_and_do_not_repeat_the_title(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    open_explorer(page, server)
    for figure in _figures(page):
        name = figure.get_attribute("data-name")
        axis = " ".join(figure.locator(".map-scroll svg text.axis-name").all_text_contents())
        assert "queries ↓" in axis, name
        assert "keys →" in axis, name
        title = figure.evaluate("f => f.querySelector('figcaption').firstChild.textContent")
        title = " ".join(title.split())
        assert title, name
        texts = figure.locator(".map-scroll svg text").all_text_contents()
        assert texts
        inside = [t for t in texts if title in " ".join(t.split())]
        assert inside == [], f"{name}: the title {title!r} is drawn inside the picture"
    assert outside == []


# ---- 3. three significant digits, no exponent from 1e-4 up to a million -------------------------


def _direct(page: Any, q: str, k: str, v: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run /attention with q, k, v typed into the form's "q, k, v directly" mode."""
    page.select_option("#mode", "direct")
    page.fill("#tokens", "")
    page.fill("#extra", "")
    page.select_option("#weight_layout", "in_out")
    for field, text in (("#q", q), ("#k", k), ("#v", v)):
        page.fill(field, text)
    body, data = run_form(page, "attention")
    assert set(body) >= {"q", "k", "v"} and "x" not in body
    return body, data


def _check_printed(page: Any) -> list[tuple[float, str]]:
    """Every SVG map prints each of its cells once, as fmt() of its data-value, never in exponent
    form from 1e-4 up to a million and with at most 3 significant digits below 1000; the tables
    too. Returns
    (value, text) of the numbers printed in maps."""
    numbers = []
    for figure in _figures(page):
        name = figure.get_attribute("data-name")
        printed = _printed(figure)
        assert sorted((i, j) for i, j, *_ in printed) == sorted(map_cells(page, name)), name
        for i, j, raw, text, _ in printed:
            v = _value(raw)
            if isinstance(v, float) and math.isfinite(v):
                numbers.append((v, text))
                if 1e-4 <= abs(v) < 1e6:
                    assert "e" not in text.lower(), f"{name}[{i}][{j}] = {raw} printed {text!r}"
                if abs(v) < 1000:
                    digits = re.sub(r"e.*$", "", text).lstrip("-0.").replace(".", "")
                    assert len(digits) <= 3, f"{name}[{i}][{j}] = {raw} printed {text!r}"
            assert text == fmt(v), f"{name}[{i}][{j}] = {raw}"
    tables = page.locator("table.matrix td[title]")
    assert tables.count() > 0
    for title, text in tables.evaluate_all("els => els.map(e => [e.title, e.textContent])"):
        assert text == fmt(_value(title)), title
    return numbers


def test_values_are_printed_with_three_significant_digits(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    """Scores far apart give weights from 1 down to 1e-300 and an exact 0 (underflow); each printed
    cell is fmt(data-value): 0.000915 plain, 1.01e-6 in exponent form."""
    page, outside = offline_page
    open_explorer(page, server)
    _, data = _direct(page, "1\n2\n10\n100", "0\n-6.9\n-13.8\n-2.3", "1\n2\n3\n4")
    weights = [v for row in data["weights"] for v in row]
    assert any(1e-4 <= v < 1e-2 for v in weights) and any(0 < v < 1e-4 for v in weights)
    assert 0.0 in weights
    numbers = _check_printed(page)
    shown = dict(numbers)
    assert shown[data["weights"][0][1]] == "0.000915"  # 9.151e-4: plain, 3 significant digits
    assert shown[data["weights"][1][1]] == "1.01e-6"  # 1.0055e-6: exponent form below 1e-4
    assert shown[data["weights"][3][2]] == "0"
    assert shown[data["scores"][3][2]] == "-1380"
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator('figure[data-name="weights"]').screenshot(
        path=str(ARTIFACTS / "explorer-reading-digits.png")
    )
    assert outside == []


def test_huge_scores_are_printed_short_in_exponent_form(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    open_explorer(page, server)
    _, data = _direct(page, "1e11\n1", "1e11\n1", "1\n2")
    assert data["scores"][0][0] == 1e22
    shown = dict(_check_printed(page))
    assert shown[1e22] == "1.00e+22"  # not 23 digits, nor JavaScript's own "1e+22"
    assert shown[1e11] == "1.00e+11"
    assert outside == []


def test_printed_values_fit_in_their_cells(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    open_explorer(page, server)
    _direct(page, "1\n2\n10\n100", "0\n-6.9\n-13.8\n-2.3", "1\n2\n3\n4")
    for figure in _figures(page):
        name = figure.get_attribute("data-name")
        wide = [(text, round(over, 1)) for _, _, _, text, over in _printed(figure) if over > 0]
        assert wide == [], f"{name}: values wider than their cell (text, px over): {wide}"
    assert outside == []


# ---- 4. a visible grid for zeros -------------------------------------------------------------


def test_zero_cells_have_a_visible_stroke(offline_page: tuple[Any, list[str]], server: str) -> None:
    """I am Batman: "am" is the zero vector, so its row of scores is all zeros; each of its cells
    (every zero cell of every map) is outlined in a colour darker than its white fill."""
    page, outside = offline_page
    open_explorer(page, server)
    scores = map_cells(page, "scores")
    assert [scores[1, j] for j in range(3)] == ["0", "0", "0"]
    zeros = page.locator("figure.heatmap rect.cell:not(.masked)").evaluate_all(
        """els => els.filter((e) => Number(e.dataset.value) === 0)
              .map((e) => { const s = getComputedStyle(e);
                return [e.closest('figure').dataset.name, s.stroke, s.strokeWidth, s.fill]; })"""
    )
    assert len([z for z in zeros if z[0] == "scores"]) == 5  # the row of "am" and its column
    for name, stroke, width, fill in zeros:
        assert stroke not in ("none", "transparent", ""), name
        assert float(width.removesuffix("px")) > 0, name
        rgb = [int(c) for c in re.findall(r"\d+", stroke)[:3]]
        assert rgb != [int(c) for c in re.findall(r"\d+", fill)[:3]], name
        assert max(rgb) <= 240, f"{name}: stroke {stroke} is too faint to see on white"
    assert outside == []


# ---- 5. variants from the form -----------------------------------------------------------------


def _table(page: Any, name: str) -> list[list[float]]:
    rows = page.locator(f'table.matrix[data-name="{name}"] tbody tr')
    found = rows.evaluate_all(
        "trs => trs.map(tr => [...tr.querySelectorAll('td')].map(td => Number(td.title)))"
    )
    return [list(r) for r in found]


def test_variants_from_the_form_are_drawn(offline_page: tuple[Any, list[str]], server: str) -> None:
    page, outside = offline_page
    open_explorer(page, server)
    page.check("#rope")
    page.fill("#softcap", "2")
    page.check("#alibi")
    page.fill("#sinks", "0.5")
    body, data = run_form(page, "attention")
    assert body["rope"] is True and body["softcap"] == 2 and body["alibi"] is True
    assert body["sinks"] == 0.5

    for name in ("q_rotated", "k_rotated"):  # tables, not maps
        assert page.locator(f'figure[data-name="{name}"]').count() == 0
        shown = _table(page, name)
        assert len(shown) == len(data[name]) and data[name]
        for got, want in zip(shown, data[name], strict=True):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12), name
    for name in ("capped_scores", "position_bias"):  # maps
        cells = map_cells(page, name)
        want = data[name]
        assert len(cells) == len(want) * len(want[0]), name
        for (i, j), raw in cells.items():
            assert float(raw) == pytest.approx(want[i][j], rel=1e-12, abs=1e-12), name
    assert max(abs(v) for row in data["capped_scores"] for v in row) < 2
    assert any(v != 0 for row in data["position_bias"] for v in row)

    sinks = page.locator('table.matrix[data-name="sink_weights"]')
    assert sinks.locator("thead th").count() == 2  # the corner and one column
    assert sinks.locator("tbody th").all_text_contents() == data["tokens"]
    shown = _table(page, "sink_weights")
    assert [len(r) for r in shown] == [1] * len(data["sink_weights"])
    for got, want in zip(shown, data["sink_weights"], strict=True):
        assert got[0] == pytest.approx(want, rel=1e-12, abs=1e-12)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-reading-variants.png"), full_page=True)
    assert outside == []


# ---- 6. a readable hover read-out ------------------------------------------------------------


def test_hover_readout_is_readable(offline_page: tuple[Any, list[str]], server: str) -> None:
    from playwright.sync_api import expect

    page, outside = offline_page
    open_explorer(page, server)
    figure = page.locator('figure[data-name="weights"]')
    tokens = ["I", "am", "Batman"]
    cells = map_cells(page, "weights")
    readout = figure.locator(".cell-readout")
    for i, j in ((2, 0), (0, 1)):
        figure.locator(f'rect.cell[data-row="{i}"][data-col="{j}"]').hover()
        want = f"{tokens[i]} → {tokens[j]}: {fmt(_value(cells[i, j]))}"
        expect(readout).to_have_text(want)
    assert readout.is_visible()
    style = readout.evaluate(
        "e => { const s = getComputedStyle(e); return [s.fontSize, s.color, s.opacity]; }"
    )
    assert float(style[0].removesuffix("px")) >= 13, style
    rgb = [int(c) for c in re.findall(r"\d+", style[1])[:3]]
    assert all(c < 100 for c in rgb), f"read-out colour {style[1]} is too light"
    assert float(style[2]) == 1
    ARTIFACTS.mkdir(exist_ok=True)
    figure.screenshot(path=str(ARTIFACTS / "explorer-reading-hover.png"))
    assert outside == []
