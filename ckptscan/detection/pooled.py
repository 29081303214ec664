"""Evidence pooled over layers (rule "pooled_cusum").

A fault that acts on every layer moves each layer a little; the per-layer
departures of one monitor, summed over layers and divided by √(layers),
feed a CUSUM of their own. For a shift δ on every one of L layers the sum
grows as δ·√L; for independent healthy noise it stays a standard unit. The
finding goes to the layer departing most on the pair: the statistic is the
model's, the layer a pointer.
"""

from __future__ import annotations

import math
from typing import Sequence, cast

from ckptscan.detection.catalog import JudgedMonitor, departure_finding, judged_monitors
from ckptscan.detection.changepoint import Cusum, Excursion
from ckptscan.detection.series import Point
from ckptscan.detection.thresholds import Thresholds
from ckptscan.schema.results import Finding

def pooled() -> tuple[JudgedMonitor, ...]:
    """The monitors pooled over layers: the specific ones only (the others drift together in healthy runs)."""
    return tuple(m for m in judged_monitors() if m.alone == "alert" and m.spec.sequential)


def pooled_departure(points: Sequence[Point | None], cap: float) -> float | None:
    """One pair's departures from each layer's own history (robust sigmas,
    each capped to ±cap; never a reference run's, whose offset persists),
    summed over the layers judged on it, divided by √(their number)."""
    values = [max(-cap, min(cap, p.own_excess)) for p in points if p is not None and p.own_excess is not None]
    return sum(values) / len(values) ** 0.5 if values else None


def pooled_departures(verdicts: list[dict[str, list[Point]]], monitor: str, cap: float) -> list[float | None]:
    """`pooled_departure` of every pair of a run: verdicts[layer][monitor][pair]."""
    series = [v[monitor] for v in verdicts if monitor in v]
    if not series:
        return []
    return [pooled_departure([s[index] for s in series], cap) for index in range(len(series[0]))]


class PooledCusum:
    """The pooled CUSUM of one monitor, one pair at a time."""

    def __init__(self, monitor: JudgedMonitor, total: float = 0.0, excursion: Excursion | None = None) -> None:
        self.monitor, self.total = monitor, total
        self.excursion = excursion or Excursion()

    def update(self, index: int, points: Sequence[Point | None], label: int | None, t: Thresholds
               ) -> tuple[int, Finding] | None:
        """`points`: this pair's verdict of the monitor in each layer (by
        position; None where not judged). Returns (position, finding) when
        the sum is at ≥ pooled_cusum_warn and some layer adds to it."""
        z = pooled_departure(points, t.cusum_cap)
        stat = None
        if z is not None and not math.isnan(z):
            self.total = stat = Cusum(t.cusum_drift, t.cusum_cap).step(self.total, z)
        self.excursion.push(index, stat, label)
        if stat is None or stat < t.pooled_cusum_warn:
            return None
        severity = "alert" if stat >= t.pooled_cusum_alert else "warn"
        candidates = [(p, position) for position, p in enumerate(points) if p is not None and p.own_excess is not None]
        point, position = max(candidates, key=lambda cp: cast(float, cp[0].own_excess))
        if cast(float, point.own_excess) <= t.cusum_drift:
            return None  # no layer adds to the sum on this pair: nothing to point at (the alarm began earlier)
        onset = cast("int | None", self.excursion.onset_label)  # the labels are steps
        threshold = t.pooled_cusum_alert if severity == "alert" else t.pooled_cusum_warn
        monitor = self.monitor
        return position, departure_finding(
            monitor, point, severity, "pooled_cusum",
            f"{monitor.label}: CUSUM of the departures pooled over {len(candidates)} layers is {stat:.1f} "
            f"(≥ {threshold:g}; drift {t.cusum_drift:g} σ per pair) since step {onset}; "
            f"this layer departs most ({point.own_excess:.1f} σ)",
            threshold, stat, onset)

    def live_labels(self) -> list[object]:
        """The onset a later pair's finding may still name (the excursion under way)."""
        return [self.excursion.onset_label] if self.excursion.previous is not None and self.excursion.previous > 0 \
            else []

    def to_dict(self) -> dict:
        return {"total": self.total, "excursion": self.excursion.to_dict()}
