"""Pairs that are not an update of one run: the rule that keeps a misuse from
passing as a verdict (docs/guides/misuse.md).

Every monitor judges an *update*: the change from one checkpoint of a run to
a later one. Two checkpoints that are not that give numbers all the same, and
without this rule a verdict. Two cases show in the weights themselves:

- different runs (two seeds, a restarted run, a wrong folder mixed into a
  run): their weights are unrelated. Within one run the newer weights are
  the older ones plus an update, W_b = W_a + ΔW, so they stay related
  however large the update: cos(W_a, W_b) = (‖W_a‖² + ⟨W_a, ΔW⟩)/(‖W_a‖‖W_b‖)
  keeps the share of W_a that survived. Two weight matrices that share
  nothing have ⟨W_a, W_b⟩ ≈ 0: cos ≈ 0 ± 1/√n for n weights. So a pair is
  two runs only on both pieces of evidence: its update is as large as the
  weights (‖W_b − W_a‖/‖W_a‖ = √(1 + ‖W_b‖²/‖W_a‖²) > 1 for unrelated
  weights, `UNRELATED_CHANGE`: a property of the geometry, not a fitted
  number) *and* the weights are unrelated (the median over layers of the
  smaller of W_q's and W_k's cosines under `RELATED_COSINE`). An update as
  large as the weights between related weights is a finding about the
  training, not about the input (update.py): a learning rate far too high,
  or raised at a resume. Both are read as medians over layers (a different
  run differs in every layer; an unstable layer is the monitors' to judge).
  Pairs whose layers carry no cosine (reports from before it was computed)
  are judged on the update's size alone, as they were then.
- different runs that share their initialisation (one seed, a common
  checkpoint-0): their weights stay related (cos 0.31 between the sample
  runs healthy/ and attention_fault/ at steps 1700 and 1800), so the two
  pieces of evidence above read such a pair as one run's update, too large.
  Where the weights cannot tell, the folders can (`inputs/lineage.py`): the
  checkpoints sit in two run folders and the newer run holds its own
  checkpoint at the older step with other weights (or its loss log parts
  from the older run's before that step). That is the same finding, with
  the folders as its evidence; a run's checkpoint is then never proposed as
  the rollback of another. Checked only after the weights, so a pair the
  weights already call two runs keeps their evidence.
- the same checkpoint twice (a copy): every monitored weight is bit-identical,
  and there is no update to judge (nor is there when the weights did not
  train: frozen, or every update lost to bf16 rounding, which
  `detection/numerics.py` explains). In a run, frozen weights (a LoRA run's
  base model) are what the UNCHANGED verdict covers, so this is a `diff`
  rule only.

Both are alert findings of the numeric family (evidence about the input, not
about the dynamics), so the default gate fails and the JSON report says why.
What the names and the paths already tell (the same path twice, steps in the
wrong order) is an input error before any scan (`run.resolve_pair`).
"""

from __future__ import annotations

import statistics

from ckptscan.detection.update import lr_rise_findings, relative_change, update_findings
from ckptscan.monitors.numeric_family import NAME as NUMERIC
from ckptscan.schema.results import Finding, PairResult

# ‖ΔW‖/‖W_a‖ of unrelated weights is √(1 + ρ²) > 1: an update at least as
# large as the weights may not be an update.
UNRELATED_CHANGE = 1.0
# cos(W_a, W_b) under which two weight sets share nothing of each other.
# Unrelated weights give |cos| ≲ 4/√n (n = 4,096 in the smallest layers
# tested: 0.06); checkpoints of one run 100 steps apart gave at least
# RELATED_MEASURED even where the update was 10× the weights (the natural
# corpus, LR 1e-1: docs/detection.md).
RELATED_COSINE = 0.1
RELATED_MEASURED = 0.1
RULE_UNRELATED = "not_one_run"
RULE_IDENTICAL = "identical"


def relatedness(pair: PairResult) -> float | None:
    """Median over layers of min(cos(W_q(a), W_q(b)), cos(W_k(a), W_k(b)));
    None when no layer has both."""
    values = [min(a.q_weight_cosine, a.k_weight_cosine) for layer in pair.layers
              if (a := layer.attention) is not None and a.q_weight_cosine is not None
              and a.k_weight_cosine is not None]
    return statistics.median(values) if values else None


def unrelated_findings(pair: PairResult) -> bool:
    """An alert on each layer of a pair whose update is as large as the
    weights and whose weights are unrelated, or whose folders show two runs
    (`inputs/lineage.py`) (appended to the layers' findings); whether the
    pair is two runs."""
    change = relative_change(pair)
    if change is None or change < UNRELATED_CHANGE:
        return folder_findings(pair, change)
    related = relatedness(pair)
    if related is not None and related >= RELATED_COSINE:
        return folder_findings(pair, change)
    evidence = f" and the weights are unrelated (cos(W_a, W_b) {related:.2f}, median over layers, < " \
        f"{RELATED_COSINE:g})" if related is not None else ""
    message = (f"the update is as large as the weights (‖ΔW‖/‖W‖ {change:.2f}, median over layers, ≥ "
               f"{UNRELATED_CHANGE:g}){evidence}: not two steps of one run (different runs, a restart, or a "
               "checkpoint from another folder)")
    for layer in pair.layers:
        layer.findings.append(Finding(RULE_UNRELATED, NUMERIC, "alert", change, message,
                                      threshold=UNRELATED_CHANGE, rule=RULE_UNRELATED))
    return True


def folder_findings(pair: PairResult, change: float | None) -> bool:
    """The not_one_run alert where the pair's folders show two runs: the
    weights of runs that share their initialisation stay related, so they
    alone would read such a pair as one run's (too large) update."""
    from ckptscan.inputs.lineage import other_run_evidence

    if not pair.from_path or not pair.to_path:
        return False
    evidence = other_run_evidence(pair.from_path, pair.from_step, pair.to_path)
    if evidence is None:
        return False
    related = relatedness(pair)
    weights = "" if change is None else f"; the pair's weights alone (‖ΔW‖/‖W‖ {change:.2f}" + (
        f", cos(W_a, W_b) {related:.2f}" if related is not None else "") + \
        ", median over layers) cannot tell, as runs from one initialisation stay related"
    message = f"{evidence}: two runs, not two steps of one{weights}"
    for layer in pair.layers:  # no threshold: the evidence is the folders', not a number's
        layer.findings.append(Finding(RULE_UNRELATED, NUMERIC, "alert", change, message, rule=RULE_UNRELATED))
    return True


def update_of_one_run_findings(pair: PairResult, lr_before: float | None) -> None:
    """Whether the pair is an update of one run, and if it is, whether that
    update is as large as the weights or its learning rate rose (update.py);
    `lr_before`: the previous interval's learning rate."""
    if unrelated_findings(pair):
        return
    change = relative_change(pair)
    if change is not None:
        update_findings(pair, change, relatedness(pair), lr_before)
    lr_rise_findings(pair, lr_before)


def identical_findings(pair: PairResult) -> None:
    """An alert on each layer of a pair whose monitored weights are all
    bit-identical (`diff` of one checkpoint and its copy)."""
    parts = [part for layer in pair.layers for part in (layer.attention, layer.router) if part is not None]
    if not parts or not all(part.unchanged for part in parts):
        return
    message = ("every monitored weight is bit-identical in the two checkpoints (the same checkpoint twice, a copy, or "
               "weights that did not train): no update to judge")
    for layer in pair.layers:
        layer.findings.append(Finding(RULE_IDENTICAL, NUMERIC, "alert", 0.0, message, rule=RULE_IDENTICAL))
