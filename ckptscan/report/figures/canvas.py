"""What every figure is drawn with: matplotlib, imported only when a figure
is drawn, the Agg canvas (never pyplot: no global backend switch, no window,
the same bytes for the same report), the page width, the resolution and the
alarm colour."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import TYPE_CHECKING

from ckptscan.errors import CkptScanError

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

INSTALL_HINT = "pip install 'ckptscan[report]'"
MIN_MATPLOTLIB = (3, 7)
DPI = 110
WIDTH = 10.0  # inches
ALARM_COLOR = "#b2182b"


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


def matplotlib_pieces() -> SimpleNamespace:
    """The few matplotlib pieces the figures use, imported on first use."""
    require_matplotlib()
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure as MplFigure

    return SimpleNamespace(Figure=MplFigure, FigureCanvasAgg=FigureCanvasAgg, LogNorm=LogNorm, Normalize=Normalize,
                           colormaps=colormaps)


def png_bytes(fig: MplFigure) -> bytes:
    mpl = matplotlib_pieces()
    mpl.FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    # No "Software" entry: the bytes depend on the report, not on the install.
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()
