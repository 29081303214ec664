"""The judged monitors as detection's series rules take them: each
registered monitor with a `Judging` (ckptscan/monitors/registry.py, where
each family states why it is judged so) turned into a `SeriesSpec` beside
its words and reader."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

from ckptscan.detection.series import SeriesSpec
from ckptscan.monitors import registry
from ckptscan.monitors.spec import MonitorSpec
from ckptscan.results import LayerResult


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


def judged_monitors() -> tuple[JudgedMonitor, ...]:
    """Every judged monitor, in the registry's order."""
    return tuple(judged_by_name().values())


def judged_by_name() -> Mapping[str, JudgedMonitor]:
    """The judged monitors by name, in the registry's order."""
    return _converted(registry.judged())


@functools.cache
def _converted(monitors: tuple[MonitorSpec, ...]) -> Mapping[str, JudgedMonitor]:
    """Built once per set of registered monitors: looked up per (layer, monitor) judged."""
    return MappingProxyType({m.name: _judged(m) for m in monitors})


def _judged(monitor: MonitorSpec) -> JudgedMonitor:
    j = monitor.judging
    assert j is not None, monitor.name
    spec = SeriesSpec(monitor.bad, j.min_scale, follow_trend=j.follow_trend, log=monitor.log, sequential=j.sequential)
    return JudgedMonitor(monitor.name, monitor.family, monitor.label, spec, j.alone, monitor.read, j.across_runs,
                         j.per_update)
