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

A headline monitor's value in a report's tables (`headline_cells`: the
terminal's `--wide`, Markdown and HTML) is one number in every format: the
series' newest judgement where the summary has one, else the newest value
over the run (a monitor judged against a ceiling, such as the output logit
scale, has no series); beside it its baseline where it has one, and its own
limit where it is judged against a ceiling ("ceiling 9"), never another
monitor's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from ckptscan.monitors import registry
from ckptscan.monitors.spec import MonitorSpec
from ckptscan.schema.results import Finding, LayerResult, LayerSummary

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


def ceiling(monitor: str, thresholds: dict[str, Any], hidden_size: int | None) -> float | None:
    """The ceiling a report judges `monitor` against (`MonitorSpec.ceiling`, in its `thresholds` as the JSON
    report carries them), None for a monitor judged otherwise. A ceiling that grows with the width (the
    attention logit scale's) is the one detection applied: its family's section at the model's width
    (`at_width`), made from the report's thresholds."""
    spec = registry.find(monitor)
    key = spec.ceiling if spec is not None else None
    value = thresholds.get(key) if key is not None else None
    if key is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    family = registry.finding_spec(spec.family) if spec is not None else None
    section = family.thresholds if family is not None else None
    if section is not None and hasattr(section, "at_width") and hidden_size:
        names = [f.name for f in dataclasses.fields(section)]
        # A report from before the section had all its fields (before the width scaling) keeps its ceiling as is.
        if all(isinstance(thresholds.get(name), (int, float)) for name in names):
            try:
                return float(getattr(section(**{name: thresholds[name] for name in names}).at_width(hidden_size), key))
            except (ArithmeticError, TypeError, ValueError):  # a width no model has: the ceiling as it is
                pass
    return float(value)


def headline_values(summary: LayerSummary, monitor: MonitorSpec, values: list[float | None],
                    thresholds: dict[str, Any], hidden_size: int | None
                    ) -> tuple[float | None, float | None, float | None]:
    """A layer's (value now, baseline, ceiling) of a headline monitor, `values`
    its series over the run's pairs: the summary's newest judgement where it
    has one, else the newest value of the series."""
    now = summary.current.get(monitor.name)
    if now is None:
        now = next((v for v in reversed(values) if v is not None), None)
    return now, summary.baseline.get(monitor.name), ceiling(monitor.name, thresholds, hidden_size)


def reference_text(baseline: float | None, limit: float | None) -> str:
    """What a headline value is read against: its baseline ('0.482'), its
    ceiling ('ceiling 9'), both, or '–'."""
    parts = ([] if baseline is None else [_number(baseline)]) + ([] if limit is None else [f"ceiling {limit:.3g}"])
    return "; ".join(parts) or "–"


def headline_cells(summary: LayerSummary, monitor: MonitorSpec, values: list[float | None],
                   thresholds: dict[str, Any], hidden_size: int | None) -> tuple[str, str]:
    """The two cells beside a headline monitor's sparkline in every format:
    its value now, and its baseline or its own ceiling (`reference_text`;
    '–' for a layer without the monitor: the output family's values are the
    last layer's)."""
    now, baseline, limit = headline_values(summary, monitor, values, thresholds, hidden_size)
    if now is None:
        return "–", reference_text(baseline, None)
    return _number(now), reference_text(baseline, limit)
