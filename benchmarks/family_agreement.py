"""What agreement a stock transformers layer gives, family by family: docs/guide-layers.md's
table of every family, printed as Markdown.

For each entry of ``CASES`` in tests/wire/test_config_layers.py (its builders, imported, not
copied: whatever families that list holds), the tiny layer is built from its config with
float32 weights (the test's ``_fill``, rounded to float32) and run as transformers ships it:
float32 input, float32 inside (its RoPE tables, norms and softmax), the mask and the
``position_embeddings`` its decoder model gives that layer, nothing patched. The service gets
the same float32 weights and input, exactly, as float64 (``x``, the state dict, ``config`` and
``layer``, nothing else) and computes in float64. The table gives what the config implies for
that layer as the service reads it (``from_config``; the test checks each against the
transformers class in float64 to 1e-12), the largest absolute difference of the outputs and
that difference over the stock output's largest magnitude.

    PYTHONPATH=. python benchmarks/family_agreement.py > table.md

The first lines say the date, torch's and transformers' versions and the CPU (the float32
differences' exact size depends on the CPU's float32 sin, cos and exp; their order does not).
"""

import datetime
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

import service.main  # noqa: E402
from service.wire.hf_config import from_config  # noqa: E402
from tests.wire.test_config_layers import CASES, SIZES, L, Layer, _fill, _run, _state  # noqa: E402

# the fields a column of its own shows; any other field the config implies goes to "other"
SHOWN = {"num_heads", "num_kv_heads", "d_k", "rope", "qk_norm", "v_norm", "scale", "mask",
         "attention_multiplier", "mla"}  # fmt: skip
OUTPUT_NAMES = {"dense": "o", "out_proj": "o", "o_proj": "o"}  # the output projection's names
BIAS_ORDER = ["q", "k", "v", "o"]


def stock_output(layer: Layer, x: np.ndarray, positions: list[int]) -> np.ndarray:
    """The layer's output for float32 ``x`` (L, d_model) as transformers ships it."""
    xs, pos = torch.as_tensor(x)[None], torch.tensor(positions)[None]
    with torch.no_grad():
        mask = layer.mask_fn(layer.config, xs, None, None, position_ids=pos)
        rotary: dict[str, Any] = {"position_ids": pos} if layer.position_ids else {}
        if layer.rotary is not None:
            rotary["position_embeddings"] = layer.rotary(xs, pos)
        # tensors the builder passes (BLOOM's ALiBi, built in float64): float32, as shipped
        extra = {
            k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in layer.forward_kwargs.items()
        }
        out, _ = layer.attn(hidden_states=xs, attention_mask=mask, **rotary, **extra)
    result: np.ndarray = out[0].numpy()
    return result


MASK_WORDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "causal": lambda m: "causal",
    "window": lambda m: f"window (left {m['left']}, right {m['right']})",
    "chunked": lambda m: f"chunked ({m['size']})",
}


def _mask(masks: list[dict[str, Any]]) -> str:
    return " + ".join(MASK_WORDS.get(m["type"], str)(m) for m in masks)


def _rope(fields: dict[str, Any]) -> str:
    rope = fields.get("rope")
    if not rope:
        return "none"
    part = (
        f"{rope['rotary_dim']} of {fields['d_k']}"
        if rope.get("rotary_dim")
        else f"qk_rope_head_dim {fields['mla']['qk_rope_head_dim']}"
        if "mla" in fields
        else "whole head"
    )
    scaling = rope.get("scaling") or {}
    extra = f", {scaling['type']}" if scaling else ""
    return f"{rope.get('style', 'half')}, {part}, θ {rope['base']:g}{extra}"


def _norm(norm: dict[str, Any] | None) -> str:
    if not norm:
        return ""
    words = [norm.get("type", "rms")] + [f"ε {norm['eps']:g}"] * ("eps" in norm)
    words += ["over the projection"] * (norm.get("over") == "projection")
    words += ["(1 + w)"] * bool(norm.get("zero_centered")) + ["after RoPE"] * bool(
        norm.get("after_rope")
    )
    return " ".join(words)


def _norms(fields: dict[str, Any]) -> str:
    parts = [f"q/k {_norm(fields.get('qk_norm'))}"] * bool(fields.get("qk_norm"))
    parts += [f"v {_norm(fields.get('v_norm'))}"] * bool(fields.get("v_norm"))
    return "; ".join(parts) or "none"


def _scale(fields: dict[str, Any]) -> str:
    if fields.get("attention_multiplier") is not None:
        return f"{fields['attention_multiplier']:g} (attention_multiplier)"
    if fields.get("scale") is not None:
        return f"{fields['scale']:.4g}"
    if "mla" in fields:  # as DeepseekV3Attention: × mscale² where YaRN gives mscale_all_dim
        scaling = (fields.get("rope") or {}).get("scaling") or {}
        return "qk_head_dim^-½" + " × mscale²" * bool(scaling.get("mscale_all_dim"))
    return "d_k^-½"


def _bias(state: dict[str, Any]) -> str:
    names = [k.removesuffix(".bias") for k in state if k.endswith(".bias")]
    short = sorted(
        (OUTPUT_NAMES.get(n, n.removesuffix("_proj")) for n in names),
        key=lambda s: (BIAS_ORDER.index(s) if s in BIAS_ORDER else len(BIAS_ORDER), s),
    )
    sinks = ["sinks"] * ("sinks" in state)  # gpt-oss's sink logits, in the state dict too
    return ", ".join([*short, *sinks]) or "none"


def _value(v: Any) -> str:
    if isinstance(v, dict):
        return "(" + ", ".join(f"{k} {_value(w)}" for k, w in v.items()) + ")"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _other(fields: dict[str, Any]) -> str:
    rest = {k: v for k, v in fields.items() if k not in SHOWN and v is not None}
    return ", ".join(k if v is True else f"{k} {_value(v)}" for k, v in rest.items())


def float64_difference(client: TestClient, case: tuple[Any, ...]) -> float:
    """The test's comparison (tests/wire/test_config_layers.py): the layer in float64 with its
    float32 steps widened, against the service; the largest difference ÷ the output's largest
    magnitude."""
    name, build, layer, positions, _ = case
    _, hf = build(layer)
    hf.attn = hf.attn.double().eval()
    _fill(hf, 100 + layer)
    x = np.random.default_rng(layer).normal(size=(L, SIZES["hidden_size"]))
    at = list(range(L)) if positions is None else positions
    expected = _run(hf, x, at)
    body: dict[str, Any] = {"x": x.tolist(), **_state(hf), "config": build(layer)[0],
                            "layer": layer, "include": ["output"]}  # fmt: skip
    if positions is not None:
        body["positions"] = body["context_positions"] = positions
    response = client.post("/multihead", json=body)
    assert response.status_code == 200, f"{name}: {response.text}"
    got = np.asarray(response.json()["output"])
    return float(np.abs(got - expected).max()) / max(1.0, float(np.abs(expected).max()))


def row(client: TestClient, case: tuple[Any, ...]) -> str:
    """One family's row: what its config implies, the float64 layer's agreement (the test's)
    and the stock layer's."""
    name, build, layer, positions, _ = case
    exact = float64_difference(client, case)
    cfg, hf = build(layer)
    hf.attn = hf.attn.float().eval()
    _fill(hf, 100 + layer)  # float64 draws, rounded into the float32 parameters
    x = np.random.default_rng(layer).normal(size=(L, SIZES["hidden_size"])).astype(np.float32)
    at = list(range(L)) if positions is None else positions
    stock = stock_output(hf, x, at).astype(np.float64)
    state = _state(hf)  # float32 values, exactly, as JSON numbers
    body: dict[str, Any] = {"x": x.astype(np.float64).tolist(), **state, "config": cfg,
                            "layer": layer, "include": ["output"]}  # fmt: skip
    if positions is not None:
        body["positions"] = body["context_positions"] = positions
    response = client.post("/multihead", json=body)
    assert response.status_code == 200, f"{name}: {response.text}"
    diff = float(np.abs(np.asarray(response.json()["output"]) - stock).max())
    fields = from_config(cfg, layer).fields
    cells = [f"`{name}`", f"`{type(hf.attn).__name__}`", _mask(fields.get("mask") or []),
             _rope(fields), _norms(fields), _scale(fields), _bias(state), _other(fields),
             f"{exact:.1e}", f"{diff:.1e}", f"{diff / float(np.abs(stock).max()):.1e}"]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def cpu() -> str:
    """The CPU's model name, as lscpu gives it."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    names = [ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")]
    return names[0] if names else platform.processor() or platform.machine()


def main() -> None:
    torch.manual_seed(0)
    client = TestClient(service.main.app)
    print(f"Measured {datetime.date.today().isoformat()}: torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {cpu()} ({platform.machine()}, "
          f"{os.cpu_count()} CPUs).")  # fmt: skip
    print()
    print("| case | transformers class | mask | RoPE (style, part, base) | norms | scale | "
          "bias | other | float64 | max \\|diff\\| | ÷ max \\|output\\| |")  # fmt: skip
    print("| --- " * 11 + "|")
    for case in CASES:
        print(row(client, case))


if __name__ == "__main__":
    main()
