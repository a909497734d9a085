"""The state-dict names a verified family's attention module has, as its config decides them
(service.wire.hf_parameters), against transformers 5.23 itself; and /multihead's 422s for a
state dict that is not the module's (issue 41: never silently wrong about a layer).

The reference: each family's attention class (the one non-vision, non-audio ``*Attention``
class of its ``modeling_<family>.py``) built on the meta device from its stock configuration
(``AutoConfig.for_model(t)``) with every value of each flag its config has (true, false and
the key left out, which takes the configuration class's default; DeepSeek's ``q_lora_rank``
null or set; Gemma 4's ``attention_k_eq_v`` on a sliding and a full layer), its
``state_dict().keys()`` compared with the names ``from_config`` gives that config and layer.
The API tests send test_config_layers' CASES (a layer whose whole state dict is answered 200
to 1e-12 there) with one name dropped or one name too many.
"""

import importlib
import inspect
import itertools
import logging
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

import service.main
from service.wire.hf_config import from_config
from service.wire.hf_config_keys import VERIFIED
from service.wire.hf_parameters import ROWS

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

from transformers.models.auto.configuration_auto import model_type_to_module_name  # noqa: E402

from tests.wire.test_config_layers import CASES, SIZES, Build, L, _fill, _state  # noqa: E402

# verified model types without a row (not checked: hf_parameters' docstring); a family added
# to VERIFIED must get a row, or be listed here until it has one
WITHOUT_ROW: set[str] = set()

ABSENT = object()  # the key left out of the config
# the config keys that decide an attention module's parameters in some family, with the
# values tried (each also left out where the stock config has it)
FLAGS: dict[str, list[Any]] = {
    **{
        key: [True, False]
        for key in [
            "attention_bias",
            "qkv_bias",
            "use_bias",
            "attention_out_bias",
            "use_qkv_bias",
            "enable_bias",
            "use_qk_norm",
            "attention_k_eq_v",
            "qk_layernorm",  # Phi's q/k LayerNorms, StableLM's per head
            "bias",  # Falcon's
            "multi_query",  # Falcon's and GPTBigCode's layouts (no name changes)
            "new_decoder_architecture",  # Falcon's
        ]
    },
    "q_lora_rank": [None, 12],
}
# layers tried: a full-attention one (layer 3 of Qwen3-Next and Qwen3.5), both kinds of Gemma 4
LAYERS: dict[str, list[int]] = {"gemma4_text": [4, 5], "t5": [0, 1], "bloom": [1]}
# the families with several attention classes: the one a layer's request gives (BERT's whole
# BertAttention; T5's self-attention)
CLASSES = {"bert": "BertAttention", "roberta": "RobertaAttention", "t5": "T5Attention"}
# attention classes whose second argument is not the layer index
BUILD: dict[str, Any] = {
    **{t: lambda cls, c, layer: cls(c, layer_idx=layer) for t in ("gpt2", "gpt_bigcode")},
    **{t: lambda cls, c, layer: cls(c, layer_idx=layer) for t in ("bert", "roberta")},
    # T5Stack: layer 0 holds the relative bias table (has_relative_attention_bias)
    "t5": lambda cls, c, layer: cls(c, has_relative_attention_bias=layer == 0, layer_idx=layer),
}
# names a request carries that the layer's module does not hold: T5's table on a later layer
# (layer 0's, which T5Stack passes on to every layer)
CARRIED: dict[str, Any] = {
    "t5": lambda layer: {"relative_attention_bias.weight"} if layer else set()
}
# stock defaults no released config has and the attention class cannot be built from (its
# released configs' values): GLM-4-MoE's odd rotary count (refused on its own), Nemotron's null
# kv heads, Ministral's and HunYuan's null head_dim, DBRX's attn_config without rope_theta;
# StableLM with fewer key/value heads than heads, so that its per-head key norms count h_kv
AS_RELEASED: dict[str, dict[str, Any]] = {
    "glm4_moe": {"head_dim": 128},
    "nemotron": {"num_key_value_heads": 8},
    "ministral": {"head_dim": 128},
    "hunyuan_v1_dense": {"head_dim": 128},
    "stablelm": {"num_key_value_heads": 8},  # stablelm-2-12b's (the stock's equals the heads)
    "dbrx": {
        "attn_config": {"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000.0},
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    },
}


def _attention_class(model_type: str) -> Any:
    """The family's decoder attention class: the one ``*Attention`` of its modeling file that
    is neither a vision nor an audio tower's."""
    name = model_type_to_module_name(model_type)
    modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    if model_type in CLASSES:
        return getattr(modeling, CLASSES[model_type])
    found = [
        c
        for n, c in vars(modeling).items()
        if inspect.isclass(c)
        and c.__module__ == modeling.__name__
        and n.endswith("Attention")
        and not any(tower in n for tower in ("Vision", "Audio"))
    ]
    assert len(found) == 1, found
    return found[0]


def _variants(model_type: str) -> list[tuple[Any, dict[str, Any]]]:
    """The stock configuration with every combination of its flags' values: the config object
    the module is built from, and its to_dict() as sent (a flag left out: the key deleted, the
    object keeping its class's default)."""
    config_class = type(transformers.AutoConfig.for_model(model_type))
    stock = config_class().to_dict()
    keys = [k for k in FLAGS if k in stock]
    out = []
    for values in itertools.product(*[[*FLAGS[k], ABSENT] for k in keys]):
        given = {k: v for k, v in zip(keys, values, strict=True) if v is not ABSENT}
        hf_config = config_class(**given, **AS_RELEASED.get(model_type, {}))
        sent = {k: v for k, v in hf_config.to_dict().items() if k in given or k not in keys}
        out.append((hf_config, sent))
    return out


def test_each_verified_family_has_a_row_or_is_listed_without_one() -> None:
    """The merge of a new family shows here: add its row to hf_parameters.ROWS."""
    assert set(ROWS) <= set(VERIFIED)
    assert set(VERIFIED) - set(ROWS) == WITHOUT_ROW


@pytest.mark.torch
@pytest.mark.parametrize("model_type", sorted(ROWS))
def test_the_names_are_the_transformers_modules_state_dict(model_type: str) -> None:
    attention = _attention_class(model_type)
    assert attention.__name__ == ROWS[model_type].cls
    for (hf_config, config), layer in itertools.product(
        _variants(model_type), LAYERS.get(model_type, [3])
    ):
        with torch.device("meta"):
            module = BUILD.get(model_type, lambda cls, c, i: cls(c, i))(attention, hf_config, layer)
        names = from_config(config, layer).parameters
        assert names is not None
        flags = {k: config.get(k, "absent") for k in FLAGS}
        held = set(module.state_dict()) | CARRIED.get(model_type, lambda _: set())(layer)
        assert sorted(n for n, _ in names.has) == sorted(held), (layer, flags)
        assert not set(names.lacks) & held


@pytest.mark.torch
@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_the_encoders_self_attention_alone_is_its_inner_module(model_type: str) -> None:
    """BertSelfAttention's state dict alone (query, key, value without ``self.``): the row's
    ``alone`` module, the one a request without the output block is checked against."""
    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    config_class = type(transformers.AutoConfig.for_model(model_type))
    hf_config = config_class()
    inner = getattr(modeling, f"{ROWS[model_type].cls[: -len('Attention')]}SelfAttention")
    with torch.device("meta"):
        module = inner(hf_config, layer_idx=0)
    names = from_config(hf_config.to_dict(), 0).parameters
    assert names is not None and names.alone is not None
    assert names.alone.cls == inner.__name__
    assert sorted(names.alone.own()) == sorted(module.state_dict())


# ---- /multihead: the state dict must be the module's ------------------------------------------


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(service.main.app)


def _body(build: Build, layer: int, positions: list[int] | None) -> tuple[dict[str, Any], Any]:
    cfg, hf = build(layer)
    hf.attn = hf.attn.double().eval()
    _fill(hf, 7)
    x = np.random.default_rng(layer).normal(size=(L, SIZES["hidden_size"]))
    body = {"x": x.tolist(), **_state(hf), "config": cfg, "layer": layer, "include": ["output"]}
    if positions is not None:
        body["positions"] = body["context_positions"] = positions
    return body, hf


CASE_ARGS = [c[1:4] for c in CASES]
CASE_IDS = [c[0] for c in CASES]


@pytest.mark.torch
@pytest.mark.parametrize(("build", "layer", "positions"), CASE_ARGS, ids=CASE_IDS)
def test_a_state_dict_without_one_of_the_modules_names_is_a_422_naming_it(
    client: TestClient, build: Build, layer: int, positions: list[int] | None
) -> None:
    """Each name dropped in turn: never computed without it (a bias, o_proj, a q/k norm's
    weight, sinks, MLA's latent norms)."""
    body, hf = _body(build, layer, positions)
    for name in hf.attn.state_dict():
        response = client.post("/multihead", json={k: v for k, v in body.items() if k != name})
        assert response.status_code == 422, (name, response.text[:300])
        error = response.json()["errors"][0]
        if error["message"] == f"{error['field']} goes with {name}":  # the schema's own pairing
            continue  # (a fused bias without its weight: refused before the config is read)
        assert error["field"] == name, error
        assert f"has {name}, which the request lacks" in error["message"]
        assert "state_dict() as it is" in error["message"]


# a name some module has, with the size it would have in these tiny layers
_FOREIGN = ("q_proj.bias", "o_proj.bias", "q_norm.weight", "sinks", "k_proj.bias")
# other families' names of the same fields: a body with both gives one field twice, refused by
# the schema as that (not the foreign name the module lacks)
_ALIASES = {
    "q_proj.bias": {"self.query.bias", "query.bias"},
    "k_proj.bias": {"self.key.bias", "key.bias"},
    "o_proj.bias": {"dense.bias", "output.dense.bias"},  # Phi's, GPT-NeoX's, BERT's
    "q_norm.weight": {"q_layernorm.weight"},  # Phi's
}


@pytest.mark.torch
@pytest.mark.parametrize(("build", "layer", "positions"), CASE_ARGS, ids=CASE_IDS)
def test_a_state_dict_with_a_name_the_module_lacks_is_a_422_naming_it(
    client: TestClient, build: Build, layer: int, positions: list[int] | None
) -> None:
    """A bias (or norm weight, or sinks) the module does not have: the config and the weights
    are of two models."""
    body, hf = _body(build, layer, positions)
    own = set(hf.attn.state_dict())
    extra = next(n for n in _FOREIGN if n not in own and not _ALIASES.get(n, set()) & own)
    body[extra] = [0.5] * 4
    response = client.post("/multihead", json=body)
    assert response.status_code == 422, response.text[:300]
    error = response.json()["errors"][0]
    assert error["field"] == extra, error
    assert f"has no {extra}, yet the request gives it" in error["message"]


@pytest.mark.torch
def test_the_missing_bias_names_the_config_key_that_gives_it(client: TestClient) -> None:
    """GLM-4 (attention_bias true): q_proj.bias dropped; the message names the key."""
    build = next(c[1] for c in CASES if c[0].startswith("glm4-"))
    body, _ = _body(build, 0, None)
    del body["q_proj.bias"]
    error = client.post("/multihead", json=body).json()["errors"][0]
    assert error["field"] == "q_proj.bias"
    assert error["message"] == (
        "config says attention_bias True: Glm4Attention has q_proj.bias, which the request "
        "lacks; send the module's state_dict() as it is (without it the layer would be another "
        "one)"
    )


def test_weights_not_in_the_modules_form_are_not_checked(client: TestClient) -> None:
    """w_q, w_k, w_v with a config: the request's own form, not a state dict (no check)."""
    rng = np.random.default_rng(0)
    config = {"model_type": "llama", "num_attention_heads": 2, "num_key_value_heads": 2,
              "hidden_size": 8, "num_hidden_layers": 1, "attention_bias": True}  # fmt: skip
    body = {"x": rng.normal(size=(3, 8)).tolist(), "config": config, "include": ["output"],
            **{w: rng.normal(size=(8, 8)).tolist() for w in ("w_q", "w_k", "w_v")}}  # fmt: skip
    assert client.post("/multihead", json=body).status_code == 200


@pytest.mark.torch
def test_qwen3_next_q_proj_without_its_gate_rows_is_a_422_naming_it(client: TestClient) -> None:
    """The query rows alone (each head's gate rows cut out): not read as narrower heads."""
    build = next(c[1] for c in CASES if c[0] == "qwen3_next-full")
    body, _ = _body(build, 3, None)
    w = np.asarray(body["q_proj.weight"])  # (h · 2 · d, d_model): h = 4, d = 16
    body["q_proj.weight"] = w.reshape(4, 2, 16, -1)[:, 0].reshape(64, -1).tolist()
    error = client.post("/multihead", json=body).json()["errors"][0]
    assert error["field"] == "q_proj.weight"
    assert "2·num_heads·d_k = 128 rows, but it has 64" in error["message"]


@pytest.mark.torch
def test_gpt_oss_without_its_sinks_is_a_422_naming_them(client: TestClient) -> None:
    """gpt-oss's module has ``sinks`` whatever its config: left out, the layer is another."""
    from transformers.models.gpt_oss import modeling_gpt_oss

    config: Any = transformers.GptOssConfig(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        num_hidden_layers=2, intermediate_size=8, vocab_size=16, num_local_experts=2,
        pad_token_id=None, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    attn = modeling_gpt_oss.GptOssAttention(config, 0).double()
    torch.manual_seed(0)
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.3)
    state = {k: v.tolist() for k, v in attn.state_dict().items()}
    body = {"x": np.random.default_rng(0).normal(size=(3, 16)).tolist(), **state,
            "config": config.to_dict(), "layer": 0, "include": ["output"]}  # fmt: skip
    assert client.post("/multihead", json=body).status_code == 200
    del body["sinks"]
    error = client.post("/multihead", json=body).json()["errors"][0]
    assert error["field"] == "sinks"
    assert error["message"].startswith("model_type gpt_oss: GptOssAttention has sinks")


def _llama_body(**renamed: str) -> dict[str, Any]:
    """A tiny Llama layer's request, its state dict's names renamed as given."""
    rng = np.random.default_rng(0)
    config = {"model_type": "llama", "num_attention_heads": 2, "num_key_value_heads": 2,
              "hidden_size": 8, "num_hidden_layers": 1}  # fmt: skip
    state = {renamed.get(n, n): rng.normal(size=(8, 8)).tolist()
             for n in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")}  # fmt: skip
    return {"x": rng.normal(size=(3, 8)).tolist(), "config": config, "include": ["output"], **state}


def test_another_modules_name_for_the_same_weight_is_a_422_naming_the_modules(
    client: TestClient,
) -> None:
    """The names compared are the body's own: BERT's ``query.weight`` (read as the same field)
    in a Llama layer's state dict is not LlamaAttention's; its underscore form is the field's."""
    error = client.post("/multihead", json=_llama_body(**{"q_proj.weight": "query.weight"}))
    assert error.status_code == 422
    first = error.json()["errors"][0]
    assert first["field"] == "q_proj.weight", first
    assert "LlamaAttention has q_proj.weight, which the request lacks" in first["message"]
    underscore = _llama_body(**{"q_proj.weight": "q_proj_weight"})
    assert client.post("/multihead", json=underscore).status_code == 200


@pytest.mark.torch
def test_bert_self_names_without_the_output_block_are_a_422_naming_it(
    client: TestClient,
) -> None:
    """``self.query.weight`` … are BertAttention's names: without ``output.*`` the layer would
    be answered as BertSelfAttention, which names them ``query.weight`` …"""
    build = next(c[1] for c in CASES if c[0].startswith("bert-"))
    body, _ = _body(build, 1, None)
    cut = {k: v for k, v in body.items() if not k.startswith("output.")}
    first = client.post("/multihead", json=cut).json()["errors"][0]
    assert first["field"] == "output.dense.weight", first
    alone = {k.removeprefix("self."): v for k, v in cut.items()}
    assert client.post("/multihead", json=alone).status_code == 200
