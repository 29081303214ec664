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

import math
from dataclasses import dataclass
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

    def check_model(self, model: ModelInfo) -> None:
        mismatched = [f"{k}: {v} vs {getattr(model, k, None)}" for k, v in self.model.items()
                      if hasattr(model, k) and getattr(model, k) != v]
        if mismatched:
            raise CkptScanError(f"the reference run is of a different model ({'; '.join(mismatched)})",
                                path=self.path)

    def expectations(self, layer: int, monitor: Monitor, steps: Sequence[float], count: int, scale_factor: float
                     ) -> list[Expectation | None] | None:
        """Expected value and sigma of `monitor` in `layer` at each step, in
        the monitor's judged units; None where the reference has no value.

        The sigma is the reference's local spread (floored at the monitor's
        resolution) times `scale_factor`: another run of the same recipe
        differs from the reference by more than the reference's own noise
        (seed, data order), so only a gross departure counts."""
        results = self.layers.get(layer)
        if not results:
            return None
        known = [(s, y) for s, r in zip(self.steps, results)
                 if not math.isnan(y := judged_value(monitor.read(r), monitor.spec.log))]
        if not known:
            return None
        expected = []
        for step in steps:
            nearest = sorted(known, key=lambda sy: abs(sy[0] - step))[:count]
            center, scale = robust_center_scale([y for _, y in nearest], monitor.spec.min_scale)
            expected.append(Expectation(center, scale * math.sqrt(1 + 1 / len(nearest)) * scale_factor))
        return expected


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
