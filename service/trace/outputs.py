"""The one table of outputs: every name a response can carry, its shape, where it lives and how
it is shown. The names ``include`` accepts, the result-size limits, dropping the batch axis, the
response models (and so /docs) and the explorer's drawings all derive from :data:`OUTPUTS`, the
forward's rows (:mod:`service.trace.output_table`) then the backward's
(:mod:`service.trace.gradient_outputs`).

Adding an output is one row there plus its computation: a field of the engine's trace (for a
``head`` row: of :class:`service.core.attention.AttentionTrace`) or a value handed to
:func:`body` by :mod:`service.trace.compute`. :func:`body` builds the response from the table:
the outputs a request returns (present, and asked for by ``include``), in table order, looked
up once per distinct shapes and include.
"""

import math
from collections.abc import Mapping
from difflib import get_close_matches
from functools import cache
from operator import attrgetter
from typing import Any

from service.trace.gradient_outputs import GRADIENTS
from service.trace.output_table import FORWARD, Output
from service.trace.shapes import Endpoint, Shapes, by_shapes
from service.wire.errors import FieldError

OUTPUTS: tuple[Output, ...] = FORWARD + GRADIENTS


_POSITIONS = {id(out): i for i, out in enumerate(OUTPUTS)}
# the scores in turn, each made from the latest present one before it: what a score step adds
# to, and what the softmax reads
CHAIN = tuple(out.name for out in OUTPUTS if out.view is not None and out.view.chain)


@cache
def top_level(endpoint: Endpoint) -> tuple[Output, ...]:
    """The outputs at the top of an endpoint's response, in order."""
    return tuple(
        out
        for out in OUTPUTS
        if endpoint in out.endpoints and not (out.head and endpoint == "multihead")
    )


@cache
def in_heads(endpoint: Endpoint) -> tuple[Output, ...]:
    """The outputs inside each ``heads[i]`` of an endpoint's response (none on /attention)."""
    return tuple(out for out in OUTPUTS if out.head and endpoint == "multihead")


@cache
def _by_name(endpoint: Endpoint) -> dict[str, Output]:
    """Output (and step) names to outputs, computed once; per-head outputs win (a /multihead
    step named "output" is the heads' weights V, not the block's output)."""
    return {o.name: o for o in top_level(endpoint)} | {o.name: o for o in OUTPUTS if o.head}


@cache
def row(endpoint: Endpoint, name: str, per_head: bool = True) -> Output:
    """The row of an output (or a step named after one): the per-head one when ``per_head``
    and the endpoint has one of that name, else the top-level one."""
    if per_head:
        return _by_name(endpoint)[name]
    return next(o for o in top_level(endpoint) if o.name == name)


def position(out: Output) -> int:
    """Where an output's step comes in the order of the steps (the table's order)."""
    return _POSITIONS[id(out)]


@cache
def step_order(endpoint: Endpoint) -> dict[str, int]:
    """Each step name's place in the order of the steps (the table's order; per-head rows win,
    as in :func:`row`), computed once per endpoint."""
    return {name: position(out) for name, out in _by_name(endpoint).items()}


# the parameters' gradients a step's backward makes beside the gradient of what it read
# (that step reads this gradient): each comes right after it, in the backward's order; the
# projections' (grad_w_q … grad_x) come last, at their rows
_MADE_BESIDE: dict[str, str] = {
    "row_dot": "grad_weights",  # D is made with dS, right after dP
    "grad_sinks": "grad_weights",
    "grad_ln_gamma": "grad_layer_norm",
    "grad_ln_beta": "grad_layer_norm",
    "grad_w_o": "grad_projected",
    "grad_b_o": "grad_projected",
} | {f"grad_{n}_norm_{p}": f"grad_{n}_normed" for n in "qkv" for p in ("weight", "bias")}


def gradient_position(endpoint: Endpoint, name: str, per_head: bool = True) -> float:
    """Where a gradient's step comes in the backward's order, which the steps and the
    comparison both follow: its row's place, or right after the gradient whose step makes it
    (:data:`_MADE_BESIDE`)."""
    beside = _MADE_BESIDE.get(name)
    if beside is not None:
        return position(row(endpoint, beside, True)) + (0.5 if name == "row_dot" else 0.75)
    return position(row(endpoint, name, per_head))


def latest(shapes: Shapes, name: str, among: tuple[str, ...]) -> str:
    """The last of ``among`` (step names, in the table's order) present in this request before
    ``name``: what the step ``name`` is made from (the scores so far, the queries as the
    scores use them)."""
    order = step_order(shapes.endpoint)
    rows = _by_name(shapes.endpoint)
    before = order[name]
    for n in reversed(among):
        if order[n] < before and rows[n].present(shapes):
            return n
    raise ValueError(f"no step of {among} before {name}")


@cache
def includable(endpoint: Endpoint) -> tuple[str, ...]:
    """The names ``include`` accepts for an endpoint."""
    return tuple(out.name for out in top_level(endpoint) if not out.always)


def check_include(endpoint: Endpoint, include: list[str] | None) -> None:
    """Refuse a name in ``include`` that is not an output of the endpoint."""
    if not include:
        return
    names = includable(endpoint)
    for name in include:
        if name not in names:
            raise FieldError(
                "include",
                f'include names "{name[:40]}", which is not an output; {_choices(name, names)}',
            )


def _choices(name: str, names: tuple[str, ...], room: int = 240) -> str:
    """The names closest to a misspelt one, then as many of all the names as fit in ``room``
    characters (an error stays short however many outputs the table grows)."""
    close = get_close_matches(name[:40], names, n=2)
    quoted = " or ".join(f'"{c}"' for c in close)
    hint = f"did you mean {quoted}? " if close else ""
    shown: list[str] = []
    for n in names:
        if len(", ".join([*shown, n])) > room:
            break
        shown.append(n)
    more = "" if len(shown) == len(names) else f", … ({len(names)} in all; /docs lists them)"
    return f"{hint}choose from {', '.join(shown)}{more}"


def _count(out: Output, shapes: Shapes) -> int:
    """How many numbers one output holds, heads and batch included."""
    if out.kind == "heads":
        return sum(_count(o, shapes) for o in in_heads(shapes.endpoint) if o.present(shapes))
    if out.shape is None:
        return 0
    per_head = shapes.num_heads if out.head and shapes.endpoint == "multihead" else 1
    batch = (shapes.batch or 1) if out.batched else 1
    return batch * per_head * math.prod(out.shape(shapes))


def sizes(shapes: Shapes) -> dict[str, int]:
    """How many numbers each top-level output of this request holds (present ones only)."""
    return dict(_sizes(shapes))


@by_shapes
def _sizes(shapes: Shapes) -> dict[str, int]:
    return {
        out.name: _count(out, shapes) for out in top_level(shapes.endpoint) if out.present(shapes)
    }


def drawn_shape(shapes: Shapes, name: str) -> tuple[int, ...]:
    """The shape of a generated array (x, w_q, w_k, w_v): drawn with it, returned with it."""
    out = _by_name(shapes.endpoint)[name]
    assert out.kind == "weight" and out.shape is not None
    return out.shape(shapes)


# what an output's shape reads of the shapes (its sizes, its batch, the endpoint), in one call
_SIZES = attrgetter(
    "endpoint",
    "batch",
    "seq_len",
    "ctx_len",
    "new_keys",
    "d_model",
    "d_k",
    "d_v",
    "d_out",
    "num_heads",
    "num_kv_heads",
    "latent",
)
_STEP_SHAPES: dict[tuple[Any, ...], list[int]] = {}  # (sizes, name) -> shape, up to 4,096


def step_shape(shapes: Shapes, name: str) -> list[int]:
    """The shape a step named after an output produces, with B (and h on /multihead) in front;
    kept by the sizes it reads (a tuple of a dozen numbers hashes in well under a µs, where the
    whole shapes' hash and equality cost several: an answer asks one per step). Shared: not to
    be changed."""
    key = (_SIZES(shapes), name)
    shape = _STEP_SHAPES.get(key)
    if shape is None:
        if len(_STEP_SHAPES) >= 4096:
            _STEP_SHAPES.clear()
        shape = _STEP_SHAPES[key] = _step_shape(shapes, name)
    return shape


def _step_shape(shapes: Shapes, name: str) -> list[int]:
    out = _by_name(shapes.endpoint)[name]
    assert out.shape is not None
    lead = [shapes.batch] if shapes.batch is not None and out.batched else []
    if out.head and shapes.endpoint == "multihead":
        lead.append(shapes.num_heads)
    return lead + list(out.shape(shapes))


# ------------------------------------------------------------------ the response body


def body(
    shapes: Shapes,
    include: frozenset[str] | None,
    values: Mapping[str, Any],
    per_head: Mapping[str, Any],
) -> dict[str, Any]:
    """The response body: every present output that ``include`` asks for, in table order.

    ``per_head`` holds the head rows' arrays with a leading batch axis (and on /multihead a
    heads axis after it); ``values`` the others, batched where their row says so. A value may
    be a function, called only when the output is returned. The batch axis of an unbatched
    request is dropped here (views, no copies).
    """
    unbatch = shapes.batch is None
    answer: dict[str, Any] = {}
    for out in _returned(shapes, include):
        if out.kind == "heads":
            rows = _present(shapes, True)
            answer[out.name] = [
                {o.name: per_head[o.name][0 if unbatch else slice(None), i] for o in rows}
                for i in range(shapes.num_heads)
            ]
            continue
        value: Any = per_head[out.name] if out.head else values.get(out.name)
        if value is None and out.optional:  # a parameter the request did not give
            continue
        if value is None and not out.head:
            value = values[out.name]  # every other value the table says is present
        value = value() if callable(value) else value
        answer[out.name] = value[0] if unbatch and out.batched else value
    return answer


@by_shapes
def _returned(shapes: Shapes, include: frozenset[str] | None) -> tuple[Output, ...]:
    """The top-level outputs a response carries, in table order: present, and asked for."""
    return tuple(
        out
        for out in _present(shapes, False)
        if out.always
        or (include is None and not out.asked)
        or (include is not None and out.name in include)
    )


@by_shapes
def _present(shapes: Shapes, heads: bool) -> tuple[Output, ...]:
    """The rows present in a request of these shapes: at the top, or inside each head."""
    rows = in_heads(shapes.endpoint) if heads else top_level(shapes.endpoint)
    return tuple(out for out in rows if out.present(shapes))
