"""A ``/model`` answer in Jupyter, legible and small at paragraph length (128 tokens).

What ``_repr_html_`` draws, top to bottom:

- the comparison with your numbers, when the request had ``expected`` (it is the traced
  layer's, :func:`attention_client.display.comparison`);
- a summary of the heads that matter in at most ``MAX_SUMMARY_LINES`` lines: each role of
  ``head_roles`` with its strongest heads, then the strongest links between two words that are
  neither neighbours nor special tokens;
- the layers × heads grid: each head's ``[L][L]`` weights as one small indexed PNG (one pixel
  per query–key pair, drawn at a whole number of pixels per pair), its rows normalised by
  default (each row divided by its own largest weight: a 128-key softmax row whose weights are
  all near 1/128 would otherwise be white), labelled with its head's role;
- the rollout as one heatmap with the tokens on its axes;
- the traced layer as ``/multihead`` shows it, but only its average weights drawn (its heads are
  the grid's row): ``result.trace.heads[h]`` draws one head's maps large.

About 0.97 MB of HTML for all-MiniLM-L6-v2 at 126 tokens, where the answer itself is 19 MB of
safetensors (50 MB of JSON). The maps are PNG files written with NumPy and zlib
(:mod:`attention_client.heatmaps`); no script, nothing loaded from elsewhere, every token
escaped. BertViz's model view (Vig 2019) embeds every weight as JSON instead.
"""

import html
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from attention_client.display import GREY, comparison, figure, result_maps, sizes, warnings_html
from attention_client.heatmaps import (
    NOT_FINITE,
    SEQUENTIAL,
    Array,
    data_uri,
    element,
    heatmap,
    labels,
    palette_png,
)

Normalise = Literal["rows", "heads", "none"]

# head_roles' six scores, in the contract's order (API.md, "Trained models")
ROLES = ("previous_token", "next_token", "self", "first_token", "last_token", "induction")
THUMB_SIDE = 96  # CSS pixels: the least a thumbnail's side is drawn at
MAX_THUMB_CELLS = 192  # query–key pairs a side: beyond, a thumbnail averages blocks of pairs
LEVELS = 255  # palette entries for the weights; entry 255 marks a NaN (never expected)
MAX_SUMMARY_LINES = 20
HEADS_PER_ROLE = 4  # heads named on a role's line
MAX_LINKS = 10
SPECIAL = re.compile(r"^(\[[A-Z]+\]|<\|?/?[A-Za-z_]+\|?>)$")  # [CLS], [SEP], [BOS], <s>, …
TRACE_ATOL = 1e-9  # the traced layer: the one whose heads' weights the trace's equal to this

CAPTIONS: Mapping[Normalise, str] = {
    "rows": "each row divided by its own largest weight (darkest: the key that query attends "
    "to most), so a 128-key row is not white; compare rows within a map, not the shades of "
    "two maps",
    "heads": "each map divided by its own largest weight",
    "none": "the weights as they are, 0 white … 1 darkest",
}


def _by_rows(matrix: Array) -> Array:
    peak = matrix.max(axis=-1, keepdims=True)
    out: Array = np.divide(matrix, peak, out=np.zeros_like(matrix), where=peak > 0)
    return out


def _by_map(matrix: Array) -> Array:
    peak = float(np.nanmax(matrix)) if matrix.size else 0.0
    return matrix / peak if peak > 0 else np.zeros_like(matrix)


NORMALISERS: Mapping[Normalise, Callable[[Array], Array]] = {
    "rows": _by_rows,
    "heads": _by_map,
    "none": lambda matrix: np.clip(matrix, 0.0, 1.0),
}


def is_model_answer(arrays: Mapping[str, Array], meta: Mapping[str, Any]) -> bool:
    """Whether an answer is ``/model``'s: it has one of the outputs only ``/model`` has."""
    attention = arrays.get("attention")
    return (
        "head_roles" in meta
        or "rollout" in arrays
        or (attention is not None and attention.ndim == 4)
        or isinstance(meta.get("trace"), Mapping)
    )


# ------------------------------------------------------------------------------- thumbnails


def palette() -> npt.NDArray[np.uint8]:
    """``LEVELS`` colours of the sequential scale (white … dark blue), then the NaN colour."""
    where = np.linspace(0.0, 1.0, LEVELS)
    stops = [stop for stop, _ in SEQUENTIAL]
    ramp = np.stack(
        [np.interp(where, stops, [c[i] for _, c in SEQUENTIAL]) for i in range(3)], axis=-1
    )
    return np.vstack([np.rint(ramp), [NOT_FINITE]]).astype(np.uint8)


def levels(normalised: Array) -> npt.NDArray[np.uint8]:
    """Values in [0, 1] as palette indices (0 … LEVELS − 1; NaN: LEVELS)."""
    finite = np.isfinite(normalised)
    scaled = np.rint(np.clip(np.where(finite, normalised, 0.0), 0.0, 1.0) * (LEVELS - 1))
    return np.where(finite, scaled, LEVELS).astype(np.uint8)


def blocks(matrix: Array) -> Array:
    """The map averaged over blocks of pairs when a side is longer than ``MAX_THUMB_CELLS``."""
    block = math.ceil(max(matrix.shape) / MAX_THUMB_CELLS)
    if block <= 1:
        return matrix
    tall, wide = (-(-n // block) for n in matrix.shape)
    padded = np.full((tall * block, wide * block), np.nan)
    padded[: matrix.shape[0], : matrix.shape[1]] = matrix
    averaged: Array = np.nanmean(padded.reshape(tall, block, wide, block), axis=(1, 3))
    return averaged


def thumbnail_png(matrix: Array, normalise: Normalise) -> bytes:
    """One head's ``[L][L]`` weights as an indexed PNG, one pixel per pair (or per block)."""
    return palette_png(levels(NORMALISERS[normalise](blocks(matrix))), palette())


def pixels_per_pair(side: int) -> int:
    """The whole number of CSS pixels a pair is drawn at: at least ``THUMB_SIDE`` in all."""
    return max(1, math.ceil(THUMB_SIDE / max(side, 1)))


def role_of(scores: Mapping[str, Any] | None) -> tuple[str | None, float | None]:
    """A head's role and that role's score (None, None: no role, or head_roles not sent)."""
    if not isinstance(scores, Mapping) or not scores.get("role"):
        return None, None
    role = str(scores["role"])
    value = scores.get(role)
    return role, float(value) if isinstance(value, int | float) else None


def _tooltip(layer: int, head: int, scores: Mapping[str, Any] | None) -> str:
    shown = [f"layer {layer}, head {head}"]
    if isinstance(scores, Mapping):
        shown += [
            f"{name} {scores[name]:.3f}"
            for name in (*ROLES, "entropy_bits")
            if isinstance(scores.get(name), int | float)
        ]
    return " · ".join(shown)


def thumbnail(
    matrix: Array, layer: int, head: int, scores: Mapping[str, Any] | None, normalise: Normalise
) -> str:
    """A head's map as an ``<img>`` with its caption: the head and its role."""
    image = blocks(matrix)
    step = pixels_per_pair(image.shape[0])
    role, score = role_of(scores)
    named = "—" if role is None else f"{role} {score:.2f}" if score is not None else role
    img = (
        f'<img src="{data_uri(thumbnail_png(matrix, normalise))}" width="{image.shape[1] * step}" '
        f'height="{image.shape[0] * step}" style="image-rendering:pixelated;display:block;'
        f'border:1px solid #ddd" alt="layer {layer} head {head}" '
        f'title="{html.escape(_tooltip(layer, head, scores))}">'
    )
    caption = element("figcaption", f"<b>H{head}</b> {html.escape(named)}", "font-size:11px")
    return element(
        "figure",
        img + caption,
        "margin:0",
        "thumb",
        data_layer=str(layer),
        data_head=str(head),
        data_role=role or "",
    )


def grid(
    attention: Array,
    roles: Sequence[Sequence[Mapping[str, Any]]] | None,
    normalise: Normalise,
    traced: int | None,
) -> str:
    """The layers × heads grid, a row per layer (the traced layer's outlined)."""
    rows = []
    for layer in range(attention.shape[0]):
        cells = "".join(
            element(
                "td",
                thumbnail(
                    attention[layer, head], layer, head, _scores(roles, layer, head), normalise
                ),
                "padding:2px;vertical-align:top",
            )
            for head in range(attention.shape[1])
        )
        mark = " (traced)" if layer == traced else ""
        name = element("th", f"layer {layer}{mark}", "padding:2px 6px;text-align:right;" + GREY)
        outline = "outline:2px solid #6baed6" if layer == traced else ""
        rows.append(element("tr", name + cells, outline))
    table = element("table", "".join(rows), "border-collapse:collapse", "model-grid")
    note = element(
        "p",
        "Each head's weights, a row per layer (scroll sideways for every head), queries ↓ "
        f"keys →, one square per query–key pair; "
        f"{CAPTIONS[normalise]}. Role: the largest of the head's six <code>head_roles</code> "
        "scores when it is ≥ 0.5 (— none); hover a map for all six. The weights themselves: "
        "<code>result.attention[layer, head]</code>.",
        GREY + ";margin:2px 0 6px;max-width:60em",
        "grid-caption",
    )
    return note + element("div", table, "overflow-x:auto;margin-bottom:12px")


def _scores(
    roles: Sequence[Sequence[Mapping[str, Any]]] | None, layer: int, head: int
) -> Mapping[str, Any] | None:
    try:
        return roles[layer][head] if roles is not None else None
    except (IndexError, TypeError):
        return None


# ---------------------------------------------------------------------------------- summary


def role_lines(roles: Sequence[Sequence[Mapping[str, Any]]]) -> list[str]:
    """One line per role present (its number of heads, the strongest ones), then the heads
    with none."""
    found: dict[str, list[tuple[float, int, int]]] = {}
    without = 0
    for layer, heads in enumerate(roles):
        for head, scores in enumerate(heads):
            role, score = role_of(scores)
            if role is None:
                without += 1
            else:
                found.setdefault(role, []).append((score or 0.0, layer, head))
    lines = []
    for role in sorted(found, key=lambda r: ROLES.index(r) if r in ROLES else len(ROLES)):
        ranked = sorted(found[role], reverse=True)
        named = ", ".join(f"L{layer} H{head} {score:.2f}" for score, layer, head in ranked[:4])
        more = f" (+{len(ranked) - HEADS_PER_ROLE} more)" if len(ranked) > HEADS_PER_ROLE else ""
        lines.append(f"{role}: {_heads(len(ranked))}: {named}{more}")
    if without:
        lines.append(f"no role (no score ≥ 0.5): {_heads(without)}")
    return lines


def _heads(n: int) -> str:
    return f"{n} head" + ("" if n == 1 else "s")


def link_lines(
    tokens: Sequence[str],
    attention: Array,
    roles: Sequence[Sequence[Mapping[str, Any]]] | None,
    count: int,
) -> list[str]:
    """The ``count`` strongest links over all heads between two tokens that are neither
    neighbours (|i − j| ≤ 1) nor special, each pair of positions once, with its head."""
    n = attention.shape[-1]
    if len(tokens) != n or count <= 0:
        return []
    ordinary = np.array([SPECIAL.match(t) is None for t in tokens])
    i, j = np.indices((n, n))
    allowed = ordinary[:, None] & ordinary[None, :] & (np.abs(i - j) > 1)
    weights = np.where(allowed, np.nan_to_num(attention, nan=-1.0), -1.0).reshape(-1)
    # each pair of positions can take at most one head's place: the top count × heads suffice
    top = min(weights.size, count * attention.shape[0] * attention.shape[1])
    candidates = np.argpartition(weights, weights.size - top)[weights.size - top :]
    ranked = candidates[np.argsort(-weights[candidates], kind="stable")]
    lines: list[str] = []
    seen: set[tuple[int, int]] = set()
    for flat in ranked:
        if weights[flat] <= 0 or len(lines) == count:
            break
        layer, head, query, key = np.unravel_index(flat, attention.shape)
        if (int(query), int(key)) in seen:
            continue
        seen.add((int(query), int(key)))
        role, _ = role_of(_scores(roles, int(layer), int(head)))
        lines.append(
            f"{tokens[query]} [{query}] → {tokens[key]} [{key}]: {weights[flat]:.2f} "
            f"(L{layer} H{head}" + (f", {role}" if role else "") + ")"
        )
    return lines


def summary_lines(
    tokens: Sequence[str] | None,
    attention: Array | None,
    roles: Sequence[Sequence[Mapping[str, Any]]] | None,
) -> list[str]:
    """The summary: role lines, then the strongest links, ``MAX_SUMMARY_LINES`` in all."""
    lines = role_lines(roles) if roles is not None else []
    if tokens is not None and attention is not None and attention.ndim == 4:
        lines += link_lines(
            tokens, attention, roles, min(MAX_LINKS, MAX_SUMMARY_LINES - len(lines))
        )
    return lines[:MAX_SUMMARY_LINES]


def summary(
    tokens: Sequence[str] | None,
    attention: Array | None,
    roles: Sequence[Sequence[Mapping[str, Any]]] | None,
) -> str:
    lines = summary_lines(tokens, attention, roles)
    if not lines:
        return ""
    items = "".join(element("li", html.escape(line)) for line in lines)
    caption = element(
        "p",
        "The heads that matter: each role with its strongest heads (L layer, H head, the "
        "role's score), then the strongest links between words that are neither neighbours "
        "nor special tokens (query [position] → key [position]: weight, head).",
        GREY + ";margin:2px 0;max-width:60em",
    )
    return element(
        "div",
        caption + element("ul", items, "margin:2px 0 10px;padding-left:1.4em"),
        css_class="model-summary",
    )


# --------------------------------------------------------------------- rollout, trace, whole


ROLLOUT_CAPTIONS: Mapping[Normalise, str] = {
    **CAPTIONS,
    "rows": "each row divided by its largest weight to another ordinary token; its weight to "
    "itself and to the special tokens ([CLS], [SEP]: most of a row, where every layer's "
    "attention ends up) clipped to the darkest",
}


def ordinary_rows(matrix: Array, tokens: Sequence[str] | None) -> Array:
    """Each row divided by its largest weight to a key that is neither itself nor a special
    token (``SPECIAL``), clipped to [0, 1]."""
    n = matrix.shape[-1]
    special = np.array([SPECIAL.match(t) is not None for t in tokens or []] or [False] * n)
    left_out = (np.eye(*matrix.shape) > 0) | (special[None, :] if len(special) == n else False)
    others = np.where(left_out, -np.inf, matrix)
    peak = others.max(axis=-1, keepdims=True)
    scaled = np.divide(matrix, peak, out=np.ones_like(matrix), where=peak > 0)
    clipped: Array = np.clip(scaled, 0.0, 1.0)
    return clipped


def rollout(matrix: Array, tokens: Sequence[str] | None, normalise: Normalise) -> str:
    """The rollout as one heatmap, the tokens on its axes. Its rows normalised over the ordinary
    tokens: after six layers most of each row is on [CLS] and [SEP], which would leave the rest
    white; else normalised as the grid."""
    names = labels(tokens, matrix.shape[0])
    shown = ordinary_rows(matrix, tokens) if normalise == "rows" else NORMALISERS[normalise](matrix)
    caption = element(
        "figcaption",
        element("b", "rollout")
        + " "
        + element(
            "span",
            f"{matrix.shape[0]}×{matrix.shape[1]} · attention rollout over every layer "
            f"(Abnar & Zuidema 2020) · {html.escape(ROLLOUT_CAPTIONS[normalise])}",
            GREY,
        ),
        "margin-bottom:4px;max-width:60em",
    )
    return element(
        "figure",
        caption + heatmap(shown, names, names),
        "margin:0 0 12px",
        "map",
        data_name="rollout",
    )


def trace_arrays(arrays: Mapping[str, Array]) -> dict[str, Array]:
    """The trace's arrays under their own names (``trace.heads.0.q`` → ``heads.0.q``)."""
    return {n[len("trace.") :]: a for n, a in arrays.items() if n.startswith("trace.")}


def traced_layer(attention: Array | None, trace: Mapping[str, Array]) -> int | None:
    """The layer whose heads' weights the trace's equal (to ``TRACE_ATOL``), when exactly one
    does: the answer does not name it."""
    if attention is None or attention.ndim != 4:
        return None
    names = [f"heads.{h}.weights" for h in range(attention.shape[1])]
    whole = all(n in trace for n in names)
    stacked = np.stack([trace[n] for n in names]) if whole else trace.get("weights")
    if stacked is None or stacked.shape != attention.shape[1:]:
        return None
    matching = [
        layer
        for layer in range(attention.shape[0])
        if np.allclose(attention[layer], stacked, rtol=0.0, atol=TRACE_ATOL)
    ]
    return matching[0] if len(matching) == 1 else None


def trace_section(arrays: Mapping[str, Array], meta: Mapping[str, Any], layer: int | None) -> str:
    """The traced layer as ``/multihead`` shows it, its average weights the one map drawn."""
    trace = trace_arrays(arrays)
    info = meta.get("trace")
    if not isinstance(info, Mapping):
        return ""
    name = "the traced layer" if layer is None else f"layer {layer}"
    parts = [
        element(
            "div",
            element("b", f"Trace of {name}") + " " + html.escape(" · ".join(sizes(trace, info))),
            "margin-bottom:4px",
        )
    ]
    drawn = [(n, m) for n, m in result_maps(trace, True) if n == "average_weights"]
    tokens = info.get("tokens")
    for map_name, matrix in drawn:
        parts.append(
            figure(
                map_name, matrix, labels(tokens, matrix.shape[0]), labels(tokens, matrix.shape[1])
            )
        )
    parts.append(
        element(
            "p",
            "Its heads are the grid's row above; one head's maps large: "
            "<code>result.trace.heads[h]</code>; every step's array: "
            '<code>result["trace.heads.0.q"]</code> … <code>result.trace.output</code>.',
            GREY,
        )
    )
    return element("div", "".join(parts), css_class="model-trace")


def _header(meta: Mapping[str, Any], attention: Array | None, tokens: Sequence[str] | None) -> str:
    given = meta.get("model")
    model: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    parts = [str(model.get("name", "a trained model"))]
    if model.get("kind"):
        parts[0] += f" ({model['kind']})"
    if tokens is not None:
        parts.append(f"{len(tokens)} tokens")
    shape = attention.shape[:2] if attention is not None and attention.ndim == 4 else None
    layers, heads = shape if shape is not None else (model.get("layers"), model.get("heads"))
    if layers is not None and heads is not None:
        parts.append(f"{layers} layers × {heads} heads")
    return element(
        "div", element("b", "Model") + " " + html.escape(" · ".join(parts)), "margin-bottom:4px"
    )


def _missing(arrays: Mapping[str, Array], meta: Mapping[str, Any]) -> str:
    """A line naming the outputs this view draws that the answer does not have."""
    have = set(arrays) | set(meta) | {n.split(".")[0] for n in arrays}
    absent = [n for n in ("attention", "head_roles", "rollout", "trace") if n not in have]
    if not absent:
        return ""
    shown = ", ".join(f"<code>{n}</code>" for n in absent)
    return element("p", f"Not in this answer: {shown} (ask with <code>include=[…]</code>).", GREY)


def model_html(
    arrays: Mapping[str, Array], meta: Mapping[str, Any], normalise: Normalise = "rows"
) -> str:
    """A ``/model`` answer as HTML: comparison, summary, grid, rollout, the traced layer."""
    if normalise not in NORMALISERS:
        raise ValueError(f"normalise must be one of {', '.join(NORMALISERS)}, not {normalise!r}")
    attention = arrays.get("attention")
    tokens = meta.get("tokens")
    roles = meta.get("head_roles") if isinstance(meta.get("head_roles"), list) else None
    layer = traced_layer(attention, trace_arrays(arrays))
    given = meta.get("trace")
    info: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    parts = [_header(meta, attention, tokens)]
    if isinstance(info.get("comparison"), list):
        parts.append(comparison(info["comparison"], info.get("first_mismatch")))
    if info.get("warnings"):
        parts.append(warnings_html(info["warnings"]))
    parts.append(_missing(arrays, meta))
    parts.append(summary(tokens, attention, roles))
    if attention is not None and attention.ndim == 4:
        parts.append(grid(attention, roles, normalise, layer))
    if "rollout" in arrays:
        parts.append(rollout(arrays["rollout"], tokens, normalise))
    parts.append(trace_section(arrays, meta, layer))
    style = "font-family:sans-serif;font-size:13px;line-height:1.35"
    return element("div", "".join(parts), style, "attention-result model-view")
