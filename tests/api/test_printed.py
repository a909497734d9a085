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


def test_a_printed_number_agrees_within_half_a_unit_and_one_unit_off_does_not(
    client: TestClient,
) -> None:
    """A print rounds to the nearest: ours printed is within half a unit in the last digit
    of ours, so that is all a printed number may differ by (plus float32's slack); the other
    neighbour of that digit, one unit from the print, is a different number."""
    exact = weights()
    rounded = np.round(exact, 4)
    at = np.unravel_index(np.argmax(np.abs(rounded - exact)), exact.shape)  # nearest a half
    assert compared(client, {"weights": rounded.tolist()})[0]["match"]
    other = rounded.copy()
    other[at] -= np.sign(rounded[at] - exact[at]) * 1e-4  # the print's other neighbour
    assert abs(other[at] - exact[at]) < 1e-4  # within one unit of ours: it used to agree
    (row,) = compared(client, {"weights": other.tolist()})
    assert not row["match"] and row["printed"] == {"decimals": 4}
    assert tuple(row["where"]) == at
    assert "compared at the 4 decimals you printed" in row["message"]


def batman() -> tuple[Array, Array]:
    """The README's "I am Batman" projections, from its numbers (X Wᵀ: weights out_in)."""
    x = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    w_q = np.array([[1.0, 2.0], [3.0, 4.0]])
    w_k = np.array([[0.5, 1.0], [1.5, 1.0]])
    return x @ w_q.T, x @ w_k.T


@pytest.mark.parametrize(("name", "at"), [("k", (0, 1)), ("q", (2, 1))], ids=["k", "q"])
def test_a_course_number_typed_one_tenth_off_does_not_agree(
    client: TestClient, name: str, at: tuple[int, int]
) -> None:
    """K = X W_kᵀ holds 1.5; a student who typed 1.4 (or a Q entry 0.1 off) printed nothing:
    our number needs no more decimals than theirs, so theirs must be it."""
    from service.wire.examples import I_AM_BATMAN

    q, k = batman()
    theirs = (k if name == "k" else q).copy()
    theirs[at] -= 0.1
    body = {**I_AM_BATMAN, "expected": {name: theirs.tolist()}}
    answer = client.post("/attention", json=body)
    assert answer.status_code == 200, answer.text
    (row,) = answer.json()["comparison"]
    assert not row["match"], row
    assert row["printed"] == {"decimals": 1}
    assert tuple(row["where"]) == at and row["max_abs_diff"] == pytest.approx(0.1)
    assert "compared at the 1 decimal you printed" in row["message"]


def test_numbers_equal_to_ours_are_identical_not_printed(client: TestClient) -> None:
    """Batman's K typed as it is (0.5, 1.5, 1): every number is ours, so the array matches as
    given, not "to the 1 decimal you printed"."""
    from service.wire.examples import I_AM_BATMAN

    q, k = batman()
    body = {**I_AM_BATMAN, "expected": {"q": q.tolist(), "k": k.tolist()}}
    rows = client.post("/attention", json=body).json()["comparison"]
    assert [r["match"] for r in rows] == [True, True]
    assert [r["printed"] for r in rows] == [None, None]
    assert all(r["message"].startswith("matches") for r in rows), rows
    assert not any("printed" in r["message"] for r in rows)


def test_float32_numbers_printed_at_8_decimals_agree(client: TestClient) -> None:
    """The weights computed in float32 and printed by NumPy (8 decimals): they differ from
    ours by float32's rounding, more than half a unit of the 8th decimal, and still agree
    (1e-6 of the largest number is allowed for the caller's own float32 arithmetic)."""
    q, k = Q.astype(np.float32), K.astype(np.float32)
    s = q @ k.T / np.float32(np.sqrt(3))
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    w32 = e / e.sum(axis=-1, keepdims=True)
    printed = numbers_of(np.array2string(w32.astype(np.float64), separator=", ", precision=8))
    assert np.abs(np.array(printed) - weights()).max() > 5e-9  # float32's, not the print's
    (row,) = compared(client, {"weights": printed})
    assert row["match"] and row["printed"] == {"decimals": 8}, row


def test_a_printed_mistake_is_diagnosed_at_its_precision(client: TestClient) -> None:
    """The softmax taken down the columns, printed by torch: the mistake is still named."""
    (row,) = compared(client, {"weights": torch_print(weights(axis=0))})
    assert not row["match"] and row["printed"] == {"decimals": 4}
    assert row["diagnosis"]["mistakes"] == ["softmax_over_queries"]
    assert row["diagnosis"]["alternatives"] == []  # no other single mistake does as well


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
    at = np.unravel_index(np.argmax(np.abs(scores)), scores.shape)  # its unit is the largest
    off = np.array(printed)
    unit = 10.0 ** (np.floor(np.log10(abs(off[at]))) - 3)  # one in its 4th significant digit
    off[at] = float(f"{off[at] + unit:.3e}")
    answer = client.post("/attention", json={**tiny, "expected": {"scaled_scores": off.tolist()}})
    (row,) = answer.json()["comparison"]
    assert not row["match"] and tuple(row["where"]) == at, row


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
