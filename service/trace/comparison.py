"""Compare with your numbers: the caller's ``expected`` arrays against the service's, in the
order of the steps, each at the tolerance given or at the precision it was printed with, with
the mistake behind the first difference named when recomputing with it reproduces the caller's
array (:mod:`service.core.diagnosis.search`). (Warnings that need no expected numbers, such as a
boolean mask whose polarity looks inverted, are the mask rules': :mod:`service.trace.mask_rules`.)

The diagnosis recomputes the steps once per candidate set of mistakes (up to ~200 sets; 156 on
a /multihead with RoPE, a causal mask and layer norm, where all of them would compute far more
than the request's own numbers); it may compute at most :data:`DIAGNOSIS_TIMES` times the numbers
the request computed (:func:`diagnosis_budget`), and an entry whose diagnosis stopped there
says so (``diagnosis_complete``: false, and its message says how far it went and how to get a
full one).
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from service.core.diagnosis.gradients import View, gradients, is_gradient, own_rows
from service.core.diagnosis.mistakes import Seen, explain
from service.core.diagnosis.precision import TYPES, LowType, detected, in_low_precision
from service.core.diagnosis.search import (
    Diagnosis,
    Difference,
    Printed,
    Search,
    Target,
    Tolerance,
    difference,
    identical,
    largest_magnitude,
    printed_tolerance,
    search,
)
from service.core.diagnosis.stages import ORDER, Setup, State, Unfit, per_query_head
from service.core.masks import CombinedMask
from service.core.types import Array
from service.trace.output_table import Output
from service.trace.outputs import (
    OUTPUTS,
    gradient_position,
    in_heads,
    top_level,
)
from service.trace.shapes import Endpoint, Shapes
from service.wire.errors import FieldError
from service.wire.schemas.expected_fields import Expected

COMPARABLE = frozenset({"matrix", "vector", "stack", "nullable", "bool"})
# the parameters' gradients (grad_w_q, grad_b_o, grad_sinks, grad_ln_gamma …): compared as the
# answer gives them (the request's layout), their shapes checked once they are computed
PARAMETER_KINDS = frozenset({"weight", "tensor"})
STATE_DICT = "grad_state_dict"
# The diagnosis computes at most DIAGNOSIS_TIMES × the numbers the request computed, and always
# may compute DIAGNOSIS_MIN_NUMBERS (~40 ms of CPU: a small request's diagnosis runs whole).
# The second edition's 23 mistakes make 47 sets on the common /mask case (rows D1, D2: causal,
# L = 512): the notebook's pair (D1) is found and ends the search; noise (D2) tries 43 of them.
# The worst case (D3: /multihead where 156 sets apply) sets the bound: since the engine's Q Kᵀ
# takes BLAS's path, its request without expected costs a third of what it did, and 36× its
# numbers measured 19.5–20.6× its CPU; 30× measured 17.4× (benchmarks/run.py, 2-vCPU Xeon,
# 2026-11-26; D2 12.5×). The target is ≤ 20×. That plain request takes about one 10 ms tick of
# /proc's CPU clock: measured 8× as often (2026-12-05), 30× read 25–26× (before this session's
# codes too: 23×) and 24× about 20×; 22× reads 15.7–19.2× (2-vCPU AMD EPYC, docs/performance.md).
DIAGNOSIS_TIMES = 22
DIAGNOSIS_MIN_NUMBERS = 1 << 23


_PARAMETER_NAMES = frozenset(
    o.name for o in OUTPUTS if o.kind in PARAMETER_KINDS and o.name.startswith("grad_")
)


def _comparable(outs: tuple[Output, ...], shapes: Shapes) -> dict[str, Output]:
    return {o.name: o for o in outs if o.kind in COMPARABLE and o.present(shapes)}


def _shape(out: Output, shapes: Shapes) -> tuple[int, ...]:
    """The shape an output has in the response (per head inside heads[i])."""
    assert out.shape is not None
    lead = (shapes.batch,) if shapes.batch is not None and out.batched else ()
    return (*lead, *out.shape(shapes))


def _shape_problem(field: str, name: str, got: tuple[int, ...], want: tuple[int, ...]) -> str:
    def dims(s: tuple[int, ...]) -> str:
        return "×".join(map(str, s)) if s else "a number"

    text = f"{field} is {dims(got)} but the response's {name} is {dims(want)}"
    if len(got) == len(want) >= 2 and got == (*want[:-2], want[-1], want[-2]):
        text += ": it is the transpose (rows and columns swapped: K Qᵀ, or a missing .T?)"
    elif not want:
        text += f": give {name} as a number"
    elif got == want[1:]:
        text += ": this request is a batch, so give the leading B too"
    elif got[1:] == want:
        text += ": this request is not batched, so leave out the leading axis"
    return text


def _parameters(shapes: Shapes) -> dict[str, Output]:
    """The parameters' gradients this request may return (those of the parameters it has:
    which it has is known once they are computed, :func:`_check_parameter`)."""
    return {
        o.name: o
        for o in top_level(shapes.endpoint)
        if o.kind in PARAMETER_KINDS and o.name.startswith("grad_") and o.present(shapes)
    }


def _has_state_dict(shapes: Shapes) -> bool:
    return any(o.name == STATE_DICT and o.present(shapes) for o in top_level(shapes.endpoint))


def check_expected(expected: Expected | None, shapes: Shapes) -> Shapes:
    """Refuse expected arrays the response would not have, or shaped otherwise (422); return
    the shapes with the numbers to compare counted. The parameters' gradients are checked
    here by name, and by shape once computed (:func:`compare`): which parameters a request
    has, and how it shaped them, its weights' forms decide."""
    if expected is None:
        return shapes
    top = _comparable(top_level(shapes.endpoint), shapes)
    heads = _comparable(in_heads(shapes.endpoint), shapes)
    parameters = _parameters(shapes)
    count = 0

    def check(field: str, name: str, value: Array, outs: dict[str, Output]) -> None:
        nonlocal count
        if outs is top and name in parameters:
            count += value.size
            return
        if name not in outs:
            more = [*parameters, *([STATE_DICT] if _has_state_dict(shapes) else [])]
            choices = ", ".join([*outs, *(more if outs is top else [])]) + (
                ", heads" if heads and outs is top else ""
            )
            raise FieldError(
                field,
                f'{field}: this request returns no array named "{name}" to compare with; '
                f"choose from {choices}",
            )
        want = _shape(outs[name], shapes)
        if value.shape != want:
            raise FieldError(field, _shape_problem(field, name, value.shape, want))
        count += value.size

    for name, value in expected.arrays.items():
        check(f"expected.{name}", name, value, top)
    if expected.heads and not heads:
        raise FieldError("expected.heads", "expected.heads is for /multihead's per-head arrays")
    for i, per_head in expected.heads.items():
        if i >= shapes.num_heads:
            raise FieldError(
                "expected.heads",
                f"expected.heads has an entry for head {i} but there are {shapes.num_heads} heads",
            )
        for name, value in per_head.items():
            check(f"expected.heads[{i}].{name}", name, value, heads)
    if expected.state_dict and not _has_state_dict(shapes):
        raise FieldError(
            f"expected.{STATE_DICT}",
            f"expected.{STATE_DICT}: this request returns no {STATE_DICT} to compare with (it "
            "comes with grad_output on /multihead when the projections are given under a "
            "module's names: in_proj_weight, q_proj.weight, heads); compare grad_w_q, grad_w_k, "
            "grad_w_v, grad_w_o … instead",
        )
    count += sum(a.size for a in expected.state_dict.values())
    return replace(shapes, expected_numbers=max(count, 1))


@dataclass(frozen=True)
class Answered:
    """How the answer gives the parameters' gradients (in the request's layout, and in
    ``grad_state_dict`` under the names the request gave): ``make`` gives them, as the answer
    does, from the engine's gradients by name (in_out); ``made_from`` names the engine's
    gradient each ``grad_state_dict`` entry is made from (grad_w_q for in_proj_weight, packed
    with grad_w_k and grad_w_v)."""

    make: Callable[[Mapping[str, Array]], Mapping[str, Any]]
    made_from: Mapping[str, str]


def _check_parameter(field: str, name: str, yours: Array, made: Mapping[str, Any]) -> None:
    """Refuse a parameter's gradient the answer does not give, or shaped otherwise (422)."""
    if name not in made:
        given = ", ".join(made) or "none"
        raise FieldError(
            field,
            f'{field}: this request returns no "{name}" to compare with (the gradient of a '
            f"parameter it does not have); its parameters' gradients: {given}",
        )
    want = np.shape(made[name])
    if yours.shape != want:
        raise FieldError(field, _shape_problem(field, name, yours.shape, want))


@dataclass(frozen=True)
class _Entry:
    """One compared array: its name in the comparison, where it lives in the engine's state,
    and the caller's numbers as the response shapes them."""

    label: str
    state: str
    head: int | None
    yours: Array
    position: float  # where its step comes (service.trace.outputs.position)
    # a parameter's gradient: as the answer gives it, from the engine's gradients (``state``
    # is then the engine's gradient it is made from)
    view: View | None = None


# the block's arrays on /multihead under the engine's names (the heads' take the plain ones)
_BLOCK_STATE = {"output": "block_output", "grad_output": "grad_block_output"}


def _parameter_entries(expected: Expected, endpoint: Endpoint, answered: Answered | None,
                       state: State) -> dict[str, _Entry]:  # fmt: skip
    """The parameters' gradients among the caller's arrays, by name (grad_state_dict's as
    ``grad_state_dict.<its name>``), each with its view of the engine's gradients, checked
    against what the answer gives (422 for one it does not)."""
    names = [n for n in expected.arrays if n in _PARAMETER_NAMES]
    if answered is None or not (names or expected.state_dict):
        return {}
    made = answered.make(state)
    theirs = {n: a for n, a in made.items() if n in _PARAMETER_NAMES}  # the parameters' only
    entries = {}
    for name in names:
        _check_parameter(f"expected.{name}", name, expected.arrays[name], theirs)
        at = gradient_position(endpoint, name, per_head=False)
        entries[name] = _Entry(
            name, name, None, expected.arrays[name], at, _answered(answered, name, None)
        )
    kept = made.get(STATE_DICT) or {}
    for name, a in expected.state_dict.items():
        label = f"{STATE_DICT}.{name}"
        _check_parameter(f"expected.{label}", name, a, kept)
        source = answered.made_from[name]
        at = gradient_position(endpoint, source, per_head=False)
        entries[label] = _Entry(label, source, None, a, at, _answered(answered, name, STATE_DICT))
    return entries


def _answered(answered: Answered, name: str, inside: str | None) -> View:
    """A parameter's gradient as the answer gives it (inside grad_state_dict or not), from
    the engine's gradients by name."""

    def view(grads: Mapping[str, Array]) -> Array:
        made = answered.make(grads)
        return np.asarray(made[name] if inside is None else made[inside][name], dtype=np.float64)

    return view


def _entries(
    expected: Expected, endpoint: Endpoint, answered: Answered | None, state: State
) -> list[_Entry]:
    """The caller's arrays in the order of the steps, the forward's then the backward's (head
    by head within a step; a parameter's gradient right after the gradient its step reads,
    the projections' last)."""
    multihead = endpoint == "multihead"
    parameters = _parameter_entries(expected, endpoint, answered, state)
    entries = list(parameters.values())
    for name, a in expected.arrays.items():  # the block's output is the engine's block_output
        if name in parameters:
            continue
        state_name = _BLOCK_STATE.get(name, name) if multihead else name
        where = gradient_position(endpoint, name, per_head=False)
        entries.append(_Entry(name, state_name, None, a, where))
    for i, per_head in expected.heads.items():
        entries += [
            _Entry(f"heads.{i}.{n}", n, i, a, gradient_position(endpoint, n, per_head=True))
            for n, a in per_head.items()
        ]
    return sorted(entries, key=lambda e: (e.position, e.head is None, e.head or 0))


def _engine(a: Array, unbatched: bool) -> Array:
    """A response-shaped array with the engine's leading batch axis."""
    return a[None] if unbatched else a


def _ours(state: State, e: _Entry, unbatched: bool) -> Array:
    """The service's array for an entry, shaped as the response returns it."""
    if e.view is not None:
        return e.view(state)
    a = state[e.state] if e.head is None else state[e.state][:, e.head]
    return a[0] if unbatched else a


Given = dict[str, tuple[int, ...] | None]  # names the caller gave: all heads (None) or some


def _given(earlier: list[_Entry], state: State, unbatched: bool) -> tuple[State, Given]:
    """The state with the caller's (matching) arrays put in place of the service's, and which
    names (all heads: None, or some heads) they cover."""
    base = dict(state)
    given: Given = {}
    for e in earlier:
        if e.view is not None:  # a parameter's gradient: no later gradient reads it
            continue
        theirs = _engine(e.yours, unbatched)
        if e.head is None:
            base[e.state], given[e.state] = theirs, None
            continue
        if given.get(e.state, ()) is None:
            continue
        mixed = base[e.state].copy() if e.state not in given else base[e.state]
        mixed[:, e.head] = theirs
        base[e.state] = mixed
        given[e.state] = (*(given.get(e.state) or ()), e.head)
    return base, given


def diagnosis_budget(state: State) -> int:
    """The numbers the diagnosis may compute: :data:`DIAGNOSIS_TIMES` × those of the request's
    own computation (every array of ``state``, each once), at least
    :data:`DIAGNOSIS_MIN_NUMBERS`."""
    own = sum({id(a): a.size for a in state.values()}.values())
    return max(DIAGNOSIS_TIMES * own, DIAGNOSIS_MIN_NUMBERS)


def _tolerance(
    given: Tolerance | None, ours: Array, yours: Array, low: Callable[[LowType], Array]
) -> Tolerance:
    """The tolerance an array is compared with: at a low precision when the request names
    one, or gives no tolerance and every number is one of bfloat16's or float16's
    (:func:`_at_low_precision`); else the request's when it gives one; else the default, or the
    precision the array was printed with when it was printed and is not ours exactly
    (:func:`printed_tolerance`). ``low``: our array computed in a low-precision type."""
    if given is not None and given.precision is not None:
        return _at_low_precision(TYPES[given.precision], ours, low)
    if given is not None:
        return given
    kind = None if identical(ours, yours) else detected(yours)
    return printed_tolerance(ours, yours) if kind is None else _at_low_precision(kind, ours, low)


def _at_low_precision(kind: LowType, ours: Array, low: Callable[[LowType], Array]) -> Tolerance:
    """Yours match when within twice the error of ours computed in ``kind`` plus its atol
    (service.core.diagnosis.precision); an error that is not finite (float16 overflowing)
    counts as none."""
    error = difference(ours, low(kind), Tolerance(atol=0.0, rtol=0.0)).max_abs_diff
    reference = error if np.isfinite(error) else 0.0
    return Tolerance(atol=2 * reference + kind.atol, rtol=0.0, precision=kind.name, reference=error)


def compare(
    expected: Expected,
    given: Tolerance | None,
    state: State,
    setup: Setup,
    unbatched: bool,
    check: Callable[[], None],
    answered: Answered | None = None,
) -> dict[str, Any]:
    """``comparison`` and ``first_mismatch`` for the response (see the module's doc); ``given``:
    the request's tolerance (None: the default, or the precision each array was printed with);
    ``answered``: how the answer gives the parameters' gradients (with grad_output)."""
    endpoint: Endpoint = "multihead" if setup.num_heads is not None else "attention"
    entries = _entries(expected, endpoint, answered, state)
    computed: dict[str, State] = {}  # every step in a low-precision type, once per type

    def low(e: _Entry) -> Callable[[LowType], Array]:
        def ours_in(kind: LowType) -> Array:
            if kind.name not in computed:
                check()
                computed[kind.name] = in_low_precision(state, setup, kind)
            if is_gradient(e.state) and f"{kind.name} backward" not in computed:
                check()
                computed[f"{kind.name} backward"] = _backward_in(computed[kind.name], setup, kind)
            at = f"{kind.name} backward" if is_gradient(e.state) else kind.name
            return _ours(computed[at], e, unbatched)

        return ours_in

    tols = [_tolerance(given, _ours(state, e, unbatched), e.yours, low(e)) for e in entries]
    computed.clear()  # the low-precision arrays are not needed past the verdicts
    diffs = [
        difference(_ours(state, e, unbatched), e.yours, tol)
        for e, tol in zip(entries, tols, strict=True)
    ]
    first = next((i for i, d in enumerate(diffs) if not d.match), None)
    searched = None
    explained = first is not None and (
        entries[first].state in ORDER or is_gradient(entries[first].state)
    )
    if first is not None and explained and entries[first].view is not None:
        explained = _recomputed_as_answered(entries[first], state, setup)
    if first is not None and explained:
        e, tol = entries[first], tols[first]  # a printed array is diagnosed at its precision
        base, given_parts = _given(entries[:first], state, unbatched)
        yours = e.yours if e.view is not None else _engine(e.yours, unbatched)
        target = Target(e.state, e.head, yours, e.view)
        searched = search(base, given_parts, setup, target, tol, diagnosis_budget(state), check)
        del base, given_parts  # the caller's heads mixed into copies of the service's arrays
    rows = []
    for i, (e, d, tol) in enumerate(zip(entries, diffs, tols, strict=True)):
        run = searched if i == first else None
        found = None if run is None else run.found
        printed = tol.printed
        rows.append(
            {
                "name": e.label,
                "match": d.match,
                "max_abs_diff": _finite(d.max_abs_diff),
                "where": list(d.where),
                "ours": _finite(d.ours),
                "yours": _finite(d.yours),
                "printed": None if printed is None else {printed.kind: printed.n},
                "precision": _low(d, tol),
                "message": _message(d, i, first, entries, run, tol),
                "diagnosis": None
                if found is None or run is None
                else _diagnosis(found, run.alternatives, setup, e, _ours(state, e, unbatched)),
                # the first difference: whether every candidate set was tried; else null
                "diagnosis_complete": None if i != first else run is None or run.complete,
            }
        )
    return {
        "comparison": rows,
        "first_mismatch": None if first is None else entries[first].label,
    }


def _recomputed_as_answered(e: _Entry, state: State, setup: Setup) -> bool:
    """Whether the diagnosis's backward, with no mistake, makes this parameter's gradient as
    the answer gave it: only then can a mistake's recomputation be told from ours (a gradient
    it does not make, or makes otherwise, is never diagnosed: no match that is not one)."""
    assert e.view is not None
    try:
        with np.errstate(all="ignore"):
            made = gradients(per_query_head(state, setup), setup, own_rows(setup), lambda n, g: g)
            again, ours = e.view(made), e.view(state)
    except (KeyError, Unfit):
        return False
    return again.shape == ours.shape and identical(ours, again)


def _backward_in(low: State, setup: Setup, kind: LowType) -> State:
    """The gradients as a kernel in ``kind`` gets them, near enough to judge: the backward
    computed from the forward's arrays in that type (:func:`in_low_precision`), from the same
    seed, each gradient rounded to the type."""
    made = gradients(low, setup, own_rows(setup), lambda name, g: g)
    return low | {n: kind.rounded(a) for n, a in made.items()}


def _finite(x: float) -> float | None:
    return x if np.isfinite(x) else None


def _number(x: float) -> str:
    return f"{x:.6g}" if np.isfinite(x) else "null"


def _precision(printed: Printed) -> str:
    """The precision in words: 'the 4 decimals you printed', 'the 1 decimal you printed'."""
    digit = "decimal" if printed.kind == "decimals" else "significant digit"
    return f"the {printed.n} {digit}{'' if printed.n == 1 else 's'} you printed"


def _low(d: Difference, tol: Tolerance) -> dict[str, Any] | None:
    """The low-precision verdict's numbers: the type, your largest error, the reference's."""
    if tol.precision is None or tol.reference is None:
        return None
    return {
        "type": tol.precision,
        "yours": _finite(d.max_abs_diff),
        "reference": _finite(tol.reference),
    }


def _within_low(d: Difference, tol: Tolerance) -> str:
    """The low-precision rule in words, with both errors."""
    assert tol.precision is not None and tol.reference is not None
    return (
        f"your error {_number(d.max_abs_diff)}, a {tol.precision} computation's "
        f"{_number(tol.reference)}; the rule: at most twice that plus "
        f"{TYPES[tol.precision].atol:g}"
    )


def _message(
    d: Difference,
    i: int,
    first: int | None,
    entries: list[_Entry],
    run: Search | None,
    tol: Tolerance,
) -> str:
    """One sentence on an entry, for a person (``run``: the first difference's diagnosis;
    ``tol``: what it was compared with — a printed precision, a low-precision type)."""
    at = list(d.where)
    printed = tol.printed
    if d.match and tol.precision is not None:
        return f"agrees within {tol.precision} rounding ({_within_low(d, tol)}; largest at {at})"
    if d.match and printed is not None:
        return (
            f"agrees with ours to {_precision(printed)} (largest difference "
            f"{d.max_abs_diff:.3g}, at {at})"
        )
    if d.match:
        return f"matches (largest difference {d.max_abs_diff:.3g}, at {at})"
    text = (
        f"differs: the largest difference is {_number(d.max_abs_diff)} at {at}, where yours is "
        f"{_number(d.yours)} and the service's {_number(d.ours)}"
    ) + ("" if printed is None else f", compared at {_precision(printed)}")
    if tol.precision is not None:
        text += f", beyond {tol.precision} rounding ({_within_low(d, tol)})"
    if i != first:
        label = entries[first or 0].label
        return f"{text}; it comes after the first difference ({label}), which may explain it"
    found = None if run is None else run.found
    if run is not None and not run.complete:
        stopped = (
            f"the diagnosis stopped at its budget ({DIAGNOSIS_TIMES} times the numbers this "
            f"request computes) after trying {run.tried} of the {run.sets} candidate "
            f"set{'' if run.sets == 1 else 's'} of mistakes (each alone, then pairs)"
        )
        if found is None:
            return (
                f"{text}. {stopped[0].upper()}{stopped[1:]}, and none of those reproduces your numbers. For a full "
                "diagnosis, compare an earlier step (give it in expected, with the steps before "
                "it: the recomputation starts after the last one that matches), or send fewer "
                "heads, shorter sequences or a smaller batch"
            )
        mistakes = "mistake" if run.size == 1 else "mistakes"
        return (
            f"{text}. Recomputing with {' + '.join(found.mistakes)} reproduces your numbers; "
            f"{stopped}, so another set of {run.size} {mistakes} may reproduce them more closely"
        )
    if run is None or found is None:
        return (
            f"{text}. No listed mistake, alone or in pairs, reproduces your numbers: compare "
            "this step's inputs with the service's, or give them in expected"
        )
    return (
        f"{text}. Recomputing with {' + '.join(found.mistakes)} reproduces your numbers"
        + _alternatives(run.alternatives)
    )


def _alternatives(others: tuple[tuple[str, ...], ...]) -> str:
    """The other sets that reproduce the numbers as well, in words ('' when none)."""
    if not others:
        return ""
    names = " or with ".join(" + ".join(codes) for codes in others)
    return f"; recomputing with {names} reproduces them as closely (diagnosis.alternatives)"


def _diagnosis(
    found: Diagnosis,
    alternatives: tuple[tuple[str, ...], ...],
    setup: Setup,
    e: _Entry,
    ours: Array,
) -> dict[str, Any]:
    """The diagnosis entry: the named set, its explanation, the sets that do as well."""
    columns, rows = _sums(e.yours) if e.state == "weights" else (None, None)
    largest = largest_magnitude(ours)
    relative = found.difference.max_abs_diff / largest if largest else 0.0
    seen = Seen(setup, found.rows, dict(found.ways), columns, rows, relative)
    return {
        "mistakes": list(found.mistakes),
        "explanation": explain(found.mistakes, seen),
        "alternatives": [list(codes) for codes in alternatives],
    }


def _sums(weights: Array) -> tuple[float | None, float | None]:
    """What every column and every row of the caller's weights sum to, where they all agree."""

    def common(sums: Array) -> float | None:
        flat = sums[np.isfinite(sums)]
        same = flat.size and np.allclose(flat, flat[0], rtol=1e-6, atol=1e-9)
        return float(flat[0]) if same else None

    return common(weights.sum(axis=-2)), common(weights.sum(axis=-1))


def state_of(arrays: Mapping[str, Array | None], mask: CombinedMask | None) -> State:
    """The engine's arrays by name for the comparison (absent ones left out), with the
    combined mask's arrays as the recomputation keeps them."""
    state: State = {n: a for n, a in arrays.items() if a is not None}
    if mask is not None:
        state["mask"] = mask.allowed.astype(np.float64)  # (B, L, S)
        state["additive_mask"] = mask.additive
        state["padded_queries"] = mask.padded_queries.astype(np.float64)  # (B, L)
    return state
