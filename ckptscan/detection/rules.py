"""Detection: rules over the metrics of a scan, producing findings.

Rules never compute monitors; they read `LayerResult`s and append
`Finding`s. `assess_report` is the one entry point; it can be run again on
the same report (findings are rebuilt from the metrics each time). It folds
`JudgeState.add` (`detection/state.py`) over the pairs: each pair is judged
from the state the pairs before it left, as live mode and `watch` judge it.
The rules of one layer are in `detection/findings.py`, the thresholds in
`detection/thresholds.py`.

- numeric: a non-finite value in a monitored tensor is always an alert.
- floor: a normalised Δ2 entropy, router ε or routing entropy under a hard
  floor is an alert whatever the history.
- series (`detection/series.py`): over a run, each (layer, monitor) series is
  judged against its own robust healthy baseline, and optionally against a
  known-healthy reference run (`detection/reference.py`); its departures
  also feed a one-sided CUSUM (`detection/changepoint.py`, rule "cusum").
- pooled (`detection/pooled.py`): a fault that acts on every layer moves
  each layer a little; the per-layer departures of one monitor, summed over
  layers and divided by √(layers), feed a CUSUM of their own (rule
  "pooled_cusum").
- cross_layer: for a single pair (`diff`), or before a run has a baseline, a
  layer far below the model's other layers.
- precision (`detection/numerics.py`): an update mostly below the stored
  dtype's resolution (numeric warn).
- provenance (`detection/provenance.py`): a pair that is not an update of one
  run (an update as large as the weights; for `diff`, bit-identical weights)
  is a numeric alert.

Warm-up pairs (the first `warmup_pairs`, and those starting before
`warmup_steps`) are judged by the numeric rule and the hard floors only:
early updates are legitimately low-rank and fast-moving, but not collapsed
onto one direction. A pair that no other rule could judge (warm-up, or no
baseline yet) is "not_judged", never "ok"; a run with no pair judged is
"not_judged", and the summary says what was not judged and why.
"""

from __future__ import annotations

import dataclasses

from ckptscan.detection.absolute import after_warmup_findings, first_pair_findings
from ckptscan.detection.findings import cross_layer_findings, floor_findings, layer_status, numeric_findings
from ckptscan.detection.pooled import pooled_departures
from ckptscan.detection.provenance import identical_findings
from ckptscan.detection.reference import Expectations
from ckptscan.detection.series import first_judged
from ckptscan.detection.state import JudgeState
from ckptscan.detection.summary import SummaryState, summarize
from ckptscan.detection.thresholds import Thresholds
from ckptscan.schema.results import PairResult, ScanReport, worst

# A diff whose checkpoints' names carry no step: which one is older is the user's word alone
# (run.check_pair refuses a reversed pair only when both steps are known).
ORDER_NOT_JUDGED = "the order of the checkpoints: no step in their names to check that the older one came first"

__all__ = ["Thresholds", "assess_report", "cross_layer_findings", "first_judged_pair", "floor_findings",
           "judge_alone", "layer_status", "numeric_findings", "pooled_departures", "summarize", "worst"]


def assess_report(
    report: ScanReport,
    thresholds: Thresholds,
    reference: Expectations | None = None,
    loss_divergence_step: int | None = None,
) -> None:
    """Fill findings, statuses and the summary of a report in place: the
    fold of `JudgeState.add` over its pairs (a single pair: `judge_alone`).

    `reference`: a known-healthy run to compare each pair with.
    `loss_divergence_step`: when the loss log says the run diverged, for the
    lead time in the summary.
    """
    state = JudgeState(thresholds.at_width(report.model.hidden_size), reference)
    for pair in report.pairs:
        state.add(pair)
    finish_report(report, state, loss_divergence_step)


def finish_report(report: ScanReport, state: JudgeState, loss_divergence_step: int | None) -> None:
    """The report-wide fields of a report whose pairs `state` judged: its
    thresholds, warm-up end, reference and summary, from the state alone
    (O(layers)). The pair of a `diff` is judged again alone (`judge_alone`); a
    run of one pair is the first pair of a run, in its warm-up, so that its
    verdict does not change when the run grows."""
    report.thresholds = state.thresholds.as_dict()
    not_judged: list[str] = []
    if len(report.pairs) == 1 and report.command == "diff":
        alone = judge_alone(unjudged(report.pairs[0]), state.thresholds, identical=report.command == "diff")
        report.pairs[0] = alone
        report.settings["warmup_end_step"] = alone.from_step
        summary, baselines = SummaryState(state.thresholds), {}
        summary.add(0, alone, lambda step: (0, alone.to_step, alone.from_path, alone.from_step))
        if report.command == "diff" and (alone.from_step is None or alone.to_step is None):
            not_judged.append(ORDER_NOT_JUDGED)
    else:
        report.settings["warmup_end_step"] = state.warmup_end
        summary, baselines = state.summary, state.baselines()
    if state.reference is not None:
        report.settings["reference"] = state.reference.path
        if len(state.reference.members) > 1:
            report.settings["reference_runs"] = [member.path for member in state.reference.members]
        notes = state.reference.coverage_notes(report.pairs)
        if notes:
            report.settings["reference_notes"] = notes
    report.summary = summary.summary(loss_divergence_step, baselines, not_judged)


def judge_alone(pair: PairResult, t: Thresholds, identical: bool = False) -> PairResult:
    """A pair judged on its own (`diff`): no history, so the floors and
    ceilings, and the cross-layer rule in place of the series rules. A `diff`
    knows no warm-up: of a pair at the end of the LR ramp, where `trend` leaves
    the floors out (healthy runs dip toward them there), it may alert. In place;
    returns the pair. `identical`: bit-identical weights are a finding (a
    `diff`; in a run, frozen weights are UNCHANGED, detection/provenance.py)."""
    first_pair_findings(pair, t)
    after_warmup_findings(pair, t, None)
    if identical:
        identical_findings(pair)
    cross_layer_findings(pair, t)
    for layer in pair.layers:
        layer.status = layer_status(layer)
    pair.status = worst([layer.status for layer in pair.layers])
    return pair


def first_judged_pair(pairs: list[PairResult], t: Thresholds) -> int:
    """Index of the first pair after warm-up."""
    return first_judged([p.from_step for p in pairs], t.warmup_pairs, t.warmup_steps)


def unjudged(pair: PairResult) -> PairResult:
    """A copy of a pair whose layers detection may annotate."""
    layers = [dataclasses.replace(layer, findings=[], status="ok", judgements={}) for layer in pair.layers]
    return dataclasses.replace(pair, layers=layers, status="ok", not_judged_reason=None)
