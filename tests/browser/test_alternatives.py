"""The comparison panel (verdict.js comparisonPanel) shows the sets that reproduce the caller's
numbers as closely as the named one (``diagnosis.alternatives``, API.md "Compare, third
edition"), on a real answer of the live server: a decode step whose new token was rotated at
position 0 is named ``decode_position_offset``, and ``rope_missing`` (at position 0 the rotation
is the identity) is listed as well."""

from typing import Any

import numpy as np
import pytest

from tests.browser.support import open_explorer, post_json

pytestmark = pytest.mark.e2e

PANEL = """async (data) => {
  const v = await import('/static/verdict.js');
  v.comparisonPanel(data, new Map(), undefined);  // draws into the page's #comparison
  const panel = document.getElementById('comparison');
  const also = panel.querySelector('.verdict.diagnosis .alternatives');
  return [panel.querySelector('.verdict.diagnosis').innerText, also && also.innerText,
          also ? [...also.querySelectorAll('code.mistake')].map((c) => c.textContent) : []];
}"""


def test_the_alternatives_are_listed_under_the_diagnosis(page: Any, server: str) -> None:
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(1, 4)) for _ in range(3))
    body = {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "rope": True,
            "past": {"k": rng.normal(size=(3, 4)).tolist(), "v": rng.normal(size=(3, 4)).tolist()},
            "expected": {"q_rotated": q.tolist()}}  # fmt: skip
    data = post_json(server, "attention", body)
    assert data["comparison"][0]["diagnosis"]["alternatives"] == [["rope_missing"]]
    open_explorer(page, server)
    text, also, codes = page.evaluate(PANEL, data)
    assert "decode_position_offset" in text
    assert also == "Reproduced as closely by: rope_missing" and codes == ["rope_missing"]
