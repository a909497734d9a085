"""The test run's summary names the tests skipped for a missing system program (Chromium,
nginx, kubectl) and the command that enables them (tests/conftest.py)."""

import pytest

from tests.conftest import NEEDED, Program, skipped_for_programs

pytest_plugins = ["pytester"]


def test_skips_are_counted_by_the_program_their_reason_names() -> None:
    reasons = [
        "Skipped: /usr/bin/chromium is not installed (apt-get install chromium)",
        "Skipped: /usr/bin/chromium is not installed (apt-get install chromium)",
        "Skipped: nginx is not installed (apt-get install nginx)",
        "Skipped: torch is not installed",
        "Skipped: chromium crashed",
    ]
    assert skipped_for_programs(reasons) == {"chromium": 2, "nginx": 1}


def test_the_summary_says_which_tests_were_skipped_and_how_to_enable_them(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest("from tests.conftest import pytest_terminal_summary  # noqa: F401")
    pytester.makepyfile(
        """
        import pytest

        def test_needs_nginx():
            pytest.skip("nginx is not installed (apt-get install nginx)")

        def test_needs_nothing():
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*skipped: system programs not installed*",
            "1 of the replicas tests need nginx: sudo apt-get install -y nginx",
        ]
    )


NEEDS_NGINX = """
import pytest

pytestmark = pytest.mark.needs("nginx")


@pytest.fixture(scope="module")
def cluster():
    raise RuntimeError("nginx is not installed")  # as harness.replicas.Replicas does


def test_one(cluster):
    pass


def test_two(cluster):
    pass
"""


def _without_nginx(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(NEEDED, "nginx", Program(lambda: None, "REQUIRE_NGINX"))
    pytester.makeconftest(
        "from tests.conftest import pytest_configure, pytest_runtest_setup  # noqa: F401"
    )
    pytester.makepyfile(NEEDS_NGINX)


def test_a_test_needing_a_missing_program_skips_before_its_module_scoped_fixtures(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue: the replicas tests' module-scoped fixture started nginx, and failed, before a
    function-scoped check could skip them ("4 errors" on a machine without nginx)."""
    monkeypatch.delenv("REQUIRE_NGINX", raising=False)
    _without_nginx(pytester, monkeypatch)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*nginx is not installed (sudo apt-get install -y nginx)*"])


def test_with_its_require_switch_set_a_missing_program_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUIRE_NGINX", "1")
    _without_nginx(pytester, monkeypatch)
    result = pytester.runpytest()
    result.assert_outcomes(errors=2)  # failed in setup
    result.stdout.fnmatch_lines(["*nginx is not installed*REQUIRE_NGINX is set*"])
