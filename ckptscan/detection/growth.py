"""A reference-free attention rule: how much the QK logit bound has grown since warm-up.

The bound σ_max(Q_hᵀK_g) (max over heads) limits every attention logit for
normalised inputs; attention entropy collapse follows its growth (Zhai et
al. 2023), and a low-precision attention fault grows it without limit. Its
level depends on the model's width, initialisation and norm gains, so no
absolute value means the same in two models; its growth since the end of
warm-up is a ratio, with no units. In healthy runs it grows by a bounded
factor (weight decay and a decaying learning rate hold it) and then
flattens; under an attention fault present from the first step it keeps
growing — a run that the self-baseline, which learns the faulty growth as
the trend, sees late.

The rule needs no history beyond one number per layer (the bound at the
first judged pair) and no other run: growth ≥ `logit_growth_warn` (×) is a
warning, and ≥ `logit_growth_alert` on `consecutive` pairs in a row is an
alert. Both factors are calibrated on healthy corpus runs of two model
widths (experiments/calibrate.py, docs/calibration.md); they were measured
on runs of 3,000–4,000 steps, so a much longer healthy run may grow past
them (the report names the rule, `growth`, and a config can raise them).
"""

from __future__ import annotations

import math
from typing import Any

from ckptscan.detection.thresholds import Thresholds
from ckptscan.results import Finding, LayerResult

MONITOR = "qk_logit_bound"


class LogitGrowth:
    """Per layer position: the bound at the first judged pair, and the
    current run of pairs at or above the alert factor."""

    def __init__(self) -> None:
        self.base: dict[int, float] = {}  # layer position -> bound at its first judged pair
        self.streak: dict[int, int] = {}
        self.onset: dict[int, int | None] = {}  # newer step of the streak's first pair

    def findings(self, position: int, layer: LayerResult, step: int | None, t: Thresholds) -> list[Finding]:
        """The rule's finding for this layer at a judged pair (none or one)."""
        bound = layer.attention.qk_logit_bound if layer.attention is not None else None
        if bound is None or not math.isfinite(bound) or bound <= 0:
            return []
        base = self.base.setdefault(position, bound)
        growth = bound / base
        if growth >= t.logit_growth_alert:
            if not self.streak.get(position):
                self.onset[position] = step
            self.streak[position] = self.streak.get(position, 0) + 1
        else:
            self.streak[position], self.onset[position] = 0, None
        if self.streak[position] >= t.consecutive:
            severity = "alert"
        elif growth >= t.logit_growth_warn:
            severity = "warn"
        else:
            return []
        threshold = t.logit_growth_alert if severity == "alert" else t.logit_growth_warn
        onset = self.onset[position] if severity == "alert" else None
        return [Finding(
            MONITOR, "attention", severity, bound,
            f"logit bound {bound:.3g} has grown ×{growth:.2f} since the end of warm-up ({base:.3g}; "
            f"≥ ×{threshold:g}{f' since step {onset}' if onset is not None else ''}): attention logits "
            "keep growing, as under a low-precision attention fault",
            baseline=base, threshold=base * threshold, rule="growth", score=growth, onset_step=onset,
        )]

    def to_dict(self) -> dict[str, Any]:
        return {"base": [[k, v] for k, v in self.base.items()], "streak": [[k, v] for k, v in self.streak.items()],
                "onset": [[k, v] for k, v in self.onset.items()]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LogitGrowth:
        state = cls()
        state.base = {k: v for k, v in data["base"]}
        state.streak = {k: v for k, v in data["streak"]}
        state.onset = {k: v for k, v in data["onset"]}
        return state
