"""The self-baseline alarm on one (layer, monitor) series over a run.

A healthy run is not stationary, so a value is judged against what the
series' own healthy history predicts, not against a fixed number:

- trend: a robust local baseline from the last `window` accepted (healthy)
  points: their median level, plus their Theil–Sen slope when the monitor is
  known to drift in healthy runs (routing entropy falls as experts
  specialise). A slope away from a one-sided monitor's alarm side is never
  extrapolated: a rising entropy that then plateaus must not look like a fall.
- level: for monitors that do not drift in healthy runs, also the frozen
  level of the first `window` accepted points after warm-up. It catches a
  slow departure that the trailing baseline would absorb.
- reference: an expected value and scale per point from a known-healthy run
  (judged point by point; it does not feed the CUSUM).

The noise sigma comes from the successive differences of the healthy points
(a slow trend shifts their median, not their spread), floored at the
monitor's resolution `min_scale` and inflated while few points are known.
A point's departure ("excess") is how many sigmas it lies beyond the
expected value on the alarm side (one-sided; for "both", on the side it
lies), the largest over the rules. A warning needs `consecutive` points in a
row at ≥ `warn_sigma`, or one point at ≥ `alert_sigma`; an alert needs
`consecutive` points in a row at ≥ `alert_sigma`. A point at ≥ `warn_sigma`
by the run's own rules (trend, level) is never accepted into the baseline: a
fault must not teach the baseline. A reference only adds its judgement: the
self-baseline is the same with references as without.

Sequential rule (`detection/changepoint.py`): the trend excesses also feed a
one-sided CUSUM, C_i = max(0, C_{i-1} + min(excess_i, cap) - drift), which
accumulates a small persistent departure that never reaches `warn_sigma`
on any single point. C ≥ `cusum_warn` is a warning and C ≥ `cusum_alert` an
alert (rule "cusum"); its onset is the change-point estimate, the point where
C last left 0. The thresholds are set from healthy runs to a stated
false-alarm rate (experiments/calibrate.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ckptscan.detection.changepoint import Cusum, Excursion

# MAD -> standard deviation for normal data.
MAD_TO_SIGMA = 1.4826
# The variance of a median of n normal values is about (π/2)·σ²/n.
MEDIAN_VARIANCE = math.pi / 2
# Noise is estimated from the last NOISE_WINDOWS baseline windows of healthy points.
NOISE_WINDOWS = 4
# Small-sample inflation of the noise estimate: × (1 + SMALL_SAMPLE / number of differences).
SMALL_SAMPLE = 4.0


@dataclass(frozen=True)
class SeriesSpec:
    bad: str  # "low" | "high" | "both": the alarm side
    min_scale: float  # smallest sigma (in judged units): the resolution below which changes do not matter
    follow_trend: bool = False  # healthy runs drift: extrapolate the drift (toward the alarm side only)
    log: bool = False  # judge log(value): a positive, scale-dependent metric
    sequential: bool = True  # also judged by the CUSUM (off for a monitor that creeps in healthy runs)


@dataclass(frozen=True)
class SeriesSettings:
    warn_sigma: float = 4.0
    alert_sigma: float = 6.0
    consecutive: int = 2
    window: int = 8  # healthy points in a baseline
    min_points: int = 5  # fewer healthy points than this: the self-baseline is not judged yet
    start: int = 0  # index of the first point after warm-up
    # CUSUM of the excesses (robust sigmas): drift k, per-point cap, thresholds h.
    cusum_drift: float = 1.0
    cusum_cap: float = 6.0
    cusum_warn: float = math.inf
    cusum_alert: float = math.inf


@dataclass(frozen=True)
class Expectation:
    """An externally given expected value and robust sigma, in judged units.
    `band_factor`: set when a band of references gave it, the factor its
    sigma was scaled by (so a departure in the band's own sigmas is known)."""

    center: float
    scale: float
    band_factor: float | None = None


@dataclass
class Point:
    """The verdict on one point. Values are in the monitor's own units."""

    state: str  # "missing" | "warmup" | "baseline" | "ok" | "warn" | "alert"
    value: float | None = None
    expected: float | None = None
    excess: float | None = None  # robust sigmas beyond `expected` on the alarm side
    rule: str | None = None  # "trend" | "level" | "reference": the rule that saw the largest excess
    warn_at: float | None = None  # value at which the point reaches warn_sigma
    alert_at: float | None = None
    onset: int | None = None  # index where the current run of departures began
    cusum: float | None = None  # the CUSUM statistic after this point (robust sigmas accumulated)
    # The departure from the run's recent trend: what the CUSUMs
    # accumulate. `excess` may come from a reference run; this never does.
    own_excess: float | None = None
    # The departure from a band of references in the band's own sigmas
    # (band factor 1; detection/layer_band.py), where a band judged the point.
    band_departure: float | None = None


@dataclass
class _Judgement:
    excess: float
    center: float
    scale: float
    rule: str
    side: float  # +1: the alarm bound is above the center, -1: below


def _judge(y: float, center: float, scale: float, rule: str, bad: str) -> _Judgement:
    """One-sided departure toward the alarm side (for "both", toward the side y is on)."""
    side = -1.0 if bad == "low" or (bad == "both" and y < center) else 1.0
    return _Judgement(side * (y - center) / scale, center, scale, rule, side)


def median(values: Sequence[float]) -> float:
    """statistics.median, without its generality: judging takes hundreds of
    medians of a few dozen values per pair (the same value, bit for bit)."""
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def robust_center_scale(values: Sequence[float], min_scale: float) -> tuple[float, float]:
    """Median and MAD-based sigma, the sigma floored at `min_scale`."""
    center = median(values)
    mad = median([abs(v - center) for v in values])
    return center, max(MAD_TO_SIGMA * mad, min_scale)


def difference_scale(values: Sequence[float], min_scale: float) -> float:
    """Noise sigma from successive differences: a slow trend moves their
    median, not their spread, so drift does not pass for noise."""
    diffs = [b - a for a, b in zip(values, values[1:])]
    if not diffs:
        return min_scale
    # A difference of two independent points has √2 times their sigma.
    return max(robust_center_scale(diffs, 0.0)[1] / math.sqrt(2), min_scale)


def theil_sen_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Median of the pairwise slopes: a line fit that ignores outliers."""
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs))
        for j in range(i + 1, len(xs))
        if xs[j] != xs[i]
    ]
    return median(slopes) if slopes else 0.0


def track(
    steps: Sequence[float],
    values: Sequence[float | None],
    spec: SeriesSpec,
    settings: SeriesSettings,
    reference: Sequence[Expectation | None] | None = None,
) -> list[Point]:
    """Judge every point of a series in step order, as a nightly job would have
    seen it (each verdict uses only earlier points): the fold of `SeriesState`."""
    state = SeriesState(spec, settings)
    return [state.update(step, raw, reference[i] if reference is not None else None, warmup=i < settings.start)
            for i, (step, raw) in enumerate(zip(steps, values))]


class SeriesState:
    """What judging the next point of one series needs from the points before
    it, and nothing that grows with their number: the first `window` accepted
    (healthy) points (the frozen level), the last NOISE_WINDOWS × `window`
    (trend and noise), the current run of departures, and the CUSUM."""

    def __init__(self, spec: SeriesSpec, settings: SeriesSettings) -> None:
        self.spec, self.settings = spec, settings
        self.count = 0  # points seen (the index of the next one)
        self.accepted = 0  # healthy points accepted so far
        self.level: list[float] = []  # judged values of the first `window` accepted points
        self.recent: list[list[float]] = []  # [step, judged value] of the last accepted points
        self.recent_values: list[float] = []  # their judged values (the noise's, without unpacking `recent`)
        self.level_center: float | None = None  # the frozen level's median, once it has its `window` points
        self.streak = 0  # length of the current run of points at ≥ warn_sigma
        self.streak_start: int | None = None
        self.streak_label: object = None
        self.streak_tail: list[float] = []  # excesses of its last `consecutive` points
        self.total = 0.0  # the CUSUM after the last judged point
        self.excursion = Excursion()
        self.newest: tuple[float, float | None] | None = None  # last (value, expected) with a value: the summary's
        self.onset_label: object = None  # the label of the last point's onset (for its finding)

    def update(self, step: float, raw: float | None, external: Expectation | None = None, *, warmup: bool = False,
               label: object = None) -> Point:
        """The verdict on the next point. `warmup`: judged by nothing yet;
        `label`: what names this point's index to the caller (kept for onsets)."""
        point = self._judge(step, raw, external, warmup, label)
        if raw is not None:
            self.newest = (raw, point.expected)
        return point

    def _judge(self, step: float, raw: float | None, external: Expectation | None, warmup: bool, label: object
               ) -> Point:
        spec, settings = self.spec, self.settings
        i = self.count
        self.count += 1
        self.onset_label = None
        y = judged_value(raw, spec.log)
        if math.isnan(y):
            self.excursion.push(i, None, label)
            return Point("missing", raw)
        if warmup and external is None:
            self.excursion.push(i, None, label)
            return Point("warmup", raw)
        if not warmup and self.accepted < settings.min_points and external is None:
            self._accept(step, y)
            self.excursion.push(i, None, label)
            return Point("baseline", raw)
        # During warm-up only a band of other runs judges (they went through the
        # same warm-up); the run's own baseline starts after it.
        judgements = []
        if not warmup and self.accepted >= settings.min_points:
            noise = _noise(self.recent_values, spec.min_scale)
            window = self.recent[-settings.window:]
            judgements.append(_trend([x for x, _ in window], [v for _, v in window], step, y, noise, spec))
            if not spec.follow_trend:
                judgements.append(_level(self.level, self.level_center, y, noise, spec))
        if external is not None:
            judgements.append(_judge(y, external.center, external.scale, "reference", spec.bad))
        worst = max(judgements, key=lambda j: j.excess)
        # The CUSUM accumulates departures from the recent trend only. The
        # frozen post-warm-up level and a reference run each differ from a
        # healthy run by a persistent offset — the level because a healthy
        # entropy settles slowly for thousands of steps (a wider model saved
        # every 50 steps drifts 2-3 σ below its early level), a reference by
        # seed and data order — which a CUSUM would add up into an alarm on
        # every long enough run; both are judged point by point.
        own = max((j.excess for j in judgements if j.rule == "trend"), default=None)
        band = None
        if external is not None and external.band_factor is not None:
            band = judgements[-1].excess * external.band_factor  # the reference's judgement is the last
        cusum = Cusum(settings.cusum_drift, settings.cusum_cap)
        self.total = cusum.step(self.total, own) if own is not None else self.total
        change = self.excursion.push(i, self.total, label)
        if worst.excess >= settings.warn_sigma:
            if not self.streak:
                self.streak_start, self.streak_label = i, label
            self.streak += 1
            self.streak_tail = (self.streak_tail + [worst.excess])[-settings.consecutive:]
        else:
            self.streak, self.streak_start, self.streak_label, self.streak_tail = 0, None, None, []
        # What the run's own rules saw decides whether the point joins its own
        # baseline: a reference only adds judgements, so the self-baseline (and
        # its CUSUM) is the same with references as without. Were a point that a
        # tight band warns on kept out, the baseline would go stale on a healthy
        # run and its trend departures would add up to a false alarm.
        own_worst = max((j.excess for j in judgements if j.rule != "reference"), default=-math.inf)
        if not warmup and own_worst < settings.warn_sigma:
            self._accept(step, y)
        state = "ok"
        if self.streak >= settings.consecutive:
            state = "alert" if all(e >= settings.alert_sigma for e in self.streak_tail) else "warn"
        elif worst.excess >= settings.alert_sigma:
            state = "warn"  # a large departure is worth a warning at once; an alert needs it confirmed
        rule, onset, self.onset_label = worst.rule, self.streak_start, self.streak_label
        # A point under warn_sigma still joins the baseline while the CUSUM is positive: the frozen
        # level (non-drifting monitors) keeps a slow departure visible after the trailing median follows it.
        sequential = "ok"
        if spec.sequential and self.total >= settings.cusum_alert:
            sequential = "alert"
        elif spec.sequential and self.total >= settings.cusum_warn:
            sequential = "warn"
        if _RANK[sequential] > _RANK[state]:
            state, rule, onset, self.onset_label = sequential, "cusum", change, self.excursion.onset_label
        return Point(
            state=state,
            value=raw,
            expected=_unjudged(worst.center, spec.log),
            excess=worst.excess,
            rule=rule,
            warn_at=_unjudged(worst.center + worst.side * settings.warn_sigma * worst.scale, spec.log),
            alert_at=_unjudged(worst.center + worst.side * settings.alert_sigma * worst.scale, spec.log),
            onset=onset,
            cusum=self.total if spec.sequential else None,
            own_excess=own,
            band_departure=band,
        )

    def _accept(self, step: float, y: float) -> None:
        self.accepted += 1
        if len(self.level) < self.settings.window:
            self.level.append(y)
            if len(self.level) == self.settings.window:
                self.level_center = median(self.level)
        self.recent.append([step, y])
        self.recent_values.append(y)
        kept = NOISE_WINDOWS * self.settings.window
        del self.recent[:-kept], self.recent_values[:-kept]

    def live_labels(self) -> list[object]:
        """Labels a later point's onset may still name: the start of the
        current run of departures, and of the CUSUM excursion under way."""
        labels = [self.streak_label] if self.streak else []
        if self.excursion.previous is not None and self.excursion.previous > 0:
            labels.append(self.excursion.onset_label)
        return labels

    def to_dict(self) -> dict:
        return {"count": self.count, "accepted": self.accepted, "level": self.level, "recent": self.recent,
                "streak": self.streak, "streak_start": self.streak_start, "streak_label": self.streak_label,
                "streak_tail": self.streak_tail, "total": self.total, "excursion": self.excursion.to_dict(),
                "newest": list(self.newest) if self.newest is not None else None}

    @classmethod
    def from_dict(cls, spec: SeriesSpec, settings: SeriesSettings, data: dict) -> SeriesState:
        state = cls(spec, settings)
        for name in ("count", "accepted", "level", "recent", "streak", "streak_start", "streak_label",
                     "streak_tail", "total"):
            setattr(state, name, data[name])
        state.recent_values = [y for _, y in state.recent]
        if len(state.level) >= settings.window:
            state.level_center = median(state.level)
        state.excursion = Excursion(**data["excursion"])
        state.newest = tuple(data["newest"]) if data["newest"] is not None else None
        return state


_RANK = {"ok": 0, "warn": 1, "alert": 2}


def _noise(values: list[float], min_scale: float) -> float:
    """Noise sigma of the healthy points, inflated while there are few of them
    (a spread estimated from 3 differences can be far too small)."""
    return difference_scale(values, min_scale) * (1 + SMALL_SAMPLE / (len(values) - 1))


def _trend(xs: list[float], ys: list[float], x: float, y: float, noise: float, spec: SeriesSpec) -> _Judgement:
    """Departure from the local robust baseline of the last healthy points."""
    n = len(ys)
    slope = theil_sen_slope(xs, ys) if spec.follow_trend else 0.0
    # Only a drift toward the alarm side is extrapolated.
    if spec.bad == "low" and slope > 0 or spec.bad == "high" and slope < 0:
        slope = 0.0
    if slope == 0:
        center = median(ys)
        widen = math.sqrt(1 + MEDIAN_VARIANCE / n)
    else:
        intercept = median([yj - slope * xj for xj, yj in zip(xs, ys)])
        center = intercept + slope * x
        # Prediction interval of a fitted line: extrapolating further is less certain.
        mean_x = sum(xs) / n
        spread = sum((xj - mean_x) ** 2 for xj in xs)
        widen = math.sqrt(1 + MEDIAN_VARIANCE / n + ((x - mean_x) ** 2 / spread if spread > 0 else 0.0))
    return _judge(y, center, noise * widen, "trend", spec.bad)


def _level(ys: list[float], center: float | None, y: float, noise: float, spec: SeriesSpec) -> _Judgement:
    """Departure from the frozen level of the first healthy points after
    warm-up (`center`: their median, once they are all there)."""
    return _judge(y, median(ys) if center is None else center, noise * math.sqrt(1 + MEDIAN_VARIANCE / len(ys)),
                  "level", spec.bad)


def judged_value(raw: float | None, log: bool) -> float:
    """A monitor's value in judged units (its log for log monitors); nan
    where it has none: missing, non-finite, or not positive on a log scale."""
    if raw is None or not math.isfinite(raw):
        return math.nan
    if log:
        return math.log(raw) if raw > 0 else math.nan
    return float(raw)


def _unjudged(value: float, log: bool) -> float:
    """A judged (log) value back in the monitor's units. A threshold whose
    log lies past exp's range (a very wide sigma) is infinite, never an
    OverflowError; the report writes it as null, like every non-finite value."""
    if not log:
        return value
    try:
        return math.exp(value)
    except OverflowError:
        return math.inf


def first_judged(from_steps: Sequence[int | None], warmup_pairs: int, warmup_steps: int) -> int:
    """Index of the first pair after warm-up: at least `warmup_pairs` pairs,
    and every pair whose older checkpoint is before `warmup_steps`."""
    start = min(warmup_pairs, len(from_steps))
    while start < len(from_steps) and (from_steps[start] or 0) < warmup_steps:
        start += 1
    return start
