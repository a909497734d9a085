"""The trace pipeline without HTTP: a validated request → its Shapes (rules) → a frozen plan
(plan) → the response's arrays and values (compute, steps). Every expected number is computed
here from its definition with NumPy, independently of the engine."""

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from service.trace import compute, plan, rules, steps
from service.wire.errors import FieldError
from service.wire.schemas.requests import AttentionRequest, MaskRequest, MultiheadRequest

Array = npt.NDArray[np.float64]
RNG = np.random.default_rng(7)
X = RNG.normal(size=(3, 4))
W_Q, W_K, W_V = (RNG.normal(size=(4, 2)) for _ in range(3))


def no_check() -> None:
    """The client never leaves here."""


def softmax(s: Array) -> Array:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    out: Array = e / e.sum(axis=-1, keepdims=True)
    return out


def attention(q: Array, k: Array, v: Array) -> tuple[Array, Array]:
    """Vaswani et al. (2017), eq. 1: the weights and the output."""
    w = softmax(q @ k.T / np.sqrt(q.shape[-1]))
    return w, w @ v


def run(fields: dict[str, Any], model: type[AttentionRequest] = AttentionRequest) -> dict[str, Any]:
    req = model.model_validate(fields)
    shapes = rules.attention_shapes(req)
    return compute.run_attention(plan.plan_attention(req, shapes), no_check)


# ---------------------------------------------------------------------------------- rules

SHAPES = [
    ("direct", {"q": X[:, :2], "k": X[:2, :2], "v": X[:2]}, (None, 3, 2, None, 2, 4, ())),
    (
        "projections",
        {"x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V},
        (None, 3, 3, 4, 2, 2, ()),
    ),
    (
        "generated",
        {"sentence": "a b c d e", "seed": 1, "d_model": 6, "d_k": 3},
        (None, 5, 5, 6, 3, 3, ("x", "w_q", "w_k", "w_v")),
    ),
    (
        "batched-cross",
        {"x": [X, X], "context": [X[:2], X[:2]], "w_q": W_Q, "w_k": W_K, "w_v": W_V},
        (2, 3, 2, 4, 2, 2, ()),
    ),
]


@pytest.mark.parametrize(("fields", "want"), [c[1:] for c in SHAPES], ids=[c[0] for c in SHAPES])
def test_the_rules_give_the_shapes_a_request_implies(
    fields: dict[str, Any], want: tuple[Any, ...]
) -> None:
    s = rules.attention_shapes(AttentionRequest.model_validate(fields))
    assert (s.batch, s.seq_len, s.ctx_len, s.d_model, s.d_k, s.d_v, s.generated) == want


def test_the_rules_turn_variants_and_masks_on_only_when_asked() -> None:
    plain = rules.attention_shapes(AttentionRequest.model_validate({"x": X, "seed": 0}))
    assert not (plain.masked or plain.on or plain.comparing)
    asked = rules.attention_shapes(
        AttentionRequest.model_validate(
            {"x": X, "seed": 0, "rope": True, "softcap": 5, "mask": {"type": "causal"}}
        )
    )
    assert asked.masked and asked.on == {"rope", "softcap"} and asked.num_masks == 1


def test_a_rule_across_fields_names_the_field() -> None:
    req = AttentionRequest.model_validate({"x": X, "w_q": W_Q, "w_k": W_K[:, :1], "w_v": W_V})
    with pytest.raises(FieldError) as err:
        rules.attention_shapes(req)
    assert err.value.field == "w_k"


# ----------------------------------------------------------------------------------- plan


def test_the_plan_holds_every_weight_in_in_out_layout_once() -> None:
    """PyTorch's layout (out_in) is transposed once, in the plan; the engine sees in_out."""
    req = AttentionRequest.model_validate(
        {"x": X, "w_q": W_Q.T, "w_k": W_K.T, "w_v": W_V.T, "weight_layout": "out_in"}
    )
    p = plan.plan_attention(req, rules.attention_shapes(req))
    assert p.projections is not None
    np.testing.assert_array_equal(p.projections.w_q, W_Q)
    np.testing.assert_array_equal(p.projections.w_v, W_V)


def test_the_plan_draws_the_missing_arrays_in_the_contracts_order() -> None:
    req = AttentionRequest.model_validate({"x": X, "w_q": W_Q, "seed": 5, "d_k": 2})
    p = plan.plan_attention(req, rules.attention_shapes(req))
    draws = np.random.RandomState(5)
    assert list(p.generated) == ["w_k", "w_v"]  # x and w_q were given: no draw for them
    np.testing.assert_array_equal(p.generated["w_k"], draws.rand(4, 2))
    np.testing.assert_array_equal(p.generated["w_v"], draws.rand(4, 2))


# -------------------------------------------------------------------------------- compute


def test_run_attention_equals_the_definition() -> None:
    body = run({"x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V})
    weights, output = attention(X @ W_Q, X @ W_K, X @ W_V)
    np.testing.assert_allclose(body["weights"], weights, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(body["output"], output, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(body["scores"], (X @ W_Q) @ (X @ W_K).T, rtol=1e-12)


def test_run_mask_with_key_padding_alone_hides_the_padded_keys() -> None:
    body = run({"q": X, "k": X, "v": X, "key_padding_mask": [False, False, True]}, MaskRequest)
    weights, _ = attention(X, X[:2], X[:2])
    np.testing.assert_allclose(body["weights"][:, :2], weights, rtol=1e-12, atol=1e-15)
    assert (body["weights"][:, 2] == 0).all()
    assert body["mask"].tolist() == [[True, True, False]] * 3


def test_run_multihead_equals_heads_concatenated_then_projected() -> None:
    """Two heads of combined weights (head i: columns 2i, 2i+1), concatenated, times W_o."""
    w_q, w_k, w_v, w_o = (RNG.normal(size=(4, 4)) for _ in range(4))
    req = MultiheadRequest.model_validate(
        {"x": X, "num_heads": 2, "w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": w_o}
    )
    shapes = rules.multihead_shapes(req)
    body = compute.run_multihead(plan.plan_multihead(req, shapes), no_check)
    heads = [
        attention(X @ w_q[:, c : c + 2], X @ w_k[:, c : c + 2], X @ w_v[:, c : c + 2])
        for c in (0, 2)
    ]
    concat = np.concatenate([out for _, out in heads], axis=-1)
    np.testing.assert_allclose(body["output"], concat @ w_o, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(
        body["average_weights"], (heads[0][0] + heads[1][0]) / 2, rtol=1e-12, atol=1e-15
    )


# ---------------------------------------------------------------------------------- steps


def test_the_steps_follow_the_order_of_the_computation() -> None:
    req = AttentionRequest.model_validate(
        {"x": X, "seed": 0, "d_k": 2, "rope": True, "mask": {"type": "causal"}}
    )
    p = plan.plan_attention(req, rules.attention_shapes(req))
    names = [s["name"] for s in steps.attention_steps(p, 1 / np.sqrt(2))]
    assert names == [
        "generate w_q",
        "generate w_k",
        "generate w_v",
        "q",
        "k",
        "v",
        "q_rotated",
        "k_rotated",
        "scores",
        "scaled_scores",
        "masked_scores",
        "weights",
        "output",
    ]
    assert steps.conventions(p)["causal_alignment"] == "upper_left"
