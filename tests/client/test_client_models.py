"""The client's trained models: ``client.models()`` and ``client.model(text, …)`` give the
service's own /models and /model answers (the ASGI app's JSON, read here with json), as NumPy
arrays, in safetensors and JSON request modes and from the async client."""

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from attention_client import AsyncClient, Client
from fastapi.testclient import TestClient

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
