"""The training update itself: as large as the weights it updates, and the
learning rate that made it (family "update").

Adam moves every weight by about the learning rate per step, whatever the
gradient's scale, so an interval's relative update ‖ΔW‖/‖W‖ follows the sum
of its learning rates over the weights' norm. In healthy runs it stays well
under 1 once the weights have outgrown their initialisation (the sample
runs: at most 0.50 after the first save). An update *as large as the
weights* between two checkpoints of one run (provenance.py tells one run
from two) means the learning rate is too high for these weights: the
weights are being rewritten, not trained — at 10× the LR the attention
logits of the natural corpus saturate within 100 steps
(experiments/natural.py). The first two intervals of a run are not judged: from a
small initialisation the weights outgrow themselves (the sample runs: 1.57
from step 0 to 100, 1.15 from 100 to 200).

Where the run states its learning rate (a loss log's `lr`, a checkpoint's
saved scheduler state: `PairResult.lr`), a rise by LR_RISE or more from one
interval to the next after the warm-up is named (an info finding): a job
resumed with the wrong LR, a scheduler state not restored, a re-warm-up.
When it comes just before the first alert it is that alert's cause
(summary.py): the learning rate, not the mechanism that moved first under it.
"""

from __future__ import annotations

import statistics

from ckptscan.monitors.update_family import FAMILY
from ckptscan.schema.results import Finding, PairResult

# ‖ΔW‖/‖W_a‖ at which the update is as large as the weights (the same bound
# as an unrelated pair's √(1 + ρ²) > 1: provenance.py).
AS_LARGE_AS_THE_WEIGHTS = 1.0
# A schedule changes the LR smoothly after its warm-up: two adjacent intervals
# differ by far less than 2× (cosine, linear, WSD decays over hundreds of
# steps). A rise of 2× or more is a change of the LR, not its schedule.
LR_RISE = 2.0
RULE_UPDATE = "update_size"
RULE_LR_RISE = "lr_rise"


def relative_change(pair: PairResult) -> float | None:
    """Median over layers of max(‖ΔW_q‖/‖W_q‖, ‖ΔW_k‖/‖W_k‖); None when no
    layer has both (non-finite values, no attention)."""
    values = [max(a.dwq_rel_norm, a.dwk_rel_norm) for layer in pair.layers if (a := layer.attention) is not None
              and a.dwq_rel_norm is not None and a.dwk_rel_norm is not None]
    return statistics.median(values) if values else None


def outgrowing_initialisation(pair: PairResult) -> bool:
    """Whether the pair lies in the first two intervals of its run at its
    spacing (older step < 2 × the interval): where the weights still outgrow
    their small initialisation (the sample runs: 1.57 from step 0 to 100,
    1.15 from 100 to 200), as `trend`'s warm-up of two pairs does."""
    if pair.from_step is None or pair.to_step is None:
        return False
    return pair.from_step < 2 * (pair.to_step - pair.from_step)


def update_findings(pair: PairResult, change: float, relatedness: float | None, lr_before: float | None) -> None:
    """An alert on each layer of a pair of one run whose update is as large as
    the weights (appended to the layers' findings)."""
    if change < AS_LARGE_AS_THE_WEIGHTS or outgrowing_initialisation(pair):
        return
    related = f", though the weights are still one run's (cos(W_a, W_b) {relatedness:.2f})" \
        if relatedness is not None else ""
    cause = lr_text(pair, lr_before)
    message = (f"the update is as large as the weights (‖ΔW‖/‖W‖ {change:.2f}, median over layers, ≥ "
               f"{AS_LARGE_AS_THE_WEIGHTS:g}){related}: the learning rate is too high for these weights"
               + (f"; {cause}" if cause else ""))
    for layer in pair.layers:
        layer.findings.append(Finding(RULE_UPDATE, FAMILY, "alert", change, message,
                                      threshold=AS_LARGE_AS_THE_WEIGHTS, rule=RULE_UPDATE))


def lr_rise(pair: PairResult, lr_before: float | None) -> float | None:
    """How many times the previous interval's learning rate this pair's is,
    when that is LR_RISE or more; None otherwise or where the LR is unknown."""
    if pair.lr is None or lr_before is None or lr_before <= 0:
        return None
    ratio = pair.lr / lr_before
    return ratio if ratio >= LR_RISE else None


def lr_text(pair: PairResult, lr_before: float | None) -> str | None:
    ratio = lr_rise(pair, lr_before)
    if ratio is None or pair.lr is None or lr_before is None:
        return None
    return (f"the learning rate rose ×{ratio:.3g} into the updates from step {pair.from_step} to {pair.to_step} "
            f"({lr_before:.3g} → {pair.lr:.3g})")


def lr_rise_findings(pair: PairResult, lr_before: float | None) -> None:
    """An info finding on the first layer of a pair into which the learning
    rate rose (the cause summary.py names when an alert follows)."""
    ratio, text = lr_rise(pair, lr_before), lr_text(pair, lr_before)
    if ratio is None or text is None or not pair.layers:
        return
    message = (f"{text}: a resume with another LR, a scheduler state not restored, or a re-warm-up; the "
               "updates grow with it")
    pair.layers[0].findings.append(Finding("lr", FAMILY, "info", ratio, message, threshold=LR_RISE,
                                           rule=RULE_LR_RISE))

