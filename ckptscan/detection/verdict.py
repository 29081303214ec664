"""The verdict of a judged run in one line (`Summary.message`): what fired
first and where, the primary family and why, each family's first alert and
the loss's divergence; or why nothing did."""

from __future__ import annotations

from ckptscan.monitors import registry
from ckptscan.schema.results import NOT_JUDGED, Finding, Summary, counted, step_text


def verdict_line(s: Summary, first: tuple[int, int, Finding] | None, num_pairs: int, unjudged_reasons: int) -> str:
    """The verdict in one line. `unjudged_reasons`: how many of `s.not_judged`, first, are about pairs."""
    flagged = f"flagged layers {s.flagged_layers}"
    if s.status == "alert" and first is not None:
        _, layer, finding = first
        registered = registry.finding_families()
        listed = [*registered, *(family for family in s.first_alert_step if family not in registered)]
        families = ", ".join(f"{family} {step if (step := s.first_alert_step.get(family)) is not None else '–'}"
                             for family in listed)
        step = s.first_alert_step[finding.family]
        primary = f"; primary: {s.primary_family} ({s.primary_family_reason})" if s.primary_family else ""
        also = f"; also: {', '.join(s.secondary_families)}" if s.secondary_families else ""
        text = (f"ALERT: {finding.family} monitors fired first, at step {step_text(step)} "
                f"(layer {layer}, {finding.monitor}){primary}{also}; first alert per family: {families}; {flagged}")
        if s.lead_steps is not None:
            when = f"{s.lead_steps} steps after" if s.lead_steps >= 0 else f"{-s.lead_steps} steps before"
            text += f"; the loss diverged at step {s.loss_divergence_step}, {when} the first alert"
        return text
    also = f"; not judged: {'; '.join(s.not_judged)}" if s.not_judged else ""
    if s.status == "warn":
        return f"WARN: no alert, but monitors departed from their baselines; {flagged}{also}"
    if s.status == "unchanged":
        return "UNCHANGED: the monitored weights did not change"
    if s.status == NOT_JUDGED:
        others = s.not_judged[unjudged_reasons:]
        either = f"; not judged either: {'; '.join(others)}" if others else ""
        return (f"NOT JUDGED: none of the {counted(num_pairs, 'pair')} could be judged yet: {s.not_judged_reason}; "
                f"the hard floors and the non-finite check found nothing{either}")
    judged = f" ({s.judged_pairs} judged)" if s.judged_pairs != num_pairs else ""
    return f"HEALTHY: no monitor fired over {counted(num_pairs, 'pair')}{judged}{also}"
