"""service.core.diagnosis.search and service.core.diagnosis.recompute: the element-wise comparison and the diagnosis by recomputation, at the
engine's level. The wrong computations are written out here in NumPy, independently of the
engine (the API-level tests with torch references are in tests/api/test_compare.py). At the end,
the diagnosis's cost: its shared recomputations against a one-trial-at-a-time search, and its
budget on the worst case run through the service's pipeline (without HTTP), counted stage by
stage."""

from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import service.core.diagnosis.recompute as core_recompute
import service.trace.comparison as api_compare
from service import trace
from service.config import Settings
from service.core import masks
from service.core.attention import scaled_dot_product_attention
from service.core.diagnosis.mistakes import MISTAKES, applicable, ways
from service.core.diagnosis.recompute import recompute, set_cost
from service.core.diagnosis.search import (
    Diagnosis,
    Search,
    Target,
    Tolerance,
    diagnose,
    difference,
    search,
    trials,
)
from service.core.diagnosis.stages import STAGES, Setup, Stage, State, Trial
from service.core.multihead import LayerNorm, layer_norm
from service.core.types import Array
from service.core.variants import Variants
from service.http.doors import checked

INF = np.inf
TOL = Tolerance()


@pytest.mark.parametrize(
    ("ours", "yours", "match", "largest", "where"),
    [
        ([1.0, 2.0], [1.0, 2.0], True, 0.0, (0,)),
        ([1.0, 2.0], [1.0, 2.5], False, 0.5, (1,)),
        ([np.nan, 1.0], [np.nan, 1.0], True, 0.0, (0,)),
        ([-INF, 1.0], [-INF, 1.0], True, 0.0, (0,)),
        ([-INF, 1.0], [-1e9, 1.0], True, 0.0, (0,)),  # masked_fill(-1e9) counts as masked
        ([-INF, 1.0], [-1e8, 1.0], False, INF, (0,)),  # but -1e8 does not
        ([0.0, 1.0], [-INF, 1.0], False, INF, (0,)),
        ([0.0, 1.0], [np.nan, 1.0], False, INF, (0,)),
        ([1.0, 1e6], [1.0 + 1e-6, 1e6 + 1.0], True, 1.0, (1,)),  # 1 ≤ 1e-6 + 1e-6·1e6
        ([1.0, 1e6], [1.0, 1e6 + 1.01], False, 1.01, (1,)),
    ],
    ids=[
        "equal", "one-off", "nan-nan", "neginf-neginf", "neginf-vs-1e9", "neginf-vs-1e8",
        "number-vs-neginf", "number-vs-nan", "within-rtol", "beyond-rtol",
    ],
)  # fmt: skip
def test_difference(
    ours: list[float], yours: list[float], match: bool, largest: float, where: tuple[int, ...]
) -> None:
    d = difference(np.array(ours), np.array(yours), TOL)
    assert (d.match, d.where) == (match, where)
    assert d.max_abs_diff == pytest.approx(largest, rel=1e-9)


def test_where_is_the_largest_difference_of_a_batch() -> None:
    ours = np.zeros((2, 3, 4))
    yours = ours.copy()
    yours[1, 2, 3], yours[0, 0, 1] = 0.5, 0.25
    d = difference(ours, yours, TOL)
    assert (d.where, d.ours, d.yours) == ((1, 2, 3), 0.0, 0.5)


def test_trials_go_singles_then_pairs_never_two_of_one_family() -> None:
    tried = list(trials(MISTAKES, "zero"))
    sizes = [len(t.mistakes) for t in tried]
    assert sizes == sorted(sizes)
    pairs = {t.mistakes for t in tried if len(t.mistakes) == 2}
    assert frozenset({"scale_missing", "scale_by_d_k"}) not in pairs
    assert frozenset({"layer_norm_over_all", "layer_norm_per_token"}) not in pairs
    assert frozenset({"softmax_over_queries", "scale_after_softmax"}) in pairs
    masked = [t.rows for t in tried if t.mistakes == frozenset({"mask_inverted"})]
    assert masked == ["zero", "uniform", "nan"]  # the request's own policy first


def test_unbiased_variance_divides_by_n_minus_one() -> None:
    x = np.arange(12.0).reshape(1, 3, 4) ** 2
    got = layer_norm(x, LayerNorm(eps=0.0), ddof=1)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True) * 4 / 3
    np.testing.assert_allclose(got, (x - mean) / np.sqrt(var), rtol=1e-14)


# --- the diagnosis on /attention's chain, built from q, k, v --------------------------------


def softmax(a: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)  # type: ignore[no-any-return]


def wrong_weights(q: np.ndarray, k: np.ndarray, code: str) -> np.ndarray:
    """The weights as a notebook with one mistake computes them, written out here."""
    d_k = q.shape[-1]
    s = q @ k.T
    made: dict[str, np.ndarray] = {
        "softmax_over_queries": softmax(s / np.sqrt(d_k), 0),
        "scale_after_softmax": softmax(s, 1) / np.sqrt(d_k),
        "scale_missing": softmax(s, 1),
        "scale_by_d_k": softmax(s / d_k, 1),
        "q_k_swapped": softmax(k @ q.T / np.sqrt(d_k), 1),
    }
    return made[code]


def engine_state(q: np.ndarray, k: np.ndarray, v: np.ndarray, **kw: Any) -> tuple[State, Setup]:
    """The engine's arrays (B = 1) and the recomputation's setup for q, k, v."""
    trace = scaled_dot_product_attention(q[None], k[None], v[None], **kw)
    fields = ("q", "k", "v", "scores", "scaled_scores", "masked_scores", "weights", "output")
    state = {n: getattr(trace, n) for n in fields if getattr(trace, n) is not None}
    setup = Setup(
        scale=trace.scale,
        d_k=q.shape[-1],
        fully_masked_policy="zero",
        variants=Variants(),
        mask_specs=(),
        batch=1,
        seq_len=q.shape[0],
        ctx_len=k.shape[0],
    )
    return state, setup


SINGLE = ["softmax_over_queries", "scale_after_softmax", "scale_missing", "scale_by_d_k",
          "q_k_swapped"]  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(2, 6),
    d_k=st.integers(2, 5),
    code=st.sampled_from(SINGLE),
)
def test_one_mistake_is_named_alone(seed: int, n: int, d_k: int, code: str) -> None:
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(n, d_k)), rng.normal(size=(n, d_k)), rng.normal(size=(n, 3))
    state, setup = engine_state(q, k, v)
    yours = wrong_weights(q, k, code)
    assume(not difference(state["weights"][0], yours, TOL).match)  # e.g. symmetric scores
    found = diagnose(state, {}, setup, Target("weights", None, yours[None]), TOL)
    assert found is not None and found.mistakes == (code,)
    assert found.difference.max_abs_diff < 1e-12


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 6), size=st.sampled_from([1e-3, 1e-1]))
def test_noise_gets_no_diagnosis(seed: int, n: int, size: float) -> None:
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(n, 3)), rng.normal(size=(n, 3)), rng.normal(size=(n, 2))
    state, setup = engine_state(q, k, v)
    yours = state["weights"][0] + rng.normal(size=(n, n)) * size
    assert diagnose(state, {}, setup, Target("weights", None, yours[None]), TOL) is None


def test_the_callers_earlier_arrays_are_the_inputs() -> None:
    """Given the right scores, a softmax mistake is found from them; given scores made with
    K Qᵀ, the weights made from those same scores carry no further mistake to find."""
    rng = np.random.default_rng(7)
    q, k, v = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    state, setup = engine_state(q, k, v)
    yours = softmax((q @ k.T) / np.sqrt(3), 0)
    base = state | {"scores": (q @ k.T)[None]}
    found = diagnose(base, {"scores": None}, setup, Target("weights", None, yours[None]), TOL)
    assert found is not None and found.mistakes == ("softmax_over_queries",)
    # the caller's own (transposed) scores are kept: q_k_swapped cannot re-transpose them
    swapped = base | {"scores": (k @ q.T)[None]}
    yours = softmax(k @ q.T / np.sqrt(3), 0)
    found = diagnose(swapped, {"scores": None}, setup, Target("weights", None, yours[None]), TOL)
    assert found is not None and found.mistakes == ("softmax_over_queries",)


@pytest.mark.parametrize("rows", ["zero", "uniform", "nan"])
def test_a_diagonal_hidden_by_the_causal_mask_is_found_whatever_the_empty_row_holds(
    rows: str,
) -> None:
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(4, 2)), rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
    causal = masks.combine([masks.Causal()], 1, 4, 4)
    state, setup = engine_state(q, k, v, additive=causal.additive)
    state |= {"mask": causal.allowed.astype(float), "additive_mask": causal.additive,
              "padded_queries": causal.padded_queries.astype(float)}  # fmt: skip
    setup = Setup(**{**setup.__dict__, "mask_specs": (masks.Causal(),)})
    s = np.where(np.tril(np.ones((4, 4)), -1) > 0, q @ k.T / np.sqrt(2), -np.inf)
    with np.errstate(invalid="ignore"):
        yours = np.exp(s - s.max(1, keepdims=True))
        yours /= yours.sum(1, keepdims=True)  # row 0: 0/0 = NaN
    yours[0] = {"zero": 0.0, "uniform": 0.25, "nan": np.nan}[rows]
    found = diagnose(state, {}, setup, Target("weights", None, yours[None]), TOL)
    assert found is not None and found.mistakes == ("causal_diagonal_masked",)
    assert found.rows == rows


# --- the diagnosis's cost: shared recomputations, and the budget -----------------------------


def one_at_a_time(state: State, setup: Setup, target: Target) -> Diagnosis | None:
    """The diagnosis as first written: every trial recomputed alone and compared in full."""
    found: list[Diagnosis] = []
    codes = applicable(setup, frozenset(state))
    for trial in trials(codes, setup.fully_masked_policy, ways(setup)):
        if found and len(trial.mistakes) > len(found[0].mistakes):
            break
        made = recompute(state, {}, setup, trial, target.name)
        if made is None:
            continue
        d = difference(made, target.yours, TOL)
        if d.match:
            found.append(
                Diagnosis(tuple(c for c in MISTAKES if c in trial.mistakes), trial.rows, d)
            )
    return min(found, key=lambda d: d.difference.max_abs_diff, default=None)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(2, 5),
    pick=st.integers(0, 200),
    noise=st.booleans(),
)
def test_shared_recomputations_find_what_one_at_a_time_finds(
    seed: int, n: int, pick: int, noise: bool
) -> None:
    """The variants of a set share their steps before the weights, and a recomputation is
    compared in full only when it agrees where the caller's array differs most: the answer is
    the one of each trial recomputed alone and compared in full."""
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(n, 2)), rng.normal(size=(n, 2)), rng.normal(size=(n, 2))
    causal = masks.combine([masks.Causal()], 1, n, n)
    state, setup = engine_state(q, k, v, additive=causal.additive)
    state |= {"mask": causal.allowed.astype(float), "additive_mask": causal.additive,
              "padded_queries": causal.padded_queries.astype(float)}  # fmt: skip
    setup = replace(setup, mask_specs=(masks.Causal(),))
    every = list(trials(applicable(setup, frozenset(state)), "zero", ways(setup)))
    made = recompute(state, {}, setup, every[pick % len(every)], "weights")
    assume(made is not None)
    assert made is not None
    yours = made + rng.normal(size=made.shape) * 1e-3 if noise else made
    target = Target("weights", None, yours)
    got, want = diagnose(state, {}, setup, target, TOL), one_at_a_time(state, setup, target)
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        assert (got.mistakes, got.rows) == (want.mistakes, want.rows)
        assert repr(got.difference) == repr(want.difference)  # NaN included


@dataclass
class StageCounter:
    """What the diagnosis's stages computed: calls and the numbers they made."""

    calls: int = 0
    numbers: int = 0


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> StageCounter:
    """Count every stage computation of the diagnosis (the engine's own run uses none)."""
    counter = StageCounter()

    def counting(stage: Stage) -> Stage:
        def compute(st: State, s: Setup, t: Trial) -> Mapping[str, Array]:
            made = stage.compute(st, s, t)
            counter.calls += 1
            counter.numbers += sum(a.size for a in made.values())
            return made

        return replace(stage, compute=compute)

    monkeypatch.setattr(core_recompute, "STAGES", tuple(counting(s) for s in STAGES))
    return counter


def probe_body(length: int = 512, d_model: int = 4) -> dict[str, Any]:
    """Issue finding H2's probe: /multihead where every mistake applies — two heads, RoPE, a
    causal mask, residual, layer norm, square weights and w_o (an 84 kB body with expected)."""
    rng = np.random.default_rng(11)
    weights = {
        n: rng.normal(size=(d_model, d_model)).tolist() for n in ("w_q", "w_k", "w_v", "w_o")
    }
    return {
        "x": rng.normal(size=(length, d_model)).tolist(), **weights, "num_heads": 2,
        "rope": {}, "mask": {"type": "causal"}, "residual": True, "layer_norm": True,
    }  # fmt: skip


def run_pipeline(body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """A /multihead request through the service's pipeline without HTTP: parsed, its rules and
    limits checked, planned and run; the body and the numbers the limits count."""
    admitted = checked(orjson.dumps(body), "multihead", Settings())
    return trace.run(admitted, lambda: None), admitted.numbers


def test_the_worst_case_is_cut_short_within_its_budget_and_says_so(
    counted: StageCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Noise in the probe's output: no set of mistakes explains it, so every one of the 214
    candidate sets would run (~45 times the request's numbers). The diagnosis computes at most
    DIAGNOSIS_TIMES × the numbers of the request without expected (as the limits count them),
    stops, and the answer says so."""
    body = probe_body()
    plain, numbers = run_pipeline(body)
    assert counted.calls == 0  # the engine's own run
    noisy = plain["output"] + np.random.default_rng(5).normal(size=plain["output"].shape) * 1e-3
    runs: list[tuple[State, Mapping[str, Any], Setup, Target, Search]] = []

    def spy(base: State, given: Any, s: Setup, target: Target, *args: Any) -> Search:
        run = search(base, given, s, target, *args)
        runs.append((base, given, s, target, run))
        return run

    monkeypatch.setattr(api_compare, "search", spy)
    answer, _ = run_pipeline(body | {"expected": {"output": noisy.tolist()}})

    [entry] = answer["comparison"]
    assert (entry["name"], entry["match"]) == ("output", False)
    assert entry["diagnosis"] is None
    assert entry["diagnosis_complete"] is False
    [(base, given, setup, target, run)] = runs
    assert 0 < run.tried < run.sets == 214
    message = entry["message"]
    assert f"after trying {run.tried} of the 214 candidate sets" in message, message
    assert "earlier step" in message and "fewer heads" in message, message
    assert "No listed mistake" not in message  # that would claim every set was tried

    bound = api_compare.DIAGNOSIS_TIMES * numbers
    assert bound / 2 < counted.numbers <= run.spent <= bound
    sets = [list(g) for _, g in groupby(trials(applicable(setup, frozenset(base)), "zero", ways(setup)),
                                        key=lambda t: t.mistakes)]  # fmt: skip
    uncut = sum(set_cost(base, given, setup, variants, target.name) for variants in sets)
    assert uncut > 1.5 * bound  # what the whole search would have computed


PRINTS = [
    ("torch-4-decimals", [[0.8189, 0.6524], [0.1, -0.25]], ("decimals", 4)),
    ("numpy-8-decimals", [[0.12345678, 0.5], [1.0, 2.25]], ("decimals", 8)),
    ("e-notation", [[1.234e-09, -3.1e-11], [0.0, 9.99e-10]], ("significant", 4)),
    ("small-but-8-decimals", [[1.234e-05, -3.1e-07], [0.0, 9.99e-06]], ("decimals", 8)),
    ("null-and-nan-hold-no-digits", [[-np.inf, 0.5], [np.nan, 0.25]], ("decimals", 2)),
    ("integers", [[1.0, 2.0], [-3.0, 0.0]], None),
    ("full-precision", [[0.1234567890123, 0.5], [0.25, 1.0]], None),
]


@pytest.mark.parametrize(("numbers", "want"), [p[1:] for p in PRINTS], ids=[p[0] for p in PRINTS])
def test_printed_precision_is_the_fewest_digits_that_hold_every_number(
    numbers: list[list[float]], want: tuple[str, int] | None
) -> None:
    """Numbers as json.loads makes them from a print: the precision they were printed with."""
    from service.core.diagnosis.search import printed_precision

    found = printed_precision(np.array(numbers))
    assert (None if found is None else (found.kind, found.n)) == want


def test_a_boolean_array_has_no_printed_precision() -> None:
    from service.core.diagnosis.search import printed_precision

    assert printed_precision(np.array([[True, False]])) is None
