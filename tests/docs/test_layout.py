"""The layout keeps to its own rules (docs/development.md, "Layout: every module"): the map
names every module of the service, the page and the client under its folder's heading. The
sizes are reported, not enforced: a module of theirs over 450 lines and a folder (tests
included) over 15 modules are named in the warnings summary, for a reader to judge whether it
holds one subject; modules are split by subject, never to pass a count."""

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "development.md"
MAX_LINES = 450
MAX_MODULES = 15
# the folders the map lists module by module (a folder's heading row, then a row per module)
MAPPED = {
    "service/core/": ROOT / "service" / "core",
    "service/trace/": ROOT / "service" / "trace",
    "service/wire/": ROOT / "service" / "wire",
    "service/http/": ROOT / "service" / "http",
    "service/static/": ROOT / "service" / "static",
    "client/attention_client/": ROOT / "client" / "attention_client",
}
CODE = (ROOT / "service", ROOT / "client" / "attention_client")
FOLDERS = (*CODE, ROOT / "tests", ROOT / "harness", ROOT / "benchmarks", ROOT / "scripts")


def _modules(folder: Path, recursive: bool = True) -> list[Path]:
    found = folder.rglob("*") if recursive else folder.iterdir()
    return sorted(p for p in found if p.suffix in (".py", ".js") and p.is_file())


def _sections() -> dict[str, str]:
    """The map's rows grouped under each folder's heading row, as text."""
    table = MAP.read_text().split("## Layout: every module", 1)[1].split("\n## ", 1)[0]
    sections: dict[str, str] = {}
    current = None
    for line in table.splitlines():
        heading = re.match(r"\| \*\*([^*]+)\*\* \|", line)
        if heading:
            current = heading.group(1)
            sections[current] = line
        elif current is not None:
            sections[current] += "\n" + line
    return sections


@pytest.mark.parametrize("heading", sorted(MAPPED))
def test_the_map_names_every_module_under_its_folder(heading: str) -> None:
    folder = MAPPED[heading]
    rows = _sections()[heading]
    missing = [
        p.relative_to(folder).as_posix()
        for p in _modules(folder)
        if p.name != "__init__.py" or p.stat().st_size > 400  # a package's face: only a docstring
        if f"`{p.relative_to(folder).as_posix()}`" not in rows and f"`{p.name}`" not in rows
    ]
    assert not missing, f"docs/development.md does not name {missing} under {heading}"


class LayoutReport(UserWarning):
    """A size over the layout's guide, reported in the test summary (not a failure)."""


def _long_modules() -> dict[str, int]:
    """The service's and the client's modules over MAX_LINES lines, with their lengths."""
    return {
        p.relative_to(ROOT).as_posix(): n
        for folder in CODE
        for p in _modules(folder)
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }


def _crowded_folders() -> dict[str, int]:
    """The folders (the service, the page, the client and the tests, which mirror them) over
    MAX_MODULES modules, with their counts."""
    folders = {p.parent for folder in FOLDERS for p in _modules(folder)}
    return {
        f.relative_to(ROOT).as_posix(): n
        for f in folders
        if (n := len(_modules(f, recursive=False))) > MAX_MODULES
    }


def test_the_sizes_over_the_guide_are_reported() -> None:
    """Named in the warnings summary: each long module and crowded folder, largest first."""
    for what, sizes, unit in (
        (f"over {MAX_LINES} lines", _long_modules(), "lines"),
        (f"over {MAX_MODULES} modules", _crowded_folders(), "modules"),
    ):
        if sizes:
            listed = ", ".join(
                f"{k} ({n} {unit})" for k, n in sorted(sizes.items(), key=lambda kv: -kv[1])
            )
            warnings.warn(LayoutReport(f"{what}: {listed}"), stacklevel=1)
