"""The backward pass's rules (API.md, "The backward pass, every step"): what ``grad_output``
must be, and what the core's backward (:mod:`service.core.backward`) cannot do yet, refused
with a 422 naming ``grad_output`` and the variant (never a silent wrong gradient); the names the
request gave its parameters, and how the gradients of those the folds unpacked
(:mod:`service.wire.fold`: fused projections, gate: true's rows, StableLM's per-head norms) are
packed back as given."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
from pydantic import AliasChoices

from service.core.types import Array
from service.trace.checks import options
from service.trace.shapes import Shapes
from service.wire.errors import FieldError
from service.wire.fused import Unpacked
from service.wire.schemas.requests import (
    PER_HEAD_NORM,
    AttentionRequest,
    GateOptions,
    InputFields,
    LayerNormOptions,
    MultiheadRequest,
)
from service.wire.schemas.variant_fields import QKNormOptions


def check_grad_output(req: AttentionRequest | MultiheadRequest, shapes: Shapes) -> Shapes:
    """``shapes`` with the backward on when ``grad_output`` is given and holds: an array shaped
    as the answer's last array (batched as the request), or "sum"."""
    grad = req.grad_output
    if grad is None:
        return shapes
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
    "relative_bias.table": "grad_relative_bias_table",
    # multi-head latent attention (service.core.latent.latent_backward), DeepSeek's names
    "q_a_proj_weight": "grad_w_q_a",
    "q_a_proj_bias": "grad_b_q_a",
    "q_a_layernorm_weight": "grad_q_a_norm_weight",
    "q_b_proj_weight": "grad_w_q",
    "kv_a_proj_with_mqa_weight": "grad_w_kv_a",
    "kv_a_proj_with_mqa_bias": "grad_b_kv_a",
    "kv_a_layernorm_weight": "grad_kv_a_norm_weight",
    "kv_b_proj_weight": "grad_w_kv_b",
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
    if getattr(req, "relative_bias", None) is not None:
        given["relative_bias.table"] = "relative_bias.table"
    if not isinstance(req, MultiheadRequest):
        return given
    given |= {  # a family's own name for a parameter the folds renamed
        field: _spelled(req, own) for field, own in _RENAMED.items() if _sent_as(req, own)
    }
    if req.k_eq_v:  # W_v is W_k: its gradient is W_k's (both reads summed)
        given = {f: n for f, n in given.items() if f not in _VALUES}
    consumed = {field for pack in packed_back(req) for field in pack.fields}
    return {f: n for f, n in given.items() if f not in consumed}


# ------------------------------------------- the forms the folds unpacked, packed back

# {parameter field: the request field a family gives it under, renamed by the folds}
_RENAMED = {
    "q_norm_weight": "query_layernorm_weight",  # HunYuan
    "k_norm_weight": "key_layernorm_weight",
    "layer_norm.gamma": "output_layer_norm_weight",  # BERT's output.LayerNorm
    "layer_norm.beta": "output_layer_norm_bias",
    "relative_bias.table": "relative_attention_bias_weight",  # T5
}
_VALUES = frozenset({"v_proj_weight", "v_proj_bias", "w_v", "b_v"})  # k_eq_v: the keys'


def _sent_as(req: MultiheadRequest, field: str) -> bool:
    """Whether the body gave ``field`` under one of its names."""
    info = type(req).model_fields[field]
    alias = info.validation_alias
    names = (
        [n for n in alias.choices if isinstance(n, str)] if isinstance(alias, AliasChoices) else []
    )
    return any(n in req._sent for n in [*names, field])


Grads = Mapping[str, Array]


@dataclass(frozen=True)
class Packed:
    """A parameter the body gave in a form the folds (:mod:`service.wire.fold`) unpacked, and
    its gradient packed back as it was given, from the core's (weights in_out)."""

    name: str  # as the body gave it
    make: Callable[[Grads], Array]
    fields: frozenset[str]  # the parameters (PARAMETERS' keys) whose gradients it holds


def packed_back(req: MultiheadRequest) -> tuple[Packed, ...]:
    """Every parameter given in an unpacked form: a fused projection (its layout's rows, a
    Conv1D's columns) and GPT-2's c_proj; q_proj.weight holding the gate's rows (gate:
    true); StableLM's per-head norms."""
    return (*_fused(req), *_gate_rows(req), *_norms_per_head(req))


def _fused(req: MultiheadRequest) -> list[Packed]:
    how: Unpacked | None = req._unpacked
    if how is None or how.parts is None:
        return []
    parts = how.parts
    size = sum(len(p) for p in parts)

    def packed(kind: str, conv1d: bool) -> Callable[[Grads], Array]:
        def make(g: Grads) -> Array:
            first = g[f"grad_{kind}_q"]  # (d_model, h·d) in_out, or (h·d,)
            out = np.zeros((size, *first.shape[:-1]))
            for rows, n in zip(parts, "qkv", strict=True):
                out[rows] = g[f"grad_{kind}_{n}"].T
            return out.T if conv1d else out

        return make

    out: list[Packed] = []
    for field in how.fields:
        name = _spelled(req, field)
        if field in ("c_proj_weight", "c_proj_bias"):
            kind = "w_o" if field == "c_proj_weight" else "b_o"
            conv = how.conv1d and field == "c_proj_weight"  # Conv1D: [h·d_v][d_out], in_out
            make = _in_out(kind) if conv else _out_in(kind)
            out.append(Packed(name, make, frozenset({field.replace("c_proj", "o_proj")})))
        elif field.endswith("_weight"):
            out.append(Packed(name, packed("w", how.conv1d), _PROJECTIONS["weight"]))
        else:
            out.append(Packed(name, packed("b", False), _PROJECTIONS["bias"]))
    return out


_PROJECTIONS = {part: frozenset(f"{n}_proj_{part}" for n in "qkv") for part in ("weight", "bias")}


def _in_out(name: str) -> Callable[[Grads], Array]:
    return lambda g: g[f"grad_{name}"]


def _out_in(name: str) -> Callable[[Grads], Array]:
    return lambda g: g[f"grad_{name}"].T


def _gate_rows(req: MultiheadRequest) -> list[Packed]:
    """gate: true (Qwen3-Next): q_proj.weight's rows per head, its query rows then its gate
    rows (``view(L, h, 2·d)`` then ``chunk(2)``); q_proj.bias likewise."""
    if not req._gate_rows or req.num_heads is None:
        return []
    h = req.num_heads

    def weight(g: Grads) -> Array:
        query, gate = g["grad_w_q"].T, g["grad_gate_w"].T  # (h·d, d_model) each, out_in
        return np.stack(
            [query.reshape(h, -1, query.shape[-1]), gate.reshape(h, -1, gate.shape[-1])], 1
        ).reshape(-1, query.shape[-1])

    def bias(g: Grads) -> Array:
        return np.stack([g["grad_b_q"].reshape(h, -1), g["grad_gate_b"].reshape(h, -1)], 1).reshape(
            -1
        )

    out = [Packed(_spelled(req, "q_proj_weight"), weight, frozenset({"q_proj_weight", "gate.w"}))]
    if req.q_proj_bias is not None:
        out.append(Packed(_spelled(req, "q_proj_bias"), bias, frozenset({"q_proj_bias", "gate.b"})))
    return out


def _norms_per_head(req: MultiheadRequest) -> list[Packed]:
    """StableLM's q_layernorm.norms.<i>.weight: row i of the norm weight's gradient [h][d_k]
    (the list form q_layernorm.norms: the whole)."""
    out: list[Packed] = []
    for key in req._sent:
        if (m := PER_HEAD_NORM.fullmatch(key)) is not None:
            side, i = m[1], int(m[2])
            out.append(
                Packed(key, _row(f"grad_{side}_norm_weight", i), frozenset({f"{side}_norm_weight"}))
            )
        elif key in ("q_layernorm.norms", "k_layernorm.norms"):
            out.append(
                Packed(key, _in_out(f"{key[0]}_norm_weight"), frozenset({f"{key[0]}_norm_weight"}))
            )
    return out


def _row(name: str, i: int) -> Callable[[Grads], Array]:
    return lambda g: g[name][i]
