"""The report tests' scans of small generated runs (`tests/report/conftest.py`),
shared with the tests of the format they are written in."""

from report.conftest import isolated_environment, reports, runs  # noqa: F401
