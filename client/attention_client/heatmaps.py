"""A matrix as a heatmap for Jupyter: colours by a sequential or diverging scale, masked and
non-finite cells marked, values printed in small maps, the tokens on the axes; a large map is
one embedded PNG image (one pixel per cell, averaged over blocks beyond MAX_PIXELS). Inline
SVG and styles only, every text escaped (:mod:`attention_client.display` puts them together).
"""

import base64
import html
import math
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
RGB = tuple[int, int, int]

# the L×S maps, in the order of the steps
MAP_NAMES = (
    "scores", "scaled_scores", "capped_scores", "position_bias", "biased_scores",
    "masked_scores", "weights", "average_weights",
)  # fmt: skip
VALUES_UP_TO = 16  # queries and keys: values are printed in the cells up to this many
RECTS_UP_TO = 32  # queries and keys: one SVG rectangle per cell up to this many, else an image
MAX_SIDE = 480  # pixels: the longest side a map is drawn at
VALUE_CELL = 38  # pixels: a cell that shows its value (fewer pixels above 12 tokens)
PLAIN_CELL = 16  # pixels: the largest cell that shows only its colour
LABEL_CHARS = 12  # a longer token is cut, with "…"
CHAR_WIDTH = 6.5  # pixels per character of an 11 px label (an estimate, for the margins)
MAX_MAPS = 12  # maps drawn for one result
MAX_PIXELS = 2 * MAX_SIDE  # an image's side; a larger map is averaged over blocks of cells

SEQUENTIAL = ((0.0, (247, 251, 255)), (0.5, (107, 174, 214)), (1.0, (8, 48, 107)))
DIVERGING = ((0.0, (33, 102, 172)), (0.5, (247, 247, 247)), (1.0, (178, 24, 43)))
MINUS_INFINITY: RGB = (215, 215, 215)  # a masked score
NOT_FINITE: RGB = (255, 214, 140)  # NaN or +∞


# ----------------------------------------------------------------------------------- numbers


def number(value: float) -> str:
    """A cell's value, short: 2 decimals below 10, 1 below 100, none above; −∞ as "-∞"."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "-∞" if value < 0 else "∞"
    size = abs(value)
    if size >= 1e4:
        return f"{value:.0e}"
    if size >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if size >= 10 else f"{value:.2f}"


@dataclass(frozen=True)
class Scale:
    """How a map's values become colours: sequential from 0 for maps with no negative value
    (weights), diverging around 0 otherwise (scores)."""

    low: float
    high: float
    stops: tuple[tuple[float, RGB], ...]

    @classmethod
    def of(cls, matrix: Array) -> "Scale":
        finite = matrix[np.isfinite(matrix)]
        low = float(finite.min()) if finite.size else 0.0
        high = float(finite.max()) if finite.size else 0.0
        if low >= 0:
            return cls(0.0, high if high > 0 else 1.0, SEQUENTIAL)
        bound = max(-low, high)
        return cls(-bound, bound, DIVERGING)

    def legend(self) -> str:
        return f"{number(self.low)} … {number(self.high)}"


def colours(matrix: Array, scale: Scale) -> npt.NDArray[np.uint8]:
    """The map's colours, ``[L][S][3]`` bytes (−∞ grey, NaN and +∞ orange)."""
    finite = np.isfinite(matrix)
    values = np.where(finite, matrix, scale.low).astype(np.float64)
    position = (values - scale.low) / (scale.high - scale.low)
    where = [stop for stop, _ in scale.stops]
    rgb = np.stack(
        [np.interp(position, where, [c[i] for _, c in scale.stops]) for i in range(3)], axis=-1
    )
    rgb[np.isneginf(matrix)] = MINUS_INFINITY
    rgb[~finite & ~np.isneginf(matrix)] = NOT_FINITE
    return np.rint(rgb).astype(np.uint8)


def _ink(rgb: Sequence[int]) -> str:
    """Dark text on a light cell, white on a dark one."""
    light = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    return "#111" if light > 140 else "#fff"


def _hex(rgb: Sequence[int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*(int(c) for c in rgb))


# ------------------------------------------------------------------------------------ images


def _chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC-32 of type and data."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(rgb: npt.NDArray[np.uint8]) -> bytes:
    """``[H][W][3]`` bytes as a PNG file (8-bit RGB, no filter)."""
    height, width, _ = rgb.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), rgb.reshape(height, width * 3)], 1)
    head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", head)
        + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + _chunk(b"IEND", b"")
    )


def palette_png(indices: npt.NDArray[np.uint8], palette: npt.NDArray[np.uint8]) -> bytes:
    """``[H][W]`` palette indices and their ``[N][3]`` colours (N ≤ 256) as an indexed PNG
    (colour type 3, 8-bit, one byte a pixel: a third of :func:`png`'s raw size; PNG spec 1.2,
    §4.1.2 PLTE)."""
    height, width = indices.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), indices.astype(np.uint8)], 1)
    head = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", head)
        + _chunk(b"PLTE", palette.astype(np.uint8).tobytes())
        + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + _chunk(b"IEND", b"")
    )


def data_uri(data: bytes) -> str:
    """A PNG file as a ``data:`` URI, for an ``<img src>`` or an SVG ``<image href>``."""
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def shrink(rgb: npt.NDArray[np.uint8], block: int) -> npt.NDArray[np.uint8]:
    """The image averaged over ``block``×``block`` cells (the edge blocks over what they hold)."""
    if block <= 1:
        return rgb
    height, width, _ = rgb.shape
    tall, wide = -(-height // block), -(-width // block)
    padded = np.full((tall * block, wide * block, 3), np.nan)
    padded[:height, :width] = rgb
    blocks = padded.reshape(tall, block, wide, block, 3)
    averaged: npt.NDArray[np.float64] = np.nanmean(blocks, axis=(1, 3))
    return np.rint(averaged).astype(np.uint8)


# -------------------------------------------------------------------------------------- maps


def label(text: str) -> str:
    """A token as an axis label: cut to ``LABEL_CHARS``, escaped."""
    short = text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1] + "…"
    return html.escape(short)


def labels(names: Sequence[str] | None, count: int) -> list[str]:
    """The axis labels: the tokens when there is one per row (or column), else the indices."""
    if names is not None and len(names) == count:
        return [str(n) for n in names]
    return [str(i) for i in range(count)]


def _cell_size(longest: int, values: bool) -> float:
    if values:
        return float(min(VALUE_CELL, MAX_SIDE // longest))
    return min(float(PLAIN_CELL), MAX_SIDE / longest)


def heatmap(matrix: Array, rows: Sequence[str], cols: Sequence[str]) -> str:
    """One ``[L][S]`` map as an SVG: queries down the left, keys along the top."""
    height, width = matrix.shape
    longest = max(height, width, 1)
    values = longest <= VALUES_UP_TO
    cell = _cell_size(longest, values)
    scale = Scale.of(matrix)
    rgb = colours(matrix, scale)
    step = max(1, math.ceil(11 / cell))  # every step-th label, so that they do not overlap
    left = 8 + CHAR_WIDTH * max((min(len(r), LABEL_CHARS) for r in rows[::step]), default=1)
    top = 8 + CHAR_WIDTH * max((min(len(c), LABEL_CHARS) for c in cols[::step]), default=1)
    body = (
        _cells(matrix, rgb, cell, (left, top), rows, cols, values)
        if longest <= RECTS_UP_TO
        else [_image(rgb, cell, (left, top))]
    )
    size = (left + width * cell + 2, top + height * cell + 2)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{size[0]:.0f}" height="{size[1]:.0f}" '
        'style="font-family:sans-serif;font-size:11px">'
        + "".join(_row_labels(rows, cell, (left, top), step))
        + "".join(_col_labels(cols, cell, (left, top), step))
        + "".join(body)
        + "</svg>"
    )


def _row_labels(
    rows: Sequence[str], cell: float, at: tuple[float, float], step: int
) -> Iterator[str]:
    left, top = at
    for i in range(0, len(rows), step):
        y = top + (i + 0.5) * cell
        yield (
            f'<text class="query" x="{left - 4:.1f}" y="{y:.1f}" text-anchor="end" '
            f'dominant-baseline="middle">{label(rows[i])}</text>'
        )


def _col_labels(
    cols: Sequence[str], cell: float, at: tuple[float, float], step: int
) -> Iterator[str]:
    left, top = at
    for j in range(0, len(cols), step):
        x = left + (j + 0.5) * cell
        yield (
            f'<text class="key" transform="translate({x:.1f},{top - 4:.1f}) rotate(-90)" '
            f'dominant-baseline="middle">{label(cols[j])}</text>'
        )


def _cells(
    matrix: Array,
    rgb: npt.NDArray[np.uint8],
    cell: float,
    at: tuple[float, float],
    rows: Sequence[str],
    cols: Sequence[str],
    values: bool,
) -> Iterator[str]:
    """One rectangle per cell; with ``values`` its number on it and a tooltip."""
    left, top = at
    font = min(11.0, cell / 3.4)
    for i, j in np.ndindex(matrix.shape):
        x, y = left + j * cell, top + i * cell
        colour: list[int] = rgb[i, j].tolist()
        fill = _hex(colour)
        rect = (
            f'<rect class="cell" x="{x:.1f}" y="{y:.1f}" width="{cell:.1f}" '
            f'height="{cell:.1f}" fill="{fill}"'
        )
        if not values:
            yield rect + "/>"
            continue
        value = float(matrix[i, j])
        tip = f"{label(rows[i])} → {label(cols[j])}: {value!r}"
        yield f'{rect} stroke="#fff" stroke-width="1"><title>{tip}</title></rect>'
        yield (
            f'<text x="{x + cell / 2:.1f}" y="{y + cell / 2:.1f}" text-anchor="middle" '
            f'dominant-baseline="central" font-size="{font:.1f}" fill="{_ink(colour)}" '
            f'pointer-events="none">{number(value)}</text>'
        )


def _image(rgb: npt.NDArray[np.uint8], cell: float, at: tuple[float, float]) -> str:
    """The whole map as one PNG image, drawn at ``cell`` pixels per cell."""
    height, width, _ = rgb.shape
    block = math.ceil(max(height, width) / MAX_PIXELS)
    data = base64.b64encode(png(shrink(rgb, block))).decode("ascii")
    return (
        f'<image x="{at[0]:.1f}" y="{at[1]:.1f}" width="{width * cell:.1f}" '
        f'height="{height * cell:.1f}" preserveAspectRatio="none" '
        f'style="image-rendering:pixelated" href="data:image/png;base64,{data}"/>'
    )


def element(tag: str, inner: str, style: str = "", css_class: str = "", **attributes: str) -> str:
    """``<tag class="css_class" style="style" …>inner</tag>`` (attribute values escaped;
    ``data_name`` becomes ``data-name``)."""
    pairs = {"class": css_class, **attributes, "style": style}
    shown = "".join(f' {k.replace("_", "-")}="{html.escape(v)}"' for k, v in pairs.items() if v)
    return f"<{tag}{shown}>{inner}</{tag}>"
