"""Reports of real scans of small generated runs, shared by the report tests:
the collapse run scanned with and without its loss log, and a healthy run."""

import pytest

from ckptscan import scan_run
from ckptscan.caches.pair_cache import PairCache

from report.runs import write_collapse_run, write_healthy_run


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch, tmp_path):
    """Commands must not append to a real CI step summary or fill the user's cache."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-runs")
    return {"collapse": write_collapse_run(root / "collapse"), "healthy": write_healthy_run(root / "healthy")}


@pytest.fixture(scope="session")
def reports(runs, tmp_path_factory):
    run = runs["collapse"]
    # One cache: the second scan of the run reuses the first one's pairs.
    cache = PairCache(tmp_path_factory.mktemp("pair-cache"))
    return {
        "loss": scan_run(run, cache=cache),  # the run's own probe and loss log
        "no_loss": scan_run(run, cache=cache, loss_log=None),
        "healthy": scan_run(runs["healthy"]),
    }
