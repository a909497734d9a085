"""POST every golden case (worked examples first) to a running service and compare the numbers
with tests/fixtures/golden.json (computed by PyTorch). Standard library only: runs anywhere."""

import json
import math
import sys
import urllib.request
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "golden.json"
STATIC = Path(__file__).resolve().parents[1] / "service" / "static"


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


def large_body(base: str) -> None:
    """A body over 16 KiB, parsed in the service's parser process: zero queries attend uniformly,
    so every output row is the mean of V's rows."""
    L, S, d = 400, 300, 8
    v = [[(i * 7 + j * 3) % 11 / 10 for j in range(d)] for i in range(S)]
    k = [[((i + 1) * (j + 2)) % 5 / 4 for j in range(d)] for i in range(S)]
    body = {"q": [[0.0] * d] * L, "k": k, "v": v, "include": ["output"]}
    data = json.dumps(body).encode()
    assert len(data) > 16 * 1024
    req = urllib.request.Request(
        base + "/attention", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        output = json.loads(r.read())["output"]
    mean = [sum(row[j] for row in v) / S for j in range(d)]
    for i, row in enumerate(output):
        close(row, mean, f"large body output[{i}]")


def trained_model(base: str) -> None:
    """The image carries both trained models: listed as installed, and minilm runs."""
    with urllib.request.urlopen(base + "/models", timeout=10) as r:
        listed = {m["name"]: m for m in json.loads(r.read())}
    assert listed["minilm"]["installed"] and listed["tiny-decoder"]["installed"], listed
    req = urllib.request.Request(
        base + "/model",
        data=json.dumps({"model": "minilm", "text": "The cat sat on the mat.", "layer": 5,
                         "include": ["tokens", "attention"]}).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as r:
        body = json.loads(r.read())
    assert body["tokens"][0] == "[CLS]" and len(body["attention"]) == 6, body["tokens"]


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
    large_body(base)
    trained_model(base)
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
    # the explorer: the page, and each of its files as it is in this checkout (every ES module)
    with urllib.request.urlopen(base + "/", timeout=10) as r:
        assert b'src="static/main.js"' in r.read(), "/ is not the explorer page"
    files = sorted(p for p in STATIC.rglob("*") if p.is_file())
    for path in files:
        name = path.relative_to(STATIC).as_posix()
        with urllib.request.urlopen(f"{base}/static/{name}", timeout=10) as r:
            assert r.read() == path.read_bytes(), f"/static/{name} differs from {path}"
    print(
        f"smoke: {len(cases)} golden cases match PyTorch to 1e-12; a large body parsed; minilm "
        "installed and run; docs, "
        f"metrics and the explorer's {len(files)} files served"
    )


if __name__ == "__main__":
    main(sys.argv[1])
