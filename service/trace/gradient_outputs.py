"""The backward's rows of the one table of outputs (API.md, "The backward pass, every step"):
with grad_output, the gradient of every array the gradient reaches, named grad_ + its name,
shaped and placed as it, in reverse order of the forward's (made from the forward's rows of
:mod:`service.trace.output_table`); then what the steps read besides (the parameters), each
shaped as given, and grad_state_dict."""

from dataclasses import dataclass, replace

from service.trace.output_table import (
    ATTENTION,
    BOTH,
    D_K,
    D_MODEL,
    D_OUT,
    D_V,
    FORWARD,
    H_KV,
    KV_LORA,
    MULTIHEAD,
    NOPE_DIM,
    Q_LORA,
    ROPE_DIM,
    S_NEW,
    H,
    Kind,
    Layout,
    Output,
    P,
    Presence,
    _q_latent,
    array,
    block,
    head,
    index,
    keys,
    queries,
)
from service.trace.shapes import Endpoint, Shapes

# ---------------------------------------------------------------- the backward's rows
# (API.md, "The backward pass, every step"): with grad_output, the gradient of every array the
# gradient reaches, named grad_ + its name, shaped and placed as it, in reverse order of the
# forward's; then what the steps read besides (the parameters), each shaped as given.

# the forward rows the backward differentiates (not the mask, the bias, the sinks' weights, the
# cache: inputs or side results), by name: per head, then the block's
DIFFERENTIATED = frozenset(
    {
        *("q", "k", "v", "q_clipped", "k_clipped", "v_clipped", "q_normed", "k_normed"),
        *("q_rotated", "k_rotated", "q_tempered", "v_normed", "scores", "scaled_scores"),
        *("capped_scores", "biased_scores", "masked_scores", "weights", "output"),
        *("concat", "gate", "gated", "projected", "residual", "layer_norm"),
        *("c_q", "c_kv", "k_rope", "q_nope", "q_rope", "k_nope"),  # mla's latents and parts
    }
)
_PER_KV_HEAD = frozenset({"k", "v"})  # under grouped-query attention, summed per key/value head


def _backward(s: Shapes) -> bool:
    return s.backward


def _grouped(s: Shapes) -> bool:
    """/multihead with fewer key/value heads than query heads."""
    return s.endpoint == "multihead" and s.num_kv_heads != s.num_heads


def _projected(s: Shapes) -> bool:
    """The backward reaches x and the projections' weights (not q, k, v given directly)."""
    return s.backward and s.d_model is not None


def _latent_backward(s: Shapes) -> bool:
    return s.backward and s.latent is not None


def _q_latent_backward(s: Shapes) -> bool:
    return s.backward and _q_latent(s)


def _state_dict(s: Shapes) -> bool:
    """/multihead's projections given under a module's names (in_proj_weight, heads,
    q_proj.weight …): grad_state_dict gives the gradients under them."""
    return s.backward and s.form in ("in_proj", "per_head", "state_dict", "latent")


@dataclass(frozen=True)
class Backward:
    """A gradient row's presence: the forward row's, with grad_output; ``grouped`` (for k and
    v per head) present only without grouped-query attention, where they are per query
    head."""

    forward: Presence
    grouped: bool = False

    def __call__(self, shapes: Shapes) -> bool:
        if not shapes.backward or (self.grouped and _grouped(shapes)):
            return False
        return self.forward(shapes)


def _gradient_of(out: Output) -> Output:
    """The row of ``out``'s gradient: shaped and placed as it, never −∞, not drawn."""
    return replace(
        out,
        name=f"grad_{out.name}",
        kind="matrix" if out.kind == "nullable" else out.kind,
        doc=f"∂loss/∂{out.name}, shaped as {out.name} (with grad_output)",
        present=Backward(out.present, out.head and out.name in _PER_KV_HEAD),
        view=None,
    )


def _parameter(
    name: str,
    doc: str,
    *,
    kind: Kind = "tensor",
    endpoints: frozenset[Endpoint] = BOTH,
    when: Presence = _backward,
) -> Output:
    """The gradient of a parameter the request gave (a bias, a norm's weight, a sink): one for
    the whole request, returned when the request gave the parameter (``when``: what a request
    must have for that, as far as its shapes tell)."""
    return Output(name, kind, doc, None, endpoints, when, batched=False, optional=True)


def _with(variant: str) -> Presence:
    """With grad_output and the variant ``variant`` on (service.trace.rows.variants)."""
    return lambda s: s.backward and variant in s.on


def _weight(
    name: str,
    doc: str,
    rows_by: Layout,
    endpoints: frozenset[Endpoint] = BOTH,
    when: Presence = _projected,
) -> Output:
    """A weight's gradient, summed over the batch (never batched); the projections' when x
    was projected, W_o's whenever it was given."""
    return Output(name, "weight", doc, rows_by, endpoints, when, batched=False, optional=True)


_LAYOUT = "in the request's weight_layout when it gave that weight, else in_out"


def _online_backward(s: Shapes) -> int:
    """online_softmax_backward's numbers per batch item and head: p, dp and ds [L][S] in all,
    dv and dk [S][·] in all, a running dq [L][d_k] per block."""
    blocks = -(-s.ctx_len // (s.online_block or 1))
    return 3 * s.seq_len * s.ctx_len + s.ctx_len * (s.d_k + s.d_v) + blocks * s.seq_len * s.d_k


def _online_backward_batch(s: Shapes) -> tuple[int, ...]:
    """/attention's online_softmax_backward, the batch inside."""
    return ((s.batch or 1) * _online_backward(s),)


def _online_backward_traced(s: Shapes) -> bool:
    return s.backward and s.online_block is not None


_ONLINE_BACKWARD = (
    "FlashAttention-2's backward a block of keys at a time (with online_softmax and "
    'grad_output): per block {"keys": [start, end], "p": [L][n] the weights recomputed from '
    'each row\'s log-sum-exp, "dv": [n][d_v], "dp": [L][n], "ds": [L][n], "dk": [n][d_k], '
    '"dq": [L][d_k] the running gradient of the Q the scores read}; the last dq is that gradient'
)
GRADIENTS: tuple[Output, ...] = (
    *(_gradient_of(out) for out in reversed(FORWARD) if out.name in DIFFERENTIATED),
    head(
        "row_dot",
        "D = rowsum(grad_output ∘ output) [L], = rowsum(weights ∘ grad_weights): the softmax's "
        "backward subtracts it (with grad_output)",
        rows_by=queries(),
        kind="vector",
        when=_backward,
    ),
    array(
        "online_softmax_backward",
        _ONLINE_BACKWARD,
        rows_by=_online_backward_batch,
        kind="backward_blocks",
        endpoints=ATTENTION,
        when=_online_backward_traced,
        batched=False,
    ),  # the batch inside
    head(
        "online_softmax_backward",
        _ONLINE_BACKWARD,
        rows_by=lambda s: (_online_backward(s),),
        kind="backward_blocks",
        endpoints=MULTIHEAD,
        when=_online_backward_traced,
    ),
    block(
        "grad_k",
        "∂loss/∂k per key/value head [h_kv][S][d_k]: each the sum over the query heads it "
        "serves (grouped-query attention, with grad_output)",
        rows_by=index(H_KV, S_NEW, D_K),
        kind="stack",
        when=lambda s: s.backward and _grouped(s),
    ),
    block(
        "grad_v",
        "∂loss/∂v per key/value head [h_kv][S][d_v] (grouped-query attention, with grad_output)",
        rows_by=index(H_KV, S_NEW, D_V),
        kind="stack",
        when=lambda s: s.backward and _grouped(s),
    ),
    Output(
        "grad_past_k",
        "matrix",
        "the gradient of the cache's keys [P][d_k] ([h_kv][P][d_k] on /multihead) (with past "
        "and grad_output, only when include names it)",
        index(P, D_K),
        ATTENTION,
        lambda s: s.backward and s.past_len > 0,
        asked=True,
    ),
    Output(
        "grad_past_v",
        "matrix",
        "the gradient of the cache's values [P][d_v] (with past and grad_output, only when "
        "include names it)",
        index(P, D_V),
        ATTENTION,
        lambda s: s.backward and s.past_len > 0,
        asked=True,
    ),
    Output(
        "grad_past_k",
        "stack",
        "the gradient of the cache's keys [h_kv][P][d_k] (with past and grad_output, only when "
        "include names it)",
        index(H_KV, P, D_K),
        MULTIHEAD,
        lambda s: s.backward and s.past_len > 0,
        asked=True,
    ),
    Output(
        "grad_past_v",
        "stack",
        "the gradient of the cache's values [h_kv][P][d_v] (with past and grad_output, only "
        "when include names it)",
        index(H_KV, P, D_V),
        MULTIHEAD,
        lambda s: s.backward and s.past_len > 0,
        asked=True,
    ),
    _parameter(
        "grad_sinks", "∂loss/∂sinks: one per head (a number on /attention)", when=_with("sinks")
    ),
    *(
        _parameter(
            f"grad_{side}_norm_{part}",
            f"∂loss/∂ the {side} norm's {part}, shaped as given",
            when=_with("v_norm" if side == "v" else "qk_norm"),
        )
        for side in ("q", "k", "v")
        for part in ("weight", "bias")
    ),
    _parameter(
        "grad_relative_bias_table",
        "∂loss/∂ relative_bias.table [num_buckets][h]: the bias's gradient summed by bucket, "
        "per head",
        when=_with("position_bias"),
    ),
    *(
        _parameter(
            f"grad_ln_{p}",
            f"∂loss/∂ layer_norm.{p} [d_out]",
            endpoints=MULTIHEAD,
            when=lambda s: s.backward and s.layer_norm,
        )
        for p in ("gamma", "beta")
    ),
    _weight("grad_w_o", f"∂loss/∂W_o, {_LAYOUT}", index(H * D_V, D_OUT), MULTIHEAD, _backward),
    _parameter("grad_b_o", "∂loss/∂b_o [d_out]", endpoints=MULTIHEAD),
    _weight(
        "grad_gate_w",
        "∂loss/∂ gate.w [h·d_v][d_model] (out_in, as given)",
        index(H * D_V, D_MODEL),
        MULTIHEAD,
    ),
    _parameter("grad_gate_b", "∂loss/∂ gate.b [h·d_v]", endpoints=MULTIHEAD, when=_with("gate")),
    _weight("grad_w_q", f"∂loss/∂W_q (all heads), {_LAYOUT}", index(D_MODEL, H * D_K)),
    _weight("grad_w_k", f"∂loss/∂W_k, {_LAYOUT}", index(D_MODEL, H_KV * D_K)),
    _weight("grad_w_v", f"∂loss/∂W_v, {_LAYOUT}", index(D_MODEL, H_KV * D_V)),
    *(_parameter(f"grad_b_{n}", f"∂loss/∂b_{n}") for n in "qkv"),
    # mla: its weights' gradients in in_out (grad_w_q is q_b_proj's or q_proj's), as
    # grad_state_dict gives them under DeepSeek's names
    _weight(
        "grad_w_q_a",
        "∂loss/∂ q_a_proj (mla), in_out",
        index(D_MODEL, Q_LORA),
        MULTIHEAD,
        _q_latent_backward,
    ),
    *(
        _parameter(name, doc, endpoints=MULTIHEAD, when=_q_latent_backward)
        for name, doc in (
            ("grad_b_q_a", "∂loss/∂ q_a_proj.bias (mla)"),
            ("grad_q_a_norm_weight", "∂loss/∂ q_a_layernorm.weight (mla)"),
        )
    ),
    Output(
        "grad_w_kv_a",
        "weight",
        "∂loss/∂ kv_a_proj_with_mqa (mla), in_out",
        lambda s: (D_MODEL(s), KV_LORA(s) + ROPE_DIM(s)),
        MULTIHEAD,
        _latent_backward,
        batched=False,
        optional=True,
    ),
    *(
        _parameter(name, doc, endpoints=MULTIHEAD, when=_latent_backward)
        for name, doc in (
            ("grad_b_kv_a", "∂loss/∂ kv_a_proj_with_mqa.bias (mla)"),
            ("grad_kv_a_norm_weight", "∂loss/∂ kv_a_layernorm.weight (mla)"),
        )
    ),
    Output(
        "grad_w_kv_b",
        "weight",
        "∂loss/∂ kv_b_proj (mla), in_out",
        lambda s: (KV_LORA(s), H(s) * (NOPE_DIM(s) + s.d_v)),
        MULTIHEAD,
        _latent_backward,
        batched=False,
        optional=True,
    ),
    Output(
        "grad_x",
        "matrix",
        "∂loss/∂x [L][d_model]: the queries', keys', values' (unless context gave them), the "
        "gate's and the residual's shares summed (with grad_output)",
        queries(D_MODEL),
        present=_projected,
    ),
    Output(
        "grad_context",
        "matrix",
        "∂loss/∂context [S][d_model]: the keys' and values' shares (with grad_output)",
        keys(D_MODEL),
        present=_projected,
        optional=True,
    ),
    Output(
        "grad_state_dict",
        "tensors",
        "the parameters' gradients under the names the request gave them (q_proj.weight, "
        "in_proj_weight, heads.0.w_q, out_proj.weight, q_norm.weight, sinks, gate.w, "
        "layer_norm.gamma …), each shaped as given (with grad_output)",
        None,
        MULTIHEAD,
        _state_dict,
        batched=False,
    ),
)
