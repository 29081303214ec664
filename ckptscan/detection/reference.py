"""Known-healthy reference runs (`--reference`, one or several).

A run judged only against itself cannot see a fault that is there from the
first checkpoint: its own past is already faulty. Other runs of the same
model and schedule can: the previous attempt, the pilot, the other members
of a sweep. Their reports give, for each pair of the judged run, an expected
value and sigma per (layer, monitor).

- One reference: the robust level (median, MAD sigma) of the reference
  pairs nearest in step, so the reference follows the healthy run's own
  warm-up and drift. One run says nothing about how much healthy runs differ
  from each other (seed, data order: router ε by ~7 of one run's sigmas), so
  its sigma is widened by `reference_scale_factor`: gross departures only.
- Several references: a band. Each reference's value is interpolated at the
  judged step (runs need not share checkpoint steps); the centre is their
  median; the sigma is the spread between the references, pooled over the
  `count` steps nearest in step, together with their step-to-step jitter,
  widened for the few runs it rests on and by `band_scale_factor`
  (calibrated like every threshold: experiments/calibrate.py). A band knows
  how far healthy runs stray from each other, so it can be much tighter
  than one reference widened by a guess.

Alignment is by step. A reference covers steps from its first to its last
pair; beyond that it gives nothing (the others, or the run's own history,
judge those pairs), and the report says so. Monitors of the update between
two checkpoints (Δ2 and ΔW entropies) depend on how many steps apart they
are, so a reference saved at another interval (more than 1.5× apart) is not
compared on them. References of another architecture are refused.

Two types: a `ReferenceRun` is one known-healthy run as the user named it,
resolved (its report, and the file or run directory it came from): what a
request's references become (`api.resolve_references`), what a run spec
holds and what the judge is given, one type all the way. `Expectations` is
what the judge makes of them under its thresholds (`expectations`): the
members' pairs after warm-up, aligned by step, asked for an expected value
and sigma per judged point.
"""

from __future__ import annotations

import bisect
import math
import statistics
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

from ckptscan.detection.catalog import JudgedMonitor, judged_monitors
from ckptscan.detection.series import (
    Expectation,
    difference_scale,
    first_judged,
    judged_value,
    robust_center_scale,
)
from ckptscan.errors import CkptScanError
from ckptscan.schema.results import LayerResult, ModelInfo, PairResult, ScanReport

# A reference saved more than this many times more (or less) often is not
# compared on the monitors of an update (their level depends on the interval).
INTERVAL_RATIO = 1.5
# Likewise a reference trained at another learning rate: Adam's update is
# about lr per step, so the update monitors of a run at 10× the LR depart from
# healthy references at the usual LR by the LR alone (the natural corpus: a
# QK-norm run at 3e-2 against references at 3e-3). Only compared where the
# two LRs at the judged step are within this ratio (both known).
LR_RATIO = 2.0
# Fewest references that make a band (one reference: the widened single-run rule).
BAND_MIN_RUNS = 2


@dataclass
class Member:
    """One reference run: its pairs' values per layer, in step order."""

    path: str
    steps: list[float]  # newer step of each pair after the member's warm-up
    layers: dict[int, list[LayerResult]]  # layer -> its results on those pairs
    all_steps: list[float]  # newer step of every pair (the band's view: warm-up included)
    all_layers: dict[int, list[LayerResult]]
    interval: float | None  # median steps between a pair's two checkpoints
    # (newer step, learning rate) of each pair whose LR the run stated, in step order, and those steps
    # alone (for bisect: `_same_lr` runs for every judged point).
    lrs: list[tuple[float, float]] = field(default_factory=list)
    lr_steps: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Known:
    """One member's series: its (step, judged value) pairs, their steps (for
    bisect without a key function: a third of a band's cost was that key) and
    whether they ascend."""

    points: list[tuple[float, float]]
    steps: list[float]
    ordered: bool


@dataclass(frozen=True)
class Widening:
    """How a reference's expectation is formed: from the `count` pairs
    nearest the judged step, its sigma widened by `scale_factor` when one run
    gives it (for the spread between runs one run cannot show) and by
    `band_factor` when a band of runs does."""

    count: int
    scale_factor: float
    band_factor: float = 1.0


@dataclass(frozen=True)
class ReferenceRun:
    """A known-healthy run to judge against, resolved: its report (read
    from a JSON file, or the scan of its run directory) and where it came
    from (the file or run directory as named; None for a report object
    given as it is). One type from the request to the judge."""

    report: ScanReport
    path: str | None = None

    @property
    def name(self) -> str:
        """How the report names this reference: its path, else the run its report was made of."""
        return self.path or str(self.report.settings.get("run", "the reference report"))


def reference_runs(reports: ScanReport | Sequence[ScanReport] | None,
                   paths: str | Sequence[str | None] | None = None) -> tuple[ReferenceRun, ...]:
    """The reference runs of the older shapes: one report or several (or
    None), and the path of each (one path, a list, or None: from no file;
    missing paths are None)."""
    listed = [reports] if isinstance(reports, ScanReport) else list(reports or [])
    named: list[str | None] = [paths] if paths is None or isinstance(paths, str) else list(paths)
    named = (named + [None] * len(listed))[:len(listed)]
    return tuple(ReferenceRun(report, path) for report, path in zip(listed, named))


@dataclass
class Expectations:
    """What known-healthy runs expect of a judged run (the module docstring):
    one member per `ReferenceRun`, asked for an expected value and sigma per
    (layer, monitor, step)."""

    path: str  # the references' files, comma-separated
    model: dict
    members: list[Member]
    _series: dict = field(default_factory=dict, repr=False, compare=False)  # `_known`'s, per (member, layer, monitor)

    @property
    def steps(self) -> list[float]:
        return self.members[0].steps

    @property
    def layers(self) -> dict[int, list[LayerResult]]:
        return self.members[0].layers

    def check_model(self, model: ModelInfo) -> None:
        theirs = _model_fields(model)
        mismatched = [f"{k}: {v} vs {theirs[k]}" for k, v in self.model.items() if k in theirs and theirs[k] != v]
        if mismatched:
            raise CkptScanError(f"the reference run is of a different model ({'; '.join(mismatched)})",
                                path=self.path)

    def expectation(self, layer: int, monitor: JudgedMonitor, step: float, widening: Widening,
                    interval: float | None = None, warmup: bool = False,
                    lr: float | None = None) -> Expectation | None:
        """Expected value and sigma of `monitor` in `layer` at `step`, in the
        monitor's judged units; None where no reference has a value there.
        `widening`: the pairs pooled and the factors the sigma is widened by.
        `interval`: the judged pair's steps between checkpoints (a reference
        saved at another interval is not compared on update monitors).
        `warmup`: the judged pair is in the run's warm-up, which only a band
        judges: the band's members have values there, at the same steps of
        the same schedule, while one reference is known by its pairs after
        its own warm-up only. `lr`: the judged pair's learning rate (a
        reference trained at another LR is not compared on update monitors)."""
        usable = [m for m, member in enumerate(self.members)
                  if _comparable(member, monitor, interval) and _same_lr(member, monitor, step, lr)]
        if len(self.members) < BAND_MIN_RUNS:
            return self._single(usable[0], layer, monitor, step, widening) if usable and not warmup \
                else None
        covering = [m for m in usable if self._covers(m, layer, monitor, step)]
        if len(covering) >= BAND_MIN_RUNS:
            return self._band(covering, layer, monitor, step, widening)
        if covering and not warmup:  # one reference left here: judged like a single reference
            return self._single(covering[0], layer, monitor, step, widening)
        return None

    def _single(self, m: int, layer: int, monitor: JudgedMonitor, step: float, widening: Widening
                ) -> Expectation | None:
        """One run's local level: the median of its `widening.count` judged
        pairs nearest in step; its sigma widened by `widening.scale_factor`
        for the spread between runs that one run cannot show."""
        count, scale_factor = widening.count, widening.scale_factor
        known = self._known(m, layer, monitor, False)
        if not known.points:
            return None
        nearest = _nearest(known, step, count)
        center, scale = robust_center_scale([y for _, y in nearest], monitor.spec.min_scale)
        return Expectation(center, scale * math.sqrt(1 + 1 / len(nearest)) * scale_factor)

    def _band(self, members: list[int], layer: int, monitor: JudgedMonitor, step: float, widening: Widening
              ) -> Expectation:
        """The band of several runs at `step` (see the module docstring)."""
        count, band_factor = widening.count, widening.band_factor
        series = [self._known(m, layer, monitor, True) for m in members]
        values = [_interpolate(known, step) for known in series]
        center = statistics.median(values)
        # Between-run spread, pooled over the `count` steps nearest to `step`
        # of the first reference (one step's spread of 2-3 runs is too noisy).
        grid = [s for s, _ in _nearest(series[0], step, count)]
        squares, freedom = 0.0, 0
        for s in grid:
            here = [_interpolate(known, s) for known in series if known.steps[0] <= s <= known.steps[-1]]
            if len(here) >= 2:
                mean = sum(here) / len(here)
                squares += sum((v - mean) ** 2 for v in here)
                freedom += len(here) - 1
        between = math.sqrt(squares / freedom) if freedom else 0.0
        # fmean, not mean: mean's exact rational sum was a third of judging against a band.
        jitter = statistics.fmean(
            difference_scale([y for _, y in sorted(_nearest(known, step, 2 * count))], monitor.spec.min_scale)
            ** 2 for known in series)
        scale = max(math.sqrt(between ** 2 + jitter), monitor.spec.min_scale)
        return Expectation(center, scale * math.sqrt(1 + 1 / len(members)) * band_factor, band_factor)

    def _covers(self, m: int, layer: int, monitor: JudgedMonitor, step: float) -> bool:
        steps = self._known(m, layer, monitor, True).steps
        if not steps:
            return False
        slack = (self.members[m].interval or 0.0) / 2  # a checkpoint's worth either side
        return steps[0] - slack <= step <= steps[-1] + slack

    def _known(self, m: int, layer: int, monitor: JudgedMonitor, everything: bool) -> Known:
        """Member `m`'s (step, judged value) pairs of a series; `everything`:
        every pair (the band's), sorted by step, else the pairs after warm-up
        in report order. Worked out once per series, not per judged pair."""
        key = (m, layer, monitor.name, everything)
        if key not in self._series:
            member = self.members[m]
            steps, layers = (member.all_steps, member.all_layers) if everything else (member.steps, member.layers)
            known = [(s, y) for s, r in zip(steps, layers.get(layer) or [])
                     if not math.isnan(y := judged_value(monitor.read(r), monitor.spec.log))]
            if everything:
                known.sort(key=lambda sy: sy[0])
            steps = [s for s, _ in known]
            self._series[key] = Known(known, steps, all(a <= b for a, b in zip(steps, steps[1:])))
        return self._series[key]

    def coverage_notes(self, pairs: Sequence[PairResult]) -> list[str]:
        """What the report should say about how the references were used for
        these pairs: references that end early, or were saved at another interval."""
        steps = [p.to_step for p in pairs if p.to_step is not None]
        if not steps:
            return []
        interval = _median_interval(pairs)
        notes = []
        for member in self.members:
            if member.all_steps and max(steps) > max(member.all_steps) + (member.interval or 0) / 2:
                notes.append(f"reference {member.path} ends at step {max(member.all_steps):.0f}: later pairs "
                             "are judged against the other references, or only against the run's own history")
            if not _same_interval(member.interval, interval):
                updates = ", ".join(m.name for m in judged_monitors() if m.per_update and m.across_runs)
                notes.append(f"reference {member.path} was saved every {member.interval:.0f} steps, this run every "
                             f"{interval:.0f}: not compared on the update monitors ({updates})")
            run_lr = _median([p.lr for p in pairs if p.lr is not None])
            member_lr = _median([lr for _, lr in member.lrs])
            if run_lr is not None and member_lr is not None and _ratio(run_lr, member_lr) > LR_RATIO:
                updates = ", ".join(m.name for m in judged_monitors() if m.per_update and m.across_runs)
                notes.append(f"reference {member.path} trained at a learning rate of {member_lr:.3g}, this run at "
                             f"{run_lr:.3g} (medians): not compared on the update monitors ({updates}) where the two "
                             f"differ by more than {LR_RATIO:g}×")
        return notes


def _comparable(member: Member, monitor: JudgedMonitor, interval: float | None) -> bool:
    return not monitor.per_update or _same_interval(member.interval, interval)


def _same_lr(member: Member, monitor: JudgedMonitor, step: float, lr: float | None) -> bool:
    """Whether the member's LR at `step` (its pair nearest in step) is within
    LR_RATIO of the judged pair's; True where either is unknown or the monitor
    is of one checkpoint's state."""
    if not monitor.per_update or lr is None or lr <= 0 or not member.lrs:
        return True
    position = bisect.bisect_left(member.lr_steps, step)
    near = [member.lrs[i] for i in (position - 1, position) if 0 <= i < len(member.lrs)]
    member_lr = min(near, key=lambda sl: abs(sl[0] - step))[1]
    return member_lr > 0 and _ratio(lr, member_lr) <= LR_RATIO


def _ratio(a: float, b: float) -> float:
    return max(a, b) / min(a, b)


def _median(values: list[float]) -> float | None:
    positive = [v for v in values if v > 0]
    return float(statistics.median(positive)) if positive else None


def _same_interval(a: float | None, b: float | None) -> bool:
    if a is None or b is None or a <= 0 or b <= 0:
        return True  # unknown: steps are not named; nothing to compare
    return max(a, b) / min(a, b) <= INTERVAL_RATIO


def _interpolate(known: Known, step: float) -> float:
    """Linear interpolation in step between the reference pairs around `step`
    (`known` ascending); the end value just outside the covered steps."""
    points = known.points
    position = bisect.bisect_left(known.steps, step)
    if position == 0:
        return points[0][1]
    if position == len(points):
        return points[-1][1]
    (x0, y0), (x1, y1) = points[position - 1], points[position]
    return y0 if x1 == x0 else y0 + (y1 - y0) * (step - x0) / (x1 - x0)


def _nearest(series: Known, step: float, count: int) -> list[tuple[float, float]]:
    """The `count` entries nearest to `step`, ties to the earlier entry (a
    stable sort by distance). With ascending steps, only the entries around
    `step` are sorted: the nearest `count` lie within `count` places of it,
    and every entry as near as the `count`-th is added, so ties break alike."""
    known = series.points
    if not series.ordered:
        return sorted(known, key=lambda sy: abs(sy[0] - step))[:count]
    position = bisect.bisect_left(series.steps, step)
    lo, hi = max(0, position - count), min(len(known), position + count)
    kth = sorted(abs(known[j][0] - step) for j in range(lo, hi))[min(count, hi - lo) - 1]
    while lo > 0 and abs(known[lo - 1][0] - step) <= kth:
        lo -= 1
    while hi < len(known) and abs(known[hi][0] - step) <= kth:
        hi += 1
    return sorted(known[lo:hi], key=lambda sy: abs(sy[0] - step))[:count]


def _median_interval(pairs: Sequence[PairResult]) -> float | None:
    gaps = [p.to_step - p.from_step for p in pairs if p.to_step is not None and p.from_step is not None
            and p.to_step > p.from_step]
    return float(statistics.median(gaps)) if gaps else None


def _by_layer(pairs: Sequence[PairResult]) -> dict[int, list[LayerResult]]:
    """Each layer's results on `pairs`, an empty result where a pair lacks the layer."""
    layers: dict[int, list[LayerResult]] = {}
    for pair in pairs:
        for layer in pair.layers:
            layers.setdefault(layer.layer, [])
    for pair in pairs:
        by_layer = {layer.layer: layer for layer in pair.layers}
        for number, results in layers.items():
            results.append(by_layer.get(number, LayerResult(number)))
    return layers


def _member(run: ReferenceRun, warmup_pairs: int, warmup_steps: int) -> Member:
    pairs = run.report.pairs
    start = first_judged([p.from_step for p in pairs], warmup_pairs, warmup_steps)
    judged = pairs[start:] or pairs

    def steps(chosen: Sequence[PairResult]) -> list[float]:
        return [float(p.to_step) if p.to_step is not None else float(i) for i, p in enumerate(chosen)]
    lrs = sorted((float(p.to_step), p.lr) for p in pairs if p.to_step is not None and p.lr is not None)
    return Member(run.name, steps(judged), _by_layer(judged),
                  steps(pairs), _by_layer(pairs), _median_interval(pairs), lrs, [s for s, _ in lrs])


MODEL_FIELDS = ("family", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "num_experts")


def _model_fields(model: ModelInfo) -> dict:
    """What a reference must share with the run: the architecture (its family,
    "qwen3-like" read as "qwen3": a Llama is no reference for a QK-norm Qwen3 of
    the same shape) and the shape."""
    fields = {k: getattr(model, k) for k in MODEL_FIELDS if hasattr(model, k)}
    if isinstance(fields.get("family"), str):
        fields["family"] = fields["family"].removesuffix("-like")
    return fields


def expectations(runs: Sequence[ReferenceRun], warmup_pairs: int, warmup_steps: int) -> Expectations:
    """The expectations of known-healthy runs (their reports: trend or diff),
    each known by its pairs after warm-up; all of one model, else a
    CkptScanError naming the odd one."""
    if not runs:
        raise CkptScanError("no reference report given")
    members = [_member(run, warmup_pairs, warmup_steps) for run in runs]
    models = [_model_fields(run.report.model) for run in runs]
    for member, model in zip(members[1:], models[1:]):
        mismatched = [f"{k}: {v} vs {models[0].get(k)}" for k, v in model.items() if models[0].get(k) != v]
        if mismatched:
            raise CkptScanError(f"the references are of different models ({'; '.join(mismatched)}; "
                                f"against {members[0].path})", path=member.path)
    return Expectations(", ".join(m.path for m in members), models[0], members)


def reference_from_reports(reports: Sequence[ScanReport], warmup_pairs: int, warmup_steps: int,
                           paths: Sequence[str | None] | None = None) -> Expectations:
    """`expectations` of these reports, from the files `paths` (the older
    shape: the reports and their paths as two lists)."""
    named = list(paths) if paths is not None else [None] * len(reports)
    return expectations([ReferenceRun(report, path) for report, path in zip(reports, named)],
                        warmup_pairs, warmup_steps)


def reference_from_report(report: ScanReport, warmup_pairs: int, warmup_steps: int, path: str | None = None
                          ) -> Expectations:
    """The expectations of one known-healthy run's report, from its pairs after warm-up."""
    return expectations([ReferenceRun(report, path)], warmup_pairs, warmup_steps)


def __getattr__(name: str) -> Any:
    """`Reference`, the expectations' old name (it named a second class too,
    the resolved run, now `ReferenceRun`): `Expectations`, with a DeprecationWarning."""
    if name == "Reference":
        warnings.warn("ckptscan.detection.reference.Reference is deprecated: it is Expectations (the resolved "
                      "reference run is ReferenceRun)", DeprecationWarning, stacklevel=2)
        return Expectations
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
