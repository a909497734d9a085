"""The rules of masks: each mask against the scores' shape L×S and the batch, and warnings
that need no expected numbers (a boolean mask whose polarity looks inverted, returned as
``warnings``); and the rules of numeric ranges (:func:`check_ranges`): settings whose numbers
overflow float64 with the request's positions alone (RoPE's frequencies, angles and attention
factor, the temperature's factors, ALiBi's largest bias), refused before anything is drawn on
the field that holds them (an overflow that depends on the data too stays the core's to
refuse). Applied with the other rules (:mod:`service.trace.rules`)."""

import math

import numpy as np

from service.core import positions
from service.core.masks import causal
from service.core.types import BoolArray, IntArray
from service.core.variants import Temperature, temperature_factors
from service.trace.checks import batch_words, engine_rule, lengths, options
from service.trace.rows.rope import rope_settings
from service.trace.shapes import Shapes
from service.wire.errors import FieldError
from service.wire.schemas.mask_fields import AdditiveMask, BooleanMask, PaddingMask
from service.wire.schemas.requests import AttentionRequest, InputFields, MultiheadRequest
from service.wire.schemas.variant_fields import AlibiOptions


def mask_warnings(req: InputFields) -> tuple[dict[str, str], ...]:
    """A ``mask_polarity`` warning for each boolean mask that looks inverted: it blocks each
    query's own key and allows only later ones (an inverted causal mask), or leaves a query
    row with no key; and for a key_padding_mask that pads every key of an item."""
    found: list[dict[str, str]] = []
    for i, m in enumerate(req.mask or []):
        if not isinstance(m, BooleanMask):
            continue
        allowed = m.matrix if m.true_means == "attend" else ~m.matrix  # (L, S) or (B, L, S)
        problem = _polarity_problem(allowed)
        if problem:
            other = "masked" if m.true_means == "attend" else "attend"
            means = "may attend" if m.true_means == "attend" else "masked"
            found.append(
                {
                    "code": "mask_polarity",
                    "field": f"mask[{i}].matrix",
                    "message": f"mask[{i}] {problem}. Its true means {means}; if yours means "
                    f'the opposite, add "true_means": "{other}" to the mask',
                }
            )
    kpm = req.key_padding_mask
    if kpm is not None and kpm.reshape(-1, kpm.shape[-1]).all(axis=-1).any():
        found.append(
            {
                "code": "mask_polarity",
                "field": "key_padding_mask",
                "message": "key_padding_mask marks every key of a sequence as padding, so no "
                "query can attend to anything. Here true means padding (ignored), as in "
                "torch's nn.MultiheadAttention; if your true means keep, invert it",
            }
        )
    return tuple(found)


def _polarity_problem(allowed: BoolArray) -> str | None:
    """What looks inverted about a boolean mask (true = may attend), or None."""
    n_q, n_k = allowed.shape[-2:]
    later_only = ~(allowed & causal(n_q, n_k)).any()  # nothing at or before the diagonal
    if n_q > 1 and later_only and allowed.any():
        return (
            "blocks each query's own key and lets it see only later keys: the opposite of a "
            "causal mask"
        )
    empty = ~allowed.any(axis=-1)  # (..., L)
    if empty.any():
        rows = np.flatnonzero(empty.reshape(-1, n_q).any(axis=0))[:8].tolist()
        return f"masks every key of query row(s) {rows}, so those rows attend to nothing"
    return None


def check_masks(req: InputFields, batch: int | None, seq_len: int, ctx_len: int) -> None:
    """Each mask against the scores' shape L×S and the batch, and the additive masks' sum
    within float64."""
    _check_shapes(req, batch, seq_len, ctx_len)
    total: np.ndarray | None = None  # the additive masks so far, summed: (L, S) or (B, L, S)
    for i, item in enumerate(req.mask or []):
        if not isinstance(item, AdditiveMask):
            continue
        with np.errstate(over="ignore", invalid="ignore"):  # refused just below
            total = item.matrix if total is None else total + item.matrix
        if (np.isposinf(total) | np.isnan(total)).any():
            raise FieldError(
                f"mask[{i}].matrix",
                f"mask[{i}].matrix added to the additive masks before it exceeds float64's "
                "largest number (1.8e308): the bias would be +∞; keep their sum below 1e308",
            )


def _check_shapes(req: InputFields, batch: int | None, seq_len: int, ctx_len: int) -> None:
    for i, item in enumerate(req.mask or []):
        field = f"mask[{i}]"
        if isinstance(item, BooleanMask | AdditiveMask):
            m = item.matrix
            if m.ndim == 3 and (batch is None or m.shape[0] != batch):
                raise FieldError(
                    f"{field}.matrix",
                    f"{field}.matrix is a batch of {m.shape[0]} but the request is {batch_words(batch)}",
                )
            if m.shape[-2:] != (seq_len, ctx_len):
                got = "×".join(map(str, m.shape[-2:]))
                raise FieldError(
                    f"{field}.matrix",
                    f"{field}.matrix is {got} but the scores are L×S = {seq_len}×{ctx_len} ({seq_len} queries, {ctx_len} keys)",
                )
        if isinstance(item, PaddingMask):
            check_padding(item, field, batch, seq_len, ctx_len)


def check_padding(
    item: PaddingMask, field: str, batch: int | None, seq_len: int, ctx_len: int
) -> None:
    if item.key_lengths is None and item.query_lengths is None:
        raise FieldError(field, "a padding mask needs key_lengths, query_lengths or both")
    for name, limit, what in (
        ("key_lengths", ctx_len, "keys (S)"),
        ("query_lengths", seq_len, "queries (L)"),
    ):
        given = lengths(getattr(item, name))
        if given is None:
            continue
        if min(given) < 0:
            raise FieldError(
                f"{field}.{name}", f"{field}.{name} must be 0 or more, got {min(given)}"
            )
        if len(given) not in (1, batch or 1):
            raise FieldError(
                f"{field}.{name}",
                f"{field}.{name} has {len(given)} entries but the batch has {batch or 1} item(s)",
            )
        if max(given) > limit:
            raise FieldError(
                f"{field}.{name}",
                f"{field}.{name} has {max(given)} but there are only {limit} {what}",
            )


def num_masks(req: InputFields) -> int:
    """Mask objects plus key_padding_mask: each a pass over B·L·S entries."""
    return len(req.mask or []) + (req.key_padding_mask is not None)


def check_key_padding(flags: np.ndarray, shapes: Shapes) -> None:
    if flags.shape[-1] != shapes.ctx_len:
        raise FieldError(
            "key_padding_mask",
            f"key_padding_mask has {flags.shape[-1]} entries per row but there are {shapes.ctx_len} keys (S)",
        )
    if flags.ndim == 2 and flags.shape[0] != (shapes.batch or 1):
        raise FieldError(
            "key_padding_mask",
            f"key_padding_mask has {flags.shape[0]} rows but the request is {batch_words(shapes.batch)}: one row [S] per batch item",
        )


# ---- numeric ranges


def check_ranges(req: AttentionRequest | MultiheadRequest, shapes: Shapes, on: set[str]) -> None:
    """RoPE's frequencies, angles and attention factor, the temperature's factors and ALiBi's
    largest bias, from the settings and the positions alone (no data: the scores' own overflow
    stays the core's to refuse)."""
    if "rope" not in on and req.temperature is None and req.alibi is None:
        return  # nothing that reads the positions (most small requests)
    queries, keys = query_positions(req, shapes), _key_positions(req, shapes)
    if "rope" in on:
        rope = rope_settings(req)["rope"]
        field = "rope.scaling" if rope.scaling is not None else "rope.base"
        r = (
            shapes.d_k
            if rope.rotary_dim is None or rope.style == "proportional"
            else rope.rotary_dim
        )
        with engine_rule(field):
            theta = positions.rope_frequencies(r, rope.base, rope.scaling, _top(queries) + 1)
            positions.rope_angles(np.concatenate((queries, keys)), theta, rope.scaling)
    if req.temperature is not None:
        given = req.temperature
        t = Temperature(given.floor_scale, given.attn_scale, given.position_shift)
        with np.errstate(all="ignore"), engine_rule("temperature"):
            factors = temperature_factors(queries, t)  # (L,)
        if not np.isfinite(factors).all():
            raise FieldError(
                "temperature",
                f"temperature floor_scale {t.floor_scale:g} with attn_scale {t.attn_scale:g} makes "
                f"the query factor at position {_top(queries)} overflow float64: give a floor_scale "
                "of 1 or more (Llama 4: 8192)",
            )
    alibi = options(req.alibi, AlibiOptions)
    if alibi is not None and alibi.slopes is not None and keys.size and queries.size:
        span = max(_top(keys) - int(queries.min()), _top(queries) - int(keys.min()))
        span = max(span, _top(np.abs(keys)), _top(keys) - int(keys.min()))  # the other origins
        if not math.isfinite(float(np.abs(alibi.slopes).max()) * span):
            raise FieldError(
                "alibi.slopes",
                f"alibi.slopes times the largest distance between positions ({span}) overflows "
                "float64: give slopes below 1e308 / distance (the paper's are below 1)",
            )


def _top(p: IntArray) -> int:
    return int(p.max()) if p.size else 0


def query_positions(req: AttentionRequest | MultiheadRequest, shapes: Shapes) -> IntArray:
    """(L,) the queries' positions: as given, else P … P + L − 1 (P = 0 without a cache)."""
    if req.positions is not None:
        return np.asarray(req.positions, dtype=np.int64)
    return np.arange(shapes.past_len, shapes.past_len + shapes.seq_len)


def _key_positions(req: AttentionRequest | MultiheadRequest, shapes: Shapes) -> IntArray:
    """The keys' positions, or every position they may default to (0 … S−1, or the queries')."""
    if req.context_positions is not None:
        return np.asarray(req.context_positions, dtype=np.int64)
    default = np.arange(shapes.ctx_len)  # (S,)
    if req.positions is None:
        return default
    return np.concatenate((default, np.asarray(req.positions, dtype=np.int64)))
