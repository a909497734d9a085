"""POST every golden case (worked examples first) to a running service and compare the numbers
with tests/fixtures/golden.json (computed by PyTorch). Standard library only: runs anywhere."""

import json
import math
import sys
import urllib.request
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "golden.json"


def close(actual: Any, expected: Any, path: str) -> None:
    if isinstance(expected, dict):
        for key, value in expected.items():
            close(actual[key], value, f"{path}.{key}")
    elif isinstance(expected, list):
        if len(actual) != len(expected):
            raise AssertionError(f"{path}: {len(actual)} items, expected {len(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            close(a, e, f"{path}[{i}]")
    elif isinstance(expected, float) and isinstance(actual, int | float):
        if not math.isclose(actual, expected, rel_tol=1e-12, abs_tol=1e-12):
            raise AssertionError(f"{path}: {actual} != {expected}")
    elif actual != expected:
        raise AssertionError(f"{path}: {actual!r} != {expected!r}")


def main(base: str) -> None:
    cases = json.loads(GOLDEN.read_text())["cases"]
    for case in cases:
        req = urllib.request.Request(
            base + case["endpoint"],
            data=json.dumps(case["request"]).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            close(json.loads(r.read()), case["expected"], case["name"])
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'endpoint="/attention"' in text, "/metrics does not count the requests just made"
    for page in (
        "/docs",
        "/redoc",
        "/docs-assets/swagger-ui-bundle.js",
        "/docs-assets/redoc.standalone.js",
    ):
        with urllib.request.urlopen(base + page, timeout=10) as r:
            assert r.status == 200, page
    print(f"smoke: {len(cases)} golden cases match PyTorch to 1e-12; docs and metrics served")


if __name__ == "__main__":
    main(sys.argv[1])
