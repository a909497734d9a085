"""Fixtures of the browser tests: one real server for the run and one Debian Chromium (driven by
Playwright) a module, and pages that may reach only that server. Where Chromium or Playwright is
missing the tests are skipped, saying why, unless REQUIRE_BROWSER is set (CI): then they fail."""

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.live import start_server
from tests.browser.support import CHROMIUM, FLAGS


def _missing(reason: str) -> None:
    if os.environ.get("REQUIRE_BROWSER"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def server() -> Iterator[str]:
    proc, base = start_server()
    yield base
    proc.terminate()
    proc.wait(timeout=15)


# module scope, not session: Playwright's sync API runs an event loop in this thread while it
# is open, and later modules call asyncio.run
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        _missing(f"{CHROMIUM} is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install playwright)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def offline_page(
    browser: Any, server: str, request: pytest.FixtureRequest
) -> Iterator[tuple[Any, list[str]]]:
    """A page that may reach only the server, and the list of every other request it tried
    (aborted). JavaScript errors on the page fail the test. Parametrize it indirectly with
    (width, height) or (width, height, device pixels a CSS pixel) to change the window."""
    size: tuple[int, ...] = getattr(request, "param", (1280, 900))
    context = browser.new_context(
        viewport={"width": size[0], "height": size[1]},
        device_scale_factor=size[2] if len(size) > 2 else 1,
        accept_downloads=True,
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


@pytest.fixture
def page(offline_page: tuple[Any, list[str]], server: str) -> Iterator[Any]:
    """The explorer page, opened; no request may leave the server."""
    pg, outside = offline_page
    pg.goto(server + "/")
    yield pg
    assert outside == [], f"requests left the server: {outside}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every browser test needs Chromium: skipped (or failed under REQUIRE_BROWSER) before its
    fixtures start a server (tests/conftest.py's ``needs``)."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.needs("chromium"))
