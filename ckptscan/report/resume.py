"""The resume plan (`summary.resume`, detection/resume.py) as lines of text:
where to resume and why it holds (or that none does), the steps a trainer
may skip, the learning rate to go back to, and the trainer's own arguments
where the run's folder naming names it. The terminal tables print these
lines after the rollback candidate's; the Markdown and HTML reports show the
same lines, so every form says the same plan."""

from __future__ import annotations

from ckptscan.schema.results import Resume, Summary


def resume_lines(summary: Summary, interventions: bool = False) -> list[str]:
    """The plan's lines; [] without a plan (no alert, or an input that is not one run).
    `interventions`: end with the interventions' short names (for forms that list them nowhere else)."""
    plan = summary.resume
    if plan is None:
        return []
    where = plan.checkpoint.path if plan.checkpoint is not None else "none"
    lines = [f"resume from: {where}: {plan.reason}"]
    if plan.skip_first_step is not None and plan.skip_last_step is not None:
        lines.append(f"  skip: the updates of steps {plan.skip_first_step}–{plan.skip_last_step}, in which the "
                     "departure grew (from the resume point to the first alert)")
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
            f"step {_step(lr.get('rise_from_step'))} to {_step(lr.get('rise_to_step'))}; {lr['source']})")


def _step(step: int | None) -> str:
    return str(step) if step is not None else "?"
