"""The update family: the training update itself, against the weights it
updates (detection/update.py judges it, with the learning rate where the run
states it). Its one monitor is read from the attention results: each layer's
larger relative update of W_q and W_k, ‖ΔW‖/‖W_a‖."""

from __future__ import annotations

from ckptscan.monitors.spec import FamilySpec, MonitorSpec
from ckptscan.schema.results import LayerResult


def _relative_update(layer: LayerResult) -> float | None:
    att = layer.attention
    if att is None or att.dwq_rel_norm is None or att.dwk_rel_norm is None:
        return None
    return max(att.dwq_rel_norm, att.dwk_rel_norm)


# Not a series: an update's size follows the learning-rate schedule; the
# rule is its size against the weights (≥ 1) and against the LR.
UPDATE = FamilySpec(
    "update",
    (MonitorSpec("update_size", "update", "‖ΔW‖/‖W‖", None, "high", True, _relative_update),),
    headline=(),
)
