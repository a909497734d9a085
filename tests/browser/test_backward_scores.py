"""The score side's parameters in the page's backward (issue 44, lib/backward-scores.js), in a real
browser against a real server: grad_sinks (a sink is a logit with no value: −Σ p_sink · D over the
rows and batch items, per head) and T5's grad_relative_bias_table (the biased scores' gradient
summed by T5's bucket, head by head) are recomputed by the page for every cell, equal the
service's to 1e-12 and NumPy's or torch.autograd's written here (T5's buckets are transformers'
T5Attention._relative_position_bucket); and a sweep over the documented variants of /attention,
/mask and /multihead finds no gradient cell of the score side left "unexplained"."""

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from tests.browser.support import js_number, post_json
from tests.browser.test_backward_view import (
    D_O,
    RECOMPUTE_GRADIENTS,
    W_K,
    W_O,
    W_Q,
    W_V,
    K,
    Q,
    V,
    X,
    _pattern,
)

pytestmark = pytest.mark.e2e

Array = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
F64 = torch.float64
MINE = frozenset({"grad_sinks", "grad_relative_bias_table"})

# a boolean mask with a fully masked row (row 1) and padding-like gaps
HOLES = [[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1]]


def _rows(page: Any, endpoint: str, body: dict[str, Any], data: dict[str, Any]) -> list[Any]:
    """Every grad_* cell of the answer as the page recomputes it: [name, head, i, j, kind, the
    page's total or None, the service's]."""
    args = {"endpoint": endpoint, "data": data, "request": body}
    rows: list[Any] = page.evaluate(RECOMPUTE_GRADIENTS, args)
    return rows


def _walk(page: Any, server: str, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """Post ``body``; check every cell of the score side's parameters is computed and every
    computed cell equals the service's to 1e-12; return the answer and the page's cells."""
    data = post_json(server, endpoint, body)
    rows = _rows(page, endpoint, body, data)
    mine = [r for r in rows if r[0] in MINE]
    assert mine, "no cell of grad_sinks or grad_relative_bias_table"
    assert [r for r in mine if r[4] == "unexplained"] == []
    bad = [r for r in rows if r[5] is not None and abs(r[5] - r[6]) > 1e-12 * max(1, abs(r[6]))]
    assert bad == [], bad[:10]
    return {"data": data, "page": {(r[0], r[2], r[3]): r[5] for r in rows if r[1] is None}}


def _explain(page: Any, endpoint: str, body: dict[str, Any], data: dict[str, Any],
             name: str, i: int, j: int) -> tuple[float, str]:  # fmt: skip
    """explain.js's explanation of a top-level gradient cell: its total and its text."""
    total, text, mismatch = page.evaluate(
        """async ([endpoint, data, request, name, i, j]) => {
          const m = await import('/static/explain.js');
          const box = m.explainCell({endpoint, data, request, name, head: null, batch: null, i, j});
          document.body.append(box);  // laid out: innerText has the table's tabs
          const t = box.querySelector('.explain-total');
          const out = [Number(t.dataset.total), box.innerText,
                       !!box.querySelector('.explain-mismatch')];
          box.remove();
          return out;
        }""",
        [endpoint, data, body, name, i, j],
    )
    assert not mismatch, text
    return float(total), str(text)


def _f6(x: float) -> str:
    return js_number(float(x), 6, trim=False)


# ---- NumPy: the softmax with a sink and its backward ---------------------------------------


def _sink_head(
    q: Array, k: Array, v: Array, d_o: Array, sink: float, allowed: Bools, padded: Bools
) -> dict[str, Any]:
    """One head's attention with a sink logit (gpt-oss: one more key with no value), scale
    1/√d_k, and its backward by hand: the sink's share, D, dS and ∂loss/∂sink."""
    s = np.where(allowed, q @ k.T / np.sqrt(q.shape[1]), -np.inf)
    m = np.maximum(s.max(axis=1), sink)
    e, e_sink = np.exp(s - m[:, None]), np.exp(sink - m)
    z = e.sum(axis=1) + e_sink
    p, p_sink = e / z[:, None], e_sink / z
    p[padded], p_sink[padded] = 0.0, 0.0  # a padded query row attends to nothing
    o = p @ v
    d_p = d_o @ v.T
    d = (d_o * o).sum(axis=1)
    return {"p_sink": p_sink, "D": d, "dS": p * (d_p - d[:, None]), "sink": -(p_sink * d).sum()}


def test_the_sink_of_attention_is_numpys(page: Any, server: str) -> None:
    """/attention with one sink, a mask with a fully masked row: grad_sinks = −Σ p_sink · D,
    NumPy's, explained with its rows' terms; a dS cell NumPy's too."""
    body = {"q": Q, "k": K, "v": V, "sinks": -0.3, "grad_output": _pattern(4, 2),
            "mask": {"type": "boolean", "matrix": HOLES}}  # fmt: skip
    got = _walk(page, server, "attention", body)
    allowed = np.array(HOLES, dtype=bool)
    ref = _sink_head(np.array(Q), np.array(K), np.array(V), np.array(_pattern(4, 2)), -0.3,
                     allowed, np.zeros(4, dtype=bool))  # fmt: skip
    assert got["page"][("grad_sinks", 0, 0)] == pytest.approx(ref["sink"], abs=1e-12, rel=1e-12)
    assert got["page"][("grad_masked_scores", 2, 1)] == pytest.approx(ref["dS"][2, 1], abs=1e-12)
    total, text = _explain(page, "attention", body, got["data"], "grad_sinks", 0, 0)
    assert total == pytest.approx(ref["sink"], abs=1e-12, rel=1e-12)
    assert "grad_sinks[0] = Σ_i p_sink[i] · (0 − D[i]) = −Σ_i sink_weights[i] · D[i]" in text
    assert ref["p_sink"][1] == 1.0 and ref["D"][1] == 0.0  # the fully masked row: all sink, D 0
    term = -ref["p_sink"][2] * ref["D"][2]  # row 2's: p_sink, D and their −product
    assert f"2\t{_f6(ref['p_sink'][2])}\t{_f6(ref['D'][2])}\t{_f6(term)}" in text, text


def test_each_heads_sink_of_a_batched_grouped_multihead_is_numpys(page: Any, server: str) -> None:
    """/multihead, two query heads sharing one key/value head, two batch items, the second's
    last query padded: grad_sinks[h] sums −p_sink · D over both items' rows, NumPy's."""
    xs = [X, [r[::-1] for r in X]]
    d_os = [D_O, [r[::-1] for r in D_O]]
    w_k, w_v = [r[:2] for r in W_K], [r[:2] for r in W_V]
    sinks = [0.4, -0.6]
    body = {"x": xs, "w_q": W_Q, "w_k": w_k, "w_v": w_v, "num_heads": 2, "num_kv_heads": 1,
            "sinks": sinks, "mask": {"type": "padding", "query_lengths": [3, 2]},
            "grad_output": d_os}  # fmt: skip
    got = _walk(page, server, "multihead", body)
    want = np.zeros(2)
    for b in range(2):
        x = np.array(xs[b])
        q, k, v = x @ np.array(W_Q), x @ np.array(w_k), x @ np.array(w_v)
        padded = np.arange(3) >= [3, 2][b]
        for h in range(2):
            cols = slice(2 * h, 2 * h + 2)
            d_o = np.array(d_os[b])[:, cols]  # no W_o: the head's columns of dO
            ref = _sink_head(q[:, cols], k, v, d_o, sinks[h], np.ones((3, 3), bool), padded)
            want[h] += ref["sink"]
    for h in range(2):
        total = got["page"][("grad_sinks", 0, h)]
        assert total == pytest.approx(want[h], abs=1e-12, rel=1e-12), h
    _, text = _explain(page, "multihead", body, got["data"], "grad_sinks", 0, 1)
    assert "over the rows and batch items (b.i: item b, row i), head 1" in text, text
    assert "\n1.2\t0\t0\t-0\n" in text or "\n1.2\t0\t0\t0\n" in text, text  # item 1's padded row


# ---- torch: T5's relative bias, its table a leaf ----------------------------------------------


def _t5_table_grad(
    qkv: Tensors, table: Array, d_o: Array, rel: torch.Tensor, t5: tuple[bool, int], causal: bool
) -> Array:
    """∂loss/∂table by torch.autograd in float64: q, k, v (…, h, L|S, d), the bias
    table[bucket(rel)][h] (transformers' bucket; t5: bidirectional, max_distance) added to the
    scaled scores, an optional causal mask, the softmax, loss = Σ output ∘ d_o."""
    q, k, v = qkv
    t = torch.tensor(table, dtype=F64, requires_grad=True)
    bucket = T5Attention._relative_position_bucket(rel, t5[0], t.shape[0], t5[1])  # type: ignore[no-untyped-call]
    bias = t[bucket].permute(2, 0, 1)  # (h, L, S)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    out = s.softmax(-1) @ v
    (out * torch.tensor(d_o, dtype=F64)).sum().backward()
    assert t.grad is not None
    return t.grad.numpy()


def test_t5_table_of_attention_is_torchs(page: Any, server: str) -> None:
    """/attention, a T5 table of 8 buckets as a vector, queries at shifted positions: each cell
    of grad_relative_bias_table is torch.autograd's (transformers' buckets), explained with the
    (query, key, bucket, term) cells it sums."""
    table = [0.1, -0.2, 0.3, 0.05, -0.4, 0.2, 0.15, -0.1]
    positions = [3, 4, 5, 9]
    body = {"q": Q, "k": K, "v": V, "grad_output": _pattern(4, 2), "positions": positions,
            "relative_bias": {"table": table, "max_distance": 6}}  # fmt: skip
    got = _walk(page, server, "attention", body)
    rel = torch.arange(4)[None, :] - torch.tensor(positions)[:, None]  # keys at 0 … S − 1
    qkv = (torch.tensor(Q, dtype=F64)[None], torch.tensor(K, dtype=F64)[None],
           torch.tensor(V, dtype=F64)[None])  # fmt: skip
    d_o = np.array(_pattern(4, 2))[None]
    want = _t5_table_grad(qkv, np.array(table)[:, None], d_o, rel, (True, 6), causal=False)
    for b in range(8):
        total = got["page"][("grad_relative_bias_table", b, 0)]
        assert total == pytest.approx(want[b, 0], abs=1e-12, rel=1e-12), b
    assert any(want[b, 0] == 0.0 for b in range(8))  # a bucket no cell falls in
    total, text = _explain(page, "attention", body, got["data"], "grad_relative_bias_table", 1, 0)
    assert total == pytest.approx(want[1, 0], abs=1e-12, rel=1e-12)
    assert "whose bucket(p'_k − p_q) is 1" in text, text
    assert "\t-1\t1\t" in text  # a cell at relative position −1, bucket 1
    assert "query ↔ key" not in text and "feature" not in text  # no (query, feature) line


def test_t5_table_of_a_batched_causal_multihead_is_torchs(page: Any, server: str) -> None:
    """/multihead, two heads, two batch items, causal, T5's unidirectional table of 4 buckets:
    grad_relative_bias_table[b][h] sums both items' cells by bucket; torch.autograd's."""
    table = [[0.1 * (b - 1) + 0.05 * h for h in range(2)] for b in range(4)]
    xs = [X, [r[::-1] for r in X]]
    d_os = [D_O, [r[::-1] for r in D_O]]
    body = {"x": xs, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "num_heads": 2, "grad_output": d_os,
            "mask": {"type": "causal"},
            "relative_bias": {"table": table, "bidirectional": False, "max_distance": 3}}  # fmt: skip
    got = _walk(page, server, "multihead", body)
    x = torch.tensor(xs, dtype=F64)  # (B, L, d)
    q, k, v = ((x @ torch.tensor(w, dtype=F64)).view(2, 3, 2, 2).transpose(1, 2)
               for w in (W_Q, W_K, W_V))  # fmt: skip
    d_o = np.array(d_os).reshape(2, 3, 2, 2).transpose(0, 2, 1, 3)  # (B, h, L, d_v)
    rel = torch.arange(3)[None, :] - torch.arange(3)[:, None]
    want = _t5_table_grad((q, k, v), np.array(table), d_o, rel, (False, 3), causal=True)
    for b in range(4):
        for h in range(2):
            total = got["page"][("grad_relative_bias_table", b, h)]
            assert total == pytest.approx(want[b, h], abs=1e-12, rel=1e-12), (b, h)
    _, text = _explain(page, "multihead", body, got["data"], "grad_relative_bias_table", 1, 1)
    assert "head 1, summed over the batch items" in text and "1.2\t1\t-1\t1\t" in text, text


# ---- the sweep: every documented variant, no score-side cell left unexplained ---------------

_A = {"q": Q, "k": K, "v": V, "grad_output": _pattern(4, 2)}
_M = {"x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "num_heads": 2, "grad_output": D_O}
_T5 = [[0.1 * (b - 3) + 0.05 * h for h in range(2)] for b in range(8)]
_TABLE = [0.1, -0.2, 0.3, 0.05, -0.4, 0.2, 0.15, -0.1]
_CTX = [r[::-1] for r in X] + [X[0]]
_PROJ = {"x": X, "w_q": [r[:3] for r in W_Q], "w_k": [r[:3] for r in W_K], "w_v": W_V,
         "grad_output": D_O}  # fmt: skip
_GQA = {"w_k": [r[:2] for r in W_K], "w_v": [r[:2] for r in W_V], "num_kv_heads": 1}
_PAST = {"q": Q[2:], "k": K[2:], "v": V[2:], "past": {"k": K[:2], "v": V[:2]},
         "mask": {"type": "causal"}, "grad_output": _pattern(2, 2)}  # fmt: skip
_T5_CONFIG = {"model_type": "t5", "d_model": 4, "d_kv": 2, "num_heads": 2, "is_decoder": False,
              "relative_attention_num_buckets": 8, "relative_attention_max_distance": 6}  # fmt: skip
_T5_STATE = {"x": X, "q.weight": [list(c) for c in zip(*W_Q, strict=True)],
             "k.weight": [list(c) for c in zip(*W_K, strict=True)],
             "v.weight": [list(c) for c in zip(*W_V, strict=True)],
             "o.weight": [list(c) for c in zip(*W_O, strict=True)],
             "relative_attention_bias.weight": _T5, "config": _T5_CONFIG, "grad_output": D_O}  # fmt: skip
SWEEP: list[tuple[str, str, dict[str, Any]]] = [
    ("alibi", "attention", {**_A, "alibi": True}),
    ("alibi_symmetric", "attention", {**_A, "alibi": {"symmetric": True}}),
    ("alibi_origin_zero", "attention", {**_A, "alibi": {"origin": "zero"}}),
    ("alibi_last_key_slopes", "attention", {**_A, "alibi": {"origin": "last_key", "slopes": [0.7]}}),
    ("t5_causal", "attention", {**_A, "relative_bias": {"table": _TABLE, "max_distance": 6},
                                "mask": {"type": "causal"}}),
    ("t5_unidirectional_column", "attention", {**_A, "positions": [2, 3, 4, 5],
     "relative_bias": {"table": [[0.1], [-0.2], [0.3], [0.05]], "bidirectional": False,
                       "max_distance": 4}}),
    ("t5_float32_tie", "attention", {**_A, "positions": [24, 26, 30, 40],
     "context_positions": [0, 0, 2, 6], "relative_bias": {"table": [0.01 * b for b in range(24)],
                                                          "bidirectional": False, "max_distance": 96}}),
    ("t5_far_positions", "attention", {**_A, "positions": [2**40, 5, 17, 300],
     "context_positions": [0, 2**40 + 3, 9, 1000], "relative_bias": {"table": _TABLE}}),
    ("t5_past", "attention", {**_PAST, "relative_bias": {"table": _TABLE, "max_distance": 6}}),
    ("t5_softcap_sink", "attention", {**_A, "softcap": 0.9, "sinks": 0.2, "mask": {"type": "causal"},
     "relative_bias": {"table": [[0.1], [-0.2], [0.3], [0.05]], "max_distance": 4}}),
    ("additive_bias", "attention", {**_A, "mask": {"type": "additive", "matrix":
     [[0, -1, None, 0.5], [0.2, 0, 0, None], [0, 0, 0, 0], [1, None, -0.5, 0]]}}),
    ("window", "attention", {**_A, "mask": {"type": "window", "left": 1, "right": 0}}),
    ("chunked", "attention", {**_A, "mask": {"type": "chunked", "size": 2}}),
    ("padding", "attention", {**_A, "mask": {"type": "padding", "key_lengths": 3,
                                             "query_lengths": 3}}),
    ("boolean_uniform", "attention", {**_A, "mask": {"type": "boolean", "matrix": HOLES},
                                      "fully_masked_rows": "uniform"}),
    ("causal_lower_right", "attention", {"q": Q[:2], "k": K, "v": V, "grad_output": _pattern(2, 2),
     "mask": {"type": "causal", "alignment": "lower_right"}}),
    ("key_padding_mask", "attention", {**_A, "key_padding_mask": [False, True, False, False]}),
    ("sinks", "attention", {**_A, "sinks": 0.4}),
    ("sinks_fully_masked", "attention", {**_A, "sinks": -0.3, "mask": {"type": "boolean",
                                                                       "matrix": HOLES}}),
    ("sinks_padded", "attention", {**_A, "sinks": 0.2, "mask": {"type": "padding",
                                                                "query_lengths": 3}}),
    ("sinks_past", "attention", {**_PAST, "sinks": 0.7}),
    ("online_softmax", "attention", {**_A, "online_softmax": {"block_size": 2},
                                     "mask": {"type": "causal"}}),
    ("online_softmax_sink", "attention", {**_A, "online_softmax": {"block_size": 3}, "sinks": 0.5}),
    ("temperature_rope", "attention", {**_A, "temperature": {"floor_scale": 2, "attn_scale": 0.5},
     "rope": {"rotary_dim": 2}, "positions": [3, 4, 5, 6]}),
    ("temperature_shift_0_alibi", "attention", {**_A, "alibi": True, "positions": [0, 1, 2, 3],
     "temperature": {"floor_scale": 2, "attn_scale": 0.5, "position_shift": 0}}),
    ("scale_softcap", "attention", {**_A, "scale": 0.8, "softcap": 1.5}),
    ("sum", "attention", {**_A, "grad_output": "sum", "mask": {"type": "causal"}}),
    ("batched_padding_sink", "attention", {"q": [Q, Q[::-1]], "k": [K, K], "v": [V, V[::-1]],
     "mask": {"type": "padding", "key_lengths": [4, 2]}, "sinks": 0.1,
     "grad_output": [_pattern(4, 2), _pattern(4, 2)[::-1]]}),
    ("batched_t5", "attention", {"q": [Q, Q[::-1]], "k": [K, K], "v": [V, V[::-1]],
     "relative_bias": {"table": [0.1, -0.2, 0.3, 0.05], "max_distance": 4},
     "grad_output": [_pattern(4, 2), _pattern(4, 2)[::-1]]}),
    ("cross_attention", "attention", {**_PROJ, "context": _CTX}),
    ("cross_attention_alibi", "attention", {**_PROJ, "context": _CTX, "alibi": True}),
    ("mask_causal", "mask", {**_A, "mask": {"type": "causal"}}),
    ("mask_key_padding_sinks", "mask", {**_A, "key_padding_mask": [False, False, True, False],
                                        "sinks": 0.3}),
    ("mh_sinks", "multihead", {**_M, "sinks": [0.3, -0.5], "mask": {"type": "causal"}}),
    ("mh_t5", "multihead", {**_M, "relative_bias": {"table": _T5, "max_distance": 6}}),
    ("mh_t5_unidirectional", "multihead", {**_M, "mask": {"type": "causal"},
     "relative_bias": {"table": _T5[:4], "bidirectional": False, "max_distance": 3}}),
    ("mh_t5_config_state_dict", "multihead", _T5_STATE),
    ("mh_t5_block_sinks", "multihead", {**_M, "relative_bias": {"table": _T5, "max_distance": 6},
     "w_o": W_O, "residual": True, "layer_norm": True, "sinks": [0.1, 0.2]}),
    ("mh_heads_given_t5_sinks", "multihead", {"q": [Q, Q[::-1]], "k": [K, K[::-1]], "v": [V, V],
     "relative_bias": {"table": _T5, "max_distance": 6}, "sinks": [0.2, -0.4],
     "grad_output": [r + r[::-1] for r in _pattern(4, 2)]}),
    ("mh_alibi", "multihead", {**_M, "alibi": True}),
    ("mh_alibi_slopes", "multihead", {**_M, "alibi": {"slopes": [0.5, 0.25], "origin": "last_key"}}),
    ("mh_positional_encoding", "multihead", {**_M, "positional_encoding": "sinusoidal"}),
    ("mh_positional_matrix", "multihead", {**_M, "positional_encoding":
     [[0.1 * (i - c) for c in range(4)] for i in range(3)]}),
    ("mh_cross_attention", "multihead", {**_M, "context": _CTX}),
    ("mh_batched_padding_sinks", "multihead", {**_M, "x": [X, X[::-1]],
     "grad_output": [D_O, D_O[::-1]], "mask": {"type": "padding", "key_lengths": [3, 2]},
     "sinks": [0.1, 0.2]}),
    ("mh_batched_t5", "multihead", {**_M, "x": [X, X[::-1]], "grad_output": [D_O, D_O[::-1]],
     "relative_bias": {"table": _T5, "max_distance": 6}}),
    ("mh_padded_queries", "multihead", {**_M, "mask": {"type": "padding", "query_lengths": 2}}),
    ("mh_online_softmax_sinks", "multihead", {**_M, "online_softmax": {"block_size": 2},
     "sinks": [0.5, -1.0], "mask": {"type": "causal"}}),
    ("mh_temperature_alibi", "multihead", {**_M, "alibi": True, "positions": [3, 4, 5],
     "temperature": {"floor_scale": 2, "attn_scale": 0.5}}),
    ("mh_window", "multihead", {**_M, "mask": {"type": "window", "left": 1, "right": 1}}),
    ("mh_chunked", "multihead", {**_M, "mask": {"type": "chunked", "size": 2}}),
    ("mh_additive", "multihead", {**_M, "mask": {"type": "additive",
     "matrix": [[0, -1, None], [0.2, 0, 0], [0, 0.5, 0]]}}),
    ("mh_uniform", "multihead", {**_M, "fully_masked_rows": "uniform",
     "mask": {"type": "boolean", "matrix": [[1, 0, 1], [0, 0, 0], [1, 1, 1]]}}),
    ("mh_gqa_sinks", "multihead", {**_M, **_GQA, "sinks": [0.3, -0.2]}),
    ("mh_gqa_batched_rms", "multihead", {**_M, **_GQA, "x": [X, [r[::-1] for r in X]],
     "grad_output": [D_O, D_O[::-1]], "qk_norm": {"over": "projection"}}),
    ("mh_k_eq_v_heads", "multihead", {"q": [Q, [r[::-1] for r in Q]], "k": [K], "num_heads": 2,
     "num_kv_heads": 1, "k_eq_v": True, "mask": {"type": "causal"}, "grad_output": "sum"}),
    ("mh_k_eq_v_x", "multihead", {**{k: v for k, v in _M.items() if k != "w_v"},
     "k_eq_v": True, "mask": {"type": "causal"}}),
]  # fmt: skip


def test_no_cell_of_any_variant_is_unexplained(page: Any, server: str) -> None:
    """Every documented variant of /attention, /mask and /multihead with grad_output: each cell
    the page computes equals the service's to 1e-12, and no cell is left "unexplained" (the
    cross-attention's context, the weights under a positional encoding, a key/value head's
    gradient and a config's block included)."""
    found: dict[str, Any] = {}
    for name, endpoint, body in SWEEP:
        data = post_json(server, endpoint, body)
        rows = _rows(page, endpoint, body, data)
        lost = sorted({r[0] for r in rows if r[4] == "unexplained"})
        if name == "mh_gqa_batched_rms":  # [B][h_kv][S][·]: each item's key/value head's cells
            assert {(r[0], r[7]) for r in rows} >= {("grad_k", 0), ("grad_v", 0)}, name
        bad = [r for r in rows if r[5] is not None and abs(r[5] - r[6]) > 1e-12 * max(1, abs(r[6]))]
        if lost or bad:
            found[name] = (lost, bad[:3])
        if "sinks" in body or "relative_bias" in body or "relative_attention_bias.weight" in body:
            assert {r[0] for r in rows} & MINE, name
    assert found == {}
