"""Fused projections under their modules' names (service.wire.fused) through the ASGI app: each
layout split as the module's own forward splits it (written here in torch, as Phi-3's and
GPT-NeoX's, GPT-2's, GPTBigCode's and CodeGen's forwards do), the unpack step's words, and
every refusal. The families' layers against transformers are in
tests/wire/test_config_layers.py (Phi-3, GPT-NeoX, GPT-2, GPTBigCode, CodeGen).
"""

from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from tests.api.test_api_variants import post

RNG = np.random.default_rng(41)
H, H_KV, D, D_MODEL, L = 4, 2, 3, 8, 5
X = RNG.normal(size=(L, D_MODEL))
ROWS = RNG.normal(size=((H + 2 * H_KV) * D, D_MODEL))  # out_in, as nn.Linear stores it
ROWS_B = RNG.normal(size=(H + 2 * H_KV) * D)
PER_HEAD = RNG.normal(size=(3 * H * D, D_MODEL))
PER_HEAD_B = RNG.normal(size=3 * H * D)
CONV1D = RNG.normal(size=(D_MODEL, 3 * H * D))  # GPT-2's c_attn: a Conv1D, stored [in][out]
CONV1D_B = RNG.normal(size=3 * H * D)
C_PROJ = RNG.normal(size=(H * D, D_MODEL))  # GPT-2's c_proj: Conv1D [h·d][d_model]
C_PROJ_B = RNG.normal(size=D_MODEL)
CG_H = 8  # CodeGen: 4 blocks (mp_num) of two heads
CODEGEN = RNG.normal(size=(3 * CG_H * D, D_MODEL))  # its qkv_proj: an nn.Linear, no bias


def _phi3_split(w: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """Phi3Attention's forward: qkv[..., :h·d] the queries, then h_kv·d the keys, the rest the
    values — on the fused projection's output, so the rows of weight and bias alike."""
    qkv_w, qkv_b = torch.from_numpy(w), torch.from_numpy(b)
    q_pos, k_pos = H * D, H * D + H_KV * D
    return {
        "q_proj.weight": qkv_w[:q_pos].numpy(),
        "k_proj.weight": qkv_w[q_pos:k_pos].numpy(),
        "v_proj.weight": qkv_w[k_pos:].numpy(),
        "q_proj.bias": qkv_b[:q_pos].numpy(),
        "k_proj.bias": qkv_b[q_pos:k_pos].numpy(),
        "v_proj.bias": qkv_b[k_pos:].numpy(),
    }


def _neox_split(w: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """GPTNeoXAttention's forward: the projection's output viewed (…, h, 3·d) and chunked in
    three on its last axis — so head i's rows 3d·i … are its query, then its key, its value."""
    w_heads = torch.from_numpy(w).view(H, 3 * D, D_MODEL).chunk(3, dim=1)  # 3 × (h, d, d_model)
    b_heads = torch.from_numpy(b).view(H, 3 * D).chunk(3, dim=1)  # 3 × (h, d)
    return {
        **{
            f"{n}_proj.weight": t.reshape(H * D, D_MODEL).numpy()
            for n, t in zip("qkv", w_heads, strict=True)
        },
        **{f"{n}_proj.bias": t.reshape(H * D).numpy() for n, t in zip("qkv", b_heads, strict=True)},
    }


def _gpt2_split(w: np.ndarray, b: np.ndarray, proj: np.ndarray) -> dict[str, np.ndarray]:
    """GPT2Attention's forward: c_attn(x) = x @ W + b (Conv1D), split(embed_dim, dim=2) into
    query, key, value, each viewed (…, h, d); c_proj(a) = a @ W_proj. So W_q is W's first
    embed_dim columns — q_proj.weight, out_in, their transpose — and o_proj.weight W_proj's."""
    parts = torch.split(torch.from_numpy(w), H * D, dim=1)
    biases = torch.split(torch.from_numpy(b), H * D, dim=0)
    return {
        **{f"{n}_proj.weight": t.T.numpy() for n, t in zip("qkv", parts, strict=True)},
        **{f"{n}_proj.bias": t.numpy() for n, t in zip("qkv", biases, strict=True)},
        "o_proj.weight": torch.from_numpy(proj).T.numpy(),
    }


def _codegen_split(w: np.ndarray) -> dict[str, np.ndarray]:
    """CodeGenAttention's forward: qkv reshaped (…, mp_num = 4, -1), torch.split(local_dim)
    into query, value, key — in that order —, each block's h/4 heads of d then merged
    (_split_heads): on the weight's rows, 4 blocks of [q | v | k], the heads block by block."""
    local = CG_H * D // 4
    blocks = torch.from_numpy(w).reshape(4, 3 * local, D_MODEL)
    query, value, key = torch.split(blocks, local, dim=1)  # 3 × (4, local, d_model)
    return {
        f"{n}_proj.weight": t.reshape(CG_H * D, D_MODEL).numpy()
        for n, t in zip("qkv", (query, key, value), strict=True)
    }


def test_columns_layout_and_c_proj_equal_gpt2s_conv1d_forward(client: TestClient) -> None:
    common = {"x": X, "num_heads": H}
    fused = post(client, "/multihead", {**common, "c_attn.weight": CONV1D,
                                        "c_attn.bias": CONV1D_B, "c_proj.weight": C_PROJ,
                                        "c_proj.bias": C_PROJ_B, "qkv_layout": "columns"})  # fmt: skip
    split = post(client, "/multihead", {**common, **_gpt2_split(CONV1D, CONV1D_B, C_PROJ),
                                        "o_proj.bias": C_PROJ_B})  # fmt: skip
    assert np.array_equal(np.asarray(fused["output"]), np.asarray(split["output"]))
    assert fused["steps"][0] == {
        "name": "unpack",
        "formula": "c_attn.weight, columns layout: stored [in][out] (Conv1D): columns 0…11 are "
        "W_q, 12…23 W_k and 24…35 W_v (4 heads × 3 each, head i's the i-th 3); c_proj.weight "
        "read as o_proj.weight, transposed (a Conv1D: [in][out])",
        "shape": [D_MODEL, 36],
    }


def test_c_attn_in_the_rows_layout_takes_c_proj_as_gpt_bigcodes_linear(
    client: TestClient,
) -> None:
    """GPTBigCode's c_attn and c_proj are nn.Linear (out_in): c_proj read as it is."""
    common = {"x": X, "num_heads": H, "num_kv_heads": H_KV}
    proj = C_PROJ.T  # [d_model][h·d], as nn.Linear stores it
    fused = post(client, "/multihead", {**common, "c_attn.weight": ROWS, "c_attn.bias": ROWS_B,
                                        "c_proj.weight": proj, "qkv_layout": "rows"})  # fmt: skip
    split = post(client, "/multihead", {**common, **_phi3_split(ROWS, ROWS_B),
                                        "o_proj.weight": proj})  # fmt: skip
    assert np.array_equal(np.asarray(fused["output"]), np.asarray(split["output"]))
    assert fused["steps"][0]["formula"].endswith(
        "; c_proj.weight read as o_proj.weight, as it is ([out][in])"
    )


def test_codegen_layout_equals_the_projections_codegens_forward_splits(
    client: TestClient,
) -> None:
    common = {"x": X, "num_heads": CG_H}
    fused = post(client, "/multihead", {**common, "qkv_proj.weight": CODEGEN,
                                        "qkv_layout": "codegen"})  # fmt: skip
    split = post(client, "/multihead", {**common, **_codegen_split(CODEGEN)})
    assert np.array_equal(np.asarray(fused["output"]), np.asarray(split["output"]))
    assert fused["steps"][0]["formula"] == (
        "qkv_proj.weight, codegen layout: 4 blocks of 18 rows (CodeGen's mp_num), block b "
        "holding heads 2·b … 2·b + 1: their W_q rows 18·b + 0…5, their W_v 18·b + 6…11, their "
        "W_k 18·b + 12…17, 3 rows a head (b = 0…3)"
    )


def test_rows_layout_equals_the_projections_phi3s_forward_splits(client: TestClient) -> None:
    common = {"x": X, "num_heads": H, "num_kv_heads": H_KV}
    fused = post(client, "/multihead", {**common, "qkv_proj.weight": ROWS,
                                        "qkv_proj.bias": ROWS_B, "qkv_layout": "rows"})  # fmt: skip
    split = post(client, "/multihead", {**common, **_phi3_split(ROWS, ROWS_B)})
    assert np.array_equal(np.asarray(fused["output"]), np.asarray(split["output"]))
    step = fused["steps"][0]
    assert step == {
        "name": "unpack",
        "formula": "qkv_proj.weight, rows layout: rows 0…11 are W_q (4 heads × 3), 12…17 W_k "
        "and 18…23 W_v (2 key/value heads × 3)",
        "shape": [24, D_MODEL],
    }


def test_per_head_layout_equals_the_projections_gpt_neoxs_forward_splits(
    client: TestClient,
) -> None:
    common = {"x": X, "num_heads": H}
    fused = post(client, "/multihead", {**common, "query_key_value.weight": PER_HEAD,
                                        "query_key_value.bias": PER_HEAD_B,
                                        "qkv_layout": "per_head"})  # fmt: skip
    split = post(client, "/multihead", {**common, **_neox_split(PER_HEAD, PER_HEAD_B)})
    assert np.array_equal(np.asarray(fused["output"]), np.asarray(split["output"]))
    assert fused["steps"][0]["formula"] == (
        "query_key_value.weight, per_head layout: each head's 9 rows hold its query, key and "
        "value in turn: head i's W_q is rows 9·i + 0…2, its W_k 9·i + 3…5, its W_v 9·i + 6…8 "
        "(i = 0…3)"
    )


def _falcon_grouped_split(w: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """FalconAttention._split_heads with new_decoder_architecture: the output viewed
    (…, h_kv, h/h_kv + 2, d), the group's first h/h_kv slots its query heads, then [-2] its key
    and [-1] its value."""
    g = H // H_KV
    w_groups = torch.from_numpy(w).view(H_KV, g + 2, D, D_MODEL)
    b_groups = torch.from_numpy(b).view(H_KV, g + 2, D)
    parts = {"q": slice(0, g), "k": slice(g, g + 1), "v": slice(g + 1, g + 2)}
    return {
        **{
            f"{n}_proj.weight": w_groups[:, at].reshape(-1, D_MODEL).numpy()
            for n, at in parts.items()
        },
        **{f"{n}_proj.bias": b_groups[:, at].reshape(-1).numpy() for n, at in parts.items()},
    }


def test_grouped_layout_equals_the_projections_falcons_split_heads(client: TestClient) -> None:
    common = {"x": X, "num_heads": H, "num_kv_heads": H_KV}
    fused = post(client, "/multihead", {**common, "query_key_value.weight": ROWS,
                                        "query_key_value.bias": ROWS_B,
                                        "qkv_layout": "grouped"})  # fmt: skip
    split = post(client, "/multihead", {**common, **_falcon_grouped_split(ROWS, ROWS_B)})
    assert np.array_equal(np.asarray(fused["output"]), np.asarray(split["output"]))
    assert fused["steps"][0]["formula"] == (
        "query_key_value.weight, grouped layout: each key/value head's 12 rows hold its 2 query "
        "heads' rows, then its key and value: group i's W_q is rows 12·i + 0…5 (query heads "
        "2·i …), its W_k 12·i + 6…8, its W_v 12·i + 9…11 (i = 0…1)"
    )


def test_wqkv_is_read_in_the_rows_layout_as_mpts_and_dbrxs_forwards_split_it(
    client: TestClient,
) -> None:
    """DbrxAttention splits Wqkv's output [h·d, h_kv·d, h_kv·d] (MptAttention chunks it in
    three): the rows layout, under the module's name Wqkv.weight."""
    common = {"x": X, "num_heads": H, "num_kv_heads": H_KV}
    fused = post(client, "/multihead", {**common, "Wqkv.weight": ROWS, "Wqkv.bias": ROWS_B,
                                        "qkv_layout": "rows"})  # fmt: skip
    split = post(client, "/multihead", {**common, **_phi3_split(ROWS, ROWS_B)})
    assert np.array_equal(np.asarray(fused["output"]), np.asarray(split["output"]))
    assert fused["steps"][0]["formula"].startswith("Wqkv.weight, rows layout: rows 0…11 are W_q")


def test_no_unpack_step_without_a_fused_projection(client: TestClient) -> None:
    split = post(client, "/multihead", {"x": X, "num_heads": H, **_phi3_split(ROWS, ROWS_B)})
    assert "unpack" not in [s["name"] for s in split["steps"]]


REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("no layout", {"qkv_proj.weight": ROWS}, "qkv_layout",
     'give config (the model\'s config.json) or qkv_layout, one of "rows"'),
    ("layout without a fused weight", {"qkv_layout": "rows", **_phi3_split(ROWS, ROWS_B)},
     "qkv_layout", "the request has none: leave it out"),
    ("fused and split", {"qkv_proj.weight": ROWS, "qkv_layout": "rows",
                         "q_proj.weight": ROWS[:12]},
     "q_proj.weight", "give it or q_proj.weight, not both"),
    ("two fused", {"qkv_proj.weight": ROWS, "query_key_value.weight": ROWS,
                   "qkv_layout": "rows"},
     "query_key_value.weight", "give one fused projection"),
    ("rows not in heads", {"qkv_proj.weight": ROWS[:23], "qkv_layout": "rows"},
     "qkv_proj.weight", "23 rows, which (num_heads + 2·num_kv_heads) = 8 heads do not divide"),
    ("d_k disagrees", {"qkv_proj.weight": ROWS, "qkv_layout": "rows", "d_k": 4},
     "d_k", "d_k is 4 but qkv_proj.weight's 24 rows make"),
    ("per head with grouped heads", {"query_key_value.weight": ROWS, "qkv_layout": "per_head"},
     "num_kv_heads", "every query head its own key and value"),
    ("bias of another length", {"qkv_proj.weight": ROWS, "qkv_layout": "rows",
                                "qkv_proj.bias": ROWS_B[:-1]},
     "qkv_proj.bias", "qkv_proj.bias has 23 entries; qkv_proj.weight has 24 rows"),
    ("bias alone", {"qkv_proj.bias": ROWS_B, **_phi3_split(ROWS, ROWS_B)},
     "qkv_proj.bias", "qkv_proj.bias goes with qkv_proj.weight"),
    ("a layout the service lacks", {"qkv_proj.weight": ROWS, "qkv_layout": "blocks"},
     "qkv_layout", ""),
    ("grouped heads unequal", {"query_key_value.weight": ROWS[:21], "qkv_layout": "grouped",
                               "num_kv_heads": 3},
     "num_kv_heads", "num_heads 4 is not a multiple of num_kv_heads 3"),
    # GPT-2's, GPTBigCode's and CodeGen's
    ("c_proj without c_attn", {"c_proj.weight": C_PROJ, **_phi3_split(ROWS, ROWS_B)},
     "c_proj.weight", "c_proj.weight goes with c_attn.weight, whose layout says how it is"),
    ("c_proj beside qkv_proj", {"qkv_proj.weight": ROWS, "qkv_layout": "rows",
                                "c_proj.weight": C_PROJ},
     "c_proj.weight", "goes with c_attn.weight"),
    ("c_proj and o_proj", {"c_attn.weight": ROWS, "qkv_layout": "rows", "c_proj.weight": C_PROJ,
                           "o_proj.weight": C_PROJ.T},
     "o_proj.weight", "c_proj.weight is the output projection: give it or o_proj.weight"),
    ("c_proj's bias alone", {"c_attn.weight": ROWS, "qkv_layout": "rows",
                             "c_proj.bias": C_PROJ_B},
     "c_proj.bias", "c_proj.bias goes with c_proj.weight"),
    ("c_attn without a layout", {"c_attn.weight": CONV1D}, "qkv_layout",
     '"columns" (GPT-2\'s c_attn (a Conv1D, stored [in][out]))'),
    ("columns with grouped heads", {"c_attn.weight": CONV1D, "qkv_layout": "columns"},
     "num_kv_heads", "qkv_layout columns: this layout gives every query head its own key"),
    ("columns not in heads", {"c_attn.weight": CONV1D[:, :-1], "qkv_layout": "columns",
                              "num_kv_heads": H},
     "c_attn.weight", "c_attn.weight has 35 columns, which (num_heads + 2·num_kv_heads) = 12"),
    ("codegen's heads not in 4 blocks", {"qkv_proj.weight": CODEGEN[:36], "num_kv_heads": 6,
                                         "num_heads": 6, "qkv_layout": "codegen"},
     "num_heads", "num_heads 6 is not a multiple of 4 (transformers fails on it)"),
    ("codegen with grouped heads", {"qkv_proj.weight": CODEGEN, "num_heads": CG_H,
                                    "qkv_layout": "codegen"},
     "num_kv_heads", "its own key and value"),
]  # fmt: skip


@pytest.mark.parametrize(("given", "field", "says"), [r[1:] for r in REFUSED],
                         ids=[r[0] for r in REFUSED])  # fmt: skip
def test_fused_projection_refusals_name_the_field(
    client: TestClient, given: dict[str, Any], field: str, says: str
) -> None:
    body = {"x": X, "num_heads": H, "num_kv_heads": H_KV, **given}
    answer = post(client, "/multihead", body, status=422)
    assert answer["errors"][0]["field"] == field, answer
    assert says in answer["errors"][0]["message"]
