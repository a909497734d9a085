"""Swagger UI and ReDoc in a real browser (Debian's Chromium, driven by Playwright) against a real
server, with every request that leaves the server blocked: the docs must work offline."""

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.live import start_server

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
def offline_page(browser: Any, server: str) -> Iterator[tuple[Any, list[str]]]:
    """A page that may reach only the server; every other request is aborted and recorded."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    outside: list[str] = []

    def guard(route: Any) -> None:
        if route.request.url.startswith(server):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    yield page, outside
    context.close()


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
    page, outside = offline_page
    page.goto(server + "/redoc")
    page.get_by_text("Scaled dot-product attention, every step").first.wait_for(timeout=20_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "redoc.png"))
    assert outside == []
