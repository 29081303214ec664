"""The findings of one layer of one pair, rule by rule.

- numeric: a non-finite value in a monitored tensor is always an alert.
- floor: a normalised Δ2 entropy, router ε or routing entropy under a hard
  floor is an alert whatever the history.
- series: the verdicts of the layer's (monitor) series at this pair
  (`detection/series.py`) as findings, with the corroboration rule.
- cross_layer: for a single pair (`diff`), or before a run has a baseline, a
  layer far below the model's other layers.
"""

from __future__ import annotations

from ckptscan.detection.catalog import JudgedMonitor, judged_by_name
from ckptscan.detection.output import output_findings
from ckptscan.detection.series import Point, robust_center_scale
from ckptscan.detection.thresholds import Thresholds
from ckptscan.schema.results import Finding, LayerResult, PairResult, SeriesPoint, worst


def numeric_findings(layer: LayerResult) -> list[Finding]:
    findings = [
        Finding(
            monitor="nonfinite",
            family="numeric",
            severity="alert",
            value=float(count),
            message=f"{count} non-finite value(s) in {role}",
            rule="nonfinite",
        )
        for role, count in sorted(layer.nonfinite.items())
    ]
    if layer.attention is not None and layer.attention.unchanged:
        findings.append(Finding("delta2_entropy", "attention", "info", None,
                                "W_q/W_k unchanged between the checkpoints", rule="unchanged"))
    return findings


def ceiling_findings(layer: LayerResult, t: Thresholds) -> list[Finding]:
    """The attention logit scale over its ceiling: an absolute bound on what
    the newer checkpoint's attention can do, so judged from the first pair
    (no warm-up, no baseline: a run saturating from its first checkpoints
    has no healthy history to depart from); and the output family's
    ceilings (detection/output.py), absolute for the same reason."""
    att = layer.attention
    if att is None:
        return output_findings(layer, t)
    findings = []
    scale, bound = att.logit_scale, att.qk_norm_logit_bound
    if scale is not None and scale > t.logit_scale_ceiling:
        findings.append(Finding(
            "logit_scale", "attention", "alert", scale,
            f"attention logit scale {scale:.3g} above the ceiling {t.logit_scale_ceiling:.3g} for d_model "
            f"{t.logit_scale_width} or less (healthy runs stay under it): the logits grow toward a one-hot "
            "softmax (attention logit growth)",
            threshold=t.logit_scale_ceiling, rule="ceiling",
        ))
    if bound is not None and bound > t.qk_norm_logit_ceiling:
        findings.append(Finding(
            "qk_norm_logit_bound", "attention", "alert", bound,
            f"the QK-norm gains allow attention logits up to {bound:.3g}, above {t.qk_norm_logit_ceiling:g}: "
            "softmax can be one-hot despite the QK-norm",
            threshold=t.qk_norm_logit_ceiling, rule="ceiling",
        ))
    return findings + output_findings(layer, t)


def floor_findings(layer: LayerResult, t: Thresholds) -> list[Finding]:
    findings = []
    att = layer.attention
    delta2 = att.delta2_entropy_norm if att is not None else None
    if delta2 is not None and delta2 < t.delta2_entropy_norm_floor:
        findings.append(Finding(
            "delta2_entropy_norm", "attention", "alert", delta2,
            f"normalised Δ2 entropy {delta2:.3f} below the floor {t.delta2_entropy_norm_floor}: "
            "the QK update has collapsed onto a few directions",
            threshold=t.delta2_entropy_norm_floor, rule="floor",
        ))
    router = layer.router
    if router is not None and router.epsilon is not None and router.epsilon < t.epsilon_floor:
        findings.append(Finding(
            "epsilon", "router", "alert", router.epsilon,
            f"router ε {router.epsilon:.3f} below the floor {t.epsilon_floor}: router rows are nearly identical",
            threshold=t.epsilon_floor, rule="floor",
        ))
    entropy = router.routing_entropy_norm if router is not None else None
    if entropy is not None and entropy < t.routing_entropy_norm_floor:
        findings.append(Finding(
            "routing_entropy_norm", "router", "alert", entropy,
            f"normalised routing entropy {entropy:.3f} below the floor {t.routing_entropy_norm_floor}: "
            "probe tokens are routed to about one expert",
            threshold=t.routing_entropy_norm_floor, rule="floor",
        ))
    return findings


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
    side = "below" if point.warn_at is not None and point.warn_at < point.expected else "above"
    what = {"trend": "its recent healthy trend", "level": "its post-warm-up level",
            "reference": "the reference run"}[point.rule or "trend"]
    since = f" since step {onset}" if onset is not None else ""
    capped = " (not corroborated by a specific monitor: warn only)" if severity == "warn" and point.state == "alert" \
        else ""
    return Finding(
        monitor=monitor.name,
        family=monitor.family,
        severity=severity,
        value=point.value,
        message=f"{monitor.label} {point.value:.3g} is {point.excess:.1f} robust σ {side} {what} "
                f"({point.expected:.3g}){since}{capped}",
        baseline=point.expected,
        threshold=point.alert_at if severity == "alert" else point.warn_at,
        rule=point.rule,
        score=point.excess,
        onset_step=onset,
    )


def _cusum_finding(monitor: JudgedMonitor, point: Point, severity: str, onset: int | None, t: Thresholds) -> Finding:
    """A finding of the sequential rule: `score` is the CUSUM statistic and
    `threshold` the level it reached (both in accumulated robust sigmas)."""
    threshold = t.cusum_alert if point.state == "alert" else t.cusum_warn
    capped = " (not corroborated by a specific monitor: warn only)" if severity == "warn" and point.state == "alert" \
        else ""
    return Finding(
        monitor=monitor.name,
        family=monitor.family,
        severity=severity,
        value=point.value,
        message=f"{monitor.label} {point.value:.3g}: CUSUM of its departures from the healthy baseline "
                f"({point.expected:.3g}) is {point.cusum:.1f} (≥ {threshold:g}; drift {t.cusum_drift:g} σ per pair)"
                f"{f' since step {onset}' if onset is not None else ''}{capped}",
        baseline=point.expected,
        threshold=threshold,
        rule="cusum",
        score=point.cusum,
        onset_step=onset,
    )


def cross_layer_findings(pair: PairResult, t: Thresholds) -> None:
    """Flag layers whose normalised Δ2 entropy sits far below the others'."""
    values = _delta2_by_layer(pair)
    if len(values) < t.cross_layer_min_layers:
        return
    for layer in pair.layers:
        if layer.layer not in values:
            continue
        others = [v for k, v in values.items() if k != layer.layer]
        center, scale = robust_center_scale(others, t.cross_layer_min_scale)
        z = (values[layer.layer] - center) / scale
        severity = "alert" if z <= -t.cross_layer_z_alert else "warn" if z <= -t.cross_layer_z_warn else None
        if severity:
            layer.findings.append(Finding(
                "delta2_entropy_norm", "attention", severity, values[layer.layer],
                f"normalised Δ2 entropy {values[layer.layer]:.3f} is {-z:.1f} robust σ below the other layers' "
                f"median {center:.3f}",
                baseline=center,
                threshold=center - (t.cross_layer_z_alert if severity == "alert" else t.cross_layer_z_warn) * scale,
                rule="cross_layer",
                score=-z,
            ))


def cross_layer_applies(pair: PairResult, t: Thresholds) -> bool:
    """Whether the pair has the layers the cross-layer rule needs to judge them against each other."""
    return len(_delta2_by_layer(pair)) >= t.cross_layer_min_layers


def _delta2_by_layer(pair: PairResult) -> dict[int, float]:
    return {
        layer.layer: layer.attention.delta2_entropy_norm
        for layer in pair.layers
        if layer.attention is not None and layer.attention.delta2_entropy_norm is not None
    }


def layer_status(layer: LayerResult) -> str:
    status = worst([f.severity for f in layer.findings if f.severity in ("warn", "alert")])
    if status == "ok" and _unchanged(layer):
        return "unchanged"
    return status


def _unchanged(layer: LayerResult) -> bool:
    parts = [p for p in (layer.attention, layer.router) if p is not None]
    return bool(parts) and all(p.unchanged for p in parts)
