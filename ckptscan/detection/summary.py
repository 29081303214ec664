"""The verdict of a report: worst status, first alert per family, the family
that fired first, flagged layers, the rollback candidate and the lead time.

An alarm is an alert finding. The step of an alert is the newer step of the
pair on which it was raised (what a nightly job would have seen then). The
first family to alert names the mechanism; on the same pair, the alert whose
departure began earlier wins, then the larger departure. The rollback
candidate is the last checkpoint before that departure began: the older
checkpoint of the pair where the first alert's run of departures started.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ckptscan.detection.catalog import BY_NAME
from ckptscan.detection.provenance import RULE_IDENTICAL, RULE_UNRELATED
from ckptscan.interventions import interventions_for
from ckptscan.results import (
    FAMILIES,
    CheckpointRef,
    Finding,
    LayerResult,
    LayerSummary,
    PairResult,
    ScanReport,
    Summary,
    from_dict,
)
from ckptscan.vocabulary import worst

# Findings about the input rather than the run's dynamics (detection/provenance.py).
MISUSE_RULES = (RULE_UNRELATED, RULE_IDENTICAL)


# Where an alert's departure began: (its pair's index, newer step, older path, older step).
Onset = tuple[int, "int | None", str, "int | None"]
# {layer: {monitor: (newest value, its baseline)}}: the series' newest judgements, for the per-layer summary.
Baselines = dict[int, dict[str, tuple["float | None", "float | None"]]]


def summarize(
    report: ScanReport,
    loss_divergence_step: int | None = None,
    baselines: Baselines | None = None,
) -> Summary:
    """`baselines`: {layer: {monitor: (current value, its baseline)}} for the per-layer summary."""
    state = SummaryState()
    for index, pair in enumerate(report.pairs):
        state.add(index, pair, lambda step, index=index: _walk_back(report.pairs, index, step))
    return state.summary(loss_divergence_step, baselines or {})


class SummaryState:
    """The summary's inputs, kept pair by pair: O(layers) state, whatever the
    number of pairs, from which `summary` is made without looking at them."""

    def __init__(self) -> None:
        self.pairs = 0
        self.status = "ok"  # the worst pair status so far
        self.unchanged = True  # every layer of every pair so far is unchanged
        self.first_alert: dict[str, int | None] = {family: None for family in FAMILIES}
        self.first_warn: dict[str, int | None] = {family: None for family in FAMILIES}
        self.layers: dict[int, LayerSummary] = {}
        # The first alert: (pair index, layer, finding), and where its departure began.
        self.first: tuple[int, int, Finding] | None = None
        self.onset: Onset | None = None
        # When the first alert says the pair is not an update of one run: that pair, named.
        self.misuse_pair: str | None = None

    def add(self, index: int, pair: PairResult, locate: Callable[[int | None], Onset]) -> None:
        """Count a judged pair. `locate(step)`: the newest pair so far whose
        newer step is `step` (the pair itself when `step` is None), for the
        onset of the first alert (steps repeat when a run was restarted)."""
        self.pairs += 1
        for layer in pair.layers:
            for f in layer.findings:
                if f.severity == "alert" and self.first_alert.get(f.family) is None:
                    self.first_alert[f.family] = pair.to_step
                if f.severity in ("warn", "alert") and self.first_warn.get(f.family) is None:
                    self.first_warn[f.family] = pair.to_step
            self._add_layer(pair, layer)
        self.status = worst([self.status, pair.status])
        self.unchanged = self.unchanged and all(layer.status == "unchanged" for layer in pair.layers)
        if self.first is None:
            alerts = [(layer.layer, f) for layer in pair.layers for f in layer.findings if f.severity == "alert"]
            if alerts:
                current = (index, pair.to_step, pair.from_path, pair.from_step)
                onsets = {f.onset_step: locate(f.onset_step) if f.onset_step is not None else current
                          for _, f in alerts}
                layer, finding = min(alerts, key=lambda a: (onsets[a[1].onset_step][0], _rank(a[1]),
                                                            -_score(a[1])))
                self.first, self.onset = (index, layer, finding), onsets[finding.onset_step]
                if finding.rule in MISUSE_RULES:
                    self.misuse_pair = _pair_name(pair)

    def _add_layer(self, pair: PairResult, layer: LayerResult) -> None:
        s = self.layers.setdefault(layer.layer, LayerSummary(layer.layer, "ok"))
        s.status = worst([s.status, layer.status])
        warns = [f for f in layer.findings if f.severity in ("warn", "alert")]
        if warns and s.first_warn_step is None:
            s.first_warn_step = pair.to_step
        alerts = [f for f in layer.findings if f.severity == "alert"]
        if alerts and s.first_alert_step is None:
            finding = min(alerts, key=lambda f: (_rank(f), -_score(f)))
            s.first_alert_step, s.first_alert_family, s.first_alert_monitor = (
                pair.to_step, finding.family, finding.monitor)

    def summary(self, loss_divergence_step: int | None, baselines: Baselines) -> Summary:
        layer_summaries = [dataclasses.replace(self.layers[k]) for k in sorted(self.layers)]
        for s in layer_summaries:
            if s.layer in baselines:
                values = baselines[s.layer]
                s.current = {name: current for name, (current, _) in values.items()}
                s.baseline = {name: baseline for name, (_, baseline) in values.items()}
        flagged = sorted(s.layer for s in layer_summaries if s.status in ("warn", "alert"))
        status = self.status
        if status == "ok" and self.pairs and self.unchanged:
            status = "unchanged"
        rollback, onset_step, first_family, first_step = None, None, None, None
        if self.first is not None and self.onset is not None and self.misuse_pair is None:
            _, _, finding = self.first
            first_family, first_step = finding.family, self.first_alert[finding.family]
            _, onset_step, from_path, from_step = self.onset
            rollback = CheckpointRef(from_path, from_step)
        lead = None
        if loss_divergence_step is not None and first_step is not None:
            lead = loss_divergence_step - first_step
        summary = Summary(
            status=status,
            flagged_layers=flagged,
            first_alert_step=dict(self.first_alert),
            rollback_candidate=rollback,
            first_warn_step=dict(self.first_warn),
            first_family=first_family,
            first_alert_onset_step=onset_step,
            loss_divergence_step=loss_divergence_step,
            lead_steps=lead,
            layers=layer_summaries,
        )
        summary.message = _verdict(summary, self.first, self.pairs)
        if self.first is not None and self.misuse_pair is not None:
            # No verdict on a run and no rollback candidate: the input is not an update of one run,
            # and no change to training would fix it (no interventions).
            summary.first_family = self.first[2].family
            summary.message = f"ALERT: {self.misuse_pair} is not an update of one run: {self.first[2].message}"
        else:
            summary.interventions = interventions_for(summary)
        return summary

    def to_dict(self) -> dict[str, Any]:
        return {"pairs": self.pairs, "status": self.status, "unchanged": self.unchanged,
                "first_alert": self.first_alert, "first_warn": self.first_warn,
                "layers": [dataclasses.asdict(s) for s in self.layers.values()],
                "first": [self.first[0], self.first[1], dataclasses.asdict(self.first[2])] if self.first else None,
                "onset": list(self.onset) if self.onset is not None else None,
                "misuse_pair": self.misuse_pair}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SummaryState:
        state = cls()
        state.pairs, state.status, state.unchanged = data["pairs"], data["status"], data["unchanged"]
        state.first_alert, state.first_warn = dict(data["first_alert"]), dict(data["first_warn"])
        state.layers = {s["layer"]: from_dict(LayerSummary, s) for s in data["layers"]}
        if data["first"] is not None:
            index, layer, finding = data["first"]
            state.first = (index, layer, from_dict(Finding, finding))
        state.onset = tuple(data["onset"]) if data["onset"] is not None else None
        state.misuse_pair = data["misuse_pair"]
        return state


def _walk_back(pairs: list[PairResult], index: int, step: int | None) -> Onset:
    """The newest pair up to `index` whose newer step is `step` (else `index`'s)."""
    found = next((i for i in range(index, -1, -1) if pairs[i].to_step == step), index)
    pair = pairs[found]
    return found, pair.to_step, pair.from_path, pair.from_step


def _rank(finding: Finding) -> int:
    """Plainer evidence first: non-finite values, then the specific monitors, then the others."""
    if finding.family == "numeric":
        return 0
    monitor = BY_NAME.get(finding.monitor)
    return 1 if monitor is None or monitor.alone == "alert" else 2


def _score(finding: Finding) -> float:
    # Non-finite values and floors carry no score: they are the plainest evidence.
    return finding.score if finding.score is not None else float("inf")


def _verdict(s: Summary, first: tuple[int, int, Finding] | None, num_pairs: int) -> str:
    flagged = f"flagged layers {s.flagged_layers}"
    if s.status == "alert" and first is not None:
        _, layer, finding = first
        families = ", ".join(f"{family} {step if step is not None else '–'}"
                             for family, step in s.first_alert_step.items())
        step = s.first_alert_step[finding.family]
        together = [f for f, first_step in s.first_alert_step.items() if f != finding.family and first_step == step]
        # Families alerting on the same pair: the diagnosis rests on the earlier onset or the more specific monitor.
        also = f"; {' and '.join(together)} alerted on the same pair" if together else ""
        text = (f"ALERT: {finding.family} monitors fired first, at step {_step(step)} "
                f"(layer {layer}, {finding.monitor}{also}); first alert per family: {families}; {flagged}")
        if s.lead_steps is not None:
            when = f"{s.lead_steps} steps after" if s.lead_steps >= 0 else f"{-s.lead_steps} steps before"
            text += f"; the loss diverged at step {s.loss_divergence_step}, {when} the first alert"
        return text
    if s.status == "warn":
        return f"WARN: no alert, but monitors departed from their baselines; {flagged}"
    if s.status == "unchanged":
        return "UNCHANGED: the monitored weights did not change"
    return f"HEALTHY: no monitor fired over {num_pairs} pair(s)"


def _pair_name(pair: PairResult) -> str:
    older = f"step {pair.from_step}" if pair.from_step is not None else pair.from_path
    newer = f"step {pair.to_step}" if pair.to_step is not None else pair.to_path
    return f"{older} → {newer}"


def _step(step: int | None) -> str:
    return str(step) if step is not None else "?"
