"""Figures of a run's health, as PNG bytes: where and when it went wrong.

- `timeline`: the flagged layers' alarming monitor against the baseline band
  the series rule judged it by, the loss below on the same step axis, the
  first alert and the loss divergence marked: the lead time at a glance.
- `heatmap_<monitor>`: one per headline monitor, layers × steps, with each
  warn/alert finding of that monitor marked on its cell.

The bands are what detection stored in the report: each series point's
expected value and its warn and alert levels (`LayerResult.judgements`),
including a reference run's expectations where that rule judged the point.
Nothing is judged again here.

matplotlib is an optional extra, imported only when a figure is drawn. The
figures use `Figure` and the Agg canvas directly, never pyplot: no global
backend switch, no window, the same bytes for the same report.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ckptscan.detection.catalog import BY_NAME, Monitor
from ckptscan.detection.rules import Thresholds
from ckptscan.errors import CkptScanError
from ckptscan.report.sparkline import cells
from ckptscan.results import Finding, LayerResult, ScanReport, SeriesPoint

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure as MplFigure

INSTALL_HINT = "pip install 'ckptscan[report]'"
MIN_MATPLOTLIB = (3, 7)

# Beyond these, neighbouring columns (pairs) or rows (layers) are folded
# into one cell: a cell narrower than ~3 pixels shows nothing.
MAX_COLUMNS = 200
MAX_ROWS = 96
MAX_LAYER_PANELS = 4
DPI = 110
WIDTH = 10.0  # inches


@dataclass(frozen=True)
class Heatmap:
    marked: tuple[str, ...]  # monitors whose findings are marked on it
    title: str
    unit: str  # colour-bar and y-axis label


# One heatmap per headline monitor, in this order.
HEATMAPS = {
    "delta2_entropy_norm": Heatmap(("delta2_entropy_norm", "delta2_entropy_norm_min"),
                                   "Δ2 (QK update) spectral entropy, mean over heads", "H / ln n"),
    "dwq_entropy_norm": Heatmap(("dwq_entropy_norm",), "ΔW_q spectral entropy, mean over heads", "H / ln r"),
    "epsilon": Heatmap(("epsilon",), "router ε = max_e ‖w_e − w̄‖ / ‖w̄‖", "ε"),
    "routing_entropy_norm": Heatmap(("routing_entropy_norm",), "routing entropy on the probe, mean over tokens",
                                    "H(p) / ln E"),
}

ALARM_COLOR = "#b2182b"
EVENT_STYLE = {
    "alert": dict(color=ALARM_COLOR, linestyle="-", linewidth=1.6),
    "rollback": dict(color="#555555", linestyle=(0, (1, 1.5)), linewidth=1.2),
    "divergence": dict(color="black", linestyle="--", linewidth=1.4),
}


@dataclass(frozen=True)
class Figure:
    name: str  # file stem for --png: "timeline", "heatmap_delta2_entropy_norm"
    title: str
    caption: str
    png: bytes


def require_matplotlib() -> None:
    """Fail early, with the fix, when figures are asked for but cannot be drawn."""
    try:
        import matplotlib
    except ImportError:
        raise CkptScanError(f"the HTML report and PNG figures need matplotlib, which is not installed: "
                            f"{INSTALL_HINT}") from None
    if tuple(int(p) for p in matplotlib.__version__.split(".")[:2] if p.isdigit()) < MIN_MATPLOTLIB:
        raise CkptScanError(f"the HTML report needs matplotlib ≥ {'.'.join(map(str, MIN_MATPLOTLIB))} "
                            f"(found {matplotlib.__version__}): {INSTALL_HINT}")


def run_figures(report: ScanReport) -> list[Figure]:
    """Every figure of a report, in the order the HTML shows them."""
    require_matplotlib()
    grid = Grid.of(report)
    if len(report.pairs) == 1:
        # One update (ckptscan diff): no time axis; the layers side by side say it all.
        fig, caption = draw_layer_profile(report, grid)
        return [Figure("layers", "Monitors per layer", caption, _png(fig))]
    fig, caption = draw_timeline(report, grid)
    figures = [Figure("timeline", "Flagged layers, loss and lead time", caption, _png(fig))]
    for name in HEATMAPS:
        drawn = draw_heatmap(grid, name)
        if drawn is not None:
            fig, caption = drawn
            figures.append(Figure(f"heatmap_{name}", f"{BY_NAME[name].label} (layers × {grid.step_label}s)",
                                  caption, _png(fig)))
    return figures


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
        if not to_steps or any(s is None for s in to_steps):
            index = [float(i) for i in range(len(to_steps))]
            return cls(layers, results, index, [i - 0.5 for i in range(len(to_steps) + 1)], "pair", False)
        steps = [float(s) for s in to_steps]
        froms = [p.from_step for p in report.pairs]
        consecutive = froms[0] is not None and all(a == b for a, b in zip(to_steps, froms[1:]))
        if consecutive:
            edges = [float(froms[0])] + steps
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


# ---------------------------------------------------------------- heatmaps

def draw_heatmap(grid: Grid, name: str) -> tuple[MplFigure, str] | None:
    """Layers × pairs of one monitor, its findings marked; None when it has no value."""
    monitor, heat = BY_NAME[name], HEATMAPS[name]
    unit = heat.unit
    values = grid.values(monitor.read)
    if np.isnan(values).all():
        return None
    marks = grid.marks(heat.marked)
    rows = cells(len(grid.layers), MAX_ROWS)
    cols = cells(len(grid.steps), MAX_COLUMNS)
    values = _fold(_fold(values, cols, monitor.spec.bad, axis=1), rows, monitor.spec.bad, axis=0)
    marks = _fold_marks(_fold_marks(marks, cols, axis=1), rows, axis=0)
    x_edges = [grid.edges[c.start] for c in cols] + [grid.edges[cols[-1].stop]]

    mpl = _matplotlib()
    height = min(10.0, max(2.8, 1.5 + 0.085 * len(rows)))
    fig = mpl.Figure(figsize=(WIDTH, height), layout="constrained")
    ax = fig.add_subplot()
    finite = values[np.isfinite(values)]
    lo, hi = float(finite.min()), float(finite.max())
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5e-3, hi + 0.5e-3
    norm = mpl.Normalize(lo, hi)
    if monitor.spec.log and lo > 0 and hi / lo > 10:
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
    side = {"low": "lowest", "high": "highest", "both": "farthest from the median"}[monitor.spec.bad]
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
            folded.append(_nan_reduce(np.nanmin, block))
        elif bad == "high":
            folded.append(_nan_reduce(np.nanmax, block))
        else:
            centre = _nan_reduce(np.nanmedian, moved)
            distance = np.where(np.isnan(block), -np.inf, np.abs(block - centre))
            pick = np.take_along_axis(block, distance.argmax(axis=0)[None], axis=0)[0]
            folded.append(pick)
    return np.moveaxis(np.stack(folded), 0, axis)


def _nan_reduce(reduce: Callable[..., np.ndarray], block: np.ndarray) -> np.ndarray:
    """`reduce` over axis 0 ignoring nan; nan where a column has no value (and no warning)."""
    out = np.full(block.shape[1:], np.nan)
    present = ~np.isnan(block).all(axis=0)
    out[present] = reduce(block[:, present], axis=0)
    return out


def _fold_marks(marks: np.ndarray, groups: list[range], axis: int) -> np.ndarray:
    if len(groups) == marks.shape[axis]:
        return marks
    moved = np.moveaxis(marks, axis, 0)
    return np.moveaxis(np.stack([moved[g.start: g.stop].max(axis=0) for g in groups]), 0, axis)


def _row_label(layers: list[int], rows: range) -> str:
    first, last = layers[rows.start], layers[rows.stop - 1]
    return str(first) if first == last else f"{first}–{last}"


# ---------------------------------------------------------------- one pair

def draw_layer_profile(report: ScanReport, grid: Grid) -> tuple[MplFigure, str]:
    """A single pair: each headline monitor against the layer, findings marked."""
    mpl = _matplotlib()
    monitors = _headline_monitors(grid) or [BY_NAME["delta2_entropy_norm"]]
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
        ax.set_ylabel(_unit(monitor), fontsize=9)
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


# ---------------------------------------------------------------- timeline

def draw_timeline(report: ScanReport, grid: Grid) -> tuple[MplFigure, str]:
    """Flagged layers against their baselines, and the loss, on one step axis."""
    mpl = _matplotlib()
    flagged = _flagged_order(report)
    shown = flagged[:MAX_LAYER_PANELS]
    losses = [p.loss for p in report.pairs]
    has_loss = any(v is not None for v in losses)
    panels: list[tuple[str, object]] = [("layer", layer) for layer in shown]
    if not shown:
        panels = [("all", m) for m in _headline_monitors(grid)]
    if has_loss:
        panels.append(("loss", None))
    heights = [1.0 if kind != "loss" else 0.85 for kind, _ in panels] or [1.0]
    fig = mpl.Figure(figsize=(WIDTH, 1.2 + 2.0 * sum(heights)), layout="constrained")
    axes = fig.subplots(len(heights), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]

    thresholds = _thresholds(report)
    notes = []
    for ax, (kind, what) in zip(axes, panels):
        if kind == "layer":
            notes += _layer_panel(ax, report, grid, what, thresholds)
        elif kind == "all":
            _all_layers_panel(ax, grid, what)
        else:
            _loss_panel(ax, grid, losses)
    if not panels:
        axes[0].text(0.5, 0.5, "no monitor values in this report", ha="center", va="center",
                     transform=axes[0].transAxes)
    events = _events(report)
    warmup_end = report.settings.get("warmup_end_step")
    for ax in axes:
        if isinstance(warmup_end, (int, float)) and grid.step_label == "step" and warmup_end > grid.edges[0]:
            ax.axvspan(grid.edges[0], warmup_end, color="#f0f0f0", zorder=0, label="warm-up (not judged)")
        for step, key, label in events:
            ax.axvline(step, label=label, zorder=1, **EVENT_STYLE[key])
        ax.grid(True, axis="y", color="#e6e6e6", linewidth=0.6)
    if has_loss:
        _lead_arrow(axes[-1], report)
    axes[-1].set_xlabel(grid.step_label)
    axes[-1].set_xlim(grid.edges[0], grid.edges[-1])

    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        labels = sorted(entries, key=_legend_rank)
        fig.legend([entries[k] for k in labels], labels, loc="outside lower center", ncol=min(4, len(labels)),
                   fontsize=8, frameon=False)
    fig.suptitle(_headline(report), x=0.01, ha="left", fontsize=11)

    if shown:
        which = f"{len(shown)} of {len(flagged)}, the earliest to fire" if len(flagged) > len(shown) else "all"
        caption = [f"Flagged layers ({which}), each with the monitor of its first alert (else its first warning), "
                   "at the newer step of each pair. Dash-dot: the hard floor, where it is in range. Dashed: the "
                   "baseline the series rule judged each pair against; shaded: baseline ± "
                   "the warn level; dotted: the alert level on the alarm side; markers: ○ warn, ✕ alert "
                   "findings. Thin grey: the same monitor in the other layers (their median)."]
    else:
        caption = ["No layer flagged: the median over all layers, with the range between the lowest and "
                   "highest layer shaded."]
    caption += sorted(set(notes))
    if has_loss:
        caption.append("Bottom: the mean training loss over each pair's updates, from the report's loss log.")
    else:
        caption.append("No loss in the report (ckptscan trend --loss-log adds it).")
    return fig, " ".join(caption)


# Legend entries by label prefix: the data, the band, the findings, then the events.
LEGEND_ORDER = ("flagged layer", "median over", "range over", "median of the other", "the other", "baseline ±",
                "baseline", "alert level", "hard floor", "warn", "alert", "non-finite", "mean loss", "warm-up",
                "rollback", "first alert", "loss divergence")


def _legend_rank(label: str) -> int:
    return next((k for k, prefix in enumerate(LEGEND_ORDER) if label.startswith(prefix)), len(LEGEND_ORDER))


def _headline(report: ScanReport) -> str:
    s = report.summary
    run = str(report.settings.get("run") or "").rstrip("/").split("/")[-1] or report.command
    text = f"{run}: {s.status.upper()}"
    if s.first_family is not None:
        text += f", {s.first_family} monitors fired first at step {s.first_alert_step.get(s.first_family)}"
    if s.loss_divergence_step is not None:
        text += f"; the loss diverged at step {s.loss_divergence_step}"
        if s.lead_steps is not None:
            text += f" ({_lead_text(s.lead_steps)})"
    elif "loss_log" in report.settings:
        text += "; the loss did not diverge"
    return text


def _lead_text(lead: int) -> str:
    return f"lead {lead} steps" if lead >= 0 else f"{-lead} steps after the loss"


def _flagged_order(report: ScanReport) -> list[int]:
    """Flagged layers, the earliest to alert (then to warn) first."""
    flagged = [s for s in report.summary.layers if s.status in ("warn", "alert")]
    never = math.inf
    flagged.sort(key=lambda s: (s.first_alert_step if s.first_alert_step is not None else never,
                                s.first_warn_step if s.first_warn_step is not None else never, s.layer))
    return [s.layer for s in flagged]


def _lead_monitor(report: ScanReport, grid: Grid, layer: int) -> Monitor:
    """The monitor that fired first in a layer (its first alert, else its first warning)."""
    summary = next((s for s in report.summary.layers if s.layer == layer), None)
    names = [summary.first_alert_monitor] if summary is not None and summary.first_alert_monitor else []
    for by_layer in grid.results:
        result = by_layer.get(layer)
        names += [f.monitor for f in result.findings if f.severity in ("warn", "alert")] if result else []
    for name in names:
        if name in BY_NAME:
            return BY_NAME[name]
    # A numeric finding (non-finite weights): show the layer's headline monitor.
    return next((m for m in _headline_monitors(grid)), BY_NAME["delta2_entropy_norm"])


def _headline_monitors(grid: Grid) -> list[Monitor]:
    present = []
    for name in ("delta2_entropy_norm", "routing_entropy_norm", "epsilon"):
        if not np.isnan(grid.values(BY_NAME[name].read)).all():
            present.append(BY_NAME[name])
    if BY_NAME["routing_entropy_norm"] in present and BY_NAME["epsilon"] in present:
        present.remove(BY_NAME["epsilon"])
    return present


def _layer_panel(ax: Axes, report: ScanReport, grid: Grid, layer: int, thresholds: Thresholds | None
                 ) -> list[str]:
    monitor = _lead_monitor(report, grid, layer)
    row = grid.layers.index(layer)
    values = grid.values(monitor.read)
    series = values[row]
    notes = []
    if len(grid.layers) > 1:
        others = np.delete(values, row, axis=0)
        ax.plot(grid.steps, _nan_reduce(np.nanmedian, others), color="#9a9a9a", linewidth=0.9, zorder=2,
                label="the other layer" if len(others) == 1 else "median of the other layers")
    points = _band_points(grid, layer, monitor)
    if points is not None:
        _draw_band(ax, grid.steps, points, monitor, thresholds)
    else:
        notes.append("No band: the report carries no series judgements (a single pair, or an older report).")
    dense = len(grid.steps) > 60  # smaller markers, so that many do not merge into a blot
    ax.plot(grid.steps, series, color="#2166ac", marker="o", markersize=2.5 if dense else 3.5, linewidth=1.3,
            zorder=4, label="flagged layer")
    for severity, shape, size in (("warn", "o", 4.5 if dense else 7), ("alert", "X", 5.5 if dense else 9)):
        hits = [(x, f.value) for x, f in grid.findings(layer, monitor.name) if f.severity == severity
                and f.value is not None]
        if hits:
            ax.scatter(*zip(*hits), marker=shape, s=size ** 2, facecolors="white" if severity == "warn" else
                       ALARM_COLOR, edgecolors=ALARM_COLOR, linewidths=0.8 if dense else 1.2, zorder=5,
                       label=severity)
    floor = getattr(thresholds, f"{monitor.name}_floor", None) if thresholds is not None else None
    low, high = ax.get_ylim()
    if floor is not None and low <= floor <= high:  # never stretch the axis to show a far-away floor
        ax.axhline(floor, color=ALARM_COLOR, linestyle="-.", linewidth=0.9, zorder=3, label="hard floor (alert)")
    title = f"layer {layer}: {monitor.label} ({monitor.family})"
    # Non-finite weights leave the monitors without a value: shade those pairs instead.
    nonfinite = [j for j, by_layer in enumerate(grid.results)
                 if layer in by_layer and any(f.monitor == "nonfinite" for f in by_layer[layer].findings)]
    for j in nonfinite:
        ax.axvspan(grid.edges[j], grid.edges[j + 1], facecolor="#f4c7c3", edgecolor=ALARM_COLOR, hatch="xx",
                   linewidth=0, zorder=1, label="non-finite weights (numeric alert)")
    if nonfinite:
        title += f"; non-finite weights from step {grid.steps[nonfinite[0]]:g}"
    ax.set_title(title, loc="left", fontsize=9)
    ax.set_ylabel(_unit(monitor), fontsize=9)
    return notes


def _unit(monitor: Monitor) -> str:
    return HEATMAPS[monitor.name].unit if monitor.name in HEATMAPS else monitor.label


def _thresholds(report: ScanReport) -> Thresholds | None:
    """The report's effective thresholds, or None when it carries none."""
    if not report.thresholds:
        return None
    known = set(Thresholds.field_names())
    values = {k: v for k, v in report.thresholds.items() if k in known}
    values["disabled_monitors"] = tuple(values.get("disabled_monitors") or ())
    try:
        return Thresholds(**values)
    except (CkptScanError, TypeError):
        return None


def _band_points(grid: Grid, layer: int, monitor: Monitor) -> list[SeriesPoint | None] | None:
    """What detection recorded at each pair of this (layer, monitor) series,
    or None when the report carries no judgements for it."""
    results = [by_layer.get(layer) for by_layer in grid.results]
    points = [r.judgements.get(monitor.name) if r is not None else None for r in results]
    return points if any(p is not None for p in points) else None


def _draw_band(ax: Axes, steps: list[float], points: list[SeriesPoint | None], monitor: Monitor,
               t: Thresholds | None) -> None:
    n = len(points)
    centre, lo, hi, alert_lo, alert_hi = (np.full(n, np.nan) for _ in range(5))
    for k, p in enumerate(points):
        if p is None or p.expected is None or p.warn_at is None or p.alert_at is None:
            continue
        to = math.log if monitor.spec.log else float
        back = math.exp if monitor.spec.log else float
        if monitor.spec.log and min(p.expected, p.warn_at, p.alert_at) <= 0:
            continue
        c, warn, alert = to(p.expected), abs(to(p.warn_at) - to(p.expected)), abs(to(p.alert_at) - to(p.expected))
        centre[k], lo[k], hi[k] = p.expected, back(c - warn), back(c + warn)
        if monitor.spec.bad in ("low", "both"):
            alert_lo[k] = back(c - alert)
        if monitor.spec.bad in ("high", "both"):
            alert_hi[k] = back(c + alert)
    known = np.isfinite(centre)
    if not known.any():
        return
    warn_level = f" ({t.warn_sigma:g} robust σ)" if t is not None else ""
    alert_level = f" ({t.alert_sigma:g} robust σ)" if t is not None else ""
    ax.fill_between(steps, lo, hi, where=known, color="#bdbdbd", alpha=0.55, linewidth=0, zorder=2,
                    label=f"baseline ± warn level{warn_level}")
    ax.plot(steps, centre, color="black", linestyle="--", linewidth=1.0, zorder=3, label="baseline")
    for bound in (alert_lo, alert_hi):
        if np.isfinite(bound).any():
            ax.plot(steps, bound, color="black", linestyle=":", linewidth=1.0, zorder=3,
                    label=f"alert level{alert_level}")


def _all_layers_panel(ax: Axes, grid: Grid, monitor: Monitor) -> None:
    values = grid.values(monitor.read)
    lo, hi = _nan_reduce(np.nanmin, values), _nan_reduce(np.nanmax, values)
    ax.fill_between(grid.steps, lo, hi, where=np.isfinite(lo), color="#bdbdbd", alpha=0.55, linewidth=0, zorder=2,
                    label="range over layers")
    ax.plot(grid.steps, _nan_reduce(np.nanmedian, values), color="#2166ac", marker="o",
            markersize=2.5 if len(grid.steps) > 100 else 3.5, linewidth=1.3, zorder=4, label="median over layers")
    ax.set_title(f"all {len(grid.layers)} layers: {monitor.label} ({monitor.family})", loc="left", fontsize=9)
    ax.set_ylabel(_unit(monitor), fontsize=9)


def _loss_panel(ax: Axes, grid: Grid, losses: list[float | None]) -> None:
    y = np.array([v if v is not None else np.nan for v in losses], dtype=float)
    if grid.consecutive:
        # Each pair's mean loss covers its interval of updates.
        ax.stairs(y, grid.edges, color="#4d4d4d", linewidth=1.4, baseline=None, zorder=4,
                  label="mean loss over each pair")
    else:
        ax.plot(grid.steps, y, color="#4d4d4d", linewidth=1.4, zorder=4, label="mean loss over each pair")
    ax.set_ylabel("loss", fontsize=9)
    ax.set_title("training loss: mean over each pair's updates", loc="left", fontsize=9)


def _events(report: ScanReport) -> list[tuple[float, str, str]]:
    s = report.summary
    events = []
    if s.rollback_candidate is not None and s.rollback_candidate.step is not None:
        events.append((s.rollback_candidate.step, "rollback", f"rollback candidate (step {s.rollback_candidate.step})"))
    first = s.first_alert_step.get(s.first_family) if s.first_family is not None else None
    if first is not None:
        events.append((first, "alert", f"first alert (step {first}, {s.first_family})"))
    if s.loss_divergence_step is not None:
        events.append((s.loss_divergence_step, "divergence", f"loss divergence (step {s.loss_divergence_step})"))
    return events


def _lead_arrow(ax: Axes, report: ScanReport) -> None:
    """A double arrow from the first alert to the loss divergence, labelled with the lead."""
    s = report.summary
    first = s.first_alert_step.get(s.first_family) if s.first_family is not None else None
    if first is None or s.loss_divergence_step is None or s.lead_steps is None:
        return
    transform = ax.get_xaxis_transform()  # x in steps, y in axes fraction
    ax.annotate("", xy=(s.loss_divergence_step, 0.82), xytext=(first, 0.82), xycoords=transform,
                arrowprops=dict(arrowstyle="<->", color=ALARM_COLOR, linewidth=1.4, shrinkA=0, shrinkB=0))
    ax.text((first + s.loss_divergence_step) / 2, 0.86, _lead_text(s.lead_steps), transform=transform,
            ha="center", va="bottom", fontsize=9, color=ALARM_COLOR, fontweight="bold", zorder=6,
            bbox=dict(facecolor="white", edgecolor="none", pad=1.0))


# ---------------------------------------------------------------- matplotlib

def _matplotlib() -> SimpleNamespace:
    """The few matplotlib pieces used here, imported on first use."""
    require_matplotlib()
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure as MplFigure

    return SimpleNamespace(Figure=MplFigure, FigureCanvasAgg=FigureCanvasAgg, LogNorm=LogNorm, Normalize=Normalize,
                           colormaps=colormaps)


def _png(fig: MplFigure) -> bytes:
    mpl = _matplotlib()
    mpl.FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    # No "Software" entry: the bytes depend on the report, not on the install.
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()
