"""Long runs on the timeline: a line of thousands of pairs, thinned to its
min/max envelope.

A 10-inch figure has ~1,000 pixel columns: a series of 2,000 pairs drawn
point by point is a blot of overlapping markers, and most of its points fall
on the pixels of their neighbours. Past MAX_POINTS pairs, a line is drawn
through, for every bucket of consecutive pairs (MAX_POINTS / 2 buckets), the
pair of its lowest and the pair of its highest value, in step order, so
every excursion keeps its full height, plus every pair with a warn or alert
finding (a flagged step is always a point of the line), the first and last
pairs, and the first pair of every gap (so a gap stays a gap). Shorter
series are drawn whole, exactly as before.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from ckptscan.report.sparkline import cells

MAX_POINTS = 400


def envelope_indices(values: np.ndarray, keep: Iterable[int] = (), max_points: int = MAX_POINTS
                     ) -> np.ndarray | None:
    """The indices of `values` to draw, in order; None when the series has
    at most `max_points` values and is drawn whole. `keep`: indices always
    drawn (the flagged pairs)."""
    n = len(values)
    if n <= max_points:
        return None
    missing = np.isnan(values)
    chosen = {0, n - 1, *keep}
    for group in cells(n, max_points // 2):
        block = values[group.start: group.stop]
        present = ~missing[group.start: group.stop]
        if present.any():
            where = np.flatnonzero(present)
            chosen.add(group.start + int(where[np.argmin(block[present])]))
            chosen.add(group.start + int(where[np.argmax(block[present])]))
    # The first value of each run of missing values breaks the line there.
    starts = np.flatnonzero(missing & ~np.concatenate(([False], missing[:-1])))
    chosen.update(int(i) for i in starts)
    return np.array(sorted(i for i in chosen if 0 <= i < n), dtype=int)


def thinned(steps: Sequence[float], values: np.ndarray, keep: Iterable[int] = ()
            ) -> tuple[Sequence[float], np.ndarray, bool]:
    """(x, y, thinned): the points of the line to draw; the series itself
    when it is short enough to draw whole."""
    index = envelope_indices(values, keep)
    if index is None:
        return steps, values, False
    return np.asarray(steps, dtype=float)[index], values[index], True


def envelope_note(count: int) -> str:
    """The caption's words for a thinned timeline."""
    per = -(-count // (MAX_POINTS // 2))
    return (f"{count} pairs: each line is drawn through the lowest and the highest value of every {per} "
            "consecutive pairs and through every pair with a finding, so no excursion and no flagged step is "
            "dropped; no per-pair markers.")
