"""Compare works on gradients, through the API (API.md, "The backward pass, every step"):
``expected`` takes the grad_* arrays on /attention and /multihead, the comparison lists them
after the forward's in the order of the backward's steps, ``first_mismatch`` names the first
wrong gradient, and its diagnosis names the backward's mistake (or pair) that reproduces a
learner's numbers — computed here by hand in torch with the learner's bugs
(tests/core/test_backward_mistakes.py's ``by_hand``), never by the service."""

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.core.test_backward_mistakes import Bugs, Head, by_hand

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(4401)
B, L, D = 2, 4, 4


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> Any:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()


def rand(*shape: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    return RNG.normal(size=shape).round(3)


def attention(rope: bool = True) -> tuple[dict[str, Any], Head]:
    """/attention with q, k, v given, a causal mask and RoPE, and the learner's head."""
    q, k, v, d_o = rand(B, L, D), rand(B, L, D), rand(B, L, D), rand(B, L, D)
    body: dict[str, Any] = {
        "q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "grad_output": d_o.tolist(),
        "mask": {"type": "causal"},
    }  # fmt: skip
    if rope:
        body["rope"] = {"base": 10_000.0}
    allowed = np.broadcast_to(np.tril(np.ones((L, L), dtype=bool)), (B, L, L))
    return body, Head(q, k, v, d_o, 1 / np.sqrt(D), allowed, rope)


def expected(grads: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {n: np.asarray(grads[n]).tolist() for n in names}


FINAL = ("grad_q", "grad_k", "grad_v")


def test_right_gradients_match_in_the_backwards_order(client: TestClient) -> None:
    body, head = attention()
    mine = by_hand(head)
    names = ("grad_q", "row_dot", "grad_masked_scores", "grad_v", "grad_weights", "grad_scores")
    ans = post(client, "/attention", body | {"expected": expected(mine, names)})
    assert ans["first_mismatch"] is None
    got = [e["name"] for e in ans["comparison"]]
    # the forward's rows reversed (the answer's steps): dP, D with it, dS, the scores', V's, Q's
    assert got == ["grad_weights", "row_dot", "grad_masked_scores", "grad_scores", "grad_v",
                   "grad_q"]  # fmt: skip
    assert all(e["match"] and e["diagnosis"] is None for e in ans["comparison"])


CASES = [
    (Bugs(diagonal=True), "grad_k", ["softmax_grad_diagonal"], "your dS has no −D term"),
    (Bugs(unweighted="every"), "grad_k", ["softmax_grad_row_term_unweighted"],
     "over every key of the row"),
    (Bugs(scale_missing=True), "grad_k", ["grad_scale_missing"], "leave out the scale"),
    (Bugs(transposed="dv"), "grad_v", ["grad_transposed"], "dV = Pᵀ dO"),
    (Bugs(transposed="dk"), "grad_k", ["grad_transposed"], "dK = dSᵀ Q"),
    (Bugs(rope_forward=True), "grad_k", ["rope_grad_not_inverted"], "−θ"),
    (Bugs(scale_missing=True, rope_forward=True), "grad_k",
     ["grad_scale_missing", "rope_grad_not_inverted"], "Two mistakes"),
]  # fmt: skip


@pytest.mark.parametrize(("bugs", "first", "codes", "says"), CASES)
def test_a_wrong_gradient_is_named_with_its_mistake(
    client: TestClient, bugs: Bugs, first: str, codes: list[str], says: str
) -> None:
    body, head = attention()
    ans = post(client, "/attention", body | {"expected": expected(by_hand(head, bugs), FINAL)})
    assert ans["first_mismatch"] == first
    entry = next(e for e in ans["comparison"] if e["name"] == first)
    assert entry["diagnosis"]["mistakes"] == codes
    assert says in entry["diagnosis"]["explanation"]
    assert entry["diagnosis_complete"] is True
    assert f"Recomputing with {' + '.join(codes)} reproduces your numbers" in entry["message"]


def test_a_gradient_no_mistake_makes_is_said_so(client: TestClient) -> None:
    body, head = attention()
    mine = by_hand(head)
    mine["grad_q"] = np.asarray(mine["grad_q"]) * 1.5
    ans = post(client, "/attention", body | {"expected": expected(mine, FINAL)})
    entry = ans["comparison"][0] if ans["comparison"][0]["name"] == "grad_q" else None
    entry = next(e for e in ans["comparison"] if e["name"] == "grad_q") if entry is None else entry
    assert ans["first_mismatch"] == "grad_q" and entry["diagnosis"] is None
    assert "No listed mistake, alone or in pairs, reproduces your numbers" in entry["message"]


def test_grouped_heads_a_kv_heads_gradient_from_one_query_head(client: TestClient) -> None:
    """/multihead with q, k, v per head on 2 key/value heads: the learner's grad_k (per
    key/value head, top level) taken from the last query head of each group."""
    h, h_kv = 4, 2
    q, k, v = rand(B, h, L, D), rand(B, h_kv, L, D), rand(B, h_kv, L, D)
    d_y = rand(B, L, h * D)  # no W_o: the block's output is concat
    allowed = np.broadcast_to(np.tril(np.ones((L, L), dtype=bool)), (B, 1, L, L))
    d_o = d_y.reshape(B, L, h, D).transpose(0, 2, 1, 3)
    head = Head(q, k, v, d_o, 1 / np.sqrt(D), allowed, True, h // h_kv)
    mine = by_hand(head, Bugs(member=1))
    body = {
        "q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "grad_output": d_y.tolist(),
        "mask": {"type": "causal"}, "rope": {"base": 10_000.0},
        "expected": {"grad_k": mine["grad_k"].tolist(), "grad_output": d_y.tolist(),
                     "heads": [{"grad_q": mine["grad_q"][:, i].tolist()} for i in range(h)]},
    }  # fmt: skip
    ans = post(client, "/multihead", body)
    assert ans["first_mismatch"] == "grad_k"
    names = [e["name"] for e in ans["comparison"]]
    assert names[0] == "grad_output" and names.index("heads.3.grad_q") < names.index("grad_k")
    entry = next(e for e in ans["comparison"] if e["name"] == "grad_k")
    assert entry["diagnosis"]["mistakes"] == ["kv_grad_not_summed"]
    assert "query head j·2 + 1" in entry["diagnosis"]["explanation"]


def test_a_gradient_needs_grad_output(client: TestClient) -> None:
    body, head = attention()
    del body["grad_output"]
    err = post(client, "/attention", body | {"expected": {"grad_q": by_hand(head)["grad_q"].tolist()}}, 422)  # fmt: skip
    assert err["errors"][0]["field"] == "expected.grad_q"


def test_right_gradients_in_float32_match_at_float32_and_at_bfloat16(client: TestClient) -> None:
    body, head = attention()
    mine = by_hand(head, dtype=torch.float32)
    for precision in ("float32", "bfloat16"):
        ans = post(client, "/attention", body | {"expected": expected(mine, FINAL),
                                                 "tolerance": {"precision": precision}})  # fmt: skip
        assert ans["first_mismatch"] is None, ans["comparison"]
        assert all(e["precision"]["type"] == precision for e in ans["comparison"])


def test_a_printed_wrong_gradient_is_named_at_its_precision(client: TestClient) -> None:
    body, head = attention(rope=False)
    mine = {n: np.round(a, 4) for n, a in by_hand(head, Bugs(diagonal=True)).items()}
    ans = post(client, "/attention", body | {"expected": expected(mine, ("grad_masked_scores",))})
    entry = ans["comparison"][0]
    assert entry["printed"] == {"decimals": 4}
    assert entry["diagnosis"]["mistakes"] == ["softmax_grad_diagonal"]


def test_the_docs_example_a_learners_ds_without_d(client: TestClient) -> None:
    """docs/api.md 2.7, "Gradients": dS = P * dP, printed to 4 decimals (the learner's torch)."""
    q, k, v, d_o = [[1, 0], [0, 1], [1, 1]], [[1, 0], [0, 1], [1, -1]], [[1, 2], [0, 1], [2, 0]], [[1, 0], [0, 1], [1, -1]]  # fmt: skip
    tq, tk, tv, td = (torch.tensor(a, dtype=torch.float64) for a in (q, k, v, d_o))
    p = torch.softmax(tq @ tk.T / 2**0.5, -1)
    d_s = p * (td @ tv.T)  # no − D
    mine = {"grad_q": (d_s / 2**0.5) @ tk, "grad_k": (d_s / 2**0.5).T @ tq}
    body = {"q": q, "k": k, "v": v, "grad_output": d_o,
            "expected": {n: a.numpy().round(4).tolist() for n, a in mine.items()}}  # fmt: skip
    ans = post(client, "/attention", body)
    assert ans["first_mismatch"] == "grad_k"
    first = ans["comparison"][0]
    assert first["printed"] == {"decimals": 4} and first["where"] == [1, 1]
    assert first["diagnosis"]["explanation"].startswith("your dS has no −D term")
    assert ans["comparison"][1]["diagnosis"] is None
