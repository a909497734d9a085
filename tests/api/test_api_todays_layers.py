"""Today's layers (issue 30) through the HTTP layer (ASGI app): each new field's forms against
each other and against a formula written out in the test, its steps in order, and every rule's
422. Numbers against the transformers layers (Gemma 4, Qwen3-Next, Llama 4) are in
tests/api/test_golden.py (harness/hf_today.py) and tests/core/test_todays_layers.py.
"""

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.api.test_api_variants import post

RNG = np.random.default_rng(30)
H, D, D_MODEL, L = 2, 4, 6, 5
X = RNG.normal(size=(L, D_MODEL))
W_Q, W_K, W_V, W_G = (RNG.normal(size=(H * D, D_MODEL)) for _ in range(4))  # out_in
B_Q, B_G = RNG.normal(size=H * D), RNG.normal(size=H * D)
W_O = RNG.normal(size=(D_MODEL, H * D))


def layer(**rest: Any) -> dict[str, Any]:
    return {"x": X, "num_heads": H, "q_proj.weight": W_Q, "k_proj.weight": W_K,
            "v_proj.weight": W_V, "o_proj.weight": W_O, **rest}  # fmt: skip


def interleaved_q_proj() -> np.ndarray:
    """Qwen3-Next's q_proj.weight: for each head, its D query rows then its D gate rows."""
    return np.concatenate(
        [np.concatenate([W_Q[i * D : (i + 1) * D], W_G[i * D : (i + 1) * D]]) for i in range(H)]
    )


def test_gate_true_reads_the_gate_rows_inside_q_proj_as_qwen3_next_stores_them(
    client: TestClient,
) -> None:
    bias = np.concatenate([np.concatenate([B_Q[i * D : (i + 1) * D], B_G[i * D : (i + 1) * D]])
                           for i in range(H)])  # fmt: skip
    packed = post(client, "/multihead", layer(**{"q_proj.weight": interleaved_q_proj(),
                                                 "q_proj.bias": bias}, gate=True))  # fmt: skip
    explicit = post(client, "/multihead", layer(**{"q_proj.bias": B_Q},
                                                gate={"w": W_G.tolist(), "b": B_G.tolist()}))  # fmt: skip
    np.testing.assert_array_equal(packed["output"], explicit["output"])
    gate = 1.0 / (1.0 + np.exp(-(X @ W_G.T + B_G)))  # (L, h·d)
    np.testing.assert_allclose(packed["gate"], gate, rtol=0, atol=1e-14)
    np.testing.assert_allclose(
        packed["gated"], np.array(packed["concat"]) * gate, rtol=0, atol=1e-14
    )
    np.testing.assert_allclose(packed["projected"], np.array(packed["gated"]) @ W_O.T, rtol=0,
                               atol=1e-12)  # fmt: skip
    names = [s["name"] for s in packed["steps"]]
    assert (
        names.index("concat")
        < names.index("gate")
        < names.index("gated")
        < names.index("projected")
    )
    assert "(Concat · G) W_o" in next(
        s["formula"] for s in packed["steps"] if s["name"] == "projected"
    )


def test_k_eq_v_takes_the_values_from_the_key_projection_before_norms_and_rope(
    client: TestClient,
) -> None:
    """Gemma 4: V is K's projection, not the normed or rotated keys; v_norm then applies."""
    given = {k: v for k, v in layer().items() if k != "v_proj.weight"}
    body = post(client, "/multihead", {**given, "k_eq_v": True, "qk_norm": True, "rope": True,
                                       "v_norm": {"eps": 1e-6}})  # fmt: skip
    same = post(client, "/multihead", layer(**{"v_proj.weight": W_K}, qk_norm=True, rope=True,
                                             v_norm={"eps": 1e-6}))  # fmt: skip
    np.testing.assert_array_equal(body["output"], same["output"])
    for head in body["heads"]:
        np.testing.assert_array_equal(head["v"], head["k"])
        v = np.array(head["v"])
        normed = v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(head["v_normed"], normed, rtol=0, atol=1e-14)
        np.testing.assert_allclose(head["output"], np.array(head["weights"]) @ normed, rtol=0,
                                   atol=1e-12)  # fmt: skip
    v_step = next(s["formula"] for s in body["steps"] if s["name"] == "v")
    assert "k_eq_v" in v_step and "W_k" in v_step


def test_after_rope_puts_the_norm_after_the_rotation_in_the_steps(client: TestClient) -> None:
    body = post(client, "/multihead", layer(
        qk_norm={"type": "rms", "eps": 1e-5, "after_rope": True},
        rope={"base": 500000, "style": "interleaved"}, mask={"type": "chunked", "size": 2},
    ))  # fmt: skip
    steps = {s["name"]: s["formula"] for s in body["steps"]}
    names = list(steps)
    assert names.index("q_rotated") < names.index("q_normed") < names.index("scores")
    assert steps["q_normed"].startswith("Q_n = Q_r /") and steps["scores"].startswith("Q_n K_nᵀ")
    for head in body["heads"]:
        r = np.array(head["q_rotated"])
        np.testing.assert_allclose(
            head["q_normed"],
            r / np.sqrt((r * r).mean(-1, keepdims=True) + 1e-5),
            rtol=0,
            atol=1e-14,
        )
    allowed = np.array(body["mask"])
    i, j = np.indices((L, L))
    np.testing.assert_array_equal(allowed, (j <= i) & (j // 2 == i // 2))


def test_temperature_scales_each_query_by_its_position(client: TestClient) -> None:
    positions = [0, 1, 2, 3, 7]
    body = post(client, "/attention", {"q": X[:, :4], "k": X[:, 2:], "v": X, "positions": positions,
                                       "temperature": {"floor_scale": 2, "attn_scale": 0.5}})  # fmt: skip
    factor = np.log(np.floor((np.array(positions) + 1) / 2) + 1) * 0.5 + 1  # [1, 1.35, 1.35, …]
    np.testing.assert_allclose(body["q_tempered"], X[:, :4] * factor[:, None], rtol=0, atol=1e-14)
    steps = {s["name"]: s["formula"] for s in body["steps"]}
    assert steps["scores"].startswith("Q_t Kᵀ") and "1.34657" in steps["q_tempered"]


def test_include_names_the_new_outputs(client: TestClient) -> None:
    body = post(client, "/multihead", layer(gate={"w": W_G.tolist()}, include=["gate"]))
    assert "gate" in body and "gated" not in body and "concat" not in body


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (layer(k_eq_v=True), "v_proj.weight", "k_eq_v says the values are the keys"),
        ({"x": X, "num_heads": H, "seed": 1, "k_eq_v": True}, "k_eq_v", "cannot be drawn"),
        (layer(**{"q_proj.weight": W_Q[:5]}, gate=True), "q_proj.weight", "2·num_heads = 4"),
        (layer(gate={"w": W_G[:, :4].tolist()}), "gate.w", "[h·d_v][d_model] = 8×6"),
        (layer(gate={"w": W_G.tolist(), "b": [0.0]}), "gate.b", "the concat has 8"),
        ({"x": X, "num_heads": H, "seed": 1, "gate": True}, "gate", "gate rows in q_proj.weight"),
        ({"q": [X[:, :3].tolist()], "k": [X[:, :3].tolist()], "v": [X[:, :3].tolist()],
          "gate": {"w": W_G.tolist()}}, "gate", "computed from x"),
        (layer(mask={"type": "chunked", "size": 0}), "mask[0].size", "greater than or equal to 1"),
        (layer(temperature={"floor_scale": 0}), "temperature.floor_scale", "greater than 0"),
        (layer(v_norm={"type": "layer"}), "v_norm.type", "rms"),
    ],
    ids=["k_eq_v_with_v_proj", "k_eq_v_drawn", "gate_rows_odd", "gate_w_shape", "gate_b_size",
         "gate_true_without_state_dict", "gate_direct_heads", "chunk_size_0",
         "temperature_floor_0", "v_norm_layer"],
)  # fmt: skip
def test_each_rule_of_the_new_fields_is_a_422_naming_its_field(
    client: TestClient, body: dict[str, Any], field: str, words: str
) -> None:
    error = post(client, "/multihead", body, status=422)["errors"][0]
    assert error["field"] == field, error
    assert words in error["message"], error["message"]


# ------------------------------------------------------------- multi-head latent attention
R_Q, R_KV, NOPE, ROPE, D_V = 6, 4, 2, 2, 3


def mla_layer(**rest: Any) -> dict[str, Any]:
    """A DeepSeek-shaped layer: the numbers only need the right sizes here (the values are
    checked against DeepseekV3Attention in tests/api/test_golden.py)."""
    r = np.random.default_rng(31)
    return {
        "x": X, "num_heads": H, "q_a_proj.weight": r.normal(size=(R_Q, D_MODEL)),
        "q_a_layernorm.weight": np.ones(R_Q), "q_b_proj.weight": r.normal(size=(H * (NOPE + ROPE), R_Q)),
        "kv_a_proj_with_mqa.weight": r.normal(size=(R_KV + ROPE, D_MODEL)),
        "kv_a_layernorm.weight": np.ones(R_KV), "kv_b_proj.weight": r.normal(size=(H * (NOPE + D_V), R_KV)),
        "mla": {"q_lora_rank": R_Q, "kv_lora_rank": R_KV, "qk_nope_head_dim": NOPE,
                "qk_rope_head_dim": ROPE, "v_head_dim": D_V},
        "rope": {"base": 10000, "style": "interleaved"}, **rest,
    }  # fmt: skip


def test_mla_returns_its_latents_and_a_cache_of_latent_plus_rope_numbers(
    client: TestClient,
) -> None:
    body = post(client, "/multihead", mla_layer())
    assert body["mla_cache_numbers"] == R_KV + ROPE
    assert np.shape(body["c_q"]) == (L, R_Q) and np.shape(body["c_kv"]) == (L, R_KV)
    assert np.shape(body["k_rope"]) == (L, ROPE)
    for head in body["heads"]:  # Q = [q_nope | q_rope], K = [k_nope | the shared k_rope]
        np.testing.assert_array_equal(np.array(head["q_rotated"])[:, :NOPE], head["q_nope"])
        np.testing.assert_array_equal(np.array(head["q_rotated"])[:, NOPE:], head["q_rope"])
        np.testing.assert_array_equal(np.array(head["k_rotated"])[:, NOPE:], body["k_rope"])
    assert body["d_k"] == NOPE + ROPE and body["d_v"] == D_V
    assert body["scale"] == pytest.approx((NOPE + ROPE) ** -0.5, abs=1e-15)
    c_kv = next(s["formula"] for s in body["steps"] if s["name"] == "c_kv")
    assert (
        f"{R_KV + ROPE} numbers a token, against h·(d_k + d_v) = {H * (NOPE + ROPE + D_V)}" in c_kv
    )


def test_mla_without_q_lora_rank_reads_q_proj(client: TestClient) -> None:
    given = {k: v for k, v in mla_layer().items() if not k.startswith(("q_a_", "q_b_"))}
    w_q = np.random.default_rng(32).normal(size=(H * (NOPE + ROPE), D_MODEL))
    body = post(client, "/multihead", {**given, "q_proj.weight": w_q,
                                       "mla": {**given["mla"], "q_lora_rank": None}})  # fmt: skip
    assert "c_q" not in body
    q = (X @ w_q.T).reshape(L, H, NOPE + ROPE).transpose(1, 0, 2)  # (h, L, nope + rope)
    np.testing.assert_allclose(body["heads"][1]["q_nope"], q[1, :, :NOPE], rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (mla_layer(rope=False), "rope", "mla needs rope"),
        (mla_layer(**{"kv_b_proj.weight": np.ones((3, R_KV))}), "kv_b_proj.weight", "must be 10×4"),
        (mla_layer(**{"k_proj.weight": W_K}), "k_proj.weight", "does not apply with mla"),
        (mla_layer(qk_norm=True), "qk_norm", "no MLA layer has it"),
        (mla_layer(**{"q_proj.weight": W_Q}), "q_proj.weight", "not q_proj.weight"),
        (mla_layer(rope={"base": 10000, "rotary_dim": 4}), "rope.rotary_dim", "qk_rope_head_dim = 2"),
        ({k: v for k, v in mla_layer().items() if k != "kv_a_layernorm.weight"},
         "kv_a_layernorm.weight", "is missing"),
        (mla_layer(residual=True), "residual", "does not apply with mla yet"),
        (mla_layer(layer_norm={"eps": 1e-5}, grad_output="sum"), "layer_norm", "add x, or"),
    ],
    ids=["no_rope", "kv_b_proj_shape", "another_form", "qk_norm", "q_proj_with_q_lora",
         "rotary_dim", "missing_latent_norm", "residual", "layer_norm_backward"],
)  # fmt: skip
def test_each_rule_of_mla_is_a_422_naming_its_field(
    client: TestClient, body: dict[str, Any], field: str, words: str
) -> None:
    error = post(client, "/multihead", body, status=422)["errors"][0]
    assert error["field"] == field, error
    assert words in error["message"], error["message"]


# --------------------------------------------------------------- a Hugging Face config as it is
MISTRAL = {"model_type": "mistral", "hidden_size": D_MODEL, "num_attention_heads": H,
           "num_key_value_heads": 1, "head_dim": D, "num_hidden_layers": 2, "rope_theta": 1e6,
           "sliding_window": 3}  # fmt: skip


def mistral_layer(**rest: Any) -> dict[str, Any]:
    return {"x": X, "q_proj.weight": W_Q, "k_proj.weight": W_K[:D], "v_proj.weight": W_V[:D],
            "o_proj.weight": W_O, "config": MISTRAL, **rest}  # fmt: skip


def test_a_config_gives_the_fields_it_implies_and_says_where_each_came_from(
    client: TestClient,
) -> None:
    """Mistral's sliding window of 3 is the window mask left = 2 with the causal one."""
    body = post(client, "/multihead", mistral_layer())
    spelled = post(client, "/multihead", {**{k: v for k, v in mistral_layer().items() if k != "config"},
                                          "num_heads": H, "num_kv_heads": 1, "rope": {"base": 1e6},
                                          "mask": [{"type": "causal"},
                                                   {"type": "window", "left": 2, "right": 0}]})  # fmt: skip
    np.testing.assert_array_equal(body["output"], spelled["output"])
    taken = body["conventions"]["config"]
    assert taken["num_heads"] == "num_attention_heads" and taken["rope.base"] == "rope_theta"
    assert (
        "sliding_window" in taken["mask"]
        if "mask" in taken
        else any(v == "sliding_window" for v in taken.values())
    )


def test_a_field_in_the_request_wins_over_the_config_and_masks_combine(client: TestClient) -> None:
    body = post(client, "/multihead", mistral_layer(rope={"base": 10000.0},
                                                    mask={"type": "window", "left": 0, "right": 0}))  # fmt: skip
    assert body["conventions"]["config"]["rope"] == "request"
    assert not any(k.startswith("rope.") for k in body["conventions"]["config"])
    np.testing.assert_array_equal(body["mask"], np.eye(L, dtype=bool))  # window 0 within causal


@pytest.mark.parametrize(
    ("rest", "field", "words"),
    [({"layer": 5}, "layer", "num_hidden_layers"),
     ({"config": {**MISTRAL, "rope_scaling": {"rope_type": "ntk-by-parts", "factor": 2}}},
      "config", "ntk-by-parts")],
    ids=["layer_out_of_range", "unknown_rope_type"],
)  # fmt: skip
def test_a_config_the_service_cannot_take_is_a_422(
    client: TestClient, rest: dict[str, Any], field: str, words: str
) -> None:
    error = post(client, "/multihead", mistral_layer(**rest), status=422)["errors"][0]
    assert error["field"].startswith(field) and words in error["message"], error


def test_a_config_value_of_a_type_its_key_never_takes_is_a_422_not_a_500(
    client: TestClient,
) -> None:
    junk = {**MISTRAL, "model_type": "gemma3", "rope_parameters": {"sliding_attention": 5}}
    error = post(client, "/multihead", mistral_layer(config=junk), status=422)["errors"][0]
    assert error["field"] == "config.rope_parameters.sliding_attention", error
    assert "Error" not in error["message"], error  # the key and what it takes, not Python's
