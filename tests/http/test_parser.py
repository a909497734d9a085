"""Large bodies parse in a separate process: the answers (requests, shapes, costs and errors)
are the same as parsing in process."""

import asyncio
import json

import numpy as np
import pytest

from service.config import Settings
from service.http.doors import checked
from service.http.parser import Parser
from service.trace import Admitted
from service.wire.errors import RequestError

rng = np.random.default_rng(0)
X = rng.normal(size=(600, 16)).tolist()
W = rng.normal(size=(16, 8)).tolist()


def _both(body: dict[str, object], route: str, settings: Settings) -> tuple[object, object]:
    raw = json.dumps(body).encode()
    parser = Parser(1)
    try:
        here: object
        try:
            here = checked(raw, route, settings)
        except RequestError as err:
            here = (err.status, [i.model_dump() for i in err.items])
        there: object
        try:
            there = asyncio.run(parser.check(raw, route, settings))
        except RequestError as err:
            there = (err.status, [i.model_dump() for i in err.items])
    finally:
        parser.close()
    return here, there


def test_a_valid_body_gives_the_same_request_shapes_and_cost() -> None:
    body = {"x": X, "w_q": W, "w_k": W, "w_v": W, "mask": {"type": "causal"}}
    here, there = _both(body, "mask", Settings())
    assert isinstance(here, Admitted) and isinstance(there, Admitted)
    assert (there.endpoint, there.shapes, there.numbers) == (
        here.endpoint,
        here.shapes,
        here.numbers,
    )
    np.testing.assert_array_equal(there.req.x, here.req.x)
    assert type(there.req) is type(here.req) and there.req.mask == here.req.mask


@pytest.mark.parametrize(
    ("body", "settings"),
    [
        ({"x": X, "w_q": W, "w_k": W, "w_v": [[1.0, "a"]] * 16}, Settings()),
        ({"x": X, "w_q": W, "w_k": W}, Settings()),
        ({"x": X, "w_q": W, "w_k": W, "w_v": W}, Settings(max_result_numbers=1000)),
    ],
    ids=["a-bad-number-422", "a-rule-422", "a-limit-413"],
)
def test_errors_are_the_same_status_fields_and_messages(
    body: dict[str, object], settings: Settings
) -> None:
    here, there = _both(body, "attention", settings)
    assert there == here and isinstance(here, tuple) and here[0] in (413, 422)


def test_a_body_that_is_not_json_is_400_from_the_parser_too() -> None:
    parser = Parser(1)
    try:
        with pytest.raises(RequestError) as err:
            asyncio.run(parser.check(b'{"x": [[1,' + b" " * 20_000, "attention", Settings()))
        assert err.value.status == 400 and "not valid JSON" in str(err.value)
    finally:
        parser.close()
