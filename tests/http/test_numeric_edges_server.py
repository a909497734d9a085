"""End to end, on the real server: the adversarial probe's out-of-range numbers (issue 39, M2).

A window ``left`` or a chunk ``size`` of 2^63 and a YaRN ``beta_fast`` of 1e308 were a plain-text
500 without a request id. A window or chunk wider than the sequence is no limit, and YaRN's ramp
has a limit there, so these compute (equal to the request written without the edge value); the
numbers no answer can hold are a 422 in the one error shape, naming the field, with
X-Request-ID."""

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from harness.live import start_server, stop_server
from service.wire import examples as ex

pytestmark = pytest.mark.e2e

_QKV = {k: ex.CAUSAL_FOUR_TOKENS[k] for k in ("tokens", "q", "k", "v")}
_YARN = ex.YARN_PAST_THE_CONTEXT


def _yarn(**scaling: Any) -> dict[str, Any]:
    rope = _YARN["rope"]
    return {**_YARN, "rope": {**rope, "scaling": {**rope["scaling"], **scaling}}}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, base = start_server(workers=1)
    yield base
    stop_server(proc)


def post(base: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """POST a JSON body; (status, headers with lower-case names, raw body)."""
    req = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


# the probe's own numbers: no limit, and YaRN's limit, equal to the plain request's answer
PROBE = [
    ("/mask", {**_QKV, "mask": {"type": "window", "left": 2**63, "right": 0}},
     {**_QKV, "mask": {"type": "causal"}}),
    ("/mask", {**_QKV, "mask": {"type": "chunked", "size": 2**63}},
     {**_QKV, "mask": {"type": "causal"}}),
    ("/attention", _yarn(beta_fast=1e308), _yarn(beta_fast=1e300)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "edge", "plain"), PROBE, ids=["window-left-2^63", "chunked-2^63", "yarn-beta-1e308"]
)
def test_the_probes_numbers_compute(
    server: str, path: str, edge: dict[str, Any], plain: dict[str, Any]
) -> None:
    status, headers, raw = post(server, path, edge)
    assert status == 200, raw[:300]
    assert headers.get("x-request-id")
    _, _, want = post(server, path, plain)
    np.testing.assert_allclose(json.loads(raw)["weights"], json.loads(want)["weights"], atol=1e-12)


# sizes no answer can hold: each a 422 naming its field
REFUSED = [
    ("/attention", _yarn(original_max_position=2**63), "rope.scaling.original_max_position"),
    ("/attention", _yarn(factor=5e-324), "rope.scaling"),
    ("/attention", _yarn(factor=1e308, mscale=1e308, mscale_all_dim=1), "rope.scaling"),
    ("/attention", {**_QKV, "rope": True, "positions": [0, 1, 2, 2**63]}, "positions[3]"),
    ("/attention", {**_QKV, "alibi": {"slopes": [1e300]}, "positions": [0, 1, 2, 10**15]},
     "alibi.slopes"),
    ("/attention", {**_QKV, "temperature": {"floor_scale": 5e-324}}, "temperature"),
    ("/attention", {**_QKV, "relative_bias": {"table": [1, 2, 3, 4], "max_distance": 2**63}},
     "relative_bias.max_distance"),
    ("/mask", {**_QKV, "mask": [{"type": "additive", "matrix": [[1e308] * 4] * 4}] * 2},
     "mask[1].matrix"),
    ("/mask", {**_QKV, "mask": {"type": "window", "left": -(2**63) - 1}}, "mask[0].left"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "field"), REFUSED, ids=[f for _, _, f in REFUSED])
def test_numbers_out_of_range_are_a_422_naming_the_field(
    server: str, path: str, body: dict[str, Any], field: str
) -> None:
    status, headers, raw = post(server, path, body)
    assert status == 422, raw[:300]
    assert headers.get("x-request-id")
    assert headers["content-type"].startswith("application/json")
    answer = json.loads(raw)
    assert answer["message"] and answer["errors"][0]["message"]
    assert answer["errors"][0]["field"] == field, answer
