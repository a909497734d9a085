"""Odd input that once gave a 500 or the wrong answer (issue 12): lone surrogates, lists nested
hundreds deep, booleans taken as numbers, names and numbers too long to echo, layer norm's eps.
Each gets a short 422 that names the field."""

import http.client
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
from fastapi.testclient import TestClient

from harness.live import start_server
from service.http.routes import INLINE_BODY_BYTES, THREAD_BODY_BYTES
from service.wire import examples as ex

JSON = {"content-type": "application/json"}
DIRECT = {"q": [[1.0, 0.0]], "k": [[1.0, 0.0]], "v": [[1.0]]}
MASK = {"type": "causal"}
MULTI = {"x": [[1.0, 0.0], [0.0, 1.0]], "num_heads": 1, "seed": 0}
SURROGATE = "\ud800"  # json.dumps writes it as the JSON escape "\ud800", with no pair
LONG = "n" * (1 << 20)  # a 1 MiB name
DIGITS = "9" * 10_000  # more digits than Python reads as an int (4300)


def send(client: TestClient, path: str, raw: str | bytes) -> Any:
    """POST a raw JSON body; every answer here is JSON with an X-Request-ID."""
    r = client.post(path, content=raw, headers=JSON)
    assert r.headers["content-type"] == "application/json", r.text[:300]
    assert r.headers.get("x-request-id")
    return r


def refused(client: TestClient, path: str, raw: str | bytes, status: int = 422) -> dict[str, Any]:
    """POST a raw body, check it is refused with ``status`` and a short answer, return the
    answer's first error."""
    r = send(client, path, raw)
    assert r.status_code == status, r.text[:500]
    assert len(r.content) < 1500, f"{len(r.content)} bytes"
    body = r.json()
    assert body["message"] == body["errors"][0]["message"]
    return body["errors"][0]  # type: ignore[no-any-return]


# ---- 1. lone surrogates: 422 naming the field, never a 500 or half an answer ----------------

UNICODE = "is not valid Unicode text: it contains a lone surrogate (\\ud800) at character"

SURROGATES: list[tuple[str, str, dict[str, Any], str | None, str]] = [
    (
        "token",
        "/attention",
        {**ex.I_AM_BATMAN, "tokens": ["I", "am", f"Bat{SURROGATE}"]},
        "tokens[2]",
        f"tokens[2] {UNICODE} 3",
    ),
    (
        "context_token",
        "/attention",
        {"seed": 0, "d_model": 2, "seq_len": 2, "context_tokens": ["a", SURROGATE]},
        "context_tokens[1]",
        f"context_tokens[1] {UNICODE} 0",
    ),
    (
        "sentence",
        "/attention",
        {"seed": 0, "d_model": 2, "sentence": f"a b {SURROGATE}c"},
        "sentence",
        f"sentence {UNICODE} 4",
    ),
    (
        "include",
        "/attention",
        {**DIRECT, "include": ["q", SURROGATE]},
        "include[1]",
        f"include[1] {UNICODE} 0",
    ),
    (
        "literal",
        "/attention",
        {**DIRECT, "weight_layout": SURROGATE},
        "weight_layout",
        f"weight_layout {UNICODE} 0",
    ),
    (
        "field_name",
        "/attention",
        {**DIRECT, f"x{SURROGATE}": 1},
        None,
        f"the body has a field name that {UNICODE} 1",
    ),
    (
        "mask_field_name",
        "/mask",
        {**DIRECT, "mask": {"type": "causal", SURROGATE: 1}},
        "mask[0]",
        f"mask[0] has a field name that {UNICODE} 0",
    ),
    (
        "mask_type",
        "/mask",
        {**DIRECT, "mask": {"type": SURROGATE}},
        "mask[0]",
        'mask[0].type is "\\ud800", which is not one of causal, padding',
    ),
    (
        "positional_encoding",
        "/multihead",
        {**MULTI, "positional_encoding": SURROGATE},
        "positional_encoding",
        'positional_encoding must be "sinusoidal" or a matrix [L][d_model], got "\\ud800"',
    ),
    (
        "head_field_name",
        "/multihead",
        {**MULTI, "heads": [{SURROGATE: 1}]},
        "heads[0]",
        f"heads[0] has a field name that {UNICODE} 0",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "field", "message"),
    [s[1:] for s in SURROGATES],
    ids=[s[0] for s in SURROGATES],
)
def test_a_lone_surrogate_is_422_naming_the_field(
    client: TestClient, path: str, body: dict[str, Any], field: str | None, message: str
) -> None:
    error = refused(client, path, json.dumps(body))
    assert error["field"] == field
    assert error["message"].startswith(message), error["message"]


def _large_with_a_bad_token(label_chars: int) -> dict[str, Any]:
    """A generated request whose answer is streamed (300 × 300 scores), with one bad token;
    labels of ``label_chars`` characters make the body small (parsed on the event loop),
    medium (in a thread) or large (in the parser process)."""
    tokens = [f"t{i}".ljust(label_chars, "_") for i in range(300)]
    tokens[150] = SURROGATE
    return {"seed": 0, "d_model": 4, "d_k": 4, "tokens": tokens}


@pytest.mark.parametrize(
    "label_chars", [2, 80, 4000], ids=["small-body", "thread", "parser-process"]
)
def test_a_lone_surrogate_in_a_large_answer_is_422_not_a_cut_200(
    client: TestClient, label_chars: int
) -> None:
    raw = json.dumps(_large_with_a_bad_token(label_chars))
    assert (len(raw) > INLINE_BODY_BYTES) == (label_chars > 2)
    assert (len(raw) > THREAD_BODY_BYTES) == (label_chars > 80)
    error = refused(client, "/attention", raw)
    assert (error["field"], error["type"]) == ("tokens[150]", "value_error")


def test_a_valid_surrogate_pair_is_one_character(client: TestClient) -> None:
    body = {**ex.I_AM_BATMAN, "tokens": ["I", "am", "\U0001f987"], "include": ["summary"]}
    r = send(client, "/attention", json.dumps(body))  # "\ud83e\udd87": a pair, the bat
    assert r.status_code == 200
    assert r.json()["summary"][2]["token"] == "\U0001f987"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, base = start_server()
    yield base
    proc.terminate()
    assert proc.wait(timeout=15) == 0


@pytest.mark.e2e
@pytest.mark.parametrize(
    "label_chars", [2, 80, 4000], ids=["small-body", "thread", "parser-process"]
)
def test_a_lone_surrogate_over_http_is_a_whole_422(server: str, label_chars: int) -> None:
    raw = json.dumps(_large_with_a_bad_token(label_chars)).encode()
    url = urlsplit(server)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
    try:
        conn.request("POST", "/attention", body=raw, headers=JSON)
        r = conn.getresponse()
        data = r.read()  # the whole body: Content-Length bytes, not cut short
        assert r.status == 422
        assert r.getheader("content-type") == "application/json"
        assert r.getheader("x-request-id")
        assert len(data) == int(r.getheader("content-length") or -1)
        assert json.loads(data)["errors"][0]["field"] == "tokens[150]"
    finally:
        conn.close()


# ---- 2. lists nested deeper than the field allows: a short 422, whatever the depth ----------


def _deep(depth: int) -> str:
    """A JSON number inside ``depth`` lists."""
    return "[" * depth + "1" + "]" * depth


def _nest(field: str, lists: str) -> tuple[str, str]:
    """A raw body whose ``field`` holds ``lists`` (JSON text), and the field's name in errors."""
    if field == "matrix":
        return (
            f'{{"q": [[1]], "k": [[1]], "v": [[1]], "mask": {{"type": "boolean", "matrix": {lists}}}}}',
            "mask[0].matrix",
        )
    if field == "additive":
        return (
            f'{{"q": [[1]], "k": [[1]], "v": [[1]], "mask": {{"type": "additive", "matrix": {lists}}}}}',
            "mask[0].matrix",
        )
    if field == "b_q":
        return f'{{"x": [[1]], "w_q": [[1]], "w_k": [[1]], "w_v": [[1]], "b_q": {lists}}}', "b_q"
    return f'{{"q": [[1]], "k": [[1]], "v": [[1]], "{field}": {lists}}}', field


DEPTHS = [5, 200, 900, 1000, 1020]


@pytest.mark.parametrize("depth", DEPTHS, ids=[f"depth-{d}" for d in DEPTHS])
@pytest.mark.parametrize("field", ["q", "x", "matrix", "additive", "b_q"])
def test_lists_nested_too_deep_are_a_short_422(client: TestClient, field: str, depth: int) -> None:
    raw, name = _nest(field, _deep(depth))
    error = refused(client, "/mask" if name.startswith("mask") else "/attention", raw)
    assert error["field"] == name
    assert error["message"].startswith(f"{name} must be ")
    assert error["message"].endswith(f", but it is nested {depth} level(s) deep")


@pytest.mark.parametrize("depth", DEPTHS, ids=[f"depth-{d}" for d in DEPTHS])
def test_lists_nested_too_deep_in_a_later_row_are_a_short_422(
    client: TestClient, depth: int
) -> None:
    raw, _ = _nest("q", f"[[1], {_deep(depth)}]")
    error = refused(client, "/attention", raw)
    assert error == {
        "field": "q",
        "message": "q row 1, column 0 is a list, not a number",
        "type": "value_error",
        "limit": None,
    }


def test_lists_nested_too_deep_through_the_json_fallback_are_a_short_422(
    client: TestClient,
) -> None:
    raw, _ = _nest("q", _deep(600))
    error = refused(client, "/attention", raw.replace('"v": [[1]]', '"v": [[NaN]]'))
    assert error["field"] == "q" and error["message"].endswith("nested 600 level(s) deep")


def test_nesting_beyond_json_s_limit_stays_a_400(client: TestClient) -> None:
    raw, _ = _nest("q", _deep(5000))
    error = refused(client, "/attention", raw, status=400)
    assert (
        error["message"] == "the body is not valid JSON: nested too deeply (more than 1000 levels)"
    )


# ---- 3. booleans are not numbers -------------------------------------------------------------

BOOLEANS: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("in_q", "/attention", {**DIRECT, "q": [[1.0, True]]}, "q", "q row 0, column 1 is true, not a number"),
    ("only_booleans", "/attention", {**DIRECT, "q": [[True, False]]}, "q", "q row 0, column 0 is true, not a number"),
    ("false_in_batch", "/attention", {**DIRECT, "q": [[[1.0, 2.0]], [[0.5, False]]]}, "q", "q item 1 row 0, column 1 is false, not a number"),
    ("in_bias", "/attention", {"x": [[1.0]], "w_q": [[1.0]], "w_k": [[1.0]], "w_v": [[1.0]], "b_v": [True]}, "b_v", "b_v entry 0 is true, not a number"),
    ("in_weights", "/attention", {"x": [[1.0]], "w_q": [[True]], "w_k": [[1.0]], "w_v": [[1.0]]}, "w_q", "w_q row 0, column 0 is true, not a number"),
    ("in_additive_mask", "/mask", {**DIRECT, "mask": {"type": "additive", "matrix": [[True]]}}, "mask[0].matrix", "mask[0].matrix row 0, column 0 is true, not a number or null"),
    ("in_positional", "/multihead", {**MULTI, "positional_encoding": [[1, 0], [0, True]]}, "positional_encoding", "positional_encoding row 1, column 1 is true, not a number"),
    ("decimals", "/attention", {**DIRECT, "decimals": True}, "decimals", "decimals: input should be a valid integer"),
    ("seq_len", "/attention", {"seed": 0, "d_model": 2, "seq_len": True}, "seq_len", "seq_len: input should be a valid integer"),
    ("d_model", "/attention", {"seed": 0, "d_model": True, "seq_len": 2}, "d_model", "d_model: input should be a valid integer"),
    ("d_k", "/attention", {"seed": 0, "d_model": 2, "seq_len": 2, "d_k": True}, "d_k", "d_k: input should be a valid integer"),
    ("d_v", "/attention", {"seed": 0, "d_model": 2, "seq_len": 2, "d_v": False}, "d_v", "d_v: input should be a valid integer"),
    ("seed", "/attention", {"seed": True, "d_model": 2, "seq_len": 2}, "seed", "seed: input should be a valid integer"),
    ("scale", "/attention", {**DIRECT, "scale": True}, "scale", "scale: input should be a valid number"),
    ("num_heads", "/multihead", {**MULTI, "num_heads": True}, "num_heads", "num_heads: input should be a valid integer"),
    ("num_kv_heads", "/multihead", {**MULTI, "num_kv_heads": True}, "num_kv_heads", "num_kv_heads: input should be a valid integer"),
    ("eps", "/multihead", {**MULTI, "layer_norm": {"eps": True}}, "layer_norm.eps", "layer_norm.eps: input should be a valid number"),
    ("window_left", "/mask", {**DIRECT, "mask": {"type": "window", "left": True}}, "mask[0].left", "mask[0].left: input should be a valid integer"),
    ("key_lengths", "/mask", {**DIRECT, "mask": {"type": "padding", "key_lengths": True}}, "mask[0].key_lengths", "mask[0].key_lengths: input should be a valid integer"),
    ("query_lengths_item", "/mask", {**DIRECT, "mask": {"type": "padding", "query_lengths": [1, True]}}, "mask[0].query_lengths[1]", "mask[0].query_lengths[1]: input should be a valid integer"),
    ("string_scale", "/attention", {**DIRECT, "scale": "0.5"}, "scale", "scale: input should be a valid number"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "field", "message"),
    [b[1:] for b in BOOLEANS],
    ids=[b[0] for b in BOOLEANS],
)
def test_a_boolean_where_a_number_belongs_is_422(
    client: TestClient, path: str, body: dict[str, Any], field: str, message: str
) -> None:
    error = refused(client, path, json.dumps(body))
    assert (error["field"], error["message"]) == (field, message)


ACCEPTED: list[tuple[str, str, dict[str, Any]]] = [
    ("boolean_mask", "/mask", {"q": [[1, 0], [0, 1]], "k": [[1, 0], [0, 1]], "v": [[1], [2]], "mask": {"type": "boolean", "matrix": [[True, False], [1, 0]]}}),
    ("causal_and_padding", "/mask", {**DIRECT, "mask": [MASK, {"type": "padding", "key_lengths": 1}]}),
    ("residual_and_layer_norm", "/multihead", {**MULTI, "residual": True, "layer_norm": True}),
    ("integers_as_floats", "/multihead", {**MULTI, "scale": 1, "layer_norm": {"eps": 1}}),
    ("zeros_and_ones", "/attention", {"q": [[1, 0], [0, 1]], "k": [[0, 1], [1, 0]], "v": [[1], [0]], "decimals": 0}),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body"), [a[1:] for a in ACCEPTED], ids=[a[0] for a in ACCEPTED])
def test_booleans_where_they_belong_and_numbers_stay_accepted(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    r = send(client, path, json.dumps(body))
    assert r.status_code == 200, r.text[:500]


def test_the_openapi_still_says_number_and_integer(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    request = schemas["MultiheadRequest"]["properties"]
    assert request["decimals"]["anyOf"][0] == {"type": "integer", "minimum": 0, "maximum": 15}
    assert request["num_heads"]["anyOf"][0] == {"type": "integer", "minimum": 1}
    assert request["scale"]["anyOf"][0] == {"type": "number"}
    assert request["layer_norm"]["anyOf"] == [
        {"type": "boolean"},
        {"$ref": "#/components/schemas/LayerNormOptions"},
    ]
    assert schemas["LayerNormOptions"]["properties"]["eps"]["type"] == "number"
    assert schemas["PaddingMask"]["properties"]["key_lengths"]["anyOf"] == [
        {"type": "integer"},
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 4096},
        {"type": "null"},
    ]
    assert schemas["AttentionRequest"]["properties"]["q"]["anyOf"][0]["items"]["items"] == {
        "type": "number"
    }


# ---- 4. names and numbers too long to echo ---------------------------------------------------

CUT = "n" * 64 + "…"

LONG_NAMES: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("top_level", "/attention", {**DIRECT, LONG: 1}, CUT, f"{CUT} is not a field of this endpoint (check the spelling; see /docs)"),
    ("in_a_mask", "/mask", {**DIRECT, "mask": {"type": "causal", LONG: 1}}, f"mask[0].{CUT}", f"mask[0].{CUT} is not a field of this endpoint (check the spelling; see /docs)"),
    ("in_layer_norm", "/multihead", {**MULTI, "layer_norm": {LONG: 1}}, f"layer_norm.{CUT}", f"layer_norm.{CUT} is not a field of this endpoint (check the spelling; see /docs)"),
    ("mask_type", "/mask", {**DIRECT, "mask": {"type": LONG}}, "mask[0]", f'mask[0].type is "{CUT}", which is not one of causal, padding, window, chunked, boolean, additive'),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "field", "message"),
    [n[1:] for n in LONG_NAMES],
    ids=[n[0] for n in LONG_NAMES],
)
def test_a_long_name_is_echoed_as_a_short_excerpt(
    client: TestClient, path: str, body: dict[str, Any], field: str, message: str
) -> None:
    error = refused(client, path, json.dumps(body))
    assert (error["field"], error["message"]) == (field, message)


TOO_MANY = "the number has too many digits (10000; at most 4300)"

HUGE_INTEGERS: list[tuple[str, str, str, str, str]] = [
    ("seq_len", "/attention", f'{{"seed": 0, "d_model": 2, "seq_len": {DIGITS}}}', "seq_len", f"seq_len: {TOO_MANY}"),
    ("negative_seed", "/attention", f'{{"seed": -{DIGITS}, "d_model": 2, "seq_len": 2}}', "seed", f"seed: {TOO_MANY}"),
    ("scale", "/attention", f'{{"q": [[1]], "k": [[1]], "v": [[1]], "scale": {DIGITS}}}', "scale", f"scale: {TOO_MANY}"),
    ("in_q", "/attention", f'{{"q": [[1, {DIGITS}]], "k": [[1, 2]], "v": [[1]]}}', "q", f"q row 0, column 1: {TOO_MANY}"),
    ("in_additive_mask", "/mask", f'{{"q": [[1]], "k": [[1]], "v": [[1]], "mask": {{"type": "additive", "matrix": [[{DIGITS}]]}}}}', "mask[0].matrix", f"mask[0].matrix row 0, column 0: {TOO_MANY}"),
    ("in_key_lengths", "/mask", f'{{"q": [[1]], "k": [[1]], "v": [[1]], "mask": {{"type": "padding", "key_lengths": [{DIGITS}]}}}}', "mask[0].key_lengths[0]", f"mask[0].key_lengths[0]: {TOO_MANY}"),
]  # fmt: skip


@pytest.mark.parametrize("also_nan", [False, True], ids=["orjson-first", "json-fallback"])
@pytest.mark.parametrize(
    ("path", "raw", "field", "message"),
    [h[1:] for h in HUGE_INTEGERS],
    ids=[h[0] for h in HUGE_INTEGERS],
)
def test_an_integer_of_ten_thousand_digits_is_422_naming_the_field(
    client: TestClient, path: str, raw: str, field: str, message: str, also_nan: bool
) -> None:
    if also_nan:  # a NaN elsewhere sends the whole body to Python's json at once
        raw = raw[:-1] + ', "fully_masked_rows": NaN}'
    r = send(client, path, raw)
    assert r.status_code == 422 and "set_int_max_str_digits" not in r.text
    assert (field, message) in [(e["field"], e["message"]) for e in r.json()["errors"]]


def test_an_integer_of_ten_thousand_digits_in_a_large_body_is_422(client: TestClient) -> None:
    rows = ", ".join(["[1, 2]"] * 200_000)  # over 1 MiB: parsed in the parser process
    raw = f'{{"q": [{rows}, [3, {DIGITS}]], "k": [[1, 2]], "v": [[1]]}}'
    assert len(raw) > THREAD_BODY_BYTES
    error = refused(client, "/attention", raw)
    assert (error["field"], error["message"]) == ("q", f"q row 200000, column 1: {TOO_MANY}")


# ---- 5. layer norm's eps ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layer_norm", "field", "message"),
    [
        ({"eps": 0}, "layer_norm.eps", "layer_norm.eps: input should be greater than 0"),
        ({"eps": -1e-5}, "layer_norm.eps", "layer_norm.eps: input should be greater than 0"),
        ({"eps": "small"}, "layer_norm.eps", "layer_norm.eps: input should be a valid number"),
        ({"gamma": [1, True]}, "layer_norm.gamma", "layer_norm.gamma entry 1 is true, not a number"),
        ("yes please", "layer_norm", "layer_norm: input should be a valid boolean, unable to interpret input"),
    ],
    ids=["zero", "negative", "string", "gamma", "not-an-object"],
)  # fmt: skip
def test_layer_norm_errors_name_the_option(
    client: TestClient, layer_norm: Any, field: str, message: str
) -> None:
    error = refused(client, "/multihead", json.dumps({**MULTI, "layer_norm": layer_norm}))
    assert (error["field"], error["message"]) == (field, message)


def test_a_tiny_eps_on_a_constant_row_gives_zeros_not_nan(client: TestClient) -> None:
    body = {"x": [[3.0, 3.0], [-1.0, -1.0]], "num_heads": 1, "layer_norm": {"eps": 1e-300}}
    body |= {"w_q": [[1, 0], [0, 1]], "w_k": [[1, 0], [0, 1]], "w_v": [[1, 0], [0, 1]]}
    r = send(client, "/multihead", json.dumps({**body, "include": ["layer_norm"]}))
    assert r.status_code == 200, r.text
    assert np.array(r.json()["layer_norm"]).tolist() == [[0.0, 0.0], [0.0, 0.0]]
