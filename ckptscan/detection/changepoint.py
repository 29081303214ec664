"""One-sided CUSUM: the sequential change-point statistic of the series rules.

Page's CUSUM (Page 1954) on a standardised series z_1, z_2, … (in robust
sigmas toward the alarm side):

    C_0 = 0,    C_i = max(0, C_{i-1} + min(z_i, cap) - drift)

It accumulates every departure larger than `drift`, so a small shift that
persists (a slow collapse of an entropy) crosses a threshold h that no single
point reaches, after about h / (shift - drift) points; in-control, C returns
to 0. `drift` is half the smallest shift worth detecting quickly (the
textbook choice k = δ/2). `cap` bounds one point's contribution, so a single
outlier cannot cross h alone (a one-point jump is the instantaneous rules'
business). The change-point estimate is the last index at which C was 0
before it crossed: where the departure began.

Textbook check (tests/detection/test_changepoint.py): for i.i.d. N(μ, 1)
and k = 0.5, h = 5, the average run length is ≈ 938 in control (μ = 0) and
≈ 10.4 at μ = 1 (Siegmund's approximation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Cusum:
    drift: float  # k: subtracted from each z (robust sigmas)
    cap: float = math.inf  # a point contributes at most this

    def step(self, previous: float, z: float) -> float:
        return max(0.0, previous + min(z, self.cap) - self.drift)

    def run(self, zs: Sequence[float | None]) -> list[float | None]:
        """C_i for every point; a missing z (None or nan) leaves C unchanged and gives None."""
        out: list[float | None] = []
        c = 0.0
        for z in zs:
            if z is None or math.isnan(z):
                out.append(None)
                continue
            c = self.step(c, z)
            out.append(c)
        return out


def first_crossing(stats: Sequence[float | None], threshold: float) -> int | None:
    """Index of the first statistic ≥ threshold, or None."""
    return next((i for i, c in enumerate(stats) if c is not None and c >= threshold), None)


def change_point(stats: Sequence[float | None], index: int) -> int:
    """Where the excursion that is under way at `index` began: the first index
    after the last zero of C before `index` (C > 0 from there on). A point
    without a statistic (not judged yet) counts as a zero."""
    start = index
    while start > 0 and (before := stats[start - 1]) is not None and before > 0:
        start -= 1
    return start


@dataclass
class Excursion:
    """`change_point` as the statistics arrive, one at a time, in O(1): the
    change point at i is the one at i-1 while C_{i-1} > 0, else i itself.

    `label` is what the caller names an index by (a pair's newer step), kept
    for the onset only, so nothing grows with the length of the series."""

    previous: float | None = None  # the statistic of the last index pushed
    onset: int = 0  # change_point(stats, last index)
    onset_label: object = None

    def push(self, index: int, stat: float | None, label: object = None) -> int:
        """Append `stat` (None: not judged) at `index`; return change_point(stats, index)."""
        if not (index > 0 and self.previous is not None and self.previous > 0):
            self.onset, self.onset_label = index, label
        self.previous = stat
        return self.onset

    def to_dict(self) -> dict:
        return {"previous": self.previous, "onset": self.onset, "onset_label": self.onset_label}
