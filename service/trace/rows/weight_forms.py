"""The four ways to give /multihead's projections, as rows (API.md, "Weights"): the request
fields that give each, the sizes they imply (checked by the rules, before anything is drawn)
and their conversion into combined in_out weights (made by the plan). The rules decide the
form once (:func:`weight_form`) and record it in :attr:`Shapes.form`; the plan converts with
that row. Adding a form is one row here.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from service.core.attention import Projections
from service.core.types import Array, WeightLayout
from service.trace.checks import DOTTED, check_bias, check_size, weight_out
from service.wire.errors import FieldError
from service.wire.schemas.requests import HeadWeights, InputFields, MultiheadRequest

STATE_DICT = ("q_proj_weight", "k_proj_weight", "v_proj_weight")
STATE_DICT_BIASES = ("q_proj_bias", "k_proj_bias", "v_proj_bias")


class Dims(NamedTuple):
    """The sizes a weight form implies."""

    d_k: int
    d_v: int
    num_kv_heads: int
    generated: tuple[str, ...] = ()  # weights to draw (combined weights only)


@dataclass(frozen=True)
class WeightForm:
    """One way to give the projections."""

    name: str  # recorded in Shapes.form
    given: Callable[[MultiheadRequest], str | None]  # how messages name it when given, else None
    # its sizes from the request, d_model (x's width), the keys' input width and h
    dims: Callable[[MultiheadRequest, int, int, int], Dims]
    # the projections in in_out layout, from the request and the drawn arrays
    convert: Callable[[MultiheadRequest, Mapping[str, Array]], Projections]
    kv_width: Callable[[MultiheadRequest], int | None] = lambda req: None  # keys' input width


def in_out(w: Array, layout: WeightLayout) -> Array:
    """A weight in the engine's in_out layout (X @ W), whatever layout it came in."""
    return w if layout == "in_out" else w.T


def given_or_drawn(req: InputFields, name: str, generated: Mapping[str, Array]) -> Array:
    """A projection weight in in_out layout: drawn ones already are, given ones follow
    weight_layout."""
    if name in generated:
        return generated[name]
    w = getattr(req, name)
    assert w is not None
    return in_out(w, req.weight_layout)


def _grouped(req: MultiheadRequest, h: int) -> int:
    """num_kv_heads (h unless given), which must divide num_heads."""
    h_kv = req.num_kv_heads or h
    if h % h_kv:
        raise FieldError(
            "num_kv_heads",
            f"num_heads {h} is not a multiple of num_kv_heads {h_kv}: each key/value head must serve the same number of query heads",
        )
    return h_kv


# ----------------------------------------------------------------- combined: w_q, w_k, w_v


def _combined_dims(
    req: MultiheadRequest, d_model: int, h: int, h_kv: int
) -> tuple[int, int, list[str]]:
    """(d_k, d_v, weights to generate) of combined weights w_q, w_k, w_v."""
    if req.in_proj_bias is not None:
        raise FieldError(
            "in_proj_bias",
            "in_proj_bias goes with in_proj_weight; with w_q, w_k, w_v use b_q, b_k, b_v",
        )
    widths = {
        n: weight_out(req, n, w, d_model)
        for n in ("w_q", "w_k", "w_v")
        if (w := getattr(req, n)) is not None
    }
    for name, heads in (("w_q", h), ("w_k", h_kv), ("w_v", h_kv)):
        if name in widths and widths[name] % heads:
            label = "num_heads" if name == "w_q" else "num_kv_heads"
            raise FieldError(
                name,
                f"{name} has {widths[name]} outputs, which {label} {heads} does not divide into equal heads",
            )
    d_k = (
        widths["w_q"] // h
        if "w_q" in widths
        else widths["w_k"] // h_kv
        if "w_k" in widths
        else req.d_k
    )
    if d_k is None:
        if d_model % h:
            raise FieldError(
                "d_k",
                f"num_heads {h} does not divide d_model {d_model}: give d_k (the width of each head)",
            )
        d_k = d_model // h
    check_size(req.d_k, "d_k", d_k, "the given weights make heads of width")
    if "w_k" in widths and widths["w_k"] != h_kv * d_k:
        raise FieldError(
            "w_k",
            f"w_k has {widths['w_k']} outputs but needs num_kv_heads·d_k = {h_kv}·{d_k} = {h_kv * d_k} to match the query heads",
        )
    d_v = widths["w_v"] // h_kv if "w_v" in widths else req.d_v if req.d_v is not None else d_k
    check_size(req.d_v, "d_v", d_v, "the given w_v makes heads of values of width")
    missing = [n for n in ("w_q", "w_k", "w_v") if n not in widths]
    if missing and req.seed is None:
        raise FieldError(
            missing[0],
            f"{missing[0]} is missing: give w_q, w_k and w_v (or in_proj_weight, or heads), or give seed to generate them",
        )
    check_bias(req.b_q, "b_q", h * d_k, "Q (all heads)")
    check_bias(req.b_k, "b_k", h_kv * d_k, "K (all key heads)")
    check_bias(req.b_v, "b_v", h_kv * d_v, "V (all value heads)")
    return d_k, d_v, missing


def _combined(req: MultiheadRequest, d_model: int, kv_width: int, h: int) -> Dims:
    h_kv = _grouped(req, h)
    d_k, d_v, missing = _combined_dims(req, d_model, h, h_kv)
    return Dims(d_k, d_v, h_kv, tuple(missing))


def _combined_weights(req: MultiheadRequest, generated: Mapping[str, Array]) -> Projections:
    w_q, w_k, w_v = (given_or_drawn(req, n, generated) for n in ("w_q", "w_k", "w_v"))
    return Projections(w_q, w_k, w_v, req.b_q, req.b_k, req.b_v)


# ------------------------------------------------ in_proj: nn.MultiheadAttention's packing


def _in_proj_dims(req: MultiheadRequest, d_model: int) -> tuple[int, int]:
    assert req.in_proj_weight is not None and req.num_heads is not None
    if req.num_kv_heads not in (None, req.num_heads):
        raise FieldError(
            "num_kv_heads",
            "in_proj_weight is PyTorch's nn.MultiheadAttention packing, which has no grouped-query attention: give w_q, w_k, w_v to use num_kv_heads",
        )
    if req.in_proj_weight.shape != (3 * d_model, d_model):
        got = "×".join(map(str, req.in_proj_weight.shape))
        raise FieldError(
            "in_proj_weight",
            f"in_proj_weight is {got} but must be {3 * d_model}×{d_model} (3·d_model × d_model, rows q, k, v, as PyTorch packs it)",
        )
    if d_model % req.num_heads:
        raise FieldError(
            "num_heads", f"num_heads {req.num_heads} does not divide d_model {d_model}"
        )
    check_bias(req.in_proj_bias, "in_proj_bias", 3 * d_model, "in_proj_weight (3·d_model rows)")
    return d_model // req.num_heads, d_model // req.num_heads


def _ungrouped(
    form: str, widths: Callable[[MultiheadRequest, int], tuple[int, int]]
) -> Callable[[MultiheadRequest, int, int, int], Dims]:
    """The dims of a form whose weights fix d_k and d_v (per head) and have no grouped-query
    heads (in_proj, per_head): the stated d_k and d_v must agree with them."""

    def dims(req: MultiheadRequest, d_model: int, kv_width: int, h: int) -> Dims:
        h_kv = _grouped(req, h)
        d_k, d_v = widths(req, d_model)
        check_size(req.d_k, "d_k", d_k, f"the {form} weights make heads of width")
        check_size(req.d_v, "d_v", d_v, f"the {form} weights make values of width")
        return Dims(d_k, d_v, h_kv)

    return dims


def _in_proj_weights(req: MultiheadRequest, generated: Mapping[str, Array]) -> Projections:
    assert req.in_proj_weight is not None
    packed = req.in_proj_weight.T  # (d_model, 3·d_model), columns q, k, v
    w_q, w_k, w_v = np.split(packed, 3, axis=1)
    b = req.in_proj_bias
    b_q, b_k, b_v = (None, None, None) if b is None else np.split(b, 3)
    return Projections(w_q, w_k, w_v, b_q, b_k, b_v)


# ------------------------------------------------------------------- per_head: heads[i]


def _per_head_dims(req: MultiheadRequest, d_model: int) -> tuple[int, int]:
    assert req.heads is not None
    if req.in_proj_bias is not None:
        raise FieldError(
            "in_proj_bias",
            "in_proj_bias goes with in_proj_weight; per-head weights take b_q, b_k, b_v in each head",
        )
    if len(req.heads) != req.num_heads:
        raise FieldError(
            "heads", f"heads has {len(req.heads)} entries but num_heads is {req.num_heads}"
        )
    if req.num_kv_heads not in (None, req.num_heads):
        raise FieldError(
            "num_kv_heads",
            "num_kv_heads needs combined weights (w_k, w_v of d_model × num_kv_heads·d_k); per-head weights give every head its own keys and values",
        )
    sizes = set()
    for i, head in enumerate(req.heads):
        widths = {
            name: weight_out(req, f"heads[{i}].{name}", getattr(head, name), d_model)
            for name in ("w_q", "w_k", "w_v")
        }
        if widths["w_q"] != widths["w_k"]:
            raise FieldError(
                f"heads[{i}].w_k",
                f"heads[{i}] makes queries of width {widths['w_q']} but keys of width {widths['w_k']}: they must match",
            )
        for b, w in (("b_q", "w_q"), ("b_k", "w_k"), ("b_v", "w_v")):
            check_bias(getattr(head, b), f"heads[{i}].{b}", widths[w], f"heads[{i}].{w}")
        sizes.add((widths["w_q"], widths["w_v"]))
    if len(sizes) > 1:
        raise FieldError(
            "heads",
            "every head must have the same d_k and d_v so their outputs can be concatenated",
        )
    d_k, d_v = sizes.pop()
    return d_k, d_v


def _per_head_weights(req: MultiheadRequest, generated: Mapping[str, Array]) -> Projections:
    assert req.heads is not None
    return _stack_heads(req.heads, req.weight_layout)


def _stack_heads(heads: list[HeadWeights], layout: WeightLayout) -> Projections:
    """Per-head weights side by side in in_out layout, head i in columns i·d_k … (i+1)·d_k − 1;
    a head without a bias gets zeros when another head has one."""
    w = {
        n: [in_out(getattr(head, "w_" + n), layout) for head in heads] for n in ("q", "k", "v")
    }  # per head (d_model, d_k) or (d_model, d_v)

    def bias(n: str) -> Array | None:
        parts = [getattr(head, "b_" + n) for head in heads]
        if all(p is None for p in parts):
            return None
        return np.concatenate(
            [np.zeros(wh.shape[1]) if p is None else p for p, wh in zip(parts, w[n], strict=True)]
        )

    w_q, w_k, w_v = (np.concatenate(w[n], axis=1) for n in ("q", "k", "v"))
    return Projections(w_q, w_k, w_v, bias("q"), bias("k"), bias("v"))


# ------------------------------------------- state_dict: q_proj.weight … (always out_in)


def _check_kdim_vdim(req: MultiheadRequest) -> None:
    """With ``context`` the state dict's k_proj.weight and v_proj.weight take its width, so
    they must take the same one: nn.MultiheadAttention's kdim ≠ vdim (a key and a value of
    different widths) has no single context to stand for it."""
    k, v = req.k_proj_weight, req.v_proj_weight
    if k is not None and v is not None and k.shape[1] != v.shape[1]:
        raise FieldError(
            "v_proj.weight",
            f"k_proj.weight takes {k.shape[1]} features but v_proj.weight takes {v.shape[1]} "
            "(nn.MultiheadAttention's kdim ≠ vdim): one context gives both the keys and the "
            "values, so both must take its width",
        )


def _state_dict_dims(
    req: MultiheadRequest, d_model: int, kv_width: int, h: int
) -> tuple[int, int, int]:
    """(d_k, d_v, h_kv) of q_proj.weight, k_proj.weight, v_proj.weight (always out_in): d_k
    is q_proj.weight's rows ÷ num_heads, num_kv_heads k_proj.weight's rows ÷ d_k."""
    for name in STATE_DICT:
        if getattr(req, name) is None:
            raise FieldError(
                DOTTED[name],
                f"{DOTTED[name]} is missing: a state dict's projections come as q_proj.weight, k_proj.weight and v_proj.weight together",
            )
    assert req.q_proj_weight is not None and req.k_proj_weight is not None
    assert req.v_proj_weight is not None
    for name, w, width, of in (
        ("q_proj.weight", req.q_proj_weight, d_model, "x"),
        (
            "k_proj.weight",
            req.k_proj_weight,
            kv_width,
            "context" if req.context is not None else "x",
        ),
        (
            "v_proj.weight",
            req.v_proj_weight,
            kv_width,
            "context" if req.context is not None else "x",
        ),
    ):
        if w.shape[1] != width:
            rows, cols = w.shape
            raise FieldError(
                name,
                f"{name} is {rows}×{cols} but {of} has {width} columns: a state dict's weights are [out][in] (out_in), so it must have {width} columns",
            )
    q_rows, k_rows, v_rows = (int(getattr(req, n).shape[0]) for n in STATE_DICT)
    if q_rows % h:
        raise FieldError(
            "q_proj.weight",
            f"q_proj.weight has {q_rows} rows, which num_heads {h} does not divide into equal heads (d_k = rows ÷ num_heads)",
        )
    d_k = q_rows // h
    check_size(req.d_k, "d_k", d_k, "q_proj.weight's rows ÷ num_heads give heads of width")
    if k_rows % d_k:
        raise FieldError(
            "k_proj.weight",
            f"k_proj.weight has {k_rows} rows, not a multiple of d_k = {d_k} (num_kv_heads = rows ÷ d_k)",
        )
    h_kv = k_rows // d_k
    check_size(req.num_kv_heads, "num_kv_heads", h_kv, f"k_proj.weight has {k_rows} rows = d_k ·")
    if h % h_kv:
        raise FieldError(
            "k_proj.weight",
            f"k_proj.weight makes {h_kv} key/value heads, which does not divide num_heads {h}: each key/value head must serve the same number of query heads",
        )
    if v_rows % h_kv:
        raise FieldError(
            "v_proj.weight",
            f"v_proj.weight has {v_rows} rows, which the {h_kv} key/value heads do not divide",
        )
    d_v = v_rows // h_kv
    check_size(req.d_v, "d_v", d_v, "v_proj.weight makes values of width")
    if req.in_proj_bias is not None and any(getattr(req, n) is not None for n in STATE_DICT_BIASES):
        raise FieldError(
            "in_proj_bias", "give in_proj_bias or q_proj.bias, k_proj.bias, v_proj.bias, not both"
        )
    check_bias(
        req.in_proj_bias, "in_proj_bias", q_rows + k_rows + v_rows, "the three projections together"
    )
    for name, rows in zip(STATE_DICT_BIASES, (q_rows, k_rows, v_rows), strict=True):
        check_bias(getattr(req, name), DOTTED[name], rows, DOTTED[name.replace("bias", "weight")])
    return d_k, d_v, h_kv


def _state_dict(req: MultiheadRequest, d_model: int, kv_width: int, h: int) -> Dims:
    return Dims(*_state_dict_dims(req, d_model, kv_width, h))


def _state_dict_kv_width(req: MultiheadRequest) -> int | None:
    """With a context, k_proj.weight and v_proj.weight take its width (nn.MultiheadAttention's
    kdim); without, they take x (d_model columns)."""
    given = [n for n in ("k_proj_weight", "v_proj_weight") if getattr(req, n) is not None]
    if not given or req.context is None:
        return None
    _check_kdim_vdim(req)
    return int(getattr(req, given[0]).shape[1])


def _state_dict_weights(req: MultiheadRequest, generated: Mapping[str, Array]) -> Projections:
    assert req.q_proj_weight is not None and req.k_proj_weight is not None
    assert req.v_proj_weight is not None
    biases = (req.q_proj_bias, req.k_proj_bias, req.v_proj_bias)
    if req.in_proj_bias is not None:  # nn.MultiheadAttention with kdim/vdim packs them
        rows = np.cumsum([req.q_proj_weight.shape[0], req.k_proj_weight.shape[0]])
        biases = tuple(np.split(req.in_proj_bias, rows))  # type: ignore[assignment]
    return Projections(req.q_proj_weight.T, req.k_proj_weight.T, req.v_proj_weight.T, *biases)


def _state_dict_given(req: MultiheadRequest) -> str | None:
    given = [n for n in (*STATE_DICT, *STATE_DICT_BIASES) if getattr(req, n) is not None]
    return DOTTED[given[0]] if given else None


# ------------------------------------------------------------------------------ the table

_COMBINED_FIELDS = ("w_q", "w_k", "w_v", "b_q", "b_k", "b_v")
COMBINED = WeightForm(
    "combined",
    lambda req: (
        "w_q/w_k/w_v" if any(getattr(req, n) is not None for n in _COMBINED_FIELDS) else None
    ),
    _combined,
    _combined_weights,
)
# in the order a message names two forms given together
WEIGHT_FORMS: tuple[WeightForm, ...] = (
    COMBINED,
    WeightForm(
        "in_proj",
        lambda req: "in_proj_weight" if req.in_proj_weight is not None else None,
        _ungrouped("in_proj", _in_proj_dims),
        _in_proj_weights,
    ),
    WeightForm(
        "per_head",
        lambda req: "heads" if req.heads is not None else None,
        _ungrouped("per_head", _per_head_dims),
        _per_head_weights,
    ),
    WeightForm(
        "state_dict", _state_dict_given, _state_dict, _state_dict_weights, _state_dict_kv_width
    ),
)
BY_NAME = {form.name: form for form in WEIGHT_FORMS}


def weight_form(req: MultiheadRequest) -> WeightForm:
    """The one form a /multihead request with projections gives them in (combined when none is
    given: the weights are drawn); two forms together are refused, naming both."""
    given = [(form, label) for form in WEIGHT_FORMS if (label := form.given(req)) is not None]
    if len(given) > 1:
        first, second = given[0][1], given[1][1]
        raise FieldError(
            second.split("/")[0],
            f"give the projections in one form only: found {first} and {second}",
        )
    return given[0][0] if given else COMBINED
