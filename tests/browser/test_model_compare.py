"""Compare and the cells' explanations on the explorer's trained-model tab
(service/static/model/compare.js, weights.js) in a real browser against a real server running
all-MiniLM-L6-v2.

Where the user's numbers come from: the way a learner makes them, not the service's functions —
transformers' own BertModel built in float64 from the same safetensors gives the hidden states
entering the layer and the layer's nn.Linear weights (out, in), and the attention is written out
here in NumPy (q = x Wᵀ + b, softmax(q kᵀ / √d_k) v, the heads side by side, W_o, the residual,
the layer norm), checked against transformers' own attention weights and block output. The
mistake is the one learners make most: the scores not scaled."""

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.config import Settings
from service.models.catalog import BY_NAME
from tests.browser.support import js_number, paste_mine
from tests.browser.test_model_view import open_layer, open_model_tab, run_model

torch = pytest.importorskip("torch", reason="the user's numbers come from BertModel in torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

pytestmark = pytest.mark.e2e

SENTENCE = "The cat sat on the mat."
LAYER = 2
HEAD = 1
DIRECTORY: Path = BY_NAME["minilm"].directory(Settings().models_dir)


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def mine() -> dict[str, Any]:
    """Layer LAYER of minilm on SENTENCE as a learner computes it: x and the weights from
    transformers' BertModel (float64), the attention in NumPy; and the same with the scores
    not scaled."""
    config = transformers.BertConfig.from_pretrained(str(DIRECTORY))
    config._attn_implementation = "eager"
    bert = transformers.BertModel(config, add_pooling_layer=False).to(torch.float64).eval()
    state = safetensors_torch.load_file(str(DIRECTORY / "model.safetensors"))
    bert.load_state_dict({k: v.to(torch.float64) for k, v in state.items()}, strict=False)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(DIRECTORY / "tokenizer.json")
    )
    ids = tokenizer(SENTENCE)["input_ids"]
    block: list[Any] = []
    layer = bert.encoder.layer[LAYER]
    hook = layer.attention.register_forward_hook(lambda m, i, o: block.append(o[0][0].numpy()))
    with torch.no_grad():
        out = bert(torch.tensor([ids]), output_hidden_states=True, output_attentions=True)
    hook.remove()
    x = out.hidden_states[LAYER][0].numpy()
    lin = {n: getattr(layer.attention.self, n) for n in ("query", "key", "value")}
    w = {n: (m.weight.detach().numpy(), m.bias.detach().numpy()) for n, m in lin.items()}
    dense, norm = layer.attention.output.dense, layer.attention.output.LayerNorm
    h, d_k = config.num_attention_heads, config.hidden_size // config.num_attention_heads

    def heads(a: np.ndarray) -> np.ndarray:  # (L, h·d_k) -> (h, L, d_k)
        return a.reshape(len(ids), h, d_k).transpose(1, 0, 2)

    q, k, v = (heads(x @ w[n][0].T + w[n][1]) for n in ("query", "key", "value"))

    def after(weights: np.ndarray) -> dict[str, np.ndarray]:
        concat = (weights @ v).transpose(1, 0, 2).reshape(len(ids), h * d_k)
        projected = concat @ dense.weight.detach().numpy().T + dense.bias.detach().numpy()
        z = x + projected
        mean, var = z.mean(-1, keepdims=True), z.var(-1, keepdims=True)
        gamma, beta = norm.weight.detach().numpy(), norm.bias.detach().numpy()
        ln = (z - mean) / np.sqrt(var + norm.eps) * gamma + beta
        return {"weights": weights, "concat": concat, "projected": projected, "residual": z,
                "layer_norm": ln}  # fmt: skip

    right = after(_softmax(q @ k.transpose(0, 2, 1) / np.sqrt(d_k)))
    unscaled = after(_softmax(q @ k.transpose(0, 2, 1)))
    # the learner's right numbers are transformers' own
    assert np.abs(right["weights"] - out.attentions[LAYER][0].numpy()).max() < 1e-12
    assert np.abs(right["layer_norm"] - block[0]).max() < 1e-12
    tokens = tokenizer.convert_ids_to_tokens(ids)
    return {"tokens": tokens, "x": x, "q": q, "right": right, "unscaled": unscaled}


def _rows(a: np.ndarray) -> str:
    """An array as a learner pastes it: JSON rows, every digit of the float64."""
    return "[" + ",\n".join("[" + ", ".join(repr(float(v)) for v in r) + "]" for r in a) + "]"


def _numpy_print(a: np.ndarray) -> str:
    """An array as NumPy prints it at full precision."""
    return np.array2string(a, precision=17, separator=" ", threshold=10**9, max_line_width=200)


def _compare(page: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Click Compare; return the body the page sent to POST /model and the answer."""
    with page.expect_response(
        lambda r: r.url.endswith("/model") and r.request.method == "POST"
    ) as info:
        page.click("#compare")
    page.locator("#compare-status").filter(has_text=re.compile("^(Compared|Error)")).wait_for(
        timeout=60_000
    )
    return info.value.request.post_data_json, info.value.json()


def _open(page: Any, selector: str) -> Any:
    """The element ``selector``, with every fold around it opened."""
    page.locator(selector).evaluate(
        "e => { for (let d = e.closest('details'); d; d = d.parentElement.closest('details'))"
        " d.open = true; }"
    )
    return page.locator(selector)


def _paste(page: Any, name: str, text: str) -> None:
    """Open the folds around output ``name`` (a head's tables, the layer's after its heads), as
    a learner does, and paste ``text`` into its "Compare with my numbers" box."""
    _open(page, f'details.my-numbers[data-name="{name}"]')
    paste_mine(page, name, text)


def _explain(page: Any, table: str, i: int, j: int) -> Any:
    """Click cell [i][j] of the table ``table``; return the explanation panel once drawn, its
    service's number the clicked cell's (the table's column j, not its row label)."""
    cell = _open(page, f'table.matrix[data-name="{table}"] td[data-row="{i}"][data-col="{j}"]')
    shown = float(cell.get_attribute("title"))
    header = page.locator(f'table.matrix[data-name="{table}"] thead th').nth(j + 1)
    assert header.text_content() == str(j)
    assert cell.evaluate("td => td.cellIndex") == j + 1  # the row's label is cell 0
    cell.click()
    panel = page.locator("#explain")
    panel.locator(".explain-total").wait_for()
    assert float(panel.locator(".explain-total").get_attribute("data-service")) == shown
    return panel


def _total(panel: Any) -> tuple[float, float]:
    """The page's number and the service's, in full, from the explanation's total line."""
    line = panel.locator(".explain-total")
    assert panel.locator(".explain-mismatch").count() == 0
    return float(line.get_attribute("data-total")), float(line.get_attribute("data-service"))


def test_a_learners_right_numbers_of_a_model_layer_match_through_post_model(
    page: Any, server: str, mine: dict[str, Any]
) -> None:
    open_model_tab(page, server)
    run_model(page, SENTENCE)
    sent = open_layer(page, LAYER, HEAD).post_data_json
    assert "layer_weights" in sent["include"] and "trace" in sent["include"]
    assert page.locator("#model-tokens .token").all_text_contents() == mine["tokens"]
    right = mine["right"]
    # the boxes under the layer's outputs, named as the trace names them
    assert page.locator("#model-trace-note").text_content().count("Compare with my numbers") == 1
    _paste(page, f"heads.{HEAD}.q", _rows(mine["q"][HEAD]))
    _paste(page, f"heads.{HEAD}.weights", _numpy_print(right["weights"][HEAD]))
    _paste(page, "concat", _rows(right["concat"]))
    _paste(page, "output", _rows(right["layer_norm"]))
    assert page.locator("#compare-bar").is_visible()
    body, answer = _compare(page)
    # POST /model for the same model, text and layer, the arrays as `expected`
    assert {k: body[k] for k in ("model", "text", "layer")} == {
        "model": "minilm", "text": SENTENCE, "layer": LAYER,
    }  # fmt: skip
    assert set(body["expected"]) == {"heads", "concat", "output"}
    assert set(body["expected"]["heads"][HEAD]) == {"q", "weights"}
    assert "w_q" not in body and "x" not in body  # not the layer's weights again
    trace = answer["trace"]
    assert trace["first_mismatch"] is None
    assert [r["match"] for r in trace["comparison"]] == [True] * 4
    verdict = page.locator("#comparison .verdict")
    assert verdict.get_attribute("class") == "verdict ok"
    assert verdict.text_content().startswith("✓ All 4 compared arrays match")
    assert page.locator("#compare-status").text_content() == "Compared: all 4 match"
    listed = page.locator("#comparison ol.compared li").evaluate_all(
        "els => els.map(e => [e.dataset.name, e.className])"
    )
    assert sorted(listed) == sorted(
        [[n, "ok"] for n in (f"heads.{HEAD}.q", f"heads.{HEAD}.weights", "concat", "output")]
    )


def test_scores_not_scaled_are_the_first_mismatch_with_their_diagnosis(
    page: Any, server: str, mine: dict[str, Any]
) -> None:
    open_model_tab(page, server)
    run_model(page, SENTENCE)
    open_layer(page, LAYER, HEAD)
    wrong = mine["unscaled"]
    _paste(page, f"heads.{HEAD}.q", _rows(mine["q"][HEAD]))  # right: q is before the scale
    _paste(page, f"heads.{HEAD}.weights", _rows(wrong["weights"][HEAD]))
    _paste(page, "concat", _rows(wrong["concat"]))
    _, answer = _compare(page)
    trace = answer["trace"]
    assert trace["first_mismatch"] == f"heads.{HEAD}.weights"
    assert page.locator("#compare-status").text_content() == (
        f"Compared: 2 of 3 differ; the first is heads.{HEAD}.weights"
    )
    first = page.locator("#comparison ol.compared li.first-mismatch")
    assert first.get_attribute("data-name") == f"heads.{HEAD}.weights"
    assert (
        page.locator(f'#comparison li[data-name="heads.{HEAD}.q"]').get_attribute("class") == "ok"
    )
    verdict = page.locator("#comparison .verdict.diagnosis")
    assert "scale_missing" in verdict.locator("code.mistake").all_text_contents()
    assert "never scaled" in verdict.locator(".explanation").text_content()
    # the difference map of the first mismatch, its largest difference outlined
    diff = page.locator(f'figure.diff.first-mismatch[data-compared="heads.{HEAD}.weights"]')
    assert diff.count() == 1
    at = next(r for r in trace["comparison"] if r["name"] == f"heads.{HEAD}.weights")["where"]
    assert diff.get_attribute("data-where") == f"{at[0]},{at[1]}"
    gap = np.abs(wrong["weights"][HEAD] - mine["right"]["weights"][HEAD])
    assert tuple(at) == np.unravel_index(gap.argmax(), gap.shape)


def test_every_step_of_the_layer_explains_itself_from_the_layers_weights(
    page: Any, server: str, mine: dict[str, Any]
) -> None:
    open_model_tab(page, server)
    run_model(page, SENTENCE)
    open_layer(page, LAYER, HEAD)
    right = mine["right"]
    d_model = mine["x"].shape[1]
    # a head's q: x_in's row times a column of W_q, plus the bias (384 products, folded)
    panel = _explain(page, f"head{HEAD}_q", 3, 5)
    assert panel.locator(".explain-title").text_content() == f"q[3][5] (head {HEAD})"
    total, service = _total(panel)
    assert total == pytest.approx(mine["q"][HEAD][3][5], abs=1e-12)
    assert service == pytest.approx(mine["q"][HEAD][3][5], abs=1e-12)
    assert panel.locator("details.explain-all-terms table.explain-terms tr").count() == 1 + d_model
    assert (
        f"column {HEAD * 32 + 5} of W_q" in panel.locator(".explain-formula").first.text_content()
    )
    # the concat is a head's output, and one step back that output's own explanation
    panel = _explain(page, "concat", 2, HEAD * 32 + 8)
    total, _ = _total(panel)
    assert total == pytest.approx(right["concat"][2][HEAD * 32 + 8], abs=1e-12)
    panel.locator("button.explain-back").click()
    panel.locator(".explain-title", has_text=f"output[2][8] (head {HEAD})").wait_for()
    assert panel.locator(".explain-mismatch").count() == 0
    # concat · W_o + b_o
    panel = _explain(page, "projected", 4, 7)
    total, service = _total(panel)
    assert total == pytest.approx(right["projected"][4][7], abs=1e-12)
    assert service == pytest.approx(right["projected"][4][7], abs=1e-12)
    # the layer norm: the row's mean and variance, γ and β; back to the residual
    panel = _explain(page, "layer_norm", 4, 7)
    total, service = _total(panel)
    assert total == pytest.approx(right["layer_norm"][4][7], abs=1e-12)
    assert service == pytest.approx(right["layer_norm"][4][7], abs=1e-12)
    z = right["residual"][4]
    said = f"mean = {js_number(z.mean(), 6, False)}, var = {js_number(z.var(), 6, False)}"
    assert said in panel.locator(".explain-formula").nth(1).text_content()
    panel.locator("button.explain-back").click()
    panel.locator(".explain-title", has_text="residual[4][7]").wait_for()
    total, _ = _total(panel)
    assert total == pytest.approx(z[7], abs=1e-12)
    # the layer's output is its layer norm's
    panel = _explain(page, "output", 0, 0)
    total, _ = _total(panel)
    assert total == pytest.approx(right["layer_norm"][0][0], abs=1e-12)
