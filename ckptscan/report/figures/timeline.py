"""`timeline`: the flagged layers' alarming monitor against the baseline band
the series rule judged it by, the loss below on the same step axis, the
first alert and the loss divergence marked: the lead time at a glance."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ckptscan.monitors.spec import MonitorSpec
from ckptscan.report.figures.canvas import ALARM_COLOR, WIDTH, matplotlib_pieces
from ckptscan.report.figures.envelope import MAX_POINTS, envelope_note
from ckptscan.report.figures.grid import Grid, headline_monitors
from ckptscan.report.figures.panels import all_layers_panel, layer_panel, loss_panel
from ckptscan.schema.results import ScanReport

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure as MplFigure

MAX_LAYER_PANELS = 4
EVENT_STYLE = {
    "alert": dict(color=ALARM_COLOR, linestyle="-", linewidth=1.6),
    "rollback": dict(color="#555555", linestyle=(0, (1, 1.5)), linewidth=1.2),
    "divergence": dict(color="black", linestyle="--", linewidth=1.4),
}


def draw_timeline(report: ScanReport, grid: Grid) -> tuple[MplFigure, str]:
    """Flagged layers against their baselines, and the loss, on one step axis."""
    mpl = matplotlib_pieces()
    flagged = _flagged_order(report)
    shown = flagged[:MAX_LAYER_PANELS]
    losses = [p.loss for p in report.pairs]
    has_loss = any(v is not None for v in losses)
    # (kind, what it draws): a flagged layer, a headline monitor over every layer, or the loss.
    panels: list[tuple[str, int | MonitorSpec | None]] = [("layer", layer) for layer in shown]
    if not shown:
        panels = [("all", m) for m in headline_monitors(grid)]
    if has_loss:
        panels.append(("loss", None))
    heights = [1.0 if kind != "loss" else 0.85 for kind, _ in panels] or [1.0]
    fig = mpl.Figure(figsize=(WIDTH, 1.2 + 2.0 * sum(heights)), layout="constrained")
    axes = fig.subplots(len(heights), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]

    notes = []
    for ax, (_, what) in zip(axes, panels):
        if isinstance(what, int):
            notes += layer_panel(ax, report, grid, what)
        elif isinstance(what, MonitorSpec):
            all_layers_panel(ax, grid, what)
        else:
            loss_panel(ax, grid, losses)
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
    if len(grid.steps) > MAX_POINTS:
        caption.append(envelope_note(len(grid.steps)))
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


def _events(report: ScanReport) -> list[tuple[float, str, str]]:
    s = report.summary
    events: list[tuple[float, str, str]] = []
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
