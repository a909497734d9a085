"""Golden cases for today's attention layers (API.md, "Today's layers, second edition").

Built like :mod:`harness.hf_reference`'s cases (tiny transformers 5.23 layers with random
weights, ``.double()``, eager attention, run by their own ``forward``; nothing is downloaded)
and registered with its ``build_cases`` after its own builders, so the earlier cases keep their
random draws and bytes:

- ``hf_gpt_oss_yarn``: ``GptOssAttention`` with gpt-oss's kind of RoPE (YaRN, factor 32,
  beta_fast 32, beta_slow 1, no truncation) over an original context of 32, at positions
  28…35, with its sinks;
- ``hf_phi3_longrope_short``/``_long``: ``Phi3Attention`` with LongRoPE and a partial rotary
  factor (Phi-4-mini's kind of config), below and past the original context;
- ``hf_gemma4_sliding_layer``/``hf_gemma4_global_layer_k_eq_v``: ``Gemma4TextAttention``;
- ``hf_qwen3_next_gated``/``hf_qwen3_next_explicit_gate``: ``Qwen3NextAttention``'s output
  gate;
- ``hf_llama4_rope_layer_chunked``/``hf_llama4_nope_layer_temperature``:
  ``Llama4TextAttention``.

What is patched for float64, and why
------------------------------------
As in :mod:`harness.hf_reference`: the model's ``modeling_*`` module and
``modeling_rope_utils`` see :class:`~harness.hf_reference.Float64Torch` as their ``torch``
(``torch.float``/``torch.float32`` name float64: the ``inv_freq`` of every rope init function,
``ext_factors`` of LongRoPE, the proportional RoPE's zero frequencies, the eager softmax's
``dtype=torch.float32``), and :func:`~harness.hf_reference._widened` makes ``Tensor.float()``
mean ``Tensor.double()`` and float64 the default dtype. The second is what these layers need
beyond the first edition's, all through ``.float()`` on a tensor, which no swap of a module's
``torch`` reaches:

- the rotary embeddings' ``position_ids.float()`` (harmless for small positions, but widened
  anyway) and LongRoPE's ``arange(...).float()`` exponent;
- Gemma 4's ``Gemma4RMSNorm`` (``q_norm``, ``k_norm`` and the weightless ``v_norm``) computes
  in ``hidden_states.float()`` and ``self.weight.float()``;
- Qwen3-Next's ``Qwen3NextRMSNorm`` computes ``x.float()`` times ``(1.0 + self.weight.float())``;
- Llama 4's ``Llama4TextL2Norm`` computes in ``x.float()``, its ``apply_rotary_emb`` views
  ``xq.float()`` as complex (complex64 unpatched, complex128 widened, multiplied by the
  complex128 ``freqs_cis`` that ``Llama4TextRotaryEmbedding`` builds by ``torch.polar`` from
  the float64 angles), and its temperature tuning computes ``positions.float()``.

Nothing else changes: the classes' own code runs verbatim. Each layer is called as its decoder
model calls it: the rotary embedding (the model's own class, built and called under the patch)
gives ``position_embeddings`` (``(cos, sin)``; Gemma 4's per layer type; Llama 4's complex
``freqs_cis``), the mask is transformers' own mask function on index grids made additive as
HF's eager masks (``causal_mask_function``, ``sliding_window_causal_mask_function``,
``chunked_causal_mask_function``), and Gemma 4 gets an empty ``shared_kv_states`` dict (its
config shares no key/value layers: ``num_kv_shared_layers`` 0, the dict stays empty).

Every case checks itself when built: :func:`plain_today` computes the request as the contract
words it (torch float64 ops only); the patched layer equals it to 1e-12 and the unpatched layer
(float32 inside) to 1e-5, on ``output``, ``weights`` and the new fields (``gate``, ``gated``,
per-head ``v_normed`` and ``q_tempered``). :data:`LARGEST_DIFFS` keeps the largest differences
of each case built (relative to the compared array's largest magnitude when above 1).

What is recorded, and where the layer exposes it: forward hooks on the projections (``q``,
``k``, ``v``; Phi-3's fused ``qkv_proj`` split as its forward splits it), on the norms
(``q_normed``, ``k_normed``, ``v_normed``; Llama 4's one ``qk_norm`` module is called for the
queries then the keys), forward pre-hooks on ``q_norm`` (Qwen3-Next's query half of
``q_proj``), ``v_norm`` (Gemma 4's values before the norm: ``v_proj``'s output, or ``k_proj``'s
when keys are values) and ``o_proj`` (``gated``); wrappers around the module's
``apply_rotary_pos_emb``/``apply_rotary_emb`` (``q_rotated``, ``k_rotated``), its
``eager_attention_forward`` (``weights``, per-head ``output``, and the queries it receives:
Llama 4's ``q_tempered``) and Qwen3-Next's ``torch.sigmoid`` (``gate``).
"""

import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np
import torch
from transformers import GptOssConfig, Llama4TextConfig, Phi3Config, Qwen3NextConfig
from transformers import masking_utils as hf_masks
from transformers import modeling_rope_utils as hf_rope
from transformers.models.gemma4 import modeling_gemma4
from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig
from transformers.models.gpt_oss import modeling_gpt_oss
from transformers.models.llama4 import modeling_llama4
from transformers.models.phi3 import modeling_phi3
from transformers.models.qwen3_next import modeling_qwen3_next

from harness.hf_reference import (
    CAUSAL,
    F64,
    FLOAT32_TOL,
    PLAIN_TOL,
    Case,
    MaskFn,
    Rand,
    T,
    _eager_additive,
    _fill,
    _index_mask,
    _layer_case,
    _rope_angles,
    _rotate,
    _t,
    _widened,
    float64_torch_in,
    n,
    plain_attend,
    proj_out,
)

Rec = dict[str, list[Any]]  # what a run recorded: each name's values in call order

LARGEST_DIFFS: dict[str, dict[str, float]] = {}  # case -> {"plain": …, "float32": …}


# ---- the plain float64 computation of a request (the self-check) ---------------------------


def _rms(y: T, eps: float, weight: T | None = None) -> T:
    """y · rsqrt(mean(y²) + eps) over the last axis, times ``weight`` when given."""
    normed = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return normed if weight is None else normed * weight


def _turn(x: T, rope: dict[str, Any], positions: T, n_seq: int) -> T:
    """RoPE of x (..., n, d_k) at ``positions`` in the request's style: ``half`` (pairs (i,
    i + r/2) of the first r features), ``interleaved`` (pairs (2i, 2i + 1)), both with
    θ_i = base^(−2i/r) and the scalings of ``_rope_angles``; ``proportional`` (pairs (i,
    i + d_k/2) for i < r/2, θ_i = base^(−2i/d_k), the other features unrotated)."""
    style, r = rope.get("style", "half"), rope["rotary_dim"]
    if style == "half":
        return _rotate(x, *_rope_angles(rope, positions, n_seq))
    if style == "interleaved":
        angles, gain = _rope_angles(rope, positions, n_seq)
        cos, sin = angles.cos() * gain, angles.sin() * gain
        even, odd = x[..., 0:r:2], x[..., 1:r:2]
        turned = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
        return torch.cat([turned.flatten(-2), x[..., r:]], dim=-1)
    assert style == "proportional", style
    d = x.shape[-1]
    theta = rope["base"] ** (-torch.arange(0, r, 2, dtype=F64) / d)  # (r/2,)
    angles = positions.to(F64)[:, None] * theta[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2, p = x[..., : d // 2], x[..., d // 2 :], r // 2
    a, b = x1[..., :p], x2[..., :p]
    return torch.cat([a * cos - b * sin, x1[..., p:], b * cos + a * sin, x2[..., p:]], dim=-1)


def plain_today(req: dict[str, Any], allowed: T) -> dict[str, T]:
    """The request computed as the contract words it, torch float64 ops only. ``allowed``
    (B, L, S): the request's mask. Returns ``output`` (B, L, d_out), ``weights`` (B, h, L, S)
    and, when asked for, ``gate`` and ``gated`` (B, L, h·d_v), ``v_normed`` (B, h_kv, S, d_v),
    ``q_tempered`` (B, h, L, d_k)."""
    x = _t(req["x"])
    x = x if x.ndim == 3 else x[None]
    B, L, _ = x.shape
    h = req["num_heads"]
    got: dict[str, T] = {}

    def lin(name: str) -> T:
        bias = req.get(f"{name}.bias")
        return torch.nn.functional.linear(
            x, _t(req[f"{name}.weight"]), None if bias is None else _t(bias)
        )

    def heads(y: T, d: int) -> T:  # (B, L, n·d) -> (B, n, L, d)
        return y.view(B, L, -1, d).transpose(1, 2)

    gate_spec = req.get("gate")
    if gate_spec is True:  # q_proj's rows per head: d query rows, then d gate rows
        d_k = len(req["q_proj.weight"]) // (2 * h)
        both = lin("q_proj").view(B, L, h, 2 * d_k)
        q = both[..., :d_k].transpose(1, 2)
        gate_logits = both[..., d_k:].reshape(B, L, h * d_k)
    else:
        d_k = len(req["q_proj.weight"]) // h
        q = heads(lin("q_proj"), d_k)
        if isinstance(gate_spec, dict):
            b = gate_spec.get("b")
            gate_logits = torch.nn.functional.linear(
                x, _t(gate_spec["w"]), None if b is None else _t(b)
            )
    h_kv = len(req["k_proj.weight"]) // d_k
    k = k_raw = heads(lin("k_proj"), d_k)
    v = k_raw if req.get("k_eq_v") else heads(lin("v_proj"), len(req["v_proj.weight"]) // h_kv)

    norm: dict[str, Any] | None = req.get("qk_norm")
    if norm is None and "q_norm.weight" in req:
        norm = {"type": "rms", "eps": 1e-6}

    def qk_norm(y: T, which: str) -> T:
        assert norm is not None
        w = req.get(f"{which}_norm.weight")
        weight = None if w is None else _t(w) + (1.0 if norm.get("zero_centered") else 0.0)
        return _rms(y, norm.get("eps", 1e-6), weight)

    if norm is not None and not norm.get("after_rope"):
        q, k = qk_norm(q, "q"), qk_norm(k, "k")
    pos = torch.tensor(req.get("positions", list(range(L))))
    if req.get("rope"):
        ctx_pos = torch.tensor(req.get("context_positions", list(range(L))))
        n_seq = int(pos.max()) + 1  # the keys take the queries' length
        q, k = _turn(q, req["rope"], pos, n_seq), _turn(k, req["rope"], ctx_pos, n_seq)
    if norm is not None and norm.get("after_rope"):
        q, k = qk_norm(q, "q"), qk_norm(k, "k")
    if "temperature" in req:  # at position p: log(floor((p + 1)/floor_scale) + 1)·attn_scale + 1
        t = req["temperature"]
        factor = (
            torch.log(torch.floor((pos.to(F64) + 1) / t["floor_scale"]) + 1) * t["attn_scale"] + 1
        )
        q = got["q_tempered"] = q * factor[:, None]
    if "v_norm" in req:
        v = got["v_normed"] = _rms(v, req["v_norm"].get("eps", 1e-6))
    weights, concat = plain_attend(req, q, k, v, allowed)
    if gate_spec:
        got["gate"] = torch.sigmoid(gate_logits)
        concat = got["gated"] = concat * got["gate"]
    got["output"], got["weights"] = proj_out(req, concat), weights
    return got


def _check(
    name: str, req: dict[str, Any], allowed: T, seen: dict[str, T], seen32: dict[str, T]
) -> None:
    """The float64 layer must equal the plain float64 computation of the request to 1e-12 and
    the layer as shipped (float32 inside) to 1e-5, on every array in ``seen``; else the case is
    not built."""
    plain = plain_today(req, allowed)
    assert set(plain) == set(seen), (
        f"{name}: the plain computation gives {sorted(plain)}, the layer {sorted(seen)}"
    )
    largest = {"plain": 0.0, "float32": 0.0}
    for key, ours in seen.items():
        for what, other, tol in (
            ("plain", plain[key], PLAIN_TOL),
            ("float32", seen32[key], FLOAT32_TOL),
        ):
            assert ours.shape == other.shape, (
                f"{name}: {key} {tuple(ours.shape)} vs {what} {tuple(other.shape)}"
            )
            diff = float((ours - other).abs().max()) / max(1.0, float(other.abs().max()))
            assert diff <= tol, f"{name}: {key} differs from the {what} one by {diff}"
            largest[what] = max(largest[what], diff)
    LARGEST_DIFFS[name] = largest


# ---- running a layer and recording what it exposes ----------------------------------------


@contextmanager
def _recording(
    modeling: types.ModuleType,
    attn: torch.nn.Module,
    *,
    outputs: tuple[str, ...] = (),
    inputs: tuple[str, ...] = (),
    functions: tuple[str, ...] = (),
    torch_functions: tuple[str, ...] = (),
) -> Iterator[Rec]:
    """Record, in call order: the outputs of ``attn``'s submodules ``outputs`` (under their
    names), the first input of ``inputs`` (under ``name<``), each call of the module's
    functions ``functions`` as (args, kwargs, result) (under their names), and the results of
    the module's ``torch.<f>`` for ``torch_functions`` (under ``torch.<f>``)."""
    rec: Rec = defaultdict(list)
    handles = []
    for part in outputs:
        if getattr(attn, part, None) is not None:
            handles.append(
                getattr(attn, part).register_forward_hook(
                    lambda m, i, o, part=part: rec[part].append(o)
                )
            )
    for part in inputs:
        if getattr(attn, part, None) is not None:
            handles.append(
                getattr(attn, part).register_forward_pre_hook(
                    lambda m, i, part=part: rec[f"{part}<"].append(i[0])
                )
            )
    saved = {name: getattr(modeling, name) for name in functions}

    def wrapped(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            result = saved[name](*args, **kwargs)
            rec[name].append((args, kwargs, result))
            return result

        return call

    saved_torch = modeling.torch

    class RecordingTorch(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            f = getattr(saved_torch, name)
            if name not in torch_functions:
                return f

            def call(*args: Any, **kwargs: Any) -> Any:
                result = f(*args, **kwargs)
                rec[f"torch.{name}"].append(result)
                return result

            return call

    for name in functions:
        setattr(modeling, name, wrapped(name))
    if torch_functions:
        modeling.torch = RecordingTorch("torch")  # type: ignore[attr-defined]
    try:
        yield rec
    finally:
        for handle in handles:
            handle.remove()
        for name, value in saved.items():
            setattr(modeling, name, value)
        modeling.torch = saved_torch  # type: ignore[attr-defined]


def _run(
    modeling: types.ModuleType,
    attn: torch.nn.Module,
    x: T,
    allowed: T,
    *,
    float64: bool,
    embeddings: Callable[[], Any],
    forward_kwargs: dict[str, Any] | None = None,
    **recording: tuple[str, ...],
) -> tuple[dict[str, T], Rec]:
    """The layer's forward as its decoder model calls it, ``embeddings()`` (the model's rotary
    embedding, built and called here) its ``position_embeddings``, the eager additive mask.
    With ``float64`` under the patches of the module docstring, else as transformers ships it
    (float32 inside). Returns ``output`` and ``weights``, and what was recorded."""
    patches = (float64_torch_in(modeling, hf_rope), _widened()) if float64 else ()
    with ExitStack() as stack, torch.no_grad():
        for patch in patches:
            stack.enter_context(patch)
        emb = embeddings()
        with _recording(modeling, attn, **recording) as rec:
            out, weights = attn(
                hidden_states=x,
                position_embeddings=emb,
                attention_mask=_eager_additive(allowed),
                **(forward_kwargs or {}),
            )
    if float64:  # (the unpatched cos and sin are float32 numbers cast to x's float64)
        assert (emb if isinstance(emb, T) else emb[0]).dtype in (F64, torch.complex128)
    if "eager_attention_forward" in rec:
        assert weights is rec["eager_attention_forward"][0][2][1]
    return {"output": out, "weights": weights}, rec


# ---- building the cases --------------------------------------------------------------------


def _per_head(per_head: dict[str, T], h: int, h_kv: int, batched: bool) -> list[dict[str, Any]]:
    """Per-head expected arrays from (B, n, L, d) tensors, n = h or h_kv; a key/value head's
    arrays (names starting with k or v) go to each query head that reads it (repeat_kv)."""
    if batched:  # keep the fixture small: a batch checks what the variants add
        per_head = {
            k: a for k, a in per_head.items() if k.endswith(("normed", "rotated", "tempered"))
        }
    heads = []
    for i in range(h):
        g = i * h_kv // h
        head = {}
        for key, a in per_head.items():
            rows = a[:, g] if key[0] in "kv" and a.shape[1] == h_kv else a[:, i]
            head[key] = n(rows if batched else rows[0])
        heads.append(head)
    return heads


def _finish(
    name: str,
    req: dict[str, Any],
    allowed: T,
    seen: dict[str, T],
    seen32: dict[str, T],
    per_head: dict[str, T],
    h: int,
    h_kv: int,
    batched: bool,
) -> Case:
    _check(name, req, allowed, seen, seen32)

    def un(a: T) -> list[Any]:
        return n(a if batched else a[0])

    expected: dict[str, Any] = {"output": un(seen["output"]), "weights": un(seen["weights"])}
    for key in ("gate", "gated"):
        if key in seen:
            expected[key] = un(seen[key])
    expected["heads"] = _per_head(per_head, h, h_kv, batched)
    return (name, "/multihead", req, expected)


def _inputs(r: Rand, config: Any, B: int | None, L: int, mask_fn: MaskFn) -> tuple[T, T]:
    batch = 1 if B is None else B
    x = torch.as_tensor(r(batch, L, config.hidden_size))
    return x, _index_mask(mask_fn, batch, L, L)


def _x_json(x: T, B: int | None) -> list[Any]:
    return n(x if B is not None else x[0])


def _hl(y: T) -> T:
    """(B, L, n, d) -> (B, n, L, d)."""
    return y.transpose(1, 2)


def _gpt_oss_yarn(r: Rand) -> list[Case]:
    """gpt-oss's own kind of RoPE (its config's default: YaRN, factor 32, beta_fast 32,
    beta_slow 1, truncate False, over 4096 positions); here over an original context of 32, at
    positions 28…35. With head_dim 16 and θ 150 000 the ramp runs over pairs 0…1.09 (the
    pair turning 32 times over 32 positions would be below pair 0): pair 0 (5.1 turns) keeps θ,
    pair 1 (1.15 turns) takes 92 % of θ/32 (50 % if it truncated), pairs 2…7 θ/32; cos and sin
    × (0.1·ln 32 + 1). Sinks, biases, MQA 2/1, the full-attention layer (causal)."""
    yarn = {"factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    config = GptOssConfig(
        hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        attention_bias=True, sliding_window=3, num_hidden_layers=2, vocab_size=10,
        intermediate_size=8, num_local_experts=2, num_experts_per_tok=1,
        max_position_embeddings=1024,
        rope_parameters={
            "rope_type": "yarn", "rope_theta": 150000.0, **yarn,
            "original_max_position_embeddings": 32,
        },
    )  # fmt: skip
    assert (config.layer_types or [])[1] == "full_attention"
    scaling = {"type": "yarn", **yarn, "original_max_position": 32}
    return [
        _layer_case(
            "hf_gpt_oss_yarn", r, modeling_gpt_oss, modeling_gpt_oss.GptOssAttention,
            modeling_gpt_oss.GptOssRotaryEmbedding, config, layer_idx=1, B=None, L=8,
            positions=list(range(28, 36)), mask_fn=CAUSAL, mask_json={"type": "causal"},
            extra={"rope": {"base": 150000.0, "style": "half", "rotary_dim": 16, "scaling": scaling}},
            send_num_kv_heads=True,
        )
    ]  # fmt: skip


def _call(rec: Rec, name: str, i: int = 0) -> tuple[tuple[Any, ...], Any]:
    """The positional arguments and the result of the i-th recorded call of ``name``."""
    args, _, result = rec[name][i]
    return args, result


def _phi3_case(name: str, r: Rand, config: Phi3Config, positions: list[int]) -> Case:
    attn = modeling_phi3.Phi3Attention(config, 0).double().eval()
    _fill(attn, r)
    L, h, h_kv, d = (
        len(positions),
        config.num_attention_heads,
        config.num_attention_heads // attn.num_key_value_groups,
        attn.head_dim,
    )
    x, allowed = _inputs(r, config, None, L, CAUSAL)
    pos = torch.tensor(positions)[None]
    rope: dict[str, Any] = dict(config.rope_parameters or {})
    rotary_dim = int(d * rope["partial_rotary_factor"])
    side = (
        "long_factor"
        if max(positions) + 1 > rope["original_max_position_embeddings"]
        else "short_factor"
    )

    def embeddings() -> tuple[T, T]:
        rotary = modeling_phi3.Phi3RotaryEmbedding(config)
        cos_sin: tuple[T, T] = rotary(x, pos)
        exponent = torch.arange(0, rotary_dim, 2, dtype=F64) / rotary_dim
        chosen = 1.0 / (torch.tensor(rope[side], dtype=F64) * rope["rope_theta"] ** exponent)
        assert torch.allclose(rotary.inv_freq.double(), chosen, rtol=1e-6), side  # the side taken
        return cos_sin

    def run(float64: bool) -> tuple[dict[str, T], Rec]:
        return _run(
            modeling_phi3, attn, x, allowed, float64=float64, embeddings=embeddings,
            outputs=("qkv_proj",), functions=("apply_rotary_pos_emb", "eager_attention_forward"),
        )  # fmt: skip

    (seen, rec), (seen32, _) = run(True), run(False)
    W = attn.qkv_proj.weight
    q_rows, k_rows = h * d, (h + h_kv) * d
    # Phi-3 stores one fused qkv_proj.weight; the request sends it split as its forward splits
    # the projection: rows [0, h·d) are the queries', [h·d, h·d + h_kv·d) the keys', the rest
    # the values'
    req: dict[str, Any] = {
        "x": _x_json(x, None),
        "num_heads": h,
        "q_proj.weight": n(W[:q_rows]),
        "k_proj.weight": n(W[q_rows:k_rows]),
        "v_proj.weight": n(W[k_rows:]),
        "o_proj.weight": n(attn.o_proj.weight),
        "rope": {
            "base": rope["rope_theta"], "style": "half", "rotary_dim": rotary_dim,
            "scaling": {
                "type": "longrope",
                "short_factor": rope["short_factor"],
                "long_factor": rope["long_factor"],
                "original_max_position": rope["original_max_position_embeddings"],
                "max_position": config.max_position_embeddings,
            },
        },
        "mask": {"type": "causal"},
    }  # fmt: skip
    if positions[0]:
        req["positions"] = req["context_positions"] = positions
    qkv = rec["qkv_proj"][0]
    _, (q_rot, k_rot) = _call(rec, "apply_rotary_pos_emb")
    _, (head_out, _) = _call(rec, "eager_attention_forward")
    per_head = {
        "q": _hl(qkv[..., :q_rows].view(1, L, h, d)),
        "k": _hl(qkv[..., q_rows:k_rows].view(1, L, h_kv, d)),
        "v": _hl(qkv[..., k_rows:].view(1, L, h_kv, d)),
        "q_rotated": q_rot,
        "k_rotated": k_rot,
        "output": _hl(head_out),
    }
    return _finish(name, req, allowed, seen, seen32, per_head, h, h_kv, False)


def _phi3_cases(r: Rand) -> list[Case]:
    """Phi3Attention with LongRoPE as Phi-3 and Phi-4-mini configure it (no ``factor``: the
    attention factor comes from max_position_embeddings / original, 64/16: √(1 + ln 4/ln 16) =
    √1.5) and a partial rotary factor 0.75 (head_dim 8: 6 features turn, 3 factors per side);
    MQA 2/1, no biases, causal. The short side at positions 0…5 (n = 6 ≤ 16), the long side
    at 30…35 (n = 36 > 16)."""
    config = Phi3Config(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
        vocab_size=10, intermediate_size=8, max_position_embeddings=64,
        original_max_position_embeddings=16,
        pad_token_id=None, bos_token_id=None, eos_token_id=None,
        rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0, 1.25, 1.5], "long_factor": [1.0, 3.0, 6.0],
            "partial_rotary_factor": 0.75,
        },
    )  # fmt: skip
    config._attn_implementation = "eager"
    rope: dict[str, Any] = dict(config.rope_parameters or {})
    assert rope["original_max_position_embeddings"] == 16 and rope["partial_rotary_factor"] == 0.75
    return [
        _phi3_case("hf_phi3_longrope_short", r, config, list(range(6))),
        _phi3_case("hf_phi3_longrope_long", r, config, list(range(30, 36))),
    ]


def _gemma4_case(
    name: str,
    r: Rand,
    config: Gemma4TextConfig,
    layer_idx: int,
    mask_fn: MaskFn,
    mask_json: Any,
    extra: dict[str, Any],
) -> Case:
    attn = modeling_gemma4.Gemma4TextAttention(config, layer_idx).double().eval()
    _fill(attn, r)
    layer_type = (config.layer_types or [])[layer_idx]
    h, d, L = config.num_attention_heads, attn.head_dim, 7
    h_kv = h // attn.num_key_value_groups
    x, allowed = _inputs(r, config, None, L, mask_fn)
    pos = torch.arange(L)[None]
    shared: dict[str, Any] = {}  # Gemma 4's shared_kv_states: no layer shares here

    def run(float64: bool) -> tuple[dict[str, T], Rec]:
        seen, rec = _run(
            modeling_gemma4, attn, x, allowed, float64=float64,
            embeddings=lambda: modeling_gemma4.Gemma4TextRotaryEmbedding(config)(x, pos, layer_type),
            forward_kwargs={"shared_kv_states": shared},
            outputs=("q_proj", "k_proj", "q_norm", "k_norm", "v_norm"), inputs=("v_norm",),
            functions=("apply_rotary_pos_emb", "eager_attention_forward"),
        )  # fmt: skip
        seen["v_normed"] = _hl(rec["v_norm"][0])  # (B, h_kv, L, d)
        return seen, rec

    (seen, rec), (seen32, _) = run(True), run(False)
    assert not shared and not attn.is_kv_shared_layer and not attn.store_full_length_kv
    state = {key: n(value) for key, value in attn.state_dict().items()}
    eps = config.rms_norm_eps
    req: dict[str, Any] = {
        "x": _x_json(x, None),
        "num_heads": h,
        **state,
        "qk_norm": {"type": "rms", "eps": eps},
        "v_norm": {"type": "rms", "eps": eps},
        "scale": attn.scaling,
        **extra,
        "mask": mask_json,
    }
    assert ("v_proj.weight" in req) != bool(req.get("k_eq_v"))
    _, head_out_weights = _call(rec, "eager_attention_forward")
    _, q_rot = _call(rec, "apply_rotary_pos_emb", 0)
    _, k_rot = _call(rec, "apply_rotary_pos_emb", 1)
    per_head = {
        "q": _hl(rec["q_proj"][0].view(1, L, h, d)),
        "k": _hl(rec["k_proj"][0].view(1, L, h_kv, d)),
        "v": _hl(rec["v_norm<"][0]),  # the values entering v_norm: v_proj's, or k_proj's
        "q_normed": _hl(rec["q_norm"][0]),
        "k_normed": _hl(rec["k_norm"][0]),
        "v_normed": seen["v_normed"],
        "q_rotated": _hl(q_rot),
        "k_rotated": _hl(k_rot),
        "output": _hl(head_out_weights[0]),
    }
    return _finish(name, req, allowed, seen, seen32, per_head, h, h_kv, False)


def _gemma4_cases(r: Rand) -> list[Case]:
    """Gemma4TextAttention on a sliding layer (head_dim 4, 2 heads with 2 key/value heads,
    θ 10 000, a window of 3 keys) and a full one (as Gemma 4's global layers: global_head_dim
    16, num_global_key_value_heads 1, attention_k_eq_v, proportional RoPE θ 10⁶ with
    partial_rotary_factor 0.25: 2 of the 8 pairs turn). Both: q_norm and k_norm RMSNorms with
    weights (applied as w), a weightless v_norm, scale 1; causal."""
    window = 3
    global_layers: dict[str, Any] = {"global_head_dim": 16, "num_global_key_value_heads": 1}
    config = Gemma4TextConfig(
        hidden_size=8, num_attention_heads=2, num_key_value_heads=2, head_dim=4,
        attention_k_eq_v=True,
        sliding_window=window, num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"], vocab_size=10,
        vocab_size_per_layer_input=10, hidden_size_per_layer_input=4, intermediate_size=8,
        pad_token_id=None, bos_token_id=None, eos_token_id=None,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6,
            },
        },
        **global_layers,
    )  # fmt: skip
    config._attn_implementation = "eager"
    assert config.kv_sharing_modes == [None, None]
    turning_pairs = int(0.25 * 16 // 2)  # _compute_proportional_rope_parameters' rope_angles
    return [
        _gemma4_case(
            "hf_gemma4_sliding_layer", r, config, 0,
            hf_masks.sliding_window_causal_mask_function(window),
            [{"type": "causal"}, {"type": "window", "left": window - 1, "right": 0}],
            {"rope": {"base": 10000.0, "style": "half", "rotary_dim": 4}},
        ),
        _gemma4_case(
            "hf_gemma4_global_layer_k_eq_v", r, config, 1, CAUSAL, {"type": "causal"},
            {
                "k_eq_v": True,
                "rope": {"base": 1e6, "style": "proportional", "rotary_dim": 2 * turning_pairs},
            },
        ),
    ]  # fmt: skip


def _qwen3_next_case(
    name: str, r: Rand, config: Qwen3NextConfig, B: int | None, explicit: bool
) -> Case:
    layer_idx = (config.layer_types or []).index("full_attention")
    attn = modeling_qwen3_next.Qwen3NextAttention(config, layer_idx).double().eval()
    _fill(attn, r)
    with torch.no_grad():  # zero-centred norms store w for (1 + w): near 0, not near 1
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.copy_(torch.as_tensor(np.round(norm.weight.numpy() - 1.0, 6)))
    h, d, L = config.num_attention_heads, attn.head_dim, 6
    h_kv = h // attn.num_key_value_groups
    x, allowed = _inputs(r, config, B, L, CAUSAL)
    pos = torch.arange(L)[None].expand(x.shape[0], -1)

    def run(float64: bool) -> tuple[dict[str, T], Rec]:
        seen, rec = _run(
            modeling_qwen3_next, attn, x, allowed, float64=float64,
            embeddings=lambda: modeling_qwen3_next.Qwen3NextRotaryEmbedding(config)(x, pos),
            outputs=("k_proj", "v_proj", "q_norm", "k_norm"), inputs=("q_norm", "o_proj"),
            functions=("apply_rotary_pos_emb", "eager_attention_forward"),
            torch_functions=("sigmoid",),
        )  # fmt: skip
        seen["gate"] = rec["torch.sigmoid"][0]  # (B, L, h·d), after the sigmoid
        seen["gated"] = rec["o_proj<"][0]  # (B, L, h·d), what o_proj receives
        return seen, rec

    (seen, rec), (seen32, _) = run(True), run(False)
    state = {key: n(value) for key, value in attn.state_dict().items()}
    req: dict[str, Any] = {"x": _x_json(x, B), "num_heads": h, **state}
    if explicit:  # q_proj's rows per head are d query rows then d gate rows: split them
        for part in ("weight", "bias"):
            both = getattr(attn.q_proj, part).view(h, 2 * d, -1)
            req[f"q_proj.{part}"] = n(both[:, :d].reshape(h * d, -1).squeeze(-1))
            req.setdefault("gate", {})["w" if part == "weight" else "b"] = n(
                both[:, d:].reshape(h * d, -1).squeeze(-1)
            )
    else:
        req["gate"] = True
    rope: dict[str, Any] = dict(config.rope_parameters or {})
    rotary_dim = int(d * rope["partial_rotary_factor"])
    req |= {
        "qk_norm": {"type": "rms", "eps": config.rms_norm_eps, "zero_centered": True},
        "rope": {
            "base": rope["rope_theta"],
            "style": "half",
            "rotary_dim": rotary_dim,
        },
        "mask": {"type": "causal"},
    }
    _, (q_rot, k_rot) = _call(rec, "apply_rotary_pos_emb")
    _, (head_out, _) = _call(rec, "eager_attention_forward")
    batch = x.shape[0]
    per_head = {
        "q": _hl(rec["q_norm<"][0]),  # the query half of q_proj, as the layer splits it
        "k": _hl(rec["k_proj"][0].view(batch, L, h_kv, d)),
        "v": _hl(rec["v_proj"][0].view(batch, L, h_kv, d)),
        "q_normed": _hl(rec["q_norm"][0]),
        "k_normed": _hl(rec["k_norm"][0]),
        "q_rotated": q_rot,
        "k_rotated": k_rot,
        "output": _hl(head_out),
    }
    return _finish(name, req, allowed, seen, seen32, per_head, h, h_kv, B is not None)


def _qwen3_next_cases(r: Rand) -> list[Case]:
    """Qwen3NextAttention (its full-attention layer): q_proj with twice the rows (each head's
    query then its output gate), zero-centred q_norm/k_norm ((1 + w)), partial RoPE (head_dim
    16 × 0.25: 4 features turn; θ 10⁷ as Qwen3-Next), GQA 2/1, causal; output =
    o_proj(attention · sigmoid(gate)). As Qwen3-Next ships it (no biases, ``gate: true``), and
    with biases, the gate's rows sent apart (``gate: {w, b}``), for a batch of 2."""

    def config(bias: bool) -> Qwen3NextConfig:
        c = Qwen3NextConfig(
            hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
            attention_bias=bias, num_hidden_layers=4, vocab_size=10, intermediate_size=8,
            pad_token_id=None, bos_token_id=None, eos_token_id=None,
            rope_parameters={
                "rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            },
        )  # fmt: skip
        c._attn_implementation = "eager"
        return c

    return [
        _qwen3_next_case("hf_qwen3_next_gated", r, config(False), None, explicit=False),
        _qwen3_next_case("hf_qwen3_next_explicit_gate", r, config(True), 2, explicit=True),
    ]


def _llama4_case(
    name: str,
    r: Rand,
    config: Llama4TextConfig,
    layer_idx: int,
    mask_fn: MaskFn,
    extra: dict[str, Any],
) -> Case:
    attn = modeling_llama4.Llama4TextAttention(config, layer_idx).double().eval()
    _fill(attn, r)
    h, d, L = config.num_attention_heads, attn.head_dim, 8
    h_kv = h // attn.num_key_value_groups
    x, allowed = _inputs(r, config, None, L, mask_fn)
    pos = torch.arange(L)[None]
    tempered = bool(attn.attn_temperature_tuning and not attn.use_rope)

    def run(float64: bool) -> tuple[dict[str, T], Rec]:
        seen, rec = _run(
            modeling_llama4, attn, x, allowed, float64=float64,
            embeddings=lambda: modeling_llama4.Llama4TextRotaryEmbedding(config)(x, pos),
            outputs=("q_proj", "k_proj", "v_proj", "qk_norm"),
            functions=("apply_rotary_emb", "eager_attention_forward"),
        )  # fmt: skip
        if tempered:  # the queries eager attention receives: after the temperature
            seen["q_tempered"] = _call(rec, "eager_attention_forward")[0][1]
        return seen, rec

    (seen, rec), (seen32, _) = run(True), run(False)
    state = {key: n(value) for key, value in attn.state_dict().items()}
    req: dict[str, Any] = {"x": _x_json(x, None), "num_heads": h, **state, **extra}
    _, (head_out, _) = _call(rec, "eager_attention_forward")
    per_head = {
        "q": _hl(rec["q_proj"][0].view(1, L, h, d)),
        "k": _hl(rec["k_proj"][0].view(1, L, h_kv, d)),
        "v": _hl(rec["v_proj"][0].view(1, L, h_kv, d)),
    }
    if attn.use_rope:
        _, (q_rot, k_rot) = _call(rec, "apply_rotary_emb")
        per_head |= {"q_rotated": _hl(q_rot), "k_rotated": _hl(k_rot)}
    if "qk_norm" in rec:  # one module, called for the queries then the keys, after RoPE
        per_head |= {"q_normed": _hl(rec["qk_norm"][0]), "k_normed": _hl(rec["qk_norm"][1])}
    if tempered:
        per_head["q_tempered"] = seen["q_tempered"]
    per_head["output"] = _hl(head_out)
    return _finish(name, req, allowed, seen, seen32, per_head, h, h_kv, False)


def _llama4_cases(r: Rand) -> list[Case]:
    """Llama4TextAttention (head_dim 8, GQA 4/2, no biases) on a RoPE layer (interleaved
    pairs, θ 5·10⁵, the weightless L2 qk_norm after the rotation, the chunked mask of 3
    positions) and on a NoPE layer (``no_rope_layers[1] = 0``: no RoPE, no qk_norm, a causal
    mask) with temperature tuning: floor_scale 2 and attn_scale 0.25 over 8 positions (the
    queries × 1, 1.17, 1.17, 1.27, 1.27, 1.35, 1.35, 1.40)."""
    chunk = 3
    config = Llama4TextConfig(
        hidden_size=8, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_hidden_layers=2, no_rope_layers=[1, 0], vocab_size=10, intermediate_size=8,
        intermediate_size_mlp=8, attention_chunk_size=chunk, attn_temperature_tuning=True,
        floor_scale=2, attn_scale=0.25, use_qk_norm=True, rms_norm_eps=1e-5,
        pad_token_id=None, bos_token_id=None, eos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )  # fmt: skip
    config._attn_implementation = "eager"
    assert config.layer_types == ["chunked_attention", "full_attention"]
    no_left_padding = torch.zeros(1, dtype=torch.long)
    return [
        _llama4_case(
            "hf_llama4_rope_layer_chunked", r, config, 0,
            hf_masks.chunked_causal_mask_function(chunk, no_left_padding),
            {
                "rope": {"base": 500000.0, "style": "interleaved", "rotary_dim": 8},
                "qk_norm": {"type": "rms", "eps": 1e-5, "after_rope": True},
                "mask": [{"type": "chunked", "size": chunk}],
            },
        ),
        _llama4_case(
            "hf_llama4_nope_layer_temperature", r, config, 1, CAUSAL,
            {"temperature": {"floor_scale": 2, "attn_scale": 0.25}, "mask": {"type": "causal"}},
        ),
    ]  # fmt: skip


BUILDERS: list[Callable[[Rand], list[Case]]] = [
    _gpt_oss_yarn,
    _phi3_cases,
    _gemma4_cases,
    _qwen3_next_cases,
    _llama4_cases,
]
