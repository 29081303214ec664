"""Judging against a band of references, and screening them: seconds per pair.

    python bench/band_judge.py [--pairs 300] [--layers 16] [--references 3]

A synthetic run (`bench/long_run.py`'s metrics: every field a scan fills,
healthy noise, a collapse of layer 3 from the middle on) judged against a
band of `--references` healthy synthetic runs of the same shape
(`ckptscan.detection.judge.judge`), and those references screened against
each other (`detection/screening.py`: each judged against the band of the
others, as `trend --reference` does before judging). Prints one JSON line:
milliseconds per judged pair for each. Compare two versions of the code by
running this file from each checkout side by side (farm-bench --vs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from long_run import model_info, run_metrics, synthetic_pairs  # noqa: E402

from ckptscan.detection.judge import judge  # noqa: E402
from ckptscan.detection.screening import screen_references  # noqa: E402
from ckptscan.detection.thresholds import Thresholds  # noqa: E402
from ckptscan.schema.results import ScanReport, Summary  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--references", type=int, default=3)
    args = parser.parse_args()
    model = model_info(args.layers, args.heads)
    references = [ScanReport("trend", model, run_metrics(model, pairs).checkpoints, pairs,
                             Summary(status="ok", flagged_layers=[], first_alert_step={}))
                  for pairs in (synthetic_pairs(args.layers, args.heads, args.pairs, seed=1 + k)
                                for k in range(args.references))]
    metrics = run_metrics(model, synthetic_pairs(args.layers, args.heads, args.pairs, args.pairs // 2, seed=0))
    start = time.perf_counter()
    report = judge(metrics, Thresholds(), references, screen=False)
    judged = time.perf_counter() - start
    start = time.perf_counter()
    screened = screen_references(references, [None] * len(references), Thresholds())
    screening = time.perf_counter() - start
    print(json.dumps({"pairs": args.pairs, "layers": args.layers, "references": args.references,
                      "judge_ms_per_pair": round(1000 * judged / args.pairs, 2),
                      "screen_ms_per_reference_pair": round(1000 * screening / (args.pairs * args.references), 2),
                      "status": report.summary.status, "left_out": len(screened.left_out)}))


if __name__ == "__main__":
    main()
