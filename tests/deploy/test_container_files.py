"""The image's exact versions (requirements.lock) satisfy the ranges pyproject.toml declares; the
compose files' settings."""

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_lock_pins_every_runtime_dependency_within_its_range() -> None:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[_canonical(name)] = version
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for spec in declared:
        req = Requirement(spec)
        name = _canonical(req.name)
        assert name in pins, f"{req.name} is a dependency but requirements.lock does not pin it"
        assert req.specifier.contains(pins[name]), (
            f"requirements.lock pins {req.name}=={pins[name]}, outside {req.specifier}"
        )


def test_the_replicas_network_subnet_is_one_setting_with_a_default() -> None:
    """A fixed subnet can clash with a network the host already has: ATTENTION_SUBNET moves it,
    and the replicas trust forwarded headers from that same subnet."""
    compose = yaml.safe_load((ROOT / "docker-compose.replicas.yml").read_text())
    setting = "${ATTENTION_SUBNET:-172.30.87.0/24}"
    assert compose["networks"]["attention"]["ipam"]["config"] == [{"subnet": setting}]
    assert compose["services"]["attention"]["environment"]["FORWARDED_ALLOW_IPS"] == setting


def test_ci_runs_the_readme_test_command_and_installs_no_python_package_itself() -> None:
    """A green CI must not hide an install step that `make test` forgets on a fresh machine."""
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.split("#")[0] for line in ci.splitlines()]
    assert any("make test" in c for c in commands)
    assert not any(re.search(r"\bpip\b.*\binstall\b", c) for c in commands)
