"""A rollback that holds: every checkpoint judged on its own before it is
proposed, and the resume plan built on the one that holds (`summary.resume`).

The summary's rollback candidate is chosen by where it sits: the last
checkpoint before the departure that raised the first alert began. That says
nothing of the checkpoint itself, and when a run goes wrong from its first
steps (an LR too high from the start) the candidate is already saturated:
restarting from it restarts the failure. So each checkpoint is checked on
its own, from the pair that ends at it (a checkpoint's own values are the
newer checkpoint's of its pair):

- its absolute signals, under the ceilings the same report applies: the
  attention logit scale (at the model's width, `Thresholds.at_width`), the
  QK-norm logit bound, the output family's logit and shift scales, no
  non-finite value, and, where the optimizer state was saved, Adam's second
  moments not decayed below ε² (detection/optimizer.py);
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

from ckptscan.detection.optimizer import DECAYED_SHARE, RULE_DECAYED
from ckptscan.detection.thresholds import Thresholds
from ckptscan.monitors.optimizer_family import FAMILY as OPTIMIZER
from ckptscan.monitors.optimizer_family import V_BELOW_EPS2
from ckptscan.monitors.output_family import NAME as OUTPUT
from ckptscan.schema.results import UNMEASURED, CheckpointRef, Finding, PairResult, Resume
from ckptscan.trainers import trainer_plan

# Findings that are a checkpoint's absolute signals (checked from the values themselves) or say nothing
# against the checkpoint (an update below the stored dtype's resolution): not a departure of its update.
NOT_DEPARTURES = ("ceiling", "nonfinite", RULE_DECAYED, "precision")
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
    departures = [(layer.layer, f) for layer in pair.layers for f in layer.findings
                  if f.severity in ("warn", "alert") and f.rule not in NOT_DEPARTURES]
    into = f"the update into it (step {_step(pair.from_step)} → {_step(pair.to_step)})"
    if departures:
        layer, finding = departures[0]
        problems.append(f"{into} departed from the run's healthy history: {_first_clause(finding)} (layer {layer})")
    elif pair.not_judged_reason is not None:
        facts.append(f"{into} not judged against the run's history: {pair.not_judged_reason}")
    else:
        facts.append(f"{into} within the run's healthy history")
    return CheckpointCheck(pair.to_path, pair.to_step, problems, facts)


def absolute_signals(pair: PairResult, t: Thresholds) -> tuple[list[str], list[str]]:
    """(problems, facts) of the pair's newer checkpoint's absolute signals
    against the ceilings of `t`: each signal's largest value over the layers."""
    problems: list[str] = []
    facts: list[str] = []

    def judge(name: str, values: list[tuple[int, float | None]], ceiling: float, at: str = "") -> None:
        known = [(value, layer) for layer, value in values if value is not None]
        if not known:
            return
        value, layer = max(known)
        if value > ceiling:
            problems.append(f"{name} {value:.3g} (layer {layer}) above the ceiling {ceiling:.3g}{at}")
        else:
            facts.append(f"{name} {value:.3g} under the ceiling {ceiling:.3g}{at}")

    attention = [(layer.layer, layer.attention) for layer in pair.layers if layer.attention is not None]
    judge("attention logit scale", [(n, a.logit_scale) for n, a in attention], t.logit_scale_ceiling,
          f" for d_model {t.logit_scale_width}")
    judge("QK-norm logit bound", [(n, a.qk_norm_logit_bound) for n, a in attention], t.qk_norm_logit_ceiling)
    output = [(layer.layer, layer.families.get(OUTPUT) or {}) for layer in pair.layers]
    judge("output logit scale", [(n, v.get("output_logit_rms")) for n, v in output], t.output_logit_scale_ceiling)
    judge("log Z shift scale", [(n, v.get("output_shift")) for n, v in output], t.output_shift_ceiling)
    decayed = [(layer.layer, share) for layer in pair.layers
               if (share := (layer.families.get(OPTIMIZER) or {}).get(V_BELOW_EPS2)) is not None]
    if decayed:
        share, layer = max((share, number) for number, share in decayed)
        if share >= DECAYED_SHARE:
            problems.append(f"{share:.0%} of layer {layer}'s W_q/W_k parameters have an Adam second moment below ε² "
                            f"(≥ {DECAYED_SHARE:.0%})")
        else:
            facts.append(f"Adam second moments below ε² on {share:.0%} of W_q/W_k (under {DECAYED_SHARE:.0%})")
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
                  + (f"; at the first alert, step {_step(first_alert_step)}, {evidence}" if evidence else "")
                  + "; restart from initialisation with the interventions below" + _or_earlier(checks[0]))
    else:
        chosen = checks[found]
        resume_step, checkpoint = chosen.step, CheckpointRef(chosen.path, chosen.step)
        reason = f"step {_step(chosen.step)} holds: {', '.join(chosen.facts)}"
        if rejected:
            reason += "; passed over: " + _passed_over(passed, checks[0])
    skip = (resume_step + 1, first_alert_step) if resume_step is not None and first_alert_step is not None \
        and first_alert_step > resume_step else None
    trainer = trainer_plan(checkpoint.path, checkpoint.step, skip, lr is not None) if checkpoint is not None else None
    return Resume(checkpoint, reason, rejected, skip[0] if skip else None, skip[1] if skip else None, lr, shorts,
                  trainer)


def _passed_over(checks: list[CheckpointCheck], first: CheckpointCheck) -> str:
    """The first NAMED checkpoints that fail their own check, newest first, each with why."""
    told = [f"{'the first save, ' if c is first else ''}step {_step(c.step)}, {'; '.join(c.problems)}"
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


def _step(step: int | None) -> str:
    return str(step) if step is not None else "?"
