"""Attention monitors judged together against a band: a layer's (rule
"layer_band") and the whole run's (rule "run_band").

A fault in a layer's attention moves all of its update monitors at once: the
Δ2 entropy, its worst head, and the ΔW_q and ΔW_k entropies. Against a band
of other runs (detection/reference.py), each of them alone must stray
`alert_sigma` × `band_scale_factor` band sigmas on two pairs in a row before
it alerts. Their mean departure from the band, in the band's own sigmas
(band factor 1), is much steadier in healthy runs: 30 healthy runs judged
leave-one-out never took it past 2.2 on two pairs in a row, while a fault's
layer reaches 3-5 a pair or two before any one monitor does. The thresholds
`layer_band_warn` / `layer_band_alert` are calibrated like every other
(experiments/calibrate.py, "band departure, layer mean").

A fault in the attention of every layer (low-precision attention from the
first step) moves every layer at once, while a healthy run's layers stray
from the band independently of each other, toward either side. The mean of
the layers' means (rule "run_band") is steadier still: over the same 30
healthy runs it never passed 1.1 on two pairs in a row, and faults that
touch every layer take it past 1.4 a pair or more before any one layer's
mean reaches `layer_band_alert` (`run_band_warn` / `run_band_alert`,
"band departure, run mean"). A fault in one layer moves this mean by a
fraction: the layer rule is the one for it.

Only a band counts, never a single reference: one run cannot show how far
healthy runs stray from each other. A layer needs at least two of the
monitors judged against the band on a pair for it to have a mean there, and
the run-band rule needs two layers with a mean (one layer: the layer rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ckptscan.detection.catalog import MONITORS
from ckptscan.detection.series import Point
from ckptscan.detection.thresholds import Thresholds
from ckptscan.results import Finding

# The update monitors of attention compared across runs: what a band judges together.
LAYER_BAND = tuple(m for m in MONITORS if m.family == "attention" and m.per_update and m.across_runs)
# Fewest of them with a band departure on a pair for the layer to have a mean there.
MIN_MONITORS = 2


def layer_band_departure(points: Mapping[str, Point]) -> float | None:
    """The mean band departure (band sigmas, factor 1, toward each monitor's
    alarm side) of the layer's LAYER_BAND monitors on one pair; None with
    fewer than MIN_MONITORS of them judged against a band."""
    departures = [points[m.name].band_departure for m in LAYER_BAND
                  if m.name in points and points[m.name].band_departure is not None]
    return sum(departures) / len(departures) if len(departures) >= MIN_MONITORS else None


@dataclass
class LayerBand:
    """The rule's state in one layer: the mean departure of the previous pair
    and the step it was at (the onset of two in a row)."""

    previous: float | None = None
    previous_step: int | None = None

    def update(self, points: Mapping[str, Point], step: int | None, t: Thresholds) -> Finding | None:
        """The finding of this pair, if its mean departure and the previous
        pair's are both at ≥ `layer_band_warn` (an alert when both are at
        ≥ `layer_band_alert`), else None."""
        mean = layer_band_departure(points)
        previous, onset = self.previous, self.previous_step
        self.previous, self.previous_step = mean, step
        if mean is None or previous is None:
            return None
        both = min(mean, previous)
        if both < t.layer_band_warn:
            return None
        severity = "alert" if both >= t.layer_band_alert else "warn"
        threshold = t.layer_band_alert if severity == "alert" else t.layer_band_warn
        # The finding names the monitor departing most: the statistic is the layer's, the monitor a pointer.
        name, point = max(((m.name, points[m.name]) for m in LAYER_BAND
                           if m.name in points and points[m.name].band_departure is not None),
                          key=lambda np: np[1].band_departure)
        monitor = next(m for m in LAYER_BAND if m.name == name)
        return Finding(
            monitor=name,
            family=monitor.family,
            severity=severity,
            value=point.value,
            message=f"{monitor.label} and the layer's other attention update monitors: their mean departure "
                    f"from the band of reference runs is {mean:.1f} band σ, {previous:.1f} on the pair before "
                    f"(≥ {threshold:g} on two pairs in a row) since step {onset}; {monitor.label} departs most "
                    f"({point.band_departure:.1f} σ)",
            baseline=point.expected,
            threshold=threshold,
            rule="layer_band",
            score=both,
            onset_step=onset,
        )

    def live_labels(self) -> list[object]:
        """The onset a next pair's finding may name: this pair's step."""
        return [self.previous_step] if self.previous is not None else []

    def to_dict(self) -> dict:
        return {"previous": self.previous, "previous_step": self.previous_step}


# Fewest layers with a layer-band mean on a pair for the run to have a mean there.
MIN_LAYERS = 2


def run_band_departure(layers: Sequence[Mapping[str, Point]]) -> tuple[float, int] | None:
    """The mean over layers of `layer_band_departure`, and the position of
    the layer departing most; None with fewer than MIN_LAYERS layer means."""
    means = [(mean, position) for position, points in enumerate(layers)
             if (mean := layer_band_departure(points)) is not None]
    if len(means) < MIN_LAYERS:
        return None
    return sum(mean for mean, _ in means) / len(means), max(means)[1]


@dataclass
class RunBand:
    """The run-band rule's state: the run's mean departure on the previous
    pair and that pair's step."""

    previous: float | None = None
    previous_step: int | None = None

    def update(self, layers: Sequence[Mapping[str, Point]], step: int | None, t: Thresholds
               ) -> tuple[int, Finding] | None:
        """(layer position, finding) of this pair, if the run's mean departure
        and the previous pair's are both at ≥ `run_band_warn` (an alert at
        ≥ `run_band_alert`); the finding goes to the layer departing most."""
        found = run_band_departure(layers)
        previous, onset = self.previous, self.previous_step
        self.previous, self.previous_step = (found[0] if found else None), step
        if found is None or previous is None:
            return None
        mean, position = found
        both = min(mean, previous)
        if both < t.run_band_warn:
            return None
        severity = "alert" if both >= t.run_band_alert else "warn"
        threshold = t.run_band_alert if severity == "alert" else t.run_band_warn
        points = layers[position]
        name, point = max(((m.name, points[m.name]) for m in LAYER_BAND
                           if m.name in points and points[m.name].band_departure is not None),
                          key=lambda np: np[1].band_departure)
        monitor = next(m for m in LAYER_BAND if m.name == name)
        return position, Finding(
            monitor=name,
            family=monitor.family,
            severity=severity,
            value=point.value,
            message=f"the attention update monitors of every layer: their mean departure from the band of "
                    f"reference runs is {mean:.1f} band σ, {previous:.1f} on the pair before (≥ {threshold:g} on "
                    f"two pairs in a row) since step {onset}; this layer departs most ({monitor.label} "
                    f"{point.band_departure:.1f} σ)",
            baseline=point.expected,
            threshold=threshold,
            rule="run_band",
            score=both,
            onset_step=onset,
        )

    def live_labels(self) -> list[object]:
        return [self.previous_step] if self.previous is not None else []

    def to_dict(self) -> dict:
        return {"previous": self.previous, "previous_step": self.previous_step}
