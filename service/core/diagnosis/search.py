"""Compare a caller's arrays with the service's, and find the mistake behind a difference.

A caller (a course notebook, their own kernel) sends the arrays they computed. Each is
compared with the service's (:func:`difference`); for the earliest one that differs,
:func:`diagnose` recomputes the steps leading to it (:mod:`service.core.diagnosis.recompute`) under each
common mistake of :mod:`service.core.diagnosis.mistakes`, then under each pair, and returns the smallest
set that reproduces the caller's numbers within the tolerance. Nothing is guessed: a set is
named only when the recomputation reproduces the array. A difference of float32's size that
no recomputation explains more closely is named ``float32_arithmetic`` (alone, or with the one
mistake whose recomputation agrees with the caller's array only that closely).

The diagnosis can cost far more than the request itself (up to ~200 candidate sets, some tried
several ways, each recomputed from its first changed step), so :func:`search` is given a
budget of numbers to compute: a set's cost is known before it runs
(:func:`service.core.diagnosis.recompute.set_cost`), the sets run in order (singles first, then pairs,
in the table's order) and the search stops before the first set that no longer fits, saying
so (:attr:`Search.complete`). NumPy only, no I/O.
"""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import combinations, groupby, product
from typing import Any, Literal

import numpy as np

from service.core.diagnosis.fit import fit_cost, fitted, fitting
from service.core.diagnosis.gradients import (
    View,
    gradient_cost,
    gradient_recomputations,
    is_gradient,
)
from service.core.diagnosis.mistakes import (
    CODES,
    EXCLUSIVE,
    FLOAT32,
    FLOAT32_RELATIVE,
    applicable,
    likelier,
    ways,
)
from service.core.diagnosis.recompute import Given, recomputations, set_cost
from service.core.diagnosis.stages import (
    FIT,
    MASK_MISTAKES,
    RowPolicy,
    Setup,
    State,
    Trial,
    Way,
    per_query_head,
)
from service.core.types import Array, FullyMaskedPolicy

EXACT_RELATIVE = 1e-12  # a reproduction this close (× the array's largest number) is exact
MASKED_FLOOR = -1e9  # a caller's score at or below this counts as masked (masked_fill(-1e9))
_ROW_POLICIES: tuple[RowPolicy, ...] = ("zero", "uniform", "nan")


MAX_PRINTED_DIGITS = 8  # NumPy prints 8 decimals, torch 4: more than 8 is not a print
PRINTED_SLACK = 1e-6  # × the array's largest |number|: float32 rounding of the caller's own
_GRID_EPS = 8 * float(np.finfo(np.float64).eps)  # a printed number parsed: this close to its grid


@dataclass(frozen=True)
class Printed:
    """The precision a caller's numbers were printed with: ``n`` decimals, or ``n``
    significant digits (small numbers in e-notation)."""

    kind: Literal["decimals", "significant"]
    n: int

    def unit(self, x: Array) -> Array:
        """One unit in the last printed digit of each number of ``x``, same shape."""
        if self.kind == "decimals":
            return np.full_like(x, 10.0**-self.n)
        magnitude = np.abs(x)  # (...,)
        exponent = np.floor(np.log10(magnitude, out=np.zeros_like(x), where=magnitude > 0))
        return 10.0 ** (exponent - self.n + 1)  # (...,)

    def allowed(self, x: Array) -> Array:
        """How far a print of each of ours, ``x`` (finite), may be from it, same shape: half a
        unit in the last printed digit (a print rounds to the nearest); 0 where ours needs no
        more digits than were printed (0.5, 1.5 at 1 decimal): its print is itself."""
        unit = self.unit(x)  # (...,)
        return np.where(_whole(x / unit), 0.0, 0.5 * unit * (1 + 1e-9))  # (...,)


def _whole(scaled: Array) -> Array:
    """Which numbers are whole, to float64 rounding (as a printed number parsed and scaled by
    its power of ten is), same shape."""
    return np.asarray(np.abs(scaled - np.rint(scaled)) <= _GRID_EPS * np.maximum(np.abs(scaled), 1))


def _on_grid(y: Array, scale: Array | float) -> bool:
    """Whether every ``y · scale`` is a whole number, as a printed number parsed to float64 is."""
    return bool(np.all(_whole(y * scale)))


def printed_precision(yours: Array) -> Printed | None:
    """The precision ``yours`` was printed with, if it was printed (API.md, "Printed numbers"):
    the fewest decimals n ≤ 8 that hold every finite number (None when they are all integers:
    compared as given), else the fewest significant digits n ≤ 8 that do; None when neither
    does (numbers at full precision) or the array is not of floats."""
    if yours.dtype.kind != "f":
        return None
    y = yours[np.isfinite(yours)]  # (k,) the numbers; null (−∞) and NaN hold no digits
    if y.size == 0 or _on_grid(y, 1.0):
        return None
    for n in range(1, MAX_PRINTED_DIGITS + 1):
        if _on_grid(y, 10.0**n):
            return Printed("decimals", n)
    nonzero = y[y != 0]  # (k',)
    exponent = np.floor(np.log10(np.abs(nonzero)))  # (k',)
    for n in range(1, MAX_PRINTED_DIGITS + 1):
        if _on_grid(nonzero, 10.0 ** (n - 1 - exponent)):
            return Printed("significant", n)
    return None


@dataclass(frozen=True)
class Tolerance:
    """A caller's number y matches the service's x when |y − x| ≤ atol + rtol·|x|; or, for
    numbers ``printed`` at a precision, when y is within half a unit of the last printed digit
    of x, or equals x where x needs no more digits (:meth:`Printed.allowed`), up to ``atol``:
    float32's slack in the caller's arithmetic (:func:`printed_tolerance`)."""

    atol: float = 1e-6
    rtol: float = 1e-6
    printed: Printed | None = None
    # low precision (service.core.diagnosis.precision): the type, named or detected; once
    # judged, atol is twice the error of ours computed in it (``reference``) plus its atol
    precision: str | None = None
    reference: float | None = None


@dataclass(frozen=True)
class Difference:
    """How a caller's array differs from the service's."""

    match: bool
    max_abs_diff: float  # ∞ where one side is finite and the other not
    where: tuple[int, ...]  # index of the largest difference
    ours: float
    yours: float


def difference(ours: Array, yours: Array, tol: Tolerance) -> Difference:
    """Compare two arrays of one shape element by element.

    NaN matches NaN and −∞ matches −∞; where ``ours`` is −∞ (a masked score) any value of
    ``yours`` at or below :data:`MASKED_FLOOR` matches too. Elsewhere a non-finite number
    facing a finite one is an infinite difference.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        same = (np.isnan(ours) & np.isnan(yours)) | (np.isinf(ours) & (ours == yours))
        same |= np.isneginf(ours) & (yours <= MASKED_FLOOR)
        diff = np.abs(ours - yours)  # NaN or ∞ where one side is not finite
        diff = np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))
        finite = np.where(np.isfinite(ours), ours, 0.0)
        if tol.printed is None:
            close = same | (diff <= tol.atol + tol.rtol * np.abs(finite))
        else:  # yours as a print of ours: within half a last-digit unit, or ours itself
            allowed = tol.printed.allowed(finite) + tol.atol  # (...,) atol: float32's slack
            close = same | (np.isfinite(ours) & (diff <= allowed))
    at = np.unravel_index(int(np.argmax(diff)), diff.shape)
    where = tuple(int(i) for i in at)
    return Difference(bool(close.all()), float(diff[at]), where, float(ours[at]), float(yours[at]))


def printed_tolerance(ours: Array, yours: Array) -> Tolerance:
    """The tolerance of an array compared without one given (API.md, "Printed numbers" and
    "never a false match"): at the precision ``yours`` was printed with, plus
    :data:`PRINTED_SLACK` of our largest |number| for the caller's float32 arithmetic; the
    default when it was not printed, or every number of it is ours (:func:`identical`)."""
    printed = None if identical(ours, yours) else printed_precision(yours)
    if printed is None:
        return Tolerance()
    return Tolerance(atol=PRINTED_SLACK * largest_magnitude(ours), rtol=0.0, printed=printed)


def identical(ours: Array, yours: Array) -> bool:
    """Whether every number of ``yours`` is ours (to float64 rounding: :data:`EXACT_RELATIVE`
    of the largest), null and NaN where ours are: numbers that agree this closely were not
    printed at a precision, whatever their decimals (API.md, "never a false match")."""
    if ours.shape != yours.shape:
        return False
    exact = EXACT_RELATIVE * largest_magnitude(ours)
    return difference(ours, yours, Tolerance(atol=exact, rtol=0.0)).match


@dataclass(frozen=True)
class Target:
    """The array to explain: a name of :data:`ORDER`, one head of it (or all), and the
    caller's numbers shaped as that selection of the engine's array."""

    name: str
    head: int | None
    yours: Array
    # a parameter's gradient as the caller holds it (in their layout, under their module's
    # name), made from the engine's gradients by name; ``name`` is then the engine's gradient
    # it is made from (one of them: where the backward makes it) and ``head`` None
    view: View | None = None

    def ours(self, arrays: Mapping[str, Array]) -> Array:
        """The target's selection of the engine's arrays (or of a recomputation's)."""
        if self.view is not None:
            return self.view(arrays)
        a = arrays[self.name]
        return a if self.head is None else a[:, self.head]


@dataclass(frozen=True)
class Diagnosis:
    """The smallest set of mistakes whose recomputation reproduces the caller's array."""

    mistakes: tuple[str, ...]  # in table order
    rows: RowPolicy  # what the fully masked rows held (matters for the mask mistakes)
    difference: Difference  # the reproduction against the caller's array
    ways: tuple[tuple[str, Way], ...] = ()  # how the mistakes with several ways were made


def trials(
    codes: tuple[str, ...],
    policy: FullyMaskedPolicy,
    how: Mapping[str, tuple[Way, ...]] | None = None,
) -> Iterator[Trial]:
    """Each mistake alone, then each pair (never two that exclude each other); a set with a
    mask mistake is tried with fully masked rows of zeros, 1/S and NaN, as notebooks differ,
    and one with a mistake of several ways (``how``: code → its ways) each way (each
    combination, for two). A way fitted to the numbers (:data:`FIT`, far dearer than a listed
    one) is tried after every listed way of the sets of its size, as sets of its own."""
    how = how or {}
    own: RowPolicy = "uniform" if policy == "uniform" else "zero"
    singles = [frozenset({c}) for c in codes]
    pairs = [
        frozenset(p)
        for p in combinations(codes, 2)
        if not any(frozenset(p) <= group for group in EXCLUSIVE)
    ]
    for size in (singles, pairs):
        fitted: list[Trial] = []
        for mistakes in size:
            rows: tuple[RowPolicy, ...] = (own,)
            if mistakes & MASK_MISTAKES:
                rows = (own, *(r for r in _ROW_POLICIES if r != own))
            several = [c for c in CODES if c in mistakes and c in how]
            for r in rows:
                for chosen in product(*(how[c] for c in several)):
                    trial = Trial(mistakes, r, tuple(zip(several, chosen, strict=True)))
                    if FIT in chosen:
                        fitted.append(trial)
                    else:
                        yield trial
        yield from fitted


@dataclass(frozen=True)
class Search:
    """What :func:`search` found and how far it went."""

    found: Diagnosis | None
    complete: bool  # every candidate set that could change the answer was tried
    tried: int  # candidate sets of mistakes tried (each with all its variants)
    sets: int  # candidate sets of mistakes there were
    spent: int  # numbers computed (:func:`set_cost`, and the full comparisons)
    size: int  # how many mistakes the sets tried last held (1 or 2; 0: none tried)
    # other sets of as many mistakes that reproduce the numbers as closely (to rounding)
    alternatives: tuple[tuple[str, ...], ...] = ()


def search(
    base: State,
    given: Given,
    s: Setup,
    target: Target,
    tol: Tolerance,
    budget: int | None = None,
    check: Callable[[], None] = lambda: None,
) -> Search:
    """Which mistakes (the fewest: one, else two) reproduce the caller's ``target`` array,
    computing at most ``budget`` numbers (None: no limit).

    ``base`` holds every array of the computation by name (:data:`ORDER`, engine shapes),
    with the arrays the caller gave (``given``) already put in place of the service's: the
    steps before the target are recomputed from the caller's own numbers where they exist.
    Among sets of one size that reproduce the array, the closest wins, one that does only to
    float32's precision (:func:`float32_tolerance`) last (:func:`_ranked`). Once a set
    reproduces it to rounding (:data:`EXACT_RELATIVE`) no later set can do better: a single
    mistake's search goes on through the other single mistakes only, for those that do as well
    (``alternatives``; the one the request makes likelier named first), a pair's stops there.
    The candidate sets run
    in the order of :func:`trials`, a set with all its variants at once
    (:func:`recomputations`); before each, its cost (:func:`set_cost`) is counted, and the
    search stops before the first set that would take the numbers computed over ``budget``.
    A recomputation is compared with the caller's array first where it differs most from the
    service's, and in full (a pass over the target, counted too) only when it agrees there.
    ``check`` is called between recomputations (it raises when the client has gone).
    """
    base = per_query_head(base, s)
    backward = is_gradient(target.name)  # a gradient: the backward's mistakes, recomputed so
    codes = applicable(s, frozenset(base), backward)
    cost_of, rerun = (
        (gradient_cost, partial(gradient_recomputations, view=target.view))
        if backward
        else (set_cost, recomputations)
    )
    how = ways(s)
    tried_sets = trials(codes, s.fully_masked_policy, how)
    sets = [list(group) for _, group in groupby(tried_sets, _mistakes)]
    ours = target.ours(base)
    shaped = ours.shape == target.yours.shape
    at = (  # a 0-d array (one sink's gradient) is compared whole
        _probes(difference(ours, target.yours, tol).where, ours.shape)
        if shaped and ours.ndim
        else None
    )
    loose = float32_tolerance(ours)
    exact = EXACT_RELATIVE * largest_magnitude(ours)  # rounding's size in this array
    found: list[Diagnosis] = []
    if shaped and (diff := difference(ours, target.yours, loose)).match:  # no mistake at all
        found.append(Diagnosis((FLOAT32,), "zero", diff))
    spent = tried = size = 0
    complete = True
    settled = False  # a set reproduced the numbers to rounding: the rest only add alternatives
    for variants in sets:
        if found and len(variants[0].mistakes) > min(len(d.mistakes) for d in found):
            break
        fits = bool(fitting(variants))  # a way still to be fitted: a RoPE base, say
        if fits and (
            settled or any(set(d.mistakes) - {FLOAT32} == variants[0].mistakes for d in found)
        ):
            continue  # fitted only where no listed way reproduced the numbers
        cost = cost_of(base, given, s, variants, target.name)
        cost += fit_cost(base, given, s, variants, target.name)
        if budget is not None and spent + cost > budget:
            complete = settled  # once settled, no later set changes the answer
            break
        spent, tried, size = spent + cost, tried + 1, len(variants[0].mistakes)
        variants = fitted(base, given, s, variants, target.name, check, _distance(target, at))
        if not variants:  # a fit that found nothing
            continue
        for trial, made in rerun(base, given, s, variants, target.name, check):
            mine = made if target.head is None else made[:, target.head]
            if mine.shape != target.yours.shape or not (
                _agrees(mine, target.yours, at, tol) or _agrees(mine, target.yours, at, loose)
            ):
                continue
            spent += target.yours.size
            diff = difference(mine, target.yours, tol)
            codes_ = trial.mistakes
            if not diff.match and len(codes_) == 1:  # the mistake, computed in float32?
                diff = difference(mine, target.yours, loose)
                codes_ = codes_ | {FLOAT32}
            if diff.match:
                ordered = tuple(c for c in CODES if c in codes_)
                found.append(Diagnosis(ordered, trial.rows, diff, trial.ways))
                if fits:  # the roundest fitted way that reproduces them, not noise's fit
                    break
        if any(d.difference.max_abs_diff <= exact for d in found if FLOAT32 not in d.mistakes):
            settled = True  # reproduced to rounding: no later set can do better; the other
            if size > 1:  # singles may do as well (alternatives), the many pairs are not tried
                break
    best, alternatives = _ranked(found, exact, likelier(s))
    return Search(best, complete, tried, len(sets), spent, size, alternatives)


def _ranked(
    found: list[Diagnosis], exact: float, likely: frozenset[str]
) -> tuple[Diagnosis | None, tuple[tuple[str, ...], ...]]:
    """The diagnosis to name and the other sets that reproduce the numbers as well: of the
    sets with the fewest mistakes, the closest (one that does only to float32's precision
    after any that does better), sets within rounding (``exact``) of it tied; of those, one
    with a mistake the request makes likelier (``likely``: with past, decode_position_offset
    before rope_missing) first, else the first in the table's order."""
    fewest = min((len(d.mistakes) for d in found), default=0)
    candidates = [d for d in found if len(d.mistakes) == fewest]
    if not candidates:
        return None, ()

    def closeness(d: Diagnosis) -> tuple[bool, float]:
        return FLOAT32 in d.mistakes, max(d.difference.max_abs_diff, exact)

    loose, closest = min(closeness(d) for d in candidates)
    tied = [d for d in candidates if closeness(d) <= (loose, closest + exact)]
    tied.sort(key=lambda d: not likely & set(d.mistakes))  # stable: the table's order
    others = dict.fromkeys(d.mistakes for d in tied[1:] if d.mistakes != tied[0].mistakes)
    return tied[0], tuple(others)


def largest_magnitude(a: Array) -> float:
    """The largest |x| of the finite numbers of ``a`` (0 when there are none): the scale that
    float32's rounding and "exact to rounding" are measured against."""
    finite = np.abs(a[np.isfinite(a)])  # (k,)
    return float(finite.max()) if finite.size else 0.0


def float32_tolerance(ours: Array) -> Tolerance:
    """Agreement to float32's precision: within :data:`FLOAT32_RELATIVE` times the largest
    finite number of ``ours`` (float32 rounding grows with the numbers a step sums)."""
    return Tolerance(atol=FLOAT32_RELATIVE * largest_magnitude(ours), rtol=0.0)


def _mistakes(trial: Trial) -> frozenset[str]:
    return trial.mistakes


Probes = tuple[np.ndarray[Any, np.dtype[np.intp]], ...]  # indices, one array per axis
PROBES = 32  # numbers a recomputation is checked at before it is compared in full


def _probes(where: tuple[int, ...], shape: tuple[int, ...]) -> Probes:
    """Where a recomputation is checked first: the index of the largest difference between
    the caller's array and the service's, and numbers spread evenly over the array."""
    size = int(np.prod(shape))
    spread = np.linspace(0, size - 1, num=min(PROBES, size)).astype(np.intp)  # (k,)
    flat = np.unique(np.append(spread, np.ravel_multi_index(where, shape)))  # (k',)
    return np.unravel_index(flat, shape)


def _distance(target: Target, at: Probes | None) -> Callable[[Array], float]:
    """How far a recomputation of the target is from the caller's array at the probes: the
    sum of the squared differences where both are finite (∞ where the shapes differ), what a
    way fitted to the numbers minimises (the fit is then verified in full)."""

    def far(made: Array) -> float:
        mine = made if target.head is None else made[:, target.head]
        if mine.shape != target.yours.shape:
            return np.inf
        mine, yours = (mine, target.yours) if at is None else (mine[at], target.yours[at])
        with np.errstate(invalid="ignore", over="ignore"):
            both = np.isfinite(mine) & np.isfinite(yours)
            return float(np.sum(np.where(both, mine - yours, 0.0) ** 2))

    return far


def _agrees(mine: Array, yours: Array, at: Probes | None, tol: Tolerance) -> bool:
    """Whether two arrays of one shape agree at the probes ``at`` (a match needs it; None:
    yes)."""
    if at is None:
        return True
    return difference(mine[at], yours[at], tol).match


def diagnose(
    base: State,
    given: Given,
    s: Setup,
    target: Target,
    tol: Tolerance,
    check: Callable[[], None] = lambda: None,
) -> Diagnosis | None:
    """Which mistakes (the fewest: one, else two) reproduce the caller's ``target`` array:
    :func:`search` without a budget (see there)."""
    return search(base, given, s, target, tol, None, check).found
