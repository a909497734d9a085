"""The backward pass of attention, every step (API.md, "The backward pass, every step").

Each step of :data:`service.core.chain.HEAD` and :data:`service.core.chain.BLOCK` carries its
backward rule beside its forward (:attr:`service.core.chain.Step.back`); :func:`backward`
walks the steps that were on in reverse, from the last one made, and returns the gradient of
every intermediate (``grad_`` + its name, shaped as it), accumulating where a form was read
twice, and of what the steps read besides (the sinks, the norms' weights, W_o, the cache).
:func:`attention_backward` and :func:`multihead_backward` take the same arguments as the
forwards they reverse (:func:`service.core.attention.scaled_dot_product_attention`,
:func:`service.core.multihead.multihead_attention`) and add the projections, the gate's weights
and grouped-query attention's sums over each key/value head's group.

The formulas are those of the softmax's Jacobian (dS = P ∘ (dP − D), D = rowsum(P ∘ dP)) as
FlashAttention-2 writes them (Dao 2023, Algorithm 2); every gradient equals ``torch.autograd``
of the same computation in float64 (tests/core/test_backward.py). NumPy only, no I/O.
"""

from collections.abc import Mapping, Sequence
from typing import get_args

from service.core import chain
from service.core.attention import AttentionTrace
from service.core.block import LayerNorm, merge_heads, repeated_heads, repeated_heads_backward
from service.core.linear import Past, Projections, project_backward
from service.core.masks import CombinedMask
from service.core.multihead import MultiheadTrace, MultiheadWeights
from service.core.types import Array, BoolArray, FullyMaskedPolicy
from service.core.variants import Variants, sigmoid_backward

_SLOTS: frozenset[str] = frozenset(get_args(chain.Slot))


def _read_names(
    steps: Sequence[chain.Step], made: dict[str, Array]
) -> tuple[list[dict[chain.Slot, str]], dict[chain.Slot, str]]:
    """For each step that was on, the name each slot held when it ran; and the slots' last."""
    mine = {step.name for step in steps}
    latest: dict[chain.Slot, str] = {}
    for name in made:  # the first forms: the projections (the heads' output for the block)
        slot = chain.slot_of(name)
        if slot is not None and name not in mine:
            latest[slot] = name
    seen = []
    for step in steps:
        seen.append(dict(latest))
        latest[step.advances] = step.name
    return seen, latest


def backward(
    steps: Sequence[chain.Step], state: chain.State, setup: chain.Setup, grad: Array
) -> dict[str, Array]:
    """The gradients of the steps that are on under ``setup``, from ``grad``, the gradient of
    the last one's output, back to the first forms they read: ``grad_<name>`` for every
    intermediate in ``state.made`` a gradient reaches, in reverse order of the forward, and
    what the rules return besides (``grad_sinks``, ``row_dot``, ``grad_w_o`` …). A form read by
    two steps (the keys by the scores, and by nothing else; the block's input by the projections
    and the residual) gets the sum."""
    on = [step for step in steps if step.on(setup)]
    seen, latest = _read_names(on, state.made)
    final = chain.State(state.made, latest, state.fully_masked_rows)  # as the forward left it
    grads: dict[str, Array] = {on[-1].name: grad}
    besides: dict[str, Array] = {}
    for step, names in zip(reversed(on), reversed(seen), strict=True):
        g = grads.get(step.name)
        if g is None:  # nothing after it read it
            continue
        if step.back is None:
            raise NotImplementedError(f"the step {step.name} has no backward rule yet")
        for key, d in step.back(g, state.made[names[step.reads]], final, setup).items():
            into, name = (grads, names[key]) if key in _SLOTS else (besides, key)  # type: ignore[index]
            into[name] = into[name] + d if name in into else d
    return {f"grad_{name}": g for name, g in grads.items()} | besides


def attention_backward(
    trace: AttentionTrace,
    grad_output: Array,
    *,
    additive: Array | None = None,
    padded_queries: BoolArray | None = None,
    fully_masked_policy: FullyMaskedPolicy = "zero",
    variants: Variants | None = None,
    past: Past | None = None,
) -> dict[str, Array]:
    """The gradients of every intermediate of ``trace`` (made by
    :func:`service.core.attention.scaled_dot_product_attention` with these same arguments; the
    scale is the trace's) from ``grad_output (..., L, d_v)``, ∂loss/∂output: ``grad_output``,
    ``grad_weights`` (dP), ``row_dot`` (D), ``grad_masked_scores`` … ``grad_scores``, the
    queries', keys' and values' forms back to ``grad_q``, ``grad_k``, ``grad_v``, and
    ``grad_sinks``, ``grad_q_norm_weight`` …, ``grad_past_k``/``grad_past_v`` where they apply."""
    setup = chain.head_setup(
        trace.q,
        scale=trace.scale,
        additive=additive,
        padded_queries=padded_queries,
        fully_masked_policy=fully_masked_policy,
        variants=variants,
        past=past,
    )
    state = chain.State(dict(trace.made), {}, trace.fully_masked_rows)
    return backward(chain.HEAD, state, setup, grad_output)


PER_KV_HEAD = ("grad_k", "grad_v", "grad_past_k", "grad_past_v")  # summed over each group


def heads_backward(
    trace: MultiheadTrace,
    grad: Array,
    *,
    w_o: Array | None = None,
    b_o: Array | None = None,
    mask: CombinedMask | None = None,
    fully_masked_policy: FullyMaskedPolicy = "zero",
    residual: bool = False,
    norm: LayerNorm | None = None,
    variants: Variants | None = None,
    past: Past | None = None,
    num_kv_heads: int | None = None,
) -> dict[str, Array]:
    """The gradients of :func:`service.core.multihead.attend_heads`'s ``trace`` (made with
    these same arguments; the gate and the block's input are the trace's) from ``grad
    (B, L, d_out)``, ∂loss/∂(its last array): the block's (``grad_layer_norm`` …
    ``grad_concat``, ``grad_w_o``, ``grad_b_o``, ``grad_ln_gamma``, ``grad_ln_beta``,
    ``grad_gate``, ``grad_x_in`` from the residual), then every head's ``(B, h, ·, ·)``; under
    grouped-query attention (``num_kv_heads`` h_kv of the h: the k and v given to attend_heads)
    ``grad_k``, ``grad_v`` (and the cache's) per key/value head, ``(B, h_kv, ·, ·)``, each the
    sum over the query heads it serves."""
    gate = trace.block.get("gate")
    block_setup = chain.Setup(
        Variants(), w_o=w_o, b_o=b_o, gate=gate, x_in=trace.x_in, residual=residual, norm=norm
    )
    made = {"output": trace.heads.output} | {n: a for n, a in trace.block.items() if n != "gate"}
    block = backward(chain.BLOCK, chain.State(made, {}), block_setup, grad)
    heads = trace.heads
    h = heads.q.shape[1]
    h_kv = num_kv_heads or h
    arrays = dict(heads.made)
    if past is not None:  # the trace keeps the cache per key/value head
        arrays["present_k"] = repeated_heads(arrays["present_k"], h)
        arrays["present_v"] = repeated_heads(arrays["present_v"], h)
    setup = chain.head_setup(
        heads.q,
        scale=heads.scale,
        additive=None if mask is None else mask.additive[:, None],  # (B, 1, L, S)
        padded_queries=None if mask is None else mask.padded_queries[:, None],  # (B, 1, L)
        fully_masked_policy=fully_masked_policy,
        variants=variants,
        past=None if past is None else past.repeated(h // h_kv),
    )
    state = chain.State(arrays, {}, heads.fully_masked_rows)
    grads = block | backward(chain.HEAD, state, setup, block["grad_output"])
    return summed_per_kv_head(grads, h_kv) if h_kv != h else grads


def summed_per_kv_head(grads: dict[str, Array], num_kv_heads: int) -> dict[str, Array]:
    """``grads`` with ``grad_k``, ``grad_v`` (and the cache's) of the h query heads' copies
    ``(B, h, ·, ·)`` summed to the ``num_kv_heads`` key/value heads they repeat (repeat_kv's
    transpose); the other gradients as they are."""
    return grads | {
        name: repeated_heads_backward(grads[name], num_kv_heads)
        for name in PER_KV_HEAD
        if name in grads
    }


def values_read_as_keys(grads: dict[str, Array]) -> dict[str, Array]:
    """``k_eq_v`` (Gemma 4's full layers, ``attention_k_eq_v``): the values are the keys, so
    one thing is read twice and its gradient is both reads' summed, as autograd gives it for a
    tensor read twice. With the projections that is W_k (and b_k): ``grad_w_k`` gathers
    ``grad_w_v``, and there is no ``grad_w_v``. With q, k given per head it is the given k:
    ``grad_k`` gathers ``grad_v``, which stays as the values' read."""
    if "grad_w_v" not in grads:  # k given per head
        return grads | {"grad_k": grads["grad_k"] + grads["grad_v"]}
    out = dict(grads)
    for part in ("w", "b"):
        if f"grad_{part}_v" in out:
            out[f"grad_{part}_k"] = out[f"grad_{part}_k"] + out.pop(f"grad_{part}_v")
    return out


def multihead_backward(
    x: Array,
    weights: MultiheadWeights,
    trace: MultiheadTrace,
    grad: Array,
    *,
    num_kv_heads: int | None = None,
    context: Array | None = None,
    mask: CombinedMask | None = None,
    fully_masked_policy: FullyMaskedPolicy = "zero",
    residual: bool = False,
    norm: LayerNorm | None = None,
    variants: Variants | None = None,
    past: Past | None = None,
) -> dict[str, Array]:
    """The gradients of :func:`service.core.multihead.multihead_attention`'s ``trace`` (made
    from ``x`` with these same arguments) from ``grad (B, L, d_out)``: :func:`heads_backward`'s,
    ``grad_k``/``grad_v`` summed per key/value head, then the projections' ``grad_w_q``,
    ``grad_w_k``, ``grad_w_v`` (in_out, as given), ``grad_b_*`` where a bias was given, the
    gate's ``grad_gate_w``/``grad_gate_b``, and ``grad_x`` (the sum of what reached the block's
    input: the queries', the keys' and values' unless a ``context`` gave them — then
    ``grad_context`` — the gate's and the residual's; a positional encoding added to x is a
    constant)."""
    assert trace.x_in is not None, "multihead_backward needs the trace of multihead_attention"
    h = trace.heads.q.shape[1]
    h_kv = num_kv_heads or h
    grads = heads_backward(
        trace,
        grad,
        w_o=weights.w_o,
        b_o=weights.b_o,
        mask=mask,
        fully_masked_policy=fully_masked_policy,
        residual=residual,
        norm=norm,
        variants=variants,
        past=past,
        num_kv_heads=h_kv,
    )
    residual_share = grads.pop("grad_x_in", None)  # in grad_x with the projections'
    gate = trace.block.get("gate")
    merged = {n: merge_heads(grads[f"grad_{n}"]) for n in "qkv"}  # (B, n, h·d)
    return grads | projections_backward(
        trace.x_in,
        context,
        weights,
        merged,
        residual=residual_share,
        gate=None if gate is None or "grad_gate" not in grads else (gate, grads["grad_gate"]),
    )


def projections_backward(
    x: Array,
    context: Array | None,
    weights: Projections,
    grads: Mapping[str, Array],
    *,
    residual: Array | None = None,
    gate: tuple[Array, Array] | None = None,
) -> dict[str, Array]:
    """The projections' gradients from ``grads`` {"q", "k", "v"}: each projection's output's
    gradient ``(B, n, ·)`` (the heads side by side): ``grad_w_q``, ``grad_w_k``, ``grad_w_v``
    (in_out, as given), ``grad_b_*`` where a bias was given, and ``grad_x``, the sum of what
    reached x — the queries', the keys' and values' unless a ``context`` gave them (then
    ``grad_context``), the ``residual``'s share, and with ``gate`` (its output sigmoid(x W_g +
    b_g) and that output's gradient) the gate's, with ``grad_gate_w``/``grad_gate_b``."""
    source = x if context is None else context  # (B, S, d_model)
    inputs = {"q": (x, weights.w_q, weights.b_q), "k": (source, weights.w_k, weights.b_k),
              "v": (source, weights.w_v, weights.b_v)}  # fmt: skip
    parts = {
        n: project_backward(inp, w, grads[n], b is not None) for n, (inp, w, b) in inputs.items()
    }
    out = {f"grad_w_{n}": d.w for n, d in parts.items()}
    out |= {f"grad_b_{n}": d.b for n, d in parts.items() if d.b is not None}
    grad_x = parts["q"].x if residual is None else parts["q"].x + residual
    if context is None:
        grad_x = grad_x + parts["k"].x + parts["v"].x
    else:
        out["grad_context"] = parts["k"].x + parts["v"].x
    w_g = getattr(weights, "w_g", None)  # MultiheadWeights: Qwen3-Next's output gate
    if gate is not None and w_g is not None:  # gate = sigmoid(x W_g + b_g)
        dz = sigmoid_backward(gate[1], gate[0])  # (B, L, h·d_v)
        dg = project_backward(x, w_g, dz, getattr(weights, "b_g", None) is not None)
        out["grad_gate_w"] = dg.w
        if dg.b is not None:
            out["grad_gate_b"] = dg.b
        grad_x = grad_x + dg.x
    out["grad_x"] = grad_x
    return out
