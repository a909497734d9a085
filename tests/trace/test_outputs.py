"""The outputs table against real answers: every output it sizes holds exactly that many numbers,
every output it says is present is returned, and `include` accepts exactly its names."""

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.trace import outputs
from service.trace.rules import attention_shapes, multihead_shapes
from service.trace.shapes import Shapes
from service.wire import examples as ex
from service.wire.errors import FieldError
from service.wire.fold import folded
from service.wire.schemas.requests import AttentionRequest, MaskRequest, MultiheadRequest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GOLDEN = [
    case
    for file in ("golden.json", "golden_layers.json")
    for case in json.loads((FIXTURES / file).read_text())["cases"]
]
EVERY_VARIANT = {"qk_norm": True, "rope": {"rotary_dim": 2}, "softcap": 3.0, "alibi": True,
                 "mask": {"type": "causal"}}  # fmt: skip
CASES: list[tuple[str, str, dict[str, Any]]] = [
    (c["name"], c["endpoint"], c["request"]) for c in GOLDEN
] + [
    ("every_variant_batch", "/attention",
     {**ex.PADDED_BATCH, **EVERY_VARIANT, "sinks": 0.5}),
    ("every_variant_multihead", "/multihead",
     {**ex.GENERATED_MULTIHEAD, **EVERY_VARIANT, "include": None, "sinks": [0.0, 1.0]}),
    ("generated_sentence", "/attention", ex.GENERATED_SENTENCE),
    ("padded_batch", "/mask", ex.PADDED_BATCH),
    ("generated_multihead_all", "/multihead", {**ex.GENERATED_MULTIHEAD, "include": None}),
    ("gqa_generated_batch_free", "/multihead",
     {"seed": 3, "seq_len": 3, "d_model": 6, "num_heads": 4, "num_kv_heads": 2, "d_k": 2,
      "d_v": 3, "residual": False, "mask": {"type": "window", "left": 1}}),
]  # fmt: skip


def _shapes(endpoint: str, body: dict[str, Any]) -> Shapes:
    if endpoint == "/multihead":
        return multihead_shapes(folded(MultiheadRequest.model_validate(body)))  # as admit does
    model = MaskRequest if endpoint == "/mask" else AttentionRequest
    return attention_shapes(model.model_validate(body))


def _leaves(value: Any) -> int:
    """How many numbers (or booleans, or nulls for −∞) a JSON value holds."""
    if isinstance(value, list):
        return sum(_leaves(v) for v in value)
    if isinstance(value, dict):
        return sum(_leaves(v) for v in value.values())
    return 1


@pytest.mark.parametrize(("endpoint", "body"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_output_holds_the_numbers_the_table_counts(
    client: TestClient, endpoint: str, body: dict[str, Any]
) -> None:
    shapes = _shapes(endpoint, body)
    answer = client.post(endpoint, json={**body, "include": None, "decimals": None}).json()
    counted = outputs.sizes(shapes)
    for name, numbers in counted.items():
        assert name in answer, f"the table says {name} is present"
        if name == "summary":  # three numbers a row: top_key_index, top_weight, entropy_bits
            rows = (
                answer[name] if shapes.batch is None else [r for item in answer[name] for r in item]
            )
            assert 3 * len(rows) == numbers
        elif numbers:
            assert _leaves(answer[name]) == numbers, name
    arrays = {k for k, v in answer.items() if isinstance(v, list) and k not in counted}
    assert arrays <= {"tokens", "context_tokens", "steps"}, (
        f"returned but not in the table: {arrays}"
    )


@pytest.mark.parametrize("endpoint", ["/attention", "/multihead"])
def test_include_accepts_exactly_the_tables_names(client: TestClient, endpoint: str) -> None:
    body = ex.TWO_HEADS_FULL_BLOCK if endpoint == "/multihead" else ex.I_AM_BATMAN
    names = outputs.includable("multihead" if endpoint == "/multihead" else "attention")
    for name in names:
        assert client.post(endpoint, json={**body, "include": [name]}).status_code == 200, name
    always = {o.name for o in outputs.OUTPUTS if o.always}
    for name in always:
        assert client.post(endpoint, json={**body, "include": [name]}).status_code == 422, name


@pytest.mark.parametrize("endpoint", ["attention", "multihead"])
def test_a_misspelt_include_gets_a_short_422_with_the_closest_name(endpoint: str) -> None:
    with pytest.raises(FieldError) as e:
        outputs.check_include(endpoint, ["wieghts"])  # type: ignore[arg-type]
    message = e.value.items[0].message
    assert 'did you mean "weights"' in message and len(message) < 400, message
