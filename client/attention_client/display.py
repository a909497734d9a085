"""How a result shows itself: a short ``repr``, and in Jupyter (``_repr_html_``) its L×S maps as
heatmaps with the tokens on the axes (:mod:`attention_client.heatmaps`), under the comparison
with your numbers when there is one.

The HTML is self-contained: inline styles and SVG, no script, nothing loaded from elsewhere.
Every text that came from the request or the answer (tokens, messages) is escaped.
"""

import html
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from attention_client.heatmaps import (
    MAP_NAMES,
    MAX_MAPS,
    Array,
    Scale,
    element,
    heatmap,
    labels,
)

FAIL, PASS, WARN = "#c0392b", "#27864a", "#b9770e"
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
        figure(name, matrix, labels(rows, matrix.shape[0]), labels(cols, matrix.shape[1]))
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


# ------------------------------------------------------------------------------ gradients

# the score arrays before the softmax, last first: dS is the gradient of the first one present
SCORE_FORMS = ("masked_scores", "biased_scores", "capped_scores", "scaled_scores")
GRADIENT_NOTE = (
    "Each gradient map beside its forward map: ∂loss/∂weights (dP = dO Vᵀ) and ∂loss/∂{scores} "
    "(dS = P ∘ (dP − D), D = rowsum(P ∘ dP)): where a cell is red, raising that number raises "
    "the loss; where blue, lowers it."
)


def has_gradients(arrays: Mapping[str, Array]) -> bool:
    """Whether the answer holds a backward pass (the request had ``grad_output``)."""
    return any(name.rsplit(".", 1)[-1].startswith("grad_") for name in arrays)


def gradient_pairs(arrays: Mapping[str, Array], prefix: str = "") -> list[tuple[str, str]]:
    """The (forward, gradient) names drawn side by side under ``prefix`` (``""`` or
    ``"heads.0."``): the weights and dP, then the last scores before the softmax and dS."""
    pairs = [("weights", "grad_weights")]
    scores = next((n for n in SCORE_FORMS if prefix + "grad_" + n in arrays), None)
    if scores is not None:
        pairs.append((scores, "grad_" + scores))
    return [
        (prefix + forward, prefix + grad)
        for forward, grad in pairs
        if prefix + forward in arrays
        and prefix + grad in arrays
        and arrays[prefix + forward].shape == arrays[prefix + grad].shape
    ]


def _shown(name: str) -> str:
    """``heads.0.grad_weights`` as ``heads[0].grad_weights``."""
    if name.startswith("heads."):
        _, i, rest = name.split(".", 2)
        return f"heads[{i}].{rest}"
    return name


def _pair_maps(arrays: Mapping[str, Array]) -> list[tuple[tuple[str, Array], tuple[str, Array]]]:
    """Every (forward, gradient) pair of L×S slices: each head's, else the top level's."""
    heads = sorted(
        {int(n.split(".")[1]) for n in arrays if n.startswith("heads.") and ".grad_" in n}
    )  # on /multihead each head's own (its dS is there), not the stacked weights' alone
    names = [pair for i in heads for pair in gradient_pairs(arrays, f"heads.{i}.")]
    if not names:
        names = gradient_pairs(arrays)
    maps: list[tuple[tuple[str, Array], tuple[str, Array]]] = []
    for forward, grad in names:
        maps += zip(
            slices(_shown(forward), arrays[forward]),
            slices(_shown(grad), arrays[grad]),
            strict=True,
        )
    return maps


def _gradient_check(entries: Sequence[Mapping[str, Any]], first_mismatch: str | None) -> str:
    """The comparison's gradients alone: how many of yours match, and the first that does not
    with its diagnosis ("" when no gradient was compared)."""
    grads = [e for e in entries if ".grad_" in "." + str(e.get("name", ""))]
    if not grads:
        return ""
    matching = sum(1 for e in grads if e.get("match"))
    first = next((e for e in grads if not e.get("match")), None)
    if first is None:
        said = (
            "Your gradient matches"
            if len(grads) == 1
            else f"All {len(grads)} of your gradients match"
        )
        verdict = element("b", said + " the service's.", f"color:{PASS}")
        return element("div", verdict, "margin:4px 0", "gradient-check")
    name = str(first.get("name"))
    where = "the first mismatch" if name == first_mismatch else "the first gradient that differs"
    verdict = element(
        "b",
        f"{matching} of your {len(grads)} gradients match; {where}: {_code(name)}",
        f"color:{FAIL}",
    )
    message = element("div", html.escape(str(first.get("message", ""))), "margin:3px 0")
    return element("div", verdict + message + _diagnosis(first), "margin:4px 0", "gradient-check")


def gradients(
    arrays: Mapping[str, Array],
    meta: Mapping[str, Any],
    rows: Sequence[str] | None,
    cols: Sequence[str] | None,
) -> str:
    """The backward's section: your gradients' check (when ``expected`` had any), then each
    gradient map beside its forward map (at most ``MAX_MAPS`` maps, a note for the others)."""
    entries = meta.get("comparison")
    check = (
        _gradient_check(entries, meta.get("first_mismatch")) if isinstance(entries, list) else ""
    )
    pairs = _pair_maps(arrays)
    drawn = []
    for (forward, fmap), (grad, gmap) in pairs[: MAX_MAPS // 2]:
        cells = [
            figure(n, m, labels(rows, m.shape[0]), labels(cols, m.shape[1]))
            for n, m in ((forward, fmap), (grad, gmap))
        ]
        drawn.append(element("div", "".join(cells), "display:flex", "gradient-pair"))
    left_out = [grad for _, (grad, _) in pairs[MAX_MAPS // 2 :]]
    note = (
        element("p", html.escape(f"{len(left_out)} more gradient map(s) not drawn: "
                                 + ", ".join(left_out[:6]) + (" …" if len(left_out) > 6 else "")), GREY)
        if left_out
        else ""
    )  # fmt: skip
    scores = next(
        (n for n in SCORE_FORMS if any(k.endswith("grad_" + n) for k in arrays)), "scores"
    )
    hint = element(
        "p", html.escape(GRADIENT_NOTE.format(scores=scores)), GREY + ";margin:2px 0 8px"
    )
    body = element("div", "".join(drawn), "display:flex;flex-wrap:wrap;align-items:flex-start")
    title = element("b", "Backward pass")
    return element(
        "div",
        title + check + (hint + body if pairs else "") + note,
        "border-top:1px solid #ddd;padding-top:6px;margin-top:6px",
        "gradients",
    )


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
    others = [" + ".join(_code(m) for m in codes) for codes in diagnosis.get("alternatives") or []]
    also = (
        element("div", "As well: " + "; ".join(others), "margin-top:3px", "alternatives")
        if others
        else ""
    )
    return element(
        "div", f"<b>Diagnosis:</b> {mistakes}{explanation}{also}", "margin:6px 0", "diagnosis"
    )


def compared_at(entry: Mapping[str, Any]) -> str:
    """What an array was compared at: its printed precision, a low-precision verdict with both
    errors, or the tolerance ("")."""
    low = entry.get("precision")
    if isinstance(low, Mapping):
        yours, reference = low.get("yours"), low.get("reference")
        numbers = (
            f" (yours {yours:.2g}, a {low.get('type')} computation's {reference:.2g})"
            if isinstance(yours, float) and isinstance(reference, float)
            else ""
        )
        return f"{low.get('type')} rounding{numbers}"
    printed = entry.get("printed")
    if isinstance(printed, Mapping) and printed:
        (kind, n), *_ = printed.items()
        return f"{n} {kind} printed"
    return ""


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
        _cell(compared_at(entry)),
    ]
    return "<tr>" + "".join(cells) + "</tr>"


def comparison(entries: Sequence[Mapping[str, Any]], first_mismatch: str | None) -> str:
    """The comparison with your numbers: the verdict, the first mismatch's message and
    diagnosis, then one row per array compared."""
    first = next((e for e in entries if e.get("name") == first_mismatch), None)
    if first is None:
        colour = PASS
        n = len(entries)
        verdict = (
            "The 1 array you gave matches the service's."
            if n == 1
            else f"All {n} arrays you gave match the service's."
        )
        detail = ""
    else:
        colour = FAIL
        verdict = f"Your numbers differ from the service's, first at {_code(first_mismatch)}."
        message = html.escape(str(first.get("message", "")))
        detail = element("div", message, "margin:4px 0", "message") + _diagnosis(first)
    titles = ("array", "match", "largest difference", "where", "yours", "service's", "compared at")
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


def sizes(arrays: Mapping[str, Array], meta: Mapping[str, Any]) -> list[str]:
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
    shown = " · ".join(html.escape(p) for p in sizes(arrays, meta))
    parts.append(element("div", f"{element('b', html.escape(kind))} {shown}", "margin-bottom:4px"))
    maps = result_maps(arrays, meta.get("num_heads") is not None)
    rows, cols = meta.get("tokens"), meta.get("context_tokens") or None
    parts.append(figures(maps, rows, cols))
    if has_gradients(arrays):
        parts.append(gradients(arrays, meta, rows, cols))
    style = "font-family:sans-serif;font-size:13px;line-height:1.35"
    return element("div", "".join(parts), style, "attention-result")


def short_repr(arrays: Mapping[str, Array], meta: Mapping[str, Any], kind: str = "Result") -> str:
    """One line: sizes, the arrays there are, the tokens and the comparison's verdict."""
    top = list(dict.fromkeys(n.split(".")[0] for n in arrays))
    heads = meta.get("heads")
    if isinstance(heads, list):
        top = [n for n in top if n != "heads"] + [f"heads[{len(heads)}]"]
    measured = sizes(arrays, meta)
    parts = [", ".join(measured)] if measured else []
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
