"""How a result shows itself: a short ``repr``, and in Jupyter (``_repr_html_``) its L×S maps as
heatmaps with the tokens on the axes, under the comparison with your numbers when there is one.

The HTML is self-contained: inline styles and SVG, no script, nothing loaded from elsewhere
(a large map is one embedded PNG image, one pixel per cell). Every text that came from the
request or the answer (tokens, messages) is escaped.
"""

import base64
import html
import math
import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
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
FAIL, PASS, WARN = "#c0392b", "#27864a", "#b9770e"


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


def png(rgb: npt.NDArray[np.uint8]) -> bytes:
    """``[H][W][3]`` bytes as a PNG file (8-bit RGB, no filter)."""
    height, width, _ = rgb.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), rgb.reshape(height, width * 3)], 1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", head)
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + chunk(b"IEND", b"")
    )


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


def _labels(names: Sequence[str] | None, count: int) -> list[str]:
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


GREY = "color:#666"


def figure(name: str, matrix: Array, rows: Sequence[str], cols: Sequence[str]) -> str:
    """A map with its caption: name, shape, colour range."""
    height, width = matrix.shape
    legend = html.escape(Scale.of(matrix).legend())
    caption = (
        element("b", html.escape(name))
        + " "
        + element("span", f"{height}×{width} · colours {legend}", GREY)
    )
    return element(
        "figure",
        element("figcaption", caption, "margin-bottom:4px") + heatmap(matrix, rows, cols),
        "margin:0 18px 14px 0",
        "map",
        data_name=name,
    )


def slices(name: str, array: Array) -> Iterator[tuple[str, Array]]:
    """A map's ``[L][S]`` slices, named by their leading indices (batch item, head)."""
    if array.ndim < 2 or array.dtype.kind != "f":
        return
    if array.ndim == 2:
        yield name, array
        return
    for index in np.ndindex(array.shape[:-2]):
        yield f"{name}[{', '.join(map(str, index))}]", array[index]


def result_maps(arrays: Mapping[str, Array], multihead: bool) -> list[tuple[str, Array]]:
    """The maps a result draws: every L×S map of ``/attention`` and ``/mask``; on ``/multihead``
    the average weights and each head's weights (the stacked weights when heads were left out)."""
    if not multihead:
        named = [(n, arrays[n]) for n in MAP_NAMES if n in arrays]
    else:
        heads = sorted(
            (n for n in arrays if n.startswith("heads.") and n.endswith(".weights")),
            key=lambda n: int(n.split(".")[1]),
        )
        named = [(n, arrays[n]) for n in ("average_weights",) if n in arrays]
        if heads:
            named += [(f"heads[{n.split('.')[1]}].weights", arrays[n]) for n in heads]
        elif "weights" in arrays:
            named.append(("weights", arrays["weights"]))
    return [pair for name, array in named for pair in slices(name, array)]


def figures(
    maps: list[tuple[str, Array]], rows: Sequence[str] | None, cols: Sequence[str] | None
) -> str:
    """The maps side by side (at most ``MAX_MAPS``, a note for the others)."""
    if not maps:
        return element("p", "No L×S map in this result (see <code>include</code>).", GREY)
    drawn = [
        figure(name, matrix, _labels(rows, matrix.shape[0]), _labels(cols, matrix.shape[1]))
        for name, matrix in maps[:MAX_MAPS]
    ]
    left_out = [name for name, _ in maps[MAX_MAPS:]]
    note = ""
    if left_out:
        names = ", ".join(left_out[:6]) + (" …" if len(left_out) > 6 else "")
        note = element("p", html.escape(f"{len(left_out)} more map(s) not drawn: {names}"), GREY)
    hint = element("p", "rows: queries ↓ · columns: keys →", GREY + ";margin:2px 0 8px")
    row = element("div", "".join(drawn), "display:flex;flex-wrap:wrap;align-items:flex-start")
    return hint + row + note


# -------------------------------------------------------------------------------- comparison


def _code(text: Any) -> str:
    return element("code", html.escape(str(text)))


def _diagnosis(entry: Mapping[str, Any]) -> str:
    """The diagnosis of a mismatch: the mistakes' codes and the explanation."""
    diagnosis = entry.get("diagnosis")
    if not isinstance(diagnosis, Mapping):
        return ""
    mistakes = " + ".join(_code(m) for m in diagnosis.get("mistakes") or [])
    explanation = element(
        "div", html.escape(str(diagnosis.get("explanation", ""))), "margin-top:3px"
    )
    return element("div", f"<b>Diagnosis:</b> {mistakes}{explanation}", "margin:6px 0", "diagnosis")


def _cell(value: Any) -> str:
    """A comparison table's cell: a number, an index or a name, as the answer gives it."""
    return element("td", html.escape("" if value is None else str(value)), "padding:1px 8px")


def _comparison_row(entry: Mapping[str, Any]) -> str:
    """One compared array: ✓ or ✗, the largest difference, where, and the two numbers there."""
    match = entry.get("match")
    mark = element("span", "✓" if match else "✗", f"color:{PASS if match else FAIL}")
    diff = entry.get("max_abs_diff")
    cells = [
        element("td", _code(entry.get("name", "")), "padding:1px 8px"),
        element("td", mark, "padding:1px 8px"),
        _cell("—" if diff is None else f"{diff:.3g}"),
        _cell(entry.get("where")),
        _cell(entry.get("yours")),
        _cell(entry.get("ours")),
    ]
    return "<tr>" + "".join(cells) + "</tr>"


def comparison(entries: Sequence[Mapping[str, Any]], first_mismatch: str | None) -> str:
    """The comparison with your numbers: the verdict, the first mismatch's message and
    diagnosis, then one row per array compared."""
    first = next((e for e in entries if e.get("name") == first_mismatch), None)
    if first is None:
        colour = PASS
        verdict = f"All {len(entries)} array(s) you gave match the service's."
        detail = ""
    else:
        colour = FAIL
        verdict = f"Your numbers differ from the service's, first at {_code(first_mismatch)}."
        message = html.escape(str(first.get("message", "")))
        detail = element("div", message, "margin:4px 0", "message") + _diagnosis(first)
    titles = ("array", "match", "largest difference", "where", "yours", "service's")
    head = "".join(element("th", t, "padding:1px 8px;text-align:left") for t in titles)
    rows = "".join(_comparison_row(e) for e in entries)
    table = element("table", f"<tr>{head}</tr>{rows}", "border-collapse:collapse;margin-top:4px")
    return element(
        "div",
        element("b", verdict, f"color:{colour}") + detail + table,
        f"border-left:4px solid {colour};padding:4px 10px;margin-bottom:10px",
        "comparison",
    )


def warnings_html(items: Sequence[Mapping[str, Any]]) -> str:
    """The answer's warnings (a mask's polarity), each with its code."""
    lines = "".join(
        element("div", f"{_code(w.get('code', ''))} {html.escape(str(w.get('message', '')))}")
        for w in items
    )
    return element(
        "div",
        element("b", "Warning", f"color:{WARN}") + lines,
        f"border-left:4px solid {WARN};padding:4px 10px;margin-bottom:10px",
        "warnings",
    )


# ---------------------------------------------------------------------------- whole results


def _shape(arrays: Mapping[str, Array], multihead: bool) -> tuple[int, int, int | None] | None:
    """L, S and the batch size (None: not batched), from the first map of the answer."""
    names = ("average_weights", "heads.0.weights", "weights") if multihead else MAP_NAMES
    for name in names:
        array = arrays.get(name)
        if array is None or array.ndim < 2:
            continue
        unbatched = 3 if multihead and name == "weights" else 2  # the stacked [h][L][S]
        batch = array.shape[0] if array.ndim > unbatched else None
        return array.shape[-2], array.shape[-1], batch
    return None


def _sizes(arrays: Mapping[str, Array], meta: Mapping[str, Any]) -> list[str]:
    """``L × S``, the batch size, h, d_k, d_v and the scale, as far as the answer tells them."""
    parts = []
    shape = _shape(arrays, meta.get("num_heads") is not None)
    if shape is not None:
        parts.append(f"{shape[0]} queries × {shape[1]} keys")
        if shape[2] is not None:
            parts.append(f"batch of {shape[2]}")
    heads, kv_heads = meta.get("num_heads"), meta.get("num_kv_heads")
    if heads is not None:
        parts.append(f"h={heads}" + (f", h_kv={kv_heads}" if kv_heads not in (None, heads) else ""))
    parts += [f"{key}={meta[key]}" for key in ("d_k", "d_v") if meta.get(key) is not None]
    if meta.get("scale") is not None:
        parts.append(f"scale={float(meta['scale']):.6g}")
    return parts


def result_html(arrays: Mapping[str, Array], meta: Mapping[str, Any], kind: str = "Result") -> str:
    """A result (or a head: ``kind``) as HTML: comparison and warnings first, then its maps."""
    parts = []
    if isinstance(meta.get("comparison"), list):
        parts.append(comparison(meta["comparison"], meta.get("first_mismatch")))
    if meta.get("warnings"):
        parts.append(warnings_html(meta["warnings"]))
    sizes = " · ".join(html.escape(p) for p in _sizes(arrays, meta))
    parts.append(element("div", f"{element('b', html.escape(kind))} {sizes}", "margin-bottom:4px"))
    maps = result_maps(arrays, meta.get("num_heads") is not None)
    parts.append(figures(maps, meta.get("tokens"), meta.get("context_tokens") or None))
    style = "font-family:sans-serif;font-size:13px;line-height:1.35"
    return element("div", "".join(parts), style, "attention-result")


def short_repr(arrays: Mapping[str, Array], meta: Mapping[str, Any], kind: str = "Result") -> str:
    """One line: sizes, the arrays there are, the tokens and the comparison's verdict."""
    top = list(dict.fromkeys(n.split(".")[0] for n in arrays))
    heads = meta.get("heads")
    if isinstance(heads, list):
        top = [n for n in top if n != "heads"] + [f"heads[{len(heads)}]"]
    sizes = _sizes(arrays, meta)
    parts = [", ".join(sizes)] if sizes else []
    parts.append("arrays: " + (", ".join(top) or "none"))
    tokens = meta.get("tokens")
    if tokens:
        shown = " ".join(str(t) for t in tokens[:8]) + (" …" if len(tokens) > 8 else "")
        parts.append(f"tokens: {shown}")
    if isinstance(meta.get("comparison"), list):
        parts.append(_verdict(meta["comparison"], meta.get("first_mismatch")))
    return f"{kind}({'; '.join(parts)})"


def _verdict(entries: Sequence[Mapping[str, Any]], first_mismatch: str | None) -> str:
    if first_mismatch is None:
        return f"comparison: all {len(entries)} match"
    first = next((e for e in entries if e.get("name") == first_mismatch), {})
    diagnosis = first.get("diagnosis") if isinstance(first, Mapping) else None
    codes = " + ".join(diagnosis.get("mistakes") or []) if isinstance(diagnosis, Mapping) else ""
    return f"first mismatch: {first_mismatch}" + (f" ({codes})" if codes else "")
