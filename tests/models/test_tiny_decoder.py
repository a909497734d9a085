"""tiny-decoder as the service runs it (service.models + service.core.encoder, causal) against
transformers' BertModel with is_decoder=True built from the same committed safetensors in
float64; and through POST /model: causal weights, a causal trace, and an induction head in
layer 1 on a repeated random sequence, its score recomputed here from the returned weights by
the contract's definition."""

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.core.encoder import forward
from service.models.catalog import BY_NAME
from service.models.loading import Loaded, load

torch = pytest.importorskip("torch", reason="the reference is transformers' BertModel in torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.torch

MODELS_DIR = Settings().models_dir
DIRECTORY = BY_NAME["tiny-decoder"].directory(MODELS_DIR)
SENTENCES = ("the cat sat on the mat. the cat slept.", "def f(x): return x + 1", "Öl and ß")


@pytest.fixture(scope="module")
def ours() -> Loaded:
    return load(BY_NAME["tiny-decoder"], MODELS_DIR)  # committed: always installed


@pytest.fixture(scope="module")
def reference() -> tuple[Any, Any]:
    config = transformers.BertConfig.from_pretrained(str(DIRECTORY))
    config._attn_implementation = "eager"
    assert config.is_decoder
    model = transformers.BertModel(config, add_pooling_layer=False).to(torch.float64).eval()
    state = safetensors_torch.load_file(str(DIRECTORY / "model.safetensors"))
    model.load_state_dict({k: v.to(torch.float64) for k, v in state.items()}, strict=True)
    fast: Any = transformers.PreTrainedTokenizerFast
    return model, fast(tokenizer_file=str(DIRECTORY / "tokenizer.json"))


@pytest.mark.parametrize("text", SENTENCES, ids=["cat", "code", "unicode"])
def test_every_layer_agrees_with_transformers(
    ours: Loaded, reference: tuple[Any, Any], text: str
) -> None:
    model, tokenizer = reference
    ids, tokens, _ = ours.tokenize(text)
    assert ids.tolist() == tokenizer(text)["input_ids"] and tokens[0] == "[BOS]"
    got = forward(ids, ours.encoder)
    with torch.no_grad():
        out = model(torch.from_numpy(ids)[None], output_attentions=True, output_hidden_states=True)
    for layer in range(2):
        assert np.abs(got.attention[layer] - out.attentions[layer][0].numpy()).max() <= 1e-10
        assert (
            np.abs(got.hidden[layer + 1] - out.hidden_states[layer + 1][0].numpy()).max() <= 1e-10
        )


def repeated_words(ours: Loaded, n: int = 30, seed: int = 3) -> str:
    """n distinct whole words of the vocabulary in a random order, then the same n again."""
    vocab = ours.tokenizer.get_vocab()
    words = sorted(w for w in vocab if w.isalpha() and w.islower() and len(w) > 2)
    chosen = list(np.random.default_rng(seed).choice(words, size=n, replace=False))
    return " ".join(chosen + chosen)


def induction(w: np.ndarray, tokens: list[str]) -> float:
    """The contract's definition, written out: over the positions whose token occurred before,
    the mean weight on the token after its most recent earlier occurrence."""
    seen: dict[str, int] = {}
    picked = []
    for i, tok in enumerate(tokens):
        if tok in seen:
            picked.append(w[i, seen[tok] + 1])
        seen[tok] = i
    return float(np.mean(picked))


def test_model_is_causal_and_has_an_induction_head(client: TestClient, ours: Loaded) -> None:
    text = repeated_words(ours)
    r = client.post("/model", json={"model": "tiny-decoder", "text": text, "layer": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    tokens, a = body["tokens"], np.array(body["attention"])  # (2, 4, L, L)
    assert len(tokens) == 61 and tokens[1:31] == tokens[31:]  # each word one token
    above = np.triu(np.ones(a.shape[-2:], dtype=bool), 1)
    assert np.all(a[..., above] == 0.0)  # no query sees a later key
    assert body["trace"]["conventions"] is not None and "mask" in body["trace"]
    roles = body["head_roles"]
    scores = [roles[1][h]["induction"] for h in range(4)]
    assert max(scores) >= 0.3, scores
    for h in range(4):
        assert scores[h] == pytest.approx(induction(a[1, h], tokens), abs=1e-12)
    assert any(roles[1][h]["role"] == "induction" for h in range(4))
    # layer 0 has none: the induction circuit needs the previous-token heads below it
    assert max(roles[0][h]["induction"] for h in range(4)) < 0.3


def test_models_lists_the_decoder(client: TestClient) -> None:
    [listed] = [m for m in client.get("/models").json() if m["name"] == "tiny-decoder"]
    assert (listed["kind"], listed["layers"], listed["heads"], listed["d_model"]) == (
        "decoder",
        2,
        4,
        64,
    )
    assert listed["installed"] is True
