"""The resume plan (`summary.resume`, detection/resume.py) as lines of text:
where to resume and why it holds (or that none does), the steps a trainer
may skip, the learning rate to go back to, and the trainer's own arguments
where the run's folder naming names it. The Markdown and HTML reports show
these lines; the terminal (`diff`, `trend`, `watch`, live mode's log) the
same plan in `terminal_lines`: one line a point, each signal against its
ceiling as "value ≤ ceiling", so that it reads within 80 to 120 columns.
Every form says the same plan."""

from __future__ import annotations

import re

from ckptscan.schema.results import UNMEASURED, CheckpointRef, Resume, Summary, step_text
from ckptscan.trainers import TAKES_A_RANGE

# Live mode's snapshots are named "live:step-N" (live/snapshot.py): no file, the trainer's own save at step N.
LIVE_PREFIX = "live:"
# The plan's words, shortened for the terminal (the JSON, Markdown and HTML keep them whole), in order.
SHORTER: tuple[tuple[str, str], ...] = (
    (r" under the ceiling ", " ≤ "),
    (r" above the ceiling ", " > "),
    (r" for d_model (\d+) or less", r" (d_model ≤ \1)"),
    (r" for d_model (\d+)", r" (d_model \1)"),
    (r" \(healthy runs stay under it\)", ""),
    (re.escape(UNMEASURED), "not measured (ckptscan measures a checkpoint as the newer one of a pair)"),
    (r"the update into it \(step (\S+) → (\S+)\)", r"its update \1 → \2"),
    (r"once ckptscan finds one that holds \(a trend over the saves up to (step \S+|\S+)\)",
     r"that a trend over the saves up to \1 finds to hold"),
)


def resume_lines(summary: Summary, interventions: bool = False) -> list[str]:
    """The plan's lines; [] without a plan (no alert, or an input that is not one run).
    `interventions`: end with the interventions' short names (for forms that list them nowhere else)."""
    plan = summary.resume
    if plan is None:
        return []
    where = plan.checkpoint.path if plan.checkpoint is not None else "none"
    lines = [f"resume from: {where}: {plan.reason}"]
    if plan.skip_first_step is not None and plan.skip_last_step is not None:
        lines.append(f"  skip: the updates of steps {plan.skip_first_step}–{plan.skip_last_step}, within which the "
                     "departure began (from the resume point to the first alert)")
    if plan.lr is not None:
        lines.append("  " + lr_text(plan))
    if interventions and plan.interventions:
        lines.append(f"  then: {' · '.join(plan.interventions)}")
    trainer = plan.trainer
    if trainer is not None:
        lines.append(f"  {trainer['framework']} ({trainer['evidence']}): {', or '.join(trainer['arguments'])}; "
                     f"{trainer['skip']}")
    elif plan.checkpoint is not None:
        lines.append("  no trainer named by the run's folder naming: the plan stays generic")
    return lines


def terminal_lines(summary: Summary) -> list[str]:
    """The rollback candidate and the resume plan for the terminal, after the
    verdict: the candidate (or that none holds), then, indented, one line a
    point: why it holds or each reason none does, the steps to skip, the
    learning rate to go back to, the trainer's arguments. [] without a candidate or plan."""
    plan, rollback = summary.resume, summary.rollback_candidate
    if plan is None:
        return [f"rollback candidate: {where(rollback)}, {rollback_why(summary)}"] if rollback is not None else []
    if plan.checkpoint is not None:
        lines = [f"rollback candidate: {where(plan.checkpoint)}, {rollback_why(summary)}"]
        reason = re.sub(r"^step \S+ holds: ", "it holds on its own: ", shorter(plan.reason))
    else:
        lines = ["rollback candidate: none: no saved checkpoint before the departure holds"]
        reason = shorter(plan.reason).removeprefix("no saved checkpoint before the departure holds: ")
    lines += [f"  {clause}" for clause in reason.split("; ")]
    if plan.skip_first_step is not None and plan.skip_last_step is not None:
        lines.append(f"  skip: the updates of steps {plan.skip_first_step}–{plan.skip_last_step}, within which the "
                     "departure began")
    if plan.lr is not None:
        lr = plan.lr
        lines.append(f"  learning rate: back to {lr['resume_with']:.3g} from {lr['current']:.3g} (it rose into the "
                     f"updates from step {step_text(lr.get('rise_from_step'))} to {step_text(lr.get('rise_to_step'))})")
    trainer = plan.trainer
    if trainer is not None:
        no_range = "" if trainer["framework"] in TAKES_A_RANGE else " (it takes no range of steps to skip)"
        lines.append(f"  {trainer['framework']}: {trainer['arguments'][0]}{no_range}")
    return lines


def where(checkpoint: CheckpointRef) -> str:
    """A checkpoint as the terminal names it: its path and step; live mode's
    snapshot as the trainer's own save at that step."""
    if checkpoint.path.startswith(LIVE_PREFIX):
        return f"the trainer's checkpoint at step {step_text(checkpoint.step)} (live mode's snapshot of that step)"
    return f"{checkpoint.path} (step {step_text(checkpoint.step)})"


def shorter(text: str) -> str:
    """The plan's words as the terminal gives them (SHORTER)."""
    for pattern, replacement in SHORTER:
        text = re.sub(pattern, replacement, text)
    return text


def rollback_why(summary: Summary) -> str:
    """What the rollback candidate is, for the terminal's "rollback candidate:" line: the last checkpoint before
    the departure, or, when newer candidates failed their own check, the newest before them that holds."""
    passed = len(summary.resume.rejected) if summary.resume is not None else 0
    if passed:
        return (f"the newest checkpoint before the departure that holds on its own ({passed} newer "
                f"{'one fails' if passed == 1 else 'ones fail'} its own check)")
    return "the last checkpoint before the departure that raised the first alert began"


def lr_text(plan: Resume) -> str:
    """The learning-rate line of a plan whose LR rise caused the first alert."""
    lr = plan.lr or {}
    return (f"learning rate: back to {lr['resume_with']:.3g} from {lr['current']:.3g} (it rose into the updates from "
            f"step {step_text(lr.get('rise_from_step'))} to {step_text(lr.get('rise_to_step'))}; {lr['source']})")
