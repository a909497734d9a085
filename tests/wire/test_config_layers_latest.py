"""The families of tests/wire/test_config_layers.py against transformers' newest release, as
well as against the suite's pinned 5.23: every entry of its ``CASES`` (the service given only
``x``, the state dict and ``config`` + ``layer``, to 1e-12 of the release's own attention class
in float64) and every verified family's stock ``AutoConfig.for_model(t).to_dict()`` read with
each key judged, as that release writes it.

The release (the Makefile's ``TRANSFORMERS_LATEST``) lives in its own folder of the venv,
``<venv>/transformers-latest``, which ``make test`` installs (``--no-deps``, with the one
dependency the venv lacks). Its test module runs in a subprocess, ``python -m pytest
tests/wire/test_config_layers.py``, with that folder first on ``sys.path``: the builders, the
service and the comparison are the module's own, unchanged, and the release stays out of this
process, which keeps 5.23. The subprocess runs once per session (about 10 s on 2 cores) and
each case's outcome is read from its JUnit XML, so each family passes or fails here under its
own id. Without the folder the tests skip, saying that ``make test`` installs it (under
``REQUIRE_TORCH``, as CI sets it, they fail).
"""

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.wire.test_config_layers import CASES, VERIFIED_TYPES

ROOT = Path(__file__).resolve().parents[2]
PINNED = re.search(r"^TRANSFORMERS_LATEST\s*:=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)
assert PINNED, "the Makefile pins transformers' latest release as TRANSFORMERS_LATEST"
VERSION = PINNED.group(1)
FOLDER = Path(sys.prefix) / "transformers-latest"
MODULE = "tests/wire/test_config_layers.py"
# the subprocess says which transformers it imported, then runs pytest on the module
RUN = (
    "import sys, pytest, transformers; "
    "print('imported', transformers.__version__, transformers.__file__, flush=True); "
    "sys.exit(pytest.main(sys.argv[1:]))"
)


@dataclass(frozen=True)
class Run:
    """What the subprocess printed and each test's outcome: "passed", or the failure's or
    skip's message."""

    output: str
    outcomes: dict[str, str]


def _installed() -> str | None:
    """The version in the folder, or None."""
    found = [d.version for d in metadata.distributions(path=[str(FOLDER)])
             if d.metadata["Name"] == "transformers"]  # fmt: skip
    return found[0] if found else None


def _require_the_release() -> None:
    """A skip, naming what installs it, when the folder lacks the pinned release (a failure
    under REQUIRE_TORCH)."""
    have = _installed()
    if have == VERSION:
        return
    why = (
        f"transformers {VERSION} is not installed in {FOLDER} (found: {have}): "
        "`make test` installs it"
    )
    if os.environ.get("REQUIRE_TORCH"):
        pytest.fail(f"{why}, and REQUIRE_TORCH is set", pytrace=False)
    pytest.skip(why)


def _outcomes(junit: Path) -> dict[str, str]:
    """Each test case's outcome from pytest's JUnit XML, keyed by its name with its id."""
    outcomes: dict[str, str] = {}
    for case in ET.parse(junit).iter("testcase"):
        problems = [c for c in case if c.tag in ("failure", "error", "skipped")]
        outcomes[case.attrib["name"]] = (
            "\n".join(f"{p.tag}: {p.attrib.get('message', '')}\n{p.text or ''}" for p in problems)
            or "passed"
        )
    return outcomes


@pytest.fixture(scope="module")
def latest(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """tests/wire/test_config_layers.py run once in a subprocess on the latest release."""
    _require_the_release()
    junit = tmp_path_factory.mktemp("latest") / "junit.xml"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FOLDER), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", RUN, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", MODULE],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert junit.exists(), f"the subprocess wrote no results:\n{output[-4000:]}"
    return Run(output, _outcomes(junit))


@pytest.mark.torch
def test_the_subprocess_imports_the_latest_release_with_its_dependencies_met(
    latest: Run,
) -> None:
    imported = re.search(r"^imported (\S+) (\S+)$", latest.output, re.M)
    assert imported, latest.output[-4000:]
    assert imported.group(1) == VERSION
    assert Path(imported.group(2)).is_relative_to(FOLDER)
    # every dependency it declares (beyond extras) is met by the folder or the venv
    dist = next(d for d in metadata.distributions(path=[str(FOLDER)])
                if d.metadata["Name"] == "transformers")  # fmt: skip
    unmet = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        found = [d.version for d in metadata.distributions(name=req.name,
                                                           path=[str(FOLDER), *sys.path])]  # fmt: skip
        if not found or not req.specifier.contains(found[0], prereleases=True):
            unmet.append(f"{req} (found {found[0] if found else 'none'})")
    assert not unmet, f"transformers {VERSION}'s dependencies not met: {unmet}"


def _passed(latest: Run, name: str) -> None:
    """The subprocess's test ``name`` passed; else its failure, as the subprocess reported it."""
    if name not in latest.outcomes:
        pytest.fail(f"{name} did not run on {VERSION}:\n{latest.output[-4000:]}", pytrace=False)
    if latest.outcomes[name] != "passed":
        pytest.fail(f"on transformers {VERSION}, {latest.outcomes[name]}", pytrace=False)


@pytest.mark.torch
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_each_family_equals_the_latest_release(latest: Run, case: str) -> None:
    name = f"test_service_with_config_equals_the_transformers_layer[{case}]"
    _passed(latest, name)


@pytest.mark.torch
@pytest.mark.parametrize("model_type", VERIFIED_TYPES)
def test_each_stock_config_of_the_latest_release_is_judged(latest: Run, model_type: str) -> None:
    name = f"test_a_stock_config_of_each_verified_family_is_read_and_each_key_judged[{model_type}]"
    _passed(latest, name)
