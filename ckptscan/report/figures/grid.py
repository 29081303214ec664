"""A report as layers × pairs, the shape every figure reads it in."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ckptscan.monitors import registry
from ckptscan.monitors.spec import MonitorSpec
from ckptscan.schema.results import Finding, LayerResult, ScanReport


@dataclass
class Grid:
    """A report as layers × pairs: values, findings and step coordinates."""

    layers: list[int]
    results: list[dict[int, LayerResult]]  # per pair: layer -> its result
    steps: list[float]  # x of each pair: its newer step (or its index when steps are unknown)
    edges: list[float]  # x edges of each pair's cell: len(steps) + 1
    step_label: str  # "step", or "pair" when the checkpoints' steps are unknown
    consecutive: bool  # each pair starts where the previous one ended: a cell spans its pair's updates

    @classmethod
    def of(cls, report: ScanReport) -> Grid:
        results = [{r.layer: r for r in pair.layers} for pair in report.pairs]
        layers = sorted({layer for by_layer in results for layer in by_layer})
        to_steps = [p.to_step for p in report.pairs]
        known = [s for s in to_steps if s is not None]
        if not to_steps or len(known) < len(to_steps):
            index = [float(i) for i in range(len(to_steps))]
            return cls(layers, results, index, [i - 0.5 for i in range(len(to_steps) + 1)], "pair", False)
        steps = [float(s) for s in known]
        froms = [p.from_step for p in report.pairs]
        start = froms[0]
        consecutive = start is not None and all(a == b for a, b in zip(to_steps, froms[1:]))
        if start is not None and consecutive:
            edges = [float(start)] + steps
        else:
            middles = [(a + b) / 2 for a, b in zip(steps, steps[1:])]
            first = steps[0] - (middles[0] - steps[0] if middles else 0.5)
            last = steps[-1] + (steps[-1] - middles[-1] if middles else 0.5)
            edges = [first] + middles + [last]
        return cls(layers, results, steps, edges, "step", consecutive)

    def values(self, read: Callable[[LayerResult], float | None]) -> np.ndarray:
        """[layers, pairs], nan where there is no value."""
        out = np.full((len(self.layers), len(self.results)), np.nan)
        for j, by_layer in enumerate(self.results):
            for i, layer in enumerate(self.layers):
                result = by_layer.get(layer)
                value = read(result) if result is not None else None
                if value is not None and math.isfinite(value):
                    out[i, j] = value
        return out

    def marks(self, monitors: Sequence[str]) -> np.ndarray:
        """[layers, pairs]: 2 where a finding of `monitors` (or a non-finite
        weight) is an alert, 1 a warning, 0 none."""
        out = np.zeros((len(self.layers), len(self.results)), dtype=int)
        for j, by_layer in enumerate(self.results):
            for i, layer in enumerate(self.layers):
                result = by_layer.get(layer)
                for f in result.findings if result is not None else ():
                    if f.monitor in monitors or f.monitor == "nonfinite":
                        out[i, j] = max(out[i, j], 2 if f.severity == "alert" else 1 if f.severity == "warn" else 0)
        return out

    def findings(self, layer: int, monitor: str) -> list[tuple[float, Finding]]:
        return [(x, f) for x, by_layer in zip(self.steps, self.results) if layer in by_layer
                for f in by_layer[layer].findings if f.monitor == monitor and f.severity in ("warn", "alert")]


def nan_reduce(reduce: Callable[..., np.ndarray], block: np.ndarray) -> np.ndarray:
    """`reduce` over axis 0 ignoring nan; nan where a column has no value (and no warning)."""
    out = np.full(block.shape[1:], np.nan)
    present = ~np.isnan(block).all(axis=0)
    out[present] = reduce(block[:, present], axis=0)
    return out


def headline_monitors(grid: Grid) -> list[MonitorSpec]:
    """The monitors a figure leads with: per family, the first of its headline
    monitors the report has values for (routing entropy stands for ε)."""
    return registry.headlines(lambda monitor: not np.isnan(grid.values(monitor.read)).all())
