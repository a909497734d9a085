"""The explorer's cell explanations (service/static/explain.js) in a real browser: the page's own
recomputation of every cell of every explainable map must give the service's numbers."""

import math
from typing import Any

import pytest

from service.wire import examples as ex
from tests.browser.support import ARTIFACTS, js_number, post_json

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

ROPE_CASES = [
    ("llama_layer_gqa", "multihead", ex.LLAMA_LAYER),
    ("llama3_every_band", "attention", ROPE_LLAMA3_BANDS),
    ("interleaved_linear_qk_norm_positions", "attention", ROPE_ODD),
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
