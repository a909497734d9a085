"""The diagnosis's second-edition mistakes: ten codes after the first thirteen (docs/api.md 2.7).

Where each number comes from (never from the service's own functions: ``service`` is not
imported here):

- "the caller's" arrays are made the way each mistake really happens, in code written in this
  file: float64 NumPy (``attend``, ``rope_half``, ``np_block``) for the notebook mistakes
  (scale, mask, window, RoPE), float32 NumPy or torch for ``float32_arithmetic``, a live
  ``torch.nn.MultiheadAttention(batch_first=False)`` fed a batch-first tensor for
  ``batch_as_sequence``, a torch forward (``torch_block``) that reshapes the heads without the
  transpose for ``heads_merged_without_transpose``, and transformers' own ``LlamaAttention``
  (float64, as shipped: RoPE tables and softmax in float32) for the Hugging Face cases;
- what the diagnosis must say (``mistakes``, ``first_mismatch``) is the contract's: the mistake
  the builder made, the codes in the table's order (``CODES``);
- the builders are checked (``test_builder_*``): NumPy attention against torch's
  ``scaled_dot_product_attention`` in float64, the RoPE against transformers'
  ``apply_rotary_pos_emb``, the torch forward and the sequence-first builder against
  ``nn.MultiheadAttention``, and each builder with its mistake removed against the correct
  reference (so only the mistake separates the caller's numbers from the right ones).

torch 2.13 and transformers 5.23 are required (the whole file skips without them, as the other
live cross-checks do; ``REQUIRE_TORCH`` makes that a failure).
"""

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pytest
from fastapi.testclient import TestClient

from tests.api.test_compare import CODES as FIRST_EDITION

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
    import transformers
torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed: the second-edition diagnosis cases are built with it "
    "(install torch==2.13.0)",
)
transformers = pytest.importorskip(
    "transformers",
    reason="transformers is not installed: the Hugging Face diagnosis cases need it "
    "(install transformers==5.23.0)",
)

from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

pytestmark = pytest.mark.torch

Array = npt.NDArray[np.float64]
Bool = npt.NDArray[np.bool_]
Json = dict[str, Any]
Tensor = Any  # torch.Tensor (torch is imported through importorskip, so typed as a module)
F64 = torch.float64
F = torch.nn.functional

# The contract's table, in order: the first edition's 13 codes (tests/api/test_compare.py),
# then the second edition's 10.
NEW_CODES = (
    "scale_by_model_dim",
    "scale_inverted",
    "mask_after_softmax",
    "mask_missing",
    "window_off_by_one",
    "heads_merged_without_transpose",
    "batch_as_sequence",
    "rope_missing",
    "rope_base_wrong",
    "float32_arithmetic",
)
CODES = (*FIRST_EDITION, *NEW_CODES)
TIGHT: Json = {"atol": 1e-12, "rtol": 0}  # float64 agreement; float32 numbers fail it
E_NOTATION = r"\d(?:\.\d+)?e-\d+"  # a relative size as float32_arithmetic's explanation gives it


def bases_named(explanation: str) -> list[int]:
    """The RoPE bases an explanation names ("base N"), in order, each written as a person
    writes it (20,000 or 20000; not 2e4, not 20000.0; a sentence's full stop may follow): the
    base found comes first."""
    number = r"(\d{1,3}(?:,\d{3})+|\d+)(?![\d,]\d|\.\d|e)"
    found = re.findall(rf"\bbase {number}", explanation)
    return [int(m.replace(",", "")) for m in found]


# ---- HTTP and JSON -----------------------------------------------------------------------


def post(client: TestClient, path: str, body: Json) -> Json:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def js(a: Any) -> Any:
    """An array (NumPy or torch) as JSON: nested lists, NaN and ±∞ as null."""
    if hasattr(a, "detach"):
        a = a.detach().numpy()
    arr = np.asarray(a, dtype=np.float64)
    out = arr.astype(object)
    out[~np.isfinite(arr)] = None
    return out.tolist()


def js_bool(a: Bool) -> Any:
    return np.asarray(a, dtype=bool).tolist()


def entry(body: Json, name: str) -> Json:
    found = [e for e in body["comparison"] if e["name"] == name]
    assert len(found) == 1, f"{name}: {[e['name'] for e in body['comparison']]}"
    return found[0]  # type: ignore[no-any-return]


def t64(a: Array) -> Tensor:
    return torch.tensor(a, dtype=F64)


# ---- the reference and the notebook builders: float64 NumPy from scratch ---------------------


def softmax(s: Array, axis: int = -1) -> Array:
    """Max-subtracted softmax; a slice whose entries are all −∞ gives zeros (service default)."""
    m = np.max(s, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=axis, keepdims=True)
    out: Array = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return out


MaskStage = Literal["scores", "after_softmax", "after_softmax_renormalised"]


def attend(
    q: Array,
    k: Array,
    v: Array,
    scale: float,
    allowed: Bool | None = None,
    *,
    mask_stage: MaskStage = "scores",
    axis: int = -1,
) -> dict[str, Array]:
    """Attention as a notebook writes it: ``scores = q kᵀ``, ``· scale``, the mask (true = may
    attend), a softmax along ``axis``, ``weights v``. Right: ``mask_stage="scores"`` (−∞ before
    the softmax), ``axis=-1``. ``"after_softmax"``: ``w = softmax(scaled) * allowed``, rows no
    longer sum to 1; ``"after_softmax_renormalised"``: then ``w / w.sum(-1)``, 0/0 = NaN on a
    row with no allowed key."""
    scores = q @ np.swapaxes(k, -1, -2)
    scaled = scores * scale
    out = {"scores": scores, "scaled_scores": scaled}
    if allowed is None:
        weights = softmax(scaled, axis)
    elif mask_stage == "scores":
        out["masked_scores"] = np.where(allowed, scaled, -np.inf)
        weights = softmax(out["masked_scores"], axis)
    else:
        weights = softmax(scaled, axis) * allowed
        if mask_stage == "after_softmax_renormalised":
            with np.errstate(invalid="ignore"):
                weights = weights / weights.sum(axis=-1, keepdims=True)
    out["weights"] = weights
    out["output"] = weights @ v
    return out


def causal(n: int) -> Bool:
    """Upper-left causal, true = may attend: query i sees keys j ≤ i."""
    return np.tril(np.ones((n, n), dtype=bool))


def window(n: int, left: int, right: int) -> Bool:
    """Query i sees keys j with i − left ≤ j ≤ i + right (the contract's window mask)."""
    i, j = np.indices((n, n))
    allowed: Bool = (j >= i - left) & (j <= i + right)
    return allowed


def rope_half(x: Array, base: float = 10000.0) -> Array:
    """RoPE at positions 0…n−1 (axis −2), rotate_half pairing (i, i + d/2) as LLaMA in Hugging
    Face: x·cos + rotate_half(x)·sin, θ_i = base^(−2i/d)."""
    n, d = x.shape[-2], x.shape[-1]
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    angle = np.arange(n)[:, None] * theta[None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def np_block(
    x: Array,
    w: Sequence[Array],
    h: int,
    *,
    scale: float | None = None,
    allowed: Bool | None = None,
    rope_base: float | None = None,
) -> dict[str, Array]:
    """A multi-head block with PyTorch-layout (out_in) weights: heads are contiguous column
    blocks of ``x Wᵀ``, RoPE (half) per head when ``rope_base`` is given, ``concat W_oᵀ``.
    ``w`` is (W_q, W_k, W_v, W_o); ``x`` is (L, E) or (B, L, E); ``weights`` is (…, h, L, S)."""
    n = x.shape[-2]
    w_q, w_k, w_v, w_o = w

    def split(m: Array) -> Array:  # (…, L, h·d) → (…, h, L, d)
        return np.swapaxes(m.reshape(*m.shape[:-1], h, -1), -2, -3)

    q, k, v = split(x @ w_q.T), split(x @ w_k.T), split(x @ w_v.T)
    if rope_base is not None:
        q, k = rope_half(q, rope_base), rope_half(k, rope_base)
    d = q.shape[-1]
    heads = attend(q, k, v, d**-0.5 if scale is None else scale, allowed)
    concat = np.swapaxes(heads["output"], -2, -3).reshape(*x.shape[:-2], n, -1)
    return {"weights": heads["weights"], "concat": concat, "output": concat @ w_o.T}


# ---- the torch builders ------------------------------------------------------------------


def torch_block(
    x: Tensor,
    w: Sequence[Tensor],
    h: int,
    *,
    scale: float | None = None,
    transpose_heads: bool = True,
) -> dict[str, Tensor]:
    """A multi-head attention forward as people write it in torch, x (B, L, E), nn.Linear
    weights ``w`` = (W_q, W_k, W_v, W_o). ``transpose_heads=False`` is the bug: the (B, h, L, d)
    head outputs reshaped straight to (B, L, h·d), without ``.transpose(1, 2)``."""
    b, n, _ = x.shape
    w_q, w_k, w_v, w_o = w

    def split(t: Tensor) -> Tensor:  # (B, L, h·d) → (B, h, L, d)
        return t.reshape(b, n, h, -1).transpose(1, 2)

    q, k, v = split(F.linear(x, w_q)), split(F.linear(x, w_k)), split(F.linear(x, w_v))
    d = q.shape[-1]
    scores = q @ k.transpose(-1, -2) * (d**-0.5 if scale is None else scale)
    weights = torch.softmax(scores, dim=-1)
    out = weights @ v  # (B, h, L, d)
    # the bug: without .transpose(1, 2) the reshape reads head 0's rows first
    concat = out.transpose(1, 2).reshape(b, n, -1) if transpose_heads else out.reshape(b, n, -1)
    return {"weights": weights, "concat": concat, "output": F.linear(concat, w_o)}


def sequence_first_attention(
    x: Tensor, in_proj: Tensor, out_proj: Tensor, h: int, scale: float | None = None
) -> Tensor:
    """What ``nn.MultiheadAttention(batch_first=False)`` computes when handed a batch-first
    (B, L, E) tensor: it reads dim 0 as the sequence and dim 1 as the batch, so each position
    attends across the batch. Written out with torch ops so that ``scale`` can be changed
    (``None``: the module's own 1/√d)."""
    s, n, e = x.shape  # the module's names: (sequence, batch, embedding)
    q, k, v = F.linear(x, in_proj).chunk(3, dim=-1)

    def split(t: Tensor) -> Tensor:  # (s, n, e) → (n, h, s, d)
        return t.reshape(s, n, h, e // h).permute(1, 2, 0, 3)

    out = F.scaled_dot_product_attention(split(q), split(k), split(v), scale=scale)
    return F.linear(out.permute(2, 0, 1, 3).reshape(s, n, e), out_proj)


def float32_attend(q: Array, k: Array, v: Array, scale: float) -> dict[str, Array]:
    """The right attention computed in float32 NumPy (inputs rounded to float32 first),
    returned as float64."""
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    scaled = (q32 @ k32.T) * np.float32(scale)
    e = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    weights = e / e.sum(axis=-1, keepdims=True)
    out = {"weights": weights, "output": weights @ v32}
    assert all(a.dtype == np.float32 for a in out.values())
    return {name: a.astype(np.float64) for name, a in out.items()}


# ---- a Hugging Face LLaMA layer, as transformers ships it ----------------------------------

LLAMA_L = 5


@dataclass(frozen=True)
class Llama:
    """A tiny float64 ``LlamaAttention`` (hidden 16, 2 heads of 8, random weights, eager), its
    input and the request that describes it (docs/guide-layers.md, section 2)."""

    layer: Any
    config: Any
    x: Tensor  # (1, L, 16)
    state: dict[str, Tensor]

    def run(self, *, causal_mask: bool = True) -> Tensor:
        """The layer's output (1, L, 16) with (cos, sin) from ``LlamaRotaryEmbedding``, the
        eager additive causal mask, or ``attention_mask=None`` (no mask at all on eager)."""
        position_ids = torch.arange(LLAMA_L)[None]
        mask = None
        if causal_mask:
            visible = torch.ones(LLAMA_L, LLAMA_L, dtype=torch.bool).tril()
            mask = torch.zeros(1, 1, LLAMA_L, LLAMA_L, dtype=F64)
            mask = mask.masked_fill(~visible, torch.finfo(F64).min)
        with torch.no_grad():
            cos, sin = modeling_llama.LlamaRotaryEmbedding(self.config)(self.x, position_ids)
            out, _ = self.layer(self.x, position_embeddings=(cos, sin), attention_mask=mask)
        assert out.dtype == F64
        return out

    def request(self, rope_base: float) -> Json:
        return {
            "x": js(self.x),
            "num_heads": self.config.num_attention_heads,
            **{name: js(w) for name, w in self.state.items()},
            "rope": {"base": rope_base},
            "mask": {"type": "causal"},
        }

    def reference(self, rope_base: float, allowed: Bool | None) -> Array:
        """The float64 NumPy block for this layer's weights (the service's arithmetic)."""
        w = {name: t.numpy() for name, t in self.state.items()}
        return np_block(
            self.x.numpy(),
            [w[f"{p}_proj.weight"] for p in "qkvo"],
            self.config.num_attention_heads,
            allowed=allowed,
            rope_base=rope_base,
        )["output"]


def make_llama(rope_theta: float, seed: int) -> Llama:
    config = LlamaConfig(
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=8,
        num_hidden_layers=1,
        vocab_size=10,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
    )
    config._attn_implementation = "eager"
    with torch.random.fork_rng():  # seeded here without touching the session's torch RNG
        torch.manual_seed(seed)
        layer = modeling_llama.LlamaAttention(config, layer_idx=0).to(F64).eval()
        x = torch.randn(1, LLAMA_L, 16, dtype=F64)
    state = {name: t.detach().clone() for name, t in layer.state_dict().items()}
    assert sorted(state) == [f"{p}_proj.weight" for p in "koqv"], sorted(state)
    return Llama(layer, config, x, state)


LLAMA_10000 = make_llama(10000.0, seed=5)
LLAMA_20000 = make_llama(20000.0, seed=5)


# ---- inputs ------------------------------------------------------------------------------

N = 6  # L = S for the direct cases (q_k_swapped and the windows want a square)
D_K, D_V = 4, 3
SCALE = D_K**-0.5
_rng = np.random.default_rng(2028)
Q, K, V = (_rng.standard_normal((N, d)) for d in (D_K, D_K, D_V))
RAW = Q @ K.T
DIRECT: Json = {"q": js(Q), "k": js(K), "v": js(V)}

# /attention with projections, d_model 6 ≠ d_k 3 (and non-square weights: weights_transposed
# is not tried); √6 differs from d_k = 3 and √3, so the scale mistakes cannot coincide
X6 = _rng.standard_normal((5, 6))
W6 = [_rng.standard_normal((6, 3)) for _ in range(3)]
PROJ6: Json = {"x": js(X6), "w_q": js(W6[0]), "w_k": js(W6[1]), "w_v": js(W6[2])}
Q6, K6, V6 = (X6 @ w for w in W6)

# a boolean mask whose row 2 allows no key (true = may attend); every other row keeps a key
HOLE = _rng.random((N, N)) < 0.6
HOLE[:, 0] |= True
HOLE[2] = False
KEY_PADDING = np.array([False, False, False, False, True, True])  # torch: true = padding


def linear_weights(rows: int, cols: int, seed: int) -> Tensor:
    """An nn.Linear-style (out, in) float64 weight, N(0, 1/in)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g, dtype=F64) * cols**-0.5


# /multihead from a torch forward: E = 8, 2 heads of d_k 4 (D = d_model = h·d_k = 8)
MH_X = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(3), dtype=F64)
MH_W = [linear_weights(8, 8, seed) for seed in (11, 12, 13, 14)]
MH: Json = {
    "x": js(MH_X[0]),
    "num_heads": 2,
    **{f"{p}_proj.weight": js(w) for p, w in zip("qkvo", MH_W, strict=True)},
}
# d_model 6, 2 heads of d_k 4: h·d_k = 8 ≠ d_model = 6 (and neither √8 nor √6 is d_k or √d_k)
MH6_X = torch.randn(1, 4, 6, generator=torch.Generator().manual_seed(4), dtype=F64)
MH6_W = [linear_weights(8, 6, seed) for seed in (21, 22, 23)] + [linear_weights(6, 8, 24)]
MH6: Json = {
    "x": js(MH6_X[0]),
    "num_heads": 2,
    **{f"{p}_proj.weight": js(w) for p, w in zip("qkvo", MH6_W, strict=True)},
}

# batch_as_sequence: a batch of B = 3 sequences of L = 4 tokens, E = 4, 2 heads, no biases
B3, L4, E4 = 3, 4, 4
with torch.random.fork_rng():  # seeded here without touching the session's torch RNG
    torch.manual_seed(7)
    SEQ_FIRST = torch.nn.MultiheadAttention(E4, 2, batch_first=False, bias=False, dtype=F64)
    SEQ_FIRST.eval()
    BATCH_X = torch.randn(B3, L4, E4, dtype=F64)  # batch-first, as the caller's loader gives
IN_PROJ = SEQ_FIRST.in_proj_weight.detach().clone()
OUT_PROJ = SEQ_FIRST.out_proj.weight.detach().clone()
BATCHED_MH: Json = {
    "x": js(BATCH_X),
    "num_heads": 2,
    "in_proj_weight": js(IN_PROJ),
    "out_proj_weight": js(OUT_PROJ),
}


# ---- the cases ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A request, the caller's wrong `expected`, and what the diagnosis must say."""

    id: str
    endpoint: str
    body: Json
    expected: Json
    first_mismatch: str
    mistakes: list[str]
    base_found: int | None = None  # rope_base_wrong: the base the explanation must name first


def mask(*masks: Json) -> Json:
    """A direct-mode request (Q, K, V) with these masks."""
    return {**DIRECT, "mask": list(masks)}


def boolean(allowed: Bool) -> Json:
    return {"type": "boolean", "matrix": js_bool(allowed)}


def heads_weights(weights: Tensor) -> list[Json]:
    """``expected.heads`` holding each head's weights, from (1, h, L, S) for an unbatched x."""
    return [{"weights": js(weights[0, i])} for i in range(weights.shape[1])]


def single_cases() -> list[Case]:
    with torch.no_grad():
        merged = torch_block(MH_X, MH_W, 2, transpose_heads=False)
        x2 = torch.cat([MH_X, MH_X.flip(1)])  # a batch of two
        merged2 = torch_block(x2, MH_W, 2, transpose_heads=False)
        by_d_model = torch_block(MH_X, MH_W, 2, scale=8**-0.5)
        by_h_d_k = torch_block(MH6_X, MH6_W, 2, scale=8**-0.5)
        seq_first, _ = SEQ_FIRST(BATCH_X, BATCH_X, BATCH_X, need_weights=False)
    c6 = causal(N)
    return [
        # ---- scale_by_model_dim: ÷ √d_model (or √(h·d_k)) instead of ÷ √d_k
        Case(
            "scale_by_model_dim-attention-sqrt_d_model",
            "/attention",
            PROJ6,
            {"weights": js(attend(Q6, K6, V6, 6**-0.5)["weights"])},
            "weights",
            ["scale_by_model_dim"],
        ),
        Case(
            "scale_by_model_dim-multihead-sqrt_d_model",
            "/multihead",
            MH,
            {"output": js(by_d_model["output"][0])},
            "output",
            ["scale_by_model_dim"],
        ),
        Case(
            "scale_by_model_dim-multihead-sqrt_h_times_d_k",
            "/multihead",
            MH6,
            {"heads": heads_weights(by_h_d_k["weights"]), "output": js(by_h_d_k["output"][0])},
            "heads.0.weights",
            ["scale_by_model_dim"],
        ),
        # ---- scale_inverted: × √d_k (÷ scale) instead of × scale
        Case(
            "scale_inverted-times_sqrt_d_k",
            "/attention",
            DIRECT,
            {"weights": js(attend(Q, K, V, D_K**0.5)["weights"])},
            "weights",
            ["scale_inverted"],
        ),
        Case(
            "scale_inverted-divided_by_given_scale",
            "/attention",
            {**DIRECT, "scale": 0.3},
            {"scaled_scores": js(RAW / 0.3)},
            "scaled_scores",
            ["scale_inverted"],
        ),
        # ---- mask_after_softmax: softmax of the unmasked scores, then the masked entries zeroed
        Case(
            "mask_after_softmax-causal-zeroed",
            "/mask",
            mask({"type": "causal"}),
            {"weights": js(attend(Q, K, V, SCALE, c6, mask_stage="after_softmax")["weights"])},
            "weights",
            ["mask_after_softmax"],
        ),
        Case(
            "mask_after_softmax-key_padding_mask-zeroed-output",
            "/attention",
            {**DIRECT, "key_padding_mask": js_bool(KEY_PADDING)},
            {
                "output": js(
                    attend(Q, K, V, SCALE, ~KEY_PADDING[None, :], mask_stage="after_softmax")[
                        "output"
                    ]
                )
            },
            "output",
            ["mask_after_softmax"],
        ),
        # renormalised, the rows that keep a key are right; the row with none is 0/0 = NaN
        Case(
            "mask_after_softmax-renormalised-empty_row_nan",
            "/mask",
            mask(boolean(HOLE)),
            {
                "weights": js(
                    attend(Q, K, V, SCALE, HOLE, mask_stage="after_softmax_renormalised")["weights"]
                )
            },
            "weights",
            ["mask_after_softmax"],
        ),
        # ---- mask_missing: no mask applied at all (every one of them)
        Case(
            "mask_missing-causal_and_key_padding",
            "/mask",
            {**mask({"type": "causal"}), "key_padding_mask": js_bool(KEY_PADDING)},
            {"weights": js(attend(Q, K, V, SCALE)["weights"])},
            "weights",
            ["mask_missing"],
        ),
        # the eager LlamaAttention called with attention_mask=None applies no mask at all
        Case(
            "mask_missing-llama-eager-attention_mask_None",
            "/multihead",
            LLAMA_10000.request(10000),
            {"output": js(LLAMA_10000.run(causal_mask=False))},
            "output",
            ["mask_missing"],
        ),
        # ---- window_off_by_one
        # Hugging Face sliding_window W = 2 is left = W − 1 = 1 here; the caller used
        # flash-attention's window_size = (W, 0): keys i − W … i, one wider
        Case(
            "window_off_by_one-sliding_window-one_wider",
            "/mask",
            mask({"type": "causal"}, {"type": "window", "left": 1, "right": 0}),
            {"weights": js(attend(Q, K, V, SCALE, c6 & window(N, 2, 0))["weights"])},
            "weights",
            ["window_off_by_one"],
        ),
        Case(
            "window_off_by_one-one_narrower-masked_scores",
            "/mask",
            mask({"type": "causal"}, {"type": "window", "left": 3, "right": 0}),
            {"masked_scores": js(attend(Q, K, V, SCALE, c6 & window(N, 2, 0))["masked_scores"])},
            "masked_scores",
            ["window_off_by_one"],
        ),
        Case(
            "window_off_by_one-both_sides_shifted",
            "/mask",
            mask({"type": "window", "left": 1, "right": 1}),
            {"weights": js(attend(Q, K, V, SCALE, window(N, 2, 2))["weights"])},
            "weights",
            ["window_off_by_one"],
        ),
        # ---- heads_merged_without_transpose: out.reshape(B, L, h·d) without .transpose(1, 2)
        Case(
            "heads_merged_without_transpose-concat",
            "/multihead",
            MH,
            {
                "heads": heads_weights(merged["weights"]),  # right: the bug comes after
                "concat": js(merged["concat"][0]),
                "output": js(merged["output"][0]),
            },
            "concat",
            ["heads_merged_without_transpose"],
        ),
        Case(
            "heads_merged_without_transpose-batched-output",
            "/multihead",
            {**MH, "x": js(x2)},
            {"output": js(merged2["output"])},
            "output",
            ["heads_merged_without_transpose"],
        ),
        # ---- batch_as_sequence: nn.MultiheadAttention(batch_first=False) fed (B, L, E)
        Case(
            "batch_as_sequence-nn.MultiheadAttention-batch_first_False",
            "/multihead",
            BATCHED_MH,
            {"output": js(seq_first)},
            "output",
            ["batch_as_sequence"],
        ),
        # ---- rope_missing: rope asked for, q and k never rotated
        Case(
            "rope_missing-q_rotated",
            "/attention",
            {**DIRECT, "rope": {}},
            {"q_rotated": js(Q), "k_rotated": js(K)},
            "q_rotated",
            ["rope_missing"],
        ),
        Case(
            "rope_missing-weights",
            "/attention",
            {**DIRECT, "rope": {"base": 500000}},
            {"weights": js(attend(Q, K, V, SCALE)["weights"])},
            "weights",
            ["rope_missing"],
        ),
        # ---- rope_base_wrong: another base; the explanation names the one found
        Case(
            "rope_base_wrong-10000_for_500000-weights",
            "/attention",
            {**DIRECT, "rope": {"base": 500000}},
            {"weights": js(attend(rope_half(Q), rope_half(K), V, SCALE)["weights"])},
            "weights",
            ["rope_base_wrong"],
            base_found=10000,
        ),
        # a stock layer built with a base none of the listed ones (20000) where the default
        # was asked: fitted to the numbers, and the round base is named, not float32's fit of
        # it (19,999.98…)
        Case(
            "rope_base_wrong-llama-layer_built_with_20000",
            "/multihead",
            LLAMA_20000.request(10000),
            {"output": js(LLAMA_20000.run())},
            "output",
            ["rope_base_wrong"],
            base_found=20000,
        ),
        Case(
            "rope_base_wrong-1000000_for_default-q_rotated",
            "/attention",
            {**DIRECT, "rope": {}},
            {"q_rotated": js(rope_half(Q, 1e6))},
            "q_rotated",
            ["rope_base_wrong"],
            base_found=1000000,
        ),
        # a config says rope_theta 500000 but the layer was built with the default 10000
        # (transformers' float32 RoPE and softmax stay well inside the default tolerance)
        Case(
            "rope_base_wrong-llama-layer_built_with_10000",
            "/multihead",
            LLAMA_10000.request(500000),
            {"output": js(LLAMA_10000.run())},
            "output",
            ["rope_base_wrong"],
            base_found=10000,
        ),
        # ---- float32_arithmetic: right, but at float32 precision (tolerance 1e-12 asked)
        Case(
            "float32_arithmetic-numpy_float32",
            "/attention",
            {**DIRECT, "tolerance": TIGHT},
            {n: js(a) for n, a in float32_attend(Q, K, V, SCALE).items()},
            "weights",
            ["float32_arithmetic"],
        ),
        Case(
            "float32_arithmetic-torch_float32_sdpa_is_causal",
            "/mask",
            {**mask({"type": "causal"}), "tolerance": TIGHT},
            {
                "output": js(
                    F.scaled_dot_product_attention(
                        torch.tensor(Q, dtype=torch.float32),
                        torch.tensor(K, dtype=torch.float32),
                        torch.tensor(V, dtype=torch.float32),
                        is_causal=True,
                    )
                )
            },
            "output",
            ["float32_arithmetic"],
        ),
        # transformers' float64 LlamaAttention as shipped: RoPE tables and softmax in float32
        Case(
            "float32_arithmetic-llama-stock_float64_layer",
            "/multihead",
            {**LLAMA_10000.request(10000), "tolerance": TIGHT},
            {"output": js(LLAMA_10000.run())},
            "output",
            ["float32_arithmetic"],
        ),
    ]


def pair_cases() -> list[Case]:
    with torch.no_grad():
        merged_unscaled = torch_block(MH_X, MH_W, 2, scale=1.0, transpose_heads=False)
        seq_first_unscaled = sequence_first_attention(BATCH_X, IN_PROJ, OUT_PROJ, 2, scale=1.0)
    c6 = causal(N)
    zeroed: MaskStage = "after_softmax"
    return [
        Case(
            "scale_inverted+softmax_over_queries",
            "/attention",
            DIRECT,
            {"weights": js(attend(Q, K, V, D_K**0.5, axis=0)["weights"])},
            "weights",
            ["softmax_over_queries", "scale_inverted"],
        ),
        Case(
            "scale_by_model_dim+softmax_over_queries",
            "/attention",
            PROJ6,
            {"weights": js(attend(Q6, K6, V6, 6**-0.5, axis=0)["weights"])},
            "weights",
            ["softmax_over_queries", "scale_by_model_dim"],
        ),
        Case(
            "mask_after_softmax+q_k_swapped",
            "/mask",
            mask({"type": "causal"}),
            {"weights": js(attend(K, Q, V, SCALE, c6, mask_stage=zeroed)["weights"])},
            "weights",
            ["q_k_swapped", "mask_after_softmax"],
        ),
        Case(
            "mask_missing+scale_missing",
            "/mask",
            mask({"type": "causal"}),
            {"weights": js(attend(Q, K, V, 1.0)["weights"])},
            "weights",
            ["scale_missing", "mask_missing"],
        ),
        Case(
            "window_off_by_one+scale_missing",
            "/mask",
            mask({"type": "causal"}, {"type": "window", "left": 1, "right": 0}),
            {"weights": js(attend(Q, K, V, 1.0, c6 & window(N, 2, 0))["weights"])},
            "weights",
            ["scale_missing", "window_off_by_one"],
        ),
        Case(
            "heads_merged_without_transpose+scale_missing",
            "/multihead",
            MH,
            {"output": js(merged_unscaled["output"][0])},
            "output",
            ["scale_missing", "heads_merged_without_transpose"],
        ),
        Case(
            "batch_as_sequence+scale_missing",
            "/multihead",
            BATCHED_MH,
            {"output": js(seq_first_unscaled)},
            "output",
            ["scale_missing", "batch_as_sequence"],
        ),
        Case(
            "rope_missing+scale_missing",
            "/attention",
            {**DIRECT, "rope": {}},
            {"weights": js(attend(Q, K, V, 1.0)["weights"])},
            "weights",
            ["scale_missing", "rope_missing"],
        ),
        Case(
            "rope_base_wrong+q_k_swapped",
            "/attention",
            {**DIRECT, "rope": {}},
            {"weights": js(attend(rope_half(K, 5e5), rope_half(Q, 5e5), V, SCALE)["weights"])},
            "weights",
            ["q_k_swapped", "rope_base_wrong"],
            base_found=500000,
        ),
        Case(
            "float32_arithmetic+scale_missing",
            "/attention",
            {**DIRECT, "tolerance": TIGHT},
            {"weights": js(float32_attend(Q, K, V, 1.0)["weights"])},
            "weights",
            ["scale_missing", "float32_arithmetic"],
        ),
    ]


SINGLES = single_cases()
PAIRS = pair_cases()


def test_every_new_code_has_a_case_alone_and_in_a_pair_with_a_first_edition_code() -> None:
    assert {m for c in SINGLES for m in c.mistakes} == set(NEW_CODES)
    for code in NEW_CODES:
        assert any(code in c.mistakes and set(c.mistakes) & set(FIRST_EDITION) for c in PAIRS), code
    for case in SINGLES + PAIRS:  # the tests' own premise: cases list mistakes in table order
        assert case.mistakes == sorted(case.mistakes, key=CODES.index), case.id


def check_diagnosis(client: TestClient, case: Case) -> Json:
    body = post(client, case.endpoint, {**case.body, "expected": case.expected})
    assert body["first_mismatch"] == case.first_mismatch, body["comparison"]
    e = entry(body, case.first_mismatch)
    assert e["match"] is False
    assert e["diagnosis"] is not None, e["message"]
    assert e["diagnosis"]["mistakes"] == case.mistakes, e["diagnosis"]
    explanation = e["diagnosis"]["explanation"]
    assert isinstance(explanation, str) and len(explanation.split()) >= 3, explanation
    assert e["diagnosis_complete"] is True  # small requests always get a full diagnosis
    if case.base_found is not None:  # named, and before any other base the text may mention
        named = bases_named(explanation)
        assert named and named[0] == case.base_found, explanation
    if "float32_arithmetic" in case.mistakes:  # the relative size, in e-notation, below 1e-5
        sizes = [float(s) for s in re.findall(E_NOTATION, explanation)]
        assert any(0 < s <= 1e-5 for s in sizes), explanation
    for other in body["comparison"]:  # only the first mismatch is diagnosed
        if other["name"] != case.first_mismatch:
            assert other["diagnosis"] is None, other
    return e


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in SINGLES])
def test_each_new_mistake_alone_is_diagnosed(client: TestClient, case: Case) -> None:
    check_diagnosis(client, case)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in PAIRS])
def test_each_new_mistake_with_a_first_edition_one_is_diagnosed_as_a_pair(
    client: TestClient, case: Case
) -> None:
    check_diagnosis(client, case)


def test_float32_explanation_gives_the_relative_size_of_the_difference(client: TestClient) -> None:
    # reference: float32_attend's weights against attend's; the relative size is the largest
    # difference over the largest |ours| in the array (the definition float32_arithmetic uses)
    theirs, right = float32_attend(Q, K, V, SCALE)["weights"], attend(Q, K, V, SCALE)["weights"]
    relative = np.abs(theirs - right).max() / np.abs(right).max()
    body = post(
        client, "/attention", {**DIRECT, "tolerance": TIGHT, "expected": {"weights": js(theirs)}}
    )
    explanation = entry(body, "weights")["diagnosis"]["explanation"]
    given = [float(x) for x in re.findall(E_NOTATION, explanation)]
    assert any(abs(g - relative) <= 0.06 * relative for g in given), (relative, explanation)


def test_a_pair_from_one_family_is_never_named(client: TestClient) -> None:
    # reference: heads split as every h-th column (heads_interleaved) and then merged without
    # the transpose (heads_merged_without_transpose), as torch code can do both: the contract
    # never tries that pair, and no other set makes these numbers
    x = MH_X[0].numpy()
    w_q, w_k, w_v, w_o = (w.numpy() for w in MH_W)
    h = 2

    def every_hth(m: Array) -> Array:  # (L, h·d) → (h, L, d): head i takes columns i, i + h, …
        return np.stack([m[:, i::h] for i in range(h)])

    heads = attend(every_hth(x @ w_q.T), every_hth(x @ w_k.T), every_hth(x @ w_v.T), 0.5)
    concat = heads["output"].reshape(x.shape[0], -1)  # (h, L, d) read row by row: no transpose
    body = post(client, "/multihead", {**MH, "expected": {"output": js(concat @ w_o.T)}})
    e = entry(body, "output")
    assert e["match"] is False
    assert e["diagnosis"] is None, e["diagnosis"]
    assert e["diagnosis_complete"] is True


# ---- what is not a mistake ---------------------------------------------------------------


def correct_cases() -> list[tuple[str, str, Json, Json]]:
    """(id, endpoint, request, expected): right float64 numbers, from the references."""
    plain = attend(Q, K, V, SCALE)
    sliding = attend(Q, K, V, SCALE, causal(N) & window(N, 1, 0))
    q_r, k_r = rope_half(Q, 5e5), rope_half(K, 5e5)
    with torch.no_grad():
        block = torch_block(MH_X, MH_W, 2)
        seq_first, _ = SEQ_FIRST(
            BATCH_X.transpose(0, 1), BATCH_X.transpose(0, 1), BATCH_X.transpose(0, 1)
        )  # batch-first data given to a sequence-first layer the right way round
    return [
        ("attention", "/attention", DIRECT, {n: js(a) for n, a in plain.items()}),
        (
            "mask-causal-sliding_window",
            "/mask",
            mask({"type": "causal"}, {"type": "window", "left": 1, "right": 0}),
            {n: js(sliding[n]) for n in ("masked_scores", "weights", "output")},
        ),
        (
            "attention-rope_500000",
            "/attention",
            {**DIRECT, "rope": {"base": 500000}},
            {
                "q_rotated": js(q_r),
                "k_rotated": js(k_r),
                "weights": js(attend(q_r, k_r, V, SCALE)["weights"]),
            },
        ),
        (
            "multihead-torch_forward_with_the_transpose",
            "/multihead",
            MH,
            {
                "heads": heads_weights(block["weights"]),
                "concat": js(block["concat"][0]),
                "output": js(block["output"][0]),
            },
        ),
        (
            "multihead-batched-sequence_first_layer_transposed",
            "/multihead",
            BATCHED_MH,
            {"output": js(seq_first.transpose(0, 1))},
        ),
    ]


@pytest.mark.parametrize(
    ("endpoint", "request_body", "expected"),
    [pytest.param(*c[1:], id=c[0]) for c in correct_cases()],
)
def test_right_float64_numbers_match_at_a_tight_tolerance(
    client: TestClient, endpoint: str, request_body: Json, expected: Json
) -> None:
    body = post(client, endpoint, {**request_body, "expected": expected, "tolerance": TIGHT})
    assert body["first_mismatch"] is None, body["comparison"]
    for e in body["comparison"]:
        assert e["match"] is True and e["diagnosis"] is None, e


@pytest.mark.parametrize("tolerance", [TIGHT, None], ids=["tight", "default"])
def test_noise_far_above_float32_is_not_float32_arithmetic(
    client: TestClient, tolerance: Json | None
) -> None:
    # reference: the right weights plus N(0, 1) noise × 1e-3 × their largest |value| (a relative
    # 1e-3, a hundred times the 1e-5 float32_arithmetic allows); no mistake makes noise
    right = attend(Q, K, V, SCALE)["weights"]
    noise = np.random.default_rng(9).standard_normal(right.shape)
    noisy = right + 1e-3 * np.abs(right).max() * noise
    request = {**DIRECT, "expected": {"weights": js(noisy)}}
    if tolerance is not None:
        request["tolerance"] = tolerance
    body = post(client, "/attention", request)
    e = entry(body, "weights")
    assert e["match"] is False
    assert e["diagnosis"] is None, e["diagnosis"]
    assert "float32_arithmetic" not in e["message"], e["message"]


def test_float32_numbers_still_match_at_the_default_tolerance(client: TestClient) -> None:
    # reference: float32_attend; the default tolerance (1e-6) is wider than float32's rounding
    expected = {n: js(a) for n, a in float32_attend(Q, K, V, SCALE).items()}
    body = post(client, "/attention", {**DIRECT, "expected": expected})
    assert body["first_mismatch"] is None, body["comparison"]


# ---- the builders themselves -------------------------------------------------------------


def close(a: Any, b: Any, tol: float = 1e-12) -> None:
    a = a.detach().numpy() if hasattr(a, "detach") else a
    b = b.detach().numpy() if hasattr(b, "detach") else b
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=tol)


def test_builder_numpy_attention_agrees_with_torch_sdpa() -> None:
    for allowed, scale in (
        (None, SCALE),
        (causal(N), SCALE),
        (causal(N) & window(N, 1, 0), 0.3),
        (window(N, 2, 2), 1.0),
        (~KEY_PADDING[None, :].repeat(N, axis=0), D_K**0.5),
    ):
        ours = attend(Q, K, V, scale, allowed)["output"]
        theirs = F.scaled_dot_product_attention(
            t64(Q),
            t64(K),
            t64(V),
            attn_mask=None if allowed is None else torch.tensor(allowed),
            scale=scale,
        )
        close(ours, theirs)
    # the softmax down the columns, as torch.softmax(dim=-2)
    close(attend(Q, K, V, SCALE, axis=0)["weights"], torch.softmax(t64(RAW) * SCALE, dim=-2))


def test_builder_mask_after_softmax_with_every_key_allowed_is_the_right_attention() -> None:
    everything = np.ones((N, N), dtype=bool)
    right = attend(Q, K, V, SCALE)
    stages: tuple[MaskStage, ...] = ("after_softmax", "after_softmax_renormalised")
    for stage in stages:
        close(attend(Q, K, V, SCALE, everything, mask_stage=stage)["output"], right["output"])
    # renormalised, a row that keeps a key is the right masked softmax: only the empty row
    # (NaN there, zeros in the service's answer) tells the two apart
    renorm = attend(Q, K, V, SCALE, HOLE, mask_stage="after_softmax_renormalised")["weights"]
    masked = attend(Q, K, V, SCALE, HOLE)["weights"]
    assert np.isnan(renorm[2]).all() and (masked[2] == 0).all()
    keep = np.arange(N) != 2
    close(renorm[keep], masked[keep])


def test_builder_window_is_hugging_faces_sliding_window() -> None:
    # transformers' sliding window W: key j visible from i when i − W < j ≤ i (the
    # sliding_window_causal mask); the contract's left = W − 1 is the same set
    i, j = np.indices((N, N))
    for w in (1, 2, 3):
        hf = (j <= i) & (j > i - w)
        assert (hf == (causal(N) & window(N, w - 1, 0))).all(), w


def test_builder_rope_agrees_with_transformers() -> None:
    # apply_rotary_pos_emb with cos/sin written in float64: rope_half's rotation exactly
    for base in (10000.0, 5e5, 1e6):
        inv = 1.0 / base ** (torch.arange(0, D_K, 2, dtype=F64) / D_K)
        freqs = torch.arange(N, dtype=F64)[:, None] * inv[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        q_hf, k_hf = modeling_llama.apply_rotary_pos_emb(
            t64(Q)[None, None], t64(K)[None, None], emb.cos()[None], emb.sin()[None]
        )
        close(rope_half(Q, base), q_hf[0, 0])
        close(rope_half(K, base), k_hf[0, 0])
    # with transformers' own rotary module (the LLaMA cases' head_dim 8, θ 10000), whose
    # tables are float32: the same rotation to float32 precision, and no closer
    heads = np.random.default_rng(4).standard_normal((1, 2, LLAMA_L, 8))
    cos, sin = modeling_llama.LlamaRotaryEmbedding(LLAMA_10000.config)(
        t64(heads), torch.arange(LLAMA_L)[None]
    )
    q_hf, _ = modeling_llama.apply_rotary_pos_emb(t64(heads), t64(heads), cos, sin)
    diff = np.abs(rope_half(heads) - q_hf.numpy()).max()
    assert 1e-12 < diff < 1e-6, diff


def test_builder_torch_forward_is_nn_multihead_attention_when_it_transposes() -> None:
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True, bias=False, dtype=F64).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat(MH_W[:3]))
        mha.out_proj.weight.copy_(MH_W[3])
        out, weights = mha(MH_X, MH_X, MH_X, average_attn_weights=False)
        block = torch_block(MH_X, MH_W, 2)
        merged = torch_block(MH_X, MH_W, 2, transpose_heads=False)
    close(block["output"], out)
    close(block["weights"], weights)
    w = [t.numpy() for t in MH_W]
    close(np_block(MH_X.numpy(), w, 2)["output"], out)
    # the missing transpose changes the concatenation only: the heads' weights are the same
    close(merged["weights"], weights)
    assert not np.allclose(merged["concat"].numpy(), block["concat"].numpy())
    # scale_by_model_dim's builders: the scale is the only thing changed
    close(torch_block(MH_X, MH_W, 2, scale=0.5)["output"], out)  # 0.5 = 1/√d_k
    close(
        np_block(MH_X.numpy(), w, 2, scale=8**-0.5)["output"],
        torch_block(MH_X, MH_W, 2, scale=8**-0.5)["output"],
    )
    w6 = [t.numpy() for t in MH6_W]
    close(np_block(MH6_X.numpy(), w6, 2)["output"], torch_block(MH6_X, MH6_W, 2)["output"])


def test_builder_batch_as_sequence_is_the_sequence_first_layer() -> None:
    with torch.no_grad():
        as_given, _ = SEQ_FIRST(BATCH_X, BATCH_X, BATCH_X, need_weights=False)
        xt = BATCH_X.transpose(0, 1)  # (L, B, E): what the layer expects
        right, _ = SEQ_FIRST(xt, xt, xt, need_weights=False)
    # the hand-written builder (used with scale 1) is the module itself at its own scale
    close(sequence_first_attention(BATCH_X, IN_PROJ, OUT_PROJ, 2), as_given)
    # given the right way round, the layer computes the service's batched block
    w_q, w_k, w_v = IN_PROJ.numpy().reshape(3, E4, E4)
    ref = np_block(BATCH_X.numpy(), (w_q, w_k, w_v, OUT_PROJ.numpy()), 2)["output"]
    close(right.transpose(0, 1), ref)
    # the mistake: attention across the batch for each position, the same shape as ours
    across = np_block(BATCH_X.numpy().swapaxes(0, 1), (w_q, w_k, w_v, OUT_PROJ.numpy()), 2)
    close(as_given, across["output"].swapaxes(0, 1))
    assert as_given.shape == (B3, L4, E4)


def test_builder_float32_attend_with_the_float32_removed_is_the_right_attention() -> None:
    right = attend(Q, K, V, SCALE)
    theirs = float32_attend(Q, K, V, SCALE)
    for n, a in theirs.items():
        diff = np.abs(a - right[n]).max()
        assert 0 < diff <= 1e-5 * np.abs(right[n]).max(), (n, diff)  # float32, no more
    # the same arithmetic in float64 is the reference
    q, k, v = (t64(a) for a in (Q, K, V))
    close(torch.softmax(q @ k.T * SCALE, dim=-1) @ v, right["output"])


def test_builder_llama_layer_is_the_reference_to_float32_precision_only() -> None:
    # the premise of the float32_arithmetic and Hugging Face cases: the stock float64 layer
    # agrees with the float64 reference to well inside 1e-5 × its largest value, not to 1e-12
    for causal_mask, allowed in ((True, causal(LLAMA_L)), (False, None)):
        theirs = LLAMA_10000.run(causal_mask=causal_mask)[0].numpy()
        ref = LLAMA_10000.reference(10000.0, allowed)[0]
        diff = np.abs(theirs - ref).max()
        assert 1e-12 < diff <= 1e-5 * np.abs(ref).max(), diff
        assert diff < 1e-6  # inside the default tolerance too
    # the wrong base is far from float32 noise: rope_base_wrong is the explanation there
    diff = np.abs(LLAMA_10000.run()[0].numpy() - LLAMA_10000.reference(5e5, causal(LLAMA_L))[0])
    assert diff.max() > 1e-4
    # and the layer without its mask is far from the masked reference
    unmasked = LLAMA_10000.run(causal_mask=False)[0].numpy()
    assert np.abs(unmasked - LLAMA_10000.reference(1e4, causal(LLAMA_L))[0]).max() > 1e-3


def test_builders_differ_from_the_right_numbers() -> None:
    """Each single case's caller array really is wrong beyond the default tolerance (so the
    case tests the diagnosis, not the comparison) — except the float32 ones, wrong only at the
    tight tolerance they send."""
    c6, sliding = causal(N), causal(N) & window(N, 1, 0)
    wrong_and_right: list[tuple[str, Array, Array]] = [
        ("scale_inverted", attend(Q, K, V, D_K**0.5)["weights"], attend(Q, K, V, SCALE)["weights"]),
        (
            "mask_after_softmax",
            attend(Q, K, V, SCALE, c6, mask_stage="after_softmax")["weights"],
            attend(Q, K, V, SCALE, c6)["weights"],
        ),
        (
            "window_off_by_one",
            attend(Q, K, V, SCALE, c6 & window(N, 2, 0))["weights"],
            attend(Q, K, V, SCALE, sliding)["weights"],
        ),
        ("rope_missing", Q, rope_half(Q)),
        ("rope_base_wrong", rope_half(Q, 1e6), rope_half(Q)),
    ]
    for name, wrong, right in wrong_and_right:
        assert np.abs(wrong - right).max() > 1e-3, name
