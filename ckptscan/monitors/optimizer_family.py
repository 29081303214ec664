"""The optimizer family: Adam's own state, where a checkpoint keeps it by
parameter name (readers/optimizer_state.py). Its monitor is the share of a
layer's W_q and W_k parameters whose second moment v has decayed below ε²
(docs/monitors.md, "Optimizer state"): Adam's update m̂/(√v̂ + ε) of such a
parameter is set by ε, not by its gradient history, and the next gradient it
gets moves it by about the learning rate whatever that gradient's scale
(Molybog et al. 2023, arXiv 2304.09871)."""

from __future__ import annotations

from typing import Any

import torch

from ckptscan.monitors.spec import RESTART, FamilySpec, MonitorSpec, family_value
from ckptscan.schema.results import Finding, PairResult

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


# The share of a layer's projection parameters with v < ε² that warns.
DECAYED_SHARE = 0.25
RULE_DECAYED = "v_below_eps2"
ACTIONS = ("a larger ε (1e-6 and above where v decays)", "a lower β₂ (0.95)",
           "clipping each update's RMS (StableAdamW, Wortsman et al. 2023, arXiv 2304.13013)")


def decayed_moment_findings(pair: PairResult, t: Any = None) -> None:
    """The family's rule (detection/optimizer.py says why): a warning on each
    layer of the pair whose newer checkpoint's share of W_q/W_k parameters
    with v < ε² is DECAYED_SHARE or more. Layers without an optimizer state
    read (none saved, or not by name) are not judged."""
    for layer in pair.layers:
        share = layer.families.get(FAMILY, {}).get(V_BELOW_EPS2)
        if share is None or share < DECAYED_SHARE:
            continue
        message = (f"{share:.0%} of the layer's W_q/W_k parameters have an Adam second moment below ε² at step "
                   f"{pair.to_step} (≥ {DECAYED_SHARE:.0%}): their gradient history has decayed, and a returning "
                   f"gradient moves them by the full learning rate; consider {', '.join(ACTIONS[:-1])} or "
                   f"{ACTIONS[-1]}")
        layer.findings.append(Finding(RULE_DECAYED, FAMILY, "warn", share, message, threshold=DECAYED_SHARE,
                                      rule=RULE_DECAYED))


def decayed_moment_check(pair: PairResult, t: Any = None) -> tuple[list[str], list[str]]:
    """A checkpoint judged on its own (detection/resume.py): (problems, facts)
    of the largest share of a layer's W_q/W_k parameters with v < ε² in the
    pair's newer checkpoint, against DECAYED_SHARE; none where no layer's
    optimizer state was read."""
    decayed = [(share, layer.layer) for layer in pair.layers
               if (share := layer.families.get(FAMILY, {}).get(V_BELOW_EPS2)) is not None]
    if not decayed:
        return [], []
    share, layer = max(decayed)
    if share >= DECAYED_SHARE:
        return [f"{share:.0%} of layer {layer}'s W_q/W_k parameters have an Adam second moment below ε² "
                f"(≥ {DECAYED_SHARE:.0%})"], []
    return [], [f"Adam second moments below ε² on {share:.0%} of W_q/W_k (under {DECAYED_SHARE:.0%})"]


# What training teams do about an alert of the family, from the literature (ckptscan/monitors/interventions.py).
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
    pair_rule=decayed_moment_findings,
    own_check=decayed_moment_check,
    own_rules=(RULE_DECAYED,),  # the checkpoint's moments, not its update
)
