"""GET /models and POST /model (API.md, "Trained models"): the catalog with what is installed
here, and a trained model's attention on the caller's sentence — every layer and head, each
head's role, the rollout, and the chosen layer's whole answer exactly as POST /multihead gives
it (its request built from the layer's weights and the hidden states entering it), so that
steps, summary and compare work on a real layer.

It is answered by the compute endpoints' answer path (service.http.routes: the body parsed by
size, the memory budget held until the answer has left, a client that leaves or reads nothing
stopped), in three stages as they are:

- :func:`check`, wherever the body is parsed (a parser process for a large one): the rules that
  need no model loaded — the model's name, a text neither empty nor longer than the character
  cap (:func:`max_text_chars`: a text that cannot fit the token cap is refused before it is
  tokenized), include's names;
- :func:`admit`, in a thread of the worker: the model loaded (once), the text tokenized, its
  tokens against the cap, the layer, and the layer's /multihead request through the trace's own
  rules and limits — nothing computed;
- :func:`run` once the memory budget has admitted the numbers :func:`admit` counted."""

from collections.abc import Callable, Mapping
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
from service.wire.errors import FieldError, LimitError, ModelNotInstalled, RequestError
from service.wire.schemas.model_fields import ModelRequest
from service.wire.schemas.requests import MultiheadRequest

OUTPUTS = ("model", "tokens", "attention", "head_roles", "rollout", "trace", "layer_weights")
DEFAULT_OUTPUTS = OUTPUTS[:-1]  # layer_weights (the layer's own weights, not computed) on request
FORWARD_OUTPUTS = frozenset({"attention", "head_roles", "rollout"})  # need every layer run
SHORTER = "send a shorter text"  # what a /model request over a limit can change
BUDGET_ADVICE = (  # what the caller (and the operator) can change when it is over the budget
    f"{SHORTER}, or ask for less with include (attention, head_roles and rollout without the "
    "trace, or one layer's trace alone); the operator can give each worker more memory "
    "(fewer workers, a larger memory limit or ATTENTION_MEMORY_BUDGET_BYTES)"
)
JSON_BYTES_PER_CHAR = 6  # a character as JSON may send it: \\u00e9
EXPECTED_ARRAYS = 16  # expected arrays a /model body is sized for (one layer's, compared)
JSON_BYTES_PER_NUMBER = 25  # "-1.2345678901234567e-100,"
BODY_SLACK = 64 * 1024  # the body's other fields and JSON's punctuation
BODY_ADVICE = (
    "a /model body holds a text within the token cap and the chosen layer's expected arrays: "
    f"{SHORTER} or fewer expected arrays"
)


def max_text_chars(settings: Settings) -> int:
    """The longest text /model tokenizes: a text of up to ``max_model_tokens`` tokens whose
    every word is as long as the longest word the catalog's tokenizers keep (longer words are
    one [UNK]), each followed by one separator. A longer text is refused (413) before it is
    tokenized: otherwise a 32 MB body would be tokenized in full only to learn that it is
    over the token cap."""
    longest = max(m.longest_word for m in MODELS)
    return settings.max_model_tokens * (longest + 1)


def max_body_bytes(settings: Settings) -> int:
    """The largest /model body worth reading (413 above, before it is read): its text at the
    character cap, EXPECTED_ARRAYS expected arrays of the chosen layer and grad_output, each
    at most L × max(d_model, L) numbers (Q, K, V, a head's weights, the output) with L the
    token cap, for the largest model installed here; never more than ``max_body_bytes``."""
    tokens = settings.max_model_tokens
    widths = [
        int(entry(m, settings)["d_model"] or 0) for m in MODELS if m.installed(settings.models_dir)
    ]
    array = tokens * max([tokens, *widths])
    text = JSON_BYTES_PER_CHAR * max_text_chars(settings)
    arrays = EXPECTED_ARRAYS + 1  # and grad_output, the layer's output's shape
    limit = text + arrays * JSON_BYTES_PER_NUMBER * array + BODY_SLACK
    return min(settings.max_body_bytes, limit)


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
    /multihead request (its x still zeros) and the most numbers the answer holds at once."""

    req: ModelRequest
    loaded: Loaded
    listed: dict[str, Any]  # the model as GET /models lists it
    ids: IntArray
    tokens: list[str]
    layer: trace.Admitted
    numbers: int  # the most numbers it holds at once (its memory): see _held
    wanted: tuple[str, ...]  # the outputs returned: include's, else DEFAULT_OUTPUTS
    blocks: int  # the blocks the forward runs: all of them, or those before the layer

    @property
    def weights(self) -> dict[str, Any]:
        """The layer's /multihead fields besides x and tokens (the layer_weights output)."""
        return _layer_fields(self.loaded, self.req.layer)

    @property
    def comparing(self) -> bool:
        """Whether the layer's trace is compared with expected arrays."""
        return "trace" in self.wanted and self.layer.comparing

    @property
    def decimals(self) -> int | None:
        return self.req.decimals

    def numbers_in(self, body: Mapping[str, Any]) -> dict[str, int]:
        """How many numbers each top-level output of ``body`` holds (its memory goes back as
        it is written): the forward's weights and rollout, and the layer's whole trace."""
        n, h = int(self.ids.shape[0]), self.loaded.encoder.num_heads
        sizes = {
            "attention": self.loaded.layers * h * n * n,
            "rollout": n * n,
            "head_roles": self.loaded.layers * h * 8,
            "trace": self.layer.numbers,
            "layer_weights": _size(self.weights),
        }
        return {name: size for name, size in sizes.items() if name in body}


def _catalogued(req: ModelRequest, settings: Settings) -> Model:
    model = BY_NAME.get(req.model)
    if model is None:
        names = ", ".join(m.name for m in MODELS if m.installed(settings.models_dir)) or "none"
        raise FieldError(
            "model",
            f'there is no model "{req.model[:40]}"; the models installed here: {names} '
            "(GET /models lists them)",
        )
    return model


def _loaded(model: Model, settings: Settings) -> Loaded:
    if not model.installed(settings.models_dir):
        raise ModelNotInstalled(model.name, INSTALL_COMMAND)
    try:
        return load(model, settings.models_dir)
    except ModelFilesError as error:  # there, but not the files the catalog names
        raise ModelNotInstalled(model.name, INSTALL_COMMAND) from error


def _layer_fields(loaded: Loaded, layer: int) -> dict[str, Any]:
    """Layer ``layer``'s /multihead request fields besides ``x`` and ``tokens``: its heads,
    weights and biases (in_out layout, /multihead's default), residual, layer norm, and the
    causal mask of a decoder."""
    block = loaded.encoder.blocks[layer]
    a, norm = block.attention, block.attention_norm
    names = ("w_q", "w_k", "w_v", "b_q", "b_k", "b_v", "w_o", "b_o")
    fields: dict[str, Any] = {
        "num_heads": loaded.encoder.num_heads,
        **{n: getattr(a, n) for n in names if getattr(a, n) is not None},
        "residual": True,
        "layer_norm": {"eps": norm.eps, "gamma": norm.gamma, "beta": norm.beta},
    }
    if loaded.encoder.causal:
        fields["mask"] = {"type": "causal"}
    return fields


def _size(fields: Mapping[str, Any]) -> int:
    """How many numbers the arrays in ``fields`` (nested one level) hold."""
    inner = [v for f in fields.values() if isinstance(f, Mapping) for v in f.values()]
    return sum(int(v.size) for v in (*fields.values(), *inner) if isinstance(v, np.ndarray))


def _layer_request(req: ModelRequest, loaded: Loaded, x: np.ndarray, tokens: list[str]) -> Any:
    """The /multihead request that computes layer ``req.layer`` on ``x (L, d)``."""
    fields = {"x": x, "tokens": tokens, **_layer_fields(loaded, req.layer)}
    made = MultiheadRequest.model_validate(fields)
    asked = {"expected": req.expected, "tolerance": req.tolerance, "grad_output": req.grad_output}
    return made.model_copy(update=asked)


def check(req: ModelRequest, settings: Settings) -> ModelRequest:
    """The rules of a /model request that need no model loaded, or the error that names the
    field: runs wherever the body is parsed. Tokenizes nothing."""
    _catalogued(req, settings)
    if not req.text.strip():
        raise FieldError("text", "text is empty: give a sentence to tokenize")
    cap = max_text_chars(settings)
    if len(req.text) > cap:
        raise LimitError(
            "text",
            f"text is {len(req.text):,} characters, over this service's limit of {cap:,} (its "
            f"cap of {settings.max_model_tokens} tokens, each a word of at most "
            f"{cap // settings.max_model_tokens - 1} characters and a space); {SHORTER}",
            cap,
        )
    unknown = [n for n in req.include or () if n not in OUTPUTS]
    if unknown:
        raise FieldError(
            "include", f'include names "{unknown[0][:40]}"; choose from {", ".join(OUTPUTS)}'
        )
    for name, what in (("expected", "compared with"), ("grad_output", "the seed of")):
        if getattr(req, name) is not None and req.include and "trace" not in req.include:
            raise FieldError(
                name,
                f"{name} is {what} the chosen layer's trace, which include leaves out: "
                'add "trace" to include (or leave include out)',
            )
    return req


def _tokens(req: ModelRequest, loaded: Loaded, settings: Settings) -> tuple[IntArray, list[str]]:
    """The text's token ids and tokens, within the token cap and not only special tokens."""
    ids, tokens, special = loaded.tokenize(req.text)
    cap = settings.max_model_tokens
    if ids.shape[0] > cap:
        raise LimitError(
            "text",
            f"text is {ids.shape[0]} tokens with the model's special tokens, over this "
            f"service's limit of {cap}; {SHORTER}",
            cap,
        )
    if all(special):
        raise FieldError(
            "text",
            f"text has no tokens for {loaded.model.name} besides its special tokens "
            f"({' '.join(tokens)}): give a sentence with words in it",
        )
    return ids, tokens


def _shorter(error: RequestError) -> RequestError:
    """A limit of the layer's trace (service.trace.limits) as /model's: the text is what the
    caller can shorten (the heads and masks are the model's)."""
    if not isinstance(error, LimitError):
        return error
    first = error.items[0].message.split("; ")[0]
    return LimitError("text", f"{first}; {SHORTER}", error.limit)


def admit(req: ModelRequest, settings: Settings) -> ModelAdmitted:
    """Every rule of a /model request :func:`check` has passed, or the error that names the
    field (422; 413 over the token cap or a limit; 501 for a model not installed here): the
    model loaded (once a process), the text tokenized. Computes nothing."""
    loaded = _loaded(_catalogued(req, settings), settings)
    ids, tokens = _tokens(req, loaded, settings)
    if req.layer >= loaded.layers:
        raise FieldError(
            "layer",
            f"layer is {req.layer} but {loaded.model.name} has layers 0 to {loaded.layers - 1}",
        )
    zeros = np.zeros((ids.shape[0], loaded.d_model))  # (L, d): the real x comes at run time
    try:
        layer = trace.admit(_layer_request(req, loaded, zeros, tokens), "multihead", settings)
    except RequestError as error:
        raise _shorter(error) from None
    wanted = tuple(req.include or DEFAULT_OUTPUTS)
    blocks = loaded.layers if FORWARD_OUTPUTS & set(wanted) else req.layer
    n, d, h = ids.shape[0], loaded.d_model, loaded.encoder.num_heads
    per_layer = 8 * h * n * n + 16 * n * d + 2 * n * int(loaded.encoder.blocks[0].b_in.size)
    traced = layer.numbers if "trace" in wanted else 0
    computed = blocks * per_layer + traced
    if computed > settings.max_computed_numbers:
        raise LimitError(
            "text",
            f"this text would make {loaded.model.name} compute {computed:,} numbers, over the "
            f"limit of {settings.max_computed_numbers:,}; {SHORTER}",
            settings.max_computed_numbers,
        )
    held = _held(n, d, h, blocks, per_layer) + traced
    if FORWARD_OUTPUTS & set(wanted):
        held += n * n + loaded.layers * h * 8  # the rollout and the head roles
    if "layer_weights" in wanted:  # not computed, but encoded: counted as returned numbers
        held += _size(_layer_fields(loaded, req.layer))
    listed = entry(loaded.model, settings, loaded.config)
    return ModelAdmitted(req, loaded, listed, ids, tokens, layer, held, wanted, blocks)


def _held(n: int, d: int, h: int, blocks: int, per_layer: int) -> int:
    """The most numbers ``blocks`` blocks of the forward hold at once on ``n`` tokens: what it
    keeps (each block's weights ``(h, n, n)``, the hidden states entering and leaving each
    block and its attention output ``(n, d)``) and one block's intermediates, dropped before
    the next block starts. (Measured with tracemalloc at 128 tokens of minilm: a peak of 4.5
    million float64s, where this counts 4.6 million; every output: 5.8 million counted.)"""
    kept = blocks * h * n * n + (2 * blocks + 1) * n * d
    return kept + (per_layer if blocks else 0)


def run(admitted: ModelAdmitted, check: Check) -> dict[str, Any]:
    """The /model answer (arrays and values, not yet encoded): only the outputs wanted are
    computed (no trace when it is left out; no block after the layer when only the trace or
    the layer's weights are asked for)."""
    req, wanted = admitted.req, admitted.wanted
    ran = forward(admitted.ids, admitted.loaded.encoder, admitted.blocks)
    check()
    parts: dict[str, Callable[[], Any]] = {
        "model": lambda: admitted.listed,
        "tokens": lambda: admitted.tokens,
        "attention": lambda: ran.attention,  # (layers, h, L, L)
        "head_roles": lambda: [
            [asdict(r) for r in heads] for heads in head_roles(ran.attention, admitted.ids)
        ],
        "rollout": lambda: rollout(ran.attention),  # (L, L)
        "trace": lambda: _trace(admitted, ran.hidden[req.layer], check),
        "layer_weights": lambda: admitted.weights,
    }
    return {name: part() for name, part in parts.items() if name in wanted}


def _trace(admitted: ModelAdmitted, x: np.ndarray, check: Check) -> dict[str, Any]:
    """The layer's /multihead answer on ``x (L, d)``, the hidden states entering it, and x."""
    layer = replace(admitted.layer, req=admitted.layer.req.model_copy(update={"x": x}))
    return {"x_in": x, **trace.run(layer, check)}
