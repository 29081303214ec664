"""Detection: rules over the metrics of a scan, producing findings.

Rules never compute monitors; they read `LayerResult`s and append
`Finding`s. `assess_report` is the one entry point; it can be run again on
the same report (findings are rebuilt from the metrics each time).

- numeric: a non-finite value in a monitored tensor is always an alert.
- floor: a normalised Δ2 entropy, router ε or routing entropy under a hard
  floor is an alert whatever the history.
- series (`detection/series.py`): over a run, each (layer, monitor) series is
  judged against its own robust healthy baseline, and optionally against a
  known-healthy reference run (`detection/reference.py`); its departures
  also feed a one-sided CUSUM (`detection/changepoint.py`, rule "cusum").
- pooled: a fault that acts on every layer moves each layer a little; the
  per-layer departures of one monitor, summed over layers and divided by
  √(layers), feed a CUSUM of their own (rule "pooled_cusum").
- cross_layer: for a single pair (`diff`), or before a run has a baseline, a
  layer far below the model's other layers.
- precision (`detection/numerics.py`): an update mostly below the stored
  dtype's resolution (numeric warn).

Warm-up pairs (the first `warmup_pairs`, and those starting before
`warmup_steps`) are judged by the numeric rule only: early updates are
legitimately low-rank and fast-moving.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from ckptscan.detection.catalog import BY_NAME, MONITORS, Monitor
from ckptscan.detection.changepoint import Cusum, change_point
from ckptscan.detection.numerics import precision_findings
from ckptscan.detection.reference import Reference
from ckptscan.detection.series import Point, SeriesSettings, first_judged, robust_center_scale, track
from ckptscan.detection.summary import summarize
from ckptscan.errors import CkptScanError
from ckptscan.results import Finding, LayerResult, PairResult, ScanReport, SeriesPoint
from ckptscan.vocabulary import worst

__all__ = ["Thresholds", "assess_report", "summarize", "worst"]


@dataclass(frozen=True)
class Thresholds:
    # Series rule: a departure of ≥ warn_sigma (alert_sigma) robust sigmas
    # toward a monitor's alarm side, on `consecutive` pairs in a row.
    warn_sigma: float = 4.0
    alert_sigma: float = 6.0
    consecutive: int = 2
    # Sequential rule (CUSUM of each series' departures, robust sigmas): each
    # pair adds min(departure, cusum_cap) − cusum_drift, the sum floored at 0;
    # warn/alert when it reaches cusum_warn/cusum_alert. pooled_cusum_*: the
    # same on the departures of one monitor summed over layers / √layers.
    # Calibrated on healthy runs to ≤ 1 alert (10 warnings) per 100 healthy
    # run-lengths: experiments/calibrate.py, README "Calibration".
    cusum_drift: float = 1.0
    cusum_cap: float = 6.0
    cusum_warn: float = 4.9
    cusum_alert: float = 5.0
    pooled_cusum_warn: float = 4.6
    pooled_cusum_alert: float = 4.6
    # Warm-up: pairs starting before this step, and at least the first
    # `warmup_pairs` pairs, are not judged (except for non-finite values).
    warmup_steps: int = 0
    warmup_pairs: int = 2
    # Baselines: the last `baseline_pairs` healthy pairs; none before `min_baseline_pairs`.
    baseline_pairs: int = 8
    min_baseline_pairs: int = 5
    # Reference run (--reference): the `reference_pairs` reference pairs nearest
    # in step give the expected value; their sigma is widened by
    # `reference_scale_factor` for the spread between runs (seeds, data order).
    # Calibrated like the CUSUM thresholds (experiments/calibrate.py): each
    # healthy calibration run against the healthy run of its recipe with the
    # other seed departs by at most 9.5 of the reference's sigmas on two pairs
    # in a row; the Gumbel 1 % quantile, 11.16, over alert_sigma is 1.86.
    reference_pairs: int = 5
    reference_scale_factor: float = 1.9
    # Hard floors (alerts whatever the history): a normalised Δ2 entropy this
    # low means the update of every head concentrates on ~1 direction.
    delta2_entropy_norm_floor: float = 0.2
    # ε this small bounds every pair of router rows to cosine ≥ ~0.65.
    epsilon_floor: float = 0.1
    # Mean normalised routing entropy this low: tokens go to about one expert.
    routing_entropy_norm_floor: float = 0.1
    # Cross-layer rule: robust z-score of a layer's normalised Δ2 entropy
    # against the other layers of the same pair (one-sided, low side).
    cross_layer_z_warn: float = 4.0
    cross_layer_z_alert: float = 6.0
    cross_layer_min_layers: int = 8
    # A MAD below this (normalised-entropy units) is treated as this: layers
    # that agree to 3 decimals should not turn rounding noise into alarms.
    cross_layer_min_scale: float = 0.01
    # Loss divergence (--loss-log): trailing mean over `loss_window` logged
    # steps rising `loss_margin` nats above its running minimum for good.
    loss_window: int = 50
    loss_margin: float = 0.5
    # Monitors whose series are not judged (names as in the JSON report).
    disabled_monitors: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.warn_sigma <= self.alert_sigma:
            problems.append(f"need 0 < warn_sigma ≤ alert_sigma (got {self.warn_sigma}, {self.alert_sigma})")
        if self.consecutive < 1:
            problems.append(f"consecutive must be ≥ 1 (got {self.consecutive})")
        if self.min_baseline_pairs < 2 or self.baseline_pairs < self.min_baseline_pairs:
            problems.append("need 2 ≤ min_baseline_pairs ≤ baseline_pairs "
                            f"(got {self.min_baseline_pairs}, {self.baseline_pairs})")
        if self.warmup_steps < 0 or self.warmup_pairs < 0 or self.reference_pairs < 1 or self.loss_window < 1:
            problems.append("warmup_steps and warmup_pairs must be ≥ 0, reference_pairs and loss_window ≥ 1")
        if not (self.cusum_drift >= 0 and self.cusum_cap > self.cusum_drift
                and 0 < self.cusum_warn <= self.cusum_alert and 0 < self.pooled_cusum_warn <= self.pooled_cusum_alert):
            problems.append("need cusum_drift ≥ 0, cusum_cap > cusum_drift, 0 < cusum_warn ≤ cusum_alert and "
                            "0 < pooled_cusum_warn ≤ pooled_cusum_alert")
        if self.reference_scale_factor < 1:
            problems.append(f"reference_scale_factor must be ≥ 1 (got {self.reference_scale_factor})")
        unknown = sorted(set(self.disabled_monitors) - set(BY_NAME))
        if unknown:
            problems.append(f"disabled_monitors: unknown monitor(s) {unknown}; known: {sorted(BY_NAME)}")
        if problems:
            raise CkptScanError("invalid thresholds: " + "; ".join(problems))

    def as_dict(self) -> dict[str, object]:
        values = asdict(self)
        values["disabled_monitors"] = list(self.disabled_monitors)
        return values

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def series_settings(self, start: int) -> SeriesSettings:
        return SeriesSettings(self.warn_sigma, self.alert_sigma, self.consecutive, self.baseline_pairs,
                              self.min_baseline_pairs, start, self.cusum_drift, self.cusum_cap, self.cusum_warn,
                              self.cusum_alert)


def assess_report(
    report: ScanReport,
    thresholds: Thresholds,
    reference: Reference | None = None,
    loss_divergence_step: int | None = None,
) -> None:
    """Fill findings, statuses and the summary of a report in place.

    `reference`: a known-healthy run to compare each pair with.
    `loss_divergence_step`: when the loss log says the run diverged, for the
    lead time in the summary.
    """
    single = len(report.pairs) == 1
    start = 0 if single else first_judged_pair(report.pairs, thresholds)
    for pair in report.pairs:
        for layer in pair.layers:
            layer.findings = numeric_findings(layer)
            layer.judgements = {}
    for index, pair in enumerate(report.pairs):
        if index >= start:
            for layer in pair.layers:
                layer.findings.extend(floor_findings(layer, thresholds))
                layer.findings.extend(precision_findings(layer))
    baselines = {}
    if single:
        cross_layer_findings(report.pairs[0], thresholds)
    else:
        baselines = series_findings(report, thresholds, start, reference)
        # Until a layer has a baseline of its own, compare it with the other layers.
        for pair in report.pairs[start: start + thresholds.min_baseline_pairs]:
            cross_layer_findings(pair, thresholds)
    for pair in report.pairs:
        for layer in pair.layers:
            layer.status = layer_status(layer)
        pair.status = worst([layer.status for layer in pair.layers])
    report.thresholds = thresholds.as_dict()
    report.settings["warmup_end_step"] = _warmup_end(report.pairs, start)
    if reference is not None:
        report.settings["reference"] = reference.path
    report.summary = summarize(report, loss_divergence_step, baselines)


def first_judged_pair(pairs: list[PairResult], t: Thresholds) -> int:
    """Index of the first pair after warm-up."""
    return first_judged([p.from_step for p in pairs], t.warmup_pairs, t.warmup_steps)


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


def series_findings(report: ScanReport, t: Thresholds, start: int, reference: Reference | None
                    ) -> dict[int, dict[str, tuple[float | None, float | None]]]:
    """Judge every (layer, monitor) series of a run against its own history.

    Returns {layer: {monitor: (newest value, its baseline)}} for the summary."""
    pairs = report.pairs
    # Steps order the series; pairs without a step (unnamed checkpoints) fall back to their index.
    steps = [float(p.to_step) if p.to_step is not None else float(i) for i, p in enumerate(pairs)]
    settings = t.series_settings(start)
    baselines: dict[int, dict[str, tuple[float | None, float | None]]] = {}
    every_layer: list[dict[str, list[Point]]] = []
    for position in range(len(pairs[0].layers) if pairs else 0):
        layers = [pair.layers[position] for pair in pairs]
        verdicts: dict[str, list[Point]] = {}
        for monitor in MONITORS:
            if monitor.name in t.disabled_monitors:
                continue
            values = [monitor.read(layer) for layer in layers]
            if all(v is None for v in values):
                continue
            expected = None
            if reference is not None and monitor.across_runs:
                expected = reference.expectations(layers[0].layer, monitor, steps, t.reference_pairs,
                                                  t.reference_scale_factor)
            verdicts[monitor.name] = track(steps, values, monitor.spec, settings, expected)
        every_layer.append(verdicts)
        for index, layer in enumerate(layers):
            layer.findings.extend(_point_findings(index, verdicts, pairs, t))
            layer.judgements = {name: _judgement(points[index], pairs)
                                for name, points in verdicts.items() if points[index].state != "missing"}
        newest = {}
        for name, points in verdicts.items():
            last = next((p for p in reversed(points) if p.value is not None), None)
            if last is not None:
                newest[name] = (last.value, last.expected)
        baselines[layers[0].layer] = newest
    pooled_findings(pairs, every_layer, t)
    return baselines


def pooled_departures(verdicts: list[dict[str, list[Point]]], monitor: str, cap: float) -> list[float | None]:
    """Per pair: the departures from each layer's own history (robust sigmas,
    each capped to ±cap; never a reference run's, whose offset persists) of
    `monitor` summed over the layers judged on that pair, divided by
    √(their number). For a shift δ on every one of L layers it grows as
    δ·√L; for independent healthy noise it stays a standard unit."""
    series = [v[monitor] for v in verdicts if monitor in v]
    if not series:
        return []
    out: list[float | None] = []
    for index in range(len(series[0])):
        values = [max(-cap, min(cap, s[index].own_excess)) for s in series if s[index].own_excess is not None]
        out.append(sum(values) / len(values) ** 0.5 if values else None)
    return out


def pooled_findings(pairs: list[PairResult], verdicts: list[dict[str, list[Point]]], t: Thresholds) -> None:
    """The pooled CUSUM of each monitor over layers; a finding goes to the layer
    departing most on the pair (the statistic is the model's, the layer a pointer)."""
    if len(verdicts) < 2:
        return  # one layer: the per-layer CUSUM already is the pooled one
    cusum = Cusum(t.cusum_drift, t.cusum_cap)
    for monitor in MONITORS:
        if monitor.alone != "alert" or not monitor.spec.sequential:
            continue  # pooled over layers: the specific monitors only (the others drift together in healthy runs)
        zs = pooled_departures(verdicts, monitor.name, t.cusum_cap)
        if not zs:
            continue
        sums = cusum.run(zs)
        for index, c in enumerate(sums):
            if c is None or c < t.pooled_cusum_warn:
                continue
            severity = "alert" if c >= t.pooled_cusum_alert else "warn"
            candidates = [(v[monitor.name][index], position) for position, v in enumerate(verdicts)
                          if monitor.name in v and v[monitor.name][index].own_excess is not None]
            point, position = max(candidates, key=lambda cp: cp[0].own_excess)
            if point.own_excess <= t.cusum_drift:
                continue  # no layer adds to the sum on this pair: nothing to point at (the alarm began earlier)
            onset = pairs[change_point(sums, index)].to_step
            threshold = t.pooled_cusum_alert if severity == "alert" else t.pooled_cusum_warn
            pairs[index].layers[position].findings.append(Finding(
                monitor=monitor.name,
                family=monitor.family,
                severity=severity,
                value=point.value,
                message=f"{monitor.label}: CUSUM of the departures pooled over {len(candidates)} layers is {c:.1f} "
                        f"(≥ {threshold:g}; drift {t.cusum_drift:g} σ per pair) since step {onset}; "
                        f"this layer departs most ({point.own_excess:.1f} σ)",
                baseline=point.expected,
                threshold=threshold,
                rule="pooled_cusum",
                score=c,
                onset_step=onset,
            ))


def _point_findings(index: int, verdicts: dict[str, list[Point]], pairs: list[PairResult], t: Thresholds
                    ) -> list[Finding]:
    """Findings of one layer at one pair; a monitor that may not alert alone
    needs a specific monitor of its family at ≥ warn on the same pair."""
    elevated = {
        BY_NAME[name].family
        for name, points in verdicts.items()
        if BY_NAME[name].alone == "alert" and points[index].state in ("warn", "alert")
    }
    findings = []
    for name, points in verdicts.items():
        point = points[index]
        if point.state not in ("warn", "alert"):
            continue
        monitor = BY_NAME[name]
        severity = point.state
        corroborated = monitor.alone == "alert" or monitor.family in elevated
        if severity == "alert" and not corroborated:
            severity = "warn"
        findings.append(_series_finding(monitor, point, severity, pairs, t))
    return findings


def _judgement(point: Point, pairs: list[PairResult]) -> SeriesPoint:
    return SeriesPoint(point.state, point.value, point.expected, point.warn_at, point.alert_at, point.rule,
                       point.excess, pairs[point.onset].to_step if point.onset is not None else None,
                       point.cusum)


def _series_finding(monitor: Monitor, point: Point, severity: str, pairs: list[PairResult], t: Thresholds) -> Finding:
    onset = pairs[point.onset].to_step if point.onset is not None else None
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


def _cusum_finding(monitor: Monitor, point: Point, severity: str, onset: int | None, t: Thresholds) -> Finding:
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


def layer_status(layer: LayerResult) -> str:
    status = worst([f.severity for f in layer.findings if f.severity in ("warn", "alert")])
    if status == "ok" and _unchanged(layer):
        return "unchanged"
    return status


def _unchanged(layer: LayerResult) -> bool:
    parts = [p for p in (layer.attention, layer.router) if p is not None]
    return bool(parts) and all(p.unchanged for p in parts)


def _warmup_end(pairs: list[PairResult], start: int) -> int | None:
    """Step from which pairs are judged (the older step of the first judged pair)."""
    return pairs[start].from_step if start < len(pairs) else None
