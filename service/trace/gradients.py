"""The backward pass's rules (API.md, "The backward pass, every step"): what ``grad_output``
must be, and what the core's backward (:mod:`service.core.backward`) cannot do yet, refused
with a 422 naming ``grad_output`` and the variant (never a silent wrong gradient)."""

from dataclasses import replace

from pydantic import AliasChoices

from service.trace.checks import options
from service.trace.shapes import Shapes
from service.wire.errors import FieldError
from service.wire.schemas.requests import (
    AttentionRequest,
    GateOptions,
    InputFields,
    LayerNormOptions,
    MultiheadRequest,
)
from service.wire.schemas.variant_fields import QKNormOptions

# the request's keys whose folds (service.wire.fold) grad_state_dict cannot yet pack back:
# key prefix -> what it is
_NOT_PACKED_BACK: dict[str, str] = {
    "qkv_proj.": "a fused projection",
    "query_key_value.": "a fused projection",
    "Wqkv.": "a fused projection",
    "wqkv": "a fused projection",
    "c_attn.": "a fused projection",
    "c_proj.": "GPT-2's output projection",
    "q_layernorm.norms": "StableLM's per-head norms",
    "k_layernorm.norms": "StableLM's per-head norms",
    "query_layernorm.": "HunYuan's norm after RoPE",
    "key_layernorm.": "HunYuan's norm after RoPE",
    "output.LayerNorm.": "BERT's output LayerNorm",
    "output_LayerNorm": "BERT's output LayerNorm",
    "relative_attention_bias.": "T5's bias table",
}


def _refuse(what: str, why: str) -> FieldError:
    return FieldError(
        "grad_output",
        f"grad_output with {what}: {why}; leave out grad_output (the forward is computed as "
        "ever) or that field",
    )


def check_unfolded(req: InputFields) -> None:
    """Before the folds: refuse ``grad_output`` with the request's own fields whose gradient the
    service cannot give under their own names yet (a fused projection, a gate read from
    q_proj.weight's rows, the values made from the keys)."""
    if req.grad_output is None or not isinstance(req, MultiheadRequest):
        return
    for key in req._sent:
        for prefix, what in _NOT_PACKED_BACK.items():
            if key.startswith(prefix):
                raise _refuse(
                    f"{key} ({what})",
                    "its gradient cannot be given under its own name yet (grad_state_dict "
                    "packs back q_proj, k_proj, v_proj, o_proj and out_proj, in_proj, the q/k "
                    "norms' weights, sinks and a gate given as gate.w)",
                )
    if req.gate is True:
        raise _refuse(
            "gate: true (the gate's rows inside q_proj.weight)",
            "grad_state_dict cannot pack the gate's gradient back into q_proj.weight's rows "
            'yet: give the gate as {"w": …, "b": …}',
        )
    if req.k_eq_v:
        raise _refuse(
            "k_eq_v", "the gradient of a projection read as both keys and values is not wired yet"
        )


def check_grad_output(req: AttentionRequest | MultiheadRequest, shapes: Shapes) -> Shapes:
    """``shapes`` with the backward on when ``grad_output`` is given and holds: an array shaped
    as the answer's last array (batched as the request), or "sum"; refused where the core's
    backward cannot go yet (multi-head latent attention, T5's bias table)."""
    grad = req.grad_output
    if grad is None:
        return shapes
    taken = getattr(req, "_config_taken", None) or {}
    refusals = (
        ("mla" in shapes.on, "mla", "the backward through the latents is not available yet"),
        (
            "position_bias" in shapes.on and "alibi" not in shapes.on,
            "relative_bias",
            "the gradient of T5's bucket table is not available yet (ALiBi's fixed bias is)",
        ),
        ("k_eq_v" in taken or "k_eq_v" in shapes.on, "k_eq_v", "not wired yet"),
    )
    for refused, what, why in refusals:
        if refused:
            raise _refuse(what, why)
    if not isinstance(grad, str):
        _check_shape(grad.shape, shapes)
    return replace(shapes, backward=True)


def last_array(shapes: Shapes) -> str:
    """The answer's last array, which grad_output is the gradient of."""
    if shapes.endpoint == "attention":
        return "output"
    if shapes.layer_norm:
        return "layer_norm"
    return "residual" if shapes.residual else "projected"


def _check_shape(got: tuple[int, ...], shapes: Shapes) -> None:
    width = shapes.d_v if shapes.endpoint == "attention" else shapes.d_out
    want = (
        (shapes.seq_len, width) if shapes.batch is None else (shapes.batch, shapes.seq_len, width)
    )
    if tuple(got) == want:
        return
    name = last_array(shapes)
    if shapes.endpoint == "multihead" and name == "projected" and shapes.d_model is None:
        name = "projected (concat when no W_o is given)"
    dims = "×".join(map(str, want))
    given = "×".join(map(str, got))
    batch = "" if shapes.batch is None else " (the batch first, as the request is batched)"
    raise FieldError(
        "grad_output",
        f"grad_output is {given} but it is the gradient of {name}, which is {dims}{batch}: "
        'give an array of that shape, or "sum"',
    )


# ------------------------------------------------------- the parameters' names, as given

# {request field: the gradient it gets}: every parameter a request can give, and the core's
# gradient of it (service.core.backward), in in_out layout for a projection
PARAMETERS: dict[str, str] = {
    "w_q": "grad_w_q",
    "w_k": "grad_w_k",
    "w_v": "grad_w_v",
    "b_q": "grad_b_q",
    "b_k": "grad_b_k",
    "b_v": "grad_b_v",
    "q_proj_weight": "grad_w_q",
    "k_proj_weight": "grad_w_k",
    "v_proj_weight": "grad_w_v",
    "q_proj_bias": "grad_b_q",
    "k_proj_bias": "grad_b_k",
    "v_proj_bias": "grad_b_v",
    "in_proj_weight": "grad_w_q",  # with grad_w_k and grad_w_v, packed as given
    "in_proj_bias": "grad_b_q",
    "heads": "grad_w_q",  # per head, with the others
    "w_o": "grad_w_o",
    "out_proj_weight": "grad_w_o",
    "o_proj_weight": "grad_w_o",
    "b_o": "grad_b_o",
    "out_proj_bias": "grad_b_o",
    "o_proj_bias": "grad_b_o",
    "q_norm_weight": "grad_q_norm_weight",
    "k_norm_weight": "grad_k_norm_weight",
    "q_norm_bias": "grad_q_norm_bias",
    "k_norm_bias": "grad_k_norm_bias",
    "sinks": "grad_sinks",
    "gate.w": "grad_gate_w",
    "gate.b": "grad_gate_b",
    "layer_norm.gamma": "grad_ln_gamma",
    "layer_norm.beta": "grad_ln_beta",
    "qk_norm.q_weight": "grad_q_norm_weight",
    "qk_norm.k_weight": "grad_k_norm_weight",
    "qk_norm.q_bias": "grad_q_norm_bias",
    "qk_norm.k_bias": "grad_k_norm_bias",
}


def _spelled(req: InputFields, field: str) -> str:
    """The name the body gave a field under (``q_proj.weight``, ``q_proj_weight`` or
    ``self.query.weight``), else its first state-dict name, else the field's own."""
    info = type(req).model_fields.get(field)
    alias = None if info is None else info.validation_alias
    names = (
        [n for n in alias.choices if isinstance(n, str)] if isinstance(alias, AliasChoices) else []
    )
    sent = getattr(req, "_sent", ())
    return next((n for n in names if n in sent), names[0] if names else field)


def given_names(req: AttentionRequest | MultiheadRequest) -> dict[str, str]:
    """{request field (or dotted option: ``gate.w``): the name the body gave it} for every
    parameter the request gave (generated weights are not given), read by
    :func:`service.trace.backward.parameters`."""
    given = {
        field: _spelled(req, field)
        for field in PARAMETERS
        if "." not in field and getattr(req, field, None) is not None
    }
    for i, head in enumerate(getattr(req, "heads", None) or []):
        given |= {
            f"heads.{i}.b_{n}": f"heads.{i}.b_{n}"
            for n in "qkv"
            if getattr(head, f"b_{n}") is not None
        }
    gate = getattr(req, "gate", None)
    if isinstance(gate, GateOptions):
        given |= {"gate.w": "gate.w"} | ({"gate.b": "gate.b"} if gate.b is not None else {})
    norm = options(getattr(req, "layer_norm", False), LayerNormOptions)
    if norm is not None:
        given |= {
            f"layer_norm.{n}": f"layer_norm.{n}"
            for n in ("gamma", "beta")
            if getattr(norm, n) is not None
        }
    qk = options(req.qk_norm, QKNormOptions)
    if qk is not None:
        given |= {
            f"qk_norm.{n}": f"qk_norm.{n}"
            for n in ("q_weight", "k_weight", "q_bias", "k_bias")
            if getattr(qk, n) is not None
        }
    return given
