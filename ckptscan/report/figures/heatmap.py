"""`heatmap_<monitor>`: one per headline monitor, layers × steps, with each
warn/alert finding of that monitor marked on its cell."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ckptscan.monitors import registry
from ckptscan.monitors.spec import MonitorSpec
from ckptscan.report.figures.canvas import WIDTH, matplotlib_pieces
from ckptscan.report.figures.grid import Grid, nan_reduce
from ckptscan.report.sparkline import cells

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

# Beyond these, neighbouring columns (pairs) or rows (layers) are folded
# into one cell: a cell narrower than ~3 pixels shows nothing.
MAX_COLUMNS = 200
MAX_ROWS = 96


@dataclass(frozen=True)
class Heatmap:
    marked: tuple[str, ...]  # monitors whose findings are marked on it
    title: str  # the colour bar and y-axis are labelled with the monitor's unit


# One heatmap per headline monitor, in this order.
HEATMAPS = {
    "delta2_entropy_norm": Heatmap(("delta2_entropy_norm", "delta2_entropy_norm_min"),
                                   "Δ2 (QK update) spectral entropy, mean over heads"),
    "dwq_entropy_norm": Heatmap(("dwq_entropy_norm",), "ΔW_q spectral entropy, mean over heads"),
    "epsilon": Heatmap(("epsilon",), "router ε = max_e ‖w_e − w̄‖ / ‖w̄‖"),
    "routing_entropy_norm": Heatmap(("routing_entropy_norm",), "routing entropy on the probe, mean over tokens"),
}


def draw_heatmap(grid: Grid, name: str) -> tuple[MplFigure, str] | None:
    """Layers × pairs of one monitor, its findings marked; None when it has no value."""
    monitor, heat = registry.spec(name), HEATMAPS[name]
    unit = axis_unit(monitor)
    values = grid.values(monitor.read)
    if np.isnan(values).all():
        return None
    marks = grid.marks(heat.marked)
    rows = cells(len(grid.layers), MAX_ROWS)
    cols = cells(len(grid.steps), MAX_COLUMNS)
    values = _fold(_fold(values, cols, monitor.bad, axis=1), rows, monitor.bad, axis=0)
    marks = _fold_marks(_fold_marks(marks, cols, axis=1), rows, axis=0)
    x_edges = [grid.edges[c.start] for c in cols] + [grid.edges[cols[-1].stop]]

    mpl = matplotlib_pieces()
    height = min(10.0, max(2.8, 1.5 + 0.085 * len(rows)))
    fig = mpl.Figure(figsize=(WIDTH, height), layout="constrained")
    ax = fig.add_subplot()
    finite = values[np.isfinite(values)]
    lo, hi = float(finite.min()), float(finite.max())
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5e-3, hi + 0.5e-3
    norm = mpl.Normalize(lo, hi)
    if monitor.log and lo > 0 and hi / lo > 10:
        norm = mpl.LogNorm(lo, hi)
    cmap = mpl.colormaps["viridis"].with_extremes(bad=(0, 0, 0, 0))
    mesh = ax.pcolormesh(x_edges, np.arange(len(rows) + 1) - 0.5, np.ma.masked_invalid(values), cmap=cmap,
                         norm=norm, shading="flat")
    # Missing cells show the hatched background.
    ax.set_facecolor("#e0e0e0")
    ax.patch.set_hatch("////")
    ax.patch.set_edgecolor("#b0b0b0")
    fig.colorbar(mesh, ax=ax, label=unit, pad=0.01, aspect=max(12, 3 * height))

    centres = [(x_edges[k] + x_edges[k + 1]) / 2 for k in range(len(cols))]
    cell_pt = min(0.82 * WIDTH * 72 / len(cols), (height - 1.2) * 72 / len(rows))
    size = min(9.0, max(3.0, 0.8 * cell_pt)) ** 2
    for level, shape, label in ((1, "o", "warn"), (2, "X", "alert")):
        r, c = np.nonzero(marks == level)
        if len(r):
            ax.scatter([centres[k] for k in c], r, s=size * (1.4 if level == 2 else 1.0), marker=shape,
                       facecolors="white", edgecolors="black", linewidths=0.7, label=label, zorder=3)
    if marks.any():
        ax.legend(loc="lower right", bbox_to_anchor=(1, 1), ncol=2, fontsize=8, frameon=False,
                  borderaxespad=0.2, handletextpad=0.2)

    ax.set_xlim(x_edges[0], x_edges[-1])
    ax.set_ylim(len(rows) - 0.5, -0.5)  # layer 0 on top, as in the tables
    tick_every = max(1, math.ceil(len(rows) / 24))
    ticks = list(range(0, len(rows), tick_every))
    ax.set_yticks(ticks, [_row_label(grid.layers, rows[t]) for t in ticks], fontsize=8)
    ax.set_xlabel(grid.step_label)
    ax.set_ylabel("layer")
    ax.set_title(heat.title, loc="left", fontsize=10)

    where = ("drawn over its steps, older → newer checkpoint" if grid.consecutive
             else f"centred on its newer checkpoint's {grid.step_label}")
    notes = [f"Rows: layers; columns: pairs of checkpoints, each {where}. Colour: {unit} (viridis: dark is "
             "low, reads in greyscale); hatched: no value (weights not changed, not finite, or not present)."]
    if marks.any():
        notes.append("Markers: ○ warn, ✕ alert, from this monitor's findings or non-finite weights.")
    else:
        notes.append("No finding of this monitor.")
    side = {"low": "lowest", "high": "highest", "both": "farthest from the median"}[monitor.bad]
    if len(cols) < len(grid.steps):
        notes.append(f"{len(grid.steps)} pairs folded into {len(cols)} columns of up to {max(map(len, cols))} "
                     f"pairs, each showing the {side} value (the alarm side) and its worst finding.")
    if len(rows) < len(grid.layers):
        notes.append(f"{len(grid.layers)} layers folded into {len(rows)} rows of up to {max(map(len, rows))} "
                     f"layers, each showing the {side} value and the worst finding.")
    if isinstance(norm, mpl.LogNorm):
        notes.append("Log colour scale.")
    return fig, " ".join(notes)


def _fold(values: np.ndarray, groups: list[range], bad: str, axis: int) -> np.ndarray:
    """Fold groups of columns (axis 1) or rows (axis 0) into one, keeping
    the alarm side's extreme so that a short excursion stays visible."""
    if len(groups) == values.shape[axis]:
        return values
    moved = np.moveaxis(values, axis, 0)
    folded = []
    for group in groups:
        block = moved[group.start: group.stop]
        if bad == "low":
            folded.append(nan_reduce(np.nanmin, block))
        elif bad == "high":
            folded.append(nan_reduce(np.nanmax, block))
        else:
            centre = nan_reduce(np.nanmedian, moved)
            distance = np.where(np.isnan(block), -np.inf, np.abs(block - centre))
            pick = np.take_along_axis(block, distance.argmax(axis=0)[None], axis=0)[0]
            folded.append(pick)
    return np.moveaxis(np.stack(folded), 0, axis)


def _fold_marks(marks: np.ndarray, groups: list[range], axis: int) -> np.ndarray:
    if len(groups) == marks.shape[axis]:
        return marks
    moved = np.moveaxis(marks, axis, 0)
    return np.moveaxis(np.stack([moved[g.start: g.stop].max(axis=0) for g in groups]), 0, axis)


def _row_label(layers: list[int], rows: range) -> str:
    first, last = layers[rows.start], layers[rows.stop - 1]
    return str(first) if first == last else f"{first}–{last}"


def axis_unit(monitor: MonitorSpec) -> str:
    """What a monitor's axis is labelled: its unit, else its label."""
    return monitor.unit if monitor.unit is not None else monitor.label
