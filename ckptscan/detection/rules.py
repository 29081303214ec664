"""Detection: rules over the metrics of a scan, producing findings.

Rules never compute monitors; they read `LayerResult`s and append
`Finding`s. Per-pair rules here: non-finite values, unchanged layers, hard
floors, and a cross-layer outlier test (a layer far from the model's other
layers in the same pair), which is what `diff` can judge without history.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from ckptscan.results import SEVERITIES, CheckpointRef, Finding, LayerResult, PairResult, ScanReport, Summary

# MAD -> standard deviation for normal data.
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Thresholds:
    # Hard floors (alerts whatever the history): a normalised Δ2 entropy this
    # low means the update of every head concentrates on ~1 direction.
    delta2_entropy_norm_floor: float = 0.2
    # ε this small bounds every pair of router rows to cosine ≥ ~0.65.
    epsilon_floor: float = 0.1
    # Cross-layer rule: robust z-score of a layer's normalised Δ2 entropy
    # against the other layers of the same pair (one-sided, low side).
    cross_layer_z_warn: float = 4.0
    cross_layer_z_alert: float = 6.0
    cross_layer_min_layers: int = 4
    # A MAD below this (normalised-entropy units) is treated as this: layers
    # that agree to 3 decimals should not turn rounding noise into alarms.
    cross_layer_min_scale: float = 0.01

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def assess_report(report: ScanReport, thresholds: Thresholds) -> None:
    """Fill findings, statuses and the summary of a report in place."""
    for pair in report.pairs:
        for layer in pair.layers:
            layer.findings.extend(numeric_findings(layer))
            layer.findings.extend(floor_findings(layer, thresholds))
        cross_layer_findings(pair, thresholds)
        for layer in pair.layers:
            layer.status = layer_status(layer)
        pair.status = worst_or_unchanged([layer.status for layer in pair.layers])
    report.thresholds = thresholds.as_dict()
    report.summary = summarize(report)


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


def floor_findings(layer: LayerResult, t: Thresholds) -> list[Finding]:
    findings = []
    att = layer.attention
    if att is not None and att.delta2_entropy_norm is not None and att.delta2_entropy_norm < t.delta2_entropy_norm_floor:
        findings.append(Finding(
            "delta2_entropy_norm", "attention", "alert", att.delta2_entropy_norm,
            f"normalised Δ2 entropy {att.delta2_entropy_norm:.3f} below the floor {t.delta2_entropy_norm_floor}: "
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
    return findings


def cross_layer_findings(pair: PairResult, t: Thresholds) -> None:
    """Flag layers whose normalised Δ2 entropy sits far below the others'."""
    values = {
        layer.layer: layer.attention.delta2_entropy_norm
        for layer in pair.layers
        if layer.attention is not None and layer.attention.delta2_entropy_norm is not None
    }
    if len(values) < t.cross_layer_min_layers:
        return
    for layer in pair.layers:
        if layer.layer not in values:
            continue
        others = [v for k, v in values.items() if k != layer.layer]
        center = statistics.median(others)
        scale = max(MAD_TO_SIGMA * statistics.median(abs(v - center) for v in others), t.cross_layer_min_scale)
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
            ))


def layer_status(layer: LayerResult) -> str:
    status = worst([f.severity for f in layer.findings if f.severity in ("warn", "alert")])
    if status == "ok" and _unchanged(layer):
        return "unchanged"
    return status


def worst(statuses: list[str]) -> str:
    ranked = [s for s in statuses if s in SEVERITIES]
    return max(ranked, key=SEVERITIES.index, default="ok") if ranked else "ok"


def worst_or_unchanged(statuses: list[str]) -> str:
    """Like `worst`, but "unchanged" when every part is unchanged."""
    if statuses and all(s == "unchanged" for s in statuses):
        return "unchanged"
    return worst(statuses)


def summarize(report: ScanReport) -> Summary:
    first_alert: dict[str, int | None] = {"attention": None, "router": None, "numeric": None}
    first_warn: dict[str, int | None] = {"attention": None, "router": None, "numeric": None}
    first_family, first_pair = None, None
    flagged: set[int] = set()
    for index, pair in enumerate(report.pairs):
        for layer in pair.layers:
            if layer.status in ("warn", "alert"):
                flagged.add(layer.layer)
            for f in layer.findings:
                if f.severity == "alert" and first_alert.get(f.family) is None:
                    first_alert[f.family] = pair.to_step
                    if first_family is None:
                        first_family, first_pair = f.family, index
                if f.severity in ("warn", "alert") and first_warn.get(f.family) is None:
                    first_warn[f.family] = pair.to_step
    status = worst_or_unchanged([p.status for p in report.pairs])
    rollback = None
    if first_pair is not None:
        pair = report.pairs[first_pair]
        rollback = CheckpointRef(pair.from_path, pair.from_step)
    return Summary(
        status=status,
        flagged_layers=sorted(flagged),
        first_alert_step=first_alert,
        rollback_candidate=rollback,
        first_warn_step=first_warn,
        first_family=first_family,
        message=_verdict(status, first_family, first_alert, sorted(flagged)),
    )


def _unchanged(layer: LayerResult) -> bool:
    parts = [p for p in (layer.attention, layer.router) if p is not None]
    return bool(parts) and all(p.unchanged for p in parts)


def _verdict(status: str, family: str | None, first_alert: dict[str, int | None], flagged: list[int]) -> str:
    if status == "alert" and family is not None:
        step = first_alert[family]
        where = f" at step {step}" if step is not None else ""
        return f"ALERT: {family} monitors fired first{where}; flagged layers {flagged}"
    if status == "warn":
        return f"WARN: flagged layers {flagged}"
    if status == "unchanged":
        return "UNCHANGED: the monitored weights did not change"
    return "HEALTHY: no monitor fired"
