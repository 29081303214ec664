"""Attention monitors judged together against a band: a layer's (rule
"layer_band") and the whole run's (rule "run_band"). The family is the one
that sets `FamilySpec.banded` (attention, whose calibration the thresholds
are).

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

import functools
from dataclasses import dataclass
from typing import Mapping, Sequence, cast

from ckptscan.detection.catalog import Catalog, JudgedMonitor, catalog, departure_finding
from ckptscan.detection.series import Point
from ckptscan.detection.thresholds import Thresholds
from ckptscan.monitors import registry
from ckptscan.monitors.spec import FamilySpec
from ckptscan.schema.results import Finding


def layer_band() -> tuple[JudgedMonitor, ...]:
    """The update monitors compared across runs of the banded family
    (`FamilySpec.banded`: attention): what a band judges together."""
    return _layer_band(catalog())


@functools.cache
def _layer_band(judged: Catalog) -> tuple[JudgedMonitor, ...]:
    """Worked out once per state of the registry: asked per layer and pair."""
    family = banded_family()
    if family is None:
        return ()
    return tuple(m for m in judged.monitors if m.family == family.name and m.per_update and m.across_runs)


def banded_family() -> FamilySpec | None:
    """The registered family that sets `FamilySpec.banded` (the registry takes one at most); None: none does."""
    return next((f for f in registry.families() if f.banded), None)


# Fewest of them with a band departure on a pair for the layer to have a mean there.
MIN_MONITORS = 2


def layer_band_departure(points: Mapping[str, Point]) -> float | None:
    """The mean band departure (band sigmas, factor 1, toward each monitor's
    alarm side) of the layer's `layer_band` monitors on one pair; None with
    fewer than MIN_MONITORS of them judged against a band."""
    departures = [departure for m in layer_band()
                  if m.name in points and (departure := points[m.name].band_departure) is not None]
    return sum(departures) / len(departures) if len(departures) >= MIN_MONITORS else None


@dataclass
class TwoInARow:
    """A band statistic's state: its value on the previous pair and that
    pair's step (the onset of two in a row). `LayerBand` and `RunBand`."""

    previous: float | None = None
    previous_step: int | None = None

    def _step(self, value: float | None, step: int | None, warn: float, alert: float
              ) -> tuple[float, str, float, int | None] | None:
        """Take this pair's value; (the smaller of it and the previous one,
        severity, threshold crossed, onset step) when both reach `warn`."""
        previous, onset = self.previous, self.previous_step
        self.previous, self.previous_step = value, step
        if value is None or previous is None:
            return None
        both = min(value, previous)
        if both < warn:
            return None
        return (both, "alert", alert, onset) if both >= alert else (both, "warn", warn, onset)

    def live_labels(self) -> list[object]:
        """The onset a next pair's finding may name: this pair's step."""
        return [self.previous_step] if self.previous is not None else []

    def to_dict(self) -> dict:
        return {"previous": self.previous, "previous_step": self.previous_step}


def _departing_most(points: Mapping[str, Point]) -> tuple[JudgedMonitor, Point]:
    """The layer's `layer_band` monitor departing most from the band: what a
    finding of a band statistic names (the statistic is the layer's or run's)."""
    return max(((m, points[m.name]) for m in layer_band()
                if m.name in points and points[m.name].band_departure is not None),
               key=lambda mp: cast(float, mp[1].band_departure))


def _finding(monitor: JudgedMonitor, point: Point, judged: tuple[float, str, float, int | None], rule: str, what: str,
             mean: float | None, previous: float | None, pointer: str) -> Finding:
    # (mean and previous: set whenever the rule judged two pairs in a row, `judged`)
    both, severity, threshold, onset = judged
    return departure_finding(
        monitor, point, severity, rule,
        f"{what}: their mean departure from the band of reference runs is {mean:.1f} band σ, "
        f"{previous:.1f} on the pair before (≥ {threshold:g} on two pairs in a row) since step {onset}; {pointer}",
        threshold, both, onset)


class LayerBand(TwoInARow):
    """The layer-band rule in one layer. After `update`, `previous` is this pair's mean."""

    def update(self, points: Mapping[str, Point], step: int | None, t: Thresholds) -> Finding | None:
        """The finding of this pair, if its mean departure and the previous
        pair's are both at ≥ `layer_band_warn` (an alert when both are at
        ≥ `layer_band_alert`), else None."""
        before = self.previous
        judged = self._step(layer_band_departure(points), step, t.layer_band_warn, t.layer_band_alert)
        if judged is None:
            return None
        monitor, point = _departing_most(points)
        return _finding(monitor, point, judged, "layer_band",
                        f"{monitor.label} and the layer's other {monitor.family} update monitors", self.previous,
                        before,
                        f"{monitor.label} departs most ({point.band_departure:.1f} σ)")


# Fewest layers with a layer-band mean on a pair for the run to have a mean there.
MIN_LAYERS = 2


def run_band_departure(means: Sequence[float | None]) -> tuple[float, int] | None:
    """The mean of the layers' band means (`layer_band_departure`, by layer
    position), and the position of the layer departing most; None with
    fewer than MIN_LAYERS layer means."""
    found = [(mean, position) for position, mean in enumerate(means) if mean is not None]
    if len(found) < MIN_LAYERS:
        return None
    return sum(mean for mean, _ in found) / len(found), max(found)[1]


class RunBand(TwoInARow):
    """The run-band rule's state."""

    def update(self, means: Sequence[float | None], layers: Sequence[Mapping[str, Point]], step: int | None,
               t: Thresholds) -> tuple[int, Finding] | None:
        """(layer position, finding) of this pair, if the run's mean departure
        and the previous pair's are both at ≥ `run_band_warn` (an alert at
        ≥ `run_band_alert`); the finding goes to the layer departing most.
        `means`: each layer's band mean on this pair, as its `LayerBand` took it."""
        found = run_band_departure(means)
        before = self.previous
        judged = self._step(found[0] if found else None, step, t.run_band_warn, t.run_band_alert)
        if judged is None:
            return None
        mean, position = cast("tuple[float, int]", found)  # judged: found on this pair
        monitor, point = _departing_most(layers[position])
        return position, _finding(monitor, point, judged, "run_band",
                                  f"the {monitor.family} update monitors of every layer", mean, before,
                                  f"this layer departs most ({monitor.label} {point.band_departure:.1f} σ)")
