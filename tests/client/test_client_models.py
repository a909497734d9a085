"""The client's trained models: ``client.models()`` and ``client.model(text, …)`` give the
service's own /models and /model answers (the ASGI app's JSON, read here with json), as NumPy
arrays, in safetensors and JSON request modes and from the async client."""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from attention_client import AsyncClient, Client, ModelNotInstalled, ServiceError
from fastapi.testclient import TestClient

from service.config import Settings
from service.http.app import create_app

TEXT = "The cat sat on the mat. The cat slept."


@pytest.fixture(scope="module")
def local() -> Iterator[Client]:
    with Client.local() as c:
        yield c


def test_models_is_get_models(local: Client, client: TestClient) -> None:
    assert local.models() == client.get("/models").json()


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_model_returns_the_answer_as_arrays(client: TestClient, binary: bool) -> None:
    want = client.post("/model", json={"model": "minilm", "text": TEXT, "layer": 1}).json()
    with Client.local(binary=binary) as c:
        got = c.model(TEXT, layer=1)
    assert got["tokens"] == want["tokens"]
    n = len(want["tokens"])
    assert isinstance(got.attention, np.ndarray) and got.attention.shape == (6, 12, n, n)
    np.testing.assert_array_equal(got.attention, np.array(want["attention"]))
    np.testing.assert_array_equal(got.rollout, np.array(want["rollout"]))
    np.testing.assert_array_equal(got["trace.output"], np.array(want["trace"]["output"]))
    np.testing.assert_array_equal(
        got["trace.heads.3.weights"], np.array(want["trace"]["heads"][3]["weights"])
    )
    assert got["head_roles"] == want["head_roles"]


def test_the_async_client_runs_a_model() -> None:
    async def run() -> tuple[list[str], tuple[int, ...]]:
        async with AsyncClient.local() as c:
            r = await c.model("Hello there.", include=["tokens", "rollout"])
            return r["tokens"], r.rollout.shape

    tokens, shape = asyncio.run(run())
    assert tokens == ["[CLS]", "hello", "there", ".", "[SEP]"] and shape == (5, 5)


def test_a_model_not_installed_is_its_own_error_with_the_install_command(
    tmp_path: Path,
) -> None:
    """A service whose models folder lacks the model: 501, raised as ModelNotInstalled."""
    app = create_app(Settings(log_level="warning", models_dir=tmp_path))
    with Client.local(app=app) as c, pytest.raises(ModelNotInstalled) as raised:
        c.model(TEXT)
    error = raised.value
    assert isinstance(error, ServiceError) and error.status == 501
    assert error.install_command == "make models" and error.field == "model"
    assert "make models" in error.message


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_model_takes_a_gradient_for_the_layers_backward(client: TestClient, binary: bool) -> None:
    """grad_output= reaches POST /model as the app's own JSON request gives it (a NumPy seed
    in, the trace's gradients out as arrays)."""
    n = len(client.post("/model", json={"model": "minilm", "text": TEXT,
                                        "include": ["tokens"]}).json()["tokens"])  # fmt: skip
    seed = np.random.default_rng(3).normal(size=(n, 384))
    want = client.post(
        "/model",
        json={"model": "minilm", "text": TEXT, "include": ["trace"], "grad_output": seed.tolist()},
    ).json()["trace"]
    with Client.local(binary=binary) as c:
        got = c.model(TEXT, include=["trace"], grad_output=seed)
    np.testing.assert_array_equal(got["trace.grad_x"], np.array(want["grad_x"]))
    np.testing.assert_array_equal(
        got["trace.heads.2.grad_weights"], np.array(want["heads"][2]["grad_weights"])
    )
