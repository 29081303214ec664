"""The optimizer family's values of one layer at one checkpoint: read the
second moments of the layer's W_q and W_k (only those) and take the share
decayed below ε² (monitors/optimizer_family.py)."""

from __future__ import annotations

from ckptscan.layouts import LayerPlan
from ckptscan.monitors.optimizer_family import V_BELOW_EPS2, decayed_share
from ckptscan.readers.base import Checkpoint
from ckptscan.readers.optimizer_state import second_moment

# The plan's roles of the attention projections the attention monitors read
# (W_q, W_k, a fused W_qkv, MLA's W_q_a / W_kv_a …, transposed or not).
PROJECTIONS = ("W_q", "W_k")


def optimizer_values(checkpoint: Checkpoint, plan: LayerPlan) -> dict[str, float | None] | None:
    """{V_BELOW_EPS2: share} of the layer at `checkpoint`, or None when the
    checkpoint keeps no moment of some projection by name (a layer is
    judged on all of its projections or none)."""
    names = [name for name, role in plan.roles.items() if role.startswith(PROJECTIONS)]
    moments = []
    for name in names:
        found = second_moment(checkpoint, name)
        if found is None:
            return None
        moments.append(found)
    share = decayed_share(moments)
    return {V_BELOW_EPS2: share} if share is not None else None
