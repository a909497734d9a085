"""The pipeline's tables without HTTP: the variants and weight forms as rows (each request's
meaning read once, by the rules), the order of the steps written once (the outputs table's),
and the door the HTTP room uses (service.trace: admit, then run). Expected numbers are built
here with NumPy from their definitions, never with the service's functions."""

from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from service import trace
from service.config import Settings
from service.core.diagnosis.stages import ORDER
from service.core.latent import LatentDims
from service.trace import outputs, rules
from service.trace.rows import variants as variant_rows
from service.trace.rows import weight_forms
from service.trace.shapes import Shapes
from service.wire.errors import FieldError, LimitError
from service.wire.schemas.requests import AttentionRequest, MaskRequest, MultiheadRequest

Array = npt.NDArray[np.float64]
RNG = np.random.default_rng(11)
X = RNG.normal(size=(3, 4))
W_Q, W_K, W_V, W_O = (RNG.normal(size=(4, 4)) for _ in range(4))
EVERY_VARIANT: dict[str, Any] = {
    "qk_norm": True,
    "rope": True,
    "softcap": 5.0,
    "alibi": True,
    "sinks": [0.5, -0.5],
}


def no_check() -> None:
    """The client never leaves here."""


def softmax(s: Array) -> Array:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    out: Array = e / e.sum(axis=-1, keepdims=True)
    return out


# ------------------------------------------------------------------------------ variants

BARE = Shapes(endpoint="multihead", batch=None, seq_len=3, ctx_len=3, d_model=4, d_k=2, d_v=2)


@pytest.mark.parametrize("variant", variant_rows.VARIANTS, ids=lambda v: v.field)
def test_a_variant_turns_on_exactly_the_outputs_its_row_names(
    variant: variant_rows.Variant,
) -> None:
    """The outputs table shows a variant's rows (per head, or of the block like the gate's)
    when, and only when, the variant is on."""
    latent = LatentDims(4, 4, 2, 2, 2) if variant.field == "mla" else None  # mla's sizes
    on = Shapes(**{**BARE.__dict__, "on": frozenset({variant.field}), "latent": latent})
    rows = [o for o in outputs.OUTPUTS if "multihead" in o.endpoints]
    shown = {o.name for o in rows if o.present(on)}
    bare = {o.name for o in rows if o.present(BARE)}
    assert shown - bare == set(variant.outputs)


def test_the_rules_record_the_variants_a_request_turns_on_in_the_tables_order() -> None:
    req = MultiheadRequest.model_validate(
        {"x": X, "num_heads": 2, "w_q": W_Q, "w_k": W_K, "w_v": W_V, **EVERY_VARIANT}
    )
    shapes = rules.multihead_shapes(req)
    assert shapes.on == {"qk_norm", "rope", "softcap", "position_bias", "alibi", "sinks"}
    alone = MultiheadRequest.model_validate(
        {"x": X, "num_heads": 2, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "relative_bias": {"table": [[0.0, 1.0]] * 4}}
    )  # fmt: skip
    assert rules.multihead_shapes(alone).on == {"position_bias"}


def test_a_variants_check_names_its_field() -> None:
    req = MultiheadRequest.model_validate(
        {"x": X, "num_heads": 2, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "sinks": [0.5, 0.5, 0.5]}
    )
    with pytest.raises(FieldError) as err:
        rules.multihead_shapes(req)
    assert err.value.field == "sinks" and "3 entries but there are 2 heads" in str(err.value)


def test_positions_need_a_variant_that_reads_them() -> None:
    base = {"x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "positions": [4, 5, 6]}
    with pytest.raises(FieldError) as err:
        rules.attention_shapes(AttentionRequest.model_validate({**base, "softcap": 2.0}))
    assert err.value.field == "positions"
    assert rules.attention_shapes(AttentionRequest.model_validate({**base, "alibi": True})).on


def test_the_plan_gives_the_engine_each_variants_settings() -> None:
    """softcap and sinks from the table's rows: the weights are those of the definitions."""
    req = AttentionRequest.model_validate(
        {"x": X, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "softcap": 0.5, "sinks": 0.25}
    )
    body = trace.run(trace.admit(req, "attention", Settings()), no_check)
    s = (X @ W_Q) @ (X @ W_K).T / 2.0  # d_k = 4
    capped = 0.5 * np.tanh(s / 0.5)
    m = np.maximum(capped.max(axis=-1, keepdims=True), 0.25)
    e = np.exp(capped - m)
    weights = e / (e.sum(axis=-1, keepdims=True) + np.exp(0.25 - m))
    np.testing.assert_allclose(body["capped_scores"], capped, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(body["weights"], weights, rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------------- weight forms

FORMS: list[tuple[str, dict[str, Any]]] = [
    ("combined", {"w_q": W_Q, "w_k": W_K, "w_v": W_V}),
    ("in_proj", {"in_proj_weight": np.concatenate([W_Q.T, W_K.T, W_V.T])}),
    ("per_head", {"heads": [{"w_q": W_Q[:, c : c + 2], "w_k": W_K[:, c : c + 2], "w_v": W_V[:, c : c + 2]} for c in (0, 2)]}),
    ("state_dict", {"q_proj.weight": W_Q.T, "k_proj.weight": W_K.T, "v_proj.weight": W_V.T}),
]  # fmt: skip


@pytest.mark.parametrize(("form", "fields"), FORMS, ids=[f for f, _ in FORMS])
def test_every_weight_form_is_decided_once_and_gives_the_same_heads(
    form: str, fields: dict[str, Any]
) -> None:
    """The same projections in each form: the rules record the form, the plan converts it
    with that row, and the heads are those of X W split into column blocks."""
    req = MultiheadRequest.model_validate({"x": X, "num_heads": 2, **fields})
    admitted = trace.admit(req, "multihead", Settings())
    assert admitted.shapes.form == form == weight_forms.weight_form(req).name
    body = trace.run(admitted, no_check)
    for i, c in enumerate((0, 2)):
        q, k, v = X @ W_Q[:, c : c + 2], X @ W_K[:, c : c + 2], X @ W_V[:, c : c + 2]
        w = softmax(q @ k.T / np.sqrt(2))
        np.testing.assert_allclose(body["heads"][i]["weights"], w, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(body["heads"][i]["output"], w @ v, rtol=1e-12, atol=1e-14)


def test_two_weight_forms_together_are_refused_naming_both() -> None:
    req = MultiheadRequest.model_validate(
        {"x": X, "num_heads": 2, "w_q": W_Q, "in_proj_weight": np.zeros((12, 4))}
    )
    with pytest.raises(FieldError) as err:
        rules.multihead_shapes(req)
    assert err.value.field == "in_proj_weight"
    assert "found w_q/w_k/w_v and in_proj_weight" in str(err.value)


# ------------------------------------------------------------------- the order of the steps


def test_the_chain_of_scores_is_read_from_the_table() -> None:
    assert outputs.CHAIN == ("scaled_scores", "capped_scores", "biased_scores", "masked_scores")


def test_the_engines_recomputation_runs_in_the_tables_order() -> None:
    """The diagnosis recomputes the steps (service.core.diagnosis.recompute.ORDER) in the order the
    outputs table gives them; the mask's arrays come with the mask."""
    names = [n for n in ORDER if n not in ("padded_queries", "block_output")]
    rows = [outputs.row("multihead", n, per_head=n not in ("mask", "additive_mask")) for n in names]
    positions = [outputs.position(r) for r in rows]
    ties = {("weights", "sink_weights")}  # one stage computes both
    for (a, pa), (b, pb) in pairwise(zip(names, positions, strict=True)):
        assert pa < pb or (a, b) in ties, f"{a} comes after {b} in the outputs table"


def _step_names(body: dict[str, Any]) -> list[str]:
    return [s["name"] for s in body["steps"] if not s["name"].startswith("generate ")]


def test_the_steps_of_every_variant_and_a_mask_come_in_the_tables_order() -> None:
    req = MaskRequest.model_validate(
        {"x": X, "seed": 0, **EVERY_VARIANT, "sinks": 0.5, "mask": {"type": "causal"}}
    )
    body = trace.run(trace.admit(req, "mask", Settings()), no_check)
    assert _step_names(body) == [
        "q", "k", "v", "q_normed", "k_normed", "q_rotated", "k_rotated", "scores",
        "scaled_scores", "capped_scores", "position_bias", "biased_scores", "masked_scores",
        "sink_weights", "weights", "output",
    ]  # fmt: skip
    formulas = {s["name"]: s["formula"] for s in body["steps"]}
    assert formulas["scores"].startswith("Q_r K_r")  # the queries as rotated
    assert formulas["biased_scores"] == "capped_scores + position_bias"
    assert formulas["masked_scores"].startswith("biased_scores + M")
    assert "s = masked_scores" in formulas["sink_weights"]


def test_the_multihead_steps_put_the_block_around_the_heads() -> None:
    req = MultiheadRequest.model_validate(
        {"x": X, "num_heads": 2, "w_q": W_Q, "w_k": W_K, "w_v": W_V, "w_o": W_O,
         "positional_encoding": "sinusoidal", "residual": True, "layer_norm": True}
    )  # fmt: skip
    body = trace.run(trace.admit(req, "multihead", Settings()), no_check)
    assert _step_names(body) == [
        "x_in", "q", "k", "v", "scores", "scaled_scores", "weights", "output",
        "average_weights", "concat", "projected", "residual", "layer_norm",
    ]  # fmt: skip


def test_the_comparison_runs_in_the_order_of_the_steps() -> None:
    """The caller's arrays are compared step by step whatever order they are given in; the
    mask comes before the masked scores."""
    req = MaskRequest.model_validate(
        {"q": X, "k": X, "v": X, "mask": {"type": "causal"},
         "expected": {"output": X, "masked_scores": np.zeros((3, 3)),
                      "mask": np.tril(np.ones((3, 3), dtype=bool)), "q": X}}
    )  # fmt: skip
    body = trace.run(trace.admit(req, "mask", Settings()), no_check)
    assert [row["name"] for row in body["comparison"]] == ["q", "mask", "masked_scores", "output"]
    assert body["first_mismatch"] == "masked_scores"


# ---------------------------------------------------------------------------------- door


def test_admit_counts_the_numbers_and_refuses_over_the_limits() -> None:
    req = AttentionRequest.model_validate({"q": X, "k": X, "v": X})
    admitted = trace.admit(req, "attention", Settings())
    assert admitted.numbers == sum(outputs.sizes(admitted.shapes).values())
    with pytest.raises(LimitError):
        trace.admit(req, "attention", Settings(max_result_numbers=10))


def test_each_endpoint_is_declared_once_and_documented_from_its_row() -> None:
    """The routes FastAPI documents are made from trace.ENDPOINTS, one per row; every
    endpoint that computes (those and POST /model) is answered by the one path."""
    from service.http.doors import DOORS
    from service.http.routes import DIRECT, router

    documented = {getattr(r, "path", ""): r for r in router.routes}
    assert set(documented) == {f"/{name}" for name in trace.ENDPOINTS}
    assert set(DIRECT) == set(documented) | {"/model"} == {f"/{name}" for name in DOORS}
    for name, e in trace.ENDPOINTS.items():
        route: Any = documented[f"/{name}"]
        assert route.description == e.description and route.response_model is e.response
