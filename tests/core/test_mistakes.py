"""service.core.diagnosis.mistakes and the second edition's mistakes at the engine's level: the table
(order, families, ways), and each new mistake of /attention's chain recognised from numbers
written out here in NumPy, independently of the engine — a scale inverted, a mask applied
after the softmax or not at all, a window off by one, RoPE left out or with another base, and
float32 arithmetic (alone and with a mistake). The mistakes of /multihead's block
(heads merged without the transpose, batch for sequence, √d_model) and every code through HTTP
with torch-built numbers are in tests/api/test_compare_mistakes.py."""

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core import masks
from service.core.attention import scaled_dot_product_attention
from service.core.diagnosis.mistakes import EXCLUSIVE, FLOAT32, MISTAKES, TABLE, applicable, ways
from service.core.diagnosis.recompute import batch_as_sequence, swapped_back
from service.core.diagnosis.search import Target, Tolerance, diagnose, float32_tolerance, trials
from service.core.diagnosis.stages import FIT, Setup, State
from service.core.positions import Rope
from service.core.rope_scaling import LinearScaling, YarnScaling
from service.core.variants import Variants

TIGHT = Tolerance(atol=1e-12, rtol=0.0)
Array = np.ndarray[Any, np.dtype[np.float64]]

# the contract's two tables, in order, then the third edition's codes the service knows
CONTRACT = (
    "softmax_over_queries", "scale_after_softmax", "scale_missing", "scale_by_d_k",
    "weights_transposed", "q_k_swapped", "mask_inverted", "causal_diagonal_masked",
    "layer_norm_over_all", "layer_norm_per_token", "unbiased_variance", "heads_interleaved",
    "rope_style_swapped", "scale_by_model_dim", "scale_inverted", "mask_after_softmax",
    "mask_missing", "window_off_by_one", "heads_merged_without_transpose", "batch_as_sequence",
    "rope_missing", "rope_base_wrong", "decode_position_offset", "float32_arithmetic",
    "scale_from_config_ignored", "clip_missing", "kv_heads_repeated_wrong", "window_missing",
    "output_projection_missing", "softmax_over_batch", "causal_alignment_swapped",
    "mask_not_infinite", "partial_rotary_wrong", "rope_scaling_missing",
)  # fmt: skip


def test_the_table_has_the_contracts_codes_in_its_order() -> None:
    assert MISTAKES == CONTRACT
    assert all(row.sentence is not None for row in TABLE)


def test_pairs_of_one_family_are_never_tried() -> None:
    codes = tuple(c for c in MISTAKES if c != FLOAT32)
    pairs = {t.mistakes for t in trials(codes, "zero") if len(t.mistakes) == 2}
    for never in (
        {"scale_inverted", "scale_by_model_dim"},
        {"scale_missing", "scale_inverted"},
        {"rope_missing", "rope_base_wrong"},
        {"rope_missing", "rope_style_swapped"},
        {"mask_missing", "mask_after_softmax"},
        {"mask_missing", "window_off_by_one"},
        {"heads_interleaved", "heads_merged_without_transpose"},
        {"window_missing", "window_off_by_one"},
        {"window_missing", "mask_missing"},
        {"mask_not_infinite", "mask_missing"},
        {"mask_not_infinite", "mask_after_softmax"},
        {"softmax_over_batch", "softmax_over_queries"},
    ):
        assert frozenset(never) not in pairs
        assert any(frozenset(never) <= group for group in EXCLUSIVE)
    for allowed in (
        {"rope_base_wrong", "rope_style_swapped"},
        {"mask_after_softmax", "softmax_over_queries"},
        {"batch_as_sequence", "scale_missing"},
    ):
        assert frozenset(allowed) in pairs


def setup_for(q: Array, k: Array, **kw: Any) -> Setup:
    fields: dict[str, Any] = {
        "scale": 1 / np.sqrt(q.shape[-1]),
        "d_k": q.shape[-1],
        "fully_masked_policy": "zero",
        "variants": Variants(),
        "mask_specs": (),
        "batch": 1,
        "seq_len": q.shape[0],
        "ctx_len": k.shape[0],
    }
    return Setup(**(fields | kw))


def test_each_way_is_tried_and_every_combination_of_two() -> None:
    q = np.zeros((3, 4))
    s = setup_for(
        q,
        q,
        variants=Variants(rope=Rope(base=500_000.0)),
        mask_specs=(masks.Window(2, 0),),
        x_in=np.zeros((1, 3, 16)),
    )
    how = ways(s)
    assert how["rope_base_wrong"] == (10_000.0, 1_000_000.0, FIT)  # the asked base left out
    assert how["scale_by_model_dim"] == (16.0,)
    assert how["window_off_by_one"] == (1.0, -1.0)
    pair = [
        t.ways
        for t in trials(("mask_after_softmax", "rope_base_wrong"), "zero", how)
        if len(t.mistakes) == 2
    ]
    assert len(pair) == 6 and len(set(pair)) == 6


def test_the_rope_mistakes_are_tried_only_where_their_ways_can_differ() -> None:
    """partial_rotary_wrong: every feature where rotary_dim < d_k asks part, the first
    int(f·d_k) (even, 0 < r < d_k) of 0.25, 0.5, 0.4 where the whole head turns, never for a
    head of 2; rope_scaling_missing only with a scaling, its attention factor alone only where
    it has one; rope_base_wrong fitted only where a pair besides the first turns."""
    head8, head2 = np.zeros((3, 8)), np.zeros((3, 2))
    whole = setup_for(head8, head8, variants=Variants(rope=Rope()))
    part = setup_for(head8, head8, variants=Variants(rope=Rope(rotary_dim=2)))
    tiny = setup_for(head2, head2, variants=Variants(rope=Rope()))
    assert ways(whole)["partial_rotary_wrong"] == (2.0, 4.0)  # 0.4·8 = 3 is odd
    assert ways(part)["partial_rotary_wrong"] == ("all",)
    assert "partial_rotary_wrong" not in applicable(tiny, frozenset({"q_rotated"}))
    assert ways(whole)["rope_base_wrong"][-1] == FIT and FIT not in ways(tiny)["rope_base_wrong"]
    assert "rope_scaling_missing" not in applicable(whole, frozenset({"q_rotated"}))
    linear = setup_for(
        head8, head8, variants=Variants(rope=Rope(scaling=LinearScaling(factor=2.0)))
    )
    yarn = setup_for(
        head8,
        head8,
        variants=Variants(rope=Rope(scaling=YarnScaling(factor=4.0, original_max_position=4))),
    )
    assert "rope_scaling_missing" in applicable(linear, frozenset({"q_rotated"}))
    assert ways(linear)["rope_scaling_missing"] == ("scaling",)
    assert ways(yarn)["rope_scaling_missing"] == (
        "scaling",
        "attention_factor",
        "attention_factor_twice",  # YaRN's factor ≠ 1: applied twice is a way too
    )


def test_a_large_fill_is_tried_only_where_a_query_sees_no_key() -> None:
    """mask_not_infinite: 0 always; −1e9 (as finfo.min, −1e4) only where the mask leaves a
    query with no key, the one place a large fill's numbers differ from −∞'s."""
    q = np.zeros((3, 4))
    causal = setup_for(q, q, mask_specs=(masks.Causal(),))
    assert ways(causal)["mask_not_infinite"] == (0.0,)
    first_key_hidden = np.ones((3, 3), dtype=bool)
    first_key_hidden[:, 0] = False  # row 0 of a causal mask then sees nothing
    left_padded = setup_for(q, q, mask_specs=(masks.Causal(), masks.Boolean(first_key_hidden)))
    assert ways(left_padded)["mask_not_infinite"] == (0.0, -1e9)
    # a padded query row is not one that sees no key
    padded = setup_for(q, q, mask_specs=(masks.Causal(), masks.Padding(None, (2,))))
    assert ways(padded)["mask_not_infinite"] == (0.0,)


# --- numbers as the mistakes make them, written out in NumPy ------------------------------------


def softmax(a: Array) -> Array:
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)  # type: ignore[no-any-return]


def rotate_half(x: Array, base: float) -> Array:
    """RoPE, "half" style (GPT-NeoX / Hugging Face): feature i pairs with i + d/2."""
    n, d = x.shape
    theta = 1.0 / base ** (np.arange(0, d, 2) / d)  # (d/2,)
    angle = np.arange(n)[:, None] * theta  # (n, d/2)
    cos, sin = np.cos(np.concatenate([angle, angle], 1)), np.sin(np.concatenate([angle] * 2, 1))
    half = np.concatenate([-x[:, d // 2 :], x[:, : d // 2]], 1)
    return x * cos + half * sin  # type: ignore[no-any-return]


def engine(q: Array, k: Array, v: Array, specs: tuple[Any, ...] = (), **kw: Any) -> State:
    """The service's arrays (B = 1) for q, k, v under the request's masks and variants."""
    combined = masks.combine(list(specs), 1, q.shape[0], k.shape[0])
    trace = scaled_dot_product_attention(
        q[None], k[None], v[None], additive=combined.additive, **kw
    )
    names = ("q", "k", "v", "q_rotated", "k_rotated", "scores", "scaled_scores")
    state = {n: getattr(trace, n) for n in names if getattr(trace, n) is not None}
    state |= {"weights": trace.weights, "output": trace.output}
    if specs:
        state |= {
            "masked_scores": trace.masked_scores,
            "mask": combined.allowed.astype(float),
            "additive_mask": combined.additive,
            "padded_queries": combined.padded_queries.astype(float),
        }
    return state


RNG = np.random.default_rng(2026)
Q, K, V = RNG.normal(size=(5, 4)), RNG.normal(size=(5, 4)), RNG.normal(size=(5, 3))
CAUSAL = np.tril(np.ones((5, 5), dtype=bool))
WINDOW_1 = CAUSAL & ~np.tril(np.ones((5, 5), dtype=bool), -2)  # i − 1 ≤ j ≤ i


def caller_weights(code: str) -> tuple[Array, tuple[Any, ...], Variants]:
    """The weights a caller computed with ``code``'s mistake; the request's masks and variants."""
    raw, d = Q @ K.T, 4.0
    with np.errstate(invalid="ignore"):
        cases: dict[str, tuple[Array, tuple[Any, ...], Variants]] = {
            "scale_inverted": (softmax(raw * np.sqrt(d)), (), Variants()),
            # the mask after the softmax: zeroed, and zeroed then renormalised (row 0 of a
            # mask with no key for the first query: 0/0)
            "mask_after_softmax": (softmax(raw / 2) * CAUSAL, (masks.Causal(),), Variants()),
            "mask_missing": (softmax(raw / 2), (masks.Causal(),), Variants()),
            # the request's window is left = 1 (2 keys); the caller kept 3
            "window_off_by_one": (
                softmax(np.where(CAUSAL & ~np.tril(np.ones((5, 5), bool), -3), raw / 2, -np.inf)),
                (masks.Window(1, 0), masks.Causal()),
                Variants(),
            ),
            "rope_missing": (softmax(raw / 2), (), Variants(rope=Rope())),
            "rope_base_wrong": (
                softmax(rotate_half(Q, 500_000.0) @ rotate_half(K, 500_000.0).T / 2),
                (),
                Variants(rope=Rope()),
            ),
        }
    return cases[code]


@pytest.mark.parametrize(
    "code",
    ["scale_inverted", "mask_after_softmax", "mask_missing", "window_off_by_one", "rope_missing",
     "rope_base_wrong"],
)  # fmt: skip
def test_a_new_mistake_of_the_chain_is_named(code: str) -> None:
    yours, specs, variants = caller_weights(code)
    state = engine(Q, K, V, specs, variants=variants)
    s = setup_for(Q, K, variants=variants, mask_specs=specs)
    assert code in applicable(s, frozenset(state))
    found = diagnose(state, {}, s, Target("weights", None, yours[None]), TIGHT)
    assert found is not None and found.mistakes == (code,), found
    assert found.difference.max_abs_diff < 1e-12
    if code == "rope_base_wrong":
        assert dict(found.ways)[code] == 500_000.0


def test_a_mask_after_the_softmax_renormalised_leaves_nan_where_no_key_is_left() -> None:
    blocked = WINDOW_1.copy()
    blocked[0] = False  # the first query may see no key
    with np.errstate(invalid="ignore"):
        kept = softmax(Q @ K.T / 2) * blocked
        yours = kept / kept.sum(axis=-1, keepdims=True)  # row 0: 0/0
    specs = (masks.Boolean(blocked),)
    state = engine(Q, K, V, specs)
    s = setup_for(Q, K, mask_specs=specs)
    found = diagnose(state, {}, s, Target("weights", None, yours[None]), TIGHT)
    assert found is not None and found.mistakes == ("mask_after_softmax",)
    assert dict(found.ways)["mask_after_softmax"] == "renormalised"


def test_a_pair_of_new_and_first_edition_mistakes_is_named() -> None:
    yours = softmax((K @ Q.T) / 2) * CAUSAL  # K Qᵀ, and the causal mask after the softmax
    specs = (masks.Causal(),)
    state = engine(Q, K, V, specs)
    s = setup_for(Q, K, mask_specs=specs)
    found = diagnose(state, {}, s, Target("weights", None, yours[None]), TIGHT)
    assert found is not None and found.mistakes == ("q_k_swapped", "mask_after_softmax")


# --- float32 arithmetic ---------------------------------------------------------------------


def float32_weights(scale: float) -> Array:
    q, k = Q.astype(np.float32), K.astype(np.float32)
    return softmax((q @ k.T) * np.float32(scale)).astype(np.float64)  # type: ignore[arg-type]


def test_float32_rounding_is_named_with_its_size() -> None:
    yours = float32_weights(0.5)
    state = engine(Q, K, V)
    s = setup_for(Q, K)
    found = diagnose(state, {}, s, Target("weights", None, yours[None]), TIGHT)
    assert found is not None and found.mistakes == (FLOAT32,)
    assert 1e-12 < found.difference.max_abs_diff <= 1e-5 * np.abs(state["weights"]).max()


def test_float32_with_a_mistake_is_named_as_the_pair() -> None:
    yours = float32_weights(1.0)  # float32, and never scaled
    state = engine(Q, K, V)
    found = diagnose(state, {}, setup_for(Q, K), Target("weights", None, yours[None]), TIGHT)
    assert found is not None and found.mistakes == ("scale_missing", FLOAT32)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), size=st.sampled_from([1e-4, 1e-3]))
def test_differences_larger_than_float32_are_not_float32(seed: int, size: float) -> None:
    state = engine(Q, K, V)
    noise = np.random.default_rng(seed).normal(size=(5, 5)) * size
    yours = state["weights"][0] + noise * np.abs(state["weights"]).max()
    found = diagnose(state, {}, setup_for(Q, K), Target("weights", None, yours[None]), TIGHT)
    assert found is None or FLOAT32 not in found.mistakes


def test_the_float32_tolerance_scales_with_the_largest_number() -> None:
    tol = float32_tolerance(np.array([[-400.0, 3.0, -np.inf, np.nan]]))
    assert (tol.atol, tol.rtol) == (1e-5 * 400.0, 0.0)


# --- batch for sequence -----------------------------------------------------------------------


def test_batch_as_sequence_swaps_there_and_back() -> None:
    x = RNG.normal(size=(2, 3, 4, 5))  # (B, h, L, d)
    s = replace(setup_for(Q, K), batch=2, seq_len=4, ctx_len=4, num_heads=3)
    world, seen = batch_as_sequence({"q": x}, s)
    assert world["q"].shape == (4, 3, 2, 5) and (seen.batch, seen.seq_len) == (4, 2)
    np.testing.assert_array_equal(swapped_back(world["q"], s), x)
