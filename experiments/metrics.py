"""Compute a corpus run's checkpoint metrics once: RUN/metrics.json.

    python -m experiments.metrics corpus/RUN
    python -m experiments.metrics --view-of corpus/SOURCE --stride 4 corpus/VIEW

A view is another run's every `stride`-th checkpoint (the same training seen
through checkpoints `stride` times further apart): VIEW/metrics.json from
SOURCE's checkpoints, and links to SOURCE's run.json and train_log.jsonl.

The file is ckptscan's own trend report (`ckptscan.scan_run` with the run's
probe, when it has one, and its train_log.jsonl): every pair's monitors, plus
the findings of the rules of the ckptscan that computed it. Evaluation and
calibration rebuild the report from it and judge it again with the thresholds
under test (`ckptscan.detection.rules.assess_report`, the same call scan_run
ends with), so a threshold sweep costs seconds instead of a rescan.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ckptscan import scan_run
from ckptscan.document.writing import write_json
from ckptscan.scan import ScanOptions


def compute(run_dir: Path, source: Path | None = None, stride: int = 1) -> None:
    # One thread: the corpus trains and scans several runs side by side. The
    # run's own probe and train_log.jsonl are found as `ckptscan trend` finds
    # them; no config file: the default thresholds.
    if source is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in ("run.json", "train_log.jsonl"):
            link = run_dir / name
            if not link.exists():
                link.symlink_to(os.path.relpath(source / name, run_dir))
    report = scan_run(source or run_dir, ScanOptions(workers=1, threads=1), config=None, stride=stride)
    write_json(report, run_dir / "metrics.json")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--view-of", type=Path, help="compute the metrics of this run's checkpoints (one RUN only)")
    p.add_argument("--stride", type=int, default=1, help="every stride-th checkpoint")
    args = p.parse_args()
    for run in args.runs:
        compute(run, args.view_of, args.stride)
