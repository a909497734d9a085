"""The client's in-process mode (``Client.local()``, ``AsyncClient.local()``: the service's app
run with no server) and how results show themselves (``repr`` and Jupyter's ``_repr_html_``)."""

import asyncio
import html
import re
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from attention_client import (
    AsyncClient,
    Client,
    InvalidRequest,
    Result,
    TooLarge,
    Unauthorized,
    masks,
)
from attention_client.heatmaps import png, shrink
from attention_client.local import StartupFailed
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from service.config import Settings
from service.http.app import create_app
from tests.client.test_client import assert_same_as_json

ST = "application/x-safetensors"
TOKENS = ["The", "cat", "<pad>"]
X = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]])
RNG = np.random.default_rng(11)
Q, K, V = (RNG.normal(size=(5, 3)) for _ in range(3))

# (endpoint, the client's keyword arguments, the same request as JSON)
REQUESTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "/attention",
        {"x": X, "seed": 0, "d_k": 4, "tokens": TOKENS},
        {"x": X.tolist(), "seed": 0, "d_k": 4, "tokens": TOKENS},
    ),
    (
        "/mask",
        {"q": Q, "k": K, "v": V, "mask": [masks.causal(), masks.padding(key_lengths=4)]},
        {
            "q": Q.tolist(),
            "k": K.tolist(),
            "v": V.tolist(),
            "mask": [{"type": "causal"}, {"type": "padding", "key_lengths": 4}],
        },
    ),
    (
        "/multihead",
        {"x": X, "num_heads": 2, "seed": 3, "residual": True, "layer_norm": True},
        {"x": X.tolist(), "num_heads": 2, "seed": 3, "residual": True, "layer_norm": True},
    ),
]
IDS = [path.strip("/") for path, _, _ in REQUESTS]


def call(client: Client, path: str, fields: dict[str, Any]) -> Result:
    """The client's method for ``path``."""
    methods: dict[str, Callable[..., Result]] = {
        "/attention": client.attention,
        "/mask": client.mask,
        "/multihead": client.multihead,
    }
    return methods[path](**fields)


@pytest.fixture(scope="module")
def local() -> Iterator[Client]:
    with Client.local() as client:
        yield client


@pytest.fixture(scope="module")
def local_json() -> Iterator[Client]:
    with Client.local(binary=False) as client:
        yield client


# ------------------------------------------------------------------- same answers as over HTTP


@pytest.mark.parametrize(("path", "fields", "body"), REQUESTS, ids=IDS)
def test_local_results_equal_the_asgi_json_answer_bit_for_bit(
    local: Client,
    local_json: Client,
    client: TestClient,
    path: str,
    fields: dict[str, Any],
    body: dict[str, Any],
) -> None:
    reference = client.post(path, json=body)
    assert reference.status_code == 200, reference.text
    for mode in (local, local_json):  # safetensors and JSON
        result = call(mode, path, fields)
        assert_same_as_json(result, reference.json())
        assert result.request_id


@pytest.mark.parametrize(("path", "fields", "body"), REQUESTS, ids=IDS)
@pytest.mark.parametrize("accept", ["application/json", ST])
def test_local_answers_are_the_same_bytes(
    local: Client,
    client: TestClient,
    path: str,
    fields: dict[str, Any],
    body: dict[str, Any],
    accept: str,
) -> None:
    """The transport adds nothing and loses nothing: the very bytes the app answers."""
    ours = local._http.post(path, json=body, headers={"Accept": accept})
    theirs = client.post(path, json=body, headers={"Accept": accept})
    assert ours.status_code == theirs.status_code == 200
    assert ours.headers["content-type"] == theirs.headers["content-type"]
    assert ours.content == theirs.content


def test_generated_mode_reproduces_numpy_random_seed(local: Client) -> None:
    np.random.seed(0)
    w_q, w_k, w_v = (np.random.rand(4, 4) for _ in range(3))
    result = local.attention(x=X, seed=0, d_k=4)
    assert np.array_equal(result.w_q, w_q) and np.array_equal(result.w_v, w_v)
    q, k = X @ w_q, X @ w_k
    scores = q @ k.T / np.sqrt(4)
    weights = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    assert np.abs(result.weights - weights).max() < 1e-12
    assert np.abs(result.output - weights @ (X @ w_v)).max() < 1e-12


def test_async_local_equals_sync_local(local: Client) -> None:
    async def scenario() -> list[Result]:
        async with AsyncClient.local() as client:
            assert await client.ready()
            return list(await asyncio.gather(*(call_async(client, p, f) for p, f, _ in REQUESTS)))

    for (path, fields, _), theirs in zip(REQUESTS, asyncio.run(scenario()), strict=True):
        ours = call(local, path, fields)
        assert sorted(ours.arrays) == sorted(theirs.arrays)
        for name, array in ours.arrays.items():
            assert np.array_equal(array, theirs.arrays[name]), name
        assert ours.json == theirs.json


async def call_async(client: AsyncClient, path: str, fields: dict[str, Any]) -> Result:
    """The async client's method for ``path``, awaited."""
    methods: dict[str, Callable[..., Awaitable[Result]]] = {
        "/attention": client.attention,
        "/mask": client.mask,
        "/multihead": client.multihead,
    }
    return await methods[path](**fields)


# ------------------------------------------------------------------------ lifespan and loops


def test_sync_local_runs_the_lifespan_at_start_and_close() -> None:
    app = create_app(Settings(log_level="warning"))
    before = set(threading.enumerate())
    client = Client.local(app=app)
    assert app.state.ready is True  # the warm-up ran before the first request
    assert client.ready() and client.health()["status"] == "ok"
    assert "numpy" in client.version()
    client.close()
    assert app.state.ready is False
    assert set(threading.enumerate()) <= before  # the app's loop and thread are gone


def test_async_local_starts_with_the_first_request_and_stops_on_aclose() -> None:
    app = create_app(Settings(log_level="warning"))

    async def scenario() -> None:
        client = AsyncClient.local(app=app)
        assert app.state.ready is False  # nothing runs before the first request
        assert await client.ready()
        assert app.state.ready is True
        await client.aclose()
        assert app.state.ready is False

    asyncio.run(scenario())


def test_sync_local_works_inside_a_running_event_loop() -> None:
    """As in a Jupyter kernel, whose main thread runs an asyncio loop."""

    async def kernel_cell() -> Result:
        with Client.local() as client:
            return client.attention(q=Q, k=K, v=V)

    result = asyncio.run(kernel_cell())
    assert result.weights.shape == (5, 5)


def test_a_large_body_is_parsed_in_the_parser_process_and_shut_down_on_close() -> None:
    """A body over 1 MiB goes to the app's parser process, which close() stops."""
    app = create_app(Settings(log_level="warning"))
    x = np.random.default_rng(0).normal(size=(64, 1024))  # ≈ 1.5 MB of JSON numbers
    w = np.eye(1024)[:, :4]
    with Client.local(app=app, binary=False) as client:  # JSON: safetensors needs no parsing
        result = client.attention(x=x, w_q=w, w_k=w, w_v=w)
        assert app.state.parser._pool is not None
    scores = x[:, :4] @ x[:, :4].T / 2
    assert np.abs(result.scaled_scores - scores).max() < 1e-12
    assert app.state.parser._pool is None


PLAIN_SCRIPT = """
import numpy as np
from attention_client import Client

client = Client.local()
x = np.random.default_rng(0).normal(size=(160, 1024))  # 1.25 MiB as safetensors
w = np.eye(1024)[:, :4]
result = client.attention(x=x, w_q=w, w_k=w, w_v=w)
print(x.nbytes > 1 << 20)
print(np.abs(result.scaled_scores - x[:, :4] @ x[:, :4].T / 2).max() < 1e-12)
"""


def test_a_plain_script_without_a_main_guard_sends_a_large_body(tmp_path: Path) -> None:
    """A script with no ``if __name__ == "__main__":`` guard: a body over 1 MiB is answered
    200 (a parser process started by ``spawn`` would run the script again and fail)."""
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]


def test_an_unclosed_local_client_does_not_keep_python_from_exiting() -> None:
    code = "from attention_client import Client; c = Client.local(); print(c.health()['status'])"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_failing_startup_raises_and_leaves_no_thread() -> None:
    @asynccontextmanager
    async def broken(app: FastAPI) -> AsyncIterator[None]:
        raise OSError("no warm-up today")
        yield

    before = set(threading.enumerate())
    with pytest.raises(StartupFailed, match="no warm-up today"):
        Client.local(app=FastAPI(lifespan=broken))
    assert set(threading.enumerate()) <= before


def test_what_the_lifespan_stores_reaches_every_request() -> None:
    """As servers do: a copy of the lifespan's state in each request's scope."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, str]]:
        yield {"greeting": "hello"}

    app = FastAPI(lifespan=lifespan)

    @app.get("/greeting")
    def greeting(request: Request) -> str:
        return str(request.state.greeting)

    with Client.local(app=app) as client:
        assert client._http.get("/greeting").json() == "hello"


def test_without_the_service_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("service", "service.http", "service.http.app", "service.config"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError) as err:
        Client.local()
    message = str(err.value)
    assert "pip install -e ." in message
    assert 'Client("http://127.0.0.1:8000")' in message
    with pytest.raises(ImportError, match=re.escape("pip install -e .")):
        AsyncClient.local()


def test_the_client_readme_local_example_runs() -> None:
    readme = (Path(__file__).resolve().parents[2] / "client" / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "Client.local()" in b]
    namespace: dict[str, Any] = {}
    exec(compile(code, "client/README.md", "exec"), namespace)
    assert namespace["r"].weights.shape == (3, 3)


# ------------------------------------------------------------ errors and the app's middleware


def test_errors_are_those_of_http(local: Client) -> None:
    with pytest.raises(InvalidRequest) as err:
        local.mask(q=Q, k=K, v=V, mask=masks.boolean(np.ones((5, 2), dtype=bool)))
    assert err.value.status == 422 and err.value.field == "mask[0].matrix"
    assert err.value.request_id
    with pytest.raises(InvalidRequest) as err:
        local.multihead(x=X, num_heads=3, seed=0)  # 4 is not a multiple of 3
    assert err.value.field is not None


def test_the_middleware_answers_through_the_local_transport() -> None:
    """The app's own protection runs in process: the body limit (413 before parsing), the API
    key (401), routing (404, 405), content negotiation (406) and the request id."""
    app = create_app(Settings(log_level="warning", api_keys=["k1"], max_body_bytes=4096))
    with Client.local("k1", app=app, headers={"X-Request-ID": "notebook-1"}) as client:
        assert client.attention(q=Q, k=K, v=V).request_id == "notebook-1"
        with pytest.raises(TooLarge) as too_large:
            client.attention(x=np.ones((40, 40)), seed=0)
        assert too_large.value.limit == 4096
        assert too_large.value.errors[0].type == "body_too_large"
        raw = client._http
        assert raw.get("/nowhere").status_code == 404
        assert raw.get("/attention").status_code == 405
        refused = raw.post("/attention", json={"q": [[1]]}, headers={"Accept": "text/html"})
        assert refused.status_code == 406
        assert refused.headers["x-request-id"] == "notebook-1"
    with Client.local(
        "wrong", app=create_app(Settings(log_level="warning", api_keys=["k1"]))
    ) as bad:
        with pytest.raises(Unauthorized) as err:
            bad.attention(q=Q, k=K, v=V)
        assert err.value.errors[0].type == "unauthorized"


# ---------------------------------------------------------------------------------- display


def figures(page: str) -> dict[str, str]:
    """Each drawn map's HTML, by its name."""
    found = re.findall(r'<figure class="map" data-name="([^"]*)".*?</figure>', page, re.S)
    parts = re.findall(r'(<figure class="map" data-name="[^"]*".*?</figure>)', page, re.S)
    return {html.unescape(name): part for name, part in zip(found, parts, strict=True)}


def test_html_draws_each_map_with_the_tokens_and_one_cell_per_number(local: Client) -> None:
    result = local.attention(x=X, seed=0, tokens=TOKENS, mask=masks.causal())
    page = result._repr_html_()
    maps = figures(page)
    assert list(maps) == ["scores", "scaled_scores", "masked_scores", "weights"]
    weights = maps["weights"]
    assert weights.count('class="cell"') == 9  # one per weight
    for token in ("The", "cat", "&lt;pad&gt;"):
        assert re.search(rf'class="query"[^>]*>{re.escape(token)}</', weights)
        assert re.search(rf'class="key"[^>]*>{re.escape(token)}</', weights)
    assert "<pad>" not in page  # token text is escaped
    printed = re.findall(r'pointer-events="none">([^<]*)</text>', weights)
    assert printed == [f"{w:.2f}" for w in result.weights.flat]
    assert maps["masked_scores"].count(">-∞<") == 3  # the hidden keys, above the diagonal


def test_html_is_self_contained(local: Client) -> None:
    page = local.attention(q=RNG.normal(size=(40, 3)), k=K, v=V)._repr_html_()
    assert "<script" not in page.lower() and "<style" not in page.lower()
    links = re.findall(r'(?:href|src)="([^"]*)"', page)
    assert links and all(link.startswith("data:image/png;base64,") for link in links)


def test_large_maps_print_no_values_and_stay_small(local: Client) -> None:
    x = RNG.normal(size=(300, 4))
    result = local.attention(q=x, k=x, v=x, include=["weights"])
    page = result._repr_html_()
    (weights,) = figures(page).values()
    assert 'class="cell"' not in weights and "pointer-events" not in weights
    assert weights.count("<image") == 1  # one image for the 90,000 weights
    width, height = (
        float(v) for v in re.findall(r'<svg[^>]*width="(\d+)" height="(\d+)"', weights)[0]
    )
    assert width < 600 and height < 600
    assert len(page) < 400_000
    middle = RNG.normal(size=(20, 4))
    mid = local.attention(q=middle, k=middle, v=middle, include=["weights"])._repr_html_()
    assert mid.count('class="cell"') == 400 and "pointer-events" not in mid  # no values > 16


def test_comparison_and_diagnosis_come_first(local: Client) -> None:
    np.random.seed(0)
    w_q, w_k = np.random.rand(4, 4), np.random.rand(4, 4)
    scores = (X @ w_q) @ (X @ w_k).T / 2.0
    wrong = np.exp(scores) / np.exp(scores).sum(axis=0)  # the softmax over the queries
    result = local.attention(
        x=X, seed=0, tokens=TOKENS, expected={"scaled_scores": scores, "weights": wrong}
    )
    assert result.first_mismatch == "weights"
    page = result._repr_html_()
    assert page.index('class="comparison"') < page.index("<figure")
    block = page[page.index('class="comparison"') : page.index("<figure")]
    assert "<code>softmax_over_queries</code>" in block
    assert "first at <code>weights</code>" in block
    assert "axis 0" in block  # the explanation
    assert block.count("<tr>") == 3  # a header and one row per array compared
    text = repr(result)
    assert "\n" not in text and len(text) < 300
    assert "first mismatch: weights (softmax_over_queries)" in text
    assert text.startswith("Result(3 queries × 3 keys") and "tokens: The cat <pad>" in text


def test_the_table_says_what_each_array_was_compared_at(local: Client) -> None:
    """A print at 4 decimals and a bfloat16 kernel's numbers (torch's SDPA in bfloat16) each get
    their verdict in the notebook's table: "4 decimals printed", "bfloat16 rounding (yours …, a
    bfloat16 computation's …)"."""
    torch = pytest.importorskip("torch")
    first = local.attention(q=Q, k=K, v=V)
    kernel = (
        torch.nn.functional.scaled_dot_product_attention(
            *(torch.tensor(a, dtype=torch.bfloat16)[None] for a in (Q, K, V))
        )[0]
        .double()
        .numpy()
    )
    result = local.attention(
        q=Q, k=K, v=V, expected={"weights": np.round(first.weights, 4), "output": kernel}
    )
    assert result.first_mismatch is None
    page = result._repr_html_()
    assert "4 decimals printed" in page
    assert re.search(r"bfloat16 rounding \(yours [0-9.e-]+, a bfloat16 computation&#x27;s", page)


def test_a_diagnosis_lists_the_sets_that_reproduce_the_numbers_as_well() -> None:
    """diagnosis.alternatives, as the answer gives them, under the named set."""
    from attention_client.display import comparison

    entry = {"name": "q_rotated", "match": False, "message": "differs", "diagnosis": {
        "mistakes": ["decode_position_offset"], "explanation": "…",
        "alternatives": [["rope_missing"]]}}  # fmt: skip
    page = comparison([entry], "q_rotated")
    assert 'class="alternatives"' in page and "<code>rope_missing</code>" in page


def test_a_match_says_so(local: Client) -> None:
    first = local.attention(q=Q, k=K, v=V)
    again = local.attention(q=Q, k=K, v=V, expected={"weights": first.weights})
    page = again._repr_html_()
    assert "The 1 array you gave matches the service's" in page and "Diagnosis" not in page
    both = local.attention(q=Q, k=K, v=V, expected={"weights": first.weights, "v": V})
    assert "All 2 arrays you gave match the service's" in both._repr_html_()
    assert "comparison: all 1 match" in repr(again)


def test_multihead_draws_the_average_and_each_head(local: Client) -> None:
    result = local.multihead(x=X, num_heads=2, seed=1, tokens=TOKENS)
    assert list(figures(result._repr_html_())) == [
        "average_weights",
        "heads[0].weights",
        "heads[1].weights",
    ]
    assert "h=2" in repr(result) and "heads[2]" in repr(result)
    head = figures(result.heads[1]._repr_html_())
    assert list(head) == ["scores", "scaled_scores", "weights"]
    assert head["weights"].count('class="cell"') == 9
    assert repr(result.heads[1]).startswith("Head(3 queries × 3 keys")
    stacked = local.multihead(x=X, num_heads=2, seed=1, include=["weights"])
    assert list(figures(stacked._repr_html_())) == ["weights[0]", "weights[1]"]


def test_batched_maps_are_drawn_per_item(local: Client) -> None:
    q = RNG.normal(size=(2, 3, 4))
    result = local.attention(q=q, k=q, v=q, include=["weights"])
    assert list(figures(result._repr_html_())) == ["weights[0]", "weights[1]"]
    assert "batch of 2" in repr(result)


def test_scores_with_both_signs_get_a_diverging_scale(local: Client) -> None:
    result = local.attention(q=Q, k=K, v=V, include=["scores"])
    (scores,) = figures(result._repr_html_()).values()
    bound = np.abs(result.scores).max()
    legend = re.search(r"colours ([^<]*)<", scores)
    assert legend is not None
    assert legend.group(1) == f"-{bound:.2f} … {bound:.2f}"


def test_png_is_a_valid_image() -> None:
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    data = png(rgb)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (3, 2)
    size = struct.unpack(">I", data[33:37])[0]
    rows = zlib.decompress(data[41 : 41 + size])
    assert rows == b"".join(b"\x00" + rgb[i].tobytes() for i in range(2))


def test_a_very_large_map_is_averaged_over_blocks_of_cells() -> None:
    rgb = np.zeros((3, 3, 3), dtype=np.uint8)
    rgb[0, 0] = 200
    rgb[2, 2] = 90
    small = shrink(rgb, 2)
    assert small.shape == (2, 2, 3)
    assert small[0, 0, 0] == 50  # (200 + 0 + 0 + 0) / 4
    assert small[1, 1, 0] == 90  # the corner block holds one cell
    assert shrink(rgb, 1) is rgb
