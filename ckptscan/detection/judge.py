"""judge: metrics -> a judged report. All detection happens here, once.

    report = judge(compute(spec, options), spec.config.thresholds, spec.references)

The metrics are not changed: the report holds its own copies of the layer
results, with findings, statuses, each series point's judgement (what it was
judged against, its warn and alert levels, the rule) and the summary. The
table, Markdown, HTML and figures draw what the report says.

Judging is a fold over the pairs (`detection/state.py` `JudgeState`), and
`SeriesJudge` keeps the fold between calls: live mode, `watch` and a cached
`trend` judge only the pairs that are new, at a cost that does not grow
with the pairs before them. `judge` is a `SeriesJudge` used once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

from ckptscan.detection.reference import Expectations, ReferenceRun, expectations, reference_runs
from ckptscan.detection.rules import finish_report, unjudged
from ckptscan.detection.screening import Screened, screen_references
from ckptscan.detection.state import JudgeState
from ckptscan.detection.thresholds import Thresholds
from ckptscan.inputs.loss_log import LossLog, divergence_step
from ckptscan.schema.results import CheckpointRef, ModelInfo, PairResult, ScanReport, Summary


# The JSON report's "command" for each kind of spec (a public key).
COMMANDS = {"pair": "diff", "run": "trend"}

# Known-healthy runs, several a band (detection/reference.py): `ReferenceRun`s (a run spec's
# `references`), or in the older shape one report or several, with `reference_path` the file each came from.
References = Union[Sequence[ReferenceRun], ScanReport, Sequence[ScanReport], None]
ReferencePaths = Union[str, Sequence[Union[str, None]], None]  # None: a report object, from no file


@dataclass
class Metrics:
    """The numbers of a scan, before any judgement: what `compute` gives and `judge` reads."""

    kind: str  # "pair" | "run", as the spec
    model: ModelInfo
    checkpoints: list[CheckpointRef]
    pairs: list[PairResult]  # layers carry metrics only (no findings, status "ok")
    skipped: list[dict[str, str]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # pairing, stride, the run, the loss log …
    probe: str | None = None
    loss_log: LossLog | None = None  # read by judge for the divergence step and the LR warm-up
    cached: list[bool] = field(default_factory=list)  # per pair: taken from the cache rather than computed
    # Per pair, with a cache: what names its metrics there (`PairCache.identity`), so
    # judged pairs and the judge state can be cached beside them (`judge_cache.JudgeCache`).
    pair_keys: list[str] = field(default_factory=list)


def judge(metrics: Metrics, thresholds: Thresholds | None = None, reference: References = None, *,
          reference_path: ReferencePaths = None, screen: bool = True) -> ScanReport:
    """Findings, statuses and the verdict of `metrics`.

    `reference`: known-healthy runs to compare each pair with, each a
    `ReferenceRun` (its report and where it came from: a run spec's
    `references`); or, the older shape, a report (`load_report`) or several,
    with `reference_path` the file(s) they came from, for the report (mixing
    the two shapes is a TypeError). A reference that alerts itself is left out
    (`detection/screening.py`); `screen` False uses every one (a sweep, which
    screens its runs once for all of them). With a loss log in the metrics,
    judging starts after the LR warm-up at the earliest, and the summary
    gives the lead over divergence.
    """
    return SeriesJudge(thresholds, reference, reference_path, screen=screen).report(metrics)


class SeriesJudge:
    """A series judged pair by pair, the state kept between calls.

    `report(metrics)` judges the pairs of `metrics` past those judged by the
    previous call (the caller's series only grows: live mode, `watch`, a
    cached `trend`) and returns the report of all of them. When what the
    judging assumed changes (`JudgeState.basis`: the thresholds, which the
    loss log's LR warm-up end can raise as the log grows, or the reference
    run), earlier verdicts change with it: the state is dropped and every
    pair judged again from the first, so the report is always the one-shot
    `judge`'s.

    The report's `pairs` list is this judge's own (`judged`) and its
    `checkpoints` the metrics' own, not copies, so a new pair costs the same
    at pair 10 and at pair 10,000 (a copy would grow with the run, and the
    garbage collector walks each young one): the next call appends to them. Copy them to hold a
    report as it was.
    """

    def __init__(self, thresholds: Thresholds | None = None, reference: References = None,
                 reference_path: ReferencePaths = None, *, screen: bool = True) -> None:
        self.thresholds = thresholds or Thresholds()
        self.references = _runs(reference, reference_path)
        self.screen = screen
        self._screening: tuple[str, Screened] | None = None  # `screened`'s, under the basis it was made on
        self.state: JudgeState | None = None
        self.judged: list[PairResult] = []  # the pairs judged so far, in order
        self._reference_id: str | None = None

    def report(self, metrics: Metrics) -> ScanReport:
        thresholds, divergence = effective_thresholds(metrics, self.thresholds)
        basis = self.basis(thresholds)
        if self.state is None or self.state.basis != basis or len(metrics.pairs) < len(self.judged):
            self.start(JudgeState(thresholds, self.expected(thresholds, metrics), basis))
        for pair in metrics.pairs[len(self.judged):]:
            self.add(pair)
        report = ScanReport(
            command=COMMANDS[metrics.kind],
            model=metrics.model,
            checkpoints=metrics.checkpoints,
            # One pair is judged again like `diff` in the report only (finish_report): a copy.
            pairs=self.judged if len(self.judged) > 1 else list(self.judged),
            summary=Summary(status="ok", flagged_layers=[], first_alert_step={}),
            skipped=list(metrics.skipped),
            settings=dict(metrics.settings),
            probe=metrics.probe,
        )
        finish_report(report, self._current(), divergence)
        screened = self.screened(thresholds)
        if screened is not None and screened.left_out:
            report.settings["reference_left_out"] = list(screened.left_out)
            report.settings["reference_notes"] = [*report.settings.get("reference_notes", []), *screened.notes]
        return report

    def add(self, pair: PairResult) -> PairResult:
        """Judge one more pair (a copy of it) from the state: the benchmarks'
        unit of work. Returns the judged copy."""
        judged = self._current().add(unjudged(pair))
        self.judged.append(judged)
        return judged

    def _current(self) -> JudgeState:
        if self.state is None:
            raise RuntimeError("no judge state: start() or report() comes first")
        return self.state

    def start(self, state: JudgeState, judged: list[PairResult] | None = None) -> None:
        """Go on from `state`, the state after `judged` (a saved state and the
        pairs it judged, e.g. from `trend`'s cache)."""
        self.state, self.judged = state, list(judged or [])

    def use(self, thresholds: Thresholds, reference: References, reference_path: ReferencePaths = None) -> None:
        """Judge the next pairs under these (a watch re-reads its config and
        reference at each look); a changed basis judges every pair again."""
        references = _runs(reference, reference_path)
        if not _same_runs(references, self.references):
            self._reference_id = None
        self.thresholds, self.references = thresholds, references

    @property
    def reference(self) -> ScanReport | list[ScanReport] | None:
        """The references' reports in the older shape: one report, a list (a band), or None."""
        reports = [run.report for run in self.references]
        return reports[0] if len(reports) == 1 else reports or None

    @property
    def reference_path(self) -> str | list[str | None] | None:
        """Where each reference came from, in the older shape (`reference`'s)."""
        paths = [run.path for run in self.references]
        return paths[0] if len(paths) == 1 else paths or None

    def basis(self, thresholds: Thresholds) -> dict[str, Any]:
        """What judging under `thresholds` assumes (`JudgeState.basis`)."""
        if self.references and self._reference_id is None:
            self._reference_id = reference_identity(self.references)
        return {"thresholds": thresholds.as_dict(), "reference": self._reference_id}

    def expected(self, thresholds: Thresholds, metrics: Metrics) -> Expectations | None:
        """The reference runs' expectations under `thresholds` (its warm-up is theirs)."""
        if not self.references:
            return None
        expected = expectations(self.references, thresholds.warmup_pairs, thresholds.warmup_steps)
        expected.check_model(metrics.model)  # every reference given, before any is left out
        screened = self.screened(thresholds)
        if screened is None or not screened.left_out:
            return expected
        if not screened.reports:
            return None
        return expectations([self.references[i] for i in screened.kept], thresholds.warmup_pairs,
                            thresholds.warmup_steps)

    @property
    def screens(self) -> bool:
        """Whether there are references to screen."""
        return self.screen and bool(self.references)

    def screened(self, thresholds: Thresholds, known: dict[str, Any] | None = None) -> Screened | None:
        """The references kept and left out under `thresholds`
        (`detection/screening.py`), worked out once per basis; None without
        references or screening. `known`: a screening filed under this basis
        (`Screened.as_dict`), taken instead of screening again."""
        if not self.screens:
            return None
        reports, paths = [run.report for run in self.references], [run.path for run in self.references]
        key = json.dumps(self.basis(thresholds), sort_keys=True, default=str)
        if self._screening is None or self._screening[0] != key:
            found = Screened.restored(known, reports, paths) if known is not None else \
                screen_references(reports, paths, thresholds)
            self._screening = (key, found)
        return self._screening[1]


def effective_thresholds(metrics: Metrics, thresholds: Thresholds) -> tuple[Thresholds, int | None]:
    """The thresholds a run is judged under, and its loss divergence step:
    the logit-scale ceiling for the model's width (`Thresholds.at_width`);
    with a loss log, judging starts after the LR warm-up at the earliest.
    Both read the whole log, so they may change as a live run's log grows."""
    thresholds, log = thresholds.at_width(metrics.model.hidden_size), metrics.loss_log
    if log is None:
        return thresholds, None
    divergence = divergence_step(log, thresholds.loss_window, thresholds.loss_margin)
    warmup = log.warmup_end()
    if warmup is not None and warmup > thresholds.warmup_steps:
        thresholds = dataclasses.replace(thresholds, warmup_steps=warmup)
    return thresholds, divergence


def _runs(reference: References, path: ReferencePaths) -> tuple[ReferenceRun, ...]:
    """The references as reference runs: as given, or from the older shape
    (reports, and the path of each)."""
    if isinstance(reference, (list, tuple)) and any(isinstance(run, ReferenceRun) for run in reference):
        if path is not None or not all(isinstance(run, ReferenceRun) for run in reference):
            raise TypeError("give the references as ReferenceRun objects, or as reports with their reference_path")
        return tuple(reference)
    return reference_runs(reference, path)  # type: ignore[arg-type]  # no ReferenceRun among them


def _same_runs(a: Sequence[ReferenceRun], b: Sequence[ReferenceRun]) -> bool:
    """The same reports (the very objects) from the same paths."""
    return len(a) == len(b) and all(x.report is y.report and x.path == y.path for x, y in zip(a, b))


def reference_identity(reference: References, path: ReferencePaths = None) -> str:
    """What names the reference runs in a judge state's basis: each one's
    file path, size and modification time when it came from one, else its content."""
    runs = _runs(reference, path)
    if len(runs) != 1:
        return json.dumps([_identity(run.report, run.path) for run in runs])
    return _identity(runs[0].report, runs[0].path)


def _identity(reference: ScanReport, path: str | None) -> str:
    if path is not None and Path(path).is_file():
        stat = Path(path).stat()
        return json.dumps([str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns])
    # Each dataclass serialised through its own fields, not `dataclasses.asdict`,
    # which deep-copies every value first: a third of judging a 16-layer run
    # against three scanned references went to that copy.
    content = json.dumps(reference, sort_keys=True, default=_fields)
    return hashlib.sha256(content.encode()).hexdigest()


def _fields(value: Any) -> Any:
    if dataclasses.is_dataclass(value):  # slotted result types have no __dict__
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return str(value)
