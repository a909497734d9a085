"""service.core.encoder's pieces that are not attention: the vectorised erf and GELU (against
math.erf and torch's exact gelu), the head roles (on weights written out here, where each score
is known by construction) and attention rollout (against the recurrence written out here). The
whole forward pass against transformers' BertModel is in tests/models/test_minilm.py."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.core.encoder import erf, gelu, head_roles, rollout


def test_erf_is_math_erf_to_the_last_bits() -> None:
    x = np.concatenate([np.linspace(-8, 8, 400_001), [0.0, -0.0, 6.0, -6.0, 1e-300, 40.0]])
    want = np.array([math.erf(float(v)) for v in x])
    assert np.abs(erf(x) - want).max() <= 4.5e-16


@settings(max_examples=200, deadline=None)
@given(st.floats(-10, 10, allow_nan=False))
def test_erf_of_any_number(v: float) -> None:
    assert abs(float(erf(np.array([v]))[0]) - math.erf(v)) <= 4.5e-16


def test_gelu_is_torchs_exact_gelu() -> None:
    torch = pytest.importorskip("torch")
    x = np.linspace(-12, 12, 100_001)
    want = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()  # float64, erf form
    # x/2 · (1 + erf): erf's 4e-16 times |x|/2, plus the product's own rounding
    assert np.all(np.abs(gelu(x) - want) <= 1e-15 * np.maximum(np.abs(x), 1.0))


def roles_of(w: np.ndarray, ids: list[int]) -> dict[str, object]:
    [[role]] = head_roles(w[None, None], np.array(ids))
    return role.__dict__


def test_each_role_scores_one_on_its_own_pattern() -> None:
    n = 5
    previous = np.eye(n, k=-1)
    previous[0, 0] = 1.0  # the first row has no previous token
    assert roles_of(previous, [1, 2, 3, 4, 5])["role"] == "previous_token"
    assert roles_of(previous, [1, 2, 3, 4, 5])["previous_token"] == 1.0
    nxt = np.eye(n, k=1)
    nxt[n - 1, n - 1] = 1.0
    assert roles_of(nxt, [1, 2, 3, 4, 5])["role"] == "next_token"
    first = np.zeros((n, n))
    first[:, 0] = 1.0
    got = roles_of(first, [1, 2, 3, 4, 5])
    assert (got["role"], got["first_token"], got["entropy_bits"]) == ("first_token", 1.0, 0.0)
    assert got["induction"] is None  # no token repeats


def test_uniform_rows_have_log2_n_bits_and_no_role() -> None:
    n = 4
    got = roles_of(np.full((n, n), 1 / n), [7, 8, 7, 8])
    assert got["entropy_bits"] == pytest.approx(2.0, abs=1e-12)
    assert got["role"] is None
    # positions 2 and 3 repeat tokens 7 (first at 0) and 8 (first at 1): w[2][1], w[3][2]
    assert got["induction"] == pytest.approx(0.25, abs=1e-15)


def test_induction_reads_the_token_after_the_most_recent_occurrence() -> None:
    ids = [5, 6, 5, 9, 5, 6]  # i = 2: j = 0 → 1; i = 4: j = 2 → 3; i = 5: j = 1 → 2
    w = np.zeros((6, 6))
    w[2, 1], w[4, 3], w[5, 2] = 1.0, 1.0, 1.0
    w[4, 1] = 0.0  # an older occurrence's successor does not count
    rows = [r for r in range(6) if w[r].sum() == 0]
    w[rows, 0] = 1.0
    assert roles_of(w, ids)["induction"] == pytest.approx(1.0)
    assert roles_of(w, ids)["role"] in {"induction", "first_token"}


def test_rollout_is_the_product_of_the_renormalised_layers() -> None:
    rng = np.random.default_rng(4)
    a = rng.random((3, 2, 4, 4))
    a /= a.sum(-1, keepdims=True)  # (layers, heads, L, L), rows sum to 1
    want = np.eye(4)
    for layer in range(3):
        m = 0.5 * (a[layer, 0] + a[layer, 1]) / 2 + 0.5 * np.eye(4)
        m /= m.sum(-1, keepdims=True)
        want = m @ want
    np.testing.assert_allclose(rollout(a), want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(rollout(a).sum(-1), 1.0, atol=1e-14)
