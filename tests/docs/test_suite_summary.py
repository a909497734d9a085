"""The test run's summary names the tests skipped for a missing system program (Chromium,
nginx, kubectl) and the command that enables them (tests/conftest.py)."""

import pytest

from tests.conftest import skipped_for_programs

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
