"""Compare with numbers as users have them: printed (API.md, "Numbers as users have them",
printed numbers). The caller's numbers are made here as a student makes them — torch's or
NumPy's own print of a correct (or mistaken) computation, written in this file from the
definitions, never with the service's functions — and sent as ``expected`` without a tolerance.
"""

import re
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from fastapi.testclient import TestClient

Array = npt.NDArray[np.float64]
RNG = np.random.default_rng(2026)
Q, K, V = (RNG.normal(size=(4, 3)) for _ in range(3))
BODY: dict[str, Any] = {"q": Q.tolist(), "k": K.tolist(), "v": V.tolist()}


def softmax(s: Array, axis: int = -1) -> Array:
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    out: Array = e / e.sum(axis=axis, keepdims=True)
    return out


def weights(axis: int = -1) -> Array:
    """Vaswani et al. (2017), eq. 1, in float64: softmax(Q Kᵀ / √d_k) over ``axis``."""
    return softmax(Q @ K.T / np.sqrt(3), axis)


def numbers_of(text: str) -> list[list[float]]:
    """The rows of numbers a printed matrix shows, as a student copies them."""
    rows = re.findall(r"\[([^\[\]]+)\]", text)
    return [[float(x) for x in re.findall(r"-?\d+\.?\d*(?:e[-+]?\d+)?", r)] for r in rows]


def torch_print(a: Array) -> list[list[float]]:
    """torch's own print of a tensor (4 decimals by default)."""
    torch = pytest.importorskip("torch")
    return numbers_of(str(torch.tensor(a)))


def compared(client: TestClient, expected: dict[str, Any], **extra: Any) -> list[dict[str, Any]]:
    answer = client.post("/attention", json={**BODY, "expected": expected, **extra})
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()["comparison"]
    return rows


def test_torchs_print_of_the_right_weights_agrees_to_its_4_decimals(client: TestClient) -> None:
    printed = torch_print(weights())
    assert all(len(str(x).split(".")[1]) <= 4 for row in printed for x in row)
    (row,) = compared(client, {"weights": printed})
    assert row["match"] and row["printed"] == {"decimals": 4}
    assert row["message"].startswith("agrees with ours to the 4 decimals you printed")
    assert row["diagnosis"] is None


def test_numpys_print_agrees_to_the_8_decimals_it_prints(client: TestClient) -> None:
    printed = numbers_of(np.array2string(weights(), separator=", "))
    (row,) = compared(client, {"weights": printed})
    assert row["match"] and row["printed"] == {"decimals": 8}


def test_printed_numbers_one_unit_off_still_agree_two_units_off_do_not(client: TestClient) -> None:
    """A print may round a value that sits on a half: one unit in the last digit from ours
    rounded is allowed, even where that is more than one unit from ours itself."""
    exact = weights()
    rounded = np.round(exact, 4)
    at = np.unravel_index(np.argmax(rounded - exact), exact.shape)  # the most rounded up
    one_off = rounded.copy()
    one_off[at] += 1e-4
    assert abs(one_off[at] - exact[at]) > 1.2e-4  # more than a unit from the exact value
    assert compared(client, {"weights": one_off.tolist()})[0]["match"]
    two_off = rounded.copy()
    two_off[at] += 2e-4
    (row,) = compared(client, {"weights": two_off.tolist()})
    assert not row["match"] and row["printed"] == {"decimals": 4}
    assert tuple(row["where"]) == at
    assert "compared at the 4 decimals you printed" in row["message"]


def test_a_printed_mistake_is_diagnosed_at_its_precision(client: TestClient) -> None:
    """The softmax taken down the columns, printed by torch: the mistake is still named."""
    (row,) = compared(client, {"weights": torch_print(weights(axis=0))})
    assert not row["match"] and row["printed"] == {"decimals": 4}
    assert row["diagnosis"]["mistakes"] == ["softmax_over_queries"]


def test_small_numbers_in_e_notation_compare_at_their_significant_digits(
    client: TestClient,
) -> None:
    """Scores scaled down to ~1e-9 (more than 8 decimals), printed with 4 significant digits
    in e-notation."""
    tiny = {**BODY, "scale": 1e-9}
    scores = Q @ K.T * 1e-9
    printed = [[float(f"{x:.3e}") for x in row] for row in scores]
    answer = client.post("/attention", json={**tiny, "expected": {"scaled_scores": printed}})
    (row,) = answer.json()["comparison"]
    assert row["match"] and row["printed"] == {"significant": 4}
    assert "4 significant digits you printed" in row["message"]


def test_an_explicit_tolerance_wins_over_the_print(client: TestClient) -> None:
    (row,) = compared(
        client, {"weights": torch_print(weights())}, tolerance={"atol": 1e-6, "rtol": 1e-6}
    )
    assert not row["match"] and row["printed"] is None


def test_full_precision_and_integers_are_compared_as_given(client: TestClient) -> None:
    (full,) = compared(client, {"weights": weights().tolist()})
    assert full["match"] and full["printed"] is None and full["message"].startswith("matches")
    ones = client.post(
        "/attention",
        json={"q": [[0.0]], "k": [[0.0]], "v": [[1.0]], "expected": {"output": [[1]]}},
    ).json()["comparison"][0]
    assert ones["match"] and ones["printed"] is None
