"""The figures docs/development.md gives about the suite itself hold: the
number of tests, against the suite this test runs in when it is the whole
suite (`make test`, or pytest without arguments: each xdist worker collects
it all), and the minutes `make test` takes, the same as the Makefile says
before it starts (issue 52: the page said 1,589 tests and 551 s when the
suite was 1,666 tests and 7 min 24 s)."""

from __future__ import annotations

import re

import pytest

from docs.examples import ROOT

PAGE = ROOT / "docs" / "development.md"
# How far the suite may grow or shrink before the page's figure must change.
TOLERANCE = 0.05


def page_text() -> str:
    return " ".join(PAGE.read_text().split())


def quoted_tests() -> int:
    found = re.search(r"The suite is about ([\d,]+) tests", page_text())
    assert found, "docs/development.md no longer says how many tests the suite has"
    return int(found.group(1).replace(",", ""))


def whole_suite(config: pytest.Config) -> bool:
    """Was the suite collected whole: from testpaths, nothing selected or deselected?"""
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword
            and not config.option.markexpr and not config.getoption("deselect", None)
            and not config.getoption("lf", False) and not config.getoption("stepwise", False))


def test_the_suites_size_on_the_page_is_the_suites(request):
    if not whole_suite(request.config):
        pytest.skip("only the whole suite (make test, or pytest without arguments) knows its own size")
    collected = request.session.testscollected
    quoted = quoted_tests()
    assert abs(collected - quoted) <= TOLERANCE * collected, (
        f"docs/development.md says about {quoted:,} tests, the suite has {collected:,}: "
        f"write about {round(collected, -2):,}")


def test_the_pages_minutes_are_the_makefiles():
    minutes = re.search(r"`make test` in a fresh clone on 2 cores takes about ([\d.]+) minutes", page_text())
    assert minutes, "docs/development.md no longer says how long make test takes"
    makefile = (ROOT / "Makefile").read_text()
    said = re.search(r'@echo "test: about ([\d.]+) minutes end to end', makefile)
    assert said, "the Makefile's test-start no longer says how long make test takes"
    assert minutes.group(1) == said.group(1)


def test_the_figure_is_read_from_the_page():
    assert 1_000 < quoted_tests() < 100_000
