"""The third edition's ``clip_missing`` and ``scale_from_config_ignored`` (API.md, "Compare,
third edition"), each with the caller's numbers made the way users make the mistake: a stock
transformers layer in float64 (its RoPE tables and softmax widened by
:func:`harness.hf_reference._run_layer`) with the clamp or the multiplier left out — an
``OlmoAttention`` built with ``clip_qkv=None`` on the same weights, a ``GraniteAttention`` whose
``scaling`` was left at ``head_dim**-0.5`` as in Llama — and NumPy written here for the
course's scale of 1 (Gemma 4's) taken as 1/√d_k. ``service`` is not imported here.
"""

import os
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.api.test_api_olmo_granite import CLIP, HEADS, HIDDEN, MULTIPLIER, _config, _request, _run

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip("torch", reason="PyTorch is not installed (torch==2.13.0)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from transformers import GraniteConfig, OlmoConfig  # noqa: E402
from transformers.models.granite import modeling_granite  # noqa: E402
from transformers.models.olmo import modeling_olmo  # noqa: E402

pytestmark = pytest.mark.torch
TIGHT = {"atol": 1e-10, "rtol": 0}
HEAD_DIM = HIDDEN // HEADS


def _diagnosed(client: TestClient, body: dict[str, Any], name: str) -> dict[str, Any]:
    r = client.post("/multihead" if "num_heads" in body else "/attention", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["first_mismatch"] == name, answer["comparison"]
    entry = next(e for e in answer["comparison"] if e["name"] == name)
    assert entry["match"] is False and entry["diagnosis"] is not None, entry
    return entry["diagnosis"]  # type: ignore[no-any-return]


def test_an_olmo_layer_run_without_its_clamp_is_clip_missing(client: TestClient) -> None:
    # the caller's layer: OLMo's weights in an OlmoAttention whose config lost clip_qkv
    theirs = _run(modeling_olmo, "OlmoAttention", "OlmoRotaryEmbedding",
                  _config(OlmoConfig, clip_qkv=None), seed=40)  # fmt: skip
    body = _request(theirs, clip_qkv=CLIP, expected={"output": theirs["out"].tolist()},
                    tolerance=TIGHT)  # fmt: skip
    d = _diagnosed(client, body, "output")
    assert d["mistakes"] == ["clip_missing"], d
    assert f"±{CLIP:g}" in d["explanation"] and "clip_qkv" in d["explanation"]


def test_a_granite_layer_scaled_by_one_over_root_d_k_is_scale_from_config_ignored(
    client: TestClient,
) -> None:
    config = _config(GraniteConfig, attention_multiplier=MULTIPLIER)
    assert modeling_granite.GraniteAttention(config, 0).scaling == MULTIPLIER  # as shipped
    theirs = _run(
        modeling_granite,
        "GraniteAttention",
        "GraniteRotaryEmbedding",
        config,
        seed=41,
        scaling=HEAD_DIM**-0.5,
    )  # as Llama's: the multiplier left out
    body = _request(theirs, attention_multiplier=MULTIPLIER,
                    expected={"output": theirs["out"].tolist()}, tolerance=TIGHT)  # fmt: skip
    d = _diagnosed(client, body, "output")
    assert d["mistakes"] == ["scale_from_config_ignored"], d
    assert "attention_multiplier = 0.0625" in d["explanation"], d["explanation"]
    assert f"1/√d_k = {HEAD_DIM**-0.5:.4g}" in d["explanation"]


def test_a_scale_of_one_taken_as_one_over_root_d_k_is_scale_from_config_ignored(
    client: TestClient,
) -> None:
    """Gemma 4's scale 1 (its norms do the scaling), computed with the usual 1/√d_k in NumPy."""
    rng = np.random.default_rng(41)
    q, k, v = (rng.normal(size=(4, 3)) for _ in range(3))
    s = q @ k.T / np.sqrt(3)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    body = {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "scale": 1.0,
            "expected": {"weights": w.tolist()}, "tolerance": TIGHT}  # fmt: skip
    d = _diagnosed(client, body, "weights")
    assert d["mistakes"] == ["scale_from_config_ignored"], d
