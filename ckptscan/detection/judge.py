"""judge: metrics -> a judged report. All detection happens here, once.

    report = judge(compute(spec, options), spec.config.thresholds, spec.reference)

The metrics are not changed: the report holds its own copies of the layer
results, with findings, statuses, each series point's judgement (what it was
judged against, its warn and alert levels, the rule) and the summary. The
table, Markdown, HTML and figures draw what the report says.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ckptscan.detection.reference import reference_from_report
from ckptscan.detection.rules import Thresholds, assess_report
from ckptscan.interventions import interventions_for
from ckptscan.loss_log import divergence_step
from ckptscan.results import PairResult, ScanReport, Summary

if TYPE_CHECKING:
    from ckptscan.metrics import Metrics

# The JSON report's "command" for each kind of spec (a public key).
COMMANDS = {"pair": "diff", "run": "trend"}


def judge(metrics: Metrics, thresholds: Thresholds | None = None, reference: ScanReport | None = None, *,
          reference_path: str | None = None) -> ScanReport:
    """Findings, statuses and the verdict of `metrics`.

    `reference`: a known-healthy run's report (`load_report`) to compare each
    pair with; `reference_path`, the file it came from, for the report. With a loss log in the metrics, judging starts after the LR
    warm-up at the earliest, and the summary gives the lead over divergence.
    """
    thresholds = thresholds or Thresholds()
    report = ScanReport(
        command=COMMANDS[metrics.kind],
        model=metrics.model,
        checkpoints=list(metrics.checkpoints),
        pairs=[_fresh(pair) for pair in metrics.pairs],
        summary=Summary(status="ok", flagged_layers=[], first_alert_step={}),
        skipped=list(metrics.skipped),
        settings=dict(metrics.settings),
        probe=metrics.probe,
    )
    divergence = None
    log = metrics.loss_log
    if log is not None:
        divergence = divergence_step(log, thresholds.loss_window, thresholds.loss_margin)
        warmup = log.warmup_end()
        if warmup is not None and warmup > thresholds.warmup_steps:
            thresholds = dataclasses.replace(thresholds, warmup_steps=warmup)
    expected = None
    if reference is not None:
        expected = reference_from_report(reference, thresholds.warmup_pairs, thresholds.warmup_steps,
                                         reference_path)
        expected.check_model(metrics.model)
    assess_report(report, thresholds, expected, divergence)
    report.summary.interventions = interventions_for(report.summary)
    return report


def _fresh(pair: PairResult) -> PairResult:
    """A copy of a pair whose layers detection may annotate."""
    layers = [dataclasses.replace(layer, findings=[], status="ok", judgements={}) for layer in pair.layers]
    return dataclasses.replace(pair, layers=layers, status="ok")
