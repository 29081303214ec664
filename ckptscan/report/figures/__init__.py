"""Figures of a run's health, as PNG bytes: where and when it went wrong.

One module per figure kind: `timeline` (flagged layers against their
baselines, the loss and the lead time; its panels in `panels`), `heatmap`
(layers × steps per headline monitor), `layer_profile` (a single pair);
`gallery` draws every figure of a report, `grid` reads a report as
layers × pairs and `canvas` holds matplotlib, imported only when a figure
is drawn.
"""

from ckptscan.report.figures.canvas import (
    ALARM_COLOR,
    DPI,
    INSTALL_HINT,
    MIN_MATPLOTLIB,
    WIDTH,
    require_matplotlib,
)
from ckptscan.report.figures.gallery import Figure, run_figures
from ckptscan.report.figures.grid import Grid
from ckptscan.report.figures.heatmap import HEATMAPS, MAX_COLUMNS, MAX_ROWS, Heatmap, draw_heatmap
from ckptscan.report.figures.layer_profile import draw_layer_profile
from ckptscan.report.figures.timeline import EVENT_STYLE, LEGEND_ORDER, MAX_LAYER_PANELS, draw_timeline
