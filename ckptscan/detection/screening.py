"""References screened before they judge a run: a reference that alerts is left out.

References are meant to be known-healthy, but the run a team reaches for
(the previous attempt, last month's run, the pilot) may itself be faulty.
A faulty member widens a band (its spread is the members' standard
deviation), and a faulty single reference makes its faulty levels the
expected ones: either way the judged run's fault reads as normal, a quiet
pass. So each reference is first judged as a run would be, against the
other references (a band of them, or the other one alone) and, when it is
the only one, against its own history; one that alerts is left out, and
the judged report says which and why (`settings.reference_left_out`,
`settings.reference_notes`). When every reference alerts, none is used:
the run is judged against its own history, as without references.

Screening judges every reference once, so it costs what judging the
references would (about 6 ms per pair of a 16-layer model against a band of
two, bench/band_judge.py): the judge keeps it for as long as its basis
holds, and `trend`'s judge cache files it beside the judged pairs
(`judge_cache.py`), so a re-run does not screen again.

The same rule, applied once to a whole sweep, is `ckptscan.pipeline.sweep`'s: on
the corpus judged as sweeps (experiments/sweeps.py) it moved the median lead
over diverging runs from 25 % to 48 %, with no false alarm on 23 healthy
runs. A healthy reference is left out only when it alerts against healthy
ones, at the calibrated false-alarm rate (docs/calibration.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

from ckptscan.detection.reference import reference_from_reports
from ckptscan.detection.rules import unjudged
from ckptscan.detection.state import JudgeState
from ckptscan.detection.thresholds import Thresholds
from ckptscan.schema.results import ScanReport


@dataclass
class Screened:
    """The references kept, in the order given, and what was left out."""

    kept: list[int]  # the kept references' positions among those given
    reports: list[ScanReport]
    paths: list[str | None]
    left_out: list[str] = field(default_factory=list)  # the references left out, by path (or position)
    notes: list[str] = field(default_factory=list)  # one line each, for `settings.reference_notes`

    def as_dict(self) -> dict[str, list]:
        """What a later run under the same basis needs (the judge cache files it)."""
        return {"kept": list(self.kept), "left_out": list(self.left_out), "notes": list(self.notes)}

    @classmethod
    def restored(cls, data: dict[str, list], reports: Sequence[ScanReport], paths: Sequence[str | None]
                 ) -> Screened:
        """`as_dict`'s screening of these references; ValueError if it cannot be theirs."""
        kept = [int(i) for i in data["kept"]]
        if any(not 0 <= i < len(reports) for i in kept) or kept != sorted(set(kept)):
            raise ValueError("not a screening of these references")
        return cls(kept, [reports[i] for i in kept], [paths[i] for i in kept],
                   [str(name) for name in data["left_out"]], [str(note) for note in data["notes"]])


def screen_references(reports: Sequence[ScanReport], paths: Sequence[str | None], thresholds: Thresholds
                      ) -> Screened:
    """Keep the references that do not alert (module docstring). Each is
    judged under `thresholds`, from the end of its own LR warm-up when its
    report names one, as the judged run is."""
    screened = Screened([], [], [])
    for i, report in enumerate(reports):
        others = [j for j in range(len(reports)) if j != i]
        alert = first_alert(report, [reports[j] for j in others], [paths[j] for j in others], thresholds)
        if alert is None:
            screened.kept.append(i)
            screened.reports.append(report)
            screened.paths.append(paths[i])
            continue
        name = path if (path := paths[i]) is not None else f"reference {i + 1}"
        step, family = alert
        against = "on its own history" if not others else \
            "against the other reference" if len(others) == 1 else "against the band of the other references"
        screened.left_out.append(name)
        screened.notes.append(f"reference {name} is left out: it alerts {against} ({family}, step {step}), "
                              "so it is not a healthy run to judge against")
    if screened.left_out and not screened.reports:
        screened.notes.append("every reference alerts: the run is judged against its own history only")
    return screened


def report_thresholds(report: ScanReport, thresholds: Thresholds) -> Thresholds:
    """The thresholds a computed report is judged under, from the report alone
    (as `judge.effective_thresholds` from the run's metrics): the logit-scale
    ceiling for its model's width, judging after its LR warm-up at the earliest."""
    thresholds = thresholds.at_width(report.model.hidden_size)
    warmup = report.settings.get("lr_warmup_end_step")
    if isinstance(warmup, int) and warmup > thresholds.warmup_steps:
        thresholds = dataclasses.replace(thresholds, warmup_steps=warmup)
    return thresholds


def first_alert(report: ScanReport, others: Sequence[ScanReport], paths: Sequence[str | None],
                thresholds: Thresholds) -> tuple[int | None, str] | None:
    """The step and family of `report`'s first alert judged against `others`
    (none: its own history alone); None if it never alerts. `report` is not changed."""
    thresholds = report_thresholds(report, thresholds)
    reference = reference_from_reports(others, thresholds.warmup_pairs, thresholds.warmup_steps, paths) \
        if others else None
    state = JudgeState(thresholds, reference)
    for pair in report.pairs:
        judged = state.add(unjudged(pair))
        alerts = [f for layer in judged.layers for f in layer.findings if f.severity == "alert"]
        if alerts:
            return judged.to_step, alerts[0].family
    return None
