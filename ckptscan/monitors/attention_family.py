"""The attention family's monitors: which numbers of a layer's
`AttentionResult` (ckptscan/monitors/attention.py computes them) are
monitored, in which words, and how detection judges each.

Why these settings (measured on healthy and fault-injected runs of the
experiments' trainer; docs/detection.md and docs/calibration.md have the numbers):

- Normalised entropies are scale-free, so learning-rate warm-up and decay do
  not move them; in healthy runs the Δ2 and ΔW entropies rise after warm-up
  and then stay flat. Their baseline never follows a falling trend, and a
  frozen post-warm-up level is checked too (a slow fault is still a fault).
- Norms (the logit bound ‖Q_hᵀK_g‖₂) grow with the learning rate in healthy
  runs: judged on a log scale, following the trend, upward only.
- Not judged: update sizes (they follow the learning-rate schedule).
- "alone": the Δ2 entropy is the family's specific monitor (it never came
  near its alarm levels in healthy runs or in router faults) and may alert
  alone; the others may warn alone and reach alert only when it is at least
  at warn in the same layer on the same pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ckptscan.monitors.spec import RESTART, FamilySpec, Judging, MonitorSpec
from ckptscan.schema.results import Finding, LayerResult


def _attention(field: str) -> Callable[[LayerResult], float | None]:
    return lambda layer: getattr(layer.attention, field) if layer.attention is not None else None


def _unnormalised_logit_bound(layer: LayerResult) -> float | None:
    """σ_max(Q_hᵀK_g), where it bounds the logits: with a per-head QK-norm the
    projections' scale drops out of them (a high LR grows W_q and W_k while
    the logits stay put), and the QK-norm's own bound is judged instead."""
    att = layer.attention
    if att is None or att.qk_norm_logit_bound is not None:
        return None
    return att.qk_logit_bound


def _monitor(name: str, label: str, unit: str | None, bad: str, log: bool, judging: Judging,
             words: str | None = None) -> MonitorSpec:
    return MonitorSpec(name, "attention", label, unit, bad, log, _attention(name), judging, words=words)


@dataclass(frozen=True)
class AttentionThresholds:
    """The attention family's thresholds (its section of `Thresholds`; flat names in ckptscan.toml)."""

    # Attention logit scale (monitors.attention.logit_scale, the logits'
    # standard deviation for unit-RMS inputs): its healthy level grows with
    # the model, so the ceiling does, as √(d_model / logit_scale_width)
    # above logit_scale_width (`at_width`: 2 at d_model 64, 2.83 at 128, 4 at
    # 256). Healthy calibration runs reach at most 0.65 of it at every width
    # (1.19 at d_model 64, 1.08 at 128, 2.60 at 256: generation 3's seeds);
    # at one recipe the width controls double from d_model 128 to 256 (0.63 →
    # 1.22), at generation 4's the healthy level grows ×1.15 from 64 to 128:
    # √d lies between. Runs whose logged attention logits pass 100 are at
    # 1.29 times it or more (median 2.9) by their first checkpoint after
    # (experiments/natural.py --calibrate, docs/calibration.md). With a
    # per-head QK-norm the gains bound every logit (qk_norm_logit_bound):
    # above qk_norm_logit_ceiling softmax can be one-hot (e^100 between two keys).
    # ("after": where the JSON report's "thresholds" lists the key.)
    logit_scale_ceiling: float = field(default=2.0, metadata={"after": "band_scale_factor"})
    logit_scale_width: int = 64
    qk_norm_logit_ceiling: float = 100.0
    # Hard floor (an alert whatever the history): a normalised Δ2 entropy this
    # low means the update of every head concentrates on ~1 direction.
    delta2_entropy_norm_floor: float = field(default=0.2, metadata={"after": "run_band_alert"})

    def problems(self) -> list[str]:
        if self.logit_scale_ceiling <= 0 or self.logit_scale_width < 1:
            return [f"need logit_scale_ceiling > 0 and logit_scale_width ≥ 1 (got {self.logit_scale_ceiling}, "
                    f"{self.logit_scale_width})"]
        return []

    def at_width(self, hidden_size: int | None) -> AttentionThresholds:
        """For a model of d_model `hidden_size`: the logit-scale ceiling × √(hidden_size / logit_scale_width)
        when wider, with the width it is now for (so applying it again changes nothing)."""
        if hidden_size is None or hidden_size <= self.logit_scale_width:
            return self
        scaled = self.logit_scale_ceiling * math.sqrt(hidden_size / self.logit_scale_width)
        return replace(self, logit_scale_ceiling=scaled, logit_scale_width=hidden_size)

    def ceiling_context(self, key: str) -> str:
        """What the ceiling `key` is stated with (a rollback's reason): the logit-scale ceiling's width."""
        return f" for d_model {self.logit_scale_width}" if key == "logit_scale_ceiling" else ""


def ceiling_findings(layer: LayerResult, t: Any) -> list[Finding]:
    """Unchanged W_q/W_k (info), and the attention logit scale over its
    ceiling: an absolute bound on what the newer checkpoint's attention can
    do, so judged from the first pair (no warm-up, no baseline: a run
    saturating from its first checkpoints has no healthy history to depart
    from)."""
    att = layer.attention
    if att is None:
        return []
    findings = []
    if att.unchanged:
        findings.append(Finding("delta2_entropy", "attention", "info", None,
                                "W_q/W_k unchanged between the checkpoints", rule="unchanged"))
    scale, bound = att.logit_scale, att.qk_norm_logit_bound
    if scale is not None and scale > t.logit_scale_ceiling:
        findings.append(Finding(
            "logit_scale", "attention", "alert", scale,
            f"attention logit scale {scale:.3g} above the ceiling {t.logit_scale_ceiling:.3g} for d_model "
            f"{t.logit_scale_width} or less (healthy runs stay under it): the logits grow toward a one-hot "
            "softmax (attention logit growth)",
            threshold=t.logit_scale_ceiling, rule="ceiling",
        ))
    if bound is not None and bound > t.qk_norm_logit_ceiling:
        findings.append(Finding(
            "qk_norm_logit_bound", "attention", "alert", bound,
            f"the QK-norm gains allow attention logits up to {bound:.3g}, above {t.qk_norm_logit_ceiling:g}: "
            "softmax can be one-hot despite the QK-norm",
            threshold=t.qk_norm_logit_ceiling, rule="ceiling",
        ))
    return findings


def floor_findings(layer: LayerResult, t: Any) -> list[Finding]:
    """A normalised Δ2 entropy under its hard floor: an alert whatever the history (after the warm-up)."""
    att = layer.attention
    delta2 = att.delta2_entropy_norm if att is not None else None
    if delta2 is None or delta2 >= t.delta2_entropy_norm_floor:
        return []
    return [Finding(
        "delta2_entropy_norm", "attention", "alert", delta2,
        f"normalised Δ2 entropy {delta2:.3f} below the floor {t.delta2_entropy_norm_floor}: "
        "the QK update has collapsed onto a few directions",
        threshold=t.delta2_entropy_norm_floor, rule="floor",
    )]


# What training teams do about an alert of the family, from the literature (ckptscan/monitors/interventions.py).
INTERVENTIONS = (
    ("QK-norm", "normalize queries and keys before their dot product (QK-layernorm / QK-norm)",
     "Wortsman et al. 2023, arXiv:2309.14322; OLMo 2, arXiv:2501.00656"),
    ("logit soft-capping", "cap the attention logits: tanh soft-capping (Gemma 2, cap 50), or softmax capping "
     "with QK-norm",
     "Gemma 2, arXiv:2408.00118; Rybakov et al. 2024, arXiv:2410.16682"),
    ("QK-Clip", "rescale a head's W_q and W_k after an update whose max attention logit exceeds a threshold "
     "(QK-Clip)",
     "Kimi K2, arXiv:2507.20534"),
    ("σReparam", "reparametrize the linear layers with spectral normalization and a learned scalar (sigmaReparam), "
     "which prevents attention entropy collapse", "Zhai et al. 2023, arXiv:2303.06296"),
    ("lower LR", "lower the learning rate: attention-logit growth is a high-learning-rate instability",
     "Wortsman et al. 2023, arXiv:2309.14322"),
    RESTART,
)


ATTENTION = FamilySpec(
    "attention",
    (
        _monitor("delta2_entropy_norm", "Δ2 H/ln n", "H / ln n", "low", False,
                 Judging(0.01, "alert", per_update=True, cross_layer=True), words="normalised Δ2 entropy"),
        _monitor("delta2_entropy_norm_min", "Δ2 H/ln n (worst head)", None, "low", False,
                 Judging(0.02, "warn", per_update=True)),
        _monitor("dwq_entropy_norm", "ΔWq H/ln r", "H / ln r", "low", False, Judging(0.01, "warn", per_update=True)),
        _monitor("dwk_entropy_norm", "ΔWk H/ln r", None, "low", False, Judging(0.01, "warn", per_update=True)),
        MonitorSpec("qk_logit_bound", "attention", "logit bound", None, "high", True, _unnormalised_logit_bound,
                    Judging(0.05, "alert", follow_trend=True)),
        # Absolute: judged against its ceiling from the first pair (detection/findings.py), not as a series.
        MonitorSpec("logit_scale", "attention", "logit scale", "logit σ", "high", True, _attention("logit_scale"),
                    ceiling="logit_scale_ceiling", words="attention logit scale"),
        MonitorSpec("qk_norm_logit_bound", "attention", "QK-norm logit bound", "largest logit", "high", True,
                    _attention("qk_norm_logit_bound"), ceiling="qk_norm_logit_ceiling"),
    ),
    headline=("delta2_entropy_norm",),
    interventions=INTERVENTIONS,
    mechanism_rank=3,
    present=lambda layer: layer.attention is not None,
    # A notice names each layer's head whose Δ2 entropy fell most.
    head=lambda layer: layer.attention.delta2_entropy_worst_head if layer.attention is not None else None,
    short="attn",
    thresholds=AttentionThresholds,
    ceilings=ceiling_findings,
    floors=floor_findings,
    banded=True,
)
