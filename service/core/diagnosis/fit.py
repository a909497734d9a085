"""Ways of making a mistake found from the caller's numbers rather than listed beforehand: a
RoPE base (``rope_base_wrong``) fitted by a 1-D search over log(base), a decode step's position
offset (``decode_position_offset``) by a scan over whole offsets, each minimising the difference
from the caller's array at the probes (:func:`service.core.diagnosis.search`'s) under the set's
other mistakes. What is fitted is then tried like any listed way: it is named only when its
recomputation reproduces the whole array to the tolerance. NumPy only, no I/O."""

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from service.core.diagnosis.recompute import Given, recomputations, set_cost
from service.core.diagnosis.stages import FIT, Setup, State, Trial, Way
from service.core.types import Array

LOG_BASES = (np.log(10.0), np.log(1e9))  # the bases searched: 10 … 10⁹ (rope_theta's range)
GRID = 25  # bases tried evenly in log(base) (a factor of ~2.2 apart), the best one refined
GOLDEN_STEPS = 14  # golden-section steps between its neighbours: into the smooth bottom
PARABOLA_STEPS = 6  # then parabolic steps through the three nearest: to rounding's precision
EVALUATIONS = GRID + GOLDEN_STEPS + PARABOLA_STEPS
_GOLDEN = (np.sqrt(5.0) - 1.0) / 2.0

Probes = tuple[np.ndarray[Any, np.dtype[np.intp]], ...]


def fitting(variants: Sequence[Trial]) -> list[Trial]:
    """The variants of a set whose way is to be found from the numbers."""
    return [t for t in variants if any(w == FIT for _, w in t.ways)]


MAX_OFFSETS = 64  # whole offsets a decode step's positions are scanned over, nearest 0 first


def offsets(s: Setup) -> tuple[int, ...]:
    """The offsets δ a decode step's new tokens may have been rotated at (positions + δ),
    besides those listed (0 … L − 1, one ahead, one behind): the nearest to 0 within ± the
    cache and the new tokens, and the cache's length itself (a cache counted twice)."""
    p = s.variants.positions
    first = int(p[0]) if p is not None and p.size else 0
    cached = 0 if s.past is None else s.past.length
    reach = cached + s.seq_len
    listed = {0, 1, -1, -first}
    near = sorted(range(-reach, reach + 1), key=lambda d: (abs(d), d))
    scan = [d for d in near if d not in listed and d >= -first][: MAX_OFFSETS - 1]
    return tuple(dict.fromkeys([*scan, *([cached] if cached not in listed else [])]))


def _evaluations(code: str, s: Setup) -> int:
    """The recomputations fitting ``code`` takes, and the ways it then tries (the fit, and for
    a base the roundest base near it)."""
    return EVALUATIONS + 1 if code == "rope_base_wrong" else len(offsets(s))


def fit_cost(base: State, given: Given, s: Setup, variants: Sequence[Trial], target: str) -> int:
    """The numbers fitting every variant of ``variants`` that asks for a fit computes, known
    beforehand (:func:`_evaluations` recomputations each), besides the ways it then tries."""
    fits = fitting(variants)
    if not fits:
        return 0
    one = set_cost(base, given, s, fits[:1], target)
    codes = [next(c for c, w in t.ways if w == FIT) for t in fits]
    return sum(_evaluations(code, s) for code in codes) * one


def fitted(
    base: State,
    given: Given,
    s: Setup,
    variants: Sequence[Trial],
    target: str,
    check: Callable[[], None],
    distance: Callable[[Array], float],
) -> list[Trial]:
    """``variants`` with each fit replaced by the bases found for it (the fitted base and the
    roundest base this close to it, e.g. 20000 for 19999.9997); a fit that finds nothing is
    left out. ``distance``: how far a recomputation is from the caller's array (at the
    probes)."""
    out: list[Trial] = []
    for trial in variants:
        code = next((c for c, w in trial.ways if w == FIT), None)
        if code is None:
            out.append(trial)
            continue
        fit = _fit_base if code == "rope_base_wrong" else _fit_offset
        found = fit(base, given, s, trial, code, target, check, distance)
        out += [_with(trial, code, b) for b in found]
    return out


def _with(trial: Trial, code: str, way: Way) -> Trial:
    return replace(trial, ways=tuple((c, way if c == code else w) for c, w in trial.ways))


def _fit_base(
    base: State,
    given: Given,
    s: Setup,
    trial: Trial,
    code: str,
    target: str,
    check: Callable[[], None],
    distance: Callable[[Array], float],
) -> tuple[float, ...]:
    """The base (or bases) the 1-D search over log(base) finds: the best of :data:`GRID` bases,
    refined by golden section between its neighbours, then by parabolic steps (``distance``
    is a sum of squares: a parabola near its minimum)."""
    seen: dict[float, float] = {}

    def far(log_base: float) -> float:
        way = _with(trial, code, float(np.exp(log_base)))
        seen[log_base] = next(
            (distance(made) for _, made in recomputations(base, given, s, [way], target, check)),
            np.inf,
        )
        return seen[log_base]

    grid = np.linspace(*LOG_BASES, GRID)  # (GRID,)
    values = [far(float(g)) for g in grid]
    best = int(np.argmin(values))
    if not np.isfinite(values[best]):
        return ()
    lo, hi = float(grid[max(best - 1, 0)]), float(grid[min(best + 1, GRID - 1)])
    a, b = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    fa, fb = far(a), far(b)
    for _ in range(GOLDEN_STEPS - 2):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - _GOLDEN * (hi - lo)
            fa = far(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + _GOLDEN * (hi - lo)
            fb = far(b)
    for _ in range(PARABOLA_STEPS):
        vertex = _vertex(sorted(seen.items(), key=lambda p: p[1])[:3])
        if vertex is None or vertex in seen or not lo <= vertex <= hi:
            break
        far(vertex)
    found = float(np.exp(min(seen, key=lambda x: seen[x])))
    return tuple(dict.fromkeys((_round(found), found)))


def _vertex(points: list[tuple[float, float]]) -> float | None:
    """The x of the lowest point of the parabola through three (x, f) points (None: flat)."""
    (x0, f0), (x1, f1), (x2, f2) = points
    num = (x1 - x0) ** 2 * (f1 - f2) - (x1 - x2) ** 2 * (f1 - f0)
    den = (x1 - x0) * (f1 - f2) - (x1 - x2) * (f1 - f0)
    if not np.isfinite(num / den if den else np.nan) or den == 0:
        return None
    return float(x1 - 0.5 * num / den)


def _fit_offset(
    base: State,
    given: Given,
    s: Setup,
    trial: Trial,
    code: str,
    target: str,
    check: Callable[[], None],
    distance: Callable[[Array], float],
) -> tuple[float, ...]:
    """The whole offset of :func:`offsets` whose recomputation is nearest the numbers."""
    best, nearest = None, np.inf
    for shift in offsets(s):
        for _, made in recomputations(
            base, given, s, [_with(trial, code, float(shift))], target, check
        ):
            if (far := distance(made)) < nearest:
                best, nearest = float(shift), far
    return () if best is None else (best,)


def _round(x: float) -> float:
    """The roundest number (fewest significant digits, up to 6) within 1% of ``x``: the base
    a caller wrote, where printed numbers leave the fit only near it (tried besides the fit,
    and named only if it reproduces the numbers)."""
    for digits in range(1, 7):
        r = float(f"{x:.{digits}g}")
        if abs(r - x) <= 1e-2 * abs(x):
            return r
    return x
