"""The streaming encoder and the one-call encoder write the same JSON, and it is the data."""

import json
from typing import Any

import numpy as np
import pytest

from service.wire import json_out as enc


def body() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    big = rng.normal(size=(300, 250))
    big[7, 9] = -np.inf
    heads = rng.normal(size=(2, 3, 40, 50))
    return {
        "big": big,
        "view": heads[:, 1],  # not contiguous
        "batched": rng.normal(size=(2, 200, 300)),
        "huge_rows": rng.normal(size=(2, 40_000)),
        "mask": big > 0,
        "heads": [{"w": heads[0, i]} for i in range(3)],
        "summary": [{"token": "a", "top_weight": 0.123456789}],
        "scale": 0.70710678,
        "grad_sinks": np.array(-2.2825235861486437),  # 0-d: a number, as the parameter is
        "steps": [{"name": "scores", "shape": [3, 3]}],
    }


@pytest.mark.parametrize("decimals", [None, 0, 3], ids=["exact", "decimals-0", "decimals-3"])
def test_streaming_equals_one_call_and_round_trips(decimals: int | None) -> None:
    b = body()
    streamed = b"".join(enc.encode(body(), decimals))
    assert streamed == enc.encode_whole(b, decimals)
    back = json.loads(streamed)
    big = np.array([[np.nan if v is None else v for v in row] for row in back["big"]])
    expected = b["big"] if decimals is None else np.round(b["big"], decimals)
    np.testing.assert_array_equal(big, np.where(np.isinf(expected), np.nan, expected))
    np.testing.assert_array_equal(np.array(back["batched"]).shape, (2, 200, 300))
    assert back["mask"][0] == (b["big"][0] > 0).tolist()
    sink = float(b["grad_sinks"]) if decimals is None else round(float(b["grad_sinks"]), decimals)
    assert back["grad_sinks"] == sink


def test_chunks_are_bounded() -> None:
    chunks = list(enc.encode(body()))
    assert len(chunks) > 1
    block = 25 * enc.BLOCK_NUMBERS  # one orjson call's JSON: ≤ 24 characters and a comma a number
    assert max(len(c) for c in chunks) < 2 * max(enc.CHUNK_BYTES, block)


def test_each_value_is_dropped_once_written() -> None:
    """The streamed body is consumed key by key, so its arrays can be freed while the rest of
    the answer is still being written."""
    import weakref

    b = body()
    big = weakref.ref(b["big"])
    written: list[str] = []
    chunks = enc.encode(b, None, written.append)
    seen = b""
    while big() is not None:  # the first chunks hold "big" (the first key)
        seen += next(chunks)
    assert written[0] == "big" and "big" not in b  # dropped before the rest is written
    seen += b"".join(chunks)
    assert written == list(body()) and b == {}
    assert seen == enc.encode_whole(body())
