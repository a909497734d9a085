"""The page's ALiBi arithmetic (lib/arithmetic.js alibiOf) for the origins of BLOOM and Falcon
("zero": slope · p'_j) and MPT ("last_key": slope · (p'_j − p'_last)), in a real browser, on the
service's own answers: every cell of position_bias and biased_scores of every head is worked out
by the page with the service's number, the bias checked against the origin's formula written
here (slopes and positions from the answer), and the explanation's line of the distance read."""

from typing import Any

import numpy as np
import pytest

from tests.browser.support import open_explorer, post_json

pytestmark = pytest.mark.e2e

RNG = np.random.default_rng(7)
H, D, D_MODEL, L = 2, 4, 6, 3
LAYER = {"x": RNG.normal(size=(L, D_MODEL)).tolist(), "num_heads": H,
         "q_proj.weight": RNG.normal(size=(H * D, D_MODEL)).tolist(),
         "k_proj.weight": RNG.normal(size=(H * D, D_MODEL)).tolist(),
         "v_proj.weight": RNG.normal(size=(H * D, D_MODEL)).tolist(),
         "positions": [3, 5, 9], "mask": [{"type": "causal"}]}  # fmt: skip
# key j's distance by origin, p the keys' positions (the queries' do not enter these two)
DISTANCE = {"zero": lambda p: p, "last_key": lambda p: p - p[-1]}

CELLS = """async ([request, data]) => {
  const m = await import('/static/lib/arithmetic.js');
  const out = [];
  data.heads.forEach((hd, head) => {
    for (const name of ['position_bias', 'biased_scores'])
      hd[name].forEach((row, i) => row.forEach((v, j) => {
        const r = m.recompute({endpoint: 'multihead', request, data, name, head, batch: null, i, j});
        out.push([name, head, i, j, r && r.kind, r && r.total, v, r && r.alibi ? r.alibi.bias : null]);
      }));
  });
  return out;
}"""
EXPLAIN = """async (ctx) => {
  const e = (await import('/static/explain.js')).explainCell(ctx);
  return [e.innerText, e.innerHTML];
}"""


@pytest.mark.parametrize("origin", list(DISTANCE))
def test_each_cell_of_the_origins_bias_is_worked_out(page: Any, server: str, origin: str) -> None:
    open_explorer(page, server)
    body = {**LAYER, "alibi": {"origin": origin}}
    data = post_json(server, "multihead", body)
    slopes, keys = np.array(data["alibi_slopes"]), np.array(data["key_positions"], dtype=float)
    want = slopes[:, None] * DISTANCE[origin](keys)[None, :]  # (H, S): the same in every row
    got = page.evaluate(CELLS, [body, data])
    assert len(got) == 2 * H * L * L
    for name, head, i, j, kind, total, service, bias in got:
        assert kind == ("alibi" if name == "position_bias" else "bias"), (name, kind)
        assert bias == pytest.approx(want[head][j], abs=1e-15), (name, head, i, j)
        if service is not None:  # a masked score (−∞) is the mask's step, not this one
            assert abs(total - service) <= 1e-12 * max(1.0, abs(service)), (name, head, i, j)


@pytest.mark.parametrize(
    ("origin", "line"),
    [("zero", "p'_2 = 9 from position 0"), ("last_key", "p'_0 − p'_last = -6 from the last key")],
)
def test_the_explanation_says_where_the_distance_starts(
    page: Any, server: str, origin: str, line: str
) -> None:
    open_explorer(page, server)
    body = {**LAYER, "alibi": {"origin": origin}}
    data = post_json(server, "multihead", body)
    j = 2 if origin == "zero" else 0
    ctx = {"endpoint": "multihead", "data": data, "request": body, "name": "position_bias",
           "head": 1, "batch": None, "i": 2, "j": j}  # fmt: skip
    text, html = page.evaluate(EXPLAIN, ctx)
    assert line in text, text
    assert "explain-mismatch" not in html
