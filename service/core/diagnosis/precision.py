"""Low precision judged as kernels are (API.md, "Compare, third edition": low precision).

A kernel in bfloat16 cannot give float64's numbers; whether its numbers are right is judged as
FlashAttention's tests judge a kernel (``tests/test_flash_attn.py``: the kernel's error at most
twice a reference's in the same type, plus an absolute slack): the service computes the same
attention as a kernel in that type does — every input (x, the weights, the cache, q, k, v given)
rounded to the type, each step computed in float32 from the previous steps' arrays in the type,
and its result rounded to the type (bfloat16 tensor cores: bfloat16 operands, float32
accumulation, bfloat16 stored) — and the caller's numbers match when their largest error
against the float64 result is at most 2 × that reference's largest error + the type's atol
(PyTorch's ``torch.testing`` defaults: bfloat16 and float16 1e-3, float32 1e-5).

NumPy with ``ml_dtypes`` (bfloat16), no I/O.
"""

from dataclasses import dataclass, replace
from typing import Any

import ml_dtypes
import numpy as np
from numpy.typing import NDArray

from service.core.diagnosis.recompute import stages_on
from service.core.diagnosis.stages import Setup, State, Trial, Unfit
from service.core.errors import AttentionInputError
from service.core.linear import Past, Projections
from service.core.types import Array

MANY_DECIMALS = 4  # numbers all on a grid of this many decimals or fewer were printed
# a kernel's bfloat16 numbers mostly use 6–8 of its 8 significant bits (7 in 8 use more than 4)
FEW_BITS = 4


@dataclass(frozen=True)
class LowType:
    """A low-precision type: its NumPy dtype and the absolute slack its verdict allows."""

    name: str
    dtype: Any
    atol: float

    def rounded(self, a: Array) -> Array:
        """``a`` rounded to the type, held in float32 (where a kernel computes)."""
        return np.asarray(a).astype(self.dtype).astype(np.float32)

    def holds(self, a: Array) -> bool:
        """Whether every finite number of ``a`` is exactly a number of the type."""
        y = a[np.isfinite(a)]  # (k,)
        with np.errstate(over="ignore"):
            return bool(y.size) and bool(np.all(y.astype(self.dtype).astype(np.float64) == y))


# the types a caller may name in tolerance.precision; detected in this order (coarsest first)
TYPES: dict[str, LowType] = {
    t.name: t
    for t in (
        LowType("bfloat16", ml_dtypes.bfloat16, 1e-3),
        LowType("float16", np.float16, 1e-3),
        LowType("float32", np.float32, 1e-5),
    )
}
_DETECTED = ("bfloat16", "float16")  # float32 is every float32 print: named, never detected


def _significant_bits(y: Array) -> NDArray[np.int64]:
    """How many significant binary digits each nonzero number of ``y`` has (1 for 0.5 and
    0.03125, 2 for 0.75, 8 for most bfloat16 numbers), same shape."""
    mantissa, _ = np.frexp(y)  # (k,) in [0.5, 1)
    bits = np.zeros(y.shape, dtype=np.int64)
    for b in range(1, 54):  # the first b at which mantissa · 2^b is whole
        whole = (bits == 0) & (np.ldexp(mantissa, b) == np.rint(np.ldexp(mantissa, b)))
        bits[whole] = b
    return bits


def detected(yours: Array) -> LowType | None:
    """The low-precision type every number of ``yours`` is exactly a number of (bfloat16, else
    float16), when the numbers look computed in it: some needs more than
    :data:`MANY_DECIMALS` decimals, and most of the nonzero ones need more than
    :data:`FEW_BITS` significant binary digits. Course numbers (0.5, 1.25, 1/32 = 0.03125 in a
    uniform row, integers) are numbers of every type and are none of these: None for them."""
    if yours.dtype.kind != "f":
        return None
    y = yours[np.isfinite(yours)]  # (k,)
    scaled = y * 10.0**MANY_DECIMALS  # (k,)
    if y.size == 0 or np.all(np.abs(scaled - np.rint(scaled)) <= 1e-9 * np.maximum(1, scaled)):
        return None
    nonzero = y[y != 0]  # (k',)
    if np.mean(_significant_bits(nonzero) > FEW_BITS) < 0.5:
        return None  # simple fractions: a course's numbers, not a kernel's
    return next((TYPES[n] for n in _DETECTED if TYPES[n].holds(y)), None)


def _setup_in(s: Setup, t: LowType) -> Setup:
    """The setup's arrays (x, the weights, the cache) as a kernel in ``t`` holds them."""

    def r(a: Array | None) -> Array | None:
        return None if a is None else t.rounded(a)

    p = s.projections
    return replace(
        s,
        x_in=r(s.x_in),
        context=r(s.context),
        projections=None
        if p is None
        else Projections(*(r(a) for a in (p.w_q, p.w_k, p.w_v, p.b_q, p.b_k, p.b_v))),  # type: ignore[arg-type]
        w_o=r(s.w_o),
        b_o=r(s.b_o),
        past=None if s.past is None else Past(t.rounded(s.past.k), t.rounded(s.past.v)),
    )


def in_low_precision(base: State, s: Setup, t: LowType) -> State:
    """Every step of ``base`` (the float64 computation's arrays) as a kernel in ``t`` computes
    it (the module's doc); a step the engine did not compute (q, k, v given) is the base's,
    rounded."""
    low = _setup_in(s, t)
    st = {name: t.rounded(a) if a.dtype.kind == "f" else a for name, a in base.items()}
    # "error" has no fully masked rows to fill: the request would have been refused
    plain = Trial(frozenset(), "uniform" if s.fully_masked_policy == "uniform" else "zero")
    for stage in stages_on(low):
        if not any(n in base for n in stage.names):
            continue  # a step this computation has not
        try:
            with np.errstate(all="ignore"):
                made = stage.compute(st, low, plain)
        except (Unfit, AttentionInputError):
            continue  # given, not computed: the base's, rounded
        st |= {n: t.rounded(a) if a.dtype.kind == "f" else a for n, a in made.items()}
    return st
