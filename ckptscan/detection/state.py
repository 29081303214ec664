"""JudgeState: the detection state of a run, carried from pair to pair.

Judging a run is a fold: `add` judges the next pair from this state alone,
in O(layers × monitors × window), however many pairs came before; batch
`judge` folds every pair through it (`detection/judge.py`), so the two
cannot differ. What is kept:

- the warm-up position: the index of the first judged pair once known
  (`first_judged`: at least `warmup_pairs` pairs, and every pair whose older
  step is before `warmup_steps`, which only ever looks at earlier pairs);
- per (layer position, monitor): a `SeriesState` (accepted healthy points,
  frozen level, noise window, run of departures, CUSUM and its onset, the
  newest value and baseline for the summary);
- per pooled monitor: its `PooledCusum`;
- per layer position, with a band of references: its `LayerBand` (the
  mean departure of its attention update monitors on the previous pair),
  and for the run its `RunBand` (the mean of those over the layers);
- the running summary (`SummaryState`), and, until the first alert, the
  newest pair of each step that an alarm under way may still name as its
  onset (a restarted run repeats steps).

What it assumed is `basis` (the effective thresholds, the reference run's
identity): judging under another basis changes earlier verdicts, so a
caller whose basis changed starts a new state and folds again from the
first pair (`detection/judge.py` `SeriesJudge`). A single pair is judged
like `diff` (`rules.judge_alone`), not by this fold: with a second pair the
first becomes warm-up, so the state judges it as the first pair of a run.

`to_dict` / `from_dict`: a JSON-able dict with a version, for `trend`'s
cache and a restarted `watch`.
"""

from __future__ import annotations

from typing import Any, cast

from ckptscan.detection.absolute import after_warmup_findings, first_pair_findings
from ckptscan.detection.catalog import JudgedMonitor, judged_monitors
from ckptscan.detection.changepoint import Excursion
from ckptscan.detection.findings import (
    cross_layer_applies,
    cross_layer_findings,
    judgement,
    layer_status,
    point_findings,
)
from ckptscan.detection.layer_band import LayerBand, RunBand
from ckptscan.detection.pooled import PooledCusum, pooled
from ckptscan.detection.reference import Expectations, Widening
from ckptscan.detection.series import Point, SeriesState
from ckptscan.detection.summary import Baselines, Onset, SummaryState
from ckptscan.detection.thresholds import Thresholds
from ckptscan.errors import CkptScanError
from ckptscan.schema.results import NOT_JUDGED, PairResult, counted, worst

# 2: the summary keeps the families alerting with the first (primary family); 3: each layer's LayerBand;
# 4: the run's RunBand; 5: the summary counts the pairs judged and why the others were not, and
# the newest pair's learning rate
STATE_VERSION = 5
# The states of a series point that a rule judged (detection/series.py); "warmup", "baseline" and
# "missing" are not.
JUDGED = ("ok", "warn", "alert")


def band_factor(t: Thresholds, monitor: JudgedMonitor) -> float:
    """How much a band of references is widened for `monitor` (its calibration differs for updates and states)."""
    return t.band_scale_factor if monitor.per_update else t.band_state_scale_factor


class JudgeState:
    """The detection state after the pairs judged so far (see the module docstring)."""

    def __init__(self, thresholds: Thresholds, reference: Expectations | None = None,
                 basis: dict[str, Any] | None = None) -> None:
        self.thresholds, self.reference = thresholds, reference
        self.basis = basis if basis is not None else {"thresholds": thresholds.as_dict(),
                                                      "reference": reference.path if reference else None}
        self.count = 0  # pairs judged
        self.start: int | None = None  # index of the first pair after warm-up, once seen
        self.warmup_end: int | None = None  # its older step
        self.layers: list[int] | None = None  # layer number at each position, from the first pair
        self.series: list[dict[str, SeriesState]] = []
        self.pooled = {m.name: PooledCusum(m) for m in pooled() if m.name not in thresholds.disabled_monitors}
        self.layer_bands: list[LayerBand] = []
        self.run_band = RunBand()
        self.summary = SummaryState(thresholds)
        self.onsets: dict[int, Onset] = {}  # newer step -> the newest pair with it (until the first alert)
        self.lr_before: float | None = None  # the learning rate of the newest pair judged (update.py)
        self.monitors = [m for m in judged_monitors() if m.name not in thresholds.disabled_monitors]

    def add(self, pair: PairResult) -> PairResult:
        """Judge the next pair: its layers' findings, judgements and statuses,
        and its status are set in place; returns the pair."""
        t, index = self.thresholds, self.count
        self.count += 1
        first_pair_findings(pair, t)
        if self.start is None and index >= t.warmup_pairs and (pair.from_step or 0) >= t.warmup_steps:
            self.start, self.warmup_end = index, pair.from_step
        judged = self.start is not None
        lr_before, self.lr_before = self.lr_before, pair.lr
        # The hard floors are not applied in the warm-up: at the end of the LR ramp healthy runs' Δ2
        # entropy dips toward and below them (0.221 on a healthy calibration run of the natural corpus,
        # 0.156 on a held-out one, step 100 → 200; docs/detection.md, warm-up). Those pairs are not
        # judged, and say so (`diff` of such a pair, knowing no warm-up, applies them: rules.judge_alone).
        if judged:
            after_warmup_findings(pair, t, lr_before)
        if self.layers is None:
            self.layers = [layer.layer for layer in pair.layers]
            settings = t.series_settings(0)
            self.series = [{m.name: SeriesState(m.spec, settings) for m in self.monitors} for _ in self.layers]
            self.layer_bands = [LayerBand() for _ in self.layers]
        verdicts = self._series(index, pair, judged)
        if self._band:
            # Each layer's band mean on this pair, as its LayerBand (in `_series`) just took it.
            found = self.run_band.update([band.previous for band in self.layer_bands], verdicts, pair.to_step, t)
            if found is not None and found[0] < len(pair.layers):
                pair.layers[found[0]].findings.append(found[1])
        if len(self.layers) >= 2:  # one layer: its own CUSUM already is the pooled one
            for name, pooled in self.pooled.items():
                found = pooled.update(index, [v.get(name) for v in verdicts], pair.to_step, t)
                if found is not None:
                    position, finding = found
                    pair.layers[position].findings.append(finding)
        # Until a layer has a baseline of its own, compare it with the other layers.
        cross_layer = self.start is not None and index < self.start + t.min_baseline_pairs
        if cross_layer:
            cross_layer_findings(pair, t)
        series_judged = any(point.state in JUDGED for points in verdicts for point in points.values())
        if not (series_judged or (cross_layer and cross_layer_applies(pair, t))):
            pair.not_judged_reason = self._not_judged_reason(judged)
        for layer in pair.layers:
            layer.status = layer_status(layer)
            if pair.not_judged_reason is not None and layer.status == "ok":
                layer.status = NOT_JUDGED
        pair.status = worst([layer.status for layer in pair.layers])
        if pair.not_judged_reason is not None and pair.status == "ok":
            pair.status = NOT_JUDGED
        self._summarise(index, pair)
        return pair

    def _not_judged_reason(self, past_warmup: bool) -> str:
        """Why a pair that no rule of its position could judge was not (the hard floors and the
        non-finite check judge every pair)."""
        t = self.thresholds
        if not past_warmup:
            before = f" and those before step {t.warmup_steps}" if t.warmup_steps else ""
            return f"warm-up (the first {counted(t.warmup_pairs, 'pair')}{before})"
        return (f"no baseline yet (the {counted(t.min_baseline_pairs, 'pair')} after the warm-up make each series' "
                "baseline)")

    @property
    def _band(self) -> bool:
        """Whether the references make a band (the layer-band rule's only input)."""
        return self.reference is not None and len(self.reference.members) >= 2

    def _series(self, index: int, pair: PairResult, judged: bool) -> list[dict[str, Point]]:
        """The next point of every (layer, monitor) series: findings and judgements of the pair's layers."""
        t, reference = self.thresholds, self.reference
        # Steps order the series; pairs without a step (unnamed checkpoints) fall back to their index.
        step = float(pair.to_step) if pair.to_step is not None else float(index)
        interval = (pair.to_step - pair.from_step) if pair.to_step is not None and pair.from_step is not None \
            else None
        verdicts = []
        for position, (number, series) in enumerate(zip(self.layers or [], self.series)):
            # A pair without this layer (which the first pair had) gives it no value.
            layer = pair.layers[position] if position < len(pair.layers) else None
            points: dict[str, Point] = {}
            onsets: dict[str, int | None] = {}
            for monitor in self.monitors:
                raw = monitor.read(layer) if layer is not None else None
                expected = None
                if reference is not None and monitor.across_runs:
                    widening = Widening(t.reference_pairs, t.reference_scale_factor, band_factor(t, monitor))
                    expected = reference.expectation(number, monitor, step, widening, interval,
                                                     warmup=not judged, lr=pair.lr)
                state = series[monitor.name]
                points[monitor.name] = state.update(step, raw, expected, warmup=not judged, label=pair.to_step)
                onsets[monitor.name] = cast("int | None", state.onset_label)  # a series' labels are steps
            band = self.layer_bands[position].update(points, pair.to_step, t) if self._band else None
            if layer is not None:
                layer.findings.extend(point_findings(points, onsets, t))
                if band is not None:
                    layer.findings.append(band)
                layer.judgements = {name: judgement(point, onsets[name])
                                    for name, point in points.items() if point.state != "missing"}
            verdicts.append(points)
        return verdicts

    def _summarise(self, index: int, pair: PairResult) -> None:
        here = (index, pair.to_step, pair.from_path, pair.from_step)
        if self.summary.first is None and pair.to_step is not None:
            self.onsets[pair.to_step] = here
        self.summary.add(index, pair, lambda step: self.onsets.get(step, here) if step is not None else here)
        if self.summary.first is not None:
            self.onsets = {}  # the first alert's onset is known: no later pair can change it
            return
        # Keep only the steps an alarm under way may still name as its onset.
        live = {label for series in self.series for s in series.values() for label in s.live_labels()}
        live.update(label for pooled in self.pooled.values() for label in pooled.live_labels())
        live.update(label for band in self.layer_bands for label in band.live_labels())
        live.update(self.run_band.live_labels())
        self.onsets = {step: onset for step, onset in self.onsets.items() if step in live}

    def baselines(self) -> Baselines:
        """{layer: {monitor: (newest value, its baseline)}} for the per-layer summary."""
        found: Baselines = {}
        for number, series in zip(self.layers or [], self.series):
            found[number] = {name: s.newest for name, s in series.items() if s.newest is not None}
        return found

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "basis": self.basis, "count": self.count, "start": self.start,
                "warmup_end": self.warmup_end, "layers": self.layers,
                "series": [{name: s.to_dict() for name, s in series.items()} for series in self.series],
                "pooled": {name: p.to_dict() for name, p in self.pooled.items()},
                "layer_bands": [band.to_dict() for band in self.layer_bands], "run_band": self.run_band.to_dict(),
                "summary": self.summary.to_dict(), "onsets": [list(onset) for onset in self.onsets.values()],
                "lr_before": self.lr_before}

    @classmethod
    def from_dict(cls, data: dict[str, Any], thresholds: Thresholds, reference: Expectations | None = None,
                  basis: dict[str, Any] | None = None) -> JudgeState:
        """The state `to_dict` wrote, to go on judging under `thresholds` and
        `reference`; a CkptScanError when it was made under another basis or
        by another version (the caller folds again from the first pair)."""
        state = cls(thresholds, reference, basis)
        if data.get("version") != STATE_VERSION or data.get("basis") != state.basis:
            raise CkptScanError("the saved judge state was made under other thresholds, reference or version")
        state.count, state.start, state.warmup_end = data["count"], data["start"], data["warmup_end"]
        state.layers = data["layers"]
        settings = thresholds.series_settings(0)
        specs = {m.name: m.spec for m in state.monitors}
        state.series = [{name: SeriesState.from_dict(specs[name], settings, s) for name, s in series.items()}
                        for series in data["series"]]
        for name, saved in data["pooled"].items():
            state.pooled[name] = PooledCusum(state.pooled[name].monitor, saved["total"],
                                             Excursion(**saved["excursion"]))
        state.layer_bands = [LayerBand(**band) for band in data["layer_bands"]]
        state.run_band = RunBand(**data["run_band"])
        state.summary = SummaryState.from_dict(data["summary"], thresholds)
        state.onsets = {onset[1]: tuple(onset) for onset in data["onsets"]}
        state.lr_before = data["lr_before"]
        return state
