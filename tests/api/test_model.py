"""GET /models and POST /model through the app, with all-MiniLM-L6-v2 (installed by make models).

Where the expected numbers come from: transformers' own BertModel built from the same
safetensors in float64 (eager, output_attentions=True) for the attention of every layer, the
hidden states entering the chosen layer and its attention block's output; the rollout and the
head roles recomputed here from the returned weights by the contract's definitions, written
out in this file; the chosen layer's trace against the service's own POST /multihead given the
same layer as a Hugging Face style request (the contract says the trace is exactly that answer).
"""

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.http.app import create_app
from service.models.catalog import BY_NAME
from service.models.loading import load

torch = pytest.importorskip("torch", reason="the reference is transformers' BertModel in torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.torch

TEXT = "The cat sat on the mat. The cat slept."
MODELS_DIR = Settings().models_dir
DIRECTORY = BY_NAME["minilm"].directory(MODELS_DIR)


@pytest.fixture(scope="module")
def bert() -> Any:
    if not BY_NAME["minilm"].installed(MODELS_DIR):
        pytest.fail(f"minilm is not installed in {MODELS_DIR}: run make models")
    config = transformers.BertConfig.from_pretrained(str(DIRECTORY))
    config._attn_implementation = "eager"
    model = transformers.BertModel(config, add_pooling_layer=False).to(torch.float64).eval()
    state = safetensors_torch.load_file(str(DIRECTORY / "model.safetensors"))
    model.load_state_dict({k: v.to(torch.float64) for k, v in state.items()}, strict=False)
    return model


@pytest.fixture(scope="module")
def answer(client: TestClient) -> dict[str, Any]:
    r = client.post("/model", json={"model": "minilm", "text": TEXT, "layer": 2})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_models_lists_minilm_installed(client: TestClient) -> None:
    [listed] = [m for m in client.get("/models").json() if m["name"] == "minilm"]
    assert listed == {
        "name": "minilm", "kind": "encoder", "layers": 6, "heads": 12, "d_model": 384,
        "tokenizer": listed["tokenizer"], "source": listed["source"], "license": "Apache-2.0",
        "installed": True,
    }  # fmt: skip
    assert "WordPiece" in listed["tokenizer"] and "all-MiniLM-L6-v2" in listed["source"]


def test_tokens_and_every_layers_weights_are_transformers(
    bert: Any, answer: dict[str, Any]
) -> None:
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(DIRECTORY / "tokenizer.json")
    )
    ids = tokenizer(TEXT)["input_ids"]
    assert answer["tokens"] == tokenizer.convert_ids_to_tokens(ids)
    with torch.no_grad():
        out = bert(torch.tensor([ids]), output_attentions=True)
    want = np.stack([a[0].numpy() for a in out.attentions])  # (6, 12, L, L)
    got = np.array(answer["attention"])
    assert got.shape == want.shape == (6, 12, len(ids), len(ids))
    assert np.abs(got - want).max() <= 1e-10


def test_the_trace_is_the_layer_as_transformers_computes_it(
    bert: Any, answer: dict[str, Any]
) -> None:
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(DIRECTORY / "tokenizer.json")
    )
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    block: list[Any] = []
    hook = bert.encoder.layer[2].attention.register_forward_hook(
        lambda m, i, o: block.append(o[0][0].numpy())
    )
    with torch.no_grad():
        out = bert(ids, output_hidden_states=True)
    hook.remove()
    t = answer["trace"]
    assert np.abs(np.array(t["x_in"]) - out.hidden_states[2][0].numpy()).max() <= 1e-10
    assert np.abs(np.array(t["output"]) - block[0]).max() <= 1e-10
    assert (
        np.abs(np.array(t["average_weights"]) - np.array(answer["attention"][2]).mean(0)).max()
        < 1e-12
    )


def test_the_trace_is_exactly_multiheads_answer(client: TestClient, answer: dict[str, Any]) -> None:
    """The same layer sent to /multihead as a Hugging Face BERT layer's state dict: the same
    answer (the trace adds x_in, the x that /multihead does not echo)."""
    state = safetensors_torch.load_file(str(DIRECTORY / "model.safetensors"))
    p = "encoder.layer.2.attention"

    def w(name: str) -> Any:
        return state[f"{p}.{name}"].to(torch.float64).numpy().tolist()

    body = {
        "x": answer["trace"]["x_in"], "tokens": answer["tokens"], "num_heads": 12,
        "q_proj.weight": w("self.query.weight"), "q_proj.bias": w("self.query.bias"),
        "k_proj.weight": w("self.key.weight"), "k_proj.bias": w("self.key.bias"),
        "v_proj.weight": w("self.value.weight"), "v_proj.bias": w("self.value.bias"),
        "o_proj.weight": w("output.dense.weight"), "o_proj.bias": w("output.dense.bias"),
        "residual": True,
        "layer_norm": {"eps": 1e-12, "gamma": w("output.LayerNorm.weight"),
                       "beta": w("output.LayerNorm.bias")},
    }  # fmt: skip
    direct = client.post("/multihead", json=body)
    assert direct.status_code == 200, direct.text
    assert direct.json() == {k: v for k, v in answer["trace"].items() if k != "x_in"}


def test_rollout_and_head_roles_follow_the_contracts_definitions(answer: dict[str, Any]) -> None:
    a = np.array(answer["attention"])  # (layers, h, L, L)
    n = a.shape[-1]
    r = np.eye(n)
    for layer in a:
        m = 0.5 * layer.mean(0) + 0.5 * np.eye(n)
        r = (m / m.sum(-1, keepdims=True)) @ r
    assert np.abs(np.array(answer["rollout"]) - r).max() < 1e-12
    tokens = answer["tokens"]
    for layer, h in ((0, 0), (2, 5), (5, 11)):
        w, role = a[layer, h], answer["head_roles"][layer][h]
        assert role["previous_token"] == pytest.approx(np.mean([w[i, i - 1] for i in range(1, n)]))
        assert role["first_token"] == pytest.approx(w[:, 0].mean())
        # "the" and "cat" repeat: position i's token last seen at j → weight on j + 1
        seen: dict[str, int] = {}
        induction = []
        for i, tok in enumerate(tokens):
            if tok in seen:
                induction.append(w[i, seen[tok] + 1])
            seen[tok] = i
        assert role["induction"] == pytest.approx(np.mean(induction))
        bits = -np.sum(np.where(w > 0, w * np.log2(w), 0.0), axis=-1).mean()
        assert role["entropy_bits"] == pytest.approx(bits)
        scores = {k: role[k] for k in ("previous_token", "next_token", "self", "first_token",
                                       "last_token", "induction")}  # fmt: skip
        best = max(scores, key=lambda k: scores[k])
        assert role["role"] == (best if scores[best] >= 0.5 else None)


def test_include_and_expected_reach_the_trace(client: TestClient, answer: dict[str, Any]) -> None:
    right = answer["trace"]["output"]
    wrong = (np.array(right) * 1.01).tolist()
    r = client.post(
        "/model",
        json={"model": "minilm", "text": TEXT, "layer": 2, "include": ["tokens", "trace"],
              "expected": {"output": wrong}},
    )  # fmt: skip
    body = r.json()
    assert set(body) == {"tokens", "trace"}
    assert body["trace"]["first_mismatch"] == "output"


@pytest.mark.parametrize(
    ("request_body", "status", "field"),
    [
        ({"model": "bert-large", "text": "hi"}, 422, "model"),
        ({"model": "minilm", "text": "   "}, 422, "text"),
        ({"model": "minilm", "text": "word " * 127}, 413, "text"),
        ({"model": "minilm", "text": "hi", "layer": 6}, 422, "layer"),
        ({"model": "minilm", "text": "hi", "include": ["weights"]}, 422, "include"),
        ({"model": "minilm"}, 422, "text"),
    ],
    ids=["unknown-model", "empty-text", "over-the-token-cap", "layer-out-of-range",
         "unknown-include", "no-text"],
)  # fmt: skip
def test_bad_requests_name_their_field(
    client: TestClient, request_body: dict[str, Any], status: int, field: str
) -> None:
    r = client.post("/model", json=request_body)
    assert r.status_code == status, r.text
    assert r.json()["errors"][0]["field"] == field


def test_the_token_cap_counts_special_tokens(client: TestClient) -> None:
    ok = client.post(
        "/model", json={"model": "minilm", "text": "word " * 126, "include": ["tokens"]}
    )
    assert ok.status_code == 200 and len(ok.json()["tokens"]) == 128  # [CLS] + 126 + [SEP]


def test_a_model_not_installed_here_is_501_with_its_install_command(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(models_dir=tmp_path))) as c:
        r = c.post("/model", json={"model": "minilm", "text": "hi"})
        assert r.status_code == 501
        assert r.json()["install_command"] == "make models"
        assert "make models" in r.json()["message"]
        [listed] = [m for m in c.get("/models").json() if m["name"] == "minilm"]
        assert listed["installed"] is False


def test_a_safetensors_answer_holds_the_same_arrays(
    client: TestClient, answer: dict[str, Any]
) -> None:
    from safetensors.numpy import load

    r = client.post(
        "/model",
        json={"model": "minilm", "text": TEXT, "layer": 2},
        headers={"Accept": "application/x-safetensors"},
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-safetensors"
    tensors = load(r.content)
    np.testing.assert_array_equal(tensors["attention"], np.array(answer["attention"]))
    np.testing.assert_array_equal(
        tensors["trace.heads.4.weights"], np.array(answer["trace"]["heads"][4]["weights"])
    )


def test_a_model_whose_files_differ_from_the_catalogs_is_501(tmp_path: Path) -> None:
    """Files there but not the catalog's (a partial copy, an edited file): refused as not
    installed, with its install command, never a 500."""
    copy = tmp_path / "minilm"
    copy.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (copy / name).write_bytes((DIRECTORY / name).read_bytes())
    (copy / "model.safetensors").write_bytes(b"not the weights")
    with TestClient(create_app(Settings(models_dir=tmp_path))) as c:
        r = c.post("/model", json={"model": "minilm", "text": "hi"})
        assert r.status_code == 501, r.text
        assert r.json()["install_command"] == "make models"
        [listed] = [m for m in c.get("/models").json() if m["name"] == "minilm"]
        assert (listed["installed"], listed["layers"]) == (True, 6)  # its config, not its weights


def test_a_model_answer_larger_than_the_whole_budget_says_to_send_a_shorter_text() -> None:
    """/model has no heads, batch or masks to change (its 413 used to advise them)."""
    with TestClient(create_app(Settings(memory_budget_bytes=32 << 20))) as small:
        r = small.post("/model", json={"model": "minilm", "text": "the cat sat " * 30})
    assert r.status_code == 413, r.text
    message = r.json()["message"]
    assert "budget" in message and "send a shorter text, or ask for less with include" in message
    assert "ATTENTION_MEMORY_BUDGET_BYTES" in message


@pytest.mark.parametrize(
    "include",
    [None, ["model", "tokens", "attention", "head_roles", "rollout"], ["trace", "layer_weights"]],
    ids=["everything", "the-model-view", "one-layer"],
)
def test_a_128_token_answer_fits_a_two_worker_containers_budget(include: list[str] | None) -> None:
    """docker-compose's 2 workers in a small container: 192 MiB a worker. The answer's cost is
    the most it holds at once (measured peak: a fifth of it), not every number it computes."""
    text = " ".join(["word"] * 126)
    with TestClient(create_app(Settings(memory_budget_bytes=192 << 20))) as two_worker:
        r = two_worker.post(
            "/model",
            json={"model": "minilm", "text": text, "layer": 3, "include": include},
            headers={"Accept": "application/x-safetensors"},
        )
    assert r.status_code == 200, r.text


def test_the_character_cap_covers_the_catalogs_longest_words() -> None:
    """The catalog's longest word per model is its tokenizer's: a longer word is one [UNK]."""
    for name in ("minilm", "tiny-decoder"):
        model = BY_NAME[name]
        if not model.installed(MODELS_DIR):
            continue
        tokenizer = load(model, MODELS_DIR).tokenizer
        assert tokenizer.model.max_input_chars_per_word == model.longest_word
        assert tokenizer.encode("x" * (model.longest_word + 1)).tokens[1:2] == ["[UNK]"]


def test_layer_weights_are_the_checkpoints_and_make_the_trace_with_x_in(
    client: TestClient, answer: dict[str, Any]
) -> None:
    """include layer_weights: the layer's /multihead fields (in_out layout), read here from the
    checkpoint's own tensors (transposed out_in Linear weights); with x = trace.x_in they are a
    /multihead request whose answer is the trace."""
    r = client.post(
        "/model",
        json={"model": "minilm", "text": TEXT, "layer": 2, "include": ["layer_weights"]},
    )
    assert r.status_code == 200, r.text
    fields = r.json()["layer_weights"]
    state = safetensors_torch.load_file(str(DIRECTORY / "model.safetensors"))
    p = "encoder.layer.2.attention"
    names = {"w_q": "self.query", "w_k": "self.key", "w_v": "self.value", "w_o": "output.dense"}
    for field, module in names.items():
        weight = state[f"{p}.{module}.weight"].to(torch.float64).numpy()  # (out, in)
        bias = state[f"{p}.{module}.bias"].to(torch.float64).numpy()
        np.testing.assert_array_equal(np.array(fields[field]), weight.T)
        np.testing.assert_array_equal(np.array(fields["b" + field[1:]]), bias)
    gamma = state[f"{p}.output.LayerNorm.weight"].to(torch.float64).numpy()
    np.testing.assert_array_equal(np.array(fields["layer_norm"]["gamma"]), gamma)
    assert (fields["num_heads"], fields["residual"], fields["layer_norm"]["eps"]) == (
        12,
        True,
        1e-12,
    )
    assert "mask" not in fields  # an encoder: no causal mask
    body = {"x": answer["trace"]["x_in"], "tokens": answer["tokens"], **fields}
    direct = client.post("/multihead", json=body)
    assert direct.status_code == 200, direct.text
    assert direct.json() == {k: v for k, v in answer["trace"].items() if k != "x_in"}


def test_layer_weights_are_asked_for_and_a_decoders_carry_its_causal_mask(
    client: TestClient,
) -> None:
    everything = client.post("/model", json={"model": "minilm", "text": TEXT}).json()
    assert "layer_weights" not in everything and "trace" in everything
    r = client.post(
        "/model",
        json={"model": "tiny-decoder", "text": "the cat", "include": ["layer_weights"]},
    )
    assert r.status_code == 200, r.text
    assert r.json()["layer_weights"]["mask"] == {"type": "causal"}


def test_only_the_outputs_asked_for_are_computed(
    client: TestClient, answer: dict[str, Any]
) -> None:
    """The page's two requests: the model view without the trace, then one layer's trace and
    weights; each the same numbers as the whole answer (only the blocks before the layer run
    for the second)."""
    first = client.post(
        "/model",
        json={"model": "minilm", "text": TEXT, "layer": 2,
              "include": ["tokens", "attention", "head_roles", "rollout"]},
    ).json()  # fmt: skip
    assert set(first) == {"tokens", "attention", "head_roles", "rollout"}
    assert first == {k: answer[k] for k in first}
    second = client.post(
        "/model",
        json={"model": "minilm", "text": TEXT, "layer": 2, "include": ["trace"]},
    ).json()
    assert second == {"trace": answer["trace"]}


def test_expected_without_the_trace_is_422(client: TestClient, answer: dict[str, Any]) -> None:
    r = client.post(
        "/model",
        json={"model": "minilm", "text": TEXT, "include": ["attention"],
              "expected": {"output": answer["trace"]["output"]}},
    )  # fmt: skip
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "expected"
    assert 'add "trace" to include' in r.json()["message"]


def test_a_safetensors_answer_names_the_layer_weights_by_their_path(client: TestClient) -> None:
    from safetensors.numpy import load

    r = client.post(
        "/model",
        json={"model": "minilm", "text": TEXT, "include": ["layer_weights"]},
        headers={"Accept": "application/x-safetensors"},
    )
    tensors = load(r.content)
    assert tensors["layer_weights.w_q"].shape == (384, 384)
    assert tensors["layer_weights.layer_norm.gamma"].shape == (384,)


def test_a_layers_backward_is_autograd_through_transformers_bert_attention(
    client: TestClient, bert: Any, answer: dict[str, Any]
) -> None:
    """grad_output on /model: the layer's trace carries /multihead's gradients; each equals
    torch.autograd through transformers' own BertAttention of layer 2 in float64, on the
    hidden states entering it, with the same seed dO."""
    n = len(answer["tokens"])
    seed = np.random.default_rng(7).normal(size=(n, 384))  # dO: ∂loss/∂(the layer's output)
    r = client.post(
        "/model",
        json={"model": "minilm", "text": TEXT, "layer": 2, "include": ["trace"],
              "grad_output": seed.tolist()},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    trace = r.json()["trace"]
    attention = bert.encoder.layer[2].attention  # BertAttention: self, output.dense, LayerNorm
    x = torch.tensor(trace["x_in"], dtype=torch.float64)[None].requires_grad_(True)
    with torch.no_grad():  # the x_in the service traced is transformers' hidden state
        hidden = bert(torch.tensor([_ids()]), output_hidden_states=True).hidden_states[2]
    assert np.abs(hidden[0].numpy() - np.array(trace["x_in"])).max() <= 1e-10
    out = attention(x)[0]  # (1, L, 384): LayerNorm(x + dense(self-attention(x)))
    attention.zero_grad()
    (out * torch.tensor(seed)[None]).sum().backward()
    weights = {
        "grad_w_q": attention.self.query.weight, "grad_w_k": attention.self.key.weight,
        "grad_w_v": attention.self.value.weight, "grad_w_o": attention.output.dense.weight,
    }  # fmt: skip
    assert x.grad is not None
    pairs = [("grad_x", x.grad[0].numpy())]
    pairs += [(name, w.grad.numpy().T) for name, w in weights.items()]  # out_in -> in_out
    pairs += [("grad_b_q", attention.self.query.bias.grad.numpy()),
              ("grad_ln_gamma", attention.output.LayerNorm.weight.grad.numpy()),
              ("grad_ln_beta", attention.output.LayerNorm.bias.grad.numpy())]  # fmt: skip
    for name, want in pairs:
        got = np.array(trace[name])
        assert got.shape == want.shape, name
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() / scale <= 1e-10, name
    steps = [s["name"] for s in trace["steps"]]
    assert steps.index("grad_layer_norm") > steps.index("layer_norm")


def _ids() -> list[int]:
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(DIRECTORY / "tokenizer.json")
    )
    return list(tokenizer(TEXT)["input_ids"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"grad_output": [[1.0, 2.0]]}, "grad_output"),
        ({"grad_output": "sum", "include": ["attention"]}, 'add "trace" to include'),
    ],
    ids=["wrong-shape", "without-the-trace"],
)
def test_a_bad_grad_output_names_itself(
    client: TestClient, extra: dict[str, Any], message: str
) -> None:
    r = client.post("/model", json={"model": "minilm", "text": TEXT, **extra})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "grad_output"
    assert message in r.json()["message"]
