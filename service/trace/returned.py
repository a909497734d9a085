"""The response body from the outputs table (:mod:`service.trace.outputs`): which outputs a
request of given shapes returns (present, and asked for by ``include``), in table order, each
with its value; looked up once per distinct shapes and include."""

from collections.abc import Mapping
from typing import Any

from service.trace.outputs import Output, in_heads, top_level
from service.trace.shapes import Shapes, by_shapes


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
        value = per_head[out.name] if out.head else values[out.name]
        value = value() if callable(value) else value
        answer[out.name] = value[0] if unbatch and out.batched else value
    return answer


@by_shapes
def _returned(shapes: Shapes, include: frozenset[str] | None) -> tuple[Output, ...]:
    """The top-level outputs a response carries, in table order: present, and asked for."""
    return tuple(
        out
        for out in _present(shapes, False)
        if out.always or include is None or out.name in include
    )


@by_shapes
def _present(shapes: Shapes, heads: bool) -> tuple[Output, ...]:
    """The rows present in a request of these shapes: at the top, or inside each head."""
    rows = in_heads(shapes.endpoint) if heads else top_level(shapes.endpoint)
    return tuple(out for out in rows if out.present(shapes))
