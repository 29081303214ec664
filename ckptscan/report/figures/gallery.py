"""Every figure of a report, as PNG bytes, in the order the HTML shows them."""

from __future__ import annotations

from dataclasses import dataclass

from ckptscan.monitors import registry
from ckptscan.report.figures.canvas import png_bytes, require_matplotlib
from ckptscan.report.figures.grid import Grid
from ckptscan.report.figures.heatmap import HEATMAPS, draw_heatmap
from ckptscan.report.figures.layer_profile import draw_layer_profile
from ckptscan.report.figures.timeline import draw_timeline
from ckptscan.schema.results import ScanReport


@dataclass(frozen=True)
class Figure:
    name: str  # file stem for --png: "timeline", "heatmap_delta2_entropy_norm"
    title: str
    caption: str
    png: bytes


def run_figures(report: ScanReport) -> list[Figure]:
    """Every figure of a report, in the order the HTML shows them."""
    require_matplotlib()
    grid = Grid.of(report)
    if len(report.pairs) == 1:
        # One update (ckptscan diff): no time axis; the layers side by side say it all.
        fig, caption = draw_layer_profile(report, grid)
        return [Figure("layers", "Monitors per layer", caption, png_bytes(fig))]
    fig, caption = draw_timeline(report, grid)
    figures = [Figure("timeline", "Flagged layers, loss and lead time", caption, png_bytes(fig))]
    for name in HEATMAPS:
        drawn = draw_heatmap(grid, name)
        if drawn is not None:
            fig, caption = drawn
            figures.append(Figure(f"heatmap_{name}", f"{registry.spec(name).label} (layers × {grid.step_label}s)",
                                  caption, png_bytes(fig)))
    return figures
