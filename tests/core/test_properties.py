"""Hypothesis properties of the engine: they hold for every input, not just hand-picked ones."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from service.core import masks
from service.core.attention import scaled_dot_product_attention
from service.core.multihead import MultiheadWeights, multihead_attention

finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
dims = st.integers(1, 6)


@st.composite
def qkv(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    b, L, S, d, dv = draw(dims), draw(dims), draw(dims), draw(dims), draw(dims)
    q = draw(arrays(np.float64, (b, L, d), elements=finite))
    k = draw(arrays(np.float64, (b, S, d), elements=finite))
    v = draw(arrays(np.float64, (b, S, dv), elements=finite))
    return q, k, v


@settings(max_examples=150, deadline=None)
@given(qkv(), st.data())
def test_weight_rows_sum_to_one_or_are_zero_and_masked_weights_are_exactly_zero(
    tensors: tuple[np.ndarray, np.ndarray, np.ndarray], data: st.DataObject
) -> None:
    q, k, v = tensors
    b, L, S = q.shape[0], q.shape[1], k.shape[1]
    allowed = data.draw(arrays(np.bool_, (b, L, S)))
    m = masks.combine([masks.Boolean(allowed)], b, L, S)
    trace = scaled_dot_product_attention(
        q, k, v, additive=m.additive, padded_queries=m.padded_queries
    )
    sums = trace.weights.sum(axis=-1)
    empty = ~allowed.any(axis=-1)
    np.testing.assert_allclose(sums[~empty], 1.0, rtol=1e-12)
    assert (trace.weights[empty] == 0.0).all()
    assert (trace.weights[~allowed] == 0.0).all()
    assert np.isfinite(trace.weights).all() and np.isfinite(trace.output).all()


@settings(max_examples=100, deadline=None)
@given(qkv(), st.data())
def test_self_attention_without_mask_is_permutation_equivariant(
    tensors: tuple[np.ndarray, np.ndarray, np.ndarray], data: st.DataObject
) -> None:
    x = tensors[0][:1]  # (1, L, d), self-attention: q = k = v = x
    perm = np.array(data.draw(st.permutations(list(range(x.shape[1])))), dtype=int)
    out = scaled_dot_product_attention(x, x, x).output
    out_perm = scaled_dot_product_attention(x[:, perm], x[:, perm], x[:, perm]).output
    np.testing.assert_allclose(out_perm, out[:, perm], rtol=1e-10, atol=1e-10)


@settings(max_examples=100, deadline=None)
@given(qkv())
def test_a_batch_equals_its_items_one_by_one(
    tensors: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    q, k, v = tensors
    whole = scaled_dot_product_attention(q, k, v)
    for i in range(q.shape[0]):
        one = scaled_dot_product_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1])
        np.testing.assert_array_equal(one.weights[0], whole.weights[i])
        np.testing.assert_allclose(one.output[0], whole.output[i], rtol=1e-13, atol=1e-13)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.data())
def test_multihead_average_weights_rows_sum_to_one(h: int, L: int, data: st.DataObject) -> None:
    d_k = data.draw(st.integers(1, 3))
    d_model = data.draw(st.integers(1, 6))
    x = data.draw(arrays(np.float64, (1, L, d_model), elements=finite))
    w = [data.draw(arrays(np.float64, (d_model, h * d_k), elements=finite)) for _ in range(3)]
    trace = multihead_attention(x, MultiheadWeights(*w), num_heads=h)
    np.testing.assert_allclose(trace.average_weights.sum(axis=-1), 1.0, rtol=1e-12)
    assert trace.concat.shape == (1, L, h * d_k)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1e-150, 1e-5, 1.0, 1e5, 1e150]), qkv())
def test_huge_and_tiny_magnitudes_give_finite_weights(
    magnitude: float, tensors: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> None:
    q, k, v = (t * magnitude for t in tensors)
    trace = scaled_dot_product_attention(q, k, v)
    assert np.isfinite(trace.weights).all()
    np.testing.assert_allclose(trace.weights.sum(axis=-1), 1.0, rtol=1e-12)
