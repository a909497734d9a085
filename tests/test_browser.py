"""Swagger UI and ReDoc in a real browser (Debian's Chromium, driven by Playwright) against a real
server, with every request that leaves the server blocked: the docs must work offline."""

import json
import os
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.live import start_server

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"

if os.environ.get("REQUIRE_BROWSER"):  # CI sets it: a missing browser must fail, not skip
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install chromium"
    import playwright  # noqa: F401
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, base = start_server()
    yield base
    proc.terminate()
    proc.wait(timeout=15)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"],
        )  # fmt: skip
        yield b
        b.close()


@pytest.fixture
def offline_page(
    browser: Any, server: str, request: pytest.FixtureRequest
) -> Iterator[tuple[Any, list[str]]]:
    """A page that may reach only the server; every other request is aborted and recorded.
    Parametrize ``viewport`` indirectly to change the window size."""
    size = getattr(request, "param", (1280, 900))
    context = browser.new_context(
        viewport={"width": size[0], "height": size[1]}, accept_downloads=True
    )
    outside: list[str] = []

    def guard(route: Any) -> None:
        if route.request.url.startswith(server):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page, outside
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def test_swagger_ui_renders_and_try_it_out_executes_offline(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, outside = offline_page
    page.goto(server + "/docs")
    block = page.locator("#operations-attention-attention_attention_post")
    block.locator(".opblock-summary").click()
    block.get_by_role("button", name="Execute").click()
    live = block.locator(".live-responses-table tbody .response-col_status").first
    live.wait_for(timeout=20_000)
    assert live.inner_text().strip().startswith("200")
    assert "Batman" in block.locator(".live-responses-table").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "swagger-try-it-out.png"), full_page=False)
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

    from service.api.app import create_app

    spec = TestClient(create_app()).get("/openapi.json").json()
    return [
        (ep, key)
        for ep in ("attention", "mask", "multihead")
        for key in spec["paths"][f"/{ep}"]["post"]["requestBody"]["content"]["application/json"][
            "examples"
        ]
    ]


def _open(page: Any, server: str) -> None:
    page.goto(server + "/")
    page.locator("body[data-ready=true]").wait_for(timeout=20_000)


def _run(page: Any, endpoint: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Click Run; return the request body the page sent and the JSON it got back."""
    with page.expect_response(
        lambda r: r.url.endswith("/" + endpoint) and r.request.method == "POST"
    ) as info:
        page.click("#run")
    response = info.value
    page.locator("#status").filter(has_text=re.compile("^(Done|Error)")).wait_for(timeout=20_000)
    return response.request.post_data_json, response.json()


def _post(server: str, endpoint: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        f"{server}/{endpoint}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _cells(page: Any, name: str) -> dict[tuple[int, int], str]:
    cells = page.locator(f'figure[data-name="{name}"] rect.cell')
    found = cells.evaluate_all(
        "els => els.map(e => [+e.dataset.row, +e.dataset.col, e.dataset.value])"
    )
    return {(i, j): v for i, j, v in found}


@pytest.mark.parametrize(
    ("endpoint", "example"), _examples(), ids=[f"{e}-{k}" for e, k in _examples()]
)
def test_each_worked_example_shows_what_the_api_returns(
    offline_page: tuple[Any, list[str]], server: str, endpoint: str, example: str
) -> None:
    page, outside = offline_page
    _open(page, server)
    page.select_option("#endpoint", endpoint)
    page.locator(f"#example option[value={example}]").wait_for(state="attached")
    page.select_option("#example", example)
    body, data = _run(page, endpoint)
    assert _post(server, endpoint, body) == data  # the page shows the API's own answer

    batched = page.locator("#batch-pick").is_visible()
    key = "average_weights" if endpoint == "multihead" else "weights"
    weights = data[key][0] if batched else data[key]
    cells = _cells(page, key)
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
    _open(page, server)  # the first example (I am Batman) is loaded on arrival
    _run(page, "attention")
    assert "Batman attends most to I, 0.667" in page.locator("#summary").inner_text()


def test_an_api_error_is_shown_next_to_its_field(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    _open(page, server)
    page.fill("#x", "1 0\n0 0 1\n0 1")
    _, data = _run(page, "attention")
    assert data["errors"][0]["field"] == "x"
    message = page.locator('.field[data-field="x"] .field-error').inner_text()
    assert message == "x row 1 has 3 numbers but row 0 has 2"
    assert page.locator("#error").is_visible()


def test_256_tokens_render_on_canvas_and_read_by_keyboard(
    offline_page: tuple[Any, list[str]], server: str
) -> None:
    page, _ = offline_page
    _open(page, server)
    page.select_option("#mode", "generated")
    page.fill("#tokens", "")
    page.fill("#sentence", " ".join(f"w{i}" for i in range(256)))
    for field, value in (("#seed", "0"), ("#d_model", "8"), ("#d_k", "8")):
        page.fill(field, value)
    for field in ("#x", "#w_q", "#w_k", "#w_v"):
        page.fill(field, "")
    page.fill("#extra", "")
    page.select_option("#weight_layout", "in_out")
    _, data = _run(page, "attention")
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
    _open(page, server)
    _run(page, "attention")
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
    _open(page, server)
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
    _open(page, server)
    _run(page, "attention")
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth + 1")
    assert page.locator("#run").is_visible()
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
    _open(page, server)  # I am Batman: d_k 2
    page.check("#causal")
    page.check("#rope")
    page.fill("#rope_base", "100")
    page.fill("#softcap", "2")
    page.check("#alibi")
    page.fill("#sinks", "0.5")
    body, data = _run(page, "attention")
    assert body["rope"] == {"base": 100}
    assert (body["softcap"], body["alibi"], body["sinks"]) == (2, True, 0.5)
    assert body["mask"] == {"type": "causal", "alignment": "upper_left"}
    assert "qk_norm" not in body and "positions" not in body
    assert _post(server, "attention", body) == data

    caption = page.locator('table.matrix[data-name="q_rotated"] caption').inner_text()
    assert caption.startswith("Q rotated (RoPE)")
    shown = _table(page, "q_rotated")
    assert len(shown) == len(data["q_rotated"])
    for row, expected in zip(shown, data["q_rotated"], strict=True):
        assert [float(v) for v in row] == pytest.approx(expected, rel=1e-12, abs=1e-12)
    for name, title in (("capped_scores", "capped scores"), ("position_bias", "position bias")):
        figure = page.locator(f'figure[data-name="{name}"]')
        assert figure.locator("figcaption").inner_text().startswith(title)
        cells = _cells(page, name)
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
    _open(page, server)
    page.select_option("#endpoint", "multihead")
    page.locator("#example option[value=two_heads]").wait_for(state="attached")
    page.select_option("#example", "two_heads")
    page.select_option("#qk_norm", "layer")
    page.check("#rope")
    page.select_option("#rope_style", "interleaved")
    page.fill("#softcap", "5")
    page.check("#alibi")
    page.check("#alibi_symmetric")
    page.fill("#sinks", "0.5 -1")
    body, data = _run(page, "multihead")
    assert body["qk_norm"] == {"type": "layer"}
    assert body["rope"] == {"style": "interleaved"}
    assert (body["alibi"], body["sinks"]) == ({"symmetric": True}, [0.5, -1])
    assert _post(server, "multihead", body) == data
    for h, head in enumerate(data["heads"]):
        for name in ("capped_scores", "position_bias", "biased_scores"):
            cells = _cells(page, f"head{h}_{name}")
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
    _open(page, server)
    page.check("#rope")
    page.fill("#rope_rotary_dim", "1")
    body, data = _run(page, "attention")
    assert body["rope"] == {"rotary_dim": 1}
    assert data["errors"][0]["field"] == "rope.rotary_dim"
    message = page.locator('.field[data-field="rope"] .field-error').inner_text()
    assert message == data["errors"][0]["message"]
    assert page.locator("#error").is_visible()
