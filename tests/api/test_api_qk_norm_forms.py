"""qk_norm's forms of the third edition through the HTTP layer (ASGI app): over the whole
projection (OLMo 2), a weight per head (Cohere; StableLM's per-head state dict names), a
LayerNorm's bias (Phi), each against a layer written here in torch float64 (projections, the
norm, the head split, grouped-query attention's repeat, softmax, o_proj), its step's formula,
and every rule's 422. The families' layers from their configs against transformers are in
tests/wire/test_config_layers.py."""

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.api.test_api_variants import post
from tests.core.test_variants import reference

TOL = 1e-12
RNG = np.random.default_rng(41)
H, H_KV, D, D_MODEL, L = 4, 2, 3, 6, 5
X = RNG.normal(size=(L, D_MODEL))
W_Q, W_K, W_V = RNG.normal(size=(H * D, D_MODEL)), *RNG.normal(size=(2, H_KV * D, D_MODEL))
W_O = RNG.normal(size=(D_MODEL, H * D))


def layer(**rest: Any) -> dict[str, Any]:
    return {"x": X, "num_heads": H, "q_proj.weight": W_Q, "k_proj.weight": W_K,
            "v_proj.weight": W_V, "o_proj.weight": W_O, **rest}  # fmt: skip


def torch_layer(norm: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The layer in torch float64: ``norm(side, projection (L, n·d))`` → (L, n, d) normed heads;
    returns q_normed (h, L, d), k_normed (h_kv, L, d) and the output (L, d_model)."""
    torch = reference("torch")
    x = torch.from_numpy(X)
    q = norm("q", x @ torch.from_numpy(W_Q).T)  # (L, h, d)
    k = norm("k", x @ torch.from_numpy(W_K).T)  # (L, h_kv, d)
    v = (x @ torch.from_numpy(W_V).T).view(L, H_KV, D)
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # (n, L, d)
    k_rep, v_rep = (t.repeat_interleave(H // H_KV, dim=0) for t in (k, v))
    weights = torch.softmax(q @ k_rep.transpose(1, 2) / D**0.5, dim=-1)  # (h, L, L)
    out = (weights @ v_rep).transpose(0, 1).reshape(L, H * D) @ torch.from_numpy(W_O).T
    return q.numpy(), k.numpy(), out.numpy()


def check(answer: dict[str, Any], want: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    q, k, out = want
    heads = answer["heads"]
    np.testing.assert_allclose([h["q_normed"] for h in heads], q, rtol=0, atol=TOL)
    k_rep = np.repeat(k, H // H_KV, axis=0)  # the answer's heads: each query head's keys
    np.testing.assert_allclose([h["k_normed"] for h in heads], k_rep, rtol=0, atol=TOL)
    np.testing.assert_allclose(answer["output"], out, rtol=0, atol=TOL)


def formula(answer: dict[str, Any], name: str) -> str:
    return str(next(s["formula"] for s in answer["steps"] if s["name"] == name))


def test_over_projection_is_olmo2s_rms_norm_of_the_whole_projection(client: TestClient) -> None:
    torch = reference("torch")
    w = {"q": RNG.normal(size=H * D), "k": RNG.normal(size=H_KV * D)}

    def norm(side: str, p: Any) -> Any:  # OLMo 2: q_norm(q_proj(x)), then .view(…, -1, d)
        normed = torch.nn.functional.rms_norm(p, (p.shape[-1],), torch.from_numpy(w[side]), 1e-6)
        return normed.view(L, -1, D)

    fields = {"q_norm.weight": w["q"], "k_norm.weight": w["k"], "qk_norm": {"over": "projection"}}
    answer = post(client, "/multihead", layer(**fields))
    check(answer, torch_layer(norm))
    assert "all heads together" in formula(answer, "q_normed")
    assert "h_kv·d_k" in formula(answer, "k_normed")
    rows = {"q_norm.weight": w["q"].reshape(H, D), "k_norm.weight": w["k"].reshape(H_KV, D)}
    per_head = post(client, "/multihead", layer(**rows))  # the same numbers, head by head
    assert np.abs(np.array(per_head["output"]) - answer["output"]).max() > 1e-3


@pytest.mark.parametrize(
    "names", ["q_norm.weight", "q_layernorm.norms"], ids=["cohere", "stablelm"]
)
def test_a_weight_per_head_is_a_layer_norm_of_each_head_with_its_own_row(
    client: TestClient, names: str
) -> None:
    """Cohere's ``q_norm.weight`` [h][d]; StableLM's ``q_layernorm.norms.<i>.weight``, one
    ``nn.LayerNorm(d, bias=False)`` per head, read as the same rows."""
    torch = reference("torch")
    w = {"q": RNG.normal(size=(H, D)), "k": RNG.normal(size=(H_KV, D))}

    def norm(side: str, p: Any) -> Any:
        heads = p.view(L, -1, D)
        return torch.stack(
            [
                torch.nn.functional.layer_norm(heads[:, i], (D,), torch.from_numpy(row), None, 1e-5)
                for i, row in enumerate(w[side])
            ],
            dim=1,
        )

    if names == "q_norm.weight":
        given: dict[str, Any] = {"q_norm.weight": w["q"], "k_norm.weight": w["k"]}
    else:
        given = {f"{s}_layernorm.norms.{i}.weight": row for s in "qk" for i, row in enumerate(w[s])}
    answer = post(client, "/multihead", layer(**given, qk_norm={"type": "layer", "eps": 1e-5}))
    check(answer, torch_layer(norm))
    assert "w (a row per head)" in formula(answer, "q_normed")


def test_a_bias_is_phis_layer_norm_shared_by_the_heads(client: TestClient) -> None:
    torch = reference("torch")
    w, b = RNG.normal(size=(2, D)), RNG.normal(size=(2, D))

    def norm(side: str, p: Any) -> Any:
        i = "qk".index(side)
        tw, tb = torch.from_numpy(w[i]), torch.from_numpy(b[i])
        return torch.nn.functional.layer_norm(p.view(L, -1, D), (D,), tw, tb, 1e-5)

    given = {"q_layernorm.weight": w[0], "q_layernorm.bias": b[0],
             "k_layernorm.weight": w[1], "k_layernorm.bias": b[1]}  # fmt: skip
    answer = post(client, "/multihead", layer(**given, qk_norm={"type": "layer", "eps": 1e-5}))
    check(answer, torch_layer(norm))
    assert "· w + b" in formula(answer, "q_normed")


REFUSED = [
    ({"q_norm.bias": np.ones(D)}, "q_norm.bias", "only a LayerNorm"),
    ({"qk_norm": {"over": "projection"}, "q_norm.weight": np.ones((H, D))}, "q_norm.weight",
     "one row per head"),
    ({"qk_norm": {"over": "projection"}, "k_norm.weight": np.ones(H * D)}, "k_norm.weight",
     "expected [6]"),
    ({"q_norm.weight": np.ones(H * D)}, "q_norm.weight", '{"over": "projection"}'),
    ({"k_norm.weight": np.ones((H, D))}, "k_norm.weight", "or [2][3]"),
    ({"q_norm.weight": np.ones((H, D)), "q_layernorm.norms.0.weight": np.ones(D)},
     "q_layernorm.norms", "not both"),
    ({"q_layernorm.norms.1.weight": np.ones(D)}, "q_layernorm.norms", ""),
    ({"qk_norm": {"q_weight": np.ones(D).tolist()}, "q_norm.weight": np.ones(D)}, "q_norm.weight",
     "not both"),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "field", "says"), REFUSED)
def test_a_norm_array_of_no_form_is_a_422_naming_it(
    client: TestClient, fields: dict[str, Any], field: str, says: str
) -> None:
    answer = post(client, "/multihead", layer(**fields), status=422)
    assert answer["errors"][0]["field"].startswith(field), answer
    assert says in answer["errors"][0]["message"], answer


@pytest.mark.parametrize(
    "qk_norm",
    [{"over": "projection"}, {"q_weight": [[1.0, 1.0, 1.0]]}],
    ids=["projection", "rows"],
)
def test_attention_has_one_head_and_refuses_the_forms_of_heads(
    client: TestClient, qk_norm: dict[str, Any]
) -> None:
    q = RNG.normal(size=(L, D))
    answer = post(client, "/attention", {"q": q, "k": q, "v": q, "qk_norm": qk_norm}, status=422)
    assert answer["errors"][0]["field"].startswith("qk_norm."), answer
