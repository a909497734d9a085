"""Golden cases for whole attention layers: Hugging Face transformers' own modules in float64.

Each case is (name, endpoint, request body, expected outputs), as in ``harness.torch_reference``.
``scripts/make_golden.py`` stores the cases for one seed in ``tests/fixtures/golden_layers.json``;
``tests/core/test_torch_live.py`` rebuilds them for other seeds with torch and transformers installed.

The layers (``LlamaAttention``, ``Qwen3Attention``, ``Gemma2Attention``, ``GptOssAttention``)
are tiny, randomly initialised (nothing is downloaded), ``.double()``, and run by their own
``forward`` with ``config._attn_implementation = "eager"``: their projections, ``view``/
``transpose``, ``repeat_kv``, ``apply_rotary_pos_emb``, softcap, sink concatenation and
``o_proj`` are the library's code, unchanged.

What is patched for float64, and why
------------------------------------
transformers pins three steps to float32 even in a float64 model, which would limit the
reference to ~1e-7 while the suite compares to 1e-12:

1. RoPE: the rotary embedding's ``inv_freq`` is built with ``dtype=torch.float`` (the
   ``rope_init_fn`` of ``modeling_rope_utils``, e.g. ``_compute_llama3_parameters``, or the
   class's ``compute_default_rope_parameters``), and its ``forward`` computes
   ``position_ids.float() * inv_freq.to(dtype=torch.float)`` then ``cos``/``sin`` in float32.
2. Qwen3's ``q_norm``/``k_norm`` (``Qwen3RMSNorm.forward``) casts to ``torch.float32``.
3. Eager attention (Llama, Qwen3, Gemma 2) calls ``softmax(..., dtype=torch.float32)``.

All three name the dtype through their module's global ``torch`` (``torch.float`` /
``torch.float32``). :func:`float64_torch_in` replaces that global, for the modules given
(the model's ``modeling_*`` module and ``modeling_rope_utils``) and only inside the ``with``
block, by :class:`Float64Torch`: ``torch`` itself except that ``torch.float`` and
``torch.float32`` name ``torch.float64``. Nothing else changes: the library's code runs
verbatim. The rotary embedding (the model's own ``*RotaryEmbedding`` class, built from the
config) is constructed and called under that swap, and its float64 ``(cos, sin)`` are passed
to the layer as ``position_embeddings``, as the decoder model does. ``position_ids.float()``
(a tensor method, still float32) is exact for these small integer positions, and the product
with the float64 ``inv_freq`` is float64. gpt-oss's eager attention already softmaxes in the
logits' dtype.

Masks are built from transformers' own mask functions (``masking_utils.causal_mask_function``,
``sliding_window_causal_mask_function``, ``padding_mask_function``) on index grids and added
as HF's eager masks are (0 where allowed, ``finfo(float64).min`` where masked).

Every layer case checks itself when built (:func:`_check_layer`): the patched layer equals a
plain float64 computation of the request as the contract words it (torch ops only) to 1e-12,
which shows nothing stayed float32 and that the request says what the layer does, and it
equals the unpatched layer (float32 RoPE, norm and softmax) to 1e-5 as a sanity check.

Intermediates are read where the layer exposes them: forward hooks on ``q_proj``/``k_proj``/
``v_proj`` (``q``, ``k``, ``v``) and ``q_norm``/``k_norm`` (``q_normed``, ``k_normed``); a
wrapper around the module's ``apply_rotary_pos_emb`` (``q_rotated``, ``k_rotated``); a wrapper
around its ``eager_attention_forward`` (per-head ``weights`` and ``output``); for gpt-oss a
wrapper around its ``F.softmax`` (the sink column of ``probs``, ``sink_weights``).
"""

import math
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
from transformers import GptOssConfig, LlamaConfig, PreTrainedConfig, Qwen3Config
from transformers import masking_utils as hf_masks
from transformers import modeling_rope_utils as hf_rope
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.gemma2.configuration_gemma2 import Gemma2Config
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3

Case = tuple[str, str, dict[str, Any], dict[str, Any]]
T = torch.Tensor
Rand = Callable[..., np.ndarray]
MaskFn = Callable[[Any, Any, Any, Any], Any]

F64 = torch.float64
PLAIN_TOL = 1e-12  # the patched layer against the plain float64 computation
FLOAT32_TOL = 1e-5  # the patched layer against the unpatched (float32 inside) layer


class Float64Torch(types.ModuleType):
    """``torch``, except that ``torch.float`` and ``torch.float32`` name ``torch.float64``."""

    def __getattr__(self, name: str) -> Any:
        if name in ("float", "float32"):
            return F64
        return getattr(torch, name)


@contextmanager
def float64_torch_in(*modules: types.ModuleType) -> Iterator[None]:
    """Run the given transformers modules' code with :class:`Float64Torch` as their ``torch``."""
    saved = [m.torch for m in modules]
    for m in modules:
        m.torch = Float64Torch("torch")  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m, saved_torch in zip(modules, saved, strict=True):
            m.torch = saved_torch  # type: ignore[attr-defined]


def n(x: T) -> list[Any]:
    return x.detach().numpy().tolist()  # type: ignore[no-any-return]


def _t(a: Any) -> T:
    return torch.as_tensor(np.asarray(a, dtype=np.float64))


# ---- running a layer and recording what it exposes ----------------------------------------


@contextmanager
def _recording(modeling: types.ModuleType, attn: torch.nn.Module) -> Iterator[dict[str, T]]:
    """Record the layer's intermediates (see the module docstring) into the yielded dict."""
    rec: dict[str, T] = {}
    saved = {
        name: getattr(modeling, name)
        for name in ("apply_rotary_pos_emb", "eager_attention_forward", "F")
        if hasattr(modeling, name)
    }

    def rotary(q: T, k: T, cos: T, sin: T, *args: Any, **kwargs: Any) -> tuple[T, T]:
        q_rot, k_rot = saved["apply_rotary_pos_emb"](q, k, cos, sin, *args, **kwargs)
        rec["q_rotated"], rec["k_rotated"] = q_rot, k_rot
        return q_rot, k_rot

    def eager(*args: Any, **kwargs: Any) -> tuple[T, T]:
        out, weights = saved["eager_attention_forward"](*args, **kwargs)
        rec["head_output"], rec["weights"] = out, weights  # (B, L, h, d_v), (B, h, L, S)
        return out, weights

    class RecordingF(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(F, name)

        @staticmethod
        def softmax(*args: Any, **kwargs: Any) -> T:
            probs = F.softmax(*args, **kwargs)
            rec["probs"] = probs
            return probs

    def hook(name: str) -> Callable[[torch.nn.Module, Any, T], None]:
        def record(module: torch.nn.Module, inputs: Any, output: T) -> None:
            rec[name] = output

        return record

    handles = [
        getattr(attn, part).register_forward_hook(hook(part))
        for part in ("q_proj", "k_proj", "v_proj", "q_norm", "k_norm")
        if hasattr(attn, part)
    ]
    modeling.apply_rotary_pos_emb = rotary  # type: ignore[attr-defined]
    modeling.eager_attention_forward = eager  # type: ignore[attr-defined]
    if "F" in saved:
        modeling.F = RecordingF("F")  # type: ignore[attr-defined]
    try:
        yield rec
    finally:
        for handle in handles:
            handle.remove()
        for name, value in saved.items():
            setattr(modeling, name, value)


def _index_mask(mask_fn: MaskFn, B: int, L: int, S: int) -> T:
    """transformers' mask function evaluated on index grids: (B, L, S) bool, True = attend."""
    b = torch.arange(B)[:, None, None]
    q_idx = torch.arange(L)[None, :, None]
    kv_idx = torch.arange(S)[None, None, :]
    allowed = mask_fn(b, torch.zeros((), dtype=torch.long), q_idx, kv_idx)
    return torch.as_tensor(allowed).expand(B, L, S).clone()


def _eager_additive(allowed: T) -> T:
    """(B, L, S) bool -> (B, 1, L, S) as HF's eager masks: 0 allowed, finfo(float64).min masked."""
    zero = torch.zeros(allowed.shape, dtype=F64)
    return zero.masked_fill(~allowed, torch.finfo(F64).min)[:, None]


@contextmanager
def _widened() -> Iterator[None]:
    """What no swap of ``torch`` reaches, in float64 too: ``Tensor.float()`` (LongRoPE's
    exponent) and the default dtype (dynamic NTK's ``factor * seq_len`` on an integer tensor)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        with mock.patch.object(torch.Tensor, "float", torch.Tensor.double):
            yield
    finally:
        torch.set_default_dtype(default)


def _run_layer(
    modeling: types.ModuleType,
    attn: torch.nn.Module,
    rotary_cls: type[torch.nn.Module],
    config: PreTrainedConfig,
    x: T,
    positions: T,
    allowed: T,
    *,
    float64: bool,
) -> tuple[T, dict[str, T]]:
    """The layer's forward as its decoder model calls it: (cos, sin) from its own rotary
    embedding at ``positions``, the eager additive mask. With ``float64`` under
    :func:`float64_torch_in`, else as transformers ships it (float32 inside)."""
    position_ids = positions[None].expand(x.shape[0], -1)
    patched = (modeling, hf_rope) if float64 else ()
    with float64_torch_in(*patched), _widened() if float64 else nullcontext(), torch.no_grad():
        rotary = rotary_cls(config)
        cos, sin = rotary(x, position_ids)
        if float64:
            assert rotary.inv_freq.dtype == F64 and cos.dtype == F64
        with _recording(modeling, attn) as rec:
            out, weights = attn(
                hidden_states=x,
                position_embeddings=(cos, sin),
                attention_mask=_eager_additive(allowed),
            )
    assert weights is rec["weights"]
    rec["cos"], rec["sin"] = cos, sin
    return out, rec


# ---- the plain float64 computation of a request (the self-check) ---------------------------


def _yarn_inv_freq(inv: T, d: int, base: float, sc: dict[str, Any]) -> tuple[T, float]:
    """YaRN as Peng et al. 2023 word it: pair i makes L/(2π)·θ_i turns over the original
    context L; pairs turning more than beta_fast times keep θ_i, fewer than beta_slow take
    θ_i/factor, a linear ramp over the pair index between (its ends rounded out when
    truncating); cos and sin × the attention factor (mscale ratio, or 0.1·ln(factor) + 1)."""
    old, factor = sc["original_max_position"], sc["factor"]

    def pair_turning(turns: float) -> float:  # solve L·base^(−2i/d)/(2π) = turns for i
        return d * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_turning(sc.get("beta_fast", 32.0)), pair_turning(sc.get("beta_slow", 1.0))
    if sc.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    high = high + 0.001 if low == high else high
    i = torch.arange(d // 2, dtype=F64)
    interpolated_share = ((i - low) / (high - low)).clamp(0, 1)
    inv = inv * (1 - interpolated_share) + inv / factor * interpolated_share

    def m(scale: float, k: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0

    if sc.get("attention_factor") is not None:
        gain = sc["attention_factor"]
    elif sc.get("mscale") and sc.get("mscale_all_dim"):
        gain = m(factor, sc["mscale"]) / m(factor, sc["mscale_all_dim"])
    else:
        gain = m(factor)
    return inv, gain


def _rope_angles(rope: dict[str, Any], positions: T, n: int) -> tuple[T, float]:
    """(n, rotary_dim/2) angles p·θ_i, θ_i = base^(−2i/d), with the contract's scalings, and
    the factor on cos and sin. ``n``: the sequence's length (the largest query position + 1)."""
    d = rope["rotary_dim"]
    base = rope["base"]
    scaling: dict[str, Any] = rope.get("scaling") or {}
    kind = scaling.get("type")
    gain = 1.0
    if kind == "dynamic" and n > scaling["original_max_position"]:  # the base grows with n
        f, m = scaling["factor"], scaling["original_max_position"]
        base = base * (f * n / m - (f - 1)) ** (d / (d - 2))
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=F64) / d)
    pos = positions.to(F64)
    if kind == "linear":
        pos = pos / scaling["factor"]
    elif kind == "llama3":  # as Meta's LLaMA 3.1 code words it
        factor, low, high = (
            scaling["factor"],
            scaling["low_freq_factor"],
            scaling["high_freq_factor"],
        )
        old = scaling["original_max_position"]
        out = []
        for f in inv.tolist():
            wavelen = 2 * math.pi / f
            if wavelen < old / high:
                out.append(f)
            elif wavelen > old / low:
                out.append(f / factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        inv = torch.tensor(out, dtype=F64)
    elif kind == "yarn":
        inv, gain = _yarn_inv_freq(inv, d, base, scaling)
    elif kind == "longrope":  # one factor per pair, the long ones past the original context
        old = scaling["original_max_position"]
        chosen = scaling["long_factor"] if n > old else scaling["short_factor"]
        inv = inv / torch.tensor(chosen, dtype=F64)
        f = scaling.get("factor") or scaling["max_position"] / old
        gain = scaling.get("attention_factor") or (
            math.sqrt(1 + math.log(f) / math.log(old)) if f > 1 else 1.0
        )
    angles: T = pos[:, None] * inv[None, :]
    return angles, gain


def _rotate(x: T, angles: T, gain: float = 1.0) -> T:
    """'half' style rotation of the first rotary_dim features of x (..., n, d), cos and sin ×
    ``gain``."""
    r = 2 * angles.shape[-1]
    cos, sin = angles.cos() * gain, angles.sin() * gain
    x1, x2, rest = x[..., : r // 2], x[..., r // 2 : r], x[..., r:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def _plain_layer(req: dict[str, Any], allowed: T) -> tuple[T, T]:
    """The request computed as the contract words it, torch float64 ops only: (B, L, d_out)
    output and (B, h, L, S) weights. ``allowed`` (B, L, S) is the request's mask."""
    x = _t(req["x"])
    x = x if x.ndim == 3 else x[None]
    B, L, _ = x.shape
    h = req["num_heads"]

    def proj(name: str, heads: int | None = None) -> T:
        bias = req.get(f"{name}.bias")
        y = F.linear(x, _t(req[f"{name}.weight"]), None if bias is None else _t(bias))
        if heads is None:
            return y
        return y.view(B, L, heads, -1).transpose(1, 2)

    d_k = len(req["q_proj.weight"]) // h
    h_kv = len(req["k_proj.weight"]) // d_k
    q, k, v = proj("q_proj", h), proj("k_proj", h_kv), proj("v_proj", h_kv)
    if "q_norm.weight" in req:
        eps = req.get("qk_norm", {}).get("eps", 1e-6)
        q = F.rms_norm(q, (d_k,), _t(req["q_norm.weight"]), eps)
        k = F.rms_norm(k, (d_k,), _t(req["k_norm.weight"]), eps)
    if "rope" in req:
        pos = torch.tensor(req.get("positions", list(range(L))))
        ctx_pos = torch.tensor(req.get("context_positions", list(range(L))))
        n = int(pos.max()) + 1  # the keys take the queries' length
        q = _rotate(q, *_rope_angles(req["rope"], pos, n))
        k = _rotate(k, *_rope_angles(req["rope"], ctx_pos, n))
    weights, concat = plain_attend(req, q, k, v, allowed)
    return proj_out(req, concat), weights


def plain_attend(req: dict[str, Any], q: T, k: T, v: T, allowed: T) -> tuple[T, T]:
    """From the heads' Q (B, h, L, d_k) and K, V (B, h_kv, S, ·) as the layer uses them to the
    (B, h, L, S) weights and the (B, L, h·d_v) concat: GQA sharing, scale, softcap, mask, sinks;
    the request's own words, torch float64 ops only."""
    B, h, L, d_k = q.shape
    h_kv = k.shape[1]
    k, v = k.repeat_interleave(h // h_kv, dim=1), v.repeat_interleave(h // h_kv, dim=1)
    s = q @ k.transpose(-1, -2) * req.get("scale", d_k**-0.5)
    if "softcap" in req:
        s = req["softcap"] * torch.tanh(s / req["softcap"])
    s = s.masked_fill(~allowed[:, None], float("-inf"))
    if "sinks" in req:
        sink = _t(req["sinks"]).reshape(1, h, 1, 1).expand(B, h, L, 1)
        weights = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(s, dim=-1)
    return weights, (weights @ v).transpose(1, 2).reshape(B, L, -1)


def proj_out(req: dict[str, Any], concat: T) -> T:
    bias = req.get("o_proj.bias")
    return F.linear(concat, _t(req["o_proj.weight"]), None if bias is None else _t(bias))


def _check_layer(
    name: str, req: dict[str, Any], allowed: T, out64: T, w64: T, out32: T, w32: T
) -> None:
    """The float64 reference must equal the plain float64 computation of the request to 1e-12
    and the layer as shipped (float32 inside) to 1e-5; else the case is not built."""
    plain_out, plain_w = _plain_layer(req, allowed)
    for what, ours, other, tol in (
        ("output vs plain float64", out64, plain_out, PLAIN_TOL),
        ("weights vs plain float64", w64, plain_w, PLAIN_TOL),
        ("output vs unpatched layer", out64, out32, FLOAT32_TOL),
        ("weights vs unpatched layer", w64, w32, FLOAT32_TOL),
    ):
        diff = float((ours - other).abs().max())
        assert diff <= tol * max(1.0, float(other.abs().max())), f"{name}: {what} differ by {diff}"


# ---- building the Hugging Face layer cases -----------------------------------------------


def _fill(attn: torch.nn.Module, r: Rand) -> None:
    """Every parameter from ``r`` (short JSON numbers): projections ~ N(0, 1/fan_in),
    norm weights ~ 1 + N(0, 0.3²), biases and sinks ~ N(0, 0.5²)."""
    with torch.no_grad():
        for pname, p in attn.named_parameters():
            if pname.endswith("norm.weight"):
                values = 1.0 + r(*p.shape, scale=0.3)
            elif p.ndim == 2:
                values = r(*p.shape, scale=p.shape[1] ** -0.5)
            else:
                values = r(*p.shape, scale=0.5)
            p.copy_(torch.as_tensor(values))


def _layer_case(
    name: str,
    r: Rand,
    modeling: types.ModuleType,
    attn_cls: type[torch.nn.Module],
    rotary_cls: type[torch.nn.Module],
    config: PreTrainedConfig,
    *,
    layer_idx: int,
    B: int | None,
    L: int,
    positions: list[int] | None,
    mask_fn: MaskFn,
    mask_json: Any,
    extra: dict[str, Any],
    send_num_kv_heads: bool = False,
) -> Case:
    """One HF layer case. ``extra``: the request fields that the config implies (rope, scale,
    softcap, qk_norm); the state dict goes in under its own names."""
    config._attn_implementation = "eager"
    attn = attn_cls(config, layer_idx).double().eval()
    d_model = config.hidden_size
    _fill(attn, r)
    batch = 1 if B is None else B
    x = torch.as_tensor(r(batch, L, d_model))
    pos = torch.arange(L) if positions is None else torch.tensor(positions)
    allowed = _index_mask(mask_fn, batch, L, L)

    out, rec = _run_layer(modeling, attn, rotary_cls, config, x, pos, allowed, float64=True)
    out32, rec32 = _run_layer(modeling, attn, rotary_cls, config, x, pos, allowed, float64=False)

    h, h_kv = config.num_attention_heads, config.num_key_value_heads
    d = attn.head_dim
    state = {key: n(value) for key, value in attn.state_dict().items()}
    req: dict[str, Any] = {
        "x": n(x if B is not None else x[0]),
        "num_heads": h,
        **({"num_kv_heads": h_kv} if send_num_kv_heads else {}),
        **state,
        **extra,
        "mask": mask_json,
    }
    if positions is not None:  # self-attention: the keys are the same tokens
        req["positions"] = positions
        req["context_positions"] = positions
    _check_layer(name, req, allowed, out, rec["weights"], out32, rec32["weights"])

    def split(y: T, heads: int) -> T:  # (B, L, heads·d) -> (B, heads, L, d)
        return y.view(batch, L, heads, -1).transpose(1, 2)

    per_head: dict[str, T] = {
        "q": split(rec["q_proj"], h),
        "k": split(rec["k_proj"], h_kv),
        "v": split(rec["v_proj"], h_kv),
    }
    if "q_norm" in rec:  # Qwen3 normalises the (B, L, h, d) view
        per_head["q_normed"] = rec["q_norm"].transpose(1, 2)
        per_head["k_normed"] = rec["k_norm"].transpose(1, 2)
    per_head["q_rotated"] = rec["q_rotated"]
    per_head["k_rotated"] = rec["k_rotated"]
    per_head["output"] = rec["head_output"].transpose(1, 2)  # (B, h, L, d_v)
    if B is not None:  # keep the fixture small: a batch checks what the variants add
        per_head = {
            key: a
            for key, a in per_head.items()
            if key.endswith(("normed", "rotated", "sink_weights"))
        }
    if "probs" in rec:  # gpt-oss: the sink is the last column of its softmax
        per_head["sink_weights"] = rec["probs"][..., -1:]  # (B, h, L, 1)
    heads = []
    for i in range(h):
        g = i * h_kv // h  # the key/value head of query head i (repeat_kv)
        head = {}
        for key, a in per_head.items():
            rows = a[:, g] if a.shape[1] == h_kv and key[0] in "kv" else a[:, i]
            if key == "sink_weights":
                rows = rows[..., 0]
            head[key] = n(rows if B is not None else rows[0])
        heads.append(head)
    assert d == per_head["q_rotated"].shape[-1]
    expected = {
        "output": n(out if B is not None else out[0]),
        "weights": n(rec["weights"] if B is not None else rec["weights"][0]),
        "heads": heads,
    }
    return (name, "/multihead", req, expected)


def _rope_json(base: float, d: int, scaling: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"base": base, "style": "half", "rotary_dim": d, "scaling": scaling}


CAUSAL: MaskFn = hf_masks.causal_mask_function


def _llama_cases(r: Rand) -> list[Case]:
    cases: list[Case] = []
    # GQA 4/2, head_dim 4 ≠ hidden 12 / 4, biases, default RoPE θ 10000, causal
    config = LlamaConfig(
        hidden_size=12,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=4,
        attention_bias=True,
        num_hidden_layers=1,
        vocab_size=10,
        intermediate_size=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    cases.append(
        _layer_case(
            "hf_llama_gqa_bias_causal",
            r,
            modeling_llama,
            modeling_llama.LlamaAttention,
            modeling_llama.LlamaRotaryEmbedding,
            config,
            layer_idx=0,
            B=None,
            L=6,
            positions=None,
            mask_fn=CAUSAL,
            mask_json={"type": "causal"},
            extra={"rope": _rope_json(10000.0, 4)},
            send_num_kv_heads=True,
        )
    )
    # LLaMA 3.1 RoPE: head_dim 8, θ 5e5, original_max_position 256: the wavelengths 2π·θ^(i/4)
    # ≈ 6.3 (< 256/4: kept), 167 (between 64 and 256: blended), 4443 and 118 000 (> 256:
    # slowed 8×); positions 40…45; MQA (1 key/value head), no biases
    llama3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    config = LlamaConfig(
        hidden_size=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        attention_bias=False,
        num_hidden_layers=1,
        vocab_size=10,
        intermediate_size=8,
        max_position_embeddings=2048,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            **llama3,
            "original_max_position_embeddings": 256,
        },
    )
    wavelengths = 2 * math.pi * 500000.0 ** (np.arange(0, 8, 2) / 8)
    assert wavelengths[0] < 64 and 64 < wavelengths[1] < 256 and (wavelengths[2:] > 256).all()
    cases.append(
        _layer_case(
            "hf_llama3_rope_scaling_offset_positions",
            r,
            modeling_llama,
            modeling_llama.LlamaAttention,
            modeling_llama.LlamaRotaryEmbedding,
            config,
            layer_idx=0,
            B=None,
            L=6,
            positions=list(range(40, 46)),
            mask_fn=CAUSAL,
            mask_json={"type": "causal"},
            extra={
                "rope": _rope_json(
                    500000.0, 8, {"type": "llama3", **llama3, "original_max_position": 256}
                )
            },
        )
    )
    cases += _long_context_cases(r)
    # a batch of 2 with key padding (lengths 6 and 4) and causal; head_dim 6, GQA 4/2, biases
    config = LlamaConfig(
        hidden_size=12,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=6,
        attention_bias=True,
        num_hidden_layers=1,
        vocab_size=10,
        intermediate_size=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    lengths = [6, 4]
    keep = torch.arange(6)[None, :] < torch.tensor(lengths)[:, None]  # HF attention_mask, 1 = token
    cases.append(
        _layer_case(
            "hf_llama_batch_padding_causal",
            r,
            modeling_llama,
            modeling_llama.LlamaAttention,
            modeling_llama.LlamaRotaryEmbedding,
            config,
            layer_idx=0,
            B=2,
            L=6,
            positions=None,
            mask_fn=hf_masks.and_masks(CAUSAL, hf_masks.padding_mask_function(keep)),
            mask_json=[{"type": "causal"}, {"type": "padding", "key_lengths": lengths}],
            extra={"rope": _rope_json(10000.0, 6)},
        )
    )
    return cases


def _scaled_rope_case(
    name: str,
    r: Rand,
    rope_parameters: dict[str, Any],
    scaling: dict[str, Any],
    *,
    head_dim: int,
    max_position: int,
    positions: list[int] | None,
) -> Case:
    """A LlamaAttention (2 heads, no biases, causal) whose rotary embedding scales RoPE for a
    long context (rope_type yarn, dynamic or longrope), and the request saying the same."""
    config = LlamaConfig(
        hidden_size=2 * head_dim, num_attention_heads=2, num_key_value_heads=2,
        head_dim=head_dim, attention_bias=False, num_hidden_layers=1, vocab_size=10,
        intermediate_size=8, max_position_embeddings=max_position,
        rope_parameters={"rope_theta": 10000.0, **rope_parameters},
    )  # fmt: skip
    return _layer_case(
        name, r, modeling_llama, modeling_llama.LlamaAttention,
        modeling_llama.LlamaRotaryEmbedding, config, layer_idx=0, B=None, L=6,
        positions=positions, mask_fn=CAUSAL, mask_json={"type": "causal"},
        extra={"rope": _rope_json(10000.0, head_dim, scaling)},
    )  # fmt: skip


def _long_context_cases(r: Rand) -> list[Case]:
    """YaRN, dynamic NTK and LongRoPE in a LlamaAttention. YaRN (as gpt-oss: no truncation):
    head_dim 16, original context 32, beta_fast 4, beta_slow 1: pair 0 turns 5.1 times over
    32 positions (kept), pair 1 1.6 times (blended), the others under once (θ/8); at positions
    40…45. Dynamic NTK: trained on 16, positions 20…25 (n = 26: the base grows). LongRoPE
    (Phi-3's rotary code is LlamaRotaryEmbedding's with rope_type longrope): original 16, max 64
    (attention factor √1.5), at positions 0…5 (short_factor) and 30…35 (long_factor)."""
    yarn = {"factor": 8.0, "beta_fast": 4.0, "beta_slow": 1.0, "truncate": False}
    longrope = {"short_factor": [1.0, 1.2, 1.5, 2.0], "long_factor": [1.0, 2.5, 4.0, 8.0]}
    return [
        _scaled_rope_case(
            "hf_llama_yarn_past_the_original_context", r,
            {"rope_type": "yarn", **yarn, "original_max_position_embeddings": 32},
            {"type": "yarn", **yarn, "original_max_position": 32},
            head_dim=16, max_position=256, positions=list(range(40, 46)),
        ),
        _scaled_rope_case(
            "hf_llama_dynamic_ntk_past_max_position", r,
            {"rope_type": "dynamic", "factor": 2.0},
            {"type": "dynamic", "factor": 2.0, "original_max_position": 16},
            head_dim=8, max_position=16, positions=list(range(20, 26)),
        ),
        *(
            _scaled_rope_case(
                f"hf_llama_longrope_{side}", r,
                {"rope_type": "longrope", **longrope, "original_max_position_embeddings": 16},
                {"type": "longrope", **longrope, "original_max_position": 16, "max_position": 64},
                head_dim=8, max_position=64, positions=at,
            )
            for side, at in (("short", None), ("long", list(range(30, 36))))
        ),
    ]  # fmt: skip


def _qwen3_cases(r: Rand) -> list[Case]:
    cases: list[Case] = []
    for name, eps, B in (
        ("hf_qwen3_qk_norm_causal", 1e-6, None),
        ("hf_qwen3_qk_norm_eps_batch", 1e-3, 2),
    ):
        config = Qwen3Config(
            hidden_size=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=4,
            rms_norm_eps=eps,
            num_hidden_layers=1,
            vocab_size=10,
            intermediate_size=8,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        )
        extra: dict[str, Any] = {"rope": _rope_json(1000000.0, 4)}
        if eps != 1e-6:  # q_norm.weight/k_norm.weight alone mean rms with eps 1e-6
            extra["qk_norm"] = {"type": "rms", "eps": eps}
        cases.append(
            _layer_case(
                name,
                r,
                modeling_qwen3,
                modeling_qwen3.Qwen3Attention,
                modeling_qwen3.Qwen3RotaryEmbedding,
                config,
                layer_idx=0,
                B=B,
                L=5,
                positions=None,
                mask_fn=CAUSAL,
                mask_json={"type": "causal"},
                extra=extra,
            )
        )
    return cases


def _gemma2_cases(r: Rand) -> list[Case]:
    cases: list[Case] = []
    # query_pre_attn_scalar 24 ≠ head_dim 4: scale 24^−½; softcap 5 (the default 50 hardly
    # bends these small scores); layer 1 is a full-attention layer, layer 0 a sliding one
    window = 3
    for name, layer_idx, mask_fn, mask_json in (
        ("hf_gemma2_softcap_causal", 1, CAUSAL, {"type": "causal"}),
        (
            "hf_gemma2_softcap_sliding_window",
            0,
            hf_masks.sliding_window_causal_mask_function(window),
            [{"type": "causal"}, {"type": "window", "left": window - 1, "right": 0}],
        ),
    ):
        config = Gemma2Config(
            hidden_size=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=4,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=5.0,
            sliding_window=window,
            num_hidden_layers=2,
            vocab_size=10,
            intermediate_size=8,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
        layer_types = config.layer_types or []
        assert layer_types[layer_idx] == ("full_attention", "sliding_attention")[1 - layer_idx]
        cases.append(
            _layer_case(
                name,
                r,
                modeling_gemma2,
                modeling_gemma2.Gemma2Attention,
                modeling_gemma2.Gemma2RotaryEmbedding,
                config,
                layer_idx=layer_idx,
                B=None,
                L=7,
                positions=None,
                mask_fn=mask_fn,
                mask_json=mask_json,
                extra={"rope": _rope_json(10000.0, 4), "scale": 24**-0.5, "softcap": 5.0},
            )
        )
    return cases


def _gpt_oss_cases(r: Rand) -> list[Case]:
    cases: list[Case] = []
    # GptOssConfig defaults to YaRN RoPE (factor 32) when rope_parameters is None; the contract
    # has no YaRN, so the plain (default) RoPE is asked for explicitly
    window = 3
    for name, layer_idx, B, mask_fn, mask_json in (
        ("hf_gpt_oss_sinks_causal", 1, None, CAUSAL, {"type": "causal"}),
        (
            "hf_gpt_oss_sinks_sliding_batch",
            0,
            2,
            hf_masks.sliding_window_causal_mask_function(window),
            [{"type": "causal"}, {"type": "window", "left": window - 1, "right": 0}],
        ),
    ):
        config = GptOssConfig(
            hidden_size=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=4,
            attention_bias=True,
            sliding_window=window,
            num_hidden_layers=2,
            vocab_size=10,
            intermediate_size=8,
            num_local_experts=2,
            num_experts_per_tok=1,
            rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
        )
        cases.append(
            _layer_case(
                name,
                r,
                modeling_gpt_oss,
                modeling_gpt_oss.GptOssAttention,
                modeling_gpt_oss.GptOssRotaryEmbedding,
                config,
                layer_idx=layer_idx,
                B=B,
                L=6,
                positions=None,
                mask_fn=mask_fn,
                mask_json=mask_json,
                extra={"rope": _rope_json(150000.0, 4)},
                send_num_kv_heads=True,
            )
        )
    return cases


# ---- torch itself: nn.MultiheadAttention and scaled_dot_product_attention -----------------


def _torch_mha_case(r: Rand) -> list[Case]:
    """nn.MultiheadAttention(batch_first=True) with key_padding_mask and a boolean attn_mask,
    both in torch's polarity (True = masked), and its state dict under its own names."""
    B, L, d_model, h = 2, 5, 8, 2
    m = torch.nn.MultiheadAttention(d_model, h, batch_first=True, dtype=F64)
    with torch.no_grad():
        m.in_proj_weight.copy_(torch.as_tensor(r(3 * d_model, d_model, scale=d_model**-0.5)))
        m.in_proj_bias.copy_(torch.as_tensor(r(3 * d_model, scale=0.5)))
        m.out_proj.weight.copy_(torch.as_tensor(r(d_model, d_model, scale=d_model**-0.5)))
        m.out_proj.bias.copy_(torch.as_tensor(r(d_model, scale=0.5)))
    m.eval()
    x = torch.as_tensor(r(B, L, d_model))
    key_padding_mask = torch.tensor([[False] * 5, [False, False, False, True, True]])
    attn_mask = torch.as_tensor(r(L, L) > 0.3)  # True = masked
    attn_mask[:, 0] = False  # every query keeps key 0: no fully masked row
    with torch.no_grad():
        out, w = m(
            x,
            x,
            x,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            need_weights=True,
            average_attn_weights=False,
        )
        _, w_avg = m(x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask)
    sd = m.state_dict()
    request = {
        "x": n(x),
        "num_heads": h,
        "weight_layout": "out_in",
        **{key: n(sd[key]) for key in ("in_proj_weight", "in_proj_bias", "out_proj.weight")},
        "out_proj.bias": n(sd["out_proj.bias"]),
        "key_padding_mask": key_padding_mask.tolist(),
        "mask": {"type": "boolean", "matrix": attn_mask.tolist(), "true_means": "masked"},
    }
    expected = {
        "output": n(out),
        "weights": n(w),
        "average_weights": n(w_avg),
        "heads": [{"weights": n(w[:, i])} for i in range(h)],
    }
    return [("torch_mha_key_padding_bool_attn_mask", "/multihead", request, expected)]


def _sdpa_direct_cases(r: Rand) -> list[Case]:
    """Direct multi-head tensors (no projections) against F.scaled_dot_product_attention with
    enable_gqa, float64; the weights from a float64 softmax of q kᵀ · scale, masked."""
    cases: list[Case] = []
    for name, B, h, h_kv, L, S, d_k, d_v, causal, scale in (
        ("sdpa_direct_gqa_causal_batch", 2, 4, 2, 4, 6, 3, 5, True, None),
        ("sdpa_direct_mqa_scale_unbatched", None, 3, 1, 4, 5, 2, 2, False, 0.7),
    ):
        batch = 1 if B is None else B
        q = torch.as_tensor(r(batch, h, L, d_k))
        k = torch.as_tensor(r(batch, h_kv, S, d_k))
        v = torch.as_tensor(r(batch, h_kv, S, d_v))
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, enable_gqa=True
        )  # (B, h, L, d_v)
        kk = k.repeat_interleave(h // h_kv, dim=1)
        s = q @ kk.transpose(-1, -2) * (d_k**-0.5 if scale is None else scale)
        if causal:  # upper-left, as torch's is_causal: tril(ones(L, S))
            s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
        weights = torch.softmax(s, dim=-1)
        vv = v.repeat_interleave(h // h_kv, dim=1)
        torch.testing.assert_close(weights @ vv, out, rtol=1e-13, atol=1e-13)
        concat = out.transpose(1, 2).reshape(batch, L, h * d_v)  # w_o defaults to identity

        def un(a: T, batched: bool = B is not None) -> list[Any]:
            return n(a if batched else a[0])

        request: dict[str, Any] = {
            "q": un(q),
            "k": un(k),
            "v": un(v),
            "num_heads": h,
            **({"mask": {"type": "causal"}} if causal else {}),
            **({"scale": scale} if scale is not None else {}),
        }
        expected = {
            "output": un(concat),
            "weights": un(weights),
            "heads": [{"weights": un(weights[:, i]), "output": un(out[:, i])} for i in range(h)],
        }
        cases.append((name, "/multihead", request, expected))
    return cases


BUILDERS: list[Callable[[Rand], list[Case]]] = [
    _llama_cases,
    _qwen3_cases,
    _gemma2_cases,
    _gpt_oss_cases,
    _torch_mha_case,
    _sdpa_direct_cases,
]


def build_cases(seed: int) -> list[Case]:
    """Every layer case, with its weights and inputs drawn from ``seed``: this module's, then
    today's layers (``harness.hf_today``, which imports this module), drawing after them, then
    multi-head latent attention (``harness.hf_mla``), drawing last."""
    from harness.hf_mla import BUILDERS as MLA
    from harness.hf_today import BUILDERS as TODAY

    rng = np.random.default_rng(seed)

    def r(*shape: int, scale: float = 1.0) -> np.ndarray:
        return np.round(rng.normal(size=shape) * scale, 6)  # short JSON numbers

    torch.manual_seed(seed)  # module init draws, all overwritten by _fill
    cases: list[Case] = []
    for build in (*BUILDERS, *TODAY, *MLA):
        cases.extend(build(r))
    return cases
