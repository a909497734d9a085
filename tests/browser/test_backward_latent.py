"""MLA's gradients on the page (issue 44's page work, lib/backward-latent.js): on /multihead with
``mla`` every grad_* cell of the answer — each head's parts of Q and K, grad_q and grad_k before
RoPE, the shared key's, the latents', the weights', grad_x and the block's — is computed again by
the page and equals the service's to 1e-12, none "unexplained"; and cells of each kind equal
torch.autograd of transformers' own DeepseekV3Attention in float64 (tests/api/test_backward_mla.py
builds the layer and reads its intermediates' gradients), never the service's functions. The
forms: q_lora_rank with biases and interleaved RoPE; q_proj with YaRN's mscale and a batch of 2;
q_lora_rank with the half layout, biases and a batch."""

from typing import Any

import numpy as np
import pytest

from tests.api.test_backward_mla import _autograd
from tests.browser.support import post_json
from tests.browser.test_backward_view import RECOMPUTE_GRADIENTS

pytestmark = [pytest.mark.e2e, pytest.mark.torch]

BAR = 1e-12
# the page's cell of a gradient (lib/backward.js gradientCell) and its explanation's text
CELL = """async ({endpoint, data, request, name, head, batch, i, j}) => {
  const m = await import('/static/explain.js');
  const b = await import('/static/lib/backward.js');
  const ctx = {endpoint, data, request, name, head, batch, i, j};
  const r = b.gradientCell(ctx);
  const box = m.explainCell(ctx);
  return [r.kind, r.total ?? null, box.innerText || box.textContent,
          !!box.querySelector('.explain-mismatch')];
}"""
# every gradient of an MLA answer (grad_c_q and q_a_proj's only with q_lora_rank, biases only
# where given, grad_b_o only with o_proj.bias)
LATENT = {"grad_q_nope", "grad_q_rope", "grad_k_nope", "grad_q", "grad_k", "grad_k_rope",
          "grad_c_kv", "grad_w_kv_b", "grad_kv_a_norm_weight", "grad_w_kv_a", "grad_w_q",
          "grad_x", "grad_q_rotated", "grad_k_rotated", "grad_v", "grad_weights",
          "grad_concat", "grad_projected", "grad_w_o"}  # fmt: skip
Q_LATENT = {"grad_c_q", "grad_w_q_a", "grad_q_a_norm_weight"}
CASES = ["q_lora-interleave-bias", "yarn-half-q_proj-batch", "q_lora-half-batch-bias"]


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= BAR * max(1.0, abs(b))


def _cell(page: Any, data: Any, body: Any, name: str, head: int | None, batch: int | None,
          i: int, j: int) -> tuple[str, float, str]:  # fmt: skip
    """The page's kind, total and explanation of one gradient cell (no mismatch shown)."""
    args = {"endpoint": "multihead", "data": data, "request": body, "name": name, "head": head,
            "batch": batch, "i": i, "j": j}  # fmt: skip
    kind, total, text, mismatch = page.evaluate(CELL, args)
    assert not mismatch and total is not None, (name, kind, text)
    return kind, float(total), text


def _answer(server: str, case: str) -> tuple[dict[str, Any], Any, dict[str, Any], Any]:
    """The layer's request (every gradient asked: include left out), the service's answer, and
    torch.autograd's gradients of the same DeepseekV3Attention."""
    body, theirs, attn = _autograd(case, np.random.default_rng(40 + len(case)))
    body.pop("include")
    return body, post_json(server, "multihead", body), theirs, attn


def _walk(page: Any, data: Any, body: Any) -> Any:
    """Every gradient cell of the answer as the page computes it: none "unexplained", each the
    service's number."""
    rows = page.evaluate(RECOMPUTE_GRADIENTS, {"endpoint": "multihead", "data": data,
                                               "request": body})  # fmt: skip
    unexplained = sorted({r[0] for r in rows if r[4] == "unexplained"})
    assert unexplained == [], unexplained
    bad = [r for r in rows if r[5] is None or not _near(r[5], r[6])]
    assert bad == [], bad[:10]
    return rows


@pytest.mark.parametrize("case", CASES)
def test_every_mla_gradient_cell_is_computed_and_is_autograds(
    page: Any, server: str, case: str
) -> None:
    """No MLA gradient cell is "unexplained"; each page total is the service's to 1e-12; and the
    page's shared key, latent, grad_q's rope feature, kv_a_proj_with_mqa's and its norm's weight
    cells and grad_x equal autograd's of DeepseekV3Attention (float64)."""
    body, data, theirs, attn = _answer(server, case)
    assert "grad_c_kv" in data, data
    rows = _walk(page, data, body)
    q_lora = body["mla"]["q_lora_rank"] is not None
    names = {r[0] for r in rows}
    assert LATENT | (Q_LATENT if q_lora else set()) <= names, (LATENT | Q_LATENT) - names
    kinds = {r[4] for r in rows}
    assert {"mla-part", "mla-rope-back", "mla-shared-key", "mla-up", "mla-weight",
            "mla-norm-weight", "mla-x", "concat-back", "dQ", "dK"} <= kinds, kinds  # fmt: skip
    # against autograd: (B, …) tensors, the batch item's
    batched = isinstance(body["x"][0][0], list)
    b = 1 if batched else None
    n = b or 0
    nope, kv_rank = 4, 8
    params = dict(attn.named_parameters())

    def grad(name: str) -> np.ndarray:
        g = params[name].grad
        assert g is not None, name
        return np.asarray(g.detach().numpy())

    checks: list[tuple[str, int | None, int | None, int, int, float, str]] = [
        ("grad_k_rope", None, b, 3, 1, theirs["grad_k_rope"][n, 3, 1].item(), "Σ_h grad_k_rotated_h"),
        ("grad_c_kv", None, b, 2, 5, theirs["grad_c_kv"][n, 2, 5].item(), "Σ_col d[k_nope | V][2][col]"),
        ("grad_q", 1, b, 4, nope + 1, theirs["grad_q"][n, 1, 4, nope + 1].item(), "turned back by −φ"),
        ("grad_k_nope", 0, b, 1, 2, theirs["grad_k_nope"][n, 0, 1, 2].item(), "grad_k_rotated[1][2]"),
        ("grad_w_kv_a", None, None, 3, kv_rank + 1, grad("kv_a_proj_with_mqa.weight")[kv_rank + 1, 3],
         "kv_a_proj_with_mqa.weight[9][3]"),
        ("grad_w_kv_a", None, None, 7, 2, grad("kv_a_proj_with_mqa.weight")[2, 7], "dC = "),
        ("grad_kv_a_norm_weight", None, None, 0, 6, grad("kv_a_layernorm.weight")[6], "x̂[i][6]"),
        ("grad_w_kv_b", None, None, 5, 11, grad("kv_b_proj.weight")[11, 5], "c_kv[i][5]"),
        ("grad_x", None, b, 2, 9, theirs["grad_x"][n, 2, 9].item(), "kv_a_proj_with_mqa.weight[c][9]"),
    ]  # fmt: skip
    if q_lora:
        checks += [
            ("grad_c_q", None, b, 1, 3, theirs["grad_c_q"][n, 1, 3].item(), "W_qb[col][3]"),
            ("grad_q_a_norm_weight", None, None, 0, 4, grad("q_a_layernorm.weight")[4], "x̂[i][4]"),
            ("grad_w_q_a", None, None, 6, 2, grad("q_a_proj.weight")[2, 6], "dz_q"),
        ]  # fmt: skip
    else:
        checks.append(("grad_w_q", None, None, 5, 3, grad("q_proj.weight")[3, 5], "q_proj.weight"))
    if "kv_a_proj_with_mqa.bias" in params:  # the bias's table: each row's dC, times 1
        bias = grad("kv_a_proj_with_mqa.bias")
        checks.append(("grad_b_kv_a", None, None, 0, kv_rank + 1, bias[kv_rank + 1], "· 1"))
    for name, head, item, i, j, want, said in checks:
        _, total, text = _cell(page, data, body, name, head, item, i, j)
        assert total == pytest.approx(want, abs=BAR, rel=BAR), (name, i, j)
        assert said in text, (name, text)


@pytest.mark.parametrize("case", ["deepseek_v3-mla-yarn", "deepseek_v2_lite-mla-q_proj"])
def test_an_mla_layer_from_its_config_is_explained_as_the_service_read_it(
    page: Any, server: str, case: str
) -> None:
    """A DeepSeek layer given as its config and state dict (no mla field): the page reads the
    config's fields as the service read them (conventions.config_fields), so every gradient cell,
    the block's included, is computed and is the service's; grad_x is autograd's of the
    transformers layer (float64)."""
    from tests.api.test_backward_forms import config_case

    grad_x, _, body = config_case(case)
    data = post_json(server, "multihead", body)
    assert "mla" not in body and "mla" in data["conventions"]["config_fields"]
    rows = _walk(page, data, body)
    assert {"grad_c_kv", "grad_k_rope", "grad_x", "grad_concat"} <= {r[0] for r in rows}
    page_x = {(r[2], r[3]): r[5] for r in rows if r[0] == "grad_x"}
    assert _near(page_x[(2, 5)], float(grad_x[0, 2, 5]))
