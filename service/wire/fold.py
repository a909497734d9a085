"""Request fields that restate others, folded into the ordinary fields before the rules, so the
rules, the plan and the engine see one form of each:

- ``config`` (a Hugging Face config.json) and ``layer``: the fields that layer implies
  (:func:`service.wire.hf_config.from_config`), where the request gives none of its own; a
  mask from the config and one from the request both apply. Where each came from is kept for
  ``conventions.config``.
- The state dict against the config: a request giving ``config`` and its weights under the
  module's names (``q_proj.weight`` …, a fused or MLA projection) must give every name that
  layer's attention module has and none it lacks (:mod:`service.wire.hf_parameters`, from
  ``from_config``'s ``parameters``), the names as the body spells them (the request's own
  keys, before aliases merge them and before the folds below rename them); the encoders'
  BertSelfAttention alone is the row's inner module.
- ``k_eq_v: true`` (Gemma 4's full-attention layers): the values' projection is the keys', so
  ``v_proj.weight``/``v_proj.bias`` (or ``w_v``/``b_v``, or per-head ``v``) become the keys'.
- A fused projection (``qkv_proj.weight``, ``query_key_value.weight`` …, laid out as the
  config's family or ``qkv_layout`` says): ``q_proj.weight``, ``k_proj.weight`` and
  ``v_proj.weight`` (and biases), how they were read kept for the ``unpack`` step
  (:mod:`service.wire.fused`).
- the encoders' own state dict entries: BERT's and RoBERTa's ``output.LayerNorm.weight``/``.bias``
  (with ``output.dense``: the block's residual and layer norm, eps from the config's
  ``layer_norm_eps``; without them the module is BertSelfAttention, the self-attention alone),
  T5's ``relative_attention_bias.weight`` (``relative_bias``'s table: layer 0's, which T5 adds
  on every layer; refused where no config or ``relative_bias`` says how to bucket it).
- HunYuan's ``query_layernorm.weight``/``key_layernorm.weight``: ``q_norm.weight``/
  ``k_norm.weight`` under its names, once ``qk_norm`` is stated (by the request or the
  config): its norms follow RoPE with the config's eps, which the weights alone do not say.
- ``gate: true`` (Qwen3-Next): ``q_proj.weight`` holds each head's query rows then its gate
  rows (``view(L, h, 2·d)`` then ``chunk(2)``), split into ``q_proj.weight`` and
  ``gate.w``; ``q_proj.bias`` likewise.
- StableLM's q/k norms, one ``nn.LayerNorm(head_dim, bias=False)`` per head
  (``q_layernorm.norms.<i>.weight``, gathered by the request into ``q_layernorm.norms``): the
  rows of ``q_norm.weight`` [h][d_k] (``k_norm.weight`` [h_kv][d_k]).
"""

from typing import Any

import numpy as np
from pydantic import AliasChoices, ValidationError
from pydantic_core import to_jsonable_python

from service.wire.errors import FieldError
from service.wire.fused import unpacked
from service.wire.hf_config import ConfigError, FromConfig, from_config
from service.wire.hf_parameters import Names
from service.wire.schemas.requests import (
    PER_HEAD_NORM,
    GateOptions,
    LayerNormOptions,
    MultiheadRequest,
)

# the fields that give the values, by the field that gives the keys in the same form
_VALUES_OF_KEYS = {
    "k_proj_weight": ("v_proj_weight", "v_proj_bias"),
    "w_k": ("w_v", "b_v"),
    "k": ("v",),
}
_KEYS_BIAS = {"k_proj_weight": "k_proj_bias", "w_k": "b_k"}
# {state-dict name: request field} of every field read under a module's own name
_FIELD_OF = {
    alias: name
    for name, info in MultiheadRequest.model_fields.items()
    if isinstance(info.validation_alias, AliasChoices)
    for alias in info.validation_alias.choices
    if isinstance(alias, str) and "." in alias
} | {"sinks": "sinks"}
_NAME_OF = {  # {request field: its first state-dict name}, in the schema's order
    field: next(name for name, f in _FIELD_OF.items() if f == field)
    for field in dict.fromkeys(_FIELD_OF.values())
}
# the state-dict names that say the request is in the module's own form: its projections'
# (the q/k norms' weights and sinks have no other form, so they say nothing)
_MODULE_FORM = set(_NAME_OF) - {"q_norm_weight", "k_norm_weight", "sinks"}


def folded(req: MultiheadRequest) -> MultiheadRequest:
    """The request with the fields that restate others (the module's doc, in its order)
    written as the ordinary fields."""
    if req.config is not None:
        req = _configured(req)
    if (fused := unpacked(req)) is not None:
        fields, how = fused
        taken, keys, read = req._config_taken, req._config_keys, req._config_fields
        req = req.model_copy(update=fields)
        req._config_taken, req._config_keys, req._unpacked = taken, keys, how
        req._config_fields = read
    update = _output_block(req) | _relative_table(req) | _norm_weights(req)
    update |= _values_are_keys(req) if req.k_eq_v else {}
    update |= _norms_per_head(req)
    gate_rows = req.gate is True
    if gate_rows:
        update |= _gate_rows(req)
    out = req.model_copy(update=update) if update else req
    out._gate_rows = gate_rows  # the backward packs the gate's gradient back into q_proj.weight
    return out


def _configured(req: MultiheadRequest) -> MultiheadRequest:
    """The fields ``config`` implies for ``layer``, validated as the request's own; the
    request's fields win, masks of both apply."""
    assert req.config is not None
    try:
        implied = from_config(req.config, req.layer)
    except ConfigError as e:
        field = e.field if e.field.startswith(("config", "layer")) else f"config.{e.field}"
        raise FieldError(field, e.message) from None
    except (TypeError, AttributeError, KeyError, ValueError):  # any JSON may arrive here
        raise FieldError(
            "config",
            "config has a value of a type its key never takes: send the model's config.json "
            "as it is, or state the layer's fields without config",
        ) from None
    if implied.parameters is not None:  # the request's own names, before any fold reads them
        _as_the_module(req, implied.parameters)
    given = req.model_fields_set
    taken = {name: "request" for name in implied.fields if name in given and name != "mask"}
    chosen = {name: value for name, value in implied.fields.items() if name not in taken}
    chosen, skipped = _encoder_fields(req, implied, chosen)
    try:
        parsed = MultiheadRequest.model_validate(chosen)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        field = _field_of(where, implied.taken)
        key = implied.taken.get(field, "").split(" (")[0]
        raise FieldError(
            f"config.{key}" if key else "config",
            f"config gives {field or where} that the service cannot take (from "
            f"{key or 'the config'}): {first['msg']}",
        ) from None
    update = {name: getattr(parsed, name) for name in chosen}
    if "mask" in chosen and req.mask:  # a key must be allowed by both
        update["mask"] = [*(parsed.mask or []), *req.mask]
    out = req.model_copy(update=update)
    out._config_taken = {
        field: key
        for field, key in implied.taken.items()
        if field.split(".")[0] not in taken and field.split(".")[0] not in skipped
    } | taken
    out._config_keys = implied.unread
    out._config_fields = {name: as_json(update[name]) for name in sorted(update)}
    return out


def as_json(value: Any) -> Any:
    """A field's value as a JSON body gives it: a model as its fields (unset ones left out),
    arrays as lists."""
    return to_jsonable_python(value, exclude_none=True, fallback=_listed)


def _listed(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not a field's value")


def _as_the_module(req: MultiheadRequest, names: Names) -> None:
    """A 422 unless a request in the module's form (its projections under their state-dict
    names) gives exactly the names the config's module has, as the body spells them: the
    first it lacks, else the first it has that the module does not. A field given under its
    underscore name (``q_proj_weight``) stands for the module's name of that field. A row's
    inner module (BertSelfAttention) is the one checked when the body gives none of the whole
    module's own names."""
    given = {f for f in set(_FIELD_OF.values()) if getattr(req, f) is not None}
    if not given & _MODULE_FORM:
        return
    sent = [k for k in req._sent if _state_field(k) is not None and k not in _GATHERED]
    unnamed = given - {_state_field(k) for k in sent}  # given under another name
    if names.alone is not None and not set(sent) & (names.own() - names.alone.own()):
        names = names.alone
    for name, why in names.has:
        if name not in sent and _state_field(name) not in unnamed:
            raise FieldError(
                name,
                f"{why}: {names.cls} has {name}, which the request lacks; send the module's "
                "state_dict() as it is (without it the layer would be another one)",
            )
    owned = names.own()
    extra = [k for k in sent if k not in owned]
    extra += [_NAME_OF[f] for f in _NAME_OF if f in unnamed and f not in _fields_of(owned)]
    if extra:
        name = extra[0]
        raise FieldError(
            name,
            f"{names.why_not(name)}: {names.cls} has no {name}, yet the request gives it; the "
            "config and the weights disagree (one of them is from another model)",
        )


# the request's list forms of StableLM's per-head names: no module has them under this name
_GATHERED = {"q_layernorm.norms", "k_layernorm.norms"}


def _state_field(name: str) -> str | None:
    """The request field a state-dict name is read into (a per-head norm's into its side's
    list), None for a name that is not a state dict's."""
    if (m := PER_HEAD_NORM.fullmatch(name)) is not None:
        return f"{m[1]}_layernorm_norms"
    return _FIELD_OF.get(name)


def _fields_of(names: set[str]) -> set[str | None]:
    return {_state_field(name) for name in names}


def _field_of(where: str, taken: dict[str, str]) -> str:
    """The longest field of ``taken`` whose parts run, in order, through the error's location
    (``rope.options.scaling.yarn.factor`` → ``rope.scaling.factor``); "" when none."""
    parts = where.split(".")

    def within(field: str) -> bool:
        rest = iter(parts)
        return all(part in rest for part in field.split("."))

    return max((f for f in taken if within(f)), key=lambda f: f.count("."), default="")


def _spelled(name: str) -> str:
    """A field as the caller writes it: a state dict's dotted name (``v_proj.weight``) where
    the schema reads it under one, else the field's own name."""
    alias = MultiheadRequest.model_fields[name].validation_alias
    first = alias.choices[0] if isinstance(alias, AliasChoices) else None
    return first if isinstance(first, str) else name


# a family's own names of the q/k norms' weights: {its field: (our field, the family)}
_NORM_WEIGHTS = {
    "query_layernorm_weight": ("q_norm_weight", "HunYuan"),
    "key_layernorm_weight": ("k_norm_weight", "HunYuan"),
}


def _norm_weights(req: MultiheadRequest) -> dict[str, Any]:
    """HunYuan's q/k norm weights as q_norm.weight and k_norm.weight; without qk_norm a 422
    (alone, q_norm.weight means Qwen3's norm before RoPE, eps 1e-6: not HunYuan's)."""
    update: dict[str, Any] = {}
    for own, (ours, family) in _NORM_WEIGHTS.items():
        w = getattr(req, own)
        if w is None:
            continue
        if getattr(req, ours) is not None:
            raise FieldError(
                _spelled(own),
                f"give {_spelled(own)} or {_spelled(ours)}, not both: both are the same weight",
            )
        if req.qk_norm is False:
            raise FieldError(
                _spelled(own),
                f"{_spelled(own)} is {family}'s norm, applied after RoPE with its config's "
                'rms_norm_eps: send config, or qk_norm {"eps": …, "after_rope": true}',
            )
        update |= {ours: w, own: None}
    return update


def _values_are_keys(req: MultiheadRequest) -> dict[str, Any]:
    for name in ("v_proj_weight", "v_proj_bias", "w_v", "b_v", "v", "in_proj_weight", "heads"):
        if getattr(req, name) is not None:
            label = _spelled(name)
            raise FieldError(
                label,
                f"k_eq_v says the values are the keys, so {label} does not apply: leave it out "
                "(Gemma 4's full-attention layers have no v_proj)",
            )
    for keys, values in _VALUES_OF_KEYS.items():
        if getattr(req, keys) is not None:
            bias = _KEYS_BIAS.get(keys)
            given = [getattr(req, keys)] + ([] if bias is None else [getattr(req, bias)])
            return dict(zip(values, given, strict=True))
    raise FieldError(
        "k_eq_v",
        "k_eq_v makes the values from the keys' projection: give it (k_proj.weight or w_k; "
        "k per head), it cannot be drawn",
    )


def _norms_per_head(req: MultiheadRequest) -> dict[str, Any]:
    """StableLM's per-head LayerNorm weights as ``q_norm.weight``/``k_norm.weight`` rows."""
    update: dict[str, Any] = {}
    for side in "qk":
        rows = getattr(req, f"{side}_layernorm_norms")
        if rows is None:
            continue
        if getattr(req, f"{side}_norm_weight") is not None:
            raise FieldError(
                f"{side}_layernorm.norms",
                f"give {side}_layernorm.norms.<i>.weight or {side}_norm.weight, not both: both "
                "are the same weight",
            )
        update |= {f"{side}_norm_weight": rows, f"{side}_layernorm_norms": None}
    return update


def _gate_rows(req: MultiheadRequest) -> dict[str, Any]:
    w = req.q_proj_weight
    if w is None:
        raise FieldError(
            "gate",
            "gate: true reads the gate rows in q_proj.weight (Qwen3-Next); without a state "
            'dict give gate as {"w": [h·d_v][d_model]}',
        )
    h = req.num_heads
    if h is None:
        raise FieldError(
            "num_heads", "num_heads is missing: gate: true splits q_proj.weight by head"
        )
    rows = w.shape[0]
    if req.d_k is not None and rows != 2 * h * req.d_k:  # d_k from the config or the request
        raise FieldError(
            "q_proj.weight",
            f"with gate: true q_proj.weight holds each head's query rows then its gate rows: "
            f"2·num_heads·d_k = {2 * h * req.d_k} rows, but it has {rows} (the gate rows "
            "left out?); send the module's q_proj.weight as it is",
        )
    if rows % (2 * h):
        raise FieldError(
            "q_proj.weight",
            f"with gate: true q_proj.weight holds each head's query rows then its gate rows, so "
            f"its {rows} rows must split into 2·num_heads = {2 * h} equal parts",
        )
    d = rows // (2 * h)
    per_head = w.reshape(h, 2, d, w.shape[1])  # (h, query|gate, d, d_model)
    update: dict[str, Any] = {"q_proj_weight": per_head[:, 0].reshape(h * d, -1)}
    gate_b = None
    if req.q_proj_bias is not None:
        b = req.q_proj_bias
        if b.shape[0] != rows:
            raise FieldError(
                "q_proj.bias",
                f"q_proj.bias has {b.shape[0]} entries; q_proj.weight has {rows} rows",
            )
        halves = b.reshape(h, 2, d)  # (h, query|gate, d)
        update["q_proj_bias"], gate_b = halves[:, 0].reshape(-1), halves[:, 1].reshape(-1)
    gate_w = np.ascontiguousarray(per_head[:, 1].reshape(h * d, -1))  # (h·d, d_model) out_in
    update["gate"] = GateOptions.model_construct(w=gate_w, b=gate_b)
    return update


# ---- the encoders: BERT's and RoBERTa's output block, T5's relative bias table ---------------

_BLOCK = ("output.LayerNorm.weight", "output.LayerNorm.bias")


def _has_block(req: MultiheadRequest) -> bool:
    return req.output_layer_norm_weight is not None or req.output_layer_norm_bias is not None


def _encoder_fields(
    req: MultiheadRequest, implied: FromConfig, chosen: dict[str, Any]
) -> tuple[dict[str, Any], set[str]]:
    """The config's fields for an encoder's state dict: BERT's block fields (residual, layer
    norm) only with ``output.LayerNorm`` in it, else none of them (BertSelfAttention alone);
    T5's relative bias with the state dict's table. Also the block fields left out."""
    skipped: set[str] = set()
    if implied.block and not _has_block(req):
        if req.o_proj_weight is not None or req.o_proj_bias is not None:
            raise FieldError(
                "output.LayerNorm.weight",
                "output.dense without output.LayerNorm: BertAttention's output block applies "
                "the dense projection, the residual and the LayerNorm together; send the "
                "whole BertAttention state dict, or the self-attention's alone (query, key, "
                "value) for the heads' concatenation",
            )
        skipped = set(implied.block)
        chosen = {name: value for name, value in chosen.items() if name not in skipped}
    if "relative_bias" in chosen and implied.buckets is not None:
        table = _table_for(req, implied.buckets)
        chosen = chosen | {"relative_bias": {**chosen["relative_bias"], "table": table}}
    return chosen, skipped


def _table_for(req: MultiheadRequest, buckets: tuple[int, str]) -> Any:
    """T5's table for the layer: the request's relative_attention_bias.weight (layer 0's)."""
    table, (rows, key) = req.relative_attention_bias_weight, buckets
    name = "relative_attention_bias.weight"
    if table is None:
        raise FieldError(
            name,
            f"T5 adds a relative position bias on every layer, bucketed from layer 0's table "
            f"(T5Stack computes it in layer 0 and passes it on): layer {req.layer}'s request "
            f"needs layer 0's {name} [{rows}][num_heads] with its own weights",
        )
    if table.shape[0] != rows:
        raise FieldError(
            name,
            f"{name} has {table.shape[0]} rows but config.{key.split(' (')[0]} is {rows}: "
            "it is T5's table of num_buckets rows, one column per head",
        )
    return table


def _relative_table(req: MultiheadRequest) -> dict[str, Any]:
    """A relative_attention_bias.weight the config did not place: refused (nothing says how
    to bucket it), or twice given."""
    if req.relative_attention_bias_weight is None:
        return {}
    taken = req._config_taken or {}
    if taken.get("relative_bias") not in (None, "request"):  # the config's, table placed
        return {"relative_attention_bias_weight": None}
    if req.relative_bias is not None:
        raise FieldError(
            "relative_attention_bias.weight",
            "relative_bias.table and relative_attention_bias.weight are the same numbers: "
            "give one of them",
        )
    raise FieldError(
        "relative_attention_bias.weight",
        "relative_attention_bias.weight is T5's bucket table: give the model's config "
        "(model_type t5: is_decoder and relative_attention_max_distance say how positions "
        "are bucketed), or relative_bias {table, bidirectional, max_distance} instead",
    )


def _output_block(req: MultiheadRequest) -> dict[str, Any]:
    """BertAttention's output.LayerNorm: residual true and the layer norm with its weight and
    bias, the eps from the config (layer_norm_eps) or the request's layer_norm.eps."""
    if not _has_block(req):
        return {}
    gamma, beta = req.output_layer_norm_weight, req.output_layer_norm_bias
    for name, value in zip(_BLOCK, (gamma, beta), strict=True):
        if value is None:
            raise FieldError(name, f"{name} is missing: BertSelfOutput's LayerNorm has both")
    if req.o_proj_weight is None:
        raise FieldError(
            "output.dense.weight",
            "output.LayerNorm is BertSelfOutput's, after output.dense: give output.dense.weight "
            "(and output.dense.bias) too",
        )
    norm = req.layer_norm  # options with eps: the config's layer_norm_eps or the request's
    if not isinstance(norm, LayerNormOptions) or "eps" not in norm.model_fields_set:
        raise FieldError(
            "layer_norm.eps",
            "output.LayerNorm's eps is not known: give the model's config (layer_norm_eps) or "
            'layer_norm {"eps": …}',
        )
    if norm.gamma is not None or norm.beta is not None:
        raise FieldError(
            "layer_norm",
            "layer_norm's gamma/beta and output.LayerNorm.weight/bias are the same numbers: "
            "give one of them",
        )
    update: dict[str, Any] = {
        "layer_norm": norm.model_copy(update={"gamma": gamma, "beta": beta}),
        "output_layer_norm_weight": None,
        "output_layer_norm_bias": None,
    }
    return update | ({} if "residual" in req.model_fields_set else {"residual": True})
