"""From a validated request to the response body: draw generated arrays, project, call the
engine, and lay the intermediates out as the contract names them."""

from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.api.schemas import (
    AttentionRequest,
    CausalMask,
    Dims,
    HeadWeights,
    InputFields,
    MultiheadDims,
    MultiheadRequest,
)
from service.core import masks
from service.core.attention import (
    AttentionTrace,
    WeightLayout,
    entropy_bits,
    project,
    scaled_dot_product_attention,
)
from service.core.generate import draw
from service.core.multihead import (
    LayerNorm,
    MultiheadWeights,
    multihead_attention,
    sinusoidal_encoding,
)
from service.core.softmax import rows_by_item

Array = NDArray[np.float64]
Step = dict[str, Any]


def _batched(a: Array) -> Array:
    """(L, d) -> (1, L, d); a batch stays as it is."""
    return a if a.ndim == 3 else a[None]


def _shape(dims: Dims, *rest: int) -> list[int]:
    """A step's shape, with B in front for a batched request."""
    return ([dims.batch] if dims.batch is not None else []) + list(rest)


def _generated(req: InputFields, dims: Dims, widths: dict[str, int]) -> dict[str, Array]:
    """Draw the missing arrays in the contract's order: x, then w_q, w_k, w_v (in_out)."""
    if not dims.generate:
        return {}
    assert req.seed is not None and dims.d_model is not None
    shapes = {"x": (dims.seq_len, dims.d_model)} | {n: (dims.d_model, w) for n, w in widths.items()}
    return draw(req.seed, req.init, [(name, shapes[name]) for name in dims.generate])


def _x(req: InputFields, generated: dict[str, Array]) -> Array:
    """x as given, or as generated."""
    x = generated.get("x", req.x)
    assert x is not None
    return x


def _generate_steps(req: InputFields, generated: dict[str, Array]) -> list[Step]:
    sample = "rand" if req.init == "uniform" else "randn"
    return [
        {
            "name": f"generate {name}",
            "formula": f"{name} = RandomState({req.seed}).{sample}({', '.join(map(str, a.shape))})",
            "shape": list(a.shape),
        }
        for name, a in generated.items()
    ]


def _weight(req: InputFields, name: str, generated: dict[str, Array]) -> tuple[Array, WeightLayout]:
    """A projection weight and its layout (generated weights are always in_out)."""
    if name in generated:
        return generated[name], "in_out"
    w = getattr(req, name)
    assert w is not None
    return w, req.weight_layout


def _in_out(w: Array, layout: WeightLayout) -> Array:
    """A weight in in_out layout (X @ W), whatever layout it came in."""
    return w if layout == "in_out" else w.T


def _projection_formula(out: str, source: str, w: str, layout: str, bias: bool) -> str:
    t = "ᵀ" if layout == "out_in" else ""
    return f"{out} = {source} {w}{t}" + (f" + b_{w[-1]}" if bias else "")


def _conventions(req: InputFields, scale_given: bool) -> dict[str, Any]:
    alignments = [m.alignment for m in req.mask or [] if isinstance(m, CausalMask)]
    return {
        "weight_layout": req.weight_layout,
        "generated_weight_layout": "in_out",
        "scale": "given" if scale_given else "1/sqrt(d_k)",
        "boolean_masks": "true = may attend",
        "causal_alignment": alignments[0] if alignments else "upper_left",
        "fully_masked_rows": req.fully_masked_rows,
        "softmax": "row-wise over keys, max-subtracted",
        "json_non_finite": "null (a masked score is −∞)",
    }


def _scale_formula(scale: float, d_k: int, given: bool) -> str:
    return f"scale = {scale:.10g} (given)" if given else f"scale = 1/√d_k = 1/√{d_k} = {scale:.10g}"


def _summary(
    weights: Array, tokens: list[str] | None, ctx: list[str] | None, decimals: int | None
) -> list[list[dict[str, Any]]]:
    """Per batch item, per query row: the key it attends to most, that weight, and the entropy.
    A row whose weights are all 0 (fully masked) has no top key."""
    top = weights.argmax(axis=-1)  # (B, L)
    top_w = weights.max(axis=-1)  # (B, L), the weight at `top`
    attends = (top_w > 0.0).tolist()  # (B, L), false on rows with every key masked
    entropy = entropy_bits(weights)  # (B, L)
    if decimals is not None:
        top_w, entropy = np.round(top_w, decimals), np.round(entropy, decimals)
    return [
        [
            {
                "token": tokens[i] if tokens else None,
                "top_key": ctx[j] if ctx and a else None,
                "top_key_index": j if a else None,
                "top_weight": w,
                "entropy_bits": e,
            }
            for i, (j, w, e, a) in enumerate(zip(js, ws, es, has, strict=True))
        ]
        for js, ws, es, has in zip(
            top.tolist(), top_w.tolist(), entropy.tolist(), attends, strict=True
        )
    ]


def _attention_steps(
    trace: AttentionTrace, dims: Dims, scale_given: bool, masked: bool
) -> list[Step]:
    lead = list(trace.scores.shape[:-2])[1:]  # heads axis in /multihead, nothing in /attention

    def shape(*rest: int) -> list[int]:
        return _shape(dims, *lead, *rest)

    steps = [
        {"name": "scores", "formula": "Q Kᵀ", "shape": shape(dims.seq_len, dims.ctx_len)},
        {
            "name": "scaled_scores",
            "formula": "Q Kᵀ · scale, " + _scale_formula(trace.scale, dims.d_k, scale_given),
            "shape": shape(dims.seq_len, dims.ctx_len),
        },
    ]
    if masked:
        steps.append(
            {
                "name": "masked_scores",
                "formula": "scaled_scores + M, M = 0 where a query may attend, −∞ (null) where "
                "masked, plus any additive mask values",
                "shape": shape(dims.seq_len, dims.ctx_len),
            }
        )
    steps += [
        {
            "name": "weights",
            "formula": "softmax over keys: exp(s − max(s)) / Σ exp(s − max(s)), row by row",
            "shape": shape(dims.seq_len, dims.ctx_len),
        },
        {"name": "output", "formula": "weights V", "shape": shape(dims.seq_len, dims.d_v)},
    ]
    return steps


def _mask_outputs(mask: masks.CombinedMask, trace: AttentionTrace) -> dict[str, Any]:
    return {
        "mask": mask.allowed,
        "additive_mask": mask.additive,
        "fully_masked_rows": rows_by_item(trace.fully_masked_rows),  # per batch item
    }


_PER_SEQUENCE = {
    "q", "k", "v", "scores", "scaled_scores", "masked_scores", "weights", "output", "mask",
    "additive_mask", "fully_masked_rows", "summary", "average_weights", "x_in", "concat",
    "projected", "residual", "layer_norm",
}  # fmt: skip


def wants(req: InputFields, name: str) -> bool:
    """Whether the response should carry ``name`` (``include`` absent means everything)."""
    return req.include is None or name in req.include


def _finish(
    body: dict[str, Any], req: InputFields, dims: Dims, always: tuple[str, ...]
) -> dict[str, Any]:
    """Keep what `include` asks for and drop the batch axis of an unbatched request (views, no
    copies); the encoder turns the arrays into JSON."""
    out = {k: v for k, v in body.items() if k in always or wants(req, k)}
    if dims.batch is None:
        for key, value in out.items():
            if key in _PER_SEQUENCE:
                out[key] = value[0]
            elif key == "heads":
                out[key] = [{n: a[0] for n, a in head.items()} for head in value]
    return out


def run_attention(req: AttentionRequest, dims: Dims) -> dict[str, Any]:
    """POST /attention and /mask: scaled dot-product attention with every intermediate.
    ``dims`` is ``req.dims()``, already computed when the request was checked."""
    steps: list[Step] = []
    generated = _generated(req, dims, {"w_q": dims.d_k, "w_k": dims.d_k, "w_v": dims.d_v})
    steps += _generate_steps(req, generated)
    if req.q is not None and req.k is not None and req.v is not None:
        q, k, v = _batched(req.q), _batched(req.k), _batched(req.v)
    else:
        x = _batched(_x(req, generated))
        source = x if req.context is None else _batched(req.context)
        src = "X" if req.context is None else "C"
        proj = {}
        for name, inp, label in (("w_q", x, "X"), ("w_k", source, src), ("w_v", source, src)):
            w, layout = _weight(req, name, generated)
            bias = getattr(req, "b_" + name[-1])
            proj[name] = project(inp, w, bias, layout)
            width = dims.d_v if name == "w_v" else dims.d_k
            rows = dims.seq_len if name == "w_q" else dims.ctx_len
            steps.append(
                {
                    "name": name[-1],
                    "formula": _projection_formula(
                        name[-1].upper(), label, "W_" + name[-1], layout, bias is not None
                    ),
                    "shape": _shape(dims, rows, width),
                }
            )
        q, k, v = proj["w_q"], proj["w_k"], proj["w_v"]

    batch = q.shape[0]
    mask = masks.combine(req.mask_specs(), batch, dims.seq_len, dims.ctx_len) if req.mask else None
    trace = scaled_dot_product_attention(
        q,
        k,
        v,
        scale=req.scale,
        additive=None if mask is None else mask.additive,
        padded_queries=None if mask is None else mask.padded_queries,
        fully_masked_policy=req.fully_masked_rows,
    )
    steps += _attention_steps(trace, dims, req.scale is not None, mask is not None)
    body: dict[str, Any] = {
        "q": trace.q,
        "k": trace.k,
        "v": trace.v,
        "scores": trace.scores,
        "scaled_scores": trace.scaled_scores,
    }
    if mask is not None:
        body["masked_scores"] = trace.masked_scores
    body |= {
        "weights": trace.weights,
        "output": trace.output,
        "scale": trace.scale,
        "d_k": dims.d_k,
        "d_v": dims.d_v,
        "tokens": dims.tokens,
        "context_tokens": dims.context_tokens,
        "conventions": _conventions(req, req.scale is not None),
        "summary": _summary(trace.weights, dims.tokens, dims.context_tokens, req.decimals)
        if wants(req, "summary")
        else None,
        "steps": steps,
    }
    if mask is not None:
        body |= _mask_outputs(mask, trace)
    body |= generated
    return _finish(body, req, dims, ("scale", "d_k", "d_v", "conventions"))


def _stack_heads(heads: list[HeadWeights], layout: WeightLayout) -> tuple[Any, ...]:
    """Per-head weights side by side: (w_q, w_k, w_v, b_q, b_k, b_v) in in_out layout, head i
    in columns i·d_k … (i+1)·d_k − 1; a head without a bias gets zeros."""

    def weight(name: str) -> Array:
        return np.concatenate([_in_out(getattr(hd, "w_" + name), layout) for hd in heads], axis=1)

    def bias(name: str) -> Array | None:
        if all(getattr(hd, "b_" + name) is None for hd in heads):
            return None
        parts = [getattr(hd, "b_" + name) for hd in heads]
        widths = [_in_out(getattr(hd, "w_" + name), layout).shape[1] for hd in heads]
        return np.concatenate(
            [np.zeros(w) if p is None else p for p, w in zip(parts, widths, strict=True)]
        )

    return weight("q"), weight("k"), weight("v"), bias("q"), bias("k"), bias("v")


def _multihead_weights(
    req: MultiheadRequest, dims: MultiheadDims, generated: dict[str, Array]
) -> MultiheadWeights:
    """Every accepted weight form, converted to combined in_out weights."""
    d = dims.d_model
    if dims.form == "per_head":
        assert req.heads is not None
        w_q, w_k, w_v, b_q, b_k, b_v = _stack_heads(req.heads, req.weight_layout)
    elif dims.form == "in_proj":
        assert req.in_proj_weight is not None and d is not None
        packed = req.in_proj_weight  # (3·d_model, d_model), rows q, k, v, out_in
        w_q, w_k, w_v = packed[:d].T, packed[d : 2 * d].T, packed[2 * d :].T
        pb = req.in_proj_bias
        b_q, b_k, b_v = (None, None, None) if pb is None else (pb[:d], pb[d : 2 * d], pb[2 * d :])
    else:
        w_q, w_k, w_v = (_in_out(*_weight(req, n, generated)) for n in ("w_q", "w_k", "w_v"))
        b_q, b_k, b_v = req.b_q, req.b_k, req.b_v
    if req.out_proj_weight is not None:
        w_o: Array | None = req.out_proj_weight.T
    elif req.w_o is not None:
        w_o = _in_out(req.w_o, req.weight_layout)
    else:
        w_o = None
    b_o = req.out_proj_bias if req.out_proj_bias is not None else req.b_o
    return MultiheadWeights(w_q, w_k, w_v, b_q, b_k, b_v, w_o, b_o)


def _layer_norm_options(req: MultiheadRequest) -> LayerNorm | None:
    opts = req.layer_norm
    if opts is False:
        return None
    if opts is True:
        return LayerNorm()
    return LayerNorm(eps=opts.eps, gamma=opts.gamma, beta=opts.beta, over=opts.over)


def run_multihead(req: MultiheadRequest, dims: MultiheadDims) -> dict[str, Any]:
    """POST /multihead: multi-head attention, per-head traces and the block around them.
    ``dims`` is ``req.dims()``, already computed when the request was checked."""
    h, h_kv = dims.num_heads, dims.num_kv_heads
    generated = _generated(
        req, dims, {"w_q": h * dims.d_k, "w_k": h_kv * dims.d_k, "w_v": h_kv * dims.d_v}
    )
    steps = _generate_steps(req, generated)
    x = _batched(_x(req, generated))
    context = None if req.context is None else _batched(req.context)
    weights = _multihead_weights(req, dims, generated)
    pe = req.positional_encoding
    positional = sinusoidal_encoding(dims.seq_len, x.shape[-1]) if isinstance(pe, str) else pe
    norm = _layer_norm_options(req)
    mask = (
        masks.combine(req.mask_specs(), x.shape[0], dims.seq_len, dims.ctx_len)
        if req.mask
        else None
    )
    trace = multihead_attention(
        x,
        weights,
        num_heads=h,
        num_kv_heads=h_kv,
        context=context,
        positional=positional,
        mask=mask,
        scale=req.scale,
        fully_masked_policy=req.fully_masked_rows,
        residual=req.residual,
        norm=norm,
    )
    L, S, d_model = dims.seq_len, dims.ctx_len, x.shape[-1]
    x_name = "X_in" if positional is not None else "X"
    if positional is not None:
        kind = "sinusoidal PE (Vaswani et al. 2017)" if isinstance(pe, str) else "P (given)"
        steps.append(
            {"name": "x_in", "formula": f"X_in = X + {kind}", "shape": _shape(dims, L, d_model)}
        )
    src = x_name if context is None else "C"
    gqa = f", key/value head ⌊i·{h_kv}/{h}⌋ serves query head i" if h_kv != h else ""
    steps += [
        {
            "name": "q",
            "formula": f"Q = {x_name} W_q (+ b_q), split into {h} heads of d_k = {dims.d_k} columns",
            "shape": _shape(dims, h, L, dims.d_k),
        },
        {
            "name": "k",
            "formula": f"K = {src} W_k (+ b_k), split into {h_kv} heads{gqa}",
            "shape": _shape(dims, h, S, dims.d_k),
        },
        {
            "name": "v",
            "formula": f"V = {src} W_v (+ b_v), split into {h_kv} heads{gqa}",
            "shape": _shape(dims, h, S, dims.d_v),
        },
    ]
    steps += _attention_steps(trace.heads, dims, req.scale is not None, mask is not None)
    steps += [
        {
            "name": "average_weights",
            "formula": "mean of the heads' weights",
            "shape": _shape(dims, L, S),
        },
        {
            "name": "concat",
            "formula": "Concat(head_1, …, head_h)",
            "shape": _shape(dims, L, h * dims.d_v),
        },
        {
            "name": "projected",
            "formula": "Concat W_o + b_o"
            if weights.w_o is not None
            else "Concat (W_o = identity)" + (" + b_o" if weights.b_o is not None else ""),
            "shape": _shape(dims, L, dims.d_out),
        },
    ]
    if trace.residual is not None:
        steps.append(
            {
                "name": "residual",
                "formula": f"{x_name} + projected",
                "shape": _shape(dims, L, d_model),
            }
        )
    if norm is not None:
        over = "each token's features" if norm.over == "features" else "all numbers of the sequence"
        steps.append(
            {
                "name": "layer_norm",
                "formula": f"(z − mean) / √(var + {norm.eps:g}) · γ + β, mean and biased var over {over}",
                "shape": _shape(dims, L, dims.d_out),
            }
        )
    heads_out = []
    for i in range(h):
        head = {
            "q": trace.heads.q[:, i],
            "k": trace.heads.k[:, i],
            "v": trace.heads.v[:, i],
            "scores": trace.heads.scores[:, i],
            "scaled_scores": trace.heads.scaled_scores[:, i],
        }
        if trace.heads.masked_scores is not None:
            head["masked_scores"] = trace.heads.masked_scores[:, i]
        head |= {"weights": trace.heads.weights[:, i], "output": trace.heads.output[:, i]}
        heads_out.append(head)
    body: dict[str, Any] = {"heads": heads_out, "average_weights": trace.average_weights}
    if positional is not None:
        body["x_in"] = trace.x_in
    body |= {"concat": trace.concat, "projected": trace.projected}
    if trace.residual is not None:
        body["residual"] = trace.residual
    if trace.layer_norm is not None:
        body["layer_norm"] = trace.layer_norm
    body |= {
        "output": trace.output,
        "scale": trace.heads.scale,
        "num_heads": h,
        "num_kv_heads": h_kv,
        "d_k": dims.d_k,
        "d_v": dims.d_v,
        "tokens": dims.tokens,
        "context_tokens": dims.context_tokens,
        "conventions": _conventions(req, req.scale is not None),
        "summary": _summary(trace.average_weights, dims.tokens, dims.context_tokens, req.decimals)
        if wants(req, "summary")
        else None,
        "steps": steps,
    }
    if mask is not None:
        body |= _mask_outputs(mask, trace.heads)
    body |= generated
    return _finish(
        body, req, dims, ("scale", "num_heads", "num_kv_heads", "d_k", "d_v", "conventions")
    )
