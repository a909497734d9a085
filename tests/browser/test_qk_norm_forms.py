"""The page's arithmetic of a q/k norm cell (lib/layers.js) on the norm's forms of the third
edition, in a real browser: a norm over the whole projection (OLMo 2), a weight per head
(Cohere), a bias (Phi) and a config's norm (its eps is not in the page's request) are not one vector's norm with one weight, so the
page explains none of them (no explanation rather than a wrong one); the plain per-head norm is
still explained with the service's number. The answers come from the service itself."""

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
FORMS: dict[str, dict[str, Any]] = {
    "projection": {"qk_norm": {"over": "projection"},
                   "q_norm.weight": RNG.normal(size=H * D).tolist()},
    "per-head": {"qk_norm": {"type": "layer"},
                 "q_norm.weight": RNG.normal(size=(H, D)).tolist()},
    "bias": {"qk_norm": {"type": "layer"}, "q_norm.weight": RNG.normal(size=D).tolist(),
             "q_norm.bias": RNG.normal(size=D).tolist()},
    "config": {"config": {"model_type": "qwen3", "num_attention_heads": H, "head_dim": D,
                          "num_key_value_heads": H, "hidden_size": D_MODEL,
                          "num_hidden_layers": 1, "rms_norm_eps": 1e-3},
               "q_norm.weight": RNG.normal(size=D).tolist()},
}  # fmt: skip

CELL = """async ([request, data]) => {
  const m = await import('/static/lib/layers.js');
  const cell = m.layerCell({request, data, head: 1, batch: null}, 'q_normed', 2, 1);
  return cell === undefined ? null : cell.total;
}"""


def _cell(page: Any, server: str, fields: dict[str, Any]) -> Any:
    body = {**LAYER, **fields}
    data = post_json(server, "multihead", body)
    return page.evaluate(CELL, [body, data]), data["heads"][1]["q_normed"][2][1]


def test_the_plain_per_head_norm_is_explained_with_the_services_number(
    page: Any, server: str
) -> None:
    open_explorer(page, server)
    fields = {"qk_norm": {"type": "layer"}, "q_norm.weight": RNG.normal(size=D).tolist()}
    explained, service = _cell(page, server, fields)
    assert explained is not None and abs(explained - service) < 1e-12


@pytest.mark.parametrize("form", list(FORMS))
def test_a_norm_of_another_form_is_not_explained(page: Any, server: str, form: str) -> None:
    open_explorer(page, server)
    explained, _ = _cell(page, server, FORMS[form])
    assert explained is None
