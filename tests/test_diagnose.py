"""service.core.compare: the element-wise comparison and the diagnosis by recomputation, at the
engine's level. The wrong computations are written out here in NumPy, independently of the
engine (the API-level tests with torch references are in tests/test_compare.py)."""

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from service.core import masks
from service.core.attention import Variants, scaled_dot_product_attention
from service.core.compare import (
    MISTAKES,
    Setup,
    State,
    Target,
    Tolerance,
    diagnose,
    difference,
    trials,
)
from service.core.multihead import LayerNorm, layer_norm

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
