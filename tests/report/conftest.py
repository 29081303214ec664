"""Reports of real scans of small generated runs, shared by the report tests:
the collapse run scanned with and without its loss log, and a healthy run."""

import pytest

from ckptscan.cache import PairCache
from ckptscan.probe import load_probe
from ckptscan.scan import ScanOptions
from ckptscan.trend import TrendOptions, scan_run

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
    options = ScanOptions(probe=load_probe(run / "probe.safetensors"))
    # One cache: the second scan of the run reuses the first one's pairs.
    cache = PairCache(tmp_path_factory.mktemp("pair-cache"), options)
    return {
        "loss": scan_run(run, options, TrendOptions(loss_log=run / "train_log.jsonl"), cache),
        "no_loss": scan_run(run, options, TrendOptions(), cache),
        "healthy": scan_run(runs["healthy"]),
    }
