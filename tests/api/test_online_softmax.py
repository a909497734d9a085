"""``online_softmax``: FlashAttention's softmax a block of keys at a time. Each block's state is
checked against its closed form, computed here from the response's own final scores: after
keys 0…e−1, ``m`` is the row's max over them, ``l = Σ_{j<e} exp(s_j − m)`` and
``o = Σ_{j<e} exp(s_j − m) v_j / l`` (the recurrence the service runs never appears here); and
the last ``o`` against torch's ``scaled_dot_product_attention``.
"""

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.core.softmax import online_softmax
from tests.api.test_api_variants import post

RNG = np.random.default_rng(41)
Q, K, V = RNG.normal(size=(5, 4)), RNG.normal(size=(7, 4)), RNG.normal(size=(7, 3))


def closed_form(scores: np.ndarray, v: np.ndarray, end: int) -> tuple[Any, Any, Any]:
    """(m, l, o) of every row after keys 0…end−1; −∞ scores are masked keys."""
    s = scores[..., :end]
    m = s.max(axis=-1)  # (L,)
    with np.errstate(invalid="ignore"):
        e = np.where(np.isneginf(s), 0.0, np.exp(s - np.where(np.isneginf(m), 0, m)[..., None]))
    l = e.sum(axis=-1)  # noqa: E741
    o = (e @ v[:end]) / np.where(l > 0, l, 1.0)[..., None]
    return m, l, o


def nulls(a: Any) -> np.ndarray:
    return np.array(a, dtype=object).astype(float)  # null (−∞ max) -> nan


@pytest.mark.parametrize("block", [1, 3, 7, 10], ids=["one_key", "three", "all_at_once", "wider"])
def test_each_block_is_the_softmax_over_the_keys_so_far(client: TestClient, block: int) -> None:
    body = post(client, "/attention", {"q": Q, "k": K, "v": V, "mask": {"type": "causal"},
                                       "online_softmax": {"block_size": block}})  # fmt: skip
    scores = np.array(body["masked_scores"], dtype=object)
    scores = np.where(scores == None, -np.inf, scores).astype(float)  # noqa: E711
    entries = body["online_softmax"]
    assert [e["keys"] for e in entries] == [[a, min(a + block, 7)] for a in range(0, 7, block)]
    for e in entries:
        m, l, o = closed_form(scores, V, e["keys"][1])  # noqa: E741
        np.testing.assert_allclose(nulls(e["m"]), np.where(np.isneginf(m), np.nan, m), atol=0)
        np.testing.assert_allclose(e["l"], l, rtol=1e-13, atol=0)
        np.testing.assert_allclose(e["o"], o, rtol=0, atol=1e-13)
    np.testing.assert_allclose(entries[-1]["o"], body["output"], rtol=0, atol=1e-12)
    names = [s["name"] for s in body["steps"]]
    at = names.index("output") + 1
    assert names[at : at + len(entries)] == [
        f"online_softmax keys {a}…{min(a + block, 7) - 1}" for a in range(0, 7, block)
    ]


def test_the_last_block_is_torchs_sdpa_per_head_with_sinks_and_a_batch(
    client: TestClient,
) -> None:
    """/multihead: each head's trace inside heads[i]; gpt-oss's sinks start every row at
    m = sink, l = 1."""
    torch = pytest.importorskip("torch")
    r = np.random.default_rng(42)
    q, k, v = r.normal(size=(2, 2, 4, 3)), r.normal(size=(2, 2, 6, 3)), r.normal(size=(2, 2, 6, 2))
    sinks = [0.5, -1.0]
    body = post(client, "/multihead", {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(),
                                       "sinks": sinks, "online_softmax": {"block_size": 4}})  # fmt: skip
    t = {n: torch.tensor(a) for n, a in (("q", q), ("k", k), ("v", v))}
    s = t["q"] @ t["k"].transpose(-1, -2) / 3**0.5  # (B, h, L, S)
    sink = torch.tensor(sinks, dtype=torch.float64).view(1, 2, 1, 1).expand(2, 2, 4, 1)
    w = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    for i, head in enumerate(body["heads"]):
        blocks = head["online_softmax"]
        assert [b["keys"] for b in blocks] == [[0, 4], [4, 6]]
        np.testing.assert_allclose(blocks[-1]["o"], (w @ t["v"])[:, i].numpy(), rtol=0, atol=1e-12)
        assert np.shape(blocks[0]["m"]) == (2, 4)  # [B][L]


def test_a_row_with_no_allowed_key_yet_has_no_max(client: TestClient) -> None:
    """A window that starts after the first block: the row's max is −∞ (null), ℓ 0, o 0."""
    body = post(client, "/attention", {"q": Q, "k": K, "v": V, "online_softmax": {"block_size": 2},
                                       "mask": {"type": "window", "left": 0, "right": 0}})  # fmt: skip
    first = body["online_softmax"][0]  # keys 0, 1: rows 2… see none of them
    assert first["m"][4] is None and first["l"][4] == 0 and first["o"][4] == [0.0, 0.0, 0.0]


def test_online_softmax_in_the_core_equals_the_softmax_for_any_block_size() -> None:
    r = np.random.default_rng(43)
    s, v = r.normal(size=(3, 5, 9)) * 4, r.normal(size=(3, 9, 2))
    s[1, 2] = -np.inf  # a fully masked row
    e = np.exp(s - np.where(np.isneginf(s.max(-1)), 0, s.max(-1))[..., None])
    reference = (e @ v) / np.where(e.sum(-1) > 0, e.sum(-1), 1)[..., None]
    for block in range(1, 11):
        np.testing.assert_allclose(online_softmax(s, v, block).o[..., -1, :, :], reference,
                                   rtol=0, atol=1e-12)  # fmt: skip


def test_a_decode_step_under_grouped_query_attention_blocks_over_the_cache_per_query_head(
    client: TestClient,
) -> None:
    """The cache is kept per key/value head (B, h_kv, P + L, d_v): the online softmax reads it
    repeated to the query heads it serves, as the output did (a 500 before). Each head's last o
    against its output, computed here in NumPy from the given cache and weights."""
    r = np.random.default_rng(43)
    d_model, h, h_kv, d = 8, 4, 2, 2
    x = r.normal(size=(1, 2, d_model))  # (B, L, d_model): two new tokens after a cache of 3
    w = {n: r.normal(size=(d_model, width)) for n, width in
         (("w_q", h * d), ("w_k", h_kv * d), ("w_v", h_kv * d), ("w_o", d_model))}  # fmt: skip
    w["w_o"] = r.normal(size=(h * d, d_model))
    past = {"k": r.normal(size=(1, h_kv, 3, d)), "v": r.normal(size=(1, h_kv, 3, d))}
    body = post(client, "/multihead", {
        "x": x, **w, "num_heads": h, "num_kv_heads": h_kv, "weight_layout": "in_out",
        "past": {"k": past["k"].tolist(), "v": past["v"].tolist()},
        "online_softmax": {"block_size": 2},
    })  # fmt: skip
    q = (x @ w["w_q"]).reshape(1, 2, h, d).transpose(0, 2, 1, 3)  # (B, h, L, d)
    k_new = (x @ w["w_k"]).reshape(1, 2, h_kv, d).transpose(0, 2, 1, 3)
    v_new = (x @ w["w_v"]).reshape(1, 2, h_kv, d).transpose(0, 2, 1, 3)
    k = np.repeat(np.concatenate([past["k"], k_new], axis=2), h // h_kv, axis=1)  # (B, h, 5, d)
    v = np.repeat(np.concatenate([past["v"], v_new], axis=2), h // h_kv, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)  # (B, h, L, 5)
    s[..., 0, 4] = -np.inf  # lower-right causal: the first new token does not see the second
    p = np.exp(s - s.max(-1, keepdims=True))
    out = (p / p.sum(-1, keepdims=True)) @ v  # (B, h, L, d)
    for i, head in enumerate(body["heads"]):
        blocks = head["online_softmax"]
        assert [b["keys"] for b in blocks] == [[0, 2], [2, 4], [4, 5]]
        np.testing.assert_allclose(blocks[-1]["o"], out[:, i], rtol=0, atol=1e-12)
