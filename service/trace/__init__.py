"""The trace pipeline: from a validated request to the response body, every step of attention
computed, explained and compared. The HTTP room (:mod:`service.http`) reaches it through this
door only:

    admitted = admit(req, "multihead", settings)  # rules, expected, include, limits: no arrays
    body = run(admitted, check)                   # plan, engine, outputs, steps, comparison

and declares the compute endpoints from :data:`ENDPOINTS`, the one table of what HTTP declares.
``admit`` is cheap and runs wherever the body is parsed (in a parser process for large bodies,
see service.http.parser); ``run`` allocates, so it runs once the memory budget has admitted the
numbers ``admit`` counted. Both call the pipeline's stages by name, so a reader follows a
request from here: :func:`admit` → ``wire.fold.folded`` (/multihead) → ``rules.*_shapes`` →
``comparison.check_expected`` → ``outputs.check_include`` → ``limits.check_limits``;
:func:`run` → ``plan.plan_*`` → ``compute.run_*``.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from service.config import Settings
from service.trace import outputs
from service.trace.comparison import check_expected
from service.trace.compute import Check, run_attention, run_multihead
from service.trace.limits import check_limits
from service.trace.plan import plan_attention, plan_multihead
from service.trace.responses import AttentionResponse, MaskResponse, MultiheadResponse
from service.trace.rules import attention_shapes, multihead_shapes
from service.trace.shapes import Endpoint, Shapes
from service.wire import examples
from service.wire.fold import folded
from service.wire.schemas.requests import (
    AttentionRequest,
    InputFields,
    MaskRequest,
    MultiheadRequest,
)


@dataclass(frozen=True)
class ComputeEndpoint:
    """One compute endpoint: what HTTP declares (path, request and response models, the worked
    examples and the words of /docs) and which rows of the outputs table it has."""

    name: str  # the path without its slash
    description: str  # /docs' description of the endpoint
    model: type[InputFields]  # the request body
    response: type[BaseModel]  # the documented 200 body
    examples: Mapping[str, Any]  # /docs' worked examples (fastapi.openapi.models.Example)
    outputs: Endpoint  # which rows of the outputs table it has


ENDPOINTS: dict[str, ComputeEndpoint] = {
    e.name: e
    for e in (
        ComputeEndpoint(
            "attention",
            "Scaled dot-product attention, every step: Q, K, V, scores, scaled scores, "
            "weights, output.",
            AttentionRequest,
            AttentionResponse,
            examples.ATTENTION_EXAMPLES,
            "attention",
        ),
        ComputeEndpoint(
            "mask",
            "Attention with a mask (causal, padding, window, chunked, boolean, additive; combined with "
            "AND), returning the combined mask, the masked scores and the fully masked rows.",
            MaskRequest,
            MaskResponse,
            examples.MASK_EXAMPLES,
            "attention",
        ),
        ComputeEndpoint(
            "multihead",
            "Multi-head attention: per-head traces, averaged weights, concat, W_o, residual, "
            "layer norm.",
            MultiheadRequest,
            MultiheadResponse,
            examples.MULTIHEAD_EXAMPLES,
            "multihead",
        ),
    )
}


@dataclass(frozen=True)
class Admitted:
    """A request whose rules, expected arrays, include and limits hold: what it is, the shapes
    it implies and how many numbers computing it makes (intermediates included). Pickled
    from a parser process to its worker."""

    endpoint: str  # a key of ENDPOINTS
    req: InputFields
    shapes: Shapes
    numbers: int

    @property
    def comparing(self) -> bool:
        """Whether the request carries expected arrays (its diagnosis may recompute a lot)."""
        return self.shapes.comparing

    @property
    def decimals(self) -> int | None:
        """The rounding the answer asks for."""
        return self.req.decimals

    def numbers_in(self, body: Mapping[str, Any]) -> dict[str, int]:
        """How many numbers each top-level output of ``body`` holds (to give their memory
        back as each is written)."""
        return {name: n for name, n in outputs.sizes(self.shapes).items() if name in body}


def admit(req: InputFields, endpoint: str, settings: Settings) -> Admitted:
    """Apply every rule to a validated request of ``endpoint`` (its shapes, the expected
    arrays' shapes, the names in include, the limits), or raise the error that names the
    field (:mod:`service.wire.errors`). Draws and computes nothing."""
    if isinstance(req, MultiheadRequest):
        req = folded(req)  # config, k_eq_v, gate: true as the fields they imply
        shapes = multihead_shapes(req)
    else:
        assert isinstance(req, AttentionRequest)  # /attention and /mask (MaskRequest)
        shapes = attention_shapes(req)
    shapes = check_expected(req.expected, shapes)
    outputs.check_include(ENDPOINTS[endpoint].outputs, req.include)
    return Admitted(endpoint, req, shapes, check_limits(shapes, req.include, settings))


def run(admitted: Admitted, check: Check) -> dict[str, Any]:
    """Plan, compute and shape the response body (arrays and values, not yet encoded).
    ``check`` is called between the large steps and raises to stop (the client has gone)."""
    req, shapes = admitted.req, admitted.shapes
    if isinstance(req, MultiheadRequest):
        heads = plan_multihead(req, shapes)
        check()
        return run_multihead(heads, check)
    assert isinstance(req, AttentionRequest)  # /attention and /mask (MaskRequest)
    plan = plan_attention(req, shapes)
    check()
    return run_attention(plan, check)
