"""The monitored series in words: each monitor's name, family, label, alarm
side and scale, and where its value is read in a layer's result; and the
worst of some statuses in the results' severity order. Detection judges in
these words and every report renders them; neither depends on the other for
them.

How each series is judged (its resolution, whether its baseline follows a
trend, what it may raise alone) is detection's: ckptscan/detection/catalog.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ckptscan.results import SEVERITIES, LayerResult


def counted(count: int, noun: str) -> str:
    """"1 pair", "2 pairs": a count with its noun (regular plurals only)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def status_word(status: str) -> str:
    """A status as a heading shows it: "ALERT", "NOT JUDGED"."""
    return status.upper().replace("_", " ")


def worst(statuses: list[str]) -> str:
    ranked = [s for s in statuses if s in SEVERITIES]
    return max(ranked, key=SEVERITIES.index, default="ok")


@dataclass(frozen=True)
class MonitorInfo:
    name: str  # the field name in the JSON report
    family: str  # "attention" | "router"
    label: str  # short name for tables and messages
    bad: str  # "low" | "high" | "both": the alarm side
    log: bool  # a positive, scale-dependent value: judged (and coloured) on a log scale
    read: Callable[[LayerResult], float | None]


def _attention(field: str) -> Callable[[LayerResult], float | None]:
    return lambda layer: getattr(layer.attention, field) if layer.attention is not None else None


def _router(field: str) -> Callable[[LayerResult], float | None]:
    def read(layer: LayerResult) -> float | None:
        value = getattr(layer.router, field) if layer.router is not None else None
        return None if value is None else float(value)

    return read


# In the order detection judges them and reports list them.
MONITORS: tuple[MonitorInfo, ...] = (
    MonitorInfo("delta2_entropy_norm", "attention", "Δ2 H/ln n", "low", False, _attention("delta2_entropy_norm")),
    MonitorInfo("delta2_entropy_norm_min", "attention", "Δ2 H/ln n (worst head)", "low", False,
                _attention("delta2_entropy_norm_min")),
    MonitorInfo("dwq_entropy_norm", "attention", "ΔWq H/ln r", "low", False, _attention("dwq_entropy_norm")),
    MonitorInfo("dwk_entropy_norm", "attention", "ΔWk H/ln r", "low", False, _attention("dwk_entropy_norm")),
    MonitorInfo("qk_logit_bound", "attention", "logit bound", "high", True, _attention("qk_logit_bound")),
    MonitorInfo("routing_entropy_norm", "router", "routing H/ln E", "low", False, _router("routing_entropy_norm")),
    MonitorInfo("load_cv", "router", "load CV", "high", False, _router("load_cv")),
    MonitorInfo("cosine_similarity", "router", "router cos", "both", False, _router("cosine_similarity")),
    MonitorInfo("epsilon", "router", "router ε", "both", True, _router("epsilon")),
)

BY_NAME = {m.name: m for m in MONITORS}
