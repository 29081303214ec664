"""Sparklines: a series over a run in one line of block characters.

A long run is folded into at most `width` cells, each the mean of its pairs
(and, for colouring, the worst status among them). A cell with no value is a
space. Each line is scaled to its own range: sparklines show shape, the
table's numbers show size.
"""

from __future__ import annotations

import math
from typing import Sequence

from ckptscan.schema.results import worst

BLOCKS = "▁▂▃▄▅▆▇█"


def cells(count: int, width: int) -> list[range]:
    """Split indices 0..count-1 into at most `width` consecutive, near-equal groups."""
    groups = min(count, width)
    return [range(g * count // groups, (g + 1) * count // groups) for g in range(groups)]


def sparkline(values: Sequence[float | None], width: int = 40) -> str:
    means = [_mean([values[i] for i in group]) for group in cells(len(values), width)]
    finite = [m for m in means if m is not None]
    if not finite:
        return " " * len(means)
    lo, hi = min(finite), max(finite)
    span = hi - lo
    return "".join(
        " " if m is None else BLOCKS[0 if span <= 0 else min(len(BLOCKS) - 1, int((m - lo) / span * len(BLOCKS)))]
        for m in means
    )


def cell_statuses(statuses: Sequence[str], width: int = 40) -> list[str]:
    """The worst status of each cell of `sparkline(…, width)`."""
    return [worst([statuses[i] for i in group]) for group in cells(len(statuses), width)]


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None
