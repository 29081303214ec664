"""The judged monitors as detection's series rules take them: each
registered monitor with a `Judging` (ckptscan/monitors/registry.py; each
family's module says why it is judged so) turned into a `SeriesSpec` beside
its words and reader."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

from ckptscan.detection.series import Point, SeriesSpec
from ckptscan.monitors import registry
from ckptscan.monitors.spec import MonitorSpec
from ckptscan.schema.results import Finding, LayerResult


@dataclass(frozen=True)
class JudgedMonitor:
    name: str  # the field name in the JSON report
    family: str
    label: str  # short name for tables and messages
    spec: SeriesSpec
    alone: str  # "alert" | "warn"
    read: Callable[[LayerResult], float | None]
    across_runs: bool = True  # see monitors.spec.Judging
    per_update: bool = False


@dataclass(frozen=True, eq=False)
class Catalog:
    """The judged monitors of one state of the registry; compared (and
    hashed) by identity, so that what is derived from it can be cached on it."""

    monitors: tuple[JudgedMonitor, ...]  # in the registry's order
    by_name: Mapping[str, JudgedMonitor]


# The registry's judged monitors the catalog was built from, and it.
_current: tuple[tuple[MonitorSpec, ...], Catalog] | None = None


def catalog() -> Catalog:
    """The judged monitors of the registry as it is now: rebuilt only when it changed."""
    global _current
    specs = registry.judged()
    if _current is None or _current[0] is not specs:
        monitors = tuple(_judged(m) for m in specs)
        _current = (specs, Catalog(monitors, MappingProxyType({m.name: m for m in monitors})))
    return _current[1]


def judged_monitors() -> tuple[JudgedMonitor, ...]:
    """Every judged monitor, in the registry's order."""
    return catalog().monitors


def judged_by_name() -> Mapping[str, JudgedMonitor]:
    return catalog().by_name


def _judged(monitor: MonitorSpec) -> JudgedMonitor:
    j = monitor.judging
    assert j is not None, monitor.name
    spec = SeriesSpec(monitor.bad, j.min_scale, follow_trend=j.follow_trend, log=monitor.log, sequential=j.sequential)
    return JudgedMonitor(monitor.name, monitor.family, monitor.label, spec, j.alone, monitor.read, j.across_runs,
                         j.per_update)


def departure_finding(monitor: JudgedMonitor, point: Point, severity: str, rule: str | None, message: str,
                      threshold: float | None, score: float | None, onset: int | None) -> Finding:
    """A finding of a rule over a monitor's series, assembled once for every such rule (its trend, level or
    reference, its CUSUM, the pooled CUSUM, the layer and run bands): the monitor's name and family, the
    point's value and baseline, with the rule's words, the level reached, its statistic and where it began."""
    return Finding(monitor=monitor.name, family=monitor.family, severity=severity, value=point.value,
                   message=message, baseline=point.expected, threshold=threshold, rule=rule, score=score,
                   onset_step=onset)
