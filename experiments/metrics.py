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

import torch

from ckptscan.probe import load_probe
from ckptscan.report.json import write_json
from ckptscan.scan import ScanOptions
from ckptscan.trend import TrendOptions, scan_run


def compute(run_dir: Path) -> None:
    probe_path = run_dir / "probe.safetensors"
    # One thread: the corpus trains and scans several runs side by side.
    torch.set_num_threads(1)
    options = ScanOptions(probe=load_probe(probe_path) if probe_path.exists() else None, workers=1)
    report = scan_run(run_dir, options, TrendOptions(loss_log=run_dir / "train_log.jsonl"))
    write_json(report, run_dir / "metrics.json")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        compute(Path(arg))
