"""The findings of one layer of one pair, rule by rule.

- numeric: a non-finite value in a monitored tensor is always an alert.
- ceiling, floor and a family's pair rule: each family's absolute rules
  (`FamilySpec.ceilings`, `.floors`, `.pair_rule`: a logit scale over its
  ceiling, a normalised Δ2 entropy, router ε or routing entropy under a
  hard floor), alerts whatever the history.
- series: the verdicts of the layer's (monitor) series at this pair
  (`detection/series.py`) as findings, with the corroboration rule.
- cross_layer: for a single pair (`diff`), or before a run has a baseline, a
  layer far below the model's other layers in a monitor that sets
  `Judging.cross_layer` (the normalised Δ2 entropy).
"""

from __future__ import annotations

from ckptscan.detection.catalog import JudgedMonitor, departure_finding, judged_by_name
from ckptscan.detection.series import Point, robust_center_scale
from ckptscan.detection.thresholds import Thresholds
from ckptscan.monitors import registry
from ckptscan.monitors.spec import MonitorSpec
from ckptscan.schema.results import Finding, LayerResult, PairResult, SeriesPoint, worst


def numeric_findings(layer: LayerResult) -> list[Finding]:
    """A non-finite value in a monitored tensor: always an alert."""
    return [
        Finding(
            monitor="nonfinite",
            family=registry.NUMERIC,
            severity="alert",
            value=float(count),
            message=f"{count} non-finite value(s) in {role}",
            rule="nonfinite",
        )
        for role, count in sorted(layer.nonfinite.items())
    ]


def ceiling_findings(layer: LayerResult, t: Thresholds) -> list[Finding]:
    """Every family's absolute rules judged from the first pair (`FamilySpec.ceilings`), in
    registry order: a bound on what the newer checkpoint can do needs no warm-up and no
    baseline (a run saturating from its first checkpoints has no healthy history to depart from)."""
    return [f for family in registry.families() if family.ceilings is not None
            for f in family.ceilings(layer, t.section(family.name))]


def floor_findings(layer: LayerResult, t: Thresholds) -> list[Finding]:
    """Every family's hard floors (`FamilySpec.floors`), in registry order: alerts whatever the history."""
    return [f for family in registry.families() if family.floors is not None
            for f in family.floors(layer, t.section(family.name))]


def family_pair_findings(pair: PairResult, t: Thresholds) -> None:
    """Every family's rules on a whole pair (`FamilySpec.pair_rule`), in registry order."""
    for family in registry.families():
        if family.pair_rule is not None:
            family.pair_rule(pair, t.section(family.name))


def point_findings(points: dict[str, Point], onsets: dict[str, int | None], t: Thresholds) -> list[Finding]:
    """Findings of one layer at one pair, from its series' verdicts (by
    monitor) and the newer step where each verdict's departure began; a
    monitor that may not alert alone needs a specific monitor of its family
    at ≥ warn on the same pair."""
    by_name = judged_by_name()
    elevated = {
        by_name[name].family
        for name, point in points.items()
        if by_name[name].alone == "alert" and point.state in ("warn", "alert")
    }
    findings = []
    for name, point in points.items():
        if point.state not in ("warn", "alert"):
            continue
        monitor = by_name[name]
        severity = point.state
        corroborated = monitor.alone == "alert" or monitor.family in elevated
        if severity == "alert" and not corroborated:
            severity = "warn"
        findings.append(_series_finding(monitor, point, severity, onsets[name], t))
    return findings


def judgement(point: Point, onset: int | None) -> SeriesPoint:
    """A series point as the report keeps it; `onset`: the newer step where its departure began."""
    return SeriesPoint(point.state, point.value, point.expected, point.warn_at, point.alert_at, point.rule,
                       point.excess, onset, point.cusum)


def _series_finding(monitor: JudgedMonitor, point: Point, severity: str, onset: int | None, t: Thresholds) -> Finding:
    if point.rule == "cusum":
        return _cusum_finding(monitor, point, severity, onset, t)
    below = point.warn_at is not None and point.expected is not None and point.warn_at < point.expected
    side = "below" if below else "above"
    what = {"trend": "its recent healthy trend", "level": "its post-warm-up level",
            "reference": "the reference run"}[point.rule or "trend"]
    since = f" since step {onset}" if onset is not None else ""
    capped = " (not corroborated by a specific monitor: warn only)" if severity == "warn" and point.state == "alert" \
        else ""
    return departure_finding(
        monitor, point, severity, point.rule,
        f"{monitor.label} {point.value:.3g} is {point.excess:.1f} robust σ {side} {what} "
        f"({point.expected:.3g}){since}{capped}",
        point.alert_at if severity == "alert" else point.warn_at, point.excess, onset)


def _cusum_finding(monitor: JudgedMonitor, point: Point, severity: str, onset: int | None, t: Thresholds) -> Finding:
    """A finding of the sequential rule: `score` is the CUSUM statistic and
    `threshold` the level it reached (both in accumulated robust sigmas)."""
    threshold = t.cusum_alert if point.state == "alert" else t.cusum_warn
    capped = " (not corroborated by a specific monitor: warn only)" if severity == "warn" and point.state == "alert" \
        else ""
    return departure_finding(
        monitor, point, severity, "cusum",
        f"{monitor.label} {point.value:.3g}: CUSUM of its departures from the healthy baseline "
        f"({point.expected:.3g}) is {point.cusum:.1f} (≥ {threshold:g}; drift {t.cusum_drift:g} σ per pair)"
        f"{f' since step {onset}' if onset is not None else ''}{capped}",
        threshold, point.cusum, onset)


def cross_layer_findings(pair: PairResult, t: Thresholds) -> None:
    """Flag layers whose value of a cross-layer monitor (`Judging.cross_layer`:
    the normalised Δ2 entropy) sits far beyond the other layers' toward its
    alarm side."""
    for monitor in _cross_layer_monitors():
        values = _by_layer(pair, monitor)
        if len(values) < t.cross_layer_min_layers:
            continue
        toward = -1.0 if monitor.bad == "low" else 1.0
        for layer in pair.layers:
            if layer.layer not in values:
                continue
            others = [v for k, v in values.items() if k != layer.layer]
            center, scale = robust_center_scale(others, t.cross_layer_min_scale)
            excess = toward * (values[layer.layer] - center) / scale
            severity = "alert" if excess >= t.cross_layer_z_alert else "warn" if excess >= t.cross_layer_z_warn \
                else None
            if severity:
                z = t.cross_layer_z_alert if severity == "alert" else t.cross_layer_z_warn
                layer.findings.append(Finding(
                    monitor.name, monitor.family, severity, values[layer.layer],
                    f"{monitor.said} {values[layer.layer]:.3f} is {excess:.1f} robust σ "
                    f"{'below' if toward < 0 else 'above'} the other layers' median {center:.3f}",
                    baseline=center,
                    threshold=center + toward * z * scale,
                    rule="cross_layer",
                    score=excess,
                ))


def cross_layer_applies(pair: PairResult, t: Thresholds) -> bool:
    """Whether the pair has the layers the cross-layer rule needs to judge them against each other."""
    return any(len(_by_layer(pair, m)) >= t.cross_layer_min_layers for m in _cross_layer_monitors())


def _cross_layer_monitors() -> tuple[MonitorSpec, ...]:
    return tuple(m for m in registry.judged() if m.judging is not None and m.judging.cross_layer)


def _by_layer(pair: PairResult, monitor: MonitorSpec) -> dict[int, float]:
    return {layer.layer: value for layer in pair.layers if (value := monitor.read(layer)) is not None}


def layer_status(layer: LayerResult) -> str:
    status = worst([f.severity for f in layer.findings if f.severity in ("warn", "alert")])
    if status == "ok" and _unchanged(layer):
        return "unchanged"
    return status


def _unchanged(layer: LayerResult) -> bool:
    parts = [p for p in (layer.attention, layer.router) if p is not None]
    return bool(parts) and all(p.unchanged for p in parts)
