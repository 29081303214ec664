"""The output family: the LM head and the final norm in front of it
(ckptscan/monitors/output.py computes them), their words and how detection
judges them. Its values are the model's last layer's (the layout reads the
head with that layer); every other layer has none.

Why these settings (docs/monitors.md, "Output family", has the derivation;
docs/detection.md the calibration):

- The output logit scale (RMS and largest row of D_γf W_head) is what a
  checkpoint allows the logits to be; output-logit divergence (Wortsman et
  al. 2023, §3.2) is its growth and that of the mean row, which shifts every
  logit, and log Z, together. Both are absolute: judged against a ceiling
  from the first pair (detection/output.py), not as a series. In generation 4
  no run diverged in its output logits, so the ceilings are set from the
  healthy spread with a margin, not from a divergence.
- The head's update spectrum and its mean-row coherence are reported, not
  judged: in healthy runs they follow the LR schedule and the tied
  embedding's sparse token updates, and no run showed what their departure
  means.
- The update spectrum (dw_head_entropy_norm) is null unless asked for
  (`spectrum=True`): it needs the d × d Gram of ΔW, V·d² multiply-adds
  (134 G for a 32k × 2k head, 8.6 T for 128k × 8k) against O(V·d) for every
  other value here, and it changed no verdict in the corpus (nothing judges
  it). No sketch replaces it: the entropy weighs every singular value, and
  no O(V·d) estimate of the small ones has an error bound tight enough to
  report (docs/monitors.md, "Output family").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ckptscan.layouts import LayerWeights
from ckptscan.monitors.output import head_pair, logit_rms, mean_row_share, shift_scale
from ckptscan.monitors.spec import RESTART, FamilySpec, MonitorSpec, family_value
from ckptscan.schema.results import Finding, LayerResult

NAME = "output"


def _finite(x: float | None) -> float | None:
    return x if x is not None and x == x and abs(x) != float("inf") else None


def output_values(a: LayerWeights, b: LayerWeights, spectrum: bool = False) -> dict[str, float | None]:
    """The output monitors of a pair: logit scales of the newer checkpoint,
    the update from the older, in one pass over both heads; the update
    spectrum only with spectrum=True (None otherwise). {} for a layer without
    the head, or a non-finite head or gain (the numeric rule reports those)."""
    if a.head is None or b.head is None or a.head.shape != b.head.shape:
        return {}
    pair = head_pair(a.head, b.head, b.final_gain, spectrum=spectrum)
    # The pass's float64 sums are finite exactly when every value of both heads and the gain is:
    # no V × d mask (a 128k × 8k head: 1 GiB) and no read of its own.
    if not pair.finite:
        return {}
    stats, update = pair.stats, pair.update
    values = {
        "output_logit_rms": logit_rms(stats),
        "output_logit_max": stats.max_row,
        "output_shift": shift_scale(stats),
        "output_mean_row_share": mean_row_share(stats),
        "dw_head_entropy_norm": update.entropy_norm,
        "dw_head_rel_norm": update.relative_norm,
        "dw_head_mean_coherence": update.mean_coherence,
    }
    return {name: _finite(value) for name, value in values.items()}


@dataclass(frozen=True)
class OutputThresholds:
    """The output family's thresholds (its section of `Thresholds`; flat names in ckptscan.toml)."""

    # The output logit scale ‖W_head D_γ‖_F/√V and the log Z shift scale
    # ‖D_γ w̄‖ (monitors/output.py), logits' standard deviations for unit-RMS
    # inputs. Not calibrated against an output-logit divergence: no run of
    # generation 4 had one (the no-weight-decay runs' logged mean log Z rises
    # like the healthy runs', to 7.3, never drifting negative). Ceilings at
    # twice the largest value of the 9 healthy calibration runs across the
    # four recipes (4.37 and 3.52, a 2,000-step MoE run's last checkpoint;
    # held-out healthy runs: 4.31 and 3.50; the unstable runs: at most 4.73
    # and 3.89; experiments/natural.py --calibrate), rounded up to a half:
    # they may miss a divergence, not alarm on these runs.
    # ("after": where the JSON report's "thresholds" lists the key.)
    output_logit_scale_ceiling: float = field(default=9.0, metadata={"after": "band_state_scale_factor"})
    output_shift_ceiling: float = 7.5

    def problems(self) -> list[str]:
        if min(self.output_logit_scale_ceiling, self.output_shift_ceiling) <= 0:
            return ["need output_logit_scale_ceiling > 0 and output_shift_ceiling > 0"]
        return []


def output_findings(layer: LayerResult, t: Any) -> list[Finding]:
    """The output logit scale and the log Z shift scale over their ceilings
    (absolute, judged from the first pair: detection/output.py says why)."""
    values = layer.families.get(NAME)
    if not values:
        return []
    findings = []
    scale, shift = values.get("output_logit_rms"), values.get("output_shift")
    if scale is not None and scale > t.output_logit_scale_ceiling:
        findings.append(Finding(
            "output_logit_rms", NAME, "alert", scale,
            f"output logit scale {scale:.3g} above the ceiling {t.output_logit_scale_ceiling:g} (healthy runs: "
            "up to about 4.4): the LM head and final norm let the output logits grow (output-logit divergence)",
            threshold=t.output_logit_scale_ceiling, rule="ceiling",
        ))
    if shift is not None and shift > t.output_shift_ceiling:
        findings.append(Finding(
            "output_shift", NAME, "alert", shift,
            f"log Z shift scale {shift:.3g} above the ceiling {t.output_shift_ceiling:g} (healthy runs: up to about "
            "3.5): the head's mean row moves every output logit together, the drift z-loss and weight decay remove",
            threshold=t.output_shift_ceiling, rule="ceiling",
        ))
    return findings


def _read(name: str) -> Callable[[LayerResult], float | None]:
    return family_value(NAME, name)


# What training teams do about an alert of the family, from the literature (ckptscan/monitors/interventions.py).
INTERVENTIONS = (
    ("z-loss", "add the z-loss 1e-4·log²Z to the loss, which keeps log Z (the output logits' common shift) "
     "near 0", "Wortsman et al. 2023, arXiv:2309.14322; PaLM, arXiv:2204.02311"),
    ("weight decay on the head", "apply weight decay to the LM head (and a tied embedding): without it the "
     "output logits drift", "Wortsman et al. 2023, arXiv:2309.14322"),
    ("lower LR", "lower the learning rate: output-logit divergence appears at high learning rates",
     "Wortsman et al. 2023, arXiv:2309.14322"),
    RESTART,
)


OUTPUT = FamilySpec(
    NAME,
    (
        # Absolute: judged against their ceilings from the first pair (detection/output.py).
        MonitorSpec("output_logit_rms", NAME, "output logit scale", "logit σ", "high", True, _read("output_logit_rms"),
                    ceiling="output_logit_scale_ceiling"),
        MonitorSpec("output_logit_max", NAME, "output logit scale (largest row)", "logit σ", "high", True,
                    _read("output_logit_max")),
        MonitorSpec("output_shift", NAME, "log Z shift scale", "logit σ", "high", True, _read("output_shift"),
                    ceiling="output_shift_ceiling"),
        MonitorSpec("output_mean_row_share", NAME, "head mean-row share", None, "high", False,
                    _read("output_mean_row_share")),
        MonitorSpec("dw_head_entropy_norm", NAME, "ΔW_head H/ln r", "H / ln r", "low", False,
                    _read("dw_head_entropy_norm")),
        MonitorSpec("dw_head_rel_norm", NAME, "‖ΔW_head‖/‖W_head‖", None, "high", True, _read("dw_head_rel_norm")),
        MonitorSpec("dw_head_mean_coherence", NAME, "ΔW_head mean-row coherence", None, "high", True,
                    _read("dw_head_mean_coherence")),
    ),
    headline=("output_logit_rms",),
    compute=output_values,
    full_compute=lambda a, b: output_values(a, b, spectrum=True),  # --full-spectrum: the update's spectrum too
    proves_head_finite=True,  # values only from finite float64 sums over both heads and the gain
    thresholds=OutputThresholds,
    ceilings=output_findings,
    interventions=INTERVENTIONS,
)
