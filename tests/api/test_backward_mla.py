"""The backward pass through multi-head latent attention (API.md, "The backward pass, every
step"; docs/api.md 2.13): ``grad_output`` on an ``mla`` layer, against torch.autograd in float64
of transformers' own ``DeepseekV3Attention`` (and DeepSeek V2's, through ``config``), built from
tiny configs with the harness's float64 patches: q_lora_rank set and unset, rope_interleave on
and off, YaRN with mscale_all_dim, a causal mask, a batch; to 1e-10. The intermediates' gradients
are read off the layer with ``retain_grad`` on what its forward computes (the latents' norms, the
projections, RoPE's outputs, eager attention's query and key)."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

pytestmark = pytest.mark.torch

BAR = 1e-10
F64 = torch.float64
T = torch.Tensor
YARN = {"factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
ORIGINAL = 64  # YaRN's original context


def close(ours: Any, theirs: T | None, name: str) -> float:
    assert theirs is not None, name
    a = np.asarray(ours, dtype=np.float64)
    b = theirs.detach().numpy()
    assert a.shape == b.shape, f"{name}: {a.shape} vs {b.shape}"
    diff = float(np.max(np.abs(a - b))) / max(1.0, float(np.max(np.abs(b))))
    assert diff < BAR, f"{name}: {diff}"
    return diff


def back(out: Any, grad: T) -> None:
    """out.backward(grad): torch's Tensor.backward is untyped."""
    out.backward(grad)


# case: (q_lora_rank, qk_rope_head_dim, rope_interleave, attention_bias, batch, yarn)
CASES: dict[str, tuple[int | None, int, bool, bool, int | None, bool]] = {
    "q_lora-interleave-bias": (6, 4, True, True, None, False),
    "q_proj-half-batch": (None, 4, False, False, 2, False),
    "q_lora-half-batch-bias": (6, 4, False, True, 2, False),
    "q_proj-interleave": (None, 4, True, False, None, False),
    "yarn-interleave-q_lora": (6, 8, True, False, None, True),
    "yarn-half-q_proj-batch": (None, 8, False, False, 2, True),
}
L = 5
AGREEMENT: dict[str, float] = {}  # case -> the largest relative difference (the report's table)


def _config(case: str) -> Any:
    from transformers import DeepseekV3Config

    q_lora, rope_dim, interleave, bias, _, yarn = CASES[case]
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": 10000.0}
    more: dict[str, Any] = {}
    if yarn:
        rope = {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            **YARN,
            "original_max_position_embeddings": ORIGINAL,
        }
        more["max_position_embeddings"] = 40 * ORIGINAL
    config = DeepseekV3Config(
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=q_lora,
        kv_lora_rank=8,
        qk_nope_head_dim=4,
        qk_rope_head_dim=rope_dim,
        v_head_dim=6,
        rope_interleave=interleave,
        attention_bias=bias,
        num_hidden_layers=1,
        vocab_size=10,
        intermediate_size=8,
        moe_intermediate_size=8,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        rope_parameters=rope,
        **more,
    )
    config._attn_implementation = "eager"
    return config


@contextmanager
def _kept(modeling: Any, names: tuple[str, ...], seen: dict[str, T]) -> Iterator[None]:
    """The module's functions ``names`` wrapped: their tensor arguments and results kept in
    ``seen`` (with retain_grad) as ``<function>.in<i>`` and ``<function>.out<i>``."""
    saved = {name: getattr(modeling, name) for name in names}

    def wrapped(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            for i, a in enumerate(args):
                if isinstance(a, T) and a.requires_grad:
                    a.retain_grad()
                    seen[f"{name}.in{i}"] = a
            out = f(*args, **kwargs)
            for i, a in enumerate(out):
                if isinstance(a, T) and a.requires_grad:
                    a.retain_grad()
                    seen[f"{name}.out{i}"] = a
            return out

        return call

    for name, f in saved.items():
        setattr(modeling, name, wrapped(name, f))
    try:
        yield
    finally:
        for name, f in saved.items():
            setattr(modeling, name, f)


def _autograd(case: str, rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, T], Any]:
    """The layer, its request body and what autograd gives: grad_x, every parameter's, and the
    intermediates' (named as the service names them, (B, …))."""
    from transformers import modeling_rope_utils as hf_rope
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling

    from harness.hf_reference import _widened, float64_torch_in

    config = _config(case)
    q_lora, rope_dim, interleave, _, batch, yarn = CASES[case]
    attn = modeling.DeepseekV3Attention(config, 0).double().eval()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            scale = (
                0.3 if name.endswith("norm.weight") else p.shape[-1] ** -0.5 if p.ndim == 2 else 0.5
            )
            p.copy_(
                torch.as_tensor(
                    (1.0 if name.endswith("norm.weight") else 0.0)
                    + scale * rng.normal(size=p.shape)
                )
            )
    B = batch or 1
    x = torch.tensor(rng.normal(size=(B, L, 16)), dtype=F64, requires_grad=True)
    g = torch.tensor(rng.normal(size=(B, L, 16)), dtype=F64)
    at = list(range(ORIGINAL, ORIGINAL + L)) if yarn else list(range(L))
    pos = torch.tensor(at)[None].expand(B, -1)
    allowed = torch.ones(L, L, dtype=torch.bool).tril()
    additive = torch.zeros(B, 1, L, L, dtype=F64).masked_fill(~allowed, torch.finfo(F64).min)
    seen: dict[str, T] = {}
    hooks = []
    for module in (
        "q_a_layernorm",
        "kv_a_layernorm",
        "q_proj",
        "q_b_proj",
        "kv_b_proj",
        "kv_a_proj_with_mqa",
    ):
        if getattr(attn, module, None) is None:
            continue

        def keep(_: Any, __: Any, out: T, name: str = module) -> None:
            out.retain_grad()
            seen[name] = out

        hooks.append(getattr(attn, module).register_forward_hook(keep))
    rotary = "apply_rotary_pos_emb_interleave" if interleave else "apply_rotary_pos_emb"
    with (
        float64_torch_in(modeling, hf_rope),
        _widened(),
        _kept(modeling, (rotary, "eager_attention_forward"), seen),
    ):
        emb = modeling.DeepseekV3RotaryEmbedding(config)(x, pos)
        out, _ = attn(hidden_states=x, position_embeddings=emb, attention_mask=additive)
        back(out, g)
    for hook in hooks:
        hook.remove()
    h, nope = 2, 4
    kv = seen["kv_b_proj"].grad
    assert kv is not None and x.grad is not None
    kv = kv.view(B, L, h, nope + 6).transpose(1, 2)
    q_src = seen["q_proj" if q_lora is None else "q_b_proj"].grad
    assert q_src is not None
    theirs: dict[str, T | None] = {
        "grad_x": x.grad,
        "grad_c_kv": seen["kv_a_layernorm"].grad,
        "grad_k_rope": seen[f"{rotary}.out1"].grad,  # (B, 1, S, r): summed over the heads
        "grad_q_rope": seen[f"{rotary}.out0"].grad,
        "grad_q_rotated": seen["eager_attention_forward.in1"].grad,
        "grad_k_rotated": seen["eager_attention_forward.in2"].grad,
        "grad_v": kv[..., nope:],
        "grad_k_nope": kv[..., :nope],
        "grad_q": q_src.view(B, L, h, -1).transpose(1, 2),
        "grad_k_pe": seen["kv_a_proj_with_mqa"].grad[..., 8:],  # type: ignore[index]
    }
    if q_lora is not None:
        theirs["grad_c_q"] = seen["q_a_layernorm"].grad
    assert theirs["grad_k_rope"] is not None
    theirs["grad_k_rope"] = theirs["grad_k_rope"][:, 0]
    body: dict[str, Any] = {
        "x": (x[0] if batch is None else x).tolist(),
        "num_heads": h,
        **{k: v.detach().tolist() for k, v in attn.state_dict().items()},
        "mla": {
            "q_lora_rank": q_lora,
            "kv_lora_rank": 8,
            "qk_nope_head_dim": nope,
            "qk_rope_head_dim": rope_dim,
            "v_head_dim": 6,
            "eps": 1e-6,
        },
        "rope": {"base": 10000.0, "style": "interleaved" if interleave else "half"},
        "mask": {"type": "causal"},
        "grad_output": (g[0] if batch is None else g).tolist(),
        "include": [
            "heads",
            "grad_x",
            "grad_c_q",
            "grad_c_kv",
            "grad_k_rope",
            "grad_state_dict",
            "grad_w_o",
            "steps",
        ],
    }
    if yarn:
        body["rope"]["scaling"] = {"type": "yarn", **YARN, "original_max_position": ORIGINAL}
        body["positions"] = body["context_positions"] = at
    return body, {k: v for k, v in theirs.items() if v is not None}, attn


def _unbatched(a: T, batch: int | None) -> T:
    return a[0] if batch is None else a


@pytest.mark.parametrize("case", list(CASES))
def test_mla_gradients_equal_autograd_of_deepseek_v3_attention(
    client: TestClient, case: str
) -> None:
    """Every gradient through the latents against torch.autograd of DeepseekV3Attention in
    float64: grad_x, grad_state_dict keyed exactly as named_parameters(), the latents'
    (grad_c_q, grad_c_kv), the shared key's (grad_k_rope, summed over the heads), each head's
    parts of Q and K, V, and Q before RoPE."""
    body, theirs, attn = _autograd(case, np.random.default_rng(sorted(CASES).index(case)))
    r = client.post("/multihead", json=body)
    assert r.status_code == 200, r.text
    ans = r.json()
    batch = CASES[case][4]
    diffs = [close(ans["grad_x"], _unbatched(theirs["grad_x"], batch), "grad_x")]
    ours = ans["grad_state_dict"]
    params = dict(attn.named_parameters())
    assert set(ours) == set(params), (sorted(ours), sorted(params))
    diffs += [close(ours[name], p.grad, name) for name, p in params.items()]
    for name in ("grad_c_q", "grad_c_kv", "grad_k_rope"):
        if name in theirs:
            diffs.append(close(ans[name], _unbatched(theirs[name], batch), name))
        else:
            assert name not in ans, name
    heads = ans["heads"]
    per_head = (
        "grad_q_rope",
        "grad_q_rotated",
        "grad_k_rotated",
        "grad_v",
        "grad_k_nope",
        "grad_q",
    )
    for i, head in enumerate(heads):
        for name in per_head:
            diffs.append(close(head[name], _unbatched(theirs[name][:, i], batch), f"{name} {i}"))
        diffs.append(
            close(head["grad_q_nope"], _unbatched(theirs["grad_q"][:, i, ..., :4], batch), "q_nope")
        )
    # each head's grad_k: its k_nope's, and its copy of k_pe's (their sum: k_pe's)
    grad_k = np.stack([np.asarray(head["grad_k"]) for head in heads])  # (h, [B,] S, nope + r)
    diffs.append(close(grad_k[..., 4:].sum(0), _unbatched(theirs["grad_k_pe"], batch), "k_pe"))
    names = [s["name"] for s in ans["steps"]]
    assert {"grad_c_kv", "grad_k_rope", "grad_x"} <= set(names)
    assert names.index("grad_k_rope") < names.index("grad_c_kv") < names.index("grad_x")
    AGREEMENT[case] = max(diffs)


@pytest.mark.parametrize(
    "case", ["deepseek_v3-mla-yarn", "deepseek_v2-mla-yarn-mscale", "deepseek_v2_lite-mla-q_proj"]
)
def test_mla_grad_state_dict_through_config(client: TestClient, case: str) -> None:
    """The layers of tests/wire/test_config_layers.py given as config + layer (DeepSeek V3,
    V2 with YaRN's mscale, V2-Lite's q_proj): grad_x and grad_state_dict against autograd of
    transformers' own DeepseekV3Attention / DeepseekV2Attention."""
    from tests.api.test_backward_forms import config_case

    grad_x, params, body = config_case(case)
    body["include"] = ["grad_x", "grad_state_dict"]
    r = client.post("/multihead", json=body)
    assert r.status_code == 200, r.text
    ans = r.json()
    assert grad_x is not None
    diffs = [close(ans["grad_x"], grad_x[0], "grad_x")]
    assert set(ans["grad_state_dict"]) == set(params)
    diffs += [close(ans["grad_state_dict"][n], p.grad, n) for n, p in params.items()]
    AGREEMENT[case] = max(diffs)


def test_mla_backward_with_sum_and_online_softmax(client: TestClient) -> None:
    """grad_output "sum" and online_softmax on an MLA layer: each head's last block's dq is its
    grad_q_rotated (the Q the scores read), its blocks' dk side by side its grad_k_rotated."""
    body, _, _ = _autograd("q_lora-interleave-bias", np.random.default_rng(7))
    body |= {"grad_output": "sum", "online_softmax": {"block_size": 2}}
    r = client.post("/multihead", json=body)
    assert r.status_code == 200, r.text
    for head in r.json()["heads"]:
        blocks = head["online_softmax_backward"]
        assert np.allclose(blocks[-1]["dq"], head["grad_q_rotated"], rtol=0, atol=1e-12)
        dk = np.concatenate([np.asarray(b["dk"]) for b in blocks], axis=-2)
        assert np.allclose(dk, head["grad_k_rotated"], rtol=0, atol=1e-12)


def test_expected_compares_an_mla_parameters_gradient(client: TestClient) -> None:
    """expected with grad_state_dict's kv_b_proj.weight on an MLA layer: compared (a match, and
    twice it a difference), never a 500; the weights' in_out rows are returned beside it."""
    body, _, _ = _autograd("q_lora-interleave-bias", np.random.default_rng(3))
    ans = client.post("/multihead", json=body | {"include": ["grad_state_dict", "grad_w_kv_b"]})
    ours = ans.json()
    given = np.asarray(ours["grad_state_dict"]["kv_b_proj.weight"])
    assert np.array_equal(np.asarray(ours["grad_w_kv_b"]), given.T)  # in_out
    for factor, match in ((1.0, True), (2.0, False)):
        expected = {"grad_state_dict": {"kv_b_proj.weight": (factor * given).tolist()}}
        body.pop("include", None)
        r = client.post("/multihead", json=body | {"expected": expected})
        assert r.status_code == 200, r.text
        (entry,) = r.json()["comparison"]
        assert entry["name"] == "grad_state_dict.kv_b_proj.weight" and entry["match"] is match
