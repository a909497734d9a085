"""The Python client (client/attention_client): the wire format against httpx.MockTransport,
then the real app in process (httpx.ASGITransport), then a real server (e2e)."""

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import safetensors.numpy
from attention_client import (
    AsyncClient,
    Client,
    InvalidRequest,
    Overloaded,
    Result,
    ServiceError,
    TooLarge,
    Unauthorized,
    masks,
)

from service.config import Settings
from service.http.app import create_app

ST = "application/x-safetensors"
Handler = Callable[[httpx.Request], httpx.Response]


# ------------------------------------------------------------------------------ wire helpers


def read_body(content: bytes) -> tuple[dict[str, npt.NDArray[Any]], Any]:
    """A safetensors body as (tensors, the JSON under __metadata__["json"])."""
    size = int.from_bytes(content[:8], "little")
    header = json.loads(content[8 : 8 + size])
    return dict(safetensors.numpy.load(content)), json.loads(header["__metadata__"]["json"])


def st_response(
    tensors: dict[str, npt.NDArray[Any]], rest: Any, status: int = 200
) -> httpx.Response:
    """A safetensors answer as the service writes it."""
    body = safetensors.numpy.save(tensors, metadata={"json": json.dumps(rest)})
    return httpx.Response(
        status, content=body, headers={"Content-Type": ST, "X-Request-ID": "rid-1"}
    )


def error_response(
    status: int, field: str | None, message: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    """An error answer in the service's one JSON shape."""
    body = {
        "message": message,
        "errors": [{"field": field, "message": message, "type": "value_error", "limit": None}],
    }
    return httpx.Response(status, json=body, headers={"X-Request-ID": "rid-err", **(headers or {})})


class Recorder:
    """A MockTransport handler that records requests and plays the given answers in turn."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        # a fresh copy each time: a client binds the response it reads to its own stream
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def mock_client(handler: Handler, **kw: Any) -> Client:
    return Client("http://test", transport=httpx.MockTransport(handler), **kw)


OK = st_response({"weights": np.eye(2)}, {"scale": 1.0})

# one /multihead answer, both ways: as the service's JSON and as its safetensors
NEG = -np.inf
MH_ARRAYS: dict[str, npt.NDArray[Any]] = {
    "heads.0.masked_scores": np.array([[0.5, NEG], [0.25, 0.125]]),
    "heads.0.weights": np.array([[1.0, 0.0], [0.53, 0.47]]),
    "heads.1.masked_scores": np.array([[1.5, NEG], [0.1, 0.2]]),
    "heads.1.weights": np.array([[1.0, 0.0], [0.475, 0.525]]),
    "weights": np.array([[[1.0, 0.0], [0.53, 0.47]], [[1.0, 0.0], [0.475, 0.525]]]),
    "mask": np.array([[True, False], [True, True]]),
    "additive_mask": np.array([[0.0, NEG], [0.0, 0.0]]),
    "output": np.array([[0.1, 0.2], [0.3, 0.1 + 0.2]]),
}
MH_REST: dict[str, Any] = {
    "heads": [{}, {}],
    "scale": 0.7071067811865475,
    "num_heads": 2,
    "tokens": ["a", "b"],
    "summary": [{"token": "a", "top_key_index": 0, "top_weight": 1.0}],
    "steps": [{"name": "scores", "formula": "Q Kᵀ", "shape": [2, 2, 2]}],
    "fully_masked_rows": [],
    "first_mismatch": None,
}
MH_JSON: dict[str, Any] = {
    "heads": [
        {"masked_scores": [[0.5, None], [0.25, 0.125]], "weights": [[1.0, 0.0], [0.53, 0.47]]},
        {"masked_scores": [[1.5, None], [0.1, 0.2]], "weights": [[1.0, 0.0], [0.475, 0.525]]},
    ],
    "weights": [[[1.0, 0.0], [0.53, 0.47]], [[1.0, 0.0], [0.475, 0.525]]],
    "mask": [[True, False], [True, True]],
    "additive_mask": [[0.0, None], [0.0, 0.0]],
    "output": [[0.1, 0.2], [0.3, 0.30000000000000004]],
    **{k: v for k, v in MH_REST.items() if k != "heads"},
}


# ------------------------------------------------------------------------- request bodies


def test_request_is_safetensors_with_tensor_names_dtypes_and_the_json_rest() -> None:
    rec = Recorder(OK)
    with mock_client(rec, api_key="s3cret") as client:
        client.attention(
            x=[[1, 0], [0, 2], [1, 1]],  # integers: sent as F64
            w_q=np.eye(2, dtype=np.float32),  # float32: sent as F64
            w_k=np.eye(2),
            w_v=np.eye(2),
            tokens=["I", "am", "Batman"],
            mask=[
                masks.causal(),
                masks.boolean(np.tril(np.ones((3, 3), dtype=int))),  # 1/0: sent as BOOL
                masks.additive([[0, None, None], [-1, 0, None], [0, 0, 0]]),
                masks.padding(key_lengths=[3]),
            ],
            rope=True,
            positions=[0, 1, 2],
            include=["weights", "masked_scores"],
            decimals=4,
            expected={"weights": [[1, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]]},
        )
    (request,) = rec.requests
    assert request.headers["content-type"] == ST
    assert request.headers["accept"] == ST
    assert request.headers["authorization"] == "Bearer s3cret"
    assert request.url.path == "/attention"
    tensors, rest = read_body(request.content)
    dtypes = {name: str(t.dtype) for name, t in tensors.items()}
    assert dtypes == {
        "x": "float64",
        "w_q": "float64",
        "w_k": "float64",
        "w_v": "float64",
        "mask.1.matrix": "bool",
        "mask.2.matrix": "float64",
        "mask.3.key_lengths": "int64",
        "positions": "int64",
        "expected.weights": "float64",
    }
    assert np.array_equal(tensors["x"], [[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    assert np.array_equal(tensors["mask.1.matrix"], np.tril(np.ones((3, 3), dtype=bool)))
    additive = np.array([[0, NEG, NEG], [-1, 0, NEG], [0, 0, 0]])
    assert np.array_equal(tensors["mask.2.matrix"], additive)  # None there is −∞
    assert rest == {
        "tokens": ["I", "am", "Batman"],
        "mask": [
            {"type": "causal", "alignment": "upper_left"},
            {"type": "boolean", "true_means": "attend"},
            {"type": "additive"},
            {"type": "padding"},
        ],
        "rope": True,
        "include": ["weights", "masked_scores"],
        "decimals": 4,
        "expected": {},
    }


def test_nested_and_state_dict_names_become_dotted_tensor_names() -> None:
    rec = Recorder(OK)
    w = np.arange(8.0).reshape(4, 2)
    extra: dict[str, Any] = {"custom_field": 1}
    with mock_client(rec) as client:
        client.multihead(
            x=np.ones((3, 4)),
            num_heads=2,
            heads=[{"w_q": w, "w_k": w, "w_v": w}, {"w_q": w, "w_k": w, "w_v": w, "b_q": [1, 2]}],
            layer_norm={"gamma": [1, 1], "eps": 1e-5},
            qk_norm={"type": "rms", "q_weight": np.ones(2)},
            mask=np.triu(np.ones((3, 3), dtype=bool)),  # a bare boolean matrix
            expected={"heads": [None, {"weights": np.eye(3)}], "average_weights": np.eye(3)},
            state_dict={"out_proj.weight": np.eye(4), "sinks": np.zeros(2)},
            **extra,
        )
    tensors, rest = read_body(rec.requests[0].content)
    assert sorted(tensors) == [
        "expected.average_weights",
        "expected.heads.1.weights",
        "heads.0.w_k",
        "heads.0.w_q",
        "heads.0.w_v",
        "heads.1.b_q",
        "heads.1.w_k",
        "heads.1.w_q",
        "heads.1.w_v",
        "layer_norm.gamma",
        "mask.0.matrix",
        "out_proj.weight",
        "qk_norm.q_weight",
        "sinks",
        "x",
    ]
    assert tensors["heads.1.b_q"].dtype == np.float64
    assert tensors["mask.0.matrix"].dtype == np.bool_
    assert rest == {
        "num_heads": 2,
        "heads": [{}, {}],
        "layer_norm": {"eps": 1e-5},
        "qk_norm": {"type": "rms"},
        "mask": [{"type": "boolean"}],
        "expected": {"heads": [None, {}]},
        "custom_field": 1,
    }


def test_bare_mask_matrices_become_boolean_or_additive_masks() -> None:
    rec = Recorder(OK)
    additive = np.array([[0.0, -np.inf], [-1.0, 0.0]])
    with mock_client(rec) as client:
        client.mask(q=np.eye(2), k=np.eye(2), v=np.eye(2), mask=[[True, False], [True, True]])
        client.mask(q=np.eye(2), k=np.eye(2), v=np.eye(2), mask=[masks.causal(), additive])
    (first, first_rest), (second, second_rest) = (read_body(r.content) for r in rec.requests)
    assert first_rest["mask"] == [{"type": "boolean"}]
    assert np.array_equal(first["mask.0.matrix"], [[True, False], [True, True]])
    assert second_rest["mask"] == [
        {"type": "causal", "alignment": "upper_left"},
        {"type": "additive"},
    ]
    assert np.array_equal(second["mask.1.matrix"], additive)


def test_a_field_given_twice_is_refused_before_sending() -> None:
    rec = Recorder(OK)
    with mock_client(rec) as client, pytest.raises(TypeError, match="in_proj_weight"):
        client.multihead(
            num_heads=1, in_proj_weight=np.eye(3), state_dict={"in_proj_weight": np.eye(3)}
        )
    assert rec.requests == []


class FakeModule:
    """Anything with a ``state_dict()`` method, as a torch module has."""

    def state_dict(self) -> dict[str, Any]:
        return {"in_proj_weight": np.eye(3)}


@pytest.mark.parametrize("given", [FakeModule(), 3], ids=["module", "number"])
def test_state_dict_that_is_not_a_mapping_is_refused_naming_the_fix(given: Any) -> None:
    rec = Recorder(OK)
    with mock_client(rec) as client, pytest.raises(TypeError) as err:
        client.multihead(x=np.eye(3), num_heads=1, state_dict=given)
    assert "module.state_dict()" in str(err.value)
    assert "not iterable" not in str(err.value)
    assert rec.requests == []


@pytest.mark.torch
def test_a_torch_module_given_as_state_dict_says_pass_its_state_dict() -> None:
    torch = pytest.importorskip("torch")
    mha = torch.nn.MultiheadAttention(4, 2, batch_first=True)
    with mock_client(Recorder(OK)) as client, pytest.raises(TypeError) as err:
        client.multihead(x=np.eye(4), num_heads=2, state_dict=mha)
    assert "pass state_dict=module.state_dict()" in str(err.value)
    assert "MultiheadAttention" in str(err.value)


@pytest.mark.torch
def test_torch_tensors_are_sent_as_float64_keeping_bool_and_int() -> None:
    torch = pytest.importorskip("torch")
    rec = Recorder(OK)
    with mock_client(rec) as client:
        client.attention(
            q=torch.tensor([[0.1, 0.2]], dtype=torch.float32, requires_grad=True),
            k=torch.tensor([[0.3, 0.4]], dtype=torch.bfloat16),
            v=torch.ones(1, 2, dtype=torch.float64),
            key_padding_mask=torch.tensor([False]),
            positions=torch.tensor([5]),
            rope=True,
        )
    tensors, _ = read_body(rec.requests[0].content)
    assert {n: str(t.dtype) for n, t in tensors.items()} == {
        "q": "float64",
        "k": "float64",
        "v": "float64",
        "key_padding_mask": "bool",
        "positions": "int64",
    }
    assert tensors["q"][0, 0] == np.float64(np.float32(0.1))  # float32 widened exactly


def test_json_mode_sends_json_with_null_for_minus_infinity() -> None:
    rec = Recorder(httpx.Response(200, json={"weights": [[1.0]]}))
    with mock_client(rec, binary=False) as client:
        client.mask(
            q=np.array([[0.1, 1 / 3]]),
            k=[[1, 2]],
            v=[[1, 2]],
            mask=masks.additive(np.array([[-np.inf]])),
        )
    request = rec.requests[0]
    assert request.headers["content-type"] == "application/json"
    assert request.headers["accept"] == "application/json"
    body = json.loads(request.content)
    assert body == {
        "q": [[0.1, 1 / 3]],
        "k": [[1.0, 2.0]],
        "v": [[1.0, 2.0]],
        "mask": [{"type": "additive", "matrix": [[None]]}],
    }


# ----------------------------------------------------------------------- response decoding


@pytest.mark.parametrize("binary", [True, False])
def test_response_rebuilds_heads_and_gives_the_same_result_both_ways(binary: bool) -> None:
    answer = (
        st_response(MH_ARRAYS, MH_REST)
        if binary
        else httpx.Response(200, json=MH_JSON, headers={"X-Request-ID": "rid-1"})
    )
    with mock_client(Recorder(answer), binary=binary) as client:
        result = client.multihead(x=np.eye(2), num_heads=2, seed=0)
    assert result.request_id == "rid-1"
    assert sorted(result.arrays) == sorted(MH_ARRAYS)
    for name, array in MH_ARRAYS.items():
        assert result.arrays[name].dtype == array.dtype, name
        assert np.array_equal(result.arrays[name], array), name
    assert result.json == MH_REST
    assert len(result.heads) == 2
    assert np.array_equal(result.heads[1].weights, MH_ARRAYS["heads.1.weights"])
    assert np.isneginf(result.heads[0].masked_scores[0, 1])
    assert np.array_equal(result.weights[1], result.heads[1].weights)
    assert result.mask.dtype == np.bool_
    assert np.array_equal(result["additive_mask"], MH_ARRAYS["additive_mask"])
    assert result["heads.0.weights"] is result.arrays["heads.0.weights"]
    assert result.scale == MH_REST["scale"] and result.num_heads == 2
    assert result.tokens == ["a", "b"] and result.fully_masked_rows == []
    assert result.summary == MH_REST["summary"] and result.steps == MH_REST["steps"]
    assert result.first_mismatch is None and result.comparison is None
    full = result.to_dict()
    assert np.array_equal(full["heads"][1]["masked_scores"], MH_ARRAYS["heads.1.masked_scores"])
    assert np.array_equal(full["weights"], MH_ARRAYS["weights"])
    assert full["summary"] == MH_REST["summary"]


def test_unknown_output_is_an_attribute_error_naming_the_outputs() -> None:
    with mock_client(Recorder(st_response(MH_ARRAYS, MH_REST))) as client:
        result = client.multihead(x=np.eye(2), num_heads=2)
    with pytest.raises(AttributeError, match="scores") as err:
        _ = result.scores
    assert "weights" in str(err.value) and "heads" in str(err.value)
    with pytest.raises(AttributeError, match="'q'"):
        _ = result.heads[0].q
    with pytest.raises(KeyError):
        result["nope"]


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("status", "kind"),
    [(422, InvalidRequest), (413, TooLarge), (401, Unauthorized), (400, ServiceError)],
)
def test_error_answers_raise_with_field_and_message(status: int, kind: type[ServiceError]) -> None:
    rec = Recorder(error_response(status, "mask[0].matrix", "mask[0].matrix must be 3×3"))
    sleeps: list[float] = []
    with mock_client(rec, sleep=sleeps.append) as client, pytest.raises(kind) as err:
        client.mask(q=[[1.0]], k=[[1.0]], v=[[1.0]], mask=masks.causal())
    assert type(err.value) is kind
    assert err.value.status == status
    assert err.value.field == "mask[0].matrix"
    assert err.value.message == "mask[0].matrix must be 3×3"
    assert err.value.errors[0].type == "value_error"
    assert err.value.request_id == "rid-err"
    assert len(rec.requests) == 1 and sleeps == []  # a 4xx is never retried


def test_too_large_names_its_limit() -> None:
    body = {
        "message": "too many numbers",
        "errors": [
            {"field": "include", "message": "too many", "type": "limit_exceeded", "limit": 100}
        ],
    }
    client = mock_client(Recorder(httpx.Response(413, json=body)))
    with client, pytest.raises(TooLarge) as err:
        client.attention(seq_len=512, d_model=8, d_k=8, seed=0)
    assert err.value.limit == 100 and err.value.field == "include"


def test_an_error_that_is_not_json_is_still_a_service_error() -> None:
    client = mock_client(Recorder(httpx.Response(502, text="Bad Gateway")))
    with client, pytest.raises(ServiceError, match="502: Bad Gateway") as err:
        client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])
    assert err.value.errors == [] and err.value.field is None


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(307, headers={"Location": "/attention/"}),
        httpx.Response(
            200,
            text="<!DOCTYPE html><title>explorer</title>",
            headers={"Content-Type": "text/html"},
        ),
    ],
    ids=["redirect", "html-page"],
)
def test_an_answer_that_is_not_the_services_says_to_check_base_url(answer: httpx.Response) -> None:
    """Not a bare JSONDecodeError: a redirect or a page is named as such, with the fix."""
    client = mock_client(Recorder(answer))
    with client, pytest.raises(ServiceError, match="is base_url the service's address") as err:
        client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])
    assert err.value.status == answer.status_code


@pytest.fixture
def trickling_server() -> Iterator[str]:
    """A server that answers 200 with a JSON head, then sends its body a byte every 0.2 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1 << 16)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            )
            while not stop.wait(0.2):
                try:
                    conn.sendall(b" ")
                except OSError:
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()
    thread.join(timeout=5)


def test_timeout_bounds_the_whole_answer_not_each_read(trickling_server: str) -> None:
    """A byte every 0.2 s passes every per-read timeout; timeout=1 still ends the try at 1 s."""
    start = time.monotonic()
    client = Client(trickling_server, timeout=1.0, max_retries=0, binary=False)
    with client, pytest.raises(httpx.ReadTimeout, match="longer than 1 s in all"):
        client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])
    assert time.monotonic() - start < 2.0


def test_async_timeout_bounds_the_whole_answer(trickling_server: str) -> None:
    async def call() -> None:
        async with AsyncClient(trickling_server, timeout=1.0, max_retries=0) as client:
            await client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])

    start = time.monotonic()
    with pytest.raises(httpx.ReadTimeout, match="longer than 1 s in all"):
        asyncio.run(call())
    assert time.monotonic() - start < 2.0


# --------------------------------------------------------------------------------- retries


def no_jitter() -> float:
    """A jitter draw of 0: the wait is exactly the floor."""
    return 0.0


def overloaded(retry_after: str | None) -> httpx.Response:
    return error_response(
        503, None, "busy", {"Retry-After": retry_after} if retry_after is not None else {}
    )


def test_503_is_retried_after_retry_after_then_succeeds() -> None:
    rec = Recorder(overloaded("2"), overloaded("100"), overloaded(None), OK)
    sleeps: list[float] = []
    with mock_client(rec, sleep=sleeps.append, jitter=no_jitter) as client:
        result = client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])
    assert np.array_equal(result.weights, np.eye(2))
    assert len(rec.requests) == 4
    assert sleeps == [2.0, 30.0, 2.0]  # as asked, capped at 30 s, else backoff 0.5·2^attempt
    assert all(r.content == rec.requests[0].content for r in rec.requests)


def test_503_gives_up_after_max_retries_with_overloaded() -> None:
    rec = Recorder(overloaded("1"))
    sleeps: list[float] = []
    client = mock_client(rec, sleep=sleeps.append, max_retries=2, jitter=no_jitter)
    with client, pytest.raises(Overloaded) as err:
        client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])
    assert err.value.retry_after == 1.0 and err.value.status == 503
    assert len(rec.requests) == 3 and sleeps == [1.0, 1.0]


@pytest.mark.parametrize(
    "refused",
    [
        httpx.ConnectError("connection refused"),
        # a kept-alive connection the server closed as the request went out (its idle timeout)
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
    ],
    ids=["refused", "closed-without-an-answer"],
)
def test_connection_errors_before_an_answer_are_retried(refused: httpx.TransportError) -> None:
    rec = Recorder(refused, refused, OK)
    sleeps: list[float] = []
    with mock_client(rec, sleep=sleeps.append, jitter=no_jitter) as client:
        client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])
    assert len(rec.requests) == 3 and sleeps == [0.5, 1.0]
    client = mock_client(Recorder(refused), sleep=sleeps.append, max_retries=1)
    with client, pytest.raises(type(refused)):
        client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])


def test_waits_are_spread_above_retry_after_by_jitter() -> None:
    """Clients refused together come back at different moments, never before Retry-After."""
    waits: list[list[float]] = []
    for seed in range(8):  # eight clients, each with its own seeded draw
        rec = Recorder(overloaded("2"), overloaded("2"), OK)
        sleeps: list[float] = []
        draw = random.Random(seed).random
        with mock_client(rec, sleep=sleeps.append, jitter=draw) as client:
            client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])
        waits.append(sleeps)
    firsts = [w[0] for w in waits]
    assert all(2.0 <= s < 3.0 for w in waits for s in w)  # the floor, plus up to half again
    assert len(set(firsts)) == len(firsts)  # no two clients retry together
    assert max(firsts) - min(firsts) > 0.2
    assert waits[0][0] == 2.0 * (1 + 0.5 * random.Random(0).random())  # the injected draw


def test_a_retry_after_of_zero_still_waits_a_little_with_jitter() -> None:
    rec = Recorder(overloaded("0"), OK)
    sleeps: list[float] = []
    with mock_client(rec, sleep=sleeps.append, jitter=lambda: 0.5) as client:
        client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])
    assert sleeps == [0.1 * 1.25]  # the floor of 0.1 s, plus a quarter (half of JITTER)


def test_a_read_timeout_is_not_retried() -> None:
    rec = Recorder(httpx.ReadTimeout("slow"))  # the request may have been computed
    with mock_client(rec, sleep=lambda s: None) as client, pytest.raises(httpx.ReadTimeout):
        client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])
    assert len(rec.requests) == 1


def test_async_client_retries_with_its_own_sleep() -> None:
    rec = Recorder(overloaded("3"), OK)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async def scenario() -> Result:
        transport = httpx.MockTransport(rec)
        async with AsyncClient(
            "http://test", transport=transport, sleep=sleep, jitter=no_jitter
        ) as client:
            return await client.attention(q=[[1.0]], k=[[1.0]], v=[[1.0]])

    result = asyncio.run(scenario())
    assert sleeps == [3.0] and len(rec.requests) == 2
    assert np.array_equal(result.weights, np.eye(2))


# ---------------------------------------------------------------- the real app, in process


class Seen(httpx.AsyncBaseTransport):
    """Passes requests to the app and notes (request type, status, answer type) of each."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.seen: list[tuple[str | None, int, str | None]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        kinds = (request.headers.get("content-type"), response.headers.get("content-type"))
        self.seen.append((kinds[0], response.status_code, kinds[1]))
        return response


def run_in_app(
    scenario: Callable[[AsyncClient, httpx.AsyncClient], Awaitable[None]],
    binary: bool,
    settings: Settings | None = None,
) -> None:
    """Run ``scenario(client, raw)`` against the app in process (``raw`` posts plain JSON), and
    check that the client's requests and successful answers were in the format asked for."""
    app = create_app(settings or Settings())
    asgi = httpx.ASGITransport(app=app)
    seen = Seen(asgi)

    async def main() -> None:
        async with (
            AsyncClient("http://app", transport=seen, binary=binary) as client,
            httpx.AsyncClient(transport=asgi, base_url="http://app") as raw,
        ):
            await scenario(client, raw)

    asyncio.run(main())
    media = ST if binary else "application/json"
    assert seen.seen and all(request == media for request, _, _ in seen.seen)
    assert all(answer == media for _, status, answer in seen.seen if status == 200)


def assert_same_as_json(result: Result, raw: Any, path: str = "$") -> None:
    """``result`` equals the service's JSON answer bit for bit (null: −∞ in masked scores and
    additive masks), compared through ``to_dict()`` so that every array is at its place."""
    _same(result.to_dict(), raw, path)


def _same(ours: Any, raw: Any, path: str) -> None:
    if isinstance(ours, np.ndarray):
        name = path.rsplit(".", 1)[-1]
        expected = np.array(raw, dtype=object)
        kind = np.bool_ if all(isinstance(e, bool) for e in expected.flat) else np.float64
        fill = -np.inf if name in ("masked_scores", "additive_mask") else np.nan
        expected[expected == None] = fill  # noqa: E711 - elementwise
        assert ours.dtype == kind, path
        assert np.array_equal(ours, expected.astype(kind)), path
    elif isinstance(ours, dict):
        assert isinstance(raw, dict) and sorted(ours) == sorted(raw), path
        for key in ours:
            _same(ours[key], raw[key], f"{path}.{key}")
    elif isinstance(ours, list) and isinstance(raw, list) and len(ours) == len(raw):
        for i, (a, b) in enumerate(zip(ours, raw, strict=True)):
            _same(a, b, f"{path}[{i}]")
    else:
        assert ours == raw, path


RNG = np.random.default_rng(7)
X = RNG.normal(size=(4, 6))
W_Q, W_K, W_V = (RNG.normal(size=(3, 6)) for _ in range(3))  # PyTorch's (d_out, d_in)


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_in_process_attention_equals_the_json_answer(binary: bool) -> None:
    async def scenario(client: AsyncClient, raw: httpx.AsyncClient) -> None:
        result = await client.attention(
            x=X, w_q=W_Q, w_k=W_K, w_v=W_V, weight_layout="out_in", tokens=list("abcd")
        )
        reference = await raw.post(
            "/attention",
            json={
                "x": X.tolist(),
                "w_q": W_Q.tolist(),
                "w_k": W_K.tolist(),
                "w_v": W_V.tolist(),
                "weight_layout": "out_in",
                "tokens": list("abcd"),
            },
        )
        assert reference.status_code == 200
        assert_same_as_json(result, reference.json())
        assert result.output.shape == (4, 3) and result.weights.dtype == np.float64
        q = X @ W_Q.T
        np.testing.assert_allclose(result.q, q, rtol=0, atol=1e-12)
        assert [s["name"] for s in result.steps or []][-2:] == ["weights", "output"]
        assert result.summary is not None and result.summary[0]["token"] == "a"

    run_in_app(scenario, binary)


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_in_process_causal_mask_keeps_minus_infinity(binary: bool) -> None:
    async def scenario(client: AsyncClient, raw: httpx.AsyncClient) -> None:
        result = await client.mask(q=X, k=X, v=X, mask=masks.causal(), decimals=6)
        reference = await raw.post(
            "/mask",
            json={
                "q": X.tolist(),
                "k": X.tolist(),
                "v": X.tolist(),
                "mask": {"type": "causal"},
                "decimals": 6,
            },
        )
        assert_same_as_json(result, reference.json())
        assert np.array_equal(np.isneginf(result.masked_scores), ~np.tril(np.ones((4, 4), bool)))
        assert np.array_equal(result.mask, np.tril(np.ones((4, 4), dtype=bool)))
        assert result.fully_masked_rows == []
        assert result.conventions is not None
        assert result.conventions["causal_alignment"] == "upper_left"

    run_in_app(scenario, binary)


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_in_process_multihead_heads_and_stacked_weights(binary: bool) -> None:
    additive = np.zeros((4, 4))
    additive[0, 3] = -np.inf

    async def scenario(client: AsyncClient, raw: httpx.AsyncClient) -> None:
        fields: dict[str, Any] = {
            "x": X,
            "num_heads": 3,
            "seed": 1,
            "d_k": 2,
            "mask": [masks.causal(), masks.additive(additive)],
            "residual": False,
            "layer_norm": {"eps": 1e-5, "gamma": np.linspace(0.5, 1.5, 6)},
            "w_o": np.eye(6),
        }
        result = await client.multihead(**fields)
        json_mask = [
            {"type": "causal", "alignment": "upper_left"},
            {
                "type": "additive",
                "matrix": [[None if v == -np.inf else v for v in row] for row in additive.tolist()],
            },
        ]
        body = {**fields, "x": X.tolist(), "mask": json_mask, "w_o": np.eye(6).tolist()}
        body["layer_norm"] = {"eps": 1e-5, "gamma": np.linspace(0.5, 1.5, 6).tolist()}
        reference = await raw.post("/multihead", json=body)
        assert reference.status_code == 200, reference.text
        assert_same_as_json(result, reference.json())
        assert len(result.heads) == 3 and result.weights.shape == (3, 4, 4)
        for i, head in enumerate(result.heads):
            assert np.array_equal(result.weights[i], head.weights)
            assert np.isneginf(head.masked_scores[0, 1:]).all()
        assert np.array_equal(result.average_weights, result.weights.mean(axis=0))
        assert result.w_q.shape == (6, 6)  # generated: returned

    run_in_app(scenario, binary)


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_in_process_expected_per_head_is_compared(binary: bool) -> None:
    async def scenario(client: AsyncClient, raw: httpx.AsyncClient) -> None:
        first = await client.multihead(x=X, num_heads=2, seed=3)
        wrong = first.heads[1].weights.T.copy()
        result = await client.multihead(
            x=X,
            num_heads=2,
            seed=3,
            expected={"heads": [None, {"weights": wrong}], "output": first.output},
            include=["output"],
        )
        assert result.comparison is not None
        by_name = {c["name"]: c for c in result.comparison}
        assert by_name["heads.1.weights"]["match"] is False
        assert by_name["output"]["match"] is True
        assert result.first_mismatch == "heads.1.weights"
        assert sorted(result.arrays) == ["output"]

    run_in_app(scenario, binary)


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_in_process_a_bad_request_raises_with_its_field(binary: bool) -> None:
    async def scenario(client: AsyncClient, raw: httpx.AsyncClient) -> None:
        with pytest.raises(InvalidRequest) as err:
            await client.mask(q=X, k=X, v=X, mask=masks.boolean(np.ones((4, 3), dtype=bool)))
        assert err.value.status == 422
        assert err.value.field == "mask[0].matrix"
        assert "mask[0].matrix" in err.value.message
        assert err.value.request_id
        with pytest.raises(InvalidRequest) as err:
            misspelt: dict[str, Any] = {"wieghts": 1}
            await client.attention(q=X, k=X, v=X, **misspelt)
        assert err.value.field == "wieghts" and err.value.errors[0].type == "extra_forbidden"

    run_in_app(scenario, binary)


def test_in_process_api_key() -> None:
    app = create_app(Settings(api_keys=["k1"]))

    async def call(key: str | None) -> Result:
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://app", key, transport=transport) as client:
            return await client.attention(q=X, k=X, v=X)

    assert asyncio.run(call("k1")).weights.shape == (4, 4)
    for key in ("wrong", None):
        with pytest.raises(Unauthorized) as err:
            asyncio.run(call(key))
        assert err.value.status == 401 and err.value.errors[0].type == "unauthorized"


@pytest.mark.torch
@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_in_process_torch_multihead_attention_state_dict(binary: bool) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(6, 2, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    x = torch.from_numpy(X).unsqueeze(0)
    with torch.no_grad():
        out, avg = mha(x, x, x, need_weights=True, average_attn_weights=True)
        _, per_head = mha(x, x, x, need_weights=True, average_attn_weights=False)

    async def scenario(client: AsyncClient, raw: httpx.AsyncClient) -> None:
        result = await client.multihead(x=x, num_heads=2, state_dict=mha.state_dict())
        np.testing.assert_allclose(result.output, out.numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(result.average_weights, avg.numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(result.weights, per_head.numpy(), rtol=0, atol=1e-12)

    run_in_app(scenario, binary)


# ------------------------------------------------------------------------ a real server (e2e)


@pytest.mark.e2e
def test_live_sync_client(server: str) -> None:
    with Client(server) as client, Client(server, binary=False) as plain:
        assert client.health()["status"] == "ok"
        assert client.ready()
        assert "numpy" in client.version()
        result = client.mask(q=X, k=X, v=X, mask=[masks.causal(), masks.padding(key_lengths=3)])
        same = plain.mask(q=X, k=X, v=X, mask=[masks.causal(), masks.padding(key_lengths=3)])
        assert sorted(result.arrays) == sorted(same.arrays)
        for name, array in result.arrays.items():
            assert np.array_equal(array, same.arrays[name]), name
        assert result.json == same.json
        assert np.isneginf(result.masked_scores[:, 3]).all()
        assert result.request_id and result.request_id != same.request_id
        with pytest.raises(InvalidRequest) as err:
            client.multihead(x=X, num_heads=4, seed=0)  # 6 is not a multiple of 4
        assert err.value.field is not None


@pytest.mark.e2e
def test_live_async_client(server: str) -> None:
    async def scenario() -> list[Result]:
        async with AsyncClient(server) as client:
            assert await client.ready()
            return list(
                await asyncio.gather(
                    *(client.multihead(x=X, num_heads=2, seed=s) for s in range(4))
                )
            )

    results = asyncio.run(scenario())
    assert [len(r.heads) for r in results] == [2, 2, 2, 2]
    assert not np.array_equal(results[0].output, results[1].output)  # seeds differ
    with Client(server) as client:
        again = client.multihead(x=X, num_heads=2, seed=2)
    assert np.array_equal(again.output, results[2].output)
