"""Rows Z1–Z4 of `make bench` (benchmarks/run.py): JSON answers compressed by Accept-Encoding,
for each coding the service makes (g gzip, b br, z zstd) side by side.

Two answers: POST /model with all-MiniLM-L6-v2 on 128 tokens, every output (benchmarks/models.py's
request, about 52 MB of JSON: streamed), and POST /multihead L=384 d=256 h=8, full trace (about
60 MB: streamed). For each, with curl on the loopback (the bytes kept as sent: no --compressed):
Z1/Z3 the bytes on the wire ÷ the identity answer's, Z2/Z4 the time from request to last byte
(computing, encoding, compressing and sending) ÷ the same request without compression (the sides
alternating, medians). Each coding's answer is first decoded here and checked equal to the
identity answer byte for byte. The loopback sends for free; the detail says what a 100 Mbit/s
link would take for each side (the answer's bytes at that rate, or its time if longer).
"""

import json
import statistics
import subprocess
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

CODINGS = {"g": "gzip", "b": "br", "z": "zstd"}
IDS = [f"Z{n}{c}" for n in "1234" for c in CODINGS]
BYTES_TARGET = 0.5  # a JSON answer of float64s keeps at most half its bytes
TIME_TARGET = 1.5  # compression adds at most half the answer's time where sending is free
LINK_BYTES_PER_SECOND = 100e6 / 8  # the detail's 100 Mbit/s link
WHAT = {
    "Z1": "POST /model minilm 128 tokens, JSON: compressed bytes ÷ identity",
    "Z2": "POST /model minilm 128 tokens, JSON: time to the last byte compressed ÷ identity",
    "Z3": "POST /multihead L=384 d=256 h=8, JSON: compressed bytes ÷ identity",
    "Z4": "POST /multihead L=384 d=256 h=8, JSON: time to the last byte compressed ÷ identity",
}


def _decode(coding: str, data: bytes) -> bytes:
    import brotli
    import zstandard

    if coding == "gzip":
        return zlib.decompress(data, 16 + zlib.MAX_WBITS)
    if coding == "br":
        return brotli.decompress(data)
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def _fetch(url: str, body: Path, coding: str, out: Path) -> float:
    """Seconds from request to the last byte of ``url``'s answer to ``body`` asked for with
    ``Accept-Encoding: coding``, its bytes as sent written to ``out``."""
    start = time.perf_counter()
    status = subprocess.run(
        ["curl", "-s", "-o", str(out), "-w", "%{http_code}", "-H",
         "Content-Type: application/json", "-H", f"Accept-Encoding: {coding}",
         "--data-binary", f"@{body}", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    seconds = time.perf_counter() - start
    assert status == "200", f"{url} answered {status}"
    return seconds


def _measure(url: str, body: Path, tmp: Path, runs: int) -> dict[str, tuple[int, float]]:
    """Each coding's (bytes, median seconds), identity's included, the codings alternating
    within every run; each coded answer checked against the identity one first."""
    out = {c: tmp / f"answer.{c}" for c in ("identity", *CODINGS.values())}
    for coding, path in out.items():
        _fetch(url, body, coding, path)
    plain = out["identity"].read_bytes()
    for coding in CODINGS.values():
        assert _decode(coding, out[coding].read_bytes()) == plain, f"{coding} is not the answer"
    times: dict[str, list[float]] = {c: [] for c in out}
    for _ in range(runs):
        for coding, path in out.items():
            times[coding].append(_fetch(url, body, coding, path))
    return {c: (p.stat().st_size, statistics.median(times[c])) for c, p in out.items()}


def _rows(
    first: str,
    got: dict[str, tuple[int, float]],
    runs: int,
    row: Callable[..., Any],
) -> list[Any]:
    """The bytes row (Z1/Z3) and the time row (Z2/Z4) of each coding."""
    size, seconds = got["identity"]
    link = max(seconds, size / LINK_BYTES_PER_SECOND)
    rows = []
    for letter, coding in CODINGS.items():
        n, s = got[coding]
        coded_link = max(s, n / LINK_BYTES_PER_SECOND)
        rows.append(row(f"{first}{letter}", WHAT[first] + f" ({coding})", n / size, "≤",
                        BYTES_TARGET, f"{n / 1e6:.1f} MB of {size / 1e6:.1f} MB"))  # fmt: skip
        second = f"Z{int(first[1]) + 1}"
        rows.append(row(f"{second}{letter}", WHAT[second] + f" ({coding})", s / seconds, "≤",
                        TIME_TARGET,
                        f"{s * 1e3:.0f} ms vs {seconds * 1e3:.0f} ms on the loopback (medians of "
                        f"{runs}, alternating); at 100 Mbit/s {coded_link:.1f} s vs {link:.1f} s"))  # fmt: skip
    return rows


def _target(rid: str) -> str:
    return f"≤ {BYTES_TARGET if rid[:2] in ('Z1', 'Z3') else TIME_TARGET}"


def z_rows(
    base: str,
    tmp: Path,
    runs: int,
    ids: set[str],
    row: Callable[..., Any],
    skipped: Callable[..., Any],
    multihead: dict[str, Any],
) -> list[Any]:
    """The rows of ``ids`` among Z1–Z4; ``multihead`` is the /multihead request (run.py's
    multihead_body at L=384)."""
    from models import TEXT  # benchmarks/models.py: M1's 128-token text
    from service.config import Settings

    rows: list[Any] = []
    if ids & {i for i in IDS if i[:2] in ("Z1", "Z2")}:
        if (Settings().models_dir / "minilm" / "model.safetensors").is_file():
            body = tmp / "Z1.json"
            body.write_text(json.dumps({"model": "minilm", "text": TEXT, "layer": 0}))
            rows += _rows("Z1", _measure(base + "/model", body, tmp, runs), runs, row)
        else:
            rows += [
                skipped(i, WHAT[i[:2]], "minilm is not installed (make models)", _target(i))
                for i in IDS
                if i[:2] in ("Z1", "Z2")
            ]
    if ids & {i for i in IDS if i[:2] in ("Z3", "Z4")}:
        body = tmp / "Z3.json"
        body.write_bytes(json.dumps(multihead).encode())
        rows += _rows("Z3", _measure(base + "/multihead", body, tmp, runs), runs, row)
    return [r for r in rows if r["id"] in ids]
