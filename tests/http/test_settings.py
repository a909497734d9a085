"""Settings read from the environment (service/config.py) as ``python -m service`` meets them: a
wrong value is one line on stderr naming the variable and what it takes, with exit status 2 (no
traceback); an ``ATTENTION_*`` variable that is no setting is warned about at start, naming the
closest one."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.live import start_server
from service.config import Settings, takes, unknown_variables

ROOT = Path(__file__).resolve().parents[2]


def serve(**variables: str) -> subprocess.CompletedProcess[str]:
    """``python -m service`` with ``variables`` added to the environment (it should not start)."""
    env = {**os.environ, **variables}
    return subprocess.run(
        [sys.executable, "-m", "service", "--port", "1"],  # never reached: settings come first
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_wrong_worker_count_is_one_line_naming_the_variable() -> None:
    done = serve(ATTENTION_WORKERS="two")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "ATTENTION_WORKERS='two' is not valid: it takes a whole number ≥ 1 and ≤ 64 — "
        "uvicorn worker processes"
    ]
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("variable", "value", "takes"),
    [
        ("ATTENTION_LOG_LEVEL", "loud", "one of critical, error, warning, info, debug"),
        ("ATTENTION_QUEUE_WAIT_SECONDS", "0", "a number > 0"),
        ("ATTENTION_MAX_BODY_BYTES", "10", "a whole number ≥ 1024"),
        ("ATTENTION_MEMORY_BUDGET_BYTES", "lots", "a whole number ≥ 1, or unset"),
    ],
)
def test_every_wrong_value_says_what_the_variable_takes(
    variable: str, value: str, takes: str
) -> None:
    done = serve(**{variable: value})
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"{variable}={value!r} is not valid: it takes {takes} — "), line


def test_two_wrong_values_are_two_lines() -> None:
    done = serve(ATTENTION_WORKERS="0", ATTENTION_PORT="http")
    assert done.returncode == 2
    named = sorted(line.split("=")[0] for line in done.stderr.splitlines())
    assert named == ["ATTENTION_PORT", "ATTENTION_WORKERS"]


def test_every_setting_is_described_in_words() -> None:
    for name, field in Settings.model_fields.items():
        words = takes(field)
        assert "class" not in words and "typing" not in words and "[" not in words, (name, words)


def test_a_misspelt_variable_is_warned_about_at_start_naming_the_closest() -> None:
    env = {**os.environ, "ATTENTION_MAX_SEQLEN": "64", "ATTENTION_SUBNET": "10.0.0.0/24"}
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "server.log"
        server, _ = start_server(env=env, log=log)
        try:
            lines = [json.loads(line) for line in log.read_text().splitlines() if line]
        finally:
            server.terminate()
            server.wait(timeout=30)
    warned = [line["message"] for line in lines if line["level"] == "warning"]
    assert warned == [
        "ATTENTION_MAX_SEQLEN is not a setting of the service and is ignored: did you mean "
        "ATTENTION_MAX_SEQ_LEN?"
    ]


def test_unknown_variables_ignore_other_prefixes_and_the_deployment_files_own() -> None:
    environ = {
        "ATTENTION_PORT": "1",
        "attention_workers": "2",  # settings are read whatever the case
        "ATTENTION_SERVERS": "server a:8000;",
        "ATTENTIONSPAN": "x",
        "ATTENTION_FROBNICATE": "1",
    }
    assert unknown_variables(environ) == [
        "ATTENTION_FROBNICATE is not a setting of the service and is ignored: "
        "docs/operations.md lists the settings"
    ]
