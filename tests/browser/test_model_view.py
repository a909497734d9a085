"""The explorer's trained-model mode (service/static/model/) in a real browser against a real
server running all-MiniLM-L6-v2: the model view (every layer × head, labelled with its role),
a head opened large with its layer's head view, the rollout, the opened layer's trace (fetched
then) drawn by the page's /multihead views with cells that explain themselves, and errors in
words. The page asks for safetensors; the numbers checked here are asked for as JSON."""

import json
import re
import urllib.request
from typing import Any

import pytest

from tests.browser.support import ARTIFACTS, map_cells, open_explorer, post_json, wait_idle

pytestmark = pytest.mark.e2e

SENTENCE = "The cat sat on the mat. The cat sat down."
WORDS = {
    "previous_token": "prev",
    "next_token": "next",
    "self": "self",
    "first_token": "first",
    "last_token": "last",
    "induction": "induction",
}


# whether an SVG line is drawn: neither it nor a group around it is display: none (Chromium's
# checkVisibility() says true for a child of a group not displayed)
SHOWN = """e => { for (let n = e; n && n.tagName !== 'svg'; n = n.parentNode)
  if (getComputedStyle(n).display === 'none') return false; return true; }"""


def _is_model_post(r: Any) -> bool:
    return bool(r.url.endswith("/model") and r.request.method == "POST")


def open_model_tab(page: Any, server: str) -> None:
    """Open the explorer, then its trained-model tab; wait until the sentence in the box (run
    when the tab first opens) is drawn."""
    open_explorer(page, server)
    page.click("#tab-model")
    page.locator("#model-form[data-ready=true]").wait_for(timeout=20_000)
    page.locator("#model-results:not([hidden])").wait_for(timeout=60_000)
    wait_idle(page)


FIRST = ["model", "tokens", "attention", "head_roles", "rollout"]


def answer(server: str, text: str, layer: int = 0) -> Any:
    """POST /model's whole answer for ``text`` (with ``layer``'s trace), as JSON."""
    return post_json(server, "model", {"model": "minilm", "text": text, "layer": layer})


def open_layer(page: Any, layer: int, head: int = -1) -> Any:
    """Click head ``head`` of ``layer`` in the grid (or the layer's name, with -1); wait until
    its trace is drawn; return the request that fetched it."""
    target = (
        f'#model-grid button.layer-label[data-layer="{layer}"]'
        if head < 0
        else f'#model-grid button.head-cell[data-layer="{layer}"][data-head="{head}"]'
    )
    with page.expect_response(_is_model_post) as info:
        page.click(target)
    page.locator("#model-trace-heading", has_text=f"Layer {layer}, step by step").wait_for(
        timeout=60_000
    )
    wait_idle(page)
    return info.value.request


def run_model(page: Any, text: str) -> tuple[dict[str, Any], Any]:
    """Type ``text`` and Run; return the body sent and the response."""
    page.fill("#model-text", text)
    with page.expect_response(_is_model_post) as info:
        page.click("#model-run")
    response = info.value
    page.locator("#model-status").filter(has_text=re.compile("^(Done|Error)")).wait_for(
        timeout=60_000
    )
    wait_idle(page)
    return response.request.post_data_json, response


def test_the_model_view_draws_every_head_labelled_with_its_role_and_the_servers_tokens(
    page: Any, server: str
) -> None:
    open_model_tab(page, server)
    body, response = run_model(page, SENTENCE)
    assert body == {"model": "minilm", "text": SENTENCE, "include": FIRST}
    assert response.status == 200
    assert response.headers["content-type"].startswith("application/x-safetensors")
    data = answer(server, SENTENCE)
    layers, heads = len(data["attention"]), len(data["attention"][0])
    assert (layers, heads) == (data["model"]["layers"], data["model"]["heads"]) == (6, 12)

    # (a) a small map (a canvas in a button) per layer and head; the tokens are the server's
    cells = page.locator("#model-grid button.head-cell")
    assert cells.count() == layers * heads
    assert page.locator("#model-grid button.head-cell canvas").count() == layers * heads
    where = cells.evaluate_all("els => els.map(e => [+e.dataset.layer, +e.dataset.head])")
    assert where == [[layer, head] for layer in range(layers) for head in range(heads)]
    shown = page.locator("#model-tokens .token").all_text_contents()
    assert shown == data["tokens"]
    assert data["tokens"][0] == "[CLS]" and data["tokens"][-1] == "[SEP]"
    assert "the" in shown and "The" not in shown  # the uncased tokenizer's, not the words typed

    # (b) each map's role is the response's head_roles, its label the role's short word, and
    # its tooltip gives the scores
    found = cells.evaluate_all(
        "els => els.map(e => [e.dataset.role, e.querySelector('.role').textContent, e.title])"
    )
    labelled = 0
    for (role, label, title), (layer, head) in zip(found, where, strict=True):
        expected = data["head_roles"][layer][head]["role"]
        assert role == (expected or ""), (layer, head)
        assert label == (WORDS[expected] if expected else ""), (layer, head)
        assert f"layer {layer}, head {head}" in title and "entropy" in title
        labelled += bool(label)
    assert labelled >= 1

    # the keyboard: the grid is one tab stop, the arrow keys move between heads, Enter opens one
    page.locator("#model-grid button.head-cell[tabindex='0']").focus()
    start = page.evaluate(
        "() => [+document.activeElement.dataset.layer, +document.activeElement.dataset.head]"
    )
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Enter")
    opened = (min(start[0] + 1, layers - 1), min(start[1] + 1, heads - 1))
    page.locator(f'#model-head[data-layer="{opened[0]}"][data-head="{opened[1]}"]').wait_for()
    assert page.locator("#model-grid button.head-cell[tabindex='0']").count() == 1
    # and the tabs: the arrow keys go back to the matrices
    page.locator("#tab-model").focus()
    page.keyboard.press("ArrowLeft")
    page.locator("#form:not([hidden])").wait_for()
    assert page.locator("#tab-steps").get_attribute("aria-selected") == "true"
    assert page.locator("#model-form").is_hidden()


def test_a_head_opens_large_with_the_servers_weights_and_its_head_view_lines(
    page: Any, server: str
) -> None:
    open_model_tab(page, server)
    run_model(page, SENTENCE)
    data = answer(server, SENTENCE)
    # a head with a role: a previous-token head if there is one
    roles = data["head_roles"]
    layer, head = next(
        ((a, h) for a in range(6) for h in range(12) if a != 2 and roles[a][h]["role"]), (0, 0)
    )
    open_layer(page, layer, head)  # drawn at once, and again with its trace
    box = page.locator(f'#model-head[data-layer="{layer}"][data-head="{head}"]')
    box.wait_for()
    assert (
        page.locator(
            f'#model-grid button.head-cell[data-layer="{layer}"][data-head="{head}"]'
        ).get_attribute("aria-pressed")
        == "true"
    )
    assert page.locator("#model-grid button.head-cell[aria-pressed=true]").count() == 1
    assert f"Layer {layer}, head {head}" in box.locator("h3").text_content()
    scores = box.locator(".role-scores").text_content()
    assert "previous token" in scores and "entropy" in scores

    # (c) the large map: tokens on both axes, every cell the response's attention value
    w = data["attention"][layer][head]
    big = box.locator('figure[data-name="model_head"]')
    assert big.get_attribute("data-layer") == str(layer)
    assert big.locator("text.row-label").all_text_contents() == data["tokens"]
    assert big.locator("text.col-label").all_text_contents() == data["tokens"]
    cells = map_cells(page, "model_head")
    L = len(data["tokens"])
    assert len(cells) == L * L
    for (i, j), v in cells.items():
        assert float(v) == w[i][j], (i, j)
    big.locator('rect.cell[data-row="3"][data-col="2"]').hover()
    readout = big.locator(".cell-readout").text_content()
    assert readout.startswith(f"{data['tokens'][3]} → {data['tokens'][2]}: ")

    # (d) the head view: a line per weight from 0.001 up, its opacity the weight
    lines = box.locator("svg.head-lines line").evaluate_all(
        "els => els.map(e => [+e.dataset.i, +e.dataset.j, +e.getAttribute('stroke-opacity'),"
        " +getComputedStyle(e).strokeOpacity])"
    )
    drawn = {(i, j): (attr, style) for i, j, attr, style in lines}
    assert set(drawn) == {(i, j) for i in range(L) for j in range(L) if w[i][j] >= 0.001}
    for (i, j), (attr, style) in drawn.items():
        assert attr == w[i][j]
        assert style == pytest.approx(w[i][j], abs=0.01)
    for i in range(L):  # each query's lines: more weight, more opaque
        row = sorted((w[i][j], drawn[i, j][1]) for j in range(L) if (i, j) in drawn)
        assert [s for _, s in row] == sorted(s for _, s in row), i
    # hovering a query token shows only its lines, and says where it looks most
    q = 4
    box.locator(f'svg.head-lines g.tok.q[data-i="{q}"]').hover()
    visible = box.locator("svg.head-lines line").evaluate_all(
        f"els => els.filter({SHOWN}).map(e => +e.dataset.i)"
    )
    assert visible and set(visible) == {q}
    assert len(visible) == sum(1 for j in range(L) if w[q][j] >= 0.001)
    top = max(range(L), key=lambda j: w[q][j])
    said = box.locator("figure.head-view .cell-readout").text_content()
    assert said.startswith(
        f"query {q} “{data['tokens'][q]}” attends most to “{data['tokens'][top]}”"
    )
    page.mouse.move(1, 1)  # leaving the picture shows every line again
    page.wait_for_function(
        f"() => [...document.querySelectorAll('svg.head-lines line')].every({SHOWN})"
    )

    # the rollout, with the tokens
    rollout = page.locator('figure[data-name="model_rollout"]')
    assert rollout.locator("text.row-label").all_text_contents() == data["tokens"]
    for (i, j), v in map_cells(page, "model_rollout").items():
        assert float(v) == data["rollout"][i][j], (i, j)

    # a click keeps a query's lines shown (the picture: the grid, the head large, its lines)
    box.locator(f'svg.head-lines g.tok.q[data-i="{q}"]').click()
    assert box.locator(f'svg.head-lines g.tok.q[data-i="{q}"]').get_attribute("aria-pressed") == (
        "true"
    )
    page.set_viewport_size({"width": 1280, "height": 2000})
    page.evaluate("window.scrollTo(0, 0)")
    page.mouse.move(1, 1)
    page.screenshot(path=str(ARTIFACTS / "explorer-model-view.png"))
    assert set(
        box.locator("svg.head-lines line").evaluate_all(
            f"els => els.filter({SHOWN}).map(e => +e.dataset.i)"
        )
    ) == {q}


def test_the_chosen_layer_is_drawn_step_by_step_and_its_cells_explain_themselves(
    page: Any, server: str
) -> None:
    open_model_tab(page, server)
    run_model(page, SENTENCE)
    assert page.locator("#results").is_hidden()  # no trace until a layer is opened
    request = open_layer(page, 3, 5)
    sent = request.post_data_json
    assert sent == {"model": "minilm", "text": SENTENCE, "layer": 3, "include": sent["include"]}
    assert sent["include"][0] == "trace" and set(sent["include"]) <= {"trace", "layer_weights"}
    assert request.headers["accept"] == "application/x-safetensors"
    data = answer(server, SENTENCE, 3)
    trace = data["trace"]
    # (e) the page's /multihead views of the trace: each head's weights side by side, the
    # scores maps, the tables, the steps
    assert page.locator("#heads-grid figure.heatmap").count() >= 12
    assert page.locator('#heatmaps figure[data-name="head5_scaled_scores"]').count() == 1
    assert page.locator("#steps li").count() == len(trace["steps"])
    assert page.locator('#tables details.head-tables[data-head="5"]').count() == 1
    weights = map_cells(page, "head5_weights")
    assert float(weights[(2, 1)]) == trace["heads"][5]["weights"][2][1]
    assert trace["heads"][5]["weights"] == data["attention"][3][5]
    # a scaled score explains itself (the score times the scale), and one step back the score
    # (q row · k row), each with the page's total beside the service's
    page.locator(
        'figure[data-name="head5_scaled_scores"] rect.cell[data-row="2"][data-col="1"]'
    ).click()
    panel = page.locator("#explain")
    panel.locator(".explain-total").wait_for()
    assert panel.locator(".explain-title").text_content() == "scaled_scores[2][1] (head 5)"
    assert panel.locator(".explain-mismatch").count() == 0
    panel.locator("button.explain-back").click()
    panel.locator(".explain-title", has_text="scores[2][1] (head 5)").wait_for()
    assert panel.locator(".explain-title").text_content() == "scores[2][1] (head 5)"
    assert panel.locator(".explain-mismatch").count() == 0
    assert panel.locator("table.explain-terms tr").count() == 1 + trace["d_k"]
    page.click("#explain-close")
    # the large map of a head of this layer explains its weights too (a softmax of the row)
    page.click('#model-grid button.head-cell[data-layer="3"][data-head="5"]')
    page.locator('#model-head[data-layer="3"][data-head="5"]').wait_for()
    page.locator('figure[data-name="model_head"] rect.cell[data-row="4"][data-col="0"]').click()
    panel.locator(".explain-total").wait_for()
    assert panel.locator(".explain-title").text_content() == "weights[4][0] (head 5)"
    assert panel.locator(".explain-mismatch").count() == 0
    service = panel.locator(".explain-service").text_content()
    assert float(service) == pytest.approx(data["attention"][3][5][4][0], rel=1e-5)
    # compare is offered on a model's trace (its Compare asks POST /model: test_model_compare.py)
    assert page.locator('details.my-numbers[data-name="heads.5.weights"]').count() == 1
    assert not page.locator("#export-safetensors").is_visible()

    # a head of another layer: its layer's trace is fetched alone, and then it explains itself
    sent = open_layer(page, 0, 1).post_data_json
    assert {k: sent[k] for k in ("layer", "include")} == {"layer": 0, "include": sent["include"]}
    assert sent["include"][0] == "trace"
    assert page.locator("#model-grid button.head-cell").count() == 72  # the grid stays
    layer0 = answer(server, SENTENCE, 0)["trace"]
    assert float(map_cells(page, "head1_weights")[(1, 1)]) == layer0["heads"][1]["weights"][1][1]
    page.locator('figure[data-name="model_head"] rect.cell[data-row="1"][data-col="2"]').click()
    panel.locator(".explain-total").wait_for()
    assert panel.locator(".explain-title").text_content() == "weights[1][2] (head 1)"
    assert panel.locator(".explain-mismatch").count() == 0


def test_an_over_long_text_says_why_in_words_and_the_other_tab_keeps_its_answer(
    page: Any, server: str
) -> None:
    open_model_tab(page, server)
    drawn_tokens = page.locator("#model-tokens .token").all_text_contents()
    # (f) 200 words are over the 128-token limit: a 413, in words, beside the form and its field
    _, response = run_model(page, " ".join(["word"] * 200))
    assert response.status == 413
    message = response.json()["message"]
    assert "over this service's limit of 128" in message
    error = page.locator("#model-error")
    assert error.is_visible() and error.text_content() == message
    assert (
        page.locator('#model-form .field[data-field="text"] .field-error').text_content() == message
    )
    assert page.locator("#model-status").text_content() == "Error 413"
    # the answer drawn before stays, marked as from the previous run
    assert page.locator("#stale-note").is_visible()
    assert "stale" in (page.locator("#model-results").get_attribute("class") or "")
    assert page.locator("#model-tokens .token").all_text_contents() == drawn_tokens
    # an empty text is a 422 naming the field; the next good Run clears it all
    _, response = run_model(page, "   ")
    assert response.status == 422
    assert page.locator("#model-error").text_content() == response.json()["message"]
    _, response = run_model(page, SENTENCE)
    assert response.status == 200
    assert not page.locator("#model-error").is_visible()
    assert page.locator(".field-error").count() == 0
    assert not page.locator("#stale-note").is_visible()
    open_layer(page, 1)

    # the matrices tab still holds its worked example's answer, and the model's comes back
    page.click("#tab-steps")
    page.locator("#form:not([hidden])").wait_for()
    assert page.locator("#model-results").is_hidden()
    assert page.locator("#tab-steps").get_attribute("aria-selected") == "true"
    assert page.locator('#heatmaps figure[data-name="weights"]').count() == 1
    page.click("#tab-model")
    page.locator("#model-form:not([hidden])").wait_for()
    assert page.locator("#model-trace-heading").text_content() == "Layer 1, step by step"
    assert page.locator("#heads-grid figure.heatmap").count() >= 12


def test_a_model_not_installed_is_shown_disabled_with_its_install_command(
    page: Any, server: str
) -> None:
    """GET /models lists a model whose files are not on this server (a made-up bert-large,
    since both real ones are installed here): it cannot be picked, and the command that
    installs it (from the 501 that POST /model answers for it) is shown."""
    with urllib.request.urlopen(server + "/models", timeout=30) as r:
        real = json.loads(r.read())
    extra = {**real[0], "name": "bert-large", "kind": "decoder", "installed": False}
    page.route(
        "**/models",
        lambda route: route.fulfill(
            status=200, content_type="application/json", body=json.dumps([*real, extra])
        ),
    )

    def model(route: Any) -> None:
        if (route.request.post_data_json or {}).get("model") == "bert-large":
            route.fulfill(
                status=501,
                content_type="application/json",
                body=json.dumps(
                    {
                        "message": "bert-large is not installed on this server",
                        "errors": [],
                        "install_command": "make models",
                    }
                ),
            )
        else:
            route.fallback()

    page.route("**/model", model)
    open_model_tab(page, server)
    option = page.locator('#model-name option[value="bert-large"]')
    assert option.is_disabled()
    assert "not installed" in option.text_content()
    assert page.locator('#model-name option[value="minilm"]').is_enabled()
    note = page.locator('#model-missing li[data-model="bert-large"]')
    assert note.text_content() == (
        "bert-large is not installed on this server: install it with make models."
    )
    assert note.locator("code").text_content() == "make models"


def test_a_128_token_text_draws_small_maps_on_canvas(page: Any, server: str) -> None:
    """At the token limit the 72 small maps and the large one are canvases, not SVG rects."""
    open_model_tab(page, server)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and"]
    _, response = run_model(page, " ".join(words[i % len(words)] for i in range(126)))
    assert response.status == 200
    open_layer(page, 5)
    assert page.locator("#model-tokens .token").count() == 128
    assert page.locator("#model-grid button.head-cell canvas").count() == 72
    assert page.locator('figure[data-name="model_head"] canvas').count() == 1
    assert page.locator("#model-results rect").count() < 1000  # no map drawn a shape a cell
    assert page.locator("#model-trace-heading").text_content() == "Layer 5, step by step"


@pytest.mark.parametrize("offline_page", [(390, 844)], indirect=True, ids=["phone"])
def test_the_model_view_fits_a_phone(offline_page: tuple[Any, list[str]], server: str) -> None:
    """At phone width the answer comes first, the grid keeps its 12 columns on screen, and
    nothing scrolls sideways (a wide map scrolls inside its card)."""
    page, outside = offline_page
    open_model_tab(page, server)
    assert (
        page.locator("#model-results").bounding_box()["y"]
        < page.locator("#model-form").bounding_box()["y"]
    )
    grid = page.locator("#model-grid .model-grid").bounding_box()
    assert grid["x"] >= 0 and grid["x"] + grid["width"] <= 390
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth + 1")
    assert outside == []
