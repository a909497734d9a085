"""Golden cases for multi-head latent attention (API.md, "Multi-head latent attention").

Built like :mod:`harness.hf_today`'s cases (tiny transformers 5.23 layers with random weights,
``.double()``, eager attention, run by their own ``forward``; nothing is downloaded) and
registered with :func:`harness.hf_reference.build_cases` after today's builders, so the earlier
cases keep their random draws and bytes. The layer is ``DeepseekV3Attention`` (DeepSeek V2/V3,
Kimi K2), built from tiny ``DeepseekV3Config``s (hidden 16, 2 heads with 2 key/value heads,
qk_nope_head_dim 4, v_head_dim 6, kv_lora_rank 8; L 5; causal):

- ``hf_deepseek_v3_mla_q_lora``: q_lora_rank 6 (q_a_proj → q_a_layernorm → q_b_proj),
  interleaved RoPE (``rope_interleave``), qk_rope_head_dim 4, θ 10 000, and
  ``attention_bias``: q_a_proj, kv_a_proj_with_mqa and o_proj carry biases (q_b_proj,
  kv_b_proj never do);
- ``hf_deepseek_v3_mla_no_q_lora``: q_lora_rank None (one q_proj), half-split RoPE
  (``rope_interleave`` false), qk_rope_head_dim 4, a batch of 2, no biases;
- ``hf_deepseek_v3_mla_yarn``: as DeepSeek V3 configures YaRN (factor 40, mscale 1,
  mscale_all_dim 1, beta_fast 32, beta_slow 1, truncated ramp) over an original context of 64,
  at positions 64…68, interleaved, qk_rope_head_dim 8, θ 10 000: pair 0 keeps θ, pair 1 takes
  half of θ/40 (the ramp runs over pairs 0…2), pairs 2 and 3 θ/40; cos and sin × mscale(40, 1) /
  mscale(40, 1) = 1; the softmax scale is qk_head_dim^−½ · (0.1·ln 40 + 1)² (the layer's
  ``yarn_apply_mscale``), which the request does not send (the service derives it).

The request: ``x``, ``num_heads``, the state dict under its own names, ``mla`` (the ranks and
head dims, ``eps`` of the two latent RMSNorms: ``DeepseekV3RMSNorm``'s default 1e-6, which the
layer uses whatever the config's ``rms_norm_eps``), ``rope`` (``base``, ``style``
``"interleaved"``/``"half"``, ``scaling``), the causal mask, ``positions``/
``context_positions`` when not 0…L−1.

What is patched for float64, and why
------------------------------------
As in :mod:`harness.hf_today`: ``modeling_deepseek_v3`` and ``modeling_rope_utils`` see
:class:`~harness.hf_reference.Float64Torch` as their ``torch`` (the default rope init's and
``_compute_yarn_parameters``' ``inv_freq`` ``dtype=torch.float``, the rotary forward's
``dtype=torch.float``, ``DeepseekV3RMSNorm``'s ``.to(torch.float32)`` in q_a_layernorm and
kv_a_layernorm, the eager softmax's ``dtype=torch.float32``), and
:func:`~harness.hf_reference._widened` makes ``Tensor.float()`` mean ``Tensor.double()`` (the
rotary forward's ``position_ids.float()``). The classes' own code runs verbatim; the layer is
called as ``DeepseekV3Model`` calls it, ``position_embeddings`` from its own
``DeepseekV3RotaryEmbedding`` (built and called under the patch), the causal mask from
``masking_utils.causal_mask_function`` made additive as HF's eager masks.

What is recorded, and where the layer exposes it: forward hooks on ``q_a_layernorm`` (``c_q``),
``kv_a_layernorm`` (``c_kv``), ``q_b_proj``/``q_proj`` (split as the forward splits it:
``q_nope``) and ``kv_b_proj`` (``k_nope``, ``v``); a wrapper around the module's
``apply_rotary_pos_emb_interleave``/``apply_rotary_pos_emb`` (``q_rope``, ``k_rope``: after the
rotation, in the layout it returns; the interleaved one reads pairs (2i, 2i + 1) and returns
[the pairs' first members rotated…, their second members rotated…]); and around
``eager_attention_forward`` (its query, key and value: ``q_rotated`` = cat(q_nope, q_rope),
``k_rotated`` = cat(k_nope, k_rope), ``v``; its ``weights`` and per-head ``output``). The
hooks' ``q_nope``, ``k_nope`` and ``v`` equal the slices of what eager attention receives.

Every case checks itself when built: :func:`plain_mla` computes the request as the contract
words it (torch float64 ops only); the patched layer equals it to 1e-12 and the unpatched layer
(float32 inside) to 1e-5 on every recorded array. :data:`LARGEST_DIFFS` keeps, per case and per
array, the largest differences (relative to the compared array's largest magnitude when above 1).
"""

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling

from harness.hf_reference import (
    CAUSAL,
    F64,
    FLOAT32_TOL,
    PLAIN_TOL,
    Case,
    Rand,
    T,
    _fill,
    _rope_angles,
    _rotate,
    _t,
    n,
)
from harness.hf_today import Rec, _call, _inputs, _rms, _run, _x_json

# case -> array -> {"plain": …, "float32": …}
LARGEST_DIFFS: dict[str, dict[str, dict[str, float]]] = {}

EPS = 1e-6  # DeepseekV3RMSNorm's default: q_a_layernorm and kv_a_layernorm are built without eps


# ---- the plain float64 computation of a request (the self-check) ---------------------------


def _turn(x: T, rope: dict[str, Any], positions: T, n_seq: int) -> T:
    """RoPE of x (..., n, r) at ``positions``, θ_i = base^(−2i/r) with the contract's scalings,
    cos and sin × the scaling's attention factor. ``half``: pairs (i, i + r/2). ``interleaved``:
    pairs (2i, 2i + 1), returned as transformers lays them out: [first members rotated…,
    second members rotated…]."""
    angles, gain = _rope_angles(rope, positions, n_seq)
    if rope["style"] == "half":
        return _rotate(x, angles, gain)
    assert rope["style"] == "interleaved", rope["style"]
    cos, sin = angles.cos() * gain, angles.sin() * gain
    first, second = x[..., 0::2], x[..., 1::2]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def _softmax_scale(mla: dict[str, Any], rope: dict[str, Any]) -> float:
    """qk_head_dim^−½, × mscale(factor, mscale_all_dim)² under a YaRN scaling that names
    ``mscale_all_dim`` (mscale(s, m) = 0.1·m·ln s + 1 when s > 1, else 1)."""
    scale: float = (mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]) ** -0.5
    scaling: dict[str, Any] = rope.get("scaling") or {}
    if scaling.get("type") == "yarn" and scaling.get("mscale_all_dim"):
        factor = scaling["factor"]
        m = 0.1 * scaling["mscale_all_dim"] * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale *= m * m
    return scale


def plain_mla(req: dict[str, Any], allowed: T) -> dict[str, T]:
    """The request computed as the contract words it, torch float64 ops only. ``allowed``
    (B, L, S): the request's mask. Returns (B, …) tensors: ``output``, ``weights``, ``c_q``
    (with q_lora_rank), ``c_kv``, ``k_rope`` (B, S, r), and per head (B, h, n, d) ``q_nope``,
    ``q_rope``, ``k_nope``, ``q_rotated``, ``k_rotated``, ``v``, ``head_output``."""
    x = _t(req["x"])
    x = x if x.ndim == 3 else x[None]
    B, L, _ = x.shape
    S = L  # self-attention: the keys are the same tokens
    h, mla = req["num_heads"], req["mla"]
    nope, r, d_v = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"]
    eps = mla.get("eps", EPS)
    got: dict[str, T] = {}

    def lin(name: str, y: T) -> T:
        bias = req.get(f"{name}.bias")
        return F.linear(y, _t(req[f"{name}.weight"]), None if bias is None else _t(bias))

    if mla["q_lora_rank"] is None:
        q = lin("q_proj", x)
    else:
        got["c_q"] = _rms(lin("q_a_proj", x), eps, _t(req["q_a_layernorm.weight"]))
        q = lin("q_b_proj", got["c_q"])
    q = q.view(B, L, h, nope + r).transpose(1, 2)
    q_nope, q_pe = q[..., :nope], q[..., nope:]
    kv_a = lin("kv_a_proj_with_mqa", x)  # (B, S, kv_lora_rank + r)
    r_kv = mla["kv_lora_rank"]
    c_kv = got["c_kv"] = _rms(kv_a[..., :r_kv], eps, _t(req["kv_a_layernorm.weight"]))
    k_pe = kv_a[..., r_kv:]  # (B, S, r): one rope key per token, for every head
    kv = lin("kv_b_proj", c_kv).view(B, S, h, nope + d_v).transpose(1, 2)
    k_nope, v = kv[..., :nope], kv[..., nope:]

    rope = {**req["rope"], "rotary_dim": r}
    pos = torch.tensor(req.get("positions", list(range(L))))
    ctx_pos = torch.tensor(req.get("context_positions", list(range(S))))
    n_seq = int(pos.max()) + 1  # the keys take the queries' length
    q_rope, k_rope = _turn(q_pe, rope, pos, n_seq), _turn(k_pe, rope, ctx_pos, n_seq)
    q_rotated = torch.cat([q_nope, q_rope], dim=-1)
    k_rotated = torch.cat([k_nope, k_rope[:, None].expand(B, h, S, r)], dim=-1)

    s = q_rotated @ k_rotated.transpose(-1, -2) * _softmax_scale(mla, rope)
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    weights = torch.softmax(s, dim=-1)
    head_output = weights @ v  # (B, h, L, d_v)
    concat = head_output.transpose(1, 2).reshape(B, L, h * d_v)
    got |= {
        "output": lin("o_proj", concat),
        "weights": weights,
        "k_rope": k_rope,
        "q_nope": q_nope,
        "q_rope": q_rope,
        "k_nope": k_nope,
        "q_rotated": q_rotated,
        "k_rotated": k_rotated,
        "v": v,
        "head_output": head_output,
    }
    return got


def _check(
    name: str, req: dict[str, Any], allowed: T, seen: dict[str, T], seen32: dict[str, T]
) -> None:
    """The float64 layer must equal the plain float64 computation of the request to 1e-12 and
    the layer as shipped (float32 inside) to 1e-5, on every array in ``seen``; else the case is
    not built."""
    plain = plain_mla(req, allowed)
    assert set(plain) == set(seen), (
        f"{name}: the plain computation gives {sorted(plain)}, the layer {sorted(seen)}"
    )
    largest: dict[str, dict[str, float]] = {}
    for key, ours in seen.items():
        largest[key] = {}
        for what, other, tol in (
            ("plain", plain[key], PLAIN_TOL),
            ("float32", seen32[key], FLOAT32_TOL),
        ):
            assert ours.shape == other.shape, (
                f"{name}: {key} {tuple(ours.shape)} vs {what} {tuple(other.shape)}"
            )
            diff = float((ours - other).abs().max()) / max(1.0, float(other.abs().max()))
            assert diff <= tol, f"{name}: {key} differs from the {what} one by {diff}"
            largest[key][what] = diff
    LARGEST_DIFFS[name] = largest


# ---- running the layer and building a case -------------------------------------------------


def _seen(attn: modeling.DeepseekV3Attention, out: dict[str, T], rec: Rec) -> dict[str, T]:
    """What the layer computed, as (B, …) tensors named as :func:`plain_mla` names them."""
    nope, r = attn.qk_nope_head_dim, attn.qk_rope_head_dim
    h = attn.num_heads
    rotary, other = "apply_rotary_pos_emb_interleave", "apply_rotary_pos_emb"
    if not attn.config.rope_interleave:
        rotary, other = other, rotary
    assert len(rec[rotary]) == 1 and other not in rec  # the style the config names, once
    _, (q_rope, k_rope) = _call(rec, rotary)  # (B, h, L, r), (B, 1, S, r)
    (_, query, key, value, *_), (head_out, weights) = _call(rec, "eager_attention_forward")
    q_states = rec["q_proj" if attn.q_lora_rank is None else "q_b_proj"][0]
    B, L, _ = q_states.shape
    q_nope = q_states.view(B, L, h, nope + r).transpose(1, 2)[..., :nope]
    kv = rec["kv_b_proj"][0].view(B, L, h, -1).transpose(1, 2)  # (B, h, S, nope + d_v)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    # the hooks' slices are what eager attention received
    assert torch.equal(query[..., :nope], q_nope) and torch.equal(query[..., nope:], q_rope)
    assert torch.equal(key[..., :nope], k_nope) and torch.equal(value, v)
    assert torch.equal(key[..., nope:], k_rope.expand(B, h, L, r))
    seen = {
        "output": out["output"],
        "weights": weights,
        "c_kv": rec["kv_a_layernorm"][0],
        "k_rope": k_rope[:, 0],
        "q_nope": q_nope,
        "q_rope": q_rope,
        "k_nope": k_nope,
        "q_rotated": query,
        "k_rotated": key,
        "v": value,
        "head_output": head_out.transpose(1, 2),  # (B, L, h, d_v) -> (B, h, L, d_v)
    }
    if attn.q_lora_rank is not None:
        seen["c_q"] = rec["q_a_layernorm"][0]
    return seen


def _mla_case(
    name: str,
    r: Rand,
    config: DeepseekV3Config,
    *,
    B: int | None,
    L: int,
    positions: list[int] | None,
    scaling: dict[str, Any] | None = None,
) -> Case:
    """One DeepseekV3Attention case: ``scaling`` is the request's ``rope.scaling`` saying what
    the config's ``rope_parameters`` say."""
    config._attn_implementation = "eager"
    attn = modeling.DeepseekV3Attention(config, 0).double().eval()
    _fill(attn, r)
    x, allowed = _inputs(r, config, B, L, CAUSAL)
    at = list(range(L)) if positions is None else positions
    pos = torch.tensor(at)[None].expand(x.shape[0], -1)

    def run(float64: bool) -> dict[str, T]:
        out, rec = _run(
            modeling, attn, x, allowed, float64=float64,
            embeddings=lambda: modeling.DeepseekV3RotaryEmbedding(config)(x, pos),
            outputs=("q_a_layernorm", "kv_a_layernorm", "q_proj", "q_b_proj", "kv_b_proj"),
            functions=(
                "apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave",
                "eager_attention_forward",
            ),
        )  # fmt: skip
        return _seen(attn, out, rec)

    seen, seen32 = run(True), run(False)
    for norm in (attn.q_a_layernorm, attn.kv_a_layernorm):
        assert norm is None or norm.variance_epsilon == EPS
    rope_parameters: dict[str, Any] = dict(config.rope_parameters or {})
    mla = {
        "q_lora_rank": config.q_lora_rank,
        "kv_lora_rank": config.kv_lora_rank,
        "qk_nope_head_dim": config.qk_nope_head_dim,
        "qk_rope_head_dim": config.qk_rope_head_dim,
        "v_head_dim": config.v_head_dim,
        "eps": EPS,
    }
    rope: dict[str, Any] = {
        "base": rope_parameters["rope_theta"],
        "style": "interleaved" if config.rope_interleave else "half",
    }
    if scaling is not None:
        rope["scaling"] = scaling
    state = {key: n(value) for key, value in attn.state_dict().items()}
    req: dict[str, Any] = {
        "x": _x_json(x, B),
        "num_heads": config.num_attention_heads,
        **state,
        "mla": mla,
        "rope": rope,
        "mask": {"type": "causal"},
    }
    if positions is not None:
        req["positions"] = req["context_positions"] = positions
    # the softmax scale the service must derive: the layer's own (yarn_apply_mscale)
    assert math.isclose(_softmax_scale(mla, rope), attn.scaling, rel_tol=1e-15)
    _check(name, req, allowed, seen, seen32)

    def un(a: T) -> list[Any]:
        return n(a if B is not None else a[0])

    expected: dict[str, Any] = {"output": un(seen["output"]), "weights": un(seen["weights"])}
    if "c_q" in seen:
        expected["c_q"] = un(seen["c_q"])
    expected |= {
        "c_kv": un(seen["c_kv"]),
        "k_rope": un(seen["k_rope"]),
        "mla_cache_numbers": config.kv_lora_rank + config.qk_rope_head_dim,
    }
    per_head = ("q_nope", "q_rope", "k_nope", "q_rotated", "k_rotated", "v", "weights")
    expected["heads"] = [
        {
            **{key: un(seen[key][:, i]) for key in per_head},
            "output": un(seen["head_output"][:, i]),
        }
        for i in range(config.num_attention_heads)
    ]
    return (name, "/multihead", req, expected)


def _config(
    *, q_lora_rank: int | None, rope_dim: int, interleave: bool, bias: bool, **more: Any
) -> DeepseekV3Config:
    """A one-layer DeepseekV3Config: hidden 16, 2 heads (2 key/value heads: MLA expands the
    latent per head), kv_lora_rank 8, qk_nope_head_dim 4, v_head_dim 6; θ 10 000 unless
    ``rope_parameters`` says otherwise."""
    fields: dict[str, Any] = {
        "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2,
        "q_lora_rank": q_lora_rank, "kv_lora_rank": 8, "qk_nope_head_dim": 4,
        "qk_rope_head_dim": rope_dim, "v_head_dim": 6, "rope_interleave": interleave,
        "attention_bias": bias, "num_hidden_layers": 1, "vocab_size": 10,
        "intermediate_size": 8, "moe_intermediate_size": 8,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        **more,
    }  # fmt: skip
    return DeepseekV3Config(**fields)


def _deepseek_v3_cases(r: Rand) -> list[Case]:
    yarn = {"factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
    original = 64
    yarn_config = _config(
        q_lora_rank=6, rope_dim=8, interleave=True, bias=False,
        max_position_embeddings=40 * original,
        rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, **yarn,
            "original_max_position_embeddings": original,
        },
    )  # fmt: skip
    cases = [
        _mla_case(
            "hf_deepseek_v3_mla_q_lora",
            r,
            _config(q_lora_rank=6, rope_dim=4, interleave=True, bias=True),
            B=None,
            L=5,
            positions=None,
        ),
        _mla_case(
            "hf_deepseek_v3_mla_no_q_lora",
            r,
            _config(q_lora_rank=None, rope_dim=4, interleave=False, bias=False),
            B=2,
            L=5,
            positions=None,
        ),
        _mla_case(
            "hf_deepseek_v3_mla_yarn",
            r,
            yarn_config,
            B=None,
            L=5,
            positions=list(range(original, original + 5)),
            scaling={"type": "yarn", **yarn, "original_max_position": original},
        ),
    ]
    # the YaRN ramp as the docstring says: pair 0 keeps θ, pair 1 half of θ/40, pairs 2, 3 θ/40
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=F64) / 8)
    share = torch.tensor([0.0, 0.5, 1.0, 1.0], dtype=F64)
    expected_inv = theta * (1 - share) + theta / 40 * share
    with torch.no_grad():
        inv = modeling.DeepseekV3RotaryEmbedding(yarn_config).inv_freq.double()
    assert torch.allclose(inv, expected_inv, rtol=1e-6), inv
    return cases


BUILDERS: list[Callable[[Rand], list[Case]]] = [_deepseek_v3_cases]
