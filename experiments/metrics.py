"""Compute a corpus run's checkpoint metrics once: RUN/metrics.json.

    python -m experiments.metrics corpus/RUN

The file is ckptscan's own trend report (`ckptscan.scan_run` with the run's
probe, when it has one, and its train_log.jsonl): every pair's monitors, plus
the findings of the rules of the ckptscan that computed it. Evaluation and
calibration rebuild the report from it and judge it again with the thresholds
under test (`ckptscan.detection.rules.assess_report`, the same call scan_run
ends with), so a threshold sweep costs seconds instead of a rescan.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ckptscan import scan_run
from ckptscan.report.json import write_json
from ckptscan.scan import ScanOptions


def compute(run_dir: Path) -> None:
    # One thread: the corpus trains and scans several runs side by side. The
    # run's own probe and train_log.jsonl are found as `ckptscan trend` finds
    # them; no config file: the default thresholds.
    report = scan_run(run_dir, ScanOptions(workers=1, threads=1), config=None)
    write_json(report, run_dir / "metrics.json")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        compute(Path(arg))
