"""Schemathesis against the app's own OpenAPI, in process: every operation, generated requests
(valid and invalid), no server errors and no response that breaks its documented schema."""

import warnings
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.config import Settings
from service.http.app import create_app

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    # small limits so that generated sizes reach them (413 is documented) without using the machine up
    APP = create_app(
        Settings(
            max_seq_len=64, max_d_model=64, max_heads=8, max_batch=4, max_result_numbers=200_000
        )
    )
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)

CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    content_type_conformance,
]


@schema.parametrize()
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@pytest.mark.filterwarnings("ignore")
def test_api_survives_generated_requests(case: schemathesis.Case[Any]) -> None:
    case.call_and_validate(checks=CHECKS)
