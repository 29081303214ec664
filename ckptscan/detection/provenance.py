"""Pairs that are not an update of one run: the rule that keeps a misuse from
passing as a verdict (docs/guides/misuse.md).

Every monitor judges an *update*: the change from one checkpoint of a run to
a later one. Two checkpoints that are not that give numbers all the same, and
without this rule a verdict. Two cases show in the weights themselves:

- different runs (two seeds, a restarted run, a wrong folder mixed into a
  run): the update is as large as the weights. For two weight matrices that
  share nothing, ⟨W_a, W_b⟩ ≈ 0, so ‖W_b − W_a‖/‖W_a‖ = √(1 + ‖W_b‖²/‖W_a‖²)
  > 1 whatever their scales. Within one run the weights move by lr-sized
  steps and the relative change between two checkpoints stays well under 1
  once the learning-rate warm-up is over: in the sample runs (a tiny model
  at a high learning rate, among the fastest-moving runs there are) at most
  0.50 (median over layers of the larger of ‖ΔW_q‖/‖W_q‖ and ‖ΔW_k‖/‖W_k‖),
  shrinking as training goes on. Pairs of the sample runs' different
  trajectories give 1.03–3.3 (runs that share their first 1000 steps,
  0.24–0.51: they are one run until they fork). So the bound is 1, where
  the update is as large as the weights it updates (`UNRELATED_CHANGE`), a
  property of the geometry and not a fitted number; it is read as a median
  over layers (a different run differs in every layer, an unstable layer is
  the attention monitors' to judge). Warm-up pairs are exempt (the same
  warm-up that exempts them from the series rules): from a small
  initialisation the weights outgrow themselves (the sample runs: 1.5 from
  step 0 to 100).
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

from ckptscan.results import Finding, PairResult

# ‖ΔW‖/‖W_a‖ of unrelated weights is √(1 + ρ²) > 1: an update at least as
# large as the weights is not an update.
UNRELATED_CHANGE = 1.0
RULE_UNRELATED = "not_one_run"
RULE_IDENTICAL = "identical"


def relative_change(pair: PairResult) -> float | None:
    """Median over layers of max(‖ΔW_q‖/‖W_q‖, ‖ΔW_k‖/‖W_k‖); None when no
    layer has both (non-finite values, no attention)."""
    values = [max(a.dwq_rel_norm, a.dwk_rel_norm) for layer in pair.layers if (a := layer.attention) is not None
              and a.dwq_rel_norm is not None and a.dwk_rel_norm is not None]
    return statistics.median(values) if values else None


def unrelated_findings(pair: PairResult) -> None:
    """An alert on each layer of a pair whose update is as large as the
    weights in most layers (appended to the layers' findings)."""
    change = relative_change(pair)
    if change is None or change < UNRELATED_CHANGE:
        return
    message = (f"the update is as large as the weights (‖ΔW‖/‖W‖ {change:.2f}, median over layers, ≥ "
               f"{UNRELATED_CHANGE:g}): not two steps of one run (different runs, a restart, or a checkpoint from "
               "another folder)")
    for layer in pair.layers:
        layer.findings.append(Finding(RULE_UNRELATED, "numeric", "alert", change, message,
                                      threshold=UNRELATED_CHANGE, rule=RULE_UNRELATED))


def identical_findings(pair: PairResult) -> None:
    """An alert on each layer of a pair whose monitored weights are all
    bit-identical (`diff` of one checkpoint and its copy)."""
    parts = [part for layer in pair.layers for part in (layer.attention, layer.router) if part is not None]
    if not parts or not all(part.unchanged for part in parts):
        return
    message = ("every monitored weight is bit-identical in the two checkpoints (the same checkpoint twice, a copy, or "
               "weights that did not train): no update to judge")
    for layer in pair.layers:
        layer.findings.append(Finding(RULE_IDENTICAL, "numeric", "alert", 0.0, message, rule=RULE_IDENTICAL))
