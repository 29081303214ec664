"""A sweep judged run by run: each run against the band of all the others.

    sweep = ckptscan.pipeline.sweep.compare_runs(["runs/lr1e-3", "runs/lr2e-3", "runs/lr3e-3"])
    for run in sweep.runs:          # healthiest first
        print(run.rank, run.path, run.status, run.first_alert_step, run.family)

The members of a sweep are each other's references: a fault present from
the first checkpoint, which a run judged only against its own past learns
as normal, stands out against the other runs at the same step. Each run is
scanned once (with the pair cache, once across invocations too), its own
report is what `ckptscan trend RUN --json` holds, and each run is then
judged against the reports of all the others (leave-one-out): against a
band with three or more runs, against the other run alone with two
(`detection/reference.py`). Runs of different lengths or checkpoint
intervals are aligned by step; each judged report's
`settings["reference_notes"]` says where a reference ended early or was
saved at another interval. Runs of different models are refused, naming
the odd one.

A faulty run would widen the band of every other run (a band's spread is
its members' standard deviation), so two faulty runs of one sweep could
hide each other. With three runs or more, the runs that alert against all
the others are left out of the others' bands and every run is judged again
(`SweepReport.left_out`; each report's notes say so). This is done once:
the first round's verdicts rest on bands of every other run, a second
exclusion would rest on bands it had narrowed itself. A run all of whose
others alert keeps its judgement against all of them.

Ranked healthiest first: by status (ok, warn, alert), and within a status
the run whose first warning or alert came later first (it stayed healthy
longer); ties keep the order given.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ckptscan.detection.judge import judge
from ckptscan.detection.reference import MODEL_FIELDS
from ckptscan.errors import CkptScanError
from ckptscan.layouts import ModelInfo, resolve_layout
from ckptscan.pipeline.metrics import Metrics, compute
from ckptscan.document.plain import report_dict
from ckptscan.document.reading import as_json_values, report_from_dict
from ckptscan.schema.results import GATE_ORDER, NOT_JUDGED, ScanReport, SweepReport, SweepRun
from ckptscan.pipeline.request import AUTO, ScanRequest
from ckptscan.pipeline.run import resolve_run
from ckptscan.scan import ScanOptions
from ckptscan.storage import RemotePath


def compare_runs(
    run_dirs: Sequence[str | Path | RemotePath],
    request: ScanRequest | ScanOptions | None = None,
    *,
    scanning: Callable[[str], None] | None = None,
    probes: bool = True,
    loss_logs: bool = True,
    leave_out: bool = True,
    **fields: Any,
) -> SweepReport:
    """Judge each of `run_dirs` (two or more runs of one model) against the
    others and rank them. Each run uses its own probe and loss log, all the
    same pairing, options and thresholds of `request` (or, without one, of
    its fields: stride, base, config, settings, thresholds, cache, executor;
    `request` may be the options alone); references other than the runs
    have no meaning here. `scanning` is told each run as its scan starts.
    `probes` / `loss_logs` False (or the request's probe / loss log None): no
    run uses its own probe / loss log (`trend SWEEP/ --no-probe`,
    `--no-loss-log`). `leave_out` False: no run is left out of the others'
    bands (the first round only, for comparison)."""
    request = ScanRequest.given(request, fields)
    names = [str(d) for d in run_dirs]
    if len(names) < 2:
        raise CkptScanError(f"a comparison needs at least two runs, got {len(names)}")
    twice = [name for name, count in Counter(names).items() if count > 1]
    if twice:
        raise CkptScanError("the same run given twice; each run is judged against the others", path=twice[0])
    own_files = replace(request, probe=AUTO if probes and request.probe is not None else None,
                        loss_log=AUTO if loss_logs and request.loss_log is not None else None, references=())
    specs = [resolve_run(d, own_files) for d in run_dirs]
    options, cache, executor, thresholds = request.options, request.cache, request.executor, request.thresholds
    # Before any scan: the model of each run is in its first checkpoint's header.
    check_one_model(names, [resolve_layout(spec.checkpoints[0], options.overrides, options.tensor_map).info
                            for spec in specs])
    metrics: list[Metrics] = []
    for name, spec in zip(names, specs):
        if scanning is not None:
            scanning(name)
        metrics.append(compute(spec, options, cache=cache, executor=executor))
    limits = [thresholds or spec.config.thresholds for spec in specs]
    # Each run as a reference: what its `trend --json` report holds (a JSON round trip, NaN as None).
    own = [report_from_dict(as_json_values(report_dict(judge(m, t))), name)
           for name, m, t in zip(names, metrics, limits)]

    def judged_against(i: int, left_out: set[int]) -> tuple[ScanReport, list[str]]:
        others = [j for j in range(len(names)) if j != i and j not in left_out]
        paths = [names[j] for j in others]
        references = [own[j] for j in others]
        # screen=False: the sweep leaves alerting runs out once for all runs, below.
        return judge(metrics[i], limits[i], references if len(references) > 1 else references[0],
                     reference_path=paths if len(paths) > 1 else paths[0], screen=False), paths

    first_round = [judged_against(i, set()) for i in range(len(names))]
    # A run that alerts against all the others widens their bands (a band's
    # spread is its members' standard deviation), so it is left out of them
    # (module docstring). With two runs there is no band to leave it out of.
    alerted = {i for i, (report, _) in enumerate(first_round)
               if report.summary.status == "alert" and len(names) > 2 and leave_out}
    left_out_notes = {j: f"{names[j]} alerts against all the other runs (first alert at step "
                         f"{_first(first_round[j][0].summary.first_alert_step)}): left out of the others' bands"
                      for j in alerted}
    judged = []
    for i in range(len(names)):
        excluded = alerted - {i}
        if not excluded:
            report, paths = first_round[i]
        elif len(excluded) == len(names) - 1:
            report, paths = first_round[i]
            _note(report, f"every run but {names[i]} alerts against the rest: it is judged against all of them")
        else:
            report, paths = judged_against(i, excluded)
            if i in alerted and report.summary.status != "alert":
                # Against the healthier runs alone it no longer alerts: the
                # alert it raised against all of them stands.
                report, paths = first_round[i]
            else:
                for j in sorted(excluded):
                    _note(report, left_out_notes[j])
        judged.append((names[i], report, paths))
    runs = [_run(name, report, paths) for name, report, paths in judged]
    runs.sort(key=_health)
    for rank, run in enumerate(runs, 1):
        run.rank = rank
    notes = sorted({note for run in runs for note in run.report.settings.get("reference_notes", [])})
    return SweepReport(runs, runs[-1].status, notes, specs[0].config.fail_on, [names[j] for j in sorted(alerted)])


def check_one_model(names: Sequence[str], models: Sequence[ModelInfo]) -> None:
    """Refuse runs of different models: the first run whose model is not the
    one most runs share is named, with what differs."""
    shapes = [tuple((k, getattr(m, k, None)) for k in MODEL_FIELDS) for m in models]
    common, _ = Counter(shapes).most_common(1)[0]
    model = dict(common)
    for name, shape in zip(names, shapes):
        if shape != common:
            like = names[shapes.index(common)]
            differs = "; ".join(f"{k}: {v} vs {model[k]}" for k, v in shape if model[k] != v)
            raise CkptScanError(f"is of a different model than the other runs ({differs}; against {like}): "
                                "a sweep's runs are judged against each other", path=name)


def _note(report: ScanReport, note: str) -> None:
    report.settings["reference_notes"] = [*report.settings.get("reference_notes", []), note]


def _first(steps: dict[str, int | None]) -> int | None:
    known = [s for s in steps.values() if s is not None]
    return min(known) if known else None


def _run(path: str, report: ScanReport, references: list[str]) -> SweepRun:
    summary = report.summary
    warned = {family: step for family, step in summary.first_warn_step.items() if step is not None}
    family = getattr(summary, "primary_family", None) or summary.first_family
    if family is None and summary.status == "warn" and warned:
        family = min(warned, key=lambda f: warned[f])
    return SweepRun(path, 0, summary.status, _first(summary.first_alert_step), _first(summary.first_warn_step),
                    family, references, report)


def _health(run: SweepRun) -> tuple[int, float]:
    """Sort key, healthiest first: the status in the gate's order (a run not judged after a
    warning, before an alert), then the later first alert (or warning)."""
    severity = GATE_ORDER.index(run.status) if run.status in GATE_ORDER else 0  # "unchanged": no alarm
    if severity < GATE_ORDER.index("warn") or run.status == NOT_JUDGED:
        return severity, 0.0
    return severity, -run.first_step if run.first_step is not None else math.inf
