"""What validating a small body costs, and what leaner validation paths would save: the
3-token body of P2 and S1 (the I AM BATMAN example), in process, CPU µs per body (the best of 7
blocks of ``--requests`` bodies, ``time.thread_time_ns``):

- as the service does it (``service.wire.parse``): ``orjson.loads``, then the request model's
  ``model_validate`` (every field of the contract and its messages);
- by pydantic-core straight from the bytes: ``model_validate_json`` on the same model;
- by a msgspec Struct of the body's six fields, then four ``np.asarray`` (when msgspec is
  importable: it is not a dependency; benchmarks/servers.py's side venv has it);
- with no checks at all: ``orjson.loads`` and four ``np.asarray``, the floor.

The msgspec row checks the six fields' types only: none of the contract's other fields, shapes,
finiteness or error messages, so it is what a rewrite of the contract could save at most.

    /tmp/servers/venv/bin/python benchmarks/validation.py [--requests 3000]

Needs only the service's runtime dependencies (so it runs under that side venv).
"""

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import orjson  # noqa: E402

from service.trace import ENDPOINTS  # noqa: E402
from service.wire.examples import I_AM_BATMAN  # noqa: E402
from service.wire.parse import parse  # noqa: E402


def validation_us(requests: int) -> list[tuple[str, float, str]]:
    """CPU µs per body of the ways to validate the 3-token body (best of 7 blocks)."""
    model = ENDPOINTS["attention"].model
    raw = orjson.dumps(I_AM_BATMAN)
    arrays = ("x", "w_q", "w_k", "w_v")

    def no_checks() -> object:
        data = orjson.loads(raw)
        return [np.asarray(data[name], dtype=np.float64) for name in arrays]

    ways: list[tuple[str, Callable[[], object], str]] = [
        ("validation: the service's", lambda: parse(raw, model),
         "service.wire.parse: orjson.loads, then the request model (every field and message)"),
        ("validation: pydantic-core from bytes", lambda: model.model_validate_json(raw),
         "the same model, model_validate_json"),
    ]  # fmt: skip
    try:
        import msgspec  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        print("msgspec is not importable here: its row is left out")
    else:
        fields: list[tuple[str, Any] | tuple[str, Any, Any]] = [
            (n, list[list[float]]) for n in arrays
        ]
        fields += [("tokens", list[str] | None, None), ("weight_layout", str, "in_out")]
        lean = msgspec.defstruct("Lean", fields)
        decoder = msgspec.json.Decoder(lean)

        def struct() -> object:
            body = decoder.decode(raw)
            return [np.asarray(getattr(body, name), dtype=np.float64) for name in arrays]

        ways.append(("validation: msgspec, six fields", struct,
                     "a Struct of the body's six fields, four np.asarray; no other field"))  # fmt: skip
    ways.append(("validation: none", no_checks, "orjson.loads and four np.asarray: the floor"))
    rows = []
    for name, way, what in ways:
        way()
        blocks = []
        for _ in range(7):
            start = time.thread_time_ns()
            for _ in range(requests):
                way()
            blocks.append((time.thread_time_ns() - start) / requests / 1e3)
        rows.append((name, min(blocks), what))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="bodies per block")
    args = parser.parse_args(argv)
    print(f"Python {sys.version.split()[0]}, CPU µs per body, best of 7 blocks")
    for name, us, what in validation_us(args.requests):
        print(f"{name:40s} {us:8.1f} µs  {what}")


if __name__ == "__main__":
    main()
