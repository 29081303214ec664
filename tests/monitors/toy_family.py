"""A toy monitor family, declared the way a new family is, whole, in one
module: one monitor of simple math on a layer's q weights, its words and its
judging, with a `compute` (its values are no built-in result's); its own
absolute rule (a ceiling on the monitor, judged from the first pair) with
its own thresholds section, its interventions and its place and words in
the summary's last tie-break. Tests register it with one line,
`registry.registered(TOY)`; no ckptscan module names it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ckptscan.layouts import LayerWeights
from ckptscan.monitors.spec import RESTART, FamilySpec, Judging, MonitorSpec, family_value
from ckptscan.schema.results import Finding, LayerResult

NAME = "toy"
MONITOR = "q_norm_change"
CEILING = "q_norm_change_ceiling"
INTERVENTION = ("smaller W_q LR", "lower the learning rate of the query projections",
                "Toy et al. 2026, arXiv:2601.00001")
WHY = "a toy's W_q grows before any other family's monitors move"


def q_norm_change(a: LayerWeights, b: LayerWeights) -> dict[str, float | None]:
    """(‖W_q(b)‖_F − ‖W_q(a)‖_F) / ‖W_q(a)‖_F, in float64."""
    if a.q is None or b.q is None:
        return {MONITOR: None}
    before, after = (float(torch.linalg.vector_norm(q.to(torch.float64))) for q in (a.q, b.q))
    return {MONITOR: (after - before) / before if before > 0 else None}


@dataclass(frozen=True)
class ToyThresholds:
    """The toy family's section of `Thresholds` (`--set q_norm_change_ceiling=0.04`)."""

    q_norm_change_ceiling: float = 1.0  # ‖W_q‖ growing by this share in one interval: an alert from the first pair

    def problems(self) -> list[str]:
        return [] if self.q_norm_change_ceiling > 0 else [f"need {CEILING} > 0"]


def ceiling(layer: LayerResult, t: Any) -> list[Finding]:
    """The toy monitor over its ceiling (`t`: the family's section)."""
    value = layer.families.get(NAME, {}).get(MONITOR)
    if value is None or value <= t.q_norm_change_ceiling:
        return []
    return [Finding(MONITOR, NAME, "alert", value,
                    f"‖Wq‖ grew by {value:.1%} in one interval, above the ceiling {t.q_norm_change_ceiling:g}",
                    threshold=t.q_norm_change_ceiling, rule="ceiling")]


TOY = FamilySpec(
    NAME,
    (MonitorSpec(MONITOR, NAME, "‖Wq‖ change", None, "high", False, family_value(NAME, MONITOR),
                 Judging(0.001, "alert", per_update=True)),),
    headline=(MONITOR,),
    compute=q_norm_change,
    interventions=(INTERVENTION, RESTART),
    mechanism_rank=4,  # after the built-in ranked families
    why=WHY,
    thresholds=ToyThresholds,
    ceilings=ceiling,
)
