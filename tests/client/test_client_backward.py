"""The Python client's backward pass (API.md, "The backward pass, every step"): ``grad_output=``
on every compute call, the ``grad_*`` arrays of the answer, the notebook display's gradient
section; first the wire (httpx.MockTransport), then the app in process and a real server, each
gradient against torch.autograd in float64 (written here, independent of the service)."""

import inspect
import json
import re
from typing import Any, ClassVar

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import torch
from attention_client import AsyncClient, Client, masks

from tests.client.test_client import (
    ST,
    Recorder,
    mock_client,
    read_body,
    run_in_app,
    st_response,
)

Arrays = dict[str, npt.NDArray[Any]]
RNG = np.random.default_rng(44)
L, D = 3, 2
GRAD = RNG.normal(size=(L, D))

# ------------------------------------------------------------------------- request bodies

METHODS = ("attention", "mask", "multihead")


def send(binary: bool, method: str, **fields: Any) -> httpx.Request:
    """The request ``client.<method>(**fields)`` sends (answered with a bare 200)."""
    rec = Recorder(st_response({"weights": np.eye(2)}, {"scale": 1.0}))
    with mock_client(rec, binary=binary) as client:
        getattr(client, method)(**fields)
    return rec.requests[0]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "given",
    [GRAD.astype(np.float32), GRAD.round(0).astype(int).tolist(), torch.tensor(GRAD)],
    ids=["numpy-float32", "list-of-ints", "torch"],
)
def test_grad_output_is_sent_as_a_float64_tensor_by_every_method(method: str, given: Any) -> None:
    request = send(True, method, seed=0, grad_output=given)
    tensors, rest = read_body(request.content)
    assert request.headers["content-type"] == ST
    assert tensors["grad_output"].dtype == np.float64
    want = np.asarray(given.numpy() if isinstance(given, torch.Tensor) else given, np.float64)
    assert np.array_equal(tensors["grad_output"], want)
    assert "grad_output" not in rest and rest["seed"] == 0


@pytest.mark.parametrize("method", METHODS)
def test_every_compute_method_names_grad_output_in_its_signature(method: str) -> None:
    for kind in (Client, AsyncClient):  # a named argument, documented, not only through **extra
        assert "grad_output" in inspect.signature(getattr(kind, method)).parameters
        assert "grad_output" in (getattr(kind, method).__doc__ or "")


def test_a_torch_tensor_that_requires_grad_is_sent_detached() -> None:
    t = torch.tensor(GRAD, requires_grad=True) * 2  # a graph's output, not a leaf
    tensors, _ = read_body(send(True, "attention", grad_output=t).content)
    assert np.array_equal(tensors["grad_output"], GRAD * 2)


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
@pytest.mark.parametrize("method", METHODS)
def test_sum_is_sent_as_the_string(binary: bool, method: str) -> None:
    request = send(binary, method, seed=1, grad_output="sum")
    rest = read_body(request.content)[1] if binary else json.loads(request.content)
    assert rest["grad_output"] == "sum"


def test_json_mode_sends_grad_output_as_lists() -> None:
    body = json.loads(send(False, "mask", seed=0, grad_output=GRAD).content)
    assert body["grad_output"] == GRAD.tolist()


def test_expected_gradients_travel_as_tensors_at_their_place() -> None:
    expected = {
        "grad_q": np.ones((L, D), dtype=np.float32),
        "heads": [None, {"grad_weights": [[1, 0], [0, 1]]}],
    }
    request = send(True, "multihead", seed=0, grad_output=GRAD, expected=expected)
    tensors, rest = read_body(request.content)
    assert tensors["expected.grad_q"].dtype == np.float64
    assert np.array_equal(tensors["expected.heads.1.grad_weights"], np.eye(2))
    assert tensors["expected.heads.1.grad_weights"].dtype == np.float64
    assert rest["expected"]["heads"][0] is None


def test_layer_passes_grad_output_through() -> None:
    class Module(torch.nn.Module):
        config: ClassVar[dict[str, int]] = {"num_attention_heads": 1}

    body = json.loads(send(False, "layer", module=Module(), config=None, x=GRAD, grad_output="sum").content)  # fmt: skip
    assert body["grad_output"] == "sum" and body["config"] == Module.config


# ------------------------------------------------------------------------------ answers

NEG = -np.inf
WEIGHTS = np.array([[1.0, 0.0], [0.25, 0.75]])
ANSWER: Arrays = {
    "masked_scores": np.array([[0.5, NEG], [0.1, 1.2]]),
    "weights": WEIGHTS,
    "output": np.array([[1.0, 2.0], [3.0, 4.0]]),
    "grad_output": np.array([[1.0, -1.0], [0.5, 0.5]]),
    "grad_weights": np.array([[0.3, -0.2], [-0.4, 0.6]]),
    "row_dot": np.array([0.3, 0.35]),
    "grad_masked_scores": np.array([[0.0, 0.0], [-0.1875, 0.1875]]),
    "grad_q": np.array([[0.0, 0.1], [0.2, 0.3]]),
}
FORWARD = ("masked_scores", "weights", "output")
MH_ANSWER: Arrays = {
    "heads.0.weights": WEIGHTS,
    "heads.0.grad_weights": np.array([[0.3, -0.2], [-0.4, 0.6]]),
    "heads.0.grad_scaled_scores": np.array([[0.0, 0.0], [-0.1, 0.1]]),
    "heads.0.scaled_scores": np.array([[0.5, 0.1], [0.1, 1.2]]),
    "heads.1.weights": WEIGHTS[::-1].copy(),
    "heads.1.grad_weights": np.array([[0.1, -0.1], [0.2, 0.2]]),
    "heads.1.grad_scaled_scores": np.array([[0.05, -0.05], [0.0, 0.0]]),
    "heads.1.scaled_scores": np.array([[0.2, 0.1], [0.3, 0.2]]),
    "weights": np.stack([WEIGHTS, WEIGHTS[::-1]]),  # stacked [h][L][S], as the service
    "output": np.ones((2, 2)),
    "grad_output": np.ones((2, 2)),
    "grad_weights": np.stack([np.full((2, 2), 0.1), np.full((2, 2), -0.1)]),
    "grad_x": np.full((2, 2), 0.5),
    "grad_w_q": np.full((2, 2), 0.25),
}


def json_of(arrays: Arrays, rest: dict[str, Any]) -> dict[str, Any]:
    """The JSON answer of ``arrays`` (dotted paths) and ``rest``: −∞ as null."""
    body: dict[str, Any] = json.loads(json.dumps(rest))
    for name, array in arrays.items():
        node, *path = name.split(".")
        cells = array.astype(object)
        cells[np.isneginf(array)] = None
        value = cells.tolist()
        if not path:
            body[node] = value
        else:
            body[node][int(path[0])][path[1]] = value
    return body


def answered(arrays: Arrays, rest: dict[str, Any], binary: bool) -> Any:
    response = (
        st_response(arrays, rest) if binary else httpx.Response(200, json=json_of(arrays, rest))
    )
    with mock_client(Recorder(response), binary=binary) as client:
        return client.mask(seed=0, grad_output="sum")


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_gradients_are_arrays_like_any_other(binary: bool) -> None:
    result = answered(ANSWER, {"scale": 1.0}, binary)
    for name, array in ANSWER.items():
        assert np.array_equal(result[name], array), name
    assert np.array_equal(result.grad_weights, ANSWER["grad_weights"])
    order = sorted if binary else list  # our mock's safetensors writes its tensors by name
    assert order(result.gradients) == order([n for n in ANSWER if n not in FORWARD])
    assert result.grad_masked_scores[0, 1] == 0.0  # a masked cell's dS: 0, not −∞


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_each_heads_gradients_are_in_its_head(binary: bool) -> None:
    result = answered(MH_ANSWER, {"num_heads": 2, "heads": [{}, {}]}, binary)
    assert np.array_equal(result["heads.1.grad_weights"], MH_ANSWER["heads.1.grad_weights"])
    assert np.array_equal(result.heads[0].grad_weights, MH_ANSWER["heads.0.grad_weights"])
    order = sorted if binary else list
    assert order(result.heads[1].gradients) == order(["grad_weights", "grad_scaled_scores"])
    assert order(result.gradients) == order(["grad_output", "grad_weights", "grad_x", "grad_w_q"])


# ---------------------------------------------------------------------- notebook display


def pairs_drawn(html: str) -> list[list[str]]:
    """The names of the maps in each gradient pair of the display, in order."""
    section = html.split('class="gradients"', 1)[1]
    return [
        re.findall(r'data-name="([^"]+)"', pair)
        for pair in section.split('class="gradient-pair"')[1:]
    ]


def test_each_gradient_map_is_drawn_beside_its_forward_map() -> None:
    html = answered(ANSWER, {"scale": 1.0}, True)._repr_html_()
    assert pairs_drawn(html) == [
        ["weights", "grad_weights"],
        ["masked_scores", "grad_masked_scores"],
    ]
    assert "dS = P ∘ (dP − D)" in html and "∂loss/∂masked_scores" in html
    before = html.split('class="gradients"', 1)[0]
    assert 'data-name="grad_weights"' not in before  # not among the forward's maps


def test_each_heads_gradient_maps_beside_its_maps() -> None:
    html = answered(MH_ANSWER, {"num_heads": 2, "heads": [{}, {}]}, False)._repr_html_()
    assert pairs_drawn(html) == [
        [f"heads[{i}].{forward}", f"heads[{i}].grad_{forward}"]
        for i in (0, 1)
        for forward in ("weights", "scaled_scores")
    ]


def test_a_head_alone_draws_its_pairs() -> None:
    head = answered(MH_ANSWER, {"num_heads": 2, "heads": [{}, {}]}, True).heads[1]
    assert pairs_drawn(head._repr_html_()) == [
        ["weights", "grad_weights"],
        ["scaled_scores", "grad_scaled_scores"],
    ]


def test_no_backward_section_without_gradients() -> None:
    forward = {n: a for n, a in ANSWER.items() if not n.startswith("grad_") and n != "row_dot"}
    html = answered(forward, {"scale": 1.0}, True)._repr_html_()
    assert 'class="gradients"' not in html and "Backward pass" not in html


def entry(name: str, match: bool, **more: Any) -> dict[str, Any]:
    return {"name": name, "match": match, "max_abs_diff": 0.0 if match else 0.3, **more}


def test_the_gradient_check_names_the_first_gradient_that_differs_and_its_mistake() -> None:
    diagnosis = {
        "mistakes": ["softmax_grad_diagonal"],
        "explanation": "your dS has no −D term: the softmax's Jacobian is not diagonal",
    }
    comparison = [
        entry("weights", True),
        entry("grad_weights", True),
        entry("grad_masked_scores", False, message="differs at [1, 0]", diagnosis=diagnosis),
        entry("grad_q", False),
    ]
    rest = {"scale": 1.0, "comparison": comparison, "first_mismatch": "grad_masked_scores"}
    html = answered(ANSWER, rest, True)._repr_html_()
    check = html.split('class="gradient-check"', 1)[1].split('class="gradient-pair"')[0]
    assert "1 of your 3 gradients match" in check
    assert "the first mismatch: <code>grad_masked_scores</code>" in check
    assert "<code>softmax_grad_diagonal</code>" in check and "no −D term" in check
    assert "differs at [1, 0]" in check


def test_the_gradient_check_says_when_every_gradient_matches() -> None:
    comparison = [entry("weights", False), entry("heads.0.grad_weights", True)]
    rest = {"scale": 1.0, "comparison": comparison, "first_mismatch": "weights"}
    html = answered(ANSWER, rest, True)._repr_html_()
    assert "Your gradient matches the service's." in html


def test_no_gradient_check_when_no_gradient_was_compared() -> None:
    rest = {"scale": 1.0, "comparison": [entry("weights", True)], "first_mismatch": None}
    html = answered(ANSWER, rest, True)._repr_html_()
    assert 'class="gradient-check"' not in html and 'class="gradients"' in html


def test_grad_state_dict_is_keyed_by_the_names_given() -> None:
    arrays = {"output": np.ones((2, 2)), "grad_state_dict.q_proj.weight": np.eye(2),
              "grad_state_dict.in_proj_weight": np.ones((6, 2))}  # fmt: skip
    for binary in (True, False):
        rest: dict[str, Any] = {"num_heads": 1}
        if not binary:  # the JSON answer: one object, its keys the state dict's names
            rest["grad_state_dict"] = {}
        body = (
            st_response(arrays, rest)
            if binary
            else httpx.Response(
                200,
                json={"output": [[1.0, 1.0]] * 2, "num_heads": 1, "grad_state_dict": {
                    "q_proj.weight": np.eye(2).tolist(), "in_proj_weight": np.ones((6, 2)).tolist()}},
            )
        )  # fmt: skip
        with mock_client(Recorder(body), binary=binary) as client:
            result = client.multihead(seed=0, grad_output="sum")
        assert result.grad_state_dict is not None
        assert sorted(result.grad_state_dict) == ["in_proj_weight", "q_proj.weight"]
        assert np.array_equal(result.grad_state_dict["q_proj.weight"], np.eye(2))
    assert answered(ANSWER, {"scale": 1.0}, True).grad_state_dict is None


# -------------------------------------------- through the app and a server, against torch

TOL = 1e-10
X = RNG.normal(size=(5, 6))
W: dict[str, Any] = {n: RNG.normal(size=(6, 4)) / 2 for n in ("w_q", "w_k", "w_v")}  # in_out
DO = RNG.normal(size=(5, 4))


def close(ours: npt.NDArray[Any], theirs: Any, name: str) -> None:
    """Equal to torch's within TOL, relative to the largest entry."""
    want = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    assert ours.shape == want.shape, (name, ours.shape, want.shape)
    assert np.abs(ours - want).max() <= TOL * max(1.0, np.abs(want).max()), name


def torch_masked(grad: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """softmax(causal(Q Kᵀ/√d_k)) V from x and the in_out weights, backward from ``grad`` (None:
    out.sum()); every tensor whose gradient the answer names, with its .grad kept."""
    t = {n: torch.tensor(a, requires_grad=True) for n, a in W.items()} | {
        "x": torch.tensor(X, requires_grad=True)
    }
    q, k, v = (t["x"] @ t[n] for n in ("w_q", "w_k", "w_v"))
    scaled = q @ k.T / 2.0  # √4
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    masked = scaled.masked_fill(~causal, float("-inf"))
    weights = torch.softmax(masked, dim=-1)
    out: Any = weights @ v
    for kept in (q, k, v, scaled, masked, weights):
        kept.retain_grad()
    (out.sum() if grad is None else out).backward(grad)
    return t | {"q": q, "k": k, "v": v, "scaled_scores": scaled, "masked_scores": masked,
                "weights": weights}  # fmt: skip


def check_masked(result: Any, grad: torch.Tensor | None) -> None:
    theirs = torch_masked(grad)
    for name in ("weights", "masked_scores", "scaled_scores", "q", "k", "v", "x", "w_q", "w_k", "w_v"):  # fmt: skip
        close(result[f"grad_{name}"], theirs[name].grad, f"grad_{name}")
    assert (result.grad_masked_scores[~np.tri(5, dtype=bool)] == 0).all()  # 0 where masked


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
@pytest.mark.parametrize("grad", ["array", "torch", "sum"])
def test_in_process_mask_gradients_equal_torch_autograd(binary: bool, grad: str) -> None:
    given: Any = {"array": DO, "torch": torch.tensor(DO), "sum": "sum"}[grad]

    async def scenario(client: AsyncClient, raw: httpx.AsyncClient) -> None:
        result = await client.mask(x=X, **W, mask={"type": "causal"}, grad_output=given)
        check_masked(result, None if grad == "sum" else torch.tensor(DO))
        names = [s["name"] for s in result.steps or []]
        assert names.index("grad_output") > names.index("output")  # after the forward's
        assert next(iter(result.gradients)) == "grad_output"

    run_in_app(scenario, binary)


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_in_process_multihead_state_dict_gradients_equal_torch_autograd(binary: bool) -> None:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(6, 2, batch_first=True, dtype=torch.float64)
    x = torch.tensor(X[None], requires_grad=True)
    grad = RNG.normal(size=(5, 6))
    out: Any = mha(x, x, x, need_weights=False)[0]
    out.backward(torch.tensor(grad[None]))
    assert x.grad is not None
    dx = x.grad[0]

    async def scenario(client: AsyncClient, raw: httpx.AsyncClient) -> None:
        result = await client.multihead(
            x=X, num_heads=2, state_dict=mha.state_dict(), grad_output=grad
        )
        close(result.grad_x, dx, "grad_x")
        assert result.grad_state_dict is not None
        for name, p in mha.named_parameters():
            close(result.grad_state_dict[name], p.grad, f"grad_state_dict.{name}")
        assert [h.grad_weights.shape for h in result.heads] == [(5, 5), (5, 5)]
        html = result._repr_html_()
        assert pairs_drawn(html)[:2] == [
            ["heads[0].weights", "heads[0].grad_weights"],
            ["heads[0].scaled_scores", "heads[0].grad_scaled_scores"],
        ]

    run_in_app(scenario, binary)


@pytest.mark.parametrize("binary", [True, False], ids=["safetensors", "json"])
def test_in_process_display_of_a_real_backward(binary: bool) -> None:
    async def scenario(client: AsyncClient, raw: httpx.AsyncClient) -> None:
        result = await client.mask(x=X, **W, mask={"type": "causal"}, grad_output=DO)
        assert pairs_drawn(result._repr_html_()) == [
            ["weights", "grad_weights"],
            ["masked_scores", "grad_masked_scores"],
        ]

    run_in_app(scenario, binary)


@pytest.mark.e2e
def test_live_backward_both_ways(server: str) -> None:
    with Client(server) as client, Client(server, binary=False) as plain:
        result = client.mask(x=X, **W, mask=masks.causal(), grad_output=DO)
        same = plain.mask(x=X, **W, mask=masks.causal(), grad_output=torch.tensor(DO))
    check_masked(result, torch.tensor(DO))
    assert result.gradients.keys() == same.gradients.keys()
    for name, array in result.gradients.items():
        assert np.array_equal(array, same.gradients[name]), name
