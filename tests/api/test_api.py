"""The HTTP API through the ASGI app: worked examples, options, and every class of bad input."""

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.wire import examples as ex


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()  # type: ignore[no-any-return]


# ---- worked examples ---------------------------------------------------------------------


def test_batman_attends_most_to_i(client: TestClient) -> None:
    body = post(client, "/attention", ex.I_AM_BATMAN)
    # Q = X W_qᵀ: x row "I" = [1, 0] picks column 0 of W_qᵀ = row 0 of W_q = [1, 2]... as [1, 3]
    assert body["q"] == [[1.0, 3.0], [0.0, 0.0], [2.0, 4.0]]
    top = body["summary"][2]
    assert (top["token"], top["top_key"], top["top_key_index"]) == ("Batman", "I", 0)
    assert top["top_weight"] == pytest.approx(body["weights"][2][0])
    assert body["conventions"]["weight_layout"] == "out_in"
    assert [s["name"] for s in body["steps"]] == [
        "q",
        "k",
        "v",
        "scores",
        "scaled_scores",
        "weights",
        "output",
    ]
    assert body["steps"][3] == {"name": "scores", "formula": "Q Kᵀ", "shape": [3, 3]}


def test_the_cat_sat_returns_the_generated_weights(client: TestClient) -> None:
    body = post(client, "/attention", ex.THE_CAT_SAT)
    np.random.seed(0)
    np.testing.assert_array_equal(body["w_q"], np.random.rand(4, 4))
    assert "x" not in body  # x was given, not generated
    assert body["steps"][0]["formula"] == "w_q = RandomState(0).rand(4, 4)"


def test_generated_sentence_draws_x_first(client: TestClient) -> None:
    body = post(client, "/attention", {**ex.GENERATED_SENTENCE, "decimals": None})
    rng = np.random.RandomState(42)
    x, w_q = rng.rand(5, 4), rng.rand(4, 3)
    np.testing.assert_array_equal(body["x"], x)
    np.testing.assert_array_equal(body["w_q"], w_q)
    np.testing.assert_allclose(body["q"], x @ w_q, rtol=1e-14)
    assert body["tokens"] == ["attention", "is", "all", "you", "need"]


def test_generated_d_k_defaults_to_d_model(client: TestClient) -> None:
    """A notebook's d_k = embedding_dim: sentence, seed and d_model alone make square weights."""
    body = post(client, "/attention", {"sentence": "I am here", "seed": 3, "d_model": 5})
    rng = np.random.RandomState(3)
    x, w_q = rng.rand(3, 5), rng.rand(5, 5)
    assert body["d_k"] == 5 and body["d_v"] == 5
    np.testing.assert_array_equal(body["w_q"], w_q)
    np.testing.assert_allclose(body["q"], x @ w_q, rtol=1e-14)


def test_generated_multihead_d_k_defaults_to_d_model_over_heads(client: TestClient) -> None:
    body = post(client, "/multihead", {"seq_len": 3, "seed": 3, "d_model": 6, "num_heads": 3})
    assert body["d_k"] == 2 and np.array(body["w_q"]).shape == (6, 6)


def test_causal_mask_example(client: TestClient) -> None:
    body = post(client, "/mask", ex.CAUSAL_FOUR_TOKENS)
    assert body["mask"] == [[j <= i for j in range(4)] for i in range(4)]
    assert body["masked_scores"][0][1:] == [None, None, None]
    assert body["additive_mask"][1] == [0.0, 0.0, None, None]
    assert body["weights"][0] == [1.0, 0.0, 0.0, 0.0]
    assert body["fully_masked_rows"] == []


def test_padded_batch_example_keeps_the_batch_axis(client: TestClient) -> None:
    body = post(client, "/mask", ex.PADDED_BATCH)
    assert np.array(body["weights"]).shape == (2, 3, 3)
    assert body["mask"][1][2] == [True, True, False]  # item 1 has 2 keys
    assert body["fully_masked_rows"] == [[], []]
    assert len(body["summary"]) == 2 and len(body["summary"][0]) == 3


def test_alibi_window_example(client: TestClient) -> None:
    body = post(client, "/mask", ex.ALIBI_WINDOW)
    assert body["mask"][3] == [False, False, True, True]
    assert body["additive_mask"][3] == [None, None, -1.0, 0.0]


def test_two_heads_full_block_example(client: TestClient) -> None:
    body = post(client, "/multihead", ex.TWO_HEADS_FULL_BLOCK)
    assert len(body["heads"]) == 2
    assert np.array(body["concat"]).shape == (3, 4)
    # layer norm over each token's features, from its definition (biased variance, eps 1e-5,
    # no gamma/beta), applied to the residual the response returns (rounded to 4 decimals)
    res = np.array(body["residual"])
    mean, var = res.mean(axis=1, keepdims=True), res.var(axis=1, keepdims=True)
    np.testing.assert_allclose(body["output"], (res - mean) / np.sqrt(var + 1e-5), atol=2e-3)
    assert body["layer_norm"] == body["output"]
    names = [s["name"] for s in body["steps"]]
    assert names[0] == "x_in" and names[-3:] == ["projected", "residual", "layer_norm"]


def test_generated_multihead_example_respects_include(client: TestClient) -> None:
    body = post(client, "/multihead", ex.GENERATED_MULTIHEAD)
    assert set(body) == {"average_weights", "output", "summary", "steps", "tokens", "scale",
                         "num_heads", "num_kv_heads", "d_k", "d_v", "conventions"}  # fmt: skip
    w = np.array(body["average_weights"])
    assert (w[np.triu_indices(6, 1)] == 0).all()  # causal


# ---- options -----------------------------------------------------------------------------


def test_decimals_rounds_every_float(client: TestClient) -> None:
    body = post(client, "/attention", {**ex.I_AM_BATMAN, "decimals": 2})
    assert body["weights"][0] == [0.66, 0.02, 0.32]
    assert body["summary"][0]["top_weight"] == 0.66


def test_uniform_policy_gives_one_over_s(client: TestClient) -> None:
    mask = {"type": "boolean", "matrix": [[1, 0], [0, 0]]}
    base = {"q": [[1.0], [2.0]], "k": [[1.0], [3.0]], "v": [[2.0], [4.0]], "mask": mask}
    body = post(client, "/mask", {**base, "fully_masked_rows": "uniform"})
    assert body["weights"][1] == [0.5, 0.5] and body["output"][1] == [3.0]
    assert body["fully_masked_rows"] == [1]
    zero = post(client, "/mask", base)
    assert zero["weights"][1] == [0.0, 0.0] and zero["output"][1] == [0.0]
    err = post(client, "/mask", {**base, "fully_masked_rows": "error"}, 422)
    assert "rows [1]" in err["message"]


def test_query_padding_zeroes_rows(client: TestClient) -> None:
    body = post(
        client, "/mask", {**ex.CAUSAL_FOUR_TOKENS, "mask": {"type": "padding", "query_lengths": 2}}
    )
    assert body["weights"][2] == [0.0] * 4 and body["output"][3] == [0.0, 0.0]


def test_attention_with_optional_mask_returns_masked_scores(client: TestClient) -> None:
    assert "masked_scores" not in post(client, "/attention", ex.I_AM_BATMAN)
    body = post(client, "/attention", {**ex.I_AM_BATMAN, "mask": {"type": "causal"}})
    assert body["masked_scores"][0][1] is None


def test_healthz(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_openapi_documents_fields_and_examples(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    req = spec["components"]["schemas"]["AttentionRequest"]["properties"]
    assert all("description" in p for name, p in req.items()), (
        "every request field has a description"
    )
    post_att = spec["paths"]["/attention"]["post"]
    examples = post_att["requestBody"]["content"]["application/json"]["examples"]
    assert {"batman", "the_cat_sat", "generated_sentence"} <= set(examples)
    assert (
        "two_heads"
        in spec["paths"]["/multihead"]["post"]["requestBody"]["content"]["application/json"][
            "examples"
        ]
    )
    resp = spec["components"]["schemas"]["AttentionResponse"]["properties"]
    assert "description" in resp["weights"]


# ---- bad input: 4xx with a sentence that names the field ---------------------------------

X2 = [[1.0, 0.0], [0.0, 1.0]]
W2 = [[1.0, 2.0], [3.0, 4.0]]
PROJ = {"x": X2, "w_q": W2, "w_k": W2, "w_v": W2}
DIRECT = {"q": [[1.0, 0.0]], "k": [[1.0, 0.0]], "v": [[1.0]]}

BAD: list[tuple[str, str, dict[str, Any], str, str]] = [
    (
        "ragged_rows",
        "/attention",
        {**PROJ, "x": [[1, 0], [0, 0, 1]]},
        "x",
        "x row 1 has 3 numbers but row 0 has 2",
    ),
    (
        "weight_vs_x",
        "/attention",
        {**PROJ, "w_q": [[1, 2, 3]] * 4},
        "w_q",
        "w_q is 4×3 but x has 2 columns: with weight_layout in_out w_q must have 2 rows",
    ),
    (
        "weight_vs_x_out_in",
        "/attention",
        {**PROJ, "w_k": [[1, 2, 3]], "weight_layout": "out_in"},
        "w_k",
        "with weight_layout out_in w_k must have 2 columns",
    ),
    ("q_k_width", "/attention", {**DIRECT, "k": [[1, 0, 1]]}, "k", "q has 2 columns but k has 3"),
    ("k_v_rows", "/attention", {**DIRECT, "v": [[1], [2]]}, "v", "k has 1 rows but v has 2"),
    ("two_modes", "/attention", {**DIRECT, "x": X2}, "x", "not both"),
    ("missing_weight", "/attention", {"x": X2, "w_q": W2, "w_k": W2}, "w_v", "w_v is missing"),
    (
        "generated_without_sizes",
        "/attention",
        {"seed": 1, "d_k": 2},
        "seq_len",
        "give tokens, sentence or seq_len",
    ),
    (
        "generated_without_d_model",
        "/attention",
        {"seed": 1, "d_k": 2, "seq_len": 3},
        "d_model",
        "give d_model",
    ),
    (
        "tokens_vs_L",
        "/attention",
        {**PROJ, "tokens": ["a", "b", "c"]},
        "tokens",
        "3 tokens but there are 2 query rows",
    ),
    (
        "string_number",
        "/attention",
        {**DIRECT, "q": [[1.0, "2"]]},
        "q",
        'the string "2", not a number',
    ),
    ("null_number", "/attention", {**DIRECT, "q": [[1.0, None]]}, "q", "is null, not a number"),
    ("not_a_matrix", "/attention", {**DIRECT, "q": [1.0, 2.0]}, "q", "nested 1 level(s) deep"),
    (
        "heads_not_dividing",
        "/multihead",
        {
            "x": [[1, 2, 3]],
            "num_heads": 2,
            "w_q": [[1, 0, 0]] * 3,
            "w_k": [[1, 0, 0]] * 3,
            "w_v": [[1, 0, 0]] * 3,
        },
        "w_q",
        "num_heads 2 does not divide",
    ),
    (
        "kv_heads_not_dividing",
        "/multihead",
        {"x": [[1, 2, 3, 4]], "num_heads": 4, "num_kv_heads": 3, "seed": 0},
        "num_kv_heads",
        "not a multiple of num_kv_heads 3",
    ),
    (
        "mask_shape",
        "/mask",
        {**DIRECT, "mask": {"type": "boolean", "matrix": [[1, 0]]}},
        "mask[0].matrix",
        "mask[0].matrix is 1×2 but the scores are L×S = 1×1",
    ),
    ("mask_missing", "/mask", DIRECT, "mask", "mask is required"),
    (
        "mask_bad_value",
        "/mask",
        {**DIRECT, "mask": {"type": "boolean", "matrix": [[2]]}},
        "mask[0].matrix",
        "mask[0].matrix row 0, column 0 is 2: only true/false or 1/0",
    ),
    (
        "key_lengths_too_long",
        "/mask",
        {**DIRECT, "mask": {"type": "padding", "key_lengths": 5}},
        "mask[0].key_lengths",
        "only 1 keys",
    ),
    (
        "key_lengths_vs_batch",
        "/mask",
        {
            "q": [[[1.0]], [[2.0]]],
            "k": [[[1.0]], [[2.0]]],
            "v": [[[1.0]], [[2.0]]],
            "mask": {"type": "padding", "key_lengths": [1, 1, 1]},
        },
        "mask[0].key_lengths",
        "has 3 entries but the batch has 2",
    ),
    (
        "padding_without_lengths",
        "/mask",
        {**DIRECT, "mask": {"type": "padding"}},
        "mask[0]",
        "needs key_lengths, query_lengths or both",
    ),
    (
        "negative_length",
        "/mask",
        {**DIRECT, "mask": [{"type": "causal"}, {"type": "padding", "key_lengths": -1}]},
        "mask[1].key_lengths",
        "must be 0 or more, got -1",
    ),
    (
        "per_head_bias_width",
        "/multihead",
        {"x": X2, "num_heads": 1, "heads": [{"w_q": W2, "w_k": W2, "w_v": W2, "b_k": [1.0]}]},
        "heads[0].b_k",
        "heads[0].b_k has 1 entries but heads[0].w_k has width 2",
    ),
    (
        "multihead_d_v_vs_w_v",
        "/multihead",
        {**PROJ, "num_heads": 1, "d_v": 3},
        "d_v",
        "d_v is 3 but the given w_v makes heads of values of width 2",
    ),
    (
        "in_proj_d_k",
        "/multihead",
        {"x": X2, "num_heads": 1, "in_proj_weight": [[1.0, 0.0]] * 6, "d_k": 1},
        "d_k",
        "d_k is 1 but the in_proj weights make heads of width 2",
    ),
    (
        "in_proj_bias_with_heads",
        "/multihead",
        {
            "x": X2,
            "num_heads": 1,
            "heads": [{"w_q": W2, "w_k": W2, "w_v": W2}],
            "in_proj_bias": [0.0] * 6,
        },
        "in_proj_bias",
        "in_proj_bias goes with in_proj_weight",
    ),
    ("unknown_field", "/attention", {**DIRECT, "W_q": W2}, "W_q", "not a field of this endpoint"),
    (
        "unknown_include",
        "/attention",
        {**DIRECT, "include": ["wieghts"]},
        "include",
        'include names "wieghts"',
    ),
    (
        "wrong_type",
        "/multihead",
        {"x": X2, "num_heads": "two"},
        "num_heads",
        "num_heads: input should be a valid integer",
    ),
    (
        "residual_width",
        "/multihead",
        {**PROJ, "num_heads": 1, "w_o": [[1.0], [1.0]], "residual": True},
        "residual",
        "they must match",
    ),
    (
        "overflow",
        "/attention",
        {"q": [[1e200]], "k": [[1e200]], "v": [[1.0]]},
        None,
        "overflowed float64",
    ),  # type: ignore[list-item]
]


@pytest.mark.parametrize(
    ("path", "body", "field", "phrase"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_bad_input_is_422_naming_the_field(
    client: TestClient, path: str, body: dict[str, Any], field: str | None, phrase: str
) -> None:
    err = post(client, path, body, 422)
    assert phrase in err["message"], err["message"]
    assert err["errors"][0]["field"] == field
    assert len(err["message"]) < 400


@pytest.mark.parametrize(
    "raw",
    [b'{"q": [[NaN]], "k": [[1]], "v": [[1]]}', b'{"q": [[1e999]], "k": [[1]], "v": [[1]]}',
     b'{"q": [[Infinity]], "k": [[1]], "v": [[1]]}'],
    ids=["NaN", "1e999", "Infinity"],
)  # fmt: skip
def test_non_finite_literals_are_422(client: TestClient, raw: bytes) -> None:
    r = client.post("/attention", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not a finite number" in r.json()["message"]


def test_malformed_json_is_400(client: TestClient) -> None:
    r = client.post(
        "/attention", content=b'{"q": [[1,', headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["message"].startswith("the body is not valid JSON")


def test_a_huge_bad_input_gives_a_short_error(client: TestClient) -> None:
    q = [["x"] * 1000 for _ in range(1000)]
    r = client.post("/attention", json={"q": q, "k": q, "v": q})
    assert r.status_code == 422
    assert len(r.content) < 2000


def test_openapi_states_the_chain_of_one_head_in_order(client: TestClient) -> None:
    """x-chain: HEAD's steps in order, then the block's, each with its kind and the slot it
    reads and advances; q_normed twice (before RoPE, and after it), as the page needs to place
    an answer's forms and to pick a cell's arithmetic."""
    from service.core.chain import BLOCK, HEAD

    chain = client.get("/openapi.json").json()["x-chain"]
    assert chain == [
        {"name": s.name, "kind": s.kind, "reads": s.reads, "advances": s.advances}
        for s in HEAD + BLOCK
    ]
    names = [row["name"] for row in chain]
    row = {r["name"]: r for r in chain}
    assert names.index("q_clipped") < names.index("q_rotated") < names.index("q_tempered")
    first, last = (n for n, name in enumerate(names) if name == "q_normed")  # exactly two
    assert first < names.index("q_rotated") < last
    assert row["q_rotated"] == {
        "name": "q_rotated",
        "kind": "rotate",
        "reads": "q",
        "advances": "q",
    }
    assert row["k_rotated"]["kind"] == "rotate" and row["v_normed"]["kind"] == "norm"
    assert row["v_normed"]["advances"] == "v" and row["k_clipped"]["advances"] == "k"
    assert row["masked_scores"] == {
        "name": "masked_scores",
        "kind": "mask",
        "reads": "scores",
        "advances": "scores",
    }
    assert row["scores"] == {"name": "scores", "kind": "scores", "reads": "q", "advances": "scores"}
    assert row["output"] == {
        "name": "output",
        "kind": "output",
        "reads": "weights",
        "advances": "out",
    }
    assert row["gated"] == {"name": "gated", "kind": "gated", "reads": "block", "advances": "block"}
    assert names.index("output") < names.index("concat") < names.index("gated")


def test_real_answers_match_the_documented_response_schemas(client: TestClient) -> None:
    import json
    from pathlib import Path

    from jsonschema import Draft202012Validator

    spec = client.get("/openapi.json").json()
    golden = json.loads(
        (Path(__file__).resolve().parents[1] / "fixtures" / "golden.json").read_text()
    )["cases"]
    for case in [*golden, {"endpoint": "/mask", "request": ex.PADDED_BATCH}]:
        ref = spec["paths"][case["endpoint"]]["post"]["responses"]["200"]["content"][
            "application/json"
        ]["schema"]
        validator = Draft202012Validator({"components": spec["components"], **ref})
        body = client.post(case["endpoint"], json=case["request"]).json()
        errors = [
            f"{list(e.absolute_path)[:4]}: {e.message[:120]}" for e in validator.iter_errors(body)
        ]
        assert not errors, f"{case['endpoint']} {case['request'].get('tokens', '')}: {errors[:3]}"


def test_direct_keys_of_another_length_are_not_labelled_with_the_query_tokens(
    client: TestClient,
) -> None:
    q = [[1.0], [0.0]]
    k = v = [[0.0], [1.0], [5.0]]  # S = 3 keys, L = 2 queries: the key at index 2 wins
    body = post(client, "/attention", {"q": q, "k": k, "v": v, "tokens": ["a", "b"]})
    assert body["context_tokens"] is None
    assert body["summary"][0] == {**body["summary"][0], "token": "a", "top_key": None,
                                  "top_key_index": 2}  # fmt: skip


def test_generated_steps_say_the_draws_share_one_state(client: TestClient) -> None:
    steps = post(client, "/attention", ex.GENERATED_SENTENCE)["steps"]
    assert [s["formula"] for s in steps[:2]] == [
        "x = RandomState(42).rand(5, 4)",
        "w_q = RandomState(42).rand(4, 3), drawn after x from the same state",
    ]
