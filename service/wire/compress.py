"""JSON answers compressed for the content coding the client accepts (service.wire.media's
``content_coding``): a whole answer in one call, a streamed one chunk by chunk as it is encoded
(one compressor per answer: the answer is never held whole).

Levels (measured on a 128-token POST /model JSON answer, 52 MB, on the machine
docs/performance.md names): level 1 of each coding. Numbers printed as shortest floats are
mostly digits that no coding squeezes far: zstd 1 keeps 40 % of the bytes at ~330 MB/s, zstd 3
44 % at ~140 MB/s; brotli 1 43 % at ~200 MB/s, brotli 4 44 % at ~50 MB/s; gzip 1 47 % at
~110 MB/s, gzip 6 43 % at ~16 MB/s (3 s for that answer). Higher levels cost several times the
time for a few per cent.

References: RFC 9110 §8.4.1 (content codings), RFC 1952 (gzip), RFC 7932 (brotli), RFC 8878
(zstd).
"""

import zlib
from collections.abc import Callable, Iterator
from typing import cast

import brotli
import zstandard

from service.wire.media import Coding

MIN_BYTES = 1024  # answers shorter than this go out as they are (framing outweighs the gain)
LEVELS: dict[Coding, int] = {"zstd": 1, "br": 1, "gzip": 1}
# a compressor's own memory while an answer streams through it (measured as RSS: zstd 1 about
# 1.1 MiB, brotli 1 about 0.9 MiB, gzip 1 about 0.26 MiB), counted in the memory budget
STATE_BYTES: dict[Coding, int] = {"zstd": 2 << 20, "br": 2 << 20, "gzip": 1 << 19}
GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib's deflate with the gzip header and trailer

Chunk = bytes | memoryview


def compressed(coding: Coding, data: bytes) -> bytes:
    """``data`` coded as ``coding`` in one call."""
    level = LEVELS[coding]
    if coding == "gzip":
        return zlib.compress(data, level, wbits=GZIP_WBITS)
    if coding == "br":
        return brotli.compress(data, quality=level)
    return zstandard.ZstdCompressor(level=level).compress(data)


def _compressor(coding: Coding) -> tuple[Callable[[Chunk], bytes], Callable[[], bytes]]:
    """A fresh compressor for ``coding``: its feed and its end."""
    level = LEVELS[coding]
    if coding == "gzip":
        z = zlib.compressobj(level, zlib.DEFLATED, GZIP_WBITS)
        return z.compress, z.flush
    if coding == "br":
        b = brotli.Compressor(quality=level)
        return lambda chunk: b.process(cast(bytes, chunk)), b.finish  # takes any buffer
    s = zstandard.ZstdCompressor(level=level).compressobj()
    return s.compress, s.flush


def compressing(coding: Coding, chunks: Iterator[Chunk]) -> Iterator[bytes]:
    """The pieces of ``chunks`` coded as ``coding`` as they come (a piece only when the
    compressor has output: it gathers input into blocks of its own), then its end."""
    feed, end = _compressor(coding)
    for chunk in chunks:
        out = feed(chunk)
        if out:
            yield out
    yield end()
