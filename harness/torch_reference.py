"""Reference cases computed by PyTorch (float64), independent of the service's NumPy engine.

Each case is (name, endpoint, request body, expected outputs). ``scripts/make_golden.py`` stores
the cases for one fixed seed in ``tests/fixtures/golden.json``, so the suite checks them without
torch; ``tests/core/test_torch_live.py`` rebuilds them for other seeds with a live torch.
Torch is imported only by this module.
"""

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

Case = tuple[str, str, dict[str, Any], dict[str, Any]]
T = torch.Tensor


def t(a: Any) -> T:
    return torch.as_tensor(np.asarray(a, dtype=np.float64))


def n(x: T) -> list[Any]:
    return x.detach().numpy().tolist()  # type: ignore[no-any-return]


def trace(
    q: T,
    k: T,
    v: T,
    *,
    mask: T | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> dict[str, Any]:
    """Intermediates with torch ops, output from F.scaled_dot_product_attention itself.

    ``mask`` is torch's attn_mask: bool (True = may attend) or float (added)."""
    d_k = q.shape[-1]
    s = 1.0 / d_k**0.5 if scale is None else scale
    kk = k
    if enable_gqa:
        rep = q.shape[-3] // k.shape[-3]
        kk = k.repeat_interleave(rep, dim=-3)
    scores = q @ kk.transpose(-2, -1)
    scaled = scores * s
    L, S = scores.shape[-2:]
    bias = torch.zeros(L, S, dtype=torch.float64)
    if is_causal:
        bias = bias.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        bias = bias + (torch.where(mask, 0.0, float("-inf")) if mask.dtype == torch.bool else mask)
    masked = scaled + bias
    weights = torch.ops.aten._safe_softmax(masked, -1)  # torch ≥ 2.5: fully masked rows → 0
    output = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
    )
    out = {
        "scores": n(scores),
        "scaled_scores": n(scaled),
        "weights": n(weights),
        "output": n(output),
    }
    if mask is not None or is_causal:
        out["masked_scores"] = [
            [None if np.isneginf(e) else e for e in row]
            for row in masked.reshape(-1, S).numpy().tolist()
        ]
        out["masked_scores"] = (
            np.array(out["masked_scores"], dtype=object).reshape(masked.shape).tolist()
        )
    return out


def _lists(**arrays: np.ndarray) -> dict[str, Any]:
    """Arrays as the JSON lists a request carries, under their names."""
    return {name: a.tolist() for name, a in arrays.items()}


def linear(x: T, w_out_in: T, b: T | None = None) -> T:
    return F.linear(x, w_out_in, b)


def mha(
    x: T,
    sd: dict[str, T],
    num_heads: int,
    *,
    key_padding_mask: T | None = None,
    attn_mask: T | None = None,
    average: bool = True,
    context: T | None = None,
) -> tuple[T, T]:
    """nn.MultiheadAttention(batch_first=True) with a given state dict. Masks use OUR polarity
    (True = may attend) and are inverted here, because nn.MultiheadAttention's True = masked."""
    d_model = x.shape[-1]
    m = torch.nn.MultiheadAttention(d_model, num_heads, batch_first=True, dtype=torch.float64)
    m.load_state_dict(sd)
    src = x if context is None else context
    out, w = m(
        x,
        src,
        src,
        key_padding_mask=None if key_padding_mask is None else ~key_padding_mask,
        attn_mask=None if attn_mask is None else ~attn_mask,
        need_weights=True,
        average_attn_weights=average,
    )
    return out, w


def sinusoidal(L: int, d: int) -> T:
    pos = torch.arange(L, dtype=torch.float64)[:, None]
    i = torch.arange(d, dtype=torch.float64)[None, :]
    angle = pos / torch.pow(10000.0, (2 * torch.div(i, 2, rounding_mode="floor")) / d)
    return torch.where(i.long() % 2 == 0, torch.sin(angle), torch.cos(angle))


# ---- the cases ---------------------------------------------------------------------------


def build_cases(seed: int) -> list[Case]:
    """Every reference case, with random inputs drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    r = lambda *shape: np.round(rng.normal(size=shape), 6)  # noqa: E731 - short JSON numbers
    cases: list[Case] = []
    for build in BUILDERS:
        cases.extend(build(r))
    return cases


def _worked_examples(r: Callable[..., np.ndarray]) -> list[Case]:
    from service.wire import examples as ex

    cases: list[Case] = []
    # (a) I am Batman, PyTorch layout: Q = X W_qᵀ
    b = ex.I_AM_BATMAN
    x = t(b["x"])
    q, k, v = (linear(x, t(b[w])) for w in ("w_q", "w_k", "w_v"))
    cases.append(
        ("example_batman", "/attention", b, {"q": n(q), "k": n(k), "v": n(v), **trace(q, k, v)})
    )
    # (b) The cat sat: weights from np.random.seed(0); rand(4, 4) ×3, used as X @ W
    c = ex.THE_CAT_SAT
    np.random.seed(0)
    w_q, w_k, w_v = (np.random.rand(4, 4) for _ in range(3))
    x = t(c["x"])
    q, k, v = x @ t(w_q), x @ t(w_k), x @ t(w_v)
    cases.append(
        (
            "example_the_cat_sat",
            "/attention",
            c,
            {"w_q": w_q.tolist(), "w_k": w_k.tolist(), "w_v": w_v.tolist(), **trace(q, k, v)},
        )
    )
    # (c) causal over 4 tokens, direct q, k, v
    m = ex.CAUSAL_FOUR_TOKENS
    cases.append(
        ("example_causal", "/mask", m, trace(t(m["q"]), t(m["k"]), t(m["v"]), is_causal=True))
    )
    # (d) two heads with explicit PE, W_o, residual, layer norm: torch MHA + F.layer_norm
    d = {**ex.TWO_HEADS_FULL_BLOCK}
    d.pop("decimals")
    x_in = t(d["x"]) + t(d["positional_encoding"])
    sd = {
        "in_proj_weight": torch.cat([t(d[w]).T for w in ("w_q", "w_k", "w_v")]),
        "in_proj_bias": torch.zeros(12, dtype=torch.float64),
        "out_proj.weight": t(d["w_o"]).T,
        "out_proj.bias": torch.zeros(4, dtype=torch.float64),
    }
    out, w = mha(x_in[None], sd, 2)
    res = x_in + out[0]
    cases.append(
        (
            "example_two_heads",
            "/multihead",
            d,
            {
                "average_weights": n(w[0]),
                "projected": n(out[0]),
                "residual": n(res),
                "output": n(F.layer_norm(res, (4,), eps=1e-5)),
            },
        )
    )
    return cases


def _sdpa_cases(r: Callable[..., np.ndarray]) -> list[Case]:
    cases: list[Case] = []
    q, k, v = r(4, 3), r(6, 3), r(6, 2)
    tq, tk, tv = t(q), t(k), t(v)
    base = {"q": q.tolist(), "k": k.tolist(), "v": v.tolist()}
    cases.append(("sdpa_plain", "/attention", base, trace(tq, tk, tv)))
    cases.append(("sdpa_scale", "/attention", {**base, "scale": 0.3}, trace(tq, tk, tv, scale=0.3)))
    boolean = r(4, 6) > -0.3
    boolean[2] = False  # a fully masked row: weights and output 0 (torch ≥ 2.5 math path)
    cases.append(
        (
            "sdpa_bool_mask",
            "/mask",
            {**base, "mask": {"type": "boolean", "matrix": boolean.tolist()}},
            trace(tq, tk, tv, mask=torch.as_tensor(boolean)),
        )
    )
    add = r(4, 6)
    add_json = [[None if j > i + 2 else float(add[i, j]) for j in range(6)] for i in range(4)]
    add_t = torch.tensor(
        [[float("-inf") if e is None else e for e in row] for row in add_json], dtype=torch.float64
    )
    cases.append(
        (
            "sdpa_additive",
            "/mask",
            {**base, "mask": {"type": "additive", "matrix": add_json}},
            trace(tq, tk, tv, mask=add_t),
        )
    )
    cases.append(
        (
            "sdpa_causal_lower_right",
            "/mask",
            {**base, "mask": {"type": "causal", "alignment": "lower_right"}},
            trace(tq, tk, tv, mask=causal_lower_right(4, 6)._materialize()),
        )
    )
    cases.append(
        (
            "sdpa_causal_upper_left",
            "/mask",
            {**base, "mask": {"type": "causal"}},
            trace(tq, tk, tv, is_causal=True),
        )
    )
    i, j = np.arange(4)[:, None], np.arange(6)[None, :]
    window = (j >= i - 1) & (j <= i + 2)
    cases.append(
        (
            "sdpa_window_and_causal",
            "/mask",
            {**base, "mask": [{"type": "window", "left": 1, "right": 2}, {"type": "causal"}]},
            trace(tq, tk, tv, mask=torch.as_tensor(window & (j <= i))),
        )
    )
    # batch of 2 with per-item key padding
    qb, kb, vb = r(2, 3, 4), r(2, 5, 4), r(2, 5, 3)
    pad = np.arange(5)[None, :] < np.array([5, 3])[:, None]  # (B, S)
    cases.append(
        (
            "sdpa_batch_key_padding",
            "/mask",
            {
                "q": qb.tolist(),
                "k": kb.tolist(),
                "v": vb.tolist(),
                "mask": {"type": "padding", "key_lengths": [5, 3]},
            },
            trace(t(qb), t(kb), t(vb), mask=torch.as_tensor(pad[:, None, :])),
        )
    )
    return cases


def _projection_cases(r: Callable[..., np.ndarray]) -> list[Case]:
    cases: list[Case] = []
    x, ctx = r(3, 4), r(5, 4)
    w_q, w_k, w_v = r(2, 4), r(2, 4), r(3, 4)  # out_in, as nn.Linear
    b_q, b_k, b_v = r(2), r(2), r(3)
    q = linear(t(x), t(w_q), t(b_q))
    k = linear(t(ctx), t(w_k), t(b_k))
    v = linear(t(ctx), t(w_v), t(b_v))
    body = {
        "x": x.tolist(),
        "context": ctx.tolist(),
        "weight_layout": "out_in",
        **{
            name: a.tolist()
            for name, a in [
                ("w_q", w_q),
                ("w_k", w_k),
                ("w_v", w_v),
                ("b_q", b_q),
                ("b_k", b_k),
                ("b_v", b_v),
            ]
        },
    }
    cases.append(
        (
            "cross_attention_out_in_biases",
            "/attention",
            body,
            {"q": n(q), "k": n(k), "v": n(v), **trace(q, k, v)},
        )
    )
    # the same weights in in_out layout give the same numbers
    body_in_out = {
        **body,
        "weight_layout": "in_out",
        "w_q": w_q.T.tolist(),
        "w_k": w_k.T.tolist(),
        "w_v": w_v.T.tolist(),
    }
    cases.append(
        (
            "cross_attention_in_out_biases",
            "/attention",
            body_in_out,
            {"q": n(q), "k": n(k), "v": n(v), **trace(q, k, v)},
        )
    )
    return cases


def _state_dict(r: Callable[..., np.ndarray], d_model: int) -> dict[str, T]:
    return {
        "in_proj_weight": t(r(3 * d_model, d_model)),
        "in_proj_bias": t(r(3 * d_model)),
        "out_proj.weight": t(r(d_model, d_model)),
        "out_proj.bias": t(r(d_model)),
    }


def _sd_json(sd: dict[str, T]) -> dict[str, Any]:
    return {
        "in_proj_weight": n(sd["in_proj_weight"]),
        "in_proj_bias": n(sd["in_proj_bias"]),
        "out_proj_weight": n(sd["out_proj.weight"]),
        "out_proj_bias": n(sd["out_proj.bias"]),
    }


def _multihead_cases(r: Callable[..., np.ndarray]) -> list[Case]:
    cases: list[Case] = []
    x = r(2, 5, 8)
    sd = _state_dict(r, 8)
    out, w = mha(t(x), sd, 4)
    _, w_heads = mha(t(x), sd, 4, average=False)
    body = {"x": x.tolist(), "num_heads": 4, "weight_layout": "out_in", **_sd_json(sd)}
    cases.append(
        (
            "mha_torch_packed",
            "/multihead",
            body,
            {
                "output": n(out),
                "average_weights": n(w),
                "heads": [{"weights": n(w_heads[:, i])} for i in range(4)],
            },
        )
    )
    # key padding (our polarity: true = keep) and a causal attn_mask
    keep = torch.as_tensor(np.arange(5)[None, :] < np.array([5, 3])[:, None])
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    out, w = mha(t(x), sd, 4, key_padding_mask=keep, attn_mask=causal)
    cases.append(
        (
            "mha_torch_padding_causal",
            "/multihead",
            {**body, "mask": [{"type": "padding", "key_lengths": [5, 3]}, {"type": "causal"}]},
            {"output": n(out), "average_weights": n(w)},
        )
    )
    # cross-attention
    ctx = r(2, 3, 8)
    out, w = mha(t(x), sd, 2, context=t(ctx))
    cases.append(
        (
            "mha_torch_cross",
            "/multihead",
            {**body, "num_heads": 2, "context": ctx.tolist()},
            {"output": n(out), "average_weights": n(w)},
        )
    )
    # per-head weights (in_out layout) equal the combined weights
    W = {
        name: n(sd["in_proj_weight"][i * 8 : (i + 1) * 8].T)
        for i, name in enumerate(("w_q", "w_k", "w_v"))
    }
    heads = [
        {name: np.array(W[name])[:, 2 * h : 2 * h + 2].tolist() for name in W} for h in range(4)
    ]
    out, w = mha(t(x), {**sd, "in_proj_bias": torch.zeros(24, dtype=torch.float64)}, 4)
    cases.append(
        (
            "mha_per_head_weights",
            "/multihead",
            {
                "x": x.tolist(),
                "num_heads": 4,
                "heads": heads,
                "w_o": n(sd["out_proj.weight"].T),
                "b_o": n(sd["out_proj.bias"]),
            },
            {"output": n(out), "average_weights": n(w)},
        )
    )
    # grouped-query attention: 4 query heads, 2 key/value heads, torch enable_gqa
    xg = t(r(1, 4, 6))
    wq, wk, wv = r(6, 8), r(6, 4), r(6, 4)  # in_out: d_k = 2
    qh = (xg @ t(wq)).reshape(1, 4, 4, 2).transpose(1, 2)
    kh = (xg @ t(wk)).reshape(1, 4, 2, 2).transpose(1, 2)
    vh = (xg @ t(wv)).reshape(1, 4, 2, 2).transpose(1, 2)
    o = F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
    cases.append(
        (
            "gqa_enable_gqa",
            "/multihead",
            {
                "x": n(xg[0]),
                "num_heads": 4,
                "num_kv_heads": 2,
                "w_q": wq.tolist(),
                "w_k": wk.tolist(),
                "w_v": wv.tolist(),
            },
            {"output": n(o.transpose(1, 2).reshape(4, 8))},
        )
    )
    # sinusoidal positional encoding, residual and layer norm with gamma/beta, over features and all
    x1 = r(6, 4)
    sd4 = _state_dict(r, 4)
    gamma, beta = r(4), r(4)
    x_in = t(x1) + sinusoidal(6, 4)
    out, _ = mha(x_in[None], sd4, 2)
    res = x_in + out[0]
    ln = {"eps": 1e-6, "gamma": gamma.tolist(), "beta": beta.tolist()}
    base = {
        "x": x1.tolist(),
        "num_heads": 2,
        "weight_layout": "out_in",
        **_sd_json(sd4),
        "positional_encoding": "sinusoidal",
        "residual": True,
    }
    cases.append(
        (
            "block_sinusoidal_residual_layer_norm",
            "/multihead",
            {**base, "layer_norm": ln},
            {
                "x_in": n(x_in),
                "residual": n(res),
                "output": n(F.layer_norm(res, (4,), t(gamma), t(beta), eps=1e-6)),
            },
        )
    )
    over_all = F.layer_norm(res, (6, 4), eps=1e-6) * t(gamma) + t(beta)
    cases.append(
        (
            "block_layer_norm_over_all",
            "/multihead",
            {**base, "layer_norm": {**ln, "over": "all"}},
            {"output": n(over_all)},
        )
    )
    return cases


def _split(y: T, h: int) -> T:
    """(..., n, h·d) -> (..., h, n, d): head i takes output columns i·d … (i+1)·d − 1."""
    return y.reshape(*y.shape[:-1], h, y.shape[-1] // h).transpose(-3, -2)


def _mha_expected(q: T, k: T, v: T, w_o: T, b_o: T, *, enable_gqa: bool = False) -> dict[str, Any]:
    """Heads ``q (..., h, L, d_k)``, ``k (..., h_kv, S, d_k)``, ``v (..., h_kv, S, d_v)`` through
    explicit softmax attention and F.scaled_dot_product_attention (which must agree), then
    concat and ``F.linear(concat, w_o, b_o)`` with ``w_o`` out_in (d_out, h·d_v)."""
    h, d_k = q.shape[-3], q.shape[-1]
    rep = h // k.shape[-3]
    kk, vv = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    scores = q @ kk.transpose(-2, -1)  # (..., h, L, S)
    scaled = scores / d_k**0.5
    weights = torch.softmax(scaled, dim=-1)
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=enable_gqa)  # (..., h, L, d_v)
    torch.testing.assert_close(weights @ vv, out, rtol=1e-12, atol=1e-12)
    concat = out.transpose(-3, -2).flatten(-2)  # (..., L, h·d_v)
    projected = linear(concat, w_o, b_o)  # (..., L, d_out)
    heads = [
        {
            name: n(a[..., i, :, :])
            for name, a in (
                ("q", q),
                ("k", kk),
                ("v", vv),
                ("scores", scores),
                ("scaled_scores", scaled),
                ("weights", weights),
                ("output", out),
            )
        }
        for i in range(h)
    ]
    return {
        "num_heads": h,
        "num_kv_heads": k.shape[-3],
        "d_k": d_k,
        "d_v": v.shape[-1],
        "heads": heads,
        "average_weights": n(weights.mean(dim=-3)),
        "concat": n(concat),
        "projected": n(projected),
        "output": n(projected),
    }


def _nonsquare_weight_cases(r: Callable[..., np.ndarray]) -> list[Case]:
    """Every weight matrix is non-square, so a missing or extra transpose of an out_in weight
    (combined, per head, or w_o) is refused for its shape or changes the numbers."""
    cases: list[Case] = []
    # d_model 6, h 2, d_k 4 (≠ d_model/h = 3), d_v 2 (≠ d_k), d_out 5 (≠ h·d_v = 4), L 3:
    # w_q, w_k 8×6, w_v 4×6, w_o 5×4 (out_in)
    d_model, h, d_k, d_v, d_out, L = 6, 2, 4, 2, 5, 3
    x = r(L, d_model)
    w_q, w_k, w_v = r(h * d_k, d_model), r(h * d_k, d_model), r(h * d_v, d_model)
    b_q, b_k, b_v = r(h * d_k), r(h * d_k), r(h * d_v)
    w_o, b_o = r(d_out, h * d_v), r(d_out)
    tx = t(x)
    expected = _mha_expected(
        _split(linear(tx, t(w_q), t(b_q)), h),
        _split(linear(tx, t(w_k), t(b_k)), h),
        _split(linear(tx, t(w_v), t(b_v)), h),
        t(w_o),
        t(b_o),
    )
    body: dict[str, Any] = {
        "x": x.tolist(),
        "num_heads": h,
        "weight_layout": "out_in",
        **_lists(w_q=w_q, w_k=w_k, w_v=w_v, b_q=b_q, b_k=b_k, b_v=b_v, w_o=w_o, b_o=b_o),
    }
    cases.append(("mha_out_in_combined_nonsquare", "/multihead", body, expected))
    # the same weights transposed into in_out layout give the same numbers
    body_in_out = {
        **body,
        "weight_layout": "in_out",
        **{name: a.T.tolist() for name, a in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v))},
        "w_o": w_o.T.tolist(),
    }
    cases.append(("mha_in_out_combined_nonsquare", "/multihead", body_in_out, expected))

    # per-head weights in out_in layout (w_q, w_k 4×6, w_v 2×6), biases on some heads only,
    # w_o 5×4 out_in; cross-attention over a context of S = 4 ≠ L = 3, batch B = 2
    B, S = 2, 4
    xb, ctx = r(B, L, d_model), r(B, S, d_model)
    heads: list[dict[str, np.ndarray]] = [
        {"w_q": r(d_k, d_model), "w_k": r(d_k, d_model), "w_v": r(d_v, d_model)} for _ in range(h)
    ]
    heads[0] |= {"b_q": r(d_k), "b_k": r(d_k)}  # head 0: no b_v
    heads[1] |= {"b_v": r(d_v)}  # head 1: no b_q, b_k
    w_o, b_o = r(d_out, h * d_v), r(d_out)

    def per_head(src: np.ndarray, name: str) -> T:
        """(B, n, d_model) -> (B, h, n, ·), each head its own F.linear; no bias = zero bias."""
        return torch.stack(
            [
                linear(
                    t(src), t(hd["w_" + name]), t(hd["b_" + name]) if "b_" + name in hd else None
                )
                for hd in heads
            ],
            dim=-3,
        )

    cases.append(
        (
            "mha_per_head_out_in_nonsquare",
            "/multihead",
            {
                "x": xb.tolist(),
                "context": ctx.tolist(),
                "num_heads": h,
                "weight_layout": "out_in",
                "heads": [{name: a.tolist() for name, a in hd.items()} for hd in heads],
                "w_o": w_o.tolist(),
                "b_o": b_o.tolist(),
            },
            _mha_expected(
                per_head(xb, "q"), per_head(ctx, "k"), per_head(ctx, "v"), t(w_o), t(b_o)
            ),
        )
    )

    # grouped-query attention, combined out_in: d_model 5, h 4, h_kv 2, d_k 3, d_v 2, d_out 6, L 4:
    # w_q 12×5, w_k 6×5, w_v 4×5, w_o 6×8; torch enable_gqa
    d_model, h, h_kv, d_k, d_v, d_out, L = 5, 4, 2, 3, 2, 6, 4
    x = r(L, d_model)
    w_q, w_k, w_v = r(h * d_k, d_model), r(h_kv * d_k, d_model), r(h_kv * d_v, d_model)
    b_q, b_k, b_v = r(h * d_k), r(h_kv * d_k), r(h_kv * d_v)
    w_o, b_o = r(d_out, h * d_v), r(d_out)
    tx = t(x)
    cases.append(
        (
            "gqa_out_in_nonsquare",
            "/multihead",
            {
                "x": x.tolist(),
                "num_heads": h,
                "num_kv_heads": h_kv,
                "weight_layout": "out_in",
                **_lists(w_q=w_q, w_k=w_k, w_v=w_v, b_q=b_q, b_k=b_k, b_v=b_v, w_o=w_o, b_o=b_o),
            },
            _mha_expected(
                _split(linear(tx, t(w_q), t(b_q)), h),
                _split(linear(tx, t(w_k), t(b_k)), h_kv),
                _split(linear(tx, t(w_v), t(b_v)), h_kv),
                t(w_o),
                t(b_o),
                enable_gqa=True,
            ),
        )
    )
    return cases


BUILDERS = [
    _worked_examples,
    _sdpa_cases,
    _projection_cases,
    _multihead_cases,
    _nonsquare_weight_cases,  # new builders go last: the earlier cases keep their random draws
]
