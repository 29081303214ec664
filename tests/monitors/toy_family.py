"""A toy monitor family, declared the way a new family is: one monitor of
simple math on a layer's q weights, its words and its judging, with a
`compute` (its values are no built-in result's). Tests register it with
`registry.registered(TOY)`; no ckptscan module names it."""

from __future__ import annotations

import torch

from ckptscan.layouts import LayerWeights
from ckptscan.monitors.spec import FamilySpec, Judging, MonitorSpec, family_value

NAME = "toy"
MONITOR = "q_norm_change"


def q_norm_change(a: LayerWeights, b: LayerWeights) -> dict[str, float | None]:
    """(‖W_q(b)‖_F − ‖W_q(a)‖_F) / ‖W_q(a)‖_F, in float64."""
    if a.q is None or b.q is None:
        return {MONITOR: None}
    before, after = (float(torch.linalg.vector_norm(q.to(torch.float64))) for q in (a.q, b.q))
    return {MONITOR: (after - before) / before if before > 0 else None}


TOY = FamilySpec(
    NAME,
    (MonitorSpec(MONITOR, NAME, "‖Wq‖ change", None, "high", False, family_value(NAME, MONITOR),
                 Judging(0.001, "alert", per_update=True)),),
    headline=(MONITOR,),
    compute=q_norm_change,
)
