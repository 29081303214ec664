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

from ckptscan.detection.catalog import judged_by_name, judged_monitors
from ckptscan.detection.changepoint import Cusum
from ckptscan.detection.layer_band import MIN_MONITORS, layer_band, run_band_departure
from ckptscan.detection.reference import Expectations, Widening, reference_from_reports
from ckptscan.detection.rules import Thresholds, assess_report, first_judged_pair, pooled_departures
from ckptscan.detection.series import _judge as departure  # the reference rule's own one-sided departure
from ckptscan.detection.screening import report_thresholds
from ckptscan.detection.series import judged_value, track
from ckptscan.schema.results import ScanReport, from_dict


def load_report(run_dir: Path) -> ScanReport:
    with open(run_dir / "metrics.json") as fh:
        data = json.load(fh)
    return from_dict(ScanReport, data)


# One known-healthy run directory, or several (a band), or none.
ReferenceDirs = Union[Path, Sequence[Path], None]


def reference_of(reference_dirs: ReferenceDirs, t: Thresholds) -> Expectations | None:
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
    t = report_thresholds(report, thresholds)
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
        t = report_thresholds(report, base)
        pairs = report.pairs
        steps = [float(p.to_step) for p in pairs]
        settings = t.series_settings(first_judged_pair(pairs, t))
        verdicts = []
        for position in range(len(pairs[0].layers)):
            layers = [pair.layers[position] for pair in pairs]
            per_monitor = {}
            for monitor in judged_monitors():
                values = [monitor.read(layer) for layer in layers]
                if all(v is None for v in values):
                    continue
                per_monitor[monitor.name] = track(steps, values, monitor.spec, settings)
            verdicts.append(per_monitor)
        cusum = Cusum(t.cusum_drift, t.cusum_cap)
        best = {"cusum specific": -math.inf, "cusum all": -math.inf,
                "pooled_cusum specific": -math.inf, "pooled_cusum all": -math.inf}
        for monitor in judged_monitors():
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
# The layer-band rule's statistic (Thresholds.layer_band_warn / layer_band_alert), and the run-band rule's
# (Thresholds.run_band_warn / run_band_alert).
LAYER_BAND_KIND = "band departure, layer mean"
RUN_BAND_KIND = "band departure, run mean"


def band_maxima(runs: list[tuple[Path, list[Path]]], thresholds: Thresholds | None = None) -> dict[str, list[float]]:
    """Per (healthy run, ≥ 2 other healthy runs of its recipe), for update and
    for state monitors apart (each has its own band factor): the largest
    departure from their band in band sigmas (band factor 1), as
    `reference_maxima` measures it for one reference. The band scale factor
    that keeps healthy runs from alerting is the calibrated maximum over
    `alert_sigma`. Where fewer than two references cover a step (a band member
    ends early), the step is judged as the rule would: against the one left,
    at `reference_scale_factor`. And the layer-band rule's statistic
    (`largest_layer_mean`) and the run-band rule's (`largest_run_mean`), from
    the same departures."""
    base = thresholds or Thresholds()
    maxima: dict[str, list[float]] = {kind: [] for kind in (*BAND_KINDS, LAYER_BAND_KIND, RUN_BAND_KIND)}
    for run, band in runs:
        found = departures(run, band, base, base.reference_scale_factor)
        for kind, per_update in BAND_KINDS.items():
            maxima[kind].append(largest_departure(found, per_update))
        maxima[LAYER_BAND_KIND].append(largest_layer_mean(found))
        maxima[RUN_BAND_KIND].append(largest_run_mean(found))
    return maxima


# Per layer position, per monitor name, per pair: (one-sided departure, whether a band gave it), None where
# the references give no expectation (or the run no value).
Departures = list[dict[str, list[tuple[float, bool] | None]]]


def departures(run: Path, reference_dirs: list[Path], base: Thresholds, single_factor: float) -> Departures:
    """Each departure of `run` from its references, as the reference rule sees
    it: in band sigmas (factor 1) where a band covers the step, in one
    reference's sigmas widened by `single_factor` where only one does; over
    every pair (a band judges the warm-up too; one reference only the judged
    pairs), layer and monitor compared across runs (update monitors only
    against references saved at a like interval)."""
    report = load_report(run)
    t = report_thresholds(report, base)
    reference = reference_of(reference_dirs, t)
    start = first_judged_pair(report.pairs, t)
    found: Departures = []
    for position in range(len(report.pairs[0].layers)):
        series: dict[str, list[tuple[float, bool] | None]] = {}
        for monitor in (m for m in judged_monitors() if m.across_runs):
            values = series[monitor.name] = []
            for index, pair in enumerate(report.pairs):
                layer = pair.layers[position]
                y = judged_value(monitor.read(layer), monitor.spec.log)
                interval = pair.to_step - pair.from_step if pair.from_step is not None else None
                e = None if math.isnan(y) else reference.expectation(
                    layer.layer, monitor, float(pair.to_step), Widening(t.reference_pairs, single_factor), interval,
                    warmup=index < start)
                values.append(None if e is None else (
                    departure(y, e.center, e.scale, "reference", monitor.spec.bad).excess, e.band_factor is not None))
        found.append(series)
    return found


def _two_in_a_row(values: list[float | None]) -> float:
    """The largest smaller-of-two-consecutive value: what a rule needing two pairs in a row could alert on."""
    return max((min(a, b) for a, b in zip(values, values[1:]) if a is not None and b is not None), default=-math.inf)


def largest_departure(found: Departures, per_update: bool | None = None) -> float:
    """The largest departure that could alert, over layers and monitors
    (`per_update`: only update (True) or state (False) monitors)."""
    return max((_two_in_a_row([d[0] if d is not None else None for d in values])
                for series in found for name, values in series.items()
                if per_update is None or judged_by_name()[name].per_update == per_update), default=-math.inf)


def layer_means(found: Departures) -> list[list[float | None]]:
    """Per layer position, per pair: the mean band departure of the layer's
    attention update monitors, as `detection/layer_band.py` computes it (the
    mean of those a band judged on the pair, at least MIN_MONITORS), else None."""
    means = []
    for series in found:
        pairs = zip(*(series[m.name] for m in layer_band()))
        banded = [[d[0] for d in here if d is not None and d[1]] for here in pairs]
        means.append([sum(d) / len(d) if len(d) >= MIN_MONITORS else None for d in banded])
    return means


def largest_layer_mean(found: Departures) -> float:
    """The largest layer mean (`layer_means`) that could alert: two pairs in a row."""
    return max((_two_in_a_row(means) for means in layer_means(found)), default=-math.inf)


def largest_run_mean(found: Departures) -> float:
    """The largest mean of the layer means on a pair (`run_band_departure`,
    the rule's own) that could alert, two pairs in a row: the run-band rule's statistic."""
    per_pair = [run_band_departure(here) for here in zip(*layer_means(found))]
    return _two_in_a_row([found[0] if found is not None else None for found in per_pair])


def departure_maximum(run: Path, reference_dirs: list[Path], base: Thresholds, single_factor: float,
                      per_update: bool | None = None) -> float:
    """The largest departure of `run` from its references (`departures`) that
    could alert: the smaller of two consecutive one-sided departures;
    `per_update`: only update (True) or state (False) monitors."""
    return largest_departure(departures(run, reference_dirs, base, single_factor), per_update)
