"""Today's layers in the explorer (API.md, "Today's layers, second edition"), driven in a real
browser: the form's fields for v_norm, k_eq_v, qk_norm's zero_centered and after_rope, the
temperature, the chunked mask and the output gate; the request the page sends; the new outputs
drawn in the order of their steps; and a click on a cell of each new output explaining it with
the number the service returned (read from the JSON the page received)."""

import json
import math
import re
from typing import Any

import numpy as np
import pytest
from playwright.sync_api import expect

from tests.browser.support import js_number, open_explorer, post_json, run_example, run_form

pytestmark = pytest.mark.e2e


def _rows(n: int, d: int, seed: int) -> list[list[float]]:
    """n rows of d numbers in [−1.5, 1.5], the same on every run."""
    return [[round(1.5 * math.sin(seed + 1.7 * i + 0.9 * t + 0.31 * i * t), 3) for t in range(d)]
            for i in range(n)]  # fmt: skip


def _text(m: list[list[float]]) -> str:
    return "\n".join(" ".join(str(v) for v in row) for row in m)


# Gemma 4's full-attention layer: the values are the keys' projection (no w_v), each value vector
# RMS-normalised, (1 + w) norms on q and k, proportional RoPE; 2 heads of d_k 4
GEMMA: dict[str, Any] = {
    "tokens": ["the", "cat", "sat"], "x": _rows(3, 8, 0), "w_q": _rows(8, 8, 1),
    "w_k": _rows(8, 8, 2), "num_heads": 2, "k_eq_v": True,
    "qk_norm": {"q_weight": [0.1, -0.2, 0.3, 0.0], "k_weight": [0.2, 0.1, -0.1, 0.4],
                "zero_centered": True},
    "v_norm": {"type": "rms", "eps": 1e-5},
    "rope": {"style": "proportional", "rotary_dim": 2},
}  # fmt: skip
# Llama 4: interleaved RoPE, then the weightless norm, chunks of 2, the temperature (floor_scale
# 2 so that it changes within four positions)
LLAMA4: dict[str, Any] = {
    "tokens": ["a", "b", "c", "d"], "q": _rows(4, 4, 3), "k": _rows(4, 4, 4), "v": _rows(4, 2, 5),
    "mask": {"type": "chunked", "size": 2},
    "qk_norm": {"after_rope": True}, "rope": {"style": "interleaved"},
    "temperature": {"floor_scale": 2, "attn_scale": 0.5},
}  # fmt: skip
# Qwen3-Next: the gate inside q_proj.weight (each head's 2 query rows, then its 2 gate rows)
QWEN: dict[str, Any] = {
    "tokens": ["one", "two", "three"], "x": _rows(3, 4, 6), "q_proj.weight": _rows(8, 4, 7),
    "k_proj.weight": _rows(4, 4, 8), "v_proj.weight": _rows(4, 4, 9),
    "o_proj.weight": _rows(4, 4, 10), "num_heads": 2, "gate": True,
    "qk_norm": {"zero_centered": True},
    "q_norm.weight": [0.25, -0.5], "k_norm.weight": [0.1, 0.3],
}  # fmt: skip
GATE_W = _rows(4, 4, 11)
GATE_B = [0.5, -0.25, 0.0, 1.0]


def _fmt6(x: float) -> str:
    return js_number(x, 6, trim=False)


def _blank_form(page: Any, server: str, endpoint: str, mode: str) -> None:
    """The endpoint and input mode chosen, every box emptied and every box unticked, as a user
    clearing the form would."""
    open_explorer(page, server)
    page.select_option("#endpoint", endpoint)
    page.select_option("#mode", mode)
    page.evaluate("""() => {
      for (const e of document.querySelectorAll('#form input, #form textarea'))
        if (e.type === 'checkbox') e.checked = false; else if (e.id !== 'num_heads') e.value = '';
      for (const id of ['qk_norm', 'positional_kind', 'gate']) document.getElementById(id).value = '';
    }""")
    page.select_option("#weight_layout", "in_out")


def _unfold(page: Any, folded: str) -> None:
    """Open the folded settings ``folded`` (#layers-more, #gate-more) as a user would."""
    if page.locator(f"#{folded}").get_attribute("open") is None:
        page.click(f"#{folded} > summary")


def _explain(page: Any, name: str, i: int, j: int, head: int | None = None) -> Any:
    """Click cell [i][j] of the table of output ``name`` (head ``head``'s, opening its folded
    tables); return the explanation panel once it explains that cell."""
    key = name if head is None else f"head{head}_{name}"
    folded = page.locator(f'details.head-tables:has(table.matrix[data-name="{key}"])')
    if folded.count() and folded.get_attribute("open") is None:
        folded.locator(":scope > summary").click()
    page.locator(f'table.matrix[data-name="{key}"] td[data-row="{i}"][data-col="{j}"]').click()
    panel = page.locator("#explain")
    title = f"{name}[{i}][{j}]" + ("" if head is None else f" (head {head})")
    expect(panel.locator(".explain-title")).to_have_text(title)
    return panel


def _says_the_services_number(panel: Any, value: float) -> None:
    """The explanation ends with the page's total, which is the service's number."""
    v = _fmt6(value)
    assert panel.locator(".explain-total").inner_text() == f"= {v} (the service: {v})"
    assert panel.locator(".explain-mismatch").count() == 0


def _tables_in_order(page: Any, where: str) -> list[str]:
    names: list[str] = page.locator(f"{where} table.matrix").evaluate_all(
        "ts => ts.map(t => t.dataset.name)"
    )
    return names


def test_a_gemma_4_layer_from_the_form(page: Any, server: str) -> None:
    _blank_form(page, server, "multihead", "projections")
    page.select_option("#weight_names", "w")
    page.fill("#num_heads", "2")
    page.fill("#tokens", "the cat sat")
    for box in ("x", "w_q", "w_k"):
        page.fill(f"#{box}", _text(GEMMA[box]))
    page.fill("#w_v", _text(_rows(8, 8, 99)))  # typed before k_eq_v: never sent with it
    _unfold(page, "gate-more")
    page.check("#k_eq_v")
    assert page.locator("#w_v").is_disabled()
    assert "k_eq_v" in page.locator("#w_v-name").inner_text()
    _unfold(page, "layers-more")
    page.fill("#qk_norm_q_weight", "0.1 -0.2 0.3 0")
    assert page.input_value("#qk_norm") == "rms"  # a weight typed turns the norm on
    page.fill("#qk_norm_k_weight", "0.2 0.1 -0.1 0.4")
    page.check("#qk_norm_zero_centered")
    page.check("#rope")
    page.select_option("#rope_style", "proportional")
    page.fill("#rope_rotary_dim", "2")
    page.check("#v_norm")
    page.fill("#v_norm_eps", "1e-5")
    body, data = run_form(page, "multihead")
    assert body == GEMMA
    head = data["heads"][0]
    assert head["v"] == head["k"]  # the service took the values from the keys
    # the new output drawn with the others, in the order of the steps
    summary = page.locator('details.head-tables[data-head="0"] > summary').inner_text()
    order = [summary.index(t) for t in ("Q after qk_norm", "K rotated", "V after v_norm")]
    assert order == sorted(order), summary
    panel = _explain(page, "v_normed", 2, 1, head=1)
    v = data["heads"][1]["v"][2]
    assert "mean of the squares" in panel.inner_text()
    assert panel.locator("table.explain-terms tr.this-term td").first.inner_text() == "1"
    assert _fmt6(v[1]) in panel.locator("table.explain-terms tr.this-term").inner_text()
    _says_the_services_number(panel, data["heads"][1]["v_normed"][2][1])
    panel = _explain(page, "q_normed", 1, 2, head=0)
    assert "· (1 + w[2])" in panel.inner_text()
    assert "1 + 0.300000 = 1.30000" in panel.inner_text()  # q_weight[2] = 0.3, zero-centred
    _says_the_services_number(panel, head["q_normed"][1][2])


def test_a_llama_4_layer_from_the_form(page: Any, server: str) -> None:
    _blank_form(page, server, "attention", "direct")
    page.fill("#tokens", "a b c d")
    for box in ("q", "k", "v"):
        page.fill(f"#{box}", _text(LLAMA4[box]))
    page.select_option("#qk_norm", "rms")
    _unfold(page, "layers-more")
    page.check("#qk_norm_after_rope")
    page.check("#rope")
    page.select_option("#rope_style", "interleaved")
    page.fill("#chunk_size", "2")
    page.fill("#temperature_floor_scale", "2")
    assert page.is_checked("#temperature")  # a setting typed turns the temperature on
    page.fill("#temperature_attn_scale", "0.5")
    body, data = run_form(page, "attention")
    assert body == LLAMA4
    assert data["mask"][3] == [False, False, True, True]  # the service's chunks of 2
    # the norm after RoPE is drawn after it, the temperature last
    tables = _tables_in_order(page, "#tables")
    made = [n for n in tables if n in ("q_rotated", "q_normed", "q_tempered", "output")]
    assert made == ["q_rotated", "q_normed", "q_tempered", "output"], tables
    # q_tempered[3][1]: query 3 at position 3, τ = log(⌊4/2⌋ + 1) · 0.5 + 1, as the step says
    panel = _explain(page, "q_tempered", 3, 1)
    text = panel.inner_text()
    assert "position p = 3: (p + 1)/floor_scale = 4/2.00000 = 2.00000; ⌊2.00000⌋ = 2" in text
    tau = float(re.search(r"τ = \S+ · \S+ \+ 1 = (\S+)", text).group(1))  # type: ignore[union-attr]
    step = next(s["formula"] for s in data["steps"] if s["name"] == "q_tempered")
    factors = [float(x) for x in re.search(r"\[([^\]]+)\]$", step).group(1).split(",")]  # type: ignore[union-attr]
    assert tau == pytest.approx(factors[3], rel=1e-5) and factors[3] != 1
    _says_the_services_number(panel, data["q_tempered"][3][1])
    # the walk back: q_tempered came from q_normed, which (after RoPE) came from q_rotated
    panel.locator("button.explain-back").click()
    expect(panel.locator(".explain-title")).to_have_text("q_normed[3][1]")
    assert "q_rotated[3][1] /" in panel.inner_text() and "after RoPE" in panel.inner_text()
    _says_the_services_number(panel, data["q_normed"][3][1])
    panel.locator("button.explain-back").click()
    expect(panel.locator(".explain-title")).to_have_text("q_rotated[3][1]")
    assert "pair 0 (features 0 with 1)" in panel.inner_text()  # interleaved
    _says_the_services_number(panel, data["q_rotated"][3][1])
    # the scores take the tempered queries and the normalised keys
    page.locator('figure[data-name="scores"] rect.cell[data-row="3"][data-col="2"]').click()
    expect(panel.locator(".explain-title")).to_have_text("scores[3][2]")
    assert "q_tempered[3][t] · k_normed[2][t]" in panel.inner_text()
    _says_the_services_number(panel, data["scores"][3][2])


def test_a_qwen3_next_gate_from_the_state_dict(page: Any, server: str) -> None:
    _blank_form(page, server, "multihead", "projections")
    page.select_option("#weight_names", "state_dict")
    page.fill("#num_heads", "2")
    page.fill("#tokens", "one two three")
    page.fill("#x", _text(QWEN["x"]))
    for box, name in (("w_q", "q"), ("w_k", "k"), ("w_v", "v"), ("w_o", "o")):
        page.fill(f"#{box}", _text(QWEN[f"{name}_proj.weight"]))
    _unfold(page, "gate-more")
    page.select_option("#gate", "q_proj")
    assert page.locator("#gate-weights").is_hidden()
    assert "gate rows" in page.locator("#w_q-name").inner_text()
    page.select_option("#qk_norm", "rms")
    _unfold(page, "layers-more")
    page.check("#qk_norm_zero_centered")
    page.fill("#qk_norm_q_weight", "0.25 -0.5")
    page.fill("#qk_norm_k_weight", "0.1 0.3")
    body, data = run_form(page, "multihead")
    assert body == QWEN
    assert _tables_in_order(page, "#tables > .table-card")[:4] == [
        "concat", "gate", "gated", "projected"
    ]  # fmt: skip
    # gate[2][3]: head 1's gate row 1 is q_proj.weight's row 1·4 + 2 + 1 = 7
    panel = _explain(page, "gate", 2, 3)
    text = panel.inner_text()
    assert "row 7 of q_proj.weight" in text
    assert f"{_fmt6(QWEN['x'][2][0])}\t{_fmt6(QWEN['q_proj.weight'][7][0])}" in text
    _says_the_services_number(panel, data["gate"][2][3])
    panel = _explain(page, "gated", 2, 3)
    assert f"{_fmt6(data['concat'][2][3])} · {_fmt6(data['gate'][2][3])}" in panel.inner_text()
    _says_the_services_number(panel, data["gated"][2][3])
    panel.locator("button.explain-back").click()
    expect(panel.locator(".explain-title")).to_have_text("gate[2][3]")
    # the keys' (1 + w) norm, weight 0.3 on feature 1
    panel = _explain(page, "k_normed", 0, 1, head=1)
    assert "1 + 0.300000 = 1.30000" in panel.inner_text()
    _says_the_services_number(panel, data["heads"][1]["k_normed"][0][1])


def test_a_gate_pasted_over_generated_numbers(page: Any, server: str) -> None:
    """The page draws no gate weights: with generated numbers the gate runs on the W_g pasted;
    without one the page says so beside the box and sends nothing."""
    _blank_form(page, server, "multihead", "generated")
    page.fill("#sentence", "one two three")
    for box, value in (("#seed", "4"), ("#d_model", "4"), ("#num_heads", "2")):
        page.fill(box, value)
    page.select_option("#weight_names", "w")
    _unfold(page, "gate-more")
    assert page.locator('#gate option[value="q_proj"]').is_disabled()  # no state dict
    page.select_option("#gate", "w")
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.method == "POST" else None)
    page.click("#run")
    error = page.locator('.field[data-field="gate_w"] .field-error')
    expect(error).to_contain_text("The gate needs its own weights")
    assert sent == []
    page.fill("#gate_w", _text(GATE_W))
    page.fill("#gate_b", " ".join(str(b) for b in GATE_B))
    body, data = run_form(page, "multihead")
    assert body["gate"] == {"w": GATE_W, "b": GATE_B} and body["seed"] == 4
    panel = _explain(page, "gate", 1, 2)
    text = panel.inner_text()
    assert "row 2 of the request's gate.w" in text and " + b_g[2]" in text
    assert f"{_fmt6(data['x'][1][3])}\t{_fmt6(GATE_W[2][3])}" in text  # the generated x
    _says_the_services_number(panel, data["gate"][1][2])


@pytest.mark.parametrize(
    ("endpoint", "request_body"),
    [("multihead", GEMMA), ("attention", LLAMA4), ("multihead", QWEN),
     ("multihead", {"sentence": "one two three", "seed": 4, "d_model": 4, "num_heads": 2,
                    "gate": {"w": GATE_W, "b": GATE_B}})],
    ids=["gemma4", "llama4", "qwen3_next", "generated_gate"],
)  # fmt: skip
def test_a_request_fills_the_form_and_comes_back_unchanged(
    page: Any, server: str, endpoint: str, request_body: dict[str, Any]
) -> None:
    """A request with today's fields (as a worked example or a pasted request is loaded: form.js
    fillForm) fills the form's boxes, leaves nothing in "more fields", and Run sends it back."""
    open_explorer(page, server)
    page.select_option("#endpoint", endpoint)
    page.evaluate("async (ex) => (await import('/static/form.js')).fillForm(ex)", request_body)
    assert page.input_value("#extra") == ""
    body, _ = run_form(page, endpoint)
    assert body == request_body


def test_the_worked_examples_of_todays_layers_fill_the_form(page: Any, server: str) -> None:
    """The service's own examples: their fields in the form's boxes, not in "more fields"."""
    open_explorer(page, server)
    seen = {}
    for example in ("qwen3_next", "llama4", "gemma4"):
        data = run_example(page, "multihead", example)
        assert "first_mismatch" not in data or data["first_mismatch"] is None
        seen[example] = json.loads(page.input_value("#extra") or "{}")
        if example == "qwen3_next":
            assert page.input_value("#gate") == "q_proj"
            assert page.is_checked("#qk_norm_zero_centered")
            assert page.input_value("#qk_norm_q_weight") == "0.1 -0.1 0.2 0"
        if example == "llama4":  # the folded settings open to show what was filled
            assert page.get_attribute("#layers-more", "open") is not None
            assert page.is_checked("#qk_norm_after_rope") and page.input_value("#chunk_size") == "2"
        if example == "gemma4":
            assert page.is_checked("#k_eq_v") and page.is_checked("#v_norm")
    assert seen == {"qwen3_next": {"decimals": 4}, "llama4": {"decimals": 4},
                    "gemma4": {"decimals": 4}}  # fmt: skip


def test_a_yarn_rotated_query_says_which_frequencies_were_scaled(page: Any, server: str) -> None:
    """A click on a cell of q_rotated (YaRN past its original context) names each pair's
    scaling; the words add up to the service's step, and the cell is the service's number."""
    open_explorer(page, server)
    run_example(page, "attention", "yarn")
    extra = json.loads(page.input_value("#extra"))
    extra.pop("decimals")  # the full doubles, to compare at 6 digits
    page.fill("#extra", json.dumps(extra))
    _, data = run_form(page, "attention")
    panel = _explain(page, "q_rotated", 2, 6)
    text = panel.inner_text()
    assert "yarn scaling" in text and "cos and sin ×" in text
    scaling = panel.locator("table.explain-terms").last.locator("tr td:nth-child(4)")
    words = scaling.all_inner_texts()
    step = next(s["formula"] for s in data["steps"] if s["name"] == "q_rotated")
    found = re.search(r"of (\d+) pairs, (\d+) kept .*?, (\d+) divided by .*?, (\d+) blended", step)
    assert found, step
    counts = [len(words)] + [
        sum(f" {w}" in x for x in words) for w in ("kept", "interpolated", "blended")
    ]
    assert counts == [int(g) for g in found.groups()], (counts, step)
    _says_the_services_number(panel, data["q_rotated"][2][6])


# every cell of every new output, recomputed by the page (lib/arithmetic.js) against the service
RECOMPUTE = """async ({endpoint, data, request, names}) => {
  const m = await import('/static/explain.js');
  const out = [];
  const heads = endpoint === 'multihead' ? data.heads.map((_, h) => h) : [];
  for (const name of names) for (const head of [null, ...heads]) {
    const a = head === null ? data[name] : data.heads[head][name];
    if (!Array.isArray(a) || (name === 'output' && head === null && heads.length)) continue;
    for (let i = 0; i < a.length; i++) for (let j = 0; j < a[i].length; j++) {
      const r = m.recompute({endpoint, data, request, name, head, batch: null, i, j});
      out.push([name, head, i, j, r === null ? null : r.total, a[i][j]]);
    }
  }
  return out;
}"""
NAMES = ["q_normed", "k_normed", "q_rotated", "k_rotated", "q_tempered", "v_normed", "gate",
         "gated", "scores", "output"]  # fmt: skip


@pytest.mark.parametrize(
    ("endpoint", "request_body"),
    [("multihead", GEMMA), ("attention", LLAMA4), ("multihead", QWEN)],
    ids=["gemma4", "llama4", "qwen3_next"],
)
def test_every_new_cell_recomputed_by_the_page_is_the_services(
    page: Any, server: str, endpoint: str, request_body: dict[str, Any]
) -> None:
    open_explorer(page, server)
    page.select_option("#endpoint", endpoint)
    page.evaluate("async (ex) => (await import('/static/form.js')).fillForm(ex)", request_body)
    _, data = run_form(page, endpoint)
    rows = page.evaluate(
        RECOMPUTE, {"endpoint": endpoint, "data": data, "request": request_body, "names": NAMES}
    )
    seen = {r[0] for r in rows}
    assert len(seen) >= 5, seen
    bad = [r for r in rows if r[4] is None or abs(r[4] - r[5]) > 1e-12 * max(1.0, abs(r[5]))]
    assert bad == [], bad[:10]


# ---- the order of the forms is the answer's (its steps, placed by openapi.json's x-chain) ----

# qk_norm before RoPE (Qwen3) or after it (Llama 4): the same arrays, half RoPE at base 10000
ORDER: dict[str, Any] = {
    "tokens": ["x", "y", "z"], "q": _rows(3, 4, 21), "k": _rows(3, 4, 22), "v": _rows(3, 2, 23),
    "rope": True,
}  # fmt: skip


def _rope_half(x: np.ndarray) -> np.ndarray:
    """RoPE (Su et al. 2021) as rotate_half: feature t with t + d/2, angle p · 10000^(−2t/d)."""
    half = x.shape[1] // 2
    angle = np.arange(x.shape[0])[:, None] * 10000.0 ** (-2 * np.arange(half) / x.shape[1])
    a, b = x[:, :half], x[:, half:]
    return np.concatenate([a * np.cos(angle) - b * np.sin(angle),
                           b * np.cos(angle) + a * np.sin(angle)], axis=1)  # fmt: skip


def _rms(x: np.ndarray) -> np.ndarray:
    """Each row over its mean square, eps 1e-6, no weight."""
    return x / np.sqrt((x**2).mean(axis=1, keepdims=True) + 1e-6)  # type: ignore[no-any-return]


def _forms(after_rope: bool) -> dict[str, np.ndarray]:
    """q's and k's forms in NumPy: normed then rotated, or (after_rope) rotated then normed."""
    out: dict[str, np.ndarray] = {}
    for side in ("q", "k"):
        x = np.array(ORDER[side], dtype=float)
        if after_rope:
            out[f"{side}_rotated"] = _rope_half(x)
            out[f"{side}_normed"] = _rms(out[f"{side}_rotated"])
        else:
            out[f"{side}_normed"] = _rms(x)
            out[f"{side}_rotated"] = _rope_half(out[f"{side}_normed"])
    return out


@pytest.mark.parametrize("after_rope", [True, False], ids=["after_rope", "before_rope"])
def test_a_cell_is_explained_from_the_form_the_answer_made_before_it(
    page: Any, server: str, after_rope: bool
) -> None:
    """qk_norm after RoPE (Llama 4): q_normed is explained from q_rotated and the scores read
    q_normed; before it (Qwen3): q_rotated is explained from q_normed and the scores read
    q_rotated. The numbers are NumPy's, from the request's arrays."""
    request = {**ORDER, "qk_norm": {"after_rope": True} if after_rope else {"type": "rms"}}
    open_explorer(page, server)
    page.select_option("#endpoint", "attention")
    page.evaluate("async (ex) => (await import('/static/form.js')).fillForm(ex)", request)
    body, data = run_form(page, "attention")
    sent = body["qk_norm"]
    assert (isinstance(sent, dict) and sent.get("after_rope", False)) == after_rope, body
    forms = _forms(after_rope)
    first, last = ("q_rotated", "q_normed") if after_rope else ("q_normed", "q_rotated")
    steps = [s["name"] for s in data["steps"]]
    assert steps.index(first) < steps.index(last)
    panel = _explain(page, last, 2, 1)
    text = panel.inner_text()
    if after_rope:  # the norm of the rotated row, each of its features in the table
        assert "q_normed[2][1] = q_rotated[2][1] / √(mean_u q_rotated[2][u]² + eps)" in text
        cells = panel.locator("table.explain-terms tr td:nth-child(2)").all_inner_texts()
        assert cells == [_fmt6(x) for x in forms["q_rotated"][2]]
    else:  # feature 1 turns with feature 3 of the normed row
        assert "q_rotated[2][1] = q_normed[2][1] · cos φ − q_normed[2][3] · sin φ" in text
        assert f"= {_fmt6(forms['q_normed'][2][1])} · " in text
    _says_the_services_number(panel, forms[last][2][1])
    panel.locator("button.explain-back").click()  # the form before it, explained in turn
    expect(panel.locator(".explain-title")).to_have_text(f"{first}[2][1]")
    _says_the_services_number(panel, forms[first][2][1])
    page.locator('figure[data-name="scores"] rect.cell[data-row="2"][data-col="0"]').click()
    expect(panel.locator(".explain-title")).to_have_text("scores[2][0]")
    k_last = last.replace("q_", "k_")
    assert f"{last}[2][t] · {k_last}[0][t]" in panel.inner_text()
    _says_the_services_number(panel, float(forms[last][2] @ forms[k_last][0]))


ORDER_OF = """async ({data, request}) => {
  const m = await import('/static/explain.js');
  const ctx = {endpoint: 'attention', data, request, head: null, batch: null, i: 2, j: 1};
  const r = m.recompute({...ctx, name: 'q_normed'});
  return [r.from, r.total, m.scoreInputs(ctx).qName];
}"""


def test_the_order_is_the_answers_steps_else_the_requests_after_rope(
    page: Any, server: str
) -> None:
    """A request that does not say where the norm went (a /model trace's is the model's name)
    still explains a Llama 4 answer's q_normed from q_rotated: its steps say so; an answer
    without steps takes the place the request's qk_norm.after_rope gives."""
    open_explorer(page, server)
    after = {**ORDER, "qk_norm": {"after_rope": True}}
    data = post_json(server, "attention", after)
    silent = {**ORDER, "qk_norm": True}
    want = _forms(True)["q_normed"][2][1]
    for request, answer, made_from, scored in (
        (silent, data, "q_rotated", "q_normed"),  # the answer's steps
        (after, {**data, "steps": None}, "q_rotated", "q_normed"),  # no steps: after_rope
        (silent, {**data, "steps": None}, "q", "q_rotated"),  # neither: the norm before RoPE
    ):
        got = page.evaluate(ORDER_OF, {"data": answer, "request": request})
        assert got[0] == made_from and got[2] == scored, (request, got)
        if made_from == "q_rotated":
            assert got[1] == pytest.approx(want, rel=1e-12, abs=1e-12)
