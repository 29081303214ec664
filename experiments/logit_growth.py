"""The healthy maxima that calibrate the reference-free logit-growth rule.

ckptscan/detection/growth.py warns when a layer's QK logit bound has grown
to ≥ `logit_growth_warn` times its value at the first judged pair, and
alerts at ≥ `logit_growth_alert` on `consecutive` pairs in a row. A healthy
run raises them exactly when its largest growth (warn), or its largest
growth held on `consecutive` pairs in a row (alert), crosses the factor:
these per-run maxima are what experiments/calibrate.py fits.
"""

from __future__ import annotations

import math
from pathlib import Path

from ckptscan.detection.rules import Thresholds, first_judged_pair
from experiments.judge import effective_thresholds, load_report


def growth_maxima(runs: list[Path], thresholds: Thresholds | None = None) -> dict[str, list[float]]:
    """Per run: {"logit growth": largest growth, "logit growth held": largest
    growth reached on `consecutive` pairs in a row}, over layers and judged pairs."""
    base_thresholds = thresholds or Thresholds()
    out: dict[str, list[float]] = {"logit growth": [], "logit growth held": []}
    for run in runs:
        report = load_report(run)
        t = effective_thresholds(report, base_thresholds)
        start = first_judged_pair(report.pairs, t)
        largest, held = 1.0, 1.0
        for position in range(len(report.pairs[0].layers)):
            bounds = []
            for pair in report.pairs[start:]:
                layer = pair.layers[position] if position < len(pair.layers) else None
                bound = layer.attention.qk_logit_bound if layer is not None and layer.attention else None
                bounds.append(bound if bound is not None and math.isfinite(bound) and bound > 0 else None)
            known = [b for b in bounds if b is not None]
            if not known:
                continue
            growth = [b / known[0] if b is not None else 0.0 for b in bounds]
            largest = max(largest, *growth)
            k = t.consecutive
            held = max([held] + [min(growth[i:i + k]) for i in range(len(growth) - k + 1)])
        out["logit growth"].append(largest)
        out["logit growth held"].append(held)
    return out
