"""safetensors in and out (API.md, "Binary arrays"), through the ASGI app.

The reference reader and writer are the `safetensors` library's own (safetensors.numpy), not
the service's code: every response is read with ``load`` and every binary request is written
with ``save``. Arrays are compared bit for bit with the JSON answer to the same request.
"""

import asyncio
import json
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.openapi.models import Example
from fastapi.testclient import TestClient
from safetensors.numpy import load, save

from service.config import Settings
from service.http.app import create_app
from service.http.doors import checked
from service.http.parser import Parser
from service.http.routes import INLINE_BODY_BYTES
from service.wire.errors import RequestError
from service.wire.examples import ATTENTION_EXAMPLES, MASK_EXAMPLES, MULTIHEAD_EXAMPLES
from service.wire.media import negotiate
from service.wire.safetensors_in import MAX_TENSORS

ST = "application/x-safetensors"
TO_ST = {"Content-Type": ST}
FROM_ST = {"Accept": ST}
NULL_IS_NEG_INF = {"masked_scores", "additive_mask"}


def value(example: Example) -> dict[str, Any]:
    """A worked example's request body."""
    body = example["value"]
    assert isinstance(body, dict)
    return body


WORKED = [
    (path, key, value(example))
    for path, examples in (
        ("/attention", ATTENTION_EXAMPLES),
        ("/mask", MASK_EXAMPLES),
        ("/multihead", MULTIHEAD_EXAMPLES),
    )
    for key, example in examples.items()
]
WORKED_IDS = [f"{path[1:]}-{key}" for path, key, _ in WORKED]


# ----------------------------------------------------------------------------- reference side


def metadata(raw: bytes) -> dict[str, Any]:
    """The JSON object under __metadata__["json"] of a safetensors file."""
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    value: dict[str, Any] = json.loads(header["__metadata__"]["json"])
    return value


def put(tree: Any, path: str, value: Any) -> None:
    """Set the dotted ``path`` (integer parts index lists) of ``tree``."""
    *parents, last = path.split(".")
    for part in parents:
        tree = tree[int(part)] if isinstance(tree, list) else tree[part]
    if isinstance(tree, list):
        tree[int(last)] = value
    else:
        tree[last] = value


def as_json_values(a: np.ndarray) -> Any:
    """A tensor as JSON shows it: nested lists, −∞ and NaN as null."""
    if a.dtype.kind == "f":
        return nulls_where(a, ~np.isfinite(a))
    return a.tolist()


def nulls_where(a: np.ndarray, null: np.ndarray) -> Any:
    """``a`` as nested lists with None where ``null`` is true."""
    out = a.astype(object)
    out[null] = None
    return out.tolist()


def rebuilt(raw: bytes) -> dict[str, Any]:
    """A safetensors response as the JSON response it stands for."""
    tree = metadata(raw)
    for name, tensor in load(raw).items():
        put(tree, name, as_json_values(tensor))
    return tree


def binary_body(body: dict[str, Any]) -> bytes:
    """A JSON request as safetensors: every list of numbers, booleans or nulls (nested to any
    depth) becomes a tensor named by its path, null as −∞; the rest stays JSON."""
    tensors: dict[str, np.ndarray] = {}

    def walk(value: Any, path: str) -> Any:
        """``value`` without its arrays, which go to ``tensors``; None when it was one."""
        if isinstance(value, dict):
            kept = {k: walk(v, f"{path}{k}.") for k, v in value.items()}
            return {k: v for k, v in kept.items() if v is not None or value[k] is None}
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            return [walk(v, f"{path}{i}.") for i, v in enumerate(value)]
        if isinstance(value, list) and value and _numeric(value):
            a = np.array(value, dtype=object)
            kinds = {type(v) for v in a.ravel()}
            name = path[:-1]
            if kinds == {bool}:
                tensors[name] = a.astype(bool)
            elif kinds <= {int}:
                tensors[name] = a.astype(np.int64)
            else:
                tensors[name] = np.where(a == None, -np.inf, a).astype(np.float64)  # noqa: E711
            return None
        return value

    fields = walk(body, "")
    return save(tensors, metadata={"json": json.dumps(fields)})


def _numeric(value: list[Any]) -> bool:
    """Whether nested lists hold only numbers, booleans and nulls (and are not all null)."""
    flat: list[Any] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        else:
            flat.append(item)
    return all(v is None or isinstance(v, int | float) for v in flat) and any(
        v is not None for v in flat
    )


# ------------------------------------------------------------------------------- the answers


@pytest.mark.parametrize(("path", "key", "body"), WORKED, ids=WORKED_IDS)
def test_a_safetensors_answer_holds_the_json_answers_numbers_bit_for_bit(
    client: TestClient, path: str, key: str, body: dict[str, Any]
) -> None:
    as_json = client.post(path, json=body)
    as_binary = client.post(path, json=body, headers=FROM_ST)
    assert as_json.status_code == as_binary.status_code == 200
    assert as_binary.headers["content-type"] == ST
    assert as_binary.headers["vary"] == "Accept, Accept-Encoding"
    tensors = load(as_binary.content)
    assert tensors, "no arrays"
    for name, tensor in tensors.items():
        integers = name.rsplit(".", 1)[-1] in ("query_positions", "key_positions")
        assert tensor.dtype in ((np.int64,) if integers else (np.float64, np.bool_)), (
            name,
            tensor.dtype,
        )
    assert rebuilt(as_binary.content) == as_json.json()


@pytest.mark.parametrize(("path", "key", "body"), WORKED, ids=WORKED_IDS)
def test_a_safetensors_request_is_answered_as_the_same_json_request(
    client: TestClient, path: str, key: str, body: dict[str, Any]
) -> None:
    raw = binary_body(body)
    assert len(load(raw)) >= (0 if "seed" in body and "x" not in body else 1)
    from_binary = client.post(path, content=raw, headers=TO_ST)
    assert from_binary.status_code == 200, from_binary.json()
    assert from_binary.json() == client.post(path, json=body).json()


def test_masked_scores_keep_minus_infinity_and_the_mask_is_bool(client: TestClient) -> None:
    body = value(MASK_EXAMPLES["causal"])
    tensors = load(client.post("/mask", json=body, headers=FROM_ST).content)
    masked = tensors["masked_scores"]
    assert masked.dtype == np.float64 and tensors["mask"].dtype == np.bool_
    assert np.array_equal(np.isneginf(masked), ~tensors["mask"])
    assert np.isfinite(tensors["weights"]).all()


def test_heads_are_tensors_under_their_index_and_the_json_keeps_their_places(
    client: TestClient,
) -> None:
    body = {"sentence": "a b c d", "seed": 1, "d_model": 8, "num_heads": 4}
    raw = client.post("/multihead", json=body, headers=FROM_ST).content
    tensors = load(raw)
    assert metadata(raw)["heads"] == [{}, {}, {}, {}]
    assert tensors["weights"].shape == (4, 4, 4)
    for i in range(4):
        assert np.array_equal(tensors[f"heads.{i}.weights"], tensors["weights"][i])
    assert "x" in tensors and "w_q" in tensors  # generated arrays are returned as tensors


def test_include_and_decimals_apply_as_for_json(client: TestClient) -> None:
    body = {**value(ATTENTION_EXAMPLES["batman"]), "include": ["weights"], "decimals": 3}
    raw = client.post("/attention", json=body, headers=FROM_ST).content
    tensors = load(raw)
    assert set(tensors) == {"weights"}
    assert np.array_equal(tensors["weights"], np.round(tensors["weights"], 3))
    assert rebuilt(raw) == client.post("/attention", json=body).json()


def test_a_large_answer_streams_in_blocks_and_matches_json(client: TestClient) -> None:
    """Above the inline size the answer is streamed (several body chunks) from the arrays; the
    stacked weights' per-head slices are not contiguous and still come out in C order."""
    rng = np.random.default_rng(0)
    body = {"x": rng.normal(size=(300, 32)).tolist(), "seed": 0, "d_k": 32, "num_heads": 4}
    body = {"x": body["x"], "seed": 0, "d_model": 32, "num_heads": 4}
    with client.stream("POST", "/multihead", json=body, headers=FROM_ST) as r:
        chunks = list(r.iter_raw())
    raw = b"".join(chunks)
    assert len(chunks) > 1
    tensors = load(raw)
    assert tensors["weights"].shape == (4, 300, 300)
    assert rebuilt(raw) == client.post("/multihead", json=body).json()


# ------------------------------------------------------------------------------ the requests


def _weights(d: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "x": rng.normal(size=(3, d)),
        "w_q": rng.normal(size=(d, d)),
        "w_k": rng.normal(size=(d, d)),
        "w_v": rng.normal(size=(d, d)),
    }


def _json(tensors: dict[str, np.ndarray], **fields: Any) -> dict[str, Any]:
    return {**{k: v.tolist() for k, v in tensors.items()}, **fields}


def _post_binary(
    client: TestClient, path: str, tensors: dict[str, np.ndarray], **fields: Any
) -> Any:
    raw = save(tensors, metadata={"json": json.dumps(fields)} if fields else None)
    return client.post(path, content=raw, headers=TO_ST)


def test_float32_float16_and_bfloat16_tensors_are_read_exactly(client: TestClient) -> None:
    tensors = _weights()
    f32 = {k: v.astype(np.float32) for k, v in tensors.items()}
    as_json = client.post("/attention", json=_json({k: v.astype(np.float64) for k, v in f32.items()}))  # fmt: skip
    assert _post_binary(client, "/attention", f32).json() == as_json.json()
    f16 = {k: v.astype(np.float16) for k, v in tensors.items()}
    as_json = client.post("/attention", json=_json({k: v.astype(np.float64) for k, v in f16.items()}))  # fmt: skip
    assert _post_binary(client, "/attention", f16).json() == as_json.json()
    # bfloat16: the upper 16 bits of a float32 (1.5 and -2.25 are exact in it)
    bf16 = {"q": [[1.5, -2.25]], "k": [[0.5, 1.0], [2.0, -1.0]], "v": [[1.0], [3.0]]}
    header = {}
    data = b""
    for name, rows in bf16.items():
        a = (np.array(rows, dtype=np.float32).view(np.uint32) >> 16).astype("<u2")
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [len(data), len(data) + a.nbytes]}  # fmt: skip
        data += a.tobytes()
    text = json.dumps(header).encode()
    raw = struct.pack("<Q", len(text)) + text + data
    r = client.post("/attention", content=raw, headers=TO_ST)
    assert r.json() == client.post("/attention", json=bf16).json()


def test_integer_tensors_serve_integer_fields_and_a_0d_tensor_a_number(
    client: TestClient,
) -> None:
    tensors = {**_weights(), "positions": np.array([5, 6, 7]), "scale": np.array(0.25)}
    fields = {"rope": {"base": 100}}
    as_json = client.post("/attention", json={**_json(_weights()), "positions": [5, 6, 7], "scale": 0.25, **fields})  # fmt: skip
    assert _post_binary(client, "/attention", tensors, **fields).json() == as_json.json()


def test_dotted_state_dict_names_are_top_level_fields(client: TestClient) -> None:
    rng = np.random.default_rng(3)
    sd = {name: rng.normal(size=(8, 8)) for name in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")}  # fmt: skip
    x = rng.normal(size=(3, 8))
    fields = {"num_heads": 2}
    as_json = client.post("/multihead", json={"x": x.tolist(), **{k: v.tolist() for k, v in sd.items()}, **fields})  # fmt: skip
    assert as_json.status_code == 200
    assert _post_binary(client, "/multihead", {"x": x, **sd}, **fields).json() == as_json.json()


def test_expected_grad_state_dict_takes_a_modules_dotted_names_whole(
    client: TestClient,
) -> None:
    """expected.grad_state_dict.q_layernorm.norms.1.weight is the entry
    "q_layernorm.norms.1.weight" of expected.grad_state_dict (its keys are the module's names),
    compared as the JSON body compares it: right ones match, a wrong one differs."""
    rng = np.random.default_rng(4)
    sd = {name: rng.normal(size=(8, 8)) for name in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")}  # fmt: skip
    sd |= {f"q_layernorm.norms.{i}.weight": rng.normal(size=4) for i in range(2)}
    x, g = rng.normal(size=(3, 8)), rng.normal(size=(3, 8))
    fields = {"num_heads": 2, "grad_output": g.tolist(), "qk_norm": {"type": "layer", "eps": 1e-5}}
    body = {"x": x.tolist(), **{k: v.tolist() for k, v in sd.items()}, **fields}
    answer = client.post("/multihead", json=body)
    assert answer.status_code == 200, answer.text
    grads = answer.json()["grad_state_dict"]
    wrong = np.asarray(grads["q_layernorm.norms.1.weight"]) * 2
    expected = {f"expected.grad_state_dict.{n}": np.asarray(grads[n]) for n in ("q_proj.weight", "q_layernorm.norms.0.weight")}  # fmt: skip
    expected["expected.grad_state_dict.q_layernorm.norms.1.weight"] = wrong
    binary = _post_binary(client, "/multihead", {"x": x, **sd, **expected}, **fields)
    assert binary.status_code == 200, binary.text
    verdicts = {c["name"]: c["match"] for c in binary.json()["comparison"]}
    assert verdicts == {
        "grad_state_dict.q_proj.weight": True,
        "grad_state_dict.q_layernorm.norms.0.weight": True,
        "grad_state_dict.q_layernorm.norms.1.weight": False,
    }, verdicts
    as_json = {n.removeprefix("expected.grad_state_dict."): a.tolist() for n, a in expected.items()}
    json_body = body | {"expected": {"grad_state_dict": as_json}}
    assert client.post("/multihead", json=json_body).json() == binary.json()


def test_tensors_go_into_masks_heads_and_options_by_path(client: TestClient) -> None:
    t = _weights()
    allowed = np.tril(np.ones((3, 3), dtype=bool))
    additive = np.where(allowed, 0.5, -np.inf)
    mask_json = [{"type": "boolean", "matrix": allowed.tolist()}, {"type": "additive", "matrix": nulls_where(np.full((3, 3), 0.5), ~allowed)}]  # fmt: skip
    as_json = client.post("/mask", json={**_json(t), "mask": mask_json}).json()
    binary = _post_binary(client, "/mask", {**t, "mask.0.matrix": allowed, "mask.1.matrix": additive}, mask=[{"type": "boolean"}, {"type": "additive"}])  # fmt: skip
    assert binary.json() == as_json
    single = _post_binary(client, "/mask", {**t, "mask.0.matrix": allowed}, mask={"type": "boolean"})  # fmt: skip
    assert single.json() == client.post("/mask", json={**_json(t), "mask": mask_json[0]}).json()
    gamma = np.array([1.0, 2.0, 0.5, 1.5])
    # contiguous copies: safetensors.numpy.save writes a column slice's underlying buffer
    heads = {f"heads.{i}.{w}": np.ascontiguousarray(t[w][:, 2 * i : 2 * i + 2]) for i in range(2) for w in ("w_q", "w_k", "w_v")}  # fmt: skip
    as_json = client.post("/multihead", json={"x": t["x"].tolist(), "heads": [{w: t[w][:, 2 * i : 2 * i + 2].tolist() for w in ("w_q", "w_k", "w_v")} for i in range(2)], "num_heads": 2, "layer_norm": {"gamma": gamma.tolist()}})  # fmt: skip
    binary = _post_binary(client, "/multihead", {"x": t["x"], **heads, "layer_norm.gamma": gamma}, num_heads=2, layer_norm=True)  # fmt: skip
    assert as_json.status_code == 200 and binary.json() == as_json.json()


def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"message", "errors"}
    return body


@pytest.mark.parametrize(
    ("tensors", "fields", "field", "words"),
    [
        ({**_weights(), "w_q": np.full((4, 4), np.nan)}, {}, "w_q", "w_q row 0, column 0 is not a finite number"),
        ({**_weights(), "x": np.array([[1.0, -np.inf, 0, 0]] * 3)}, {}, "x", "x row 0, column 1 is not a finite number"),
        ({**_weights(), "x": np.ones((3, 4), dtype=bool)}, {}, "x", "x is a BOOL tensor: booleans are not numbers"),
        ({**_weights(), "x": np.ones((2, 3, 4, 1))}, {}, "x", "x must be a matrix [L][d]"),
        ({**_weights(), "w_q": np.ones((3, 4))}, {}, "w_q", "w_q is 3×4 but x has 4 columns"),
        ({**_weights(), "mask.0.matrix": np.full((3, 3), np.nan)}, {"mask": [{"type": "additive"}]}, "mask[0].matrix", "a tensor may hold −∞ where JSON would have null"),
        ({**_weights(), "x": np.ones((3, 4))}, {"x": [[1.0]]}, "x", "x is given twice"),
        ({**_weights(), "mask.5000.matrix": np.ones((3, 3))}, {"mask": [{"type": "additive"}]}, "mask[5000].matrix", "is not an index"),
        ({**_weights(), "scale": np.array(1.0)}, {"scale": 2.0}, "scale", "scale is given twice"),
        ({**_weights(), "nothing": np.ones(2)}, {}, "nothing", "not a field of this endpoint"),
        ({**_weights(), "q_proj.weight": np.ones((4, 4))}, {}, "q_proj.weight", "q_proj.weight is not a field of this endpoint"),
    ],
    ids=["nan", "minus-inf-in-x", "bool-as-numbers", "too-many-dims", "wrong-shape", "nan-in-additive", "twice", "index-too-big", "scalar-twice", "unknown", "state-dict-name-on-attention"],
)  # fmt: skip
def test_tensors_are_checked_as_json_is(
    client: TestClient,
    tensors: dict[str, np.ndarray],
    fields: dict[str, Any],
    field: str,
    words: str,
) -> None:
    error = _error(_post_binary(client, "/mask" if "mask" in fields else "/attention", tensors, **fields), 422)  # fmt: skip
    assert error["errors"][0]["field"] == field
    assert words in error["message"]


def _raw(header: dict[str, Any], data: bytes = b"", length: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


F64_ONE = {"dtype": "F64", "shape": [1, 1], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"\x01\x02", "fewer than the 8"),
        (_raw({}, length=2**63), "the header is said to be"),
        (struct.pack("<Q", 3) + b"{{{", "the header is not JSON"),
        (_raw([1, 2]), "the header must be a JSON object"),  # type: ignore[arg-type]
        (_raw({"x": {"dtype": "F64", "shape": [1, 1]}}), "exactly dtype, shape and data_offsets"),
        (_raw({"x": {**F64_ONE, "shape": [1, -1]}}, b"\0" * 8), "its shape must be a list of sizes, whole numbers from 0 to 2^64 − 1 (item 1 is -1)"),
        (_raw({"x": {**F64_ONE, "shape": [2, 1]}}, b"\0" * 8), "takes 16 bytes"),
        (_raw({"x": {**F64_ONE, "data_offsets": [8, 16]}}, b"\0" * 16), "starts at byte 8"),
        (_raw({"x": F64_ONE}, b"\0" * 16), "the tensors end at byte 8"),
        (_raw({"x": F64_ONE, "q": F64_ONE}, b"\0" * 8), "starts at byte 0"),
        (_raw({"__metadata__": {"json": 3}}), "__metadata__ must be an object of strings"),
        (_raw({"__metadata__": {"json": "[1]"}}), 'must hold a JSON object'),
        (_raw({"__metadata__": {"json": "{"}}), "the body is not valid JSON"),
    ],
    ids=["short", "header-too-long", "header-not-json", "header-a-list", "missing-offsets", "negative-size", "size-mismatch", "gap", "trailing-bytes", "overlap", "metadata-not-strings", "metadata-a-list", "metadata-not-json"],
)  # fmt: skip
def test_a_body_that_is_not_safetensors_is_a_400_that_says_why(
    client: TestClient, raw: bytes, words: str
) -> None:
    error = _error(client.post("/attention", content=raw, headers=TO_ST), 400)
    assert words in error["message"]
    assert error["errors"][0]["type"] in ("safetensors_invalid", "json_invalid")


def test_a_dtype_the_service_cannot_read_is_a_422_naming_the_field(client: TestClient) -> None:
    raw = _raw({"x": {"dtype": "F8_E4M3", "shape": [1, 1], "data_offsets": [0, 1]}}, b"\0")
    error = _error(client.post("/attention", content=raw, headers=TO_ST), 422)
    assert error["errors"][0]["field"] == "x"
    assert "F8_E4M3" in error["message"] and "send F64" in error["message"]


def test_a_tensor_name_too_long_is_refused_without_echoing_it(client: TestClient) -> None:
    raw = _raw({"x" * 5000: F64_ONE}, b"\0" * 8)
    error = _error(client.post("/attention", content=raw, headers=TO_ST), 400)
    assert "5000 characters" in error["message"] and len(error["message"]) < 300


# -------------------------------------------------------------------- header defects, bounds


@pytest.fixture(scope="module")
def lenient() -> Iterator[TestClient]:
    """A client that shows a 500 as a status instead of raising the server's exception."""
    with TestClient(create_app(Settings()), raise_server_exceptions=False) as c:
        yield c


def _tensor(shape: Any, offsets: Any = (0, 0), dtype: Any = "F64") -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": list(offsets)}


def _header_text(text: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(text)) + text + data


def _refused(client: TestClient, path: str, raw: bytes, status: int) -> dict[str, Any]:
    """The answer to ``raw``: ``status`` (never 500) in the one JSON error shape."""
    r = client.post(path, content=raw, headers=TO_ST)
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"] == "application/json"
    error = _error(r, status)
    assert set(error["errors"][0]) == {"field", "message", "type", "limit"}
    return error


@pytest.mark.parametrize(
    ("name", "shape", "field", "words"),
    [
        ("x", [2**62, 0], "x", "x is shaped [4611686018427387904, 0], more numbers than a tensor may hold"),
        ("x", [2**63, 0], "x", "x is shaped [9223372036854775808, 0]"),
        ("x", [2**63 - 1, 0], "x", "more numbers than a tensor may hold"),
        ("x", [2**64 - 1, 0], "x", "more numbers than a tensor may hold"),
        ("x", [2**40, 2**40, 0], "x", "at most 2,147,483,647"),
        ("x", [0] * 65, "x", "x is a tensor of 65 dimensions; at most 8"),
        ("x", [0] * 9, "x", "x is a tensor of 9 dimensions; at most 8"),
        ("x", [1] * 100_000, "x", "x is a tensor of 100000 dimensions; at most 8"),
        ("mask.0.matrix", [2**62, 0], "mask[0].matrix", "mask[0].matrix is shaped [4611686018427387904, 0]"),
    ],
    ids=["2^62-by-0", "2^63-by-0", "int64-max-by-0", "uint64-max-by-0", "2^40-2^40-0", "65-dims", "9-dims", "100000-dims", "in-a-mask"],
)  # fmt: skip
def test_a_shape_numpy_cannot_make_is_a_422_naming_the_tensor(
    lenient: TestClient, name: str, shape: list[int], field: str, words: str
) -> None:
    """The format allows any u64 sizes and any number of them; an empty tensor shaped
    [2^62, 0] is a valid file that NumPy cannot make (a 500 before)."""
    path = "/mask" if name.startswith("mask") else "/attention"
    meta = {"__metadata__": {"json": '{"mask": [{"type": "additive"}]}'}} if path == "/mask" else {}  # fmt: skip
    error = _refused(lenient, path, _raw({**meta, name: _tensor(shape)}), 422)
    assert error["errors"][0]["field"] == field
    assert error["errors"][0]["type"] == "value_error"
    assert words in error["message"] and len(error["message"]) < 300


E8 = b"\0" * 8
U64 = "whole numbers from 0 to 2^64 − 1"


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        (_raw({"x": _tensor([2**64, 0])}), "x", f"its shape must be a list of sizes, {U64} (item 0 is 18,446,744,073,709,551,616)"),
        (_header_text(b'{"x": {"dtype": "F64", "shape": [123456789012345678901234567890, 0], "data_offsets": [0, 0]}}'), "x", "(item 0 is an integer of 30 digits)"),
        (_raw({"x": _tensor([1.5], (0, 8))}, E8), "x", "(item 0 is 1.5)"),
        (_raw({"x": _tensor([True], (0, 8))}, E8), "x", "(item 0 is true)"),
        (_raw({"x": _tensor([None], (0, 8))}, E8), "x", "(item 0 is null)"),
        (_raw({"x": _tensor("3", (0, 8))}, E8), "x", "(it is a string)"),
        (_header_text(b'{"x": {"dtype": "F64", "shape": [NaN], "data_offsets": [0, 8]}}', E8), "x", "(item 0 is nan)"),
        (_raw({"x": _tensor([1], (0, -8))}, E8), "x", f"its data_offsets must be two byte offsets, {U64} (item 1 is -8)"),
        (_raw({"x": _tensor([1], (0, 2**70))}, E8), "x", "(item 1 is an integer of 22 digits)"),
        (_raw({"x": _tensor([1], (0, 8, 16))}, E8), "x", "(it has 3 items)"),
        (_raw({"x": _tensor([1], (8, 0))}, E8), "x", 'tensor "x"\'s data_offsets [8, 0] end before they begin'),
        (_raw({"x": _tensor([1], (0, 16))}, E8), "x", 'tensor "x" ends at byte 16 of the data, but the data has 8 bytes'),
        (_raw({"x": _tensor([1], (2**63, 2**63 + 8))}, E8), "x", "ends at byte 9,223,372,036,854,775,816 of the data"),
        (_raw({"x": _tensor([3], (0, 8))}, E8), "x", "is F64 shaped [3], which takes 24 bytes, but its data_offsets span 8"),
        (_raw({"x": _tensor([1], (0, 8)), "q": _tensor([1], (4, 12))}, b"\0" * 12), "q", 'tensor "q" starts at byte 4 of the data, but the one before ends at 8'),
        (_raw({"x": _tensor([1], (0, 8)), "q": _tensor([0], (4, 4))}, E8), "q", 'tensor "q" starts at byte 4'),
        (_raw({"x": _tensor([1], (0, 8), dtype=3)}, E8), "x", 'tensor "x": its dtype must be a string such as "F64"'),
        (_raw({"x": [1, 2]}), "x", 'tensor "x" must have exactly dtype, shape and data_offsets'),
        (_header_text(b'{"x": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}, "x": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}', E8), None, 'the header gives "x" twice in one object'),
        (_header_text(b'{"x": {"dtype": "F64", "dtype": "I8", "shape": [1], "data_offsets": [0, 8]}}', E8), None, 'the header gives "dtype" twice in one object'),
        (_header_text(b'{"x": {"dtype": "F64", "shape": [0], "data_offsets": [0, 0]}, "\xff": 1}'), None, "the header is not UTF-8 text (invalid start byte at byte 63 of it)"),
        (_header_text(b"[" * 100_000 + b"]" * 100_000), None, "the header is nested too deeply"),
        (_header_text(b'{"x": '), None, "the header is not JSON (Expecting value: line 1 column 7 (char 6))"),
        (_header_text(b"3"), None, "the header must be a JSON object"),
        (_raw({"__metadata__": {"json": '{"sentence": "\ud800"}'}}), None, '__metadata__["json"] is not valid Unicode text: it contains a lone surrogate (\\ud800)'),
        (_raw({"__metadata__": ["json"]}), None, "__metadata__ must be an object of strings"),
    ],
    ids=["dim-2^64", "dim-30-digits", "dim-float", "dim-bool", "dim-null", "shape-a-string", "dim-nan", "offset-negative", "offset-2^70", "three-offsets", "end-before-begin", "end-past-data", "begin-past-int64", "size-mismatch", "overlap", "empty-inside-another", "dtype-a-number", "entry-a-list", "duplicate-name", "duplicate-key", "not-utf8", "nested-deeply", "truncated", "header-a-number", "metadata-lone-surrogate", "metadata-a-list"],
)  # fmt: skip
def test_a_header_defect_is_a_400_naming_the_tensor(
    lenient: TestClient, raw: bytes, field: str | None, words: str
) -> None:
    """Every defect of the header is a 400 in the one JSON shape; one about a single tensor's
    entry names its field (never a 500, never the last duplicate silently kept)."""
    error = _refused(lenient, "/attention", raw, 400)
    item = error["errors"][0]
    assert (item["field"], item["type"]) == (field, "safetensors_invalid")
    assert words in error["message"], error["message"]


@pytest.mark.parametrize(
    ("tensors", "fields", "path", "field", "words"),
    [
        ({"heads.1000000.w_q": np.ones((4, 2))}, {"num_heads": 2}, "/multihead", "heads[1000000].w_q", 'tensor "heads[1000000].w_q": 1000000 is not an index of a list here (0 to 4: the list has 0 items in the JSON and the header 5 tensors)'),
        ({"heads.5.w_q": np.ones((4, 2))}, {"num_heads": 2}, "/multihead", "heads[5].w_q", "5 is not an index of a list here (0 to 4"),
        ({"heads.8.w_q": np.ones((4, 2))}, {"num_heads": 2, "heads": [{}] * 3}, "/multihead", "heads[8].w_q", "8 is not an index of a list here (0 to 7: the list has 3 items in the JSON and the header 5 tensors)"),
        ({"heads.4096.w_q": np.ones((4, 2))}, {"num_heads": 2, "heads": [{}] * 4096}, "/multihead", "heads[4096].w_q", "(0 to 4095: a list here has at most 4096 items)"),
        ({"heads.².w_q": np.ones((4, 2))}, {"num_heads": 2}, "/multihead", "heads", "heads: input should be a valid list"),
        ({"heads.0.².w_q": np.ones((4, 2))}, {"num_heads": 2, "heads": [[]]}, "/multihead", "heads[0].².w_q", "² is not an index of a list here (0 to 4: a list index is a whole number)"),
        ({"mask.²": np.ones((3, 3))}, {"mask": {"type": "additive"}}, "/mask", "mask[0].matrix", "mask[0].matrix is required"),
        ({"mask.matrix": np.ones((3, 3)), "mask.0.matrix": np.ones((3, 3))}, {"mask": {"type": "additive"}}, "/mask", "mask.matrix", "mask.matrix is given twice: by two tensor names"),
    ],
    ids=["index-a-million", "index-past-the-tensors", "index-past-json-and-tensors", "index-past-the-cap", "superscript-digit", "superscript-digit-in-a-list", "superscript-digit-in-an-object", "one-place-two-names"],
)  # fmt: skip
def test_a_tensor_name_past_what_the_request_can_mean_is_a_422(
    lenient: TestClient,
    tensors: dict[str, np.ndarray],
    fields: dict[str, Any],
    path: str,
    field: str,
    words: str,
) -> None:
    """A list index beyond the items the JSON gives plus one per tensor (and below
    MAX_INDEX) is refused before any list is made; so is a place two tensors name."""
    raw = save({**_weights(), **tensors}, metadata={"json": json.dumps(fields)})
    error = _refused(lenient, path, raw, 422)
    assert error["errors"][0]["field"] == field
    assert words in error["message"], error["message"]


def test_more_tensors_than_a_request_takes_is_a_413_before_the_header_is_read(
    lenient: TestClient,
) -> None:
    empty = b'{"dtype": "F64", "shape": [0], "data_offsets": [0, 0]}'
    over = b"{" + b",".join(b'"t%d": %s' % (i, empty) for i in range(MAX_TENSORS + 1)) + b"}"
    same = b"{" + b",".join(b'"x": ' + empty for _ in range(MAX_TENSORS + 1)) + b"}"
    plain = b"{" + b",".join(b'"x": 1' for _ in range(MAX_TENSORS + 1)) + b"}"
    for text in (over, same, plain):  # distinct names, one name repeated, no objects at all
        error = _refused(lenient, "/attention", _header_text(text), 413)
        item = error["errors"][0]
        assert (item["type"], item["limit"]) == ("limit_exceeded", MAX_TENSORS)
        assert f"more than {MAX_TENSORS:,} tensors" in item["message"]
    at_limit = b"{" + b",".join(b'"t%d": %s' % (i, empty) for i in range(MAX_TENSORS)) + b"}"
    error = _refused(lenient, "/attention", _header_text(at_limit), 422)
    assert error["errors"][0]["field"] == "t0"  # read to the end, then its fields are checked


def test_a_large_safetensors_body_is_checked_the_same_in_the_parser_process() -> None:
    """Bodies over the inline size go to the parser process: the same request, shapes and
    cost, and the same errors, as when checked in process."""
    rng = np.random.default_rng(5)
    good = save({**_weights(), "x": rng.normal(size=(600, 4))}, metadata={"json": "{}"})
    bad = _raw({"__metadata__": {"json": json.dumps({"sentence": "a " * 10_000})}, "x": _tensor([2**62, 0])})  # fmt: skip
    assert min(len(good), len(bad)) > INLINE_BODY_BYTES
    parser = Parser(1)
    try:
        here = checked(good, "attention", Settings(), "safetensors")
        there = asyncio.run(parser.check(good, "attention", Settings(), "safetensors"))
        assert (there.shapes, there.numbers) == (here.shapes, here.numbers)
        np.testing.assert_array_equal(there.req.x, here.req.x)
        with pytest.raises(RequestError) as here_error:
            checked(bad, "attention", Settings(), "safetensors")
        with pytest.raises(RequestError) as there_error:
            asyncio.run(parser.check(bad, "attention", Settings(), "safetensors"))
        assert there_error.value.status == here_error.value.status == 422
        assert there_error.value.items == here_error.value.items
    finally:
        parser.close()


# ------------------------------------------------------------------------------------ Accept


@pytest.mark.parametrize(
    ("accept", "form"),
    [
        (None, "json"),
        ("*/*", "json"),
        ("application/json", "json"),
        (ST, "safetensors"),
        ("application/*", "json"),
        (f"application/json;q=0.5, {ST}", "safetensors"),
        (f"{ST}, application/json", "safetensors"),
        (f"application/json, {ST}", "json"),
        (f"{ST};q=0, */*", "json"),
        (f"*/*;q=0.1, {ST};q=0.2", "safetensors"),
        ("text/html, application/xhtml+xml", None),
        (f"{ST};q=0", None),
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "json"),
        (f"{ST};q=x", None),
    ],
)
def test_accept_picks_the_answers_form(accept: str | None, form: str | None) -> None:
    assert negotiate(accept) == form


def test_an_accept_naming_neither_form_is_a_406_before_any_work(client: TestClient) -> None:
    body = value(ATTENTION_EXAMPLES["batman"])
    r = client.post("/attention", json=body, headers={"Accept": "text/csv"})
    error = _error(r, 406)
    assert error["errors"][0]["type"] == "not_acceptable"
    assert "text/csv" in error["message"] and ST in error["message"]


def test_errors_are_json_whatever_the_accept(client: TestClient) -> None:
    r = client.post("/attention", json={"x": [[1.0]]}, headers=FROM_ST)
    assert r.headers["content-type"] == "application/json"
    _error(r, 422)


def test_swagger_documents_both_media_types(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path in ("/attention", "/mask", "/multihead"):
        post = spec["paths"][path]["post"]
        assert set(post["requestBody"]["content"]) == {"application/json", ST}
        assert set(post["responses"]["200"]["content"]) == {"application/json", ST}
        assert "406" in post["responses"]
