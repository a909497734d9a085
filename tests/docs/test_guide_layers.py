"""docs/guide-layers.md runs as written: its ```python blocks, in order and in one namespace,
against a real server (``harness.live.start_server``, its URL put in place of the guide's
``http://127.0.0.1:8000``), each printing exactly the ```text block that follows it.

The blocks need torch and transformers: that test skips when they are missing, unless
REQUIRE_TORCH is set (then a missing one fails), as tests/core/test_variants.py does. The guide's
links are checked without them.
"""

import contextlib
import importlib
import io
import os
import re
from pathlib import Path
from typing import Any

import pytest

from harness.live import start_server

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-layers.md"
TEXT = GUIDE.read_text()
URL = "http://127.0.0.1:8000"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


def require(module: str) -> None:
    """torch or transformers: a skip when missing, a failure if REQUIRE_TORCH is set."""
    if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
        importlib.import_module(module)
        return
    pytest.importorskip(
        module,
        reason=f"{module} is not installed: the guide's blocks are not run "
        "(install torch==2.13.0 and transformers==5.23.0)",
    )


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """Each python block as (its first line, its code, the text block right after it or None).
    "Right after" means nothing but blank lines between the two fences."""
    fences = list(FENCE.finditer(text))
    found = []
    for i, fence in enumerate(fences):
        if fence.group(1) != "python":
            continue
        shown = None
        if i + 1 < len(fences):
            after = fences[i + 1]
            between = text[fence.end() : after.start()]
            if after.group(1) == "text" and not between.strip():
                shown = after.group(2)
        line = text.count("\n", 0, fence.start()) + 2
        found.append((line, fence.group(2), shown))
    return found


BLOCKS = python_blocks(TEXT)
MEASURED = re.compile(r"(\d\.\de[-+]\d\d)")


def prints_as_shown(printed: str, shown: str) -> bool:
    """The printout equals the guide's, except that a difference printed as ``3.0e-08`` (the
    stock layer's float32 rounding, which depends on the CPU's float32 sin, cos and exp) need
    only have the same size: within a factor of 3. Everything else, every verdict against
    1e-12 included, must be exactly as shown."""
    got, want = MEASURED.split(printed), MEASURED.split(shown)
    if len(got) != len(want) or got[0::2] != want[0::2]:
        return False
    return all(
        1 / 3 <= float(a) / float(b) <= 3 for a, b in zip(got[1::2], want[1::2], strict=True)
    )


def test_a_measured_difference_may_vary_in_size_only() -> None:
    assert prints_as_shown("diff = 2.9e-08\n", "diff = 3.0e-08\n")
    assert not prints_as_shown("diff = 3.0e-05\n", "diff = 3.0e-08\n")
    assert not prints_as_shown("max |diff| < 1e-12: False\n", "max |diff| < 1e-12: True\n")


def test_guide_has_checked_blocks_and_local_links() -> None:
    assert len(BLOCKS) >= 3, "the guide's python blocks were not found"
    assert sum(shown is not None for _, _, shown in BLOCKS) >= 3, "too few blocks show output"
    assert all(URL in code for _, code, _ in BLOCKS[:1]), "the first block must make the client"
    assert "../shared" not in TEXT
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", TEXT):
        assert (GUIDE.parent / target).is_file(), f"link to a missing file: {target}"


@pytest.mark.torch
@pytest.mark.e2e
def test_guide_blocks_print_what_the_guide_shows() -> None:
    require("torch")
    require("transformers")
    proc, base = start_server()
    namespace: dict[str, Any] = {"__name__": "guide_layers"}
    try:
        for line, code, shown in BLOCKS:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(code.replace(URL, base), f"{GUIDE}:{line}", "exec"), namespace)
            if shown is not None:
                assert prints_as_shown(printed.getvalue(), shown), (
                    f"the block at docs/guide-layers.md:{line} printed\n{printed.getvalue()}"
                )
    finally:
        client = namespace.get("client")
        if client is not None:
            client.close()
        proc.terminate()
        proc.wait(timeout=30)
