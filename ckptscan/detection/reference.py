"""A known-healthy reference run (`--reference REPORT.json`).

A run judged only against itself cannot see a fault that is there from the
first checkpoint. A JSON report of a healthy run of the same model and
schedule gives, for each pair, an expected value per (layer, monitor): the
robust level (median, MAD sigma) of the reference pairs nearest in step, so a
reference follows the healthy run's own warm-up and drift. Two healthy runs
of one recipe with different seeds differ by several of one run's sigmas
(router ε by ~7, routing entropy by ~5 in the experiments' runs), so the
reference sigma is widened by `reference_scale_factor`: the reference rule
is for gross departures, such as a fault present from the first checkpoint.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Sequence

from ckptscan.detection.catalog import Monitor
from ckptscan.detection.series import Expectation, first_judged, judged_value, robust_center_scale
from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import ModelInfo
from ckptscan.results import LayerResult, ScanReport


@dataclass
class Reference:
    path: str
    model: dict
    steps: list[float]  # newer step of each judged reference pair
    layers: dict[int, list[LayerResult]]  # layer -> its results on those pairs
    _series: dict = field(default_factory=dict, repr=False, compare=False)  # `_known`'s, per (layer, monitor)

    def check_model(self, model: ModelInfo) -> None:
        mismatched = [f"{k}: {v} vs {getattr(model, k, None)}" for k, v in self.model.items()
                      if hasattr(model, k) and getattr(model, k) != v]
        if mismatched:
            raise CkptScanError(f"the reference run is of a different model ({'; '.join(mismatched)})",
                                path=self.path)

    def expectations(self, layer: int, monitor: Monitor, steps: Sequence[float], count: int, scale_factor: float
                     ) -> list[Expectation | None] | None:
        """`expectation` at each step; None where the reference has no value of `monitor` in `layer`."""
        if not self._known(layer, monitor)[0]:
            return None
        return [self.expectation(layer, monitor, step, count, scale_factor) for step in steps]

    def expectation(self, layer: int, monitor: Monitor, step: float, count: int, scale_factor: float
                    ) -> Expectation | None:
        """Expected value and sigma of `monitor` in `layer` at `step`, in the
        monitor's judged units; None where the reference has no value.

        The sigma is the reference's local spread (floored at the monitor's
        resolution) times `scale_factor`: another run of the same recipe
        differs from the reference by more than the reference's own noise
        (seed, data order), so only a gross departure counts."""
        known, ordered = self._known(layer, monitor)
        if not known:
            return None
        nearest = _nearest(known, ordered, step, count)
        center, scale = robust_center_scale([y for _, y in nearest], monitor.spec.min_scale)
        return Expectation(center, scale * math.sqrt(1 + 1 / len(nearest)) * scale_factor)

    def _known(self, layer: int, monitor: Monitor) -> tuple[list[tuple[float, float]], bool]:
        """The reference's (step, judged value) pairs of a series, and whether
        their steps ascend; worked out once per series, not per judged pair."""
        key = (layer, monitor.name)
        if key not in self._series:
            results = self.layers.get(layer) or []
            known = [(s, y) for s, r in zip(self.steps, results)
                     if not math.isnan(y := judged_value(monitor.read(r), monitor.spec.log))]
            self._series[key] = (known, all(a[0] <= b[0] for a, b in zip(known, known[1:])))
        return self._series[key]


def _nearest(known: list[tuple[float, float]], ordered: bool, step: float, count: int) -> list[tuple[float, float]]:
    """The `count` entries nearest to `step`, ties to the earlier entry (a
    stable sort by distance). With ascending steps, only the entries around
    `step` are sorted: the nearest `count` lie within `count` places of it,
    and every entry as near as the `count`-th is added, so ties break alike."""
    if not ordered:
        return sorted(known, key=lambda sy: abs(sy[0] - step))[:count]
    position = bisect.bisect_left(known, step, key=lambda sy: sy[0])
    lo, hi = max(0, position - count), min(len(known), position + count)
    kth = sorted(abs(known[j][0] - step) for j in range(lo, hi))[min(count, hi - lo) - 1]
    while lo > 0 and abs(known[lo - 1][0] - step) <= kth:
        lo -= 1
    while hi < len(known) and abs(known[hi][0] - step) <= kth:
        hi += 1
    return sorted(known[lo:hi], key=lambda sy: abs(sy[0] - step))[:count]


def reference_from_report(report: ScanReport, warmup_pairs: int, warmup_steps: int, path: str | None = None
                          ) -> Reference:
    """The expectations of a known-healthy run's report (trend or diff),
    from its pairs after warm-up."""
    pairs = report.pairs
    start = first_judged([p.from_step for p in pairs], warmup_pairs, warmup_steps)
    judged = pairs[start:] or pairs
    layers: dict[int, list[LayerResult]] = {}
    for pair in judged:
        for layer in pair.layers:
            layers.setdefault(layer.layer, [])
    for pair in judged:
        by_layer = {layer.layer: layer for layer in pair.layers}
        for number, results in layers.items():
            results.append(by_layer.get(number, LayerResult(number)))
    steps = [float(p.to_step) if p.to_step is not None else float(i) for i, p in enumerate(judged)]
    model = {k: getattr(report.model, k) for k in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                                                   "head_dim", "num_experts") if hasattr(report.model, k)}
    return Reference(path or str(report.settings.get("run", "the reference report")), model, steps, layers)
