"""docs/guide-layers.md, section 3, checked: every piece of transformers its table names keeps
float32 rounding in a float64 layer.

Each entry of :data:`FLOAT32_STEPS` runs one named piece (a class or a function of
transformers 5.23) on float64 inputs and random weights, tiny and seeded, and returns its
results beside the same step computed here in float64 throughout. Each result must differ
from the float64 one by more than 1e-12 and less than 1e-5, relative to the largest |value|:
float32 rounding, nothing else. The names in the table's second column must be exactly the
keys of :data:`FLOAT32_STEPS`, so a row without a check fails, and so does a check without a
row. The table's last column says whether section 4's swap (``torch.float`` and
``torch.float32`` read as ``torch.float64`` inside transformers' modules) makes the step
float64: each check runs under that swap too. :data:`FLOAT64_STEPS` checks the pieces the
guide says stay in float64.

The checks need torch and transformers: they skip when either is missing, unless
REQUIRE_TORCH is set (then a missing one fails), as tests/core/test_variants.py does.
"""

import math
import os
import re
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import pytest

if not os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    for _module in ("torch", "transformers"):
        pytest.importorskip(
            _module,
            reason=f"{_module} is not installed: the float32 steps are not checked "
            "(install torch==2.13.0 and transformers==5.23.0)",
        )

import torch
from torch import Tensor
from transformers import (
    DeepseekV3Config,
    Gemma2Config,
    Gemma3TextConfig,
    GptOssConfig,
    Llama4TextConfig,
    LlamaConfig,
    MistralConfig,
    PreTrainedConfig,
    Qwen3Config,
)
from transformers import modeling_rope_utils as rope_utils
from transformers.models.deepseek_v3 import modeling_deepseek_v3
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.llama import modeling_llama
from transformers.models.llama4 import modeling_llama4
from transformers.models.mistral import modeling_mistral
from transformers.models.qwen3 import modeling_qwen3

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-layers.md"
F64 = torch.float64
FLOAT64_NOISE = 1e-12  # a float32 step differs by more than this
FLOAT32_LIMIT = 1e-5  # and by less than this (the service's float32_arithmetic bound)
HEADS, KV_HEADS, HEAD_DIM, L = 4, 2, 16, 8
HIDDEN = HEADS * HEAD_DIM
THETA = 10000.0

Pairs = dict[str, tuple[Tensor, Tensor]]  # result name → (transformers', float64 here)
Check = Callable[[], Pairs]
MODELING = (
    rope_utils,
    modeling_deepseek_v3,
    modeling_gemma2,
    modeling_gemma3,
    modeling_gpt_oss,
    modeling_llama,
    modeling_llama4,
    modeling_mistral,
    modeling_qwen3,
)


def relative(theirs: Tensor, ours: Tensor) -> float:
    """max |theirs − ours| / max |ours|, in float64 (complex numbers by their modulus)."""
    return float((theirs.to(ours.dtype) - ours).abs().max() / ours.abs().max())


def randn(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


def causal_mask(n: int) -> Tensor:
    """transformers' eager mask: 0 where a key is visible, finfo(float64).min where not."""
    hidden = torch.ones(n, n, dtype=torch.bool).triu(1)  # (n, n): key after query
    mask = torch.zeros(1, 1, n, n, dtype=F64)
    return mask.masked_fill(hidden, torch.finfo(F64).min)


def softmax64(scores: Tensor) -> Tensor:
    return torch.softmax(scores, dim=-1)  # float64 in, float64 throughout


Config = TypeVar("Config", bound=PreTrainedConfig)


def small(config_class: Callable[..., Config], **extra: object) -> Config:
    """A one-layer config of 4 heads of 16, 2 key/value heads, eager attention."""
    config = config_class(
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        num_hidden_layers=1,
        intermediate_size=HIDDEN,
        **extra,
    )
    config._attn_implementation = "eager"
    return config


# --- RoPE: the inverse frequencies and the cos/sin tables -----------------------------------


def inv_freq64(base: float, dim: int) -> Tensor:
    return 1.0 / base ** (torch.arange(0, dim, 2, dtype=F64) / dim)  # (dim/2,)


def rotary_tables(
    rotary_class: Callable[[Any], torch.nn.Module],
    config: PreTrainedConfig,
    *layer_type: str,
    halves: bool = True,
) -> Pairs:
    """The rotary module's ``inv_freq`` buffer and its cos/sin for positions 0 … L − 1, beside
    the same in float64. ``halves``: the angles repeated for both halves (gpt-oss: once)."""
    rotary = rotary_class(config)
    x = torch.zeros(1, L, HIDDEN, dtype=F64)
    position_ids = torch.arange(L)[None]  # (1, L)
    cos, sin = rotary(x, position_ids, *layer_type)  # (1, L, head_dim) each
    prefix = f"{layer_type[0]}_" if layer_type else ""
    inv_freq = getattr(rotary, f"{prefix}inv_freq")
    assert cos.dtype == sin.dtype == F64
    ours = inv_freq64(THETA, HEAD_DIM)
    angles = position_ids[..., None].to(F64) * ours  # (1, L, head_dim/2)
    if halves:
        angles = torch.cat((angles, angles), dim=-1)  # (1, L, head_dim)
    return {"inv_freq": (inv_freq, ours), "cos": (cos, angles.cos()), "sin": (sin, angles.sin())}


def rope_config(config_class: type[PreTrainedConfig]) -> PreTrainedConfig:
    return small(config_class, rope_parameters={"rope_type": "default", "rope_theta": THETA})


def llama_rotary() -> Pairs:
    return rotary_tables(modeling_llama.LlamaRotaryEmbedding, rope_config(LlamaConfig))


def qwen3_rotary() -> Pairs:
    return rotary_tables(modeling_qwen3.Qwen3RotaryEmbedding, rope_config(Qwen3Config))


def mistral_rotary() -> Pairs:
    return rotary_tables(modeling_mistral.MistralRotaryEmbedding, rope_config(MistralConfig))


def gemma2_rotary() -> Pairs:
    return rotary_tables(modeling_gemma2.Gemma2RotaryEmbedding, rope_config(Gemma2Config))


def gemma3_rotary() -> Pairs:
    default = {"rope_type": "default", "rope_theta": THETA}
    config = small(
        Gemma3TextConfig,
        rope_parameters={"full_attention": default, "sliding_attention": dict(default)},
        layer_types=["full_attention"],
    )
    return rotary_tables(modeling_gemma3.Gemma3RotaryEmbedding, config, "full_attention")


def gpt_oss_rotary() -> Pairs:
    config = rope_config(GptOssConfig)
    return rotary_tables(modeling_gpt_oss.GptOssRotaryEmbedding, config, halves=False)


def deepseek_v3_rotary() -> Pairs:
    config = small(
        DeepseekV3Config,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        qk_rope_head_dim=HEAD_DIM,  # DeepSeek's rotary runs over qk_rope_head_dim
        qk_nope_head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
    )
    return rotary_tables(modeling_deepseek_v3.DeepseekV3RotaryEmbedding, config)


# --- RoPE with scaling: modeling_rope_utils' parameter functions ----------------------------

RopeFunction = Callable[[PreTrainedConfig], tuple[Tensor, float]]


def scaled_inv_freq(function: RopeFunction, rope: dict[str, object], ours: Tensor) -> Pairs:
    """``function``'s inv_freq for a LLaMA config with these rope parameters (max position
    128), beside ``ours``, the same computed here in float64."""
    config = small(LlamaConfig, rope_parameters=rope, max_position_embeddings=128)
    inv_freq, _ = function(config)
    return {"inv_freq": (inv_freq, ours)}


def linear_scaling() -> Pairs:
    rope = {"rope_type": "linear", "rope_theta": THETA, "factor": 4.0}
    ours = inv_freq64(THETA, HEAD_DIM) / 4.0
    return scaled_inv_freq(rope_utils._compute_linear_scaling_rope_parameters, rope, ours)


def dynamic_ntk() -> Pairs:
    """Grown to 3 × max_position (the function's ``seq_len``), as the decorator calls it."""
    factor, seq_len, max_position = 2.0, 384, 128
    rope = {"rope_type": "dynamic", "rope_theta": THETA, "factor": factor}
    config = small(LlamaConfig, rope_parameters=rope, max_position_embeddings=max_position)
    inv_freq, _ = rope_utils._compute_dynamic_ntk_parameters(config, seq_len=seq_len)
    grown = factor * seq_len / max_position - (factor - 1)
    base = THETA * grown ** (HEAD_DIM / (HEAD_DIM - 2))
    return {"inv_freq": (inv_freq, inv_freq64(base, HEAD_DIM))}


def yarn() -> Pairs:
    factor, original = 4.0, 32
    rope = {
        "rope_type": "yarn",
        "rope_theta": THETA,
        "factor": factor,
        "original_max_position_embeddings": original,
    }

    def correction_dim(rotations: float) -> float:
        return HEAD_DIM * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(THETA))

    low = max(math.floor(correction_dim(32)), 0)  # beta_fast 32, beta_slow 1, truncated
    high = min(math.ceil(correction_dim(1)), HEAD_DIM - 1)
    ramp = ((torch.arange(HEAD_DIM // 2, dtype=F64) - low) / (high - low)).clamp(0, 1)
    extrapolation = inv_freq64(THETA, HEAD_DIM)
    ours = extrapolation / factor * ramp + extrapolation * (1 - ramp)
    return scaled_inv_freq(rope_utils._compute_yarn_parameters, rope, ours)


def longrope() -> Pairs:
    short = [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)]  # 1.1 … : not float32 numbers
    rope = {
        "rope_type": "longrope",
        "rope_theta": THETA,
        "short_factor": short,
        "long_factor": [2 * f for f in short],
        "original_max_position_embeddings": 32,
    }
    ours = 1.0 / (
        torch.tensor(short, dtype=F64)
        * THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=F64) / HEAD_DIM)
    )
    return scaled_inv_freq(rope_utils._compute_longrope_parameters, rope, ours)


def llama3() -> Pairs:
    factor, low_factor, high_factor, original = 8.0, 1.0, 4.0, 64
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": factor,
        "low_freq_factor": low_factor,
        "high_freq_factor": high_factor,
        "original_max_position_embeddings": original,
    }
    inv_freq = inv_freq64(500000.0, HEAD_DIM)
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low_factor) / (high_factor - low_factor)
    medium = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    high, low = original / high_factor, original / low_factor  # the wavelengths' band
    ours = torch.where(wavelen > low, inv_freq / factor, inv_freq)
    ours = torch.where((wavelen >= high) & (wavelen <= low), medium, ours)
    assert (wavelen < high).any() and ((wavelen >= high) & (wavelen <= low)).any()
    return scaled_inv_freq(rope_utils._compute_llama3_parameters, rope, ours)


# --- RMSNorm and L2 norm --------------------------------------------------------------------


def rms64(x: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(norm_class: Callable[..., torch.nn.Module], gemma: bool = False) -> Pairs:
    """The norm over 64 features (random weight, eps 1e-6) beside the float64 formula:
    ``weight · x / rms(x)``, Gemma's ``(1 + weight) · x / rms(x)``."""
    norm = norm_class(HIDDEN, eps=1e-6).double()
    weight = randn(HIDDEN, seed=1)
    with torch.no_grad():
        norm.get_parameter("weight").copy_(weight)
    x = randn(2, L, HIDDEN)
    with torch.no_grad():
        theirs = norm(x)
    assert theirs.dtype == F64
    return {"normed": (theirs, (1 + weight if gemma else weight) * rms64(x, 1e-6))}


def llama4_l2_norm() -> Pairs:
    x = randn(2, L, HEADS, HEAD_DIM)
    theirs = modeling_llama4.Llama4TextL2Norm(1e-5)(x)
    assert theirs.dtype == F64
    return {"normed": (theirs, rms64(x, 1e-5))}


# --- the eager attention: its softmax -------------------------------------------------------


class Heads(torch.nn.Module):
    """What an ``eager_attention_forward`` reads from its module: the key/value groups, the
    head size, ``training`` (off), and gpt-oss's ``sinks``."""

    def __init__(self) -> None:
        super().__init__()
        self.num_key_value_groups = 1
        self.head_dim = HEAD_DIM
        self.sinks = torch.nn.Parameter(randn(HEADS, seed=3))
        self.eval()


def eager(forward: Callable[..., tuple[Tensor, Tensor]], sinks: bool = False) -> Pairs:
    """``forward(module, q, k, v, causal mask, scaling=head_dim^-½)``: its weights and output
    beside softmax and weights · V in float64 (with gpt-oss's sink column, dropped after)."""
    q, k, v = (randn(1, HEADS, L, HEAD_DIM, seed=s) for s in (4, 5, 6))
    module = Heads()
    mask = causal_mask(L)
    with torch.no_grad():
        output, weights = forward(module, q, k, v, mask, scaling=HEAD_DIM**-0.5, dropout=0.0)
    scores = q @ k.transpose(2, 3) * HEAD_DIM**-0.5 + mask  # (1, h, L, L)
    if sinks:
        sink = module.sinks.detach().reshape(1, -1, 1, 1).expand(1, HEADS, L, 1)
        ours = softmax64(torch.cat((scores, sink), dim=-1))[..., :-1]
    else:
        ours = softmax64(scores)
    assert weights.dtype == output.dtype == F64
    return {"weights": (weights, ours), "output": (output, (ours @ v).transpose(1, 2))}


# --- Llama 4: complex rotation, temperature -------------------------------------------------


def llama4_config(**extra: object) -> Llama4TextConfig:
    return small(
        Llama4TextConfig, rope_parameters={"rope_type": "default", "rope_theta": THETA}, **extra
    )


def llama4_rotary() -> Pairs:
    """``freqs_cis``, complex64, beside the float64 ``polar(1, angle)``."""
    rotary = modeling_llama4.Llama4TextRotaryEmbedding(llama4_config())
    position_ids = torch.arange(L)[None]  # (1, L)
    freqs_cis = rotary(torch.zeros(1, L, HIDDEN, dtype=F64), position_ids)  # (1, L, head_dim/2)
    angles = position_ids[..., None].to(F64) * inv_freq64(THETA, HEAD_DIM)  # (1, L, head_dim/2)
    return {"freqs_cis": (freqs_cis, torch.polar(torch.ones_like(angles), angles))}


def llama4_apply_rotary_emb() -> Pairs:
    """Rotated by a float64 (complex128) ``freqs_cis``: only q's and k's ``.float()`` rounds."""
    angles = torch.arange(L, dtype=F64)[None, :, None] * inv_freq64(THETA, HEAD_DIM)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)  # (1, L, head_dim/2), complex128
    q, k = randn(1, L, HEADS, HEAD_DIM, seed=7), randn(1, L, KV_HEADS, HEAD_DIM, seed=8)
    q_rotated, k_rotated = modeling_llama4.apply_rotary_emb(q, k, freqs_cis)
    assert q_rotated.dtype == k_rotated.dtype == F64

    def rotate(x: Tensor) -> Tensor:  # (1, L, h, head_dim)
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * freqs_cis[:, :, None, :]).flatten(3)

    return {"q_rotated": (q_rotated, rotate(q)), "k_rotated": (k_rotated, rotate(k))}


def llama4_temperature() -> Pairs:
    """A NoPE layer (``no_rope_layers=[0]``) with temperature tuning and floor_scale 2 (8192 in
    the released config, where the scale is exactly 1 up to position 8190), run by its own
    ``forward``, beside the same layer computed here in float64: the query times
    ``log1p(floor((position + 1) / floor_scale)) · attn_scale + 1``. Llama 4's eager softmax
    is float64 (FLOAT64_STEPS), so the scale is the only float32 step."""
    floor_scale, attn_scale = 2, 0.1
    config = llama4_config(
        no_rope_layers=[0],
        attn_temperature_tuning=True,
        floor_scale=floor_scale,
        attn_scale=attn_scale,
    )
    torch.manual_seed(0)
    attention = modeling_llama4.Llama4TextAttention(config, 0).double().eval()
    x = randn(1, L, HIDDEN, seed=9)
    mask = causal_mask(L)
    with torch.no_grad():
        output, weights = attention(x, position_embeddings=None, attention_mask=mask)
        positions = torch.arange(L, dtype=F64)
        scale = torch.log1p(torch.floor((positions + 1) / floor_scale)) * attn_scale + 1  # (L,)
        q = attention.q_proj(x).view(1, L, HEADS, HEAD_DIM) * scale[None, :, None, None]
        k = attention.k_proj(x).view(1, L, KV_HEADS, HEAD_DIM)
        v = attention.v_proj(x).view(1, L, KV_HEADS, HEAD_DIM)
        group = HEADS // KV_HEADS
        q, k, v = q.transpose(1, 2), k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
        ours = softmax64(q @ k.permute(0, 2, 3, 1) * HEAD_DIM**-0.5 + mask)  # (1, h, L, L)
        projected = attention.o_proj((ours @ v.transpose(1, 2)).transpose(1, 2).reshape(1, L, -1))
    assert weights.dtype == output.dtype == F64
    return {"weights": (weights, ours), "output": (output, projected)}


# --- the table ------------------------------------------------------------------------------

FLOAT32_STEPS: dict[str, Check] = {
    "LlamaRotaryEmbedding": llama_rotary,
    "Qwen3RotaryEmbedding": qwen3_rotary,
    "MistralRotaryEmbedding": mistral_rotary,
    "Gemma2RotaryEmbedding": gemma2_rotary,
    "Gemma3RotaryEmbedding": gemma3_rotary,
    "GptOssRotaryEmbedding": gpt_oss_rotary,
    "DeepseekV3RotaryEmbedding": deepseek_v3_rotary,
    "_compute_linear_scaling_rope_parameters": linear_scaling,
    "_compute_dynamic_ntk_parameters": dynamic_ntk,
    "_compute_yarn_parameters": yarn,
    "_compute_longrope_parameters": longrope,
    "_compute_llama3_parameters": llama3,
    "LlamaRMSNorm": lambda: rms_norm(modeling_llama.LlamaRMSNorm),
    "Qwen3RMSNorm": lambda: rms_norm(modeling_qwen3.Qwen3RMSNorm),
    "MistralRMSNorm": lambda: rms_norm(modeling_mistral.MistralRMSNorm),
    "DeepseekV3RMSNorm": lambda: rms_norm(modeling_deepseek_v3.DeepseekV3RMSNorm),
    "GptOssRMSNorm": lambda: rms_norm(modeling_gpt_oss.GptOssRMSNorm),
    "Gemma2RMSNorm": lambda: rms_norm(modeling_gemma2.Gemma2RMSNorm, gemma=True),
    "Gemma3RMSNorm": lambda: rms_norm(modeling_gemma3.Gemma3RMSNorm, gemma=True),
    "Llama4TextRMSNorm": lambda: rms_norm(modeling_llama4.Llama4TextRMSNorm),
    "modeling_llama.eager_attention_forward": lambda: eager(modeling_llama.eager_attention_forward),
    "modeling_qwen3.eager_attention_forward": lambda: eager(modeling_qwen3.eager_attention_forward),
    "modeling_mistral.eager_attention_forward": lambda: eager(
        modeling_mistral.eager_attention_forward
    ),
    "modeling_gemma2.eager_attention_forward": lambda: eager(
        modeling_gemma2.eager_attention_forward
    ),
    "modeling_gemma3.eager_attention_forward": lambda: eager(
        modeling_gemma3.eager_attention_forward
    ),
    "modeling_deepseek_v3.eager_attention_forward": lambda: eager(
        modeling_deepseek_v3.eager_attention_forward
    ),
    "Llama4TextRotaryEmbedding": llama4_rotary,
    "modeling_llama4.apply_rotary_emb": llama4_apply_rotary_emb,
    "Llama4TextL2Norm": llama4_l2_norm,
    "Llama4TextAttention.forward": llama4_temperature,
}

# What the guide says stays in float64: agrees with float64 here to 1e-12.
FLOAT64_STEPS: dict[str, Check] = {
    "modeling_gpt_oss.eager_attention_forward": lambda: eager(
        modeling_gpt_oss.eager_attention_forward, sinks=True
    ),
    "modeling_llama4.eager_attention_forward": lambda: eager(
        modeling_llama4.eager_attention_forward
    ),
}


class TorchInFloat64(types.ModuleType):
    """torch itself, except that torch.float and torch.float32 mean torch.float64 (the guide's
    section 4)."""

    def __getattr__(self, name: str) -> object:
        return torch.float64 if name in ("float", "float32") else getattr(torch, name)


@contextmanager
def float64_inside(*modules: types.ModuleType) -> Iterator[None]:
    """Inside the block, the given transformers modules see TorchInFloat64 as ``torch``."""
    saved = [vars(module)["torch"] for module in modules]
    for module in modules:
        vars(module)["torch"] = TorchInFloat64("torch")
    try:
        yield
    finally:
        for module, original in zip(modules, saved, strict=True):
            vars(module)["torch"] = original


NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?")  # Class, Class.method, module.function
CELL = re.compile(r"(?<!\\)\|")  # a cell boundary (a \| inside a cell is not one)


def section_3() -> str:
    text = GUIDE.read_text()
    start = text.index("\n## 3. ")
    return text[start : text.index("\n## ", start + 1)]


def table_rows() -> list[tuple[str, set[str], bool]]:
    """Section 3's table: each row's step (first cell), the names of its second cell, and
    whether its last cell says section 4's swap makes it float64 ("yes" or "no: …")."""
    lines = [line for line in section_3().splitlines() if line.startswith("|")]
    rows = []
    for line in lines[2:]:  # after the header and the --- line
        cells = [cell.strip() for cell in CELL.split(line.strip())[1:-1]]
        code = re.findall(r"`([^`]+)`", cells[1])
        names = {t for t in code if NAME.fullmatch(t) and not t.endswith(".py")}
        assert re.match(r"(yes|no)\b", cells[-1]), f"{cells[0]!r}: the last cell is {cells[-1]!r}"
        rows.append((cells[0], names, cells[-1].startswith("yes")))
    return rows


def swapped() -> dict[str, bool]:
    """Each name of the table → whether its row says the swap makes it float64."""
    return {name: swap for _, names, swap in table_rows() for name in names}


def test_the_table_names_exactly_the_checked_steps() -> None:
    rows = table_rows()
    assert len(rows) >= 8, "section 3's table was not found"
    for step, names, _ in rows:
        assert names, f"the row {step!r} names no class or function to check"
    named = set().union(*(names for _, names, _ in rows))
    assert named == set(FLOAT32_STEPS), (
        f"in the table without a check: {sorted(named - set(FLOAT32_STEPS))}; "
        f"checked but not in the table: {sorted(set(FLOAT32_STEPS) - named)}"
    )


def test_the_guide_names_the_steps_that_stay_float64() -> None:
    text = section_3()
    assert all(f"`{name}`" in text for name in FLOAT64_STEPS)


@pytest.mark.torch
@pytest.mark.parametrize("name", list(FLOAT32_STEPS))
def test_the_step_carries_float32_rounding(name: str) -> None:
    for result, (theirs, ours) in FLOAT32_STEPS[name]().items():
        size = relative(theirs, ours)
        assert FLOAT64_NOISE < size < FLOAT32_LIMIT, f"{name}: {result} differs by {size:.1e}"


@pytest.mark.torch
@pytest.mark.parametrize("name", list(FLOAT64_STEPS))
def test_the_step_stays_float64(name: str) -> None:
    for result, (theirs, ours) in FLOAT64_STEPS[name]().items():
        size = relative(theirs, ours)
        assert size < FLOAT64_NOISE, f"{name}: {result} differs by {size:.1e}"


@pytest.mark.torch
@pytest.mark.parametrize("name", list(FLOAT32_STEPS))
def test_the_swap_of_section_4_does_what_the_table_says(name: str) -> None:
    """A row saying "yes": every result agrees with float64 to 1e-12 under the swap; "no": one
    does not."""
    with float64_inside(*MODELING):
        sizes = {result: relative(*pair) for result, pair in FLOAT32_STEPS[name]().items()}
    if swapped()[name]:
        assert max(sizes.values()) < FLOAT64_NOISE, f"{name} still differs: {sizes}"
    else:
        assert max(sizes.values()) > FLOAT64_NOISE, f"{name} is float64 under the swap: {sizes}"


def rotate_as_given(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple[Tensor, Tensor]:
    """modeling_llama4.apply_rotary_emb without ``.float()`` (the guide's section 4)."""

    def rotate(x: Tensor) -> Tensor:  # (B, L, h, head_dim)
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * freqs_cis[:, :, None, :]).flatten(3)

    return rotate(xq), rotate(xk)


def l2_norm_as_given(self: modeling_llama4.Llama4TextL2Norm, x: Tensor) -> Tensor:
    """Llama4TextL2Norm.forward without ``x.float()``: its formula in x's own dtype."""
    return rms64(x, self.eps)


@pytest.mark.torch
def test_a_llama4_rope_layer_is_float64_with_the_swap_and_two_patches() -> None:
    """The guide's claim: a Llama 4 RoPE layer with its L2 norm, under the swap of
    modeling_llama4 and modeling_rope_utils, with apply_rotary_emb and Llama4TextL2Norm.forward
    patched, equals the layer computed here in float64 to 1e-12; as shipped, it does not."""
    config = llama4_config(no_rope_layers=[1], use_qk_norm=True)
    torch.manual_seed(0)
    attention = modeling_llama4.Llama4TextAttention(config, 0).double().eval()
    assert attention.use_rope and hasattr(attention, "qk_norm")
    x, mask = randn(1, L, HIDDEN, seed=10), causal_mask(L)
    position_ids = torch.arange(L)[None]  # (1, L)

    def run() -> tuple[Tensor, Tensor]:
        freqs_cis = modeling_llama4.Llama4TextRotaryEmbedding(config)(x, position_ids)
        out, weights = attention(x, position_embeddings=freqs_cis, attention_mask=mask)
        return out, weights

    with torch.no_grad():
        stock = run()
        with (
            float64_inside(modeling_llama4, rope_utils),
            mock.patch.object(modeling_llama4, "apply_rotary_emb", rotate_as_given),
            mock.patch.object(modeling_llama4.Llama4TextL2Norm, "forward", l2_norm_as_given),
        ):
            patched = run()
        angles = position_ids[..., None].to(F64) * inv_freq64(THETA, HEAD_DIM)  # (1, L, d/2)
        freqs_cis = torch.polar(torch.ones_like(angles), angles)
        q = attention.q_proj(x).view(1, L, HEADS, HEAD_DIM)
        k = attention.k_proj(x).view(1, L, KV_HEADS, HEAD_DIM)
        v = attention.v_proj(x).view(1, L, KV_HEADS, HEAD_DIM)
        eps = config.rms_norm_eps
        q, k = (rms64(t, eps) for t in rotate_as_given(q, k, freqs_cis))
        group = HEADS // KV_HEADS
        q, k, v = q.transpose(1, 2), k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
        weights = softmax64(q @ k.permute(0, 2, 3, 1) * HEAD_DIM**-0.5 + mask)  # (1, h, L, L)
        output = attention.o_proj((weights @ v.transpose(1, 2)).transpose(1, 2).reshape(1, L, -1))
    for mine, theirs_stock, theirs_patched in zip((output, weights), stock, patched, strict=True):
        assert FLOAT64_NOISE < relative(theirs_stock, mine) < FLOAT32_LIMIT
        assert relative(theirs_patched, mine) < FLOAT64_NOISE
