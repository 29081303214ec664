"""The absolute rules of a pair, in the one order both a run's fold
(`JudgeState.add`, detection/state.py) and a pair judged alone
(`rules.judge_alone`, `diff`) apply them. They need no history, so they are
the same whatever came before:

1. from the first pair, every layer: its non-finite values (numeric), then
   each family's ceilings (`FamilySpec.ceilings`, registry order);
2. after the warm-up (a `diff` knows none: always): whether the pair is an
   update of one run (detection/provenance.py: the update as large as the
   weights, the learning rate's rise), each family's rule on the whole pair
   (`FamilySpec.pair_rule`), then on every layer each family's hard floors
   (`FamilySpec.floors`) and the update's precision (detection/numerics.py).
"""

from __future__ import annotations

from ckptscan.detection.findings import ceiling_findings, family_pair_findings, floor_findings, numeric_findings
from ckptscan.detection.numerics import precision_findings
from ckptscan.detection.provenance import update_of_one_run_findings
from ckptscan.detection.thresholds import Thresholds
from ckptscan.schema.results import PairResult


def first_pair_findings(pair: PairResult, t: Thresholds) -> None:
    """Step 1, in place: each layer's findings start afresh with these (and its judgements empty)."""
    for layer in pair.layers:
        layer.findings = numeric_findings(layer) + ceiling_findings(layer, t)
        layer.judgements = {}


def after_warmup_findings(pair: PairResult, t: Thresholds, lr_before: float | None) -> None:
    """Step 2, in place. `lr_before`: the previous pair's learning rate (None for a pair alone)."""
    update_of_one_run_findings(pair, lr_before)
    family_pair_findings(pair, t)
    for layer in pair.layers:
        layer.findings.extend(floor_findings(layer, t))
        layer.findings.extend(precision_findings(layer))
