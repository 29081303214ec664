"""The update family: the training update itself, against the weights it
updates (detection/update.py judges it, with the learning rate where the run
states it). `update_size` is read from the attention results: each layer's
larger relative update of W_q and W_k, ‖ΔW‖/‖W_a‖. `update_rms` is the
family's own value, the larger root-mean-square element change of W_q and
W_k; `update_per_lr` is it per unit of learning rate summed over the
interval, RMS(ΔW)/Σ_t η_t, which detection fills where the pair's learning
rate is known (docs/monitors.md derives the ≤ ~1 bound from Adam's update)."""

from __future__ import annotations

import math

import torch

from ckptscan.layouts import LayerWeights
from ckptscan.monitors.spec import RESTART, FamilySpec, MonitorSpec, family_value
from ckptscan.schema.results import LayerResult, PairResult

FAMILY = "update"
UPDATE_RMS = "update_rms"
UPDATE_PER_LR = "update_per_lr"


def _relative_update(layer: LayerResult) -> float | None:
    att = layer.attention
    if att is None or att.dwq_rel_norm is None or att.dwk_rel_norm is None:
        return None
    return max(att.dwq_rel_norm, att.dwk_rel_norm)


def update_values(a: LayerWeights, b: LayerWeights) -> dict[str, float | None]:
    """The larger RMS element change √(mean((b − a)²)) of the layer's W_q and
    W_k (the q/k head blocks the attention monitors read, a QK-norm's gain
    folded in); None without both, of different shapes, or when it is not
    finite (a non-finite weight).

    Precision: the blocks are in the scan's compute dtype (float32 by
    default), so b − a is exact for bf16/fp16 checkpoints and correctly
    rounded otherwise; `torch.dist` accumulates in double on the CPU and
    rounds its result to float32: ~1e-7 relative, for a value that is
    reported, not judged. (A float64 copy of both blocks cost 7x as much: 68
    ms of a 1B layer's W_q on one core.) One readback for both."""
    pairs = [(x, y) for x, y in ((a.q, b.q), (a.k, b.k))
             if x is not None and y is not None and x.shape == y.shape and x.numel()]
    if not pairs:
        return {UPDATE_RMS: None}
    norms = torch.stack([torch.dist(y, x) for x, y in pairs]).tolist()
    found = [norm / math.sqrt(x.numel()) for norm, (x, _) in zip(norms, pairs) if math.isfinite(norm)]
    return {UPDATE_RMS: max(found) if found else None}


def fill_update_per_lr(pair: PairResult) -> None:
    """Each layer's RMS(ΔW)/Σ_t η_t where the pair's learning rate is known
    (compute fills it once the LR is, from whichever source): Σ_t η_t = the
    interval's mean LR × its number of updates (to_step − from_step). Reported, not judged: on the
    natural corpus it stays 0.06–0.14 from LR 3e-3 to 1e-1, saturating runs
    included (docs/monitors.md), so no level of it tells an unstable run."""
    steps = (pair.to_step - pair.from_step) if pair.from_step is not None and pair.to_step is not None else 0
    for layer in pair.layers:
        values = layer.families.get(FAMILY)
        if values is None:
            continue
        rms = values.get(UPDATE_RMS)
        if rms is None or pair.lr is None or pair.lr <= 0 or steps <= 0:
            values.pop(UPDATE_PER_LR, None)  # recomputed without the LR: no stale value
            continue
        values[UPDATE_PER_LR] = rms / (pair.lr * steps)


# What training teams do about an alert of the family, from the literature (ckptscan/monitors/interventions.py).
INTERVENTIONS = (
    ("lower LR", "lower the learning rate (or restore the one the run had: check the LR a resumed job took from "
     "its flags against the scheduler state it saved)", "Wortsman et al. 2023, arXiv:2309.14322"),
    ("longer warm-up", "lengthen the learning-rate warm-up, which makes the loss less sensitive to the learning "
     "rate",
     "Wortsman et al. 2023, arXiv:2309.14322"),
    ("update clipping", "clip each update's RMS as Adafactor does (StableAdamW), for updates that outgrow a "
     "decayed second-moment estimate", "Wortsman et al. 2023, arXiv:2304.13013"),
    RESTART,
)


# Not a series: an update's size follows the learning-rate schedule; the
# rules are its size against the weights (≥ 1) and against the LR.
UPDATE = FamilySpec(
    FAMILY,
    (MonitorSpec("update_size", FAMILY, "‖ΔW‖/‖W‖", None, "high", True, _relative_update),
     MonitorSpec(UPDATE_RMS, FAMILY, "RMS(ΔW)", None, "high", True, family_value(FAMILY, UPDATE_RMS)),
     MonitorSpec(UPDATE_PER_LR, FAMILY, "RMS(ΔW)/Ση", None, "high", True, family_value(FAMILY, UPDATE_PER_LR))),
    headline=(),
    compute=update_values,
    fill=fill_update_per_lr,
    interventions=INTERVENTIONS,
    mechanism_rank=1,
    why="an update as large as the weights moves every mechanism's monitors",
)
