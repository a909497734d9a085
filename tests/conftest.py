"""Shared fixtures: the ASGI client and a numeric comparison for nested JSON."""

import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from fastapi.testclient import TestClient

from harness.replicas import nginx_binary
from service.config import Settings
from service.http.app import create_app
from tests.browser.support import CHROMIUM

TOL = 1e-12


# System programs some tests need: what `make test` cannot install with pip. A test that needs
# one skips with "<program> is not installed" in its reason (or fails under its REQUIRE_ switch).
SYSTEM_PROGRAMS: dict[str, tuple[str, str]] = {
    "chromium": ("the browser tests", "sudo apt-get install -y chromium"),
    "nginx": ("the replicas tests", "sudo apt-get install -y nginx"),
    "kubectl": (
        "the Kubernetes manifest tests",
        "see https://kubernetes.io/docs/tasks/tools/ (kubectl ≥ 1.30 on PATH)",
    ),
}


@dataclass(frozen=True)
class Program:
    """How a test marked ``@pytest.mark.needs(name)`` finds a system program, and the switch
    that turns its absence from a skip into a failure."""

    find: Callable[[], str | None]  # its path, or None
    require: str  # the environment variable CI sets


NEEDED: dict[str, Program] = {
    "chromium": Program(lambda: CHROMIUM if Path(CHROMIUM).exists() else None, "REQUIRE_BROWSER"),
    "nginx": Program(nginx_binary, "REQUIRE_NGINX"),
    "kubectl": Program(lambda: shutil.which("kubectl"), "REQUIRE_KUBECTL"),
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(program): skipped (or failed under REQUIRE_...) without the program"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``needs(program)`` is skipped before any of its fixtures is set up,
    whatever their scope (a module-scoped fixture that starts nginx would otherwise run, and
    fail, before a function-scoped check could skip): "<program> is not installed", with the
    command that installs it, or a failure when CI's REQUIRE_ switch is set."""
    for mark in item.iter_markers("needs"):
        for name in mark.args:
            program = NEEDED[name]
            if program.find() is not None:
                continue
            why = f"{name} is not installed ({SYSTEM_PROGRAMS[name][1]})"
            if os.environ.get(program.require):
                pytest.fail(f"{why}, and {program.require} is set", pytrace=False)
            pytest.skip(why)


def skipped_for_programs(reasons: list[str]) -> dict[str, int]:
    """How many skips each missing system program caused, from the skips' reasons."""
    counts: dict[str, int] = {}
    for reason in reasons:
        low = reason.lower()
        for program in SYSTEM_PROGRAMS:
            if program in low and "not installed" in low:
                counts[program] = counts.get(program, 0) + 1
    return counts


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which tests were skipped for a missing system program, and how to enable them."""
    reasons = [
        str(getattr(r, "longrepr", ("", "", ""))[-1])
        for r in terminalreporter.stats.get("skipped", [])
    ]
    counts = skipped_for_programs(reasons)
    if not counts:
        return
    terminalreporter.section("skipped: system programs not installed")
    for program, n in counts.items():
        what, command = SYSTEM_PROGRAMS[program]
        terminalreporter.write_line(f"{n} of {what} need {program}: {command}")


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
