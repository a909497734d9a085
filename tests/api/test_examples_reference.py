"""The variant examples of service/wire/examples.py (Swagger's and README's) against references
that do not share the service's code, in float64:

- the LLaMA layer: Hugging Face transformers' own ``LlamaAttention`` with the example's weights;
- ALiBi on 6 heads: the slopes in the step's text against BLOOM's ``build_alibi_tensor`` and the
  paper's ``get_slopes``, and every head's weights recomputed with BLOOM's bias;
- softcap and sinks: the formulas written out here in NumPy.

Each example is posted without its ``decimals``, so the full float64 answer is compared.
"""

import math
import os
import re
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.wire import examples as ex

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed: example cross-checks skipped (install torch==2.13.0)",
)
transformers = pytest.importorskip(
    "transformers",
    reason="transformers is not installed: example cross-checks skipped",
)

from transformers import LlamaConfig  # noqa: E402
from transformers.models.bloom import modeling_bloom  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

TOL = 1e-10  # the brief's bound; the differences seen are ≈1e-16
EXACT = 1e-12


def full_precision(client: TestClient, path: str, example: dict[str, Any], **extra: Any) -> Any:
    """The example's answer with every float unrounded (``decimals`` dropped)."""
    r = client.post(path, json={**example, "decimals": None, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    weights: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return weights


def causal_additive(n: int) -> np.ndarray:
    return np.where(np.tril(np.ones((n, n), dtype=bool)), 0.0, -np.inf)


# --- a LLaMA attention layer ------------------------------------------------------------------


def llama_attention(body: dict[str, Any]) -> Any:
    """transformers' LlamaAttention for the example, float64, its weights loaded as given."""
    d_model = len(body["x"][0])
    num_heads = body["num_heads"]
    head_dim = len(body["q_proj.weight"]) // num_heads
    config = LlamaConfig(
        hidden_size=d_model,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=num_heads,
        num_key_value_heads=len(body["k_proj.weight"]) // head_dim,
        head_dim=head_dim,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": body["rope"]["base"]},
    )
    config._attn_implementation = "sdpa"  # eager's softmax is float32; SDPA's is float64 here
    layer = modeling_llama.LlamaAttention(config, layer_idx=0).to(torch.float64).eval()
    assert layer.config._attn_implementation == "sdpa"
    state = {
        f"{name}.weight": torch.tensor(body[f"{name}.weight"], dtype=torch.float64)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj")
    }
    layer.load_state_dict(state, strict=True)
    return layer


def llama_cos_sin(config: Any, seq_len: int) -> tuple[Any, Any]:
    """``LlamaRotaryEmbedding.forward`` written out in float64 (transformers computes it in
    float32): inv_freq = 1 / theta^(2i/d), emb = [p·inv_freq, p·inv_freq]."""
    d = config.head_dim
    theta = config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    freqs = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None], emb.sin()[None]


def test_llama_example_is_hugging_face_llama_attention(client: TestClient) -> None:
    body = ex.LLAMA_LAYER
    ours = full_precision(client, "/multihead", body, include=["heads", "output"])
    layer = llama_attention(body)
    x = torch.tensor(body["x"], dtype=torch.float64)[None]  # (1, L, d_model)
    L = x.shape[1]
    cos, sin = llama_cos_sin(layer.config, L)

    # transformers' own rotary module (float32) agrees with the float64 cos/sin to float32
    hf_cos, hf_sin = modeling_llama.LlamaRotaryEmbedding(layer.config)(x, torch.arange(L)[None])
    np.testing.assert_allclose(hf_cos.double().numpy(), cos.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(hf_sin.double().numpy(), sin.numpy(), rtol=0, atol=1e-6)

    mask = torch.tensor(causal_additive(L), dtype=torch.float64)[None, None]
    with torch.no_grad():
        out, _ = layer(x, position_embeddings=(cos, sin), attention_mask=mask)
        # the rotated queries and keys, as the layer makes them
        q = layer.q_proj(x).view(1, L, -1, layer.head_dim).transpose(1, 2)
        k = layer.k_proj(x).view(1, L, -1, layer.head_dim).transpose(1, 2)
        q_rot, k_rot = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert out.dtype == torch.float64

    np.testing.assert_allclose(ours["output"], out[0].numpy(), rtol=0, atol=TOL)
    for h, head in enumerate(ours["heads"]):
        np.testing.assert_allclose(head["q_rotated"], q_rot[0, h].numpy(), rtol=0, atol=TOL)
        np.testing.assert_allclose(head["k_rotated"], k_rot[0, 0].numpy(), rtol=0, atol=TOL)
    assert np.abs(np.array(ours["output"]) - out[0].numpy()).max() < 1e-14


# --- ALiBi on 6 heads -------------------------------------------------------------------------


def paper_get_slopes(n: int) -> list[float]:
    """``get_slopes`` of the ALiBi paper's code (ofirpress/attention_with_linear_biases)."""

    def get_slopes_power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + paper_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def slopes_in_steps(steps: list[dict[str, Any]]) -> list[float]:
    """The slopes the position_bias step's formula lists."""
    (formula,) = [s["formula"] for s in steps if s["name"] == "position_bias"]
    found = re.search(r"slopes[^\[]*\[([^\]]+)\]", formula)
    assert found, formula
    return [float(v) for v in found.group(1).split(",")]


def test_alibi_example_slopes_are_bloom_and_the_papers(client: TestClient) -> None:
    body = ex.ALIBI_SIX_HEADS
    n = body["num_heads"]
    ours = full_precision(client, "/multihead", body, include=["heads", "average_weights", "steps"])
    slopes = slopes_in_steps(ours["steps"])

    L = len(body["sentence"].split())
    bloom = modeling_bloom.build_alibi_tensor(torch.ones(1, L), n, torch.float64)  # (n, 1, L)
    bloom_slopes = bloom[:, 0, 1].numpy()  # slope · position 1
    np.testing.assert_array_equal(slopes, bloom_slopes)
    np.testing.assert_array_equal(slopes, paper_get_slopes(n))
    assert slopes == [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]

    # BLOOM adds slope · j (not slope · (j − i)): the same softmax, row by row
    weights = []
    for h, head in enumerate(ours["heads"]):
        scores = np.array(head["scaled_scores"]) + bloom[h].numpy() + causal_additive(L)
        ref = softmax_rows(scores)
        np.testing.assert_allclose(head["weights"], ref, rtol=0, atol=EXACT)
        weights.append(ref)
    np.testing.assert_allclose(
        ours["average_weights"], np.mean(weights, axis=0), rtol=0, atol=EXACT
    )


# --- softcap ----------------------------------------------------------------------------------


def test_softcap_example_is_c_tanh_s_over_c(client: TestClient) -> None:
    body = ex.SOFTCAP_LARGE_SCORES
    ours = full_precision(client, "/attention", body, include=[*body["include"], "output"])
    q, k, v = (np.array(body[name], dtype=float) for name in ("q", "k", "v"))
    c = body["softcap"]
    scaled = q @ k.T / math.sqrt(q.shape[1])
    np.testing.assert_allclose(ours["scaled_scores"], scaled, rtol=0, atol=EXACT)
    capped = c * np.tanh(np.array(ours["scaled_scores"]) / c)
    np.testing.assert_allclose(ours["capped_scores"], capped, rtol=0, atol=EXACT)
    assert np.abs(capped).max() < c
    np.testing.assert_allclose(ours["weights"], softmax_rows(capped), rtol=0, atol=EXACT)
    np.testing.assert_allclose(ours["output"], softmax_rows(capped) @ v, rtol=0, atol=EXACT)
    # the point of the example: 40 against 20 is nearly a tie once capped
    assert 0.5 < ours["weights"][2][0] < 0.6


# --- sinks ------------------------------------------------------------------------------------


def test_sink_example_rows_sum_to_one_minus_the_sink(client: TestClient) -> None:
    body = ex.SINK_CAUSAL
    ours = full_precision(client, "/attention", body, include=[*body["include"], "output"])
    q, k, v = (np.array(body[name], dtype=float) for name in ("q", "k", "v"))
    sink = body["sinks"]
    L = q.shape[0]
    scores = q @ k.T / math.sqrt(q.shape[1]) + causal_additive(L)
    # one more column, the sink, in each row's softmax; then dropped
    with_sink = softmax_rows(np.concatenate([scores, np.full((L, 1), sink)], axis=1))
    weights, sink_weights = with_sink[:, :-1], with_sink[:, -1]

    np.testing.assert_allclose(ours["weights"], weights, rtol=0, atol=EXACT)
    np.testing.assert_allclose(ours["sink_weights"], sink_weights, rtol=0, atol=EXACT)
    np.testing.assert_allclose(
        np.sum(ours["weights"], axis=1) + ours["sink_weights"], 1.0, rtol=0, atol=EXACT
    )
    np.testing.assert_allclose(ours["output"], weights @ v, rtol=0, atol=EXACT)
    # the first query sees one key with score 0: the sink gets e / (1 + e)
    assert ours["sink_weights"][0] == pytest.approx(math.e / (1 + math.e), abs=EXACT)
    assert ours["sink_weights"][0] == max(ours["sink_weights"])


def test_course_notebook_example_holds_the_notebooks_numbers(client: TestClient) -> None:
    """The example's expected weights are what the notebook's line prints (recomputed here in
    torch float64: softmax down the columns, then ÷ √d_k), and the service names both mistakes
    while its own weights are torch's row softmax of the scaled scores."""
    e = ex.COURSE_NOTEBOOK
    x, w_q, w_k = (torch.tensor(e[n], dtype=torch.float64) for n in ("x", "w_q", "w_k"))
    scores = (x @ w_q) @ (x @ w_k).T
    d_k = w_q.shape[1]
    notebook = torch.exp(scores) / torch.exp(scores).sum(dim=0) / math.sqrt(d_k)
    assert np.round(notebook.numpy(), 4).tolist() == e["expected"]["weights"]

    body = full_precision(client, "/attention", e)
    right = torch.softmax(scores / math.sqrt(d_k), dim=-1).numpy()
    np.testing.assert_allclose(body["weights"], right, rtol=EXACT, atol=EXACT)
    (entry,) = body["comparison"]
    assert body["first_mismatch"] == "weights" and not entry["match"]
    assert entry["diagnosis"]["mistakes"] == ["softmax_over_queries", "scale_after_softmax"]
    printed = np.array(e["expected"]["weights"])
    assert entry["max_abs_diff"] == pytest.approx(float(np.abs(right - printed).max()), abs=EXACT)
