"""Makes README's picture of the explorer, docs/explorer.png: the first screen a new user sees
(the first worked example, drawn on arrival) with one cell of the weights explained. Needs
Debian's Chromium and playwright (the dev extras); run as `.venv/bin/python
scripts/explorer_screenshot.py [OUT.png]`."""

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.live import start_server

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def main() -> None:
    out = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[1] / "docs/explorer.png"
    )
    proc, base = start_server()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(base + "/")
            page.locator("body[data-ready=true]").wait_for(timeout=20_000)
            # Batman's weight on "I": the softmax of its row, term by term
            page.locator(
                'figure[data-name="weights"] rect.cell[data-row="2"][data-col="0"]'
            ).click()
            page.locator("#explain .explain").wait_for()
            page.mouse.move(0, 0)
            page.evaluate("() => window.scrollTo(0, 0)")
            page.screenshot(path=str(out))
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
