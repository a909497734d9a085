"""A /model answer in Jupyter at paragraph length (issue 43, item 5): ``_repr_html_`` of
all-MiniLM-L6-v2 on a 126-token paragraph stays small (≤ 2 MB, where the answer is 19 MB of
safetensors) and legible: each head a PNG thumbnail of one pixel per query–key pair, its rows
normalised, labelled with its role as head_roles names it; a summary of at most 20 lines; the
traced layer drawn by its average only. PNG files are decoded here with zlib (PNG spec 1.2),
the normalised weights recomputed here with NumPy."""

import base64
import gzip
import html
import json
import re
import struct
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pytest
from attention_client import Client, Result

# 112 words: [CLS] + 124 WordPiece tokens + [SEP] = 126 tokens
PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff, where the wind never stopped and the "
    "sea beat against the rocks below. Every evening the keeper climbed the narrow stairs, lit "
    "the great lamp, and watched its beam sweep across the dark water. Ships passing in the "
    "night trusted that light to guide them safely past the reef. One winter the storms grew so "
    "fierce that the supply boat could not reach the island for weeks, yet the keeper kept the "
    "lamp burning with the last of his oil, and not a single vessel was lost that season. In "
    "spring they rowed out with bread and found him asleep. He smiled."
)
MAX_HTML = 2_000_000  # bytes: the brief's bound (the view measured 0.97 MB)
MAX_SUMMARY_LINES = 20
THUMB = re.compile(
    r'<figure class="thumb" data-layer="(\d+)" data-head="(\d+)"(?: data-role="([a-z_]+)")?[^>]*>'
    r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" width="(\d+)" height="(\d+)"'
    r".*?<figcaption[^>]*>(.*?)</figcaption>"
)


@pytest.fixture(scope="module")
def answer() -> Iterator[Result]:
    with Client.local() as c:
        yield c.model(PARAGRAPH, layer=2)


@pytest.fixture(scope="module")
def page(answer: Result) -> str:
    return answer._repr_html_()


def decode_png(data: bytes) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8] | None]:
    """An 8-bit PNG without interlace: its ``[H][W]`` (indexed, grey) or ``[H][W][3]`` (RGB)
    samples and its palette; only the filter "None" (which the client writes) is accepted."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    idat = b""
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        if kind == b"IDAT":
            idat += body
        chunks[kind] = body
        at += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and interlace == 0 and b"IEND" in chunks
    channels = {0: 1, 2: 3, 3: 1}[colour]
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * channels)
    assert not raw[:, 0].any(), "a filter other than None"
    samples = raw[:, 1:].reshape((height, width, channels) if channels == 3 else (height, width))
    plte = chunks.get(b"PLTE")
    palette = None if plte is None else np.frombuffer(plte, np.uint8).reshape(-1, 3)
    return samples, palette


def thumbs(page: str) -> list[tuple[int, int, str, bytes, int, int, str]]:
    return [
        (int(m[1]), int(m[2]), m[3] or "", base64.b64decode(m[4]), int(m[5]), int(m[6]), m[7])
        for m in THUMB.finditer(page)
    ]


def summary_lines(page: str) -> list[str]:
    found = re.search(r'<div class="model-summary".*?<ul[^>]*>(.*?)</ul>', page, re.S)
    assert found is not None
    return [html.unescape(li) for li in re.findall(r"<li>(.*?)</li>", found[1])]


def test_the_paragraph_is_126_tokens_and_its_view_under_2_mb(answer: Result, page: str) -> None:
    assert len(answer["tokens"]) == 126 and answer.attention.shape == (6, 12, 126, 126)
    size = len(page.encode())
    assert 100_000 < size <= MAX_HTML, size
    assert 'class="attention-result model-view"' in page
    assert "<script" not in page and not re.search(r'(src|href)="(?!data:)', page)


def test_each_head_is_a_126_pixel_png_of_its_rows_normalised(answer: Result, page: str) -> None:
    """Every head once, in order; its PNG one pixel per query–key pair, drawn at 1 CSS pixel a
    pair (126 ≥ 96), its colours the row-normalised weights on 255 levels."""
    found = thumbs(page)
    assert [(t[0], t[1]) for t in found] == [(layer, h) for layer in range(6) for h in range(12)]
    for layer, head, _, data, width, height, _ in found:
        samples, palette = decode_png(data)
        assert samples.shape == (126, 126) and (width, height) == (126, 126)
        assert palette is not None and palette.shape == (256, 3)
        weights = answer.attention[layer, head]
        want = np.rint(weights / weights.max(axis=1, keepdims=True) * 254)
        np.testing.assert_array_equal(samples, want)
        assert (samples.max(axis=1) == 254).all()  # every row's darkest key drawn darkest
    assert palette is not None
    (white, dark) = palette[0], palette[254]
    assert tuple(white) == (247, 251, 255) and tuple(dark) == (8, 48, 107)


def test_each_thumbnail_is_labelled_with_its_heads_role(answer: Result, page: str) -> None:
    roles = answer["head_roles"]
    for layer, head, role, _, _, _, caption in thumbs(page):
        scores = roles[layer][head]
        assert role == (scores["role"] or "")
        shown = html.unescape(re.sub(r"<[^>]+>", "", caption))
        want = f"H{head} " + (f"{scores['role']} {scores[scores['role']]:.2f}" if role else "—")
        assert shown == want
    assert sum(1 for r in roles for s in r if s["role"]) > 0  # some heads have one


def test_the_summary_names_the_roles_and_the_strongest_links_in_20_lines(
    answer: Result, page: str
) -> None:
    lines = summary_lines(page)
    assert 0 < len(lines) <= MAX_SUMMARY_LINES
    roles = {s["role"] for layer in answer["head_roles"] for s in layer if s["role"]}
    named = {line.split(":")[0] for line in lines}
    assert roles <= named
    tokens, links = answer["tokens"], []
    for line in lines:
        found = re.fullmatch(r"(.+) \[(\d+)\] → (.+) \[(\d+)\]: ([0-9.]+) \(L(\d) H(\d+).*\)", line)
        if found is None:
            continue
        query, key, layer, head = int(found[2]), int(found[4]), int(found[6]), int(found[7])
        assert (found[1], found[3]) == (tokens[query], tokens[key])
        assert abs(query - key) > 1 and not {tokens[query], tokens[key]} & {"[CLS]", "[SEP]"}
        assert float(found[5]) == pytest.approx(answer.attention[layer, head, query, key], abs=5e-3)
        links.append(float(found[5]))
    assert len(links) >= 5 and links == sorted(links, reverse=True)
    assert "lamp [90] → lamp [38]: 0.78 (L2 H9)" in lines  # docs/guide-notebook.md's example
    # the strongest link of all (neither neighbours nor special) is the first line's
    a = answer.attention.copy()
    n = a.shape[-1]
    i, j = np.indices((n, n))
    a[..., (np.abs(i - j) <= 1) | (i == 0) | (j == 0) | (i == n - 1) | (j == n - 1)] = 0
    assert links[0] == pytest.approx(a.max(), abs=5e-3)


def test_the_traced_layer_is_named_and_only_its_average_drawn(page: str) -> None:
    trace = page[page.index('class="model-trace"') :]
    assert "Trace of layer 2" in trace
    assert re.findall(r'data-name="([^"]+)"', trace) == ["average_weights"]
    assert "layer 2 (traced)" in page


def test_the_trace_is_a_result_of_its_own(answer: Result) -> None:
    trace = answer.trace
    assert trace is not None and trace.num_heads == 12
    np.testing.assert_array_equal(trace.heads[3].weights, answer["trace.heads.3.weights"])
    np.testing.assert_allclose(trace.heads[3].weights, answer.attention[2, 3], atol=1e-9)
    assert 'data-name="weights"' in trace.heads[3]._repr_html_()


def test_normalise_heads_or_none_and_nothing_else(answer: Result) -> None:
    by_map = str(answer.model_view("heads"))
    assert "each map divided by its own largest weight" in by_map
    (first, *_) = thumbs(by_map)
    samples, _ = decode_png(first[3])
    weights = answer.attention[0, 0]
    np.testing.assert_array_equal(samples, np.rint(weights / weights.max() * 254))
    with pytest.raises(ValueError, match="normalise must be one of rows, heads, none"):
        answer.model_view("columns")  # type: ignore[arg-type]


def test_include_asks_only_for_what_is_drawn() -> None:
    """``include`` reaches the service: the answer holds those outputs only, and the view says
    which of its parts are not in it."""
    with Client.local() as c:
        small = c.model(PARAGRAPH, include=["tokens", "head_roles"])
    assert not small.arrays and set(small.json) == {"tokens", "head_roles"}
    page = small._repr_html_()
    assert (
        "Not in this answer: <code>attention</code>, <code>rollout</code>, <code>trace</code>"
        in page
    )
    assert "<img" not in page and len(summary_lines(page)) <= MAX_SUMMARY_LINES


class _Gzipped(BaseHTTPRequestHandler):
    """Answers every POST with a small /model-shaped JSON answer, gzip-compressed when (and
    only when) the request accepts gzip, and remembers what it was sent."""

    seen: ClassVar[list[dict[str, str]]] = []
    answer: ClassVar[dict[str, Any]] = {
        "tokens": ["[CLS]", "hi", "[SEP]"],
        "rollout": [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]],
    }

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append(dict(self.headers))
        body = json.dumps(self.answer).encode()
        zipped = "gzip" in self.headers.get("Accept-Encoding", "")
        if zipped:
            body = gzip.compress(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if zipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_json_answers_are_asked_for_gzipped_and_read_back() -> None:
    """Over a real socket: the JSON client sends ``Accept-Encoding: gzip`` (httpx's default,
    which the client keeps) and reads a gzipped answer as the plain one."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gzipped)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with Client(f"http://127.0.0.1:{server.server_port}", binary=False) as c:
            got = c.model("hi", include=["tokens", "rollout"])
    finally:
        server.shutdown()
        server.server_close()
    assert "gzip" in _Gzipped.seen[-1]["Accept-Encoding"]
    assert got["tokens"] == ["[CLS]", "hi", "[SEP]"]
    np.testing.assert_array_equal(got.rollout, np.array(_Gzipped.answer["rollout"]))
