"""Limits checked before anything is drawn or computed: sizes against the settings' caps, and
the numbers a request would return and compute (from the outputs table)."""

from service.config import Settings
from service.trace.outputs import sizes
from service.trace.shapes import Shapes
from service.wire.errors import LimitError


def check_limits(shapes: Shapes, include: list[str] | None, settings: Settings) -> int:
    """Raise LimitError when a size is over its cap, the response would be too large, or the
    computation would make too many numbers; otherwise return the numbers computed. Every
    intermediate is computed whatever `include` asks for."""
    caps = [
        ("seq_len", "L (query rows)", shapes.seq_len, settings.max_seq_len),
        ("context", "S (keys)", shapes.ctx_len, settings.max_seq_len),
        ("d_model", "d_model", shapes.d_model or 0, settings.max_d_model),
        ("d_k", "d_k", shapes.d_k, settings.max_d_model),
        ("d_v", "d_v", shapes.d_v, settings.max_d_model),
        ("x", "the batch size B", shapes.batch or 1, settings.max_batch),
        ("num_heads", "num_heads", shapes.num_heads, settings.max_heads),
    ]
    for field, what, value, cap in caps:
        if value > cap:
            raise LimitError(field, f"{what} is {value}, over this service's limit of {cap}", cap)
    numbers = sizes(shapes)
    wanted = [n for n in numbers if include is None or n in include]
    total = sum(numbers[n] for n in wanted)
    if total > settings.max_result_numbers:
        biggest = sorted(wanted, key=lambda n: -numbers[n])[:3]
        listed = ", ".join(f"{n} {numbers[n]:,}" for n in biggest)
        weights = "average_weights" if shapes.endpoint == "multihead" else "weights"
        example = f'["{weights}", "output"]'
        raise LimitError(
            "include",
            f"this request would return {total:,} numbers, over the limit of "
            f"{settings.max_result_numbers:,}; the largest outputs are {listed}. Ask for fewer "
            f"outputs with include (e.g. {example}) or send shorter sequences",
            settings.max_result_numbers,
        )
    masks = shapes.num_masks * (shapes.batch or 1) * shapes.seq_len * shapes.ctx_len
    computed = sum(numbers.values()) + masks  # each mask is built over the B·L·S scores
    # comparing holds at once, besides the computation's arrays: the caller's arrays, and the
    # diagnosis's copies of the computation's arrays with the caller's heads mixed in plus one
    # recomputation (each array at most once) and its working arrays — together measured at
    # ≤ 2 × its numbers in float64, so one `computed` more at BYTES_PER_NUMBER. What the
    # diagnosis computes in all (a recomputation per candidate set of mistakes, up to ~75) is
    # capped apart, at DIAGNOSIS_TIMES × the request's own numbers (service.trace.comparison).
    computed = 2 * computed + shapes.expected_numbers if shapes.comparing else computed
    if computed > settings.max_computed_numbers:
        raise LimitError(
            None,
            f"this request would compute {computed:,} numbers (every intermediate, whatever "
            f"include asks for, and a recomputation when comparing), over the limit of "
            f"{settings.max_computed_numbers:,}; use fewer heads, fewer masks, a smaller batch "
            "or shorter sequences",
            settings.max_computed_numbers,
        )
    return computed
