"""The timeline's panels: a flagged layer's alarming monitor against the
band the series rule judged it by, all layers of a monitor, the loss.

The bands are what detection stored in the report: each series point's
expected value and its warn and alert levels (`LayerResult.judgements`),
including a reference run's expectations where that rule judged the point;
the levels named beside them are the report's thresholds. Nothing is judged
again here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ckptscan.monitors import registry
from ckptscan.monitors.spec import MonitorSpec
from ckptscan.report.figures.canvas import ALARM_COLOR
from ckptscan.report.figures.envelope import envelope, fold
from ckptscan.report.figures.grid import Grid, headline_monitors, nan_reduce
from ckptscan.report.figures.heatmap import axis_unit
from ckptscan.schema.results import ScanReport, SeriesPoint

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def layer_panel(ax: Axes, report: ScanReport, grid: Grid, layer: int) -> list[str]:
    """One flagged layer: the monitor that fired first in it against its band, its findings and its hard
    floor. Returns notes for the caption."""
    monitor = _lead_monitor(report, grid, layer)
    row = grid.layers.index(layer)
    values = grid.values(monitor.read)
    series = values[row]
    notes = []
    if len(grid.layers) > 1:
        others = np.delete(values, row, axis=0)
        median = nan_reduce(np.nanmedian, others)
        folded = envelope(grid.steps, median)
        x, y = (grid.steps, median) if folded is None else (folded.x, folded.median)
        ax.plot(x, y, color="#9a9a9a", linewidth=0.9, zorder=2,
                label="the other layer" if len(others) == 1 else "median of the other layers")
    points = _band_points(grid, layer, monitor)
    if points is not None:
        _draw_band(ax, grid.steps, points, monitor, report)
    else:
        notes.append("No band: the report carries no series judgements (a single pair, or an older report).")
    dense = len(grid.steps) > 60  # smaller markers, so that many do not merge into a blot
    findings = grid.findings(layer, monitor.name)
    folded = envelope(grid.steps, series)
    if folded is None:
        ax.plot(grid.steps, series, color="#2166ac", marker="o", markersize=2.5 if dense else 3.5, linewidth=1.3,
                zorder=4, label="flagged layer")
    else:
        ax.fill_between(folded.x, folded.low, folded.high, where=np.isfinite(folded.low), color="#2166ac",
                        alpha=0.35, linewidth=0, zorder=4, label=f"flagged layer: range of every {folded.label}")
        ax.plot(folded.x, folded.median, color="#2166ac", linewidth=1.2, zorder=4,
                label=f"flagged layer: median of every {folded.label}")
    for severity, shape, size in (("warn", "o", 4.5 if dense else 7), ("alert", "X", 5.5 if dense else 9)):
        hits = [(x, f.value) for x, f in findings if f.severity == severity and f.value is not None]
        if hits:
            xs, ys = zip(*hits)
            ax.scatter(xs, ys, marker=shape, s=size ** 2, facecolors="white" if severity == "warn" else
                       ALARM_COLOR, edgecolors=ALARM_COLOR, linewidths=0.8 if dense else 1.2, zorder=5,
                       label=severity)
    floor = _level(report, f"{monitor.name}_floor")
    low, high = ax.get_ylim()
    if floor is not None and low <= floor <= high:  # never stretch the axis to show a far-away floor
        ax.axhline(floor, color=ALARM_COLOR, linestyle="-.", linewidth=0.9, zorder=3, label="hard floor (alert)")
    title = f"layer {layer}: {monitor.label} ({monitor.family})"
    # Non-finite weights leave the monitors without a value: shade those pairs instead.
    nonfinite = [j for j, by_layer in enumerate(grid.results)
                 if layer in by_layer and any(f.monitor == "nonfinite" for f in by_layer[layer].findings)]
    for first, last in _runs(nonfinite):  # one span per run of pairs: a long run has few spans, not thousands
        ax.axvspan(grid.edges[first], grid.edges[last + 1], facecolor="#f4c7c3", edgecolor=ALARM_COLOR,
                   hatch="xx", linewidth=0, zorder=1, label="non-finite weights (numeric alert)")
    if nonfinite:
        title += f"; non-finite weights from step {grid.steps[nonfinite[0]]:g}"
    ax.set_title(title, loc="left", fontsize=9)
    ax.set_ylabel(axis_unit(monitor), fontsize=9)
    return notes


def all_layers_panel(ax: Axes, grid: Grid, monitor: MonitorSpec) -> None:
    """No layer flagged: one monitor's median over the layers, the range between the lowest and highest shaded."""
    values = grid.values(monitor.read)
    lo, hi, median = nan_reduce(np.nanmin, values), nan_reduce(np.nanmax, values), nan_reduce(np.nanmedian, values)
    folded = envelope(grid.steps, median)
    if folded is None:
        ax.fill_between(grid.steps, lo, hi, where=np.isfinite(lo), color="#bdbdbd", alpha=0.55, linewidth=0,
                        zorder=2, label="range over layers")
        ax.plot(grid.steps, median, color="#2166ac", marker="o", markersize=2.5 if len(grid.steps) > 100 else 3.5,
                linewidth=1.3, zorder=4, label="median over layers")
    else:  # the range over layers and over each bucket's pairs; the median's median
        low, high = fold(grid.steps, lo).low, fold(grid.steps, hi).high
        ax.fill_between(folded.x, low, high, where=np.isfinite(low), color="#bdbdbd", alpha=0.55, linewidth=0,
                        zorder=2, label=f"range over layers and every {folded.label}")
        ax.plot(folded.x, folded.median, color="#2166ac", linewidth=1.3, zorder=4,
                label=f"median over layers, median of every {folded.label}")
    ax.set_title(f"all {len(grid.layers)} layers: {monitor.label} ({monitor.family})", loc="left", fontsize=9)
    ax.set_ylabel(axis_unit(monitor), fontsize=9)


def loss_panel(ax: Axes, grid: Grid, losses: list[float | None]) -> None:
    """The mean training loss over each pair's updates."""
    y = np.array([v if v is not None else np.nan for v in losses], dtype=float)
    if grid.consecutive:
        # Each pair's mean loss covers its interval of updates.
        ax.stairs(y, grid.edges, color="#4d4d4d", linewidth=1.4, baseline=None, zorder=4,
                  label="mean loss over each pair")
    else:
        ax.plot(grid.steps, y, color="#4d4d4d", linewidth=1.4, zorder=4, label="mean loss over each pair")
    ax.set_ylabel("loss", fontsize=9)
    ax.set_title("training loss: mean over each pair's updates", loc="left", fontsize=9)


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Sorted indices as (first, last) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for j in indices:
        if runs and runs[-1][1] == j - 1:
            runs[-1] = (runs[-1][0], j)
        else:
            runs.append((j, j))
    return runs


def _lead_monitor(report: ScanReport, grid: Grid, layer: int) -> MonitorSpec:
    """The monitor that fired first in a layer (its first alert, else its first warning)."""
    summary = next((s for s in report.summary.layers if s.layer == layer), None)
    names = [summary.first_alert_monitor] if summary is not None and summary.first_alert_monitor else []
    for by_layer in grid.results:
        result = by_layer.get(layer)
        names += [f.monitor for f in result.findings if f.severity in ("warn", "alert")] if result else []
    for name in names:
        if (monitor := registry.find(name)) is not None:
            return monitor
    # A numeric finding (non-finite weights): show the layer's headline monitor.
    return next((m for m in headline_monitors(grid)), registry.spec("delta2_entropy_norm"))


def _level(report: ScanReport, name: str) -> float | None:
    """A level detection judged by, as the report carries it (its effective
    thresholds), or None when it carries none."""
    value = report.thresholds.get(name)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _band_points(grid: Grid, layer: int, monitor: MonitorSpec) -> list[SeriesPoint | None] | None:
    """What detection recorded at each pair of this (layer, monitor) series,
    or None when the report carries no judgements for it."""
    results = [by_layer.get(layer) for by_layer in grid.results]
    points = [r.judgements.get(monitor.name) if r is not None else None for r in results]
    return points if any(p is not None for p in points) else None


def _draw_band(ax: Axes, steps: list[float], points: list[SeriesPoint | None], monitor: MonitorSpec,
               report: ScanReport) -> None:
    n = len(points)
    centre, lo, hi, alert_lo, alert_hi = (np.full(n, np.nan) for _ in range(5))
    for k, p in enumerate(points):
        if p is None or p.expected is None or p.warn_at is None or p.alert_at is None:
            continue
        to = math.log if monitor.log else float
        back = math.exp if monitor.log else float
        if monitor.log and min(p.expected, p.warn_at, p.alert_at) <= 0:
            continue
        c, warn, alert = to(p.expected), abs(to(p.warn_at) - to(p.expected)), abs(to(p.alert_at) - to(p.expected))
        centre[k], lo[k], hi[k] = p.expected, back(c - warn), back(c + warn)
        if monitor.bad in ("low", "both"):
            alert_lo[k] = back(c - alert)
        if monitor.bad in ("high", "both"):
            alert_hi[k] = back(c + alert)
    folded = envelope(steps, centre)
    x: list[float] | np.ndarray = steps
    if folded is not None:  # a long run: per bucket, the band's widest extent and the median levels
        lo, hi = fold(steps, lo).low, fold(steps, hi).high
        alert_lo, alert_hi = fold(steps, alert_lo).median, fold(steps, alert_hi).median
        x, centre = folded.x, folded.median
    known = np.isfinite(centre)
    if not known.any():
        return
    warn_sigma, alert_sigma = _level(report, "warn_sigma"), _level(report, "alert_sigma")
    warn_level = f" ({warn_sigma:g} robust σ)" if warn_sigma is not None else ""
    alert_level = f" ({alert_sigma:g} robust σ)" if alert_sigma is not None else ""
    ax.fill_between(x, lo, hi, where=known, color="#bdbdbd", alpha=0.55, linewidth=0, zorder=2,
                    label=f"baseline ± warn level{warn_level}")
    ax.plot(x, centre, color="black", linestyle="--", linewidth=1.0, zorder=3, label="baseline")
    for bound in (alert_lo, alert_hi):
        if np.isfinite(bound).any():
            ax.plot(x, bound, color="black", linestyle=":", linewidth=1.0, zorder=3,
                    label=f"alert level{alert_level}")
