"""all-MiniLM-L6-v2 as the service runs it (service.models + service.core.encoder, NumPy float64)
against transformers' own BertModel built from the same safetensors in float64 (eager,
``output_attentions=True``): the tokens equal the model tokenizer's as transformers loads it,
the weights are the file's float32 numbers widened exactly, and for each sentence every layer's
attention weights, the hidden states entering each layer and each attention block's output agree
to 1e-10. The model is installed by ``make models`` (which ``make test`` runs)."""

from typing import Any

import numpy as np
import pytest

from service.config import Settings
from service.core.encoder import forward
from service.models.catalog import BY_NAME
from service.models.loading import Loaded, load

torch = pytest.importorskip("torch", reason="the reference is transformers' BertModel in torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.torch

TOL = 1e-10
SENTENCES = (
    "The cat sat on the mat.",
    "Attention is all you need, said the paper; the students were not so sure!",
    "repeat repeat repeat: the the the",
    "Ünïcödé naïve café — 123,456 tokens?",
)
MODELS_DIR = Settings().models_dir


@pytest.fixture(scope="module")
def ours() -> Loaded:
    model = BY_NAME["minilm"]
    if not model.installed(MODELS_DIR):
        pytest.fail(f"minilm is not installed in {MODELS_DIR}: run make models")
    return load(model, MODELS_DIR)


@pytest.fixture(scope="module")
def reference() -> tuple[Any, Any]:
    """transformers' BertModel in float64 (eager) and its fast tokenizer, from the same files."""
    directory = BY_NAME["minilm"].directory(MODELS_DIR)
    config = transformers.BertConfig.from_pretrained(str(directory))
    config._attn_implementation = "eager"
    model = transformers.BertModel(config, add_pooling_layer=False).to(torch.float64).eval()
    state = safetensors_torch.load_file(str(directory / "model.safetensors"))
    missing, unexpected = model.load_state_dict(
        {k: v.to(torch.float64) for k, v in state.items()}, strict=False
    )
    assert missing == [] and set(unexpected) <= {
        "pooler.dense.weight", "pooler.dense.bias", "embeddings.position_ids"
    }  # fmt: skip
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json")
    )
    return model, tokenizer


@pytest.mark.parametrize("text", SENTENCES, ids=["cat", "paper", "repeats", "unicode"])
def test_tokens_are_the_tokenizers(ours: Loaded, reference: tuple[Any, Any], text: str) -> None:
    _, tokenizer = reference
    ids, tokens, _ = ours.tokenize(text)
    assert ids.tolist() == tokenizer(text)["input_ids"]
    assert tokens == tokenizer.convert_ids_to_tokens(ids.tolist())
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"


def test_weights_are_the_files_float32_numbers_widened(ours: Loaded) -> None:
    state = safetensors_torch.load_file(
        str(BY_NAME["minilm"].directory(MODELS_DIR) / "model.safetensors")
    )
    block = ours.encoder.blocks[3]
    query = state["encoder.layer.3.attention.self.query.weight"].numpy()  # (out, in) float32
    assert query.dtype == np.float32
    np.testing.assert_array_equal(block.attention.w_q, query.astype(np.float64).T)
    np.testing.assert_array_equal(
        ours.encoder.word, state["embeddings.word_embeddings.weight"].numpy().astype(np.float64)
    )


@pytest.mark.parametrize("text", SENTENCES, ids=["cat", "paper", "repeats", "unicode"])
def test_every_layer_agrees_with_transformers(
    ours: Loaded, reference: tuple[Any, Any], text: str
) -> None:
    model, _ = reference
    ids, _, _ = ours.tokenize(text)
    got = forward(ids, ours.encoder)
    blocks: list[Any] = []
    hooks = [
        layer.attention.register_forward_hook(lambda m, i, o: blocks.append(o[0][0].numpy()))
        for layer in model.encoder.layer
    ]
    with torch.no_grad():
        out = model(torch.from_numpy(ids)[None], output_attentions=True, output_hidden_states=True)
    for h in hooks:
        h.remove()
    assert len(out.attentions) == len(got.attention) == 6
    for layer in range(6):
        want = out.attentions[layer][0].numpy()  # (12, L, L)
        assert np.abs(got.attention[layer] - want).max() <= TOL, layer
        assert np.abs(got.hidden[layer] - out.hidden_states[layer][0].numpy()).max() <= TOL
        assert np.abs(got.attention_output[layer] - blocks[layer]).max() <= TOL, layer
    assert np.abs(got.hidden[6] - out.last_hidden_state[0].numpy()).max() <= TOL
