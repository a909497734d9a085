"""A model's files turned into the core's :class:`~service.core.encoder.Encoder` (float32
weights widened exactly to float64, ``nn.Linear``'s (out, in) weights transposed to in_out) and
its own tokenizer (the ``tokenizers`` library, from its ``tokenizer.json``). Each model is read
once per process, after its files' SHA-256 are checked against the catalog."""

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from service.core.encoder import Block, Encoder
from service.core.multihead import LayerNorm, MultiheadWeights
from service.core.types import Array, IntArray
from service.models.catalog import FILES, Model


class ModelFilesError(Exception):
    """A model's files are missing or are not the ones the catalog names."""


@dataclass(frozen=True)
class Loaded:
    """A model ready to run."""

    model: Model
    encoder: Encoder
    tokenizer: Tokenizer
    config: dict[str, Any]  # its config.json

    @property
    def layers(self) -> int:
        return len(self.encoder.blocks)

    @property
    def d_model(self) -> int:
        return int(self.encoder.word.shape[1])

    def tokenize(self, text: str) -> tuple[IntArray, list[str], list[bool]]:
        """The token ids ``(L,)`` and tokens of ``text``, with the model's special tokens and
        no padding or truncation, and which of them are special tokens. Tokenized by
        ``encode_batch``, which lets go of the GIL while it works (``encode`` holds it)."""
        (encoding,) = self.tokenizer.encode_batch([text])
        special = [bool(s) for s in encoding.special_tokens_mask]
        return np.asarray(encoding.ids, dtype=np.int64), list(encoding.tokens), special


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_files(model: Model, directory: Path) -> None:
    """Refuse a model directory whose files are missing or differ from the catalog's."""
    for name in FILES:
        path = directory / name
        if not path.is_file():
            raise ModelFilesError(f"{model.name}: {path} is missing")
        if (got := _sha256(path)) != model.sha256[name]:
            raise ModelFilesError(
                f"{model.name}: {path} has SHA-256 {got}, not {model.sha256[name]}"
            )


def _linear(t: dict[str, np.ndarray[Any, Any]], name: str) -> tuple[Array, Array]:
    """An ``nn.Linear``'s weight in in_out layout and its bias, as float64."""
    w = np.asarray(t[f"{name}.weight"], dtype=np.float64).T  # (in, out)
    return np.ascontiguousarray(w), np.asarray(t[f"{name}.bias"], dtype=np.float64)


def _norm(t: dict[str, np.ndarray[Any, Any]], name: str, eps: float) -> LayerNorm:
    gamma = np.asarray(t[f"{name}.weight"], dtype=np.float64)
    return LayerNorm(eps=eps, gamma=gamma, beta=np.asarray(t[f"{name}.bias"], dtype=np.float64))


def _block(t: dict[str, np.ndarray[Any, Any]], prefix: str, eps: float) -> Block:
    """One BertLayer's weights (``encoder.layer.i``)."""
    w_q, b_q = _linear(t, f"{prefix}.attention.self.query")
    w_k, b_k = _linear(t, f"{prefix}.attention.self.key")
    w_v, b_v = _linear(t, f"{prefix}.attention.self.value")
    w_o, b_o = _linear(t, f"{prefix}.attention.output.dense")
    w_in, b_in = _linear(t, f"{prefix}.intermediate.dense")
    w_out, b_out = _linear(t, f"{prefix}.output.dense")
    return Block(
        attention=MultiheadWeights(w_q, w_k, w_v, b_q, b_k, b_v, w_o=w_o, b_o=b_o),
        attention_norm=_norm(t, f"{prefix}.attention.output.LayerNorm", eps),
        w_in=w_in,
        b_in=b_in,
        w_out=w_out,
        b_out=b_out,
        output_norm=_norm(t, f"{prefix}.output.LayerNorm", eps),
    )


def encoder_from(tensors: dict[str, np.ndarray[Any, Any]], config: dict[str, Any]) -> Encoder:
    """A BertModel's state dict (its own key names) and config as the core's Encoder."""
    eps = float(config["layer_norm_eps"])
    layers = int(config["num_hidden_layers"])

    def table(name: str) -> Array:
        return np.asarray(tensors[f"embeddings.{name}.weight"], dtype=np.float64)

    return Encoder(
        word=table("word_embeddings"),
        position=table("position_embeddings"),
        token_type=table("token_type_embeddings"),
        embedding_norm=_norm(tensors, "embeddings.LayerNorm", eps),
        blocks=tuple(_block(tensors, f"encoder.layer.{i}", eps) for i in range(layers)),
        num_heads=int(config["num_attention_heads"]),
        causal=bool(config.get("is_decoder", False)),
    )


def read_config(directory: Path) -> dict[str, Any]:
    """A model's ``config.json`` (its sizes: what GET /models lists without loading it)."""
    config: dict[str, Any] = json.loads((directory / "config.json").read_text())
    return config


@lru_cache(maxsize=4)
def load(model: Model, models_dir: Path) -> Loaded:
    """The model installed under ``models_dir``, its files checked (ModelFilesError)."""
    directory = model.directory(models_dir)
    check_files(model, directory)
    config = read_config(directory)
    encoder = encoder_from(load_file(str(directory / "model.safetensors")), config)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return Loaded(model, encoder, tokenizer, config)
