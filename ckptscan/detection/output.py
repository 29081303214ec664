"""The output family's rule: the output logit scale a checkpoint allows
(monitors/output.py) over its ceiling. Like the attention logit scale it is
absolute, so it is judged from the first pair, without a baseline: a head
whose logits have grown past what healthy runs reach is that whatever the
run's own history.

Two ceilings (thresholds.py): the logits' RMS standard deviation over the
vocabulary for unit-RMS inputs, ‖W D_γ‖_F/√V, and the standard deviation of
the shift every logit (and log Z) takes together, ‖D_γ w̄‖: the part of the
head that only Adam's normalisation, weight decay and z-loss move
(docs/monitors.md, "Output family"), the drift of Wortsman et al. 2023 §3.2.
"""

from __future__ import annotations

from ckptscan.detection.thresholds import Thresholds
from ckptscan.monitors.output_family import NAME
from ckptscan.schema.results import Finding, LayerResult


def output_findings(layer: LayerResult, t: Thresholds) -> list[Finding]:
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
