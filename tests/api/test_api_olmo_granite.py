"""OLMo's ``clip_qkv`` and Granite's ``attention_multiplier`` through the app (issue 40): each
against transformers 5.23's own layer (``OlmoAttention``, ``GraniteAttention``: tiny configs,
random weights, float64 with their RoPE tables and softmax widened by
:func:`harness.hf_reference._run_layer`), its state dict sent under its own names with the
field stated, compared to 1e-12; the steps' words; the forms against formulas written here in
NumPy; and the rules' 422s. OLMo's and Granite's own configs set the fields themselves
(tests/wire/test_config_layers.py); a config of another family with either key is refused
(tests/wire/test_config_refusals.py).
"""

import os
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from fastapi.testclient import TestClient

from tests.api.test_api_variants import post

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip("torch", reason="PyTorch is not installed (torch==2.13.0)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from transformers import GraniteConfig, OlmoConfig  # noqa: E402
from transformers.models.granite import modeling_granite  # noqa: E402
from transformers.models.olmo import modeling_olmo  # noqa: E402

from harness.hf_reference import _run_layer  # noqa: E402

pytestmark = pytest.mark.torch

F64 = torch.float64
L, HIDDEN, HEADS, KV_HEADS = 5, 16, 4, 2  # head_dim 4, grouped-query keys and values
TOL = 1e-12
CLIP = 0.4  # below the projections' largest numbers: the clamp changes some of them
MULTIPLIER = 0.0625  # Granite's kind of number; 1/√4 = 0.5 would be the default


def _config(cls: type[Any], **rest: Any) -> Any:
    config = cls(
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        intermediate_size=8, num_hidden_layers=1, vocab_size=10, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **rest,
    )  # fmt: skip
    config._attn_implementation = "eager"
    return config


def _run(
    modeling: Any, attn_cls: str, rotary_cls: str, config: Any, seed: int, **attrs: Any
) -> dict[str, Any]:
    """The layer (random weights, float64; ``attrs`` set on it, as a caller's edit) on x at
    positions 0 … L − 1, causal: its output, what it recorded, its state dict and x."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layer = getattr(modeling, attn_cls)(config, layer_idx=0).to(F64).eval()
        x = torch.randn(1, L, HIDDEN, dtype=F64) * 2.0
    for name, value in attrs.items():
        setattr(layer, name, value)
    allowed = torch.ones(1, L, L, dtype=torch.bool).tril()
    out, rec = _run_layer(
        modeling, layer, getattr(modeling, rotary_cls), config, x, torch.arange(L), allowed,
        float64=True,
    )  # fmt: skip
    state = {k: v.detach().numpy().tolist() for k, v in layer.state_dict().items()}
    return {"out": out[0].numpy(), "rec": rec, "state": state, "x": x[0].numpy().tolist()}


def _request(run: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"x": run["x"], "num_heads": HEADS, "num_kv_heads": KV_HEADS, **run["state"],
            "rope": {"base": 10000.0}, "mask": {"type": "causal"}, **fields}  # fmt: skip


def _heads(a: Any, h: int) -> npt.NDArray[np.float64]:
    """(1, L, h·d) -> (h, L, d), as the layer's view(…).transpose(1, 2)."""
    t: npt.NDArray[np.float64] = np.asarray(a.detach().numpy(), dtype=np.float64)[0]
    return t.reshape(L, h, -1).transpose(1, 0, 2)


def test_olmo_layer_with_clip_qkv_is_transformers_olmo_attention(client: TestClient) -> None:
    olmo = _run(modeling_olmo, "OlmoAttention", "OlmoRotaryEmbedding",
                _config(OlmoConfig, clip_qkv=CLIP), seed=40)  # fmt: skip
    body = post(client, "/multihead", _request(olmo, clip_qkv=CLIP))
    np.testing.assert_allclose(body["output"], olmo["out"], rtol=0, atol=TOL)
    weights = olmo["rec"]["weights"][0].numpy()  # (h, L, S)
    # OlmoAttention clamps the projections in place: the hooks on q_proj, k_proj and v_proj
    # recorded the tensors it then clamped, so they hold the clipped numbers
    clipped = {s: _heads(olmo["rec"][f"{s}_proj"], HEADS if s == "q" else KV_HEADS) for s in "qkv"}
    assert np.abs(clipped["q"]).max() == CLIP  # the clamp did bite
    for i, head in enumerate(body["heads"]):
        np.testing.assert_allclose(head["weights"], weights[i], rtol=0, atol=TOL)
        g = i // (HEADS // KV_HEADS)
        np.testing.assert_allclose(head["q_clipped"], clipped["q"][i], rtol=0, atol=TOL)
        np.testing.assert_allclose(head["k_clipped"], clipped["k"][g], rtol=0, atol=TOL)
        np.testing.assert_allclose(head["v_clipped"], clipped["v"][g], rtol=0, atol=TOL)
        assert np.abs(head["q"]).max() > CLIP  # q is the projection, before the clamp
    words = {s["name"]: s["formula"] for s in body["steps"]}
    names = [s["name"] for s in body["steps"]]
    assert names.index("v") < names.index("q_clipped") < names.index("q_rotated")
    assert words["q_clipped"].startswith(f"Q_c = clamp(Q, −{CLIP:g}, {CLIP:g})")
    assert words["q_rotated"].startswith("Q_r = RoPE(Q_c)")
    assert words["output"] == "weights V_c"


def test_olmo_layer_without_the_field_is_not_the_layer(client: TestClient) -> None:
    """The premise of the test above: the clamp changes the numbers."""
    olmo = _run(modeling_olmo, "OlmoAttention", "OlmoRotaryEmbedding",
                _config(OlmoConfig, clip_qkv=CLIP), seed=40)  # fmt: skip
    body = post(client, "/multihead", _request(olmo))
    assert np.abs(np.array(body["output"]) - olmo["out"]).max() > 1e-3


def test_granite_layer_with_attention_multiplier_is_transformers_granite_attention(
    client: TestClient,
) -> None:
    granite = _run(modeling_granite, "GraniteAttention", "GraniteRotaryEmbedding",
                   _config(GraniteConfig, attention_multiplier=MULTIPLIER), seed=41)  # fmt: skip
    body = post(client, "/multihead", _request(granite, attention_multiplier=MULTIPLIER))
    np.testing.assert_allclose(body["output"], granite["out"], rtol=0, atol=TOL)
    weights = granite["rec"]["weights"][0].numpy()
    for i, head in enumerate(body["heads"]):
        np.testing.assert_allclose(head["weights"], weights[i], rtol=0, atol=TOL)
        scores = np.array(head["scores"])
        np.testing.assert_allclose(head["scaled_scores"], scores * MULTIPLIER, rtol=0, atol=0)
    words = {s["name"]: s["formula"] for s in body["steps"]}
    assert "attention_multiplier = 0.0625" in words["scaled_scores"]
    assert "not 1/√d_k = 0.5" in words["scaled_scores"]
    assert body["conventions"]["scale"] == "given"
    plain = post(client, "/multihead", _request(granite))  # 1/√d_k: another layer
    assert np.abs(np.array(plain["output"]) - granite["out"]).max() > 1e-3


def test_attention_clips_and_scales_as_written_here(client: TestClient) -> None:
    """/attention: q, k, v clamped elementwise, then the scores · attention_multiplier."""
    rng = np.random.default_rng(400)
    q, k, v = (rng.normal(size=(4, 3)) * 2 for _ in range(3))
    body = post(client, "/attention", {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(),
                                       "clip_qkv": 1.0, "attention_multiplier": 0.3})  # fmt: skip
    qc, kc, vc = (np.minimum(np.maximum(a, -1.0), 1.0) for a in (q, k, v))
    s = qc @ kc.T * 0.3
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    for name, want in (("q_clipped", qc), ("k_clipped", kc), ("v_clipped", vc), ("weights", w)):
        np.testing.assert_allclose(body[name], want, rtol=0, atol=1e-14)
    np.testing.assert_allclose(body["output"], w @ vc, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(body["q"], q)


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"scale": 0.5, "attention_multiplier": 0.25}, "attention_multiplier", "not both"),
        ({"clip_qkv": 0}, "clip_qkv", "greater than 0"),
        ({"clip_qkv": -1.0}, "clip_qkv", "greater than 0"),
        ({"attention_multiplier": 0}, "attention_multiplier", "greater than 0"),
    ],
    ids=["scale_and_multiplier", "clip_zero", "clip_negative", "multiplier_zero"],
)
def test_the_rules_name_the_field(
    client: TestClient, fields: dict[str, Any], field: str, words: str
) -> None:
    body = {"q": [[1.0, 0.0]], "k": [[1.0, 0.0]], "v": [[1.0]], **fields}
    r = client.post("/attention", json=body)
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == field and words in err["message"], err


def test_clip_qkv_is_refused_with_mla(client: TestClient) -> None:
    """MLA's q and k come from latents (and turn in part): no MLA model clamps them."""
    from service.wire.examples import DEEPSEEK_MLA

    r = client.post("/multihead", json={**DEEPSEEK_MLA, "clip_qkv": 1.0})
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == "clip_qkv" and "MLA" in err["message"], err
