"""Attention masks: each kind builds a boolean ``(B, L, S)`` array, true = may attend.

Several masks combine with AND. An additive mask is added to the scaled scores; its −∞
entries (``null`` in JSON) also mask. Masks know nothing of JSON: the API turns request
objects into these dataclasses.
"""

from dataclasses import dataclass

import numpy as np

from service.core.errors import AttentionInputError
from service.core.types import Alignment, Array, BoolArray


@dataclass(frozen=True)
class Causal:
    """Query i sees keys j ≤ i (upper_left) or j ≤ i + (S − L) (lower_right)."""

    alignment: Alignment = "upper_left"


@dataclass(frozen=True)
class Padding:
    """Keys at index ≥ key_lengths[b] are masked; query rows at index ≥ query_lengths[b] are
    padding (their weights and output are zero)."""

    key_lengths: tuple[int, ...] | None = None
    query_lengths: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Window:
    """Query i sees keys j with i − left ≤ j ≤ i + right; None means unbounded on that side,
    and so does any width at least the sequence's (2^63 − 1, ``sys.maxsize``, included)."""

    left: int | None = None
    right: int | None = None


@dataclass(frozen=True)
class Chunked:
    """Llama 4's chunked attention: query i sees keys j ≤ i in its own block of ``size``
    positions (⌊i/size⌋ = ⌊j/size⌋), transformers' ``chunked_causal_mask_function``. A size
    at least the sequence's is one block: the causal mask."""

    size: int


@dataclass(frozen=True)
class Boolean:
    """An explicit ``(L, S)`` or ``(B, L, S)`` matrix, true = may attend."""

    matrix: BoolArray


@dataclass(frozen=True)
class Additive:
    """An ``(L, S)`` or ``(B, L, S)`` matrix added to the scaled scores; −∞ masks."""

    matrix: Array


MaskSpec = Causal | Padding | Window | Chunked | Boolean | Additive


@dataclass(frozen=True)
class CombinedMask:
    """All masks of a request folded together, for a batch of B sequences.

    allowed:        (B, L, S) bool, true = may attend (padded query rows are all false)
    additive:       (B, L, S) float: 0 where allowed, −∞ where masked, plus additive values
    padded_queries: (B, L) bool, query rows that are padding (weights and output forced to 0)
    """

    allowed: BoolArray
    additive: Array
    padded_queries: BoolArray


def causal(
    seq_len: int,
    ctx_len: int,
    alignment: Alignment = "upper_left",
    diagonal: bool = True,
    row_offset: int = 0,
) -> BoolArray:
    """(L, S) causal pattern; lower_right shifts the diagonal by S − L (KV-cache style).
    ``diagonal`` False hides the diagonal too (each query's own key: a notebook's mistake).
    ``row_offset`` P: the queries are rows P … P + L − 1 of a longer sequence (a decode step
    after P cached tokens)."""
    offset = ctx_len - seq_len if alignment == "lower_right" else row_offset
    i = np.arange(seq_len)[:, None]  # (L, 1)
    j = np.arange(ctx_len)[None, :]  # (1, S)
    return j <= i + offset if diagonal else j < i + offset


def _span(seq_len: int, ctx_len: int, row_offset: int) -> int:
    """A width that already reaches every key from every query (the largest row or key index
    + 1): a window or chunk as wide or wider is the same mask. Python ints of any size are
    clamped to it before NumPy sees them, so 2^63 neither overflows int64 nor wraps."""
    return max(seq_len + row_offset, ctx_len, 1)


def window(
    seq_len: int, ctx_len: int, left: int | None, right: int | None, row_offset: int = 0
) -> BoolArray:
    """(L, S) band: query i (row i + row_offset of the sequence) sees keys j with
    i − left ≤ j ≤ i + right (a side wider than the sequence does not limit)."""
    span = _span(seq_len, ctx_len, row_offset)
    i = np.arange(seq_len)[:, None] + row_offset  # (L, 1)
    j = np.arange(ctx_len)[None, :]  # (1, S)
    ok = np.ones((seq_len, ctx_len), dtype=bool)
    if left is not None:
        ok &= j >= i - min(left, span)
    if right is not None:
        ok &= j <= i + min(right, span)
    return ok


def chunked(seq_len: int, ctx_len: int, size: int, row_offset: int = 0) -> BoolArray:
    """(L, S) causal within blocks of ``size``: key j ≤ i and ⌊j/size⌋ = ⌊i/size⌋ (i counted
    from ``row_offset``; a size wider than the sequence is one block)."""
    block = min(size, _span(seq_len, ctx_len, row_offset))
    i = np.arange(seq_len)[:, None] + row_offset  # (L, 1)
    j = np.arange(ctx_len)[None, :]  # (1, S)
    ok: BoolArray = (j <= i) & (j // block == i // block)  # (L, S)
    return ok


def _lengths_mask(lengths: tuple[int, ...], batch: int, size: int) -> BoolArray:
    """(B, size) true for positions below each item's length."""
    n = np.asarray(lengths if len(lengths) == batch else lengths * batch)  # (B,)
    return np.arange(size)[None, :] < n[:, None]


def combine(
    specs: list[MaskSpec], batch: int, seq_len: int, ctx_len: int, row_offset: int = 0
) -> CombinedMask:
    """Fold the masks (AND) into one CombinedMask of shape (B, L, S). ``row_offset`` P: the
    queries are rows P … P + L − 1 of the sequence (a decode step after P cached tokens), as
    the causal, window and chunked patterns count them.

    Shapes must already be validated: matrices are (L, S) or (B, L, S), lengths have one
    entry per batch item (or one entry in total, applied to every item).
    """
    shape = (batch, seq_len, ctx_len)
    allowed = np.ones(shape, dtype=bool)  # (B, L, S)
    additive = np.zeros(shape)  # (B, L, S)
    padded_queries = np.zeros((batch, seq_len), dtype=bool)  # (B, L)
    for spec in specs:
        match spec:
            case Causal(alignment):
                allowed &= causal(seq_len, ctx_len, alignment, row_offset=row_offset)
            case Window(left, right):
                allowed &= window(seq_len, ctx_len, left, right, row_offset)
            case Chunked(size):
                allowed &= chunked(seq_len, ctx_len, size, row_offset)
            case Padding(key_lengths, query_lengths):
                if key_lengths is not None:
                    allowed &= _lengths_mask(key_lengths, batch, ctx_len)[:, None, :]
                if query_lengths is not None:
                    padded_queries |= ~_lengths_mask(query_lengths, batch, seq_len)
            case Boolean(matrix):
                allowed &= matrix.astype(bool)
            case Additive(matrix):
                with np.errstate(over="ignore", invalid="ignore"):  # refused just below
                    additive += matrix  # −∞ entries mask
    if (np.isposinf(additive) | np.isnan(additive)).any():
        raise AttentionInputError(
            "the additive masks add up past float64's largest number (±1.8e308): a bias of "
            "+∞ cannot be applied; keep their sum below 1e308 (null masks a key)"
        )
    allowed &= ~padded_queries[:, :, None]
    allowed &= ~np.isneginf(additive)
    additive[~allowed] = -np.inf
    return CombinedMask(allowed=allowed, additive=additive, padded_queries=padded_queries)
