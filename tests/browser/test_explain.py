"""The explorer's cell explanations (service/static/explain.js) in a real browser: the page's own
recomputation of every cell of every explainable map must give the service's numbers."""

import json
import math
import re
from typing import Any

import pytest

from service.wire import examples as ex
from tests.browser.support import ARTIFACTS, fill_generated, js_number, post_json, run_form

pytestmark = pytest.mark.e2e

MAPS = [
    "scores", "scaled_scores", "capped_scores", "position_bias", "biased_scores", "masked_scores",
    "weights",
]  # fmt: skip

# RoPE with every setting away from its default, after qk_norm, at shifted positions; keys at
# positions of their own (cross-attention's context_positions)
ROPE_ODD: dict[str, Any] = {
    "q": [[0.3, -1.2, 0.7, 2.0, -0.4, 1.1], [1.5, 0.2, -0.9, 0.4, 0.8, -1.3], [-0.6, 0.9, 1.4, -0.2, 0.5, 0.3]],
    "k": [[0.8, 0.1, -1.1, 0.6, 1.2, -0.7], [-0.3, 1.6, 0.4, -0.9, 0.2, 0.5], [1.0, -0.8, 0.3, 1.3, -1.4, 0.9], [0.2, 0.4, -0.6, 0.1, 0.7, -0.2]],
    "v": [[1, 0], [0, 1], [1, 1], [2, -1]],
    "qk_norm": True,
    "rope": {"base": 100, "style": "interleaved", "rotary_dim": 4, "scaling": {"type": "linear", "factor": 2}},
    "positions": [40, 41, 42],
    "context_positions": [7, 20, 30, 41],
}  # fmt: skip
# ALiBi on one head, symmetric, with positions; and T5's learned table
ALIBI_SYMMETRIC: dict[str, Any] = {
    "q": [[1, 0], [0, 1], [1, 1]], "k": [[1, 0], [0, 1], [1, 1]], "v": [[1, 0], [0, 1], [1, 1]],
    "alibi": {"symmetric": True}, "positions": [3, 5, 9], "context_positions": [0, 4, 9],
}  # fmt: skip
T5_BIAS: dict[str, Any] = {
    "q": [[1, 0], [0, 1], [1, 1]], "k": [[1, 0], [0, 1], [1, 1]], "v": [[1, 0], [0, 1], [1, 1]],
    "relative_bias": {"table": [0.5, -0.25, 1.0, 0.125, -1.5, 0.75, 0.0, 2.0]},
}  # fmt: skip

# every key padded away: each row is fully masked
FULLY_MASKED: dict[str, Any] = {
    "q": [[1, 0], [0, 1]],
    "k": [[1, 0], [0, 1]],
    "v": [[1, 2], [3, 4]],
    "mask": {"type": "padding", "key_lengths": [0]},
}


def _rows(n: int, d: int, seed: int) -> list[list[float]]:
    """n rows of d numbers in [−1.5, 1.5], the same on every run."""
    return [[round(1.5 * math.sin(seed + 1.7 * i + 0.9 * t + 0.31 * i * t), 4) for t in range(d)]
            for i in range(n)]  # fmt: skip


# RoPE's scalings for long contexts (service/core/rope_scaling.py), each past its original
# context. YaRN as gpt-oss (base 150000, truncate false): with r = 32 the ramp runs from pair 0
# to 1.25, so pair 0 is kept, pair 1 blended and pairs 2…15 interpolated (θ/32); cos and sin ×
# 0.1·ln 32 + 1
ROPE_YARN: dict[str, Any] = {
    "q": _rows(3, 32, 0), "k": _rows(4, 32, 1), "v": _rows(4, 2, 2),
    "rope": {"base": 150000, "scaling": {"type": "yarn", "factor": 32, "original_max_position": 16,
                                         "truncate": False}},
    "positions": [20, 24, 31], "context_positions": [0, 17, 20, 31],
}  # fmt: skip
# YaRN as DeepSeek (truncated ramp, the attention factor from mscale and mscale_all_dim),
# interleaved and partial, on /multihead (the stages' RoPE)
ROPE_YARN_MSCALE: dict[str, Any] = {
    "sentence": "one two three four", "seed": 3, "d_model": 16, "num_heads": 2,
    "rope": {"base": 10, "style": "interleaved", "rotary_dim": 6,
             "scaling": {"type": "yarn", "factor": 4, "original_max_position": 8, "mscale": 0.707,
                         "mscale_all_dim": 1}},
    "positions": [30, 31, 40, 41],
}  # fmt: skip
# dynamic NTK: n = 16 > 8, so the base grows to 10000·(2·16/8 − 1)^(8/6); keys past n too
ROPE_DYNAMIC: dict[str, Any] = {
    "q": _rows(3, 8, 3), "k": _rows(4, 8, 4), "v": _rows(4, 2, 5),
    "rope": {"scaling": {"type": "dynamic", "factor": 2, "original_max_position": 8}},
    "positions": [9, 12, 15], "context_positions": [0, 4, 15, 20],
}  # fmt: skip
# dynamic NTK within its original context (n = 4 ≤ 8): nothing changes, on /multihead
ROPE_DYNAMIC_WITHIN: dict[str, Any] = {
    "sentence": "one two three four", "seed": 5, "d_model": 16, "num_heads": 2,
    "rope": {"scaling": {"type": "dynamic", "factor": 2, "original_max_position": 8}},
}  # fmt: skip
# LongRoPE (Phi-3) on rotary_dim 6 of d_k 8, on both sides of its original context 8: n = 6
# takes short_factor (the keys past 8 too, as they take the queries' n), n = 11 long_factor;
# the attention factor from max_position/original, then from the factor given
_LONGROPE = {"type": "longrope", "short_factor": [1.0, 1.25, 2.5], "long_factor": [1.5, 3.0, 7.5],
             "original_max_position": 8}  # fmt: skip
ROPE_LONGROPE_SHORT: dict[str, Any] = {
    "q": _rows(4, 8, 6), "k": _rows(4, 8, 7), "v": _rows(4, 2, 8),
    "rope": {"base": 500, "rotary_dim": 6, "scaling": {**_LONGROPE, "max_position": 32}},
    "positions": [0, 1, 2, 5], "context_positions": [0, 3, 9, 12],
}  # fmt: skip
ROPE_LONGROPE_LONG: dict[str, Any] = {
    **ROPE_LONGROPE_SHORT,
    "rope": {"base": 500, "rotary_dim": 6, "scaling": {**_LONGROPE, "factor": 3}},
    "positions": [6, 9, 10, 10],
}
# Gemma 4's proportional RoPE: pairs (i, i + 4) over d_k 8, θ_i = 100^(−2i/8) for the first
# rotary_dim/2 = 2 pairs, the other two unturned
ROPE_PROPORTIONAL: dict[str, Any] = {
    "q": _rows(3, 8, 9), "k": _rows(3, 8, 10), "v": _rows(3, 2, 11),
    "rope": {"base": 100, "style": "proportional", "rotary_dim": 4},
    "positions": [3, 7, 11],
}  # fmt: skip
ROPE_SCALED = [
    ("rope_yarn_gpt_oss", "attention", ROPE_YARN),
    ("rope_yarn_mscale_interleaved", "multihead", ROPE_YARN_MSCALE),
    ("rope_dynamic_ntk_past_original", "attention", ROPE_DYNAMIC),
    ("rope_dynamic_ntk_within_original", "multihead", ROPE_DYNAMIC_WITHIN),
    ("rope_longrope_short", "attention", ROPE_LONGROPE_SHORT),
    ("rope_longrope_long", "attention", ROPE_LONGROPE_LONG),
    ("rope_proportional", "attention", ROPE_PROPORTIONAL),
]

# (id, endpoint, request); decimals and include are dropped so the numbers are the full doubles
EXAMPLES: list[tuple[str, str, dict[str, Any]]] = [
    ("batman", "attention", ex.I_AM_BATMAN),
    ("causal_four_tokens", "mask", ex.CAUSAL_FOUR_TOKENS),
    ("two_heads_full_block", "multihead", ex.TWO_HEADS_FULL_BLOCK),
    ("sink_causal", "attention", ex.SINK_CAUSAL),
    ("softcap_large_scores", "attention", ex.SOFTCAP_LARGE_SCORES),
    ("alibi_window", "mask", ex.ALIBI_WINDOW),
    ("llama_layer_rope_gqa", "multihead", ex.LLAMA_LAYER),
    ("rope_interleaved_linear_qk_norm", "attention", ROPE_ODD),
    ("alibi_six_heads", "multihead", ex.ALIBI_SIX_HEADS),
    ("alibi_symmetric_positions", "attention", ALIBI_SYMMETRIC),
    ("t5_relative_bias", "attention", T5_BIAS),
    ("padded_batch", "mask", ex.PADDED_BATCH),
    ("fully_masked_rows_zero", "mask", {**FULLY_MASKED}),
    ("fully_masked_rows_uniform", "mask", {**FULLY_MASKED, "fully_masked_rows": "uniform"}),
    *ROPE_SCALED,
]

RECOMPUTE_ALL = """async (args) => {
  const m = await import('/static/explain.js');
  const {endpoint, data, request, maps} = args;
  const enc = (x) => (x === null || x === undefined) ? null
    : (x === -Infinity ? '-inf' : (Number.isNaN(x) ? 'nan' : x));
  const heads = endpoint === 'multihead' ? data.heads.map((_, h) => h) : [null];
  const batched = Array.isArray(data.scores ?? data.heads?.[0]?.scores)
    && Array.isArray((data.scores ?? data.heads[0].scores)[0][0]);
  const batches = batched ? [0, (data.scores ?? data.heads[0].scores).length - 1] : [null];
  const out = [];
  for (const head of heads) for (const batch of batches) for (const name of [...maps, 'output']) {
    const src = head === null ? data : data.heads[head];
    let a = src[name];
    if (a === undefined || (endpoint === 'multihead' && head === null && name === 'output')) continue;
    if (batch !== null) a = a[batch];
    for (let i = 0; i < a.length; i++) for (let j = 0; j < a[i].length; j++) {
      const ctx = {endpoint, data, request, name, head, batch, i, j};
      const r = m.recompute(ctx);
      if (r !== null && r.lookedUp) continue;  // T5's bias: the service's number, shown as such
      out.push([name, head, batch, i, j, r === null ? 'none' : enc(r.total),
                r === null ? 'none' : enc(r.service)]);
    }
  }
  return out;
}"""


def _full(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("decimals", "include")}


def _value(x: Any) -> float:
    if x is None or x == "-inf":
        return -math.inf
    assert isinstance(x, (int, float)), x
    return float(x)


@pytest.mark.parametrize(
    ("endpoint", "body"), [(e, b) for _, e, b in EXAMPLES], ids=[n for n, _, _ in EXAMPLES]
)
def test_every_cell_recomputed_in_the_page_matches_the_service(
    page: Any, server: str, endpoint: str, body: dict[str, Any]
) -> None:
    request = _full(body)
    data = post_json(server, endpoint, request)
    rows = page.evaluate(
        RECOMPUTE_ALL, {"endpoint": endpoint, "data": data, "request": request, "maps": MAPS}
    )
    names = {r[0] for r in rows}
    assert "weights" in names and "scores" in names and "output" in names, names
    bad = []
    for name, head, batch, i, j, total, service in rows:
        where = f"{name}[{i}][{j}] head={head} batch={batch}"
        if total == "none":
            bad.append(f"{where}: not explained")
            continue
        t, s = _value(total), _value(service)
        if math.isinf(s) or math.isinf(t):
            if t != s:
                bad.append(f"{where}: page {t} service {s}")
        elif abs(t - s) > 1e-12 * max(1.0, abs(s)):
            bad.append(f"{where}: page {t!r} service {s!r}")
    assert bad == [], "\n".join(bad[:20])


def test_the_variants_are_in_the_examples_checked(server: str) -> None:
    """The parametrized test above covers RoPE, the sink, the cap, the mask and a batch."""
    seen = set()
    for _, endpoint, body in EXAMPLES:
        data = post_json(server, endpoint, _full(body))
        seen |= set(data) | {k for h in data.get("heads", []) for k in h}
    assert {"q_rotated", "sink_weights", "capped_scores", "additive_mask", "position_bias"} <= seen


# The page's RoPE (lib/positions.js through explain.ropeOf) turning every query and key row of
# every head: [head, i, q turned by the page, j, k turned by the page]
ROTATE_ALL = """async (args) => {
  const m = await import('/static/explain.js');
  const {endpoint, data, request} = args;
  const heads = endpoint === 'multihead' ? data.heads.map((_, h) => h) : [null];
  const out = [];
  for (const head of heads) {
    const src = head === null ? data : data.heads[head];
    const L = src.q_rotated.length, S = src.k_rotated.length;
    for (let n = 0; n < Math.max(L, S); n++) {
      const i = Math.min(n, L - 1), j = Math.min(n, S - 1);
      const r = m.ropeOf({endpoint, data, request, head, batch: null, name: 'scores', i, j}, i, j);
      out.push([head, i, r.qRotated, j, r.kRotated]);
    }
  }
  return out;
}"""

# LLaMA 3.1's scaling with each of its bands hit: wavelengths 2π/θ of 6.3 (under 32/4: kept),
# 11 and 20 (blended) and 35 (over 32/1: slowed by the factor)
ROPE_LLAMA3_BANDS: dict[str, Any] = {
    "q": [[0.3, -1.2, 0.7, 2.0, -0.4, 1.1, 0.5, -0.8], [1.5, 0.2, -0.9, 0.4, 0.8, -1.3, 0.1, 0.6]],
    "k": [[0.8, 0.1, -1.1, 0.6, 1.2, -0.7, -0.3, 0.9], [-0.3, 1.6, 0.4, -0.9, 0.2, 0.5, 1.0, -0.4]],
    "v": [[1, 0], [0, 1]],
    "rope": {"base": 10, "scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1,
                                     "high_freq_factor": 4, "original_max_position": 32}},
    "positions": [100, 101], "context_positions": [3, 100],
}  # fmt: skip

# a decode step: the new token after a cache of 3 sits at position 3, its key too (the answer's
# query_positions and key_positions say so; the request names no position)
ROPE_DECODE: dict[str, Any] = {
    "q": _rows(1, 8, 12), "k": _rows(1, 8, 13), "v": _rows(1, 2, 14), "rope": {"base": 100},
    "past": {"k": _rows(3, 8, 15), "v": _rows(3, 2, 16)},
}  # fmt: skip

# the same without factor: the service's default (8, as its schema says) slows the long ones
ROPE_LLAMA3_DEFAULT_FACTOR: dict[str, Any] = {
    **ROPE_LLAMA3_BANDS,
    "rope": {"base": 10, "scaling": {"type": "llama3", "original_max_position": 32}},
}

ROPE_CASES = [
    ("llama_layer_gqa", "multihead", ex.LLAMA_LAYER),
    ("decode_step_after_a_cache", "attention", ROPE_DECODE),
    ("llama3_every_band", "attention", ROPE_LLAMA3_BANDS),
    ("interleaved_linear_qk_norm_positions", "attention", ROPE_ODD),
    *ROPE_SCALED,
]


@pytest.mark.parametrize(
    ("endpoint", "body"), [(e, b) for _, e, b in ROPE_CASES], ids=[n for n, _, _ in ROPE_CASES]
)
def test_the_pages_rope_turns_each_row_as_the_service_does(
    page: Any, server: str, endpoint: str, body: dict[str, Any]
) -> None:
    """The angles a RoPE explanation shows are the ones that turned the rows: the page's rotation
    of q (or q after qk_norm) and k gives the service's q_rotated and k_rotated to 1e-12."""
    request = _full(body)
    data = post_json(server, endpoint, request)
    rows = page.evaluate(ROTATE_ALL, {"endpoint": endpoint, "data": data, "request": request})
    assert rows
    for head, i, q, j, k in rows:
        src = data if head is None else data["heads"][head]
        assert q == pytest.approx(src["q_rotated"][i], rel=1e-12, abs=1e-12), (head, i)
        assert k == pytest.approx(src["k_rotated"][j], rel=1e-12, abs=1e-12), (head, j)


EXPLAIN_CELL = """async (args) => {
  const m = await import('/static/explain.js');
  const e = m.explainCell(args.ctx);
  if (e === null) return null;
  if (!(e instanceof HTMLElement)) return 'not an element';
  if (args.show) { e.id = 'explain-shot'; document.body.append(e); }
  return e.textContent;
}"""


def _fmt6(x: float) -> str:
    """explain.js's format: 6 significant digits, trailing zeros kept."""
    return js_number(x, 6, trim=False)


CELLS: list[tuple[str, str, dict[str, Any], str, int | None, int | None, int, int]] = [
    ("batman_scores", "attention", ex.I_AM_BATMAN, "scores", None, None, 2, 0),
    ("batman_scaled", "attention", ex.I_AM_BATMAN, "scaled_scores", None, None, 2, 0),
    ("batman_weights", "attention", ex.I_AM_BATMAN, "weights", None, None, 2, 0),
    ("batman_output", "attention", ex.I_AM_BATMAN, "output", None, None, 0, 1),
    ("softcap_capped", "attention", ex.SOFTCAP_LARGE_SCORES, "capped_scores", None, None, 2, 0),
    ("sink_weights", "attention", ex.SINK_CAUSAL, "weights", None, None, 1, 0),
    ("llama_scores_head1", "multihead", ex.LLAMA_LAYER, "scores", 1, None, 3, 2),
    ("llama_output_head0", "multihead", ex.LLAMA_LAYER, "output", 0, None, 2, 1),
    ("batch_masked", "mask", ex.PADDED_BATCH, "masked_scores", None, 1, 2, 1),
]


@pytest.mark.parametrize(
    ("endpoint", "body", "name", "head", "batch", "i", "j"),
    [c[1:] for c in CELLS],
    ids=[c[0] for c in CELLS],
)
def test_explain_cell_shows_the_services_number(
    page: Any,
    server: str,
    endpoint: str,
    body: dict[str, Any],
    name: str,
    head: int | None,
    batch: int | None,
    i: int,
    j: int,
) -> None:
    request = _full(body)
    data = post_json(server, endpoint, request)
    src = data if head is None else data["heads"][head]
    m = src[name] if batch is None else src[name][batch]
    value = m[i][j]
    ctx = {"endpoint": endpoint, "data": data, "request": request, "name": name,
           "head": head, "batch": batch, "i": i, "j": j}  # fmt: skip
    text = page.evaluate(EXPLAIN_CELL, {"ctx": ctx, "show": False})
    assert isinstance(text, str) and text != "not an element", text
    assert f"{name}[{i}][{j}]" in text
    assert f"(the service: {_fmt6(value)})" in text, text
    assert f"= {_fmt6(value)} (the service" in text, text


def test_explain_cell_is_null_for_names_it_does_not_explain(page: Any, server: str) -> None:
    request = _full(ex.TWO_HEADS_FULL_BLOCK)
    data = post_json(server, "multihead", request)
    for name, head in [("concat", None), ("projected", None), ("layer_norm", None),
                       ("output", None), ("average_weights", None), ("q", 0)]:  # fmt: skip
        ctx = {"endpoint": "multihead", "data": data, "request": request, "name": name,
               "head": head, "batch": None, "i": 0, "j": 0}  # fmt: skip
        assert page.evaluate(EXPLAIN_CELL, {"ctx": ctx, "show": False}) is None, name


def test_a_weights_explanation_renders_in_the_page(page: Any, server: str) -> None:
    request = _full(ex.SINK_CAUSAL)
    data = post_json(server, "attention", request)
    ctx = {"endpoint": "attention", "data": data, "request": request, "name": "weights",
           "head": None, "batch": None, "i": 0, "j": 0}  # fmt: skip
    text = page.evaluate(EXPLAIN_CELL, {"ctx": ctx, "show": True})
    assert isinstance(text, str)
    for word in ("max", "sum", "exp", "sink"):
        assert word in text, (word, text)
    row = [-math.inf if x is None else x for x in data["masked_scores"][0]]
    top = max([*row, float(request["sinks"])])  # the row's max takes in the sink
    assert f"max = {_fmt6(top)}," in text, text
    shot = page.locator("#explain-shot")
    assert shot.is_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    shot.screenshot(path=str(ARTIFACTS / "explain-weights.png"))
    assert (ARTIFACTS / "explain-weights.png").stat().st_size > 0


@pytest.mark.parametrize(("mode", "said"), [(None, "are 0"), ("uniform", "1/S each")])
def test_a_fully_masked_row_is_said_so(page: Any, server: str, mode: str | None, said: str) -> None:
    request = {**FULLY_MASKED, **({"fully_masked_rows": mode} if mode else {})}
    data = post_json(server, "mask", request)
    ctx = {"endpoint": "mask", "data": data, "request": request, "name": "weights",
           "head": None, "batch": None, "i": 1, "j": 0}  # fmt: skip
    text = page.evaluate(EXPLAIN_CELL, {"ctx": ctx, "show": False})
    assert isinstance(text, str) and "fully masked" in text and said in text, text
    assert f"(the service: {_fmt6(data['weights'][1][0])})" in text, text


def test_clicking_a_cell_explains_it_and_walks_back_step_by_step(page: Any, server: str) -> None:
    """The page as a user meets it: a click on Batman's weight on "I" explains the softmax with
    the tokens named; "how … was computed" walks back through the scaled scores to the dot
    product, each step ending with the service's own number."""
    page.locator("body[data-ready=true]").wait_for(timeout=20_000)  # Batman, drawn on arrival
    with page.expect_response(lambda r: r.url.endswith("/attention")) as info:
        page.click("#run")
    data = info.value.json()
    page.locator("body:not([data-busy])").wait_for(state="attached")
    page.locator('figure[data-name="weights"] rect.cell[data-row="2"][data-col="0"]').click()
    panel = page.locator("#explain")
    title = panel.locator(".explain-title")
    assert title.inner_text() == "weights[2][0]"
    assert panel.locator(".explain-who").inner_text() == "query 2 “Batman” → key 0 “I”"
    assert panel.locator("tr.this-term td").first.inner_text() == "0 ←"
    total = panel.locator(".explain-total")
    assert (
        total.inner_text()
        == f"= {_fmt6(data['weights'][2][0])} (the service: {_fmt6(data['weights'][2][0])})"
    )
    walk = []
    while panel.locator("button.explain-back").count():
        panel.locator("button.explain-back").click()
        walk.append(title.inner_text())
        name = walk[-1].split("[")[0]
        assert f"(the service: {_fmt6(data[name][2][0])})" in total.inner_text()
        assert page.evaluate("() => document.activeElement.closest('#explain') !== null")
    assert walk == ["scaled_scores[2][0]", "scores[2][0]"]
    # the dot product, term by term: q row 2 times k row 0
    terms = panel.locator("table.explain-terms tr").all_inner_texts()[1:]
    q, k = data["q"][2], data["k"][0]
    assert [t.split("\t")[1:3] for t in terms] == [
        [_fmt6(a), _fmt6(b)] for a, b in zip(q, k, strict=True)
    ]


def _g(x: float, digits: int = 6) -> str:
    """lib/format.js's formatNumber with trailing zeros dropped (positions.js's parameters)."""
    return js_number(x, digits, trim=True)


def _yarn_factor(f: float, mscale: float = 1.0) -> float:
    return 0.1 * mscale * math.log(f) + 1


# (id, endpoint, request, head, what the explanation of scores[1][0] says about the pairs, and
# what of it the service's own q_rotated step says too)
SCALED_WORDS: list[tuple[str, str, dict[str, Any], int | None, list[str], list[str]]] = [
    ("yarn_gpt_oss", "attention", ROPE_YARN, None,
     ["θ_0 kept", "θ_1 blended: ", "θ_2 interpolated: θ/32", "θ_15 interpolated: θ/32",
      f"cos and sin × {_g(_yarn_factor(32))} (yarn's attention factor)"],
     [f"cos and sin × {_g(_yarn_factor(32))}"]),
    ("yarn_mscale", "multihead", ROPE_YARN_MSCALE, 1,
     ["θ_0 kept", "θ_1 interpolated: θ/4", "θ_2 interpolated: θ/4", "0 with 1", "4 with 5",
      f"cos and sin × {_g(_yarn_factor(4, 0.707) / _yarn_factor(4, 1))}"],
     [f"cos and sin × {_g(_yarn_factor(4, 0.707) / _yarn_factor(4, 1))}"]),
    ("dynamic_past", "attention", ROPE_DYNAMIC, None,
     [f"dynamic NTK: base raised to {_g(10000 * (2 * 16 / 8 - 1) ** (8 / 6), 8)} (n = 16 > 8)",
      "n = 16 (the largest query position + 1, keys too)"],
     [f"base raised to {_g(10000 * (2 * 16 / 8 - 1) ** (8 / 6), 8)}"]),
    ("dynamic_within", "multihead", ROPE_DYNAMIC_WITHIN, 0, ["unchanged: n = 4 ≤ 8"],
     ["n = 4 ≤ 8, frequencies unchanged"]),
    ("longrope_short", "attention", ROPE_LONGROPE_SHORT, None,
     ["θ ÷ short_factor[0] = 1", "θ ÷ short_factor[1] = 1.25", "θ ÷ short_factor[2] = 2.5",
      "n = 6 (the largest", f"cos and sin × {_g(math.sqrt(1 + math.log(4) / math.log(8)))}"],
     ["n = 6 ≤ 8", "short_factor[i]", f"cos and sin × {_g(math.sqrt(1 + math.log(4) / math.log(8)))}"]),
    ("longrope_long", "attention", ROPE_LONGROPE_LONG, None,
     ["θ ÷ long_factor[0] = 1.5", "θ ÷ long_factor[2] = 7.5", "n = 11 (the largest",
      f"cos and sin × {_g(math.sqrt(1 + math.log(3) / math.log(8)))}"],
     ["n = 11 > 8", "long_factor[i]", f"cos and sin × {_g(math.sqrt(1 + math.log(3) / math.log(8)))}"]),
    ("llama3", "attention", ROPE_LLAMA3_BANDS, None,
     ["0 with 4", "kept (short wavelength)", "blended: ", "slowed: θ/8 (long wavelength)"],
     ["llama3 scaling: wavelengths over 32/1 slowed by 8"]),
    ("llama3_default_factor", "attention", ROPE_LLAMA3_DEFAULT_FACTOR, None,
     ["kept (short wavelength)", "blended: ", "slowed: θ/8 (long wavelength)"],
     ["slowed by 8"]),
    ("linear", "attention", ROPE_ODD, None, ["0 with 1", "θ kept; positions ÷ 2"],
     ["positions divided by 2 (linear scaling)"]),
    ("proportional", "attention", ROPE_PROPORTIONAL, None,
     ["0 with 4", "3 with 7", "turned: 100^(−2·1/8)", "unturned (θ = 0)"],
     ["θ_i = 100^(−2i/d_k) for i < 2, the other pairs unturned"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("endpoint", "body", "head", "page_says", "service_says"),
    [c[1:] for c in SCALED_WORDS],
    ids=[c[0] for c in SCALED_WORDS],
)
def test_a_scaled_rope_explanation_says_what_happened_to_each_pair(
    page: Any,
    server: str,
    endpoint: str,
    body: dict[str, Any],
    head: int | None,
    page_says: list[str],
    service_says: list[str],
) -> None:
    """A score computed from rotated rows lists each pair's θ with what the scaling (or Gemma 4's
    proportional style) did to it, and the factor on cos and sin; the service's step agrees."""
    request = _full(body)
    data = post_json(server, endpoint, request)
    ctx = {"endpoint": endpoint, "data": data, "request": request, "name": "scores",
           "head": head, "batch": None, "i": 1, "j": 0}  # fmt: skip
    text = page.evaluate(EXPLAIN_CELL, {"ctx": ctx, "show": False})
    assert isinstance(text, str) and "scaling" in text, text
    for words in page_says:
        assert words in text, (words, text)
    src = data if head is None else data["heads"][head]
    assert f"(the service: {_fmt6(src['scores'][1][0])})" in text, text
    assert "explain-mismatch" not in page.evaluate(
        "async (ctx) => (await import('/static/explain.js')).explainCell(ctx).innerHTML", ctx
    )
    steps = {s["name"]: s["formula"] for s in data["steps"]}
    for words in service_says:
        assert words in steps["q_rotated"], (words, steps["q_rotated"])


def test_the_pages_yarn_pairs_are_the_services_count(page: Any, server: str) -> None:
    """The page's word for each pair adds up to the service's "of 16 pairs, 1 kept, … divided,
    … blended"."""
    request = _full(ROPE_YARN)
    data = post_json(server, "attention", request)
    step = next(s["formula"] for s in data["steps"] if s["name"] == "q_rotated")
    found = re.search(r"of (\d+) pairs, (\d+) kept .*?, (\d+) divided by .*?, (\d+) blended", step)
    assert found, step
    ctx = {"endpoint": "attention", "data": data, "request": request, "name": "scores",
           "head": None, "batch": None, "i": 0, "j": 0}  # fmt: skip
    words = page.evaluate(
        "async (ctx) => (await import('/static/explain.js')).ropeOf(ctx, 0, 0).scaled", ctx
    )
    counts = [len(words)] + [
        sum(f" {w}" in x for x in words) for w in ("kept", "interpolated", "blended")
    ]
    assert counts == [int(g) for g in found.groups()] == [16, 1, 14, 1], (counts, step)


def _generated_rope_run(page: Any, d_k: int, positions: str) -> None:
    """The form on "a sentence with generated numbers" (3 tokens, d_model = d_k), x and the
    weights drawn, at ``positions``."""
    page.locator("body[data-ready=true]").wait_for(timeout=20_000)
    fill_generated(page, 3, seed=2, d_model=d_k, d_k=d_k)
    for field in ("#x", "#w_q", "#w_k", "#w_v", "#extra"):
        page.fill(field, "")
    page.select_option("#weight_layout", "in_out")
    page.fill("#positions", positions)


@pytest.mark.parametrize("how", ["yarn_in_more_fields", "proportional_in_the_form"])
def test_clicking_a_score_of_scaled_rope_names_each_pairs_scaling(
    page: Any, server: str, how: str
) -> None:
    """The page as a user meets it: YaRN given in "more fields" (the form has no scaling fields),
    or the proportional style picked in the form; a click on a score explains it with each
    pair's scaling, ending with the service's number."""
    if how == "yarn_in_more_fields":
        _generated_rope_run(page, 32, "20 24 31")
        rope = {"base": 150000, "scaling": {"type": "yarn", "factor": 32,
                                            "original_max_position": 16, "truncate": False}}  # fmt: skip
        page.fill("#extra", json.dumps({"rope": rope}))
        said = ["θ_0 kept", "θ_1 blended", "θ_9 interpolated: θ/32", "cos and sin × 1.34657"]
    else:
        _generated_rope_run(page, 8, "3 7 11")
        page.check("#rope")
        page.select_option("#rope_style", "proportional")
        page.fill("#rope_rotary_dim", "4")
        rope = {"style": "proportional", "rotary_dim": 4}
        said = ["1 with 5", "turned: 10000^(−2·1/8)", "3 with 7", "unturned (θ = 0)"]
    body, data = run_form(page, "attention")
    assert body["rope"] == rope, body
    assert "q_rotated" in data, data.keys()
    page.locator('figure[data-name="scores"] rect.cell[data-row="2"][data-col="0"]').click()
    panel = page.locator("#explain")
    assert panel.locator(".explain-title").inner_text() == "scores[2][0]"
    text = panel.inner_text()
    for words in said:
        assert words in text, (words, text)
    value = _fmt6(data["scores"][2][0])
    assert panel.locator(".explain-total").inner_text() == f"= {value} (the service: {value})"
    assert panel.locator(".explain-mismatch").count() == 0
