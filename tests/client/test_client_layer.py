"""``client.layer(module, config, x)``: a transformers attention module checked in three lines,
its state dict and its config sent as they are (the service in-process, ``Client.local()``),
against the module's own forward in float64 (the harness's float64 patches); and a decode step
through the same call with ``past``."""

import os
from typing import Any

import numpy as np
import pytest
from attention_client import Client

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import DynamicCache, Qwen3Config  # noqa: E402
from transformers import modeling_rope_utils as rope_utils  # noqa: E402
from transformers.models.qwen3 import modeling_qwen3  # noqa: E402

from harness.hf_reference import _widened, float64_torch_in  # noqa: E402

MIN = torch.finfo(torch.float64).min


def qwen3(layer_idx: int) -> tuple[Any, Any]:
    """A Qwen3 layer with q/k norms, GQA and θ = 1e6, from a config as a model would load it."""
    config = Qwen3Config(
        hidden_size=8, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
        num_hidden_layers=2, vocab_size=10, intermediate_size=8, rms_norm_eps=1e-3,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(9)
    module = modeling_qwen3.Qwen3Attention(config, layer_idx).double().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.2)  # norms away from ones
    return module, config


def run(module: Any, config: Any, x: Any, at: list[int], cache: Any = None) -> Any:
    """The module's forward of x at positions ``at`` (causal over everything so far)."""
    allowed = torch.arange(at[-1] + 1)[None, :] <= torch.tensor(at)[:, None]  # (n, P + n)
    mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, MIN)[None, None]
    with float64_torch_in(modeling_qwen3, rope_utils), _widened(), torch.no_grad():
        cos_sin = modeling_qwen3.Qwen3RotaryEmbedding(config)(x, torch.tensor(at)[None])
        out, _ = module(x, cos_sin, mask, cache)  # past_key_values, cache from 5.25
    return out


def test_a_layer_is_checked_with_its_module_and_config_as_they_are() -> None:
    module, config = qwen3(1)
    x = torch.randn(1, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = run(module, config, x, list(range(5)))
    with Client.local() as client:
        r = client.layer(module, config, x)
    assert np.abs(r.output - out[0].numpy()).max() < 1e-12
    taken = r["conventions"]["config"]
    assert taken["qk_norm.eps"] == "rms_norm_eps" and taken["rope.base"].endswith("rope_theta")


def test_a_decode_step_goes_through_the_same_call_with_past() -> None:
    module, config = qwen3(0)
    x = torch.randn(1, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    cache = DynamicCache(config=config)
    run(module, config, x[:, :5], list(range(5)), cache)
    held: Any = cache.layers[0]
    past = {"k": held.keys[0].clone().numpy(), "v": held.values[0].clone().numpy()}
    step = run(module, config, x[:, 5:], [5], cache)
    with Client.local() as client:
        r = client.layer(module, config, x[0, 5:], past=past)
    assert np.abs(r.output - step[0].numpy()).max() < 1e-12
    assert np.abs(r["present_k"] - held.keys[0].numpy()).max() < 1e-12


def test_a_layer_without_its_config_takes_the_modules_own() -> None:
    module, config = qwen3(1)
    x = torch.randn(1, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with Client.local() as client:
        given, own = client.layer(module, config, x), client.layer(module, None, x)
    assert np.array_equal(own.output, given.output)
    assert own["conventions"]["config"] == given["conventions"]["config"]


@pytest.mark.parametrize("config", [None, "qwen3", 4], ids=["none", "str", "int"])
def test_a_module_without_a_config_is_told_to_send_its_weights(config: object) -> None:
    """torch's MultiheadAttention has no config: the error names the call that sends it."""
    module = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    with Client.local() as client, pytest.raises(TypeError) as raised:
        client.layer(module, config, torch.zeros(3, 8))
    message = str(raised.value)
    assert "multihead(x=x, num_heads=h, state_dict=module.state_dict())" in message
    said = "got None, and the MultiheadAttention module keeps no config of its own"
    assert (said in message) == (config is None)
    assert "not iterable" not in message
