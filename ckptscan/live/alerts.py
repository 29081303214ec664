"""What live mode acts on: an `Alert` (one alert finding at a monitored
step, what a user `on_alert` callable receives) and `alerts_of`, the alerts
of a report's newest interval."""

from __future__ import annotations

from dataclasses import dataclass

from ckptscan.detection.rules import Thresholds
from ckptscan.monitors import registry
from ckptscan.schema.results import Finding, ScanReport


@dataclass(frozen=True)
class Alert:
    """One alert finding at a monitored step: what a user `on_alert` callable receives."""

    step: int  # the newer step of the interval it was raised on
    layer: int
    finding: Finding


def alerts_of(report: ScanReport, thresholds: Thresholds) -> list[Alert]:
    """The alerts of a report's newest interval that live mode acts on."""
    newest = report.pairs[-1]
    t = thresholds
    # A lone first interval is judged like `diff`; in a longer series it is warm-up (see the module docstring).
    provisional = len(report.pairs) == 1 and (t.warmup_pairs > 0 or (newest.from_step or 0) < t.warmup_steps)
    step = newest.to_step if newest.to_step is not None else -1  # a live pair always has its steps
    return [Alert(step, layer.layer, f) for layer in newest.layers for f in layer.findings
            if f.severity == "alert" and (f.family == registry.NUMERIC or not provisional)]
