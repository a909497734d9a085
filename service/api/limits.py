"""Limits checked before any computing: sizes against the settings' caps, and the number of
values the response would hold."""

from service.api.schemas import Dims, InputFields, MultiheadDims
from service.config import Settings


class LimitError(Exception):
    """A request over a configured limit (answered 413)."""

    def __init__(self, field: str | None, message: str, limit: int) -> None:
        self.field = field
        self.limit = limit
        super().__init__(message)


def result_sizes(req: InputFields, dims: Dims) -> dict[str, int]:
    """How many numbers each output of this request holds (before `include` filtering)."""
    b = dims.batch or 1
    L, S, d_k, d_v = dims.seq_len, dims.ctx_len, dims.d_k, dims.d_v
    masked = req.mask is not None
    ls = L * S
    sizes = {
        "summary": b * 3 * L,
        "mask": b * ls if masked else 0,
        "additive_mask": b * ls if masked else 0,
    }
    d_model = dims.d_model or 0
    if "x" in dims.generate:
        sizes["x"] = L * d_model
    if isinstance(dims, MultiheadDims):
        h = dims.num_heads
        per_head = L * d_k + S * d_k + S * d_v + (4 if masked else 3) * ls + ls + L * d_v
        for name, width in (
            ("w_q", h * d_k),
            ("w_k", dims.num_kv_heads * d_k),
            ("w_v", dims.num_kv_heads * d_v),
        ):
            if name in dims.generate:
                sizes[name] = d_model * width
        sizes |= {
            "heads": b * h * per_head,
            "average_weights": b * ls,
            "x_in": b * L * d_model,
            "concat": b * L * h * d_v,
            "projected": b * L * dims.d_out,
            "residual": b * L * dims.d_out,
            "layer_norm": b * L * dims.d_out,
            "output": b * L * dims.d_out,
        }
        return sizes
    for name, width in (("w_q", d_k), ("w_k", d_k), ("w_v", d_v)):
        if name in dims.generate:
            sizes[name] = d_model * width
    sizes |= {
        "q": b * L * d_k,
        "k": b * S * d_k,
        "v": b * S * d_v,
        "scores": b * ls,
        "scaled_scores": b * ls,
        "masked_scores": b * ls if masked else 0,
        "weights": b * ls,
        "output": b * L * d_v,
    }
    return sizes


def check_limits(req: InputFields, dims: Dims, settings: Settings) -> tuple[int, int]:
    """Raise LimitError when a size is over its cap, the response would be too large, or the
    computation would make too many numbers; otherwise return (numbers returned, numbers
    computed). Every intermediate is computed whatever `include` asks for."""
    caps = [
        ("seq_len", "L (query rows)", dims.seq_len, settings.max_seq_len),
        ("context", "S (keys)", dims.ctx_len, settings.max_seq_len),
        ("d_model", "d_model", dims.d_model or 0, settings.max_d_model),
        ("d_k", "d_k", dims.d_k, settings.max_d_model),
        ("d_v", "d_v", dims.d_v, settings.max_d_model),
        ("x", "the batch size B", dims.batch or 1, settings.max_batch),
    ]
    if isinstance(dims, MultiheadDims):
        caps.append(("num_heads", "num_heads", dims.num_heads, settings.max_heads))
    for field, what, value, cap in caps:
        if value > cap:
            raise LimitError(field, f"{what} is {value}, over this service's limit of {cap}", cap)
    sizes = result_sizes(req, dims)
    wanted = req.include if req.include is not None else list(sizes)
    total = sum(sizes.get(name, 0) for name in wanted)
    if total > settings.max_result_numbers:
        biggest = sorted(((n, sizes.get(n, 0)) for n in wanted), key=lambda t: -t[1])[:3]
        listed = ", ".join(f"{n} {v:,}" for n, v in biggest)
        raise LimitError(
            "include",
            f"this request would return {total:,} numbers, over the limit of "
            f"{settings.max_result_numbers:,}; the largest outputs are {listed}. Ask for fewer "
            'outputs with include (e.g. ["weights", "output"]) or send shorter sequences',
            settings.max_result_numbers,
        )
    computed = sum(sizes.values())
    if computed > settings.max_computed_numbers:
        raise LimitError(
            None,
            f"this request would compute {computed:,} numbers (every intermediate, whatever "
            f"include asks for), over the limit of {settings.max_computed_numbers:,}; use fewer "
            "heads, a smaller batch or shorter sequences",
            settings.max_computed_numbers,
        )
    return total, computed
