"""What fired, in one short cell: a finding's monitor and its value against
its limit, the cell a terminal table keeps at any width (report/table.py,
report/trend_table.py, report/watch_rows.py, report/sweep_table.py).

    attention logit scale 2.15 > 2
    attention Δ2 H/ln n 0.261, CUSUM 10 ≥ 5

A series rule's limit is on its CUSUM statistic (`Finding.score`), so the
value is shown and the statistic against the limit (its baseline is in the
finding's message); a
ceiling's or a floor's limit is on the value itself. A finding with no limit
(the folders' evidence of two runs) shows its value alone.
"""

from __future__ import annotations

from typing import Iterable

from ckptscan.monitors import registry
from ckptscan.schema.results import Finding, LayerResult

# Series rules whose threshold is the CUSUM statistic's, not the value's.
CUSUM_RULES = ("cusum", "pooled_cusum")


def monitor_label(finding: Finding) -> str:
    """'attention logit scale': the family and the monitor's table label
    (its JSON name where no monitor is registered under it: a rule's own)."""
    labels = {monitor.name: monitor.label for monitor in registry.monitors()}
    label = labels.get(finding.monitor, finding.monitor)
    return label if label.startswith(finding.family) else f"{finding.family} {label}"


def _number(value: float) -> str:
    return f"{value:.3g}"


def limit_text(finding: Finding) -> str:
    """The value against its limit: '2.15 > 2', '0.261, CUSUM 10 ≥ 5', or the value alone."""
    value = "–" if finding.value is None else _number(finding.value)
    if finding.rule in CUSUM_RULES and finding.score is not None and finding.threshold is not None:
        return f"{value}, CUSUM {_number(finding.score)} ≥ {_number(finding.threshold)}"
    if finding.value is not None and finding.threshold is not None:
        side = ">" if finding.value > finding.threshold else "<" if finding.value < finding.threshold else "="
        return f"{value} {side} {_number(finding.threshold)}"
    if finding.baseline is not None:
        return f"{value} (base {_number(finding.baseline)})"
    return value


def fired_text(finding: Finding) -> str:
    """'attention logit scale 2.15 > 2'."""
    return f"{monitor_label(finding)} {limit_text(finding)}"


def deciding_finding(layer: LayerResult) -> Finding | None:
    """The finding that gave a layer of one pair its status: its first alert,
    else its first warning; None when neither fired."""
    for severity in ("alert", "warn"):
        found = next((f for f in layer.findings if f.severity == severity), None)
        if found is not None:
            return found
    return None


def first_fired(layer_by_step: Iterable[tuple[int | None, LayerResult | None]]
                ) -> tuple[int | None, Finding] | None:
    """One layer's first alert over a run's pairs (its step, the finding),
    else its first warning; None when neither fired. `layer_by_step`: the
    layer's result in each pair (None where the pair lacks it), by the pair's
    newer step, in step order."""
    first_warn: tuple[int | None, Finding] | None = None
    for step, result in layer_by_step:
        if result is None or not result.findings:
            continue
        alert = next((f for f in result.findings if f.severity == "alert"), None)
        if alert is not None:
            return step, alert
        if first_warn is None:
            warn = next((f for f in result.findings if f.severity == "warn"), None)
            if warn is not None:
                first_warn = (step, warn)
    return first_warn
