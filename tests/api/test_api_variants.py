"""The variants and the PyTorch / Hugging Face input forms through the HTTP layer (ASGI app).

Numbers against transformers' and torch's layers live in tests/api/test_golden.py (the layer cases);
here each new form is checked against a form the service already had (checked against torch
there), or against a formula written out in the test, and every rule gets its 422.
"""

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.conftest import assert_close

RNG = np.random.default_rng(13)
X = RNG.normal(size=(5, 8))
W_Q, W_K, W_V, W_O = (RNG.normal(size=s) for s in ((12, 8), (6, 8), (6, 8), (8, 12)))
Q, K, V = (RNG.normal(size=(4, 6)) for _ in range(3))


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> Any:
    """POST ``body`` (arrays as lists) and return the JSON answer, checking the status."""
    plain = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in body.items()}
    r = client.post(path, json=plain)
    assert r.status_code == status, r.text[:600]
    return r.json()


def direct(**rest: Any) -> dict[str, Any]:
    return {"q": Q, "k": K, "v": V, **rest}


def state_dict(**rest: Any) -> dict[str, Any]:
    """A LLaMA-like layer: 4 query heads, 2 key/value heads, d_k 3 (≠ d_model/h = 2)."""
    return {
        "x": X,
        "num_heads": 4,
        "q_proj.weight": W_Q,
        "k_proj.weight": W_K,
        "v_proj.weight": W_V,
        "o_proj.weight": W_O,
        **rest,
    }


# --- the variants are off unless asked for ------------------------------------------------------


VARIANT_OUTPUTS = {
    "q_normed", "k_normed", "q_rotated", "k_rotated", "capped_scores", "position_bias",
    "biased_scores", "sink_weights",
}  # fmt: skip


def test_without_variants_nothing_new_is_returned(client: TestClient) -> None:
    body = post(client, "/attention", direct())
    assert not VARIANT_OUTPUTS & set(body)
    names = [s["name"] for s in body["steps"]]
    assert names == ["scores", "scaled_scores", "weights", "output"]


def test_all_variants_return_their_outputs_and_steps_in_the_contracts_order(
    client: TestClient,
) -> None:
    body = post(
        client,
        "/attention",
        direct(qk_norm=True, rope=True, softcap=5.0, alibi=True, sinks=0.5,
               mask={"type": "causal"}),
    )  # fmt: skip
    assert set(body) >= VARIANT_OUTPUTS
    assert [s["name"] for s in body["steps"]] == [
        "q_normed", "k_normed", "q_rotated", "k_rotated", "scores", "scaled_scores",
        "capped_scores", "position_bias", "biased_scores", "masked_scores", "sink_weights",
        "weights", "output",
    ]  # fmt: skip
    keys = [k for k in body if k in VARIANT_OUTPUTS | {"scores", "weights", "masked_scores"}]
    assert keys == [
        "q_normed", "k_normed", "q_rotated", "k_rotated", "scores", "capped_scores",
        "position_bias", "biased_scores", "masked_scores", "sink_weights", "weights",
    ]  # fmt: skip


def test_each_variant_feeds_the_next_as_the_contract_orders(client: TestClient) -> None:
    """Rebuild the chain from the returned intermediates with the formulas written out."""
    body = post(
        client,
        "/attention",
        direct(rope=True, softcap=2.0, alibi={"slopes": [0.5]}, sinks=-1.0,
               mask={"type": "causal"}),
    )  # fmt: skip
    qr, kr = np.array(body["q_rotated"]), np.array(body["k_rotated"])
    scaled = qr @ kr.T / np.sqrt(6)
    assert_close(body["scaled_scores"], scaled.tolist())
    capped = 2.0 * np.tanh(scaled / 2.0)
    assert_close(body["capped_scores"], capped.tolist())
    i, j = np.arange(4)[:, None], np.arange(4)[None, :]
    assert_close(body["position_bias"], (0.5 * (j - i)).astype(float).tolist())
    biased = capped + 0.5 * (j - i)
    assert_close(body["biased_scores"], biased.tolist())
    logits = np.where(j <= i, biased, -np.inf)
    m = np.maximum(logits.max(axis=1, keepdims=True), -1.0)
    denom = np.exp(logits - m).sum(axis=1, keepdims=True) + np.exp(-1.0 - m)
    assert_close(body["weights"], (np.exp(logits - m) / denom).tolist())
    assert_close(body["sink_weights"], (np.exp(-1.0 - m) / denom)[:, 0].tolist())


def test_rope_norms_and_relative_scores_through_the_api(client: TestClient) -> None:
    """RoPE keeps each vector's length, and shifting every position by 7 changes no score."""
    a = post(client, "/attention", direct(rope={"base": 100.0}))
    b = post(client, "/attention", direct(rope={"base": 100.0}, positions=[7, 8, 9, 10],
                                          context_positions=[7, 8, 9, 10]))  # fmt: skip
    np.testing.assert_allclose(np.linalg.norm(a["q_rotated"], axis=1), np.linalg.norm(Q, axis=1))
    assert_close(b["scores"], a["scores"], tol=1e-12)
    assert not np.allclose(a["q_rotated"], b["q_rotated"])


def test_relative_bias_on_attention_takes_a_vector_and_on_multihead_a_table(
    client: TestClient,
) -> None:
    table = np.linspace(-1, 1, 8)
    one = post(client, "/attention", direct(relative_bias={"table": table.tolist()}))
    column = post(client, "/attention", direct(relative_bias={"table": table[:, None].tolist()}))
    assert_close(column["position_bias"], one["position_bias"])
    # 8 buckets, bidirectional: 4 per direction, 2 exact each; j − i = 0 → bucket 0, 1 → 5
    assert one["position_bias"][0][0] == table[0] and one["position_bias"][0][1] == table[5]
    heads = post(
        client,
        "/multihead",
        state_dict(relative_bias={"table": np.stack([table, -table] * 2, axis=1).tolist()}),
    )
    assert_close(
        np.array(heads["heads"][1]["position_bias"])[:4, :4].tolist(),
        (-np.array(one["position_bias"])).tolist(),
    )


def test_symmetric_alibi_is_symmetric_on_six_heads(client: TestClient) -> None:
    body = post(client, "/multihead", state_dict(num_heads=6, **{
        "q_proj.weight": RNG.normal(size=(12, 8)), "k_proj.weight": RNG.normal(size=(6, 8)),
        "v_proj.weight": RNG.normal(size=(6, 8)), "o_proj.weight": None,
    }, alibi={"symmetric": True}))  # fmt: skip
    for head in body["heads"]:
        bias = np.array(head["position_bias"])
        np.testing.assert_array_equal(bias, bias.T)
        assert (bias <= 0).all()
    slopes = [-h["position_bias"][0][1] for h in body["heads"]]
    # the paper's rule for 6 heads: the 4-head slopes, then every other one of the 8-head slopes
    assert slopes == [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]


# --- the PyTorch and Hugging Face forms against the forms the service already had -------------


def test_state_dict_names_equal_combined_out_in_weights(client: TestClient) -> None:
    bias = {n: RNG.normal(size=r) for n, r in (("q", 12), ("k", 6), ("v", 6), ("o", 8))}
    hf = post(client, "/multihead", state_dict(**{f"{n}_proj.bias": b for n, b in bias.items()}))
    torch_like = post(
        client,
        "/multihead",
        {
            "x": X, "num_heads": 4, "num_kv_heads": 2, "weight_layout": "out_in",
            "w_q": W_Q, "w_k": W_K, "w_v": W_V, "w_o": W_O,
            "b_q": bias["q"], "b_k": bias["k"], "b_v": bias["v"], "b_o": bias["o"],
        },
    )  # fmt: skip
    assert hf["num_kv_heads"] == 2 and hf["d_k"] == 3
    assert_close(hf["output"], torch_like["output"])
    assert_close(hf["weights"], [h["weights"] for h in torch_like["heads"]])


def test_underscore_names_equal_dotted_names(client: TestClient) -> None:
    dotted = post(client, "/multihead", state_dict())
    underscored = post(
        client,
        "/multihead",
        {
            "x": X, "num_heads": 4, "q_proj_weight": W_Q, "k_proj_weight": W_K,
            "v_proj_weight": W_V, "o_proj_weight": W_O,
        },
    )  # fmt: skip
    assert underscored["output"] == dotted["output"]


def test_state_dict_weights_are_out_in_whatever_weight_layout_says(client: TestClient) -> None:
    a = post(client, "/multihead", state_dict())
    b = post(client, "/multihead", state_dict(weight_layout="in_out"))
    assert a["output"] == b["output"]


def test_q_norm_weight_turns_rms_qk_norm_on(client: TestClient) -> None:
    w = [1.0, 2.0, 0.5]
    implied = post(client, "/multihead", state_dict(**{"q_norm.weight": w, "k_norm.weight": w}))
    explicit = post(
        client, "/multihead", state_dict(qk_norm={"type": "rms", "q_weight": w, "k_weight": w})
    )
    assert implied["output"] == explicit["output"]
    q = np.array(implied["heads"][0]["q"])
    rms = q / np.sqrt((q**2).mean(axis=1, keepdims=True) + 1e-6) * w
    assert_close(implied["heads"][0]["q_normed"], rms.tolist())


def test_kdim_context_with_q_k_v_proj_weights_and_packed_bias(client: TestClient) -> None:
    """nn.MultiheadAttention(kdim=vdim=5): separate weights, one packed in_proj_bias."""
    ctx = RNG.normal(size=(6, 5))
    w_k, w_v = RNG.normal(size=(8, 5)), RNG.normal(size=(8, 5))
    w_q = RNG.normal(size=(8, 8))
    b = RNG.normal(size=24)
    body = post(
        client,
        "/multihead",
        {"x": X, "context": ctx, "num_heads": 2, "q_proj_weight": w_q, "k_proj_weight": w_k,
         "v_proj_weight": w_v, "in_proj_bias": b},
    )  # fmt: skip
    q = X @ w_q.T + b[:8]
    k = ctx @ w_k.T + b[8:16]
    assert_close(body["heads"][1]["q"], q[:, 4:].tolist())
    assert_close(body["heads"][1]["scores"], (q[:, 4:] @ k[:, 4:].T).tolist())


def test_key_padding_mask_equals_a_padding_mask(client: TestClient) -> None:
    xs = np.stack([X, X[::-1]])
    padded = post(client, "/multihead", state_dict(x=xs, key_padding_mask=[
        [False, False, False, True, True], [False, False, False, False, True]]))  # fmt: skip
    lengths = post(
        client, "/multihead", state_dict(x=xs, mask={"type": "padding", "key_lengths": [3, 4]})
    )
    assert padded["output"] == lengths["output"]
    assert padded["mask"] == lengths["mask"]
    one_row = post(client, "/attention", direct(key_padding_mask=[0, 0, 1, 0]))
    assert [row[2] for row in one_row["weights"]] == [0.0] * 4


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
def test_true_means_masked_is_the_torch_polarity(client: TestClient, batched: bool) -> None:
    allowed = np.tril(np.ones((4, 4), dtype=bool))
    shape = (lambda m: np.stack([m, m])) if batched else (lambda m: m)
    q = (lambda a: np.stack([a, a])) if batched else (lambda a: a)
    sdpa = post(
        client,
        "/mask",
        {
            "q": q(Q),
            "k": q(K),
            "v": q(V),
            "mask": {"type": "boolean", "matrix": shape(allowed).tolist()},
        },
    )
    torch_polarity = post(client, "/mask", {"q": q(Q), "k": q(K), "v": q(V), "mask": {
        "type": "boolean", "matrix": shape(~allowed).tolist(), "true_means": "masked"}})  # fmt: skip
    assert torch_polarity["weights"] == sdpa["weights"]
    assert torch_polarity["mask"] == sdpa["mask"]  # returned as true = may attend


def test_heads_given_directly_reproduce_the_projected_heads(client: TestClient) -> None:
    rope = {"rotary_dim": 2}  # d_k is 3: partial rotary
    full = post(client, "/multihead", state_dict(rope=rope, mask={"type": "causal"}))
    q = [h["q"] for h in full["heads"]]  # (h, L, d_k)
    k = [full["heads"][i]["k"] for i in (0, 2)]  # the two key/value heads
    v = [full["heads"][i]["v"] for i in (0, 2)]
    given = post(
        client,
        "/multihead",
        {"q": q, "k": k, "v": v, "rope": rope, "mask": {"type": "causal"}, "o_proj.weight": W_O},
    )
    assert given["num_heads"] == 4 and given["num_kv_heads"] == 2
    assert_close(given["output"], full["output"])
    assert_close(given["weights"], full["weights"])
    batched = post(client, "/multihead", {"q": [q, q], "k": [k, k], "v": [v, v]})
    assert np.array(batched["weights"]).shape == (2, 4, 5, 5)


def test_stacked_weights_are_the_heads_weights(client: TestClient) -> None:
    body = post(client, "/multihead", state_dict(sinks=[0.0, 1.0, -1.0, 2.0]))
    assert body["weights"] == [h["weights"] for h in body["heads"]]
    for head in body["heads"]:
        total = np.array(head["weights"]).sum(axis=1) + np.array(head["sink_weights"])
        np.testing.assert_allclose(total, 1.0, rtol=0, atol=1e-15)


def test_a_fully_masked_row_gives_all_its_weight_to_the_sink(client: TestClient) -> None:
    body = post(client, "/mask", direct(sinks=0.0, fully_masked_rows="error",
                                        mask={"type": "padding", "key_lengths": 0}))  # fmt: skip
    assert body["sink_weights"] == [1.0] * 4
    assert body["weights"] == [[0.0] * 4] * 4


def test_a_padded_query_row_gives_the_sink_nothing(client: TestClient) -> None:
    """A padded query row (query_lengths) is padding: weights, sink weight and output all 0;
    every other row still shares 1 between its keys and the sink."""
    body = post(client, "/mask", direct(sinks=0.5, mask={"type": "padding", "query_lengths": 3}))
    assert body["sink_weights"][3] == 0.0
    assert body["weights"][3] == [0.0] * 4 and body["output"][3] == [0.0] * 6
    assert body["fully_masked_rows"] == []
    total = np.array(body["weights"]).sum(axis=1) + np.array(body["sink_weights"])
    np.testing.assert_allclose(total, [1.0, 1.0, 1.0, 0.0], rtol=0, atol=1e-15)
    xs = np.stack([X, X[::-1]])
    heads = post(client, "/multihead", state_dict(x=xs, sinks=[0.0, 1.0, -1.0, 2.0],
                 mask={"type": "padding", "query_lengths": [2, 5]}))  # fmt: skip
    for head in heads["heads"]:
        sink = np.array(head["sink_weights"])  # (B, L)
        assert (sink[0, 2:] == 0.0).all() and (sink[0, :2] > 0).all() and (sink[1] > 0).all()
        total = np.array(head["weights"]).sum(axis=-1) + sink
        np.testing.assert_allclose(total, [[1, 1, 0, 0, 0], [1] * 5], rtol=0, atol=1e-15)


FULL_ROW_MASK = {"type": "boolean", "matrix": [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0],
                                               [1, 1, 1, 1]]}  # fmt: skip


@pytest.mark.parametrize("policy", ["zero", "uniform", "error"])
def test_with_sinks_a_fully_masked_row_is_defined_listed_and_never_an_error(
    client: TestClient, policy: str
) -> None:
    """The sink takes the whole row, so no policy has anything to do: "zero", "uniform" and
    "error" give the same answer, and fully_masked_rows (which describes the mask) lists it."""
    body = post(client, "/mask", direct(sinks=0.5, fully_masked_rows=policy, mask=FULL_ROW_MASK))
    assert body["fully_masked_rows"] == [1]
    assert body["sink_weights"][1] == 1.0
    assert body["weights"][1] == [0.0] * 4 and body["output"][1] == [0.0] * 6
    zero = post(client, "/mask", direct(sinks=0.5, mask=FULL_ROW_MASK))
    assert {k: v for k, v in body.items() if k != "conventions"} == {
        k: v for k, v in zero.items() if k != "conventions"
    }
    xs = np.stack([X[:4], X[1:]])
    heads = post(client, "/multihead", state_dict(
        x=xs, sinks=[0.0, 1.0, -1.0, 2.0], fully_masked_rows=policy,
        mask=[FULL_ROW_MASK, {"type": "padding", "query_lengths": [4, 1]}]))  # fmt: skip
    assert heads["fully_masked_rows"] == [[1], []]  # item 1: row 1 is padding, not listed
    for head in heads["heads"]:
        assert [row[1] for row in head["sink_weights"]] == [1.0, 0.0]


def test_without_sinks_a_fully_masked_row_is_still_refused_under_error(
    client: TestClient,
) -> None:
    body = post(client, "/mask", direct(fully_masked_rows="error", mask=FULL_ROW_MASK), 422)
    assert "rows [1]" in body["message"]


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
def test_mask_takes_key_padding_mask_as_its_only_mask(client: TestClient, batched: bool) -> None:
    """key_padding_mask is a mask: /mask answers it as it answers the same padding given as a
    padding mask object or as a boolean matrix (true = may attend)."""
    if batched:
        qkv = {n: np.stack([a, a[::-1]]) for n, a in (("q", Q), ("k", K), ("v", V))}
        kpm: Any = [[False, False, False, True], [False, False, True, True]]
        allowed: Any = [[[not f for f in row]] * 4 for row in kpm]
        padding: dict[str, Any] = {"type": "padding", "key_lengths": [3, 2]}
    else:
        qkv = {"q": Q, "k": K, "v": V}
        kpm = [False, False, False, True]
        allowed = [[not f for f in kpm]] * 4
        padding = {"type": "padding", "key_lengths": 3}
    own = post(client, "/mask", {**qkv, "key_padding_mask": kpm})
    as_padding = post(client, "/mask", {**qkv, "mask": padding})
    as_boolean = post(client, "/mask", {**qkv, "mask": {"type": "boolean", "matrix": allowed}})
    assert own == as_padding == as_boolean  # mask outputs, steps and conventions included
    assert {"mask", "additive_mask", "masked_scores", "fully_masked_rows"} <= set(own)
    assert own["fully_masked_rows"] == ([[], []] if batched else [])


def test_include_knows_the_new_outputs(client: TestClient) -> None:
    body = post(client, "/attention", direct(softcap=1.0, include=["capped_scores"]))
    assert "capped_scores" in body and "weights" not in body
    body = post(client, "/multihead", state_dict(include=["weights"]))
    assert "weights" in body and "heads" not in body


def test_the_new_outputs_count_against_the_result_limit(client: TestClient) -> None:
    big = {"seq_len": 200, "seed": 0, "d_model": 64, "d_k": 64}
    plain = post(client, "/attention", {**big, "include": ["output"]})
    assert "output" in plain
    body = post(client, "/multihead", {"sentence": " ".join(["a"] * 300), "seed": 0,
                                       "d_model": 64, "num_heads": 64, "alibi": True}, 413)  # fmt: skip
    assert "position_bias" in body["message"] or "weights" in body["message"]


# --- rules: a 422 naming the field ---------------------------------------------------------------


BAD: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("positions-without-a-user", "/attention", direct(positions=[0, 1, 2, 3]), "positions",
     "none of them is on"),
    ("positions-wrong-length", "/attention", direct(rope=True, positions=[0, 1]), "positions",
     "2 entries but there are 4 queries"),
    ("context-positions-wrong-length", "/attention",
     direct(alibi=True, context_positions=[0, 1, 2]), "context_positions", "3 entries"),
    ("positions-not-integers", "/attention", direct(rope=True, positions=[0, 1, 2.5, 3]),
     "positions[2]", "integer"),
    ("rotary-dim-odd", "/attention", direct(rope={"rotary_dim": 3}), "rope.rotary_dim", "even"),
    ("rotary-dim-too-big", "/attention", direct(rope={"rotary_dim": 8}), "rope.rotary_dim",
     "d_k is only 6"),
    ("rope-base-zero", "/attention", direct(rope={"base": 0}), "rope.base", "greater than 0"),
    ("rope-scaling-unknown", "/attention", direct(rope={"scaling": {"type": "ntk-by-parts"}}),
     "rope.scaling", "linear, llama3"),
    ("llama3-low-above-high", "/attention",
     direct(rope={"scaling": {"type": "llama3", "low_freq_factor": 5}}),
     "rope.scaling.high_freq_factor", "low_freq_factor ≤ high_freq_factor"),
    ("linear-factor-missing", "/attention", direct(rope={"scaling": {"type": "linear"}}),
     "rope.scaling.factor", "required"),
    ("softcap-zero", "/attention", direct(softcap=0), "softcap", "greater than 0"),
    ("softcap-text", "/attention", direct(softcap="50"), "softcap", "number"),
    ("two-biases", "/attention", direct(alibi=True, relative_bias={"table": [0.0] * 8}),
     "relative_bias", "not both"),
    ("alibi-slopes-count", "/attention", direct(alibi={"slopes": [1, 2]}), "alibi.slopes",
     "one slope per head"),
    ("relative-table-columns", "/multihead",
     state_dict(relative_bias={"table": [[0.0] * 3] * 8}), "relative_bias.table",
     "3 column(s) but there are 4 heads"),
    ("relative-too-few-buckets", "/attention", direct(relative_bias={"table": [0.0, 1.0]}),
     "relative_bias", "at least 4 buckets"),
    ("relative-max-distance", "/attention",
     direct(relative_bias={"table": [0.0] * 8, "max_distance": 2}), "relative_bias",
     "max_distance"),
    ("qk-norm-weight-length", "/attention", direct(qk_norm={"q_weight": [1, 2]}),
     "qk_norm.q_weight", "d_k = 6"),
    ("qk-norm-type", "/attention", direct(qk_norm={"type": "l2"}), "qk_norm.type", "rms"),
    ("qk-norm-twice", "/multihead",
     state_dict(qk_norm={"q_weight": [1, 1, 1]}, **{"q_norm.weight": [1, 1, 1]}),
     "q_norm.weight", "not both"),
    ("sinks-list-on-attention", "/attention", direct(sinks=[1.0]), "sinks", "number"),
    ("sinks-count", "/multihead", state_dict(sinks=[1.0, 2.0]), "sinks", "one per head"),
    ("key-padding-length", "/attention", direct(key_padding_mask=[0, 1]), "key_padding_mask",
     "4 keys"),
    ("key-padding-batch", "/attention", direct(key_padding_mask=[[0, 0, 0, 1]] * 2),
     "key_padding_mask", "unbatched"),
    ("key-padding-values", "/attention", direct(key_padding_mask=[0, 2, 0, 0]),
     "key_padding_mask", "true/false or 1/0"),
    ("true-means-unknown", "/mask",
     direct(mask={"type": "boolean", "matrix": [[1] * 4] * 4, "true_means": "allowed"}),
     "mask[0].true_means", "attend"),
    ("q-proj-rows", "/multihead", state_dict(**{"q_proj.weight": RNG.normal(size=(10, 8))}),
     "q_proj.weight", "num_heads 4 does not divide"),
    ("k-proj-rows", "/multihead", state_dict(**{"k_proj.weight": RNG.normal(size=(4, 8))}),
     "k_proj.weight", "not a multiple of d_k = 3"),
    ("kv-heads-disagree", "/multihead", state_dict(num_kv_heads=4), "num_kv_heads", "rows"),
    ("q-proj-columns", "/multihead", state_dict(**{"q_proj.weight": RNG.normal(size=(12, 7))}),
     "q_proj.weight", "8 columns"),
    ("v-proj-missing", "/multihead", state_dict(**{"v_proj.weight": None}), "v_proj.weight",
     "missing"),
    ("state-dict-and-combined", "/multihead", state_dict(w_q=W_Q.T), "q_proj.weight",
     "one form only"),
    ("kdim-not-vdim", "/multihead",
     {"x": X, "context": RNG.normal(size=(6, 5)), "num_heads": 2,
      "q_proj_weight": RNG.normal(size=(8, 8)), "k_proj_weight": RNG.normal(size=(8, 5)),
      "v_proj_weight": RNG.normal(size=(8, 3))}, "v_proj.weight", "kdim ≠ vdim"),
    ("o-proj-and-out-proj", "/multihead", state_dict(out_proj_weight=W_O), "o_proj.weight",
     "not both"),
    ("o-proj-columns", "/multihead", state_dict(**{"o_proj.weight": RNG.normal(size=(8, 6))}),
     "o_proj.weight", "12 columns"),
    ("o-proj-bias-length", "/multihead", state_dict(**{"o_proj.bias": [0.0] * 3}),
     "o_proj.bias", "3 entries"),
    ("num-heads-missing", "/multihead", {"x": X, "w_q": W_Q.T, "w_k": W_Q.T, "w_v": W_Q.T},
     "num_heads", "missing"),
    ("heads-and-x", "/multihead", {"q": [Q.tolist()], "k": [K.tolist()], "v": [V.tolist()],
                                   "x": X}, "x", "direct mode"),
    ("heads-and-residual", "/multihead",
     {"q": [Q.tolist()], "k": [K.tolist()], "v": [V.tolist()], "residual": True},
     "residual", "direct mode"),
    ("heads-num-heads", "/multihead",
     {"q": [Q.tolist()], "k": [K.tolist()], "v": [V.tolist()], "num_heads": 2}, "num_heads",
     "1"),
    ("heads-gqa-not-divisible", "/multihead",
     {"q": [Q.tolist()] * 3, "k": [K.tolist()] * 2, "v": [V.tolist()] * 2}, "k",
     "not a multiple"),
    ("heads-not-per-head", "/multihead", {"q": Q.tolist(), "k": K.tolist(), "v": V.tolist()},
     "q", "heads [h][n][d]"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "field", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_a_broken_variant_rule_is_422_naming_the_field(
    client: TestClient, path: str, body: dict[str, Any], field: str, words: str
) -> None:
    answer = post(client, path, {k: v for k, v in body.items() if v is not None}, 422)
    fields = [e["field"] for e in answer["errors"]]
    assert field in fields, answer
    assert words in answer["message"], answer["message"]


@pytest.mark.parametrize(
    ("rope", "words"),
    [
        ({"rotary_dim": 2, "scaling": {"type": "dynamic", "factor": 2.0, "original_max_position": 2}},
         "rotary_dim > 2"),
        ({"base": 1.0, "scaling": {"type": "yarn", "factor": 4.0, "original_max_position": 2}},
         "base above 1"),
        ({"base": 0.5, "scaling": {"type": "yarn", "factor": 4.0, "original_max_position": 2}},
         "base above 1"),
        ({"scaling": {"type": "longrope", "short_factor": [1.0, 1.0], "long_factor": [2.0, 2.0],
                      "original_max_position": 1, "factor": 4.0}}, "original_max_position ≥ 2"),
        ({"scaling": {"type": "dynamic", "factor": 1e300, "original_max_position": 1}},
         "overflow"),
    ],
    ids=["dynamic-rotary-dim-2", "yarn-base-1", "yarn-base-below-1", "longrope-original-1",
         "dynamic-overflow"],
)  # fmt: skip
def test_a_rope_scaling_it_cannot_compute_is_422_not_500(
    client: TestClient, rope: dict[str, Any], words: str
) -> None:
    body = {"q": [[1.0, 0.0, 1.0, 0.0]] * 3, "k": [[0.0, 1.0, 0.0, 1.0]] * 3,
            "v": [[1.0, 2.0]] * 3, "rope": rope, "positions": [0, 1, 2]}  # fmt: skip
    r = client.post("/attention", json=body)
    assert r.status_code == 422, r.text
    assert words in r.json()["message"]
