"""A rollback that holds: every checkpoint judged on its own before it is
proposed, and the resume plan built on the one that holds (`summary.resume`).

The summary's rollback candidate is chosen by where it sits: the last
checkpoint before the departure that raised the first alert began. That says
nothing of the checkpoint itself, and when a run goes wrong from its first
steps (an LR too high from the start) the candidate is already saturated:
restarting from it restarts the failure. So each checkpoint is checked on
its own, from the pair that ends at it (a checkpoint's own values are the
newer checkpoint's of its pair):

- its absolute signals, under the ceilings the same report applies: each
  family's monitors with a ceiling (`MonitorSpec.ceiling`: the attention
  logit scale at the model's width, `Thresholds.at_width`, the QK-norm logit
  bound, the output family's logit and shift scales), each family's own
  check (`FamilySpec.own_check`: where the optimizer state was saved, Adam's
  second moments not decayed below ε², detection/optimizer.py), and no
  non-finite value;
- the update that led into it, against the run's healthy history (and the
  references, when given): no finding of the series, floor, band, update or
  provenance rules at warn or above on that pair.

The first checkpoint of a run is the older one of the first pair: its own
values are not measured. Checkpoint 0 is the initialisation, which holds by
what it is (no update before it); any other first checkpoint is not proposed
unchecked. The plan walks back from the candidate to the newest checkpoint
that holds; when none does it says so and names none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckptscan.detection.thresholds import Thresholds
from ckptscan.monitors import registry
from ckptscan.schema.results import UNMEASURED, CheckpointRef, Finding, PairResult, Resume, step_text
from ckptscan.trainers import trainer_plan

# Findings that are a checkpoint's absolute signals (checked from the values themselves) or say nothing
# against the checkpoint (an update below the stored dtype's resolution): not a departure of its update;
# beside them, the rules each family names as its checkpoint's own (`FamilySpec.own_rules`).
NOT_DEPARTURES = ("ceiling", "nonfinite", "precision")
# How many passed-over checkpoints the reason names (the JSON's `rejected` lists them all).
NAMED = 3


@dataclass
class CheckpointCheck:
    """One checkpoint judged on its own: `problems` is empty when it holds;
    `facts` are its signals against their ceilings, for saying why."""

    path: str
    step: int | None
    problems: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return not self.problems


def first_checkpoint(pair: PairResult) -> CheckpointCheck:
    """The older checkpoint of a run's first pair: its own values are not measured."""
    if pair.from_step == 0:
        return CheckpointCheck(pair.from_path, 0, [], ["the initialisation: no update before it"])
    return CheckpointCheck(pair.from_path, pair.from_step, [UNMEASURED])


def check_checkpoint(pair: PairResult, t: Thresholds) -> CheckpointCheck:
    """The newer checkpoint of `pair` judged on its own (module docstring)."""
    problems, facts = absolute_signals(pair, t)
    not_departures = (*NOT_DEPARTURES, *(rule for family in registry.families() for rule in family.own_rules))
    departures = [(layer.layer, f) for layer in pair.layers for f in layer.findings
                  if f.severity in ("warn", "alert") and f.rule not in not_departures]
    into = f"the update into it (step {step_text(pair.from_step)} → {step_text(pair.to_step)})"
    if departures:
        layer, finding = departures[0]
        problems.append(f"{into} departed from the run's healthy history: {_first_clause(finding)} (layer {layer})")
    elif pair.not_judged_reason is not None:
        facts.append(f"{into} not judged against the run's history: {pair.not_judged_reason}")
    else:
        facts.append(f"{into} within the run's healthy history")
    return CheckpointCheck(pair.to_path, pair.to_step, problems, facts)


def absolute_signals(pair: PairResult, t: Thresholds) -> tuple[list[str], list[str]]:
    """(problems, facts) of the pair's newer checkpoint's absolute signals,
    family by family in the registry's order: each monitor with a ceiling
    (`MonitorSpec.ceiling`, in its family's section of `t`), its largest value
    over the layers against it; then the family's own check
    (`FamilySpec.own_check`); last, any non-finite value."""
    problems: list[str] = []
    facts: list[str] = []
    for family in registry.families():
        section = t.section(family.name)
        for monitor in family.monitors:
            if monitor.ceiling is None or section is None:
                continue
            known = [(value, layer.layer) for layer in pair.layers if (value := monitor.read(layer)) is not None]
            if not known:
                continue
            value, layer_number = max(known)
            ceiling = getattr(section, monitor.ceiling)
            at = section.ceiling_context(monitor.ceiling) if hasattr(section, "ceiling_context") else ""
            if value > ceiling:
                problems.append(f"{monitor.said} {value:.3g} (layer {layer_number}) above the ceiling "
                                f"{ceiling:.3g}{at}")
            else:
                facts.append(f"{monitor.said} {value:.3g} under the ceiling {ceiling:.3g}{at}")
        if family.own_check is not None:
            own_problems, own_facts = family.own_check(pair, section)
            problems += own_problems
            facts += own_facts
    nonfinite = sorted((layer.layer, role) for layer in pair.layers for role, count in layer.nonfinite.items()
                       if count)
    if nonfinite:
        problems.append(f"non-finite values in {nonfinite[0][1]} (layer {nonfinite[0][0]})")
    return problems, facts


def newest_holding(checks: list[CheckpointCheck], start: int) -> int | None:
    """The position of the newest checkpoint at or before `start` that holds; None when none does."""
    return next((i for i in range(start, -1, -1) if checks[i].holds), None)


def resume_plan(checks: list[CheckpointCheck], start: int, first_alert_step: int | None,
                lr: dict[str, Any] | None, interventions: list[dict[str, str]], evidence: str | None) -> Resume:
    """The plan from the candidate at `checks[start]`: resume from the newest
    checkpoint at or before it that holds (or none), skip the updates from
    there to the first alert, go back to the LR before a rise (`lr`), then the
    interventions. `evidence`: what the first alert found, told when none holds."""
    found = newest_holding(checks, start)
    # The candidates passed over, newest first: those after the one that holds (all of them when none does).
    passed = checks[(found if found is not None else -1) + 1:start + 1][::-1]
    rejected = [{"path": c.path, "step": c.step, "why": "; ".join(c.problems)} for c in passed]
    shorts = list(dict.fromkeys(i.get("short") or i["action"] for i in interventions))
    if found is None:
        resume_step: int | None = 0
        checkpoint = None
        reason = ("no saved checkpoint before the departure holds: " + _passed_over(passed, checks[0])
                  + (f"; at the first alert, step {step_text(first_alert_step)}, {evidence}" if evidence else "")
                  + "; restart from initialisation with the interventions below" + _or_earlier(checks[0]))
    else:
        chosen = checks[found]
        resume_step, checkpoint = chosen.step, CheckpointRef(chosen.path, chosen.step)
        reason = f"step {step_text(chosen.step)} holds: {', '.join(chosen.facts)}"
        if rejected:
            reason += "; passed over: " + _passed_over(passed, checks[0])
    skip = (resume_step + 1, first_alert_step) if resume_step is not None and first_alert_step is not None \
        and first_alert_step > resume_step else None
    trainer = trainer_plan(checkpoint.path, checkpoint.step, skip, lr is not None) if checkpoint is not None else None
    return Resume(checkpoint, reason, rejected, skip[0] if skip else None, skip[1] if skip else None, lr, shorts,
                  trainer)


def _passed_over(checks: list[CheckpointCheck], first: CheckpointCheck) -> str:
    """The first NAMED checkpoints that fail their own check, newest first, each with why."""
    told = [f"{'the first save, ' if c is first else ''}step {step_text(c.step)}, {'; '.join(c.problems)}"
            if c.step is not None else f"{c.path}, {'; '.join(c.problems)}" for c in checks[:NAMED]]
    more = len(checks) - NAMED
    return "; ".join(told) + (f"; and {more} earlier" if more > 0 else "")


def _or_earlier(first: CheckpointCheck) -> str:
    """When the first checkpoint was only unmeasured, saves before it (not in this report) may hold."""
    if first.problems != [UNMEASURED]:
        return ""
    before = f"step {first.step}" if first.step is not None else first.path
    return f", or from an earlier save once ckptscan finds one that holds (a trend over the saves up to {before})"


def _first_clause(finding: Finding) -> str:
    return finding.message.split(": ")[0] if finding.rule in ("cusum", "pooled_cusum") else finding.message
