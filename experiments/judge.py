"""Judge a corpus run again from its stored metrics (RUN/metrics.json).

`judge_run` rebuilds ckptscan's trend report and runs ckptscan's rules on it
with the thresholds under test: the same `assess_report` call that
`ckptscan.scan_run` ends with, with the same warm-up (the loss log's LR
warm-up end), so the verdict is what `ckptscan trend RUN` would print with
those thresholds. `changepoint_maxima` gives, per healthy run, the largest
CUSUM statistics that calibration needs; `reference_maxima` and
`band_maxima` the largest departures from one reference run and from a
band of several.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Sequence, Union

from ckptscan.detection.catalog import MONITORS
from ckptscan.detection.changepoint import Cusum
from ckptscan.detection.layer_band import LAYER_BAND, MIN_MONITORS
from ckptscan.detection.reference import Reference, reference_from_reports
from ckptscan.detection.rules import Thresholds, assess_report, first_judged_pair, pooled_departures
from ckptscan.detection.series import _judge as departure  # the reference rule's own one-sided departure
from ckptscan.detection.series import judged_value, track
from ckptscan.results import ScanReport, from_dict


def load_report(run_dir: Path) -> ScanReport:
    with open(run_dir / "metrics.json") as fh:
        data = json.load(fh)
    return from_dict(ScanReport, data)


def effective_thresholds(report: ScanReport, thresholds: Thresholds) -> Thresholds:
    """As scan_run does: judging starts after the learning-rate warm-up at the earliest."""
    warmup = report.settings.get("lr_warmup_end_step")
    if warmup is not None and warmup > thresholds.warmup_steps:
        return dataclasses.replace(thresholds, warmup_steps=warmup)
    return thresholds


# One known-healthy run directory, or several (a band), or none.
ReferenceDirs = Union[Path, Sequence[Path], None]


def reference_of(reference_dirs: ReferenceDirs, t: Thresholds) -> Reference | None:
    """The expectations of the reference runs' stored metrics, as `--reference
    DIR...` would build them: one run, or a band when there are several."""
    dirs = [reference_dirs] if isinstance(reference_dirs, Path) else list(reference_dirs or [])
    if not dirs:
        return None
    return reference_from_reports([load_report(d) for d in dirs], t.warmup_pairs, t.warmup_steps,
                                  [str(d) for d in dirs])


def judge_run(run_dir: Path, thresholds: Thresholds, divergence: int | None,
              reference_dirs: ReferenceDirs = None) -> ScanReport:
    """`reference_dirs`: a known-healthy run, or several (a band), whose
    metrics serve as `--reference`."""
    report = load_report(run_dir)
    t = effective_thresholds(report, thresholds)
    assess_report(report, t, reference_of(reference_dirs, t), divergence)
    return report


def changepoint_maxima(runs: list[Path], thresholds: Thresholds | None = None) -> dict[str, list[float]]:
    """Per run, the largest CUSUM statistic of (a) the per-layer series and (b)
    the series pooled over layers, over the monitors that may alert alone
    ("specific") and over all monitors ("all")."""
    base = thresholds or Thresholds()
    out: dict[str, list[float]] = {}
    for run in runs:
        report = load_report(run)
        t = effective_thresholds(report, base)
        pairs = report.pairs
        steps = [float(p.to_step) for p in pairs]
        settings = t.series_settings(first_judged_pair(pairs, t))
        verdicts = []
        for position in range(len(pairs[0].layers)):
            layers = [pair.layers[position] for pair in pairs]
            per_monitor = {}
            for monitor in MONITORS:
                values = [monitor.read(layer) for layer in layers]
                if all(v is None for v in values):
                    continue
                per_monitor[monitor.name] = track(steps, values, monitor.spec, settings)
            verdicts.append(per_monitor)
        cusum = Cusum(t.cusum_drift, t.cusum_cap)
        best = {"cusum specific": -math.inf, "cusum all": -math.inf,
                "pooled_cusum specific": -math.inf, "pooled_cusum all": -math.inf}
        for monitor in MONITORS:
            if not monitor.spec.sequential:
                continue
            kinds = ["all"] + (["specific"] if monitor.alone == "alert" else [])
            layer_max = max((p.cusum for v in verdicts if monitor.name in v for p in v[monitor.name]
                             if p.cusum is not None), default=-math.inf)
            pooled = [c for c in cusum.run(pooled_departures(verdicts, monitor.name, t.cusum_cap)) if c is not None]
            pooled_max = max(pooled, default=-math.inf) if len(verdicts) > 1 else -math.inf
            for kind in kinds:
                best[f"cusum {kind}"] = max(best[f"cusum {kind}"], layer_max)
                best[f"pooled_cusum {kind}"] = max(best[f"pooled_cusum {kind}"], pooled_max)
        for name, value in best.items():
            out.setdefault(name, []).append(value)
    return out


def reference_maxima(pairs: list[tuple[Path, Path]], thresholds: Thresholds | None = None) -> list[float]:
    """Per (healthy run, healthy reference run of its recipe with another seed):
    the largest departure from the reference that the reference rule would
    alert on, in the reference's own robust sigmas (scale factor 1): over the
    judged pairs, layers and monitors compared across runs, the smaller of two
    consecutive one-sided departures (the rule needs `consecutive` = 2 in a
    row). The reference scale factor that keeps healthy runs from alerting is
    the calibrated maximum over `alert_sigma`."""
    base = thresholds or Thresholds()
    return [departure_maximum(run, [reference], base, 1.0) for run, reference in pairs]


# The band's two calibrated widenings (Thresholds.band_scale_factor, band_state_scale_factor):
# monitors of an update (Δ2 and ΔW entropies) and of one checkpoint's state (the logit bound).
BAND_KINDS = {"band departure, update monitors": True, "band departure, state monitors": False}


def band_maxima(runs: list[tuple[Path, list[Path]]], thresholds: Thresholds | None = None) -> dict[str, list[float]]:
    """Per (healthy run, ≥ 2 other healthy runs of its recipe), for update and
    for state monitors apart (each has its own band factor): the largest
    departure from their band in band sigmas (band factor 1), as
    `reference_maxima` measures it for one reference. The band scale factor
    that keeps healthy runs from alerting is the calibrated maximum over
    `alert_sigma`. Where fewer than two references cover a step (a band member
    ends early), the step is judged as the rule would: against the one left,
    at `reference_scale_factor`."""
    base = thresholds or Thresholds()
    maxima = {kind: [departure_maximum(run, band, base, base.reference_scale_factor, per_update)
                     for run, band in runs] for kind, per_update in BAND_KINDS.items()}
    maxima[LAYER_BAND_KIND] = [layer_band_maximum(run, band, base) for run, band in runs]
    return maxima


# The layer-band rule's statistic (Thresholds.layer_band_warn / layer_band_alert).
LAYER_BAND_KIND = "band departure, layer mean"


def layer_band_maximum(run: Path, reference_dirs: list[Path], base: Thresholds) -> float:
    """The largest mean departure of a layer's attention update monitors from
    the band of `reference_dirs` (band sigmas, factor 1) that could alert: the
    smaller of two consecutive pairs' means, over every pair (the band judges
    the warm-up too) and layer, as `detection/layer_band.py` computes it."""
    report = load_report(run)
    t = effective_thresholds(report, base)
    reference = reference_of(reference_dirs, t)
    start = first_judged_pair(report.pairs, t)
    best = -math.inf
    for position in range(len(report.pairs[0].layers)):
        means: list[float | None] = []
        for index, pair in enumerate(report.pairs):
            layer = pair.layers[position]
            interval = pair.to_step - pair.from_step if pair.from_step is not None else None
            departures = []
            for monitor in LAYER_BAND:
                y = judged_value(monitor.read(layer), monitor.spec.log)
                e = None if math.isnan(y) else reference.expectation(
                    layer.layer, monitor, float(pair.to_step), t.reference_pairs, 1.0, 1.0, interval,
                    warmup=index < start)
                if e is not None and e.band_factor is not None:
                    departures.append(departure(y, e.center, e.scale, "reference", monitor.spec.bad).excess)
            means.append(sum(departures) / len(departures) if len(departures) >= MIN_MONITORS else None)
        best = max([best] + [min(a, b) for a, b in zip(means, means[1:]) if a is not None and b is not None])
    return best


def departure_maximum(run: Path, reference_dirs: list[Path], base: Thresholds, single_factor: float,
                      per_update: bool | None = None) -> float:
    """The largest departure of `run` from its references (factor 1 for a
    band, `single_factor` for one reference) that could alert: the smaller of
    two consecutive one-sided departures, over the judged pairs, layers and
    monitors compared across runs (update monitors only against references
    saved at a like interval, as the rule does); `per_update`: only update
    (True) or state (False) monitors."""
    report = load_report(run)
    t = effective_thresholds(report, base)
    reference = reference_of(reference_dirs, t)
    start = first_judged_pair(report.pairs, t)
    best = -math.inf
    for position in range(len(report.pairs[0].layers)):
        layers = [pair.layers[position] for pair in report.pairs]
        for monitor in MONITORS:
            if not monitor.across_runs or per_update is not None and monitor.per_update != per_update:
                continue
            zs: list[float | None] = []
            for index, (pair, layer) in enumerate(zip(report.pairs, layers)):
                y = judged_value(monitor.read(layer), monitor.spec.log)
                interval = pair.to_step - pair.from_step if pair.from_step is not None else None
                e = None if math.isnan(y) else reference.expectation(
                    layer.layer, monitor, float(pair.to_step), t.reference_pairs, single_factor, 1.0, interval,
                    warmup=index < start)
                zs.append(None if e is None else departure(y, e.center, e.scale, "reference", monitor.spec.bad).excess)
            best = max([best] + [min(a, b) for a, b in zip(zs, zs[1:]) if a is not None and b is not None])
    return best
