"""GET /models and POST /model (API.md, "Trained models"): the catalog with what is installed
here, and a trained model's attention on the caller's sentence — every layer and head, each
head's role, the rollout, and the chosen layer's whole answer exactly as POST /multihead gives
it (its request built from the layer's weights and the hidden states entering it), so that
steps, summary and compare work on a real layer.

Like the compute endpoints, an answer is admitted first (:func:`admit`: the model, the text's
tokens against the cap, the layer, include, and the layer's /multihead request through the
trace's own rules and limits; nothing computed) and run after (:func:`run`)."""

from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from service import trace
from service.config import Settings
from service.core.encoder import forward, head_roles, rollout
from service.core.types import IntArray
from service.models.catalog import BY_NAME, INSTALL_COMMAND, MODELS, Model
from service.models.loading import Loaded, ModelFilesError, load, read_config
from service.trace.compute import Check
from service.wire.errors import FieldError, LimitError, ModelNotInstalled
from service.wire.schemas.model_fields import ModelRequest
from service.wire.schemas.requests import MultiheadRequest

OUTPUTS = ("model", "tokens", "attention", "head_roles", "rollout", "trace")


def entry(model: Model, settings: Settings, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """A model as GET /models lists it: its sizes from its ``config`` (read from its
    config.json when not given; its weights are not loaded for a listing)."""
    installed = model.installed(settings.models_dir)
    if config is None:
        config = read_config(model.directory(settings.models_dir)) if installed else {}
    return {
        "name": model.name,
        "kind": model.kind,
        "layers": config.get("num_hidden_layers"),
        "heads": config.get("num_attention_heads"),
        "d_model": config.get("hidden_size"),
        "tokenizer": model.tokenizer,
        "source": model.source,
        "license": model.license,
        "installed": installed,
    }


def listing(settings: Settings) -> list[dict[str, Any]]:
    return [entry(m, settings) for m in MODELS]


@dataclass(frozen=True)
class ModelAdmitted:
    """A /model request whose rules hold: the model, the tokens, the layer's admitted
    /multihead request (its x still zeros) and the numbers the whole answer computes."""

    req: ModelRequest
    loaded: Loaded
    listed: dict[str, Any]  # the model as GET /models lists it
    ids: IntArray
    tokens: list[str]
    layer: trace.Admitted
    numbers: int


def _model(req: ModelRequest, settings: Settings) -> Loaded:
    model = BY_NAME.get(req.model)
    if model is None:
        names = ", ".join(m.name for m in MODELS if m.installed(settings.models_dir)) or "none"
        raise FieldError(
            "model",
            f'there is no model "{req.model[:40]}"; the models installed here: {names} '
            "(GET /models lists them)",
        )
    if not model.installed(settings.models_dir):
        raise ModelNotInstalled(model.name, INSTALL_COMMAND)
    try:
        return load(model, settings.models_dir)
    except ModelFilesError as error:  # there, but not the files the catalog names
        raise ModelNotInstalled(model.name, INSTALL_COMMAND) from error


def _layer_request(req: ModelRequest, loaded: Loaded, x: np.ndarray, tokens: list[str]) -> Any:
    """The /multihead request that computes layer ``req.layer`` on ``x (L, d)``."""
    block = loaded.encoder.blocks[req.layer]
    a, norm = block.attention, block.attention_norm
    fields: dict[str, Any] = {
        "x": x,
        "tokens": tokens,
        "num_heads": loaded.encoder.num_heads,
        **{n: getattr(a, n) for n in ("w_q", "w_k", "w_v", "b_q", "b_k", "b_v", "w_o", "b_o")},
        "residual": True,
        "layer_norm": {"eps": norm.eps, "gamma": norm.gamma, "beta": norm.beta},
    }
    if loaded.encoder.causal:
        fields["mask"] = {"type": "causal"}
    made = MultiheadRequest.model_validate(fields)
    return made.model_copy(update={"expected": req.expected, "tolerance": req.tolerance})


def admit(req: ModelRequest, settings: Settings) -> ModelAdmitted:
    """Every rule of a /model request, or the error that names the field (422; 413 over the
    token cap; 501 for a model not installed here). Computes nothing."""
    loaded = _model(req, settings)
    if not req.text.strip():
        raise FieldError("text", "text is empty: give a sentence to tokenize")
    ids, tokens = loaded.tokenize(req.text)
    cap = settings.max_model_tokens
    if ids.shape[0] > cap:
        raise LimitError(
            "text",
            f"text is {ids.shape[0]} tokens with the model's special tokens, over this "
            f"service's limit of {cap}; send a shorter text",
            cap,
        )
    if req.layer >= loaded.layers:
        raise FieldError(
            "layer",
            f"layer is {req.layer} but {loaded.model.name} has layers 0 to {loaded.layers - 1}",
        )
    unknown = [n for n in req.include or () if n not in OUTPUTS]
    if unknown:
        raise FieldError(
            "include", f'include names "{unknown[0][:40]}"; choose from {", ".join(OUTPUTS)}'
        )
    zeros = np.zeros((ids.shape[0], loaded.d_model))  # (L, d): the real x comes at run time
    layer = trace.admit(_layer_request(req, loaded, zeros, tokens), "multihead", settings)
    n, d, h = ids.shape[0], loaded.d_model, loaded.encoder.num_heads
    per_layer = 8 * h * n * n + 16 * n * d + 2 * n * int(loaded.encoder.blocks[0].b_in.size)
    numbers = layer.numbers + loaded.layers * per_layer
    listed = entry(loaded.model, settings, loaded.config)
    return ModelAdmitted(req, loaded, listed, ids, tokens, layer, numbers)


def run(admitted: ModelAdmitted, check: Check) -> dict[str, Any]:
    """The /model answer (arrays and values, not yet encoded)."""
    req, loaded = admitted.req, admitted.loaded
    ran = forward(admitted.ids, loaded.encoder)
    check()
    x = ran.hidden[req.layer]  # (L, d): the hidden states entering the layer
    layer = replace(admitted.layer, req=admitted.layer.req.model_copy(update={"x": x}))
    body: dict[str, Any] = {
        "model": admitted.listed,
        "tokens": admitted.tokens,
        "attention": ran.attention,  # (layers, h, L, L)
        "head_roles": [
            [asdict(r) for r in heads] for heads in head_roles(ran.attention, admitted.ids)
        ],
        "rollout": rollout(ran.attention),  # (L, L)
        "trace": {"x_in": x, **trace.run(layer, check)},  # /multihead's answer, and its x
    }
    wanted = req.include or OUTPUTS
    return {k: v for k, v in body.items() if k in wanted}
