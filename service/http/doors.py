"""The endpoints that compute, one row each: how a body of each is parsed and admitted, and how
it runs — the compute endpoints of service.trace.ENDPOINTS and POST /model
(service.models.answer). service.http.routes answers every row by the same path."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from service import trace
from service.config import Settings
from service.models import answer as model_answer
from service.trace import ENDPOINTS
from service.trace.compute import Check
from service.wire.media import Format
from service.wire.parse import parse
from service.wire.schemas.model_fields import ModelRequest


class Answerable(Protocol):
    """A request admitted by its door: what the answer path needs to know of it."""

    @property
    def numbers(self) -> int:
        """Every number computing it makes (its memory, BYTES_PER_NUMBER each)."""

    @property
    def comparing(self) -> bool:
        """Whether it carries expected arrays (a diagnosis may recompute a lot)."""

    @property
    def decimals(self) -> int | None:
        """The rounding its answer asks for."""

    def numbers_in(self, body: Mapping[str, Any]) -> dict[str, int]:
        """The numbers each top-level output of ``body`` holds."""


@dataclass(frozen=True)
class Door:
    """What the answer path needs of one endpoint that computes."""

    model: type[BaseModel]  # its body
    admit: Callable[[Any, Settings], Any]  # the rules that run wherever the body is parsed
    run: Callable[[Any, Check], dict[str, Any]]  # the body (arrays and values), once admitted
    ready: Callable[[Any, Settings], Answerable] | None = None  # the rules that need the
    # worker's own state (a trained model, its tokenizer): in a thread of the worker
    advice: str = "use fewer heads, a smaller batch, shorter sequences or fewer masks"  # 413


def _traced(endpoint: str) -> Callable[[Any, Settings], Answerable]:
    """A compute endpoint's rules and limits (service.trace.admit)."""
    return lambda req, settings: trace.admit(req, endpoint, settings)


DOORS: dict[str, Door] = {
    **{name: Door(e.model, _traced(name), trace.run) for name, e in ENDPOINTS.items()},
    "model": Door(
        ModelRequest,
        model_answer.check,
        model_answer.run,
        ready=model_answer.admit,
        advice=model_answer.BUDGET_ADVICE,
    ),
}


def checked(raw: bytes, endpoint: str, settings: Settings, form: Format = "json") -> Any:
    """Parse a body of ``endpoint`` (a key of DOORS) and apply the rules its door applies
    wherever the body is parsed: what the parser process runs for large bodies, and the event
    loop or a thread for small ones."""
    door = DOORS[endpoint]
    return door.admit(parse(raw, door.model, form), settings)
