"""The trained ``tiny-decoder`` (``models/tiny-decoder``, written by
``scripts/train_tiny_decoder.py``), loaded into transformers' own ``BertModel`` in float64: it is
causal, a head in layer >= 1 is an induction head by the contract's definition, its data checksum
is the text the script builds, and its tokenizer round-trips a sentence."""

import hashlib
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import tokenizers
    import torch
    import transformers
torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: the tiny-decoder checks are skipped"
)
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: the tiny-decoder checks are skipped"
)
tokenizers = pytest.importorskip(
    "tokenizers", reason="tokenizers is not installed: the tiny-decoder checks are skipped"
)
safetensors_torch = pytest.importorskip("safetensors.torch")

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "models" / "tiny-decoder"
SCRIPT = ROOT / "scripts" / "train_tiny_decoder.py"
EXTRA_KEYS = ("training", "tokenizer", "lm_head")  # config.json's records beside BertConfig
BOS = 2
N_SPECIAL = 3  # [PAD], [UNK], [BOS]

Weights = npt.NDArray[np.float64]


def induction(weights: Weights, tokens: list[int]) -> float | None:
    """The contract's induction score of one head: the mean, over the positions i whose token
    occurred before, of ``weights[i][j + 1]`` with j the most recent earlier occurrence of that
    token; None when no token repeats. Rows of ``weights`` are queries."""
    values = []
    for i, token in enumerate(tokens):
        earlier = [j for j in range(i) if tokens[j] == token]
        if earlier:
            values.append(float(weights[i][max(earlier) + 1]))
    return float(np.mean(values)) if values else None


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_tiny_decoder", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def config_json() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MODEL_DIR / "config.json").read_text())
    return loaded


@pytest.fixture(scope="module")
def model(config_json: dict[str, Any]) -> Any:
    fields = {k: v for k, v in config_json.items() if k not in EXTRA_KEYS}
    config = transformers.BertConfig.from_dict(fields, attn_implementation="eager")
    assert config.is_decoder is True
    assert config._attn_implementation == "eager"
    bert = transformers.BertModel(config, add_pooling_layer=False)
    state = safetensors_torch.load_file(str(MODEL_DIR / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in state.values())
    bert.load_state_dict(state, strict=True)
    return bert.double().train(False)


def _forward(model: Any, tokens: list[int]) -> Any:
    with torch.no_grad():
        return model(torch.tensor([tokens]), output_attentions=True, use_cache=False)


def _repeated_random(seed: int, n: int, vocab_size: int) -> list[int]:
    block = np.random.default_rng(seed).choice(np.arange(N_SPECIAL, vocab_size), n, replace=False)
    return [BOS, *(int(t) for t in block), *(int(t) for t in block)]


# ------------------------------------------------------------------------- the score itself


def test_induction_score_on_hand_made_weights() -> None:
    tokens = [BOS, 10, 11, 12, 10, 11, 12]  # i = 4, 5, 6 repeat j = 1, 2, 3
    length = len(tokens)
    perfect = np.zeros((length, length))
    perfect[:, 0] = 1.0
    for i, j in ((4, 1), (5, 2), (6, 3)):
        perfect[i] = 0.0
        perfect[i, j + 1] = 1.0
    assert induction(perfect, tokens) == 1.0
    # uniform causal attention: row i gives 1/(i+1) to each of positions 0..i
    uniform = np.tril(np.ones((length, length))) / np.arange(1, length + 1)[:, None]
    assert induction(uniform, tokens) == pytest.approx((1 / 5 + 1 / 6 + 1 / 7) / 3, abs=1e-15)
    # the most recent earlier occurrence counts: token 7 at 1, 2 and 3
    tokens = [BOS, 7, 7, 7]
    weights = np.tril(np.ones((4, 4)))
    weights[2] = [0.0, 0.25, 0.75, 0.0]  # i = 2: j = 1, so w[2][2]
    weights[3] = [0.0, 0.1, 0.2, 0.7]  # i = 3: j = 2 (not 1), so w[3][3]
    assert induction(weights, tokens) == pytest.approx((0.75 + 0.7) / 2, abs=1e-15)
    assert induction(np.eye(3), [BOS, 5, 6]) is None  # nothing repeats


# -------------------------------------------------------------------------------- the model


def test_attention_is_causal(model: Any, config_json: dict[str, Any]) -> None:
    tokens = _repeated_random(11, 30, config_json["vocab_size"])
    out = _forward(model, tokens)
    assert len(out.attentions) == config_json["num_hidden_layers"]
    for layer in out.attentions:
        weights = layer[0].numpy()
        assert weights.shape == (config_json["num_attention_heads"], len(tokens), len(tokens))
        assert np.all(np.triu(weights, k=1) == 0.0)
        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-12)
    # a later token changes nothing before it, and does change its own position onwards
    k = 40
    changed = list(tokens)
    changed[k] = N_SPECIAL if tokens[k] != N_SPECIAL else N_SPECIAL + 1
    before = out.last_hidden_state[0].numpy()
    after = _forward(model, changed).last_hidden_state[0].numpy()
    np.testing.assert_allclose(after[:k], before[:k], rtol=0, atol=1e-12)
    assert np.abs(after[k:] - before[k:]).max(axis=-1).min() > 1e-6


def test_a_head_in_layer_one_or_later_is_an_induction_head(
    model: Any, config_json: dict[str, Any]
) -> None:
    vocab_size = config_json["vocab_size"]
    scores = []
    for seed in (1, 2, 3):
        tokens = _repeated_random(seed, 40, vocab_size)
        attentions = _forward(model, tokens).attentions
        scores.append(
            [
                [induction(layer[0, h].numpy(), tokens) for h in range(layer.shape[1])]
                for layer in attentions
            ]
        )
    mean = np.mean(np.array(scores, dtype=np.float64), axis=0)  # layer x head
    layer, head = np.unravel_index(np.argmax(mean[1:]), mean[1:].shape)
    best = float(mean[1:][layer, head])
    assert best >= 0.3, f"best layer >= 1 head: {layer + 1}.{head} = {best:.3f}; all: {mean}"
    recorded = config_json["training"]["induction"]["best_layer_ge_1"]
    assert recorded["score"] >= 0.3


def test_lm_head_completes_the_model(config_json: dict[str, Any]) -> None:
    fields = {k: v for k, v in config_json.items() if k not in EXTRA_KEYS}
    lm = transformers.BertLMHeadModel(
        transformers.BertConfig.from_dict(fields, attn_implementation="eager")
    )
    state = {
        "bert." + k: v
        for k, v in safetensors_torch.load_file(str(MODEL_DIR / "model.safetensors")).items()
    }
    state.update(safetensors_torch.load_file(str(MODEL_DIR / "lm_head.safetensors")))
    result = lm.load_state_dict(state, strict=False)
    assert not result.unexpected_keys
    # the decoder is tied to the word embeddings (and its bias to cls.predictions.bias)
    assert set(result.missing_keys) <= {
        "cls.predictions.decoder.weight",
        "cls.predictions.decoder.bias",
    }
    assert lm.cls.predictions.decoder.weight is lm.bert.embeddings.word_embeddings.weight
    assert lm.cls.predictions.decoder.bias is lm.cls.predictions.bias
    # with induction, the second copy of a random sequence is far easier than chance
    tokens = _repeated_random(5, 40, config_json["vocab_size"])
    with torch.no_grad():
        logits = lm.double().train(False)(torch.tensor([tokens]), use_cache=False).logits[0]
    nll = torch.nn.functional.cross_entropy(logits[41:-1], torch.tensor(tokens[42:]))
    assert float(nll) < 0.5 * np.log(config_json["vocab_size"])


# ------------------------------------------------------------------------ data and tokenizer


def test_data_checksum_is_the_scripts_text(config_json: dict[str, Any]) -> None:
    script = _script()
    data = config_json["training"]["data"]
    assert data["sha256"] == script.DATA_SHA256
    digest = hashlib.sha256(script.build_training_text().encode("utf-8")).hexdigest()
    if digest != data["sha256"] and platform.python_version() != data["python"]:
        pytest.skip(
            f"pydoc_data.topics differs in Python {platform.python_version()} (the model was "
            f"trained on Python {data['python']}'s text): checksum not comparable"
        )
    assert digest == data["sha256"]


def test_tokenizer_round_trips_a_sentence(config_json: dict[str, Any]) -> None:
    tokenizer = tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == config_json["vocab_size"]
    assert tokenizer.token_to_id("[BOS]") == BOS == config_json["bos_token_id"]
    # the decoder joins "##" pieces and, as BERT's does, removes the space before . , ? ! (not :)
    sentence = "The quick brown fox jumps over the lazy dog, and the quick brown fox runs."
    encoding = tokenizer.encode(sentence)
    assert encoding.tokens[0] == "[BOS]" and encoding.ids[0] == BOS
    assert "[UNK]" not in encoding.tokens
    assert len(encoding.ids) <= config_json["max_position_embeddings"]
    decoded = tokenizer.decode(encoding.ids, skip_special_tokens=True)
    assert decoded == sentence.lower()
    assert tokenizer.encode(decoded).ids == encoding.ids


def test_artifacts_are_small() -> None:
    total = sum(p.stat().st_size for p in MODEL_DIR.iterdir())
    assert total < 2_000_000, total
