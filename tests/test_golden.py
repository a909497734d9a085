"""The service against golden cases computed by PyTorch (scripts/make_golden.py), no torch needed."""

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import assert_close

GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "golden.json").read_text())
CASES: list[dict[str, Any]] = GOLDEN["cases"]


def test_golden_file_covers_every_kind_of_case() -> None:
    names = {c["name"] for c in CASES}
    for required in (
        "example_batman",
        "example_causal",
        "sdpa_bool_mask",
        "sdpa_additive",
        "sdpa_causal_lower_right",
        "mha_torch_packed",
        "gqa_enable_gqa",
        "block_sinusoidal_residual_layer_norm",
        "mha_out_in_combined_nonsquare",
        "mha_in_out_combined_nonsquare",
        "mha_per_head_out_in_nonsquare",
        "gqa_out_in_nonsquare",
    ):
        assert required in names


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_service_matches_torch_golden(client: TestClient, case: dict[str, Any]) -> None:
    response = client.post(case["endpoint"], json=case["request"])
    assert response.status_code == 200, response.text
    assert_close(response.json(), case["expected"])
