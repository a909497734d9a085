"""Every rule that involves several fields of a request, applied before anything is drawn or
computed: input modes, shapes, tokens, masks, heads. A request that breaks one gets a
:class:`FieldError` naming the field; one that keeps them all gets the :class:`Shapes` it
implies, from which the limits are checked and the plan is built (:mod:`service.trace.plan`).
The weight forms (:mod:`service.trace.rows.weight_forms`) and the variants
(:mod:`service.trace.rows.variants`) are rows these rules loop over."""

from dataclasses import replace

import numpy as np

from service.trace.checks import DOTTED, batch_words, check_bias, check_size, weight_out
from service.trace.decode import cache_labels, check_past, past_length
from service.trace.gradients import check_grad_output
from service.trace.mask_rules import (
    check_key_padding,
    check_masks,
    check_ranges,
    mask_warnings,
    num_masks,
    query_positions,
)
from service.trace.rows.latent import latent_dims
from service.trace.rows.variants import VARIANTS
from service.trace.rows.weight_forms import Dims, weight_form
from service.trace.shapes import Shapes
from service.wire.errors import ErrorItem, FieldError, RequestError
from service.wire.schemas.requests import (
    AttentionRequest,
    InputFields,
    LayerNormOptions,
    MaskRequest,
    MultiheadRequest,
)

_PROJECTION_FIELDS = (
    "x",
    "context",
    "w_q",
    "w_k",
    "w_v",
    "b_q",
    "b_k",
    "b_v",
    "seed",
    "d_model",
    "d_k",
    "d_v",
)
_MULTIHEAD_INPUTS = (
    "x",
    "context",
    "seed",
    "d_model",
    "w_q",
    "w_k",
    "w_v",
    "b_q",
    "b_k",
    "b_v",
    "heads",
    "in_proj_weight",
    "in_proj_bias",
    "q_proj_weight",
    "k_proj_weight",
    "v_proj_weight",
    "q_proj_bias",
    "k_proj_bias",
    "v_proj_bias",
    "positional_encoding",
)


def attention_shapes(req: AttentionRequest) -> Shapes:
    """Check how the fields of an /attention or /mask request fit together."""
    direct = [n for n in ("q", "k", "v") if getattr(req, n) is not None]
    projection = [n for n in _PROJECTION_FIELDS if getattr(req, n) is not None]
    if direct and projection:
        raise FieldError(
            projection[0],
            f"give either q, k and v (direct mode) or x with w_q, w_k, w_v (projections mode), not both: found {direct[0]} and {projection[0]}",
        )
    if isinstance(req, MaskRequest) and not req.mask and req.key_padding_mask is None:
        message = (
            "mask is required on /mask: give mask (one mask object or a list), "
            "key_padding_mask, or both"
        )  # key_padding_mask alone is a mask too: its answer has the mask outputs
        raise RequestError([ErrorItem(field="mask", message=message, type="missing")])
    shapes = _direct_shapes(req) if direct else _projection_shapes(req)
    return _with_variants(req, shapes)


def _given_qkv(req: AttentionRequest | MultiheadRequest, ndim: int, form: str) -> int | None:
    """Check q, k and v given directly (``ndim`` dimensions per sequence, ``form`` naming them
    for messages) against each other; return the batch size (None: unbatched)."""
    for n in ("q", "k", "v"):
        if getattr(req, n) is None:
            raise FieldError(n, f"direct mode needs q, k and v; {n} is missing")
    assert req.q is not None and req.k is not None and req.v is not None
    q, k, v = req.q, req.k, req.v
    if not q.ndim == k.ndim == v.ndim:
        raise FieldError("k", f"q, k and v must all be {form} or all be batches [B]{form}")
    batch = q.shape[0] if q.ndim > ndim else None
    if batch is not None and not q.shape[0] == k.shape[0] == v.shape[0]:
        raise FieldError(
            "k",
            f"q, k and v must have the same batch size; got {q.shape[0]}, {k.shape[0]} and {v.shape[0]}",
        )
    if q.shape[-1] != k.shape[-1]:
        raise FieldError(
            "k",
            f"q has {q.shape[-1]} columns but k has {k.shape[-1]}: queries and keys need the same width d_k for Q Kᵀ",
        )
    if k.shape[-2] != v.shape[-2]:
        raise FieldError(
            "v",
            f"k has {k.shape[-2]} rows but v has {v.shape[-2]}: every key needs its value (S rows each)",
        )
    return batch


def _direct_shapes(req: AttentionRequest) -> Shapes:
    batch = _given_qkv(req, 2, "[L][d]")
    assert req.q is not None and req.k is not None and req.v is not None
    seq_len, ctx_len = req.q.shape[-2], req.k.shape[-2]
    tokens, ctx_tokens = _labels(req, seq_len, ctx_len + past_length(req))
    return Shapes(
        endpoint="attention",
        batch=batch,
        seq_len=seq_len,
        ctx_len=ctx_len + past_length(req),
        past_len=past_length(req),
        d_model=None,
        d_k=req.q.shape[-1],
        d_v=req.v.shape[-1],
        num_masks=num_masks(req),
        tokens=tokens,
        context_tokens=ctx_tokens,
    )


def _projection_shapes(req: AttentionRequest) -> Shapes:
    batch, seq_len, ctx_len, d_model = _sequence_shapes(req)
    generate = ["x"] if req.x is None else []
    widths: dict[str, int] = {}
    for name in ("w_q", "w_k", "w_v"):
        w = getattr(req, name)
        if w is None:
            if req.seed is None:
                raise FieldError(
                    name, f"{name} is missing: give {name}, or give seed to generate it"
                )
            generate.append(name)
        else:
            widths[name] = weight_out(req, name, w, d_model)
    if "w_q" in widths and "w_k" in widths and widths["w_q"] != widths["w_k"]:
        raise FieldError(
            "w_k",
            f"w_q gives queries of width {widths['w_q']} but w_k gives keys of width {widths['w_k']}: they must match for Q Kᵀ",
        )
    # generated w_q and w_k default to square (d_k = d_model), as a notebook's d_k = embedding_dim
    d_k = widths.get("w_q", widths.get("w_k", req.d_k if req.d_k is not None else d_model))
    check_size(req.d_k, "d_k", d_k, "the given weights make queries of width")
    d_v = widths.get("w_v", req.d_v if req.d_v is not None else d_k)
    check_size(req.d_v, "d_v", d_v, "w_v makes values of width")
    check_bias(req.b_q, "b_q", d_k, "Q")
    check_bias(req.b_k, "b_k", d_k, "K")
    check_bias(req.b_v, "b_v", d_v, "V")
    tokens, ctx_tokens = _labels(req, seq_len, ctx_len + past_length(req))
    return Shapes(
        endpoint="attention",
        batch=batch,
        seq_len=seq_len,
        ctx_len=ctx_len + past_length(req),
        past_len=past_length(req),
        d_model=d_model,
        d_k=d_k,
        d_v=d_v,
        num_masks=num_masks(req),
        generated=tuple(generate),
        tokens=tokens,
        context_tokens=ctx_tokens,
    )


def multihead_shapes(req: MultiheadRequest) -> Shapes:
    """Check how the fields of a /multihead request fit together."""
    if any(getattr(req, n) is not None for n in ("q", "k", "v")):
        return _with_variants(req, _heads_shapes(req))
    h = req.num_heads
    if h is None:
        raise FieldError(
            "num_heads",
            "num_heads is missing: give the number of heads h (only q, k and v given per head "
            "[h][L][d_k] imply it)",
        )
    if req.mla is not None:  # the latents are a form of their own (service.trace.rows.latent)
        batch, seq_len, ctx_len, d_model = _sequence_shapes(req)
        latent = latent_dims(req, d_model, h)
        dims = Dims(latent.qk_nope_head_dim + latent.qk_rope_head_dim, latent.v_head_dim, h)
        form_name = "latent"
    else:
        latent = None
        form = weight_form(req)
        kv_width = form.kv_width(req)
        batch, seq_len, ctx_len, d_model = _sequence_shapes(req, kv_width)
        dims = form.dims(req, d_model, kv_width or d_model, h)
        form_name = form.name
    d_out = _output_dims(req, h * dims.d_v)
    if req.residual and d_out != d_model:
        raise FieldError(
            "residual",
            f"the residual adds x (width {d_model}) to the attention output (width {d_out}): they must match; choose w_o with {d_model} outputs",
        )
    _check_layer_norm(req, d_out)
    pe = req.positional_encoding
    if isinstance(pe, np.ndarray) and pe.shape != (seq_len, d_model):
        got = "×".join(map(str, pe.shape))
        raise FieldError(
            "positional_encoding",
            f"positional_encoding is {got} but x is {seq_len}×{d_model}: it must be [L][d_model]",
        )
    tokens, ctx_tokens = _labels(req, seq_len, ctx_len + past_length(req))
    shapes = Shapes(
        endpoint="multihead",
        batch=batch,
        seq_len=seq_len,
        ctx_len=ctx_len + past_length(req),
        past_len=past_length(req),
        d_model=d_model,
        d_k=dims.d_k,
        d_v=dims.d_v,
        num_heads=h,
        num_kv_heads=dims.num_kv_heads,
        d_out=d_out,
        num_masks=num_masks(req),
        generated=("x",) * (req.x is None) + dims.generated,
        form=form_name,
        latent=latent,
        positional=pe is not None,
        residual=req.residual,
        layer_norm=req.layer_norm is not False,
        tokens=tokens,
        context_tokens=ctx_tokens,
    )
    return _with_variants(req, shapes)


def _heads_shapes(req: MultiheadRequest) -> Shapes:
    """/multihead with q, k, v given per head, as torch scaled_dot_product_attention takes
    them: q (B, h, L, d_k), k (B, h_kv, S, d_k), v (B, h_kv, S, d_v), B optional."""
    extra = [n for n in _MULTIHEAD_INPUTS if getattr(req, n) is not None]
    extra += ["residual"] if req.residual else []
    if extra:
        name = DOTTED.get(extra[0], extra[0])
        raise FieldError(
            name,
            f"q, k and v are given per head (direct mode), so there is nothing to project: {name} does not apply; give either q, k, v or x with the projections",
        )
    batch = _given_qkv(req, 3, "[h][n][d]")
    assert req.q is not None and req.k is not None and req.v is not None
    q, k, v = req.q, req.k, req.v
    h, seq_len, d_k = q.shape[-3:]
    h_kv, ctx_len = k.shape[-3:-1]
    if v.shape[-3] != h_kv:
        raise FieldError(
            "v", f"k has {h_kv} key heads but v has {v.shape[-3]}: each key head needs its values"
        )
    check_size(req.num_heads, "num_heads", h, "q has query heads:")
    check_size(req.num_kv_heads, "num_kv_heads", h_kv, "k has key/value heads:")
    if h % h_kv:
        raise FieldError(
            "k",
            f"q has {h} heads, which is not a multiple of k's {h_kv} key/value heads: each key/value head must serve the same number of query heads",
        )
    d_v = int(v.shape[-1])
    d_out = _output_dims(req, h * d_v)
    _check_layer_norm(req, d_out)
    tokens, ctx_tokens = _labels(req, seq_len, ctx_len + past_length(req))
    return Shapes(
        endpoint="multihead",
        batch=batch,
        seq_len=int(seq_len),
        ctx_len=int(ctx_len) + past_length(req),
        past_len=past_length(req),
        d_model=None,
        d_k=int(d_k),
        d_v=d_v,
        num_heads=int(h),
        num_kv_heads=int(h_kv),
        d_out=d_out,
        num_masks=num_masks(req),
        layer_norm=req.layer_norm is not False,
        tokens=tokens,
        context_tokens=ctx_tokens,
    )


def _check_layer_norm(req: MultiheadRequest, d_out: int) -> None:
    if isinstance(req.layer_norm, LayerNormOptions):
        for name in ("gamma", "beta"):
            vec = getattr(req.layer_norm, name)
            if vec is not None and vec.shape[0] != d_out:
                raise FieldError(
                    f"layer_norm.{name}",
                    f"layer_norm.{name} has {vec.shape[0]} entries but the normalised output has {d_out} features",
                )


def _output_dims(req: MultiheadRequest, concat_width: int) -> int:
    """Check w_o / out_proj_* against the concatenated heads; return d_out."""
    for given in (
        [n for n in ("w_o", "out_proj_weight", "o_proj_weight") if getattr(req, n) is not None],
        [n for n in ("b_o", "out_proj_bias", "o_proj_bias") if getattr(req, n) is not None],
    ):
        if len(given) > 1:
            a, b = (DOTTED.get(n, n) for n in given[:2])
            raise FieldError(b, f"give {a} or {b}, not both: both are the output projection")
    d_out = concat_width
    if req.w_o is not None:
        d_out = weight_out(
            req,
            "w_o",
            req.w_o,
            concat_width,
            f"the concatenated heads have h·d_v = {concat_width} columns",
        )
    for name in ("out_proj_weight", "o_proj_weight"):
        w = getattr(req, name)
        if w is not None:
            d_out, d_in = w.shape
            if d_in != concat_width:
                label = DOTTED.get(name, name)
                raise FieldError(
                    label,
                    f"{label} is {d_out}×{d_in} but the concatenated heads have h·d_v = {concat_width} columns: it must have {concat_width} columns (out_in, as PyTorch)",
                )
    check_bias(req.b_o, "b_o", d_out, "the output")
    check_bias(req.out_proj_bias, "out_proj_bias", d_out, "the output")
    check_bias(req.o_proj_bias, "o_proj.bias", d_out, "the output")
    return int(d_out)


def _sequence_shapes(
    req: InputFields, kv_width: int | None = None
) -> tuple[int | None, int, int, int]:
    """(B, L, S, d_model) from x, context and the generated-mode sizes; the context must have
    ``kv_width`` columns (default d_model)."""
    batch = None
    if req.x is not None:
        batch = req.x.shape[0] if req.x.ndim == 3 else None
        seq_len, d_model = req.x.shape[-2:]
        if req.seq_len is not None and req.seq_len != seq_len:
            raise FieldError("seq_len", f"seq_len is {req.seq_len} but x has {seq_len} rows")
        if req.d_model is not None and req.d_model != d_model:
            raise FieldError("d_model", f"d_model is {req.d_model} but x has {d_model} columns")
    else:
        if req.seed is None:
            raise FieldError(
                "x",
                "x is missing: give x, or give seed (with d_model and tokens, sentence or seq_len) to generate it",
            )
        seq_len = _seq_len_from_labels(req)
        found = req.d_model if req.d_model is not None else _d_model_from_weights(req)
        if found is None:
            raise FieldError("d_model", "to generate x, give d_model (its number of columns)")
        d_model = found
    ctx_len = seq_len
    if req.context is not None:
        c_batch = req.context.shape[0] if req.context.ndim == 3 else None
        if c_batch != batch:
            raise FieldError(
                "context",
                f"context is {batch_words(c_batch)} but x is {batch_words(batch)}: batch both or neither, with the same B",
            )
        ctx_len, c_width = req.context.shape[-2:]
        if kv_width is None and c_width != d_model:
            raise FieldError(
                "context",
                f"context has {c_width} columns but x has {d_model}: both are projected by the same weights",
            )
        if kv_width is not None and c_width != kv_width:
            raise FieldError(
                "context",
                f"context has {c_width} columns but k_proj.weight takes {kv_width}: the keys and values are projected from the context",
            )
    return batch, int(seq_len), int(ctx_len), int(d_model)


def _seq_len_from_labels(req: InputFields) -> int:
    """L for a generated x: from tokens or sentence, else seq_len."""
    tokens, _ = _labels(req, None, None)
    if tokens is not None:
        if req.seq_len is not None and req.seq_len != len(tokens):
            raise FieldError(
                "seq_len", f"seq_len is {req.seq_len} but there are {len(tokens)} tokens"
            )
        return len(tokens)
    if req.seq_len is None:
        raise FieldError(
            "seq_len",
            "to generate x, give tokens, sentence or seq_len so the sequence length L is known",
        )
    return req.seq_len


def _d_model_from_weights(req: InputFields) -> int | None:
    """d_model as the first given projection weight implies it (its input size)."""
    for name in ("w_q", "w_k", "w_v"):
        w = getattr(req, name, None)
        if isinstance(w, np.ndarray):
            return int(w.shape[0] if req.weight_layout == "in_out" else w.shape[1])
    w = getattr(req, "q_proj_weight", None)  # a state dict's: always out_in
    return None if w is None else int(w.shape[1])


def _labels(
    req: InputFields, seq_len: int | None, ctx_len: int | None
) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """tokens (from tokens or sentence) and context_tokens, checked against L and S."""
    if req.tokens is not None and req.sentence is not None:
        raise FieldError("sentence", "give tokens or sentence, not both")
    tokens = req.sentence.split() if req.sentence is not None else req.tokens
    source = "sentence" if req.sentence is not None else "tokens"
    if tokens is not None and not tokens:
        raise FieldError(
            source, "tokens is empty" if req.sentence is None else "sentence has no words"
        )
    if tokens is not None and seq_len is not None and len(tokens) != seq_len:
        raise FieldError(
            source, f"{source} gives {len(tokens)} tokens but there are {seq_len} query rows (L)"
        )
    ctx = req.context_tokens
    if ctx is not None and ctx_len is not None and len(ctx) != ctx_len:
        raise FieldError(
            "context_tokens",
            f"context_tokens has {len(ctx)} labels but there are {ctx_len} keys (S)",
        )
    if ctx is None and req.context is None and (ctx_len is None or ctx_len == seq_len):
        ctx = tokens  # self-attention: the keys are the queries' tokens
    return (None if tokens is None else tuple(tokens)), (None if ctx is None else tuple(ctx))


def _with_variants(req: AttentionRequest | MultiheadRequest, shapes: Shapes) -> Shapes:
    """Check each variant the request turns on against the shapes (per head: d_k; n = h heads
    on /multihead, 1 on /attention), then the positions they read and the key padding; record
    which variants are on."""
    check_past(req, shapes)
    check_masks(req, shapes.batch, shapes.seq_len, shapes.ctx_len)
    on = [v for v in VARIANTS if v.given(req)]
    for variant in on:
        variant.check(req, shapes)
    for name, given, size, what in (
        ("positions", req.positions, shapes.seq_len, "queries (L)"),
        ("context_positions", req.context_positions, shapes.ctx_len, "keys (S)"),
    ):
        if given is None:
            continue
        if not any(v.uses_positions for v in on):
            raise FieldError(
                name, f"{name} is used by rope, alibi and relative_bias, and none of them is on"
            )
        if len(given) != size:
            raise FieldError(name, f"{name} has {len(given)} entries but there are {size} {what}")
    if shapes.past_len:
        _check_decode_positions(req, shapes, any(v.field == "position_bias" for v in on))
    if req.key_padding_mask is not None:
        check_key_padding(req.key_padding_mask, shapes)
    check_ranges(req, shapes, {v.field for v in on})
    shapes = replace(
        shapes,
        on=frozenset(v.field for v in on),
        warnings=mask_warnings(req),
        num_masks=shapes.num_masks + (shapes.past_len > 0),  # the decode step's causal mask
        context_tokens=cache_labels(shapes),
        check_decode=req.check_decode,
        online_block=None if req.online_softmax is None else req.online_softmax.block_size,
    )
    return check_grad_output(req, shapes)


def _check_decode_positions(
    req: AttentionRequest | MultiheadRequest, shapes: Shapes, biased: bool
) -> None:
    """A decode step's keys are the cache's P, then the new tokens, at the queries' positions
    (RoPE turns them there). ``context_positions`` must say so for the new tokens; without it,
    a position bias (ALiBi, T5) measures to the cache's keys at 0 … P − 1, which holds only
    when the new tokens follow the cache (their positions start at P)."""
    p, given = shapes.past_len, req.positions
    queries = query_positions(req, shapes).tolist()  # (L,) as given, else P … P + L − 1
    if req.context_positions is not None:
        if list(req.context_positions[p:]) != queries:
            raise FieldError(
                "context_positions",
                f"context_positions' last {shapes.seq_len} entries are the new tokens' keys, at "
                f"the queries' positions {_excerpt_list(queries)}; they are "
                f"{_excerpt_list(list(req.context_positions[p:]))}",
            )
        return
    if biased and given is not None and given[0] != p:
        raise FieldError(
            "positions",
            f"positions start at {given[0]}, not right after the cache's {p} keys, and the position "
            "bias measures the distance to each cached key: give context_positions, the cache's "
            f"keys' positions then the new tokens' ({p} + {shapes.seq_len} entries; e.g. "
            f"{given[0] - p} … {given[0] - 1} for a cache of the tokens just before them)",
        )


def _excerpt_list(values: list[int], most: int = 6) -> str:
    """[a, b, …] with at most ``most`` entries shown."""
    shown = ", ".join(str(v) for v in values[:most])
    return f"[{shown}{', …' if len(values) > most else ''}]"
