"""The NumPy engine on its own: softmax policies, masks, projections, multi-head pieces.

Expected values here are derived by hand in the comments (small cases) or from the
definitions (PyTorch parity lives in test_golden.py and test_torch_live.py)."""

import numpy as np
import pytest

from service.core import masks
from service.core.attention import entropy_bits, project, scaled_dot_product_attention
from service.core.errors import (
    FLAGS_AT_ONCE,
    AttentionInputError,
    FullyMaskedRowsError,
    require_finite,
)
from service.core.generate import draw
from service.core.multihead import (
    LayerNorm,
    layer_norm,
    merge_heads,
    sinusoidal_encoding,
    split_heads,
)
from service.core.softmax import softmax
from service.core.types import Alignment

NEG = -np.inf


@pytest.mark.parametrize(
    ("policy", "expected_row"),
    [("zero", [0.0, 0.0, 0.0]), ("uniform", [1 / 3, 1 / 3, 1 / 3])],
    ids=["zero", "uniform"],
)
def test_fully_masked_row_policies(policy: str, expected_row: list[float]) -> None:
    s = np.array([[0.0, NEG, np.log(3.0)], [NEG, NEG, NEG]])
    w = softmax(s.copy(), policy)  # type: ignore[arg-type]
    # row 0: exp(0) : 0 : exp(ln 3) = 1 : 0 : 3, normalised to 1/4, 0, 3/4
    np.testing.assert_allclose(w[0], [0.25, 0.0, 0.75], rtol=1e-15)
    np.testing.assert_allclose(w[1], expected_row, rtol=1e-15)


def test_fully_masked_error_policy_names_rows_per_batch_item() -> None:
    q = k = v = np.ones((2, 2, 1))
    allowed = np.array([[[True, True], [False, False]], [[False, False], [True, False]]])
    m = masks.combine([masks.Boolean(allowed)], 2, 2, 2)
    with pytest.raises(FullyMaskedRowsError) as err:
        scaled_dot_product_attention(q, k, v, additive=m.additive, fully_masked_policy="error")
    assert err.value.rows == [[1], [0]]
    assert "batch item 0: rows [1]; batch item 1: rows [0]" in str(err.value)


def test_scores_plus_an_additive_mask_that_overflow_are_refused_not_masked() -> None:
    q = k = np.array([[[1e154]]])  # scaled score 1e308, finite
    for bias in (1e308, -np.inf):  # overflows to +∞; −∞ is a mask and must pass
        additive = np.array([[[bias]]])
        if np.isfinite(bias):
            with pytest.raises(AttentionInputError, match="masked scores"):
                scaled_dot_product_attention(q, k, q, scale=1.0, additive=additive)
        else:
            trace = scaled_dot_product_attention(q, k, q, scale=1.0, additive=additive)
            assert trace.weights[0, 0, 0] == 0.0


def test_softmax_subtracts_the_max_so_large_scores_do_not_overflow() -> None:
    w = softmax(np.array([[1000.0, 1000.0 + np.log(2.0)]]))  # naive exp(1000) overflows
    np.testing.assert_allclose(w, [[1 / 3, 2 / 3]], rtol=1e-12)


@pytest.mark.parametrize("over", ["features", "all"])
def test_a_layer_norm_whose_variance_overflows_is_refused_not_zero(over: str) -> None:
    """Values near 1e200 square past float64: the variance is ∞, which would make every
    normalised value 0 (the true answer for [[1e200, -1e200]] is [[1, -1]])."""
    x = np.array([[[1e200, -1e200]]])
    with pytest.raises(AttentionInputError, match="variance in layer norm"):
        layer_norm(x, LayerNorm(over=over))  # type: ignore[arg-type]
    np.testing.assert_allclose(layer_norm(x / 1e190, LayerNorm(eps=0.0)), [[[1.0, -1.0]]])


def test_overflowed_scores_are_refused_not_nan() -> None:
    q = np.array([[1e200, 0.0]])
    with pytest.raises(AttentionInputError, match="overflowed"):
        scaled_dot_product_attention(q, q, q)


@pytest.mark.parametrize(
    ("bad", "refused"),
    [(None, False), (np.inf, True), (-np.inf, True), (np.nan, True), ("both", True)],
    ids=["finite-sum-overflows", "+inf", "-inf", "nan", "+inf-and-inf"],
)
@pytest.mark.parametrize("size", [4, FLAGS_AT_ONCE + 1], ids=["small", "large"])
def test_require_finite_refuses_every_non_finite_entry_and_only_those(
    size: int, bad: float | str | None, refused: bool
) -> None:
    """Finite entries whose sum overflows pass (a large array is summed before it is looked
    through); one ±∞ or NaN anywhere, or +∞ and −∞ (their sum is NaN), is refused."""
    a = np.full((2, size), 1e308)  # finite: every sum of two of them overflows
    if bad == "both":
        a[0, 1], a[1, -1] = np.inf, -np.inf
    elif bad is not None:
        assert isinstance(bad, float)
        a[1, size // 2] = bad
    if refused:
        with pytest.raises(AttentionInputError, match="the test array overflowed"):
            require_finite(a, "the test array")
    else:
        require_finite(a, "the test array")


@pytest.mark.parametrize(
    ("alignment", "L", "S", "expected"),
    [
        ("upper_left", 2, 3, [[1, 0, 0], [1, 1, 0]]),
        ("lower_right", 2, 3, [[1, 1, 0], [1, 1, 1]]),
        ("lower_right", 3, 2, [[0, 0], [1, 0], [1, 1]]),
    ],
    ids=["upper_left-2x3", "lower_right-2x3", "lower_right-3x2"],
)
def test_causal_alignment(alignment: Alignment, L: int, S: int, expected: list[list[int]]) -> None:
    np.testing.assert_array_equal(masks.causal(L, S, alignment), np.array(expected, dtype=bool))


def test_window_band() -> None:
    # query i sees i-1 … i+0
    expected = [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    np.testing.assert_array_equal(masks.window(4, 4, 1, 0), np.array(expected, dtype=bool))


def test_combine_and_of_masks_with_padding_and_additive() -> None:
    add = np.array([[0.0, -1.0, NEG], [0.5, 0.0, 0.0]])
    m = masks.combine(
        [masks.Causal(), masks.Padding(key_lengths=(3,), query_lengths=(1,)), masks.Additive(add)],
        batch=1, seq_len=2, ctx_len=3,
    )  # fmt: skip
    # causal keeps (0,0), (1,0), (1,1); additive −∞ at (0,2); query row 1 is padding
    np.testing.assert_array_equal(m.allowed[0], [[True, False, False], [False, False, False]])
    assert m.additive[0, 0, 0] == 0.0 and np.isneginf(m.additive[0, 0, 1])
    np.testing.assert_array_equal(m.padded_queries, [[False, True]])


def test_padded_query_rows_are_zero_and_not_fully_masked_errors() -> None:
    q = k = v = np.eye(3)[None]
    m = masks.combine([masks.Padding(query_lengths=(2,))], 1, 3, 3)
    trace = scaled_dot_product_attention(
        q, k, v, additive=m.additive, padded_queries=m.padded_queries, fully_masked_policy="error"
    )
    np.testing.assert_array_equal(trace.weights[0, 2], [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(trace.output[0, 2], [0.0, 0.0, 0.0])
    assert not trace.fully_masked_rows.any()


def test_project_is_x_w_plus_b() -> None:
    x = np.array([[1.0, 2.0]])
    w = np.array([[1.0, 0.0, 2.0], [0.0, 1.0, 3.0]])  # (d_in 2, d_out 3)
    # [1, 2] @ w = [1, 2, 8], plus bias [1, 1, 1]
    np.testing.assert_array_equal(project(x, w, np.ones(3)), [[2.0, 3.0, 9.0]])


def test_default_scale_is_one_over_sqrt_d_k() -> None:
    q = np.ones((1, 2, 4))
    trace = scaled_dot_product_attention(q, q, q)
    assert trace.scale == 0.5
    np.testing.assert_array_equal(trace.scaled_scores, trace.scores * 0.5)


def test_entropy_bits() -> None:
    w = np.array([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    np.testing.assert_allclose(entropy_bits(w), [1.0, 0.0, 2.0])


def test_draw_matches_a_notebook_with_np_random_seed() -> None:
    np.random.seed(0)
    notebook = [np.random.rand(3, 4), np.random.rand(4, 2)]
    ours = draw(0, "uniform", [("x", (3, 4)), ("w_q", (4, 2))])
    np.testing.assert_array_equal(ours["x"], notebook[0])
    np.testing.assert_array_equal(ours["w_q"], notebook[1])
    np.random.seed(5)
    np.testing.assert_array_equal(draw(5, "normal", [("x", (2, 2))])["x"], np.random.randn(2, 2))


def test_sinusoidal_encoding_definition() -> None:
    pe = sinusoidal_encoding(3, 5)  # odd d_model: 3 sine columns, 2 cosine columns
    pos = 2
    for i in range(5):
        angle = pos / 10000 ** ((i - i % 2) / 5)
        assert pe[pos, i] == pytest.approx(
            np.sin(angle) if i % 2 == 0 else np.cos(angle), abs=1e-15
        )


def test_layer_norm_over_features_and_all() -> None:
    x = np.array([[[1.0, 3.0], [2.0, 6.0]]])
    feats = layer_norm(x, LayerNorm(eps=0.0))
    np.testing.assert_allclose(feats, [[[-1.0, 1.0], [-1.0, 1.0]]])
    # over all: mean 3, biased variance (4 + 0 + 1 + 9) / 4 = 3.5
    allv = layer_norm(x, LayerNorm(eps=0.0, over="all"))
    np.testing.assert_allclose(allv, (x - 3.0) / np.sqrt(3.5))


def test_split_and_merge_heads_are_inverse_and_take_column_blocks() -> None:
    t = np.arange(2 * 3 * 6, dtype=float).reshape(2, 3, 6)
    heads = split_heads(t, 3)  # (2, 3 heads, 3, 2)
    np.testing.assert_array_equal(heads[:, 1], t[:, :, 2:4])
    np.testing.assert_array_equal(merge_heads(heads), t)


def test_a_padded_query_row_gives_the_sink_nothing_either() -> None:
    """Row 1 is padding: weights, sink weight and output 0; row 0 shares 1 with the sink."""
    from service.core.variants import Variants  # appended tests: imported here

    q = k = v = np.eye(2)[None]  # (1, 2, 2)
    trace = scaled_dot_product_attention(
        q, k, v, padded_queries=np.array([[False, True]]), variants=Variants(sinks=0.0)
    )
    assert trace.sink_weights is not None
    assert trace.sink_weights[0, 1] == 0.0 and trace.sink_weights[0, 0] > 0
    np.testing.assert_array_equal(trace.weights[0, 1], [0.0, 0.0])
    np.testing.assert_array_equal(trace.output[0, 1], [0.0, 0.0])
    assert trace.weights[0, 0].sum() + trace.sink_weights[0, 0] == pytest.approx(1.0, abs=1e-15)
    assert not trace.fully_masked_rows.any()


def test_with_a_sink_the_error_policy_lets_a_fully_masked_row_through_flagged() -> None:
    """Every key of row 0 masked: the sink takes it (weight 1), "error" has nothing to refuse,
    and the row is still flagged: the flags describe the mask."""
    from service.core.variants import Variants

    q = k = v = np.eye(2)[None]  # (1, 2, 2)
    additive = np.array([[[NEG, NEG], [0.0, 0.0]]])  # (1, 2, 2)
    trace = scaled_dot_product_attention(
        q, k, v, additive=additive, fully_masked_policy="error", variants=Variants(sinks=1.0)
    )
    assert trace.sink_weights is not None and trace.sink_weights[0, 0] == 1.0
    np.testing.assert_array_equal(trace.weights[0, 0], [0.0, 0.0])
    np.testing.assert_array_equal(trace.fully_masked_rows, [[True, False]])
    with pytest.raises(FullyMaskedRowsError):
        scaled_dot_product_attention(q, k, v, additive=additive, fully_masked_policy="error")


def test_without_a_mask_no_row_is_fully_masked_and_error_refuses_nothing() -> None:
    """Only a mask makes a score −∞: unmasked (even softcapped) rows are never flagged, so the
    policy "error" computes them."""
    rng = np.random.default_rng(3)
    q, k, v = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 5, 2))
    t = scaled_dot_product_attention(q, k, v, fully_masked_policy="error")
    assert t.fully_masked_rows.shape == (2, 4) and not t.fully_masked_rows.any()
    np.testing.assert_allclose(t.weights.sum(axis=-1), 1.0, rtol=0, atol=1e-15)
