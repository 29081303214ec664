"""The verdict of a report: worst status, first alert per family, the family
that fired first, flagged layers, the rollback candidate and the lead time.

An alarm is an alert finding. The step of an alert is the newer step of the
pair on which it was raised (what a nightly job would have seen then). The
first family to alert names the mechanism; on the same pair, the alert whose
departure began earlier wins, then the larger departure. The rollback
candidate is the last checkpoint before that departure began: the older
checkpoint of the pair where the first alert's run of departures started.
"""

from __future__ import annotations

from ckptscan.detection.catalog import BY_NAME
from ckptscan.results import FAMILIES, CheckpointRef, Finding, LayerSummary, PairResult, ScanReport, Summary
from ckptscan.vocabulary import worst


def summarize(
    report: ScanReport,
    loss_divergence_step: int | None = None,
    baselines: dict[int, dict[str, tuple[float | None, float | None]]] | None = None,
) -> Summary:
    """`baselines`: {layer: {monitor: (current value, its baseline)}} for the per-layer summary."""
    pairs = report.pairs
    first_alert: dict[str, int | None] = {family: None for family in FAMILIES}
    first_warn: dict[str, int | None] = {family: None for family in FAMILIES}
    for pair in pairs:
        for layer in pair.layers:
            for f in layer.findings:
                if f.severity == "alert" and first_alert.get(f.family) is None:
                    first_alert[f.family] = pair.to_step
                if f.severity in ("warn", "alert") and first_warn.get(f.family) is None:
                    first_warn[f.family] = pair.to_step
    layer_summaries = _layer_summaries(pairs, baselines or {})
    flagged = sorted(s.layer for s in layer_summaries if s.status in ("warn", "alert"))
    status = worst([p.status for p in pairs])
    if status == "ok" and pairs and all(layer.status == "unchanged" for p in pairs for layer in p.layers):
        status = "unchanged"

    first = _first_alert(pairs)
    rollback, onset_step, first_family, first_step = None, None, None, None
    if first is not None:
        index, layer, finding = first
        first_family, first_step = finding.family, pairs[index].to_step
        onset_index = _onset_index(pairs, index, finding)
        onset_step = pairs[onset_index].to_step
        rollback = CheckpointRef(pairs[onset_index].from_path, pairs[onset_index].from_step)
    lead = None
    if loss_divergence_step is not None and first_step is not None:
        lead = loss_divergence_step - first_step
    summary = Summary(
        status=status,
        flagged_layers=flagged,
        first_alert_step=first_alert,
        rollback_candidate=rollback,
        first_warn_step=first_warn,
        first_family=first_family,
        first_alert_onset_step=onset_step,
        loss_divergence_step=loss_divergence_step,
        lead_steps=lead,
        layers=layer_summaries,
    )
    summary.message = _verdict(summary, first, len(pairs))
    return summary


def _first_alert(pairs: list[PairResult]) -> tuple[int, int, Finding] | None:
    for index, pair in enumerate(pairs):
        alerts = [(layer.layer, f) for layer in pair.layers for f in layer.findings if f.severity == "alert"]
        if alerts:
            layer, finding = min(alerts, key=lambda a: (_onset_index(pairs, index, a[1]), _rank(a[1]),
                                                        -_score(a[1])))
            return index, layer, finding
    return None


def _onset_index(pairs: list[PairResult], index: int, finding: Finding) -> int:
    if finding.onset_step is None:
        return index
    for i in range(index, -1, -1):
        if pairs[i].to_step == finding.onset_step:
            return i
    return index


def _rank(finding: Finding) -> int:
    """Plainer evidence first: non-finite values, then the specific monitors, then the others."""
    if finding.family == "numeric":
        return 0
    monitor = BY_NAME.get(finding.monitor)
    return 1 if monitor is None or monitor.alone == "alert" else 2


def _score(finding: Finding) -> float:
    # Non-finite values and floors carry no score: they are the plainest evidence.
    return finding.score if finding.score is not None else float("inf")


def _layer_summaries(pairs: list[PairResult], baselines: dict[int, dict[str, tuple[float | None, float | None]]]
                     ) -> list[LayerSummary]:
    summaries: dict[int, LayerSummary] = {}
    for pair in pairs:
        for layer in pair.layers:
            s = summaries.setdefault(layer.layer, LayerSummary(layer.layer, "ok"))
            s.status = worst([s.status, layer.status])
            warns = [f for f in layer.findings if f.severity in ("warn", "alert")]
            if warns and s.first_warn_step is None:
                s.first_warn_step = pair.to_step
            alerts = [f for f in layer.findings if f.severity == "alert"]
            if alerts and s.first_alert_step is None:
                finding = min(alerts, key=lambda f: (_rank(f), -_score(f)))
                s.first_alert_step, s.first_alert_family, s.first_alert_monitor = (
                    pair.to_step, finding.family, finding.monitor)
    for layer, values in baselines.items():
        if layer in summaries:
            summaries[layer].current = {name: current for name, (current, _) in values.items()}
            summaries[layer].baseline = {name: baseline for name, (_, baseline) in values.items()}
    return [summaries[k] for k in sorted(summaries)]


def _verdict(s: Summary, first: tuple[int, int, Finding] | None, num_pairs: int) -> str:
    flagged = f"flagged layers {s.flagged_layers}"
    if s.status == "alert" and first is not None:
        _, layer, finding = first
        families = ", ".join(f"{family} {step if step is not None else '–'}"
                             for family, step in s.first_alert_step.items())
        step = s.first_alert_step[finding.family]
        together = [f for f, first_step in s.first_alert_step.items() if f != finding.family and first_step == step]
        # Families alerting on the same pair: the diagnosis rests on the earlier onset or the more specific monitor.
        also = f"; {' and '.join(together)} alerted on the same pair" if together else ""
        text = (f"ALERT: {finding.family} monitors fired first, at step {_step(step)} "
                f"(layer {layer}, {finding.monitor}{also}); first alert per family: {families}; {flagged}")
        if s.lead_steps is not None:
            when = f"{s.lead_steps} steps after" if s.lead_steps >= 0 else f"{-s.lead_steps} steps before"
            text += f"; the loss diverged at step {s.loss_divergence_step}, {when} the first alert"
        return text
    if s.status == "warn":
        return f"WARN: no alert, but monitors departed from their baselines; {flagged}"
    if s.status == "unchanged":
        return "UNCHANGED: the monitored weights did not change"
    return f"HEALTHY: no monitor fired over {num_pairs} pair(s)"


def _step(step: int | None) -> str:
    return str(step) if step is not None else "?"
