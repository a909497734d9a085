"""What a request implies before anything is computed: its sizes, labels and the parts that are
on. Made by the rules (:mod:`service.trace.rules`); the outputs table, the limits, the plan and
the steps read it."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, TypeVar

from service.core.latent import LatentDims

R = TypeVar("R")
Endpoint = Literal["attention", "multihead"]  # which rows of the outputs table an answer has


@dataclass(frozen=True, kw_only=True)
class Shapes:
    """Sizes, labels and optional parts a request implies, known before anything is computed.
    On /attention there is one head."""

    endpoint: Endpoint
    batch: int | None  # B; None: an unbatched request
    seq_len: int  # L
    ctx_len: int  # S (with past: P + L, the cache and the new tokens)
    d_model: int | None  # None in direct mode
    d_k: int  # per head
    d_v: int  # per head
    num_heads: int = 1  # h
    num_kv_heads: int = 1  # h_kv
    d_out: int = 0  # width of /multihead's output
    num_masks: int = 0  # mask objects, each a pass over B·L·S entries
    generated: tuple[str, ...] = ()  # arrays to draw, in the contract's order
    form: str | None = None  # /multihead's weight form (trace.rows.weight_forms); None: none
    positional: bool = False
    residual: bool = False
    layer_norm: bool = False
    tokens: tuple[str, ...] | None = None
    context_tokens: tuple[str, ...] | None = None
    past_len: int = 0  # P: the tokens a decode step's cache holds (past)
    latent: LatentDims | None = None  # /multihead with mla: its latents' and heads' sizes
    on: frozenset[str] = frozenset()  # the variants that are on (service.trace.rows.variants)
    warnings: tuple[dict[str, str], ...] = ()  # what looks wrong (service.trace.warnings)
    online_block: int | None = None  # online_softmax's keys per block; None: not traced
    check_decode: bool = False  # decode_check is computed and returned
    expected_numbers: int = 0  # the caller's numbers to compare (expected); 0: none
    backward: bool = False  # grad_output given: the gradients are computed and returned

    @property
    def new_keys(self) -> int:
        """The keys this request computes: S, or with past the L new tokens'."""
        return self.ctx_len - self.past_len

    @property
    def masked(self) -> bool:
        """Whether any mask applies (and so the mask outputs are returned)."""
        return self.num_masks > 0

    @property
    def comparing(self) -> bool:
        """Whether the request carries expected arrays to compare."""
        return self.expected_numbers > 0


def by_shapes(fn: Callable[..., R]) -> Callable[..., R]:
    """``fn(shapes, ...)`` computed once per distinct arguments (the 256 latest), as requests of
    the same shapes share the answer; computed afresh for unhashable shapes (warnings hold
    dicts). The answer is shared: callers must not change it."""
    cached = lru_cache(maxsize=256)(fn)

    def cached_or_fresh(*args: Any) -> R:
        try:
            return cached(*args)
        except TypeError:
            return fn(*args)

    return cached_or_fresh
