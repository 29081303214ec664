"""Long runs on the timeline: a series of thousands of pairs drawn as its
min/max envelope.

A 10-inch figure has ~1,000 pixel columns: a series of 2,000 pairs drawn
point by point is a blot of overlapping markers and zigzags. Past
MAX_POINTS pairs, a line is folded into BUCKETS buckets of consecutive
pairs, each drawn as the range between its lowest and highest value (shaded:
a one-pair excursion keeps its full height) and its median (the line).
What was flagged is not folded: the warn and alert findings stay points at
their own step and value (the panels scatter them from the report), and a
bucket's range includes them. Shorter series are drawn whole, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ckptscan.report.sparkline import cells

MAX_POINTS = 400
BUCKETS = 200  # ~5 pixel columns each on the page


@dataclass(frozen=True)
class Envelope:
    """A series folded into buckets of consecutive pairs (nan: a bucket without a value)."""

    x: np.ndarray  # each bucket's middle step
    low: np.ndarray
    high: np.ndarray
    median: np.ndarray
    pairs_per_bucket: int  # the most pairs in a bucket

    @property
    def label(self) -> str:
        return f"{self.pairs_per_bucket} pairs"


def envelope(steps: Sequence[float], values: np.ndarray, max_points: int = MAX_POINTS, buckets: int = BUCKETS
             ) -> Envelope | None:
    """The series folded into `buckets`; None when it has at most `max_points` values (drawn whole)."""
    if len(values) <= max_points:
        return None
    return fold(steps, values, buckets)


def fold(steps: Sequence[float], values: np.ndarray, buckets: int = BUCKETS) -> Envelope:
    """The series folded into `buckets`, however short (`envelope` folds only a long one)."""
    groups = cells(len(values), buckets)
    x = np.array([(steps[g.start] + steps[g.stop - 1]) / 2 for g in groups], dtype=float)
    low, high, median = (np.full(len(groups), np.nan) for _ in range(3))
    for k, g in enumerate(groups):
        block = values[g.start: g.stop]
        block = block[~np.isnan(block)]
        if len(block):
            low[k], high[k], median[k] = block.min(), block.max(), np.median(block)
    return Envelope(x, low, high, median, max(len(g) for g in groups))


def envelope_note(count: int) -> str:
    """The caption's words for a folded timeline."""
    per = -(-count // BUCKETS)
    return (f"{count} pairs: each line is folded into buckets of up to {per} consecutive pairs, drawn as their "
            "median (the line) and the range from their lowest to their highest value (shaded), so no excursion "
            "is lost; every warn and alert finding is still drawn at its own step.")
