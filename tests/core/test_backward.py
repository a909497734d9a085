"""The backward pass, every step (issue 44): each rule of :data:`service.core.chain.HEAD` and
:data:`service.core.chain.BLOCK`, and the whole chains, against ``torch.autograd`` of the same
computation written here in torch, float64 (never the service's functions): every intermediate's
gradient, and the sinks', the norms' weights', the cache's, the projections' and the block's
parameters', to 1e-10 relative to the largest magnitude of the reference gradient.

The reference forward keeps each intermediate under the step's name (``retain_grad``), so the
gradient of every name torch computes must equal the service's ``grad_<name>``, and the service
must name no gradient torch does not compute.
"""

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from service.core import chain
from service.core.attention import scaled_dot_product_attention
from service.core.backward import attention_backward, backward, heads_backward, multihead_backward
from service.core.block import LayerNorm
from service.core.linear import Past
from service.core.masks import CombinedMask
from service.core.multihead import MultiheadWeights, attend_heads, multihead_attention
from service.core.positions import Rope
from service.core.rope_scaling import LinearScaling, YarnScaling
from service.core.types import Array, BoolArray, FullyMaskedPolicy
from service.core.variants import QKNorm, Temperature, Variants

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.torch
T = Any  # a torch tensor
TOL = 1e-10
WORST: dict[str, float] = {}  # case → the largest relative difference met (for the report)


# ---- the reference, in torch ------------------------------------------------------------------


class Tape:
    """The reference's arrays by the service's names: leaves (inputs, parameters) and kept
    intermediates, whose gradients autograd fills."""

    def __init__(self) -> None:
        self.t: dict[str, T] = {}

    def leaf(self, name: str, a: Array | float) -> T:
        x = torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)
        self.t[name] = x
        return x

    def keep(self, name: str, x: T) -> T:
        x.retain_grad()
        self.t[name] = x
        return x

    def grads(self) -> dict[str, Array]:
        return {f"grad_{n}": x.grad.numpy() for n, x in self.t.items() if x.grad is not None}


def t_along(a: T, x: T, over: str) -> T:
    """A norm weight broadcast over x (..., H, n, d): (d,) as is, else a row per group of heads."""
    d = x.shape[-1]
    if tuple(a.shape) == (d,) and over == "head":
        return a
    rows = a.reshape(-1, d)
    return rows.repeat_interleave(x.shape[-3] // rows.shape[0], 0)[:, None, :]


def t_norm(tape: Tape, side: str, x: T, s: QKNorm) -> T:
    axes = (-1,) if s.over == "head" else (-3, -1)
    c = x if s.type == "rms" else x - x.mean(axes, keepdim=True)
    y = c / torch.sqrt((c * c).mean(axes, keepdim=True) + s.eps)
    if s.weight is not None:
        w = tape.leaf(f"{side}_norm_weight", s.weight)
        y = y * t_along(1 + w if s.zero_centered else w, x, s.over)
    if s.bias is not None:
        y = y + t_along(tape.leaf(f"{side}_norm_bias", s.bias), x, s.over)
    return y


Angles = Callable[[np.ndarray, int, int], tuple[T, float]]  # (positions, d_k, n) → angles, gain


def default_angles(base: float, rotary: int | None = None, linear: float = 1.0) -> Angles:
    def angles(p: np.ndarray, d: int, n: int) -> tuple[T, float]:
        r = rotary or d
        inv = 1.0 / base ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
        return torch.tensor(p / linear, dtype=torch.float64)[:, None] * inv[None], 1.0

    return angles


def proportional_angles(base: float, rotary: int) -> Angles:
    def angles(p: np.ndarray, d: int, n: int) -> tuple[T, float]:
        inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        inv[rotary // 2 :] = 0.0
        return torch.tensor(p, dtype=torch.float64)[:, None] * inv[None], 1.0

    return angles


def yarn_angles(base: float, params: dict[str, Any]) -> Angles:
    """transformers' own YaRN frequencies and attention factor (float64)."""

    def angles(p: np.ndarray, d: int, n: int) -> tuple[T, float]:
        transformers = pytest.importorskip("transformers")
        from transformers import modeling_rope_utils as rope_utils

        from harness.hf_reference import float64_torch_in

        c = transformers.LlamaConfig(
            hidden_size=d * 2, num_attention_heads=2, head_dim=d, max_position_embeddings=131072,
            rope_parameters={"rope_type": "yarn", "rope_theta": base, **params},
        )  # fmt: skip
        with float64_torch_in(rope_utils):
            inv, factor = rope_utils._compute_yarn_parameters(c, torch.device("cpu"), None)
        return torch.tensor(p, dtype=torch.float64)[:, None] * inv[None], float(factor)

    return angles


def t_rope(x: T, p: np.ndarray, n: int, style: str, angles: Angles) -> T:
    d = x.shape[-1]
    a, gain = angles(p, d, n)  # (n, r/2)
    r = 2 * a.shape[-1]
    xr = x[..., :r]
    if style == "interleaved":
        cos, sin = a.cos().repeat_interleave(2, -1), a.sin().repeat_interleave(2, -1)
        turned = torch.stack((-xr[..., 1::2], xr[..., 0::2]), -1).flatten(-2)
    else:
        cos, sin = torch.cat((a, a), -1).cos(), torch.cat((a, a), -1).sin()
        turned = torch.cat((-xr[..., r // 2 :], xr[..., : r // 2]), -1)
    return torch.cat((xr * cos * gain + turned * sin * gain, x[..., r:]), -1)


@dataclass
class Head:
    """One head chain's settings, for the service (``variants`` …) and the reference."""

    variants: Variants = field(default_factory=Variants)
    scale: float = 0.5
    additive: Array | None = None  # (…, L, S)
    padded: BoolArray | None = None  # (…, L)
    policy: FullyMaskedPolicy = "zero"
    past: Past | None = None
    angles: Angles | None = None


def t_head(tape: Tape, q: T, k: T, v: T, h: Head, past: tuple[T, T] | None = None) -> T:
    """The head's chain in torch, each intermediate kept under its step's name."""
    var = h.variants
    n_past = 0 if past is None else past[0].shape[-2]
    pq = np.arange(n_past, n_past + q.shape[-2]) if var.positions is None else var.positions
    pk = pq if past is not None else var.context_positions
    pk = np.arange(k.shape[-2]) if pk is None else pk
    if var.clip_qkv is not None:
        c = var.clip_qkv
        q, k, v = (
            tape.keep(f"{s}_clipped", t.clamp(-c, c)) for s, t in zip("qkv", (q, k, v), strict=True)
        )
    norms = var.q_norm is not None and var.k_norm is not None
    assert var.q_norm is None or var.k_norm is not None
    if norms and var.q_norm is not None and var.k_norm is not None and not var.q_norm.after_rope:
        q = tape.keep("q_normed", t_norm(tape, "q", q, var.q_norm))
        k = tape.keep("k_normed", t_norm(tape, "k", k, var.k_norm))
    if var.rope is not None:
        assert h.angles is not None
        n = int(pq.max()) + 1
        q = tape.keep("q_rotated", t_rope(q, pq, n, var.rope.style, h.angles))
        k = tape.keep("k_rotated", t_rope(k, pk, n, var.rope.style, h.angles))
    if norms and var.q_norm is not None and var.k_norm is not None and var.q_norm.after_rope:
        q = tape.keep("q_normed", t_norm(tape, "q", q, var.q_norm))
        k = tape.keep("k_normed", t_norm(tape, "k", k, var.k_norm))
    if var.temperature is not None:
        t = var.temperature
        f = [math.log1p(math.floor((p + t.position_shift) / t.floor_scale)) * t.attn_scale + 1
             for p in pq.tolist()]  # fmt: skip
        q = tape.keep("q_tempered", q * torch.tensor(f, dtype=torch.float64)[:, None])
    if var.v_norm is not None:
        v = tape.keep("v_normed", t_norm(tape, "v", v, var.v_norm))
    if past is not None:
        k = tape.keep("present_k", torch.cat((past[0], k), -2))
        v = tape.keep("present_v", torch.cat((past[1], v), -2))
    s = tape.keep("scores", q @ k.transpose(-1, -2))
    s = tape.keep("scaled_scores", s * h.scale)
    if var.softcap is not None:
        s = tape.keep("capped_scores", var.softcap * torch.tanh(s / var.softcap))
    if var.position_bias is not None:
        s = tape.keep("biased_scores", s + tape.leaf("position_bias", var.position_bias))
    if h.additive is not None:
        s = tape.keep("masked_scores", s + torch.tensor(h.additive))
    full = torch.isneginf(s).all(-1, keepdim=True)  # (…, L, 1)
    if var.sinks is not None:
        sinks = tape.leaf("sinks", var.sinks)
        col = (sinks[:, None, None] if sinks.ndim else sinks).expand(*s.shape[:-1], 1)
        probs = torch.cat((s, col), -1).softmax(-1)
        p = probs[..., :-1]
    else:
        p = torch.where(full, 0.0, s).softmax(-1)
        p = torch.where(full, 1.0 / s.shape[-1] if h.policy == "uniform" else 0.0, p)
    if h.padded is not None:
        p = torch.where(torch.tensor(h.padded)[..., None], 0.0, p)
    p = tape.keep("weights", p)
    return tape.keep("output", p @ v)


# ---- comparing ----------------------------------------------------------------------------


def compare(case: str, ours: dict[str, Array], want: dict[str, Array], besides: set[str]) -> None:
    """Every gradient torch computed equals ours (relative to its largest magnitude), and ours
    names none torch did not compute (but for ``besides``)."""
    assert set(ours) - besides == set(want), (set(ours) ^ set(want)) - besides
    worst = 0.0
    for name, g in want.items():
        got = ours[name]
        assert got.shape == g.shape, (name, got.shape, g.shape)
        diff = float(np.abs(got - g).max()) / max(1.0, float(np.abs(g).max()))
        assert diff <= TOL, (name, diff)
        worst = max(worst, diff)
    WORST[case] = max(WORST.get(case, 0.0), worst)


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def causal(L: int, S: int) -> Array:
    """(L, S) additive: −∞ above the lower-right diagonal."""
    return np.where(np.arange(S)[None] > np.arange(L)[:, None] + (S - L), -np.inf, 0.0)


# ---- the head's chain (/attention's shapes: (B, L, d), or heads (B, h, L, d)) ----------------

B, L, S, D_K, D_V, H = 2, 5, 6, 4, 3, 2


def heads_shape(n: int, d: int) -> tuple[int, ...]:
    return (B, H, n, d)


def norm(r: np.random.Generator, **kw: Any) -> QKNorm:
    return QKNorm(**{"type": "rms", "eps": 1e-6, **kw})


def full_rows_mask() -> Array:
    """(B, 1, L, S): causal, key 0 padding, row 1 of item 0 and row L − 2 of item 1 fully masked."""
    m = np.broadcast_to(causal(L, S), (B, 1, L, S)).copy()
    m[:, :, :, 0] = -np.inf  # key 0 padding
    m[0, :, 1, :] = -np.inf
    m[1, :, L - 2, :] = -np.inf
    return m


def cases() -> dict[str, Callable[[np.random.Generator], Head]]:
    base = 10_000.0
    yarn = {
        "factor": 8.0,
        "original_max_position_embeddings": 4,
        "beta_fast": 4.0,
        "beta_slow": 1.0,
        "truncate": False,
    }
    y = YarnScaling(8.0, 4, 4.0, 1.0, None, None, False, None)
    return {
        "plain": lambda r: Head(),
        "causal": lambda r: Head(additive=causal(L, S)),
        "padding": lambda r: Head(
            additive=np.where(np.arange(S) >= np.array([[S], [S - 2]])[:, None], -np.inf, 0.0)
            + 0.3 * r.normal(size=(B, L, S)),  # padded keys of item 1, and finite biases
            padded=np.array([[False] * L, [False] * (L - 1) + [True]])[:, None, :],
        ),
        "fully_masked_zero": lambda r: Head(additive=full_rows_mask(), policy="zero"),
        "fully_masked_uniform": lambda r: Head(additive=full_rows_mask(), policy="uniform"),
        "error_policy": lambda r: Head(additive=causal(L, S), policy="error"),
        "clip": lambda r: Head(Variants(clip_qkv=0.8)),
        "qk_norm_rms": lambda r: Head(
            Variants(
                q_norm=norm(r, weight=r.normal(size=D_K)), k_norm=norm(r, weight=r.normal(size=D_K))
            )
        ),
        "qk_norm_layer_per_head": lambda r: Head(
            Variants(
                q_norm=norm(
                    r, type="layer", weight=r.normal(size=(H, D_K)), bias=r.normal(size=(H, D_K))
                ),
                k_norm=norm(
                    r, type="layer", weight=r.normal(size=(1, D_K)), bias=r.normal(size=(1, D_K))
                ),
            )
        ),
        "qk_norm_projection": lambda r: Head(
            Variants(
                q_norm=norm(r, over="projection", weight=r.normal(size=H * D_K)),
                k_norm=norm(
                    r, over="projection", weight=r.normal(size=H * D_K), zero_centered=True
                ),
            )
        ),
        "qk_norm_after_rope": lambda r: Head(
            Variants(
                rope=Rope(base), q_norm=norm(r, after_rope=True), k_norm=norm(r, after_rope=True)
            ),
            angles=default_angles(base),
        ),
        "rope_half": lambda r: Head(Variants(rope=Rope(base)), angles=default_angles(base)),
        "rope_interleaved": lambda r: Head(
            Variants(rope=Rope(base, "interleaved")), angles=default_angles(base)
        ),
        "rope_partial": lambda r: Head(
            Variants(rope=Rope(base, "half", 2)), angles=default_angles(base, 2)
        ),
        "rope_proportional": lambda r: Head(
            Variants(rope=Rope(base, "proportional", 2)), angles=proportional_angles(base, 2)
        ),
        "rope_linear": lambda r: Head(
            Variants(rope=Rope(base, scaling=LinearScaling(4.0))),
            angles=default_angles(base, linear=4.0),
        ),
        "rope_yarn": lambda r: Head(
            Variants(
                rope=Rope(base, scaling=y),
                positions=np.array([3, 9, 20, 40, 77]),
                context_positions=np.arange(0, 60, 10),
            ),
            angles=yarn_angles(base, yarn),
        ),
        "temperature": lambda r: Head(Variants(temperature=Temperature(2.0, 0.7, 1))),
        "v_norm": lambda r: Head(Variants(v_norm=QKNorm("rms", 1e-6))),
        "softcap": lambda r: Head(Variants(softcap=0.9)),
        "position_bias": lambda r: Head(Variants(position_bias=r.normal(size=(H, L, S)))),
        "sinks_scalar": lambda r: Head(Variants(sinks=0.4), additive=full_rows_mask()),
        "sinks_per_head": lambda r: Head(
            Variants(sinks=r.normal(size=H)),
            additive=causal(L, S),
            padded=np.array([[True] + [False] * (L - 1), [False] * L])[:, None, :],
        ),
        "all_together": lambda r: Head(
            Variants(
                clip_qkv=1.5,
                q_norm=norm(r, weight=r.normal(size=D_K)),
                k_norm=norm(r, type="layer", weight=r.normal(size=(H, D_K))),
                rope=Rope(base, "interleaved"),
                temperature=Temperature(2.0, 0.5, 0),
                v_norm=QKNorm("rms", 1e-5),
                softcap=1.3,
                position_bias=r.normal(size=(1, L, S)),
                sinks=r.normal(size=H),
            ),
            additive=full_rows_mask(),
            angles=default_angles(base),
        ),
    }


CASES = cases()


def run_head(case: str, h: Head, r: np.random.Generator, past: int = 0) -> None:
    q = 1.5 * r.normal(size=heads_shape(L, D_K))
    k = 1.5 * r.normal(size=heads_shape(S - past, D_K))
    v = r.normal(size=heads_shape(S - past, D_V))
    cache = None if not past else Past(r.normal(size=heads_shape(past, D_K)),
                                       r.normal(size=heads_shape(past, D_V)))  # fmt: skip
    trace = scaled_dot_product_attention(
        q, k, v, scale=h.scale, additive=h.additive, padded_queries=h.padded,
        fully_masked_policy=h.policy, variants=h.variants, past=cache,
    )  # fmt: skip
    d_out = r.normal(size=trace.output.shape)
    ours = attention_backward(
        trace, d_out, additive=h.additive, padded_queries=h.padded,
        fully_masked_policy=h.policy, variants=h.variants, past=cache,
    )  # fmt: skip
    tape = Tape()
    tq, tk, tv = tape.leaf("q", q), tape.leaf("k", k), tape.leaf("v", v)
    tpast = None if cache is None else (tape.leaf("past_k", cache.k), tape.leaf("past_v", cache.v))
    out = t_head(tape, tq, tk, tv, h, tpast)
    np.testing.assert_allclose(out.detach().numpy(), trace.output, rtol=0, atol=1e-12)
    out.backward(torch.tensor(d_out))
    compare(case, ours, tape.grads(), {"row_dot"})
    row_dot = (d_out * trace.output).sum(-1)  # D = rowsum(dO ∘ O)
    assert np.abs(ours["row_dot"] - row_dot).max() <= TOL * max(1.0, np.abs(row_dot).max())


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_each_variant_is_autograd(case: str, seed: int) -> None:
    r = rng(seed)
    run_head(case, CASES[case](r), r)


@pytest.mark.parametrize("case", ["plain", "causal", "rope_half", "all_together"])
def test_a_decode_step_is_autograd_with_the_caches_gradient(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``past`` (3 cached tokens, 3 new): the new keys' and values' gradients, and the
    cache's (``grad_past_k``, ``grad_past_v``); positions P … P + L − 1."""
    monkeypatch.setattr(sys.modules[__name__], "L", 3)  # the cases' shapes: 3 new queries
    r = rng(7)
    h = replace(CASES[case](r), scale=0.7)
    h.additive = None if h.additive is None else causal(L, S)
    run_head(case + "_decode", h, r, past=3)


def test_masked_cells_and_uniform_rows_get_no_score_gradient() -> None:
    """dS is exactly 0 where masked, and on rows the uniform policy filled."""
    r = rng(3)
    h = CASES["fully_masked_uniform"](r)
    q, k, v = (r.normal(size=heads_shape(n, d)) for n, d in ((L, D_K), (S, D_K), (S, D_V)))
    trace = scaled_dot_product_attention(
        q, k, v, scale=h.scale, additive=h.additive, fully_masked_policy="uniform"
    )
    ours = attention_backward(
        trace, r.normal(size=(B, H, L, D_V)), additive=h.additive, fully_masked_policy="uniform"
    )
    ds = ours["grad_masked_scores"]
    assert h.additive is not None
    assert (ds[np.broadcast_to(np.isneginf(h.additive), ds.shape)] == 0).all()
    assert (ds[0, :, 1] == 0).all() and (ds[1, :, L - 2] == 0).all()
    assert np.abs(ds[0, :, 2]).max() > 0


# ---- the block: multihead attention with projections, GQA, gate, W_o, residual, layer norm ----


@dataclass
class Block:
    h: int = 4
    h_kv: int = 4
    variants: Variants = field(default_factory=Variants)
    angles: Angles | None = None
    mask: bool = False
    policy: FullyMaskedPolicy = "zero"
    gate: bool = False
    w_o: bool = True
    b: bool = True
    residual: bool = False
    norm: str | None = None  # "features", "all"
    context: bool = False
    past: int = 0


BLOCKS: dict[str, Block] = {
    "mha": Block(),
    "mha_no_bias_no_w_o": Block(w_o=False, b=False),
    "gqa": Block(h=4, h_kv=2),
    "mqa_cross": Block(h=4, h_kv=1, context=True),
    "gated": Block(gate=True),
    "residual_layer_norm": Block(residual=True, norm="features", mask=True),
    "layer_norm_all": Block(residual=True, norm="all"),
    "gqa_everything": Block(
        h=4,
        h_kv=2,
        gate=True,
        residual=True,
        norm="features",
        mask=True,
        policy="uniform",
        variants=Variants(
            clip_qkv=2.0,
            rope=Rope(500.0),
            softcap=2.0,
            sinks=np.arange(4.0) / 4,
            q_norm=QKNorm("rms", 1e-6, np.linspace(0.5, 1.5, 4)),
            k_norm=QKNorm("rms", 1e-6, np.linspace(-1, 1, 8).reshape(2, 4)),
        ),
        angles=default_angles(500.0),
    ),
    "gqa_decode": Block(
        h=4,
        h_kv=2,
        past=2,
        residual=True,
        variants=Variants(rope=Rope(500.0)),
        angles=default_angles(500.0),
    ),
}


def block_mask(Lq: int, Sk: int) -> CombinedMask:
    allowed = np.broadcast_to(~np.isneginf(causal(Lq, Sk)), (B, Lq, Sk)).copy()
    allowed[1, :, 0] = False  # item 1's first key is padding: its row 0 has no key left
    padded = np.zeros((B, Lq), dtype=bool)
    padded[0, -1] = True
    allowed[padded] = False
    return CombinedMask(allowed, np.where(allowed, 0.0, -np.inf), padded)


@pytest.mark.parametrize("name", BLOCKS)
def test_a_multihead_block_is_autograd(name: str) -> None:
    c = BLOCKS[name]
    r = rng(11)
    d_model, d_k, d_v, Lq, P = 6, 4, 3, 4, c.past
    Sk = (5 if c.context else Lq) + P
    h, h_kv = c.h, c.h_kv
    x = r.normal(size=(B, Lq, d_model))
    context = r.normal(size=(B, Sk - P, d_model)) if c.context else None
    w = MultiheadWeights(
        w_q=r.normal(size=(d_model, h * d_k)) / 2, w_k=r.normal(size=(d_model, h_kv * d_k)) / 2,
        w_v=r.normal(size=(d_model, h_kv * d_v)),
        b_q=r.normal(size=h * d_k) if c.b else None, b_k=r.normal(size=h_kv * d_k) if c.b else None,
        b_v=r.normal(size=h_kv * d_v) if c.b else None,
        w_o=r.normal(size=(h * d_v, d_model)) if c.w_o else None,
        b_o=r.normal(size=d_model) if c.b and c.w_o else None,
        w_g=r.normal(size=(d_model, h * d_v)) if c.gate else None,
        b_g=r.normal(size=h * d_v) if c.gate else None,
    )  # fmt: skip
    ln = None
    if c.norm is not None:
        ln = LayerNorm(1e-5, r.normal(size=d_model), r.normal(size=d_model), c.norm)  # type: ignore[arg-type]
    mask = block_mask(Lq, Sk) if c.mask else None
    past = (
        None if not P else Past(r.normal(size=(B, h_kv, P, d_k)), r.normal(size=(B, h_kv, P, d_v)))
    )
    trace = multihead_attention(
        x, w, num_heads=h, num_kv_heads=h_kv, context=context, mask=mask,
        fully_masked_policy=c.policy, residual=c.residual, norm=ln, variants=c.variants,
        past=past,
    )  # fmt: skip
    d_y = r.normal(size=trace.output.shape)
    ours = multihead_backward(
        x, w, trace, d_y, num_kv_heads=h_kv, context=context, mask=mask,
        fully_masked_policy=c.policy, residual=c.residual, norm=ln, variants=c.variants,
        past=past,
    )  # fmt: skip

    tape = Tape()
    tx = tape.leaf("x", x)
    src = tx if context is None else tape.leaf("context", context)

    def lin(a: T, wn: str, bn: str, wa: Array | None, ba: Array | None) -> T:
        assert wa is not None
        y = a @ tape.leaf(wn, wa)
        return y if ba is None else y + tape.leaf(bn, ba)

    def split(t: T, n: int) -> T:
        return t.reshape(B, t.shape[1], n, -1).transpose(1, 2)

    tq = tape.keep("q", split(lin(tx, "w_q", "b_q", w.w_q, w.b_q), h))
    tk = tape.keep("k", split(lin(src, "w_k", "b_k", w.w_k, w.b_k), h_kv))
    tv = tape.keep("v", split(lin(src, "w_v", "b_v", w.w_v, w.b_v), h_kv))
    g = h // h_kv
    tpast = None
    if past is not None:
        pk, pv = tape.leaf("past_k", past.k), tape.leaf("past_v", past.v)
        tpast = (pk.repeat_interleave(g, 1), pv.repeat_interleave(g, 1))
    head = Head(
        c.variants, 1 / math.sqrt(d_k), None if mask is None else mask.additive[:, None],
        None if mask is None else mask.padded_queries[:, None], c.policy, angles=c.angles,
    )  # fmt: skip
    o = t_head(tape, tq, tk.repeat_interleave(g, 1), tv.repeat_interleave(g, 1), head, tpast)
    y = tape.keep("concat", o.transpose(1, 2).reshape(B, Lq, h * d_v))
    if c.gate:
        gate = tape.keep("gate", torch.sigmoid(lin(tx, "gate_w", "gate_b", w.w_g, w.b_g)))
        y = tape.keep("gated", y * gate)
    y = tape.keep("projected", y if w.w_o is None else lin(y, "w_o", "b_o", w.w_o, w.b_o))
    if c.residual:
        y = tape.keep("residual", tx + y)
    if ln is not None:
        dims = (-1,) if ln.over == "features" else (-2, -1)
        mean, var = y.mean(dims, keepdim=True), y.var(dims, keepdim=True, unbiased=False)
        assert ln.gamma is not None and ln.beta is not None
        gamma, beta = tape.leaf("ln_gamma", ln.gamma), tape.leaf("ln_beta", ln.beta)
        y = tape.keep("layer_norm", (y - mean) / torch.sqrt(var + ln.eps) * gamma + beta)
    np.testing.assert_allclose(y.detach().numpy(), trace.output, rtol=0, atol=1e-11)
    y.backward(torch.tensor(d_y))
    compare("block_" + name, ours, tape.grads(), {"row_dot"})


def test_heads_given_directly_get_their_block_gradients() -> None:
    """attend_heads (no projections): the block's rules from ``grad`` down to the heads', and
    the residual's share of the block's input as ``grad_x_in``."""
    r = rng(5)
    q, k, v = r.normal(size=(B, 4, L, 3)), r.normal(size=(B, 2, S, 3)), r.normal(size=(B, 2, S, 3))
    x_in, w_o = r.normal(size=(B, L, 12)), r.normal(size=(12, 12))
    trace = attend_heads(q, k, v, w_o=w_o, x_in=x_in, residual=True)
    d_y = r.normal(size=trace.output.shape)
    ours = heads_backward(trace, d_y, w_o=w_o, residual=True, num_kv_heads=2)
    tape = Tape()
    tq, tk, tv, tx = (
        tape.leaf(n, a) for n, a in zip(("q", "k", "v", "x_in"), (q, k, v, x_in), strict=True)
    )
    o = t_head(tape, tq, tk.repeat_interleave(2, 1), tv.repeat_interleave(2, 1),
               Head(scale=1 / math.sqrt(3)))  # fmt: skip
    y = tape.keep("concat", o.transpose(1, 2).reshape(B, L, 12))
    y = tape.keep("projected", y @ tape.leaf("w_o", w_o))
    y = tape.keep("residual", tx + y)
    y.backward(torch.tensor(d_y))
    compare("heads_direct", ours, tape.grads(), {"row_dot"})


def test_the_runner_accumulates_a_form_read_twice_and_refuses_a_step_without_a_rule() -> None:
    """The runner alone, over a chain of its own: x read by two steps gets both gradients."""
    twice = (
        chain.Step("double", "scale", reads="q", into="scores", run=lambda x, st, s: 2 * x,
                   back=lambda g, x, st, s: {"q": 2 * g}),
        chain.Step("plus_q", "bias", reads="scores", run=lambda x, st, s: x + st.made["q"],
                   back=lambda g, x, st, s: {"scores": g, "q": g}),
    )  # fmt: skip
    x = np.arange(3.0)
    st = chain.run(twice, chain.start(x, x, x), chain.Setup(Variants()))
    grads = backward(twice, st, chain.Setup(Variants()), np.ones(3))
    np.testing.assert_array_equal(grads["grad_q"], 3 * np.ones(3))  # ∂(2x + x)/∂x = 3
    blind = (replace(twice[0], back=None),)
    with pytest.raises(NotImplementedError, match="double"):
        backward(blind, st, chain.Setup(Variants()), np.ones(3))


def test_every_step_has_a_rule() -> None:
    assert [s.name for s in chain.HEAD + chain.BLOCK if s.back is None] == []
