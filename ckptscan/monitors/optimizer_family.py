"""The optimizer family: Adam's own state, where a checkpoint keeps it by
parameter name (readers/optimizer_state.py). Its monitor is the share of a
layer's W_q and W_k parameters whose second moment v has decayed below ε²
(docs/monitors.md, "Optimizer state"): Adam's update m̂/(√v̂ + ε) of such a
parameter is set by ε, not by its gradient history, and the next gradient it
gets moves it by about the learning rate whatever that gradient's scale
(Molybog et al. 2023, arXiv 2304.09871)."""

from __future__ import annotations

import torch

from ckptscan.monitors.spec import RESTART, FamilySpec, MonitorSpec, family_value

FAMILY = "optimizer"
V_BELOW_EPS2 = "v_below_eps2"


def decayed_share(moments: list[tuple[torch.Tensor, float]]) -> float | None:
    """Over the (v, ε) of a layer's tensors: the fraction of their elements
    with v < ε²; None without elements."""
    total = sum(v.numel() for v, _ in moments)
    if not total:
        return None
    below = sum(int((v.double() < eps * eps).sum().item()) for v, eps in moments)
    return below / total


# What training teams do about an alert of the family, from the literature (ckptscan/interventions.py).
INTERVENTIONS = (
    ("lower β₂", "lower β₂ so the second-moment estimate is not out of date when gradients return (loss spikes "
     "follow an out-of-date estimate)", "Wortsman et al. 2023, arXiv:2304.13013"),
    ("update clipping", "clip each update's RMS as Adafactor does (StableAdamW), for updates that outgrow a "
     "decayed second-moment estimate", "Wortsman et al. 2023, arXiv:2304.13013"),
    RESTART,
)


# Read from the newer checkpoint of each pair (its optimizer state), not a
# property of the update; judged by its level (detection/optimizer.py).
OPTIMIZER = FamilySpec(
    FAMILY,
    (MonitorSpec(V_BELOW_EPS2, FAMILY, "share v<ε²", None, "high", False, family_value(FAMILY, V_BELOW_EPS2)),),
    headline=(),
    interventions=INTERVENTIONS,
    short="optim",
)
