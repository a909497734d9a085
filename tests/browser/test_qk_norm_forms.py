"""The page's arithmetic of a q/k norm cell (lib/layers.js) on the norm's forms of the third
edition, in a real browser: a norm over the whole projection (OLMo 2: the mean over every
head's features of the token, the weight's entry head·d_k + j), a weight per head (Cohere: the
head's row), a bias (Phi), and a norm a config gave (its settings read from the answer's step,
its eps from the config key the answer's conventions name). Each cell's explanation totals the
service's number, and its working is checked against NumPy on the answer's own q and k. Where
the answer does not say enough (a config's eps the request does not hold), the page still
explains nothing rather than guess. The answers come from the service itself."""

from typing import Any

import numpy as np
import pytest

from tests.browser.support import open_explorer, post_json

pytestmark = pytest.mark.e2e

RNG = np.random.default_rng(41)
H, D, D_MODEL, L = 2, 4, 6, 3
LAYER = {"x": RNG.normal(size=(L, D_MODEL)).tolist(), "num_heads": H,
         "q_proj.weight": RNG.normal(size=(H * D, D_MODEL)).tolist(),
         "k_proj.weight": RNG.normal(size=(H * D, D_MODEL)).tolist(),
         "v_proj.weight": RNG.normal(size=(H * D, D_MODEL)).tolist()}  # fmt: skip
# four query heads over two key heads (grouped-query attention), for the keys' projection norm
GQA = {**LAYER, "num_heads": 4, "num_kv_heads": 2,
       "q_proj.weight": RNG.normal(size=(4 * 2, D_MODEL)).tolist(),
       "k_proj.weight": RNG.normal(size=(2 * 2, D_MODEL)).tolist(),
       "v_proj.weight": RNG.normal(size=(2 * 2, D_MODEL)).tolist()}  # fmt: skip
QWEN3 = {"model_type": "qwen3", "num_attention_heads": H, "head_dim": D,
         "num_key_value_heads": H, "hidden_size": D_MODEL, "num_hidden_layers": 1,
         "rms_norm_eps": 1e-3}  # fmt: skip
CONFIG_WEIGHTS = {"q_norm.weight": RNG.normal(size=D).tolist(),
                  "k_norm.weight": RNG.normal(size=D).tolist(),
                  "o_proj.weight": RNG.normal(size=(D_MODEL, H * D)).tolist()}  # fmt: skip
FORMS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "projection": (LAYER, {"qk_norm": {"over": "projection", "eps": 1e-2},
                           "q_norm.weight": RNG.normal(size=H * D).tolist(),
                           "k_norm.weight": RNG.normal(size=H * D).tolist()}),
    "projection-layer": (LAYER, {"qk_norm": {"over": "projection", "type": "layer"},
                                 "q_norm.weight": RNG.normal(size=H * D).tolist()}),
    "projection-gqa": (GQA, {"qk_norm": {"over": "projection"},
                             "q_norm.weight": RNG.normal(size=4 * 2).tolist(),
                             "k_norm.weight": RNG.normal(size=2 * 2).tolist()}),
    "per-head": (LAYER, {"qk_norm": {"type": "layer"},
                         "q_norm.weight": RNG.normal(size=(H, D)).tolist(),
                         "k_norm.weight": RNG.normal(size=(H, D)).tolist()}),
    "bias": (LAYER, {"qk_norm": {"type": "layer"}, "q_norm.weight": RNG.normal(size=D).tolist(),
                     "q_norm.bias": RNG.normal(size=D).tolist(),
                     "k_norm.bias": RNG.normal(size=(H, D)).tolist()}),
    "config": (LAYER, {"config": QWEN3, **CONFIG_WEIGHTS}),
}  # fmt: skip

CELL = """async ([request, data, name, head, r, t]) => {
  const m = await import('/static/lib/layers.js');
  const cell = m.layerCell({request, data, head, batch: null}, name, r, t);
  return cell === undefined ? null : cell;
}"""
EXPLAIN = """async (ctx) => {
  const e = (await import('/static/explain.js')).explainCell(ctx);
  return e === null ? null : [e.innerText, e.innerHTML];
}"""


def _cell(page: Any, body: dict[str, Any], data: Any, name: str, head: int, r: int, t: int) -> Any:
    return page.evaluate(CELL, [body, data, name, head, r, t])


def test_the_plain_per_head_norm_is_explained_with_the_services_number(
    page: Any, server: str
) -> None:
    open_explorer(page, server)
    body = {**LAYER, "qk_norm": {"type": "layer"}, "q_norm.weight": RNG.normal(size=D).tolist()}
    data = post_json(server, "multihead", body)
    cell = _cell(page, body, data, "q_normed", 1, 2, 1)
    assert cell is not None and abs(cell["total"] - data["heads"][1]["q_normed"][2][1]) < 1e-12


@pytest.mark.parametrize("form", list(FORMS))
def test_a_norm_of_each_form_totals_the_services_number(page: Any, server: str, form: str) -> None:
    """Every cell of q_normed and k_normed of every head: the page's total is the service's."""
    open_explorer(page, server)
    layer, fields = FORMS[form]
    body = {**layer, **fields}
    data = post_json(server, "multihead", body)
    got = page.evaluate(
        """async ([request, data]) => {
      const m = await import('/static/lib/layers.js');
      const out = [];
      data.heads.forEach((hd, head) => {
        for (const name of ['q_normed', 'k_normed'])
          hd[name].forEach((row, r) => row.forEach((v, t) => {
            const c = m.layerCell({request, data, head, batch: null}, name, r, t);
            out.push([name, head, r, t, c === undefined ? null : c.total, v]);
          }));
      });
      return out;
    }""",
        [body, data],
    )
    assert got, "no cells"
    for name, head, r, t, total, service in got:
        assert total is not None, (form, name, head, r, t)
        assert abs(total - service) <= 1e-12 * max(1.0, abs(service)), (name, head, r, t)


def test_the_projections_mean_spans_every_heads_features(page: Any, server: str) -> None:
    """Over the projection the mean of squares runs over all h·d_k features of the token (every
    head's q before the norm), the weight's entry is head·d_k + j, and the lines say so."""
    open_explorer(page, server)
    layer, fields = FORMS["projection"]
    body = {**layer, **fields}
    data = post_json(server, "multihead", body)
    r, t = 2, 1
    q = np.array([data["heads"][g]["q"][r] for g in range(H)])  # (H, D): the token's projection
    cell = _cell(page, body, data, "q_normed", 1, r, t)
    assert len(cell["terms"]) == H * D and cell["at"] == D + t
    assert abs(cell["spread"] - float(np.mean(q * q))) < 1e-15
    assert cell["w"] == fields["q_norm.weight"][D + t]
    ctx = {"endpoint": "multihead", "data": data, "request": body, "name": "q_normed",
           "head": 1, "batch": None, "i": r, "j": t}  # fmt: skip
    text, html = page.evaluate(EXPLAIN, ctx)
    assert f"over all {H * D} features" in text, text
    assert f"w[{D + t}] is q_norm.weight[{D + t}]" in text, text
    assert "explain-mismatch" not in html


def test_the_keys_projection_spans_each_key_head_once(page: Any, server: str) -> None:
    """Grouped-query attention: the keys' norm spans the h_kv·d_k features of the key heads (each
    once, not as repeated to the query heads), and query head 3 reads key head 1's entries."""
    open_explorer(page, server)
    layer, fields = FORMS["projection-gqa"]
    body = {**layer, **fields}
    data = post_json(server, "multihead", body)
    k = np.array([data["heads"][g]["k"][0] for g in (0, 2)])  # key heads 0 and 1
    cell = _cell(page, body, data, "k_normed", 3, 0, 1)
    assert cell["heads"] == [0, 2] and cell["at"] == 2 + 1
    assert abs(cell["spread"] - float(np.mean(k * k))) < 1e-15
    assert cell["w"] == fields["k_norm.weight"][3]


def test_a_weight_per_head_takes_the_heads_row(page: Any, server: str) -> None:
    open_explorer(page, server)
    layer, fields = FORMS["per-head"]
    body = {**layer, **fields}
    data = post_json(server, "multihead", body)
    cell = _cell(page, body, data, "q_normed", 1, 0, 2)
    assert cell["w"] == fields["q_norm.weight"][1][2]
    ctx = {"endpoint": "multihead", "data": data, "request": body, "name": "q_normed",
           "head": 1, "batch": None, "i": 0, "j": 2}  # fmt: skip
    text, _ = page.evaluate(EXPLAIN, ctx)
    assert "w[2] is q_norm.weight[1][2]" in text, text


def test_a_bias_is_added_after_the_weight(page: Any, server: str) -> None:
    open_explorer(page, server)
    layer, fields = FORMS["bias"]
    body = {**layer, **fields}
    data = post_json(server, "multihead", body)
    q = np.array(data["heads"][0]["q"][1])
    c = q - q.mean()
    want = c[3] / np.sqrt(np.mean(c * c) + 1e-6) * fields["q_norm.weight"][3]
    cell = _cell(page, body, data, "q_normed", 0, 1, 3)
    assert cell["b"] == fields["q_norm.bias"][3]
    assert abs(cell["total"] - (want + fields["q_norm.bias"][3])) < 1e-12


def test_a_configs_norm_takes_the_configs_eps(page: Any, server: str) -> None:
    """With a config the page reads the norm as the service read it (conventions.config_fields)
    and says where its eps came from (the config's rms_norm_eps, conventions.config)."""
    open_explorer(page, server)
    layer, fields = FORMS["config"]
    body = {**layer, **fields}
    data = post_json(server, "multihead", body)
    cell = _cell(page, body, data, "k_normed", 0, 1, 0)
    assert cell["eps"] == 1e-3 and cell["epsField"] == "config.rms_norm_eps"
    assert abs(cell["total"] - data["heads"][0]["k_normed"][1][0]) < 1e-12


def test_a_config_without_its_eps_takes_the_default_the_service_read(
    page: Any, server: str
) -> None:
    """The config leaves rms_norm_eps to transformers' default: the step's formula has it to 6
    digits only, but conventions.config_fields has the number the service used, so the page
    explains the cell with the service's number and says the eps was the config's default."""
    open_explorer(page, server)
    config = {k: v for k, v in QWEN3.items() if k != "rms_norm_eps"}
    body = {**LAYER, "config": config, **CONFIG_WEIGHTS}
    data = post_json(server, "multihead", body)
    cell = _cell(page, body, data, "q_normed", 1, 2, 1)
    assert cell["eps"] == data["conventions"]["config_fields"]["qk_norm"]["eps"]
    assert "absent" in cell["epsField"], cell["epsField"]
    assert abs(cell["total"] - data["heads"][1]["q_normed"][2][1]) < 1e-12
