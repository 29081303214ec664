"""`layers`: a single pair (ckptscan diff) has no time axis; each headline
monitor against the layer, its findings marked."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ckptscan.monitors import registry
from ckptscan.report.figures.canvas import ALARM_COLOR, WIDTH, matplotlib_pieces
from ckptscan.report.figures.grid import Grid, headline_monitors
from ckptscan.report.figures.heatmap import axis_unit
from ckptscan.schema.results import ScanReport

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure


def draw_layer_profile(report: ScanReport, grid: Grid) -> tuple[MplFigure, str]:
    """A single pair: each headline monitor against the layer, findings marked."""
    mpl = matplotlib_pieces()
    monitors = headline_monitors(grid) or [registry.spec("delta2_entropy_norm")]
    fig = mpl.Figure(figsize=(WIDTH, 1.0 + 2.2 * len(monitors)), layout="constrained")
    axes = fig.subplots(len(monitors), 1, sharex=True, squeeze=False)[:, 0]
    for ax, monitor in zip(axes, monitors):
        values = grid.values(monitor.read)[:, 0]
        ax.plot(grid.layers, values, color="#2166ac", marker="o", markersize=3.5, linewidth=1.2, zorder=3,
                label="value")
        if np.isfinite(values).any():
            ax.axhline(float(np.nanmedian(values)), color="black", linestyle="--", linewidth=1.0, zorder=2,
                       label="median over layers")
        for severity, shape, size in (("warn", "o", 7), ("alert", "X", 9)):
            hits = [(layer, f.value) for layer in grid.layers for _, f in grid.findings(layer, monitor.name)
                    if f.severity == severity and f.value is not None]
            if hits:
                ax.scatter(*zip(*hits), marker=shape, s=size ** 2, facecolors="white" if severity == "warn"
                           else ALARM_COLOR, edgecolors=ALARM_COLOR, linewidths=1.2, zorder=4, label=severity)
        ax.set_title(f"{monitor.label} ({monitor.family})", loc="left", fontsize=9)
        ax.set_ylabel(axis_unit(monitor), fontsize=9)
        ax.grid(True, color="#e6e6e6", linewidth=0.6)
        ax.legend(loc="best", fontsize=8, frameon=False)
    axes[-1].set_xlabel("layer")
    axes[-1].xaxis.get_major_locator().set_params(integer=True)
    pair = report.pairs[0]
    fig.suptitle(f"{report.command}: {report.summary.status.upper()}, step {pair.from_step} → {pair.to_step}",
                 x=0.01, ha="left", fontsize=11)
    caption = ("One pair of checkpoints: each monitor per layer; dashed: the median over layers (the cross-layer "
               "rule compares each layer with the others); markers: ○ warn, ✕ alert findings of that monitor.")
    return fig, caption
