"""A decode step with a cache (API.md, "A decode step with a cache"): ``past``'s rules against
the request's shapes, the cache's labels; and ``check_decode``: the sequence run at once and a
token at a time with a growing cache, compared."""

from collections.abc import Callable
from typing import Any

import numpy as np

from service.core.attention import Past
from service.core.types import Array
from service.trace.checks import batch_words
from service.trace.shapes import Shapes
from service.wire.errors import FieldError
from service.wire.schemas.mask_fields import AdditiveMask, BooleanMask, PaddingMask
from service.wire.schemas.requests import AttentionRequest, MultiheadRequest

Req = AttentionRequest | MultiheadRequest


def past_length(req: Req) -> int:
    """P, the tokens the cache holds (0 without ``past``)."""
    return 0 if req.past is None else int(req.past.k.shape[-2])


def check_past(req: Req, shapes: Shapes) -> None:
    """``past`` against the new tokens: self-attention only, the batch's and heads' sizes, keys
    of d_k and values of d_v features; ``check_decode`` without it, and with masks it can
    replay a row at a time."""
    if req.check_decode:
        _check_replayable(req)
    past = req.past
    if past is None:
        return
    per_head = shapes.endpoint == "multihead"
    if isinstance(req, MultiheadRequest) and (req.context is not None or req.mla is not None):
        field = "context" if req.context is not None else "mla"
        raise FieldError(field, f"past is a decode step of self-attention: {field} does not apply")
    if isinstance(req, AttentionRequest) and req.context is not None:
        raise FieldError("context", "past is a decode step of self-attention: no context")
    new = shapes.ctx_len - shapes.past_len
    if new != shapes.seq_len:
        raise FieldError(
            "k", f"with past, k holds the {shapes.seq_len} new tokens' keys, not {new}"
        )
    lead = 3 if per_head else 2  # [h_kv][P][d] or [P][d] per sequence
    for name, a, width in (("k", past.k, shapes.d_k), ("v", past.v, shapes.d_v)):
        batched = a.ndim == lead + 1
        if batched != (shapes.batch is not None) or (batched and a.shape[0] != shapes.batch):
            raise FieldError(
                f"past.{name}",
                f"past.{name} is {'a batch' if batched else 'unbatched'} but the request is "
                f"{batch_words(shapes.batch)}: the cache takes the new tokens' batch axis",
            )
        if a.shape[-2] != shapes.past_len:
            raise FieldError(
                "past.v", f"past.v holds {a.shape[-2]} tokens, past.k {shapes.past_len}"
            )
        if a.shape[-1] != width:
            what = "d_k" if name == "k" else "d_v"
            raise FieldError(
                f"past.{name}", f"past.{name} has {a.shape[-1]} features but {what} is {width}"
            )
        if per_head and a.shape[-3] != shapes.num_kv_heads:
            raise FieldError(
                f"past.{name}",
                f"past.{name} has {a.shape[-3]} heads but there are {shapes.num_kv_heads} "
                "key/value heads: the cache holds one per key/value head",
            )


def _check_replayable(req: Req) -> None:
    if req.past is not None:
        raise FieldError("check_decode", "check_decode runs the whole sequence: leave out past")
    for i, m in enumerate(req.mask or []):
        if isinstance(m, BooleanMask | AdditiveMask | PaddingMask):
            raise FieldError(
                f"mask[{i}]",
                f"check_decode replays causal, window and chunked masks a token at a time; "
                f"a {m.type} mask has no decode step to compare",
            )
    if req.key_padding_mask is not None:
        raise FieldError("key_padding_mask", "check_decode does not replay key padding")
    if isinstance(req, MultiheadRequest) and (req.context is not None or req.mla is not None):
        raise FieldError("check_decode", "check_decode is for self-attention without mla")
    if isinstance(req, AttentionRequest) and req.context is not None:
        raise FieldError("check_decode", "check_decode is for self-attention: no context")


def cache_labels(shapes: Shapes) -> tuple[str, ...] | None:
    """The keys' labels with a cache: "cache 0" … then the new tokens' (None when unknown)."""
    if shapes.past_len == 0 or shapes.context_tokens is not None:
        return shapes.context_tokens
    if shapes.tokens is None:
        return None
    return tuple(f"cache {i}" for i in range(shapes.past_len)) + shapes.tokens


Step = Callable[[slice, Past], tuple[Array, Past]]  # one token: its output and the cache


def replay(
    run: Step, seq_len: int, prefill: Array, empty: Past, check: Callable[[], None]
) -> dict[str, Any]:
    """``decode_check``: the output of ``run`` a token at a time (``run(slice(t, t + 1),
    cache)`` returns that token's output and the grown cache, from ``empty``) against
    ``prefill`` (B, L, ·) computed at once; ``check`` between the steps (the client may go)."""
    cache = empty
    rows = []
    for t in range(seq_len):
        check()
        out, cache = run(slice(t, t + 1), cache)
        rows.append(out)
    stepped = np.concatenate(rows, axis=1)  # (B, L, ·)
    return {"max_abs_diff": float(np.max(np.abs(stepped - prefill))), "steps": seq_len}
