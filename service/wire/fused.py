"""Fused projections as their modules store them, unpacked into ``q_proj.weight``,
``k_proj.weight`` and ``v_proj.weight`` (API.md, "A config as it is, third edition": weights
under the module's own names; the unpacking is a step).

A fused weight holds the three projections in one matrix; where each projection's rows are is
the module's layout, one row of :data:`LAYOUTS`: ``rows`` gives, for h query heads, h_kv
key/value heads of d features each, the indices of the fused weight's rows (of its columns for
GPT-2's ``Conv1D``, stored [in][out]) that make W_q, W_k and W_v, each in the order of the
unfused ``q_proj.weight``'s rows (head by head). The same indices split the fused bias.

GPT-2's and GPTBigCode's ``c_proj`` (the output projection beside their ``c_attn``) is read as
``o_proj.weight``: transposed when ``c_attn``'s layout is Conv1D's (GPT-2's c_proj is a Conv1D
too), as it is otherwise (GPTBigCode's ``nn.Linear``). Its orientation cannot be told from its
square shape, so ``c_proj`` is taken only with ``c_attn``, whose layout says it.

The layout is never guessed from the name (Phi-3's and CodeGen's ``qkv_proj`` are packed
differently; so are GPT-NeoX's and multi-query Falcon's ``query_key_value``): a config's family
implies it (``service.wire.hf_config``), else the request states ``qkv_layout``.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.core.types import Array
from service.wire.errors import FieldError
from service.wire.schemas.requests import MultiheadRequest, QkvLayout

_STATE_DICT = tuple(f"{n}_proj_{p}" for p in ("weight", "bias") for n in "qkv")


@dataclass(frozen=True)
class HeadSizes:
    h: int  # query heads
    h_kv: int  # key/value heads
    d: int  # features per head (d_k = d_v in every fused layout)


Rows = NDArray[np.intp]
Parts = tuple[Rows, Rows, Rows]  # indices of W_q's, W_k's and W_v's rows in the fused axis


@dataclass(frozen=True)
class Layout:
    """One way modules pack the three projections into one weight."""

    name: QkvLayout
    who: str  # the modules that pack this way
    rows: Callable[[HeadSizes], Parts]
    words: Callable[[HeadSizes], str]  # which rows hold what, for the step
    heads_of: Callable[[int, int | None], tuple[int, int] | str]  # (h, h_kv), or why not
    conv1d: bool = False  # stored [in][out] (GPT-2's Conv1D): the fused axis is the columns


def _ranges(start: int, n: int) -> str:
    return f"{start}…{start + n - 1}"


# ---------------------------------------------------------- rows: [q; k; v] one after the other


def _stacked(n: HeadSizes) -> Parts:
    q, k = n.h * n.d, n.h_kv * n.d
    return np.arange(q), q + np.arange(k), q + k + np.arange(k)


def _stacked_words(n: HeadSizes) -> str:
    q, k = n.h * n.d, n.h_kv * n.d
    kv = "1 key/value head" if n.h_kv == 1 else f"{n.h_kv} key/value heads"
    return (
        f"rows {_ranges(0, q)} are W_q ({n.h} heads × {n.d}), {_ranges(q, k)} W_k and "
        f"{_ranges(q + k, k)} W_v ({kv} × {n.d})"
    )


def _any_heads(h: int, h_kv: int | None) -> tuple[int, int] | str:
    return h, h if h_kv is None else h_kv


# ------------------------------------------------ per_head: [h][q, k, v][d], GPT-NeoX's view


def _per_head(n: HeadSizes) -> Parts:
    first = 3 * n.d * np.arange(n.h)[:, None] + np.arange(n.d)  # (h, d)  each head's query rows
    return first.reshape(-1), (first + n.d).reshape(-1), (first + 2 * n.d).reshape(-1)


def _per_head_words(n: HeadSizes) -> str:
    d = n.d
    return (
        f"each head's {3 * d} rows hold its query, key and value in turn: head i's W_q is rows "
        f"{3 * d}·i + 0…{d - 1}, its W_k {3 * d}·i + {d}…{2 * d - 1}, its W_v "
        f"{3 * d}·i + {2 * d}…{3 * d - 1} (i = 0…{n.h - 1})"
    )


def _same_heads(h: int, h_kv: int | None) -> tuple[int, int] | str:
    if h_kv not in (None, h):
        return "this layout gives every query head its own key and value (num_kv_heads = num_heads)"
    return h, h


# --------------------- grouped: [h_kv][g query heads, k, v][d], Falcon's new_decoder_architecture


def _grouped(n: HeadSizes) -> Parts:
    g = n.h // n.h_kv  # query heads per key/value head
    group = (g + 2) * n.d * np.arange(n.h_kv)  # (h_kv,) each group's first row
    q = group[:, None, None] + n.d * np.arange(g)[None, :, None] + np.arange(n.d)  # (h_kv, g, d)
    k = group[:, None] + g * n.d + np.arange(n.d)  # (h_kv, d)
    return q.reshape(-1), k.reshape(-1), (k + n.d).reshape(-1)


def _grouped_words(n: HeadSizes) -> str:
    g, d = n.h // n.h_kv, n.d
    return (
        f"each key/value head's {(g + 2) * d} rows hold its {g} query heads' rows, then its key "
        f"and value: group i's W_q is rows {(g + 2) * d}·i + 0…{g * d - 1} (query heads "
        f"{g}·i …), its W_k {(g + 2) * d}·i + {g * d}…{(g + 1) * d - 1}, its W_v "
        f"{(g + 2) * d}·i + {(g + 1) * d}…{(g + 2) * d - 1} (i = 0…{n.h_kv - 1})"
    )


def _grouped_heads(h: int, h_kv: int | None) -> tuple[int, int] | str:
    kv = h if h_kv is None else h_kv
    if h % kv:
        return f"num_heads {h} is not a multiple of num_kv_heads {kv}: the groups are equal"
    return h, kv


# ------------- columns: GPT-2's Conv1D c_attn, [d_model][3·d_model], its columns [q | k | v]


def _columns_words(n: HeadSizes) -> str:
    q = n.h * n.d
    return (
        f"stored [in][out] (Conv1D): columns {_ranges(0, q)} are W_q, {_ranges(q, q)} W_k and "
        f"{_ranges(2 * q, q)} W_v ({n.h} heads × {n.d} each, head i's the i-th {n.d})"
    )


# ------------------ codegen: CodeGen's qkv_proj, 4 blocks (mp_num) of [q | v | k] over h/4 heads

_MP_NUM = 4  # CodeGenAttention.forward's mp_num: qkv.reshape(..., 4, -1)


def _codegen(n: HeadSizes) -> Parts:
    """CodeGenAttention.forward: qkv viewed (…, 4, 3·h·d/4), split in query, value, key of
    h·d/4 each, then each block's h/4 heads of d: head j = (h/4)·b + i is block b's i-th."""
    per, local = n.h // _MP_NUM, n.h * n.d // _MP_NUM
    block, i = np.divmod(np.arange(n.h), per)
    first = (3 * local * block + n.d * i)[:, None] + np.arange(n.d)  # (h, d) its query rows
    return first.reshape(-1), (first + 2 * local).reshape(-1), (first + local).reshape(-1)


def _codegen_words(n: HeadSizes) -> str:
    per, local = n.h // _MP_NUM, n.h * n.d // _MP_NUM
    return (
        f"{_MP_NUM} blocks of {3 * local} rows (CodeGen's mp_num), block b holding heads "
        f"{per}·b … {per}·b + {per - 1}: their W_q rows {3 * local}·b + 0…{local - 1}, their "
        f"W_v {3 * local}·b + {local}…{2 * local - 1}, their W_k {3 * local}·b + "
        f"{2 * local}…{3 * local - 1}, {n.d} rows a head (b = 0…{_MP_NUM - 1})"
    )


def _codegen_heads(h: int, h_kv: int | None) -> tuple[int, int] | str:
    heads = _same_heads(h, h_kv)
    if isinstance(heads, tuple) and h % _MP_NUM:
        return (
            f"CodeGen splits qkv_proj into {_MP_NUM} blocks of num_heads / {_MP_NUM} heads: "
            f"num_heads {h} is not a multiple of {_MP_NUM} (transformers fails on it)"
        )
    return heads


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout(
            "rows",
            "Phi-3's qkv_proj, MPT's and DBRX's Wqkv, multi-query Falcon's query_key_value",
            _stacked,
            _stacked_words,
            _any_heads,
        ),
        Layout(
            "per_head",
            "GPT-NeoX's, BLOOM's and Falcon's (per head) query_key_value",
            _per_head,
            _per_head_words,
            _same_heads,
        ),
        Layout(
            "grouped",
            "Falcon's query_key_value with new_decoder_architecture",
            _grouped,
            _grouped_words,
            _grouped_heads,
        ),
        Layout(
            "columns",
            "GPT-2's c_attn (a Conv1D, stored [in][out])",
            _stacked,
            _columns_words,
            _same_heads,
            conv1d=True,
        ),
        Layout("codegen", "CodeGen's qkv_proj", _codegen, _codegen_words, _codegen_heads),
    )
}

# the fused fields: {weight field: (its bias field, its name as the module writes it)}
FUSED = {
    "qkv_proj_weight": ("qkv_proj_bias", "qkv_proj"),
    "query_key_value_weight": ("query_key_value_bias", "query_key_value"),
    "c_attn_weight": ("c_attn_bias", "c_attn"),  # GPT-2's Conv1D, GPTBigCode's Linear
}
# the output projections a state dict may give beside c_proj, as the caller names them
_OUTPUTS = {
    "o_proj_weight": "o_proj.weight",
    "o_proj_bias": "o_proj.bias",
    "out_proj_weight": "out_proj.weight",
    "out_proj_bias": "out_proj.bias",
    "w_o": "w_o",
    "b_o": "b_o",
}
FUSED |= {"wqkv_weight": ("wqkv_bias", "Wqkv")}  # MPT's and DBRX's


@dataclass(frozen=True)
class Unpacked:
    """How a fused weight was read: for the ``unpack`` step."""

    name: str  # the module's name for it (qkv_proj)
    shape: tuple[int, ...]
    layout: str
    words: str  # which rows hold what
    output: str = ""  # how c_proj.weight was read, when given
    # for the backward's grad_state_dict: where W_q's, W_k's and W_v's rows are in the fused
    # axis, whether it is stored [in][out] (Conv1D), and the fields the body gave
    parts: Parts | None = None
    conv1d: bool = False
    fields: tuple[str, ...] = ()  # of FUSED_NAMES: the fused weight, its bias, c_proj's

    @property
    def formula(self) -> str:
        return f"{self.name}.weight, {self.layout} layout: {self.words}{self.output}"


def unpacked(req: MultiheadRequest) -> tuple[dict[str, Any], Unpacked] | None:
    """The state dict's q/k/v projections a fused weight holds, and how it was read; None
    when the request has no fused weight."""
    given = [name for name in FUSED if getattr(req, name) is not None]
    given_biases = [FUSED[n][0] for n in FUSED if getattr(req, FUSED[n][0]) is not None]
    c_proj = [n for n in ("c_proj_weight", "c_proj_bias") if getattr(req, n) is not None]
    if c_proj and "c_attn_weight" not in given:
        raise FieldError(
            FUSED_NAMES[c_proj[0]],
            f"{FUSED_NAMES[c_proj[0]]} goes with c_attn.weight, whose layout says how it is "
            "stored (GPT-2's Conv1D [in][out], GPTBigCode's Linear [out][in]): give both, or "
            "the output projection as o_proj.weight ([d_out][h·d_v])",
        )
    if not given:
        if given_biases:
            bias = FUSED_NAMES[given_biases[0]]
            raise FieldError(bias, f"{bias} goes with {bias.replace('.bias', '.weight')}")
        if req.qkv_layout is not None and (req._config_taken or {}).get("qkv_layout") in (
            None,
            "request",
        ):
            raise FieldError(
                "qkv_layout",
                "qkv_layout says how a fused projection (qkv_proj.weight, "
                "query_key_value.weight, Wqkv.weight, c_attn.weight) is laid out, and the "
                "request has none: leave it out",
            )
        return None
    name = given[0]
    label = FUSED_NAMES[name]
    if len(given) > 1:
        raise FieldError(
            FUSED_NAMES[given[1]],
            f"give one fused projection: found {label} and {FUSED_NAMES[given[1]]}",
        )
    unfused = [n for n in _STATE_DICT if getattr(req, n) is not None]
    if unfused:
        dotted = unfused[0].replace("_weight", ".weight").replace("_bias", ".bias")
        raise FieldError(
            dotted,
            f"{label} holds the query, key and value projections: give it or {dotted}, not both",
        )
    layout = _layout(req, label)
    w: Array = getattr(req, name)
    bias_field = FUSED[name][0]
    b: Array | None = getattr(req, bias_field)
    if layout.conv1d:
        w = w.T  # (fused, d_in)
    axis = "columns" if layout.conv1d else "rows"
    n = _sizes(req, layout, label, w.shape[0], axis)
    q, k, v = layout.rows(n)
    if b is not None and b.shape[0] != w.shape[0]:
        raise FieldError(
            FUSED_NAMES[bias_field],
            f"{FUSED_NAMES[bias_field]} has {b.shape[0]} entries; {label} has {w.shape[0]} {axis}",
        )
    fields: dict[str, Any] = {
        "q_proj_weight": w[q],
        "k_proj_weight": w[k],
        "v_proj_weight": w[v],
    }
    if b is not None:
        fields |= {"q_proj_bias": b[q], "k_proj_bias": b[k], "v_proj_bias": b[v]}
    fields |= {name: None, bias_field: None}
    output, said = _output_projection(req, layout) if c_proj else ({}, "")
    shape = tuple(getattr(req, name).shape)
    sent = (name,) + ((bias_field,) if b is not None else ()) + tuple(c_proj)
    how = Unpacked(FUSED[name][1], shape, layout.name, layout.words(n), said, (q, k, v),
                   layout.conv1d, sent)  # fmt: skip
    return fields | output, how


def _output_projection(req: MultiheadRequest, layout: Layout) -> tuple[dict[str, Any], str]:
    """c_proj.weight and its bias as o_proj.weight (out_in) and o_proj.bias: transposed where
    c_attn's layout is Conv1D's (GPT-2's c_proj is a Conv1D too), as it is otherwise
    (GPTBigCode's nn.Linear); and the words for the unpack step."""
    other = next((n for n in _OUTPUTS if getattr(req, n) is not None), None)
    if other is not None:
        raise FieldError(
            _OUTPUTS[other],
            f"c_proj.weight is the output projection: give it or {_OUTPUTS[other]}, not both",
        )
    w: Array | None = req.c_proj_weight
    if w is None:
        raise FieldError("c_proj.bias", "c_proj.bias goes with c_proj.weight")
    fields = {
        "o_proj_weight": w.T if layout.conv1d else w,
        "o_proj_bias": req.c_proj_bias,
        "c_proj_weight": None,
        "c_proj_bias": None,
    }
    how = "transposed (a Conv1D: [in][out])" if layout.conv1d else "as it is ([out][in])"
    return fields, f"; c_proj.weight read as o_proj.weight, {how}"


# {field: the name the module writes} for messages
FUSED_NAMES = {
    **{w: f"{FUSED[w][1]}.weight" for w in FUSED},
    **{FUSED[w][0]: f"{FUSED[w][1]}.bias" for w in FUSED},
    "c_proj_weight": "c_proj.weight",
    "c_proj_bias": "c_proj.bias",
}


def _layout(req: MultiheadRequest, label: str) -> Layout:
    if req.qkv_layout is None:
        known = "; ".join(f'"{layout.name}" ({layout.who})' for layout in LAYOUTS.values())
        raise FieldError(
            "qkv_layout",
            f"{label} packs the query, key and value projections in one weight, and modules "
            f"pack them differently: give config (the model's config.json) or qkv_layout, one of {known}",
        )
    return LAYOUTS[req.qkv_layout]


def _sizes(
    req: MultiheadRequest, layout: Layout, label: str, rows: int, axis: str = "rows"
) -> HeadSizes:
    """h, h_kv and d from num_heads, num_kv_heads (default h) and the fused rows
    ((h + 2·h_kv)·d); a stated d_k must agree."""
    if req.num_heads is None:
        raise FieldError("num_heads", f"num_heads is missing: {label} is split by head")
    heads = layout.heads_of(req.num_heads, req.num_kv_heads)
    if isinstance(heads, str):  # about the kv heads when they are given and differ
        field = "num_kv_heads" if req.num_kv_heads not in (None, req.num_heads) else "num_heads"
        raise FieldError(field, f"qkv_layout {layout.name}: {heads}")
    h, h_kv = heads
    per = h + 2 * h_kv
    if rows % per:
        raise FieldError(
            label,
            f"{label} has {rows} {axis}, which (num_heads + 2·num_kv_heads) = {per} heads do not "
            "divide into equal heads",
        )
    d = rows // per
    if req.d_k is not None and req.d_k != d:
        raise FieldError(
            "d_k",
            f"d_k is {req.d_k} but {label}'s {rows} {axis} make (num_heads + 2·num_kv_heads) = "
            f"{per} heads of {d}",
        )
    return HeadSizes(h, h_kv, d)
