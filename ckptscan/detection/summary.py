"""The verdict of a report: worst status, first alert per family, the primary
family and why, flagged layers, the rollback candidate and the lead time.

An alarm is an alert finding. The step of an alert is the newer step of the
pair on which it was raised (what a nightly job would have seen then).

**Primary family.** The candidates are the families with an alert on the
first pair that has one; the others alert later and are secondary. A family
that only warns there is not a candidate: a warning is calibrated to come ten
times as often in healthy runs as an alert, too weak to name a mechanism on.
Evidence that was already accumulating below the alert level is not lost,
though: it is the alert's onset (for a CUSUM, the pair where the statistic
last left 0; for a run of departures, its first pair). Each candidate is
represented by its strongest alert on that pair, and the families are ranked
by, in order:

1. the onset: whose departure began earlier (the fault that acts first moves
   its own monitors first; the other family moves as a consequence);
2. how far past its alert level it is, each in its own rule's units: robust
   σ over `alert_sigma` (trend, level, reference), the CUSUM over
   `cusum_alert` / `pooled_cusum_alert`, the robust z over
   `cross_layer_z_alert`; a non-finite value or a hard floor is absolute and
   counts as infinitely far;
3. how specific the monitor is (`_rank`: non-finite values, then the
   monitors that may alert alone, then those that alert only corroborated);
4. the mechanism's asymmetry: a router fault grows attention logits through
   the inputs it routes, while an attention fault barely moves the router
   weights, so router evidence beside equal attention evidence points at the
   router (each family's `mechanism_rank` and `why`, `FamilySpec`).

The reason names the criterion that decided and, when router and attention
alert together, where each departure began. `first_family` is the primary
family. When the first alert says a pair is not an update of one run there
is no primary family (no mechanism: the input is wrong). The rollback
candidate is the last checkpoint before the primary evidence's departure
began: the older checkpoint of the pair where that run of departures started
— proposed only once it holds on its own (detection/resume.py): its absolute
signals under the report's ceilings and the update into it within the run's
healthy history; else the newest checkpoint before it that holds, or none,
said plainly. `resume` is the plan built on it (`summary.resume`).

The verdict line (`verdict.py`) lists the first alert of every registered
family (`registry.finding_families()`), "–" for those that did not alert.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

from ckptscan.detection.catalog import judged_by_name
from ckptscan.detection.provenance import RULE_IDENTICAL, RULE_UNRELATED
from ckptscan.detection.resume import CheckpointCheck, check_checkpoint, first_checkpoint, resume_plan
from ckptscan.detection.thresholds import Thresholds
from ckptscan.detection.update import FAMILY as LR_FAMILY
from ckptscan.detection.update import RULE_LR_RISE
from ckptscan.detection.verdict import verdict_line
from ckptscan.monitors.interventions import interventions_for
from ckptscan.monitors import registry
from ckptscan.monitors.spec import FamilySpec
from ckptscan.schema.results import (
    NOT_JUDGED,
    CheckpointRef,
    Finding,
    LayerResult,
    LayerSummary,
    PairResult,
    Resume,
    ScanReport,
    Summary,
    counted,
    from_dict,
    step_text,
    worst,
)

# Findings about the input rather than the run's dynamics (detection/provenance.py).
MISUSE_RULES = (RULE_UNRELATED, RULE_IDENTICAL)
# The checkpoints judged on their own that the state keeps (bounded, whatever the run's length): the first, the
# newest CHECKS_KEPT, and the newest one before those that holds. A rollback candidate further back than
# that is resumed from the newest kept checkpoint before it that holds (still verified; maybe older than need be).
CHECKS_KEPT = 32
# Where the learning rate a resume plan goes back to comes from (PairResult.lr).
LR_SOURCE = ("the run's stated learning rate: the loss log's lr where one was given, else the checkpoints' logged "
             "LR history or saved scheduler state")
# A rise of the learning rate is the first alert's cause when it came at most this many pairs
# before the pair where that alert's departure began (or after it, up to the alert).
LR_CAUSE_PAIRS = 1


def __getattr__(name: str) -> Any:
    # MECHANISM_ORDER and MECHANISM_WHY, the last tie-break between families and its reasons, as the families
    # declare them (`FamilySpec.mechanism_rank`, `.why`), read from the registry when asked for.
    if name == "MECHANISM_ORDER":
        return tuple(family.name for family in _ranked())
    if name == "MECHANISM_WHY":
        return {family.name: family.why for family in _ranked() if family.why is not None}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Where an alert's departure began: (its pair's index, newer step, older path, older step).
Onset = tuple[int, "int | None", str, "int | None"]
# {layer: {monitor: (newest value, its baseline)}}: the series' newest judgements, for the per-layer summary.
Baselines = dict[int, dict[str, tuple["float | None", "float | None"]]]
# A family's strongest alert on the first alerting pair: (layer, finding, where its departure began).
Evidence = tuple[int, Finding, Onset]


def summarize(
    report: ScanReport,
    loss_divergence_step: int | None = None,
    baselines: Baselines | None = None,
    thresholds: Thresholds | None = None,
) -> Summary:
    """`baselines`: {layer: {monitor: (current value, its baseline)}} for the per-layer summary;
    `thresholds`: those the report was judged under (for how far each alert went past its level)."""
    state = SummaryState(thresholds)
    for index, pair in enumerate(report.pairs):
        state.add(index, pair, functools.partial(_walk_back, report.pairs, index))
    return state.summary(loss_divergence_step, baselines or {})


class SummaryState:
    """The summary's inputs, kept pair by pair: O(layers) state, whatever the
    number of pairs, from which `summary` is made without looking at them."""

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds if thresholds is not None else Thresholds()
        self.pairs = 0
        self.status = "ok"  # the worst pair status so far
        self.unchanged = True  # every layer of every pair so far is unchanged
        self.first_alert: dict[str, int | None] = {family: None for family in registry.finding_families()}
        self.first_warn: dict[str, int | None] = {family: None for family in registry.finding_families()}
        self.alerted: list[str] = []  # families in the order they first alerted (steps may be unnamed)
        self.layers: dict[int, LayerSummary] = {}
        # The first alert: (pair index, layer, finding) of the primary family, and where its departure began.
        self.first: tuple[int, int, Finding] | None = None
        self.onset: Onset | None = None
        # The other families alerting on that pair, in rank order: each one's strongest evidence.
        self.together: list[Evidence] = []
        # When the first alert says the pair is not an update of one run: that pair, named.
        self.misuse_pair: str | None = None
        # The newest rise of the learning rate (update.py) before the first alert: its pair's
        # index, older checkpoint and finding; and, when it caused the first alert, the same.
        self.lr_rise: tuple[int, str, int | None, Finding] | None = None
        self.lr_cause: tuple[int, str, int | None, Finding] | None = None
        # What the verdict rests on: the pairs judged, why each other pair was not (reason -> pairs, in the
        # order first met), the layers judged on some pair, and whether a MoE layer had no routing to judge.
        self.judged_pairs = 0
        self.unjudged: dict[str, int] = {}
        self.judged_layers: set[int] = set()
        self.routing_unjudged = False
        # The checkpoints up to the first alert judged on their own (detection/resume.py), those kept
        # (CHECKS_KEPT) with their position: 0 the first pair's older checkpoint, i + 1 pair i's newer one;
        # and the LR before and after the rise in lr_rise, with the newer step of its pair.
        self.checks: list[tuple[int, CheckpointCheck]] = []
        self.lr_change: tuple[float, float, int | None] | None = None

    def add(self, index: int, pair: PairResult, locate: Callable[[int | None], Onset]) -> None:
        """Count a judged pair. `locate(step)`: the newest pair so far whose
        newer step is `step` (the pair itself when `step` is None), for the
        onset of the first alert (steps repeat when a run was restarted)."""
        self.pairs += 1
        if pair.not_judged_reason is None:
            self.judged_pairs += 1
            self.judged_layers.update(layer.layer for layer in pair.layers)
        else:
            self.unjudged[pair.not_judged_reason] = self.unjudged.get(pair.not_judged_reason, 0) + 1
        self.routing_unjudged = self.routing_unjudged or any(
            layer.router is not None and layer.router.routing_entropy_norm is None for layer in pair.layers)
        for layer in pair.layers:
            for f in layer.findings:
                if f.severity == "alert" and self.first_alert.get(f.family) is None:
                    self.first_alert[f.family] = pair.to_step
                if f.severity in ("warn", "alert") and self.first_warn.get(f.family) is None:
                    self.first_warn[f.family] = pair.to_step
            self._add_layer(pair, layer)
        self.status = worst([self.status, pair.status])
        self.unchanged = self.unchanged and all(layer.status == "unchanged" for layer in pair.layers)
        alerts = [(layer.layer, f) for layer in pair.layers for f in layer.findings if f.severity == "alert"]
        rise = next((f for layer in pair.layers for f in layer.findings if f.rule == RULE_LR_RISE), None)
        if self.first is None:
            # A rollback is never after the first alert's pair: the checkpoints after it need no check.
            if not self.checks:
                self.checks.append((0, first_checkpoint(pair)))
            self._keep(index + 1, check_checkpoint(pair, self.thresholds))
        if self.first is None and rise is not None:
            self.lr_rise = (index, pair.from_path, pair.from_step, rise)
            if pair.lr is not None and rise.value:
                self.lr_change = (pair.lr / rise.value, pair.lr, pair.to_step)
        if self.first is None and alerts:
            current = (index, pair.to_step, pair.from_path, pair.from_step)
            onsets = {f.onset_step: locate(f.onset_step) if f.onset_step is not None else current
                      for _, f in alerts}
            strongest: dict[str, Evidence] = {}
            for number, f in sorted(alerts, key=lambda a: self._strength(a[1], onsets[a[1].onset_step])):
                strongest.setdefault(f.family, (number, f, onsets[f.onset_step]))
            (number, finding, onset), *self.together = strongest.values()
            self.first, self.onset = (index, number, finding), onset
            self.alerted = list(strongest)  # in rank order
            if finding.rule in MISUSE_RULES:
                self.misuse_pair = _pair_name(pair)
            elif self.lr_rise is not None and self.lr_rise[0] >= onset[0] - LR_CAUSE_PAIRS:
                self.lr_cause = self.lr_rise
        else:
            families = {f.family for _, f in alerts}
            self.alerted += [family for family in registry.finding_families()
                             if family in families and family not in self.alerted]

    def _strength(self, finding: Finding, onset: Onset) -> tuple[int, float, int, int]:
        """Sort key of alerts on one pair, strongest first (the module docstring's order)."""
        return (onset[0], -self._past_level(finding), _rank(finding), _mechanism_rank(finding.family))

    def _past_level(self, finding: Finding) -> float:
        """How many times its alert level the finding's statistic reached, in its rule's units."""
        if finding.score is None:
            return math.inf  # non-finite values and floors carry no score: they are absolute
        t = self.thresholds
        level = {"trend": t.alert_sigma, "level": t.alert_sigma, "reference": t.alert_sigma,
                 "cusum": t.cusum_alert, "pooled_cusum": t.pooled_cusum_alert, "layer_band": t.layer_band_alert,
                 "run_band": t.run_band_alert,
                 "cross_layer": t.cross_layer_z_alert}[finding.rule or ""]
        return finding.score / level

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

    def summary(self, loss_divergence_step: int | None, baselines: Baselines, not_judged: list[str] | None = None
                ) -> Summary:
        """`not_judged`: what else the verdict could not rest on, in words (a pair's order no step tells)."""
        layer_summaries = [dataclasses.replace(self.layers[k]) for k in sorted(self.layers)]
        for s in layer_summaries:
            if s.status == "ok" and s.layer not in self.judged_layers:
                s.status = NOT_JUDGED
            if s.layer in baselines:
                values = baselines[s.layer]
                s.current = {name: current for name, (current, _) in values.items()}
                s.baseline = {name: baseline for name, (_, baseline) in values.items()}
        flagged = sorted(s.layer for s in layer_summaries if s.status in ("warn", "alert"))
        status = self.status
        if status == "ok" and self.pairs and self.unchanged:
            status = "unchanged"
        elif status == "ok" and not self.judged_pairs:
            status = NOT_JUDGED
        unjudged = [f"{counted(count, 'pair')}: {reason}" for reason, count in self.unjudged.items()]
        if self.routing_unjudged:
            unjudged.append("routing entropy and expert load: no probe (--probe FILE, or RUN/probe.safetensors)")
        unjudged += not_judged or []
        rollback, onset_step, first_family, first_step, reason, secondary = None, None, None, None, None, []
        candidate: tuple[int, str, int | None] | None = None  # the rollback candidate: its position, path and step
        if self.first is not None and self.onset is not None and self.misuse_pair is None:
            _, _, finding = self.first
            first_family, first_step = finding.family, self.first_alert[finding.family]
            _, onset_step, from_path, from_step = self.onset
            rollback = CheckpointRef(from_path, from_step)
            candidate = (self.onset[0], from_path, from_step)
            reason = self._reason(finding, self.onset)
            secondary = [family for family in self.alerted if family != first_family]
            if self.lr_cause is not None:
                # The learning rate rose just before the departure: it is the cause, whichever
                # mechanism moved first under it; roll back to before it rose.
                _, rise_path, rise_step, rise = self.lr_cause
                cause = rise.message.split(":")[0]
                reason = (f"{cause}, and the update was as large as the weights at step {step_text(first_step)}"
                          if first_family == LR_FAMILY else
                          f"{cause}, and {first_family} departed at step {step_text(onset_step)} after it (alerting at "
                          f"step {step_text(first_step)})")
                secondary = [family for family in self.alerted if family != LR_FAMILY]
                first_family = LR_FAMILY
                if rise_step is None or from_step is None or rise_step < from_step:
                    rollback = CheckpointRef(rise_path, rise_step)
                    candidate = (self.lr_cause[0], rise_path, rise_step)
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
            primary_family=first_family,
            primary_family_reason=reason,
            secondary_families=secondary,
            judged_pairs=self.judged_pairs,
            not_judged=unjudged,
            # One reason covers every pair; several are told with their counts.
            # No pair at all (a library caller's run of one checkpoint) is said, not raised.
            not_judged_reason=(("; ".join(unjudged[:len(self.unjudged)]) if len(self.unjudged) > 1 else
                                next(iter(self.unjudged), "no pair of checkpoints to compare"))
                               if status == NOT_JUDGED else None),
        )
        summary.message = verdict_line(summary, self.first, self.pairs, len(self.unjudged))
        if self.first is not None and self.misuse_pair is not None:
            # No verdict on a run and no rollback candidate: the input is not an update of one run,
            # and no change to training would fix it (no interventions).
            summary.first_family = self.first[2].family
            summary.message = f"ALERT: {self.misuse_pair} is not an update of one run: {self.first[2].message}"
        else:
            summary.interventions = interventions_for(summary)
            if candidate is not None:
                summary.resume = self._resume(summary, *candidate)
                summary.rollback_candidate = summary.resume.checkpoint
        return summary

    def _keep(self, position: int, check: CheckpointCheck) -> None:
        """Keep `check`, and of the older ones the first, the newest CHECKS_KEPT and the newest holding before."""
        self.checks.append((position, check))
        if len(self.checks) <= CHECKS_KEPT + 2:
            return
        recent = position - CHECKS_KEPT
        older = [kept for kept in self.checks[1:] if kept[0] <= recent and kept[1].holds][-1:]
        self.checks = [self.checks[0], *older, *(kept for kept in self.checks if kept[0] > recent)]

    def _resume(self, summary: Summary, index: int, path: str, step: int | None) -> Resume:
        """The resume plan from the rollback candidate, the older checkpoint (at `path`) of pair `index`
        (detection/resume.py): position `index` when pairs are consecutive, else the newest earlier one at
        that path (every pair from one base)."""
        kept = [check for position, check in self.checks if position <= index]
        start = next((i for i in range(len(kept) - 1, -1, -1) if kept[i].path == path), None)
        if start is None:  # its check was not kept (CHECKS_KEPT): it is not proposed unchecked
            kept.append(CheckpointCheck(path, step, [f"its own check was not kept: it is more than {CHECKS_KEPT} "
                                                     "checkpoints before the first alert"]))
            start = len(kept) - 1
        lr = None
        if self.lr_cause is not None and self.lr_change is not None:
            before, after, rise_to = self.lr_change
            lr = {"current": after, "resume_with": before, "rise_from_step": self.lr_cause[2],
                  "rise_to_step": rise_to, "source": LR_SOURCE}
        first = self.first[2] if self.first is not None else None
        return resume_plan(kept, start, self.first_alert[first.family] if first is not None else None, lr,
                           summary.interventions, first.message.split(":")[0] if first is not None else None)

    def _reason(self, finding: Finding, onset: Onset) -> str:
        """Why the family of the first alert's `finding` is primary, in one sentence (the module docstring's order)."""
        primary, step, began = finding.family, step_text(self.first_alert[finding.family]), step_text(onset[1])
        together = [f.family for _, f, _ in self.together]
        later = [family for family in self.alerted if family != primary and family not in together]
        if together:
            names = f"{', '.join([primary, *together[:-1]])} and {together[-1]}"
            text = f"{names} alerted together at step {step}: " + "; ".join(
                self._why(finding, onset, evidence) for evidence in self.together)
        elif later:
            text = f"{primary} alerted first, at step {step}, its departure beginning at step {began}"
        else:
            text = f"{primary} is the only family that alerted, its departure beginning at step {began}"
        if later:
            text += "; " + ", ".join(f"{family} alerted only at step {step_text(self.first_alert[family])}"
                                     for family in later)
        return text

    def _why(self, finding: Finding, onset: Onset, rival: Evidence) -> str:
        """The criterion that put `finding`'s family before `rival`'s."""
        _, other, other_onset = rival
        primary, second = finding.family, other.family
        if onset[0] != other_onset[0]:
            return (f"{primary}'s departure began earlier, at step {step_text(onset[1])} "
                    f"({second}'s at step {step_text(other_onset[1])})")
        began = f"both departures began at step {step_text(onset[1])}"
        mine, theirs = self._past_level(finding), self._past_level(other)
        if mine != theirs:
            return (f"{began} and {primary}'s went further past its alert level "
                    f"({primary} {_extent(finding, mine)}, {second} {_extent(other, theirs)})")
        if _rank(finding) != _rank(other):
            plainer = ("a non-finite value is the plainest evidence" if _rank(finding) == 0 else
                       f"{primary}'s {finding.monitor} may alert on its own, {second}'s {other.monitor} only "
                       f"when a specific monitor corroborates it")
            return f"{began}, equally far past their alert levels; {plainer}"
        return (f"{began}, equally far past their alert levels, from equally specific monitors; "
                f"{primary} comes first because {_why(primary)}")

    def to_dict(self) -> dict[str, Any]:
        return {"pairs": self.pairs, "status": self.status, "unchanged": self.unchanged,
                "first_alert": self.first_alert, "first_warn": self.first_warn, "alerted": self.alerted,
                "layers": [dataclasses.asdict(s) for s in self.layers.values()],
                "first": [self.first[0], self.first[1], dataclasses.asdict(self.first[2])] if self.first else None,
                "onset": list(self.onset) if self.onset is not None else None,
                "together": [[layer, dataclasses.asdict(f), list(onset)] for layer, f, onset in self.together],
                "misuse_pair": self.misuse_pair, "judged_pairs": self.judged_pairs, "unjudged": self.unjudged,
                "judged_layers": sorted(self.judged_layers), "routing_unjudged": self.routing_unjudged,
                "lr_rise": _rise_dict(self.lr_rise), "lr_cause": _rise_dict(self.lr_cause),
                "checks": [[position, dataclasses.asdict(check)] for position, check in self.checks],
                "lr_change": list(self.lr_change) if self.lr_change is not None else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any], thresholds: Thresholds | None = None) -> SummaryState:
        state = cls(thresholds)
        state.pairs, state.status, state.unchanged = data["pairs"], data["status"], data["unchanged"]
        state.first_alert, state.first_warn = dict(data["first_alert"]), dict(data["first_warn"])
        state.alerted = list(data["alerted"])
        state.layers = {s["layer"]: from_dict(LayerSummary, s) for s in data["layers"]}
        if data["first"] is not None:
            index, layer, finding = data["first"]
            state.first = (index, layer, from_dict(Finding, finding))
        state.onset = tuple(data["onset"]) if data["onset"] is not None else None
        state.together = [(layer, from_dict(Finding, f), tuple(onset)) for layer, f, onset in data["together"]]
        state.misuse_pair = data["misuse_pair"]
        state.lr_rise, state.lr_cause = _rise(data["lr_rise"]), _rise(data["lr_cause"])
        state.judged_pairs, state.unjudged = data["judged_pairs"], dict(data["unjudged"])
        state.judged_layers, state.routing_unjudged = set(data["judged_layers"]), data["routing_unjudged"]
        # A state saved before the checks (a KeyError): the caller judges the run again from its first pair.
        state.checks = [(position, CheckpointCheck(**check)) for position, check in data["checks"]]
        state.lr_change = tuple(data["lr_change"]) if data["lr_change"] is not None else None
        return state


def _rise_dict(rise: tuple[int, str, int | None, Finding] | None) -> list[Any] | None:
    return None if rise is None else [rise[0], rise[1], rise[2], dataclasses.asdict(rise[3])]


def _rise(data: list[Any] | None) -> tuple[int, str, int | None, Finding] | None:
    return None if data is None else (data[0], data[1], data[2], from_dict(Finding, data[3]))


def _walk_back(pairs: list[PairResult], index: int, step: int | None) -> Onset:
    """The newest pair up to `index` whose newer step is `step` (else `index`'s)."""
    found = next((i for i in range(index, -1, -1) if pairs[i].to_step == step), index)
    pair = pairs[found]
    return found, pair.to_step, pair.from_path, pair.from_step


def _ranked() -> list[FamilySpec]:
    """The families with a place in the last tie-break, in its order (the numeric family's rank, 0, first)."""
    return sorted((f for f in registry.finding_specs() if f.mechanism_rank is not None),
                  key=lambda f: f.mechanism_rank or 0)


def _mechanism_rank(family: str) -> int:
    """A family's place in the last tie-break; a family without a `mechanism_rank` comes after those with one."""
    ranked = [f.name for f in _ranked()]
    return ranked.index(family) if family in ranked else len(ranked)


def _why(family: str) -> str:
    """Why `family` comes first in the last tie-break: its own words, else those of the last-ranked family with some."""
    spec = registry.finding_spec(family)
    if spec is not None and spec.why is not None:
        return spec.why
    return [f.why for f in _ranked() if f.why is not None][-1]


def _rank(finding: Finding) -> int:
    """Plainer evidence first: non-finite values, then the specific monitors, then the others."""
    if finding.family == registry.NUMERIC:
        return 0
    monitor = judged_by_name().get(finding.monitor)
    return 1 if monitor is None or monitor.alone == "alert" else 2


def _extent(finding: Finding, past_level: float) -> str:
    """How far past its alert level a finding went, in words."""
    if math.isfinite(past_level):
        return f"{past_level:.1f}× its alert level"
    return {"nonfinite": "non-finite", "floor": "past its hard floor", "ceiling": "past its hard ceiling"}.get(
        finding.rule or "", "absolute")


def _score(finding: Finding) -> float:
    # Non-finite values and floors carry no score: they are the plainest evidence.
    return finding.score if finding.score is not None else float("inf")


def _pair_name(pair: PairResult) -> str:
    older = f"step {pair.from_step}" if pair.from_step is not None else pair.from_path
    newer = f"step {pair.to_step}" if pair.to_step is not None else pair.to_path
    return f"{older} → {newer}"
