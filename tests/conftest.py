"""Shared fixtures: the ASGI client and a numeric comparison for nested JSON."""

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient

from service.api.app import create_app
from service.config import Settings

TOL = 1e-12


@pytest.fixture(scope="session")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings())) as c:
        yield c


def assert_close(actual: Any, expected: Any, path: str = "$", tol: float = TOL) -> None:
    """Compare nested JSON: numbers to ``tol`` (relative and absolute), None (−∞) exactly."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected an object"
        for key, value in expected.items():
            assert key in actual, f"{path}.{key} missing from the response"
            assert_close(actual[key], value, f"{path}.{key}", tol)
    elif isinstance(expected, list) and expected and isinstance(expected[0], dict):
        assert len(actual) == len(expected), (
            f"{path}: {len(actual)} items, expected {len(expected)}"
        )
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_close(a, e, f"{path}[{i}]", tol)
    elif isinstance(expected, list):
        exp = np.array(expected, dtype=object)
        act = np.array(actual, dtype=object)
        assert act.shape == exp.shape, f"{path}: shape {act.shape}, expected {exp.shape}"
        exp_null = exp == None  # noqa: E711 - elementwise
        act_null = act == None  # noqa: E711
        assert (exp_null == act_null).all(), f"{path}: null (−∞) entries differ"
        np.testing.assert_allclose(
            act[~act_null].astype(float),
            exp[~exp_null].astype(float),
            rtol=tol,
            atol=tol,
            err_msg=path,
        )
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"
