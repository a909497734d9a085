"""Compare with your numbers: `expected` and `tolerance` on /attention, /mask and /multihead.

Every number the tests send as "the caller's" is computed here, in float64 NumPy written from
scratch for this file (``softmax`` and the ``ref_*`` helpers below; each wrong computation is
spelled out where its case is built), never with the service's own functions.
``test_reference_agrees_with_torch`` checks those helpers against PyTorch (torch 2.13, float64)
when it is installed, so the references themselves have a second origin. The hypothesis property
is the one exception: it sends the service's own response back, by design.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.trace.comparison import DIAGNOSIS_TIMES

Array = npt.NDArray[np.float64]
Json = dict[str, Any]

# The contract's codes in the order of its table: a diagnosis lists its mistakes in this order.
CODES = (
    "softmax_over_queries",
    "scale_after_softmax",
    "scale_missing",
    "scale_by_d_k",
    "weights_transposed",
    "q_k_swapped",
    "mask_inverted",
    "causal_diagonal_masked",
    "layer_norm_over_all",
    "layer_norm_per_token",
    "unbiased_variance",
    "heads_interleaved",
    "rope_style_swapped",
)
DEFAULT_ATOL = DEFAULT_RTOL = 1e-6
LN_EPS = 1e-5


# ---- helpers: HTTP and JSON --------------------------------------------------------------


def post(client: TestClient, path: str, body: Json, status: int = 200) -> Json:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()  # type: ignore[no-any-return]


def js(a: npt.ArrayLike) -> Any:
    """An array as JSON: nested lists, NaN and ±∞ as null (the contract's encoding)."""
    arr = np.asarray(a, dtype=np.float64)
    out = arr.astype(object)
    out[~np.isfinite(arr)] = None
    return out.tolist()


def js_bool(a: npt.ArrayLike) -> Any:
    return np.asarray(a, dtype=bool).tolist()


def entry(body: Json, name: str) -> Json:
    found = [e for e in body["comparison"] if e["name"] == name]
    assert len(found) == 1, f"{name}: {[e['name'] for e in body['comparison']]}"
    return found[0]  # type: ignore[no-any-return]


def names(body: Json) -> list[str]:
    return [e["name"] for e in body["comparison"]]


def within(yours: Array, ours: Array, atol: float, rtol: float) -> bool:
    """The contract's definition: |yours − ours| ≤ atol + rtol·|ours| everywhere."""
    return bool(np.all(np.abs(yours - ours) <= atol + rtol * np.abs(ours)))


# ---- the reference: float64 NumPy from scratch -------------------------------------------


def softmax(s: Array, axis: int = -1) -> Array:
    """Max-subtracted softmax; a slice whose entries are all −∞ gives zeros (service default)."""
    m = np.max(s, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=axis, keepdims=True)
    out: Array = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return out


def ref_attention(
    q: Array, k: Array, v: Array, allowed: npt.NDArray[np.bool_] | None = None
) -> dict[str, Array]:
    """Scaled dot-product attention, every step, scale 1/√d_k, true = may attend."""
    scores = q @ np.swapaxes(k, -1, -2)
    scaled = scores / np.sqrt(q.shape[-1])
    out = {"q": q, "k": k, "v": v, "scores": scores, "scaled_scores": scaled}
    if allowed is not None:
        scaled = np.where(allowed, scaled, -np.inf)
        out["masked_scores"] = scaled
    out["weights"] = softmax(scaled)
    out["output"] = out["weights"] @ v
    return out


def ref_layer_norm(z: Array, over: str = "features", ddof: int = 0) -> Array:
    """(z − mean) / √(var + eps), gamma 1, beta 0; per token ("features") or whole matrix."""
    axis = -1 if over == "features" else None
    mean = z.mean(axis=axis, keepdims=True)
    var = z.var(axis=axis, keepdims=True, ddof=ddof)
    return (z - mean) / np.sqrt(var + LN_EPS)  # type: ignore[no-any-return]


def ref_multihead(
    x: Array,
    w_q: Array,
    w_k: Array,
    w_v: Array,
    h: int,
    *,
    residual: bool = False,
    layer_norm: str | None = None,
    ln_ddof: int = 0,
    interleaved_heads: bool = False,
) -> dict[str, Any]:
    """Multi-head attention with combined in_out weights, W_o identity, optional residual and
    layer norm; heads are contiguous column blocks (or every h-th column when interleaved)."""
    big_q, big_k, big_v = x @ w_q, x @ w_k, x @ w_v
    d_k = big_q.shape[1] // h

    def cols(m: Array, i: int) -> Array:
        return m[:, i::h] if interleaved_heads else m[:, i * d_k : (i + 1) * d_k]

    heads = [ref_attention(cols(big_q, i), cols(big_k, i), cols(big_v, i)) for i in range(h)]
    weights = np.stack([t["weights"] for t in heads])
    concat = np.concatenate([t["output"] for t in heads], axis=1)
    out: dict[str, Any] = {
        "heads": heads,
        "average_weights": weights.mean(axis=0),
        "weights": weights,
        "concat": concat,
        "projected": concat,
    }
    z = concat
    if residual:
        z = x + concat
        out["residual"] = z
    if layer_norm is not None:
        z = ref_layer_norm(z, layer_norm, ln_ddof)
        out["layer_norm"] = z
    out["output"] = z
    return out


def ref_rope(x: Array, style: str, base: float = 10000.0) -> Array:
    """RoPE at positions 0…L−1, θ_i = base^(−2i/d): "half" rotates (i, i + d/2) as rotate_half
    does, "interleaved" rotates the pairs (2i, 2i+1)."""
    n, d = x.shape
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    angle = np.arange(n)[:, None] * theta[None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    if style == "half":
        x1, x2 = x[:, : d // 2], x[:, d // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=1)
    out = np.empty_like(x)
    even, odd = x[:, 0::2], x[:, 1::2]
    out[:, 0::2] = even * cos - odd * sin
    out[:, 1::2] = even * sin + odd * cos
    return out


def interleave_back(outputs: list[Array]) -> Array:
    """Head i's output columns placed at i, i+h, i+2h, … of the concatenation."""
    h = len(outputs)
    out = np.empty((outputs[0].shape[0], h * outputs[0].shape[1]))
    for i, o in enumerate(outputs):
        out[:, i::h] = o
    return out


def heads_json(traces: list[dict[str, Array]], *keys: str) -> list[Json]:
    return [{key: js(t[key]) for key in keys} for t in traces]


# ---- inputs ------------------------------------------------------------------------------

L = S = D_K = 4  # square everything: q_k_swapped needs L == S, weights_transposed d_model == d_k
D_V = 3
SCALE = 1 / np.sqrt(D_K)


def direct(seed: int = 0) -> tuple[Array, Array, Array]:
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((L, D_K)),
        rng.standard_normal((S, D_K)),
        rng.standard_normal((S, D_V)),
    )


def projections(seed: int = 1) -> tuple[Array, Array, Array, Array]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((L, D_K))
    return x, *(rng.standard_normal((D_K, D_K)) for _ in range(3))  # type: ignore[return-value]


Q, K, V = direct()
X, W_Q, W_K, W_V = projections()
DIRECT_BODY: Json = {"q": js(Q), "k": js(K), "v": js(V)}
PROJ_BODY: Json = {"x": js(X), "w_q": js(W_Q), "w_k": js(W_K), "w_v": js(W_V)}
MH_BODY: Json = {**PROJ_BODY, "num_heads": 2}

# A boolean mask (true = may attend) whose rows and columns are never empty, read either way.
MASK = np.array(
    [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0], [0, 0, 1, 1]],
    dtype=bool,
)
CAUSAL = np.tril(np.ones((L, S), dtype=bool))  # upper-left causal, true = may attend
CAUSAL_NO_DIAGONAL = np.tril(np.ones((L, S), dtype=bool), -1)  # triu(ones, 0) masked


def masked(scaled: Array, allowed: npt.NDArray[np.bool_]) -> Array:
    return np.where(allowed, scaled, -np.inf)


# ---- one case per mistake (and the pairs) ------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A request, the caller's wrong `expected`, and what the diagnosis must say."""

    id: str
    endpoint: str
    body: Json
    expected: Json
    first_mismatch: str
    mistakes: list[str]


def full_row_variants(weights: Array, row: int) -> dict[str, Array]:
    """A fully masked row as notebooks leave it: NaN (0/0), zeros, or uniform 1/S."""
    nan, zeros, uniform = weights.copy(), weights.copy(), weights.copy()
    nan[row], zeros[row], uniform[row] = np.nan, 0.0, 1.0 / weights.shape[-1]
    return {"nan": nan, "zeros": zeros, "uniform": uniform}


def single_cases() -> list[Case]:
    raw = Q @ K.T  # reference: ref_attention's Q Kᵀ, written out per mistake below
    cases = [
        # softmax down the columns of the scaled scores
        Case(
            "softmax_over_queries",
            "/attention",
            DIRECT_BODY,
            {"weights": js(softmax(raw * SCALE, axis=0))},
            "weights",
            ["softmax_over_queries"],
        ),
        Case(
            "scale_after_softmax",
            "/attention",
            DIRECT_BODY,
            {"weights": js(softmax(raw) * SCALE)},
            "weights",
            ["scale_after_softmax"],
        ),
        Case(
            "scale_missing",
            "/attention",
            DIRECT_BODY,
            {"weights": js(softmax(raw))},
            "weights",
            ["scale_missing"],
        ),
        Case(
            "scale_missing-output",
            "/attention",
            DIRECT_BODY,
            {"output": js(softmax(raw) @ V)},
            "output",
            ["scale_missing"],
        ),
        Case(
            "scale_by_d_k",
            "/attention",
            DIRECT_BODY,
            {"weights": js(softmax(raw / D_K))},
            "weights",
            ["scale_by_d_k"],
        ),
        # in_out layout means X @ W; the caller wrote X @ W.T
        Case(
            "weights_transposed",
            "/attention",
            PROJ_BODY,
            {"q": js(X @ W_Q.T)},
            "q",
            ["weights_transposed"],
        ),
        # the reverse: out_in layout means X @ W.T; the caller wrote X @ W
        Case(
            "weights_transposed-out_in",
            "/attention",
            {**PROJ_BODY, "weight_layout": "out_in"},
            {"q": js(X @ W_Q)},
            "q",
            ["weights_transposed"],
        ),
        # every projection transposed, only the output given
        Case(
            "weights_transposed-output",
            "/attention",
            PROJ_BODY,
            {"output": js(ref_attention(X @ W_Q.T, X @ W_K.T, X @ W_V.T)["output"])},
            "output",
            ["weights_transposed"],
        ),
        Case(
            "q_k_swapped",
            "/attention",
            DIRECT_BODY,
            {"scores": js(K @ Q.T)},
            "scores",
            ["q_k_swapped"],
        ),
        Case(
            "q_k_swapped-weights",
            "/attention",
            DIRECT_BODY,
            {"weights": js(softmax(K @ Q.T * SCALE))},
            "weights",
            ["q_k_swapped"],
        ),
        Case(
            "mask_inverted",
            "/mask",
            {**DIRECT_BODY, "mask": {"type": "boolean", "matrix": js_bool(MASK)}},
            {"weights": js(softmax(masked(raw * SCALE, ~MASK)))},
            "weights",
            ["mask_inverted"],
        ),
        Case(
            "mask_inverted-masked_scores-1_0_matrix",
            "/mask",
            {**DIRECT_BODY, "mask": {"type": "boolean", "matrix": MASK.astype(int).tolist()}},
            {"masked_scores": js(masked(raw * SCALE, ~MASK))},
            "masked_scores",
            ["mask_inverted"],
        ),
        Case(
            "causal_diagonal_masked-masked_scores",
            "/mask",
            {**DIRECT_BODY, "mask": {"type": "causal"}},
            {"masked_scores": js(masked(raw * SCALE, CAUSAL_NO_DIAGONAL))},
            "masked_scores",
            ["causal_diagonal_masked"],
        ),
    ]
    # the first row has no key left: NaN, zeros or uniform must all be recognised
    wrong = softmax(masked(raw * SCALE, CAUSAL_NO_DIAGONAL))
    for label, weights in full_row_variants(wrong, 0).items():
        cases.append(
            Case(
                f"causal_diagonal_masked-row0_{label}",
                "/mask",
                {**DIRECT_BODY, "mask": {"type": "causal"}},
                {"weights": js(weights)},
                "weights",
                ["causal_diagonal_masked"],
            )
        )
    # layer norm: service per token, caller over the whole matrix; and the reverse
    ln_all = ref_multihead(X, W_Q, W_K, W_V, 2, residual=True, layer_norm="all")
    ln_token = ref_multihead(X, W_Q, W_K, W_V, 2, residual=True, layer_norm="features")
    ln_unbiased = ref_multihead(
        X, W_Q, W_K, W_V, 2, residual=True, layer_norm="features", ln_ddof=1
    )
    ln_body = {**MH_BODY, "residual": True, "layer_norm": True}
    cases += [
        Case(
            "layer_norm_over_all",
            "/multihead",
            ln_body,
            {"layer_norm": js(ln_all["layer_norm"])},
            "layer_norm",
            ["layer_norm_over_all"],
        ),
        Case(
            "layer_norm_over_all-output",
            "/multihead",
            ln_body,
            {"output": js(ln_all["output"])},
            "output",
            ["layer_norm_over_all"],
        ),
        Case(
            "layer_norm_per_token",
            "/multihead",
            {**ln_body, "layer_norm": {"over": "all"}},
            {"layer_norm": js(ln_token["layer_norm"])},
            "layer_norm",
            ["layer_norm_per_token"],
        ),
        Case(
            "unbiased_variance",
            "/multihead",
            ln_body,
            {"layer_norm": js(ln_unbiased["layer_norm"])},
            "layer_norm",
            ["unbiased_variance"],
        ),
    ]
    # heads as every h-th column of X W instead of contiguous blocks
    inter = ref_multihead(X, W_Q, W_K, W_V, 2, interleaved_heads=True)
    cases += [
        Case(
            "heads_interleaved-q",
            "/multihead",
            MH_BODY,
            {"heads": heads_json(inter["heads"], "q")},
            "heads.0.q",
            ["heads_interleaved"],
        ),
        Case(
            "heads_interleaved-weights",
            "/multihead",
            MH_BODY,
            {"heads": heads_json(inter["heads"], "weights")},
            "heads.0.weights",
            ["heads_interleaved"],
        ),
        # the heads' outputs concatenated in head order (np.concatenate(heads, axis=-1))
        Case(
            "heads_interleaved-concat-in-head-order",
            "/multihead",
            MH_BODY,
            {"concat": js(inter["concat"])},
            "concat",
            ["heads_interleaved"],
        ),
        # the same wrong view undone on the way back: head i's output goes to columns i, i+h, …
        Case(
            "heads_interleaved-concat-merged-back",
            "/multihead",
            MH_BODY,
            {"concat": js(interleave_back([t["output"] for t in inter["heads"]]))},
            "concat",
            ["heads_interleaved"],
        ),
        Case(
            "heads_interleaved-batched-weights",
            "/multihead",
            {**MH_BODY, "x": js(np.stack([X, X[::-1]]))},
            {
                "heads": [
                    {"weights": js(np.stack([a["weights"], b["weights"]]))}
                    for a, b in zip(
                        inter["heads"],
                        ref_multihead(X[::-1], W_Q, W_K, W_V, 2, interleaved_heads=True)["heads"],
                        strict=True,
                    )
                ]
            },
            "heads.0.weights",
            ["heads_interleaved"],
        ),
    ]
    # RoPE: service half (default), caller interleaved pairs; and the reverse
    cases += [
        Case(
            "rope_style_swapped-q_rotated",
            "/attention",
            {**DIRECT_BODY, "rope": {}},
            {"q_rotated": js(ref_rope(Q, "interleaved"))},
            "q_rotated",
            ["rope_style_swapped"],
        ),
        Case(
            "rope_style_swapped-reverse",
            "/attention",
            {**DIRECT_BODY, "rope": {"style": "interleaved"}},
            {"q_rotated": js(ref_rope(Q, "half"))},
            "q_rotated",
            ["rope_style_swapped"],
        ),
        Case(
            "rope_style_swapped-scores",
            "/attention",
            {**DIRECT_BODY, "rope": {"style": "half"}},
            {"scores": js(ref_rope(Q, "interleaved") @ ref_rope(K, "interleaved").T)},
            "scores",
            ["rope_style_swapped"],
        ),
    ]
    # RoPE per head on /multihead: the caller rotated each head's q in interleaved pairs
    # (d_model 8, two heads of d_k 4: with d_k 2 both styles rotate the same pair)
    rng = np.random.default_rng(8)
    x8, *w8 = (rng.standard_normal((L, 8)), *(rng.standard_normal((8, 8)) for _ in range(3)))
    plain_heads = ref_multihead(x8, w8[0], w8[1], w8[2], 2)["heads"]
    mh8 = {"x": js(x8), "w_q": js(w8[0]), "w_k": js(w8[1]), "w_v": js(w8[2]), "num_heads": 2}
    cases.append(
        Case(
            "rope_style_swapped-multihead-heads_q_rotated",
            "/multihead",
            {**mh8, "rope": {}},
            {"heads": [{"q_rotated": js(ref_rope(t["q"], "interleaved"))} for t in plain_heads]},
            "heads.0.q_rotated",
            ["rope_style_swapped"],
        )
    )
    # a mask row that allows every key: read inverted, that row has no key left
    full_row = MASK.copy()
    full_row[1] = True
    wrong = softmax(masked(raw * SCALE, ~full_row))
    for label, weights in full_row_variants(wrong, 1).items():
        cases.append(
            Case(
                f"mask_inverted-row1_{label}",
                "/mask",
                {**DIRECT_BODY, "mask": {"type": "boolean", "matrix": js_bool(full_row)}},
                {"weights": js(weights)},
                "weights",
                ["mask_inverted"],
            )
        )
    # batched: softmax over the queries of each batch item (dim=-2), not over the batch
    q2, k2 = np.stack([Q, Q[::-1]]), np.stack([K, -K])
    scaled2 = q2 @ np.swapaxes(k2, -1, -2) * SCALE
    cases.append(
        Case(
            "softmax_over_queries-batched",
            "/attention",
            {"q": js(q2), "k": js(k2), "v": js(np.stack([V, V]))},
            {"weights": js(softmax(scaled2, axis=-2))},
            "weights",
            ["softmax_over_queries"],
        )
    )
    return cases


def pair_cases() -> list[Case]:
    raw = Q @ K.T
    inter = ref_multihead(X, W_Q, W_K, W_V, 2, interleaved_heads=True)
    return [
        # the course notebook: weights = softmax(Q Kᵀ, axis=0) / √d_k, both mistakes in one line
        Case(
            "notebook-softmax_over_queries+scale_after_softmax",
            "/attention",
            DIRECT_BODY,
            {"weights": js(softmax(raw, axis=0) * SCALE)},
            "weights",
            ["softmax_over_queries", "scale_after_softmax"],
        ),
        Case(
            "scale_missing+softmax_over_queries",
            "/attention",
            DIRECT_BODY,
            {"weights": js(softmax(raw, axis=0))},
            "weights",
            ["softmax_over_queries", "scale_missing"],
        ),
        Case(
            "q_k_swapped+scale_by_d_k",
            "/attention",
            DIRECT_BODY,
            {"weights": js(softmax(K @ Q.T / D_K))},
            "weights",
            ["scale_by_d_k", "q_k_swapped"],
        ),
        Case(
            "mask_inverted+softmax_over_queries",
            "/mask",
            {**DIRECT_BODY, "mask": {"type": "boolean", "matrix": js_bool(MASK)}},
            {"weights": js(softmax(masked(raw * SCALE, ~MASK), axis=0))},
            "weights",
            ["softmax_over_queries", "mask_inverted"],
        ),
        Case(
            "causal_diagonal_masked+scale_missing",
            "/mask",
            {**DIRECT_BODY, "mask": {"type": "causal"}},
            {"weights": js(softmax(masked(raw, CAUSAL_NO_DIAGONAL)))},
            "weights",
            ["scale_missing", "causal_diagonal_masked"],
        ),
        Case(
            "heads_interleaved+scale_missing",
            "/multihead",
            MH_BODY,
            {
                "heads": [
                    {"weights": js(softmax(t["q"] @ t["k"].T))}  # unscaled interleaved heads
                    for t in inter["heads"]
                ]
            },
            "heads.0.weights",
            ["scale_missing", "heads_interleaved"],
        ),
    ]


SINGLES = single_cases()
PAIRS = pair_cases()


def test_every_contract_code_has_a_case() -> None:
    assert {m for c in SINGLES for m in c.mistakes} == set(CODES)
    for case in SINGLES + PAIRS:  # the tests' own premise: cases list mistakes in table order
        assert case.mistakes == sorted(case.mistakes, key=CODES.index), case.id


def check_diagnosis(client: TestClient, case: Case) -> None:
    body = post(client, case.endpoint, {**case.body, "expected": case.expected})
    assert body["first_mismatch"] == case.first_mismatch, body["comparison"]
    e = entry(body, case.first_mismatch)
    assert e["match"] is False
    assert e["diagnosis"] is not None, e
    assert e["diagnosis"]["mistakes"] == case.mistakes, e
    explanation = e["diagnosis"]["explanation"]
    assert isinstance(explanation, str) and len(explanation.split()) >= 3, explanation
    assert isinstance(e["message"], str) and e["message"]
    for other in body["comparison"]:  # only the first mismatch is diagnosed
        if other["name"] != case.first_mismatch:
            assert other["diagnosis"] is None, other


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in SINGLES])
def test_each_mistake_alone_is_diagnosed(client: TestClient, case: Case) -> None:
    check_diagnosis(client, case)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in PAIRS])
def test_two_mistakes_at_once_are_diagnosed_as_a_pair(client: TestClient, case: Case) -> None:
    check_diagnosis(client, case)


# ---- correct numbers ---------------------------------------------------------------------


def correct_cases() -> list[tuple[str, str, Json, Json]]:
    """(id, endpoint, request, expected): every name the request produces, from the reference."""
    plain = ref_attention(Q, K, V)
    att = {n: js(plain[n]) for n in plain}
    causal = ref_attention(Q, K, V, CAUSAL)
    mask_expected = {n: js(causal[n]) for n in causal}
    mask_expected["mask"] = js_bool(CAUSAL)
    mask_expected["additive_mask"] = js(np.where(CAUSAL, 0.0, -np.inf))
    mh = ref_multihead(X, W_Q, W_K, W_V, 2, residual=True, layer_norm="features")
    mh_expected = {n: js(mh[n]) for n in mh if n != "heads"}
    mh_expected["heads"] = heads_json(
        mh["heads"], "q", "k", "v", "scores", "scaled_scores", "weights", "output"
    )
    rope_q, rope_k = ref_rope(Q, "half"), ref_rope(K, "half")
    rope = ref_attention(rope_q, rope_k, V)
    rope_expected = {n: js(rope[n]) for n in ("scores", "scaled_scores", "weights", "output")}
    rope_expected["q_rotated"] = js(rope_q)
    q2, k2, v2 = (np.stack(pair) for pair in zip(direct(0), direct(5), strict=True))
    batched = ref_attention(q2, k2, v2)
    return [
        ("attention", "/attention", DIRECT_BODY, att),
        ("attention-projections", "/attention", PROJ_BODY, {"q": js(X @ W_Q), "k": js(X @ W_K)}),
        ("mask-causal", "/mask", {**DIRECT_BODY, "mask": {"type": "causal"}}, mask_expected),
        (
            "multihead-residual-layer_norm",
            "/multihead",
            {**MH_BODY, "residual": True, "layer_norm": True},
            mh_expected,
        ),
        ("attention-rope", "/attention", {**DIRECT_BODY, "rope": {}}, rope_expected),
        (
            "attention-batched",
            "/attention",
            {"q": js(q2), "k": js(k2), "v": js(v2)},
            {n: js(batched[n]) for n in batched},
        ),
    ]


@pytest.mark.parametrize(
    ("endpoint", "request_body", "expected"),
    [pytest.param(*c[1:], id=c[0]) for c in correct_cases()],
)
def test_correct_numbers_match_everywhere(
    client: TestClient, endpoint: str, request_body: Json, expected: Json
) -> None:
    body = post(client, endpoint, {**request_body, "expected": expected})
    assert body["first_mismatch"] is None, body["comparison"]
    assert body["comparison"], "no entries"
    for e in body["comparison"]:
        assert e["match"] is True, e
        assert e["diagnosis"] is None, e
    assert "warnings" not in body  # present only when there is something to warn about
    given_names = {n for n in expected if n != "heads"}
    assert given_names <= set(names(body))


def test_masked_fill_minus_1e9_counts_as_masked(client: TestClient) -> None:
    # reference: ref_attention with the causal mask; masked_fill(-1e9) as notebooks write it
    causal = ref_attention(Q, K, V, CAUSAL)
    filled = np.where(CAUSAL, causal["scaled_scores"], -1e9)
    body = post(
        client,
        "/mask",
        {
            **DIRECT_BODY,
            "mask": {"type": "causal"},
            "expected": {"masked_scores": js(filled), "mask": CAUSAL.astype(int).tolist()},
        },
    )
    assert body["first_mismatch"] is None, body["comparison"]
    assert all(e["match"] for e in body["comparison"])


def test_a_finite_number_against_a_masked_one_has_no_max_abs_diff(client: TestClient) -> None:
    # reference: ref_attention with the causal mask; entry [0][3] is masked (−∞) there
    causal = ref_attention(Q, K, V, CAUSAL)
    scores = causal["masked_scores"].copy()
    scores[0, 3] = 0.25
    body = post(
        client,
        "/mask",
        {**DIRECT_BODY, "mask": {"type": "causal"}, "expected": {"masked_scores": js(scores)}},
    )
    e = entry(body, "masked_scores")
    assert e["match"] is False
    assert e["max_abs_diff"] is None
    assert e["where"] == [0, 3]
    assert e["ours"] is None and e["yours"] == 0.25


def test_nan_against_a_number_has_no_max_abs_diff(client: TestClient) -> None:
    # reference: ref_attention; the caller's weights[1][0] is NaN (null)
    weights = ref_attention(Q, K, V)["weights"].copy()
    ours = weights[1, 0]
    weights[1, 0] = np.nan
    body = post(client, "/attention", {**DIRECT_BODY, "expected": {"weights": js(weights)}})
    e = entry(body, "weights")
    assert e["match"] is False
    assert e["max_abs_diff"] is None
    assert e["where"] == [1, 0]
    assert e["yours"] is None and e["ours"] == pytest.approx(ours, abs=1e-12)


def float32_attention() -> dict[str, Array]:
    """The right computation done in float32 (inputs rounded to float32 first), as float64."""
    q, k, v = (a.astype(np.float32) for a in (Q, K, V))
    scores = q @ k.T
    scaled = scores * np.float32(SCALE)
    e = np.exp(scaled - scaled.max(axis=1, keepdims=True))
    weights = e / e.sum(axis=1, keepdims=True)
    out = {"scores": scores, "scaled_scores": scaled, "weights": weights, "output": weights @ v}
    return {n: a.astype(np.float64) for n, a in out.items()}


def test_float32_numbers_match_at_the_default_tolerance_and_are_named_at_a_tight_one(
    client: TestClient,
) -> None:
    theirs = float32_attention()
    ours = ref_attention(Q, K, V)  # float64 reference
    # the premise, by the contract's definition: within 1e-6 + 1e-6·|ours|, not within 1e-12
    for n, a in theirs.items():
        assert within(a, ours[n], DEFAULT_ATOL, DEFAULT_RTOL), n
        assert not within(a, ours[n], 1e-12, 1e-12), n
    expected = {n: js(a) for n, a in theirs.items()}
    body = post(client, "/attention", {**DIRECT_BODY, "expected": expected})
    assert body["first_mismatch"] is None, body["comparison"]
    strict = post(
        client,
        "/attention",
        {**DIRECT_BODY, "expected": expected, "tolerance": {"atol": 1e-12, "rtol": 1e-12}},
    )
    assert strict["first_mismatch"] == "scores"
    for e in strict["comparison"]:
        assert e["match"] is False, e
        assert 0 < e["max_abs_diff"] < 1e-5
    # float32 rounding is no mistake, and the diagnosis says it is float32's size
    first = entry(strict, "scores")
    assert first["diagnosis"]["mistakes"] == ["float32_arithmetic"], first
    size = np.max(np.abs(theirs["scores"] - ours["scores"])) / np.max(np.abs(ours["scores"]))
    assert f"{size:.1e} of the array's largest number" in first["diagnosis"]["explanation"]


def test_tolerance_is_atol_plus_rtol_times_ours(client: TestClient) -> None:
    # reference: ref_attention; one output number off by exactly 2e-3 (|ours| taken from it)
    output = ref_attention(Q, K, V)["output"].copy()
    ours = output[2, 1]
    output[2, 1] += 2e-3
    expected = {"output": js(output)}
    for tol, match in [
        ({"atol": 2.1e-3, "rtol": 0.0}, True),
        ({"atol": 1.9e-3, "rtol": 0.0}, False),
        ({"atol": 0.0, "rtol": 2.1e-3 / abs(ours)}, True),
        ({"atol": 0.0, "rtol": 1.9e-3 / abs(ours)}, False),
        ({"atol": 1e-3, "rtol": 1.1e-3 / abs(ours)}, True),
    ]:
        body = post(client, "/attention", {**DIRECT_BODY, "expected": expected, "tolerance": tol})
        assert entry(body, "output")["match"] is match, tol
    default = post(client, "/attention", {**DIRECT_BODY, "expected": expected})
    assert entry(default, "output")["match"] is False


# ---- noise: no diagnosis, and where points at the right element --------------------------


def test_random_noise_is_a_mismatch_without_a_diagnosis(client: TestClient) -> None:
    # reference: ref_attention's weights plus N(0, 1e-2) noise from a fixed generator
    weights = ref_attention(Q, K, V)["weights"]
    noise = np.random.default_rng(7).normal(0.0, 1e-2, weights.shape)
    body = post(client, "/attention", {**DIRECT_BODY, "expected": {"weights": js(weights + noise)}})
    assert body["first_mismatch"] == "weights"
    e = entry(body, "weights")
    assert e["match"] is False
    assert e["diagnosis"] is None
    worst = np.unravel_index(np.argmax(np.abs(noise)), noise.shape)
    assert e["where"] == [int(i) for i in worst]
    assert e["max_abs_diff"] == pytest.approx(np.abs(noise).max(), rel=1e-9)
    assert e["ours"] == pytest.approx(weights[worst], abs=1e-12)
    assert e["yours"] == pytest.approx((weights + noise)[worst], abs=1e-12)
    assert "no listed mistake" in e["message"].lower(), e["message"]


@pytest.mark.parametrize(
    ("endpoint", "request_body", "name", "index", "make"),
    [
        pytest.param(
            "/attention",
            DIRECT_BODY,
            "weights",
            (2, 1),
            lambda: ref_attention(Q, K, V)["weights"],
            id="attention-weights",
        ),
        pytest.param(
            "/attention",
            {"q": js(np.stack([Q, Q[::-1]])), "k": js(np.stack([K, K])), "v": js(np.stack([V, V]))},
            "output",
            (1, 3, 0),
            lambda: ref_attention(np.stack([Q, Q[::-1]]), np.stack([K, K]), np.stack([V, V]))[
                "output"
            ],
            id="batched-output-batch-index-first",
        ),
        pytest.param(
            "/multihead",
            MH_BODY,
            "weights",
            (1, 2, 0),
            lambda: ref_multihead(X, W_Q, W_K, W_V, 2)["weights"],
            id="multihead-stacked-weights-head-index-first",
        ),
        pytest.param(
            "/multihead",
            MH_BODY,
            "concat",
            (3, 2),
            lambda: ref_multihead(X, W_Q, W_K, W_V, 2)["concat"],
            id="multihead-concat",
        ),
    ],
)
def test_where_points_at_one_big_error(
    client: TestClient,
    endpoint: str,
    request_body: Json,
    name: str,
    index: tuple[int, ...],
    make: Callable[[], Array],
) -> None:
    # reference: `make` (ref_attention / ref_multihead), one entry off by 0.375
    right = make()
    wrong = right.copy()
    wrong[index] += 0.375
    body = post(client, endpoint, {**request_body, "expected": {name: js(wrong)}})
    e = entry(body, name)
    assert (e["match"], e["where"]) == (False, list(index))
    assert e["max_abs_diff"] == pytest.approx(0.375, rel=1e-9)
    assert e["ours"] == pytest.approx(right[index], abs=1e-12)
    assert e["yours"] == pytest.approx(wrong[index], abs=1e-12)
    assert e["diagnosis"] is None


@pytest.mark.parametrize("skip", [None, {}], ids=["null", "empty-object"])
def test_where_inside_one_head(client: TestClient, skip: Json | None) -> None:
    # reference: ref_multihead; heads[1].weights off at [2][0], head 0 skipped
    heads = ref_multihead(X, W_Q, W_K, W_V, 2)["heads"]
    wrong = heads[1]["weights"].copy()
    wrong[2, 0] -= 0.25
    body = post(
        client, "/multihead", {**MH_BODY, "expected": {"heads": [skip, {"weights": js(wrong)}]}}
    )
    assert names(body) == ["heads.1.weights"]
    assert body["first_mismatch"] == "heads.1.weights"
    e = entry(body, "heads.1.weights")
    assert e["where"] == [2, 0]
    assert e["max_abs_diff"] == pytest.approx(0.25, rel=1e-9)


# ---- order of the entries ----------------------------------------------------------------


def test_attention_entries_follow_the_steps(client: TestClient) -> None:
    # reference: ref_attention; the object is sent in reverse order on purpose
    ref = ref_attention(Q, K, V)
    order = ["q", "k", "v", "scores", "scaled_scores", "weights", "output"]
    expected = {n: js(ref[n]) for n in reversed(order)}
    body = post(client, "/attention", {**DIRECT_BODY, "expected": expected})
    assert names(body) == order
    steps = [s["name"] for s in body["steps"]]  # direct mode: q, k, v are given, not steps
    assert [n for n in names(body) if n in steps] == [s for s in steps if s in order]


def test_mask_entries_follow_the_steps(client: TestClient) -> None:
    # reference: ref_attention with the causal mask
    ref = ref_attention(Q, K, V, CAUSAL)
    order = ["scores", "scaled_scores", "masked_scores", "weights", "output"]
    expected = {n: js(ref[n]) for n in sorted(order)}
    body = post(client, "/mask", {**DIRECT_BODY, "mask": {"type": "causal"}, "expected": expected})
    assert names(body) == order
    assert body["first_mismatch"] is None


def test_multihead_entries_go_step_by_step_then_head_by_head(client: TestClient) -> None:
    # reference: ref_multihead with residual and per-token layer norm
    ref = ref_multihead(X, W_Q, W_K, W_V, 2, residual=True, layer_norm="features")
    per_head = ["q", "k", "v", "scores", "scaled_scores", "weights", "output"]
    top = ["average_weights", "weights", "concat", "projected", "residual", "layer_norm", "output"]
    expected: Json = {n: js(ref[n]) for n in reversed(top)}
    expected["heads"] = heads_json(ref["heads"], *reversed(per_head))
    body = post(
        client,
        "/multihead",
        {**MH_BODY, "residual": True, "layer_norm": True, "expected": expected},
    )
    want = [f"heads.{i}.{n}" for n in per_head for i in range(2)] + top
    assert names(body) == want
    assert body["first_mismatch"] is None, body["comparison"]


def test_multihead_first_mismatch_is_the_earliest_step_not_the_lowest_head(
    client: TestClient,
) -> None:
    # reference: ref_multihead; head 1's q is off and head 0's weights are off: q comes first
    heads = ref_multihead(X, W_Q, W_K, W_V, 2)["heads"]
    q1 = heads[1]["q"] + 0.5
    w0 = heads[0]["weights"] + 0.5
    body = post(
        client,
        "/multihead",
        {**MH_BODY, "expected": {"heads": [{"weights": js(w0)}, {"q": js(q1)}]}},
    )
    assert names(body) == ["heads.1.q", "heads.0.weights"]
    assert body["first_mismatch"] == "heads.1.q"


def test_only_the_first_mismatch_is_diagnosed(client: TestClient) -> None:
    # scores = K Qᵀ (q_k_swapped) and weights softmax over queries: scores come first
    raw = Q @ K.T
    expected = {"weights": js(softmax(raw * SCALE, axis=0)), "scores": js(K @ Q.T)}
    body = post(client, "/attention", {**DIRECT_BODY, "expected": expected})
    assert names(body) == ["scores", "weights"]
    assert body["first_mismatch"] == "scores"
    assert entry(body, "scores")["diagnosis"]["mistakes"] == ["q_k_swapped"]
    assert entry(body, "weights")["match"] is False
    assert entry(body, "weights")["diagnosis"] is None


# ---- 422s --------------------------------------------------------------------------------


def error_fields(body: Json) -> str:
    return " ".join([body.get("message", "")] + [e["field"] for e in body.get("errors", [])])


@pytest.mark.parametrize(
    ("endpoint", "request_body", "expected", "named"),
    [
        pytest.param(
            "/attention",
            DIRECT_BODY,
            {"weights": js(np.zeros((L, S + 1)))},
            "expected.weights",
            id="wrong-shape",
        ),
        pytest.param(
            "/attention",
            {"q": js(np.stack([Q, Q])), "k": js(np.stack([K, K])), "v": js(np.stack([V, V]))},
            {"weights": js(np.zeros((L, S)))},
            "expected.weights",
            id="batched-request-unbatched-expected",
        ),
        pytest.param(
            "/attention",
            DIRECT_BODY,
            {"attention_weights": js(np.zeros((L, S)))},
            "expected.attention_weights",
            id="unknown-name",
        ),
        pytest.param(
            "/attention",
            DIRECT_BODY,
            {"masked_scores": js(np.zeros((L, S)))},
            "expected.masked_scores",
            id="masked_scores-without-a-mask",
        ),
        pytest.param(
            "/attention",
            DIRECT_BODY,
            {"layer_norm": js(np.zeros((L, D_V)))},
            "expected.layer_norm",
            id="layer_norm-on-attention",
        ),
        pytest.param(
            "/multihead",
            MH_BODY,
            {"residual": js(np.zeros((L, D_K)))},
            "expected.residual",
            id="residual-not-asked",
        ),
        pytest.param(
            "/attention",
            DIRECT_BODY,
            {"q_rotated": js(Q)},
            "expected.q_rotated",
            id="q_rotated-without-rope",
        ),
    ],
)
def test_bad_expected_is_422_naming_it(
    client: TestClient, endpoint: str, request_body: Json, expected: Json, named: str
) -> None:
    body = post(client, endpoint, {**request_body, "expected": expected}, status=422)
    assert named in error_fields(body), body


def test_earlier_steps_come_from_the_callers_arrays(client: TestClient) -> None:
    # Scores made large and positive (q, k > 0), so a loose rtol lets the caller's scaled scores
    # differ from ours by a per-row constant: row softmax ignores it, column softmax does not.
    q, k = np.abs(Q) + 1.5, np.abs(K) + 1.5
    req = {"q": js(q), "k": js(k), "v": js(V)}
    tol = {"atol": 0.0, "rtol": 0.3}
    scaled = ref_attention(q, k, V)["scaled_scores"]  # reference: ref_attention
    shifted = scaled + np.array([-1.0, -0.4, 0.4, 1.0])[:, None]
    theirs = softmax(shifted, axis=0)  # softmax_over_queries on the caller's own scaled scores
    # premises, by the contract's definition: the shifted scores match ours; the same mistake
    # recomputed from *our* scaled scores would not reproduce the caller's weights
    assert within(shifted, scaled, 0.0, 0.3)
    assert not within(theirs, softmax(scaled, axis=0), 0.0, 0.3)
    assert not within(theirs, softmax(scaled), 0.0, 0.3)  # and they are not the right weights
    body = post(
        client,
        "/attention",
        {
            **req,
            "tolerance": tol,
            "expected": {"scaled_scores": js(shifted), "weights": js(theirs)},
        },
    )
    assert entry(body, "scaled_scores")["match"] is True
    assert body["first_mismatch"] == "weights"
    assert entry(body, "weights")["diagnosis"]["mistakes"] == ["softmax_over_queries"]


def test_correct_scores_given_then_weights_over_queries(client: TestClient) -> None:
    # reference: ref_attention's scores (right) and a column softmax of its scaled scores
    ref = ref_attention(Q, K, V)
    expected = {
        "scores": js(ref["scores"]),
        "weights": js(softmax(ref["scaled_scores"], axis=0)),
    }
    body = post(client, "/attention", {**DIRECT_BODY, "expected": expected})
    assert entry(body, "scores")["match"] is True
    assert body["first_mismatch"] == "weights"
    assert entry(body, "weights")["diagnosis"]["mistakes"] == ["softmax_over_queries"]


# ---- warnings ----------------------------------------------------------------------------

FUTURE_ONLY = np.triu(np.ones((L, S), dtype=bool), 1)  # torch-style causal: true = masked


def polarity(body: Json) -> list[Json]:
    return [w for w in body.get("warnings", []) if w["code"] == "mask_polarity"]


BATCH2: Json = {
    "q": js(np.stack([Q, Q])),
    "k": js(np.stack([K, K])),
    "v": js(np.stack([V, V])),
}


@pytest.mark.parametrize(
    ("endpoint", "request_body"),
    [
        pytest.param(
            "/mask",
            {**DIRECT_BODY, "mask": [{"type": "boolean", "matrix": js_bool(FUTURE_ONLY)}]},
            id="mask-list",
        ),
        pytest.param(
            "/mask",
            {**DIRECT_BODY, "mask": {"type": "boolean", "matrix": js_bool(FUTURE_ONLY)}},
            id="mask-object",
        ),
        pytest.param(
            "/mask",
            {
                **BATCH2,
                "mask": {
                    "type": "boolean",
                    "matrix": np.stack([FUTURE_ONLY, FUTURE_ONLY]).astype(int).tolist(),
                },
            },
            id="batched-1_0-matrix",
        ),
        pytest.param(
            "/multihead",
            {**MH_BODY, "mask": {"type": "boolean", "matrix": js_bool(FUTURE_ONLY)}},
            id="multihead",
        ),
    ],
)
def test_inverted_causal_boolean_mask_warns(
    client: TestClient, endpoint: str, request_body: Json
) -> None:
    body = post(client, endpoint, request_body)
    found = polarity(body)
    assert len(found) == 1, body["warnings"]
    assert found[0]["field"] == "mask[0].matrix"  # as 422 errors name it ("mask[0].matrix is …")
    assert "true_means" in found[0]["message"] and "masked" in found[0]["message"]


def test_key_padding_mask_that_hides_every_key_warns(client: TestClient) -> None:
    # SDPA polarity (true = keep) pasted where torch means true = padding
    body = post(client, "/attention", {**DIRECT_BODY, "key_padding_mask": [True] * S})
    found = polarity(body)
    assert found and found[0]["field"] == "key_padding_mask", body["warnings"]


@pytest.mark.parametrize(
    ("endpoint", "extra"),
    [
        pytest.param("/attention", {}, id="no-mask"),
        pytest.param("/mask", {"mask": {"type": "causal"}}, id="causal"),
        pytest.param(
            "/mask", {"mask": {"type": "boolean", "matrix": js_bool(CAUSAL)}}, id="causal-boolean"
        ),
        pytest.param(
            "/mask",
            {"mask": {"type": "boolean", "matrix": js_bool(FUTURE_ONLY), "true_means": "masked"}},
            id="torch-style-true_means-masked",
        ),
        pytest.param(
            "/mask",
            {"mask": {"type": "boolean", "matrix": js_bool(MASK)}},
            id="ordinary-boolean",
        ),
        pytest.param("/attention", {"key_padding_mask": [False, False, True, True]}, id="padding"),
    ],
)
def test_no_warning_for_a_sensible_mask(client: TestClient, endpoint: str, extra: Json) -> None:
    body = post(client, endpoint, {**DIRECT_BODY, **extra})
    assert "warnings" not in body  # present only when there is something to warn about


# ---- options that change what is returned, and explanations that follow the request ------


def test_decimals_round_the_report_but_not_the_comparison(client: TestClient) -> None:
    # reference: ref_attention at full precision; decimals only rounds what is returned
    weights = ref_attention(Q, K, V)["weights"]
    body = post(
        client, "/attention", {**DIRECT_BODY, "decimals": 3, "expected": {"weights": js(weights)}}
    )
    assert entry(body, "weights")["match"] is True
    # a difference smaller than the rounding is reported exactly, not rounded away
    off = weights.copy()
    off[1, 2] += 2e-5
    body = post(
        client, "/attention", {**DIRECT_BODY, "decimals": 3, "expected": {"weights": js(off)}}
    )
    e = entry(body, "weights")
    assert (e["match"], e["where"]) == (False, [1, 2])
    assert e["max_abs_diff"] == pytest.approx(2e-5, rel=1e-6)
    assert e["yours"] == off[1, 2]
    assert e["ours"] == pytest.approx(weights[1, 2], abs=1e-12)
    assert body["weights"][1][2] == round(weights[1, 2], 3)  # the arrays are still rounded


def test_include_does_not_limit_what_is_compared(client: TestClient) -> None:
    # reference: ref_attention; weights compared although only output is returned
    weights = ref_attention(Q, K, V)["weights"]
    body = post(
        client,
        "/attention",
        {**DIRECT_BODY, "include": ["output"], "expected": {"weights": js(weights + 0.5)}},
    )
    assert body["first_mismatch"] == "weights"


def test_scale_missing_explanation_names_the_scale_the_request_gave(client: TestClient) -> None:
    # reference: softmax(Q Kᵀ) while the request asked for scale 0.1 (not 1/√d_k)
    body = post(
        client,
        "/attention",
        {**DIRECT_BODY, "scale": 0.1, "expected": {"weights": js(softmax(Q @ K.T))}},
    )
    diagnosis = entry(body, "weights")["diagnosis"]
    assert diagnosis["mistakes"] == ["scale_missing"]
    assert "0.1" in diagnosis["explanation"]
    assert "√d_k" not in diagnosis["explanation"], diagnosis["explanation"]


@pytest.mark.parametrize(
    ("endpoint", "request_body", "allowed"),
    [
        pytest.param(
            "/mask",
            {
                **DIRECT_BODY,
                "mask": {"type": "boolean", "matrix": js_bool(~MASK), "true_means": "masked"},
            },
            MASK,
            id="true_means-masked",
        ),
        pytest.param(
            "/attention",
            {**DIRECT_BODY, "key_padding_mask": [False, False, True, True]},
            np.broadcast_to(np.array([True, True, False, False]), (L, S)),
            id="key_padding_mask",
        ),
    ],
)
def test_mask_inverted_explanation_follows_the_masks_polarity(
    client: TestClient, endpoint: str, request_body: Json, allowed: npt.NDArray[np.bool_]
) -> None:
    # reference: the weights with the mask read the other way (allowed inverted)
    wrong = softmax(masked(Q @ K.T * SCALE, ~allowed))
    body = post(client, endpoint, {**request_body, "expected": {"weights": js(wrong)}})
    diagnosis = entry(body, "weights")["diagnosis"]
    assert diagnosis["mistakes"] == ["mask_inverted"]
    # here true already means masked / padding: "say true_means masked" would be wrong advice
    assert "here true means the query may attend" not in diagnosis["explanation"], diagnosis


# ---- properties --------------------------------------------------------------------------


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.integers(1, 5),
    st.integers(1, 5),
    st.integers(1, 5),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["scores", "weights", "output"]),
    st.data(),
)
def test_service_numbers_match_and_a_100_atol_change_never_does(
    client: TestClient,
    n_q: int,
    n_k: int,
    d: int,
    seed: int,
    name: str,
    data: st.DataObject,
) -> None:
    rng = np.random.default_rng(seed)
    req = {
        "q": js(rng.standard_normal((n_q, d))),
        "k": js(rng.standard_normal((n_k, d))),
        "v": js(rng.standard_normal((n_k, d))),
    }
    ours = post(client, "/attention", req)  # origin: the service's own response
    every = ("q", "k", "v", "scores", "scaled_scores", "weights", "output")
    body = post(client, "/attention", {**req, "expected": {n: ours[n] for n in every}})
    assert body["first_mismatch"] is None
    assert all(e["match"] and e["max_abs_diff"] == 0.0 for e in body["comparison"])
    arr = np.array(ours[name], dtype=np.float64)
    index = tuple(data.draw(st.integers(0, n - 1)) for n in arr.shape)
    sign = data.draw(st.sampled_from([-1.0, 1.0]))
    arr[index] += sign * 100 * (DEFAULT_ATOL + DEFAULT_RTOL * abs(arr[index]))
    body = post(client, "/attention", {**req, "expected": {name: js(arr)}})
    e = entry(body, name)
    assert e["match"] is False and body["first_mismatch"] == name
    assert e["where"] == list(index)


# ---- the reference itself, against PyTorch -----------------------------------------------


def test_reference_agrees_with_torch() -> None:
    torch = pytest.importorskip("torch")
    f = torch.nn.functional

    def t(a: Array) -> Any:
        return torch.tensor(a, dtype=torch.float64)

    ref = ref_attention(Q, K, V, CAUSAL)
    out = f.scaled_dot_product_attention(t(Q), t(K), t(V), attn_mask=t(CAUSAL).bool())
    np.testing.assert_allclose(ref["output"], out.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        softmax(Q @ K.T, axis=0), torch.softmax(t(Q) @ t(K).T, dim=-2).numpy(), rtol=1e-12
    )
    z = np.random.default_rng(3).standard_normal((L, 6))
    np.testing.assert_allclose(
        ref_layer_norm(z), f.layer_norm(t(z), (6,), eps=LN_EPS).numpy(), rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(
        ref_layer_norm(z, "all"), f.layer_norm(t(z), (L, 6), eps=LN_EPS).numpy(), atol=1e-12
    )
    # multi-head: in_out combined weights are nn.MultiheadAttention's in_proj_weight transposed
    mha = torch.nn.MultiheadAttention(D_K, 2, bias=False, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_weight.copy_(t(np.concatenate([W_Q.T, W_K.T, W_V.T])))
        mha.out_proj.weight.copy_(torch.eye(D_K, dtype=torch.float64))
    x = t(X)[None]
    out, w = mha(x, x, x, average_attn_weights=False)
    mh = ref_multihead(X, W_Q, W_K, W_V, 2)
    np.testing.assert_allclose(mh["output"], out[0].detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(mh["weights"], w[0].detach().numpy(), atol=1e-12)
    # RoPE, half style, as Hugging Face writes it: x·cos + rotate_half(x)·sin
    theta = 10000.0 ** (-torch.arange(0, D_K, 2, dtype=torch.float64) / D_K)
    ang = torch.outer(torch.arange(L, dtype=torch.float64), theta)
    emb = torch.cat([ang, ang], dim=-1)
    qt = t(Q)
    rotated = torch.cat([-qt[:, D_K // 2 :], qt[:, : D_K // 2]], dim=-1)
    hf = qt * emb.cos() + rotated * emb.sin()
    np.testing.assert_allclose(ref_rope(Q, "half"), hf.numpy(), atol=1e-12)
    # interleaved, as the RoFormer / GPT-J complex form: (x0 + i x1) · e^{i p θ}
    c = torch.view_as_complex(qt.reshape(L, D_K // 2, 2).contiguous())
    gptj = torch.view_as_real(c * torch.polar(torch.ones_like(ang), ang)).reshape(L, D_K)
    np.testing.assert_allclose(ref_rope(Q, "interleaved"), gptj.numpy(), atol=1e-12)


def test_cross_attention_is_recomputed_from_the_context(client: TestClient) -> None:
    # reference: ref_attention with K and V projected from the context (S = 5 ≠ L = 3) through
    # the transposed weights, as a notebook that used X Wᵀ with in_out weights computes them
    rng = np.random.default_rng(11)
    x, context = rng.normal(size=(3, 4)), rng.normal(size=(5, 4))
    w_q, w_k, w_v = (rng.normal(size=(4, 4)) for _ in range(3))
    wrong = ref_attention(x @ w_q.T, context @ w_k.T, context @ w_v.T)["weights"]
    body = post(
        client,
        "/attention",
        {"x": js(x), "context": js(context), "w_q": js(w_q), "w_k": js(w_k), "w_v": js(w_v),
         "expected": {"weights": js(wrong)}},
    )  # fmt: skip
    assert entry(body, "weights")["diagnosis"]["mistakes"] == ["weights_transposed"]


# ---- the diagnosis's budget --------------------------------------------------------------


def probe_request(length: int) -> tuple[Json, Array]:
    """Issue finding H2's probe: /multihead where 11 of the 13 listed mistakes can have happened
    (not mask_inverted, which needs a boolean mask, nor layer_norm_per_token) — two heads,
    RoPE, a causal mask, residual, layer norm, square w_o — and its block output from the
    reference (ref_attention per head on RoPE'd column blocks, W_o, x + ·, ref_layer_norm)."""
    rng = np.random.default_rng(21)
    d_model, h = 4, 2
    x = rng.standard_normal((length, d_model))
    w_q, w_k, w_v, w_o = (rng.standard_normal((d_model, d_model)) for _ in range(4))
    allowed = np.tril(np.ones((length, length), dtype=bool))
    d = d_model // h
    heads = [
        ref_attention(
            ref_rope((x @ w_q)[:, i * d : (i + 1) * d], "half"),
            ref_rope((x @ w_k)[:, i * d : (i + 1) * d], "half"),
            (x @ w_v)[:, i * d : (i + 1) * d],
            allowed,
        )["output"]
        for i in range(h)
    ]
    block = ref_layer_norm(x + np.concatenate(heads, axis=1) @ w_o)
    body: Json = {
        "x": js(x), "w_q": js(w_q), "w_k": js(w_k), "w_v": js(w_v), "w_o": js(w_o),
        "num_heads": h, "rope": {}, "mask": {"type": "causal"}, "residual": True,
        "layer_norm": True, "include": ["output"],
    }  # fmt: skip
    return body, block


def test_a_diagnosis_cut_short_by_its_budget_says_so(client: TestClient) -> None:
    # reference: probe_request's block output (L = 512) plus N(0, 1e-3) noise, which no set of
    # mistakes explains: all 214 sets would cost far more than 20 times the request's own numbers
    body, right = probe_request(512)
    noisy = right + np.random.default_rng(8).normal(0.0, 1e-3, right.shape)
    answer = post(client, "/multihead", {**body, "expected": {"output": js(noisy)}})
    e = entry(answer, "output")
    assert e["match"] is False and e["max_abs_diff"] < 1e-2  # the noise, nothing more
    assert e["diagnosis"] is None
    assert e["diagnosis_complete"] is False
    message = e["message"]
    tried = re.search(rf"The diagnosis stopped at its budget \({DIAGNOSIS_TIMES} times the numbers this request computes\) "
                      r"after trying (\d+) of the 214 candidate sets of mistakes", message)  # fmt: skip
    assert tried is not None and 0 < int(tried[1]) < 214, message
    for advice in ("compare an earlier step", "fewer heads", "shorter sequences"):
        assert advice in message, message
    assert "no listed mistake" not in message.lower()  # that would claim every set was tried


def test_a_full_diagnosis_is_complete_and_the_other_entries_null(client: TestClient) -> None:
    # reference: the same probe at L = 8, where every set fits the budget, plus N(0, 1e-3) noise
    body, right = probe_request(8)
    noisy = right + np.random.default_rng(8).normal(0.0, 1e-3, right.shape)
    answer = post(client, "/multihead", {**body, "expected": {"output": js(noisy)}})
    e = entry(answer, "output")
    assert (e["diagnosis"], e["diagnosis_complete"]) == (None, True)
    assert "no listed mistake, alone or in pairs" in e["message"].lower(), e["message"]
    # a diagnosis found; the entries that are not the first difference carry null
    weights = softmax(Q @ K.T * SCALE, axis=0)  # softmax_over_queries
    answer = post(client, "/attention", {**DIRECT_BODY, "expected": {
        "scores": js(Q @ K.T), "weights": js(weights), "output": js(weights @ V)}})  # fmt: skip
    assert [(x["name"], x["diagnosis_complete"]) for x in answer["comparison"]] == [
        ("scores", None),
        ("weights", True),
        ("output", None),
    ]
    assert entry(answer, "weights")["diagnosis"]["mistakes"] == ["softmax_over_queries"]


def test_diagnosis_complete_is_in_the_documented_comparison(client: TestClient) -> None:
    compared = client.get("/openapi.json").json()["components"]["schemas"]["Compared"]
    assert "diagnosis_complete" in compared["required"]
    assert "budget" in compared["properties"]["diagnosis_complete"]["description"]
