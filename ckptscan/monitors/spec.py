"""What a monitor is, declared once: its name, family and words (shared by
detection and every report), where its value is read in a layer's result,
and how detection judges it. A family groups its monitors with the ones a
report's table heads with. The families are registered in
`ckptscan.monitors.registry`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from ckptscan.layouts import LayerWeights
from ckptscan.schema.results import Finding, LayerResult, PairResult


@dataclass(frozen=True)
class Judging:
    """How detection judges a monitor's (layer, monitor) series."""

    min_scale: float  # smallest sigma (in judged units): the resolution below which changes do not matter
    alone: str  # "alert" | "warn": the most severe finding it may raise by itself
    follow_trend: bool = False  # healthy runs drift: its baseline follows the trend (Theil–Sen slope)
    sequential: bool = True  # also judged by the CUSUM (off for a monitor that creeps in healthy runs)
    # Is the level comparable between two runs of one recipe (a reference run)?
    across_runs: bool = True
    # Is it a property of the update between two checkpoints (so its level
    # depends on how many steps apart they are), not of one checkpoint?
    per_update: bool = False
    # Also judged against the other layers of the same pair (rule "cross_layer", detection/findings.py): for a
    # `diff`, or before a run has a baseline. Its calibration (`cross_layer_*` in `Thresholds`) is the Δ2
    # entropy's, the one monitor that sets it.
    cross_layer: bool = False


@dataclass(frozen=True)
class MonitorSpec:
    name: str  # the field name in the JSON report
    family: str  # the family's name, e.g. "attention" | "router"
    label: str  # short name for tables and messages
    unit: str | None  # what a figure's axis of it is labelled; None: its label
    bad: str  # "low" | "high" | "both": the alarm side
    log: bool  # a positive, scale-dependent value: judged (and coloured) on a log scale
    read: Callable[[LayerResult], float | None]
    judging: Judging | None = None  # None: reported, never judged
    # The threshold (its flat name, in its family's section) that is its ceiling, for a monitor an absolute
    # rule holds under one: the reports show it beside the value (report/fired.py `ceiling`).
    ceiling: str | None = None
    # Its name in a sentence, where its label alone is too short (a rollback's reason, the cross-layer rule's
    # message); None: its label.
    words: str | None = None

    @property
    def said(self) -> str:
        """Its name in a sentence."""
        return self.words or self.label


@dataclass(frozen=True)
class FamilySpec:
    name: str  # what findings of its monitors name as their family
    monitors: tuple[MonitorSpec, ...]  # in the order detection judges them and reports list them
    # The monitors a report's table heads the family with, in preference
    # order: the table shows the first one with values in the report.
    headline: tuple[str, ...]
    # For a family whose values are not one of the built-in results: its
    # values on a pair of one layer's weights (older, newer), by monitor
    # name, stored in `LayerResult.families[name]` (`family_value` reads them).
    compute: Callable[[LayerWeights, LayerWeights], dict[str, float | None]] | None = None
    # `compute` with its costly values too, for a scan with --full-spectrum
    # (None: the family has none; `compute` is used as it is).
    full_compute: Callable[[LayerWeights, LayerWeights], dict[str, float | None]] | None = None
    # Its values, where `compute` gives any, prove every value of both
    # checkpoints' LM heads finite (its pass over them is their check: the
    # scan counts a head's non-finite values only where no such family did).
    proves_head_finite: bool = False
    # What training teams do about an alert of the family, from the
    # literature: (a few words, the action, its source), in the order listed
    # (`ckptscan.monitors.interventions`).
    interventions: tuple[tuple[str, str, str], ...] = ()
    # The summary's last tie-break between families alerting together with
    # equal evidence (detection/summary.py): lower first; None after every
    # family with a rank. `why`: that reason in words ("<family> comes first
    # because ..."); a family without its own takes that of the last-ranked
    # family with one.
    mechanism_rank: int | None = None
    why: str | None = None
    # Its thresholds section: a frozen dataclass whose fields (defaults the
    # calibrated values) are read and set by their names in ckptscan.toml,
    # `--set`, `Thresholds(...)` and the JSON report's "thresholds"
    # (detection/thresholds.py); None: the family has none. It has
    # `problems() -> list[str]` (what is invalid, in words) and may have
    # `at_width(hidden_size)` (itself for a model that wide) and
    # `ceiling_context(key)` (what a ceiling's value is stated with in a
    # rollback's reason, e.g. " for d_model 64"). A field's
    # metadata "after" names the key the JSON report lists it after (else:
    # after the section's previous field; the first: after the others).
    thresholds: type | None = None
    # Its absolute rules, which need no history (detection/state.py applies
    # them, in this order per family): `ceilings(layer, section)` from the
    # first pair; after the warm-up, `pair_rule(pair, section)` on the whole
    # pair, then `floors(layer, section)` on each layer. Each returns (or, for
    # `pair_rule`, appends to the layers) the findings; `section` is the
    # family's thresholds section (None without one).
    ceilings: Callable[[LayerResult, Any], list[Finding]] | None = None
    pair_rule: Callable[[PairResult, Any], None] | None = None
    floors: Callable[[LayerResult, Any], list[Finding]] | None = None
    # A checkpoint judged on its own (a rollback candidate, detection/resume.py): beside its monitors'
    # ceilings (`MonitorSpec.ceiling`, read there), `own_check(pair, section)` gives the (problems, facts) of
    # the pair's newer checkpoint's other absolute signals, and `own_rules` names the rules whose findings
    # judge the checkpoint itself, not the update into it.
    own_check: Callable[[PairResult, Any], tuple[list[str], list[str]]] | None = None
    own_rules: tuple[str, ...] = ()
    # Its update monitors comparable across runs are judged together against a band of reference runs
    # (rules "layer_band" and "run_band", detection/layer_band.py). The band thresholds are calibrated on
    # attention's, the one family that sets it.
    banded: bool = False
    # What it fills in a computed pair once the pair's learning rate is known
    # (from whichever source): `fill(pair)`, in place.
    fill: Callable[[PairResult], None] | None = None
    # Which layers have the family (a report's cases and plots per family):
    # None where a layer carries its values (`LayerResult.families[name]`).
    present: Callable[[LayerResult], bool] | None = None
    # Whether TensorBoard plots its severity for a run none of whose layers
    # has the family (False: only where one has it).
    always_listed: bool = True
    # The head a notice of the family names in a layer (None: it names none).
    head: Callable[[LayerResult], int | None] | None = None
    # Its name in a narrow table's sparkline header (None: its name).
    short: str | None = None
    # The module that declares it (its source is part of what decides a
    # judgement: caches/judge_cache.py); found where it is constructed.
    module: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.module:  # the caller of the dataclass's __init__
            object.__setattr__(self, "module", sys._getframe(2).f_globals.get("__name__", ""))

    def has(self, layer: LayerResult) -> bool:
        """Whether `layer` has the family."""
        return self.present(layer) if self.present is not None else self.name in layer.families


# Any alert: the rollback the summary names, as PaLM restarts (an intervention of most families).
RESTART = ("restart from the rollback, skipping batches", "restart from the rollback candidate, skipping the batches "
           "seen since (PaLM: ~100 steps before the spike, 200-500 batches skipped)",
           "Chowdhery et al. 2022, arXiv:2204.02311")


def family_value(family: str, name: str) -> Callable[[LayerResult], float | None]:
    """The reader of a monitor whose value its family's `compute` gave."""
    return lambda layer: layer.families.get(family, {}).get(name)
