"""Low precision judged as kernels are (API.md, "Compare, third edition": low precision), through
the ASGI app: a correct bfloat16 or float16 computation matches (named by
``tolerance.precision`` or detected from its numbers), a wrong one is diagnosed at that
precision, and numbers that are not a kernel's are never taken for one.

The caller's numbers come from torch as engineers check kernels — ``scaled_dot_product_attention``
and transformers' ``LlamaAttention`` run in bfloat16 or float16 (FlashAttention's and PyTorch's
own tests judge a kernel this way: its error within twice a low-precision reference's plus an
absolute slack) — never from the service's functions.
"""

import os
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
torch = pytest.importorskip("torch", reason="PyTorch is not installed (torch==2.13.0)")
ml_dtypes = pytest.importorskip("ml_dtypes")


def plain(a: Any) -> Any:
    """Arrays as nested lists, in nested objects too."""
    if isinstance(a, dict):
        return {k: plain(v) for k, v in a.items()}
    return a.tolist() if isinstance(a, np.ndarray) else a


def post(client: TestClient, path: str, body: dict[str, Any], status: int = 200) -> Any:
    r = client.post(path, json=plain(body))
    assert r.status_code == status, r.text[:600]
    return r.json()


pytestmark = pytest.mark.torch

RNG = np.random.default_rng(42)
L, D = 6, 8
Q, K, V = (RNG.normal(size=(L, D)) for _ in range(3))


def kernel(dtype: Any, scale: float | None = None, causal: bool = True) -> np.ndarray:
    """torch's SDPA run in ``dtype`` on q, k, v cast to it, returned as float64 numbers."""
    q, k, v = (torch.tensor(a, dtype=dtype)[None] for a in (Q, K, V))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    result: np.ndarray = out[0].to(torch.float64).numpy()
    return result


def body(expected: np.ndarray, **rest: Any) -> dict[str, Any]:
    return {"q": Q, "k": K, "v": V, "mask": {"type": "causal"},
            "expected": {"output": expected}, **rest}  # fmt: skip


def entry(client: TestClient, b: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = post(client, "/attention", b)["comparison"][0]
    return first


@pytest.mark.parametrize(("dtype", "name"), [("bfloat16", "bfloat16"), ("float16", "float16")])
def test_a_correct_low_precision_kernel_matches_detected_from_its_numbers(
    client: TestClient, dtype: str, name: str
) -> None:
    """torch's SDPA in bfloat16 (float16): every number of its output is one of the type's, so
    the entry is judged as a kernel is; it matches, and the entry gives both errors."""
    got = entry(client, body(kernel(getattr(torch, dtype))))
    assert got["match"], got["message"]
    low = got["precision"]
    assert low["type"] == name
    assert 0 < low["yours"] <= 2 * low["reference"] + 1e-3
    assert got["message"].startswith(f"agrees within {name} rounding (your error")
    assert got["printed"] is None


def test_the_same_kernel_at_float64_precision_would_differ() -> None:
    """What makes the low-precision rule necessary: a correct bfloat16 output is 1e-3 away from
    the float64 one, far beyond the default tolerance (1e-6)."""
    exact = kernel(torch.float64)
    assert np.abs(kernel(torch.bfloat16) - exact).max() > 1e-3


def test_a_bfloat16_kernel_with_a_bug_is_diagnosed_at_bfloat16_precision(
    client: TestClient,
) -> None:
    """A bfloat16 kernel that forgot the 1/√d_k scale (scale 1): beyond bfloat16 rounding, and
    named as scale_missing although the reproduction is float64 and the numbers bfloat16."""
    got = entry(client, body(kernel(torch.bfloat16, scale=1.0)))
    assert not got["match"]
    assert got["precision"]["type"] == "bfloat16"
    assert "beyond bfloat16 rounding" in got["message"]
    assert got["diagnosis"]["mistakes"] == ["scale_missing"], got["message"]


def test_a_bfloat16_kernel_without_its_causal_mask_differs(client: TestClient) -> None:
    got = entry(client, body(kernel(torch.bfloat16, causal=False)))
    assert not got["match"] and got["precision"]["type"] == "bfloat16"
    assert got["diagnosis"]["mistakes"] == ["mask_missing"], got["message"]


def test_precision_named_judges_numbers_that_are_not_the_types(client: TestClient) -> None:
    """tolerance.precision float32: torch's float32 SDPA matches; the same numbers need no
    detection (float32's are never detected: every float32 print would be one)."""
    got = entry(client, body(kernel(torch.float32), tolerance={"precision": "float32"}))
    assert got["match"] and got["precision"]["type"] == "float32", got["message"]
    plain = entry(client, body(kernel(torch.float32)))
    assert plain["precision"] is None


def test_a_llama_layer_in_bfloat16_matches_on_multihead(client: TestClient) -> None:
    """transformers' LlamaAttention cast to bfloat16, as a port is checked: its output matches
    the service's float64 layer (from the same, bfloat16-valued, weights) at bfloat16."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=16,
                                      vocab_size=16, num_hidden_layers=1)  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attn = modeling_llama.LlamaAttention(config, 0).to(torch.bfloat16).eval()
    x = torch.tensor(RNG.normal(size=(1, L, 32)), dtype=torch.bfloat16)
    pos = torch.arange(L)[None]
    rotary = modeling_llama.LlamaRotaryEmbedding(config)
    mask = torch.full((L, L), float("-inf")).triu(1)[None, None].to(torch.bfloat16)
    with torch.no_grad():
        out, _ = attn(x, position_embeddings=rotary(x, pos), attention_mask=mask)
    state = {k: v.to(torch.float64).numpy() for k, v in attn.state_dict().items()}
    request = {"x": x[0].to(torch.float64).numpy(), **state, "num_heads": 4,
               "rope": {"base": 10000.0}, "mask": {"type": "causal"},
               "expected": {"output": out[0].to(torch.float64).numpy()}}  # fmt: skip
    got = post(client, "/multihead", request)["comparison"][0]
    assert got["match"], got["message"]
    assert got["precision"]["type"] == "bfloat16"


COURSE_WEIGHTS = np.full((4, 32), 1 / 32)  # a uniform row over 32 keys: 0.03125, a bf16 number


@pytest.mark.parametrize(
    "yours",
    [COURSE_WEIGHTS + 1 / 256, np.round(kernel(torch.float64), 4), np.arange(24.0).reshape(L, 4)],
    ids=["dyadic_course_numbers", "printed_at_4_decimals", "integers"],
)
def test_numbers_that_are_not_a_kernels_are_never_judged_at_low_precision(
    yours: np.ndarray,
) -> None:
    """Course numbers (simple fractions such as 1/32 + 1/256), a print at 4 decimals and
    integers are numbers of every type; read as bfloat16 they would get bfloat16's slack and a
    near miss would match. The service's detection must leave them alone."""
    from service.core.diagnosis.precision import detected  # the rule under test, alone

    assert detected(yours) is None


@pytest.mark.parametrize(("share", "match"), [(0.9, True), (1.1, False)])
def test_the_rule_is_twice_the_low_precision_computations_error_plus_its_atol(
    client: TestClient, share: float, match: bool
) -> None:
    """FlashAttention's rule, at its edge: the exact output with one number moved by 0.9 (1.1)
    of 2 × the bfloat16 computation's error + 1e-3 matches (does not)."""
    exact = kernel(torch.float64)
    named = {"tolerance": {"precision": "bfloat16"}}
    reference = entry(client, body(exact, **named))["precision"]["reference"]
    moved = exact.copy()
    moved[3, 2] += share * (2 * reference + 1e-3)
    got = entry(client, body(moved, **named))
    assert got["match"] is match, got["message"]
    assert got["precision"]["yours"] == pytest.approx(share * (2 * reference + 1e-3), rel=1e-9)


def test_precision_with_atol_is_a_422_naming_tolerance(client: TestClient) -> None:
    b = body(kernel(torch.bfloat16), tolerance={"precision": "bfloat16", "atol": 1e-3})
    error = post(client, "/attention", b, status=422)["errors"][0]
    assert error["field"] == "tolerance"
    assert "leave out atol" in error["message"]


def test_a_tolerance_given_without_precision_keeps_the_old_rule(client: TestClient) -> None:
    """An explicit atol/rtol is the caller's rule: no detection, no precision entry."""
    got = entry(client, body(kernel(torch.bfloat16), tolerance={"atol": 1e-2, "rtol": 0}))
    assert got["precision"] is None and got["match"]
